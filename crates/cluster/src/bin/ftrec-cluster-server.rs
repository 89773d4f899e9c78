//! The cluster's processes without the rest of the `ftrec` binary, so that the cluster crate's
//! own tests can launch real processes:
//! - `ftrec-cluster-server server --id I --servers N ...` behaves as `ftrec server ...`;
//! - `ftrec-cluster-server worker --coordinator ADDR --id W [--until stdin]` behaves as
//!   `ftrec worker ...`;
//! - `ftrec-cluster-server ckpt merge LOCATION ...` runs one merger pass as
//!   `ftrec ckpt merge ...` does.

use std::process::ExitCode;

use ftrec_cluster::{ClusterError, WorkerLifetime};

fn worker(args: &[String]) -> Result<(), ClusterError> {
    let mut coordinator = None;
    let mut id = None;
    let mut lifetime = WorkerLifetime::Control;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| ClusterError::Config(format!("{flag} needs a value")))?;
        let bad = |e: String| ClusterError::Config(format!("{flag} {value:?}: {e}"));
        match flag.as_str() {
            "--coordinator" => coordinator = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
            "--id" => id = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
            "--until" => {
                lifetime = match value.as_str() {
                    "stdin" => WorkerLifetime::Stdin,
                    "control" => WorkerLifetime::Control,
                    _ => return Err(bad("expected stdin or control".into())),
                }
            }
            _ => {
                return Err(ClusterError::Config(format!(
                    "unknown worker flag {flag:?}"
                )))
            }
        }
    }
    let coordinator =
        coordinator.ok_or_else(|| ClusterError::Config("missing --coordinator".into()))?;
    let id = id.ok_or_else(|| ClusterError::Config("missing --id".into()))?;
    ftrec_cluster::worker_process(coordinator, id, lifetime)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("worker") => worker(&args[1..]),
        Some("ckpt") => ftrec_cluster::merger::MergerArgs::from_args(&args)
            .and_then(|m| ftrec_cluster::merger::merge_once(&m).map(|_| ())),
        _ => ftrec_cluster::ServerSpec::from_args(&args)
            .and_then(|spec| ftrec_cluster::serve_shard(&spec)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftrec-cluster-server: error: {e}");
            ExitCode::from(2)
        }
    }
}

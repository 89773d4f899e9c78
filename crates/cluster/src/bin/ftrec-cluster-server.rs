//! The cluster's processes without the rest of the `ftrec` binary, so that the cluster crate's
//! own tests can launch real processes. Its command line is parsed by the same flag
//! definitions as `ftrec`'s ([`ftrec_cluster::args`]):
//! - `ftrec-cluster-server server --id I --servers N ...` behaves as `ftrec server ...`;
//! - `ftrec-cluster-server worker --coordinator ADDR --id W [--until stdin]` behaves as
//!   `ftrec worker ...`;
//! - `ftrec-cluster-server ckpt merge LOCATION ...` runs one merger pass as
//!   `ftrec ckpt merge ...` does.

use std::process::ExitCode;

use ftrec_cluster::args::{parse_process, ProcessCkptCmd, ProcessCmd};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse_process(&args).and_then(|cmd| match cmd {
        ProcessCmd::Server(a) => a
            .obs
            .start()
            .and_then(|_| a.spec().and_then(|spec| ftrec_cluster::serve_shard(&spec))),
        ProcessCmd::Worker(a) => a.obs.start().and_then(|_| a.run()),
        ProcessCmd::Ckpt {
            cmd: ProcessCkptCmd::Merge(m),
        } => m
            .obs
            .start()
            .and_then(|_| ftrec_cluster::merger::merge_once(&m.merger()).map(|_| ())),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftrec-cluster-server: error: {e}");
            ExitCode::from(match e {
                ftrec_cluster::ClusterError::Fenced(_) => ftrec_ps::fence::FENCED_EXIT,
                _ => 2,
            })
        }
    }
}

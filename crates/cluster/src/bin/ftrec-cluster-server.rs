//! A server process without the rest of the `ftrec` binary: `ftrec-cluster-server server
//! --id I --servers N ...` behaves as `ftrec server ...`. It exists so that the cluster crate's
//! own tests can launch real server processes.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = ftrec_cluster::ServerSpec::from_args(&args)
        .and_then(|spec| ftrec_cluster::serve_shard(&spec));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftrec-cluster-server: error: {e}");
            ExitCode::from(2)
        }
    }
}

//! What every cluster test starts from: the test server binary and a run of the `tiny` preset.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ftrec_cluster::{RunConfig, ServerProcess, ServerSpec};
use ftrec_core::Preset;

/// The server binary the tests run (`ftrec-cluster-server`).
pub fn server_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ftrec-cluster-server"))
}

/// A run of the `tiny` preset in `dir`: `servers` servers, `workers` workers, `steps` steps of
/// batch 64, seed `seed`, no held-out evaluation, asynchronous, strategy `none`. Each test
/// sets what it is about on top.
pub fn tiny_run(dir: &Path, servers: u32, workers: u32, steps: u64, seed: u64) -> RunConfig {
    let mut cfg = RunConfig::new(Preset::tiny(), server_exe(), dir.to_path_buf());
    cfg.servers = servers;
    cfg.workers = workers;
    cfg.steps = steps;
    cfg.batch = 64;
    cfg.seed = seed;
    cfg.eval_samples = 0;
    cfg
}

/// Start the test server binary as `spec` (generation 0, its port file in `dir`) and wait
/// until it serves.
pub fn start_server(spec: &ServerSpec, dir: &Path) -> ServerProcess {
    ServerProcess::spawn(
        &server_exe(),
        spec,
        dir,
        0,
        std::time::Duration::from_secs(30),
    )
    .unwrap()
}

//! Fixtures of the checkpoint-service tests: servers with a checkpoint node each, seeded
//! deterministic steps, and the cluster digest.

#![allow(dead_code)]

use ftrec_ckpt::deck::StagingOptions;
use ftrec_ckpt::location::LocationOptions;
use ftrec_core::rng::SplitMix;
use ftrec_core::{ModelDigest, OptimizerKind, TableId};
use ftrec_ps::ckpt::CkptNode;
use ftrec_ps::{Server, SharedServer, Update};

use crate::common::{config, dense_init};

pub const SERVERS: u32 = 2;

/// A scratch directory removed on drop (this crate has no tempfile dev-dependency).
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "ftrec-ps-ckpt-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn start(staging: &std::path::Path) -> (Vec<SharedServer>, Vec<CkptNode>) {
    let mut servers = Vec::new();
    let mut nodes = Vec::new();
    for s in 0..SERVERS {
        let server = SharedServer::new(
            Server::new(config(SERVERS, s, OptimizerKind::Adagrad), &dense_init()).unwrap(),
        );
        let mut opts = StagingOptions::new(staging.join(format!("s{s}")));
        opts.chunk_bytes = 1024;
        let initial = std::sync::Arc::new(move || {
            Server::new(config(SERVERS, s, OptimizerKind::Adagrad), &dense_init())
                .map_err(|e| e.to_string())
        });
        nodes.push(
            CkptNode::new(server.clone(), opts, LocationOptions::default())
                .unwrap()
                .with_initial_state(initial),
        );
        servers.push(server);
    }
    (servers, nodes)
}

/// One deterministic step on every server: seeded rows of every table and the dense part.
pub fn step(servers: &[SharedServer], step: u64) {
    let mut rng = SplitMix::keyed(5, 1, step);
    for (s, server) in servers.iter().enumerate() {
        let mut guard = server.write().unwrap();
        let info = guard.info();
        let map = guard.config().shard_map;
        let mut update = Update::new();
        for (t, &rows) in info.table_rows.iter().enumerate() {
            let tid = TableId(t as u32);
            let mine: Vec<u64> = (0..3)
                .map(|_| rng.next_u64() % rows)
                .filter(|&r| map.owner(tid, r).0 == s as u32)
                .collect();
            let grads = (0..mine.len() * info.dim)
                .map(|_| rng.next_f32() - 0.5)
                .collect();
            update = update.with_sparse(tid, mine, grads);
        }
        let n = (info.dense_range.end - info.dense_range.start) as usize;
        let dense = (0..n).map(|_| rng.next_f32() - 0.5).collect();
        update = update.with_dense(info.dense_range.start, dense);
        guard.apply_step(step, &[&update]).unwrap();
    }
}

pub fn digest(servers: &[SharedServer]) -> ModelDigest {
    let mut d = ModelDigest::new();
    for s in servers {
        d.merge(&s.read().unwrap().digest());
    }
    d
}

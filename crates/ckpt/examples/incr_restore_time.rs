//! Time the restore of an incremental store's newest state, phase by phase: the store a
//! `ftrec bench incremental --dir D --keep` run left (`D/incrcp`, `D/incremental`, `D/cnr`).
//!
//! ```sh
//! cargo build --release -p ftrec-ckpt --example incr_restore_time
//! target/release/examples/incr_restore_time D/incrcp 9          # the form the restore picks
//! target/release/examples/incr_restore_time D/incrcp 9 whole    # or: stream
//! ```
//!
//! Each repetition restores server 0 into a fresh in-memory shard and prints what lies over the
//! base: its time, and for a chunk list reading the piece index, waiting for chunk files and
//! writing rows. The profile in `docs/BENCHMARKS.md` (IncrCP) ran this under `perf record`.

use std::sync::Arc;

use ftrec_ckpt::deck::RestoreAt;
use ftrec_ckpt::incr::{self, MemShard};
use ftrec_ckpt::{Checkpoints, LocalStore};
use ftrec_core::{ServerId, ShardMap};

fn main() {
    if let Err(e) = run() {
        eprintln!("incr_restore_time: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: incr_restore_time STORE_DIR [REPETITIONS]")?;
    let reps: usize = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("repetitions {s:?}: {e}"))?,
        None => 9,
    };
    // A third argument forces a chunk list's form: `stream` (a column map, writes beside the
    // reads) or `whole` (the rectangle read whole, then written newest column first).
    let opts = match args.next().as_deref() {
        Some("stream") => incr::RestoreOptions {
            in_memory_bytes: 0,
            ..Default::default()
        },
        Some("whole") => incr::RestoreOptions {
            stream_map_bytes: 0,
            ..Default::default()
        },
        Some(other) => return Err(format!("unknown form {other:?} (stream or whole)").into()),
        None => incr::RestoreOptions::default(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(&dir)?));
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let chain = rt.block_on(incr::select(&ckpts, &RestoreAt::Current))?;
        let info = chain
            .base
            .shard(ServerId(0))
            .ok_or("the base holds no shard of server 0")?;
        let mut target = MemShard::of(info, ShardMap::new(1)?);
        let o = rt.block_on(incr::restore_server_with(&ckpts, &chain, &mut target, opts))?;
        println!(
            "over the base {:.2} ms: piece index {:.2}, waiting for files {:.2}, writing rows {:.2}; \
             {} files, {} bytes, {} rows",
            o.chain_s * 1e3,
            o.index_s * 1e3,
            o.read_wait_s * 1e3,
            o.apply_s * 1e3,
            o.files,
            o.bytes,
            o.rows_written
        );
        times.push(o.chain_s * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "median {:.2} ms, fastest {:.2} ms",
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}

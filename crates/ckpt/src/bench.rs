//! Full-checkpoint bandwidth of the local backend against the raw disk, measured in one run.
//!
//! The raw baseline writes one big file sequentially (8 MiB writes, then one fsync) and reads
//! it back; the checkpoint side writes a full checkpoint of a synthetic model of the same size
//! through [`LocalStore`] and restores it with full verification. Before each read phase the
//! files' pages are dropped from the page cache with `posix_fadvise(DONTNEED)` (they are clean
//! after fsync, so the kernel drops them), so both reads come from the device; the report says
//! whether every drop succeeded. Timings belong here, never in tests.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, Optimizer, OptimizerKind, RowLayout, ServerId,
    ShardMap, TableId,
};

use crate::checkpoint::{Checkpoints, Select};
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, CheckpointKind, DataPosition};
use crate::snapshot::{
    self, DenseShard, DenseTarget, RowIds, ServerShard, ShardTarget, SnapshotOptions, TableShard,
    TableTarget,
};
use crate::store::local::LocalStore;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Scratch directory on the disk to measure (files are removed afterwards).
    pub dir: PathBuf,
    /// Approximate size of the model (embedding rows with optimizer state).
    pub model_bytes: u64,
    /// Servers writing into the checkpoint in parallel.
    pub servers: u32,
    /// Embedding tables (each sharded over all servers).
    pub tables: u32,
    pub dim: usize,
    pub snapshot: SnapshotOptions,
    pub seed: u64,
}

impl BenchConfig {
    pub fn new(dir: impl Into<PathBuf>, model_bytes: u64) -> Self {
        BenchConfig {
            dir: dir.into(),
            model_bytes,
            servers: 2,
            tables: 4,
            dim: 16,
            snapshot: SnapshotOptions::default(),
            seed: 1,
        }
    }
}

/// Bandwidths in MiB/s, and checkpoint / raw ratios.
#[derive(Debug, Clone, PartialEq)]
pub struct BandwidthReport {
    /// Bytes of the checkpoint's data files (the raw file has the same size).
    pub bytes: u64,
    pub files: u64,
    pub raw_write_mibs: f64,
    pub raw_read_mibs: f64,
    pub ckpt_write_mibs: f64,
    pub ckpt_read_mibs: f64,
    pub write_ratio: f64,
    pub read_ratio: f64,
    /// Every `posix_fadvise(DONTNEED)` before the read phases succeeded.
    pub cache_dropped: bool,
    /// The restored model's digest equals the saved one.
    pub restored_identical: bool,
}

impl std::fmt::Display for BandwidthReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checkpoint of {:.1} MiB in {} files",
            self.bytes as f64 / (1 << 20) as f64,
            self.files
        )?;
        writeln!(
            f,
            "write: raw {:.0} MiB/s, checkpoint {:.0} MiB/s, ratio {:.2}",
            self.raw_write_mibs, self.ckpt_write_mibs, self.write_ratio
        )?;
        writeln!(
            f,
            "read:  raw {:.0} MiB/s, checkpoint {:.0} MiB/s, ratio {:.2}",
            self.raw_read_mibs, self.ckpt_read_mibs, self.read_ratio
        )?;
        write!(
            f,
            "page cache dropped before reads: {}; restored model identical: {}",
            self.cache_dropped, self.restored_identical
        )
    }
}

fn io_err(path: &Path, e: std::io::Error) -> CkptError {
    CkptError::io(path.display().to_string(), e)
}

/// Drop the pages of every file under `dir` from the page cache (so the next reads come from
/// the disk); false if the kernel refused any.
pub fn drop_dir_cache(dir: &Path) -> bool {
    files_under(dir).iter().all(|f| drop_cache(f))
}

/// Drop `path`'s pages from the page cache; false if the kernel refused.
fn drop_cache(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let Ok(f) = File::open(path) else {
            return false;
        };
        // SAFETY: the descriptor is valid for the duration of the call.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

const IO_BLOCK: usize = 8 << 20;

fn raw_write(path: &Path, bytes: u64) -> Result<f64> {
    let block: Vec<u8> = (0..IO_BLOCK).map(|i| (i * 31 % 251) as u8).collect();
    let start = Instant::now();
    let mut f = File::create(path).map_err(|e| io_err(path, e))?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(IO_BLOCK as u64) as usize;
        f.write_all(&block[..n]).map_err(|e| io_err(path, e))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| io_err(path, e))?;
    Ok(start.elapsed().as_secs_f64())
}

fn raw_read(path: &Path) -> Result<f64> {
    let mut buf = vec![0u8; IO_BLOCK];
    let start = Instant::now();
    let mut f = File::open(path).map_err(|e| io_err(path, e))?;
    let mut sum = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        // Touch the data as a consumer would.
        sum = sum.wrapping_add(buf[n - 1] as u64);
    }
    std::hint::black_box(sum);
    Ok(start.elapsed().as_secs_f64())
}

struct Model {
    map: ShardMap,
    /// Per server: its table shards and its dense block range.
    shards: Vec<(Vec<EmbeddingTable>, u64, DenseParams)>,
}

fn build_model(cfg: &BenchConfig) -> Result<Model> {
    if cfg.servers == 0 || cfg.tables == 0 || cfg.dim == 0 {
        return Err(CkptError::InvalidArgument(
            "bench needs at least one server, one table and dim >= 1".into(),
        ));
    }
    let opt = Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.1);
    let layout = RowLayout::new(cfg.dim, opt.state_words(cfg.dim));
    let rows_per_table = (cfg.model_bytes / layout.bytes() as u64 / cfg.tables as u64).max(1);
    let map = ShardMap::new(cfg.servers)
        .map_err(|e| CkptError::InvalidArgument(format!("shard map: {e}")))?;
    let dense_values: usize = 64 * 1024;
    let blocks = dense_values.div_ceil(ftrec_core::DENSE_BLOCK);
    let per_server = blocks.div_ceil(cfg.servers as usize);
    let mut shards = Vec::new();
    for s in 0..cfg.servers {
        let server = ServerId(s);
        let mut tables = Vec::new();
        for t in 0..cfg.tables {
            let id = TableId(t);
            let n = map.rows_on(id, rows_per_table, server);
            let mut table = EmbeddingTable::zeros(id, n, layout);
            table.init_rows(cfg.seed, 0.05, |l| map.global_row(id, server, l));
            tables.push(table);
        }
        let b0 = (s as usize * per_server).min(blocks);
        let b1 = ((s as usize + 1) * per_server).min(blocks);
        let lo = b0 * ftrec_core::DENSE_BLOCK;
        let hi = (b1 * ftrec_core::DENSE_BLOCK).min(dense_values);
        let values = (lo..hi).map(|i| (i as f32 * 1e-3).sin()).collect();
        shards.push((tables, b0 as u64, DenseParams::new(values, &opt)));
    }
    Ok(Model { map, shards })
}

fn server_shard(m: &Model, s: usize) -> ServerShard<'_> {
    let (tables, first_block, dense) = &m.shards[s];
    let server = ServerId(s as u32);
    ServerShard {
        server,
        tables: tables
            .iter()
            .map(|t| TableShard {
                table: t,
                ids: RowIds::Sharded { map: m.map, server },
            })
            .collect(),
        dense: Some(DenseShard {
            first_block: *first_block,
            params: dense,
        }),
    }
}

fn model_digest(m: &Model) -> ModelDigest {
    let mut d = ModelDigest::new();
    for s in 0..m.shards.len() {
        d.merge(&snapshot::shard_digest(&server_shard(m, s)));
    }
    d
}

fn join_err(e: tokio::task::JoinError) -> CkptError {
    CkptError::TemporarilyUnavailable {
        backend: "bench",
        reason: format!("server task failed: {e}"),
    }
}

/// Run the measurement. Each server writes and restores in its own tokio task, as each server
/// is its own process in a cluster; use a multi-threaded runtime.
pub async fn measure_local_bandwidth(cfg: &BenchConfig) -> Result<BandwidthReport> {
    std::fs::create_dir_all(&cfg.dir).map_err(|e| io_err(&cfg.dir, e))?;
    let ckpt_dir = cfg.dir.join("ftrec-bench-ckpt");
    let raw_path = cfg.dir.join("ftrec-bench-raw.bin");
    let _ = std::fs::remove_dir_all(&ckpt_dir);

    let model = Arc::new(build_model(cfg)?);
    let saved = model_digest(&model);
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(&ckpt_dir)?));
    let id = CheckpointId::for_step(1, CheckpointKind::Full);

    // Checkpoint write first so the raw file can have exactly its size.
    let start = Instant::now();
    let tasks: Vec<_> = (0..model.shards.len())
        .map(|s| {
            let (model, ckpts, id, opts) = (model.clone(), ckpts.clone(), id.clone(), cfg.snapshot);
            tokio::spawn(async move {
                snapshot::write_shard(&ckpts, &id, &server_shard(&model, s), &opts).await
            })
        })
        .collect();
    let mut reports = Vec::new();
    for t in tasks {
        reports.push(t.await.map_err(join_err)??);
    }
    let manifest = snapshot::full_manifest(id.clone(), 1, DataPosition::None, reports);
    ckpts.commit(&manifest).await?;
    let ckpt_write = start.elapsed().as_secs_f64();
    let bytes = manifest.data_bytes();

    let raw_path2 = raw_path.clone();
    let raw_write_s = tokio::task::spawn_blocking(move || raw_write(&raw_path2, bytes))
        .await
        .map_err(join_err)??;

    let mut cache_dropped = drop_cache(&raw_path);
    for f in files_under(&ckpt_dir) {
        cache_dropped &= drop_cache(&f);
    }

    let raw_path2 = raw_path.clone();
    let raw_read_s = tokio::task::spawn_blocking(move || raw_read(&raw_path2))
        .await
        .map_err(join_err)??;

    // Restore into zeroed shards of the same shapes, every server in its own task.
    let opt = Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.1);
    let zeroed: Vec<(Vec<EmbeddingTable>, u64, DenseParams)> = model
        .shards
        .iter()
        .map(|(tables, b0, dense)| {
            (
                tables
                    .iter()
                    .map(|t| EmbeddingTable::zeros(t.id, t.rows(), t.layout()))
                    .collect(),
                *b0,
                DenseParams::new(vec![0.0; dense.len()], &opt),
            )
        })
        .collect();
    let map = model.map;
    drop(model);
    let start = Instant::now();
    let manifest = Arc::new(
        ckpts
            .select(&Select::Current, &[CheckpointKind::Full])
            .await?,
    );
    let tasks: Vec<_> = zeroed
        .into_iter()
        .enumerate()
        .map(|(s, (mut tables, b0, mut dense))| {
            let server = ServerId(s as u32);
            let (manifest, ckpts, opts) = (manifest.clone(), ckpts.clone(), cfg.snapshot);
            tokio::spawn(async move {
                let mut target = ShardTarget {
                    server,
                    tables: tables
                        .iter_mut()
                        .map(|t| TableTarget {
                            table: t,
                            ids: RowIds::Sharded { map, server },
                        })
                        .collect(),
                    dense: Some(DenseTarget {
                        first_block: b0,
                        params: &mut dense,
                    }),
                };
                let report = snapshot::restore_shard(&ckpts, &manifest, &mut target, &opts).await;
                drop(target);
                report.map(|r| (r, (tables, b0, dense)))
            })
        })
        .collect();
    let mut files = 0;
    let mut shards = Vec::new();
    for t in tasks {
        let (r, state) = t.await.map_err(join_err)??;
        files += r.files;
        shards.push(state);
    }
    let ckpt_read = start.elapsed().as_secs_f64();
    let restored = Model { map, shards };
    let restored_identical = model_digest(&restored) == saved;

    let _ = std::fs::remove_dir_all(&ckpt_dir);
    let _ = std::fs::remove_file(&raw_path);

    let mib = bytes as f64 / (1 << 20) as f64;
    let rate = |secs: f64| mib / secs.max(1e-9);
    let (rw, rr, cw, cr) = (
        rate(raw_write_s),
        rate(raw_read_s),
        rate(ckpt_write),
        rate(ckpt_read),
    );
    Ok(BandwidthReport {
        bytes,
        files,
        raw_write_mibs: rw,
        raw_read_mibs: rr,
        ckpt_write_mibs: cw,
        ckpt_read_mibs: cr,
        write_ratio: cw / rw,
        read_ratio: cr / rr,
        cache_dropped,
        restored_identical,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bench_runs_end_to_end_on_a_tiny_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = BenchConfig::new(dir.path(), 2 << 20);
        cfg.snapshot.chunk_bytes = 256 << 10;
        let r = measure_local_bandwidth(&cfg).await.unwrap();
        assert!(r.restored_identical);
        assert!(r.bytes >= 2 << 20, "{r}");
        assert!(r.files > 8, "{r}");
        assert!(r.write_ratio > 0.0 && r.read_ratio > 0.0);
        // The scratch files are gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

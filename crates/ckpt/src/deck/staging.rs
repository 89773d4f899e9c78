//! Multi-layer staging of one server's delta (or full) checkpoint: memory → local staging
//! directory → remote store, as a pipeline of fixed-size chunks (DECK §3.2, Fig. 4).
//!
//! Three stages run at once:
//! 1. *copy-out* ([`ChunkSink::copy_out`], on the caller's thread, the only pause): the rows to
//!    save are gathered from the live tables into one chunk buffer at a time and handed on;
//! 2. *stage* (a blocking task): each chunk is framed and written to the staging directory
//!    without a second in-memory copy, then its buffer is freed;
//! 3. *upload* (an async task): each staged file is read back, checked against the checksums
//!    recorded when it was written, put create-only into the store, then removed from the
//!    staging directory.
//!
//! The first failure of any stage is kept, and every later error of the pipeline names it (a
//! full staging disk reads `no space left on device` wherever it surfaces). Each upload stages
//! into a folder named after its process; [`remove_dead_folders`] deletes the folders of
//! processes that no longer exist (a crashed server's), and a server calls it at start.
//!
//! The hand-offs are bounded in bytes: the copy-out hands on chunks while at most two chunk
//! sizes of them wait to be staged or are being staged, and the upload reads back at most one
//! chunk size of files at once (up to 8 files, a larger one alone; the next
//! file waits on disk for room). So at most four chunk sizes are in memory at any time (one
//! being gathered, two handed on, one being uploaded) whatever the model size: the bound DECK
//! keeps. A shard of many small tables (a chunk each) is handed on whole during the copy-out,
//! so the pause does not wait for a file per table to be staged, and its files are put several
//! at a time. [`MemGauge`] counts the buffers, so tests and benchmarks check it.
//! Nothing here commits anything: the coordinator commits a manifest once every server's
//! [`PendingUpload::wait`] returned, so a crash or a failed put before that leaves the previous
//! lineage as it was (the partly written files are unreferenced; GC removes them).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftrec_core::{DenseParams, RowId, RowLayout, ServerId, TableId, DENSE_BLOCK};
use tokio::sync::mpsc;

use crate::checkpoint::Checkpoints;
use crate::error::{CkptError, Result};
use crate::format::dense::encode_dense;
use crate::format::qrows::write_qrows_to;
use crate::format::rows::write_rows_to;
use crate::format::{
    CheckpointId, DenseInfo, FileChecksums, FileContent, FileInfo, QuantBits, ShardInfo, TableInfo,
};
use crate::snapshot::{RowIds, ShardReport};
use crate::store::PutMode;

/// How a shard is cut and staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagingOptions {
    /// Upper bound on one chunk (ids and row words; sized like the SSD's erase page, DECK §3.2).
    pub chunk_bytes: usize,
    /// Local staging directory (the SSD layer). Each upload uses its own subdirectory.
    pub staging_dir: PathBuf,
    /// Most bytes one upload may hold staged on local disk at once (`None`: what the disk
    /// has). A write past it fails as a full disk does (`ENOSPC`).
    pub limit_bytes: Option<u64>,
}

impl StagingOptions {
    pub fn new(staging_dir: impl Into<PathBuf>) -> Self {
        StagingOptions {
            chunk_bytes: 4 << 20,
            staging_dir: staging_dir.into(),
            limit_bytes: None,
        }
    }

    fn check(&self) -> Result<()> {
        if self.chunk_bytes < 1024 {
            return Err(CkptError::InvalidArgument(format!(
                "staging chunk size {} is below 1024 bytes",
                self.chunk_bytes
            )));
        }
        Ok(())
    }
}

/// Bytes of staging buffers alive now and at the peak (the pipeline's bound is in bytes).
#[derive(Debug, Default)]
pub struct MemGauge {
    bytes: AtomicU64,
    peak_bytes: AtomicU64,
}

impl MemGauge {
    pub fn new() -> Arc<Self> {
        Arc::new(MemGauge::default())
    }

    fn add(&self, bytes: u64) {
        let b = self.bytes.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak_bytes.fetch_max(b, Ordering::SeqCst);
    }

    fn sub(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::SeqCst);
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Ordering::SeqCst)
    }
    pub fn reset_peak(&self) {
        self.peak_bytes.store(self.bytes(), Ordering::SeqCst);
    }
}

/// Which rows of a table to save.
#[derive(Debug, Clone, Copy)]
pub enum RowSelection<'a> {
    /// Every local row (a full checkpoint).
    All,
    /// These global ids (sorted, distinct, owned by the server): a delta.
    Only(&'a [RowId]),
}

/// One table shard to copy out.
#[derive(Debug, Clone, Copy)]
pub struct SourceTable<'a> {
    pub table: TableId,
    pub layout: RowLayout,
    /// The shard's rows by local index (`layout.words()` words each).
    pub data: &'a [f32],
    pub ids: RowIds<'a>,
    pub rows: RowSelection<'a>,
}

/// What one server copies out: table shards and, optionally, its dense block range (always
/// whole: dense parameters are small and all of them change every step).
#[derive(Debug, Clone)]
pub struct Source<'a> {
    pub server: ServerId,
    pub tables: Vec<SourceTable<'a>>,
    pub dense: Option<(u64, &'a DenseParams)>,
}

/// A gathered chunk on its way to the staging directory.
enum Chunk {
    Rows {
        path: String,
        table: TableId,
        layout: RowLayout,
        ids: Vec<RowId>,
        words: Vec<f32>,
        server: ServerId,
        /// Quantize the values (Check-N-Run differentials) into a `QROW` file.
        quant: Option<QuantBits>,
    },
    Dense {
        path: String,
        server: ServerId,
        first_block: u64,
        values: Vec<f32>,
        state: Vec<f32>,
        spb: usize,
    },
    /// Everything was copied out; this is the shard's shape.
    Done(ShardInfo),
}

impl Chunk {
    fn bytes(&self) -> u64 {
        match self {
            Chunk::Rows { ids, words, .. } => (ids.len() * 8 + words.len() * 4) as u64,
            Chunk::Dense { values, state, .. } => ((values.len() + state.len()) * 4) as u64,
            Chunk::Done(_) => 0,
        }
    }
}

/// A file in the staging directory, waiting for upload.
struct Staged {
    local: PathBuf,
    info: FileInfo,
}

/// What the copy-out did (its duration is the training pause; the caller measures it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub rows: u64,
    pub dense_blocks: u64,
    pub chunks: u64,
    pub bytes: u64,
}

/// Bytes of chunks handed on by the copy-out and not yet staged. The hand-off is bounded in
/// bytes, not in chunks: a shard of many small tables (one chunk each) is handed on whole
/// while the copy-out runs, so the training pause does not wait for a file per table to be
/// staged, and memory stays within the same number of chunk sizes as before.
#[derive(Debug)]
struct Budget {
    /// Bytes free, and whether the stage has stopped taking chunks.
    state: std::sync::Mutex<(u64, bool)>,
    freed: std::sync::Condvar,
    cap: u64,
}

impl Budget {
    fn new(cap: u64) -> Self {
        Budget {
            state: std::sync::Mutex::new((cap, false)),
            freed: std::sync::Condvar::new(),
            cap,
        }
    }

    /// What a chunk of `bytes` holds of the budget: a chunk larger than the whole takes the
    /// whole (it goes alone).
    fn share(&self, bytes: u64) -> u64 {
        bytes.min(self.cap)
    }

    /// Wait until `bytes` are free and take them; `false` once the stage has stopped.
    fn take(&self, bytes: u64) -> bool {
        let want = self.share(bytes);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !st.1 && st.0 < want {
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.1 {
            return false;
        }
        st.0 -= want;
        true
    }

    fn give(&self, bytes: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = (st.0 + self.share(bytes)).min(self.cap);
        self.freed.notify_all();
    }

    /// The stage takes no more chunks: wake every waiting copy-out.
    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.freed.notify_all();
    }
}

/// The copy-out end of a staging pipeline.
#[derive(Debug)]
pub struct ChunkSink {
    tx: mpsc::UnboundedSender<Chunk>,
    budget: Arc<Budget>,
    progress: Arc<UploadProgress>,
    gauge: Arc<MemGauge>,
    chunk_bytes: usize,
    quant: Option<QuantBits>,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Chunk")
    }
}

fn rows_path(server: ServerId, table: TableId, chunk: u64, quant: bool) -> String {
    let ext = if quant { "qrows" } else { "rows" };
    format!("s{:04}/t{:04}-{chunk:06}.{ext}", server.0, table.0)
}

fn dense_path(server: ServerId, chunk: u64) -> String {
    format!("s{:04}/dense-{chunk:06}.dense", server.0)
}

/// The error of a stage that finds its neighbour gone: it names the neighbour's failure.
fn stopped(progress: &UploadProgress) -> CkptError {
    let cause = progress
        .failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| "the other end of the pipeline ended early".into());
    CkptError::TemporarilyUnavailable {
        backend: "staging",
        reason: format!("the staging pipeline stopped: {cause}"),
    }
}

/// Keep the pipeline's first failure; return the error unchanged.
fn note_failure(progress: &UploadProgress, e: CkptError) -> CkptError {
    let mut f = progress.failure.lock().unwrap_or_else(|e| e.into_inner());
    if f.is_none() {
        *f = Some(e.to_string());
    }
    e
}

impl ChunkSink {
    /// Write the rows quantized to `bits` bits per value (Check-N-Run; optimizer state stays
    /// f32): the stage task quantizes, off the copy-out, and the upload's progress reports the
    /// largest error ([`UploadProgress::quant_max_abs_error`]).
    pub fn quantized(mut self, bits: Option<QuantBits>) -> Self {
        self.quant = bits;
        self
    }

    /// Hand a chunk on; its bytes were counted when its buffers were allocated.
    fn send(&self, c: Chunk) -> Result<()> {
        let n = c.bytes();
        if !self.budget.take(n) || self.tx.send(c).is_err() {
            self.gauge.sub(n);
            return Err(stopped(&self.progress));
        }
        Ok(())
    }

    /// Copy `src`'s selected rows and dense range out, chunk by chunk, into the pipeline. This
    /// is the training pause: it returns once the last chunk is handed on. Blocks (call it from
    /// a blocking thread, never from an async task). Selected ids must be sorted, distinct
    /// and owned by the shard.
    pub fn copy_out(self, src: &Source<'_>) -> Result<CopyReport> {
        let mut report = CopyReport::default();
        let mut tables = Vec::new();
        for t in &src.tables {
            let words = t.layout.words();
            let local_rows = (t.data.len() / words.max(1)) as u64;
            if t.data.len() as u64 != local_rows * words as u64 {
                return Err(CkptError::InvalidArgument(format!(
                    "table {}: {} words is not a whole number of {words}-word rows",
                    t.table.0,
                    t.data.len()
                )));
            }
            let per = ((self.chunk_bytes / (8 + t.layout.bytes())).max(1)) as u64;
            let total = match t.rows {
                RowSelection::All => local_rows,
                RowSelection::Only(ids) => ids.len() as u64,
            };
            if let RowSelection::Only(ids) = t.rows {
                if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(CkptError::InvalidArgument(format!(
                        "table {}: selected ids not strictly ascending ({} after {})",
                        t.table.0, w[1], w[0]
                    )));
                }
            }
            let mut chunk = 0;
            let mut lo = 0u64;
            while lo < total {
                let hi = (lo + per).min(total);
                let n = (hi - lo) as usize;
                // Counted from allocation on: a chunk being gathered is one of the four.
                self.gauge.add((n * 8 + n * words * 4) as u64);
                let mut ids = Vec::with_capacity(n);
                let mut out = Vec::with_capacity(n * words);
                match t.rows {
                    RowSelection::All => {
                        ids.extend((lo..hi).map(|l| global(&t.ids, t.table, l)));
                        out.extend_from_slice(&t.data[lo as usize * words..hi as usize * words]);
                    }
                    RowSelection::Only(sel) => {
                        for &g in &sel[lo as usize..hi as usize] {
                            let l = local(&t.ids, t.table, g).filter(|&l| l < local_rows);
                            let Some(l) = l else {
                                self.gauge.sub((n * 8 + n * words * 4) as u64);
                                return Err(CkptError::InvalidArgument(format!(
                                    "table {}: row {g} is not held by server {}",
                                    t.table.0, src.server.0
                                )));
                            };
                            ids.push(g);
                            out.extend_from_slice(
                                &t.data[l as usize * words..(l as usize + 1) * words],
                            );
                        }
                    }
                }
                report.rows += n as u64;
                report.chunks += 1;
                report.bytes += (n * (8 + t.layout.bytes())) as u64;
                self.send(Chunk::Rows {
                    path: rows_path(src.server, t.table, chunk, self.quant.is_some()),
                    table: t.table,
                    layout: t.layout,
                    ids,
                    words: out,
                    server: src.server,
                    quant: self.quant,
                })?;
                chunk += 1;
                lo = hi;
            }
            tables.push(TableInfo {
                table: t.table,
                rows: total,
                layout: t.layout,
            });
        }
        let mut dense = None;
        if let Some((first_block, p)) = src.dense {
            let blocks = p.blocks();
            let spb = p.state.len().checked_div(blocks).unwrap_or(0);
            if spb * blocks != p.state.len() {
                return Err(CkptError::InvalidArgument(format!(
                    "dense state of {} words does not split over {blocks} blocks",
                    p.state.len()
                )));
            }
            let per = (self.chunk_bytes / ((DENSE_BLOCK + spb) * 4)).max(1);
            let (mut lo, mut chunk) = (0, 0);
            while lo < blocks {
                let hi = (lo + per).min(blocks);
                let vlen = (hi * DENSE_BLOCK).min(p.len()) - lo * DENSE_BLOCK;
                self.gauge.add(((vlen + (hi - lo) * spb) * 4) as u64);
                let values = p.values[lo * DENSE_BLOCK..(hi * DENSE_BLOCK).min(p.len())].to_vec();
                let state = p.state[lo * spb..hi * spb].to_vec();
                report.dense_blocks += (hi - lo) as u64;
                report.chunks += 1;
                report.bytes += ((values.len() + state.len()) * 4) as u64;
                self.send(Chunk::Dense {
                    path: dense_path(src.server, chunk),
                    server: src.server,
                    first_block: first_block + lo as u64,
                    values,
                    state,
                    spb,
                })?;
                lo = hi;
                chunk += 1;
            }
            dense = Some(DenseInfo {
                first_block,
                blocks: blocks as u64,
                values: p.len() as u64,
                state_per_block: spb as u32,
            });
        }
        tables.sort_by_key(|t| t.table);
        self.send(Chunk::Done(ShardInfo {
            server: src.server,
            tables,
            dense,
        }))?;
        Ok(report)
    }
}

fn global(ids: &RowIds<'_>, table: TableId, local: u64) -> RowId {
    match ids {
        RowIds::Identity => local,
        RowIds::Sharded { map, server } => map.global_row(table, *server, local),
        RowIds::Explicit(v) => v[local as usize],
    }
}

fn local(ids: &RowIds<'_>, table: TableId, row: RowId) -> Option<u64> {
    match ids {
        RowIds::Identity => Some(row),
        RowIds::Sharded { map, server } => {
            (map.owner(table, row) == *server).then(|| map.local_index(table, row))
        }
        RowIds::Explicit(v) => v.binary_search(&row).ok().map(|i| i as u64),
    }
}

/// Progress of an upload, readable while it runs.
#[derive(Debug, Default)]
pub struct UploadProgress {
    staged: AtomicU64,
    uploaded: AtomicU64,
    uploaded_bytes: AtomicU64,
    /// Bits of the largest quantization error (a non-negative f32 orders as its bits do).
    quant_err_bits: std::sync::atomic::AtomicU32,
    /// The pipeline's first failure, named by every later error.
    failure: std::sync::Mutex<Option<String>>,
}

impl UploadProgress {
    pub fn staged(&self) -> u64 {
        self.staged.load(Ordering::SeqCst)
    }
    pub fn uploaded(&self) -> u64 {
        self.uploaded.load(Ordering::SeqCst)
    }
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded_bytes.load(Ordering::SeqCst)
    }
    /// Largest absolute error of a quantized value staged so far (0 when not quantizing).
    pub fn quant_max_abs_error(&self) -> f32 {
        f32::from_bits(self.quant_err_bits.load(Ordering::SeqCst))
    }
}

/// The background end of a staging pipeline.
#[derive(Debug)]
pub struct PendingUpload {
    task: tokio::task::JoinHandle<Result<ShardReport>>,
    progress: Arc<UploadProgress>,
}

impl PendingUpload {
    pub fn progress(&self) -> &Arc<UploadProgress> {
        &self.progress
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Wait until every chunk is in the store (or the pipeline failed); the report lists the
    /// files for the coordinator's manifest.
    pub async fn wait(self) -> Result<ShardReport> {
        self.task
            .await
            .map_err(|e| CkptError::TemporarilyUnavailable {
                backend: "staging",
                reason: format!("upload task ended abnormally: {e}"),
            })?
    }
}

/// Start the stage and upload tasks of one server's checkpoint `id` on `rt`; feed them with
/// [`ChunkSink::copy_out`].
pub fn start(
    ckpts: Checkpoints,
    id: CheckpointId,
    server: ServerId,
    opts: &StagingOptions,
    gauge: Arc<MemGauge>,
    rt: &tokio::runtime::Handle,
) -> Result<(ChunkSink, PendingUpload)> {
    opts.check()?;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = opts.staging_dir.join(format!(
        "{}-s{:04}-{}-{}",
        id,
        server.0,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| CkptError::io(dir.display().to_string(), e))?;
    // One chunk size queued and one being staged, as many chunks as fit.
    let budget = Arc::new(Budget::new(2 * opts.chunk_bytes as u64));
    let (tx, rx) = mpsc::unbounded_channel::<Chunk>();
    // Staged files are on disk: the queue holds names, not data.
    let (up_tx, up_rx) = mpsc::unbounded_channel::<std::result::Result<Staged, ShardInfo>>();
    let progress = Arc::new(UploadProgress::default());
    let sink_gauge = gauge.clone();
    let stage = {
        let gauge = gauge.clone();
        let dir = dir.clone();
        let progress = progress.clone();
        let limit = opts.limit_bytes;
        let budget = budget.clone();
        rt.spawn_blocking(move || {
            // The failure is noted while both channel ends still live: the copy-out and the
            // upload that find them gone must find the cause too, not "ended early".
            let mut rx = rx;
            let r = stage_loop(&mut rx, &up_tx, &dir, &gauge, &progress, limit, &budget)
                .map_err(|e| note_failure(&progress, e));
            budget.close();
            drop(rx);
            drop(up_tx);
            r
        })
    };
    let task = {
        let progress = progress.clone();
        let chunk_bytes = opts.chunk_bytes as u64;
        rt.spawn(async move {
            // As above: noted before the receiver is dropped.
            let mut up_rx = up_rx;
            let up = upload_loop(&ckpts, &id, &mut up_rx, &gauge, &progress, chunk_bytes)
                .await
                .map_err(|e| note_failure(&progress, e));
            drop(up_rx);
            let staged = stage.await.map_err(|e| CkptError::TemporarilyUnavailable {
                backend: "staging",
                reason: format!("stage task ended abnormally: {e}"),
            });
            let _ = std::fs::remove_dir_all(&dir);
            // The stage's own error first: it is the cause when the upload saw the stage stop.
            staged??;
            up
        })
    };
    Ok((
        ChunkSink {
            tx,
            budget,
            progress: progress.clone(),
            gauge: sink_gauge,
            chunk_bytes: opts.chunk_bytes,
            quant: None,
        },
        PendingUpload { task, progress },
    ))
}

fn stage_loop(
    rx: &mut mpsc::UnboundedReceiver<Chunk>,
    up: &mpsc::UnboundedSender<std::result::Result<Staged, ShardInfo>>,
    dir: &Path,
    gauge: &MemGauge,
    progress: &UploadProgress,
    limit_bytes: Option<u64>,
    budget: &Budget,
) -> Result<()> {
    while let Some(chunk) = rx.blocking_recv() {
        let n = chunk.bytes();
        let res = stage_one(chunk, dir, progress);
        gauge.sub(n);
        budget.give(n);
        match res? {
            Ok(staged) => {
                if let Some(limit) = limit_bytes {
                    // What is staged and not yet uploaded (uploads remove their files).
                    let held = dir_bytes(dir);
                    if held > limit {
                        let _ = std::fs::remove_file(&staged.local);
                        return Err(CkptError::io(
                            staged.local.display().to_string(),
                            std::io::Error::new(
                                std::io::ErrorKind::StorageFull,
                                format!(
                                    "no space left on device: the staging limit of {limit} bytes is reached ({held} bytes staged)"
                                ),
                            ),
                        ));
                    }
                }
                progress.staged.fetch_add(1, Ordering::SeqCst);
                if up.send(Ok(staged)).is_err() {
                    return Err(stopped(progress));
                }
            }
            Err(info) => {
                let _ = up.send(Err(info));
                return Ok(());
            }
        }
    }
    Err(CkptError::InvalidArgument(
        "the copy-out ended before it sent the shard's shape".into(),
    ))
}

/// Bytes of the files in `dir` (not recursive).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Remove the upload folders under `staging_dir` whose process no longer exists (named
/// `<id>-s<server>-<pid>-<n>` by [`start`]); returns what it removed. Folders of live
/// processes, this one's included, and anything not named so are left alone.
pub fn remove_dead_folders(staging_dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(staging_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CkptError::io(staging_dir.display().to_string(), e)),
    };
    let mut removed = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (Some(n), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(_), Ok(pid)) = (n.parse::<u64>(), pid.parse::<i32>()) else {
            continue;
        };
        if pid <= 0 || pid as u32 == std::process::id() || crate::lease::process_alive(pid) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
                .map_err(|e| CkptError::io(path.display().to_string(), e))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

fn stage_one(
    chunk: Chunk,
    dir: &Path,
    progress: &UploadProgress,
) -> Result<std::result::Result<Staged, ShardInfo>> {
    let (path, size, crc, content, bytes_file): (String, u64, FileChecksums, FileContent, _) =
        match chunk {
            Chunk::Done(info) => return Ok(Err(info)),
            Chunk::Rows {
                path,
                table,
                layout,
                ids,
                words,
                server,
                quant,
            } => {
                let local = dir.join(path.replace('/', "_"));
                let f = std::fs::File::create(&local)
                    .map_err(|e| CkptError::io(local.display().to_string(), e))?;
                let mut w = std::io::BufWriter::with_capacity(256 << 10, f);
                let (first_row, last_row) = (
                    ids.first().copied().unwrap_or(0),
                    ids.last().copied().unwrap_or(0),
                );
                let (size, crc, content) = match quant {
                    None => {
                        let (size, crc) = write_rows_to(&mut w, table, layout, &ids, &words)?;
                        let content = FileContent::Rows {
                            server,
                            table,
                            rows: ids.len() as u64,
                            first_row,
                            last_row,
                        };
                        (size, crc, content)
                    }
                    Some(bits) => {
                        let (size, crc, err) =
                            write_qrows_to(&mut w, table, layout, bits, &ids, &words)?;
                        progress
                            .quant_err_bits
                            .fetch_max(err.to_bits(), Ordering::SeqCst);
                        let content = FileContent::QuantRows {
                            server,
                            table,
                            rows: ids.len() as u64,
                            first_row,
                            last_row,
                            bits: bits.bits() as u8,
                        };
                        (size, crc, content)
                    }
                };
                w.flush()
                    .map_err(|e| CkptError::io(local.display().to_string(), e))?;
                (path, size, crc, content, local)
            }
            Chunk::Dense {
                path,
                server,
                first_block,
                values,
                state,
                spb,
            } => {
                let local = dir.join(path.replace('/', "_"));
                let file = encode_dense(first_block, &values, &state, spb)?;
                std::fs::write(&local, &file.bytes)
                    .map_err(|e| CkptError::io(local.display().to_string(), e))?;
                let content = FileContent::Dense {
                    server,
                    first_block,
                    blocks: values.len().div_ceil(DENSE_BLOCK) as u64,
                };
                (path, file.size(), file.checksums, content, local)
            }
        };
    Ok(Ok(Staged {
        local: bytes_file,
        info: FileInfo {
            path,
            size,
            crc32c: crc,
            content,
        },
    }))
}

/// Files one upload puts into the store at once: a put is mostly waiting (a create, a write,
/// an fsync, a rename, the folder's fsync), so a shard of many small files goes at the rate
/// of several of them.
const PUTS_AT_ONCE: usize = 8;

/// Read a staged file back, check it, put it create-only into the store and remove it from
/// the staging directory; its key, for clean-up after a failure.
async fn upload_one(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    staged: &Staged,
    gauge: &MemGauge,
) -> Result<crate::key::Key> {
    let local = staged.local.clone();
    let data = tokio::task::spawn_blocking(move || std::fs::read(&local))
        .await
        .map_err(|e| CkptError::TemporarilyUnavailable {
            backend: "staging",
            reason: format!("read task failed: {e}"),
        })?
        .map_err(|e| CkptError::io(staged.local.display().to_string(), e))?;
    let key = ckpts.file_key(id, &staged.info.path)?;
    crate::format::verify_staged(&staged.local.display().to_string(), &data, &staged.info)?;
    let n = data.len() as u64;
    gauge.add(n);
    let put = ckpts
        .store()
        .put(&key, bytes::Bytes::from(data), PutMode::Create)
        .await;
    gauge.sub(n);
    put?;
    let _ = std::fs::remove_file(&staged.local);
    Ok(key)
}

/// Upload the staged files as they come, in order, up to [`PUTS_AT_ONCE`] at a time and at
/// most `budget` bytes of them read back at once (a file larger than that goes alone). On the
/// first failure nothing more is started, the running puts end, and every file this upload
/// wrote is deleted.
async fn upload_loop(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    rx: &mut mpsc::UnboundedReceiver<std::result::Result<Staged, ShardInfo>>,
    gauge: &MemGauge,
    progress: &UploadProgress,
    budget: u64,
) -> Result<ShardReport> {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut files = Vec::new();
    let mut written = Vec::new();
    let mut running = FuturesUnordered::new();
    let (mut held, mut shard, mut failed, mut ended) = (0u64, None, None, false);
    // A staged file that does not fit beside the running puts waits (on disk) for room.
    let mut waiting: Option<Staged> = None;
    let start = |staged: Staged, held: &mut u64| {
        *held += staged.info.size;
        async move {
            let r = upload_one(ckpts, id, &staged, gauge).await;
            (staged, r)
        }
    };
    while !(ended && running.is_empty()) {
        let room = !ended && waiting.is_none() && running.len() < PUTS_AT_ONCE;
        tokio::select! {
            biased;
            Some((staged, r)) = running.next(), if !running.is_empty() => {
                let staged: Staged = staged;
                held -= staged.info.size;
                match r {
                    Ok(key) => {
                        written.push(key);
                        progress.uploaded.fetch_add(1, Ordering::SeqCst);
                        progress.uploaded_bytes.fetch_add(staged.info.size, Ordering::SeqCst);
                        files.push(staged.info);
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                        ended = true;
                        waiting = None;
                    }
                }
                if let Some(w) = waiting.take_if(|w| running.is_empty() || held + w.info.size <= budget) {
                    running.push(start(w, &mut held));
                }
            }
            next = rx.recv(), if room => match next {
                // The stage stopped before the shard's end: the running puts' own errors
                // first, then that.
                None => ended = true,
                Some(Err(info)) => {
                    shard = Some(info);
                    ended = true;
                }
                Some(Ok(staged)) => {
                    if running.is_empty() || held + staged.info.size <= budget {
                        running.push(start(staged, &mut held));
                    } else {
                        waiting = Some(staged);
                    }
                }
            },
            else => break,
        }
    }
    let result: Result<ShardInfo> = match (failed, shard) {
        (Some(e), _) => Err(e),
        (None, Some(shard)) => Ok(shard),
        (None, None) => Err(stopped(progress)),
    };
    match result {
        Ok(shard) => {
            files.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(ShardReport {
                shard,
                bytes: files.iter().map(|f| f.size).sum(),
                files,
            })
        }
        Err(e) => {
            // Best effort: the files are unreferenced either way, but leave less behind.
            for k in written {
                let _ = ckpts.store().delete(&k).await;
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::ChunkStore;

    /// The copy-out's hand-off holds chunks up to its byte budget, as many as fit; a chunk
    /// larger than the budget takes all of it; a copy-out waiting for room wakes with an
    /// error when the stage stops.
    #[test]
    fn the_hand_off_is_bounded_in_bytes_and_a_stopped_stage_wakes_the_copy_out() {
        let b = Arc::new(Budget::new(100));
        for _ in 0..10 {
            assert!(b.take(10), "ten chunks of 10 bytes fit in 100");
        }
        for _ in 0..10 {
            b.give(10);
        }
        assert!(
            b.take(1_000),
            "a chunk over the budget takes the whole of it once free"
        );
        b.give(1_000);
        assert!(b.take(95));
        let waiting = {
            let b = b.clone();
            std::thread::spawn(move || b.take(10))
        };
        b.close();
        assert!(
            !waiting.join().unwrap(),
            "a stopped stage fails the waiting copy-out"
        );
        assert!(!b.take(0), "and every later one");
    }

    /// A staged file whose bytes changed on local disk after it was written is caught when it
    /// is read back, and never uploaded.
    #[test]
    fn a_staged_file_damaged_on_disk_is_not_uploaded() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let progress = UploadProgress::default();
        let chunk = Chunk::Dense {
            path: dense_path(ServerId(0), 0),
            server: ServerId(0),
            first_block: 0,
            values: (0..300).map(|i| i as f32).collect(),
            state: Vec::new(),
            spb: 0,
        };
        let staged = stage_one(chunk, dir.path(), &progress).unwrap().unwrap();
        let mut bytes = std::fs::read(&staged.local).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 0x10;
        std::fs::write(&staged.local, &bytes).unwrap();
        let mem = Arc::new(MemoryStore::new());
        let ckpts = Checkpoints::new(mem.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Ok(staged)).unwrap();
        drop(tx);
        let id = CheckpointId::new("c").unwrap();
        let gauge = MemGauge::new();
        let err = rt
            .block_on(upload_loop(
                &ckpts,
                &id,
                &mut rx,
                &gauge,
                &progress,
                1 << 20,
            ))
            .unwrap_err();
        assert!(matches!(err, CkptError::ChecksumMismatch { .. }), "{err}");
        assert!(err.to_string().contains("dense-000000.dense"), "{err}");
        assert!(rt.block_on(mem.list(None)).unwrap().is_empty());
    }
}

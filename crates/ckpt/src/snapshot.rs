//! Full snapshots: a server's table shards and dense block range as bounded-size chunk files.
//!
//! Writing streams the shard in place: each chunk file is encoded straight from a slice of the
//! table (no second copy of the shard exists), and at most `max_in_flight` encoded chunks are
//! alive at once, so memory is bounded by `max_in_flight * chunk_bytes` whatever the model size
//! (the same bound DECK's staging keeps, DECK §3.2). Several servers write into one checkpoint
//! id in parallel; the coordinator then commits one manifest over all their files.
//!
//! Restoring reads a server's files (again at most `max_in_flight` at a time), verifies each
//! against the manifest, checks that the ids it holds are exactly the rows the target shard
//! owns, and copies the rows into place.

use std::collections::BTreeMap;

use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, RowId, ServerId, ShardMap, TableId, DENSE_BLOCK,
};
use futures_util::{StreamExt, TryStreamExt};

use crate::checkpoint::{Checkpoints, VerifiedFile};
use crate::error::{CkptError, Result};
use crate::format::dense::encode_dense;
use crate::format::rows::encode_rows;
use crate::format::{
    CheckpointId, CheckpointKind, DataPosition, DenseInfo, FileContent, FileInfo, Manifest,
    ShardInfo, TableInfo,
};

/// How snapshots are cut and pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Upper bound on one chunk file's size (a chunk holds at least one row or block).
    pub chunk_bytes: usize,
    /// Chunks being encoded, written or read at once, per server.
    pub max_in_flight: usize,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        // Measured on the local backend (`examples/ckpt_bandwidth.rs`): 4 MiB chunks with 4
        // in flight read back at about 0.7 of the raw disk's sequential bandwidth, where 32 MiB
        // chunks reach about 0.45 (each large buffer is freshly faulted in); 16 MiB per server.
        SnapshotOptions {
            chunk_bytes: 4 << 20,
            max_in_flight: 4,
        }
    }
}

impl SnapshotOptions {
    fn check(&self) -> Result<()> {
        if self.chunk_bytes < 1024 || self.max_in_flight == 0 {
            return Err(CkptError::InvalidArgument(format!(
                "snapshot options need chunk_bytes >= 1024 and max_in_flight >= 1, got {self:?}"
            )));
        }
        Ok(())
    }
}

/// How the local rows of a table shard map to global row ids.
#[derive(Debug, Clone, Copy)]
pub enum RowIds<'a> {
    /// Local row `i` is global row `i` (a whole table).
    Identity,
    /// The rows `server` owns under `map` ([`ShardMap::global_row`]).
    Sharded { map: ShardMap, server: ServerId },
    /// Local row `i` is `ids[i]`; strictly ascending.
    Explicit(&'a [RowId]),
}

impl RowIds<'_> {
    fn global(&self, table: TableId, local: u64) -> RowId {
        match self {
            RowIds::Identity => local,
            RowIds::Sharded { map, server } => map.global_row(table, *server, local),
            RowIds::Explicit(ids) => ids[local as usize],
        }
    }

    /// The local index of global row `row`, if this shard owns it.
    fn local(&self, table: TableId, row: RowId) -> Option<u64> {
        match self {
            RowIds::Identity => Some(row),
            RowIds::Sharded { map, server } => {
                (map.owner(table, row) == *server).then(|| map.local_index(table, row))
            }
            RowIds::Explicit(ids) => ids.binary_search(&row).ok().map(|i| i as u64),
        }
    }

    /// Global ids of local rows `start..start + n`, computed incrementally.
    fn globals_from(&self, table: TableId, start: u64, n: usize) -> Globals<'_> {
        match self {
            RowIds::Identity => Globals::Step {
                next: start,
                step: 1,
                left: n,
            },
            RowIds::Sharded { map, server } => Globals::Step {
                next: map.global_row(table, *server, start),
                step: map.servers() as u64,
                left: n,
            },
            RowIds::Explicit(ids) => Globals::Slice(
                ids.get(start as usize..start as usize + n)
                    .unwrap_or(&[])
                    .iter(),
            ),
        }
    }

    fn check(&self, table: TableId, rows: u64) -> Result<()> {
        if let RowIds::Explicit(ids) = self {
            if ids.len() as u64 != rows {
                return Err(CkptError::InvalidArgument(format!(
                    "table {}: {} explicit row ids for {rows} rows",
                    table.0,
                    ids.len()
                )));
            }
            if ids.windows(2).any(|w| w[0] >= w[1]) {
                return Err(CkptError::InvalidArgument(format!(
                    "table {}: explicit row ids are not strictly ascending",
                    table.0
                )));
            }
        }
        Ok(())
    }
}

/// Iterator behind [`RowIds::globals_from`].
enum Globals<'a> {
    Step { next: u64, step: u64, left: usize },
    Slice(std::slice::Iter<'a, RowId>),
}

impl Iterator for Globals<'_> {
    type Item = RowId;
    fn next(&mut self) -> Option<RowId> {
        match self {
            Globals::Step { next, step, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                let v = *next;
                *next += *step;
                Some(v)
            }
            Globals::Slice(it) => it.next().copied(),
        }
    }
}

/// One table shard to save.
#[derive(Debug, Clone, Copy)]
pub struct TableShard<'a> {
    pub table: &'a EmbeddingTable,
    pub ids: RowIds<'a>,
}

/// A dense block range to save: `params` holds blocks `first_block..` of the model's dense
/// parameters.
#[derive(Debug, Clone, Copy)]
pub struct DenseShard<'a> {
    pub first_block: u64,
    pub params: &'a DenseParams,
}

/// What one server saves.
#[derive(Debug, Clone)]
pub struct ServerShard<'a> {
    pub server: ServerId,
    pub tables: Vec<TableShard<'a>>,
    pub dense: Option<DenseShard<'a>>,
}

/// One table shard to restore into (already sized: `rows` rows of the saved layout).
#[derive(Debug)]
pub struct TableTarget<'a> {
    pub table: &'a mut EmbeddingTable,
    pub ids: RowIds<'a>,
}

/// A dense block range to restore into.
#[derive(Debug)]
pub struct DenseTarget<'a> {
    pub first_block: u64,
    pub params: &'a mut DenseParams,
}

/// What one server restores.
#[derive(Debug)]
pub struct ShardTarget<'a> {
    pub server: ServerId,
    pub tables: Vec<TableTarget<'a>>,
    pub dense: Option<DenseTarget<'a>>,
}

/// What a server wrote: the pieces of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardReport {
    pub shard: ShardInfo,
    pub files: Vec<FileInfo>,
    /// Bytes written.
    pub bytes: u64,
}

/// What a restore read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreReport {
    pub files: u64,
    pub bytes: u64,
    pub rows: u64,
    pub dense_blocks: u64,
}

fn state_per_block(p: &DenseParams) -> Result<usize> {
    let blocks = p.blocks();
    if blocks == 0 {
        return Ok(0);
    }
    if !p.state.len().is_multiple_of(blocks) {
        return Err(CkptError::InvalidArgument(format!(
            "dense state of {} words is not a whole number of slots for {blocks} blocks",
            p.state.len()
        )));
    }
    Ok(p.state.len() / blocks)
}

/// One unit of work of a shard write.
#[derive(Debug, Clone, Copy)]
enum Job {
    Rows {
        table: usize,
        lo: u64,
        hi: u64,
        chunk: u64,
    },
    Dense {
        lo: usize,
        hi: usize,
        chunk: u64,
    },
}

fn rows_path(server: ServerId, table: TableId, chunk: u64) -> String {
    format!("s{:04}/t{:04}-{chunk:06}.rows", server.0, table.0)
}

fn dense_path(server: ServerId, chunk: u64) -> String {
    format!("s{:04}/dense-{chunk:06}.dense", server.0)
}

/// Write `shard` as chunk files of checkpoint `id` (create-only). Returns what the manifest
/// needs; nothing is committed.
pub async fn write_shard(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    shard: &ServerShard<'_>,
    opts: &SnapshotOptions,
) -> Result<ShardReport> {
    opts.check()?;
    let mut jobs = Vec::new();
    let mut tables = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (ti, t) in shard.tables.iter().enumerate() {
        let table = t.table;
        if !seen.insert(table.id) {
            return Err(CkptError::InvalidArgument(format!(
                "table {} given twice for server {}",
                table.id.0, shard.server.0
            )));
        }
        t.ids.check(table.id, table.rows())?;
        let layout = table.layout();
        tables.push(TableInfo {
            table: table.id,
            rows: table.rows(),
            layout,
        });
        let per = (opts.chunk_bytes.saturating_sub(128) / (8 + layout.bytes())).max(1) as u64;
        let mut lo = 0;
        let mut chunk = 0;
        while lo < table.rows() {
            let hi = (lo + per).min(table.rows());
            jobs.push(Job::Rows {
                table: ti,
                lo,
                hi,
                chunk,
            });
            lo = hi;
            chunk += 1;
        }
    }
    let mut dense_info = None;
    let mut dense_spb = 0;
    if let Some(d) = &shard.dense {
        let spb = state_per_block(d.params)?;
        dense_spb = spb;
        let blocks = d.params.blocks();
        dense_info = Some(DenseInfo {
            first_block: d.first_block,
            blocks: blocks as u64,
            values: d.params.len() as u64,
            state_per_block: spb as u32,
        });
        let per = (opts.chunk_bytes.saturating_sub(128) / ((DENSE_BLOCK + spb) * 4)).max(1);
        let mut lo = 0;
        let mut chunk = 0;
        while lo < blocks {
            let hi = (lo + per).min(blocks);
            jobs.push(Job::Dense { lo, hi, chunk });
            lo = hi;
            chunk += 1;
        }
    }

    let server = shard.server;
    let mut files: Vec<FileInfo> = futures_util::stream::iter(jobs)
        .map(|job| async move {
            let (path, file, content) = match job {
                Job::Rows {
                    table,
                    lo,
                    hi,
                    chunk,
                } => {
                    let t = &shard.tables[table];
                    let tid = t.table.id;
                    let w = t.table.layout().words();
                    let ids = t.ids;
                    let file = encode_rows(
                        tid,
                        t.table.layout(),
                        ids.globals_from(tid, lo, (hi - lo) as usize),
                        &t.table.as_slice()[lo as usize * w..hi as usize * w],
                    )?;
                    let content = FileContent::Rows {
                        server,
                        table: tid,
                        rows: hi - lo,
                        first_row: ids.global(tid, lo),
                        last_row: ids.global(tid, hi - 1),
                    };
                    (rows_path(server, tid, chunk), file, content)
                }
                Job::Dense { lo, hi, chunk } => {
                    let d = shard
                        .dense
                        .as_ref()
                        .expect("dense jobs only with a dense shard");
                    let p = d.params;
                    let values = &p.values[lo * DENSE_BLOCK..(hi * DENSE_BLOCK).min(p.len())];
                    let state = &p.state[lo * dense_spb..hi * dense_spb];
                    let file = encode_dense(d.first_block + lo as u64, values, state, dense_spb)?;
                    let content = FileContent::Dense {
                        server,
                        first_block: d.first_block + lo as u64,
                        blocks: (hi - lo) as u64,
                    };
                    (dense_path(server, chunk), file, content)
                }
            };
            ckpts.put_file(id, &path, &file).await?;
            Ok::<_, CkptError>(FileInfo {
                path,
                size: file.size(),
                crc32c: file.checksums,
                content,
            })
        })
        .buffer_unordered(opts.max_in_flight)
        .try_collect()
        .await?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    tables.sort_by_key(|t| t.table);
    Ok(ShardReport {
        shard: ShardInfo {
            server,
            tables,
            dense: dense_info,
        },
        bytes: files.iter().map(|f| f.size).sum(),
        files,
    })
}

/// The manifest of a full checkpoint made of `reports` (one per server).
pub fn full_manifest(
    id: CheckpointId,
    step: u64,
    data_position: DataPosition,
    reports: Vec<ShardReport>,
) -> Manifest {
    let mut shards = Vec::new();
    let mut files = Vec::new();
    for r in reports {
        shards.push(r.shard);
        files.extend(r.files);
    }
    shards.sort_by_key(|s| s.server);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Manifest {
        id,
        kind: CheckpointKind::Full,
        step,
        parents: Vec::new(),
        data_position,
        shards,
        files,
        extra: BTreeMap::new(),
    }
}

/// Write every server's shard into checkpoint `id` concurrently, then commit it.
pub async fn write_full(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    step: u64,
    data_position: DataPosition,
    shards: &[ServerShard<'_>],
    opts: &SnapshotOptions,
) -> Result<Manifest> {
    let mut servers = std::collections::BTreeSet::new();
    for s in shards {
        if !servers.insert(s.server) {
            return Err(CkptError::InvalidArgument(format!(
                "server {} given twice",
                s.server.0
            )));
        }
    }
    let reports =
        futures_util::future::try_join_all(shards.iter().map(|s| write_shard(ckpts, id, s, opts)))
            .await?;
    let manifest = full_manifest(id.clone(), step, data_position, reports);
    ckpts.commit(&manifest).await?;
    Ok(manifest)
}

/// Restore `target`'s tables and dense range from full checkpoint `manifest`, verifying every
/// file it reads. The targets must have the saved shapes. On error the targets may be partly
/// overwritten.
pub async fn restore_shard(
    ckpts: &Checkpoints,
    manifest: &Manifest,
    target: &mut ShardTarget<'_>,
    opts: &SnapshotOptions,
) -> Result<RestoreReport> {
    opts.check()?;
    let invalid = |reason: String| CkptError::InvalidCheckpoint {
        id: manifest.id.to_string(),
        reason,
    };
    if manifest.kind != CheckpointKind::Full {
        return Err(invalid(format!(
            "is a {} checkpoint; a shard restores from a full one",
            manifest.kind.name()
        )));
    }
    let server = target.server;
    let info = manifest
        .shard(server)
        .ok_or_else(|| invalid(format!("holds nothing for server {}", server.0)))?;

    // Shapes must match one to one.
    let mut slot: BTreeMap<TableId, usize> = BTreeMap::new();
    for (i, t) in target.tables.iter().enumerate() {
        if slot.insert(t.table.id, i).is_some() {
            return Err(CkptError::InvalidArgument(format!(
                "table {} given twice",
                t.table.id.0
            )));
        }
        t.ids.check(t.table.id, t.table.rows())?;
    }
    if slot.len() != info.tables.len() {
        return Err(invalid(format!(
            "server {} saved {} tables, restoring into {}",
            server.0,
            info.tables.len(),
            slot.len()
        )));
    }
    for ti in &info.tables {
        let i = *slot.get(&ti.table).ok_or_else(|| {
            invalid(format!(
                "server {} saved table {}, which is not among the targets",
                server.0, ti.table.0
            ))
        })?;
        let t = &target.tables[i].table;
        if t.rows() != ti.rows || t.layout() != ti.layout {
            return Err(invalid(format!(
                "table {} of server {}: saved {} rows of {:?}, target has {} rows of {:?}",
                ti.table.0,
                server.0,
                ti.rows,
                ti.layout,
                t.rows(),
                t.layout()
            )));
        }
    }
    let mut spb = 0;
    match (&info.dense, &target.dense) {
        (None, None) => {}
        (Some(d), Some(t)) => {
            spb = state_per_block(t.params)?;
            if d.first_block != t.first_block
                || d.values != t.params.len() as u64
                || d.state_per_block as usize != spb
            {
                return Err(invalid(format!(
                    "dense of server {}: saved {d:?}, target has first block {}, {} values, {spb} state words per block",
                    server.0,
                    t.first_block,
                    t.params.len()
                )));
            }
        }
        (Some(_), None) => {
            return Err(invalid(format!(
                "server {} saved dense blocks but no dense target was given",
                server.0
            )))
        }
        (None, Some(_)) => {
            return Err(invalid(format!(
                "server {} saved no dense blocks but a dense target was given",
                server.0
            )))
        }
    }

    // Read files in a fixed order: rows by (table, first row), dense by first block. Each
    // table's rows must then arrive with strictly ascending local indices; with the count
    // check at the end, that proves every local row was restored exactly once.
    // Owned entries: a stream of futures borrowing them would not be provably `Send`.
    let mut files: Vec<FileInfo> = manifest.files_of(server).cloned().collect();
    files.sort_by_key(|f| match f.content {
        FileContent::Rows {
            table, first_row, ..
        } => (0, table.0 as u64, first_row),
        FileContent::Dense { first_block, .. } => (1, 0, first_block),
        _ => (2, 0, 0),
    });
    let mut next_local: Vec<u64> = vec![0; target.tables.len()];
    let mut next_block = target.dense.as_ref().map_or(0, |d| d.first_block);
    let mut report = RestoreReport::default();

    // Reading and checksumming run ahead on the blocking pool while this task copies, so the
    // copy of one file overlaps the read and verification of the next.
    let mut stream = futures_util::stream::iter(files)
        .map(|f: FileInfo| async move {
            let key = ckpts.file_key(&manifest.id, &f.path)?;
            let data = ckpts.store().get(&key).await?;
            let (k, info) = (key.clone(), f.clone());
            let data = tokio::task::spawn_blocking(move || {
                Checkpoints::verify_file(&k, &info, &data)?;
                Ok::<_, CkptError>(data)
            })
            .await
            .map_err(|e| CkptError::TemporarilyUnavailable {
                backend: "restore",
                reason: format!("verification task failed: {e}"),
            })??;
            Ok::<_, CkptError>((f, key, data))
        })
        .buffered(opts.max_in_flight);
    while let Some(item) = stream.next().await {
        let (f, key, data) = item?;
        let corrupt = |reason: String| CkptError::Corrupt {
            file: key.to_string(),
            reason,
        };
        match Checkpoints::decode_verified(&key, &f, &data)? {
            VerifiedFile::Rows(chunk) => {
                // The manifest was validated against the targets, so the table is known.
                let i = *slot.get(&chunk.header.table).ok_or_else(|| {
                    corrupt(format!(
                        "holds table {}, which server {} did not save",
                        chunk.header.table.0, server.0
                    ))
                })?;
                let t = &mut target.tables[i];
                let tid = t.table.id;
                let w = t.table.layout().words();
                // The ids must be exactly this shard's next local rows, in order.
                let lo = next_local[i];
                let n = chunk.len();
                if lo + n as u64 > t.table.rows() {
                    return Err(corrupt(format!(
                        "{n} rows of table {} at local index {lo} overrun the shard's {} rows",
                        tid.0,
                        t.table.rows()
                    )));
                }
                for (k, (id, want)) in chunk.ids().zip(t.ids.globals_from(tid, lo, n)).enumerate() {
                    if id != want {
                        let owned = t.ids.local(tid, id);
                        return Err(corrupt(format!(
                            "row {k} of the file is row {id} of table {}, expected row {want} \
                             (local index {}) of server {}; the id {}",
                            tid.0,
                            lo + k as u64,
                            server.0,
                            match owned {
                                Some(l) => format!("belongs at local index {l}"),
                                None => "is not this server's".to_string(),
                            }
                        )));
                    }
                }
                let (a, b) = (lo as usize, lo as usize + n);
                chunk.copy_rows(0, n, &mut t.table.as_mut_slice()[a * w..b * w]);
                next_local[i] = lo + n as u64;
                report.rows += chunk.len() as u64;
            }
            VerifiedFile::Dense(chunk) => {
                let d = target
                    .dense
                    .as_mut()
                    .expect("dense files only when a dense target matched the manifest");
                if chunk.header.first_block != next_block {
                    return Err(corrupt(format!(
                        "dense chunk starts at block {}, expected {next_block}",
                        chunk.header.first_block
                    )));
                }
                let b0 = (chunk.header.first_block - d.first_block) as usize;
                let b1 = b0 + chunk.header.blocks as usize;
                let v0 = b0 * DENSE_BLOCK;
                let v1 = v0 + chunk.header.values as usize;
                if v1 > d.params.len() || (v1 != d.params.len() && v1 != b1 * DENSE_BLOCK) {
                    return Err(corrupt(format!(
                        "dense chunk of {} values at block {} does not fit the target",
                        chunk.header.values, chunk.header.first_block
                    )));
                }
                chunk.copy_values(&mut d.params.values[v0..v1]);
                chunk.copy_state(&mut d.params.state[b0 * spb..b1 * spb]);
                next_block += chunk.header.blocks;
                report.dense_blocks += chunk.header.blocks;
            }
            _ => {
                return Err(corrupt(
                    "a full checkpoint holds only row and dense files".into(),
                ))
            }
        }
        report.files += 1;
        report.bytes += data.len() as u64;
    }
    for (i, t) in target.tables.iter().enumerate() {
        if next_local[i] != t.table.rows() {
            return Err(invalid(format!(
                "table {} of server {}: files restore {} of {} rows",
                t.table.id.0,
                server.0,
                next_local[i],
                t.table.rows()
            )));
        }
    }
    if let Some(d) = &target.dense {
        let want = d.first_block + d.params.blocks() as u64;
        if next_block != want {
            return Err(invalid(format!(
                "dense of server {}: files restore blocks up to {next_block}, expected {want}",
                server.0
            )));
        }
    }
    Ok(report)
}

/// Digest of a shard under global keys (table, global row) and (dense, global block), so the
/// digests of all servers' shards merge into the whole model's [`ModelDigest`].
pub fn shard_digest(shard: &ServerShard<'_>) -> ModelDigest {
    let mut d = ModelDigest::new();
    for t in &shard.tables {
        for local in 0..t.table.rows() {
            d.add_row(
                t.table.id.0,
                t.ids.global(t.table.id, local),
                t.table.row(local),
            );
        }
    }
    if let Some(dense) = &shard.dense {
        let p = dense.params;
        let spb = state_per_block(p).unwrap_or(0);
        for b in 0..p.blocks() {
            let lo = b * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(p.len());
            d.add_dense_block(
                dense.first_block + b as u64,
                &p.values[lo..hi],
                &p.state[b * spb..(b + 1) * spb],
            );
        }
    }
    d
}

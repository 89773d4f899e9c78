//! Merging a chain of checkpoints, newest row wins (DECK §3.3), with bounded memory.
//!
//! One engine serves three callers: the merger (deltas of layer `i` → one merged checkpoint of
//! layer `i + 1`), the full-checkpoint writer of the merger (full + merged + deltas → a new
//! full that truncates the lineage) and restore (full + merged + deltas → a server's live
//! tables). Each input's row files of one table are a sorted stream of ids (chunks in id
//! order), so the merge is a k-way merge holding one chunk per input plus one output chunk,
//! whatever the model size. Every input file is verified (checksums, manifest entry) when read.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use bytes::Bytes;
use ftrec_core::{RowId, RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK};

use crate::checkpoint::{Checkpoints, VerifiedFile};
use crate::error::{CkptError, Result};
use crate::format::dense::DenseChunk;
use crate::format::rows::{encode_rows_raw, RowChunk};
use crate::format::{
    CheckpointId, CheckpointKind, DenseInfo, FileContent, FileInfo, Manifest, ShardInfo, TableInfo,
};
use crate::key::Key;
use crate::store::PutMode;

/// Where merged rows go.
#[async_trait]
pub trait MergeSink: Send {
    /// Rows `ids` (ascending, continuing the previous call's ids for the same table) of
    /// `layout`, as little-endian bytes.
    async fn rows(
        &mut self,
        server: ServerId,
        table: TableId,
        layout: RowLayout,
        ids: &[RowId],
        bytes: &[u8],
    ) -> Result<()>;

    /// The dense range of `server`: file `info` of checkpoint `from`, already verified.
    async fn dense(
        &mut self,
        server: ServerId,
        from: &CheckpointId,
        info: &FileInfo,
        data: Bytes,
    ) -> Result<()>;
}

/// What a merge read and wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeStats {
    pub files_read: u64,
    pub bytes_read: u64,
    pub rows_out: u64,
}

struct Cursor {
    files: Vec<FileInfo>,
    next_file: usize,
    /// The loaded chunk, its ids and the position of the next row.
    data: Bytes,
    key: String,
    ids: Vec<RowId>,
    pos: usize,
}

impl Cursor {
    fn head(&self) -> Option<RowId> {
        self.ids.get(self.pos).copied()
    }
}

async fn load_next(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    c: &mut Cursor,
    stats: &mut MergeStats,
) -> Result<()> {
    while c.pos >= c.ids.len() && c.next_file < c.files.len() {
        let info = c.files[c.next_file].clone();
        c.next_file += 1;
        let key = ckpts.file_key(id, &info.path)?;
        let data = ckpts.store().get(&key).await?;
        let ids = match Checkpoints::verify_file(&key, &info, &data)? {
            VerifiedFile::Rows(chunk) => chunk.ids().collect::<Vec<_>>(),
            _ => {
                return Err(CkptError::Corrupt {
                    file: key.to_string(),
                    reason: "listed as rows, holds something else".into(),
                })
            }
        };
        if let (Some(&first), Some(&prev)) = (ids.first(), c.ids.last()) {
            if first <= prev {
                return Err(CkptError::Corrupt {
                    file: key.to_string(),
                    reason: format!("row {first} does not follow row {prev} of the previous file"),
                });
            }
        }
        stats.files_read += 1;
        stats.bytes_read += data.len() as u64;
        c.data = data;
        c.key = key.to_string();
        c.ids = ids;
        c.pos = 0;
    }
    Ok(())
}

fn row_slice(c: &Cursor, lo: usize, hi: usize) -> Result<&[u8]> {
    // The bytes were verified when loaded; this only re-reads the header.
    Ok(RowChunk::decode_verified(&c.key, &c.data)?.rows_bytes(lo, hi))
}

/// Merge `chain` (oldest first; every manifest from `ckpts`) into `sink`, for the servers in
/// `servers` (all servers of the newest input if `None`). With `chain[0]` a full checkpoint,
/// every table's merged rows must number exactly the full's rows (a delta row outside the full
/// is corruption). Returns the shard shapes of the output with row counts.
pub async fn merge_chain(
    ckpts: &Checkpoints,
    chain: &[Manifest],
    servers: Option<&[ServerId]>,
    out_chunk_bytes: usize,
    sink: &mut dyn MergeSink,
) -> Result<(Vec<ShardInfo>, MergeStats)> {
    let newest = chain
        .last()
        .ok_or_else(|| CkptError::InvalidArgument("merge of an empty chain".into()))?;
    let servers: Vec<ServerId> = match servers {
        Some(s) => s.to_vec(),
        None => newest.shards.iter().map(|s| s.server).collect(),
    };
    if let Some(m) = chain.iter().find(|m| m.piece_scheme().is_some()) {
        return Err(CkptError::InvalidCheckpoint {
            id: m.id.to_string(),
            reason: format!(
                "is a {} piece of an incremental store; DECK merging does not apply (restore it \
                 with ftrec_ckpt::incr)",
                m.piece_scheme().map_or("", |s| s.name())
            ),
        });
    }
    let base_full = chain[0].kind == CheckpointKind::Full;
    let mut stats = MergeStats::default();
    let mut shapes = Vec::new();
    for &server in &servers {
        // Tables and layouts over all inputs, which must agree.
        let mut tables: BTreeMap<TableId, (RowLayout, Option<u64>)> = BTreeMap::new();
        for (i, m) in chain.iter().enumerate() {
            let shard = m
                .shard(server)
                .ok_or_else(|| CkptError::InvalidCheckpoint {
                    id: m.id.to_string(),
                    reason: format!("holds nothing for server {}", server.0),
                })?;
            for t in &shard.tables {
                let full_rows = (i == 0 && base_full).then_some(t.rows);
                match tables.get(&t.table) {
                    Some((l, _)) if *l != t.layout => {
                        return Err(CkptError::InvalidCheckpoint {
                            id: m.id.to_string(),
                            reason: format!(
                                "table {} of server {} has layout {:?}, earlier checkpoints {:?}",
                                t.table.0, server.0, t.layout, l
                            ),
                        })
                    }
                    Some(_) => {}
                    None if base_full && i > 0 => {
                        return Err(CkptError::InvalidCheckpoint {
                            id: m.id.to_string(),
                            reason: format!(
                                "table {} of server {} is not in full checkpoint {}",
                                t.table.0, server.0, chain[0].id
                            ),
                        })
                    }
                    None => {
                        tables.insert(t.table, (t.layout, full_rows));
                    }
                }
            }
        }
        let mut infos = Vec::new();
        for (&table, &(layout, full_rows)) in &tables {
            let mut cursors: Vec<Cursor> = chain
                .iter()
                .map(|m| {
                    let mut files: Vec<FileInfo> = m
                        .files_of(server)
                        .filter(|f| matches!(f.content, FileContent::Rows { table: t, .. } if t == table))
                        .cloned()
                        .collect();
                    files.sort_by_key(|f| match f.content {
                        FileContent::Rows { first_row, .. } => first_row,
                        _ => 0,
                    });
                    Cursor {
                        files,
                        next_file: 0,
                        data: Bytes::new(),
                        key: String::new(),
                        ids: Vec::new(),
                        pos: 0,
                    }
                })
                .collect();
            let per = (out_chunk_bytes / (8 + layout.bytes())).max(1);
            let mut out_ids: Vec<RowId> = Vec::with_capacity(per);
            let mut out_bytes: Vec<u8> = Vec::with_capacity(per * layout.bytes());
            let mut count = 0u64;
            loop {
                for (i, c) in cursors.iter_mut().enumerate() {
                    load_next(ckpts, &chain[i].id, c, &mut stats).await?;
                }
                // The smallest head; ties go to the newest input.
                let mut min: Option<(RowId, usize)> = None;
                for (i, c) in cursors.iter().enumerate() {
                    if let Some(h) = c.head() {
                        if min.is_none_or(|(m, _)| h <= m) {
                            min = Some((h, i));
                        }
                    }
                }
                let Some((row, winner)) = min else { break };
                // The next id any other input holds bounds a run the winner can copy whole.
                let bound = cursors
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != winner)
                    .filter_map(|(_, c)| c.head())
                    .min();
                let c = &cursors[winner];
                let end = match bound {
                    Some(b) if b == row => c.pos + 1,
                    Some(b) => c.pos + c.ids[c.pos..].partition_point(|&x| x < b),
                    None => c.ids.len(),
                };
                let end = end.min(c.pos + (per - out_ids.len()));
                out_ids.extend_from_slice(&c.ids[c.pos..end]);
                out_bytes.extend_from_slice(row_slice(c, c.pos, end)?);
                let n = end - cursors[winner].pos;
                count += n as u64;
                cursors[winner].pos = end;
                // Older copies of the same row lose.
                if bound == Some(row) {
                    for (i, c) in cursors.iter_mut().enumerate() {
                        if i != winner && c.head() == Some(row) {
                            c.pos += 1;
                        }
                    }
                }
                if out_ids.len() >= per {
                    sink.rows(server, table, layout, &out_ids, &out_bytes)
                        .await?;
                    stats.rows_out += out_ids.len() as u64;
                    out_ids.clear();
                    out_bytes.clear();
                }
            }
            if !out_ids.is_empty() {
                sink.rows(server, table, layout, &out_ids, &out_bytes)
                    .await?;
                stats.rows_out += out_ids.len() as u64;
            }
            if let Some(want) = full_rows {
                if count != want {
                    return Err(CkptError::InvalidCheckpoint {
                        id: newest.id.to_string(),
                        reason: format!(
                            "table {} of server {}: merging onto full {} gives {count} rows, the full holds {want} (a delta holds rows outside the shard)",
                            table.0, server.0, chain[0].id
                        ),
                    });
                }
            }
            infos.push(TableInfo {
                table,
                rows: count,
                layout,
            });
        }
        // Dense: every delta carries the whole range, so the newest input that has it wins.
        let mut dense = None;
        if let Some(m) = chain
            .iter()
            .rev()
            .find(|m| m.shard(server).is_some_and(|s| s.dense.is_some()))
        {
            let d: DenseInfo = m.shard(server).and_then(|s| s.dense).expect("found above");
            dense = Some(d);
            let mut files: Vec<FileInfo> = m
                .files_of(server)
                .filter(|f| matches!(f.content, FileContent::Dense { .. }))
                .cloned()
                .collect();
            files.sort_by_key(|f| match f.content {
                FileContent::Dense { first_block, .. } => first_block,
                _ => 0,
            });
            let mut next = d.first_block;
            for f in files {
                let key = ckpts.file_key(&m.id, &f.path)?;
                let data = ckpts.store().get(&key).await?;
                Checkpoints::verify_file(&key, &f, &data)?;
                if let FileContent::Dense {
                    first_block,
                    blocks,
                    ..
                } = f.content
                {
                    if first_block != next {
                        return Err(CkptError::Corrupt {
                            file: key.to_string(),
                            reason: format!(
                                "dense chunk starts at block {first_block}, expected {next}"
                            ),
                        });
                    }
                    next += blocks;
                }
                stats.files_read += 1;
                stats.bytes_read += data.len() as u64;
                sink.dense(server, &m.id, &f, data).await?;
            }
            if next != d.first_block + d.blocks {
                return Err(CkptError::InvalidCheckpoint {
                    id: m.id.to_string(),
                    reason: format!(
                        "dense files of server {} end at block {next}, expected {}",
                        server.0,
                        d.first_block + d.blocks
                    ),
                });
            }
        }
        shapes.push(ShardInfo {
            server,
            tables: infos,
            dense,
        });
    }
    Ok((shapes, stats))
}

/// A [`MergeSink`] that writes a new checkpoint's files into a store (create-only).
#[derive(Debug)]
pub struct StoreSink {
    ckpts: Checkpoints,
    id: CheckpointId,
    chunks: BTreeMap<(ServerId, TableId), u64>,
    pub files: Vec<FileInfo>,
    written: Vec<Key>,
    /// Write at most this many bytes per second (`None`: as fast as the store takes them).
    max_bytes_per_s: Option<f64>,
    started: std::time::Instant,
    bytes: u64,
}

impl StoreSink {
    pub fn new(ckpts: Checkpoints, id: CheckpointId) -> Self {
        StoreSink {
            ckpts,
            id,
            chunks: BTreeMap::new(),
            files: Vec::new(),
            written: Vec::new(),
            max_bytes_per_s: None,
            started: std::time::Instant::now(),
            bytes: 0,
        }
    }

    /// Cap the write rate, so that a merger running next to training leaves it the disk or
    /// the network (DECK §3.3 runs the merger in the background).
    pub fn with_rate_limit(mut self, max_bytes_per_s: Option<f64>) -> Self {
        self.max_bytes_per_s = max_bytes_per_s.filter(|r| r.is_finite() && *r > 0.0);
        self
    }

    /// After writing `n` bytes: sleep until the average rate is back under the cap.
    async fn pace(&mut self, n: u64) {
        self.bytes += n;
        if let Some(rate) = self.max_bytes_per_s {
            let due = std::time::Duration::from_secs_f64(self.bytes as f64 / rate);
            let elapsed = self.started.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
    }

    /// Remove what this sink wrote (after a failed merge; best effort).
    pub async fn discard(&self) {
        for k in &self.written {
            let _ = self.ckpts.store().delete(k).await;
        }
    }
}

#[async_trait]
impl MergeSink for StoreSink {
    async fn rows(
        &mut self,
        server: ServerId,
        table: TableId,
        layout: RowLayout,
        ids: &[RowId],
        bytes: &[u8],
    ) -> Result<()> {
        let n = self.chunks.entry((server, table)).or_insert(0);
        let path = format!("s{:04}/t{:04}-{:06}.rows", server.0, table.0, *n);
        *n += 1;
        let file = encode_rows_raw(table, layout, ids, bytes)?;
        self.ckpts.put_file(&self.id, &path, &file).await?;
        self.written.push(self.ckpts.file_key(&self.id, &path)?);
        self.pace(file.size()).await;
        self.files.push(FileInfo {
            path,
            size: file.size(),
            crc32c: file.checksums,
            content: FileContent::Rows {
                server,
                table,
                rows: ids.len() as u64,
                first_row: ids.first().copied().unwrap_or(0),
                last_row: ids.last().copied().unwrap_or(0),
            },
        });
        Ok(())
    }

    async fn dense(
        &mut self,
        _server: ServerId,
        _from: &CheckpointId,
        info: &FileInfo,
        data: Bytes,
    ) -> Result<()> {
        // The verified bytes are copied as they are: same path, size and checksums.
        let key = self.ckpts.file_key(&self.id, &info.path)?;
        let n = data.len() as u64;
        self.ckpts.store().put(&key, data, PutMode::Create).await?;
        self.written.push(key);
        self.files.push(info.clone());
        self.pace(n).await;
        Ok(())
    }
}

/// Writes restored rows and dense blocks of one server into live state.
pub trait ShardWriter: Send {
    fn server(&self) -> ServerId;
    /// Local rows and layout of `table` on this server, if it holds the table.
    fn table_shape(&self, table: TableId) -> Option<(u64, RowLayout)>;
    /// Overwrite rows `ids` (global, ascending; `layout.words()` words each in `words`).
    /// Ids the server does not own are an error.
    fn write_rows(&mut self, table: TableId, ids: &[RowId], words: &[f32]) -> Result<()>;
    /// The dense range this server holds: first block, values, state words per block.
    fn dense_shape(&self) -> Option<(u64, u64, u32)>;
    /// Overwrite dense blocks from `first_block` on.
    fn write_dense(&mut self, first_block: u64, values: &[f32], state: &[f32]) -> Result<()>;
    /// The shard map this server is part of, if it has one: then a checkpoint saved by a
    /// different number of servers can be restored into it (re-sharded by global row id).
    fn shard_map(&self) -> Option<ShardMap> {
        None
    }
}

/// A [`MergeSink`] that writes into a [`ShardWriter`].
pub(crate) struct WriterSink<'a> {
    pub writer: &'a mut dyn ShardWriter,
    scratch: Vec<f32>,
}

impl<'a> WriterSink<'a> {
    pub(crate) fn new(writer: &'a mut dyn ShardWriter) -> Self {
        WriterSink {
            writer,
            scratch: Vec::new(),
        }
    }
}

#[async_trait]
impl MergeSink for WriterSink<'_> {
    async fn rows(
        &mut self,
        _server: ServerId,
        table: TableId,
        _layout: RowLayout,
        ids: &[RowId],
        bytes: &[u8],
    ) -> Result<()> {
        self.scratch.resize(bytes.len() / 4, 0.0);
        crate::format::copy_le_into_f32s(bytes, &mut self.scratch);
        self.writer.write_rows(table, ids, &self.scratch)
    }

    async fn dense(
        &mut self,
        _server: ServerId,
        _from: &CheckpointId,
        info: &FileInfo,
        data: Bytes,
    ) -> Result<()> {
        let c = DenseChunk::decode(&info.path, &data)?;
        let mut values = vec![0.0; c.header.values as usize];
        let mut state = vec![0.0; (c.header.blocks * c.header.state_per_block as u64) as usize];
        c.copy_values(&mut values);
        c.copy_state(&mut state);
        self.writer
            .write_dense(c.header.first_block, &values, &state)
    }
}

/// A [`MergeSink`] for a restore onto a different number of servers: of each saved server's
/// merged rows it keeps those the writer's shard map gives the writer's server, and of its
/// dense blocks those in the writer's range; it counts what it kept, so the caller can check
/// that the restore covered the whole shard.
pub(crate) struct ReshardSink<'a> {
    writer: &'a mut dyn ShardWriter,
    map: ShardMap,
    me: ServerId,
    ids: Vec<RowId>,
    words: Vec<f32>,
    row: Vec<f32>,
    /// Rows written per table.
    pub rows: BTreeMap<TableId, u64>,
    /// Dense blocks written.
    pub dense_blocks: u64,
}

impl<'a> ReshardSink<'a> {
    pub(crate) fn new(writer: &'a mut dyn ShardWriter, map: ShardMap) -> Self {
        let me = writer.server();
        ReshardSink {
            writer,
            map,
            me,
            ids: Vec::new(),
            words: Vec::new(),
            row: Vec::new(),
            rows: BTreeMap::new(),
            dense_blocks: 0,
        }
    }
}

impl ReshardSink<'_> {
    /// Dense blocks in the writer's range.
    pub(crate) fn writer_dense_blocks(&self) -> Option<u64> {
        self.writer
            .dense_shape()
            .map(|(_, values, _)| (values as usize).div_ceil(DENSE_BLOCK) as u64)
    }
}

#[async_trait]
impl MergeSink for ReshardSink<'_> {
    async fn rows(
        &mut self,
        _server: ServerId,
        table: TableId,
        layout: RowLayout,
        ids: &[RowId],
        bytes: &[u8],
    ) -> Result<()> {
        let rb = layout.bytes();
        self.ids.clear();
        self.words.clear();
        self.row.resize(layout.words(), 0.0);
        for (i, &id) in ids.iter().enumerate() {
            if self.map.owner(table, id) != self.me {
                continue;
            }
            crate::format::copy_le_into_f32s(&bytes[i * rb..(i + 1) * rb], &mut self.row);
            self.ids.push(id);
            self.words.extend_from_slice(&self.row);
        }
        if self.ids.is_empty() {
            return Ok(());
        }
        self.writer.write_rows(table, &self.ids, &self.words)?;
        *self.rows.entry(table).or_default() += self.ids.len() as u64;
        Ok(())
    }

    async fn dense(
        &mut self,
        _server: ServerId,
        _from: &CheckpointId,
        info: &FileInfo,
        data: Bytes,
    ) -> Result<()> {
        let Some((t_first, t_values, t_spb)) = self.writer.dense_shape() else {
            return Ok(());
        };
        let c = DenseChunk::decode(&info.path, &data)?;
        let h = c.header;
        if h.state_per_block != t_spb {
            return Err(CkptError::InvalidArgument(format!(
                "dense file {}: {} state words per block, the target has {t_spb}",
                info.path, h.state_per_block
            )));
        }
        let t_end = t_first + (t_values as usize).div_ceil(DENSE_BLOCK) as u64;
        let (lo, hi) = (
            h.first_block.max(t_first),
            (h.first_block + h.blocks).min(t_end),
        );
        if lo >= hi {
            return Ok(());
        }
        let mut values = vec![0.0; h.values as usize];
        let mut state = vec![0.0; (h.blocks * h.state_per_block as u64) as usize];
        c.copy_values(&mut values);
        c.copy_state(&mut state);
        let (b0, b1) = ((lo - h.first_block) as usize, (hi - h.first_block) as usize);
        let v1 = (b1 * DENSE_BLOCK).min(values.len());
        let v0 = (b0 * DENSE_BLOCK).min(v1);
        let spb = h.state_per_block as usize;
        self.writer
            .write_dense(lo, &values[v0..v1], &state[b0 * spb..b1 * spb])?;
        self.dense_blocks += hi - lo;
        Ok(())
    }
}

/// Check that `writer`'s shapes match what `full` saved for its server.
pub(crate) fn check_shapes(full: &Manifest, writer: &dyn ShardWriter) -> Result<()> {
    let server = writer.server();
    let invalid = |reason: String| CkptError::InvalidCheckpoint {
        id: full.id.to_string(),
        reason,
    };
    let shard = full
        .shard(server)
        .ok_or_else(|| invalid(format!("holds nothing for server {}", server.0)))?;
    let saved: BTreeSet<TableId> = shard.tables.iter().map(|t| t.table).collect();
    for t in &shard.tables {
        match writer.table_shape(t.table) {
            Some((rows, layout)) if rows == t.rows && layout == t.layout => {}
            Some((rows, layout)) => {
                return Err(invalid(format!(
                    "table {} of server {}: saved {} rows of {:?}, target has {rows} rows of {layout:?}",
                    t.table.0, server.0, t.rows, t.layout
                )))
            }
            None => {
                return Err(invalid(format!(
                    "server {} saved table {}, which the target does not hold",
                    server.0, t.table.0
                )))
            }
        }
    }
    let _ = saved;
    match (shard.dense, writer.dense_shape()) {
        (None, None) => Ok(()),
        (Some(d), Some((first, values, spb)))
            if d.first_block == first && d.values == values && d.state_per_block == spb =>
        {
            Ok(())
        }
        (d, t) => Err(invalid(format!(
            "dense of server {}: saved {d:?}, target has {t:?}",
            server.0
        ))),
    }
}

//! Choosing and restoring an incremental state, for all three schemes, through one engine
//! ([`read_and_write`]); only what each scheme must read differs:
//!
//! - naive incremental: the base, then every piece up to the target (IncrCP §2.2's baseline;
//!   the duplicates are read, and deduplicated as they arrive: §5.1.5's "complex deduplication
//!   process in recovery");
//! - Check-N-Run differential: the base, then the target differential (§5.1.5);
//! - IncrCP chunk list: the base, then the rectangle of the target column (IncrCP §4.2), from
//!   the newest piece index's row 0 and the extracted chunks the indexes after the target
//!   record ([`rectangle_list`]: `L - i` indexes for state `i` of a list of `L`, not all `L`). A row may sit in several chunks of the rectangle
//!   when an extraction was skipped (§4.3: a chunk whose duplicate share is below `R` is left
//!   whole).
//!
//! Whatever the scheme, the copy of the newest column wins, never the copy read last, so each
//! row is written once. Every file is checked against its manifest entry (chunk-list files
//! against the size and checksums the piece index recorded, a piece's row file against its
//! manifest's payload checksum; every part against its crc32c before a byte of it is written).
//! A quantized Check-N-Run differential is the one exception: its rows are decoded row by row
//! (an approximate restore, outside the timed comparison).
//!
//! What a scheme reads is read in spans of up to [`READ_SPAN_BYTES`] of a file, four spans
//! at a time, every part's crc32c checked before a byte of it is written, in one of two forms:
//! - streamed, when a column per local row of the tables restored takes at most
//!   [`STREAM_MAP_BYTES`] (a million rows): each span is written as it arrives, beside the
//!   reads still running, and the column map decides which copy of a row wins;
//! - read whole (a rectangle of up to [`IN_MEMORY_RECTANGLE_BYTES`] on a larger shard), then
//!   written table by table, newest column first: a row's first copy is then its newest, and
//!   the only bookkeeping is one bit per local row (a 3-million-row shard's bitset is 384 KB,
//!   cache-resident, where its column map, 12 MB, is a cache miss a row).
//!
//! A rectangle larger than that streams whatever the map costs (bounded memory). Rows go to the
//! shard in runs straight from the read buffer either way (the profiles this came from, on
//! earlier forms of the benchmark, are summed up in `docs/BENCHMARKS.md`, IncrCP, History).
//!
//! A state saved by a different number of servers than the writer's shard map has (an elastic
//! restore) is re-sharded: the base re-shards itself ([`deck::restore_chain`]); then each saved
//! server's pieces are replayed exactly as that server would replay them, through a writer that
//! keeps the rows the new shard map gives the writer's server and the dense blocks of its range.
//! Every row lives on one saved server, so replaying the saved servers one after the other
//! keeps each row's newest copy. Such a restore continues no chunk list (the next save must be
//! a full).

use std::collections::HashMap;
use std::time::Instant;

use ftrec_core::{RowId, RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK};
use futures_util::StreamExt;

use super::extract::ROWS_PAYLOAD;
use super::list::{ChunkList, LivePart};
use super::read::{read_parts, PartData, ReadStats};
use crate::checkpoint::{Checkpoints, VerifiedFile};
use crate::deck::{self, Lineage, RestoreAt, ShardWriter};
use crate::error::{CkptError, Result};
use crate::format::{
    copy_le_into_f32s, CheckpointId, CheckpointKind, ChunkOp, FileContent, FileRef, Manifest, Part,
    PieceIndex, PieceScheme, ShardInfo,
};

/// The manifests a restore needs.
#[derive(Debug, Clone)]
pub struct IncrChain {
    pub base: Manifest,
    /// Pieces of the list, oldest first. For a chunk list these run to the list's newest piece
    /// (its later extraction rounds moved the target's rows); for the others, to the target.
    pub pieces: Vec<Manifest>,
    /// The column to restore: 0 for the base itself.
    pub target: u32,
    pub scheme: Option<PieceScheme>,
}

impl IncrChain {
    /// The manifest of the state restored.
    pub fn target_manifest(&self) -> &Manifest {
        match self.target {
            0 => &self.base,
            c => self
                .pieces
                .iter()
                .find(|m| column_of(m) == Some(c))
                .unwrap_or(&self.base),
        }
    }
}

fn column_of(m: &Manifest) -> Option<u32> {
    m.pieces().next().map(|(_, _, c)| c)
}

fn no_ckpt(ckpts: &Checkpoints) -> CkptError {
    CkptError::NoCheckpoint {
        root: format!("{} store", ckpts.store().backend()),
    }
}

/// Whether any checkpoint of the store is an incremental piece.
pub async fn is_incremental_store(ckpts: &Checkpoints) -> Result<bool> {
    for id in ckpts.list_checkpoints().await?.into_iter().rev() {
        if let Ok(m) = ckpts.read_manifest(&id, None).await {
            if m.piece_scheme().is_some() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The manifests that rebuild the state `at` names.
pub async fn select(ckpts: &Checkpoints, at: &RestoreAt) -> Result<IncrChain> {
    let lineage = Lineage::load(ckpts).await?;
    let target = match at {
        RestoreAt::Current => lineage.head().ok_or_else(|| no_ckpt(ckpts))?,
        RestoreAt::Id(id) => id.clone(),
        RestoreAt::Step(s) => lineage.state_at_or_before(*s).ok_or_else(|| {
            CkptError::InvalidArgument(format!("no checkpoint at or before step {s}"))
        })?,
    };
    select_in(ckpts, &lineage, &target).await
}

async fn select_in(
    ckpts: &Checkpoints,
    lineage: &Lineage,
    target: &CheckpointId,
) -> Result<IncrChain> {
    let ids = lineage.resolve(target)?;
    let mut ms = Vec::with_capacity(ids.len());
    for id in &ids {
        ms.push(ckpts.read_manifest(id, None).await?);
    }
    let base = ms.remove(0);
    if base.kind != CheckpointKind::Full {
        return Err(CkptError::InvalidCheckpoint {
            id: base.id.to_string(),
            reason: "an incremental list must start with a full checkpoint".into(),
        });
    }
    let scheme = ms.last().and_then(|m| m.piece_scheme());
    let target_col = match ms.last() {
        None => 0,
        Some(m) => column_of(m).ok_or_else(|| CkptError::InvalidCheckpoint {
            id: m.id.to_string(),
            reason: "is not an incremental piece (a DECK delta? restore it with ftrec_ckpt::deck)"
                .into(),
        })?,
    };
    // The chain must be one scheme, with the columns the scheme implies.
    for (i, m) in ms.iter().enumerate() {
        let (s, c) = (m.piece_scheme(), column_of(m));
        let want = match scheme {
            Some(PieceScheme::Differential) => Some(target_col),
            _ => Some(i as u32 + 1),
        };
        if s != scheme || c != want {
            return Err(CkptError::InvalidCheckpoint {
                id: m.id.to_string(),
                reason: format!(
                    "piece {:?} column {c:?} in a chain of {:?} pieces (expected column {want:?})",
                    s.map(|s| s.name()),
                    scheme.map(|s| s.name())
                ),
            });
        }
    }
    if scheme == Some(PieceScheme::ChunkList) {
        // Later pieces of the same list: the newest child, repeatedly.
        let mut last = target.clone();
        loop {
            let child = lineage
                .nodes()
                .filter(|n| n.parent.as_ref() == Some(&last) && n.kind == CheckpointKind::Delta)
                .max_by(|a, b| (a.step, &a.id).cmp(&(b.step, &b.id)));
            let Some(child) = child else { break };
            let m = ckpts.read_manifest(&child.id, None).await?;
            if m.piece_scheme() != scheme || column_of(&m) != Some(ms.len() as u32 + 1) {
                break;
            }
            last = m.id.clone();
            ms.push(m);
        }
    }
    Ok(IncrChain {
        base,
        pieces: ms,
        target: target_col,
        scheme,
    })
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreOutcome {
    /// Seconds restoring the base, and the rest.
    pub base_s: f64,
    pub chain_s: f64,
    /// Files and bytes read beyond the base.
    pub files: u64,
    pub bytes: u64,
    /// Rows written beyond the base.
    pub rows_written: u64,
    /// Of `chain_s`: reading (and folding) the piece indexes.
    pub index_s: f64,
    /// Of `chain_s`: waiting for files (or a chunk list's spans) to arrive, read and checked,
    /// and decoding and writing their rows into the shard (a chunk list's column map or bitset
    /// included).
    pub read_wait_s: f64,
    pub apply_s: f64,
    pub base_bytes: u64,
    /// A chunk list restored at its newest column: the list, Bloom filters rebuilt, ready to
    /// grow.
    pub list: Option<ChunkList>,
    /// A differential: the rows it holds (every row touched since the base), per table.
    pub since_base: Option<Vec<(TableId, Vec<RowId>)>>,
    /// A chunk list restored at its newest column: the ids of each row-0 chunk
    /// `(table, range, column)`, for its Bloom filter.
    pub row0_ids: Vec<((u32, u32, u32), Vec<RowId>)>,
}

fn server_map(base: &Manifest) -> Result<ShardMap> {
    ShardMap::new(base.shards.len().max(1) as u32).map_err(|e| CkptError::InvalidCheckpoint {
        id: base.id.to_string(),
        reason: format!("shard map: {e}"),
    })
}

/// Restore `writer`'s server to the state `chain` names.
pub async fn restore_server(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
) -> Result<RestoreOutcome> {
    restore_server_with(ckpts, chain, writer, RestoreOptions::default()).await
}

/// [`restore_server`] with `opts`.
pub async fn restore_server_with(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
    opts: RestoreOptions,
) -> Result<RestoreOutcome> {
    if let Some(map) = writer.shard_map() {
        if map.servers() as usize != chain.base.shards.len() {
            return restore_resharded(ckpts, chain, writer, map, opts).await;
        }
    }
    let server = writer.server();
    let mut out = restore_base(ckpts, chain, writer).await?;
    if chain.target == 0 {
        return Ok(out);
    }
    let t1 = Instant::now();
    let target = chain.target_manifest().clone();
    match chain.scheme {
        Some(PieceScheme::ChunkList) => restore_list(ckpts, chain, writer, &mut out, opts).await?,
        Some(PieceScheme::Differential) => {
            let mut ids = Vec::new();
            restore_rows(ckpts, chain, writer, &mut out, opts, Some(&mut ids)).await?;
            out.since_base = Some(ids);
        }
        _ => restore_rows(ckpts, chain, writer, &mut out, opts, None).await?,
    }
    apply_dense(ckpts, &target, server, writer, &mut out).await?;
    out.chain_s = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// The chain's base (a full, restored as DECK restores one), timed.
async fn restore_base(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
) -> Result<RestoreOutcome> {
    let t0 = Instant::now();
    let stats = deck::restore_chain(ckpts, std::slice::from_ref(&chain.base), writer).await?;
    Ok(RestoreOutcome {
        base_s: t0.elapsed().as_secs_f64(),
        base_bytes: stats.bytes_read,
        ..Default::default()
    })
}

/// [`restore_server`] of a state saved by a different number of servers than `map` has.
async fn restore_resharded(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
    map: ShardMap,
    opts: RestoreOptions,
) -> Result<RestoreOutcome> {
    // The base re-shards itself and checks that the writer's shard came back whole.
    let mut out = restore_base(ckpts, chain, writer).await?;
    if chain.target == 0 {
        return Ok(out);
    }
    let t1 = Instant::now();
    let target = chain.target_manifest().clone();
    let want_dense = writer.dense_shape().map_or(0, |(_, values, _)| {
        (values as usize).div_ceil(DENSE_BLOCK) as u64
    });
    let mut dense_blocks = 0;
    for shard in &chain.base.shards {
        let mut w = AsSavedServer::new(&mut *writer, map, shard);
        match chain.scheme {
            Some(PieceScheme::ChunkList) => {
                restore_list(ckpts, chain, &mut w, &mut out, opts).await?
            }
            _ => restore_rows(ckpts, chain, &mut w, &mut out, opts, None).await?,
        }
        apply_dense(ckpts, &target, shard.server, &mut w, &mut out).await?;
        dense_blocks += w.dense_blocks;
    }
    // Every piece writes its server's whole dense range, so the target covers the writer's.
    if dense_blocks != want_dense {
        return Err(CkptError::InvalidCheckpoint {
            id: target.id.to_string(),
            reason: format!(
                "re-sharding gave server {} {dense_blocks} dense blocks, its range has {want_dense}",
                writer.server().0
            ),
        });
    }
    // The saved servers' lists are no list of this cluster's servers: nothing continues them.
    out.list = None;
    out.row0_ids.clear();
    out.since_base = None;
    out.chain_s = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// A writer that stands for saved server `shard.server` (its shapes, as the base recorded
/// them) and passes on what the shard map `map` gives the inner writer's server: its rows, and
/// the dense blocks of its range.
struct AsSavedServer<'a> {
    inner: &'a mut dyn ShardWriter,
    map: ShardMap,
    me: ServerId,
    shard: &'a ShardInfo,
    ids: Vec<RowId>,
    words: Vec<f32>,
    dense_blocks: u64,
}

impl<'a> AsSavedServer<'a> {
    fn new(inner: &'a mut dyn ShardWriter, map: ShardMap, shard: &'a ShardInfo) -> Self {
        let me = inner.server();
        AsSavedServer {
            inner,
            map,
            me,
            shard,
            ids: Vec::new(),
            words: Vec::new(),
            dense_blocks: 0,
        }
    }
}

impl ShardWriter for AsSavedServer<'_> {
    fn server(&self) -> ServerId {
        self.shard.server
    }

    fn table_shape(&self, table: TableId) -> Option<(u64, RowLayout)> {
        self.shard
            .tables
            .iter()
            .find(|t| t.table == table)
            .map(|t| (t.rows, t.layout))
    }

    fn write_rows(&mut self, table: TableId, ids: &[RowId], words: &[f32]) -> Result<()> {
        let w = if ids.is_empty() {
            return Ok(());
        } else {
            words.len() / ids.len()
        };
        self.ids.clear();
        self.words.clear();
        for (i, &id) in ids.iter().enumerate() {
            if self.map.owner(table, id) == self.me {
                self.ids.push(id);
                self.words.extend_from_slice(&words[i * w..(i + 1) * w]);
            }
        }
        if self.ids.is_empty() {
            return Ok(());
        }
        self.inner.write_rows(table, &self.ids, &self.words)
    }

    fn dense_shape(&self) -> Option<(u64, u64, u32)> {
        self.shard
            .dense
            .map(|d| (d.first_block, d.values, d.state_per_block))
    }

    fn write_dense(&mut self, first_block: u64, values: &[f32], state: &[f32]) -> Result<()> {
        let Some((t_first, t_values, t_spb)) = self.inner.dense_shape() else {
            return Ok(());
        };
        let blocks = values.len().div_ceil(DENSE_BLOCK) as u64;
        let spb = if blocks == 0 {
            return Ok(());
        } else {
            state.len() / blocks as usize
        };
        if spb != t_spb as usize {
            return Err(CkptError::InvalidArgument(format!(
                "dense blocks with {spb} state words per block, the target has {t_spb}"
            )));
        }
        let t_end = t_first + (t_values as usize).div_ceil(DENSE_BLOCK) as u64;
        let (lo, hi) = (first_block.max(t_first), (first_block + blocks).min(t_end));
        if lo >= hi {
            return Ok(());
        }
        let (b0, b1) = ((lo - first_block) as usize, (hi - first_block) as usize);
        let v1 = (b1 * DENSE_BLOCK).min(values.len());
        let v0 = (b0 * DENSE_BLOCK).min(v1);
        self.inner
            .write_dense(lo, &values[v0..v1], &state[b0 * spb..b1 * spb])?;
        self.dense_blocks += hi - lo;
        Ok(())
    }
}

/// The pieces over the base of a naive incremental or Check-N-Run restore (every piece up to
/// the target, or the target differential), through the engine every scheme shares
/// ([`read_and_write`]); quantized differentials are decoded row by row instead. With `ids`,
/// also collect the rows restored, per table.
async fn restore_rows(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
    out: &mut RestoreOutcome,
    opts: RestoreOptions,
    mut ids: Option<&mut Vec<(TableId, Vec<RowId>)>>,
) -> Result<()> {
    let pieces: Vec<(&Manifest, u32)> = match chain.scheme {
        Some(PieceScheme::Differential) => vec![(chain.target_manifest(), chain.target)],
        // `select` checked that piece i holds column i + 1.
        _ => chain
            .pieces
            .iter()
            .take(chain.target as usize)
            .zip(1..)
            .collect(),
    };
    match row_file_reads(&pieces, &*writer)? {
        Some(files) => {
            let got =
                read_and_write(ckpts, &chain.base, files, writer, out, opts, ids.is_some()).await?;
            if let Some(ids) = ids {
                let mut by_table: std::collections::BTreeMap<u32, Vec<RowId>> = Default::default();
                for ((table, _, _), v) in got {
                    by_table.entry(table).or_default().extend(v);
                }
                ids.clear();
                for (t, mut v) in by_table {
                    v.sort_unstable();
                    v.dedup();
                    ids.push((TableId(t), v));
                }
            }
        }
        None => {
            for (m, _) in pieces {
                apply_rows(ckpts, m, writer, out, ids.as_deref_mut()).await?;
            }
        }
    }
    Ok(())
}

/// Write every row file of `m` of the writer's server (quantized ones dequantized); with
/// `ids`, also collect the ids per table.
async fn apply_rows(
    ckpts: &Checkpoints,
    m: &Manifest,
    writer: &mut dyn ShardWriter,
    out: &mut RestoreOutcome,
    mut ids: Option<&mut Vec<(TableId, Vec<RowId>)>>,
) -> Result<()> {
    let server = writer.server();
    let files: Vec<_> = m
        .files_of(server)
        .filter(|f| {
            matches!(
                f.content,
                FileContent::Rows { .. } | FileContent::QuantRows { .. }
            )
        })
        .cloned()
        .collect();
    let mut stream = futures_util::stream::iter(files)
        .map(|f| {
            let ckpts = ckpts.clone();
            let id = m.id.clone();
            async move {
                let key = ckpts.file_key(&id, &f.path)?;
                let data = ckpts.store().get(&key).await?;
                Checkpoints::verify_file(&key, &f, &data)?;
                Ok::<_, CkptError>((f, key, data))
            }
        })
        .buffered(4);
    let mut words = Vec::new();
    let mut batch: Vec<RowId> = Vec::new();
    loop {
        let tw = Instant::now();
        let Some(r) = stream.next().await else { break };
        out.read_wait_s += tw.elapsed().as_secs_f64();
        let ta = Instant::now();
        let (f, key, data) = r?;
        out.files += 1;
        out.bytes += data.len() as u64;
        let (table, n) = match Checkpoints::decode_verified(&key, &f, &data)? {
            VerifiedFile::Rows(c) => {
                let n = c.len();
                words.resize(n * c.header.layout.words(), 0.0);
                c.copy_rows(0, n, &mut words);
                batch.clear();
                batch.extend(c.ids());
                (c.header.table, n)
            }
            VerifiedFile::QuantRows(c) => {
                let n = c.len();
                let w = c.header.layout.words();
                words.resize(n * w, 0.0);
                for i in 0..n {
                    c.dequantize_row(i, &mut words[i * w..(i + 1) * w]);
                }
                batch.clear();
                batch.extend(c.ids());
                (c.header.table, n)
            }
            _ => continue,
        };
        writer.write_rows(table, &batch, &words)?;
        out.rows_written += n as u64;
        if let Some(ids) = ids.as_deref_mut() {
            match ids.iter_mut().find(|(t, _)| *t == table) {
                Some((_, v)) => v.extend_from_slice(&batch),
                None => ids.push((table, batch.clone())),
            }
        }
        out.apply_s += ta.elapsed().as_secs_f64();
    }
    if let Some(ids) = ids {
        ids.sort_by_key(|(t, _)| *t);
        for (_, v) in ids.iter_mut() {
            v.sort_unstable();
            v.dedup();
        }
    }
    Ok(())
}

/// The dense range of `m` for `server`.
async fn apply_dense(
    ckpts: &Checkpoints,
    m: &Manifest,
    server: ServerId,
    writer: &mut dyn ShardWriter,
    out: &mut RestoreOutcome,
) -> Result<()> {
    let files: Vec<_> = m
        .files_of(server)
        .filter(|f| matches!(f.content, FileContent::Dense { .. }))
        .cloned()
        .collect();
    for f in files {
        let key = ckpts.file_key(&m.id, &f.path)?;
        let data = ckpts.store().get(&key).await?;
        if let VerifiedFile::Dense(c) = Checkpoints::verify_file(&key, &f, &data)? {
            let mut values = vec![0.0; c.header.values as usize];
            let mut state = vec![0.0; (c.header.blocks * c.header.state_per_block as u64) as usize];
            c.copy_values(&mut values);
            c.copy_state(&mut state);
            writer.write_dense(c.header.first_block, &values, &state)?;
        }
        out.files += 1;
        out.bytes += data.len() as u64;
    }
    Ok(())
}

/// The piece indexes of `server` in `pieces`, oldest first.
pub async fn read_piece_indexes(
    ckpts: &Checkpoints,
    pieces: &[Manifest],
    server: ServerId,
) -> Result<Vec<(CheckpointId, String, PieceIndex)>> {
    let jobs: Vec<_> = pieces
        .iter()
        .map(|m| {
            let f = m
                .pieces()
                .find(|(f, _, _)| f.content.server() == server)
                .map(|(f, _, _)| f.clone());
            (m.id.clone(), f)
        })
        .collect();
    let mut stream = futures_util::stream::iter(jobs)
        .map(|(id, f)| {
            let ckpts = ckpts.clone();
            async move {
                let f = f.ok_or_else(|| CkptError::InvalidCheckpoint {
                    id: id.to_string(),
                    reason: format!("has no piece index of server {}", server.0),
                })?;
                let key = ckpts.file_key(&id, &f.path)?;
                let data = ckpts.store().get(&key).await?;
                match Checkpoints::verify_file(&key, &f, &data)? {
                    VerifiedFile::PieceIndex(p) => Ok((id, key.to_string(), *p)),
                    _ => Err(CkptError::Corrupt {
                        file: key.to_string(),
                        reason: "listed as a piece index, holds something else".into(),
                    }),
                }
            }
        })
        .buffered(8);
    let mut out = Vec::with_capacity(pieces.len());
    while let Some(r) = stream.next().await {
        out.push(r?);
    }
    Ok(out)
}

/// Fold the chunk list of `server` from `chain`'s pieces.
pub async fn fold_list(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    server: ServerId,
) -> Result<ChunkList> {
    let indexes = read_piece_indexes(ckpts, &chain.pieces, server).await?;
    let range_rows = indexes.first().map_or(0, |(_, _, p)| p.range_rows);
    let mut list = ChunkList::new(
        chain.base.id.clone(),
        server,
        server_map(&chain.base)?,
        range_rows,
    );
    for (id, name, p) in &indexes {
        list.apply(id, p, name)?;
    }
    Ok(list)
}

/// The part of `server`'s chunk list that restoring `chain.target` needs, from the piece
/// indexes of the pieces after the target only (and the newest's, for the newest state):
/// row 0 as the newest index lists it whole, and the extracted chunks of the rounds after the
/// target that come from its columns. Its rectangle of the target is the rectangle of the
/// list folded from every piece ([`fold_list`]), chunk for chunk: the rectangle of column `i`
/// is the row-0 chunks of columns `<= i` and the extracted chunks of columns `<= i` from rounds
/// `> i` (IncrCP §4.2); an extracted chunk never changes once its round made it, and a round
/// `r` is committed by the index of piece `r` or `r + 1` (a background round: `chain`'s module
/// doc), so the indexes after `i` hold every one of them. An older state's restore thus reads
/// `L - i` indexes instead of `L`. The list is for that one restore: it knows nothing deeper
/// that the target does not read, so it must not be grown or garbage-collected from.
pub async fn rectangle_list(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    server: ServerId,
) -> Result<ChunkList> {
    let col = chain.target;
    let map = server_map(&chain.base)?;
    let after = &chain.pieces[(col as usize).min(chain.pieces.len().saturating_sub(1))..];
    let indexes = read_piece_indexes(ckpts, after, server).await?;
    let (_, name, newest) = indexes.last().ok_or_else(|| CkptError::InvalidCheckpoint {
        id: chain.base.id.to_string(),
        reason: format!("no piece index of server {} to restore from", server.0),
    })?;
    let columns = chain.pieces.iter().map(|m| m.id.clone()).collect();
    let mut list = ChunkList::from_row0(chain.base.id.clone(), server, map, columns, newest, name)?;
    for (_, name, p) in &indexes {
        if p.column <= col {
            continue;
        }
        let mut fmap: Vec<Option<u32>> = vec![None; p.files.len()];
        for r in p
            .chunks
            .iter()
            .filter(|r| r.op == ChunkOp::Extracted && r.round > col && r.col <= col)
        {
            list.add_extracted(r, &p.files, &mut fmap, name)?;
        }
    }
    Ok(list)
}

/// Where the rows of one table sit on this server: local index `id / n` for ids `≡ residue
/// (mod n)`, the division a shift when `n` is a power of two (one server: none at all).
#[derive(Debug, Clone, Copy)]
struct Placement {
    n: u64,
    shift: Option<u32>,
    residue: u64,
}

impl Placement {
    fn new(map: &ShardMap, table: TableId, server: ServerId) -> Placement {
        let n = map.servers().max(1) as u64;
        Placement {
            n,
            shift: n.is_power_of_two().then(|| n.trailing_zeros()),
            residue: map.global_row(table, server, 0) % n,
        }
    }

    /// The local index of global row `id`, if this server holds it.
    #[inline]
    fn local(&self, id: RowId) -> Option<u64> {
        let (q, r) = match self.shift {
            Some(s) => (id >> s, id & (self.n - 1)),
            None => (id / self.n, id % self.n),
        };
        (r == self.residue).then_some(q)
    }
}

/// A rectangle of at most this many bytes is read whole before a row of it is written, then
/// written table by table, newest column first (each row's first copy is its newest; a bitset
/// of the rows written is all the bookkeeping). A larger one streams: each file is written as it
/// arrives, and a column per row decides which copy wins (bounded memory, more per row).
pub const IN_MEMORY_RECTANGLE_BYTES: u64 = 1 << 30;

/// A chunk list's restore streams (writes each span as it arrives, a column per local row
/// deciding which copy wins) when that column map is at most this many bytes: it then stays
/// cached, and the writes run beside the reads. A larger map is a cache miss a row, and the
/// rectangle is read whole first (up to [`IN_MEMORY_RECTANGLE_BYTES`]). 4 MiB is a million
/// rows (both figures came from profiles of an earlier form of the benchmark).
pub const STREAM_MAP_BYTES: u64 = 4 << 20;

/// How [`restore_server_with`] restores a chunk list.
#[derive(Debug, Clone, Copy)]
pub struct RestoreOptions {
    /// See [`IN_MEMORY_RECTANGLE_BYTES`] (0: always stream).
    pub in_memory_bytes: u64,
    /// See [`STREAM_MAP_BYTES`] (0: read whole whenever the rectangle fits in memory).
    pub stream_map_bytes: u64,
    /// See [`READ_SPAN_BYTES`] (1: every part read on its own).
    pub read_span_bytes: u64,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            in_memory_bytes: IN_MEMORY_RECTANGLE_BYTES,
            stream_map_bytes: STREAM_MAP_BYTES,
            read_span_bytes: READ_SPAN_BYTES,
        }
    }
}

/// One table of the shard being restored: its placement and row width, and which local rows
/// were written so far: the newest column that wrote each (streaming; 0: the base) or one bit
/// each (newest column first).
struct Target {
    place: Placement,
    words: usize,
    rows: usize,
    newest: Vec<u32>,
    written: Vec<u64>,
}

/// What the rectangle reads of one file: each part, and its chunk's (table, range, column,
/// round).
type Read = (LivePart, u32, u32, u32, u32);

/// Files and the parts read from each.
type FileReads = Vec<(FileRef, Vec<Read>)>;

/// The target of `table` (created on first use, its shapes checked against the part's).
#[allow(clippy::too_many_arguments)]
fn target_of<'a>(
    targets: &'a mut HashMap<u32, Target>,
    writer: &dyn ShardWriter,
    map: &ShardMap,
    base: &Manifest,
    table: u32,
    p: &LivePart,
    d: &PartData,
    file: &dyn Fn() -> String,
    bitset: bool,
) -> Result<&'a mut Target> {
    let server = writer.server();
    let t = match targets.entry(table) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let tid = TableId(table);
            let (rows, layout) = writer.table_shape(tid).ok_or_else(|| {
                CkptError::InvalidArgument(format!(
                    "server {} holds no table {table} to restore into",
                    server.0
                ))
            })?;
            if layout.bytes() != p.row_bytes as usize {
                return Err(CkptError::InvalidCheckpoint {
                    id: base.id.to_string(),
                    reason: format!(
                        "table {table}: rows of {} bytes saved, the target's are {}",
                        p.row_bytes,
                        layout.bytes()
                    ),
                });
            }
            let (newest, written) = if bitset {
                (Vec::new(), vec![0u64; (rows as usize).div_ceil(64)])
            } else {
                (vec![0u32; rows as usize], Vec::new())
            };
            e.insert(Target {
                place: Placement::new(map, tid, server),
                words: layout.words(),
                rows: rows as usize,
                newest,
                written,
            })
        }
    };
    if d.row_bytes() != t.words * 4 {
        return Err(CkptError::Corrupt {
            file: file(),
            reason: format!(
                "a part of table {table} has rows of {} bytes, the table's are {}",
                d.row_bytes(),
                t.words * 4
            ),
        });
    }
    Ok(t)
}

/// Write the rows of part `d` (table `table`, column `col`) that `t` does not already hold from
/// a newer column, in runs straight from the read buffer. `bitset`: parts arrive newest column
/// first, so a row already written is never overwritten.
#[allow(clippy::too_many_arguments)]
fn write_part(
    writer: &mut dyn ShardWriter,
    t: &mut Target,
    table: u32,
    col: u32,
    d: &PartData,
    bitset: bool,
    file: &dyn Fn() -> String,
    bufs: &mut (Vec<RowId>, Vec<f32>),
    out: &mut RestoreOutcome,
) -> Result<()> {
    let server = writer.server();
    let tid = TableId(table);
    let ids = le_u64s(d.id_bytes(), &mut bufs.0);
    let words = le_f32s(d.rows(), &mut bufs.1);
    let w = t.words;
    let outside = |id: RowId| CkptError::Corrupt {
        file: file(),
        reason: format!(
            "row {id} of table {table} is outside server {}'s shard",
            server.0
        ),
    };
    let mut run = 0;
    for (i, &id) in ids.iter().enumerate() {
        let local = match t.place.local(id) {
            Some(l) if (l as usize) < t.rows => l as usize,
            _ => return Err(outside(id)),
        };
        let fresh = if bitset {
            let word = &mut t.written[local / 64];
            let bit = 1u64 << (local % 64);
            let fresh = *word & bit == 0;
            *word |= bit;
            fresh
        } else {
            let slot = &mut t.newest[local];
            let fresh = *slot < col;
            if fresh {
                *slot = col;
            }
            fresh
        };
        if !fresh {
            if run < i {
                writer.write_rows(tid, &ids[run..i], &words[run * w..i * w])?;
                out.rows_written += (i - run) as u64;
            }
            run = i + 1;
        }
    }
    if run < ids.len() {
        writer.write_rows(tid, &ids[run..], &words[run * w..])?;
        out.rows_written += (ids.len() - run) as u64;
    }
    Ok(())
}

async fn restore_list(
    ckpts: &Checkpoints,
    chain: &IncrChain,
    writer: &mut dyn ShardWriter,
    out: &mut RestoreOutcome,
    opts: RestoreOptions,
) -> Result<()> {
    let server = writer.server();
    let col = chain.target;
    let newest = col as usize == chain.pieces.len();
    let t_index = Instant::now();
    // Row 0 as the newest piece index lists it, and for an older state the extracted chunks
    // of later rounds: the indexes of the pieces after the target, not of every piece.
    let read = chain.pieces.len() - col as usize;
    out.files += read.max(1) as u64;
    let list = rectangle_list(ckpts, chain, server).await?;
    out.index_s = t_index.elapsed().as_secs_f64();
    // Which parts of which files the rectangle reads, and each part's chunk (for Bloom
    // filters of row-0 chunks when the list will grow again).
    let mut by_file: HashMap<u32, Vec<Read>> = HashMap::new();
    for c in list.rectangle(col) {
        for p in &c.parts {
            by_file
                .entry(p.file)
                .or_default()
                .push((*p, c.table, c.range, c.col, c.round));
        }
    }
    let files: FileReads = by_file
        .into_iter()
        .map(|(f, reads)| (list.file(f).file.clone(), reads))
        .collect();
    let row0_ids = read_and_write(ckpts, &chain.base, files, writer, out, opts, newest).await?;
    if newest {
        // The Bloom filters are built later, by the next extraction round that needs them
        // (off the recovery's critical path): keep the ids.
        out.row0_ids = row0_ids.into_iter().collect();
        out.list = Some(list);
    }
    Ok(())
}

/// The reads of the plain row files of `pieces` (the writer's server), each file's whole
/// payload one part of column `col` (the piece's), checked against the payload checksum its
/// manifest records: the reads of a naive incremental or Check-N-Run restore. `None` when a
/// piece holds quantized rows (decoded by [`apply_rows`] instead).
fn row_file_reads(
    pieces: &[(&Manifest, u32)],
    writer: &dyn ShardWriter,
) -> Result<Option<FileReads>> {
    let server = writer.server();
    let mut out = Vec::new();
    for (m, col) in pieces {
        for f in m.files_of(server) {
            let (table, rows) = match f.content {
                FileContent::Rows { table, rows, .. } => (table, rows),
                FileContent::QuantRows { .. } => return Ok(None),
                _ => continue,
            };
            let (_, layout) =
                writer
                    .table_shape(table)
                    .ok_or_else(|| CkptError::InvalidCheckpoint {
                        id: m.id.to_string(),
                        reason: format!(
                            "file {} holds rows of table {}, which server {} does not have",
                            f.path, table.0, server.0
                        ),
                    })?;
            let rb = layout.bytes() as u64;
            // Frame prefix and header (64 bytes), ids, rows, payload checksum (4 bytes).
            let want = rows
                .checked_mul(8 + rb)
                .and_then(|p| p.checked_add(ROWS_PAYLOAD + 4));
            if want != Some(f.size) {
                return Err(CkptError::InvalidCheckpoint {
                    id: m.id.to_string(),
                    reason: format!(
                        "file {} of {} rows of {rb} bytes has {} bytes",
                        f.path, rows, f.size
                    ),
                });
            }
            let part = Part {
                file: 0,
                section: 0,
                lo: 0,
                hi: rows,
                ids_at: ROWS_PAYLOAD,
                rows_at: ROWS_PAYLOAD + 8 * rows,
                row_bytes: rb as u32,
                // The payload is the ids then the rows: its checksum is the part's.
                crc: f.crc32c.payload,
            };
            let file = FileRef {
                ckpt: m.id.clone(),
                path: f.path.clone(),
                size: f.size,
                crc32c: f.crc32c,
            };
            out.push((file, vec![(part, table.0, 0, *col, 0)]));
        }
    }
    Ok(Some(out))
}

/// The restore engine every scheme shares: read `files` (each with the parts wanted from it)
/// in spans of up to [`READ_SPAN_BYTES`], four at a time, every part's crc32c checked before a
/// byte of it is written, and write each row's copy of the newest column once, straight from
/// the read buffer. Only what a scheme reads differs (naive incremental: every piece's row
/// files; Check-N-Run: the target's; IncrCP: the target's rectangle). With `collect`, returns
/// the ids of every part of round 0, by `(table, range, column)`.
async fn read_and_write(
    ckpts: &Checkpoints,
    base: &Manifest,
    files: FileReads,
    writer: &mut dyn ShardWriter,
    out: &mut RestoreOutcome,
    opts: RestoreOptions,
    collect: bool,
) -> Result<HashMap<(u32, u32, u32), Vec<RowId>>> {
    let map = server_map(base)?;
    let mut rect_bytes = 0u64;
    let mut tables = std::collections::BTreeSet::new();
    for (_, reads) in &files {
        for r in reads {
            tables.insert(r.1);
            rect_bytes = rect_bytes.saturating_add(r.0.bytes());
        }
    }
    // Streaming needs a column per local row of the tables restored: cheap while that map is
    // small enough to stay cached, and then the writes run beside the reads; a larger map
    // costs a miss a row, and the rectangle is read whole and written newest column first.
    let map_bytes: u64 = tables
        .iter()
        .filter_map(|&t| writer.table_shape(TableId(t)))
        .map(|(rows, _)| rows.saturating_mul(4))
        .sum();
    let in_memory = rect_bytes <= opts.in_memory_bytes && map_bytes > opts.stream_map_bytes;
    // A large file is read in spans of about READ_SPAN_BYTES, several at a time: the reads
    // then run beside each other and beside the writes, and each span's buffer is freed (and
    // its pages reused) once written.
    let mut jobs: Vec<(FileRef, Vec<Read>)> = Vec::new();
    out.files += files.len() as u64;
    for (f, mut reads) in files {
        reads.sort_unstable_by_key(|r| r.0.ids_at.min(r.0.rows_at));
        let mut group: Vec<Read> = Vec::new();
        let mut start = 0u64;
        for r in reads {
            let (lo, hi) = part_extent(&r.0);
            if !group.is_empty() && hi.saturating_sub(start) > opts.read_span_bytes {
                jobs.push((f.clone(), std::mem::take(&mut group)));
            }
            if group.is_empty() {
                start = lo;
            }
            group.push(r);
        }
        if !group.is_empty() {
            jobs.push((f, group));
        }
    }
    // Newest columns first: streaming, a row's first copy is then usually its newest and older
    // copies (of older pieces, or left by skipped extractions, §4.3) are skipped rather than
    // written and overwritten.
    jobs.sort_by(|(fa, ra), (fb, rb)| {
        let key = |f: &FileRef, r: &[Read]| {
            (
                std::cmp::Reverse(r.iter().map(|r| r.3).max().unwrap_or(0)),
                (f.ckpt.to_string(), f.path.clone()),
                r.first().map_or(0, |r| r.0.ids_at),
            )
        };
        key(fa, ra).cmp(&key(fb, rb))
    });
    // Each span is read (four at a time, on the store's blocking threads), and every part's
    // crc32c checked before a byte of it is written.
    let mut stream = futures_util::stream::iter(jobs)
        .map(|(f, reads)| {
            let ckpts = ckpts.clone();
            async move {
                let parts: Vec<LivePart> = reads.iter().map(|r| r.0).collect();
                let mut st = ReadStats::default();
                let data = read_parts(&ckpts, &f, &parts, &mut st).await?;
                Ok::<_, CkptError>((f, reads, data, st))
            }
        })
        .buffered(4);
    let mut targets: HashMap<u32, Target> = HashMap::new();
    let mut row0_ids: HashMap<(u32, u32, u32), Vec<RowId>> = HashMap::new();
    // Scratch for parts whose bytes are not aligned for a zero-copy view (or a big-endian host).
    let mut bufs: (Vec<RowId>, Vec<f32>) = (Vec::new(), Vec::new());
    let mut loaded = Vec::new();
    loop {
        let tw = Instant::now();
        let Some(r) = stream.next().await else { break };
        out.read_wait_s += tw.elapsed().as_secs_f64();
        let ta = Instant::now();
        let (f, reads, data, st) = r?;
        out.bytes += st.bytes;
        if collect {
            for ((_, table, range, ccol, round), d) in reads.iter().zip(&data) {
                if *round == 0 {
                    row0_ids
                        .entry((*table, *range, *ccol))
                        .or_default()
                        .extend_from_slice(le_u64s(d.id_bytes(), &mut bufs.0));
                }
            }
        }
        if in_memory {
            loaded.push((f, reads, data));
            continue;
        }
        // Streaming: rows whose newest column so far is older than this part's are written; a
        // row a newer column already wrote is skipped (the newest copy wins whatever order
        // the files arrive in).
        let name = || format!("{}/{}", f.ckpt, f.path);
        for ((p, table, _, ccol, _), d) in reads.into_iter().zip(data) {
            let t = target_of(
                &mut targets,
                &*writer,
                &map,
                base,
                table,
                &p,
                &d,
                &name,
                false,
            )?;
            write_part(writer, t, table, ccol, &d, false, &name, &mut bufs, out)?;
        }
        out.apply_s += ta.elapsed().as_secs_f64();
    }
    if in_memory {
        // Table by table, newest column first: a row's first copy is its newest, so a row is
        // written once, and only if no newer column wrote it.
        let ta = Instant::now();
        let mut order: Vec<(u32, u32, usize, usize)> = Vec::new();
        for (fi, (_, reads, _)) in loaded.iter().enumerate() {
            for (pi, r) in reads.iter().enumerate() {
                order.push((r.1, r.3, fi, pi));
            }
        }
        order.sort_unstable_by_key(|&(table, ccol, fi, pi)| {
            (table, std::cmp::Reverse(ccol), fi, pi)
        });
        for (table, ccol, fi, pi) in order {
            let (f, reads, data) = &loaded[fi];
            let (p, d) = (&reads[pi].0, &data[pi]);
            let name = || format!("{}/{}", f.ckpt, f.path);
            let t = target_of(&mut targets, &*writer, &map, base, table, p, d, &name, true)?;
            write_part(writer, t, table, ccol, d, true, &name, &mut bufs, out)?;
        }
        out.apply_s += ta.elapsed().as_secs_f64();
    }
    Ok(row0_ids)
}

/// A chunk list's restore reads a file in spans of about this many bytes, each in one request
/// (a part larger than this is one span of its own). One 13 MB bundle read whole took 6-7 ms
/// into fresh pages, most of it page faults, while the writes waited; in 1 MiB spans the reads
/// run on both cores beside the writes, and a written span's buffer is reused. Every scheme's
/// restore reads through these spans (one engine), so a ratio between schemes is not the
/// reader's.
pub const READ_SPAN_BYTES: u64 = 1 << 20;

/// The bytes a part occupies in its file: its ids and its rows.
fn part_extent(p: &LivePart) -> (u64, u64) {
    let n = p.hi.saturating_sub(p.lo);
    let ids_end = p.ids_at.saturating_add(n.saturating_mul(8));
    let rows_end = p
        .rows_at
        .saturating_add(n.saturating_mul(p.row_bytes as u64));
    (p.ids_at.min(p.rows_at), ids_end.max(rows_end))
}

/// `bytes` (8 little-endian bytes each) as ids: a view of the bytes themselves when they are
/// aligned on a little-endian host, else decoded into `buf`.
fn le_u64s<'a>(bytes: &'a [u8], buf: &'a mut Vec<u64>) -> &'a [u64] {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: every bit pattern is a valid u64; `align_to` only hands out the aligned
        // middle, used only when it is the whole slice.
        let (pre, mid, post) = unsafe { bytes.align_to::<u64>() };
        if pre.is_empty() && post.is_empty() {
            return mid;
        }
    }
    buf.clear();
    buf.extend(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
    );
    buf
}

/// `bytes` (4 little-endian bytes each) as f32 words, as [`le_u64s`].
fn le_f32s<'a>(bytes: &'a [u8], buf: &'a mut Vec<f32>) -> &'a [f32] {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: every bit pattern is a valid f32; as in `le_u64s`.
        let (pre, mid, post) = unsafe { bytes.align_to::<f32>() };
        if pre.is_empty() && post.is_empty() {
            return mid;
        }
    }
    buf.clear();
    buf.resize(bytes.len() / 4, 0.0);
    copy_le_into_f32s(&bytes[..buf.len() * 4], buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The restore's placement (a shift for a power of two) is the shard map's owner and
    /// local index, for every server count, table and row tried.
    #[test]
    fn placement_agrees_with_the_shard_map() {
        for n in 1..=6u32 {
            let map = ShardMap::new(n).unwrap();
            for t in 0..5u32 {
                for s in 0..n {
                    let (table, server) = (TableId(t), ServerId(s));
                    let p = Placement::new(&map, table, server);
                    for id in 0..100u64 {
                        let want =
                            (map.owner(table, id) == server).then(|| map.local_index(table, id));
                        assert_eq!(p.local(id), want, "n {n} table {t} server {s} row {id}");
                    }
                }
            }
        }
    }

    #[test]
    fn unaligned_bytes_are_decoded() {
        let ids: Vec<u64> = vec![3, 9, 1 << 40];
        let mut b = vec![0u8];
        b.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
        let mut buf = Vec::new();
        assert_eq!(le_u64s(&b[1..], &mut buf), &ids[..]);
        let words = [1.5f32, -2.0, 7.25];
        let mut b = vec![0u8];
        b.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        let mut buf = Vec::new();
        assert_eq!(le_f32s(&b[1..], &mut buf), &words[..]);
    }
}

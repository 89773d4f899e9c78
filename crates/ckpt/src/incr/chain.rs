//! One server's incremental checkpointing state ([`ServerChain`]): which base its pieces grow
//! from, which column comes next, and for IncrCP the 2-D chunk list with its Bloom filters.
//!
//! The caller (a parameter server's checkpoint service, or a benchmark) saves a piece's rows
//! through the staging pipeline as for any delta, then, once they are durable, calls
//! [`ServerChain::finish_piece`], which writes the piece index. Nothing here commits: the
//! coordinator commits the checkpoint once every server's files are durable. The state
//! therefore runs at most one piece ahead of the store; a piece that never commits is followed
//! by a restore (which rebuilds this state from the store: [`ServerChain::restore`]) or by a new
//! full ([`ServerChain::set_base`]).
//!
//! A chunk list's extraction round runs off the commit path (IncrCP §4.3: "extractions are
//! executed asynchronously"). Finishing piece `L` records only its column; the round of column
//! `L` ([`ServerChain::extract`]) runs afterwards, in the background, writing its bundles under
//! `L`'s directory, files no index names yet; finishing piece `L + 1` puts the round's records
//! into `L + 1`'s index, so the round becomes visible with that commit and not before. Until
//! then every restore folds the list as committed, in which round `L` skipped every comparison:
//! a list selective extraction could have produced, which newest-wins by column restores
//! exactly (`docs/DESIGN.md`, IncrCP, "Extraction off the commit path").

use std::collections::HashMap;

use ftrec_core::{RowId, RowLayout, ServerId, ShardMap, TableId};

use super::bloom::Bloom;
use super::extract::{
    column_chunks, column_records, extract_round, ExtractConfig, NewChunk, RoundHook, RoundOutput,
};
use super::list::ChunkList;
use super::restore::{restore_server, IncrChain, RestoreOutcome};
use super::PieceSpec;
use crate::checkpoint::Checkpoints;
use crate::deck::ShardWriter;
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, ExtractStats, FileContent, FileInfo, PieceIndex, PieceScheme};
use crate::snapshot::ShardReport;

/// The last piece this server saved.
#[derive(Debug, Clone, PartialEq)]
struct Last {
    scheme: PieceScheme,
    column: u32,
}

/// The extraction round of the newest column, run after its piece is finished and committed by
/// the next piece.
#[derive(Debug)]
struct Round {
    col: u32,
    ckpt: CheckpointId,
    cfg: ExtractConfig,
    new: Vec<NewChunk>,
    /// The round's output once it ran.
    out: Option<RoundOutput>,
}

/// What [`ServerChain::finish_piece`] produced.
#[derive(Debug, Clone)]
pub struct PieceDone {
    /// Files to add to the piece's report (bundles, then the piece index).
    pub files: Vec<FileInfo>,
    pub index: PieceIndex,
}

/// One server's incremental state.
pub struct ServerChain {
    server: ServerId,
    map: ShardMap,
    base: Option<(CheckpointId, u64)>,
    last: Option<Last>,
    list: Option<ChunkList>,
    /// Bytes of every piece since the base (what a naive restore reads).
    chain_bytes: u64,
    /// Store reads measured by extraction rounds, bytes per second (smoothed).
    read_rate: Option<f64>,
    /// Row layout of every table (from the base).
    layouts: HashMap<u32, RowLayout>,
    /// Row-0 ids a restore read, whose Bloom filters the next round builds.
    pending_blooms: Vec<((u32, u32, u32), Vec<RowId>)>,
    /// The newest column's extraction round, not yet committed.
    round: Option<Round>,
    hook: Option<RoundHook>,
}

impl std::fmt::Debug for ServerChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerChain")
            .field("server", &self.server)
            .field("base", &self.base)
            .field("last", &self.last)
            .field(
                "round",
                &self.round.as_ref().map(|r| (r.col, r.out.is_some())),
            )
            .finish_non_exhaustive()
    }
}

impl ServerChain {
    /// The state of `server`, whose shard is cut by `map`.
    pub fn new(server: ServerId, map: ShardMap) -> Self {
        ServerChain {
            server,
            map,
            base: None,
            last: None,
            list: None,
            chain_bytes: 0,
            read_rate: None,
            layouts: HashMap::new(),
            pending_blooms: Vec::new(),
            round: None,
            hook: None,
        }
    }

    /// Await `hook` after every file an extraction round writes (tests hold a round mid-way
    /// with it).
    pub fn set_round_hook(&mut self, hook: Option<RoundHook>) {
        self.hook = hook;
    }

    /// Whether the newest column's extraction round is still to run.
    pub fn round_pending(&self) -> bool {
        self.round.as_ref().is_some_and(|r| r.out.is_none())
    }

    /// Run the newest column's extraction round, if it has not run yet: off the commit path,
    /// after the column's piece is finished (a caller runs it in the background; the next
    /// [`ServerChain::finish_piece`] runs it first if nobody did). Writes the round's files
    /// under the column's checkpoint; changes neither the list nor the store's committed
    /// state. Returns what the round did. On error the round is dropped (the next piece
    /// commits none: as if every comparison was skipped) and the error returned.
    pub async fn extract(
        &mut self,
        ckpts: &Checkpoints,
    ) -> Result<Option<crate::format::ExtractStats>> {
        let Some(r) = self.round.as_ref().filter(|r| r.out.is_none()) else {
            return Ok(None);
        };
        let Some(list) = self.list.as_ref() else {
            self.round = None;
            return Ok(None);
        };
        let done = extract_round(
            ckpts,
            list,
            r.col,
            &r.ckpt,
            &r.new,
            &self.layouts,
            &r.cfg,
            self.hook.clone(),
        )
        .await;
        match done {
            Ok(out) => {
                if out.reads.seconds > 0.0 && out.reads.bytes > 0 {
                    let rate = out.reads.bytes as f64 / out.reads.seconds;
                    self.read_rate = Some(self.read_rate.map_or(rate, |o| 0.5 * o + 0.5 * rate));
                }
                let stats = out.stats;
                if let Some(r) = self.round.as_mut() {
                    r.out = Some(out);
                }
                Ok(Some(stats))
            }
            Err(e) => {
                self.round = None;
                Err(e)
            }
        }
    }

    /// Delete the files of an extraction round that ran and was never committed (the end of a
    /// run, whose last piece no later one follows), and forget it. Best effort: a file that
    /// cannot be deleted stays unreferenced, which is harmless.
    pub async fn discard_round(&mut self, ckpts: &Checkpoints) {
        if let Some(Round {
            ckpt,
            out: Some(out),
            ..
        }) = self.round.take()
        {
            for f in &out.written {
                if let Ok(key) = ckpts.file_key(&ckpt, &f.path) {
                    let _ = ckpts.store().delete(&key).await;
                }
            }
        }
    }

    /// A full checkpoint of this server is durable (`report`: what it wrote): pieces grow
    /// from it now.
    pub fn set_base(&mut self, id: CheckpointId, report: &ShardReport) {
        self.layouts = report
            .shard
            .tables
            .iter()
            .map(|t| (t.table.0, t.layout))
            .collect();
        self.base = Some((id, report.bytes));
        self.last = None;
        self.list = None;
        self.round = None;
        self.chain_bytes = 0;
    }

    /// Forget the base (a restore of something that is not a list, or a failure): the next
    /// piece is refused until a full sets a base.
    pub fn clear(&mut self) {
        self.base = None;
        self.last = None;
        self.list = None;
        self.round = None;
        self.chain_bytes = 0;
        self.pending_blooms.clear();
    }

    pub fn base(&self) -> Option<&CheckpointId> {
        self.base.as_ref().map(|(b, _)| b)
    }

    /// The column of the last piece (0: only the base).
    pub fn column(&self) -> u32 {
        self.last.as_ref().map_or(0, |l| l.column)
    }

    pub fn list(&self) -> Option<&ChunkList> {
        self.list.as_ref()
    }

    /// The piece of checkpoint `ckpt` is durable: `tracked` are the rows it saved (sorted per
    /// table), `report` the files staging wrote (this server's). Writes the piece index (for a
    /// chunk list: this column's chunks, and the previous column's extraction round, run first
    /// if [`ServerChain::extract`] has not run it); returns the files to add to the report.
    /// This column's round is left for [`ServerChain::extract`]. On error the chain is cleared
    /// (the next save must be a full).
    pub async fn finish_piece(
        &mut self,
        ckpts: &Checkpoints,
        ckpt: &CheckpointId,
        spec: &PieceSpec,
        tracked: &[(TableId, Vec<RowId>)],
        report: &ShardReport,
        quant_max_abs_error: f32,
    ) -> Result<PieceDone> {
        let r = self
            .finish(ckpts, ckpt, spec, tracked, report, quant_max_abs_error)
            .await;
        if r.is_err() {
            self.clear();
        }
        r
    }

    async fn finish(
        &mut self,
        ckpts: &Checkpoints,
        ckpt: &CheckpointId,
        spec: &PieceSpec,
        tracked: &[(TableId, Vec<RowId>)],
        report: &ShardReport,
        quant_max_abs_error: f32,
    ) -> Result<PieceDone> {
        spec.validate()?;
        let (base, base_bytes) = self.base.clone().ok_or_else(|| {
            CkptError::InvalidArgument(format!(
                "server {} has no base full checkpoint for {} pieces: save a full first",
                self.server.0,
                spec.scheme.name()
            ))
        })?;
        if let Some(l) = &self.last {
            if l.scheme != spec.scheme {
                return Err(CkptError::InvalidArgument(format!(
                    "a {} piece cannot follow {} pieces over the same base",
                    spec.scheme.name(),
                    l.scheme.name()
                )));
            }
        }
        let column = self.column() + 1;
        let piece_bytes = report.bytes;
        let mut stats = ExtractStats::default();
        let mut files = Vec::new();
        let mut records: Vec<crate::format::ChunkRecord> = Vec::new();
        let mut file_refs = Vec::new();
        let mut row0 = Vec::new();
        let restore_bytes;
        match spec.scheme {
            PieceScheme::ChunkList => {
                let cfg: &ExtractConfig = &spec.extract;
                // The previous column's round, committed with this piece. Run here, on the
                // commit path, only if no caller ran it in the background.
                if self.round_pending() {
                    self.extract(ckpts).await?;
                }
                let prev = self.round.take().and_then(|r| r.out.map(|o| (r.col, o)));
                if let Some((c, _)) = &prev {
                    if c + 1 != column {
                        return Err(CkptError::InvalidArgument(format!(
                            "the extraction round of column {c} cannot be committed by column {column}"
                        )));
                    }
                }
                let mut list = match self.list.take() {
                    Some(l) if l.range_rows() == cfg.range_rows => l,
                    Some(l) => {
                        return Err(CkptError::InvalidArgument(format!(
                            "the list is cut in ranges of {} rows, the piece asks for {}",
                            l.range_rows(),
                            cfg.range_rows
                        )))
                    }
                    None if self.last.is_none() => {
                        ChunkList::new(base.clone(), self.server, self.map, cfg.range_rows)
                    }
                    None => {
                        return Err(CkptError::InvalidArgument(
                            "the chunk list of this server was lost: save a full first".into(),
                        ))
                    }
                };
                for ((t, r, c), ids) in std::mem::take(&mut self.pending_blooms) {
                    list.set_bloom(t, r, c, Bloom::of(ids.into_iter(), cfg.bloom_bits_per_key));
                }
                let (new, new_files) =
                    column_chunks(ckpts, &list, ckpt, tracked, &report.files).await?;
                for t in &report.shard.tables {
                    self.layouts.insert(t.table.0, t.layout);
                }
                // This piece's records: the previous column's round (its splits and moves, in
                // files under that column's checkpoint), then this column's chunks.
                let mut blooms = Vec::new();
                if let Some((_, round)) = prev {
                    stats = round.stats;
                    file_refs = round.files;
                    records = round.records;
                    blooms = round.blooms;
                }
                let (col_files, col_records, col_blooms) =
                    column_records(column, &new, &new_files, cfg);
                let off = file_refs.len() as u32;
                file_refs.extend(col_files);
                records.extend(col_records.into_iter().map(|mut r| {
                    for p in &mut r.parts {
                        p.file += off;
                    }
                    r
                }));
                blooms.extend(col_blooms);
                let piece = self.index(
                    spec,
                    column,
                    &base,
                    base_bytes,
                    0,
                    quant_max_abs_error,
                    stats,
                    file_refs.clone(),
                    records.clone(),
                );
                list.apply(
                    ckpt,
                    &piece,
                    &format!("{ckpt}/piece of server {}", self.server.0),
                )?;
                for ((t, r, c), b) in blooms {
                    list.set_bloom(t, r, c, b);
                }
                // The whole row 0 after this piece, for restores of this newest state.
                let mut local: HashMap<u32, u32> = file_refs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| list.file_index(&f.ckpt, &f.path).map(|g| (g, i as u32)))
                    .collect();
                row0 = list
                    .row0_chunks()
                    .map(|c| {
                        list.record(
                            crate::format::ChunkOp::Column,
                            c,
                            &mut file_refs,
                            &mut local,
                        )
                    })
                    .collect();
                let dense: u64 = report
                    .files
                    .iter()
                    .filter(|f| matches!(f.content, FileContent::Dense { .. }))
                    .map(|f| f.size)
                    .sum();
                restore_bytes = list.rectangle_bytes(column) + dense;
                self.list = Some(list);
                // This column's round runs after the piece, off the commit path.
                self.round = Some(Round {
                    col: column,
                    ckpt: ckpt.clone(),
                    cfg: *cfg,
                    new,
                    out: None,
                });
            }
            PieceScheme::Incremental => {
                restore_bytes = self.chain_bytes + piece_bytes;
            }
            PieceScheme::Differential => {
                restore_bytes = piece_bytes;
            }
        }
        let mut index = self.index(
            spec,
            column,
            &base,
            base_bytes,
            restore_bytes,
            quant_max_abs_error,
            stats,
            file_refs,
            records,
        );
        index.row0 = row0;
        let encoded = index.encode()?;
        let path = format!("s{:04}/piece.pidx", self.server.0);
        ckpts.put_file(ckpt, &path, &encoded).await?;
        files.push(FileInfo {
            path,
            size: encoded.size(),
            crc32c: encoded.checksums,
            content: FileContent::PieceIndex {
                server: self.server,
                scheme: spec.scheme,
                column,
            },
        });
        self.chain_bytes += piece_bytes;
        self.last = Some(Last {
            scheme: spec.scheme,
            column,
        });
        Ok(PieceDone { files, index })
    }

    #[allow(clippy::too_many_arguments)]
    fn index(
        &self,
        spec: &PieceSpec,
        column: u32,
        base: &CheckpointId,
        base_bytes: u64,
        restore_bytes: u64,
        quant_max_abs_error: f32,
        stats: ExtractStats,
        files: Vec<crate::format::FileRef>,
        chunks: Vec<crate::format::ChunkRecord>,
    ) -> PieceIndex {
        PieceIndex {
            server: self.server,
            scheme: spec.scheme,
            column,
            base: base.clone(),
            quant: spec.quant,
            quant_max_abs_error,
            range_rows: if spec.scheme == PieceScheme::ChunkList {
                spec.extract.range_rows
            } else {
                0
            },
            base_bytes,
            restore_bytes,
            read_bytes_per_s: self.read_rate.unwrap_or(0.0),
            stats,
            files,
            chunks,
            row0: Vec::new(),
        }
    }

    /// Restore `writer` (this server's shard) to the state `chain` names, and continue from
    /// it: a full becomes the base; a list restored at its newest piece grows from there; any
    /// other state leaves no base (the next save must be a full).
    pub async fn restore(
        &mut self,
        ckpts: &Checkpoints,
        chain: &IncrChain,
        writer: &mut dyn ShardWriter,
    ) -> Result<RestoreOutcome> {
        self.clear();
        let resharded = writer
            .shard_map()
            .is_some_and(|m| m.servers() as usize != chain.base.shards.len());
        let mut out = restore_server(ckpts, chain, writer).await?;
        if resharded {
            // Saved by a different number of servers: no base or list of this cluster's
            // shards to grow from; the next save is a full.
            return Ok(out);
        }
        let base_bytes = chain
            .base
            .files_of(self.server)
            .map(|f| f.size)
            .sum::<u64>();
        self.base = Some((chain.base.id.clone(), base_bytes));
        self.layouts = chain
            .base
            .shard(self.server)
            .map(|s| s.tables.iter().map(|t| (t.table.0, t.layout)).collect())
            .unwrap_or_default();
        let Some(scheme) = chain.scheme else {
            return Ok(out);
        };
        if chain.target == 0 {
            return Ok(out);
        }
        // Pieces beyond the target belong to a future this state does not continue.
        let newest = chain.pieces.len() as u32 == chain.target;
        if !newest && scheme != PieceScheme::Differential {
            self.clear();
            return Ok(out);
        }
        self.chain_bytes = chain
            .pieces
            .iter()
            .take(chain.target as usize)
            .flat_map(|m| m.files_of(self.server))
            .map(|f| f.size)
            .sum();
        if scheme == PieceScheme::ChunkList {
            match out.list.take() {
                Some(l) => {
                    self.list = Some(l);
                    self.pending_blooms = std::mem::take(&mut out.row0_ids);
                }
                None => {
                    self.clear();
                    return Ok(out);
                }
            }
        }
        self.last = Some(Last {
            scheme,
            column: chain.target,
        });
        Ok(out)
    }
}

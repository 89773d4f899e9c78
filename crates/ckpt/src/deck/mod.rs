//! DECK delta checkpointing (deck.txt §3–§4) on top of the chunk store and formats.
//!
//! - [`tracker`]: touched-row ids per table, several consumers, segment-local compaction;
//! - [`staging`]: copy-out → staging directory → store pipeline, at most four chunk sizes in memory;
//! - [`lineage`]: the graph of full / merged / delta checkpoints, chain resolution, retention;
//! - [`merge`]: the bounded-memory k-way merge behind merging, full materialisation and
//!   restore;
//! - this module: the pieces callers string together: [`delta_manifest`] and ids,
//!   [`Merger`] (hierarchical merging and periodic fulls), [`gc`], and restore
//!   ([`select_chain`], [`restore_chain`]).
//!
//! Nothing here moves `CURRENT` except a committed delta or full (by the coordinator): merged
//! checkpoints and merger-written fulls only add manifests, so a crash at any point of a merge
//! leaves every committed state restorable.

pub mod lineage;
pub mod merge;
pub mod staging;
pub mod tracker;

use std::collections::BTreeMap;

use ftrec_core::{
    DenseParams, EmbeddingTable, RowId, RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK,
};

use crate::checkpoint::Checkpoints;
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, CheckpointKind, DataPosition, Manifest};
use crate::snapshot::{RowIds, ShardReport};
pub use lineage::{DeckMeta, Lineage, Listed, Node, Retention};
pub use merge::{merge_chain, MergeSink, MergeStats, ShardWriter, StoreSink};
pub use staging::{
    ChunkSink, CopyReport, MemGauge, PendingUpload, RowSelection, Source, SourceTable,
    StagingOptions,
};
pub use tracker::{ConsumerId, TrackedRows, Tracker, TrackerStats};

/// The id of a delta (or trainer full) at `step`; `attempt` tells apart saves at the same step
/// after a rollback replayed it.
pub fn checkpoint_id(step: u64, kind: CheckpointKind, attempt: u32) -> CheckpointId {
    CheckpointId::new(format!("{step:020}-{}-a{attempt}", kind.name()))
        .expect("a valid key segment")
}

/// The manifest of a checkpoint of `kind` (full or delta) made of `reports` (one per server).
pub fn shard_manifest(
    id: CheckpointId,
    kind: CheckpointKind,
    step: u64,
    parent: Option<CheckpointId>,
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
        kind,
        step,
        parents: parent.into_iter().collect(),
        data_position,
        shards,
        files,
        extra: BTreeMap::new(),
    }
}

/// The manifest of a delta at `step` over `parent` (DECK §3.1).
pub fn delta_manifest(
    id: CheckpointId,
    step: u64,
    parent: CheckpointId,
    data_position: DataPosition,
    reports: Vec<ShardReport>,
) -> Manifest {
    shard_manifest(
        id,
        CheckpointKind::Delta,
        step,
        Some(parent),
        data_position,
        reports,
    )
}

/// Which state to restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreAt {
    /// What `CURRENT` names (the last committed delta or full).
    Current,
    /// A state by id (a checkpoint, or a delta merging has replaced).
    Id(CheckpointId),
    /// The newest state at or before this step.
    Step(u64),
}

/// The manifests (full first) that rebuild the state `at` names. With `fallback`, a state
/// whose chain is incomplete or damaged is skipped for the next older one, verifying every
/// file before choosing; without, the first problem is an error naming the checkpoint or file.
pub async fn select_chain(
    ckpts: &Checkpoints,
    at: &RestoreAt,
    fallback: bool,
) -> Result<Vec<Manifest>> {
    let lineage = Lineage::load(ckpts).await?;
    let no_ckpt = || CkptError::NoCheckpoint {
        root: format!("{} store", ckpts.store().backend()),
    };
    let target = match at {
        RestoreAt::Current => lineage.head().ok_or_else(no_ckpt)?,
        RestoreAt::Id(id) => id.clone(),
        RestoreAt::Step(s) => lineage.state_at_or_before(*s).ok_or_else(|| {
            CkptError::InvalidArgument(format!("no checkpoint at or before step {s}"))
        })?,
    };
    if !fallback {
        return read_chain(ckpts, &lineage.resolve(&target)?).await;
    }
    let target_step = lineage
        .states_newest_first()
        .into_iter()
        .find(|(_, s)| *s == target)
        .map(|(st, _)| st)
        .unwrap_or(u64::MAX);
    let mut failures = Vec::new();
    for (step, state) in lineage.states_newest_first() {
        if step > target_step {
            continue;
        }
        let attempt = async {
            let chain = read_chain(ckpts, &lineage.resolve(&state)?).await?;
            for m in &chain {
                verify_all(ckpts, m).await?;
            }
            Ok::<_, CkptError>(chain)
        }
        .await;
        match attempt {
            Ok(chain) => return Ok(chain),
            Err(e) => failures.push((state.to_string(), e.to_string())),
        }
    }
    Err(CkptError::NoIntactCheckpoint {
        root: format!("{} store", ckpts.store().backend()),
        failures,
    })
}

/// Read and verify every file of `m`, a few at a time. Owned entries keep the future `Send`
/// in generic callers.
async fn verify_all(ckpts: &Checkpoints, m: &Manifest) -> Result<()> {
    use futures_util::{StreamExt, TryStreamExt};
    futures_util::stream::iter(m.files.clone())
        .map(|f: crate::format::FileInfo| {
            let ckpts = ckpts.clone();
            let id = m.id.clone();
            async move {
                let key = ckpts.file_key(&id, &f.path)?;
                let data = ckpts.store().get(&key).await?;
                Checkpoints::verify_file(&key, &f, &data).map(|_| ())
            }
        })
        .buffer_unordered(4)
        .try_collect::<()>()
        .await
}

async fn read_chain(ckpts: &Checkpoints, ids: &[CheckpointId]) -> Result<Vec<Manifest>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(ckpts.read_manifest(id, None).await?);
    }
    Ok(out)
}

/// Restore `writer`'s server from `chain` (full first): every row once, newest wins.
///
/// A chain saved by as many servers as the writer's shard map has is read server for server.
/// One saved by a different number of servers (an elastic restore) is re-sharded: rows carry
/// their global ids, so the writer reads every saved server's merged rows and keeps those its
/// shard map gives it, and the dense blocks of its range; it must end up with every row and
/// block of its shard, or the restore is an error.
pub async fn restore_chain(
    ckpts: &Checkpoints,
    chain: &[Manifest],
    writer: &mut dyn ShardWriter,
) -> Result<MergeStats> {
    let full = chain
        .first()
        .ok_or_else(|| CkptError::InvalidArgument("restore from an empty chain".into()))?;
    if full.kind != CheckpointKind::Full {
        return Err(CkptError::InvalidCheckpoint {
            id: full.id.to_string(),
            reason: "a restore chain must start with a full checkpoint".into(),
        });
    }
    let saved_servers = full.shards.len() as u32;
    if let Some(map) = writer.shard_map() {
        if map.servers() != saved_servers {
            return restore_resharded(ckpts, chain, writer, map).await;
        }
    }
    merge::check_shapes(full, writer)?;
    let server = writer.server();
    let mut sink = merge::WriterSink::new(writer);
    let (_, stats) = merge_chain(ckpts, chain, Some(&[server]), 4 << 20, &mut sink).await?;
    Ok(stats)
}

/// [`restore_chain`] from a chain saved by a different number of servers than `map` has.
async fn restore_resharded(
    ckpts: &Checkpoints,
    chain: &[Manifest],
    writer: &mut dyn ShardWriter,
    map: ShardMap,
) -> Result<MergeStats> {
    let full = &chain[0];
    let me = writer.server();
    let invalid = |reason: String| CkptError::InvalidCheckpoint {
        id: full.id.to_string(),
        reason,
    };
    // Every saved table must exist on the target with the same layout and the same number
    // of rows in all (the saved shards of a full hold every row once).
    let mut totals: BTreeMap<TableId, (u64, RowLayout)> = BTreeMap::new();
    for shard in &full.shards {
        for t in &shard.tables {
            let e = totals.entry(t.table).or_insert((0, t.layout));
            if e.1 != t.layout {
                return Err(invalid(format!(
                    "table {} is saved with layouts {:?} and {:?}",
                    t.table.0, e.1, t.layout
                )));
            }
            e.0 += t.rows;
        }
    }
    let mut want: BTreeMap<TableId, u64> = BTreeMap::new();
    for (&table, &(rows, layout)) in &totals {
        match writer.table_shape(table) {
            Some((local, l)) if l == layout && local == map.rows_on(table, rows, me) => {
                want.insert(table, local);
            }
            Some((local, l)) => {
                return Err(invalid(format!(
                    "table {}: saved {rows} rows of {layout:?} over {} servers, server {} of {} \
                     holds {local} rows of {l:?}",
                    table.0,
                    full.shards.len(),
                    me.0,
                    map.servers()
                )))
            }
            None => {
                return Err(invalid(format!(
                    "table {} is saved, server {} does not hold it",
                    table.0, me.0
                )))
            }
        }
    }
    let saved: Vec<ServerId> = full.shards.iter().map(|s| s.server).collect();
    let mut sink = merge::ReshardSink::new(writer, map);
    let mut stats = MergeStats::default();
    for server in saved {
        let (_, s) = merge_chain(ckpts, chain, Some(&[server]), 4 << 20, &mut sink).await?;
        stats.files_read += s.files_read;
        stats.bytes_read += s.bytes_read;
        stats.rows_out += s.rows_out;
    }
    for (table, local) in want {
        let got = sink.rows.get(&table).copied().unwrap_or(0);
        if got != local {
            return Err(invalid(format!(
                "re-sharding gave server {} {got} rows of table {}, its shard has {local}",
                me.0, table.0
            )));
        }
    }
    let dense_want = sink.writer_dense_blocks().unwrap_or(0);
    if sink.dense_blocks != dense_want {
        return Err(invalid(format!(
            "re-sharding gave server {} {} dense blocks, its range has {dense_want}",
            me.0, sink.dense_blocks
        )));
    }
    Ok(stats)
}

/// Write the state `chain` (full first) rebuilds as one full checkpoint into `dst` and commit
/// it there (`CURRENT` moves): a restore to a directory or another store. The new id is
/// `<state>-full`; it records the chain in its [`DeckMeta`].
pub async fn materialize_full(
    src: &Checkpoints,
    chain: &[Manifest],
    dst: &Checkpoints,
    chunk_bytes: usize,
) -> Result<Manifest> {
    let last = chain
        .last()
        .ok_or_else(|| CkptError::InvalidArgument("materialize an empty chain".into()))?;
    if chain[0].kind != CheckpointKind::Full {
        return Err(CkptError::InvalidCheckpoint {
            id: chain[0].id.to_string(),
            reason: "a chain must start with a full checkpoint".into(),
        });
    }
    let tip = DeckMeta::of(last).map_or(last.id.clone(), |m| m.tip);
    let id = CheckpointId::new(format!("{tip}-full"))?;
    // The sink writes into `dst`, the inputs are read from `src`.
    let mut sink = StoreSink::new(dst.clone(), id.clone());
    let (shards, _) = match merge_chain(src, chain, None, chunk_bytes, &mut sink).await {
        Ok(x) => x,
        Err(e) => {
            sink.discard().await;
            return Err(e);
        }
    };
    let mut files = std::mem::take(&mut sink.files);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut m = Manifest {
        id,
        kind: CheckpointKind::Full,
        step: last.step,
        parents: Vec::new(),
        data_position: last.data_position.clone(),
        shards,
        files,
        extra: BTreeMap::new(),
    };
    DeckMeta {
        tip,
        layer: 0,
        merged_from: chain.iter().map(|c| c.id.clone()).collect(),
        deltas: 0,
    }
    .store_in(&mut m);
    dst.commit(&m).await?;
    Ok(m)
}

/// A [`ShardWriter`] over local tables (tests, the CLI, single-process runs).
pub struct TablesWriter<'a> {
    pub server: ServerId,
    pub tables: Vec<(&'a mut EmbeddingTable, RowIds<'a>)>,
    pub dense: Option<(u64, &'a mut DenseParams)>,
}

impl ShardWriter for TablesWriter<'_> {
    fn server(&self) -> ServerId {
        self.server
    }

    fn table_shape(&self, table: TableId) -> Option<(u64, RowLayout)> {
        self.tables
            .iter()
            .find(|(t, _)| t.id == table)
            .map(|(t, _)| (t.rows(), t.layout()))
    }

    fn write_rows(&mut self, table: TableId, ids: &[RowId], words: &[f32]) -> Result<()> {
        let server = self.server;
        let (t, map) = self
            .tables
            .iter_mut()
            .find(|(t, _)| t.id == table)
            .ok_or_else(|| CkptError::InvalidArgument(format!("no table {}", table.0)))?;
        let w = t.layout().words();
        for (i, &id) in ids.iter().enumerate() {
            let local = match map {
                RowIds::Identity => Some(id),
                RowIds::Sharded { map, server: s } => {
                    (map.owner(table, id) == *s).then(|| map.local_index(table, id))
                }
                RowIds::Explicit(v) => v.binary_search(&id).ok().map(|i| i as u64),
            }
            .filter(|&l| l < t.rows())
            .ok_or_else(|| {
                CkptError::InvalidArgument(format!(
                    "row {id} of table {} is not held by server {}",
                    table.0, server.0
                ))
            })?;
            t.row_mut(local).copy_from_slice(&words[i * w..(i + 1) * w]);
        }
        Ok(())
    }

    fn dense_shape(&self) -> Option<(u64, u64, u32)> {
        self.dense.as_ref().map(|(first, p)| {
            let spb = p.state.len().checked_div(p.blocks()).unwrap_or(0);
            (*first, p.len() as u64, spb as u32)
        })
    }

    fn write_dense(&mut self, first_block: u64, values: &[f32], state: &[f32]) -> Result<()> {
        let (first, p) = self
            .dense
            .as_mut()
            .ok_or_else(|| CkptError::InvalidArgument("no dense target".into()))?;
        let spb = p.state.len().checked_div(p.blocks()).unwrap_or(0);
        let b0 = first_block
            .checked_sub(*first)
            .ok_or_else(|| CkptError::InvalidArgument(format!("dense block {first_block}")))?
            as usize;
        let v0 = b0 * DENSE_BLOCK;
        let blocks = values.len().div_ceil(DENSE_BLOCK);
        if v0 + values.len() > p.len() || (b0 + blocks) * spb > p.state.len() {
            return Err(CkptError::InvalidArgument(format!(
                "dense blocks {first_block}+{blocks} do not fit the target"
            )));
        }
        p.values[v0..v0 + values.len()].copy_from_slice(values);
        p.state[b0 * spb..b0 * spb + state.len()].copy_from_slice(state);
        Ok(())
    }
}

/// When the merger merges and writes fulls (DECK §3.3).
#[derive(Debug, Clone, PartialEq)]
pub struct MergePolicy {
    /// `s`: merge every `s` consecutive checkpoints of one layer into one of the next
    /// (Inequality 1 picks it from measured `d` and `v`; `ftrec_strategy::deck`).
    pub stride: usize,
    /// `N`: write a full once the active chain covers this many deltas (Inequality 2).
    pub full_every_deltas: Option<u64>,
    /// Or dynamically: once the chain's non-full bytes exceed this share of the full's bytes.
    pub full_when_chain_ratio: Option<f64>,
    /// Output chunk size.
    pub chunk_bytes: usize,
}

impl Default for MergePolicy {
    fn default() -> Self {
        MergePolicy {
            stride: 2,
            full_every_deltas: None,
            full_when_chain_ratio: None,
            chunk_bytes: 4 << 20,
        }
    }
}

/// What one merger pass wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MergeReport {
    /// New merged / full checkpoints, in the order written.
    pub written: Vec<CheckpointId>,
    pub stats: MergeStats,
    pub bytes_written: u64,
}

/// The hierarchical merger (DECK §3.3, Fig. 5): run [`Merger::run_once`] after each delta
/// commit (or periodically, from its own thread or process).
#[derive(Debug, Clone)]
pub struct Merger {
    ckpts: Checkpoints,
    policy: MergePolicy,
    max_bytes_per_s: Option<f64>,
    progress: Option<fn(&str, &CheckpointId)>,
}

impl Merger {
    pub fn new(ckpts: Checkpoints, policy: MergePolicy) -> Result<Self> {
        if policy.stride < 2 {
            return Err(CkptError::InvalidArgument(format!(
                "merge stride must be at least 2, got {}",
                policy.stride
            )));
        }
        if policy.full_every_deltas == Some(0) {
            return Err(CkptError::InvalidArgument(
                "a full every 0 deltas makes no sense".into(),
            ));
        }
        Ok(Merger {
            ckpts,
            policy,
            max_bytes_per_s: None,
            progress: None,
        })
    }

    /// Cap the merger's write rate (bytes per second).
    pub fn with_rate_limit(mut self, max_bytes_per_s: Option<f64>) -> Self {
        self.max_bytes_per_s = max_bytes_per_s;
        self
    }

    /// Call `progress("writing" | "wrote", id)` before a checkpoint's first file and after its
    /// manifest.
    pub fn with_progress(mut self, progress: fn(&str, &CheckpointId)) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Merge the head's chain as far as the policy says: cascade merges of `s` trailing
    /// same-layer checkpoints, then a full if due. Only adds manifests; never moves `CURRENT`
    /// and never deletes (that is [`gc`]).
    pub async fn run_once(&self) -> Result<MergeReport> {
        let mut report = MergeReport::default();
        loop {
            let lineage = Lineage::load(&self.ckpts).await?;
            let Some(head) = lineage.head() else {
                return Ok(report);
            };
            let ids = lineage.resolve(&head)?;
            let nodes: Vec<&Node> = ids.iter().filter_map(|i| lineage.node(i)).collect();
            let s = self.policy.stride;
            let tail = &nodes[1..];
            if tail.len() >= s {
                let run = &tail[tail.len() - s..];
                let layer = run[0].layer;
                if run.iter().all(|n| n.layer == layer) {
                    let m = self.merge_run(&lineage, run, layer + 1).await?;
                    report.bytes_written += m.0;
                    report.stats.files_read += m.2.files_read;
                    report.stats.bytes_read += m.2.bytes_read;
                    report.stats.rows_out += m.2.rows_out;
                    report.written.push(m.1);
                    continue;
                }
            }
            let deltas: u64 = tail.iter().map(|n| n.deltas).sum();
            let chain_bytes: u64 = tail.iter().map(|n| n.bytes).sum();
            let full_bytes = nodes[0].bytes.max(1);
            let due = !tail.is_empty()
                && (self.policy.full_every_deltas.is_some_and(|n| deltas >= n)
                    || self
                        .policy
                        .full_when_chain_ratio
                        .is_some_and(|r| chain_bytes as f64 > r * full_bytes as f64));
            if due {
                let m = self.write_full(&ids).await?;
                report.bytes_written += m.0;
                report.stats.files_read += m.2.files_read;
                report.stats.bytes_read += m.2.bytes_read;
                report.stats.rows_out += m.2.rows_out;
                report.written.push(m.1);
            }
            return Ok(report);
        }
    }

    async fn merge_run(
        &self,
        lineage: &Lineage,
        run: &[&Node],
        layer: u32,
    ) -> Result<(u64, CheckpointId, MergeStats)> {
        let last = run[run.len() - 1];
        let first = run[0];
        let parent = first
            .parent
            .clone()
            .ok_or_else(|| CkptError::InvalidCheckpoint {
                id: first.id.to_string(),
                reason: "a merge input has no parent".into(),
            })?;
        let id = CheckpointId::new(format!("{}-m{layer}", last.tip))?;
        let ids: Vec<CheckpointId> = run.iter().map(|n| n.id.clone()).collect();
        let chain = read_chain(&self.ckpts, &ids).await?;
        let meta = DeckMeta {
            tip: last.tip.clone(),
            layer,
            merged_from: ids,
            deltas: run.iter().map(|n| n.deltas).sum(),
        };
        let _ = lineage;
        self.write_merged(id, CheckpointKind::Merged, Some(parent), &chain, meta)
            .await
    }

    async fn write_full(&self, ids: &[CheckpointId]) -> Result<(u64, CheckpointId, MergeStats)> {
        let chain = read_chain(&self.ckpts, ids).await?;
        let last = chain.last().expect("non-empty chain");
        let tip = DeckMeta::of(last).map_or(last.id.clone(), |m| m.tip);
        let id = CheckpointId::new(format!("{tip}-full"))?;
        let meta = DeckMeta {
            tip,
            layer: 0,
            merged_from: ids.to_vec(),
            deltas: 0,
        };
        self.write_merged(id, CheckpointKind::Full, None, &chain, meta)
            .await
    }

    async fn write_merged(
        &self,
        id: CheckpointId,
        kind: CheckpointKind,
        parent: Option<CheckpointId>,
        chain: &[Manifest],
        meta: DeckMeta,
    ) -> Result<(u64, CheckpointId, MergeStats)> {
        // Leftovers of an earlier attempt at the same merge that crashed before its manifest.
        if self.ckpts.read_manifest(&id, None).await.is_err() {
            self.ckpts.delete_checkpoint(&id).await?;
        } else {
            return Err(CkptError::AlreadyExists {
                key: self.ckpts.manifest_key(&id).to_string(),
            });
        }
        let last = chain.last().expect("non-empty chain");
        if let Some(p) = self.progress {
            p("writing", &id);
        }
        let mut sink =
            StoreSink::new(self.ckpts.clone(), id.clone()).with_rate_limit(self.max_bytes_per_s);
        let res = merge_chain(&self.ckpts, chain, None, self.policy.chunk_bytes, &mut sink).await;
        let (shards, stats) = match res {
            Ok(x) => x,
            Err(e) => {
                sink.discard().await;
                return Err(e);
            }
        };
        let mut files = std::mem::take(&mut sink.files);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut m = Manifest {
            id: id.clone(),
            kind,
            step: last.step,
            parents: parent.into_iter().collect(),
            data_position: last.data_position.clone(),
            shards,
            files,
            extra: BTreeMap::new(),
        };
        meta.store_in(&mut m);
        let bytes = m.data_bytes();
        if let Err(e) = self.ckpts.write_manifest(&m).await {
            sink.discard().await;
            return Err(e);
        }
        if let Some(p) = self.progress {
            p("wrote", &id);
        }
        Ok((bytes, id, stats))
    }
}

/// Remove every checkpoint directory without a manifest (the files of saves and merges that
/// never committed) and return their names. Only safe when nothing is writing to the store:
/// a save or merge in flight has no manifest yet.
pub async fn remove_orphans(ckpts: &Checkpoints) -> Result<Vec<String>> {
    remove_orphans_where(ckpts, |_| true).await
}

/// Remove every checkpoint directory without a manifest whose id sorts before `head` (the
/// committed checkpoint `CURRENT` names) and return their names. Ids begin with the step
/// ([`checkpoint_id`]) and a save starts after the commit before it, so such a directory is
/// no save in flight: it holds the files of a save that was dropped (a server lost before
/// its commit), some perhaps written after the drop by a process that did not yet know it was
/// replaced. Safe while the job runs; a merge writes ids of its own and runs apart from this.
pub async fn remove_dropped_saves(ckpts: &Checkpoints, head: &CheckpointId) -> Result<Vec<String>> {
    let head = head.to_string();
    remove_orphans_where(ckpts, |id| id < head.as_str()).await
}

async fn remove_orphans_where(
    ckpts: &Checkpoints,
    pick: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let with_manifest: std::collections::BTreeSet<String> = ckpts
        .list_checkpoints()
        .await?
        .into_iter()
        .map(|i| i.to_string())
        .collect();
    let dir = ckpts.checkpoint_dir(&CheckpointId::new("x")?);
    let root = match dir.as_str().rsplit_once('/') {
        Some((r, _)) => crate::key::Key::new(r)?,
        None => return Ok(Vec::new()),
    };
    let mut orphans = std::collections::BTreeSet::new();
    for meta in ckpts.store().list(Some(&root)).await? {
        if let Some(rest) = meta.key.strip_prefix(&root) {
            if let Some((id, _)) = rest.split_once('/') {
                if !with_manifest.contains(id) && pick(id) {
                    orphans.insert(id.to_string());
                }
            }
        }
    }
    let mut removed = Vec::with_capacity(orphans.len());
    for o in orphans {
        ckpts
            .delete_checkpoint(&CheckpointId::new(o.clone())?)
            .await?;
        removed.push(o);
    }
    Ok(removed)
}

/// What [`gc`] removes besides unneeded checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcOptions {
    pub retention: Retention,
    /// Also remove checkpoint directories without a manifest. Only safe when no writer is
    /// running (a save or merge in flight has no manifest yet).
    pub remove_orphans: bool,
}

/// What [`gc`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub deleted: Vec<CheckpointId>,
    pub orphans_removed: Vec<String>,
    pub kept: Vec<CheckpointId>,
}

/// Delete every checkpoint no live lineage needs (DECK §4.3). Unreadable checkpoints are kept
/// (they are evidence, and `verify` names them). An unreadable `CURRENT` stops the collection
/// (the head would be a guess); checkpoints a live reader holds are kept
/// ([`crate::lease::sweep`]).
pub async fn gc(ckpts: &Checkpoints, opts: &GcOptions) -> Result<GcReport> {
    let lineage = Lineage::load(ckpts).await?;
    if let Some(e) = &lineage.current_error {
        return Err(CkptError::Precondition {
            key: ckpts.current_key().to_string(),
            reason: format!(
                "garbage collection stopped: CURRENT cannot be read ({e}), so what training resumes from is unknown"
            ),
        });
    }
    let live = lineage.live(&opts.retention);
    let mut report = GcReport::default();
    let mut dead = Vec::new();
    for n in lineage.nodes() {
        if live.contains(&n.id) {
            report.kept.push(n.id.clone());
        } else {
            dead.push(n.id.clone());
        }
    }
    let swept = crate::lease::sweep(ckpts, &dead).await?;
    report.deleted = swept.deleted;
    report.kept.extend(swept.held);
    report.kept.extend(swept.failed);
    if opts.remove_orphans && swept.readers == 0 {
        report.orphans_removed = remove_orphans(ckpts).await?;
    }
    Ok(report)
}

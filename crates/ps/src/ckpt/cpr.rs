//! CPR's server side (cpr.txt §4.2): priority tracking on the update path and prioritized
//! partial saves of a shard.
//!
//! - [`PriorityObserver`] feeds every update of the server into a
//!   [`ftrec_ckpt::cpr::PriorityTracker`] (MFU counters, the SSU list or SCAR's dirty bits), as
//!   [`super::TrackerObserver`] feeds DECK's tracker;
//! - [`CkptNode::with_priority`] installs it on a checkpoint node; then
//!   [`super::CkptApi::save_prioritized`] copies out, through the same staging pipeline and row
//!   files as every other save, the rows the rule values most (`ceil(r * rows)` of each of the
//!   `largest_tables` largest tables; every other table whole, as CPR §5.1 saves the small
//!   tables whole) and the dense range. The coordinator commits it as a delta-shaped
//!   checkpoint whose parent is the previous save;
//! - a restore ([`super::CkptApi::restore`] on the one replaced server) resolves the chain of
//!   the full and the prioritized saves after it and applies it oldest first, so every row of
//!   the shard comes from the newest save that holds it; the priority state then starts over
//!   (the loaded rows count as saved), as it does after a full save.
//!
//! A prioritized save also writes, beside its files, what it left out
//! ([`ftrec_ckpt::cpr::Coverage`]: per row, the updates since the newest save holding it,
//! summed), for the PLS that counts what was saved. It is a small object written after the
//! copy-out, inside the pause; if it cannot be written the save goes on and that PLS is
//! reported unknown.
//!
//! A prioritized save marks its rows saved once they are copied out, not once they are
//! durable: if the upload then fails, those rows only lose their place in the queue until the
//! next full save (which writes every row), never a row of a committed checkpoint.

use std::sync::{Arc, Mutex};

use ftrec_ckpt::cpr::{
    Coverage, PrioritizedMeta, PriorityConfig, PriorityTracker, RowsView, TableSpec,
};
use ftrec_ckpt::deck::{self, staging, RowSelection, Source, SourceTable};
use ftrec_ckpt::snapshot::RowIds;
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition, Manifest};
use ftrec_core::{RowId, ShardMap, TableId};

use super::{join_all, lock_err, CkptApi, CkptNode, CkptServiceError, Save, SaveStarted};
use crate::observer::{PushObserver, RowImages, UpdateOrigin};
use crate::server::dense_block_range;
use crate::Server;

/// A priority tracker shared between the update path and the checkpoint service.
pub type SharedPriority = Arc<Mutex<PriorityTracker>>;

/// The paper prioritizes the 7 largest of the 26 Kaggle tables (99.6% of the rows) and saves
/// the others whole (CPR §5.1).
pub const DEFAULT_LARGEST_TABLES: usize = 7;

/// How a server prioritizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PriorityOptions {
    pub config: PriorityConfig,
    /// Prioritize this many of the model's largest tables (by rows, ties by table id).
    pub largest_tables: usize,
}

/// The tables `server` prioritizes: the `largest` largest of the model that it holds rows of.
pub fn prioritized_tables(server: &Server, largest: usize) -> Vec<TableSpec> {
    let cfg = server.config();
    let mut order: Vec<usize> = (0..cfg.table_rows.len()).collect();
    order.sort_by(|&a, &b| cfg.table_rows[b].cmp(&cfg.table_rows[a]).then(a.cmp(&b)));
    let mut out: Vec<TableSpec> = order
        .into_iter()
        .take(largest)
        .filter_map(|t| {
            let table = TableId(t as u32);
            let shard = server.shard(table)?;
            (shard.rows() > 0).then(|| TableSpec {
                table,
                rows: shard.rows(),
                dim: shard.layout().dim,
            })
        })
        .collect();
    out.sort_by_key(|t| t.table);
    out
}

fn view(server: &Server, table: TableId) -> Option<RowsView<'_>> {
    let shard = server.shard(table)?;
    Some(RowsView {
        data: shard.as_slice(),
        words: shard.layout().words(),
        dim: shard.layout().dim,
    })
}

/// Every prioritized row of `server` counts as saved as it is now (after a full save or a
/// restore).
pub fn reset_to(server: &Server, tracker: &mut PriorityTracker, tables: &[TableSpec]) {
    for t in tables {
        if let Some(v) = view(server, t.table) {
            tracker.reset(t.table, v);
        }
    }
}

/// Records every updated row into a priority tracker, by local index.
#[derive(Debug, Clone)]
pub struct PriorityObserver {
    tracker: SharedPriority,
    map: ShardMap,
}

impl PriorityObserver {
    pub fn new(tracker: SharedPriority, map: ShardMap) -> Self {
        PriorityObserver { tracker, map }
    }
}

impl PushObserver for PriorityObserver {
    fn rows_updated(
        &mut self,
        _origin: UpdateOrigin,
        table: TableId,
        rows: &[RowId],
        _images: Option<RowImages<'_>>,
    ) {
        let map = self.map;
        if let Ok(mut t) = self.tracker.lock() {
            t.record(table, rows.iter().map(|&r| map.local_index(table, r)));
            t.cover(table, rows.iter().map(|&r| map.local_index(table, r)));
        }
    }
}

/// What one prioritized save writes: per table, the local rows chosen (`None`: the whole
/// table) and their global ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    pub tables: Vec<(TableId, Option<Vec<u64>>, Vec<RowId>)>,
}

impl Selection {
    /// Rows of prioritized tables chosen.
    pub fn prioritized_rows(&self) -> u64 {
        self.tables
            .iter()
            .filter_map(|(_, l, _)| l.as_ref().map(|l| l.len() as u64))
            .sum()
    }
}

/// Choose the rows a prioritized save of `server` writes.
pub fn select(server: &Server, tracker: &PriorityTracker) -> Selection {
    let cfg = server.config();
    let (map, me) = (cfg.shard_map, cfg.server);
    let mut tables = Vec::new();
    for t in 0..cfg.table_rows.len() {
        let table = TableId(t as u32);
        if server.shard(table).is_none() {
            continue;
        }
        if tracker.tracks(table) {
            let local = view(server, table)
                .map(|v| tracker.select(table, v))
                .unwrap_or_default();
            let global = local
                .iter()
                .map(|&l| map.global_row(table, me, l))
                .collect();
            tables.push((table, Some(local), global));
        } else {
            tables.push((table, None, Vec::new()));
        }
    }
    Selection { tables }
}

/// The copy-out source of a prioritized save: the selection's rows and the dense range.
pub fn source<'a>(server: &'a Server, sel: &'a Selection) -> Source<'a> {
    let cfg = server.config();
    let (map, me) = (cfg.shard_map, cfg.server);
    let tables = sel
        .tables
        .iter()
        .filter_map(|(table, local, global)| {
            let shard = server.shard(*table)?;
            Some(SourceTable {
                table: *table,
                layout: shard.layout(),
                data: shard.as_slice(),
                ids: RowIds::Sharded { map, server: me },
                rows: match local {
                    None => RowSelection::All,
                    Some(_) => RowSelection::Only(global),
                },
            })
        })
        .collect();
    let info = server.info();
    let blocks = dense_block_range(info.dense_len, info.servers, me);
    Source {
        server: me,
        tables,
        dense: Some((blocks.start, server.dense())),
    }
}

impl CkptNode {
    /// Track priorities on this node's server from now on (CPR §4.2), with SCAR's saved values
    /// starting from the shard as it is (its initial state, which a restore with no save falls
    /// back to).
    pub fn with_priority(mut self, opts: PriorityOptions) -> Result<Self, CkptServiceError> {
        let mut guard = self.server.write()?;
        let tables = prioritized_tables(&guard, opts.largest_tables);
        let mut tracker = PriorityTracker::new(opts.config, &tables)?;
        reset_to(&guard, &mut tracker, &tables);
        let tracker = Arc::new(Mutex::new(tracker));
        let map = guard.config().shard_map;
        guard.add_observer(Box::new(PriorityObserver::new(tracker.clone(), map)));
        drop(guard);
        self.priority = Some((tracker, Arc::new(tables)));
        Ok(self)
    }

    /// The priority tracker, if this node prioritizes.
    pub fn priority(&self) -> Option<&SharedPriority> {
        self.priority.as_ref().map(|(t, _)| t)
    }

    /// After a full save or a restore: every prioritized row counts as saved as it is in
    /// `server`.
    pub(super) fn reset_priority(&self, server: &Server) -> Result<(), CkptServiceError> {
        if let Some((tracker, tables)) = &self.priority {
            reset_to(server, &mut *tracker.lock().map_err(lock_err)?, tables);
        }
        Ok(())
    }

    /// The body of [`super::CkptApi::save_prioritized`].
    pub(super) async fn save_prioritized_impl(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
    ) -> Result<SaveStarted, CkptServiceError> {
        let Some((tracker, _)) = self.priority.clone() else {
            return Err(CkptServiceError::NoPriority);
        };
        let ckpts = self.ckpts(&location).await?;
        let server_id = self.server.read()?.config().server;
        let coverage_key = ckpts
            .checkpoint_dir(&id)
            .join(&Coverage::file_name(server_id.0))
            .map_err(|e| CkptServiceError::Internal(format!("coverage key: {e}")))?;
        let store = ckpts.store().clone();
        let (sink, upload) = staging::start(
            ckpts,
            id.clone(),
            server_id,
            &self.staging,
            self.gauge.clone(),
            &tokio::runtime::Handle::current(),
        )?;
        let server = self.server.clone();
        // Selection and copy-out under one read guard: the rows chosen are the rows written,
        // and no update lands in between (the pause).
        let copied = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let guard = server.read()?;
            let mut t = tracker.lock().map_err(lock_err)?;
            let sel = select(&guard, &t);
            let rep = sink.copy_out(&source(&guard, &sel))?;
            for (table, local, _) in &sel.tables {
                if let (Some(local), Some(v)) = (local, view(&guard, *table)) {
                    t.saved(*table, local, v);
                }
            }
            let coverage = t.take_coverage(step);
            Ok::<_, CkptServiceError>((rep, coverage, start))
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("copy-out task failed: {e}")))?;
        let ((rep, coverage, start), upload) = super::after_copy_out(copied, upload).await?;
        // Best effort: without it the PLS of what was saved is reported unknown.
        let _ = store
            .put(
                &coverage_key,
                coverage.to_json().into(),
                ftrec_ckpt::PutMode::Overwrite,
            )
            .await;
        let pause_s = start.elapsed().as_secs_f64();
        // `upto: None`: a prioritized save acknowledges nothing in DECK's tracker.
        self.saves.lock().map_err(lock_err)?.insert(
            id,
            Save::Running {
                upload,
                upto: None,
                full: false,
            },
        );
        Ok(SaveStarted {
            rows: rep.rows,
            bytes: rep.bytes,
            pause_s,
        })
    }
}

/// One prioritized save of the whole cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PrioritizedPlan {
    pub id: CheckpointId,
    /// Steps applied to the saved model.
    pub step: u64,
    /// The previous save, whose state the prioritized rows apply to.
    pub parent: CheckpointId,
    pub data_position: DataPosition,
    pub meta: PrioritizedMeta,
}

/// The coordinator's prioritized save: every server saves its prioritized rows into `plan.id`
/// in parallel; once every server's files are durable, one delta-shaped manifest over
/// `plan.parent` (marked with [`PrioritizedMeta`]) is committed and `CURRENT` moves to it. Any
/// server's failure commits nothing.
pub async fn save_cluster_prioritized<C: CkptApi>(
    clients: &[C],
    location: &str,
    ckpts: &Checkpoints,
    plan: PrioritizedPlan,
) -> Result<(Manifest, Vec<SaveStarted>), CkptServiceError> {
    let PrioritizedPlan {
        id,
        step,
        parent,
        data_position,
        meta,
    } = plan;
    let started = join_all(
        clients
            .iter()
            .map(|c| c.save_prioritized(location.to_string(), id.clone(), step)),
    )
    .await;
    let mut pauses = Vec::new();
    let mut first_err = None;
    for s in started {
        match s {
            Ok(p) => pauses.push(p),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    let reports = join_all(clients.iter().map(|c| c.wait(id.clone()))).await;
    if let Some(e) = first_err {
        return Err(e);
    }
    let reports = reports.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut manifest = deck::shard_manifest(
        id,
        CheckpointKind::Delta,
        step,
        Some(parent),
        data_position,
        reports,
    );
    meta.store_in(&mut manifest);
    ckpts.commit(&manifest).await?;
    Ok((manifest, pauses))
}

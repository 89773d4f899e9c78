//! The checkpoint store of every saving strategy (`full`, `deck`, and any strategy that
//! saves): the servers' checkpoint service (`ftrec-ps::ckpt`) writes and reads the shards, the
//! coordinator only decides, commits and restores. The strategy's actions say what to save
//! ([`Action::SaveFull`], [`Action::SaveDelta`]) and whether training waits for the commit;
//! nothing here depends on which strategy runs.
//!
//! - A save asks every server to copy its rows out (a full: the whole shard; a delta: the rows
//!   its tracker saw touched since its last durable save, DECK §3.1) into its staging pipeline;
//!   that copy-out is the only pause a strategy that resumes at once pays (DECK §3.2). A
//!   background task waits until every server's files are durable, and the coordinator then
//!   commits one manifest for the cluster (kind, step, parent, data position) and moves
//!   `CURRENT`. A strategy that keeps training paused until [`Event::SaveFinished`] (`full`)
//!   makes the coordinator wait for that commit, and the whole wait is its pause. One save is in
//!   flight at a time; [`Action::AwaitSave`] waits for it.
//! - A server lost before the commit: the save is dropped (its files are deleted once its
//!   uploads end) and the strategy restores the newest *committed* point, so a kill during a
//!   write never leaves a half-written checkpoint in the lineage.
//! - After a commit, what no live lineage needs is collected: by the merger (DECK §3.3) when the
//!   strategy merges, which is its own process (`EXE ckpt merge LOCATION --stride S ... --gc`),
//!   started after a commit when none is running, and otherwise by a background task here. A
//!   recovery stops both first, so nothing is collected while servers read a lineage. A merger
//!   killed mid-merge leaves files without a manifest, which the next merge of the run removes.
//! - Recovery: every server loads the lineage of the committed checkpoint (full + merged +
//!   deltas) in parallel, and the data position in its manifest rewinds the workers; with
//!   nothing committed, every server resets itself to the initial state.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ftrec_ckpt::cpr::PrioritizedMeta;
use ftrec_ckpt::deck::{self, checkpoint_id, shard_manifest, Lineage, Node, Retention};
use ftrec_ckpt::format::ExtractStats;
use ftrec_ckpt::incr::{self, ExtractConfig, PieceScheme, PieceSpec, QuantBits};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::snapshot::ShardReport;
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition, Manifest};
use ftrec_ps::ckpt::grpc::CkptGrpcClient;
use ftrec_ps::ckpt::{restore_cluster, CkptApi, CkptServiceError, SaveStarted};
use ftrec_strategy::{Action, CheckpointRef, Event, PieceLayout};

use super::Coordinator;
use crate::merger::MergerArgs;
use crate::plan::BatchPlan;
use crate::report::EventKind;
use crate::spec::MergeSettings;
use crate::worker::position_after;
use crate::{ClusterError, Phase, Role};

/// How long the end of a run waits for the merger and for dropped saves' uploads to end. (A
/// save's uploads are waited for as long as [`RunConfig::save_wait`] says.)
const FINISH_WAIT: Duration = Duration::from_secs(60);

/// The store side of a run whose strategy saves.
pub(super) struct StoreState {
    pub location: String,
    pub ckpts: Checkpoints,
    /// One checkpoint-service client per server, in server order (reconnected after every
    /// replacement).
    pub clients: Vec<CkptGrpcClient>,
    pub inflight: Option<Inflight>,
    /// The newest committed checkpoint: the parent of the next delta or piece.
    pub committed: Option<CheckpointId>,
    /// The full the newest committed state grows from: the parent of a differential piece.
    pub base: Option<CheckpointId>,
    /// Files of that full, per server (what a restore of it opens: IncrCP §4.5's `R_base`).
    pub base_files: std::collections::HashMap<ftrec_core::ServerId, u64>,
    /// Incremental pieces committed, what their extraction rounds did (IncrCP §4.3) and the
    /// largest quantization error of their rows (Check-N-Run).
    pub pieces: u64,
    pub extraction: Option<ExtractStats>,
    pub quant_max_abs_error: Option<f64>,
    /// The newest commit, when it is a chunk-list piece: garbage collection also removes the
    /// files its list no longer points into (IncrCP §4.4).
    pub list_head: Option<CheckpointId>,
    /// The store's lineage as this run knows it: read once, when garbage is first collected,
    /// then kept in step by every commit and collection, so that a collection after a commit
    /// reads nothing (DECK §4.3 decides what is live from manifests only). Re-reading the
    /// store on every commit made each save cost O(chain) listings and manifest reads.
    pub lineage: Option<Lineage>,
    pub merger: Option<MergerProc>,
    /// The strategy's merger, if it merges (then the merger collects garbage too).
    pub merge: Option<MergeSettings>,
    /// Garbage collection after a commit, when no merger does it: its task returns the
    /// checkpoints it could not delete (back into `lineage`, for the next pass).
    pub gc: Option<tokio::task::JoinHandle<Vec<Node>>>,
    /// A commit happened while a collection ran: collect again when it ends.
    pub gc_pending: bool,
    /// Merger passes that ended normally, and the checkpoints they wrote.
    pub merges: u64,
    pub merged_written: u64,
    /// A commit happened while the merger ran: run another pass when it ends.
    pub merge_pending: bool,
    pub fulls: u64,
    pub deltas: u64,
    pub copy_pause_s: f64,
    /// The store's writer lease, held for the whole run.
    pub lease: Option<super::lease::LeaseKeeper>,
    /// Dropped saves whose files are deleted once their uploads end (the end of the run
    /// waits for them).
    pub discards: Vec<tokio::task::JoinHandle<()>>,
}

/// Why a failed commit's files stay in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepFiles {
    /// Another job owns the store now: this run writes (and deletes) nothing more.
    Fenced,
    /// `CURRENT` may name it: a resume finds out.
    MayBeCurrent,
}

/// A save whose rows are copied out and whose uploads are still running.
pub(super) struct Inflight {
    id: CheckpointId,
    kind: CheckpointKind,
    /// An incremental piece: how it is laid out.
    piece: Option<PieceSpec>,
    step: u64,
    parent: Option<CheckpointId>,
    position: DataPosition,
    pause_s: f64,
    /// Bytes copied out: what sizes the wait for the uploads.
    bytes: u64,
    /// A prioritized partial save (CPR §4.2): the manifest is marked with this.
    prioritized: Option<PrioritizedMeta>,
    task: tokio::task::JoinHandle<Result<Vec<ShardReport>, String>>,
}

/// The merger process and what it has said.
pub(super) struct MergerProc {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// It announced a write (the phase kill `merger=0@phase=merge` waits for this).
    writing: bool,
    /// Checkpoints it wrote so far.
    written: u64,
    /// The merge phase was entered for this pass (kills fire once per pass).
    entered: bool,
}

/// The data position every manifest records: the global batches in the saved model, the
/// training samples they hold and where the stream stands after them (a synthetic sample
/// index, or on TSV data the plan's file, byte offset, line and epoch).
fn position_json(
    batch: usize,
    batches: u64,
    plan: Option<&mut BatchPlan>,
) -> Result<DataPosition, ClusterError> {
    let (position, samples) = match plan {
        Some(p) => p.after(batches)?,
        None => (position_after(batch, batches), batches * batch as u64),
    };
    Ok(DataPosition::Json(serde_json::json!({
        "batches": batches,
        "samples": samples,
        "position": position,
    })))
}

fn batches_of(m: &Manifest) -> Result<u64, ClusterError> {
    match &m.data_position {
        DataPosition::Json(v) => v.get("batches").and_then(|b| b.as_u64()),
        _ => None,
    }
    .ok_or_else(|| {
        ClusterError::Checkpoint(format!(
            "checkpoint {} has no batch count in its data position (not written by a cluster run)",
            m.id
        ))
    })
}

/// The manifest of the checkpoint that holds the state `id` names: `id`'s own, or, when the
/// merger has replaced that delta (DECK §3.3) and collected it, the one of the merged checkpoint
/// that stands for it now (a merged manifest carries its last input's data position).
pub(super) async fn state_manifest(
    ckpts: &Checkpoints,
    id: &CheckpointId,
) -> ftrec_ckpt::Result<Manifest> {
    match ckpts.read_manifest(id, None).await {
        Err(ftrec_ckpt::CkptError::NotFound { .. }) => {
            let chain = deck::select_chain(ckpts, &deck::RestoreAt::Id(id.clone()), false).await?;
            chain
                .into_iter()
                .last()
                .ok_or_else(|| ftrec_ckpt::CkptError::InvalidCheckpoint {
                    id: id.to_string(),
                    reason: "its lineage is empty".into(),
                })
        }
        r => r,
    }
}

impl StoreState {
    /// Open the store of `location` (S3 settings from the AWS environment variables) and
    /// claim its writer lease ([`super::lease::claim`]).
    pub fn open(
        rt: &tokio::runtime::Runtime,
        location: String,
        cfg: &crate::RunConfig,
        resume: bool,
    ) -> Result<StoreState, ClusterError> {
        let strategy = &cfg.strategy;
        let store = rt
            .block_on(location::open(&location, &LocationOptions::from_env()))
            .map_err(|e| ClusterError::Checkpoint(format!("store {location}: {e}")))?;
        let ckpts = Checkpoints::new(store);
        let what = format!(
            "ftrec run ({}, preset {}, {} servers)",
            strategy.name(),
            cfg.preset.name,
            cfg.servers
        );
        let (keeper, generation) =
            super::lease::claim(rt, &ckpts, &location, &what, cfg.lease_ttl, resume)?;
        Ok(StoreState {
            lease: Some(keeper),
            location,
            ckpts: ckpts.with_generation(generation),
            clients: Vec::new(),
            inflight: None,
            committed: None,
            base: None,
            base_files: Default::default(),
            pieces: 0,
            extraction: None,
            quant_max_abs_error: None,
            list_head: None,
            lineage: None,
            merger: None,
            merge: strategy.merger(),
            gc: None,
            gc_pending: false,
            merges: 0,
            merged_written: 0,
            merge_pending: false,
            fulls: 0,
            deltas: 0,
            copy_pause_s: 0.0,
            discards: Vec::new(),
        })
    }
}

impl Coordinator {
    fn store_mut(&mut self) -> Result<&mut StoreState, ClusterError> {
        self.store
            .as_mut()
            .ok_or_else(|| ClusterError::Protocol("this run has no checkpoint store".into()))
    }

    /// Connect to every server and load `checkpoint` (or the initial state); returns the
    /// restored batch count.
    pub(super) fn load(&mut self, checkpoint: &Option<CheckpointRef>) -> Result<u64, ClusterError> {
        let addrs = self.server_addrs.clone();
        let clients = crate::worker::connect_all(&addrs, &self.cfg.auth);
        self.clients = Some(self.rt.block_on(clients)?);
        if self.ec.is_some() {
            self.ec_before_restore()?;
        }
        let batches = match checkpoint {
            Some(c) => self.store_restore(&c.id),
            None => self.store_reset(),
        }?;
        if self.ec.is_some() {
            self.ec_after_restore()?;
        }
        Ok(batches)
    }

    /// Connect to every server's checkpoint service (after a start or a replacement).
    pub(super) fn connect_store_clients(&mut self) -> Result<(), ClusterError> {
        if self.store.is_none() {
            return Ok(());
        }
        let addrs = self.server_addrs.clone();
        let auth = self.cfg.auth.clone();
        let clients = self.rt.block_on(async {
            let mut out = Vec::with_capacity(addrs.len());
            for a in addrs {
                out.push(
                    CkptGrpcClient::connect_with(a.clone(), &auth)
                        .await
                        .map_err(|e| ClusterError::Checkpoint(format!("server at {a}: {e}")))?,
                );
            }
            Ok::<_, ClusterError>(out)
        })?;
        // A server started without `--ckpt-staging` has no checkpoint service: say so now
        // rather than fail every save. A `wait` for a save nobody started is the cheapest
        // question the service answers (with "unknown save").
        let probe =
            CheckpointId::new("probe").map_err(|e| ClusterError::Checkpoint(e.to_string()))?;
        for (i, c) in clients.iter().enumerate() {
            if let Err(CkptServiceError::Remote { code, .. }) =
                self.rt.block_on(c.wait(probe.clone()))
            {
                if code == "Unimplemented" {
                    return Err(ClusterError::Config(format!(
                        "server {i} at {} does not serve checkpoints: start it with \
                         --ckpt-staging DIR for --strategy {}",
                        self.server_addrs[i],
                        self.cfg.strategy.name()
                    )));
                }
            }
        }
        self.store_mut()?.clients = clients;
        Ok(())
    }

    /// Start a save of `kind` at strategy step `step`: every server copies its rows out (the
    /// pause), then the uploads go on in the background. Returns the strategy's reaction to a
    /// save that failed at once; a started save reports through [`Self::poll_store`].
    pub(super) fn store_save(&mut self, kind: CheckpointKind, step: u64) -> Vec<Action> {
        self.store_save_as(kind, step, None, None)
    }

    /// A prioritized partial save (CPR §4.2) at strategy step `step`: every server copies out
    /// the rows its priority rule values most; committed as a delta-shaped checkpoint over the
    /// newest committed one, marked with the rule.
    pub(super) fn store_save_prioritized(&mut self, step: u64) -> Vec<Action> {
        let meta =
            crate::cpr::ServerPriority::of_strategy(&self.cfg.strategy).map(|p| PrioritizedMeta {
                priority: p.priority,
                r: p.r,
            });
        if meta.is_none() {
            let reason = format!(
                "strategy {} asked for a prioritized save but its servers track no priority",
                self.strategy.name()
            );
            self.event(EventKind::CheckpointFailed, None, reason.clone());
            return self.strategy.on(&Event::SaveFailed { step, reason });
        }
        self.store_save_as(CheckpointKind::Delta, step, meta, None)
    }

    /// [`Self::store_save`] of an incremental piece laid out as `layout` says.
    pub(super) fn store_save_piece(&mut self, layout: PieceLayout, step: u64) -> Vec<Action> {
        match piece_spec(layout) {
            Ok(spec) => self.store_save_as(CheckpointKind::Delta, step, None, Some(spec)),
            Err(e) => {
                self.event(EventKind::CheckpointFailed, None, e.to_string());
                self.strategy.on(&Event::SaveFailed {
                    step,
                    reason: e.to_string(),
                })
            }
        }
    }

    fn store_save_as(
        &mut self,
        kind: CheckpointKind,
        step: u64,
        prioritized: Option<PrioritizedMeta>,
        piece: Option<PieceSpec>,
    ) -> Vec<Action> {
        let what = match prioritized
            .as_ref()
            .map(|m| format!("prioritized ({})", m.priority))
            .or_else(|| piece.as_ref().map(|p| format!("{} piece", p.scheme.name())))
        {
            Some(w) => w,
            None => kind.name().to_string(),
        };
        self.event(
            EventKind::CheckpointStart,
            None,
            format!("{what} at step {step}"),
        );
        let t0 = Instant::now();
        let attempt = self.attempt_base + self.recoveries;
        let id = match prioritized {
            Some(_) => CheckpointId::new(format!("{step:020}-prioritized-a{attempt}"))
                .expect("a valid key segment"),
            None => checkpoint_id(step, kind, attempt),
        };
        let result =
            position_json(self.cfg.batch, self.batches, self.plan.as_mut()).and_then(|position| {
                self.start_save(kind, piece, step, id.clone(), position, t0, prioritized)
            });
        let pause_s = t0.elapsed().as_secs_f64();
        self.pause_s += pause_s;
        // A kill "during the write" lands after the copy-out, while the uploads (and a
        // piece's extraction round) run.
        self.fire_phase_kills(Phase::CheckpointWrite);
        if piece.is_some() {
            self.fire_phase_kills(Phase::PieceWrite);
        }
        match result {
            Ok(()) => Vec::new(),
            Err(e) => {
                self.event(EventKind::CheckpointFailed, None, format!("{id}: {e}"));
                self.strategy.on(&Event::SaveFailed {
                    step,
                    reason: e.to_string(),
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)] // what a save is: kind, piece layout, priority
    fn start_save(
        &mut self,
        kind: CheckpointKind,
        piece: Option<PieceSpec>,
        step: u64,
        id: CheckpointId,
        position: DataPosition,
        t0: Instant,
        prioritized: Option<PrioritizedMeta>,
    ) -> Result<(), ClusterError> {
        let st = self.store.as_ref().ok_or_else(|| {
            ClusterError::Protocol("a save was asked for in a run without a store".into())
        })?;
        if st.inflight.is_some() {
            return Err(ClusterError::Checkpoint(
                "a save is still in flight (the strategy allows one at a time)".into(),
            ));
        }
        // Every kind but a full applies to the newest committed checkpoint; a differential
        // piece to the full it grows from.
        let parent = match (kind, &piece) {
            (CheckpointKind::Full, _) => None,
            (_, Some(p)) if p.since_base() => Some(st.base.clone().ok_or_else(|| {
                ClusterError::Checkpoint(format!(
                    "a {} piece needs a committed full to apply to",
                    p.scheme.name()
                ))
            })?),
            _ => Some(st.committed.clone().ok_or_else(|| {
                ClusterError::Checkpoint(format!(
                    "a {} checkpoint needs a committed checkpoint to apply to",
                    kind.name()
                ))
            })?),
        };
        let clients = st.clients.clone();
        let location = st.location.clone();
        let started: Vec<Result<SaveStarted, String>> = self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, c) in clients.iter().cloned().enumerate() {
                let (loc, id) = (location.clone(), id.clone());
                let prioritized = prioritized.is_some();
                set.spawn(async move {
                    let r = match piece {
                        Some(spec) => c.save_piece(loc, id, step, spec).await,
                        None if prioritized => c.save_prioritized(loc, id, step).await,
                        None => c.save(loc, id, kind, step).await,
                    };
                    (i, r.map_err(|e| format!("server {i}: {e}")))
                });
            }
            let mut out: Vec<Option<Result<SaveStarted, String>>> =
                clients.iter().map(|_| None).collect();
            while let Some(r) = set.join_next().await {
                if let Ok((i, r)) = r {
                    out[i] = Some(r);
                }
            }
            out.into_iter()
                .map(|r| r.unwrap_or_else(|| Err("the save task failed".into())))
                .collect()
        });
        let pause_s = t0.elapsed().as_secs_f64();
        let first_err = started.iter().find_map(|r| r.as_ref().err().cloned());
        let ok: Vec<usize> = (0..started.len()).filter(|&i| started[i].is_ok()).collect();
        let copied: (u64, u64) = started
            .iter()
            .flatten()
            .fold((0, 0), |(r, b), s| (r + s.rows, b + s.bytes));
        // Wait for the uploads of every server that started, even after a failure, so that
        // none is left running and a failed save's files can be removed.
        let waiters: Vec<(usize, CkptGrpcClient)> =
            ok.iter().map(|&i| (i, clients[i].clone())).collect();
        let wait_id = id.clone();
        let task = self.rt.spawn(async move {
            let mut reports = Vec::new();
            let mut err = None;
            for (i, c) in waiters {
                match c.wait(wait_id.clone()).await {
                    Ok(r) => reports.push(r),
                    Err(e) => {
                        err.get_or_insert(format!("server {i}: {e}"));
                    }
                }
            }
            match err {
                Some(e) => Err(e),
                None => Ok(reports),
            }
        });
        let inflight = Inflight {
            id: id.clone(),
            kind,
            piece,
            step,
            parent,
            position,
            pause_s,
            bytes: copied.1,
            prioritized,
            task,
        };
        if let Some(e) = first_err {
            self.discard(inflight);
            return Err(ClusterError::Checkpoint(e));
        }
        self.event(
            EventKind::CheckpointCopied,
            None,
            format!(
                "{id}: {} rows, {} bytes copied out in {pause_s:.3}s",
                copied.0, copied.1
            ),
        );
        self.store_mut()?.inflight = Some(inflight);
        Ok(())
    }

    /// Drop a save that will never commit: once its uploads end, delete its files.
    fn discard(&mut self, inflight: Inflight) {
        let Some(st) = self.store.as_mut() else {
            return;
        };
        let ckpts = st.ckpts.clone();
        let Inflight { id, task, .. } = inflight;
        st.discards.push(self.rt.spawn(async move {
            let _ = task.await;
            let _ = ckpts.delete_checkpoint(&id).await;
        }));
    }

    /// Whether a save is copied out and still uploading.
    pub(super) fn save_in_flight(&self) -> bool {
        self.store.as_ref().is_some_and(|s| s.inflight.is_some())
    }

    /// Training waits for the save in flight to commit: the wait is a pause (and part of the
    /// save's cost the strategy hears of). Returns the strategy's reaction.
    pub(super) fn wait_for_save(&mut self) -> Vec<Action> {
        let t0 = Instant::now();
        let actions = self.poll_store(true);
        let waited = t0.elapsed().as_secs_f64();
        self.pause_s += waited;
        self.upload_wait_s += waited;
        actions
    }

    /// Commit the save in flight if its uploads are done (or, with `block`, once they are);
    /// returns the strategy's reaction.
    pub(super) fn poll_store(&mut self, block: bool) -> Vec<Action> {
        let t0 = Instant::now();
        let mut actions = self.poll_merger();
        self.poll_gc();
        let Some(st) = self.store.as_mut() else {
            return actions;
        };
        let done = st.inflight.as_ref().is_some_and(|i| i.task.is_finished());
        if !(done || (block && st.inflight.is_some())) {
            return actions;
        }
        let Some(inflight) = st.inflight.take() else {
            return actions;
        };
        let Inflight {
            id,
            kind,
            piece,
            step,
            parent,
            position,
            pause_s,
            bytes: copied_bytes,
            prioritized,
            mut task,
        } = inflight;
        let copy_pause_s = pause_s;
        let ckpts = st.ckpts.clone();
        let servers = self.cfg.servers;
        let wait = self.cfg.save_wait(copied_bytes);
        // A commit failure that forbids deleting the checkpoint.
        let mut keep_files: Option<KeepFiles> = None;
        let mut uploads_ended = false;
        let outcome = self.rt.block_on(async {
            let waited = tokio::time::timeout(wait, &mut task).await;
            uploads_ended = waited.is_ok();
            let reports = match waited {
                Ok(Ok(Ok(r))) => r,
                Ok(Ok(Err(e))) => return Err(e),
                Ok(Err(e)) => return Err(format!("the upload task failed: {e}")),
                Err(_) => {
                    return Err(format!(
                        "the uploads did not end within {}s (--save-timeout-s); the save is dropped once they end",
                        wait.as_secs_f64()
                    ))
                }
            };
            let mut manifest = shard_manifest(id.clone(), kind, step, parent, position, reports);
            if let Some(m) = &prioritized {
                m.store_in(&mut manifest);
            }
            ckpts.commit(&manifest).await.map_err(|e| {
                match &e {
                    ftrec_ckpt::CkptError::Fenced { .. } => keep_files = Some(KeepFiles::Fenced),
                    ftrec_ckpt::CkptError::CommitUncertain { .. } => {
                        keep_files = Some(KeepFiles::MayBeCurrent)
                    }
                    _ => {}
                }
                format!("commit: {e}")
            })?;
            // What the servers' piece indexes say (IncrCP §4.5's restore estimate, extraction,
            // quantization error); a piece whose indexes cannot be read is still committed.
            let sums = if piece.is_some() {
                incr::piece_summaries(&ckpts, &manifest).await.ok()
            } else {
                None
            };
            // What a prioritized save left out, for the PLS that counts what was saved.
            let coverage = if prioritized.is_some() {
                Some(crate::cpr::read_coverage(&ckpts, &id, servers).await)
            } else {
                None
            };
            Ok((manifest, sums, coverage))
        });
        // A wait for the commit is part of what the save cost training.
        let pause_s = if block {
            pause_s + t0.elapsed().as_secs_f64()
        } else {
            pause_s
        };
        match outcome {
            Ok((manifest, sums, coverage)) => {
                let bytes = manifest.data_bytes();
                self.meter_save(bytes, pause_s);
                self.checkpoints += 1;
                self.bytes_written += bytes;
                let mut estimate = None;
                if let Some(st) = self.store.as_mut() {
                    st.committed = Some(id.clone());
                    st.copy_pause_s += copy_pause_s;
                    if let Some(l) = st.lineage.as_mut() {
                        l.commit(&manifest);
                    }
                    st.list_head = piece
                        .filter(|p| p.scheme == PieceScheme::ChunkList)
                        .map(|_| id.clone());
                    match (kind, &piece) {
                        (CheckpointKind::Full, _) => {
                            st.fulls += 1;
                            st.base = Some(id.clone());
                            st.base_files.clear();
                            for f in &manifest.files {
                                *st.base_files.entry(f.content.server()).or_default() += 1;
                            }
                        }
                        (_, Some(p)) => {
                            st.pieces += 1;
                            estimate = st.note_piece(p, sums.as_deref().unwrap_or(&[]));
                        }
                        _ => st.deltas += 1,
                    }
                }
                self.event(
                    EventKind::CheckpointEnd,
                    None,
                    format!("{id} committed ({bytes} bytes)"),
                );
                // The restore estimate first: the strategy's next decision (possibly taken
                // on this very commit) sees it.
                if let Some(read) = estimate {
                    actions.extend(self.strategy.on(&read));
                }
                if let Some(servers) = coverage {
                    actions.extend(self.strategy.on(&Event::SaveCoverage { step, servers }));
                }
                actions.extend(self.strategy.on(&Event::SaveFinished {
                    checkpoint: CheckpointRef {
                        id: id.to_string(),
                        step,
                    },
                    cost_s: pause_s,
                    bytes,
                }));
                self.collect_garbage();
            }
            Err(e) => {
                self.event(EventKind::CheckpointFailed, None, format!("{id}: {e}"));
                match keep_files {
                    Some(KeepFiles::Fenced) => {
                        if let Some(k) = self.store.as_ref().and_then(|s| s.lease.as_ref()) {
                            k.lost(e.clone());
                        }
                    }
                    Some(KeepFiles::MayBeCurrent) => {}
                    // Its files go once its uploads have ended, never under them.
                    None => {
                        let ckpts = ckpts.clone();
                        let gone = self.rt.spawn(async move {
                            if !uploads_ended {
                                let _ = task.await;
                            }
                            let _ = ckpts.delete_checkpoint(&id).await;
                        });
                        if let Some(st) = self.store.as_mut() {
                            st.discards.push(gone);
                        }
                    }
                }
                actions.extend(self.strategy.on(&Event::SaveFailed { step, reason: e }));
            }
        }
        actions
    }

    /// Before a recovery: a save in flight will not commit, and the merger stops (no garbage
    /// collection while the servers read a lineage).
    pub(super) fn store_quiesce(&mut self) {
        let Some(st) = self.store.as_mut() else {
            return;
        };
        if let Some(i) = st.inflight.take() {
            let id = i.id.to_string();
            self.discard(i);
            self.event(
                EventKind::CheckpointFailed,
                None,
                format!("{id}: dropped by the recovery"),
            );
        }
        if let Some(mut m) = self.store.as_mut().and_then(|s| s.merger.take()) {
            let _ = m.child.kill();
            let _ = m.child.wait();
            self.event(
                EventKind::MergerStopped,
                None,
                "stopped for the recovery".into(),
            );
        }
        // A collection under way only deletes what no live lineage needs, manifest first:
        // let it end rather than leave half-deleted checkpoints.
        self.finish_gc();
    }

    /// Every server back to its initial state (a recovery with nothing committed).
    pub(super) fn store_reset(&mut self) -> Result<u64, ClusterError> {
        self.connect_store_clients()?;
        let clients = self.store_mut()?.clients.clone();
        let _ = self.hb_targets.send(Vec::new());
        let reset = self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, c) in clients.into_iter().enumerate() {
                set.spawn(async move { c.reset().await.map_err(|e| format!("server {i}: {e}")) });
            }
            let mut first = None;
            while let Some(r) = set.join_next().await {
                let r = r.unwrap_or_else(|e| Err(format!("the reset task failed: {e}")));
                if let Err(e) = r {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        });
        self.update_heartbeat();
        reset.map_err(|e| ClusterError::Checkpoint(format!("resetting the servers: {e}")))?;
        let st = self.store_mut()?;
        st.committed = None;
        st.base = None;
        Ok(0)
    }

    /// Load checkpoint `id`'s lineage into every server; returns the batch count it holds.
    pub(super) fn store_restore(&mut self, id: &str) -> Result<u64, ClusterError> {
        self.connect_store_clients()?;
        let st = self.store.as_ref().ok_or_else(|| {
            ClusterError::Protocol("a restore was asked for in a run without a store".into())
        })?;
        let id = CheckpointId::new(id.to_string())
            .map_err(|e| ClusterError::Checkpoint(format!("checkpoint id {id:?}: {e}")))?;
        let (clients, location, ckpts) =
            (st.clients.clone(), st.location.clone(), st.ckpts.clone());
        let manifest = self
            .rt
            .block_on(state_manifest(&ckpts, &id))
            .map_err(|e| ClusterError::Checkpoint(e.to_string()))?;
        let batches = batches_of(&manifest)?;
        // The training data continues from the checkpoint's position: it must be the data
        // this run reads.
        let recorded = match &manifest.data_position {
            DataPosition::Json(v) => v.get("position"),
            _ => None,
        };
        crate::plan::check_position(manifest.id.as_str(), recorded, batches, self.plan.as_mut())?;
        // A restoring server holds its shard's write lock while it reads the lineage, and its
        // request handlers wait for that lock on the runtime's threads; heartbeat probes
        // arriving meanwhile would occupy every thread, and a store whose reads need the
        // runtime (S3) would then never finish. No probes during the restore: a server dying
        // now fails the restore call itself.
        let _ = self.hb_targets.send(Vec::new());
        let restored = self.rt.block_on(restore_cluster(&clients, &location, &id));
        self.update_heartbeat();
        restored.map_err(|e| ClusterError::Checkpoint(format!("restoring {id}: {e}")))?;
        // The full the restored state grows from: pieces continue over it.
        let base = if manifest.kind == CheckpointKind::Full {
            Some(id.clone())
        } else if manifest.piece_scheme().is_some() {
            self.rt
                .block_on(incr::select(
                    &ckpts,
                    &ftrec_ckpt::deck::RestoreAt::Id(id.clone()),
                ))
                .ok()
                .map(|c| c.base.id.clone())
        } else {
            None
        };
        if let Some(st) = self.store.as_mut() {
            st.committed = Some(id);
            st.base = base;
        }
        // The chain's manifests were read twice above (whole chains under naive pieces).
        ftrec_ckpt::release_free_memory();
        Ok(batches)
    }

    /// After a commit: start a merger pass (which collects garbage after merging) if the
    /// strategy merges, else collect what no live lineage needs in the background (one pass at
    /// a time; a commit during a pass starts another when it ends).
    fn collect_garbage(&mut self) {
        let Some(st) = self.store.as_mut() else {
            return;
        };
        if st.merge.is_some() {
            self.start_merger();
            return;
        }
        if st.gc.is_some() {
            st.gc_pending = true;
            return;
        }
        st.gc_pending = false;
        let ckpts = st.ckpts.clone();
        if st.lineage.is_none() {
            // Once per run (and again only after a failed read): every later pass works from
            // what the commits add.
            match self.rt.block_on(Lineage::load(&ckpts)) {
                Ok(l) => {
                    st.lineage = Some(l);
                    ftrec_ckpt::release_free_memory();
                }
                Err(e) => {
                    self.event(
                        EventKind::CheckpointFailed,
                        None,
                        format!("garbage collection skipped: reading the lineage: {e}"),
                    );
                    return;
                }
            }
        }
        let Some(lineage) = st.lineage.as_mut() else {
            return;
        };
        // The active lineage only: no older fulls are kept for rollback.
        let dead = lineage.take_dead(&Retention::default());
        let list_head = st.list_head.clone();
        if dead.is_empty() && list_head.is_none() {
            return;
        }
        st.gc = Some(self.rt.spawn(async move {
            // Best effort: what one pass cannot delete goes back into the lineage and the next
            // pass tries again. Manifest first (`delete_checkpoint`), so a half-deleted
            // checkpoint is never taken for a readable one.
            // Checkpoints a live reader (eval, export) holds stay (`lease::sweep`).
            let ids: Vec<CheckpointId> = dead.iter().map(|n| n.id.clone()).collect();
            let Ok(rep) = ftrec_ckpt::lease::sweep(&ckpts, &ids).await else {
                return dead;
            };
            let kept: Vec<Node> = dead
                .into_iter()
                .filter(|n| !rep.deleted.contains(&n.id))
                .collect();
            // With a chunk list, also the files no live chunk points into any more (only
            // while nobody reads: a reader's chunks are not in the live list).
            if let (Some(head), 0) = (list_head, rep.readers) {
                let _ = incr::remove_dead_files_of(&ckpts, std::slice::from_ref(&head)).await;
            }
            // Files of saves dropped before the head's commit: some may have landed after the
            // drop deleted them, put by a replaced server that did not know it yet.
            if let (Ok(Some(head)), 0) = (ckpts.read_current().await, rep.readers) {
                let _ = deck::remove_dropped_saves(&ckpts, &head.id).await;
            }
            kept
        }));
    }

    /// A collection ended: what it could not delete is still in the store.
    fn gc_done(&mut self, kept: Vec<Node>) {
        if let Some(l) = self.store.as_mut().and_then(|s| s.lineage.as_mut()) {
            for n in kept {
                l.insert_node(n);
            }
        }
    }

    /// Reap a finished garbage collection; start the next if a commit asked for one.
    fn poll_gc(&mut self) {
        let Some(st) = self.store.as_mut() else {
            return;
        };
        if st.gc.as_ref().is_some_and(|t| t.is_finished()) {
            let pending = st.gc_pending;
            if let Some(gc) = st.gc.take() {
                let kept = self.rt.block_on(gc).unwrap_or_default();
                self.gc_done(kept);
            }
            if pending {
                self.collect_garbage();
            }
        }
    }

    /// Wait for garbage collection, including a pass a commit asked for meanwhile.
    fn finish_gc(&mut self) {
        while let Some(gc) = self.store.as_mut().and_then(|s| s.gc.take()) {
            let kept = self.rt.block_on(gc).unwrap_or_default();
            self.gc_done(kept);
            if self.store.as_ref().is_some_and(|s| s.gc_pending) {
                self.collect_garbage();
            }
        }
    }

    /// Start a merger pass if merging is on and none is running.
    fn start_merger(&mut self) {
        let exe = self.cfg.exe.clone();
        let Some(st) = self.store.as_mut() else {
            return;
        };
        let Some(merge) = st.merge else {
            return;
        };
        if st.merger.is_some() {
            st.merge_pending = true;
            return;
        }
        st.merge_pending = false;
        let mut args = MergerArgs::for_run(
            st.location.clone(),
            merge.stride as usize,
            merge.full_every_deltas,
            merge.mib_per_s,
        );
        // It works for this job's lease only: taken over, the store is not merged by it.
        args.writer_generation = st.ckpts.generation();
        let mut cmd = Command::new(&exe);
        cmd.args(args.to_args());
        // The merger dies with this coordinator: it never merges or collects for a job that
        // is gone (and a paused one cannot outlive its coordinator's death either: SIGKILL
        // ends a stopped process too).
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: only prctl, which is async-signal-safe, runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let spawned = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let (tx, rx) = mpsc::channel();
                if let Some(out) = child.stdout.take() {
                    std::thread::spawn(move || {
                        for line in BufReader::new(out).lines().map_while(Result::ok) {
                            if tx.send(line).is_err() {
                                return;
                            }
                        }
                    });
                }
                let pid = child.id();
                st.merger = Some(MergerProc {
                    child,
                    lines: rx,
                    writing: false,
                    written: 0,
                    entered: false,
                });
                self.pids.push(pid);
                self.event(EventKind::MergerStarted, None, format!("pid {pid}"));
            }
            Err(e) => self.event(
                EventKind::MergerFailed,
                None,
                format!("cannot start {}: {e}", exe.display()),
            ),
        }
    }

    /// Reap the merger if it ended, fire a kill scheduled for the merge phase.
    fn poll_merger(&mut self) -> Vec<Action> {
        let mut kill_now = false;
        let mut ended = None;
        let mut written = 0;
        if let Some(m) = self.store.as_mut().and_then(|s| s.merger.as_mut()) {
            if let Ok(Some(status)) = m.child.try_wait() {
                ended = Some(status);
            }
            // After an exit every line it printed is in the channel (or on its way: the
            // reader thread ends with the pipe).
            while let Ok(line) = m.lines.recv_timeout(if ended.is_some() {
                Duration::from_millis(200)
            } else {
                Duration::ZERO
            }) {
                if line.starts_with("writing ") {
                    m.writing = true;
                }
                if line.starts_with("wrote ") {
                    m.written += 1;
                }
            }
            kill_now = m.writing && !m.entered;
            m.entered |= m.writing;
            written = m.written;
        }
        if kill_now && ended.is_none() && self.fire_phase_kills(Phase::Merge) {
            return Vec::new();
        }
        if let Some(status) = ended {
            let mut again = false;
            if let Some(st) = self.store.as_mut() {
                st.merger = None;
                st.merged_written += written;
                if status.success() {
                    st.merges += 1;
                }
                again = st.merge_pending;
            }
            if status.success() {
                self.event(
                    EventKind::MergerFinished,
                    None,
                    format!("{written} written"),
                );
            } else {
                self.event(
                    EventKind::MergerFailed,
                    None,
                    format!("exited with {status}"),
                );
                // A failed or killed merger leaves the lineage as it was; the next commit
                // starts a new pass, which removes its leftovers.
                if let Some(f) = self
                    .failures
                    .iter_mut()
                    .rev()
                    .find(|f| f.role == Role::Merger && f.recovered_s.is_none())
                {
                    let t = self.start.elapsed().as_secs_f64() - f.injected_t_s;
                    f.detected_s.get_or_insert(t);
                    f.replaced_s.get_or_insert(t);
                    f.resumed_s.get_or_insert(t);
                    f.recovered_s.get_or_insert(t);
                    f.detected_by.get_or_insert_with(|| "exit status".into());
                }
            }
            if again {
                self.start_merger();
            }
        }
        Vec::new()
    }

    /// The store's part of the run report.
    pub(super) fn store_report(&self) -> Option<crate::StoreReport> {
        self.store.as_ref().map(|s| crate::StoreReport {
            location: s.location.clone(),
            fulls: s.fulls,
            deltas: s.deltas,
            copy_pause_s: s.copy_pause_s,
            upload_wait_s: self.upload_wait_s,
            merger_passes: s.merges,
            merged_written: s.merged_written,
            pieces: s.pieces,
            decisions: self.strategy.decisions(),
            extraction: s.extraction,
            quant_max_abs_error: s.quant_max_abs_error,
        })
    }

    /// The merger's pid, if one runs.
    pub(super) fn merger_pid(&self) -> Option<u32> {
        Some(self.store.as_ref()?.merger.as_ref()?.child.id())
    }

    /// SIGKILL the merger (fault injection); its pid, if one runs.
    pub(super) fn kill_merger(&mut self) -> Option<u32> {
        let m = self.store.as_mut()?.merger.as_mut()?;
        let pid = m.child.id();
        let _ = m.child.kill();
        Some(pid)
    }

    /// The end of a run: commit the save in flight, let the strategy save the final model
    /// (so the store's `CURRENT` is the model the run ends with), commit that, then let the
    /// merger or garbage collection finish (bounded).
    /// `Err` once the store's lease is lost, or a newer coordinator fenced this one on the
    /// servers: the run stops writing.
    pub(super) fn check_lease(&self) -> Result<(), ClusterError> {
        if let Some(newer) = self.cfg.auth.fences.replaced_by() {
            return Err(ClusterError::Fenced(format!(
                "a coordinator of epoch {newer} took this job's servers over"
            )));
        }
        match self.store.as_ref().and_then(|s| s.lease.as_ref()) {
            Some(k) => k.check(),
            None => Ok(()),
        }
    }

    /// Give the store's lease up: the run has ended (after its last write).
    pub(super) fn release_lease(&mut self) {
        drop(self.store.as_mut().and_then(|s| s.lease.take()));
    }

    pub(super) fn store_finish(&mut self) -> Result<bool, ClusterError> {
        let done = self.poll_store(true);
        if !self.execute(done)? {
            return Ok(false);
        }
        let before = self.pause_s;
        let last = self.strategy.on(&Event::TrainingDone {
            step: self.step(),
            now_s: self.now(),
        });
        if !self.execute(last)? {
            return Ok(false);
        }
        let done = self.poll_store(true);
        if !self.execute(done)? {
            return Ok(false);
        }
        self.final_save_s = self.pause_s - before;
        // Dropped saves: their files go once their uploads end.
        let discards = self
            .store
            .as_mut()
            .map(|s| std::mem::take(&mut s.discards))
            .unwrap_or_default();
        self.rt.block_on(async {
            let _ = tokio::time::timeout(FINISH_WAIT, async {
                for d in discards {
                    let _ = d.await;
                }
            })
            .await;
        });
        let deadline = Instant::now() + FINISH_WAIT;
        while self.store.as_ref().is_some_and(|s| s.merger.is_some()) {
            self.poll_merger();
            if Instant::now() >= deadline {
                if let Some(mut m) = self.store.as_mut().and_then(|s| s.merger.take()) {
                    let _ = m.child.kill();
                    let _ = m.child.wait();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.finish_gc();
        Ok(true)
    }
}

impl StoreState {
    /// A piece committed with these per-server summaries: add up what they report; returns
    /// IncrCP §4.5's restore estimate of the new state (the slowest server's seconds for the
    /// base and for what lies over it), when the servers measured a read rate.
    fn note_piece(
        &mut self,
        spec: &PieceSpec,
        sums: &[ftrec_ckpt::format::PieceIndex],
    ) -> Option<Event> {
        if spec.scheme == PieceScheme::ChunkList {
            let st = self.extraction.get_or_insert_with(ExtractStats::default);
            for p in sums {
                st.add(&p.stats);
            }
        }
        if spec.quant.is_some() {
            let e = sums
                .iter()
                .map(|p| p.quant_max_abs_error as f64)
                .fold(self.quant_max_abs_error.unwrap_or(0.0), f64::max);
            self.quant_max_abs_error = Some(e);
        }
        // What restoring the newest state reads over its base, on the server that reads the
        // most, and that server's base: bytes and files, no timing (IncrCP §4.5's inputs).
        let p = sums.iter().max_by_key(|p| p.restore_bytes)?;
        Some(Event::RestoreEstimate {
            base_bytes: p.base_bytes,
            base_files: self.base_files.get(&p.server).copied().unwrap_or(0),
            chain_bytes: p.restore_bytes,
            chain_files: incr::newest_restore_files(p),
        })
    }
}

/// The storage side of a strategy's piece layout (the servers' [`PieceSpec`]).
pub fn piece_spec(layout: PieceLayout) -> Result<PieceSpec, ClusterError> {
    let spec = match layout {
        PieceLayout::Incremental => PieceSpec::incremental(),
        PieceLayout::Differential { quant_bits } => {
            let quant = match quant_bits {
                None => None,
                Some(b) => Some(QuantBits::from_bits(b as u32).ok_or_else(|| {
                    ClusterError::Config(format!("{b}-bit quantization (8 or 4 bits)"))
                })?),
            };
            PieceSpec::differential(quant)
        }
        PieceLayout::ChunkList {
            threshold,
            range_rows,
            concat,
        } => PieceSpec {
            scheme: PieceScheme::ChunkList,
            quant: None,
            extract: ExtractConfig {
                threshold,
                range_rows,
                concat,
                ..ExtractConfig::default()
            },
        },
        other => {
            return Err(ClusterError::Config(format!(
                "piece layout {other:?} has no storage scheme"
            )))
        }
    };
    spec.validate()
        .map_err(|e| ClusterError::Config(format!("piece layout {layout:?}: {e}")))?;
    Ok(spec)
}

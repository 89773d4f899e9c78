//! The server side of checkpointing: each server writes and reads its own shard directly to and
//! from the checkpoint store, in parallel across servers, with bounded memory (DECK §3.1–§3.2).
//!
//! - [`TrackerObserver`] feeds a server's updates into a DECK [`Tracker`] (remote-form
//!   tracking: ids recorded on the owning server at push time, DECK §3.1);
//! - [`server_source`] and [`ServerWriter`] connect a [`Server`] to the staging pipeline and to
//!   restore;
//! - [`CkptNode`] is one server's checkpoint service (save full, save delta, save an
//!   incremental piece, wait, restore), called in process; [`CkptApi`] is the trait a
//!   coordinator calls it through;
//! - incremental pieces (`ftrec_ckpt::incr`: naive incremental, Check-N-Run differential,
//!   IncrCP chunk list) go through the same staging pipeline; once a piece's rows are durable
//!   the server finishes it in the background ([`ServerChain::finish_piece`]: the piece index),
//!   then runs a chunk list's extraction round after it, off the commit path
//!   ([`ServerChain::extract`]; the next piece commits the round), and a restore of a piece
//!   rebuilds the server's list so pieces continue from the restored point;
//! - [`cpr`]: CPR's priority tracking on the update path and prioritized partial saves
//!   (cpr.txt §4.2), installed with [`CkptNode::with_priority`];
//! - [`grpc`]: the same calls over the wire ([`grpc::ckpt_service`], [`grpc::CkptGrpcClient`]);
//! - [`save_cluster`] and [`restore_cluster`]: the coordinator's side, which drives every
//!   server and commits one manifest for the whole cluster.
//!
//! A save returns once the server's rows are copied out (the pause); the upload goes on in the
//! background and [`CkptApi::wait`] reports when its files are durable. Nothing a server writes
//! is ever committed by the server: only [`save_cluster`] commits, after every server's files
//! are durable, so a server killed mid-write leaves unreferenced files and no checkpoint.

pub mod cpr;
pub mod grpc;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use ftrec_ckpt::deck::{
    self, staging, ConsumerId, MemGauge, RestoreAt, RowSelection, ShardWriter, Source, SourceTable,
    StagingOptions, TrackedRows, Tracker,
};
use ftrec_ckpt::incr::{self, PieceSpec, ServerChain};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::snapshot::{RowIds, ShardReport};
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, CkptError, DataPosition, Manifest};
use ftrec_core::prefetch::AHEAD;
use ftrec_core::{RowId, RowLayout, ServerId, ShardMap, TableId};

pub(crate) use crate::join::join_all;

use crate::observer::{PushObserver, RowImages, UpdateOrigin};
use crate::server::dense_block_range;
use crate::update::DenseBlock;
use crate::{PsError, Server, SharedServer};

/// The tracker consumer the checkpointer uses.
pub const CHECKPOINTER: ConsumerId = ConsumerId(0);

/// A tracker shared between the update path and the checkpoint service.
pub type SharedTracker = Arc<Mutex<Tracker>>;

/// Errors of the checkpoint service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CkptServiceError {
    #[error(transparent)]
    Store(#[from] CkptError),
    #[error(transparent)]
    Server(#[from] PsError),
    /// `wait` for a save this server never started (or already reported).
    #[error("no save of checkpoint {id} is known on this server")]
    UnknownSave { id: String },
    /// A prioritized save asked of a server that tracks no priority (CPR §4.2).
    #[error("this server tracks no priority: start it with a priority rule (mfu, ssu or scar) for prioritized saves")]
    NoPriority,
    /// A remote checkpoint service refused or failed the call.
    #[error("checkpoint service replied {code}: {message}")]
    Remote { code: String, message: String },
    #[error("checkpoint service: {0}")]
    Internal(String),
}

/// Records every updated row id into a tracker.
#[derive(Debug, Clone)]
pub struct TrackerObserver {
    tracker: SharedTracker,
}

impl TrackerObserver {
    pub fn new(tracker: SharedTracker) -> Self {
        TrackerObserver { tracker }
    }
}

impl PushObserver for TrackerObserver {
    fn rows_updated(
        &mut self,
        _origin: UpdateOrigin,
        table: TableId,
        rows: &[RowId],
        _images: Option<RowImages<'_>>,
    ) {
        if let Ok(mut t) = self.tracker.lock() {
            t.track(table, rows);
        }
    }
}

/// What `server` saves: every table (all rows, or the `tracked` ones) and its dense range.
pub fn server_source<'a>(server: &'a Server, tracked: Option<&'a TrackedRows>) -> Source<'a> {
    let cfg = server.config();
    let map = cfg.shard_map;
    let me = cfg.server;
    let tables = (0..cfg.table_rows.len())
        .filter_map(|t| {
            let tid = TableId(t as u32);
            let shard = server.shard(tid)?;
            Some(SourceTable {
                table: tid,
                layout: shard.layout(),
                data: shard.as_slice(),
                ids: RowIds::Sharded { map, server: me },
                rows: match tracked {
                    None => RowSelection::All,
                    Some(tr) => RowSelection::Only(tr.of(tid)),
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

/// Writes restored rows into a [`Server`] through its import path.
pub struct ServerWriter<'a> {
    pub server: &'a mut Server,
}

fn ps_to_ckpt(e: PsError) -> CkptError {
    CkptError::InvalidArgument(format!("restore into the server: {e}"))
}

impl ShardWriter for ServerWriter<'_> {
    fn server(&self) -> ServerId {
        self.server.config().server
    }

    fn table_shape(&self, table: TableId) -> Option<(u64, RowLayout)> {
        self.server.shard(table).map(|t| (t.rows(), t.layout()))
    }

    fn write_rows(
        &mut self,
        table: TableId,
        ids: &[RowId],
        words: &[f32],
    ) -> Result<(), CkptError> {
        let cfg = self.server.config();
        let map = cfg.shard_map;
        let me = cfg.server;
        let w = self.server.layout().words();
        // Runs of consecutive local rows go in one import.
        let mut i = 0;
        while i < ids.len() {
            if map.owner(table, ids[i]) != me {
                return Err(CkptError::InvalidArgument(format!(
                    "row {} of table {} is not held by server {}",
                    ids[i], table.0, me.0
                )));
            }
            let first = map.local_index(table, ids[i]);
            let mut j = i + 1;
            while j < ids.len()
                && map.owner(table, ids[j]) == me
                && map.local_index(table, ids[j]) == first + (j - i) as u64
            {
                j += 1;
            }
            // A restored piece's rows are scattered over the table: ask for the row AHEAD on
            // while this run is copied, so that the misses overlap.
            if let (Some(&ahead), Some(shard)) = (ids.get(i + AHEAD), self.server.shard(table)) {
                shard.prefetch_row(map.local_index(table, ahead));
            }
            self.server
                .import_row_words(table, first, &words[i * w..j * w])
                .map_err(ps_to_ckpt)?;
            i = j;
        }
        Ok(())
    }

    fn dense_shape(&self) -> Option<(u64, u64, u32)> {
        let info = self.server.info();
        let blocks = dense_block_range(info.dense_len, info.servers, info.server);
        Some((
            blocks.start,
            info.dense_range.end - info.dense_range.start,
            info.dense_state_per_block as u32,
        ))
    }

    fn write_dense(
        &mut self,
        first_block: u64,
        values: &[f32],
        state: &[f32],
    ) -> Result<(), CkptError> {
        self.server
            .import_dense(&DenseBlock {
                first_block,
                values: values.to_vec(),
                state: state.to_vec(),
            })
            .map(|_| ())
            .map_err(ps_to_ckpt)
    }

    fn shard_map(&self) -> Option<ShardMap> {
        Some(self.server.config().shard_map)
    }
}

/// The answer to a save: the pause is over; the upload goes on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SaveStarted {
    pub rows: u64,
    pub bytes: u64,
    /// Seconds the copy-out held the server.
    pub pause_s: f64,
}

/// What a restore read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RestoreDone {
    pub checkpoints: u64,
    pub files: u64,
    pub bytes: u64,
}

/// One server's checkpoint calls, whatever the transport.
pub trait CkptApi: Send + Sync {
    /// Start a save of `kind` (full or delta) into checkpoint `id` at `location`.
    fn save(
        &self,
        location: String,
        id: CheckpointId,
        kind: CheckpointKind,
        step: u64,
    ) -> impl Future<Output = Result<SaveStarted, CkptServiceError>> + Send;

    /// Start a prioritized partial save into checkpoint `id` (CPR §4.2): the rows the
    /// server's priority rule values most, every table it does not prioritize whole, and the
    /// dense range. A server without a priority rule refuses.
    fn save_prioritized(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
    ) -> impl Future<Output = Result<SaveStarted, CkptServiceError>> + Send;
    /// Start an incremental piece into checkpoint `id` at `location`: the rows touched since
    /// the previous save (since the last full for a differential), laid out as `spec` says.
    fn save_piece(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
        spec: PieceSpec,
    ) -> impl Future<Output = Result<SaveStarted, CkptServiceError>> + Send;

    /// Wait until the save of `id` is durable; its files and bytes, for the manifest.
    fn wait(
        &self,
        id: CheckpointId,
    ) -> impl Future<Output = Result<ShardReport, CkptServiceError>> + Send;

    /// Load the state `id` names at `location` (its lineage: full + merged + deltas, or a base
    /// and its incremental pieces). A checkpoint saved by a different number of servers is
    /// re-sharded: the server keeps the rows and dense blocks the shard map gives it, and
    /// nothing continues from it but a new full.
    fn restore(
        &self,
        location: String,
        id: CheckpointId,
    ) -> impl Future<Output = Result<RestoreDone, CkptServiceError>> + Send;

    /// Go back to the initial state (full recovery with nothing committed yet).
    fn reset(&self) -> impl Future<Output = Result<(), CkptServiceError>> + Send;
}

/// Builds a server's initial state again (rows and dense values from the seed).
pub type InitialState = Arc<dyn Fn() -> Result<Server, String> + Send + Sync>;

enum Save {
    Running {
        upload: staging::PendingUpload,
        /// DECK's tracker segments this save covers (`None`: it acknowledges none).
        upto: Option<u64>,
        /// A full: the base incremental pieces grow from.
        full: bool,
    },
    /// An incremental piece: its upload, then its finishing (the piece index; a chunk list's
    /// extraction round runs after it, off the commit path).
    Piece {
        task: tokio::task::JoinHandle<Result<ShardReport, CkptServiceError>>,
        upto: u64,
        /// Acknowledge the tracked rows once durable (not for a differential: its next piece
        /// saves them again, every row since the full).
        ack: bool,
    },
}

/// One server's checkpoint service, called in process (the gRPC handler wraps the same).
#[derive(Clone)]
pub struct CkptNode {
    server: SharedServer,
    tracker: SharedTracker,
    staging: StagingOptions,
    store_opts: LocationOptions,
    gauge: Arc<MemGauge>,
    stores: Arc<Mutex<HashMap<String, Checkpoints>>>,
    saves: Arc<Mutex<HashMap<CheckpointId, Save>>>,
    /// CPR's priority tracker and the tables it prioritizes ([`CkptNode::with_priority`]).
    priority: Option<(cpr::SharedPriority, Arc<Vec<ftrec_ckpt::cpr::TableSpec>>)>,
    /// The incremental state (base, column, chunk list) of this server's pieces.
    chain: Arc<tokio::sync::Mutex<ServerChain>>,
    initial: Option<InitialState>,
    /// Asked before every write to the store ([`CkptNode::with_fences`]).
    gate: Option<ftrec_ckpt::store::gated::Gate>,
}

impl std::fmt::Debug for CkptNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CkptNode")
            .field("staging", &self.staging)
            .finish()
    }
}

/// A copy-out's outcome: its value, or on failure the upload pipeline's own error when it has
/// one (the more precise: the copy-out only sees the pipeline close), else the copy-out's.
async fn after_copy_out<T>(
    copied: Result<T, CkptServiceError>,
    upload: staging::PendingUpload,
) -> Result<(T, staging::PendingUpload), CkptServiceError> {
    match copied {
        Ok(x) => Ok((x, upload)),
        Err(e) => Err(match upload.wait().await {
            Err(up) => up.into(),
            Ok(_) => e,
        }),
    }
}

fn lock_err<T>(_: T) -> CkptServiceError {
    CkptServiceError::Internal("a lock was poisoned by an earlier panic".into())
}

impl CkptNode {
    /// The service of `server`; installs a tracker observer on it.
    pub fn new(
        server: SharedServer,
        staging: StagingOptions,
        store_opts: LocationOptions,
    ) -> Result<Self, CkptServiceError> {
        let mut tracker = Tracker::new();
        tracker.register(CHECKPOINTER)?;
        let tracker = Arc::new(Mutex::new(tracker));
        let (me, map) = {
            let mut guard = server.write()?;
            guard.add_observer(Box::new(TrackerObserver::new(tracker.clone())));
            (guard.config().server, guard.config().shard_map)
        };
        Ok(CkptNode {
            chain: Arc::new(tokio::sync::Mutex::new(ServerChain::new(me, map))),
            server,
            tracker,
            staging,
            store_opts,
            gauge: MemGauge::new(),
            stores: Arc::default(),
            saves: Arc::default(),
            priority: None,
            initial: None,
            gate: None,
        })
    }

    /// Fence this service's writes by this process's incarnation ([`crate::fence`]): once it
    /// learns it was replaced, every upload, put and delete it would still make (of a save
    /// started before, or one a stale request asks for) is refused before it is sent, so a
    /// zombie's files never land in the store.
    pub fn with_fences(mut self, fences: crate::fence::Fences) -> Self {
        self.gate = Some(Arc::new(move || {
            match (fences.me(), fences.replaced_by()) {
                (Some(me), Some(newer)) => Err(format!(
                    "{} was replaced by epoch {newer}",
                    crate::fence::describe(&me)
                )),
                _ => Ok(()),
            }
        }));
        self
    }

    /// How to build the server's initial state again, for [`CkptApi::reset`].
    pub fn with_initial_state(mut self, initial: InitialState) -> Self {
        self.initial = Some(initial);
        self
    }

    pub fn tracker(&self) -> &SharedTracker {
        &self.tracker
    }

    pub fn gauge(&self) -> &Arc<MemGauge> {
        &self.gauge
    }

    async fn ckpts(&self, location: &str) -> Result<Checkpoints, CkptServiceError> {
        // A fenced process starts nothing on the store; what it started before is stopped at
        // its next write by the gated store.
        if let Some(gate) = &self.gate {
            gate().map_err(|what| CkptError::Fenced { what })?;
        }
        if let Some(c) = self.stores.lock().map_err(lock_err)?.get(location) {
            return Ok(c.clone());
        }
        let mut store = location::open(location, &self.store_opts).await?;
        if let Some(gate) = &self.gate {
            store = Arc::new(ftrec_ckpt::store::gated::GatedStore::new(
                store,
                gate.clone(),
            ));
        }
        let c = Checkpoints::new(store);
        self.stores
            .lock()
            .map_err(lock_err)?
            .insert(location.to_string(), c.clone());
        Ok(c)
    }

    /// Compact the tracker (call between steps, off the update path: DECK §4.2).
    pub fn compact(&self) {
        if let Ok(mut t) = self.tracker.lock() {
            t.compact();
        }
    }

    /// [`CkptApi::restore`]'s work: load checkpoint `id`'s lineage into the server.
    async fn restore_lineage(
        &self,
        location: String,
        id: CheckpointId,
    ) -> Result<RestoreDone, CkptServiceError> {
        let ckpts = self.ckpts(&location).await?;
        let manifest = match ckpts.read_manifest(&id, None).await {
            Ok(m) => m,
            // A delta that merging has since replaced (DECK §3.3): the state it names is
            // restored through the checkpoint that stands for it now.
            Err(CkptError::NotFound { .. }) => {
                let lineage = ftrec_ckpt::deck::Lineage::load(&ckpts).await?;
                let chain = lineage.resolve(&id)?;
                let last = chain.last().ok_or_else(|| CkptError::InvalidCheckpoint {
                    id: id.to_string(),
                    reason: "its lineage resolves to no checkpoint".into(),
                })?;
                ckpts.read_manifest(last, None).await?
            }
            Err(e) => return Err(e.into()),
        };
        let id = if manifest.kind == CheckpointKind::Full {
            manifest.id.clone()
        } else {
            id
        };
        // A full saved by as many servers as this cluster has is also the base incremental
        // pieces grow from; one saved by a different number is re-sharded below (pieces
        // re-shard in `ftrec_ckpt::incr`'s restore).
        let servers = self.server.read()?.config().shard_map.servers();
        let same_shape = manifest.shards.len() as u32 == servers;
        if manifest.piece_scheme().is_some()
            || (manifest.kind == CheckpointKind::Full && same_shape)
        {
            return self.restore_incremental(ckpts, id).await;
        }
        self.chain.lock().await.clear();
        let chain = deck::select_chain(&ckpts, &RestoreAt::Id(id), false).await?;
        // Restore into a copy of the shard's shape first? No: the chain is verified as it is
        // read, and a failed restore leaves the server to be restored again.
        let server = self.server.clone();
        let tracker = self.tracker.clone();
        let node = self.clone();
        let handle = tokio::runtime::Handle::current();
        let stats = tokio::task::spawn_blocking(move || {
            let mut guard = server.write()?;
            let mut w = ServerWriter { server: &mut guard };
            let stats = handle.block_on(deck::restore_chain(&ckpts, &chain, &mut w))?;
            tracker.lock().map_err(lock_err)?.reset();
            // The loaded rows count as saved: CPR's priorities start over.
            node.reset_priority(&guard)?;
            Ok::<_, CkptServiceError>((stats, chain.len() as u64))
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("restore task failed: {e}")))??;
        Ok(RestoreDone {
            checkpoints: stats.1,
            files: stats.0.files_read,
            bytes: stats.0.bytes_read,
        })
    }
}

impl CkptApi for CkptNode {
    async fn save(
        &self,
        location: String,
        id: CheckpointId,
        kind: CheckpointKind,
        _step: u64,
    ) -> Result<SaveStarted, CkptServiceError> {
        if kind == CheckpointKind::Merged {
            return Err(CkptError::InvalidArgument(
                "servers save full or delta checkpoints; merging is the merger's".into(),
            )
            .into());
        }
        let ckpts = self.ckpts(&location).await?;
        let server_id = self.server.read()?.config().server;
        let (sink, upload) = staging::start(
            ckpts,
            id.clone(),
            server_id,
            &self.staging,
            self.gauge.clone(),
            &tokio::runtime::Handle::current(),
        )?;
        let server = self.server.clone();
        let tracker = self.tracker.clone();
        let node = self.clone();
        // The copy-out blocks (it hands chunks on with back-pressure), so it runs off the
        // async workers. The read guard keeps updates out while rows are copied: the pause.
        let copied = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let guard = server.read()?;
            let tracked = tracker.lock().map_err(lock_err)?.take(CHECKPOINTER)?;
            let src = server_source(&guard, (kind == CheckpointKind::Delta).then_some(&tracked));
            let rep = sink.copy_out(&src)?;
            if kind == CheckpointKind::Full {
                // Every row is saved as it is now: CPR's priorities start over.
                node.reset_priority(&guard)?;
            }
            Ok::<_, CkptServiceError>((rep, tracked.upto, start.elapsed().as_secs_f64()))
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("copy-out task failed: {e}")))?;
        let ((rep, upto, pause_s), upload) = after_copy_out(copied, upload).await?;
        self.saves.lock().map_err(lock_err)?.insert(
            id,
            Save::Running {
                upload,
                upto: Some(upto),
                full: kind == CheckpointKind::Full,
            },
        );
        Ok(SaveStarted {
            rows: rep.rows,
            bytes: rep.bytes,
            pause_s,
        })
    }

    async fn save_piece(
        &self,
        location: String,
        id: CheckpointId,
        _step: u64,
        spec: PieceSpec,
    ) -> Result<SaveStarted, CkptServiceError> {
        spec.validate()?;
        let ckpts = self.ckpts(&location).await?;
        let server_id = self.server.read()?.config().server;
        let (sink, upload) = staging::start(
            ckpts.clone(),
            id.clone(),
            server_id,
            &self.staging,
            self.gauge.clone(),
            &tokio::runtime::Handle::current(),
        )?;
        let sink = sink.quantized(spec.quant);
        let server = self.server.clone();
        let tracker = self.tracker.clone();
        // The pause: rows copied out under the read guard, as for a delta.
        let copied = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let guard = server.read()?;
            let tracked = tracker.lock().map_err(lock_err)?.take(CHECKPOINTER)?;
            let src = server_source(&guard, Some(&tracked));
            let rep = sink.copy_out(&src)?;
            Ok::<_, CkptServiceError>((rep, tracked, start.elapsed().as_secs_f64()))
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("copy-out task failed: {e}")))?;
        let ((rep, tracked, pause_s), upload) = after_copy_out(copied, upload).await?;
        let upto = tracked.upto;
        let chain = self.chain.clone();
        let task_id = id.clone();
        // Upload, then finish the piece, in the background while training goes on.
        let task = tokio::spawn(async move {
            let progress = upload.progress().clone();
            let mut report = upload.wait().await?;
            let err = progress.quant_max_abs_error();
            let mut guard = chain.lock().await;
            let done = guard
                .finish_piece(&ckpts, &task_id, &spec, &tracked.tables, &report, err)
                .await?;
            let round = guard.round_pending();
            drop(guard);
            if round {
                // A chunk list's extraction round, off the commit path (IncrCP §4.3): the
                // piece is reported (and committed) without waiting for it; the next piece
                // commits the round, and waits for it only if it is still running then. A
                // failed round is dropped (the next piece commits none: the list as if every
                // comparison was skipped, which restores exactly); the store counts its errors
                // and the server logs the failure.
                tokio::spawn(async move {
                    if let Err(e) = chain.lock().await.extract(&ckpts).await {
                        tracing::warn!(
                            server = server_id.0,
                            "IncrCP extraction round after piece {task_id} failed and was \
                             dropped (the chunk list stays as it was, which restores exactly): \
                             {e}"
                        );
                    }
                });
            }
            report.bytes += done.files.iter().map(|f| f.size).sum::<u64>();
            report.files.extend(done.files);
            report.files.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(report)
        });
        self.saves.lock().map_err(lock_err)?.insert(
            id,
            Save::Piece {
                task,
                upto,
                ack: !spec.since_base(),
            },
        );
        Ok(SaveStarted {
            rows: rep.rows,
            bytes: rep.bytes,
            pause_s,
        })
    }

    async fn save_prioritized(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
    ) -> Result<SaveStarted, CkptServiceError> {
        self.save_prioritized_impl(location, id, step).await
    }

    async fn wait(&self, id: CheckpointId) -> Result<ShardReport, CkptServiceError> {
        let save = self
            .saves
            .lock()
            .map_err(lock_err)?
            .remove(&id)
            .ok_or_else(|| CkptServiceError::UnknownSave { id: id.to_string() })?;
        let (report, upto) = match save {
            Save::Running { upload, upto, full } => {
                let report = upload.wait().await?;
                let mut chain = self.chain.lock().await;
                if full {
                    // A full is the base incremental pieces grow from.
                    chain.set_base(id.clone(), &report);
                } else {
                    // A DECK delta or a prioritized save is no incremental piece: pieces need
                    // a new full.
                    chain.clear();
                }
                (report, upto)
            }
            Save::Piece { task, upto, ack } => {
                let report = task.await.map_err(|e| {
                    CkptServiceError::Internal(format!("piece task ended abnormally: {e}"))
                })??;
                // A differential's rows are saved again by its next piece: no acknowledgement.
                (report, ack.then_some(upto))
            }
        };
        // Durable: the tracked rows up to this save need not be saved again.
        if let Some(upto) = upto {
            self.tracker
                .lock()
                .map_err(lock_err)?
                .ack(CHECKPOINTER, upto)?;
        }
        Ok(report)
    }

    async fn restore(
        &self,
        location: String,
        id: CheckpointId,
    ) -> Result<RestoreDone, CkptServiceError> {
        let done = self.restore_lineage(location, id).await;
        ftrec_ckpt::release_free_memory();
        done
    }

    async fn reset(&self) -> Result<(), CkptServiceError> {
        let initial = self.initial.clone().ok_or_else(|| {
            CkptServiceError::Internal(
                "this server was started without a way to rebuild its initial state".into(),
            )
        })?;
        let server = self.server.clone();
        let tracker = self.tracker.clone();
        let node = self.clone();
        let chain = self.chain.clone();
        tokio::task::spawn_blocking(move || {
            let fresh = initial().map_err(CkptServiceError::Internal)?;
            let mut guard = server.write()?;
            guard.reset_from(fresh)?;
            // Nothing saved is this state's base any more.
            chain.blocking_lock().clear();
            // Every row differs from any saved state now: the next delta must not be taken
            // over an older base, so nothing tracked before counts.
            tracker.lock().map_err(lock_err)?.reset();
            // The initial state is what a restore with nothing saved falls back to: CPR's
            // priorities start over from it.
            node.reset_priority(&guard)?;
            Ok::<_, CkptServiceError>(())
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("reset task failed: {e}")))?
    }
}

impl CkptNode {
    /// Restore a full or an incremental piece (through its base) and continue from it: the
    /// tracker starts over (for a differential, from the rows it holds: the next one saves them
    /// again) and the chunk list is the restored one.
    async fn restore_incremental(
        &self,
        ckpts: Checkpoints,
        id: CheckpointId,
    ) -> Result<RestoreDone, CkptServiceError> {
        let sel = incr::select(&ckpts, &RestoreAt::Id(id)).await?;
        let server = self.server.clone();
        let tracker = self.tracker.clone();
        let chain = self.chain.clone();
        let handle = tokio::runtime::Handle::current();
        let pieces = sel.target as u64;
        let out = tokio::task::spawn_blocking(move || {
            let mut guard = server.write()?;
            let mut chain = chain.blocking_lock();
            let mut w = ServerWriter { server: &mut guard };
            let out = handle.block_on(chain.restore(&ckpts, &sel, &mut w))?;
            let mut t = tracker.lock().map_err(lock_err)?;
            t.reset();
            if let Some(rows) = &out.since_base {
                for (table, ids) in rows {
                    t.track(*table, ids);
                }
            }
            Ok::<_, CkptServiceError>(out)
        })
        .await
        .map_err(|e| CkptServiceError::Internal(format!("restore task failed: {e}")))??;
        Ok(RestoreDone {
            checkpoints: 1 + pieces,
            files: out.files,
            bytes: out.bytes + out.base_bytes,
        })
    }
}

/// What the coordinator saves: one checkpoint of the whole cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct SavePlan {
    pub kind: CheckpointKind,
    pub id: CheckpointId,
    /// Steps applied to the saved model.
    pub step: u64,
    /// The checkpoint a delta applies to (`None` for a full).
    pub parent: Option<CheckpointId>,
    pub data_position: DataPosition,
}

/// The coordinator's save: every server saves its shard of `plan.id` in parallel; once every
/// server's files are durable, one manifest (kind, step, parent, data position) is committed
/// and `CURRENT` moves to it. Any server's failure commits nothing.
pub async fn save_cluster<C: CkptApi>(
    clients: &[C],
    location: &str,
    ckpts: &Checkpoints,
    plan: SavePlan,
) -> Result<(Manifest, Vec<SaveStarted>), CkptServiceError> {
    let SavePlan {
        kind,
        id,
        step,
        parent,
        data_position,
    } = plan;
    if (kind == CheckpointKind::Delta) != parent.is_some() {
        return Err(CkptError::InvalidArgument(
            "a delta needs a parent and a full has none".into(),
        )
        .into());
    }
    let started = join_all(
        clients
            .iter()
            .map(|c| c.save(location.to_string(), id.clone(), kind, step)),
    )
    .await;
    commit_saved(
        clients,
        ckpts,
        started,
        kind,
        id,
        step,
        parent,
        data_position,
    )
    .await
}

/// An incremental piece of the whole cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PiecePlan {
    pub id: CheckpointId,
    pub step: u64,
    /// The newest committed checkpoint (the last full for a differential).
    pub parent: CheckpointId,
    pub data_position: DataPosition,
    pub spec: PieceSpec,
}

/// [`save_cluster`] for an incremental piece: every server saves its piece of `plan.id`;
/// once every server's files are durable (and its piece index written; a chunk list's
/// extraction round runs afterwards and is committed by the next piece), one delta manifest is
/// committed.
pub async fn save_piece_cluster<C: CkptApi>(
    clients: &[C],
    location: &str,
    ckpts: &Checkpoints,
    plan: PiecePlan,
) -> Result<(Manifest, Vec<SaveStarted>), CkptServiceError> {
    let started = join_all(
        clients
            .iter()
            .map(|c| c.save_piece(location.to_string(), plan.id.clone(), plan.step, plan.spec)),
    )
    .await;
    commit_saved(
        clients,
        ckpts,
        started,
        CheckpointKind::Delta,
        plan.id,
        plan.step,
        Some(plan.parent),
        plan.data_position,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn commit_saved<C: CkptApi>(
    clients: &[C],
    ckpts: &Checkpoints,
    started: Vec<Result<SaveStarted, CkptServiceError>>,
    kind: CheckpointKind,
    id: CheckpointId,
    step: u64,
    parent: Option<CheckpointId>,
    data_position: DataPosition,
) -> Result<(Manifest, Vec<SaveStarted>), CkptServiceError> {
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
    let manifest = deck::shard_manifest(id, kind, step, parent, data_position, reports);
    ckpts.commit(&manifest).await?;
    Ok((manifest, pauses))
}

/// The coordinator's restore: every server loads the state `id` names, in parallel.
pub async fn restore_cluster<C: CkptApi>(
    clients: &[C],
    location: &str,
    id: &CheckpointId,
) -> Result<Vec<RestoreDone>, CkptServiceError> {
    join_all(
        clients
            .iter()
            .map(|c| c.restore(location.to_string(), id.clone())),
    )
    .await
    .into_iter()
    .collect()
}

//! A worker: the same math as the single-process trainer (`ftrec_worker::LocalTrainer::step`),
//! with rows and dense values pulled from the servers and gradients pushed back.
//!
//! The training stream is cut into global batches of `B` samples, numbered from 1: on
//! synthetic data batch `g` holds samples `(g-1)*B .. g*B`, which the worker generates from
//! `g`; on TSV data it is the `B` training samples after batch `g-1`, and the coordinator's
//! [`crate::plan::BatchPlan`] sends where it starts, which the worker seeks its own reader to.
//! In synchronous mode step `s` (from 1) of `M` workers is
//! batches `(s-1)*M + 1 ..= s*M`, worker `w` taking batch `(s-1)*M + w + 1`, so with `M = 1`
//! a worker reads exactly the batches the single-process trainer reads. In asynchronous mode
//! the coordinator hands the next batch to whichever worker is free.
//!
//! The update it sends is the trainer's: per table the touched rows in id order with their
//! gradients summed in sample order ([`scatter_grads`] into a [`SparseGradAccumulator`]), and
//! the whole dense gradient. The servers apply the optimizer once per row and per dense block,
//! as the trainer does, so with one worker the sharded model equals the single-process model
//! bit for bit.

use ftrec_ps::net::PeerAddr;
use std::io::BufReader;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use ftrec_core::{Batch, Preset, RowId, SparseGradAccumulator, TableId};
use ftrec_data::{BatchSource, Position, Split, SyntheticSource, TsvConfig, TsvReader};
use ftrec_model::{pool_sum, scatter_grads, Dlrm, DlrmConfig, Workspace};
use ftrec_ps::ec::{resolve_txn, run_txn, EcGrpcClient, TxnCursor, TxnId, TxnPhase};
use ftrec_ps::fence::FenceRole;
use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::{PsService, PulledRows, RowRequest, ShardedClient, Update};

use crate::auth::{Auth, JobId, Secret};
use crate::control::{read_line, send_line, BatchTiming, FromWorker, ToWorker, TxnHold};
use crate::ClusterError;

/// A worker's model buffers: the dense model (its values overwritten by each pull), the
/// workspace and the gradient accumulators.
pub struct Compute {
    model: Dlrm,
    ws: Workspace,
    accs: Vec<SparseGradAccumulator>,
    pooled: Vec<f32>,
    dim: usize,
    tables: usize,
}

impl Compute {
    pub fn new(
        preset: &Preset,
        seed: u64,
        batch: usize,
        threads: usize,
    ) -> Result<Self, ClusterError> {
        // The optimizer runs on the servers; the local state layout is irrelevant.
        let opt = ftrec_core::Optimizer::new(preset.dense_optimizer, preset.dense_lr);
        let model = Dlrm::new(DlrmConfig::from_preset(preset), seed, &opt)?;
        let ws = model.workspace(batch, threads)?;
        Ok(Compute {
            model,
            ws,
            accs: (0..preset.table_rows.len())
                .map(|_| SparseGradAccumulator::new(preset.dim))
                .collect(),
            pooled: Vec::new(),
            dim: preset.dim,
            tables: preset.table_rows.len(),
        })
    }

    /// Pool the bags of `batch` from what it pulled and take the pulled dense vector.
    fn pool(&mut self, batch: &Batch, pulled: Pulled) -> Result<(), ClusterError> {
        let values = &mut self.model.params_mut().values;
        pool_pulled(
            batch,
            self.dim,
            self.tables,
            pulled,
            &mut self.pooled,
            Some(values),
        )
    }

    /// What follows the pull: pooling, forward and backward, and the update with its loss.
    fn compute(&mut self, batch: &Batch, pulled: Pulled) -> Result<(Update, f64), ClusterError> {
        self.pool(batch, pulled)?;
        let loss =
            self.model
                .forward_backward(&mut self.ws, &batch.dense, &self.pooled, &batch.labels)?;
        let update = sparse_update(batch, self.dim, self.ws.grad_pooled(), &mut self.accs)?;
        Ok((update.with_dense(0, self.ws.grad_params().to_vec()), loss))
    }

    /// Forward and backward on `batch` against the servers' current model: the update to send
    /// and the batch's mean loss.
    pub async fn gradients(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
    ) -> Result<(Update, f64), ClusterError> {
        self.gradients_timed(client, batch, &mut BatchTiming::default())
            .await
    }

    /// [`Compute::gradients`], adding the time spent pulling and computing to `timing`.
    pub async fn gradients_timed(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
        timing: &mut BatchTiming,
    ) -> Result<(Update, f64), ClusterError> {
        let t0 = std::time::Instant::now();
        let pulled = pull_for(client, batch, true).await?;
        let t1 = std::time::Instant::now();
        timing.pull_s += (t1 - t0).as_secs_f64();
        // On the math pool when the worker runs its math there (`set_compute_threads`).
        let out = ftrec_model::on_pool(|| self.compute(batch, pulled))?;
        timing.compute_s += t1.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Click probabilities of `batch` under the servers' current model.
    pub async fn predict(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
        out: &mut Vec<f32>,
    ) -> Result<(), ClusterError> {
        let pulled = pull_for(client, batch, true).await?;
        ftrec_model::on_pool(|| {
            self.pool(batch, pulled)?;
            self.model
                .predict(&mut self.ws, &batch.dense, &self.pooled, out)?;
            Ok(())
        })
    }
}

/// What computes a batch's update on a worker: its own copy of the preset's DLRM
/// ([`Compute`]), or a model outside this crate (the Python package's embedding client) that
/// is handed the batch and the rows it looks up.
pub trait Trainer {
    /// Forward and backward on global batch `index` (`batch`) against the servers' current
    /// model: the update to send and the batch's mean loss, adding the time spent pulling and
    /// computing to `timing`.
    fn gradients(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
        index: u64,
        timing: &mut BatchTiming,
    ) -> impl std::future::Future<Output = Result<(Update, f64), ClusterError>>;

    /// How global batch `index` ended, after its update was pushed, staged or committed:
    /// `Ok`, or the error the coordinator is told of.
    fn finished(&mut self, _index: u64, _outcome: Result<(), &ClusterError>) {}

    /// The servers' tables were rolled back to their state after the first `batches` global
    /// batches (a recovery from a checkpoint): the batches after those are sent again.
    fn rewound(&mut self, _batches: u64) {}
}

impl Trainer for Compute {
    fn gradients(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
        _index: u64,
        timing: &mut BatchTiming,
    ) -> impl std::future::Future<Output = Result<(Update, f64), ClusterError>> {
        self.gradients_timed(client, batch, timing)
    }
}

/// Pull the rows `batch` looks up (and, given `dense`, the whole dense vector into it) and
/// sum-pool each sample's bags into `pooled` `[batch x tables x dim]`.
pub async fn pull_pooled(
    client: &ShardedClient<GrpcClient>,
    batch: &Batch,
    dim: usize,
    tables: usize,
    pooled: &mut Vec<f32>,
    dense: Option<&mut [f32]>,
) -> Result<(), ClusterError> {
    let pulled = pull_for(client, batch, dense.is_some()).await?;
    pool_pulled(batch, dim, tables, pulled, pooled, dense)
}

/// What a batch pulled: the rows it looks up, per table, and the dense vector if asked for.
pub type Pulled = (Vec<PulledRows>, Option<Vec<f32>>);

/// Pull the rows `batch` looks up, and the whole dense vector if `want_dense`.
pub async fn pull_for(
    client: &ShardedClient<GrpcClient>,
    batch: &Batch,
    want_dense: bool,
) -> Result<Pulled, ClusterError> {
    let requests: Vec<RowRequest> = batch
        .sparse
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.ids.is_empty())
        .map(|(t, f)| RowRequest {
            table: TableId(t as u32),
            rows: f.ids.clone(),
        })
        .collect();
    // Pulls change nothing, so one refused as not ready yet (an ECRec replacement that is
    // still joining) is simply sent again.
    retrying(|| async {
        if want_dense {
            let (rows, dense) = tokio::join!(client.pull_rows(&requests), client.pull_dense());
            Ok((rows?, Some(dense?)))
        } else {
            Ok((client.pull_rows(&requests).await?, None))
        }
    })
    .await
    .map_err(Into::into)
}

/// Sum-pool each sample's bags of `batch` into `pooled` `[batch x tables x dim]` from what
/// it pulled, and copy the pulled dense vector into `dense` (given both).
pub fn pool_pulled(
    batch: &Batch,
    dim: usize,
    tables: usize,
    (rows, pulled): Pulled,
    pooled: &mut Vec<f32>,
    dense: Option<&mut [f32]>,
) -> Result<(), ClusterError> {
    let mut by_table: Vec<Option<&PulledRows>> = vec![None; tables];
    for p in &rows {
        if let Some(slot) = by_table.get_mut(p.table.0 as usize) {
            *slot = Some(p);
        }
    }
    if let (Some(values), Some(pulled)) = (dense, pulled) {
        if pulled.len() != values.len() {
            return Err(ClusterError::Protocol(format!(
                "the servers hold {} dense values, the model has {}",
                pulled.len(),
                values.len()
            )));
        }
        values.copy_from_slice(&pulled);
    }
    let (b, d) = (batch.size, dim);
    pooled.resize(b * tables * d, 0.0);
    pool_sum(
        &batch.sparse,
        b,
        d,
        |t, row: RowId| {
            let p = by_table.get(t).copied().flatten()?;
            let i = p.rows.binary_search(&row).ok()?;
            p.values.get(i * d..(i + 1) * d)
        },
        pooled,
    )?;
    Ok(())
}

/// The sparse part of a batch's update from the gradient of its pooled bags `grad_pooled`
/// `[batch x tables x dim]`: per table the touched rows in id order with their gradients summed
/// in sample order, as the single-process trainer sums them (`accs` are reused buffers, one per
/// table).
pub fn sparse_update(
    batch: &Batch,
    dim: usize,
    grad_pooled: &[f32],
    accs: &mut [SparseGradAccumulator],
) -> Result<Update, ClusterError> {
    for acc in accs.iter_mut() {
        acc.clear();
    }
    scatter_grads(&batch.sparse, batch.size, dim, grad_pooled, accs)?;
    let mut update = Update::new();
    for (t, acc) in accs.iter().enumerate() {
        if acc.is_empty() {
            continue;
        }
        let sorted = acc.sorted();
        let mut rows = Vec::with_capacity(sorted.len());
        let mut grads = Vec::with_capacity(sorted.len() * dim);
        for (r, g) in sorted {
            rows.push(r);
            grads.extend_from_slice(g);
        }
        update = update.with_sparse(TableId(t as u32), rows, grads);
    }
    Ok(update)
}

/// Run `call` again while it fails with a retryable error ([`ftrec_ps::PsError::is_retryable`]),
/// backing off from 2 ms to 100 ms between tries; the caller's timeout bounds the whole.
/// Only for calls that change nothing on the servers.
async fn retrying<T, F, Fut>(mut call: F) -> Result<T, ftrec_ps::PsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ftrec_ps::PsError>>,
{
    let mut wait = Duration::from_millis(2);
    loop {
        match call().await {
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// Connect to servers `0..n` at `addrs` (in server order), every request carrying `auth`.
pub async fn connect_all(
    addrs: &[PeerAddr],
    auth: &Auth,
) -> Result<ShardedClient<GrpcClient>, ClusterError> {
    let mut clients = Vec::with_capacity(addrs.len());
    for a in addrs {
        clients.push(GrpcClient::connect_with(a.clone(), GrpcConfig::default(), auth).await?);
    }
    Ok(ShardedClient::new(clients).await?)
}

/// Static settings of a worker, sent by the coordinator when the worker joins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSetup {
    pub id: u32,
    pub workers: u32,
    pub preset: Preset,
    pub seed: u64,
    /// Samples per batch.
    pub batch: usize,
    /// Matrix-kernel threads.
    pub threads: usize,
    /// Nice value of the compute threads (0: the math runs on the calling thread, as in the
    /// single-process trainer): the thread that runs the RPCs keeps its priority.
    #[serde(default)]
    pub compute_nice: i32,
    /// Longest a batch's RPCs may take before the batch counts as failed.
    #[serde(with = "crate::spec::millis")]
    pub rpc_timeout: Duration,
    /// ECRec in asynchronous training: every update is a transaction this worker coordinates.
    #[serde(default)]
    pub ec: Option<EcWorker>,
    /// TSV data (none: the synthetic generator): every batch comes with its start.
    #[serde(default)]
    pub data: Option<WorkerData>,
}

/// The TSV data a worker reads: the reader's configuration (the coordinator's paths, which a
/// worker on another host must see at the same place) and the names and sizes of the files the
/// coordinator planned, which the worker checks its own files against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerData {
    pub tsv: TsvConfig,
    pub files: Vec<(String, u64)>,
}

/// Where a worker's batches come from.
enum Source {
    Synthetic(SyntheticSource),
    Tsv(TsvReader),
}

impl Source {
    fn open(setup: &WorkerSetup) -> Result<Source, ClusterError> {
        let Some(data) = &setup.data else {
            return Ok(Source::Synthetic(SyntheticSource::from_preset(
                &setup.preset,
                setup.seed,
            )?));
        };
        let reader = TsvReader::open(data.tsv.clone())?;
        let here = crate::plan::file_fingerprints(reader.files())?;
        if here != data.files {
            let show = |f: &[(String, u64)]| {
                f.iter()
                    .map(|(n, b)| format!("{n} ({b} bytes)"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ClusterError::Config(format!(
                "worker {}: the data files here are {}, the coordinator's are {}",
                setup.id,
                show(&here),
                show(&data.files)
            )));
        }
        Ok(Source::Tsv(reader))
    }

    /// Global batch `index`: generated from its index, or read from `start`.
    fn batch(
        &mut self,
        size: usize,
        index: u64,
        start: Option<&Position>,
    ) -> Result<Batch, ClusterError> {
        match self {
            Source::Synthetic(src) => Ok(src
                .batch_at(Split::Train, first_sample(size, index)?, size)
                .0),
            Source::Tsv(reader) => {
                let start = start.ok_or_else(|| {
                    ClusterError::Protocol(format!(
                        "batch {index} of TSV data came without its start"
                    ))
                })?;
                reader.seek(start)?;
                reader.next_batch(size)?.ok_or_else(|| {
                    ClusterError::Protocol(format!(
                        "batch {index} starts at the end of the data ({start:?})"
                    ))
                })
            }
        }
    }
}

/// A worker's part of ECRec in asynchronous training (ECRec §3.5): its updates are
/// transactions it coordinates over every server ([`ftrec_ps::ec::run_txn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcWorker {
    /// Two-phase commit (off: `--no-2pc`, one phase).
    pub two_phase: bool,
    /// This worker process's incarnation: once it is declared lost, the coordinator fences
    /// its transactions off by it.
    pub epoch: u32,
}

/// Most samples one batch may hold (a setup asking for more is refused before anything is
/// allocated).
pub const MAX_BATCH: usize = 1 << 20;

impl WorkerSetup {
    /// The setup of worker `id` of `workers` in run `cfg`: RPCs time out after `rpc_timeout`,
    /// `ec` for asynchronous ECRec, and the TSV data with the coordinator's batch plan.
    pub fn of_run(
        cfg: &crate::spec::RunConfig,
        (id, workers): (u32, u32),
        rpc_timeout: Duration,
        ec: Option<EcWorker>,
        data: Option<(&TsvConfig, &crate::plan::BatchPlan)>,
    ) -> Result<WorkerSetup, ClusterError> {
        let data = match data {
            Some((tsv, plan)) => Some(WorkerData {
                tsv: tsv.clone(),
                files: crate::plan::file_fingerprints(plan.files())?,
            }),
            None => None,
        };
        Ok(WorkerSetup {
            id,
            workers,
            preset: cfg.preset.clone(),
            seed: cfg.seed,
            batch: cfg.batch,
            threads: cfg.threads,
            compute_nice: cfg.compute_nice,
            rpc_timeout,
            ec,
            data,
        })
    }

    /// Check what a setup asks for before building anything from it.
    pub fn validate(&self) -> Result<(), ClusterError> {
        let bad = |m: String| Err(ClusterError::Protocol(format!("setup: {m}")));
        if self.batch == 0 || self.batch > MAX_BATCH {
            return bad(format!(
                "batch {} must be between 1 and {MAX_BATCH} samples",
                self.batch
            ));
        }
        if self.threads == 0 || self.threads > 256 {
            return bad(format!(
                "threads {} must be between 1 and 256",
                self.threads
            ));
        }
        if !(0..=crate::spec::MAX_COMPUTE_NICE).contains(&self.compute_nice) {
            return bad(format!(
                "compute nice value {} must be between 0 and {}",
                self.compute_nice,
                crate::spec::MAX_COMPUTE_NICE
            ));
        }
        if self.workers == 0 || self.id >= self.workers {
            return bad(format!(
                "worker {} of {} workers is not a worker of the job",
                self.id, self.workers
            ));
        }
        self.preset
            .validate()
            .map_err(|e| ClusterError::Protocol(format!("setup: {e}")))
    }
}

/// First training sample of global batch `index` (from 1); an error for index 0 and for an
/// index whose samples lie past the end of the stream (`u64` samples).
pub fn first_sample(batch: usize, index: u64) -> Result<u64, ClusterError> {
    let out_of_range = || {
        ClusterError::Protocol(format!(
            "batch index {index} is out of range (indices start at 1; with {batch} samples per \
             batch its samples would lie past sample {})",
            u64::MAX
        ))
    };
    let first = index
        .checked_sub(1)
        .and_then(|i| i.checked_mul(batch as u64))
        .ok_or_else(out_of_range)?;
    first.checked_add(batch as u64).ok_or_else(out_of_range)?;
    Ok(first)
}

/// Where the data stream stands after `batches` global batches (the position saved in a
/// checkpoint: the next batch starts here).
pub fn position_after(batch: usize, batches: u64) -> Position {
    Position::Synthetic {
        sample: batches * batch as u64,
    }
}

/// What ends a worker process besides its control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLifetime {
    /// Only the control connection (a worker started by hand).
    Control,
    /// Also end of file on standard input (a worker the coordinator started).
    Stdin,
}

/// The body of a worker process (`ftrec worker --coordinator ADDR --id W`): connect to the
/// coordinator, say hello with `auth`'s token and job id, then answer its commands until it
/// says stop or goes away. Returns `Ok` when the coordinator ends the session, `Err` when it
/// cannot be reached, refuses the worker or breaks the protocol. A worker without a job id
/// takes the coordinator's for its RPCs.
pub fn worker_process(
    coordinator: &PeerAddr,
    id: u32,
    lifetime: WorkerLifetime,
    auth: &Auth,
) -> Result<(), ClusterError> {
    worker_process_with(coordinator, id, lifetime, auth, |setup| {
        set_compute_threads(setup.threads, setup.compute_nice)?;
        Compute::new(&setup.preset, setup.seed, setup.batch, setup.threads)
    })
}

/// Set this process's matrix-kernel threads (`threads`) for a worker. With a `nice` value
/// above 0 the math (the batch's data, pooling, forward and backward, the update and its
/// shares) runs on the math pool, whose threads take that nice value, while the calling
/// thread, which runs the RPCs, keeps its priority: a transaction's messages, on the
/// critical path of every worker behind it, are not queued behind batches being computed
/// (`docs/DESIGN.md`, "Compute below messages"). The digest does not change: which thread
/// runs the math changes no result. Call it before the first batch.
pub fn set_compute_threads(threads: usize, nice: i32) -> Result<(), ClusterError> {
    if nice > 0 {
        ftrec_model::set_gemm_threads_in_pool(threads, move || {
            ftrec_worker::sys::nice_this_thread(nice);
        })?;
    } else {
        ftrec_model::set_gemm_threads(threads)?;
    }
    Ok(())
}

/// [`worker_process`] with the batches' updates computed by the trainer `make` builds from
/// the coordinator's setup (after it is checked).
pub fn worker_process_with<T: Trainer>(
    coordinator: &PeerAddr,
    id: u32,
    lifetime: WorkerLifetime,
    auth: &Auth,
    mut make: impl FnMut(&WorkerSetup) -> Result<T, ClusterError>,
) -> Result<(), ClusterError> {
    let mut auth = auth.clone();
    crate::shard_server::exit_when_fenced(&auth.fences, format!("ftrec worker {id}"));
    if lifetime == WorkerLifetime::Stdin {
        // The launcher holds the other end: when it exits or dies, so does this worker, even
        // in the middle of a batch.
        std::thread::spawn(|| {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
            std::process::exit(0);
        });
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stream = loop {
        // A name is looked up at every try: a coordinator that moved is found.
        match coordinator.connect_std() {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(ClusterError::Io {
                    what: format!("worker {id}: connecting to the coordinator at {coordinator}"),
                    source: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = stream.set_nodelay(true);
    let io = |e: std::io::Error| ClusterError::Io {
        what: format!("worker {id}: talking to the coordinator at {coordinator}"),
        source: e,
    };
    let mut writer = stream.try_clone().map_err(io)?;
    let mut reader = BufReader::new(stream);
    send_line(
        &mut writer,
        &FromWorker::Hello {
            id,
            pid: std::process::id(),
            token: Secret::of(&auth),
            job: auth.job.as_ref().map(|j| j.to_string()),
        },
    )
    .map_err(io)?;
    match read_line::<ToWorker>(&mut reader, "the coordinator").map_err(ClusterError::Protocol)? {
        Some(ToWorker::Welcome { job }) => {
            let theirs = job.as_deref().map(JobId::new).transpose()?;
            match (&auth.job, theirs) {
                (Some(mine), Some(theirs)) if *mine != theirs => {
                    return Err(ClusterError::Protocol(format!(
                        "worker {id} belongs to job {mine}, the coordinator at {coordinator} \
                         to job {theirs}"
                    )))
                }
                (None, theirs) => auth.job = theirs,
                _ => {}
            }
        }
        Some(ToWorker::Refused { reason }) => {
            return Err(ClusterError::Protocol(format!(
                "the coordinator at {coordinator} refused worker {id}: {reason}"
            )))
        }
        None => {
            return Err(ClusterError::Protocol(format!(
                "the coordinator at {coordinator} closed the connection before welcoming worker \
                 {id}"
            )))
        }
        Some(other) => {
            return Err(ClusterError::Protocol(format!(
                "the coordinator at {coordinator} answered worker {id}'s hello with {other:?}"
            )))
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Io {
            what: format!("starting worker {id}'s runtime"),
            source: e,
        })?;
    let mut state: Option<(WorkerSetup, Source, T)> = None;
    // Rollbacks of the tables the coordinator has announced (every batch carries the count).
    let mut rewinds_seen = 0u64;
    let mut client: Option<ShardedClient<GrpcClient>> = None;
    // The newest epoch of each server when `client` was connected.
    let mut connected_epochs: Vec<Option<u64>> = Vec::new();
    let mut ec: Option<EcTxns> = None;
    loop {
        let cmd = read_line::<ToWorker>(&mut reader, "the coordinator")
            .map_err(ClusterError::Protocol)?;
        let reply = match cmd {
            Some(ToWorker::Stop) => return Ok(()),
            // Not a finished job: an orchestrator restarts a worker that exits with an
            // error (an Indexed Job's pod), and the restart connects to the coordinator again.
            None => {
                return Err(ClusterError::Protocol(format!(
                    "the coordinator at {coordinator} closed the connection without stopping                      worker {id} (it ended, failed or replaced this worker)"
                )))
            }
            Some(ToWorker::Setup(setup)) => {
                let built = (|| {
                    if setup.id != id {
                        return Err(ClusterError::Protocol(format!(
                            "worker {id} was sent the setup of worker {}",
                            setup.id
                        )));
                    }
                    setup.validate()?;
                    let source = Source::open(&setup)?;
                    let trainer = make(&setup)?;
                    Ok((*setup, source, trainer))
                })();
                match built {
                    Ok(s) => {
                        state = Some(s);
                        FromWorker::Ready
                    }
                    Err(e) => FromWorker::Failed {
                        index: None,
                        error: e.to_string(),
                    },
                }
            }
            Some(ToWorker::Connect { servers, fences }) => {
                if let Err(e) = auth.fences.merge(&fences) {
                    return Err(ClusterError::Protocol(format!(
                        "the coordinator at {coordinator} sent worker {id} a bad table of \
                         incarnations: {e}"
                    )));
                }
                let old = client.take();
                let timeout = state
                    .as_ref()
                    .map_or(Duration::from_secs(30), |s| s.0.rpc_timeout);
                let (r, ()) = rt.block_on(async {
                    let connect = async {
                        tokio::time::timeout(timeout, connect_all(&servers, &auth))
                            .await
                            .map_err(|_| {
                                ClusterError::Timeout("connecting to the servers".into())
                            })?
                    };
                    tokio::join!(
                        connect,
                        tell_replaced(old.as_ref(), &connected_epochs, &auth.fences)
                    )
                });
                connected_epochs = (0..servers.len() as u32)
                    .map(|s| auth.fences.newest(FenceRole::Server, s))
                    .collect();
                let r = r.and_then(|c| {
                    ec = match state.as_ref().and_then(|s| s.0.ec) {
                        Some(mode) => Some(EcTxns::connect(
                            &rt,
                            &servers,
                            mode,
                            timeout,
                            ec.take(),
                            &auth,
                        )?),
                        None => None,
                    };
                    Ok(c)
                });
                match r {
                    Ok(c) => {
                        client = Some(c);
                        ftrec_obs::set_ready(true);
                        FromWorker::Connected
                    }
                    Err(e) => FromWorker::Failed {
                        index: None,
                        error: e.to_string(),
                    },
                }
            }
            Some(ToWorker::Refused { reason }) => {
                return Err(ClusterError::Protocol(format!(
                    "the coordinator at {coordinator} refused worker {id}: {reason}"
                )))
            }
            Some(ToWorker::Welcome { .. }) => FromWorker::Failed {
                index: None,
                error: format!("worker {id} was welcomed twice"),
            },
            Some(ToWorker::Resume) => FromWorker::Failed {
                index: None,
                error: format!("worker {id} was told to resume but holds no batch"),
            },
            Some(ToWorker::Batch {
                index,
                seq,
                hold,
                start,
                fences,
                rewinds,
                restored,
            }) => {
                if rewinds > rewinds_seen {
                    rewinds_seen = rewinds;
                    if let Some((_, _, trainer)) = state.as_mut() {
                        trainer.rewound(restored);
                    }
                }
                if let Err(e) = auth.fences.merge(&fences) {
                    return Err(ClusterError::Protocol(format!(
                        "the coordinator at {coordinator} sent worker {id} a bad table of \
                         incarnations: {e}"
                    )));
                }
                let mut stop = false;
                let mut at_hold = |phase: TxnHold| {
                    // The coordinator injects its fault, then lets the batch go on.
                    if send_line(&mut writer, &FromWorker::Held { index, phase }).is_err() {
                        stop = true;
                        return;
                    }
                    match read_line::<ToWorker>(&mut reader, "the coordinator") {
                        Ok(Some(ToWorker::Resume)) => {}
                        _ => stop = true,
                    }
                };
                let txns = ec
                    .as_mut()
                    .map(|e| (e, hold.as_slice(), &mut at_hold as &mut dyn FnMut(TxnHold)));
                let r = run_batch(
                    &rt,
                    state.as_mut(),
                    client.as_ref(),
                    txns,
                    id,
                    (index, start.as_ref()),
                    seq,
                );
                if stop {
                    return Ok(());
                }
                if let Some((_, _, trainer)) = state.as_mut() {
                    trainer.finished(index, r.as_ref().map(|_| ()));
                }
                match r {
                    // The batch's data cannot be read: no retry or recovery helps.
                    Err(ClusterError::Data(e)) => FromWorker::BadData {
                        index,
                        error: e.to_string(),
                    },
                    Ok((loss, timing)) => FromWorker::Done {
                        index,
                        loss,
                        timing,
                    },
                    Err(e) => FromWorker::Failed {
                        index: Some(index),
                        error: e.to_string(),
                    },
                }
            }
        };
        send_line(&mut writer, &reply).map_err(io)?;
    }
}

/// How long a worker's word to a replaced server's old process may take (the process may be
/// gone, or silent); the new connections are made meanwhile.
const NOTICE_WAIT: Duration = Duration::from_secs(2);

/// Tell the processes behind `old` (the connections of the last `Connect`, made when the
/// servers' newest epochs were `epochs`) whose server's epoch has risen since that they were
/// replaced: one request each, on the old connection, carrying the table. The coordinator may
/// not reach such a process (a partition) while this worker does; the table fences it
/// ([`ftrec_ps::fence`]). Its refusal is the expected answer and, like any other, ignored.
async fn tell_replaced(
    old: Option<&ShardedClient<GrpcClient>>,
    epochs: &[Option<u64>],
    fences: &ftrec_ps::fence::Fences,
) {
    let Some(old) = old else { return };
    let mut notices = tokio::task::JoinSet::new();
    for (s, c) in old.servers().iter().enumerate() {
        let then = epochs.get(s).copied().flatten();
        if fences.newest(FenceRole::Server, s as u32) > then {
            let c = c.clone();
            notices.spawn(async move {
                let _ = tokio::time::timeout(NOTICE_WAIT, c.info()).await;
            });
        }
    }
    while notices.join_next().await.is_some() {}
}

/// A worker's ECRec clients and transaction counter (asynchronous training).
struct EcTxns {
    mode: EcWorker,
    clients: Vec<EcGrpcClient>,
    /// Sequence number of the last transaction (attempts included) and how the next ones
    /// are admitted (queued, every one: [`TxnCursor::queued`]).
    cursor: TxnCursor,
}

impl EcTxns {
    fn connect(
        rt: &tokio::runtime::Runtime,
        servers: &[PeerAddr],
        mode: EcWorker,
        timeout: Duration,
        previous: Option<EcTxns>,
        auth: &Auth,
    ) -> Result<EcTxns, ClusterError> {
        let _rt = rt.enter();
        let clients = servers
            .iter()
            .map(|a| {
                EcGrpcClient::connect_lazy_with(&a.to_string(), auth)
                    .map(|c| c.with_timeout(timeout))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EcTxns {
            mode,
            clients,
            cursor: previous.map_or_else(|| TxnCursor::queued(0), |p| p.cursor),
        })
    }
}

/// ECRec transactions of a batch: the clients, the phases to hold at, and what to do there.
type Txns<'a> = (&'a mut EcTxns, &'a [TxnHold], &'a mut dyn FnMut(TxnHold));

/// Train on global batch `index` (starting at `start` on TSV data): stage it as `seq`, push
/// it, or (ECRec in asynchronous training) run it as one transaction.
fn run_batch<T: Trainer>(
    rt: &tokio::runtime::Runtime,
    state: Option<&mut (WorkerSetup, Source, T)>,
    client: Option<&ShardedClient<GrpcClient>>,
    txns: Option<Txns<'_>>,
    id: u32,
    (index, start): (u64, Option<&Position>),
    seq: Option<u64>,
) -> Result<(f64, BatchTiming), ClusterError> {
    let Some((setup, source, trainer)) = state else {
        return Err(ClusterError::Protocol(format!(
            "worker {id} was sent batch {index} before its setup"
        )));
    };
    // Refuses index 0 and indices whose samples run past the stream, whatever the source.
    first_sample(setup.batch, index)?;
    let Some(c) = client else {
        return Err(ClusterError::Protocol(format!(
            "worker {id} was sent batch {index} before it was connected"
        )));
    };
    let mut timing = BatchTiming::default();
    let t0 = std::time::Instant::now();
    let batch = ftrec_model::on_pool(|| source.batch(setup.batch, index, start))?;
    timing.data_s = t0.elapsed().as_secs_f64();
    let mut txns = txns;
    // The batch's loss once computed, and its transaction once started (asynchronous ECRec).
    let loss_seen: std::cell::Cell<Option<f64>> = std::cell::Cell::new(None);
    let txn_seen: std::cell::Cell<Option<TxnId>> = std::cell::Cell::new(None);
    let res = rt.block_on(async {
        let work = async {
            let (update, loss) = trainer.gradients(c, &batch, index, &mut timing).await?;
            loss_seen.set(Some(loss));
            let t = std::time::Instant::now();
            // Split with the math (`set_compute_threads`).
            let shares = ftrec_model::on_pool(|| c.split_update(&update));
            drop(update);
            match (seq, txns.as_mut()) {
                (Some(seq), _) => c.stage_shares(seq, id, shares).await?,
                (None, Some((ec, hold, at_hold))) => {
                    let shares: Vec<Arc<Update>> = shares.into_iter().map(Arc::new).collect();
                    ec.cursor.seq += 1;
                    let txn = TxnId {
                        worker: id,
                        epoch: ec.mode.epoch,
                        seq: ec.cursor.seq,
                        priority: index,
                    };
                    txn_seen.set(Some(txn));
                    let split: Vec<TxnPhase> = hold.iter().map(|h| h.phase()).collect();
                    let r = run_txn(
                        &ec.clients,
                        txn,
                        &shares,
                        ec.mode.two_phase,
                        &mut ec.cursor,
                        &split,
                        |phase| {
                            let h = TxnHold::of(phase);
                            if hold.contains(&h) {
                                at_hold(h);
                            }
                            async {}
                        },
                    )
                    .await?;
                    timing.txns = 1;
                    ftrec_obs::metrics()
                        .ecrec_txn_seconds
                        .observe(r.prepare_s + r.commit_s);
                    timing.txn_prepare_s = r.prepare_s;
                    timing.txn_commit_s = r.commit_s;
                    timing.txn_retries = u64::from(r.retries);
                    timing.txns_queued = u64::from(r.queued);
                    timing.txns_behind = u64::from(r.behind);
                    timing.txn_lock_wait_s = r.lock_wait_s;
                    timing.txn_refused_wait_s = r.refused_wait_s;
                    timing.txn_gate_wait_s = r.gate_wait_s;
                    timing.txn_behind_wait_s = r.behind_wait_s;
                    if !r.commit_failures.is_empty() {
                        // Phase 2 failed on some server: settle the transaction everywhere
                        // now. A server that does not answer either is probably lost: the
                        // coordinator is told.
                        let done = resolve_txn(&reachable(&ec.clients), txn).await;
                        timing.txn_resolved = 1;
                        timing.txn_commit_failures =
                            u64::from(done.map_or(true, |d| !d.silent.is_empty()));
                    }
                    timing.txn_row_deltas = r.prepared.row_deltas_sent;
                    timing.txn_dense_deltas = r.prepared.dense_deltas_sent;
                    timing.txn_delta_bytes = r.prepared.bytes_sent;
                }
                (None, None) => {
                    c.push_shares(shares).await?;
                }
            }
            timing.push_s = t.elapsed().as_secs_f64();
            Ok::<f64, ClusterError>(loss)
        };
        tokio::time::timeout(setup.rpc_timeout, work)
            .await
            .map_err(|_| ClusterError::Timeout(format!("worker {id} batch {index}")))?
    });
    let err = match res {
        Ok(loss) => {
            let m = ftrec_obs::metrics();
            m.worker_batches.inc();
            m.worker_batch_seconds.observe(t0.elapsed().as_secs_f64());
            return Ok((loss, timing));
        }
        Err(e) => e,
    };
    // The batch failed after its transaction started (its call timed out half way, or a
    // phase failed): settle the transaction before saying so, so that a batch that
    // committed is not trained again. A retry of phase 1 ran under the latest sequence
    // number; earlier attempts were aborted and commit nowhere.
    let (Some(txn), Some((ec, _, _)), Some(loss)) =
        (txn_seen.get(), txns.as_ref(), loss_seen.get())
    else {
        return Err(err);
    };
    let txn = TxnId {
        seq: ec.cursor.seq,
        ..txn
    };
    let done = rt.block_on(async {
        tokio::time::timeout(setup.rpc_timeout, resolve_txn(&reachable(&ec.clients), txn)).await
    });
    timing.txn_resolved = 1;
    match done {
        Ok(Ok(d)) if d.committed => {
            timing.txns = 1;
            timing.txn_commit_failures = u64::from(!d.silent.is_empty());
            Ok((loss, timing))
        }
        _ => Err(err),
    }
}

/// Every server's client, all reachable as far as the worker knows.
fn reachable(clients: &[EcGrpcClient]) -> Vec<Option<EcGrpcClient>> {
    clients.iter().cloned().map(Some).collect()
}

//! The service a parameter server offers, as seen from a client, and the in-process transport.
//!
//! [`PsService`] is implemented by [`InProcessClient`] (direct calls on a [`SharedServer`], for
//! unit tests and single-process runs) and by [`crate::grpc::GrpcClient`]. Both return the same
//! values and the same [`PsError`]s for the same requests.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ftrec_core::{ModelDigest, TableId};

use crate::update::{
    dedup_requests, ApplyReport, DenseBlock, PulledRows, RowBlock, RowRequest, ServerInfo, Update,
};
use crate::{PsError, Server};

/// One parameter server, as a client calls it.
///
/// Row pulls are deduplicated per request: the reply holds each requested row once, sorted.
/// A push is one update: validated as a whole, then applied with exactly one optimizer step
/// per touched row and dense block, or refused with nothing changed.
pub trait PsService: Send + Sync {
    /// The shape of the server's shard.
    fn info(&self) -> impl Future<Output = Result<ServerInfo, PsError>> + Send;

    /// Values of the requested rows, one [`PulledRows`] per table (tables in order).
    fn pull_rows(
        &self,
        requests: Vec<RowRequest>,
    ) -> impl Future<Output = Result<Vec<PulledRows>, PsError>> + Send;

    /// Dense values of global indices `range` (inside the server's dense range).
    fn pull_dense(
        &self,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<f32>, PsError>> + Send;

    /// Apply one asynchronous update.
    fn push(&self, update: Update) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Deterministic mode: hold `worker`'s contribution to `step`.
    fn stage_step(
        &self,
        step: u64,
        worker: u32,
        update: Update,
    ) -> impl Future<Output = Result<(), PsError>> + Send;

    /// Deterministic mode: apply `step` from its staged contributions summed in `workers`
    /// order.
    fn commit_step(
        &self,
        step: u64,
        workers: Vec<u32>,
    ) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Drop every contribution staged for `step`; returns how many there were.
    fn abort_step(&self, step: u64) -> impl Future<Output = Result<usize, PsError>> + Send;

    /// The shard's part of the model digest.
    fn digest(&self) -> impl Future<Output = Result<ModelDigest, PsError>> + Send;

    /// Whole rows (values and optimizer state) of local indices `local` of `table`, taken at
    /// one instant.
    fn export_rows(
        &self,
        table: TableId,
        local: Range<u64>,
    ) -> impl Future<Output = Result<RowBlock, PsError>> + Send;

    /// Overwrite whole rows; returns the number of rows written.
    fn import_rows(&self, block: RowBlock) -> impl Future<Output = Result<u64, PsError>> + Send;

    /// Dense values and optimizer state of global blocks `blocks`, taken at one instant.
    fn export_dense(
        &self,
        blocks: Range<u64>,
    ) -> impl Future<Output = Result<DenseBlock, PsError>> + Send;

    /// Overwrite dense blocks; returns the number of blocks written.
    fn import_dense(&self, block: DenseBlock) -> impl Future<Output = Result<u64, PsError>> + Send;
}

/// Makes rows that a server does not hold yet available before a pull reads them: a
/// replacement server under ECRec recovery decodes them from the survivors on first access
/// (ECRec §3.4). Installed with [`SharedServer::set_row_source`].
pub trait RowSource: Send + Sync {
    /// Return once every row named in `requests` holds its current words on this server.
    fn ensure_rows<'a>(
        &'a self,
        requests: &'a [RowRequest],
    ) -> Pin<Box<dyn Future<Output = Result<(), PsError>> + Send + 'a>>;
}

type RowSourceSlot = Arc<RwLock<Option<Arc<dyn RowSource>>>>;

/// The requests of [`PsService`], as a [`ServiceGate`] sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceOp {
    Info,
    PullRows,
    PullDense,
    Push,
    StageStep,
    CommitStep,
    AbortStep,
    Digest,
    ExportRows,
    ImportRows,
    ExportDense,
    ImportDense,
}

impl ServiceOp {
    pub fn name(self) -> &'static str {
        match self {
            ServiceOp::Info => "info",
            ServiceOp::PullRows => "pull_rows",
            ServiceOp::PullDense => "pull_dense",
            ServiceOp::Push => "push",
            ServiceOp::StageStep => "stage_step",
            ServiceOp::CommitStep => "commit_step",
            ServiceOp::AbortStep => "abort_step",
            ServiceOp::Digest => "digest",
            ServiceOp::ExportRows => "export_rows",
            ServiceOp::ImportRows => "import_rows",
            ServiceOp::ExportDense => "export_dense",
            ServiceOp::ImportDense => "import_dense",
        }
    }
}

/// Decides which requests of the plain service a server takes, before either transport
/// touches the state: a strategy that keeps state in step with the model (ECRec's parities
/// and replicas) refuses writes that would go around it, and a server that cannot serve yet
/// (an ECRec replacement before its rebuild) answers with a retryable error rather than with
/// state that is not the model's. Installed with [`SharedServer::set_gate`].
pub trait ServiceGate: Send + Sync {
    fn check(&self, op: ServiceOp) -> Result<(), PsError>;
}

type GateSlot = Arc<RwLock<Option<Arc<dyn ServiceGate>>>>;

/// A [`Server`] shared between request handlers: reads (pulls, exports, digests) run
/// concurrently, updates one at a time.
#[derive(Clone)]
pub struct SharedServer {
    inner: Arc<RwLock<Server>>,
    row_source: RowSourceSlot,
    gate: GateSlot,
}

impl std::fmt::Debug for SharedServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedServer")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl SharedServer {
    pub fn new(server: Server) -> Self {
        SharedServer {
            inner: Arc::new(RwLock::new(server)),
            row_source: Arc::new(RwLock::new(None)),
            gate: Arc::new(RwLock::new(None)),
        }
    }

    /// Install (or with `None` remove) the gate every service request passes first.
    pub fn set_gate(&self, gate: Option<Arc<dyn ServiceGate>>) -> Result<(), PsError> {
        *self.gate.write().map_err(|_| poisoned())? = gate;
        Ok(())
    }

    /// Whether the installed [`ServiceGate`] lets `op` through (always, without a gate).
    pub fn check(&self, op: ServiceOp) -> Result<(), PsError> {
        let gate = self.gate.read().map_err(|_| poisoned())?.clone();
        match gate {
            Some(g) => g.check(op),
            None => Ok(()),
        }
    }

    /// Install (or with `None` remove) the source that pulls consult before reading rows.
    pub fn set_row_source(&self, source: Option<Arc<dyn RowSource>>) -> Result<(), PsError> {
        *self.row_source.write().map_err(|_| poisoned())? = source;
        Ok(())
    }

    /// Let the installed [`RowSource`], if any, make the requested rows available.
    pub async fn ensure_rows(&self, requests: &[RowRequest]) -> Result<(), PsError> {
        let source = self.row_source.read().map_err(|_| poisoned())?.clone();
        match source {
            Some(s) => s.ensure_rows(requests).await,
            None => Ok(()),
        }
    }

    pub fn read(&self) -> Result<RwLockReadGuard<'_, Server>, PsError> {
        self.inner.read().map_err(|_| poisoned())
    }

    pub fn write(&self) -> Result<RwLockWriteGuard<'_, Server>, PsError> {
        self.inner.write().map_err(|_| poisoned())
    }

    /// The pull as both transports answer it: deduplicated, sorted rows per table.
    pub fn pull_rows_dedup(&self, requests: &[RowRequest]) -> Result<Vec<PulledRows>, PsError> {
        let parts = dedup_requests(requests);
        let server = self.read()?;
        let dim = server.config().dim;
        let values = server.pull_rows(&parts)?;
        Ok(parts
            .into_iter()
            .zip(values)
            .map(|(p, values)| PulledRows {
                table: p.table,
                rows: p.rows,
                values,
                dim,
            })
            .collect())
    }
}

fn poisoned() -> PsError {
    PsError::Internal("server state lock poisoned by an earlier panic".into())
}

/// Calls a [`SharedServer`] directly.
#[derive(Debug, Clone)]
pub struct InProcessClient {
    server: SharedServer,
}

impl InProcessClient {
    pub fn new(server: SharedServer) -> Self {
        InProcessClient { server }
    }

    pub fn server(&self) -> &SharedServer {
        &self.server
    }
}

impl PsService for InProcessClient {
    async fn info(&self) -> Result<ServerInfo, PsError> {
        self.server.check(ServiceOp::Info)?;
        Ok(self.server.read()?.info())
    }

    async fn pull_rows(&self, requests: Vec<RowRequest>) -> Result<Vec<PulledRows>, PsError> {
        self.server.check(ServiceOp::PullRows)?;
        self.server.ensure_rows(&requests).await?;
        self.server.pull_rows_dedup(&requests)
    }

    async fn pull_dense(&self, range: Range<u64>) -> Result<Vec<f32>, PsError> {
        self.server.check(ServiceOp::PullDense)?;
        self.server.read()?.pull_dense(range)
    }

    async fn push(&self, update: Update) -> Result<ApplyReport, PsError> {
        self.server.check(ServiceOp::Push)?;
        self.server.write()?.push(&update)
    }

    async fn stage_step(&self, step: u64, worker: u32, update: Update) -> Result<(), PsError> {
        self.server.check(ServiceOp::StageStep)?;
        self.server.write()?.stage_step(step, worker, update)
    }

    async fn commit_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        self.server.check(ServiceOp::CommitStep)?;
        self.server.write()?.commit_step(step, &workers)
    }

    async fn abort_step(&self, step: u64) -> Result<usize, PsError> {
        self.server.check(ServiceOp::AbortStep)?;
        Ok(self.server.write()?.abort_step(step))
    }

    async fn digest(&self) -> Result<ModelDigest, PsError> {
        self.server.check(ServiceOp::Digest)?;
        Ok(self.server.read()?.digest())
    }

    async fn export_rows(&self, table: TableId, local: Range<u64>) -> Result<RowBlock, PsError> {
        self.server.check(ServiceOp::ExportRows)?;
        self.server.read()?.export_rows(table, local)
    }

    async fn import_rows(&self, block: RowBlock) -> Result<u64, PsError> {
        self.server.check(ServiceOp::ImportRows)?;
        self.server.write()?.import_rows(&block)
    }

    async fn export_dense(&self, blocks: Range<u64>) -> Result<DenseBlock, PsError> {
        self.server.check(ServiceOp::ExportDense)?;
        self.server.read()?.export_dense(blocks)
    }

    async fn import_dense(&self, block: DenseBlock) -> Result<u64, PsError> {
        self.server.check(ServiceOp::ImportDense)?;
        self.server.write()?.import_dense(&block)
    }
}

/// Either transport, chosen at run time (in-process for single-process runs and tests, gRPC
/// between processes).
#[derive(Debug, Clone)]
pub enum PsClient {
    InProcess(InProcessClient),
    Grpc(Box<crate::grpc::GrpcClient>),
}

macro_rules! delegate {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            PsClient::InProcess($c) => $call.await,
            PsClient::Grpc($c) => $call.await,
        }
    };
}

impl PsService for PsClient {
    async fn info(&self) -> Result<ServerInfo, PsError> {
        delegate!(self, c => c.info())
    }

    async fn pull_rows(&self, requests: Vec<RowRequest>) -> Result<Vec<PulledRows>, PsError> {
        delegate!(self, c => c.pull_rows(requests))
    }

    async fn pull_dense(&self, range: Range<u64>) -> Result<Vec<f32>, PsError> {
        delegate!(self, c => c.pull_dense(range))
    }

    async fn push(&self, update: Update) -> Result<ApplyReport, PsError> {
        delegate!(self, c => c.push(update))
    }

    async fn stage_step(&self, step: u64, worker: u32, update: Update) -> Result<(), PsError> {
        delegate!(self, c => c.stage_step(step, worker, update))
    }

    async fn commit_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        delegate!(self, c => c.commit_step(step, workers))
    }

    async fn abort_step(&self, step: u64) -> Result<usize, PsError> {
        delegate!(self, c => c.abort_step(step))
    }

    async fn digest(&self) -> Result<ModelDigest, PsError> {
        delegate!(self, c => c.digest())
    }

    async fn export_rows(&self, table: TableId, local: Range<u64>) -> Result<RowBlock, PsError> {
        delegate!(self, c => c.export_rows(table, local))
    }

    async fn import_rows(&self, block: RowBlock) -> Result<u64, PsError> {
        delegate!(self, c => c.import_rows(block))
    }

    async fn export_dense(&self, blocks: Range<u64>) -> Result<DenseBlock, PsError> {
        delegate!(self, c => c.export_dense(blocks))
    }

    async fn import_dense(&self, block: DenseBlock) -> Result<u64, PsError> {
        delegate!(self, c => c.import_dense(block))
    }
}

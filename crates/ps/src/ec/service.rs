//! The ECRec service of a node, as its coordinator and its peers call it, and the in-process
//! transport. [`EcClient`] is what a node holds for each peer (server-to-server difference
//! propagation and recovery reads) and what a coordinator holds for each node.

use std::future::Future;
use std::sync::{Arc, Weak};

use ftrec_core::{RowId, ServerId, TableId};

use super::grpc::EcGrpcClient;
use super::node::{downgrade, EcInner, EcNode};
use super::reencode::ReencodeReport;
use super::types::{
    Admission, DeltaBatch, DenseRead, MemberKey, MemberRead, PackedBatch, PrepareReport,
    RebuildStatus, TxnId, TxnOutcome, TxnStatus,
};
use crate::update::{ApplyReport, PulledRows, Update};
use crate::PsError;

/// One ECRec node, as a client calls it. Both transports return the same values and errors.
pub trait EcService: Send + Sync {
    /// Peer addresses (`host:port`) by server id, empty for unknown; sent again with the new
    /// address when a replacement takes over an id.
    fn set_peers(&self, addrs: Vec<String>) -> impl Future<Output = Result<(), PsError>> + Send;

    /// 2PC phase 1 of `step` with its workers' staged contributions summed in `workers`
    /// order: compute, send deltas to parity and replica holders, stage.
    fn prepare(
        &self,
        step: u64,
        workers: Vec<u32>,
    ) -> impl Future<Output = Result<PrepareReport, PsError>> + Send;

    /// 2PC phase 2: apply what `step` staged on this node.
    fn commit(&self, step: u64) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Drop `step` on this node (prepared rows, staged deltas, staged contributions).
    fn abort(&self, step: u64) -> impl Future<Output = Result<usize, PsError>> + Send;

    /// One-phase step (`--no-2pc`): compute, forward, apply.
    fn apply_step(
        &self,
        step: u64,
        workers: Vec<u32>,
    ) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Server to server: a peer's deltas for one step.
    fn stage_deltas(&self, batch: DeltaBatch) -> impl Future<Output = Result<(), PsError>> + Send;

    /// Server to server: words of stripe members at one instant, with the committed step.
    fn read_members(
        &self,
        keys: Vec<MemberKey>,
    ) -> impl Future<Output = Result<MemberRead, PsError>> + Send;

    /// Server to server: a copy of `primary`'s dense range held by this node.
    fn read_dense(
        &self,
        primary: ServerId,
    ) -> impl Future<Output = Result<DenseRead, PsError>> + Send;

    /// Values of lost rows of `table` (owned by servers in `lost`), decoded on this node from
    /// the surviving members of their stripes (ECRec §3.4, degraded read).
    fn degraded_read(
        &self,
        table: TableId,
        rows: Vec<RowId>,
        lost: Vec<ServerId>,
    ) -> impl Future<Output = Result<PulledRows, PsError>> + Send;

    /// On a replacement: copy the dense part, then rebuild rows and parities lock range by
    /// lock range, in the background when `background` (the call returns once the node can
    /// take part in steps), else before returning. `lost`: every server lost at the moment.
    fn start_rebuild(
        &self,
        lost: Vec<ServerId>,
        background: bool,
    ) -> impl Future<Output = Result<(), PsError>> + Send;

    fn rebuild_status(&self) -> impl Future<Output = Result<RebuildStatus, PsError>> + Send;

    /// Before a restore from a checkpoint: [`EcNode::reset_for_restore`].
    fn reset_for_restore(&self) -> impl Future<Output = Result<(), PsError>> + Send;

    /// After every node's restore: [`EcNode::reencode`].
    fn reencode(&self) -> impl Future<Output = Result<ReencodeReport, PsError>> + Send;

    /// Share of the time the background rebuild may work, in millionths
    /// ([`super::EcConfig::rebuild_share_ppm`]); takes effect at once.
    fn set_rebuild_share(&self, ppm: u32) -> impl Future<Output = Result<(), PsError>> + Send;

    /// Asynchronous training, phase 1 of `txn` with this node's share of the update, taking
    /// the node's slot as `admission` says.
    fn txn_prepare(
        &self,
        txn: TxnId,
        share: Arc<Update>,
        admission: Admission,
    ) -> impl Future<Output = Result<PrepareReport, PsError>> + Send;

    /// Phase 2 of `txn`.
    fn txn_commit(&self, txn: TxnId) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Drop `txn` on this node.
    fn txn_abort(&self, txn: TxnId) -> impl Future<Output = Result<(), PsError>> + Send;

    /// `txn` in one phase (`--no-2pc`).
    fn txn_apply(
        &self,
        txn: TxnId,
        share: Arc<Update>,
    ) -> impl Future<Output = Result<ApplyReport, PsError>> + Send;

    /// Fence off `worker`'s incarnations up to `epoch` and report its transactions here.
    fn txn_fence(
        &self,
        worker: u32,
        epoch: u32,
    ) -> impl Future<Output = Result<TxnStatus, PsError>> + Send;

    /// Commit or abort a fenced worker's transaction, or one a resolver blocked.
    fn txn_resolve(
        &self,
        txn: TxnId,
        commit: bool,
    ) -> impl Future<Output = Result<(), PsError>> + Send;

    /// Block `txn` for a resolver and say what this node holds of it
    /// ([`super::resolve_txn`]).
    fn txn_block(&self, txn: TxnId) -> impl Future<Output = Result<TxnOutcome, PsError>> + Send;
}

/// A node held weakly by an in-process client.
#[derive(Clone)]
pub struct WeakNode(Weak<EcInner>);

/// A node reached directly (in-process) or over gRPC.
#[derive(Clone)]
pub enum EcClient {
    /// Holds the node weakly: once every strong handle is dropped, calls fail as they would
    /// for a dead process.
    InProcess(WeakNode),
    Grpc(Box<EcGrpcClient>),
}

impl std::fmt::Debug for EcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EcClient::InProcess(w) => match w.0.upgrade() {
                Some(n) => write!(f, "EcClient::InProcess(server {})", n.me.0),
                None => f.write_str("EcClient::InProcess(dropped)"),
            },
            EcClient::Grpc(c) => write!(f, "EcClient::Grpc({})", c.addr()),
        }
    }
}

impl EcClient {
    pub fn in_process(node: &EcNode) -> Self {
        EcClient::InProcess(WeakNode(downgrade(node)))
    }

    /// Server to server: a step's deltas in the packed form ([`EcService::stage_deltas`]
    /// without unpacking them into rows).
    pub(crate) async fn stage_packed(&self, batch: PackedBatch) -> Result<(), PsError> {
        match self {
            EcClient::InProcess(w) => EcClient::node(w)?.stage_packed(batch),
            EcClient::Grpc(c) => c.stage_packed(batch).await,
        }
    }

    fn node(w: &WeakNode) -> Result<EcNode, PsError> {
        w.0.upgrade()
            .map(|inner: Arc<EcInner>| EcNode { inner })
            .filter(|n| !n.is_killed())
            .ok_or(PsError::Unavailable {
                addr: "in-process node".into(),
                reason: "the node was killed or dropped".into(),
            })
    }
}

impl EcService for EcNode {
    async fn set_peers(&self, addrs: Vec<String>) -> Result<(), PsError> {
        self.set_peer_addrs(&addrs)
    }

    async fn prepare(&self, step: u64, workers: Vec<u32>) -> Result<PrepareReport, PsError> {
        EcNode::prepare(self, step, &workers).await
    }

    async fn commit(&self, step: u64) -> Result<ApplyReport, PsError> {
        EcNode::commit(self, step)
    }

    async fn abort(&self, step: u64) -> Result<usize, PsError> {
        EcNode::abort(self, step)
    }

    async fn apply_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        EcNode::apply_step(self, step, &workers).await
    }

    async fn stage_deltas(&self, batch: DeltaBatch) -> Result<(), PsError> {
        EcNode::stage_deltas(self, batch)
    }

    async fn read_members(&self, keys: Vec<MemberKey>) -> Result<MemberRead, PsError> {
        EcNode::read_members(self, &keys)
    }

    async fn read_dense(&self, primary: ServerId) -> Result<DenseRead, PsError> {
        EcNode::read_dense(self, primary)
    }

    async fn degraded_read(
        &self,
        table: TableId,
        rows: Vec<RowId>,
        lost: Vec<ServerId>,
    ) -> Result<PulledRows, PsError> {
        EcNode::degraded_read(self, table, &rows, &lost).await
    }

    async fn start_rebuild(&self, lost: Vec<ServerId>, background: bool) -> Result<(), PsError> {
        EcNode::start_rebuild(self, &lost, background).await
    }

    async fn rebuild_status(&self) -> Result<RebuildStatus, PsError> {
        EcNode::rebuild_status(self)
    }

    async fn reset_for_restore(&self) -> Result<(), PsError> {
        EcNode::reset_for_restore(self).await
    }

    async fn reencode(&self) -> Result<ReencodeReport, PsError> {
        EcNode::reencode(self).await
    }

    async fn set_rebuild_share(&self, ppm: u32) -> Result<(), PsError> {
        EcNode::set_rebuild_share(self, ppm);
        Ok(())
    }

    async fn txn_prepare(
        &self,
        txn: TxnId,
        share: Arc<Update>,
        admission: Admission,
    ) -> Result<PrepareReport, PsError> {
        EcNode::txn_prepare(self, txn, share, admission).await
    }

    async fn txn_commit(&self, txn: TxnId) -> Result<ApplyReport, PsError> {
        EcNode::txn_commit(self, txn)
    }

    async fn txn_abort(&self, txn: TxnId) -> Result<(), PsError> {
        EcNode::txn_abort(self, txn)
    }

    async fn txn_apply(&self, txn: TxnId, share: Arc<Update>) -> Result<ApplyReport, PsError> {
        EcNode::txn_apply(self, txn, share).await
    }

    async fn txn_fence(&self, worker: u32, epoch: u32) -> Result<TxnStatus, PsError> {
        EcNode::txn_fence(self, worker, epoch)
    }

    async fn txn_resolve(&self, txn: TxnId, commit: bool) -> Result<(), PsError> {
        EcNode::txn_resolve(self, txn, commit)
    }

    async fn txn_block(&self, txn: TxnId) -> Result<TxnOutcome, PsError> {
        EcNode::txn_block(self, txn)
    }
}

macro_rules! delegate {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            EcClient::InProcess(w) => {
                let $c = &EcClient::node(w)?;
                $call.await
            }
            EcClient::Grpc(b) => {
                let $c = &**b;
                $call.await
            }
        }
    };
}

impl EcService for EcClient {
    async fn set_peers(&self, addrs: Vec<String>) -> Result<(), PsError> {
        delegate!(self, c => c.set_peers(addrs))
    }

    async fn prepare(&self, step: u64, workers: Vec<u32>) -> Result<PrepareReport, PsError> {
        delegate!(self, c => EcService::prepare(c, step, workers))
    }

    async fn commit(&self, step: u64) -> Result<ApplyReport, PsError> {
        delegate!(self, c => EcService::commit(c, step))
    }

    async fn abort(&self, step: u64) -> Result<usize, PsError> {
        delegate!(self, c => EcService::abort(c, step))
    }

    async fn apply_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        delegate!(self, c => EcService::apply_step(c, step, workers))
    }

    async fn stage_deltas(&self, batch: DeltaBatch) -> Result<(), PsError> {
        delegate!(self, c => EcService::stage_deltas(c, batch))
    }

    async fn read_members(&self, keys: Vec<MemberKey>) -> Result<MemberRead, PsError> {
        delegate!(self, c => EcService::read_members(c, keys))
    }

    async fn read_dense(&self, primary: ServerId) -> Result<DenseRead, PsError> {
        delegate!(self, c => EcService::read_dense(c, primary))
    }

    async fn degraded_read(
        &self,
        table: TableId,
        rows: Vec<RowId>,
        lost: Vec<ServerId>,
    ) -> Result<PulledRows, PsError> {
        delegate!(self, c => EcService::degraded_read(c, table, rows, lost))
    }

    async fn start_rebuild(&self, lost: Vec<ServerId>, background: bool) -> Result<(), PsError> {
        delegate!(self, c => EcService::start_rebuild(c, lost, background))
    }

    async fn rebuild_status(&self) -> Result<RebuildStatus, PsError> {
        delegate!(self, c => EcService::rebuild_status(c))
    }

    async fn reset_for_restore(&self) -> Result<(), PsError> {
        delegate!(self, c => EcService::reset_for_restore(c))
    }

    async fn reencode(&self) -> Result<ReencodeReport, PsError> {
        delegate!(self, c => EcService::reencode(c))
    }

    async fn set_rebuild_share(&self, ppm: u32) -> Result<(), PsError> {
        delegate!(self, c => EcService::set_rebuild_share(c, ppm))
    }

    async fn txn_prepare(
        &self,
        txn: TxnId,
        share: Arc<Update>,
        admission: Admission,
    ) -> Result<PrepareReport, PsError> {
        delegate!(self, c => EcService::txn_prepare(c, txn, share, admission))
    }

    async fn txn_commit(&self, txn: TxnId) -> Result<ApplyReport, PsError> {
        delegate!(self, c => EcService::txn_commit(c, txn))
    }

    async fn txn_abort(&self, txn: TxnId) -> Result<(), PsError> {
        delegate!(self, c => EcService::txn_abort(c, txn))
    }

    async fn txn_apply(&self, txn: TxnId, share: Arc<Update>) -> Result<ApplyReport, PsError> {
        delegate!(self, c => EcService::txn_apply(c, txn, share))
    }

    async fn txn_fence(&self, worker: u32, epoch: u32) -> Result<TxnStatus, PsError> {
        delegate!(self, c => EcService::txn_fence(c, worker, epoch))
    }

    async fn txn_resolve(&self, txn: TxnId, commit: bool) -> Result<(), PsError> {
        delegate!(self, c => EcService::txn_resolve(c, txn, commit))
    }

    async fn txn_block(&self, txn: TxnId) -> Result<TxnOutcome, PsError> {
        delegate!(self, c => EcService::txn_block(c, txn))
    }
}

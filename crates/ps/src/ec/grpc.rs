//! The gRPC transport of the ECRec service: [`ec_service`] for
//! [`crate::grpc::serve_routes`], [`EcGrpcClient`] for coordinators and peers.

use ftrec_core::{ServerId, TableId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::node::EcNode;
use super::reencode::ReencodeReport;
use super::service::EcService;
use super::types::{
    Admission, DeltaBatch, DenseRead, MemberKey, MemberRead, PackedBatch, PrepareReport,
    RebuildStatus, TxnId, TxnOutcome, TxnStatus,
};
use crate::auth::{Auth, AuthChannel};
use crate::grpc::wire::{
    bytes_to_f32s, bytes_to_u64s, check_multiple, extend_f32s_le, f32s_into_bytes, f32s_to_bytes,
    from_status, le_bytes_into_f32s, to_status,
};
use crate::update::{ApplyReport, DenseBlock, PulledRows, Update};
use crate::PsError;

/// Messages and stubs generated from `proto/ec.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("ftrec.ec.v1");
}

use proto::ec_node_client::EcNodeClient;
use proto::ec_node_server::{EcNode as EcNodeRpc, EcNodeServer};

/// Largest ECRec message either end accepts: a step's deltas for one peer, or one chunk of
/// member reads.
pub const EC_MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Member reads are cut into requests of about this many bytes of reply.
const READ_CHUNK_BYTES: usize = 8 << 20;

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn s(e: PsError) -> Status {
    to_status(&e)
}

/// The ECRec service of `node`, to add next to the parameter-server service with
/// [`crate::grpc::Routes::add_service`].
pub fn ec_service(node: EcNode) -> EcNodeServer<EcGrpcHandler> {
    EcNodeServer::new(EcGrpcHandler { node })
        .max_decoding_message_size(EC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(EC_MAX_MESSAGE_BYTES)
}

/// Server side: decode, call the [`EcNode`], encode.
pub struct EcGrpcHandler {
    node: EcNode,
}

/// A batch on the wire; its deltas and gradients leave in the buffers they were computed in.
fn batch_to_proto(b: PackedBatch) -> proto::DeltaBatch {
    let rows: Vec<u64> = b.rows.iter().map(|&(_, r)| r).collect();
    proto::DeltaBatch {
        step: b.step,
        from: b.from.0,
        apply_now: b.apply_now,
        row_tables: b.rows.iter().map(|&(t, _)| t.0).collect(),
        rows: u64s(&rows).into(),
        row_deltas: f32s_into_bytes(b.deltas),
        dense_blocks: u64s(&b.dense_blocks).into(),
        dense_lens: b.dense_lens,
        dense_grads: f32s_into_bytes(b.dense_grads),
        txn: b.txn.map(txn_to_proto),
    }
}

fn txn_to_proto(t: TxnId) -> proto::Txn {
    proto::Txn {
        worker: t.worker,
        epoch: t.epoch,
        seq: t.seq,
        priority: t.priority,
    }
}

fn txn_from_proto(t: proto::Txn) -> TxnId {
    TxnId {
        worker: t.worker,
        epoch: t.epoch,
        seq: t.seq,
        priority: t.priority,
    }
}

impl From<Admission> for proto::Admission {
    fn from(a: Admission) -> Self {
        match a {
            Admission::WaitDie => proto::Admission::WaitDie,
            Admission::Queued | Admission::After(_) => proto::Admission::Queued,
            Admission::Reserve => proto::Admission::Reserve,
        }
    }
}

/// A prepare's admission off the wire (`after` only with a queued one); an unknown value
/// names the three.
fn admission_from_proto(v: i32, after: Option<proto::Txn>) -> Result<Admission, PsError> {
    let a = match proto::Admission::try_from(v) {
        Ok(proto::Admission::WaitDie) => Admission::WaitDie,
        Ok(proto::Admission::Queued) => match after {
            Some(t) => return Ok(Admission::After(txn_from_proto(t))),
            None => Admission::Queued,
        },
        Ok(proto::Admission::Reserve) => Admission::Reserve,
        Err(_) => {
            return Err(PsError::MalformedRequest(format!(
                "unknown admission {v} of a prepare (0 wait-die, 1 queued, 2 reserve)"
            )))
        }
    };
    if after.is_some() {
        return Err(PsError::MalformedRequest(format!(
            "a {a:?} prepare names a transaction to go after: only a queued one may"
        )));
    }
    Ok(a)
}

/// The transaction a queued prepare goes after, for the wire.
fn after_to_proto(a: Admission) -> Option<proto::Txn> {
    match a {
        Admission::After(t) => Some(txn_to_proto(t)),
        _ => None,
    }
}

fn need_txn(t: Option<proto::Txn>) -> Result<TxnId, PsError> {
    t.map(txn_from_proto)
        .ok_or_else(|| PsError::MalformedRequest("the request names no transaction".into()))
}

/// One server's share of an update, packed (see `TxnUpdate` in `ec.proto`).
fn update_to_proto(txn: TxnId, u: &Update) -> proto::TxnUpdate {
    let rows: Vec<u64> = u
        .sparse
        .iter()
        .flat_map(|p| p.rows.iter().copied())
        .collect();
    let mut grads = Vec::with_capacity(u.sparse.iter().map(|p| p.grads.len()).sum::<usize>() * 4);
    for p in &u.sparse {
        extend_f32s_le(&mut grads, &p.grads);
    }
    let mut dense = Vec::with_capacity(u.dense.iter().map(|d| d.grads.len()).sum::<usize>() * 4);
    for d in &u.dense {
        extend_f32s_le(&mut dense, &d.grads);
    }
    proto::TxnUpdate {
        txn: Some(txn_to_proto(txn)),
        tables: u.sparse.iter().map(|p| p.table.0).collect(),
        part_rows: u.sparse.iter().map(|p| p.rows.len() as u32).collect(),
        rows: u64s(&rows).into(),
        grads: grads.into(),
        dense_offsets: u.dense.iter().map(|d| d.offset).collect(),
        dense_lens: u.dense.iter().map(|d| d.grads.len() as u32).collect(),
        dense_grads: dense.into(),
        admission: proto::Admission::WaitDie as i32,
        after: None,
    }
}

fn update_from_proto(p: proto::TxnUpdate) -> Result<(TxnId, Update), PsError> {
    let txn = need_txn(p.txn)?;
    let rows = bytes_to_u64s("transaction row ids", &p.rows)?;
    // The floats are decoded straight into each part below (one copy off the wire); here
    // only their counts are checked.
    check_multiple("transaction gradients", p.grads.len(), 4)?;
    check_multiple("transaction dense gradients", p.dense_grads.len(), 4)?;
    let (grads, dense) = (p.grads.len() / 4, p.dense_grads.len() / 4);
    let bad = |m: String| PsError::MalformedRequest(m);
    if p.tables.len() != p.part_rows.len()
        || p.part_rows.iter().map(|&n| n as usize).sum::<usize>() != rows.len()
    {
        return Err(bad(format!(
            "{} sparse tables, {} row counts and {} row ids disagree",
            p.tables.len(),
            p.part_rows.len(),
            rows.len()
        )));
    }
    if rows.is_empty() != (grads == 0) || (!rows.is_empty() && grads % rows.len() != 0) {
        return Err(bad(format!(
            "{grads} gradient values do not split into {} equal rows",
            rows.len()
        )));
    }
    let dim = if rows.is_empty() {
        0
    } else {
        grads / rows.len()
    };
    if p.dense_offsets.len() != p.dense_lens.len()
        || p.dense_lens.iter().map(|&n| n as usize).sum::<usize>() != dense
    {
        return Err(bad("dense offsets, lengths and gradients disagree".into()));
    }
    let floats = |bytes: &[u8]| {
        let mut v = vec![0.0f32; bytes.len() / 4];
        le_bytes_into_f32s(bytes, &mut v);
        v
    };
    let mut u = Update::new();
    let (mut r, mut g) = (0usize, 0usize);
    for (&t, &n) in p.tables.iter().zip(&p.part_rows) {
        let n = n as usize;
        u = u.with_sparse(
            TableId(t),
            rows[r..r + n].to_vec(),
            floats(&p.grads[g * 4..(g + n * dim) * 4]),
        );
        r += n;
        g += n * dim;
    }
    let mut at = 0usize;
    for (&off, &n) in p.dense_offsets.iter().zip(&p.dense_lens) {
        let n = n as usize;
        u = u.with_dense(off, floats(&p.dense_grads[at * 4..(at + n) * 4]));
        at += n;
    }
    Ok((txn, u))
}

fn prepare_reply(p: PrepareReport) -> proto::PrepareReply {
    proto::PrepareReply {
        rows: p.rows,
        dense_blocks: p.dense_blocks,
        row_deltas_sent: p.row_deltas_sent,
        dense_deltas_sent: p.dense_deltas_sent,
        bytes_sent: p.bytes_sent,
        rows_decoded: p.rows_decoded,
        slot_wait_us: p.slot_wait_us,
        after: p.after.map(txn_to_proto),
        behind_wait_us: p.behind_wait_us,
    }
}

fn prepare_report(p: proto::PrepareReply) -> PrepareReport {
    PrepareReport {
        rows: p.rows,
        dense_blocks: p.dense_blocks,
        row_deltas_sent: p.row_deltas_sent,
        dense_deltas_sent: p.dense_deltas_sent,
        bytes_sent: p.bytes_sent,
        rows_decoded: p.rows_decoded,
        slot_wait_us: p.slot_wait_us,
        after: p.after.map(txn_from_proto),
        behind_wait_us: p.behind_wait_us,
    }
}

fn apply_reply(a: ApplyReport) -> proto::ApplyReply {
    proto::ApplyReply {
        rows_updated: a.rows_updated,
        dense_blocks_updated: a.dense_blocks_updated,
    }
}

fn apply_report(a: proto::ApplyReply) -> ApplyReport {
    ApplyReport {
        rows_updated: a.rows_updated,
        dense_blocks_updated: a.dense_blocks_updated,
    }
}

fn outcome_to_proto(o: TxnOutcome) -> proto::TxnOutcomeKind {
    match o {
        TxnOutcome::Absent => proto::TxnOutcomeKind::TxnOutcomeAbsent,
        TxnOutcome::Prepared => proto::TxnOutcomeKind::TxnOutcomePrepared,
        TxnOutcome::Committed => proto::TxnOutcomeKind::TxnOutcomeCommitted,
    }
}

fn outcome_from_proto(o: i32) -> Result<TxnOutcome, PsError> {
    match proto::TxnOutcomeKind::try_from(o) {
        Ok(proto::TxnOutcomeKind::TxnOutcomeAbsent) => Ok(TxnOutcome::Absent),
        Ok(proto::TxnOutcomeKind::TxnOutcomePrepared) => Ok(TxnOutcome::Prepared),
        Ok(proto::TxnOutcomeKind::TxnOutcomeCommitted) => Ok(TxnOutcome::Committed),
        Err(_) => Err(PsError::MalformedRequest(format!(
            "unknown transaction outcome {o} in a txn_block reply"
        ))),
    }
}

fn status_from_proto(r: proto::TxnStatusReply) -> TxnStatus {
    TxnStatus {
        holding: r.holding.map(txn_from_proto),
        last_commit: r.last_commit.map(txn_from_proto),
        staged: r.staged.into_iter().map(txn_from_proto).collect(),
    }
}

fn batch_from_proto(p: proto::DeltaBatch) -> Result<PackedBatch, PsError> {
    let rows = bytes_to_u64s("delta row ids", &p.rows)?;
    let deltas = bytes_to_f32s("row deltas", &p.row_deltas)?;
    if rows.len() != p.row_tables.len() {
        return Err(PsError::MalformedRequest(format!(
            "{} delta row ids but {} tables",
            rows.len(),
            p.row_tables.len()
        )));
    }
    let w = if rows.is_empty() {
        0
    } else {
        deltas.len() / rows.len()
    };
    if w * rows.len() != deltas.len() {
        return Err(PsError::MalformedRequest(format!(
            "{} delta words do not split into {} equal rows",
            deltas.len(),
            rows.len()
        )));
    }
    let blocks = bytes_to_u64s("dense block ids", &p.dense_blocks)?;
    let grads = bytes_to_f32s("dense gradients", &p.dense_grads)?;
    if blocks.len() != p.dense_lens.len()
        || p.dense_lens.iter().map(|&l| l as usize).sum::<usize>() != grads.len()
    {
        return Err(PsError::MalformedRequest(
            "dense block ids, lengths and gradients disagree".into(),
        ));
    }
    Ok(PackedBatch {
        step: p.step,
        from: ServerId(p.from),
        apply_now: p.apply_now,
        words: w,
        rows: p
            .row_tables
            .iter()
            .zip(rows)
            .map(|(&t, r)| (TableId(t), r))
            .collect(),
        deltas,
        dense_blocks: blocks,
        dense_lens: p.dense_lens,
        dense_grads: grads,
        txn: p.txn.map(txn_from_proto),
    })
}

/// Bit of a packed member key that marks a parity slot; the bits below hold the index and
/// the 16 bits above the parity bit the table ([`proto::ReadMembersRequest`]).
const KEY_PARITY: u64 = 1 << 47;
const KEY_TABLE_SHIFT: u32 = 48;

/// Pack `keys` one u64 each: one copy to send, where per-key fields cost a varint each.
fn keys_to_proto(keys: &[MemberKey]) -> Result<proto::ReadMembersRequest, PsError> {
    let mut out = Vec::with_capacity(keys.len() * 8);
    for k in keys {
        let (table, index, flag) = match *k {
            MemberKey::Row { table, local } => (table, local, 0),
            MemberKey::Parity { table, slot } => (table, slot, KEY_PARITY),
        };
        if table.0 > u32::from(u16::MAX) || index >= KEY_PARITY {
            return Err(PsError::MalformedRequest(format!(
                "member key of table {} index {index} does not fit a read request (tables up \
                 to {}, indices below 2^47)",
                table.0,
                u16::MAX
            )));
        }
        let packed = (u64::from(table.0) << KEY_TABLE_SHIFT) | flag | index;
        out.extend_from_slice(&packed.to_le_bytes());
    }
    Ok(proto::ReadMembersRequest { keys: out })
}

fn keys_from_proto(p: proto::ReadMembersRequest) -> Result<Vec<MemberKey>, PsError> {
    let packed = bytes_to_u64s("member keys", &p.keys)?;
    Ok(packed
        .iter()
        .map(|&x| {
            let table = TableId((x >> KEY_TABLE_SHIFT) as u32);
            let index = x & (KEY_PARITY - 1);
            if x & KEY_PARITY != 0 {
                MemberKey::Parity { table, slot: index }
            } else {
                MemberKey::Row {
                    table,
                    local: index,
                }
            }
        })
        .collect())
}

fn servers(v: &[u32]) -> Vec<ServerId> {
    v.iter().map(|&s| ServerId(s)).collect()
}

#[tonic::async_trait]
impl EcNodeRpc for EcGrpcHandler {
    async fn set_peers(
        &self,
        req: Request<proto::SetPeersRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.node
            .set_peer_addrs(&req.into_inner().addrs)
            .map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn prepare(
        &self,
        req: Request<proto::StepRequest>,
    ) -> Result<Response<proto::PrepareReply>, Status> {
        let r = req.into_inner();
        let p = self.node.prepare(r.step, &r.workers).await.map_err(s)?;
        Ok(Response::new(prepare_reply(p)))
    }

    async fn commit(
        &self,
        req: Request<proto::SeqRequest>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        let a = self.node.commit(req.into_inner().step).map_err(s)?;
        Ok(Response::new(proto::ApplyReply {
            rows_updated: a.rows_updated,
            dense_blocks_updated: a.dense_blocks_updated,
        }))
    }

    async fn abort(
        &self,
        req: Request<proto::SeqRequest>,
    ) -> Result<Response<proto::AbortReply>, Status> {
        let n = self.node.abort(req.into_inner().step).map_err(s)?;
        Ok(Response::new(proto::AbortReply { dropped: n as u64 }))
    }

    async fn apply_step(
        &self,
        req: Request<proto::StepRequest>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        let r = req.into_inner();
        let a = self.node.apply_step(r.step, &r.workers).await.map_err(s)?;
        Ok(Response::new(proto::ApplyReply {
            rows_updated: a.rows_updated,
            dense_blocks_updated: a.dense_blocks_updated,
        }))
    }

    async fn stage_deltas(
        &self,
        req: Request<proto::DeltaBatch>,
    ) -> Result<Response<proto::Empty>, Status> {
        let b = batch_from_proto(req.into_inner()).map_err(s)?;
        self.node.stage_packed(b).map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn read_members(
        &self,
        req: Request<proto::ReadMembersRequest>,
    ) -> Result<Response<proto::ReadMembersReply>, Status> {
        let keys = keys_from_proto(req.into_inner()).map_err(s)?;
        let r = self.node.read_members(&keys).map_err(s)?;
        Ok(Response::new(proto::ReadMembersReply {
            step: r.step,
            words: r.words as u64,
            data: f32s_into_bytes(r.data),
        }))
    }

    async fn read_dense(
        &self,
        req: Request<proto::ReadDenseRequest>,
    ) -> Result<Response<proto::ReadDenseReply>, Status> {
        let r = self
            .node
            .read_dense(ServerId(req.into_inner().primary))
            .map_err(s)?;
        Ok(Response::new(proto::ReadDenseReply {
            step: r.step,
            first_block: r.block.first_block,
            values: f32s_to_bytes(&r.block.values),
            state: f32s_to_bytes(&r.block.state),
        }))
    }

    async fn degraded_read(
        &self,
        req: Request<proto::DegradedReadRequest>,
    ) -> Result<Response<proto::DegradedReadReply>, Status> {
        let r = req.into_inner();
        let rows = bytes_to_u64s("degraded read rows", &r.rows).map_err(s)?;
        let p = self
            .node
            .degraded_read(TableId(r.table), &rows, &servers(&r.lost))
            .await
            .map_err(s)?;
        Ok(Response::new(proto::DegradedReadReply {
            rows: u64s(&p.rows),
            values: f32s_to_bytes(&p.values),
            dim: p.dim as u64,
        }))
    }

    async fn start_rebuild(
        &self,
        req: Request<proto::StartRebuildRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let r = req.into_inner();
        self.node
            .start_rebuild(&servers(&r.lost), r.background)
            .await
            .map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn set_rebuild_share(
        &self,
        req: Request<proto::RebuildShareRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.node.set_rebuild_share(req.into_inner().ppm);
        Ok(Response::new(proto::Empty {}))
    }

    async fn reset_for_restore(
        &self,
        _req: Request<proto::Empty>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.node.reset_for_restore().await.map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn reencode(
        &self,
        _req: Request<proto::Empty>,
    ) -> Result<Response<proto::ReencodeReply>, Status> {
        let r = self.node.reencode().await.map_err(s)?;
        Ok(Response::new(proto::ReencodeReply {
            parities: r.parities,
            replicas: r.replicas,
        }))
    }

    async fn txn_prepare(
        &self,
        req: Request<proto::TxnUpdate>,
    ) -> Result<Response<proto::PrepareReply>, Status> {
        let req = req.into_inner();
        let admission = admission_from_proto(req.admission, req.after).map_err(s)?;
        let (txn, u) = update_from_proto(req).map_err(s)?;
        let p = self
            .node
            .txn_prepare(txn, std::sync::Arc::new(u), admission)
            .await
            .map_err(s)?;
        Ok(Response::new(prepare_reply(p)))
    }

    async fn txn_commit(
        &self,
        req: Request<proto::Txn>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        let a = self
            .node
            .txn_commit(txn_from_proto(req.into_inner()))
            .map_err(s)?;
        Ok(Response::new(apply_reply(a)))
    }

    async fn txn_abort(&self, req: Request<proto::Txn>) -> Result<Response<proto::Empty>, Status> {
        self.node
            .txn_abort(txn_from_proto(req.into_inner()))
            .map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn txn_apply(
        &self,
        req: Request<proto::TxnUpdate>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        let (txn, u) = update_from_proto(req.into_inner()).map_err(s)?;
        let a = self
            .node
            .txn_apply(txn, std::sync::Arc::new(u))
            .await
            .map_err(s)?;
        Ok(Response::new(apply_reply(a)))
    }

    async fn txn_fence(
        &self,
        req: Request<proto::FenceRequest>,
    ) -> Result<Response<proto::TxnStatusReply>, Status> {
        let r = req.into_inner();
        let st = self.node.txn_fence(r.worker, r.epoch).map_err(s)?;
        Ok(Response::new(proto::TxnStatusReply {
            holding: st.holding.map(txn_to_proto),
            last_commit: st.last_commit.map(txn_to_proto),
            staged: st.staged.into_iter().map(txn_to_proto).collect(),
        }))
    }

    async fn txn_resolve(
        &self,
        req: Request<proto::ResolveRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let r = req.into_inner();
        self.node
            .txn_resolve(need_txn(r.txn).map_err(s)?, r.commit)
            .map_err(s)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn txn_block(
        &self,
        req: Request<proto::Txn>,
    ) -> Result<Response<proto::TxnBlockReply>, Status> {
        let txn = need_txn(Some(req.into_inner())).map_err(s)?;
        let o = self.node.txn_block(txn).map_err(s)?;
        Ok(Response::new(proto::TxnBlockReply {
            outcome: outcome_to_proto(o) as i32,
        }))
    }

    async fn rebuild_status(
        &self,
        _req: Request<proto::Empty>,
    ) -> Result<Response<proto::RebuildStatusReply>, Status> {
        let st = self.node.rebuild_status().map_err(s)?;
        Ok(Response::new(proto::RebuildStatusReply {
            started: st.started,
            joined: st.joined,
            ranges_total: st.ranges_total,
            ranges_done: st.ranges_done,
            rows_missing: st.rows_missing,
            parities_missing: st.parities_missing,
            rows_decoded_on_demand: st.rows_decoded_on_demand,
            cut_retries: st.cut_retries,
            finished: st.finished,
            error: st.error,
            generation: st.generation,
            commits_in_lock: st.commits_in_lock,
            range_start_us: st.range_spans_us.iter().map(|r| r.0).collect(),
            range_end_us: st.range_spans_us.iter().map(|r| r.1).collect(),
            bytes_rebuilt: st.bytes_rebuilt,
            batches: st.batches,
            busy_us: st.busy_us,
            rest_us: st.rest_us,
            lock_us: st.lock_us,
        }))
    }
}

/// A connection to one node's ECRec service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EcGrpcClient {
    client: EcNodeClient<AuthChannel>,
    addr: String,
    /// Longest one call may take (`None`: as long as it takes).
    timeout: Option<Duration>,
    /// This process's view of the live incarnations: a refusal naming it fences it.
    fences: crate::fence::Fences,
    /// Words of the node's stripe members, learnt from its first member read (0 until then),
    /// so that later reads size their chunks without a probe of their own.
    member_words: Arc<AtomicUsize>,
}

impl EcGrpcClient {
    /// A client that connects on first use (so peers can be named before they listen). Must
    /// be called inside a tokio runtime.
    pub fn connect_lazy(addr: &str) -> Result<Self, PsError> {
        Self::connect_lazy_with(addr, &Auth::none())
    }

    /// [`EcGrpcClient::connect_lazy`] with every request carrying `auth`'s token and job id.
    /// `addr` is `host:port`, a name looked up at every connect ([`crate::net`]).
    pub fn connect_lazy_with(addr: &str, auth: &Auth) -> Result<Self, PsError> {
        let peer: crate::net::PeerAddr = addr
            .parse()
            .map_err(|e| PsError::InvalidConfig(format!("ECRec peer address: {e}")))?;
        let channel = auth.channel_lazy(&peer)?;
        Ok(EcGrpcClient {
            client: EcNodeClient::with_interceptor(channel, auth.client())
                .max_decoding_message_size(EC_MAX_MESSAGE_BYTES)
                .max_encoding_message_size(EC_MAX_MESSAGE_BYTES),
            addr: addr.to_string(),
            timeout: None,
            fences: auth.fences.clone(),
            member_words: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The same client with every call bounded by `timeout`: a peer that does not answer in
    /// time (a hung process, a lost network) fails the call with
    /// [`PsError::Unavailable`] naming the call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Await one call under the client's timeout.
    async fn call<T>(
        &self,
        rpc: &str,
        fut: impl std::future::Future<Output = Result<Response<T>, Status>>,
    ) -> Result<T, PsError> {
        let r = match self.timeout {
            None => fut.await,
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(PsError::Unavailable {
                        addr: self.addr.clone(),
                        reason: format!("no answer to {rpc} within {:.3}s", t.as_secs_f64()),
                    })
                }
            },
        };
        r.map(Response::into_inner).map_err(|e| self.err(e))
    }

    /// Send a step's deltas to the peer in the packed form.
    pub(crate) async fn stage_packed(&self, batch: PackedBatch) -> Result<(), PsError> {
        self.call(
            "stage_deltas",
            self.client.clone().stage_deltas(batch_to_proto(batch)),
        )
        .await?;
        Ok(())
    }

    fn err(&self, st: Status) -> PsError {
        let e = from_status(&st, &self.addr);
        self.fences.learn(&e);
        e
    }

    async fn read_chunk(&self, keys: &[MemberKey]) -> Result<MemberRead, PsError> {
        let r = self
            .call(
                "read_members",
                self.client.clone().read_members(keys_to_proto(keys)?),
            )
            .await?;
        Ok(MemberRead {
            step: r.step,
            words: r.words as usize,
            data: bytes_to_f32s("member words", &r.data)?,
        })
    }
}

/// Members of `words` words each that one read chunk carries.
fn chunk_keys(words: usize) -> usize {
    (READ_CHUNK_BYTES / (words.max(1) * 4)).max(1)
}

impl EcService for EcGrpcClient {
    async fn set_peers(&self, addrs: Vec<String>) -> Result<(), PsError> {
        self.call(
            "set_peers",
            self.client
                .clone()
                .set_peers(proto::SetPeersRequest { addrs }),
        )
        .await?;
        Ok(())
    }

    async fn prepare(&self, step: u64, workers: Vec<u32>) -> Result<PrepareReport, PsError> {
        let p = self
            .call(
                "prepare",
                self.client
                    .clone()
                    .prepare(proto::StepRequest { step, workers }),
            )
            .await?;
        Ok(prepare_report(p))
    }

    async fn commit(&self, step: u64) -> Result<ApplyReport, PsError> {
        let a = self
            .call(
                "commit",
                self.client.clone().commit(proto::SeqRequest { step }),
            )
            .await?;
        Ok(ApplyReport {
            rows_updated: a.rows_updated,
            dense_blocks_updated: a.dense_blocks_updated,
        })
    }

    async fn abort(&self, step: u64) -> Result<usize, PsError> {
        let a = self
            .call(
                "abort",
                self.client.clone().abort(proto::SeqRequest { step }),
            )
            .await?;
        Ok(a.dropped as usize)
    }

    async fn apply_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        let a = self
            .call(
                "apply_step",
                self.client
                    .clone()
                    .apply_step(proto::StepRequest { step, workers }),
            )
            .await?;
        Ok(ApplyReport {
            rows_updated: a.rows_updated,
            dense_blocks_updated: a.dense_blocks_updated,
        })
    }

    async fn stage_deltas(&self, batch: DeltaBatch) -> Result<(), PsError> {
        self.stage_packed(PackedBatch::from_batch(batch)?).await
    }

    async fn read_members(&self, keys: Vec<MemberKey>) -> Result<MemberRead, PsError> {
        if keys.is_empty() {
            return self.read_chunk(&[]).await;
        }
        // Size the chunks from the row width (learnt from a first read of one member, once
        // per client); chunks that straddle a commit are read again, so the reply is one cut
        // as from a single request.
        for _ in 0..50 {
            let known = self.member_words.load(Ordering::Relaxed);
            let (mut out, rest) = if known == 0 {
                let first = self.read_chunk(&keys[..1]).await?;
                self.member_words
                    .store(first.words.max(1), Ordering::Relaxed);
                (first, &keys[1..])
            } else {
                let (head, rest) = keys.split_at(chunk_keys(known).min(keys.len()));
                (self.read_chunk(head).await?, rest)
            };
            let per = chunk_keys(out.words);
            let mut torn = false;
            for chunk in rest.chunks(per) {
                let r = self.read_chunk(chunk).await?;
                if r.step != out.step {
                    torn = true;
                    break;
                }
                out.data.extend_from_slice(&r.data);
            }
            if !torn {
                return Ok(out);
            }
        }
        Err(PsError::Coding(format!(
            "reads of {} members from {} kept straddling commits",
            keys.len(),
            self.addr
        )))
    }

    async fn read_dense(&self, primary: ServerId) -> Result<DenseRead, PsError> {
        let r = self
            .call(
                "read_dense",
                self.client
                    .clone()
                    .read_dense(proto::ReadDenseRequest { primary: primary.0 }),
            )
            .await?;
        Ok(DenseRead {
            step: r.step,
            block: DenseBlock {
                first_block: r.first_block,
                values: bytes_to_f32s("dense values", &r.values)?,
                state: bytes_to_f32s("dense state", &r.state)?,
            },
        })
    }

    async fn degraded_read(
        &self,
        table: TableId,
        rows: Vec<ftrec_core::RowId>,
        lost: Vec<ServerId>,
    ) -> Result<PulledRows, PsError> {
        let r = self
            .call(
                "degraded_read",
                self.client
                    .clone()
                    .degraded_read(proto::DegradedReadRequest {
                        table: table.0,
                        rows: u64s(&rows),
                        lost: lost.iter().map(|s| s.0).collect(),
                    }),
            )
            .await?;
        Ok(PulledRows {
            table,
            rows: bytes_to_u64s("degraded read rows", &r.rows)?,
            values: bytes_to_f32s("degraded read values", &r.values)?,
            dim: r.dim as usize,
        })
    }

    async fn start_rebuild(&self, lost: Vec<ServerId>, background: bool) -> Result<(), PsError> {
        self.call(
            "start_rebuild",
            self.client
                .clone()
                .start_rebuild(proto::StartRebuildRequest {
                    lost: lost.iter().map(|s| s.0).collect(),
                    background,
                }),
        )
        .await?;
        Ok(())
    }

    async fn txn_prepare(
        &self,
        txn: TxnId,
        share: std::sync::Arc<Update>,
        admission: Admission,
    ) -> Result<PrepareReport, PsError> {
        let req = proto::TxnUpdate {
            admission: proto::Admission::from(admission) as i32,
            after: after_to_proto(admission),
            ..update_to_proto(txn, &share)
        };
        let p = self
            .call("txn_prepare", self.client.clone().txn_prepare(req))
            .await?;
        Ok(prepare_report(p))
    }

    async fn txn_commit(&self, txn: TxnId) -> Result<ApplyReport, PsError> {
        let a = self
            .call(
                "txn_commit",
                self.client.clone().txn_commit(txn_to_proto(txn)),
            )
            .await?;
        Ok(apply_report(a))
    }

    async fn txn_abort(&self, txn: TxnId) -> Result<(), PsError> {
        self.call(
            "txn_abort",
            self.client.clone().txn_abort(txn_to_proto(txn)),
        )
        .await?;
        Ok(())
    }

    async fn txn_apply(
        &self,
        txn: TxnId,
        share: std::sync::Arc<Update>,
    ) -> Result<ApplyReport, PsError> {
        let a = self
            .call(
                "txn_apply",
                self.client.clone().txn_apply(update_to_proto(txn, &share)),
            )
            .await?;
        Ok(apply_report(a))
    }

    async fn txn_fence(&self, worker: u32, epoch: u32) -> Result<TxnStatus, PsError> {
        let r = self
            .call(
                "txn_fence",
                self.client
                    .clone()
                    .txn_fence(proto::FenceRequest { worker, epoch }),
            )
            .await?;
        Ok(status_from_proto(r))
    }

    async fn txn_resolve(&self, txn: TxnId, commit: bool) -> Result<(), PsError> {
        self.call(
            "txn_resolve",
            self.client.clone().txn_resolve(proto::ResolveRequest {
                txn: Some(txn_to_proto(txn)),
                commit,
            }),
        )
        .await?;
        Ok(())
    }

    async fn txn_block(&self, txn: TxnId) -> Result<TxnOutcome, PsError> {
        let r = self
            .call(
                "txn_block",
                self.client.clone().txn_block(txn_to_proto(txn)),
            )
            .await?;
        outcome_from_proto(r.outcome)
    }

    async fn set_rebuild_share(&self, ppm: u32) -> Result<(), PsError> {
        self.call(
            "set_rebuild_share",
            self.client
                .clone()
                .set_rebuild_share(proto::RebuildShareRequest { ppm }),
        )
        .await?;
        Ok(())
    }

    async fn reset_for_restore(&self) -> Result<(), PsError> {
        self.call(
            "reset_for_restore",
            self.client.clone().reset_for_restore(proto::Empty {}),
        )
        .await?;
        Ok(())
    }

    async fn reencode(&self) -> Result<ReencodeReport, PsError> {
        let r = self
            .call("reencode", self.client.clone().reencode(proto::Empty {}))
            .await?;
        Ok(ReencodeReport {
            parities: r.parities,
            replicas: r.replicas,
        })
    }

    async fn rebuild_status(&self) -> Result<RebuildStatus, PsError> {
        let r = self
            .call(
                "rebuild_status",
                self.client.clone().rebuild_status(proto::Empty {}),
            )
            .await?;
        Ok(RebuildStatus {
            started: r.started,
            joined: r.joined,
            ranges_total: r.ranges_total,
            ranges_done: r.ranges_done,
            rows_missing: r.rows_missing,
            parities_missing: r.parities_missing,
            rows_decoded_on_demand: r.rows_decoded_on_demand,
            cut_retries: r.cut_retries,
            finished: r.finished,
            error: r.error,
            generation: r.generation,
            commits_in_lock: r.commits_in_lock,
            range_spans_us: r.range_start_us.into_iter().zip(r.range_end_us).collect(),
            bytes_rebuilt: r.bytes_rebuilt,
            batches: r.batches,
            busy_us: r.busy_us,
            rest_us: r.rest_us,
            lock_us: r.lock_us,
        })
    }
}

#[cfg(test)]
mod fuzz {
    //! The ECRec service's conversions from the wire (`update_from_proto`,
    //! `batch_from_proto`, `keys_from_proto`), fed arbitrary and mutated messages: a value
    //! whose parts agree with each other, or an error.

    use super::*;
    use crate::fuzz_support::{bytes, check, config, huge, mutated_encoding, mutation};
    use proptest::prelude::*;
    use prost::Message;

    fn txn() -> TxnId {
        TxnId {
            worker: 1,
            epoch: 2,
            seq: 3,
            priority: 4,
        }
    }

    fn valid_update() -> proto::TxnUpdate {
        let u = Update::new()
            .with_sparse(TableId(0), vec![1, 5], vec![0.5; 6])
            .with_sparse(TableId(2), vec![7], vec![0.25; 3])
            .with_dense(16, vec![1.0; 5]);
        update_to_proto(txn(), &u)
    }

    fn valid_batch() -> proto::DeltaBatch {
        proto::DeltaBatch {
            step: 9,
            from: 1,
            apply_now: false,
            row_tables: vec![0, 1],
            rows: u64s(&[4, 8]).into(),
            row_deltas: f32s_to_bytes(&[0.5; 6]).into(),
            dense_blocks: u64s(&[2]).into(),
            dense_lens: vec![3],
            dense_grads: f32s_to_bytes(&[1.0; 3]).into(),
            txn: Some(txn_to_proto(txn())),
        }
    }

    fn valid_keys() -> proto::ReadMembersRequest {
        keys_to_proto(&[
            MemberKey::Row {
                table: TableId(1),
                local: 4,
            },
            MemberKey::Parity {
                table: TableId(0),
                slot: 2,
            },
        ])
        .unwrap()
    }

    /// Whatever a decoder accepts is self-consistent.
    fn consistent_update(u: &Update) {
        for p in &u.sparse {
            assert!(p.rows.is_empty() || p.grads.len() % p.rows.len() == 0);
        }
    }

    fn consistent_batch(b: &PackedBatch) {
        assert_eq!(b.words * b.rows.len(), b.deltas.len());
        assert_eq!(b.dense_blocks.len(), b.dense_lens.len());
        let total: usize = b.dense_lens.iter().map(|&l| l as usize).sum();
        assert_eq!(total, b.dense_grads.len());
    }

    fn every_reader(wire: &[u8]) {
        check(wire, |p: proto::TxnUpdate| {
            if let Ok((_, u)) = update_from_proto(p) {
                consistent_update(&u);
            }
        });
        check(wire, |p: proto::DeltaBatch| {
            if let Ok(b) = batch_from_proto(p) {
                consistent_batch(&b);
            }
        });
        check(wire, keys_from_proto);
    }

    #[test]
    fn valid_messages_round_trip() {
        let (t, u) = update_from_proto(valid_update()).unwrap();
        assert_eq!(t, txn());
        assert_eq!(update_to_proto(t, &u), valid_update());
        let b = batch_from_proto(valid_batch()).unwrap();
        assert_eq!(batch_to_proto(b), valid_batch());
        let k = keys_from_proto(valid_keys()).unwrap();
        assert_eq!(keys_to_proto(&k).unwrap(), valid_keys());
        // Every field of a prepare's report crosses the wire, the waits' parts included.
        let p = PrepareReport {
            rows: 1,
            dense_blocks: 2,
            row_deltas_sent: 3,
            dense_deltas_sent: 4,
            bytes_sent: 5,
            rows_decoded: 6,
            slot_wait_us: 9,
            behind_wait_us: 7,
            after: Some(txn()),
        };
        assert_eq!(prepare_report(prepare_reply(p)), p);
    }

    #[test]
    fn admissions_round_trip_and_an_unknown_one_names_the_three() {
        for a in [
            Admission::WaitDie,
            Admission::Queued,
            Admission::Reserve,
            Admission::After(txn()),
        ] {
            assert_eq!(
                admission_from_proto(proto::Admission::from(a) as i32, after_to_proto(a)).unwrap(),
                a
            );
        }
        // Only a queued prepare goes after another.
        for a in [Admission::WaitDie, Admission::Reserve] {
            let e =
                admission_from_proto(proto::Admission::from(a) as i32, Some(txn_to_proto(txn())))
                    .unwrap_err()
                    .to_string();
            assert!(e.contains("only a queued one may"), "{e}");
        }
        for v in [-1, 3, 99] {
            let e = admission_from_proto(v, None).unwrap_err().to_string();
            assert!(
                e.contains(&format!("unknown admission {v}"))
                    && e.contains("0 wait-die, 1 queued, 2 reserve"),
                "{e}"
            );
        }
    }

    #[test]
    fn member_keys_that_do_not_fit_a_request_are_refused() {
        for k in [
            MemberKey::Row {
                table: TableId(1 << 16),
                local: 0,
            },
            MemberKey::Parity {
                table: TableId(0),
                slot: 1 << 47,
            },
        ] {
            let e = keys_to_proto(&[k]).unwrap_err();
            assert!(e.to_string().contains("does not fit"), "{e}");
        }
        let edge = [
            MemberKey::Row {
                table: TableId(u32::from(u16::MAX)),
                local: (1 << 47) - 1,
            },
            MemberKey::Parity {
                table: TableId(u32::from(u16::MAX)),
                slot: (1 << 47) - 1,
            },
        ];
        let back = keys_from_proto(keys_to_proto(&edge).unwrap()).unwrap();
        assert_eq!(back, edge);
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn arbitrary_bytes_as_every_message(wire in bytes(600)) {
            every_reader(&wire);
        }

        #[test]
        fn mutated_messages(which in 0usize..3, ms in prop::collection::vec(mutation(), 0..6)) {
            let wire = match which {
                0 => mutated_encoding(&valid_update(), &ms),
                1 => mutated_encoding(&valid_batch(), &ms),
                _ => mutated_encoding(&valid_keys(), &ms),
            };
            every_reader(&wire);
        }

        #[test]
        fn arbitrary_transaction_updates(
            tables in prop::collection::vec(any::<u32>(), 0..4),
            part_rows in prop::collection::vec(prop_oneof![0u32..4, any::<u32>()], 0..4),
            rows in bytes(80),
            grads in bytes(80),
            dense_offsets in prop::collection::vec(huge(), 0..3),
            dense_lens in prop::collection::vec(prop_oneof![0u32..8, any::<u32>()], 0..3),
            dense_grads in bytes(40),
            with_txn in any::<bool>(),
            admission in -1i32..4,
            with_after in any::<bool>(),
        ) {
            let p = proto::TxnUpdate {
                txn: with_txn.then(|| txn_to_proto(txn())),
                tables, part_rows, rows: rows.into(), grads: grads.into(), dense_offsets,
                dense_lens, dense_grads: dense_grads.into(), admission,
                after: with_after.then(|| txn_to_proto(txn())),
            };
            every_reader(&p.encode_to_vec());
        }

        #[test]
        fn arbitrary_delta_batches(
            row_tables in prop::collection::vec(any::<u32>(), 0..4),
            rows in bytes(64),
            row_deltas in bytes(80),
            dense_blocks in bytes(32),
            dense_lens in prop::collection::vec(prop_oneof![0u32..8, any::<u32>()], 0..4),
            dense_grads in bytes(40),
            step in huge(),
        ) {
            let p = proto::DeltaBatch {
                step, from: 0, apply_now: true, row_tables, rows: rows.into(),
                row_deltas: row_deltas.into(), dense_blocks: dense_blocks.into(), dense_lens,
                dense_grads: dense_grads.into(), txn: None,
            };
            every_reader(&p.encode_to_vec());
        }

        #[test]
        fn arbitrary_member_keys(keys in bytes(48)) {
            every_reader(&proto::ReadMembersRequest { keys }.encode_to_vec());
        }
    }
}

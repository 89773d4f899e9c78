//! Fixtures of the ECRec tests: an in-process ECRec cluster driven step by step the way the
//! coordinator drives it (workers stage on owners, then 2PC on every node), and a plain
//! cluster without coding as the failure-free reference.

#![allow(dead_code)]

use std::sync::Arc;

use ftrec_core::rng::SplitMix;
use ftrec_core::{ModelDigest, Optimizer, OptimizerKind, ServerId, ShardMap, TableId, DENSE_BLOCK};
use ftrec_ps::ec::{
    run_txn, EcClient, EcConfig, EcNode, EcService, ParityAudit, TxnId, TxnPhase, TxnReport,
};
use ftrec_ps::{dense_value_range, Limits, PsError, Server, ServerConfig, Update};

pub const DIM: usize = 4;
pub const TABLE_ROWS: [u64; 4] = [23, 7, 3, 61];
pub const DENSE_LEN: usize = 3 * DENSE_BLOCK + 37;
pub const SEED: u64 = 5;
pub const WORKERS: u32 = 2;

pub fn config(servers: u32, server: u32, sparse: OptimizerKind) -> ServerConfig {
    ServerConfig {
        server: ServerId(server),
        shard_map: ShardMap::new(servers).unwrap(),
        table_rows: TABLE_ROWS.to_vec(),
        dim: DIM,
        sparse_optimizer: Optimizer::new(sparse, 0.05),
        dense_optimizer: Optimizer::new(OptimizerKind::Adam, 0.01),
        seed: SEED,
        init_scale: 0.1,
        limits: Limits::default(),
    }
}

pub fn dense_init() -> Vec<f32> {
    let mut g = SplitMix::new(17);
    (0..DENSE_LEN).map(|_| g.next_f32() - 0.5).collect()
}

/// Worker `worker`'s gradients for step `step`: a few rows per table (hot rows repeat) and
/// the whole dense vector.
pub fn worker_update(step: u64, worker: u32) -> Update {
    let mut g = SplitMix::keyed(SEED, step, worker as u64);
    let mut u = Update::new();
    for (t, &rows) in TABLE_ROWS.iter().enumerate() {
        let n = 1 + (g.next_u64() % 5) as usize;
        let ids: Vec<u64> = (0..n).map(|_| g.next_u64() % rows).collect();
        let grads = (0..n * DIM).map(|_| g.next_f32() - 0.5).collect();
        u = u.with_sparse(TableId(t as u32), ids, grads);
    }
    u.with_dense(
        0,
        (0..DENSE_LEN).map(|_| (g.next_f32() - 0.5) * 0.1).collect(),
    )
}

/// One server's share of `update`.
pub fn share(update: &Update, servers: u32, server: ServerId) -> Update {
    let map = ShardMap::new(servers).unwrap();
    let mut out = Update::new();
    for p in &update.sparse {
        let mut rows = Vec::new();
        let mut grads = Vec::new();
        for (i, &r) in p.rows.iter().enumerate() {
            if map.owner(p.table, r) == server {
                rows.push(r);
                grads.extend_from_slice(&p.grads[i * DIM..(i + 1) * DIM]);
            }
        }
        if !rows.is_empty() {
            out = out.with_sparse(p.table, rows, grads);
        }
    }
    let range = dense_value_range(DENSE_LEN as u64, servers, server);
    for d in &update.dense {
        if range.start < range.end {
            out = out.with_dense(
                range.start,
                d.grads[range.start as usize..range.end as usize].to_vec(),
            );
        }
    }
    out
}

/// The failure-free reference: plain servers, `commit_step`.
pub struct Reference {
    pub servers: Vec<Server>,
}

impl Reference {
    pub fn new(n: u32, sparse: OptimizerKind) -> Self {
        let d = dense_init();
        Reference {
            servers: (0..n)
                .map(|s| Server::new(config(n, s, sparse), &d).unwrap())
                .collect(),
        }
    }

    pub fn step(&mut self, step: u64) {
        let n = self.servers.len() as u32;
        for w in 0..WORKERS {
            let u = worker_update(step, w);
            for (s, server) in self.servers.iter_mut().enumerate() {
                server
                    .stage_step(step, w, share(&u, n, ServerId(s as u32)))
                    .unwrap();
            }
        }
        let order: Vec<u32> = (0..WORKERS).collect();
        for s in &mut self.servers {
            s.commit_step(step, &order).unwrap();
        }
    }

    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for s in &self.servers {
            d.merge(&s.digest());
        }
        d
    }
}

/// An in-process ECRec cluster; a lost node's slot is `None`.
pub struct EcCluster {
    pub n: u32,
    pub ec: EcConfig,
    pub sparse: OptimizerKind,
    pub nodes: Vec<Option<EcNode>>,
}

impl EcCluster {
    pub fn new(n: u32, ec: EcConfig, sparse: OptimizerKind) -> Self {
        let d = dense_init();
        let nodes: Vec<Option<EcNode>> = (0..n)
            .map(|s| Some(EcNode::new(config(n, s, sparse), &d, ec).unwrap()))
            .collect();
        let c = EcCluster {
            n,
            ec,
            sparse,
            nodes,
        };
        c.wire_peers();
        c
    }

    /// Give every live node in-process clients of every live node.
    pub fn wire_peers(&self) {
        let peers: Vec<Option<EcClient>> = self
            .nodes
            .iter()
            .map(|n| n.as_ref().map(EcClient::in_process))
            .collect();
        for n in self.nodes.iter().flatten() {
            n.set_peer_clients(peers.clone()).unwrap();
        }
    }

    pub fn node(&self, s: u32) -> &EcNode {
        self.nodes[s as usize].as_ref().unwrap()
    }

    /// Kill server `s`: it stops answering, and every handle to it here is dropped.
    pub fn kill(&mut self, s: u32) {
        if let Some(n) = self.nodes[s as usize].take() {
            n.kill();
        }
    }

    /// Put a replacement for `s` in place (all its state missing) and rewire the peers.
    pub fn replace(&mut self, s: u32, lost: &[u32]) -> EcNode {
        let lost: Vec<ServerId> = lost.iter().map(|&l| ServerId(l)).collect();
        let node = EcNode::new_replacement(
            config(self.n, s, self.sparse),
            &dense_init(),
            self.ec,
            &lost,
        )
        .unwrap();
        self.nodes[s as usize] = Some(node.clone());
        self.wire_peers();
        node
    }

    /// Workers stage their shares of step `step` on every live node.
    pub fn stage(&self, step: u64) -> Result<(), PsError> {
        for w in 0..WORKERS {
            let u = worker_update(step, w);
            for (s, n) in self.nodes.iter().enumerate() {
                if let Some(n) = n {
                    n.shared().write()?.stage_step(
                        step,
                        w,
                        share(&u, self.n, ServerId(s as u32)),
                    )?;
                }
            }
        }
        Ok(())
    }

    pub fn workers() -> Vec<u32> {
        (0..WORKERS).collect()
    }

    /// Phase 1 on every live node; the first error is returned after trying all.
    pub async fn prepare_all(&self, step: u64) -> Result<(), PsError> {
        let mut first = None;
        for n in self.nodes.iter().flatten() {
            if let Err(e) = EcService::prepare(n, step, Self::workers()).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub async fn commit_all(&self, step: u64) -> Result<(), PsError> {
        for n in self.nodes.iter().flatten() {
            EcService::commit(n, step).await?;
        }
        Ok(())
    }

    pub async fn abort_all(&self, step: u64) {
        for n in self.nodes.iter().flatten() {
            EcService::abort(n, step).await.unwrap();
        }
    }

    /// One whole step as the coordinator runs it (2PC, or one phase without it).
    pub async fn step(&self, step: u64) -> Result<(), PsError> {
        self.stage(step)?;
        if self.ec.two_phase {
            if let Err(e) = self.prepare_all(step).await {
                self.abort_all(step).await;
                return Err(e);
            }
            self.commit_all(step).await
        } else {
            for n in self.nodes.iter().flatten() {
                EcService::apply_step(n, step, Self::workers()).await?;
            }
            Ok(())
        }
    }

    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for n in self.nodes.iter().flatten() {
            d.merge(&n.shared().read().unwrap().digest());
        }
        d
    }

    pub async fn audit(&self) -> ParityAudit {
        let nodes: Vec<EcNode> = self.nodes.iter().map(|n| n.clone().unwrap()).collect();
        let layout = nodes[0].layout().clone();
        let code = nodes[0].code().clone();
        ftrec_ps::ec::audit_parities(&nodes, &layout, &code)
            .await
            .unwrap()
    }

    /// Assert that every parity equals a fresh encode of its stripe and every dense replica
    /// its primary, bit for bit, and (with `committed`) that every node committed exactly that
    /// many transactions or steps.
    pub async fn assert_exact(&self, committed: Option<u64>, what: &str) {
        let audit = self.audit().await;
        assert_eq!(
            (audit.parity_mismatches, audit.replica_mismatches),
            (0, 0),
            "{what}: {audit:?}"
        );
        if let Some(total) = committed {
            for s in 0..self.n {
                assert_eq!(
                    self.node(s).committed_step().unwrap(),
                    Some(total),
                    "{what}: node {s}"
                );
            }
        }
    }

    /// Wait (by yielding, never by time) until `s` reports a finished rebuild.
    pub async fn wait_rebuilt(&self, s: u32) {
        for _ in 0..1_000_000 {
            let st = EcService::rebuild_status(self.node(s)).await.unwrap();
            assert_eq!(st.error, None, "rebuild of {s} failed");
            if st.finished {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("rebuild of server {s} did not finish");
    }
}

/// Every server's share of `update` (empty where it touches nothing), for a transaction.
pub fn shares(update: &Update, servers: u32) -> Vec<Arc<Update>> {
    (0..servers)
        .map(|s| Arc::new(share(update, servers, ServerId(s))))
        .collect()
}

/// The model asynchronous training produces when updates arrive in a known order: plain
/// servers, each update pushed (one optimizer step per touched row and block).
pub struct PushReference {
    pub servers: Vec<Server>,
}

impl PushReference {
    pub fn new(n: u32, sparse: OptimizerKind) -> Self {
        PushReference {
            servers: Reference::new(n, sparse).servers,
        }
    }

    pub fn push(&mut self, update: &Update) {
        let n = self.servers.len() as u32;
        for (s, server) in self.servers.iter_mut().enumerate() {
            let u = share(update, n, ServerId(s as u32));
            if !u.is_empty() {
                server.push(&u).unwrap();
            }
        }
    }

    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for s in &self.servers {
            d.merge(&s.digest());
        }
        d
    }
}

/// A transaction id of `worker` for the update of batch `priority`.
pub fn txn_id(worker: u32, seq: u64, priority: u64) -> TxnId {
    TxnId {
        worker,
        epoch: 1,
        seq,
        priority,
    }
}

impl EcCluster {
    /// In-process clients of every node, in server order (a killed node's fails).
    pub fn clients(&self) -> Vec<EcClient> {
        self.nodes
            .iter()
            .map(|n| EcClient::in_process(n.as_ref().expect("a client needs every node in place")))
            .collect()
    }

    /// `update` as one transaction of `worker`, as a worker runs it.
    pub async fn txn(
        &self,
        worker: u32,
        priority: u64,
        update: &Update,
    ) -> Result<TxnReport, PsError> {
        let mut seq = ftrec_ps::ec::TxnCursor::at(priority * 1000);
        run_txn(
            &self.clients(),
            txn_id(worker, seq.seq, priority),
            &shares(update, self.n),
            self.ec.two_phase,
            &mut seq,
            &[],
            |_: TxnPhase| async {},
        )
        .await
    }
}

/// A runtime with two worker threads, for tests where transactions or a rebuild really run
/// at the same time.
pub fn two_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `shares` as transaction `txn` with 2PC (phases split at `split`), dropped for good when it
/// reaches `stop_at` (its batch timed out there): `None` then, with `seq` the sequence number
/// of the attempt that was dropped; the transaction's result if it ended first.
pub async fn run_txn_until(
    clients: &[EcClient],
    txn: TxnId,
    shares: &[Arc<Update>],
    split: &[TxnPhase],
    stop_at: TxnPhase,
    seq: &mut ftrec_ps::ec::TxnCursor,
) -> Option<Result<TxnReport, PsError>> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut tx = Some(tx);
    let run = run_txn(clients, txn, shares, true, seq, split, |p| {
        let stop = p == stop_at;
        if stop {
            if let Some(tx) = tx.take() {
                let _ = tx.send(());
            }
        }
        async move {
            if stop {
                std::future::pending::<()>().await;
            }
        }
    });
    tokio::select! {
        r = run => Some(r),
        _ = rx => None,
    }
}

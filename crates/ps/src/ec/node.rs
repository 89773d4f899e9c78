//! [`EcNode`]: one server's ECRec state and the operations on it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use ftrec_core::prefetch::{prefetch, AHEAD};
use ftrec_core::table::init_row;
use ftrec_core::{DenseParams, Optimizer, RowId, ServerId, TableId};
use ftrec_ec::{Code, CodeKind, Location, StripeId, StripeLayout};

use super::service::{EcClient, EcService};
use super::types::{
    DeltaBatch, DenseRead, MemberKey, MemberRead, PackedBatch, PrepareReport, RebuildHook,
    RebuildStatus, TxnId,
};
use crate::server::{dense_block_range, dense_value_range, PreparedStep};
use crate::update::{ApplyReport, DenseBlock};
use crate::{PsError, Server, ServerConfig, ServiceGate, ServiceOp, SharedServer};

/// [`EcConfig::peer_timeout`] unless set.
pub const DEFAULT_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// [`EcConfig::rebuild_share_ppm`] of a rebuild that never rests.
pub const FULL_SHARE_PPM: u32 = 1_000_000;

/// How a deployment runs ECRec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcConfig {
    pub code: CodeKind,
    /// Data rows per stripe.
    pub k: usize,
    /// Parity rows per stripe: losses tolerated at once.
    pub r: usize,
    /// Copies of each primary dense range besides the primary, on the next servers (0: dense
    /// replication off, `--no-dense-replication`; a lost dense range then cannot be rebuilt).
    pub dense_replicas: usize,
    /// Two-phase commit of every step (ECRec §3.5); off is `--no-2pc`.
    pub two_phase: bool,
    /// Lock ranges of a rebuild (ECRec §3.4), at least 1.
    pub lock_ranges: usize,
    /// Longest a call to a peer may take before it fails (server-to-server deltas, member
    /// and dense reads of a rebuild): a hung peer must not stall a step or a rebuild.
    pub peer_timeout: std::time::Duration,
    /// Share of the time a background rebuild may spend working, in millionths: after each
    /// batch it rests long enough that its busy time stays within the share (1,000,000: no
    /// rest; 0: the lock ranges wait until the share is raised, while degraded reads still
    /// decode on demand). Changed at run time with [`EcNode::set_rebuild_share`].
    pub rebuild_share_ppm: u32,
    /// Stripes per rebuild batch; `None`: as many as make about 4 MiB of rows read and
    /// decoded (the default, clamped to 64..=65,536 stripes). A batch is the unit of a
    /// rebuild's reads, cut and merge; at the full share two are in flight at a time.
    pub rebuild_batch_stripes: Option<usize>,
}

impl EcConfig {
    /// `k` data and `r` parity rows per stripe, `r` dense copies, 2PC on, one lock range.
    pub fn new(code: CodeKind, k: usize, r: usize) -> Self {
        EcConfig {
            code,
            k,
            r,
            dense_replicas: r,
            two_phase: true,
            lock_ranges: 1,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            rebuild_share_ppm: FULL_SHARE_PPM,
            rebuild_batch_stripes: None,
        }
    }

    /// Check against a cluster of `servers` servers; a bad value names itself.
    pub fn validate(&self, servers: u32) -> Result<(), PsError> {
        let bad = |m: String| Err(PsError::InvalidConfig(m));
        if self.k == 0 || self.r == 0 {
            return bad(format!(
                "ECRec needs k >= 1 and r >= 1 (got k = {}, r = {})",
                self.k, self.r
            ));
        }
        if self.k as u64 + self.r as u64 > u64::from(servers) {
            return bad(format!(
                "ECRec with k = {} and r = {} needs at least k + r = {} servers (the rows and \
                 parities of a stripe must sit on different servers), but there are {servers}",
                self.k,
                self.r,
                self.k + self.r
            ));
        }
        if self.code == CodeKind::Sum && self.r != 1 {
            return bad(format!(
                "the sum code has exactly one parity per stripe (r = 1), got r = {}; use gf256",
                self.r
            ));
        }
        if self.dense_replicas as u64 >= u64::from(servers) {
            return bad(format!(
                "{} dense replicas need more than {servers} servers",
                self.dense_replicas
            ));
        }
        if self.lock_ranges == 0 {
            return bad("a rebuild needs at least one lock range".into());
        }
        if self.rebuild_batch_stripes == Some(0) {
            return bad("a rebuild batch needs at least one stripe".into());
        }
        Ok(())
    }
}

/// A copy of another server's primary dense range.
#[derive(Debug, Clone)]
pub(crate) struct Replica {
    pub primary: ServerId,
    pub blocks: Range<u64>,
    pub dense: DenseParams,
}

/// Staged deltas of one sender for one step, already resolved to local slots. The delta
/// words stay in the buffer they arrived in.
#[derive(Debug, Clone, Default)]
pub(crate) struct StagedIncoming {
    /// Per row delta, in buffer order: (table, parity slot, stripe position, parity index).
    rows: Vec<(u32, u64, u8, u8)>,
    deltas: Vec<f32>,
    /// (replica index, local block, offset of its gradient in `grads`, length)
    dense: Vec<(usize, usize, usize, usize)>,
    grads: Vec<f32>,
}

impl StagedIncoming {
    /// Heap bytes it holds (capacities).
    pub(crate) fn bytes(&self) -> u64 {
        (self.rows.capacity() * std::mem::size_of::<(u32, u64, u8, u8)>()
            + self.deltas.capacity() * 4
            + self.dense.capacity() * std::mem::size_of::<(usize, usize, usize, usize)>()
            + self.grads.capacity() * 4) as u64
    }
}

/// What a replacement still has to rebuild.
#[derive(Debug, Clone)]
pub(crate) struct Missing {
    pub lost: Vec<ServerId>,
    pub rows: Vec<Vec<bool>>,
    pub parities: Vec<Vec<bool>>,
    pub rows_left: u64,
    pub parities_left: u64,
    /// Rows and parities missing when the rebuild started (its progress is measured against).
    pub total: u64,
    pub dense_missing: bool,
    /// The plan of the rebuild under way, once started.
    pub plan: Option<Arc<ftrec_ec::RecoveryPlan>>,
    /// Per missing parity slot, the stamp of the rebuild lock that last zeroed it (0: none);
    /// a decode is merged only into slots its own lock zeroed.
    pub stamps: Vec<Vec<u64>>,
    pub next_stamp: u64,
}

/// The background driver of one rebuild generation.
pub(crate) struct Driver {
    #[allow(dead_code)]
    pub generation: u64,
    pub handle: tokio::task::JoinHandle<()>,
}

pub(crate) struct EcState {
    /// Parity rows per table, `words` words per slot.
    pub parity: Vec<Vec<f32>>,
    pub replicas: Vec<Replica>,
    prepared: BTreeMap<u64, PreparedStep>,
    incoming: BTreeMap<u64, BTreeMap<u32, StagedIncoming>>,
    /// Last step committed on this node (data rows, parities and replicas alike).
    pub committed: Option<u64>,
    pub missing: Option<Missing>,
    pub status: RebuildStatus,
    /// Rebuild batches between their lock and their merge right now.
    pub locks_open: u32,
    /// When the current rebuild generation started.
    pub rebuild_t0: Option<std::time::Instant>,
    /// Transactions of asynchronous training (ECRec §3.5, worker-coordinated 2PC).
    pub txn: super::txn::TxnState,
}

impl EcState {
    /// Forget every prepared step and every step's staged deltas (a restore).
    pub(crate) fn clear_steps(&mut self) {
        self.prepared.clear();
        self.incoming.clear();
    }
}

pub(crate) struct EcInner {
    pub me: ServerId,
    pub server: SharedServer,
    pub layout: StripeLayout,
    pub code: Code,
    pub cfg: EcConfig,
    pub dim: usize,
    pub words: usize,
    pub dense_opt: Optimizer,
    pub state: Mutex<EcState>,
    pub peers: RwLock<Vec<Option<EcClient>>>,
    /// What this node's gRPC clients of its peers prove ([`EcNode::set_peer_auth`]).
    pub peer_auth: RwLock<crate::auth::Auth>,
    /// Set by [`EcNode::kill`]: in-process peers see the node as gone.
    pub killed: std::sync::atomic::AtomicBool,
    pub hook: RwLock<Option<RebuildHook>>,
    /// The background rebuild driver under way.
    pub driver: Mutex<Option<Driver>>,
    /// Held while a rebuild is started or restarted (one start at a time).
    pub control: tokio::sync::Mutex<()>,
    /// Held by the rebuild driver running lock ranges (one driver at a time).
    pub driving: tokio::sync::Mutex<()>,
    /// The rebuild share in millionths ([`EcConfig::rebuild_share_ppm`]).
    pub share: tokio::sync::watch::Sender<u32>,
    /// Woken whenever the transaction holding the node commits or aborts.
    pub slot_freed: tokio::sync::Notify,
    /// Prepares waiting for the slot, for the memory report.
    pub waiting: super::memory::Waiting,
    /// One-phase transactions apply one at a time per node.
    pub apply_lock: tokio::sync::Mutex<()>,
    /// Buffers rebuild batches decoded into, kept for the next batches.
    pub decode_buffers: Mutex<Vec<Vec<f32>>>,
}

/// One server with ECRec on. Cheap to clone (clones share the node).
#[derive(Clone)]
pub struct EcNode {
    pub(crate) inner: Arc<EcInner>,
}

impl std::fmt::Debug for EcNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EcNode")
            .field("server", &self.inner.me)
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

fn poisoned() -> PsError {
    PsError::Internal("ECRec state lock poisoned by an earlier panic".into())
}

impl EcNode {
    /// Server `config.server` with ECRec on: its shard as [`Server::new`] builds it, the parity
    /// rows the layout places on it (encoded from the seeded initial rows, so every node
    /// computes its own without traffic) and its dense replicas.
    pub fn new(config: ServerConfig, dense_init: &[f32], ec: EcConfig) -> Result<Self, PsError> {
        Self::build(config, dense_init, ec, true)
    }

    /// [`EcNode::new`]; without `encode`, the parity slots are zeros (a replacement: every
    /// slot is missing until its rebuild, so encoding the seeded rows would be work thrown
    /// away, most of its start-up time on a large shard).
    fn build(
        config: ServerConfig,
        dense_init: &[f32],
        ec: EcConfig,
        encode: bool,
    ) -> Result<Self, PsError> {
        let n = config.shard_map.servers();
        ec.validate(n)?;
        let layout = StripeLayout::new(n, ec.k, ec.r, &config.table_rows)?;
        let code = Code::new(ec.code, ec.k, ec.r)?;
        let server = Server::new(config.clone(), dense_init)?;
        let me = config.server;
        let words = server.layout().words();
        let dim = config.dim;
        let parity = initial_parities(&layout, &code, &config, me, words, encode)?;
        let dense_len = dense_init.len() as u64;
        let replicas = (1..=ec.dense_replicas)
            .map(|d| {
                let primary = ServerId((me.0 + n - d as u32 % n) % n);
                let blocks = dense_block_range(dense_len, n, primary);
                let values = dense_value_range(dense_len, n, primary);
                Replica {
                    primary,
                    blocks,
                    dense: DenseParams::new(
                        dense_init[values.start as usize..values.end as usize].to_vec(),
                        &config.dense_optimizer,
                    ),
                }
            })
            .collect();
        let state = EcState {
            parity,
            replicas,
            prepared: BTreeMap::new(),
            incoming: BTreeMap::new(),
            committed: None,
            missing: None,
            status: RebuildStatus::default(),
            locks_open: 0,
            rebuild_t0: None,
            txn: Default::default(),
        };
        let node = EcNode {
            inner: Arc::new(EcInner {
                me,
                server: SharedServer::new(server),
                layout,
                code,
                cfg: ec,
                dim,
                words,
                dense_opt: config.dense_optimizer,
                state: Mutex::new(state),
                peers: RwLock::new(vec![None; n as usize]),
                peer_auth: RwLock::new(crate::auth::Auth::none()),
                killed: std::sync::atomic::AtomicBool::new(false),
                hook: RwLock::new(None),
                driver: Mutex::new(None),
                control: tokio::sync::Mutex::new(()),
                driving: tokio::sync::Mutex::new(()),
                share: tokio::sync::watch::Sender::new(ec.rebuild_share_ppm.min(FULL_SHARE_PPM)),
                slot_freed: tokio::sync::Notify::new(),
                waiting: Default::default(),
                apply_lock: tokio::sync::Mutex::new(()),
                decode_buffers: Mutex::new(Vec::new()),
            }),
        };
        node.inner
            .server
            .set_gate(Some(Arc::new(EcGate(downgrade(&node)))))?;
        Ok(node)
    }

    /// A replacement for lost server `config.server`: everything it will hold is marked
    /// missing until [`EcService::start_rebuild`] rebuilds it; `lost` are all servers lost at
    /// the moment (itself included).
    pub fn new_replacement(
        config: ServerConfig,
        dense_init: &[f32],
        ec: EcConfig,
        lost: &[ServerId],
    ) -> Result<Self, PsError> {
        let node = Self::build(config, dense_init, ec, false)?;
        node.mark_missing(lost)?;
        Ok(node)
    }

    fn mark_missing(&self, lost: &[ServerId]) -> Result<(), PsError> {
        let mut lost = lost.to_vec();
        if !lost.contains(&self.inner.me) {
            lost.push(self.inner.me);
        }
        lost.sort_unstable();
        lost.dedup();
        let rows: Vec<Vec<bool>> = {
            let s = self.inner.server.read()?;
            (0..self.inner.layout.tables())
                .map(|t| vec![true; s.shard(TableId(t as u32)).map_or(0, |x| x.rows()) as usize])
                .collect()
        };
        let mut st = self.state()?;
        let parities: Vec<Vec<bool>> = st
            .parity
            .iter()
            .map(|p| vec![true; p.len() / self.inner.words])
            .collect();
        let rows_left = rows.iter().map(|r| r.len() as u64).sum();
        let parities_left = parities.iter().map(|p| p.len() as u64).sum();
        let stamps = parities.iter().map(|p| vec![0; p.len()]).collect();
        st.missing = Some(Missing {
            stamps,
            next_stamp: 0,
            lost,
            rows,
            parities,
            rows_left,
            parities_left,
            total: rows_left + parities_left,
            dense_missing: true,
            plan: None,
        });
        ftrec_obs::metrics()
            .ecrec_rebuild_progress_ratio
            .set(if rows_left + parities_left == 0 {
                1.0
            } else {
                0.0
            });
        st.status = RebuildStatus {
            rows_missing: rows_left,
            parities_missing: parities_left,
            ..RebuildStatus::default()
        };
        Ok(())
    }

    pub(crate) fn state(&self) -> Result<MutexGuard<'_, EcState>, PsError> {
        self.inner.state.lock().map_err(|_| poisoned())
    }

    /// Make this node unreachable for in-process peers and stop its background rebuild: the
    /// in-process stand-in for a killed process.
    pub fn kill(&self) {
        self.inner
            .killed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(d) = self.inner.driver.lock().ok().and_then(|mut d| d.take()) {
            d.handle.abort();
        }
    }

    /// Run `hook` at every [`RebuildPoint`] of this node's rebuild batches (`None`: none).
    pub fn set_rebuild_hook(&self, hook: Option<RebuildHook>) -> Result<(), PsError> {
        *self.inner.hook.write().map_err(|_| poisoned())? = hook;
        Ok(())
    }

    pub fn is_killed(&self) -> bool {
        self.inner.killed.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn server_id(&self) -> ServerId {
        self.inner.me
    }

    /// The wrapped parameter server, for [`crate::grpc::ps_service`] and
    /// [`crate::InProcessClient`].
    pub fn shared(&self) -> &SharedServer {
        &self.inner.server
    }

    pub fn layout(&self) -> &StripeLayout {
        &self.inner.layout
    }

    pub fn code(&self) -> &Code {
        &self.inner.code
    }

    pub fn config(&self) -> EcConfig {
        self.inner.cfg
    }

    /// Peer clients by server id (`None`: unknown or lost). Replaces the whole list; the entry
    /// of this node itself is ignored.
    pub fn set_peer_clients(&self, peers: Vec<Option<EcClient>>) -> Result<(), PsError> {
        let n = self.inner.layout.servers() as usize;
        if peers.len() != n {
            return Err(PsError::InvalidConfig(format!(
                "peer list has {} entries but the cluster has {n} servers",
                peers.len()
            )));
        }
        *self.inner.peers.write().map_err(|_| poisoned())? = peers;
        Ok(())
    }

    /// Set one peer (after a replacement took over its id), or forget it with `None`.
    pub fn set_peer(&self, server: ServerId, peer: Option<EcClient>) -> Result<(), PsError> {
        let mut peers = self.inner.peers.write().map_err(|_| poisoned())?;
        let slot = peers
            .get_mut(server.0 as usize)
            .ok_or(PsError::InvalidConfig(format!(
                "server {} is not in the cluster",
                server.0
            )))?;
        *slot = peer;
        Ok(())
    }

    /// The token and job id this node's calls to its peers carry (the process's own: the
    /// peers are servers of the same job). Applies to peers set after the call.
    pub fn set_peer_auth(&self, auth: crate::auth::Auth) -> Result<(), PsError> {
        *self.inner.peer_auth.write().map_err(|_| poisoned())? = auth;
        Ok(())
    }

    /// Peers from `host:port` addresses by server id (empty: unknown); gRPC clients connect
    /// lazily on first use. Must be called inside a tokio runtime.
    pub fn set_peer_addrs(&self, addrs: &[String]) -> Result<(), PsError> {
        let auth = self.inner.peer_auth.read().map_err(|_| poisoned())?.clone();
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if a.is_empty() || i == self.inner.me.0 as usize {
                    Ok(None)
                } else {
                    super::grpc::EcGrpcClient::connect_lazy_with(a, &auth).map(|c| {
                        Some(EcClient::Grpc(Box::new(
                            c.with_timeout(self.inner.cfg.peer_timeout),
                        )))
                    })
                }
            })
            .collect::<Result<Vec<_>, PsError>>()?;
        self.set_peer_clients(peers)
    }

    pub(crate) fn peer(&self, server: ServerId) -> Result<EcClient, PsError> {
        if server == self.inner.me {
            return Ok(EcClient::in_process(self));
        }
        self.inner
            .peers
            .read()
            .map_err(|_| poisoned())?
            .get(server.0 as usize)
            .cloned()
            .flatten()
            .ok_or(PsError::Unavailable {
                addr: format!("server {}", server.0),
                reason: "no peer address is known for it (lost, or set_peers not called)".into(),
            })
    }

    /// Last step committed on this node.
    pub fn committed_step(&self) -> Result<Option<u64>, PsError> {
        Ok(self.state()?.committed)
    }

    /// This node's parity rows of `table`, `words` words per slot.
    pub fn parity_rows(&self, table: TableId) -> Result<Vec<f32>, PsError> {
        let st = self.state()?;
        st.parity
            .get(table.0 as usize)
            .cloned()
            .ok_or(PsError::UnknownTable {
                table: table.0,
                tables: st.parity.len() as u64,
            })
    }

    /// Bytes held for redundancy (parity rows and dense replicas) and for the model (rows and
    /// primary dense range) on this node.
    pub fn memory(&self) -> Result<(u64, u64), PsError> {
        let st = self.state()?;
        let parity: u64 = st.parity.iter().map(|p| p.len() as u64 * 4).sum();
        let replicas: u64 = st
            .replicas
            .iter()
            .map(|r| (r.dense.values.len() + r.dense.state.len()) as u64 * 4)
            .sum();
        let s = self.inner.server.read()?;
        let rows: u64 = (0..self.inner.layout.tables())
            .map(|t| s.shard(TableId(t as u32)).map_or(0, |x| x.bytes()))
            .sum();
        let dense = (s.dense().values.len() + s.dense().state.len()) as u64 * 4;
        Ok((parity + replicas, rows + dense))
    }

    // ---- phase 1 ----

    /// Compute step `step` and send its deltas to the parity and replica holders, staged
    /// (`apply_now` false) or applied on arrival.
    async fn compute_and_send(
        &self,
        step: u64,
        workers: &[u32],
        apply_now: bool,
    ) -> Result<(PreparedStep, PrepareReport), PsError> {
        let mut report = PrepareReport::default();
        if self.state()?.missing.is_some() {
            let needed = self.inner.server.read()?.staged_rows(step);
            report.rows_decoded = self.ensure_present(&needed).await?;
        }
        let prepared = self.inner.server.read()?.prepare_step(step, workers)?;
        self.propagate(step, None, &prepared, None, apply_now, &mut report)
            .await?;
        Ok((prepared, report))
    }

    /// Difference propagation (ECRec §3.2, §3.3): send each parity holder the deltas of the
    /// prepared rows of its stripes and each replica holder the summed dense gradients, for
    /// step `step` or transaction `txn`, to be staged or (with `apply_now`) applied on
    /// arrival; returns once every peer took its batch. `base`: the prepared step `prepared`
    /// was computed on top of ([`crate::server::Server::prepare_update_into`]), whose rows
    /// are the words before for the rows it prepared.
    pub(crate) async fn propagate(
        &self,
        step: u64,
        txn: Option<TxnId>,
        prepared: &PreparedStep,
        base: Option<&PreparedStep>,
        apply_now: bool,
        report: &mut PrepareReport,
    ) -> Result<(), PsError> {
        let me = self.inner.me;
        let code = &self.inner.code;
        let layout = &self.inner.layout;
        let n = layout.servers() as usize;
        let w = self.inner.words;
        // One flat batch per peer, indexed by server id.
        let mut batches: Vec<Option<PackedBatch>> = vec![None; n];
        let mut holders = Vec::with_capacity(layout.r());
        for p in prepared.tables() {
            report.rows += p.rows.len() as u64;
            if p.words != w {
                return Err(PsError::ShapeMismatch {
                    what: format!("prepared rows of table {}", p.table.0),
                    expected: w as u64,
                    got: p.words as u64,
                });
            }
        }
        // The words before the step are read from the table (or from `base`, for the rows it
        // prepared): the caller holds this node for the step from its prepare to its commit,
        // behind `base` when there is one, so nothing else changes the rows it touches
        // meanwhile. The read lock is released before anything is sent.
        self.inner
            .server
            .read()?
            .prepared_row_pairs(prepared, base, |table, row, old, new| {
                if old.iter().zip(new).all(|(a, b)| a.to_bits() == b.to_bits()) {
                    // An update that changed no bit changes no parity.
                    return Ok(());
                }
                // ECRec §3.2: the same difference goes to every parity holder of the stripe,
                // each multiplies it by its own coefficient. It is computed once, straight
                // into the first holder's buffer, and copied from there to the others.
                layout.row_parities_into(table, row, &mut holders)?;
                let mut first: Option<(usize, usize)> = None;
                for &(holder, _) in &holders {
                    let h = holder.0 as usize;
                    let b = batches[h].get_or_insert_with(|| {
                        PackedBatch::new(step, me, apply_now, w).for_txn(txn)
                    });
                    b.rows.push((table, row));
                    let at = b.deltas.len();
                    match first {
                        None => {
                            b.deltas.resize(at + w, 0.0);
                            code.delta(old, new, &mut b.deltas[at..])?;
                            first = Some((h, at));
                        }
                        Some((f, fat)) if f == h => b.deltas.extend_from_within(fat..fat + w),
                        Some((f, fat)) => {
                            let (src, dst) = two_batches(&mut batches, f, h);
                            dst.deltas.extend_from_slice(&src.deltas[fat..fat + w]);
                        }
                    }
                    report.row_deltas_sent += 1;
                    report.bytes_sent += 12 + w as u64 * 4;
                }
                Ok(())
            })?;
        report.dense_blocks = prepared.dense.len() as u64;
        if !prepared.dense.is_empty() {
            for d in 1..=self.inner.cfg.dense_replicas {
                // ECRec §3.3: replicas apply the same summed gradient as the primary.
                let h = (me.0 as usize + d) % n;
                let b = batches[h]
                    .get_or_insert_with(|| PackedBatch::new(step, me, apply_now, w).for_txn(txn));
                b.dense_grads.reserve(prepared.dense_grads.len());
                for pd in &prepared.dense {
                    b.dense_blocks.push(pd.block);
                    b.dense_lens.push(pd.len as u32);
                    b.dense_grads.extend_from_slice(prepared.dense_grad(pd));
                    report.dense_deltas_sent += 1;
                    report.bytes_sent += 8 + pd.len as u64 * 4;
                }
            }
        }
        let mut sends = Vec::new();
        for (s, b) in batches.into_iter().enumerate() {
            if let Some(b) = b {
                sends.push((self.peer(ServerId(s as u32))?, b));
            }
        }
        // The sends run together on this task (a task spawned per peer would only add a
        // hand-off to another thread and back for each), in-process ones included: a call
        // into the peer's memory finishes at its first poll.
        crate::join::join_all(
            sends
                .into_iter()
                .map(|(peer, b)| async move { peer.stage_packed(b).await }),
        )
        .await
        .into_iter()
        .collect()
    }

    /// Phase 1 of step `step` (ECRec §3.5): see the module docs.
    pub async fn prepare(&self, step: u64, workers: &[u32]) -> Result<PrepareReport, PsError> {
        let (prepared, report) = self.compute_and_send(step, workers, false).await?;
        self.state()?.prepared.insert(step, prepared);
        Ok(report)
    }

    /// Phase 2: apply this node's prepared rows and dense blocks and every delta staged for
    /// `step`, atomically with respect to member reads.
    pub fn commit(&self, step: u64) -> Result<ApplyReport, PsError> {
        let mut st = self.state()?;
        let prepared = st
            .prepared
            .get(&step)
            .ok_or(PsError::NotPrepared { step })?;
        let report = self.inner.server.write()?.commit_prepared(prepared)?;
        if st.locks_open > 0 {
            st.status.commits_in_lock += 1;
        }
        st.prepared.remove(&step);
        let incoming = st.incoming.remove(&step).unwrap_or_default();
        for (_, inc) in incoming {
            self.apply_incoming(&mut st, &inc)?;
        }
        // Stale stages of earlier steps can no longer commit.
        st.prepared.retain(|&s, _| s > step);
        st.incoming.retain(|&s, _| s > step);
        st.committed = Some(step);
        Ok(report)
    }

    /// Drop step `step` everywhere on this node: prepared rows, staged deltas and the
    /// workers' staged contributions. Returns how many contributions were dropped.
    pub fn abort(&self, step: u64) -> Result<usize, PsError> {
        let mut st = self.state()?;
        st.prepared.remove(&step);
        st.incoming.remove(&step);
        Ok(self.inner.server.write()?.abort_step(step))
    }

    /// One-phase step (`--no-2pc`): compute, forward the deltas to be applied on arrival, apply
    /// here.
    pub async fn apply_step(&self, step: u64, workers: &[u32]) -> Result<ApplyReport, PsError> {
        let (prepared, _) = self.compute_and_send(step, workers, true).await?;
        let mut st = self.state()?;
        let report = self.inner.server.write()?.commit_prepared(&prepared)?;
        st.committed = Some(step);
        Ok(report)
    }

    pub(crate) fn apply_incoming(
        &self,
        st: &mut EcState,
        inc: &StagedIncoming,
    ) -> Result<(), PsError> {
        let w = self.inner.words;
        if !inc.rows.is_empty() {
            for (i, (&(t, slot, position, j), delta)) in
                inc.rows.iter().zip(inc.deltas.chunks_exact(w)).enumerate()
            {
                // The parity rows are scattered over the node's parity tables: ask for the
                // one a few deltas on while this one is applied (`ftrec_core::prefetch`).
                if let Some(p) = inc.rows.get(i + AHEAD).and_then(|&(ta, sa, _, _)| {
                    let at = sa as usize * w;
                    st.parity.get(ta as usize)?.get(at..at + w)
                }) {
                    prefetch(p);
                }
                let at = slot as usize * w;
                let parity = &mut st.parity[t as usize][at..at + w];
                self.inner.code.apply_delta(
                    usize::from(position),
                    usize::from(j),
                    delta,
                    parity,
                )?;
            }
        }
        let opt = self.inner.dense_opt;
        for &(ri, b, at, len) in &inc.dense {
            let (v, s) = st.replicas[ri].dense.block_mut(b, &opt);
            opt.apply_split(v, s, &inc.grads[at..at + len]);
        }
        Ok(())
    }

    /// Take a peer's deltas for `batch.step`: validated completely, then staged (or applied at
    /// once in one-phase mode).
    pub fn stage_deltas(&self, batch: DeltaBatch) -> Result<(), PsError> {
        self.stage_packed(PackedBatch::from_batch(batch)?)
    }

    /// [`EcNode::stage_deltas`] on the packed form the nodes send each other.
    pub(crate) fn stage_packed(&self, batch: PackedBatch) -> Result<(), PsError> {
        let layout = &self.inner.layout;
        let map = layout.shard_map();
        let me = self.inner.me;
        let w = self.inner.words;
        if !batch.rows.is_empty()
            && (batch.words != w || batch.deltas.len() != batch.rows.len() * w)
        {
            return Err(PsError::ShapeMismatch {
                what: format!("row deltas from server {}", batch.from.0),
                expected: (batch.rows.len() * w) as u64,
                got: batch.deltas.len() as u64,
            });
        }
        let mut inc = StagedIncoming {
            rows: Vec::with_capacity(batch.rows.len()),
            deltas: batch.deltas,
            dense: Vec::with_capacity(batch.dense_blocks.len()),
            grads: Vec::new(),
        };
        for &(table, row) in &batch.rows {
            if map.owner(table, row) != batch.from {
                return Err(PsError::MalformedRequest(format!(
                    "server {} sent a delta for row {row} of table {}, which it does not own",
                    batch.from.0, table.0
                )));
            }
            let (position, j, slot) = layout.parity_on(table, row, me)?.ok_or_else(|| {
                PsError::MalformedRequest(format!(
                    "server {} holds no parity of row {row} of table {}",
                    me.0, table.0
                ))
            })?;
            // Positions are below k and parity indices below r, both at most 256.
            inc.rows
                .push((table.0, slot.index, position as u8, j as u8));
        }
        if batch.dense_blocks.len() != batch.dense_lens.len()
            || batch.dense_lens.iter().map(|&l| l as usize).sum::<usize>()
                != batch.dense_grads.len()
        {
            return Err(PsError::MalformedRequest(format!(
                "dense block ids, lengths and gradients from server {} disagree",
                batch.from.0
            )));
        }
        let mut st = self.state()?;
        if !batch.dense_blocks.is_empty() {
            let ri = st
                .replicas
                .iter()
                .position(|r| r.primary == batch.from)
                .ok_or_else(|| {
                    PsError::MalformedRequest(format!(
                        "server {} holds no replica of server {}'s dense blocks",
                        me.0, batch.from.0
                    ))
                })?;
            let r = &st.replicas[ri];
            let mut at = 0;
            for (&block, &len) in batch.dense_blocks.iter().zip(&batch.dense_lens) {
                let len = len as usize;
                if !r.blocks.contains(&block) {
                    return Err(PsError::MalformedRequest(format!(
                        "dense block {block} is not in server {}'s blocks {:?}",
                        batch.from.0, r.blocks
                    )));
                }
                let b = (block - r.blocks.start) as usize;
                let want =
                    (r.dense.len() - b * ftrec_core::DENSE_BLOCK).min(ftrec_core::DENSE_BLOCK);
                let grad = &batch.dense_grads[at..at + len];
                if len != want || !ftrec_core::dense::all_finite(grad) {
                    return Err(PsError::MalformedRequest(format!(
                        "dense gradient of block {block} has {len} values (expected {want}) or \
                         is not finite"
                    )));
                }
                inc.dense.push((ri, b, at, len));
                at += len;
            }
            inc.grads = batch.dense_grads;
        }
        if batch.apply_now {
            self.apply_incoming(&mut st, &inc)
        } else if let Some(txn) = batch.txn {
            super::txn::check_fence(&mut st, &txn, me)?;
            // Aborted here before this batch arrived (at the first failed answer of its
            // phase 1): staged now, it would never be taken.
            super::txn::refuse_if_aborted(
                &st,
                &txn,
                me,
                &format!("server {}'s differences for it arrived", batch.from.0),
            )?;
            st.txn
                .staged_at
                .entry(txn)
                .or_insert_with(std::time::Instant::now);
            st.txn
                .incoming
                .entry(txn)
                .or_default()
                .insert(batch.from.0, inc);
            Ok(())
        } else {
            if st.committed.is_some_and(|c| batch.step <= c) {
                return Err(PsError::StepAlreadyCommitted {
                    step: batch.step,
                    last: st.committed.unwrap_or(0),
                });
            }
            st.incoming
                .entry(batch.step)
                .or_default()
                .insert(batch.from.0, inc);
            Ok(())
        }
    }

    /// Words of `keys` at one instant, with the committed step (see [`MemberRead`]).
    pub fn read_members(&self, keys: &[MemberKey]) -> Result<MemberRead, PsError> {
        let st = self.state()?;
        let s = self.inner.server.read()?;
        let w = self.inner.words;
        let mut data = Vec::with_capacity(keys.len() * w);
        for k in keys {
            match *k {
                MemberKey::Row { table, local } => {
                    if let Some(m) = &st.missing {
                        if m.rows
                            .get(table.0 as usize)
                            .and_then(|r| r.get(local as usize))
                            .copied()
                            .unwrap_or(false)
                        {
                            return Err(PsError::Coding(format!(
                                "row {local} of table {} on server {} is not rebuilt yet",
                                table.0, self.inner.me.0
                            )));
                        }
                    }
                    data.extend_from_slice(s.local_row_words(table, local)?);
                }
                MemberKey::Parity { table, slot } => {
                    let p = st
                        .parity
                        .get(table.0 as usize)
                        .ok_or(PsError::UnknownTable {
                            table: table.0,
                            tables: st.parity.len() as u64,
                        })?;
                    let slots = (p.len() / w) as u64;
                    if slot >= slots {
                        return Err(PsError::Coding(format!(
                            "parity slot {slot} of table {} is out of range on server {} \
                             ({slots} slots)",
                            table.0, self.inner.me.0
                        )));
                    }
                    if let Some(m) = &st.missing {
                        if m.parities[table.0 as usize][slot as usize] {
                            return Err(PsError::Coding(format!(
                                "parity slot {slot} of table {} on server {} is not rebuilt yet",
                                table.0, self.inner.me.0
                            )));
                        }
                    }
                    data.extend_from_slice(&p[slot as usize * w..(slot as usize + 1) * w]);
                }
            }
        }
        Ok(MemberRead {
            step: st.committed,
            words: w,
            data,
        })
    }

    /// The primary dense range of `primary` (this node's own, or a replica it holds).
    pub fn read_dense(&self, primary: ServerId) -> Result<DenseRead, PsError> {
        let st = self.state()?;
        if st.missing.as_ref().is_some_and(|m| m.dense_missing) {
            return Err(PsError::Coding(format!(
                "server {} has not rebuilt its dense blocks yet",
                self.inner.me.0
            )));
        }
        let block = if primary == self.inner.me {
            let s = self.inner.server.read()?;
            s.export_dense(s.dense_blocks())?
        } else {
            let r = st
                .replicas
                .iter()
                .find(|r| r.primary == primary)
                .ok_or_else(|| {
                    PsError::MalformedRequest(format!(
                        "server {} holds no copy of server {}'s dense blocks",
                        self.inner.me.0, primary.0
                    ))
                })?;
            DenseBlock {
                first_block: r.blocks.start,
                values: r.dense.values.clone(),
                state: r.dense.state.clone(),
            }
        };
        Ok(DenseRead {
            step: st.committed,
            block,
        })
    }

    /// Install rows decoded for this node; rows no longer missing are left alone (a newer
    /// decode or an update got there first). Returns how many were installed.
    pub(crate) fn install_rows(
        &self,
        st: &mut EcState,
        rows: &[(TableId, u64, &[f32])],
    ) -> Result<u64, PsError> {
        let Some(m) = st.missing.as_mut() else {
            return Ok(0);
        };
        let mut s = self.inner.server.write()?;
        let mut n = 0;
        for (table, local, words) in rows {
            let flag = &mut m.rows[table.0 as usize][*local as usize];
            if *flag {
                s.import_row_words(*table, *local, words)?;
                *flag = false;
                m.rows_left -= 1;
                n += 1;
            }
        }
        st.status.rows_missing = st.missing.as_ref().map_or(0, |m| m.rows_left);
        Ok(n)
    }

    /// Whether this node still has to rebuild local row `local` of `table`.
    pub(crate) fn row_missing(st: &EcState, table: TableId, local: u64) -> bool {
        st.missing
            .as_ref()
            .is_some_and(|m| m.rows[table.0 as usize][local as usize])
    }

    /// The global rows of `table` this node owns, as local indices.
    pub(crate) fn local_of(&self, table: TableId, row: RowId) -> u64 {
        self.inner.layout.shard_map().local_index(table, row)
    }
}

/// Batches `a` and `b` (`a != b`, both present) borrowed at once.
fn two_batches(
    batches: &mut [Option<PackedBatch>],
    a: usize,
    b: usize,
) -> (&PackedBatch, &mut PackedBatch) {
    debug_assert_ne!(a, b);
    let (src, dst) = if a < b {
        let (lo, hi) = batches.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = batches.split_at_mut(a);
        (&hi[0], &mut lo[b])
    };
    (
        src.as_ref().expect("the first holder's batch exists"),
        dst.as_mut().expect("the batch was just created"),
    )
}

/// This server's parity slots, encoded from the seeded initial rows (zeros without
/// `encode`).
fn initial_parities(
    layout: &StripeLayout,
    code: &Code,
    config: &ServerConfig,
    me: ServerId,
    words: usize,
    encode: bool,
) -> Result<Vec<Vec<f32>>, PsError> {
    let counts = layout.parity_rows_per_table(me)?;
    let mut out: Vec<Vec<f32>> = counts
        .iter()
        .map(|&c| vec![0.0f32; c as usize * words])
        .collect();
    if !encode {
        return Ok(out);
    }
    let (k, r) = (layout.k(), layout.r());
    let mut data = vec![vec![0.0f32; words]; k];
    let mut parity = vec![vec![0.0f32; words]; r];
    for (slot, stripe, j) in layout.parity_slots(me)? {
        fill_initial_rows(layout, config, stripe, &mut data)?;
        let ins: Vec<&[f32]> = data.iter().map(|v| v.as_slice()).collect();
        let mut outs: Vec<&mut [f32]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
        code.encode(&ins, &mut outs)?;
        let at = slot.index as usize * words;
        out[slot.table.0 as usize][at..at + words].copy_from_slice(&parity[j]);
    }
    Ok(out)
}

fn fill_initial_rows(
    layout: &StripeLayout,
    config: &ServerConfig,
    stripe: StripeId,
    data: &mut [Vec<f32>],
) -> Result<(), PsError> {
    let dim = config.dim;
    for m in layout.members(stripe)? {
        if m.position >= data.len() {
            continue;
        }
        let row = &mut data[m.position];
        row.fill(0.0);
        if let Location::Row { table, row: id, .. } = m.location {
            init_row(config.seed, table, id, config.init_scale, &mut row[..dim]);
        }
    }
    Ok(())
}

/// Result of [`audit_parities`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParityAudit {
    pub stripes: u64,
    /// Parities that differ from a fresh encode of their stripe, bit for bit.
    pub parity_mismatches: u64,
    /// Largest absolute difference between a stored and a freshly encoded parity word
    /// (meaningful for the sum code, whose float parities drift).
    pub max_abs_error: f64,
    /// Dense replica words that differ from their primary, bit for bit.
    pub replica_mismatches: u64,
}

/// Check every parity of a cluster against a fresh encode of its stripe and every dense
/// replica against its primary, through the nodes' services (any transport). Reads go
/// table by table; the cluster must be quiet (no step committing) meanwhile.
pub async fn audit_parities<S: EcService>(
    nodes: &[S],
    layout: &StripeLayout,
    code: &Code,
) -> Result<ParityAudit, PsError> {
    let n = layout.servers() as usize;
    if nodes.len() != n {
        return Err(PsError::InvalidConfig(format!(
            "audit needs all {n} nodes, got {}",
            nodes.len()
        )));
    }
    let map = layout.shard_map();
    let mut audit = ParityAudit::default();
    for t in 0..layout.tables() {
        let table = TableId(t as u32);
        let rows = layout.table_rows()[t];
        // Every row of the table, by global id.
        let mut by_server: Vec<Vec<MemberKey>> = vec![Vec::new(); n];
        for row in 0..rows {
            by_server[map.owner(table, row).0 as usize].push(MemberKey::Row {
                table,
                local: map.local_index(table, row),
            });
        }
        let mut data: Vec<MemberRead> = Vec::with_capacity(n);
        for (s, keys) in by_server.iter().enumerate() {
            data.push(nodes[s].read_members(keys.clone()).await?);
        }
        let mut parities: Vec<MemberRead> = Vec::with_capacity(n);
        for (s, node) in nodes.iter().enumerate() {
            let slots = layout.parity_rows_on(ServerId(s as u32), table)?;
            let keys = (0..slots)
                .map(|slot| MemberKey::Parity { table, slot })
                .collect();
            parities.push(node.read_members(keys).await?);
        }
        let w = data
            .iter()
            .chain(parities.iter())
            .map(|r| r.words)
            .max()
            .unwrap_or(0);
        let row_words = |row: RowId| -> &[f32] {
            let s = map.owner(table, row).0 as usize;
            let l = map.local_index(table, row) as usize;
            &data[s].data[l * w..(l + 1) * w]
        };
        let zeros = vec![0.0f32; w];
        let mut enc = vec![vec![0.0f32; w]; layout.r()];
        for index in 0..layout.stripes(table)? {
            let stripe = StripeId { table, index };
            let members = layout.members(stripe)?;
            let ins: Vec<&[f32]> = members[..layout.k()]
                .iter()
                .map(|m| match m.location {
                    Location::Row { row, .. } => row_words(row),
                    _ => &zeros[..],
                })
                .collect();
            let mut outs: Vec<&mut [f32]> = enc.iter_mut().map(|v| v.as_mut_slice()).collect();
            code.encode(&ins, &mut outs)?;
            for m in &members[layout.k()..] {
                if let Location::Parity { parity, slot } = m.location {
                    let s = m.server.0 as usize;
                    let at = slot.index as usize * w;
                    let stored = &parities[s].data[at..at + w];
                    if stored
                        .iter()
                        .zip(&enc[parity])
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        audit.parity_mismatches += 1;
                    }
                    // Equal bits are no error (a gf256 parity word may be any bit pattern,
                    // NaN included, so the float difference says nothing then).
                    for (a, b) in stored
                        .iter()
                        .zip(&enc[parity])
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        let e = (f64::from(*a) - f64::from(*b)).abs();
                        if e > audit.max_abs_error || e.is_nan() {
                            audit.max_abs_error = e;
                        }
                    }
                }
            }
            audit.stripes += 1;
        }
    }
    for (s, node) in nodes.iter().enumerate() {
        let primary = node.read_dense(ServerId(s as u32)).await?;
        for d in 1..n {
            let holder = (s + d) % n;
            match nodes[holder].read_dense(ServerId(s as u32)).await {
                Ok(copy) => {
                    let diff = |a: &[f32], b: &[f32]| {
                        if a.len() != b.len() {
                            return a.len().max(b.len()) as u64;
                        }
                        a.iter()
                            .zip(b)
                            .filter(|(x, y)| x.to_bits() != y.to_bits())
                            .count() as u64
                    };
                    audit.replica_mismatches += diff(&copy.block.values, &primary.block.values)
                        + diff(&copy.block.state, &primary.block.state);
                }
                Err(PsError::MalformedRequest(_)) => break,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(audit)
}

/// What the plain parameter-server service may do on an ECRec node ([`ServiceGate`]).
struct EcGate(Weak<EcInner>);

impl ServiceGate for EcGate {
    fn check(&self, op: ServiceOp) -> Result<(), PsError> {
        match self.0.upgrade() {
            Some(inner) => EcNode { inner }.check_service(op),
            None => Ok(()),
        }
    }
}

impl EcNode {
    /// Writes of the plain service are refused: they would change rows and dense blocks
    /// without their parities and replicas (ECRec §3.2, §3.3). A replacement answers reads
    /// and stages only once it has joined (its dense part copied, its rows decoded on
    /// demand), and its shard as a whole (digest, exports) only once it is rebuilt: before,
    /// it would serve seeded rows as if they were the model.
    fn check_service(&self, op: ServiceOp) -> Result<(), PsError> {
        let me = self.inner.me.0;
        match op {
            ServiceOp::Push
            | ServiceOp::CommitStep
            | ServiceOp::ImportRows
            | ServiceOp::ImportDense => Err(PsError::Refused {
                what: format!("{} on server {me}", op.name()),
                reason: "the server runs ECRec, where rows and dense blocks change only \
                         together with their parities and replicas: send updates through \
                         the ECRec service (prepare and commit, or apply_step)"
                    .into(),
            }),
            ServiceOp::PullRows | ServiceOp::PullDense | ServiceOp::StageStep => {
                match &self.state()?.missing {
                    Some(m) if m.dense_missing => Err(PsError::NotReady {
                        server: me,
                        reason: "a replacement that has not joined yet (its rows are seeded, \
                                 not the model's, until its rebuild starts)"
                            .into(),
                    }),
                    _ => Ok(()),
                }
            }
            ServiceOp::Digest | ServiceOp::ExportRows | ServiceOp::ExportDense => {
                match &self.state()?.missing {
                    Some(m) => Err(PsError::NotReady {
                        server: me,
                        reason: format!(
                            "rebuilding ({} rows and {} parity rows still missing)",
                            m.rows_left, m.parities_left
                        ),
                    }),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// Weak handle used by in-process peers, so that dropping every strong handle of a node
/// makes it unreachable (a lost server in tests).
pub(crate) fn downgrade(node: &EcNode) -> Weak<EcInner> {
    Arc::downgrade(&node.inner)
}

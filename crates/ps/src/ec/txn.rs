//! Transactions of asynchronous training (ECRec §3.5): each worker coordinates the two-phase
//! commit of its own update.
//!
//! Phase 1 ([`EcNode::txn_prepare`]): the worker sends every node its share of the update
//! (an empty share where it touches nothing). The node takes its transaction slot (wait-die,
//! see [`TxnId`]), computes its new rows and dense blocks from its current state without
//! exposing them, sends the parity holders the rows' differences and the replica holders the
//! dense gradients, staged under the transaction, and answers once every peer staged them.
//! Phase 2 ([`EcNode::txn_commit`]): the worker tells every node to commit; a node installs
//! its rows and applies every delta and gradient staged for the transaction, counts the
//! commit and frees its slot. A loss in phase 1: the worker aborts everywhere
//! ([`EcNode::txn_abort`]) and retries the update once the replacement joined. A loss in
//! phase 2: the survivors commit, and hold the lost node's differences for the transaction,
//! so its rebuild includes it.
//!
//! Since every transaction holds every node between its prepare and its commit, all nodes
//! commit transactions in the same order (the strict two-phase locking argument: a node
//! prepares a transaction only after the previous holder committed there, which it did only
//! once prepared everywhere). A node's count of committed transactions therefore names the
//! same updates on every node; it plays the role the step number plays in synchronous mode
//! ([`EcNode::committed_step`]), and the rebuild's consistent cuts work unchanged.
//!
//! Without 2PC ([`EcNode::txn_apply`]) a node applies its share at once and forwards the
//! differences to be applied on arrival, one transaction at a time per node, so dense
//! replicas see the primary's order; nothing orders transactions across nodes.
//!
//! A lost worker may leave a transaction prepared (holding the nodes) or half committed. The
//! coordinator fences the worker's incarnation on every node ([`EcNode::txn_fence`], after
//! which its messages are refused), reads what each node holds, and resolves every such
//! transaction ([`EcNode::txn_resolve`]): committed if any node committed it (the worker
//! decided to commit, so it was prepared everywhere), else aborted.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ftrec_core::ServerId;

use super::node::{EcNode, EcState, StagedIncoming};
use super::types::{PrepareReport, TxnId, TxnStatus};
use crate::server::PreparedStep;
use crate::update::{ApplyReport, RowRequest, Update};
use crate::PsError;

/// A node's transaction state.
#[derive(Debug, Default)]
pub(crate) struct TxnState {
    /// The transaction holding this node, with what it prepared here.
    pub holder: Option<(TxnId, PreparedStep)>,
    /// A transaction that took the slot and is computing its prepare.
    pub preparing: Option<TxnId>,
    /// Deltas and gradients staged by peers, per transaction and sender.
    pub incoming: HashMap<TxnId, BTreeMap<u32, StagedIncoming>>,
    /// Last transaction committed here, per worker.
    pub last_commit: HashMap<u32, TxnId>,
    /// Highest fenced incarnation per worker: its transactions are refused.
    pub fenced: HashMap<u32, u32>,
    /// The buffers of the last committed or aborted prepared step, reused by the next
    /// prepare (one transaction holds the node at a time, so one spare suffices).
    pub spare: Option<PreparedStep>,
}

impl TxnState {
    /// The transaction that holds the slot (prepared or preparing).
    fn slot(&self) -> Option<TxnId> {
        self.holder.as_ref().map(|(t, _)| *t).or(self.preparing)
    }
}

/// Refuse `txn` if its worker's incarnation was fenced off.
pub(crate) fn check_fence(st: &EcState, txn: &TxnId, me: ServerId) -> Result<(), PsError> {
    match st.txn.fenced.get(&txn.worker) {
        Some(&e) if txn.epoch <= e => Err(PsError::Refused {
            what: format!(
                "transaction {} of worker {} (incarnation {}) on server {}",
                txn.seq, txn.worker, txn.epoch, me.0
            ),
            reason: "that worker was declared lost and its transactions resolved".into(),
        }),
        _ => Ok(()),
    }
}

/// Rows an update touches, as pull requests.
fn rows_of(update: &Update) -> Vec<RowRequest> {
    update
        .sparse
        .iter()
        .map(|p| RowRequest {
            table: p.table,
            rows: p.rows.to_vec(),
        })
        .collect()
}

/// Frees the slot of a transaction whose prepare did not finish (an error, or the request
/// dropped half way), unless disarmed.
struct PrepareGuard<'a> {
    node: &'a EcNode,
    txn: TxnId,
    armed: bool,
}

impl Drop for PrepareGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(mut st) = self.node.state() {
            if st.txn.preparing == Some(self.txn) {
                st.txn.preparing = None;
            }
            st.txn.incoming.remove(&self.txn);
        }
        self.node.inner.slot_freed.notify_waiters();
    }
}

impl EcNode {
    /// Take this node's transaction slot for `txn`, waiting for an older holder and refusing
    /// (retryably) when the holder is older than `txn` (wait-die).
    async fn take_slot(&self, txn: TxnId) -> Result<(), PsError> {
        let me = self.inner.me;
        let wait = async {
            loop {
                let freed = self.inner.slot_freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                {
                    let mut st = self.state()?;
                    check_fence(&st, &txn, me)?;
                    match st.txn.slot() {
                        None => {
                            st.txn.preparing = Some(txn);
                            return Ok(());
                        }
                        Some(h) if h == txn => {
                            return Err(PsError::MalformedRequest(format!(
                                "transaction {} of worker {} is already prepared on server {}",
                                txn.seq, txn.worker, me.0
                            )))
                        }
                        Some(h) if txn.older_than(&h) => {}
                        Some(h) => {
                            return Err(PsError::NotReady {
                                server: me.0,
                                reason: format!(
                                    "held by an older transaction (worker {}, batch {}): \
                                     abort and retry",
                                    h.worker, h.priority
                                ),
                            })
                        }
                    }
                }
                freed.await;
            }
        };
        let limit = self.inner.cfg.peer_timeout;
        match tokio::time::timeout(limit, wait).await {
            Ok(r) => r,
            Err(_) => Err(PsError::NotReady {
                server: me.0,
                reason: format!(
                    "still held by another transaction after {:.1}s",
                    limit.as_secs_f64()
                ),
            }),
        }
    }

    /// Phase 1 of `txn` on this node: see the module docs.
    pub async fn txn_prepare(
        &self,
        txn: TxnId,
        share: Arc<Update>,
    ) -> Result<PrepareReport, PsError> {
        let waited = std::time::Instant::now();
        self.take_slot(txn).await?;
        let slot_wait_us = waited.elapsed().as_micros() as u64;
        let mut guard = PrepareGuard {
            node: self,
            txn,
            armed: true,
        };
        let mut report = PrepareReport {
            slot_wait_us,
            ..PrepareReport::default()
        };
        if self.state()?.missing.is_some() {
            report.rows_decoded = self.ensure_present(&rows_of(&share)).await?;
        }
        let mut prepared = self.state()?.txn.spare.take().unwrap_or_default();
        self.inner
            .server
            .read()?
            .prepare_update_into(&share, &mut prepared)?;
        self.propagate(0, Some(txn), &prepared, false, &mut report)
            .await?;
        let mut st = self.state()?;
        check_fence(&st, &txn, self.inner.me)?;
        st.txn.preparing = None;
        st.txn.holder = Some((txn, prepared));
        guard.armed = false;
        Ok(report)
    }

    /// Phase 2 of `txn` on this node: install what it prepared here and apply what peers
    /// staged for it, count the commit, free the slot.
    pub fn txn_commit(&self, txn: TxnId) -> Result<ApplyReport, PsError> {
        let report = {
            let mut st = self.state()?;
            check_fence(&st, &txn, self.inner.me)?;
            self.commit_locked(&mut st, txn)?
        };
        self.inner.slot_freed.notify_waiters();
        Ok(report)
    }

    fn commit_locked(&self, st: &mut EcState, txn: TxnId) -> Result<ApplyReport, PsError> {
        match &st.txn.holder {
            Some((h, _)) if *h == txn => {}
            _ if st.txn.last_commit.get(&txn.worker) == Some(&txn) => {
                // A repeated commit (a retried message): already done.
                return Ok(ApplyReport::default());
            }
            _ => {
                return Err(PsError::MalformedRequest(format!(
                    "transaction {} of worker {} is not prepared on server {}",
                    txn.seq, txn.worker, self.inner.me.0
                )))
            }
        }
        let report = {
            let (_, prepared) = st.txn.holder.as_ref().expect("checked above");
            self.inner.server.write()?.install_prepared(prepared)?
        };
        if let Some((_, prepared)) = st.txn.holder.take() {
            st.txn.spare = Some(prepared);
        }
        for (_, inc) in st.txn.incoming.remove(&txn).unwrap_or_default() {
            self.apply_incoming(st, &inc)?;
        }
        self.count_commit(st);
        st.txn.last_commit.insert(txn.worker, txn);
        Ok(report)
    }

    /// One more transaction committed here.
    fn count_commit(&self, st: &mut EcState) {
        st.committed = Some(st.committed.map_or(1, |c| c + 1));
        if st.locks_open > 0 {
            st.status.commits_in_lock += 1;
        }
    }

    /// Drop `txn` on this node (what it prepared and what peers staged for it).
    pub fn txn_abort(&self, txn: TxnId) -> Result<(), PsError> {
        {
            let mut st = self.state()?;
            Self::abort_locked(&mut st, txn);
        }
        self.inner.slot_freed.notify_waiters();
        Ok(())
    }

    fn abort_locked(st: &mut EcState, txn: TxnId) {
        if st.txn.holder.as_ref().is_some_and(|(h, _)| *h == txn) {
            st.txn.spare = st.txn.holder.take().map(|(_, p)| p);
        }
        if st.txn.preparing == Some(txn) {
            st.txn.preparing = None;
        }
        st.txn.incoming.remove(&txn);
    }

    /// `txn` in one phase (`--no-2pc`): compute, forward the differences to be applied on
    /// arrival, apply here. One at a time per node.
    pub async fn txn_apply(&self, txn: TxnId, share: Arc<Update>) -> Result<ApplyReport, PsError> {
        let _one = self.inner.apply_lock.lock().await;
        check_fence(&*self.state()?, &txn, self.inner.me)?;
        let mut report = PrepareReport::default();
        if self.state()?.missing.is_some() {
            self.ensure_present(&rows_of(&share)).await?;
        }
        let mut prepared = self.state()?.txn.spare.take().unwrap_or_default();
        self.inner
            .server
            .read()?
            .prepare_update_into(&share, &mut prepared)?;
        self.propagate(0, Some(txn), &prepared, true, &mut report)
            .await?;
        let mut st = self.state()?;
        let applied = self.inner.server.write()?.install_prepared(&prepared)?;
        st.txn.spare = Some(prepared);
        self.count_commit(&mut st);
        st.txn.last_commit.insert(txn.worker, txn);
        Ok(applied)
    }

    /// Refuse every later message of `worker`'s incarnations up to `epoch`, and say what of
    /// its transactions this node holds. Epoch 0 fences nothing (incarnations count from 1):
    /// a plain look.
    pub fn txn_fence(&self, worker: u32, epoch: u32) -> Result<TxnStatus, PsError> {
        let mut st = self.state()?;
        if epoch > 0 {
            let e = st.txn.fenced.entry(worker).or_insert(epoch);
            *e = (*e).max(epoch);
        }
        let epoch = if epoch == 0 { u32::MAX } else { epoch };
        let holding = st
            .txn
            .slot()
            .filter(|t| t.worker == worker && t.epoch <= epoch);
        let mut staged: Vec<TxnId> = st
            .txn
            .incoming
            .keys()
            .filter(|t| t.worker == worker && t.epoch <= epoch)
            .copied()
            .collect();
        staged.sort_unstable();
        Ok(TxnStatus {
            holding,
            last_commit: st.txn.last_commit.get(&worker).copied(),
            staged,
        })
    }

    /// Commit (`commit`) or abort `txn` of a fenced worker on this node. Committing needs the
    /// transaction prepared here; anything else of it is dropped either way.
    pub fn txn_resolve(&self, txn: TxnId, commit: bool) -> Result<(), PsError> {
        {
            let mut st = self.state()?;
            if commit && st.txn.holder.as_ref().is_some_and(|(h, _)| *h == txn) {
                self.commit_locked(&mut st, txn)?;
            } else {
                Self::abort_locked(&mut st, txn);
            }
        }
        self.inner.slot_freed.notify_waiters();
        Ok(())
    }
}

/// A point of a worker's transaction where [`run_txn`]'s caller may hold it (fault
/// injection: a server killed in one phase or the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnPhase {
    /// Before phase 1 is sent.
    Prepare,
    /// After phase 1 succeeded everywhere, before phase 2 is sent.
    Commit,
}

/// What one transaction cost its worker, and what went wrong without stopping it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TxnReport {
    /// Wall time of phase 1 (all attempts) and of phase 2 (or of the one-phase apply).
    pub prepare_s: f64,
    pub commit_s: f64,
    /// Phase-1 attempts refused by wait-die or a busy node, aborted and tried again.
    pub retries: u32,
    /// Time spent waiting for other transactions: the phase-1 attempts refused (with the
    /// back-off after them) and, in the attempt that went through, the longest wait for a
    /// node's slot.
    pub lock_wait_s: f64,
    /// Nodes whose phase 2 failed (lost after phase 1): the survivors committed.
    pub commit_failures: Vec<(ServerId, PsError)>,
    /// Summed over the nodes' phase-1 reports.
    pub prepared: PrepareReport,
}

/// Longest a transaction keeps retrying phase 1 after wait-die refusals.
const TXN_RETRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Run one worker's update as transaction `txn` over every node (`nodes[i]` is server `i`,
/// `shares[i]` its share, empty where the update touches nothing): 2PC coordinated here
/// (ECRec §3.5), or one phase without it. A phase-1 refusal that is worth retrying
/// (wait-die, a busy node) aborts everywhere and tries again under a fresh sequence number
/// taken from `next_seq`, keeping the priority; any other phase-1 error aborts everywhere and
/// is returned (a lost node: the caller retries the update against its replacement). Phase 2
/// commits on every node it can; the failures are reported, not returned. `at_phase` runs
/// before each phase is sent.
pub async fn run_txn<C, H, HF>(
    nodes: &[C],
    mut txn: TxnId,
    shares: &[Arc<Update>],
    two_phase: bool,
    next_seq: &mut u64,
    mut at_phase: H,
) -> Result<TxnReport, PsError>
where
    C: super::EcService + Clone + 'static,
    H: FnMut(TxnPhase) -> HF,
    HF: std::future::Future<Output = ()>,
{
    use std::time::Instant;
    if nodes.len() != shares.len() {
        return Err(PsError::InvalidConfig(format!(
            "{} shares for {} nodes",
            shares.len(),
            nodes.len()
        )));
    }
    let mut report = TxnReport::default();
    // What the abort and commit messages carry: nothing.
    let empty = Arc::new(Update::new());
    let t0 = Instant::now();
    if !two_phase {
        at_phase(TxnPhase::Prepare).await;
        let res = on_all(nodes, shares, move |c, s| async move {
            c.txn_apply(txn, s).await
        })
        .await;
        report.commit_s = t0.elapsed().as_secs_f64();
        for (_, r) in res {
            r?;
        }
        return Ok(report);
    }
    let mut wait = std::time::Duration::from_millis(1);
    loop {
        at_phase(TxnPhase::Prepare).await;
        let attempt = Instant::now();
        let res = on_all(nodes, shares, move |c, s| async move {
            c.txn_prepare(txn, s).await
        })
        .await;
        let mut retry = true;
        let mut first: Option<PsError> = None;
        let mut sum = PrepareReport::default();
        for (_, r) in res {
            match r {
                Ok(p) => {
                    sum.rows += p.rows;
                    sum.dense_blocks += p.dense_blocks;
                    sum.row_deltas_sent += p.row_deltas_sent;
                    sum.dense_deltas_sent += p.dense_deltas_sent;
                    sum.bytes_sent += p.bytes_sent;
                    sum.rows_decoded += p.rows_decoded;
                    sum.slot_wait_us = sum.slot_wait_us.max(p.slot_wait_us);
                }
                Err(e) => {
                    retry &= e.is_retryable();
                    // A lost node's error says more than a refusal caused by the abort.
                    if first
                        .as_ref()
                        .is_none_or(|f| f.is_retryable() && !e.is_retryable())
                    {
                        first = Some(e);
                    }
                }
            }
        }
        let Some(e) = first else {
            report.lock_wait_s += sum.slot_wait_us as f64 * 1e-6;
            report.prepared = sum;
            break;
        };
        // Abort everywhere (a node that refused holds nothing of it; one that is gone
        // cannot answer) before anything else is sent for this update.
        let _ = on_all(
            nodes,
            &vec![Arc::clone(&empty); nodes.len()],
            move |c, _| async move { c.txn_abort(txn).await },
        )
        .await;
        if !retry || t0.elapsed() > TXN_RETRY_LIMIT {
            return Err(e);
        }
        report.retries += 1;
        tokio::time::sleep(wait).await;
        report.lock_wait_s += attempt.elapsed().as_secs_f64();
        wait = (wait * 2).min(std::time::Duration::from_millis(50));
        *next_seq += 1;
        txn.seq = *next_seq;
    }
    report.prepare_s = t0.elapsed().as_secs_f64();
    at_phase(TxnPhase::Commit).await;
    let t1 = Instant::now();
    let res = on_all(
        nodes,
        &vec![Arc::clone(&empty); nodes.len()],
        move |c, _| async move { c.txn_commit(txn).await },
    )
    .await;
    report.commit_s = t1.elapsed().as_secs_f64();
    for (i, r) in res {
        if let Err(e) = r {
            report.commit_failures.push((ServerId(i as u32), e));
        }
    }
    Ok(report)
}

/// `f(node, share)` on every node at once; results by node index.
async fn on_all<C, T, F, Fut>(
    nodes: &[C],
    shares: &[Arc<Update>],
    f: F,
) -> Vec<(usize, Result<T, PsError>)>
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(C, Arc<Update>) -> Fut,
    Fut: std::future::Future<Output = Result<T, PsError>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, (c, s)) in nodes.iter().zip(shares).enumerate() {
        let fut = f(c.clone(), s.clone());
        set.spawn(async move { (i, fut.await) });
    }
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(x) => out.push(x),
            Err(e) => out.push((
                usize::MAX,
                Err(PsError::Internal(format!(
                    "transaction call task failed: {e}"
                ))),
            )),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

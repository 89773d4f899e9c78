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
//! commit and frees its slot. A refusal or a loss in phase 1: the worker aborts everywhere
//! ([`EcNode::txn_abort`]) at the first failed answer, not after the last one, so a node
//! where the attempt still waits for its slot lets go of it at once (an aborted transaction
//! never takes a slot, and a peer's differences for it that arrive after its abort are
//! refused); it retries the update (refused: under a fresh sequence number, queued; a lost
//! node: once the replacement joined). A loss in phase 2: the survivors commit, and hold the
//! lost node's differences for the transaction, so its rebuild includes it.
//!
//! A prepare takes the node's slot by wait-die, or queued after refusals (the gate node 0
//! reserved first): see [`Admission`].
//!
//! *Behind the holder* (early lock release with a commit dependency): every two updates share
//! rows on every node, so the slot orders them all, and a holder used to keep it through its
//! whole two phases. A queued transaction whose reservation finds the gate held by a prepared
//! queued transaction reserves *behind* it ([`Admission::Reserve`] answers with that one,
//! [`PrepareReport::after`]) and prepares everywhere as [`Admission::After`] it. On each node
//! it first waits until its predecessor has been there (prepared, committed or aborted: so
//! no node sees the two in the other order); where the predecessor holds the node prepared
//! and undecided, it computes its rows on top of the predecessor's prepared rows
//! ([`crate::server::Server::prepare_update_into`] with a base), propagates the differences
//! from those rows, and only then waits, holding its vote until the predecessor is decided
//! there: committed, it becomes the holder and votes (installing the two one after the other
//! gives what applying them in order gives, and so do the parities, which apply the staged
//! differences in commit order); aborted, it is refused (its rows started from rows that
//! never were) and its worker aborts and retries it. Since its vote waits, its worker cannot
//! decide it before its predecessor is decided everywhere, so every node still commits in one
//! order. What moves off the serial path is the successor's computing and propagation, which
//! now overlaps its predecessor's decision; the wait for the decision stays (see
//! `docs/DESIGN.md`, "Why every transaction holds every server"). Only queued transactions go
//! behind, one per node, never on a node that is rebuilding; a wait-die prepare meeting one is
//! refused like one meeting a queued holder, so no wait cycle forms: a transaction waits only
//! for those before it in the gate's order, or for wait-die holders that never wait for
//! queued ones.
//!
//! Since every transaction holds every node between its prepare and its commit, all nodes
//! commit transactions in the same order (the strict two-phase locking argument: a node
//! prepares a transaction only after the previous holder committed there, which it did only
//! once prepared everywhere; one behind the holder votes only after it). A node's count of committed transactions therefore names the
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
//!
//! A live worker can leave one half done too: its batch times out mid-phase, or a commit
//! fails on a server that is not lost. Such a transaction is resolved by [`resolve_txn`],
//! the cooperative termination of 2PC: block it on every node first ([`EcNode::txn_block`],
//! after which its worker's messages for it are refused, so no node can commit it any
//! more), then commit it everywhere if some node had committed it, else abort it. Its
//! worker runs it when a transaction of its own failed, before it reports the batch (so a
//! batch that committed is never trained again); a node runs it for every transaction that
//! held it longer than a lease ([`EcNode::resolve_expired`], [`TXN_LEASE`]), so a worker
//! that stalls cannot block a node. Resolution is idempotent: once blocked everywhere, the
//! nodes' answers only change by resolvers, which all decide the same.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftrec_core::ServerId;

use super::memory::prepared_capacity;
use super::node::{EcNode, EcState, StagedIncoming};
use super::types::{
    Admission, BehindStatus, PrepareReport, TxnCounters, TxnId, TxnOutcome, TxnStatus,
};
use crate::server::PreparedStep;
use crate::update::{ApplyReport, RowRequest, Update};
use crate::PsError;

/// A queued transaction taken behind this node's prepared holder ([`Admission::After`], or a
/// reservation at the gate): it computes on top of the holder's prepared rows, and votes only
/// once the holder is decided here (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Behind {
    pub txn: TxnId,
    /// The holder it goes behind.
    pub base: TxnId,
    /// The base's outcome here, once decided (`true`: committed).
    pub base_committed: Option<bool>,
    /// A reservation at the gate: nothing computed yet.
    pub reserved: bool,
    /// Bytes of its prepared step once computed (the memory report).
    pub prepared_bytes: u64,
}

/// A node's transaction state.
#[derive(Debug, Default)]
pub(crate) struct TxnState {
    /// The transaction holding this node, with what it prepared here (shared with the
    /// transaction behind it, which computes on top of it).
    pub holder: Option<(TxnId, Arc<PreparedStep>)>,
    /// The transaction behind the holder, if any; once the holder is decided it owns the
    /// slot until it is prepared (and becomes the holder) or gives up.
    pub behind: Option<Behind>,
    /// The last [`RECENT_ABORTS`] transactions aborted here (a transaction behind one waits
    /// until that one has been here).
    pub recent_aborts: VecDeque<TxnId>,
    /// A transaction that took the slot and is computing its prepare.
    pub preparing: Option<TxnId>,
    /// The transaction that took the slot as [`Admission::Queued`] or reserved it (the
    /// slot's holder is queued when it is this one).
    pub queued: Option<TxnId>,
    /// The transaction that reserved the slot ([`Admission::Reserve`]) and has not prepared
    /// here yet (it is the slot's `preparing` meanwhile; `held_since` starts its lease).
    pub reserved: Option<TxnId>,
    /// When the holder finished its prepare here: the start of its lease.
    pub held_since: Option<Instant>,
    /// Deltas and gradients staged by peers, per transaction and sender, and when the first
    /// of them arrived.
    pub incoming: HashMap<TxnId, BTreeMap<u32, StagedIncoming>>,
    pub staged_at: HashMap<TxnId, Instant>,
    /// The last [`RECENT_COMMITS`] transactions committed here, per worker (newest last).
    pub recent_commits: HashMap<u32, VecDeque<TxnId>>,
    /// Transactions a resolver blocked here: their worker's messages are refused.
    pub blocked: HashSet<TxnId>,
    /// Per worker, the newest (incarnation, sequence number) a resolver resolved here: a
    /// late message of it or of an older transaction (a prepare still on its way) is
    /// refused too.
    pub resolved_upto: HashMap<u32, (u32, u64)>,
    pub counters: TxnCounters,
    /// Highest fenced incarnation per worker: its transactions are refused.
    pub fenced: HashMap<u32, u32>,
    /// The buffers of the last committed or aborted prepared step, reused by the next
    /// prepare (one transaction holds the node at a time, so one spare suffices).
    pub spare: Option<PreparedStep>,
}

/// Committed transactions remembered per worker and node, for resolvers asking late.
const RECENT_COMMITS: usize = 64;

/// Aborted transactions remembered per node, for a transaction behind one of them.
const RECENT_ABORTS: usize = 256;

/// How long a transaction may hold a node (prepared, or with deltas staged) before the node
/// resolves it ([`EcNode::resolve_expired`]): well beyond a healthy transaction's two
/// phases and a peer call's timeout, so that only a stalled or vanished worker hits it.
pub const TXN_LEASE: Duration = Duration::from_secs(30);

impl TxnState {
    /// Forget every transaction (holder, staged deltas, commits and resolutions remembered)
    /// but the fences: the model they applied to has been replaced by a restore, and the
    /// cluster is quiet while it happens.
    pub(crate) fn clear_for_restore(&mut self) {
        let fenced = std::mem::take(&mut self.fenced);
        let counters = std::mem::take(&mut self.counters);
        *self = TxnState {
            fenced,
            counters,
            ..TxnState::default()
        };
    }

    /// The transaction that holds the slot (prepared or preparing, or behind a holder that
    /// was decided).
    fn slot(&self) -> Option<TxnId> {
        self.holder
            .as_ref()
            .map(|(t, _)| *t)
            .or(self.preparing)
            .or(self.behind.map(|b| b.txn))
    }

    /// Whether `h`, holding the slot, is a queued transaction (a wait-die prepare meeting it
    /// is refused whatever its age).
    fn queued_owner(&self, h: TxnId) -> bool {
        self.queued == Some(h) || self.behind.is_some_and(|b| b.txn == h)
    }

    /// Whether transaction `a` has been here: prepared (the holder), committed, aborted or
    /// resolved, or its worker fenced off.
    fn passed(&self, a: &TxnId) -> bool {
        self.holder.as_ref().is_some_and(|(h, _)| h == a)
            || self.committed(a)
            || self.recent_aborts.contains(a)
            || self.fenced_off(a)
            || self
                .resolved_upto
                .get(&a.worker)
                .is_some_and(|&upto| (a.epoch, a.seq) <= upto)
    }

    fn note_abort(&mut self, txn: TxnId) {
        if self.recent_aborts.contains(&txn) {
            return;
        }
        if self.recent_aborts.len() == RECENT_ABORTS {
            self.recent_aborts.pop_front();
        }
        self.recent_aborts.push_back(txn);
    }

    /// `base`, the holder, was decided here: the transaction behind it learns the outcome;
    /// a reservation behind it becomes a plain one (it owns the slot now, under the lease).
    fn base_decided(&mut self, base: TxnId, committed: bool) {
        let Some(b) = self.behind.as_mut() else {
            return;
        };
        if b.base != base {
            return;
        }
        if b.reserved {
            let t = b.txn;
            self.behind = None;
            self.preparing = Some(t);
            self.queued = Some(t);
            self.reserved = Some(t);
            self.held_since = Some(Instant::now());
        } else {
            b.base_committed = Some(committed);
        }
    }

    /// Whether `txn`'s worker incarnation was fenced off.
    fn fenced_off(&self, txn: &TxnId) -> bool {
        self.fenced
            .get(&txn.worker)
            .is_some_and(|&e| txn.epoch <= e)
    }

    fn committed(&self, txn: &TxnId) -> bool {
        self.recent_commits
            .get(&txn.worker)
            .is_some_and(|c| c.contains(txn))
    }

    /// The worker's last transaction committed here.
    fn last_commit(&self, worker: u32) -> Option<TxnId> {
        self.recent_commits
            .get(&worker)
            .and_then(|c| c.back())
            .copied()
    }

    fn note_commit(&mut self, txn: TxnId) {
        let c = self.recent_commits.entry(txn.worker).or_default();
        if c.len() == RECENT_COMMITS {
            c.pop_front();
        }
        c.push_back(txn);
    }

    /// Take what peers staged for `txn`.
    fn unstage(&mut self, txn: &TxnId) -> BTreeMap<u32, StagedIncoming> {
        self.staged_at.remove(txn);
        self.incoming.remove(txn).unwrap_or_default()
    }
}

/// Refuse (retryably) what arrives for `txn` after its worker aborted it here: it was aborted
/// before `what`. Its sequence number is never used again, so nothing of it may stay.
pub(crate) fn refuse_if_aborted(
    st: &EcState,
    txn: &TxnId,
    me: ServerId,
    what: &str,
) -> Result<(), PsError> {
    if st.txn.recent_aborts.contains(txn) {
        return Err(PsError::NotReady {
            server: me.0,
            reason: format!(
                "transaction {} of worker {} was aborted on server {} before {what}",
                txn.seq, txn.worker, me.0
            ),
        });
    }
    Ok(())
}

/// Refuse a worker's message for `txn` if its worker's incarnation was fenced off or a
/// resolver blocked the transaction.
pub(crate) fn check_fence(st: &mut EcState, txn: &TxnId, me: ServerId) -> Result<(), PsError> {
    let what = || {
        format!(
            "transaction {} of worker {} (incarnation {}) on server {}",
            txn.seq, txn.worker, txn.epoch, me.0
        )
    };
    if st.txn.fenced_off(txn) {
        return Err(PsError::Refused {
            what: what(),
            reason: "that worker was declared lost and its transactions resolved".into(),
        });
    }
    let resolved = st
        .txn
        .resolved_upto
        .get(&txn.worker)
        .is_some_and(|&upto| (txn.epoch, txn.seq) <= upto);
    if resolved || st.txn.blocked.contains(txn) {
        st.txn.counters.blocked_refusals += 1;
        return Err(PsError::NotReady {
            server: me.0,
            reason: format!(
                "{} is being resolved (it outlived its lease or its worker gave up on it)",
                what()
            ),
        });
    }
    Ok(())
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

/// How a prepare got into the node ([`EcNode::take_slot`]).
enum Taken {
    /// The slot: compute on the committed rows.
    Slot,
    /// Behind the prepared holder `base`: compute on top of its prepared rows, vote once it
    /// is decided here.
    Behind {
        base: TxnId,
        rows: Arc<PreparedStep>,
    },
    /// A reservation at the gate, behind the prepared holder named.
    ReservedBehind(TxnId),
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
            if st.txn.behind.is_some_and(|b| b.txn == self.txn) {
                st.txn.behind = None;
            }
            st.txn.unstage(&self.txn);
        }
        self.node.inner.slot_freed.notify_waiters();
    }
}

impl EcNode {
    /// Take this node's transaction slot for `txn`. Wait-die: wait for a younger holder,
    /// refuse (retryably) when the holder is older than `txn` or queued. Queued or reserve:
    /// wait for any holder; queued, take the slot `txn` reserved ([`Admission`]). Behind a
    /// transaction ([`Admission::After`]): first wait until that one has been here; where it
    /// holds the node prepared (and queued), go behind it instead of waiting for its
    /// decision. A reservation at the gate goes behind a prepared queued holder likewise.
    async fn take_slot(&self, txn: TxnId, admission: Admission) -> Result<Taken, PsError> {
        let me = self.inner.me;
        self.until_slot_says(
            |st| {
                check_fence(st, &txn, me)?;
                // Its worker gave this attempt up while it waited here (or before it
                // arrived): it must not take the slot any more.
                refuse_if_aborted(st, &txn, me, "it took the slot")?;
                self.try_take(st, txn, admission)
            },
            |limit| format!("still held by another transaction after {limit:.1}s"),
        )
        .await
    }

    /// Look at this node's state with `look` now and whenever the slot changes, until it
    /// answers (or fails), for at most the node's peer timeout; then a retryable refusal
    /// saying what was waited for (`waited_for(seconds)`).
    async fn until_slot_says<T>(
        &self,
        mut look: impl FnMut(&mut EcState) -> Result<Option<T>, PsError>,
        waited_for: impl FnOnce(f64) -> String,
    ) -> Result<T, PsError> {
        let wait = async {
            loop {
                let freed = self.inner.slot_freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                let found = {
                    let mut st = self.state()?;
                    look(&mut st)?
                };
                if let Some(t) = found {
                    return Ok(t);
                }
                freed.await;
            }
        };
        let limit = self.inner.cfg.peer_timeout;
        match tokio::time::timeout(limit, wait).await {
            Ok(r) => r,
            Err(_) => Err(PsError::NotReady {
                server: self.inner.me.0,
                reason: waited_for(limit.as_secs_f64()),
            }),
        }
    }

    /// One look at the slot for [`EcNode::take_slot`]: taken, `None` to wait, or refused.
    fn try_take(
        &self,
        st: &mut EcState,
        txn: TxnId,
        admission: Admission,
    ) -> Result<Option<Taken>, PsError> {
        let me = self.inner.me;
        let after = match admission {
            Admission::After(a) => Some(a),
            _ => None,
        };
        if let Some(a) = after {
            // Behind `a` in the gate's order: not before `a` has been here.
            if !st.txn.passed(&a) {
                return Ok(None);
            }
        }
        // Whether `txn` may go behind the prepared holder `h` (a queued one, with nobody
        // behind it yet, on a node with nothing to rebuild).
        let may_go_behind = |st: &EcState, h: TxnId| {
            st.txn.preparing.is_none()
                && st.txn.behind.is_none()
                && st.txn.queued == Some(h)
                && st.missing.is_none()
        };
        let holder = st.txn.holder.as_ref().map(|(h, p)| (*h, Arc::clone(p)));
        match st.txn.slot() {
            None => {
                st.txn.preparing = Some(txn);
                st.txn.queued = (admission != Admission::WaitDie).then_some(txn);
                Ok(Some(Taken::Slot))
            }
            Some(h) if h == txn => {
                if admission.is_queued() && st.txn.reserved == Some(txn) {
                    st.txn.reserved = None;
                    return Ok(Some(Taken::Slot));
                }
                Err(PsError::MalformedRequest(format!(
                    "transaction {} of worker {} is already prepared on server {}",
                    txn.seq, txn.worker, me.0
                )))
            }
            Some(h) => {
                let behind_reserved = st.txn.behind.filter(|b| b.txn == txn && b.reserved);
                match (admission, holder) {
                    // The gate: the queued prepare of a reservation taken behind the holder.
                    (Admission::After(a), Some((hid, rows)))
                        if behind_reserved.is_some_and(|b| b.base == hid) && hid == a =>
                    {
                        if let Some(b) = st.txn.behind.as_mut() {
                            b.reserved = false;
                        }
                        Ok(Some(Taken::Behind { base: hid, rows }))
                    }
                    (Admission::After(a), Some((hid, rows)))
                        if hid == h && hid == a && may_go_behind(st, hid) =>
                    {
                        st.txn.behind = Some(Behind {
                            txn,
                            base: hid,
                            base_committed: None,
                            reserved: false,
                            prepared_bytes: 0,
                        });
                        Ok(Some(Taken::Behind { base: hid, rows }))
                    }
                    (Admission::Reserve, Some((hid, _))) if hid == h && may_go_behind(st, hid) => {
                        st.txn.behind = Some(Behind {
                            txn,
                            base: hid,
                            base_committed: None,
                            reserved: true,
                            prepared_bytes: 0,
                        });
                        Ok(Some(Taken::ReservedBehind(hid)))
                    }
                    (a, _) if a != Admission::WaitDie => Ok(None),
                    _ if !st.txn.queued_owner(h) && txn.older_than(&h) => Ok(None),
                    _ => Err(PsError::NotReady {
                        server: me.0,
                        reason: format!(
                            "held by an {} transaction (worker {}, batch {}): abort and retry",
                            if st.txn.queued_owner(h) {
                                "queued"
                            } else {
                                "older"
                            },
                            h.worker,
                            h.priority
                        ),
                    }),
                }
            }
        }
    }

    /// Phase 1 of `txn` on this node: see the module docs.
    pub async fn txn_prepare(
        &self,
        txn: TxnId,
        share: Arc<Update>,
        admission: Admission,
    ) -> Result<PrepareReport, PsError> {
        if admission == Admission::Reserve && !share.is_empty() {
            return Err(PsError::MalformedRequest(format!(
                "transaction {} of worker {} reserves server {} with a share: a reservation \
                 carries none (the share comes with the queued prepare)",
                txn.seq, txn.worker, self.inner.me.0
            )));
        }
        let waited = std::time::Instant::now();
        let taken = {
            let _waiting = self.inner.waiting.enter(&share);
            self.take_slot(txn, admission).await?
        };
        let mut slot_wait_us = waited.elapsed().as_micros() as u64;
        if admission == Admission::Reserve {
            // Kept for the queued prepare (no await since the slot was taken: the request
            // cannot be dropped in between).
            let mut st = self.state()?;
            let after = match taken {
                Taken::ReservedBehind(base) => Some(base),
                _ => {
                    st.txn.reserved = Some(txn);
                    st.txn.held_since = Some(Instant::now());
                    None
                }
            };
            return Ok(PrepareReport {
                slot_wait_us,
                after,
                ..PrepareReport::default()
            });
        }
        let mut guard = PrepareGuard {
            node: self,
            txn,
            armed: true,
        };
        let base = match taken {
            Taken::Behind { base, rows } => Some((base, rows)),
            _ => None,
        };
        let mut report = PrepareReport::default();
        if base.is_none() && self.state()?.missing.is_some() {
            report.rows_decoded = self.ensure_present(&rows_of(&share)).await?;
        }
        let mut prepared = self.state()?.txn.spare.take().unwrap_or_default();
        let base_rows = base.as_ref().map(|(_, r)| &**r);
        self.inner
            .server
            .read()?
            .prepare_update_into(&share, &mut prepared, base_rows)?;
        self.propagate(0, Some(txn), &prepared, base_rows, false, &mut report)
            .await?;
        if let Some((base, _)) = base {
            // Behind `base`: the vote waits for `base` to be decided here.
            let t = std::time::Instant::now();
            self.await_base(txn, base, prepared_capacity(&prepared))
                .await?;
            report.behind_wait_us = t.elapsed().as_micros() as u64;
            slot_wait_us += report.behind_wait_us;
        }
        let mut st = self.state()?;
        check_fence(&mut st, &txn, self.inner.me)?;
        if st.txn.preparing == Some(txn) {
            st.txn.preparing = None;
        } else if st.txn.behind.is_some_and(|b| b.txn == txn) {
            st.txn.behind = None;
        } else {
            // Its worker aborted it here while it prepared: it holds nothing any more.
            return Err(PsError::NotReady {
                server: self.inner.me.0,
                reason: format!(
                    "transaction {} of worker {} was aborted on server {} while it prepared",
                    txn.seq, txn.worker, self.inner.me.0
                ),
            });
        }
        if admission.is_queued() {
            st.txn.queued = Some(txn);
        }
        st.txn.holder = Some((txn, Arc::new(prepared)));
        st.txn.held_since = Some(Instant::now());
        guard.armed = false;
        drop(st);
        // A queued transaction waiting here may go behind this one now, and one behind this
        // one waits for it to have been here.
        self.inner.slot_freed.notify_waiters();
        report.slot_wait_us = slot_wait_us;
        Ok(report)
    }

    /// Wait until `base`, which `txn` was computed behind, is decided here: committed, `txn`
    /// may vote (its rows started from `base`'s); aborted, `txn` is refused (they started
    /// from rows that never were). Refused too if `txn` itself was aborted or blocked
    /// meanwhile, or after the node's peer timeout.
    async fn await_base(&self, txn: TxnId, base: TxnId, bytes: u64) -> Result<(), PsError> {
        let me = self.inner.me;
        self.until_slot_says(
            |st| {
                check_fence(st, &txn, me)?;
                let Some(b) = st.txn.behind.as_mut().filter(|b| b.txn == txn) else {
                    return Err(PsError::NotReady {
                        server: me.0,
                        reason: format!(
                            "transaction {} of worker {} was aborted on server {} while it \
                             prepared",
                            txn.seq, txn.worker, me.0
                        ),
                    });
                };
                b.prepared_bytes = bytes;
                let committed = match b.base_committed {
                    None => return Ok(None),
                    Some(c) => c,
                };
                st.txn.counters.behind += 1;
                if committed {
                    return Ok(Some(()));
                }
                st.txn.counters.behind_refused += 1;
                Err(PsError::NotReady {
                    server: me.0,
                    reason: format!(
                        "the transaction it was computed behind on server {} (worker {}, batch \
                         {}) was aborted: abort and retry",
                        me.0, base.worker, base.priority
                    ),
                })
            },
            |limit| {
                format!(
                    "the transaction before it on server {} was not decided within {limit:.1}s",
                    me.0
                )
            },
        )
        .await
    }

    /// Phase 2 of `txn` on this node: install what it prepared here and apply what peers
    /// staged for it, count the commit, free the slot.
    pub fn txn_commit(&self, txn: TxnId) -> Result<ApplyReport, PsError> {
        let report = {
            let mut st = self.state()?;
            if st.txn.committed(&txn) && !st.txn.fenced_off(&txn) {
                // A repeated commit (a retried message, or one a resolver completed first):
                // already done.
                return Ok(ApplyReport::default());
            }
            check_fence(&mut st, &txn, self.inner.me)?;
            self.commit_locked(&mut st, txn)?
        };
        self.inner.slot_freed.notify_waiters();
        Ok(report)
    }

    fn commit_locked(&self, st: &mut EcState, txn: TxnId) -> Result<ApplyReport, PsError> {
        match &st.txn.holder {
            Some((h, _)) if *h == txn => {}
            _ if st.txn.committed(&txn) => {
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
            // Shared still when the transaction behind it is computing on top of it.
            st.txn.spare = Arc::try_unwrap(prepared).ok();
        }
        st.txn.held_since = None;
        for (_, inc) in st.txn.unstage(&txn) {
            self.apply_incoming(st, &inc)?;
        }
        self.count_commit(st);
        st.txn.note_commit(txn);
        st.txn.base_decided(txn, true);
        Ok(report)
    }

    /// One more transaction committed here.
    fn count_commit(&self, st: &mut EcState) {
        st.committed = Some(st.committed.map_or(1, |c| c + 1));
        if st.locks_open > 0 {
            st.status.commits_in_lock += 1;
        }
    }

    /// Drop `txn` on this node (what it prepared and what peers staged for it). A transaction
    /// a resolver blocked is left to the resolver.
    pub fn txn_abort(&self, txn: TxnId) -> Result<(), PsError> {
        {
            let mut st = self.state()?;
            if st.txn.blocked.contains(&txn) {
                return Ok(());
            }
            Self::abort_locked(&mut st, txn);
        }
        self.inner.slot_freed.notify_waiters();
        Ok(())
    }

    fn abort_locked(st: &mut EcState, txn: TxnId) {
        if st.txn.holder.as_ref().is_some_and(|(h, _)| *h == txn) {
            st.txn.spare = st
                .txn
                .holder
                .take()
                .and_then(|(_, p)| Arc::try_unwrap(p).ok());
            st.txn.held_since = None;
        }
        if st.txn.preparing == Some(txn) {
            st.txn.preparing = None;
        }
        if st.txn.reserved == Some(txn) {
            st.txn.reserved = None;
            st.txn.held_since = None;
        }
        if st.txn.behind.is_some_and(|b| b.txn == txn) {
            st.txn.behind = None;
        }
        st.txn.unstage(&txn);
        st.txn.note_abort(txn);
        st.txn.base_decided(txn, false);
    }

    /// `txn` in one phase (`--no-2pc`): compute, forward the differences to be applied on
    /// arrival, apply here. One at a time per node.
    pub async fn txn_apply(&self, txn: TxnId, share: Arc<Update>) -> Result<ApplyReport, PsError> {
        let _one = self.inner.apply_lock.lock().await;
        check_fence(&mut *self.state()?, &txn, self.inner.me)?;
        let mut report = PrepareReport::default();
        if self.state()?.missing.is_some() {
            self.ensure_present(&rows_of(&share)).await?;
        }
        let mut prepared = self.state()?.txn.spare.take().unwrap_or_default();
        self.inner
            .server
            .read()?
            .prepare_update_into(&share, &mut prepared, None)?;
        self.propagate(0, Some(txn), &prepared, None, true, &mut report)
            .await?;
        let mut st = self.state()?;
        let applied = self.inner.server.write()?.install_prepared(&prepared)?;
        st.txn.spare = Some(prepared);
        self.count_commit(&mut st);
        st.txn.note_commit(txn);
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
            last_commit: st.txn.last_commit(worker),
            staged,
        })
    }

    /// Commit (`commit`) or abort `txn` on this node for a resolver: a fenced worker's, or one
    /// blocked with [`EcNode::txn_block`]. Committing needs the transaction prepared here;
    /// anything else of it is dropped either way. Repeating it changes nothing.
    pub fn txn_resolve(&self, txn: TxnId, commit: bool) -> Result<(), PsError> {
        {
            let mut st = self.state()?;
            let prepared = st.txn.holder.as_ref().is_some_and(|(h, _)| *h == txn);
            let staged = st.txn.incoming.contains_key(&txn);
            if commit && prepared {
                self.commit_locked(&mut st, txn)?;
                st.txn.counters.resolved_committed += 1;
            } else {
                if prepared || staged || st.txn.preparing == Some(txn) {
                    st.txn.counters.resolved_aborted += 1;
                }
                Self::abort_locked(&mut st, txn);
            }
            st.txn.blocked.remove(&txn);
            let upto = st.txn.resolved_upto.entry(txn.worker).or_default();
            *upto = (*upto).max((txn.epoch, txn.seq));
        }
        self.inner.slot_freed.notify_waiters();
        Ok(())
    }

    /// Block `txn` here for a resolver ([`resolve_txn`]): from now on its worker's messages
    /// for it are refused (a prepare still computing fails when it ends), so what this node
    /// holds of it changes only by a resolver. Returns what it holds.
    pub fn txn_block(&self, txn: TxnId) -> Result<TxnOutcome, PsError> {
        let mut st = self.state()?;
        st.txn.blocked.insert(txn);
        Ok(if st.txn.committed(&txn) {
            TxnOutcome::Committed
        } else if st.txn.holder.as_ref().is_some_and(|(h, _)| *h == txn) {
            TxnOutcome::Prepared
        } else {
            TxnOutcome::Absent
        })
    }

    /// What this node's resolvers did so far.
    pub fn txn_counters(&self) -> Result<TxnCounters, PsError> {
        Ok(self.state()?.txn.counters)
    }

    /// The transaction behind this node's prepared holder, if any.
    pub fn txn_behind(&self) -> Result<Option<BehindStatus>, PsError> {
        Ok(self.state()?.txn.behind.map(|b| BehindStatus {
            txn: b.txn,
            base: b.base,
            computed: b.prepared_bytes > 0,
            reserved: b.reserved,
        }))
    }

    /// Resolve every transaction that has held this node (prepared here, or with deltas
    /// staged here) for `lease` or longer, over all nodes ([`resolve_txn`]); returns each one
    /// with whether it committed. A transaction that cannot be decided yet (prepared on every
    /// node that answered, with a node silent) stays, for a later call or for the loss of
    /// that node to settle; its error is returned once the others are done.
    pub async fn resolve_expired(&self, lease: Duration) -> Result<Vec<(TxnId, bool)>, PsError> {
        let expired: Vec<TxnId> = {
            let mut st = self.state()?;
            let old = |since: &Instant| since.elapsed() >= lease;
            // A prepared holder, or a reservation its queued prepare never took up.
            let mut v: Vec<TxnId> = st
                .txn
                .holder
                .as_ref()
                .map(|(t, _)| *t)
                .or(st.txn.reserved)
                .filter(|_| st.txn.held_since.as_ref().is_some_and(old))
                .into_iter()
                .collect();
            let staged: Vec<TxnId> = st
                .txn
                .staged_at
                .iter()
                .filter(|(t, since)| old(since) && !v.contains(t))
                .map(|(t, _)| *t)
                .collect();
            v.extend(staged);
            st.txn.counters.lease_expiries += v.len() as u64;
            v
        };
        let mut out = Vec::with_capacity(expired.len());
        let mut first_err = None;
        for txn in expired {
            let nodes: Vec<Option<super::EcClient>> = (0..self.inner.layout.servers())
                .map(|s| self.peer(ServerId(s)).ok())
                .collect();
            match resolve_txn(&nodes, txn).await {
                Ok(r) => out.push((txn, r.committed)),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Check for expired transactions every half lease, in the background, for as long as
    /// the node lives (must be called inside a tokio runtime).
    pub fn start_lease_watcher(&self, lease: Duration) -> tokio::task::JoinHandle<()> {
        let weak = super::node::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 2).await;
                let Some(inner) = weak.upgrade() else { return };
                let node = EcNode { inner };
                if node.is_killed() {
                    return;
                }
                let _ = node.resolve_expired(lease).await;
            }
        })
    }
}

/// How [`resolve_txn`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// Committed everywhere it was prepared (else aborted everywhere).
    pub committed: bool,
    /// Servers that did not answer (absent, or their call failed): what they hold of the
    /// transaction is settled when they answer a later resolution or are replaced.
    pub silent: Vec<u32>,
}

/// Resolve `txn` over `nodes` (`nodes[i]` is server `i`, `None` where it cannot be reached),
/// the cooperative termination of 2PC: block it on every node, then commit it everywhere if
/// any node had committed it (its worker decided to commit, so it was prepared everywhere),
/// else abort it everywhere. Returns how it decided. With a node silent, a
/// transaction prepared on every node that answered cannot be decided (the silent one may
/// have committed it): that is an error, retryable once the node answers or is replaced.
pub async fn resolve_txn<C>(nodes: &[Option<C>], txn: TxnId) -> Result<Resolution, PsError>
where
    C: super::EcService + Clone + 'static,
{
    let answers = on_some(nodes, move |c| async move { c.txn_block(txn).await }).await;
    let mut committed = false;
    let mut absent = false;
    let mut silent: Vec<u32> = Vec::new();
    let mut reached = Vec::with_capacity(nodes.len());
    for (i, a) in answers.into_iter().enumerate() {
        match a {
            Some(Ok(o)) => {
                committed |= o == TxnOutcome::Committed;
                absent |= o == TxnOutcome::Absent;
                reached.push(i);
            }
            _ => silent.push(i as u32),
        }
    }
    if !committed && !absent && !silent.is_empty() {
        return Err(PsError::NotReady {
            server: silent[0],
            reason: format!(
                "transaction {} of worker {} is prepared on every server that answered and \
                 server(s) {silent:?} did not answer: it is decided once they answer or are \
                 replaced",
                txn.seq, txn.worker
            ),
        });
    }
    let targets: Vec<Option<C>> = nodes
        .iter()
        .enumerate()
        .map(|(i, c)| c.clone().filter(|_| reached.contains(&i)))
        .collect();
    let done = on_some(&targets, move |c| async move {
        c.txn_resolve(txn, committed).await
    })
    .await;
    for r in done.into_iter().flatten() {
        r?;
    }
    Ok(Resolution { committed, silent })
}

/// `f(node)` on every present node at once; results by node index (`None`: absent).
async fn on_some<C, T, F, Fut>(nodes: &[Option<C>], f: F) -> Vec<Option<Result<T, PsError>>>
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(C) -> Fut,
    Fut: std::future::Future<Output = Result<T, PsError>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in nodes.iter().enumerate() {
        if let Some(c) = c {
            let fut = f(c.clone());
            set.spawn(async move { (i, fut.await) });
        }
    }
    let mut out: Vec<Option<Result<T, PsError>>> = (0..nodes.len()).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        if let Ok((i, x)) = r {
            out[i] = Some(x);
        }
    }
    out
}

/// A point of a worker's transaction where [`run_txn`]'s caller may hold it (fault
/// injection: a server killed in one phase or the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnPhase {
    /// Before phase 1 is sent.
    Prepare,
    /// Phase 1 sent to the first half of the nodes (ids below `nodes / 2`, at least one) and
    /// answered there, not yet sent to the others (only when asked for: see [`run_txn`]).
    PrepareSome,
    /// After phase 1 succeeded everywhere, before phase 2 is sent.
    Commit,
    /// Phase 2 sent to the first half of the nodes and answered there, not yet sent to the
    /// others (only when asked for).
    CommitSome,
}

impl TxnPhase {
    /// The first node of the second half, where a phase split at this point resumes.
    pub fn split_at(nodes: usize) -> usize {
        (nodes / 2).max(1).min(nodes)
    }
}

/// What one transaction cost its worker, and what went wrong without stopping it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TxnReport {
    /// Wall time of phase 1 (all attempts) and of phase 2 (or of the one-phase apply).
    pub prepare_s: f64,
    pub commit_s: f64,
    /// Phase-1 attempts refused by wait-die or a busy node, aborted and tried again.
    pub retries: u32,
    /// Whether its phase 1 ran queued ([`Admission::Queued`]) in some attempt.
    pub queued: bool,
    /// Whether the attempt that went through ran behind the gate's holder
    /// ([`Admission::After`]).
    pub behind: bool,
    /// Time spent waiting for other transactions: the phase-1 attempts refused (with the
    /// back-off after them) and, in the attempt that went through, the wait for the gate's
    /// reservation (queued) and the longest wait for a node's slot.
    pub lock_wait_s: f64,
    /// The parts of `lock_wait_s`: the refused attempts with their back-off; the gate's
    /// reservation; of the longest wait for a node's slot, the vote held behind the
    /// transaction before ([`PrepareReport::behind_wait_us`]). The rest is the wait for the
    /// slots themselves.
    pub refused_wait_s: f64,
    pub gate_wait_s: f64,
    pub behind_wait_s: f64,
    /// Nodes whose phase 2 failed (lost after phase 1): the survivors committed.
    pub commit_failures: Vec<(ServerId, PsError)>,
    /// Summed over the nodes' phase-1 reports.
    pub prepared: PrepareReport,
}

/// Longest a transaction keeps retrying phase 1 after wait-die refusals.
const TXN_RETRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Transactions a worker prepares queued ([`Admission::Queued`]) once its wait-die attempts
/// are refused often ([`TxnCursor::refusals`] at least [`CONTENDED`]): contention lasts, so
/// they skip the wait-die attempt that would be refused too; then it tries wait-die again,
/// which is cheaper when the nodes are free (no gate to pass first).
pub const QUEUED_AFTER_REFUSAL: u32 = 16;

/// The weight of the latest wait-die attempt in [`TxnCursor::refusals`].
const REFUSAL_WEIGHT: f64 = 0.25;

/// The refusal rate from which a worker queues its next transactions: refusals in a row,
/// not one now and then. At 2 workers on 5 servers about one wait-die attempt in ten is
/// refused, and queuing there made commits slower (the gate's reservation comes before the
/// prepares); from 8 workers on most are, and queuing made them faster.
pub const CONTENDED: f64 = 0.5;

/// A worker's transactions: the last sequence number it used and how its next ones take
/// the nodes' slots. Kept across the worker's transactions ([`run_txn`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TxnCursor {
    /// The last sequence number used (the next transaction takes a higher one).
    pub seq: u64,
    /// Transactions still to prepare queued ([`QUEUED_AFTER_REFUSAL`]).
    pub queued_left: u32,
    /// The recent rate of refused wait-die attempts (a moving average, each attempt weighing
    /// a quarter).
    pub refusals: f64,
    /// Every transaction prepared queued from its first attempt, none by wait-die
    /// ([`TxnCursor::queued`]).
    pub always_queued: bool,
}

impl TxnCursor {
    /// A cursor whose last sequence number is `seq`, admitting by wait-die (queued after
    /// frequent refusals).
    pub fn at(seq: u64) -> TxnCursor {
        TxnCursor {
            seq,
            ..TxnCursor::default()
        }
    }

    /// A cursor whose last sequence number is `seq`, preparing every transaction queued: the
    /// gate reserved first, never refused for its age. What a cluster worker uses: with every
    /// update touching every node, most wait-die attempts are refused as soon as a few
    /// workers run, and each refused attempt costs about a whole prepare on the nodes that
    /// let it in; the reservation costs one call to the gate (`docs/BENCHMARKS.md`, "Queued
    /// from the first attempt").
    pub fn queued(seq: u64) -> TxnCursor {
        TxnCursor {
            seq,
            always_queued: true,
            ..TxnCursor::default()
        }
    }

    /// A wait-die attempt was refused (or not).
    fn note_wait_die(&mut self, refused: bool) {
        let x = if refused { 1.0 } else { 0.0 };
        self.refusals += REFUSAL_WEIGHT * (x - self.refusals);
        if refused && self.refusals >= CONTENDED {
            self.queued_left = QUEUED_AFTER_REFUSAL;
        }
    }
}

/// Run one worker's update as transaction `txn` over every node (`nodes[i]` is server `i`,
/// `shares[i]` its share, empty where the update touches nothing): 2PC coordinated here
/// (ECRec §3.5), or one phase without it. A phase-1 refusal that is worth retrying
/// (wait-die, a busy node) aborts everywhere and tries again under a fresh sequence number
/// taken from `cursor`, keeping the priority, queued ([`Admission`]: the gate node 0 reserved
/// first, then the prepares everywhere), as are the worker's next [`QUEUED_AFTER_REFUSAL`]
/// transactions when refusals are frequent ([`CONTENDED`]); any other phase-1 error aborts
/// everywhere and is returned (a lost node: the caller retries the update against its
/// replacement). Phase 2 commits on every node it can; the failures are reported, not
/// returned. `at_phase` runs
/// before each phase is sent, and, for the phases in `split` ([`TxnPhase::PrepareSome`],
/// [`TxnPhase::CommitSome`]), between the phase's two halves, which are then sent one after
/// the other (fault injection: a node lost while a phase reached some nodes only).
pub async fn run_txn<C, H, HF>(
    nodes: &[C],
    mut txn: TxnId,
    shares: &[Arc<Update>],
    two_phase: bool,
    cursor: &mut TxnCursor,
    split: &[TxnPhase],
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
        let res = on_range(nodes, shares, 0..nodes.len(), &move |c, s| async move {
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
    let mut queued = cursor.always_queued || cursor.queued_left > 0;
    cursor.queued_left = cursor.queued_left.saturating_sub(1);
    loop {
        at_phase(TxnPhase::Prepare).await;
        let attempt = Instant::now();
        let split_prepare = split.contains(&TxnPhase::PrepareSome);
        let mut gate_wait_us = 0;
        // Queued, reserve the gate first; then prepare everywhere (the gate included).
        let mut gate_refused = None;
        let mut after = None;
        if queued {
            report.queued = true;
            let nothing = vec![Arc::clone(&empty); nodes.len()];
            let reserve =
                move |c: C, s| async move { c.txn_prepare(txn, s, Admission::Reserve).await };
            let gate = on_range(nodes, &nothing, 0..1.min(nodes.len()), &reserve).await;
            match gate.first() {
                Some((_, Ok(p))) => {
                    gate_wait_us = p.slot_wait_us;
                    after = p.after;
                }
                _ => gate_refused = Some(gate),
            }
        }
        // Reserved behind the gate's holder: behind it everywhere.
        let admission = match (queued, after) {
            (true, Some(a)) => Admission::After(a),
            (true, None) => Admission::Queued,
            (false, _) => Admission::WaitDie,
        };
        let (res, aborted) = match gate_refused {
            Some(gate) => (gate, false),
            None if split_prepare => (
                in_halves(
                    nodes,
                    shares,
                    true,
                    || at_phase(TxnPhase::PrepareSome),
                    move |c, s| async move { c.txn_prepare(txn, s, admission).await },
                )
                .await,
                false,
            ),
            None => prepare_or_abort(nodes, shares, txn, admission).await,
        };
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
                    if p.slot_wait_us >= sum.slot_wait_us {
                        // The longest wait, with its part behind the transaction before.
                        sum.slot_wait_us = p.slot_wait_us;
                        sum.behind_wait_us = p.behind_wait_us.min(p.slot_wait_us);
                    }
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
            // Queued, the wait for the gate came before the others'.
            report.lock_wait_s += (gate_wait_us + sum.slot_wait_us) as f64 * 1e-6;
            report.gate_wait_s = gate_wait_us as f64 * 1e-6;
            report.behind_wait_s = sum.behind_wait_us as f64 * 1e-6;
            report.prepared = sum;
            report.behind = matches!(admission, Admission::After(_));
            if !queued {
                cursor.note_wait_die(false);
            }
            break;
        };
        // Abort everywhere (a node that refused holds nothing of it; one that is gone
        // cannot answer) before anything else is sent for this update.
        if !aborted {
            let _ = abort_everywhere(nodes, txn).await;
        }
        if !retry || t0.elapsed() > TXN_RETRY_LIMIT {
            return Err(e);
        }
        report.retries += 1;
        let refused = attempt.elapsed().as_secs_f64();
        tokio::time::sleep(wait).await;
        report.lock_wait_s += refused + wait.as_secs_f64();
        report.refused_wait_s += refused + wait.as_secs_f64();
        wait = (wait * 2).min(std::time::Duration::from_millis(50));
        if !queued {
            cursor.note_wait_die(true);
        }
        // Queued, it is never refused for its age again.
        queued = true;
        cursor.seq += 1;
        txn.seq = cursor.seq;
    }
    report.prepare_s = t0.elapsed().as_secs_f64();
    at_phase(TxnPhase::Commit).await;
    let t1 = Instant::now();
    let res = in_halves(
        nodes,
        &vec![Arc::clone(&empty); nodes.len()],
        split.contains(&TxnPhase::CommitSome),
        || at_phase(TxnPhase::CommitSome),
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

/// Phase 1 of `txn` on every node at once; at the first failure (a refusal, a lost node) the
/// attempt is lost, so it is aborted everywhere at once rather than after the last answer:
/// a node where it waits for the slot, or for the transaction before, lets go of it then
/// ([`EcNode::txn_abort`]; a prepare that arrives after its abort is refused), instead of
/// holding the attempt until that wait ends. Returns the answers by node index, and whether
/// the abort was sent (and answered) everywhere.
async fn prepare_or_abort<C>(
    nodes: &[C],
    shares: &[Arc<Update>],
    txn: TxnId,
    admission: Admission,
) -> (Vec<(usize, Result<PrepareReport, PsError>)>, bool)
where
    C: super::EcService + Clone + 'static,
{
    let mut aborts = None;
    let out = on_range_with(
        nodes,
        shares,
        0..nodes.len(),
        &move |c: C, s| async move { c.txn_prepare(txn, s, admission).await },
        || {
            let nodes = nodes.to_vec();
            aborts = Some(tokio::spawn(
                async move { abort_everywhere(&nodes, txn).await },
            ));
        },
    )
    .await;
    let aborted = match aborts {
        Some(a) => {
            let _ = a.await;
            true
        }
        None => false,
    };
    (out, aborted)
}

/// `txn` aborted on every node at once; the answers by node index.
async fn abort_everywhere<C>(nodes: &[C], txn: TxnId) -> Vec<(usize, Result<(), PsError>)>
where
    C: super::EcService + Clone + 'static,
{
    // An abort carries no share: one empty update for every node.
    let empty = Arc::new(Update::new());
    let none = vec![empty; nodes.len()];
    on_range(nodes, &none, 0..nodes.len(), &move |c: C, _| async move {
        c.txn_abort(txn).await
    })
    .await
}

/// `f(node, share)` on every node at once, or (with `split`) on the first half of the nodes,
/// then `between`, then on the others; results by node index.
async fn in_halves<C, T, F, Fut, B, BF>(
    nodes: &[C],
    shares: &[Arc<Update>],
    split: bool,
    between: B,
    f: F,
) -> Vec<(usize, Result<T, PsError>)>
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(C, Arc<Update>) -> Fut,
    Fut: std::future::Future<Output = Result<T, PsError>> + Send + 'static,
    B: FnOnce() -> BF,
    BF: std::future::Future<Output = ()>,
{
    if !split {
        return on_range(nodes, shares, 0..nodes.len(), &f).await;
    }
    let h = TxnPhase::split_at(nodes.len());
    let mut out = on_range(nodes, shares, 0..h, &f).await;
    between().await;
    out.extend(on_range(nodes, shares, h..nodes.len(), &f).await);
    out
}

/// `f(node, share)` on the nodes of `range` at once; results by node index.
async fn on_range<C, T, F, Fut>(
    nodes: &[C],
    shares: &[Arc<Update>],
    range: std::ops::Range<usize>,
    f: &F,
) -> Vec<(usize, Result<T, PsError>)>
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(C, Arc<Update>) -> Fut,
    Fut: std::future::Future<Output = Result<T, PsError>> + Send + 'static,
{
    on_range_with(nodes, shares, range, f, || {}).await
}

/// [`on_range`], running `first_failure` when the first failed answer arrives (the others
/// still collected).
async fn on_range_with<C, T, F, Fut>(
    nodes: &[C],
    shares: &[Arc<Update>],
    range: std::ops::Range<usize>,
    f: &F,
    first_failure: impl FnOnce(),
) -> Vec<(usize, Result<T, PsError>)>
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(C, Arc<Update>) -> Fut,
    Fut: std::future::Future<Output = Result<T, PsError>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for i in range {
        let fut = f(nodes[i].clone(), shares[i].clone());
        set.spawn(async move { (i, fut.await) });
    }
    let mut first_failure = Some(first_failure);
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(r) = set.join_next().await {
        let x = r.unwrap_or_else(|e| {
            (
                usize::MAX,
                Err(PsError::Internal(format!(
                    "transaction call task failed: {e}"
                ))),
            )
        });
        if x.1.is_err() {
            if let Some(hook) = first_failure.take() {
                hook();
            }
        }
        out.push(x);
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

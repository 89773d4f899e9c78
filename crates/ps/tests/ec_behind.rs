//! ECRec §3.5 transactions in the gate's order, each computed behind the one before it: a
//! queued transaction that reserved the gate behind its prepared holder prepares on every
//! node on top of that holder's prepared rows, and votes only once the holder is decided
//! there. Each case drives the nodes call by call (no timing) and ends with the digest of a
//! reference that applied the committed updates one after the other, and a clean parity and
//! replica audit.

mod ec_common;

use std::sync::Arc;

use ec_common::{shares, txn_id, worker_update, EcCluster, PushReference};
use ftrec_core::OptimizerKind;
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{Admission, BehindStatus, EcConfig, PrepareReport, TxnId};
use ftrec_ps::{PsError, Update};
use tokio::task::JoinHandle;

const N: u32 = 4;

fn cluster() -> (EcCluster, PushReference) {
    let c = EcCluster::new(N, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    (c, PushReference::new(N, OptimizerKind::Adam))
}

async fn assert_exact(c: &EcCluster, reference: &PushReference, case: &str) {
    assert_eq!(c.digest(), reference.digest(), "{case}");
    c.assert_exact(None, case).await;
}

/// Reserve the gate (node 0) for `t`: what the reservation went behind, if anything.
async fn reserve(c: &EcCluster, t: TxnId) -> Option<TxnId> {
    c.node(0)
        .txn_prepare(t, Arc::new(Update::new()), Admission::Reserve)
        .await
        .unwrap()
        .after
}

/// `update` prepared queued as `t` on the nodes `on`, one after the other.
async fn prepare_queued(c: &EcCluster, t: TxnId, update: &Update, on: &[u32]) {
    let sh = shares(update, N);
    for &s in on {
        let p = c
            .node(s)
            .txn_prepare(t, sh[s as usize].clone(), Admission::Queued)
            .await
            .unwrap();
        assert_eq!(p.behind_wait_us, 0, "node {s}: queued, behind nothing");
    }
}

/// `update` prepared as `t` behind `after` on every node, each prepare in a task of its own
/// (it returns once `after` is decided there).
fn prepare_behind(
    c: &EcCluster,
    t: TxnId,
    after: TxnId,
    update: &Update,
) -> Vec<JoinHandle<Result<PrepareReport, PsError>>> {
    let sh = shares(update, N);
    (0..N)
        .map(|s| {
            let node = c.node(s).clone();
            let share = sh[s as usize].clone();
            tokio::spawn(async move { node.txn_prepare(t, share, Admission::After(after)).await })
        })
        .collect()
}

/// Let the tasks run until every node holds `t` computed behind `base`.
async fn until_computed_behind(c: &EcCluster, t: TxnId, base: TxnId) {
    let want = Some(BehindStatus {
        txn: t,
        base,
        computed: true,
        reserved: false,
    });
    while (0..N).any(|s| c.node(s).txn_behind().unwrap() != want) {
        tokio::task::yield_now().await;
    }
}

/// Two transactions in the gate's order: t1 (worker 1) reserved and prepared queued on the
/// nodes `t1_on`, then t2 (worker 2) reserved behind it. Their ids and updates, which share
/// rows (tables of 3 and 7 rows) and every dense block.
async fn t2_reserved_behind_t1(c: &EcCluster, t1_on: &[u32]) -> (TxnId, Update, TxnId, Update) {
    let (t1, u1) = (txn_id(1, 1, 1), worker_update(1, 1));
    let (t2, u2) = (txn_id(2, 1, 2), worker_update(2, 2));
    assert_eq!(reserve(c, t1).await, None, "a free gate");
    prepare_queued(c, t1, &u1, t1_on).await;
    // The gate is held by t1, prepared: t2's reservation goes behind it.
    assert_eq!(reserve(c, t2).await, Some(t1));
    (t1, u1, t2, u2)
}

/// t1 committed everywhere, then t2, whose prepares behind t1 must all go through in
/// between; the reference applies them in that order.
async fn commit_both(
    c: &EcCluster,
    reference: &mut PushReference,
    (t1, u1): (TxnId, &Update),
    (t2, u2): (TxnId, &Update),
    prepares: Vec<JoinHandle<Result<PrepareReport, PsError>>>,
) {
    commit_all(c, t1).await;
    reference.push(u1);
    for p in prepares {
        // Behind t1, the vote held for it is reported as a part of the node's wait.
        let p = p.await.unwrap().unwrap();
        assert!(p.behind_wait_us <= p.slot_wait_us, "{p:?}");
    }
    commit_all(c, t2).await;
    reference.push(u2);
}

async fn commit_all(c: &EcCluster, t: TxnId) {
    for s in 0..N {
        c.node(s).txn_commit(t).unwrap();
    }
}

#[tokio::test]
async fn a_transaction_behind_a_prepared_one_starts_from_its_rows_and_commits_after_it() {
    let (c, mut reference) = cluster();
    let (t1, u1, t2, u2) = t2_reserved_behind_t1(&c, &[0, 1, 2, 3]).await;
    assert_eq!(
        c.node(0).txn_behind().unwrap(),
        Some(BehindStatus {
            txn: t2,
            base: t1,
            computed: false,
            reserved: true,
        })
    );
    let prepares = prepare_behind(&c, t2, t1, &u2);
    // t2 computes and propagates on every node while t1 is undecided, then waits.
    until_computed_behind(&c, t2, t1).await;
    assert!(prepares.iter().all(|p| !p.is_finished()));
    commit_both(&c, &mut reference, (t1, &u1), (t2, &u2), prepares).await;
    for s in 0..N {
        let k = c.node(s).txn_counters().unwrap();
        assert_eq!((k.behind, k.behind_refused), (1, 0), "node {s}");
        assert_eq!(c.node(s).txn_behind().unwrap(), None);
    }
    // The two updates share rows (tables of 3 and 7 rows) and every dense block: the result
    // is theirs applied one after the other, parities and replicas included.
    assert_exact(&c, &reference, "t2 behind t1, both committed").await;
}

#[tokio::test]
async fn a_transaction_behind_one_that_is_aborted_is_refused_and_leaves_nothing() {
    let (c, mut reference) = cluster();
    let (t1, _, t2, u2) = t2_reserved_behind_t1(&c, &[0, 1, 2, 3]).await;
    let prepares = prepare_behind(&c, t2, t1, &u2);
    until_computed_behind(&c, t2, t1).await;
    // t1's worker aborts it (a phase-1 failure elsewhere): t2 was computed from rows that
    // never were, and is refused on every node.
    for s in 0..N {
        c.node(s).txn_abort(t1).unwrap();
    }
    for p in prepares {
        let e = p.await.unwrap().unwrap_err();
        assert!(
            e.is_retryable() && e.to_string().contains("was aborted: abort and retry"),
            "{e}"
        );
    }
    for s in 0..N {
        c.node(s).txn_abort(t2).unwrap();
        let k = c.node(s).txn_counters().unwrap();
        assert_eq!((k.behind, k.behind_refused), (1, 1), "node {s}");
        assert_eq!(c.node(s).txn_behind().unwrap(), None);
    }
    // Nothing of either is left: t2's worker retries it and it commits alone.
    c.txn(2, 2, &u2).await.unwrap();
    reference.push(&u2);
    assert_exact(&c, &reference, "t1 aborted, t2 retried").await;
}

#[tokio::test]
async fn a_reservation_behind_the_gate_s_holder_takes_the_slot_when_that_one_commits() {
    let (c, mut reference) = cluster();
    let (t1, u1, t2, u2) = t2_reserved_behind_t1(&c, &[0, 1, 2, 3]).await;
    commit_all(&c, t1).await;
    reference.push(&u1);
    // The reservation now holds the gate as a plain one: a wait-die prepare is refused.
    let w = txn_id(3, 1, 0);
    let e = c
        .node(0)
        .txn_prepare(
            w,
            shares(&worker_update(3, 3), N)[0].clone(),
            Admission::WaitDie,
        )
        .await
        .unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("queued"), "{e}");
    c.node(0).txn_abort(w).unwrap();
    // t2's prepares, behind t1, find it committed everywhere: no waiting, nothing behind.
    let sh = shares(&u2, N);
    for s in 0..N {
        c.node(s)
            .txn_prepare(t2, sh[s as usize].clone(), Admission::After(t1))
            .await
            .unwrap();
    }
    commit_all(&c, t2).await;
    reference.push(&u2);
    assert_eq!(c.node(0).txn_counters().unwrap().behind, 0);
    assert_exact(&c, &reference, "a reservation behind t1").await;
}

#[tokio::test]
async fn a_transaction_behind_another_waits_on_a_node_that_one_has_not_reached() {
    let (c, mut reference) = cluster();
    // t1 is prepared on the gate only: its prepares to the others are on their way.
    let (t1, u1, t2, u2) = t2_reserved_behind_t1(&c, &[0]).await;
    let prepares = prepare_behind(&c, t2, t1, &u2);
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
    // Node 1's slot is free, but t2 may not pass t1 there: it waits, holding nothing.
    assert!(!prepares[1].is_finished());
    assert_eq!(c.node(1).txn_behind().unwrap(), None);
    assert_eq!(c.node(1).txn_fence(2, 0).unwrap().holding, None);
    prepare_queued(&c, t1, &u1, &[1, 2, 3]).await;
    until_computed_behind(&c, t2, t1).await;
    commit_both(&c, &mut reference, (t1, &u1), (t2, &u2), prepares).await;
    assert_exact(&c, &reference, "t2 waited for t1 on nodes 1-3").await;
}

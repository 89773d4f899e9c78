//! ECRec §3.5 with a live worker that leaves its transaction half done: the transaction is
//! resolved (blocked on every node, then committed where any node committed it, else
//! aborted), by its worker or by a node whose lease on it expired. Every case is injected
//! deterministically (the worker's calls are made one by one, or its phase hook stops it),
//! and ends with the exact digest of a reference that applied each update once and a clean
//! parity and replica audit.

mod ec_common;

use std::sync::Arc;
use std::time::Duration;

use ec_common::{run_txn_until, shares, txn_id, worker_update, EcCluster, PushReference};
use ftrec_core::OptimizerKind;
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{resolve_txn, Admission, EcClient, EcConfig, TxnOutcome, TxnPhase};
use ftrec_ps::{PsError, Update};

const N: u32 = 4;

fn cluster() -> (EcCluster, PushReference) {
    let c = EcCluster::new(N, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    (c, PushReference::new(N, OptimizerKind::Adam))
}

fn reachable(c: &EcCluster) -> Vec<Option<EcClient>> {
    c.clients().into_iter().map(Some).collect()
}

/// Prepare `update` as `txn` on the nodes `on` only (a worker stopped half way).
async fn prepare_on(c: &EcCluster, txn: ftrec_ps::ec::TxnId, update: &Update, on: &[u32]) {
    let sh = shares(update, N);
    for &s in on {
        c.node(s)
            .txn_prepare(txn, sh[s as usize].clone(), Admission::WaitDie)
            .await
            .unwrap();
    }
}

async fn assert_exact(c: &EcCluster, reference: &PushReference, case: &str) {
    assert_eq!(c.digest(), reference.digest(), "{case}");
    c.assert_exact(None, case).await;
}

#[tokio::test]
async fn a_transaction_left_prepared_is_aborted_when_its_lease_expires() {
    let (c, mut reference) = cluster();
    let u = worker_update(1, 0);
    c.txn(0, 1, &u).await.unwrap();
    reference.push(&u);
    // Worker 1 prepares everywhere, then stalls before phase 2.
    let t = txn_id(1, 7, 2);
    prepare_on(&c, t, &worker_update(2, 1), &[0, 1, 2, 3]).await;
    // Node 2's lease on it expires (a zero lease: the expiry is the call, not a clock).
    let resolved = c.node(2).resolve_expired(Duration::ZERO).await.unwrap();
    assert_eq!(resolved, vec![(t, false)]);
    assert_eq!(c.node(2).txn_counters().unwrap().lease_expiries, 1);
    for s in 0..N {
        assert_eq!(
            c.node(s).txn_counters().unwrap().resolved_aborted,
            1,
            "node {s}"
        );
    }
    // The worker wakes and commits: refused everywhere, nothing changes.
    for s in 0..N {
        assert!(
            matches!(c.node(s).txn_commit(t), Err(PsError::NotReady { .. })),
            "node {s}"
        );
    }
    // The slots are free: the next update goes through.
    let w = worker_update(3, 0);
    c.txn(0, 3, &w).await.unwrap();
    reference.push(&w);
    assert_exact(&c, &reference, "aborted by lease").await;
}

#[tokio::test]
async fn a_transaction_committed_on_some_node_is_committed_everywhere_when_its_lease_expires() {
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    let v = worker_update(2, 1);
    prepare_on(&c, t, &v, &[0, 1, 2, 3]).await;
    // Phase 2 reached node 0 only.
    c.node(0).txn_commit(t).unwrap();
    reference.push(&v);
    let resolved = c.node(3).resolve_expired(Duration::ZERO).await.unwrap();
    assert_eq!(resolved, vec![(t, true)]);
    for s in 1..N {
        assert_eq!(
            c.node(s).txn_counters().unwrap().resolved_committed,
            1,
            "node {s}"
        );
    }
    // A late commit of the worker is a repeat: accepted, applied once.
    c.node(2).txn_commit(t).unwrap();
    let w = worker_update(3, 0);
    c.txn(0, 3, &w).await.unwrap();
    reference.push(&w);
    assert_exact(&c, &reference, "committed by lease").await;
}

#[tokio::test]
async fn a_worker_whose_batch_times_out_after_phase_one_resolves_it_before_retrying() {
    let (c, mut reference) = cluster();
    let u = worker_update(2, 1);
    let t = txn_id(1, 7, 2);
    // The worker's transaction is dropped once phase 1 succeeded everywhere (its batch
    // timed out there): the hook signals, then never lets phase 2 start.
    let mut seq = ftrec_ps::ec::TxnCursor::at(t.seq);
    let sh = shares(&u, N);
    let ran = run_txn_until(&c.clients(), t, &sh, &[], TxnPhase::Commit, &mut seq).await;
    assert!(ran.is_none(), "phase 2 ran");
    // Prepared everywhere, committed nowhere: the worker's resolution aborts it.
    assert!(!resolve_txn(&reachable(&c), t).await.unwrap().committed);
    // So the batch is trained again, and applied once.
    c.txn(1, 2, &u).await.unwrap();
    reference.push(&u);
    assert_exact(&c, &reference, "timed out after phase 1").await;
}

#[tokio::test]
async fn a_batch_timing_out_mid_prepare_leaves_nothing_behind() {
    let (c, mut reference) = cluster();
    let u = worker_update(2, 1);
    let t = txn_id(1, 7, 2);
    // Phase 1 reached nodes 0 and 1 when the batch timed out.
    prepare_on(&c, t, &u, &[0, 1]).await;
    assert!(!resolve_txn(&reachable(&c), t).await.unwrap().committed);
    // The prepare still on its way to node 3 arrives late: refused, the slot stays free.
    let late = c
        .node(3)
        .txn_prepare(t, Arc::new(ftrec_ps::Update::new()), Admission::WaitDie)
        .await;
    assert!(matches!(late, Err(PsError::NotReady { .. })), "{late:?}");
    c.txn(1, 2, &u).await.unwrap();
    reference.push(&u);
    assert_exact(&c, &reference, "timed out mid-prepare").await;
}

#[tokio::test]
async fn a_commit_failing_on_a_live_server_is_completed_and_the_batch_not_trained_again() {
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    let v = worker_update(2, 1);
    prepare_on(&c, t, &v, &[0, 1, 2, 3]).await;
    // Phase 2 failed on nodes 2 and 3 (a timeout; they are alive).
    c.node(0).txn_commit(t).unwrap();
    c.node(1).txn_commit(t).unwrap();
    reference.push(&v);
    // The worker resolves before reporting the batch: committed, so it is not retrained.
    assert!(resolve_txn(&reachable(&c), t).await.unwrap().committed);
    for s in [2, 3] {
        assert_eq!(
            c.node(s).txn_counters().unwrap().resolved_committed,
            1,
            "node {s}"
        );
    }
    assert_exact(&c, &reference, "commit failed on live servers").await;
}

#[tokio::test]
async fn resolvers_agree_and_repeating_a_resolution_changes_nothing() {
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    let v = worker_update(2, 1);
    prepare_on(&c, t, &v, &[0, 1, 2, 3]).await;
    c.node(1).txn_commit(t).unwrap();
    reference.push(&v);
    // The worker and two nodes' leases resolve it at the same time.
    let nodes = reachable(&c);
    let (a, b, d) = tokio::join!(
        resolve_txn(&nodes, t),
        c.node(0).resolve_expired(Duration::ZERO),
        c.node(3).resolve_expired(Duration::ZERO),
    );
    assert!(a.unwrap().committed);
    for r in [b.unwrap(), d.unwrap()] {
        assert!(r.iter().all(|&(x, committed)| x == t && committed), "{r:?}");
    }
    // And once more, long after.
    assert!(resolve_txn(&nodes, t).await.unwrap().committed);
    for s in 0..N {
        let k = c.node(s).txn_counters().unwrap();
        assert_eq!(k.resolved_aborted, 0, "node {s}");
        assert_eq!(k.resolved_committed, u64::from(s != 1), "node {s}");
        assert_eq!(c.node(s).txn_block(t).unwrap(), TxnOutcome::Committed);
    }
    assert_exact(&c, &reference, "concurrent resolvers").await;
}

#[tokio::test]
async fn a_transaction_prepared_on_every_node_that_answers_waits_for_the_silent_one() {
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    let v = worker_update(2, 1);
    prepare_on(&c, t, &v, &[0, 1, 2, 3]).await;
    // Node 3 does not answer: it may have committed, so nothing is decided...
    let mut nodes = reachable(&c);
    nodes[3] = None;
    let undecided = resolve_txn(&nodes, t).await;
    assert!(
        matches!(&undecided, Err(PsError::NotReady { server: 3, .. })),
        "{undecided:?}"
    );
    // ...and the worker cannot commit it any more, where it was blocked.
    assert!(matches!(
        c.node(0).txn_commit(t),
        Err(PsError::NotReady { .. })
    ));
    // Node 3 had committed it: once it answers, the others commit.
    c.node(3).txn_commit(t).unwrap();
    reference.push(&v);
    assert!(resolve_txn(&reachable(&c), t).await.unwrap().committed);
    assert_exact(&c, &reference, "silent node").await;
}

#[tokio::test]
async fn a_node_whose_lease_expired_on_staged_deltas_only_resolves_them() {
    // Node 1 took deltas of the transaction from its peers but never got its own prepare
    // (the worker's prepare to it was lost): its lease on the staged deltas resolves it.
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    prepare_on(&c, t, &worker_update(2, 1), &[0, 2, 3]).await;
    let resolved = c.node(1).resolve_expired(Duration::ZERO).await.unwrap();
    assert_eq!(resolved, vec![(t, false)]);
    let w = worker_update(3, 0);
    c.txn(0, 3, &w).await.unwrap();
    reference.push(&w);
    assert_exact(&c, &reference, "staged only").await;
}

#[tokio::test]
async fn a_gate_reserved_by_a_worker_that_stalls_is_freed_when_its_lease_expires() {
    // A queued transaction reserved the gate (node 0) and its worker stalled before its
    // prepares: the reservation holds the slot (a wait-die prepare is refused there), and
    // the gate's lease on it aborts it everywhere, after which training goes on.
    let (c, mut reference) = cluster();
    let t = txn_id(1, 7, 2);
    let nothing = Arc::new(Update::new());
    c.node(0)
        .txn_prepare(t, nothing.clone(), Admission::Reserve)
        .await
        .unwrap();
    let other = txn_id(2, 1, 1);
    let e = c
        .node(0)
        .txn_prepare(
            other,
            shares(&worker_update(4, 0), N)[0].clone(),
            Admission::WaitDie,
        )
        .await
        .unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("queued"), "{e}");
    c.node(0).txn_abort(other).unwrap();
    // A reservation carries no share.
    let e = c
        .node(1)
        .txn_prepare(
            t,
            shares(&worker_update(2, 1), N)[1].clone(),
            Admission::Reserve,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("carries none"), "{e}");
    let resolved = c.node(0).resolve_expired(Duration::ZERO).await.unwrap();
    assert_eq!(resolved, vec![(t, false)]);
    assert_eq!(c.node(0).txn_counters().unwrap().resolved_aborted, 1);
    // The worker wakes and prepares: refused, the transaction was resolved.
    let e = c
        .node(0)
        .txn_prepare(
            t,
            shares(&worker_update(2, 1), N)[0].clone(),
            Admission::Queued,
        )
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let w = worker_update(3, 0);
    c.txn(0, 3, &w).await.unwrap();
    reference.push(&w);
    assert_exact(&c, &reference, "a stalled reservation").await;
}

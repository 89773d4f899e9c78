//! ECRec §3.2–3.3: parities stay exact under difference propagation with stateful
//! optimizers, dense replicas stay equal to their primaries, and coding never changes the
//! model itself.

mod ec_common;

use ec_common::{config, dense_init, EcCluster, Reference};
use ftrec_core::OptimizerKind;
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{EcConfig, EcNode, EcService};
use ftrec_ps::PsError;

const STEPS: u64 = 10;

async fn run(n: u32, ec: EcConfig, opt: OptimizerKind) -> (EcCluster, Reference) {
    let c = EcCluster::new(n, ec, opt);
    let mut reference = Reference::new(n, opt);
    for step in 1..=STEPS {
        c.step(step).await.unwrap();
        reference.step(step);
    }
    (c, reference)
}

#[tokio::test]
async fn gf256_parities_equal_a_fresh_encode_after_many_steps() {
    // ECRec §3.2.1: momentum, Adagrad and Adam keep per-row state; difference propagation of
    // values *and* state keeps the parities exact, bit for bit.
    let shapes = [(3, 2, 1), (5, 3, 2), (6, 4, 1), (6, 2, 2), (4, 2, 2)];
    for opt in [
        OptimizerKind::Momentum,
        OptimizerKind::Adagrad,
        OptimizerKind::Adam,
    ] {
        for &(n, k, r) in &shapes {
            let (c, reference) = run(n, EcConfig::new(CodeKind::Gf256, k, r), opt).await;
            let audit = c.audit().await;
            assert!(audit.stripes > 0);
            assert_eq!(
                audit.parity_mismatches, 0,
                "{opt:?} n={n} k={k} r={r}: {audit:?}"
            );
            assert_eq!(audit.replica_mismatches, 0, "{opt:?} n={n} k={k} r={r}");
            assert_eq!(c.digest(), reference.digest(), "{opt:?} n={n} k={k} r={r}");
        }
    }
}

#[tokio::test]
async fn one_phase_mode_keeps_parities_exact_without_failures() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.two_phase = false;
    let (c, reference) = run(4, ec, OptimizerKind::Adam).await;
    let audit = c.audit().await;
    assert_eq!(audit.parity_mismatches, 0);
    assert_eq!(audit.replica_mismatches, 0);
    assert_eq!(c.digest(), reference.digest());
}

#[tokio::test]
async fn sum_code_drift_is_measured_not_hidden() {
    // The paper's float code: parities drift from a fresh sum by rounding; the audit reports
    // how far. The model itself is untouched by coding.
    let (c, reference) = run(
        4,
        EcConfig::new(CodeKind::Sum, 3, 1),
        OptimizerKind::Adagrad,
    )
    .await;
    let audit = c.audit().await;
    assert!(audit.max_abs_error.is_finite());
    assert!(audit.max_abs_error < 1e-3, "{audit:?}");
    assert_eq!(c.digest(), reference.digest());
}

#[tokio::test]
async fn dense_replication_off_sends_no_dense_copies() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.dense_replicas = 0;
    let (c, reference) = run(3, ec, OptimizerKind::Momentum).await;
    assert_eq!(c.digest(), reference.digest());
    let (redundancy, _) = c.node(0).memory().unwrap();
    let (with, _) = {
        let (c2, _) = run(
            3,
            EcConfig::new(CodeKind::Gf256, 2, 1),
            OptimizerKind::Momentum,
        )
        .await;
        c2.node(0).memory().unwrap()
    };
    assert!(redundancy < with, "{redundancy} vs {with}");
}

#[test]
fn a_cluster_too_small_for_the_stripe_is_a_clear_error() {
    let d = dense_init();
    let e = EcNode::new(
        config(3, 0, OptimizerKind::Sgd),
        &d,
        EcConfig::new(CodeKind::Gf256, 2, 2),
    )
    .unwrap_err();
    assert!(
        matches!(&e, PsError::InvalidConfig(m) if m.contains("k + r = 4") && m.contains("3")),
        "{e}"
    );
    let e = EcNode::new(
        config(5, 0, OptimizerKind::Sgd),
        &d,
        EcConfig::new(CodeKind::Sum, 2, 2),
    )
    .unwrap_err();
    assert!(
        matches!(&e, PsError::InvalidConfig(m) if m.contains("sum")),
        "{e}"
    );
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.lock_ranges = 0;
    assert!(matches!(
        EcNode::new(config(4, 0, OptimizerKind::Sgd), &d, ec),
        Err(PsError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn parity_layout_is_balanced_for_any_server_count() {
    // Every server holds parities, and the counts differ by little, also when the server
    // count divides k + 1 (where a fixed offset would leave servers without parities).
    for (n, k, r) in [
        (3u32, 2usize, 1usize),
        (4, 3, 1),
        (6, 2, 1),
        (6, 3, 2),
        (8, 4, 2),
    ] {
        let c = EcCluster::new(n, EcConfig::new(CodeKind::Gf256, k, r), OptimizerKind::Sgd);
        let layout = c.node(0).layout().clone();
        let counts = layout.parity_counts();
        let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
        assert!(min > 0, "n={n} k={k} r={r}: {counts:?}");
        let tables = layout.tables() as u64;
        assert!(
            max - min <= tables * u64::from(layout.prefix_imbalance()),
            "n={n} k={k} r={r}: {counts:?}"
        );
    }
}

#[tokio::test]
async fn the_audit_sees_a_parity_that_missed_a_delta() {
    use ftrec_core::{ServerId, TableId};
    use ftrec_ps::ec::{DeltaBatch, RowDelta};
    let (c, _) = run(
        4,
        EcConfig::new(CodeKind::Gf256, 2, 1),
        OptimizerKind::Momentum,
    )
    .await;
    assert_eq!(c.audit().await.parity_mismatches, 0);
    // A delta applied to a parity without its row changing: the parity no longer encodes
    // its stripe.
    let layout = c.node(0).layout().clone();
    let (table, row) = (TableId(0), 5);
    let owner = layout.shard_map().owner(table, row);
    let (holder, _) = layout.row_parities(table, row).unwrap().parities[0];
    let words = c.node(0).shared().read().unwrap().layout().words();
    let bogus = DeltaBatch {
        step: 0,
        from: owner,
        apply_now: true,
        rows: vec![RowDelta {
            table,
            row,
            delta: vec![f32::from_bits(1); words],
        }],
        dense: vec![],
    };
    c.node(holder.0).stage_deltas(bogus.clone()).unwrap();
    assert_eq!(c.audit().await.parity_mismatches, 1);
    // A delta from a server that does not own the row is refused.
    let mut wrong = bogus.clone();
    wrong.from = ServerId((owner.0 + 1) % 4);
    assert!(matches!(
        c.node(holder.0).stage_deltas(wrong),
        Err(PsError::MalformedRequest(_))
    ));
}

// ---- asynchronous training: every worker's update is one transaction (ECRec §3.5) ----

#[tokio::test]
async fn sequential_transactions_train_the_pushed_model_bit_for_bit() {
    // One update at a time, in a known order: the coded cluster holds exactly the model plain
    // servers reach by pushing the same updates, with and without 2PC.
    for two_phase in [true, false] {
        let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
        ec.two_phase = two_phase;
        let c = EcCluster::new(4, ec, OptimizerKind::Adam);
        let mut reference = ec_common::PushReference::new(4, OptimizerKind::Adam);
        for i in 1..=8u64 {
            let u = ec_common::worker_update(i, (i % 2) as u32);
            let r = c.txn((i % 2) as u32, i, &u).await.unwrap();
            assert!(r.commit_failures.is_empty() && r.retries == 0, "{r:?}");
            reference.push(&u);
        }
        assert_eq!(c.digest(), reference.digest(), "2PC {two_phase}");
        let audit = c.audit().await;
        assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
        for s in 0..4 {
            assert_eq!(c.node(s).committed_step().unwrap(), Some(8));
        }
    }
}

#[test]
fn concurrent_transactions_keep_parities_and_replicas_exact() {
    // Several workers push at once on a multi-threaded runtime; after every round the
    // parities equal a fresh encode of their stripes and the replicas their primaries, and
    // every node committed every transaction once.
    let rt = ec_common::two_thread_runtime();
    rt.block_on(async {
        for (n, k, r, two_phase) in [(5, 2, 1, true), (6, 4, 2, true), (5, 2, 1, false)] {
            let mut ec = EcConfig::new(CodeKind::Gf256, k, r);
            ec.two_phase = two_phase;
            let c = EcCluster::new(n, ec, OptimizerKind::Adam);
            let mut total = 0u64;
            let mut retries = 0;
            for round in 0..5u64 {
                let mut set = tokio::task::JoinSet::new();
                for w in 0..3u32 {
                    let clients = c.clients();
                    set.spawn(async move {
                        let mut retries = 0;
                        for i in 0..3u64 {
                            // Batches are handed out in increasing order across workers.
                            let batch = 1 + round * 9 + i * 3 + u64::from(w);
                            let u = ec_common::worker_update(batch, w);
                            let mut seq = ftrec_ps::ec::TxnCursor::at(batch * 100);
                            let rep = ftrec_ps::ec::run_txn(
                                &clients,
                                ec_common::txn_id(w, seq.seq, batch),
                                &ec_common::shares(&u, n),
                                two_phase,
                                &mut seq,
                                &[],
                                |_| async {},
                            )
                            .await
                            .unwrap();
                            assert!(rep.commit_failures.is_empty(), "{rep:?}");
                            retries += rep.retries;
                        }
                        retries
                    });
                }
                while let Some(r) = set.join_next().await {
                    retries += r.unwrap();
                }
                total += 9;
                let what = format!("n={n} k={k} r={r} 2PC {two_phase} round {round}");
                c.assert_exact(Some(total), &what).await;
            }
            eprintln!("n={n} k={k} r={r} 2PC {two_phase}: {retries} wait-die retries");
        }
    });
}

#[tokio::test]
async fn a_queued_prepare_waits_for_any_holder_and_wait_die_never_waits_for_a_queued_one() {
    use ftrec_ps::ec::Admission::{Queued, WaitDie};
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let u = ec_common::worker_update(10, 0);
    let sh = ec_common::shares(&u, 3);
    let prepare_all = |t, admission| {
        let c = &c;
        let sh = &sh;
        async move {
            for s in 0..3u32 {
                c.node(s)
                    .txn_prepare(t, sh[s as usize].clone(), admission)
                    .await
                    .unwrap();
            }
        }
    };
    let commit_all = |t| {
        for s in 0..3u32 {
            c.node(s).txn_commit(t).unwrap();
        }
    };
    // An older wait-die holder: a younger queued prepare waits for it instead of being
    // refused.
    let holder = ec_common::txn_id(0, 1, 10);
    prepare_all(holder, WaitDie).await;
    let queued = ec_common::txn_id(1, 1, 20);
    let node = c.node(0).clone();
    let share0 = sh[0].clone();
    let waiting = tokio::spawn(async move { node.txn_prepare(queued, share0, Queued).await });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(
        !waiting.is_finished(),
        "a queued prepare must wait, not be refused"
    );
    commit_all(holder);
    waiting.await.unwrap().unwrap();
    // Node 0 (the gate) now held queued: an older wait-die prepare is refused there
    // (retryably) instead of waiting, so nothing waits for a queued transaction but a queued
    // one at the gate.
    let older = ec_common::txn_id(2, 1, 5);
    let e = c
        .node(0)
        .txn_prepare(older, sh[0].clone(), WaitDie)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("queued"), "{e}");
    c.node(0).txn_abort(older).unwrap();
    for s in 1..3u32 {
        c.node(s)
            .txn_prepare(queued, sh[s as usize].clone(), Queued)
            .await
            .unwrap();
    }
    commit_all(queued);
    // An aborted attempt never prepares again: refused even with the slot free.
    let e = c
        .node(1)
        .txn_prepare(older, sh[1].clone(), WaitDie)
        .await
        .unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("aborted"), "{e}");
    // Its worker's retry (a fresh sequence number, the same batch) goes through now that
    // the slot is free; both updates are in, parities exact.
    let retry = ec_common::txn_id(2, 2, 5);
    prepare_all(retry, WaitDie).await;
    commit_all(retry);
    c.assert_exact(Some(3), "a queued and two wait-die transactions")
        .await;
}

/// Transaction `i` of worker 1 (batch 20 + i) run through [`ftrec_ps::ec::run_txn`], behind
/// an older holder (batch `i`) when `contended`: wait-die refuses its first attempt, and the
/// holder commits before the second.
async fn run_behind(
    c: &EcCluster,
    i: u64,
    contended: bool,
    cursor: &mut ftrec_ps::ec::TxnCursor,
) -> ftrec_ps::ec::TxnReport {
    use ftrec_ps::ec::{run_txn, Admission, TxnPhase};
    let sh = ec_common::shares(&ec_common::worker_update(10 + i, 0), 3);
    let holder = ec_common::txn_id(0, i + 1, i);
    if contended {
        for s in 0..3u32 {
            c.node(s)
                .txn_prepare(holder, sh[s as usize].clone(), Admission::WaitDie)
                .await
                .unwrap();
        }
    }
    cursor.seq += 1;
    let t = ec_common::txn_id(1, cursor.seq, 20 + i);
    let mut attempts = 0;
    run_txn(&c.clients(), t, &sh, true, cursor, &[], |p| {
        if p == TxnPhase::Prepare {
            attempts += 1;
            if attempts == 2 && contended {
                for s in 0..3u32 {
                    c.node(s).txn_commit(holder).unwrap();
                }
            }
        }
        async {}
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_refused_transaction_is_retried_queued_and_frequent_refusals_queue_the_next_ones() {
    use ftrec_ps::ec::{TxnCursor, QUEUED_AFTER_REFUSAL};
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut cursor = TxnCursor::at(100);
    // One refusal: the transaction is retried queued, the next ones are not.
    let rep = run_behind(&c, 0, true, &mut cursor).await;
    assert_eq!((rep.retries, rep.queued), (1, true), "{rep:?}");
    assert_eq!(cursor.queued_left, 0, "{cursor:?}");
    let rep = run_behind(&c, 1, false, &mut cursor).await;
    assert_eq!((rep.retries, rep.queued), (0, false), "{rep:?}");
    // Two more refusals in a row: the worker's next transactions start queued.
    let rep = run_behind(&c, 2, true, &mut cursor).await;
    assert_eq!((rep.retries, rep.queued), (1, true), "{rep:?}");
    assert_eq!(cursor.queued_left, 0, "{cursor:?}");
    run_behind(&c, 3, true, &mut cursor).await;
    assert_eq!(cursor.queued_left, QUEUED_AFTER_REFUSAL, "{cursor:?}");
    let rep = run_behind(&c, 4, false, &mut cursor).await;
    assert_eq!((rep.retries, rep.queued), (0, true), "{rep:?}");
    assert_eq!(cursor.queued_left, QUEUED_AFTER_REFUSAL - 1);
    c.assert_exact(Some(8), "refused transactions retried queued")
        .await;
}

/// On the tokio clock, paused: it moves only when every task waits for a timer, so how far
/// it moved says which timers a run waited for, whatever the machine's speed.
#[tokio::test(start_paused = true)]
async fn a_refused_attempt_lets_go_at_once_of_a_node_where_it_waits() {
    use ftrec_ps::ec::{run_txn, Admission, TxnCursor, TxnPhase};
    let mut cfg = EcConfig::new(CodeKind::Gf256, 2, 1);
    // A wait for a slot that is never freed would end only here.
    cfg.peer_timeout = std::time::Duration::from_secs(3600);
    let c = EcCluster::new(3, cfg, OptimizerKind::Adam);
    let sh = ec_common::shares(&ec_common::worker_update(10, 0), 3);
    // Node 0 held by a younger transaction (batch 30), which an older one waits for; node 1
    // by an older one (batch 5), which refuses a younger one at once. Node 2 is free.
    let younger = ec_common::txn_id(3, 1, 30);
    let older = ec_common::txn_id(0, 1, 5);
    for (t, s) in [(younger, 0u32), (older, 1)] {
        c.node(s)
            .txn_prepare(t, sh[s as usize].clone(), Admission::WaitDie)
            .await
            .unwrap();
    }
    // The transaction (batch 20): it waits on node 0 and is refused on node 1.
    let t = ec_common::txn_id(1, 1, 20);
    let mut cursor = TxnCursor::at(1);
    let start = tokio::time::Instant::now();
    let mut attempts = 0;
    let mut retried_after = None;
    let rep = run_txn(&c.clients(), t, &sh, true, &mut cursor, &[], |p| {
        if p == TxnPhase::Prepare {
            attempts += 1;
            if attempts == 2 {
                // The first attempt is over, though node 0's holder was never decided: the
                // refusal on node 1 aborted it everywhere, node 0's wait included. (Had the
                // attempt waited for node 0's answer, only the peer timeout would have ended
                // it.) Now both holders give up, and the retry goes through.
                retried_after = Some(start.elapsed());
                for s in 0..3u32 {
                    c.node(s).txn_abort(younger).unwrap();
                    c.node(s).txn_abort(older).unwrap();
                }
            }
        }
        async {}
    })
    .await
    .unwrap();
    assert_eq!((rep.retries, rep.queued), (1, true), "{rep:?}");
    let waited = retried_after.expect("a second attempt");
    assert!(
        waited < std::time::Duration::from_secs(1),
        "the refused attempt ended after {waited:?} on the paused clock: it waited for a timer"
    );
    // Nothing of the aborted attempt or of the two holders stayed: the one update is in,
    // parities exact.
    c.assert_exact(Some(1), "a refused attempt aborted at once, then retried")
        .await;
}

#[tokio::test]
async fn a_peers_differences_for_a_transaction_aborted_there_are_refused() {
    use ftrec_ps::ec::Admission;
    // The abort of an attempt can overtake the differences a peer computed for it: a parity
    // holder that saw the abort refuses them, so nothing of the attempt stays staged there.
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let u = ec_common::worker_update(10, 0);
    let sh = ec_common::shares(&u, 3);
    let t = ec_common::txn_id(0, 1, 10);
    // Aborted everywhere but on node 0, which prepares it and sends its parity holders the
    // differences.
    for s in 1..3u32 {
        c.node(s).txn_abort(t).unwrap();
    }
    let e = c
        .node(0)
        .txn_prepare(t, sh[0].clone(), Admission::Queued)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("was aborted on server") && m.contains("differences for it arrived"),
        "{m}"
    );
    for s in 0..3u32 {
        let held = c.node(s).txn_fence(0, 0).unwrap();
        assert_eq!((held.holding, held.staged.len()), (None, 0), "node {s}");
    }
    // The slot is free: the update goes through under a fresh sequence number.
    let r = c.txn(0, 10, &u).await.unwrap();
    assert!(r.retries == 0 && r.commit_failures.is_empty(), "{r:?}");
    c.assert_exact(Some(1), "differences for an aborted transaction refused")
        .await;
}

#[tokio::test]
async fn conflicting_transactions_wait_or_die_by_age_and_a_waiter_is_counted_with_its_share() {
    // Wait-die (no deadlock, no starvation): a transaction younger than the one holding a
    // node is refused at once, retryably; an older one waits for the holder to finish.
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let holder = ec_common::txn_id(0, 1, 10);
    let u = ec_common::worker_update(10, 0);
    let sh = ec_common::shares(&u, 3);
    for s in 0..3u32 {
        c.node(s)
            .txn_prepare(
                holder,
                sh[s as usize].clone(),
                ftrec_ps::ec::Admission::WaitDie,
            )
            .await
            .unwrap();
    }
    let younger = ec_common::txn_id(1, 1, 20);
    let e = c
        .node(0)
        .txn_prepare(younger, sh[0].clone(), ftrec_ps::ec::Admission::WaitDie)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let older = ec_common::txn_id(2, 1, 5);
    let node = c.node(0).clone();
    let share0 = sh[0].clone();
    let waiting = tokio::spawn(async move {
        node.txn_prepare(older, share0, ftrec_ps::ec::Admission::WaitDie)
            .await
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(
        !waiting.is_finished(),
        "the older transaction must wait for the holder"
    );
    // The memory report counts the waiter and the share it holds meanwhile.
    let share_bytes: u64 = sh[0]
        .sparse
        .iter()
        .map(|g| g.rows.len() as u64 * 8 + g.grads.len() as u64 * 4)
        .chain(sh[0].dense.iter().map(|g| g.grads.len() as u64 * 4))
        .sum();
    let p = c.node(0).memory_parts().unwrap();
    assert_eq!(p.waiting_prepares, 1, "{p:?}");
    assert!(
        p.waiting_bytes >= share_bytes && share_bytes > 0,
        "{p:?}, share {share_bytes}"
    );
    for s in 0..3u32 {
        c.node(s).txn_commit(holder).unwrap();
    }
    waiting.await.unwrap().unwrap();
    let p = c.node(0).memory_parts().unwrap();
    assert_eq!((p.waiting_prepares, p.waiting_bytes), (0, 0), "{p:?}");
    // Prepared on node 0, the older transaction's deltas wait staged at its parity holders.
    let staged = |c: &EcCluster| -> (u64, u64) {
        (0..3u32)
            .map(|s| c.node(s).memory_parts().unwrap())
            .fold((0, 0), |(b, n), p| {
                (b + p.staged_bytes, n + p.staged_batches)
            })
    };
    let (bytes, batches) = staged(&c);
    assert!(
        bytes > 0 && batches > 0,
        "{bytes} bytes in {batches} batches"
    );
    for s in 0..3u32 {
        c.node(s).txn_abort(older).unwrap();
    }
    assert_eq!(staged(&c), (0, 0));
    let audit = c.audit().await;
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
}

#[test]
fn the_memory_parts_add_up_to_the_nodes_own_figures() {
    let d = dense_init();
    let node = EcNode::new(
        config(3, 1, OptimizerKind::Adagrad),
        &d,
        EcConfig::new(CodeKind::Gf256, 2, 1),
    )
    .unwrap();
    let (redundancy, model) = node.memory().unwrap();
    let p = node.memory_parts().unwrap();
    assert!(p.parity_bytes > 0 && p.dense_replica_bytes > 0, "{p:?}");
    // Capacities: never below the lengths `memory` counts.
    assert!(
        p.parity_bytes + p.dense_replica_bytes >= redundancy,
        "{p:?}"
    );
    assert!(p.rows_bytes >= model, "{p:?}");
    // Nothing prepared, staged or being rebuilt on a fresh node.
    assert_eq!(
        (
            p.prepared_bytes,
            p.staged_batches,
            p.staged_bytes,
            p.waiting_prepares,
            p.rebuild_bytes
        ),
        (0, 0, 0, 0, 0)
    );
    // A replacement records what it still has to rebuild.
    let fresh = EcNode::new_replacement(
        config(3, 1, OptimizerKind::Adagrad),
        &d,
        EcConfig::new(CodeKind::Gf256, 2, 1),
        &[ftrec_core::ServerId(1)],
    )
    .unwrap();
    assert!(fresh.memory_parts().unwrap().rebuild_bytes > 0);
}

/// Copy every row and the primary dense range of `from`'s servers into `to`'s, as a restore
/// from a checkpoint of `from`'s state loads them.
fn load_state(from: &EcCluster, to: &EcCluster) {
    for s in 0..from.n {
        let src = from.node(s).shared().read().unwrap();
        let mut dst = to.node(s).shared().write().unwrap();
        for t in 0..src.config().table_rows.len() {
            let table = ftrec_core::TableId(t as u32);
            for local in 0..src.shard(table).unwrap().rows() {
                dst.import_row_words(table, local, src.local_row_words(table, local).unwrap())
                    .unwrap();
            }
        }
        dst.import_dense(&src.export_dense(src.dense_blocks()).unwrap())
            .unwrap();
    }
}

/// ECRec §4's second layer: after more losses than the code tolerates, every server loads its
/// rows from a checkpoint; resetting every node before the load and re-encoding after it makes
/// every parity and dense replica match the restored rows, a replacement that had not rebuilt
/// included, and the steps after the checkpoint train again to the failure-free model.
#[tokio::test]
async fn a_restore_from_a_checkpoint_reencodes_parities_and_replicas_and_training_goes_on() {
    for (n, k, r) in [(4, 2, 1), (5, 2, 2), (6, 3, 2)] {
        let what = format!("n={n} k={k} r={r}");
        let opt = OptimizerKind::Adagrad;
        let ec = EcConfig::new(CodeKind::Gf256, k, r);
        // The checkpoint: the state after 4 steps.
        let saved = EcCluster::new(n, ec, opt);
        for step in 1..=4 {
            saved.step(step).await.unwrap();
        }
        // The job went on to step 9; then servers were lost, one replaced without a rebuild.
        let mut c = EcCluster::new(n, ec, opt);
        for step in 1..=9 {
            c.step(step).await.unwrap();
        }
        c.kill(1);
        c.replace(1, &[1]);
        for s in 0..n {
            EcService::reset_for_restore(c.node(s)).await.unwrap();
        }
        load_state(&saved, &c);
        let mut encoded = 0;
        for s in 0..n {
            let rep = EcService::reencode(c.node(s)).await.unwrap();
            assert_eq!(rep.replicas, r as u64, "{what}");
            encoded += rep.parities;
        }
        assert!(encoded > 0, "{what}");
        assert_eq!(c.digest(), saved.digest(), "{what}");
        c.assert_exact(None, &format!("{what}: after the restore"))
            .await;
        // Steps 5..=10 again, as the job redoes them, to the failure-free model.
        let mut reference = Reference::new(n, opt);
        for step in 1..=10 {
            reference.step(step);
        }
        for step in 5..=10 {
            c.step(step).await.unwrap();
        }
        assert_eq!(c.digest(), reference.digest(), "{what}");
        c.assert_exact(Some(10), &format!("{what}: after the redo"))
            .await;
    }
}

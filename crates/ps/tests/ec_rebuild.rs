//! ECRec §3.4–3.5: a lost server is rebuilt from the survivors (rows with their optimizer
//! state, parity rows, dense part) bit for bit, while training goes on; 2PC keeps a loss in
//! either phase from losing anything.

mod ec_common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ec_common::{EcCluster, Reference};
use ftrec_core::{OptimizerKind, ServerId};
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{EcClient, EcConfig, EcNode, EcService, RebuildHook, RebuildPoint};
use ftrec_ps::PsError;
use tokio::sync::Notify;

fn lost(v: &[u32]) -> Vec<ServerId> {
    v.iter().map(|&s| ServerId(s)).collect()
}

async fn train(c: &EcCluster, reference: &mut Reference, steps: std::ops::RangeInclusive<u64>) {
    for s in steps {
        c.step(s).await.unwrap();
        reference.step(s);
    }
}

/// Holds the first rebuild batch after its lock (its missing parity slots zeroed, its cut
/// decoded) until the test lets it go: steps committed meanwhile land inside a lock range.
struct HoldFirstBatch {
    calls: AtomicUsize,
    held: Notify,
    go: Notify,
}

impl HoldFirstBatch {
    fn install(node: &EcNode) -> Arc<Self> {
        let s = Arc::new(HoldFirstBatch {
            calls: AtomicUsize::new(0),
            held: Notify::new(),
            go: Notify::new(),
        });
        let h = s.clone();
        let hook: RebuildHook = Arc::new(move |p| {
            let h = h.clone();
            Box::pin(async move {
                if matches!(p, RebuildPoint::Decoded { .. })
                    && h.calls.fetch_add(1, Ordering::SeqCst) == 0
                {
                    h.held.notify_one();
                    h.go.notified().await;
                }
            })
        });
        node.set_rebuild_hook(Some(hook)).unwrap();
        s
    }
}

/// Kill `victim` and rebuild it in the background with its first batch held after its decode:
/// steps `during` commit while the batch is held, steps `after` once it goes on; returns the
/// replacement once it is rebuilt.
async fn rebuild_with_first_batch_held(
    c: &mut EcCluster,
    reference: &mut Reference,
    victim: u32,
    during: std::ops::RangeInclusive<u64>,
    after: std::ops::RangeInclusive<u64>,
) -> EcNode {
    c.kill(victim);
    let node = c.replace(victim, &[victim]);
    let hold = HoldFirstBatch::install(&node);
    node.start_rebuild(&lost(&[victim]), true).await.unwrap();
    assert!(node.rebuild_status().unwrap().joined);
    hold.held.notified().await;
    train(c, reference, during).await;
    hold.go.notify_one();
    train(c, reference, after).await;
    c.wait_rebuilt(victim).await;
    node
}

async fn assert_whole(c: &EcCluster, reference: &Reference) {
    assert_eq!(c.digest(), reference.digest());
    let audit = c.audit().await;
    assert_eq!(audit.parity_mismatches, 0, "{audit:?}");
    assert_eq!(audit.replica_mismatches, 0, "{audit:?}");
}

#[tokio::test]
async fn one_lost_server_is_rebuilt_bit_for_bit() {
    for opt in [OptimizerKind::Adam, OptimizerKind::Adagrad] {
        for victim in [0, 2] {
            let mut c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), opt);
            let mut reference = Reference::new(4, opt);
            train(&c, &mut reference, 1..=6).await;
            c.kill(victim);
            let node = c.replace(victim, &[victim]);
            node.start_rebuild(&lost(&[victim]), false).await.unwrap();
            let st = node.rebuild_status().unwrap();
            assert!(st.finished && st.joined, "{st:?}");
            assert_eq!((st.rows_missing, st.parities_missing), (0, 0));
            assert_whole(&c, &reference).await;
            // The replacement is a full member again.
            train(&c, &mut reference, 7..=9).await;
            assert_whole(&c, &reference).await;
        }
    }
}

#[tokio::test]
async fn two_simultaneous_losses_with_r2() {
    for (a, b) in [(1, 2), (0, 4), (3, 5)] {
        let mut c = EcCluster::new(6, EcConfig::new(CodeKind::Gf256, 3, 2), OptimizerKind::Adam);
        let mut reference = Reference::new(6, OptimizerKind::Adam);
        train(&c, &mut reference, 1..=5).await;
        c.kill(a);
        c.kill(b);
        let na = c.replace(a, &[a, b]);
        let nb = c.replace(b, &[a, b]);
        na.start_rebuild(&lost(&[a, b]), false).await.unwrap();
        nb.start_rebuild(&lost(&[a, b]), false).await.unwrap();
        assert_whole(&c, &reference).await;
        train(&c, &mut reference, 6..=7).await;
        assert_whole(&c, &reference).await;
    }
}

#[tokio::test]
async fn more_losses_than_r_is_a_clear_error() {
    let mut c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Sgd);
    c.kill(0);
    c.kill(1);
    let n = c.replace(0, &[0, 1]);
    let e = n.start_rebuild(&lost(&[0, 1]), false).await.unwrap_err();
    assert!(
        matches!(&e, PsError::Coding(m) if m.contains("tolerates only 1")),
        "{e}"
    );
}

#[tokio::test]
async fn rebuild_in_ten_lock_ranges_while_training_goes_on() {
    // The rebuild runs in the background; steps keep committing, touching lost rows before
    // their range (decoded on demand) and rows of ranges being rebuilt (the cut check retries).
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.lock_ranges = 10;
    let mut c = EcCluster::new(5, ec, OptimizerKind::Momentum);
    let mut reference = Reference::new(5, OptimizerKind::Momentum);
    train(&c, &mut reference, 1..=4).await;
    // Steps commit while the first batch holds its lock: their deltas reach parity slots
    // that were zeroed at the lock and must be merged with the decoded parity.
    let node = rebuild_with_first_batch_held(&mut c, &mut reference, 3, 5..=7, 8..=12).await;
    let st = node.rebuild_status().unwrap();
    assert_eq!(st.ranges_total, 10, "{st:?}");
    assert_eq!(st.ranges_done, 10, "{st:?}");
    assert!(st.commits_in_lock >= 3, "{st:?}");
    assert_whole(&c, &reference).await;
}

#[test]
fn small_batches_pipelined_while_training_goes_on() {
    // Batches of 3 stripes: while one batch is decoded, the next has taken its lock and sent
    // its reads. The first batch is held after its decode while steps commit: the next
    // batch's slots, zeroed at its lock, collect those steps' deltas, and its rows, read
    // before them, must not overwrite rows the steps decoded on demand and updated.
    let rt = ec_common::two_thread_runtime();
    rt.block_on(async {
        let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
        ec.lock_ranges = 2;
        ec.rebuild_batch_stripes = Some(3);
        let mut c = EcCluster::new(5, ec, OptimizerKind::Adagrad);
        let mut reference = Reference::new(5, OptimizerKind::Adagrad);
        train(&c, &mut reference, 1..=4).await;
        let node = rebuild_with_first_batch_held(&mut c, &mut reference, 2, 5..=7, 8..=14).await;
        let st = node.rebuild_status().unwrap();
        assert!(st.batches >= 4, "{st:?}");
        assert!(st.commits_in_lock >= 3, "{st:?}");
        assert_eq!((st.rows_missing, st.parities_missing), (0, 0), "{st:?}");
        assert_whole(&c, &reference).await;
    });
}

#[tokio::test]
async fn rows_touched_before_their_range_are_decoded_on_demand() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 3, 2);
    ec.lock_ranges = 10;
    let mut c = EcCluster::new(5, ec, OptimizerKind::Adagrad);
    let mut reference = Reference::new(5, OptimizerKind::Adagrad);
    train(&c, &mut reference, 1..=3).await;
    c.kill(1);
    let node = c.replace(1, &[1]);
    // Join only (degraded mode): no range has run when the steps need the lost rows.
    node.begin_rebuild(&lost(&[1])).await.unwrap();
    train(&c, &mut reference, 4..=6).await;
    let st = node.rebuild_status().unwrap();
    assert!(st.rows_decoded_on_demand > 0, "{st:?}");
    assert!(st.rows_missing > 0, "{st:?}");
    // Then the ranges one at a time, a step between each (one lock switch per pause).
    let mut step = 7;
    while !node.rebuild_ranges(1).await.unwrap() {
        train(&c, &mut reference, step..=step).await;
        step += 1;
    }
    assert_eq!(node.rebuild_status().unwrap().ranges_done, 10);
    assert_whole(&c, &reference).await;
}

#[test]
fn rebuild_on_a_multi_thread_runtime_with_concurrent_steps() {
    let rt = ec_common::two_thread_runtime();
    rt.block_on(async {
        let mut ec = EcConfig::new(CodeKind::Gf256, 2, 2);
        ec.lock_ranges = 10;
        let mut c = EcCluster::new(5, ec, OptimizerKind::Adam);
        let mut reference = Reference::new(5, OptimizerKind::Adam);
        train(&c, &mut reference, 1..=3).await;
        let node = rebuild_with_first_batch_held(&mut c, &mut reference, 0, 4..=6, 7..=15).await;
        let st = node.rebuild_status().unwrap();
        assert!(st.commits_in_lock >= 3);
        // The process metric counts every rebuilt byte (other tests' rebuilds may add theirs).
        assert!(st.bytes_rebuilt > 0);
        assert!(ftrec_obs::metrics().ecrec_rebuild_bytes.get() >= st.bytes_rebuilt);
        assert_whole(&c, &reference).await;
    });
}

#[tokio::test]
async fn the_replacement_dies_during_its_rebuild() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.lock_ranges = 10;
    let mut c = EcCluster::new(4, ec, OptimizerKind::Adam);
    let mut reference = Reference::new(4, OptimizerKind::Adam);
    train(&c, &mut reference, 1..=4).await;
    c.kill(2);
    let first = c.replace(2, &[2]);
    first.start_rebuild(&lost(&[2]), true).await.unwrap();
    train(&c, &mut reference, 5..=6).await;
    // Killed mid-rebuild (wherever its background ranges are): a second replacement starts
    // from scratch from the survivors.
    c.kill(2);
    let second = c.replace(2, &[2]);
    second.start_rebuild(&lost(&[2]), true).await.unwrap();
    train(&c, &mut reference, 7..=9).await;
    c.wait_rebuilt(2).await;
    assert_whole(&c, &reference).await;
    let st = first.rebuild_status().unwrap();
    assert!(!st.finished || st.ranges_done <= st.ranges_total);
}

#[tokio::test]
async fn a_loss_in_phase_one_aborts_and_the_step_is_retried() {
    let mut c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut reference = Reference::new(4, OptimizerKind::Adam);
    train(&c, &mut reference, 1..=3).await;
    // Step 4: workers stage, two nodes prepare (their deltas reach the others), then server 2
    // dies before its prepare.
    c.stage(4).unwrap();
    // The coordinator's handle on server 2, as it would hold a connection.
    let to_victim = EcClient::in_process(c.node(2));
    for s in [0, 1, 3] {
        EcService::prepare(c.node(s), 4, EcCluster::workers())
            .await
            .unwrap();
    }
    c.kill(2);
    let e = to_victim.prepare(4, EcCluster::workers()).await;
    assert!(matches!(e, Err(PsError::Unavailable { .. })), "{e:?}");
    c.abort_all(4).await;
    // Nothing of step 4 was applied anywhere.
    let node = c.replace(2, &[2]);
    node.start_rebuild(&lost(&[2]), false).await.unwrap();
    assert_whole(&c, &reference).await;
    // Retried from the workers' stage on.
    c.step(4).await.unwrap();
    reference.step(4);
    assert_whole(&c, &reference).await;
}

#[tokio::test]
async fn a_loss_in_phase_two_is_completed_by_the_survivors() {
    for victim_committed in [false, true] {
        let mut c = EcCluster::new(
            5,
            EcConfig::new(CodeKind::Gf256, 3, 2),
            OptimizerKind::Momentum,
        );
        let mut reference = Reference::new(5, OptimizerKind::Momentum);
        train(&c, &mut reference, 1..=3).await;
        c.stage(4).unwrap();
        c.prepare_all(4).await.unwrap();
        // Commit reaches server 0 (and the victim or not), then the victim dies.
        EcService::commit(c.node(0), 4).await.unwrap();
        if victim_committed {
            EcService::commit(c.node(3), 4).await.unwrap();
        }
        c.kill(3);
        for s in [1, 2, 4] {
            EcService::commit(c.node(s), 4).await.unwrap();
        }
        reference.step(4);
        let node = c.replace(3, &[3]);
        node.start_rebuild(&lost(&[3]), false).await.unwrap();
        // The parities held the victim's committed step: nothing lost.
        assert_whole(&c, &reference).await;
        train(&c, &mut reference, 5..=6).await;
        assert_whole(&c, &reference).await;
    }
}

#[tokio::test]
async fn dense_replication_off_cannot_rebuild_the_dense_part() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.dense_replicas = 0;
    let mut c = EcCluster::new(3, ec, OptimizerKind::Sgd);
    c.step(1).await.unwrap();
    c.kill(1);
    let n = c.replace(1, &[1]);
    let e = n.start_rebuild(&lost(&[1]), false).await.unwrap_err();
    assert!(
        matches!(&e, PsError::Coding(m) if m.contains("dense")),
        "{e}"
    );
    assert!(n.rebuild_status().unwrap().error.is_some());
}

#[tokio::test]
async fn a_server_that_is_not_a_replacement_has_nothing_to_rebuild() {
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Sgd);
    let e = c
        .node(0)
        .start_rebuild(&lost(&[0]), false)
        .await
        .unwrap_err();
    assert!(matches!(e, PsError::InvalidConfig(_)), "{e}");
}

#[tokio::test]
async fn a_second_loss_during_a_rebuild_with_r2() {
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 2);
    ec.lock_ranges = 10;
    let mut c = EcCluster::new(5, ec, OptimizerKind::Adam);
    let mut reference = Reference::new(5, OptimizerKind::Adam);
    train(&c, &mut reference, 1..=3).await;
    c.kill(4);
    let a = c.replace(4, &[4]);
    a.begin_rebuild(&lost(&[4])).await.unwrap();
    a.rebuild_ranges(3).await.unwrap();
    train(&c, &mut reference, 4..=5).await;
    // Server 1 dies while 4 is still rebuilding: both rebuild against the new lost set.
    c.kill(1);
    let b = c.replace(1, &[1, 4]);
    a.begin_rebuild(&lost(&[1, 4])).await.unwrap();
    b.begin_rebuild(&lost(&[1, 4])).await.unwrap();
    train(&c, &mut reference, 6..=7).await;
    assert!(a.rebuild_ranges(usize::MAX).await.unwrap());
    assert!(b.rebuild_ranges(usize::MAX).await.unwrap());
    assert_whole(&c, &reference).await;
}

/// The interleaving of two rebuild drivers that loses a step from a parity: the first driver
/// (A) zeroed its parity slots and decoded its cut; steps commit into the zeroed slots; the
/// rebuild is restarted and a second driver (B) zeroes the slots again (dropping those
/// steps' deltas) and decodes; then A merges its older decode into B's slots. The hook holds
/// B until A merged or was cancelled, so the interleaving does not depend on scheduling.
struct TwoDrivers {
    calls: AtomicUsize,
    a_generation: AtomicU64,
    a_done_sent: AtomicBool,
    a_held: Notify,
    release_a: Notify,
    a_done: Notify,
}

/// Tells B that A is done when A's held future is dropped (A cancelled) rather than resumed.
struct DoneOnDrop(Arc<TwoDrivers>, bool);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        if self.1 && !self.0.a_done_sent.swap(true, Ordering::SeqCst) {
            self.0.a_done.notify_one();
        }
    }
}

impl TwoDrivers {
    fn install(node: &EcNode) -> Arc<Self> {
        let s = Arc::new(TwoDrivers {
            calls: AtomicUsize::new(0),
            a_generation: AtomicU64::new(u64::MAX),
            a_done_sent: AtomicBool::new(false),
            a_held: Notify::new(),
            release_a: Notify::new(),
            a_done: Notify::new(),
        });
        let h = s.clone();
        let hook: RebuildHook = Arc::new(move |p| {
            let h = h.clone();
            Box::pin(async move {
                match p {
                    RebuildPoint::Decoded { generation } => {
                        match h.calls.fetch_add(1, Ordering::SeqCst) {
                            0 => {
                                h.a_generation.store(generation, Ordering::SeqCst);
                                let mut guard = DoneOnDrop(h.clone(), true);
                                h.a_held.notify_one();
                                h.release_a.notified().await;
                                guard.1 = false;
                            }
                            1 => {
                                h.release_a.notify_one();
                                h.a_done.notified().await;
                            }
                            _ => {}
                        }
                    }
                    RebuildPoint::Merged { generation } => {
                        if generation == h.a_generation.load(Ordering::SeqCst)
                            && !h.a_done_sent.swap(true, Ordering::SeqCst)
                        {
                            h.a_done.notify_one();
                        }
                    }
                }
            })
        });
        node.set_rebuild_hook(Some(hook)).unwrap();
        s
    }
}

#[tokio::test]
async fn a_restarted_rebuild_never_runs_two_drivers() {
    // ECRec §3.4: a lost parity is zeroed at its batch's lock, collects the deltas committed
    // after it and is merged with the decode of the lock's cut. A restart must stop the
    // driver under way before a new one zeroes anything.
    let mut c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut reference = Reference::new(4, OptimizerKind::Adam);
    train(&c, &mut reference, 1..=3).await;
    c.kill(1);
    let node = c.replace(1, &[1]);
    let script = TwoDrivers::install(&node);
    node.start_rebuild(&lost(&[1]), true).await.unwrap();
    script.a_held.notified().await;
    train(&c, &mut reference, 4..=7).await;
    node.start_rebuild(&lost(&[1]), true).await.unwrap();
    c.wait_rebuilt(1).await;
    let st = node.rebuild_status().unwrap();
    assert_eq!(st.generation, 2, "{st:?}");
    assert!(st.commits_in_lock >= 4, "{st:?}");
    assert_whole(&c, &reference).await;
    train(&c, &mut reference, 8..=9).await;
    assert_whole(&c, &reference).await;
}

#[tokio::test]
async fn restarting_a_rebuild_that_already_finished_changes_nothing() {
    // The coordinator may ask a replacement to restart against a new lost set just after its
    // rebuild finished: it is whole, so there is nothing to do.
    let mut c = EcCluster::new(5, EcConfig::new(CodeKind::Gf256, 2, 2), OptimizerKind::Adam);
    let mut reference = Reference::new(5, OptimizerKind::Adam);
    train(&c, &mut reference, 1..=3).await;
    c.kill(2);
    let node = c.replace(2, &[2]);
    node.start_rebuild(&lost(&[2]), false).await.unwrap();
    c.kill(4);
    let other = c.replace(4, &[2, 4]);
    node.start_rebuild(&lost(&[2, 4]), true).await.unwrap();
    let st = node.rebuild_status().unwrap();
    assert!(
        st.finished && st.error.is_none() && st.generation == 1,
        "{st:?}"
    );
    other.start_rebuild(&lost(&[2, 4]), false).await.unwrap();
    assert_whole(&c, &reference).await;
}

#[tokio::test]
async fn a_rebuild_share_of_zero_holds_the_lock_ranges_until_it_is_raised() {
    // Rebuild rate control: at share 0 the replacement joins and serves (decoding on
    // demand) but runs no lock range; raising the share lets the ranges run.
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.lock_ranges = 4;
    ec.rebuild_share_ppm = 0;
    let mut c = EcCluster::new(4, ec, OptimizerKind::Adagrad);
    let mut reference = Reference::new(4, OptimizerKind::Adagrad);
    train(&c, &mut reference, 1..=3).await;
    c.kill(2);
    let node = c.replace(2, &[2]);
    node.start_rebuild(&lost(&[2]), true).await.unwrap();
    train(&c, &mut reference, 4..=6).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let st = node.rebuild_status().unwrap();
    assert!(st.joined && !st.finished && st.ranges_done == 0, "{st:?}");
    assert!(st.rows_decoded_on_demand > 0, "{st:?}");
    node.set_rebuild_share(ftrec_ps::ec::FULL_SHARE_PPM);
    c.wait_rebuilt(2).await;
    assert_eq!(node.rebuild_status().unwrap().ranges_done, 4);
    assert_whole(&c, &reference).await;
}

// ---- asynchronous training: losses during a worker's transaction (ECRec §3.5) ----

/// `update` as transaction `txn` over `clients`, with `victim` killed when `phase` is
/// reached.
async fn txn_with_kill(
    c: &EcCluster,
    priority: u64,
    update: &ftrec_ps::Update,
    victim: u32,
    phase: ftrec_ps::ec::TxnPhase,
) -> Result<ftrec_ps::ec::TxnReport, PsError> {
    let clients = c.clients();
    let node = c.node(victim).clone();
    let mut seq = ftrec_ps::ec::TxnCursor::at(priority * 1000);
    ftrec_ps::ec::run_txn(
        &clients,
        ec_common::txn_id(0, seq.seq, priority),
        &ec_common::shares(update, c.n),
        true,
        &mut seq,
        &[
            ftrec_ps::ec::TxnPhase::PrepareSome,
            ftrec_ps::ec::TxnPhase::CommitSome,
        ],
        move |p| {
            if p == phase {
                node.kill();
            }
            async {}
        },
    )
    .await
}

/// Four nodes (k = 2, r = 1, Adam) after three transactions of worker 0, and the reference
/// that applied them.
async fn three_transactions() -> (EcCluster, ec_common::PushReference) {
    let c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut reference = ec_common::PushReference::new(4, OptimizerKind::Adam);
    for i in 1..=3 {
        let u = ec_common::worker_update(i, 0);
        c.txn(0, i, &u).await.unwrap();
        reference.push(&u);
    }
    (c, reference)
}

#[tokio::test]
async fn a_loss_in_phase_one_of_a_transaction_aborts_it_and_the_retry_reaches_the_replacement() {
    let (mut c, mut reference) = three_transactions().await;
    let u = ec_common::worker_update(4, 1);
    let e = txn_with_kill(&c, 4, &u, 2, ftrec_ps::ec::TxnPhase::Prepare)
        .await
        .unwrap_err();
    assert!(matches!(e, PsError::Unavailable { .. }), "{e}");
    c.kill(2);
    // Nothing of the update stayed anywhere: the survivors hold no transaction, and the
    // replacement rebuilds the model without it.
    let node = c.replace(2, &[2]);
    node.start_rebuild(&lost(&[2]), false).await.unwrap();
    assert_eq!(c.digest(), reference.digest());
    // The worker retries the update against the replacement.
    c.txn(1, 4, &u).await.unwrap();
    reference.push(&u);
    assert_eq!(c.digest(), reference.digest());
    let audit = c.audit().await;
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
}

#[tokio::test]
async fn a_loss_in_phase_two_of_a_transaction_is_committed_by_the_survivors() {
    let mut c = EcCluster::new(
        5,
        EcConfig::new(CodeKind::Gf256, 3, 2),
        OptimizerKind::Adagrad,
    );
    let mut reference = ec_common::PushReference::new(5, OptimizerKind::Adagrad);
    for i in 1..=3 {
        let u = ec_common::worker_update(i, 1);
        c.txn(1, i, &u).await.unwrap();
        reference.push(&u);
    }
    let u = ec_common::worker_update(4, 0);
    let r = txn_with_kill(&c, 4, &u, 3, ftrec_ps::ec::TxnPhase::Commit)
        .await
        .unwrap();
    assert_eq!(r.commit_failures.len(), 1, "{r:?}");
    assert_eq!(r.commit_failures[0].0, ServerId(3));
    reference.push(&u);
    c.kill(3);
    let node = c.replace(3, &[3]);
    node.start_rebuild(&lost(&[3]), false).await.unwrap();
    // The parities held the lost node's committed update.
    assert_eq!(c.digest(), reference.digest());
    let u = ec_common::worker_update(5, 1);
    c.txn(1, 5, &u).await.unwrap();
    reference.push(&u);
    assert_eq!(c.digest(), reference.digest());
    let audit = c.audit().await;
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
}

#[tokio::test]
async fn a_lost_worker_s_transactions_are_fenced_and_resolved() {
    for committed_somewhere in [false, true] {
        let c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
        let mut reference = ec_common::PushReference::new(4, OptimizerKind::Adam);
        let u = ec_common::worker_update(1, 0);
        c.txn(0, 1, &u).await.unwrap();
        reference.push(&u);
        // Worker 1 prepares its update everywhere, commits on node 0 at most, and dies.
        let t = ec_common::txn_id(1, 7, 2);
        let v = ec_common::worker_update(2, 1);
        let sh = ec_common::shares(&v, 4);
        for s in 0..4u32 {
            c.node(s)
                .txn_prepare(t, sh[s as usize].clone(), ftrec_ps::ec::Admission::WaitDie)
                .await
                .unwrap();
        }
        if committed_somewhere {
            c.node(0).txn_commit(t).unwrap();
            reference.push(&v);
        }
        // The resolution: fence, read, decide, apply.
        let mut commit = false;
        for s in 0..4u32 {
            let st = c.node(s).txn_fence(1, t.epoch).unwrap();
            commit |= st.last_commit == Some(t);
            assert!(st.holding == Some(t) || st.last_commit == Some(t), "{st:?}");
        }
        assert_eq!(commit, committed_somewhere);
        for s in 0..4u32 {
            c.node(s).txn_resolve(t, commit).unwrap();
        }
        // A late message of the lost worker is refused; the others train on.
        assert!(matches!(
            c.node(2).txn_commit(t),
            Err(PsError::Refused { .. })
        ));
        let w = ec_common::worker_update(3, 0);
        c.txn(0, 3, &w).await.unwrap();
        reference.push(&w);
        assert_eq!(
            c.digest(),
            reference.digest(),
            "committed {committed_somewhere}"
        );
        let audit = c.audit().await;
        assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
    }
}

#[test]
fn a_replacement_rebuilds_while_workers_push_transactions() {
    // Asynchronous training goes on during the background rebuild; transactions commit
    // inside the first batch's lock; at the end the parities match the rows (including the
    // rebuilt ones) and every node committed every transaction.
    let rt = ec_common::two_thread_runtime();
    rt.block_on(async {
        let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
        ec.lock_ranges = 5;
        let mut c = EcCluster::new(5, ec, OptimizerKind::Momentum);
        for i in 1..=4 {
            c.txn(0, i, &ec_common::worker_update(i, 0)).await.unwrap();
        }
        c.kill(1);
        let node = c.replace(1, &[1]);
        let hold = HoldFirstBatch::install(&node);
        node.start_rebuild(&lost(&[1]), true).await.unwrap();
        hold.held.notified().await;
        let mut batch = 5;
        let mut round = |c: &EcCluster| {
            let mut set = tokio::task::JoinSet::new();
            for w in 0..2u32 {
                let clients = c.clients();
                let b = batch + u64::from(w);
                set.spawn(async move {
                    let u = ec_common::worker_update(b, w);
                    let mut seq = ftrec_ps::ec::TxnCursor::at(b * 100);
                    ftrec_ps::ec::run_txn(
                        &clients,
                        ec_common::txn_id(w, seq.seq, b),
                        &ec_common::shares(&u, 5),
                        true,
                        &mut seq,
                        &[],
                        |_| async {},
                    )
                    .await
                    .unwrap()
                });
            }
            batch += 2;
            set
        };
        let mut set = round(&c);
        while let Some(r) = set.join_next().await {
            assert!(r.unwrap().commit_failures.is_empty());
        }
        hold.go.notify_one();
        for _ in 0..6 {
            let mut set = round(&c);
            while let Some(r) = set.join_next().await {
                assert!(r.unwrap().commit_failures.is_empty());
            }
        }
        c.wait_rebuilt(1).await;
        let st = node.rebuild_status().unwrap();
        assert!(st.commits_in_lock >= 2, "{st:?}");
        let audit = c.audit().await;
        assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
        for s in 0..5 {
            assert_eq!(c.node(s).committed_step().unwrap(), Some(4 + 14));
        }
    });
}

#[tokio::test]
async fn a_loss_while_a_phase_reached_some_nodes_only_keeps_the_model_exact() {
    // Phase 1 or phase 2 was answered by the first half of the nodes (0 and 1) and not yet
    // sent to the others when `victim` died. Phase 1: the transaction aborts (and is retried
    // against the replacement) or, when no later prepare needed the victim, commits on the
    // survivors with the victim's share held by its parity and replica holders. Phase 2: the
    // survivors commit. Either way the rebuilt model is the reference that applied the
    // update exactly once.
    use ftrec_ps::ec::TxnPhase;
    for (phase, victim) in [
        (TxnPhase::PrepareSome, 0),
        (TxnPhase::PrepareSome, 3),
        (TxnPhase::CommitSome, 1),
        (TxnPhase::CommitSome, 2),
    ] {
        let case = format!("{phase:?}, node {victim} lost");
        let (mut c, mut reference) = three_transactions().await;
        let u = ec_common::worker_update(4, 1);
        let applied = match txn_with_kill(&c, 4, &u, victim, phase).await {
            Ok(r) => {
                // Committed by the survivors: the victim is the only node phase 2 missed
                // (a victim in the first half of phase 2 had committed before it died).
                let missed: Vec<u32> = r.commit_failures.iter().map(|(s, _)| s.0).collect();
                let expect = if phase == TxnPhase::CommitSome && victim < 2 {
                    vec![]
                } else {
                    vec![victim]
                };
                assert_eq!(missed, expect, "{case}");
                true
            }
            Err(e) => {
                assert_eq!(phase, TxnPhase::PrepareSome, "{case}: {e}");
                false
            }
        };
        if applied {
            reference.push(&u);
        }
        c.kill(victim);
        let node = c.replace(victim, &[victim]);
        node.start_rebuild(&lost(&[victim]), false).await.unwrap();
        assert_eq!(c.digest(), reference.digest(), "{case}");
        if !applied {
            c.txn(1, 4, &u).await.unwrap();
            reference.push(&u);
        }
        let w = ec_common::worker_update(5, 0);
        c.txn(0, 5, &w).await.unwrap();
        reference.push(&w);
        assert_eq!(c.digest(), reference.digest(), "{case}");
        c.assert_exact(None, &case).await;
    }
}

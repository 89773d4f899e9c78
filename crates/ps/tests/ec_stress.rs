//! ECRec §3.5 under load: many workers run transactions at once, on rows they share (a few
//! hot rows every worker updates) and on rows of their own, across server losses, background
//! rebuilds and workers that give up on a transaction half way. Every round ends with the
//! exact parity and replica audit and with every update committed exactly once on every node.

mod ec_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ec_common::{run_txn_until, shares, txn_id, EcCluster, DIM, TABLE_ROWS};
use ftrec_core::rng::SplitMix;
use ftrec_core::{OptimizerKind, ServerId, TableId};
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{resolve_txn, run_txn, EcClient, EcConfig, TxnCursor, TxnPhase};
use ftrec_ps::Update;

const N: u32 = 5;
const WORKERS: u32 = 8;
const TXNS_PER_ROUND: u64 = 5;

/// Worker `w`'s update `i`: the hot rows of tables 1 and 2 (every worker's), rows of table 3
/// that only `w` touches, and the whole dense vector.
fn update(w: u32, i: u64) -> Update {
    let mut g = SplitMix::keyed(99, i, u64::from(w));
    let mut u = Update::new();
    let own = |k: u64| (u64::from(w) * 7 + k) % TABLE_ROWS[3];
    for (t, ids) in [
        (1, vec![g.next_u64() % TABLE_ROWS[1], 0]),
        (2, vec![g.next_u64() % TABLE_ROWS[2]]),
        (3, vec![own(g.next_u64() % 7), own(3)]),
    ] {
        let grads = (0..ids.len() * DIM).map(|_| g.next_f32() - 0.5).collect();
        u = u.with_sparse(TableId(t), ids, grads);
    }
    u.with_dense(
        0,
        (0..ec_common::DENSE_LEN)
            .map(|_| (g.next_f32() - 0.5) * 0.1)
            .collect(),
    )
}

/// How a worker's transaction ends in a round.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Runs through.
    Whole,
    /// Every third transaction is dropped at `phase` (its batch timed out) and resolved by
    /// the worker before it goes on; one that aborted is run again.
    GiveUpAt(TxnPhase),
}

/// One round: every worker runs [`TXNS_PER_ROUND`] transactions at once with the others.
/// Returns the transactions committed.
async fn round(c: &EcCluster, r: u64, mode: Mode) -> u64 {
    let committed = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let clients = c.clients();
        let committed = committed.clone();
        set.spawn(async move {
            let mut seq = TxnCursor::at((r * 100 + u64::from(w)) * 1000);
            for i in 0..TXNS_PER_ROUND {
                let index = r * 1000 + i * u64::from(WORKERS) + u64::from(w);
                let u = update(w, index);
                let sh = shares(&u, N);
                let mut give_up = match mode {
                    Mode::GiveUpAt(p) if i % 3 == 1 => Some(p),
                    _ => None,
                };
                loop {
                    seq.seq += 1;
                    let t = txn_id(w, seq.seq, index);
                    // Given up once at most: an aborted batch is trained again through.
                    let Some(stop_at) = give_up.take() else {
                        let rep = run_txn(&clients, t, &sh, true, &mut seq, &[], |_| async {})
                            .await
                            .unwrap();
                        assert!(rep.commit_failures.is_empty(), "{rep:?}");
                        // A refused attempt is retried queued, never refused for age again.
                        assert!(rep.retries == 0 || rep.queued, "{rep:?}");
                        committed.fetch_add(1, Ordering::SeqCst);
                        break;
                    };
                    // The batch times out at `stop_at`: the transaction is dropped there.
                    let split = [TxnPhase::PrepareSome, TxnPhase::CommitSome];
                    let finished = run_txn_until(&clients, t, &sh, &split, stop_at, &mut seq).await;
                    // The attempt that was dropped (wait-die retries may have moved it on).
                    let t = ftrec_ps::ec::TxnId { seq: seq.seq, ..t };
                    if let Some(r) = finished {
                        // A wait-die retry limit or similar: not expected here.
                        let rep = r.unwrap();
                        assert!(rep.commit_failures.is_empty());
                        committed.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    let all: Vec<Option<EcClient>> = clients.iter().cloned().map(Some).collect();
                    let res = resolve_txn(&all, t).await.unwrap();
                    assert!(res.silent.is_empty());
                    if res.committed {
                        committed.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    // Aborted: the batch is trained again, this time through.
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    committed.load(Ordering::SeqCst)
}

/// Every transaction passes every node: each node committed each exactly once.
async fn assert_round_exact(c: &EcCluster, total: u64, what: &str) {
    c.assert_exact(Some(total), what).await;
}

#[test]
fn many_workers_on_shared_and_own_rows_through_losses_and_half_done_transactions() {
    let rt = ec_common::two_thread_runtime();
    rt.block_on(async {
        let mut ec = EcConfig::new(CodeKind::Gf256, 3, 2);
        ec.lock_ranges = 3;
        let mut c = EcCluster::new(N, ec, OptimizerKind::Adagrad);
        let mut total = 0;

        total += round(&c, 1, Mode::Whole).await;
        assert_eq!(total, u64::from(WORKERS) * TXNS_PER_ROUND);
        assert_round_exact(&c, total, "round 1: concurrent workers").await;

        // A server lost between rounds; its replacement rebuilds in the background while
        // the next round runs.
        c.kill(2);
        let node = c.replace(2, &[2]);
        node.start_rebuild(&[ServerId(2)], true).await.unwrap();
        total += round(&c, 2, Mode::Whole).await;
        c.wait_rebuilt(2).await;
        assert_round_exact(&c, total, "round 2: a rebuild under way").await;

        // Workers give up on transactions half way through each phase.
        for (r, p) in [
            (3, TxnPhase::PrepareSome),
            (4, TxnPhase::Commit),
            (5, TxnPhase::CommitSome),
        ] {
            total += round(&c, r, Mode::GiveUpAt(p)).await;
            assert_round_exact(&c, total, &format!("round {r}: given up at {p:?}")).await;
        }
        assert_eq!(total, 5 * u64::from(WORKERS) * TXNS_PER_ROUND);

        // Two servers lost at once (r = 2), rebuilt while workers give up on transactions;
        // the nodes' leases clean up anything left behind.
        c.kill(0);
        c.kill(4);
        let a = c.replace(0, &[0, 4]);
        let b = c.replace(4, &[0, 4]);
        a.start_rebuild(&[ServerId(0), ServerId(4)], true)
            .await
            .unwrap();
        b.start_rebuild(&[ServerId(0), ServerId(4)], true)
            .await
            .unwrap();
        total += round(&c, 6, Mode::GiveUpAt(TxnPhase::PrepareSome)).await;
        c.wait_rebuilt(0).await;
        c.wait_rebuilt(4).await;
        for s in 0..N {
            assert!(c
                .node(s)
                .resolve_expired(Duration::ZERO)
                .await
                .unwrap()
                .is_empty());
        }
        assert_round_exact(&c, total, "round 6: two servers rebuilt").await;
    });
}

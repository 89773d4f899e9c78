//! ECRec §3.2–3.3: parities stay exact under difference propagation with stateful
//! optimizers, dense replicas stay equal to their primaries, and coding never changes the
//! model itself.

mod ec_common;

use ec_common::{config, dense_init, EcCluster, Reference};
use ftrec_core::OptimizerKind;
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{EcConfig, EcNode};
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

//! The correctness oracle's base: a single-process run is a pure function of its configuration
//! and seed, so its `model_digest` repeats exactly and changes with the seed.

use ftrec_worker::{train, DataSpec, TrainConfig};

fn tiny(seed: u64) -> TrainConfig {
    let mut cfg = TrainConfig::from_preset("tiny", DataSpec::Synthetic).unwrap();
    cfg.steps = 30;
    cfg.batch = 64;
    cfg.eval_samples = 512;
    cfg.seed = seed;
    cfg.deterministic = true;
    cfg
}

#[test]
fn same_seed_gives_the_same_digest_twice() {
    let a = train(&tiny(5), &mut |_| {}).unwrap();
    let b = train(&tiny(5), &mut |_| {}).unwrap();
    assert_eq!(a.model_digest, b.model_digest);
    assert_eq!(a.auc.to_bits(), b.auc.to_bits());
    assert_eq!(a.position, b.position);
}

#[test]
fn another_seed_gives_another_digest() {
    let a = train(&tiny(5), &mut |_| {}).unwrap();
    let b = train(&tiny(6), &mut |_| {}).unwrap();
    assert_ne!(a.model_digest, b.model_digest);
}

#[test]
fn digest_does_not_depend_on_the_thread_count() {
    let mut one = tiny(9);
    one.threads = 1;
    let mut two = tiny(9);
    two.threads = 2;
    let a = train(&one, &mut |_| {}).unwrap();
    let b = train(&two, &mut |_| {}).unwrap();
    assert_eq!(a.model_digest, b.model_digest);
}

#[test]
fn every_optimizer_trains_and_changes_the_digest() {
    use ftrec_core::{Optimizer, OptimizerKind};
    let mut digests = std::collections::BTreeSet::new();
    for kind in OptimizerKind::ALL {
        let mut cfg = tiny(3);
        cfg.steps = 10;
        cfg.sparse_optimizer = Optimizer::new(kind, 0.05);
        let r = train(&cfg, &mut |_| {}).unwrap();
        assert!(r.train_loss.is_finite(), "{kind}: loss {}", r.train_loss);
        assert!(
            digests.insert(r.model_digest),
            "{kind} gave the digest of another optimizer"
        );
    }
}

#[test]
fn training_beats_chance_on_the_planted_teacher() {
    let mut cfg = tiny(11);
    cfg.steps = 200;
    cfg.batch = 128;
    cfg.eval_samples = 4096;
    let r = train(&cfg, &mut |_| {}).unwrap();
    let teacher = r
        .teacher_auc
        .expect("synthetic data reports the teacher's AUC");
    assert!(r.auc > 0.6, "auc {}", r.auc);
    assert!(
        r.auc <= teacher + 0.02,
        "auc {} above the teacher's {teacher}",
        r.auc
    );
}

#[test]
fn bad_configuration_is_an_error_not_a_panic() {
    let mut cfg = tiny(1);
    cfg.steps = 0;
    assert!(matches!(
        train(&cfg, &mut |_| {}),
        Err(ftrec_worker::WorkerError::Config(_))
    ));
    let mut cfg = tiny(1);
    cfg.sparse_optimizer.lr = -1.0;
    assert!(train(&cfg, &mut |_| {}).is_err());
}

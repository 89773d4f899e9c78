//! `LocalTrainer::from_state`: a trainer over a trained model's own parameters evaluates and
//! digests exactly as the trained one; parameters of another shape are refused, named.

use ftrec_core::{EmbeddingTable, Optimizer, OptimizerKind, TableId};
use ftrec_worker::local::open_source;
use ftrec_worker::{DataSpec, LocalTrainer, TrainConfig};

fn tiny() -> TrainConfig {
    let mut cfg = TrainConfig::from_preset("tiny", DataSpec::Synthetic).unwrap();
    cfg.batch = 64;
    cfg.eval_samples = 512;
    cfg.seed = 4;
    cfg.threads = 1;
    cfg
}

#[test]
fn a_trainer_over_trained_parameters_evaluates_as_the_trained_one() {
    let cfg = tiny();
    let mut src = open_source(&cfg).unwrap();
    let eval = src.eval_set(cfg.eval_samples, cfg.batch).unwrap();
    let mut trained = LocalTrainer::new(&cfg).unwrap();
    for _ in 0..5 {
        let b = src.next_batch(cfg.batch).unwrap().unwrap();
        trained.step(&b).unwrap();
    }
    let mut copy = LocalTrainer::from_state(
        &cfg,
        trained.tables().to_vec(),
        trained.model().params().clone(),
        5,
    )
    .unwrap();
    assert_eq!(copy.step_count(), 5);
    assert_eq!(copy.digest(), trained.digest());
    let (a, b) = (
        trained.evaluate(&eval).unwrap(),
        copy.evaluate(&eval).unwrap(),
    );
    assert_eq!(a.auc.to_bits(), b.auc.to_bits());
    assert_eq!(a.logloss.to_bits(), b.logloss.to_bits());
}

#[test]
fn parameters_of_another_shape_are_refused() {
    let cfg = tiny();
    let t = LocalTrainer::new(&cfg).unwrap();
    let dense = t.model().params().clone();
    // One table short.
    let mut tables = t.tables().to_vec();
    tables.pop();
    let e = LocalTrainer::from_state(&cfg, tables, dense.clone(), 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("25 tables"), "{e}");
    // A table of another row layout (Adam's state on the rows).
    let mut tables = t.tables().to_vec();
    let adam = Optimizer::new(OptimizerKind::Adam, 0.01);
    tables[3] = EmbeddingTable::zeros(
        TableId(3),
        tables[3].rows(),
        ftrec_core::RowLayout::new(8, adam.state_words(8)),
    );
    let e = LocalTrainer::from_state(&cfg, tables, dense.clone(), 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("table 3"), "{e}");
    // Dense state of another optimizer.
    let mut other = cfg.clone();
    other.dense_optimizer = Optimizer::new(OptimizerKind::Sgd, 0.1);
    let e = LocalTrainer::from_state(&other, t.tables().to_vec(), dense, 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("dense optimizer state"), "{e}");
}

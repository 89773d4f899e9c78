//! A run whose held-out set cannot give an AUC fails before it trains, naming what to change.

use std::path::Path;

use ftrec_data::{DataPath, Layout, RawSample, TsvConfig};
use ftrec_worker::{train, DataSpec, TrainConfig, WorkerError};

/// `lines` Kaggle-layout lines, labels from `label(i)`.
fn write(path: &Path, lines: usize, label: impl Fn(usize) -> bool) {
    let mut text = Vec::new();
    for i in 0..lines {
        RawSample {
            label: label(i),
            dense: std::array::from_fn(|j| Some(((i + j) % 7) as i64)),
            cats: std::array::from_fn(|j| Some(((i * 31 + j) % 5) as u32)),
        }
        .write_tsv_line(&mut text);
    }
    std::fs::write(path, text).unwrap();
}

fn config(path: &Path) -> TrainConfig {
    let mut tsv =
        TsvConfig::new(DataPath::File(path.to_path_buf()), Layout::Kaggle).with_rows_per_table(64);
    tsv.holdout_every = 8;
    let mut cfg = TrainConfig::from_preset("tiny", DataSpec::Tsv(tsv)).unwrap();
    cfg.steps = 5;
    cfg.batch = 16;
    cfg.eval_samples = 100;
    cfg.threads = 1;
    cfg
}

fn refusal(cfg: &TrainConfig) -> String {
    let mut steps = 0;
    match train(cfg, &mut |_| steps += 1) {
        Err(e @ WorkerError::NoEvalData(_)) => {
            assert_eq!(steps, 0, "it trained before refusing");
            e.to_string()
        }
        other => panic!("not refused for its held-out set: {other:?}"),
    }
}

#[test]
fn a_held_out_set_of_one_label_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one_label.tsv");
    // No click in the data, so none in its held-out lines either.
    write(&path, 400, |_| false);
    let e = refusal(&config(&path));
    assert!(
        e.contains("same label") && e.contains("--holdout-every"),
        "{e}"
    );
}

#[test]
fn data_without_held_out_lines_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.tsv");
    write(&path, 5, |i| i % 2 == 1);
    let e = refusal(&config(&path));
    assert!(e.contains("no held-out lines"), "{e}");
}

//! Cluster runs on Criteo TSV data (real processes, real SIGKILLs): the coordinator's batch
//! plan, batch starts sent to the workers, data positions in the manifests, recoveries that
//! continue the data where the checkpoint left it, a last step with fewer batches than workers,
//! and the held-out lines as the evaluation set.
//!
//! The data is the synthetic generator's stream written as Kaggle-layout TSV, so that the
//! planted teacher gives AUC a meaning.

mod common;

use std::path::{Path, PathBuf};

use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{Checkpoints, DataPosition};
use ftrec_cluster::{run, KillSpec, RunConfig, RunReport, StrategyChoice};
use ftrec_core::Preset;
use ftrec_data::{DataPath, Layout, Position, TsvConfig};

/// Rows of the tiny preset's tables: the TSV data's tables are capped to them.
const ROWS: u64 = 400;

/// `lines` samples of the tiny preset's stream as `dir/train.tsv`.
fn write_data(dir: &Path, lines: u64) -> PathBuf {
    ftrec_data::synth_to_dir(&Preset::tiny(), 5, lines, dir).unwrap()
}

fn tsv(path: &Path, epochs: Option<u64>) -> TsvConfig {
    let mut c = TsvConfig::new(DataPath::File(path.to_path_buf()), Layout::Kaggle)
        .with_rows_per_table(ROWS);
    c.holdout_every = 8;
    c.epochs = epochs;
    c
}

fn config(dir: &Path, data: TsvConfig, workers: u32, steps: u64) -> RunConfig {
    common::tiny_run(dir, 2, workers, steps, 11).with_data(data)
}

fn ok(r: Result<RunReport, ftrec_cluster::ClusterError>) -> RunReport {
    let r = r.unwrap();
    assert!(r.aborted.is_none(), "{:?}", r.aborted);
    assert_eq!(r.model_digest.len(), 32);
    r
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The manifest of the store's newest committed checkpoint.
fn head_manifest(cfg: &RunConfig) -> ftrec_ckpt::Manifest {
    block_on(async {
        let c = Checkpoints::new(
            location::open(&cfg.store_location(), &LocationOptions::from_env())
                .await
                .unwrap(),
        );
        let l = ftrec_ckpt::deck::Lineage::load(&c).await.unwrap();
        c.read_manifest(&l.head().unwrap(), None).await.unwrap()
    })
}

/// 2 epochs of 1,000 lines less every 8th: 1,750 samples, 28 batches of 64 (the last one of
/// 22), 14 steps of 2 workers; with 3 workers 10 steps, the last one a single batch.
const LINES: u64 = 1000;

#[test]
fn sync_full_and_deck_runs_on_tsv_with_a_server_killed_end_with_the_failure_free_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(&dir.path().join("data"), LINES);
    for (workers, strategy, kill_step) in [
        (2, StrategyChoice::Full { every_steps: 4 }, 6),
        (
            3,
            StrategyChoice::Deck {
                delta_every_steps: 3,
                full_every_deltas: None,
                merge_stride: Some(2),
                merge_mib_per_s: None,
            },
            8,
        ),
    ] {
        let name = strategy.name();
        // More steps than the data holds: the run ends with the data (2 epochs).
        let clean_dir = tempfile::tempdir().unwrap();
        let mut clean = config(clean_dir.path(), tsv(&path, Some(2)), workers, 1000);
        clean.strategy = strategy;
        let clean = ok(run(&clean));
        assert!(clean.failures.is_empty());
        assert_eq!(clean.samples, 1750, "{name}");
        assert_eq!(clean.steps, 28u64.div_ceil(workers as u64), "{name}");
        let data = clean.data.clone().unwrap();
        assert!(
            data.ended && data.batches == 28 && data.samples == 1750,
            "{data:?}"
        );

        let run_dir = tempfile::tempdir().unwrap();
        let mut cfg = config(run_dir.path(), tsv(&path, Some(2)), workers, 1000);
        cfg.strategy = strategy;
        cfg.kills = vec![KillSpec::server_at_step(1, kill_step)];
        let report = ok(run(&cfg));
        assert_eq!(report.failures.len(), 1, "{name}");
        assert!(
            report.failures[0].steps_redone > 0,
            "{name}: nothing was rewound"
        );
        assert!(report.samples_redone > 0, "{name}");
        // Rewound to a checkpoint, the plan went on from its batch count: the same samples in
        // the same order, so the same model bit for bit.
        assert_eq!(report.samples, 1750, "{name}");
        assert_eq!(report.model_digest, clean.model_digest, "{name}");

        // The final save records where the data ended: the end of the file, second epoch.
        let m = head_manifest(&cfg);
        let DataPosition::Json(v) = &m.data_position else {
            panic!("{name}: {:?}", m.data_position)
        };
        assert_eq!(v["batches"], 28, "{name}: {v}");
        assert_eq!(v["samples"], 1750, "{name}: {v}");
        let pos: Position = serde_json::from_value(v["position"].clone()).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            pos,
            Position::Tsv {
                file: 0,
                file_name: "train.tsv".into(),
                offset: len,
                line: LINES,
                epoch: 1,
            },
            "{name}"
        );
    }
}

#[test]
fn one_worker_on_tsv_equals_the_single_process_trainer_and_saves_tsv_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(&dir.path().join("data"), LINES);
    let data = tsv(&path, None);
    let run_dir = tempfile::tempdir().unwrap();
    // 20 steps of 64 out of 875 samples an epoch: the stream wraps into a second epoch.
    let mut cfg = config(run_dir.path(), data.clone(), 1, 20);
    cfg.eval_samples = 100;
    cfg.strategy = StrategyChoice::Full { every_steps: 7 };
    let report = ok(run(&cfg));

    let mut local =
        ftrec_worker::TrainConfig::from_preset("tiny", ftrec_worker::DataSpec::Tsv(data)).unwrap();
    local.steps = 20;
    local.batch = 64;
    local.seed = 11;
    local.threads = 1;
    local.eval_samples = 100;
    let single = ftrec_worker::train(&local, &mut |_| {}).unwrap();
    assert_eq!(report.model_digest, single.model_digest);
    // Same model, same held-out lines: same metrics.
    assert_eq!(report.auc, Some(single.auc));
    assert_eq!(report.samples, single.samples);
    assert_eq!(report.data.as_ref().unwrap().position, single.position);
    assert!(!report.data.as_ref().unwrap().ended);

    // The final checkpoint carries the TSV position after 20 batches: the trainer's.
    let m = head_manifest(&cfg);
    let DataPosition::Json(v) = &m.data_position else {
        panic!("{:?}", m.data_position)
    };
    assert_eq!(v["batches"], 20, "{v}");
    assert_eq!(v["samples"], 20 * 64, "{v}");
    let pos: Position = serde_json::from_value(v["position"].clone()).unwrap();
    assert_eq!(pos, single.position);
    assert!(matches!(pos, Position::Tsv { epoch: 1, .. }), "{pos:?}");
}

#[test]
fn an_async_run_on_tsv_evaluates_on_the_held_out_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(&dir.path().join("data"), 4000);
    let run_dir = tempfile::tempdir().unwrap();
    let mut cfg = config(run_dir.path(), tsv(&path, Some(3)), 2, 1000);
    cfg.sync = false;
    cfg.eval_samples = 500;
    let report = ok(run(&cfg));
    // 3 epochs of 3,500 training lines, wherever the batches landed.
    assert_eq!(report.samples, 10_500);
    assert!(report.data.unwrap().ended);
    // 500 held-out lines (every 8th of 4,000).
    assert_eq!(report.eval_samples, 500);
    let (auc, logloss) = (report.auc.unwrap(), report.logloss.unwrap());
    assert!(auc > 0.0 && auc < 1.0, "auc {auc}");
    assert!(logloss.is_finite() && logloss > 0.0, "logloss {logloss}");
}

#[test]
fn a_malformed_line_stops_the_run_naming_file_and_line_and_skip_mode_trains_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(&dir.path().join("data"), 300);
    let text = std::fs::read_to_string(&path).unwrap();
    // Replace line 150 with garbage.
    let mut lines: Vec<&str> = text.lines().collect();
    lines[149] = "1\tnot-a-number";
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    for sync in [true, false] {
        let run_dir = tempfile::tempdir().unwrap();
        let mut cfg = config(run_dir.path(), tsv(&path, Some(1)), 2, 100);
        cfg.sync = sync;
        let e = run(&cfg).unwrap_err().to_string();
        assert!(e.contains("train.tsv") && e.contains("150"), "{e}");
    }
    let run_dir = tempfile::tempdir().unwrap();
    let mut data = tsv(&path, Some(1));
    data.skip_malformed = true;
    let report = ok(run(&config(run_dir.path(), data, 2, 100)));
    // 300 lines, 37 held out, one skipped.
    assert_eq!(report.samples, 262);
    assert_eq!(report.data.unwrap().malformed_skipped, 1);
}

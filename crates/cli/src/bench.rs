//! `ftrec bench`: benchmarks that report ratios measured within one run, because the machine is
//! shared and absolute times drift.

use anyhow::Result;
use ftrec_model::DlrmConfig;
use ftrec_worker::{DataSpec, TrainConfig};
use serde::Serialize;

use crate::flags::BenchCmd;

#[derive(Serialize)]
struct TrainBench {
    preset: String,
    mlp: ftrec_model::MlpBench,
    /// End-to-end trainer throughput on synthetic data (embedding pooling, MLP, sparse and dense
    /// updates, data generation on a prefetch thread).
    trainer_samples_per_s: f64,
    trainer_step_ms: f64,
    /// Share of the end-to-end step spent in the MLP forward+backward.
    mlp_share_of_step: f64,
    trainer: ftrec_worker::TrainReport,
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Train {
            preset,
            batch,
            threads,
            iters,
            steps,
            json,
        } => {
            let mut cfg = TrainConfig::from_preset(&preset, DataSpec::Synthetic)?;
            if let Some(b) = batch {
                cfg.batch = b;
            }
            if let Some(t) = threads {
                cfg.threads = t;
            }
            cfg.steps = steps;
            cfg.eval_samples = cfg.batch;
            cfg.validate()?;
            crate::set_threads(cfg.threads)?;

            let mlp = ftrec_model::bench_mlp(
                &DlrmConfig::from_preset(&cfg.preset),
                cfg.batch,
                cfg.threads,
                iters,
            )?;
            println!("{mlp}");
            let report = ftrec_worker::train(&cfg, &mut |_| {})?;
            let step_ms = report.train_s * 1e3 / report.steps as f64;
            let mlp_ms = report.timing.mlp_s * 1e3 / report.steps as f64;
            println!(
                "trainer ({}, batch {}, {} steps): {:.0} samples/s, {:.1} ms/step \
                 (pool {:.1}, mlp {:.1}, sparse update {:.1}, dense update {:.1}, data wait {:.1} ms/step)",
                cfg.preset.name,
                cfg.batch,
                report.steps,
                report.samples_per_s,
                step_ms,
                report.timing.pool_s * 1e3 / report.steps as f64,
                mlp_ms,
                report.timing.sparse_update_s * 1e3 / report.steps as f64,
                report.timing.dense_update_s * 1e3 / report.steps as f64,
                report.timing.data_wait_s * 1e3 / report.steps as f64,
            );
            let out = TrainBench {
                preset: cfg.preset.name.clone(),
                trainer_samples_per_s: report.samples_per_s,
                trainer_step_ms: step_ms,
                mlp_share_of_step: mlp_ms / step_ms,
                mlp,
                trainer: report,
            };
            if let Some(path) = json {
                crate::write_json(&path, &out)?;
            }
            Ok(())
        }
    }
}

//! `ftrec bench`: benchmarks that report ratios measured within one run, because the machine is
//! shared and absolute times drift.

use anyhow::Result;
use ftrec_model::DlrmConfig;
use ftrec_worker::{DataSpec, TrainConfig};
use serde::Serialize;

use crate::flags::{BenchCmd, RunArgs};
use crate::progress::Runs;

/// One cluster run of a benchmark: `a` in a work directory of its own under `bench`'s
/// (removed after), `adjust` applied to the validated configuration, the run's summary on
/// stdout and its progress line on stderr. A run the strategy aborted is an error.
pub(crate) fn bench_run(
    name: &str,
    mut a: RunArgs,
    adjust: impl FnOnce(&mut ftrec_cluster::RunConfig),
    progress: &mut Runs,
) -> Result<ftrec_cluster::RunReport> {
    let work = std::env::temp_dir()
        .join(format!(
            "ftrec-{}-{}",
            progress.what().replace(' ', "-"),
            std::process::id()
        ))
        .join(name);
    a.work_dir = Some(work.clone());
    let mut cfg = crate::cluster_cmd::run_config(&a)?;
    adjust(&mut cfg);
    cfg.validate()?;
    eprintln!(
        "{name}: strategy {}, kills {:?}",
        cfg.strategy.name(),
        a.kill
    );
    let r = ftrec_cluster::run(&cfg);
    let _ = std::fs::remove_dir_all(&work);
    let r = r?;
    if let Some(reason) = &r.aborted {
        anyhow::bail!("{name}: {reason}");
    }
    println!("{name}: {}", r.summary());
    progress.report(name, &format!("{:.1} s training", r.train_s));
    Ok(r)
}

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

#[derive(Serialize)]
struct ClusterBench {
    single_process: ftrec_worker::TrainReport,
    none: ftrec_cluster::RunReport,
    full: ftrec_cluster::RunReport,
    full_killed: ftrec_cluster::RunReport,
    /// Cluster (`none`) samples/s over the single-process trainer's.
    throughput_ratio: f64,
    /// Cluster (`none`) AUC minus the single-process trainer's.
    auc_delta: Option<f64>,
    /// `full`'s training time over `none`'s, minus one.
    full_overhead: f64,
    pause_per_checkpoint_s: f64,
    detect_s: Option<f64>,
    replace_s: Option<f64>,
    reload_s: Option<f64>,
    redo_s: Option<f64>,
}

fn cluster_bench(
    run: &RunArgs,
    kill_server: u32,
    kill_step: Option<u64>,
    single_threads: usize,
) -> Result<ClusterBench> {
    use anyhow::bail;
    if run.strategy.is_some() || !run.kill.is_empty() {
        bail!("ftrec bench cluster chooses --strategy and --kill itself");
    }
    let mut base = crate::cluster_cmd::merge(run)?;
    if !base.data.data.is_empty() {
        bail!("ftrec bench cluster compares with the single-process trainer on synthetic data; --data applies to train, run and coordinator");
    }
    base.strategy = Some("none".into());
    let every = base.ckpt_every_steps.take().unwrap_or(0);
    let none_cfg = crate::cluster_cmd::run_config(&base)?;
    let every = if every == 0 {
        (none_cfg.steps / 4).max(1)
    } else {
        every
    };
    let steps = none_cfg.steps;
    let kill_step = kill_step.unwrap_or(((steps / 2) / every * every + every * 3 / 4).max(1));

    // The single-process trainer on the same samples: as many batches of the same size.
    let mut single = TrainConfig::from_preset(&none_cfg.preset.name, DataSpec::Synthetic)?;
    single.batch = none_cfg.batch;
    single.steps = steps * none_cfg.workers as u64;
    single.seed = none_cfg.seed;
    single.threads = single_threads;
    single.eval_samples = none_cfg.eval_samples;
    single.sparse_optimizer = none_cfg.sparse_optimizer;
    single.dense_optimizer = none_cfg.dense_optimizer;
    single.validate()?;
    eprintln!(
        "single process: {} steps x batch {}",
        single.steps, single.batch
    );
    crate::set_threads(single_threads)?;
    let single_report = ftrec_worker::train(&single, &mut |_| {})?;

    let mut progress = Runs::new("bench cluster", 3);
    let mut run_one = |name: &str, strategy: &str, kill: Option<String>| {
        let mut a = base.clone();
        a.strategy = Some(strategy.into());
        if strategy == "full" {
            a.ckpt_every_steps = Some(every);
        }
        a.kill = kill.into_iter().collect();
        bench_run(name, a, |_| {}, &mut progress)
    };
    let none = run_one("none", "none", None)?;
    let full = run_one("full", "full", None)?;
    let killed = run_one(
        "full_killed",
        "full",
        Some(format!("server={kill_server}@step={kill_step}")),
    )?;
    let f = killed.failures.first();
    Ok(ClusterBench {
        throughput_ratio: none.samples_per_s / single_report.samples_per_s,
        auc_delta: none.auc.map(|a| a - single_report.auc),
        full_overhead: full.train_s / none.train_s - 1.0,
        pause_per_checkpoint_s: full.checkpoint_pause_s / full.checkpoints.max(1) as f64,
        detect_s: f.and_then(|f| f.detect_s()),
        replace_s: f.and_then(|f| f.replace_s()),
        reload_s: f.and_then(|f| f.reload_s()),
        redo_s: f.and_then(|f| f.redo_s()),
        single_process: single_report,
        none,
        full,
        full_killed: killed,
    })
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Cpr(args) => crate::bench_cpr::run(args),
        BenchCmd::Incremental(args) => crate::bench_incr::run(args),
        BenchCmd::Metrics(args) => crate::bench_metrics::run(args),
        BenchCmd::Ecrec {
            run,
            kill_server,
            kill_step,
            recovery_steps,
            repeat,
            rebuild_shares,
            recovery_repeats,
            no_full,
            no_recovery,
        } => crate::bench_ecrec::run(
            run.run,
            crate::bench_ecrec::Plan {
                kill_server,
                kill_step,
                recovery_steps,
                repeats: repeat,
                rebuild_shares,
                recovery_repeats,
                full: !no_full,
                recovery: !no_recovery,
                workers: run.workers,
            },
        ),
        BenchCmd::Cluster {
            run,
            kill_server,
            kill_step,
            single_threads,
        } => {
            let json = run.json.clone();
            let mut args = run;
            args.json = None;
            let b = cluster_bench(&args, kill_server, kill_step, single_threads)?;
            let secs = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}s"));
            println!(
                "single process: {:.0} samples/s, auc {:.4}\n\
                 cluster none:   {:.0} samples/s ({:.2} of single), auc {} (delta {})\n\
                 full checkpoints: {} in {:.2}s training vs {:.2}s without: overhead {:.1}%, \
                 {:.3}s pause per checkpoint\n\
                 recovery from a kill: detect {}, replace {}, reload {}, redo {}",
                b.single_process.samples_per_s,
                b.single_process.auc,
                b.none.samples_per_s,
                b.throughput_ratio,
                b.none.auc.map_or("-".into(), |a| format!("{a:.4}")),
                b.auc_delta.map_or("-".into(), |d| format!("{d:+.4}")),
                b.full.checkpoints,
                b.full.train_s,
                b.none.train_s,
                b.full_overhead * 100.0,
                b.pause_per_checkpoint_s,
                secs(b.detect_s),
                secs(b.replace_s),
                secs(b.reload_s),
                secs(b.redo_s),
            );
            if let Some(path) = json {
                crate::write_json(&path, &b)?;
            }
            Ok(())
        }
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
                 (pool {:.1}, mlp {:.1}, sparse update {:.1}, dense update {:.1}, data wait {:.1} ms/step; \
                 the data thread's CPU {:.1} ms/batch)",
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
                report.timing.data_cpu_s * 1e3 / report.steps as f64,
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

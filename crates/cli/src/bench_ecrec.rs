//! `ftrec bench ecrec`: ECRec's costs on one cluster configuration, measured in one
//! invocation (ecrec.txt §5): training time against no fault tolerance for `k` = 2 and 4 with
//! and without 2PC and dense replication, and the recovery from one SIGKILL against full
//! checkpoints' (time to resume, time to full recovery, throughput meanwhile).

use anyhow::{bail, Result};
use ftrec_cluster::{RunReport, StrategyChoice};
use serde::Serialize;

use crate::flags::RunArgs;

/// One ECRec variant against `none`.
#[derive(Serialize)]
struct Variant {
    name: String,
    k: usize,
    r: usize,
    two_phase: bool,
    dense_replication: bool,
    /// Training time over `none`'s, minus one.
    overhead: f64,
    /// Mean commit cost of a step (both phases) as the coordinator sees it.
    commit_per_step_s: f64,
    /// Cluster memory (model + parities + dense copies) over the model's, and `(k+r)/k`.
    memory_overhead: f64,
    code_overhead: f64,
    report: RunReport,
}

/// The recovery from one kill.
#[derive(Serialize)]
struct Recovery {
    strategy: String,
    kill: String,
    /// Seconds from the kill to training resumed, and to the state being whole again.
    resumed_s: Option<f64>,
    recovered_s: Option<f64>,
    /// Samples/s in the report's intervals that overlap [kill, recovered], over the mean of
    /// the intervals before the kill (`None` when no interval lies before it).
    recovery_throughput_share: Option<f64>,
    report: RunReport,
}

#[derive(Serialize)]
struct EcrecBench {
    none: RunReport,
    variants: Vec<Variant>,
    /// Variants not run because the cluster has fewer than k + r servers.
    skipped: Vec<String>,
    recoveries: Vec<Recovery>,
}

/// Throughput during `[from, to]` (seconds after the run started) over the throughput before
/// `from`, from the report's intervals (which count from the start of training: the workers
/// started event marks it).
fn recovery_share(r: &RunReport, from: f64, to: f64) -> Option<f64> {
    let t0 = r
        .events
        .iter()
        .find(|e| e.kind == ftrec_cluster::EventKind::WorkersStarted)
        .map_or(0.0, |e| e.t_s);
    let (from, to) = (from - t0, to - t0);
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let before = mean(
        r.throughput
            .iter()
            .filter(|i| i.t_end_s <= from)
            .map(|i| i.samples_per_s)
            .collect(),
    )?;
    let during = mean(
        r.throughput
            .iter()
            .filter(|i| i.t_end_s > from && i.t_start_s <= to)
            .map(|i| i.samples_per_s)
            .collect(),
    )?;
    Some(during / before.max(1e-9))
}

fn run_one(
    base: &RunArgs,
    name: &str,
    strategy: StrategyChoice,
    kill: Option<String>,
) -> Result<RunReport> {
    let mut a = base.clone();
    a.strategy = Some(strategy.name().into());
    a.kill = kill.into_iter().collect();
    let work = std::env::temp_dir().join(format!("ftrec-bench-ecrec-{}", std::process::id()));
    a.work_dir = Some(work.join(name));
    if let StrategyChoice::Full { every_steps } = strategy {
        a.ckpt_every_steps = Some(every_steps);
    }
    let mut cfg = crate::cluster_cmd::run_config(&a)?;
    cfg.strategy = strategy;
    cfg.validate()?;
    eprintln!("{name}: kills {:?}", a.kill);
    let r = ftrec_cluster::run(&cfg);
    let _ = std::fs::remove_dir_all(work.join(name));
    let r = r?;
    if let Some(reason) = &r.aborted {
        bail!("{name}: {reason}");
    }
    println!("{name}: {}", r.summary());
    Ok(r)
}

fn ecrec(k: usize, r: usize, two_phase: bool, dense_replication: bool) -> StrategyChoice {
    StrategyChoice::EcRec {
        k,
        r,
        // The exact code: the recovery run must give back the failure-free model.
        code: ftrec_cluster::CodeKind::Gf256,
        dense_replication,
        two_phase,
        lock_ranges: 4,
        rebuild_share_ppm: ftrec_cluster::ecrec::DEFAULT_REBUILD_SHARE_PPM,
    }
}

fn bench(run: &RunArgs, kill_server: u32, kill_step: Option<u64>) -> Result<EcrecBench> {
    if run.strategy.is_some() || !run.kill.is_empty() || run.ec.flags().any() {
        bail!("ftrec bench ecrec chooses --strategy, the ECRec flags and --kill itself");
    }
    let mut base = crate::cluster_cmd::merge(run)?;
    base.sync = true;
    base.strategy = Some("none".into());
    let none_cfg = crate::cluster_cmd::run_config(&base)?;
    let steps = none_cfg.steps;
    let servers = none_cfg.servers;
    let kill_step = kill_step.unwrap_or((steps / 2).max(1));
    let none = run_one(&base, "none", StrategyChoice::None, None)?;
    let mut variants = Vec::new();
    let mut skipped = Vec::new();
    for (k, two_phase, dense) in [
        (2, true, true),
        (2, false, true),
        (2, true, false),
        (4, true, true),
        (4, false, true),
    ] {
        let name = format!(
            "ecrec_k{k}{}{}",
            if two_phase { "" } else { "_no2pc" },
            if dense { "" } else { "_nodense" }
        );
        if k as u32 + 1 > servers {
            skipped.push(format!(
                "{name}: needs {} servers, the run has {servers}",
                k + 1
            ));
            continue;
        }
        let r = run_one(&base, &name, ecrec(k, 1, two_phase, dense), None)?;
        let ec = r.ec.clone().unwrap_or_default();
        variants.push(Variant {
            name,
            k,
            r: 1,
            two_phase,
            dense_replication: dense,
            overhead: r.train_s / none.train_s.max(1e-9) - 1.0,
            commit_per_step_s: ec.per_step_s,
            memory_overhead: ec.memory.overhead,
            code_overhead: ec.memory.code_overhead,
            report: r,
        });
    }
    let kill = format!("server={kill_server}@step={kill_step}");
    let mut recoveries = Vec::new();
    for (name, strategy) in [
        ("ecrec_k2_killed", ecrec(2, 1, true, true)),
        (
            "full_killed",
            StrategyChoice::Full {
                every_steps: (steps / 4).max(1),
            },
        ),
    ] {
        if let StrategyChoice::EcRec { k, r, .. } = strategy {
            if (k + r) as u32 > servers {
                skipped.push(format!("{name}: needs {} servers", k + r));
                continue;
            }
        }
        let r = run_one(&base, name, strategy, Some(kill.clone()))?;
        let f = r.failures.first();
        let share = f.and_then(|f| {
            let end = f.injected_t_s + f.recovered_s?;
            recovery_share(&r, f.injected_t_s, end)
        });
        recoveries.push(Recovery {
            strategy: strategy.name().into(),
            kill: kill.clone(),
            resumed_s: f.and_then(|f| f.resumed_s),
            recovered_s: f.and_then(|f| f.recovered_s),
            recovery_throughput_share: share,
            report: r,
        });
    }
    Ok(EcrecBench {
        none,
        variants,
        skipped,
        recoveries,
    })
}

pub fn run(run: RunArgs, kill_server: u32, kill_step: Option<u64>) -> Result<()> {
    let json = run.json.clone();
    let mut args = run;
    args.json = None;
    let b = bench(&args, kill_server, kill_step)?;
    println!(
        "none: {:.2}s training, {:.0} samples/s",
        b.none.train_s, b.none.samples_per_s
    );
    for v in &b.variants {
        println!(
            "{}: overhead {:+.1}%, {:.3} ms per step commit, memory x{:.3} (code (k+r)/k = {:.3})",
            v.name,
            v.overhead * 100.0,
            v.commit_per_step_s * 1e3,
            v.memory_overhead,
            v.code_overhead
        );
    }
    for s in &b.skipped {
        println!("skipped {s}");
    }
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}s"));
    for r in &b.recoveries {
        println!(
            "{} after {}: training resumed {}, fully recovered {} after the kill; throughput \
             meanwhile {} of before",
            r.strategy,
            r.kill,
            secs(r.resumed_s),
            secs(r.recovered_s),
            r.recovery_throughput_share
                .map_or("-".into(), |s| format!("{:.0}%", s * 100.0))
        );
    }
    if let Some(path) = json {
        crate::write_json(&path, &b)?;
    }
    Ok(())
}

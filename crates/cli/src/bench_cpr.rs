//! `ftrec bench cpr`: the experiment of cpr.txt §5.1/§6.1 in one invocation, asynchronous
//! training on one workload with one kill schedule for every strategy:
//! - a failure-free run (`none`): the reference AUC, the training time and the step rate;
//! - the kill schedule: failure times drawn as exponential gaps of mean `--mtbf-s` from
//!   `--kill-seed` (at most `--kills` of them inside the run), each hitting the next server in
//!   a seeded order (so consecutive kills hit different servers), turned into steps with the
//!   failure-free run's step rate so that every strategy loses a server at the same point of
//!   training;
//! - `cpr` (vanilla), `cpr` + MFU, + SSU and + SCAR: full saves every
//!   `2 * PLS * servers * MTBF` (Eq. 4; `--target-pls`, default the paper's 0.1), prioritized
//!   saves in between, partial recovery;
//! - `full` with Young's interval `sqrt(2 O_save MTBF)` (CPR §2.2), `O_save` measured as the
//!   vanilla run's mean save pause, converted to steps with the step rate, full recovery.
//!
//! For each: CPR Eq. 1/2's terms as measured (save pauses, loading, lost computation redone,
//! rescheduling), PLS (Eq. 3), final AUC and logloss on the held-out split, and the AUC delta
//! against the failure-free run. At the top: `overhead_reduction_vs_full` (1 - the best `cpr`
//! variant's overhead / `full`'s) and `auc_delta_vs_full` (that variant's AUC - `full`'s).

use anyhow::{bail, Result};
use ftrec_cluster::RunReport;
use ftrec_core::rng::SplitMix;
use serde::Serialize;

use crate::flags::RunArgs;

/// The paper's target PLS for every CPR variant (CPR §6.1).
const DEFAULT_TARGET_PLS: f64 = 0.1;

#[derive(Serialize)]
struct Kill {
    server: u32,
    /// Seconds of training into the failure-free run.
    t_s: f64,
    step: u64,
}

#[derive(Serialize)]
struct Schedule {
    mtbf_s: f64,
    seed: u64,
    /// Failure-free steps per second, which turns times into steps.
    steps_per_s: f64,
    kills: Vec<Kill>,
}

/// CPR Eq. 1 / Eq. 2's terms as one run measured them, in seconds.
#[derive(Serialize, Clone, Copy)]
struct Overhead {
    save: f64,
    load: f64,
    lost: f64,
    res: f64,
    total: f64,
    /// `total` over the failure-free run's training time.
    share_of_training: f64,
}

#[derive(Serialize)]
struct Variant {
    name: String,
    strategy: String,
    priority: Option<String>,
    overhead: Overhead,
    /// Training time over the failure-free run's, minus one (includes everything, noise too).
    training_time_overhead: f64,
    pls: Option<f64>,
    auc: Option<f64>,
    logloss: Option<f64>,
    auc_delta_vs_failure_free: Option<f64>,
    saves: u64,
    steps_redone: u64,
    servers_restored: Vec<Vec<u32>>,
    report: RunReport,
}

#[derive(Serialize)]
struct CprBench {
    preset: String,
    servers: u32,
    workers: u32,
    steps: u64,
    target_pls: f64,
    /// Full saves of the `cpr` runs every this many seconds (Eq. 4).
    cpr_interval_s: f64,
    /// `full`'s interval: Young's, from the measured save cost.
    full_interval_s: f64,
    full_every_steps: u64,
    o_save_s: f64,
    schedule: Schedule,
    failure_free: Variant,
    variants: Vec<Variant>,
    /// 1 - (best `cpr` variant's overhead) / (`full`'s).
    overhead_reduction_vs_full: f64,
    /// The variant that gave it.
    best_variant: String,
    /// Its AUC minus `full`'s.
    auc_delta_vs_full: Option<f64>,
}

fn overhead(r: &RunReport, none_train_s: f64) -> Overhead {
    let o = &r.overheads;
    let total = o.o_save + o.o_load + o.o_lost + o.o_res;
    Overhead {
        save: o.o_save,
        load: o.o_load,
        lost: o.o_lost,
        res: o.o_res,
        total,
        share_of_training: total / none_train_s.max(1e-9),
    }
}

fn variant(name: &str, priority: Option<&str>, r: RunReport, none: Option<&RunReport>) -> Variant {
    let none_train_s = none.map_or(r.train_s, |n| n.train_s);
    Variant {
        name: name.into(),
        strategy: r.strategy.clone(),
        priority: priority.map(str::to_string),
        overhead: overhead(&r, none_train_s),
        training_time_overhead: r.train_s / none_train_s.max(1e-9) - 1.0,
        pls: r.cpr.as_ref().map(|c| c.pls.total),
        auc: r.auc,
        logloss: r.logloss,
        auc_delta_vs_failure_free: match (r.auc, none.and_then(|n| n.auc)) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        },
        saves: r.checkpoints,
        steps_redone: r.failures.iter().map(|f| f.steps_redone).sum(),
        servers_restored: r
            .failures
            .iter()
            .map(|f| f.servers_restored.clone())
            .collect(),
        report: r,
    }
}

fn run_one(
    base: &RunArgs,
    name: &str,
    args: impl FnOnce(&mut RunArgs),
    progress: &mut crate::progress::Runs,
) -> Result<RunReport> {
    let mut a = base.clone();
    args(&mut a);
    crate::bench::bench_run(name, a, |_| {}, progress)
}

/// Failure times as exponential gaps of mean `mtbf_s` (inverse transform of a seeded uniform),
/// at most `kills` of them before `end_s`.
fn failure_times(mtbf_s: f64, end_s: f64, kills: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix::keyed(seed, 0x6b_696c6c, 0);
    let mut t = 0.0;
    let mut out = Vec::new();
    while out.len() < kills {
        let u = rng.next_f64();
        t += -mtbf_s * (1.0 - u).ln();
        if t >= end_s {
            break;
        }
        out.push(t);
    }
    out
}

fn bench(
    run: &RunArgs,
    kills: usize,
    kill_seed: u64,
    mtbf_s: Option<f64>,
    target_pls: f64,
) -> Result<CprBench> {
    if run.strategy.is_some() || !run.kill.is_empty() || run.cpr.cpr_priority.is_some() {
        bail!("ftrec bench cpr chooses --strategy, --cpr-priority and --kill itself");
    }
    if run.sync {
        bail!("ftrec bench cpr runs asynchronous training, CPR's home (drop --sync)");
    }
    if run.ckpt_every_steps.is_some() {
        bail!(
            "ftrec bench cpr sets the intervals itself (Eq. 4 for cpr, Young's for full): \
             drop --ckpt-every-steps"
        );
    }
    if kills == 0 {
        bail!("--kills must be at least 1");
    }
    if !(target_pls.is_finite() && target_pls > 0.0 && target_pls <= 1.0) {
        bail!("--target-pls {target_pls} must be in (0, 1]");
    }
    let mut base = crate::cluster_cmd::merge(run)?;
    base.cpr.target_pls = None;
    base.cpr.mtbf_s = None;
    base.strategy = Some("none".into());
    let cfg = crate::cluster_cmd::run_config(&base)?;
    let (steps, servers) = (cfg.steps, cfg.servers);

    // failure_free, cpr with each of 4 priorities, full.
    let mut progress = crate::progress::Runs::new("bench cpr", 6);
    let none = run_one(&base, "failure_free", |_| {}, &mut progress)?;
    let steps_per_s = none.steps as f64 / none.train_s.max(1e-9);
    let mtbf_s = mtbf_s.unwrap_or(none.train_s / kills as f64);
    if !(mtbf_s.is_finite() && mtbf_s > 0.0) {
        bail!("--mtbf-s {mtbf_s} must be a positive number of seconds");
    }
    // Servers in a seeded order, each kill the next one: consecutive kills hit different
    // servers whenever there are two or more.
    let mut order: Vec<u32> = (0..servers).collect();
    let mut rng = SplitMix::keyed(kill_seed, 0x6f_72646572, 0);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut schedule = Schedule {
        mtbf_s,
        seed: kill_seed,
        steps_per_s,
        kills: Vec::new(),
    };
    let mut last_step = 0;
    for (i, t) in failure_times(mtbf_s, none.train_s, kills, kill_seed)
        .into_iter()
        .enumerate()
    {
        let step = ((t * steps_per_s).round() as u64)
            .max(last_step + 1)
            .clamp(1, steps.saturating_sub(1).max(1));
        if step <= last_step || step >= steps {
            continue;
        }
        last_step = step;
        schedule.kills.push(Kill {
            server: order[i % order.len()],
            t_s: t,
            step,
        });
    }
    if schedule.kills.is_empty() {
        bail!(
            "no failure fell inside the run (MTBF {mtbf_s:.1}s, {:.1}s of training, seed \
             {kill_seed}): lower --mtbf-s or change --kill-seed",
            none.train_s
        );
    }
    let kill_args: Vec<String> = schedule
        .kills
        .iter()
        .map(|k| format!("server={}@step={}", k.server, k.step))
        .collect();
    eprintln!(
        "kill schedule (MTBF {mtbf_s:.1}s, seed {kill_seed}): {}",
        kill_args.join(" ")
    );

    let cpr_interval_s = 2.0 * target_pls * servers as f64 * mtbf_s;
    let mut variants = Vec::new();
    let mut o_save_s = None;
    for priority in ["none", "mfu", "ssu", "scar"] {
        let name = if priority == "none" {
            "cpr".to_string()
        } else {
            format!("cpr_{priority}")
        };
        let r = run_one(
            &base,
            &name,
            |a| {
                a.strategy = Some("cpr".into());
                a.cpr.cpr_priority = Some(priority.into());
                a.cpr.target_pls = Some(target_pls);
                a.cpr.mtbf_s = Some(mtbf_s);
                a.kill = kill_args.clone();
            },
            &mut progress,
        )?;
        if priority == "none" {
            // Every save of the vanilla run is a full: its mean pause is O_save.
            o_save_s = Some(r.checkpoint_pause_s / r.checkpoints.max(1) as f64);
        }
        variants.push(variant(&name, Some(priority), r, Some(&none)));
    }
    let o_save_s = o_save_s.unwrap_or(0.0);
    let full_interval_s = (2.0 * o_save_s * mtbf_s).sqrt();
    let full_every_steps = ((full_interval_s * steps_per_s).round() as u64).max(1);
    let full = run_one(
        &base,
        "full",
        |a| {
            a.strategy = Some("full".into());
            a.ckpt_every_steps = Some(full_every_steps);
            a.kill = kill_args.clone();
        },
        &mut progress,
    )?;
    let full = variant("full", None, full, Some(&none));
    let best = variants
        .iter()
        .min_by(|a, b| a.overhead.total.total_cmp(&b.overhead.total))
        .expect("four cpr variants");
    let overhead_reduction_vs_full = 1.0 - best.overhead.total / full.overhead.total.max(1e-9);
    let best_variant = best.name.clone();
    let auc_delta_vs_full = match (best.auc, full.auc) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    variants.push(full);
    let failure_free = variant("failure_free", None, none, None);
    Ok(CprBench {
        preset: cfg.preset.name.clone(),
        servers,
        workers: cfg.workers,
        steps,
        target_pls,
        cpr_interval_s,
        full_interval_s,
        full_every_steps,
        o_save_s,
        schedule,
        failure_free,
        variants,
        overhead_reduction_vs_full,
        best_variant,
        auc_delta_vs_full,
    })
}

pub fn run(run: RunArgs, kills: usize, kill_seed: u64) -> Result<()> {
    let json = run.json.clone();
    let mut args = run;
    args.json = None;
    // `--mtbf-s` draws the schedule and feeds both intervals; `--target-pls` is every cpr
    // variant's.
    let mtbf_s = args.cpr.mtbf_s.take();
    let target_pls = args.cpr.target_pls.take().unwrap_or(DEFAULT_TARGET_PLS);
    let b = bench(&args, kills, kill_seed, mtbf_s, target_pls)?;
    let ff = &b.failure_free;
    println!(
        "workload: {} preset, {} servers, {} workers, {} steps, async; failure-free: {:.2}s \
         training, auc {}",
        b.preset,
        b.servers,
        b.workers,
        b.steps,
        ff.report.train_s,
        ff.auc.map_or("-".into(), |a| format!("{a:.4}"))
    );
    println!(
        "kills: {} (MTBF {:.1}s, seed {}); cpr saves every {:.2}s (PLS {}), full every {} steps \
         (Young: {:.2}s from O_save {:.3}s)",
        b.schedule
            .kills
            .iter()
            .map(|k| format!("server {} after step {}", k.server, k.step))
            .collect::<Vec<_>>()
            .join(", "),
        b.schedule.mtbf_s,
        b.schedule.seed,
        b.cpr_interval_s,
        b.target_pls,
        b.full_every_steps,
        b.full_interval_s,
        b.o_save_s
    );
    println!(
        "{:<9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>10}",
        "run",
        "save s",
        "load s",
        "lost s",
        "res s",
        "total s",
        "share",
        "PLS",
        "AUC",
        "dAUC ff",
        "redone"
    );
    for v in &b.variants {
        let o = &v.overhead;
        println!(
            "{:<9} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>7.2}% {:>9} {:>8} {:>9} {:>10}",
            v.name,
            o.save,
            o.load,
            o.lost,
            o.res,
            o.total,
            o.share_of_training * 100.0,
            v.pls.map_or("-".into(), |p| format!("{p:.5}")),
            v.auc.map_or("-".into(), |a| format!("{a:.4}")),
            v.auc_delta_vs_failure_free
                .map_or("-".into(), |d| format!("{d:+.4}")),
            v.steps_redone
        );
    }
    println!(
        "overhead reduction vs full: {:.1}% ({}), AUC delta vs full {}",
        b.overhead_reduction_vs_full * 100.0,
        b.best_variant,
        b.auc_delta_vs_full
            .map_or("-".into(), |d| format!("{d:+.4}"))
    );
    if let Some(path) = json {
        crate::write_json(&path, &b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_times_are_seeded_exponential_gaps_inside_the_run() {
        let a = failure_times(10.0, 1e9, 2000, 3);
        assert_eq!(a, failure_times(10.0, 1e9, 2000, 3));
        assert_ne!(a, failure_times(10.0, 1e9, 2000, 4));
        // Mean gap near the MTBF (2000 draws: standard error ~0.22).
        let mean = a.last().unwrap() / a.len() as f64;
        assert!((mean - 10.0).abs() < 1.0, "mean gap {mean}");
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        let b = failure_times(10.0, 25.0, 100, 3);
        assert!(b.iter().all(|&t| t < 25.0));
        assert!(b.len() < 100);
    }
}

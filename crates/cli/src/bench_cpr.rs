//! `ftrec bench cpr`: CPR's emulation experiment (cpr.txt §5.1, §6.1, Figure 7) on one
//! workload and one failure schedule for every variant:
//! - `full`: full recovery at Young's interval `sqrt(2 O_save T_fail)` (CPR §2.2);
//! - `part`: baseline partial recovery at the same interval (§5.1, "naively uses the same
//!   interval"), which splits CPR's gain into "no lost computation" (full → part) and "the
//!   PLS-chosen interval" (part → cpr);
//! - `cpr`: CPR-vanilla, full saves every `2 · PLS · N_emb · T_fail` (Eq. 4, target PLS 0.1);
//! - `cpr-mfu`, `cpr-ssu`, `cpr-scar`: the same interval, prioritized saves 8 times as often
//!   after the first full, at most r = 1/8 of the 7 largest tables' rows each (§5.1).
//!
//! Failures as the paper emulates them: its 56-hour job saw 2 failures on average, injected at
//! uniformly random times; here `--failures` (default 2) at uniformly random steps of the run,
//! each taking `--fail-servers` servers at once (the paper clears 12.5–50% of the tables), so
//! `T_fail` = training time / failures. The ratio `O_save / T_fail` that decides every
//! overhead is reported beside the paper's.
//!
//! Two phases:
//! - **Overhead**, asynchronous (CPR's home): a failure-free run gives the training time and
//!   the step rate, `cpr` runs first and measures `O_save` (its saves are fulls), then every
//!   variant on the same schedule, `--rounds` times, interleaved. Each run's overhead is split
//!   into save pauses, lost computation (steps redone) and restore (load + rescheduling, CPR
//!   Eq. 1/2's terms as the cluster measures them).
//! - **Accuracy**, synchronous and deterministic: full recovery ends at the failure-free model
//!   bit for bit (checked once, on the first placement), so each variant's AUC drop against the
//!   failure-free run *is* its drop against full recovery, the effect of partial recovery
//!   alone. `--seeds` failure placements (default 5), the intervals of the overhead phase in
//!   steps, the drop's mean and 95% interval (Student's t over the placements).
//!
//! No best-of selection: every variant's figures are its own.

use anyhow::{bail, Result};
use clap::Args;
use ftrec_cluster::RunReport;
use ftrec_core::rng::SplitMix;
use serde::Serialize;

use crate::bench_incr::{ci95, mean};
use crate::flags::RunArgs;

/// The paper's target PLS for every CPR variant (CPR §6.1).
const DEFAULT_TARGET_PLS: f64 = 0.1;
/// The paper's `O_save / T_fail` for Kaggle, as Figure 7 implies it: full recovery at Young's
/// interval costs `sqrt(2 O_save / T_fail)` of the training time in saves and lost work
/// (Eq. 1), 8.5% there, so `O_save / T_fail` = 0.085² / 2.
const PAPER_SAVE_TO_FAILURE: f64 = 0.085 * 0.085 / 2.0;

/// Flags of `ftrec bench cpr`.
#[derive(Args, Debug, Clone)]
pub struct CprBenchArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Failures in a run, at uniformly random steps (CPR §5.1: 2 in the emulated 56-hour job).
    #[arg(long, default_value_t = 2)]
    pub failures: usize,
    /// Servers each failure takes at once [default: a quarter of them, at least 1].
    #[arg(long, value_name = "K")]
    pub fail_servers: Option<u32>,
    /// Seed of the overhead phase's failure schedule; placement `i` of the accuracy phase uses
    /// this seed + 1 + i.
    #[arg(long, default_value_t = 1)]
    pub kill_seed: u64,
    /// Failure placements of the accuracy phase (synchronous runs, paired with the
    /// failure-free run).
    #[arg(long, default_value_t = 5)]
    pub seeds: usize,
    /// Rounds of the overhead phase (every variant once a round, interleaved).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Skip the accuracy phase.
    #[arg(long)]
    pub no_accuracy: bool,
    /// Instead of Figure 7's six variants, CPR §6.3's sensitivity: CPR-vanilla and CPR-SSU at
    /// each of these target PLS values (the paper: 0.02,0.1,0.2), overhead and paired AUC drop.
    #[arg(
        long,
        value_name = "PLS,..",
        value_delimiter = ',',
        conflicts_with = "pls_sweep"
    )]
    pub sensitivity: Vec<f64>,
    /// Instead of Figure 7's six variants, CPR §6.5's PLS–accuracy sweep: this many
    /// synchronous CPR-vanilla runs, each with 1–32 failures of random size (1 to half of the
    /// servers) at a random interval (expected PLS 0–1), paired with the failure-free run; the
    /// correlation of PLS with the AUC drop, a table and a plot (`--plot-dir`).
    #[arg(long, value_name = "RUNS")]
    pub pls_sweep: Option<usize>,
    /// With --pls-sweep: also run CPR-SSU on each run's failures and interval (CPR §6.5,
    /// Figure 12: its slope against vanilla's).
    #[arg(long, requires = "pls_sweep")]
    pub sweep_ssu: bool,
    /// Where `--pls-sweep` and `--sensitivity` write their plots (PNG and SVG)
    /// [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub plot_dir: Option<std::path::PathBuf>,
    /// Redraw the plots of an earlier `--sensitivity` or `--pls-sweep` run from the file its
    /// `--json` wrote, into `--plot-dir`, running nothing.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["pls_sweep", "sensitivity"])]
    pub replot: Option<std::path::PathBuf>,
}

/// The variants, in the order each round runs them (`cpr` first: it measures `O_save`).
pub(crate) const VARIANTS: [&str; 6] = ["cpr", "full", "part", "cpr-mfu", "cpr-ssu", "cpr-scar"];

#[derive(Serialize, Clone)]
pub(crate) struct Failure {
    pub(crate) step: u64,
    pub(crate) servers: Vec<u32>,
}

impl Failure {
    pub(crate) fn kill_arg(&self) -> String {
        let ids: Vec<String> = self.servers.iter().map(|s| s.to_string()).collect();
        format!("server={}@step={}", ids.join(","), self.step)
    }
}

/// `n` failures at distinct uniformly random steps in `1..steps`, each taking `k` distinct
/// servers of `servers`, from `seed`.
pub(crate) fn placement(seed: u64, n: usize, k: u32, servers: u32, steps: u64) -> Vec<Failure> {
    let mut rng = SplitMix::keyed(seed, 0x63_7072, 0);
    let mut at: Vec<u64> = Vec::new();
    let room = steps.saturating_sub(1) as usize;
    while at.len() < n.min(room) {
        let s = 1 + rng.next_u64() % steps.saturating_sub(1).max(1);
        if !at.contains(&s) {
            at.push(s);
        }
    }
    at.sort_unstable();
    at.into_iter()
        .map(|step| {
            let mut order: Vec<u32> = (0..servers).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut ids: Vec<u32> = order.into_iter().take(k as usize).collect();
            ids.sort_unstable();
            Failure { step, servers: ids }
        })
        .collect()
}

/// One run's overhead, CPR Eq. 1/2's terms, in seconds.
#[derive(Serialize, Clone, Copy, Default)]
struct Split {
    save_s: f64,
    lost_s: f64,
    /// Loading and rescheduling.
    restore_s: f64,
}

impl Split {
    fn of(r: &RunReport) -> Split {
        let o = &r.overheads;
        Split {
            save_s: o.o_save,
            lost_s: o.o_lost,
            restore_s: o.o_load + o.o_res,
        }
    }
    fn total(&self) -> f64 {
        self.save_s + self.lost_s + self.restore_s
    }
}

#[derive(Serialize)]
struct SeedResult {
    seed: u64,
    failures: Vec<Failure>,
    auc: Option<f64>,
    /// Failure-free AUC minus this run's.
    auc_drop: Option<f64>,
    pls: Option<f64>,
    pls_saved: Option<f64>,
    model_digest: String,
}

#[derive(Serialize)]
pub(crate) struct VariantResult {
    pub(crate) name: String,
    /// Mean checkpoint-related overhead of the asynchronous runs, seconds.
    pub(crate) overhead_s: f64,
    pub(crate) overhead_ci95_s: f64,
    /// Its mean split.
    split: Split,
    /// `overhead_s` over the failure-free training time.
    pub(crate) overhead_share: f64,
    /// 1 - this variant's mean overhead / `full`'s (when `full` ran).
    overhead_reduction_vs_full: Option<f64>,
    /// PLS, Eq. 3 as the paper writes it: mean over the accuracy placements (the overhead
    /// runs' when there are none).
    pub(crate) pls: Option<f64>,
    /// PLS counting what was saved (per row, since the newest save holding it).
    pub(crate) pls_saved: Option<f64>,
    /// Mean paired AUC drop against the failure-free (= full recovery's) model, and the
    /// half-width of its 95% interval.
    pub(crate) auc_drop_mean: Option<f64>,
    pub(crate) auc_drop_ci95: Option<f64>,
    /// The accuracy placements.
    seeds: Vec<SeedResult>,
    /// Every overhead run: its split.
    overhead_runs: Vec<Split>,
    /// Every overhead run's Eq. 3 PLS.
    overhead_runs_pls: Vec<Option<f64>>,
    /// Saves committed in the first overhead run.
    saves: u64,
}

#[derive(Serialize)]
pub(crate) struct CprBench {
    preset: String,
    servers: u32,
    workers: u32,
    steps: u64,
    target_pls: f64,
    failures: usize,
    fail_servers: u32,
    /// Failure-free asynchronous training time and step rate.
    failure_free_train_s: f64,
    steps_per_s: f64,
    /// `T_fail` = training time / failures.
    t_fail_s: f64,
    /// Mean pause of `cpr`'s (full) saves in the first round.
    o_save_s: f64,
    /// `O_save / T_fail` here and in the paper (Kaggle, Figure 7's 8.5% at Young's interval).
    save_to_failure_interval: f64,
    paper_save_to_failure_interval: f64,
    /// `cpr*`'s interval (Eq. 4) in seconds and, for the synchronous runs, in steps.
    cpr_interval_s: f64,
    pub(crate) cpr_every_steps: u64,
    /// `full`'s and `part`'s interval (Young's) in seconds and steps.
    full_interval_s: f64,
    full_every_steps: u64,
    /// The overhead phase's failures.
    schedule: Vec<Failure>,
    /// Synchronous failure-free AUC, and whether full recovery ended at its digest.
    sync_failure_free_auc: Option<f64>,
    sync_full_matches_failure_free: Option<bool>,
    pub(crate) variants: Vec<VariantResult>,
}

pub(crate) fn run_one(
    base: &RunArgs,
    name: &str,
    args: impl FnOnce(&mut RunArgs),
    progress: &mut crate::progress::Runs,
) -> Result<RunReport> {
    let mut a = base.clone();
    args(&mut a);
    crate::bench::bench_run(name, a, |_| {}, progress)
}

/// The failure-free AUC minus a run's, when both were evaluated.
pub(crate) fn auc_drop(failure_free: Option<f64>, run: Option<f64>) -> Option<f64> {
    Some(failure_free? - run?)
}

/// The failure-free run of `base` (strategy `none`, no kills): the pairing's reference.
pub(crate) fn failure_free(
    base: &RunArgs,
    name: &str,
    progress: &mut crate::progress::Runs,
) -> Result<RunReport> {
    run_one(base, name, |a| a.strategy = Some("none".into()), progress)
}

/// How variant `name` is configured on top of `a` (strategy, interval, priority, kills).
pub(crate) struct Intervals {
    pub(crate) cpr_time: Option<(f64, f64)>,
    pub(crate) cpr_steps: u64,
    pub(crate) full_steps: u64,
}

pub(crate) fn configure(a: &mut RunArgs, name: &str, iv: &Intervals, kills: &[Failure]) {
    a.kill = kills.iter().map(Failure::kill_arg).collect();
    match name {
        "full" => {
            a.strategy = Some("full".into());
            a.ckpt_every_steps = Some(iv.full_steps);
        }
        "part" => {
            a.strategy = Some("cpr".into());
            a.ckpt_every_steps = Some(iv.full_steps);
        }
        _ => {
            a.strategy = Some("cpr".into());
            if let Some(p) = name.strip_prefix("cpr-") {
                a.cpr.cpr_priority = Some(p.into());
            }
            match iv.cpr_time {
                Some((pls, mtbf)) => {
                    a.cpr.target_pls = Some(pls);
                    a.cpr.mtbf_s = Some(mtbf);
                }
                None => a.ckpt_every_steps = Some(iv.cpr_steps),
            }
        }
    }
}

/// Check the flags every mode shares; the job's base flags (strategy `none`, no target PLS)
/// and its configuration.
pub(crate) fn base_of(args: &CprBenchArgs) -> Result<(RunArgs, ftrec_cluster::RunConfig)> {
    let run = &args.run;
    if run.strategy.is_some() || !run.kill.is_empty() || run.cpr.cpr_priority.is_some() {
        bail!("ftrec bench cpr chooses --strategy, --cpr-priority and --kill itself");
    }
    if run.sync {
        bail!(
            "ftrec bench cpr runs its overhead phase asynchronously and its accuracy phase \
             synchronously: drop --sync"
        );
    }
    if run.ckpt_every_steps.is_some() || run.cpr.mtbf_s.is_some() {
        bail!(
            "ftrec bench cpr sets the intervals itself (Eq. 4 for cpr, Young's for full and \
             part) from the failures it injects: drop --ckpt-every-steps and --mtbf-s"
        );
    }
    if args.failures == 0 {
        bail!("--failures must be at least 1");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if !args.no_accuracy && args.seeds < 2 {
        bail!("--seeds must be at least 2 for an interval (or pass --no-accuracy)");
    }
    let mut base = crate::cluster_cmd::merge(run)?;
    base.cpr.target_pls = None;
    base.strategy = Some("none".into());
    let cfg = crate::cluster_cmd::run_config(&base)?;
    base.strategy = None;
    if cfg.steps < 2 {
        bail!("--steps must be at least 2 to place a failure inside the run");
    }
    Ok((base, cfg))
}

/// `flag` names where the value came from.
pub(crate) fn check_target_pls(target_pls: f64, flag: &str) -> Result<()> {
    if !(target_pls.is_finite() && target_pls > 0.0 && target_pls <= 1.0) {
        bail!("{flag}: target PLS {target_pls} must be in (0, 1]");
    }
    Ok(())
}

/// Figure 7's experiment for `variants` (a subset of [`VARIANTS`] in its order; `part` needs
/// `full`, whose interval it takes) at `target_pls`.
pub(crate) fn bench(
    args: &CprBenchArgs,
    target_pls: f64,
    variants: &[&'static str],
) -> Result<CprBench> {
    check_target_pls(target_pls, "--target-pls")?;
    let (base, cfg) = base_of(args)?;
    let (steps, servers) = (cfg.steps, cfg.servers);
    let k = args.fail_servers.unwrap_or(servers.div_ceil(4).max(1));
    if k == 0 || k > servers {
        bail!("--fail-servers {k} must be between 1 and the {servers} servers");
    }

    let n_runs = 1
        + variants.len() * args.rounds
        + if args.no_accuracy {
            0
        } else {
            1 + variants
                .iter()
                .map(|v| if *v == "full" { 1 } else { args.seeds })
                .sum::<usize>()
        };
    let mut progress = crate::progress::Runs::new("bench cpr", n_runs);
    let none = failure_free(&base, "failure_free", &mut progress)?;
    let steps_per_s = none.steps as f64 / none.train_s.max(1e-9);
    let t_fail_s = none.train_s / args.failures as f64;
    let schedule = placement(args.kill_seed, args.failures, k, servers, steps);
    eprintln!(
        "failures (T_fail {t_fail_s:.1}s): {}",
        schedule
            .iter()
            .map(Failure::kill_arg)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let cpr_interval_s = 2.0 * target_pls * servers as f64 * t_fail_s;
    let mut iv = Intervals {
        cpr_time: Some((target_pls, t_fail_s)),
        cpr_steps: ((cpr_interval_s * steps_per_s).round() as u64).max(1),
        full_steps: 0,
    };

    // Overhead: asynchronous, every variant each round, `cpr` first.
    let mut runs: Vec<Vec<RunReport>> = variants.iter().map(|_| Vec::new()).collect();
    let mut o_save_s = 0.0;
    for round in 0..args.rounds {
        for (vi, name) in variants.iter().enumerate() {
            if round == 0 && *name == "full" {
                // Young's interval from the vanilla run's measured save cost.
                let full_interval_s = (2.0 * o_save_s * t_fail_s).sqrt();
                iv.full_steps = ((full_interval_s * steps_per_s).round() as u64).max(1);
            }
            let r = run_one(
                &base,
                &format!("{name}-r{round}"),
                |a| configure(a, name, &iv, &schedule),
                &mut progress,
            )?;
            if round == 0 && *name == "cpr" {
                // Every save of the vanilla run is a full: its mean pause is O_save.
                o_save_s = r.checkpoint_pause_s / r.checkpoints.max(1) as f64;
            }
            runs[vi].push(r);
        }
    }
    let full_interval_s = (2.0 * o_save_s * t_fail_s).sqrt();

    // Accuracy: synchronous, intervals in steps, paired with the failure-free run.
    let mut sync_ff_auc = None;
    let mut full_matches = None;
    let mut seeds: Vec<Vec<SeedResult>> = variants.iter().map(|_| Vec::new()).collect();
    if !args.no_accuracy {
        let mut sync = base.clone();
        sync.sync = true;
        let sync_iv = Intervals {
            cpr_time: None,
            cpr_steps: iv.cpr_steps,
            full_steps: iv.full_steps,
        };
        let ff = failure_free(&sync, "sync-failure-free", &mut progress)?;
        sync_ff_auc = ff.auc;
        for i in 0..args.seeds {
            let seed = args.kill_seed + 1 + i as u64;
            let kills = placement(seed, args.failures, k, servers, steps);
            for (vi, name) in variants.iter().enumerate() {
                // Full recovery is exact in this mode: checked once, then known.
                if *name == "full" && i > 0 {
                    continue;
                }
                let r = run_one(
                    &sync,
                    &format!("sync-{name}-s{seed}"),
                    |a| configure(a, name, &sync_iv, &kills),
                    &mut progress,
                )?;
                if *name == "full" {
                    full_matches = Some(r.model_digest == ff.model_digest);
                }
                seeds[vi].push(SeedResult {
                    seed,
                    failures: kills.clone(),
                    auc: r.auc,
                    auc_drop: auc_drop(ff.auc, r.auc),
                    pls: r.cpr.as_ref().map(|c| c.pls.total),
                    pls_saved: r.cpr.as_ref().and_then(|c| c.pls.saved_total),
                    model_digest: r.model_digest.clone(),
                });
            }
        }
    }

    let full_mean = variants.iter().position(|v| *v == "full").map(|fi| {
        mean(
            &runs[fi]
                .iter()
                .map(|r| Split::of(r).total())
                .collect::<Vec<_>>(),
        )
    });
    let variants = variants
        .iter()
        .enumerate()
        .map(|(vi, name)| {
            let splits: Vec<Split> = runs[vi].iter().map(Split::of).collect();
            let totals: Vec<f64> = splits.iter().map(Split::total).collect();
            let overhead_s = mean(&totals);
            let avg = |f: fn(&Split) -> f64| mean(&splits.iter().map(f).collect::<Vec<_>>());
            let s = std::mem::take(&mut seeds[vi]);
            let opt_mean = |v: Vec<Option<f64>>| -> Option<f64> {
                let v: Option<Vec<f64>> = v.into_iter().collect();
                v.filter(|v| !v.is_empty()).map(|v| mean(&v))
            };
            let drops: Option<Vec<f64>> = s.iter().map(|x| x.auc_drop).collect();
            let drops = drops.filter(|d| !d.is_empty());
            let async_pls: Vec<Option<f64>> = runs[vi]
                .iter()
                .map(|r| r.cpr.as_ref().map(|c| c.pls.total))
                .collect();
            let async_saved: Vec<Option<f64>> = runs[vi]
                .iter()
                .map(|r| r.cpr.as_ref().and_then(|c| c.pls.saved_total))
                .collect();
            let (pls, pls_saved) = if s.is_empty() {
                (opt_mean(async_pls.clone()), opt_mean(async_saved))
            } else {
                (
                    opt_mean(s.iter().map(|x| x.pls).collect()),
                    opt_mean(s.iter().map(|x| x.pls_saved).collect()),
                )
            };
            VariantResult {
                name: name.to_string(),
                overhead_s,
                overhead_ci95_s: ci95(&totals),
                split: Split {
                    save_s: avg(|s| s.save_s),
                    lost_s: avg(|s| s.lost_s),
                    restore_s: avg(|s| s.restore_s),
                },
                overhead_share: overhead_s / none.train_s.max(1e-9),
                overhead_reduction_vs_full: full_mean.map(|f| 1.0 - overhead_s / f.max(1e-9)),
                pls,
                pls_saved,
                auc_drop_mean: drops.as_ref().map(|d| mean(d)),
                auc_drop_ci95: drops.as_ref().map(|d| ci95(d)),
                seeds: s,
                overhead_runs: splits,
                overhead_runs_pls: async_pls,
                saves: runs[vi].first().map_or(0, |r| r.checkpoints),
            }
        })
        .collect();
    Ok(CprBench {
        preset: cfg.preset.name.clone(),
        servers,
        workers: cfg.workers,
        steps,
        target_pls,
        failures: args.failures,
        fail_servers: k,
        failure_free_train_s: none.train_s,
        steps_per_s,
        t_fail_s,
        o_save_s,
        save_to_failure_interval: o_save_s / t_fail_s.max(1e-9),
        paper_save_to_failure_interval: PAPER_SAVE_TO_FAILURE,
        cpr_interval_s,
        cpr_every_steps: iv.cpr_steps,
        full_interval_s,
        full_every_steps: iv.full_steps,
        schedule,
        sync_failure_free_auc: sync_ff_auc,
        sync_full_matches_failure_free: full_matches,
        variants,
    })
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

pub fn run(args: CprBenchArgs) -> Result<()> {
    if let Some(path) = &args.replot {
        return crate::bench_cpr_sweep::replot(&args, path);
    }
    let json = args.run.json.clone();
    let mut args = args;
    args.run.json = None;
    let target_pls = args.run.cpr.target_pls.take().unwrap_or(DEFAULT_TARGET_PLS);
    if let Some(n) = args.pls_sweep {
        return crate::bench_cpr_sweep::pls_sweep(&args, n, json.as_deref());
    }
    if !args.sensitivity.is_empty() {
        return crate::bench_cpr_sweep::sensitivity(&args, json.as_deref());
    }
    let b = bench(&args, target_pls, &VARIANTS)?;
    println!(
        "workload: {} preset, {} servers, {} workers, {} steps; failure-free {:.2}s of \
         asynchronous training",
        b.preset, b.servers, b.workers, b.steps, b.failure_free_train_s
    );
    println!(
        "{} failures of {} server(s): T_fail {:.1}s; O_save {:.3}s, O_save/T_fail {:.4} (paper \
         {:.4}); cpr every {:.2}s ({} steps in sync), full and part every {} steps (Young \
         {:.2}s)",
        b.failures,
        b.fail_servers,
        b.t_fail_s,
        b.o_save_s,
        b.save_to_failure_interval,
        b.paper_save_to_failure_interval,
        b.cpr_interval_s,
        b.cpr_every_steps,
        b.full_every_steps,
        b.full_interval_s
    );
    if let Some(m) = b.sync_full_matches_failure_free {
        println!(
            "sync: failure-free AUC {}, full recovery ends at the failure-free digest: {m}",
            opt(b.sync_failure_free_auc, 4)
        );
    }
    println!(
        "{:<9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "variant",
        "save s",
        "lost s",
        "restore",
        "total s",
        "share",
        "vs full",
        "PLS",
        "PLS saved",
        "AUC drop",
        "±95%"
    );
    for v in &b.variants {
        println!(
            "{:<9} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>7.2}% {:>7.1}% {:>9} {:>9} {:>9} {:>9}",
            v.name,
            v.split.save_s,
            v.split.lost_s,
            v.split.restore_s,
            v.overhead_s,
            v.overhead_share * 100.0,
            v.overhead_reduction_vs_full.map_or(0.0, |r| -r * 100.0),
            opt(v.pls, 4),
            opt(v.pls_saved, 4),
            opt(v.auc_drop_mean, 5),
            opt(v.auc_drop_ci95, 5)
        );
    }
    if let Some(path) = json {
        crate::write_json(&path, &b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_seeded_distinct_and_inside_the_run() {
        let a = placement(3, 2, 2, 8, 100);
        assert_eq!(a.len(), 2);
        assert!(a[0].step < a[1].step && a[0].step >= 1 && a[1].step < 100);
        for f in &a {
            assert_eq!(f.servers.len(), 2);
            assert!(f.servers[0] < f.servers[1] && f.servers[1] < 8);
        }
        let same = placement(3, 2, 2, 8, 100);
        assert_eq!(
            a.iter().map(Failure::kill_arg).collect::<Vec<_>>(),
            same.iter().map(Failure::kill_arg).collect::<Vec<_>>()
        );
        let other: Vec<String> = (4..10)
            .flat_map(|s| placement(s, 2, 2, 8, 100))
            .map(|f| f.kill_arg())
            .collect();
        assert!(other.iter().any(|k| *k != a[0].kill_arg()));
        // Uniform over the run: the mean step of many placements is near the middle.
        let steps: Vec<f64> = (0..2000)
            .flat_map(|s| placement(s, 1, 1, 4, 101))
            .map(|f| f.step as f64)
            .collect();
        let m = mean(&steps);
        assert!((m - 50.5).abs() < 2.5, "mean failure step {m}");
        // The kill argument is what `--kill` parses back into one spec per server.
        let k = ftrec_cluster::KillSpec::parse_many(&a[0].kill_arg()).unwrap();
        assert_eq!(k.len(), 2);
        // A run with fewer steps than failures places what fits.
        assert_eq!(placement(1, 5, 1, 2, 3).len(), 2);
    }
}

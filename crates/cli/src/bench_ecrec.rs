//! `ftrec bench ecrec`: ECRec's costs on one cluster configuration, measured in one
//! invocation (ecrec.txt §5), in asynchronous training by default (as the paper trains; `--sync`
//! for the deterministic mode):
//! - training-time overhead against no fault tolerance for the paper's variants (§5.2: all
//!   on, without dense replication, and without dense replication and 2PC), for k = 2 and
//!   k = 4, each run next to a `none` run and the whole set repeated, so that the spread of
//!   the `none` runs is reported next to the overheads it has to be smaller than; and the
//!   same as CPU time (user + system of the servers and workers), which the other load on a
//!   shared machine disturbs less than wall time;
//! - the recovery from one SIGKILL (§5.3): time to training resumed, the rebuild's duration,
//!   and training throughput while it ran, as a whole and per lock range, for one or several
//!   rebuild shares (`--rebuild-shares`); `full` checkpoints' recovery from the same kill for
//!   comparison. Recovery runs are longer than the overhead runs (`--recovery-steps`), so
//!   that a rebuild that yields to training finishes while training goes on.

use anyhow::{bail, Result};
use ftrec_cluster::{RunReport, StrategyChoice};
use serde::Serialize;

use crate::flags::RunArgs;

/// Steps when `--steps` is not given: enough batches that a run's noise stays below the
/// effects measured (checked against the spread of the repeated `none` runs).
const DEFAULT_STEPS: u64 = 150;

/// Recovery runs take this many times the steps unless `--recovery-steps`: a rebuild at the
/// default share (a tenth of the time) takes about 20 times as long as at the full share, and
/// has to finish while training goes on, with the 10 s after it still inside training, for
/// its throughput to be measured (at 4x the steps a 32 s rebuild outlasted training).
const RECOVERY_STEPS_FACTOR: u64 = 8;

/// One run, reduced to what the comparison needs (the full report is kept too).
#[derive(Serialize)]
struct RunSummary {
    name: String,
    repeat: u32,
    train_s: f64,
    samples_per_s: f64,
    /// User + system CPU seconds of the server processes and of the worker processes, whole
    /// processes (start-up and the end of the run included).
    servers_cpu_s: f64,
    workers_cpu_s: f64,
    /// The same while training ran (0 when the run did not end normally).
    train_servers_cpu_s: f64,
    train_workers_cpu_s: f64,
    auc: Option<f64>,
    report: RunReport,
}

impl RunSummary {
    fn of(name: &str, repeat: u32, report: RunReport) -> Self {
        RunSummary {
            name: name.into(),
            repeat,
            train_s: report.train_s,
            samples_per_s: report.samples_per_s,
            servers_cpu_s: report.cpu.servers_s,
            workers_cpu_s: report.cpu.workers_s,
            train_servers_cpu_s: report.cpu.train_servers_s.unwrap_or(0.0),
            train_workers_cpu_s: report.cpu.train_workers_s.unwrap_or(0.0),
            auc: report.auc,
            report,
        }
    }

    fn cpu_s(&self) -> f64 {
        self.servers_cpu_s + self.workers_cpu_s
    }

    fn train_cpu_s(&self) -> f64 {
        self.train_servers_cpu_s + self.train_workers_cpu_s
    }
}

/// Mean, smallest and largest of some ratios minus one (overheads).
#[derive(Serialize, Clone, Copy)]
struct Spread {
    mean: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(v: &[f64]) -> Option<Spread> {
        if v.is_empty() {
            return None;
        }
        Some(Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    fn pct(s: Option<Spread>) -> String {
        s.map_or("-".into(), |s| {
            format!(
                "{:+.1}% ({:+.1}% to {:+.1}%)",
                s.mean * 100.0,
                s.min * 100.0,
                s.max * 100.0
            )
        })
    }
}

/// One ECRec variant against `none`.
#[derive(Serialize)]
struct Variant {
    name: String,
    k: usize,
    r: usize,
    two_phase: bool,
    dense_replication: bool,
    /// Training time over the `none` run of the same repeat, minus one.
    overhead: Option<Spread>,
    /// CPU time (servers + workers) while training ran over the `none` run's, minus one: the
    /// training overhead in CPU time.
    train_cpu_overhead: Option<Spread>,
    /// Servers' CPU time while training ran over the `none` servers', minus one.
    train_server_cpu_overhead: Option<Spread>,
    /// CPU time of the whole processes (servers + workers) over the `none` run's, minus one:
    /// start-up (ECRec's initial parity encode) and the end of the run (ECRec's parity audit)
    /// included.
    cpu_overhead: Option<Spread>,
    /// Servers' CPU time, whole processes, over the `none` servers', minus one.
    server_cpu_overhead: Option<Spread>,
    /// Mean cost of one commit (both phases) as its coordinator (worker or coordinator) saw it.
    commit_per_update_s: f64,
    /// Cluster memory (model + parities + dense copies) over the model's, and `(k+r)/k`.
    memory_overhead: f64,
    code_overhead: f64,
    runs: Vec<RunSummary>,
}

/// What one invocation runs besides the run flags.
pub struct Plan {
    /// Server killed in the recovery runs, and the step after which it is killed (default:
    /// a quarter of the recovery runs' steps).
    pub kill_server: u32,
    pub kill_step: Option<u64>,
    /// Steps of the recovery runs (default: [`RECOVERY_STEPS_FACTOR`] x the steps).
    pub recovery_steps: Option<u64>,
    /// Times the `none` run and every variant are run; 0: the recovery runs only.
    pub repeats: u32,
    /// One ECRec recovery run per share (fractions); empty: the run flags' share.
    pub rebuild_shares: Vec<f64>,
    /// Whether the `full` recovery run is made.
    pub full: bool,
}

/// The recovery from one kill.
#[derive(Serialize)]
struct Recovery {
    strategy: String,
    kill: String,
    /// ECRec: the rebuild share the run had (a fraction of the time).
    rebuild_share: Option<f64>,
    /// Seconds from the kill to training resumed, and to the state being whole again.
    resumed_s: Option<f64>,
    recovered_s: Option<f64>,
    /// ECRec: from the replacement joining to its rebuild finishing.
    rebuild_s: Option<f64>,
    /// ECRec: training throughput during the rebuild over the throughput before the kill,
    /// as a whole and per lock range.
    rebuild_throughput_share: Option<f64>,
    range_throughput_share: Vec<Option<f64>>,
    /// ECRec: training throughput during the rebuild over the mean of the throughput in the
    /// [`AROUND_S`] before the kill and in the [`AROUND_S`] after the rebuild finished
    /// (`None` when training ended before that): a slow drift of the machine's other load
    /// cancels out of it, where it does not out of a ratio to the time before the kill only.
    rebuild_throughput_share_around: Option<f64>,
    /// Samples/s in the report's intervals that overlap [kill, recovered], over the mean of
    /// the intervals before the kill (`None` when no interval lies before it): the detection
    /// and replacement pause included.
    kill_to_recovered_throughput_share: Option<f64>,
    report: RunReport,
}

#[derive(Serialize)]
struct EcrecBench {
    asynchronous: bool,
    steps: u64,
    /// Steps of the recovery runs, and the step after which their server is killed.
    recovery_steps: u64,
    kill_step: u64,
    repeats: u32,
    none: Vec<RunSummary>,
    /// Largest over smallest training time of the `none` runs, minus one: the noise an
    /// overhead has to be compared with.
    none_spread: f64,
    none_cpu_spread: f64,
    none_train_cpu_spread: f64,
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

/// Seconds of training before the kill and after the rebuild that
/// [`Recovery::rebuild_throughput_share_around`] compares the rebuild with.
const AROUND_S: f64 = 10.0;

/// Mean samples/s of the report's whole intervals inside `[from, to]` (seconds after the run
/// started); `None` when no interval lies inside.
fn mean_rate(r: &RunReport, from: f64, to: f64) -> Option<f64> {
    let t0 = r
        .events
        .iter()
        .find(|e| e.kind == ftrec_cluster::EventKind::WorkersStarted)
        .map_or(0.0, |e| e.t_s);
    let v: Vec<f64> = r
        .throughput
        .iter()
        .filter(|i| i.t_start_s + t0 >= from && i.t_end_s + t0 <= to)
        .map(|i| i.samples_per_s)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Throughput while a rebuild ran over the mean of the throughput in the [`AROUND_S`] before
/// the kill at `kill` and in the [`AROUND_S`] after the rebuild finished.
fn around_share(r: &RunReport, kill: f64, joined: f64, finished: f64) -> Option<f64> {
    let during = mean_rate(r, joined, finished)?;
    let before = mean_rate(r, kill - AROUND_S, kill)?;
    let after = mean_rate(r, finished, finished + AROUND_S)?;
    Some(during / ((before + after) / 2.0).max(1e-9))
}

fn run_one(
    base: &RunArgs,
    name: &str,
    strategy: StrategyChoice,
    kill: Option<String>,
    progress: &mut crate::progress::Runs,
) -> Result<RunReport> {
    let mut a = base.clone();
    a.strategy = Some(strategy.name().into());
    a.kill = kill.into_iter().collect();
    if let StrategyChoice::Full { every_steps } = strategy {
        a.ckpt_every_steps = Some(every_steps);
    }
    crate::bench::bench_run(name, a, |cfg| cfg.strategy = strategy, progress)
}

fn ecrec(
    k: usize,
    r: usize,
    two_phase: bool,
    dense_replication: bool,
    rebuild_share_ppm: u32,
) -> StrategyChoice {
    StrategyChoice::EcRec {
        k,
        r,
        // The exact code: the recovery run must give back the failure-free model.
        code: ftrec_cluster::CodeKind::Gf256,
        dense_replication,
        two_phase,
        lock_ranges: 4,
        rebuild_share_ppm,
    }
}

fn bench(run: &RunArgs, plan: &Plan) -> Result<EcrecBench> {
    let Plan {
        kill_server,
        kill_step,
        repeats,
        ..
    } = *plan;
    if run.strategy.is_some() || !run.kill.is_empty() {
        bail!("ftrec bench ecrec chooses --strategy and --kill itself");
    }
    let flags = run.ec.flags();
    if flags.k.is_some() || flags.r.is_some() || flags.no_2pc || flags.no_dense_replication {
        bail!(
            "ftrec bench ecrec runs its own variants of --ec-k, --ec-r, --no-2pc and \
             --no-dense-replication"
        );
    }
    if !plan.rebuild_shares.is_empty() && flags.rebuild_share.is_some() {
        bail!("give either --rebuild-share or --rebuild-shares, not both");
    }
    let mut base = crate::cluster_cmd::merge(run)?;
    base.steps = base.steps.or(Some(DEFAULT_STEPS));
    base.strategy = Some("none".into());
    let none_cfg = crate::cluster_cmd::run_config(&base)?;
    let steps = none_cfg.steps;
    let servers = none_cfg.servers;
    let share = match flags.rebuild_share {
        Some(f) => ftrec_cluster::ecrec::rebuild_share_ppm(f)?,
        None => ftrec_cluster::ecrec::DEFAULT_REBUILD_SHARE_PPM,
    };
    // Checked before any run, so that a bad share fails at once.
    let recovery_shares: Vec<u32> = if plan.rebuild_shares.is_empty() {
        vec![share]
    } else {
        plan.rebuild_shares
            .iter()
            .map(|&f| {
                ftrec_cluster::ecrec::rebuild_share_ppm(f).map_err(|_| {
                    anyhow::anyhow!(
                        "--rebuild-shares {f} is out of range (fractions of the time from 0 to 1)"
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    let recovery_steps = plan
        .recovery_steps
        .unwrap_or(steps.saturating_mul(RECOVERY_STEPS_FACTOR));
    if recovery_steps == 0 {
        bail!("--recovery-steps must be at least 1");
    }
    // A quarter in: the throughput before the kill is measured after the start-up.
    let kill_step = kill_step.unwrap_or((recovery_steps / 4).max(1));
    if kill_step >= recovery_steps {
        bail!(
            "--kill-step {kill_step} is not before the recovery runs' last step ({recovery_steps})"
        );
    }
    let mut recovery_base = base.clone();
    recovery_base.steps = Some(recovery_steps);
    // The paper's ablation (§5.2): all on, no dense replication, no dense replication and no
    // 2PC; all on with k = 4 as well.
    let shapes: Vec<(usize, bool, bool)> = vec![
        (2, true, true),
        (2, true, false),
        (2, false, false),
        (4, true, true),
    ];
    let mut skipped = Vec::new();
    let mut variants: Vec<Variant> = Vec::new();
    // `--repeat 0`: the recovery runs only, no variant to compare.
    let shapes = if repeats == 0 { Vec::new() } else { shapes };
    for &(k, two_phase, dense) in &shapes {
        let name = format!(
            "ecrec_k{k}{}{}",
            if dense { "" } else { "_norep" },
            if two_phase { "" } else { "_no2pc" }
        );
        if k as u32 + 1 > servers {
            skipped.push(format!(
                "{name}: needs {} servers, the run has {servers}",
                k + 1
            ));
            continue;
        }
        variants.push(Variant {
            name,
            k,
            r: 1,
            two_phase,
            dense_replication: dense,
            overhead: None,
            train_cpu_overhead: None,
            train_server_cpu_overhead: None,
            cpu_overhead: None,
            server_cpu_overhead: None,
            commit_per_update_s: 0.0,
            memory_overhead: 0.0,
            code_overhead: 0.0,
            runs: Vec::new(),
        });
    }
    // Each repeat: `none`, then every variant; a variant's ratios are against the `none` run
    // of its own repeat, so slow drifts of the machine's load cancel out.
    let total =
        repeats as usize * (1 + variants.len()) + recovery_shares.len() + usize::from(plan.full);
    eprintln!(
        "bench ecrec: {total} runs (tens of minutes on two cores; each run's line gives the \
         time left)"
    );
    let mut progress = crate::progress::Runs::new("bench ecrec", total);
    let mut none = Vec::new();
    for rep in 0..repeats {
        let n = run_one(
            &base,
            &format!("none_{rep}"),
            StrategyChoice::None,
            None,
            &mut progress,
        )?;
        none.push(RunSummary::of("none", rep, n));
        for v in &mut variants {
            let r = run_one(
                &base,
                &format!("{}_{rep}", v.name),
                ecrec(v.k, v.r, v.two_phase, v.dense_replication, share),
                None,
                &mut progress,
            )?;
            v.runs.push(RunSummary::of(&v.name, rep, r));
        }
    }
    for v in &mut variants {
        let per = |f: &dyn Fn(&RunSummary) -> f64| -> Vec<f64> {
            v.runs
                .iter()
                .zip(&none)
                .map(|(r, n)| f(r) / f(n).max(1e-9) - 1.0)
                .collect()
        };
        v.overhead = Spread::of(&per(&|r| r.train_s));
        v.train_cpu_overhead = Spread::of(&per(&|r| r.train_cpu_s()));
        v.train_server_cpu_overhead = Spread::of(&per(&|r| r.train_servers_cpu_s));
        v.cpu_overhead = Spread::of(&per(&|r| r.cpu_s()));
        v.server_cpu_overhead = Spread::of(&per(&|r| r.servers_cpu_s));
        let ecs: Vec<_> = v.runs.iter().filter_map(|r| r.report.ec.clone()).collect();
        v.commit_per_update_s =
            ecs.iter().map(|e| e.per_step_s).sum::<f64>() / ecs.len().max(1) as f64;
        if let Some(e) = ecs.first() {
            v.memory_overhead = e.memory.overhead;
            v.code_overhead = e.memory.code_overhead;
        }
    }
    let spread = |f: &dyn Fn(&RunSummary) -> f64| {
        let v: Vec<f64> = none.iter().map(f).collect();
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        max / min.max(1e-9) - 1.0
    };
    let (none_spread, none_cpu_spread, none_train_cpu_spread) = if none.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (
            spread(&|r| r.train_s),
            spread(&|r| r.cpu_s()),
            spread(&|r| r.train_cpu_s()),
        )
    };
    let kill = format!("server={kill_server}@step={kill_step}");
    let mut recoveries = Vec::new();
    let mut runs: Vec<(String, StrategyChoice)> = recovery_shares
        .iter()
        .map(|&ppm| {
            let name = if recovery_shares.len() == 1 {
                "ecrec_k2_killed".to_string()
            } else {
                format!("ecrec_k2_killed_share{ppm}ppm")
            };
            (name, ecrec(2, 1, true, true, ppm))
        })
        .collect();
    if plan.full {
        runs.push((
            "full_killed".into(),
            StrategyChoice::Full {
                every_steps: (recovery_steps / 4).max(1),
            },
        ));
    }
    for (name, strategy) in runs {
        let name = name.as_str();
        if let StrategyChoice::EcRec { k, r, .. } = strategy {
            if (k + r) as u32 > servers {
                skipped.push(format!("{name}: needs {} servers", k + r));
                continue;
            }
        }
        let r = run_one(
            &recovery_base,
            name,
            strategy,
            Some(kill.clone()),
            &mut progress,
        )?;
        let f = r.failures.first();
        let share = f.and_then(|f| {
            let end = f.injected_t_s + f.recovered_s?;
            recovery_share(&r, f.injected_t_s, end)
        });
        let rebuild =
            r.ec.as_ref()
                .and_then(|e| e.rebuilds.iter().find(|b| b.finished_s.is_some()));
        let around = match (f, rebuild) {
            (Some(f), Some(b)) => b
                .joined_s
                .zip(b.finished_s)
                .and_then(|(j, e)| around_share(&r, f.injected_t_s, j, e)),
            _ => None,
        };
        let rebuild_share = match strategy {
            StrategyChoice::EcRec {
                rebuild_share_ppm, ..
            } => Some(ftrec_cluster::ecrec::rebuild_share_fraction(
                rebuild_share_ppm,
            )),
            _ => None,
        };
        recoveries.push(Recovery {
            strategy: strategy.name().into(),
            kill: kill.clone(),
            rebuild_share,
            resumed_s: f.and_then(|f| f.resumed_s),
            recovered_s: f.and_then(|f| f.recovered_s),
            rebuild_s: rebuild.and_then(|b| Some(b.finished_s? - b.joined_s?)),
            rebuild_throughput_share: rebuild.and_then(|b| b.throughput_share),
            range_throughput_share: rebuild
                .map_or(Vec::new(), |b| b.range_throughput_share.clone()),
            rebuild_throughput_share_around: around,
            kill_to_recovered_throughput_share: share,
            report: r,
        });
    }
    Ok(EcrecBench {
        asynchronous: !none_cfg.sync,
        steps,
        recovery_steps,
        kill_step,
        repeats,
        none,
        none_spread,
        none_cpu_spread,
        none_train_cpu_spread,
        variants,
        skipped,
        recoveries,
    })
}

pub fn run(run: RunArgs, plan: Plan) -> Result<()> {
    let json = run.json.clone();
    let mut args = run;
    args.json = None;
    let b = bench(&args, &plan)?;
    println!(
        "{} training, {} steps, {} repeats; recovery runs of {} steps killed after step {}",
        if b.asynchronous {
            "asynchronous"
        } else {
            "synchronous"
        },
        b.steps,
        b.repeats,
        b.recovery_steps,
        b.kill_step
    );
    for n in &b.none {
        println!(
            "none #{}: {:.2}s training, {:.0} samples/s, CPU while training {:.1}s servers + \
             {:.1}s workers (whole processes {:.1}s + {:.1}s), auc {}",
            n.repeat,
            n.train_s,
            n.samples_per_s,
            n.train_servers_cpu_s,
            n.train_workers_cpu_s,
            n.servers_cpu_s,
            n.workers_cpu_s,
            n.auc.map_or("-".into(), |a| format!("{a:.4}"))
        );
    }
    if !b.none.is_empty() {
        println!(
            "spread of the none runs: {:.1}% training time, {:.1}% CPU time while training, \
             {:.1}% whole processes",
            b.none_spread * 100.0,
            b.none_train_cpu_spread * 100.0,
            b.none_cpu_spread * 100.0
        );
    }
    for v in &b.variants {
        println!(
            "{}: training time {}, CPU time while training {} (servers' {}), whole \
             processes {} (servers' {}); {:.3} ms per commit, memory x{:.3} (code (k+r)/k = \
             {:.3})",
            v.name,
            Spread::pct(v.overhead),
            Spread::pct(v.train_cpu_overhead),
            Spread::pct(v.train_server_cpu_overhead),
            Spread::pct(v.cpu_overhead),
            Spread::pct(v.server_cpu_overhead),
            v.commit_per_update_s * 1e3,
            v.memory_overhead,
            v.code_overhead
        );
    }
    for s in &b.skipped {
        println!("skipped {s}");
    }
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}s"));
    let pct = |v: Option<f64>| v.map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
    for r in &b.recoveries {
        println!(
            "{}{} after {}: training resumed {}, fully recovered {} after the kill; throughput \
             from the kill to recovered {} of before",
            r.strategy,
            r.rebuild_share
                .map_or(String::new(), |s| format!(" (rebuild share {s})")),
            r.kill,
            secs(r.resumed_s),
            secs(r.recovered_s),
            pct(r.kill_to_recovered_throughput_share),
        );
        if r.rebuild_s.is_some() {
            println!(
                "  rebuild {} with training going on at {} of the throughput before the kill, \
                 {} of the mean of the {AROUND_S} s before the kill and after the rebuild (per \
                 lock range, of before: {})",
                secs(r.rebuild_s),
                pct(r.rebuild_throughput_share),
                pct(r.rebuild_throughput_share_around),
                r.range_throughput_share
                    .iter()
                    .map(|s| pct(*s))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Some(path) = json {
        crate::write_json(&path, &b)?;
    }
    Ok(())
}

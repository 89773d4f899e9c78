//! `ftrec bench ecrec`: ECRec's costs on one cluster configuration, measured in one
//! invocation (ecrec.txt §5), in asynchronous training by default (as the paper trains; `--sync`
//! for the deterministic mode):
//! - training-time overhead against no fault tolerance for the paper's variants (§5.2: all
//!   on, without dense replication, and without dense replication and 2PC), for k = 2 and
//!   k = 4, each run next to a `none` run and the whole set repeated (its order rotated by one
//!   each repeat), so that the spread of the `none` runs is reported next to the overheads it
//!   has to be smaller than; and the same as CPU time (user + system of the servers and
//!   workers), which the other load on a shared machine disturbs less than wall time, also as
//!   the CPU an update costs over `none`'s per committed transaction;
//! - the recovery from one SIGKILL (§5.3): time to training resumed, the rebuild's duration,
//!   and training throughput while it ran, as a whole and per lock range, its active bandwidth
//!   and CPU per MB, paced (the default) or for one or several fixed shares
//!   (`--rebuild-shares`); `full` checkpoints' recovery from the same kill, priced in its
//!   average case (reload + half of Young's interval) for comparison; `--recovery-repeats`
//!   rounds, interleaved, give means with 95% intervals. Recovery runs are longer than the overhead runs (`--recovery-steps`), so
//!   that a rebuild that yields to training finishes while training goes on;
//! - with a comma list of worker counts (`--workers 2,4,8,15`), a sweep: at each count `none`
//!   and ECRec all on (k = 2), interleaved per repeat, with the overhead's mean and 95%
//!   interval, CPU while training and the transactions' lock-wait share, and the recovery runs
//!   at the largest count;
//! - memory per server (`memory` in the JSON): each server's peak anonymous RSS over `none`'s
//!   for the same server, against a bound from the layout (1.25 x (r/k of its rows with their
//!   optimizer state + its dense replicas)), and the server's own breakdown of what it held
//!   ([`ftrec_cluster::memory::ServerMemory`]).

use anyhow::{bail, Result};
use ftrec_cluster::{RunReport, StrategyChoice};
use serde::Serialize;

use crate::flags::RunArgs;

/// Steps when `--steps` is not given: enough batches that a run's noise stays below the
/// effects measured (checked against the spread of the repeated `none` runs).
const DEFAULT_STEPS: u64 = 150;

/// Recovery runs take this many times the steps unless `--recovery-steps`: a rebuild that
/// yields to training (paced, or at a small fixed share) takes several times as long as at
/// the full share, and has to finish while training goes on, with the 10 s after it still
/// inside training, for its throughput to be measured (at 4x the steps a 32 s rebuild at a
/// share of 0.1 outlasted training).
const RECOVERY_STEPS_FACTOR: u64 = 8;

/// One run, reduced to what the comparison needs (the full report is kept too).
#[derive(Serialize)]
struct RunSummary {
    name: String,
    repeat: u32,
    workers: u32,
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
            workers: report.config.workers,
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

/// ECRec's CPU while training over the `none` run of the same repeat, in milliseconds per
/// committed transaction, one figure per pair (pairs where either run did not end normally,
/// or the ECRec run committed nothing, left out). Servers and workers share the cores, so a
/// ratio of times moves with the host's speed; the CPU an update costs moves much less.
fn extra_cpu_ms_per_txn<'a>(
    ecrec: impl IntoIterator<Item = &'a RunSummary>,
    none: &[&RunSummary],
) -> Vec<f64> {
    let trained = |r: &RunSummary| {
        r.report.cpu.train_servers_s.is_some() && r.report.cpu.train_workers_s.is_some()
    };
    ecrec
        .into_iter()
        .zip(none)
        .filter_map(|(e, n)| {
            let txns = e.report.ec.as_ref()?.steps_committed;
            (txns > 0 && trained(e) && trained(n))
                .then(|| (e.train_cpu_s() - n.train_cpu_s()) * 1e3 / txns as f64)
        })
        .collect()
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
    /// CPU (servers + workers) while training over the `none` run's, in ms per committed
    /// transaction ([`extra_cpu_ms_per_txn`]).
    extra_cpu_ms_per_txn: Option<MeanCi>,
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
    /// Rounds of recovery runs (each: every ECRec pace, then `full`).
    pub recovery_repeats: u32,
    /// Whether the `full` recovery run is made.
    pub full: bool,
    /// Whether any recovery run is made.
    pub recovery: bool,
    /// `--workers` as given: one count, or a comma list for a sweep ([`parse_worker_counts`]).
    pub workers: Option<String>,
}

/// The worker counts of `--workers` (`2,4,8,15`): whole numbers from 1, each once, in the
/// order given.
pub fn parse_worker_counts(text: &str) -> Result<Vec<u32>> {
    let mut counts = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let n: u32 = match part.parse() {
            Ok(n) if n >= 1 => n,
            _ => bail!(
                "--workers {text}: {part:?} is not a worker count (whole numbers from 1, \
                 separated by commas, e.g. 2,4,8,15)"
            ),
        };
        if counts.contains(&n) {
            bail!("--workers {text}: {n} is listed twice");
        }
        counts.push(n);
    }
    Ok(counts)
}

/// One worker count of a sweep: `none` against ECRec all on (k = 2, r = 1).
#[derive(Serialize)]
struct SweepPoint {
    workers: u32,
    repeats: u32,
    /// Mean samples/s of the `none` runs and of the ECRec runs.
    none_samples_per_s: f64,
    ecrec_samples_per_s: f64,
    /// ECRec's training time over the `none` run's of the same repeat, minus one: the mean,
    /// and the half-width of its 95% interval over the repeats (`None` for one repeat).
    overhead: Option<f64>,
    overhead_ci95: Option<f64>,
    /// The same in CPU time while training (servers + workers).
    train_cpu_overhead: Option<f64>,
    train_cpu_overhead_ci95: Option<f64>,
    /// Mean CPU seconds (servers + workers) while training.
    none_train_cpu_s: f64,
    ecrec_train_cpu_s: f64,
    /// ECRec's CPU while training over `none`'s in ms per committed transaction
    /// ([`extra_cpu_ms_per_txn`]): the mean over the repeats and its 95% half-width.
    extra_cpu_ms_per_txn: Option<f64>,
    extra_cpu_ms_per_txn_ci95: Option<f64>,
    /// Largest over smallest training time of the `none` runs at this count, minus one.
    none_spread: f64,
    /// Mean share of the ECRec transactions' time spent waiting for other transactions.
    lock_wait_share: Option<f64>,
    /// Its parts (means over the repeats): refused attempts, the gate, a node's slot, the
    /// vote held behind the transaction before.
    lock_wait: Option<ftrec_cluster::ecrec::LockWaitShares>,
    /// Mean transactions per ECRec run, and of them those prepared behind the one before.
    txns: f64,
    txns_behind: f64,
    /// Mean cost of one commit (both phases) as the worker coordinating it saw it.
    commit_per_update_s: f64,
    /// The ECRec recovery run at this count (the first one when several shares are run):
    /// throughput while the rebuild ran over the throughput before the kill, and seconds from
    /// the kill to training resumed.
    recovery_throughput_share: Option<f64>,
    resume_s: Option<f64>,
    /// Per server: ECRec's peak anonymous RSS minus `none`'s (means over the repeats).
    extra_rss_bytes: Vec<Option<i64>>,
}

/// One server's memory: ECRec against `none` and the layout's bound.
#[derive(Serialize)]
struct ServerMemoryRow {
    server: u32,
    /// Peak anonymous RSS, mean over the repeats, of the `none` and the ECRec runs.
    none_peak_anon_bytes: Option<u64>,
    ecrec_peak_anon_bytes: Option<u64>,
    extra_rss_bytes: Option<i64>,
    /// 1.25 x ((r/k) x the server's rows with their optimizer state + its dense replicas).
    bound_bytes: Option<u64>,
    /// What the server held (the first ECRec run at this count), and the allocator's view.
    breakdown: Option<ftrec_cluster::memory::ServerMemory>,
    /// The same server's figures in the `none` run.
    none_breakdown: Option<ftrec_cluster::memory::ServerMemory>,
}

/// Memory per server at one worker count (the largest of a sweep).
#[derive(Serialize)]
struct MemorySection {
    workers: u32,
    k: usize,
    r: usize,
    /// How the peaks were taken.
    method: String,
    servers: Vec<ServerMemoryRow>,
    /// Per server, in server order (the same figures as in `servers`).
    extra_rss_bytes: Vec<Option<i64>>,
    bound_bytes: Vec<Option<u64>>,
    /// Replacement processes of the ECRec recovery runs (a rebuild's memory), if any stopped
    /// normally at the end of their run.
    replacements: Vec<ftrec_cluster::memory::ServerMemory>,
}

/// The factor over the layout's redundancy a server's extra memory may take (buffers,
/// allocator slack) and still count as within its bound.
const MEMORY_BOUND_FACTOR: f64 = 1.25;

/// Mean peak anonymous RSS of server `id` over `runs`.
fn mean_peak(runs: &[&RunSummary], id: u32) -> Option<u64> {
    let v: Vec<u64> = runs
        .iter()
        .filter_map(|r| {
            r.report
                .server_memory
                .iter()
                .find(|m| m.server == id && m.generation == 0)
                .map(|m| m.peak_anon_bytes)
        })
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<u64>() / v.len() as u64)
}

fn first_memory(runs: &[&RunSummary], id: u32) -> Option<ftrec_cluster::memory::ServerMemory> {
    runs.iter().find_map(|r| {
        r.report
            .server_memory
            .iter()
            .find(|m| m.server == id && m.generation == 0)
            .cloned()
    })
}

/// [`MemorySection`] of `none` runs against ECRec (k, r) runs of one worker count.
fn memory_section(
    workers: u32,
    servers: u32,
    (k, r): (usize, usize),
    none: &[&RunSummary],
    ecrec: &[&RunSummary],
    recoveries: &[Recovery],
) -> MemorySection {
    let rows: Vec<ServerMemoryRow> = (0..servers)
        .map(|id| {
            let (n, e) = (mean_peak(none, id), mean_peak(ecrec, id));
            let breakdown = first_memory(ecrec, id);
            let bound = breakdown.as_ref().map(|m| {
                let p = &m.parts_max;
                (MEMORY_BOUND_FACTOR
                    * (r as f64 / k as f64 * p.rows_bytes as f64 + p.dense_replica_bytes as f64))
                    as u64
            });
            ServerMemoryRow {
                server: id,
                none_peak_anon_bytes: n,
                ecrec_peak_anon_bytes: e,
                extra_rss_bytes: n.zip(e).map(|(n, e)| e as i64 - n as i64),
                bound_bytes: bound,
                breakdown,
                none_breakdown: first_memory(none, id),
            }
        })
        .collect();
    MemorySection {
        workers,
        k,
        r,
        method: format!(
            "peak RssAnon of each server process, sampled by the process every {} ms from \
             serving to its stop; mean over the repeats",
            ftrec_cluster::memory::SAMPLE_EVERY.as_millis()
        ),
        extra_rss_bytes: rows.iter().map(|r| r.extra_rss_bytes).collect(),
        bound_bytes: rows.iter().map(|r| r.bound_bytes).collect(),
        servers: rows,
        replacements: recoveries
            .iter()
            .filter(|r| r.strategy == "ecrec")
            .flat_map(|r| r.report.server_memory.iter().filter(|m| m.generation > 0))
            .cloned()
            .collect(),
    }
}

/// The recovery from one kill.
#[derive(Serialize)]
struct Recovery {
    /// The round of recovery runs it belongs to (`--recovery-repeats`).
    round: u32,
    strategy: String,
    kill: String,
    /// ECRec: the rebuild share the run had (a fraction of the time; where it starts when
    /// paced).
    rebuild_share: Option<f64>,
    /// ECRec: the training throughput the pacer kept during the rebuild, as a fraction of
    /// before (`None`: a fixed share).
    rebuild_min_throughput: Option<f64>,
    /// ECRec: the rebuild's active bandwidth (MB rebuilt over the time its batches worked,
    /// rests between them excluded), its bandwidth over its whole window, MB rebuilt, the
    /// working seconds, the share of them spent switching locks (ECRec §3.4), and the
    /// replacement's CPU seconds per MB rebuilt (training steps it served meanwhile
    /// included).
    rebuild_mb_per_s: Option<f64>,
    rebuild_wall_mb_per_s: Option<f64>,
    rebuild_mb: Option<f64>,
    rebuild_busy_s: Option<f64>,
    rebuild_lock_share: Option<f64>,
    rebuild_cpu_s_per_mb: Option<f64>,
    /// ECRec: the shares the pacer set, (seconds after the run started, share).
    rebuild_shares_set: Vec<(f64, f64)>,
    /// ECRec: full checkpointing's reload plus average redo on the same workload
    /// ([`full_reload_redo`]; `None` without a `full` recovery run), and that over ECRec's
    /// kill-to-recovered time.
    full_reload_redo_s: Option<f64>,
    full_speedup: Option<f64>,
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
    /// The CPUs every run's servers and workers were started on (`None`: any).
    server_cpus: Option<ftrec_cluster::cpus::CpuSet>,
    worker_cpus: Option<ftrec_cluster::cpus::CpuSet>,
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
    /// The recoveries of each strategy and pace over the rounds: means with 95% intervals.
    recovery_summary: Vec<RecoverySummary>,
    /// One entry per worker count (one entry without a sweep).
    sweep: Vec<SweepPoint>,
    /// Memory per server at the largest worker count (`None` when no ECRec k = 2 run was
    /// made next to a `none` run).
    memory: Option<MemorySection>,
}

/// A figure over the rounds: mean, half-width of its 95% interval (`None` from one run),
/// and the runs it comes from.
#[derive(Serialize, Clone, Copy)]
struct MeanCi {
    mean: f64,
    ci95: Option<f64>,
    runs: usize,
}

impl MeanCi {
    fn of(v: &[f64]) -> Option<MeanCi> {
        let (mean, ci95) = crate::timeline::mean_ci95(v)?;
        Some(MeanCi {
            mean,
            ci95,
            runs: v.len(),
        })
    }

    fn show(s: Option<MeanCi>, scale: f64, unit: &str) -> String {
        match s {
            Some(MeanCi {
                mean,
                ci95: Some(c),
                runs,
            }) => format!("{:.2}{unit} ± {:.2} ({runs} runs)", mean * scale, c * scale),
            Some(MeanCi { mean, .. }) => format!("{:.2}{unit} (1 run)", mean * scale),
            None => "-".into(),
        }
    }
}

/// The recoveries of one strategy and pace over the rounds.
#[derive(Serialize)]
struct RecoverySummary {
    strategy: String,
    rebuild_share: Option<f64>,
    rebuild_min_throughput: Option<f64>,
    resumed_s: Option<MeanCi>,
    recovered_s: Option<MeanCi>,
    rebuild_s: Option<MeanCi>,
    rebuild_throughput_share: Option<MeanCi>,
    rebuild_mb_per_s: Option<MeanCi>,
    rebuild_cpu_s_per_mb: Option<MeanCi>,
    full_reload_redo_s: Option<MeanCi>,
    full_speedup: Option<MeanCi>,
}

fn summarize_recoveries(recoveries: &[Recovery]) -> Vec<RecoverySummary> {
    let mut out: Vec<RecoverySummary> = Vec::new();
    let key = |r: &Recovery| {
        (
            r.strategy.clone(),
            r.rebuild_share.map(f64::to_bits),
            r.rebuild_min_throughput.map(f64::to_bits),
        )
    };
    let mut seen = Vec::new();
    for r in recoveries {
        let k = key(r);
        if seen.contains(&k) {
            continue;
        }
        seen.push(k.clone());
        let mine: Vec<&Recovery> = recoveries.iter().filter(|x| key(x) == k).collect();
        let spread = |f: &dyn Fn(&Recovery) -> Option<f64>| {
            MeanCi::of(&mine.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        out.push(RecoverySummary {
            strategy: r.strategy.clone(),
            rebuild_share: r.rebuild_share,
            rebuild_min_throughput: r.rebuild_min_throughput,
            resumed_s: spread(&|r| r.resumed_s),
            recovered_s: spread(&|r| r.recovered_s),
            rebuild_s: spread(&|r| r.rebuild_s),
            rebuild_throughput_share: spread(&|r| r.rebuild_throughput_share),
            rebuild_mb_per_s: spread(&|r| r.rebuild_mb_per_s),
            rebuild_cpu_s_per_mb: spread(&|r| r.rebuild_cpu_s_per_mb),
            full_reload_redo_s: spread(&|r| r.full_reload_redo_s),
            full_speedup: spread(&|r| r.full_speedup),
        });
    }
    out
}

/// Job MTBF the average case of full checkpointing is priced at: one hour.
const FULL_MTBF_S: f64 = 3600.0;

/// Full checkpointing's recovery in its average case, from a run of `full` with a kill: the
/// measured reload plus half of Young's interval for a job MTBF of [`FULL_MTBF_S`], with the
/// save cost (mean pause per save) measured in the same run. `None` without a save or a
/// reload.
fn full_reload_redo(r: &RunReport) -> Option<f64> {
    if r.checkpoints == 0 || r.overheads.o_load <= 0.0 {
        return None;
    }
    let save = r.checkpoint_pause_s / r.checkpoints as f64;
    let young = ftrec_strategy::policy::young_interval(save, FULL_MTBF_S);
    Some(r.overheads.o_load + young / 2.0)
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
    (rebuild_share_ppm, rebuild_min_throughput_ppm): Pace,
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
        rebuild_min_throughput_ppm,
        backstop_every_steps: None,
    }
}

/// How a recovery run's rebuild is paced: its (starting) share in millionths, and the
/// training throughput its pacer keeps (`None`: the share is fixed).
type Pace = (u32, Option<u32>);

/// Fill `v`'s ratios from its runs against the `none` runs of the same repeats.
fn compare_variant(v: &mut Variant, none: &[&RunSummary]) {
    let per = |f: &dyn Fn(&RunSummary) -> f64| -> Vec<f64> {
        v.runs
            .iter()
            .zip(none)
            .map(|(r, n)| f(r) / f(n).max(1e-9) - 1.0)
            .collect()
    };
    v.overhead = Spread::of(&per(&|r| r.train_s));
    v.train_cpu_overhead = Spread::of(&per(&|r| r.train_cpu_s()));
    v.train_server_cpu_overhead = Spread::of(&per(&|r| r.train_servers_cpu_s));
    v.cpu_overhead = Spread::of(&per(&|r| r.cpu_s()));
    v.server_cpu_overhead = Spread::of(&per(&|r| r.servers_cpu_s));
    let ecs: Vec<_> = v.runs.iter().filter_map(|r| r.report.ec.clone()).collect();
    v.commit_per_update_s = ecs.iter().map(|e| e.per_step_s).sum::<f64>() / ecs.len().max(1) as f64;
    v.extra_cpu_ms_per_txn = MeanCi::of(&extra_cpu_ms_per_txn(&v.runs, none));
    if let Some(e) = ecs.first() {
        v.memory_overhead = e.memory.overhead;
        v.code_overhead = e.memory.code_overhead;
    }
}

/// Largest over smallest of `f` over `runs`, minus one (0 without runs).
fn spread_of(runs: &[&RunSummary], f: &dyn Fn(&RunSummary) -> f64) -> f64 {
    if runs.is_empty() {
        return 0.0;
    }
    let v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    max / min.max(1e-9) - 1.0
}

/// The sweep entry of `workers` from its `none` runs and ECRec all-on (k = 2) runs.
fn sweep_point(
    workers: u32,
    none: &[&RunSummary],
    ecrec: &[&RunSummary],
    servers: u32,
) -> SweepPoint {
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let ratios = |f: &dyn Fn(&RunSummary) -> f64| -> Vec<f64> {
        ecrec
            .iter()
            .zip(none)
            .map(|(e, n)| f(e) / f(n).max(1e-9) - 1.0)
            .collect()
    };
    let overhead = crate::timeline::mean_ci95(&ratios(&|r| r.train_s));
    let cpu = crate::timeline::mean_ci95(&ratios(&|r| r.train_cpu_s()));
    let per_txn = crate::timeline::mean_ci95(&extra_cpu_ms_per_txn(ecrec.iter().copied(), none));
    let of = |runs: &[&RunSummary], f: &dyn Fn(&RunSummary) -> f64| {
        mean(&runs.iter().map(|r| f(r)).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let ecs: Vec<_> = ecrec.iter().filter_map(|r| r.report.ec.as_ref()).collect();
    SweepPoint {
        workers,
        repeats: ecrec.len() as u32,
        none_samples_per_s: of(none, &|r| r.samples_per_s),
        ecrec_samples_per_s: of(ecrec, &|r| r.samples_per_s),
        overhead: overhead.map(|o| o.0),
        overhead_ci95: overhead.and_then(|o| o.1),
        train_cpu_overhead: cpu.map(|o| o.0),
        train_cpu_overhead_ci95: cpu.and_then(|o| o.1),
        none_train_cpu_s: of(none, &|r| r.train_cpu_s()),
        ecrec_train_cpu_s: of(ecrec, &|r| r.train_cpu_s()),
        extra_cpu_ms_per_txn: per_txn.map(|o| o.0),
        extra_cpu_ms_per_txn_ci95: per_txn.and_then(|o| o.1),
        none_spread: spread_of(none, &|r| r.train_s),
        lock_wait_share: mean(&ecs.iter().map(|e| e.lock_wait_share).collect::<Vec<_>>()),
        lock_wait: (!ecs.is_empty()).then(|| {
            let m = |f: &dyn Fn(&ftrec_cluster::ecrec::LockWaitShares) -> f64| {
                mean(&ecs.iter().map(|e| f(&e.lock_wait)).collect::<Vec<_>>()).unwrap_or(0.0)
            };
            ftrec_cluster::ecrec::LockWaitShares {
                refused: m(&|w| w.refused),
                gate: m(&|w| w.gate),
                slot: m(&|w| w.slot),
                behind: m(&|w| w.behind),
            }
        }),
        txns: mean(
            &ecs.iter()
                .map(|e| e.steps_committed as f64)
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0),
        txns_behind: mean(&ecs.iter().map(|e| e.txns_behind as f64).collect::<Vec<_>>())
            .unwrap_or(0.0),
        commit_per_update_s: mean(&ecs.iter().map(|e| e.per_step_s).collect::<Vec<_>>())
            .unwrap_or(0.0),
        recovery_throughput_share: None,
        resume_s: None,
        extra_rss_bytes: (0..servers)
            .map(|id| {
                mean_peak(none, id)
                    .zip(mean_peak(ecrec, id))
                    .map(|(n, e)| e as i64 - n as i64)
            })
            .collect(),
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
    if plan.recovery_repeats == 0 {
        bail!("--recovery-repeats must be at least 1 (use --no-recovery to leave the recovery runs out)");
    }
    if !plan.rebuild_shares.is_empty() && flags.rebuild_share.is_some() {
        bail!("give either --rebuild-share or --rebuild-shares, not both");
    }
    // Checked before any run, so that a bad count fails at once.
    let counts = match &plan.workers {
        Some(text) => parse_worker_counts(text)?,
        None => Vec::new(),
    };
    // A sweep: several counts. One count (or none given) is the bench as it always ran.
    let sweeping = counts.len() > 1;
    let mut run = run.clone();
    if let [n] = counts[..] {
        run.workers = Some(n);
    }
    let mut base = crate::cluster_cmd::merge(&run)?;
    base.steps = base.steps.or(Some(DEFAULT_STEPS));
    base.strategy = Some("none".into());
    let none_cfg = crate::cluster_cmd::run_config(&base)?;
    let steps = none_cfg.steps;
    let servers = none_cfg.servers;
    let counts: Vec<u32> = if sweeping {
        counts
    } else {
        vec![none_cfg.workers]
    };
    // The pace the flags give (paced to a throughput target unless --rebuild-share fixes it),
    // checked before any run, so that a bad share fails at once.
    let share: Pace = match flags.strategy()? {
        StrategyChoice::EcRec {
            rebuild_share_ppm,
            rebuild_min_throughput_ppm,
            ..
        } => (rebuild_share_ppm, rebuild_min_throughput_ppm),
        _ => unreachable!("EcFlags::strategy gives ecrec"),
    };
    let recovery_shares: Vec<Pace> = if !plan.recovery {
        Vec::new()
    } else if plan.rebuild_shares.is_empty() {
        vec![share]
    } else {
        plan.rebuild_shares
            .iter()
            .map(|&f| {
                let ppm = ftrec_cluster::ecrec::rebuild_share_ppm(f).map_err(|_| {
                    anyhow::anyhow!(
                        "--rebuild-shares {f} is out of range (fractions of the time from 0 to 1)"
                    )
                })?;
                Ok((ppm, None))
            })
            .collect::<Result<_>>()?
    };
    let full = plan.full && plan.recovery;
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
    // The recovery runs at the largest worker count.
    let largest = counts.iter().copied().max().unwrap_or(none_cfg.workers);
    let mut recovery_base = base.clone();
    recovery_base.steps = Some(recovery_steps);
    if sweeping {
        recovery_base.workers = Some(largest);
    }
    // The paper's ablation (§5.2): all on, no dense replication, no dense replication and no
    // 2PC; all on with k = 4 as well. A sweep runs all on with k = 2 only.
    let shapes: Vec<(usize, bool, bool)> = if sweeping {
        vec![(2, true, true)]
    } else {
        vec![
            (2, true, true),
            (2, true, false),
            (2, false, false),
            (4, true, true),
        ]
    };
    let mut skipped = Vec::new();
    // Per worker count, its variants.
    let mut variants: Vec<(u32, Variant)> = Vec::new();
    // `--repeat 0`: the recovery runs only, no variant to compare.
    let shapes = if repeats == 0 { Vec::new() } else { shapes };
    for &w in &counts {
        for &(k, two_phase, dense) in &shapes {
            let name = format!(
                "ecrec_k{k}{}{}{}",
                if dense { "" } else { "_norep" },
                if two_phase { "" } else { "_no2pc" },
                if sweeping {
                    format!("_w{w}")
                } else {
                    String::new()
                }
            );
            if k as u32 + 1 > servers {
                skipped.push(format!(
                    "{name}: needs {} servers, the run has {servers}",
                    k + 1
                ));
                continue;
            }
            variants.push((
                w,
                Variant {
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
                    extra_cpu_ms_per_txn: None,
                    memory_overhead: 0.0,
                    code_overhead: 0.0,
                    runs: Vec::new(),
                },
            ));
        }
    }
    // Each repeat: `none` and every variant, in an order that rotates by one each repeat; a
    // variant's ratios are against the `none` run of its own repeat (and worker count), so
    // slow drifts of the machine's load cancel out.
    let total = repeats as usize * (counts.len() + variants.len())
        + plan.recovery_repeats as usize * (recovery_shares.len() + usize::from(full));
    eprintln!(
        "bench ecrec: {total} runs (tens of minutes on two cores; each run's line gives the \
         time left)"
    );
    let mut progress = crate::progress::Runs::new("bench ecrec", total);
    let mut none = Vec::new();
    for &w in &counts {
        let mut at = base.clone();
        let tag = if sweeping {
            at.workers = Some(w);
            format!("_w{w}")
        } else {
            String::new()
        };
        let here: Vec<usize> = (0..variants.len())
            .filter(|&i| variants[i].0 == w)
            .collect();
        for rep in 0..repeats {
            // `none` and the variants in turn, the turn moved on by one each repeat: no run
            // always comes first or right after another.
            let slots = here.len() + 1;
            for j in 0..slots {
                let slot = (j + rep as usize) % slots;
                if slot == 0 {
                    let n = run_one(
                        &at,
                        &format!("none{tag}_{rep}"),
                        StrategyChoice::None,
                        None,
                        &mut progress,
                    )?;
                    none.push(RunSummary::of("none", rep, n));
                    continue;
                }
                let v = &mut variants[here[slot - 1]].1;
                let name = v.name.trim_end_matches(&tag).to_string();
                let r = run_one(
                    &at,
                    &format!("{name}{tag}_{rep}"),
                    ecrec(v.k, v.r, v.two_phase, v.dense_replication, share),
                    None,
                    &mut progress,
                )?;
                v.runs.push(RunSummary::of(&v.name, rep, r));
            }
        }
    }
    let none_at = |w: u32| -> Vec<&RunSummary> { none.iter().filter(|n| n.workers == w).collect() };
    for (w, v) in &mut variants {
        compare_variant(v, &none_at(*w));
    }
    let all: Vec<&RunSummary> = none.iter().collect();
    // The spread of the `none` runs: over all of them, or the largest of a sweep's counts.
    let (none_spread, none_cpu_spread, none_train_cpu_spread) = {
        let worst = |f: &dyn Fn(&RunSummary) -> f64| {
            if sweeping {
                counts
                    .iter()
                    .map(|&w| spread_of(&none_at(w), f))
                    .fold(0.0, f64::max)
            } else {
                spread_of(&all, f)
            }
        };
        (
            worst(&|r| r.train_s),
            worst(&|r| r.cpu_s()),
            worst(&|r| r.train_cpu_s()),
        )
    };
    let kill = format!("server={kill_server}@step={kill_step}");
    let mut recoveries = Vec::new();
    let mut runs: Vec<(String, StrategyChoice)> = recovery_shares
        .iter()
        .map(|&pace| {
            let name = if recovery_shares.len() == 1 {
                "ecrec_k2_killed".to_string()
            } else {
                format!("ecrec_k2_killed_share{}ppm", pace.0)
            };
            (name, ecrec(2, 1, true, true, pace))
        })
        .collect();
    if full {
        runs.push((
            "full_killed".into(),
            StrategyChoice::Full {
                every_steps: (recovery_steps / 4).max(1),
            },
        ));
    }
    let rounds = plan.recovery_repeats;
    let runs: Vec<(u32, String, StrategyChoice)> = (0..rounds)
        .flat_map(|round| {
            runs.iter().map(move |(name, st)| {
                let name = if rounds > 1 {
                    format!("{name}_{round}")
                } else {
                    name.clone()
                };
                (round, name, *st)
            })
        })
        .collect();
    for (round, name, strategy) in runs {
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
        let (rebuild_share, rebuild_min_throughput) = match strategy {
            StrategyChoice::EcRec {
                rebuild_share_ppm,
                rebuild_min_throughput_ppm,
                ..
            } => (
                Some(ftrec_cluster::ecrec::rebuild_share_fraction(
                    rebuild_share_ppm,
                )),
                rebuild_min_throughput_ppm.map(ftrec_cluster::ecrec::rebuild_share_fraction),
            ),
            _ => (None, None),
        };
        let mb = |b: &ftrec_cluster::ecrec::RebuildReport| b.bytes as f64 / 1e6;
        recoveries.push(Recovery {
            round,
            strategy: strategy.name().into(),
            kill: kill.clone(),
            rebuild_share,
            rebuild_min_throughput,
            rebuild_mb_per_s: rebuild.and_then(|b| b.mb_per_s),
            rebuild_wall_mb_per_s: rebuild.and_then(|b| {
                let t = b.finished_s? - b.joined_s?;
                (t > 0.0).then(|| mb(b) / t)
            }),
            rebuild_mb: rebuild.map(mb),
            rebuild_busy_s: rebuild.map(|b| b.busy_s),
            rebuild_lock_share: rebuild.and_then(|b| (b.busy_s > 0.0).then(|| b.lock_s / b.busy_s)),
            rebuild_cpu_s_per_mb: rebuild.and_then(|b| b.cpu_s_per_mb),
            rebuild_shares_set: rebuild.map_or(Vec::new(), |b| b.shares.clone()),
            full_reload_redo_s: None,
            full_speedup: None,
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
    // Full checkpointing's reload plus average redo on the same workload, from its own
    // recovery run: what each ECRec recovery is compared with (ECRec §5.3, Fig. 12).
    // Each ECRec run against the `full` run of its own round.
    let fulls: Vec<(u32, Option<f64>)> = recoveries
        .iter()
        .filter(|r| r.strategy == "full")
        .map(|r| (r.round, full_reload_redo(&r.report)))
        .collect();
    for r in recoveries.iter_mut().filter(|r| r.strategy == "ecrec") {
        let rr = fulls.iter().find(|f| f.0 == r.round).and_then(|f| f.1);
        r.full_reload_redo_s = rr;
        r.full_speedup = rr.zip(r.recovered_s).map(|(f, e)| f / e.max(1e-9));
    }
    let recovery_summary = summarize_recoveries(&recoveries);
    // The sweep: ECRec all on (k = 2, with 2PC and dense replication) at every count.
    let all_on = |v: &Variant| v.k == 2 && v.two_phase && v.dense_replication;
    let mut sweep: Vec<SweepPoint> = Vec::new();
    let mut memory = None;
    for &w in &counts {
        let Some((_, v)) = variants.iter().find(|(vw, v)| *vw == w && all_on(v)) else {
            continue;
        };
        let ecrec_runs: Vec<&RunSummary> = v.runs.iter().collect();
        let mut p = sweep_point(w, &none_at(w), &ecrec_runs, servers);
        if w == largest {
            if let Some(rec) = recoveries.iter().find(|r| r.strategy == "ecrec") {
                p.recovery_throughput_share = rec.rebuild_throughput_share;
                p.resume_s = rec.resumed_s;
            }
            memory = Some(memory_section(
                w,
                servers,
                (v.k, v.r),
                &none_at(w),
                &ecrec_runs,
                &recoveries,
            ));
        }
        sweep.push(p);
    }
    Ok(EcrecBench {
        asynchronous: !none_cfg.sync,
        server_cpus: none_cfg.server_cpus.clone(),
        worker_cpus: none_cfg.worker_cpus.clone(),
        steps,
        recovery_steps,
        kill_step,
        repeats,
        none,
        none_spread,
        none_cpu_spread,
        none_train_cpu_spread,
        variants: variants.into_iter().map(|(_, v)| v).collect(),
        skipped,
        recoveries,
        recovery_summary,
        sweep,
        memory,
    })
}

pub fn run(run: RunArgs, plan: Plan) -> Result<()> {
    let json = run.json.clone();
    let mut args = run;
    args.json = None;
    let b = bench(&args, &plan)?;
    let cpus = |c: &Option<ftrec_cluster::cpus::CpuSet>| {
        c.as_ref().map_or("any".to_string(), ToString::to_string)
    };
    println!(
        "{} training, {} steps, {} repeats; recovery runs of {} steps killed after step {}; \
         servers on CPUs {}, workers on CPUs {}",
        if b.asynchronous {
            "asynchronous"
        } else {
            "synchronous"
        },
        b.steps,
        b.repeats,
        b.recovery_steps,
        b.kill_step,
        cpus(&b.server_cpus),
        cpus(&b.worker_cpus)
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
             processes {} (servers' {}); {:.3} ms per commit, CPU per commit over none's {}, \
             memory x{:.3} (code (k+r)/k = {:.3})",
            v.name,
            Spread::pct(v.overhead),
            Spread::pct(v.train_cpu_overhead),
            Spread::pct(v.train_server_cpu_overhead),
            Spread::pct(v.cpu_overhead),
            Spread::pct(v.server_cpu_overhead),
            v.commit_per_update_s * 1e3,
            MeanCi::show(v.extra_cpu_ms_per_txn, 1.0, " ms"),
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
            match (r.rebuild_min_throughput, r.rebuild_share) {
                (Some(t), Some(s)) => format!(
                    " (rebuild paced to keep {:.0}% of training's throughput, from share {s})",
                    t * 100.0
                ),
                (None, Some(s)) => format!(" (rebuild share {s})"),
                _ => String::new(),
            },
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
            let num =
                |v: Option<f64>, unit: &str| v.map_or("-".into(), |x| format!("{x:.1}{unit}"));
            println!(
                "  rebuilt {} MB: active bandwidth {} ({} working, {} of it switching locks), \
                 {} over its window; replacement CPU {} per MB",
                num(r.rebuild_mb, ""),
                num(r.rebuild_mb_per_s, " MB/s"),
                secs(r.rebuild_busy_s),
                pct(r.rebuild_lock_share),
                num(r.rebuild_wall_mb_per_s, " MB/s"),
                r.rebuild_cpu_s_per_mb
                    .map_or("-".into(), |x| format!("{:.1} ms", x * 1e3)),
            );
            if let Some(f) = r.full_reload_redo_s {
                println!(
                    "  full checkpointing's reload + average redo (half of Young's interval, \
                     MTBF {FULL_MTBF_S} s): {}; ECRec's kill to recovered is {} faster",
                    secs(Some(f)),
                    r.full_speedup.map_or("-".into(), |x| format!("{x:.1}x")),
                );
            }
        }
    }
    if b.recoveries.iter().any(|r| r.round > 0) {
        println!("over the rounds (mean ± 95% interval):");
        for m in &b.recovery_summary {
            println!(
                "  {}{}: kill to resumed {}, to recovered {}; rebuild {} at {} of the throughput \
                 before, active {}, replacement CPU {} per MB; full's reload + average redo {}, \
                 ECRec {} faster",
                m.strategy,
                m.rebuild_min_throughput
                    .map(|t| format!(" (paced to {:.0}%)", t * 100.0))
                    .or(m.rebuild_share.map(|s| format!(" (share {s})")))
                    .unwrap_or_default(),
                MeanCi::show(m.resumed_s, 1.0, " s"),
                MeanCi::show(m.recovered_s, 1.0, " s"),
                MeanCi::show(m.rebuild_s, 1.0, " s"),
                MeanCi::show(m.rebuild_throughput_share, 100.0, "%"),
                MeanCi::show(m.rebuild_mb_per_s, 1.0, " MB/s"),
                MeanCi::show(m.rebuild_cpu_s_per_mb, 1e3, " ms"),
                MeanCi::show(m.full_reload_redo_s, 1.0, " s"),
                MeanCi::show(m.full_speedup, 1.0, "x"),
            );
        }
    }
    if b.sweep.len() > 1 {
        print!("{}", sweep_table(&b.sweep));
    }
    if let Some(m) = &b.memory {
        print!("{}", memory_table(m));
    }
    if let Some(path) = json {
        crate::write_json(&path, &b)?;
    }
    Ok(())
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1 << 20) as f64)
}

/// The sweep as a table: one row per worker count.
fn sweep_table(sweep: &[SweepPoint]) -> String {
    // A mean with its 95% half-width where there is one: `scale`d, signed or not, `unit`.
    let show = |v: Option<f64>, ci: Option<f64>, scale: f64, unit: &str, signed: bool| match v {
        Some(v) => {
            let m = if signed {
                format!("{:+.1}{unit}", v * scale)
            } else {
                format!("{:.1}{unit}", v * scale)
            };
            ci.map_or(m.clone(), |c| format!("{m} ± {:.1}", c * scale))
        }
        None => "-".into(),
    };
    let pct = |v: Option<f64>, ci: Option<f64>| show(v, ci, 100.0, "%", true);
    let mut s = String::from(
        "workers | none samples/s | ecrec samples/s | overhead (95%) | CPU while training none / \
         ecrec | CPU overhead | extra CPU per commit (ms) | lock wait (refused / gate / slot / \
         behind) | behind the one before | ms per commit | recovery throughput | resumed\n",
    );
    for p in sweep {
        let parts = p.lock_wait.map_or(String::new(), |w| {
            format!(
                " ({:.0} / {:.0} / {:.0} / {:.0})",
                w.refused * 100.0,
                w.gate * 100.0,
                w.slot * 100.0,
                w.behind * 100.0
            )
        });
        s += &format!(
            "{} | {:.0} | {:.0} | {} | {:.1}s / {:.1}s | {} | {} | {}{parts} | {:.0} of {:.0} | {:.2} \
             | {} | {}\n",
            p.workers,
            p.none_samples_per_s,
            p.ecrec_samples_per_s,
            pct(p.overhead, p.overhead_ci95),
            p.none_train_cpu_s,
            p.ecrec_train_cpu_s,
            pct(p.train_cpu_overhead, p.train_cpu_overhead_ci95),
            show(
                p.extra_cpu_ms_per_txn,
                p.extra_cpu_ms_per_txn_ci95,
                1.0,
                "",
                false
            ),
            p.lock_wait_share
                .map_or("-".into(), |l| format!("{:.0}%", l * 100.0)),
            p.txns_behind,
            p.txns,
            p.commit_per_update_s * 1e3,
            p.recovery_throughput_share
                .map_or("-".into(), |l| format!("{:.0}%", l * 100.0)),
            p.resume_s.map_or("-".into(), |l| format!("{l:.2}s")),
        );
    }
    s
}

/// The memory section as a table: one row per server, MiB.
fn memory_table(m: &MemorySection) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), mib);
    let mut s = format!(
        "memory at {} workers (MiB; {}):\nserver | none peak anon | ecrec peak anon | extra | \
         bound | rows+state | parity | dense replicas | prepared | staged deltas | waiting \
         shares (most prepares) | heap in use / free kept at peak | threads\n",
        m.workers, m.method
    );
    for r in &m.servers {
        let b = r.breakdown.as_ref();
        let part = |f: &dyn Fn(&ftrec_cluster::memory::MemoryParts) -> u64| {
            opt(b.map(|b| f(&b.parts_max) as f64))
        };
        s += &format!(
            "{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}\n",
            r.server,
            opt(r.none_peak_anon_bytes.map(|v| v as f64)),
            opt(r.ecrec_peak_anon_bytes.map(|v| v as f64)),
            opt(r.extra_rss_bytes.map(|v| v as f64)),
            opt(r.bound_bytes.map(|v| v as f64)),
            part(&|p| p.rows_bytes),
            part(&|p| p.parity_bytes),
            part(&|p| p.dense_replica_bytes),
            part(&|p| p.prepared_bytes),
            part(&|p| p.staged_bytes),
            b.map_or("-".into(), |b| format!(
                "{} ({})",
                mib(b.parts_max.waiting_bytes as f64),
                b.parts_max.waiting_prepares
            )),
            b.map_or("-".into(), |b| format!(
                "{} / {}",
                mib(b.heap_at_peak.in_use_bytes as f64),
                mib(b.heap_at_peak.free_kept_bytes as f64)
            )),
            b.map_or("-".into(), |b| b.peak_threads.to_string()),
        );
    }
    for r in &m.replacements {
        s += &format!(
            "replacement of server {} (generation {}): peak anon {} MiB, rows+state {}, parity \
             {}, rebuild record {}, heap in use / free kept at peak {} / {}\n",
            r.server,
            r.generation,
            mib(r.peak_anon_bytes as f64),
            mib(r.parts_max.rows_bytes as f64),
            mib(r.parts_max.parity_bytes as f64),
            mib(r.parts_max.rebuild_bytes as f64),
            mib(r.heap_at_peak.in_use_bytes as f64),
            mib(r.heap_at_peak.free_kept_bytes as f64),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_counts_parse_and_a_bad_one_names_the_flag() {
        assert_eq!(parse_worker_counts("2,4, 8,15").unwrap(), vec![2, 4, 8, 15]);
        assert_eq!(parse_worker_counts("3").unwrap(), vec![3]);
        for (bad, needle) in [
            ("2,x", "\"x\" is not a worker count"),
            ("2,,4", "\"\" is not a worker count"),
            ("0", "\"0\" is not a worker count"),
            ("-1", "\"-1\" is not a worker count"),
            ("4,2,4", "4 is listed twice"),
        ] {
            let e = parse_worker_counts(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--workers {bad}: ")), "{bad}: {e}");
            assert!(e.contains(needle), "{bad}: {e}");
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn the_flag_takes_a_list_and_leaves_the_other_run_flags_alone() {
        use clap::Parser;
        let cli = crate::flags::Cli::try_parse_from([
            "ftrec",
            "bench",
            "ecrec",
            "--workers",
            "2,4,8",
            "--servers",
            "5",
        ])
        .unwrap();
        let crate::flags::Cmd::Bench {
            cmd: crate::flags::BenchCmd::Ecrec { run, .. },
        } = cli.cmd
        else {
            panic!("not bench ecrec");
        };
        assert_eq!(run.workers.as_deref(), Some("2,4,8"));
        assert_eq!(run.run.workers, None);
        assert_eq!(run.run.servers, Some(5));
        // `ftrec run` keeps its number.
        assert!(crate::flags::Cli::try_parse_from(["ftrec", "run", "--workers", "2,4"]).is_err());
    }
}

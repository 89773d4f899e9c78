//! `ftrec compare`: every strategy on one workload with one failure schedule.
//!
//! One invocation runs the failure-free `none` run first (the reference for overhead and model
//! quality), then every other strategy through [`ftrec_cluster::run`] with the same
//! configuration except the strategy, the same samples and the same kills, and writes to the
//! output directory: `report.json` (every run's full report, the measurements around them and a
//! summary), `report.md` and a self-contained `report.html`, and the plots as PNG and SVG
//! ([`crate::plot`]). Everything here is generic over what every [`RunReport`] carries; a
//! strategy's own part of its report (ECRec's `ec`, DECK's `store`, ...) goes into
//! `report.json` whole.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use ftrec_cluster::{EventKind, KillAt, KillSpec, Role, RunConfig, RunReport, StrategyChoice};
use ftrec_sim::{FailureDist, Machine, Measured, MeasuredFailure};
use serde::{Deserialize, Serialize};

use crate::flags::OptimizerArgs;

/// Flags of `ftrec compare`.
#[derive(Args, Debug, Clone, Default)]
pub struct CompareArgs {
    /// Workload preset: tiny, small, kaggle32 or kaggle [default: tiny].
    #[arg(long)]
    pub preset: Option<String>,
    /// Parameter-server processes [default: 3, enough for ecrec's k = 2, r = 1].
    #[arg(long)]
    pub servers: Option<u32>,
    /// Worker processes [default: 2].
    #[arg(long)]
    pub workers: Option<u32>,
    /// Synchronous deterministic mode (needed by ecrec; the digests then compare bit for bit).
    #[arg(long)]
    pub sync: bool,
    /// Training steps of every run [default: the preset's; with --data and --epochs, the
    /// steps of those passes].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Criteo TSV data instead of the synthetic stream: `ftrec run`'s data flags, the same
    /// held-out split (every --holdout-every-th line) for every strategy.
    #[command(flatten)]
    pub data: crate::flags::DataArgs,
    /// Samples per worker per step [default: the preset's].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of the model, the data and (unless --failure-seed) the failure schedule [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seed of the failure schedule drawn with --mtbf-s [default: --seed].
    #[arg(long)]
    pub failure_seed: Option<u64>,
    /// Strategies to compare, comma-separated [default: every strategy ftrec has]. `none`
    /// always runs first, without failures: it is the reference.
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Save interval in steps of every strategy that saves (full checkpoints, deck's deltas, ...)
    /// [default: a sixth of the steps].
    #[arg(long, value_name = "N")]
    pub ckpt_every_steps: Option<u64>,
    /// The failure schedule as kills, comma-separated or repeated: ROLE=I@step=S,
    /// ROLE=I@time=T or ROLE=I@phase=NAME[#N], several servers at once as server=0,2@step=S
    /// (see `ftrec run --help`).
    #[arg(long, value_name = "SPEC")]
    pub kills: Vec<String>,
    /// Draw the failure schedule instead: a server failure every T seconds of training on
    /// average (job MTBF; each server fails independently with mean T * servers), applied as
    /// time kills from the start of training.
    #[arg(long, value_name = "T")]
    pub mtbf_s: Option<f64>,
    /// Time between failures of one server: exponential, weibull:SHAPE or gamma:SHAPE
    /// [default: exponential].
    #[arg(long, value_name = "DIST")]
    pub failure_dist: Option<String>,
    /// The first N failures of the drawn schedule [default: 8].
    #[arg(long, value_name = "N")]
    pub max_kills: Option<usize>,
    /// Held-out samples for AUC and logloss [default: the preset's].
    #[arg(long)]
    pub eval_samples: Option<usize>,
    /// Matrix-kernel threads per worker [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub opt: OptimizerArgs,
    /// Run every strategy N times, interleaved (none, full, ..., none, full, ...), so a change
    /// of the machine's load hits every strategy alike; the summary takes each strategy's
    /// median run [default: 1].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Keep every run's work directory (checkpoints, stores) under OUT/runs.
    #[arg(long)]
    pub keep_runs: bool,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "ftrec-compare")]
    pub out: PathBuf,
    /// Run nothing: recompute the summary and redraw the plots, report.md and report.html of
    /// the report.json in --out.
    #[arg(long)]
    pub replot: bool,
}

/// Where the failure schedule came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// `kills` (given) or `mtbf` (drawn).
    pub source: String,
    pub mtbf_s: Option<f64>,
    pub dist: Option<FailureDist>,
    pub failure_seed: Option<u64>,
    /// The kills applied to every strategy but the reference.
    pub kills: Vec<String>,
}

/// One run and the measurements taken around it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEntry {
    pub strategy: String,
    /// Which round (from 0) of `--rounds`.
    #[serde(default)]
    pub round: u32,
    pub kills: Vec<String>,
    /// The run could not be carried out (the report is absent).
    pub error: Option<String>,
    /// Peak of the summed resident memory of the server processes, sampled every 100 ms.
    pub peak_server_rss_bytes: Option<u64>,
    pub peak_worker_rss_bytes: Option<u64>,
    /// Bytes left in the run's work directory (checkpoints, stores) at the end.
    pub stored_bytes: u64,
    pub wall_s: f64,
    pub report: Option<RunReport>,
}

/// Time lost to one failure, by phase, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LostTime {
    pub server: u32,
    pub at_step: u64,
    pub detect: f64,
    pub replace: f64,
    pub reload: f64,
    /// Redoing the steps since the restored state.
    pub redo: f64,
    /// Throughput lost while training ran degraded (a rebuild in the background):
    /// `window * (1 - share)`.
    pub degraded: f64,
    /// From training resumed to the state whole again.
    pub window: f64,
    /// Throughput in the window over before the failure.
    pub window_share: f64,
    pub steps_redone: u64,
}

impl LostTime {
    pub fn total(&self) -> f64 {
        self.detect + self.replace + self.reload + self.redo + self.degraded
    }
}

/// One line of the summary table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SummaryRow {
    pub strategy: String,
    /// Training time of every round; the row describes the median one.
    pub rounds_train_s: Vec<f64>,
    /// `ok`, `aborted: ...` or `error: ...`.
    pub status: String,
    pub steps: u64,
    pub train_s: f64,
    pub samples_per_s: f64,
    /// Training time of every round that finished, averaged.
    #[serde(default)]
    pub mean_train_s: f64,
    /// [`overhead_definition`]: the mean over rounds of each round's training time over the
    /// reference's of the same round, minus one.
    pub overhead: Option<f64>,
    /// Half-width of the 95% interval of `overhead` (Student's t over the rounds).
    #[serde(default)]
    pub overhead_ci95: Option<f64>,
    /// The representative run's steady state ([`crate::timeline::steady`]).
    #[serde(default)]
    pub steady: Option<crate::timeline::Steady>,
    /// [`steady_definition`]: the mean over rounds of each round's steady step time over the
    /// reference's of the same round, minus one.
    #[serde(default)]
    pub steady_overhead: Option<f64>,
    #[serde(default)]
    pub steady_overhead_ci95: Option<f64>,
    /// Start-up seconds ([`crate::timeline::Steady::startup_s`]), averaged over the rounds.
    #[serde(default)]
    pub startup_s: Option<f64>,
    /// The representative run's throughput, smoothed, with its kills and recoveries marked.
    #[serde(default)]
    pub throughput: Option<crate::timeline::Smoothed>,
    pub saves: u64,
    pub save_pause_s: f64,
    pub failures: Vec<LostTime>,
    /// Kills of the schedule that fired, and all of them (a drawn schedule may hold kills
    /// after the run's end).
    #[serde(default)]
    pub kills_fired: Option<(usize, usize)>,
    /// Steady slowdown: what the overhead leaves once saves and failures are taken out.
    pub steady_s: Option<f64>,
    pub bytes_written: u64,
    pub stored_bytes: u64,
    pub peak_server_rss_bytes: Option<u64>,
    /// Peak server memory beyond the reference's.
    pub extra_server_rss_bytes: Option<i64>,
    /// The strategy's own figure of memory over the model, when it reports one (ECRec).
    pub memory_over_model: Option<f64>,
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
    pub auc_delta: Option<f64>,
    pub logloss_delta: Option<f64>,
    pub model_digest: String,
    /// The final model is the reference's, bit for bit.
    pub digest_matches: Option<bool>,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareReport {
    pub format: u32,
    pub command: Vec<String>,
    pub preset: String,
    pub servers: u32,
    pub workers: u32,
    pub sync: bool,
    pub steps: u64,
    pub batch: usize,
    pub seed: u64,
    pub ckpt_every_steps: u64,
    pub rounds: u32,
    /// Values and optimizer state of every row and dense block.
    pub model_bytes: u64,
    /// The Criteo TSV data every run read (`None`: the preset's synthetic data).
    #[serde(default)]
    pub data: Option<String>,
    pub schedule: Schedule,
    /// Raw throughputs of this machine, measured before the runs.
    pub machine: Machine,
    pub load_average: Option<f64>,
    pub runs: Vec<RunEntry>,
    /// Strategies not run: the configuration does not suit them.
    pub skipped: Vec<(String, String)>,
    pub summary: Vec<SummaryRow>,
}

pub const FORMAT: u32 = 1;

impl CompareReport {
    pub fn read(dir: &Path) -> Result<CompareReport> {
        let path = if dir.is_dir() {
            dir.join("report.json")
        } else {
            dir.to_path_buf()
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the compare report {}", path.display()))?;
        let r: CompareReport = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a compare report", path.display()))?;
        if r.format != FORMAT {
            bail!(
                "{}: compare report format {} (this ftrec reads {FORMAT})",
                path.display(),
                r.format
            );
        }
        Ok(r)
    }

    /// The reference run (failure-free `none`, its median round).
    pub fn reference(&self) -> Option<&RunReport> {
        self.entry("none").and_then(|r| r.report.as_ref())
    }

    /// The strategies in the order they ran.
    pub fn strategies(&self) -> Vec<&str> {
        let mut v: Vec<&str> = Vec::new();
        for r in &self.runs {
            if !v.contains(&r.strategy.as_str()) {
                v.push(&r.strategy);
            }
        }
        v
    }

    /// A strategy's representative run: the median training time among its rounds that
    /// finished (the first round when none did).
    pub fn entry(&self, strategy: &str) -> Option<&RunEntry> {
        let all: Vec<&RunEntry> = self
            .runs
            .iter()
            .filter(|r| r.strategy == strategy)
            .collect();
        let mut ok: Vec<&RunEntry> = all
            .iter()
            .copied()
            .filter(|r| r.report.as_ref().is_some_and(|x| x.aborted.is_none()))
            .collect();
        if ok.is_empty() {
            return all.first().copied();
        }
        ok.sort_by(|a, b| {
            let t = |e: &RunEntry| e.report.as_ref().map_or(0.0, |r| r.train_s);
            t(a).total_cmp(&t(b))
        });
        Some(ok[(ok.len() - 1) / 2])
    }

    /// Seconds from the start of a run to the start of its training.
    pub fn training_start(r: &RunReport) -> f64 {
        r.events
            .iter()
            .find(|e| e.kind == EventKind::WorkersStarted)
            .map_or(0.0, |e| e.t_s)
    }
}

/// Parse `exponential`, `weibull:K` or `gamma:K`.
pub fn parse_dist(s: &str) -> Result<FailureDist> {
    let d = match s.split_once(':') {
        None if s == "exponential" || s == "exp" => FailureDist::Exponential,
        Some(("weibull", k)) => FailureDist::Weibull {
            shape: k
                .parse()
                .with_context(|| format!("--failure-dist {s:?}: bad shape"))?,
        },
        Some(("gamma", k)) => FailureDist::Gamma {
            shape: k
                .parse()
                .with_context(|| format!("--failure-dist {s:?}: bad shape"))?,
        },
        _ => bail!("--failure-dist {s:?}: expected exponential, weibull:SHAPE or gamma:SHAPE"),
    };
    d.validate()?;
    Ok(d)
}

/// Values and optimizer state of the whole model, in bytes.
pub fn model_bytes(cfg: &RunConfig) -> u64 {
    let p = &cfg.preset;
    let rows: u64 = p.table_rows.iter().sum();
    let row_words = (p.dim + cfg.sparse_optimizer.state_words(p.dim)) as u64;
    let dense = ftrec_model::DlrmConfig::from_preset(p).param_count() as u64;
    let blocks = dense.div_ceil(ftrec_core::DENSE_BLOCK as u64);
    let dense_state = blocks * cfg.dense_optimizer.state_words(ftrec_core::DENSE_BLOCK) as u64;
    4 * (rows * row_words + dense + dense_state)
}

/// The base configuration shared by every run, from the flags.
fn base_config(a: &CompareArgs) -> Result<RunConfig> {
    let run = crate::flags::RunArgs {
        preset: a.preset.clone(),
        servers: Some(a.servers.unwrap_or(3)),
        workers: Some(a.workers.unwrap_or(2)),
        sync: a.sync,
        steps: a.steps,
        batch: a.batch,
        seed: a.seed,
        eval_samples: a.eval_samples,
        threads: a.threads,
        opt: a.opt.clone(),
        data: a.data.clone(),
        ..Default::default()
    };
    crate::cluster_cmd::run_config(&run)
}

/// The failure schedule, drawn once.
/// `--kills` values split at their commas into kill specs, where a comma followed by a digit
/// continues a list of server ids (`server=0,2@step=5,worker=1@step=8` is two specs).
fn split_kills(values: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        let mut first = true;
        for part in v.split(',') {
            match out.last_mut() {
                Some(last) if !first && part.starts_with(|c: char| c.is_ascii_digit()) => {
                    last.push(',');
                    last.push_str(part);
                }
                _ => out.push(part.to_string()),
            }
            first = false;
        }
    }
    out
}

fn schedule(a: &CompareArgs, cfg: &RunConfig) -> Result<(Schedule, Vec<KillSpec>)> {
    match (a.kills.is_empty(), a.mtbf_s) {
        (false, Some(_)) => bail!("give the failure schedule as --kills or as --mtbf-s, not both"),
        (_, None) => {
            if a.failure_dist.is_some() || a.max_kills.is_some() || a.failure_seed.is_some() {
                bail!("--failure-dist, --max-kills and --failure-seed apply to --mtbf-s");
            }
            let kills: Vec<KillSpec> = split_kills(&a.kills)
                .iter()
                .map(|k| KillSpec::parse_many(k))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
                .collect();
            if let Some(k) = kills.iter().find(|k| k.role == Role::Job) {
                bail!(
                    "--kills {k}: compare runs every strategy's coordinator in its own process, \
                     which a whole-job kill would end; kill servers, workers or the merger"
                );
            }
            Ok((
                Schedule {
                    source: "kills".into(),
                    mtbf_s: None,
                    dist: None,
                    failure_seed: None,
                    kills: kills.iter().map(|k| k.to_string()).collect(),
                },
                kills,
            ))
        }
        (true, Some(mtbf)) => {
            if !(mtbf.is_finite() && mtbf > 0.0) {
                bail!("--mtbf-s {mtbf} must be a positive number of seconds");
            }
            let dist = parse_dist(a.failure_dist.as_deref().unwrap_or("exponential"))?;
            let seed = a.failure_seed.unwrap_or(cfg.seed);
            let max = a.max_kills.unwrap_or(8);
            let drawn = ftrec_sim::draw_schedule(dist, mtbf, cfg.servers, seed, max)?;
            // Millisecond times: the kill specs print and parse back to the same schedule.
            let kills: Vec<KillSpec> = drawn
                .iter()
                .map(|f| KillSpec {
                    role: Role::Server,
                    id: f.server,
                    at: KillAt::Time((f.t_s * 1e3).round() / 1e3),
                    pause: false,
                })
                .collect();
            Ok((
                Schedule {
                    source: "mtbf".into(),
                    mtbf_s: Some(mtbf),
                    dist: Some(dist),
                    failure_seed: Some(seed),
                    kills: kills.iter().map(|k| k.to_string()).collect(),
                },
                kills,
            ))
        }
    }
}

/// Throughput of this machine's disk and loopback, measured in `dir` (files removed after).
pub fn probe_machine(dir: &Path) -> Result<Machine> {
    const CHUNK: usize = 8 << 20;
    const TOTAL: usize = 128 << 20;
    let path = dir.join(".ftrec-probe");
    let buf: Vec<u8> = (0..CHUNK).map(|i| (i * 131 % 251) as u8).collect();
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&path)
            .with_context(|| format!("probing the disk at {}", path.display()))?;
        for _ in 0..TOTAL / CHUNK {
            f.write_all(&buf)?;
        }
        f.sync_all()?;
    }
    let write_s = t.elapsed().as_secs_f64();
    drop_cache(&path);
    let t = Instant::now();
    {
        let mut f = std::fs::File::open(&path)?;
        let mut b = vec![0u8; CHUNK];
        while f.read(&mut b)? > 0 {}
    }
    let read_s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    // Loopback TCP, one stream.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut b = vec![0u8; 1 << 20];
        while s.read(&mut b)? > 0 {}
        Ok(())
    });
    let t = Instant::now();
    {
        let mut s = std::net::TcpStream::connect(addr)?;
        for _ in 0..(2 * TOTAL) / CHUNK {
            s.write_all(&buf)?;
        }
    }
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("loopback probe thread panicked"))??;
    let net_s = t.elapsed().as_secs_f64();
    Ok(Machine {
        disk_write_bps: TOTAL as f64 / write_s.max(1e-6),
        disk_read_bps: TOTAL as f64 / read_s.max(1e-6),
        net_bps: (2 * TOTAL) as f64 / net_s.max(1e-6),
    })
}

fn drop_cache(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        if let Ok(f) = std::fs::File::open(path) {
            // SAFETY: the descriptor is valid for the duration of the call.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Resident memory of this process's descendants, summed by role (server, worker), from
/// `/proc` (Linux; `None` elsewhere).
fn children_rss() -> Option<(u64, u64)> {
    let me = std::process::id();
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The command name may hold spaces: fields start after the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
        {
            parent.insert(pid, ppid);
        }
    }
    let descends = |mut p: u32| {
        for _ in 0..64 {
            match parent.get(&p) {
                Some(&pp) if pp == me => return true,
                Some(&pp) if pp > 1 => p = pp,
                _ => return false,
            }
        }
        false
    };
    let page = 4096u64;
    let (mut servers, mut workers) = (0u64, 0u64);
    for &pid in parent.keys() {
        if !descends(pid) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let role = cmd.split(|&b| b == 0).nth(1).map(|r| r.to_vec());
        let Some(rss) = std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        else {
            continue;
        };
        match role.as_deref() {
            Some(b"server") => servers += rss * page,
            Some(b"worker") => workers += rss * page,
            _ => {}
        }
    }
    Some((servers, workers))
}

/// Bytes of the files under `dir`.
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Carry out one run, sampling memory and showing its progress.
fn run_one(
    cfg: &RunConfig,
    bar: &indicatif::ProgressBar,
    expected_s: Option<f64>,
    keep: bool,
    progress: &mut crate::progress::Runs,
) -> RunEntry {
    let name = cfg.strategy.name().to_string();
    let t = Instant::now();
    let (mut peak_s, mut peak_w) = (None::<u64>, None::<u64>);
    let result = std::thread::scope(|scope| {
        let h = scope.spawn(|| ftrec_cluster::run(cfg));
        while !h.is_finished() {
            if let Some((s, w)) = children_rss() {
                peak_s = Some(peak_s.unwrap_or(0).max(s));
                peak_w = Some(peak_w.unwrap_or(0).max(w));
            }
            if let Some(e) = expected_s {
                // Elapsed against the failure-free run's time: an estimate, never full before
                // the run ends.
                let frac = (t.elapsed().as_secs_f64() / e).min(0.97);
                bar.set_position((frac * 1000.0) as u64);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        h.join()
    });
    let wall_s = t.elapsed().as_secs_f64();
    let stored = du(&cfg.work_dir);
    if !keep {
        let _ = std::fs::remove_dir_all(&cfg.work_dir);
    }
    let (report, error) = match result {
        Ok(Ok(r)) => (Some(r), None),
        Ok(Err(e)) => (None, Some(e.to_string())),
        Err(_) => (None, Some("the run panicked".to_string())),
    };
    let msg = match (&report, &error) {
        (Some(r), _) => format!(
            "{:.1} s training, {} failures{}{}",
            r.train_s,
            r.failures.len(),
            kills_fired(r).map_or(String::new(), |(f, n)| format!(", kills fired {f}/{n}")),
            r.aborted
                .as_ref()
                .map_or(String::new(), |a| format!(", aborted: {a}"))
        ),
        (None, Some(e)) => format!("failed: {e}"),
        _ => String::new(),
    };
    bar.set_position(1000);
    bar.finish_with_message(msg.clone());
    // A kill whose point never came in the run is said, not left for the table to show.
    for k in report.iter().flat_map(|r| &r.kills).filter(|k| !k.fired) {
        let line = format!("compare: {name}: {}", k.line());
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    }
    // The time left, with the bars on a terminal or alone in a log.
    let line = progress.done(&name, &format!("{msg} ({wall_s:.1} s)"));
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
    RunEntry {
        strategy: name,
        round: 0,
        kills: cfg.kills.iter().map(|k| k.to_string()).collect(),
        error,
        peak_server_rss_bytes: peak_s,
        peak_worker_rss_bytes: peak_w,
        stored_bytes: stored,
        wall_s,
        report,
    }
}

/// Which strategies to run, in the order of [`StrategyChoice::all_names`] for the default.
fn strategy_list(a: &CompareArgs) -> Result<(Vec<String>, bool)> {
    if a.strategies.is_empty() {
        return Ok((
            StrategyChoice::all_names()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            false,
        ));
    }
    let mut v: Vec<String> = Vec::new();
    for s in &a.strategies {
        let s = s.trim().to_string();
        StrategyChoice::parse(&s, 1)?;
        if !v.contains(&s) {
            v.push(s);
        }
    }
    Ok((v, true))
}

/// Run the comparison and write its report; returns the report.
pub fn compare(a: &CompareArgs, command: Vec<String>) -> Result<CompareReport> {
    let rounds = a.rounds.unwrap_or(1);
    if rounds == 0 || rounds > 50 {
        bail!("--rounds {rounds} must be between 1 and 50");
    }
    let base = base_config(a)?;
    let (strategies, explicit) = strategy_list(a)?;
    let (sched, kills) = schedule(a, &base)?;
    let every = a.ckpt_every_steps.unwrap_or((base.steps / 6).max(1)).max(1);
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("creating the output directory {}", a.out.display()))?;
    let work = if a.keep_runs {
        a.out.join("runs")
    } else {
        std::env::temp_dir().join(format!("ftrec-compare-{}", std::process::id()))
    };
    // Every run's configuration, checked before anything runs.
    let mut plan = vec![];
    let mut skipped = vec![];
    let mut order = vec!["none".to_string()];
    order.extend(strategies.iter().filter(|s| *s != "none").cloned());
    for name in &order {
        let mut cfg = base.clone();
        cfg.strategy = StrategyChoice::parse(name, every)?;
        cfg.kills = if name == "none" {
            Vec::new()
        } else {
            kills.clone()
        };
        cfg.work_dir = work.join(name);
        match cfg.validate() {
            Ok(()) => plan.push(cfg),
            Err(e) if explicit && name != "none" => {
                bail!("strategy {name} cannot run this comparison: {e}")
            }
            Err(e) if name == "none" => return Err(e.into()),
            Err(e) => skipped.push((name.clone(), e.to_string())),
        }
    }
    eprintln!(
        "ftrec compare: preset {} | {} servers, {} workers ({}) | {} steps x batch {} | \
         saves every {every} steps | kills {} | strategies {}",
        base.preset.name,
        base.servers,
        base.workers,
        if base.sync { "sync" } else { "async" },
        base.steps,
        base.batch,
        if sched.kills.is_empty() {
            "none".into()
        } else {
            sched.kills.join(",")
        },
        plan.iter()
            .map(|c| c.strategy.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    for (name, why) in &skipped {
        eprintln!("compare: skipping {name}: {why}");
    }
    let machine = probe_machine(&a.out)?;
    let multi = indicatif::MultiProgress::new();
    let style = indicatif::ProgressStyle::with_template(
        "{prefix:>8} [{elapsed:>4}] {bar:28.cyan/blue} {msg}",
    )
    .expect("progress template")
    .progress_chars("=> ");
    let bars: Vec<indicatif::ProgressBar> = (0..rounds)
        .flat_map(|r| plan.iter().map(move |c| (r, c)))
        .map(|(r, c)| {
            let b = multi.add(indicatif::ProgressBar::new(1000));
            b.set_style(style.clone());
            b.set_prefix(if rounds > 1 {
                format!("{} #{}", c.strategy.name(), r + 1)
            } else {
                c.strategy.name().to_string()
            });
            b.set_message("waiting");
            b
        })
        .collect();
    let mut runs: Vec<RunEntry> = Vec::new();
    let per_round = plan.len();
    let mut progress = crate::progress::Runs::new("compare", bars.len());
    for (i, (cfg, bar)) in plan.iter().cycle().zip(&bars).enumerate() {
        let round = (i / per_round) as u32;
        let mut cfg = cfg.clone();
        cfg.work_dir = work.join(format!("{}-{round}", cfg.strategy.name()));
        let cfg = &cfg;
        bar.reset_elapsed();
        bar.set_message(if cfg.kills.is_empty() {
            "running (failure-free reference)".to_string()
        } else {
            format!("running with {} kills", cfg.kills.len())
        });
        let expected = runs
            .first()
            .map(|r: &RunEntry| r.wall_s * 1.15)
            .filter(|e| *e > 0.0);
        let mut entry = run_one(cfg, bar, expected, a.keep_runs, &mut progress);
        entry.round = round;
        let failed_reference = entry.strategy == "none"
            && (entry.error.is_some()
                || entry.report.as_ref().is_some_and(|r| r.aborted.is_some()));
        runs.push(entry);
        if failed_reference {
            let e = &runs[0];
            bail!(
                "the failure-free reference run failed: {}",
                e.error
                    .clone()
                    .or_else(|| e.report.as_ref().and_then(|r| r.aborted.clone()))
                    .unwrap_or_default()
            );
        }
    }
    if !a.keep_runs {
        let _ = std::fs::remove_dir_all(&work);
    }
    let mut report = CompareReport {
        format: FORMAT,
        command,
        preset: base.preset.name.clone(),
        servers: base.servers,
        workers: base.workers,
        sync: base.sync,
        steps: base.steps,
        batch: base.batch,
        seed: base.seed,
        ckpt_every_steps: every,
        rounds,
        model_bytes: model_bytes(&base),
        data: base.data.as_ref().map(|t| {
            format!(
                "{} (every {}-th line held out)",
                crate::cluster_cmd::data_path(t),
                t.holdout_every
            )
        }),
        schedule: sched,
        machine,
        load_average: load_average(),
        runs,
        skipped,
        summary: Vec::new(),
    };
    report.summary = summarize(&report);
    write_outputs(&report, &a.out)?;
    Ok(report)
}

/// Steps completed per second over `[from, to]` (seconds after the run's start), counting each
/// step number once (redone steps are not progress).
fn step_rate(r: &RunReport, from: f64, to: f64) -> Option<f64> {
    if to <= from {
        return None;
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut max_before = 0;
    for p in &r.timeline {
        if p.t_s <= from {
            max_before = max_before.max(p.step);
        }
    }
    for p in &r.timeline {
        if p.t_s > from && p.t_s <= to && p.step > max_before {
            seen.insert(p.step);
        }
    }
    Some(seen.len() as f64 / (to - from))
}

/// Time lost to every server failure of a run.
pub fn lost_times(r: &RunReport) -> Vec<LostTime> {
    let t0 = CompareReport::training_start(r);
    let first_kill = r
        .failures
        .iter()
        .map(|f| f.injected_t_s)
        .fold(f64::INFINITY, f64::min);
    let normal = if first_kill.is_finite() {
        step_rate(r, t0, first_kill)
    } else {
        None
    };
    r.failures
        .iter()
        .filter(|f| f.role == Role::Server)
        .map(|f| {
            let window = f.redo_s().unwrap_or(0.0).max(0.0);
            let share = match (normal, f.resumed_s) {
                (Some(n), Some(res)) if n > 0.0 && window > 0.0 => {
                    let from = f.injected_t_s + res;
                    step_rate(r, from, from + window).map_or(1.0, |d| (d / n).clamp(0.0, 1.0))
                }
                _ => 1.0,
            };
            let redone = f.steps_redone > 0;
            LostTime {
                server: f.id,
                at_step: f.step,
                detect: f.detect_s().unwrap_or(0.0),
                replace: f.replace_s().unwrap_or(0.0).max(0.0),
                reload: f.reload_s().unwrap_or(0.0).max(0.0),
                redo: if redone { window } else { 0.0 },
                degraded: if redone { 0.0 } else { window * (1.0 - share) },
                window,
                window_share: if redone { 0.0 } else { share },
                steps_redone: f.steps_redone,
            }
        })
        .collect()
}

/// The pause of every save, in order: from its start to its rows being copied out, its end or
/// its failure, whichever comes first.
pub fn save_pauses(r: &RunReport) -> Vec<f64> {
    let mut out = Vec::new();
    let mut start: Option<f64> = None;
    for e in &r.events {
        match e.kind {
            EventKind::CheckpointStart => start = Some(e.t_s),
            EventKind::CheckpointCopied
            | EventKind::CheckpointEnd
            | EventKind::CheckpointFailed => {
                if let Some(s) = start.take() {
                    out.push(e.t_s - s);
                }
            }
            _ => {}
        }
    }
    out
}

/// The save interval in steps a strategy's configuration names (any `*every_steps` field, or
/// an `interval` of `steps` shared by `saves_per_full` save points).
fn every_steps(c: &StrategyChoice) -> Option<u64> {
    let v = serde_json::to_value(c).ok()?;
    if let Some(n) = v
        .as_object()?
        .iter()
        .find(|(k, _)| k.ends_with("every_steps"))
        .and_then(|(_, v)| v.as_u64())
    {
        return Some(n);
    }
    let n = v.pointer("/interval/steps")?.as_u64()?;
    let k = v
        .get("saves_per_full")
        .and_then(|k| k.as_u64())
        .unwrap_or(1);
    Some((n / k.max(1)).max(1))
}

/// Kills of a run's schedule that fired, and all of them (`None` without kills).
fn kills_fired(r: &RunReport) -> Option<(usize, usize)> {
    (!r.kills.is_empty()).then(|| (r.kills.iter().filter(|k| k.fired).count(), r.kills.len()))
}

fn summarize(rep: &CompareReport) -> Vec<SummaryRow> {
    let reference = rep.reference();
    let window = crate::timeline::smoothing_window(rep);
    let ref_entry = rep.entry("none");
    rep.strategies()
        .into_iter()
        .filter_map(|name| rep.entry(name))
        .map(|e| {
            let rounds_train_s: Vec<f64> = rep
                .runs
                .iter()
                .filter(|r| r.strategy == e.strategy)
                .filter_map(|r| r.report.as_ref().map(|x| x.train_s))
                .collect();
            let Some(r) = &e.report else {
                return SummaryRow {
                    strategy: e.strategy.clone(),
                    rounds_train_s,
                    status: format!("error: {}", e.error.clone().unwrap_or_default()),
                    steps: 0,
                    train_s: 0.0,
                    samples_per_s: 0.0,
                    mean_train_s: 0.0,
                    overhead: None,
                    overhead_ci95: None,
                    steady: None,
                    steady_overhead: None,
                    steady_overhead_ci95: None,
                    startup_s: None,
                    throughput: None,
                    saves: 0,
                    save_pause_s: 0.0,
                    failures: Vec::new(),
                    kills_fired: None,
                    steady_s: None,
                    bytes_written: 0,
                    stored_bytes: e.stored_bytes,
                    peak_server_rss_bytes: e.peak_server_rss_bytes,
                    extra_server_rss_bytes: None,
                    memory_over_model: None,
                    auc: None,
                    logloss: None,
                    auc_delta: None,
                    logloss_delta: None,
                    model_digest: String::new(),
                    digest_matches: None,
                };
            };
            let failures = lost_times(r);
            // Each round's figure over the reference's of the same round (adjacent in time, so
            // under the same load); the mean over rounds with its 95% interval.
            let paired = |f: &dyn Fn(&RunReport) -> Option<f64>| -> Option<(f64, Option<f64>)> {
                let ratios: Vec<f64> = rep
                    .runs
                    .iter()
                    .filter(|x| x.strategy == e.strategy)
                    .filter_map(|x| {
                        let t = f(x.report.as_ref().filter(|r| r.aborted.is_none())?)?;
                        let b = f(rep
                            .runs
                            .iter()
                            .find(|y| y.strategy == "none" && y.round == x.round)?
                            .report
                            .as_ref()?)?;
                        Some(t / b.max(1e-12) - 1.0)
                    })
                    .collect();
                crate::timeline::mean_ci95(&ratios)
            };
            let overhead = paired(&|r| Some(r.train_s));
            let steady_overhead = paired(&|r| crate::timeline::steady(r).map(|s| s.step_s));
            let finished: Vec<&RunReport> = rep
                .runs
                .iter()
                .filter(|x| x.strategy == e.strategy)
                .filter_map(|x| x.report.as_ref().filter(|r| r.aborted.is_none()))
                .collect();
            let mean_train_s =
                crate::timeline::mean_ci95(&finished.iter().map(|r| r.train_s).collect::<Vec<_>>())
                    .map_or(r.train_s, |m| m.0);
            let startup = crate::timeline::mean_ci95(
                &finished
                    .iter()
                    .filter_map(|r| crate::timeline::steady(r).map(|s| s.startup_s))
                    .collect::<Vec<_>>(),
            )
            .map(|m| m.0);
            let steady = reference.map(|b| {
                r.train_s
                    - b.train_s
                    - r.checkpoint_pause_s
                    - failures.iter().map(LostTime::total).sum::<f64>()
            });
            let ok = r.aborted.is_none();
            SummaryRow {
                strategy: e.strategy.clone(),
                rounds_train_s,
                status: match &r.aborted {
                    Some(a) => format!("aborted: {a}"),
                    None => "ok".into(),
                },
                steps: r.steps,
                train_s: r.train_s,
                samples_per_s: r.samples_per_s,
                mean_train_s,
                overhead: overhead.map(|o| o.0).filter(|_| ok),
                overhead_ci95: overhead.and_then(|o| o.1).filter(|_| ok),
                steady: crate::timeline::steady(r),
                steady_overhead: steady_overhead.map(|o| o.0).filter(|_| ok),
                steady_overhead_ci95: steady_overhead.and_then(|o| o.1).filter(|_| ok),
                startup_s: startup,
                throughput: Some(crate::timeline::smoothed(r, window)),
                saves: r.checkpoints,
                save_pause_s: r.checkpoint_pause_s,
                failures,
                kills_fired: kills_fired(r),
                steady_s: steady.filter(|_| ok),
                bytes_written: r.bytes_written,
                stored_bytes: e.stored_bytes,
                peak_server_rss_bytes: e.peak_server_rss_bytes,
                extra_server_rss_bytes: match (
                    e.peak_server_rss_bytes,
                    ref_entry.and_then(|b| b.peak_server_rss_bytes),
                ) {
                    (Some(x), Some(b)) => Some(x as i64 - b as i64),
                    _ => None,
                },
                memory_over_model: serde_json::to_value(r)
                    .ok()
                    .and_then(|v| v.pointer("/ec/memory/overhead")?.as_f64()),
                auc: r.auc,
                logloss: r.logloss,
                auc_delta: r.auc.zip(reference.and_then(|b| b.auc)).map(|(a, b)| a - b),
                logloss_delta: r
                    .logloss
                    .zip(reference.and_then(|b| b.logloss))
                    .map(|(a, b)| a - b),
                model_digest: r.model_digest.clone(),
                digest_matches: reference
                    .filter(|_| ok && !r.model_digest.is_empty())
                    .map(|b| b.model_digest == r.model_digest),
            }
        })
        .collect()
}

/// For every server failure of a run (in [`lost_times`]' order), the working time of the
/// rebuild it caused (the time its batches worked: the window less the rests it took for
/// training) and the throughput share training kept meanwhile; `None` without a rebuild (no
/// ECRec).
fn rebuild_work(r: &RunReport) -> Vec<(Option<f64>, Option<f64>)> {
    let servers: Vec<_> = r
        .failures
        .iter()
        .filter(|f| f.role == Role::Server)
        .collect();
    servers
        .iter()
        .map(|f| {
            let Some(ec) = &r.ec else {
                return (None, None);
            };
            let next = servers
                .iter()
                .filter(|g| g.id == f.id && g.injected_t_s > f.injected_t_s)
                .map(|g| g.injected_t_s)
                .fold(f64::INFINITY, f64::min);
            let mine: Vec<_> = ec
                .rebuilds
                .iter()
                .filter(|b| b.server == f.id && b.started_s >= f.injected_t_s && b.started_s < next)
                .collect();
            let spans: Vec<(f64, f64)> = mine
                .iter()
                .flat_map(|b| b.range_spans_s.iter().copied())
                .collect();
            if spans.is_empty() || mine.iter().any(|b| b.finished_s.is_none()) {
                return (None, None);
            }
            // The time its batches worked, rests excluded (reports that count it); else
            // its lock ranges' spans, rests included.
            let busy: f64 = if mine.iter().all(|b| b.busy_s > 0.0) {
                mine.iter().map(|b| b.busy_s).sum()
            } else {
                spans.iter().map(|(a, b)| (b - a).max(0.0)).sum()
            };
            let whole: Vec<f64> = mine.iter().filter_map(|b| b.throughput_share).collect();
            let shares: Vec<f64> = if whole.len() == mine.len() {
                whole
            } else {
                mine.iter()
                    .flat_map(|b| b.range_throughput_share.iter().flatten().copied())
                    .collect()
            };
            let share =
                (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64);
            (Some(busy), share)
        })
        .collect()
}

/// What the simulator's calibration needs from one run of a report.
pub fn measured(rep: &CompareReport, strategy: &str) -> Option<Measured> {
    let reference = rep.reference()?;
    let entry = rep.entry(strategy)?;
    let r = entry.report.as_ref().filter(|r| r.aborted.is_none())?;
    let busy = rebuild_work(r);
    let failures = lost_times(r)
        .into_iter()
        .zip(busy)
        .map(|(l, (busy_s, busy_share))| MeasuredFailure {
            at_step: l.at_step,
            detect_s: l.detect,
            replace_s: l.replace,
            reload_s: l.reload,
            window_s: l.window,
            steps_redone: l.steps_redone,
            window_share: if l.steps_redone > 0 {
                1.0
            } else {
                l.window_share
            },
            rebuild_busy_s: busy_s,
            rebuild_busy_share: busy_share,
        })
        .collect();
    let pauses = save_pauses(r);
    let full_saves = r
        .store
        .as_ref()
        .map_or(pauses.len() as u64, |s| s.fulls.min(pauses.len() as u64));
    let rss_extra = match (
        entry.peak_server_rss_bytes,
        rep.entry("none").and_then(|b| b.peak_server_rss_bytes),
    ) {
        (Some(x), Some(b)) => Some((x as f64 - b as f64) / rep.model_bytes as f64),
        _ => None,
    };
    let json = serde_json::to_value(r).ok();
    let ec_mem = json
        .as_ref()
        .and_then(|v| v.pointer("/ec/memory/overhead")?.as_f64());
    let code = json.as_ref().and_then(|v| {
        let ec = v.get("ec")?;
        Some((ec.get("k")?.as_u64()? as u32, ec.get("r")?.as_u64()? as u32))
    });
    Some(Measured {
        strategy: strategy.to_string(),
        model_bytes: rep.model_bytes as f64,
        servers: r.config.servers,
        workers: r.config.workers,
        steps: r.steps,
        train_s: r.train_s,
        baseline_train_s: reference.train_s,
        save_every_steps: every_steps(&r.config.strategy),
        save_pauses_s: pauses,
        full_saves,
        bytes_written: r.bytes_written as f64,
        failures,
        extra_memory: ec_mem.map(|m| m - 1.0).or(rss_extra),
        stored_bytes: entry.stored_bytes as f64,
        code,
    })
}

/// Write `report.json`, the plots, `report.md` and `report.html` into `out`.
pub fn write_outputs(rep: &CompareReport, out: &Path) -> Result<()> {
    crate::write_json(&out.join("report.json"), rep)?;
    let plots = crate::plot::draw_all(rep, out)?;
    std::fs::write(out.join("report.md"), markdown(rep, &plots))
        .with_context(|| format!("writing {}", out.join("report.md").display()))?;
    std::fs::write(out.join("report.html"), html(rep, &plots, out)?)
        .with_context(|| format!("writing {}", out.join("report.html").display()))?;
    Ok(())
}

fn mib(b: f64) -> String {
    format!("{:.1}", b / (1u64 << 20) as f64)
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or("-".into(), f)
}

/// The summary table as (header, rows) of plain cells.
pub fn table(rep: &CompareReport) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let head = vec![
        "strategy",
        "status",
        "train s",
        "overhead",
        "steady overhead",
        "start-up s",
        "saves (pause s)",
        "failures (kills fired)",
        "lost s/failure",
        "written MiB",
        "stored MiB",
        "extra server mem MiB",
        "AUC (delta)",
        "logloss (delta)",
        "digest",
    ];
    let rows = rep
        .summary
        .iter()
        .map(|s| {
            let lost = if s.failures.is_empty() {
                "-".to_string()
            } else {
                format!(
                    "{:.2}",
                    s.failures.iter().map(LostTime::total).sum::<f64>() / s.failures.len() as f64
                )
            };
            let pct = |o: Option<f64>, ci: Option<f64>| {
                opt(o, |o| {
                    format!("{:+.1}%", o * 100.0)
                        + &ci.map_or(String::new(), |c| format!(" ±{:.1}", c * 100.0))
                })
            };
            vec![
                s.strategy.clone(),
                s.status.chars().take(60).collect(),
                format!("{:.2}", s.mean_train_s),
                pct(s.overhead, s.overhead_ci95),
                pct(s.steady_overhead, s.steady_overhead_ci95),
                opt(s.startup_s, |t| format!("{t:.2}")),
                format!("{} ({:.2})", s.saves, s.save_pause_s),
                match s.kills_fired {
                    Some((f, n)) => format!("{} ({f}/{n})", s.failures.len()),
                    None => s.failures.len().to_string(),
                },
                lost,
                mib(s.bytes_written as f64),
                mib(s.stored_bytes as f64),
                match (
                    s.extra_server_rss_bytes,
                    s.memory_over_model
                        .filter(|_| memory_ratio_means_something(rep)),
                ) {
                    (Some(x), Some(m)) => format!("{} (x{m:.2} model)", mib(x as f64)),
                    (Some(x), None) => mib(x as f64),
                    (None, Some(m)) => format!("x{m:.2} model"),
                    _ => "-".into(),
                },
                match (s.auc, s.auc_delta) {
                    (Some(a), Some(d)) => format!("{a:.4} ({d:+.4})"),
                    (Some(a), None) => format!("{a:.4}"),
                    _ => "-".into(),
                },
                match (s.logloss, s.logloss_delta) {
                    (Some(a), Some(d)) => format!("{a:.4} ({d:+.4})"),
                    (Some(a), None) => format!("{a:.4}"),
                    _ => "-".into(),
                },
                match s.digest_matches {
                    Some(true) => "= failure-free".into(),
                    Some(false) => "differs".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    (head, rows)
}

/// Below this model size the servers' resident memory is mostly the fixed memory of a process
/// (runtime, buffers, code), so memory as a multiple of the model says nothing.
pub const MEMORY_RATIO_MIN_BYTES: u64 = 16 << 20;

fn memory_ratio_means_something(rep: &CompareReport) -> bool {
    rep.model_bytes >= MEMORY_RATIO_MIN_BYTES
}

/// What the overhead column is, word for word the computation of [`summarize`].
pub const OVERHEAD_DEFINITION: &str = "overhead: for each round, the strategy's training time \
     (first step to last, saves and recoveries included) over `none`'s training time in the same \
     round, minus one; the mean over the rounds, ± the half-width of its 95% interval (Student's \
     t). `train s` is the mean training time over the rounds, so the overhead is the mean of the \
     per-round ratios, not the ratio of the two means shown";

/// What the steady-overhead and start-up columns are.
pub const STEADY_DEFINITION: &str = "steady overhead: the same mean of per-round ratios, of the \
     steady step time: the mean time of the steps after a warm-up (a tenth of them, at least 5) \
     that redo nothing and fall outside every failure's window (from the kill to the state \
     being whole again); the saves among them count. start-up s: seconds from the run's start to the end of the warm-up beyond what \
     those steps cost at the steady rate (process start, connections, the first pulls), the \
     mean over the rounds";

/// The notes under the table: the definitions, and what the model's size leaves unsaid.
pub fn notes(rep: &CompareReport) -> Vec<String> {
    let mut v = vec![
        "The reference is `none` without failures".to_string(),
        OVERHEAD_DEFINITION.to_string(),
        STEADY_DEFINITION.to_string(),
        "lost s/failure adds detection, replacement, reload, redone steps and throughput lost \
         while running degraded"
            .to_string(),
    ];
    if !memory_ratio_means_something(rep) {
        v.push(format!(
            "extra server memory: the model is {} MiB, under {} MiB, so the servers' resident \
             memory is mostly fixed process memory and no multiple of the model is shown",
            mib(rep.model_bytes as f64),
            MEMORY_RATIO_MIN_BYTES >> 20
        ));
    }
    v
}

/// The table for a terminal: aligned columns.
pub fn text_table(rep: &CompareReport) -> String {
    let (head, rows) = table(rep);
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut s = line(head.iter().map(|h| h.to_string()).collect()) + "\n";
    for r in rows {
        s += &(line(r) + "\n");
    }
    s
}

fn setup_line(rep: &CompareReport) -> String {
    format!(
        "preset `{}`, {}, {} servers, {} workers, {}, {} steps x batch {}, seed {}, saves every \
         {} steps, {} round(s); model {} MiB (values and optimizer state); failure schedule ({}): \
         {}",
        rep.preset,
        rep.data
            .as_ref()
            .map_or("synthetic data".to_string(), |d| format!("TSV data {d}")),
        rep.servers,
        rep.workers,
        if rep.sync {
            "synchronous"
        } else {
            "asynchronous"
        },
        rep.steps,
        rep.batch,
        rep.seed,
        rep.ckpt_every_steps,
        rep.rounds,
        mib(rep.model_bytes as f64),
        match (&rep.schedule.source[..], rep.schedule.mtbf_s) {
            ("mtbf", Some(m)) => format!(
                "drawn with job MTBF {m} s, seed {}",
                rep.schedule.failure_seed.unwrap_or(0)
            ),
            _ => "given".into(),
        },
        if rep.schedule.kills.is_empty() {
            "no kills".to_string()
        } else {
            rep.schedule.kills.join(", ")
        }
    )
}

fn machine_line(rep: &CompareReport) -> String {
    let m = &rep.machine;
    format!(
        "machine: disk write {:.0} MB/s, disk read {:.0} MB/s, loopback {:.0} MB/s{}",
        m.disk_write_bps / 1e6,
        m.disk_read_bps / 1e6,
        m.net_bps / 1e6,
        rep.load_average
            .map_or(String::new(), |l| format!(", load average {l:.1}"))
    )
}

fn markdown(rep: &CompareReport, plots: &[crate::plot::Plot]) -> String {
    let (head, rows) = table(rep);
    let mut s = format!(
        "# ftrec compare\n\n{}.\n\n{}.\n\n",
        setup_line(rep),
        machine_line(rep)
    );
    s += &format!("| {} |\n", head.join(" | "));
    s += &format!("|{}\n", " --- |".repeat(head.len()));
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    for (name, why) in &rep.skipped {
        s += &format!("\nNot run: `{name}`: {why}.\n");
    }
    s += "\n";
    for n in notes(rep) {
        s += &format!("- {n}.\n");
    }
    for p in plots {
        s += &format!(
            "\n## {}\n\n{}\n\n![{}]({})\n",
            p.title, p.caption, p.title, p.png
        );
    }
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        out.push(A[(n >> 18) as usize & 63] as char);
        out.push(A[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

fn html(rep: &CompareReport, plots: &[crate::plot::Plot], out: &Path) -> Result<String> {
    let (head, rows) = table(rep);
    let mut s = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>ftrec compare</title><style>\
         body{font-family:sans-serif;margin:2em;max-width:1300px;color:#222}\
         table{border-collapse:collapse;font-size:14px}\
         th,td{border:1px solid #bbb;padding:4px 8px;text-align:right}\
         th{background:#eee}td:first-child,th:first-child{text-align:left}\
         img{max-width:100%;border:1px solid #ddd;margin:8px 0}\
         figcaption{color:#555;font-size:14px;max-width:1000px}\
         </style></head><body>\n<h1>ftrec compare</h1>\n",
    );
    s += &format!(
        "<p>{}.</p>\n<p>{}.</p>\n<table>\n<tr>",
        escape(&setup_line(rep)),
        escape(&machine_line(rep))
    );
    for h in &head {
        s += &format!("<th>{}</th>", escape(h));
    }
    s += "</tr>\n";
    for r in rows {
        s += "<tr>";
        for c in r {
            s += &format!("<td>{}</td>", escape(&c));
        }
        s += "</tr>\n";
    }
    s += "</table>\n<ul>\n";
    for n in notes(rep) {
        s += &format!("<li>{}.</li>\n", escape(&n));
    }
    s += "</ul>\n";
    for (name, why) in &rep.skipped {
        s += &format!(
            "<p>Not run: <code>{}</code>: {}.</p>\n",
            escape(name),
            escape(why)
        );
    }
    for p in plots {
        let png = std::fs::read(out.join(&p.png))
            .with_context(|| format!("reading {}", out.join(&p.png).display()))?;
        s += &format!(
            "<figure id=\"{id}\"><h2>{t}</h2><img alt=\"{t}\" src=\"data:image/png;base64,{b}\">\
             <figcaption>{c} Files: <a href=\"{png}\">{png}</a>, <a href=\"{svg}\">{svg}</a>.\
             </figcaption></figure>\n",
            id = escape(&p.png),
            t = escape(&p.title),
            b = base64(&png),
            c = escape(&p.caption),
            png = escape(&p.png),
            svg = escape(&p.svg),
        );
    }
    s += "</body></html>\n";
    Ok(s)
}

pub fn run(a: CompareArgs) -> Result<()> {
    let command: Vec<String> = std::env::args().collect();
    let rep = if a.replot {
        let mut rep = CompareReport::read(&a.out)?;
        rep.summary = summarize(&rep);
        write_outputs(&rep, &a.out)?;
        rep
    } else {
        compare(&a, command)?
    };
    println!("{}", text_table(&rep));
    let failed: Vec<&SummaryRow> = rep.summary.iter().filter(|s| s.status != "ok").collect();
    for f in &failed {
        eprintln!("compare: {}: {}", f.strategy, f.status);
    }
    println!("report: {}", a.out.join("report.html").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// What the advisor tells a user to run is a comparison `compare` accepts, with a kill
    /// inside its steps for every strategy to recover from.
    #[test]
    fn the_advisor_s_suggested_calibrations_pass_compare_s_checks() {
        for c in crate::advise::candidates().unwrap() {
            let cli = crate::flags::Cli::try_parse_from(c.command.split_whitespace())
                .unwrap_or_else(|e| panic!("{}: {e}", c.command));
            let crate::flags::Cmd::Compare(a) = cli.cmd else {
                panic!("{} is not a compare", c.command);
            };
            let cfg = base_config(&a).unwrap();
            assert_eq!(cfg.preset.name, c.preset, "{}", c.command);
            let (_, kills) = schedule(&a, &cfg).unwrap();
            assert!(!kills.is_empty(), "{}", c.command);
            for k in &kills {
                assert!(
                    matches!(k.at, KillAt::Step(s) if s > 0 && s < cfg.steps),
                    "{k} in {}",
                    c.command
                );
            }
        }
    }

    #[test]
    fn kills_split_at_commas_except_inside_a_list_of_servers() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            split_kills(&v(&[
                "server=0,2@step=5,worker=1@step=8",
                "stop:server=1@step=3"
            ])),
            v(&[
                "server=0,2@step=5",
                "worker=1@step=8",
                "stop:server=1@step=3"
            ])
        );
        assert_eq!(
            split_kills(&v(&["server=1@step=4", "2@step=9"])),
            v(&["server=1@step=4", "2@step=9"])
        );
    }

    #[test]
    fn base64_matches_known_encodings() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn failure_distributions_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(parse_dist("exponential").unwrap(), FailureDist::Exponential);
        assert_eq!(
            parse_dist("weibull:0.7").unwrap(),
            FailureDist::Weibull { shape: 0.7 }
        );
        assert_eq!(
            parse_dist("gamma:2").unwrap(),
            FailureDist::Gamma { shape: 2.0 }
        );
        for bad in ["normal", "weibull:x", "gamma:-1", "weibull"] {
            assert!(parse_dist(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_drawn_schedule_repeats_for_a_seed_and_round_trips_as_kill_specs() {
        let a = CompareArgs {
            mtbf_s: Some(0.5),
            seed: Some(3),
            ..Default::default()
        };
        let cfg = base_config(&a).unwrap();
        let (s1, k1) = schedule(&a, &cfg).unwrap();
        let (s2, _) = schedule(&a, &cfg).unwrap();
        assert_eq!(s1, s2);
        assert_eq!(k1.len(), 8);
        for (text, k) in s1.kills.iter().zip(&k1) {
            assert_eq!(&text.parse::<KillSpec>().unwrap(), k);
            assert!(k.id < cfg.servers);
        }
        let b = CompareArgs {
            failure_seed: Some(4),
            ..a.clone()
        };
        assert_ne!(schedule(&b, &cfg).unwrap().0.kills, s1.kills);
        let both = CompareArgs {
            kills: vec!["server=0@step=3".into()],
            ..a
        };
        assert!(schedule(&both, &cfg).is_err());
    }

    #[test]
    fn every_strategy_s_save_interval_is_read_from_its_configuration() {
        assert_eq!(
            every_steps(&StrategyChoice::parse("full", 6).unwrap()),
            Some(6)
        );
        assert_eq!(
            every_steps(&StrategyChoice::parse("cpr", 6).unwrap()),
            Some(6)
        );
        assert_eq!(
            every_steps(&StrategyChoice::parse("none", 6).unwrap()),
            None
        );
        // Prioritized saves share the full interval: a save point every 16 / 8 steps.
        let mut v = serde_json::to_value(StrategyChoice::parse("cpr", 16).unwrap()).unwrap();
        v["saves_per_full"] = 8.into();
        v["priority"] = "mfu".into();
        let c: StrategyChoice = serde_json::from_value(v).unwrap();
        assert_eq!(every_steps(&c), Some(2));
    }

    #[test]
    fn the_default_strategy_list_is_the_cluster_s_list() {
        let (v, explicit) = strategy_list(&CompareArgs::default()).unwrap();
        assert!(!explicit);
        assert_eq!(v, StrategyChoice::all_names());
        let bad = CompareArgs {
            strategies: vec!["full".into(), "fulll".into()],
            ..Default::default()
        };
        assert!(strategy_list(&bad)
            .unwrap_err()
            .to_string()
            .contains("fulll"));
    }
}

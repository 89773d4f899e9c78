//! `ftrec run` (launcher + coordinator), `ftrec coordinator` (the coordinator alone),
//! `ftrec server` and `ftrec worker` (one process of each role).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ftrec_cluster::{KillSpec, RunConfig, RunReport, StrategyChoice};
use ftrec_core::Preset;
use serde::Deserialize;

use crate::flags::{OptimizerArgs, RunArgs, ServerArgs, WorkerArgs};

/// A job file: the flags of `ftrec run`, as TOML keys (`-` written `_`). Unknown keys are an
/// error, so a misspelt setting never goes unnoticed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub preset: Option<String>,
    pub servers: Option<u32>,
    pub workers: Option<u32>,
    pub sync: Option<bool>,
    pub strategy: Option<String>,
    pub delta_every_steps: Option<u64>,
    pub full_every: Option<u64>,
    pub merge_stride: Option<u64>,
    pub merge_mib_per_s: Option<f64>,
    #[serde(alias = "ckpt_dir")]
    pub store: Option<String>,
    pub ckpt_chunk_kib: Option<usize>,
    pub ec_k: Option<usize>,
    pub ec_r: Option<usize>,
    pub ec_code: Option<String>,
    pub no_dense_replication: Option<bool>,
    pub no_2pc: Option<bool>,
    pub recovery_locks: Option<usize>,
    pub cpr_priority: Option<String>,
    pub target_pls: Option<f64>,
    pub mtbf_s: Option<f64>,
    pub cpr_r: Option<f64>,
    pub cpr_saves_per_full: Option<u64>,
    pub cpr_ssu_period: Option<u32>,
    pub cpr_tables: Option<usize>,
    pub rebuild_share: Option<f64>,
    pub rebuild_min_throughput: Option<f64>,
    pub ckpt_every_steps: Option<u64>,
    pub base_reset: Option<String>,
    pub extract_threshold: Option<f64>,
    pub range_rows: Option<u64>,
    pub no_concat: Option<bool>,
    pub cnr_reset_fraction: Option<f64>,
    pub quantize: Option<u8>,
    pub work_dir: Option<PathBuf>,
    #[serde(default)]
    pub kill: Vec<String>,
    #[serde(default)]
    pub data: Vec<PathBuf>,
    pub layout: Option<crate::flags::LayoutArg>,
    pub rows_per_table: Option<u64>,
    pub skip_malformed: Option<bool>,
    pub holdout_every: Option<u64>,
    pub epochs: Option<u64>,
    pub steps: Option<u64>,
    pub batch: Option<usize>,
    pub seed: Option<u64>,
    pub optimizer: Option<String>,
    pub lr: Option<f32>,
    pub dense_optimizer: Option<String>,
    pub dense_lr: Option<f32>,
    pub initial_accumulator: Option<f32>,
    pub dense_initial_accumulator: Option<f32>,
    pub threads: Option<usize>,
    pub compute_nice: Option<i32>,
    pub server_cpus: Option<ftrec_cluster::cpus::CpuSet>,
    pub worker_cpus: Option<ftrec_cluster::cpus::CpuSet>,
    pub eval_samples: Option<usize>,
    pub heartbeat_ms: Option<u64>,
    pub heartbeat_timeout_ms: Option<u64>,
    pub report_interval_s: Option<f64>,
    pub start_timeout_s: Option<f64>,
    pub lease_ttl_s: Option<f64>,
    pub save_timeout_s: Option<f64>,
    #[serde(default)]
    pub server_addr: Vec<ftrec_cluster::net::PeerAddr>,
    #[serde(default, deserialize_with = "listen_addr")]
    pub control_listen: Option<std::net::SocketAddr>,
    pub json: Option<PathBuf>,
    pub resume_or_start: Option<bool>,
}

/// `control_listen` as `--control-listen` takes it: an address, or a name looked up once.
fn listen_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<std::net::SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    ftrec_cluster::net::listen_addr(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

impl JobFile {
    /// Read and parse `path`; errors name the file and, for TOML errors, the place, on one
    /// line.
    pub fn read(path: &Path) -> Result<JobFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the job file {}", path.display()))?;
        JobFile::parse(&text).map_err(|e| anyhow::anyhow!("job file {}{e}", path.display()))
    }

    /// Parse a job file's text; the error is one line: the place (for TOML errors) and what
    /// is wrong.
    pub fn parse(text: &str) -> std::result::Result<JobFile, String> {
        toml::from_str(text).map_err(|e| {
            let place = e
                .span()
                .map(|s| format!(" (line {})", line_of(text, s.start)))
                .unwrap_or_default();
            format!("{place}: {}", e.message().replace('\n', " "))
        })
    }
}

/// The line (from 1) holding byte `offset` of `text`: newlines counted in bytes, so an offset
/// inside a multi-byte character (or past the end) is no problem.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Command-line flags over the job file (if any): flags given win.
pub fn merge(a: &RunArgs) -> Result<RunArgs> {
    let Some(path) = &a.config else {
        return Ok(a.clone());
    };
    let f = JobFile::read(path)?;
    Ok(RunArgs {
        config: a.config.clone(),
        resume: a.resume.clone(),
        resume_or_start: a.resume_or_start || f.resume_or_start.unwrap_or(false),
        preset: a.preset.clone().or(f.preset),
        servers: a.servers.or(f.servers),
        workers: a.workers.or(f.workers),
        sync: a.sync || f.sync.unwrap_or(false),
        strategy: a.strategy.clone().or(f.strategy),
        delta_every_steps: a.delta_every_steps.or(f.delta_every_steps),
        full_every: a.full_every.or(f.full_every),
        merge_stride: a.merge_stride.or(f.merge_stride),
        merge_mib_per_s: a.merge_mib_per_s.or(f.merge_mib_per_s),
        store: a.store.clone().or(f.store),
        ckpt_chunk_kib: a.ckpt_chunk_kib.or(f.ckpt_chunk_kib),
        ec: crate::flags::EcRunArgs {
            ec_k: a.ec.ec_k.or(f.ec_k),
            ec_r: a.ec.ec_r.or(f.ec_r),
            ec_code: a.ec.ec_code.clone().or(f.ec_code),
            no_dense_replication: a.ec.no_dense_replication
                || f.no_dense_replication.unwrap_or(false),
            no_2pc: a.ec.no_2pc || f.no_2pc.unwrap_or(false),
            recovery_locks: a.ec.recovery_locks.or(f.recovery_locks),
            rebuild_share: a.ec.rebuild_share.or(f.rebuild_share),
            rebuild_min_throughput: a.ec.rebuild_min_throughput.or(f.rebuild_min_throughput),
        },
        cpr: crate::flags::CprRunArgs {
            cpr_priority: a.cpr.cpr_priority.clone().or(f.cpr_priority),
            target_pls: a.cpr.target_pls.or(f.target_pls),
            mtbf_s: a.cpr.mtbf_s.or(f.mtbf_s),
            cpr_r: a.cpr.cpr_r.or(f.cpr_r),
            cpr_saves_per_full: a.cpr.cpr_saves_per_full.or(f.cpr_saves_per_full),
            cpr_ssu_period: a.cpr.cpr_ssu_period.or(f.cpr_ssu_period),
            cpr_tables: a.cpr.cpr_tables.or(f.cpr_tables),
        },
        ckpt_every_steps: a.ckpt_every_steps.or(f.ckpt_every_steps),
        incr: crate::flags::IncrRunArgs {
            base_reset: a.incr.base_reset.clone().or(f.base_reset),
            extract_threshold: a.incr.extract_threshold.or(f.extract_threshold),
            range_rows: a.incr.range_rows.or(f.range_rows),
            no_concat: a.incr.no_concat || f.no_concat.unwrap_or(false),
            cnr_reset_fraction: a.incr.cnr_reset_fraction.or(f.cnr_reset_fraction),
            quantize: a.incr.quantize.or(f.quantize),
        },
        work_dir: a.work_dir.clone().or(f.work_dir),
        kill: if a.kill.is_empty() {
            f.kill
        } else {
            a.kill.clone()
        },
        data: crate::flags::DataArgs {
            data: if a.data.data.is_empty() {
                f.data
            } else {
                a.data.data.clone()
            },
            layout: a.data.layout.or(f.layout),
            rows_per_table: a.data.rows_per_table.or(f.rows_per_table),
            skip_malformed: a.data.skip_malformed || f.skip_malformed.unwrap_or(false),
            holdout_every: a.data.holdout_every.or(f.holdout_every),
            epochs: a.data.epochs.or(f.epochs),
        },
        steps: a.steps.or(f.steps),
        batch: a.batch.or(f.batch),
        seed: a.seed.or(f.seed),
        opt: OptimizerArgs {
            optimizer: a.opt.optimizer.clone().or(f.optimizer),
            lr: a.opt.lr.or(f.lr),
            dense_optimizer: a.opt.dense_optimizer.clone().or(f.dense_optimizer),
            dense_lr: a.opt.dense_lr.or(f.dense_lr),
            initial_accumulator: a.opt.initial_accumulator.or(f.initial_accumulator),
            dense_initial_accumulator: a
                .opt
                .dense_initial_accumulator
                .or(f.dense_initial_accumulator),
        },
        threads: a.threads.or(f.threads),
        compute_nice: a.compute_nice.or(f.compute_nice),
        server_cpus: a.server_cpus.clone().or(f.server_cpus),
        worker_cpus: a.worker_cpus.clone().or(f.worker_cpus),
        eval_samples: a.eval_samples.or(f.eval_samples),
        heartbeat_ms: a.heartbeat_ms.or(f.heartbeat_ms),
        heartbeat_timeout_ms: a.heartbeat_timeout_ms.or(f.heartbeat_timeout_ms),
        report_interval_s: a.report_interval_s.or(f.report_interval_s),
        start_timeout_s: a.start_timeout_s.or(f.start_timeout_s),
        lease_ttl_s: a.lease_ttl_s.or(f.lease_ttl_s),
        save_timeout_s: a.save_timeout_s.or(f.save_timeout_s),
        server_addr: if a.server_addr.is_empty() {
            f.server_addr
        } else {
            a.server_addr.clone()
        },
        control_listen: a.control_listen.or(f.control_listen),
        json: a.json.clone().or(f.json),
        auth: a.auth.clone(),
        obs: a.obs.clone(),
        workers_elsewhere: a.workers_elsewhere,
    })
}

/// The executable every process runs, and the work directory (a new one under the temp dir
/// unless given).
pub(crate) fn exe_and_work_dir(a: &RunArgs) -> Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("finding the ftrec executable to start processes")?;
    let work_dir = match &a.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("ftrec-run-{}", std::process::id())),
    };
    Ok((exe, work_dir))
}

/// Flags (already merged with the job file) -> validated run configuration.
pub fn run_config(a: &RunArgs) -> Result<RunConfig> {
    if a.resume.is_some() {
        bail!("--resume applies to ftrec run and ftrec coordinator only");
    }
    let preset = Preset::by_name(a.preset.as_deref().unwrap_or("tiny"))?;
    let (exe, work_dir) = exe_and_work_dir(a)?;
    let mut cfg = RunConfig::new(preset, exe, work_dir);
    cfg.servers = a.servers.unwrap_or(2);
    cfg.workers = a.workers.unwrap_or(1);
    if cfg.workers == 0 {
        bail!("--workers must be at least 1");
    }
    cfg.sync = a.sync;
    let strategy = a.strategy.as_deref().unwrap_or("none");
    cfg.strategy = StrategyChoice::parse(strategy, a.ckpt_every_steps.unwrap_or(100))?;
    let ec = a.ec.flags();
    if strategy == "ecrec" {
        cfg.strategy = ec.strategy()?;
        if let StrategyChoice::EcRec {
            backstop_every_steps,
            ..
        } = &mut cfg.strategy
        {
            // ECRec §4's second layer: a rare full checkpoint to restore when more than r
            // servers are lost at once.
            if a.ckpt_every_steps == Some(0) {
                bail!(
                    "--ckpt-every-steps 0: an ecrec backstop needs at least 1 step between saves"
                );
            }
            *backstop_every_steps = a.ckpt_every_steps;
        }
    } else if ec.any() {
        bail!(
            "{} apply to --strategy ecrec only (the strategy is {strategy})",
            ec.given().join(", ")
        );
    }
    let cpr = a.cpr.flags(a.ckpt_every_steps);
    if strategy == "cpr" {
        cfg.strategy = cpr.strategy()?;
    } else if !cpr.given().is_empty() {
        bail!(
            "{} apply to --strategy cpr only (the strategy is {strategy})",
            cpr.given().join(", ")
        );
    }
    if !(matches!(strategy, "full" | "cpr" | "ecrec") || cfg.strategy.saves_pieces())
        && a.ckpt_every_steps.is_some()
    {
        bail!(
            "--ckpt-every-steps applies to --strategy full, cpr, ecrec (its backstop), incrcp, \
             incremental or cnr only"
        );
    }
    cfg.strategy = incr_strategy(cfg.strategy, &a.incr)?;
    let deck_flags = [
        ("--delta-every-steps", a.delta_every_steps.is_some()),
        ("--full-every", a.full_every.is_some()),
        ("--merge-stride", a.merge_stride.is_some()),
        ("--merge-mib-per-s", a.merge_mib_per_s.is_some()),
    ];
    if let StrategyChoice::Deck { .. } = cfg.strategy {
        cfg.strategy = StrategyChoice::Deck {
            delta_every_steps: a.delta_every_steps.unwrap_or(10),
            full_every_deltas: a.full_every,
            merge_stride: match a.merge_stride.unwrap_or(2) {
                0 => None,
                s => Some(s),
            },
            merge_mib_per_s: a.merge_mib_per_s,
        };
    } else if let Some((flag, _)) = deck_flags.iter().find(|(_, set)| *set) {
        bail!("{flag} applies to --strategy deck only");
    }
    if !cfg.strategy.uses_store() {
        for (flag, set) in [
            ("--store", a.store.is_some()),
            ("--ckpt-chunk-kib", a.ckpt_chunk_kib.is_some()),
        ] {
            if set {
                bail!("{flag} applies to strategies that save checkpoints, not to {strategy}");
            }
        }
    }
    cfg.store = a.store.clone();
    if let Some(k) = a.ckpt_chunk_kib {
        cfg.ckpt_chunk_kib = k;
    }
    cfg.kills = a
        .kill
        .iter()
        .map(|k| KillSpec::parse_many(k))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    if let Some(b) = a.batch {
        cfg.batch = b;
    }
    if let Some(tsv) = crate::train::tsv_config(&a.data)? {
        // `--epochs` alone: exactly that many passes, however many steps they make.
        if a.steps.is_none() && tsv.epochs.is_some() && cfg.batch > 0 {
            cfg.steps = crate::train::steps_of_epochs(&tsv, cfg.batch, u64::from(cfg.workers))?;
        }
        cfg = cfg.with_data(tsv);
    }
    if let Some(s) = a.steps {
        cfg.steps = s;
    }
    if let Some(e) = a.eval_samples {
        cfg.eval_samples = e;
    }
    cfg.seed = a.seed.unwrap_or(1);
    cfg.threads = a.threads.unwrap_or(1);
    if let Some(n) = a.compute_nice {
        cfg.compute_nice = n;
    }
    cfg.server_cpus = a.server_cpus.clone();
    cfg.worker_cpus = a.worker_cpus.clone();
    a.opt
        .apply(&mut cfg.sparse_optimizer, &mut cfg.dense_optimizer)?;
    cfg.heartbeat = Duration::from_millis(a.heartbeat_ms.unwrap_or(100));
    cfg.heartbeat_timeout = Duration::from_millis(a.heartbeat_timeout_ms.unwrap_or(1000));
    if let Some(i) = a.report_interval_s {
        cfg.report_interval_s = i;
    }
    apply_start_timeout(a, &mut cfg)?;
    cfg.external_servers = a.server_addr.clone();
    if let Some(c) = a.control_listen {
        cfg.control_listen = c;
    }
    cfg.auth = a.auth.resolve()?;
    cfg.validate()?;
    Ok(cfg)
}

/// `--start-timeout-s`, `--lease-ttl-s` and `--save-timeout-s`, checked (shared by a new run
/// and a resumed one).
pub fn apply_start_timeout(a: &RunArgs, cfg: &mut RunConfig) -> Result<()> {
    for (flag, v) in [
        ("--start-timeout-s", a.start_timeout_s),
        ("--lease-ttl-s", a.lease_ttl_s),
        ("--save-timeout-s", a.save_timeout_s),
    ] {
        if let Some(s) = v {
            if !(s.is_finite() && s > 0.0) {
                bail!("{flag} must be a positive number of seconds, not {s}");
            }
        }
    }
    if let Some(s) = a.start_timeout_s {
        cfg.start_timeout = Duration::from_secs_f64(s);
    }
    if let Some(s) = a.lease_ttl_s {
        if s < 1.0 {
            bail!("--lease-ttl-s must be at least 1 second (it is renewed every third of it), not {s}");
        }
        cfg.lease_ttl = Duration::from_secs_f64(s);
    }
    if a.save_timeout_s.is_some() {
        cfg.save_timeout_s = a.save_timeout_s;
    }
    Ok(())
}

pub fn run(a: RunArgs) -> Result<()> {
    a.obs.linger()?;
    a.obs.start()?;
    let a = resume_or_start(merge(&a)?)?;
    let mut cfg = match &a.resume {
        Some(location) => crate::resume::config(&a, location)?,
        None => run_config(&a)?,
    };
    if a.workers_elsewhere {
        cfg.external_workers = true;
        cfg.validate()?;
    }
    execute(&a, cfg)
}

/// The coordinator alone: servers and workers are started elsewhere.
pub fn coordinator(a: RunArgs) -> Result<()> {
    a.obs.linger()?;
    a.obs.start()?;
    let a = resume_or_start(merge(&a)?)?;
    if a.server_addr.is_empty() {
        bail!("ftrec coordinator needs the servers' addresses (--server-addr, one per server)");
    }
    if a.workers_elsewhere {
        bail!("--workers-elsewhere is for ftrec run: ftrec coordinator's workers are always started elsewhere");
    }
    let mut cfg = match &a.resume {
        Some(location) => crate::resume::config(&a, location)?,
        None => run_config(&a)?,
    };
    cfg.external_workers = true;
    cfg.validate()?;
    execute(&a, cfg)
}

/// Where TSV data comes from, for a log line: the file or directory, or how many files.
pub fn data_path(t: &ftrec_data::tsv::TsvConfig) -> String {
    match &t.path {
        ftrec_data::DataPath::File(p) | ftrec_data::DataPath::Dir(p) => p.display().to_string(),
        ftrec_data::DataPath::Files(ps) => format!("{} files", ps.len()),
    }
}

fn execute(a: &RunArgs, cfg: RunConfig) -> Result<()> {
    ftrec_cluster::auth::check_exposure(
        "--control-listen",
        cfg.control_listen,
        &cfg.auth,
        a.auth.insecure,
    )?;
    let data = match &cfg.data {
        Some(t) => format!(
            " | data {} ({} epochs)",
            data_path(t),
            t.epochs.map_or("unlimited".to_string(), |e| e.to_string())
        ),
        None => String::new(),
    };
    tracing::info!(
        "ftrec run: preset {}{data} | {} servers, {} workers ({}) | strategy {} | {} steps x {} x batch {} | seed {} | work dir {}",
        cfg.preset.name,
        cfg.servers,
        cfg.workers,
        if cfg.sync { "sync" } else { "async" },
        cfg.strategy.name(),
        cfg.steps,
        cfg.workers,
        cfg.batch,
        cfg.seed,
        cfg.work_dir.display()
    );
    let report = match &a.resume {
        Some(location) => {
            tracing::info!("resuming the job recorded in {location}");
            ftrec_cluster::resume(&cfg)
        }
        None => ftrec_cluster::run(&cfg),
    };
    if a.work_dir.is_none() {
        // A work directory of our own making (port files, checkpoints) goes with the run.
        let _ = std::fs::remove_dir_all(&cfg.work_dir);
    }
    let report = report?;
    // Every kill of the schedule, fired or not: a kill whose point never came is said.
    for k in &report.kills {
        tracing::info!("ftrec run: {}", k.line());
    }
    println!("{}", report.summary());
    if let Some(path) = &a.json {
        crate::write_json(path, &report).with_context(|| "writing the JSON report")?;
        tracing::info!("report written to {}", path.display());
    }
    finish(&report)
}

/// A run the strategy aborted is a failed run.
fn finish(report: &RunReport) -> Result<()> {
    match &report.aborted {
        Some(reason) => bail!("{reason}"),
        None => Ok(()),
    }
}

/// `--resume-or-start`: `--resume STORE` when the store holds a job record, nothing
/// otherwise (a fresh start).
fn resume_or_start(mut a: RunArgs) -> Result<RunArgs> {
    if !a.resume_or_start || a.resume.is_some() {
        return Ok(a);
    }
    let Some(store) = a.store.clone() else {
        bail!("--resume-or-start needs --store: the store a restart resumes from");
    };
    let fresh_dir = !store.starts_with("s3://") && !std::path::Path::new(&store).exists();
    let opts = ftrec_ckpt::location::LocationOptions::from_env();
    if !fresh_dir && ftrec_cluster::job::read_if_any(&store, &opts)?.is_some() {
        tracing::info!("{store} holds this job's record: resuming it (--resume-or-start)");
        a.resume = Some(store);
    }
    Ok(a)
}

pub fn server(a: ServerArgs) -> Result<()> {
    a.obs.start()?;
    ftrec_cluster::serve_shard(&a.spec()?)?;
    Ok(())
}

pub fn worker(a: WorkerArgs) -> Result<()> {
    a.obs.start()?;
    a.run()?;
    Ok(())
}

/// The incremental strategies' flags applied to `choice`; a flag of another strategy is an
/// error naming it.
fn incr_strategy(choice: StrategyChoice, f: &crate::flags::IncrRunArgs) -> Result<StrategyChoice> {
    let only = |flags: &[&str], name: &str| -> Result<()> {
        if let Some((flag, _)) = f
            .given()
            .into_iter()
            .find(|(flag, set)| *set && !flags.contains(flag))
        {
            bail!("{flag} does not apply to --strategy {name}");
        }
        Ok(())
    };
    let pieces = |v: &str| -> Result<u64> {
        v.parse::<u64>().ok().filter(|&n| n >= 1).with_context(|| {
            format!("--base-reset {v}: expected auto, never or a number of pieces (1 or more)")
        })
    };
    Ok(match choice {
        StrategyChoice::Incremental { every_steps, .. } => {
            only(&["--base-reset"], "incremental")?;
            let full_every_pieces = match f.base_reset.as_deref() {
                None | Some("never") => None,
                Some("auto") => bail!(
                    "--base-reset auto is IncrCP's rule (--strategy incrcp); incremental takes \
                     never or N"
                ),
                Some(v) => Some(pieces(v)?),
            };
            StrategyChoice::Incremental {
                every_steps,
                full_every_pieces,
            }
        }
        StrategyChoice::Cnr { every_steps, .. } => {
            only(&["--cnr-reset-fraction", "--quantize"], "cnr")?;
            let reset_fraction = match f.cnr_reset_fraction {
                None => Some(ftrec_cluster::spec::DEFAULT_CNR_RESET_FRACTION),
                Some(0.0) => None,
                Some(x) => Some(x),
            };
            StrategyChoice::Cnr {
                every_steps,
                reset_fraction,
                quant_bits: f.quantize,
            }
        }
        StrategyChoice::IncrCp { every_steps, .. } => {
            only(
                &[
                    "--base-reset",
                    "--extract-threshold",
                    "--range-rows",
                    "--no-concat",
                ],
                "incrcp",
            )?;
            let reset = match f.base_reset.as_deref() {
                None | Some("auto") => ftrec_strategy::BaseReset::Auto,
                Some("never") => ftrec_strategy::BaseReset::Never,
                Some(v) => ftrec_strategy::BaseReset::EveryPieces(pieces(v)?),
            };
            StrategyChoice::IncrCp {
                every_steps,
                reset,
                threshold: f
                    .extract_threshold
                    .unwrap_or(ftrec_cluster::spec::DEFAULT_EXTRACT_THRESHOLD),
                range_rows: f.range_rows.unwrap_or(0),
                concat: !f.no_concat,
            }
        }
        other => {
            only(&[], other.name())?;
            other
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_core::fuzz::{mutated, Mutation};
    use proptest::prelude::*;

    const VALID: &str = "# a job\npreset = \"tiny\"\nservers = 3\nworkers = 2\nsync = true\n\
        strategy = \"full\"\nkill = [\"server=1@step=12\", \"worker=0@step=15\"]\n\
        server_addr = [\"127.0.0.1:7001\"]\nlr = 0.05\njson = \"r\u{e9}port.json\"\n";

    #[test]
    fn the_valid_job_parses() {
        let f = JobFile::parse(VALID).unwrap();
        assert_eq!((f.servers, f.workers, f.kill.len()), (Some(3), Some(2), 2));
    }

    #[test]
    fn job_file_cpu_sets_parse_and_a_bad_one_names_its_line() {
        let f = JobFile::parse("server_cpus = \"1\"\nworker_cpus = \"0,2-3\"\n").unwrap();
        assert_eq!(f.server_cpus.unwrap().cpus(), [1]);
        assert_eq!(f.worker_cpus.unwrap().cpus(), [0, 2, 3]);
        let e = JobFile::parse("workers = 2\nworker_cpus = \"3-1\"\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("backwards"), "{e}");
    }

    #[test]
    fn job_file_peers_take_names_and_a_bad_one_names_its_line() {
        let f = JobFile::parse(
            "server_addr = [\"ftrec-server-0.ftrec-servers:7000\", \"[::1]:7001\"]\n\
             control_listen = \"localhost:7100\"\n",
        )
        .unwrap();
        let names: Vec<String> = f.server_addr.iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["ftrec-server-0.ftrec-servers:7000", "[::1]:7001"]);
        assert!(f.control_listen.unwrap().ip().is_loopback());
        let e = JobFile::parse("workers = 2\nserver_addr = [\"h1\"]\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("HOST:PORT"), "{e}");
    }

    #[test]
    fn lines_are_counted_in_bytes_even_inside_a_character() {
        let text = "a = 1\n\u{e9}\u{e9}\nb";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 6), 2);
        // Offset 7 is inside the first two-byte character: slicing the str there would panic.
        assert!(!text.is_char_boundary(7));
        assert_eq!(line_of(text, 7), 2);
        assert_eq!(line_of(text, 11), 3);
        assert_eq!(line_of(text, usize::MAX), 3);
    }

    #[test]
    fn errors_name_the_line_and_stay_on_one() {
        let e = JobFile::parse("preset = \"t\u{e9}ny\"\nservers = \"two\"\n").unwrap_err();
        assert!(e.contains("line 2") && !e.contains('\n'), "{e}");
        let e = JobFile::parse("\u{e9}t\u{e9} = 1\n").unwrap_err();
        assert!(e.contains("line 1") && !e.contains('\n'), "{e}");
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
            (
                any::<usize>(),
                prop::sample::select(b"\n\"'[]=.,#\\0-9e \xc3\xa9\xff".to_vec())
            )
                .prop_map(|(at, byte)| Mutation::Insert { at, byte }),
            any::<usize>().prop_map(|at| Mutation::Delete { at }),
            any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        ]
    }

    fn check(text: &str) {
        if let Err(e) = JobFile::parse(text) {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn job_files_of_arbitrary_text(text in "\\PC*") {
            check(&text);
        }

        #[test]
        fn mutated_job_files(ms in prop::collection::vec(mutation(), 0..6)) {
            let bytes = mutated(VALID.as_bytes(), &ms);
            // A job file is read as text: invalid UTF-8 never gets this far.
            check(&String::from_utf8_lossy(&bytes));
        }
    }
}

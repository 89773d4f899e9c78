//! `ftrec run` (launcher + coordinator) and `ftrec server` (one parameter-server process).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use ftrec_cluster::{KillSpec, RunConfig, RunReport, ServerSpec, StrategyChoice};
use ftrec_core::Preset;

use crate::flags::{RunArgs, ServerArgs};

/// Flags -> validated run configuration.
pub fn run_config(a: &RunArgs) -> Result<RunConfig> {
    let preset = Preset::by_name(&a.preset)?;
    let exe = std::env::current_exe().context("finding the ftrec executable to start servers")?;
    let work_dir = match &a.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("ftrec-run-{}", std::process::id())),
    };
    let mut cfg = RunConfig::new(preset, exe, work_dir);
    cfg.servers = a.servers;
    cfg.workers = a.workers;
    cfg.sync = a.sync;
    cfg.strategy = StrategyChoice::parse(&a.strategy, a.ckpt_every_steps)?;
    if a.strategy != "full" && a.ckpt_dir.is_some() {
        bail!("--ckpt-dir applies to --strategy full only");
    }
    cfg.ckpt_dir = a.ckpt_dir.clone();
    cfg.kills = a
        .kill
        .iter()
        .map(|k| k.parse::<KillSpec>())
        .collect::<Result<_, _>>()?;
    if let Some(s) = a.steps {
        cfg.steps = s;
    }
    if let Some(b) = a.batch {
        cfg.batch = b;
    }
    if let Some(e) = a.eval_samples {
        cfg.eval_samples = e;
    }
    cfg.seed = a.seed;
    cfg.threads = a.threads;
    a.opt
        .apply(&mut cfg.sparse_optimizer, &mut cfg.dense_optimizer)?;
    cfg.heartbeat = Duration::from_millis(a.heartbeat_ms);
    cfg.heartbeat_timeout = Duration::from_millis(a.heartbeat_timeout_ms);
    cfg.validate()?;
    Ok(cfg)
}

pub fn run(a: RunArgs) -> Result<()> {
    let cfg = run_config(&a)?;
    eprintln!(
        "ftrec run: preset {} | {} servers, {} workers{} | strategy {} | {} steps x {} x batch {} | seed {} | work dir {}",
        cfg.preset.name,
        cfg.servers,
        cfg.workers,
        if cfg.sync { " (sync)" } else { "" },
        a.strategy,
        cfg.steps,
        cfg.workers,
        cfg.batch,
        cfg.seed,
        cfg.work_dir.display()
    );
    let report = ftrec_cluster::run(&cfg);
    if a.work_dir.is_none() {
        // A work directory of our own making (port files, checkpoints) goes with the run.
        let _ = std::fs::remove_dir_all(&cfg.work_dir);
    }
    let report = report?;
    println!("{}", report.summary());
    if let Some(path) = &a.json {
        crate::write_json(path, &report).with_context(|| "writing the JSON report")?;
        eprintln!("report written to {}", path.display());
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

pub fn server(a: ServerArgs) -> Result<()> {
    let preset = Preset::by_name(&a.preset)?;
    let mut spec = ServerSpec::from_preset(&preset, a.id, a.servers, a.seed)?;
    a.opt
        .apply(&mut spec.sparse_optimizer, &mut spec.dense_optimizer)?;
    spec.listen = a.listen;
    spec.port_file = a.port_file;
    spec.until = a.until.parse()?;
    spec.validate()?;
    ftrec_cluster::serve_shard(&spec)?;
    Ok(())
}

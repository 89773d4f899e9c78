//! `ftrec advise`: which strategy to run at production scale, and what it will cost.
//!
//! Calibrates every strategy's cost coefficients from a `compare` report measured on this machine
//! (`--calibrate DIR`), plans each strategy at the given cluster (`ftrec_sim::model::plan`:
//! Young's interval, CPR Eq. 2/4, DECK Inequalities 1/2, ECRec's (k+r)/k), simulates days of
//! failures and ranks them. `--validate DIR` predicts the measured overheads of another compare
//! run (not used for the calibration) and reports the error per strategy.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftrec_sim::model::{bytes, replay, secs};
use ftrec_sim::sim::{simulate, Failures, Stop, TraceAt, TraceFailure};
use ftrec_sim::{Advice, Calibration, Candidate, Scenario, Trust};
use serde::Serialize;

use crate::compare::{measured, CompareReport};

#[derive(Args, Debug, Clone)]
pub struct AdviseArgs {
    /// The compare report (its directory or report.json) to calibrate from.
    #[arg(long, value_name = "DIR", default_value = "ftrec-compare")]
    pub calibrate: PathBuf,
    /// Model size in GB (values and optimizer state of every row and dense block).
    #[arg(long, value_name = "GB")]
    pub model_gb: f64,
    /// Parameter servers.
    #[arg(long)]
    pub servers: u32,
    /// Workers.
    #[arg(long)]
    pub workers: u32,
    /// Failure-free training step time, in milliseconds.
    #[arg(long, value_name = "MS")]
    pub step_ms: f64,
    /// Mean time between failures of one server, in hours.
    #[arg(long, value_name = "H")]
    pub mtbf_hours: f64,
    /// Time between failures of one server: exponential, weibull:SHAPE or gamma:SHAPE.
    #[arg(long, value_name = "DIST", default_value = "exponential")]
    pub failure_dist: String,
    /// Disk bandwidth per server, Gbit/s (a 2 GB/s NVMe drive is 16).
    #[arg(long, value_name = "GBIT", default_value_t = 16.0)]
    pub disk_gbps: f64,
    /// Network bandwidth per server, Gbit/s (CPR §3.1's fleet: 25).
    #[arg(long, value_name = "GBIT", default_value_t = 25.0)]
    pub net_gbps: f64,
    /// Memory free on a server for redundancy, as a fraction of its model shard.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5)]
    pub memory_headroom: f64,
    /// Seconds to reschedule a lost server [default: the process start measured here].
    #[arg(long, value_name = "S")]
    pub reschedule_s: Option<f64>,
    /// Fraction of the model one step touches [default: scaled from the calibration].
    #[arg(long, value_name = "FRACTION")]
    pub touched_per_step: Option<f64>,
    /// CPR's target portion of lost samples for partial recovery (CPR §4.2 suggests 0.1).
    #[arg(long, default_value_t = 0.1)]
    pub target_pls: f64,
    /// Simulated days per replica.
    #[arg(long, default_value_t = 7.0)]
    pub days: f64,
    /// Simulated replicas (different failure draws).
    #[arg(long, default_value_t = 16)]
    pub replicas: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A held-out compare report: predict its measured overheads and report the error.
    #[arg(long, value_name = "DIR")]
    pub validate: Option<PathBuf>,
    /// Write the advice (and validation) as JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Rank the strategies even from a calibration that cannot speak for this cluster (runs
    /// too short, a model more than 1,000x larger): the figures come marked as extrapolated.
    #[arg(long)]
    pub extrapolate: bool,
}

/// One strategy's predicted and measured overhead in a held-out run.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub strategy: String,
    pub measured: f64,
    pub predicted: f64,
    /// |predicted - measured| / |measured|.
    pub relative_error: f64,
    /// Absolute difference, in points of overhead.
    pub abs_error: f64,
}

#[derive(Serialize)]
struct Output<'a> {
    calibration: &'a Calibration,
    trust: &'a Trust,
    /// `None`: the calibration cannot speak for the scenario and `--extrapolate` was not given.
    advice: Option<&'a Advice>,
    validation: Option<Vec<Validation>>,
}

impl Output<'_> {
    /// The `--json` file, when one is asked for.
    fn write(&self, path: Option<&std::path::Path>) -> Result<()> {
        match path {
            Some(p) => crate::write_json(p, self),
            None => Ok(()),
        }
    }
}

/// Calibrate from a compare report: every strategy that finished, the reference included;
/// the others are named in `dropped` with the reason.
pub fn calibration(rep: &CompareReport) -> Result<Calibration> {
    let mut runs = Vec::new();
    let mut dropped: Vec<(String, String)> = rep
        .skipped
        .iter()
        .map(|(n, why)| (n.clone(), format!("not run: {why}")))
        .collect();
    for s in &rep.summary {
        if s.status != "ok" {
            dropped.push((s.strategy.clone(), s.status.clone()));
            continue;
        }
        match measured(rep, &s.strategy) {
            Some(m) => runs.push(m),
            None => dropped.push((s.strategy.clone(), "no finished run to measure".into())),
        }
    }
    if runs.is_empty() {
        bail!("the compare report has no finished run to calibrate from");
    }
    let mut cal = Calibration::from_runs(rep.machine, &runs)?;
    cal.dropped = dropped;
    Ok(cal)
}

/// Steps of a suggested calibration: about 22 s of reference training on a 2-core machine
/// (both presets take ~55 ms a step with 3 servers and 2 workers), twice
/// [`ftrec_sim::trust::MIN_CALIBRATION_TRAIN_S`], so a faster machine still passes.
pub const CALIBRATION_STEPS: u64 = 400;

/// The kills of a suggested calibration: two servers, a third and two thirds into the run, so
/// every strategy measures a recovery (a calibration without failures prices none).
pub fn calibration_kills(steps: u64) -> String {
    format!(
        "server=1@step={},server=2@step={}",
        steps / 3,
        2 * steps / 3
    )
}

/// The presets one can calibrate on, smallest first, each with a `compare` command whose
/// reference run trains long enough on a 2-core machine and whose kills give every strategy a
/// recovery to measure.
pub fn candidates() -> Result<Vec<Candidate>> {
    ["small", "kaggle"]
        .iter()
        .map(|&preset| {
            let steps = CALIBRATION_STEPS;
            let cfg = crate::cluster_cmd::run_config(&crate::flags::RunArgs {
                preset: Some(preset.into()),
                servers: Some(3),
                workers: Some(2),
                ..Default::default()
            })?;
            Ok(Candidate {
                preset: preset.into(),
                model_bytes: crate::compare::model_bytes(&cfg) as f64,
                command: format!(
                    "ftrec compare --preset {preset} --servers 3 --workers 2 --sync --steps \
                     {steps} --kills {} --rounds 3 --out cmp-{preset}",
                    calibration_kills(steps)
                ),
            })
        })
        .collect()
}

/// The lines that say why a calibration cannot speak for the scenario and what to run instead.
pub fn trust_lines(t: &Trust, calibrated_from: &str, args: &str) -> String {
    let mut s = format!("{calibrated_from} cannot speak for this cluster:\n");
    for r in &t.reasons {
        s += &format!("  - {r}\n");
    }
    if let Some(c) = &t.calibrate_instead {
        s += &format!(
            "Calibrate on preset {} ({} of values and optimizer state) instead:\n  {}\n  \
             ftrec advise --calibrate cmp-{} {args}\n",
            c.preset,
            bytes(c.model_bytes),
            c.command,
            c.preset
        );
    }
    s
}

/// Predict every strategy's overhead in `held_out` from `cal`, with the held-out run's own
/// configuration and kills, on the calibration machine.
pub fn validate(cal: &Calibration, held_out: &CompareReport) -> Result<Vec<Validation>> {
    let mut out = Vec::new();
    for s in held_out.summary.iter().filter(|s| s.strategy != "none") {
        let (Some(meas), Some(c)) = (s.overhead, cal.get(&s.strategy)) else {
            continue;
        };
        let Some(m) = measured(held_out, &s.strategy) else {
            continue;
        };
        let job = replay(c, &cal.machine, &m)?;
        let step_s = m.baseline_train_s / m.steps as f64;
        let trace = m
            .failures
            .iter()
            .enumerate()
            .map(|(i, f)| TraceFailure {
                at: TraceAt::Work(f.at_step as f64 * step_s),
                server: i as u32 % m.servers.max(1),
            })
            .collect();
        let o = simulate(&job, Failures::Trace(trace), Stop::Work(m.baseline_train_s))?;
        let predicted = o.overhead();
        out.push(Validation {
            strategy: s.strategy.clone(),
            measured: meas,
            predicted,
            relative_error: (predicted - meas).abs() / meas.abs().max(1e-9),
            abs_error: (predicted - meas).abs(),
        });
    }
    Ok(out)
}

pub fn validation_table(v: &[Validation]) -> String {
    let mut s = format!(
        "{:<10} {:>10} {:>10} {:>10} {:>10}\n",
        "strategy", "measured", "predicted", "error", "rel error"
    );
    for x in v {
        s += &format!(
            "{:<10} {:>9.1}% {:>9.1}% {:>9.1}pt {:>9.0}%\n",
            x.strategy,
            x.measured * 100.0,
            x.predicted * 100.0,
            x.abs_error * 100.0,
            x.relative_error * 100.0
        );
    }
    s
}

fn pct(x: f64) -> String {
    if x.is_finite() && x < 10.0 {
        format!("{:.1}%", x * 100.0)
    } else {
        "> 1000%".into()
    }
}

pub fn advice_table(a: &Advice) -> String {
    let mut s = format!(
        "{:<3} {:<8} {:>15} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10}\n",
        "#",
        "strategy",
        "overhead",
        "saves/d",
        "reload/d",
        "lost/d",
        "resched/d",
        "degr./d",
        "steady/d",
        "unrec/d",
        "mem/server",
        "storage"
    );
    for (i, r) in a.ranking.iter().enumerate() {
        let d = &r.summary.per_day;
        let oh = if !r.plan.feasible {
            "does not fit".to_string()
        } else if r.summary.overhead.is_finite() && r.summary.overhead < 10.0 {
            format!(
                "{} ±{:.1}",
                pct(r.summary.overhead),
                r.summary.overhead_stderr * 100.0
            )
        } else {
            pct(r.summary.overhead)
        };
        s += &format!(
            "{:<3} {:<8} {:>15} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.2} {:>10} {:>10}\n",
            i + 1,
            r.strategy,
            oh,
            secs(d.save),
            secs(d.load),
            secs(d.lost),
            secs(d.res),
            secs(d.degraded),
            secs(d.steady),
            r.summary.unrecoverable_per_day,
            bytes(r.plan.extra_memory_bytes_per_server),
            bytes(r.plan.storage_bytes),
        );
    }
    s += "\n";
    for r in &a.ranking {
        s += &format!("{}: {}", r.strategy, r.plan.config);
        if let Some(w) = &r.plan.why_not {
            s += &format!(" [does not fit: {w}]");
        }
        s += "\n";
        for n in &r.plan.notes {
            s += &format!("  {n}\n");
        }
    }
    s
}

pub fn run(a: AdviseArgs) -> Result<()> {
    let rep = CompareReport::read(&a.calibrate).with_context(|| {
        format!(
            "calibrating from {} (run `ftrec compare` or `ftrec demo` first, or give \
             --calibrate DIR)",
            a.calibrate.display()
        )
    })?;
    let cal = calibration(&rep)?;
    let gbit = 1e9 / 8.0;
    let scenario = Scenario {
        model_bytes: a.model_gb * 1e9,
        servers: a.servers,
        workers: a.workers,
        step_s: a.step_ms / 1e3,
        mtbf_server_s: a.mtbf_hours * 3_600.0,
        dist: crate::compare::parse_dist(&a.failure_dist)?,
        disk_bps: a.disk_gbps * gbit,
        net_bps: a.net_gbps * gbit,
        memory_headroom: a.memory_headroom,
        reschedule_s: a.reschedule_s,
        touched_per_step: a.touched_per_step,
        target_pls: a.target_pls,
        days: a.days,
        replicas: a.replicas,
        seed: a.seed,
    };
    scenario.validate()?;
    let reference_train_s = rep.reference().map_or(0.0, |r| r.train_s);
    let trust = ftrec_sim::assess(&cal, reference_train_s, &scenario, &candidates()?);
    for (name, why) in &cal.dropped {
        println!("calibration: {name} left out: {why}");
    }
    let question = format!(
        "--model-gb {} --servers {} --workers {} --step-ms {} --mtbf-hours {}",
        a.model_gb, a.servers, a.workers, a.step_ms, a.mtbf_hours
    );
    let from = format!("the calibration {}", a.calibrate.display());
    if cal.strategies.iter().all(|c| c.detect_s.is_none()) {
        // Nothing to price a recovery with: every figure of the advice would be missing one.
        let all = candidates()?;
        let c = all
            .iter()
            .find(|c| c.preset == rep.preset)
            .or(all.first())
            .context("no preset to calibrate on")?;
        bail!(
            "{from} measured no failure (its comparison ran without --kills), so it prices no \
             recovery; calibrate on a comparison with kills: {} then ftrec advise \
             --calibrate cmp-{} {question}",
            c.command,
            c.preset
        );
    }
    if !trust.trusted() && !a.extrapolate {
        print!("{}", trust_lines(&trust, &from, &question));
        println!("(--extrapolate ranks the strategies from it anyway, marked as extrapolated.)");
        let out = Output {
            calibration: &cal,
            trust: &trust,
            advice: None,
            validation: None,
        };
        return out.write(a.json.as_deref());
    }
    let advice = ftrec_sim::advise(&cal, &scenario)?;
    if !trust.trusted() {
        print!("EXTRAPOLATED: {}", trust_lines(&trust, &from, &question));
        println!();
    }
    println!(
        "{} model on {} servers and {} workers, {} ms steps, {} h MTBF per server ({}), \
         calibrated from {} ({} strategies); {} days x {} simulated, seconds lost per day:\n",
        bytes(scenario.model_bytes),
        a.servers,
        a.workers,
        a.step_ms,
        a.mtbf_hours,
        a.failure_dist,
        a.calibrate.display(),
        cal.strategies.len(),
        a.days,
        a.replicas
    );
    print!("{}", advice_table(&advice));
    println!(
        "\nbest: {}\n{}",
        advice.best.as_deref().unwrap_or("none fits"),
        advice.why
    );
    for w in &advice.warnings {
        println!("warning: {w}");
    }
    let validation = match &a.validate {
        Some(dir) => {
            let held = CompareReport::read(dir)?;
            let v = validate(&cal, &held)?;
            println!(
                "\nvalidation on {} (not used for the calibration): overhead against none\n{}",
                dir.display(),
                validation_table(&v)
            );
            Some(v)
        }
        None => None,
    };
    let out = Output {
        calibration: &cal,
        trust: &trust,
        advice: Some(&advice),
        validation,
    };
    out.write(a.json.as_deref())
}

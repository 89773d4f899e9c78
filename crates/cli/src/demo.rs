//! `ftrec demo`: a `compare` on the tiny preset with two server kills (three interleaved
//! rounds), then the summary table, what its columns mean, one line on what a model of this
//! size can and cannot tell, and where the report is.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::compare::{compare, notes, text_table, CompareArgs, CompareReport};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "ftrec-demo")]
    pub out: PathBuf,
    /// Training steps of every run [default: about 8,600 steps shared by the strategies and
    /// rounds, so the demo stays near a minute and a half however many strategies there are].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Strategies to run, comma-separated [default: every strategy ftrec has; `none`, the
    /// reference, always runs].
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Rounds of every strategy, interleaved [default: 3].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Held-out samples for AUC and logloss [default: the preset's].
    #[arg(long)]
    pub eval_samples: Option<usize>,
    /// Criteo TSV data instead of the synthetic stream (`ftrec run`'s data flags).
    #[command(flatten)]
    pub data: crate::flags::DataArgs,
}

/// Rounds of the demo: three runs of each strategy, interleaved.
pub const DEMO_ROUNDS: u32 = 3;

/// Save interval of every saving strategy in the demo, in steps: fixed, so a strategy's cost
/// per step at steady state is the same in a run of any length (a `compare` of longer runs with
/// `--ckpt-every-steps 120` measures the same thing).
pub const DEMO_SAVE_EVERY: u64 = 120;

/// Steps of every run of the demo: a budget of 8,640 steps over the strategies and rounds, 240
/// to 1,200 each, in whole save intervals (4 to 10 ms a step on the tiny preset on a loaded
/// 2-core machine, plus about a second of process start and teardown per run).
pub fn demo_steps(strategies: usize, rounds: u32) -> u64 {
    let n = (strategies.max(1) * rounds.max(1) as usize) as u64;
    (8_640 / n).clamp(240, 1_200) / DEMO_SAVE_EVERY * DEMO_SAVE_EVERY
}

/// The demo's comparison: synchronous (so every exact strategy ends with the failure-free
/// digest), 3 servers and 2 workers, a save every 120 steps, server 1 killed a little over a
/// third of the way and server 2 a little under three quarters (off the save points, so full
/// recovery has work to redo).
pub fn demo_args(out: PathBuf, steps: u64) -> CompareArgs {
    let steps = steps.max(12);
    CompareArgs {
        preset: Some("tiny".into()),
        servers: Some(3),
        workers: Some(2),
        sync: true,
        steps: Some(steps),
        rounds: Some(DEMO_ROUNDS),
        ckpt_every_steps: Some(DEMO_SAVE_EVERY.min(steps / 3).max(1)),
        kills: vec![
            format!("server=1@step={}", steps * 38 / 100),
            format!("server=2@step={}", steps * 72 / 100),
        ],
        out,
        ..Default::default()
    }
}

/// One line: the preset, the model's size and the step time the figures come from, and that
/// they do not carry over to a real model.
pub fn scale_line(rep: &CompareReport) -> String {
    let step_ms = rep
        .summary
        .iter()
        .find(|s| s.strategy == "none")
        .and_then(|s| s.steady.map(|st| st.step_s * 1e3));
    format!(
        "ran preset {} ({:.1} MiB of values and optimizer state, {} servers, {} workers, {} \
         steps x {} rounds{}): at this size a step takes milliseconds, so fixed costs per save, \
         per step and per recovery weigh far more than on a real model; these figures do not \
         carry over to one (`ftrec compare --preset small` is closer, `ftrec advise` says what \
         to calibrate on)",
        rep.preset,
        rep.model_bytes as f64 / (1u64 << 20) as f64,
        rep.servers,
        rep.workers,
        rep.steps,
        rep.rounds,
        step_ms.map_or(String::new(), |ms| format!(
            ", {ms:.1} ms a step without fault tolerance"
        ))
    )
}

pub fn run(a: DemoArgs) -> Result<()> {
    let rounds = a.rounds.unwrap_or(DEMO_ROUNDS);
    let strategies = if a.strategies.is_empty() {
        ftrec_cluster::StrategyChoice::all_names().len()
    } else {
        a.strategies.len()
    };
    let mut args = demo_args(
        a.out.clone(),
        a.steps.unwrap_or_else(|| demo_steps(strategies, rounds)),
    );
    args.rounds = Some(rounds);
    args.strategies = a.strategies.clone();
    args.eval_samples = a.eval_samples;
    args.data = a.data.clone();
    let command: Vec<String> = std::env::args().collect();
    let rep = compare(&args, command)?;
    println!("{}", text_table(&rep));
    for n in notes(&rep) {
        println!("{n}.");
    }
    println!("\n{}.", scale_line(&rep));
    println!("report: {}", a.out.join("report.html").display());
    println!(
        "next: ftrec advise --calibrate {} --model-gb 1000 --servers 100 --workers 100 \
         --step-ms 200 --mtbf-hours 24 (it says whether a calibration can speak for the cluster \
         you give it, and what to calibrate on when it cannot)",
        a.out.display()
    );
    Ok(())
}

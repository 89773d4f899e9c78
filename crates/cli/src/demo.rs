//! `ftrec demo`: a short `compare` on the tiny preset with two server kills (three interleaved
//! rounds, the median shown), then the summary table and where the report is.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::compare::{compare, text_table, CompareArgs};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "ftrec-demo")]
    pub out: PathBuf,
    /// Training steps of every run [default: about 4,800 steps shared by the strategies, so
    /// the demo stays near a minute and a half however many strategies there are].
    #[arg(long)]
    pub steps: Option<u64>,
}

/// Rounds of the demo: the median of three runs of each strategy, interleaved.
pub const DEMO_ROUNDS: u32 = 3;

/// Steps of every run of the demo: a budget of 4,800 steps over the strategies and rounds, 240
/// to 1,200 each (about 10 ms a step on the tiny preset on a loaded 2-core machine).
pub fn demo_steps() -> u64 {
    let n = ftrec_cluster::StrategyChoice::all_names().len().max(1) as u64;
    (4_800 / (n * DEMO_ROUNDS as u64)).clamp(240, 1_200) / 12 * 12
}

/// The demo's comparison: synchronous (so every exact strategy ends with the failure-free
/// digest), 3 servers and 2 workers, a save every sixth of the run, server 1 killed a little
/// over a third of the way and server 2 a little under three quarters (off the save points, so
/// full recovery has work to redo).
pub fn demo_args(out: PathBuf, steps: u64) -> CompareArgs {
    let steps = steps.max(12);
    CompareArgs {
        preset: Some("tiny".into()),
        servers: Some(3),
        workers: Some(2),
        sync: true,
        steps: Some(steps),
        rounds: Some(DEMO_ROUNDS),
        kills: vec![
            format!("server=1@step={}", steps * 38 / 100),
            format!("server=2@step={}", steps * 72 / 100),
        ],
        out,
        ..Default::default()
    }
}

pub fn run(a: DemoArgs) -> Result<()> {
    let args = demo_args(a.out.clone(), a.steps.unwrap_or_else(demo_steps));
    let command: Vec<String> = std::env::args().collect();
    let rep = compare(&args, command)?;
    println!("{}", text_table(&rep));
    println!("report: {}", a.out.join("report.html").display());
    println!(
        "next: ftrec advise --calibrate {} --model-gb 1000 --servers 100 --workers 100 \
         --step-ms 200 --mtbf-hours 24",
        a.out.display()
    );
    Ok(())
}

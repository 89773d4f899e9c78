//! Model-step speed against raw sgemm speed.
//!
//! `cargo run --release -p ftrec-model --example bench_mlp -- [preset] [batch] [threads] [iters]`
//! (defaults: kaggle, the preset's batch, 2, 20).

use ftrec_core::Preset;
use ftrec_model::{bench_mlp, DlrmConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = Preset::by_name(args.first().map_or("kaggle", String::as_str))?;
    let batch = args.get(1).map_or(Ok(preset.batch), |s| s.parse())?;
    let threads = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let iters = args.get(3).map_or(Ok(20), |s| s.parse())?;
    let cfg = DlrmConfig::from_preset(&preset);
    let r = bench_mlp(&cfg, batch, threads, iters)?;
    println!("{} preset: {r}", preset.name);
    Ok(())
}

//! `ftrec data`.

use anyhow::{Context, Result};
use ftrec_core::Preset;

use crate::flags::DataCmd;

pub fn run(cmd: DataCmd) -> Result<()> {
    match cmd {
        DataCmd::Synth {
            preset,
            samples,
            out,
            seed,
        } => {
            let preset = Preset::by_name(&preset)?;
            let path = ftrec_data::synth_to_dir(&preset, seed, samples, &out)
                .with_context(|| format!("writing synthetic data to {}", out.display()))?;
            println!(
                "wrote {samples} samples of preset {} to {}",
                preset.name,
                path.display()
            );
            Ok(())
        }
    }
}

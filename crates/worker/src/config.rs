//! Validated configuration of a training run.

use ftrec_core::{Optimizer, Preset};
use ftrec_data::TsvConfig;
use serde::{Deserialize, Serialize};

use crate::WorkerError;

/// Where the samples come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum DataSpec {
    /// The synthetic Criteo-like generator of `ftrec-data`, with the preset's table sizes and
    /// Zipf exponent and the run's seed.
    Synthetic,
    /// Criteo TSV files; the model's table sizes are the reader's.
    Tsv(TsvConfig),
}

/// Everything a single-process run depends on. With the same value, a run is a pure function of
/// it: same batches, same updates, same `model_digest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Workload and model shape (table sizes replaced by the reader's for TSV data).
    pub preset: Preset,
    pub data: DataSpec,
    pub steps: u64,
    pub batch: usize,
    pub seed: u64,
    /// Recorded in the report. The single-process trainer reduces in a fixed order in every
    /// mode, so its runs are always reproducible; the flag matters to the distributed runs,
    /// where it selects synchronous training with a fixed reduction order.
    pub deterministic: bool,
    /// Threads for the matrix kernels and the per-sample work.
    pub threads: usize,
    pub sparse_optimizer: Optimizer,
    pub dense_optimizer: Optimizer,
    /// Held-out samples for AUC and logloss.
    pub eval_samples: usize,
}

impl TrainConfig {
    /// The preset's defaults on the given data.
    pub fn from_preset(name: &str, data: DataSpec) -> Result<TrainConfig, WorkerError> {
        let mut preset = Preset::by_name(name)?;
        if let DataSpec::Tsv(tsv) = &data {
            preset.table_rows = tsv.table_rows.clone();
        }
        Ok(TrainConfig {
            steps: preset.steps,
            batch: preset.batch,
            seed: 1,
            deterministic: false,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            sparse_optimizer: Optimizer::new(preset.sparse_optimizer, preset.sparse_lr),
            dense_optimizer: Optimizer::new(preset.dense_optimizer, preset.dense_lr),
            eval_samples: preset.eval_samples,
            preset,
            data,
        })
    }

    /// Check every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), WorkerError> {
        self.preset.validate()?;
        self.sparse_optimizer.validate()?;
        self.dense_optimizer.validate()?;
        let bad = |m: &str| Err(WorkerError::Config(m.to_string()));
        if self.steps == 0 {
            return bad("steps must be at least 1");
        }
        if self.batch == 0 {
            return bad("batch must be at least 1");
        }
        if self.threads == 0 || self.threads > 256 {
            return bad("threads must be between 1 and 256");
        }
        if self.eval_samples == 0 {
            return bad("eval samples must be at least 1");
        }
        if let DataSpec::Tsv(tsv) = &self.data {
            tsv.validate()?;
            if tsv.table_rows != self.preset.table_rows {
                return bad("the model's table sizes differ from the TSV reader's");
            }
        }
        Ok(())
    }
}

//! The interface every data source offers the trainer: batches, a resumable position and a
//! held-out evaluation set.

use ftrec_core::Batch;
use serde::{Deserialize, Serialize};

use crate::error::{DataError, LineFault};

/// Where a source stands, saved in a checkpoint so a restored run reads exactly the batches the
/// uninterrupted run would have read next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Position {
    /// A TSV stream: the next line to read is at byte `offset` of file number `file` (in
    /// reading order), whose name is `file_name`; `line` lines of that file have been consumed
    /// (so the next one is line `line + 1`, 1-based); `epoch` counts completed passes.
    Tsv {
        file: usize,
        file_name: String,
        offset: u64,
        line: u64,
        epoch: u64,
    },
    /// A synthetic stream: the index of the next training sample.
    Synthetic { sample: u64 },
}

/// A held-out evaluation set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalSet {
    pub batches: Vec<Batch>,
    /// For synthetic data, the planted teacher's click probability of every sample, in batch
    /// order, so the trainer can report the teacher's own AUC on the same samples.
    pub teacher_probs: Option<Vec<f32>>,
    /// Malformed held-out lines skipped while reading (always 0 unless `skip_malformed`).
    pub malformed_skipped: u64,
}

impl EvalSet {
    /// Samples over all batches.
    pub fn samples(&self) -> usize {
        self.batches.iter().map(|b| b.size).sum()
    }
}

/// A stream of training batches.
pub trait BatchSource: Send {
    /// Rows of each table; every id in every batch is below its table's entry.
    fn table_rows(&self) -> &[u64];

    /// The next batch of up to `size` samples; `Ok(None)` once a finite source is exhausted.
    /// A batch is shorter than `size` only at the very end of a finite source. On error the
    /// position is left where the batch started.
    fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, DataError>;

    /// The position of the next sample.
    fn position(&self) -> Position;

    /// Continue from `pos`, a value returned by `position` of a source built with the same
    /// configuration.
    fn seek(&mut self, pos: &Position) -> Result<(), DataError>;

    /// Up to `max_samples` held-out samples in batches of `batch` (the last one may be
    /// shorter). Independent of, and never disturbing, the training position.
    fn eval_set(&self, max_samples: usize, batch: usize) -> Result<EvalSet, DataError>;

    /// Malformed lines skipped so far by this reader (`skip_malformed` only).
    fn malformed_skipped(&self) -> u64 {
        0
    }

    /// The first few skipped lines, for a report (at most [`crate::KEPT_FAULTS`]).
    fn skipped_examples(&self) -> &[LineFault] {
        &[]
    }
}

pub(crate) fn check_batch_size(size: usize) -> Result<(), DataError> {
    if size == 0 {
        return Err(DataError::InvalidConfig(
            "batch size must be positive".into(),
        ));
    }
    Ok(())
}

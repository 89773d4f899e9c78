//! `ftrec-data`: where training samples come from.
//!
//! It owns
//! - the [`BatchSource`] trait the trainer pulls [`Batch`](ftrec_core::Batch)es from, with a
//!   serializable, resumable [`Position`] and a held-out [`EvalSet`];
//! - [`TsvReader`], a streaming reader of Criteo TSV files in the Kaggle and Terabyte
//!   [`Layout`]s ([`TsvConfig`], [`DataPath`]);
//! - [`SyntheticSource`], a deterministic Criteo-like stream with Zipf-distributed ids and a
//!   planted [`Teacher`], so that AUC means something without the real data set;
//! - [`write_tsv`] / [`synth_to_dir`], which write the synthetic stream as Kaggle-layout TSV;
//! - the two functions that define how a Criteo line becomes model input, shared by both
//!   sources: [`transform_dense`] (`ln(1 + max(x, 0))`) and [`categorical_row`]
//!   (`mix64((table << 32) | value) % rows`).
//!
//! It never trains, never talks to servers and never holds a data set in memory: the reader
//! keeps one line buffer, the generator computes sample `i` from `(seed, split, i)`.
//!
//! ```
//! use ftrec_core::Preset;
//! use ftrec_data::{BatchSource, SyntheticSource};
//! let preset = Preset::tiny();
//! let mut src = SyntheticSource::from_preset(&preset, 7).unwrap();
//! let first = src.next_batch(64).unwrap().unwrap();
//! first.validate(preset.dense_features(), &preset.table_rows).unwrap();
//! // A checkpoint stores the position; a restored source continues identically.
//! let pos = src.position();
//! let second = src.next_batch(64).unwrap().unwrap();
//! let mut restored = SyntheticSource::from_preset(&preset, 7).unwrap();
//! restored.seek(&pos).unwrap();
//! assert_eq!(restored.next_batch(64).unwrap().unwrap(), second);
//! ```

pub mod error;
pub mod sample;
pub mod source;
pub mod synth;
pub mod tsv;
pub mod write;
pub mod zipf;

pub use error::{DataError, LineError, LineFault};
pub use sample::{categorical_row, parse_line, transform_dense, RawSample};
pub use source::{BatchSource, EvalSet, Position};
pub use synth::{Split, SynthConfig, SyntheticSource, Teacher, TeacherScales};
pub use tsv::{
    DataPath, Layout, TsvConfig, TsvReader, DEFAULT_HOLDOUT_EVERY, KEPT_FAULTS, MAX_LINE_BYTES,
    TERABYTE_ROW_CAP, TERABYTE_TABLE_ROWS,
};
pub use write::{synth_to_dir, write_tsv, SYNTH_FILE};
pub use zipf::Zipf;

use serde::{Deserialize, Serialize};

/// Which source a run reads, as recorded in a run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum DataSpec {
    Synthetic(SynthConfig),
    Tsv(TsvConfig),
}

impl DataSpec {
    /// Open the source.
    pub fn open(&self) -> Result<Box<dyn BatchSource>, DataError> {
        Ok(match self {
            DataSpec::Synthetic(c) => Box::new(SyntheticSource::new(c.clone())?),
            DataSpec::Tsv(c) => Box::new(TsvReader::open(c.clone())?),
        })
    }

    /// Rows of each table the source's ids index.
    pub fn table_rows(&self) -> &[u64] {
        match self {
            DataSpec::Synthetic(c) => &c.table_rows,
            DataSpec::Tsv(c) => &c.table_rows,
        }
    }
}

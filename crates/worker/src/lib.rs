//! `ftrec-worker`: the training loop.
//!
//! It owns
//! - [`LocalTrainer`]: the single-process DLRM trainer (embedding tables in memory, the dense
//!   MLP of `ftrec-model`, batches from `ftrec-data`), the reference every distributed and
//!   fault-tolerant run is compared with, digest for digest; also over restored parameters
//!   ([`LocalTrainer::from_state`]), which is how a checkpoint is evaluated;
//! - [`train`]: a whole run (train, evaluate, report) driven by a [`TrainConfig`], returning a
//!   [`TrainReport`];
//! - [`feed`]: how [`train`] gets its batches while it trains (made in chunks by whichever
//!   thread has time, for synthetic data);
//! - [`sys`]: process measurements (peak resident memory).
//!
//! It never starts processes or opens sockets.
//!
//! ```no_run
//! use ftrec_worker::{train, DataSpec, TrainConfig};
//! let cfg = TrainConfig::from_preset("tiny", DataSpec::Synthetic).unwrap();
//! let report = train(&cfg, &mut |_| {}).unwrap();
//! println!("auc {:.4} digest {}", report.auc, report.model_digest);
//! ```

pub mod config;
pub mod feed;
pub mod local;
pub mod sys;

pub use config::{DataSpec, TrainConfig};
pub use local::{train, LocalTrainer, Progress, TrainReport};

/// What can stop a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error(transparent)]
    Core(#[from] ftrec_core::CoreError),
    #[error(transparent)]
    Model(#[from] ftrec_model::ModelError),
    #[error(transparent)]
    Data(#[from] ftrec_data::DataError),
    #[error("invalid training configuration: {0}")]
    Config(String),
    /// The data held no training sample at all (a run stops early, without error, when its
    /// data ends after some steps).
    #[error("the data has no training samples (every line held out, skipped or none at all)")]
    NoTrainingData,
    #[error("no usable held-out set: {0}")]
    NoEvalData(String),
}

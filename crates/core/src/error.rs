//! Errors of the core crate.

/// What can go wrong with core values: every case names the offending input.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum CoreError {
    #[error("unknown optimizer {0:?} (expected sgd, momentum, adagrad, rowwise_adagrad or adam)")]
    UnknownOptimizer(String),
    #[error("unknown preset {0:?} (expected tiny, small, kaggle32 or kaggle)")]
    UnknownPreset(String),
    #[error("table {table} does not exist (the model has {tables} tables)")]
    UnknownTable { table: u32, tables: usize },
    #[error("row {row} is out of range for table {table} ({rows} rows)")]
    RowOutOfRange { table: u32, row: u64, rows: u64 },
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

//! Errors of the model crate.

use ftrec_core::CoreError;

/// What can go wrong when building, running or measuring the model: every case names the
/// offending input so a caller can fix it (or report it) without guessing.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ModelError {
    /// The model shape is unusable (zero widths, a bottom MLP that does not end at the
    /// embedding dim, a top MLP that does not end at 1, ...).
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// An input or output buffer has the wrong length for the model and batch.
    #[error("{what}: expected {expected} values, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A label is not a probability in `[0, 1]` (binary cross-entropy needs one).
    #[error("label {index} is {value}, expected a value in [0, 1]")]
    InvalidLabel { index: usize, value: f32 },
    /// A score handed to a metric is NaN.
    #[error("score {index} is NaN")]
    InvalidScore { index: usize },
    /// AUC is undefined when only one class is present.
    #[error("AUC needs both classes, got {positives} positives and {negatives} negatives")]
    SingleClass { positives: usize, negatives: usize },
    /// A metric was asked about zero samples.
    #[error("{0} needs at least one sample")]
    Empty(&'static str),
    /// The optimizer's state layout does not match the one the parameters were built for.
    #[error(
        "optimizer {optimizer} needs {expected} dense state words, the parameters hold {got} \
         (they were built for another optimizer)"
    )]
    OptimizerMismatch {
        optimizer: String,
        expected: usize,
        got: usize,
    },
    /// A categorical feature's CSR index is malformed.
    #[error("feature {table}: {reason}")]
    InvalidFeature { table: usize, reason: String },
    /// The row fetcher has no values for a looked-up row (out of range, or not pulled).
    #[error("row {row} of table {table} is not available")]
    RowUnavailable { table: usize, row: u64 },
    /// A fetched row is shorter than the embedding dim.
    #[error("row {row} of table {table} has {got} values, the embedding dim is {dim}")]
    RowTooShort {
        table: usize,
        row: u64,
        got: usize,
        dim: usize,
    },
    /// The gemm thread count was requested after the first matrix product fixed it.
    #[error(
        "gemm threads are already fixed at {current} for this process (requested {requested}); \
         call set_gemm_threads before the first forward pass"
    )]
    GemmThreadsFixed { requested: usize, current: usize },
    /// `FTREC_GEMM` names no known matrix-product backend.
    #[error(
        "FTREC_GEMM={0} is not a gemm backend: use `avx512` (the default where the CPU has \
         AVX-512F), `avx2` (its bits on a CPU with AVX2 and FMA), `gemm` (the default \
         elsewhere) or `matrixmultiply`, or unset it"
    )]
    UnknownGemmBackend(String),
    /// `FTREC_GEMM` names a backend this CPU cannot run.
    #[error(
        "FTREC_GEMM={name} needs a CPU with {needs}, which this one lacks: use `gemm` or \
         `matrixmultiply`, or unset it"
    )]
    GemmBackendUnsupported {
        name: &'static str,
        /// The instructions its micro-kernel needs.
        needs: &'static str,
    },
    /// A thread count of zero.
    #[error("thread count must be at least 1, got {0}")]
    InvalidThreads(usize),
    #[error(transparent)]
    Core(#[from] CoreError),
}

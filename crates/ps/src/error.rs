//! Errors of the parameter server, shared by the server state, both transports and clients.
//!
//! A request the server refuses gets one of these as its reply (over gRPC, encoded into the
//! status details so the client rebuilds the same value); the server's state is then unchanged
//! and it keeps serving.

use ftrec_core::CoreError;

/// What can go wrong talking to, or inside, a parameter server. Every case names the input at
/// fault so that a caller can act on it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PsError {
    #[error("table {table} does not exist (the model has {tables} tables)")]
    UnknownTable { table: u32, tables: u64 },
    #[error("row {row} is out of range for table {table} ({rows} rows)")]
    RowOutOfRange { table: u32, row: u64, rows: u64 },
    #[error("row {row} of table {table} belongs to server {owner}, not to server {server}")]
    NotOwner {
        table: u32,
        row: u64,
        owner: u32,
        server: u32,
    },
    #[error("table {table}: {rows} rows need {expected} gradient values, got {got}")]
    GradientLength {
        table: u32,
        rows: u64,
        expected: u64,
        got: u64,
    },
    #[error("corrupted payload: {what} is {len} bytes, not a multiple of {unit}")]
    PayloadLength { what: String, len: u64, unit: u64 },
    #[error("non-finite gradient value for row {row} of table {table}")]
    NonFiniteGradient { table: u32, row: u64 },
    #[error("non-finite dense gradient value at index {index}")]
    NonFiniteDenseGradient { index: u64 },
    #[error("dense range {lo}..{hi} refused: {reason} (this server holds values {owned_lo}..{owned_hi})")]
    DenseRange {
        lo: u64,
        hi: u64,
        owned_lo: u64,
        owned_hi: u64,
        reason: String,
    },
    #[error("local rows {lo}..{hi} of table {table} are out of range (this server holds {rows})")]
    LocalRange {
        table: u32,
        lo: u64,
        hi: u64,
        rows: u64,
    },
    #[error("{what}: expected {expected} words, got {got}")]
    ShapeMismatch {
        what: String,
        expected: u64,
        got: u64,
    },
    #[error(
        "step {step} refused: step {last} is already committed (steps commit in increasing order)"
    )]
    StepAlreadyCommitted { step: u64, last: u64 },
    #[error("worker {worker} already staged a contribution to step {step}")]
    AlreadyStaged { step: u64, worker: u32 },
    #[error("step {step}: {detail}")]
    StepWorkersMismatch { step: u64, detail: String },
    #[error("{what} is {bytes} bytes, over the limit of {limit} bytes")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("malformed request: {0}")]
    MalformedRequest(String),
    #[error("parameter server {addr} is unavailable: {reason}")]
    Unavailable { addr: String, reason: String },
    /// A status from the transport that carries no parameter-server error (for example a
    /// message over the transport's size limit).
    #[error("rpc failed with status {code}: {message}")]
    Rpc { code: String, message: String },
    #[error("internal error: {0}")]
    Internal(String),
    /// The erasure-coding layer refused a request (too many losses in a stripe, a layout that
    /// does not fit the server count, a position out of range).
    #[error("erasure coding: {0}")]
    Coding(String),
    /// A commit or parity operation named a step this server has not prepared.
    #[error("step {step} is not prepared on this server (prepare it first, or it was aborted)")]
    NotPrepared { step: u64 },
    /// The server cannot serve this request yet (an ECRec replacement that has not joined or
    /// not finished its rebuild); the same request succeeds later, so callers retry it.
    #[error("server {server} is not ready: {reason} (retry later)")]
    NotReady { server: u32, reason: String },
    /// The request is well formed but this server does not take it: a write that would
    /// bypass what a fault-tolerance strategy keeps in step with the model (ECRec's parities
    /// and dense replicas). `reason` says which path to use instead.
    #[error("{what} refused: {reason}")]
    Refused { what: String, reason: String },
    /// The sender `who` (an incarnation, `s1.3`: see [`crate::fence`]) was replaced by epoch
    /// `newer` of the same process: nothing it sends is taken any more.
    #[error(
        "fenced: {} was replaced by epoch {newer} of the same process; nothing it sends is \
         taken",
        crate::fence::Incarnation::parse(who).map_or_else(|_| who.clone(), |i| crate::fence::describe(&i))
    )]
    Fenced { who: String, newer: u64 },
}

impl PsError {
    /// Whether the same request may succeed if sent again later, unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PsError::NotReady { .. })
    }
}

impl From<ftrec_ec::EcError> for PsError {
    fn from(e: ftrec_ec::EcError) -> Self {
        PsError::Coding(e.to_string())
    }
}

impl From<CoreError> for PsError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::UnknownTable { table, tables } => PsError::UnknownTable {
                table,
                tables: tables as u64,
            },
            CoreError::RowOutOfRange { table, row, rows } => {
                PsError::RowOutOfRange { table, row, rows }
            }
            other => PsError::InvalidConfig(other.to_string()),
        }
    }
}

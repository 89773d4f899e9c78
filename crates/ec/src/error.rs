//! Errors of the coding layer.

/// What can go wrong when coding, laying out or planning: every case names the offending input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    /// More rows of one stripe are missing than the code can rebuild. Nothing can be decoded;
    /// the caller has to fall back to another source (a checkpoint).
    #[error("{lost} rows of a stripe are lost but the code tolerates only {tolerated}")]
    TooManyErasures { lost: usize, tolerated: usize },
    /// `k`, `r` or the server count do not describe a usable code or layout.
    #[error("invalid code parameters: {0}")]
    InvalidParameters(String),
    /// A code name that is neither `sum` nor `gf256`.
    #[error("unknown erasure code {0:?} (expected sum or gf256)")]
    UnknownCode(String),
    /// A row, parity or row list does not have the length the code was asked to work with.
    #[error("shape mismatch in {what}: expected {expected}, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A stripe position outside `0..k + r` (data positions first, then parities).
    #[error("stripe position {position} is out of range (a stripe has {width} positions)")]
    PositionOutOfRange { position: usize, width: usize },
    /// A decode request that cannot be served as asked (a position listed twice, a wanted
    /// position that is also a survivor, survivors the code cannot use).
    #[error("invalid decode request: {0}")]
    InvalidDecode(String),
    #[error("server {server} does not exist (the layout has {servers} servers)")]
    UnknownServer { server: u32, servers: u32 },
    #[error("table {table} does not exist (the layout has {tables} tables)")]
    UnknownTable { table: u32, tables: usize },
    #[error("row {row} is out of range for table {table} ({rows} rows)")]
    RowOutOfRange { table: u32, row: u64, rows: u64 },
    #[error("stripe {stripe} is out of range for table {table} ({stripes} stripes)")]
    StripeOutOfRange {
        table: u32,
        stripe: u64,
        stripes: u64,
    },
    #[error(
        "parity slot {slot} of table {table} is out of range on server {server} ({slots} slots)"
    )]
    ParitySlotOutOfRange {
        server: u32,
        table: u32,
        slot: u64,
        slots: u64,
    },
}

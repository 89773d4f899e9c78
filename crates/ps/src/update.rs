//! What a worker sends to a server: gradients for rows and for dense blocks, and the requests
//! and replies of the other operations, as plain Rust values shared by both transports.

use std::ops::Range;

use ftrec_core::{RowId, ServerId, SparseGradAccumulator, TableId};

/// Gradients for some rows of one table: row `rows[i]` gets `grads[i*dim..(i+1)*dim]`.
///
/// A row may occur more than once: the server sums its occurrences in order before the
/// optimizer sees them, so it still gets exactly one update.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseGrads {
    pub table: TableId,
    pub rows: Vec<RowId>,
    pub grads: Vec<f32>,
}

impl SparseGrads {
    /// The summed per-row gradients of a batch, in row order.
    pub fn from_accumulator(table: TableId, acc: &SparseGradAccumulator) -> Self {
        let sorted = acc.sorted();
        let mut rows = Vec::with_capacity(sorted.len());
        let mut grads = Vec::with_capacity(sorted.iter().map(|(_, g)| g.len()).sum());
        for (row, g) in sorted {
            rows.push(row);
            grads.extend_from_slice(g);
        }
        SparseGrads { table, rows, grads }
    }
}

/// Gradients for dense values `offset..offset + grads.len()` (global value indices).
///
/// `offset` is a multiple of [`ftrec_core::DENSE_BLOCK`] and the range ends on a block
/// boundary or at the end of the server's dense range: the optimizer updates whole blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseGrads {
    pub offset: u64,
    pub grads: Vec<f32>,
}

/// One update for one server: sparse and dense gradients, applied as a whole or not at all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    pub sparse: Vec<SparseGrads>,
    pub dense: Vec<DenseGrads>,
}

impl Update {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_sparse(mut self, table: TableId, rows: Vec<RowId>, grads: Vec<f32>) -> Self {
        self.sparse.push(SparseGrads { table, rows, grads });
        self
    }

    pub fn with_dense(mut self, offset: u64, grads: Vec<f32>) -> Self {
        self.dense.push(DenseGrads { offset, grads });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.sparse
            .iter()
            .all(|s| s.rows.is_empty() && s.grads.is_empty())
            && self.dense.iter().all(|d| d.grads.is_empty())
    }

    /// Bytes the update occupies on the wire (ids as u64, values as f32), for size limits.
    pub fn payload_bytes(&self) -> u64 {
        let sparse: u64 = self
            .sparse
            .iter()
            .map(|s| s.rows.len() as u64 * 8 + s.grads.len() as u64 * 4)
            .sum();
        let dense: u64 = self.dense.iter().map(|d| d.grads.len() as u64 * 4).sum();
        sparse + dense
    }
}

/// How many rows and dense blocks one applied update changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub rows_updated: u64,
    pub dense_blocks_updated: u64,
}

/// Rows to pull from one table.
#[derive(Debug, Clone, PartialEq)]
pub struct RowRequest {
    pub table: TableId,
    pub rows: Vec<RowId>,
}

/// Pulled values of one table: `rows` sorted and distinct, `values` holds `dim` values per row.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledRows {
    pub table: TableId,
    pub rows: Vec<RowId>,
    pub values: Vec<f32>,
    pub dim: usize,
}

impl PulledRows {
    /// The values of `row`, if it was pulled.
    pub fn get(&self, row: RowId) -> Option<&[f32]> {
        let i = self.rows.binary_search(&row).ok()?;
        Some(&self.values[i * self.dim..(i + 1) * self.dim])
    }
}

/// Merge a pull request into one sorted, duplicate-free id list per table, tables in order:
/// a batch names a hot row many times but the wire carries it once.
pub fn dedup_requests(requests: &[RowRequest]) -> Vec<RowRequest> {
    let mut by_table: std::collections::BTreeMap<TableId, Vec<RowId>> = Default::default();
    for r in requests {
        by_table
            .entry(r.table)
            .or_default()
            .extend_from_slice(&r.rows);
    }
    by_table
        .into_iter()
        .map(|(table, mut rows)| {
            rows.sort_unstable();
            rows.dedup();
            RowRequest { table, rows }
        })
        .collect()
}

/// Rows with their optimizer state, by local index: `data` holds whole rows (values then
/// state) of `table` starting at local index `first_local`.
#[derive(Debug, Clone, PartialEq)]
pub struct RowBlock {
    pub table: TableId,
    pub first_local: u64,
    pub data: Vec<f32>,
}

/// Dense blocks with their optimizer state: values of global blocks
/// `first_block..first_block + n` (the model's last block may be short) and one full state
/// slot per block.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseBlock {
    pub first_block: u64,
    pub values: Vec<f32>,
    pub state: Vec<f32>,
}

/// The shape of one server's shard, as a client needs it to route and size requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    pub server: ServerId,
    pub servers: u32,
    pub dim: usize,
    pub state_words: usize,
    /// Rows of every whole table.
    pub table_rows: Vec<u64>,
    /// Rows of every table held by this server.
    pub local_rows: Vec<u64>,
    /// Length of the whole dense parameter vector.
    pub dense_len: u64,
    /// Global value indices of the dense values this server holds.
    pub dense_range: Range<u64>,
    pub dense_state_per_block: usize,
    pub last_committed_step: Option<u64>,
}

//! Embedding tables: rows of `dim` values followed by optimizer state, stored contiguously.

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix;
use crate::{CoreError, RowId, TableId};

/// Shape of one row: `dim` values then `state_words` optimizer-state words, all 32-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowLayout {
    pub dim: usize,
    pub state_words: usize,
}

impl RowLayout {
    pub fn new(dim: usize, state_words: usize) -> Self {
        RowLayout { dim, state_words }
    }

    /// Words per row.
    pub fn words(&self) -> usize {
        self.dim + self.state_words
    }

    /// Bytes per row.
    pub fn bytes(&self) -> usize {
        self.words() * 4
    }
}

/// The initial value of element `i` of row `row` of `table`: uniform in `[-scale, scale)`, a pure
/// function of `(seed, table, row, i)` so that any shard of the table starts with the same bits.
pub fn init_row(seed: u64, table: TableId, row: RowId, scale: f32, out: &mut [f32]) {
    let mut g = SplitMix::keyed(seed, 0x7AB1_E000 + table.0 as u64, row);
    for v in out.iter_mut() {
        *v = (g.next_f32() * 2.0 - 1.0) * scale;
    }
}

/// One embedding table (or one server's shard of it): `rows` rows of `layout`, contiguous.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingTable {
    pub id: TableId,
    layout: RowLayout,
    rows: u64,
    data: Vec<f32>,
}

impl EmbeddingTable {
    /// A table of zeros.
    pub fn zeros(id: TableId, rows: u64, layout: RowLayout) -> Self {
        EmbeddingTable {
            id,
            layout,
            rows,
            data: crate::pages::zeroed(rows as usize * layout.words()),
        }
    }

    /// A table whose row `r` holds [`init_row`]`(seed, id, r)` and zero optimizer state.
    pub fn new_init(id: TableId, rows: u64, layout: RowLayout, seed: u64, scale: f32) -> Self {
        let mut t = Self::zeros(id, rows, layout);
        t.init_rows(seed, scale, |local| local);
        t
    }

    /// Initialise every row; `global` maps a local row index to the row id used for the random
    /// stream (identity for a whole table, the shard map's inverse for a shard).
    pub fn init_rows(&mut self, seed: u64, scale: f32, global: impl Fn(u64) -> RowId + Sync) {
        let words = self.layout.words();
        let dim = self.layout.dim;
        let id = self.id;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let rows_per = (self.rows as usize).div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for (chunk_idx, chunk) in self.data.chunks_mut(rows_per * words).enumerate() {
                let global = &global;
                s.spawn(move || {
                    for (i, row) in chunk.chunks_mut(words).enumerate() {
                        let local = (chunk_idx * rows_per + i) as u64;
                        init_row(seed, id, global(local), scale, &mut row[..dim]);
                        row[dim..].fill(0.0);
                    }
                });
            }
        });
    }

    pub fn layout(&self) -> RowLayout {
        self.layout
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Checked row index.
    pub fn check_row(&self, row: RowId) -> Result<(), CoreError> {
        if row < self.rows {
            Ok(())
        } else {
            Err(CoreError::RowOutOfRange {
                table: self.id.0,
                row,
                rows: self.rows,
            })
        }
    }

    /// Row `row` (values then state). Panics if out of range: check untrusted ids first.
    #[inline]
    pub fn row(&self, row: RowId) -> &[f32] {
        let w = self.layout.words();
        &self.data[row as usize * w..(row as usize + 1) * w]
    }

    /// Ask for row `row`'s cache lines ahead of its use ([`crate::prefetch`]); a row out of
    /// range is ignored (it is a hint).
    #[inline]
    pub fn prefetch_row(&self, row: RowId) {
        let w = self.layout.words();
        if let Some(r) = self.data.get(row as usize * w..(row as usize + 1) * w) {
            crate::prefetch::prefetch(r);
        }
    }

    #[inline]
    pub fn row_mut(&mut self, row: RowId) -> &mut [f32] {
        let w = self.layout.words();
        &mut self.data[row as usize * w..(row as usize + 1) * w]
    }

    /// All words, row after row.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// All words, row after row, the table consumed: its buffer, not a copy.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Resident bytes of the table's data.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerId;
    use crate::ShardMap;

    #[test]
    fn shards_start_with_the_same_bits_as_the_whole_table() {
        let layout = RowLayout::new(4, 1);
        let whole = EmbeddingTable::new_init(TableId(3), 23, layout, 9, 0.1);
        let map = ShardMap::new(3).unwrap();
        for s in 0..3 {
            let server = ServerId(s);
            let n = map.rows_on(TableId(3), 23, server);
            let mut shard = EmbeddingTable::zeros(TableId(3), n, layout);
            shard.init_rows(9, 0.1, |local| map.global_row(TableId(3), server, local));
            for local in 0..n {
                let g = map.global_row(TableId(3), server, local);
                assert_eq!(shard.row(local), whole.row(g));
            }
        }
    }

    #[test]
    fn init_is_seeded_and_bounded() {
        let layout = RowLayout::new(8, 8);
        let a = EmbeddingTable::new_init(TableId(0), 100, layout, 1, 0.05);
        let b = EmbeddingTable::new_init(TableId(0), 100, layout, 1, 0.05);
        let c = EmbeddingTable::new_init(TableId(0), 100, layout, 2, 0.05);
        assert_eq!(a, b);
        assert_ne!(a, c);
        for r in 0..100 {
            let row = a.row(r);
            assert!(row[..8].iter().all(|v| v.abs() <= 0.05));
            assert!(row[8..].iter().all(|v| *v == 0.0));
        }
        assert!(a.check_row(99).is_ok());
        assert!(matches!(
            a.check_row(100),
            Err(CoreError::RowOutOfRange { row: 100, .. })
        ));
    }
}

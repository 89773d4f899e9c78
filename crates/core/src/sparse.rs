//! Summing a batch's embedding gradients per row before the optimizer sees them.
//!
//! A row that occurs several times in a batch must get exactly one optimizer update with the
//! sum of its gradients (the stateful optimizers are not additive: two Adagrad steps differ from
//! one step on the sum). The sum runs in the order contributions arrive, which the trainer
//! fixes (sample order), so the result is bit-reproducible.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::RowId;

/// Hashes a row id with a fixed 64-bit mix (the finaliser of MurmurHash3): every bit of the id
/// reaches every bit of the hash, so ids that differ only in high bits spread as well as
/// sequential ones. It is a few instructions, against SipHash's several dozen, and unkeyed,
/// which is safe here: the map's iteration order is never used (rows keep their arrival order
/// in `rows`), and an adversary choosing ids can at worst slow its own batch down.
#[derive(Debug, Default, Clone, Copy)]
pub struct RowIdHasher(u64);

impl Hasher for RowIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let mut h = self.0 ^ v;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        self.0 = h;
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by row id with [`RowIdHasher`].
pub type RowIdMap<V> = HashMap<RowId, V, BuildHasherDefault<RowIdHasher>>;

/// Accumulates `dim`-long gradients per row id for one table.
#[derive(Debug, Clone)]
pub struct SparseGradAccumulator {
    dim: usize,
    index: RowIdMap<u32>,
    /// `dense[row]`: the row's slot, or [`NO_SLOT`]; rows at or past its length use `index`.
    dense: Vec<u32>,
    rows: Vec<RowId>,
    grads: Vec<f32>,
}

/// A row of the dense index that has no slot yet.
const NO_SLOT: u32 = u32::MAX;

impl SparseGradAccumulator {
    pub fn new(dim: usize) -> Self {
        SparseGradAccumulator {
            dim,
            index: RowIdMap::default(),
            dense: Vec::new(),
            rows: Vec::new(),
            grads: Vec::new(),
        }
    }

    /// An accumulator for a table of `rows` rows held in this process, with a slot index of
    /// 4 bytes a row (a few percent of the table itself) instead of a hash map: finding a
    /// row's sum is one load, where a map's probe is a hash and a scattered bucket read.
    pub fn with_dense_index(dim: usize, rows: u64) -> Self {
        let mut acc = Self::new(dim);
        acc.dense = vec![NO_SLOT; usize::try_from(rows).unwrap_or(usize::MAX)];
        acc
    }

    pub fn clear(&mut self) {
        for &r in &self.rows {
            if let Some(slot) = self.dense.get_mut(r as usize) {
                *slot = NO_SLOT;
            }
        }
        self.index.clear();
        self.rows.clear();
        self.grads.clear();
    }

    /// Hint that `row` is about to be added: its slot in the dense index is requested (a
    /// table's index is too large to stay cached, so its reads miss).
    #[inline]
    pub fn prefetch(&self, row: RowId) {
        if let Some(slot) = self.dense.get(row as usize) {
            crate::prefetch::prefetch_value(slot);
        }
    }

    /// Add `grad` to row `row`'s sum.
    #[inline]
    pub fn add(&mut self, row: RowId, grad: &[f32]) {
        debug_assert_eq!(grad.len(), self.dim);
        let dim = self.dim;
        let (rows, grads) = (&mut self.rows, &mut self.grads);
        let mut new_slot = || {
            rows.push(row);
            grads.extend(std::iter::repeat_n(0.0, dim));
            (rows.len() - 1) as u32
        };
        let slot = match self.dense.get_mut(row as usize) {
            Some(slot) => {
                if *slot == NO_SLOT {
                    *slot = new_slot();
                }
                *slot
            }
            None => *self.index.entry(row).or_insert_with(new_slot),
        } as usize;
        for (acc, g) in self.grads[slot * dim..(slot + 1) * dim]
            .iter_mut()
            .zip(grad)
        {
            *acc += g;
        }
    }

    /// Distinct rows touched so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// `(row, summed gradient)` pairs, sorted by row id (a fixed order for appliers and for
    /// the wire).
    pub fn sorted(&self) -> Vec<(RowId, &[f32])> {
        let mut out: Vec<(RowId, &[f32])> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, &self.grads[i * self.dim..(i + 1) * self.dim]))
            .collect();
        out.sort_unstable_by_key(|(r, _)| *r);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_ids_hash_apart_in_low_and_high_bits() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<RowIdHasher>::default();
        // Ids that differ only in their high bits, and sequential ids: the hash's low 10 bits
        // (a table of 1024 buckets) are spread over many buckets in both cases.
        for ids in [
            (0..1024u64).map(|i| i << 40).collect::<Vec<_>>(),
            (0..1024u64).collect(),
        ] {
            let buckets: std::collections::HashSet<u64> =
                ids.iter().map(|&i| build.hash_one(i) & 1023).collect();
            assert!(buckets.len() > 550, "{} buckets of 1024", buckets.len());
        }
    }

    #[test]
    fn repeated_rows_are_summed_once() {
        let mut acc = SparseGradAccumulator::new(2);
        acc.add(5, &[1.0, 2.0]);
        acc.add(1, &[0.5, 0.5]);
        acc.add(5, &[3.0, -1.0]);
        assert_eq!(acc.len(), 2);
        let s = acc.sorted();
        assert_eq!(s[0], (1, &[0.5f32, 0.5][..]));
        assert_eq!(s[1], (5, &[4.0f32, 1.0][..]));
        acc.clear();
        assert!(acc.is_empty());
    }

    #[test]
    fn a_dense_index_sums_as_the_map_does_and_forgets_on_clear() {
        // Rows 0..8 take the dense index, 8.. the map; the same adds give the same sums.
        let mut dense = SparseGradAccumulator::with_dense_index(2, 8);
        let mut map = SparseGradAccumulator::new(2);
        for round in 0..3 {
            for (i, &row) in [5u64, 1, 9, 5, 7, 1 << 40, 9, 0, 5].iter().enumerate() {
                let g = [i as f32 + round as f32, -(i as f32) * 0.5];
                dense.add(row, &g);
                map.add(row, &g);
            }
            assert_eq!(dense.len(), 6);
            assert_eq!(dense.sorted(), map.sorted(), "round {round}");
            dense.clear();
            map.clear();
            assert!(dense.is_empty());
            assert!(dense.dense.iter().all(|&s| s == NO_SLOT), "round {round}");
        }
    }
}

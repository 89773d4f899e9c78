//! `model_digest`: one number over every parameter and optimizer-state word.
//!
//! Each embedding row and each dense block is hashed (xxh3-128) together with its key
//! (table, row) or (dense, block), and the hashes are added modulo 2^128. The sum is
//! independent of the order in which rows are visited, so a model sharded over any number of
//! servers gives the same digest as the single-process model: each server sums its own rows
//! and the coordinator adds the partial sums ([`ModelDigest::merge`]). Any changed bit of any
//! word changes its row's hash and so the digest (up to xxh3-128 collisions).

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// Key space used for dense blocks (no table has this id).
pub const DENSE_TABLE: u32 = u32::MAX;

/// Accumulates row hashes; [`ModelDigest::hex`] renders the result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDigest {
    sum: u128,
    items: u64,
}

fn hash_item(table: u32, row: u64, parts: &[&[f32]]) -> u128 {
    let mut h = Xxh3::new();
    h.update(&table.to_le_bytes());
    h.update(&row.to_le_bytes());
    for part in parts {
        for w in part.iter() {
            h.update(&w.to_bits().to_le_bytes());
        }
    }
    h.digest128()
}

impl ModelDigest {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add embedding row `row` of `table` (values then optimizer state).
    pub fn add_row(&mut self, table: u32, row: u64, words: &[f32]) {
        self.sum = self.sum.wrapping_add(hash_item(table, row, &[words]));
        self.items += 1;
    }

    /// Add dense block `block` (its values, then its optimizer state).
    pub fn add_dense_block(&mut self, block: u64, values: &[f32], state: &[f32]) {
        self.sum = self
            .sum
            .wrapping_add(hash_item(DENSE_TABLE, block, &[values, state]));
        self.items += 1;
    }

    /// Combine with a digest over disjoint rows (another shard).
    pub fn merge(&mut self, other: &ModelDigest) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.items += other.items;
    }

    /// Rows and blocks hashed so far.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The digest as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }

    /// The raw `(sum, items)` pair, so a partial digest can cross a process boundary
    /// (a parameter server reports its shard's digest to the coordinator).
    pub fn to_parts(&self) -> (u128, u64) {
        (self.sum, self.items)
    }

    /// Rebuild a digest from [`ModelDigest::to_parts`].
    pub fn from_parts(sum: u128, items: u64) -> Self {
        ModelDigest { sum, items }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_free_but_bit_sensitive() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, -0.0];
        let mut d1 = ModelDigest::new();
        d1.add_row(0, 1, &a);
        d1.add_row(0, 2, &b);
        let mut d2 = ModelDigest::new();
        d2.add_row(0, 2, &b);
        let mut part = ModelDigest::new();
        part.add_row(0, 1, &a);
        d2.merge(&part);
        assert_eq!(d1.hex(), d2.hex());
        assert_eq!(d1.items(), 2);

        // -0.0 and 0.0 compare equal as floats but differ in bits: the digest must see it.
        let mut d3 = ModelDigest::new();
        d3.add_row(0, 1, &a);
        d3.add_row(0, 2, &[3.0, 0.0]);
        assert_ne!(d1.hex(), d3.hex());
        // Same words under another key differ too.
        let mut d4 = ModelDigest::new();
        d4.add_row(0, 1, &a);
        d4.add_row(1, 2, &b);
        assert_ne!(d1.hex(), d4.hex());
    }

    #[test]
    fn parts_round_trip() {
        let mut d = ModelDigest::new();
        d.add_row(2, 7, &[1.5, -2.0]);
        let (sum, items) = d.to_parts();
        assert_eq!(ModelDigest::from_parts(sum, items), d);
        assert_eq!(items, 1);
    }
}

//! A Bloom filter over row ids (IncrCP §4.3, the second filter stage): one per row-0 chunk, so
//! an extraction round estimates how many of a chunk's rows the new column saved again without
//! loading the chunk.
//!
//! Double hashing over two 64-bit mixes of the id; `k = round(bits_per_key * ln 2)` probes.
//! Deterministic (no random seed): the same ids always give the same filter, so a filter
//! rebuilt after a restore answers exactly as the lost one did.

use ftrec_core::rng::mix64;
use ftrec_core::RowId;

/// A Bloom filter sized for a known number of ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    bits: Vec<u64>,
    m: u64,
    k: u32,
}

impl Bloom {
    /// A filter for `n` ids at `bits_per_key` bits each (at least 64 bits, 1 probe).
    pub fn new(n: usize, bits_per_key: u32) -> Bloom {
        let m = ((n as u64).saturating_mul(bits_per_key.max(1) as u64)).max(64);
        let k = ((bits_per_key as f64 * std::f64::consts::LN_2).round() as u32).clamp(1, 16);
        Bloom {
            bits: vec![0; m.div_ceil(64) as usize],
            m,
            k,
        }
    }

    /// A filter holding `ids`.
    pub fn of(ids: impl ExactSizeIterator<Item = RowId>, bits_per_key: u32) -> Bloom {
        let mut b = Bloom::new(ids.len(), bits_per_key);
        for id in ids {
            b.insert(id);
        }
        b
    }

    fn probes(&self, id: RowId) -> impl Iterator<Item = u64> + '_ {
        let h1 = mix64(id);
        let h2 = mix64(id ^ 0x9e37_79b9_7f4a_7c15) | 1;
        (0..self.k as u64).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) % self.m)
    }

    pub fn insert(&mut self, id: RowId) {
        let h1 = mix64(id);
        let h2 = mix64(id ^ 0x9e37_79b9_7f4a_7c15) | 1;
        for i in 0..self.k as u64 {
            let p = h1.wrapping_add(i.wrapping_mul(h2)) % self.m;
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
    }

    /// False means `id` was never inserted; true means it probably was.
    pub fn contains(&self, id: RowId) -> bool {
        self.probes(id)
            .all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }

    /// Memory of the bit array.
    pub fn bytes(&self) -> usize {
        self.bits.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let ids: Vec<u64> = (0..5000).map(|i| i * 7 + 3).collect();
        let b = Bloom::of(ids.iter().copied(), 10);
        assert!(ids.iter().all(|&i| b.contains(i)));
        let fp = (0..20_000u64)
            .map(|i| 1_000_000 + i)
            .filter(|&i| b.contains(i))
            .count();
        // 10 bits per key: about 1% false positives.
        assert!(fp < 600, "{fp} false positives in 20000");
        assert_eq!(b, Bloom::of(ids.iter().copied(), 10), "deterministic");
        assert!(!Bloom::new(0, 10).contains(5));
    }
}

//! Dense (MLP) parameters with their optimizer state.
//!
//! Values are one flat vector (every layer's weights then bias, in layer order) so the matrix
//! kernels read them in place. For the optimizer, for sharding over servers and for the digest,
//! the flat vector is cut into fixed blocks of [`DENSE_BLOCK`] values; block `i` has its own
//! state slot of `state_words(DENSE_BLOCK)` words. A "row" of row-wise Adagrad is a block.

use crate::{ModelDigest, Optimizer};

/// Values per dense block.
pub const DENSE_BLOCK: usize = 256;

/// Whether every word of `words` is finite (no NaN, no infinity). Gradients are checked on
/// every update, so the check runs a chunk at a time without an early exit inside a chunk,
/// which the compiler turns into vector compares.
pub fn all_finite(words: &[f32]) -> bool {
    words
        .chunks(64)
        .all(|c| c.iter().fold(true, |ok, w| ok & w.is_finite()))
}

/// Flat dense parameters plus per-block optimizer state.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseParams {
    pub values: Vec<f32>,
    pub state: Vec<f32>,
    state_per_block: usize,
}

impl DenseParams {
    /// Parameters `values` with zeroed state for `opt`.
    pub fn new(values: Vec<f32>, opt: &Optimizer) -> Self {
        let state_per_block = opt.state_words(DENSE_BLOCK);
        let blocks = values.len().div_ceil(DENSE_BLOCK);
        DenseParams {
            values,
            state: vec![0.0; blocks * state_per_block],
            state_per_block,
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn blocks(&self) -> usize {
        self.values.len().div_ceil(DENSE_BLOCK)
    }

    /// Values and state of block `i` (the last block may be short; its state is the prefix of
    /// its slot that the optimizer needs).
    pub fn block_mut(&mut self, i: usize, opt: &Optimizer) -> (&mut [f32], &mut [f32]) {
        let lo = i * DENSE_BLOCK;
        let hi = (lo + DENSE_BLOCK).min(self.values.len());
        let s = i * self.state_per_block;
        let sw = opt.state_words(hi - lo);
        (&mut self.values[lo..hi], &mut self.state[s..s + sw])
    }

    /// One optimizer step with the full dense gradient `grad` (same layout as `values`).
    pub fn apply(&mut self, opt: &Optimizer, grad: &[f32]) {
        assert_eq!(grad.len(), self.values.len(), "dense gradient length");
        for i in 0..self.blocks() {
            let lo = i * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(grad.len());
            let (v, s) = self.block_mut(i, opt);
            opt.apply_split(v, s, &grad[lo..hi]);
        }
    }

    /// Add every block to `digest`.
    pub fn digest_into(&self, digest: &mut ModelDigest) {
        for i in 0..self.blocks() {
            let lo = i * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(self.values.len());
            let s = i * self.state_per_block;
            digest.add_dense_block(
                i as u64,
                &self.values[lo..hi],
                &self.state[s..s + self.state_per_block],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OptimizerKind;

    #[test]
    fn all_finite_finds_any_nan_or_infinity_wherever_it_is() {
        let mut words: Vec<f32> = (0..300).map(|i| i as f32 - 150.5).collect();
        assert!(all_finite(&words));
        assert!(all_finite(&[]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 63, 64, 150, 299] {
                let keep = words[at];
                words[at] = bad;
                assert!(!all_finite(&words), "{bad} at {at}");
                words[at] = keep;
            }
        }
    }

    #[test]
    fn blockwise_apply_matches_elementwise_for_adagrad() {
        let opt = Optimizer::new(OptimizerKind::Adagrad, 0.1);
        let n = DENSE_BLOCK * 2 + 7;
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let grad: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut p = DenseParams::new(values.clone(), &opt);
        p.apply(&opt, &grad);
        for i in 0..n {
            let mut row = [values[i], 0.0];
            opt.apply(&mut row, 1, &grad[i..i + 1]);
            assert_eq!(p.values[i], row[0], "element {i}");
        }
        let mut d = ModelDigest::new();
        p.digest_into(&mut d);
        assert_eq!(d.items(), 3);
    }
}

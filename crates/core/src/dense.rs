//! Dense (MLP) parameters with their optimizer state.
//!
//! Values are one flat vector (every layer's weights then bias, in layer order) so the matrix
//! kernels read them in place. For the optimizer, for sharding over servers and for the digest,
//! the flat vector is cut into fixed blocks of [`DENSE_BLOCK`] values; block `i` has its own
//! state slot of `state_words(DENSE_BLOCK)` words. A "row" of row-wise Adagrad is a block.

use crate::{ModelDigest, Optimizer};
use std::ops::Range;

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
        let s = state_of(i, hi - lo, self.state_per_block, opt);
        (&mut self.values[lo..hi], &mut self.state[s])
    }

    /// One optimizer step with the full dense gradient `grad` (same layout as `values`).
    pub fn apply(&mut self, opt: &Optimizer, grad: &[f32]) {
        assert_eq!(grad.len(), self.values.len(), "dense gradient length");
        DenseRange {
            first: 0,
            values: &mut self.values,
            state: &mut self.state,
            state_per_block: self.state_per_block,
        }
        .apply(opt, grad);
    }

    /// The blocks cut into at most `parts` contiguous ranges of whole blocks (at least one
    /// range), each of which can take its optimizer step on its own thread: a block's step
    /// reads only its own values, state and gradient, so the result does not depend on the cut.
    pub fn split_mut(&mut self, parts: usize) -> Vec<DenseRange<'_>> {
        let blocks = self.blocks();
        let per = blocks.div_ceil(parts.clamp(1, blocks.max(1))).max(1);
        let spb = self.state_per_block;
        let mut out = Vec::with_capacity(parts.max(1));
        let (mut values, mut state) = (&mut self.values[..], &mut self.state[..]);
        let mut first = 0;
        loop {
            let n = per.min(blocks - first);
            let (v, v_rest) = values.split_at_mut((n * DENSE_BLOCK).min(values.len()));
            let (s, s_rest) = state.split_at_mut(n * spb);
            out.push(DenseRange {
                first,
                values: v,
                state: s,
                state_per_block: spb,
            });
            (values, state) = (v_rest, s_rest);
            first += n;
            if first >= blocks {
                return out;
            }
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

/// Whole blocks `first..` of a [`DenseParams`], from [`DenseParams::split_mut`].
#[derive(Debug)]
pub struct DenseRange<'a> {
    first: usize,
    values: &'a mut [f32],
    state: &'a mut [f32],
    state_per_block: usize,
}

impl DenseRange<'_> {
    /// The range's part of an optimizer step with the full dense gradient `grad` (the layout
    /// of [`DenseParams::values`]).
    pub fn apply(&mut self, opt: &Optimizer, grad: &[f32]) {
        let lo = self.first * DENSE_BLOCK;
        let grad = &grad[lo..lo + self.values.len()];
        for (i, (v, g)) in self
            .values
            .chunks_mut(DENSE_BLOCK)
            .zip(grad.chunks(DENSE_BLOCK))
            .enumerate()
        {
            let s = state_of(i, v.len(), self.state_per_block, opt);
            opt.apply_split(v, &mut self.state[s], g);
        }
    }
}

/// Where the optimizer state of block `i`, of `len` values, lies in a state buffer of
/// `state_per_block` words a block: the last block may be short, and its state is then the
/// prefix of its slot it needs.
fn state_of(i: usize, len: usize, state_per_block: usize, opt: &Optimizer) -> Range<usize> {
    let s = i * state_per_block;
    s..s + opt.state_words(len)
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

    #[test]
    fn a_step_split_into_ranges_gives_the_bits_of_the_whole() {
        // Every optimizer (SGD has no state words, row-wise Adagrad one a block), a short last
        // block, and more parts than blocks.
        let n = DENSE_BLOCK * 5 + 7;
        let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).cos()).collect();
        let grad: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        for kind in OptimizerKind::ALL {
            let opt = Optimizer::new(kind, 0.1);
            let mut whole = DenseParams::new(values.clone(), &opt);
            whole.apply(&opt, &grad);
            for parts in [1, 2, 3, 6, 9] {
                let mut split = DenseParams::new(values.clone(), &opt);
                let ranges = split.split_mut(parts);
                assert_eq!(ranges.len(), parts.min(6), "{kind:?}, {parts} parts");
                for mut r in ranges {
                    r.apply(&opt, &grad);
                }
                let bits = |p: &DenseParams| {
                    (p.values.iter().chain(&p.state))
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&split), bits(&whole), "{kind:?}, {parts} parts");
            }
        }
    }
}

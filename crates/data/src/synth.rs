//! The synthetic Criteo-like stream: Zipf-distributed categorical ids, Criteo-shaped integer
//! features and a planted teacher that decides the clicks.
//!
//! # Determinism and streaming
//! Sample `i` of split `s` is a pure function of `(seed, s, i)`: all its randomness comes from
//! `SplitMix::keyed(seed, stream(s), i)`. Nothing is stored, a position is a sample index and
//! seeking is free. Train and eval are separate streams of the same distribution.
//!
//! # Categorical ids
//! Table `t` has `table_rows[t]` distinct raw values. A sample draws a rank `k` from
//! `Zipf(n = table_rows[t], s = zipf_exponents[t])` (rank 1 the most popular), maps it to a raw
//! 32-bit value by a keyed bijection of `k - 1` (so popular values look like arbitrary hex, as in
//! Criteo), and the raw value to a row by [`crate::categorical_row`], the TSV reader's hash.
//! Generator -> TSV -> reader is therefore bit-identical to the generator's own batches. Like
//! the hashing trick on real data, distinct values can share a row.
//!
//! Each table also has a missing rate (empty bag), and each integer feature a missing rate, a
//! log-normal count distribution and, for `I2`, a few negative values, all loosely shaped like
//! Criteo's columns (see [`DENSE_SHAPES`] and [`CAT_MISSING`]).
//!
//! # The planted teacher
//! `logit = bias + dense + first + pairs` with
//! - `dense = Σ_j w_j · tanh((x_j - c_j) / d_j)` over the transformed integer features `x_j`
//!   (exactly what the model sees), `w_j = ±W·(0.5 + U)` drawn from the seed;
//! - `first = Σ_t A · decay(rank) · g(seed, t, raw)`, `g` uniform with unit variance;
//! - `pairs = Σ_(a,b) B · decay(rank_a) · decay(rank_b) · <u_a(raw_a), u_b(raw_b)> / 2` over
//!   [`TEACHER_PAIRS`], with 4-dim unit-variance latents `u_t(raw)`;
//! - `decay(rank) = (1 + (rank - 1) / R0)^-1/2`, so per-id effects live mostly in the head that
//!   a student sees often, not in the long tail it sees a handful of times;
//! - `bias` is solved at construction (bisection on 4096 samples of a calibration stream) so that
//!   the mean click probability is `base_ctr` (default 0.25; Criteo's is ~0.26).
//!
//! The scales are [`TeacherScales`]: by default `W = 0.5`, `A = 0.3`, `B = 0.4`, `R0 = 50`,
//! chosen (with the `synth_stats` example) for a teacher AUC of ~0.83-0.85 of which a simple
//! factorization-machine student recovers ~0.80-0.81 in 1,500 steps of 2,048 on `small`;
//! stronger per-id or pair scales raise the teacher's AUC but put the gain where a student
//! cannot follow.
//!
//! Per-id parameters are hashes of `(seed, table, raw value)`, so the teacher stores only a few
//! dozen numbers. The label is `Bernoulli(sigmoid(logit))`. The teacher's own AUC is the
//! ceiling any student can reach; see the crate docs for the measured figures.

use ftrec_core::rng::{hash3, SplitMix};
use ftrec_core::{Batch, Preset, NUM_DENSE, NUM_SPARSE};
use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::sample::{transform_dense, RawSample};
use crate::source::{check_batch_size, BatchSource, EvalSet, Position};
use crate::tsv::validate_table_rows;
use crate::zipf::Zipf;

/// Which stream of the generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Eval,
}

impl Split {
    fn stream(self) -> u64 {
        match self {
            Split::Train => STREAM_TRAIN,
            Split::Eval => STREAM_EVAL,
        }
    }
}

// Stream and key tags: arbitrary distinct constants that separate the uses of one seed.
const STREAM_TRAIN: u64 = 0x7472_6169_6e00_0001;
const STREAM_EVAL: u64 = 0x6576_616c_0000_0002;
const STREAM_CALIBRATE: u64 = 0x6361_6c69_6200_0003;
const KEY_SCRAMBLE: u64 = 0x7363_7261_6d00_0004;
const KEY_FIRST: u64 = 0x6669_7273_7400_0005;
const KEY_LATENT: u64 = 0x6c61_7465_6e00_0006;
const KEY_DENSE: u64 = 0x6465_6e73_6500_0007;

/// Shape of one integer feature: missing rate, log-normal `mu` and `sigma` of the count, and
/// the rate of small negative values (-1..-3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseShape {
    pub missing: f64,
    pub mu: f64,
    pub sigma: f64,
    pub negative: f64,
}

const fn ds(missing: f64, mu: f64, sigma: f64, negative: f64) -> DenseShape {
    DenseShape {
        missing,
        mu,
        sigma,
        negative,
    }
}

/// I1..I13: mostly small counts with many missing (I1, I10, I12), one wide heavy column (I5),
/// and I2 with occasional negatives, as in Criteo.
pub const DENSE_SHAPES: [DenseShape; NUM_DENSE] = [
    ds(0.45, 0.6, 1.1, 0.0),
    ds(0.00, 2.5, 2.0, 0.03),
    ds(0.21, 1.8, 1.4, 0.0),
    ds(0.22, 1.6, 1.0, 0.0),
    ds(0.03, 7.5, 2.0, 0.0),
    ds(0.22, 3.5, 1.6, 0.0),
    ds(0.04, 1.5, 1.4, 0.0),
    ds(0.00, 2.2, 1.2, 0.0),
    ds(0.04, 3.4, 1.5, 0.0),
    ds(0.45, 0.1, 0.6, 0.0),
    ds(0.04, 0.9, 0.9, 0.0),
    ds(0.76, 0.2, 0.9, 0.0),
    ds(0.22, 1.6, 1.0, 0.0),
];

/// Missing rate of C1..C26: most columns always present, a few often empty (C19, C20, C22,
/// C25, C26), as in Criteo.
pub const CAT_MISSING: [f64; NUM_SPARSE] = [
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
    0.44, 0.44, 0.03, 0.76, 0.0, 0.03, 0.44, 0.44,
];

/// Table pairs (0-based) whose latents interact in the teacher: head x head, big x small and
/// big x big, so that the dot interaction of a DLRM has something real to find.
pub const TEACHER_PAIRS: [(usize, usize); 6] =
    [(0, 1), (2, 3), (4, 13), (6, 9), (15, 20), (23, 25)];

/// Dimension of the teacher's latents.
const LATENT_DIM: usize = 4;

/// Scales of the planted teacher (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TeacherScales {
    /// `W`: dense weights are `±W·(0.5 + U)`.
    pub dense: f64,
    /// `A`: scale of the first-order per-id effects.
    pub first: f64,
    /// `B`: scale of the pairwise latent interactions.
    pub pairs: f64,
    /// `R0`: per-id effects decay as `(1 + (rank - 1) / R0)^-1/2`.
    pub decay_rank: f64,
}

impl Default for TeacherScales {
    fn default() -> Self {
        TeacherScales {
            dense: 0.5,
            first: 0.3,
            pairs: 0.4,
            decay_rank: 50.0,
        }
    }
}

impl TeacherScales {
    fn validate(&self) -> Result<(), DataError> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        let valid = ok(self.dense)
            && ok(self.first)
            && ok(self.pairs)
            && self.decay_rank.is_finite()
            && self.decay_rank > 0.0;
        if !valid {
            return Err(DataError::InvalidConfig(format!(
                "teacher scales must be finite and non-negative (decay_rank positive): {self:?}"
            )));
        }
        Ok(())
    }
}

/// Calibration samples for the bias.
const CALIBRATION_SAMPLES: u64 = 4096;

/// Configuration of a [`SyntheticSource`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SynthConfig {
    pub seed: u64,
    /// Rows (and distinct raw values) of each of the 26 tables; each must be below 2^32.
    pub table_rows: Vec<u64>,
    /// Zipf exponent of each table.
    pub zipf_exponents: Vec<f64>,
    /// Length of the training stream; `None` is endless.
    pub samples: Option<u64>,
    /// Mean click probability the teacher is calibrated to.
    pub base_ctr: f64,
    /// Scales of the planted teacher.
    #[serde(default)]
    pub teacher: TeacherScales,
}

impl SynthConfig {
    /// The preset's tables with its Zipf exponent on every table, an endless stream and a base
    /// CTR of 0.25.
    pub fn from_preset(preset: &Preset, seed: u64) -> SynthConfig {
        SynthConfig {
            seed,
            table_rows: preset.table_rows.clone(),
            zipf_exponents: vec![preset.zipf_exponent; preset.table_rows.len()],
            samples: None,
            base_ctr: 0.25,
            teacher: TeacherScales::default(),
        }
    }

    pub fn validate(&self) -> Result<(), DataError> {
        validate_table_rows(&self.table_rows)?;
        if let Some(t) = self.table_rows.iter().position(|&r| r > 1 << 32) {
            return Err(DataError::InvalidConfig(format!(
                "table {t} has {} rows; raw Criteo values are 32-bit, so at most 2^32",
                self.table_rows[t]
            )));
        }
        if self.zipf_exponents.len() != self.table_rows.len() {
            return Err(DataError::InvalidConfig(format!(
                "{} Zipf exponents for {} tables",
                self.zipf_exponents.len(),
                self.table_rows.len()
            )));
        }
        if let Some(s) = self
            .zipf_exponents
            .iter()
            .find(|s| !(s.is_finite() && **s > 0.0))
        {
            return Err(DataError::InvalidConfig(format!(
                "Zipf exponent {s} must be positive and finite"
            )));
        }
        if !(self.base_ctr > 0.0 && self.base_ctr < 1.0) {
            return Err(DataError::InvalidConfig(format!(
                "base CTR {} must be strictly between 0 and 1",
                self.base_ctr
            )));
        }
        self.teacher.validate()
    }
}

/// A keyed bijection of the 32-bit values: rank `k` of table `t` is raw value
/// `scramble(k - 1)`. Every step (xor with a key, multiply by an odd constant, xorshift, add a
/// key) is invertible mod 2^32, and [`Scramble::inverse`] undoes them in reverse order.
#[derive(Debug, Clone, Copy)]
struct Scramble {
    k0: u32,
    k1: u32,
}

const M1: u32 = 0x9E37_79B1;
const M2: u32 = 0x85EB_CA6B;
const M3: u32 = 0xC2B2_AE35;

/// The inverse of an odd number mod 2^32 by Newton's iteration (each step doubles the correct
/// low bits: 1 -> 2 -> 4 -> ... -> 32 from the seed `a`, which is correct to 3 bits).
const fn inv_odd(a: u32) -> u32 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

const M1_INV: u32 = inv_odd(M1);
const M2_INV: u32 = inv_odd(M2);
const M3_INV: u32 = inv_odd(M3);

fn unxorshift(y: u32, s: u32) -> u32 {
    let mut x = y;
    let mut shift = s;
    while shift < 32 {
        x = y ^ (x >> s);
        shift += s;
    }
    x
}

impl Scramble {
    fn new(seed: u64, table: usize) -> Scramble {
        let k = hash3(seed, KEY_SCRAMBLE, table as u64);
        Scramble {
            k0: k as u32,
            k1: (k >> 32) as u32,
        }
    }

    fn apply(self, v: u32) -> u32 {
        let mut x = (v ^ self.k0).wrapping_mul(M1);
        x ^= x >> 16;
        x = x.wrapping_add(self.k1).wrapping_mul(M2);
        x ^= x >> 13;
        x = x.wrapping_mul(M3);
        x ^ (x >> 16)
    }

    fn inverse(self, y: u32) -> u32 {
        let mut x = unxorshift(y, 16).wrapping_mul(M3_INV);
        x = unxorshift(x, 13).wrapping_mul(M2_INV).wrapping_sub(self.k1);
        x = unxorshift(x, 16).wrapping_mul(M1_INV);
        x ^ self.k0
    }
}

/// Unit-variance uniform in `[-√3, √3)` from 64 random bits.
#[inline]
fn unit_uniform(bits: u64) -> f64 {
    let u = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    (2.0 * u - 1.0) * 3f64.sqrt()
}

#[inline]
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// How much a value of popularity `rank` (1 = most popular) weighs in the teacher's logit.
#[inline(always)]
fn decay_at(rank: u64, decay_rank: f64) -> f64 {
    (1.0 + (rank - 1) as f64 / decay_rank).sqrt().recip()
}

ftrec_core::simd_kernel! {
    /// [`decay_at`] of every rank, compiled for the CPU's widest vectors: element-wise
    /// divisions and square roots round the same in every lane, so the bits do not change.
    fn decays(ranks: &[u64; NUM_SPARSE], decay_rank: f64, out: &mut [f64; NUM_SPARSE]) {
        for (o, &r) in out.iter_mut().zip(ranks) {
            *o = decay_at(r, decay_rank);
        }
    }
}

/// The planted teacher: click probability as a function of what a TSV line says.
#[derive(Debug, Clone)]
pub struct Teacher {
    seed: u64,
    scales: TeacherScales,
    scrambles: Vec<Scramble>,
    dense_w: [f64; NUM_DENSE],
    /// `dense_terms[j][c]`: feature `j`'s term of the logit at count `c` (a missing or
    /// negative count is 0), for the small counts most samples have; computed as
    /// [`Teacher::dense_term`] computes it, so the logit is the same with or without it.
    dense_terms: DenseTerms,
    bias: f64,
}

/// Counts whose dense terms the teacher tabulates.
const TABULATED_COUNTS: usize = 256;

#[derive(Clone)]
struct DenseTerms(Box<[[f64; TABULATED_COUNTS]; NUM_DENSE]>);

impl std::fmt::Debug for DenseTerms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DenseTerms({NUM_DENSE} x {TABULATED_COUNTS})")
    }
}

impl Teacher {
    fn new(seed: u64, scales: TeacherScales) -> Teacher {
        let mut dense_w = [0.0; NUM_DENSE];
        for (j, w) in dense_w.iter_mut().enumerate() {
            let mut r = SplitMix::keyed(seed, KEY_DENSE, j as u64);
            let sign = if r.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            *w = sign * scales.dense * (0.5 + r.next_f64());
        }
        let mut terms = Box::new([[0.0; TABULATED_COUNTS]; NUM_DENSE]);
        for (j, row) in terms.iter_mut().enumerate() {
            for (c, t) in row.iter_mut().enumerate() {
                *t = Self::dense_term(dense_w[j], j, Some(c as i64));
            }
        }
        Teacher {
            seed,
            scales,
            scrambles: (0..NUM_SPARSE).map(|t| Scramble::new(seed, t)).collect(),
            dense_w,
            dense_terms: DenseTerms(terms),
            bias: 0.0,
        }
    }

    /// Feature `j`'s term of the logit, weight `w`, at raw count `x`.
    fn dense_term(w: f64, j: usize, x: Option<i64>) -> f64 {
        let shape = &DENSE_SHAPES[j];
        let x = transform_dense(x) as f64;
        w * ((x - shape.mu) / shape.sigma).tanh()
    }

    /// The bias of the logit (solved for the base CTR).
    pub fn bias(&self) -> f64 {
        self.bias
    }

    /// The integer features' part of the logit.
    fn dense_score(&self, s: &RawSample) -> f64 {
        let mut z = 0.0;
        for (j, (&w, terms)) in self
            .dense_w
            .iter()
            .zip(self.dense_terms.0.iter())
            .enumerate()
        {
            let c = s.dense[j].unwrap_or(0).max(0);
            z += match terms.get(c as usize) {
                Some(&t) => t,
                None => Self::dense_term(w, j, s.dense[j]),
            };
        }
        z
    }

    /// The logit without its bias.
    fn score(&self, s: &RawSample) -> f64 {
        let mut z = self.dense_score(s);
        // The decays first, all at once: each is two divisions and a square root, which
        // vector units compute lane by lane with the same rounding (a missing value's is
        // never used).
        let mut ranks = [1u64; NUM_SPARSE];
        for ((r, c), scramble) in ranks.iter_mut().zip(&s.cats).zip(&self.scrambles) {
            if let Some(v) = *c {
                *r = scramble.inverse(v) as u64 + 1;
            }
        }
        let mut decay = [0.0; NUM_SPARSE];
        decays(&ranks, self.scales.decay_rank, &mut decay);
        for (t, c) in s.cats.iter().enumerate() {
            if let Some(v) = *c {
                let g = unit_uniform(hash3(self.seed ^ KEY_FIRST, t as u64, v as u64));
                z += self.scales.first * decay[t] * g;
            }
        }
        for &(a, b) in &TEACHER_PAIRS {
            let (Some(va), Some(vb)) = (s.cats[a], s.cats[b]) else {
                continue;
            };
            let mut ra = SplitMix::keyed(self.seed ^ KEY_LATENT, a as u64, va as u64);
            let mut rb = SplitMix::keyed(self.seed ^ KEY_LATENT, b as u64, vb as u64);
            let dot: f64 = (0..LATENT_DIM)
                .map(|_| unit_uniform(ra.next_u64()) * unit_uniform(rb.next_u64()))
                .sum();
            z += self.scales.pairs * decay[a] * decay[b] * dot / (LATENT_DIM as f64).sqrt();
        }
        z
    }

    /// The teacher's click probability of a sample.
    pub fn probability(&self, s: &RawSample) -> f64 {
        sigmoid(self.bias + self.score(s))
    }
}

/// A deterministic, streaming, Criteo-like data source; a [`BatchSource`].
#[derive(Debug, Clone)]
pub struct SyntheticSource {
    cfg: SynthConfig,
    zipfs: Vec<Zipf>,
    teacher: Teacher,
    next: u64,
}

impl SyntheticSource {
    pub fn new(cfg: SynthConfig) -> Result<SyntheticSource, DataError> {
        cfg.validate()?;
        let zipfs = cfg
            .table_rows
            .iter()
            .zip(&cfg.zipf_exponents)
            .map(|(&n, &s)| {
                Zipf::new(n, s).ok_or_else(|| {
                    DataError::InvalidConfig(format!("bad Zipf parameters n={n}, s={s}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut src = SyntheticSource {
            teacher: Teacher::new(cfg.seed, cfg.teacher),
            cfg,
            zipfs,
            next: 0,
        };
        src.teacher.bias = src.solve_bias();
        Ok(src)
    }

    /// Convenience: [`SynthConfig::from_preset`].
    pub fn from_preset(preset: &Preset, seed: u64) -> Result<SyntheticSource, DataError> {
        Self::new(SynthConfig::from_preset(preset, seed))
    }

    pub fn config(&self) -> &SynthConfig {
        &self.cfg
    }

    /// The index of the sample the next batch starts at (its [`BatchSource::position`]).
    pub fn next_sample(&self) -> u64 {
        self.next
    }

    pub fn teacher(&self) -> &Teacher {
        &self.teacher
    }

    /// The bias that makes the mean click probability over the calibration stream equal the
    /// base CTR; the mean is increasing in the bias, so bisection converges.
    fn solve_bias(&self) -> f64 {
        let scores: Vec<f64> = (0..CALIBRATION_SAMPLES)
            .map(|i| {
                let s = self.raw_sample(STREAM_CALIBRATE, i).0;
                self.teacher.score(&s)
            })
            .collect();
        let mean_at =
            |b: f64| scores.iter().map(|&z| sigmoid(b + z)).sum::<f64>() / scores.len() as f64;
        let (mut lo, mut hi) = (-30.0, 30.0);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if mean_at(mid) < self.cfg.base_ctr {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }

    /// The raw sample `index` of a stream and the generator for its label draw.
    fn raw_sample(&self, stream: u64, index: u64) -> (RawSample, SplitMix) {
        let mut rng = SplitMix::keyed(self.cfg.seed, stream, index);
        let mut s = RawSample::default();
        for (slot, shape) in s.dense.iter_mut().zip(&DENSE_SHAPES) {
            let u = rng.next_f64();
            *slot = if u < shape.missing {
                None
            } else if u < shape.missing + shape.negative {
                Some(-1 - (rng.next_u64() % 3) as i64)
            } else {
                // The count is the floor of a positive number: its truncation. One beyond i64
                // would need sigma-many standard deviations; clamp anyway.
                let count = (shape.mu + shape.sigma * rng.next_normal()).exp();
                Some(count.min(i64::MAX as f64) as i64)
            };
        }
        for (t, slot) in s.cats.iter_mut().enumerate() {
            if rng.next_f64() < CAT_MISSING[t] {
                continue;
            }
            let rank = self.zipfs[t].sample(&mut rng);
            *slot = Some(self.teacher.scrambles[t].apply((rank - 1) as u32));
        }
        (s, rng)
    }

    /// Sample `index` of `split` with its teacher probability; the label is drawn from it.
    pub fn sample(&self, split: Split, index: u64) -> (RawSample, f64) {
        let (mut s, mut rng) = self.raw_sample(split.stream(), index);
        let p = self.teacher.probability(&s);
        s.label = rng.next_f64() < p;
        (s, p)
    }

    /// The popularity rank (1 = most popular) of raw value `value` in table `table`; values the
    /// generator never emits have ranks beyond the table's row count.
    pub fn rank_of(&self, table: usize, value: u32) -> u64 {
        self.teacher.scrambles[table].inverse(value) as u64 + 1
    }

    /// Samples `start .. start + count` of `split` as one batch, and their teacher
    /// probabilities.
    pub fn batch_at(&self, split: Split, start: u64, count: usize) -> (Batch, Vec<f32>) {
        let mut batch = Batch::with_capacity(count, NUM_DENSE, NUM_SPARSE);
        let mut probs = Vec::with_capacity(count);
        for i in 0..count as u64 {
            let (s, p) = self.sample(split, start + i);
            s.append_to(&mut batch, &self.cfg.table_rows);
            probs.push(p as f32);
        }
        (batch, probs)
    }
}

impl BatchSource for SyntheticSource {
    fn table_rows(&self) -> &[u64] {
        &self.cfg.table_rows
    }

    fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, DataError> {
        check_batch_size(size)?;
        let count = match self.cfg.samples {
            Some(n) => (n.saturating_sub(self.next)).min(size as u64) as usize,
            // A resumed endless stream ends where sample indexes do.
            None => (u64::MAX - self.next).min(size as u64) as usize,
        };
        if count == 0 {
            return Ok(None);
        }
        let (batch, _) = self.batch_at(Split::Train, self.next, count);
        self.next += count as u64;
        Ok(Some(batch))
    }

    fn position(&self) -> Position {
        Position::Synthetic { sample: self.next }
    }

    fn seek(&mut self, pos: &Position) -> Result<(), DataError> {
        match pos {
            Position::Synthetic { sample } => {
                if let Some(n) = self.cfg.samples {
                    if *sample > n {
                        return Err(DataError::BadPosition(format!(
                            "sample {sample} is past the end of a {n}-sample stream"
                        )));
                    }
                }
                self.next = *sample;
                Ok(())
            }
            other => Err(DataError::BadPosition(format!(
                "{other:?} is not a synthetic-stream position"
            ))),
        }
    }

    fn eval_set(&self, max_samples: usize, batch: usize) -> Result<EvalSet, DataError> {
        check_batch_size(batch)?;
        let mut set = EvalSet {
            teacher_probs: Some(Vec::with_capacity(max_samples)),
            ..Default::default()
        };
        let mut start = 0usize;
        while start < max_samples {
            let count = batch.min(max_samples - start);
            let (b, p) = self.batch_at(Split::Eval, start as u64, count);
            set.batches.push(b);
            if let Some(all) = set.teacher_probs.as_mut() {
                all.extend(p);
            }
            start += count;
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tabulated_dense_terms_give_the_logit_computed_term_by_term() {
        let src = SyntheticSource::from_preset(&Preset::by_name("small").unwrap(), 3).unwrap();
        let t = src.teacher();
        let mut beyond = 0;
        for i in 0..20_000 {
            let (s, _) = src.raw_sample(STREAM_TRAIN, i);
            let mut direct = 0.0;
            for (j, &w) in t.dense_w.iter().enumerate() {
                let shape = &DENSE_SHAPES[j];
                let x = transform_dense(s.dense[j]) as f64;
                direct += w * ((x - shape.mu) / shape.sigma).tanh();
                beyond += usize::from(s.dense[j].unwrap_or(0) >= TABULATED_COUNTS as i64);
            }
            assert_eq!(t.dense_score(&s).to_bits(), direct.to_bits(), "sample {i}");
        }
        assert!(
            beyond > 0,
            "no count beyond the table: its fallback went untested"
        );
    }

    #[test]
    fn scramble_is_a_bijection_with_its_inverse() {
        for (seed, t) in [(0u64, 0usize), (1, 5), (u64::MAX, 25)] {
            let s = Scramble::new(seed, t);
            for v in [0u32, 1, 2, 12345, 0x8000_0000, u32::MAX] {
                assert_eq!(s.inverse(s.apply(v)), v);
                assert_eq!(s.apply(s.inverse(v)), v);
            }
            let mut seen = std::collections::HashSet::new();
            for v in 0..10_000u32 {
                assert!(seen.insert(s.apply(v)), "collision at {v}");
            }
        }
        for a in [M1, M2, M3] {
            assert_eq!(a.wrapping_mul(inv_odd(a)), 1);
        }
    }

    proptest::proptest! {
        #[test]
        fn scramble_inverse_undoes_it_for_any_key(seed: u64, table in 0usize..26, v: u32) {
            let s = Scramble::new(seed, table);
            proptest::prop_assert_eq!(s.inverse(s.apply(v)), v);
        }
    }

    #[test]
    fn unit_uniform_has_unit_variance() {
        let n = 200_000u64;
        let (mut m, mut m2) = (0.0, 0.0);
        for i in 0..n {
            let x = unit_uniform(ftrec_core::rng::mix64(i));
            m += x;
            m2 += x * x;
        }
        assert!((m / n as f64).abs() < 0.01);
        assert!((m2 / n as f64 - 1.0).abs() < 0.01);
    }
}

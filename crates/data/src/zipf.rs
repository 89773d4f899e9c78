//! A Zipf sampler over ranks `1..=n` by rejection-inversion (Hörmann and Derflinger, "Rejection-
//! inversion to generate variates from monotone discrete distributions", 1996).
//!
//! Our own sampler rather than a crate's so that the synthetic data set is a pure function of
//! the seed forever: a dependency upgrade that changed its sampling loop would silently change
//! every generated sample and every digest computed from them.
//!
//! The idea: `h(x) = x^-s` is convex and decreasing, so the area under it over
//! `[k - 1/2, k + 1/2]` is at least `h(k)`. Draw a point uniformly in the area under `h` over
//! `[1/2, n + 1/2]` (with rank 1 given exactly area `h(1)`), invert the integral `H` to get `x`,
//! round to the rank `k`, and accept when the point falls in the top `h(k)` of `k`'s slice.
//! Acceptance is high (well over 90% for the exponents we use), and the cost does not depend on
//! `n`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ftrec_core::rng::SplitMix;

/// Zipf distribution over ranks `1..=n`: `P(k) ∝ k^-s`.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    squeeze: f64,
    bounds: Bounds,
}

/// Ranks whose acceptance bound is computed once per exponent (see [`Zipf::sample`]): the
/// popular ranks, which most draws are.
const TABULATED_RANKS: usize = 4096;

/// The acceptance bounds `H(k + 1/2) - h(k)` of ranks `1..=TABULATED_RANKS`, shared by every
/// sampler of one exponent. Each is the value [`Zipf::bound`] would compute, so a draw is
/// the same with or without the table.
#[derive(Clone)]
struct Bounds(Arc<[f64]>);

impl std::fmt::Debug for Bounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bounds({} ranks)", self.0.len())
    }
}

impl Bounds {
    /// The table of exponent `z.s`, computed on first use.
    fn of(z: &Zipf) -> Bounds {
        static TABLES: OnceLock<Mutex<HashMap<u64, Arc<[f64]>>>> = OnceLock::new();
        let tables = TABLES.get_or_init(Mutex::default);
        let mut tables = tables.lock().unwrap_or_else(|e| e.into_inner());
        let t = tables
            .entry(z.s.to_bits())
            .or_insert_with(|| (1..=TABULATED_RANKS).map(|k| z.bound(k as f64)).collect());
        Bounds(Arc::clone(t))
    }
}

/// `(e^y - 1) / y`, continuous at 0.
fn expm1_over(y: f64) -> f64 {
    if y.abs() > 1e-8 {
        y.exp_m1() / y
    } else {
        1.0 + y / 2.0 * (1.0 + y / 3.0)
    }
}

/// `ln(1 + y) / y`, continuous at 0.
fn ln1p_over(y: f64) -> f64 {
    if y.abs() > 1e-8 {
        y.ln_1p() / y
    } else {
        1.0 - y * (0.5 - y / 3.0)
    }
}

impl Zipf {
    /// `n >= 1` ranks, exponent `s > 0` (finite).
    pub fn new(n: u64, s: f64) -> Option<Zipf> {
        if n == 0 || !(s > 0.0 && s.is_finite()) {
            return None;
        }
        let mut z = Zipf {
            n,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            squeeze: 0.0,
            bounds: Bounds(Arc::new([])),
        };
        z.h_x1 = z.big_h(1.5) - 1.0;
        z.h_n = z.big_h(n as f64 + 0.5);
        z.squeeze = 2.0 - z.big_h_inv(z.big_h(2.5) - z.h(2.0));
        z.bounds = Bounds::of(&z);
        Some(z)
    }

    pub fn n(&self) -> u64 {
        self.n
    }

    pub fn exponent(&self) -> f64 {
        self.s
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// `∫_1^x t^-s dt`, written to stay accurate when `s` is close to 1.
    fn big_h(&self, x: f64) -> f64 {
        let lx = x.ln();
        lx * expm1_over((1.0 - self.s) * lx)
    }

    fn big_h_inv(&self, y: f64) -> f64 {
        let q = 1.0 - self.s;
        // Guard the log's argument against rounding just below -1 at the far left edge.
        let t = (q * y).max(-1.0 + 1e-15);
        (ln1p_over(t) * y).exp()
    }

    /// The acceptance bound of rank `k`: a point at `u >= H(k + 1/2) - h(k)` falls in the top
    /// `h(k)` of `k`'s slice.
    fn bound(&self, k: f64) -> f64 {
        self.big_h(k + 0.5) - self.h(k)
    }

    /// One rank in `1..=n`.
    pub fn sample(&self, rng: &mut SplitMix) -> u64 {
        loop {
            let u = self.h_n + rng.next_f64() * (self.h_x1 - self.h_n);
            let x = self.big_h_inv(u);
            // `x + 1/2` is positive, so truncation is its floor (without a call to `floor`).
            let k = ((x + 0.5) as u64 as f64).clamp(1.0, self.n as f64);
            if k - x <= self.squeeze {
                return k as u64;
            }
            let bound = match self.bounds.0.get(k as usize - 1) {
                Some(&b) => b,
                None => self.bound(k),
            };
            if u >= bound {
                return k as u64;
            }
        }
    }

    /// `P(rank = k)`, by direct summation (O(n)); for tests and measurements.
    pub fn pmf(&self, k: u64) -> f64 {
        let norm: f64 = (1..=self.n).map(|i| self.h(i as f64)).sum();
        self.h(k as f64) / norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frequencies(n: u64, s: f64, draws: usize) -> Vec<f64> {
        let z = Zipf::new(n, s).unwrap();
        let mut rng = SplitMix::new(42);
        let mut counts = vec![0usize; n as usize + 1];
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k), "rank {k} outside 1..={n}");
            counts[k as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn frequencies_match_the_pmf() {
        // Below, at and above s = 1 (where H changes form), and a one-rank table.
        for (n, s) in [(8u64, 0.6), (8, 1.0), (20, 1.05), (5, 2.5), (1, 1.05)] {
            let z = Zipf::new(n, s).unwrap();
            let f = frequencies(n, s, 200_000);
            for k in 1..=n {
                let p = z.pmf(k);
                // ~4.5 standard deviations of a binomial proportion at 200k draws.
                let tol = 4.5 * (p * (1.0 - p) / 200_000.0).sqrt() + 1e-9;
                assert!(
                    (f[k as usize] - p).abs() <= tol,
                    "n={n} s={s} rank {k}: frequency {} vs pmf {p}",
                    f[k as usize]
                );
            }
        }
    }

    #[test]
    fn head_mass_of_a_large_table_matches_the_pmf() {
        let n = 10_000_000;
        let z = Zipf::new(n, 1.05).unwrap();
        let mut rng = SplitMix::new(7);
        let draws = 100_000;
        let top1 = (0..draws).filter(|_| z.sample(&mut rng) == 1).count() as f64 / draws as f64;
        // P(1) = 1 / sum_{k<=n} k^-1.05, the sum computed by an integral approximation:
        // zeta(1.05) minus the tail beyond n.
        let zeta = 20.580_844; // zeta(1.05)
        let tail = (n as f64).powf(-0.05) / 0.05 - 0.5 * (n as f64).powf(-1.05);
        let p1 = 1.0 / (zeta - tail);
        assert!((top1 - p1).abs() < 0.004, "top-1 mass {top1} vs {p1}");
    }

    /// The sampler as first written: every bound computed, `floor` called.
    fn reference_sample(z: &Zipf, rng: &mut SplitMix) -> u64 {
        loop {
            let u = z.h_n + rng.next_f64() * (z.h_x1 - z.h_n);
            let x = z.big_h_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, z.n as f64);
            if k - x <= z.squeeze || u >= z.big_h(k + 0.5) - z.h(k) {
                return k as u64;
            }
        }
    }

    #[test]
    fn draws_equal_the_reference_sampler_bit_for_bit() {
        // Ranks in and beyond the table, a table smaller than it, exponents below and above 1.
        for (n, s) in [(120_000u64, 1.05), (3, 1.05), (5000, 0.6), (1 << 30, 1.2)] {
            let z = Zipf::new(n, s).unwrap();
            let (mut a, mut b) = (SplitMix::new(5), SplitMix::new(5));
            let mut beyond = 0;
            for _ in 0..200_000 {
                let k = z.sample(&mut a);
                assert_eq!(k, reference_sample(&z, &mut b), "n={n} s={s}");
                beyond += usize::from(k as usize > TABULATED_RANKS);
            }
            assert_eq!(
                a.next_u64(),
                b.next_u64(),
                "n={n} s={s}: the streams drifted"
            );
            if n > 100_000 {
                assert!(beyond > 0, "n={n} s={s}: no draw beyond the table");
            }
        }
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Zipf::new(0, 1.0).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        assert!(Zipf::new(10, f64::INFINITY).is_none());
    }
}

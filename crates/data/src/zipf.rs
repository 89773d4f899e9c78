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
//!
//! Most draws skip the inversion's logarithm and exponential (two thirds of a draw's time): a
//! draw's outcome depends on `u` only through a few thresholds per rank (where `x` crosses
//! `k + 1/2`, where it crosses the squeeze), so for the popular ranks those thresholds are
//! tabulated with a guard band around each, far wider than the rounding of the inversion, and
//! a `u` outside every band is decided by comparisons alone (see [`Fast`]). A `u` inside a band
//! takes the inversion as before. Either way the draw is the one the inversion gives.

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

/// Ranks whose acceptance bound and thresholds are computed once per exponent (see
/// [`Zipf::sample`]): the popular ranks, which most draws are.
const TABULATED_RANKS: usize = 8192;

/// Cells of [`Fast`]'s lookup from `u` to the first rank to compare with.
const CELLS: usize = 65536;

/// A threshold's guard band, relative to its size (at least 1): about seven orders of
/// magnitude wider than the inversion's rounding where [`Fast`] is used.
const GUARD: f64 = 1e-9;

/// The smallest `1 + (1 - s) u` (the argument of the inversion's logarithm) [`Fast`] serves:
/// near 0 the logarithm magnifies rounding, so those draws take the inversion.
const MIN_LOG_ARGUMENT: f64 = 1e-3;

/// The tables of one exponent, shared by every sampler with it (computed on first use).
#[derive(Clone)]
struct Bounds(Arc<Tables>);

struct Tables {
    /// The acceptance bounds `H(k + 1/2) - h(k)` of ranks `1..=TABULATED_RANKS`. Each is the
    /// value [`Zipf::bound`] would compute, so a draw is the same with or without the table.
    bound: Box<[f64]>,
    fast: Option<Fast>,
}

/// What decides a draw from `u` without the inversion `x = H^-1(u)`. The sampler takes rank
/// `k = round(x)` (rank 1 below 1.5), which changes where `u` crosses `B_k = H(k + 1/2)`, and
/// accepts when `k - x <= squeeze`, that is `u >= S_k = H(k - squeeze)`, or else when `u` is
/// at least `k`'s acceptance bound. With a band of [`GUARD`] around each `B_k` and below each
/// `S_k`: a `u` between rank `k`'s bands has rank `k` whatever the inversion's rounding; at or
/// above the bound it is accepted, below `S_k`'s band (and the bound) rejected; anything else
/// is left to the inversion. All thresholds depend on the exponent only.
struct Fast {
    /// `u`'s least value, `H(3/2) - 1` (where the sampler's area starts).
    base: f64,
    /// Cells per unit of `u`.
    per_u: f64,
    /// `cell[c]`: a rank no greater than that of any `u` in cell `c` (one cell of slack for
    /// the rounding of the cell's index).
    cell: Box<[u16]>,
    /// `rank[k - 1]`: rank `k`'s thresholds, together so that a draw reads one cache line.
    rank: Box<[Thresholds]>,
}

/// The thresholds of one rank `k` in [`Fast`].
#[derive(Debug, Clone, Copy)]
struct Thresholds {
    /// `B_k`'s band.
    low: f64,
    high: f64,
    /// The acceptance bound.
    bound: f64,
    /// The bottom of `S_k`'s band (-infinity where `k - squeeze <= 0`: every `x` is squeezed
    /// in).
    squeeze_low: f64,
}

/// How [`Fast`] decides a `u`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Rank(u64),
    Reject,
    /// Near a threshold, past the table, or an exponent it does not serve: the inversion.
    Invert,
}

impl std::fmt::Debug for Bounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bounds({} ranks, {} decided by table)",
            self.0.bound.len(),
            self.0.fast.as_ref().map_or(0, |f| f.rank.len())
        )
    }
}

impl Bounds {
    /// The tables of exponent `z.s`, computed on first use.
    fn of(z: &Zipf) -> Bounds {
        static TABLES: OnceLock<Mutex<HashMap<u64, Arc<Tables>>>> = OnceLock::new();
        let tables = TABLES.get_or_init(Mutex::default);
        let mut tables = tables.lock().unwrap_or_else(|e| e.into_inner());
        let t = tables.entry(z.s.to_bits()).or_insert_with(|| {
            Arc::new(Tables {
                bound: (1..=TABULATED_RANKS).map(|k| z.bound(k as f64)).collect(),
                fast: Fast::of(z),
            })
        });
        Bounds(Arc::clone(t))
    }
}

impl Fast {
    /// The thresholds of `z`'s exponent (its `n` plays no part), or `None` where the
    /// inversion's logarithm is ill-conditioned from the first rank on.
    fn of(z: &Zipf) -> Option<Fast> {
        let q = 1.0 - z.s;
        let band = |t: f64| GUARD * t.abs().max(1.0);
        let log_ok = |u: f64| 1.0 + q * u >= MIN_LOG_ARGUMENT;
        let base = z.h_x1;
        let mut rank = Vec::with_capacity(TABULATED_RANKS);
        for k in 1..=TABULATED_RANKS {
            let b = z.big_h(k as f64 + 0.5);
            let (low, high) = (b - band(b), b + band(b));
            // Every `u` the table decides lies in `[base, low]` of its last rank.
            if !(log_ok(base) && log_ok(low) && low.is_finite() && low > base) {
                break;
            }
            let at = k as f64 - z.squeeze;
            rank.push(Thresholds {
                low,
                high,
                bound: z.bound(k as f64),
                squeeze_low: if at > 0.0 {
                    let t = z.big_h(at);
                    t - band(t)
                } else {
                    f64::NEG_INFINITY
                },
            });
        }
        let top = rank.last()?.low;
        let per_u = CELLS as f64 / (top - base);
        // Rank 1 + the number of upper edges below the start of the cell before.
        let mut cell = Vec::with_capacity(CELLS);
        let mut k = 1;
        for c in 0..CELLS {
            let start = base + (c as f64 - 1.0) / per_u;
            while k <= rank.len() && rank[k - 1].high < start {
                k += 1;
            }
            cell.push(u16::try_from(k).ok()?);
        }
        Some(Fast {
            base,
            per_u,
            cell: cell.into(),
            rank: rank.into(),
        })
    }

    /// The draw of `u`.
    #[inline]
    fn decide(&self, u: f64) -> Decision {
        if u.is_nan() || u < self.base {
            return Decision::Invert;
        }
        let Some(&first) = self.cell.get(((u - self.base) * self.per_u) as usize) else {
            return Decision::Invert;
        };
        let mut k = first as usize;
        let t = loop {
            let Some(t) = self.rank.get(k - 1) else {
                return Decision::Invert;
            };
            if u < t.low {
                break t;
            }
            if u <= t.high {
                return Decision::Invert;
            }
            k += 1;
        };
        if u >= t.bound {
            Decision::Rank(k as u64)
        } else if u < t.squeeze_low {
            Decision::Reject
        } else {
            Decision::Invert
        }
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
            bounds: Bounds(Arc::new(Tables {
                bound: Box::new([]),
                fast: None,
            })),
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
        let tables = &*self.bounds.0;
        loop {
            let u = self.h_n + rng.next_f64() * (self.h_x1 - self.h_n);
            let decision = match &tables.fast {
                Some(fast) => fast.decide(u),
                None => Decision::Invert,
            };
            match decision {
                Decision::Rank(k) => return k,
                Decision::Reject => {}
                Decision::Invert => {
                    if let Some(k) = self.invert(u) {
                        return k;
                    }
                }
            }
        }
    }

    /// The draw of `u` by the inversion: its rank, or `None` if rejected.
    fn invert(&self, u: f64) -> Option<u64> {
        let x = self.big_h_inv(u);
        // `x + 1/2` is positive, so truncation is its floor (without a call to `floor`).
        let k = ((x + 0.5) as u64 as f64).clamp(1.0, self.n as f64);
        if k - x <= self.squeeze {
            return Some(k as u64);
        }
        let bound = match self.bounds.0.bound.get(k as usize - 1) {
            Some(&b) => b,
            None => self.bound(k),
        };
        (u >= bound).then_some(k as u64)
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
        for (n, s) in [
            (120_000u64, 1.05),
            (3, 1.05),
            (5000, 0.6),
            (1 << 30, 1.2),
            (120_000, 1.0),
            (10_000_000, 0.3),
            (1 << 20, 2.0),
            (1 << 20, 3.5),
        ] {
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
            if n > 100_000 && s <= 1.2 {
                assert!(beyond > 0, "n={n} s={s}: no draw beyond the table");
            }
        }
    }

    #[test]
    fn the_table_decides_as_the_inversion_does_at_and_around_every_threshold() {
        for s in [0.3, 0.6, 1.0, 1.05, 1.2, 2.0, 3.5] {
            let z = Zipf::new(1 << 40, s).unwrap();
            let tables = &*z.bounds.0;
            let fast = tables
                .fast
                .as_ref()
                .expect("exponents this mild are served");
            let mut probes = vec![fast.base];
            for t in fast.rank.iter() {
                let (lo, hi) = (t.low, t.high);
                probes.extend([lo, hi, 0.5 * (lo + hi), t.bound, t.squeeze_low]);
            }
            let (mut decided, mut probed) = (0, 0);
            for p in probes.into_iter().filter(|p| p.is_finite()) {
                // The threshold, its neighbours a few ulps away and a relative 1e-12 and
                // 1e-8 away (inside and outside the guard band).
                let mut near = vec![p];
                let (mut up, mut down) = (p, p);
                for _ in 0..3 {
                    (up, down) = (up.next_up(), down.next_down());
                    near.extend([up, down]);
                }
                for r in [1e-12, 1e-8] {
                    let d = r * p.abs().max(1.0);
                    near.extend([p + d, p - d]);
                }
                for u in near {
                    probed += 1;
                    let want = z.invert(u);
                    match fast.decide(u) {
                        Decision::Rank(k) => {
                            decided += 1;
                            assert_eq!(Some(k), want, "s={s} u={u}");
                        }
                        Decision::Reject => {
                            decided += 1;
                            assert_eq!(None, want, "s={s} u={u}");
                        }
                        Decision::Invert => {}
                    }
                }
            }
            // Most probes lie outside the bands (the 1e-8 ones, the midpoints).
            assert!(decided * 4 > probed, "s={s}: {decided} of {probed} decided");
        }
    }

    #[test]
    fn most_draws_of_the_presets_exponent_skip_the_inversion() {
        let z = Zipf::new(120_000, 1.05).unwrap();
        let tables = &*z.bounds.0;
        let fast = tables.fast.as_ref().unwrap();
        let mut rng = SplitMix::new(3);
        let draws = 100_000;
        let by_table = (0..draws)
            .filter(|_| {
                let u = z.h_n + rng.next_f64() * (z.h_x1 - z.h_n);
                fast.decide(u) != Decision::Invert
            })
            .count();
        // The table covers ranks up to 8192: 80% of `u`'s range at this n.
        assert!(by_table * 10 > draws * 7, "{by_table} of {draws}");
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Zipf::new(0, 1.0).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        assert!(Zipf::new(10, f64::INFINITY).is_none());
    }
}

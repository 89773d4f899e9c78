//! The paper's float-sum code (ECRec §3.2) and a measurement of its drift.
//!
//! Parity `p = e_0 + e_1 + ... + e_{k-1}`, element-wise over f32 (embedding values and
//! optimizer-state words alike), one parity per stripe (`r = 1`). A lost data row is
//! `p - (the other rows)`; a changed row moves the parity by `new - old` (difference
//! propagation, ECRec §3.2.1).
//!
//! # Why the bits drift
//! f32 addition rounds, so it is not associative: `(p + (new - old))` is not the rounded sum
//! of the new rows, and `p - e_1 - e_2` is not exactly `e_0` even for a freshly encoded `p`.
//! Every difference propagation adds up to two roundings (one for `new - old`, one for
//! `p + delta`), each at most half an ulp of its result, so the parity wanders away from the
//! exact sum like a random walk whose steps scale with the parity's magnitude. Decoding adds
//! `k - 1` more roundings. A recovered row is therefore close to, but in general not bit-equal
//! to, the row that was lost; [`SumParityTracker`] keeps a rigorous running bound on that
//! error and [`measure_drift`] reports how far a seeded run actually drifts. The exact
//! alternative is [`Gf256Code`](crate::Gf256Code).
//!
//! Adam's step counter is a `u32` stored in a state word's bits; the sum code adds it as the
//! tiny subnormal float those bits spell. Subnormal sums are exact, so the counter survives
//! while the stripe's total stays below 2^23 steps, but this is luck of the encoding, not a
//! design: prefer the exact code with Adam.

use ftrec_core::rng::SplitMix;
use ftrec_core::{Optimizer, RowLayout, TableId};

use crate::code::check_len;
use crate::EcError;

/// The float-sum code with `k` data rows and one parity per stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumCode {
    k: usize,
}

impl SumCode {
    /// `k >= 1` data rows, `r` must be 1: a sum carries one equation, so it rebuilds one row.
    pub fn new(k: usize, r: usize) -> Result<Self, EcError> {
        if k == 0 {
            return Err(EcError::InvalidParameters(
                "the sum code needs k >= 1 data rows per stripe".into(),
            ));
        }
        if r != 1 {
            return Err(EcError::InvalidParameters(format!(
                "the sum code has exactly one parity per stripe (r = 1), asked for r = {r}; \
                 use the gf256 code for r >= 2"
            )));
        }
        Ok(SumCode { k })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// `parity = data[0] + data[1] + ...`, summed in position order.
    pub fn encode(&self, data: &[&[f32]], parity: &mut [f32]) -> Result<(), EcError> {
        check_len("data rows of a stripe", self.k, data.len())?;
        for row in data {
            check_len("data row", parity.len(), row.len())?;
        }
        parity.copy_from_slice(data[0]);
        for row in &data[1..] {
            for (p, v) in parity.iter_mut().zip(row.iter()) {
                *p += v;
            }
        }
        Ok(())
    }

    /// The difference a data server sends to the parity holder: `new - old`.
    pub fn delta(&self, old: &[f32], new: &[f32], out: &mut [f32]) -> Result<(), EcError> {
        check_len("new row", old.len(), new.len())?;
        check_len("delta", old.len(), out.len())?;
        for ((d, o), n) in out.iter_mut().zip(old).zip(new) {
            *d = n - o;
        }
        Ok(())
    }

    /// `parity += delta` (ECRec §3.2.1, difference propagation).
    pub fn apply_delta(&self, delta: &[f32], parity: &mut [f32]) -> Result<(), EcError> {
        check_len("delta", parity.len(), delta.len())?;
        for (p, d) in parity.iter_mut().zip(delta) {
            *p += d;
        }
        Ok(())
    }

    /// [`SumCode::delta`] then [`SumCode::apply_delta`] without a temporary; the same bits.
    pub fn update_parity(
        &self,
        old: &[f32],
        new: &[f32],
        parity: &mut [f32],
    ) -> Result<(), EcError> {
        check_len("old row", parity.len(), old.len())?;
        check_len("new row", parity.len(), new.len())?;
        for ((p, o), n) in parity.iter_mut().zip(old).zip(new) {
            *p += n - o;
        }
        Ok(())
    }
}

/// Largest relative rounding error of one f32 addition, rounded up generously: with unit
/// roundoff `u = 2^-24`, `|fl(a + b) - (a + b)| <= u |a + b| <= u / (1 - u) |fl(a + b)|`, and
/// `u / (1 - u) < 2^-23`. Gradual underflow keeps this relative bound valid for subnormals.
const ROUNDING: f64 = 1.0 / (1u64 << 23) as f64;

/// One stripe of the sum code kept up to date by difference propagation, with the exact
/// bookkeeping needed to bound its error.
///
/// It holds the `k` true rows, the parity as the servers would hold it (encoded once, then
/// moved only by deltas) and, per word, a bound on `|parity - exact sum of the rows|` that
/// grows by `2^-23 (|delta| + |parity|)` per update (see the module docs).
#[derive(Debug, Clone)]
pub struct SumParityTracker {
    code: SumCode,
    rows: Vec<Vec<f32>>,
    parity: Vec<f32>,
    bound: Vec<f64>,
    updates: u64,
}

/// Errors of a [`SumParityTracker`] stripe at one moment (all absolute, max over words).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftSnapshot {
    /// Difference propagations applied so far.
    pub updates: u64,
    /// A row recovered from the propagated parity vs the true row.
    pub recovered_vs_true: f64,
    /// A row recovered from a freshly encoded parity vs the true row: the decoding error alone.
    pub fresh_recovered_vs_true: f64,
    /// A row recovered from the propagated parity vs the same row recovered from a fresh one.
    pub recovered_vs_fresh_recovered: f64,
    /// The propagated parity vs a freshly encoded one.
    pub parity_vs_fresh: f64,
    /// Words whose bits differ between the propagated and the fresh parity.
    pub parity_words_differing: usize,
    /// Largest `|word|` of any row, to read the errors against.
    pub row_magnitude: f64,
    /// Largest per-word bound on the recovery error (rounding analysis in the module docs).
    pub bound: f64,
    /// Every word of every recovered row is within its own bound.
    pub within_bound: bool,
}

impl SumParityTracker {
    /// A stripe over `rows` (`k` rows of equal length), encoded fresh.
    pub fn new(code: SumCode, rows: Vec<Vec<f32>>) -> Result<Self, EcError> {
        check_len("rows of a stripe", code.k(), rows.len())?;
        let width = rows[0].len();
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let mut parity = vec![0.0; width];
        code.encode(&refs, &mut parity)?;
        let bound = encode_error_bound(&refs);
        Ok(SumParityTracker {
            code,
            rows,
            parity,
            bound,
            updates: 0,
        })
    }

    pub fn rows(&self) -> &[Vec<f32>] {
        &self.rows
    }

    pub fn parity(&self) -> &[f32] {
        &self.parity
    }

    /// Replace row `position` by `new`, propagating the difference to the parity.
    pub fn update(&mut self, position: usize, new: &[f32]) -> Result<(), EcError> {
        if position >= self.rows.len() {
            return Err(EcError::PositionOutOfRange {
                position,
                width: self.rows.len(),
            });
        }
        check_len("new row", self.parity.len(), new.len())?;
        let old = &self.rows[position];
        for (((p, b), o), n) in self
            .parity
            .iter_mut()
            .zip(self.bound.iter_mut())
            .zip(old)
            .zip(new)
        {
            let d = n - o;
            *p += d;
            *b += ROUNDING * (f64::from(d.abs()) + f64::from(p.abs()));
        }
        self.rows[position].copy_from_slice(new);
        self.updates += 1;
        Ok(())
    }

    /// Decode every row from the propagated parity and from a fresh one and compare.
    pub fn snapshot(&self) -> DriftSnapshot {
        let refs: Vec<&[f32]> = self.rows.iter().map(|r| r.as_slice()).collect();
        let mut fresh = vec![0.0; self.parity.len()];
        self.code
            .encode(&refs, &mut fresh)
            .expect("the tracker's rows have the code's shape");
        let mut snap = DriftSnapshot {
            updates: self.updates,
            recovered_vs_true: 0.0,
            fresh_recovered_vs_true: 0.0,
            recovered_vs_fresh_recovered: 0.0,
            parity_vs_fresh: 0.0,
            parity_words_differing: 0,
            row_magnitude: 0.0,
            bound: 0.0,
            within_bound: true,
        };
        for (p, f) in self.parity.iter().zip(&fresh) {
            snap.parity_vs_fresh = snap.parity_vs_fresh.max(f64::from((p - f).abs()));
            snap.parity_words_differing += usize::from(p.to_bits() != f.to_bits());
        }
        for lost in 0..self.rows.len() {
            for w in 0..self.parity.len() {
                // Same order of operations as the code's decoder: parity minus the others in
                // ascending position order.
                let mut x = self.parity[w];
                let mut y = fresh[w];
                let mut steps = 0.0f64;
                for (j, row) in self.rows.iter().enumerate() {
                    if j != lost {
                        x -= row[w];
                        y -= row[w];
                        steps += f64::from(x.abs());
                    }
                }
                let truth = self.rows[lost][w];
                snap.row_magnitude = snap.row_magnitude.max(f64::from(truth.abs()));
                let err = f64::from((x - truth).abs());
                let bound = self.bound[w] + ROUNDING * steps;
                snap.within_bound &= err <= bound;
                snap.recovered_vs_true = snap.recovered_vs_true.max(err);
                snap.recovered_vs_fresh_recovered = snap
                    .recovered_vs_fresh_recovered
                    .max(f64::from((x - y).abs()));
                snap.fresh_recovered_vs_true = snap
                    .fresh_recovered_vs_true
                    .max(f64::from((y - truth).abs()));
                snap.bound = snap.bound.max(bound);
            }
        }
        snap
    }
}

/// Per-word bound on the rounding error of a sequential sum of `rows`.
fn encode_error_bound(rows: &[&[f32]]) -> Vec<f64> {
    let width = rows[0].len();
    (0..width)
        .map(|w| {
            let mut acc = rows[0][w];
            let mut bound = 0.0;
            for row in &rows[1..] {
                acc += row[w];
                bound += ROUNDING * f64::from(acc.abs());
            }
            bound
        })
        .collect()
}

/// A seeded drift experiment: `k` rows trained by `optimizer` with random gradients, the
/// parity kept by difference propagation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftConfig {
    pub k: usize,
    pub dim: usize,
    pub optimizer: Optimizer,
    /// Row updates (each picks a row of the stripe at random and applies one optimizer step).
    pub updates: u64,
    pub seed: u64,
    /// Initial values uniform in `[-init_scale, init_scale)`.
    pub init_scale: f32,
    /// Gradient entries are normal with this standard deviation.
    pub grad_scale: f32,
    /// Take a [`DriftSnapshot`] every this many updates (and at the end); 0 = only at the end.
    pub check_every: u64,
}

/// Outcome of [`measure_drift`].
#[derive(Debug, Clone, PartialEq)]
pub struct DriftReport {
    /// State after the last update.
    pub last: DriftSnapshot,
    /// Largest `recovered_vs_true` seen at any snapshot.
    pub max_recovered_vs_true: f64,
    /// Largest `parity_vs_fresh` seen at any snapshot.
    pub max_parity_vs_fresh: f64,
    /// Every snapshot taken, in order.
    pub snapshots: Vec<DriftSnapshot>,
}

/// Run `cfg.updates` seeded row updates through difference propagation and report how far a
/// row decoded from the propagated parity is from the true row (and from a fresh encode).
pub fn measure_drift(cfg: &DriftConfig) -> Result<DriftReport, EcError> {
    cfg.optimizer
        .validate()
        .map_err(|e| EcError::InvalidParameters(format!("drift experiment: {e}")))?;
    if cfg.dim == 0 {
        return Err(EcError::InvalidParameters(
            "drift experiment needs dim >= 1".into(),
        ));
    }
    let code = SumCode::new(cfg.k, 1)?;
    let layout = RowLayout::new(cfg.dim, cfg.optimizer.state_words(cfg.dim));
    let rows: Vec<Vec<f32>> = (0..cfg.k as u64)
        .map(|i| {
            let mut row = vec![0.0; layout.words()];
            ftrec_core::table::init_row(
                cfg.seed,
                TableId(0),
                i,
                cfg.init_scale,
                &mut row[..cfg.dim],
            );
            row
        })
        .collect();
    let mut tracker = SumParityTracker::new(code, rows)?;
    let mut rng = SplitMix::keyed(cfg.seed, 0xD81F_7000, 0);
    let mut grad = vec![0.0f32; cfg.dim];
    let mut row = vec![0.0f32; layout.words()];
    let mut snapshots = Vec::new();
    for step in 1..=cfg.updates {
        let position = (rng.next_u64() % cfg.k as u64) as usize;
        for g in grad.iter_mut() {
            *g = (rng.next_normal() * f64::from(cfg.grad_scale)) as f32;
        }
        row.copy_from_slice(&tracker.rows()[position]);
        cfg.optimizer.apply(&mut row, cfg.dim, &grad);
        tracker.update(position, &row)?;
        if cfg.check_every > 0 && step % cfg.check_every == 0 && step != cfg.updates {
            snapshots.push(tracker.snapshot());
        }
    }
    let last = tracker.snapshot();
    snapshots.push(last);
    Ok(DriftReport {
        last,
        max_recovered_vs_true: snapshots
            .iter()
            .map(|s| s.recovered_vs_true)
            .fold(0.0, f64::max),
        max_parity_vs_fresh: snapshots
            .iter()
            .map(|s| s.parity_vs_fresh)
            .fold(0.0, f64::max),
        snapshots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_core::OptimizerKind;

    #[test]
    fn r_other_than_one_is_refused() {
        assert!(matches!(
            SumCode::new(3, 2),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            SumCode::new(0, 1),
            Err(EcError::InvalidParameters(_))
        ));
    }

    #[test]
    fn update_parity_equals_delta_then_apply() {
        let code = SumCode::new(2, 1).unwrap();
        let old = [0.1f32, -3.0, 1e-7];
        let new = [0.3f32, 2.5, -1e-7];
        let mut a = [10.0f32, 0.25, 7.0];
        let mut b = a;
        code.update_parity(&old, &new, &mut a).unwrap();
        let mut d = [0.0; 3];
        code.delta(&old, &new, &mut d).unwrap();
        code.apply_delta(&d, &mut b).unwrap();
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
    }

    // ECRec §3.2: the sum code is approximate; a long run must show drift, and stay bounded.
    #[test]
    fn momentum_run_drifts_within_the_bound() {
        let cfg = DriftConfig {
            k: 4,
            dim: 16,
            optimizer: Optimizer::new(OptimizerKind::Momentum, 0.05),
            updates: 20_000,
            seed: 11,
            init_scale: 0.05,
            grad_scale: 0.1,
            check_every: 1000,
        };
        let rep = measure_drift(&cfg).unwrap();
        assert_eq!(rep.snapshots.len(), 20);
        for s in &rep.snapshots {
            assert!(s.within_bound, "a word exceeds its bound: {s:?}");
            assert!(
                s.recovered_vs_true <= s.bound,
                "error {} exceeds bound {}",
                s.recovered_vs_true,
                s.bound
            );
        }
        assert!(
            rep.last.parity_words_differing > 0,
            "propagated parity kept fresh bits"
        );
        assert!(
            rep.max_recovered_vs_true > 0.0,
            "no drift at all over 20k updates"
        );
        // Same seed, same run.
        assert_eq!(measure_drift(&cfg).unwrap(), rep);
    }

    #[test]
    fn bad_drift_config_is_an_error() {
        let mut cfg = DriftConfig {
            k: 2,
            dim: 4,
            optimizer: Optimizer::new(OptimizerKind::Sgd, 0.1),
            updates: 10,
            seed: 1,
            init_scale: 0.1,
            grad_scale: 0.1,
            check_every: 0,
        };
        cfg.optimizer.lr = -1.0;
        assert!(matches!(
            measure_drift(&cfg),
            Err(EcError::InvalidParameters(_))
        ));
        cfg.optimizer.lr = 0.1;
        cfg.k = 0;
        assert!(matches!(
            measure_drift(&cfg),
            Err(EcError::InvalidParameters(_))
        ));
    }
}

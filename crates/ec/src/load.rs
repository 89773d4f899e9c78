//! Per-server update load with and without coding (ECRec §4, §5.2 "Effect of ECRec on load
//! imbalance").
//!
//! Every update of a data row costs its owner one row update and, under difference
//! propagation, costs each of the row's `r` parity holders one more. ECRec §5.2 counts these
//! per server while training Criteo and reports the most- over least-loaded ratio: 2.28x
//! without coding, 1.64x with `k = 2` and 1.58x with `k = 4`, because the hot rows' parity
//! updates land on the other servers. [`update_load`] computes the same two ratios from any
//! access trace; [`ZipfTrace`] produces a seeded Criteo-like trace so a benchmark can print
//! them without the data crate.

use ftrec_core::rng::{hash3, SplitMix};
use ftrec_core::{RowId, TableId};

use crate::{EcError, StripeLayout};

/// Row updates each server performs over a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// Steps in the trace.
    pub steps: u64,
    /// Data-row updates per server (index = server id): the load without coding.
    pub data_updates: Vec<u64>,
    /// Parity updates (received deltas) per server.
    pub parity_updates: Vec<u64>,
}

impl LoadReport {
    /// Data plus parity updates per server: the load with coding.
    pub fn coded(&self) -> Vec<u64> {
        self.data_updates
            .iter()
            .zip(&self.parity_updates)
            .map(|(d, p)| d + p)
            .collect()
    }

    /// Most- over least-loaded server without coding (infinite if a server did nothing).
    pub fn uncoded_imbalance(&self) -> f64 {
        ratio(&self.data_updates)
    }

    /// Most- over least-loaded server with coding.
    pub fn coded_imbalance(&self) -> f64 {
        ratio(&self.coded())
    }

    /// Mean updates per step of `server`: (data, parity).
    pub fn per_step(&self, server: usize) -> (f64, f64) {
        let steps = self.steps.max(1) as f64;
        (
            self.data_updates.get(server).copied().unwrap_or(0) as f64 / steps,
            self.parity_updates.get(server).copied().unwrap_or(0) as f64 / steps,
        )
    }
}

fn ratio(load: &[u64]) -> f64 {
    let max = load.iter().copied().max().unwrap_or(0);
    let min = load.iter().copied().min().unwrap_or(0);
    if min == 0 {
        if max == 0 {
            1.0
        } else {
            f64::INFINITY
        }
    } else {
        max as f64 / min as f64
    }
}

/// Count the updates of a trace: each step lists the `(table, row)` pairs its batch touched.
///
/// A row listed several times in one step is updated once (the trainer sums its gradients
/// before the optimizer runs), so duplicates within a step count once.
pub fn update_load<I, S>(layout: &StripeLayout, steps: I) -> Result<LoadReport, EcError>
where
    I: IntoIterator<Item = S>,
    S: IntoIterator<Item = (TableId, RowId)>,
{
    let n = layout.servers() as usize;
    let map = layout.shard_map();
    let mut report = LoadReport {
        steps: 0,
        data_updates: vec![0; n],
        parity_updates: vec![0; n],
    };
    let mut rows: Vec<(TableId, RowId)> = Vec::new();
    for step in steps {
        rows.clear();
        rows.extend(step);
        rows.sort_unstable();
        rows.dedup();
        for &(table, row) in &rows {
            let (stripe, _) = layout.stripe_of(table, row)?;
            report.data_updates[map.owner(table, row).0 as usize] += 1;
            for j in 0..layout.r() {
                let (server, _) = layout.parity_holder(stripe, j)?;
                report.parity_updates[server.0 as usize] += 1;
            }
        }
        report.steps += 1;
    }
    Ok(report)
}

/// A seeded Criteo-like access trace: every sample looks up one row per table, ranks drawn
/// from a Zipf law over the table's rows, ranks scattered over row ids by a hash (as hashed
/// categorical ids are), so hot rows are not all on one server by construction.
#[derive(Debug, Clone)]
pub struct ZipfTrace {
    samplers: Vec<ZipfSampler>,
    table_rows: Vec<u64>,
    samples_per_step: usize,
    seed: u64,
}

impl ZipfTrace {
    /// Needs `exponent > 0`, every table non-empty and `samples_per_step >= 1`.
    pub fn new(
        table_rows: &[u64],
        exponent: f64,
        samples_per_step: usize,
        seed: u64,
    ) -> Result<Self, EcError> {
        if !(exponent.is_finite() && exponent > 0.0) {
            return Err(EcError::InvalidParameters(format!(
                "zipf exponent must be positive, got {exponent}"
            )));
        }
        if samples_per_step == 0 {
            return Err(EcError::InvalidParameters(
                "a trace step needs at least one sample".into(),
            ));
        }
        if let Some(t) = table_rows.iter().position(|&r| r == 0) {
            return Err(EcError::InvalidParameters(format!(
                "table {t} has no rows to access"
            )));
        }
        Ok(ZipfTrace {
            samplers: table_rows
                .iter()
                .map(|&rows| ZipfSampler::new(rows, exponent))
                .collect(),
            table_rows: table_rows.to_vec(),
            samples_per_step,
            seed,
        })
    }

    /// The rows step `step` touches (a pure function of the seed and the step).
    pub fn step(&self, step: u64) -> Vec<(TableId, RowId)> {
        let mut g = SplitMix::keyed(self.seed, 0x21FF_0000, step);
        let mut out = Vec::with_capacity(self.samples_per_step * self.samplers.len());
        for _ in 0..self.samples_per_step {
            for (t, sampler) in self.samplers.iter().enumerate() {
                let rank = sampler.sample(&mut g);
                let row = hash3(self.seed, t as u64, rank) % self.table_rows[t];
                out.push((TableId(t as u32), row));
            }
        }
        out
    }

    /// Steps `0..steps`.
    pub fn steps(&self, steps: u64) -> impl Iterator<Item = Vec<(TableId, RowId)>> + '_ {
        (0..steps).map(move |s| self.step(s))
    }
}

/// Zipf ranks `1..=n` with `P(x) ~ x^-s`, by rejection-inversion: invert the integral `H` of
/// the density `x^-s`, round to the nearest rank, and accept unless the point falls in the gap
/// between the continuous and the discrete mass. O(1) memory whatever `n`.
#[derive(Debug, Clone)]
struct ZipfSampler {
    n: u64,
    s: f64,
    h_lo: f64,
    h_hi: f64,
    squeeze: f64,
}

impl ZipfSampler {
    fn new(n: u64, s: f64) -> Self {
        let mut z = ZipfSampler {
            n,
            s,
            h_lo: 0.0,
            h_hi: 0.0,
            squeeze: 0.0,
        };
        z.h_lo = z.h(1.5) - 1.0;
        z.h_hi = z.h(n as f64 + 0.5);
        z.squeeze = 2.0 - z.h_inv(z.h(2.5) - 2f64.powf(-s));
        z
    }

    /// `H(x) = (x^(1-s) - 1) / (1 - s)`, `ln x` at `s = 1`, written to stay accurate near 1.
    fn h(&self, x: f64) -> f64 {
        let lx = x.ln();
        lx * expm1_over((1.0 - self.s) * lx)
    }

    fn h_inv(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.s)).max(-1.0);
        (y * ln1p_over(t)).exp()
    }

    fn sample(&self, g: &mut SplitMix) -> u64 {
        loop {
            let u = self.h_hi + g.next_f64() * (self.h_lo - self.h_hi);
            let x = self.h_inv(u);
            let k = x.round().clamp(1.0, self.n as f64);
            if k - x <= self.squeeze || u >= self.h(k + 0.5) - k.powf(-self.s) {
                return k as u64;
            }
        }
    }
}

/// `(e^t - 1) / t`, 1 at 0.
fn expm1_over(t: f64) -> f64 {
    if t.abs() > 1e-8 {
        t.exp_m1() / t
    } else {
        1.0 + t / 2.0
    }
}

/// `ln(1 + t) / t`, 1 at 0.
fn ln1p_over(t: f64) -> f64 {
    if t.abs() > 1e-8 {
        t.ln_1p() / t
    } else {
        1.0 - t / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_frequencies_follow_the_law() {
        for s in [0.8, 1.0, 1.2] {
            let z = ZipfSampler::new(1000, s);
            let mut g = SplitMix::new(3);
            let mut hist = vec![0u64; 1001];
            let draws = 200_000;
            for _ in 0..draws {
                let k = z.sample(&mut g);
                assert!((1..=1000).contains(&k));
                hist[k as usize] += 1;
            }
            let norm: f64 = (1..=1000).map(|x| (x as f64).powf(-s)).sum();
            for k in [1usize, 2, 5, 20] {
                let want = draws as f64 * (k as f64).powf(-s) / norm;
                let got = hist[k] as f64;
                assert!(
                    (got - want).abs() < 5.0 * want.sqrt() + 0.01 * want,
                    "s={s} k={k}: got {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn load_counts_data_and_parity_updates() {
        let layout = StripeLayout::new(4, 2, 1, &[8]).unwrap();
        // Row 3 twice in step 0 counts once; row 0 in step 1.
        let trace = vec![
            vec![(TableId(0), 3), (TableId(0), 3)],
            vec![(TableId(0), 0)],
        ];
        let rep = update_load(&layout, trace).unwrap();
        assert_eq!(rep.steps, 2);
        assert_eq!(rep.data_updates, vec![1, 0, 0, 1]);
        let mut want_parity = vec![0; 4];
        for row in [3, 0] {
            let p = layout.row_parities(TableId(0), row).unwrap();
            want_parity[p.parities[0].0 .0 as usize] += 1;
        }
        assert_eq!(rep.parity_updates, want_parity);
        assert_eq!(rep.parity_updates.iter().sum::<u64>(), 2);
        assert_eq!(rep.per_step(0), (0.5, want_parity[0] as f64 / 2.0));
        assert_eq!(rep.uncoded_imbalance(), f64::INFINITY);
        let bad = update_load(&layout, vec![vec![(TableId(1), 0)]]);
        assert!(matches!(bad, Err(EcError::UnknownTable { table: 1, .. })));
        let bad = update_load(&layout, vec![vec![(TableId(0), 8)]]);
        assert!(matches!(bad, Err(EcError::RowOutOfRange { row: 8, .. })));
    }

    // ECRec §5.2: coding spreads a hot server's extra load over the others. With a skewed
    // trace the coded ratio must not exceed the uncoded one.
    #[test]
    fn coding_evens_out_a_skewed_trace() {
        let tables = [3u64, 4, 10, 24, 583, 1460, 5000];
        let trace = ZipfTrace::new(&tables, 1.1, 256, 5).unwrap();
        let layout = StripeLayout::new(5, 2, 1, &tables).unwrap();
        let rep = update_load(&layout, trace.steps(20)).unwrap();
        let total_data: u64 = rep.data_updates.iter().sum();
        assert_eq!(rep.parity_updates.iter().sum::<u64>(), total_data);
        assert!(rep.uncoded_imbalance() > 1.0);
        assert!(
            rep.coded_imbalance() <= rep.uncoded_imbalance(),
            "coded {} vs uncoded {}",
            rep.coded_imbalance(),
            rep.uncoded_imbalance()
        );
        assert_eq!(trace.step(7), trace.step(7));
        assert_ne!(trace.step(7), trace.step(8));
    }

    #[test]
    fn bad_trace_parameters_are_errors() {
        assert!(matches!(
            ZipfTrace::new(&[10], 0.0, 1, 0),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            ZipfTrace::new(&[10, 0], 1.0, 1, 0),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            ZipfTrace::new(&[10], 1.0, 0, 0),
            Err(EcError::InvalidParameters(_))
        ));
    }
}

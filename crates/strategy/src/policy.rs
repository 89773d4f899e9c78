//! The policy math: when to save, what failures cost.
//!
//! All times are seconds. `t_fail` is the mean time between failures of the job (any server),
//! `o_save` / `o_load` / `o_res` the cost of one save, one load and one rescheduling.

use serde::{Deserialize, Serialize};

/// Young's first-order optimal checkpoint interval, `sqrt(2 * o_save * t_fail)`; it minimises
/// CPR Eq. 1 (CPR §2.2: `T_save,full = sqrt(2 O_save T_fail)`).
pub fn young_interval(o_save: f64, t_fail: f64) -> f64 {
    (2.0 * o_save.max(0.0) * t_fail.max(0.0)).sqrt()
}

/// The terms of CPR Eq. 1 / Eq. 2, each the total seconds over a run of `t_total` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverheadTerms {
    /// `O_save * T_total / T_save`.
    pub save: f64,
    /// `O_load * T_total / T_fail`.
    pub load: f64,
    /// Lost computation, `T_save / 2 * T_total / T_fail` (zero under partial recovery).
    pub lost: f64,
    /// `O_res * T_total / T_fail`.
    pub res: f64,
}

impl OverheadTerms {
    pub fn total(&self) -> f64 {
        self.save + self.load + self.lost + self.res
    }
}

/// CPR Eq. 1: expected overhead of full recovery with saves every `t_save`.
pub fn full_recovery_overhead(
    o_save: f64,
    o_load: f64,
    o_res: f64,
    t_save: f64,
    t_fail: f64,
    t_total: f64,
) -> OverheadTerms {
    let failures = t_total / t_fail;
    OverheadTerms {
        save: o_save * t_total / t_save,
        load: o_load * failures,
        lost: t_save / 2.0 * failures,
        res: o_res * failures,
    }
}

/// CPR Eq. 2: partial recovery loses no computation (only the failed shard rolls back).
pub fn partial_recovery_overhead(
    o_save: f64,
    o_load: f64,
    o_res: f64,
    t_save: f64,
    t_fail: f64,
    t_total: f64,
) -> OverheadTerms {
    OverheadTerms {
        lost: 0.0,
        ..full_recovery_overhead(o_save, o_load, o_res, t_save, t_fail, t_total)
    }
}

/// CPR Eq. 4: expected portion of lost samples, `0.5 T_save / (T_fail N_emb)`, with `n_emb`
/// embedding servers.
pub fn expected_pls(t_save: f64, t_fail: f64, n_emb: u32) -> f64 {
    0.5 * t_save / (t_fail * n_emb as f64)
}

/// Eq. 4 solved for the interval: `T_save,part = 2 PLS N_emb T_fail` (CPR §3).
pub fn interval_for_pls(pls: f64, t_fail: f64, n_emb: u32) -> f64 {
    2.0 * pls * n_emb as f64 * t_fail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn young_minimises_eq1() {
        let (o_save, o_load, o_res, t_fail, t_total) =
            (30.0, 60.0, 20.0, 3600.0 * 8.0, 3600.0 * 100.0);
        let best = young_interval(o_save, t_fail);
        let cost = |t| full_recovery_overhead(o_save, o_load, o_res, t, t_fail, t_total).total();
        for factor in [0.5, 0.8, 0.95, 1.05, 1.25, 2.0] {
            assert!(
                cost(best) < cost(best * factor),
                "interval x{factor} beats Young's"
            );
        }
    }

    #[test]
    fn eq1_terms_by_hand() {
        // 10 saves of 2 s; 4 failures costing 3 s load, 1 s rescheduling and 50 s lost each.
        let t = full_recovery_overhead(2.0, 3.0, 1.0, 100.0, 250.0, 1000.0);
        assert_eq!(
            t,
            OverheadTerms {
                save: 20.0,
                load: 12.0,
                lost: 200.0,
                res: 4.0
            }
        );
        let p = partial_recovery_overhead(2.0, 3.0, 1.0, 100.0, 250.0, 1000.0);
        assert_eq!(p.lost, 0.0);
        assert_eq!(p.total(), 36.0);
    }

    #[test]
    fn pls_interval_inverts_eq4() {
        let t = interval_for_pls(0.02, 28_800.0, 8);
        assert!((expected_pls(t, 28_800.0, 8) - 0.02).abs() < 1e-12);
    }
}

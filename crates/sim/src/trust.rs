//! Whether a calibration can speak for the cluster it is asked about.
//!
//! The extrapolation of [`crate::model`] prices what moves bytes at the throughput a run showed
//! over the machine's raw bandwidth. That holds only when the calibration's runs were long
//! enough for their fixed costs (process start, connection set-up, the first save) to be a small
//! part of them, and when the model asked about is not so much larger that per-byte costs
//! measured on a few MiB say nothing about it. [`assess`] checks both and, when either fails,
//! names a preset to calibrate on instead; it never changes a figure.

use serde::{Deserialize, Serialize};

use crate::model::{bytes, secs, Calibration, Scenario};

/// A calibration whose reference run trained for less than this is too short: its fixed costs
/// are a large part of every figure it gives.
pub const MIN_CALIBRATION_TRAIN_S: f64 = 10.0;

/// The advised model may be at most this many times the calibration's.
pub const MAX_SCALE: f64 = 1_000.0;

/// Predicted overhead above which a strategy costs more than the training itself.
pub const ABSURD_OVERHEAD: f64 = 1.0;

/// A preset one can calibrate on: its name, model bytes (values and optimizer state), and a
/// `compare` command whose reference run lasts long enough on a small machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub preset: String,
    pub model_bytes: f64,
    pub command: String,
}

/// What [`assess`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trust {
    /// Every reason the calibration cannot be extrapolated to the scenario (empty: it can).
    pub reasons: Vec<String>,
    /// Where the reasons hold: the smallest candidate within [`MAX_SCALE`] of the scenario's
    /// model (else the largest one).
    pub calibrate_instead: Option<Candidate>,
}

impl Trust {
    pub fn trusted(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// Check `cal` (whose reference run trained `reference_train_s`) against `s`; `candidates`
/// are the presets to suggest, smallest model first.
pub fn assess(
    cal: &Calibration,
    reference_train_s: f64,
    s: &Scenario,
    candidates: &[Candidate],
) -> Trust {
    let mut t = Trust::default();
    let cal_bytes = cal
        .strategies
        .iter()
        .map(|c| c.model_bytes)
        .fold(0.0f64, f64::max);
    if reference_train_s < MIN_CALIBRATION_TRAIN_S {
        t.reasons.push(format!(
            "its runs are too short: the reference trained {} (at least {} needed, or process \
             start, connection set-up and the first save dominate every figure)",
            secs(reference_train_s),
            secs(MIN_CALIBRATION_TRAIN_S)
        ));
    }
    let scale = s.model_bytes / cal_bytes.max(1.0);
    if scale > MAX_SCALE {
        t.reasons.push(format!(
            "the model asked about ({}) is {scale:.0}x the calibration's ({}), more than the \
             {MAX_SCALE:.0}x this advisor extrapolates",
            bytes(s.model_bytes),
            bytes(cal_bytes)
        ));
    }
    if !t.trusted() {
        t.calibrate_instead = candidates
            .iter()
            .find(|c| c.model_bytes * MAX_SCALE >= s.model_bytes && c.model_bytes > cal_bytes)
            .or_else(|| candidates.iter().rev().find(|c| c.model_bytes > cal_bytes))
            .or(candidates.last())
            .cloned();
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Coefficients, Machine, Mechanism};
    use crate::FailureDist;

    fn cal(model_bytes: f64) -> Calibration {
        Calibration {
            machine: Machine {
                disk_write_bps: 1e9,
                disk_read_bps: 1e9,
                net_bps: 1e9,
            },
            strategies: vec![Coefficients {
                strategy: "full".into(),
                mechanism: Mechanism::Full,
                steady: 0.0,
                steady_raw: 0.0,
                save_eff: Some(0.1),
                delta_eff: None,
                save_fixed_s: 0.0,
                touched_per_step: None,
                detect_s: Some(0.05),
                replace_s: Some(0.1),
                reload_eff: Some(0.1),
                reload_fixed_s: None,
                rebuild_eff: None,
                rebuild_rate: None,
                degraded_share: None,
                code: None,
                extra_memory: 0.0,
                stored_fraction: 1.0,
                model_bytes,
                servers: 3,
                workers: 2,
                save_every_steps: Some(10),
                step_s: 0.4,
            }],
            dropped: Vec::new(),
        }
    }

    fn scenario(model_bytes: f64) -> Scenario {
        Scenario {
            model_bytes,
            servers: 100,
            workers: 100,
            step_s: 0.2,
            mtbf_server_s: 86_400.0,
            dist: FailureDist::Exponential,
            disk_bps: 2e9,
            net_bps: 3e9,
            memory_headroom: 0.5,
            reschedule_s: None,
            touched_per_step: None,
            target_pls: 0.1,
            days: 1.0,
            replicas: 1,
            seed: 1,
        }
    }

    fn candidates() -> Vec<Candidate> {
        [("tiny", 1e6), ("small", 7e7), ("kaggle", 2.3e9)]
            .iter()
            .map(|(n, b)| Candidate {
                preset: n.to_string(),
                model_bytes: *b,
                command: format!("ftrec compare --preset {n}"),
            })
            .collect()
    }

    #[test]
    fn a_short_run_of_a_small_model_is_not_trusted_and_names_a_preset_large_enough() {
        let t = assess(&cal(1e6), 2.4, &scenario(1e12), &candidates());
        assert!(!t.trusted());
        assert_eq!(t.reasons.len(), 2, "{t:?}");
        assert!(t.reasons[0].contains("too short"), "{t:?}");
        assert!(t.reasons[1].contains("1000000x"), "{t:?}");
        assert_eq!(t.calibrate_instead.unwrap().preset, "kaggle");
        // A 10 GB model is within 1000x of small's.
        let t = assess(&cal(1e6), 2.4, &scenario(1e10), &candidates());
        assert_eq!(t.calibrate_instead.unwrap().preset, "small");
    }

    #[test]
    fn a_long_run_within_the_scale_is_trusted() {
        let t = assess(&cal(7e7), 27.0, &scenario(5e10), &candidates());
        assert!(t.trusted(), "{t:?}");
        assert!(t.calibrate_instead.is_none());
        // The same calibration asked about 1 TB: the scale alone fails.
        let t = assess(&cal(7e7), 27.0, &scenario(1e12), &candidates());
        assert_eq!(t.reasons.len(), 1, "{t:?}");
        assert_eq!(t.calibrate_instead.unwrap().preset, "kaggle");
    }
}

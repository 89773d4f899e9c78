//! What one run's step timeline says beyond its total training time: the steady step time
//! (warm-up and every failure's window left out), the start-up cost apart from it, and the
//! throughput smoothed over a named window with the failures and recoveries marked.
//!
//! Pure functions of a [`RunReport`]: `compare` puts their results into its summary (and so
//! into `report.json`), the plots draw them, and nothing here runs anything.

use ftrec_cluster::{Role, RunReport};
use serde::{Deserialize, Serialize};

use crate::compare::CompareReport;

/// Steps at the start of a run that are warm-up (connections, first pulls, allocation): a
/// tenth of the run, at least 5.
pub fn warmup_steps(steps: u64) -> u64 {
    (steps / 10).max(5).min(steps.saturating_sub(1))
}

/// A run's steady state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Steady {
    /// Mean seconds per step over the steady steps (the saves among them included: they are
    /// the strategy's steady cost).
    pub step_s: f64,
    /// Steps the mean is over.
    pub steps: u64,
    /// Warm-up steps left out at the start.
    pub warmup_steps: u64,
    /// Seconds from the run's start to the end of its warm-up beyond what those steps cost at
    /// the steady rate: process start, connection set-up, the first pulls.
    pub startup_s: f64,
}

/// Seconds after the run's start during which a failure disturbed training: from each kill to
/// the state being whole again (to the end of the run if it never was).
pub fn failure_windows(r: &RunReport) -> Vec<(f64, f64)> {
    let end = r.timeline.last().map_or(f64::INFINITY, |p| p.t_s);
    r.failures
        .iter()
        .map(|f| {
            let until = f
                .recovered_s
                .or(f.resumed_s)
                .map_or(end, |d| f.injected_t_s + d);
            (f.injected_t_s, until.max(f.injected_t_s))
        })
        .collect()
}

/// The steady state of `r`: every step after the warm-up that follows the one before it
/// (nothing redone) and whose time touches no failure window. `None` with fewer than 10.
pub fn steady(r: &RunReport) -> Option<Steady> {
    let warm = warmup_steps(r.steps);
    let windows = failure_windows(r);
    let (mut sum, mut n) = (0.0, 0u64);
    for w in r.timeline.windows(2) {
        let (a, b) = (w[0], w[1]);
        let disturbed = windows.iter().any(|&(s, e)| a.t_s < e && b.t_s > s);
        if b.step == a.step + 1 && a.step >= warm && !disturbed {
            sum += b.t_s - a.t_s;
            n += 1;
        }
    }
    if n < 10 {
        return None;
    }
    let step_s = sum / n as f64;
    let end_of_warmup = r
        .timeline
        .iter()
        .find(|p| p.step == warm)
        .map_or(0.0, |p| p.t_s);
    Some(Steady {
        step_s,
        steps: n,
        warmup_steps: warm,
        startup_s: (end_of_warmup - warm as f64 * step_s).max(0.0),
    })
}

/// Mean and half-width of its 95% interval (Student's t); the half-width is `None` for one
/// value.
pub fn mean_ci95(v: &[f64]) -> Option<(f64, Option<f64>)> {
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return Some((mean, None));
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom, then normal.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(v.len() - 2).copied().unwrap_or(1.96);
    Some((mean, Some(t * (var / n).sqrt())))
}

/// What a mark on the throughput plot stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A server was SIGKILLed.
    Kill,
    /// The state is whole again: lost steps redone, or the rebuild finished.
    Recovered,
}

/// One mark, in seconds since training started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    pub t_s: f64,
    pub kind: MarkKind,
    pub server: u32,
}

/// Samples per second, each point the mean over a sliding window of `window_s` centred on it,
/// in seconds since training started; redone steps count (they are work done).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Smoothed {
    pub window_s: f64,
    /// `(seconds since training started, samples/s)`.
    pub points: Vec<(f64, f64)>,
    pub marks: Vec<Mark>,
}

/// The smoothing window every run of a report shares: ten of the reference's mean steps (a
/// failure's stall of a few steps still shows), at least 50 ms.
pub fn smoothing_window(rep: &CompareReport) -> f64 {
    let step = rep
        .reference()
        .map(|r| r.train_s / r.steps.max(1) as f64)
        .unwrap_or(0.01);
    (10.0 * step).max(0.05)
}

/// `r`'s throughput over a sliding window of `window_s`, sampled every quarter window, and its
/// kills and recoveries.
pub fn smoothed(r: &RunReport, window_s: f64) -> Smoothed {
    let t0 = CompareReport::training_start(r);
    let times: Vec<f64> = r.timeline.iter().map(|p| (p.t_s - t0).max(0.0)).collect();
    let per_step = r.config.workers as f64 * r.config.batch as f64;
    let end = times.last().copied().unwrap_or(0.0);
    let mut points = Vec::new();
    let half = window_s / 2.0;
    let mut t = half;
    // Two cursors over the sorted completion times: the window's first and one past its last.
    let (mut lo, mut hi) = (0usize, 0usize);
    while t + half <= end + 1e-9 {
        while hi < times.len() && times[hi] <= t + half {
            hi += 1;
        }
        while lo < hi && times[lo] <= t - half {
            lo += 1;
        }
        points.push((t, (hi - lo) as f64 * per_step / window_s));
        t += window_s / 4.0;
    }
    let mut marks = Vec::new();
    for f in r.failures.iter().filter(|f| f.role == Role::Server) {
        marks.push(Mark {
            t_s: f.injected_t_s - t0,
            kind: MarkKind::Kill,
            server: f.id,
        });
        if let Some(d) = f.recovered_s {
            marks.push(Mark {
                t_s: f.injected_t_s + d - t0,
                kind: MarkKind::Recovered,
                server: f.id,
            });
        }
    }
    Smoothed {
        window_s,
        points,
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_95_percent_interval_uses_student_s_t() {
        let (m, h) = mean_ci95(&[1.0, 2.0, 3.0]).unwrap();
        assert!((m - 2.0).abs() < 1e-12);
        // s = 1, n = 3: 4.303 / sqrt(3).
        assert!((h.unwrap() - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert_eq!(mean_ci95(&[5.0]), Some((5.0, None)));
        assert_eq!(mean_ci95(&[]), None);
    }

    #[test]
    fn warm_up_is_a_tenth_of_the_run_and_at_least_five_steps() {
        assert_eq!(warmup_steps(240), 24);
        assert_eq!(warmup_steps(20), 5);
        assert_eq!(warmup_steps(3), 2);
    }
}

//! Failure processes: seeded inter-failure times, one renewal process per server.
//!
//! CPR §3.1 fits production time-to-failure with a gamma distribution and notes a near-constant
//! failure probability after the start; exponential (memoryless, what CPR Eq. 1 and Young's
//! interval assume) and Weibull (shape < 1: infant mortality, > 1: wear-out) are the usual
//! alternatives. Every distribution here is parameterised by its mean, so a change of shape keeps
//! the failure rate and changes only the clustering of failures.

use ftrec_core::rng::SplitMix;
use serde::{Deserialize, Serialize};

use crate::SimError;

/// Shape of the time between two failures of one server.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureDist {
    /// Memoryless: a constant failure rate.
    Exponential,
    /// Weibull with shape `k` (1 is exponential).
    Weibull { shape: f64 },
    /// Gamma with shape `k` (1 is exponential); the fit of CPR §3.1.
    Gamma { shape: f64 },
}

impl FailureDist {
    pub fn validate(&self) -> Result<(), SimError> {
        match *self {
            FailureDist::Exponential => Ok(()),
            FailureDist::Weibull { shape } | FailureDist::Gamma { shape } => {
                if shape.is_finite() && (0.05..=50.0).contains(&shape) {
                    Ok(())
                } else {
                    Err(SimError::Invalid(format!(
                        "failure distribution shape {shape} must be between 0.05 and 50"
                    )))
                }
            }
        }
    }

    /// One inter-failure time with mean `mean` seconds.
    pub fn sample(&self, mean: f64, rng: &mut SplitMix) -> f64 {
        match *self {
            // 1 - U is in (0, 1]: its logarithm is finite.
            FailureDist::Exponential => -mean * (1.0 - rng.next_f64()).ln(),
            FailureDist::Weibull { shape } => {
                let scale = mean / gamma_fn(1.0 + 1.0 / shape);
                scale * (-(1.0 - rng.next_f64()).ln()).powf(1.0 / shape)
            }
            FailureDist::Gamma { shape } => mean / shape * sample_gamma(shape, rng),
        }
    }
}

/// Gamma(shape, 1) by Marsaglia and Tsang (shape < 1 through the boost `U^(1/shape)`).
fn sample_gamma(shape: f64, rng: &mut SplitMix) -> f64 {
    if shape < 1.0 {
        let u = 1.0 - rng.next_f64();
        return sample_gamma(shape + 1.0, rng) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = rng.next_normal();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// The gamma function for positive arguments (Lanczos, g = 7, 9 terms; relative error ~1e-15).
pub fn gamma_fn(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma_fn(1.0 - x));
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}

/// One failure: server `server` fails `t_s` seconds after the start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub t_s: f64,
    pub server: u32,
}

/// Independent per-server renewal processes: each server fails after a time drawn from `dist`
/// with mean `mtbf_server_s`, is replaced at once and its replacement draws a fresh lifetime. The
/// job sees the superposition (rate `servers / mtbf_server_s`, CPR §6.6's independent-node
/// model).
#[derive(Debug, Clone)]
pub struct FailureProcess {
    dist: FailureDist,
    mtbf_server_s: f64,
    rng: SplitMix,
    /// Next failure time of every server.
    next: Vec<f64>,
}

impl FailureProcess {
    pub fn new(
        dist: FailureDist,
        mtbf_server_s: f64,
        servers: u32,
        seed: u64,
    ) -> Result<Self, SimError> {
        dist.validate()?;
        if !(mtbf_server_s.is_finite() && mtbf_server_s > 0.0) {
            return Err(SimError::Invalid(format!(
                "the mean time between failures {mtbf_server_s} s must be positive"
            )));
        }
        if servers == 0 {
            return Err(SimError::Invalid(
                "a cluster needs at least one server".into(),
            ));
        }
        let mut rng = SplitMix::new(ftrec_core::rng::hash3(seed, 0x6661_696c, servers as u64));
        let next = (0..servers)
            .map(|_| dist.sample(mtbf_server_s, &mut rng))
            .collect();
        Ok(FailureProcess {
            dist,
            mtbf_server_s,
            rng,
            next,
        })
    }

    /// The next failure of any server, and the draw of that server's replacement's lifetime.
    pub fn next_failure(&mut self) -> Failure {
        let (server, &t_s) = self
            .next
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one server");
        self.next[server] = t_s + self.dist.sample(self.mtbf_server_s, &mut self.rng);
        Failure {
            t_s,
            server: server as u32,
        }
    }
}

/// A reproducible schedule: the first `max` failures of a job of `servers` servers whose job-level
/// mean time between failures (any server) is `mtbf_job_s`, each server failing independently
/// with mean `mtbf_job_s * servers`. The same arguments always give the same schedule.
pub fn draw_schedule(
    dist: FailureDist,
    mtbf_job_s: f64,
    servers: u32,
    seed: u64,
    max: usize,
) -> Result<Vec<Failure>, SimError> {
    let mut p = FailureProcess::new(dist, mtbf_job_s * servers as f64, servers, seed)?;
    Ok((0..max).map(|_| p.next_failure()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_function_matches_known_values() {
        for (x, want) in [
            (1.0, 1.0),
            (2.0, 1.0),
            (5.0, 24.0),
            (0.5, std::f64::consts::PI.sqrt()),
            (1.5, std::f64::consts::PI.sqrt() / 2.0),
        ] {
            let got = gamma_fn(x);
            assert!((got - want).abs() < 1e-12 * want.max(1.0), "{x}: {got}");
        }
    }

    /// Every distribution keeps the mean it is given (the law of large numbers on 200k draws,
    /// seeded: the check is deterministic).
    #[test]
    fn sample_means_match_the_requested_mean() {
        for dist in [
            FailureDist::Exponential,
            FailureDist::Weibull { shape: 0.7 },
            FailureDist::Weibull { shape: 2.0 },
            FailureDist::Gamma { shape: 0.5 },
            FailureDist::Gamma { shape: 3.0 },
        ] {
            let mut rng = SplitMix::new(7);
            let n = 200_000;
            let mean = (0..n).map(|_| dist.sample(10.0, &mut rng)).sum::<f64>() / n as f64;
            assert!((mean - 10.0).abs() < 0.15, "{dist:?}: mean {mean}");
        }
    }

    /// Exponential: the variance is the mean squared; Weibull shape 2: Var = s^2 (1 - pi/4).
    #[test]
    fn variances_match_closed_forms() {
        let var = |dist: FailureDist| {
            let mut rng = SplitMix::new(3);
            let xs: Vec<f64> = (0..200_000).map(|_| dist.sample(1.0, &mut rng)).collect();
            let m = xs.iter().sum::<f64>() / xs.len() as f64;
            xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64
        };
        assert!((var(FailureDist::Exponential) - 1.0).abs() < 0.03);
        let scale = 1.0 / gamma_fn(1.5);
        let want = scale * scale * (1.0 - std::f64::consts::PI / 4.0);
        assert!((var(FailureDist::Weibull { shape: 2.0 }) - want).abs() < 0.01);
        // Gamma shape 4, mean 1: Var = 1/4.
        assert!((var(FailureDist::Gamma { shape: 4.0 }) - 0.25).abs() < 0.01);
    }

    /// N servers with per-server MTBF M fail about H * N / M times in H seconds, for any shape
    /// (the renewal theorem: the long-run rate is 1 / mean).
    #[test]
    fn failure_count_matches_the_renewal_rate() {
        for dist in [
            FailureDist::Exponential,
            FailureDist::Weibull { shape: 0.7 },
            FailureDist::Gamma { shape: 2.0 },
        ] {
            let (servers, mtbf, horizon) = (50u32, 1000.0, 2_000_000.0);
            let mut p = FailureProcess::new(dist, mtbf, servers, 11).unwrap();
            let mut n = 0u64;
            while p.next_failure().t_s < horizon {
                n += 1;
            }
            let want = horizon * servers as f64 / mtbf;
            assert!(
                (n as f64 - want).abs() < 0.02 * want,
                "{dist:?}: {n} failures, expected {want}"
            );
        }
    }

    #[test]
    fn schedules_repeat_for_a_seed_and_are_ordered() {
        let a = draw_schedule(FailureDist::Exponential, 5.0, 3, 42, 10).unwrap();
        let b = draw_schedule(FailureDist::Exponential, 5.0, 3, 42, 10).unwrap();
        let c = draw_schedule(FailureDist::Exponential, 5.0, 3, 43, 10).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.windows(2).all(|w| w[0].t_s <= w[1].t_s));
        assert!(a.iter().all(|f| f.server < 3));
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        assert!(matches!(
            FailureProcess::new(FailureDist::Exponential, 0.0, 3, 1),
            Err(SimError::Invalid(m)) if m.contains("between failures")
        ));
        assert!(matches!(
            FailureProcess::new(FailureDist::Weibull { shape: -1.0 }, 1.0, 3, 1),
            Err(SimError::Invalid(m)) if m.contains("shape")
        ));
        assert!(matches!(
            FailureProcess::new(FailureDist::Exponential, 1.0, 0, 1),
            Err(SimError::Invalid(m)) if m.contains("server")
        ));
    }
}

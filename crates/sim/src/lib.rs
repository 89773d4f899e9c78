//! `ftrec-sim`: what the fault-tolerance strategies would cost on a cluster larger than the one
//! they were measured on.
//!
//! It owns
//! - [`failure`]: seeded failure processes (exponential, Weibull, gamma as CPR §3.1 fits), one
//!   renewal process per server, and the reproducible schedules `ftrec compare` applies;
//! - [`sim`]: a discrete-event simulation of one job under failures (saves, stalls, rollbacks,
//!   degraded windows, unrecoverable losses), with every wall second attributed to one of CPR
//!   Eq. 1's terms (save, load, lost computation, rescheduling) or to degraded / steady
//!   slowdown;
//! - [`model`]: per-strategy cost coefficients calibrated from measured runs ([`Measured`]) and
//!   their extrapolation to a production [`Scenario`]: save and reload time from bytes and
//!   bandwidth, Young's interval for full checkpoints, CPR Eq. 4 for partial recovery's
//!   interval, DECK's delta size and Inequalities 1 and 2 for its lineage, ECRec's `(k+r)/k`
//!   memory and `k`-fold rebuild reads;
//! - [`advise`]: the advisor: every calibrated strategy simulated at the scenario, ranked, with
//!   the reasons;
//! - [`trust`]: whether a calibration can speak for the scenario (runs long enough, a model
//!   within a stated factor of the calibration's), and what to calibrate on when it cannot.
//!
//! It never runs anything real: the measured figures come in as plain numbers (the `ftrec`
//! binary reads them from a `compare` report), so the crate stays pure and fast to test.
//!
//! ```
//! use ftrec_sim::sim::{simulate, Failures, JobModel, RecoveryModel, Rollback, SaveModel, Stop};
//! let job = JobModel {
//!     name: "full".into(),
//!     servers: 4,
//!     steady: 0.0,
//!     save: Some(SaveModel { every_work_s: 100.0, pause_s: 2.0, first_pause_s: 2.0 }),
//!     recovery: RecoveryModel {
//!         detect_s: 1.0, replace_s: 1.0, reload_s: 2.0, rollback: Rollback::ToLastSave,
//!         degraded: None, tolerates: None, group: 4, backstop_reload_s: None,
//!         track_pls: false,
//!     },
//! };
//! let out = simulate(&job, Failures::Trace(vec![]), Stop::Work(1_000.0)).unwrap();
//! assert_eq!(out.saves, 9);
//! assert!((out.overhead() - 0.018).abs() < 1e-9);
//! ```

pub mod advise;
pub mod failure;
pub mod model;
pub mod sim;
pub mod trust;

pub use advise::{advise, Advice, Ranked};
pub use failure::{draw_schedule, Failure, FailureDist, FailureProcess};
pub use model::{
    Calibration, Coefficients, Machine, Measured, MeasuredFailure, Mechanism, Scenario,
};
pub use sim::{simulate, simulate_many, Breakdown, JobModel, Outcome, Summary};
pub use trust::{assess, Candidate, Trust};

/// Bad input to a simulation or a calibration.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    #[error("invalid simulation input: {0}")]
    Invalid(String),
    #[error("calibration: {0}")]
    Calibration(String),
}

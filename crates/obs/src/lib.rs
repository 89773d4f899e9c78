//! Observability of every ftrec process (server, worker, coordinator, merger):
//!
//! - [`metrics()`]: the process's Prometheus metrics, one registry per process, updated where
//!   the work happens (steps and recoveries by the coordinator, store retries by the store's
//!   retry layer, ECRec transactions by workers, rebuild progress by servers);
//! - [`Endpoint`]: the HTTP endpoint `--metrics-listen` opens: `/metrics` (OpenMetrics text),
//!   `/healthz` (the process answers) and `/readyz` (it has started its part of the job);
//! - [`init_logs`]: where the process's log lines go and in which form (`--log-format text`,
//!   the lines as they always read, or `json`, one JSON object a line for a log pipeline).

mod endpoint;
mod logs;
mod metrics;

pub use endpoint::{set_ready, Endpoint};
pub use logs::{init_logs, LogFormat, EVENT_TARGET, PROGRESS_TARGET};
pub use metrics::{metrics, Metrics, Phase, RoleLabel, StrategyLabel};

/// What can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum ObsError {
    /// The metrics address cannot be listened on.
    #[error("--metrics-listen {addr}: {reason}")]
    Listen { addr: String, reason: String },
    /// A log format that does not exist.
    #[error("--log-format {0:?}: unknown format (text or json)")]
    UnknownLogFormat(String),
}

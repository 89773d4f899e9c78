//! The metric families of an ftrec process. Every process registers all of them; each role
//! updates its own (a counter without labels reads 0 in a role that never counts it, a
//! labelled family shows no series until its first update).

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A process role (`server`, `worker`, `coordinator`, `merger`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    pub role: String,
}

impl RoleLabel {
    pub fn new(role: impl Into<String>) -> Self {
        RoleLabel { role: role.into() }
    }
}

/// A fault-tolerance strategy, with the outcome of a save where it applies.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabel {
    pub strategy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SaveLabel {
    pub strategy: String,
    /// `committed` or `failed`.
    pub outcome: String,
}

/// A phase of a recovery, timed from the failure's injection (or its detection) on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Failure to its detection.
    Detect,
    /// Detection to a replacement process answering.
    Replace,
    /// Replacement to training resumed (the shard loaded, or the rebuild planned).
    Reload,
    /// Training resumed to the lost work redone (checkpointing strategies).
    Redo,
    /// Training resumed to the lost state rebuilt while training went on (ECRec).
    Degraded,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Detect => "detect",
            Phase::Replace => "replace",
            Phase::Reload => "reload",
            Phase::Redo => "redo",
            Phase::Degraded => "degraded",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 1 ms to about 9 minutes (step times, pauses, commits, phases).
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// Seconds from 50 µs to about 3 s (transactions).
fn short_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Every metric family of the process (see the crate docs for who updates which).
pub struct Metrics {
    registry: Registry,
    /// Training steps completed (coordinator).
    pub steps: Counter,
    /// The newest step completed (coordinator).
    pub step: Gauge,
    /// Samples trained, redone ones included (coordinator).
    pub samples: Counter,
    /// Samples per second over the newest report interval (coordinator).
    pub samples_per_second: Gauge<f64, AtomicU64>,
    /// Wall time of each training step (coordinator).
    pub step_seconds: Histogram,
    /// Process losses detected, by role (coordinator).
    pub failures: Family<RoleLabel, Counter>,
    /// Losses recovered from, by role (coordinator).
    pub recoveries: Family<RoleLabel, Counter>,
    /// Seconds each phase of a recovery took (coordinator).
    recovery_phase_seconds: Histograms<PhaseLabel>,
    /// Processes of the job alive as the coordinator sees them, by role.
    pub live_processes: Family<RoleLabel, Gauge>,
    /// Saves by strategy and outcome (coordinator).
    checkpoints: Family<SaveLabel, Counter>,
    /// Checkpoint bytes committed, by strategy (coordinator).
    pub checkpoint_bytes: Family<StrategyLabel, Counter>,
    /// Training paused for each save, by strategy (coordinator).
    pub checkpoint_pause_seconds: Histograms<StrategyLabel>,
    /// Save start to commit, by strategy (coordinator).
    pub checkpoint_commit_seconds: Histograms<StrategyLabel>,
    /// Store operations that failed after their retries (every process with a store).
    pub store_errors: Counter,
    /// Store operations tried again after a transient failure.
    pub store_retries: Counter,
    /// Batches a worker trained.
    pub worker_batches: Counter,
    /// Wall time of a worker's batch (pull, train, push).
    pub worker_batch_seconds: Histogram,
    /// ECRec transactions, prepare to commit, as the worker running them sees them.
    pub ecrec_txn_seconds: Histogram,
    /// Row bytes a rebuilding ECRec server has decoded and installed.
    pub ecrec_rebuild_bytes: Counter,
    /// Share of the lost shard's rows rebuilt (1 when no rebuild runs or it finished).
    pub ecrec_rebuild_progress_ratio: Gauge<f64, AtomicU64>,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ftrec");
        let mut m = Metrics {
            registry: Registry::default(),
            steps: Counter::default(),
            step: Gauge::default(),
            samples: Counter::default(),
            samples_per_second: Gauge::default(),
            step_seconds: seconds(),
            failures: Family::default(),
            recoveries: Family::default(),
            recovery_phase_seconds: Family::new_with_constructor(seconds),
            live_processes: Family::default(),
            checkpoints: Family::default(),
            checkpoint_bytes: Family::default(),
            checkpoint_pause_seconds: Family::new_with_constructor(seconds),
            checkpoint_commit_seconds: Family::new_with_constructor(seconds),
            store_errors: Counter::default(),
            store_retries: Counter::default(),
            worker_batches: Counter::default(),
            worker_batch_seconds: seconds(),
            ecrec_txn_seconds: short_seconds(),
            ecrec_rebuild_bytes: Counter::default(),
            ecrec_rebuild_progress_ratio: Gauge::default(),
        };
        m.ecrec_rebuild_progress_ratio.set(1.0);
        let r = &mut registry;
        r.register(
            "build",
            "This build of ftrec",
            Info::new(BuildLabel {
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        );
        r.register("steps", "Training steps completed", m.steps.clone());
        r.register("step", "The newest training step completed", m.step.clone());
        r.register(
            "samples",
            "Samples trained, redone ones included",
            m.samples.clone(),
        );
        r.register(
            "samples_per_second",
            "Samples per second over the newest report interval",
            m.samples_per_second.clone(),
        );
        r.register(
            "step_seconds",
            "Wall time of each training step",
            m.step_seconds.clone(),
        );
        r.register("failures", "Process losses detected", m.failures.clone());
        r.register("recoveries", "Losses recovered from", m.recoveries.clone());
        r.register(
            "recovery_phase_seconds",
            "Seconds each phase of a recovery took (detect, replace, reload, redo, degraded)",
            m.recovery_phase_seconds.clone(),
        );
        r.register(
            "live_processes",
            "Processes of the job alive as the coordinator sees them",
            m.live_processes.clone(),
        );
        r.register("checkpoints", "Saves by outcome", m.checkpoints.clone());
        r.register(
            "checkpoint_bytes",
            "Checkpoint bytes committed",
            m.checkpoint_bytes.clone(),
        );
        r.register(
            "checkpoint_pause_seconds",
            "Training paused for each save",
            m.checkpoint_pause_seconds.clone(),
        );
        r.register(
            "checkpoint_commit_seconds",
            "Save start to commit",
            m.checkpoint_commit_seconds.clone(),
        );
        r.register(
            "store_errors",
            "Store operations that failed after their retries",
            m.store_errors.clone(),
        );
        r.register(
            "store_retries",
            "Store operations tried again after a transient failure",
            m.store_retries.clone(),
        );
        r.register(
            "worker_batches",
            "Batches this worker trained",
            m.worker_batches.clone(),
        );
        r.register(
            "worker_batch_seconds",
            "Wall time of a worker's batch",
            m.worker_batch_seconds.clone(),
        );
        r.register(
            "ecrec_txn_seconds",
            "ECRec transactions, prepare to commit",
            m.ecrec_txn_seconds.clone(),
        );
        r.register(
            "ecrec_rebuild_bytes",
            "Row bytes this server has rebuilt",
            m.ecrec_rebuild_bytes.clone(),
        );
        r.register(
            "ecrec_rebuild_progress_ratio",
            "Share of the lost shard rebuilt (1 when no rebuild runs)",
            m.ecrec_rebuild_progress_ratio.clone(),
        );
        m.registry = registry;
        m
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// One save's outcome.
    pub fn checkpoint(&self, strategy: &str, committed: bool) {
        self.checkpoints
            .get_or_create(&SaveLabel {
                strategy: strategy.into(),
                outcome: if committed { "committed" } else { "failed" }.into(),
            })
            .inc();
    }

    /// One phase of a recovery.
    pub fn recovery_phase(&self, phase: Phase, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.recovery_phase_seconds
                .get_or_create(&PhaseLabel {
                    phase: phase.name().into(),
                })
                .observe(seconds);
        }
    }

    pub fn strategy(strategy: &str) -> StrategyLabel {
        StrategyLabel {
            strategy: strategy.into(),
        }
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_as_counted_with_their_total_suffix() {
        let m = Metrics::new();
        m.steps.inc_by(3);
        m.recoveries.get_or_create(&RoleLabel::new("server")).inc();
        m.checkpoint("full", true);
        m.recovery_phase(Phase::Detect, 0.25);
        m.recovery_phase(Phase::Redo, f64::NAN);
        let text = m.encode();
        assert!(text.contains("\nftrec_steps_total 3\n"), "{text}");
        assert!(
            text.contains("ftrec_recoveries_total{role=\"server\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("ftrec_checkpoints_total{strategy=\"full\",outcome=\"committed\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("ftrec_recovery_phase_seconds_count{phase=\"detect\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("phase=\"redo\""), "{text}");
        assert!(text.contains("ftrec_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

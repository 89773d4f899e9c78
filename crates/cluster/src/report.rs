//! What a cluster run reports.

use serde::{Deserialize, Serialize};

use crate::RunConfig;

/// Kinds of timeline events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    ServersStarted,
    CheckpointStart,
    CheckpointEnd,
    CheckpointFailed,
    FailureInjected,
    FailureDetected,
    RecoveryStart,
    ServerReplaced,
    TrainingResumed,
    Aborted,
}

/// One event, `t_s` seconds after the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedEvent {
    pub t_s: f64,
    pub kind: EventKind,
    /// Steps applied when it happened.
    pub step: u64,
    pub server: Option<u32>,
    pub detail: String,
}

/// One failure, its detection and the resumption of training, in seconds after the kill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    pub server: u32,
    /// Steps applied when the server was killed.
    pub step: u64,
    pub injected_t_s: f64,
    pub detected_s: Option<f64>,
    pub resumed_s: Option<f64>,
    /// Steps lost (applied after the restored checkpoint) and redone.
    pub steps_redone: u64,
    /// How it was detected: `worker_rpc`, `commit_rpc` or `heartbeat`.
    pub detected_by: Option<String>,
}

/// Samples per second, one point per step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepPoint {
    pub step: u64,
    pub t_s: f64,
    pub loss: f64,
}

/// The report of [`crate::run`] (the `--json` output of `ftrec run`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub strategy: String,
    pub steps: u64,
    /// Training samples of the steps in the final model (`steps * workers * batch`).
    pub samples: u64,
    /// Samples computed again after recoveries.
    pub samples_redone: u64,
    pub wall_s: f64,
    /// From the first step to the last, pauses and recoveries included.
    pub train_s: f64,
    pub samples_per_s: f64,
    /// Mean loss of the last step's workers.
    pub train_loss: f64,
    pub events: Vec<TimedEvent>,
    pub failures: Vec<FailureReport>,
    pub checkpoints: u64,
    /// Training paused for checkpoints (seconds, all saves).
    pub checkpoint_pause_s: f64,
    pub bytes_written: u64,
    pub model_digest: String,
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
    pub eval_samples: usize,
    /// Set when the strategy ended the run.
    pub aborted: Option<String>,
    /// Every server process started (pids), replacements included; all are reaped at return.
    pub server_pids: Vec<u32>,
    /// Every address a server listened on.
    pub server_addrs: Vec<String>,
    pub timeline: Vec<StepPoint>,
    pub config: RunConfig,
}

impl RunReport {
    /// A few human-readable lines.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "strategy {}: {} steps, {} samples in {:.2}s ({:.0} samples/s), {} checkpoints \
             ({:.3}s paused, {} bytes), {} failures\n",
            self.strategy,
            self.steps,
            self.samples,
            self.wall_s,
            self.samples_per_s,
            self.checkpoints,
            self.checkpoint_pause_s,
            self.bytes_written,
            self.failures.len()
        );
        for f in &self.failures {
            s += &format!(
                "  server {} killed after step {}: detected after {}, training resumed after {}, \
                 {} steps redone\n",
                f.server,
                f.step,
                f.detected_s.map_or("-".into(), |d| format!("{d:.3}s")),
                f.resumed_s.map_or("-".into(), |d| format!("{d:.3}s")),
                f.steps_redone
            );
        }
        if let (Some(auc), Some(ll)) = (self.auc, self.logloss) {
            s += &format!(
                "  auc {auc:.4} logloss {ll:.4} on {} held-out samples\n",
                self.eval_samples
            );
        }
        if let Some(r) = &self.aborted {
            s += &format!("  aborted: {r}\n");
        }
        s += &format!("  model_digest {}", self.model_digest);
        s
    }
}

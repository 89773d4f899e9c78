//! Events, actions and the strategy trait.

use ftrec_core::ServerId;
use serde::{Deserialize, Serialize};

/// A committed checkpoint a strategy may restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    pub id: String,
    /// Steps applied to the model saved in it.
    pub step: u64,
}

/// What happened, as the cluster saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// Every worker finished step `step` (steps count from 1) at `now_s` seconds into the run.
    StepDone { step: u64, now_s: f64 },
    /// Time passed without a step (lets time-based policies fire while training is paused).
    Tick { now_s: f64 },
    /// The coordinator declared `server` lost.
    ServerLost { server: ServerId, now_s: f64 },
    /// A save asked for by [`Action::SaveFull`] is durable and committed.
    SaveFinished {
        checkpoint: CheckpointRef,
        cost_s: f64,
        bytes: u64,
    },
    /// A save failed; nothing was committed.
    SaveFailed { step: u64, reason: String },
    /// Every server holds the restored state and a replacement is in place.
    RestoreFinished { step: u64, now_s: f64 },
}

/// What the cluster must do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Stop issuing steps after the current one.
    PauseTraining,
    /// Carry on training.
    ResumeTraining,
    /// Every server writes its shards; the coordinator commits one checkpoint at `step`.
    SaveFull { step: u64 },
    /// Replace lost servers, then every server loads `checkpoint` (or, with `None`, the initial
    /// state from the seed) and the workers rewind the data to that step: full recovery.
    RestoreAll { checkpoint: Option<CheckpointRef> },
    /// End the run with this reason.
    Abort { reason: String },
}

/// A fault-tolerance strategy: a pure function from events to actions plus its own state.
pub trait Strategy: Send {
    fn name(&self) -> &'static str;
    fn on(&mut self, event: &Event) -> Vec<Action>;
}

/// `none`: no fault tolerance; a server loss ends the run.
#[derive(Debug, Default, Clone)]
pub struct NoFaultTolerance {
    last_step: u64,
}

impl Strategy for NoFaultTolerance {
    fn name(&self) -> &'static str {
        "none"
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        match event {
            Event::StepDone { step, .. } => {
                self.last_step = *step;
                Vec::new()
            }
            Event::ServerLost { server, now_s } => vec![Action::Abort {
                reason: format!(
                    "server {} was lost at {now_s:.2}s after step {} and strategy `none` cannot \
                     recover it (use --strategy full or another fault-tolerant strategy)",
                    server.0, self.last_step
                ),
            }],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_aborts_on_a_loss_and_names_the_server() {
        let mut s = NoFaultTolerance::default();
        assert!(s
            .on(&Event::StepDone {
                step: 7,
                now_s: 1.0
            })
            .is_empty());
        let a = s.on(&Event::ServerLost {
            server: ServerId(2),
            now_s: 1.5,
        });
        assert!(
            matches!(&a[..], [Action::Abort { reason }] if reason.contains("server 2") && reason.contains("step 7"))
        );
    }
}

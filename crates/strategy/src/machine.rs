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

/// What one server's prioritized save left out (see [`Event::SaveCoverage`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShardCoverage {
    pub server: ServerId,
    /// Step of the server's previous report (`None`: none since the process started).
    pub since_step: Option<u64>,
    /// Row updates of the server since then (every table).
    pub updates: u64,
    /// Per prioritized row, the updates since the newest save holding it, summed.
    pub uncovered: u64,
}

/// What happened, as the cluster saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Event {
    /// Every worker finished step `step` (steps count from 1) at `now_s` seconds into the run.
    StepDone { step: u64, now_s: f64 },
    /// Time passed without a step (lets time-based policies fire while training is paused).
    Tick { now_s: f64 },
    /// The coordinator declared `server` lost.
    ServerLost { server: ServerId, now_s: f64 },
    /// A save asked for by [`Action::SaveFull`] or [`Action::SaveDelta`] is committed
    /// (`cost_s`: the training pause it caused).
    SaveFinished {
        checkpoint: CheckpointRef,
        cost_s: f64,
        bytes: u64,
    },
    /// A save failed; nothing was committed.
    SaveFailed { step: u64, reason: String },
    /// Every server holds the restored state and a replacement is in place.
    RestoreFinished { step: u64, now_s: f64 },
    /// The last step (`step`) is done and the run is about to end: a strategy that keeps its
    /// store at the model the run ends with saves now.
    TrainingDone { step: u64, now_s: f64 },
    /// The replacement of `server` rebuilt its whole state (ECRec §3.4) and serves it.
    RebuildFinished { server: ServerId, now_s: f64 },
    /// What restoring the newest committed point reads, on the server that reads the most:
    /// the bytes and files of its full, and of what lies over it (IncrCP §4.5's `R_base` and
    /// `R_i` before a read model prices them: no timing, so nothing the page cache moves).
    /// Arrives just before the [`Event::SaveFinished`] of a piece, so the next save point's
    /// decision sees it.
    RestoreEstimate {
        base_bytes: u64,
        base_files: u64,
        chain_bytes: u64,
        chain_files: u64,
    },
    /// What a prioritized save of `step` left out, per server that reported it (CPR Eq. 3 per
    /// row): arrives just before that save's [`Event::SaveFinished`]. A server missing from
    /// the list did not report.
    SaveCoverage {
        step: u64,
        servers: Vec<ShardCoverage>,
    },
    /// The rebuild of `server` failed (for example the replacement died too).
    RebuildFailed { server: ServerId, reason: String },
    /// The job was started again from its store (`ftrec run --resume`): every server holds
    /// `checkpoint`'s state, restored as a recovery restores it, and training goes on from its
    /// step. It is the committed point a loss restores until the next save commits. With
    /// `continues` false (restored onto a different number of servers than saved it) no delta
    /// or piece may apply to it: the next save must be a full.
    Resumed {
        checkpoint: CheckpointRef,
        continues: bool,
        now_s: f64,
    },
}

/// What the cluster must do.
///
/// Training stops while the cluster carries out actions; after a [`Action::PauseTraining`] it
/// stays stopped until [`Action::ResumeTraining`], so a save between the two blocks training
/// until it is committed (the strategy says resume when [`Event::SaveFinished`] arrives),
/// while `[PauseTraining, Save.., ResumeTraining]` pauses only for the copy-out and lets the
/// upload and commit run while training goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Action {
    /// Stop issuing steps after the current one.
    PauseTraining,
    /// Carry on training.
    ResumeTraining,
    /// Every server writes its shards; the coordinator commits one checkpoint at `step`.
    SaveFull { step: u64 },
    /// Every server writes the rows touched since the previous save (values and optimizer
    /// state), the dense part and the data position; the coordinator commits one delta
    /// checkpoint at `step` whose parent is the previous one (DECK §3.1).
    SaveDelta { step: u64 },
    /// Every server writes the rows its priority rule values most (CPR §4.2: most frequently
    /// used, sub-sampled used, or largest change since saved; `r` of each large table) and its
    /// dense range; the coordinator commits one checkpoint at `step` whose parent is the
    /// previous save, so a restore takes each row from the newest save holding it.
    SavePartial { step: u64 },
    /// Every server writes an incremental piece as `layout` says (values and optimizer state of
    /// the rows it touched since the previous save, or since the last full for a differential,
    /// plus the dense part); the coordinator commits one checkpoint at `step` whose parent is
    /// the newest committed checkpoint (the newest committed full for a differential).
    SavePiece { step: u64, layout: PieceLayout },
    /// Wait until the save in flight is committed (or has failed) before training goes on;
    /// its [`Event::SaveFinished`] or [`Event::SaveFailed`] arrives during the wait. A strategy
    /// that allows one save at a time asks for this when its next save point comes while the
    /// previous save still uploads, so that saves land on their steps whatever the upload speed;
    /// in deterministic mode a strategy whose recovery depends on what is committed (partial
    /// recovery) asks for it after every save.
    AwaitSave,
    /// Start a replacement for `server` and rebuild its rows, parities and dense replica
    /// from the survivors in the background while training goes on (ECRec §3.4).
    Rebuild { server: ServerId },
    /// Replace lost servers, then every server loads `checkpoint` (or, with `None`, the initial
    /// state from the seed) and the workers rewind the data to that step: full recovery.
    RestoreAll { checkpoint: Option<CheckpointRef> },
    /// Partial recovery (CPR §2.3): replace `servers` and load only their shards from
    /// `checkpoint` (the head of a chain of a full and later saves: each row from the newest
    /// save holding it; `None`: the initial state from the seed). The surviving servers keep
    /// their rows and the workers go on from where they are: no rewind, no redo.
    RestorePartial {
        servers: Vec<ServerId>,
        checkpoint: Option<CheckpointRef>,
    },
    /// End the run with this reason.
    Abort { reason: String },
}

/// What a strategy adds to the run report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StrategyReport {
    /// `cpr`: the interval and its inputs, the benefit analysis, PLS per failure and in total.
    Cpr(crate::cpr::CprReport),
}

/// How the servers lay out an incremental piece ([`Action::SavePiece`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "scheme", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PieceLayout {
    /// Naive incremental (IncrCP §2.2): the rows touched since the previous save; a restore
    /// replays every piece since the last full, oldest first.
    Incremental,
    /// Check-N-Run's differential: every row touched since the last full (the piece's parent);
    /// values quantized to `quant_bits` (8 or 4) bits if set, which makes restores approximate.
    Differential { quant_bits: Option<u8> },
    /// IncrCP's 2-D chunk list (§4.2): the rows touched since the previous save, cut into row
    /// ranges of `range_rows` local rows (0: one list per table shard), then an extraction round
    /// with threshold `threshold` (§4.3), outputs concatenated into bundles if `concat` (§4.4).
    ChunkList {
        threshold: f64,
        range_rows: u64,
        concat: bool,
    },
}

impl PieceLayout {
    /// Whether the piece holds every row touched since the last full (else since the previous
    /// save), which also makes that full its parent.
    pub fn since_last_full(&self) -> bool {
        matches!(self, PieceLayout::Differential { .. })
    }

    /// Whether restores from such pieces give the saved model bit for bit.
    pub fn exact(&self) -> bool {
        !matches!(
            self,
            PieceLayout::Differential {
                quant_bits: Some(_)
            }
        )
    }
}

/// A choice a strategy made and why (reported by the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub step: u64,
    /// A new full (a baseline reset) rather than a piece.
    pub full: bool,
    pub reason: String,
    /// IncrCP §4.5's `T_base` and `T_incre`, when they were computed.
    #[serde(default)]
    pub t_base_s: Option<f64>,
    #[serde(default)]
    pub t_incre_s: Option<f64>,
}

/// A fault-tolerance strategy: a pure function from events to actions plus its own state.
pub trait Strategy: Send {
    fn name(&self) -> &'static str;
    fn on(&mut self, event: &Event) -> Vec<Action>;

    /// Whether a server loss leaves the trained model in place (no rollback): updates that
    /// complete while a loss is handled still count, and training goes on from where it
    /// was. `false` (the default): a loss may rewind the model to a checkpoint.
    fn keeps_model_on_loss(&self) -> bool {
        false
    }

    /// The strategy's own part of the run report, if it has one.
    fn report(&self) -> Option<StrategyReport> {
        None
    }

    /// The choices it made so far that a report should show (baseline resets and why).
    fn decisions(&self) -> Vec<Decision> {
        Vec::new()
    }
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

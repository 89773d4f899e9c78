//! Incremental checkpoints over a full base, as a state machine shared by three strategies
//! that differ only in what a piece holds and when the base is reset:
//! - `incremental` ([`Incremental`], this module): naive incremental checkpoints (incrcp.txt
//!   §2.2); a new full every `N` pieces if configured;
//! - `incrcp` ([`crate::IncrCp`]): IncrCP's 2-D chunk list, with the baseline-reset rule of §4.5;
//! - `cnr` ([`crate::Cnr`]): Check-N-Run's differential checkpoints, with a new base once a
//!   differential passes a share of the full's size.
//!
//! The cluster carries the actions out as for `deck`: `[PauseTraining, SaveFull | SavePiece,
//! ResumeTraining]`, the save returning once every server copied its rows out; upload and (for
//! the chunk list) extraction go on while training resumes, and [`Event::SaveFinished`] arrives
//! once the checkpoint is committed. One save is in flight at a time: a save point reached
//! while the previous save is still in flight asks the cluster to wait for it
//! ([`Action::AwaitSave`]) and is taken as soon as it commits, so saves land on their steps
//! whatever the upload speed. The end of training ([`Event::TrainingDone`]) saves the last step,
//! so the store ends at the final model.
//! A failed save makes the next one a full (a server may have forgotten rows it tracked, or
//! its chunk list may be ahead of the store). A lost server: every server restores the newest
//! committed checkpoint (a piece restores through its base) and pieces continue from it.

use serde::{Deserialize, Serialize};

use crate::full::Interval;
use crate::machine::{Action, CheckpointRef, Decision, Event, PieceLayout, Strategy};
use crate::StrategyError;

/// What a reset policy sees when a save is due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SavePoint {
    pub step: u64,
    /// Pieces committed over the current base.
    pub pieces: u64,
}

/// What restoring the newest committed point reads ([`Event::RestoreEstimate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RestoreRead {
    pub base_bytes: u64,
    pub base_files: u64,
    pub chain_bytes: u64,
    pub chain_files: u64,
}

/// When to write a new full instead of a piece (and what a piece looks like).
pub trait ResetPolicy: Send + std::fmt::Debug {
    fn name(&self) -> &'static str;
    fn layout(&self) -> PieceLayout;
    /// A new full at this save point? Returns the decision to report.
    fn decide(&mut self, at: SavePoint) -> Decision;
    /// A save committed: a full or a piece, its pause and its bytes.
    fn committed(&mut self, full: bool, cost_s: f64, bytes: u64);
    /// What a restore of the newest committed point reads.
    fn estimate(&mut self, _read: RestoreRead) {}
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Training,
    Saving { step: u64, full: bool },
    Recovering,
}

/// Incremental checkpointing with reset policy `P`.
#[derive(Debug, Clone)]
pub struct Pieces<P> {
    every: Interval,
    policy: P,
    phase: Phase,
    committed: Option<CheckpointRef>,
    have_base: bool,
    pieces: u64,
    last_save_step: u64,
    last_save_s: f64,
    pauses: Vec<f64>,
    decisions: Vec<Decision>,
    /// A save point reached while a save was in flight: taken once that save ends.
    due_while_saving: Option<(u64, f64)>,
}

impl<P: ResetPolicy> Pieces<P> {
    /// Save every `every` (steps or seconds) under `policy`.
    pub fn with_policy(every: Interval, policy: P) -> Result<Self, StrategyError> {
        let bad = |m: &str| Err(StrategyError::InvalidConfig(m.to_string()));
        match every {
            Interval::Steps(0) => return bad("checkpoint every 0 steps"),
            Interval::Seconds(t) if !(t.is_finite() && t > 0.0) => {
                return bad("checkpoint interval must be a positive number of seconds")
            }
            Interval::Young { .. } => {
                return bad("incremental checkpoints are taken every N steps or T seconds")
            }
            _ => {}
        }
        Ok(Pieces {
            every,
            policy,
            phase: Phase::Training,
            committed: None,
            have_base: false,
            pieces: 0,
            last_save_step: 0,
            last_save_s: 0.0,
            pauses: Vec::new(),
            decisions: Vec::new(),
            due_while_saving: None,
        })
    }

    /// The newest committed checkpoint (what a loss restores).
    pub fn committed(&self) -> Option<&CheckpointRef> {
        self.committed.as_ref()
    }

    /// Pauses of committed saves.
    pub fn pauses(&self) -> &[f64] {
        &self.pauses
    }

    pub fn policy(&self) -> &P {
        &self.policy
    }

    fn due(&self, step: u64, now_s: f64) -> bool {
        match self.every {
            Interval::Steps(n) => step >= self.last_save_step + n,
            Interval::Seconds(t) => now_s - self.last_save_s >= t,
            Interval::Young { .. } => false,
        }
    }

    fn save(&mut self, step: u64, now_s: f64) -> Vec<Action> {
        let full = if self.have_base {
            let d = self.policy.decide(SavePoint {
                step,
                pieces: self.pieces,
            });
            let full = d.full;
            self.decisions.push(d);
            full
        } else {
            true
        };
        self.phase = Phase::Saving { step, full };
        self.last_save_step = step;
        self.last_save_s = now_s;
        let save = if full {
            Action::SaveFull { step }
        } else {
            Action::SavePiece {
                step,
                layout: self.policy.layout(),
            }
        };
        vec![Action::PauseTraining, save, Action::ResumeTraining]
    }

    /// The save point that waited for the previous save, if any.
    fn save_if_due(&mut self) -> Vec<Action> {
        match self.due_while_saving.take() {
            Some((step, now_s)) => self.save(step, now_s),
            None => Vec::new(),
        }
    }
}

impl<P: ResetPolicy> Strategy for Pieces<P> {
    fn name(&self) -> &'static str {
        self.policy.name()
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        match (event, self.phase) {
            (Event::StepDone { step, now_s }, Phase::Training) if self.due(*step, *now_s) => {
                self.save(*step, *now_s)
            }
            (Event::StepDone { step, now_s }, Phase::Saving { .. }) if self.due(*step, *now_s) => {
                // One save at a time: this point waits for the previous save's commit.
                self.due_while_saving = Some((*step, *now_s));
                vec![Action::AwaitSave]
            }
            (Event::TrainingDone { step, now_s }, Phase::Training)
                if self.last_save_step != *step =>
            {
                // The store ends at the model the run ends with.
                self.save(*step, *now_s)
            }
            (Event::TrainingDone { step, now_s }, Phase::Saving { step: saving, .. })
                if saving != *step =>
            {
                self.due_while_saving = Some((*step, *now_s));
                vec![Action::AwaitSave]
            }
            (
                Event::SaveFinished {
                    checkpoint,
                    cost_s,
                    bytes,
                },
                Phase::Saving { step, full },
            ) if checkpoint.step == step => {
                self.committed = Some(checkpoint.clone());
                self.pauses.push(*cost_s);
                self.policy.committed(full, *cost_s, *bytes);
                if full {
                    self.have_base = true;
                    self.pieces = 0;
                } else {
                    self.pieces += 1;
                }
                self.phase = Phase::Training;
                self.save_if_due()
            }
            (Event::SaveFailed { step: failed, .. }, Phase::Saving { step, .. })
                if *failed == step =>
            {
                self.phase = Phase::Training;
                self.have_base = false;
                self.save_if_due()
            }
            (
                Event::RestoreEstimate {
                    base_bytes,
                    base_files,
                    chain_bytes,
                    chain_files,
                },
                _,
            ) => {
                self.policy.estimate(RestoreRead {
                    base_bytes: *base_bytes,
                    base_files: *base_files,
                    chain_bytes: *chain_bytes,
                    chain_files: *chain_files,
                });
                Vec::new()
            }
            (Event::ServerLost { .. }, Phase::Training | Phase::Saving { .. }) => {
                // A save in flight is abandoned: it never committed.
                self.phase = Phase::Recovering;
                self.due_while_saving = None;
                vec![
                    Action::PauseTraining,
                    Action::RestoreAll {
                        checkpoint: self.committed.clone(),
                    },
                ]
            }
            (Event::ServerLost { .. }, Phase::Recovering) => vec![Action::RestoreAll {
                checkpoint: self.committed.clone(),
            }],
            (Event::RestoreFinished { step, now_s }, Phase::Recovering) => {
                self.phase = Phase::Training;
                self.last_save_step = *step;
                self.last_save_s = *now_s;
                if self.committed.is_none() {
                    self.have_base = false;
                }
                vec![Action::ResumeTraining]
            }
            (
                Event::Resumed {
                    checkpoint, now_s, ..
                },
                _,
            ) => {
                // The reset rule's measurements (IncrCP §4.5's costs, Check-N-Run's full size)
                // ended with the job that made them: pieces start over from a new full at the
                // first save point. Until it commits, a loss restores the resumed state.
                self.committed = Some(checkpoint.clone());
                self.have_base = false;
                self.pieces = 0;
                self.last_save_step = checkpoint.step;
                self.last_save_s = *now_s;
                self.due_while_saving = None;
                self.phase = Phase::Training;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn decisions(&self) -> Vec<Decision> {
        self.decisions.clone()
    }
}

/// The naive incremental policy: a new full every `full_every_pieces` pieces, or never.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NaiveReset {
    pub full_every_pieces: Option<u64>,
}

impl ResetPolicy for NaiveReset {
    fn name(&self) -> &'static str {
        "incremental"
    }

    fn layout(&self) -> PieceLayout {
        PieceLayout::Incremental
    }

    fn decide(&mut self, at: SavePoint) -> Decision {
        let full = self.full_every_pieces.is_some_and(|n| at.pieces >= n);
        Decision {
            step: at.step,
            full,
            reason: match self.full_every_pieces {
                Some(n) if full => format!("{} pieces since the last full (every {n})", at.pieces),
                Some(n) => format!("{} of {n} pieces", at.pieces),
                None => "no reset configured".into(),
            },
            t_base_s: None,
            t_incre_s: None,
        }
    }

    fn committed(&mut self, _full: bool, _cost_s: f64, _bytes: u64) {}
}

/// `incremental`: naive incremental checkpoints.
pub type Incremental = Pieces<NaiveReset>;

impl Incremental {
    pub fn new(every: Interval, full_every_pieces: Option<u64>) -> Result<Self, StrategyError> {
        if full_every_pieces == Some(0) {
            return Err(StrategyError::InvalidConfig(
                "a full every 0 pieces".to_string(),
            ));
        }
        Pieces::with_policy(every, NaiveReset { full_every_pieces })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ftrec_core::ServerId;

    pub fn ckpt(step: u64) -> CheckpointRef {
        CheckpointRef {
            id: format!("c{step}"),
            step,
        }
    }

    pub fn step<S: Strategy>(s: &mut S, n: u64) -> Vec<Action> {
        s.on(&Event::StepDone {
            step: n,
            now_s: n as f64,
        })
    }

    pub fn done<S: Strategy>(s: &mut S, n: u64, cost_s: f64, bytes: u64) -> Vec<Action> {
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(n),
            cost_s,
            bytes,
        })
    }

    #[test]
    fn first_a_full_then_pieces_since_the_previous_save() {
        let mut s = Incremental::new(Interval::Steps(2), None).unwrap();
        assert!(step(&mut s, 1).is_empty());
        assert_eq!(
            step(&mut s, 2),
            vec![
                Action::PauseTraining,
                Action::SaveFull { step: 2 },
                Action::ResumeTraining
            ]
        );
        // One save in flight at a time: a point due meanwhile waits for the commit.
        assert!(step(&mut s, 3).is_empty());
        assert_eq!(step(&mut s, 4), vec![Action::AwaitSave]);
        assert_eq!(
            done(&mut s, 2, 0.1, 1000),
            vec![
                Action::PauseTraining,
                Action::SavePiece {
                    step: 4,
                    layout: PieceLayout::Incremental
                },
                Action::ResumeTraining
            ]
        );
        done(&mut s, 4, 0.01, 10);
        assert_eq!(s.committed(), Some(&ckpt(4)));
        assert_eq!(s.decisions().len(), 1);
        assert!(!s.decisions()[0].full);
    }

    #[test]
    fn the_end_of_training_saves_the_last_step() {
        let mut s = Incremental::new(Interval::Steps(3), None).unwrap();
        step(&mut s, 3);
        done(&mut s, 3, 0.0, 1);
        step(&mut s, 4);
        let end = |s: &mut Incremental, n: u64| {
            s.on(&Event::TrainingDone {
                step: n,
                now_s: n as f64,
            })
        };
        assert!(matches!(
            end(&mut s, 4)[1],
            Action::SavePiece { step: 4, .. }
        ));
        done(&mut s, 4, 0.0, 1);
        // Nothing new to save.
        assert!(end(&mut s, 4).is_empty());
        // Ending while a save uploads: wait for it, then save the last step.
        step(&mut s, 7);
        assert_eq!(end(&mut s, 8), vec![Action::AwaitSave]);
        assert!(matches!(
            done(&mut s, 7, 0.0, 1)[1],
            Action::SavePiece { step: 8, .. }
        ));
    }

    #[test]
    fn a_full_every_n_pieces_when_configured() {
        let mut s = Incremental::new(Interval::Steps(1), Some(2)).unwrap();
        let mut kinds = Vec::new();
        for n in 1..=7 {
            let a = step(&mut s, n);
            kinds.push(matches!(a[1], Action::SaveFull { .. }));
            done(&mut s, n, 0.0, 1);
        }
        assert_eq!(kinds, vec![true, false, false, true, false, false, true]);
    }

    #[test]
    fn a_loss_restores_the_newest_committed_and_pieces_continue() {
        let mut s = Incremental::new(Interval::Steps(1), None).unwrap();
        step(&mut s, 1);
        done(&mut s, 1, 0.0, 1);
        step(&mut s, 2);
        done(&mut s, 2, 0.0, 1);
        step(&mut s, 3); // piece 3 in flight
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(1),
                now_s: 3.5
            }),
            vec![
                Action::PauseTraining,
                Action::RestoreAll {
                    checkpoint: Some(ckpt(2))
                }
            ]
        );
        // The abandoned save's late commit is ignored.
        assert!(done(&mut s, 3, 0.0, 1).is_empty());
        assert_eq!(
            s.on(&Event::RestoreFinished {
                step: 2,
                now_s: 4.0
            }),
            vec![Action::ResumeTraining]
        );
        assert!(matches!(
            step(&mut s, 3)[1],
            Action::SavePiece { step: 3, .. }
        ));
    }

    #[test]
    fn a_failed_piece_is_followed_by_a_full() {
        let mut s = Incremental::new(Interval::Steps(1), None).unwrap();
        step(&mut s, 1);
        done(&mut s, 1, 0.0, 1);
        assert!(matches!(step(&mut s, 2)[1], Action::SavePiece { .. }));
        assert!(s
            .on(&Event::SaveFailed {
                step: 2,
                reason: "upload".into()
            })
            .is_empty());
        assert_eq!(step(&mut s, 3)[1], Action::SaveFull { step: 3 });
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(matches!(
            Incremental::new(Interval::Steps(0), None),
            Err(StrategyError::InvalidConfig(_))
        ));
        assert!(matches!(
            Incremental::new(Interval::Steps(3), Some(0)),
            Err(StrategyError::InvalidConfig(_))
        ));
        assert!(matches!(
            Incremental::new(
                Interval::Young {
                    mtbf_s: 1.0,
                    first_after_steps: 1
                },
                None
            ),
            Err(StrategyError::InvalidConfig(_))
        ));
    }

    #[test]
    fn a_resumed_job_starts_its_pieces_over_from_a_full() {
        let mut s = Incremental::new(Interval::Steps(2), None).unwrap();
        assert!(s
            .on(&Event::Resumed {
                checkpoint: ckpt(4),
                continues: true,
                now_s: 0.0,
            })
            .is_empty());
        assert_eq!(s.committed(), Some(&ckpt(4)));
        assert!(step(&mut s, 5).is_empty());
        assert_eq!(step(&mut s, 6)[1], Action::SaveFull { step: 6 });
        done(&mut s, 6, 0.1, 100);
        assert!(matches!(
            step(&mut s, 8)[1],
            Action::SavePiece { step: 8, .. }
        ));
    }
}

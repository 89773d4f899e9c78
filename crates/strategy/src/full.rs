//! `full`: periodic full checkpoints and full recovery (CPR §2.2).

use serde::{Deserialize, Serialize};

use crate::machine::{Action, CheckpointRef, Event, Strategy};
use crate::policy::young_interval;
use crate::StrategyError;

/// When to save.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interval {
    /// Every `n` steps.
    Steps(u64),
    /// Every `t` seconds of training.
    Seconds(f64),
    /// Young's interval `sqrt(2 O_save T_fail)` from the measured mean save cost and the
    /// configured mean time between failures; the first save happens after `first_after_steps`
    /// steps, to measure `O_save`.
    Young { mtbf_s: f64, first_after_steps: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Training,
    Saving { step: u64, started_s: f64 },
    Recovering,
}

/// The `full` strategy's state.
#[derive(Debug, Clone)]
pub struct FullCheckpoint {
    interval: Interval,
    phase: Phase,
    committed: Option<CheckpointRef>,
    last_save_step: u64,
    last_save_s: f64,
    save_costs: Vec<f64>,
}

impl FullCheckpoint {
    pub fn new(interval: Interval) -> Result<Self, StrategyError> {
        let bad = |m: &str| Err(StrategyError::InvalidConfig(m.to_string()));
        match interval {
            Interval::Steps(0) => return bad("checkpoint every 0 steps"),
            Interval::Seconds(t) if !(t.is_finite() && t > 0.0) => {
                return bad("checkpoint interval must be a positive number of seconds")
            }
            Interval::Young {
                mtbf_s,
                first_after_steps,
            } => {
                if !(mtbf_s.is_finite() && mtbf_s > 0.0) {
                    return bad("MTBF must be a positive number of seconds");
                }
                if first_after_steps == 0 {
                    return bad("the first save of Young's policy needs at least one step");
                }
            }
            _ => {}
        }
        Ok(FullCheckpoint {
            interval,
            phase: Phase::Training,
            committed: None,
            last_save_step: 0,
            last_save_s: 0.0,
            save_costs: Vec::new(),
        })
    }

    /// The last committed checkpoint.
    pub fn committed(&self) -> Option<&CheckpointRef> {
        self.committed.as_ref()
    }

    /// Mean measured save cost (`O_save`), if any save finished.
    pub fn mean_save_cost(&self) -> Option<f64> {
        (!self.save_costs.is_empty())
            .then(|| self.save_costs.iter().sum::<f64>() / self.save_costs.len() as f64)
    }

    /// The interval in seconds that Young's policy uses now (None before the first save).
    pub fn young_seconds(&self) -> Option<f64> {
        match self.interval {
            Interval::Young { mtbf_s, .. } => {
                self.mean_save_cost().map(|o| young_interval(o, mtbf_s))
            }
            _ => None,
        }
    }

    fn due(&self, step: u64, now_s: f64) -> bool {
        match self.interval {
            Interval::Steps(n) => step >= self.last_save_step + n,
            Interval::Seconds(t) => now_s - self.last_save_s >= t,
            Interval::Young {
                first_after_steps, ..
            } => match self.young_seconds() {
                None => step >= first_after_steps,
                Some(t) => now_s - self.last_save_s >= t,
            },
        }
    }
}

impl Strategy for FullCheckpoint {
    fn name(&self) -> &'static str {
        "full"
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        match (event, self.phase) {
            (Event::StepDone { step, now_s }, Phase::Training) if self.due(*step, *now_s) => {
                self.phase = Phase::Saving {
                    step: *step,
                    started_s: *now_s,
                };
                vec![Action::PauseTraining, Action::SaveFull { step: *step }]
            }
            (
                Event::SaveFinished {
                    checkpoint, cost_s, ..
                },
                Phase::Saving { step, started_s },
            ) if checkpoint.step == step => {
                self.committed = Some(checkpoint.clone());
                self.save_costs.push(*cost_s);
                // Intervals run from save start to save start, as Young's derivation assumes.
                self.last_save_step = step;
                self.last_save_s = started_s;
                self.phase = Phase::Training;
                vec![Action::ResumeTraining]
            }
            (Event::SaveFailed { step: failed, .. }, Phase::Saving { step, .. })
                if *failed == step =>
            {
                // Nothing was committed; the previous checkpoint stays the recovery point and the
                // next step will try again.
                self.phase = Phase::Training;
                vec![Action::ResumeTraining]
            }
            (Event::ServerLost { .. }, Phase::Training | Phase::Saving { .. }) => {
                // A save in flight when a server dies is abandoned: it never committed.
                self.phase = Phase::Recovering;
                vec![
                    Action::PauseTraining,
                    Action::RestoreAll {
                        checkpoint: self.committed.clone(),
                    },
                ]
            }
            (Event::ServerLost { .. }, Phase::Recovering) => {
                // Another loss during recovery: restore again from the same point.
                vec![Action::RestoreAll {
                    checkpoint: self.committed.clone(),
                }]
            }
            (Event::RestoreFinished { step, now_s }, Phase::Recovering) => {
                self.phase = Phase::Training;
                self.last_save_step = *step;
                self.last_save_s = *now_s;
                vec![Action::ResumeTraining]
            }
            (
                Event::Resumed {
                    checkpoint, now_s, ..
                },
                _,
            ) => {
                // Intervals run from the resumed checkpoint, as from a save.
                self.committed = Some(checkpoint.clone());
                self.last_save_step = checkpoint.step;
                self.last_save_s = *now_s;
                self.phase = Phase::Training;
                Vec::new()
            }
            // The store ends at the model the run ends with (unless the last step was saved
            // already), so the job can be resumed, evaluated or exported from it.
            (Event::TrainingDone { step, now_s }, Phase::Training)
                if self.committed.as_ref().is_none_or(|c| c.step != *step) =>
            {
                self.phase = Phase::Saving {
                    step: *step,
                    started_s: *now_s,
                };
                vec![Action::PauseTraining, Action::SaveFull { step: *step }]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_core::ServerId;

    fn ckpt(step: u64) -> CheckpointRef {
        CheckpointRef {
            id: format!("ckpt-{step}"),
            step,
        }
    }

    #[test]
    fn saves_every_n_steps_and_resumes_after_commit() {
        let mut s = FullCheckpoint::new(Interval::Steps(3)).unwrap();
        for step in 1..3 {
            assert!(s
                .on(&Event::StepDone {
                    step,
                    now_s: step as f64
                })
                .is_empty());
        }
        assert_eq!(
            s.on(&Event::StepDone {
                step: 3,
                now_s: 3.0
            }),
            vec![Action::PauseTraining, Action::SaveFull { step: 3 }]
        );
        let done = Event::SaveFinished {
            checkpoint: ckpt(3),
            cost_s: 0.5,
            bytes: 10,
        };
        assert_eq!(s.on(&done), vec![Action::ResumeTraining]);
        assert_eq!(s.committed(), Some(&ckpt(3)));
        assert!(s
            .on(&Event::StepDone {
                step: 5,
                now_s: 5.0
            })
            .is_empty());
        assert_eq!(
            s.on(&Event::StepDone {
                step: 6,
                now_s: 6.0
            })[1],
            Action::SaveFull { step: 6 }
        );
    }

    #[test]
    fn loss_restores_the_last_committed_checkpoint() {
        let mut s = FullCheckpoint::new(Interval::Steps(2)).unwrap();
        // Lost before any save: full recovery restarts from the initial state.
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(0),
                now_s: 0.5
            }),
            vec![
                Action::PauseTraining,
                Action::RestoreAll { checkpoint: None }
            ]
        );
        assert_eq!(
            s.on(&Event::RestoreFinished {
                step: 0,
                now_s: 1.0
            }),
            vec![Action::ResumeTraining]
        );
        s.on(&Event::StepDone {
            step: 2,
            now_s: 2.0,
        });
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(2),
            cost_s: 0.1,
            bytes: 1,
        });
        // Lost while the next save is in flight: that save is abandoned.
        s.on(&Event::StepDone {
            step: 4,
            now_s: 4.0,
        });
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(1),
                now_s: 4.1
            }),
            vec![
                Action::PauseTraining,
                Action::RestoreAll {
                    checkpoint: Some(ckpt(2))
                }
            ]
        );
        // The late completion of the abandoned save is ignored.
        assert!(s
            .on(&Event::SaveFinished {
                checkpoint: ckpt(4),
                cost_s: 0.1,
                bytes: 1
            })
            .is_empty());
        assert_eq!(s.committed(), Some(&ckpt(2)));
    }

    #[test]
    fn young_interval_follows_measured_save_cost() {
        let mut s = FullCheckpoint::new(Interval::Young {
            mtbf_s: 200.0,
            first_after_steps: 1,
        })
        .unwrap();
        assert_eq!(
            s.on(&Event::StepDone {
                step: 1,
                now_s: 0.1
            })[1],
            Action::SaveFull { step: 1 }
        );
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(1),
            cost_s: 1.0,
            bytes: 1,
        });
        // sqrt(2 * 1 * 200) = 20 s.
        assert_eq!(s.young_seconds(), Some(20.0));
        assert!(s
            .on(&Event::StepDone {
                step: 50,
                now_s: 19.0
            })
            .is_empty());
        assert_eq!(
            s.on(&Event::StepDone {
                step: 51,
                now_s: 20.5
            })[1],
            Action::SaveFull { step: 51 }
        );
    }

    #[test]
    fn failed_save_keeps_the_old_recovery_point() {
        let mut s = FullCheckpoint::new(Interval::Steps(1)).unwrap();
        s.on(&Event::StepDone {
            step: 1,
            now_s: 1.0,
        });
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(1),
            cost_s: 0.1,
            bytes: 1,
        });
        s.on(&Event::StepDone {
            step: 2,
            now_s: 2.0,
        });
        assert_eq!(
            s.on(&Event::SaveFailed {
                step: 2,
                reason: "disk full".into()
            }),
            vec![Action::ResumeTraining]
        );
        assert_eq!(s.committed(), Some(&ckpt(1)));
    }

    #[test]
    fn the_end_of_training_saves_the_last_step_unless_it_is_saved() {
        let mut s = FullCheckpoint::new(Interval::Steps(4)).unwrap();
        for step in 1..=4 {
            s.on(&Event::StepDone {
                step,
                now_s: step as f64,
            });
        }
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(4),
            cost_s: 0.1,
            bytes: 1,
        });
        // Ending right at a committed save point: nothing more to save.
        assert!(s
            .on(&Event::TrainingDone {
                step: 4,
                now_s: 4.5
            })
            .is_empty());
        s.on(&Event::StepDone {
            step: 5,
            now_s: 5.0,
        });
        assert_eq!(
            s.on(&Event::TrainingDone {
                step: 5,
                now_s: 5.5
            }),
            vec![Action::PauseTraining, Action::SaveFull { step: 5 }]
        );
        assert_eq!(
            s.on(&Event::SaveFinished {
                checkpoint: ckpt(5),
                cost_s: 0.1,
                bytes: 1
            }),
            vec![Action::ResumeTraining]
        );
        assert_eq!(s.committed(), Some(&ckpt(5)));
    }

    #[test]
    fn bad_intervals_are_refused() {
        assert!(FullCheckpoint::new(Interval::Steps(0)).is_err());
        assert!(FullCheckpoint::new(Interval::Seconds(-1.0)).is_err());
        assert!(FullCheckpoint::new(Interval::Young {
            mtbf_s: 0.0,
            first_after_steps: 1
        })
        .is_err());
    }

    #[test]
    fn a_resumed_job_saves_on_from_its_checkpoint_and_a_loss_restores_it() {
        let mut s = FullCheckpoint::new(Interval::Steps(5)).unwrap();
        let r = s.on(&Event::Resumed {
            checkpoint: ckpt(10),
            continues: false,
            now_s: 0.5,
        });
        assert!(r.is_empty());
        assert_eq!(s.committed(), Some(&ckpt(10)));
        for step in 11..15 {
            assert!(s.on(&Event::StepDone { step, now_s: 1.0 }).is_empty());
        }
        assert_eq!(
            s.on(&Event::StepDone {
                step: 15,
                now_s: 1.0
            }),
            vec![Action::PauseTraining, Action::SaveFull { step: 15 }]
        );
        // Before that save commits, a loss restores the resumed checkpoint.
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(0),
                now_s: 2.0
            }),
            vec![
                Action::PauseTraining,
                Action::RestoreAll {
                    checkpoint: Some(ckpt(10))
                }
            ]
        );
        // A job resumed at its last step has its final model saved already.
        let mut s = FullCheckpoint::new(Interval::Steps(5)).unwrap();
        s.on(&Event::Resumed {
            checkpoint: ckpt(20),
            continues: true,
            now_s: 0.0,
        });
        assert!(s
            .on(&Event::TrainingDone {
                step: 20,
                now_s: 1.0
            })
            .is_empty());
    }
}

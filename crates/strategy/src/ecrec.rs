//! `ecrec`: erasure-coded rows and replicated dense blocks in memory, so a server loss costs
//! neither a pause nor a rollback (ECRec §3.4): the lost server is replaced and rebuilt from
//! the survivors while training goes on.
//!
//! The machine decides only *what* to rebuild. It emits [`Action::Rebuild`] for every server
//! that is lost at the moment of a loss (a new loss changes the set of survivors every rebuild
//! reads from, so rebuilds under way restart against the new set; what they already rebuilt
//! stays). A code with `r` parities survives any `r` servers lost at once. With more lost before
//! the rebuilds finish, some stripe may have lost more members than it can decode:
//! - without a backstop it asks to [`Action::Abort`], naming the servers;
//! - with one (ECRec §4: "checkpoints at a much lower frequency than normal checkpointing
//!   schemes as a second layer of defense against concurrent failures"; `backstop_every_steps`)
//!   it saves a full checkpoint every that many steps while no rebuild runs, and such a loss
//!   pauses training and restores every server from the newest one ([`Action::RestoreAll`]:
//!   the cluster re-encodes the parities after the load), as `full` recovers.

use std::collections::{BTreeMap, BTreeSet};

use ftrec_core::ServerId;

use crate::machine::{Action, CheckpointRef, Event, Strategy};
use crate::StrategyError;

/// Consecutive failed rebuilds of one server before the run is aborted.
pub const MAX_REBUILD_ATTEMPTS: u32 = 3;

/// The shape of the code, as the strategy needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcRecConfig {
    pub servers: u32,
    /// Data rows per stripe.
    pub k: usize,
    /// Parities per stripe (and dense copies): simultaneous losses tolerated.
    pub r: usize,
    /// A full checkpoint every this many steps, restored when more than `r` servers are lost
    /// at once (`None`: such a loss aborts the run).
    pub backstop_every_steps: Option<u64>,
}

/// The `ecrec` strategy's state.
#[derive(Debug, Clone)]
pub struct EcRec {
    cfg: EcRecConfig,
    /// Lost servers whose replacement has not finished its rebuild, with the failed attempts.
    rebuilding: BTreeMap<ServerId, u32>,
    last_step: u64,
    aborted: bool,
    /// The backstop save in flight (its step).
    saving: Option<u64>,
    /// A restore from the backstop is under way.
    restoring: bool,
    /// The newest committed backstop.
    committed: Option<CheckpointRef>,
    /// Step of the newest committed backstop, or of the state a restore went back to.
    last_save_step: u64,
}

impl EcRec {
    pub fn new(cfg: EcRecConfig) -> Result<Self, StrategyError> {
        if cfg.k == 0 || cfg.r == 0 {
            return Err(StrategyError::InvalidConfig(format!(
                "ecrec needs k >= 1 and r >= 1 (got k = {}, r = {})",
                cfg.k, cfg.r
            )));
        }
        if cfg.k as u64 + cfg.r as u64 > u64::from(cfg.servers) {
            return Err(StrategyError::InvalidConfig(format!(
                "ecrec with k = {} and r = {} needs at least {} servers, got {}",
                cfg.k,
                cfg.r,
                cfg.k + cfg.r,
                cfg.servers
            )));
        }
        if cfg.backstop_every_steps == Some(0) {
            return Err(StrategyError::InvalidConfig(
                "an ecrec backstop checkpoint every 0 steps".into(),
            ));
        }
        Ok(EcRec {
            cfg,
            rebuilding: BTreeMap::new(),
            last_step: 0,
            aborted: false,
            saving: None,
            restoring: false,
            committed: None,
            last_save_step: 0,
        })
    }

    /// The newest committed backstop checkpoint.
    pub fn committed(&self) -> Option<&CheckpointRef> {
        self.committed.as_ref()
    }

    /// A backstop save at `step`, if one is due and can be taken: none in flight, no restore,
    /// and no rebuild under way (a replacement's rows are not all there to be saved).
    fn save_at(&mut self, step: u64, due: bool) -> Vec<Action> {
        if self.cfg.backstop_every_steps.is_none()
            || !due
            || self.saving.is_some()
            || self.restoring
            || !self.rebuilding.is_empty()
        {
            return Vec::new();
        }
        self.saving = Some(step);
        vec![Action::PauseTraining, Action::SaveFull { step }]
    }

    /// Servers being rebuilt now.
    pub fn rebuilding(&self) -> BTreeSet<ServerId> {
        self.rebuilding.keys().copied().collect()
    }

    fn abort(&mut self, reason: String) -> Vec<Action> {
        self.aborted = true;
        vec![Action::Abort { reason }]
    }

    fn names(set: &BTreeMap<ServerId, u32>) -> String {
        set.keys()
            .map(|s| s.0.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Strategy for EcRec {
    fn name(&self) -> &'static str {
        "ecrec"
    }

    /// ECRec §3.4: a loss costs neither a pause nor a rollback; with a backstop, more than `r`
    /// lost at once rolls the model back to it.
    fn keeps_model_on_loss(&self) -> bool {
        self.cfg.backstop_every_steps.is_none()
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        if self.aborted {
            return Vec::new();
        }
        match event {
            Event::StepDone { step, .. } => {
                self.last_step = *step;
                let due = self
                    .cfg
                    .backstop_every_steps
                    .is_some_and(|n| *step >= self.last_save_step + n);
                self.save_at(*step, due)
            }
            Event::SaveFinished { checkpoint, .. } if self.saving == Some(checkpoint.step) => {
                self.saving = None;
                self.committed = Some(checkpoint.clone());
                self.last_save_step = checkpoint.step;
                vec![Action::ResumeTraining]
            }
            Event::SaveFailed { step, .. } if self.saving == Some(*step) => {
                // Nothing committed: the previous backstop stays, the next step tries again.
                self.saving = None;
                vec![Action::ResumeTraining]
            }
            Event::RestoreFinished { step, .. } if self.restoring => {
                self.restoring = false;
                self.last_save_step = *step;
                vec![Action::ResumeTraining]
            }
            Event::Resumed { checkpoint, .. } => {
                self.committed = Some(checkpoint.clone());
                self.last_save_step = checkpoint.step;
                Vec::new()
            }
            // The store ends at the model the run ends with, so the job can be evaluated or
            // exported from it.
            Event::TrainingDone { step, .. } => {
                let due = self.committed.as_ref().is_none_or(|c| c.step != *step);
                self.save_at(*step, due)
            }
            Event::ServerLost { server, now_s } => {
                if server.0 >= self.cfg.servers {
                    return self.abort(format!(
                        "server {} was reported lost but the cluster has {} servers",
                        server.0, self.cfg.servers
                    ));
                }
                if self.restoring {
                    // Lost during the restore: restore again from the same point.
                    return vec![Action::RestoreAll {
                        checkpoint: self.committed.clone(),
                    }];
                }
                // A replacement that dies during its rebuild is simply lost again.
                self.rebuilding.insert(*server, 0);
                if self.rebuilding.len() > self.cfg.r && self.cfg.backstop_every_steps.is_some() {
                    // ECRec §4's second layer: every server loads the newest backstop (the
                    // initial state if none committed yet); a save in flight never commits.
                    self.rebuilding.clear();
                    self.saving = None;
                    self.restoring = true;
                    return vec![
                        Action::PauseTraining,
                        Action::RestoreAll {
                            checkpoint: self.committed.clone(),
                        },
                    ];
                }
                if self.rebuilding.len() > self.cfg.r {
                    return self.abort(format!(
                        "servers {} are lost at once ({now_s:.2}s, after step {}) but the code \
                         has r = {} parities per stripe: some stripe may have lost more rows \
                         than it can decode",
                        Self::names(&self.rebuilding),
                        self.last_step,
                        self.cfg.r
                    ));
                }
                // ECRec §3.4: no pause, no rollback; every rebuild reads from the survivors of
                // the new lost set.
                self.rebuilding
                    .keys()
                    .map(|&server| Action::Rebuild { server })
                    .collect()
            }
            Event::RebuildFinished { server, .. } => {
                self.rebuilding.remove(server);
                Vec::new()
            }
            Event::RebuildFailed { server, reason } => {
                let Some(attempts) = self.rebuilding.get_mut(server) else {
                    return Vec::new();
                };
                *attempts += 1;
                if *attempts >= MAX_REBUILD_ATTEMPTS {
                    let n = *attempts;
                    return self.abort(format!(
                        "the rebuild of server {} failed {n} times in a row (last: {reason})",
                        server.0
                    ));
                }
                vec![Action::Rebuild { server: *server }]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(k: usize, r: usize, n: u32) -> EcRec {
        EcRec::new(EcRecConfig {
            servers: n,
            k,
            r,
            backstop_every_steps: None,
        })
        .unwrap()
    }

    fn lost(server: u32) -> Event {
        Event::ServerLost {
            server: ServerId(server),
            now_s: 1.0,
        }
    }

    fn rebuild(servers: &[u32]) -> Vec<Action> {
        servers
            .iter()
            .map(|&s| Action::Rebuild {
                server: ServerId(s),
            })
            .collect()
    }

    #[test]
    fn a_loss_starts_a_rebuild_without_pause_or_rollback() {
        let mut e = s(2, 1, 4);
        assert!(e
            .on(&Event::StepDone {
                step: 3,
                now_s: 0.5
            })
            .is_empty());
        assert!(e.keeps_model_on_loss());
        let a = e.on(&lost(2));
        assert_eq!(a, rebuild(&[2]));
        assert!(!a
            .iter()
            .any(|x| matches!(x, Action::PauseTraining | Action::RestoreAll { .. })));
        assert!(e
            .on(&Event::RebuildFinished {
                server: ServerId(2),
                now_s: 2.0
            })
            .is_empty());
        assert!(e.rebuilding().is_empty());
        // A later loss of another server is again within r.
        assert_eq!(e.on(&lost(0)), rebuild(&[0]));
    }

    #[test]
    fn a_second_loss_during_a_rebuild_restarts_both_with_r2() {
        let mut e = s(3, 2, 6);
        assert_eq!(e.on(&lost(4)), rebuild(&[4]));
        assert_eq!(e.on(&lost(1)), rebuild(&[1, 4]));
        assert_eq!(e.rebuilding().len(), 2);
    }

    #[test]
    fn more_losses_than_r_abort_with_a_clear_reason() {
        let mut e = s(2, 1, 4);
        e.on(&Event::StepDone {
            step: 9,
            now_s: 1.0,
        });
        e.on(&lost(1));
        let a = e.on(&lost(3));
        assert!(
            matches!(&a[..], [Action::Abort { reason }]
                if reason.contains("1, 3") && reason.contains("r = 1") && reason.contains("step 9")),
            "{a:?}"
        );
        // Nothing more after an abort.
        assert!(e.on(&lost(0)).is_empty());
    }

    #[test]
    fn a_replacement_lost_during_its_rebuild_is_rebuilt_again() {
        let mut e = s(2, 1, 3);
        assert_eq!(e.on(&lost(0)), rebuild(&[0]));
        assert_eq!(e.on(&lost(0)), rebuild(&[0]));
    }

    #[test]
    fn failed_rebuilds_are_retried_then_abort() {
        let mut e = s(2, 1, 3);
        e.on(&lost(1));
        let fail = Event::RebuildFailed {
            server: ServerId(1),
            reason: "peer gone".into(),
        };
        for _ in 1..MAX_REBUILD_ATTEMPTS {
            assert_eq!(e.on(&fail), rebuild(&[1]));
        }
        let a = e.on(&fail);
        assert!(
            matches!(&a[..], [Action::Abort { reason }] if reason.contains("peer gone")),
            "{a:?}"
        );
        // A failure for a server not being rebuilt is ignored.
        let mut e = s(2, 1, 3);
        assert!(e
            .on(&Event::RebuildFailed {
                server: ServerId(2),
                reason: "x".into()
            })
            .is_empty());
    }

    #[test]
    fn configs_that_cannot_work_are_refused() {
        for (k, r, n) in [(0, 1, 3), (2, 0, 3), (3, 1, 3)] {
            assert!(matches!(
                EcRec::new(EcRecConfig {
                    servers: n,
                    k,
                    r,
                    backstop_every_steps: None
                }),
                Err(StrategyError::InvalidConfig(_))
            ));
        }
        let mut e = s(2, 1, 3);
        assert!(matches!(&e.on(&lost(7))[..], [Action::Abort { .. }]));
    }

    fn backstopped(k: usize, r: usize, n: u32, every: u64) -> EcRec {
        EcRec::new(EcRecConfig {
            servers: n,
            k,
            r,
            backstop_every_steps: Some(every),
        })
        .unwrap()
    }

    fn step(e: &mut EcRec, step: u64) -> Vec<Action> {
        e.on(&Event::StepDone {
            step,
            now_s: step as f64,
        })
    }

    fn saved(e: &mut EcRec, step: u64) -> Vec<Action> {
        e.on(&Event::SaveFinished {
            checkpoint: CheckpointRef {
                id: format!("c{step}"),
                step,
            },
            cost_s: 0.1,
            bytes: 1,
        })
    }

    /// ECRec §4's second layer: a backstop every N steps while no rebuild runs, and more than
    /// r servers lost at once restore every server from the newest one instead of aborting.
    #[test]
    fn a_backstop_is_saved_every_n_steps_and_restored_after_more_than_r_losses() {
        let mut e = backstopped(2, 1, 4, 5);
        assert!(!e.keeps_model_on_loss());
        assert!(step(&mut e, 4).is_empty());
        assert_eq!(
            step(&mut e, 5),
            vec![Action::PauseTraining, Action::SaveFull { step: 5 }]
        );
        // No second save while one is in flight.
        assert!(step(&mut e, 6).is_empty());
        assert_eq!(saved(&mut e, 5), vec![Action::ResumeTraining]);
        assert_eq!(e.committed().map(|c| c.step), Some(5));
        // A loss within r: a rebuild, and no backstop is saved while it runs.
        assert_eq!(e.on(&lost(2)), rebuild(&[2]));
        assert!(step(&mut e, 10).is_empty());
        assert!(step(&mut e, 11).is_empty());
        e.on(&Event::RebuildFinished {
            server: ServerId(2),
            now_s: 11.5,
        });
        // Once it is done, the overdue save comes at the next step.
        assert_eq!(
            step(&mut e, 12),
            vec![Action::PauseTraining, Action::SaveFull { step: 12 }]
        );
        assert_eq!(saved(&mut e, 12), vec![Action::ResumeTraining]);
        // Two lost at once with r = 1: every server back to step 12's backstop.
        assert_eq!(e.on(&lost(0)), rebuild(&[0]));
        let a = e.on(&lost(3));
        assert_eq!(
            a,
            vec![
                Action::PauseTraining,
                Action::RestoreAll {
                    checkpoint: Some(CheckpointRef {
                        id: "c12".into(),
                        step: 12
                    })
                }
            ]
        );
        assert!(e.rebuilding().is_empty());
        // Lost again during the restore: the same point again.
        assert!(matches!(
            &e.on(&lost(1))[..],
            [Action::RestoreAll { checkpoint: Some(c) }] if c.step == 12
        ));
        assert_eq!(
            e.on(&Event::RestoreFinished {
                step: 12,
                now_s: 20.0
            }),
            vec![Action::ResumeTraining]
        );
        // The interval runs from the restored step.
        assert!(step(&mut e, 13).is_empty());
        assert_eq!(
            step(&mut e, 17),
            vec![Action::PauseTraining, Action::SaveFull { step: 17 }]
        );
    }

    #[test]
    fn a_backstop_loss_before_any_save_restarts_from_the_initial_state_and_a_failed_save_retries() {
        let mut e = backstopped(2, 1, 3, 4);
        e.on(&lost(0));
        assert_eq!(
            e.on(&lost(1)),
            vec![
                Action::PauseTraining,
                Action::RestoreAll { checkpoint: None }
            ]
        );
        e.on(&Event::RestoreFinished {
            step: 0,
            now_s: 1.0,
        });
        assert_eq!(
            step(&mut e, 4),
            vec![Action::PauseTraining, Action::SaveFull { step: 4 }]
        );
        assert_eq!(
            e.on(&Event::SaveFailed {
                step: 4,
                reason: "disk".into()
            }),
            vec![Action::ResumeTraining]
        );
        assert_eq!(
            step(&mut e, 5),
            vec![Action::PauseTraining, Action::SaveFull { step: 5 }]
        );
        saved(&mut e, 5);
        // The run ends with a save of its final model, unless that step is saved already.
        assert_eq!(
            e.on(&Event::TrainingDone {
                step: 7,
                now_s: 7.0
            }),
            vec![Action::PauseTraining, Action::SaveFull { step: 7 }]
        );
        let mut e = backstopped(2, 1, 3, 4);
        step(&mut e, 4);
        saved(&mut e, 4);
        assert!(e
            .on(&Event::TrainingDone {
                step: 4,
                now_s: 4.0
            })
            .is_empty());
        assert!(EcRec::new(EcRecConfig {
            servers: 3,
            k: 2,
            r: 1,
            backstop_every_steps: Some(0)
        })
        .is_err());
    }
}

//! `ecrec`: erasure-coded rows and replicated dense blocks in memory, so a server loss costs
//! neither a pause nor a rollback (ECRec §3.4): the lost server is replaced and rebuilt from
//! the survivors while training goes on.
//!
//! The machine decides only *what* to rebuild. It emits [`Action::Rebuild`] for every server
//! that is lost at the moment of a loss (a new loss changes the set of survivors every rebuild
//! reads from, so rebuilds under way restart against the new set; what they already rebuilt
//! stays), never [`Action::PauseTraining`] and never [`Action::RestoreAll`]. A code with `r`
//! parities survives any `r` servers lost at once; with more lost before the rebuilds finish
//! it asks to [`Action::Abort`], naming the servers, since some stripe may have lost more
//! members than it can decode (the cluster may still fall back to a checkpoint if it runs one).

use std::collections::{BTreeMap, BTreeSet};

use ftrec_core::ServerId;

use crate::machine::{Action, Event, Strategy};
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
}

/// The `ecrec` strategy's state.
#[derive(Debug, Clone)]
pub struct EcRec {
    cfg: EcRecConfig,
    /// Lost servers whose replacement has not finished its rebuild, with the failed attempts.
    rebuilding: BTreeMap<ServerId, u32>,
    last_step: u64,
    aborted: bool,
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
        Ok(EcRec {
            cfg,
            rebuilding: BTreeMap::new(),
            last_step: 0,
            aborted: false,
        })
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

    /// ECRec §3.4: a loss costs neither a pause nor a rollback.
    fn keeps_model_on_loss(&self) -> bool {
        true
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        if self.aborted {
            return Vec::new();
        }
        match event {
            Event::StepDone { step, .. } => {
                self.last_step = *step;
                Vec::new()
            }
            Event::ServerLost { server, now_s } => {
                if server.0 >= self.cfg.servers {
                    return self.abort(format!(
                        "server {} was reported lost but the cluster has {} servers",
                        server.0, self.cfg.servers
                    ));
                }
                // A replacement that dies during its rebuild is simply lost again.
                self.rebuilding.insert(*server, 0);
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
        EcRec::new(EcRecConfig { servers: n, k, r }).unwrap()
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
                EcRec::new(EcRecConfig { servers: n, k, r }),
                Err(StrategyError::InvalidConfig(_))
            ));
        }
        let mut e = s(2, 1, 3);
        assert!(matches!(&e.on(&lost(7))[..], [Action::Abort { .. }]));
    }
}

//! `cpr` in the cluster (cpr.txt §2.3, §4): flags to a [`StrategyChoice::Cpr`], the servers'
//! priority rule ([`ServerPriority`], carried in their [`crate::CkptSpec`]) and the strategy
//! machine the coordinator runs.
//!
//! The servers run the checkpoint service (as for `deck`): a full save writes every shard; with
//! a priority rule, every save after the first full is a prioritized save, at most `r` of the
//! rows of the largest tables (those each server's rule values most) and the other tables
//! whole (CPR §5.1). A loss replaces the lost servers and restores their shards alone from the
//! chain of the newest full and the saves after it, each row from the newest save holding it,
//! while the survivors and the workers carry on: no rollback, no redone step.

use ftrec_ckpt::cpr::{Priority, PriorityConfig};
pub use ftrec_strategy::cpr::DEFAULT_R;
use ftrec_strategy::cpr::{CprConfig, CprInterval, DEFAULT_MIN_BENEFIT};
use ftrec_strategy::{Cpr, Strategy};
use serde::{Deserialize, Serialize};

use crate::{ClusterError, RunConfig, StrategyChoice};

/// The paper's SSU sampling period (CPR §5.1).
pub const DEFAULT_SSU_PERIOD: u32 = 2;
/// The paper prioritizes the 7 largest tables (CPR §5.1).
pub const DEFAULT_LARGEST_TABLES: usize = ftrec_ps::ckpt::cpr::DEFAULT_LARGEST_TABLES;
/// Full-save interval when neither a target PLS nor a step count is given (as `full`'s).
pub const DEFAULT_EVERY_STEPS: u64 = 100;

/// A server's priority rule (CPR §4.2): part of its checkpoint service's spec.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServerPriority {
    pub priority: Priority,
    pub r: f64,
    pub ssu_period: u32,
    pub largest_tables: usize,
}

impl ServerPriority {
    /// The rule of strategy `cpr` with a priority; `None` for any other strategy.
    pub fn of_strategy(s: &StrategyChoice) -> Option<ServerPriority> {
        match *s {
            StrategyChoice::Cpr {
                priority: Some(priority),
                r,
                ssu_period,
                largest_tables,
                ..
            } => Some(ServerPriority {
                priority,
                r,
                ssu_period,
                largest_tables,
            }),
            _ => None,
        }
    }

    /// The tracker options of server `id` (SSU's discards seeded per server).
    pub fn options(&self, seed: u64, id: u32) -> ftrec_ps::ckpt::cpr::PriorityOptions {
        ftrec_ps::ckpt::cpr::PriorityOptions {
            config: PriorityConfig {
                priority: self.priority,
                r: self.r,
                ssu_period: self.ssu_period,
                seed: ftrec_core::rng::hash3(seed, 0xc9_7200, id as u64),
            },
            largest_tables: self.largest_tables,
        }
    }

    pub fn validate(&self) -> Result<(), ClusterError> {
        PriorityConfig {
            priority: self.priority,
            r: self.r,
            ssu_period: self.ssu_period,
            seed: 0,
        }
        .validate()
        .map_err(|e| ClusterError::Config(format!("--cpr-priority: {e}")))?;
        if self.largest_tables == 0 {
            return Err(ClusterError::Config(
                "--cpr-tables must be at least 1 (the tables whose rows are prioritized)".into(),
            ));
        }
        Ok(())
    }

    /// The server flags that rebuild this rule.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--cpr-priority".into(),
            self.priority.name().into(),
            "--cpr-r".into(),
            self.r.to_string(),
            "--cpr-ssu-period".into(),
            self.ssu_period.to_string(),
            "--cpr-tables".into(),
            self.largest_tables.to_string(),
        ]
    }
}

/// The `cpr` flags as given (`ftrec run`, job files), before validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CprFlags {
    /// `--cpr-priority none|mfu|ssu|scar`.
    pub priority: Option<String>,
    /// `--target-pls`.
    pub target_pls: Option<f64>,
    /// `--mtbf-s`.
    pub mtbf_s: Option<f64>,
    /// `--ckpt-every-steps` (shared with `full`).
    pub every_steps: Option<u64>,
    /// `--cpr-r`.
    pub r: Option<f64>,
    /// `--cpr-saves-per-full`.
    pub saves_per_full: Option<u64>,
    /// `--cpr-ssu-period`.
    pub ssu_period: Option<u32>,
    /// `--cpr-tables`.
    pub largest_tables: Option<usize>,
}

impl CprFlags {
    /// The names of the `cpr`-only flags given (not `--ckpt-every-steps`), for errors.
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.priority.is_some(), "--cpr-priority"),
            (self.target_pls.is_some(), "--target-pls"),
            (self.mtbf_s.is_some(), "--mtbf-s"),
            (self.r.is_some(), "--cpr-r"),
            (self.saves_per_full.is_some(), "--cpr-saves-per-full"),
            (self.ssu_period.is_some(), "--cpr-ssu-period"),
            (self.largest_tables.is_some(), "--cpr-tables"),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect()
    }

    /// Strategy `cpr` with these flags: the paper's defaults (r = 0.125, a save point 1/r
    /// times per save interval, SSU period 2, the 7 largest tables) where not given. Every
    /// bad combination is one error naming the flags.
    pub fn strategy(&self) -> Result<StrategyChoice, ClusterError> {
        let bad = |m: String| Err(ClusterError::Config(m));
        let priority = match self.priority.as_deref() {
            None | Some("none") => None,
            Some(p) => Some(p.parse::<Priority>().map_err(|_| {
                ClusterError::Config(format!(
                    "--cpr-priority {p:?}: expected none, mfu, ssu or scar"
                ))
            })?),
        };
        let interval =
            match (self.target_pls, self.mtbf_s, self.every_steps) {
                (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                    return bad(
                        "--target-pls/--mtbf-s and --ckpt-every-steps both set the save interval: \
                     give one"
                            .into(),
                    )
                }
                (Some(pls), Some(mtbf_s), None) => CprInterval::TargetPls { pls, mtbf_s },
                (Some(_), None, None) => return bad(
                    "--target-pls needs --mtbf-s (CPR Eq. 4: T_save = 2 * PLS * servers * MTBF)"
                        .into(),
                ),
                (None, Some(_), None) => {
                    return bad("--mtbf-s needs --target-pls (or use --ckpt-every-steps)".into())
                }
                (None, None, n) => CprInterval::Steps(n.unwrap_or(DEFAULT_EVERY_STEPS)),
            };
        if let CprInterval::TargetPls { pls, mtbf_s } = interval {
            if !(pls.is_finite() && pls > 0.0 && pls <= 1.0) {
                return bad(format!("--target-pls {pls} must be in (0, 1]"));
            }
            if !(mtbf_s.is_finite() && mtbf_s > 0.0) {
                return bad(format!(
                    "--mtbf-s {mtbf_s} must be a positive number of seconds"
                ));
            }
        }
        if priority.is_none() {
            let only: Vec<&str> = [
                (self.r.is_some(), "--cpr-r"),
                (self.saves_per_full.is_some(), "--cpr-saves-per-full"),
                (self.ssu_period.is_some(), "--cpr-ssu-period"),
                (self.largest_tables.is_some(), "--cpr-tables"),
            ]
            .into_iter()
            .filter_map(|(on, f)| on.then_some(f))
            .collect();
            if !only.is_empty() {
                return bad(format!(
                    "{} apply to prioritized saves: add --cpr-priority mfu, ssu or scar",
                    only.join(", ")
                ));
            }
        }
        if self.ssu_period.is_some() && priority != Some(Priority::Ssu) {
            return bad("--cpr-ssu-period applies to --cpr-priority ssu only".into());
        }
        let r = self.r.unwrap_or(DEFAULT_R);
        if !(r.is_finite() && r > 0.0 && r <= 1.0) {
            return bad(format!("--cpr-r {r} must be in (0, 1]"));
        }
        let saves_per_full = self
            .saves_per_full
            .unwrap_or_else(|| ((1.0 / r).round() as u64).max(1));
        if saves_per_full == 0 {
            return bad("--cpr-saves-per-full must be at least 1".into());
        }
        let choice = StrategyChoice::Cpr {
            interval,
            priority,
            r,
            saves_per_full: if priority.is_some() {
                saves_per_full
            } else {
                1
            },
            ssu_period: self.ssu_period.unwrap_or(DEFAULT_SSU_PERIOD),
            largest_tables: self.largest_tables.unwrap_or(DEFAULT_LARGEST_TABLES),
        };
        if let Some(p) = ServerPriority::of_strategy(&choice) {
            p.validate()?;
        }
        Ok(choice)
    }
}

/// What each of `servers` servers' prioritized save `id` left out, as the servers wrote it
/// beside the save's files ([`ftrec_ckpt::cpr::Coverage`]); a server whose report is missing or
/// unreadable is left out (the strategy then reports that PLS unknown).
pub(crate) async fn read_coverage(
    ckpts: &ftrec_ckpt::Checkpoints,
    id: &ftrec_ckpt::CheckpointId,
    servers: u32,
) -> Vec<ftrec_strategy::ShardCoverage> {
    let dir = ckpts.checkpoint_dir(id);
    let mut out = Vec::new();
    for s in 0..servers {
        let Ok(key) = dir.join(&ftrec_ckpt::cpr::Coverage::file_name(s)) else {
            continue;
        };
        let Ok(bytes) = ckpts.store().get(&key).await else {
            continue;
        };
        if let Ok(c) = ftrec_ckpt::cpr::Coverage::from_json(&bytes) {
            out.push(ftrec_strategy::ShardCoverage {
                server: ftrec_core::ServerId(s),
                since_step: c.since_step,
                updates: c.updates,
                uncovered: c.uncovered,
            });
        }
    }
    out
}

/// Check a `cpr` run (nothing to check for other strategies).
pub(crate) fn validate_run(cfg: &RunConfig) -> Result<(), ClusterError> {
    if let StrategyChoice::Cpr { .. } = cfg.strategy {
        // Builds the machine: every interval and share is checked there.
        strategy(cfg)?;
        if let Some(p) = ServerPriority::of_strategy(&cfg.strategy) {
            p.validate()?;
        }
        if cfg.ckpt_chunk_kib == 0 {
            return Err(ClusterError::Config(
                "--ckpt-chunk-kib must be at least 1".into(),
            ));
        }
    }
    Ok(())
}

/// The `cpr` machine of a run: the interval, `N_emb` = the servers, `S_total` = the steps;
/// in synchronous mode every save commits before training goes on, so what a loss restores
/// does not depend on upload speed.
pub(crate) fn strategy(cfg: &RunConfig) -> Result<Box<dyn Strategy>, ClusterError> {
    let StrategyChoice::Cpr {
        interval,
        r,
        saves_per_full,
        ..
    } = cfg.strategy
    else {
        return Err(ClusterError::Config(format!(
            "strategy {} is not cpr",
            cfg.strategy.name()
        )));
    };
    let machine = Cpr::new(CprConfig {
        interval,
        saves_per_full,
        r,
        n_emb: cfg.servers,
        total_steps: cfg.steps,
        await_commit: cfg.sync,
        min_benefit: DEFAULT_MIN_BENEFIT,
    })
    .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok(Box::new(machine))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> CprFlags {
        CprFlags::default()
    }

    #[test]
    fn defaults_are_the_papers() {
        let s = CprFlags {
            priority: Some("mfu".into()),
            ..flags()
        }
        .strategy()
        .unwrap();
        assert_eq!(
            s,
            StrategyChoice::Cpr {
                interval: CprInterval::Steps(DEFAULT_EVERY_STEPS),
                priority: Some(Priority::Mfu),
                r: 0.125,
                saves_per_full: 8,
                ssu_period: 2,
                largest_tables: 7,
            }
        );
        let p = ServerPriority::of_strategy(&s).unwrap();
        assert_eq!(p.to_args()[..2], ["--cpr-priority", "mfu"]);
        // Vanilla: one save point per interval, no server rule.
        let v = CprFlags {
            target_pls: Some(0.1),
            mtbf_s: Some(60.0),
            ..flags()
        }
        .strategy()
        .unwrap();
        assert!(matches!(
            v,
            StrategyChoice::Cpr {
                interval: CprInterval::TargetPls { .. },
                priority: None,
                saves_per_full: 1,
                ..
            }
        ));
        assert_eq!(ServerPriority::of_strategy(&v), None);
    }

    #[test]
    fn bad_combinations_are_one_clear_error() {
        for (f, what) in [
            (
                CprFlags {
                    target_pls: Some(0.1),
                    ..flags()
                },
                "--target-pls needs --mtbf-s",
            ),
            (
                CprFlags {
                    mtbf_s: Some(10.0),
                    ..flags()
                },
                "--mtbf-s needs --target-pls",
            ),
            (
                CprFlags {
                    target_pls: Some(0.1),
                    mtbf_s: Some(10.0),
                    every_steps: Some(5),
                    ..flags()
                },
                "give one",
            ),
            (
                CprFlags {
                    target_pls: Some(2.0),
                    mtbf_s: Some(10.0),
                    ..flags()
                },
                "--target-pls 2",
            ),
            (
                CprFlags {
                    priority: Some("lru".into()),
                    ..flags()
                },
                "expected none, mfu, ssu or scar",
            ),
            (
                CprFlags {
                    r: Some(0.25),
                    ..flags()
                },
                "--cpr-r apply to prioritized saves",
            ),
            (
                CprFlags {
                    priority: Some("mfu".into()),
                    ssu_period: Some(4),
                    ..flags()
                },
                "ssu only",
            ),
            (
                CprFlags {
                    priority: Some("scar".into()),
                    r: Some(0.0),
                    ..flags()
                },
                "--cpr-r 0",
            ),
            (
                CprFlags {
                    priority: Some("ssu".into()),
                    largest_tables: Some(0),
                    ..flags()
                },
                "--cpr-tables",
            ),
        ] {
            match f.strategy() {
                Err(ClusterError::Config(m)) => {
                    assert!(m.contains(what), "{m:?} lacks {what:?}");
                    assert!(!m.contains('\n'));
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}

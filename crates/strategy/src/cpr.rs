//! `cpr`: checkpoints with partial recovery, steered by the portion of lost samples
//! (cpr.txt §2.3, §4).
//!
//! A lost server gets a replacement that loads *its own shard only* from the newest saves of
//! that shard; every survivor keeps its rows and the workers go on from where they are, so no
//! step is redone (CPR §2.3, Eq. 2 has no lost-computation term). The price is model
//! inconsistency, which CPR measures as the *portion of lost samples* (PLS, Eq. 3): per
//! failure, the samples trained since the lost shard's restored save, over all samples of the
//! run, times the share of the model that shard holds (`1 / N_emb`).
//!
//! The machine decides:
//! - **when to save** (§4.1): CPR-vanilla takes a full save of every shard every `T_save`,
//!   either a fixed number of steps or `T_save,part = 2 · PLS · N_emb · T_fail` for a target
//!   PLS and an MTBF (Eq. 4 solved for the interval, [`crate::policy::interval_for_pls`]);
//! - **prioritized saves instead of full saves** (§4.2, §5.1: MFU / SSU / SCAR): with a
//!   priority rule on, a save point comes `saves_per_full` times per interval `T_save` (the
//!   paper: `1/r = 8`, "8 times more frequently but, at most, only 1/8 of the parameters").
//!   The first save is a full (prioritized saves apply on top of it); every later one is a
//!   prioritized save ([`Action::SavePartial`]): the servers write at most `r` of the rows of
//!   the prioritized (largest) tables, the rows their rule values most (access counts, a
//!   sub-sampled list or the size of each row's change: the servers' business), and every
//!   other table whole. No periodic full follows: a row is as new as the newest save that
//!   chose it;
//! - **whether partial recovery pays** (§4.2): with a target PLS, once the first save measured
//!   `O_save`, the expected overheads of full recovery at Young's interval (Eq. 1) and of
//!   partial recovery at the PLS interval (Eq. 2, with the prioritized saves' cost) are
//!   compared. The load and rescheduling terms are the same in both and cancel. If partial
//!   recovery does not save at least [`CprConfig::min_benefit`] of full recovery's overhead,
//!   the machine falls back to full recovery (full saves at Young's interval,
//!   [`Action::RestoreAll`]) for the rest of the run;
//! - **what a loss restores**: [`Action::RestorePartial`] with the newest committed save (the
//!   head of the chain full + prioritized saves; a row comes from the newest save holding it).
//!
//! Saves are scheduled from the newest *commit*: a save lost with a server, or one that
//! failed, does not move the schedule, so the next one comes at the first step it may.
//!
//! PLS comes in two figures. Eq. 3 as the paper writes it counts, per failure, the steps since
//! the newest committed save. With prioritized saves a row the newest save did not choose is
//! older than that save, so the machine also counts *what was saved*: per row of the lost
//! shard, the updates since the newest save holding it, summed ([`Event::SaveCoverage`] brings
//! each server's sum at each prioritized save), turned into steps by the server's row updates
//! per step, plus the steps since that save, over `S_total · N_emb` as Eq. 3 does. With every
//! row saved at once (full saves, CPR-vanilla) the two figures are equal.
//!
//! One save is in flight at a time; a save point reached while one uploads is taken at the
//! first step after it commits. The run ends with a full save of its last step
//! ([`Event::TrainingDone`]), so the store holds the model the run ends with. With [`CprConfig::await_commit`] (deterministic mode) every
//! save is followed by [`Action::AwaitSave`], so what a later loss restores never depends on
//! how fast uploads ran.

use serde::{Deserialize, Serialize};

use crate::machine::{Action, CheckpointRef, Event, ShardCoverage, Strategy};
use crate::policy::{
    expected_pls, full_recovery_overhead, interval_for_pls, partial_recovery_overhead,
    young_interval,
};
use crate::StrategyError;

/// How often a full save of every shard is taken.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CprInterval {
    /// Every `n` steps.
    Steps(u64),
    /// Every `2 · pls · N_emb · mtbf_s` seconds of training (CPR §4.1, Eq. 4).
    TargetPls { pls: f64, mtbf_s: f64 },
}

/// How `cpr` is configured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CprConfig {
    pub interval: CprInterval,
    /// Save points per interval `T_save` when prioritized saves are on (CPR §5.1: 8 times as
    /// often as full recovery saves, each a prioritized save after the first full); 1 turns
    /// prioritized saves off (CPR-vanilla: a full every `T_save`).
    pub saves_per_full: u64,
    /// Share of a prioritized table's rows one prioritized save writes (`r`, CPR §4.2); only
    /// used here to price prioritized saves in the benefit analysis.
    pub r: f64,
    /// Embedding servers (`N_emb`).
    pub n_emb: u32,
    /// Steps of the whole run (`S_total`, in steps: every step has the same samples).
    pub total_steps: u64,
    /// Follow every save with [`Action::AwaitSave`] (deterministic mode).
    pub await_commit: bool,
    /// Fall back to full recovery unless partial recovery's expected overhead is at least this
    /// share below full recovery's (CPR §4.2 says "small or no benefit" without a number).
    pub min_benefit: f64,
}

impl CprConfig {
    /// CPR-vanilla (no prioritized saves) with `interval`.
    pub fn vanilla(interval: CprInterval, n_emb: u32, total_steps: u64) -> CprConfig {
        CprConfig {
            interval,
            saves_per_full: 1,
            r: DEFAULT_R,
            n_emb,
            total_steps,
            await_commit: false,
            min_benefit: DEFAULT_MIN_BENEFIT,
        }
    }

    /// The full-save interval in seconds (`None` for a fixed step count).
    pub fn full_interval_s(&self) -> Option<f64> {
        match self.interval {
            CprInterval::Steps(_) => None,
            CprInterval::TargetPls { pls, mtbf_s } => {
                Some(interval_for_pls(pls, mtbf_s, self.n_emb))
            }
        }
    }

    fn prioritized(&self) -> bool {
        self.saves_per_full > 1
    }
}

/// The paper's share of rows per prioritized save (CPR §5.1, `r = 0.125`).
pub const DEFAULT_R: f64 = 0.125;
/// The default for [`CprConfig::min_benefit`].
pub const DEFAULT_MIN_BENEFIT: f64 = 0.1;

/// One failure's PLS increment (CPR Eq. 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlsFailure {
    pub server: u32,
    /// Steps applied when the loss was reported.
    pub step: u64,
    /// Step of the newest committed full save, which every row of the lost shard is at least
    /// as new as (0: the initial state).
    pub full_step: u64,
    /// Step of the newest committed save of any kind: Eq. 3's `S_last chkpt`.
    pub newest_save_step: u64,
    /// `step - newest_save_step`: Eq. 3's lost steps. With prioritized saves a row may be
    /// older than the newest save (only `r` of a large table's rows are in each).
    pub steps_lost: u64,
    /// The lost share of each sample's effect: `1 / N_emb` (Eq. 3; the round-robin shard map
    /// spreads every table's rows, hot ones included, evenly over the servers).
    pub share: f64,
    /// `steps_lost / total_steps * share`.
    pub pls: f64,
    /// Counting what was saved: the lost shard's updates since the newest save holding each
    /// row, in steps of that shard's updates, plus `steps_lost` (`None`: a save did not report
    /// what it left out).
    pub saved_steps_lost: Option<f64>,
    /// `saved_steps_lost / total_steps * share`.
    pub saved_pls: Option<f64>,
}

/// The §4.2 benefit analysis, made once `O_save` is measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BenefitAnalysis {
    /// Measured seconds of one full save.
    pub o_save_s: f64,
    /// Young's interval for full recovery, `sqrt(2 O_save T_fail)`.
    pub t_save_full_s: f64,
    /// The PLS interval, `2 PLS N_emb T_fail`.
    pub t_save_part_s: f64,
    /// Eq. 1's save + lost terms per second of training at `t_save_full_s`.
    pub full_overhead: f64,
    /// Eq. 2's save term per second of training at `t_save_part_s` (prioritized saves
    /// included); load and rescheduling are the same for both and left out.
    pub partial_overhead: f64,
    /// Partial recovery was not worth it: the run fell back to full recovery.
    pub fallback: bool,
}

/// Interval and its inputs, for the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntervalReport {
    /// `steps` or `target_pls`.
    pub kind: String,
    /// Full saves every this many steps (`kind = steps`).
    pub full_every_steps: Option<u64>,
    /// Full saves every this many seconds (`kind = target_pls`, or Young's after a fallback).
    pub full_every_s: Option<f64>,
    pub target_pls: Option<f64>,
    pub mtbf_s: Option<f64>,
    pub n_emb: u32,
    pub saves_per_full: u64,
    /// Eq. 4's expected PLS at the chosen interval (time-based intervals only).
    pub expected_pls: Option<f64>,
}

/// PLS over the run (CPR Eq. 3), and the same sum counting what was saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlsReport {
    /// Eq. 3 as the paper writes it.
    pub total: f64,
    /// The sum of every failure's `saved_pls` (`None` if one is unknown).
    pub saved_total: Option<f64>,
    pub per_failure: Vec<PlsFailure>,
}

/// What `cpr` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CprReport {
    /// `partial`, or `full` after the benefit analysis fell back.
    pub recovery: String,
    pub interval: IntervalReport,
    pub benefit: Option<BenefitAnalysis>,
    pub pls: PlsReport,
    pub full_saves: u64,
    pub partial_saves: u64,
    pub failed_saves: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Training,
    Saving {
        step: u64,
        full: bool,
        /// When it started (step, seconds): the schedule's new origin once it commits.
        started_s: f64,
    },
    Recovering,
}

/// The `cpr` strategy's state.
#[derive(Debug, Clone)]
pub struct Cpr {
    cfg: CprConfig,
    phase: Phase,
    /// Fell back to full recovery (§4.2).
    fallback: bool,
    benefit: Option<BenefitAnalysis>,
    /// Newest committed save: what a loss restores.
    committed: Option<CheckpointRef>,
    /// Step of the newest committed full save.
    full_step: Option<u64>,
    /// Where the newest committed full save started (step, seconds) and the newest committed
    /// save of any kind: the schedule runs from commits only, so a save lost to a failure
    /// (or that failed) leaves the next one due where it was.
    last_full: (u64, f64),
    last_save: (u64, f64),
    last_step: u64,
    full_costs: Vec<f64>,
    failures: Vec<PlsFailure>,
    full_saves: u64,
    partial_saves: u64,
    failed_saves: u64,
    /// The committed state is no base for a prioritized save (resumed onto another number of
    /// servers): the next save is a full.
    need_full: bool,
    /// Per server, what the newest committed save left out, in steps of its updates (`None`:
    /// unknown).
    uncovered_steps: Vec<Option<f64>>,
    /// Per server, where its process began counting updates (a replacement: its restore).
    counting_from: Vec<u64>,
    /// The reports of the save in flight.
    coverage: Vec<ShardCoverage>,
}

impl Cpr {
    pub fn new(cfg: CprConfig) -> Result<Self, StrategyError> {
        let bad = |m: String| Err(StrategyError::InvalidConfig(m));
        match cfg.interval {
            CprInterval::Steps(0) => return bad("cpr: a full save every 0 steps".into()),
            CprInterval::Steps(_) => {}
            CprInterval::TargetPls { pls, mtbf_s } => {
                if !(pls.is_finite() && pls > 0.0 && pls <= 1.0) {
                    return bad(format!("cpr: target PLS {pls} must be in (0, 1]"));
                }
                if !(mtbf_s.is_finite() && mtbf_s > 0.0) {
                    return bad(format!(
                        "cpr: MTBF {mtbf_s} must be a positive number of seconds"
                    ));
                }
            }
        }
        if cfg.saves_per_full == 0 {
            return bad("cpr: 0 save points per full interval (1 turns priority off)".into());
        }
        if !(cfg.r.is_finite() && cfg.r > 0.0 && cfg.r <= 1.0) {
            return bad(format!("cpr: r = {} must be in (0, 1]", cfg.r));
        }
        if cfg.n_emb == 0 {
            return bad("cpr: no embedding servers".into());
        }
        if cfg.total_steps == 0 {
            return bad("cpr: a run of 0 steps".into());
        }
        if !(cfg.min_benefit.is_finite() && (0.0..1.0).contains(&cfg.min_benefit)) {
            return bad(format!(
                "cpr: minimum benefit {} must be in [0, 1)",
                cfg.min_benefit
            ));
        }
        Ok(Cpr {
            cfg,
            phase: Phase::Training,
            fallback: false,
            benefit: None,
            committed: None,
            full_step: None,
            last_full: (0, 0.0),
            last_save: (0, 0.0),
            last_step: 0,
            full_costs: Vec::new(),
            failures: Vec::new(),
            full_saves: 0,
            partial_saves: 0,
            failed_saves: 0,
            need_full: false,
            uncovered_steps: vec![Some(0.0); cfg.n_emb as usize],
            counting_from: vec![0; cfg.n_emb as usize],
            coverage: Vec::new(),
        })
    }

    pub fn config(&self) -> &CprConfig {
        &self.cfg
    }

    /// The newest committed save.
    pub fn committed(&self) -> Option<&CheckpointRef> {
        self.committed.as_ref()
    }

    /// Whether the benefit analysis fell back to full recovery.
    pub fn fell_back(&self) -> bool {
        self.fallback
    }

    /// The PLS of every failure so far and their sum (Eq. 3), both ways.
    pub fn pls(&self) -> PlsReport {
        PlsReport {
            total: self.failures.iter().map(|f| f.pls).sum(),
            saved_total: self.failures.iter().map(|f| f.saved_pls).sum(),
            per_failure: self.failures.clone(),
        }
    }

    /// A save of `step` committed: what it left out per server (nothing for a full).
    fn note_coverage(&mut self, step: u64, full: bool) {
        let reports = std::mem::take(&mut self.coverage);
        for (j, u) in self.uncovered_steps.iter_mut().enumerate() {
            *u = if full {
                Some(0.0)
            } else {
                reports
                    .iter()
                    .find(|c| c.server.0 as usize == j)
                    .and_then(|c| {
                        let from = c.since_step.unwrap_or(self.counting_from[j]);
                        let steps = step.saturating_sub(from);
                        if c.uncovered == 0 {
                            Some(0.0)
                        } else if c.updates == 0 || steps == 0 {
                            None
                        } else {
                            // Updates per step of this server over the report's window.
                            Some(c.uncovered as f64 * steps as f64 / c.updates as f64)
                        }
                    })
            };
        }
    }

    /// Mean measured cost of a full save.
    fn o_save(&self) -> Option<f64> {
        (!self.full_costs.is_empty())
            .then(|| self.full_costs.iter().sum::<f64>() / self.full_costs.len() as f64)
    }

    /// Whether a full save is due at `step`, `now_s`.
    fn full_due(&self, step: u64, now_s: f64) -> bool {
        if self.fallback {
            let mtbf = match self.cfg.interval {
                CprInterval::TargetPls { mtbf_s, .. } => mtbf_s,
                CprInterval::Steps(_) => return false,
            };
            let t = young_interval(self.o_save().unwrap_or(0.0), mtbf);
            return now_s - self.last_full.1 >= t;
        }
        // CPR §5.1: with priority, prioritized saves take the place of full saves.
        if self.cfg.prioritized() {
            return false;
        }
        match self.cfg.interval {
            CprInterval::Steps(n) => step >= self.last_full.0 + n,
            CprInterval::TargetPls { .. } => {
                now_s - self.last_full.1 >= self.cfg.full_interval_s().unwrap_or(f64::INFINITY)
            }
        }
    }

    /// Whether a save point is due (partial recovery with priority only): the first is a full,
    /// the others prioritized saves.
    fn partial_due(&self, step: u64, now_s: f64) -> bool {
        if self.fallback || !self.cfg.prioritized() {
            return false;
        }
        let k = self.cfg.saves_per_full;
        match self.cfg.interval {
            CprInterval::Steps(n) => step >= self.last_save.0 + (n / k).max(1),
            CprInterval::TargetPls { .. } => {
                let t = self.cfg.full_interval_s().unwrap_or(f64::INFINITY) / k as f64;
                now_s - self.last_save.1 >= t
            }
        }
    }

    fn save(&mut self, step: u64, now_s: f64, full: bool) -> Vec<Action> {
        self.phase = Phase::Saving {
            step,
            full,
            started_s: now_s,
        };
        let save = if full {
            Action::SaveFull { step }
        } else {
            Action::SavePartial { step }
        };
        let mut out = vec![Action::PauseTraining, save];
        if self.cfg.await_commit {
            out.push(Action::AwaitSave);
        }
        out.push(Action::ResumeTraining);
        out
    }

    /// CPR §4.2: decide once, after the first full save measured `O_save`.
    fn analyse(&mut self) {
        let (pls, mtbf) = match self.cfg.interval {
            CprInterval::TargetPls { pls, mtbf_s } => (pls, mtbf_s),
            CprInterval::Steps(_) => return,
        };
        if self.benefit.is_some() {
            return;
        }
        let Some(o_save) = self.o_save() else { return };
        let t_part = interval_for_pls(pls, mtbf, self.cfg.n_emb);
        let t_full = young_interval(o_save, mtbf);
        // Per second of training (T_total = 1); load and rescheduling cancel.
        let full = full_recovery_overhead(o_save, 0.0, 0.0, t_full, mtbf, 1.0);
        // Per interval: one vanilla full, or `k` prioritized saves of at most `r` of the
        // model each (CPR §5.1 prices them so: the prioritized tables are 99.6% of the rows).
        let o_part = if self.cfg.prioritized() {
            o_save * self.cfg.saves_per_full as f64 * self.cfg.r
        } else {
            o_save
        };
        let part = partial_recovery_overhead(o_part, 0.0, 0.0, t_part, mtbf, 1.0);
        // NaN (a degenerate measurement) counts as no benefit.
        let pays = part.total() <= full.total() * (1.0 - self.cfg.min_benefit);
        let fallback = !pays;
        self.benefit = Some(BenefitAnalysis {
            o_save_s: o_save,
            t_save_full_s: t_full,
            t_save_part_s: t_part,
            full_overhead: full.total(),
            partial_overhead: part.total(),
            fallback,
        });
        self.fallback = fallback;
    }

    fn lost(&mut self, server: u32) -> Vec<Action> {
        if self.fallback {
            return vec![Action::RestoreAll {
                checkpoint: self.committed.clone(),
            }];
        }
        let full_step = self.full_step.unwrap_or(0);
        let newest_save_step = self.committed.as_ref().map_or(0, |c| c.step);
        let steps_lost = self.last_step.saturating_sub(newest_save_step);
        let share = 1.0 / self.cfg.n_emb as f64;
        let saved_steps_lost = self
            .uncovered_steps
            .get(server as usize)
            .copied()
            .flatten()
            .map(|u| u + steps_lost as f64);
        let total = self.cfg.total_steps as f64;
        self.failures.push(PlsFailure {
            server,
            step: self.last_step,
            full_step,
            newest_save_step,
            steps_lost,
            share,
            pls: steps_lost as f64 / total * share,
            saved_steps_lost,
            saved_pls: saved_steps_lost.map(|s| s / total * share),
        });
        // The replacement counts its updates from here; what was lost before is this
        // failure's (a second loss before the next save counts it again, as Eq. 3 does).
        if let Some(c) = self.counting_from.get_mut(server as usize) {
            *c = self.last_step;
        }
        vec![Action::RestorePartial {
            servers: vec![ftrec_core::ServerId(server)],
            checkpoint: self.committed.clone(),
        }]
    }

    /// What the run reports about `cpr`.
    pub fn report(&self) -> CprReport {
        let (kind, steps, target, mtbf) = match self.cfg.interval {
            CprInterval::Steps(n) => ("steps", Some(n), None, None),
            CprInterval::TargetPls { pls, mtbf_s } => ("target_pls", None, Some(pls), Some(mtbf_s)),
        };
        let every_s = match (self.fallback, mtbf) {
            (true, Some(m)) => self.o_save().map(|o| young_interval(o, m)),
            _ => self.cfg.full_interval_s(),
        };
        CprReport {
            recovery: if self.fallback { "full" } else { "partial" }.into(),
            interval: IntervalReport {
                kind: kind.into(),
                full_every_steps: steps,
                full_every_s: every_s,
                target_pls: target,
                mtbf_s: mtbf,
                n_emb: self.cfg.n_emb,
                saves_per_full: if self.fallback {
                    1
                } else {
                    self.cfg.saves_per_full
                },
                expected_pls: match (every_s, mtbf) {
                    (Some(t), Some(m)) if !self.fallback => {
                        Some(expected_pls(t, m, self.cfg.n_emb))
                    }
                    _ => None,
                },
            },
            benefit: self.benefit,
            pls: self.pls(),
            full_saves: self.full_saves,
            partial_saves: self.partial_saves,
            failed_saves: self.failed_saves,
        }
    }
}

impl Strategy for Cpr {
    fn name(&self) -> &'static str {
        "cpr"
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        match (event, self.phase) {
            (Event::StepDone { step, now_s }, Phase::Training) => {
                self.last_step = *step;
                // Partial saves apply on top of a full: the first save is always one.
                let need_base = self.committed.is_none() || self.need_full;
                if self.full_due(*step, *now_s) {
                    self.save(*step, *now_s, true)
                } else if self.partial_due(*step, *now_s) {
                    self.save(*step, *now_s, need_base)
                } else {
                    Vec::new()
                }
            }
            (Event::StepDone { step, .. }, _) => {
                self.last_step = *step;
                Vec::new()
            }
            (
                Event::SaveFinished {
                    checkpoint, cost_s, ..
                },
                Phase::Saving {
                    step,
                    full,
                    started_s,
                },
            ) if checkpoint.step == step => {
                self.committed = Some(checkpoint.clone());
                self.phase = Phase::Training;
                self.last_save = (step, started_s);
                if full {
                    self.last_full = (step, started_s);
                }
                self.note_coverage(step, full);
                if full {
                    self.need_full = false;
                    self.full_step = Some(step);
                    self.full_saves += 1;
                    self.full_costs.push(*cost_s);
                    self.analyse();
                } else {
                    self.partial_saves += 1;
                }
                Vec::new()
            }
            (Event::SaveCoverage { step: at, servers }, Phase::Saving { step, .. })
                if *at == step =>
            {
                self.coverage = servers.clone();
                Vec::new()
            }
            (Event::SaveFailed { step: failed, .. }, Phase::Saving { step, .. })
                if *failed == step =>
            {
                self.coverage.clear();
                // Nothing committed; the chain so far stays what a loss restores, and the
                // schedule did not move: the save is due again at the next step.
                self.failed_saves += 1;
                self.phase = Phase::Training;
                Vec::new()
            }
            (Event::ServerLost { server, .. }, Phase::Training | Phase::Saving { .. }) => {
                // A save in flight is abandoned: the lost server's part of it is gone. The
                // schedule stays at the newest commit, so the next save comes at the first
                // step after the recovery if this one was due.
                self.phase = Phase::Recovering;
                self.coverage.clear();
                let mut out = vec![Action::PauseTraining];
                out.extend(self.lost(server.0));
                out
            }
            (Event::ServerLost { server, .. }, Phase::Recovering) => self.lost(server.0),
            // The store ends at the model the run ends with (unless the last step was saved
            // already), as every saving strategy's does.
            // A prioritized save of the last step is no end state: rows it did not choose
            // are older in the store than in the model.
            (Event::TrainingDone { step, now_s }, Phase::Training)
                if self.full_step != Some(*step) =>
            {
                let mut out = self.save(*step, *now_s, true);
                // Whatever the mode, the run ends only once it is committed.
                if !out.contains(&Action::AwaitSave) {
                    out.insert(out.len() - 1, Action::AwaitSave);
                }
                out
            }
            (Event::RestoreFinished { step, now_s }, Phase::Recovering) => {
                self.phase = Phase::Training;
                if self.fallback {
                    // Full recovery rewound the model: intervals restart from the restored step.
                    self.last_step = *step;
                    self.last_full = (*step, *now_s);
                    self.last_save = (*step, *now_s);
                }
                vec![Action::ResumeTraining]
            }
            (
                Event::Resumed {
                    checkpoint,
                    continues,
                    now_s,
                },
                _,
            ) => {
                // Every row of the resumed state is at least as new as its step; intervals
                // run from there. Prioritized saves apply on top of a full of this cluster's
                // shards: restored onto another number of servers, the next save is a full.
                self.committed = Some(checkpoint.clone());
                self.full_step = Some(checkpoint.step);
                self.last_step = checkpoint.step;
                self.last_full = (checkpoint.step, *now_s);
                self.last_save = (checkpoint.step, *now_s);
                self.need_full = !*continues;
                // Fresh processes count from the resumed state.
                self.uncovered_steps.fill(Some(0.0));
                self.counting_from.fill(checkpoint.step);
                self.phase = Phase::Training;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn report(&self) -> Option<crate::machine::StrategyReport> {
        Some(crate::machine::StrategyReport::Cpr(Cpr::report(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Target PLS 0.1 at an MTBF of 60 s (a 48 s interval with 4 embedding servers), a
    /// 1000-step job, and 8 save points per interval (prioritized saves).
    fn eight_saves_per_interval() -> CprConfig {
        CprConfig {
            saves_per_full: 8,
            ..CprConfig::vanilla(
                CprInterval::TargetPls {
                    pls: 0.1,
                    mtbf_s: 60.0,
                },
                4,
                1000,
            )
        }
    }
    use ftrec_core::ServerId;

    fn ckpt(step: u64) -> CheckpointRef {
        CheckpointRef {
            id: format!("c{step}"),
            step,
        }
    }

    fn step(s: &mut Cpr, n: u64) -> Vec<Action> {
        s.on(&Event::StepDone {
            step: n,
            now_s: n as f64,
        })
    }

    fn done(s: &mut Cpr, n: u64, cost_s: f64) -> Vec<Action> {
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(n),
            cost_s,
            bytes: 1,
        })
    }

    fn lose(s: &mut Cpr, server: u32) -> Vec<Action> {
        s.on(&Event::ServerLost {
            server: ServerId(server),
            now_s: 0.0,
        })
    }

    fn steps_cfg(n: u64, saves_per_full: u64) -> CprConfig {
        CprConfig {
            saves_per_full,
            ..CprConfig::vanilla(CprInterval::Steps(n), 4, 1000)
        }
    }

    /// CPR Eq. 3 by hand: 4 embedding servers, 1000 steps. Full saves every 100 steps; a loss
    /// after step 180 lost 80 steps of a quarter of the model: 80 / 1000 / 4 = 0.02. A second
    /// loss after step 350 (full at 300): 50 / 4000 = 0.0125. Total 0.0325.
    #[test]
    fn eq3_pls_per_failure_and_accumulated() {
        let mut s = Cpr::new(steps_cfg(100, 1)).unwrap();
        for n in 1..=180 {
            let a = step(&mut s, n);
            if n == 100 {
                assert_eq!(
                    a,
                    vec![
                        Action::PauseTraining,
                        Action::SaveFull { step: 100 },
                        Action::ResumeTraining
                    ]
                );
                done(&mut s, 100, 0.5);
            } else {
                assert!(a.is_empty(), "step {n}: {a:?}");
            }
        }
        assert_eq!(
            lose(&mut s, 2),
            vec![
                Action::PauseTraining,
                Action::RestorePartial {
                    servers: vec![ServerId(2)],
                    checkpoint: Some(ckpt(100))
                }
            ]
        );
        assert_eq!(
            s.on(&Event::RestoreFinished {
                step: 180,
                now_s: 181.0
            }),
            vec![Action::ResumeTraining]
        );
        // No rewind: the interval runs on from the save at 100.
        for n in 181..=350 {
            if !step(&mut s, n).is_empty() {
                assert!(n == 200 || n == 300, "save at {n}");
                done(&mut s, n, 0.5);
            }
        }
        lose(&mut s, 0);
        let pls = s.pls();
        assert_eq!(pls.per_failure.len(), 2);
        assert_eq!(pls.per_failure[0].steps_lost, 80);
        assert_eq!(pls.per_failure[0].share, 0.25);
        assert!((pls.per_failure[0].pls - 0.02).abs() < 1e-15);
        assert_eq!(pls.per_failure[1].full_step, 300);
        assert!((pls.per_failure[1].pls - 0.0125).abs() < 1e-15);
        assert!((pls.total - 0.0325).abs() < 1e-15);
    }

    /// The PLS that counts what was saved, by hand. 4 servers, 1000 steps, a save point every
    /// 25 steps (interval 100, 4 points): a full at 25, prioritized saves at 50 and 75.
    /// - At 50, server 2 reports 500 row updates since it started (10 a step) and 120 of them
    ///   left out: 12 steps' worth. Server 1 left nothing out; servers 0 and 3 did not report.
    /// - At 75, server 2 reports 300 updates since 50 (12 a step) and 60 left out: 5 steps.
    /// - Lost after step 80: Eq. 3 counts 5 steps (80 - 75): 5 / 1000 / 4 = 0.00125; counting
    ///   what was saved, 5 + 5 = 10 steps: 0.0025. Server 1 lost then: 5 steps both ways.
    ///   Server 3: Eq. 3 only, the other figure unknown.
    /// - Server 2's replacement counts from step 80: at 100 it reports 200 updates and 40 left
    ///   out (20 steps, 10 a step: 4 steps); lost after 103: 3 + 4 = 7 steps.
    #[test]
    fn pls_counting_what_was_saved_by_hand() {
        let mut s = Cpr::new(steps_cfg(100, 4)).unwrap();
        let cov = |server: u32, since_step, updates, uncovered| ShardCoverage {
            server: ServerId(server),
            since_step,
            updates,
            uncovered,
        };
        let mut reports = vec![
            (50, vec![cov(2, None, 500, 120), cov(1, None, 400, 0)]),
            (
                75,
                vec![cov(2, Some(50), 300, 60), cov(1, Some(50), 100, 0)],
            ),
        ]
        .into_iter();
        for n in 1..=80 {
            if let Some(save) = step(&mut s, n).get(1).cloned() {
                if n == 25 {
                    assert_eq!(save, Action::SaveFull { step: 25 });
                } else {
                    assert_eq!(save, Action::SavePartial { step: n });
                    let (at, servers) = reports.next().unwrap();
                    assert_eq!(at, n);
                    assert!(s.on(&Event::SaveCoverage { step: n, servers }).is_empty());
                }
                done(&mut s, n, 0.1);
            }
        }
        assert!(reports.next().is_none());
        for server in [2, 1, 3] {
            lose(&mut s, server);
            s.on(&Event::RestoreFinished {
                step: 80,
                now_s: 80.0,
            });
        }
        for n in 81..=103 {
            if !step(&mut s, n).is_empty() {
                assert_eq!(n, 100);
                s.on(&Event::SaveCoverage {
                    step: 100,
                    servers: vec![cov(2, None, 200, 40)],
                });
                done(&mut s, 100, 0.1);
            }
        }
        lose(&mut s, 2);
        let p = s.pls();
        let got: Vec<(u32, u64, Option<f64>)> = p
            .per_failure
            .iter()
            .map(|f| (f.server, f.steps_lost, f.saved_steps_lost))
            .collect();
        assert_eq!(
            got,
            [
                (2, 5, Some(10.0)),
                (1, 5, Some(5.0)),
                (3, 5, None),
                (2, 3, Some(7.0))
            ]
        );
        assert!((p.per_failure[0].pls - 0.00125).abs() < 1e-15);
        assert!((p.per_failure[0].saved_pls.unwrap() - 0.0025).abs() < 1e-15);
        assert!((p.total - 18.0 / 4000.0).abs() < 1e-15);
        assert_eq!(p.saved_total, None);
    }

    /// CPR-vanilla: every save is a full, so both figures are Eq. 3's.
    #[test]
    fn without_priority_both_pls_figures_agree() {
        let mut s = Cpr::new(steps_cfg(10, 1)).unwrap();
        for n in 1..=27 {
            if !step(&mut s, n).is_empty() {
                done(&mut s, n, 0.1);
            }
        }
        lose(&mut s, 0);
        let p = s.pls();
        assert_eq!(p.per_failure[0].steps_lost, 7);
        assert_eq!(p.saved_total, Some(p.total));
    }

    /// A loss before any save restores the lost shard to its initial state; PLS counts from
    /// step 0.
    #[test]
    fn a_loss_before_any_save_restores_the_initial_shard() {
        let mut s = Cpr::new(steps_cfg(100, 1)).unwrap();
        for n in 1..=40 {
            step(&mut s, n);
        }
        assert_eq!(
            lose(&mut s, 1)[1],
            Action::RestorePartial {
                servers: vec![ServerId(1)],
                checkpoint: None
            }
        );
        assert!((s.pls().total - 40.0 / 4000.0).abs() < 1e-15);
    }

    /// CPR Eq. 4 solved for the interval, by hand: PLS 0.1, 4 servers, MTBF 60 s:
    /// 2 * 0.1 * 4 * 60 = 48 s, and Eq. 4 at 48 s gives back 0.1.
    #[test]
    fn eq4_interval_from_a_target_pls() {
        let cfg = CprConfig::vanilla(
            CprInterval::TargetPls {
                pls: 0.1,
                mtbf_s: 60.0,
            },
            4,
            1000,
        );
        assert!((cfg.full_interval_s().unwrap() - 48.0).abs() < 1e-12);
        let mut s = Cpr::new(cfg).unwrap();
        let r = s.report();
        assert_eq!(
            r.interval.full_every_s,
            Some(cfg.full_interval_s().unwrap())
        );
        assert!((r.interval.expected_pls.unwrap() - 0.1).abs() < 1e-12);
        // Time-based: nothing before 48 s, a full at the first step after.
        assert!(s
            .on(&Event::StepDone {
                step: 10,
                now_s: 47.9
            })
            .is_empty());
        assert_eq!(
            s.on(&Event::StepDone {
                step: 11,
                now_s: 48.0
            })[1],
            Action::SaveFull { step: 11 }
        );
    }

    /// CPR §5.1: with priority, a save point every `n / saves_per_full` steps; the first is a
    /// full (prioritized saves need a base), every later one a prioritized save: no periodic
    /// full on top of them.
    #[test]
    fn prioritized_saves_take_the_place_of_full_saves() {
        let mut s = Cpr::new(steps_cfg(16, 8)).unwrap();
        let mut kinds = Vec::new();
        for n in 1..=40 {
            let a = step(&mut s, n);
            if let Some(save) = a.get(1) {
                kinds.push(save.clone());
                done(&mut s, n, 0.1);
            }
        }
        let full = |step| Action::SaveFull { step };
        let part = |step| Action::SavePartial { step };
        let mut expect = vec![full(2)];
        expect.extend((2..=20).map(|i| part(2 * i)));
        assert_eq!(kinds, expect);
        // A loss restores the newest save (the head of full + partial saves); Eq. 3 counts
        // from it.
        assert_eq!(
            lose(&mut s, 3)[1],
            Action::RestorePartial {
                servers: vec![ServerId(3)],
                checkpoint: Some(ckpt(40))
            }
        );
        let f = &s.pls().per_failure[0];
        assert_eq!((f.full_step, f.newest_save_step, f.steps_lost), (2, 40, 0));
        assert_eq!(s.report().full_saves, 1);
        assert_eq!(s.report().partial_saves, 19);
    }

    #[test]
    fn one_save_in_flight_and_a_loss_abandons_it() {
        let mut s = Cpr::new(steps_cfg(4, 2)).unwrap();
        step(&mut s, 1);
        assert_eq!(step(&mut s, 2)[1], Action::SaveFull { step: 2 });
        // Still uploading at the next point: nothing.
        assert!(step(&mut s, 3).is_empty());
        assert!(step(&mut s, 4).is_empty());
        done(&mut s, 2, 0.1);
        assert_eq!(step(&mut s, 5)[1], Action::SavePartial { step: 5 });
        // Lost while it uploads: the committed full is what the shard gets back.
        assert_eq!(
            lose(&mut s, 0)[1],
            Action::RestorePartial {
                servers: vec![ServerId(0)],
                checkpoint: Some(ckpt(2))
            }
        );
        // The abandoned save's late commit is ignored; a second loss meanwhile restores too.
        assert!(done(&mut s, 5, 0.1).is_empty());
        assert_eq!(s.committed(), Some(&ckpt(2)));
        assert_eq!(
            lose(&mut s, 1),
            vec![Action::RestorePartial {
                servers: vec![ServerId(1)],
                checkpoint: Some(ckpt(2))
            }]
        );
        assert_eq!(s.pls().per_failure.len(), 2);
    }

    /// A save lost with a server does not move the schedule: the interval runs from the
    /// newest *committed* save, so the next save comes at the first step after the recovery,
    /// not a whole interval after the lost save started (else the newest committed save could
    /// be two intervals old).
    #[test]
    fn a_save_lost_to_a_failure_leaves_the_schedule_where_it_was() {
        // Vanilla, full saves every 10 steps: the full of step 10 commits, the one of step 20
        // is lost with server 1 while it uploads.
        let mut s = Cpr::new(steps_cfg(10, 1)).unwrap();
        for n in 1..=20 {
            if !step(&mut s, n).is_empty() {
                if n == 10 {
                    done(&mut s, 10, 0.1);
                } else {
                    assert_eq!(n, 20);
                }
            }
        }
        assert_eq!(
            lose(&mut s, 1)[1],
            Action::RestorePartial {
                servers: vec![ServerId(1)],
                checkpoint: Some(ckpt(10))
            }
        );
        s.on(&Event::RestoreFinished {
            step: 20,
            now_s: 20.5,
        });
        // Overdue since step 20: the first step after the recovery saves.
        assert_eq!(step(&mut s, 21)[1], Action::SaveFull { step: 21 });
        done(&mut s, 21, 0.1);
        // Then every 10 steps from the committed save.
        for n in 22..=30 {
            assert!(step(&mut s, n).is_empty(), "step {n}");
        }
        assert_eq!(step(&mut s, 31)[1], Action::SaveFull { step: 31 });

        // Time-based, with prioritized saves (a save point every 48 / 8 = 6 s): the first
        // save is a full at 6 s; the prioritized save of 12 s is lost with a server, so the
        // next point is the first step after the recovery, and from its commit 6 s on.
        let mut s = Cpr::new(eight_saves_per_interval()).unwrap();
        let at = |s: &mut Cpr, step: u64, now_s: f64| s.on(&Event::StepDone { step, now_s });
        assert_eq!(at(&mut s, 1, 6.0)[1], Action::SaveFull { step: 1 });
        done(&mut s, 1, 0.1);
        assert_eq!(at(&mut s, 2, 12.0)[1], Action::SavePartial { step: 2 });
        lose(&mut s, 0);
        s.on(&Event::RestoreFinished {
            step: 2,
            now_s: 12.5,
        });
        assert_eq!(at(&mut s, 3, 12.6)[1], Action::SavePartial { step: 3 });
        done(&mut s, 3, 0.1);
        assert!(at(&mut s, 4, 18.5).is_empty());
        assert_eq!(at(&mut s, 5, 18.7)[1], Action::SavePartial { step: 5 });
    }

    #[test]
    fn a_failed_full_is_retried_and_deterministic_mode_awaits_each_commit() {
        let mut cfg = steps_cfg(3, 1);
        cfg.await_commit = true;
        let mut s = Cpr::new(cfg).unwrap();
        step(&mut s, 1);
        step(&mut s, 2);
        assert_eq!(
            step(&mut s, 3),
            vec![
                Action::PauseTraining,
                Action::SaveFull { step: 3 },
                Action::AwaitSave,
                Action::ResumeTraining
            ]
        );
        assert!(s
            .on(&Event::SaveFailed {
                step: 3,
                reason: "disk".into()
            })
            .is_empty());
        assert_eq!(step(&mut s, 4)[1], Action::SaveFull { step: 4 });
        assert_eq!(s.report().failed_saves, 1);
    }

    /// CPR §4.2 benefit analysis by hand. O_save = 0.5 s, MTBF 60 s: Young's interval is
    /// sqrt(60) = 7.746 s and Eq. 1's save + lost terms per second are 0.5 / 7.746 +
    /// 7.746 / 120 = 0.1291. With PLS 0.1 and 4 servers the partial interval is 48 s and Eq. 2
    /// costs 0.5 / 48 = 0.0104 per second: partial recovery. With PLS 0.0005 the interval is
    /// 0.24 s, 0.5 / 0.24 = 2.08 per second: fall back to full recovery.
    #[test]
    fn benefit_analysis_picks_partial_or_falls_back() {
        let cfg = |pls| CprConfig::vanilla(CprInterval::TargetPls { pls, mtbf_s: 60.0 }, 4, 1000);
        let mut s = Cpr::new(cfg(0.1)).unwrap();
        s.on(&Event::StepDone {
            step: 1,
            now_s: 48.0,
        });
        done(&mut s, 1, 0.5);
        let b = s.report().benefit.unwrap();
        assert!((b.t_save_full_s - 60f64.sqrt()).abs() < 1e-12);
        assert!((b.full_overhead - (0.5 / 60f64.sqrt() + 60f64.sqrt() / 120.0)).abs() < 1e-12);
        assert!((b.partial_overhead - 0.5 / 48.0).abs() < 1e-12);
        assert!(!b.fallback && !s.fell_back());

        let mut s = Cpr::new(cfg(0.0005)).unwrap();
        s.on(&Event::StepDone {
            step: 1,
            now_s: 0.3,
        });
        done(&mut s, 1, 0.5);
        let b = s.report().benefit.unwrap();
        assert!((b.partial_overhead - 0.5 / 0.24).abs() < 1e-9);
        assert!(b.fallback && s.fell_back());
        assert_eq!(s.report().recovery, "full");
        // Full recovery from now on: Young's interval (7.746 s after the save at 0.3 s) and
        // RestoreAll on a loss, with no PLS counted.
        assert!(s
            .on(&Event::StepDone {
                step: 2,
                now_s: 8.0
            })
            .is_empty());
        assert_eq!(
            s.on(&Event::StepDone {
                step: 3,
                now_s: 8.1
            })[1],
            Action::SaveFull { step: 3 }
        );
        done(&mut s, 3, 0.5);
        assert_eq!(
            lose(&mut s, 2),
            vec![
                Action::PauseTraining,
                Action::RestoreAll {
                    checkpoint: Some(ckpt(3))
                }
            ]
        );
        assert!(s.pls().per_failure.is_empty());
    }

    /// Prioritized saves are priced into Eq. 2: with 8 save points per interval and r = 1/8,
    /// one interval costs 8 saves of 1/8 of a full each: one full's worth.
    #[test]
    fn benefit_analysis_prices_prioritized_saves() {
        let mut s = Cpr::new(eight_saves_per_interval()).unwrap();
        // The first save point (48 / 8 = 6 s) takes a full.
        assert_eq!(
            s.on(&Event::StepDone {
                step: 1,
                now_s: 6.0
            })[1],
            Action::SaveFull { step: 1 }
        );
        done(&mut s, 1, 0.5);
        let b = s.report().benefit.unwrap();
        assert!((b.partial_overhead - 0.5 * 8.0 * 0.125 / 48.0).abs() < 1e-12);
    }

    #[test]
    fn the_run_ends_with_a_full_save_of_its_last_step() {
        let mut s = Cpr::new(steps_cfg(4, 1)).unwrap();
        for n in 1..=4 {
            if !step(&mut s, n).is_empty() {
                done(&mut s, n, 0.1);
            }
        }
        // The last step is saved whole already: nothing to do.
        assert!(s
            .on(&Event::TrainingDone {
                step: 4,
                now_s: 4.0
            })
            .is_empty());
        step(&mut s, 5);
        assert_eq!(
            s.on(&Event::TrainingDone {
                step: 5,
                now_s: 5.0
            }),
            vec![
                Action::PauseTraining,
                Action::SaveFull { step: 5 },
                Action::AwaitSave,
                Action::ResumeTraining
            ]
        );
        // With priority, a prioritized save of the last step leaves rows behind: a full too.
        let mut s = Cpr::new(steps_cfg(4, 2)).unwrap();
        for n in 1..=4 {
            if let Some(save) = step(&mut s, n).get(1).cloned() {
                assert_eq!(
                    save,
                    if n == 2 {
                        Action::SaveFull { step: 2 }
                    } else {
                        Action::SavePartial { step: 4 }
                    }
                );
                done(&mut s, n, 0.1);
            }
        }
        assert_eq!(
            s.on(&Event::TrainingDone {
                step: 4,
                now_s: 4.0
            })[1],
            Action::SaveFull { step: 4 }
        );
    }

    #[test]
    fn bad_configs_are_refused_with_the_reason() {
        let base = CprConfig::vanilla(CprInterval::Steps(10), 2, 100);
        for (cfg, what) in [
            (
                CprConfig {
                    interval: CprInterval::Steps(0),
                    ..base
                },
                "0 steps",
            ),
            (
                CprConfig {
                    interval: CprInterval::TargetPls {
                        pls: 0.0,
                        mtbf_s: 10.0,
                    },
                    ..base
                },
                "target PLS",
            ),
            (
                CprConfig {
                    interval: CprInterval::TargetPls {
                        pls: 0.1,
                        mtbf_s: f64::NAN,
                    },
                    ..base
                },
                "MTBF",
            ),
            (CprConfig { r: 0.0, ..base }, "r = 0"),
            (
                CprConfig {
                    saves_per_full: 0,
                    ..base
                },
                "0 save points",
            ),
            (CprConfig { n_emb: 0, ..base }, "no embedding servers"),
        ] {
            match Cpr::new(cfg) {
                Err(StrategyError::InvalidConfig(m)) => assert!(m.contains(what), "{m}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_job_resumed_onto_other_shards_takes_a_full_before_prioritized_saves() {
        for (continues, first) in [
            (true, Action::SavePartial { step: 18 }),
            (false, Action::SaveFull { step: 18 }),
        ] {
            let mut s = Cpr::new(steps_cfg(16, 8)).unwrap();
            assert!(s
                .on(&Event::Resumed {
                    checkpoint: ckpt(16),
                    continues,
                    now_s: 0.0,
                })
                .is_empty());
            assert_eq!(s.committed(), Some(&ckpt(16)));
            assert!(step(&mut s, 17).is_empty());
            assert_eq!(step(&mut s, 18)[1], first, "continues {continues}");
            done(&mut s, 18, 0.1);
            assert_eq!(step(&mut s, 20)[1], Action::SavePartial { step: 20 });
        }
    }
}

//! `deck`: frequent delta checkpoints over a full base, merged in the background, and full
//! recovery from the lineage (deck.txt §3–§4).
//!
//! The cluster carries the actions out as follows:
//! - `[PauseTraining, SaveFull | SaveDelta, ResumeTraining]`: the save action returns once every
//!   server copied its rows out (the only pause, DECK §3.2); upload and commit go on while
//!   training resumes, and [`Event::SaveFinished`] arrives once the manifest is committed;
//! - `RestoreAll { checkpoint }`: the newest committed delta (or full); restore resolves its
//!   lineage (full + merged + deltas), so every server goes back to the same committed step,
//!   as DECK restores one consistent model, and the workers rewind the data to it.
//!
//! One save is in flight at a time: a delta point reached while the previous save is still
//! uploading asks the cluster to wait for that save ([`Action::AwaitSave`]) and is taken as soon
//! as it commits, so saves land on their steps whatever the upload speed. The end of training
//! ([`Event::TrainingDone`]) saves the last step, so the store ends at the final model. The first save is a full (deltas need
//! a base); later fulls come from the merger (DECK §3.3) or, if configured, every `N` deltas.
//!
//! The policy math of DECK §3.3 is here too: [`merge_stride`] (Inequality 1) and
//! [`full_every`] (Inequality 2).

use serde::{Deserialize, Serialize};

use crate::full::Interval;
use crate::machine::{Action, CheckpointRef, Event, Strategy};
use crate::StrategyError;

/// Relative size of merging `s` equal deltas with duplication ratio `d`: `(2 - d)^{log2 s}`.
fn merged_size(d: f64, s: u64, layer: u32) -> f64 {
    (2.0 - d).powf(layer as f64 * (s as f64).log2())
}

/// The left side of DECK Inequality 1: the merger's input volume per produced delta,
/// `sum_{i>=1} (2 - d)^{i log s} / s^i` (infinite when merging does not shrink: `d = 0`).
pub fn merge_load(d: f64, s: u64) -> f64 {
    let r = merged_size(d, s, 1) / s as f64;
    if r >= 1.0 {
        f64::INFINITY
    } else {
        r / (1.0 - r)
    }
}

/// The smallest stride `s >= 2` (up to `max_s`) that satisfies DECK Inequality 1 for
/// duplication ratio `d` in `[0, 1]` and relative merging velocity `v > 0`; `None` if no stride
/// keeps up.
pub fn merge_stride(d: f64, v: f64, max_s: u64) -> Option<u64> {
    if !(0.0..=1.0).contains(&d) || v.is_nan() || v <= 0.0 {
        return None;
    }
    (2..=max_s.max(2)).find(|&s| merge_load(d, s) < v)
}

/// The left side of DECK Inequality 2: the volume of living merged checkpoints, relative to one
/// delta, after `n` deltas with stride `s`.
pub fn living_volume(d: f64, s: u64, n: u64) -> f64 {
    let mut total = 0.0;
    let mut i = 1u32;
    let mut si = s; // s^i
    while si <= n {
        let living = n / si - (n / (si.saturating_mul(s))) * s;
        total += living as f64 * merged_size(d, s, i);
        i += 1;
        match si.checked_mul(s) {
            Some(x) => si = x,
            None => break,
        }
    }
    total
}

/// The largest `N` (up to `max_n`) with every `n <= N` satisfying DECK Inequality 2 for bound
/// `f` (relative to one delta): write a full checkpoint every `N` deltas.
pub fn full_every(d: f64, s: u64, f: f64, max_n: u64) -> Option<u64> {
    if s < 2 || !(0.0..=1.0).contains(&d) {
        return None;
    }
    let mut best = None;
    for n in 1..=max_n {
        if living_volume(d, s, n) < f {
            best = Some(n);
        } else {
            break;
        }
    }
    best
}

/// How `deck` is configured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeckConfig {
    /// When to take a delta.
    pub delta_every: Interval,
    /// Also save a full from the trainer every this many deltas (`None`: fulls come from the
    /// merger only).
    pub full_every_deltas: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Training,
    Saving { step: u64, full: bool },
    Recovering,
}

/// The `deck` strategy's state.
#[derive(Debug, Clone)]
pub struct Deck {
    config: DeckConfig,
    phase: Phase,
    committed: Option<CheckpointRef>,
    /// A full is committed: deltas have a base.
    have_base: bool,
    deltas_since_full: u64,
    last_save_step: u64,
    last_save_s: f64,
    /// A save point (step, time) reached while the previous save still uploaded: taken as
    /// soon as that one is committed or has failed.
    due_while_saving: Option<(u64, f64)>,
    pauses: Vec<f64>,
}

impl Deck {
    pub fn new(config: DeckConfig) -> Result<Self, StrategyError> {
        let bad = |m: &str| Err(StrategyError::InvalidConfig(m.to_string()));
        match config.delta_every {
            Interval::Steps(0) => return bad("delta every 0 steps"),
            Interval::Seconds(t) if !(t.is_finite() && t > 0.0) => {
                return bad("delta interval must be a positive number of seconds")
            }
            Interval::Young { .. } => {
                return bad("deck takes deltas every N steps or T seconds, not Young's interval")
            }
            _ => {}
        }
        if config.full_every_deltas == Some(0) {
            return bad("a full every 0 deltas");
        }
        Ok(Deck {
            config,
            phase: Phase::Training,
            committed: None,
            have_base: false,
            deltas_since_full: 0,
            last_save_step: 0,
            last_save_s: 0.0,
            due_while_saving: None,
            pauses: Vec::new(),
        })
    }

    /// The newest committed checkpoint (what a loss restores).
    pub fn committed(&self) -> Option<&CheckpointRef> {
        self.committed.as_ref()
    }

    /// Pauses reported by committed saves.
    pub fn pauses(&self) -> &[f64] {
        &self.pauses
    }

    fn due(&self, step: u64, now_s: f64) -> bool {
        match self.config.delta_every {
            Interval::Steps(n) => step >= self.last_save_step + n,
            Interval::Seconds(t) => now_s - self.last_save_s >= t,
            Interval::Young { .. } => false,
        }
    }

    fn save(&mut self, step: u64, now_s: f64) -> Vec<Action> {
        let full = !self.have_base
            || self
                .config
                .full_every_deltas
                .is_some_and(|n| self.deltas_since_full >= n);
        self.phase = Phase::Saving { step, full };
        self.last_save_step = step;
        self.last_save_s = now_s;
        let save = if full {
            Action::SaveFull { step }
        } else {
            Action::SaveDelta { step }
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

impl Strategy for Deck {
    fn name(&self) -> &'static str {
        "deck"
    }

    fn on(&mut self, event: &Event) -> Vec<Action> {
        match (event, self.phase) {
            (Event::StepDone { step, now_s }, Phase::Training) if self.due(*step, *now_s) => {
                self.save(*step, *now_s)
            }
            (Event::StepDone { step, now_s }, Phase::Saving { .. }) if self.due(*step, *now_s) => {
                // One save at a time: this point waits for the previous save's commit, then
                // saves (the wait is a pause; DECK §3.2's back-pressure).
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
                    checkpoint, cost_s, ..
                },
                Phase::Saving { step, full },
            ) if checkpoint.step == step => {
                self.committed = Some(checkpoint.clone());
                self.pauses.push(*cost_s);
                if full {
                    self.have_base = true;
                    self.deltas_since_full = 0;
                } else {
                    self.deltas_since_full += 1;
                }
                self.phase = Phase::Training;
                self.save_if_due()
            }
            (Event::SaveFailed { step: failed, .. }, Phase::Saving { step, .. })
                if *failed == step =>
            {
                // Nothing committed, but a server whose upload finished may already have
                // dropped its tracked rows (a tracker forgets once its own files are durable),
                // so a delta over the last commit could miss rows: the next save is a full.
                // The committed lineage stays valid for recovery meanwhile.
                self.phase = Phase::Training;
                self.have_base = false;
                self.save_if_due()
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
                // Restored from nothing: the next save must be a full again.
                if self.committed.is_none() {
                    self.have_base = false;
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
                // Deltas continue over the resumed state when the servers' shards are the
                // saved ones (as after a recovery); otherwise a new lineage starts with a full.
                self.committed = Some(checkpoint.clone());
                self.have_base = *continues;
                self.deltas_since_full = 0;
                self.last_save_step = checkpoint.step;
                self.last_save_s = *now_s;
                self.due_while_saving = None;
                self.phase = Phase::Training;
                Vec::new()
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
            id: format!("c{step}"),
            step,
        }
    }

    fn step(s: &mut Deck, n: u64) -> Vec<Action> {
        s.on(&Event::StepDone {
            step: n,
            now_s: n as f64,
        })
    }

    fn done(s: &mut Deck, n: u64) -> Vec<Action> {
        s.on(&Event::SaveFinished {
            checkpoint: ckpt(n),
            cost_s: 0.01,
            bytes: 1,
        })
    }

    fn deck(every: u64, full: Option<u64>) -> Deck {
        Deck::new(DeckConfig {
            delta_every: Interval::Steps(every),
            full_every_deltas: full,
        })
        .unwrap()
    }

    #[test]
    fn first_save_is_a_full_then_deltas_resuming_after_copy_out() {
        let mut s = deck(2, None);
        assert!(step(&mut s, 1).is_empty());
        assert_eq!(
            step(&mut s, 2),
            vec![
                Action::PauseTraining,
                Action::SaveFull { step: 2 },
                Action::ResumeTraining
            ]
        );
        // Training goes on while the full uploads; no second save overlaps it.
        assert!(step(&mut s, 3).is_empty());
        assert!(done(&mut s, 2).is_empty());
        assert_eq!(step(&mut s, 4)[1], Action::SaveDelta { step: 4 });
        done(&mut s, 4);
        assert!(step(&mut s, 5).is_empty());
        assert_eq!(step(&mut s, 6)[1], Action::SaveDelta { step: 6 });
        done(&mut s, 6);
        assert_eq!(s.committed(), Some(&ckpt(6)));
        assert_eq!(s.pauses().len(), 3);
    }

    #[test]
    fn a_save_point_during_an_upload_waits_for_its_commit_then_saves_on_its_step() {
        let mut s = deck(2, None);
        step(&mut s, 1);
        step(&mut s, 2); // full of step 2 uploading
        step(&mut s, 3);
        // Due at 4 while the full still uploads: wait for it.
        assert_eq!(step(&mut s, 4), vec![Action::AwaitSave]);
        // Its commit arrives during the wait and the delta of step 4 follows at once.
        assert_eq!(
            done(&mut s, 2),
            vec![
                Action::PauseTraining,
                Action::SaveDelta { step: 4 },
                Action::ResumeTraining
            ]
        );
        // A failed save during a wait: the point is still taken, as a full (no safe base).
        assert_eq!(step(&mut s, 6), vec![Action::AwaitSave]);
        assert_eq!(
            s.on(&Event::SaveFailed {
                step: 4,
                reason: "upload".into()
            })[1],
            Action::SaveFull { step: 6 }
        );
    }

    #[test]
    fn the_end_of_training_saves_the_last_step_after_the_save_in_flight() {
        let mut s = deck(3, None);
        for n in 1..=3 {
            step(&mut s, n);
        }
        done(&mut s, 3);
        step(&mut s, 4);
        assert_eq!(
            s.on(&Event::TrainingDone {
                step: 4,
                now_s: 4.0
            })[1],
            Action::SaveDelta { step: 4 }
        );
        done(&mut s, 4);
        // Nothing new to save.
        assert!(s
            .on(&Event::TrainingDone {
                step: 4,
                now_s: 4.1
            })
            .is_empty());
        // Ending while a save uploads: wait for it, then save the last step.
        let mut s = deck(2, None);
        step(&mut s, 1);
        step(&mut s, 2);
        step(&mut s, 3);
        assert_eq!(
            s.on(&Event::TrainingDone {
                step: 3,
                now_s: 3.0
            }),
            vec![Action::AwaitSave]
        );
        assert_eq!(done(&mut s, 2)[1], Action::SaveDelta { step: 3 });
    }

    #[test]
    fn a_failed_delta_is_followed_by_a_full_and_recovery_still_uses_the_last_commit() {
        let mut s = deck(2, None);
        step(&mut s, 2);
        done(&mut s, 2);
        assert_eq!(step(&mut s, 4)[1], Action::SaveDelta { step: 4 });
        assert!(s
            .on(&Event::SaveFailed {
                step: 4,
                reason: "upload".into()
            })
            .is_empty());
        assert_eq!(step(&mut s, 6)[1], Action::SaveFull { step: 6 });
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(0),
                now_s: 6.5
            })[1],
            Action::RestoreAll {
                checkpoint: Some(ckpt(2))
            }
        );
    }

    #[test]
    fn trainer_fulls_every_n_deltas_when_configured() {
        let mut s = deck(1, Some(2));
        let mut kinds = Vec::new();
        for n in 1..=7 {
            let a = step(&mut s, n);
            kinds.push(a[1].clone());
            done(&mut s, n);
        }
        let full = |n| Action::SaveFull { step: n };
        let delta = |n| Action::SaveDelta { step: n };
        assert_eq!(
            kinds,
            vec![
                full(1),
                delta(2),
                delta(3),
                full(4),
                delta(5),
                delta(6),
                full(7)
            ]
        );
    }

    #[test]
    fn a_loss_restores_the_newest_committed_delta_and_abandons_the_save_in_flight() {
        let mut s = deck(1, None);
        step(&mut s, 1);
        done(&mut s, 1);
        step(&mut s, 2);
        done(&mut s, 2);
        step(&mut s, 3); // delta of step 3 in flight
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
        assert!(done(&mut s, 3).is_empty());
        assert_eq!(s.committed(), Some(&ckpt(2)));
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(0),
                now_s: 3.6
            }),
            vec![Action::RestoreAll {
                checkpoint: Some(ckpt(2))
            }]
        );
        assert_eq!(
            s.on(&Event::RestoreFinished {
                step: 2,
                now_s: 4.0
            }),
            vec![Action::ResumeTraining]
        );
        // Deltas continue from the restored step.
        assert_eq!(step(&mut s, 3)[1], Action::SaveDelta { step: 3 });
    }

    #[test]
    fn a_failed_save_retries_at_the_next_point_and_a_loss_before_any_save_restarts() {
        let mut s = deck(1, None);
        assert_eq!(
            s.on(&Event::ServerLost {
                server: ServerId(0),
                now_s: 0.1
            })[1],
            Action::RestoreAll { checkpoint: None }
        );
        s.on(&Event::RestoreFinished {
            step: 0,
            now_s: 0.2,
        });
        step(&mut s, 1);
        assert!(s
            .on(&Event::SaveFailed {
                step: 1,
                reason: "disk".into()
            })
            .is_empty());
        // Still no base: the next save is a full again.
        assert_eq!(step(&mut s, 2)[1], Action::SaveFull { step: 2 });
    }

    #[test]
    fn bad_configs_are_refused() {
        for c in [
            DeckConfig {
                delta_every: Interval::Steps(0),
                full_every_deltas: None,
            },
            DeckConfig {
                delta_every: Interval::Seconds(f64::NAN),
                full_every_deltas: None,
            },
            DeckConfig {
                delta_every: Interval::Steps(3),
                full_every_deltas: Some(0),
            },
        ] {
            assert!(matches!(Deck::new(c), Err(StrategyError::InvalidConfig(_))));
        }
    }

    /// DECK §3.3, Inequality 1: more duplication or a faster merger allows a smaller stride.
    #[test]
    fn inequality_1_stride() {
        // d = 1 (consecutive deltas identical): merging s deltas gives one delta's size, so
        // the load is 1/(s-1).
        assert!((merge_load(1.0, 2) - 1.0).abs() < 1e-12);
        assert!((merge_load(1.0, 5) - 0.25).abs() < 1e-12);
        assert_eq!(merge_stride(1.0, 2.0, 64), Some(2));
        assert_eq!(merge_stride(1.0, 0.45, 64), Some(4));
        // No duplication: merging never shrinks, no stride keeps up.
        assert_eq!(merge_stride(0.0, 100.0, 64), None);
        let s_slow = merge_stride(0.5, 1.0, 1024).unwrap();
        let s_fast = merge_stride(0.5, 5.0, 1024).unwrap();
        assert!(s_fast <= s_slow, "{s_fast} vs {s_slow}");
        assert_eq!(merge_stride(0.5, -1.0, 64), None);
    }

    /// DECK §3.3, Inequality 2: the living merged volume by hand, and N from the bound F.
    #[test]
    fn inequality_2_full_interval() {
        // s = 2, d = 1: every merged checkpoint is one delta's size. Layer i holds
        // floor(n/2^i) - 2 floor(n/2^(i+1)) merged checkpoints. n = 5: i=1: 2 - 2 = 0;
        // i=2: 1 - 0 = 1 -> volume 1.
        assert!((living_volume(1.0, 2, 5) - 1.0).abs() < 1e-12);
        // After 6 deltas (110): i=1: 3 - 2 = 1; i=2: 1 - 0 = 1 -> 2.
        assert!((living_volume(1.0, 2, 6) - 2.0).abs() < 1e-12);
        // With d = 0 layer i weighs 2^i: 6 deltas -> 2 + 4 = 6.
        assert!((living_volume(0.0, 2, 6) - 6.0).abs() < 1e-12);
        let n = full_every(0.0, 2, 6.0, 1000).unwrap();
        assert_eq!(n, 5, "n = 6 reaches the bound 6");
        assert!(full_every(0.5, 2, 20.0, 1000).unwrap() > n);
        assert_eq!(full_every(0.5, 1, 20.0, 10), None);
    }

    #[test]
    fn a_resumed_job_continues_with_deltas_only_over_its_own_shards() {
        for (continues, first) in [
            (true, Action::SaveDelta { step: 9 }),
            (false, Action::SaveFull { step: 9 }),
        ] {
            let mut s = Deck::new(DeckConfig {
                delta_every: Interval::Steps(3),
                full_every_deltas: None,
            })
            .unwrap();
            assert!(s
                .on(&Event::Resumed {
                    checkpoint: ckpt(6),
                    continues,
                    now_s: 0.0,
                })
                .is_empty());
            assert_eq!(s.committed(), Some(&ckpt(6)));
            assert!(step(&mut s, 7).is_empty());
            assert!(step(&mut s, 8).is_empty());
            assert_eq!(step(&mut s, 9)[1], first, "continues {continues}");
        }
    }
}

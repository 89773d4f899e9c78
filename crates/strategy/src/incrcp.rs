//! `incrcp`: incremental checkpoints in IncrCP's 2-D chunk list (incrcp.txt §4), with the
//! baseline-reset rule of §4.5.
//!
//! Pieces hold the rows touched since the previous save; the servers decompose each into the
//! chunks of a 2-D list and extract duplicates in the background (§4.2–§4.4), so a restore reads
//! each row's newest copy only. The list still grows: restoring it costs more as pieces
//! accumulate, so before each save the strategy assumes a failure right after it and compares
//! the construction plus recovery time of a new base with that of one more piece (§4.5):
//!
//! ```text
//! T_base  = C_base  + R_base
//! T_incre = C_incre + R_base + R_i
//! ```
//!
//! and writes a new full when `T_base < T_incre`. `C_base` and `C_incre` are the measured
//! pauses of the last full and the last piece; `R_base` and the history of `R` (the restore time
//! of the pieces over the base) come from [`Event::RestoreEstimate`]; `R_i`, the restore time
//! with one more piece, is extrapolated from the last two estimates (the paper infers it from
//! the last two recoveries, having observed a near-linear growth).

use serde::{Deserialize, Serialize};

use crate::full::Interval;
use crate::incremental::{Pieces, ResetPolicy, SavePoint};
use crate::machine::{Decision, Event, PieceLayout};
use crate::StrategyError;

/// IncrCP §4.5: construction plus recovery time when the next checkpoint is a new base.
pub fn t_base(c_base: f64, r_base: f64) -> f64 {
    c_base + r_base
}

/// IncrCP §4.5: construction plus recovery time when the next checkpoint is a piece whose
/// chain restores in `r_i` seconds over the base.
pub fn t_incre(c_incre: f64, r_base: f64, r_i: f64) -> f64 {
    c_incre + r_base + r_i
}

/// `R_i` for the next piece from the history of chain-restore estimates (oldest first): the
/// line through the last two, never below the last (one estimate: the last).
pub fn predict_next(history: &[f64]) -> Option<f64> {
    match history {
        [] => None,
        [last] => Some(*last),
        [.., prev, last] => Some((last + (last - prev)).max(*last)),
    }
}

/// When `incrcp` writes a new base.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseReset {
    /// IncrCP §4.5: when `T_base < T_incre`.
    Auto,
    /// Never after the first full (a list grows without bound).
    Never,
    /// Every `n` pieces.
    EveryPieces(u64),
}

/// How `incrcp` is configured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IncrCpConfig {
    pub every: Interval,
    pub reset: BaseReset,
    /// `R`, the duplicate share above which an old chunk is extracted (0.02 in the paper).
    pub threshold: f64,
    /// Local rows per row range (0: one list per table shard).
    pub range_rows: u64,
    /// Concatenate extraction outputs into bundles (§4.4).
    pub concat: bool,
}

impl IncrCpConfig {
    /// Every `n` steps, with the paper's settings: `R = 0.02`, concatenation on, the §4.5 rule.
    pub fn every_steps(n: u64) -> Self {
        IncrCpConfig {
            every: Interval::Steps(n),
            reset: BaseReset::Auto,
            threshold: 0.02,
            range_rows: 0,
            concat: true,
        }
    }
}

/// IncrCP's reset policy and what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct IncrCpReset {
    config: IncrCpConfig,
    c_base: Option<f64>,
    c_incre: Option<f64>,
    r_base: Option<f64>,
    r_history: Vec<f64>,
}

impl ResetPolicy for IncrCpReset {
    fn name(&self) -> &'static str {
        "incrcp"
    }

    fn layout(&self) -> PieceLayout {
        PieceLayout::ChunkList {
            threshold: self.config.threshold,
            range_rows: self.config.range_rows,
            concat: self.config.concat,
        }
    }

    fn decide(&mut self, at: SavePoint) -> Decision {
        let decision = |full: bool, reason: String, tb: Option<f64>, ti: Option<f64>| Decision {
            step: at.step,
            full,
            reason,
            t_base_s: tb,
            t_incre_s: ti,
        };
        match self.config.reset {
            BaseReset::Never => decision(false, "resets are off".into(), None, None),
            BaseReset::EveryPieces(n) => decision(
                at.pieces >= n,
                format!("{} pieces since the base (a new one every {n})", at.pieces),
                None,
                None,
            ),
            BaseReset::Auto => {
                let r_i = predict_next(&self.r_history);
                let (Some(c_base), Some(c_incre), Some(r_base), Some(r_i)) =
                    (self.c_base, self.c_incre, self.r_base, r_i)
                else {
                    return decision(
                        false,
                        "a piece: not every cost of the rule is measured yet".into(),
                        None,
                        None,
                    );
                };
                let tb = t_base(c_base, r_base);
                let ti = t_incre(c_incre, r_base, r_i);
                let full = tb < ti;
                decision(
                    full,
                    format!(
                        "T_base {tb:.4}s {} T_incre {ti:.4}s (C_base {c_base:.4}, C_incre \
                         {c_incre:.4}, R_base {r_base:.4}, R_i {r_i:.4})",
                        if full { "<" } else { ">=" }
                    ),
                    Some(tb),
                    Some(ti),
                )
            }
        }
    }

    fn committed(&mut self, full: bool, cost_s: f64, _bytes: u64) {
        if full {
            self.c_base = Some(cost_s);
            // A new list: its restore cost starts over.
            self.r_history.clear();
        } else {
            self.c_incre = Some(cost_s);
        }
    }

    fn estimate(&mut self, base_s: f64, chain_s: f64) {
        if base_s.is_finite() && base_s >= 0.0 && chain_s.is_finite() && chain_s >= 0.0 {
            self.r_base = Some(base_s);
            self.r_history.push(chain_s);
        }
    }
}

impl IncrCpReset {
    /// The chain-restore estimates since the base.
    pub fn history(&self) -> &[f64] {
        &self.r_history
    }
}

/// `incrcp`.
pub type IncrCp = Pieces<IncrCpReset>;

impl IncrCp {
    pub fn new(config: IncrCpConfig) -> Result<Self, StrategyError> {
        let bad = |m: String| Err(StrategyError::InvalidConfig(m));
        if !(config.threshold.is_finite() && (0.0..=1.0).contains(&config.threshold)) {
            return bad(format!(
                "extraction threshold R = {} is not in [0, 1]",
                config.threshold
            ));
        }
        if config.reset == BaseReset::EveryPieces(0) {
            return bad("a new base every 0 pieces".into());
        }
        Pieces::with_policy(
            config.every,
            IncrCpReset {
                config,
                c_base: None,
                c_incre: None,
                r_base: None,
                r_history: Vec::new(),
            },
        )
    }
}

/// The event a coordinator sends after a piece commits (for tests and callers building one).
pub fn estimate(base_s: f64, chain_s: f64) -> Event {
    Event::RestoreEstimate { base_s, chain_s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incremental::tests::{done, step};
    use crate::machine::{Action, Strategy};

    #[test]
    fn the_reset_rule_by_hand() {
        // §4.5 with C_base 1.0, C_incre 0.1, R_base 2.0: a piece costs 0.1 + 2 + R_i, a base
        // 1 + 2: reset once R_i passes 0.9.
        assert_eq!(t_base(1.0, 2.0), 3.0);
        assert_eq!(t_incre(0.1, 2.0, 0.5), 2.6);
        assert!(t_base(1.0, 2.0) < t_incre(0.1, 2.0, 0.95));
        assert_eq!(predict_next(&[]), None);
        assert_eq!(predict_next(&[0.4]), Some(0.4));
        assert_eq!(predict_next(&[0.2, 0.5]), Some(0.8));
        // A shrinking estimate never predicts below the last one.
        assert_eq!(predict_next(&[0.5, 0.2]), Some(0.2));
    }

    /// Hand-built events: the chain's restore estimate grows linearly by 0.3 s a piece, a
    /// full costs 1.0 s more than a piece: the strategy resets at the first save point whose
    /// extrapolated R_i passes the difference.
    #[test]
    fn resets_when_t_base_beats_t_incre() {
        let mut s = IncrCp::new(IncrCpConfig::every_steps(1)).unwrap();
        assert_eq!(step(&mut s, 1)[1], Action::SaveFull { step: 1 });
        done(&mut s, 1, 1.1, 1000);
        // Nothing measured about pieces yet: a piece.
        assert!(matches!(step(&mut s, 2)[1], Action::SavePiece { .. }));
        done(&mut s, 2, 0.1, 10);
        s.on(&estimate(2.0, 0.3));
        // R_i = 0.3 (one estimate): 0.1 + 2 + 0.3 = 2.4 < 3.1.
        assert!(matches!(step(&mut s, 3)[1], Action::SavePiece { .. }));
        done(&mut s, 3, 0.1, 10);
        s.on(&estimate(2.0, 0.6));
        // R_i = 0.9: 3.0 < 3.1, a piece.
        assert!(matches!(step(&mut s, 4)[1], Action::SavePiece { .. }));
        done(&mut s, 4, 0.1, 10);
        s.on(&estimate(2.0, 0.9));
        // R_i = 1.2: 3.3 > 3.1, a new base.
        assert_eq!(step(&mut s, 5)[1], Action::SaveFull { step: 5 });
        done(&mut s, 5, 1.1, 1000);
        let d = s.decisions();
        assert_eq!(d.iter().filter(|d| d.full).count(), 1);
        let last = d.last().unwrap();
        assert!(last.full && last.t_base_s.unwrap() < last.t_incre_s.unwrap());
        assert!(last.reason.contains("T_base"), "{}", last.reason);
        // The new list's history starts over: a piece again.
        assert!(matches!(step(&mut s, 6)[1], Action::SavePiece { .. }));
        assert!(s.policy().history().is_empty());
    }

    #[test]
    fn never_and_every_n() {
        let mut cfg = IncrCpConfig::every_steps(1);
        cfg.reset = BaseReset::Never;
        let mut s = IncrCp::new(cfg).unwrap();
        step(&mut s, 1);
        done(&mut s, 1, 1.0, 1);
        for n in 2..10 {
            assert!(matches!(step(&mut s, n)[1], Action::SavePiece { .. }));
            done(&mut s, n, 0.0, 1);
            s.on(&estimate(1.0, n as f64));
        }
        cfg.reset = BaseReset::EveryPieces(2);
        let mut s = IncrCp::new(cfg).unwrap();
        let mut fulls = Vec::new();
        for n in 1..=6 {
            fulls.push(matches!(step(&mut s, n)[1], Action::SaveFull { .. }));
            done(&mut s, n, 0.0, 1);
        }
        assert_eq!(fulls, vec![true, false, false, true, false, false]);
    }

    #[test]
    fn the_piece_layout_carries_the_extraction_settings() {
        let mut cfg = IncrCpConfig::every_steps(1);
        cfg.threshold = 0.1;
        cfg.range_rows = 4096;
        cfg.concat = false;
        let mut s = IncrCp::new(cfg).unwrap();
        step(&mut s, 1);
        done(&mut s, 1, 0.0, 1);
        assert_eq!(
            step(&mut s, 2)[1],
            Action::SavePiece {
                step: 2,
                layout: PieceLayout::ChunkList {
                    threshold: 0.1,
                    range_rows: 4096,
                    concat: false
                }
            }
        );
        cfg.threshold = 1.5;
        assert!(matches!(
            IncrCp::new(cfg),
            Err(StrategyError::InvalidConfig(_))
        ));
    }
}

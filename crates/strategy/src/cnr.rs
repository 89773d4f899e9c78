//! `cnr`: Check-N-Run's differential checkpoints, the recovery-friendly baseline IncrCP measures
//! against (incrcp.txt §2.2, §5.1.5).
//!
//! Every piece holds every row touched since the last full (its parent), so a restore reads the
//! full and the newest differential only; the price is that each differential is at least as
//! large as the one before. Check-N-Run resets the base intermittently: here, once the last
//! differential passed `reset_fraction` of the full's size, the next save is a full. Values
//! may be quantized to 8 or 4 bits per value (Check-N-Run's quantization), which makes every
//! restore approximate: the run then cannot end with the failure-free digest, and says so.

use serde::{Deserialize, Serialize};

use crate::full::Interval;
use crate::incremental::{Pieces, ResetPolicy, SavePoint};
use crate::machine::{Decision, PieceLayout};
use crate::StrategyError;

/// Whether a differential of `diff_bytes` over a full of `full_bytes` calls for a new base.
pub fn reset_due(diff_bytes: u64, full_bytes: u64, fraction: f64) -> bool {
    diff_bytes as f64 > fraction * full_bytes as f64
}

/// How `cnr` is configured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CnrConfig {
    pub every: Interval,
    /// A new full once a differential passes this share of the full's bytes (`None`: never).
    pub reset_fraction: Option<f64>,
    /// 8 or 4: quantize differentials' values.
    pub quant_bits: Option<u8>,
}

/// Check-N-Run's reset policy.
#[derive(Debug, Clone, PartialEq)]
pub struct CnrReset {
    config: CnrConfig,
    full_bytes: Option<u64>,
    last_diff_bytes: Option<u64>,
}

impl ResetPolicy for CnrReset {
    fn name(&self) -> &'static str {
        "cnr"
    }

    fn layout(&self) -> PieceLayout {
        PieceLayout::Differential {
            quant_bits: self.config.quant_bits,
        }
    }

    fn decide(&mut self, at: SavePoint) -> Decision {
        let (full, reason) = match (
            self.config.reset_fraction,
            self.full_bytes,
            self.last_diff_bytes,
        ) {
            (None, _, _) => (false, "resets are off".to_string()),
            (Some(f), Some(full), Some(diff)) => {
                let due = reset_due(diff, full, f);
                (
                    due,
                    format!(
                        "last differential {diff} B is {:.3} of the full's {full} B (reset above \
                         {f})",
                        diff as f64 / full.max(1) as f64
                    ),
                )
            }
            (Some(_), _, _) => (false, "no differential over this base yet".to_string()),
        };
        Decision {
            step: at.step,
            full,
            reason,
            t_base_s: None,
            t_incre_s: None,
        }
    }

    fn committed(&mut self, full: bool, _cost_s: f64, bytes: u64) {
        if full {
            self.full_bytes = Some(bytes);
            self.last_diff_bytes = None;
        } else {
            self.last_diff_bytes = Some(bytes);
        }
    }
}

/// `cnr`.
pub type Cnr = Pieces<CnrReset>;

impl Cnr {
    pub fn new(config: CnrConfig) -> Result<Self, StrategyError> {
        if let Some(f) = config.reset_fraction {
            if !(f.is_finite() && f > 0.0) {
                return Err(StrategyError::InvalidConfig(format!(
                    "reset fraction {f} must be a positive number"
                )));
            }
        }
        if let Some(b) = config.quant_bits {
            if b != 8 && b != 4 {
                return Err(StrategyError::InvalidConfig(format!(
                    "quantization to {b} bits: Check-N-Run quantizes to 8 or 4"
                )));
            }
        }
        Pieces::with_policy(
            config.every,
            CnrReset {
                config,
                full_bytes: None,
                last_diff_bytes: None,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incremental::tests::{done, step};
    use crate::machine::{Action, Strategy};

    fn cnr(fraction: Option<f64>, bits: Option<u8>) -> Cnr {
        Cnr::new(CnrConfig {
            every: Interval::Steps(1),
            reset_fraction: fraction,
            quant_bits: bits,
        })
        .unwrap()
    }

    #[test]
    fn differentials_until_one_passes_the_fraction() {
        let mut s = cnr(Some(0.5), None);
        assert_eq!(step(&mut s, 1)[1], Action::SaveFull { step: 1 });
        done(&mut s, 1, 1.0, 1000);
        let diff = |n| Action::SavePiece {
            step: n,
            layout: PieceLayout::Differential { quant_bits: None },
        };
        assert_eq!(step(&mut s, 2)[1], diff(2));
        done(&mut s, 2, 0.1, 300);
        assert_eq!(step(&mut s, 3)[1], diff(3));
        done(&mut s, 3, 0.1, 500); // exactly half: not above
        assert_eq!(step(&mut s, 4)[1], diff(4));
        done(&mut s, 4, 0.1, 501);
        assert_eq!(step(&mut s, 5)[1], Action::SaveFull { step: 5 });
        done(&mut s, 5, 1.0, 1000);
        assert_eq!(step(&mut s, 6)[1], diff(6));
        assert!(s.decisions()[3].full);
        assert!(
            s.decisions()[3].reason.contains("0.501"),
            "{}",
            s.decisions()[3].reason
        );
    }

    #[test]
    fn quantized_pieces_are_not_exact_and_bad_configs_are_refused() {
        let mut s = cnr(None, Some(4));
        step(&mut s, 1);
        done(&mut s, 1, 1.0, 1000);
        match &step(&mut s, 2)[1] {
            Action::SavePiece { layout, .. } => {
                assert!(!layout.exact() && layout.since_last_full());
            }
            other => panic!("expected a piece, got {other:?}"),
        }
        assert!(reset_due(11, 20, 0.5) && !reset_due(10, 20, 0.5));
        for (f, b) in [(Some(0.0), None), (Some(f64::NAN), None), (None, Some(2))] {
            assert!(matches!(
                Cnr::new(CnrConfig {
                    every: Interval::Steps(1),
                    reset_fraction: f,
                    quant_bits: b
                }),
                Err(StrategyError::InvalidConfig(_))
            ));
        }
    }
}

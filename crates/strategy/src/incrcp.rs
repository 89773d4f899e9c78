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
//! and writes a new full when `T_base < T_incre`.
//!
//! The terms are not single measured timings: on a loaded machine one save's pause or one
//! read's rate swings by 10x, and a rule fed them resets at random ([`reset_costs`], a pure
//! function, computes them):
//! - `C_base = c * F`: `F` the current base's bytes, `c` the median of `pause / bytes` over the
//!   run's last [`WINDOW`] fulls (a full's pause copies all of its bytes);
//! - `C_incre`: the median pause of the run's last [`WINDOW`] pieces;
//! - `R_base` and `R_i` are not timed at all: a [`ReadModel`] prices what the restores read,
//!   `bytes * s_per_byte + files * s_per_file`, from the bytes and files the servers report for
//!   the base and for the newest point over it ([`Event::RestoreEstimate`]), the next point's
//!   extrapolated along the line through the last two (the paper infers `R_i` "from the last
//!   two recoveries", having observed a near-linear growth). Timings of extraction reads,
//!   which an earlier form used, follow the page cache; a restore after a failure is not
//!   served from it, and its cost on many small files is per file as much as per byte.
//!
//! So a decision moves only with bytes and file counts (exact) and two medians (stable once a
//! few samples are in); `docs/DESIGN.md` has the reasoning.

use serde::{Deserialize, Serialize};

use crate::full::Interval;
use crate::incremental::{Pieces, ResetPolicy, RestoreRead, SavePoint};
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

/// The next value of a series along the line through its last two values, never below the
/// last (one value: the last).
pub fn predict_next(history: &[f64]) -> Option<f64> {
    match history {
        [] => None,
        [last] => Some(*last),
        [.., prev, last] => Some((last + (last - prev)).max(*last)),
    }
}

/// Samples the per-byte costs are the medians of (the most recent ones).
pub const WINDOW: usize = 64;

/// The median of `v` (`None` when empty; the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        0.5 * (s[m - 1] + s[m])
    })
}

/// What a restore costs, from what it reads: `bytes * s_per_byte + files * s_per_file` (no
/// timing, so nothing the page cache moves). The defaults are cold local reads on the
/// benchmark's machine: fitted to its cold restores of Check-N-Run and naive incremental
/// (1.2 ns a byte, 0.05 ms a file; `docs/DESIGN.md`); a store whose requests cost more (an S3
/// GET: tens of milliseconds) wants its own.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReadModel {
    pub s_per_byte: f64,
    pub s_per_file: f64,
}

impl Default for ReadModel {
    fn default() -> Self {
        ReadModel {
            s_per_byte: 1.2e-9,
            s_per_file: 5e-5,
        }
    }
}

impl ReadModel {
    /// Seconds to read `bytes` in `files` files.
    pub fn seconds(&self, bytes: f64, files: f64) -> f64 {
        bytes * self.s_per_byte + files * self.s_per_file
    }

    fn validate(&self) -> Result<(), StrategyError> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if ok(self.s_per_byte) && ok(self.s_per_file) {
            Ok(())
        } else {
            Err(StrategyError::InvalidConfig(format!(
                "read model {} s/B, {} s/file: both must be finite and >= 0",
                self.s_per_byte, self.s_per_file
            )))
        }
    }
}

/// What one §4.5 decision is computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResetInputs {
    /// Bytes of the current base (`F`), all servers.
    pub full_bytes: f64,
    /// Seconds a full blocks training per byte (`c`).
    pub full_s_per_byte: f64,
    /// Seconds a piece blocks training (`C_incre`).
    pub piece_pause_s: f64,
    /// How reads are priced.
    pub read: ReadModel,
    /// Bytes and files restoring the base reads (the server that reads the most).
    pub base_read_bytes: f64,
    pub base_read_files: f64,
    /// Bytes and files restoring the next piece would read over the base (`B_i`, `N_i`).
    pub next_restore_bytes: f64,
    pub next_restore_files: f64,
}

/// The terms of one §4.5 decision, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResetCosts {
    pub c_base: f64,
    pub c_incre: f64,
    pub r_base: f64,
    pub r_i: f64,
    pub t_base: f64,
    pub t_incre: f64,
}

impl ResetCosts {
    /// IncrCP §4.5: a new base when `T_base < T_incre`.
    pub fn reset(&self) -> bool {
        self.t_base < self.t_incre
    }
}

/// IncrCP §4.5's terms from bytes, file counts, the construction medians and the read model.
pub fn reset_costs(i: &ResetInputs) -> ResetCosts {
    let c_base = i.full_s_per_byte * i.full_bytes;
    let c_incre = i.piece_pause_s;
    let r_base = i.read.seconds(i.base_read_bytes, i.base_read_files);
    let r_i = i.read.seconds(i.next_restore_bytes, i.next_restore_files);
    ResetCosts {
        c_base,
        c_incre,
        r_base,
        r_i,
        t_base: t_base(c_base, r_base),
        t_incre: t_incre(c_incre, r_base, r_i),
    }
}

/// Push `x` onto a window of the last [`WINDOW`] samples.
fn push_window(v: &mut Vec<f64>, x: f64) {
    if v.len() == WINDOW {
        v.remove(0);
    }
    v.push(x);
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
    /// How §4.5's rule prices a restore.
    #[serde(default)]
    pub read: ReadModel,
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
            read: ReadModel::default(),
        }
    }
}

/// IncrCP's reset policy and what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct IncrCpReset {
    config: IncrCpConfig,
    /// Bytes of the current base.
    full_bytes: Option<f64>,
    /// Samples: fulls' pauses per byte, pieces' pauses.
    full_cost: Vec<f64>,
    piece_pause: Vec<f64>,
    /// Bytes and files restoring the base reads (the newest report).
    base_read: Option<(f64, f64)>,
    /// Bytes and files a restore of each piece since the base reads over the base.
    restore_bytes: Vec<f64>,
    restore_files: Vec<f64>,
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
                let inputs = match (
                    self.full_bytes,
                    median(&self.full_cost),
                    median(&self.piece_pause),
                    self.base_read,
                    predict_next(&self.restore_bytes),
                    predict_next(&self.restore_files),
                ) {
                    (Some(f), Some(c), Some(p), Some((bb, bf)), Some(b), Some(n)) => ResetInputs {
                        full_bytes: f,
                        full_s_per_byte: c,
                        piece_pause_s: p,
                        read: self.config.read,
                        base_read_bytes: bb,
                        base_read_files: bf,
                        next_restore_bytes: b,
                        next_restore_files: n,
                    },
                    _ => {
                        return decision(
                            false,
                            "a piece: not every cost of the rule is measured yet".into(),
                            None,
                            None,
                        )
                    }
                };
                let k = reset_costs(&inputs);
                let full = k.reset();
                decision(
                    full,
                    format!(
                        "T_base {:.4}s {} T_incre {:.4}s (C_base {:.4}, C_incre {:.4}, R_base \
                         {:.4}, R_i {:.4}; F {:.0} B, base read {:.0} B in {:.0} files, B_i \
                         {:.0} B in {:.0} files, c {:.3e} s/B, read {:.3e} s/B + {:.3e} \
                         s/file)",
                        k.t_base,
                        if full { "<" } else { ">=" },
                        k.t_incre,
                        k.c_base,
                        k.c_incre,
                        k.r_base,
                        k.r_i,
                        inputs.full_bytes,
                        inputs.base_read_bytes,
                        inputs.base_read_files,
                        inputs.next_restore_bytes,
                        inputs.next_restore_files,
                        inputs.full_s_per_byte,
                        inputs.read.s_per_byte,
                        inputs.read.s_per_file,
                    ),
                    Some(k.t_base),
                    Some(k.t_incre),
                )
            }
        }
    }

    fn committed(&mut self, full: bool, cost_s: f64, bytes: u64) {
        let ok = cost_s.is_finite() && cost_s >= 0.0;
        if full {
            if ok && bytes > 0 {
                push_window(&mut self.full_cost, cost_s / bytes as f64);
            }
            self.full_bytes = Some(bytes as f64);
            // A new list: its restore cost starts over.
            self.restore_bytes.clear();
            self.restore_files.clear();
            self.base_read = None;
        } else if ok {
            push_window(&mut self.piece_pause, cost_s);
        }
    }

    fn estimate(&mut self, read: RestoreRead) {
        if self.full_bytes.is_none() {
            return;
        }
        self.base_read = Some((read.base_bytes as f64, read.base_files as f64));
        self.restore_bytes.push(read.chain_bytes as f64);
        self.restore_files.push(read.chain_files as f64);
    }
}

impl IncrCpReset {
    /// Bytes a restore of each piece since the base reads over the base, as estimated.
    pub fn history(&self) -> &[f64] {
        &self.restore_bytes
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
        config.read.validate()?;
        Pieces::with_policy(
            config.every,
            IncrCpReset {
                config,
                full_bytes: None,
                full_cost: Vec::new(),
                piece_pause: Vec::new(),
                base_read: None,
                restore_bytes: Vec::new(),
                restore_files: Vec::new(),
            },
        )
    }
}

/// The event a coordinator sends after a piece commits (for tests and callers building one).
pub fn estimate(base_bytes: u64, base_files: u64, chain_bytes: u64, chain_files: u64) -> Event {
    Event::RestoreEstimate {
        base_bytes,
        base_files,
        chain_bytes,
        chain_files,
    }
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
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 100.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 100.0]), Some(3.0));
        // The same rule from bytes and files: a 1000-byte base saved at 1 ms a byte, pieces
        // pausing 0.1 s, reads priced at 2 ms a byte and 0.1 s a file, the base read in no
        // file of its own (its bytes alone): C_base 1, C_incre 0.1, R_base 2, and
        // R_i = 0.002 * B_i + 0.1 * N_i.
        let at = |b: f64, n: f64| {
            reset_costs(&ResetInputs {
                full_bytes: 1000.0,
                full_s_per_byte: 1e-3,
                piece_pause_s: 0.1,
                read: ReadModel {
                    s_per_byte: 2e-3,
                    s_per_file: 0.1,
                },
                base_read_bytes: 1000.0,
                base_read_files: 0.0,
                next_restore_bytes: b,
                next_restore_files: n,
            })
        };
        let k = at(400.0, 0.0);
        assert!((k.c_base - 1.0).abs() < 1e-12 && (k.c_incre - 0.1).abs() < 1e-12);
        assert!((k.r_base - 2.0).abs() < 1e-12 && (k.r_i - 0.8).abs() < 1e-12);
        assert!((k.t_base - 3.0).abs() < 1e-12 && (k.t_incre - 2.9).abs() < 1e-12);
        assert!(!k.reset());
        assert!(!at(449.0, 0.0).reset());
        assert!(at(451.0, 0.0).reset());
        // The files count: 400 bytes in 2 files cost 1.0 s, past the 0.9 s a reset needs.
        assert!((at(400.0, 2.0).r_i - 1.0).abs() < 1e-12);
        assert!(!at(300.0, 2.0).reset());
        assert!(at(400.0, 2.0).reset());
    }

    /// Reads priced at 2 ms a byte, nothing a file: the config of the hand-built cases.
    fn per_byte() -> IncrCpConfig {
        let mut cfg = IncrCpConfig::every_steps(1);
        cfg.read = ReadModel {
            s_per_byte: 2e-3,
            s_per_file: 0.0,
        };
        cfg
    }

    /// Hand-built events: the chain's restore grows over a 1000-byte base whose full pauses
    /// 1 s, pieces pause 0.1 s, restoring costs 2 ms a byte. The strategy resets at the first
    /// save point whose extrapolated restore passes 450 bytes (the case above).
    #[test]
    fn resets_when_t_base_beats_t_incre() {
        let mut s = IncrCp::new(per_byte()).unwrap();
        assert_eq!(step(&mut s, 1)[1], Action::SaveFull { step: 1 });
        done(&mut s, 1, 1.0, 1000);
        // Nothing measured about pieces yet: a piece.
        assert!(matches!(step(&mut s, 2)[1], Action::SavePiece { .. }));
        done(&mut s, 2, 0.1, 100);
        s.on(&estimate(1000, 4, 300, 7));
        assert_eq!(s.policy().history(), &[300.0]);
        // B_i = 300: 0.1 + 2 + 0.6 = 2.7 < 3, a piece.
        assert!(matches!(step(&mut s, 3)[1], Action::SavePiece { .. }));
        done(&mut s, 3, 0.1, 100);
        s.on(&estimate(1000, 4, 300, 7));
        // B_i = 300 again (no growth): a piece.
        assert!(matches!(step(&mut s, 4)[1], Action::SavePiece { .. }));
        done(&mut s, 4, 0.1, 100);
        s.on(&estimate(1000, 4, 400, 8));
        // 300 -> 400: B_i = 500 > 450, a new base.
        assert_eq!(step(&mut s, 5)[1], Action::SaveFull { step: 5 });
        done(&mut s, 5, 1.0, 1000);
        let d = s.decisions();
        assert_eq!(d.iter().filter(|d| d.full).count(), 1);
        let last = d.last().unwrap();
        assert!(last.full && last.t_base_s.unwrap() < last.t_incre_s.unwrap());
        assert!(last.reason.contains("T_base"), "{}", last.reason);
        // The new list's history starts over: a piece again.
        assert!(matches!(step(&mut s, 6)[1], Action::SavePiece { .. }));
        assert!(s.policy().history().is_empty());
    }

    /// A run with every timed figure disturbed: a quarter of the piece pauses and one full
    /// pause in three 10x too long. Single samples would reset on the spikes; the medians give
    /// the undisturbed run's decisions. (The restore side is bytes and files: nothing timed.)
    #[test]
    fn noisy_measurements_give_the_same_decisions() {
        let run = |noisy: bool| -> Vec<bool> {
            let mut s = IncrCp::new(per_byte()).unwrap();
            let mut fulls = Vec::new();
            // Restore bytes over the base by piece: 300, 300, 340, 380, ... (+40 a piece):
            // with the costs above (a reset past 450), a new base after every 5 pieces.
            let (mut pieces, mut all_fulls) = (0u64, 0u64);
            for n in 1..=40u64 {
                let full = matches!(step(&mut s, n)[1], Action::SaveFull { .. });
                fulls.push(full);
                let spike = if noisy && n % 4 == 0 { 10.0 } else { 1.0 };
                if full {
                    all_fulls += 1;
                    let spike = if noisy && all_fulls % 3 == 0 {
                        10.0
                    } else {
                        1.0
                    };
                    done(&mut s, n, 1.0 * spike, 1000);
                    pieces = 0;
                } else {
                    done(&mut s, n, 0.1 * spike, 100);
                    pieces += 1;
                    let bytes = 300 + 40 * pieces.saturating_sub(2);
                    s.on(&estimate(1000, 3, bytes, 5));
                }
            }
            fulls
        };
        let clean = run(false);
        assert_eq!(run(true), clean);
        let at: Vec<usize> = (0..clean.len()).filter(|&i| clean[i]).collect();
        assert_eq!(at, vec![0, 6, 12, 18, 24, 30, 36], "{clean:?}");
    }

    /// A replay of what a run reports, reads priced at 2 ns a byte and 0.5 ms a file (a store
    /// with ten times the default's cost a request): a base of 19.5 MB in 26
    /// files whose full paused 0.12 s, pieces pausing 14 ms, and each piece's newest state
    /// reading 15 MB over the base. Read from a few bundles (concatenation on: the files grow
    /// by one a piece), the list never costs more to restore than a new base costs to write,
    /// and every save point keeps it; read from a file per chunk (concatenation off, 60 more
    /// files a piece), the same bytes pass that cost after two pieces and the rule resets.
    /// Nothing here is timed but the pauses, so the decisions are the same on any machine and
    /// page cache.
    #[test]
    fn the_file_count_decides_when_the_bytes_do_not() {
        let replay = |files_per_piece: u64| -> (Vec<bool>, Vec<Decision>) {
            let mut cfg = IncrCpConfig::every_steps(1);
            cfg.read = ReadModel {
                s_per_byte: 2e-9,
                s_per_file: 5e-4,
            };
            let mut s = IncrCp::new(cfg).unwrap();
            let mut fulls = Vec::new();
            let mut pieces = 0u64;
            for n in 1..=30u64 {
                let full = matches!(step(&mut s, n)[1], Action::SaveFull { .. });
                fulls.push(full);
                if full {
                    done(&mut s, n, 0.12, 19_500_000);
                    pieces = 0;
                } else {
                    done(&mut s, n, 0.014, 2_700_000);
                    pieces += 1;
                    s.on(&estimate(
                        19_500_000,
                        26,
                        15_000_000,
                        2 + files_per_piece * pieces,
                    ));
                }
            }
            (fulls, s.decisions())
        };
        let (bundles, kept) = replay(1);
        assert_eq!(
            bundles.iter().filter(|&&f| f).count(),
            1,
            "keeps the list: {bundles:?}"
        );
        assert!(kept.iter().filter(|d| d.t_incre_s.is_some()).count() > 20);
        let (plain, reset) = replay(60);
        let at: Vec<usize> = (0..plain.len()).filter(|&i| plain[i]).collect();
        // C_base - C_incre = 0.106 s against R_i = 30 ms + 0.5 ms a file: a reset once the
        // next piece's restore reads more than 152 files; two pieces in, the line through 62
        // and 122 files predicts 182.
        assert_eq!(at, (0..30).step_by(3).collect::<Vec<_>>(), "{plain:?}");
        let d = reset
            .iter()
            .find(|d| d.full && d.t_base_s.is_some())
            .unwrap();
        assert!(d.t_base_s.unwrap() < d.t_incre_s.unwrap(), "{d:?}");
        assert!(d.reason.contains("182 files"), "{}", d.reason);
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
            s.on(&estimate(1, 1, n, n));
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

//! The pace of an ECRec rebuild: the share of the time a replacement's background rebuild
//! works, set from the training throughput it leaves.
//!
//! ECRec keeps training going while a lost server is rebuilt, at 87–93% of its throughput
//! (ECRec §5.3, Fig. 10–11), and finishes the rebuild faster than checkpointing recovers
//! (Fig. 12). On cores that training also uses, the two compete: a rebuild at full speed
//! takes training's throughput down, one at a small fixed share takes long. The pacer takes
//! what training leaves: it measures training's batch rate over windows of a few batches
//! while the rebuild runs, and sets the share so that the rate stays at `target` of the rate
//! before the failure, raising it while training keeps more than that (and has kept the
//! target on the mean since the rebuild began: the target is about the whole rebuild, so a
//! window above it after a dip makes up for the dip before the share grows), so that the
//! rebuild finishes as soon as the target allows. Below the target it cuts the share, unless
//! the last cut gave training nothing back: then what slows training is the rebuild being
//! under way (rows decoded on demand, ECRec §3.4's degraded reads), not its work, and the
//! pacer raises the share instead so that it ends sooner, for as long as training loses
//! nothing by it.
//!
//! Pure: the cluster feeds it batch counts and times, and sends the shares it returns to the
//! rebuilding servers.
//!
//! ```
//! use ftrec_strategy::RebuildPacer;
//! let mut p = RebuildPacer::new(0.9, 0.25).unwrap();
//! p.start(9.9, 100);
//! // Training resumes: the first window opens with its first batch.
//! assert_eq!(p.on_progress(10.0, 101, 20.0), None);
//! // Training kept 20 batches/s against 20 before: the rebuild may take more.
//! assert_eq!(p.on_progress(10.5, 111, 20.0), Some(0.325));
//! // Then it fell to 70%: the share is cut.
//! let s = p.on_progress(11.5, 125, 20.0).unwrap();
//! assert!(s < 0.325);
//! ```

use crate::StrategyError;

/// Shortest window a decision is made on, in seconds, and fewest batches in it: a rate from
/// fewer batches is mostly the noise of when they happened to end.
pub const MIN_WINDOW_S: f64 = 0.5;
pub const MIN_WINDOW_BATCHES: u64 = 8;
/// A window this long is decided on whatever number of batches it holds (slow training).
pub const MAX_WINDOW_S: f64 = 3.0;
/// The share never goes below this: a rebuild must progress, or the degraded reads it saves
/// training from last for ever.
pub const MIN_SHARE: f64 = 0.05;
/// Training above `target + HEADROOM` raises the share.
const HEADROOM: f64 = 0.03;
/// Factor of a raise, and the deepest cut (a rate far below target halves the share).
const RAISE: f64 = 1.3;
const DEEPEST_CUT: f64 = 0.5;

/// The pacer of one rebuild round (every replacement rebuilding at once gets its share).
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildPacer {
    target: f64,
    share: f64,
    /// Start of the current window, and the batches completed by then.
    window_start_s: f64,
    window_start_batches: u64,
    started: bool,
    /// No batch has finished since the start: the first window opens at the first one, so
    /// that the pause before training resumes is not taken for the rebuild's cost.
    awaiting_first: bool,
    /// The previous window's move and training's ratio in it.
    last: Option<(Move, f64)>,
    /// Where the round's first window opened, and the batches completed by then: training's
    /// mean ratio over the rebuild is counted from there.
    round_start_s: f64,
    round_start_batches: u64,
}

impl RebuildPacer {
    /// A pacer that keeps training at `target` (0 < target <= 1) of its rate before the
    /// failure, starting at share `start_share` (`MIN_SHARE` <= share <= 1).
    pub fn new(target: f64, start_share: f64) -> Result<Self, StrategyError> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(StrategyError::InvalidConfig(format!(
                "the rebuild's throughput target {target} must be a fraction above 0 and at \
                 most 1 (--rebuild-min-throughput)"
            )));
        }
        if !(MIN_SHARE..=1.0).contains(&start_share) {
            return Err(StrategyError::InvalidConfig(format!(
                "the rebuild's starting share {start_share} must be from {MIN_SHARE} to 1"
            )));
        }
        Ok(RebuildPacer {
            target,
            share: start_share,
            window_start_s: 0.0,
            window_start_batches: 0,
            started: false,
            awaiting_first: false,
            last: None,
            round_start_s: 0.0,
            round_start_batches: 0,
        })
    }

    /// The throughput target.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// The share the rebuild has now.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// Whether a rebuild round is being paced.
    pub fn started(&self) -> bool {
        self.started
    }

    /// A rebuild round starts (or restarts, after a further loss) at `now_s`, with `batches`
    /// completed so far: the first window opens with the next batch that finishes, and the
    /// share is kept.
    pub fn start(&mut self, now_s: f64, batches: u64) {
        self.started = true;
        self.awaiting_first = true;
        self.last = None;
        self.window_start_s = now_s;
        self.window_start_batches = batches;
    }

    /// Every rebuild finished: nothing to pace until the next [`RebuildPacer::start`].
    pub fn stop(&mut self) {
        self.started = false;
    }

    /// Training had completed `batches` batches in all by `now_s`; `before` is its rate
    /// (batches per second) before the failure. At the end of a window, the new share if it
    /// changed.
    pub fn on_progress(&mut self, now_s: f64, batches: u64, before: f64) -> Option<f64> {
        if !self.started || before.is_nan() || before <= 0.0 {
            return None;
        }
        if self.awaiting_first {
            if batches > self.window_start_batches {
                self.awaiting_first = false;
                self.window_start_s = now_s;
                self.window_start_batches = batches;
                self.round_start_s = now_s;
                self.round_start_batches = batches;
            }
            return None;
        }
        let span = now_s - self.window_start_s;
        let n = batches.saturating_sub(self.window_start_batches);
        let full = (span >= MIN_WINDOW_S && n >= MIN_WINDOW_BATCHES) || span >= MAX_WINDOW_S;
        if !full || span <= 0.0 {
            return None;
        }
        self.window_start_s = now_s;
        self.window_start_batches = batches;
        let ratio = n as f64 / span / before;
        let since = now_s - self.round_start_s;
        let mean = batches.saturating_sub(self.round_start_batches) as f64 / since / before;
        let old = self.share;
        let last = self.last.replace((Move::Hold, ratio));
        let mv = if ratio >= self.target + HEADROOM && mean >= self.target {
            Move::Raise
        } else if ratio >= self.target {
            // At the target, or above it while the rebuild's mean is still below: hold.
            Move::Hold
        } else {
            match last {
                // Below the target after a cut that gave training nothing back: what slows
                // training is not the rebuild's work but what a rebuild under way costs
                // (rows decoded on demand); the sooner it ends the better.
                Some((Move::Cut, prev)) if ratio <= prev + NOISE => Move::Raise,
                // Raised for that reason and training lost nothing by it: go on.
                Some((Move::Raise, prev)) if prev < self.target && ratio >= prev - NOISE => {
                    Move::Raise
                }
                _ => Move::Cut,
            }
        };
        match mv {
            Move::Cut => {
                // The further below, the deeper the cut.
                let cut = (1.0 - 4.0 * (self.target - ratio)).max(DEEPEST_CUT);
                self.share = (self.share * cut).max(MIN_SHARE);
            }
            Move::Raise => self.share = (self.share * RAISE).min(1.0),
            Move::Hold => {}
        }
        self.last = Some((mv, ratio));
        (self.share != old).then_some(self.share)
    }
}

/// What the pacer did at the end of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Cut,
    Hold,
    Raise,
}

/// Two windows' ratios closer than this are the same for the pacer (a window's rate from a
/// few batches varies by a few points).
const NOISE: f64 = 0.02;

impl RebuildPacer {
    /// The last window's move and ratio (`None` before the first window of a round).
    #[cfg(test)]
    fn last_move(&self) -> Option<(Move, f64)> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches done when the first window of [`pacer`] opened (at 0 s).
    const B: u64 = 100;

    /// A pacer whose first window opened at 0 s, with [`B`] batches done.
    fn pacer() -> RebuildPacer {
        let mut p = RebuildPacer::new(0.9, 0.25).unwrap();
        p.start(-1.0, B - 1);
        // Until training's first batch after the start, nothing opens.
        assert_eq!(p.on_progress(-0.5, B - 1, 20.0), None);
        assert_eq!(p.on_progress(0.0, B, 20.0), None);
        p
    }

    #[test]
    fn bad_targets_and_shares_are_refused_naming_the_flag() {
        for t in [0.0, -0.1, 1.5, f64::NAN] {
            let e = RebuildPacer::new(t, 0.25).unwrap_err().to_string();
            assert!(e.contains("--rebuild-min-throughput"), "{e}");
        }
        assert!(RebuildPacer::new(0.9, 0.0).is_err());
        assert!(RebuildPacer::new(0.9, 1.1).is_err());
    }

    #[test]
    fn nothing_is_decided_before_a_window_is_full() {
        let mut p = pacer();
        // Enough time, too few batches; enough batches, too little time.
        assert_eq!(p.on_progress(0.6, B + 5, 20.0), None);
        assert_eq!(p.on_progress(0.3, B + 50, 20.0), None);
        // Before the round starts or without a rate before the failure: nothing.
        let mut q = RebuildPacer::new(0.9, 0.25).unwrap();
        assert_eq!(q.on_progress(5.0, 100, 20.0), None);
        q.start(0.0, 0);
        assert_eq!(q.on_progress(5.0, 100, 0.0), None);
    }

    #[test]
    fn training_above_target_raises_the_share_up_to_one() {
        let mut p = pacer();
        let mut t = 0.0;
        let mut b = B;
        let mut shares = Vec::new();
        for _ in 0..10 {
            t += 1.0;
            b += 19; // 95% of 20 batches/s
            if let Some(s) = p.on_progress(t, b, 20.0) {
                shares.push(s);
            }
        }
        assert!(shares.windows(2).all(|w| w[1] > w[0]), "{shares:?}");
        assert_eq!(p.share(), 1.0);
    }

    #[test]
    fn training_below_target_cuts_the_share_deeper_the_further_below() {
        let mut a = pacer();
        let mut b = pacer();
        let sa = a.on_progress(1.0, B + 17, 20.0).unwrap(); // 85%
        let sb = b.on_progress(1.0, B + 12, 20.0).unwrap(); // 60%
        assert!(sa < 0.25 && sb < sa, "{sa} {sb}");
        assert_eq!(sb, 0.25 * DEEPEST_CUT);
    }

    #[test]
    fn a_cut_that_gives_training_nothing_back_turns_into_raises_while_they_cost_nothing() {
        let mut p = pacer();
        // 80%: cut. Still 80% (the cut did not help): raise.
        let cut = p.on_progress(1.0, B + 16, 20.0).unwrap();
        assert!(cut < 0.25);
        assert_eq!(p.last_move().map(|m| m.0), Some(Move::Cut));
        let up = p.on_progress(2.0, B + 32, 20.0).unwrap();
        assert_eq!(up, cut * RAISE);
        // 80% again: the raise cost nothing, raise on.
        let up2 = p.on_progress(3.0, B + 48, 20.0).unwrap();
        assert_eq!(up2, up * RAISE);
        // 70%: the raise cost training: cut.
        let down = p.on_progress(4.0, B + 62, 20.0).unwrap();
        assert!(down < up2);
        assert_eq!(p.last_move().map(|m| m.0), Some(Move::Cut));
    }

    #[test]
    fn cuts_that_help_go_on_until_the_target_is_met() {
        let mut p = pacer();
        let a = p.on_progress(1.0, B + 16, 20.0).unwrap(); // 80%: cut
        let b = p.on_progress(2.0, B + 33, 20.0).unwrap(); // 85%: better, still below: cut
        assert!(b < a, "{a} {b}");
        assert_eq!(p.on_progress(3.0, B + 51, 20.0), None); // 90%: hold
    }

    #[test]
    fn windows_above_the_target_raise_only_once_the_rebuild_s_mean_has_reached_it() {
        let mut p = pacer();
        // 60% of before: cut.
        let cut = p.on_progress(1.0, B + 12, 20.0).unwrap();
        assert!(cut < 0.25);
        // 95% and 100% in the next windows, but the mean since the rebuild began is 77.5%,
        // then 85%: hold until it has made up for the dip.
        assert_eq!(p.on_progress(2.0, B + 31, 20.0), None);
        assert_eq!(p.last_move().map(|m| m.0), Some(Move::Hold));
        assert_eq!(p.on_progress(3.0, B + 51, 20.0), None);
        // Mean 88.75%: still hold.
        assert_eq!(p.on_progress(4.0, B + 71, 20.0), None);
        // Mean 91%: raise.
        assert_eq!(p.on_progress(5.0, B + 91, 20.0), Some(cut * RAISE));
        // A restart counts the mean afresh from its first window.
        p.start(10.0, 500);
        assert_eq!(p.on_progress(10.5, 501, 20.0), None);
        assert_eq!(p.on_progress(11.5, 521, 20.0), Some(cut * RAISE * RAISE));
    }

    #[test]
    fn within_the_headroom_the_share_stays() {
        let mut p = pacer();
        // 91% of before: at the target, not above it by the headroom.
        assert_eq!(p.on_progress(1.0, B + 91, 100.0), None);
        assert_eq!(p.share(), 0.25);
    }

    #[test]
    fn the_share_never_falls_below_the_floor() {
        let mut p = pacer();
        let mut b = B;
        // Every cut gives training a little back, and it stays below the target.
        for i in 1..=12u64 {
            b += 8 + 3 * i; // 11%, 14%, ... of 100 batches/s
            p.on_progress(i as f64, b, 100.0);
            assert_eq!(p.last_move().map(|m| m.0), Some(Move::Cut));
        }
        assert_eq!(p.share(), MIN_SHARE);
    }

    #[test]
    fn a_restart_begins_a_new_window_and_keeps_the_share() {
        let mut p = pacer();
        let s = p.on_progress(1.0, B + 12, 20.0).unwrap();
        p.start(5.0, 200);
        // The batches before the restart do not count: the new window opens with the
        // first batch after it, and decides nothing before it is full.
        assert_eq!(p.on_progress(5.1, 201, 20.0), None);
        assert_eq!(p.on_progress(5.3, 220, 20.0), None);
        assert_eq!(p.share(), s);
        p.stop();
        assert_eq!(p.on_progress(9.0, 300, 20.0), None);
    }
}

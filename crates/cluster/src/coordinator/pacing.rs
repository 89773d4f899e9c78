//! The pace of ECRec rebuilds while training runs: the coordinator's side of
//! [`ftrec_strategy::RebuildPacer`] (the share of the time every rebuild works, set from the
//! batch rate training keeps), the full share once training ends, and the throughput training
//! kept while each rebuild ran (ECRec §5.3 reports 87–93%).

use ftrec_ps::ec::{EcService, FULL_SHARE_PPM};

use super::ecrec::BEFORE_WINDOW_S;
use super::Coordinator;
use crate::Role;

/// Batches per second among `done` (completion times, ascending) in `[a, b)`.
fn rate(done: &[f64], a: f64, b: f64) -> Option<f64> {
    if b <= a {
        return None;
    }
    let lo = done.partition_point(|&t| t < a);
    let hi = done.partition_point(|&t| t < b);
    Some((hi - lo) as f64 / (b - a))
}

/// The window before a kill at `kill` (seconds of training) that its throughput is compared
/// with: [`BEFORE_WINDOW_S`], cut at `first`, training's first answer.
fn before_window(kill: f64, first: f64) -> (f64, f64) {
    ((kill - BEFORE_WINDOW_S).max(first), kill)
}

/// Batches per second in `[a, b)` from batches' spans (handed out, answered): each batch counts
/// by the part of its span inside the window, so a window that starts where a pause ended,
/// with every worker's batch handed out at once, counts those batches by the work done in it,
/// not whole at their answers (and one that ends mid-batch counts the part done).
fn span_rate(spans: &[(f64, f64)], a: f64, b: f64) -> Option<f64> {
    if b <= a {
        return None;
    }
    let done: f64 = spans
        .iter()
        .map(|&(s, e)| {
            if e <= s {
                return f64::from(u8::from(e >= a && e < b));
            }
            (e.min(b) - s.max(a)).max(0.0) / (e - s)
        })
        .sum();
    Some(done / (b - a))
}

/// A share as the servers take it, in millionths.
fn ppm(share: f64) -> u32 {
    (share.clamp(0.0, 1.0) * f64::from(FULL_SHARE_PPM)).round() as u32
}

impl Coordinator {
    /// Where training started on the run's clock.
    fn train_t0(&self) -> Option<f64> {
        Some(self.train_start?.duration_since(self.start).as_secs_f64())
    }

    /// The newest server kill at or before `at` (run clock).
    fn kill_before(&self, at: f64) -> Option<f64> {
        self.failures
            .iter()
            .filter(|f| f.role == Role::Server && f.injected_t_s <= at)
            .map(|f| f.injected_t_s)
            .reduce(f64::max)
    }

    /// Training's batch rate in the [`BEFORE_WINDOW_S`] before `kill` (run clock), from the
    /// first batch on; `None` when no batch finished then.
    fn rate_before(&self, kill: f64) -> Option<f64> {
        let t0 = self.train_t0()?;
        let done = &self.completions;
        let first = *done.first()?;
        let (a, b) = before_window(kill - t0, first);
        rate(done, a, b).filter(|&r| r > 0.0)
    }

    /// Give every rebuild under way `ppm` of the time; a node that does not answer is lost
    /// (the next step or probe finds it).
    fn ec_send_share(&mut self, ppm: u32) {
        let Some(ec) = &self.ec else { return };
        let clients: Vec<_> = ec
            .rebuilding
            .iter()
            .map(|&(s, _)| ec.clients[s as usize].clone())
            .collect();
        let timeout = self.rpc_timeout();
        for c in clients {
            let _ = self.rt.block_on(async move {
                tokio::time::timeout(timeout, c.set_rebuild_share(ppm)).await
            });
        }
    }

    /// Training is over: let every rebuild under way work at full speed.
    pub(super) fn ec_lift_rebuild_share(&mut self) {
        if let Some(p) = self.ec.as_mut().and_then(|e| e.pacer.as_mut()) {
            p.stop();
        }
        self.ec_send_share(FULL_SHARE_PPM);
    }

    /// Rebuilds were (re)started: the pacer starts a window (a round already paced keeps its
    /// share) and every rebuilding node gets the share, a new replacement included.
    pub(super) fn ec_pace_start(&mut self) {
        let now = self.now();
        let batches = self.completions.len() as u64;
        let t = self.train_t0().map_or(0.0, |t0| now - t0);
        let Some(ec) = self.ec.as_mut() else { return };
        let Some(p) = ec.pacer.as_mut() else { return };
        p.start(t, batches);
        let share = p.share();
        for &(_, i) in &ec.rebuilding {
            ec.report.rebuilds[i].shares.push((now, share));
        }
        self.ec_send_share(ppm(share));
    }

    /// The pacer's window may have ended: a new share goes to every rebuilding node. Once no
    /// rebuild is under way the pacer rests.
    pub(super) fn ec_pace(&mut self) {
        let now = self.now();
        let Some(ec) = self.ec.as_ref() else { return };
        if ec.finishing || !ec.pacer.as_ref().is_some_and(|p| p.started()) {
            return;
        }
        if ec.rebuilding.is_empty() {
            if let Some(p) = self.ec.as_mut().and_then(|e| e.pacer.as_mut()) {
                p.stop();
            }
            return;
        }
        let (Some(kill), Some(t0)) = (self.kill_before(now), self.train_t0()) else {
            return;
        };
        let Some(before) = self.rate_before(kill) else {
            return;
        };
        let batches = self.completions.len() as u64;
        let Some(ec) = self.ec.as_mut() else { return };
        let Some(share) = ec
            .pacer
            .as_mut()
            .and_then(|p| p.on_progress(now - t0, batches, before))
        else {
            return;
        };
        for &(_, i) in &ec.rebuilding {
            ec.report.rebuilds[i].shares.push((now, share));
        }
        self.ec_send_share(ppm(share));
    }

    /// For every rebuild, the training throughput while it ran (as a whole, from training
    /// resumed to the rebuild's end, and per lock range) over the throughput in the
    /// [`BEFORE_WINDOW_S`] before the kill that caused it, both from the batches' spans.
    pub(super) fn ec_throughput_shares(&mut self) {
        let Some(t0) = self.train_t0() else { return };
        // The before-window starts at the first answer, as the pacer's does.
        let Some(first) = self.spans.iter().map(|s| s.1).reduce(f64::min) else {
            return;
        };
        let train_end = self.spans.iter().map(|s| s.1).fold(first, f64::max);
        // On the run's clock; a span that outlasts training has no rate.
        let during = |a: f64, b: f64| -> Option<f64> {
            let (a, b) = (a - t0, b - t0);
            if b > train_end {
                return None;
            }
            span_rate(&self.spans, a, b)
        };
        let Some(ec) = self.ec.as_ref() else { return };
        let mut shares = Vec::with_capacity(ec.report.rebuilds.len());
        for b in &ec.report.rebuilds {
            let kill = self.kill_before(b.started_s);
            let before = kill.and_then(|k| {
                let (a, b) = before_window(k - t0, first);
                span_rate(&self.spans, a, b).filter(|&r| r > 0.0)
            });
            let Some(before) = before else {
                shares.push(None);
                continue;
            };
            // The whole rebuild counts from training resumed: the pause from the kill to then
            // is the recovery's own figure (kill to resumed), not what the rebuild takes.
            let resumed = self
                .failures
                .iter()
                .filter(|f| f.role == Role::Server && Some(f.injected_t_s) == kill)
                .filter_map(|f| f.resumed_s.map(|r| f.injected_t_s + r))
                .reduce(f64::max);
            let ranges: Vec<Option<f64>> = b
                .range_spans_s
                .iter()
                .map(|&(s, e)| during(s, e).map(|r| r / before))
                .collect();
            let whole = match (b.joined_s, b.finished_s) {
                (Some(j), Some(f)) => {
                    let from = resumed.map_or(j, |r| r.max(j)).min(f);
                    during(from, f).map(|r| r / before)
                }
                _ => None,
            };
            shares.push(Some((ranges, whole)));
        }
        let Some(ec) = self.ec.as_mut() else { return };
        for (b, s) in ec.report.rebuilds.iter_mut().zip(shares) {
            if let Some((ranges, whole)) = s {
                b.range_throughput_share = ranges;
                b.throughput_share = whole;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 15 workers handed batches of 1 s all at once at 5 s (training resumed after a pause),
    /// one after the other until 20 s.
    fn resumed_together() -> Vec<(f64, f64)> {
        (0..15)
            .flat_map(|_| (5..20).map(|s| (f64::from(s), f64::from(s + 1))))
            .collect()
    }

    #[test]
    fn a_window_counts_each_batch_by_its_work_inside_it() {
        let spans = resumed_together();
        // From the resume: 15 batches a second whatever the window's length or phase, where
        // answers alone give 15 batches in the first 1.1 s window and none in [5, 5.9).
        for (a, b) in [
            (5.0, 6.1),
            (5.0, 5.9),
            (5.3, 7.7),
            (5.0, 20.0),
            (12.25, 12.5),
        ] {
            let r = span_rate(&spans, a, b).unwrap();
            assert!((r - 15.0).abs() < 1e-9, "[{a}, {b}): {r}");
        }
        assert!((rate(&[6.0; 15], 5.0, 6.1).unwrap() - 15.0 / 1.1).abs() < 1e-9);
        assert_eq!(rate(&[6.0; 15], 5.0, 5.9), Some(0.0));
        // Half the window before training resumed: half the rate.
        assert!((span_rate(&spans, 4.0, 6.0).unwrap() - 7.5).abs() < 1e-9);
        assert_eq!(span_rate(&spans, 6.0, 6.0), None);
    }

    #[test]
    fn a_batch_without_duration_counts_where_it_was_answered() {
        let spans = [(2.0, 2.0), (3.0, 3.0)];
        assert_eq!(span_rate(&spans, 1.0, 3.0), Some(0.5));
        assert_eq!(span_rate(&spans, 2.0, 4.0), Some(1.0));
    }
}

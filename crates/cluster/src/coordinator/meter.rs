//! The coordinator's part of the process metrics ([`ftrec_obs::metrics`]): steps, samples and
//! their rate, saves, failures and recoveries with each phase's time, live processes. Fed
//! from the same places as the run report (a completed step, a committed save, the timeline
//! events), so a scrape and the report agree.

use ftrec_obs::{metrics, Metrics, Phase, RoleLabel};

use super::Coordinator;
use crate::report::{EventKind, FailureReport};
use crate::{Role, StrategyChoice};

/// What the coordinator has counted so far.
#[derive(Debug, Default)]
pub(super) struct Meter {
    /// Per failure record: counted as a failure, counted as a recovery.
    seen: Vec<(bool, bool)>,
    /// When the previous step completed (seconds into the run).
    last_step_s: Option<f64>,
    /// Start of the current samples/s window: seconds into the run, samples then.
    window: Option<(f64, u64)>,
    samples: u64,
    /// When the save in flight started.
    save_started_s: Option<f64>,
    servers_up: bool,
    workers_up: bool,
}

impl Coordinator {
    /// One batch applied.
    pub(super) fn meter_batch(&mut self) {
        let n = self.cfg.batch as u64;
        metrics().samples.inc_by(n);
        self.meter.samples += n;
    }

    /// A step completed at `now_s`.
    pub(super) fn meter_step(&mut self, step: u64, now_s: f64) {
        let m = metrics();
        m.steps.inc();
        m.step.set(i64::try_from(step).unwrap_or(i64::MAX));
        if let Some(prev) = self.meter.last_step_s.replace(now_s) {
            m.step_seconds.observe((now_s - prev).max(0.0));
        }
        let samples = self.meter.samples;
        match self.meter.window {
            Some((t, s)) if now_s - t >= self.cfg.report_interval_s.max(0.1) => {
                let rate = (samples - s) as f64 / (now_s - t).max(1e-9);
                m.samples_per_second.set(rate);
                tracing::info!(
                    target: ftrec_obs::PROGRESS_TARGET,
                    step,
                    samples,
                    samples_per_second = rate,
                    t_s = now_s,
                    "step {step}: {rate:.0} samples/s"
                );
                self.meter.window = Some((now_s, samples));
            }
            Some(_) => {}
            None => self.meter.window = Some((now_s, samples)),
        }
    }

    /// A save committed: its bytes and the pause it cost training.
    pub(super) fn meter_save(&self, bytes: u64, pause_s: f64) {
        let m = metrics();
        let s = Metrics::strategy(self.cfg.strategy.name());
        m.checkpoint_bytes.get_or_create(&s).inc_by(bytes);
        m.checkpoint_pause_seconds
            .get_or_create(&s)
            .observe(pause_s);
    }

    /// A timeline event at `t_s`: saves' outcomes, readiness, and the failure records'
    /// progress (every change to a record is followed by an event).
    pub(super) fn meter_event(&mut self, kind: EventKind, t_s: f64) {
        let m = metrics();
        let strategy = self.cfg.strategy.name();
        match kind {
            EventKind::ServersStarted => self.meter.servers_up = true,
            EventKind::WorkersStarted => {
                self.meter.workers_up = true;
                ftrec_obs::set_ready(true);
            }
            EventKind::CheckpointStart => self.meter.save_started_s = Some(t_s),
            EventKind::CheckpointEnd => {
                m.checkpoint(strategy, true);
                if let Some(t0) = self.meter.save_started_s.take() {
                    m.checkpoint_commit_seconds
                        .get_or_create(&Metrics::strategy(strategy))
                        .observe((t_s - t0).max(0.0));
                }
            }
            EventKind::CheckpointFailed => {
                m.checkpoint(strategy, false);
                self.meter.save_started_s = None;
            }
            _ => {}
        }
        self.meter_failures();
    }

    /// Count the failure records' new detections and recoveries, and the live processes.
    fn meter_failures(&mut self) {
        let m = metrics();
        let degraded = matches!(self.cfg.strategy, StrategyChoice::EcRec { .. });
        self.meter.seen.resize(self.failures.len(), (false, false));
        for (f, seen) in self.failures.iter().zip(self.meter.seen.iter_mut()) {
            let role = RoleLabel::new(f.role.to_string());
            if !seen.0 && f.detected_s.is_some() {
                seen.0 = true;
                m.failures.get_or_create(&role).inc();
            }
            if !seen.1 && f.recovered_s.is_some() {
                seen.1 = true;
                m.recoveries.get_or_create(&role).inc();
                observe_phases(f, degraded);
            }
        }
        let down = |role: Role| {
            self.failures
                .iter()
                .filter(|f| f.role == role && f.detected_s.is_some() && f.replaced_s.is_none())
                .count() as i64
        };
        for (role, up, total) in [
            (Role::Server, self.meter.servers_up, self.cfg.servers),
            (Role::Worker, self.meter.workers_up, self.cfg.workers),
        ] {
            let live = if up { i64::from(total) - down(role) } else { 0 };
            m.live_processes
                .get_or_create(&RoleLabel::new(role.to_string()))
                .set(live.max(0));
        }
    }
}

/// A recovered failure's phases, each from the end of the one before.
fn observe_phases(f: &FailureReport, degraded: bool) {
    let m = metrics();
    let marks = [
        (Phase::Detect, Some(0.0), f.detected_s),
        (Phase::Replace, f.detected_s, f.replaced_s),
        (Phase::Reload, f.replaced_s, f.resumed_s),
        (
            if degraded {
                Phase::Degraded
            } else {
                Phase::Redo
            },
            f.resumed_s,
            f.recovered_s,
        ),
    ];
    for (phase, from, to) in marks {
        if let (Some(a), Some(b)) = (from, to) {
            m.recovery_phase(phase, b - a);
        }
    }
}

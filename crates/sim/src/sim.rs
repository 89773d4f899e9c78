//! The discrete-event simulation of one training job under failures.
//!
//! A job is described by a [`JobModel`]: a steady slowdown, optional periodic saves (a pause
//! every so much progress), and what a server failure costs (detection, replacement, reload, a
//! rollback or a degraded window). Time is wall-clock seconds; progress ("work") is measured in
//! seconds of failure-free training, so a job that finishes `W` seconds of work in `T` seconds
//! has the overhead `T / W - 1` that `ftrec compare` measures against `none`.
//!
//! Every second of wall time is attributed to exactly one bucket of [`Breakdown`] (the terms of
//! CPR Eq. 1: save, load, lost computation, rescheduling; plus degraded throughput and the steady
//! slowdown), so the buckets add up to the wall time minus the useful work; a test checks it.

use serde::{Deserialize, Serialize};

use crate::failure::{Failure, FailureDist, FailureProcess};
use crate::SimError;

/// What a failure does to the training progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rollback {
    /// Every server goes back to the last committed save; the work since is lost (full
    /// recovery, CPR §2.2, and DECK §4.3's restore of the newest delta).
    ToLastSave,
    /// Everything is lost: the job starts over (no fault tolerance).
    Restart,
    /// No progress is lost: erasure-coded redundancy (ECRec §3.4) or partial recovery (CPR §2.3,
    /// whose loss is in model quality, tracked as PLS).
    Keep,
}

/// Periodic saves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SaveModel {
    /// Progress between two saves, in seconds of failure-free training.
    pub every_work_s: f64,
    /// Training pause of a save.
    pub pause_s: f64,
    /// Pause of the first save (DECK's full base before the deltas).
    pub first_pause_s: f64,
}

/// A window after a failure during which training runs at `share` of its normal speed
/// (ECRec's background rebuild, §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Degraded {
    pub window_s: f64,
    pub share: f64,
}

/// What one server failure costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RecoveryModel {
    /// From the failure to its detection.
    pub detect_s: f64,
    /// From detection to a replacement being up (CPR's rescheduling, O_res).
    pub replace_s: f64,
    /// From the replacement being up to training resuming (O_load).
    pub reload_s: f64,
    pub rollback: Rollback,
    pub degraded: Option<Degraded>,
    /// Redundancy that survives at most this many servers lost at once within one group of
    /// `group` servers (ECRec's `r`); one more is unrecoverable and the job starts over.
    pub tolerates: Option<u32>,
    /// Servers per redundancy group (servers `i` and `j` share stripes when `i / group ==
    /// j / group`).
    pub group: u32,
    /// ECRec §4's second layer: a loss beyond `tolerates` rolls the job back to its last save
    /// (the backstop, `save`) and reloads it in this long, instead of starting over.
    #[serde(default)]
    pub backstop_reload_s: Option<f64>,
    /// Partial recovery: count CPR's portion of lost samples (Eq. 3).
    pub track_pls: bool,
}

/// One strategy on one cluster, as the simulation sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobModel {
    pub name: String,
    pub servers: u32,
    /// Relative slowdown of normal training (ECRec's parity updates and 2PC, DECK's tracking).
    pub steady: f64,
    pub save: Option<SaveModel>,
    pub recovery: RecoveryModel,
}

impl JobModel {
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(format!("{}: {m}", self.name)));
        let nonneg = |v: f64| v.is_finite() && v >= 0.0;
        if self.servers == 0 {
            return bad("no servers".into());
        }
        if !(nonneg(self.steady) && self.steady < 100.0) {
            return bad(format!("steady slowdown {} out of range", self.steady));
        }
        if let Some(s) = &self.save {
            if !(s.every_work_s.is_finite() && s.every_work_s > 0.0) {
                return bad(format!(
                    "save interval {} s must be positive",
                    s.every_work_s
                ));
            }
            if !(nonneg(s.pause_s) && nonneg(s.first_pause_s)) {
                return bad("save pauses must be non-negative".into());
            }
        }
        let r = &self.recovery;
        if ![r.detect_s, r.replace_s, r.reload_s]
            .into_iter()
            .all(nonneg)
        {
            return bad("recovery times must be non-negative".into());
        }
        if let Some(d) = &r.degraded {
            if !(nonneg(d.window_s) && (0.0..=1.0).contains(&d.share)) {
                return bad(format!(
                    "degraded window {} s at share {} is not valid",
                    d.window_s, d.share
                ));
            }
        }
        if r.group == 0 {
            return bad("redundancy group of 0 servers".into());
        }
        Ok(())
    }
}

/// Seconds of wall time by where they went (besides useful work).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// Training paused for saves (O_save).
    pub save: f64,
    /// Reloading after failures (O_load).
    pub load: f64,
    /// Detecting failures and bringing up replacements (O_res).
    pub res: f64,
    /// Computation rolled back by failures and done again (O_lost).
    pub lost: f64,
    /// Throughput lost while running degraded.
    pub degraded: f64,
    /// The steady slowdown of normal training.
    pub steady: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.save + self.load + self.res + self.lost + self.degraded + self.steady
    }

    fn add(&mut self, o: &Breakdown, w: f64) {
        self.save += o.save * w;
        self.load += o.load * w;
        self.res += o.res * w;
        self.lost += o.lost * w;
        self.degraded += o.degraded * w;
        self.steady += o.steady * w;
    }
}

/// When a traced failure fires.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAt {
    /// At this wall time.
    Wall(f64),
    /// The first time the progress reaches this much work (a kill "after step S").
    Work(f64),
}

/// A failure of a replayed trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceFailure {
    pub at: TraceAt,
    pub server: u32,
}

/// Where failures come from.
#[derive(Debug, Clone)]
pub enum Failures {
    /// Independent per-server renewal processes.
    Process(FailureProcess),
    /// A fixed list (a measured run's kills, to predict it).
    Trace(Vec<TraceFailure>),
}

impl Failures {
    pub fn process(
        dist: FailureDist,
        mtbf_server_s: f64,
        servers: u32,
        seed: u64,
    ) -> Result<Failures, SimError> {
        Ok(Failures::Process(FailureProcess::new(
            dist,
            mtbf_server_s,
            servers,
            seed,
        )?))
    }
}

/// When the simulated job ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// After this much wall time.
    Wall(f64),
    /// Once this much work is done.
    Work(f64),
}

/// The outcome of one simulated job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub wall_s: f64,
    pub work_s: f64,
    pub breakdown: Breakdown,
    pub failures: u64,
    /// Failures the redundancy could not absorb (the job started over).
    pub unrecoverable: u64,
    /// Failures the redundancy could not absorb that a backstop save recovered.
    #[serde(default)]
    pub backstop_restores: u64,
    pub saves: u64,
    /// CPR's portion of lost samples at the end (Eq. 3), under partial recovery.
    pub pls: f64,
}

impl Outcome {
    /// Wall time over useful work, minus one (infinite when no work survived).
    pub fn overhead(&self) -> f64 {
        if self.work_s <= 0.0 {
            f64::INFINITY
        } else {
            self.wall_s / self.work_s - 1.0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Running,
    Pausing { until: f64, commit_work: f64 },
    Stalled { res_until: f64, until: f64 },
}

/// Simulate `model` under `failures` until `stop`.
pub fn simulate(model: &JobModel, failures: Failures, stop: Stop) -> Result<Outcome, SimError> {
    model.validate()?;
    match stop {
        Stop::Wall(x) | Stop::Work(x) if !(x.is_finite() && x > 0.0) => {
            return Err(SimError::Invalid(format!(
                "the simulated span {x} must be positive"
            )));
        }
        _ => {}
    }
    let mut s = Sim {
        m: model,
        t: 0.0,
        work: 0.0,
        last_save: 0.0,
        next_save: model.save.map_or(f64::INFINITY, |s| s.every_work_s),
        saved_once: false,
        mode: Mode::Running,
        windows: Vec::new(),
        pending_windows: Vec::new(),
        out: Outcome::default(),
        pls_lost: 0.0,
    };
    let v0 = 1.0 / (1.0 + model.steady);
    let mut process = None;
    let mut trace = Vec::new();
    match failures {
        Failures::Process(p) => process = Some(p),
        Failures::Trace(mut t) => {
            t.retain(|f| f.server < model.servers);
            trace = t.into_iter().map(|f| (f, false)).collect();
        }
    }
    let mut pending: Option<Failure> = process.as_mut().map(|p| p.next_failure());
    // A bound on events, so a model that cannot progress ends with an error, not a hang.
    let mut budget: u64 = 200_000_000;
    loop {
        budget = budget.checked_sub(1).ok_or_else(|| {
            SimError::Invalid(format!("{}: the simulation does not progress", model.name))
        })?;
        let speed = match s.mode {
            Mode::Running => {
                v0 * match (s.windows.is_empty(), model.recovery.degraded) {
                    (false, Some(d)) => d.share,
                    _ => 1.0,
                }
            }
            _ => 0.0,
        };
        let reach = |w: f64| {
            if speed > 0.0 {
                s.t + ((w - s.work) / speed).max(0.0)
            } else {
                f64::INFINITY
            }
        };
        // The earliest next event of every kind.
        let t_stop = match stop {
            Stop::Wall(h) => h,
            Stop::Work(w) => reach(w),
        };
        let t_proc = pending.map_or(f64::INFINITY, |f| f.t_s);
        let (trace_i, t_trace) = trace
            .iter()
            .enumerate()
            .filter(|(_, (_, done))| !done)
            .map(|(i, (f, _))| {
                (
                    i,
                    match f.at {
                        TraceAt::Wall(x) => x.max(s.t),
                        TraceAt::Work(w) => reach(w),
                    },
                )
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or((None, f64::INFINITY), |(i, t)| (Some(i), t));
        let t_mode = match s.mode {
            Mode::Running => reach(s.next_save),
            Mode::Pausing { until, .. } => until,
            Mode::Stalled { res_until, until } => {
                if s.t < res_until {
                    res_until
                } else {
                    until
                }
            }
        };
        let t_window = s.windows.iter().map(|w| w.1).fold(f64::INFINITY, f64::min);
        let t_next = t_stop.min(t_proc).min(t_trace).min(t_mode).min(t_window);
        s.advance(t_next, v0, speed);
        if t_next >= t_stop {
            if let Stop::Work(w) = stop {
                s.work = s.work.max(w);
            }
            break;
        }
        if t_proc <= t_next {
            let f = pending.take().expect("pending failure");
            pending = process.as_mut().map(|p| p.next_failure());
            s.fail(f.server);
            continue;
        }
        if t_trace <= t_next {
            let i = trace_i.expect("trace index");
            trace[i].1 = true;
            let server = trace[i].0.server;
            s.fail(server);
            continue;
        }
        if t_window <= t_next {
            s.windows.retain(|w| w.1 > t_next);
            continue;
        }
        // The mode's own transition.
        match s.mode {
            Mode::Running => {
                let pause = model.save.map_or(0.0, |sv| {
                    if s.saved_once {
                        sv.pause_s
                    } else {
                        sv.first_pause_s
                    }
                });
                s.work = s.next_save;
                s.mode = Mode::Pausing {
                    until: s.t + pause,
                    commit_work: s.work,
                };
            }
            Mode::Pausing { commit_work, .. } => {
                s.last_save = commit_work;
                s.saved_once = true;
                s.out.saves += 1;
                s.next_save = commit_work + model.save.map_or(f64::INFINITY, |sv| sv.every_work_s);
                s.mode = Mode::Running;
            }
            Mode::Stalled { until, .. } => {
                if s.t >= until {
                    let window = model.recovery.degraded.map_or(0.0, |d| d.window_s);
                    for server in std::mem::take(&mut s.pending_windows) {
                        if window > 0.0 {
                            s.windows.push((server, s.t + window));
                        }
                    }
                    s.mode = Mode::Running;
                }
            }
        }
    }
    s.out.wall_s = s.t;
    s.out.work_s = s.work;
    if model.recovery.track_pls && s.work > 0.0 {
        s.out.pls = s.pls_lost / (s.work * model.servers as f64);
    }
    Ok(s.out)
}

struct Sim<'a> {
    m: &'a JobModel,
    t: f64,
    work: f64,
    last_save: f64,
    next_save: f64,
    saved_once: bool,
    mode: Mode,
    /// Degraded windows under way: (server, end).
    windows: Vec<(u32, f64)>,
    /// Servers whose window starts when the current stall ends.
    pending_windows: Vec<u32>,
    out: Outcome,
    pls_lost: f64,
}

impl Sim<'_> {
    /// Move the clock to `t_next`, attributing the time to the current mode.
    fn advance(&mut self, t_next: f64, v0: f64, speed: f64) {
        let dt = (t_next - self.t).max(0.0);
        let b = &mut self.out.breakdown;
        match self.mode {
            Mode::Running => {
                self.work += speed * dt;
                b.steady += dt * (1.0 - v0);
                b.degraded += dt * (v0 - speed);
            }
            Mode::Pausing { .. } => b.save += dt,
            Mode::Stalled { res_until, .. } => {
                let in_res = (res_until - self.t).clamp(0.0, dt);
                b.res += in_res;
                b.load += dt - in_res;
            }
        }
        self.t = self.t.max(t_next);
    }

    fn fail(&mut self, server: u32) {
        let r = self.m.recovery;
        self.out.failures += 1;
        // A replacement that dies while rebuilding starts its rebuild over.
        self.windows.retain(|w| w.0 != server);
        self.pending_windows.retain(|&w| w != server);
        let group = |s: u32| s / r.group;
        let concurrent = self
            .windows
            .iter()
            .map(|w| w.0)
            .chain(self.pending_windows.iter().copied())
            .filter(|&s| group(s) == group(server))
            .count() as u32;
        let fatal = r.tolerates.is_some_and(|tol| concurrent >= tol);
        let backstop = fatal && r.backstop_reload_s.is_some();
        let rollback = if backstop {
            Rollback::ToLastSave
        } else if fatal {
            Rollback::Restart
        } else {
            r.rollback
        };
        match rollback {
            Rollback::ToLastSave => {
                self.out.breakdown.lost += self.work - self.last_save;
                self.work = self.last_save;
            }
            Rollback::Restart => {
                self.out.breakdown.lost += self.work;
                self.work = 0.0;
                self.last_save = 0.0;
                self.saved_once = false;
            }
            Rollback::Keep => {
                if r.track_pls {
                    // CPR Eq. 3: the failed shard loses the samples since its last save.
                    self.pls_lost += self.work - self.last_save;
                }
            }
        }
        self.next_save = self.last_save + self.m.save.map_or(f64::INFINITY, |s| s.every_work_s);
        let mut reload = r.reload_s;
        if backstop {
            self.out.backstop_restores += 1;
            self.windows.clear();
            self.pending_windows.clear();
            // Every server loads the backstop; nothing is left to rebuild.
            reload = r.backstop_reload_s.unwrap_or(0.0);
        } else if fatal {
            self.out.unrecoverable += 1;
            self.windows.clear();
            self.pending_windows.clear();
            // Started over from the initial model: nothing to reload or rebuild.
            reload = 0.0;
        } else if r.degraded.is_some() {
            self.pending_windows.push(server);
        }
        let res_until = self.t + r.detect_s + r.replace_s;
        self.mode = Mode::Stalled {
            res_until,
            until: res_until + reload,
        };
    }
}

/// Mean results of many simulated jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub replicas: u32,
    /// Total wall over total work, minus one (infinite when no work survives).
    pub overhead: f64,
    /// Standard error of the per-job overhead.
    pub overhead_stderr: f64,
    /// Seconds per day of wall time in each bucket.
    pub per_day: Breakdown,
    pub failures_per_day: f64,
    pub unrecoverable_per_day: f64,
    /// Losses beyond the redundancy recovered from a backstop save, per day.
    #[serde(default)]
    pub backstop_restores_per_day: f64,
    pub saves_per_day: f64,
    pub pls: f64,
}

/// Simulate `replicas` jobs of `horizon_s` wall seconds each, with failures from independent
/// per-server processes seeded from `seed` and the replica number.
pub fn simulate_many(
    model: &JobModel,
    dist: FailureDist,
    mtbf_server_s: f64,
    horizon_s: f64,
    replicas: u32,
    seed: u64,
) -> Result<Summary, SimError> {
    if replicas == 0 {
        return Err(SimError::Invalid("at least one replica".into()));
    }
    let mut outs = Vec::with_capacity(replicas as usize);
    for i in 0..replicas {
        let f = Failures::process(dist, mtbf_server_s, model.servers, seed ^ (i as u64) << 20)?;
        outs.push(simulate(model, f, Stop::Wall(horizon_s))?);
    }
    let wall: f64 = outs.iter().map(|o| o.wall_s).sum();
    let work: f64 = outs.iter().map(|o| o.work_s).sum();
    let days = wall / 86_400.0;
    let per: Vec<f64> = outs.iter().map(|o| o.overhead()).collect();
    let n = per.len() as f64;
    let mean = per.iter().sum::<f64>() / n;
    let stderr = if per.iter().all(|x| x.is_finite()) && n > 1.0 {
        (per.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt()
    } else {
        f64::INFINITY
    };
    let mut per_day = Breakdown::default();
    for o in &outs {
        per_day.add(&o.breakdown, 1.0 / days);
    }
    Ok(Summary {
        replicas,
        overhead: if work > 0.0 {
            wall / work - 1.0
        } else {
            f64::INFINITY
        },
        overhead_stderr: stderr,
        per_day,
        failures_per_day: outs.iter().map(|o| o.failures as f64).sum::<f64>() / days,
        unrecoverable_per_day: outs.iter().map(|o| o.unrecoverable as f64).sum::<f64>() / days,
        backstop_restores_per_day: outs.iter().map(|o| o.backstop_restores as f64).sum::<f64>()
            / days,
        saves_per_day: outs.iter().map(|o| o.saves as f64).sum::<f64>() / days,
        pls: outs.iter().map(|o| o.pls).sum::<f64>() / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_strategy::policy;

    fn full(
        servers: u32,
        every: f64,
        pause: f64,
        detect: f64,
        replace: f64,
        reload: f64,
    ) -> JobModel {
        JobModel {
            name: "full".into(),
            servers,
            steady: 0.0,
            save: Some(SaveModel {
                every_work_s: every,
                pause_s: pause,
                first_pause_s: pause,
            }),
            recovery: RecoveryModel {
                detect_s: detect,
                replace_s: replace,
                reload_s: reload,
                rollback: Rollback::ToLastSave,
                degraded: None,
                tolerates: None,
                group: servers,
                backstop_reload_s: None,
                track_pls: false,
            },
        }
    }

    /// Every wall second is work or one bucket of the breakdown.
    #[test]
    fn buckets_add_up_to_the_wall_time() {
        let mut m = full(8, 300.0, 7.0, 1.0, 2.0, 9.0);
        m.steady = 0.03;
        m.recovery.degraded = Some(Degraded {
            window_s: 50.0,
            share: 0.6,
        });
        let o = simulate(
            &m,
            Failures::process(FailureDist::Weibull { shape: 0.8 }, 20_000.0, 8, 5).unwrap(),
            Stop::Wall(500_000.0),
        )
        .unwrap();
        assert!(o.failures > 100, "{o:?}");
        let sum = o.work_s + o.breakdown.total();
        assert!(
            (sum - o.wall_s).abs() < 1e-6 * o.wall_s,
            "{sum} vs {}",
            o.wall_s
        );
    }

    /// Without failures: saves every `T` of work pausing `p` give the overhead `p / T` exactly,
    /// plus the steady slowdown.
    #[test]
    fn failure_free_overhead_is_the_save_share_and_the_slowdown() {
        let mut m = full(4, 100.0, 5.0, 0.0, 0.0, 0.0);
        m.steady = 0.1;
        let o = simulate(&m, Failures::Trace(vec![]), Stop::Work(10_000.0)).unwrap();
        assert_eq!(o.saves, 99); // the save at the very end is not taken
        let want = 99.0 * 5.0 + 10_000.0 * 0.1;
        assert!((o.wall_s - 10_000.0 - want).abs() < 1e-6, "{o:?}");
    }

    /// A traced failure after 250 s of work with saves every 100 s loses 50 s of work, and costs
    /// detect + replace + reload once (CPR §2.2).
    #[test]
    fn a_traced_failure_loses_the_work_since_the_last_save() {
        let m = full(2, 100.0, 0.0, 1.0, 2.0, 3.0);
        let trace = vec![TraceFailure {
            at: TraceAt::Work(250.0),
            server: 1,
        }];
        let o = simulate(&m, Failures::Trace(trace), Stop::Work(1_000.0)).unwrap();
        assert_eq!(o.failures, 1);
        assert!((o.breakdown.lost - 50.0).abs() < 1e-9, "{o:?}");
        assert!((o.breakdown.res - 3.0).abs() < 1e-9);
        assert!((o.breakdown.load - 3.0).abs() < 1e-9);
        assert!((o.wall_s - 1_056.0).abs() < 1e-9);
    }

    /// CPR Eq. 1 in expectation: exponential failures, small overheads; the simulated total
    /// matches the closed form within a few percent.
    #[test]
    fn simulated_full_recovery_matches_cpr_eq1() {
        let (servers, mtbf_server) = (16u32, 16.0 * 3_600.0); // job MTBF one hour
        let t_fail = mtbf_server / servers as f64;
        let (o_save, o_load, o_res) = (10.0, 20.0, 5.0);
        let t_save = policy::young_interval(o_save, t_fail);
        let m = full(servers, t_save, o_save, o_res, 0.0, o_load);
        let s = simulate_many(&m, FailureDist::Exponential, mtbf_server, 2e6, 16, 1).unwrap();
        // Eq. 1 counts saves per wall second and failures per wall second: per day of wall.
        let eq1 = policy::full_recovery_overhead(o_save, o_load, o_res, t_save, t_fail, 86_400.0);
        let sim = s.per_day.save + s.per_day.load + s.per_day.res + s.per_day.lost;
        let rel = (sim - eq1.total()).abs() / eq1.total();
        assert!(
            rel < 0.08,
            "simulated {sim:.0} s/day, Eq. 1 {:.0} s/day",
            eq1.total()
        );
        assert!(
            (s.failures_per_day - 24.0).abs() < 1.0,
            "{}",
            s.failures_per_day
        );
    }

    /// Young's interval minimises the simulated overhead: half and twice the interval cost more
    /// (CPR §2.2, `T_save,full = sqrt(2 O_save T_fail)`).
    #[test]
    fn youngs_interval_is_the_simulated_optimum() {
        let (servers, mtbf_server) = (10u32, 10.0 * 3_600.0);
        let t_fail = mtbf_server / servers as f64;
        let o_save = 30.0;
        let young = policy::young_interval(o_save, t_fail);
        let cost = |every: f64| {
            let m = full(servers, every, o_save, 0.0, 0.0, 0.0);
            simulate_many(&m, FailureDist::Exponential, mtbf_server, 4e6, 8, 9)
                .unwrap()
                .overhead
        };
        let at = cost(young);
        assert!(at < cost(young * 0.5), "half");
        assert!(at < cost(young * 2.0), "twice");
    }

    /// Partial recovery loses no computation (CPR Eq. 2) and its portion of lost samples matches
    /// CPR Eq. 4, `0.5 T_save / (T_fail N_emb)`.
    #[test]
    fn partial_recovery_matches_cpr_eq2_and_eq4() {
        let (servers, mtbf_server) = (8u32, 8.0 * 7_200.0);
        let t_fail = mtbf_server / servers as f64;
        let t_save = 1_800.0;
        let mut m = full(servers, t_save, 0.0, 0.0, 0.0, 0.0);
        m.recovery.rollback = Rollback::Keep;
        m.recovery.track_pls = true;
        let s = simulate_many(&m, FailureDist::Exponential, mtbf_server, 4e6, 8, 2).unwrap();
        assert_eq!(s.per_day.lost, 0.0);
        let eq4 = policy::expected_pls(t_save, t_fail, servers);
        assert!(
            (s.pls - eq4).abs() < 0.05 * eq4,
            "simulated PLS {} vs Eq. 4 {eq4}",
            s.pls
        );
    }

    /// Redundancy that tolerates one loss: a second failure in the same group inside the
    /// rebuild window is unrecoverable. Per failure that happens with probability
    /// `1 - exp(-window * (group - 1) / mtbf_server)`.
    #[test]
    fn unrecoverable_losses_match_the_window_probability() {
        let (servers, mtbf_server, window) = (20u32, 20.0 * 600.0, 60.0);
        let mut m = full(servers, 1.0, 0.0, 0.0, 0.0, 0.0);
        m.save = None;
        m.recovery.rollback = Rollback::Keep;
        m.recovery.degraded = Some(Degraded {
            window_s: window,
            share: 0.5,
        });
        m.recovery.tolerates = Some(1);
        let s = simulate_many(&m, FailureDist::Exponential, mtbf_server, 4e6, 4, 3).unwrap();
        let p = 1.0 - (-window * (servers - 1) as f64 / mtbf_server).exp();
        let got = s.unrecoverable_per_day / s.failures_per_day;
        assert!((got - p).abs() < 0.1 * p, "{got} vs {p}");
        // Groups of 4 (ECRec §4's partitioning): only 3 others can hit the same group.
        m.recovery.group = 4;
        let s = simulate_many(&m, FailureDist::Exponential, mtbf_server, 4e6, 4, 3).unwrap();
        let p4 = 1.0 - (-window * 3.0 / mtbf_server).exp();
        let got = s.unrecoverable_per_day / s.failures_per_day;
        assert!((got - p4).abs() < 0.15 * p4, "{got} vs {p4}");
        // With a backstop the same losses are restored from it, none starts the job over.
        m.recovery.group = servers;
        m.recovery.backstop_reload_s = Some(1.0);
        m.save = Some(SaveModel {
            every_work_s: 3_600.0,
            pause_s: 0.0,
            first_pause_s: 0.0,
        });
        let s = simulate_many(&m, FailureDist::Exponential, mtbf_server, 4e6, 4, 3).unwrap();
        assert_eq!(s.unrecoverable_per_day, 0.0);
        let got = s.backstop_restores_per_day / s.failures_per_day;
        assert!((got - p).abs() < 0.1 * p, "{got} vs {p}");
    }

    /// ECRec §4's second layer: a loss beyond what the code tolerates rolls back to the last
    /// backstop save and reloads it, instead of starting over; losses within the tolerance
    /// still keep the model.
    #[test]
    fn a_loss_beyond_the_tolerance_restores_the_backstop_instead_of_starting_over() {
        let mut m = full(4, 100.0, 0.0, 0.0, 0.0, 0.0);
        m.recovery.rollback = Rollback::Keep;
        m.recovery.degraded = Some(Degraded {
            window_s: 50.0,
            share: 1.0,
        });
        m.recovery.tolerates = Some(1);
        // Server 0 at 130 s of work (kept), server 1 inside its window at 160 s: fatal.
        let trace = vec![
            TraceFailure {
                at: TraceAt::Work(130.0),
                server: 0,
            },
            TraceFailure {
                at: TraceAt::Work(160.0),
                server: 1,
            },
        ];
        let o = simulate(&m, Failures::Trace(trace.clone()), Stop::Work(1_000.0)).unwrap();
        assert_eq!((o.unrecoverable, o.backstop_restores), (1, 0));
        assert!((o.breakdown.lost - 160.0).abs() < 1e-9, "{o:?}");
        m.recovery.backstop_reload_s = Some(7.0);
        let o = simulate(&m, Failures::Trace(trace), Stop::Work(1_000.0)).unwrap();
        assert_eq!((o.unrecoverable, o.backstop_restores), (0, 1));
        // Back to the save at 100 s of work, reloaded in 7 s.
        assert!((o.breakdown.lost - 60.0).abs() < 1e-9, "{o:?}");
        assert!((o.breakdown.load - 7.0).abs() < 1e-9, "{o:?}");
    }

    /// The degraded window costs `window * (1 - share)` per failure.
    #[test]
    fn a_degraded_window_costs_its_lost_share() {
        let mut m = full(3, 1.0, 0.0, 0.5, 0.5, 1.0);
        m.save = None;
        m.recovery.rollback = Rollback::Keep;
        m.recovery.degraded = Some(Degraded {
            window_s: 10.0,
            share: 0.7,
        });
        let trace = vec![TraceFailure {
            at: TraceAt::Wall(100.0),
            server: 0,
        }];
        let o = simulate(&m, Failures::Trace(trace), Stop::Work(1_000.0)).unwrap();
        assert!((o.breakdown.degraded - 3.0).abs() < 1e-9, "{o:?}");
        assert!((o.wall_s - 1_005.0).abs() < 1e-9, "{o:?}");
    }

    #[test]
    fn invalid_models_are_refused_by_name() {
        let mut m = full(2, 100.0, 1.0, 0.0, 0.0, 0.0);
        m.save.as_mut().unwrap().every_work_s = 0.0;
        assert!(matches!(
            simulate(&m, Failures::Trace(vec![]), Stop::Work(10.0)),
            Err(SimError::Invalid(e)) if e.contains("full") && e.contains("interval")
        ));
        let m = full(2, 100.0, 1.0, 0.0, 0.0, 0.0);
        assert!(matches!(
            simulate(&m, Failures::Trace(vec![]), Stop::Wall(-1.0)),
            Err(SimError::Invalid(_))
        ));
    }
}

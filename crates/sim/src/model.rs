//! Cost coefficients per strategy, calibrated from measured runs, and their extrapolation to a
//! cluster of another size.
//!
//! The rule of the extrapolation: what moves bytes (saves, reloads, rebuilds) costs bytes over
//! bandwidth times the *efficiency* this implementation showed on the calibration machine
//! (measured throughput over the machine's raw disk or network throughput, measured in the same
//! run); what happens every step (ECRec's parity updates and 2PC, DECK's tracking) is a
//! relative slowdown of the step; detection and process start are constants (or the
//! scheduler's rescheduling time when the user gives it).

use ftrec_strategy::{deck, policy};
use serde::{Deserialize, Serialize};

use crate::failure::FailureDist;
use crate::sim::{Degraded, JobModel, RecoveryModel, Rollback, SaveModel};
use crate::SimError;

/// Raw throughputs of the calibration machine, measured by `ftrec compare` next to its runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Sequential write with fsync, bytes/s.
    pub disk_write_bps: f64,
    /// Sequential read, bytes/s.
    pub disk_read_bps: f64,
    /// Loopback TCP, bytes/s.
    pub net_bps: f64,
}

/// One failure of a measured run, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredFailure {
    /// Steps applied when the server was killed.
    pub at_step: u64,
    pub detect_s: f64,
    pub replace_s: f64,
    pub reload_s: f64,
    /// From training resumed to the state being whole again.
    pub window_s: f64,
    pub steps_redone: u64,
    /// Training throughput during the window over before the failure (1 if unknown).
    pub window_share: f64,
    /// A rebuild's own working time (its lock ranges, summed): the window less the time it
    /// yielded to training. `None`: not measured.
    #[serde(default)]
    pub rebuild_busy_s: Option<f64>,
    /// Training throughput while the rebuild worked (its lock ranges) over before the failure.
    #[serde(default)]
    pub rebuild_busy_share: Option<f64>,
}

/// What one measured run of one strategy gives the calibration (the `ftrec` binary fills this
/// from a `compare` report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub strategy: String,
    /// Values and optimizer state of every row and dense block.
    pub model_bytes: f64,
    pub servers: u32,
    pub workers: u32,
    pub steps: u64,
    pub train_s: f64,
    /// Training time of the failure-free run without fault tolerance on the same samples.
    pub baseline_train_s: f64,
    /// Save interval in steps, if the strategy saves.
    pub save_every_steps: Option<u64>,
    /// Pause of every save, in order.
    pub save_pauses_s: Vec<f64>,
    /// How many of the first saves were full (the rest are deltas).
    pub full_saves: u64,
    pub bytes_written: f64,
    /// Server failures.
    pub failures: Vec<MeasuredFailure>,
    /// Memory over the model's, beyond it (0.5 is 50% more).
    pub extra_memory: Option<f64>,
    /// Bytes left in the store at the end.
    pub stored_bytes: f64,
    /// Erasure code, for redundancy strategies: `(k, r)`.
    pub code: Option<(u32, u32)>,
}

/// How a strategy protects the model: decides which cost model applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// A failure restarts the job.
    Restart,
    /// Full checkpoints, full recovery (CPR §2.2).
    Full,
    /// A full base and delta checkpoints, full recovery from the newest delta (DECK §3–4;
    /// incremental schemes alike).
    Delta,
    /// Erasure-coded redundancy in memory, no rollback, a degraded rebuild (ECRec §3).
    ErasureCoded,
    /// Checkpoints with partial recovery: only the failed shard rolls back (CPR §2.3).
    Partial,
}

impl Mechanism {
    /// The mechanism of a known strategy name, or one inferred from what the run did.
    pub fn of(name: &str, m: &Measured) -> Mechanism {
        match name {
            "none" => Mechanism::Restart,
            "full" => Mechanism::Full,
            "deck" | "incrcp" | "incremental" | "cnr" | "checknrun" => Mechanism::Delta,
            "ecrec" => Mechanism::ErasureCoded,
            "cpr" => Mechanism::Partial,
            _ => {
                let redo = m.failures.iter().any(|f| f.steps_redone > 0);
                match (m.save_pauses_s.is_empty(), redo, m.full_saves > 0) {
                    (true, _, _) if m.code.is_some() => Mechanism::ErasureCoded,
                    (true, _, _) => Mechanism::Restart,
                    (false, false, _) if !m.failures.is_empty() => Mechanism::Partial,
                    (false, _, true) if m.save_pauses_s.len() as u64 > m.full_saves => {
                        Mechanism::Delta
                    }
                    _ => Mechanism::Full,
                }
            }
        }
    }
}

/// One strategy's calibrated coefficients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coefficients {
    pub strategy: String,
    pub mechanism: Mechanism,
    /// Relative slowdown of a step outside saves and failures (measured, floored at 0).
    pub steady: f64,
    /// The same before flooring (negative: the run was faster than the baseline, i.e. noise).
    pub steady_raw: f64,
    /// Full-save throughput over the machine's raw disk write.
    pub save_eff: Option<f64>,
    /// Delta-save throughput over the raw disk write (the marginal cost of a byte, when a full
    /// and a delta give two points).
    pub delta_eff: Option<f64>,
    /// Pause of a save that does not grow with its bytes (coordination, commit), from the same
    /// two points.
    #[serde(default)]
    pub save_fixed_s: f64,
    /// Fraction of the model a step touches (from the delta sizes).
    pub touched_per_step: Option<f64>,
    pub detect_s: Option<f64>,
    pub replace_s: Option<f64>,
    /// Reload throughput over the raw disk read.
    pub reload_eff: Option<f64>,
    /// Reload seconds that do not grow with the model (ECRec's dense copy).
    pub reload_fixed_s: Option<f64>,
    /// Rebuild throughput (k shards read per lost shard) over the raw network.
    pub rebuild_eff: Option<f64>,
    /// Which rebuild rate `rebuild_eff` is: the rebuild's own working time (unthrottled), or
    /// its whole window (throttled by the share it yields to training), in words.
    #[serde(default)]
    pub rebuild_rate: Option<String>,
    /// Throughput during a rebuild over normal.
    pub degraded_share: Option<f64>,
    pub code: Option<(u32, u32)>,
    pub extra_memory: f64,
    /// Bytes stored at the end over the model's.
    pub stored_fraction: f64,
    /// Calibration scale: model bytes, servers, workers, steps of the run.
    pub model_bytes: f64,
    pub servers: u32,
    pub workers: u32,
    pub save_every_steps: Option<u64>,
    pub step_s: f64,
}

fn mean(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Coefficients {
    /// Calibrate from one measured run on `machine`.
    pub fn from_measured(m: &Measured, machine: &Machine) -> Result<Coefficients, SimError> {
        let bad = |w: String| Err(SimError::Calibration(format!("{}: {w}", m.strategy)));
        if !(m.model_bytes > 0.0 && m.steps > 0 && m.baseline_train_s > 0.0 && m.train_s > 0.0) {
            return bad("model size, steps and training times must be positive".into());
        }
        if !(machine.disk_write_bps > 0.0 && machine.disk_read_bps > 0.0 && machine.net_bps > 0.0) {
            return bad("the machine's raw throughputs must be positive".into());
        }
        let mech = Mechanism::of(&m.strategy, m);
        let step_s = m.baseline_train_s / m.steps as f64;
        let n = m.servers.max(1) as f64;
        let fulls = (m.full_saves as usize).min(m.save_pauses_s.len());
        let (first, rest) = m.save_pauses_s.split_at(fulls);
        let mut c = Coefficients {
            strategy: m.strategy.clone(),
            mechanism: mech,
            steady: 0.0,
            steady_raw: 0.0,
            save_eff: None,
            delta_eff: None,
            save_fixed_s: 0.0,
            touched_per_step: None,
            detect_s: mean(m.failures.iter().map(|f| f.detect_s)),
            replace_s: mean(m.failures.iter().map(|f| f.replace_s)),
            reload_eff: None,
            reload_fixed_s: None,
            rebuild_eff: None,
            rebuild_rate: None,
            degraded_share: None,
            code: m.code,
            extra_memory: m.extra_memory.unwrap_or(0.0).max(0.0),
            stored_fraction: m.stored_bytes / m.model_bytes,
            model_bytes: m.model_bytes,
            servers: m.servers,
            workers: m.workers,
            save_every_steps: m.save_every_steps,
            step_s,
        };
        match mech {
            Mechanism::Delta => {
                let full_bytes = m.model_bytes;
                if let Some(p) = mean(first.iter().copied()).filter(|p| *p > 0.0) {
                    c.save_eff = Some(full_bytes / p / machine.disk_write_bps);
                }
                let deltas = rest.len() as f64;
                if deltas > 0.0 {
                    let bytes = ((m.bytes_written - fulls as f64 * full_bytes) / deltas).max(0.0);
                    if let Some(p) = mean(rest.iter().copied()).filter(|p| *p > 0.0) {
                        // Two points, a full and a delta: a pause is a fixed part plus bytes over
                        // a marginal throughput.
                        let marginal = match mean(first.iter().copied()) {
                            Some(fp) if fp > p && full_bytes > bytes => {
                                (full_bytes - bytes) / (fp - p)
                            }
                            _ => bytes / p,
                        };
                        c.save_fixed_s = (p - bytes / marginal).max(0.0);
                        c.delta_eff = Some(marginal / machine.disk_write_bps);
                    }
                    let phi = (bytes / m.model_bytes).clamp(0.0, 0.999_999);
                    let every = m.save_every_steps.unwrap_or(1).max(1) as f64;
                    c.touched_per_step = Some(1.0 - (1.0 - phi).powf(1.0 / every));
                }
            }
            Mechanism::Full | Mechanism::Partial => {
                let saves = m.save_pauses_s.len() as f64;
                if let Some(p) = mean(m.save_pauses_s.iter().copied()).filter(|p| *p > 0.0) {
                    c.save_eff = Some(m.bytes_written / saves / p / machine.disk_write_bps);
                }
            }
            Mechanism::Restart | Mechanism::ErasureCoded => {}
        }
        match mech {
            Mechanism::Full | Mechanism::Delta => {
                c.reload_eff = mean(
                    m.failures
                        .iter()
                        .filter(|f| f.reload_s > 0.0)
                        .map(|f| m.model_bytes / f.reload_s / machine.disk_read_bps),
                );
            }
            Mechanism::Partial => {
                c.reload_eff = mean(
                    m.failures
                        .iter()
                        .filter(|f| f.reload_s > 0.0)
                        .map(|f| m.model_bytes / n / f.reload_s / machine.disk_read_bps),
                );
            }
            Mechanism::ErasureCoded => {
                c.reload_fixed_s = mean(m.failures.iter().map(|f| f.reload_s));
                let k = m.code.map_or(1, |c| c.0) as f64;
                let rebuilt: Vec<&MeasuredFailure> =
                    m.failures.iter().filter(|f| f.window_s > 0.0).collect();
                let shard_bytes = k * m.model_bytes / n;
                // The rebuild yields to training (ECRec §3.3's trade, `--rebuild-share`): its
                // window is longer than its work. Priced at its own working time when every
                // rebuild measured one (the rate a rebuild would have at full speed), with the
                // throughput training kept while it worked; else at the window, and said so.
                let busy: Option<Vec<(f64, f64)>> = rebuilt
                    .iter()
                    .map(|f| {
                        let b = f.rebuild_busy_s.filter(|b| *b > 0.0)?;
                        Some((b, f.rebuild_busy_share.unwrap_or(f.window_share)))
                    })
                    .collect();
                match busy.filter(|b| !b.is_empty()) {
                    Some(b) => {
                        c.rebuild_eff =
                            mean(b.iter().map(|(t, _)| shard_bytes / t / machine.net_bps));
                        c.degraded_share = mean(b.iter().map(|(_, s)| s.clamp(0.0, 1.0)));
                        c.rebuild_rate = c.rebuild_eff.map(|e| {
                            format!(
                                "the unthrottled rate measured over the rebuild's own working \
                                 time ({}/s, {:.2}% of the calibration machine's loopback)",
                                bytes(e * machine.net_bps),
                                100.0 * e
                            )
                        });
                    }
                    None => {
                        c.rebuild_eff = mean(
                            rebuilt
                                .iter()
                                .map(|f| shard_bytes / f.window_s / machine.net_bps),
                        );
                        c.degraded_share =
                            mean(m.failures.iter().map(|f| f.window_share.clamp(0.0, 1.0)));
                        c.rebuild_rate = c.rebuild_eff.map(|e| {
                            format!(
                                "the throttled rate of the whole rebuild window ({}/s, {:.2}% of \
                                 the loopback; the rebuild yielded to training, so a rebuild at \
                                 full speed is faster)",
                                bytes(e * machine.net_bps),
                                100.0 * e
                            )
                        });
                    }
                }
            }
            Mechanism::Restart => {}
        }
        // What remains of the run's time once saves and failures are accounted for is the
        // steady slowdown of its steps.
        let saves: f64 = m.save_pauses_s.iter().sum();
        let failures: f64 = m
            .failures
            .iter()
            .map(|f| {
                let stall = f.detect_s + f.replace_s + f.reload_s;
                if f.steps_redone > 0 {
                    stall + f.window_s
                } else {
                    stall + f.window_s * (1.0 - f.window_share.clamp(0.0, 1.0))
                }
            })
            .sum();
        c.steady_raw = (m.train_s - saves - failures) / m.baseline_train_s - 1.0;
        c.steady = c.steady_raw.max(0.0);
        Ok(c)
    }
}

/// Every strategy's coefficients from one `compare` run, and the machine they were measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub machine: Machine,
    pub strategies: Vec<Coefficients>,
    /// Strategies of the calibration run left out, and why (a run that aborted or failed).
    #[serde(default)]
    pub dropped: Vec<(String, String)>,
}

impl Calibration {
    pub fn from_runs(machine: Machine, runs: &[Measured]) -> Result<Calibration, SimError> {
        let mut strategies: Vec<Coefficients> = runs
            .iter()
            .map(|m| Coefficients::from_measured(m, &machine))
            .collect::<Result<_, _>>()?;
        // Detection and process start do not depend on the strategy: a run without failures
        // (the reference) borrows the others' mean.
        let detect = mean(strategies.iter().filter_map(|c| c.detect_s));
        let replace = mean(strategies.iter().filter_map(|c| c.replace_s));
        for c in &mut strategies {
            c.detect_s = c.detect_s.or(detect);
            c.replace_s = c.replace_s.or(replace);
        }
        Ok(Calibration {
            machine,
            strategies,
            dropped: Vec::new(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Coefficients> {
        self.strategies.iter().find(|c| c.strategy == name)
    }
}

/// The cluster to advise on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub model_bytes: f64,
    pub servers: u32,
    pub workers: u32,
    /// Failure-free step time.
    pub step_s: f64,
    /// Mean time between failures of one server.
    pub mtbf_server_s: f64,
    pub dist: FailureDist,
    /// Per server, bytes/s.
    pub disk_bps: f64,
    pub net_bps: f64,
    /// Memory free on a server for redundancy, as a fraction of its model shard.
    pub memory_headroom: f64,
    /// Rescheduling time of a replacement (default: the calibrated process start).
    pub reschedule_s: Option<f64>,
    /// Fraction of the model a step touches (default: scaled from the calibration).
    pub touched_per_step: Option<f64>,
    /// CPR's target portion of lost samples (§4.1).
    pub target_pls: f64,
    /// Simulated days per replica, replicas, seed.
    pub days: f64,
    pub replicas: u32,
    pub seed: u64,
}

impl Scenario {
    pub fn validate(&self) -> Result<(), SimError> {
        let pos = |v: f64| v.is_finite() && v > 0.0;
        let checks = [
            (pos(self.model_bytes), "--model-gb must be positive"),
            (self.servers > 0, "--servers must be at least 1"),
            (self.workers > 0, "--workers must be at least 1"),
            (pos(self.step_s), "--step-ms must be positive"),
            (pos(self.mtbf_server_s), "--mtbf-hours must be positive"),
            (pos(self.disk_bps), "--disk-gbps must be positive"),
            (pos(self.net_bps), "--net-gbps must be positive"),
            (
                self.memory_headroom.is_finite() && self.memory_headroom >= 0.0,
                "--memory-headroom must be 0 or more",
            ),
            (
                self.target_pls.is_finite() && self.target_pls > 0.0 && self.target_pls < 1.0,
                "--target-pls must be between 0 and 1",
            ),
            (pos(self.days), "--days must be positive"),
            (self.replicas > 0, "--replicas must be at least 1"),
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(SimError::Invalid(what.into()));
            }
        }
        self.dist.validate()
    }

    /// Job-level mean time between failures (any server).
    pub fn t_fail(&self) -> f64 {
        self.mtbf_server_s / self.servers as f64
    }

    /// Aggregate bandwidth of every server writing (or reading) at once to remote storage.
    fn store_bps(&self) -> f64 {
        self.servers as f64 * self.disk_bps.min(self.net_bps)
    }
}

/// One strategy made concrete at a scenario: the simulation's model and the figures around it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    pub job: JobModel,
    /// How it is configured, in words (interval, code).
    pub config: String,
    pub feasible: bool,
    pub why_not: Option<String>,
    /// Exact recovery (the failure-free model); partial recovery is not.
    pub exact: bool,
    pub extra_memory_bytes_per_server: f64,
    pub storage_bytes: f64,
    pub notes: Vec<String>,
}

fn need(v: Option<f64>, what: &str, c: &Coefficients) -> Result<f64, SimError> {
    v.filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
        SimError::Calibration(format!(
            "{}: the calibration run measured no {what} (it needs a failure and, for savers, a \
             save)",
            c.strategy
        ))
    })
}

/// How often (in seconds of work) and at what pause a strategy saves, and where the save interval
/// came from; `None` for strategies that do not save.
pub fn plan(c: &Coefficients, s: &Scenario) -> Result<Planned, SimError> {
    s.validate()?;
    let n = s.servers as f64;
    let m = s.model_bytes;
    let detect = c.detect_s.unwrap_or(0.05);
    let replace = s.reschedule_s.or(c.replace_s).unwrap_or(0.1);
    let shard = m / n;
    let t_fail = s.t_fail();
    let base = |rollback| RecoveryModel {
        detect_s: detect,
        replace_s: replace,
        reload_s: 0.0,
        rollback,
        degraded: None,
        tolerates: None,
        group: s.servers,
        backstop_reload_s: None,
        track_pls: false,
    };
    let mut p = Planned {
        job: JobModel {
            name: c.strategy.clone(),
            servers: s.servers,
            steady: c.steady,
            save: None,
            recovery: base(Rollback::Restart),
        },
        config: String::new(),
        feasible: true,
        why_not: None,
        exact: true,
        extra_memory_bytes_per_server: c.extra_memory * shard,
        storage_bytes: 0.0,
        notes: Vec::new(),
    };
    match c.mechanism {
        Mechanism::Restart => {
            p.config = "no fault tolerance: a failure restarts the job".into();
            p.extra_memory_bytes_per_server = 0.0;
        }
        Mechanism::Full | Mechanism::Partial => {
            let pause = m / (need(c.save_eff, "save throughput", c)? * s.store_bps());
            let reload_bytes_per_server = shard;
            let reload = reload_bytes_per_server
                / (need(c.reload_eff, "reload", c)? * s.disk_bps.min(s.net_bps));
            // CPR §2.2: Young's interval minimises Eq. 1.
            let young = policy::young_interval(pause, t_fail);
            let (every, rollback) = if c.mechanism == Mechanism::Full {
                p.config = format!(
                    "full checkpoint every {} (Young's interval sqrt(2 O_save T_fail), CPR §2.2), \
                     {} pause",
                    secs(young),
                    secs(pause)
                );
                (young, Rollback::ToLastSave)
            } else {
                // CPR §4.1: the interval that meets the target PLS (Eq. 4), and the fallback to
                // full recovery when Eq. 2 at that interval does not beat Eq. 1 at Young's.
                let t_part = policy::interval_for_pls(s.target_pls, t_fail, s.servers);
                let day = 86_400.0;
                let eq2 =
                    policy::partial_recovery_overhead(pause, reload, replace, t_part, t_fail, day);
                let eq1 =
                    policy::full_recovery_overhead(pause, reload, replace, young, t_fail, day);
                if eq2.total() < eq1.total() {
                    p.config = format!(
                        "partial recovery, checkpoint every {} for PLS {} (CPR Eq. 4), {} pause",
                        secs(t_part),
                        s.target_pls,
                        secs(pause)
                    );
                    p.exact = false;
                    (t_part, Rollback::Keep)
                } else {
                    p.config = format!(
                        "falls back to full recovery every {} (CPR §4.1: Eq. 2 at the PLS \
                         interval {} does not beat Eq. 1)",
                        secs(young),
                        secs(t_part)
                    );
                    (young, Rollback::ToLastSave)
                }
            };
            p.job.save = Some(SaveModel {
                every_work_s: every,
                pause_s: pause,
                first_pause_s: pause,
            });
            p.job.recovery = RecoveryModel {
                reload_s: reload,
                track_pls: rollback == Rollback::Keep,
                ..base(rollback)
            };
            p.storage_bytes = m * c.stored_fraction.clamp(1.0, 2.0);
            p.extra_memory_bytes_per_server = 0.0;
        }
        Mechanism::Delta => {
            let full_pause = m / (need(c.save_eff, "full-save throughput", c)? * s.store_bps());
            let delta_bps = need(c.delta_eff, "delta-save throughput", c)? * s.store_bps();
            let reload_bps = need(c.reload_eff, "reload", c)? * s.store_bps();
            let u = match s.touched_per_step {
                Some(u) => u,
                None => {
                    // The same rows per sample: the touched fraction of a step scales with the
                    // samples per step and inversely with the model.
                    let u = need(c.touched_per_step, "delta size", c)?;
                    (u * (s.workers as f64 / c.workers.max(1) as f64) * (c.model_bytes / m))
                        .min(1.0)
                }
            };
            let phi = |every_s: f64| 1.0 - (1.0 - u).powf((every_s / s.step_s).max(1.0));
            let pause = |every_s: f64| c.save_fixed_s + phi(every_s) * m / delta_bps;
            // CPR Eq. 1 with the delta's pause growing with the interval: minimised numerically
            // around Young's interval for the smallest delta.
            let cost = |t: f64| pause(t) / t + t / 2.0 / t_fail;
            // DECK §3.3, Inequality 1: the merger must keep up, or the lineage a restore reads
            // grows without bound. Duplication between consecutive deltas (d) and the merger's
            // relative velocity (v: it reads and writes at the restore rate) both grow with the
            // interval, so too short an interval fails it.
            let keeps_up = |t: f64| {
                let d = phi(t).clamp(0.0, 1.0);
                let v = reload_bps / (phi(t) * m).max(1.0) * t;
                deck::merge_stride(d, v, 16).is_some()
            };
            let young = policy::young_interval(pause(s.step_s), t_fail).max(s.step_s);
            let (mut every, mut best) = (f64::NAN, f64::INFINITY);
            let (mut any_every, mut any_best) = (young, cost(young));
            let mut t = s.step_s;
            while t < 100.0 * young.max(s.step_s).max(t_fail) {
                let c = cost(t);
                if c < any_best {
                    (any_every, any_best) = (t, c);
                }
                if c < best && keeps_up(t) {
                    (every, best) = (t, c);
                }
                t *= 1.05;
            }
            if every.is_nan() {
                every = any_every;
            }
            let delta_bytes = phi(every) * m;
            // DECK §3.3: duplication between two consecutive deltas, the merger's relative
            // velocity (it reads and writes at the restore rate), the stride from Inequality 1
            // and the full-checkpoint period from Inequality 2 with the chain bounded by one
            // model.
            let d = phi(every).clamp(0.0, 1.0);
            let v = reload_bps / delta_bytes.max(1.0) * every;
            let stride = deck::merge_stride(d, v, 16);
            if stride.is_none() {
                p.notes.push(format!(
                    "DECK Inequality 1 holds for no stride up to 16 (duplication d = {d:.4}, \
                     merge velocity v = {v:.1}): deltas that barely overlap do not shrink when \
                     merged, so the lineage grows until the next full"
                ));
            }
            let stride = stride.unwrap_or(2);
            let bound = (m / delta_bytes.max(1.0)).max(1.0);
            let full_every = deck::full_every(d, stride, bound, 100_000).unwrap_or(1);
            let chain = (1..=full_every)
                .map(|k| deck::living_volume(d, stride, k))
                .sum::<f64>()
                / full_every as f64
                * delta_bytes;
            let reload = (m + chain) / reload_bps;
            p.job.save = Some(SaveModel {
                every_work_s: every,
                pause_s: pause(every),
                first_pause_s: full_pause,
            });
            p.job.recovery = RecoveryModel {
                reload_s: reload,
                ..base(Rollback::ToLastSave)
            };
            p.config = format!(
                "delta every {} ({:.2}% of the model, {} pause; CPR Eq. 1 minimised with the \
                 delta's size, among intervals the merger keeps up with), merge stride {stride} \
                 (DECK Ineq. 1), a full every {full_every} deltas (Ineq. 2)",
                secs(every),
                100.0 * phi(every),
                secs(pause(every))
            );
            p.storage_bytes = m + chain;
            // DECK §3.2: at most four staging chunks in memory per server.
            p.extra_memory_bytes_per_server = 4.0 * 4.0 * 1024.0 * 1024.0;
        }
        Mechanism::ErasureCoded => {
            let (k, r) = c.code.unwrap_or((2, 1));
            return plan_ec(c, s, k, r, None);
        }
    }
    Ok(p)
}

/// `P(X >= r)` for `X` Poisson with mean `mu`.
fn poisson_at_least(mu: f64, r: u32) -> f64 {
    let mut term = (-mu).exp();
    let mut below = 0.0;
    for i in 0..r {
        below += term;
        term *= mu / f64::from(i + 1);
    }
    (1.0 - below).max(0.0)
}

/// ECRec with `k` data and `r` parity rows per stripe at scenario `s`; with `backstop` (the
/// calibration of `full`, whose saves and reloads a backstop makes), ECRec §4's second layer:
/// a full checkpoint at Young's interval for the losses beyond `r` (`ftrec run --strategy
/// ecrec --ckpt-every-steps N`), restored when they come, instead of starting over.
pub fn plan_ec(
    c: &Coefficients,
    s: &Scenario,
    k: u32,
    r: u32,
    backstop: Option<&Coefficients>,
) -> Result<Planned, SimError> {
    s.validate()?;
    let n = s.servers as f64;
    let shard = s.model_bytes / n;
    // ECRec §2.1/§4: parities cost (k + r) / k of the coded rows.
    let extra = (k + r) as f64 / k as f64 - 1.0;
    // ECRec §4: a rebuild reads k surviving rows per lost row.
    let window = k as f64 * shard / (need(c.rebuild_eff, "rebuild", c)? * s.net_bps);
    let share = c.degraded_share.unwrap_or(1.0);
    let mut p = Planned {
        job: JobModel {
            name: c.strategy.clone(),
            servers: s.servers,
            steady: c.steady,
            save: None,
            recovery: RecoveryModel {
                detect_s: c.detect_s.unwrap_or(0.05),
                replace_s: s.reschedule_s.or(c.replace_s).unwrap_or(0.1),
                reload_s: c.reload_fixed_s.unwrap_or(0.0),
                rollback: Rollback::Keep,
                degraded: Some(Degraded {
                    window_s: window,
                    share,
                }),
                tolerates: Some(r),
                // Stripes rotate over every server: any two servers share stripes.
                group: s.servers,
                backstop_reload_s: None,
                track_pls: false,
            },
        },
        config: format!(
            "k={k} r={r}: parity memory (k+r)/k = {:.2} (ECRec §4), rebuild of a {} shard reads \
             k shards: {} at {:.0}% throughput, priced at {}",
            1.0 + extra,
            bytes(shard),
            secs(window),
            share * 100.0,
            c.rebuild_rate
                .as_deref()
                .unwrap_or("the calibration's rebuild rate")
        ),
        feasible: true,
        why_not: None,
        exact: true,
        extra_memory_bytes_per_server: extra * shard,
        storage_bytes: 0.0,
        notes: Vec::new(),
    };
    if let Some(full) = backstop {
        // A loss beyond `r`: `r` more servers of the group fail within one rebuild window.
        // Each of the group's other servers is inside a window a `window / MTBF` share of
        // the time, so their number is about Poisson with that mean times their count.
        let others = f64::from(s.servers.saturating_sub(1));
        let beyond = poisson_at_least(others * window / s.mtbf_server_s, r);
        let rate = f64::from(s.servers) / s.mtbf_server_s * beyond;
        let pause = s.model_bytes / (need(full.save_eff, "save throughput", full)? * s.store_bps());
        let reload = shard / (need(full.reload_eff, "reload", full)? * s.disk_bps.min(s.net_bps));
        if rate > 0.0 {
            let every = policy::young_interval(pause, 1.0 / rate);
            p.job.save = Some(SaveModel {
                every_work_s: every,
                pause_s: pause,
                first_pause_s: pause,
            });
            p.job.recovery.backstop_reload_s = Some(reload);
            p.storage_bytes = s.model_bytes;
            p.config += &format!(
                "; a backstop full checkpoint every {} ({:.3} losses beyond r a day expected, \
                 Young's interval for them; ECRec §4's second layer, `--ckpt-every-steps {}`), \
                 {} pause, {} to restore",
                secs(every),
                rate * 86_400.0,
                (every / s.step_s).round().max(1.0),
                secs(pause),
                secs(reload)
            );
        }
    }
    if k + r > s.servers {
        p.feasible = false;
        p.why_not = Some(format!(
            "k + r = {} needs more than {} servers",
            k + r,
            s.servers
        ));
    } else if extra > s.memory_headroom + 1e-12 {
        p.feasible = false;
        p.why_not = Some(format!(
            "needs {:.0}% more memory per server ((k+r)/k), the headroom is {:.0}%",
            extra * 100.0,
            s.memory_headroom * 100.0
        ));
    }
    Ok(p)
}

/// A measured run's own configuration on the calibration machine, to predict it (validation):
/// the same model, servers, step time, save interval and kills, bandwidth shared by the servers
/// of one machine.
pub fn replay(
    c: &Coefficients,
    machine: &Machine,
    held_out: &Measured,
) -> Result<JobModel, SimError> {
    let n = held_out.servers.max(1) as f64;
    let m = held_out.model_bytes;
    let step_s = held_out.baseline_train_s / held_out.steps.max(1) as f64;
    let every_s = held_out.save_every_steps.map(|e| e as f64 * step_s);
    let detect = c.detect_s.unwrap_or(0.0);
    let replace = c.replace_s.unwrap_or(0.0);
    let mut job = JobModel {
        name: c.strategy.clone(),
        servers: held_out.servers,
        steady: c.steady,
        save: None,
        recovery: RecoveryModel {
            detect_s: detect,
            replace_s: replace,
            reload_s: 0.0,
            rollback: Rollback::Restart,
            degraded: None,
            tolerates: None,
            group: held_out.servers,
            backstop_reload_s: None,
            track_pls: false,
        },
    };
    match c.mechanism {
        Mechanism::Restart => {}
        Mechanism::Full | Mechanism::Partial => {
            let pause = m / (need(c.save_eff, "save throughput", c)? * machine.disk_write_bps);
            let shard = if c.mechanism == Mechanism::Full {
                m
            } else {
                m / n
            };
            job.save = every_s.map(|e| SaveModel {
                every_work_s: e,
                pause_s: pause,
                first_pause_s: pause,
            });
            job.recovery.reload_s =
                shard / (need(c.reload_eff, "reload", c)? * machine.disk_read_bps);
            job.recovery.rollback = if c.mechanism == Mechanism::Full {
                Rollback::ToLastSave
            } else {
                Rollback::Keep
            };
        }
        Mechanism::Delta => {
            let u = need(c.touched_per_step, "delta size", c)?;
            let every = held_out.save_every_steps.unwrap_or(1).max(1) as f64;
            let delta = (1.0 - (1.0 - u).powf(every)) * m;
            job.save = every_s.map(|e| SaveModel {
                every_work_s: e,
                pause_s: c.save_fixed_s
                    + delta
                        / (need(c.delta_eff, "delta-save throughput", c).unwrap_or(f64::INFINITY)
                            * machine.disk_write_bps),
                first_pause_s: m
                    / (need(c.save_eff, "full-save throughput", c).unwrap_or(f64::INFINITY)
                        * machine.disk_write_bps),
            });
            job.recovery.reload_s = m / (need(c.reload_eff, "reload", c)? * machine.disk_read_bps);
            job.recovery.rollback = Rollback::ToLastSave;
        }
        Mechanism::ErasureCoded => {
            let (k, r) = held_out.code.or(c.code).unwrap_or((2, 1));
            job.recovery.reload_s = c.reload_fixed_s.unwrap_or(0.0);
            job.recovery.rollback = Rollback::Keep;
            job.recovery.degraded = Some(Degraded {
                window_s: k as f64 * m / n / (need(c.rebuild_eff, "rebuild", c)? * machine.net_bps),
                share: c.degraded_share.unwrap_or(1.0),
            });
            job.recovery.tolerates = Some(r);
        }
    }
    Ok(job)
}

/// Seconds in a readable unit.
pub fn secs(s: f64) -> String {
    if !s.is_finite() {
        "never".into()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7_200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3_600.0)
    }
}

/// Bytes in a readable unit.
pub fn bytes(b: f64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut v = b;
    let mut i = 0;
    while v.abs() >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

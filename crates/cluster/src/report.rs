//! What a cluster run reports.

use serde::{Deserialize, Serialize};

use crate::{Role, RunConfig};

/// Kinds of timeline events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    ServersStarted,
    WorkersStarted,
    CheckpointStart,
    /// A save's rows are copied out of every server (the pause is over; uploads go on).
    CheckpointCopied,
    CheckpointEnd,
    CheckpointFailed,
    MergerStarted,
    MergerFinished,
    MergerFailed,
    MergerStopped,
    FailureInjected,
    FailureDetected,
    /// A server that answered no heartbeat (paused, hung) was killed: nothing it holds or
    /// sends lands any more.
    ServerFenced,
    RecoveryStart,
    ServerReplaced,
    /// One server loaded its shard (partial recovery restores the lost servers only).
    ServerRestored,
    WorkerReplaced,
    TrainingResumed,
    /// The work lost to a failure has been redone (or the lost state rebuilt).
    RecoveryComplete,
    /// A lost worker's half-done transactions were committed or aborted everywhere.
    TransactionsResolved,
    Aborted,
    /// The job was started again from its store (`ftrec run --resume`).
    JobResumed,
}

/// One event, `t_s` seconds after the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedEvent {
    pub t_s: f64,
    pub kind: EventKind,
    /// Steps applied when it happened.
    pub step: u64,
    pub server: Option<u32>,
    pub detail: String,
}

/// One failure and the recovery from it, in seconds after the kill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    pub role: Role,
    /// The server or worker id.
    pub id: u32,
    /// Steps applied when the process was killed (or found lost).
    pub step: u64,
    pub injected_t_s: f64,
    /// The coordinator declared the process lost.
    pub detected_s: Option<f64>,
    /// A replacement process is up and connected (the end of CPR's rescheduling overhead).
    pub replaced_s: Option<f64>,
    /// Training resumed (after the strategy's reload, for full recovery).
    pub resumed_s: Option<f64>,
    /// Training is back where it was at the failure: lost steps redone (full recovery), or
    /// the replacement took over (a worker).
    pub recovered_s: Option<f64>,
    /// Steps lost (applied after the restored checkpoint) and redone.
    pub steps_redone: u64,
    /// Servers whose state the recovery from this failure restored: every server for full
    /// recovery, the lost one only for partial recovery (CPR §2.3), none for a rebuild.
    #[serde(default)]
    pub servers_restored: Vec<u32>,
    /// How it was detected: `worker_rpc`, `commit_rpc`, `heartbeat` or `control` (a
    /// worker's control connection); with ECRec also `prepare_rpc` (phase 1 of a step) and
    /// `rebuild` (while starting or running a rebuild).
    pub detected_by: Option<String>,
}

impl FailureReport {
    /// The record of `role` `id` lost at `t_s` after step `step`, nothing known yet.
    pub fn lost(role: Role, id: u32, step: u64, t_s: f64) -> FailureReport {
        FailureReport {
            role,
            id,
            step,
            injected_t_s: t_s,
            detected_s: None,
            replaced_s: None,
            resumed_s: None,
            recovered_s: None,
            steps_redone: 0,
            detected_by: None,
            servers_restored: Vec::new(),
        }
    }

    /// Seconds from the kill to detection.
    pub fn detect_s(&self) -> Option<f64> {
        self.detected_s
    }

    /// Seconds from detection to the replacement being up (CPR's O_res, with detection).
    pub fn replace_s(&self) -> Option<f64> {
        Some(self.replaced_s? - self.detected_s?)
    }

    /// Seconds from the replacement being up to training resuming (CPR's O_load).
    pub fn reload_s(&self) -> Option<f64> {
        Some(self.resumed_s? - self.replaced_s.or(self.detected_s)?)
    }

    /// Seconds from training resuming to being back where it was (CPR's O_lost).
    pub fn redo_s(&self) -> Option<f64> {
        Some(self.recovered_s? - self.resumed_s?)
    }
}

/// One step's completion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepPoint {
    pub step: u64,
    pub t_s: f64,
    pub loss: f64,
}

/// Training throughput over one interval of the run (redone work counts: it is work done).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IntervalPoint {
    pub t_start_s: f64,
    pub t_end_s: f64,
    pub samples_per_s: f64,
}

/// The overhead terms of CPR Eq. 1, summed over the run, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Overheads {
    /// Training paused for checkpoint saves while it ran (the save of the last step at the
    /// end is `RunReport::final_save_s`, not counted here).
    pub o_save: f64,
    /// Checkpoint loading during recoveries.
    pub o_load: f64,
    /// Redoing the work lost since the restored checkpoint.
    pub o_lost: f64,
    /// Detecting failures and bringing up replacements.
    pub o_res: f64,
}

/// Throughput per interval of `width_s` from batch completion times.
pub fn intervals(completions: &[f64], samples_per_batch: u64, width_s: f64) -> Vec<IntervalPoint> {
    let Some(&last) = completions.last() else {
        return Vec::new();
    };
    let n = ((last / width_s).floor() as usize) + 1;
    let mut counts = vec![0u64; n];
    for &t in completions {
        let i = ((t / width_s).floor() as usize).min(n - 1);
        counts[i] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let t_start_s = i as f64 * width_s;
            // The last interval ends at the last completion.
            let t_end_s = if i + 1 == n {
                last.max(t_start_s + 1e-9)
            } else {
                t_start_s + width_s
            };
            IntervalPoint {
                t_start_s,
                t_end_s,
                samples_per_s: (c * samples_per_batch) as f64 / (t_end_s - t_start_s),
            }
        })
        .collect()
}

/// What became of one scheduled kill (in the run report's `kills`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KillOutcome {
    /// The kill as given (`server=1@step=12`).
    pub kill: String,
    pub fired: bool,
    /// Seconds after the run started at which it fired.
    pub t_s: Option<f64>,
    /// The steps completed when it fired.
    pub step: Option<u64>,
    /// Why it did not fire (the point it waited for never came in the run).
    pub not_fired: Option<String>,
}

impl KillOutcome {
    /// One line for a person: `kill server=1@step=12: fired after step 12 (1.23 s)`.
    pub fn line(&self) -> String {
        match (self.fired, self.t_s, self.step) {
            (true, Some(t), Some(s)) => {
                format!("kill {}: fired after step {s} ({t:.2} s)", self.kill)
            }
            _ => format!(
                "kill {}: NOT FIRED ({})",
                self.kill,
                self.not_fired.as_deref().unwrap_or("its point never came")
            ),
        }
    }
}

/// Reasons of failed saves a report keeps.
pub const MAX_FAILURE_REASONS: usize = 16;

/// The report of [`crate::run`] (the `--json` output of `ftrec run`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's job id (`crate::auth`): every request and control connection carried it.
    #[serde(default)]
    pub job_id: String,
    pub strategy: String,
    pub steps: u64,
    /// Training samples of the steps in the final model (`steps * workers * batch`, less at the
    /// end of TSV data).
    pub samples: u64,
    /// Samples computed again after recoveries.
    pub samples_redone: u64,
    /// The whole run: start-up, training, the final save and evaluation.
    pub wall_s: f64,
    /// From the first step to the last, pauses and recoveries included.
    pub train_s: f64,
    /// Samples this run trained (`samples` less those of the checkpoint a resumed run started
    /// from).
    #[serde(default)]
    pub samples_trained: u64,
    /// Training throughput: [`samples_per_s`]`(samples_trained, train_s)`, the one definition
    /// every report and table uses.
    pub samples_per_s: f64,
    /// Mean loss of the last step's workers.
    pub train_loss: f64,
    pub events: Vec<TimedEvent>,
    pub failures: Vec<FailureReport>,
    pub checkpoints: u64,
    /// Saves that did not commit (the store failed past its retries, a server was lost
    /// during the write): training went on and the next save tried again; only the restore
    /// point aged meanwhile.
    #[serde(default)]
    pub checkpoints_failed: u64,
    /// Why, for the first [`MAX_FAILURE_REASONS`] of them.
    #[serde(default)]
    pub checkpoint_failures: Vec<String>,
    /// Training paused for checkpoints (seconds, all saves).
    pub checkpoint_pause_s: f64,
    /// Of which the save of the last step at the end of the run (no failure can cost it
    /// anything, so CPR Eq. 1 / Eq. 2 leave it out).
    #[serde(default)]
    pub final_save_s: f64,
    /// CPR Eq. 1's overhead terms.
    pub overheads: Overheads,
    /// Samples per second per interval of `config.report_interval_s`, from training start.
    pub throughput: Vec<IntervalPoint>,
    /// Where the workers' time went, summed over every batch they answered.
    pub worker_time: crate::control::BatchTiming,
    pub bytes_written: u64,
    pub model_digest: String,
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
    pub eval_samples: usize,
    /// Set when the strategy ended the run.
    pub aborted: Option<String>,
    /// Every server process started (pids), replacements included; all are reaped at return.
    pub server_pids: Vec<u32>,
    /// Every worker process started, replacements included; all are reaped at return.
    pub worker_pids: Vec<u32>,
    /// Every address a server listened on.
    pub server_addrs: Vec<String>,
    pub timeline: Vec<StepPoint>,
    /// `deck`'s store side (absent for other strategies).
    #[serde(default)]
    pub store: Option<StoreReport>,
    pub config: RunConfig,
    /// Strategy `ecrec`: code, 2PC cost, memory overhead, rebuilds, parity audit.
    #[serde(default)]
    pub ec: Option<crate::ecrec::EcReport>,
    /// CPU time (user + system) of the run's processes.
    #[serde(default)]
    pub cpu: CpuReport,
    /// Strategy `cpr`: the save interval and its inputs, the §4.2 benefit analysis, and the
    /// portion of lost samples per failure and in total (CPR Eq. 3).
    #[serde(default)]
    pub cpr: Option<ftrec_strategy::CprReport>,
    /// TSV data: where the stream stands after the last step, and whether the data ended.
    #[serde(default)]
    pub data: Option<DataReport>,
    /// A run resumed from its store (`ftrec run --resume`): the checkpoint, its step, and the
    /// servers that saved it and restored it.
    #[serde(default)]
    pub resumed: Option<crate::coordinator::ResumeReport>,
    /// Every kill of the schedule: fired (when, after which step) or not, and why not.
    #[serde(default)]
    pub kills: Vec<KillOutcome>,
    /// The memory report of every server process that stopped normally at the end of the
    /// run (a killed one wrote none), in server order; replacements carry their generation.
    #[serde(default)]
    pub server_memory: Vec<crate::memory::ServerMemory>,
}

/// The one definition of samples/s ([`ftrec_core::samples_per_s`]).
pub use ftrec_core::samples_per_s;

/// What a run on Criteo TSV data read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataReport {
    /// Files read (in order).
    pub files: usize,
    /// Global batches in the final model (the last one may be short).
    pub batches: u64,
    /// Training samples in them.
    pub samples: u64,
    /// Where the stream stands after them (the position a checkpoint of the end would save).
    pub position: ftrec_data::Position,
    /// The run ended because the data did (every configured epoch trained), not at `--steps`.
    pub ended: bool,
    /// Malformed training lines skipped (`--skip-malformed`).
    pub malformed_skipped: u64,
}

/// CPU time (user + system, seconds) the run's processes used, read from `/proc` just before
/// each process was stopped or killed (every incarnation, replacements included). Less
/// sensitive than wall time to other load on a shared machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    /// Whole processes: start-up (a server's seeded rows, ECRec's initial parity encode),
    /// training, and what follows it (the final digest, evaluation, ECRec's parity audit).
    pub servers_s: f64,
    pub workers_s: f64,
    /// The part of it spent while training ran, from the first batch handed out to the last
    /// one answered (recoveries inside that window included, a replacement's start-up too):
    /// what a training overhead is about. `None` when training did not end normally.
    #[serde(default)]
    pub train_servers_s: Option<f64>,
    #[serde(default)]
    pub train_workers_s: Option<f64>,
    /// Processes whose CPU time could not be read (not on Linux, or gone before the read).
    pub unread: u32,
}

/// Collects a run's [`CpuReport`]: every process's CPU time once, just before it stops, and
/// the part of it inside the training window.
#[derive(Debug, Default)]
pub struct CpuMeter {
    report: CpuReport,
    /// While the training window is open: CPU time of each process at its opening (a process
    /// started later counts from zero), and the window's sums so far.
    window: Option<(std::collections::HashMap<u32, f64>, f64, f64)>,
}

impl CpuMeter {
    /// Add the CPU time of process `pid` so far, as a server's or a worker's (the process is
    /// about to stop or be killed).
    pub fn add(&mut self, pid: u32, server: bool) {
        let Some(now) = process_cpu_s(pid) else {
            self.report.unread += 1;
            return;
        };
        if server {
            self.report.servers_s += now;
        } else {
            self.report.workers_s += now;
        }
        self.add_window(pid, server, now);
    }

    fn add_window(&mut self, pid: u32, server: bool, now: f64) {
        if let Some((at_open, servers, workers)) = &mut self.window {
            let part = (now - at_open.remove(&pid).unwrap_or(0.0)).max(0.0);
            if server {
                *servers += part;
            } else {
                *workers += part;
            }
        }
    }

    /// Training starts: remember the CPU time of the live processes `pids`.
    pub fn open_window(&mut self, pids: &[u32]) {
        let at_open = pids
            .iter()
            .filter_map(|&p| Some((p, process_cpu_s(p)?)))
            .collect();
        self.window = Some((at_open, 0.0, 0.0));
    }

    /// Training ended normally: count the window's part of the live processes `pids`
    /// (`(pid, server)`) and close it.
    pub fn close_window(&mut self, pids: &[(u32, bool)]) {
        for &(pid, server) in pids {
            if let Some(now) = process_cpu_s(pid) {
                self.add_window(pid, server, now);
            }
        }
        if let Some((_, servers, workers)) = self.window.take() {
            self.report.train_servers_s = Some(servers);
            self.report.train_workers_s = Some(workers);
        }
    }

    pub fn report(&self) -> CpuReport {
        self.report
    }
}

/// User + system CPU seconds of process `pid` so far, from `/proc/PID/stat` (Linux).
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks_per_s())
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// What a `deck` run did with its store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreReport {
    pub location: String,
    /// Commits of full checkpoints saved by the trainer, and of deltas.
    pub fulls: u64,
    pub deltas: u64,
    /// Seconds of the pause spent copying rows out (the rest of `checkpoint_pause_s` is
    /// `upload_wait_s`).
    pub copy_pause_s: f64,
    /// Seconds training waited at a save point for the previous save's upload.
    pub upload_wait_s: f64,
    /// Merger passes that ended normally, and the merged or full checkpoints they wrote.
    pub merger_passes: u64,
    pub merged_written: u64,
    /// Incremental pieces committed (`incrcp`, `incremental`, `cnr`).
    #[serde(default)]
    pub pieces: u64,
    /// The strategy's choices at its save points: a new full or a piece, and why (IncrCP
    /// §4.5's `T_base` against `T_incre`, Check-N-Run's size share, every N pieces).
    #[serde(default)]
    pub decisions: Vec<ftrec_strategy::Decision>,
    /// What IncrCP's extraction rounds did, summed over the committed pieces and servers:
    /// comparisons, those each filter stage stopped, chunks and rows extracted (§4.3).
    #[serde(default)]
    pub extraction: Option<ftrec_ckpt::format::ExtractStats>,
    /// Check-N-Run's quantized pieces: the largest absolute error of a stored value. Restores
    /// from such pieces are approximate, so the run's digest is not the failure-free one.
    #[serde(default)]
    pub quant_max_abs_error: Option<f64>,
}

impl RunReport {
    /// A few human-readable lines.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "job {}: strategy {}: {} steps ({} samples in the model); trained {} samples in \
             {:.2}s of training ({:.0} samples/s), {:.2}s in all; {} checkpoints ({:.3}s \
             paused, {} bytes), {} failures\n",
            self.job_id,
            self.strategy,
            self.steps,
            self.samples,
            self.samples_trained,
            self.train_s,
            self.samples_per_s,
            self.wall_s,
            self.checkpoints,
            self.checkpoint_pause_s,
            self.bytes_written,
            self.failures.len()
        );
        if let Some(r) = &self.resumed {
            s += &format!(
                "  resumed from checkpoint {} at step {} of {} (saved by {} servers, restored \
                 onto {})\n",
                r.checkpoint, r.step, r.location, r.saved_servers, r.servers
            );
        }
        if self.checkpoints_failed > 0 {
            s += &format!(
                "  {} saves failed and were retried at later save points (training went on;                  the restore point aged); first: {}\n",
                self.checkpoints_failed,
                self.checkpoint_failures.first().map_or("-", String::as_str)
            );
        }
        let secs = |v: Option<f64>| v.map_or("-".to_string(), |d| format!("{d:.3}s"));
        for f in &self.failures {
            s += &format!(
                "  {} {} lost after step {}: detected {}, replaced {}, resumed {}, recovered {} \
                 after the kill; {} steps redone{}\n",
                f.role,
                f.id,
                f.step,
                secs(f.detected_s),
                secs(f.replaced_s),
                secs(f.resumed_s),
                secs(f.recovered_s),
                f.steps_redone,
                if f.servers_restored.is_empty() {
                    String::new()
                } else {
                    format!("; servers restored {:?}", f.servers_restored)
                }
            );
        }
        let w = &self.worker_time;
        let total = (w.data_s + w.pull_s + w.compute_s + w.push_s).max(1e-9);
        s += &format!(
            "  worker time: data {:.0}%, pull {:.0}%, compute {:.0}%, push {:.0}%\n",
            100.0 * w.data_s / total,
            100.0 * w.pull_s / total,
            100.0 * w.compute_s / total,
            100.0 * w.push_s / total
        );
        let o = &self.overheads;
        s += &format!(
            "  overheads (CPR Eq. 1): save {:.3}s, load {:.3}s, lost {:.3}s, res {:.3}s\n",
            o.o_save, o.o_load, o.o_lost, o.o_res
        );
        if let Some(d) = &self.store {
            s += &format!(
                "  store {}: {} fulls + {} deltas committed, copy-out {:.3}s, upload wait {:.3}s, \
                 {} merger passes wrote {} checkpoints\n",
                d.location,
                d.fulls,
                d.deltas,
                d.copy_pause_s,
                d.upload_wait_s,
                d.merger_passes,
                d.merged_written
            );
            if d.pieces > 0 {
                let resets = d.decisions.iter().filter(|x| x.full).count();
                s += &format!(
                    "  {} incremental pieces committed; {resets} of {} save points chose a new \
                     full\n",
                    d.pieces,
                    d.decisions.len()
                );
            }
            if let Some(x) = &d.extraction {
                s += &format!(
                    "  extraction: {} comparisons, skipped {} by range / {} by Bloom filter / {} \
                     by count, {} chunks extracted ({} rows)\n",
                    x.compared,
                    x.range_skips,
                    x.bloom_skips,
                    x.actual_skips,
                    x.extracted,
                    x.rows_extracted
                );
            }
            if let Some(e) = d.quant_max_abs_error {
                s += &format!(
                    "  quantized pieces: max abs error {e:.3e}; restores from them are \
                     approximate, so the digest is not the failure-free run's\n"
                );
            }
        }
        if let (Some(auc), Some(ll)) = (self.auc, self.logloss) {
            s += &format!(
                "  auc {auc:.4} logloss {ll:.4} on {} held-out samples\n",
                self.eval_samples
            );
        }
        if let Some(ec) = &self.ec {
            s += &ec.summary();
        }
        if let Some(c) = &self.cpr {
            let every = match (c.interval.full_every_steps, c.interval.full_every_s) {
                (Some(n), _) => format!("{n} steps"),
                (None, Some(t)) => format!("{t:.2}s"),
                (None, None) => "-".into(),
            };
            let saved = match c.pls.saved_total {
                Some(p) => format!("{p:.5}"),
                None => "unknown".into(),
            };
            s += &format!(
                "  cpr: {} recovery, save interval {every} ({} full + {} prioritized saves \
                 committed), PLS {:.5} (Eq. 3) / {saved} (counting what was saved) over {} \
                 failures\n",
                c.recovery,
                c.full_saves,
                c.partial_saves,
                c.pls.total,
                c.pls.per_failure.len()
            );
        }
        if let Some(d) = &self.data {
            let at = match &d.position {
                ftrec_data::Position::Tsv {
                    file_name,
                    line,
                    epoch,
                    ..
                } => format!("{file_name} line {line}, epoch {epoch}"),
                other => format!("{other:?}"),
            };
            s += &format!(
                "  data: {} batches, {} samples from {} files, {} (at {at}); {} malformed lines \
                 skipped\n",
                d.batches,
                d.samples,
                d.files,
                if d.ended {
                    "the data ended"
                } else {
                    "stopped at --steps"
                },
                d.malformed_skipped
            );
        }
        if let Some(r) = &self.aborted {
            s += &format!("  aborted: {r}\n");
        }
        s += &format!("  model_digest {}", self.model_digest);
        s
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Spin until this process has used at least `secs` more CPU time.
    fn burn(secs: f64) {
        let me = std::process::id();
        let start = process_cpu_s(me).expect("own /proc stat");
        let mut x = 0u64;
        while process_cpu_s(me).expect("own /proc stat") < start + secs {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
    }

    #[test]
    fn the_training_window_counts_only_the_cpu_time_spent_inside_it() {
        let me = std::process::id();
        let mut meter = CpuMeter::default();
        burn(0.05);
        let before = process_cpu_s(me).unwrap();
        meter.open_window(&[me]);
        burn(0.05);
        meter.close_window(&[(me, true)]);
        let inside = process_cpu_s(me).unwrap() - before;
        burn(0.05);
        meter.add(me, true);
        let r = meter.report();
        let train = r.train_servers_s.expect("the window was closed");
        assert!(train > 0.0, "{r:?}");
        // The window saw no more than the time between its opening and its closing (the
        // counter only grows), and the whole process more than the window.
        assert!(train <= inside, "{r:?}, inside {inside}");
        assert!(r.servers_s >= train + 0.05, "{r:?}");
        assert_eq!(r.train_workers_s, Some(0.0));
        assert_eq!(r.workers_s, 0.0);
    }

    #[test]
    fn a_process_stopped_inside_the_window_counts_its_part_once() {
        let me = std::process::id();
        let mut meter = CpuMeter::default();
        meter.open_window(&[me]);
        burn(0.03);
        // Killed mid-training: its part is counted at the kill, not again at the close.
        meter.add(me, false);
        let at_kill = meter.report();
        burn(0.03);
        meter.close_window(&[]);
        let r = meter.report();
        assert!(r.train_workers_s.unwrap() > 0.0);
        assert!(r.train_workers_s.unwrap() <= at_kill.workers_s);
        assert_eq!(r.workers_s, at_kill.workers_s);
    }

    #[test]
    fn a_window_never_closed_reports_no_training_time() {
        let mut meter = CpuMeter::default();
        meter.open_window(&[std::process::id()]);
        meter.add(std::process::id(), true);
        let r = meter.report();
        assert!(r.servers_s > 0.0);
        assert_eq!(r.train_servers_s, None);
    }
}

//! The coordinator: launches (or waits for) the servers and workers, hands out batches,
//! detects failures, runs the strategy and carries out its actions, and reports.
//!
//! Work is counted in global batches (see [`crate::worker`]). In synchronous mode a step is
//! `M` batches, one per worker, staged on the servers and committed in worker order before the
//! next step starts. In asynchronous mode every free worker gets the next batch at once and
//! pushes its update when done; a step is complete when `M` more batches are. Before a
//! checkpoint the coordinator stops handing out batches and waits for those in flight, so the
//! saved model holds exactly the batches before the saved data position.
//!
//! Failure detection has three sources. Workers' RPC errors (and the coordinator's own commit
//! errors) say *that* something failed; the coordinator then finds *which* servers are lost:
//! a server whose process has exited, or that does not answer an `info` probe within the
//! heartbeat timeout. A heartbeat task probes every server periodically and reports one that
//! stays silent, which catches a server that dies or hangs between steps. A worker is lost
//! when its control connection breaks (the process died) or it stays silent for the step
//! timeout.
//!
//! Step numbers on the servers: the servers refuse to commit a step number twice, and full
//! recovery redoes steps, so every attempt to commit is staged under a fresh, increasing
//! sequence number (`seq`), distinct from the training step it computes.

mod asynchronous;
mod ecrec;
mod faults;
mod heartbeat;
mod lease;
mod meter;
mod outside;
mod pacing;
mod partial;
mod resume;
mod store;
mod workers;

pub use resume::ResumeReport;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ftrec_ckpt::CheckpointKind;
use ftrec_core::ServerId;
use ftrec_data::{BatchSource, SyntheticSource};
use ftrec_ps::grpc::GrpcClient;
use ftrec_ps::net::PeerAddr;
use ftrec_ps::ShardedClient;
use ftrec_strategy::deck::{Deck, DeckConfig};
use ftrec_strategy::{
    Action, CheckpointRef, Cnr, CnrConfig, Event, FullCheckpoint, IncrCp, IncrCpConfig,
    Incremental, Interval, NoFaultTolerance, Strategy,
};
use tokio::sync::{mpsc as tmpsc, watch};

use crate::control::{BatchTiming, FromWorker, PoolEvent, ToWorker, WorkerPool};

use crate::plan::BatchPlan;
use crate::report::{
    intervals, CpuMeter, EventKind, FailureReport, Overheads, RunReport, StepPoint, TimedEvent,
};
use crate::worker::{connect_all, Compute, WorkerSetup};
use crate::{
    ClusterError, KillAt, KillSpec, Phase, Role, RunConfig, ServerProcess, StrategyChoice,
};

/// Longest a worker may take for one batch (pull, compute, stage or push) before it counts as
/// failed.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Failed batches in a row, with every server alive, after which a run gives up.
const MAX_UNEXPLAINED_FAILURES: u32 = 3;
/// How long a stopping process may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How often the asynchronous loop looks at the clock and the heartbeat when no reply comes.
const POLL: Duration = Duration::from_millis(10);
/// Threads of the coordinator runtime's blocking pool (store I/O).
const COORDINATOR_BLOCKING_THREADS: usize = 16;
/// How often the asynchronous loop asks rebuilding servers how far they are.
const REBUILD_POLL: Duration = Duration::from_millis(100);

/// Run a whole multi-process training job: start `cfg.servers` server processes and
/// `cfg.workers` worker processes (or use those started elsewhere), train `cfg.steps` steps
/// under the configured strategy and faults, evaluate, stop every process, and report. A run
/// the strategy aborts (strategy `none` after a loss) returns `Ok` with
/// [`RunReport::aborted`] set; an error that is not a server loss returns `Err`. Every started
/// process is reaped before this returns.
pub fn run(cfg: &RunConfig) -> Result<RunReport, ClusterError> {
    run_job(cfg, false)
}

/// Start a job again from its store (`cfg.store_location()`): start fresh servers and workers,
/// restore every server from the newest committed checkpoint through the recovery path (onto
/// `cfg.servers` servers, re-sharded if the checkpoint was saved by another number), rewind
/// the data to its position, and train to `cfg.steps`, ending with the strategy's final save.
/// `cfg` is the job as its store records it ([`crate::job::read`]) with this invocation's
/// settings. A store with no committed checkpoint is an error, before any process starts;
/// [`RunReport::resumed`] says where the run started.
pub fn resume(cfg: &RunConfig) -> Result<RunReport, ClusterError> {
    if !cfg.strategy.uses_store() {
        return Err(ClusterError::Config(format!(
            "strategy {} saves no checkpoints: there is nothing to resume from",
            cfg.strategy.name()
        )));
    }
    run_job(cfg, true)
}

fn run_job(cfg: &RunConfig, resume: bool) -> Result<RunReport, ClusterError> {
    cfg.validate()?;
    // Every run has a job id: the given one, else a new one (`crate::auth`).
    let cfg = &RunConfig {
        auth: crate::auth::with_job(&cfg.auth, cfg.seed),
        ..cfg.clone()
    };
    let start = Instant::now();
    // The store creates its own directory (and may not be local at all).
    std::fs::create_dir_all(&cfg.work_dir).map_err(|e| ClusterError::Io {
        what: format!("creating {}", cfg.work_dir.display()),
        source: e,
    })?;
    // The coordinator's own matrix work is the final evaluation only; results do not depend
    // on the thread count, so a process that fixed it already (a benchmark that also ran the
    // single-process trainer) keeps its setting.
    let _ = ftrec_model::set_gemm_threads(cfg.threads);
    // The coordinator's blocking work is store I/O (the local store runs each file operation
    // on the blocking pool). Left at tokio's default (512) the pool grows to one thread per
    // file of the widest burst of concurrent reads (~100 threads reading a long incremental
    // chain's pieces), and every idle-but-living thread keeps its stack's touched pages: the
    // coordinator's resident memory grew with the chain while its heap stayed at 3 MB. Sixteen
    // threads keep two cores' disks busy.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(COORDINATOR_BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Io {
            what: "starting the coordinator runtime".into(),
            source: e,
        })?;
    let strategy: Box<dyn Strategy> = match cfg.strategy {
        StrategyChoice::None => Box::new(NoFaultTolerance::default()),
        StrategyChoice::Full { every_steps } => Box::new(
            FullCheckpoint::new(Interval::Steps(every_steps))
                .map_err(|e| ClusterError::Config(e.to_string()))?,
        ),
        StrategyChoice::EcRec { .. } => ecrec::strategy(cfg)?,
        StrategyChoice::Cpr { .. } => crate::cpr::strategy(cfg)?,
        StrategyChoice::Deck {
            delta_every_steps, ..
        } => Box::new(
            // The trainer saves the first full; later fulls come from the merger (DECK §3.3).
            Deck::new(DeckConfig {
                delta_every: Interval::Steps(delta_every_steps),
                full_every_deltas: None,
            })
            .map_err(|e| ClusterError::Config(e.to_string()))?,
        ),
        StrategyChoice::Incremental {
            every_steps,
            full_every_pieces,
        } => Box::new(
            Incremental::new(Interval::Steps(every_steps), full_every_pieces)
                .map_err(|e| ClusterError::Config(e.to_string()))?,
        ),
        StrategyChoice::Cnr {
            every_steps,
            reset_fraction,
            quant_bits,
        } => Box::new(
            Cnr::new(CnrConfig {
                every: Interval::Steps(every_steps),
                reset_fraction,
                quant_bits,
            })
            .map_err(|e| ClusterError::Config(e.to_string()))?,
        ),
        StrategyChoice::IncrCp {
            every_steps,
            reset,
            threshold,
            range_rows,
            concat,
        } => Box::new(
            IncrCp::new(IncrCpConfig {
                every: Interval::Steps(every_steps),
                reset,
                threshold,
                range_rows,
                concat,
                read: Default::default(),
            })
            .map_err(|e| ClusterError::Config(e.to_string()))?,
        ),
    };
    let store = if cfg.strategy.uses_store() {
        Some(store::StoreState::open(
            &rt,
            cfg.store_location(),
            cfg,
            resume,
        )?)
    } else {
        None
    };
    let plan = match &cfg.data {
        Some(tsv) => {
            let mut plan = BatchPlan::open(tsv, cfg.batch)?;
            // A kill after step S needs a step after S: refuse one the data does not reach now,
            // not after training.
            for k in &cfg.kills {
                if let KillAt::Step(step) = k.at {
                    if !plan.has(step.saturating_mul(cfg.workers as u64).saturating_add(1))? {
                        return Err(ClusterError::Config(format!(
                            "--kill {k}: the data has no step after step {step} (a kill after \
                             the last step would not be noticed)"
                        )));
                    }
                }
            }
            Some(plan)
        }
        None => None,
    };
    // From here on every request of the coordinator carries its incarnation.
    let cfg = &lease::incarnate(cfg, store.as_ref());
    let resume_at = match (&store, resume) {
        (Some(st), true) => Some(resume::resume_point(&rt, st, cfg.steps)?),
        _ => None,
    };
    // The job record: what the job is, so that it can be resumed from its store alone.
    if let Some(st) = &store {
        rt.block_on(crate::job::write(&st.ckpts, cfg))?;
    }
    let pool = WorkerPool::listen_with(
        cfg.control_listen,
        cfg.workers,
        (!cfg.external_workers).then_some(cfg.exe.as_path()),
        cfg.auth.clone(),
    )?
    .on_cpus(cfg.worker_cpus.clone());
    let (hb_targets, hb_rx) = watch::channel(Vec::new());
    let (lost_tx, lost_rx) = tmpsc::unbounded_channel();
    let mut c = Coordinator {
        cfg: cfg.clone(),
        rt,
        start,
        strategy,
        procs: Vec::new(),
        server_addrs: Vec::new(),
        generation: vec![0; cfg.servers as usize],
        clients: None,
        pool,
        hb_targets,
        lost_rx,
        batches: 0,
        seq: 0,
        train_start: None,
        train_end: None,
        events: Vec::new(),
        failures: Vec::new(),
        pids: Vec::new(),
        addrs: Vec::new(),
        checkpoints: 0,
        bytes_written: 0,
        pause_s: 0.0,
        paused: false,
        stopped: Vec::new(),
        samples_redone: 0,
        recoveries: 0,
        aborted: None,
        last_loss: f64::NAN,
        timeline: Vec::new(),
        completions: Vec::new(),
        spans: Vec::new(),
        kills: cfg.kills.iter().map(|k| (*k, None)).collect(),
        worker_time: BatchTiming::default(),
        recover_at: Vec::new(),
        store,
        phase_entries: HashMap::new(),
        worker_phase_entries: HashMap::new(),
        upload_wait_s: 0.0,
        ec: None,
        cpu: CpuMeter::default(),
        rewinds: 0,
        rewound_to: 0,
        final_save_s: 0.0,
        plan,
        attempt_base: 0,
        resumed: None,
        meter: Default::default(),
    };
    c.rt.spawn(heartbeat::heartbeat(
        hb_rx,
        cfg.heartbeat,
        cfg.heartbeat_timeout,
        lost_tx,
        cfg.auth.clone(),
    ));
    let result = c
        .start_all()
        .and_then(|()| match resume_at {
            Some(p) => c.resume_from(p),
            None => Ok(true),
        })
        .and_then(|go_on| {
            if !go_on {
                Ok(())
            } else if c.cfg.sync {
                c.train_sync()
            } else {
                c.train_async()
            }
        })
        .and_then(|()| {
            c.train_end = Some(Instant::now());
            let live = c.live_pids();
            c.cpu.close_window(&live);
            c.ec_finish()
        })
        .and_then(|()| c.check_step_kills_fired());
    c.finish(result)
}

/// The shortest wait between two looks at the heartbeats while a step runs.
const MIN_TICK: Duration = Duration::from_millis(20);

/// How a step or batch failed.
enum Failure {
    /// Workers whose control connection broke or who stopped answering.
    Workers(Vec<u32>, String),
    /// An RPC to the servers failed (`by`: who saw it).
    Rpc(&'static str, String),
    /// The training data cannot be read: the run stops.
    BadData(ClusterError),
}

struct Coordinator {
    cfg: RunConfig,
    rt: tokio::runtime::Runtime,
    start: Instant,
    strategy: Box<dyn Strategy>,
    /// Server processes this coordinator started (empty with external servers).
    procs: Vec<ServerProcess>,
    /// Every server's current address, in server order.
    server_addrs: Vec<PeerAddr>,
    generation: Vec<u32>,
    clients: Option<ShardedClient<GrpcClient>>,
    pool: WorkerPool,
    hb_targets: watch::Sender<Vec<(u32, PeerAddr)>>,
    lost_rx: tmpsc::UnboundedReceiver<(u32, u32, String)>,
    /// Global batches applied to the servers' model.
    batches: u64,
    seq: u64,
    train_start: Option<Instant>,
    /// When the training loop ended normally (what follows, ECRec's wait for rebuilds and
    /// parity audit, the last save, the digest and evaluation, is not training time).
    train_end: Option<Instant>,
    events: Vec<TimedEvent>,
    failures: Vec<FailureReport>,
    pids: Vec<u32>,
    addrs: Vec<String>,
    checkpoints: u64,
    bytes_written: u64,
    pause_s: f64,
    /// The strategy paused training and has not resumed it: a save in flight is waited for.
    paused: bool,
    /// Servers a scheduled kill stopped (SIGSTOP), not yet found lost.
    stopped: Vec<u32>,
    samples_redone: u64,
    recoveries: u32,
    aborted: Option<String>,
    last_loss: f64,
    timeline: Vec<StepPoint>,
    /// Seconds after training start at which each batch completed.
    completions: Vec<f64>,
    /// Seconds after training start at which each answered batch was handed out and answered
    /// (a batch a resolution counted has none): what a window's throughput is measured from.
    spans: Vec<(f64, f64)>,
    /// Every scheduled kill and, once it fired, when.
    kills: Vec<(KillSpec, Option<faults::Fired>)>,
    /// Summed over every answered batch.
    worker_time: BatchTiming,
    /// Failures (by index) that are recovered once `batches` reaches the given count again.
    recover_at: Vec<(usize, u64)>,
    /// A saving strategy's checkpoint store, the save in flight, the merger.
    store: Option<store::StoreState>,
    /// How often each phase was entered (for `phase=NAME#N` kills).
    phase_entries: HashMap<Phase, u32>,
    /// Per phase and worker, the times that worker's transactions entered it (asynchronous
    /// ECRec: a worker's phase kill counts its own entries).
    worker_phase_entries: HashMap<(Phase, u32), u32>,
    /// Time training waited for saves to commit (a blocking strategy's whole upload, or a
    /// save point reached while the previous save still uploaded).
    upload_wait_s: f64,
    /// Strategy `ecrec`: the nodes' ECRec clients, rebuilds under way, the report's EC part.
    ec: Option<ecrec::EcRun>,
    /// CPU time of the processes stopped or killed so far.
    cpu: CpuMeter,
    /// Recoveries that rewound the model to a saved data position (full recovery); a partial
    /// recovery or a worker's replacement leaves the position where it was.
    rewinds: u64,
    /// The batch count the newest rewind restored.
    rewound_to: u64,
    /// Pause of the save of the last step at the end of the run.
    final_save_s: f64,
    /// TSV data: where every global batch starts ([`crate::plan`]).
    plan: Option<BatchPlan>,
    /// Added to the recovery count in checkpoint ids (`-a<N>`): a resumed run counts on past
    /// the attempts its store holds.
    attempt_base: u32,
    /// Where a resumed run started.
    resumed: Option<ResumeReport>,
    /// What the process metrics have counted.
    meter: meter::Meter,
}

/// A worker's answer that the batch's data cannot be read.
fn bad_data(index: u64, worker: u32, error: String) -> ClusterError {
    ClusterError::BadData {
        index,
        reason: format!("worker {worker}: {error}"),
    }
}

impl Coordinator {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Pids of the processes running now, and whether each is a server.
    fn live_pids(&mut self) -> Vec<(u32, bool)> {
        let mut pids: Vec<(u32, bool)> = (0..self.workers())
            .filter(|&w| self.pool.is_connected(w))
            .filter_map(|w| Some((self.pool.pid(w)?, false)))
            .collect();
        for p in &mut self.procs {
            if !p.has_exited() {
                pids.push((p.pid(), true));
            }
        }
        pids
    }

    fn workers(&self) -> u32 {
        self.cfg.workers
    }

    /// Completed steps (in asynchronous mode, whole multiples of `workers` batches). At the end
    /// of TSV data the last step may have fewer batches than workers; it counts once done.
    fn step(&self) -> u64 {
        let m = self.workers() as u64;
        if self.at_data_end() {
            self.batches.div_ceil(m)
        } else {
            self.batches / m
        }
    }

    /// Every batch of the data has been applied (TSV data whose end the plan has found).
    fn at_data_end(&self) -> bool {
        self.plan.as_ref().and_then(|p| p.end()) == Some(self.batches)
    }

    /// Batches of the whole run: `steps * workers`, or fewer if the data ends before (known
    /// once the plan has walked there, which it does one batch ahead of the batches handed
    /// out).
    fn total_batches(&self) -> u64 {
        let steps = self.cfg.steps.saturating_mul(self.workers() as u64);
        match self.plan.as_ref().and_then(|p| p.end()) {
            Some(end) => steps.min(end),
            None => steps,
        }
    }

    /// Whether global batch `index` is part of the run (walking the plan as needed).
    fn batch_exists(&mut self, index: u64) -> Result<bool, ClusterError> {
        if index == 0 || index > self.cfg.steps.saturating_mul(self.workers() as u64) {
            return Ok(false);
        }
        match self.plan.as_mut() {
            Some(p) => p.has(index),
            None => Ok(true),
        }
    }

    /// The command that trains global batch `index` (with its start on TSV data).
    fn batch_cmd(
        &mut self,
        index: u64,
        seq: Option<u64>,
        hold: Vec<crate::control::TxnHold>,
    ) -> Result<ToWorker, ClusterError> {
        let start = match self.plan.as_mut() {
            Some(p) => Some(p.start(index)?.ok_or_else(|| {
                ClusterError::Protocol(format!("batch {index} is past the end of the data"))
            })?),
            None => None,
        };
        Ok(ToWorker::Batch {
            index,
            seq,
            hold,
            start,
            fences: self.cfg.auth.fences.table_text(),
            rewinds: self.rewinds,
            restored: self.rewound_to,
        })
    }

    /// Training samples in the first `batches` global batches.
    fn samples_in(&mut self, batches: u64) -> u64 {
        match self.plan.as_mut() {
            Some(p) => p
                .after(batches)
                .map_or(batches * self.cfg.batch as u64, |a| a.1),
            None => batches * self.cfg.batch as u64,
        }
    }

    fn event(&mut self, kind: EventKind, server: Option<u32>, detail: String) {
        let (t_s, step) = (self.now(), self.step());
        tracing::info!(target: ftrec_obs::EVENT_TARGET, ?kind, step, server, t_s, "{detail}");
        self.events.push(TimedEvent {
            t_s,
            kind,
            step,
            server,
            detail,
        });
        self.meter_event(kind, t_s);
    }

    fn client(&self) -> Result<&ShardedClient<GrpcClient>, ClusterError> {
        self.clients
            .as_ref()
            .ok_or_else(|| ClusterError::Protocol("the coordinator is not connected".into()))
    }

    fn external_servers(&self) -> bool {
        !self.cfg.external_servers.is_empty()
    }

    fn spawn_server(&mut self, id: u32) -> Result<ServerProcess, ClusterError> {
        let me = crate::launcher::server_incarnation(id, self.generation[id as usize]);
        self.cfg.auth.fences.raise(me);
        let p = ServerProcess::spawn(
            &self.cfg.exe,
            &self.cfg.server_spec(id),
            &self.cfg.work_dir,
            self.generation[id as usize],
            self.cfg.start_timeout,
        )?;
        self.pids.push(p.pid());
        self.addrs.push(p.addr.to_string());
        Ok(p)
    }

    /// Start (or reach) the servers, connect, start the workers.
    fn start_all(&mut self) -> Result<(), ClusterError> {
        if self.external_servers() {
            self.reach_outside_servers()?;
        } else {
            for id in 0..self.cfg.servers {
                let p = self.spawn_server(id)?;
                self.server_addrs.push(p.addr.into());
                self.procs.push(p);
            }
        }
        let addrs = self.server_addrs.clone();
        self.clients = Some(self.rt.block_on(connect_all(&addrs, &self.cfg.auth))?);
        // Servers started elsewhere must hold the tables this job trains (the data's sizes on
        // TSV data: `ftrec server --table-rows`).
        if let Some(info) = self
            .client()?
            .infos()
            .iter()
            .find(|i| i.table_rows != self.cfg.preset.table_rows)
        {
            return Err(ClusterError::Config(format!(
                "server {} holds tables of {:?} rows, this job trains {:?} (start it with \
                 --table-rows {})",
                info.server.0,
                info.table_rows,
                self.cfg.preset.table_rows,
                self.cfg
                    .preset
                    .table_rows
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        self.connect_store_clients()?;
        self.ec_connect()?;
        self.update_heartbeat();
        self.event(
            EventKind::ServersStarted,
            None,
            format!("{} servers at {addrs:?}", addrs.len()),
        );
        for w in 0..self.workers() {
            self.start_worker(w)?;
        }
        self.event(
            EventKind::WorkersStarted,
            None,
            format!(
                "{} workers on control socket {}",
                self.workers(),
                self.pool.addr()
            ),
        );
        Ok(())
    }

    /// Start (or wait for) worker `w`, set it up and connect it to the servers.
    fn start_worker(&mut self, w: u32) -> Result<(), ClusterError> {
        if self.cfg.external_workers {
            self.pool.wait_joined(w, self.cfg.start_timeout)?;
        } else {
            self.pool.spawn(w, self.cfg.start_timeout)?;
        }
        let ec = self.ec_worker(w);
        let data = self.cfg.data.as_ref().zip(self.plan.as_ref());
        let setup = WorkerSetup::of_run(&self.cfg, (w, self.workers()), STEP_TIMEOUT, ec, data)?;
        self.ask_one(w, ToWorker::Setup(Box::new(setup)))?;
        self.ask_one(w, self.connect_cmd())?;
        Ok(())
    }

    /// The open failure record of `role` `id`, marked detected now (a new one if the loss
    /// was not injected).
    fn detected(&mut self, role: Role, id: u32, by: &str) -> usize {
        let now = self.now();
        let step = self.step();
        let i = match self
            .failures
            .iter()
            .position(|f| f.role == role && f.id == id && f.detected_s.is_none())
        {
            Some(i) => i,
            None => {
                self.failures.push(FailureReport::lost(role, id, step, now));
                self.failures.len() - 1
            }
        };
        let f = &mut self.failures[i];
        f.detected_s = Some(now - f.injected_t_s);
        f.detected_by = Some(by.to_string());
        self.event(
            EventKind::FailureDetected,
            (role == Role::Server).then_some(id),
            format!("{role} {id} by {by}"),
        );
        i
    }

    /// Mark the failures waiting for training to catch up as recovered.
    fn note_progress(&mut self) {
        let now = self.now();
        self.note_progress_at(now);
    }

    /// [`Self::note_progress`] at `now` seconds into the run.
    fn note_progress_at(&mut self, now: f64) {
        let batches = self.batches;
        let mut done = Vec::new();
        self.recover_at.retain(|&(i, target)| {
            if batches >= target {
                done.push(i);
                false
            } else {
                true
            }
        });
        for i in done {
            let f = &mut self.failures[i];
            if f.recovered_s.is_none() {
                f.recovered_s = Some(now - f.injected_t_s);
                let detail = format!(
                    "{} {} back at step {}",
                    f.role,
                    f.id,
                    batches / self.cfg.workers as u64
                );
                self.event(EventKind::RecoveryComplete, None, detail);
            }
        }
    }

    // ---- training ----

    /// One batch applied: bookkeeping, and the strategy's reaction when it completes a step
    /// (with that step's number).
    fn count_batch(&mut self, loss: f64) -> Option<(u64, Vec<Action>)> {
        self.batches += 1;
        self.meter_batch();
        self.last_loss = loss;
        let t = self.train_start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        self.completions.push(t);
        self.note_progress();
        if !self.batches.is_multiple_of(self.workers() as u64) && !self.at_data_end() {
            return None;
        }
        let step = self.step();
        let now_s = self.now();
        self.timeline.push(StepPoint {
            step,
            t_s: now_s,
            loss,
        });
        self.meter_step(step, now_s);
        let actions = self.strategy.on(&Event::StepDone { step, now_s });
        Some((step, actions))
    }

    /// A batch handed out at `handed_out` was answered now.
    fn note_span(&mut self, handed_out: Instant) {
        if let Some(t0) = self.train_start {
            let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
            self.spans.push((secs(handed_out), secs(Instant::now())));
        }
    }

    /// One batch applied, in synchronous mode: the strategy's actions run at once, then the
    /// kills scheduled after this step. `Ok(false)`: the run ended.
    fn batch_done(&mut self, loss: f64) -> Result<bool, ClusterError> {
        if let Some((step, actions)) = self.count_batch(loss) {
            if !self.execute(actions)? {
                return Ok(false);
            }
            self.fire_step_kills(step);
        }
        Ok(true)
    }

    fn train_sync(&mut self) -> Result<(), ClusterError> {
        self.train_start = Some(Instant::now());
        let live: Vec<u32> = self.live_pids().iter().map(|p| p.0).collect();
        self.cpu.open_window(&live);
        let mut unexplained = 0;
        while self.batch_exists(self.batches + 1)? {
            let done = self.poll_store(false);
            if !self.execute(done)? {
                return Ok(());
            }
            self.fire_time_kills();
            if let Some(go_on) = self.ec_between_steps()? {
                if !go_on {
                    return Ok(());
                }
                continue;
            }
            let lost = self.confirmed_heartbeat_losses();
            if !lost.is_empty() {
                if !self.handle_server_losses(lost, "heartbeat")? {
                    return Ok(());
                }
                continue;
            }
            let step = self.step() + 1;
            self.seq += 1;
            let handed_out = Instant::now();
            match self.sync_step(step, self.seq) {
                Ok((loss, count)) => {
                    unexplained = 0;
                    for _ in 0..count {
                        self.note_span(handed_out);
                    }
                    // One step is `workers` batches (the last step of TSV data may have
                    // fewer); the strategy hears of it with the last.
                    let t = self.train_start.map_or(0.0, |s| s.elapsed().as_secs_f64());
                    for _ in 1..count {
                        self.batches += 1;
                        self.meter_batch();
                        self.completions.push(t);
                    }
                    if !self.batch_done(loss)? {
                        return Ok(());
                    }
                }
                Err(Failure::BadData(e)) => return Err(e),
                Err(failure) => {
                    self.abort_staged(self.seq);
                    if !self.handle_failure(failure, step, &mut unexplained)? {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// One synchronous step: every worker trains on its batch and stages it as `seq`, then the
    /// coordinator commits it in worker order; returns the mean loss and the batches of the
    /// step. At the end of TSV data the last step has a batch for the first workers only (the
    /// others sit it out), committed in worker order like any other.
    fn sync_step(&mut self, step: u64, seq: u64) -> Result<(f64, u64), Failure> {
        let m = self.workers() as u64;
        let mut waiting: BTreeMap<u32, u64> = BTreeMap::new();
        let mut lost = Vec::new();
        let mut rpc_error = None;
        let mut order: Vec<u32> = Vec::new();
        for w in 0..self.workers() {
            let index = (step - 1) * m + w as u64 + 1;
            let cmd = match self.batch_exists(index) {
                Ok(false) => break,
                Ok(true) => self.batch_cmd(index, Some(seq), Vec::new()),
                Err(e) => Err(e),
            }
            .map_err(Failure::BadData)?;
            order.push(w);
            match self.pool.send(w, &cmd) {
                Ok(()) => {
                    waiting.insert(w, index);
                }
                Err(_) => lost.push(w),
            }
        }
        let mut loss = 0.0;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Silent workers are treated as lost: they are killed and replaced.
                lost.extend(waiting.keys());
                break;
            }
            // Wake at every heartbeat: a paused server fails no RPC, its heartbeats do.
            let event = self.pool.next(left.min(self.cfg.heartbeat.max(MIN_TICK)));
            if event.is_none() {
                self.fence_silent_servers();
            }
            match event {
                Some(PoolEvent::Msg {
                    worker,
                    msg:
                        FromWorker::Done {
                            index,
                            loss: l,
                            timing,
                        },
                }) if waiting.get(&worker) == Some(&index) => {
                    waiting.remove(&worker);
                    self.worker_time.add(&timing);
                    loss += l;
                }
                Some(PoolEvent::Msg {
                    worker,
                    msg: FromWorker::Failed { index, error },
                }) if index.is_some() && waiting.get(&worker) == index.as_ref() => {
                    waiting.remove(&worker);
                    rpc_error.get_or_insert(format!("worker {worker}: {error}"));
                }
                Some(PoolEvent::Msg {
                    worker,
                    msg: FromWorker::BadData { index, error },
                }) if waiting.get(&worker) == Some(&index) => {
                    return Err(Failure::BadData(bad_data(index, worker, error)));
                }
                Some(PoolEvent::Lost { worker, reason }) => {
                    waiting.remove(&worker);
                    lost.push(worker);
                    rpc_error.get_or_insert(format!("worker {worker} lost: {reason}"));
                }
                _ => {}
            }
        }
        if !lost.is_empty() {
            lost.sort_unstable();
            lost.dedup();
            return Err(Failure::Workers(
                lost,
                rpc_error.unwrap_or_else(|| "no answer".into()),
            ));
        }
        if let Some(e) = rpc_error {
            return Err(Failure::Rpc("worker_rpc", e));
        }
        let count = order.len() as u64;
        if self.ec.is_some() {
            self.ec_commit(step, seq, &order)?;
            return Ok((loss / count as f64, count));
        }
        let client = self
            .client()
            .map_err(|e| Failure::Rpc("commit_rpc", e.to_string()))?;
        let timeout = self.cfg.heartbeat_timeout.max(Duration::from_secs(10));
        self.rt
            .block_on(async {
                tokio::time::timeout(timeout, client.commit_step(seq, &order)).await
            })
            .map_err(|_| Failure::Rpc("commit_rpc", format!("committing step {step} timed out")))?
            .map_err(|e| Failure::Rpc("commit_rpc", e.to_string()))?;
        Ok((loss / count as f64, count))
    }

    /// Drop what was staged for `seq` where possible.
    fn abort_staged(&mut self, seq: u64) {
        if let Ok(c) = self.client() {
            let _ = self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), c.abort_step(seq)).await
            });
        }
    }

    /// React to a failed step or batch. `Ok(false)`: the run ended.
    fn handle_failure(
        &mut self,
        failure: Failure,
        step: u64,
        unexplained: &mut u32,
    ) -> Result<bool, ClusterError> {
        match failure {
            Failure::BadData(e) => Err(e),
            Failure::Workers(ws, reason) => {
                for w in ws {
                    self.ec_worker_lost(w)?;
                    self.replace_worker(w, &reason)?;
                }
                // A server may have died too (a worker's RPC error can be both).
                let lost = self.probe_lost();
                if !lost.is_empty() {
                    return self.handle_server_losses(lost, "worker_rpc");
                }
                Ok(true)
            }
            Failure::Rpc(by, reason) => {
                let lost = self.probe_lost();
                if lost.is_empty() {
                    *unexplained += 1;
                    if *unexplained >= MAX_UNEXPLAINED_FAILURES {
                        return Err(ClusterError::StepFailed { step, reason });
                    }
                    return Ok(true);
                }
                *unexplained = 0;
                self.handle_server_losses(lost, by)
            }
        }
    }

    /// Replace lost worker `w`: it holds no state, so a new process with its id is set up,
    /// connected, and training goes on.
    fn replace_worker(&mut self, w: u32, reason: &str) -> Result<(), ClusterError> {
        let i = self.detected(Role::Worker, w, "control");
        if let Some(e) = self.events.last_mut() {
            e.detail = format!("{}: {reason}", e.detail);
        }
        self.pool.kill(w);
        let t0 = Instant::now();
        self.start_worker(w)
            .map_err(|e| ClusterError::Recovery(format!("replacing worker {w}: {e}")))?;
        let now = self.now();
        let f = &mut self.failures[i];
        f.replaced_s = Some(now - f.injected_t_s);
        f.resumed_s = f.replaced_s;
        f.recovered_s = f.replaced_s;
        let pid = self.pool.pid(w).unwrap_or(0);
        self.announce_fences(&[]);
        self.event(
            EventKind::WorkerReplaced,
            None,
            format!(
                "worker {w}: pid {pid} after {:.3}s",
                t0.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// Tell the strategy about every lost server and carry out what it decides. `Ok(false)`:
    /// the strategy ended the run.
    fn handle_server_losses(&mut self, lost: Vec<u32>, by: &str) -> Result<bool, ClusterError> {
        if self.ec.is_some() {
            return self.ec_handle_losses(lost, by);
        }
        let gens_before = self.generation.clone();
        for server in lost {
            if self.generation[server as usize] != gens_before[server as usize] {
                // Replaced by the recovery of an earlier loss in this batch.
                continue;
            }
            self.detected(Role::Server, server, by);
            let actions = self.strategy.on(&Event::ServerLost {
                server: ServerId(server),
                now_s: self.now(),
            });
            if !self.execute(actions)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Carry out a strategy's actions. `Ok(false)`: the run was aborted.
    fn execute(&mut self, actions: Vec<Action>) -> Result<bool, ClusterError> {
        self.check_lease()?;
        for action in actions {
            match action {
                // Batches are handed out by the training loop, which has stopped before it
                // executes actions: pausing needs no message, only to be remembered (a save
                // while paused is waited for).
                Action::PauseTraining => self.paused = true,
                Action::ResumeTraining => {
                    self.paused = false;
                    let now = self.now();
                    let mut resumed = false;
                    for f in self.failures.iter_mut().filter(|f| {
                        f.role == Role::Server && f.detected_s.is_some() && f.resumed_s.is_none()
                    }) {
                        f.resumed_s = Some(now - f.injected_t_s);
                        resumed = true;
                    }
                    if resumed {
                        self.event(
                            EventKind::TrainingResumed,
                            None,
                            format!("from step {}", self.step()),
                        );
                        // A failure with nothing to redo is recovered the moment it resumes.
                        self.note_progress_at(now);
                    }
                }
                Action::SaveFull { step } => {
                    let next = self.store_save(CheckpointKind::Full, step);
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::SaveDelta { step } => {
                    let next = self.store_save(CheckpointKind::Delta, step);
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::SavePiece { step, layout } => {
                    let next = self.store_save_piece(layout, step);
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::AwaitSave => {
                    let next = self.wait_for_save();
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::RestoreAll { checkpoint } => {
                    self.restore(checkpoint)?;
                    let next = self.strategy.on(&Event::RestoreFinished {
                        step: self.step(),
                        now_s: self.now(),
                    });
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::SavePartial { step } => {
                    let next = self.store_save_prioritized(step);
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::RestorePartial {
                    servers,
                    checkpoint,
                } => {
                    let ids: Vec<u32> = servers.iter().map(|s| s.0).collect();
                    let mut others = self.restore_partial(&ids, checkpoint)?;
                    let next = self.strategy.on(&Event::RestoreFinished {
                        step: self.step(),
                        now_s: self.now(),
                    });
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                    // Servers lost meanwhile that were not part of this recovery (replaced
                    // during it, or lost since).
                    for s in self.probe_lost() {
                        if !others.contains(&s) {
                            others.push(s);
                        }
                    }
                    if !others.is_empty() && !self.handle_server_losses(others, "recovery")? {
                        return Ok(false);
                    }
                }
                Action::Rebuild { server } => {
                    if !self.ec_rebuild(&[], &[server.0])? {
                        return Ok(false);
                    }
                }
                Action::Abort { reason } => {
                    self.event(EventKind::Aborted, None, reason.clone());
                    self.aborted = Some(reason);
                    return Ok(false);
                }
                other => {
                    return Err(ClusterError::Protocol(format!(
                        "strategy {} asked for {other:?}, which this coordinator cannot carry out",
                        self.strategy.name()
                    )))
                }
            }
        }
        // Paused with a save in flight: training waits for its commit, and the strategy's
        // reaction to it says what comes next (typically resume).
        while self.paused && self.save_in_flight() {
            let next = self.wait_for_save();
            if !self.execute(next)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Replace lost server `id`: start a new process (or, for a server started elsewhere, wait
    /// until its address answers again).
    fn replace_server(&mut self, id: u32) -> Result<(), ClusterError> {
        self.generation[id as usize] += 1;
        self.end_incarnation(id, self.generation[id as usize] - 1);
        if self.external_servers() {
            return self.await_return(id);
        }
        let p = self.spawn_server(id)?;
        let detail = format!("pid {} at {}", p.pid(), p.addr);
        self.server_addrs[id as usize] = p.addr.into();
        self.procs[id as usize] = p;
        self.event(EventKind::ServerReplaced, Some(id), detail);
        self.announce_fences(&[id]);
        Ok(())
    }

    /// Full recovery: replace every lost server, load `checkpoint` (or the initial state) into
    /// every server, rewind to its position, reconnect everyone (CPR §2.2). A server lost
    /// during the recovery is replaced and the recovery starts over.
    fn restore(&mut self, checkpoint: Option<CheckpointRef>) -> Result<(), ClusterError> {
        self.event(
            EventKind::RecoveryStart,
            None,
            match &checkpoint {
                Some(c) => format!("from {} (step {})", c.id, c.step),
                None => "from the initial state (no checkpoint committed)".into(),
            },
        );
        let before = self.batches;
        self.store_quiesce();
        let rec = |e: ClusterError| ClusterError::Recovery(e.to_string());
        let restored = loop {
            self.count_recovery()?;
            self.clients = None;
            for id in self.probe_lost() {
                if !self.failures.iter().any(|f| {
                    f.role == Role::Server
                        && f.id == id
                        && f.detected_s.is_some()
                        && f.resumed_s.is_none()
                }) {
                    // Lost during the recovery itself (a kill injected then is detected here).
                    self.detected(Role::Server, id, "recovery");
                }
                self.replace_server(id).map_err(rec)?;
            }
            let now = self.now();
            for f in self
                .failures
                .iter_mut()
                .filter(|f| f.role == Role::Server && f.replaced_s.is_none())
            {
                f.replaced_s = Some(now - f.injected_t_s);
            }
            self.update_heartbeat();
            self.fire_phase_kills(Phase::Recovery);
            match self.load(&checkpoint) {
                Ok(batches) => break batches,
                Err(e) => {
                    if self.probe_lost().is_empty() {
                        return Err(rec(e));
                    }
                    // Another server died while loading: replace it and load again.
                }
            }
        };
        let redone = before.saturating_sub(restored);
        let m = self.workers() as u64;
        // The failures this recovery ends: those not resumed yet, and with ECRec those whose
        // rebuild the restore superseded.
        let ec = self.ec.is_some();
        let open: Vec<usize> = (0..self.failures.len())
            .filter(|&i| {
                let f = &self.failures[i];
                f.role == Role::Server && (f.resumed_s.is_none() || (ec && f.recovered_s.is_none()))
            })
            .collect();
        for &i in &open {
            self.failures[i].steps_redone += redone / m;
            self.recover_at.push((i, before));
        }
        let redone_samples = self.samples_in(before) - self.samples_in(restored.min(before));
        self.samples_redone += redone_samples;
        self.batches = restored;
        self.rewinds += 1;
        self.rewound_to = restored;
        for &i in &open {
            self.failures[i].servers_restored = (0..self.cfg.servers).collect();
        }
        self.reconnect_workers().map_err(rec)?;
        // Reports about servers that have since been replaced are stale.
        let _ = self.heartbeat_losses();
        Ok(())
    }

    /// Held-out AUC and logloss of the servers' model.
    fn evaluate(&mut self) -> Result<(Option<f64>, Option<f64>, usize), ClusterError> {
        if self.cfg.eval_samples == 0 {
            return Ok((None, None, 0));
        }
        let batch = self.cfg.batch.min(8192);
        // TSV data: the held-out lines (`--holdout-every`), as `ftrec train` evaluates.
        let eval = match &self.cfg.data {
            Some(tsv) => {
                ftrec_data::TsvReader::open(tsv.clone())?.eval_set(self.cfg.eval_samples, batch)?
            }
            None => SyntheticSource::from_preset(&self.cfg.preset, self.cfg.seed)?
                .eval_set(self.cfg.eval_samples, batch)?,
        };
        let mut compute = Compute::new(&self.cfg.preset, self.cfg.seed, batch, self.cfg.threads)?;
        let client = self.client()?;
        let mut probs = Vec::new();
        let mut labels = Vec::new();
        let mut out = Vec::new();
        for b in &eval.batches {
            self.rt.block_on(compute.predict(client, b, &mut out))?;
            probs.extend_from_slice(&out);
            labels.extend_from_slice(&b.labels);
        }
        // A held-out set with one class has no AUC; report none rather than fail the run.
        let auc = ftrec_model::auc(&probs, &labels).ok();
        let logloss = ftrec_model::logloss(&probs, &labels).ok();
        Ok((auc, logloss, probs.len()))
    }

    /// What the report says of the TSV data (none on synthetic data).
    fn data_report(&mut self) -> Option<crate::report::DataReport> {
        let batches = self.batches;
        let ended = self.at_data_end();
        let plan = self.plan.as_mut()?;
        let (position, samples) = plan.after(batches).ok()?;
        Some(crate::report::DataReport {
            files: plan.files().len(),
            batches,
            samples,
            position,
            ended,
            malformed_skipped: plan.malformed_skipped(),
        })
    }

    /// Stop everything and build the report.
    fn finish(mut self, result: Result<(), ClusterError>) -> Result<RunReport, ClusterError> {
        let train_s = self.train_start.map_or(0.0, |t| {
            self.train_end
                .unwrap_or_else(Instant::now)
                .duration_since(t)
                .as_secs_f64()
        });
        let mut outcome = result;
        let mut digest = String::new();
        let (mut auc, mut logloss, mut eval_samples) = (None, None, 0);
        if outcome.is_ok() && self.aborted.is_none() {
            // The last save commits and the merger ends before the servers stop.
            if let Err(e) = self.store_finish() {
                outcome = Err(e);
            }
        }
        if outcome.is_ok() && self.aborted.is_none() {
            let d = self
                .client()
                .and_then(|c| self.rt.block_on(c.digest()).map_err(ClusterError::from));
            match d.and_then(|d| Ok((d, self.evaluate()?))) {
                Ok((d, (a, l, n))) => {
                    digest = d.hex();
                    (auc, logloss, eval_samples) = (a, l, n);
                }
                Err(e) => outcome = Err(e),
            }
        }
        for w in 0..self.workers() {
            if let Some(pid) = self.pool.pid(w).filter(|_| self.pool.is_connected(w)) {
                self.cpu.add(pid, false);
            }
        }
        for p in &mut self.procs {
            if !p.has_exited() {
                self.cpu.add(p.pid(), true);
            }
        }
        self.pool.stop_all(STOP_GRACE);
        self.clients = None;
        for p in &mut self.procs {
            p.stop(STOP_GRACE);
        }
        let server_memory = self.procs.iter().filter_map(|p| p.memory()).collect();
        self.procs.clear();
        self.release_lease();
        outcome?;
        let samples = self.samples_in(self.batches);
        let data = self.data_report();
        // A resumed run trained the batches after its checkpoint.
        let resumed_batches = self.resumed.as_ref().map_or(0, |r| r.batches);
        let trained = samples - self.samples_in(resumed_batches);
        let mut overheads = Overheads {
            // Eq. 1 counts the saves that protect training, not the save of its result.
            o_save: self.pause_s - self.final_save_s,
            ..Overheads::default()
        };
        for f in self.failures.iter().filter(|f| f.role == Role::Server) {
            overheads.o_res += f.replaced_s.unwrap_or(0.0);
            overheads.o_load += f.reload_s().unwrap_or(0.0);
            overheads.o_lost += f.redo_s().unwrap_or(0.0);
        }
        let throughput = intervals(
            &self.completions,
            self.cfg.batch as u64,
            self.cfg.report_interval_s,
        );
        let worker_pids = self.pool.pids.clone();
        let store = self.store_report();
        let failed_saves: Vec<&TimedEvent> = self
            .events
            .iter()
            .filter(|e| e.kind == EventKind::CheckpointFailed)
            .collect();
        let checkpoints_failed = failed_saves.len() as u64;
        let kills = self.kill_outcomes();
        let checkpoint_failures = failed_saves
            .iter()
            .take(crate::report::MAX_FAILURE_REASONS)
            .map(|e| e.detail.clone())
            .collect();
        Ok(RunReport {
            job_id: self.cfg.auth.job_name(),
            strategy: self.strategy.name().to_string(),
            steps: self.step(),
            samples,
            samples_redone: self.samples_redone,
            wall_s: self.start.elapsed().as_secs_f64(),
            train_s,
            samples_trained: trained,
            samples_per_s: crate::report::samples_per_s(trained, train_s),
            train_loss: self.last_loss,
            events: self.events,
            failures: self.failures,
            checkpoints: self.checkpoints,
            checkpoints_failed,
            checkpoint_failures,
            checkpoint_pause_s: self.pause_s,
            final_save_s: self.final_save_s,
            overheads,
            throughput,
            worker_time: self.worker_time,
            bytes_written: self.bytes_written,
            model_digest: digest,
            auc,
            logloss,
            eval_samples,
            aborted: self.aborted,
            server_pids: self.pids,
            worker_pids,
            server_addrs: self.addrs,
            timeline: self.timeline,
            store,
            config: self.cfg,
            ec: self.ec.map(|e| e.report),
            cpu: self.cpu.report(),
            server_memory,
            resumed: self.resumed,
            kills,
            cpr: match self.strategy.report() {
                Some(ftrec_strategy::StrategyReport::Cpr(c)) => Some(c),
                _ => None,
            },
            data,
        })
    }
}

//! The coordinator: launches the servers and workers, steps the workers in lockstep, detects
//! failures, runs the strategy and carries out its actions, and reports.
//!
//! Failure detection has two sources. Workers' RPC errors (and the coordinator's own commit
//! errors) say *that* something failed; the coordinator then finds *which* servers are lost:
//! a server whose process has exited, or that does not answer an `info` probe within the
//! heartbeat timeout. Independently, a heartbeat task probes every server periodically and
//! reports one that stays silent, which catches a server that dies or hangs between steps.
//!
//! Step numbers on the servers: the servers refuse to commit a step number twice, and full
//! recovery redoes steps, so every attempt to commit is staged under a fresh, increasing
//! sequence number (`seq`), distinct from the training step it computes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ftrec_core::ServerId;
use ftrec_data::{BatchSource, SyntheticSource};
use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::{PsService, ShardedClient};
use ftrec_strategy::{
    Action, CheckpointRef, Event, FullCheckpoint, Interval, NoFaultTolerance, Strategy,
};
use tokio::sync::{mpsc as tmpsc, watch};

use crate::image::{checkpoint_path, load_full, save_full, Manifest, ShardImage};
use crate::report::{EventKind, FailureReport, RunReport, StepPoint, TimedEvent};
use crate::worker::{
    connect_all, position_after, worker_loop, Compute, WorkerCmd, WorkerReply, WorkerSetup,
};
use crate::{build_server, ClusterError, RunConfig, ServerProcess, StrategyChoice};

/// Longest a worker may take for one step (pull, compute, stage) before the step fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Recoveries after which a run gives up (a replacement that keeps dying is not a fault the
/// strategies can fix).
const MAX_RECOVERIES: u32 = 16;
/// How long a stopping server may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Run a whole multi-process training job: start `cfg.servers` server processes and
/// `cfg.workers` worker threads, train `cfg.steps` steps under the configured strategy and
/// faults, evaluate, stop every process, and report. A run the strategy aborts (strategy
/// `none` after a loss) returns `Ok` with [`RunReport::aborted`] set; an error that is not a
/// server loss returns `Err`. Every started process is reaped before this returns.
pub fn run(cfg: &RunConfig) -> Result<RunReport, ClusterError> {
    cfg.validate()?;
    let start = Instant::now();
    for dir in [cfg.work_dir.clone(), cfg.ckpt_dir()] {
        std::fs::create_dir_all(&dir).map_err(|e| ClusterError::Io {
            what: format!("creating {}", dir.display()),
            source: e,
        })?;
    }
    ftrec_model::set_gemm_threads(cfg.threads)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
    };
    let (hb_targets, hb_rx) = watch::channel(Vec::new());
    let (lost_tx, lost_rx) = tmpsc::unbounded_channel();
    let (reply_tx, replies) = mpsc::channel();
    let mut c = Coordinator {
        cfg: cfg.clone(),
        rt,
        start,
        strategy,
        procs: Vec::new(),
        generation: vec![0; cfg.servers as usize],
        clients: None,
        workers: Vec::new(),
        reply_tx,
        replies,
        hb_targets,
        lost_rx,
        step: 0,
        seq: 0,
        train_start: None,
        events: Vec::new(),
        failures: Vec::new(),
        pids: Vec::new(),
        addrs: Vec::new(),
        checkpoints: 0,
        bytes_written: 0,
        pause_s: 0.0,
        samples_redone: 0,
        recoveries: 0,
        committed: None,
        aborted: None,
        last_loss: f64::NAN,
        timeline: Vec::new(),
    };
    c.rt.spawn(heartbeat(
        hb_rx,
        cfg.heartbeat,
        cfg.heartbeat_timeout,
        lost_tx,
    ));
    let result = c.start_all().and_then(|()| c.train());
    c.finish(result)
}

struct Coordinator {
    cfg: RunConfig,
    rt: tokio::runtime::Runtime,
    start: Instant,
    strategy: Box<dyn Strategy>,
    procs: Vec<ServerProcess>,
    generation: Vec<u32>,
    clients: Option<ShardedClient<GrpcClient>>,
    workers: Vec<(mpsc::Sender<WorkerCmd>, JoinHandle<()>)>,
    reply_tx: mpsc::Sender<WorkerReply>,
    replies: mpsc::Receiver<WorkerReply>,
    hb_targets: watch::Sender<Vec<(u32, SocketAddr)>>,
    lost_rx: tmpsc::UnboundedReceiver<(u32, u32, String)>,
    /// Steps applied to the servers' model.
    step: u64,
    seq: u64,
    train_start: Option<Instant>,
    events: Vec<TimedEvent>,
    failures: Vec<FailureReport>,
    pids: Vec<u32>,
    addrs: Vec<String>,
    checkpoints: u64,
    bytes_written: u64,
    pause_s: f64,
    samples_redone: u64,
    recoveries: u32,
    /// The newest committed checkpoint's id.
    committed: Option<String>,
    aborted: Option<String>,
    last_loss: f64,
    timeline: Vec<StepPoint>,
}

impl Coordinator {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn event(&mut self, kind: EventKind, server: Option<u32>, detail: String) {
        self.events.push(TimedEvent {
            t_s: self.now(),
            kind,
            step: self.step,
            server,
            detail,
        });
    }

    fn client(&self) -> Result<&ShardedClient<GrpcClient>, ClusterError> {
        self.clients
            .as_ref()
            .ok_or_else(|| ClusterError::Protocol("the coordinator is not connected".into()))
    }

    fn server_addrs(&self) -> Vec<SocketAddr> {
        self.procs.iter().map(|p| p.addr).collect()
    }

    fn spawn_server(&mut self, id: u32) -> Result<ServerProcess, ClusterError> {
        let p = ServerProcess::spawn(
            &self.cfg.server_exe,
            &self.cfg.server_spec(id),
            &self.cfg.work_dir,
            self.generation[id as usize],
            self.cfg.start_timeout,
        )?;
        self.pids.push(p.pid());
        self.addrs.push(p.addr.to_string());
        Ok(p)
    }

    /// Start the servers, connect, start the workers.
    fn start_all(&mut self) -> Result<(), ClusterError> {
        for id in 0..self.cfg.servers {
            let p = self.spawn_server(id)?;
            self.procs.push(p);
        }
        let addrs = self.server_addrs();
        self.clients = Some(self.rt.block_on(connect_all(&addrs))?);
        self.update_heartbeat();
        self.event(
            EventKind::ServersStarted,
            None,
            format!("{} servers at {addrs:?}", addrs.len()),
        );
        for w in 0..self.cfg.workers {
            let setup = WorkerSetup {
                id: w,
                workers: self.cfg.workers,
                preset: self.cfg.preset.clone(),
                seed: self.cfg.seed,
                batch: self.cfg.batch,
                threads: self.cfg.threads,
                sync: self.cfg.sync,
                rpc_timeout: STEP_TIMEOUT,
            };
            let (tx, rx) = mpsc::channel();
            let replies = self.reply_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ftrec-worker-{w}"))
                .spawn(move || worker_loop(setup, rx, replies))
                .map_err(|e| ClusterError::Io {
                    what: format!("starting worker thread {w}"),
                    source: e,
                })?;
            self.workers.push((tx, handle));
        }
        self.connect_workers()
    }

    fn update_heartbeat(&mut self) {
        let targets = self
            .procs
            .iter()
            .map(|p| (self.generation[p.id as usize], p.addr))
            .collect();
        let _ = self.hb_targets.send(targets);
    }

    /// Send every worker `cmd(w)` and collect one reply from each; the first error, if any.
    fn all_workers(&mut self, cmd: impl Fn(u32) -> WorkerCmd) -> Result<f64, ClusterError> {
        for (w, (tx, _)) in self.workers.iter().enumerate() {
            tx.send(cmd(w as u32))
                .map_err(|_| ClusterError::Protocol(format!("worker {w} has stopped")))?;
        }
        let mut first_err = None;
        let mut loss = 0.0;
        for _ in 0..self.workers.len() {
            let r = self
                .replies
                .recv_timeout(STEP_TIMEOUT + Duration::from_secs(5))
                .map_err(|_| ClusterError::Timeout("waiting for the workers".into()))?;
            match r.result {
                Ok(l) => loss += l,
                Err(e) => {
                    first_err.get_or_insert((r.worker, e));
                }
            }
        }
        match first_err {
            None => Ok(loss / self.workers.len().max(1) as f64),
            Some((w, e)) => Err(ClusterError::StepFailed {
                step: self.step + 1,
                reason: format!("worker {w}: {e}"),
            }),
        }
    }

    fn connect_workers(&mut self) -> Result<(), ClusterError> {
        let addrs = self.server_addrs();
        self.all_workers(|_| WorkerCmd::Connect(addrs.clone()))
            .map(|_| ())
    }

    /// One step: every worker computes and stages (or pushes), then the coordinator commits in
    /// worker order. `Err` carries how the failure showed.
    fn run_step(&mut self, step: u64, seq: u64) -> Result<f64, (&'static str, String)> {
        let loss = self
            .all_workers(|_| WorkerCmd::Step { step, seq })
            .map_err(|e| ("worker_rpc", e.to_string()))?;
        if self.cfg.sync {
            let order: Vec<u32> = (0..self.cfg.workers).collect();
            let client = self.client().map_err(|e| ("commit_rpc", e.to_string()))?;
            let timeout = self.cfg.heartbeat_timeout.max(Duration::from_secs(10));
            self.rt
                .block_on(async {
                    tokio::time::timeout(timeout, client.commit_step(seq, &order)).await
                })
                .map_err(|_| ("commit_rpc", format!("committing step {step} timed out")))?
                .map_err(|e| ("commit_rpc", e.to_string()))?;
        }
        Ok(loss)
    }

    /// Servers that are lost now: exited, or silent for the heartbeat timeout.
    fn probe_lost(&mut self) -> Vec<u32> {
        let mut lost = Vec::new();
        let timeout = self.cfg.heartbeat_timeout;
        for i in 0..self.procs.len() {
            if self.procs[i].has_exited() {
                lost.push(i as u32);
                continue;
            }
            let addr = self.procs[i].addr;
            let alive = self.rt.block_on(async {
                tokio::time::timeout(timeout, async {
                    let c = GrpcClient::connect(addr, GrpcConfig::default()).await?;
                    c.info().await
                })
                .await
            });
            if !matches!(alive, Ok(Ok(info)) if info.server == ServerId(i as u32)) {
                lost.push(i as u32);
            }
        }
        lost
    }

    /// Losses the heartbeat task reported for the servers' current generations.
    fn heartbeat_losses(&mut self) -> Vec<u32> {
        let mut lost = Vec::new();
        while let Ok((server, generation, _)) = self.lost_rx.try_recv() {
            if self.generation.get(server as usize) == Some(&generation) && !lost.contains(&server)
            {
                lost.push(server);
            }
        }
        lost
    }

    fn train(&mut self) -> Result<(), ClusterError> {
        self.train_start = Some(Instant::now());
        let mut fired = vec![false; self.cfg.kills.len()];
        while self.step < self.cfg.steps {
            let hb = self.heartbeat_losses();
            if !hb.is_empty() {
                // Confirm: a probe that times out once may be a slow server.
                let lost: Vec<u32> = self
                    .probe_lost()
                    .into_iter()
                    .filter(|s| hb.contains(s))
                    .collect();
                if !lost.is_empty() && !self.handle_losses(lost, "heartbeat")? {
                    return Ok(());
                }
                continue;
            }
            let step = self.step + 1;
            self.seq += 1;
            match self.run_step(step, self.seq) {
                Ok(loss) => {
                    self.step = step;
                    self.last_loss = loss;
                    let t_s = self.now();
                    self.timeline.push(StepPoint { step, t_s, loss });
                    let actions = self.strategy.on(&Event::StepDone { step, now_s: t_s });
                    if !self.execute(actions)? {
                        return Ok(());
                    }
                    for (k, done) in self.cfg.kills.clone().iter().zip(&mut fired) {
                        if k.step == step && !*done {
                            *done = true;
                            self.inject_kill(k.server);
                        }
                    }
                }
                Err((by, reason)) => {
                    // Contributions staged for the failed attempt are dropped where possible.
                    if let Ok(c) = self.client() {
                        let seq = self.seq;
                        let _ = self.rt.block_on(async {
                            tokio::time::timeout(Duration::from_secs(2), c.abort_step(seq)).await
                        });
                    }
                    let lost = self.probe_lost();
                    if lost.is_empty() {
                        return Err(ClusterError::StepFailed { step, reason });
                    }
                    if !self.handle_losses(lost, by)? {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    fn inject_kill(&mut self, server: u32) {
        let Some(p) = self.procs.get_mut(server as usize) else {
            return;
        };
        let pid = p.pid();
        p.kill();
        let t = self.now();
        self.failures.push(FailureReport {
            server,
            step: self.step,
            injected_t_s: t,
            detected_s: None,
            resumed_s: None,
            steps_redone: 0,
            detected_by: None,
        });
        self.event(
            EventKind::FailureInjected,
            Some(server),
            format!("SIGKILL to pid {pid}"),
        );
    }

    /// Tell the strategy about every lost server and carry out what it decides. `Ok(false)`:
    /// the strategy ended the run.
    fn handle_losses(&mut self, lost: Vec<u32>, by: &str) -> Result<bool, ClusterError> {
        let gens_before = self.generation.clone();
        for server in lost {
            if self.generation[server as usize] != gens_before[server as usize] {
                // Replaced by the recovery of an earlier loss in this batch.
                continue;
            }
            let now = self.now();
            let open = self
                .failures
                .iter_mut()
                .find(|f| f.server == server && f.detected_s.is_none());
            match open {
                Some(f) => {
                    f.detected_s = Some(now - f.injected_t_s);
                    f.detected_by = Some(by.to_string());
                }
                None => self.failures.push(FailureReport {
                    server,
                    step: self.step,
                    injected_t_s: now,
                    detected_s: Some(0.0),
                    resumed_s: None,
                    steps_redone: 0,
                    detected_by: Some(by.to_string()),
                }),
            }
            self.event(EventKind::FailureDetected, Some(server), format!("by {by}"));
            let actions = self.strategy.on(&Event::ServerLost {
                server: ServerId(server),
                now_s: now,
            });
            if !self.execute(actions)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Carry out a strategy's actions. `Ok(false)`: the run was aborted.
    fn execute(&mut self, actions: Vec<Action>) -> Result<bool, ClusterError> {
        for action in actions {
            match action {
                // Steps are issued by this loop one at a time, so between two steps training
                // is already paused: pausing needs no message.
                Action::PauseTraining => {}
                Action::ResumeTraining => {
                    let now = self.now();
                    let mut resumed = false;
                    for f in self
                        .failures
                        .iter_mut()
                        .filter(|f| f.detected_s.is_some() && f.resumed_s.is_none())
                    {
                        f.resumed_s = Some(now - f.injected_t_s);
                        resumed = true;
                    }
                    if resumed {
                        self.event(
                            EventKind::TrainingResumed,
                            None,
                            format!("from step {}", self.step),
                        );
                    }
                }
                Action::SaveFull { step } => {
                    let next = self.save(step);
                    if !self.execute(next)? {
                        return Ok(false);
                    }
                }
                Action::RestoreAll { checkpoint } => {
                    self.restore(checkpoint)?;
                    let next = self.strategy.on(&Event::RestoreFinished {
                        step: self.step,
                        now_s: self.now(),
                    });
                    if !self.execute(next)? {
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
        Ok(true)
    }

    /// A full checkpoint at `step`; returns the strategy's reaction.
    fn save(&mut self, step: u64) -> Vec<Action> {
        self.event(EventKind::CheckpointStart, None, format!("step {step}"));
        let t0 = Instant::now();
        let manifest = Manifest {
            format: 1,
            step,
            servers: self.cfg.servers,
            preset: self.cfg.preset.name.clone(),
            seed: self.cfg.seed,
            positions: (0..self.cfg.workers)
                .map(|w| position_after(self.cfg.workers, w, self.cfg.batch, step))
                .collect(),
            files: Vec::new(),
        };
        let root = self.cfg.ckpt_dir();
        let result = match self.client() {
            Ok(c) => self.rt.block_on(save_full(c.servers(), &root, manifest)),
            Err(e) => Err(e),
        };
        let cost_s = t0.elapsed().as_secs_f64();
        self.pause_s += cost_s;
        match result {
            Ok(out) => {
                // Full recovery only ever restores the newest committed checkpoint, so the
                // older ones are dropped once a newer one is committed.
                if let Some(old) = self.committed.replace(out.id.clone()) {
                    let _ = std::fs::remove_dir_all(checkpoint_path(&root, &old));
                }
                self.checkpoints += 1;
                self.bytes_written += out.bytes;
                self.event(
                    EventKind::CheckpointEnd,
                    None,
                    format!("{} ({} bytes, {cost_s:.3}s)", out.id, out.bytes),
                );
                self.strategy.on(&Event::SaveFinished {
                    checkpoint: CheckpointRef { id: out.id, step },
                    cost_s,
                    bytes: out.bytes,
                })
            }
            Err(e) => {
                self.event(EventKind::CheckpointFailed, None, e.to_string());
                self.strategy.on(&Event::SaveFailed {
                    step,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Full recovery: replace every lost server, load `checkpoint` (or the initial state) into
    /// every server, rewind to its step, reconnect everyone (CPR §2.2).
    fn restore(&mut self, checkpoint: Option<CheckpointRef>) -> Result<(), ClusterError> {
        self.recoveries += 1;
        if self.recoveries > MAX_RECOVERIES {
            return Err(ClusterError::Recovery(format!(
                "gave up after {MAX_RECOVERIES} recoveries"
            )));
        }
        self.event(
            EventKind::RecoveryStart,
            None,
            match &checkpoint {
                Some(c) => format!("from {} (step {})", c.id, c.step),
                None => "from the initial state (no checkpoint committed)".into(),
            },
        );
        let rec = |e: ClusterError| ClusterError::Recovery(e.to_string());
        self.clients = None;
        for id in self.probe_lost() {
            self.procs[id as usize].kill();
            self.generation[id as usize] += 1;
            let p = self.spawn_server(id).map_err(rec)?;
            let detail = format!("pid {} at {}", p.pid(), p.addr);
            self.procs[id as usize] = p;
            self.event(EventKind::ServerReplaced, Some(id), detail);
        }
        let addrs = self.server_addrs();
        self.clients = Some(self.rt.block_on(connect_all(&addrs)).map_err(rec)?);
        self.update_heartbeat();
        let restored = match &checkpoint {
            Some(c) => {
                let root = self.cfg.ckpt_dir();
                let servers = self.client()?.servers().to_vec();
                self.rt
                    .block_on(load_full(&servers, &root, &c.id))
                    .map_err(rec)?
                    .step
            }
            None => {
                let servers = self.client()?.servers().to_vec();
                for (id, s) in servers.iter().enumerate() {
                    let image =
                        ShardImage::of_server(&build_server(&self.cfg.server_spec(id as u32))?)?;
                    self.rt.block_on(image.import(s)).map_err(rec)?;
                }
                0
            }
        };
        let redone = self.step.saturating_sub(restored);
        for f in self.failures.iter_mut().filter(|f| f.resumed_s.is_none()) {
            f.steps_redone += redone;
        }
        self.samples_redone += redone * self.cfg.workers as u64 * self.cfg.batch as u64;
        self.step = restored;
        self.connect_workers().map_err(rec)?;
        // Reports about servers that have since been replaced are stale.
        let _ = self.heartbeat_losses();
        Ok(())
    }

    /// Held-out AUC and logloss of the servers' model.
    fn evaluate(&mut self) -> Result<(Option<f64>, Option<f64>, usize), ClusterError> {
        if self.cfg.eval_samples == 0 {
            return Ok((None, None, 0));
        }
        let src = SyntheticSource::from_preset(&self.cfg.preset, self.cfg.seed)?;
        let batch = self.cfg.batch.min(8192);
        let eval = src.eval_set(self.cfg.eval_samples, batch)?;
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

    /// Stop everything and build the report.
    fn finish(mut self, result: Result<(), ClusterError>) -> Result<RunReport, ClusterError> {
        let train_s = self.train_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let mut outcome = result;
        let mut digest = String::new();
        let (mut auc, mut logloss, mut eval_samples) = (None, None, 0);
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
        for (tx, _) in &self.workers {
            let _ = tx.send(WorkerCmd::Stop);
        }
        for (_, h) in self.workers.drain(..) {
            let _ = h.join();
        }
        self.clients = None;
        for p in &mut self.procs {
            p.stop(STOP_GRACE);
        }
        self.procs.clear();
        outcome?;
        let samples = self.step * self.cfg.workers as u64 * self.cfg.batch as u64;
        Ok(RunReport {
            strategy: self.strategy.name().to_string(),
            steps: self.step,
            samples,
            samples_redone: self.samples_redone,
            wall_s: self.start.elapsed().as_secs_f64(),
            train_s,
            samples_per_s: samples as f64 / train_s.max(1e-9),
            train_loss: self.last_loss,
            events: self.events,
            failures: self.failures,
            checkpoints: self.checkpoints,
            checkpoint_pause_s: self.pause_s,
            bytes_written: self.bytes_written,
            model_digest: digest,
            auc,
            logloss,
            eval_samples,
            aborted: self.aborted,
            server_pids: self.pids,
            server_addrs: self.addrs,
            timeline: self.timeline,
            config: self.cfg,
        })
    }
}

/// Probe every server every `every`; report `(server, generation, reason)` once per silent
/// server generation. Ends when the coordinator drops its target list.
async fn heartbeat(
    mut targets: watch::Receiver<Vec<(u32, SocketAddr)>>,
    every: Duration,
    timeout: Duration,
    lost: tmpsc::UnboundedSender<(u32, u32, String)>,
) {
    let mut conns: HashMap<SocketAddr, GrpcClient> = HashMap::new();
    let mut reported: Vec<(u32, u32)> = Vec::new();
    loop {
        if targets.has_changed().is_err() {
            return;
        }
        let list = targets.borrow_and_update().clone();
        conns.retain(|a, _| list.iter().any(|(_, b)| a == b));
        for (i, &(generation, addr)) in list.iter().enumerate() {
            let key = (i as u32, generation);
            if reported.contains(&key) {
                continue;
            }
            let probe = tokio::time::timeout(timeout, async {
                let c = match conns.get(&addr) {
                    Some(c) => c.clone(),
                    None => GrpcClient::connect(addr, GrpcConfig::default()).await?,
                };
                c.info().await?;
                Ok::<_, ftrec_ps::PsError>(c)
            })
            .await;
            match probe {
                Ok(Ok(c)) => {
                    conns.insert(addr, c);
                }
                Ok(Err(e)) => {
                    reported.push(key);
                    conns.remove(&addr);
                    let _ = lost.send((key.0, generation, e.to_string()));
                }
                Err(_) => {
                    reported.push(key);
                    conns.remove(&addr);
                    let _ = lost.send((key.0, generation, "probe timed out".into()));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerSpec;
    use ftrec_core::Preset;
    use ftrec_ps::SharedServer;

    #[test]
    fn the_heartbeat_reports_a_server_that_stops_answering_once_per_generation() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let spec = ServerSpec::from_preset(&Preset::tiny(), 0, 1, 3).unwrap();
            let server = SharedServer::new(build_server(&spec).unwrap());
            let handle = ftrec_ps::grpc::serve(
                server,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                GrpcConfig::default(),
            )
            .await
            .unwrap();
            let addr = handle.local_addr();
            let (targets, rx) = watch::channel(vec![(4u32, addr)]);
            let (tx, mut lost) = tmpsc::unbounded_channel();
            let task = tokio::spawn(heartbeat(
                rx,
                Duration::from_millis(5),
                Duration::from_secs(2),
                tx,
            ));
            // Let it probe the live server at least once: nothing is reported.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(lost.try_recv().is_err());
            handle.shutdown().await.unwrap();
            let (server, generation, reason) = lost.recv().await.unwrap();
            assert_eq!((server, generation), (0, 4));
            assert!(!reason.is_empty());
            // Reported once: the next report would need a new generation.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(lost.try_recv().is_err());
            drop(targets);
            task.await.unwrap();
        });
    }
}

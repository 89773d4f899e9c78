//! The coordinator's side of strategy `ecrec` (ecrec.txt §3).
//!
//! - Start: every node learns every peer's address (`set_peers`).
//! - A step (ECRec §3.5): the workers stage their contributions under a fresh `seq` exactly as
//!   without ECRec; then phase 1 (`prepare`) runs on every node concurrently, then phase 2
//!   (`commit`) on every node. Without 2PC one `apply_step` per node does both. A failure in
//!   phase 1 aborts the step on the survivors: the loss is handled and the step is retried
//!   under a new `seq`. A failure in phase 2 cannot be undone (the survivors committed), and
//!   need not be: the parity and replica holders committed the lost owner's deltas, so its
//!   rebuild includes the step, which counts as done; the loss is handled before the next.
//! - A loss (ECRec §3.4): the strategy asks to rebuild every server lost at the moment. A dead
//!   one gets a new process started empty (`--ec-replacement`); every node learns the new
//!   addresses; each replacement copies its dense part and starts its background rebuild
//!   against the whole lost set (`start_rebuild(lost, background)`); the workers reconnect,
//!   and training resumes at once, with no rollback. Between steps the coordinator polls
//!   `rebuild_status` and tells the strategy when a rebuild finished or failed. Before the
//!   final digest it waits for every rebuild to finish.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use ftrec_core::ServerId;
use ftrec_ec::{Code, StripeLayout};
use ftrec_model::{Dlrm, DlrmConfig};
use ftrec_ps::ec::{audit_parities, EcGrpcClient, EcService, TxnId, TxnPhase};
use ftrec_ps::PsError;
use ftrec_strategy::{Action, EcRec, EcRecConfig, Event, RebuildPacer, Strategy};

use super::{Coordinator, Failure};
use crate::control::{ToWorker, TxnHold};
use crate::ecrec::{
    largest_shard_bytes, memory, AuditReport, EcReport, EcServerSpec, RebuildReport,
};
use crate::report::EventKind;
use crate::worker::{connect_all, EcWorker};
use crate::{ClusterError, KillAt, Phase, Role, RunConfig, ServerProcess};

/// Longest the end of a run waits for rebuilds still under way.
const FINISH_REBUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// How far back from a kill the throughput "before" it is measured.
pub(super) const BEFORE_WINDOW_S: f64 = 10.0;
/// Largest table slice one audit read may carry (the gRPC message limit is 16 MiB).
const AUDIT_READ_LIMIT: u64 = 8 << 20;

/// The coordinator's ECRec state.
pub(super) struct EcRun {
    spec: EcServerSpec,
    /// One client per server, in server order (replaced with the server).
    pub(super) clients: Vec<EcGrpcClient>,
    /// Rebuilds under way: (server, index of its entry in `report.rebuilds`).
    pub(super) rebuilding: Vec<(u32, usize)>,
    /// Servers whose phase 2 (or one-phase apply) failed, with the error: the step counted as
    /// done and the loss is handled before the next one.
    commit_failed: Vec<(u32, String)>,
    /// Training is over: rebuilds run at full speed (also those started from now on).
    pub(super) finishing: bool,
    /// The rebuild's pacer (`None`: a fixed share).
    pub(super) pacer: Option<RebuildPacer>,
    /// Asynchronous training: workers coordinate their own transactions.
    asynchronous: bool,
    /// Incarnation of each worker process (the transactions of a lost one are fenced by it).
    worker_epochs: Vec<u32>,
    /// Batches whose transaction was found committed (or committed) by a resolution, not yet
    /// told to the training loop: a batch among them that its worker never answered for must
    /// not be trained again.
    resolved_batches: Vec<u64>,
    pub(super) report: EcReport,
}

/// The pacer of strategy `strategy`'s rebuilds (`None` with a fixed share).
fn pacer(strategy: &crate::StrategyChoice) -> Result<Option<RebuildPacer>, ClusterError> {
    let crate::StrategyChoice::EcRec {
        rebuild_share_ppm,
        rebuild_min_throughput_ppm: Some(target),
        ..
    } = *strategy
    else {
        return Ok(None);
    };
    let start = crate::ecrec::rebuild_share_fraction(rebuild_share_ppm)
        .max(ftrec_strategy::pacer::MIN_SHARE);
    RebuildPacer::new(crate::ecrec::rebuild_share_fraction(target), start)
        .map(Some)
        .map_err(|e| ClusterError::Config(e.to_string()))
}

/// The `ecrec` state machine for `cfg`.
pub(super) fn strategy(cfg: &RunConfig) -> Result<Box<dyn Strategy>, ClusterError> {
    let spec = EcServerSpec::of_strategy(&cfg.strategy)
        .ok_or_else(|| ClusterError::Config("strategy ecrec expected".into()))?;
    let backstop_every_steps = match &cfg.strategy {
        crate::StrategyChoice::EcRec {
            backstop_every_steps,
            ..
        } => *backstop_every_steps,
        _ => None,
    };
    let machine = EcRec::new(EcRecConfig {
        servers: cfg.servers,
        k: spec.k,
        r: spec.r,
        backstop_every_steps,
    })
    .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok(Box::new(machine))
}

/// The servers whose result is an error, with it.
fn failed<T>(results: &[Result<T, String>]) -> Vec<(u32, String)> {
    results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| (i as u32, e.clone())))
        .collect()
}

fn describe(failed: &[(u32, String)]) -> String {
    failed
        .iter()
        .map(|(s, e)| format!("server {s}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Coordinator {
    pub(super) fn rpc_timeout(&self) -> Duration {
        self.cfg.heartbeat_timeout.max(Duration::from_secs(10))
    }

    /// Run `f` on every node's client concurrently; results in server order.
    fn ec_all<T, F, Fut>(&self, f: F) -> Vec<Result<T, String>>
    where
        F: Fn(EcGrpcClient) -> Fut,
        Fut: Future<Output = Result<T, PsError>> + Send + 'static,
        T: Send + 'static,
    {
        self.ec_range(0..usize::MAX, &f)
    }

    /// [`Coordinator::ec_all`] for one phase of a step: in two halves, with `some`'s kills
    /// fired between them, while such a kill is pending ([`Phase::PrepareSome`],
    /// [`Phase::CommitSome`]).
    fn ec_phase<T, F, Fut>(&mut self, some: Phase, f: F) -> Vec<Result<T, String>>
    where
        F: Fn(EcGrpcClient) -> Fut,
        Fut: Future<Output = Result<T, PsError>> + Send + 'static,
        T: Send + 'static,
    {
        let due =
            |at: &KillAt| matches!(at, KillAt::Phase(p) | KillAt::PhaseNth(p, _) if *p == some);
        if !self.pending_kills().any(|k| due(&k.at)) {
            return self.ec_all(f);
        }
        let h = TxnPhase::split_at(self.cfg.servers as usize);
        let mut out = self.ec_range(0..h, &f);
        self.fire_phase_kills(some);
        out.extend(self.ec_range(h..usize::MAX, &f));
        out
    }

    /// Run `f` on the clients of the servers in `range` (clipped to the cluster)
    /// concurrently; results in server order.
    fn ec_range<T, F, Fut>(&self, range: std::ops::Range<usize>, f: &F) -> Vec<Result<T, String>>
    where
        F: Fn(EcGrpcClient) -> Fut,
        Fut: Future<Output = Result<T, PsError>> + Send + 'static,
        T: Send + 'static,
    {
        let all = self
            .ec
            .as_ref()
            .map(|e| e.clients.as_slice())
            .unwrap_or_default();
        let range = range.start.min(all.len())..range.end.min(all.len());
        let clients = all[range].to_vec();
        let n = clients.len();
        let timeout = self.rpc_timeout();
        self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, c) in clients.into_iter().enumerate() {
                let fut = f(c);
                set.spawn(async move { (i, tokio::time::timeout(timeout, fut).await) });
            }
            let mut out: Vec<Option<Result<T, String>>> = (0..n).map(|_| None).collect();
            while let Some(joined) = set.join_next().await {
                if let Ok((i, r)) = joined {
                    out[i] = Some(match r {
                        Ok(r) => r.map_err(|e| e.to_string()),
                        Err(_) => Err(format!("no answer within {:.1}s", timeout.as_secs_f64())),
                    });
                }
            }
            out.into_iter()
                .map(|o| o.unwrap_or_else(|| Err("the call's task failed".into())))
                .collect()
        })
    }

    /// Strategy `ecrec`: set up the ECRec state once and tell every node its peers.
    pub(super) fn ec_connect(&mut self) -> Result<(), ClusterError> {
        let Some(spec) = EcServerSpec::of_strategy(&self.cfg.strategy) else {
            return Ok(());
        };
        if self.ec.is_none() {
            let dense_values = Dlrm::new(
                DlrmConfig::from_preset(&self.cfg.preset),
                self.cfg.seed,
                &self.cfg.dense_optimizer,
            )?
            .params()
            .len() as u64;
            let mem = memory(
                &self.cfg.preset,
                self.cfg.servers,
                &spec,
                &self.cfg.sparse_optimizer,
                &self.cfg.dense_optimizer,
                dense_values,
            )?;
            self.ec = Some(EcRun {
                spec,
                clients: Vec::new(),
                rebuilding: Vec::new(),
                commit_failed: Vec::new(),
                finishing: false,
                pacer: pacer(&self.cfg.strategy)?,
                asynchronous: !self.cfg.sync,
                worker_epochs: vec![0; self.cfg.workers as usize],
                resolved_batches: Vec::new(),
                report: EcReport::new(&spec, mem, !self.cfg.sync),
            });
        }
        self.ec_set_peers()
    }

    /// New clients for the current addresses; every node learns every address.
    fn ec_set_peers(&mut self) -> Result<(), ClusterError> {
        let addrs: Vec<String> = self.server_addrs.iter().map(|a| a.to_string()).collect();
        let clients = {
            let _rt = self.rt.enter();
            addrs
                .iter()
                .map(|a| EcGrpcClient::connect_lazy_with(a, &self.cfg.auth))
                .collect::<Result<Vec<_>, _>>()?
        };
        if let Some(ec) = self.ec.as_mut() {
            ec.clients = clients;
        }
        let bad = failed(&self.ec_all(move |c| {
            let addrs = addrs.clone();
            async move { c.set_peers(addrs).await }
        }));
        if !bad.is_empty() {
            return Err(ClusterError::Recovery(format!(
                "telling the servers their peers: {}",
                describe(&bad)
            )));
        }
        Ok(())
    }

    /// ECRec §4's second layer, before every server loads the backstop: every node told the
    /// current addresses, every rebuild stopped and every node's steps and transactions
    /// forgotten (their fences stay); the rebuilds under way end as superseded.
    pub(super) fn ec_before_restore(&mut self) -> Result<(), ClusterError> {
        self.ec_set_peers()?;
        let bad = failed(&self.ec_all(|c| async move { c.reset_for_restore().await }));
        if !bad.is_empty() {
            return Err(ClusterError::Recovery(format!(
                "resetting the servers for the restore: {}",
                describe(&bad)
            )));
        }
        if let Some(ec) = self.ec.as_mut() {
            for (_, i) in ec.rebuilding.drain(..) {
                let r = &mut ec.report.rebuilds[i];
                r.error
                    .get_or_insert_with(|| "superseded by a restore from the backstop".into());
            }
            ec.commit_failed.clear();
            ec.resolved_batches.clear();
        }
        Ok(())
    }

    /// After every server loaded the backstop: every node encodes the parities it holds from
    /// the restored rows and copies its dense replicas from their primaries.
    pub(super) fn ec_after_restore(&mut self) -> Result<(), ClusterError> {
        let results = self.ec_all(|c| async move { c.reencode().await });
        let bad = failed(&results);
        if !bad.is_empty() {
            return Err(ClusterError::Recovery(format!(
                "re-encoding the parities after the restore: {}",
                describe(&bad)
            )));
        }
        let (parities, replicas) = results
            .iter()
            .flatten()
            .fold((0, 0), |(p, r), x| (p + x.parities, r + x.replicas));
        self.event(
            EventKind::ServerRestored,
            None,
            format!(
                "parities re-encoded from the restored rows: {parities} parity rows, \
                 {replicas} dense replicas"
            ),
        );
        Ok(())
    }

    /// Commit step `step`, staged by the workers as `seq`, on every node: 2PC (ECRec §3.5) or
    /// one phase.
    pub(super) fn ec_commit(&mut self, step: u64, seq: u64, order: &[u32]) -> Result<(), Failure> {
        self.fire_phase_kills(Phase::Prepare);
        let Some(two_phase) = self.ec.as_ref().map(|e| e.spec.two_phase) else {
            return Err(Failure::Rpc("commit_rpc", "ECRec is not set up".into()));
        };
        let workers = order.to_vec();
        let t0 = Instant::now();
        if !two_phase {
            let res = self.ec_all(move |c| {
                let w = workers.clone();
                async move { c.apply_step(seq, w).await }
            });
            let bad = failed(&res);
            if let Some(ec) = self.ec.as_mut() {
                ec.report.prepare_s += t0.elapsed().as_secs_f64();
                // Without 2PC nothing can be taken back: whatever applied stays applied.
                ec.commit_failed.extend(bad);
                ec.report.steps_committed += 1;
                ec.report.per_step_s = ec.report.prepare_s / ec.report.steps_committed as f64;
            }
            return Ok(());
        }
        let res = self.ec_phase(Phase::PrepareSome, move |c| {
            let w = workers.clone();
            async move { c.prepare(seq, w).await }
        });
        let prepare_s = t0.elapsed().as_secs_f64();
        let bad = failed(&res);
        if !bad.is_empty() {
            // Phase 1 failed: nothing was applied anywhere; drop the step on the survivors.
            let _ = self.ec_all(move |c| async move { c.abort(seq).await });
            if let Some(ec) = self.ec.as_mut() {
                ec.report.prepare_s += prepare_s;
                ec.report.steps_aborted += 1;
            }
            return Err(Failure::Rpc(
                "prepare_rpc",
                format!("phase 1 of step {step} (seq {seq}): {}", describe(&bad)),
            ));
        }
        if let Some(ec) = self.ec.as_mut() {
            ec.report.prepare_s += prepare_s;
            for p in res.iter().flatten() {
                ec.report.row_deltas_sent += p.row_deltas_sent;
                ec.report.dense_deltas_sent += p.dense_deltas_sent;
                ec.report.delta_bytes_sent += p.bytes_sent;
            }
        }
        self.fire_phase_kills(Phase::Commit);
        let t1 = Instant::now();
        let res = self.ec_phase(
            Phase::CommitSome,
            move |c| async move { c.commit(seq).await },
        );
        if let Some(ec) = self.ec.as_mut() {
            ec.report.commit_s += t1.elapsed().as_secs_f64();
            ec.commit_failed.extend(failed(&res));
            ec.report.steps_committed += 1;
            ec.report.per_step_s =
                (ec.report.prepare_s + ec.report.commit_s) / ec.report.steps_committed as f64;
        }
        Ok(())
    }

    /// Between two steps: poll the rebuilds, handle a loss seen in phase 2. `None`: go on
    /// with the next step; `Some(false)`: the run ended; `Some(true)`: look again.
    pub(super) fn ec_between_steps(&mut self) -> Result<Option<bool>, ClusterError> {
        if self.ec.is_none() {
            return Ok(None);
        }
        if !self.ec_poll()? {
            return Ok(Some(false));
        }
        let bad = self
            .ec
            .as_mut()
            .map(|e| std::mem::take(&mut e.commit_failed))
            .unwrap_or_default();
        if bad.is_empty() {
            return Ok(None);
        }
        let lost = self.probe_lost();
        if lost.is_empty() {
            return Err(ClusterError::StepFailed {
                step: self.step(),
                reason: format!(
                    "the commit failed with every server alive, so the servers may disagree on \
                     the step: {}",
                    describe(&bad)
                ),
            });
        }
        Ok(Some(self.handle_server_losses(lost, "commit_rpc")?))
    }

    /// Servers `lost` are gone: tell the strategy about all of them, then rebuild every server
    /// it names at once (one rebuild round against the whole lost set). `Ok(false)`: aborted.
    pub(super) fn ec_handle_losses(
        &mut self,
        mut lost: Vec<u32>,
        by: &str,
    ) -> Result<bool, ClusterError> {
        lost.sort_unstable();
        lost.dedup();
        if self.ec.as_ref().is_some_and(|e| !e.spec.two_phase) {
            return Err(ClusterError::Recovery(format!(
                "server(s) {lost:?} lost ({by}) while ECRec runs without 2PC (--no-2pc): a \
                 rebuild needs a consistent cut, which deltas applied on arrival do not give, \
                 so the run stops here instead of rebuilding rows that may be corrupt; run \
                 with 2PC to train through server failures"
            )));
        }
        self.ec_sweep_txns();
        let mut rebuild = BTreeSet::new();
        let mut other = Vec::new();
        for &s in &lost {
            self.detected(Role::Server, s, by);
            let actions = self.strategy.on(&Event::ServerLost {
                server: ServerId(s),
                now_s: self.now(),
            });
            for a in actions {
                match a {
                    Action::Rebuild { server } => {
                        rebuild.insert(server.0);
                    }
                    a => other.push(a),
                }
            }
        }
        // An abort, or a restore from the backstop (it replaces every lost server and
        // re-encodes): no rebuild.
        if other
            .iter()
            .any(|a| matches!(a, Action::Abort { .. } | Action::RestoreAll { .. }))
        {
            return self.execute(other);
        }
        let rebuild: Vec<u32> = rebuild.into_iter().collect();
        if !rebuild.is_empty() && !self.ec_rebuild(&lost, &rebuild)? {
            return Ok(false);
        }
        self.execute(other)
    }

    /// Rebuild `servers` (ECRec §3.4): a new empty process for each one in `dead`, a restarted
    /// rebuild for the others; then training resumes at once. `Ok(false)`: aborted.
    pub(super) fn ec_rebuild(
        &mut self,
        dead: &[u32],
        servers: &[u32],
    ) -> Result<bool, ClusterError> {
        if self.ec.is_none() {
            return Err(ClusterError::Protocol(format!(
                "strategy {} asked to rebuild servers {servers:?}, which needs strategy ecrec",
                self.strategy.name()
            )));
        }
        self.count_recovery()?;
        // Every server whose state is not whole yet: a rebuild reads from the others only.
        let mut lost_all: BTreeSet<u32> = servers.iter().copied().collect();
        if let Some(ec) = &self.ec {
            lost_all.extend(ec.rebuilding.iter().map(|&(s, _)| s));
        }
        let lost_all: Vec<u32> = lost_all.into_iter().collect();
        self.event(
            EventKind::RecoveryStart,
            None,
            format!(
                "ECRec rebuild of servers {servers:?} (lost at the moment: {lost_all:?}), no \
                 pause and no rollback"
            ),
        );
        let rec = |e: ClusterError| ClusterError::Recovery(e.to_string());
        for &id in dead {
            self.ec_replace(id).map_err(rec)?;
        }
        if let Err(e) = self.ec_join(servers, &lost_all) {
            let now_lost = self.probe_lost();
            if !now_lost.is_empty() {
                // Another server (or a replacement) died meanwhile: a new lost set.
                return self.ec_handle_losses(now_lost, "rebuild");
            }
            let reason = e.to_string();
            for &s in servers {
                let actions = self.strategy.on(&Event::RebuildFailed {
                    server: ServerId(s),
                    reason: reason.clone(),
                });
                if !self.execute(actions)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        self.reconnect_workers().map_err(rec)?;
        self.update_heartbeat();
        // Reports about servers that have since been replaced are stale.
        let _ = self.heartbeat_losses();
        let now = self.now();
        let mut resumed = false;
        for f in self
            .failures
            .iter_mut()
            .filter(|f| f.role == Role::Server && f.detected_s.is_some() && f.resumed_s.is_none())
        {
            f.replaced_s.get_or_insert(now - f.injected_t_s);
            f.resumed_s = Some(now - f.injected_t_s);
            resumed = true;
        }
        if resumed {
            self.event(
                EventKind::TrainingResumed,
                None,
                format!(
                    "from step {} while servers {servers:?} rebuild in the background",
                    self.step()
                ),
            );
        }
        self.fire_phase_kills(Phase::Rebuild);
        Ok(true)
    }

    /// Start an empty replacement process for server `id`.
    fn ec_replace(&mut self, id: u32) -> Result<(), ClusterError> {
        self.generation[id as usize] += 1;
        let old = &mut self.procs[id as usize];
        if !old.has_exited() {
            // A server that hangs rather than died: count what it used before it goes.
            self.cpu.add(old.pid(), true);
        }
        self.procs[id as usize].kill();
        let mut spec = self.cfg.server_spec(id);
        if let Some(ec) = spec.ec.as_mut() {
            ec.replacement = true;
        }
        let p = ServerProcess::spawn(
            &self.cfg.exe,
            &spec,
            &self.cfg.work_dir,
            self.generation[id as usize],
            self.cfg.start_timeout,
        )?;
        self.pids.push(p.pid());
        self.addrs.push(p.addr.to_string());
        let detail = format!("pid {} at {} (empty, to be rebuilt)", p.pid(), p.addr);
        self.server_addrs[id as usize] = p.addr.into();
        self.procs[id as usize] = p;
        self.event(EventKind::ServerReplaced, Some(id), detail);
        if let Some(ec) = self.ec.as_mut() {
            // A replacement lost during its rebuild: that rebuild ends with the process.
            for &(s, i) in ec.rebuilding.iter().filter(|&&(s, _)| s == id) {
                let b = &mut ec.report.rebuilds[i];
                b.error
                    .get_or_insert_with(|| format!("server {s} was lost during its rebuild"));
            }
            ec.rebuilding.retain(|&(s, _)| s != id);
        }
        let now = self.now();
        for f in self
            .failures
            .iter_mut()
            .filter(|f| f.role == Role::Server && f.id == id && f.replaced_s.is_none())
        {
            f.replaced_s = Some(now - f.injected_t_s);
        }
        Ok(())
    }

    /// Connect to the current addresses, tell every node its peers, and start the background
    /// rebuild of each of `servers` against the lost set `lost`.
    fn ec_join(&mut self, servers: &[u32], lost: &[u32]) -> Result<(), ClusterError> {
        let addrs = self.server_addrs.clone();
        self.clients = Some(self.rt.block_on(connect_all(&addrs, &self.cfg.auth))?);
        // With a backstop, saves go to the replacements' checkpoint services too.
        self.connect_store_clients()?;
        self.ec_set_peers()?;
        let lost_ids: Vec<ServerId> = lost.iter().map(|&s| ServerId(s)).collect();
        let timeout = self.rpc_timeout();
        for &s in servers {
            let Some(ec) = self.ec.as_ref() else {
                return Ok(());
            };
            let client = ec.clients[s as usize].clone();
            let previous = ec
                .rebuilding
                .iter()
                .find(|&&(x, _)| x == s)
                .map(|&(_, i)| i);
            let started_s = self.now();
            let ids = lost_ids.clone();
            let r = self.rt.block_on(async move {
                tokio::time::timeout(timeout, async {
                    client.start_rebuild(ids, true).await?;
                    client.rebuild_status().await
                })
                .await
            });
            let r = match r {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {:.1}s", timeout.as_secs_f64())),
            };
            let now = self.now();
            let Some(ec) = self.ec.as_mut() else {
                return Ok(());
            };
            let mut entry = RebuildReport {
                server: s,
                lost: lost.to_vec(),
                started_s,
                ..RebuildReport::default()
            };
            match r {
                Ok(st) => {
                    if let Some(p) = previous {
                        if st.generation <= ec.report.rebuilds[p].generation {
                            // The node finished its rebuild before the restart reached it:
                            // nothing was restarted; the next poll reports the end.
                            continue;
                        }
                        ec.report.rebuilds[p].restarted = true;
                    }
                    entry.joined_s = Some(now);
                    entry.cpu_at_join = crate::report::process_cpu_s(self.procs[s as usize].pid());
                    entry.generation = st.generation;
                    ec.report.rebuilds.push(entry);
                    let idx = ec.report.rebuilds.len() - 1;
                    ec.rebuilding.retain(|&(x, _)| x != s);
                    ec.rebuilding.push((s, idx));
                }
                Err(e) => {
                    entry.error = Some(e.clone());
                    ec.report.rebuilds.push(entry);
                    ec.rebuilding.retain(|&(x, _)| x != s);
                    return Err(ClusterError::Recovery(format!(
                        "starting the rebuild of server {s}: {e}"
                    )));
                }
            }
        }
        if self.ec.as_ref().is_some_and(|e| e.finishing) {
            self.ec_lift_rebuild_share();
        } else {
            self.ec_pace_start();
        }
        Ok(())
    }

    /// Look at every rebuild under way; tell the strategy about finished and failed ones.
    /// `Ok(false)`: the run was aborted.
    fn ec_poll(&mut self) -> Result<bool, ClusterError> {
        self.ec_poll_rebuilds(true)
    }

    /// [`Coordinator::ec_poll`]; with `act_on_failures` off (asynchronous training, batches
    /// in flight), a failed rebuild is left in place and `Ok(false)` asks the caller to
    /// drain the batches in flight and poll again with it on.
    pub(super) fn ec_poll_rebuilds(&mut self, act_on_failures: bool) -> Result<bool, ClusterError> {
        self.ec_pace();
        let Some(ec) = &self.ec else {
            return Ok(true);
        };
        let tracked = ec.rebuilding.clone();
        let clients = ec.clients.clone();
        let timeout = self.rpc_timeout();
        for (server, idx) in tracked {
            let c = clients[server as usize].clone();
            let st = self
                .rt
                .block_on(async move { tokio::time::timeout(timeout, c.rebuild_status()).await });
            // An unreachable replacement is a loss: the next step or the heartbeat finds it.
            let Ok(Ok(st)) = st else { continue };
            let now = self.now();
            let Some(ec) = self.ec.as_mut() else {
                return Ok(true);
            };
            let b = &mut ec.report.rebuilds[idx];
            b.ranges = st.ranges_total;
            b.rows_decoded_on_demand = st.rows_decoded_on_demand;
            b.cut_retries = st.cut_retries;
            b.commits_in_lock = st.commits_in_lock;
            b.bytes = st.bytes_rebuilt;
            b.batches = st.batches;
            b.busy_s = st.busy_us as f64 * 1e-6;
            b.rest_s = st.rest_us as f64 * 1e-6;
            b.lock_s = st.lock_us as f64 * 1e-6;
            b.mb_per_s = (b.busy_s > 0.0).then(|| b.bytes as f64 / 1e6 / b.busy_s);
            let at = b.started_s;
            b.range_spans_s = st
                .range_spans_us
                .iter()
                .map(|&(s, e)| (at + s as f64 * 1e-6, at + e as f64 * 1e-6))
                .collect();
            if st.finished {
                b.finished_s = Some(now);
                let cpu = crate::report::process_cpu_s(self.procs[server as usize].pid());
                b.cpu_s_per_mb = cpu
                    .zip(b.cpu_at_join)
                    .filter(|_| b.bytes > 0)
                    .map(|(c, c0)| (c - c0) / (b.bytes as f64 / 1e6));
                ec.rebuilding.retain(|&(x, _)| x != server);
                for f in self.failures.iter_mut().filter(|f| {
                    f.role == Role::Server
                        && f.id == server
                        && f.replaced_s.is_some()
                        && f.recovered_s.is_none()
                }) {
                    f.recovered_s = Some(now - f.injected_t_s);
                }
                self.event(
                    EventKind::RecoveryComplete,
                    Some(server),
                    format!("server {server} rebuilt"),
                );
                let actions = self.strategy.on(&Event::RebuildFinished {
                    server: ServerId(server),
                    now_s: now,
                });
                if !self.execute(actions)? {
                    return Ok(false);
                }
            } else if let Some(reason) = st.error {
                if !act_on_failures {
                    return Ok(false);
                }
                b.error = Some(reason.clone());
                ec.rebuilding.retain(|&(x, _)| x != server);
                let lost = self.probe_lost();
                if !lost.is_empty() {
                    // The rebuild failed because a server it reads from is gone.
                    return self.ec_handle_losses(lost, "rebuild");
                }
                let actions = self.strategy.on(&Event::RebuildFailed {
                    server: ServerId(server),
                    reason,
                });
                if !self.execute(actions)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The ECRec part of worker `w`'s setup (asynchronous training: its updates are
    /// transactions it coordinates), under a new incarnation.
    pub(super) fn ec_worker(&mut self, w: u32) -> Option<EcWorker> {
        let ec = self.ec.as_mut().filter(|e| e.asynchronous)?;
        let epoch = ec.worker_epochs.get_mut(w as usize)?;
        *epoch += 1;
        Some(EcWorker {
            two_phase: ec.spec.two_phase,
            epoch: *epoch,
        })
    }

    /// The transaction phases a batch handed out now must stop at: those with a server kill
    /// still to fire (asynchronous training, where the workers run the phases).
    pub(super) fn ec_holds(&self) -> Vec<TxnHold> {
        if !self.ec.as_ref().is_some_and(|e| e.asynchronous) {
            return Vec::new();
        }
        let mut holds = Vec::new();
        for k in self.pending_kills() {
            if let KillAt::Phase(p) | KillAt::PhaseNth(p, _) = k.at {
                let h = match p {
                    Phase::Prepare => TxnHold::Prepare,
                    Phase::PrepareSome => TxnHold::PrepareSome,
                    Phase::Commit => TxnHold::Commit,
                    Phase::CommitSome => TxnHold::CommitSome,
                    _ => continue,
                };
                if !holds.contains(&h) {
                    holds.push(h);
                }
            }
        }
        holds
    }

    /// Worker `w` stopped its transaction before `phase`: fire that phase's kills, let it go.
    pub(super) fn ec_held(&mut self, w: u32, phase: TxnHold) {
        self.fire_txn_phase_kills(phase.kill_phase(), w);
        // A worker that cannot be told is lost; the pool reports it.
        let _ = self.pool.send(w, &ToWorker::Resume);
    }

    /// Worker `w` is lost: no transaction of its incarnation may stay half done. Fence it
    /// off on every server, read what each holds of it, and commit every transaction that
    /// some server committed (its worker had decided to commit, so it was prepared
    /// everywhere); abort the others.
    pub(super) fn ec_worker_lost(&mut self, w: u32) -> Result<(), ClusterError> {
        let Some(ec) = self.ec.as_ref().filter(|e| e.asynchronous) else {
            return Ok(());
        };
        let Some(&epoch) = ec.worker_epochs.get(w as usize) else {
            return Ok(());
        };
        self.ec_resolve_txns(w, epoch);
        Ok(())
    }

    /// A server is lost and every batch in flight has ended: a transaction still held on a
    /// survivor is an orphan (its worker's abort or commit never reached it). Resolve every
    /// worker's, without fencing anyone.
    fn ec_sweep_txns(&mut self) {
        if !self.ec.as_ref().is_some_and(|e| e.asynchronous) {
            return;
        }
        for w in 0..self.workers() {
            self.ec_resolve_txns(w, 0);
        }
    }

    /// Fence `w`'s incarnations up to `epoch` (0: none) on every server, read what each holds
    /// of its transactions, and commit those that some server committed, abort the others.
    fn ec_resolve_txns(&mut self, w: u32, epoch: u32) {
        // A server that does not answer is lost; its replacement holds no transaction.
        let states = self.ec_all(move |c| async move { c.txn_fence(w, epoch).await });
        let mut txns: BTreeSet<TxnId> = BTreeSet::new();
        let mut committed: BTreeSet<TxnId> = BTreeSet::new();
        for st in states.iter().flatten() {
            txns.extend(st.holding);
            txns.extend(st.staged.iter().copied());
            committed.extend(st.last_commit);
        }
        // A batch whose transaction committed somewhere is done, whether this resolution
        // completes it or its worker did before it was lost without saying so.
        if let Some(ec) = self.ec.as_mut() {
            ec.resolved_batches
                .extend(committed.iter().map(|t| t.priority));
        }
        let mut resolved = Vec::new();
        for t in txns {
            let commit = committed.contains(&t);
            let bad = failed(&self.ec_all(move |c| async move { c.txn_resolve(t, commit).await }));
            resolved.push(format!(
                "{} batch {} ({}{})",
                if commit { "committed" } else { "aborted" },
                t.priority,
                t.seq,
                if bad.is_empty() {
                    String::new()
                } else {
                    format!("; not on: {}", describe(&bad))
                }
            ));
        }
        if !resolved.is_empty() {
            self.event(
                EventKind::TransactionsResolved,
                None,
                format!("worker {w}'s transactions: {}", resolved.join(", ")),
            );
        }
    }

    /// Batches committed by a resolution since the last call (see `EcRun::resolved_batches`).
    pub(super) fn ec_resolved_batches(&mut self) -> Vec<u64> {
        self.ec
            .as_mut()
            .map(|e| std::mem::take(&mut e.resolved_batches))
            .unwrap_or_default()
    }

    /// End of training: wait for the rebuilds still under way (the final digest must see
    /// whole servers), then audit the parities.
    pub(super) fn ec_finish(&mut self) -> Result<(), ClusterError> {
        if self.ec.is_none() || self.aborted.is_some() {
            return Ok(());
        }
        let timing = self.worker_time;
        if let Some(ec) = self.ec.as_mut().filter(|e| e.asynchronous) {
            // The workers ran the transactions: their timings are the commit costs.
            let r = &mut ec.report;
            r.steps_committed = timing.txns;
            r.prepare_s = timing.txn_prepare_s;
            r.commit_s = timing.txn_commit_s;
            r.txn_retries = timing.txn_retries;
            r.txns_queued = timing.txns_queued;
            r.txns_behind = timing.txns_behind;
            r.txn_commit_failures = timing.txn_commit_failures;
            r.txns_resolved_by_workers = timing.txn_resolved;
            r.row_deltas_sent = timing.txn_row_deltas;
            r.dense_deltas_sent = timing.txn_dense_deltas;
            r.delta_bytes_sent = timing.txn_delta_bytes;
            r.per_step_s = (r.prepare_s + r.commit_s) / timing.txns.max(1) as f64;
            let txn_s = r.prepare_s + r.commit_s;
            r.lock_wait_share = if txn_s > 0.0 {
                timing.txn_lock_wait_s / txn_s
            } else {
                0.0
            };
            r.lock_wait = crate::ecrec::LockWaitShares::of(&timing, txn_s);
        }
        let deadline = Instant::now() + FINISH_REBUILD_TIMEOUT;
        // The rebuilds yielded to training (their share); now nothing else runs.
        if let Some(ec) = self.ec.as_mut() {
            ec.finishing = true;
        }
        self.ec_lift_rebuild_share();
        while self.ec.as_ref().is_some_and(|e| !e.rebuilding.is_empty()) {
            if !self.ec_poll()? {
                return Ok(());
            }
            let lost = self.confirmed_heartbeat_losses();
            if !lost.is_empty() && !self.handle_server_losses(lost, "heartbeat")? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Recovery(format!(
                    "rebuilds still under way {:.0}s after the last step",
                    FINISH_REBUILD_TIMEOUT.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.ec_throughput_shares();
        self.ec_audit();
        Ok(())
    }

    /// Check every parity against a fresh encode and every dense replica against its primary
    /// (for the sum code: its drift). Recorded in the report; never fails the run.
    fn ec_audit(&mut self) {
        let Some(ec) = &self.ec else { return };
        let spec = ec.spec;
        let clients = ec.clients.clone();
        let preset = &self.cfg.preset;
        let words = (preset.dim + self.cfg.sparse_optimizer.state_words(preset.dim)) as u64;
        let result = if largest_shard_bytes(preset, self.cfg.servers, words) > AUDIT_READ_LIMIT {
            Err(format!(
                "one server's rows of the largest table exceed {} MiB, more than one audit \
                 read may carry",
                AUDIT_READ_LIMIT >> 20
            ))
        } else {
            StripeLayout::new(self.cfg.servers, spec.k, spec.r, &preset.table_rows)
                .and_then(|l| Ok((l, Code::new(spec.code, spec.k, spec.r)?)))
                .map_err(|e| e.to_string())
                .and_then(|(layout, code)| {
                    self.rt
                        .block_on(audit_parities(&clients, &layout, &code))
                        .map_err(|e| format!("the audit failed: {e}"))
                })
        };
        if let Some(ec) = self.ec.as_mut() {
            match result {
                Ok(a) => {
                    ec.report.audit = Some(AuditReport {
                        stripes: a.stripes,
                        parity_mismatches: a.parity_mismatches,
                        max_abs_error: a.max_abs_error,
                        replica_mismatches: a.replica_mismatches,
                    })
                }
                Err(why) => ec.report.audit_skipped = Some(why),
            }
        }
    }
}

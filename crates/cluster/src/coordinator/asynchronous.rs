//! Asynchronous training (the default): the coordinator hands each worker a batch as soon as
//! it is free, collects the answers, and reacts to losses once the batches in flight ended.
//! A batch counts when its worker answers it, or when a resolution of a lost worker's
//! transaction finds it committed (ECRec); a batch that failed is trained again.

use std::collections::BTreeMap;
use std::time::Instant;

use ftrec_strategy::Action;

use super::{bad_data, Coordinator, Failure, POLL, REBUILD_POLL, STEP_TIMEOUT};
use crate::control::{FromWorker, PoolEvent};
use crate::ClusterError;

/// Where the training loop keeps answered batches: the losses held while a failure is
/// handled, the strategy's actions due, and the steps whose kills follow them.
type Answered<'a> = (&'a mut Vec<f64>, &'a mut Vec<Action>, &'a mut Vec<u64>);

impl Coordinator {
    pub(super) fn train_async(&mut self) -> Result<(), ClusterError> {
        self.train_start = Some(Instant::now());
        let live: Vec<u32> = self.live_pids().iter().map(|p| p.0).collect();
        self.cpu.open_window(&live);
        // Batches handed out and not yet answered, by worker; batches to hand out again.
        let mut running: BTreeMap<u32, (u64, Instant)> = BTreeMap::new();
        let mut requeue: Vec<u64> = Vec::new();
        let mut next = self.batches + 1;
        let mut unexplained = 0;
        // Set while batches in flight must finish before something else can happen.
        let mut pending: Option<Failure> = None;
        // Servers the heartbeat found lost, with their generation at the time: a recovery in
        // between replaces them, and a report about a replaced server is stale.
        let mut losses: Vec<(u32, u32)> = Vec::new();
        let mut actions: Vec<Action> = Vec::new();
        let mut kills_after: Vec<u64> = Vec::new();
        // A rebuild failed: once the batches in flight are done, look at it.
        let mut rebuild_failed = false;
        let mut last_rebuild_poll = Instant::now();
        // Whether batches completed during a loss still count and training goes on from
        // where it was (no rollback), or a recovery rewinds the model.
        let keeps_model = self.strategy.keeps_model_on_loss();
        // Batches answered while a failure was being drained: counted once the recovery is
        // known not to rewind the model (partial recovery, a worker's replacement).
        let mut held: Vec<f64> = Vec::new();
        loop {
            let draining =
                pending.is_some() || !losses.is_empty() || !actions.is_empty() || rebuild_failed;
            if !draining {
                for w in 0..self.workers() {
                    if running.contains_key(&w) || !self.pool.is_connected(w) {
                        continue;
                    }
                    let index = match requeue.pop() {
                        Some(i) => i,
                        None if self.batch_exists(next)? => {
                            next += 1;
                            next - 1
                        }
                        None => break,
                    };
                    let hold = self.ec_holds();
                    let cmd = self.batch_cmd(index, None, hold)?;
                    match self.pool.send(w, &cmd) {
                        Ok(()) => {
                            running.insert(w, (index, Instant::now()));
                        }
                        Err(e) => {
                            requeue.push(index);
                            pending.get_or_insert(Failure::Workers(vec![w], e));
                        }
                    }
                }
            }
            if running.is_empty() {
                let rewinds = self.rewinds;
                if let Some(failure) = pending.take() {
                    if !self.handle_failure(failure, self.step() + 1, &mut unexplained)? {
                        return Ok(());
                    }
                    let answered = &mut (&mut held, &mut actions, &mut kills_after);
                    self.settle(rewinds, &mut next, &mut requeue, answered);
                    continue;
                }
                if !losses.is_empty() {
                    let lost: Vec<u32> = losses
                        .drain(..)
                        .filter(|&(s, g)| self.generation[s as usize] == g)
                        .map(|(s, _)| s)
                        .collect();
                    if !self.handle_server_losses(lost, "heartbeat")? {
                        return Ok(());
                    }
                    let answered = &mut (&mut held, &mut actions, &mut kills_after);
                    self.settle(rewinds, &mut next, &mut requeue, answered);
                    continue;
                }
                if rebuild_failed {
                    rebuild_failed = false;
                    if !self.ec_poll_rebuilds(true)? {
                        return Ok(());
                    }
                    continue;
                }
                if !actions.is_empty() {
                    let a = std::mem::take(&mut actions);
                    if !self.execute(a)? {
                        return Ok(());
                    }
                    for step in std::mem::take(&mut kills_after) {
                        self.fire_step_kills(step);
                    }
                    let answered = &mut (&mut held, &mut actions, &mut kills_after);
                    self.settle(rewinds, &mut next, &mut requeue, answered);
                    continue;
                }
                if self.batches >= self.total_batches() {
                    return Ok(());
                }
            }
            actions.extend(self.poll_store(false));
            self.fire_time_kills();
            if self.ec.is_some() && last_rebuild_poll.elapsed() >= REBUILD_POLL {
                last_rebuild_poll = Instant::now();
                rebuild_failed |= !self.ec_poll_rebuilds(false)?;
            }
            if losses.is_empty() {
                for s in self.confirmed_heartbeat_losses() {
                    losses.push((s, self.generation[s as usize]));
                }
            }
            match self.pool.next(POLL) {
                Some(PoolEvent::Msg {
                    worker,
                    msg:
                        FromWorker::Done {
                            index,
                            loss,
                            timing,
                        },
                }) if running.get(&worker).map(|r| r.0) == Some(index) => {
                    if let Some((_, since)) = running.remove(&worker) {
                        self.note_span(since);
                    }
                    self.worker_time.add(&timing);
                    unexplained = 0;
                    if timing.txn_commit_failures > 0 {
                        // Phase 2 failed somewhere: the survivors committed the update, and
                        // the server that did not is probably lost.
                        pending.get_or_insert(Failure::Rpc(
                            "commit_rpc",
                            format!("phase 2 of batch {index} failed on a server"),
                        ));
                    }
                    let draining = pending.is_some() || !losses.is_empty();
                    let answered = &mut (&mut held, &mut actions, &mut kills_after);
                    self.answered(loss, draining && !keeps_model, answered);
                }
                Some(PoolEvent::Msg {
                    worker,
                    msg: FromWorker::Held { index, phase },
                }) if running.get(&worker).map(|r| r.0) == Some(index) => {
                    self.ec_held(worker, phase);
                }
                Some(PoolEvent::Msg {
                    worker,
                    msg: FromWorker::BadData { index, error },
                }) if running.get(&worker).map(|r| r.0) == Some(index) => {
                    return Err(bad_data(index, worker, error));
                }
                Some(PoolEvent::Msg {
                    worker,
                    msg: FromWorker::Failed { index, error },
                }) if index.is_some() && running.get(&worker).map(|r| r.0) == index => {
                    running.remove(&worker);
                    if let Some(i) = index {
                        requeue.push(i);
                    }
                    pending.get_or_insert(Failure::Rpc(
                        "worker_rpc",
                        format!("worker {worker}: {error}"),
                    ));
                }
                Some(PoolEvent::Lost { worker, reason }) => {
                    if let Some((i, _)) = running.remove(&worker) {
                        requeue.push(i);
                    }
                    // Its half-done transaction may hold the servers: resolve it now, not
                    // after the other workers' batches (which may wait for it).
                    self.ec_worker_lost(worker)?;
                    let answered = &mut (&mut held, &mut actions, &mut kills_after);
                    self.count_resolved(&mut requeue, !keeps_model, answered);
                    match pending.as_mut() {
                        Some(Failure::Workers(ws, _)) => ws.push(worker),
                        _ => {
                            pending = Some(Failure::Workers(vec![worker], reason));
                        }
                    }
                }
                _ => {}
            }
            // A worker silent for the step timeout is treated as lost: killed and replaced.
            let now = Instant::now();
            let silent: Vec<u32> = running
                .iter()
                .filter(|(_, &(_, since))| now.duration_since(since) > STEP_TIMEOUT)
                .map(|(&w, _)| w)
                .collect();
            for &w in &silent {
                self.pool.kill(w);
                self.ec_worker_lost(w)?;
            }
            for (&w, &(index, since)) in &running {
                if now.duration_since(since) > STEP_TIMEOUT {
                    requeue.push(index);
                    match pending.as_mut() {
                        Some(Failure::Workers(ws, _)) => ws.push(w),
                        _ => pending = Some(Failure::Workers(vec![w], "no answer".into())),
                    }
                }
            }
            running.retain(|_, (_, since)| now.duration_since(*since) <= STEP_TIMEOUT);
            if !silent.is_empty() {
                let answered = &mut (&mut held, &mut actions, &mut kills_after);
                self.count_resolved(&mut requeue, !keeps_model, answered);
            }
        }
    }

    /// A batch answered with `loss`: counted, or held (`hold`) while a failure being handled
    /// may still rewind the model. The strategy's reactions and the step kills they complete
    /// join `actions` / `kills_after`.
    fn answered(&mut self, loss: f64, hold: bool, answered: &mut Answered<'_>) {
        let (held, actions, kills_after) = answered;
        if hold {
            held.push(loss);
            return;
        }
        if let Some((step, new)) = self.count_batch(loss) {
            if new.is_empty() {
                self.fire_step_kills(step);
            } else {
                // As in synchronous mode, the step's kills come after the strategy's
                // actions, which wait for the batches in flight.
                actions.extend(new);
                kills_after.push(step);
            }
        }
    }

    /// Batches waiting to be trained again whose transaction a resolution found committed
    /// (their worker was lost before it answered): answered, not trained twice. Their loss
    /// was never reported; the last one stands in for it.
    fn count_resolved(&mut self, requeue: &mut Vec<u64>, hold: bool, answered: &mut Answered<'_>) {
        for i in self.ec_resolved_batches() {
            if let Some(at) = requeue.iter().position(|&r| r == i) {
                requeue.remove(at);
                self.answered(self.last_loss, hold, answered);
            }
        }
    }

    /// After a failure or the strategy's actions were handled (`rewinds`: the count of
    /// rewinds before): if a recovery rewound the model, hand batches out again from its
    /// position; else count the batches answered meanwhile.
    fn settle(
        &mut self,
        rewinds: u64,
        next: &mut u64,
        requeue: &mut Vec<u64>,
        answered: &mut Answered<'_>,
    ) {
        if self.rewinds != rewinds {
            *next = self.batches + 1;
            requeue.clear();
            answered.0.clear();
        } else {
            self.count_resolved(requeue, false, answered);
            self.count_held(answered);
        }
    }

    /// Count the batches held while a failure was handled that did not rewind the model; the
    /// strategy's reactions and the step kills they complete join `actions` / `kills_after`.
    fn count_held(&mut self, answered: &mut Answered<'_>) {
        let held: Vec<f64> = answered.0.drain(..).collect();
        for loss in held {
            self.answered(loss, false, answered);
        }
    }
}

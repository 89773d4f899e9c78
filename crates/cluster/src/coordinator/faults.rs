//! Fault injection: the scheduled kills ([`KillSpec`]) fired at their step, time or phase,
//! each SIGKILL recorded as a failure, and what became of every kill by the end of the run
//! ([`KillOutcome`]: fired when and after which step, or not, and why not), so that a kill that
//! never fired is never mistaken for one that did.
//!
//! A kill of the whole job (`job@step=S`) SIGKILLs every process of the job and then the
//! process running the coordinator: nothing after it runs, as in a crash of the machine.
//! Freezing it (`stop:job@step=S`) SIGSTOPs them all instead, as a paused virtual machine:
//! whoever wakes them later finds a job that may have been taken over meanwhile.

use ftrec_ps::PsService;

use super::Coordinator;
use crate::report::{EventKind, FailureReport, KillOutcome};
use crate::{ClusterError, KillAt, KillSpec, Phase, Role};

/// How long a fenced server that was woken gets to exit by itself.
const ZOMBIE_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the coordinator tells a woken, fenced server again while it waits for it to
/// exit: a server just woken on a loaded machine may miss the first word (its call times out),
/// and no heartbeat runs while the coordinator waits.
const ZOMBIE_TELL_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// When a kill fired.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fired {
    t_s: f64,
    step: u64,
}

/// Recoveries beyond the run's injected kills after which it gives up (a replacement that keeps
/// dying is not a fault the strategies can fix).
const MAX_RECOVERIES: u32 = 16;

impl Coordinator {
    /// Count one recovery attempt; an error once they exceed what the injected kills explain by
    /// [`MAX_RECOVERIES`]. An injected kill (one per process) explains two: its own recovery
    /// and the retry of a recovery it interrupted (servers killed at once are found one by
    /// one: the first one's load fails on the second, which is replaced, and then restored).
    pub(super) fn count_recovery(&mut self) -> Result<(), ClusterError> {
        self.recoveries += 1;
        let budget = MAX_RECOVERIES + 2 * self.cfg.kills.len() as u32;
        if self.recoveries > budget {
            return Err(ClusterError::Recovery(format!(
                "gave up after {budget} recoveries ({} injected kills)",
                self.cfg.kills.len()
            )));
        }
        Ok(())
    }

    /// Fire the kills scheduled for `point`; returns whether any fired.
    fn fire(&mut self, due: impl Fn(&KillAt) -> bool) -> bool {
        self.fire_some(|k| due(&k.at))
    }

    /// Fire the kills `due` picks; returns whether any fired.
    fn fire_some(&mut self, due: impl Fn(&KillSpec) -> bool) -> bool {
        let mut fired = false;
        for i in 0..self.kills.len() {
            let (k, done) = self.kills[i];
            if done.is_none() && due(&k) {
                let at = Fired {
                    t_s: self.now(),
                    step: self.step(),
                };
                if self.inject(k.role, k.id, k.pause, &k.to_string()) {
                    self.kills[i].1 = Some(at);
                    fired = true;
                }
            }
        }
        fired
    }

    /// Fire the kills scheduled right after step `step`.
    pub(super) fn fire_step_kills(&mut self, step: u64) {
        self.fire(|at| *at == KillAt::Step(step));
    }

    pub(super) fn fire_time_kills(&mut self) {
        let Some(t0) = self.train_start else { return };
        let t = t0.elapsed().as_secs_f64();
        self.fire(|at| matches!(at, KillAt::Time(x) if *x <= t));
    }

    pub(super) fn fire_phase_kills(&mut self, phase: Phase) -> bool {
        let n = {
            let c = self.phase_entries.entry(phase).or_insert(0);
            *c += 1;
            *c
        };
        self.fire(|at| *at == KillAt::Phase(phase) || *at == KillAt::PhaseNth(phase, n))
    }

    /// Worker `w`'s transaction reached `phase` (asynchronous ECRec): fire the server kills of
    /// the phase (counting every worker's entries) and `w`'s own (counting its entries only,
    /// so that a worker's kill finds it holding its transaction at the phase).
    pub(super) fn fire_txn_phase_kills(&mut self, phase: Phase, w: u32) -> bool {
        let n = {
            let c = self.phase_entries.entry(phase).or_insert(0);
            *c += 1;
            *c
        };
        let nw = {
            let c = self.worker_phase_entries.entry((phase, w)).or_insert(0);
            *c += 1;
            *c
        };
        self.fire_some(|k| {
            let nth = if k.role == Role::Worker {
                if k.id != w {
                    return false;
                }
                nw
            } else {
                n
            };
            k.at == KillAt::Phase(phase) || k.at == KillAt::PhaseNth(phase, nth)
        })
    }

    /// The kills still to fire.
    pub(super) fn pending_kills(&self) -> impl Iterator<Item = &KillSpec> {
        self.kills
            .iter()
            .filter(|(_, f)| f.is_none())
            .map(|(k, _)| k)
    }

    /// SIGKILL (or, with `pause`, SIGSTOP) a process and record the failure; whether a
    /// process was lost (a server started elsewhere is killed by whoever runs it: pid 0). A
    /// paused server is found lost by its heartbeats, and its replacement kills it.
    fn inject(&mut self, role: Role, id: u32, pause: bool, why: &str) -> bool {
        if role == Role::Job && pause {
            self.freeze_job(why);
            return true;
        }
        let pid = match role {
            Role::Server if self.external_servers() => self.await_outside_kill(id, why),
            Role::Server if pause => {
                let pid = self.procs.get_mut(id as usize).map(|p| {
                    // SAFETY: kill(2) with SIGSTOP on a child this coordinator started and
                    // still holds (not reaped, so the pid is not reused).
                    unsafe {
                        libc::kill(p.pid() as i32, libc::SIGSTOP);
                    }
                    p.pid()
                });
                self.stopped.extend(pid.map(|_| id));
                pid
            }
            Role::Server => self.procs.get_mut(id as usize).map(|p| {
                let pid = p.pid();
                self.cpu.add(pid, true);
                p.kill();
                pid
            }),
            Role::Worker => {
                if let Some(pid) = self.pool.pid(id) {
                    self.cpu.add(pid, false);
                }
                self.pool.kill(id)
            }
            Role::Merger => self.kill_merger(),
            Role::Job => self.kill_job(why),
        };
        let Some(pid) = pid else { return false };
        let lost = FailureReport::lost(role, id, self.step(), self.now());
        self.failures.push(lost);
        let how = match pid {
            0 => "killed from outside".to_string(),
            pid if pause => format!("SIGSTOP to pid {pid}"),
            pid => format!("SIGKILL to pid {pid}"),
        };
        self.event(
            EventKind::FailureInjected,
            (role == Role::Server).then_some(id),
            format!("{role} {id}: {how} ({why})"),
        );
        true
    }

    /// Servers the heartbeats found silent while a step waits (a paused or hung process,
    /// which no connection error reveals: its RPCs just hang). Each one's incarnation ends
    /// here: the coordinator raises its epoch and tells every other server, which from then on
    /// refuse whatever it sends ([`ftrec_ps::fence`]). Then a server this coordinator started
    /// is made to leave, so the RPCs hung on it fail now and the loss takes a crash's path:
    /// one a scheduled kill paused is woken (SIGCONT), as a stalled process comes back, and
    /// must learn it was replaced and exit by itself; any other is SIGKILLed.
    pub(super) fn fence_silent_servers(&mut self) {
        for s in self.confirmed_heartbeat_losses() {
            self.end_incarnation(s, self.generation[s as usize]);
        }
    }

    /// End epoch `epoch` of server `s`, found lost: raise its epoch past it in the
    /// coordinator's table and tell every other server, then make the process (if this
    /// coordinator started it and it still runs) leave: woken if a scheduled kill paused it,
    /// SIGKILLed otherwise.
    pub(super) fn end_incarnation(&mut self, s: u32, epoch: u32) {
        let old = crate::launcher::server_incarnation(s, epoch);
        self.cfg.auth.fences.supersede(old);
        self.announce_fences(&[s]);
        let woken = match self.stopped.iter().position(|&x| x == s) {
            Some(i) => {
                self.stopped.remove(i);
                true
            }
            None => false,
        };
        let Some(p) = self.procs.get_mut(s as usize) else {
            return;
        };
        if p.has_exited() {
            return;
        }
        let pid = p.pid();
        let detail = if woken {
            self.wake_fenced(s)
        } else {
            p.kill();
            "killed".to_string()
        };
        self.event(
            EventKind::ServerFenced,
            Some(s),
            format!("server {s} (pid {pid}, epoch {epoch}) is lost: fenced, {detail}"),
        );
    }

    /// SIGCONT server `s`, which the coordinator fenced while it was stopped, tell it so, and
    /// wait for it to exit by itself; what happened, in words.
    fn wake_fenced(&mut self, s: u32) -> String {
        let Some(p) = self.procs.get_mut(s as usize) else {
            return "gone".into();
        };
        // SAFETY: kill(2) with SIGCONT on a child this coordinator started and still holds
        // (not reaped, so the pid is not reused).
        unsafe {
            libc::kill(p.pid() as i32, libc::SIGCONT);
        }
        // Any request tells it: the coordinator's table names its newer epoch. Told again
        // until it exits or the wait is over.
        let deadline = std::time::Instant::now() + ZOMBIE_EXIT_WAIT;
        let exited = loop {
            self.announce_fences(&[]);
            let Some(p) = self.procs.get_mut(s as usize) else {
                return "gone".into();
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match p.wait_exit(left.min(ZOMBIE_TELL_EVERY)) {
                Some(st) => break Some(st),
                None if left <= ZOMBIE_TELL_EVERY => break None,
                None => {}
            }
        };
        let Some(p) = self.procs.get_mut(s as usize) else {
            return "gone".into();
        };
        match exited {
            Some(st) if st.code() == Some(i32::from(ftrec_ps::fence::FENCED_EXIT)) => {
                "woken, it learned it was replaced and exited by itself (status 3)".into()
            }
            Some(st) => format!("woken, it exited with {st}, not as fenced"),
            None => {
                p.kill();
                format!(
                    "woken, it did not exit within {:.0}s of learning it was replaced: killed",
                    ZOMBIE_EXIT_WAIT.as_secs_f64()
                )
            }
        }
    }

    /// Tell every server but `skip` the newest incarnations the coordinator knows (any request
    /// carries them; a server that does not answer in a heartbeat timeout learns at the next
    /// heartbeat).
    pub(super) fn announce_fences(&mut self, skip: &[u32]) {
        let Some(clients) = self.clients.as_ref() else {
            return;
        };
        let timeout = self.cfg.heartbeat_timeout;
        let mut calls = tokio::task::JoinSet::new();
        for (i, c) in clients.servers().iter().enumerate() {
            if !skip.contains(&(i as u32)) {
                let c = c.clone();
                calls.spawn_on(
                    async move {
                        let _ = tokio::time::timeout(timeout, c.info()).await;
                    },
                    self.rt.handle(),
                );
            }
        }
        self.rt
            .block_on(async { while calls.join_next().await.is_some() {} });
    }

    /// SIGSTOP the merger, every worker and every server, then this process: the whole job
    /// frozen at once, as a paused host. It returns when someone sends this process SIGCONT
    /// (and its children theirs); by then another coordinator may hold the store, so the next
    /// check of the lease decides whether the run goes on ([`super::lease`]).
    fn freeze_job(&mut self, why: &str) {
        let mut pids: Vec<u32> = self.merger_pid().into_iter().collect();
        pids.extend((0..self.workers()).filter_map(|w| self.pool.pid(w)));
        pids.extend(
            self.procs
                .iter_mut()
                .filter_map(|p| (!p.has_exited()).then(|| p.pid())),
        );
        let me = std::process::id();
        let list = pids
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        self.event(
            EventKind::FailureInjected,
            None,
            format!("the whole job: SIGSTOP to pids {list} and the coordinator's {me} ({why})"),
        );
        tracing::info!(
            "ftrec: {why}: froze the whole job after step {} (SIGSTOP to its processes {list} \
             and the coordinator's process {me}); wake them with SIGCONT",
            self.step()
        );
        // Frozen inside a swap of a local store, a process would keep the store's swap lock
        // and every other writer would wait for it: the job that takes the store over could
        // not even claim its lease. So this process closes its own swaps first (an in-flight
        // one ends), and each child is stopped outside one.
        let paused = ftrec_ckpt::store::local::pause_swaps();
        let root =
            self.store
                .as_ref()
                .and_then(|st| match ftrec_ckpt::location::parse(&st.location) {
                    Ok(ftrec_ckpt::location::Location::Dir(p)) => Some(p),
                    _ => None,
                });
        for pid in pids {
            if !ftrec_ckpt::store::local::stop_outside_swaps(pid, root.as_deref()) {
                tracing::warn!("ftrec: process {pid} stopped while it holds the store's swap lock");
            }
        }
        // SAFETY: kill(2) on this process's own pid; a stop signal is delivered before the
        // call returns, and the process goes on from here when continued.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGSTOP);
        }
        drop(paused);
    }

    /// SIGKILL the merger, every worker and every server, then this process.
    fn kill_job(&mut self, why: &str) -> ! {
        self.kill_merger();
        for w in 0..self.workers() {
            self.pool.kill(w);
        }
        for p in &mut self.procs {
            p.kill();
        }
        tracing::info!(
            "ftrec: {why}: SIGKILLed the whole job after step {} (servers, workers, merger and \
             the coordinator's process {})",
            self.step(),
            std::process::id()
        );
        // SAFETY: kill(2) on this process's own pid with a signal that cannot be caught; no
        // memory is touched. Nothing after it runs, as in a crash.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        unreachable!("SIGKILL of the own process returned")
    }

    /// A kill scheduled after a step the data does not reach never fires: an error, not a run
    /// that silently missed its fault.
    pub(super) fn check_step_kills_fired(&mut self) -> Result<(), ClusterError> {
        if self.aborted.is_some() || !self.at_data_end() {
            return Ok(());
        }
        match self
            .pending_kills()
            .find(|k| matches!(k.at, KillAt::Step(_)))
        {
            Some(k) => Err(ClusterError::Config(format!(
                "--kill {k} never fired: the data ended after step {}",
                self.step()
            ))),
            None => Ok(()),
        }
    }

    /// What became of every scheduled kill, in the order given.
    pub(super) fn kill_outcomes(&self) -> Vec<KillOutcome> {
        let train_s = self.train_start.map_or(0.0, |t| {
            self.train_end
                .unwrap_or_else(std::time::Instant::now)
                .duration_since(t)
                .as_secs_f64()
        });
        self.kills
            .iter()
            .map(|(k, fired)| KillOutcome {
                kill: k.to_string(),
                fired: fired.is_some(),
                t_s: fired.map(|f| f.t_s),
                step: fired.map(|f| f.step),
                not_fired: fired.is_none().then(|| match k.at {
                    KillAt::Step(s) => format!(
                        "the run ended after step {} without reaching step {s}",
                        self.step()
                    ),
                    KillAt::Time(t) => {
                        format!("training ended after {train_s:.2} s, before {t} s")
                    }
                    KillAt::Phase(p) | KillAt::PhaseNth(p, _) => format!(
                        "the run entered phase {p} {} times",
                        self.phase_entries.get(&p).copied().unwrap_or(0)
                    ),
                }),
            })
            .collect()
    }
}

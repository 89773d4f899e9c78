//! The control channel between the coordinator and its workers, and the coordinator's pool of
//! worker processes.
//!
//! A worker process connects to the coordinator's control socket, says who it is
//! ([`FromWorker::Hello`]) and then answers commands, one reply per command, as JSON lines
//! over TCP. Workers hold no training state between commands (the model lives on the
//! servers; a batch is a pure function of its index), so a lost worker is replaced by
//! starting another process with the same id and handing it the batch the lost one held.
//!
//! The pool reads every connection on its own thread and funnels what arrives into one
//! queue, tagged with the connection it came from: a message from a connection that has
//! since been replaced is dropped, so a slow reply of a killed worker can never be taken for
//! its replacement's.
//!
//! A worker lives as long as its control connection (and, when the pool started it, as long
//! as its standard input, whose other end the pool holds): a coordinator that exits or dies
//! takes its workers with it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use ftrec_ps::net::PeerAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::auth::{check_hello, Auth, Secret};
use crate::worker::WorkerSetup;
use crate::ClusterError;

/// Longest line either side accepts (a setup message is the largest, a few kilobytes).
pub const MAX_LINE: usize = 1 << 20;
/// Longest a new connection may take to say hello before it is dropped.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Open control connections beyond the job's workers (replacements joining, stray
/// connections) before new ones are refused.
pub const EXTRA_CONNECTIONS: usize = 16;

/// What the coordinator asks of a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum ToWorker {
    /// Build the data source and the model buffers; answered by [`FromWorker::Ready`].
    Setup(Box<WorkerSetup>),
    /// (Re)connect to the servers (in server order); answered by [`FromWorker::Connected`].
    /// `fences` is the coordinator's table of incarnations ([`ftrec_ps::fence`]): before the
    /// worker drops a connection to a server whose epoch it raised, it tells that process,
    /// which the coordinator may not reach (a partition), that it was replaced.
    Connect {
        servers: Vec<PeerAddr>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        fences: String,
    },
    /// Train on global batch `index` (from 1): stage the update as `seq` (synchronous mode) or
    /// push it (asynchronous mode); answered by [`FromWorker::Done`]. With ECRec's
    /// transactions, the worker stops at each phase in `hold` ([`FromWorker::Held`]) until
    /// [`ToWorker::Resume`] (fault injection in a phase).
    Batch {
        index: u64,
        seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hold: Vec<TxnHold>,
        /// On TSV data: where the batch starts (the coordinator's [`crate::plan::BatchPlan`]);
        /// none on synthetic data, where the index alone gives the batch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start: Option<ftrec_data::Position>,
        /// The coordinator's table of the job's newest incarnations
        /// ([`ftrec_ps::fence::Fences::table_text`]): the worker's requests carry it to every
        /// server, those the coordinator cannot reach included.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        fences: String,
        /// How many times the job has rolled the servers' tables back to a checkpoint so far;
        /// a count above the last one the worker saw tells it of a rollback.
        #[serde(default, skip_serializing_if = "is_zero")]
        rewinds: u64,
        /// The global batches the tables held after the newest rollback (the batches after
        /// them are sent again).
        #[serde(default, skip_serializing_if = "is_zero")]
        restored: u64,
    },
    /// Go on after [`FromWorker::Held`].
    Resume,
    /// Exit.
    Stop,
    /// The answer to an accepted [`FromWorker::Hello`]: the coordinator's job id (a worker
    /// started without one takes it for its RPCs).
    Welcome {
        #[serde(default)]
        job: Option<String>,
    },
    /// The answer to a refused hello (a missing or wrong token, another job, too many
    /// connections); the coordinator closes the connection after it.
    Refused { reason: String },
}

/// A zero count, left out of a message.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A worker's messages.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum FromWorker {
    Hello {
        id: u32,
        pid: u32,
        /// The shared token, when the worker has one (`ftrec_ps::auth`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<Secret>,
        /// The worker's job id, when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<String>,
    },
    Ready,
    Connected,
    Done {
        index: u64,
        loss: f64,
        #[serde(default)]
        timing: BatchTiming,
    },
    /// The last command failed (`index`: the batch it was about, if any).
    Failed {
        index: Option<u64>,
        error: String,
    },
    /// Batch `index`'s data could not be read (a malformed line without `--skip-malformed`, an
    /// unreadable file): not a fault any strategy recovers from, so the run stops with it.
    BadData {
        index: u64,
        error: String,
    },
    /// Batch `index` stopped before `phase` of its transaction, as asked; waits for
    /// [`ToWorker::Resume`].
    Held {
        index: u64,
        phase: TxnHold,
    },
}

/// A phase of a worker's ECRec transaction (ECRec §3.5) where a batch can be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnHold {
    /// Before phase 1 (prepare) is sent.
    Prepare,
    /// Phase 1 answered by the first half of the servers, not yet sent to the others.
    PrepareSome,
    /// After phase 1 succeeded everywhere, before phase 2 (commit) is sent.
    Commit,
    /// Phase 2 answered by the first half of the servers, not yet sent to the others.
    CommitSome,
}

impl TxnHold {
    /// The transaction's point of this hold.
    pub fn phase(self) -> ftrec_ps::ec::TxnPhase {
        use ftrec_ps::ec::TxnPhase;
        match self {
            TxnHold::Prepare => TxnPhase::Prepare,
            TxnHold::PrepareSome => TxnPhase::PrepareSome,
            TxnHold::Commit => TxnPhase::Commit,
            TxnHold::CommitSome => TxnPhase::CommitSome,
        }
    }

    /// The hold at a transaction's point.
    pub fn of(phase: ftrec_ps::ec::TxnPhase) -> TxnHold {
        use ftrec_ps::ec::TxnPhase;
        match phase {
            TxnPhase::Prepare => TxnHold::Prepare,
            TxnPhase::PrepareSome => TxnHold::PrepareSome,
            TxnPhase::Commit => TxnHold::Commit,
            TxnPhase::CommitSome => TxnHold::CommitSome,
        }
    }

    /// The kill phase fired at this hold.
    pub fn kill_phase(self) -> crate::Phase {
        match self {
            TxnHold::Prepare => crate::Phase::Prepare,
            TxnHold::PrepareSome => crate::Phase::PrepareSome,
            TxnHold::Commit => crate::Phase::Commit,
            TxnHold::CommitSome => crate::Phase::CommitSome,
        }
    }
}

/// Where a worker's time went on one batch, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchTiming {
    /// Generating the batch from its index.
    pub data_s: f64,
    /// Pulling rows and dense values (and pooling them, for a trainer outside the process).
    pub pull_s: f64,
    /// Pooling, forward, backward and gathering the sparse gradients.
    pub compute_s: f64,
    /// Pushing (or staging) the update.
    pub push_s: f64,
    /// ECRec transactions (asynchronous training): phase 1 with its retries, phase 2 (or the
    /// one-phase apply), and phase-1 attempts refused by wait-die and retried.
    #[serde(default)]
    pub txn_prepare_s: f64,
    #[serde(default)]
    pub txn_commit_s: f64,
    #[serde(default)]
    pub txn_retries: u64,
    /// Transactions prepared queued (after a refusal: [`ftrec_ps::ec::Admission::Queued`]).
    #[serde(default)]
    pub txns_queued: u64,
    /// Transactions prepared behind the gate's holder ([`ftrec_ps::ec::Admission::After`]).
    #[serde(default)]
    pub txns_behind: u64,
    /// Of the transactions' time, the part spent waiting for other transactions (refused
    /// attempts and waits for a node's slot).
    #[serde(default)]
    pub txn_lock_wait_s: f64,
    /// Its parts ([`ftrec_ps::ec::TxnReport::refused_wait_s`]): refused attempts with their
    /// back-off, the gate's reservation, the vote held behind the transaction before.
    #[serde(default)]
    pub txn_refused_wait_s: f64,
    #[serde(default)]
    pub txn_gate_wait_s: f64,
    #[serde(default)]
    pub txn_behind_wait_s: f64,
    /// Transactions whose phase 2 failed on some node (lost after phase 1).
    #[serde(default)]
    pub txn_commit_failures: u64,
    #[serde(default)]
    pub txns: u64,
    /// Transactions the worker settled itself after a failed phase ([`ftrec_ps::ec::resolve_txn`]).
    #[serde(default)]
    pub txn_resolved: u64,
    /// What the transactions' phase 1 sent the parity and replica holders (2PC only): row
    /// deltas, dense gradients, payload bytes.
    #[serde(default)]
    pub txn_row_deltas: u64,
    #[serde(default)]
    pub txn_dense_deltas: u64,
    #[serde(default)]
    pub txn_delta_bytes: u64,
}

impl BatchTiming {
    pub fn add(&mut self, o: &BatchTiming) {
        self.data_s += o.data_s;
        self.pull_s += o.pull_s;
        self.compute_s += o.compute_s;
        self.push_s += o.push_s;
        self.txn_prepare_s += o.txn_prepare_s;
        self.txn_commit_s += o.txn_commit_s;
        self.txn_retries = self.txn_retries.saturating_add(o.txn_retries);
        self.txns_queued = self.txns_queued.saturating_add(o.txns_queued);
        self.txns_behind = self.txns_behind.saturating_add(o.txns_behind);
        self.txn_lock_wait_s += o.txn_lock_wait_s;
        self.txn_refused_wait_s += o.txn_refused_wait_s;
        self.txn_gate_wait_s += o.txn_gate_wait_s;
        self.txn_behind_wait_s += o.txn_behind_wait_s;
        self.txn_commit_failures = self
            .txn_commit_failures
            .saturating_add(o.txn_commit_failures);
        self.txns = self.txns.saturating_add(o.txns);
        self.txn_resolved = self.txn_resolved.saturating_add(o.txn_resolved);
        self.txn_row_deltas = self.txn_row_deltas.saturating_add(o.txn_row_deltas);
        self.txn_dense_deltas = self.txn_dense_deltas.saturating_add(o.txn_dense_deltas);
        self.txn_delta_bytes = self.txn_delta_bytes.saturating_add(o.txn_delta_bytes);
    }
}

/// Write one message as a JSON line.
pub fn send_line<T: Serialize>(stream: &mut TcpStream, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    stream.flush()
}

/// Read one JSON line; `Ok(None)` at end of stream. A line that is too long or not a message
/// of type `T` is an error naming what was wrong.
pub fn read_line<T: for<'de> Deserialize<'de>>(
    reader: &mut impl BufRead,
    what: &str,
) -> Result<Option<T>, String> {
    let mut buf = Vec::new();
    let n = reader
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(|e| format!("reading from {what}: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(if n > MAX_LINE {
            format!("{what} sent a line longer than {MAX_LINE} bytes")
        } else {
            format!("{what} closed the connection in the middle of a message")
        });
    }
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| format!("{what} sent a malformed message: {e}"))
}

/// What the pool reports.
#[derive(Debug)]
pub enum PoolEvent {
    Msg {
        worker: u32,
        msg: FromWorker,
    },
    /// The worker's connection ended or broke (its process died, or it exited).
    Lost {
        worker: u32,
        reason: String,
    },
}

enum Inbound {
    Joined {
        worker: u32,
        pid: u32,
        conn: u64,
        stream: TcpStream,
    },
    Msg {
        conn: u64,
        msg: FromWorker,
    },
    Closed {
        conn: u64,
        reason: String,
    },
    /// A connection was refused at its hello.
    Refused {
        reason: String,
    },
}

struct Slot {
    conn: Option<(u64, TcpStream)>,
    pid: Option<u32>,
    child: Option<Child>,
    /// Processes started for this worker so far: the next one's incarnation epoch.
    starts: u64,
}

/// The coordinator's workers: their control connections and, for workers it started, their
/// processes. Dropping the pool kills and reaps every process it started.
pub struct WorkerPool {
    addr: SocketAddr,
    inbox: mpsc::Receiver<Inbound>,
    slots: Vec<Slot>,
    by_conn: HashMap<u64, u32>,
    exe: Option<PathBuf>,
    /// Every worker process started, replacements included.
    pub pids: Vec<u32>,
    stop: Arc<AtomicBool>,
    /// What the workers this pool starts prove, and what every hello must carry.
    auth: Auth,
    /// The last hello refused, to explain a worker that never joins.
    last_refusal: Option<String>,
    /// Losses a caller waiting for one worker put back for the next caller ([`Self::defer`]).
    deferred: std::collections::VecDeque<PoolEvent>,
    /// The CPUs the workers it starts run on ([`Self::on_cpus`]).
    cpus: Option<crate::cpus::CpuSet>,
}

impl WorkerPool {
    /// Listen for `workers` workers on `listen`. With `exe`, [`WorkerPool::spawn`] starts
    /// local worker processes (`exe worker --coordinator ADDR --id W --until stdin`).
    pub fn listen(
        listen: SocketAddr,
        workers: u32,
        exe: Option<&Path>,
    ) -> Result<WorkerPool, ClusterError> {
        Self::listen_with(listen, workers, exe, Auth::none())
    }

    /// [`WorkerPool::listen`] for a job with `auth`: a hello without its token or from another
    /// job is refused (one [`ToWorker::Refused`] line, then the connection closes), and the
    /// workers this pool starts get the token and job id through their environment.
    pub fn listen_with(
        listen: SocketAddr,
        workers: u32,
        exe: Option<&Path>,
        auth: Auth,
    ) -> Result<WorkerPool, ClusterError> {
        let listener = TcpListener::bind(listen).map_err(|e| ClusterError::Io {
            what: format!("binding the control socket {listen}"),
            source: e,
        })?;
        let addr = listener.local_addr().map_err(|e| ClusterError::Io {
            what: "reading the control socket's address".into(),
            source: e,
        })?;
        if exe.is_none() {
            // Workers started elsewhere need the bound address (the port, when 0 was asked).
            tracing::info!(
                control = %addr,
                "control socket listening on {addr}: start {workers} workers with ftrec worker \
                 --coordinator HOST:{} --id W (W from 0)",
                addr.port()
            );
        }
        listener
            .set_nonblocking(true)
            .map_err(|e| ClusterError::Io {
                what: "configuring the control socket".into(),
                source: e,
            })?;
        let (tx, inbox) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_accept = stop.clone();
        let gate = Gate {
            auth: auth.clone(),
            open: Arc::new(AtomicUsize::new(0)),
            max_open: workers as usize + EXTRA_CONNECTIONS,
        };
        std::thread::Builder::new()
            .name("ftrec-control-accept".into())
            .spawn(move || accept_loop(listener, tx, stop_accept, gate))
            .map_err(|e| ClusterError::Io {
                what: "starting the control acceptor".into(),
                source: e,
            })?;
        Ok(WorkerPool {
            addr,
            inbox,
            slots: (0..workers)
                .map(|_| Slot {
                    conn: None,
                    pid: None,
                    child: None,
                    starts: 0,
                })
                .collect(),
            by_conn: HashMap::new(),
            exe: exe.map(Path::to_path_buf),
            pids: Vec::new(),
            stop,
            auth,
            last_refusal: None,
            deferred: Default::default(),
            cpus: None,
        })
    }

    /// Start the workers this pool starts on `cpus` only (`None`: wherever this process may
    /// run).
    pub fn on_cpus(mut self, cpus: Option<crate::cpus::CpuSet>) -> WorkerPool {
        self.cpus = cpus;
        self
    }

    /// The control socket's address (what `ftrec worker --coordinator` connects to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Start a local process for worker `w` (killing one still running under that id) and
    /// wait until it has connected.
    pub fn spawn(&mut self, w: u32, timeout: Duration) -> Result<u32, ClusterError> {
        let exe = self
            .exe
            .clone()
            .ok_or_else(|| ClusterError::Config("this pool does not start workers".into()))?;
        self.kill(w);
        // Its incarnation: from now on every server the coordinator tells refuses the ones
        // before it ([`ftrec_ps::fence`]).
        let me = ftrec_ps::fence::Incarnation::new(
            ftrec_ps::fence::FenceRole::Worker,
            w,
            self.slots[w as usize].starts,
        );
        self.slots[w as usize].starts += 1;
        self.auth.fences.raise(me);
        let mut cmd = Command::new(&exe);
        if let Some(cpus) = &self.cpus {
            cpus.pin(&mut cmd);
        }
        let child = cmd
            .args([
                "worker",
                "--coordinator",
                &self.addr.to_string(),
                "--id",
                &w.to_string(),
                "--until",
                "stdin",
            ])
            // The token never goes on the command line, which `ps` shows.
            .env_remove(ftrec_ps::auth::TOKEN_ENV)
            .env_remove(ftrec_ps::auth::JOB_ENV)
            .env_remove(ftrec_ps::tls::CERT_ENV)
            .env_remove(ftrec_ps::tls::KEY_ENV)
            .env_remove(ftrec_ps::tls::CA_ENV)
            .envs(self.auth.env_vars())
            .env(ftrec_ps::fence::INCARNATION_ENV, me.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| ClusterError::Spawn {
                what: format!("worker {w}"),
                reason: format!("cannot start {}: {e}", exe.display()),
            })?;
        let pid = child.id();
        self.pids.push(pid);
        self.slots[w as usize].child = Some(child);
        self.wait_joined(w, timeout)?;
        Ok(pid)
    }

    /// Wait until worker `w` has connected (a worker started elsewhere, or by
    /// [`WorkerPool::spawn`]). Other workers' messages that arrive meanwhile are dropped, so
    /// call this only while no command is outstanding.
    pub fn wait_joined(&mut self, w: u32, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        while self.slots[w as usize].conn.is_none() {
            if let Some(child) = self.slots[w as usize].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(ClusterError::Spawn {
                        what: format!("worker {w}"),
                        reason: format!("the process exited with {status} before it connected"),
                    });
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let refused = self.last_refusal.as_ref().map_or(String::new(), |r| {
                    format!(" (last connection refused: {r})")
                });
                return Err(ClusterError::Timeout(format!(
                    "worker {w} did not connect to {} within {:.1}s{refused}",
                    self.addr,
                    timeout.as_secs_f64()
                )));
            }
            let _ = self.next(left.min(Duration::from_millis(50)));
        }
        Ok(())
    }

    /// Put a worker's loss back, for the next [`Self::next`]: a caller that waits for one
    /// worker's answer must not swallow another's loss.
    pub fn defer(&mut self, event: PoolEvent) {
        self.deferred.push_back(event);
    }

    /// Whether worker `w` is connected.
    pub fn is_connected(&self, w: u32) -> bool {
        self.slots[w as usize].conn.is_some()
    }

    /// The pid worker `w` reported.
    pub fn pid(&self, w: u32) -> Option<u32> {
        self.slots[w as usize].pid
    }

    /// Send `msg` to worker `w`. A failure marks it lost (and says why).
    pub fn send(&mut self, w: u32, msg: &ToWorker) -> Result<(), String> {
        let slot = &mut self.slots[w as usize];
        let Some((conn, stream)) = slot.conn.as_mut() else {
            return Err(format!("worker {w} is not connected"));
        };
        if let Err(e) = send_line(stream, msg) {
            let conn = *conn;
            self.drop_conn(conn);
            return Err(format!("worker {w}: {e}"));
        }
        Ok(())
    }

    /// The next message or loss, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Option<PoolEvent> {
        if let Some(e) = self.deferred.pop_front() {
            return Some(e);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let inbound = match self.inbox.recv_timeout(left) {
                Ok(i) => i,
                Err(_) => return None,
            };
            match inbound {
                Inbound::Joined {
                    worker,
                    pid,
                    conn,
                    stream,
                } => {
                    let Some(slot) = self.slots.get_mut(worker as usize) else {
                        // An id outside the job: refuse it by closing the connection.
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                        continue;
                    };
                    let replaced = slot.conn.take().map(|(old, s)| {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        self.by_conn.remove(&old);
                    });
                    slot.conn = Some((conn, stream));
                    slot.pid = Some(pid);
                    self.by_conn.insert(conn, worker);
                    // A new process under a connected worker's id (an orchestrator restarted
                    // it before its old connection was seen to close): the old one is lost,
                    // and the new one must be set up before it gets a batch.
                    if replaced.is_some() {
                        return Some(PoolEvent::Lost {
                            worker,
                            reason: format!("a new process (pid {pid}) connected with its id"),
                        });
                    }
                }
                Inbound::Msg { conn, msg } => {
                    if let Some(&worker) = self.by_conn.get(&conn) {
                        return Some(PoolEvent::Msg { worker, msg });
                    }
                }
                Inbound::Closed { conn, reason } => {
                    if let Some(worker) = self.drop_conn(conn) {
                        return Some(PoolEvent::Lost { worker, reason });
                    }
                }
                Inbound::Refused { reason } => self.last_refusal = Some(reason),
            }
        }
    }

    fn drop_conn(&mut self, conn: u64) -> Option<u32> {
        let worker = self.by_conn.remove(&conn)?;
        let slot = &mut self.slots[worker as usize];
        if let Some((c, s)) = slot.conn.take() {
            if c == conn {
                let _ = s.shutdown(std::net::Shutdown::Both);
            } else {
                slot.conn = Some((c, s));
            }
        }
        Some(worker)
    }

    /// SIGKILL worker `w`'s process (if this pool started it) and reap it; returns its pid.
    pub fn kill(&mut self, w: u32) -> Option<u32> {
        let slot = &mut self.slots[w as usize];
        let mut child = slot.child.take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }

    /// Whether worker `w`'s process (started by this pool) has exited.
    pub fn has_exited(&mut self, w: u32) -> bool {
        match self.slots[w as usize].child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Ask every worker to stop, wait up to `grace` for the processes this pool started, then
    /// kill what is left.
    pub fn stop_all(&mut self, grace: Duration) {
        for w in 0..self.len() {
            let _ = self.send(w, &ToWorker::Stop);
        }
        let deadline = Instant::now() + grace;
        for slot in &mut self.slots {
            if let Some((_, s)) = slot.conn.take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if let Some(mut child) = slot.child.take() {
                drop(child.stdin.take());
                loop {
                    if !matches!(child.try_wait(), Ok(None)) {
                        break;
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        self.by_conn.clear();
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in 0..self.len() {
            self.kill(w);
        }
    }
}

/// What the acceptor checks: the job's auth on every hello, and how many connections may be
/// open at once.
#[derive(Clone)]
struct Gate {
    auth: Auth,
    open: Arc<AtomicUsize>,
    max_open: usize,
}

/// Decrements the open-connection count when a reader thread ends.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Refuse a connection: one [`ToWorker::Refused`] line, then close it.
fn refuse(mut stream: TcpStream, reason: &str) {
    let _ = send_line(
        &mut stream,
        &ToWorker::Refused {
            reason: reason.to_string(),
        },
    );
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Accept connections until the pool stops it; each gets a reader thread. The listener is
/// polled (non-blocking) so that the socket is closed as soon as the pool is dropped.
fn accept_loop(
    listener: TcpListener,
    tx: mpsc::Sender<Inbound>,
    stop: Arc<AtomicBool>,
    gate: Gate,
) {
    let mut next_conn = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if gate.open.fetch_add(1, Ordering::Relaxed) >= gate.max_open {
                    gate.open.fetch_sub(1, Ordering::Relaxed);
                    let reason = format!(
                        "too many control connections: {} open, the limit is {}",
                        gate.max_open, gate.max_open
                    );
                    let _ = tx.send(Inbound::Refused {
                        reason: reason.clone(),
                    });
                    refuse(stream, &reason);
                    continue;
                }
                let guard = OpenGuard(gate.open.clone());
                next_conn += 1;
                let conn = next_conn;
                let tx = tx.clone();
                let auth = gate.auth.clone();
                let _ = std::thread::Builder::new()
                    .name(format!("ftrec-control-{conn}"))
                    .spawn(move || {
                        let _guard = guard;
                        read_conn(stream, conn, tx, &auth)
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn read_conn(stream: TcpStream, conn: u64, tx: mpsc::Sender<Inbound>, auth: &Auth) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "a worker".to_string(), |a| format!("worker at {a}"));
    // A connection that never says hello must not hold its thread forever.
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut reader = BufReader::new(stream);
    // The first message says who it is; anything else is not a worker.
    match read_line::<FromWorker>(&mut reader, &peer) {
        Ok(Some(FromWorker::Hello {
            id,
            pid,
            token,
            job,
        })) => {
            if let Err(r) = check_hello(auth, token.as_ref(), job.as_deref()) {
                let reason = format!("worker {id} ({peer}) refused: {r}");
                let _ = tx.send(Inbound::Refused {
                    reason: reason.clone(),
                });
                refuse(writer, &reason);
                return;
            }
            let _ = reader.get_ref().set_read_timeout(None);
            let welcome = ToWorker::Welcome {
                job: auth.job.as_ref().map(|j| j.to_string()),
            };
            if send_line(&mut writer, &welcome).is_err() {
                return;
            }
            if tx
                .send(Inbound::Joined {
                    worker: id,
                    pid,
                    conn,
                    stream: writer,
                })
                .is_err()
            {
                return;
            }
        }
        Ok(Some(_)) => {
            refuse(
                writer,
                "the first message on the control socket must be a hello",
            );
            return;
        }
        Ok(None) => return,
        Err(e) => {
            refuse(writer, &e);
            return;
        }
    }
    loop {
        let inbound = match read_line::<FromWorker>(&mut reader, &peer) {
            Ok(Some(msg)) => Inbound::Msg { conn, msg },
            Ok(None) => Inbound::Closed {
                conn,
                reason: "its control connection closed".into(),
            },
            Err(e) => Inbound::Closed { conn, reason: e },
        };
        let closed = matches!(inbound, Inbound::Closed { .. });
        if tx.send(inbound).is_err() || closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_core::fuzz::{mutated, Mutation, HUGE};
    use proptest::prelude::*;

    fn valid_lines() -> Vec<Vec<u8>> {
        let msgs = [
            serde_json::to_vec(&FromWorker::Hello {
                id: 3,
                pid: 77,
                token: Some(Secret("t".into())),
                job: Some("job-1".into()),
            }),
            serde_json::to_vec(&FromWorker::Done {
                index: 9,
                loss: 0.5,
                timing: BatchTiming {
                    txn_retries: 4,
                    ..Default::default()
                },
            }),
            serde_json::to_vec(&FromWorker::Failed {
                index: Some(2),
                error: "x".into(),
            }),
            serde_json::to_vec(&ToWorker::Batch {
                index: 5,
                seq: Some(1),
                hold: vec![TxnHold::Commit],
                start: Some(ftrec_data::Position::Tsv {
                    file: 0,
                    file_name: "day_0".into(),
                    offset: 77,
                    line: 3,
                    epoch: 1,
                }),
                fences: "c.1,s0.0,w1.2".into(),
                rewinds: 1,
                restored: 4,
            }),
            serde_json::to_vec(&ToWorker::Connect {
                servers: vec![],
                fences: String::new(),
            }),
            serde_json::to_vec(&ToWorker::Connect {
                servers: vec![],
                fences: "c.0,s1.1".into(),
            }),
        ];
        msgs.into_iter().map(|m| m.unwrap()).collect()
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
            (
                any::<usize>(),
                prop::sample::select(b"\n\"{}[],:0-9e".to_vec())
            )
                .prop_map(|(at, byte)| Mutation::Insert { at, byte }),
            any::<usize>().prop_map(|at| Mutation::Delete { at }),
            any::<usize>().prop_map(|len| Mutation::Truncate { len }),
            (any::<usize>(), prop::sample::select(HUGE.to_vec())).prop_map(|(at, value)| {
                Mutation::Overwrite {
                    at,
                    width: 1,
                    value,
                }
            }),
        ]
    }

    /// Every message on `bytes`, both ways: each line is a message or an error, the stream
    /// ends, and what a coordinator adds up from a worker's timings never overflows.
    fn read_all(bytes: &[u8]) {
        for pass in 0..2 {
            let mut r = std::io::Cursor::new(bytes);
            let mut total = BatchTiming::default();
            for _ in 0..=bytes.len() {
                let got = if pass == 0 {
                    read_line::<FromWorker>(&mut r, "worker 1").map(|m| {
                        if let Some(FromWorker::Done { timing, .. }) = m {
                            total.add(&timing);
                            total.add(&timing);
                        }
                        m.is_some()
                    })
                } else {
                    read_line::<ToWorker>(&mut r, "the coordinator").map(|m| m.is_some())
                };
                if !matches!(got, Ok(true)) {
                    break;
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn control_lines_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            read_all(&bytes);
        }

        #[test]
        fn mutated_control_lines(
            which in prop::collection::vec(0usize..5, 1..4),
            ms in prop::collection::vec(mutation(), 0..5),
        ) {
            let lines = valid_lines();
            let mut text = Vec::new();
            for w in which {
                text.extend_from_slice(&lines[w]);
                text.push(b'\n');
            }
            read_all(&mutated(&text, &ms));
        }
    }

    #[test]
    fn an_overlong_line_is_an_error_not_a_buffer() {
        let mut long = vec![b' '; MAX_LINE + 10];
        long.push(b'\n');
        let e = read_line::<FromWorker>(&mut std::io::Cursor::new(&long), "worker 2").unwrap_err();
        assert!(e.contains("longer than"), "{e}");
    }

    #[test]
    fn timings_with_huge_counters_add_up_without_overflow() {
        let line = br#"{"msg":"done","index":1,"loss":0.0,"timing":{"data_s":0,"pull_s":0,"compute_s":0,"push_s":0,"txn_retries":18446744073709551615}}"#;
        let mut text = line.to_vec();
        text.push(b'\n');
        let Some(FromWorker::Done { timing, .. }) =
            read_line::<FromWorker>(&mut std::io::Cursor::new(&text), "w").unwrap()
        else {
            panic!("a done message");
        };
        let mut total = timing;
        total.add(&timing);
        assert_eq!(total.txn_retries, u64::MAX);
    }
}

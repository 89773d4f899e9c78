//! Commands a test runs to their end without ever hanging the suite: each runs in a process
//! group of its own (the job's servers, workers and merger join it), and a command whose group
//! is still there after [`HANG_AFTER`] (the process itself, or anything it started that still
//! holds its output pipes) is taken for a hang. Then the test fails with what every process of
//! the group was doing (state, kernel wait channel, its threads, and their backtraces where
//! `gdb` is installed) and the output so far, and the group is killed, so the suite goes on.
//!
//! A test that drives processes itself (reads their output as it comes, signals them, waits
//! for them) holds a [`Watchdog`] over them instead, with the same bound and report.
//!
//! The bound is no timing assertion: it is far above what any of these commands takes on a
//! loaded two-core machine, and only stops a hang from using up the run.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a command may run before it is taken for a hang.
pub const HANG_AFTER: Duration = Duration::from_secs(600);

/// Bytes of backtrace kept per process in a hang report.
const BACKTRACE_BYTES: usize = 12 * 1024;

/// A command started by [`spawn_grouped`]: its process, the leader of its own group, and its
/// output read as it comes (so that a full pipe never stops it). Dropped before
/// [`Running::wait_output`], its whole group is killed: a failed test leaves nothing behind.
pub struct Running {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    done: bool,
}

/// Spawn `cmd` in a process group of its own with standard input closed and its output read
/// as it comes.
pub fn spawn_grouped(cmd: &mut Command) -> Running {
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (out, o) = drain(child.stdout.take());
    let (err, e) = drain(child.stderr.take());
    Running {
        child,
        out,
        err,
        readers: o.into_iter().chain(e).collect(),
        done: false,
    }
}

/// [`Command::output`] that never hangs (see the module's doc).
pub fn output(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    spawn_grouped(cmd).wait_output(&what)
}

/// Read a pipe to its end into a buffer that can be looked at before the end.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
) -> (Arc<Mutex<Vec<u8>>>, Option<JoinHandle<()>>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let handle = pipe.map(|mut p| {
        let buf = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = p.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        })
    });
    (buf, handle)
}

impl Running {
    /// The process's pid, which is also its group's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has ended (its status), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Wait for the process to end and its pipes to close, as [`Child::wait_with_output`]
    /// does, for at most [`HANG_AFTER`]; a hang fails the test with the group's report (see
    /// the module's doc). `what` names the command in that report.
    pub fn wait_output(self, what: &str) -> Output {
        self.wait_output_within(what, HANG_AFTER)
    }

    /// [`Running::wait_output`] with a bound of `limit` instead of [`HANG_AFTER`].
    pub fn wait_output_within(mut self, what: &str, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let mut status: Option<ExitStatus> = None;
        loop {
            if status.is_none() {
                status = self.try_wait();
            }
            let pipes_closed = self.readers.iter().all(|h| h.is_finished());
            if let (Some(status), true) = (status, pipes_closed) {
                self.done = true;
                let take = |b: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap());
                return Output {
                    status,
                    stdout: take(&self.out),
                    stderr: take(&self.err),
                };
            }
            if Instant::now() >= deadline {
                let report = group_report(self.id());
                self.kill_group();
                let stderr = String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned();
                panic!(
                    "hang: {what} was still running after {}s ({}); its process group was:\n\
                     {report}\nits standard error so far:\n{stderr}",
                    limit.as_secs(),
                    match status {
                        Some(s) => format!(
                            "it ended with {s}, but a process it started still holds its output"
                        ),
                        None => "it had not ended".to_string(),
                    }
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL the whole group and reap the leader.
    fn kill_group(&mut self) {
        self.done = true;
        // SAFETY: kill(2) on the process group this module created for the command.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.kill_group();
        }
    }
}

/// The fields of `/proc/PID/stat` after the command name: state, ppid, pgrp, ...
fn stat_fields(path: &str) -> Option<(String, Vec<String>)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    Some((comm, rest.split_whitespace().map(str::to_string).collect()))
}

/// What every process of group `pgid` is doing: one paragraph per process.
pub fn group_report(pgid: u32) -> String {
    let pids = all_pids()
        .into_iter()
        .filter(|&pid| {
            stat_fields(&format!("/proc/{pid}/stat"))
                .and_then(|(_, f)| f.get(2)?.parse::<u32>().ok())
                == Some(pgid)
        })
        .collect::<Vec<_>>();
    pids.into_iter().map(process_report).collect()
}

/// Every process id in /proc, in order.
fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Those of `roots` that are still children of this process (not reaped, so their pid was
/// not reused by another), and every process descended from them, parents first.
fn with_descendants(roots: &[u32]) -> Vec<u32> {
    let parent: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| {
            let (_, f) = stat_fields(&format!("/proc/{pid}/stat"))?;
            Some((pid, f.get(1)?.parse().ok()?))
        })
        .collect();
    let me = std::process::id();
    let mut out: Vec<u32> = roots
        .iter()
        .copied()
        .filter(|r| parent.contains(&(*r, me)))
        .collect();
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// What process `pid` is doing (state, parent, kernel wait channel, command line, threads,
/// backtraces): one paragraph; empty when it is gone.
fn process_report(pid: u32) -> String {
    let Some((comm, f)) = stat_fields(&format!("/proc/{pid}/stat")) else {
        return String::new();
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    let mut out = format!(
        "- pid {pid} ({comm}) state {} ppid {} wchan {wchan}: {cmdline}\n",
        f[0], f[1]
    );
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        let mut threads = Vec::new();
        for t in tasks.filter_map(|e| e.ok()) {
            let tid = t.file_name().to_string_lossy().into_owned();
            if let Some((name, tf)) = stat_fields(&format!("/proc/{pid}/task/{tid}/stat")) {
                let wchan = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan"))
                    .unwrap_or_default();
                threads.push(format!("{tid} {name} {} {wchan}", tf[0]));
            }
        }
        out += &format!("  threads: {}\n", threads.join("; "));
    }
    out += &backtraces(pid);
    out
}

/// A guard over processes a test starts and drives itself (reading their output as it
/// comes, signalling them, waiting for them): if the guard still lives [`HANG_AFTER`] after
/// [`watchdog`] made it, the test is taken for hung. Then every watched process the test has
/// not reaped yet and all it started are reported (as [`group_report`] does) and killed, which ends whatever the test
/// was blocked in (a wait, a read of their output), and the test fails with the report.
pub struct Watchdog {
    shared: Arc<(Mutex<Watched>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Watched {
    pids: Vec<u32>,
    done: bool,
    report: Option<String>,
}

/// Start a [`Watchdog`] for the test named `what` (watch nothing yet: see
/// [`Watchdog::watch`]).
pub fn watchdog(what: &str) -> Watchdog {
    watchdog_within(what, HANG_AFTER)
}

/// [`watchdog`] with a bound of `limit` instead of [`HANG_AFTER`].
pub fn watchdog_within(what: &str, limit: Duration) -> Watchdog {
    let shared = Arc::new((Mutex::new(Watched::default()), Condvar::new()));
    let what = what.to_string();
    let thread = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let (lock, cv) = &*shared;
            let (mut w, _) = cv
                .wait_timeout_while(lock.lock().unwrap(), limit, |w| !w.done)
                .unwrap();
            if w.done {
                return;
            }
            let pids = with_descendants(&w.pids);
            let report: String = pids.iter().map(|&p| process_report(p)).collect();
            for &pid in &pids {
                // SAFETY: kill(2) on processes this test started, or that they started.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
            let text = format!(
                "hang: {what} was still running after {}s; its processes (now killed) were:\n\
                 {report}",
                limit.as_secs()
            );
            eprintln!("{text}");
            w.report = Some(text);
        })
    };
    Watchdog {
        shared,
        thread: Some(thread),
    }
}

impl Watchdog {
    /// Watch `child` (and, when the watchdog fires, whatever it started).
    pub fn watch(&self, child: &Child) {
        self.shared.0.lock().unwrap().pids.push(child.id());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap().done = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let report = lock.lock().unwrap().report.take();
        if let (Some(report), false) = (report, std::thread::panicking()) {
            panic!("{report}");
        }
    }
}

/// Every thread's backtrace of process `pid`, where `gdb` is installed (cut short).
fn backtraces(pid: u32) -> String {
    let Ok(run) = Command::new("timeout")
        .args(["60", "gdb", "-batch", "-nx", "-p"])
        .arg(pid.to_string())
        .args(["-ex", "thread apply all bt 24"])
        .stdin(Stdio::null())
        .output()
    else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&run.stdout);
    let kept: String = text
        .lines()
        .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let end = kept
        .char_indices()
        .nth(BACKTRACE_BYTES)
        .map_or(kept.len(), |(i, _)| i);
    format!("  backtraces:\n{}\n", &kept[..end])
}

/// `.bounded_output()` where a test would write `.output()`: the same result, never a hang.
pub trait BoundedOutput {
    /// [`output`] of this command; `Ok` always (a hang fails the test), so that call sites
    /// read as with [`Command::output`].
    fn bounded_output(&mut self) -> std::io::Result<Output>;
}

impl BoundedOutput for Command {
    fn bounded_output(&mut self) -> std::io::Result<Output> {
        Ok(output(self))
    }
}

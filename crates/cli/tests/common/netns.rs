//! Hosts of their own on one machine, for tests of several roles over a network: a network
//! namespace per host, each joined by a veth pair to a bridge in one more namespace (the
//! switch), processes started inside them with `ip netns exec`, and a coordinator's stderr
//! followed line by line. Needs root and iproute2; [`Lab::new`] says why there can be none.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long any one awaited thing may take before the test gives up and says what it was.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// Why this machine cannot run a network-namespace test (`None`: it can try).
pub fn unavailable() -> Option<&'static str> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need root)");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` command (iproute2) on PATH");
    }
    None
}

/// A lab for a network-namespace test, or `None` after printing the one line that says why
/// this machine cannot run it (the test then returns: a skip, not a pass of what it checks).
pub fn lab_or_skip(prefix: char, switch_ip: &str) -> Option<Lab> {
    let lab = match unavailable() {
        Some(why) => Err(why.to_string()),
        None => Lab::new(prefix, switch_ip),
    };
    lab.map_err(|why| println!("skipped: {why}")).ok()
}

/// The settings of the jobs these tests run: `full` on the tiny preset, 2 servers and 2
/// workers, synchronous (so the failure-free digest is the reference), `steps` steps and a
/// checkpoint every `ckpt_every`.
pub fn full_job_args(steps: u64, ckpt_every: u64) -> Vec<String> {
    strings(&[
        "--preset",
        "tiny",
        "--servers",
        "2",
        "--workers",
        "2",
        "--sync",
        "--steps",
        &steps.to_string(),
        "--strategy",
        "full",
        "--ckpt-every-steps",
        &ckpt_every.to_string(),
    ])
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `ip ARGS`, its stderr as the error.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `ip ARGS`, which must succeed.
pub fn must_ip(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// The namespaces, interfaces and processes of one run, named after the test's pid. Dropping
/// it SIGKILLs and reaps every process it started, then deletes every namespace it added
/// (which takes their veth ends, their peers and the bridge with them).
pub struct Lab {
    /// `f<pid>`: the prefix of every name (an interface name holds at most 15 bytes).
    tag: String,
    pub switch: String,
    bridge: String,
    namespaces: Vec<String>,
    pub procs: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

impl Lab {
    /// The switch: a namespace holding a bridge with the address `switch_ip` (a /24), the
    /// names of this lab starting with `prefix` and the test's pid. `Err` says
    /// why there can be none here (the test is skipped).
    pub fn new(prefix: char, switch_ip: &str) -> Result<Lab, String> {
        let tag = format!("{prefix}{}", std::process::id());
        let mut lab = Lab {
            switch: format!("{tag}sw"),
            bridge: format!("{tag}br"),
            tag,
            namespaces: Vec::new(),
            procs: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
        };
        let sw = lab.switch.clone();
        ip(&["netns", "add", &sw]).map_err(|e| format!("`ip netns add` failed ({e})"))?;
        lab.namespaces.push(sw.clone());
        let br = lab.bridge.clone();
        must_ip(&["-n", &sw, "link", "set", "lo", "up"]);
        must_ip(&["-n", &sw, "link", "add", &br, "type", "bridge"]);
        let cidr = format!("{switch_ip}/24");
        must_ip(&["-n", &sw, "addr", "add", &cidr, "dev", &br]);
        must_ip(&["-n", &sw, "link", "set", &br, "up"]);
        Ok(lab)
    }

    /// A host `short` at `addr`: its namespace, and a veth pair from the switch's bridge to
    /// its `eth0`. Returns the namespace.
    pub fn host(&mut self, short: &str, addr: &str) -> String {
        let ns = format!("{}{short}", self.tag);
        must_ip(&["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        must_ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // Made inside the switch, its peer moved straight into the host: no name of the
        // pair ever exists in the root namespace.
        let (sw, br) = (self.switch.clone(), self.bridge.clone());
        let port = ns.clone();
        must_ip(&[
            "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        must_ip(&["-n", &sw, "link", "set", &port, "master", &br]);
        must_ip(&["-n", &sw, "link", "set", &port, "up"]);
        let cidr = format!("{addr}/24");
        must_ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"]);
        must_ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ns
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `ip netns exec NS ftrec ARGS` with the hosts file; its stdout goes to `LOG.log`, and
    /// its stderr too unless `pipe_stderr`. (`ip netns exec` execs the command: the child's
    /// pid is `ftrec`'s.) Returns the process's index.
    pub fn start(&mut self, ns: &str, log: &str, args: &[String], pipe_stderr: bool) -> usize {
        let file = File::options()
            .create(true)
            .append(true)
            .open(self.path(&format!("{log}.log")))
            .unwrap();
        let stderr = if pipe_stderr {
            Stdio::piped()
        } else {
            Stdio::from(file.try_clone().unwrap())
        };
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(env!("CARGO_BIN_EXE_ftrec"))
            .args(args)
            .env("FTREC_HOSTS", self.path("hosts"))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {ns} ftrec: {e}"));
        self.procs.push(child);
        self.procs.len() - 1
    }

    /// SIGKILL process `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        self.procs[i].kill().unwrap();
        self.procs[i].wait().unwrap();
    }

    /// Send `sig` to process `i`.
    pub fn signal(&self, i: usize, sig: libc::c_int) {
        let r = unsafe { libc::kill(self.procs[i].id() as libc::pid_t, sig) };
        assert_eq!(r, 0, "kill({sig}): {}", std::io::Error::last_os_error());
    }

    /// Process `i`'s exit status, once it has exited; `None` if it still runs at the deadline.
    pub fn wait(&mut self, i: usize) -> Option<ExitStatus> {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(s) = self.procs[i].try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of `LOG.log`.
    pub fn log_tail(&self, log: &str) -> String {
        let text = std::fs::read_to_string(self.path(&format!("{log}.log"))).unwrap_or_default();
        tail(
            text.lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
                .as_slice(),
        )
    }
}

pub fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The coordinator's stderr, read line by line as it comes.
pub struct Stderr {
    lines: Arc<Mutex<Vec<String>>>,
    rx: Receiver<String>,
}

impl Stderr {
    pub fn follow(pipe: ChildStderr) -> Stderr {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let keep = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                keep.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Stderr { lines, rx }
    }

    /// Wait for a line holding `text` (a plain line, or a JSON log record whose message
    /// holds it); `what` names the point of the flow for the failure message.
    pub fn wait_for(&self, text: &str, what: &str) {
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{what}: the coordinator printed no line with {text:?} within {DEADLINE:?}; \
                     its stderr ends with:\n{}",
                    self.tail()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "{what}: the coordinator's stderr closed (it exited) without a line with \
                     {text:?}; it ends with:\n{}",
                    self.tail()
                ),
            }
        }
    }

    pub fn tail(&self) -> String {
        tail(&self.lines.lock().unwrap())
    }
}

/// Run `f` on a thread of its own inside network namespace `ns` (`setns` moves only the
/// calling thread), so its sockets see that namespace's network.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

//! `ftrec run`, `ftrec coordinator`, `ftrec server` and `ftrec worker` end to end: real
//! processes of this binary, real SIGKILLs, job files, the JSON report, and clear errors.

use std::io::{BufRead, BufReader};
use std::path::Path;

mod common;
use common::hang::BoundedOutput;
mod compare;
use common::{ftrec, one_error_line, read_json, succeed};

fn run_args(dir: &std::path::Path) -> Vec<String> {
    [
        "run",
        "--preset",
        "tiny",
        "--servers",
        "2",
        "--workers",
        "2",
        "--sync",
        "--steps",
        "10",
        "--batch",
        "32",
        "--eval-samples",
        "256",
        "--seed",
        "3",
        "--work-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.display().to_string()])
    .collect()
}

#[test]
fn full_run_with_a_kill_recovers_and_matches_the_clean_run() {
    let dir = tempfile::tempdir().unwrap();
    let clean_json = dir.path().join("clean.json");
    succeed(
        ftrec()
            .args(run_args(&dir.path().join("clean")))
            .args(["--strategy", "full", "--ckpt-every-steps", "4", "--json"])
            .arg(&clean_json),
    );

    let json = dir.path().join("killed.json");
    let store = dir.path().join("store");
    let out = succeed(
        ftrec()
            .args(run_args(&dir.path().join("killed")))
            .args(["--strategy", "full", "--ckpt-every-steps", "4", "--store"])
            .arg(&store)
            .args(["--kill", "server=0@step=6", "--json"])
            .arg(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("server 0 lost after step 6"), "{stdout}");
    let (clean, killed) = (read_json(&clean_json), read_json(&json));
    assert_eq!(killed["failures"].as_array().unwrap().len(), 1);
    assert_eq!(killed["failures"][0]["steps_redone"], 2);
    assert!(clean["model_digest"].as_str().unwrap().len() >= 16);
    assert_eq!(killed["model_digest"], clean["model_digest"]);
    assert!(killed["auc"].as_f64().is_some());
    for pid in killed["server_pids"].as_array().unwrap() {
        // SAFETY-free check: a reaped process has no /proc entry.
        let pid = pid.as_u64().unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} alive"
        );
    }
    // `full` saves in the servers' checkpoint format: `ckpt` lists, verifies and restores
    // its store. Superseded fulls are collected; the final model (step 10) is left.
    let stdout = |o: std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let ls = stdout(succeed(ftrec().args(["ckpt", "ls"]).arg(&store)));
    assert!(ls.contains(" full "), "{ls}");
    let head = ls.lines().find(|l| l.starts_with("head ")).unwrap();
    assert!(head.starts_with("head 00000000000000000010-full"), "{ls}");
    let v = stdout(succeed(ftrec().args(["ckpt", "verify"]).arg(&store)));
    assert!(v.starts_with("ok "), "{v}");
    let restored = dir.path().join("restored");
    let r = stdout(succeed(
        ftrec()
            .args(["ckpt", "restore"])
            .arg(&store)
            .args(["--out"])
            .arg(&restored),
    ));
    assert!(r.contains("restored step 10"), "{r}");
    succeed(ftrec().args(["ckpt", "verify"]).arg(&restored));
}

#[test]
fn strategy_none_with_a_kill_exits_non_zero_with_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = ftrec()
        .args(run_args(dir.path()))
        .args(["--strategy", "none", "--kill", "server=1@step=3"])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(line.contains("server 1"), "{line}");
}

#[test]
fn bad_run_flags_give_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, needle) in [
        (vec!["--strategy", "ecrek"], "unknown strategy"),
        (vec!["--kill", "server=1"], "ROLE=I@step=S"),
        (vec!["--kill", "worker=2@step=2"], "worker=2"),
        (vec!["--kill", "server=5@step=2"], "server=5"),
        (vec!["--servers", "0"], "--servers"),
        (
            vec!["--store", "/tmp/x"],
            "strategies that save checkpoints",
        ),
        (
            vec!["--strategy", "incrcp", "--quantize", "8"],
            "--quantize does not apply to --strategy incrcp",
        ),
        (
            vec!["--strategy", "cnr", "--quantize", "5"],
            "--quantize must be 8 or 4",
        ),
        (
            vec!["--strategy", "incremental", "--base-reset", "auto"],
            "--base-reset auto",
        ),
        (
            vec!["--strategy", "incrcp", "--extract-threshold", "2"],
            "--extract-threshold",
        ),
        (
            vec!["--strategy", "deck", "--kill", "server=0@phase=piece-write"],
            "piece-write",
        ),
    ] {
        let out = ftrec()
            .args(run_args(dir.path()))
            .args(&extra)
            .bounded_output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
    }
}

/// Start `ftrec server` for a one-server tiny model with `extra` flags and `stdin`, and wait
/// until it has published its address.
fn spawn_server(
    dir: &Path,
    extra: &[&str],
    stdin: std::process::Stdio,
) -> (std::process::Child, std::net::SocketAddr) {
    let port = dir.join("s.port");
    let mut child = ftrec()
        .args(["server", "--id", "0", "--servers", "1", "--preset", "tiny"])
        .args(extra)
        .arg("--port-file")
        .arg(&port)
        .stdin(stdin)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while !port.exists() {
        assert!(child.try_wait().unwrap().is_none(), "server exited early");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let addr = std::fs::read_to_string(&port)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (child, addr)
}

#[test]
fn a_server_exits_when_its_stdin_closes_and_publishes_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let dog = common::hang::watchdog("the server that exits when its stdin closes");
    let (mut child, addr) = spawn_server(
        dir.path(),
        &["--until", "stdin"],
        std::process::Stdio::piped(),
    );
    dog.watch(&child);
    assert!(std::net::TcpStream::connect(addr).is_ok());
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_server_started_by_hand_ignores_stdin_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let dog = common::hang::watchdog("the server stopped by SIGTERM");
    let (mut child, addr) = spawn_server(dir.path(), &[], std::process::Stdio::null());
    dog.watch(&child);
    // Standard input is at end of file from the start, and the server still serves.
    assert!(std::net::TcpStream::connect(addr).is_ok());
    assert!(
        child.try_wait().unwrap().is_none(),
        "server exited on a closed stdin"
    );
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_job_file_runs_the_same_job_as_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "preset = \"tiny\"\nservers = 2\nworkers = 2\nsync = true\nsteps = 10\nbatch = 32\n\
         eval_samples = 256\nseed = 3\nstrategy = \"full\"\nckpt_every_steps = 4\n\
         kill = [\"worker=0@step=5\"]\n",
    )
    .unwrap();
    let from_file = dir.path().join("file.json");
    succeed(
        ftrec()
            .args(["run", "--config"])
            .arg(&job)
            .arg("--work-dir")
            .arg(dir.path().join("a"))
            .arg("--json")
            .arg(&from_file),
    );
    let from_flags = dir.path().join("flags.json");
    succeed(
        ftrec()
            .args(run_args(&dir.path().join("b")))
            .args(["--strategy", "full", "--ckpt-every-steps", "4", "--json"])
            .arg(&from_flags),
    );
    let (a, b) = (read_json(&from_file), read_json(&from_flags));
    assert_eq!(a["model_digest"], b["model_digest"]);
    assert_eq!(a["failures"][0]["role"], "worker");
    // A flag wins over the file.
    let out = ftrec()
        .args(["run", "--config"])
        .arg(&job)
        .args(["--strategy", "nonsense"])
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&out).contains("nonsense"));
}

#[test]
fn a_malformed_job_file_gives_one_error_line_naming_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        ("preset = \"tiny\"\nservers = \"two\"\n", "line 2"),
        ("preset = \"tiny\"\nservrs = 2\n", "servrs"),
        ("preset = [\n", "job.toml"),
        ("strategy = \"ecrec2\"\n", "unknown strategy"),
        ("kill = [\"server=9@step=1\"]\nsteps = 5\n", "server=9"),
    ] {
        let job = dir.path().join("job.toml");
        std::fs::write(&job, text).unwrap();
        let out = ftrec()
            .args(["run", "--config"])
            .arg(&job)
            .bounded_output()
            .unwrap();
        let line = one_error_line(&out);
        assert!(line.contains(needle), "{text:?}: {line}");
    }
    let out = ftrec()
        .args(["run", "--config"])
        .arg(dir.path().join("missing.toml"))
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&out).contains("missing.toml"));
}

#[test]
fn a_coordinator_with_an_unreachable_server_address_gives_one_error_line() {
    // Bind and drop: nothing listens on this port any more.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = ftrec()
        .args([
            "coordinator",
            "--servers",
            "1",
            "--steps",
            "2",
            "--server-addr",
        ])
        .arg(addr.to_string())
        .args(["--heartbeat-timeout-ms", "300", "--start-timeout-s", "1"])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(
        line.contains(&addr.to_string()) && line.contains("unreachable"),
        "{line}"
    );
}

/// The job of `every_role_started_by_hand_trains_the_same_model_as_the_launcher`.
const BY_HAND_JOB: &[&str] = &[
    "--preset",
    "tiny",
    "--servers",
    "2",
    "--workers",
    "2",
    "--sync",
    "--steps",
    "6",
    "--batch",
    "32",
    "--eval-samples",
    "0",
    "--seed",
    "3",
];

#[test]
fn every_role_started_by_hand_trains_the_same_model_as_the_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let dog = common::hang::watchdog("the job whose roles were started by hand");
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for id in 0..2 {
        let port = dir.path().join(format!("s{id}.port"));
        let mut child = ftrec()
            .args([
                "server",
                "--id",
                &id.to_string(),
                "--servers",
                "2",
                "--preset",
                "tiny",
            ])
            .args(["--seed", "3", "--until", "stdin", "--port-file"])
            .arg(&port)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        dog.watch(&child);
        while !port.exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "server {id} exited early"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        addrs.push(std::fs::read_to_string(&port).unwrap().trim().to_string());
        servers.push(child);
    }
    let json = dir.path().join("coord.json");
    // Port 0: a port picked by the test and bound later could be taken in between.
    let mut coord = ftrec()
        .arg("coordinator")
        .args(BY_HAND_JOB)
        .args(["--server-addr", &addrs[0], "--server-addr", &addrs[1]])
        .args(["--control-listen", "127.0.0.1:0", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    dog.watch(&coord);
    let mut lines = BufReader::new(coord.stderr.take().unwrap()).lines();
    let control = format!("127.0.0.1:{}", common::control_port(&mut lines));
    // Drain the rest so the coordinator never blocks on a full pipe.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let mut workers = Vec::new();
    for id in 0..2 {
        let worker = ftrec()
            .args(["worker", "--coordinator", &control, "--id", &id.to_string()])
            .spawn()
            .unwrap();
        dog.watch(&worker);
        workers.push(worker);
    }
    let status = coord.wait().unwrap();
    let rest = rest.join().unwrap();
    assert!(status.success(), "{rest:?}");
    // The coordinator told its workers to stop.
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    for mut s in servers {
        drop(s.stdin.take());
        assert!(s.wait().unwrap().success());
    }
    let by_hand: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let launched = dir.path().join("launched.json");
    succeed(
        ftrec()
            .arg("run")
            .args(BY_HAND_JOB)
            .arg("--json")
            .arg(&launched),
    );
    let launched: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&launched).unwrap()).unwrap();
    assert_eq!(by_hand["model_digest"], launched["model_digest"]);
}

/// Direct children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) start after the last ')'.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = rest.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            out.push(p);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by init) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

#[test]
fn a_killed_coordinator_takes_its_servers_and_workers_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut coord = ftrec()
        .args([
            "run",
            "--preset",
            "tiny",
            "--servers",
            "2",
            "--workers",
            "2",
        ])
        .args([
            "--steps",
            "100000",
            "--batch",
            "32",
            "--eval-samples",
            "0",
            "--work-dir",
        ])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until all four children are up (bounded: the test fails rather than hangs).
    let mut kids = Vec::new();
    for _ in 0..3000 {
        kids = children(coord.id());
        if kids.len() == 4 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(kids.len(), 4, "children of the coordinator: {kids:?}");
    coord.kill().unwrap();
    coord.wait().unwrap();
    for _ in 0..1000 {
        if !kids.iter().any(|&k| alive(k)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let left: Vec<u32> = kids.into_iter().filter(|&k| alive(k)).collect();
    assert!(
        left.is_empty(),
        "still running after the coordinator died: {left:?}"
    );
}

/// `ftrec ckpt ls|verify|restore|gc` on a store of IncrCP pieces: the pieces and their
/// extraction are listed, every file verifies, the newest state restores to a full checkpoint
/// of the final step, and a damaged piece file is named by `verify`.
#[test]
fn ckpt_commands_understand_an_incrcp_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let json = dir.path().join("run.json");
    let mut cmd = ftrec();
    cmd.args(run_args(&dir.path().join("work")))
        .args(["--strategy", "incrcp", "--ckpt-every-steps", "2"])
        .args(["--base-reset", "never", "--store"])
        .arg(&store)
        .arg("--json")
        .arg(&json);
    succeed(&mut cmd);
    let rep = read_json(&json);
    assert_eq!(rep["store"]["fulls"], 1, "{}", rep["store"]);
    assert_eq!(rep["store"]["pieces"], 4, "{}", rep["store"]);
    let ls = String::from_utf8(succeed(ftrec().args(["ckpt", "ls"]).arg(&store)).stdout).unwrap();
    assert!(
        ls.contains("chunk_list") || ls.contains("chunk-list"),
        "{ls}"
    );
    assert!(ls.contains("extraction:"), "{ls}");
    succeed(ftrec().args(["ckpt", "verify"]).arg(&store));
    let out = dir.path().join("restored");
    let restored = String::from_utf8(
        succeed(
            ftrec()
                .args(["ckpt", "restore"])
                .arg(&store)
                .arg("--out")
                .arg(&out),
        )
        .stdout,
    )
    .unwrap();
    assert!(restored.contains("restored step 10"), "{restored}");
    succeed(ftrec().args(["ckpt", "gc"]).arg(&store));
    succeed(ftrec().args(["ckpt", "verify"]).arg(&store));
    // Flip one byte of a piece index: verify names it and fails.
    let pidx = walk(&store)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "pidx"))
        .expect("a piece index");
    let mut b = std::fs::read(&pidx).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x40;
    std::fs::write(&pidx, b).unwrap();
    let v = ftrec()
        .args(["ckpt", "verify"])
        .arg(&store)
        .bounded_output()
        .unwrap();
    assert_eq!(v.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&v.stdout);
    assert!(
        stdout.contains("DAMAGED") && stdout.contains("piece.pidx"),
        "{stdout}"
    );
    // It names the newest state no damage takes down, and a restore with --fallback goes
    // there, saying which states it skipped.
    assert!(stdout.contains("newest intact state: "), "{stdout}");
    let fell_back = String::from_utf8(
        succeed(
            ftrec()
                .args(["ckpt", "restore", "--fallback"])
                .arg(&store)
                .arg("--out")
                .arg(dir.path().join("restored-fallback")),
        )
        .stdout,
    )
    .unwrap();
    assert!(fell_back.contains("restored step"), "{fell_back}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

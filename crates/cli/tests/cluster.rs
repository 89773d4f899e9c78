//! `ftrec run` and `ftrec server` end to end: real server processes of this binary, a real
//! SIGKILL, the JSON report, and clear errors.

use std::path::Path;
use std::process::Command;

fn ftrec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftrec"))
}

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
    let out = ftrec()
        .args(run_args(&dir.path().join("clean")))
        .args(["--strategy", "full", "--ckpt-every-steps", "4", "--json"])
        .arg(&clean_json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let json = dir.path().join("killed.json");
    let out = ftrec()
        .args(run_args(&dir.path().join("killed")))
        .args(["--strategy", "full", "--ckpt-every-steps", "4"])
        .args(["--kill", "server=0@step=6", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("server 0 killed after step 6"), "{stdout}");

    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let (clean, killed) = (read(&clean_json), read(&json));
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
}

#[test]
fn strategy_none_with_a_kill_exits_non_zero_with_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = ftrec()
        .args(run_args(dir.path()))
        .args(["--strategy", "none", "--kill", "server=1@step=3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ftrec: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("server 1"), "{stderr}");
}

#[test]
fn bad_run_flags_give_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, needle) in [
        (vec!["--strategy", "ecrec"], "unknown strategy"),
        (vec!["--kill", "server=1"], "server=I@step=S"),
        (vec!["--kill", "server=5@step=2"], "server=5"),
        (vec!["--servers", "0"], "--servers"),
    ] {
        let out = ftrec()
            .args(run_args(dir.path()))
            .args(&extra)
            .output()
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
    let (mut child, addr) = spawn_server(
        dir.path(),
        &["--until", "stdin"],
        std::process::Stdio::piped(),
    );
    assert!(std::net::TcpStream::connect(addr).is_ok());
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_server_started_by_hand_ignores_stdin_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = spawn_server(dir.path(), &[], std::process::Stdio::null());
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

//! What the README promises a user, each held by the binary: read-only store commands never
//! create a store; a socket off loopback needs a token (or `--insecure`); every kill ends as
//! fired or not fired in the report and on stderr; a whole job killed at a step resumes with
//! training left to do; samples/s is samples trained over training time wherever it shows.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, one_error_line, read_json, succeed};

fn tiny_run(dir: &Path, steps: u64) -> std::process::Command {
    let mut c = ftrec();
    c.args([
        "run",
        "--preset",
        "tiny",
        "--servers",
        "2",
        "--workers",
        "1",
        "--sync",
        "--batch",
        "32",
        "--eval-samples",
        "0",
        "--steps",
    ])
    .arg(steps.to_string())
    .arg("--work-dir")
    .arg(dir.join("work"));
    c
}

#[test]
fn read_only_store_commands_on_a_path_that_is_not_a_store_fail_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-store");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (store, why) in [
        (&missing, "does not exist"),
        (&empty, "is not a checkpoint store"),
    ] {
        let s = store.to_str().unwrap();
        let out_dir = dir.path().join("restored");
        let out_file = dir.path().join("model.safetensors");
        let commands: Vec<Vec<&str>> = vec![
            vec!["ckpt", "ls", s],
            vec!["ckpt", "verify", s],
            vec!["ckpt", "gc", s],
            vec!["ckpt", "merge", s],
            vec!["ckpt", "restore", s, "--out", out_dir.to_str().unwrap()],
            vec!["ckpt", "export", s, "--out", out_file.to_str().unwrap()],
        ];
        for args in commands {
            let out = ftrec().args(&args).bounded_output().unwrap();
            let line = one_error_line(&out);
            assert!(line.contains(s) && line.contains(why), "{args:?}: {line}");
            assert!(!missing.exists(), "{args:?} created {s}");
            assert_eq!(
                std::fs::read_dir(&empty).unwrap().count(),
                0,
                "{args:?} wrote into {}",
                empty.display()
            );
            assert!(!out_dir.exists() && !out_file.exists(), "{args:?}");
        }
    }
}

#[test]
fn sockets_off_loopback_need_a_token_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let server = |extra: &[&str]| {
        ftrec()
            .args([
                "server",
                "--id",
                "0",
                "--servers",
                "1",
                "--preset",
                "tiny",
                "--until",
                "stdin",
                "--listen",
                "0.0.0.0:0",
            ])
            .args(extra)
            .env_remove("FTREC_AUTH_TOKEN")
            .stdin(Stdio::null())
            .bounded_output()
            .unwrap()
    };
    let line = one_error_line(&server(&[]));
    assert!(
        line.contains("--listen 0.0.0.0:0")
            && line.contains("head -c 32 /dev/urandom | base64")
            && line.contains("--auth-token-file")
            && line.contains("--insecure"),
        "{line}"
    );
    // With --insecure, or a token, it serves (and ends at the end of its stdin).
    let out = server(&["--insecure"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-of-this-test\n").unwrap();
    let out = server(&["--auth-token-file", token.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The control socket of a run and of a coordinator alone.
    let out = tiny_run(dir.path(), 2)
        .args(["--control-listen", "0.0.0.0:0"])
        .env_remove("FTREC_AUTH_TOKEN")
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(line.contains("--control-listen 0.0.0.0:0"), "{line}");
    let out = ftrec()
        .args([
            "coordinator",
            "--preset",
            "tiny",
            "--servers",
            "1",
            "--workers",
            "1",
            "--server-addr",
            "127.0.0.1:9",
            "--control-listen",
            "0.0.0.0:0",
        ])
        .env_remove("FTREC_AUTH_TOKEN")
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(line.contains("--control-listen 0.0.0.0:0"), "{line}");
}

#[test]
fn every_kill_ends_fired_or_not_fired_in_the_report_and_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = succeed(
        tiny_run(dir.path(), 6)
            .args(["--strategy", "full", "--ckpt-every-steps", "2"])
            .args([
                "--kill",
                "server=1@step=3",
                "--kill",
                "worker=0@time=100000",
            ])
            .arg("--json")
            .arg(&json),
    );
    let r = read_json(&json);
    let kills = r["kills"].as_array().unwrap();
    assert_eq!(kills.len(), 2, "{kills:?}");
    assert_eq!(kills[0]["kill"], "server=1@step=3");
    assert_eq!(kills[0]["fired"], true);
    assert_eq!(kills[0]["step"], 3);
    assert_eq!(kills[1]["kill"], "worker=0@time=100000");
    assert_eq!(kills[1]["fired"], false);
    assert!(kills[1]["not_fired"]
        .as_str()
        .unwrap()
        .contains("before 100000 s"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ftrec run: kill server=1@step=3: fired after step 3"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ftrec run: kill worker=0@time=100000: NOT FIRED"),
        "{stderr}"
    );
    // A step kill past the last step cannot fire: refused before anything runs.
    let line = one_error_line(
        &tiny_run(dir.path(), 6)
            .args(["--kill", "job@step=6"])
            .bounded_output()
            .unwrap(),
    );
    assert!(
        line.contains("job@step=6") && line.contains("1..6"),
        "{line}"
    );
}

#[test]
fn a_job_killed_as_a_whole_at_a_step_resumes_and_trains_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = tiny_run(dir.path(), 12)
        .args(["--strategy", "full", "--ckpt-every-steps", "3"])
        .arg("--store")
        .arg(&store)
        .args(["--kill", "job@step=7"])
        .bounded_output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIGKILLed the whole job after step 7"),
        "{stderr}"
    );
    let json = dir.path().join("resumed.json");
    let out = succeed(
        ftrec()
            .arg("run")
            .arg("--resume")
            .arg(&store)
            .arg("--work-dir")
            .arg(dir.path().join("work2"))
            .arg("--json")
            .arg(&json),
    );
    let r = read_json(&json);
    let from = r["resumed"]["step"].as_u64().unwrap();
    assert!((3..=7).contains(&from), "resumed from step {from}");
    assert_eq!(r["steps"], 12);
    // Samples/s: samples this run trained over its training time, in the report and the
    // summary alike.
    let trained = r["samples_trained"].as_u64().unwrap();
    assert_eq!(trained, (12 - from) * 32);
    let train_s = r["train_s"].as_f64().unwrap();
    let sps = r["samples_per_s"].as_f64().unwrap();
    assert!(train_s > 0.0);
    assert!(
        (sps - trained as f64 / train_s).abs() <= 1e-9 * sps,
        "{sps}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "trained {trained} samples in {train_s:.2}s of training ({sps:.0} samples/s)"
        )),
        "{stdout}"
    );
}

#[test]
fn a_drawn_kill_after_the_end_of_a_run_is_reported_not_fired_in_compare() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let o = succeed(
        ftrec()
            .args([
                "compare",
                "--preset",
                "tiny",
                "--servers",
                "2",
                "--workers",
                "1",
            ])
            .args([
                "--sync",
                "--steps",
                "4",
                "--batch",
                "32",
                "--eval-samples",
                "256",
            ])
            // An MTBF of a million seconds: the seeded kill falls long after a 4-step run.
            .args(["--mtbf-s", "1000000", "--max-kills", "1", "--seed", "5"])
            .args(["--strategies", "full", "--out"])
            .arg(&out),
    );
    let rep = read_json(&out.join("report.json"));
    let full = rep["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["strategy"] == "full")
        .unwrap()
        .clone();
    assert_eq!(full["kills_fired"], serde_json::json!([0, 1]), "{full}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("compare: full: kill server=") && stderr.contains("NOT FIRED"),
        "{stderr}"
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("0 (0/1)"), "{table}");
}

#[test]
fn compare_refuses_a_whole_job_kill_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = ftrec()
        .args(["compare", "--kills", "server=0@step=2,job@step=3", "--out"])
        .arg(dir.path().join("cmp"))
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(
        line.contains("job@step=3") && line.contains("kill servers"),
        "{line}"
    );
    assert!(!dir.path().join("cmp").exists());
}

#[test]
fn certs_writes_the_three_files_of_mutual_tls_once() {
    let dir = tempfile::tempdir().unwrap();
    let certs = || {
        ftrec()
            .args([
                "certs",
                "--name",
                "run",
                "--host",
                "127.0.0.1,localhost",
                "--dir",
            ])
            .arg(dir.path())
            .bounded_output()
            .unwrap()
    };
    let out = certs();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["ca.pem", "run-cert.pem", "run-key.pem"] {
        let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(text.starts_with("-----BEGIN "), "{f}: {text}");
    }
    // An existing file is kept.
    let line = one_error_line(&certs());
    assert!(
        line.contains("ca.pem") && line.contains("--force"),
        "{line}"
    );
}

/// The suite's own guard: a command that leaves a process holding its output is a hang, and
/// the test fails naming what each process of its group was doing, instead of the suite
/// waiting for ever; the group is killed.
#[test]
fn a_command_whose_child_holds_its_output_fails_as_a_hang_naming_the_processes() {
    let running = common::hang::spawn_grouped(
        std::process::Command::new("sh").args(["-c", "sleep 1000 & echo started >&2; exit 0"]),
    );
    let pgid = running.id();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        running.wait_output_within("sh", std::time::Duration::from_secs(2))
    }));
    let msg = match caught {
        Ok(out) => panic!("not taken for a hang: {out:?}"),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into()),
    };
    assert!(msg.starts_with("hang: sh was still running"), "{msg}");
    assert!(msg.contains("still holds its output"), "{msg}");
    assert!(
        msg.contains("(sleep)") && msg.contains("sleep 1000"),
        "{msg}"
    );
    assert!(msg.contains("started"), "{msg}");
    // The kill is delivered, and the orphan reaped, a moment after it is sent: polled, with a
    // bound that only stops a hang. SAFETY: kill(2) with signal 0 only asks whether the group
    // still has a process.
    let gone = || unsafe { libc::kill(-(pgid as libc::pid_t), 0) } != 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !gone() {
        assert!(std::time::Instant::now() < deadline, "the group was left");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A test that drives processes itself (waits for them, reads their output as it comes) and
/// blocks on one that never ends fails with what the process and everything it started were
/// doing, instead of the suite waiting for ever; they are killed, which ends the wait.
#[test]
fn a_test_blocked_on_a_process_it_drives_fails_as_a_hang_naming_it_and_its_children() {
    let dog = common::hang::watchdog_within("the blocked test", std::time::Duration::from_secs(2));
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 1001 & echo started; wait"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    dog.watch(&child);
    // The shell has started its child once it says so.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "started\n");
    // Blocks until the watchdog kills the shell: it never ends by itself.
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status}");
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(dog)));
    let msg = match caught {
        Ok(()) => panic!("not taken for a hang"),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into()),
    };
    assert!(
        msg.starts_with("hang: the blocked test was still running"),
        "{msg}"
    );
    assert!(
        msg.contains("(sh)") && msg.contains("sleep 1001 &"),
        "{msg}"
    );
    assert!(msg.contains("(sleep)"), "{msg}");
}

/// A watchdog dropped in time does nothing to the processes it watched (nor fails the test).
#[test]
fn a_watchdog_dropped_in_time_leaves_its_processes_alone() {
    let dog = common::hang::watchdog("the quick test");
    let mut child = std::process::Command::new("sh")
        .args(["-c", "read line; exit 3"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    dog.watch(&child);
    drop(dog);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the watched process was ended"
    );
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(3));
}

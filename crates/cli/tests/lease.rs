//! One writer per store: while a job runs, a second `ftrec run` on its store and a
//! `--resume` of it are refused with one line naming the holder; once the job is gone (killed
//! here, so its holder is provably dead), `--resume` takes the store over with the next
//! generation, which `CURRENT` then carries, and gives the lease up when it ends. A job paused
//! past its lease and taken over is fenced when it wakes.

mod common;
use common::hang::BoundedOutput;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{ftrec, one_error_line, read_json, succeed};

const JOB: &[&str] = &[
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
    "--seed",
    "5",
    "--strategy",
    "full",
    "--ckpt-every-steps",
    "100",
    "--steps",
    "600",
];

fn lease(store: &Path) -> serde_json::Value {
    read_json(&store.join("LEASE"))
}

/// Start the job on `store` with `extra` flags and wait for its first commit (a condition,
/// not a duration; the bound only stops a hang).
fn start_and_commit(store: &Path, extra: &[&str], stderr: Stdio) -> std::process::Child {
    let mut job = Command::new(env!("CARGO_BIN_EXE_ftrec"))
        .arg("run")
        .args(JOB)
        .args(["--store", store.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !store.join("CURRENT").exists() {
        assert!(std::time::Instant::now() < deadline, "no commit in 120 s");
        assert!(job.try_wait().unwrap().is_none(), "the job ended");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    job
}

#[test]
fn a_live_job_keeps_its_store_and_a_resume_takes_over_once_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    // A job that commits at step 100 and trains on to step 600.
    let dog = common::hang::watchdog("the live job");
    let mut first = start_and_commit(&store, &[], Stdio::null());
    dog.watch(&first);
    assert_eq!(lease(&store)["generation"], 1);
    let second = ftrec()
        .arg("run")
        .args(JOB)
        .args(["--store", s])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&second);
    assert!(line.contains("is held by"), "{line}");
    assert!(line.contains(&format!(":{}", first.id())), "{line}");
    let resume = ftrec()
        .args(["run", "--resume", s])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&resume);
    assert!(line.contains("is held by"), "{line}");
    // The job dies; its lease is free at once (its holder is gone on this host).
    first.kill().unwrap();
    first.wait().unwrap();
    let report = dir.path().join("r.json");
    succeed(ftrec().args(["run", "--resume", s, "--json"]).arg(&report));
    let l = lease(&store);
    assert_eq!(l["generation"], 2, "{l}");
    assert_eq!(l["released"], true, "{l}");
    // A fresh run on the used store is pointed to --resume.
    let fresh = ftrec()
        .arg("run")
        .args(JOB)
        .args(["--store", s])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&fresh);
    assert!(line.contains("--resume"), "{line}");
}

/// Send `sig` to `pid` (a child of this test).
fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig} {pid}");
}

/// A coordinator paused (SIGSTOP) past its lease is taken over by a resume; woken after the
/// resume has finished, it stops with one line naming the fence, exits with status 3, and
/// leaves `CURRENT` where the resume put it; the resume ends with the uninterrupted model.
#[test]
fn a_coordinator_paused_past_its_lease_is_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let dog = common::hang::watchdog("the paused coordinator");
    let first = start_and_commit(&store, &["--lease-ttl-s", "2"], Stdio::piped());
    dog.watch(&first);
    // Paused outside a swap of the store: paused inside one (its lease renewal), it would keep
    // the store's lock, and the resume would fail naming it (a paused writer blocks the others
    // of a local store; the swap's own test covers that).
    assert!(ftrec_ckpt::store::local::stop_outside_swaps(
        first.id(),
        Some(&store)
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    // Its lease runs out (a condition on the store's record; the bound only stops a hang).
    loop {
        let l = lease(&store);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        if l["expires_unix_ms"].as_u64().unwrap() < now {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never expired"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let report = dir.path().join("r.json");
    succeed(ftrec().args(["run", "--resume", s, "--json"]).arg(&report));
    assert_eq!(lease(&store)["generation"], 2);
    let current = std::fs::read(store.join("CURRENT")).unwrap();
    // The paused coordinator wakes: it finds out at its next renewal or commit, whichever
    // comes first, and stops.
    signal(first.id(), "-CONT");
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let line = one_error_line(&out);
    assert!(line.contains("fenced"), "{line}");
    assert_eq!(std::fs::read(store.join("CURRENT")).unwrap(), current);
    // The resume ended with the uninterrupted run's model.
    let clean = dir.path().join("clean.json");
    succeed(
        ftrec()
            .arg("run")
            .args(JOB)
            .args([
                "--store",
                dir.path().join("clean").to_str().unwrap(),
                "--json",
            ])
            .arg(&clean),
    );
    assert_eq!(
        read_json(&report)["model_digest"],
        read_json(&clean)["model_digest"]
    );
}

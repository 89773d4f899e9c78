//! A whole job frozen as a paused host (`--kill stop:job@step=S`: its coordinator, servers,
//! workers and merger SIGSTOPped) while its lease runs out; `ftrec run --resume` takes the
//! store over and finishes the job; then the frozen job is woken (SIGCONT to its process
//! group). The woken coordinator must find at its first check that it holds no lease, stop
//! with a `fenced` line and status 3 (a process of the job that woke mid-work, the merger,
//! may say the same; nobody says anything else), and take its processes with it; the resume ends with
//! the uninterrupted run's model; and nothing the woken job does lands in the store (every
//! file of the store is as the resume left it, byte for byte, and the store verifies).
//!
//! One strategy with a merger runs in the default suite; every strategy that writes a store
//! is `every_strategy_frozen_and_taken_over` (ignored; `scripts/kill-matrix.sh` runs it).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{ftrec, hang, read_json, succeed};

/// Steps of every job here; the freeze comes after step 7 (saves every 3 steps).
const STEPS: u64 = 24;

fn job(strategy: &[&str]) -> Vec<String> {
    [
        "run",
        "--preset",
        "tiny",
        "--servers",
        "2",
        "--workers",
        "2",
        "--sync",
        "--batch",
        "32",
        "--eval-samples",
        "0",
        "--seed",
        "7",
        "--steps",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([STEPS.to_string()])
    .chain(strategy.iter().map(|s| s.to_string()))
    .collect()
}

/// Poll `done` (a condition, not a duration; the bound only stops a hang).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "no {what} within 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether any process of process group `pgid` still exists.
fn group_alive(pgid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 sends nothing; it only asks whether the group exists.
    unsafe { libc::kill(-(pgid as libc::pid_t), 0) == 0 }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Every file under `dir`, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), bytes);
            }
        }
    }
    out
}

fn frozen_and_taken_over(strategy: &[&str], exact: bool) {
    let dir = tempfile::tempdir().unwrap();
    let args = job(strategy);
    let clean = dir.path().join("clean.json");
    succeed(
        ftrec()
            .args(&args)
            .arg("--work-dir")
            .arg(dir.path().join("clean"))
            .arg("--json")
            .arg(&clean),
    );
    let clean = read_json(&clean);

    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    // A process group of its own: its servers, workers and merger join it, and the wake-up
    // reaches them all at once, as a host's does.
    let mut first = hang::spawn_grouped(
        ftrec()
            .args(&args)
            .args([
                "--store",
                s,
                "--lease-ttl-s",
                "2",
                "--kill",
                "stop:job@step=7",
            ])
            .arg("--work-dir")
            .arg(dir.path().join("first")),
    );
    let pgid = first.id();
    wait_for("frozen coordinator", || {
        assert!(first.try_wait().is_none(), "the job ended unfrozen");
        ftrec_ckpt::store::local::process_state(pgid) == Some('T')
    });
    wait_for("expired lease", || {
        let l = read_json(&store.join("LEASE"));
        l["expires_unix_ms"].as_u64().unwrap() < now_ms()
    });
    let report = dir.path().join("resumed.json");
    succeed(
        ftrec()
            .args(["run", "--resume", s, "--json"])
            .arg(&report)
            .arg("--work-dir")
            .arg(dir.path().join("resumed")),
    );
    let resumed = read_json(&report);
    // Quantized pieces restore an approximate model: only exact strategies end at the digest.
    if exact {
        assert_eq!(resumed["model_digest"], clean["model_digest"]);
    }
    let lease = read_json(&store.join("LEASE"));
    assert_eq!(lease["generation"], 2, "{lease}");
    assert_eq!(lease["released"], true, "{lease}");
    let before = files(&store);

    // SAFETY: kill(2) on the process group this test created.
    assert_eq!(
        unsafe { libc::kill(-(pgid as libc::pid_t), libc::SIGCONT) },
        0
    );
    let out = first.wait_output("the woken job");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    // The coordinator says it in one line; a process of the job that woke in the middle of
    // its own work (the merger) may say it too, and nothing else.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ftrec: error:"))
        .collect();
    assert!(!errors.is_empty(), "{stderr}");
    assert!(errors.iter().all(|l| l.contains("fenced")), "{stderr}");
    wait_for("the frozen job's processes to exit", || !group_alive(pgid));

    let after = files(&store);
    let changed: Vec<_> = after
        .iter()
        .filter(|(p, b)| before.get(*p) != Some(b))
        .map(|(p, _)| p.display().to_string())
        .chain(
            before
                .keys()
                .filter(|p| !after.contains_key(*p))
                .map(|p| format!("{} (deleted)", p.display())),
        )
        .collect();
    assert!(
        changed.is_empty(),
        "the woken job wrote to the store: {changed:?}"
    );
    succeed(ftrec().args(["ckpt", "verify", s]));
}

/// DECK with its merger (a merger pass after each commit): the case the default suite runs.
#[test]
fn a_frozen_deck_job_taken_over_writes_nothing_when_it_wakes() {
    frozen_and_taken_over(&["--strategy", "deck", "--delta-every-steps", "3"], true);
}

/// Every strategy that writes a store (`ecrec` and `none` write none), each case's outcome
/// written to the file `KILL_MATRIX_FROZEN` names, if set (`scripts/kill-matrix.sh` puts them
/// in the kill matrix's table).
#[test]
#[ignore = "every strategy: scripts/kill-matrix.sh runs it"]
fn every_strategy_frozen_and_taken_over() {
    let cases: [(&str, &[&str], bool); 7] = [
        (
            "full",
            &["--strategy", "full", "--ckpt-every-steps", "3"],
            true,
        ),
        (
            "deck",
            &["--strategy", "deck", "--delta-every-steps", "3"],
            true,
        ),
        (
            "cpr",
            &["--strategy", "cpr", "--ckpt-every-steps", "3"],
            true,
        ),
        (
            "incrcp",
            &["--strategy", "incrcp", "--ckpt-every-steps", "3"],
            true,
        ),
        (
            "incremental",
            &["--strategy", "incremental", "--ckpt-every-steps", "3"],
            true,
        ),
        (
            "cnr",
            &["--strategy", "cnr", "--ckpt-every-steps", "3"],
            true,
        ),
        (
            "cnr-q8",
            &[
                "--strategy",
                "cnr",
                "--ckpt-every-steps",
                "3",
                "--quantize",
                "8",
            ],
            false,
        ),
    ];
    let mut results = serde_json::Map::new();
    for (label, strategy, exact) in cases {
        eprintln!("frozen and taken over: {label}");
        let r = std::panic::catch_unwind(|| frozen_and_taken_over(strategy, exact));
        let outcome = match r {
            Ok(()) => "pass".to_string(),
            Err(e) => e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        };
        eprintln!("  {label}: {outcome}");
        results.insert(label.to_string(), outcome.into());
    }
    if let Some(out) = std::env::var_os("KILL_MATRIX_FROZEN") {
        std::fs::write(out, serde_json::to_string_pretty(&results).unwrap()).unwrap();
    }
    let failed: Vec<_> = results.iter().filter(|(_, v)| *v != "pass").collect();
    assert!(failed.is_empty(), "{failed:?}");
}

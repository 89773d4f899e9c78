//! The roles' HTTP endpoint (`--metrics-listen`) and log format (`--log-format`) end to end:
//! a scrape of `ftrec run`'s `/metrics` after a run with a known number of steps, saves and
//! failures holds exactly those counts; `/healthz` and `/readyz` answer; JSON logs are one
//! object a line with the run's events among them; bad flags are one error line before any
//! work.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, http_get, metric, one_error_line, read_json, succeed};

/// A GET of `path`: status code and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path).unwrap()
}

/// The value of the series `series` (with its labels as written) in an OpenMetrics body.
fn value(body: &str, series: &str) -> f64 {
    metric(body, series).unwrap_or_else(|| panic!("no series {series} in\n{body}"))
}

/// Lines of `child`'s stderr as they come.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines() {
            let Ok(l) = l else { return };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next line containing `what` (the test fails, naming it, if the process ends first).
fn wait_for(rx: &mpsc::Receiver<String>, what: &str, seen: &mut Vec<String>) -> String {
    loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(l) if l.contains(what) => {
                seen.push(l.clone());
                return l;
            }
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {what:?}; stderr:\n{}", seen.join("\n")),
        }
    }
}

#[test]
fn a_scrape_after_a_run_counts_its_steps_saves_and_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut child = ftrec()
        .args([
            "run",
            "--preset",
            "tiny",
            "--servers",
            "2",
            "--workers",
            "2",
            "--sync",
            "--steps",
            "24",
            "--strategy",
            "full",
            "--ckpt-every-steps",
            "5",
            "--kill",
            "server=1@step=12",
            "--eval-samples",
            "0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-linger-s",
            "600",
        ])
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let dog = common::hang::watchdog("the scraped run");
    dog.watch(&child);
    let rx = lines(&mut child);
    let mut seen = Vec::new();
    let at = wait_for(&rx, "metrics at http://", &mut seen);
    let addr: SocketAddr = at
        .split("http://")
        .nth(1)
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(get(addr, "/healthz").0, 200);
    // The run ended and its report is written; the endpoint lingers.
    wait_for(&rx, "serving metrics", &mut seen);
    let (status, body) = get(addr, "/metrics");
    let (ready, _) = get(addr, "/readyz");
    let _ = child.kill();
    child.wait().unwrap();
    assert_eq!(status, 200);
    assert_eq!(ready, 503, "a job that ended is not ready");
    let rep = read_json(&json);
    let redone: u64 = rep["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["steps_redone"].as_u64().unwrap())
        .sum();
    assert_eq!(value(&body, "ftrec_steps_total"), (24 + redone) as f64);
    assert_eq!(value(&body, "ftrec_step"), 24.0);
    assert_eq!(
        value(&body, "ftrec_samples_total"),
        ((24 + redone) * 2 * rep["config"]["batch"].as_u64().unwrap()) as f64
    );
    assert_eq!(value(&body, "ftrec_failures_total{role=\"server\"}"), 1.0);
    assert_eq!(value(&body, "ftrec_recoveries_total{role=\"server\"}"), 1.0);
    assert_eq!(value(&body, "ftrec_live_processes{role=\"server\"}"), 2.0);
    for phase in ["detect", "replace", "reload", "redo"] {
        let s = format!("ftrec_recovery_phase_seconds_count{{phase=\"{phase}\"}}");
        assert_eq!(value(&body, &s), 1.0, "{phase}");
    }
    assert_eq!(
        value(
            &body,
            "ftrec_checkpoints_total{strategy=\"full\",outcome=\"committed\"}"
        ),
        rep["checkpoints"].as_f64().unwrap()
    );
    assert_eq!(
        value(&body, "ftrec_checkpoint_bytes_total{strategy=\"full\"}"),
        rep["bytes_written"].as_f64().unwrap()
    );
    assert_eq!(
        value(
            &body,
            "ftrec_checkpoint_pause_seconds_count{strategy=\"full\"}"
        ),
        rep["checkpoints"].as_f64().unwrap()
    );
}

#[test]
fn json_logs_are_one_object_a_line_with_the_runs_events() {
    let out = succeed(ftrec().args([
        "run",
        "--preset",
        "tiny",
        "--servers",
        "2",
        "--workers",
        "1",
        "--sync",
        "--steps",
        "4",
        "--eval-samples",
        "0",
        "--log-format",
        "json",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let records: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        records
            .iter()
            .any(|r| r["fields"]["kind"] == "WorkersStarted" && r["level"] == "INFO"),
        "{stderr}"
    );
    assert!(records.iter().any(|r| r["fields"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("ftrec run: preset tiny"))));
}

#[test]
fn bad_observability_flags_are_one_line_before_any_work() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    let run = ["run", "--preset", "tiny", "--steps", "2"];
    let out = ftrec()
        .args(run)
        .args(["--metrics-listen", &taken])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(
        line.contains(&format!("--metrics-listen {taken}")),
        "{line}"
    );
    let out = ftrec()
        .args(run)
        .args(["--metrics-listen", "127.0.0.1:0", "--metrics-linger-s=-1"])
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&out).contains("--metrics-linger-s"));
    for (flags, names) in [
        (&["--log-format", "yaml"][..], "--log-format"),
        (&["--metrics-linger-s", "5"][..], "--metrics-listen"),
    ] {
        let out = ftrec().args(run).args(flags).bounded_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(names), "{stderr}");
    }
    let out = ftrec()
        .args([
            "server",
            "--id",
            "web-x",
            "--servers",
            "2",
            "--preset",
            "tiny",
        ])
        .bounded_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("StatefulSet"),
        "{stderr}"
    );
}

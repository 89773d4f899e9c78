//! A partition: server 1, on a host of its own, loses its link to the coordinator while the
//! workers still reach it. Every role runs in a network namespace of its own behind one bridge
//! (`common::netns`), servers started as an orchestrator starts them (no incarnation given;
//! each takes the epoch the coordinator names at its first request) and dialled by name
//! through a hosts file ($FTREC_HOSTS).
//!
//! When the coordinator waits for server 1's loss ("kill it now"), the link between the two
//! goes down: a blackhole route on each side, so the coordinator's packets to the server and
//! the server's to the coordinator vanish, and nothing else changes. The coordinator finds the
//! server silent, raises its epoch and waits for a server 1 at its name ("come back at"): a
//! replacement starts on another host, at another address, and the name moves there. The
//! coordinator restores every server from the last checkpoint and has the workers connect
//! again, handing them its table of epochs; before a worker drops its connection to the old
//! server 1 it sends the table there. The cut-off server learns from it that it was replaced,
//! refuses everything from then on and exits by itself with status 3 and one `fenced` line;
//! the job ends with the failure-free run's model digest.
//!
//! Needs root and iproute2: otherwise one `skipped: ...` line says why, and the test passes.

mod common;

use std::process::Command;

use common::netns::{full_job_args, lab_or_skip, must_ip, strings, Lab, Stderr, DEADLINE};
use common::{read_json, succeed};

/// Steps of the job, the step after which the link goes down, the checkpoint interval.
const STEPS: u64 = 24;
const CUT_STEP: u64 = 10;
const CKPT_EVERY: u64 = 4;

const SWITCH_IP: &str = "10.78.0.1";
const SERVER_IPS: [&str; 2] = ["10.78.0.10", "10.78.0.11"];
/// Where server 1's replacement runs.
const REPLACEMENT_IP: &str = "10.78.0.12";
const COORDINATOR_IP: &str = "10.78.0.20";
const WORKER_IPS: [&str; 2] = ["10.78.0.30", "10.78.0.31"];

const SERVER_PORT: u16 = 7000;
const CONTROL_PORT: u16 = 7100;

fn server_name(id: usize) -> String {
    format!("ftrec-server-{id}.ftrec-server")
}

/// The hosts file: each server's name at its address, and the coordinator's. Written whole
/// and renamed into place: a lookup never reads half of it.
fn write_hosts(lab: &Lab, server_ips: [&str; 2]) {
    let text = format!(
        "{} {}\n{} {}\n{COORDINATOR_IP} ftrec-coordinator\n",
        server_ips[0],
        server_name(0),
        server_ips[1],
        server_name(1)
    );
    let tmp = lab.path("hosts.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, lab.path("hosts")).unwrap();
}

/// `--auth-token-file TOKEN --job-id JOB`: every process's.
fn auth_args(lab: &Lab) -> Vec<String> {
    let token = lab.path("token");
    strings(&[
        "--auth-token-file",
        token.to_str().unwrap(),
        "--job-id",
        &format!("partition-{}", std::process::id()),
    ])
}

/// `ftrec server` as a StatefulSet runs it; `staging` names its staging directory.
fn server_args(id: usize, staging: &str, lab: &Lab) -> Vec<String> {
    let mut a = strings(&[
        "server",
        "--id",
        &format!("ftrec-server-{id}"),
        "--servers",
        "2",
        "--preset",
        "tiny",
        "--listen",
        &format!("0.0.0.0:{SERVER_PORT}"),
        "--ckpt-staging",
        lab.path(staging).to_str().unwrap(),
    ]);
    a.extend(auth_args(lab));
    a
}

fn job_args() -> Vec<String> {
    full_job_args(STEPS, CKPT_EVERY)
}

#[test]
fn a_server_cut_off_from_the_coordinator_is_replaced_and_fenced_through_the_workers() {
    let Some(mut lab) = lab_or_skip('p', SWITCH_IP) else {
        return;
    };
    let servers_ns = [lab.host("s0", SERVER_IPS[0]), lab.host("s1", SERVER_IPS[1])];
    let replacement_ns = lab.host("s1b", REPLACEMENT_IP);
    let coordinator_ns = lab.host("c", COORDINATOR_IP);
    let workers_ns = [lab.host("w0", WORKER_IPS[0]), lab.host("w1", WORKER_IPS[1])];
    write_hosts(&lab, SERVER_IPS);
    std::fs::write(lab.path("token"), "partition-test-token-0123456789abcdef\n").unwrap();

    let s0 = lab.start(
        &servers_ns[0],
        "server-0",
        &server_args(0, "staging-0", &lab),
        false,
    );
    let s1 = lab.start(
        &servers_ns[1],
        "server-1",
        &server_args(1, "staging-1", &lab),
        false,
    );

    let report = lab.path("report.json");
    let mut coordinator = strings(&["coordinator"]);
    coordinator.extend(job_args());
    coordinator.extend(strings(&["--store", lab.path("store").to_str().unwrap()]));
    for id in 0..2 {
        let addr = format!("{}:{SERVER_PORT}", server_name(id));
        coordinator.extend(strings(&["--server-addr", &addr]));
    }
    coordinator.extend(strings(&[
        "--control-listen",
        &format!("0.0.0.0:{CONTROL_PORT}"),
    ]));
    coordinator.extend(auth_args(&lab));
    coordinator.extend(strings(&[
        "--kill",
        &format!("server=1@step={CUT_STEP}"),
        "--json",
        report.to_str().unwrap(),
    ]));
    let c = lab.start(&coordinator_ns, "coordinator", &coordinator, true);
    let stderr = Stderr::follow(lab.procs[c].stderr.take().unwrap());
    let mut workers = Vec::new();
    for (w, ns) in workers_ns.iter().enumerate() {
        let mut a = strings(&["worker", "--coordinator"]);
        a.push(format!("ftrec-coordinator:{CONTROL_PORT}"));
        a.extend(strings(&["--id", &w.to_string()]));
        a.extend(auth_args(&lab));
        workers.push(lab.start(ns, &format!("worker-{w}"), &a, false));
    }

    // After step CUT_STEP the coordinator holds the job until server 1 stops answering: the
    // link between the two goes down, both ways. The workers' links stay up.
    stderr.wait_for("kill it now", "before the partition");
    must_ip(&[
        "-n",
        &coordinator_ns,
        "route",
        "add",
        "blackhole",
        &format!("{}/32", SERVER_IPS[1]),
    ]);
    must_ip(&[
        "-n",
        &servers_ns[1],
        "route",
        "add",
        "blackhole",
        &format!("{COORDINATOR_IP}/32"),
    ]);

    // The coordinator found it lost and waits for a server 1 at its name: one starts on
    // another host, and the name moves to it.
    stderr.wait_for("come back at", "after the partition");
    assert!(
        lab.procs[s1].try_wait().unwrap().is_none(),
        "server 1 exited before it was replaced:\n{}",
        lab.log_tail("server-1")
    );
    let s1b = lab.start(
        &replacement_ns,
        "server-1b",
        &server_args(1, "staging-1b", &lab),
        false,
    );
    write_hosts(&lab, [SERVER_IPS[0], REPLACEMENT_IP]);

    // The cut-off server hears of its replacement from the workers and exits by itself.
    match lab.wait(s1) {
        Some(s) if s.code() == Some(3) => {}
        Some(s) => panic!(
            "the cut-off server 1 exited with {s}, not as fenced (3):\n{}",
            lab.log_tail("server-1")
        ),
        None => panic!(
            "the cut-off server 1 still runs {DEADLINE:?} after its replacement started; \
             coordinator stderr:\n{}\nserver 1:\n{}",
            stderr.tail(),
            lab.log_tail("server-1")
        ),
    }
    let log = std::fs::read_to_string(lab.path("server-1.log")).unwrap();
    let fenced: Vec<&str> = log.lines().filter(|l| l.contains("fenced")).collect();
    assert_eq!(fenced.len(), 1, "{log}");
    assert!(
        fenced[0].contains("server 1 (epoch 0) was replaced by epoch 1"),
        "{}",
        fenced[0]
    );

    let status = lab.wait(c).unwrap_or_else(|| {
        panic!(
            "the coordinator did not exit within {DEADLINE:?}; its stderr ends with:\n{}",
            stderr.tail()
        )
    });
    assert!(
        status.success(),
        "the coordinator failed ({status}); its stderr ends with:\n{}",
        stderr.tail()
    );
    for (w, &i) in workers.iter().enumerate() {
        let log = format!("worker-{w}");
        match lab.wait(i) {
            Some(s) if s.success() => {}
            Some(s) => panic!("worker {w} failed ({s}):\n{}", lab.log_tail(&log)),
            None => panic!("worker {w} still runs:\n{}", lab.log_tail(&log)),
        }
    }
    // The live servers serve until SIGTERM and end cleanly on it.
    for (name, i) in [("server-0", s0), ("server-1b", s1b)] {
        lab.signal(i, libc::SIGTERM);
        match lab.wait(i) {
            Some(s) if s.success() => {}
            Some(s) => panic!("{name} ended badly ({s}):\n{}", lab.log_tail(name)),
            None => panic!("{name} still runs {DEADLINE:?} after SIGTERM"),
        }
    }

    let r = read_json(&report);
    let failures = r["failures"].as_array().unwrap();
    let lost: Vec<(Option<&str>, Option<u64>)> = failures
        .iter()
        .map(|f| (f["role"].as_str(), f["id"].as_u64()))
        .collect();
    assert_eq!(lost, [(Some("server"), Some(1))], "{failures:?}");
    assert_eq!(r["kills"][0]["fired"], true, "{}", r["kills"]);

    // The failure-free run of the same job, on loopback.
    let clean = lab.path("clean.json");
    succeed(
        Command::new(env!("CARGO_BIN_EXE_ftrec"))
            .arg("run")
            .args(job_args())
            .arg("--work-dir")
            .arg(lab.path("clean"))
            .arg("--json")
            .arg(&clean),
    );
    assert_eq!(
        r["model_digest"],
        read_json(&clean)["model_digest"],
        "the job's model is not the failure-free run's"
    );
}

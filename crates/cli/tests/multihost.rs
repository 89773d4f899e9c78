//! Every role on a host of its own, without Kubernetes: each server, the coordinator and each
//! worker runs in a network namespace of its own with its own address, the namespaces joined
//! by veth pairs to a bridge in one more namespace (the switch). The names the processes dial
//! (`ftrec-server-N.ftrec-server`, `ftrec-coordinator`, as a headless service's DNS would
//! answer them) come from a hosts file ($FTREC_HOSTS), and every process gets the command line
//! of the deploy/k8s manifests. When the coordinator waits for server 1's loss ("kill it now")
//! the server is SIGKILLed; when it waits for the server to come back ("come back at") the same
//! command starts again in the same namespace, at the same address, as a StatefulSet would
//! restart the pod. While it waits, worker 1 is SIGKILLed too and started again (a pod of an
//! Indexed Job restarted): it connects again under its id and is set up anew. The job must end
//! with the failure-free run's model digest.
//!
//! Needs root and iproute2: otherwise one `skipped: ...` line says why, and the test passes.
//! Every namespace, interface and process it makes is removed by [`Lab`]'s `Drop`, also when
//! an assertion fails.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::netns::{full_job_args, in_netns, lab_or_skip, strings, Lab, Stderr, DEADLINE};
use common::{dechunk, http_get, metric, read_json, succeed};

/// The flags the manifests give beyond those of the README's by-name example: metrics and
/// health endpoints (`--metrics-listen`), JSON log records (`--log-format json`), a job that
/// starts, or resumes from its store (`--resume-or-start`), and StatefulSet pod names as
/// server ids (`--id ftrec-server-N`); with them, the checks of what the endpoints serve.
/// `false` runs the same flow and the same digest check without them.
const MANIFEST_FLAGS: bool = true;

/// Steps of the job, the step after which server 1 is killed, the checkpoint interval.
const STEPS: u64 = 30;
const KILL_STEP: u64 = 12;
const CKPT_EVERY: u64 = 5;

/// The subnet behind the switch: the switch's own address, then one per host.
const SWITCH_IP: &str = "10.77.0.1";
const SERVER_IPS: [&str; 2] = ["10.77.0.10", "10.77.0.11"];
const COORDINATOR_IP: &str = "10.77.0.20";
const WORKER_IPS: [&str; 2] = ["10.77.0.30", "10.77.0.31"];

const SERVER_PORT: u16 = 7000;
const CONTROL_PORT: u16 = 7100;
const METRICS_PORT: u16 = 9100;

fn server_name(id: usize) -> String {
    format!("ftrec-server-{id}.ftrec-server")
}

fn at(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().unwrap()
}

/// What a role's endpoint answered: `Err` says what went wrong.
fn expect_status(role: &str, addr: SocketAddr, path: &str, want: u16) -> Result<String, String> {
    match http_get(addr, path) {
        Ok((s, body)) if s == want => Ok(body),
        Ok((s, body)) => Err(format!("{role} {path} at {addr}: status {s}: {body}")),
        Err(e) => Err(format!("{role} {path} at {addr}: {e}")),
    }
}

/// What the scraper saw: the last good `/metrics` body per role, and the coordinator's
/// `ftrec_steps_total` and `ftrec_recoveries_total` in every good scrape, in order.
#[derive(Default)]
struct Scrapes {
    last: BTreeMap<&'static str, String>,
    coordinator: Vec<(Option<f64>, Option<f64>)>,
}

/// Scrape every role's `/metrics` in a loop from the switch until `stop` is set.
fn scrape_loop(
    switch: &str,
    targets: Vec<(&'static str, SocketAddr)>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Scrapes> {
    in_netns(switch, move || {
        let mut seen = Scrapes::default();
        while !stop.load(Ordering::Relaxed) {
            for &(role, addr) in &targets {
                if let Ok((200, body)) = http_get(addr, "/metrics") {
                    if role == "coordinator" {
                        seen.coordinator.push((
                            metric(&body, "ftrec_steps_total"),
                            metric(&body, "ftrec_recoveries_total"),
                        ));
                    }
                    seen.last.insert(role, body);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    })
}

/// `ftrec server` as the servers' StatefulSet runs it.
fn server_args(id: usize, lab: &Lab) -> Vec<String> {
    let pod_id = if MANIFEST_FLAGS {
        format!("ftrec-server-{id}")
    } else {
        id.to_string()
    };
    let mut a = strings(&[
        "server",
        "--id",
        &pod_id,
        "--servers",
        "2",
        "--preset",
        "tiny",
    ]);
    a.extend(strings(&["--listen", &format!("0.0.0.0:{SERVER_PORT}")]));
    a.extend(common_args(lab));
    let staging = lab.path(&format!("staging-{id}"));
    a.extend(strings(&["--ckpt-staging", staging.to_str().unwrap()]));
    a.extend(observability_args());
    a
}

/// `--auth-token-file TOKEN --job-id JOB`: every process's.
fn common_args(lab: &Lab) -> Vec<String> {
    let token = lab.path("token");
    strings(&[
        "--auth-token-file",
        token.to_str().unwrap(),
        "--job-id",
        &format!("netns-{}", std::process::id()),
    ])
}

/// `--metrics-listen 0.0.0.0:9100 --log-format json`, with [`MANIFEST_FLAGS`].
fn observability_args() -> Vec<String> {
    if MANIFEST_FLAGS {
        strings(&[
            "--metrics-listen",
            &format!("0.0.0.0:{METRICS_PORT}"),
            "--log-format",
            "json",
        ])
    } else {
        Vec::new()
    }
}

/// The job's settings, shared by the coordinator and the failure-free reference run.
fn job_args() -> Vec<String> {
    full_job_args(STEPS, CKPT_EVERY)
}

#[test]
fn every_role_in_its_own_network_namespace_survives_a_server_restarted_at_its_address() {
    let Some(mut lab) = lab_or_skip('f', SWITCH_IP) else {
        return;
    };
    let servers_ns = [lab.host("s0", SERVER_IPS[0]), lab.host("s1", SERVER_IPS[1])];
    let coordinator_ns = lab.host("c", COORDINATOR_IP);
    let workers_ns = [lab.host("w0", WORKER_IPS[0]), lab.host("w1", WORKER_IPS[1])];
    std::fs::write(
        lab.path("hosts"),
        format!(
            "{} {}\n{} {}\n{COORDINATOR_IP} ftrec-coordinator\n",
            SERVER_IPS[0],
            server_name(0),
            SERVER_IPS[1],
            server_name(1)
        ),
    )
    .unwrap();
    std::fs::write(lab.path("token"), "netns-test-token-0123456789abcdef\n").unwrap();

    let s0 = lab.start(&servers_ns[0], "server-0", &server_args(0, &lab), false);
    let mut s1 = lab.start(&servers_ns[1], "server-1", &server_args(1, &lab), false);

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
    coordinator.extend(common_args(&lab));
    if MANIFEST_FLAGS {
        // The endpoint stays up after the job, so the last scrape reads its final counts.
        coordinator.extend(strings(&["--resume-or-start", "--metrics-linger-s", "600"]));
    }
    coordinator.extend(observability_args());
    coordinator.extend(strings(&[
        "--kill",
        &format!("server=1@step={KILL_STEP}"),
        "--json",
        report.to_str().unwrap(),
    ]));
    let c = lab.start(&coordinator_ns, "coordinator", &coordinator, true);
    let stderr = Stderr::follow(lab.procs[c].stderr.take().unwrap());

    let worker_args = |w: usize, lab: &Lab| {
        let mut a = strings(&["worker", "--coordinator"]);
        a.push(format!("ftrec-coordinator:{CONTROL_PORT}"));
        a.extend(strings(&["--id", &w.to_string()]));
        a.extend(common_args(lab));
        a.extend(observability_args());
        a
    };
    let mut workers = Vec::new();
    for (w, ns) in workers_ns.iter().enumerate() {
        let a = worker_args(w, &lab);
        workers.push(lab.start(ns, &format!("worker-{w}"), &a, false));
    }

    let coordinator_metrics = at(COORDINATOR_IP, METRICS_PORT);
    let servers_health: Vec<(&'static str, SocketAddr)> = vec![
        ("server 0", at(SERVER_IPS[0], METRICS_PORT)),
        ("server 1", at(SERVER_IPS[1], METRICS_PORT)),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = MANIFEST_FLAGS.then(|| {
        scrape_loop(
            &lab.switch,
            vec![
                ("coordinator", coordinator_metrics),
                ("server 0", servers_health[0].1),
                ("server 1", servers_health[1].1),
                ("worker 0", at(WORKER_IPS[0], METRICS_PORT)),
                ("worker 1", at(WORKER_IPS[1], METRICS_PORT)),
            ],
            Arc::clone(&stop),
        )
    });

    // After step KILL_STEP the coordinator holds the job until server 1 is gone: every role
    // is up, and the coordinator has counted the steps so far.
    stderr.wait_for("kill it now", "before server 1's kill");
    if MANIFEST_FLAGS {
        let mut healthz = servers_health.clone();
        healthz.push(("worker 0", at(WORKER_IPS[0], METRICS_PORT)));
        healthz.push(("worker 1", at(WORKER_IPS[1], METRICS_PORT)));
        let checked = in_netns(&lab.switch, move || {
            let body = expect_status("coordinator", coordinator_metrics, "/metrics", 200)?;
            let steps = metric(&body, "ftrec_steps_total");
            if steps.is_none_or(|s| s < KILL_STEP as f64) {
                return Err(format!(
                    "the coordinator waits for the kill after step {KILL_STEP}, yet its \
                     ftrec_steps_total is {steps:?}:\n{body}"
                ));
            }
            for (role, addr) in healthz {
                expect_status(role, addr, "/healthz", 200)?;
            }
            Ok(())
        });
        if let Err(e) = checked.join().unwrap() {
            panic!("{e}\ncoordinator stderr:\n{}", stderr.tail());
        }
    }
    lab.kill(s1);

    // The same command in the same namespace, at the same address, once it is awaited.
    stderr.wait_for("come back at", "after server 1's kill");
    // No step runs while the coordinator waits: worker 1 dies between two batches and its
    // restart connects again under its id.
    lab.kill(workers[1]);
    workers[1] = lab.start(&workers_ns[1], "worker-1b", &worker_args(1, &lab), false);
    s1 = lab.start(&servers_ns[1], "server-1", &server_args(1, &lab), false);

    // With the flags, the job ends and the coordinator lingers serving its final counts:
    // scraped, then stopped.
    let final_scrape = MANIFEST_FLAGS.then(|| {
        stderr.wait_for("serving metrics", "after the job's end");
        let scraped = in_netns(&lab.switch, move || {
            expect_status("coordinator", coordinator_metrics, "/metrics", 200)
        });
        let body = scraped.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        lab.signal(c, libc::SIGTERM);
        body
    });
    let status = lab.wait(c).unwrap_or_else(|| {
        panic!(
            "the coordinator did not exit within {DEADLINE:?}; its stderr ends with:\n{}",
            stderr.tail()
        )
    });
    assert!(
        status.success() || final_scrape.is_some(),
        "the coordinator failed ({status}); its stderr ends with:\n{}",
        stderr.tail()
    );
    for (w, &i) in workers.iter().enumerate() {
        let log = format!("worker-{w}");
        match lab.wait(i) {
            Some(s) if s.success() => {}
            Some(s) => panic!("worker {w} failed ({s}):\n{}", lab.log_tail(&log)),
            None => panic!(
                "worker {w} did not exit within {DEADLINE:?} of the coordinator's end:\n{}",
                lab.log_tail(&log)
            ),
        }
    }

    if let Some(scraper) = scraper {
        stop.store(true, Ordering::Relaxed);
        let seen = scraper.join().unwrap();
        // The servers serve until SIGTERM: both answer, server 1 from its second process.
        let healthz = servers_health.clone();
        let checked = in_netns(&lab.switch, move || {
            healthz
                .into_iter()
                .try_for_each(|(role, addr)| expect_status(role, addr, "/healthz", 200).map(drop))
        });
        if let Err(e) = checked.join().unwrap() {
            panic!("{e}");
        }
        for role in [
            "coordinator",
            "server 0",
            "server 1",
            "worker 0",
            "worker 1",
        ] {
            assert!(seen.last.contains_key(role), "no scrape of the {role}");
        }
        let steps: Vec<f64> = seen.coordinator.iter().filter_map(|s| s.0).collect();
        assert!(
            steps.windows(2).all(|w| w[0] <= w[1]),
            "ftrec_steps_total went down between scrapes: {steps:?}"
        );
        let body = &seen.last["coordinator"];
        let (last_steps, recoveries) = *seen.coordinator.last().unwrap();
        assert!(
            last_steps.is_some_and(|s| s >= KILL_STEP as f64),
            "the coordinator's last scrape, after the kill after step {KILL_STEP}, has \
             ftrec_steps_total {last_steps:?}:\n{body}"
        );
        // Summed over roles: server 1's and worker 1's at most.
        assert!(recoveries.is_none_or(|r| r <= 2.0), "{body}");
    }
    if let Some(body) = final_scrape {
        // The job's final counts: every step (redone ones counted again), one failure of a
        // server and its recovery, both servers alive again.
        let steps = metric(&body, "ftrec_steps_total").unwrap_or(0.0);
        assert!(
            steps >= STEPS as f64,
            "ftrec_steps_total {steps}:\n{body}\ncoordinator stderr:\n{}",
            stderr.tail()
        );
        assert_eq!(metric(&body, "ftrec_step"), Some(STEPS as f64), "{body}");
        assert_eq!(
            metric(&body, "ftrec_recoveries_total{role=\"server\"}"),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            metric(&body, "ftrec_failures_total{role=\"server\"}"),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            metric(&body, "ftrec_recoveries_total{role=\"worker\"}"),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            metric(&body, "ftrec_live_processes{role=\"server\"}"),
            Some(2.0),
            "{body}"
        );
    }

    // The servers serve until SIGTERM, and end cleanly on it.
    for (id, i) in [(0, s0), (1, s1)] {
        lab.signal(i, libc::SIGTERM);
        match lab.wait(i) {
            Some(s) if s.success() => {}
            Some(s) => panic!(
                "server {id} ended badly on SIGTERM ({s}):\n{}",
                lab.log_tail(&format!("server-{id}"))
            ),
            None => panic!("server {id} still runs {DEADLINE:?} after SIGTERM"),
        }
    }

    let r = read_json(&report);
    let failures = r["failures"].as_array().unwrap();
    let lost: Vec<(Option<&str>, Option<u64>)> = failures
        .iter()
        .map(|f| (f["role"].as_str(), f["id"].as_u64()))
        .collect();
    assert_eq!(
        lost,
        [(Some("server"), Some(1)), (Some("worker"), Some(1))],
        "{failures:?}"
    );
    let kills = r["kills"].as_array().unwrap();
    assert!(
        kills.len() == 1 && kills[0]["fired"] == true,
        "the kill did not fire: {kills:?}"
    );

    // The failure-free run of the same job, all on loopback.
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

#[test]
fn metrics_are_read_from_the_text_exposition() {
    let body = "# HELP ftrec_steps_total Steps.\n# TYPE ftrec_steps_total counter\n\
                ftrec_steps_total 12\nftrec_steps_total_other 5\n\
                ftrec_recoveries_total{role=\"server\"} 1\n\
                ftrec_recoveries_total{role=\"worker\"} 0 1700000000\n";
    assert_eq!(metric(body, "ftrec_steps_total"), Some(12.0));
    assert_eq!(metric(body, "ftrec_recoveries_total"), Some(1.0));
    assert_eq!(metric(body, "ftrec_missing"), None);
    assert_eq!(
        dechunk("5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n").as_deref(),
        Some("hello world")
    );
    assert_eq!(dechunk("5\r\nhel"), None);
}

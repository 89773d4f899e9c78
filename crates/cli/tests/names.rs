//! Every role by name: servers, coordinator and workers started by hand, each address flag
//! given as `NAME:PORT`, the names served by a hosts file of the test's own ($FTREC_HOSTS, so
//! the test can move a name). A server is killed at a step and comes back behind the same
//! name at another address; the synchronous job finds it there and ends with the failure-free
//! model's digest.

mod common;
use common::hang::BoundedOutput;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};

use common::{control_port, ftrec, one_error_line, read_json, succeed};

/// The job: synchronous, full checkpoints every 2 steps, server 1 killed after step 5.
const JOB: &[&str] = &[
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
    "0",
    "--seed",
    "3",
    "--strategy",
    "full",
    "--ckpt-every-steps",
    "2",
];

fn with_hosts(mut cmd: Command, hosts: &Path) -> Command {
    cmd.env("FTREC_HOSTS", hosts);
    cmd
}

/// `ftrec server` `id` of 2 listening on `listen` (a name; port 0 takes a free one) until its
/// stdin closes, once it serves: the process and the port it bound (from its port file).
fn server(id: u32, listen: &str, hosts: &Path, dir: &Path) -> (Child, u16) {
    let port_file = dir.join(format!("s{id}.port"));
    let _ = std::fs::remove_file(&port_file);
    let log = dir.join(format!("s{id}.log"));
    let mut child = with_hosts(ftrec(), hosts)
        .args(["server", "--id", &id.to_string(), "--servers", "2"])
        .args(["--preset", "tiny", "--seed", "3", "--until", "stdin"])
        .args(["--listen", listen, "--ckpt-staging"])
        .arg(dir.join(format!("staging{id}")))
        .arg("--port-file")
        .arg(&port_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    loop {
        // The port file is written atomically: once it exists it holds the whole address.
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            let addr: std::net::SocketAddr = text.trim().parse().unwrap();
            return (child, addr.port());
        }
        if child.try_wait().unwrap().is_some() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("server {id} exited before it served: {log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Read `lines` until one contains `needle` (the coordinator says what it waits for).
fn wait_for_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, needle: &str) {
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains(needle) {
            return;
        }
        seen.push(line);
    }
    panic!("the coordinator ended without printing {needle:?}: {seen:#?}");
}

fn stderr_lines(c: &mut Child) -> std::io::Lines<BufReader<ChildStderr>> {
    BufReader::new(c.stderr.take().unwrap()).lines()
}

#[test]
fn every_role_by_name_survives_a_server_that_comes_back_at_another_address() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 ps-0 ps-1 coord\n").unwrap();
    // Every first listener takes a free port of its own (a port picked by the test and bound
    // later could be taken in between by any connection on this machine).
    let dog = common::hang::watchdog("the job whose server comes back at another address");
    let (s0, p0) = server(0, "ps-0:0", &hosts, dir.path());
    dog.watch(&s0);
    let (s1, p1) = server(1, "ps-1:0", &hosts, dir.path());
    dog.watch(&s1);
    let json = dir.path().join("coord.json");
    let mut coord = with_hosts(ftrec(), &hosts)
        .arg("coordinator")
        .args(JOB)
        .args(["--kill", "server=1@step=5", "--store"])
        .arg(dir.path().join("store"))
        .args(["--server-addr", &format!("ps-0:{p0}")])
        .args(["--server-addr", &format!("ps-1:{p1}")])
        .args(["--control-listen", "coord:0"])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    dog.watch(&coord);
    let mut lines = stderr_lines(&mut coord);
    let pc = control_port(&mut lines);
    let workers: Vec<Child> = (0..2)
        .map(|w| {
            with_hosts(ftrec(), &hosts)
                .args(["worker", "--coordinator", &format!("coord:{pc}")])
                .args(["--id", &w.to_string()])
                .spawn()
                .unwrap()
        })
        .collect();
    for w in &workers {
        dog.watch(w);
    }

    // After step 5 the coordinator waits for server 1's loss: kill it there.
    wait_for_line(&mut lines, "kill it now");
    let mut s1 = s1;
    s1.kill().unwrap();
    s1.wait().unwrap();
    // Its replacement serves the same name at another address.
    std::fs::write(&hosts, "127.0.0.1 ps-0 coord\n127.0.0.2 ps-1\n").unwrap();
    wait_for_line(&mut lines, "come back at");
    // The same port on another loopback address: free, since only the old one bound it.
    let (s1, _) = server(1, &format!("ps-1:{p1}"), &hosts, dir.path());
    dog.watch(&s1);

    // Drain the rest so the coordinator never blocks on a full pipe.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let status = coord.wait().unwrap();
    let rest = rest.join().unwrap();
    assert!(status.success(), "{rest:?}");
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    for mut s in [s0, s1] {
        drop(s.stdin.take());
        assert!(s.wait().unwrap().success());
    }

    let r = read_json(&json);
    let failures = r["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        (failures[0]["role"].as_str(), failures[0]["id"].as_u64()),
        (Some("server"), Some(1))
    );
    assert!(failures[0]["detected_s"].is_number(), "{failures:?}");
    let replaced = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "server_replaced")
        .unwrap_or_else(|| panic!("no replacement in {:?}", r["events"]));
    assert!(
        replaced["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("ps-1:{p1}")),
        "{replaced:?}"
    );

    // The failure-free run of the same job, launched on loopback addresses.
    let clean = dir.path().join("clean.json");
    succeed(
        ftrec()
            .arg("run")
            .args(JOB)
            .arg("--work-dir")
            .arg(dir.path().join("clean"))
            .arg("--json")
            .arg(&clean),
    );
    assert_eq!(r["model_digest"], read_json(&clean)["model_digest"]);
}

#[test]
fn an_address_flag_that_is_no_host_and_port_names_the_flag() {
    for (args, flag) in [
        (
            vec!["coordinator", "--servers", "1", "--server-addr", "h1"],
            "--server-addr",
        ),
        (
            vec!["worker", "--id", "0", "--coordinator", "h0:port"],
            "--coordinator",
        ),
        (
            vec![
                "server",
                "--id",
                "0",
                "--servers",
                "1",
                "--preset",
                "tiny",
                "--listen",
                "bad host:1",
            ],
            "--listen",
        ),
        (vec!["run", "--control-listen", "7100"], "--control-listen"),
    ] {
        let out = ftrec().args(&args).bounded_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        // The flag parser's one error line.
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
        assert!(
            line.contains(flag) && line.contains("HOST:PORT"),
            "{args:?}: {err}"
        );
    }
    // A name nobody serves: the coordinator's one line names it.
    let out = ftrec()
        .args(["coordinator", "--servers", "1", "--steps", "2"])
        .args(["--server-addr", "no-such-host.invalid:7000"])
        .args(["--start-timeout-s", "1"])
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(line.contains("no-such-host.invalid"), "{line}");
}

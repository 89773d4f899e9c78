//! Who may join a run, with real processes: the coordinator refuses a worker with a wrong
//! token or of another job, a whole run with a token (and a server kill) gives the digest of
//! the run without one, a coordinator refuses servers of another job, every default bind
//! address is loopback, and a worker checks what its coordinator asks of it (a huge batch,
//! batch index 0 or past the end of the stream) with one clear error.

mod common;
use common::server_exe;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use ftrec_cluster::args::{parse_process, ProcessCmd};
use ftrec_cluster::auth::{Auth, JobId, Token};
use ftrec_cluster::control::{read_line, send_line, FromWorker, ToWorker, WorkerPool};
use ftrec_cluster::worker::WorkerSetup;
use ftrec_cluster::{run, RunConfig, ServerSpec, StrategyChoice};
use ftrec_core::Preset;

fn auth(token: Option<&str>, job: Option<&str>) -> Auth {
    Auth {
        token: token.map(|t| Token::new(t, "test").unwrap()),
        job: job.map(|j| JobId::new(j).unwrap()),
        tls: None,
        fences: Default::default(),
    }
}

fn config(dir: &tempfile::TempDir) -> RunConfig {
    let mut cfg = common::tiny_run(dir.path(), 2, 1, 16, 5);
    cfg.sync = true;
    cfg.eval_samples = 256;
    cfg
}

fn loopback(addr: SocketAddr) -> bool {
    addr.ip().is_loopback()
}

#[test]
fn every_default_bind_address_is_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    assert!(loopback(cfg.control_listen), "{}", cfg.control_listen);
    assert!(loopback(cfg.server_spec(0).listen));
    let spec = ServerSpec::from_preset(&Preset::tiny(), 0, 1, 1).unwrap();
    assert!(loopback(spec.listen), "{}", spec.listen);
    // `ftrec server` without --listen.
    let cmd = parse_process(
        &["server", "--id", "0", "--servers", "1", "--preset", "tiny"].map(String::from),
    )
    .unwrap();
    let ProcessCmd::Server(a) = cmd else {
        panic!("a server command: {cmd:?}")
    };
    assert!(loopback(a.spec().unwrap().listen));
    // The control socket and a started server, bound for real.
    let pool = WorkerPool::listen(cfg.control_listen, 1, None).unwrap();
    assert!(loopback(pool.addr()), "{}", pool.addr());
    let mut p = common::start_server(&cfg.server_spec(0), dir.path());
    assert!(loopback(p.addr), "{}", p.addr);
    p.kill();
}

/// A raw hello on the coordinator's control socket, and the first line it answers.
fn hello(addr: SocketAddr, line: &str) -> (Option<ToWorker>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut r = BufReader::new(s);
    let first = read_line::<ToWorker>(&mut r, "the coordinator").unwrap();
    // After a refusal the coordinator closes the connection (an accepted one stays open).
    let closed = matches!(first, Some(ToWorker::Refused { .. })) && {
        let mut rest = String::new();
        matches!(r.read_line(&mut rest), Ok(0))
    };
    (first, closed)
}

#[test]
fn the_coordinator_refuses_a_worker_with_a_wrong_token_or_of_another_job() {
    let job = auth(Some("good-token"), Some("job-now"));
    let mut pool = WorkerPool::listen_with(
        "127.0.0.1:0".parse().unwrap(),
        1,
        Some(&server_exe()),
        job.clone(),
    )
    .unwrap();
    let addr = pool.addr();

    // Raw hellos: missing token, wrong token, stale job; each gets one refusal line.
    for (line, want) in [
        (r#"{"msg":"hello","id":0,"pid":1}"#, "missing auth token"),
        (
            r#"{"msg":"hello","id":0,"pid":1,"token":"bad-token","job":"job-now"}"#,
            "wrong auth token",
        ),
        (
            r#"{"msg":"hello","id":0,"pid":1,"token":"good-token","job":"job-old"}"#,
            "job-old",
        ),
    ] {
        let (first, closed) = hello(addr, line);
        match first {
            Some(ToWorker::Refused { reason }) => {
                assert!(reason.contains(want), "{reason}");
                if want == "job-old" {
                    assert!(reason.contains("job-now"), "{reason}");
                }
            }
            other => panic!("{line}: expected a refusal, got {other:?}"),
        }
        assert!(closed, "the connection is closed after a refusal");
    }

    // A real worker process with a wrong token exits with the coordinator's reason.
    let out = Command::new(server_exe())
        .args(["worker", "--coordinator", &addr.to_string(), "--id", "0"])
        .env("FTREC_AUTH_TOKEN", "bad-token")
        .env_remove("FTREC_JOB_ID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused") && err.contains("wrong auth token"),
        "{err}"
    );
    assert!(!pool.is_connected(0));

    // A worker the pool starts gets the token and job through its environment and joins.
    pool.spawn(0, Duration::from_secs(30)).unwrap();
    assert!(pool.is_connected(0));
    pool.stop_all(Duration::from_secs(5));
}

#[test]
fn a_worker_started_by_hand_without_a_job_joins_and_a_wrong_job_is_refused() {
    let pool = WorkerPool::listen_with(
        "127.0.0.1:0".parse().unwrap(),
        1,
        None,
        auth(None, Some("job-now")),
    )
    .unwrap();
    // No job id: accepted, and told the coordinator's.
    let (first, _) = hello(pool.addr(), r#"{"msg":"hello","id":0,"pid":1}"#);
    match first {
        Some(ToWorker::Welcome { job }) => assert_eq!(job.as_deref(), Some("job-now")),
        other => panic!("expected a welcome, got {other:?}"),
    }
    let out = Command::new(server_exe())
        .args([
            "worker",
            "--coordinator",
            &pool.addr().to_string(),
            "--id",
            "0",
        ])
        .args(["--job-id", "job-stale"])
        .env_remove("FTREC_AUTH_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("job-stale") && err.contains("job-now"),
        "{err}"
    );
}

#[test]
fn a_run_with_a_token_and_a_server_kill_equals_the_run_without() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.strategy = StrategyChoice::Full { every_steps: 4 };
    cfg.kills = vec!["server=1@step=10".parse().unwrap()];
    let plain = run(&cfg).unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let mut cfg2 = config(&dir2);
    cfg2.strategy = cfg.strategy;
    cfg2.kills = cfg.kills.clone();
    cfg2.auth = auth(Some("s3cret-token"), None);
    let secured = run(&cfg2).unwrap();
    assert_eq!(plain.failures.len(), 1);
    assert_eq!(secured.failures.len(), 1);
    assert!(secured.failures[0].recovered_s.is_some());
    assert_eq!(secured.model_digest, plain.model_digest);
    // Each run got its own job id, named in the report.
    assert!(plain.job_id.starts_with("job-"), "{}", plain.job_id);
    assert!(secured.job_id.starts_with("job-"), "{}", secured.job_id);
    assert_ne!(plain.job_id, secured.job_id);
    assert!(secured.summary().contains(&secured.job_id));
    // The token is in no report.
    let json = serde_json::to_string(&secured).unwrap();
    assert!(!json.contains("s3cret-token"));
}

#[test]
fn a_coordinator_refuses_servers_of_another_job_or_with_another_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.servers = 1;
    let mut spec = cfg.server_spec(0);
    spec.auth = auth(Some("tok"), Some("job-old"));
    let mut server = common::start_server(&spec, dir.path());
    cfg.external_servers = vec![server.addr.into()];
    cfg.auth = auth(Some("tok"), Some("job-new"));
    let e = run(&cfg).unwrap_err().to_string();
    assert!(
        e.contains("job-old") && e.contains("job-new") && !e.contains('\n'),
        "{e}"
    );
    cfg.auth = auth(Some("other"), Some("job-old"));
    let e = run(&cfg).unwrap_err().to_string();
    assert!(e.contains("wrong auth token"), "{e}");
    // With the right token and job the same server serves the run.
    cfg.auth = auth(Some("tok"), Some("job-old"));
    cfg.steps = 2;
    let report = run(&cfg).unwrap();
    assert_eq!(report.job_id, "job-old");
    server.kill();
}

/// A fake coordinator: accept one worker process, welcome it, and hand back both ends.
fn fake_coordinator() -> (std::process::Child, TcpStream, BufReader<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let child = Command::new(server_exe())
        .args(["worker", "--coordinator", &addr.to_string(), "--id", "0"])
        .env_remove("FTREC_AUTH_TOKEN")
        .env_remove("FTREC_JOB_ID")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (stream, _) = listener.accept().unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let h = read_line::<FromWorker>(&mut r, "the worker").unwrap();
    assert!(matches!(h, Some(FromWorker::Hello { id: 0, .. })), "{h:?}");
    send_line(&mut w, &ToWorker::Welcome { job: None }).unwrap();
    (child, w, r)
}

fn ask(w: &mut TcpStream, r: &mut BufReader<TcpStream>, msg: &ToWorker) -> FromWorker {
    send_line(w, msg).unwrap();
    read_line::<FromWorker>(r, "the worker").unwrap().unwrap()
}

fn setup(batch: usize) -> ToWorker {
    setup_nice(batch, 0)
}

fn setup_nice(batch: usize, compute_nice: i32) -> ToWorker {
    ToWorker::Setup(Box::new(WorkerSetup {
        id: 0,
        workers: 1,
        preset: Preset::tiny(),
        seed: 1,
        batch,
        threads: 1,
        compute_nice,
        rpc_timeout: Duration::from_secs(5),
        ec: None,
        data: None,
    }))
}

#[test]
fn a_worker_refuses_a_huge_batch_and_batch_indices_out_of_range() {
    let (mut child, mut w, mut r) = fake_coordinator();
    for batch in [0, usize::MAX, (1 << 20) + 1, 1 << 40] {
        match ask(&mut w, &mut r, &setup(batch)) {
            FromWorker::Failed { index: None, error } => {
                assert!(error.contains(&format!("batch {batch}")), "{error}")
            }
            other => panic!("batch {batch}: {other:?}"),
        }
    }
    for nice in [-1, 20] {
        match ask(&mut w, &mut r, &setup_nice(64, nice)) {
            FromWorker::Failed { index: None, error } => {
                assert!(error.contains(&format!("nice value {nice}")), "{error}")
            }
            other => panic!("nice {nice}: {other:?}"),
        }
    }
    assert!(matches!(ask(&mut w, &mut r, &setup(64)), FromWorker::Ready));
    for index in [0, u64::MAX, u64::MAX / 64 + 1, u64::MAX / 64 + 2] {
        let batch = ToWorker::Batch {
            index,
            seq: None,
            hold: Vec::new(),
            start: None,
            fences: String::new(),
            rewinds: 0,
            restored: 0,
        };
        match ask(&mut w, &mut r, &batch) {
            FromWorker::Failed { index: i, error } => {
                assert_eq!(i, Some(index));
                assert!(error.contains("out of range"), "{index}: {error}");
            }
            other => panic!("index {index}: {other:?}"),
        }
    }
    // A valid index gets past the check (and fails only for want of servers).
    let batch = ToWorker::Batch {
        index: 1,
        seq: None,
        hold: Vec::new(),
        start: None,
        fences: String::new(),
        rewinds: 0,
        restored: 0,
    };
    match ask(&mut w, &mut r, &batch) {
        FromWorker::Failed { error, .. } => assert!(error.contains("connected"), "{error}"),
        other => panic!("{other:?}"),
    }
    send_line(&mut w, &ToWorker::Stop).unwrap();
    assert!(child.wait().unwrap().success());
}

/// Nice value and name of every thread of process `pid` (Linux's `/proc`).
#[cfg(target_os = "linux")]
fn thread_nices(pid: u32) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the name's closing parenthesis start at the state (field 3); the nice
        // value is field 19.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let nice = after.split(' ').nth(16).unwrap().parse().unwrap();
        out.push((comm.trim().to_string(), nice));
    }
    out
}

#[cfg(target_os = "linux")]
#[test]
fn a_worker_computes_at_the_compute_nice_value_and_talks_at_its_own() {
    // SAFETY: a plain system call on the calling thread.
    let own = i64::from(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) });
    if own >= 12 {
        eprintln!("skipped: this test process already runs at nice {own}");
        return;
    }
    let nice = own + 7;
    let (mut child, mut w, mut r) = fake_coordinator();
    let ready = ask(&mut w, &mut r, &setup_nice(64, nice as i32));
    assert!(matches!(ready, FromWorker::Ready), "{ready:?}");
    let threads = thread_nices(child.id());
    let (math, rest): (Vec<_>, Vec<_>) = threads
        .iter()
        .partition(|(n, _)| n.starts_with("ftrec-math"));
    assert_eq!(math.len(), 1, "one matrix-kernel thread: {threads:?}");
    assert!(math.iter().all(|(_, n)| *n == nice), "{threads:?}");
    assert!(
        !rest.is_empty() && rest.iter().all(|(_, n)| *n == own),
        "{threads:?}"
    );
    send_line(&mut w, &ToWorker::Stop).unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn an_ecrec_run_with_a_token_rebuilds_a_killed_server_and_equals_the_run_without() {
    // ECRec's servers call each other (deltas, rebuild reads): those calls carry the token too.
    let strategy = StrategyChoice::EcRec {
        k: 2,
        r: 1,
        code: ftrec_cluster::CodeKind::Gf256,
        dense_replication: true,
        two_phase: true,
        lock_ranges: 2,
        rebuild_share_ppm: 1_000_000,
        rebuild_min_throughput_ppm: None,

        backstop_every_steps: None,
    };
    let report = |token: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir);
        cfg.servers = 3;
        cfg.steps = 10;
        cfg.strategy = strategy;
        cfg.kills = vec!["server=1@step=4".parse().unwrap()];
        cfg.auth = auth(token, None);
        run(&cfg).unwrap()
    };
    let plain = report(None);
    let secured = report(Some("ec-token"));
    assert_eq!(secured.failures.len(), 1);
    let ec = secured.ec.as_ref().unwrap();
    assert!(ec.rebuilds.iter().any(|b| b.finished_s.is_some()), "{ec:?}");
    assert_eq!(secured.model_digest, plain.model_digest);
}

//! Where a job's processes run (`--server-cpus`, `--worker-cpus`): a server and a worker
//! started on a CPU set run there with every thread they start, and a job refuses a set it
//! could not hand out, or one for processes it does not start, before starting anything.

mod common;
use common::server_exe;

use std::time::Duration;

use ftrec_cluster::control::WorkerPool;
use ftrec_cluster::cpus::{allowed_cpus, CpuSet};

/// The CPU list every thread of process `pid` may run on (`Cpus_allowed_list`), one entry
/// per thread.
fn thread_cpus(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let mut lists = Vec::new();
    for t in tasks {
        let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("a Cpus_allowed_list line");
        lists.push(line.trim().to_string());
    }
    lists
}

/// The last CPU this test may use: on a machine with more than one, a strict subset.
fn last_cpu() -> CpuSet {
    let last = *allowed_cpus().unwrap().cpus().last().unwrap();
    last.to_string().parse().unwrap()
}

#[test]
fn a_server_started_on_a_cpu_set_runs_every_thread_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::tiny_run(dir.path(), 1, 1, 4, 1);
    let cpus = last_cpu();
    cfg.server_cpus = Some(cpus.clone());
    cfg.validate().unwrap();
    let mut p = common::start_server(&cfg.server_spec(0), dir.path());
    let lists = thread_cpus(p.pid());
    assert!(lists.len() >= 2, "a serving process has threads: {lists:?}");
    assert!(lists.iter().all(|l| *l == cpus.to_string()), "{lists:?}");
    p.kill();
}

#[test]
fn a_worker_started_on_a_cpu_set_runs_every_thread_there() {
    let cpus = last_cpu();
    let mut pool = WorkerPool::listen("127.0.0.1:0".parse().unwrap(), 1, Some(&server_exe()))
        .unwrap()
        .on_cpus(Some(cpus.clone()));
    let pid = pool.spawn(0, Duration::from_secs(30)).unwrap();
    let lists = thread_cpus(pid);
    assert!(!lists.is_empty());
    assert!(lists.iter().all(|l| *l == cpus.to_string()), "{lists:?}");
}

#[test]
fn a_job_refuses_cpus_it_may_not_use_or_for_processes_it_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let base = common::tiny_run(dir.path(), 1, 1, 4, 1);
    let allowed = allowed_cpus().unwrap();
    let beyond = allowed.cpus().last().unwrap() + 1;
    if beyond <= 1023 {
        let mut cfg = base.clone();
        cfg.worker_cpus = Some(beyond.to_string().parse().unwrap());
        let e = cfg.validate().unwrap_err().to_string();
        assert!(
            e.contains("--worker-cpus") && e.contains(&allowed.to_string()) && !e.contains('\n'),
            "{e}"
        );
    }
    let mut cfg = base.clone();
    cfg.server_cpus = Some(allowed.clone());
    cfg.external_servers = vec!["127.0.0.1:1".parse().unwrap()];
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("started elsewhere: drop --server-cpus") && !e.contains("  "),
        "{e}"
    );
    let mut cfg = base;
    cfg.worker_cpus = Some(allowed);
    cfg.external_workers = true;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("started elsewhere: drop --worker-cpus") && !e.contains("  "),
        "{e}"
    );
}

//! Strategy `ecrec` on real processes (ecrec.txt §3): servers SIGKILLed mid-run, in either
//! phase of the two-phase commit and during a rebuild, are replaced and rebuilt from the
//! survivors while training goes on, and with the exact gf256 code the final model is the
//! failure-free model bit for bit.

mod common;

use ftrec_cluster::{run, EventKind, RunConfig, RunReport, StrategyChoice};
use ftrec_ec::CodeKind;

fn config(dir: &tempfile::TempDir, servers: u32, steps: u64) -> RunConfig {
    common::tiny_run(dir.path(), servers, 2, steps, 7)
}

fn ecrec(k: usize, r: usize, code: CodeKind) -> StrategyChoice {
    StrategyChoice::EcRec {
        k,
        r,
        code,
        dense_replication: true,
        two_phase: true,
        lock_ranges: 4,
        rebuild_share_ppm: 1_000_000,
        rebuild_min_throughput_ppm: None,
        backstop_every_steps: None,
    }
}

/// Bound on the sum code's parity drift in these short runs: values of the tiny preset stay
/// below 1 in magnitude, and each of a few dozen float additions per parity word may round
/// by half an ulp of numbers below 2 (about 1.2e-7); 1e-5 leaves two orders of magnitude.
const SUM_DRIFT_BOUND: f64 = 1e-5;

/// The end-of-run audit found every parity equal to a fresh encode of its stripe (for the
/// sum code: within [`SUM_DRIFT_BOUND`]) and every dense replica equal to its primary.
fn assert_clean_audit(report: &RunReport) {
    let ec = report
        .ec
        .as_ref()
        .expect("an ecrec run reports its EC part");
    let audit = ec
        .audit
        .unwrap_or_else(|| panic!("no audit: {:?}", ec.audit_skipped));
    assert!(audit.stripes > 0, "{audit:?}");
    assert_eq!(audit.replica_mismatches, 0, "{audit:?}");
    if ec.code == "gf256" {
        assert_eq!(audit.parity_mismatches, 0, "{audit:?}");
        assert_eq!(audit.max_abs_error, 0.0, "{audit:?}");
    } else {
        assert!(audit.max_abs_error <= SUM_DRIFT_BOUND, "{audit:?}");
    }
}

/// Every process the run started is reaped and every address it used is free again.
fn assert_no_children_left(report: &RunReport) {
    for &pid in report.server_pids.iter().chain(&report.worker_pids) {
        // SAFETY: signal 0 only checks for existence; it sends nothing.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        assert_eq!(r, -1, "process {pid} is still alive");
    }
    for addr in &report.server_addrs {
        std::net::TcpListener::bind(addr.as_str())
            .unwrap_or_else(|e| panic!("port {addr} is still taken: {e}"));
    }
}

/// The digest of the same run without fault tolerance and without kills.
fn none_digest(servers: u32, steps: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let report = run(&config(&dir, servers, steps)).unwrap();
    assert!(report.failures.is_empty() && report.ec.is_none());
    assert!(!report.model_digest.is_empty());
    report.model_digest
}

/// Run with `kills`; every kill is recovered without a redone step.
fn killed_run(servers: u32, steps: u64, strategy: StrategyChoice, kills: &[&str]) -> RunReport {
    let report = finished_run(true, servers, steps, strategy, kills);
    assert_eq!(report.failures.len(), kills.len(), "{:?}", report.failures);
    for f in &report.failures {
        assert_eq!(f.steps_redone, 0, "{f:?}");
        let (d, p, r, c) = (
            f.detected_s.unwrap(),
            f.replaced_s.unwrap(),
            f.resumed_s.unwrap(),
            f.recovered_s.unwrap(),
        );
        assert!(d <= p && p <= r && r <= c, "{f:?}");
    }
    let ec = report.ec.as_ref().unwrap();
    assert!(!ec.rebuilds.is_empty());
    assert!(ec.rebuilds.iter().any(|b| b.finished_s.is_some()));
    // ECRec never rolls back: no checkpoint, no restore.
    assert_eq!(report.checkpoints, 0);
    assert_eq!(report.samples_redone, 0);
    assert_clean_audit(&report);
    report
}

#[test]
fn a_failure_free_ecrec_run_trains_the_model_of_a_run_without_fault_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 6);
    cfg.strategy = ecrec(2, 1, CodeKind::Gf256);
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.model_digest, none_digest(3, 6));
    let ec = report.ec.unwrap();
    assert_eq!((ec.k, ec.r, ec.code.as_str()), (2, 1, "gf256"));
    assert!(ec.two_phase && ec.dense_replication);
    assert_eq!((ec.steps_committed, ec.steps_aborted), (6, 0));
    assert!(ec.row_deltas_sent > 0 && ec.delta_bytes_sent > 0);
    assert!(ec.per_step_s > 0.0);
    // ECRec §3.2: parities stay the exact encode of their stripes, replicas their primary.
    let audit = ec.audit.unwrap();
    assert!(audit.stripes > 0);
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
    // One parity per two rows (ragged stripe tails round up), plus one dense copy (r = 1).
    let m = ec.memory;
    assert_eq!(m.code_overhead, 1.5);
    let row_bytes = (m.model_bytes - m.dense_replica_bytes) as f64;
    let parity_share = m.parity_bytes as f64 / row_bytes;
    assert!((0.5..0.52).contains(&parity_share), "{m:?}");
    let total = (m.model_bytes + m.parity_bytes + m.dense_replica_bytes) as f64;
    assert!(
        (m.overhead - total / m.model_bytes as f64).abs() < 1e-12,
        "{m:?}"
    );
}

#[test]
fn a_server_killed_mid_run_is_rebuilt_and_the_model_is_the_failure_free_one() {
    let report = killed_run(3, 8, ecrec(2, 1, CodeKind::Gf256), &["server=1@step=3"]);
    assert_eq!(report.model_digest, none_digest(3, 8));
    // The original three servers and one replacement.
    assert_eq!(report.server_pids.len(), 4);
    let kinds: Vec<EventKind> = report.events.iter().map(|e| e.kind).collect();
    for k in [
        EventKind::FailureDetected,
        EventKind::ServerReplaced,
        EventKind::TrainingResumed,
        EventKind::RecoveryComplete,
    ] {
        assert!(kinds.contains(&k), "no {k:?} in {kinds:?}");
    }
    let ec = report.ec.unwrap();
    assert_eq!(ec.rebuilds.len(), 1);
    assert_eq!((ec.rebuilds[0].server, &ec.rebuilds[0].lost), (1, &vec![1]));
    let audit = ec.audit.unwrap();
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
}

/// The default pace: the coordinator's pacer gives the replacement its starting share, and
/// the rebuild reports what it moved and how long its batches worked; the model is still the
/// failure-free one.
#[test]
fn a_paced_rebuild_reports_its_bandwidth_and_the_model_is_the_failure_free_one() {
    let paced = StrategyChoice::EcRec {
        k: 2,
        r: 1,
        code: CodeKind::Gf256,
        dense_replication: true,
        two_phase: true,
        lock_ranges: 4,
        rebuild_share_ppm: 250_000,
        rebuild_min_throughput_ppm: Some(900_000),

        backstop_every_steps: None,
    };
    let report = killed_run(3, 8, paced, &["server=1@step=3"]);
    assert_eq!(report.model_digest, none_digest(3, 8));
    let ec = report.ec.unwrap();
    let b = &ec.rebuilds[0];
    assert_eq!(b.shares.first().map(|s| s.1), Some(0.25), "{b:?}");
    assert!(b.bytes > 0 && b.batches >= 1 && b.busy_s > 0.0, "{b:?}");
    assert!(b.lock_s <= b.busy_s, "{b:?}");
    let mb_per_s = b.mb_per_s.unwrap();
    assert!(
        (mb_per_s - b.bytes as f64 / 1e6 / b.busy_s).abs() < 1e-9,
        "{b:?}"
    );
}

#[test]
fn two_servers_killed_at_once_with_r2_are_rebuilt_together() {
    let report = killed_run(
        4,
        7,
        ecrec(2, 2, CodeKind::Gf256),
        &["server=0@step=3", "server=2@step=3"],
    );
    assert_eq!(report.model_digest, none_digest(4, 7));
    assert_eq!(report.server_pids.len(), 6);
    let ec = report.ec.unwrap();
    // One rebuild round covering both: each replacement rebuilt against the lost set {0, 2}.
    assert_eq!(ec.rebuilds.len(), 2, "{:?}", ec.rebuilds);
    assert!(ec.rebuilds.iter().all(|b| b.lost == vec![0, 2]));
}

#[test]
fn a_replacement_killed_during_its_rebuild_is_replaced_and_rebuilt_again() {
    let report = killed_run(
        3,
        8,
        ecrec(2, 1, CodeKind::Gf256),
        &["server=2@step=3", "server=2@phase=rebuild"],
    );
    assert_eq!(report.model_digest, none_digest(3, 8));
    // The original, the replacement killed while rebuilding, and the one that finished.
    assert_eq!(report.server_pids.len(), 5);
    let ec = report.ec.unwrap();
    assert_eq!(ec.rebuilds.len(), 2, "{:?}", ec.rebuilds);
    assert!(ec.rebuilds[1].finished_s.is_some());
}

#[test]
fn a_server_killed_in_phase_1_aborts_the_step_which_is_retried() {
    let report = killed_run(
        3,
        6,
        ecrec(2, 1, CodeKind::Gf256),
        &["server=0@phase=prepare"],
    );
    assert_eq!(report.model_digest, none_digest(3, 6));
    let ec = report.ec.unwrap();
    assert!(ec.steps_aborted >= 1, "{ec:?}");
    assert_eq!(ec.steps_committed, 6);
}

#[test]
fn a_server_killed_in_phase_2_still_commits_the_step_everywhere_else() {
    let report = killed_run(
        3,
        6,
        ecrec(2, 1, CodeKind::Gf256),
        &["server=1@phase=commit"],
    );
    assert_eq!(report.model_digest, none_digest(3, 6));
    let ec = report.ec.unwrap();
    // The step counted as done: nothing aborted, nothing redone.
    assert_eq!((ec.steps_committed, ec.steps_aborted), (6, 0));
    assert_eq!(
        report.failures[0].detected_by.as_deref(),
        Some("commit_rpc")
    );
}

#[test]
fn with_the_sum_code_the_report_gives_the_parity_drift() {
    // The sum code is approximate by design (ECRec §3.2): the digest is not compared.
    let report = killed_run(3, 6, ecrec(2, 1, CodeKind::Sum), &["server=1@step=2"]);
    let ec = report.ec.unwrap();
    assert_eq!(ec.code, "sum");
    let audit = ec.audit.unwrap();
    assert!(audit.stripes > 0);
    assert!(audit.max_abs_error <= SUM_DRIFT_BOUND, "{audit:?}");
    assert!(!report.model_digest.is_empty());
}

#[test]
fn another_server_lost_during_a_rebuild_with_r2_restarts_it() {
    // Server 1 is rebuilding when server 3 dies: with r = 2 both are rebuilt, server 1's
    // rebuild restarted against the new lost set, and training never stops. A rebuild share
    // of 0 holds every lock range until training ends (degraded reads still decode on
    // demand), so server 1 is certainly still rebuilding when server 3 is lost.
    let mut strategy = ecrec(2, 2, CodeKind::Gf256);
    if let StrategyChoice::EcRec {
        rebuild_share_ppm, ..
    } = &mut strategy
    {
        *rebuild_share_ppm = 0;
    }
    let report = killed_run(
        4,
        8,
        strategy,
        &["server=1@step=3", "server=3@phase=rebuild"],
    );
    assert_eq!(report.model_digest, none_digest(4, 8));
    assert_eq!(report.server_pids.len(), 6);
    let ec = report.ec.unwrap();
    let of = |s: u32| -> Vec<_> { ec.rebuilds.iter().filter(|b| b.server == s).collect() };
    // Server 1: started against {1}, stopped and restarted against {1, 3} on the same node
    // (its second generation), which finished.
    let one = of(1);
    assert_eq!(one.len(), 2, "{:?}", ec.rebuilds);
    assert_eq!(
        (&one[0].lost, one[0].restarted),
        (&vec![1], true),
        "{one:?}"
    );
    assert!(one[0].finished_s.is_none(), "{one:?}");
    assert_eq!(&one[1].lost, &vec![1, 3], "{one:?}");
    assert!(one[1].finished_s.is_some() && !one[1].restarted, "{one:?}");
    assert_eq!(one[1].generation, 2, "{one:?}");
    let three = of(3);
    assert_eq!(three.len(), 1, "{:?}", ec.rebuilds);
    assert_eq!(&three[0].lost, &vec![1, 3]);
    assert_eq!(three[0].generation, 1);
}

#[test]
fn without_2pc_and_dense_replication_a_failure_free_run_is_unchanged_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 5);
    cfg.strategy = StrategyChoice::EcRec {
        k: 2,
        r: 1,
        code: CodeKind::Gf256,
        dense_replication: false,
        two_phase: false,
        lock_ranges: 1,
        rebuild_share_ppm: 1_000_000,
        rebuild_min_throughput_ppm: None,
        backstop_every_steps: None,
    };
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.model_digest, none_digest(3, 5));
    let ec = report.ec.unwrap();
    assert!(!ec.two_phase && !ec.dense_replication);
    assert_eq!((ec.steps_committed, ec.commit_s), (5, 0.0));
    assert_eq!(ec.memory.dense_replica_bytes, 0);
    let audit = ec.audit.unwrap();
    assert_eq!(audit.parity_mismatches, 0);
}

#[test]
fn a_server_kill_without_2pc_is_refused_before_anything_starts() {
    // Without 2PC deltas are applied on arrival, before their rows are installed: no
    // rebuild could read a consistent cut, so a run that will lose a server is refused.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 5);
    cfg.strategy = ecrec(2, 1, CodeKind::Gf256);
    if let StrategyChoice::EcRec { two_phase, .. } = &mut cfg.strategy {
        *two_phase = false;
    }
    cfg.kills = vec!["server=1@step=2".parse().unwrap()];
    let e = run(&cfg).unwrap_err().to_string();
    assert!(
        e.contains("--kill server=1@step=2 with --no-2pc") && e.lines().count() == 1,
        "{e}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing was started or written"
    );
}

// ---- asynchronous training: each worker coordinates its update's 2PC (ECRec §3.5) ----

/// An asynchronous run of `steps` steps (`workers` batches each) with held-out evaluation.
fn async_run(servers: u32, steps: u64, strategy: StrategyChoice, kills: &[&str]) -> RunReport {
    async_run_with(servers, 2, steps, strategy, kills)
}

/// [`async_run`] with `workers` workers.
fn async_run_with(
    servers: u32,
    workers: u32,
    steps: u64,
    strategy: StrategyChoice,
    kills: &[&str],
) -> RunReport {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, servers, steps);
    cfg.sync = false;
    cfg.workers = workers;
    cfg.eval_samples = 4096;
    cfg.strategy = strategy;
    cfg.kills = kills.iter().map(|k| k.parse().unwrap()).collect();
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none(), "{:?}", report.aborted);
    assert_eq!(report.steps, steps);
    assert_eq!(report.failures.len(), kills.len(), "{:?}", report.failures);
    for f in &report.failures {
        assert_eq!(f.steps_redone, 0, "{f:?}");
        assert!(f.recovered_s.is_some(), "{f:?}");
    }
    if let Some(ec) = &report.ec {
        assert!(ec.asynchronous);
        // Every batch was one committed transaction (a batch retried after a phase-1 loss
        // commits once).
        assert!(ec.steps_committed >= steps * u64::from(workers), "{ec:?}");
        // Phase 1 sent the parity holders the rows' differences, as the workers counted;
        // every transaction was prepared queued (the gate reserved first), but for those a
        // worker found committed when it settled them after a loss.
        if ec.two_phase {
            assert!(ec.row_deltas_sent > 0 && ec.delta_bytes_sent > 0, "{ec:?}");
            assert!(
                ec.txns_queued + ec.txns_resolved_by_workers >= ec.steps_committed,
                "{ec:?}"
            );
        }
        assert_eq!(report.checkpoints, 0);
        assert_clean_audit(&report);
    }
    report
}

/// With one worker, asynchronous training has no interleaving to differ by: the worker
/// pulls, computes and commits one batch after the other, so a run is a function of its
/// seed. ECRec loses no update and rebuilds every word exactly (gf256), and a transaction cut
/// by a loss is either aborted everywhere and retried from the same state or committed on
/// the survivors (whose parities then carry it into the rebuild): the model after a kill is
/// the model of the same run without fault tolerance, bit for bit. With two workers the
/// interleaving (and so the model, and its AUC) differs from run to run, so only what holds
/// whatever the interleaving is asserted there: every batch committed, no batch redone, the
/// rebuild finished and parities and replicas exact.
#[test]
fn asynchronous_ecrec_survives_a_server_killed_mid_run() {
    for (servers, k, r) in [(3, 2, 1), (6, 4, 2)] {
        let steps = 24;
        let none = async_run_with(servers, 1, steps, StrategyChoice::None, &[]);
        assert!(!none.model_digest.is_empty());
        for workers in [1, 2] {
            let report = async_run_with(
                servers,
                workers,
                steps,
                ecrec(k, r, CodeKind::Gf256),
                &["server=1@step=8"],
            );
            let ec = report.ec.as_ref().unwrap();
            assert_eq!(ec.rebuilds.len(), 1, "{:?}", ec.rebuilds);
            assert!(ec.rebuilds[0].finished_s.is_some());
            if workers == 1 {
                assert_eq!(
                    report.model_digest, none.model_digest,
                    "k={k} r={r}: one asynchronous worker, a server killed"
                );
            }
        }
    }
}

#[test]
fn asynchronous_ecrec_a_server_killed_in_phase_1_loses_no_batch() {
    // The server dies as a worker is about to send phase 1 of its fifth transaction. Which
    // RPC meets the loss first depends on timing: that worker's phase 1 (`worker_rpc`: it
    // aborts the transaction everywhere and trains the batch again once the replacement
    // joined), the other worker's phase 2 of a transaction the dead server had prepared
    // (`commit_rpc`: committed on the survivors), or the heartbeat. Whichever it is, no batch is lost or applied twice.
    let report = async_run(
        4,
        20,
        ecrec(2, 2, CodeKind::Gf256),
        &["server=2@phase=prepare#5"],
    );
    let f = &report.failures[0];
    assert!(
        matches!(
            f.detected_by.as_deref(),
            Some("worker_rpc" | "commit_rpc" | "heartbeat")
        ),
        "{f:?}"
    );
    let ec = report.ec.as_ref().unwrap();
    // The dead server held at most one prepared transaction (one holder at a time), so at
    // most one phase 2 met it; a loss seen by a phase 2 is such a failure.
    assert!(ec.txn_commit_failures <= 1, "{ec:?}");
    if f.detected_by.as_deref() == Some("commit_rpc") {
        assert_eq!(ec.txn_commit_failures, 1, "{f:?} {ec:?}");
    }
    // Every batch committed exactly once: an aborted attempt is not counted, a batch whose
    // phase 2 failed on the dead server is (the survivors committed it).
    assert_eq!(ec.steps_committed, 20 * 2, "{ec:?}");
    assert_eq!(ec.rebuilds.len(), 1, "{:?}", ec.rebuilds);
    assert!(ec.rebuilds[0].finished_s.is_some());
    // The parities describe the final rows exactly, so nothing of the aborted attempt was
    // left applied on one side only (checked by `async_run`'s audit).
}

#[test]
fn asynchronous_ecrec_commits_on_the_survivors_when_a_server_dies_in_phase_2() {
    let report = async_run(
        3,
        20,
        ecrec(2, 1, CodeKind::Gf256),
        &["server=0@phase=commit#4"],
    );
    // The transaction whose phase 2 met the dead server counted as done: every batch was
    // committed exactly once (none was trained again), and the survivors' parities held
    // the dead server's share of it, so the audit after its rebuild is clean.
    let ec = report.ec.unwrap();
    assert_eq!(ec.txn_commit_failures, 1, "{ec:?}");
    assert_eq!(ec.steps_committed, 20 * 2, "{ec:?}");
}

#[test]
fn asynchronous_ecrec_resolves_a_lost_worker_s_transaction() {
    // A worker killed mid-run may leave its transaction prepared on the servers; the
    // coordinator fences it and resolves the transaction, and training goes on.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 16);
    cfg.sync = false;
    cfg.strategy = ecrec(2, 1, CodeKind::Gf256);
    cfg.kills = vec!["worker=1@step=5".parse().unwrap()];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none(), "{:?}", report.aborted);
    assert_eq!(report.steps, 16);
    assert_clean_audit(&report);
}

#[test]
fn asynchronous_ecrec_a_worker_killed_after_phase_1_has_its_transaction_resolved_once() {
    // Worker 1 is SIGKILLed once its third transaction is prepared on every server, before
    // phase 2: the coordinator fences it, finds the transaction committed nowhere, aborts
    // it everywhere and has the batch trained again, once.
    let report = async_run(
        3,
        12,
        ecrec(2, 1, CodeKind::Gf256),
        &["worker=1@phase=commit#3"],
    );
    let resolved: Vec<_> = report
        .events
        .iter()
        .filter(|e| e.kind == EventKind::TransactionsResolved)
        .collect();
    assert!(
        resolved.iter().any(|e| e.detail.contains("aborted batch")),
        "{resolved:?}"
    );
    let ec = report.ec.as_ref().unwrap();
    assert_eq!(ec.steps_committed, 12 * 2, "{ec:?}");
}

#[test]
fn asynchronous_ecrec_a_server_lost_while_a_phase_reached_some_servers_keeps_the_model_exact() {
    // Phase 1 or 2 of a transaction was answered by servers 0 and 1 and not yet sent to 2
    // and 3 when the server died (one in each half). With one worker there is no
    // interleaving: the run ends with the model of the same run without fault tolerance,
    // every batch applied exactly once.
    let steps = 12;
    let none = async_run_with(4, 1, steps, StrategyChoice::None, &[]);
    for kill in [
        "server=0@phase=prepare-some#5",
        "server=3@phase=prepare-some#5",
        "server=1@phase=commit-some#5",
        "server=2@phase=commit-some#5",
    ] {
        let report = async_run_with(4, 1, steps, ecrec(2, 1, CodeKind::Gf256), &[kill]);
        assert_eq!(report.model_digest, none.model_digest, "{kill}");
        let ec = report.ec.as_ref().unwrap();
        assert_eq!(ec.steps_committed, steps, "{kill}: {ec:?}");
        assert!(ec.rebuilds[0].finished_s.is_some(), "{kill}");
    }
}

#[test]
fn asynchronous_ecrec_another_server_lost_during_a_rebuild_with_r2_restarts_it() {
    // As in synchronous mode: server 1 is rebuilding (held at share 0) when server 3 dies;
    // both are rebuilt and the single worker's model is the one without fault tolerance.
    let mut strategy = ecrec(2, 2, CodeKind::Gf256);
    if let StrategyChoice::EcRec {
        rebuild_share_ppm, ..
    } = &mut strategy
    {
        *rebuild_share_ppm = 0;
    }
    let steps = 10;
    let none = async_run_with(4, 1, steps, StrategyChoice::None, &[]);
    let report = async_run_with(
        4,
        1,
        steps,
        strategy,
        &["server=1@step=3", "server=3@phase=rebuild"],
    );
    assert_eq!(report.model_digest, none.model_digest);
    let ec = report.ec.unwrap();
    assert!(
        ec.rebuilds.iter().any(|b| b.server == 1 && b.restarted),
        "{:?}",
        ec.rebuilds
    );
    assert!(ec
        .rebuilds
        .iter()
        .all(|b| b.restarted || b.finished_s.is_some()));
}

#[test]
fn asynchronous_ecrec_without_2pc_keeps_parities_and_replicas_exact() {
    let mut strategy = ecrec(2, 1, CodeKind::Gf256);
    if let StrategyChoice::EcRec { two_phase, .. } = &mut strategy {
        *two_phase = false;
    }
    let report = async_run(3, 12, strategy, &[]);
    assert!(!report.ec.unwrap().two_phase);
}

/// `ecrec` with ECRec §4's second layer: a full checkpoint every 5 steps.
fn backstopped() -> StrategyChoice {
    let mut s = ecrec(2, 1, CodeKind::Gf256);
    if let StrategyChoice::EcRec {
        backstop_every_steps,
        ..
    } = &mut s
    {
        *backstop_every_steps = Some(5);
    }
    s
}

/// Run `strategy` with `kills` to the end (not aborted), every process reaped.
fn finished_run(
    sync: bool,
    servers: u32,
    steps: u64,
    strategy: StrategyChoice,
    kills: &[&str],
) -> RunReport {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, servers, steps);
    cfg.sync = sync;
    cfg.strategy = strategy;
    cfg.kills = kills.iter().map(|k| k.parse().unwrap()).collect();
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none(), "{:?}", report.aborted);
    assert_eq!(report.steps, steps);
    report
}

/// Two of three servers lost at once with r = 1: some stripes lost two members, more than the
/// code decodes. Without a backstop the run ends, saying why; with one (ECRec §4's second
/// layer) every server loads the newest backstop, the parities and replicas are re-encoded
/// from the restored rows, the steps since are trained again, and the model is the
/// failure-free one bit for bit (synchronous), with a clean audit in both modes.
#[test]
fn more_losses_than_r_restore_the_backstop_and_end_at_the_failure_free_model() {
    let steps = 24;
    let kills = ["server=0@step=12", "server=2@step=12"];
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, steps);
    cfg.strategy = ecrec(2, 1, CodeKind::Gf256);
    cfg.kills = kills.iter().map(|k| k.parse().unwrap()).collect();
    let aborted = run(&cfg).unwrap();
    assert!(
        aborted
            .aborted
            .as_deref()
            .is_some_and(|a| a.contains("r = 1")),
        "{:?}",
        aborted.aborted
    );

    let report = finished_run(true, 3, steps, backstopped(), &kills);
    assert_eq!(report.model_digest, none_digest(3, steps));
    assert_clean_audit(&report);
    assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
    for f in &report.failures {
        // Back to the backstop of step 10: steps 11 and 12 trained again.
        assert_eq!(f.steps_redone, 2, "{f:?}");
        assert!(f.recovered_s.is_some(), "{f:?}");
        assert_eq!(f.servers_restored, vec![0, 1, 2], "{f:?}");
    }
    let from: Vec<_> = report
        .events
        .iter()
        .filter(|e| e.kind == EventKind::RecoveryStart)
        .map(|e| e.detail.clone())
        .collect();
    // One restore, from the backstop of step 10; the first loss may have been seen alone and
    // its rebuild started before the second (then superseded by the restore).
    let (last, before) = from.split_last().expect("a recovery");
    assert!(
        last.contains("-full-") && last.contains("step 10"),
        "{from:?}"
    );
    assert!(
        before.iter().all(|b| b.starts_with("ECRec rebuild")),
        "{from:?}"
    );
    assert!(
        report
            .events
            .iter()
            .any(|e| e.kind == EventKind::ServerRestored && e.detail.contains("re-encoded")),
        "{:#?}",
        report.events
    );
    // Backstops at 5, 10 (twice: before and after the loss), 15, 20 and the final 24.
    assert!(report.checkpoints >= 5, "{}", report.checkpoints);

    let report = finished_run(false, 3, steps, backstopped(), &kills);
    assert_clean_audit(&report);
    assert!(report.samples_redone > 0);
    assert!(report.failures.iter().all(|f| f.recovered_s.is_some()));
}

/// A second server lost while the first one's replacement rebuilds (r = 1): whether the
/// rebuild had finished (two rebuilds) or not (a restore from the backstop, the rebuild under
/// way superseded), the run ends at the failure-free model (synchronous) with a clean audit,
/// and later backstops reach the replacements too.
#[test]
fn a_second_loss_during_a_rebuild_with_a_backstop_ends_at_the_failure_free_model() {
    let steps = 24;
    let kills = ["server=0@step=8", "server=1@phase=rebuild"];
    let report = finished_run(true, 3, steps, backstopped(), &kills);
    assert_eq!(report.model_digest, none_digest(3, steps));
    assert_clean_audit(&report);
    assert!(report.failures.iter().all(|f| f.recovered_s.is_some()));
    assert_eq!(
        report.checkpoints_failed, 0,
        "{:?}",
        report.checkpoint_failures
    );
    let report = finished_run(false, 3, steps, backstopped(), &kills);
    assert_clean_audit(&report);
    assert!(report.failures.iter().all(|f| f.recovered_s.is_some()));
    assert_eq!(
        report.checkpoints_failed, 0,
        "{:?}",
        report.checkpoint_failures
    );
}

/// A server lost while a backstop is written (the save fails, the loss is rebuilt, the next
/// save point tries again), and a third server lost while the backstop is restored (restored
/// again): the failure-free model, a clean audit.
#[test]
fn kills_during_a_backstop_save_and_during_its_restore_end_at_the_failure_free_model() {
    let steps = 24;
    let clean = none_digest(3, steps);
    for kills in [
        &["server=1@phase=checkpoint-write"][..],
        &[
            "server=0@step=12",
            "server=2@step=12",
            "server=1@phase=recovery",
        ][..],
    ] {
        let report = finished_run(true, 3, steps, backstopped(), kills);
        assert_eq!(report.model_digest, clean, "{kills:?}");
        assert_clean_audit(&report);
        assert_eq!(report.failures.len(), kills.len(), "{kills:?}");
        // Every phase of every failure is known, the one injected during the restore too.
        assert!(
            report.failures.iter().all(|f| f.detected_s.is_some()
                && f.resumed_s.is_some()
                && f.recovered_s.is_some()),
            "{kills:?}: {:?}",
            report.failures
        );
    }
}

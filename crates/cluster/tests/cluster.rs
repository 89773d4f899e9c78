//! Real multi-process runs: server and worker processes of `ftrec-cluster-server`, real
//! SIGKILLs.

mod common;

use ftrec_ckpt::deck::{Lineage, StagingOptions};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{CheckpointKind, Checkpoints, DataPosition};
use ftrec_cluster::{
    build_server, run, EventKind, KillSpec, Role, RunConfig, RunReport, StrategyChoice,
};
use ftrec_core::ModelDigest;
use ftrec_ps::ckpt::{CkptApi, CkptNode};
use ftrec_ps::SharedServer;

fn config(dir: &tempfile::TempDir, servers: u32, workers: u32, steps: u64) -> RunConfig {
    let mut cfg = common::tiny_run(dir.path(), servers, workers, steps, 11);
    cfg.eval_samples = 512;
    cfg
}

fn kill(text: &str) -> KillSpec {
    text.parse().unwrap()
}

/// Every server and worker process the run started is gone (reaped: signal 0 finds no
/// process) and every address a server listened on can be bound again.
fn assert_no_children_left(report: &RunReport) {
    assert!(!report.server_pids.is_empty());
    assert_eq!(
        report.worker_pids.len() as u32,
        report.config.workers
            + report
                .failures
                .iter()
                .filter(|f| f.role == Role::Worker)
                .count() as u32
    );
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

#[test]
fn one_worker_sync_run_equals_the_single_process_trainer_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, 2, 1, 12);
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());

    let mut local =
        ftrec_worker::TrainConfig::from_preset("tiny", ftrec_worker::DataSpec::Synthetic).unwrap();
    local.steps = cfg.steps;
    local.batch = cfg.batch;
    local.seed = cfg.seed;
    local.threads = 1;
    local.eval_samples = 512;
    let single = ftrec_worker::train(&local, &mut |_| {}).unwrap();
    assert_eq!(report.model_digest.len(), single.model_digest.len());
    assert_eq!(report.model_digest, single.model_digest);
    // Same model, same held-out set: same metrics.
    assert_eq!(report.auc, Some(single.auc));
    assert_eq!(report.samples, 12 * 64);
}

#[test]
fn full_recovery_after_a_kill_gives_the_failure_free_model() {
    let clean_dir = tempfile::tempdir().unwrap();
    let mut clean = config(&clean_dir, 2, 2, 20);
    clean.strategy = StrategyChoice::Full { every_steps: 5 };
    clean.eval_samples = 0;
    let clean = run(&clean).unwrap();
    assert_no_children_left(&clean);
    assert!(clean.failures.is_empty());
    assert!(!clean.model_digest.is_empty());
    assert_eq!(clean.checkpoints, 4);

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 2, 20);
    cfg.strategy = StrategyChoice::Full { every_steps: 5 };
    cfg.kills = vec![KillSpec::server_at_step(1, 12)];
    cfg.eval_samples = 0;
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);

    assert!(report.aborted.is_none());
    assert_eq!(report.steps, 20);
    assert_eq!(report.model_digest, clean.model_digest);
    assert_eq!(report.failures.len(), 1);
    let f = &report.failures[0];
    assert_eq!((f.role, f.id, f.step), (Role::Server, 1, 12));
    // Restored from the checkpoint of step 10: steps 11 and 12 were redone.
    assert_eq!(f.steps_redone, 2);
    let (d, p, r, c) = (
        f.detected_s.unwrap(),
        f.replaced_s.unwrap(),
        f.resumed_s.unwrap(),
        f.recovered_s.unwrap(),
    );
    assert!(d <= p && p <= r && r <= c, "{f:?}");
    let o = report.overheads;
    assert!(o.o_save > 0.0 && o.o_load > 0.0 && o.o_lost > 0.0 && o.o_res > 0.0);
    // Two servers at the start and one replacement.
    assert_eq!(report.server_pids.len(), 3);
    let kinds: Vec<EventKind> = report.events.iter().map(|e| e.kind).collect();
    for k in [
        EventKind::CheckpointStart,
        EventKind::CheckpointEnd,
        EventKind::FailureInjected,
        EventKind::FailureDetected,
        EventKind::RecoveryStart,
        EventKind::ServerReplaced,
        EventKind::TrainingResumed,
        EventKind::RecoveryComplete,
    ] {
        assert!(kinds.contains(&k), "no {k:?} event in {kinds:?}");
    }
    assert!(report.bytes_written > 0);
    // The store holds full checkpoints in the servers' checkpoint format; superseded ones are
    // collected once a newer one is committed, so what is left is the final model, step 20
    // (global batch 40 of 2 workers), which restores to the run's digest.
    let l = lineage(&cfg);
    let nodes: Vec<_> = l.nodes().collect();
    assert_eq!(nodes.len(), 1, "{}", l.render());
    assert_eq!((nodes[0].kind, nodes[0].step), (CheckpointKind::Full, 20));
    let m = manifest(&cfg, &nodes[0].id);
    assert_eq!(
        m.data_position,
        DataPosition::Json(serde_json::json!({
            "batches": 40,
            "samples": 40 * 64,
            "position": {"kind": "synthetic", "sample": 40 * 64},
        }))
    );
    assert_eq!(restored_digest(&cfg, cfg.servers), report.model_digest);
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn checkpoints(cfg: &RunConfig) -> Checkpoints {
    block_on(async {
        Checkpoints::new(
            location::open(&cfg.store_location(), &LocationOptions::from_env())
                .await
                .unwrap(),
        )
    })
}

fn lineage(cfg: &RunConfig) -> Lineage {
    let c = checkpoints(cfg);
    block_on(async { Lineage::load(&c).await.unwrap() })
}

fn manifest(cfg: &RunConfig, id: &ftrec_ckpt::CheckpointId) -> ftrec_ckpt::Manifest {
    let c = checkpoints(cfg);
    block_on(async { c.read_manifest(id, None).await.unwrap() })
}

/// Restore the store's `CURRENT` into `servers` fresh in-process servers (through the
/// checkpoint service the server processes run) and digest the model.
fn restored_digest(cfg: &RunConfig, servers: u32) -> String {
    let loc = cfg.store_location();
    let mut cfg = cfg.clone();
    cfg.servers = servers;
    let tip = lineage(&cfg).head().unwrap();
    block_on(async {
        let staging = tempfile::tempdir().unwrap();
        let mut digest = ModelDigest::default();
        for id in 0..servers {
            let server = SharedServer::new(build_server(&cfg.server_spec(id)).unwrap());
            let node = CkptNode::new(
                server.clone(),
                StagingOptions::new(staging.path()),
                LocationOptions::from_env(),
            )
            .unwrap();
            node.restore(loc.clone(), tip.clone()).await.unwrap();
            digest.merge(&server.read().unwrap().digest());
        }
        digest.hex()
    })
}

#[test]
fn a_checkpoint_of_3_servers_restores_onto_2_and_onto_5_with_the_same_digest() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 2, 6);
    cfg.strategy = StrategyChoice::Full { every_steps: 3 };
    cfg.eval_samples = 0;
    let report = run(&cfg).unwrap();
    assert_eq!(restored_digest(&cfg, 3), report.model_digest);
    // Rows carry their global ids: each new server keeps what the new shard map gives it.
    assert_eq!(restored_digest(&cfg, 2), report.model_digest);
    assert_eq!(restored_digest(&cfg, 5), report.model_digest);
    assert_eq!(restored_digest(&cfg, 1), report.model_digest);
}

#[test]
fn a_kill_before_the_first_checkpoint_restarts_from_the_seed() {
    let clean_dir = tempfile::tempdir().unwrap();
    let mut clean = config(&clean_dir, 3, 1, 6);
    clean.eval_samples = 0;
    let clean = run(&clean).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 1, 6);
    cfg.strategy = StrategyChoice::Full { every_steps: 100 };
    cfg.kills = vec![KillSpec::server_at_step(0, 3)];
    cfg.eval_samples = 0;
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    // Every server reset itself to the seed's state; the one checkpoint is the final save.
    assert_eq!(report.checkpoints, 1);
    assert_eq!(report.failures[0].steps_redone, 3);
    assert_eq!(report.model_digest, clean.model_digest);
    assert_eq!(lineage(&cfg).newest_state().map(|n| n.step), Some(6));
}

#[test]
fn collections_after_commits_keep_only_the_live_lineage_across_a_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 3, 1, 12);
    cfg.strategy = StrategyChoice::Full { every_steps: 2 };
    cfg.kills = vec![KillSpec::server_at_step(2, 7)];
    cfg.eval_samples = 0;
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none(), "{:?}", report.aborted);
    assert!(report.checkpoints >= 6, "{}", report.checkpoints);
    // Every full replaced the one before it: the store holds the final save only, before
    // and after the recovery (the coordinator's lineage carries on from its commits).
    let l = lineage(&cfg);
    let ids: Vec<_> = l.nodes().map(|n| (n.step, n.kind)).collect();
    assert_eq!(
        ids,
        vec![(12, ftrec_ckpt::CheckpointKind::Full)],
        "{}",
        l.render()
    );
    assert_eq!(restored_digest(&cfg, 3), report.model_digest);
}

#[test]
fn strategy_none_ends_the_run_on_a_kill_and_names_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 10);
    cfg.kills = vec![KillSpec::server_at_step(1, 4)];
    cfg.eval_samples = 0;
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    let reason = report.aborted.as_deref().unwrap();
    assert!(reason.contains("server 1"), "{reason}");
    assert_eq!(report.steps, 4);
    assert!(report.model_digest.is_empty());
    assert!(report.failures[0].detected_s.is_some());
}

#[test]
fn a_server_executable_that_cannot_start_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 3);
    cfg.exe = dir.path().join("no-such-binary");
    let e = run(&cfg).unwrap_err();
    assert!(
        matches!(&e, ftrec_cluster::ClusterError::Spawn { what, .. } if what == "server 0"),
        "{e}"
    );
}

#[test]
fn asynchronous_mode_trains_every_step_with_several_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 3, 8);
    cfg.sync = false;
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.steps, 8);
    assert_eq!(report.samples, 8 * 3 * 64);
    assert!(report.train_loss.is_finite());
    assert!(report.auc.is_some_and(|a| a > 0.0 && a < 1.0));
}

/// The failure-free digest of `cfg` (same config, no kills).
fn clean_digest(cfg: &RunConfig) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut clean = cfg.clone();
    clean.work_dir = dir.path().to_path_buf();
    clean.store = None;
    clean.kills.clear();
    let report = run(&clean).unwrap();
    assert!(report.failures.is_empty());
    report.model_digest
}

#[test]
fn a_killed_worker_is_replaced_and_the_synchronous_model_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 2, 10);
    cfg.eval_samples = 0;
    cfg.kills = vec![kill("worker=1@step=4")];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    assert_eq!(report.steps, 10);
    let f = &report.failures[0];
    assert_eq!((f.role, f.id, f.steps_redone), (Role::Worker, 1, 0));
    assert!(f.detected_s.is_some() && f.recovered_s.is_some());
    // A worker holds no model state: even strategy `none` loses nothing.
    assert_eq!(report.model_digest, clean_digest(&cfg));
}

#[test]
fn a_server_killed_while_a_checkpoint_is_written_recovers_from_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 12);
    cfg.eval_samples = 0;
    cfg.strategy = StrategyChoice::Full { every_steps: 4 };
    cfg.kills = vec![kill("server=0@phase=checkpoint-write")];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    let kinds: Vec<EventKind> = report.events.iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&EventKind::CheckpointFailed), "{kinds:?}");
    // The first save (step 4) failed, so the model went back to the seed: 4 steps redone.
    assert_eq!(report.failures[0].steps_redone, 4);
    assert_eq!(report.model_digest, clean_digest(&cfg));
}

#[test]
fn a_replacement_killed_during_recovery_is_replaced_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 12);
    cfg.eval_samples = 0;
    cfg.strategy = StrategyChoice::Full { every_steps: 3 };
    cfg.kills = vec![
        KillSpec::server_at_step(1, 7),
        kill("server=1@phase=recovery"),
    ];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    // The original, the first replacement (killed while loading) and the second one.
    assert_eq!(report.server_pids.len(), 4);
    assert_eq!(report.failures.len(), 2);
    assert_eq!(report.model_digest, clean_digest(&cfg));
}

#[test]
fn a_kill_at_a_time_is_recovered_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 30);
    cfg.eval_samples = 0;
    cfg.strategy = StrategyChoice::Full { every_steps: 5 };
    cfg.kills = vec![kill("server=1@time=0.2")];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.model_digest, clean_digest(&cfg));
}

#[test]
fn asynchronous_training_survives_worker_and_server_kills() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 2, 16);
    cfg.sync = false;
    cfg.eval_samples = 0;
    cfg.strategy = StrategyChoice::Full { every_steps: 4 };
    cfg.kills = vec![kill("worker=0@step=3"), KillSpec::server_at_step(0, 9)];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    assert_eq!(report.steps, 16);
    assert_eq!(report.failures.len(), 2);
    assert!(
        report.failures.iter().all(|f| f.recovered_s.is_some()),
        "{:?}",
        report.failures
    );
    assert!(!report.throughput.is_empty());
}

#[test]
fn one_asynchronous_worker_trains_the_single_process_model_bit_for_bit() {
    // With one worker nothing is stale: each push lands before the next pull, so
    // asynchronous mode must give exactly the synchronous (and single-process) model.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 2, 1, 12);
    cfg.eval_samples = 0;
    let sync = run(&cfg).unwrap();
    cfg.sync = false;
    let dir2 = tempfile::tempdir().unwrap();
    cfg.work_dir = dir2.path().to_path_buf();
    let asynchronous = run(&cfg).unwrap();
    assert_no_children_left(&asynchronous);
    assert_eq!(asynchronous.model_digest, sync.model_digest);
}

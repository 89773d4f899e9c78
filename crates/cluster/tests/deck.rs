//! `deck` runs with real processes: servers writing delta checkpoints through their checkpoint
//! service, a merger process, and real SIGKILLs of servers and of the merger.

mod common;

use ftrec_ckpt::deck::{select_chain, Lineage, RestoreAt, StagingOptions};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{CheckpointKind, Checkpoints};
use ftrec_cluster::{
    build_server, run, EventKind, KillSpec, Role, RunConfig, RunReport, StrategyChoice,
};
use ftrec_core::ModelDigest;
use ftrec_ps::ckpt::{CkptApi, CkptNode};
use ftrec_ps::SharedServer;

fn config(dir: &tempfile::TempDir, steps: u64) -> RunConfig {
    common::tiny_run(dir.path(), 2, 2, steps, 5)
}

fn deck(every: u64, stride: Option<u64>, mib_per_s: Option<f64>) -> StrategyChoice {
    StrategyChoice::Deck {
        delta_every_steps: every,
        full_every_deltas: None,
        merge_stride: stride,
        merge_mib_per_s: mib_per_s,
    }
}

/// The digest of the failure-free synchronous run of `steps` steps (no fault tolerance).
fn failure_free(steps: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let report = run(&config(&dir, steps)).unwrap();
    report.model_digest
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Load the state `at` names from the run's store into fresh in-process servers, through
/// the same checkpoint service the server processes run, and digest the model.
fn restored_digest(cfg: &RunConfig, at: RestoreAt) -> (u64, String) {
    let loc = cfg.store_location();
    let (step, tip) = block_on(async {
        let store = location::open(&loc, &LocationOptions::from_env())
            .await
            .unwrap();
        let ckpts = Checkpoints::new(store);
        let chain = select_chain(&ckpts, &at, false).await.unwrap();
        let tip = chain.last().unwrap().clone();
        (tip.step, tip.id)
    });
    (step, digest_of_state(cfg, &tip).unwrap())
}

/// Fresh in-process servers restored by the checkpoint service from the state `id` names (a
/// checkpoint's id, or a delta's that merging replaced), digested.
fn digest_of_state(cfg: &RunConfig, id: &ftrec_ckpt::CheckpointId) -> Result<String, String> {
    let loc = cfg.store_location();
    block_on(async {
        let mut digest = ModelDigest::default();
        let staging = tempfile::tempdir().unwrap();
        for server_id in 0..cfg.servers {
            let server = SharedServer::new(build_server(&cfg.server_spec(server_id)).unwrap());
            let node = CkptNode::new(
                server.clone(),
                StagingOptions::new(staging.path()),
                LocationOptions::from_env(),
            )
            .unwrap();
            node.restore(loc.clone(), id.clone())
                .await
                .map_err(|e| e.to_string())?;
            digest.merge(&server.read().unwrap().digest());
        }
        Ok(digest.hex())
    })
}

fn lineage(cfg: &RunConfig) -> Lineage {
    block_on(async {
        let store = location::open(&cfg.store_location(), &LocationOptions::from_env())
            .await
            .unwrap();
        Lineage::load(&Checkpoints::new(store)).await.unwrap()
    })
}

fn events(report: &RunReport, kind: EventKind) -> Vec<String> {
    report
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.detail.clone())
        .collect()
}

/// Every process the run started (servers, workers, mergers) is gone.
fn assert_no_children_left(report: &RunReport) {
    for &pid in report.server_pids.iter().chain(&report.worker_pids) {
        // SAFETY: signal 0 only checks for existence; it sends nothing.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        assert_eq!(r, -1, "process {pid} is still alive");
    }
}

#[test]
fn deck_recovery_after_a_server_kill_gives_the_failure_free_model() {
    let steps = 24;
    let clean = failure_free(steps);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, steps);
    cfg.strategy = deck(3, Some(2), None);
    cfg.kills = vec!["server=1@step=14".parse().unwrap()];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert!(report.aborted.is_none());
    assert_eq!(report.model_digest, clean);
    let f: Vec<_> = report
        .failures
        .iter()
        .filter(|f| f.role == Role::Server)
        .collect();
    assert_eq!(f.len(), 1);
    assert!(f[0].recovered_s.is_some());
    // The recovery went back to a committed delta, not to the full or the start.
    let from = events(&report, EventKind::RecoveryStart);
    assert!(from[0].contains("-delta-"), "{:#?}", report.events);
    assert!(f[0].steps_redone < 14, "{:?}", f[0]);
    // The store ends at the final model, reachable through full + merged + deltas.
    let (step, digest) = restored_digest(&cfg, RestoreAt::Current);
    assert_eq!(step, steps);
    assert_eq!(digest, clean);
    let l = lineage(&cfg);
    assert!(
        l.nodes().any(|n| n.kind == CheckpointKind::Merged),
        "{}",
        l.render()
    );
    // A recovery names the committed state, which may be a delta merging has replaced and
    // collected: the servers restore it through the merged checkpoint standing for it.
    let merged: Vec<_> = l
        .nodes()
        .filter(|n| n.kind == CheckpointKind::Merged && !l.nodes().any(|m| m.id == n.tip))
        .collect();
    assert!(!merged.is_empty(), "no delta was collected: {}", l.render());
    for n in merged {
        assert_eq!(
            digest_of_state(&cfg, &n.tip),
            digest_of_state(&cfg, &n.id),
            "restoring {} (replaced by {})",
            n.tip,
            n.id
        );
    }
}

#[test]
fn a_server_killed_while_a_delta_uploads_leaves_the_last_committed_lineage() {
    let steps = 20;
    let clean = failure_free(steps);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, steps);
    cfg.strategy = deck(2, None, None);
    // The third save is the second delta: killed right after its copy-out, while its files
    // upload; nothing of it may be committed.
    cfg.kills = vec!["server=0@phase=checkpoint-write#3".parse().unwrap()];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.model_digest, clean);
    let dropped = events(&report, EventKind::CheckpointFailed);
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(dropped[0].contains("-delta-a0"), "{dropped:?}");
    let from = events(&report, EventKind::RecoveryStart);
    assert!(from[0].contains("-delta-a0"), "{from:?}");
    // The dropped delta is not in the lineage; what is there restores to the final model.
    let dropped_id = dropped[0].split(':').next().unwrap().to_string();
    let l = lineage(&cfg);
    assert!(l.nodes().all(|n| n.id.to_string() != dropped_id));
    assert_eq!(restored_digest(&cfg, RestoreAt::Current), (steps, clean));
}

#[test]
fn a_merger_killed_mid_merge_leaves_a_lineage_that_restores_and_merging_resumes() {
    let steps = 24;
    let clean = failure_free(steps);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, steps);
    // Slow merges (throttled), so the kill lands while merged files are being written.
    cfg.strategy = deck(2, Some(2), Some(0.25));
    cfg.ckpt_chunk_kib = 16;
    cfg.kills = vec!["merger=0@phase=merge".parse().unwrap()];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.model_digest, clean);
    let killed: Vec<_> = report
        .failures
        .iter()
        .filter(|f| f.role == Role::Merger)
        .collect();
    assert_eq!(killed.len(), 1);
    assert!(!events(&report, EventKind::MergerFailed).is_empty());
    // Later passes merged anyway.
    assert!(!events(&report, EventKind::MergerFinished).is_empty());
    assert_eq!(restored_digest(&cfg, RestoreAt::Current), (steps, clean));
}

/// Every object of the store, by key and size.
fn objects(ckpts: &Checkpoints) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = block_on(ckpts.store().list(None))
        .unwrap()
        .into_iter()
        .map(|m| (m.key.to_string(), m.size))
        .collect();
    v.sort();
    v
}

/// A merger started for a writer that no longer holds the store (its job gave the lease up, or
/// another took it over while the merger ran on) merges and deletes nothing; the holder's own
/// generation merges.
#[test]
fn a_merger_of_a_writer_that_lost_the_store_merges_and_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 12);
    // Six deltas and no merger during the run: a pass afterwards has work to do.
    cfg.strategy = deck(2, None, None);
    run(&cfg).unwrap();
    let loc = cfg.store_location();
    let ckpts =
        Checkpoints::new(block_on(location::open(&loc, &LocationOptions::from_env())).unwrap());
    let job = block_on(ftrec_ckpt::lease::read_lease(&ckpts))
        .unwrap()
        .unwrap();
    assert!(job.released);
    let mut pass = ftrec_cluster::merger::MergerArgs::for_run(loc.clone(), 2, None, None);
    pass.writer_generation = Some(job.generation);
    let before = objects(&ckpts);
    // The job ended: its merger has nothing more to do on the store.
    let e = ftrec_cluster::merger::merge_once(&pass).unwrap_err();
    assert!(
        matches!(&e, ftrec_cluster::ClusterError::Fenced(m) if m.contains("given up")),
        "{e}"
    );
    assert_eq!(objects(&ckpts), before);
    // Another writer takes the store over: the old generation's pass is refused naming it.
    let lease = block_on(ftrec_ckpt::lease::Lease::acquire(
        &ckpts,
        "the next job",
        std::time::Duration::from_secs(60),
    ))
    .unwrap();
    assert_eq!(lease.generation(), job.generation + 1);
    let before = objects(&ckpts);
    let e = ftrec_cluster::merger::merge_once(&pass).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains(&format!("generation {}", job.generation + 1)) && m.contains("held"),
        "{m}"
    );
    assert_eq!(objects(&ckpts), before);
    // The holder's generation merges.
    pass.writer_generation = Some(lease.generation());
    let (merged, gc) = ftrec_cluster::merger::merge_once(&pass).unwrap();
    assert!(!merged.written.is_empty());
    assert!(gc.is_some());
    assert_ne!(objects(&ckpts), before);
}

#[test]
fn deck_flags_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 10);
    cfg.strategy = deck(0, None, None);
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--delta-every-steps"));
    cfg.strategy = deck(2, Some(1), None);
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--merge-stride"));
    cfg.strategy = deck(2, Some(2), Some(-1.0));
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--merge-mib-per-s"));
    cfg.strategy = StrategyChoice::None;
    cfg.store = Some("/tmp/x".into());
    assert!(cfg.validate().unwrap_err().to_string().contains("--store"));
    cfg.store = None;
    cfg.kills = vec!["merger=0@phase=merge".parse().unwrap()];
    assert!(cfg.validate().unwrap_err().to_string().contains("merger"));
}

#[test]
fn a_deck_run_against_a_real_s3_server_recovers_and_its_store_restores() {
    use ftrec_ckpt::testing::{s3_server, BUCKET};
    // Servers and the merger are child processes: they reach the store through the usual
    // AWS variables, as in production. No other test in this binary reads them.
    s3_server().set_env();
    let steps = 16;
    let clean = failure_free(steps);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, steps);
    cfg.strategy = deck(3, Some(2), None);
    cfg.store = Some(format!("s3://{BUCKET}/deck-e2e-{}", std::process::id()));
    cfg.kills = vec!["server=0@step=10".parse().unwrap()];
    let report = run(&cfg).unwrap();
    assert_no_children_left(&report);
    assert_eq!(report.model_digest, clean);
    assert!(events(&report, EventKind::RecoveryStart)[0].contains("-delta-"));
    assert_eq!(restored_digest(&cfg, RestoreAt::Current), (steps, clean));
    // Nothing was written to the local disk but staging.
    assert!(!cfg.work_dir.join("ckpt").exists());
}

/// `cpr` (cpr.txt §2.3, §4) with real processes: the servers' checkpoint service writes full
/// and prioritized saves, and a SIGKILLed server is replaced and restored alone while the
/// survivors and the workers go on.
mod cpr {
    use super::*;
    use ftrec_ckpt::cpr::Priority;
    use ftrec_strategy::CprInterval;

    fn cpr(every: u64, priority: Option<Priority>, saves_per_full: u64) -> StrategyChoice {
        StrategyChoice::Cpr {
            interval: CprInterval::Steps(every),
            priority,
            r: 0.125,
            saves_per_full,
            ssu_period: 2,
            largest_tables: 7,
        }
    }

    /// Synchronous mode: partial recovery is not the failure-free model, but it is a pure
    /// function of the configuration and the kill: the same kill twice gives the same digest.
    /// Without a kill, saving changes nothing.
    #[test]
    fn a_partial_recovery_is_reproducible_in_deterministic_mode() {
        let steps = 20;
        let clean = failure_free(steps);
        let strategy = cpr(8, Some(Priority::Ssu), 4);
        let run_with = |kills: &[&str]| {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(&dir, steps);
            cfg.strategy = strategy;
            cfg.kills = kills.iter().map(|k| k.parse().unwrap()).collect();
            let report = run(&cfg).unwrap();
            assert_no_children_left(&report);
            assert!(report.aborted.is_none());
            report
        };
        assert_eq!(run_with(&[]).model_digest, clean);
        let a = run_with(&["server=1@step=13"]);
        let b = run_with(&["server=1@step=13"]);
        assert_eq!(a.model_digest, b.model_digest);
        assert_ne!(
            a.model_digest, clean,
            "the lost shard went back to its saves"
        );
        assert_eq!(a.steps, steps);
        assert_eq!(a.samples_redone, 0);
        let f: Vec<_> = a
            .failures
            .iter()
            .filter(|f| f.role == Role::Server)
            .collect();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].servers_restored, vec![1]);
        assert_eq!(f[0].steps_redone, 0);
        // Saves (CPR §5.1): a full at the first point (2, prioritized saves need a base),
        // then prioritized saves only, at 4, 6, ..., 12. The loss after step 13 restores the
        // chain of the full and the five prioritized saves, each row from the newest save
        // holding it; Eq. 3 counts from the newest save: 1 step of 20, half the model: 0.025.
        let from = events(&a, EventKind::RecoveryStart);
        assert!(
            from[0].contains("00000000000000000012-prioritized"),
            "{from:?}"
        );
        let restored = events(&a, EventKind::ServerRestored);
        assert!(restored[0].contains("6 checkpoints"), "{restored:?}");
        let c = a.cpr.as_ref().unwrap();
        let p = &c.pls.per_failure[0];
        assert_eq!((p.server, p.step, p.full_step, p.steps_lost), (1, 13, 2, 1));
        assert_eq!(c.pls.total, 1.0 / 20.0 * 0.5);
        // Counting what was saved: the rows SSU left out of the saves are older than step 12,
        // so the loss is larger than Eq. 3's (the figure is deterministic in this mode).
        let saved = p
            .saved_steps_lost
            .expect("every server reported what it left out");
        assert!(saved > 1.0, "{saved}");
        assert_eq!(c.pls.saved_total, p.saved_pls);
        assert_eq!(b.cpr.as_ref().unwrap().pls.saved_total, c.pls.saved_total);
        assert_eq!((c.full_saves, c.partial_saves), (2, 9));
        assert_eq!(c.recovery, "partial");
    }

    /// Asynchronous mode, CPR's home: two servers killed at different points; each is
    /// replaced and restored alone, nothing is redone, and the run trains all its steps.
    #[test]
    fn asynchronous_partial_recovery_restores_only_the_lost_server() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir, 30);
        cfg.servers = 3;
        cfg.sync = false;
        cfg.eval_samples = 1024;
        // Save points every 4 steps: each kill falls 2 steps after one, so Eq. 3 counts at
        // least 2 lost steps per failure however the uploads run.
        cfg.strategy = cpr(16, Some(Priority::Scar), 4);
        cfg.kills = vec![
            "server=0@step=14".parse().unwrap(),
            "server=2@step=22".parse().unwrap(),
        ];
        let report = run(&cfg).unwrap();
        assert_no_children_left(&report);
        assert!(report.aborted.is_none());
        assert_eq!(report.steps, 30);
        assert_eq!(report.samples_redone, 0);
        let f: Vec<_> = report
            .failures
            .iter()
            .filter(|f| f.role == Role::Server)
            .collect();
        assert_eq!(f.len(), 2, "{:#?}", report.failures);
        assert_eq!(f[0].servers_restored, vec![0]);
        assert_eq!(f[1].servers_restored, vec![2]);
        assert!(f
            .iter()
            .all(|f| f.steps_redone == 0 && f.recovered_s.is_some()));
        assert_eq!(report.overheads.o_lost, 0.0);
        let c = report.cpr.as_ref().unwrap();
        assert_eq!(c.pls.per_failure.len(), 2);
        assert!(c.pls.per_failure.iter().all(|f| f.steps_lost >= 2));
        assert!(c.pls.total > 0.0 && c.pls.total <= 2.0 / 3.0);
        assert!(c.full_saves >= 1);
        assert!(report.auc.is_some());
    }

    /// A failure that takes two of three servers at once (`server=0,2@step=13`; CPR §5.1
    /// clears up to half the tables in one failure), for both kinds of restore: `full` brings
    /// every server back to its newest save and redoes the steps since, ending at the
    /// failure-free model; `cpr` restores the two lost shards alone, redoes nothing, and Eq. 3
    /// counts a third of the model twice.
    #[test]
    fn a_failure_of_two_servers_at_once_is_restored() {
        let steps = 20;
        let kills = KillSpec::parse_many("server=0,2@step=13").unwrap();
        let run_with = |strategy: Option<StrategyChoice>| {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(&dir, steps);
            cfg.servers = 3;
            if let Some(s) = strategy {
                cfg.strategy = s;
                cfg.kills = kills.clone();
            }
            let report = run(&cfg).unwrap();
            assert_no_children_left(&report);
            assert!(report.aborted.is_none(), "{:?}", report.aborted);
            assert_eq!(report.steps, steps);
            report
        };
        let lost = |r: &RunReport| {
            let mut ids: Vec<u32> = r
                .failures
                .iter()
                .filter(|f| f.role == Role::Server)
                .map(|f| f.id)
                .collect();
            ids.sort();
            ids
        };
        let clean = run_with(None).model_digest;

        let full = run_with(Some(StrategyChoice::parse("full", 5).unwrap()));
        assert_eq!(lost(&full), [0, 2]);
        assert_eq!(full.model_digest, clean);

        let c = run_with(Some(cpr(8, Some(Priority::Mfu), 4)));
        assert_eq!(lost(&c), [0, 2]);
        assert_eq!(c.samples_redone, 0);
        let mut restored: Vec<u32> = c
            .failures
            .iter()
            .flat_map(|f| f.servers_restored.clone())
            .collect();
        restored.sort();
        assert_eq!(restored, [0, 2]);
        assert_ne!(c.model_digest, clean);
        // Saves every 2 steps: the newest before the failure is step 12's.
        let p = &c.cpr.as_ref().unwrap().pls;
        let mut per: Vec<(u32, u64, u64)> = p
            .per_failure
            .iter()
            .map(|f| (f.server, f.newest_save_step, f.steps_lost))
            .collect();
        per.sort();
        assert_eq!(per, [(0, 12, 1), (2, 12, 1)]);
        assert!(
            (p.total - 2.0 * 1.0 / 20.0 / 3.0).abs() < 1e-12,
            "{}",
            p.total
        );
    }

    /// CPR §6.5 runs up to 32 failures in one job: twelve failures of two servers each (24
    /// kills; a pair is found one by one, so up to three recovery attempts each, past the
    /// budget a run allowed whatever it injected) all end restored, nothing redone.
    #[test]
    fn a_run_with_many_failures_of_several_servers_recovers_from_each() {
        let steps = 30;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir, steps);
        cfg.servers = 4;
        cfg.strategy = cpr(4, None, 4);
        let pairs = ["0,1", "2,3", "0,2", "1,3", "0,3", "1,2"];
        cfg.kills = (0..12)
            .flat_map(|i| {
                KillSpec::parse_many(&format!("server={}@step={}", pairs[i % 6], 2 + 2 * i))
                    .unwrap()
            })
            .collect();
        assert_eq!(cfg.kills.len(), 24);
        let report = run(&cfg).unwrap();
        assert_no_children_left(&report);
        assert!(report.aborted.is_none(), "{:?}", report.aborted);
        assert_eq!(report.steps, steps);
        assert_eq!(report.samples_redone, 0);
        let f: Vec<_> = report
            .failures
            .iter()
            .filter(|f| f.role == Role::Server)
            .collect();
        assert_eq!(f.len(), 24, "{:#?}", report.failures);
        assert!(f.iter().all(|f| f.recovered_s.is_some()));
        assert_eq!(report.cpr.as_ref().unwrap().pls.per_failure.len(), 24);
    }

    #[test]
    fn cpr_settings_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir, 10);
        cfg.strategy = cpr(0, None, 1);
        assert!(cfg.validate().unwrap_err().to_string().contains("0 steps"));
        cfg.strategy = StrategyChoice::Cpr {
            interval: CprInterval::Steps(5),
            priority: Some(Priority::Mfu),
            r: 1.5,
            saves_per_full: 8,
            ssu_period: 2,
            largest_tables: 7,
        };
        assert!(cfg.validate().unwrap_err().to_string().contains("r = 1.5"));
    }
}

/// The incremental strategies (`incrcp`, `incremental`, `cnr`) through the same store path:
/// servers write pieces through their checkpoint service while training goes on, a lost
/// server makes every server restore the newest committed point.
mod pieces {
    use super::*;
    use ftrec_ckpt::incr;

    /// IncrCP with baseline resets off: the §4.5 rule decides from measured restore costs
    /// (timings), so with it on, whether the newest point before a kill is a piece or a new full
    /// depends on the machine's speed. The rule itself is tested on fixed costs in
    /// `ftrec-strategy`.
    fn incrcp(every: u64) -> StrategyChoice {
        match StrategyChoice::parse("incrcp", every).unwrap() {
            StrategyChoice::IncrCp {
                every_steps,
                threshold,
                range_rows,
                concat,
                ..
            } => StrategyChoice::IncrCp {
                every_steps,
                reset: ftrec_strategy::BaseReset::Never,
                threshold,
                range_rows,
                concat,
            },
            other => panic!("not incrcp: {other:?}"),
        }
    }

    /// The state `CURRENT` names (base + pieces), restored into fresh in-process servers.
    fn restored_current(cfg: &RunConfig) -> (u64, String) {
        let loc = cfg.store_location();
        let tip = block_on(async {
            let store = location::open(&loc, &LocationOptions::from_env())
                .await
                .unwrap();
            let ckpts = Checkpoints::new(store);
            let chain = incr::select(&ckpts, &RestoreAt::Current).await.unwrap();
            chain.target_manifest().clone()
        });
        block_on(async {
            let mut digest = ModelDigest::default();
            let staging = tempfile::tempdir().unwrap();
            for id in 0..cfg.servers {
                let server = SharedServer::new(build_server(&cfg.server_spec(id)).unwrap());
                let node = CkptNode::new(
                    server.clone(),
                    StagingOptions::new(staging.path()),
                    LocationOptions::from_env(),
                )
                .unwrap();
                node.restore(loc.clone(), tip.id.clone()).await.unwrap();
                digest.merge(&server.read().unwrap().digest());
            }
            (tip.step, digest.hex())
        })
    }

    /// Run `strategy` with `kill`; the run must end with the failure-free model, recover
    /// from a committed piece, and leave a store whose newest state is the final model.
    fn killed_run_matches_the_clean_run(
        strategy: StrategyChoice,
        kill: &str,
        store: Option<String>,
    ) -> RunReport {
        let steps = 20;
        let clean = failure_free(steps);
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir, steps);
        cfg.strategy = strategy;
        cfg.store = store;
        cfg.kills = vec![kill.parse().unwrap()];
        let report = run(&cfg).unwrap();
        assert_no_children_left(&report);
        assert!(report.aborted.is_none(), "{:?}", report.aborted);
        assert_eq!(report.model_digest, clean, "{}", strategy.name());
        let f: Vec<_> = report
            .failures
            .iter()
            .filter(|f| f.role == Role::Server)
            .collect();
        assert_eq!(f.len(), 1);
        assert!(f[0].recovered_s.is_some());
        let from = events(&report, EventKind::RecoveryStart);
        assert!(from[0].contains("-delta-"), "{from:?}");
        let st = report.store.as_ref().unwrap();
        assert!(st.pieces >= 2, "{st:?}");
        assert!(st.fulls >= 1, "{st:?}");
        assert_eq!(restored_current(&cfg), (steps, clean));
        assert_store_holds_nothing_dead(&cfg);
        report
    }

    /// The coordinator's collections (from the lineage it keeps, commit by commit) left
    /// nothing a fresh reading of the store would call dead: no checkpoint off the live
    /// lineage, no chunk-list file no live chunk points into.
    fn assert_store_holds_nothing_dead(cfg: &RunConfig) {
        let mut l = lineage(cfg);
        let dead = l.take_dead(&ftrec_ckpt::deck::Retention::default());
        assert!(dead.is_empty(), "dead checkpoints left: {dead:?}");
        let files = block_on(async {
            let store = location::open(&cfg.store_location(), &LocationOptions::from_env())
                .await
                .unwrap();
            let ckpts = Checkpoints::new(store);
            let mut left = Vec::new();
            for key in incr::store::dead_files(&ckpts).await.unwrap() {
                if ckpts.store().head(&key).await.is_ok() {
                    left.push(key.to_string());
                }
            }
            left
        });
        assert!(files.is_empty(), "dead chunk-list files left: {files:?}");
    }

    #[test]
    fn incrcp_recovery_after_a_server_kill_gives_the_failure_free_model() {
        let report = killed_run_matches_the_clean_run(incrcp(2), "server=1@step=13", None);
        let st = report.store.unwrap();
        // Every extraction round compared the new pieces with older columns, and every save
        // point after the first full has its decision in the report.
        let ex = st.extraction.expect("extraction counts");
        assert!(ex.compared > 0, "{ex:?}");
        assert!(!st.decisions.is_empty());
        assert_eq!(st.quant_max_abs_error, None);
    }

    #[test]
    fn a_server_killed_while_a_piece_uploads_leaves_the_previous_committed_point() {
        // The second piece is killed right after its copy-out, while it uploads: it never
        // commits, and the recovery goes back to the first piece.
        let strategy = StrategyChoice::parse("incremental", 3).unwrap();
        let report =
            killed_run_matches_the_clean_run(strategy, "server=0@phase=piece-write#2", None);
        let dropped = events(&report, EventKind::CheckpointFailed);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        let dropped_id = dropped[0].split(':').next().unwrap().to_string();
        let from = events(&report, EventKind::RecoveryStart);
        assert!(!from[0].contains(&dropped_id), "{from:?}");
        assert!(from[0].contains("-delta-"), "{from:?}");
    }

    #[test]
    fn cnr_recovery_after_a_server_kill_gives_the_failure_free_model() {
        let report = killed_run_matches_the_clean_run(
            StrategyChoice::parse("cnr", 3).unwrap(),
            "server=1@step=11",
            None,
        );
        assert_eq!(report.store.unwrap().quant_max_abs_error, None);
    }

    #[test]
    fn incrcp_against_a_real_s3_server_recovers_and_its_store_restores() {
        use ftrec_ckpt::testing::{s3_server, BUCKET};
        // The same variables as the deck S3 test of this binary, with the same values.
        s3_server().set_env();
        killed_run_matches_the_clean_run(
            incrcp(3),
            "server=0@step=11",
            Some(format!("s3://{BUCKET}/incrcp-e2e-{}", std::process::id())),
        );
    }

    #[test]
    fn piece_flags_and_phases_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&dir, 10);
        cfg.strategy = StrategyChoice::parse("deck", 2).unwrap();
        cfg.kills = vec!["server=0@phase=piece-write".parse().unwrap()];
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("piece-write"));
        cfg.kills.clear();
        cfg.strategy = StrategyChoice::Cnr {
            every_steps: 2,
            reset_fraction: None,
            quant_bits: Some(5),
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--quantize"));
        cfg.strategy = StrategyChoice::IncrCp {
            every_steps: 2,
            reset: ftrec_strategy::BaseReset::Auto,
            threshold: 1.5,
            range_rows: 0,
            concat: true,
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--extract-threshold"));
    }
}

//! Storage faults in whole runs: a full disk (`ENOSPC`) on checkpoint writes, a store that
//! fails every operation for a while, and a stalled store. The faults come from the
//! fault-injecting store, which every process of the run (coordinator and servers) puts in
//! front of its store when `FTREC_STORE_FAULTS` is set; the outage windows count each
//! process's own calls, so they are deterministic. In each case training goes on, the failed
//! saves are in the report, a later save commits once the store is back, `CURRENT` names a
//! checkpoint whose every file is intact, and a server killed after the outage is restored
//! to the failure-free run's digest.
//!
//! Outage windows are limited to the objects of the run's first attempt (checkpoint ids
//! ending `-a0`): a replacement server is a new process whose counters start again, and the
//! outage should be over by then.
//!
//! The S3 endpoint that goes away for a while is played by the same fault store in front of
//! a local directory: the retry layer sees the same transient errors either way.

mod common;

use std::path::Path;
use std::sync::Mutex;

use ftrec_ckpt::deck::Lineage;
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{Checkpoints, Select};
use ftrec_cluster::{run, RunConfig, RunReport, StrategyChoice};

/// The variables are process-wide: one test of this file at a time.
static ENV: Mutex<()> = Mutex::new(());

fn config(dir: &Path, strategy: StrategyChoice, steps: u64) -> RunConfig {
    let mut cfg = common::tiny_run(dir, 3, 1, steps, 13);
    cfg.sync = true;
    cfg.strategy = strategy;
    cfg
}

/// Run `cfg` with the store faults `faults` (and fast retries: 3 tries, at most 5 ms apart).
fn run_with_faults(cfg: &RunConfig, faults: &str) -> RunReport {
    std::env::set_var(ftrec_ckpt::store::fault::FAULTS_ENV, faults);
    std::env::set_var(location::ATTEMPTS_ENV, "3");
    std::env::set_var(location::MAX_BACKOFF_ENV, "5");
    let r = run(cfg);
    std::env::remove_var(ftrec_ckpt::store::fault::FAULTS_ENV);
    std::env::remove_var(location::ATTEMPTS_ENV);
    std::env::remove_var(location::MAX_BACKOFF_ENV);
    r.unwrap()
}

/// The failure-free run's digest: the same steps without strategy, kill or fault.
fn failure_free(dir: &Path, steps: u64) -> String {
    run(&config(&dir.join("free"), StrategyChoice::None, steps))
        .unwrap()
        .model_digest
}

/// `CURRENT` names a checkpoint whose lineage has every file, intact.
fn current_is_complete(location: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = location::open(location, &LocationOptions::default())
            .await
            .unwrap();
        let ckpts = Checkpoints::new(store);
        let kinds = [
            ftrec_ckpt::CheckpointKind::Full,
            ftrec_ckpt::CheckpointKind::Delta,
            ftrec_ckpt::CheckpointKind::Merged,
        ];
        let m = ckpts.select(&Select::Current, &kinds).await.unwrap();
        let chain = Lineage::load(&ckpts).await.unwrap().resolve(&m.id).unwrap();
        assert!(!chain.is_empty());
        for id in &chain {
            let link = ckpts.read_manifest(id, None).await.unwrap();
            ckpts.verify_files(&link, 4).await.unwrap();
        }
    });
}

fn assert_saves_failed_then_committed(r: &RunReport, cause: &str) {
    assert!(r.checkpoints_failed > 0, "no save failed: {}", r.summary());
    assert!(
        r.checkpoint_failures.iter().any(|f| f.contains(cause)),
        "{:?}",
        r.checkpoint_failures
    );
    // A save after the outage committed.
    let last_fail = r
        .events
        .iter()
        .filter(|e| e.kind == ftrec_cluster::report::EventKind::CheckpointFailed)
        .map(|e| e.t_s)
        .fold(0.0, f64::max);
    assert!(
        r.events.iter().any(|e| {
            e.kind == ftrec_cluster::report::EventKind::CheckpointEnd && e.t_s > last_fail
        }),
        "no save committed after the last failure: {:?}",
        r.events
    );
    assert!(r.summary().contains("saves failed"), "{}", r.summary());
}

#[test]
fn a_full_disk_on_checkpoint_writes_fails_saves_until_it_clears_and_loses_nothing() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let steps = 24;
    let free = failure_free(dir.path(), steps);
    let mut cfg = config(
        &dir.path().join("enospc"),
        StrategyChoice::Deck {
            delta_every_steps: 2,
            full_every_deltas: None,
            merge_stride: None,
            merge_mib_per_s: None,
        },
        steps,
    );
    cfg.kills = vec!["server=1@step=21".parse().unwrap()];
    // Every process's writes 1 to 12 of the run's first attempt (ids `...-a0`, before the
    // recovery) find the disk full; the replacement process, a new one, writes `-a1` ids.
    let r = run_with_faults(&cfg, "put:enospc:1-12:-a0/");
    assert_eq!(r.steps, steps);
    assert_saves_failed_then_committed(&r, "no space left");
    assert_eq!(r.failures.len(), 1);
    assert!(r.failures[0].recovered_s.is_some());
    assert_eq!(r.model_digest, free);
    current_is_complete(&cfg.store_location());
}

#[test]
fn a_store_that_fails_every_operation_for_a_while_then_a_server_kill_loses_nothing() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let steps = 24;
    let free = failure_free(dir.path(), steps);
    let mut cfg = config(
        &dir.path().join("outage"),
        StrategyChoice::Full { every_steps: 2 },
        steps,
    );
    cfg.kills = vec!["server=2@step=21".parse().unwrap()];
    // Every operation a save makes (writes, the commit's size checks, the cleanup of a failed
    // save) fails for each process's calls 1 to 12 on the first attempt's objects. Reads are
    // left alone: the restore after the kill reads those objects in a new process.
    let r = run_with_faults(
        &cfg,
        "seed=4;put:fail:1-12:-a0/;head:fail:1-12:-a0/;delete:fail:1-12:-a0/",
    );
    assert_eq!(r.steps, steps);
    assert_saves_failed_then_committed(&r, "gave up after 3 tries");
    assert_eq!(r.failures.len(), 1);
    assert!(r.failures[0].recovered_s.is_some());
    assert_eq!(r.model_digest, free);
    current_is_complete(&cfg.store_location());
}

#[test]
fn a_stalled_store_slows_saves_but_training_goes_on() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let steps = 12;
    let free = failure_free(dir.path(), steps);
    let cfg = config(
        &dir.path().join("stall"),
        StrategyChoice::Deck {
            delta_every_steps: 3,
            full_every_deltas: None,
            merge_stride: None,
            merge_mib_per_s: None,
        },
        steps,
    );
    // Every write waits 40 ms: uploads lag behind training, which does not wait for them.
    let r = run_with_faults(&cfg, "put:delay=40:*");
    assert_eq!(r.steps, steps);
    assert!(r.checkpoints > 0, "{}", r.summary());
    assert_eq!(r.model_digest, free);
    current_is_complete(&cfg.store_location());
}

/// A blocking save whose uploads outlive their wait (`--save-timeout-s`) is dropped, and its
/// files are deleted only once its uploads have ended: no file of it is left behind (before,
/// the delete started at the timeout while the servers still wrote). Later saves commit.
#[test]
fn a_save_that_outlives_its_wait_is_dropped_after_its_uploads_end() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let steps = 9;
    let mut cfg = config(
        &dir.path().join("slow"),
        StrategyChoice::Full { every_steps: 3 },
        steps,
    );
    // The wait is ten times what a save of this model takes on a loaded machine, so only the
    // save whose files are held misses it: each server's first two data files take 4 s each,
    // twice the wait, so the first save misses its wait whatever the machine's speed.
    cfg.save_timeout_s = Some(2.0);
    let r = run_with_faults(&cfg, "put:delay=4000:1-2:-a0/s");
    assert!(
        r.checkpoint_failures
            .iter()
            .any(|f| f.contains("did not end within 2s")),
        "{:?}",
        r.checkpoint_failures
    );
    assert!(r.checkpoints > 0, "{}", r.summary());
    // Every checkpoint directory left with files has its manifest: nothing of the dropped
    // save remains (the local store leaves empty directories behind).
    fn files_under(p: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(p).unwrap().flatten() {
            if e.path().is_dir() {
                out.extend(files_under(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }
    let ckpt_dir = std::path::Path::new(&cfg.store_location()).join("ckpt");
    for e in std::fs::read_dir(&ckpt_dir).unwrap().flatten() {
        let files = files_under(&e.path());
        assert!(
            files.is_empty() || e.path().join("MANIFEST").exists(),
            "{} files of a dropped save were left, e.g. {:?}",
            files.len(),
            files.first()
        );
    }
    current_is_complete(&cfg.store_location());
}

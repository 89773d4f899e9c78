//! Commit, selection and damage: every flipped byte and every truncation of every file of a
//! checkpoint (CURRENT, MANIFEST, row and dense files) is refused with an error naming that
//! file; "newest intact" falls back past damaged checkpoints; faults during a write never
//! produce a committed checkpoint.

mod common;

use std::sync::Arc;

use common::*;
use ftrec_ckpt::snapshot::{self, SnapshotOptions};
use ftrec_ckpt::store::fault::{FaultAction, FaultRule, Op, TearAt, Trigger};
use ftrec_ckpt::{
    Bytes, CheckpointId, CheckpointKind, Checkpoints, ChunkStore, CkptError, DataPosition,
    FaultPlan, FaultyStore, Key, Manifest, MemoryStore, PutMode, Select,
};

fn small_model() -> TestModel {
    // Two servers, tiny chunks: every kind of file, each small enough to damage byte by byte.
    TestModel::with_spec(&Spec::micro(), 2, 21, true)
}

fn opts() -> SnapshotOptions {
    SnapshotOptions {
        // 32 rows of the micro model per file: its 90-row table splits into two files per
        // server.
        chunk_bytes: 1024,
        max_in_flight: 2,
    }
}

async fn write(ckpts: &Checkpoints, model: &TestModel, step: u64) -> Manifest {
    let id = CheckpointId::for_step(step, CheckpointKind::Full);
    snapshot::write_full(
        ckpts,
        &id,
        step,
        DataPosition::Json(serde_json::json!({ "step": step })),
        &model.shards(),
        &opts(),
    )
    .await
    .unwrap()
}

/// Open with `policy` and restore every server; the restored model on success.
async fn open_and_restore(
    ckpts: &Checkpoints,
    model: &TestModel,
    policy: &Select,
) -> Result<(Manifest, TestModel), CkptError> {
    let m = ckpts.select(policy, &[CheckpointKind::Full]).await?;
    let mut restored = model.zeroed_like();
    for mut t in restored.targets() {
        snapshot::restore_shard(ckpts, &m, &mut t, &opts()).await?;
    }
    Ok((m, restored))
}

/// A key's bytes, damaged by `f`, written back in place (bypassing create-only).
async fn damage(store: &dyn ChunkStore, key: &Key, f: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let orig = store.get(key).await.unwrap();
    let mut v = orig.to_vec();
    f(&mut v);
    store
        .put(key, Bytes::from(v), PutMode::Overwrite)
        .await
        .unwrap();
    orig
}

async fn restore_bytes(store: &dyn ChunkStore, key: &Key, orig: Bytes) {
    store.put(key, orig, PutMode::Overwrite).await.unwrap();
}

/// Every key of the checkpoint: CURRENT, MANIFEST and the data files.
fn all_keys(ckpts: &Checkpoints, m: &Manifest) -> Vec<Key> {
    let mut keys = vec![ckpts.current_key(), ckpts.manifest_key(&m.id)];
    for f in &m.files {
        keys.push(ckpts.file_key(&m.id, &f.path).unwrap());
    }
    keys
}

#[tokio::test]
async fn round_trip_through_current() {
    let model = small_model();
    let ckpts = Checkpoints::new(Arc::new(MemoryStore::new()));
    let m = write(&ckpts, &model, 5).await;
    let (opened, restored) = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap();
    assert_eq!(opened, m);
    assert!(restored.bits_equal(&model));
    assert_eq!(ckpts.list_checkpoints().await.unwrap(), vec![m.id.clone()]);
    let (by_id, _) = open_and_restore(&ckpts, &model, &Select::Id(m.id.clone()))
        .await
        .unwrap();
    assert_eq!(by_id, m);
    ckpts.verify_files(&m, 4).await.unwrap();
}

#[tokio::test]
async fn every_flipped_byte_of_every_file_is_refused_naming_the_file() {
    let model = small_model();
    let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let ckpts = Checkpoints::new(store.clone());
    let m = write(&ckpts, &model, 5).await;
    let keys = all_keys(&ckpts, &m);
    for kind in ["CURRENT", "MANIFEST", ".rows", ".dense"] {
        assert!(
            keys.iter().any(|k| k.as_str().ends_with(kind)),
            "no {kind} file among {keys:?}"
        );
    }
    let mut checked = 0;
    for key in &keys {
        let len = store.head(key).await.unwrap().size as usize;
        // Every byte of small files; a spread of positions (header, payload, trailer) in
        // larger ones keeps the test fast.
        let positions: Vec<usize> = if len <= 400 {
            (0..len).collect()
        } else {
            let mut p: Vec<usize> = (0..80).collect();
            p.extend((80..len - 8).step_by(37));
            p.extend(len - 8..len);
            p
        };
        for pos in positions {
            let orig = damage(&*store, key, |v| v[pos] ^= 0x20).await;
            let err = open_and_restore(&ckpts, &model, &Select::Current)
                .await
                .err()
                .unwrap_or_else(|| panic!("{key}: flip at {pos} went unnoticed"));
            assert_eq!(
                err.file(),
                Some(key.as_str()),
                "{key}: flip at {pos} gave {err}"
            );
            restore_bytes(&*store, key, orig).await;
            checked += 1;
        }
    }
    assert!(checked > 500, "{checked} positions damaged");
    // Undamaged again: opens fine.
    assert!(open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .is_ok());
}

#[tokio::test]
async fn every_truncation_is_refused_naming_the_file() {
    let model = small_model();
    let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let ckpts = Checkpoints::new(store.clone());
    let m = write(&ckpts, &model, 5).await;
    for key in all_keys(&ckpts, &m) {
        let len = store.head(&key).await.unwrap().size as usize;
        for cut in [0, 1, 15, 16, 40, 64, len / 2, len - 4, len - 1] {
            if cut >= len {
                continue;
            }
            let orig = damage(&*store, &key, |v| v.truncate(cut)).await;
            let err = open_and_restore(&ckpts, &model, &Select::Current)
                .await
                .err()
                .unwrap_or_else(|| panic!("{key}: truncation to {cut} went unnoticed"));
            assert_eq!(err.file(), Some(key.as_str()), "{key} cut at {cut}: {err}");
            restore_bytes(&*store, &key, orig).await;
        }
        // A longer file is refused too.
        let orig = damage(&*store, &key, |v| v.push(0)).await;
        let err = open_and_restore(&ckpts, &model, &Select::Current)
            .await
            .unwrap_err();
        assert_eq!(err.file(), Some(key.as_str()), "{key} extended: {err}");
        restore_bytes(&*store, &key, orig).await;
    }
}

#[tokio::test]
async fn a_swapped_file_is_refused_even_though_it_is_well_formed() {
    // Two valid row files of the same size (32 rows of table 0, on two servers): putting one
    // in the other's place passes its own checksums but not the manifest's record.
    let model = small_model();
    let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let ckpts = Checkpoints::new(store.clone());
    let m = write(&ckpts, &model, 5).await;
    let a = ckpts.file_key(&m.id, "s0000/t0000-000000.rows").unwrap();
    let b = ckpts.file_key(&m.id, "s0001/t0000-000000.rows").unwrap();
    assert_eq!(
        store.head(&a).await.unwrap().size,
        store.head(&b).await.unwrap().size
    );
    let bytes_b = store.get(&b).await.unwrap();
    store.put(&a, bytes_b, PutMode::Overwrite).await.unwrap();
    let err = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap_err();
    assert_eq!(err.file(), Some(a.as_str()), "{err}");
}

#[tokio::test]
async fn newest_intact_falls_back_past_damage() {
    let model = small_model();
    let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let ckpts = Checkpoints::new(store.clone());

    assert!(matches!(
        ckpts
            .select(&Select::Current, &[CheckpointKind::Full])
            .await,
        Err(CkptError::NoCheckpoint { .. })
    ));
    assert!(matches!(
        ckpts
            .select(&Select::NewestIntact, &[CheckpointKind::Full])
            .await,
        Err(CkptError::NoCheckpoint { .. })
    ));

    let older = TestModel::with_spec(&Spec::micro(), 2, 99, true);
    let m10 = write(&ckpts, &older, 10).await;
    let m20 = write(&ckpts, &model, 20).await;

    // Damage a data file of the newest: Current refuses naming it, NewestIntact takes step 10.
    let victim = ckpts.file_key(&m20.id, &m20.files[3].path).unwrap();
    let orig = damage(&*store, &victim, |v| {
        let n = v.len();
        v[n - 10] ^= 1;
    })
    .await;
    let err = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap_err();
    assert_eq!(err.file(), Some(victim.as_str()));
    let (m, restored) = open_and_restore(&ckpts, &model, &Select::NewestIntact)
        .await
        .unwrap();
    assert_eq!(m.id, m10.id);
    assert!(restored.bits_equal(&older));
    restore_bytes(&*store, &victim, orig).await;

    // Damage CURRENT: Current refuses naming CURRENT, NewestIntact still finds step 20.
    let cur = ckpts.current_key();
    let orig = damage(&*store, &cur, |v| v[20] ^= 4).await;
    let err = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap_err();
    assert_eq!(err.file(), Some(cur.as_str()));
    let (m, restored) = open_and_restore(&ckpts, &model, &Select::NewestIntact)
        .await
        .unwrap();
    assert_eq!(m.id, m20.id);
    assert!(restored.bits_equal(&model));
    restore_bytes(&*store, &cur, orig).await;

    // A manifest written without moving CURRENT (a crash between the two) is complete:
    // NewestIntact takes it, Current does not.
    let newer = TestModel::with_spec(&Spec::micro(), 2, 7, true);
    let id30 = CheckpointId::for_step(30, CheckpointKind::Full);
    let mut reports = Vec::new();
    for s in newer.shards() {
        reports.push(
            snapshot::write_shard(&ckpts, &id30, &s, &opts())
                .await
                .unwrap(),
        );
    }
    let m30 = snapshot::full_manifest(id30.clone(), 30, DataPosition::None, reports);
    ckpts.write_manifest(&m30).await.unwrap();
    let (m, _) = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap();
    assert_eq!(m.id, m20.id);
    let (m, restored) = open_and_restore(&ckpts, &model, &Select::NewestIntact)
        .await
        .unwrap();
    assert_eq!(m.id, id30);
    assert!(restored.bits_equal(&newer));

    // Everything damaged: a clear error listing every candidate.
    for m in [&m10, &m20, &m30] {
        let key = ckpts.manifest_key(&m.id);
        damage(&*store, &key, |v| v[30] ^= 1).await;
    }
    match ckpts
        .select(&Select::NewestIntact, &[CheckpointKind::Full])
        .await
    {
        Err(CkptError::NoIntactCheckpoint { failures, .. }) => {
            assert_eq!(failures.len(), 3, "{failures:?}");
        }
        other => panic!("expected NoIntactCheckpoint, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_file_is_refused_and_skipped() {
    let model = small_model();
    let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let ckpts = Checkpoints::new(store.clone());
    let m10 = write(&ckpts, &model, 10).await;
    let m20 = write(&ckpts, &model, 20).await;
    let gone = ckpts.file_key(&m20.id, &m20.files[0].path).unwrap();
    store.delete(&gone).await.unwrap();
    let err = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CkptError::NotFound { key } if key == gone.as_str()),
        "{err}"
    );
    let (m, _) = open_and_restore(&ckpts, &model, &Select::NewestIntact)
        .await
        .unwrap();
    assert_eq!(m.id, m10.id);
}

#[tokio::test]
async fn ids_and_files_are_create_only() {
    let model = small_model();
    let ckpts = Checkpoints::new(Arc::new(MemoryStore::new()));
    let m = write(&ckpts, &model, 5).await;
    // Re-committing the same id fails and leaves the original intact.
    let err = snapshot::write_full(
        &ckpts,
        &m.id,
        5,
        DataPosition::None,
        &model.shards(),
        &opts(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CkptError::AlreadyExists { .. }), "{err}");
    assert!(open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .is_ok());
    // Deleting a checkpoint removes it from the candidates.
    ckpts.delete_checkpoint(&m.id).await.unwrap();
    assert!(ckpts.list_checkpoints().await.unwrap().is_empty());
    assert!(ckpts
        .store()
        .list(Some(&ckpts.checkpoint_dir(&m.id)))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn faults_during_a_write_never_commit() {
    let model = small_model();
    for (name, plan) in [
        ("fail 3rd put", FaultPlan::new(1).fail_nth_put(3)),
        (
            "tear 5th put",
            FaultPlan::new(2).tear_nth_put(5, TearAt::Fraction(0.5)),
        ),
        (
            "fail the manifest",
            FaultPlan::new(3).rule(
                FaultRule::new(Op::Put, Trigger::Nth(1), FaultAction::Fail)
                    .on_keys_containing("MANIFEST"),
            ),
        ),
        (
            "fail CURRENT",
            FaultPlan::new(4).rule(
                FaultRule::new(Op::Swap, Trigger::Always, FaultAction::Fail)
                    .on_keys_containing("CURRENT"),
            ),
        ),
    ] {
        let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
        let faulty = Arc::new(FaultyStore::new(mem.clone(), plan));
        let ckpts = Checkpoints::new(faulty.clone());
        let err = snapshot::write_full(
            &ckpts,
            &CheckpointId::new("x").unwrap(),
            1,
            DataPosition::None,
            &model.shards(),
            &opts(),
        )
        .await
        .unwrap_err();
        assert!(err.is_retryable(), "{name}: {err}");
        assert_eq!(faulty.injected().len(), 1, "{name}");
        let clean = Checkpoints::new(mem);
        let current = clean
            .select(&Select::Current, &[CheckpointKind::Full])
            .await;
        assert!(
            matches!(current, Err(CkptError::NoCheckpoint { .. })),
            "{name}: CURRENT must not move"
        );
        if name == "fail CURRENT" {
            // The manifest landed: the checkpoint is complete, only not current.
            let m = clean
                .select(&Select::NewestIntact, &[CheckpointKind::Full])
                .await
                .unwrap();
            assert_eq!(m.id.as_str(), "x");
        } else {
            assert!(clean.list_checkpoints().await.unwrap().is_empty(), "{name}");
        }
    }
}

#[tokio::test]
async fn a_byte_flipped_on_its_way_to_storage_is_caught_at_restore() {
    let model = small_model();
    let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let clean = Checkpoints::new(mem.clone());
    let m10 = write(&clean, &model, 10).await;
    // Flip a byte in one data file of the next checkpoint; the store reports success.
    let faulty = Arc::new(FaultyStore::new(
        mem.clone(),
        FaultPlan::new(8).rule(
            FaultRule::new(Op::Put, Trigger::Nth(4), FaultAction::FlipByte)
                .on_keys_containing(".rows"),
        ),
    ));
    let ckpts = Checkpoints::new(faulty.clone());
    write(&ckpts, &model, 20).await;
    let flipped = faulty.injected();
    assert_eq!(flipped.len(), 1);
    let err = open_and_restore(&clean, &model, &Select::Current)
        .await
        .unwrap_err();
    assert_eq!(err.file(), Some(flipped[0].key.as_str()), "{err}");
    let (m, _) = open_and_restore(&clean, &model, &Select::NewestIntact)
        .await
        .unwrap();
    assert_eq!(m.id, m10.id);
}

#[tokio::test]
async fn a_byte_flipped_on_read_is_caught_and_a_retry_succeeds() {
    let model = small_model();
    let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    write(&Checkpoints::new(mem.clone()), &model, 10).await;
    let faulty = Arc::new(FaultyStore::new(
        mem,
        FaultPlan::new(5).rule(
            FaultRule::new(Op::Get, Trigger::Nth(2), FaultAction::FlipByte)
                .on_keys_containing(".dense"),
        ),
    ));
    let ckpts = Checkpoints::new(faulty.clone());
    let err = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap_err();
    assert_eq!(err.file(), Some(faulty.injected()[0].key.as_str()), "{err}");
    let (_, restored) = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap();
    assert!(restored.bits_equal(&model));
}

#[tokio::test]
async fn damage_on_local_disk_names_the_file() {
    // The same checks through the local backend, damaging the files on disk directly.
    let model = small_model();
    let dir = tempfile::tempdir().unwrap();
    let local = ftrec_ckpt::LocalStore::new(dir.path()).unwrap();
    let ckpts = Checkpoints::with_root(Arc::new(local.clone()), Key::new("job-1").unwrap());
    let m = write(&ckpts, &model, 5).await;
    for key in all_keys(&ckpts, &m).into_iter().step_by(7) {
        let path = local.path_of(&key);
        let orig = std::fs::read(&path).unwrap();
        let mut bad = orig.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let err = open_and_restore(&ckpts, &model, &Select::Current)
            .await
            .unwrap_err();
        assert_eq!(err.file(), Some(key.as_str()), "{err}");
        std::fs::write(&path, &orig[..orig.len() - 3]).unwrap();
        let err = open_and_restore(&ckpts, &model, &Select::Current)
            .await
            .unwrap_err();
        assert_eq!(err.file(), Some(key.as_str()), "{err}");
        std::fs::write(&path, &orig).unwrap();
    }
    let (_, restored) = open_and_restore(&ckpts, &model, &Select::Current)
        .await
        .unwrap();
    assert!(restored.bits_equal(&model));
}

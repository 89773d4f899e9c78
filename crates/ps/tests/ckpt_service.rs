//! The server-side checkpoint service in process: servers track touched rows at push time
//! (DECK §3.1), save full and delta checkpoints of their own shards straight into the store,
//! the coordinator commits one manifest per save, and every server restores the lineage of a
//! chosen checkpoint to exactly the model it had at that step (digest, bit for bit); the same
//! for incremental pieces of every scheme (naive, Check-N-Run differential, IncrCP chunk list).

mod ckpt_common;
mod common;

use ckpt_common::{digest, start, step, TempDir, SERVERS};
use ftrec_ckpt::deck::{self, checkpoint_id, MergePolicy, Merger};
use ftrec_ckpt::incr::{self, PieceSpec};
use ftrec_ckpt::{CheckpointKind, Checkpoints, DataPosition, LocalStore};
use ftrec_ps::ckpt::{
    restore_cluster, save_cluster, save_piece_cluster, CkptApi, CkptServiceError, PiecePlan,
    SavePlan,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_full_and_deltas_then_restore_each_point_exactly() {
    let dir = TempDir::new();
    let location = dir.path().join("store").to_string_lossy().into_owned();
    let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
    let (servers, nodes) = start(&dir.path().join("staging"));
    let mut saved = Vec::new();
    let mut parent = None;
    for s in 1..=12u64 {
        step(&servers, s);
        if s % 3 == 0 {
            let kind = if parent.is_none() {
                CheckpointKind::Full
            } else {
                CheckpointKind::Delta
            };
            let id = checkpoint_id(s, kind, 0);
            let (m, pauses) = save_cluster(
                &nodes,
                &location,
                &ckpts,
                SavePlan {
                    kind,
                    id: id.clone(),
                    step: s,
                    parent: parent.clone(),
                    data_position: DataPosition::Bytes(s.to_le_bytes().to_vec()),
                },
            )
            .await
            .unwrap();
            assert_eq!(pauses.len(), SERVERS as usize);
            assert_eq!(m.kind, kind);
            if kind == CheckpointKind::Delta {
                // Only touched rows: far fewer than the model's.
                let rows: u64 = pauses.iter().map(|p| p.rows).sum();
                assert!(rows > 0 && rows < 100, "{rows} rows in a delta");
            }
            saved.push((id.clone(), digest(&servers)));
            parent = Some(id);
        }
    }
    Merger::new(ckpts.clone(), MergePolicy::default())
        .unwrap()
        .run_once()
        .await
        .unwrap();
    let live = digest(&servers);
    for (id, want) in saved.iter().rev() {
        let done = restore_cluster(&nodes, &location, id).await.unwrap();
        assert_eq!(done.len(), SERVERS as usize);
        assert_eq!(&digest(&servers), want, "restore of {id}");
    }
    // Back to the newest and on: training continues, and the tracker starts over there.
    let (last, want) = saved.last().unwrap();
    restore_cluster(&nodes, &location, last).await.unwrap();
    assert_eq!(&digest(&servers), want);
    assert_eq!(want, &live);
    step(&servers, 13);
    let id = checkpoint_id(13, CheckpointKind::Delta, 0);
    save_cluster(
        &nodes,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Delta,
            id: id.clone(),
            step: 13,
            parent: Some(last.clone()),
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    let at13 = digest(&servers);
    restore_cluster(&nodes, &location, &saved[0].0)
        .await
        .unwrap();
    restore_cluster(&nodes, &location, &id).await.unwrap();
    assert_eq!(digest(&servers), at13);
    let chain = deck::select_chain(&ckpts, &deck::RestoreAt::Current, false)
        .await
        .unwrap();
    assert_eq!(chain.last().unwrap().id, id);
}

/// A server whose upload fails makes the whole save fail: nothing is committed, and `CURRENT`
/// still names the previous checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_server_upload_commits_nothing() {
    let dir = TempDir::new();
    let location = dir.path().join("store").to_string_lossy().into_owned();
    let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
    let (servers, nodes) = start(&dir.path().join("staging"));
    step(&servers, 1);
    let full = checkpoint_id(1, CheckpointKind::Full, 0);
    save_cluster(
        &nodes,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Full,
            id: full.clone(),
            step: 1,
            parent: None,
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    // Make one server's store refuse writes: a read-only staging dir stands in for a dying disk.
    step(&servers, 2);
    let bad_location = dir.path().join("not-a-dir");
    std::fs::write(&bad_location, b"file").unwrap();
    let err = save_cluster(
        &nodes,
        &bad_location.to_string_lossy(),
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Delta,
            id: checkpoint_id(2, CheckpointKind::Delta, 0),
            step: 2,
            parent: Some(full.clone()),
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CkptServiceError::Store(_)), "{err}");
    assert_eq!(ckpts.read_current().await.unwrap().unwrap().id, full);
    // An unknown save is named.
    let e = nodes[0]
        .wait(checkpoint_id(77, CheckpointKind::Delta, 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CkptServiceError::UnknownSave { .. }));
}

/// Pieces of every scheme through the servers' service: the chunk list's extraction runs on
/// the servers after each piece is durable; every committed point restores to its digest; after
/// a restore of the newest, pieces continue from it (the chunk list and, for a differential,
/// the rows since the base are rebuilt from the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_pieces_of_every_scheme_restore_every_point_exactly() {
    let mut ranged = PieceSpec::chunk_list(0.0);
    ranged.extract.range_rows = 8;
    ranged.extract.bundle_bytes = 1024;
    for spec in [
        PieceSpec::incremental(),
        PieceSpec::differential(None),
        PieceSpec::chunk_list(0.02),
        ranged,
    ] {
        let dir = TempDir::new();
        let location = dir.path().join("store").to_string_lossy().into_owned();
        let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
        let (servers, nodes) = start(&dir.path().join("staging"));
        let mut saved = Vec::new();
        let mut base = None;
        let mut prev = None;
        let piece = |s: u64, parent| PiecePlan {
            id: checkpoint_id(s, CheckpointKind::Delta, 0),
            step: s,
            parent,
            data_position: DataPosition::None,
            spec,
        };
        for s in 1..=12u64 {
            step(&servers, s);
            if s % 2 != 0 {
                continue;
            }
            let id = match &base {
                None => {
                    let id = checkpoint_id(s, CheckpointKind::Full, 0);
                    save_cluster(
                        &nodes,
                        &location,
                        &ckpts,
                        SavePlan {
                            kind: CheckpointKind::Full,
                            id: id.clone(),
                            step: s,
                            parent: None,
                            data_position: DataPosition::None,
                        },
                    )
                    .await
                    .unwrap();
                    base = Some(id.clone());
                    id
                }
                Some(b) => {
                    let parent = if spec.since_base() {
                        b
                    } else {
                        prev.as_ref().unwrap()
                    };
                    let (m, _) =
                        save_piece_cluster(&nodes, &location, &ckpts, piece(s, parent.clone()))
                            .await
                            .unwrap();
                    assert_eq!(m.piece_scheme(), Some(spec.scheme));
                    assert_eq!(m.pieces().count(), 2, "one piece index per server");
                    m.id
                }
            };
            saved.push((id.clone(), digest(&servers)));
            prev = Some(id);
        }
        for (id, want) in saved.iter().rev() {
            restore_cluster(&nodes, &location, id).await.unwrap();
            assert_eq!(
                &digest(&servers),
                want,
                "{:?}: restore of {id}",
                spec.scheme
            );
        }
        let (last, want) = saved.last().unwrap().clone();
        restore_cluster(&nodes, &location, &last).await.unwrap();
        assert_eq!(digest(&servers), want);
        step(&servers, 13);
        let parent = if spec.since_base() {
            base.clone().unwrap()
        } else {
            last.clone()
        };
        let (m13, _) = save_piece_cluster(&nodes, &location, &ckpts, piece(13, parent))
            .await
            .unwrap();
        let at13 = digest(&servers);
        restore_cluster(&nodes, &location, &saved[0].0)
            .await
            .unwrap();
        restore_cluster(&nodes, &location, &m13.id).await.unwrap();
        assert_eq!(
            digest(&servers),
            at13,
            "{:?}: pieces continue after a restore",
            spec.scheme
        );
        // Garbage collection keeps every state of the head's list restorable.
        let gc = incr::remove_dead_files(&ckpts).await.unwrap();
        if spec.scheme != ftrec_ckpt::incr::PieceScheme::ChunkList {
            assert!(gc.dead_files.is_empty());
        }
        assert!(incr::verify(&ckpts)
            .await
            .unwrap()
            .iter()
            .all(|v| v.problem.is_none()));
        restore_cluster(&nodes, &location, &m13.id).await.unwrap();
        assert_eq!(digest(&servers), at13);
    }
}

/// Full recovery with nothing committed: every server goes back to its initial state in
/// place, and tracking starts over (a later delta holds what changed since the reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_brings_every_server_back_to_its_initial_state() {
    let dir = TempDir::new();
    let location = dir.path().join("store").to_string_lossy().into_owned();
    let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
    let (servers, nodes) = start(&dir.path().join("staging"));
    let initial = digest(&servers);
    for s in 1..=3 {
        step(&servers, s);
    }
    assert_ne!(digest(&servers), initial);
    for n in &nodes {
        n.reset().await.unwrap();
    }
    assert_eq!(digest(&servers), initial);
    // The same steps again give the same model: observers (the tracker) survived the reset.
    step(&servers, 1);
    let full = checkpoint_id(1, CheckpointKind::Full, 1);
    save_cluster(
        &nodes,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Full,
            id: full.clone(),
            step: 1,
            parent: None,
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    step(&servers, 2);
    let delta = checkpoint_id(2, CheckpointKind::Delta, 1);
    let (_, pauses) = save_cluster(
        &nodes,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Delta,
            id: delta.clone(),
            step: 2,
            parent: Some(full),
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    assert!(pauses.iter().map(|p| p.rows).sum::<u64>() > 0);
    let want = digest(&servers);
    for n in &nodes {
        n.reset().await.unwrap();
    }
    restore_cluster(&nodes, &location, &delta).await.unwrap();
    assert_eq!(digest(&servers), want);
}

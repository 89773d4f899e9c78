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

/// A server that learned it was replaced (its table of incarnations names a newer epoch of
/// it) writes nothing more to the store: a save it is asked for is refused before anything is
/// written (one it started before stops at its next put: `ftrec_ckpt::store::gated`), and the
/// checkpoint's directory holds only the other server's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_server_uploads_nothing() {
    use ftrec_ps::fence::{FenceRole, Fences, Incarnation};
    let dir = TempDir::new();
    let location = dir.path().join("store").to_string_lossy().into_owned();
    let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
    let (servers, mut nodes) = start(&dir.path().join("staging"));
    let me = Incarnation::new(FenceRole::Server, 1, 0);
    let fences = Fences::new(Some(me));
    nodes[1] = nodes[1].clone().with_fences(fences.clone());
    step(&servers, 1);
    let full = checkpoint_id(1, CheckpointKind::Full, 0);
    let plan = |id: &ftrec_ckpt::CheckpointId, step, parent| SavePlan {
        kind: CheckpointKind::Full,
        id: id.clone(),
        step,
        parent,
        data_position: DataPosition::None,
    };
    // Live, it saves like any other server.
    save_cluster(&nodes, &location, &ckpts, plan(&full, 1, None))
        .await
        .unwrap();
    // It hears of its epoch 1: replaced.
    fences.raise(Incarnation::new(FenceRole::Server, 1, 1));
    step(&servers, 2);
    let dropped = checkpoint_id(2, CheckpointKind::Full, 0);
    let save = |n: usize| nodes[n].save(location.clone(), dropped.clone(), CheckpointKind::Full, 2);
    save(0).await.unwrap();
    let e = save(1).await.unwrap_err();
    assert!(
        matches!(
            &e,
            CkptServiceError::Store(ftrec_ckpt::CkptError::Fenced { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("server 1 (epoch 0)"), "{e}");
    nodes[0].wait(dropped.clone()).await.unwrap();
    let files: Vec<String> = ckpts
        .store()
        .list(Some(&ckpts.checkpoint_dir(&dropped)))
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.to_string())
        .collect();
    assert!(!files.is_empty(), "server 0 uploaded nothing");
    assert!(
        files.iter().all(|k| k.contains("/s0000/")),
        "the fenced server's files landed: {files:?}"
    );
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

/// CPR §2.3 and §4.2 in process: a full save, more training, a prioritized (MFU) save of
/// `r` of the two largest tables' rows, more training; then server 1 is lost and its
/// replacement restores its shard alone. Every row of the replacement comes from the newest
/// save holding it: the prioritized save's rows at the step of that save, the other rows of the
/// prioritized tables at the full's step, the tables saved whole and the dense range at the
/// prioritized save's step. The survivor keeps its own, newer rows.
mod partial {
    use super::*;
    use ftrec_ckpt::cpr::{PrioritizedMeta, Priority, PriorityConfig};
    use ftrec_core::{OptimizerKind, TableId};
    use ftrec_ps::ckpt::cpr::{self, PrioritizedPlan, PriorityOptions};
    use ftrec_ps::ckpt::CkptNode;
    use ftrec_ps::{Server, SharedServer};

    use crate::common::{config, dense_init, TABLE_ROWS};

    fn options(priority: Priority) -> PriorityOptions {
        PriorityOptions {
            config: PriorityConfig {
                priority,
                r: 0.25,
                ssu_period: 1,
                seed: 3,
            },
            largest_tables: 2,
        }
    }

    fn node(dir: &std::path::Path, s: u32, priority: Priority) -> (SharedServer, CkptNode) {
        let server = SharedServer::new(
            Server::new(config(SERVERS, s, OptimizerKind::Adagrad), &dense_init()).unwrap(),
        );
        let mut opts = ftrec_ckpt::deck::StagingOptions::new(dir.join(format!("s{s}")));
        opts.chunk_bytes = 1024;
        let n = CkptNode::new(
            server.clone(),
            opts,
            ftrec_ckpt::location::LocationOptions::default(),
        )
        .unwrap()
        .with_priority(options(priority))
        .unwrap();
        (server, n)
    }

    /// Every row of every table of `server` (by local index), its dense values and the
    /// words per row.
    fn rows_of(server: &SharedServer) -> (Vec<Vec<f32>>, Vec<f32>, usize) {
        let g = server.read().unwrap();
        let tables = (0..TABLE_ROWS.len())
            .map(|t| g.shard(TableId(t as u32)).unwrap().as_slice().to_vec())
            .collect();
        (tables, g.dense().values.clone(), g.layout().words())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_server_restores_each_row_from_the_newest_save_holding_it() {
        for priority in [Priority::Mfu, Priority::Ssu, Priority::Scar] {
            let dir = TempDir::new();
            let location = dir.path().join("store").to_string_lossy().into_owned();
            let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
            let staging = dir.path().join("staging");
            let (mut servers, mut nodes) = (Vec::new(), Vec::new());
            for s in 0..SERVERS {
                let (server, n) = node(&staging, s, priority);
                servers.push(server);
                nodes.push(n);
            }
            // Only the two largest tables (3: 50 rows, 0: 23 rows) are prioritized.
            {
                let g = servers[1].read().unwrap();
                let tables: Vec<u32> = cpr::prioritized_tables(&g, 2)
                    .iter()
                    .map(|t| t.table.0)
                    .collect();
                assert_eq!(tables, vec![0, 3]);
            }
            for s in 1..=3 {
                step(&servers, s);
            }
            let full = checkpoint_id(3, CheckpointKind::Full, 0);
            save_cluster(
                &nodes,
                &location,
                &ckpts,
                SavePlan {
                    kind: CheckpointKind::Full,
                    id: full.clone(),
                    step: 3,
                    parent: None,
                    data_position: DataPosition::None,
                },
            )
            .await
            .unwrap();
            let at_full = rows_of(&servers[1]);
            for s in 4..=9 {
                step(&servers, s);
            }
            // The rows the save will choose: the same rule on the same state, just before.
            let chosen = {
                let g = servers[1].read().unwrap();
                let t = nodes[1].priority().unwrap().lock().unwrap();
                cpr::select(&g, &t)
            };
            let prioritized = checkpoint_id(9, CheckpointKind::Delta, 0);
            let (m, started) = cpr::save_cluster_prioritized(
                &nodes,
                &location,
                &ckpts,
                PrioritizedPlan {
                    id: prioritized.clone(),
                    step: 9,
                    parent: full.clone(),
                    data_position: DataPosition::None,
                    meta: PrioritizedMeta { priority, r: 0.25 },
                },
            )
            .await
            .unwrap();
            assert_eq!(m.parents, vec![full.clone()]);
            assert_eq!(PrioritizedMeta::of(&m).unwrap().priority, priority);
            let at_partial = rows_of(&servers[1]);
            // A prioritized table holds at most ceil(r * rows) rows of the shard, and some
            // rows changed since the full were left out (so the test can tell the saves apart).
            let mut left_out = 0;
            let w = at_full.2;
            for (table, local, _) in &chosen.tables {
                if let Some(local) = local {
                    let shard_rows = at_full.0[table.0 as usize].len() / w;
                    assert!(
                        local.len() <= (0.25 * shard_rows as f64).ceil() as usize,
                        "{priority}"
                    );
                    let changed = (0..shard_rows).filter(|&i| {
                        at_full.0[table.0 as usize][i * w..(i + 1) * w]
                            != at_partial.0[table.0 as usize][i * w..(i + 1) * w]
                    });
                    left_out += changed.filter(|&i| !local.contains(&(i as u64))).count();
                }
            }
            assert!(left_out > 0, "{priority}: every changed row fit the budget");
            let rows_saved: u64 = started.iter().map(|s| s.rows).sum();
            assert!(rows_saved > 0);
            for s in 10..=12 {
                step(&servers, s);
            }
            let survivor = servers[0].read().unwrap().digest();
            // Server 1 is lost: a fresh process starts from the seed and restores its shard.
            let (fresh, fresh_node) = node(&staging.join("replacement"), 1, priority);
            let done = fresh_node
                .restore(location.clone(), prioritized.clone())
                .await
                .unwrap();
            assert_eq!(done.checkpoints, 2, "full + prioritized");
            servers[1] = fresh;
            nodes[1] = fresh_node;
            assert_eq!(servers[0].read().unwrap().digest(), survivor);
            let got = rows_of(&servers[1]);
            assert_eq!(got.1, at_partial.1, "dense from the newest save");
            for (table, local, _) in &chosen.tables {
                let t = table.0 as usize;
                for i in 0..got.0[t].len() / w {
                    let want = match local {
                        None => &at_partial.0[t],
                        Some(l) if l.contains(&(i as u64)) => &at_partial.0[t],
                        Some(_) => &at_full.0[t],
                    };
                    assert_eq!(
                        &got.0[t][i * w..(i + 1) * w],
                        &want[i * w..(i + 1) * w],
                        "{priority}: table {t} row {i}"
                    );
                }
            }
            // The restored rows count as saved: nothing is pending for the next save.
            {
                let g = servers[1].read().unwrap();
                let t = nodes[1].priority().unwrap().lock().unwrap();
                assert_eq!(cpr::select(&g, &t).prioritized_rows(), 0, "{priority}");
            }
            // Training goes on from the mixed state and the next prioritized save chains on.
            step(&servers, 13);
            let next = checkpoint_id(13, CheckpointKind::Delta, 0);
            cpr::save_cluster_prioritized(
                &nodes,
                &location,
                &ckpts,
                PrioritizedPlan {
                    id: next.clone(),
                    step: 13,
                    parent: prioritized.clone(),
                    data_position: DataPosition::None,
                    meta: PrioritizedMeta { priority, r: 0.25 },
                },
            )
            .await
            .unwrap();
            let chain = deck::select_chain(&ckpts, &deck::RestoreAt::Current, false)
                .await
                .unwrap();
            let ids: Vec<_> = chain.iter().map(|m| m.id.clone()).collect();
            assert_eq!(ids, vec![full, prioritized, next]);
        }
    }

    /// A server started without a priority rule refuses a prioritized save, and a full save
    /// resets the priorities (every row is saved as it is).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prioritized_saves_need_a_rule_and_a_full_resets_priorities() {
        let dir = TempDir::new();
        let location = dir.path().join("store").to_string_lossy().into_owned();
        let (plain_servers, plain) = start(&dir.path().join("plain"));
        step(&plain_servers, 1);
        let e = plain[0]
            .save_prioritized(
                location.clone(),
                checkpoint_id(1, CheckpointKind::Delta, 0),
                1,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, CkptServiceError::NoPriority), "{e}");

        let (server, n) = node(&dir.path().join("mfu"), 0, Priority::Mfu);
        step(std::slice::from_ref(&server), 1);
        let pending = |server: &SharedServer, n: &CkptNode| {
            let g = server.read().unwrap();
            let t = n.priority().unwrap().lock().unwrap();
            cpr::select(&g, &t).prioritized_rows()
        };
        assert!(pending(&server, &n) > 0);
        let id = checkpoint_id(1, CheckpointKind::Full, 0);
        n.save(location, id.clone(), CheckpointKind::Full, 1)
            .await
            .unwrap();
        n.wait(id).await.unwrap();
        assert_eq!(pending(&server, &n), 0);
    }
}

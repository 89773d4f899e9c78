//! The server state without a transport: observers, explicit steps, configuration, layout.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use ftrec_core::{OptimizerKind, RowId, ServerId, TableId, DENSE_BLOCK};
use ftrec_ps::{
    dense_block_range, dense_value_range, InProcessClient, PsError, PushObserver, RowImages,
    Server, ServerConfig, ShardedClient, SharedServer, Update, UpdateOrigin,
};

/// Words of the updated rows before and after, when the observer asked for them.
type Images = Option<(Vec<f32>, Vec<f32>)>;

#[derive(Debug, Default)]
struct Seen {
    rows: Vec<(UpdateOrigin, TableId, Vec<RowId>, Images)>,
    dense: Vec<(UpdateOrigin, Vec<u64>)>,
}

struct Recorder {
    images: bool,
    seen: Arc<Mutex<Seen>>,
}

impl PushObserver for Recorder {
    fn wants_row_images(&self) -> bool {
        self.images
    }

    fn rows_updated(
        &mut self,
        origin: UpdateOrigin,
        table: TableId,
        rows: &[RowId],
        images: Option<RowImages<'_>>,
    ) {
        let images = images.map(|i| {
            assert_eq!(i.old.len(), rows.len() * i.words);
            (i.old.to_vec(), i.new.to_vec())
        });
        self.seen
            .lock()
            .unwrap()
            .rows
            .push((origin, table, rows.to_vec(), images));
    }

    fn dense_updated(&mut self, origin: UpdateOrigin, blocks: &[u64]) {
        self.seen
            .lock()
            .unwrap()
            .dense
            .push((origin, blocks.to_vec()));
    }
}

fn server(servers: u32, s: u32, kind: OptimizerKind) -> Server {
    Server::new(config(servers, s, kind), &dense_init()).unwrap()
}

// DECK §3.1 tracks each touched row id once per update on the shard that owns it; ECRec §3.2
// propagates the difference of a row's values and optimizer state before and after the update.
#[test]
fn observers_see_each_touched_row_once_with_its_images() {
    let mut s = server(2, 1, OptimizerKind::Momentum);
    let ids_only = Arc::new(Mutex::new(Seen::default()));
    let with_images = Arc::new(Mutex::new(Seen::default()));
    s.add_observer(Box::new(Recorder {
        images: false,
        seen: ids_only.clone(),
    }));
    s.add_observer(Box::new(Recorder {
        images: true,
        seen: with_images.clone(),
    }));
    let words = s.layout().words();
    let local_rows = s.shard(TableId(3)).unwrap().rows();
    let before = s.export_rows(TableId(3), 0..local_rows).unwrap();

    // Table 3 rows on server 1 of 2 are the even ones ((row + 3) mod 2 == 1).
    let rows = vec![8, 2, 8, 40];
    let dense_lo = s.info().dense_range.start;
    let update = Update::new()
        .with_sparse(TableId(3), rows, vec![0.25; 4 * DIM])
        .with_dense(dense_lo, vec![0.5; DENSE_BLOCK]);
    s.push(&update).unwrap();
    let after = s.export_rows(TableId(3), 0..local_rows).unwrap();

    {
        let seen = ids_only.lock().unwrap();
        assert_eq!(seen.rows.len(), 1);
        let (origin, table, rows, images) = &seen.rows[0];
        assert_eq!((*origin, *table), (UpdateOrigin::Push, TableId(3)));
        assert_eq!(rows, &vec![2, 8, 40]);
        assert!(images.is_none());
        let first_block = dense_lo / DENSE_BLOCK as u64;
        assert_eq!(seen.dense, vec![(UpdateOrigin::Push, vec![first_block])]);
    }
    {
        let seen = with_images.lock().unwrap();
        let (_, _, rows, images) = &seen.rows[0];
        let (old, new) = images.as_ref().unwrap();
        for (i, &r) in rows.iter().enumerate() {
            let local = r as usize / 2;
            let slot = local * words..(local + 1) * words;
            let (o, n) = (
                &old[i * words..(i + 1) * words],
                &new[i * words..(i + 1) * words],
            );
            assert_eq!(bits(o), bits(&before.data[slot.clone()]));
            assert_eq!(bits(n), bits(&after.data[slot]));
            assert_ne!(bits(o), bits(n));
        }
    }

    // Steps are reported with their number; imports are not reported.
    s.apply_step(3, &[&update]).unwrap();
    s.import_rows(&before).unwrap();
    let seen = ids_only.lock().unwrap();
    assert_eq!(seen.rows.len(), 2);
    assert_eq!(seen.rows[1].0, UpdateOrigin::Step(3));
}

#[test]
fn apply_step_equals_stage_and_commit() {
    let contributions: Vec<Update> = (0..3).map(|w| random_update(w, 9, true)).collect();
    let refs: Vec<&Update> = contributions.iter().collect();
    let mut direct = server(1, 0, OptimizerKind::Adagrad);
    direct.apply_step(0, &refs).unwrap();
    let mut staged = server(1, 0, OptimizerKind::Adagrad);
    for w in [1u32, 2, 0] {
        staged
            .stage_step(0, w, contributions[w as usize].clone())
            .unwrap();
    }
    assert_eq!(staged.staged_steps(), vec![(0, vec![0, 1, 2])]);
    staged.commit_step(0, &[0, 1, 2]).unwrap();
    assert!(staged.staged_steps().is_empty());
    assert_eq!(direct.digest(), staged.digest());
    let mut reference = Reference::new(OptimizerKind::Adagrad);
    reference.apply(&refs);
    assert_eq!(direct.digest(), reference.digest());
    assert!(matches!(
        direct.apply_step(0, &refs),
        Err(PsError::StepAlreadyCommitted { step: 0, last: 0 })
    ));
}

#[test]
fn staged_bytes_are_bounded() {
    let mut cfg = config(1, 0, OptimizerKind::Sgd);
    cfg.limits.max_staged_bytes = 1000;
    cfg.limits.max_update_bytes = 600;
    let mut s = Server::new(cfg, &dense_init()).unwrap();
    let u = |n: usize| Update::new().with_sparse(TableId(3), vec![1; n], vec![0.0; n * DIM]);
    // 24 bytes per row: 20 rows = 480 bytes.
    s.stage_step(1, 0, u(20)).unwrap();
    s.stage_step(1, 1, u(20)).unwrap();
    assert!(matches!(
        s.stage_step(1, 2, u(20)),
        Err(PsError::TooLarge { limit: 1000, .. })
    ));
    assert!(matches!(
        s.push(&u(30)),
        Err(PsError::TooLarge { limit: 600, .. })
    ));
    assert_eq!(s.abort_step(1), 2);
    s.stage_step(1, 2, u(20)).unwrap();
}

#[test]
fn bad_configs_name_the_problem() {
    let dense = dense_init();
    let cases: Vec<(ServerConfig, &str)> = vec![
        (config(2, 2, OptimizerKind::Sgd), "server 2"),
        (
            ServerConfig {
                dim: 0,
                ..config(1, 0, OptimizerKind::Sgd)
            },
            "dim",
        ),
        (
            ServerConfig {
                table_rows: vec![3, 0],
                ..config(1, 0, OptimizerKind::Sgd)
            },
            "table 1",
        ),
        (
            ServerConfig {
                table_rows: vec![],
                ..config(1, 0, OptimizerKind::Sgd)
            },
            "at least one table",
        ),
        (
            {
                let mut c = config(1, 0, OptimizerKind::Sgd);
                c.sparse_optimizer.lr = -1.0;
                c
            },
            "learning rate",
        ),
    ];
    for (cfg, needle) in cases {
        match Server::new(cfg, &dense) {
            Err(PsError::InvalidConfig(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
            other => panic!("expected an invalid-config error naming {needle:?}, got {other:?}"),
        }
    }
}

#[test]
fn dense_ranges_partition_the_blocks() {
    for len in [0u64, 1, 255, 256, 257, 805, 10_000] {
        for servers in 1..6u32 {
            let mut next_block = 0;
            let mut next_value = 0;
            for s in 0..servers {
                let b = dense_block_range(len, servers, ServerId(s));
                let v = dense_value_range(len, servers, ServerId(s));
                assert_eq!(b.start, next_block);
                assert_eq!(v.start, next_value);
                assert_eq!(v.start, (b.start * DENSE_BLOCK as u64).min(len));
                next_block = b.end;
                next_value = v.end;
            }
            assert_eq!(next_block, len.div_ceil(DENSE_BLOCK as u64));
            assert_eq!(next_value, len);
        }
    }
}

#[tokio::test]
async fn sharded_client_checks_the_layout() {
    let clients: Vec<InProcessClient> = (0..3)
        .map(|s| InProcessClient::new(SharedServer::new(server(3, s, OptimizerKind::Sgd))))
        .collect();
    let swapped = vec![clients[1].clone(), clients[0].clone(), clients[2].clone()];
    assert!(matches!(
        ShardedClient::new(swapped).await,
        Err(PsError::InvalidConfig(_))
    ));
    assert!(matches!(
        ShardedClient::new(clients[..2].to_vec()).await,
        Err(PsError::InvalidConfig(_))
    ));
    assert!(ShardedClient::new(clients).await.is_ok());
}

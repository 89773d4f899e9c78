//! The parameter-server service, run on both transports: every scenario below runs once
//! in-process and once over gRPC on 127.0.0.1, and must give the same bits.

mod common;

use common::*;
use ftrec_core::{DenseParams, EmbeddingTable, OptimizerKind, RowId, TableId, DENSE_BLOCK};
use ftrec_ps::{PsError, PsService, RowBlock, RowRequest, Update};

/// One `#[tokio::test]` per transport for a scenario `async fn(Transport)`.
macro_rules! on_both_transports {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn in_process() {
                super::$scenario(super::Transport::InProcess).await
            }
            #[tokio::test]
            async fn grpc() {
                super::$scenario(super::Transport::Grpc).await
            }
        }
    )*};
}

on_both_transports!(
    pull_push_round_trip,
    pushes_apply_the_optimizer_bit_for_bit,
    sharded_initial_rows_equal_the_unsharded_table,
    merged_digest_equals_the_unsharded_digest_after_updates,
    deterministic_steps_sum_in_the_given_worker_order,
    step_protocol_errors,
    bad_requests_are_refused_and_the_server_keeps_serving,
    export_import_restores_a_shard,
);

fn whole_table(t: usize, kind: OptimizerKind) -> EmbeddingTable {
    Reference::new(kind).tables[t].clone()
}

async fn pull_push_round_trip(tr: Transport) {
    let kind = OptimizerKind::RowWiseAdagrad;
    let c = Cluster::start(tr, 1, kind).await;
    let ps = &c.clients[0];
    let rows: Vec<RowId> = vec![3, 0, 3, 22, 0];
    let pulled = ps
        .pull_rows(vec![RowRequest {
            table: TableId(0),
            rows: rows.clone(),
        }])
        .await
        .unwrap();
    assert_eq!(pulled.len(), 1);
    assert_eq!(
        pulled[0].rows,
        vec![0, 3, 22],
        "ids are deduplicated and sorted"
    );
    let whole = whole_table(0, kind);
    for &r in &pulled[0].rows {
        assert_eq!(bits(pulled[0].get(r).unwrap()), bits(&whole.row(r)[..DIM]));
    }

    let grads: Vec<f32> = (0..rows.len() * DIM)
        .map(|i| i as f32 * 0.01 - 0.1)
        .collect();
    let update = Update::new()
        .with_sparse(TableId(0), rows.clone(), grads)
        .with_dense(0, vec![0.25; DENSE_LEN]);
    let report = ps.push(update.clone()).await.unwrap();
    assert_eq!(report.rows_updated, 3, "one update per distinct row");
    assert_eq!(report.dense_blocks_updated, 4);

    let mut reference = Reference::new(kind);
    reference.apply(&[&update]);
    let after = ps
        .pull_rows(vec![RowRequest {
            table: TableId(0),
            rows: rows.clone(),
        }])
        .await
        .unwrap();
    for &r in &after[0].rows {
        assert_eq!(
            bits(after[0].get(r).unwrap()),
            bits(&reference.tables[0].row(r)[..DIM]),
            "row {r}"
        );
        assert_ne!(bits(after[0].get(r).unwrap()), bits(&whole.row(r)[..DIM]));
    }
    let dense = ps.pull_dense(0..DENSE_LEN as u64).await.unwrap();
    assert_eq!(bits(&dense), bits(&reference.dense.values));
    c.stop().await;
}

async fn pushes_apply_the_optimizer_bit_for_bit(tr: Transport) {
    for kind in OptimizerKind::ALL {
        let c = Cluster::start(tr, 1, kind).await;
        let ps = &c.clients[0];
        // The reference here is core's own code path: the trainer's accumulator, then
        // `Optimizer::apply` per row and `DenseParams::apply` on the whole dense gradient.
        let mut tables: Vec<EmbeddingTable> = (0..TABLE_ROWS.len())
            .map(|t| whole_table(t, kind))
            .collect();
        let reference = Reference::new(kind);
        let (opt, dopt) = (reference.sparse, reference.dense_opt);
        let mut dense = DenseParams::new(dense_init(), &dopt);
        for push in 0..3u64 {
            let update = random_update(100 + push, 12, true);
            ps.push(update.clone()).await.unwrap();
            for p in &update.sparse {
                let mut acc = ftrec_core::SparseGradAccumulator::new(DIM);
                for (i, &r) in p.rows.iter().enumerate() {
                    acc.add(r, &p.grads[i * DIM..(i + 1) * DIM]);
                }
                for (r, g) in acc.sorted() {
                    opt.apply(tables[p.table.0 as usize].row_mut(r), DIM, g);
                }
            }
            dense.apply(&dopt, &update.dense[0].grads);
        }
        for (t, table) in tables.iter().enumerate() {
            let got = ps
                .export_rows(TableId(t as u32), 0..table.rows())
                .await
                .unwrap();
            assert_eq!(bits(&got.data), bits(table.as_slice()), "{kind}: table {t}");
        }
        let got = ps.export_dense(0..4).await.unwrap();
        assert_eq!(
            bits(&got.values),
            bits(&dense.values),
            "{kind}: dense values"
        );
        assert_eq!(bits(&got.state), bits(&dense.state), "{kind}: dense state");
        c.stop().await;
    }
}

async fn sharded_initial_rows_equal_the_unsharded_table(tr: Transport) {
    let kind = OptimizerKind::Adagrad;
    let c = Cluster::start(tr, 3, kind).await;
    let sharded = c.sharded().await;
    let requests: Vec<RowRequest> = TABLE_ROWS
        .iter()
        .enumerate()
        .map(|(t, &rows)| RowRequest {
            table: TableId(t as u32),
            rows: (0..rows).rev().collect(),
        })
        .collect();
    let pulled = sharded.pull_rows(&requests).await.unwrap();
    assert_eq!(pulled.len(), TABLE_ROWS.len());
    for (t, p) in pulled.iter().enumerate() {
        let whole = whole_table(t, kind);
        assert_eq!(p.rows, (0..TABLE_ROWS[t]).collect::<Vec<_>>());
        for r in 0..whole.rows() {
            assert_eq!(
                bits(p.get(r).unwrap()),
                bits(&whole.row(r)[..DIM]),
                "table {t} row {r}"
            );
        }
    }
    // Every server holds a part of the dense vector, and together exactly all of it.
    let ranges: Vec<_> = sharded
        .infos()
        .iter()
        .map(|i| i.dense_range.clone())
        .collect();
    assert!(ranges.iter().all(|r| !r.is_empty()), "{ranges:?}");
    assert_eq!(
        bits(&sharded.pull_dense().await.unwrap()),
        bits(&dense_init())
    );
    c.stop().await;
}

async fn merged_digest_equals_the_unsharded_digest_after_updates(tr: Transport) {
    let kind = OptimizerKind::Adam;
    let c = Cluster::start(tr, 3, kind).await;
    let sharded = c.sharded().await;
    let mut reference = Reference::new(kind);
    assert_eq!(sharded.digest().await.unwrap(), reference.digest());
    for push in 0..4u64 {
        let update = random_update(7 + push, 30, push % 2 == 0);
        sharded.push(&update).await.unwrap();
        reference.apply(&[&update]);
    }
    let merged = sharded.digest().await.unwrap();
    let expected = reference.digest();
    assert_eq!(merged.hex(), expected.hex());
    assert_eq!(merged.items(), expected.items());
    // The digest sees the updates: it moved away from the initial model's.
    assert_ne!(merged, Reference::new(kind).digest());
    c.stop().await;
}

async fn deterministic_steps_sum_in_the_given_worker_order(tr: Transport) {
    // With SGD at lr 1, a row moves by exactly the f32 sum of its gradients, and
    // (1e8 + 1) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1: the order of summation shows in the bits.
    let contributions = [1e8f32, 1.0, -1e8];
    let make = |w: usize| {
        Update::new()
            .with_sparse(TableId(3), vec![5], vec![contributions[w]; DIM])
            .with_dense(0, vec![contributions[w]; DENSE_LEN])
    };
    let mut finals = Vec::new();
    for order in [vec![0u32, 1, 2], vec![0, 2, 1]] {
        let c = Cluster::start(tr, 3, OptimizerKind::Sgd).await;
        let sharded = c.sharded().await;
        // Workers arrive in another order than the one they are summed in.
        for w in [2usize, 0, 1] {
            sharded.stage_step(1, w as u32, &make(w)).await.unwrap();
        }
        sharded.commit_step(1, &order).await.unwrap();
        let mut reference = Reference::new(OptimizerKind::Sgd);
        let ordered: Vec<Update> = order.iter().map(|&w| make(w as usize)).collect();
        reference.apply(&ordered.iter().collect::<Vec<_>>());
        assert_eq!(
            sharded.digest().await.unwrap(),
            reference.digest(),
            "order {order:?}"
        );
        let row = sharded
            .pull_rows(&[RowRequest {
                table: TableId(3),
                rows: vec![5],
            }])
            .await
            .unwrap();
        finals.push(bits(row[0].get(5).unwrap()));
        for client in sharded.servers() {
            assert_eq!(client.info().await.unwrap().last_committed_step, Some(1));
        }
        c.stop().await;
    }
    assert_ne!(finals[0], finals[1], "the commit order must change the sum");
}

async fn step_protocol_errors(tr: Transport) {
    let c = Cluster::start(tr, 1, OptimizerKind::Momentum).await;
    let ps = &c.clients[0];
    let u = random_update(3, 4, true);
    ps.stage_step(5, 0, u.clone()).await.unwrap();
    assert!(matches!(
        ps.stage_step(5, 0, u.clone()).await,
        Err(PsError::AlreadyStaged { step: 5, worker: 0 })
    ));
    ps.stage_step(5, 1, u.clone()).await.unwrap();
    let before = ps.digest().await.unwrap();
    for bad in [vec![0], vec![0, 1, 2], vec![1, 1, 0], vec![]] {
        let e = ps.commit_step(5, bad.clone()).await;
        assert!(
            matches!(e, Err(PsError::StepWorkersMismatch { step: 5, .. })),
            "{bad:?}: {e:?}"
        );
    }
    assert_eq!(
        ps.digest().await.unwrap(),
        before,
        "refused commits change nothing"
    );
    let report = ps.commit_step(5, vec![1, 0]).await.unwrap();
    assert!(report.rows_updated > 0);
    assert!(matches!(
        ps.commit_step(5, vec![0, 1]).await,
        Err(PsError::StepAlreadyCommitted { step: 5, last: 5 })
    ));
    assert!(matches!(
        ps.stage_step(4, 0, u.clone()).await,
        Err(PsError::StepAlreadyCommitted { step: 4, last: 5 })
    ));
    ps.stage_step(6, 0, u.clone()).await.unwrap();
    ps.stage_step(6, 1, u.clone()).await.unwrap();
    assert_eq!(ps.abort_step(6).await.unwrap(), 2);
    assert_eq!(ps.abort_step(6).await.unwrap(), 0);
    assert!(matches!(
        ps.commit_step(6, vec![0]).await,
        Err(PsError::StepWorkersMismatch { step: 6, .. })
    ));
    // A refused contribution is reported at stage time and is not held.
    let bad = Update::new().with_sparse(TableId(0), vec![1], vec![0.0; DIM + 1]);
    assert!(matches!(
        ps.stage_step(7, 0, bad).await,
        Err(PsError::GradientLength { .. })
    ));
    ps.stage_step(7, 1, u.clone()).await.unwrap();
    ps.commit_step(7, vec![1]).await.unwrap();
    c.stop().await;
}

async fn bad_requests_are_refused_and_the_server_keeps_serving(tr: Transport) {
    let c = Cluster::start(tr, 2, OptimizerKind::Adagrad).await;
    let ps = &c.clients[0];
    let info = ps.info().await.unwrap();
    let dense = info.dense_range.clone();
    let owned_row = 0u64; // row 0 of table 0 lives on server 0
    let foreign_row = 1u64;
    let good_pull = || RowRequest {
        table: TableId(0),
        rows: vec![owned_row],
    };
    let before = ps.digest().await.unwrap();

    let pull_errors = [
        (
            RowRequest {
                table: TableId(9),
                rows: vec![0],
            },
            PsError::UnknownTable {
                table: 9,
                tables: 4,
            },
        ),
        (
            RowRequest {
                table: TableId(0),
                rows: vec![owned_row, 1000],
            },
            PsError::RowOutOfRange {
                table: 0,
                row: 1000,
                rows: 23,
            },
        ),
        (
            RowRequest {
                table: TableId(0),
                rows: vec![foreign_row],
            },
            PsError::NotOwner {
                table: 0,
                row: 1,
                owner: 1,
                server: 0,
            },
        ),
    ];
    for (req, expected) in pull_errors {
        assert_eq!(ps.pull_rows(vec![req]).await.unwrap_err(), expected);
        assert!(ps.pull_rows(vec![good_pull()]).await.is_ok());
    }

    let good = Update::new().with_sparse(TableId(0), vec![owned_row], vec![0.5; DIM]);
    let bad_pushes = [
        Update::new().with_sparse(TableId(0), vec![owned_row], vec![0.5; DIM - 1]),
        Update::new().with_sparse(TableId(0), vec![owned_row], vec![f32::NAN; DIM]),
        Update::new().with_sparse(TableId(4), vec![0], vec![0.5; DIM]),
        // A good part followed by a bad one: nothing of the update may be applied.
        good.clone()
            .with_sparse(TableId(0), vec![foreign_row], vec![0.5; DIM]),
        good.clone()
            .with_dense(dense.start + 1, vec![0.1; DENSE_BLOCK]),
        good.clone()
            .with_dense(dense.start, vec![0.1; DENSE_BLOCK - 1]),
        good.clone().with_dense(dense.end, vec![0.1; DENSE_BLOCK]),
        good.clone()
            .with_dense(dense.start, vec![f32::INFINITY; DENSE_BLOCK]),
    ];
    for bad in bad_pushes {
        let e = ps.push(bad.clone()).await.unwrap_err();
        assert!(
            matches!(
                e,
                PsError::GradientLength { .. }
                    | PsError::NonFiniteGradient { .. }
                    | PsError::NonFiniteDenseGradient { .. }
                    | PsError::UnknownTable { .. }
                    | PsError::NotOwner { .. }
                    | PsError::DenseRange { .. }
            ),
            "{bad:?}: {e:?}"
        );
        assert_eq!(
            ps.digest().await.unwrap(),
            before,
            "refused push changed state: {e}"
        );
    }
    assert!(matches!(
        ps.pull_dense(dense.start..dense.end + 1).await,
        Err(PsError::DenseRange { .. })
    ));
    assert!(matches!(
        ps.export_rows(TableId(0), 0..1000).await,
        Err(PsError::LocalRange { table: 0, .. })
    ));
    assert!(matches!(
        ps.export_rows(TableId(8), 0..1).await,
        Err(PsError::UnknownTable { table: 8, .. })
    ));
    let words = info.dim + info.state_words;
    let torn = RowBlock {
        table: TableId(0),
        first_local: 0,
        data: vec![0.0; words + 1],
    };
    assert!(matches!(
        ps.import_rows(torn).await,
        Err(PsError::ShapeMismatch { .. })
    ));
    let past_end = RowBlock {
        table: TableId(0),
        first_local: info.local_rows[0],
        data: vec![0.0; words],
    };
    assert!(matches!(
        ps.import_rows(past_end).await,
        Err(PsError::LocalRange { .. })
    ));
    assert_eq!(ps.digest().await.unwrap(), before);

    // Still serving, and a good push still applies.
    let report = ps.push(good).await.unwrap();
    assert_eq!(report.rows_updated, 1);
    assert_ne!(ps.digest().await.unwrap(), before);
    c.stop().await;
}

async fn export_import_restores_a_shard(tr: Transport) {
    let kind = OptimizerKind::Adam;
    let trained = Cluster::start(tr, 2, kind).await;
    let fresh = Cluster::start(tr, 2, kind).await;
    let sharded = trained.sharded().await;
    for push in 0..3 {
        sharded
            .push(&random_update(40 + push, 25, true))
            .await
            .unwrap();
    }
    for (src, dst) in trained.clients.iter().zip(&fresh.clients) {
        let info = src.info().await.unwrap();
        assert_ne!(src.digest().await.unwrap(), dst.digest().await.unwrap());
        for (t, &rows) in info.local_rows.iter().enumerate() {
            // Two ranges per table, to exercise partial imports.
            let mid = rows / 2;
            for range in [0..mid, mid..rows] {
                let block = src
                    .export_rows(TableId(t as u32), range.clone())
                    .await
                    .unwrap();
                let n = dst.import_rows(block).await.unwrap();
                assert_eq!(n, range.end - range.start);
            }
        }
        let blocks = info.dense_range.start / DENSE_BLOCK as u64
            ..info.dense_range.end.div_ceil(DENSE_BLOCK as u64);
        let dense = src.export_dense(blocks.clone()).await.unwrap();
        assert_eq!(
            dst.import_dense(dense).await.unwrap(),
            blocks.end - blocks.start
        );
        assert_eq!(src.digest().await.unwrap(), dst.digest().await.unwrap());
    }
    trained.stop().await;
    fresh.stop().await;
}

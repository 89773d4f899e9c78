//! Whatever a client sends, the server answers with a value or an error, never a panic, and a
//! refused request changes nothing.

mod common;

use common::*;
use ftrec_core::{OptimizerKind, TableId};
use ftrec_ps::{DenseBlock, RowBlock, RowRequest, Server, Update};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Pull(u32, Vec<u64>),
    PullDense(u64, u64),
    Push {
        table: u32,
        rows: Vec<u64>,
        extra: i8,
        nan: bool,
        dense_offset: u64,
        dense_len: usize,
    },
    ExportRows(u32, u64, u64),
    ImportRows(u32, u64, usize),
    ExportDense(u64, u64),
    ImportDense(u64, usize, usize),
    Stage(u64, u32, u32, Vec<u64>),
    Commit(u64, Vec<u32>),
    Abort(u64),
}

fn edgy_u64() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        0u64..70,
        250u64..260,
        500u64..900,
        Just(u64::MAX),
        Just(u64::MAX - 300)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let table = 0u32..6;
    let rows = prop::collection::vec(edgy_u64(), 0..6);
    prop_oneof![
        (table.clone(), rows.clone()).prop_map(|(t, r)| Op::Pull(t, r)),
        (edgy_u64(), edgy_u64()).prop_map(|(a, b)| Op::PullDense(a, b)),
        (
            table.clone(),
            rows.clone(),
            -2i8..3,
            any::<bool>(),
            edgy_u64(),
            0usize..600
        )
            .prop_map(
                |(table, rows, extra, nan, dense_offset, dense_len)| Op::Push {
                    table,
                    rows,
                    extra,
                    nan,
                    dense_offset,
                    dense_len,
                }
            ),
        (table.clone(), edgy_u64(), edgy_u64()).prop_map(|(t, a, b)| Op::ExportRows(t, a, b)),
        (table.clone(), edgy_u64(), 0usize..200).prop_map(|(t, a, n)| Op::ImportRows(t, a, n)),
        (0u64..6, 0u64..6).prop_map(|(a, b)| Op::ExportDense(a, b)),
        (0u64..6, 0usize..800, 0usize..3000).prop_map(|(a, v, s)| Op::ImportDense(a, v, s)),
        (0u64..4, 0u32..3, table, rows).prop_map(|(s, w, t, r)| Op::Stage(s, w, t, r)),
        (0u64..4, prop::collection::vec(0u32..3, 0..4)).prop_map(|(s, w)| Op::Commit(s, w)),
        (0u64..4).prop_map(Op::Abort),
    ]
}

fn grads(rows: usize, extra: i8, nan: bool) -> Vec<f32> {
    let n = (rows * DIM) as i64 + extra as i64;
    let mut g = vec![0.125f32; n.max(0) as usize];
    if nan {
        if let Some(x) = g.last_mut() {
            *x = f32::NAN;
        }
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn requests_never_panic_and_refusals_change_nothing(ops in prop::collection::vec(op(), 1..24)) {
        // Server 1 of 2 holds the short last dense block.
        let mut s = Server::new(config(2, 1, OptimizerKind::Adam), &dense_init()).unwrap();
        for op in ops {
            let before = s.digest();
            let staged = s.staged_steps();
            let refused = match op.clone() {
                Op::Pull(t, rows) => s.pull_rows(&[RowRequest { table: TableId(t), rows }]).is_err(),
                Op::PullDense(a, b) => s.pull_dense(a..b).is_err(),
                Op::Push { table, rows, extra, nan, dense_offset, dense_len } => {
                    let g = grads(rows.len(), extra, nan);
                    let u = Update::new()
                        .with_sparse(TableId(table), rows, g)
                        .with_dense(dense_offset, vec![0.5; dense_len]);
                    s.push(&u).is_err()
                }
                Op::ExportRows(t, a, b) => s.export_rows(TableId(t), a..b).is_err(),
                Op::ImportRows(t, first_local, n) => s
                    .import_rows(&RowBlock { table: TableId(t), first_local, data: vec![0.5; n] })
                    .is_err(),
                Op::ExportDense(a, b) => s.export_dense(a..b).is_err(),
                Op::ImportDense(first_block, v, st) => s
                    .import_dense(&DenseBlock { first_block, values: vec![0.5; v], state: vec![0.0; st] })
                    .is_err(),
                Op::Stage(step, w, t, rows) => {
                    let g = grads(rows.len(), 0, false);
                    s.stage_step(step, w, Update::new().with_sparse(TableId(t), rows, g)).is_err()
                }
                Op::Commit(step, workers) => s.commit_step(step, &workers).is_err(),
                Op::Abort(step) => {
                    s.abort_step(step);
                    false
                }
            };
            if refused {
                prop_assert_eq!(s.digest(), before, "{:?} was refused but changed the model", op);
                prop_assert_eq!(s.staged_steps(), staged, "{:?} was refused but changed staging", op);
            }
        }
    }
}

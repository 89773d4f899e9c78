//! Shared test set-up: stores for every backend, including a real S3-compatible server
//! (`s3s` over `s3s-fs`) started in-process on 127.0.0.1 with a fresh directory.

#![allow(dead_code)]

use std::sync::Arc;

use ftrec_ckpt::{ChunkStore, LocalStore, MemoryStore};
#[cfg(feature = "s3")]
#[allow(unused_imports)]
pub use s3::*;

#[cfg(feature = "s3")]
mod s3 {
    #[allow(unused_imports)]
    pub use ftrec_ckpt::testing::*;
}

pub fn memory_store() -> (Arc<dyn ChunkStore>, ()) {
    (Arc::new(MemoryStore::new()), ())
}

pub fn local_store() -> (Arc<dyn ChunkStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = LocalStore::new(dir.path().join("store")).expect("local store");
    (Arc::new(store), dir)
}

use ftrec_ckpt::snapshot::{
    self, DenseShard, DenseTarget, RowIds, ServerShard, ShardTarget, TableShard, TableTarget,
};
use ftrec_core::rng::SplitMix;
use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, Optimizer, OptimizerKind, Preset, RowLayout,
    ServerId, ShardMap, TableId, DENSE_BLOCK,
};

/// One server's state in a test model.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerState {
    pub tables: Vec<EmbeddingTable>,
    pub first_block: u64,
    pub dense: DenseParams,
}

/// A small sharded model: the `tiny` preset's tables over `servers` servers, with optimizer
/// state made non-zero by a few seeded updates, and a dense vector split into block ranges.
#[derive(Debug, Clone, PartialEq)]
pub struct TestModel {
    pub map: ShardMap,
    pub servers: Vec<ServerState>,
}

pub const DENSE_VALUES: usize = 3 * DENSE_BLOCK + 57;

/// Shapes of a test model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub table_rows: Vec<u64>,
    pub dim: usize,
    pub dense_values: usize,
}

impl Spec {
    /// The `tiny` preset's 26 tables.
    pub fn tiny() -> Spec {
        let p = Preset::tiny();
        Spec {
            table_rows: p.table_rows,
            dim: p.dim,
            dense_values: DENSE_VALUES,
        }
    }

    /// Two small tables and two dense blocks: every file small enough to damage byte by byte.
    pub fn micro() -> Spec {
        Spec {
            table_rows: vec![90, 3],
            dim: 4,
            dense_values: DENSE_BLOCK + 44,
        }
    }
}

pub fn sparse_opt() -> Optimizer {
    Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.05)
}

pub fn dense_opt() -> Optimizer {
    Optimizer::new(OptimizerKind::Adagrad, 0.02)
}

impl TestModel {
    pub fn new(servers: u32, seed: u64, updated: bool) -> TestModel {
        Self::with_spec(&Spec::tiny(), servers, seed, updated)
    }

    pub fn with_spec(spec: &Spec, servers: u32, seed: u64, updated: bool) -> TestModel {
        let init_scale = 0.05;
        let map = ShardMap::new(servers).unwrap();
        let sopt = sparse_opt();
        let dopt = dense_opt();
        let layout = RowLayout::new(spec.dim, sopt.state_words(spec.dim));
        let blocks = spec.dense_values.div_ceil(DENSE_BLOCK);
        let mut out = Vec::new();
        for s in 0..servers {
            let server = ServerId(s);
            let mut tables = Vec::new();
            for (t, &rows) in spec.table_rows.iter().enumerate() {
                let id = TableId(t as u32);
                let n = map.rows_on(id, rows, server);
                let mut table = EmbeddingTable::zeros(id, n, layout);
                table.init_rows(seed, init_scale, |l| map.global_row(id, server, l));
                if updated {
                    for local in 0..n {
                        let g = map.global_row(id, server, local);
                        let mut rng = SplitMix::keyed(seed ^ 0x5EED, t as u64, g);
                        if rng.next_u64().is_multiple_of(3) {
                            let grad: Vec<f32> =
                                (0..spec.dim).map(|_| rng.next_f32() - 0.5).collect();
                            sopt.apply(table.row_mut(local), spec.dim, &grad);
                        }
                    }
                }
                tables.push(table);
            }
            let b0 = blocks * s as usize / servers as usize;
            let b1 = blocks * (s as usize + 1) / servers as usize;
            let lo = b0 * DENSE_BLOCK;
            let hi = (b1 * DENSE_BLOCK).min(spec.dense_values);
            let values: Vec<f32> = (lo..hi).map(|i| ((i as f32) * 0.37).sin() * 0.1).collect();
            let mut dense = DenseParams::new(values, &dopt);
            if updated {
                let grad: Vec<f32> = (lo..hi).map(|i| ((i as f32) * 1.3).cos()).collect();
                dense.apply(&dopt, &grad);
            }
            out.push(ServerState {
                tables,
                first_block: b0 as u64,
                dense,
            });
        }
        TestModel { map, servers: out }
    }

    /// Same shapes, all zeros.
    pub fn zeroed_like(&self) -> TestModel {
        TestModel {
            map: self.map,
            servers: self
                .servers
                .iter()
                .map(|s| ServerState {
                    tables: s
                        .tables
                        .iter()
                        .map(|t| EmbeddingTable::zeros(t.id, t.rows(), t.layout()))
                        .collect(),
                    first_block: s.first_block,
                    dense: DenseParams::new(vec![0.0; s.dense.len()], &dense_opt()),
                })
                .collect(),
        }
    }

    pub fn shards(&self) -> Vec<ServerShard<'_>> {
        self.servers
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let server = ServerId(s as u32);
                ServerShard {
                    server,
                    tables: st
                        .tables
                        .iter()
                        .map(|t| TableShard {
                            table: t,
                            ids: RowIds::Sharded {
                                map: self.map,
                                server,
                            },
                        })
                        .collect(),
                    dense: Some(DenseShard {
                        first_block: st.first_block,
                        params: &st.dense,
                    }),
                }
            })
            .collect()
    }

    pub fn targets(&mut self) -> Vec<ShardTarget<'_>> {
        let map = self.map;
        self.servers
            .iter_mut()
            .enumerate()
            .map(|(s, st)| {
                let server = ServerId(s as u32);
                ShardTarget {
                    server,
                    tables: st
                        .tables
                        .iter_mut()
                        .map(|t| TableTarget {
                            table: t,
                            ids: RowIds::Sharded { map, server },
                        })
                        .collect(),
                    dense: Some(DenseTarget {
                        first_block: st.first_block,
                        params: &mut st.dense,
                    }),
                }
            })
            .collect()
    }

    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for s in self.shards() {
            d.merge(&snapshot::shard_digest(&s));
        }
        d
    }

    /// Bit-for-bit equality of every word (PartialEq on floats would equate 0.0 and -0.0).
    pub fn bits_equal(&self, other: &TestModel) -> bool {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.servers.len() == other.servers.len()
            && self.servers.iter().zip(&other.servers).all(|(a, b)| {
                a.first_block == b.first_block
                    && bits(&a.dense.values) == bits(&b.dense.values)
                    && bits(&a.dense.state) == bits(&b.dense.state)
                    && a.tables.len() == b.tables.len()
                    && a.tables.iter().zip(&b.tables).all(|(x, y)| {
                        x.id == y.id
                            && x.layout() == y.layout()
                            && bits(x.as_slice()) == bits(y.as_slice())
                    })
            })
    }
}

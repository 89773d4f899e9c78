//! Fixtures shared by the parameter-server tests: small layouts, clusters on either transport,
//! and a single-process reference model updated by core's own functions.

#![allow(dead_code)]

use std::net::SocketAddr;

use ftrec_core::rng::SplitMix;
use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, Optimizer, OptimizerKind, RowId, RowLayout, ServerId,
    ShardMap, SparseGradAccumulator, TableId, DENSE_BLOCK,
};
use ftrec_ps::grpc::{self, GrpcClient, GrpcConfig, ServeHandle};
use ftrec_ps::{
    InProcessClient, Limits, PsClient, Server, ServerConfig, ShardedClient, SharedServer, Update,
};

pub const DIM: usize = 4;
pub const TABLE_ROWS: [u64; 4] = [23, 7, 1, 50];
pub const DENSE_LEN: usize = 3 * DENSE_BLOCK + 37;
pub const SEED: u64 = 11;
pub const SCALE: f32 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    InProcess,
    Grpc,
}

pub fn config(servers: u32, server: u32, sparse: OptimizerKind) -> ServerConfig {
    ServerConfig {
        server: ServerId(server),
        shard_map: ShardMap::new(servers).unwrap(),
        table_rows: TABLE_ROWS.to_vec(),
        dim: DIM,
        sparse_optimizer: Optimizer::new(sparse, 0.1),
        dense_optimizer: Optimizer::new(OptimizerKind::Adam, 0.01),
        seed: SEED,
        init_scale: SCALE,
        limits: Limits::default(),
    }
}

pub fn dense_init() -> Vec<f32> {
    let mut g = SplitMix::new(99);
    (0..DENSE_LEN).map(|_| g.next_f32() - 0.5).collect()
}

/// Servers of one layout with a client per server on the chosen transport.
pub struct Cluster {
    pub servers: Vec<SharedServer>,
    pub clients: Vec<PsClient>,
    pub handles: Vec<ServeHandle>,
}

impl Cluster {
    pub async fn start(transport: Transport, servers: u32, sparse: OptimizerKind) -> Cluster {
        Self::start_with(transport, servers, sparse, GrpcConfig::default()).await
    }

    pub async fn start_with(
        transport: Transport,
        servers: u32,
        sparse: OptimizerKind,
        grpc_config: GrpcConfig,
    ) -> Cluster {
        let dense = dense_init();
        let mut c = Cluster {
            servers: Vec::new(),
            clients: Vec::new(),
            handles: Vec::new(),
        };
        for s in 0..servers {
            let server =
                SharedServer::new(Server::new(config(servers, s, sparse), &dense).unwrap());
            let client = match transport {
                Transport::InProcess => PsClient::InProcess(InProcessClient::new(server.clone())),
                Transport::Grpc => {
                    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
                    let h = grpc::serve(server.clone(), addr, grpc_config)
                        .await
                        .unwrap();
                    let client = GrpcClient::connect(h.local_addr(), grpc_config)
                        .await
                        .unwrap();
                    c.handles.push(h);
                    PsClient::Grpc(Box::new(client))
                }
            };
            c.servers.push(server);
            c.clients.push(client);
        }
        c
    }

    pub async fn sharded(&self) -> ShardedClient<PsClient> {
        ShardedClient::new(self.clients.clone()).await.unwrap()
    }

    pub async fn stop(self) {
        for h in self.handles {
            h.shutdown().await.unwrap();
        }
    }
}

/// The single-process model: whole tables and the whole dense vector, updated by core's
/// accumulator and optimizer.
pub struct Reference {
    pub tables: Vec<EmbeddingTable>,
    pub dense: DenseParams,
    pub sparse: Optimizer,
    pub dense_opt: Optimizer,
}

impl Reference {
    pub fn new(sparse: OptimizerKind) -> Reference {
        let cfg = config(1, 0, sparse);
        let layout = RowLayout::new(DIM, cfg.sparse_optimizer.state_words(DIM));
        Reference {
            tables: TABLE_ROWS
                .iter()
                .enumerate()
                .map(|(t, &rows)| {
                    EmbeddingTable::new_init(TableId(t as u32), rows, layout, SEED, SCALE)
                })
                .collect(),
            dense: DenseParams::new(dense_init(), &cfg.dense_optimizer),
            sparse: cfg.sparse_optimizer,
            dense_opt: cfg.dense_optimizer,
        }
    }

    /// Apply the sum of `updates` (in order) as one step: one update per touched row, and per
    /// touched dense block a sum that starts from the first contribution.
    pub fn apply(&mut self, updates: &[&Update]) {
        let mut accs: Vec<SparseGradAccumulator> = self
            .tables
            .iter()
            .map(|_| SparseGradAccumulator::new(DIM))
            .collect();
        let blocks = self.dense.blocks();
        let mut dense: Vec<Option<Vec<f32>>> = vec![None; blocks];
        for u in updates {
            for p in &u.sparse {
                for (i, &r) in p.rows.iter().enumerate() {
                    accs[p.table.0 as usize].add(r, &p.grads[i * DIM..(i + 1) * DIM]);
                }
            }
            for p in &u.dense {
                for (k, g) in p.grads.iter().enumerate() {
                    let idx = p.offset as usize + k;
                    let (b, off) = (idx / DENSE_BLOCK, idx % DENSE_BLOCK);
                    let len = DENSE_BLOCK.min(self.dense.len() - b * DENSE_BLOCK);
                    // Gradients are finite, so NaN marks a value no contribution has set yet:
                    // the first contribution is copied, later ones are added.
                    let slot = dense[b].get_or_insert_with(|| vec![f32::NAN; len]);
                    if slot[off].is_nan() {
                        slot[off] = *g;
                    } else {
                        slot[off] += g;
                    }
                }
            }
        }
        for (t, acc) in accs.iter().enumerate() {
            for (r, g) in acc.sorted() {
                self.sparse.apply(self.tables[t].row_mut(r), DIM, g);
            }
        }
        for (b, g) in dense.iter().enumerate() {
            if let Some(g) = g {
                let (v, s) = self.dense.block_mut(b, &self.dense_opt);
                self.dense_opt.apply_split(v, s, g);
            }
        }
    }

    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for t in &self.tables {
            for r in 0..t.rows() {
                d.add_row(t.id.0, r, t.row(r));
            }
        }
        self.dense.digest_into(&mut d);
        d
    }
}

/// A seeded update touching `n` rows of every table (with repeats) and, if `dense`, the
/// whole dense vector.
pub fn random_update(seed: u64, n: usize, dense: bool) -> Update {
    let mut g = SplitMix::new(seed);
    let mut u = Update::new();
    for (t, &rows) in TABLE_ROWS.iter().enumerate() {
        let ids: Vec<RowId> = (0..n).map(|_| g.next_u64() % rows).collect();
        let grads: Vec<f32> = (0..n * DIM).map(|_| g.next_f32() - 0.5).collect();
        u = u.with_sparse(TableId(t as u32), ids, grads);
    }
    if dense {
        u = u.with_dense(0, (0..DENSE_LEN).map(|_| g.next_f32() - 0.5).collect());
    }
    u
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

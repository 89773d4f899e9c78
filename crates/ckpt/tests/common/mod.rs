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
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::sync::{Arc, OnceLock};

    use ftrec_ckpt::{Key, S3Config, S3Store};

    pub const BUCKET: &str = "ftrec-test";
    const ACCESS_KEY: &str = "ftrec-access";
    const SECRET_KEY: &str = "ftrec-secret-key";

    pub struct S3Server {
        pub endpoint: String,
        pub root: PathBuf,
    }

    /// Remove server directories of test processes that have exited.
    fn sweep_stale(base: &std::path::Path) {
        let Ok(rd) = std::fs::read_dir(base) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(pid) = name.parse::<u32>() {
                if pid != std::process::id()
                    && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// One server per test binary, on its own thread and runtime so that it outlives each
    /// `#[tokio::test]` runtime.
    pub fn s3_server() -> &'static S3Server {
        static SERVER: OnceLock<S3Server> = OnceLock::new();
        SERVER.get_or_init(|| {
            let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ftrec-ckpt-s3s");
            sweep_stale(&base);
            let root = base.join(std::process::id().to_string());
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join(BUCKET)).expect("create the bucket directory");
            let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
            let server_root = root.clone();
            std::thread::Builder::new()
                .name("s3s".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("server runtime");
                    rt.block_on(serve(server_root, tx));
                })
                .expect("spawn the server thread");
            let addr = rx.recv().expect("the server reports its address");
            S3Server {
                endpoint: format!("http://{addr}"),
                root,
            }
        })
    }

    async fn serve(root: PathBuf, tx: std::sync::mpsc::Sender<SocketAddr>) {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder;
        use s3s::auth::SimpleAuth;
        use s3s::service::S3ServiceBuilder;

        let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs root");
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        tx.send(listener.local_addr().expect("local address"))
            .expect("report the address");
        let http = Builder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    }

    pub fn s3_config(prefix: Option<&str>) -> S3Config {
        let server = s3_server();
        let mut c = S3Config::new(&server.endpoint, BUCKET, ACCESS_KEY, SECRET_KEY);
        c.prefix = prefix.map(|p| Key::new(p).expect("valid prefix"));
        c
    }

    pub async fn s3_store(prefix: Option<&str>) -> Arc<S3Store> {
        Arc::new(
            S3Store::connect(s3_config(prefix))
                .await
                .expect("connect to the in-process S3 server"),
        )
    }
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

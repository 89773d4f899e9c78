//! Version-1 files checked in under `tests/fixtures/v1`: this build must keep reading them,
//! bit for bit, and its writer must keep producing them.
//!
//! The fixture model's values come from a closed formula (not from the core RNG), so the
//! expected contents never depend on code outside the format. To regenerate after an
//! intentional change, bump the format version, keep this directory, and add a new one:
//! `FTREC_REGEN_FIXTURES=1 cargo test -p ftrec-ckpt --test fixtures_v1` rewrites this one
//! (only ever do that before a release has written v1 files).

use std::path::PathBuf;
use std::sync::Arc;

use ftrec_ckpt::snapshot::{
    self, DenseShard, DenseTarget, RowIds, ServerShard, ShardTarget, SnapshotOptions, TableShard,
    TableTarget,
};
use ftrec_ckpt::{
    CheckpointId, CheckpointKind, Checkpoints, ChunkStore, DataPosition, LocalStore, MemoryStore,
    Select,
};
use ftrec_core::{
    DenseParams, EmbeddingTable, Optimizer, OptimizerKind, RowLayout, ServerId, ShardMap, TableId,
    DENSE_BLOCK,
};

const SERVERS: u32 = 2;
const TABLE_ROWS: [u64; 2] = [5, 3];
const DENSE_VALUES: usize = DENSE_BLOCK + 44;
const STEP: u64 = 77;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

fn opt() -> Optimizer {
    Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.1)
}

fn layout() -> RowLayout {
    RowLayout::new(2, 1)
}

fn position() -> DataPosition {
    DataPosition::Json(serde_json::json!({"epoch": 1, "offset": 4096}))
}

struct Server {
    tables: Vec<EmbeddingTable>,
    first_block: u64,
    dense: DenseParams,
}

/// The fixture model, or zeros of its shapes.
fn model(zeros: bool) -> (ShardMap, Vec<Server>) {
    let map = ShardMap::new(SERVERS).unwrap();
    let blocks = DENSE_VALUES.div_ceil(DENSE_BLOCK);
    let servers = (0..SERVERS)
        .map(|s| {
            let server = ServerId(s);
            let tables = TABLE_ROWS
                .iter()
                .enumerate()
                .map(|(t, &rows)| {
                    let id = TableId(t as u32);
                    let n = map.rows_on(id, rows, server);
                    let mut table = EmbeddingTable::zeros(id, n, layout());
                    if !zeros {
                        for local in 0..n {
                            let g = map.global_row(id, server, local);
                            let base = (t as u64 * 100 + g) as f32;
                            table.row_mut(local).copy_from_slice(&[
                                base,
                                base + 0.25,
                                -(g as f32) - 0.5,
                            ]);
                        }
                    }
                    table
                })
                .collect();
            let b0 = blocks * s as usize / SERVERS as usize;
            let b1 = blocks * (s as usize + 1) / SERVERS as usize;
            let lo = b0 * DENSE_BLOCK;
            let hi = (b1 * DENSE_BLOCK).min(DENSE_VALUES);
            let values = (lo..hi)
                .map(|j| if zeros { 0.0 } else { j as f32 * 0.5 })
                .collect();
            let mut dense = DenseParams::new(values, &opt());
            if !zeros {
                for (b, st) in dense.state.iter_mut().enumerate() {
                    *st = (b0 + b) as f32 + 0.125;
                }
            }
            Server {
                tables,
                first_block: b0 as u64,
                dense,
            }
        })
        .collect();
    (map, servers)
}

fn shards(map: ShardMap, servers: &[Server]) -> Vec<ServerShard<'_>> {
    servers
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
                        ids: RowIds::Sharded { map, server },
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

fn opts() -> SnapshotOptions {
    SnapshotOptions {
        chunk_bytes: 1024,
        max_in_flight: 1,
    }
}

fn id() -> CheckpointId {
    CheckpointId::for_step(STEP, CheckpointKind::Full)
}

async fn write_fixture(store: Arc<dyn ChunkStore>) {
    let (map, servers) = model(false);
    let ckpts = Checkpoints::new(store);
    snapshot::write_full(
        &ckpts,
        &id(),
        STEP,
        position(),
        &shards(map, &servers),
        &opts(),
    )
    .await
    .unwrap();
}

/// Regenerate once per run if asked to; both tests wait for it.
async fn fixture_ready() {
    static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    READY
        .get_or_init(|| async {
            if std::env::var_os("FTREC_REGEN_FIXTURES").is_some() {
                let _ = std::fs::remove_dir_all(fixture_dir());
                write_fixture(Arc::new(LocalStore::new(fixture_dir()).unwrap())).await;
            }
        })
        .await;
}

#[tokio::test]
async fn v1_fixture_reads_bit_for_bit() {
    fixture_ready().await;
    assert!(
        fixture_dir().join("CURRENT").is_file(),
        "fixture missing at {}",
        fixture_dir().display()
    );
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(fixture_dir()).unwrap()));
    let m = ckpts
        .select(&Select::Current, &[CheckpointKind::Full])
        .await
        .unwrap();
    assert_eq!(m.id, id());
    assert_eq!(m.step, STEP);
    assert_eq!(m.kind, CheckpointKind::Full);
    assert_eq!(m.data_position, position());
    assert!(m.parents.is_empty());
    assert_eq!(m.shards.len(), SERVERS as usize);

    let (map, expected) = model(false);
    let (_, mut restored) = model(true);
    for (s, st) in restored.iter_mut().enumerate() {
        let server = ServerId(s as u32);
        let mut target = ShardTarget {
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
        };
        snapshot::restore_shard(&ckpts, &m, &mut target, &opts())
            .await
            .unwrap();
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (a, b) in restored.iter().zip(&expected) {
        for (x, y) in a.tables.iter().zip(&b.tables) {
            assert_eq!(bits(x.as_slice()), bits(y.as_slice()), "table {}", x.id.0);
        }
        assert_eq!(bits(&a.dense.values), bits(&b.dense.values));
        assert_eq!(bits(&a.dense.state), bits(&b.dense.state));
    }
}

#[tokio::test]
async fn v1_writer_still_produces_the_fixture_bytes() {
    fixture_ready().await;
    let mem = Arc::new(MemoryStore::new());
    write_fixture(mem.clone()).await;
    let written = mem.list(None).await.unwrap();
    let on_disk = LocalStore::new(fixture_dir())
        .unwrap()
        .list(None)
        .await
        .unwrap();
    assert_eq!(
        written.iter().map(|m| &m.key).collect::<Vec<_>>(),
        on_disk.iter().map(|m| &m.key).collect::<Vec<_>>(),
        "the v1 file set changed"
    );
    for meta in &written {
        let now = mem.get(&meta.key).await.unwrap();
        let then = std::fs::read(fixture_dir().join(meta.key.as_str())).unwrap();
        assert!(
            now[..] == then[..],
            "{}: the v1 writer's bytes changed; that is a format change: bump the version \
             and add a fixture directory for it",
            meta.key
        );
    }
}

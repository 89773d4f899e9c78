//! Full snapshots: several servers write one checkpoint in parallel, with bounded chunk files
//! and bounded memory, and restore bit-identical shards on every backend.

mod common;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ftrec_ckpt::format::FileContent;
use ftrec_ckpt::snapshot::{
    self, RowIds, ServerShard, ShardTarget, SnapshotOptions, TableShard, TableTarget,
};
use ftrec_ckpt::{
    Bytes, CheckpointId, CheckpointKind, Checkpoints, ChunkStore, CkptError, DataPosition, Key,
    ObjectMeta, PutMode, Select,
};
use ftrec_core::{EmbeddingTable, ModelDigest, Preset, RowLayout, ServerId, TableId};

fn opts(chunk_bytes: usize) -> SnapshotOptions {
    SnapshotOptions {
        chunk_bytes,
        max_in_flight: 3,
    }
}

async fn round_trip(store: Arc<dyn ChunkStore>) {
    let model = TestModel::new(3, 11, true);
    let ckpts = Checkpoints::new(store);
    let id = CheckpointId::for_step(40, CheckpointKind::Full);
    let pos = DataPosition::Json(serde_json::json!({"epoch": 0, "batch": 40}));
    let o = opts(4096);
    let manifest = snapshot::write_full(&ckpts, &id, 40, pos.clone(), &model.shards(), &o)
        .await
        .unwrap();
    assert_eq!(manifest.shards.len(), 3);
    assert!(
        manifest.files.len() > 3 * 26,
        "small chunks should split tables"
    );
    for f in &manifest.files {
        assert!(f.size <= 4096, "{} is {} bytes", f.path, f.size);
    }

    let opened = ckpts
        .select(&Select::Current, &[CheckpointKind::Full])
        .await
        .unwrap();
    assert_eq!(opened, manifest);
    assert_eq!(opened.step, 40);
    assert_eq!(opened.data_position, pos);

    let mut restored = model.zeroed_like();
    let mut rows = 0;
    for mut t in restored.targets() {
        let r = snapshot::restore_shard(&ckpts, &opened, &mut t, &o)
            .await
            .unwrap();
        rows += r.rows;
    }
    assert_eq!(rows, Preset::tiny().total_rows());
    assert_eq!(restored.digest(), model.digest());
    assert!(restored.bits_equal(&model));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_is_bit_identical_on_memory() {
    round_trip(memory_store().0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_is_bit_identical_on_local() {
    let (store, _dir) = local_store();
    round_trip(store).await;
}

#[cfg(feature = "s3")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_is_bit_identical_on_s3() {
    round_trip(s3_store(Some("snapshot-round-trip")).await).await;
}

#[test]
fn shard_digests_merge_to_the_whole_model_digest() {
    // Without updates every shard holds init values, so the whole tables can be rebuilt
    // independently; the merged shard digests must equal theirs (global keys are right).
    let model = TestModel::new(3, 5, false);
    let preset = Preset::tiny();
    let layout = model.servers[0].tables[0].layout();
    let mut whole = ModelDigest::new();
    for (t, &rows) in preset.table_rows.iter().enumerate() {
        let table = EmbeddingTable::new_init(TableId(t as u32), rows, layout, 5, preset.init_scale);
        for r in 0..rows {
            whole.add_row(t as u32, r, table.row(r));
        }
    }
    let values: Vec<f32> = (0..DENSE_VALUES)
        .map(|i| ((i as f32) * 0.37).sin() * 0.1)
        .collect();
    ftrec_core::DenseParams::new(values, &dense_opt()).digest_into(&mut whole);
    assert_eq!(model.digest(), whole);
}

#[tokio::test]
async fn explicit_row_ids_round_trip_and_foreign_rows_are_refused() {
    let layout = RowLayout::new(3, 0);
    let ids: Vec<u64> = vec![4, 9, 10, 200, 7000];
    let mut table = EmbeddingTable::zeros(TableId(2), 5, layout);
    for (i, v) in table.as_mut_slice().iter_mut().enumerate() {
        *v = i as f32 - 6.5;
    }
    let ckpts = Checkpoints::new(memory_store().0);
    let id = CheckpointId::new("explicit").unwrap();
    let shard = ServerShard {
        server: ServerId(0),
        tables: vec![TableShard {
            table: &table,
            ids: RowIds::Explicit(&ids),
        }],
        dense: None,
    };
    let o = SnapshotOptions {
        chunk_bytes: 1024,
        max_in_flight: 1,
    };
    let m = snapshot::write_full(&ckpts, &id, 1, DataPosition::None, &[shard], &o)
        .await
        .unwrap();
    let mut back = EmbeddingTable::zeros(TableId(2), 5, layout);
    let mut target = ShardTarget {
        server: ServerId(0),
        tables: vec![TableTarget {
            table: &mut back,
            ids: RowIds::Explicit(&ids),
        }],
        dense: None,
    };
    snapshot::restore_shard(&ckpts, &m, &mut target, &o)
        .await
        .unwrap();
    assert_eq!(back, table);

    // The same files restored into a shard that owns other rows: refused, naming the file.
    let other: Vec<u64> = vec![4, 9, 11, 200, 7000];
    let mut wrong = EmbeddingTable::zeros(TableId(2), 5, layout);
    let mut target = ShardTarget {
        server: ServerId(0),
        tables: vec![TableTarget {
            table: &mut wrong,
            ids: RowIds::Explicit(&other),
        }],
        dense: None,
    };
    let err = snapshot::restore_shard(&ckpts, &m, &mut target, &o)
        .await
        .unwrap_err();
    assert!(matches!(err, CkptError::Corrupt { .. }), "{err}");
    assert!(err.file().unwrap().ends_with(".rows"), "{err}");
}

#[tokio::test]
async fn shape_mismatches_are_refused_before_reading() {
    let model = TestModel::new(2, 3, true);
    let ckpts = Checkpoints::new(memory_store().0);
    let id = CheckpointId::new("shapes").unwrap();
    let o = opts(8192);
    let m = snapshot::write_full(&ckpts, &id, 1, DataPosition::None, &model.shards(), &o)
        .await
        .unwrap();

    // Wrong server.
    let mut z = model.zeroed_like();
    let mut targets = z.targets();
    targets[0].server = ServerId(7);
    let err = snapshot::restore_shard(&ckpts, &m, &mut targets[0], &o)
        .await
        .unwrap_err();
    assert!(matches!(err, CkptError::InvalidCheckpoint { .. }), "{err}");

    // A missing table.
    let mut z = model.zeroed_like();
    let mut targets = z.targets();
    targets[1].tables.pop();
    let err = snapshot::restore_shard(&ckpts, &m, &mut targets[1], &o)
        .await
        .unwrap_err();
    assert!(matches!(err, CkptError::InvalidCheckpoint { .. }), "{err}");

    // A table of another size.
    let mut z = model.zeroed_like();
    let layout = z.servers[0].tables[3].layout();
    z.servers[0].tables[3] = EmbeddingTable::zeros(TableId(3), 1, layout);
    let mut targets = z.targets();
    let err = snapshot::restore_shard(&ckpts, &m, &mut targets[0], &o)
        .await
        .unwrap_err();
    assert!(matches!(err, CkptError::InvalidCheckpoint { .. }), "{err}");

    // No dense target for a shard that saved dense blocks.
    let mut z = model.zeroed_like();
    let mut targets = z.targets();
    targets[0].dense = None;
    let err = snapshot::restore_shard(&ckpts, &m, &mut targets[0], &o)
        .await
        .unwrap_err();
    assert!(matches!(err, CkptError::InvalidCheckpoint { .. }), "{err}");

    // Bad options and duplicate servers are refused up front.
    let bad = SnapshotOptions {
        chunk_bytes: 10,
        max_in_flight: 1,
    };
    let err = snapshot::write_full(
        &ckpts,
        &CheckpointId::new("bad").unwrap(),
        1,
        DataPosition::None,
        &model.shards(),
        &bad,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CkptError::InvalidArgument(_)), "{err}");
    let mut dup = model.shards();
    dup[1].server = ServerId(0);
    let err = snapshot::write_full(
        &ckpts,
        &CheckpointId::new("dup").unwrap(),
        1,
        DataPosition::None,
        &dup,
        &o,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CkptError::InvalidArgument(_)), "{err}");
}

/// Records the largest number of bytes held by puts in progress at once.
#[derive(Debug)]
struct InFlight {
    inner: Arc<dyn ChunkStore>,
    now: AtomicU64,
    max: AtomicU64,
}

#[async_trait::async_trait]
impl ChunkStore for InFlight {
    fn backend(&self) -> &'static str {
        "in-flight"
    }
    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> ftrec_ckpt::Result<()> {
        let n = data.len() as u64;
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        self.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let r = self.inner.put(key, data, mode).await;
        self.now.fetch_sub(n, Ordering::SeqCst);
        r
    }
    async fn get(&self, key: &Key) -> ftrec_ckpt::Result<Bytes> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &Key, r: Range<u64>) -> ftrec_ckpt::Result<Bytes> {
        self.inner.get_range(key, r).await
    }
    async fn head(&self, key: &Key) -> ftrec_ckpt::Result<ObjectMeta> {
        self.inner.head(key).await
    }
    async fn list(&self, p: Option<&Key>) -> ftrec_ckpt::Result<Vec<ObjectMeta>> {
        self.inner.list(p).await
    }
    async fn delete(&self, key: &Key) -> ftrec_ckpt::Result<()> {
        self.inner.delete(key).await
    }
    async fn swap(&self, key: &Key, e: Option<Bytes>, d: Bytes) -> ftrec_ckpt::Result<()> {
        self.inner.swap(key, e, d).await
    }
}

#[tokio::test]
async fn writes_hold_at_most_max_in_flight_chunks() {
    // DECK §3.2: memory held by a checkpoint write is set by the chunk size, not the model.
    let model = TestModel::new(1, 9, true);
    let store = Arc::new(InFlight {
        inner: memory_store().0,
        now: AtomicU64::new(0),
        max: AtomicU64::new(0),
    });
    let ckpts = Checkpoints::new(store.clone());
    // A dense block with Adagrad state is 2 KiB, so 4 KiB chunks hold whole blocks.
    let o = SnapshotOptions {
        chunk_bytes: 4096,
        max_in_flight: 2,
    };
    let m = snapshot::write_full(
        &ckpts,
        &CheckpointId::new("bounded").unwrap(),
        1,
        DataPosition::None,
        &model.shards(),
        &o,
    )
    .await
    .unwrap();
    let max = store.max.load(Ordering::SeqCst);
    let bytes = m.data_bytes();
    assert!(
        bytes > 50 * 4096,
        "the model spans many chunks ({bytes} bytes)"
    );
    // The manifest is the only larger object, and it is put alone after the data.
    let largest_data = m.files.iter().map(|f| f.size).max().unwrap();
    assert!(largest_data <= 4096);
    let manifest_size = ckpts
        .store()
        .head(&ckpts.manifest_key(&m.id))
        .await
        .unwrap()
        .size;
    assert!(
        max <= (2 * 4096).max(manifest_size),
        "{max} bytes were in flight at once"
    );
}

#[tokio::test]
async fn files_are_laid_out_per_server_and_table() {
    let model = TestModel::new(2, 1, false);
    let ckpts = Checkpoints::new(memory_store().0);
    let m = snapshot::write_full(
        &ckpts,
        &CheckpointId::new("layout").unwrap(),
        3,
        DataPosition::Bytes(vec![1, 2, 3]),
        &model.shards(),
        &opts(1 << 20),
    )
    .await
    .unwrap();
    // One file per (server, table) when chunks are large, plus one dense file per server.
    let rows_files = m
        .files
        .iter()
        .filter(|f| matches!(f.content, FileContent::Rows { .. }))
        .count();
    let dense_files = m
        .files
        .iter()
        .filter(|f| matches!(f.content, FileContent::Dense { .. }))
        .count();
    assert_eq!(rows_files, 2 * 26);
    assert_eq!(dense_files, 2);
    assert!(m.files.iter().any(|f| f.path == "s0001/t0025-000000.rows"));
    let listed = ckpts
        .store()
        .list(Some(&ckpts.checkpoint_dir(&m.id)))
        .await
        .unwrap();
    assert_eq!(listed.len(), m.files.len() + 1, "data files plus MANIFEST");
}

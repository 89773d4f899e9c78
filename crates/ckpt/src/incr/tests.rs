//! Newest wins, proven: random sequences of updates, checkpoints, base resets and restores on a
//! sharded model, for every scheme and many extraction settings; every restore must equal the
//! model as it was at the restored checkpoint, bit for bit (values, optimizer state, dense).

use std::collections::BTreeMap;
use std::sync::Arc;

use ftrec_core::rng::SplitMix;
use ftrec_core::{RowId, RowLayout, ServerId, ShardMap, TableId};
use proptest::prelude::*;

use super::store::write_mem_shards;
use super::*;
use crate::checkpoint::Checkpoints;
use crate::deck::{self, RestoreAt};
use crate::error::CkptError;
use crate::format::dense::encode_dense;
use crate::format::rows::encode_rows;
use crate::format::{
    CheckpointId, CheckpointKind, DataPosition, FileContent, FileInfo, ShardInfo, TableInfo,
};
use crate::snapshot::{full_manifest, ShardReport};
use crate::store::memory::MemoryStore;

const TABLES: [u64; 3] = [40, 7, 130];
const DENSE: usize = 300;

/// A shard's bits: tables, dense values, dense state.
type Bits = (Vec<Vec<u32>>, Vec<u32>, Vec<u32>);

fn layout() -> RowLayout {
    RowLayout::new(2, 1)
}

/// The live model of every server, and what each tracked since its last piece (or base).
struct Model {
    map: ShardMap,
    shards: Vec<MemShard>,
    tracked: Vec<BTreeMap<u32, std::collections::BTreeSet<RowId>>>,
    rng: SplitMix,
}

impl Model {
    fn new(servers: u32, seed: u64) -> Model {
        let map = ShardMap::new(servers).unwrap();
        let blocks_per = DENSE.div_ceil(ftrec_core::DENSE_BLOCK);
        let shards = (0..servers)
            .map(|s| {
                let info = ShardInfo {
                    server: ServerId(s),
                    tables: TABLES
                        .iter()
                        .enumerate()
                        .map(|(t, &rows)| TableInfo {
                            table: TableId(t as u32),
                            rows: map.rows_on(TableId(t as u32), rows, ServerId(s)),
                            layout: layout(),
                        })
                        .collect(),
                    dense: Some(crate::format::DenseInfo {
                        first_block: s as u64 * blocks_per as u64,
                        blocks: blocks_per as u64,
                        values: DENSE as u64,
                        state_per_block: 1,
                    }),
                };
                let mut m = MemShard::of(&info, map);
                for t in &mut m.tables {
                    for (i, w) in t.as_mut_slice().iter_mut().enumerate() {
                        *w = i as f32 * 0.01 - 1.0;
                    }
                }
                m
            })
            .collect();
        Model {
            map,
            shards,
            tracked: vec![BTreeMap::new(); servers as usize],
            rng: SplitMix::new(seed),
        }
    }

    /// Touch `n` skewed rows (values and optimizer state) and every dense value.
    fn update(&mut self, n: usize) {
        for _ in 0..n {
            let t = (self.rng.next_u64() % TABLES.len() as u64) as u32;
            let u = self.rng.next_f64();
            let row = ((u * u * u) * TABLES[t as usize] as f64) as u64;
            let s = self.map.owner(TableId(t), row);
            let local = self.map.local_index(TableId(t), row);
            let delta = (self.rng.next_u64() % 1000) as f32 * 1e-3 - 0.5;
            let shard = &mut self.shards[s.0 as usize];
            let r = shard.tables[t as usize].row_mut(local);
            r[0] += delta;
            r[1] -= delta * 0.5;
            r[2] += delta * delta;
            self.tracked[s.0 as usize].entry(t).or_default().insert(row);
        }
        for s in &mut self.shards {
            if let Some((_, v, st, _)) = &mut s.dense {
                for x in v.iter_mut() {
                    *x += 0.001;
                }
                for x in st.iter_mut() {
                    *x += 0.5;
                }
            }
        }
    }

    fn snapshot(&self) -> Vec<Bits> {
        self.shards
            .iter()
            .map(|s| {
                (
                    s.tables
                        .iter()
                        .map(|t| t.as_slice().iter().map(|w| w.to_bits()).collect())
                        .collect(),
                    s.dense
                        .as_ref()
                        .map_or(vec![], |d| d.1.iter().map(|w| w.to_bits()).collect()),
                    s.dense
                        .as_ref()
                        .map_or(vec![], |d| d.2.iter().map(|w| w.to_bits()).collect()),
                )
            })
            .collect()
    }
}

fn bits_of(s: &MemShard) -> Bits {
    (
        s.tables
            .iter()
            .map(|t| t.as_slice().iter().map(|w| w.to_bits()).collect())
            .collect(),
        s.dense
            .as_ref()
            .map_or(vec![], |d| d.1.iter().map(|w| w.to_bits()).collect()),
        s.dense
            .as_ref()
            .map_or(vec![], |d| d.2.iter().map(|w| w.to_bits()).collect()),
    )
}

/// Write the piece files of `shard` for `tracked` rows, `chunk_rows` rows per file.
async fn write_piece_files(
    ckpts: &Checkpoints,
    id: &CheckpointId,
    shard: &MemShard,
    tracked: &[(TableId, Vec<RowId>)],
    chunk_rows: usize,
) -> ShardReport {
    let mut files = Vec::new();
    let mut tables = Vec::new();
    for (t, ids) in tracked {
        let table = &shard.tables[t.0 as usize];
        let w = layout().words();
        for (n, part) in ids.chunks(chunk_rows.max(1)).enumerate() {
            let mut rows = Vec::with_capacity(part.len() * w);
            for &g in part {
                rows.extend_from_slice(table.row(shard.map.local_index(*t, g)));
            }
            let f = encode_rows(*t, layout(), part.iter().copied(), &rows).unwrap();
            let path = format!("s{:04}/t{:04}-{n:06}.rows", shard.server.0, t.0);
            ckpts.put_file(id, &path, &f).await.unwrap();
            files.push(FileInfo {
                path,
                size: f.size(),
                crc32c: f.checksums,
                content: FileContent::Rows {
                    server: shard.server,
                    table: *t,
                    rows: part.len() as u64,
                    first_row: part[0],
                    last_row: *part.last().unwrap(),
                },
            });
        }
        tables.push(TableInfo {
            table: *t,
            rows: ids.len() as u64,
            layout: layout(),
        });
    }
    let (first, v, st, spb) = shard.dense.as_ref().unwrap();
    let f = encode_dense(*first, v, st, *spb).unwrap();
    let path = format!("s{:04}/dense-000000.dense", shard.server.0);
    ckpts.put_file(id, &path, &f).await.unwrap();
    let blocks = v.len().div_ceil(ftrec_core::DENSE_BLOCK) as u64;
    files.push(FileInfo {
        path,
        size: f.size(),
        crc32c: f.checksums,
        content: FileContent::Dense {
            server: shard.server,
            first_block: *first,
            blocks,
        },
    });
    ShardReport {
        shard: ShardInfo {
            server: shard.server,
            tables,
            dense: Some(crate::format::DenseInfo {
                first_block: *first,
                blocks,
                values: v.len() as u64,
                state_per_block: *spb as u32,
            }),
        },
        bytes: files.iter().map(|f| f.size).sum(),
        files,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Update(usize),
    Checkpoint,
    Reset,
    RestoreNewest,
    RestoreOlder(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..40).prop_map(Op::Update),
        4 => Just(Op::Checkpoint),
        1 => Just(Op::Reset),
        1 => Just(Op::RestoreNewest),
        1 => (0usize..100).prop_map(Op::RestoreOlder),
    ]
}

struct Run {
    ckpts: Checkpoints,
    spec: PieceSpec,
    chunk_rows: usize,
    model: Model,
    chains: Vec<ServerChain>,
    /// Committed checkpoints and the model they hold.
    committed: Vec<(CheckpointId, Vec<Bits>)>,
    base: Option<CheckpointId>,
    prev: Option<CheckpointId>,
    step: u64,
}

impl Run {
    async fn full(&mut self) {
        self.step += 1;
        let id = CheckpointId::new(format!("{:05}-full", self.step)).unwrap();
        let reports = write_mem_shards(&self.ckpts, &id, &self.model.shards, 1024)
            .await
            .unwrap();
        for (c, r) in self.chains.iter_mut().zip(&reports) {
            c.set_base(id.clone(), r);
        }
        let m = full_manifest(id.clone(), self.step, DataPosition::None, reports);
        self.ckpts.commit(&m).await.unwrap();
        for t in &mut self.model.tracked {
            t.clear();
        }
        self.committed.push((id.clone(), self.model.snapshot()));
        self.base = Some(id.clone());
        self.prev = Some(id);
    }

    async fn piece(&mut self) {
        if self.base.is_none() {
            return self.full().await;
        }
        self.step += 1;
        let id = CheckpointId::new(format!("{:05}-piece", self.step)).unwrap();
        let mut reports = Vec::new();
        for s in 0..self.chains.len() {
            let tracked: Vec<(TableId, Vec<RowId>)> = self.model.tracked[s]
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(t, v)| (TableId(*t), v.iter().copied().collect()))
                .collect();
            let mut rep = write_piece_files(
                &self.ckpts,
                &id,
                &self.model.shards[s],
                &tracked,
                self.chunk_rows,
            )
            .await;
            let done = self.chains[s]
                .finish_piece(&self.ckpts, &id, &self.spec, &tracked, &rep, 0.0)
                .await
                .unwrap();
            rep.bytes += done.files.iter().map(|f| f.size).sum::<u64>();
            rep.files.extend(done.files);
            reports.push(rep);
        }
        let parent = if self.spec.since_base() {
            self.base.clone()
        } else {
            self.prev.clone()
        };
        let m = deck::shard_manifest(
            id.clone(),
            CheckpointKind::Delta,
            self.step,
            parent,
            DataPosition::None,
            reports,
        );
        self.ckpts.commit(&m).await.unwrap();
        if !self.spec.since_base() {
            for t in &mut self.model.tracked {
                t.clear();
            }
        }
        self.committed.push((id.clone(), self.model.snapshot()));
        self.prev = Some(id);
    }

    /// Restore checkpoint `i` of `committed` into fresh shards and compare; with `adopt`, the
    /// restored state becomes the live one (a recovery) and training continues from it.
    async fn restore(&mut self, i: usize, adopt: bool) {
        let (id, want) = self.committed[i].clone();
        let chain = select(&self.ckpts, &RestoreAt::Id(id.clone()))
            .await
            .unwrap();
        if chain.scheme == Some(PieceScheme::ChunkList) && chain.target > 0 {
            // The indexes after the target give the rectangle folding every index gives.
            for s in 0..self.chains.len() {
                let server = ServerId(s as u32);
                let full = super::restore::fold_list(&self.ckpts, &chain, server)
                    .await
                    .unwrap();
                let part = rectangle_list(&self.ckpts, &chain, server).await.unwrap();
                assert_eq!(
                    rectangle_key(&part, chain.target),
                    rectangle_key(&full, chain.target),
                    "server {s}: rectangle of {id}"
                );
            }
        }
        let mut shards = Vec::new();
        for (s, c) in self.chains.iter_mut().enumerate() {
            let info = chain.base.shard(ServerId(s as u32)).unwrap().clone();
            let mut target = MemShard::of(&info, self.model.map);
            let out = if adopt {
                c.restore(&self.ckpts, &chain, &mut target).await.unwrap()
            } else {
                // A chunk list's rectangle streamed (a column per row decides which copy wins)
                // and read whole (written newest column first) each give the saved model, also
                // with every part read in a span of its own (a file's spans then arrive in
                // any order).
                for (in_memory_bytes, read_span_bytes, how) in [
                    (0, READ_SPAN_BYTES, "streamed"),
                    (0, 1, "streamed, a span a part,"),
                    (IN_MEMORY_RECTANGLE_BYTES, READ_SPAN_BYTES, "whole"),
                    (IN_MEMORY_RECTANGLE_BYTES, 1, "whole, a span a part,"),
                ] {
                    let mut other = MemShard::of(&info, self.model.map);
                    let opts = RestoreOptions {
                        in_memory_bytes,
                        stream_map_bytes: 0,
                        read_span_bytes,
                    };
                    restore_server_with(&self.ckpts, &chain, &mut other, opts)
                        .await
                        .unwrap();
                    assert_eq!(
                        bits_of(&other),
                        want[s],
                        "server {s}: {how} restore of {id} differs from the model saved in it"
                    );
                }
                restore_server(&self.ckpts, &chain, &mut target)
                    .await
                    .unwrap()
            };
            assert_eq!(
                bits_of(&target),
                want[s],
                "server {s}: restore of {id} differs from the model saved in it"
            );
            if adopt {
                // Differentials continue from the rows the restored one holds.
                self.model.tracked[s].clear();
                if let Some(ids) = out.since_base {
                    for (t, v) in ids {
                        self.model.tracked[s].entry(t.0).or_default().extend(v);
                    }
                }
            }
            shards.push(target);
        }
        if adopt {
            self.model.shards = shards;
            // Later checkpoints are abandoned (a recovery rewinds to this one).
            self.committed.truncate(i + 1);
            self.prev = Some(id.clone());
            self.base = Some(chain.base.id.clone());
            if chain.scheme.is_some() && self.chains.iter().any(|c| c.base().is_none()) {
                self.base = None;
            }
        }
    }
}

/// A rectangle as comparable data: each chunk's place and rows, and its parts with the files
/// they name.
#[allow(clippy::type_complexity)]
fn rectangle_key(
    list: &ChunkList,
    col: u32,
) -> Vec<(
    u32,
    u32,
    u32,
    u32,
    u64,
    Vec<(String, String, u32, u64, u64)>,
)> {
    let mut v: Vec<_> = list
        .rectangle(col)
        .into_iter()
        .map(|c| {
            let parts = c
                .parts
                .iter()
                .map(|p| {
                    let f = &list.file(p.file).file;
                    (f.ckpt.to_string(), f.path.clone(), p.section, p.lo, p.hi)
                })
                .collect();
            (c.table, c.range, c.col, c.round, c.rows, parts)
        })
        .collect();
    v.sort();
    v
}

fn check(
    servers: u32,
    spec: PieceSpec,
    chunk_rows: usize,
    seed: u64,
    ops: Vec<Op>,
) -> std::result::Result<(), TestCaseError> {
    block_on(async {
        let model = Model::new(servers, seed);
        let chains = (0..servers)
            .map(|s| ServerChain::new(ServerId(s), model.map))
            .collect();
        let mut run = Run {
            ckpts: Checkpoints::new(Arc::new(MemoryStore::new())),
            spec,
            chunk_rows,
            model,
            chains,
            committed: Vec::new(),
            base: None,
            prev: None,
            step: 0,
        };
        for op in ops {
            match op {
                Op::Update(n) => run.model.update(n),
                Op::Checkpoint => run.piece().await,
                Op::Reset => run.full().await,
                Op::RestoreNewest if !run.committed.is_empty() => {
                    let i = run.committed.len() - 1;
                    run.restore(i, true).await;
                }
                Op::RestoreOlder(k) if !run.committed.is_empty() => {
                    let i = k % run.committed.len();
                    run.restore(i, false).await;
                }
                _ => {}
            }
        }
        // Every committed state is still restorable, after garbage collection too.
        let gc = remove_dead_files(&run.ckpts).await.unwrap();
        for i in 0..run.committed.len() {
            run.restore(i, false).await;
        }
        for v in verify(&run.ckpts).await.unwrap() {
            prop_assert!(v.problem.is_none(), "{v:?}");
        }
        if spec.scheme != PieceScheme::ChunkList {
            prop_assert!(gc.dead_files.is_empty());
        }
        Ok(())
    })
}

fn spec_strategy() -> impl Strategy<Value = PieceSpec> {
    let list = (
        prop_oneof![Just(0.0), Just(0.02), Just(0.3), Just(1.0)],
        prop_oneof![Just(0u64), Just(3), Just(16)],
        any::<bool>(),
        any::<(bool, bool, bool)>(),
        prop_oneof![Just(0.0), Just(0.5), Just(0.95)],
    )
        .prop_map(|(r, range_rows, concat, (a, b, c), compact)| PieceSpec {
            scheme: PieceScheme::ChunkList,
            quant: None,
            extract: ExtractConfig {
                threshold: r,
                range_rows,
                concat,
                filters: Filters {
                    range: a,
                    bloom: b,
                    actual: c,
                },
                bundle_bytes: 1024,
                bloom_bits_per_key: 4,
                compact_below: compact,
            },
        });
    prop_oneof![
        2 => list,
        1 => Just(PieceSpec::incremental()),
        1 => Just(PieceSpec::differential(None)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// IncrCP §4.2 with selective extraction (§4.3) and concatenation (§4.4), and both
    /// baselines: every restore equals the live state it saved, bit for bit.
    #[test]
    fn newest_wins_for_every_restore(
        servers in 1u32..=3,
        spec in spec_strategy(),
        chunk_rows in prop_oneof![Just(2usize), Just(7), Just(1000)],
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        check(servers, spec, chunk_rows, seed, ops)?;
    }
}

/// A long list with every extraction on (R = 0): restoring the newest reads row 0 only, and
/// reads fewer bytes than the pieces add up to (IncrCP §4.2's point). The newest column's own
/// round runs after its commit and is committed by the next piece, so only the newest state
/// may read a row twice (an older copy its column saved again); every older state reads each
/// row once.
#[test]
fn full_extraction_restores_the_newest_from_row_0_only() {
    block_on(async {
        let model = Model::new(1, 5);
        let spec = PieceSpec::chunk_list(0.0);
        let mut run = Run {
            ckpts: Checkpoints::new(Arc::new(MemoryStore::new())),
            spec,
            chunk_rows: 1000,
            chains: vec![ServerChain::new(ServerId(0), model.map)],
            model,
            committed: Vec::new(),
            base: None,
            prev: None,
            step: 0,
        };
        run.full().await;
        let mut newest_rows = 0;
        for _ in 0..12 {
            run.model.update(60);
            newest_rows = run.model.tracked[0].values().map(|t| t.len() as u64).sum();
            run.piece().await;
        }
        let list = run.chains[0].list().unwrap();
        assert_eq!(list.len(), 12);
        let chain = select(&run.ckpts, &RestoreAt::Current).await.unwrap();
        let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
        let out = restore_server(&run.ckpts, &chain, &mut target)
            .await
            .unwrap();
        let rect = list.rectangle(12);
        assert!(
            rect.iter().all(|c| c.round == 0),
            "the newest state reads row 0 only"
        );
        // Only rows column 12 saved again are read twice (its round is not committed yet).
        let in_row0: u64 = rect.iter().map(|c| c.rows).sum();
        assert!(out.rows_written <= in_row0);
        assert!(
            in_row0 - out.rows_written <= newest_rows,
            "{in_row0} rows read, {} written, column 12 saved {newest_rows}",
            out.rows_written
        );
        let saved: u64 = chain
            .pieces
            .iter()
            .flat_map(|m| m.files.iter())
            .map(|f| match f.content {
                FileContent::Rows { rows, .. } => rows,
                _ => 0,
            })
            .sum();
        assert!(
            in_row0 < saved,
            "row 0 holds {in_row0} rows, the pieces saved {saved}"
        );
        assert_eq!(bits_of(&target), run.committed.last().unwrap().1[0]);
        // Every older state: each row of its rectangle once.
        for col in 1..12u32 {
            let chain = select(
                &run.ckpts,
                &RestoreAt::Id(run.committed[col as usize].0.clone()),
            )
            .await
            .unwrap();
            let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
            let out = restore_server(&run.ckpts, &chain, &mut target)
                .await
                .unwrap();
            let in_rect: u64 = list.rectangle(col).iter().map(|c| c.rows).sum();
            assert_eq!(out.rows_written, in_rect, "column {col}: a row read twice");
            assert_eq!(bits_of(&target), run.committed[col as usize].1[0]);
        }
    });
}

/// The server path: pieces written through the staging pipeline (several files per table),
/// a chunk list exact and a quantized differential within its reported error, and a restore
/// written out as one full checkpoint.
#[test]
fn pieces_through_staging_quantized_and_exact() {
    use crate::deck::staging::{self, MemGauge, RowSelection, Source, SourceTable, StagingOptions};
    use crate::snapshot::RowIds;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (spec, exact) in [
        (PieceSpec::chunk_list(0.02), true),
        (PieceSpec::differential(Some(QuantBits::Eight)), false),
        (PieceSpec::differential(Some(QuantBits::Four)), false),
    ] {
        let mut model = Model::new(1, 9);
        model.shards[0].dense = None;
        let ckpts = Checkpoints::new(Arc::new(MemoryStore::new()));
        let base = CheckpointId::new("base").unwrap();
        let reports = rt
            .block_on(write_mem_shards(&ckpts, &base, &model.shards, 1024))
            .unwrap();
        let mut chain = ServerChain::new(ServerId(0), model.map);
        chain.set_base(base.clone(), &reports[0]);
        rt.block_on(ckpts.commit(&full_manifest(base.clone(), 0, DataPosition::None, reports)))
            .unwrap();
        let mut parent = base.clone();
        let mut max_err = 0f32;
        let mut multi = false;
        for k in 1..=4u64 {
            model.update(600);
            let tracked: Vec<(TableId, Vec<RowId>)> = model.tracked[0]
                .iter()
                .map(|(t, v)| (TableId(*t), v.iter().copied().collect()))
                .collect();
            let id = CheckpointId::new(format!("p{k}")).unwrap();
            let opts = StagingOptions {
                chunk_bytes: 1024,
                staging_dir: dir.path().to_path_buf(),
                limit_bytes: None,
            };
            let (sink, upload) = staging::start(
                ckpts.clone(),
                id.clone(),
                ServerId(0),
                &opts,
                MemGauge::new(),
                rt.handle(),
            )
            .unwrap();
            let shard = &model.shards[0];
            let src = Source {
                server: ServerId(0),
                tables: shard
                    .tables
                    .iter()
                    .map(|t| SourceTable {
                        table: t.id,
                        layout: t.layout(),
                        data: t.as_slice(),
                        ids: RowIds::Sharded {
                            map: model.map,
                            server: ServerId(0),
                        },
                        rows: RowSelection::Only(
                            tracked
                                .iter()
                                .find(|(x, _)| *x == t.id)
                                .map_or(&[][..], |(_, v)| v.as_slice()),
                        ),
                    })
                    .collect(),
                dense: None,
            };
            sink.quantized(spec.quant).copy_out(&src).unwrap();
            let progress = upload.progress().clone();
            let mut rep = rt.block_on(upload.wait()).unwrap();
            multi |= rep.files.len() > tracked.len();
            let err = progress.quant_max_abs_error();
            assert_eq!(err > 0.0, !exact);
            max_err = max_err.max(err);
            let done = rt
                .block_on(chain.finish_piece(&ckpts, &id, &spec, &tracked, &rep, err))
                .unwrap();
            assert_eq!(done.index.quant_max_abs_error, err);
            rep.files.extend(done.files);
            let m = deck::shard_manifest(
                id.clone(),
                CheckpointKind::Delta,
                k,
                Some(if spec.since_base() {
                    base.clone()
                } else {
                    parent.clone()
                }),
                DataPosition::None,
                vec![rep],
            );
            rt.block_on(ckpts.commit(&m)).unwrap();
            if !spec.since_base() {
                model.tracked[0].clear();
            }
            parent = id;
        }
        assert!(multi, "small chunks: several files for some table");
        let sel = rt.block_on(select(&ckpts, &RestoreAt::Current)).unwrap();
        assert_eq!(sel.target, 4);
        let mut target = MemShard::of(&sel.base.shards[0], model.map);
        rt.block_on(restore_server(&ckpts, &sel, &mut target))
            .unwrap();
        for (t, live) in target.tables.iter().zip(&model.shards[0].tables) {
            for (l, (a, b)) in t
                .as_slice()
                .chunks(3)
                .zip(live.as_slice().chunks(3))
                .enumerate()
            {
                if exact {
                    assert_eq!(a, b, "table {} row {l}", t.id.0);
                } else {
                    for k in 0..2 {
                        assert!((a[k] - b[k]).abs() <= max_err, "{} vs {}", a[k], b[k]);
                    }
                    // Optimizer state is saved exactly.
                    assert_eq!(a[2].to_bits(), b[2].to_bits());
                }
            }
        }
        // The same state as one full checkpoint in another store.
        let dst = Checkpoints::new(Arc::new(MemoryStore::new()));
        let full = rt
            .block_on(materialize_full(&ckpts, &sel, &dst, 2048))
            .unwrap();
        assert_eq!(full.kind, CheckpointKind::Full);
        let again = rt.block_on(select(&dst, &RestoreAt::Current)).unwrap();
        let mut back = MemShard::of(&again.base.shards[0], model.map);
        rt.block_on(restore_server(&dst, &again, &mut back))
            .unwrap();
        assert_eq!(bits_of(&back), bits_of(&target));
    }
}

/// A flipped byte in a chunk part, or a truncated file, fails the restore with an error naming
/// the file; bytes outside every live part are never read, so damage there goes unnoticed by a
/// restore (and `verify`, which reads whole files, names it).
#[test]
fn damaged_chunk_files_are_errors_naming_them() {
    use crate::store::PutMode;
    block_on(async {
        let model = Model::new(1, 11);
        let mut run = Run {
            ckpts: Checkpoints::new(Arc::new(MemoryStore::new())),
            spec: PieceSpec::chunk_list(0.0),
            chunk_rows: 1000,
            chains: vec![ServerChain::new(ServerId(0), model.map)],
            model,
            committed: Vec::new(),
            base: None,
            prev: None,
            step: 0,
        };
        run.full().await;
        for _ in 0..6 {
            run.model.update(60);
            run.piece().await;
        }
        let list = run.chains[0].list().unwrap().clone();
        // A live part of the newest state, in a file of an extraction round or a piece.
        let c = list.rectangle(list.len())[0];
        let p = c.parts[0];
        let f = list.file(p.file).file.clone();
        let key = run.ckpts.file_key(&f.ckpt, &f.path).unwrap();
        let good = run.ckpts.store().get(&key).await.unwrap();
        let chain = select(&run.ckpts, &RestoreAt::Current).await.unwrap();
        for damage in [0usize, 1] {
            let mut bad = good.to_vec();
            if damage == 0 {
                bad[p.rows_at as usize] ^= 0x40;
            } else {
                bad.truncate(p.rows_at as usize);
            }
            run.ckpts
                .store()
                .put(&key, bad.into(), PutMode::Overwrite)
                .await
                .unwrap();
            let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
            let e = restore_server(&run.ckpts, &chain, &mut target)
                .await
                .unwrap_err();
            let named = e.file() == Some(key.as_str())
                || matches!(&e, CkptError::InvalidRange { key: k, .. } if k == key.as_str());
            assert!(named, "damage {damage}: {e}");
            let v = verify(&run.ckpts).await.unwrap();
            assert!(
                v.iter()
                    .any(|v| v.problem.as_deref().is_some_and(|m| m.contains(&f.path))),
                "verify names {}: {v:?}",
                f.path
            );
        }
    });
}

impl Model {
    /// Update rows `rows` of `table` (one server: global ids are local ones) and track them.
    fn touch(&mut self, table: u32, rows: impl IntoIterator<Item = RowId>) {
        assert_eq!(self.shards.len(), 1, "touch is for one server");
        for row in rows {
            let r = self.shards[0].tables[table as usize].row_mut(row);
            r[0] += 0.25;
            r[2] += 1.0;
            self.tracked[0].entry(table).or_default().insert(row);
        }
    }
}

/// One server's chunk-list run under `spec`.
fn one_server_run(spec: PieceSpec) -> Run {
    let model = Model::new(1, 9);
    Run {
        ckpts: Checkpoints::new(Arc::new(MemoryStore::new())),
        spec,
        chunk_rows: 1000,
        chains: vec![ServerChain::new(ServerId(0), model.map)],
        model,
        committed: Vec::new(),
        base: None,
        prev: None,
        step: 0,
    }
}

impl Run {
    /// Run the extraction round of the piece just committed (off its commit path, as a
    /// server does in the background) and return what it did; the next piece commits it.
    async fn round_stats(&mut self) -> crate::format::ExtractStats {
        self.chains[0]
            .extract(&self.ckpts)
            .await
            .unwrap()
            .expect("a round to run")
    }

    /// [`Run::round_stats`] for any scheme (only a chunk list has rounds).
    async fn round_stats_if_any(&mut self) -> crate::format::ExtractStats {
        self.chains[0]
            .extract(&self.ckpts)
            .await
            .unwrap()
            .unwrap_or_default()
    }

    /// The extraction statistics the piece just committed carries (those of the round of the
    /// piece before it).
    async fn last_stats(&self) -> crate::format::ExtractStats {
        let m = self
            .ckpts
            .read_manifest(self.prev.as_ref().unwrap(), None)
            .await
            .unwrap();
        piece_summaries(&self.ckpts, &m).await.unwrap()[0].stats
    }

    /// Every committed checkpoint restores bit for bit (the check inside `restore`).
    async fn restore_all_committed(&mut self) {
        for i in 0..self.committed.len() {
            self.restore(i, false).await;
        }
    }
}

/// The workload of IncrCP §4.3's argument, on table 2 (130 rows): column 1 saves rows 0..50;
/// column 2 rows 60..120 (no key overlap with column 1); column 3 rows 45..50 and 121..130 (a
/// tenth of column 1's rows again, none of column 2's); column 4 rows 0..50 again (all of
/// column 1's). Writes the full, then pieces `from..to` of the four; returns the statistics of
/// each piece's round (run after the piece's commit; the next piece commits it).
async fn section_4_3_pieces(
    run: &mut Run,
    pieces: std::ops::Range<usize>,
) -> Vec<crate::format::ExtractStats> {
    if run.base.is_none() {
        run.full().await;
    }
    let all: [Vec<RowId>; 4] = [
        (0..50).collect(),
        (60..120).collect(),
        (45..50).chain(121..130).collect(),
        (0..50).collect(),
    ];
    let mut stats = Vec::new();
    for rows in &all[pieces] {
        run.model.touch(2, rows.iter().copied());
        run.piece().await;
        let round = run.round_stats_if_any().await;
        stats.push(round);
    }
    stats
}

async fn section_4_3_workload(run: &mut Run) -> Vec<crate::format::ExtractStats> {
    section_4_3_pieces(run, 0..4).await
}

/// IncrCP §4.3 at R = 0.3, every filter on: the index range check skips a column whose keys
/// do not overlap (column 2 against column 1); the Bloom filter skips a comparison whose
/// duplicate share is at or below R (column 3 duplicates a tenth of column 1 and nothing of
/// column 2), so those superseded rows stay in row 0 and a restore reads them and writes them
/// not; a share above R is extracted (column 4 against column 1). Every checkpoint restores
/// bit for bit.
#[test]
fn selective_extraction_skips_small_duplicate_shares() {
    block_on(async {
        let mut run = one_server_run(PieceSpec::chunk_list(0.3));
        let mut st = section_4_3_pieces(&mut run, 0..3).await;
        // Restoring column 3: the rectangle holds rows 45..50 twice (columns 1 and 3, the
        // skipped extraction); each is written once, from column 3.
        let chain = select(&run.ckpts, &RestoreAt::Current).await.unwrap();
        let list = run.chains[0].list().unwrap();
        let in_rect: u64 = list.rectangle(3).iter().map(|c| c.rows).sum();
        let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
        let out = restore_server(&run.ckpts, &chain, &mut target)
            .await
            .unwrap();
        assert_eq!(in_rect, 50 + 60 + 14, "the skipped rows stay in row 0");
        assert_eq!(out.rows_written, in_rect - 5, "each row written once");
        assert_eq!(bits_of(&target), run.committed[3].1[0]);
        st.extend(section_4_3_pieces(&mut run, 3..4).await);
        // Column 2 against column 1: key ranges [60, 119] and [0, 49].
        assert_eq!((st[1].compared, st[1].range_skips), (1, 1), "{:?}", st[1]);
        assert_eq!(st[1].extracted, 0, "{:?}", st[1]);
        // Column 3 against columns 1 and 2: ranges overlap, shares 5/50 and 0/60 <= 0.3.
        assert_eq!(st[2].compared, 2, "{:?}", st[2]);
        assert_eq!(st[2].range_skips, 0, "{:?}", st[2]);
        assert_eq!(st[2].bloom_skips, 2, "{:?}", st[2]);
        assert_eq!(
            (st[2].extracted, st[2].rows_extracted),
            (0, 0),
            "{:?}",
            st[2]
        );
        // Column 4 against column 1: all 50 rows again, extracted; column 3's remainder of
        // rows 45..50 left in row 0 overlaps and is 5 of 14 rows (0.36 > 0.3): extracted too.
        assert!(st[3].extracted >= 1, "{:?}", st[3]);
        assert!(st[3].rows_extracted >= 50, "{:?}", st[3]);
        run.restore_all_committed().await;
    });
}

/// The third stage alone (Bloom filter off): column 3's comparison with column 1 is loaded
/// and dropped by the actual count (5 of 50 rows <= R), and the one with column 2 too (0 of
/// 60).
#[test]
fn the_actual_count_skips_what_the_bloom_filter_would_have() {
    block_on(async {
        let mut spec = PieceSpec::chunk_list(0.3);
        spec.extract.filters.bloom = false;
        let mut run = one_server_run(spec);
        let st = section_4_3_workload(&mut run).await;
        assert_eq!(st[2].bloom_skips, 0, "{:?}", st[2]);
        assert_eq!(st[2].actual_skips, 2, "{:?}", st[2]);
        assert_eq!(st[2].extracted, 0, "{:?}", st[2]);
        assert!(
            st[2].files_read >= 1,
            "stage 3 loads the chunks: {:?}",
            st[2]
        );
        run.restore_all_committed().await;
    });
}

/// R = 0 is the paper's full extraction (§5.3.1): no duplicate is left in row 0, whatever its
/// share (only key ranges that cannot overlap are skipped); every row of every rectangle is
/// written exactly once. R = 1 is the other end: nothing is ever extracted, and the list is row
/// 0 alone. Both restore every checkpoint bit for bit.
#[test]
fn r_zero_skips_no_duplicate_and_r_one_extracts_nothing() {
    block_on(async {
        let mut run = one_server_run(PieceSpec::chunk_list(0.0));
        let st = section_4_3_workload(&mut run).await;
        // A fifth piece commits column 4's round (and carries its statistics).
        run.model.touch(0, [0]);
        run.piece().await;
        assert_eq!(run.last_stats().await, st[3]);
        // Column 3 duplicates 5 of column 1's 50 rows: extracted all the same; its comparison
        // with column 2 (no duplicate at all) is the only one skipped.
        assert_eq!(st[2].actual_skips, 0, "{:?}", st[2]);
        assert_eq!(
            (st[2].extracted, st[2].rows_extracted),
            (1, 5),
            "{:?}",
            st[2]
        );
        assert_eq!(st[3].actual_skips, 0, "{:?}", st[3]);
        for col in 1..=4u32 {
            let chain = select(
                &run.ckpts,
                &RestoreAt::Id(run.committed[col as usize].0.clone()),
            )
            .await
            .unwrap();
            let list = super::restore::fold_list(&run.ckpts, &chain, ServerId(0))
                .await
                .unwrap();
            let in_rect: u64 = list.rectangle(col).iter().map(|c| c.rows).sum();
            let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
            let out = restore_server(&run.ckpts, &chain, &mut target)
                .await
                .unwrap();
            assert_eq!(out.rows_written, in_rect, "column {col}: a row read twice");
        }
        run.restore_all_committed().await;

        let mut run = one_server_run(PieceSpec::chunk_list(1.0));
        let st = section_4_3_workload(&mut run).await;
        for (i, s) in st.iter().enumerate() {
            assert_eq!(s.extracted, 0, "piece {}: {s:?}", i + 1);
        }
        assert!(st[3].bloom_skips >= 1, "{:?}", st[3]);
        let list = run.chains[0].list().unwrap();
        assert!(list.row0_chunks().count() >= 4);
        assert_eq!(list.shape().1, 0, "no chunk below row 0");
        run.restore_all_committed().await;
    });
}

/// A damaged extraction bundle takes down exactly the states whose rectangles read it:
/// `damage` names the file and those states, and `select_intact` falls back past them only, to
/// the newest state that reads no damaged file, which restores bit for bit. For naive
/// incremental a damaged piece takes down it and every later state; Check-N-Run, the one
/// differential.
#[test]
fn a_damaged_file_takes_down_the_states_that_read_it_and_restores_fall_back() {
    use crate::store::PutMode;
    block_on(async {
        // IncrCP, full extraction: column 4's round extracts rows 0..50 of columns 1 and 3
        // into a bundle of round 4, which the rectangles of columns 1 to 3 read, not 4's; a
        // fifth piece commits that round (it runs after column 4's commit), and the bundle,
        // under column 4's checkpoint, is named by the fifth piece's index, not by a manifest.
        let mut run = one_server_run(PieceSpec::chunk_list(0.0));
        section_4_3_workload(&mut run).await;
        run.model.touch(0, [0]);
        run.piece().await;
        let list = run.chains[0].list().unwrap().clone();
        let deep = list
            .rectangle(1)
            .into_iter()
            .find(|c| c.round == 4)
            .expect("column 1's rows extracted in round 4");
        let f = list.file(deep.parts[0].file).file.clone();
        assert_eq!(f.ckpt, run.committed[4].0);
        let m4 = run.ckpts.read_manifest(&f.ckpt, None).await.unwrap();
        assert!(m4.files.iter().all(|x| x.path != f.path));
        let key = run.ckpts.file_key(&f.ckpt, &f.path).unwrap();
        let mut bad = run.ckpts.store().get(&key).await.unwrap().to_vec();
        let at = deep.parts[0].rows_at as usize;
        bad[at] ^= 0x40;
        run.ckpts
            .store()
            .put(&key, bad.into(), PutMode::Overwrite)
            .await
            .unwrap();
        let (found, unreadable) = damage(&run.ckpts).await.unwrap();
        assert!(unreadable.is_empty(), "{unreadable:?}");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].file, key.to_string());
        let ids = |cols: &[usize]| -> Vec<CheckpointId> {
            cols.iter().map(|&c| run.committed[c].0.clone()).collect()
        };
        assert_eq!(found[0].states, ids(&[3, 2, 1]), "{found:?}");
        // The newest state does not read the bundle: nothing to fall back from.
        let (chain, skipped) = select_intact(&run.ckpts, &RestoreAt::Current)
            .await
            .unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(chain.target, 5);
        // Column 3 does: the restore falls back past 3, 2 and 1 to the base, and says why.
        let at3 = RestoreAt::Id(run.committed[3].0.clone());
        let (chain, skipped) = select_intact(&run.ckpts, &at3).await.unwrap();
        assert_eq!(
            skipped.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
            ids(&[3, 2, 1])
        );
        assert!(
            skipped.iter().all(|(_, why)| why.contains(&f.path)),
            "{skipped:?}"
        );
        assert_eq!(chain.target, 0);
        let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
        restore_server(&run.ckpts, &chain, &mut target)
            .await
            .unwrap();
        assert_eq!(bits_of(&target), run.committed[0].1[0]);

        // Naive incremental: piece 2's row file takes down states 2, 3 and 4.
        for (spec, down) in [
            (PieceSpec::incremental(), vec![4, 3, 2]),
            (PieceSpec::differential(None), vec![2]),
        ] {
            let mut run = one_server_run(spec);
            section_4_3_workload(&mut run).await;
            let m = run
                .ckpts
                .read_manifest(&run.committed[2].0, None)
                .await
                .unwrap();
            let f = m
                .files
                .iter()
                .find(|f| matches!(f.content, FileContent::Rows { .. }))
                .unwrap();
            let key = run.ckpts.file_key(&m.id, &f.path).unwrap();
            run.ckpts.store().delete(&key).await.unwrap();
            let (found, _) = damage(&run.ckpts).await.unwrap();
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].states, ids_of(&run, &down), "{:?}", spec.scheme);
            let (chain, _) = select_intact(&run.ckpts, &RestoreAt::Current)
                .await
                .unwrap();
            let newest_intact = if down.contains(&4) { 1 } else { 4 };
            assert_eq!(
                chain.target_manifest().id,
                run.committed[newest_intact].0,
                "{:?}",
                spec.scheme
            );
            let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
            restore_server(&run.ckpts, &chain, &mut target)
                .await
                .unwrap();
            assert_eq!(bits_of(&target), run.committed[newest_intact].1[0]);
        }
    });
}

fn ids_of(run: &Run, cols: &[usize]) -> Vec<CheckpointId> {
    cols.iter().map(|&c| run.committed[c].0.clone()).collect()
}

/// Run a test body on a current-thread runtime.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// A hook that holds an extraction round after the first file it writes: `reached` gets that
/// file's path, and the round goes on once `go` is sent (or never, if it is dropped).
fn hold_after_first_file() -> (
    RoundHook,
    tokio::sync::oneshot::Receiver<String>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (reached_tx, reached_rx) = tokio::sync::oneshot::channel::<String>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let reached = Arc::new(std::sync::Mutex::new(Some(reached_tx)));
    let go = Arc::new(tokio::sync::Mutex::new(Some(go_rx)));
    let hook: RoundHook = Arc::new(move |path: &str| {
        let (reached, go, path) = (reached.clone(), go.clone(), path.to_string());
        Box::pin(async move {
            let first = reached.lock().unwrap().take();
            if let Some(tx) = first {
                let _ = tx.send(path);
                if let Some(rx) = go.lock().await.take() {
                    let _ = rx.await;
                }
            }
        })
    });
    (hook, reached_rx, go_tx)
}

/// A full and `pieces` pieces at R = 0 with small bundles (a round writes several files),
/// each piece's round run after its commit except the last one's.
async fn background_run(pieces: usize) -> Run {
    let mut spec = PieceSpec::chunk_list(0.0);
    spec.extract.bundle_bytes = 1024;
    let mut run = one_server_run(spec);
    run.full().await;
    for i in 0..pieces {
        run.model.update(60);
        run.piece().await;
        if i + 1 < pieces {
            run.round_stats().await;
        }
    }
    assert!(run.chains[0].round_pending());
    run
}

/// Restore committed checkpoint `i` of `run` and return the rows its rectangle holds and the
/// rows the restore wrote (the restore itself is checked bit for bit by `Run::restore`).
async fn rows_read_and_written(run: &mut Run, i: usize) -> (u64, u64) {
    run.restore(i, false).await;
    let chain = select(&run.ckpts, &RestoreAt::Id(run.committed[i].0.clone()))
        .await
        .unwrap();
    let list = super::restore::fold_list(&run.ckpts, &chain, ServerId(0))
        .await
        .unwrap();
    let in_rect: u64 = list.rectangle(chain.target).iter().map(|c| c.rows).sum();
    let mut target = MemShard::of(&chain.base.shards[0], run.model.map);
    let out = restore_server(&run.ckpts, &chain, &mut target)
        .await
        .unwrap();
    (in_rect, out.rows_written)
}

/// IncrCP §4.3: the extraction round of a piece runs after the piece is committed, off the
/// commit path, and the next piece commits it. Held mid-way by a hook (one of its files
/// written, more to come), every committed checkpoint restores bit for bit: a restore reads the
/// list as committed, in which that round has not happened (the newest state reads the rows
/// its column saved again twice, and writes the newest copy). Let go, the round finishes; every
/// checkpoint still restores bit for bit; once the next piece commits the round, the newest
/// state of before reads each row once, and every checkpoint restores bit for bit again.
#[test]
fn restores_during_background_extraction_read_a_consistent_list() {
    block_on(async {
        let mut run = background_run(6).await;
        let newest = run.committed.len() - 1;
        let (hook, reached, go) = hold_after_first_file();
        let mut chain = std::mem::replace(
            &mut run.chains[0],
            ServerChain::new(ServerId(0), run.model.map),
        );
        chain.set_round_hook(Some(hook));
        let ckpts = run.ckpts.clone();
        let task = tokio::spawn(async move {
            let r = chain.extract(&ckpts).await;
            (chain, r)
        });
        // Held after its first file: the file is in the store, under the newest piece, and no
        // index names it.
        let first = reached.await.unwrap();
        let key = run
            .ckpts
            .file_key(&run.committed[newest].0, &first)
            .unwrap();
        run.ckpts.store().head(&key).await.unwrap();
        run.restore_all_committed().await;
        let (read, written) = rows_read_and_written(&mut run, newest).await;
        for v in verify(&run.ckpts).await.unwrap() {
            assert!(v.problem.is_none(), "{v:?}");
        }
        go.send(()).unwrap();
        let (mut chain, done) = task.await.unwrap();
        let stats = done.unwrap().expect("the round ran");
        assert!(
            stats.files_written >= 2,
            "held mid-way: the round wrote more after the hold ({stats:?})"
        );
        assert!(stats.extracted >= 1, "{stats:?}");
        chain.set_round_hook(None);
        run.chains[0] = chain;
        // Finished, not yet committed: nothing a restore reads has changed.
        run.restore_all_committed().await;
        assert_eq!(
            rows_read_and_written(&mut run, newest).await,
            (read, written)
        );
        // The next piece commits the round (and carries its statistics).
        run.model.update(60);
        run.piece().await;
        assert_eq!(run.last_stats().await, stats);
        let (read2, written2) = rows_read_and_written(&mut run, newest).await;
        assert_eq!(read2, written2, "each row of the committed round read once");
        assert!(
            read2 < read,
            "before the commit the state read the rows its column saved again twice ({read} \
             rows read, {read2} once each)"
        );
        run.restore_all_committed().await;
        let gc = remove_dead_files(&run.ckpts).await.unwrap();
        assert!(!gc.dead_files.is_empty(), "the round split older chunks");
        run.restore_all_committed().await;
        for v in verify(&run.ckpts).await.unwrap() {
            assert!(v.problem.is_none(), "{v:?}");
        }
        let (bad, unreadable) = damage(&run.ckpts).await.unwrap();
        assert!(
            bad.is_empty() && unreadable.is_empty(),
            "{bad:?} {unreadable:?}"
        );
    });
}

/// A server killed mid-extraction: the round's task is dropped while held after its first
/// file (its chain, the server's memory, goes with it). The store holds that file, named by no
/// index; every committed checkpoint restores bit for bit, and a new server restored at the
/// newest state continues the list (pieces, rounds, commits) with every checkpoint restoring
/// bit for bit and the store verifying clean.
#[test]
fn a_crash_mid_extraction_leaves_a_store_that_restores() {
    block_on(async {
        let mut run = background_run(5).await;
        let newest = run.committed.len() - 1;
        let (hook, reached, go) = hold_after_first_file();
        let mut chain = std::mem::replace(
            &mut run.chains[0],
            ServerChain::new(ServerId(0), run.model.map),
        );
        chain.set_round_hook(Some(hook));
        let ckpts = run.ckpts.clone();
        let task = tokio::spawn(async move {
            let r = chain.extract(&ckpts).await;
            (chain, r)
        });
        let first = reached.await.unwrap();
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        drop(go);
        let key = run
            .ckpts
            .file_key(&run.committed[newest].0, &first)
            .unwrap();
        run.ckpts.store().head(&key).await.unwrap();
        run.restore_all_committed().await;
        // The new server: restored at the newest state, it continues from there.
        run.restore(newest, true).await;
        assert!(!run.chains[0].round_pending(), "a restore runs no round");
        for _ in 0..3 {
            run.model.update(60);
            run.piece().await;
            run.round_stats().await;
        }
        run.model.update(60);
        run.piece().await;
        run.restore_all_committed().await;
        remove_dead_files(&run.ckpts).await.unwrap();
        run.restore_all_committed().await;
        for v in verify(&run.ckpts).await.unwrap() {
            assert!(v.problem.is_none(), "{v:?}");
        }
    });
}

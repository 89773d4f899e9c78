//! DECK end to end on a small sharded model in deterministic terms (deck.txt §3–§4): seeded
//! updates step by step, tracked on the owning server; deltas staged through the local
//! directory into the store; hierarchical merges and merger fulls; restores at several points
//! compared with the live model's `ModelDigest` at that step, bit for bit. Plus torn and failed
//! uploads during staging and merging, corrupt and missing deltas, and GC safety.

use std::collections::BTreeMap;
use std::sync::Arc;

use ftrec_ckpt::deck::{
    self, checkpoint_id, staging, ConsumerId, GcOptions, MemGauge, MergePolicy, Merger, RestoreAt,
    Retention, RowSelection, Source, SourceTable, StagingOptions, TablesWriter, Tracker,
};
use ftrec_ckpt::snapshot::{self, DenseShard, RowIds, ServerShard, TableShard};
use ftrec_ckpt::store::fault::{FaultAction, FaultRule, Op, TearAt, Trigger};
use ftrec_ckpt::{
    CheckpointId, CheckpointKind, Checkpoints, ChunkStore, CkptError, DataPosition, FaultPlan,
    FaultyStore, Manifest, MemoryStore,
};
use ftrec_core::rng::SplitMix;
use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, Optimizer, OptimizerKind, RowLayout, ServerId,
    ShardMap, TableId,
};

const CK: ConsumerId = ConsumerId(0);
const TABLE_ROWS: [u64; 3] = [40, 300, 7];
const DIM: usize = 4;

struct ServerState {
    id: ServerId,
    tables: Vec<EmbeddingTable>,
    dense: DenseParams,
    first_block: u64,
    tracker: Tracker,
}

/// A model sharded over `n` servers, trained by seeded sparse updates.
struct Sim {
    map: ShardMap,
    opt: Optimizer,
    servers: Vec<ServerState>,
    seed: u64,
    step: u64,
}

impl Sim {
    fn new(n: u32, seed: u64) -> Sim {
        let map = ShardMap::new(n).unwrap();
        let opt = Optimizer::new(OptimizerKind::Adagrad, 0.05);
        let layout = RowLayout::new(DIM, opt.state_words(DIM));
        let dense_opt = Optimizer::new(OptimizerKind::Adagrad, 0.01);
        let servers = (0..n)
            .map(|s| {
                let id = ServerId(s);
                let tables = TABLE_ROWS
                    .iter()
                    .enumerate()
                    .map(|(t, &rows)| {
                        let tid = TableId(t as u32);
                        let mut shard =
                            EmbeddingTable::zeros(tid, map.rows_on(tid, rows, id), layout);
                        shard.init_rows(seed, 0.1, |l| map.global_row(tid, id, l));
                        shard
                    })
                    .collect();
                // 300 dense values per server: two blocks, the last short.
                let values: Vec<f32> = (0..300).map(|i| (i as f32 + s as f32) * 1e-3).collect();
                let mut tracker = Tracker::new();
                tracker.register(CK).unwrap();
                ServerState {
                    id,
                    tables,
                    dense: DenseParams::new(values, &dense_opt),
                    first_block: s as u64 * 2,
                    tracker,
                }
            })
            .collect();
        Sim {
            map,
            opt,
            servers,
            seed,
            step: 0,
        }
    }

    /// One step: a few rows of every table get a gradient, the dense part too.
    fn step(&mut self) {
        self.step += 1;
        let mut rng = SplitMix::keyed(self.seed, 99, self.step);
        let dense_opt = Optimizer::new(OptimizerKind::Adagrad, 0.01);
        for (t, &rows) in TABLE_ROWS.iter().enumerate() {
            let tid = TableId(t as u32);
            let mut touched = std::collections::BTreeSet::new();
            for _ in 0..5 {
                // Skewed: small ids are hot.
                let r = (rng.next_u64() % rows).min(rng.next_u64() % rows);
                touched.insert(r);
            }
            for r in touched {
                let owner = self.map.owner(tid, r);
                let s = &mut self.servers[owner.0 as usize];
                let grad: Vec<f32> = (0..DIM).map(|_| rng.next_f32() - 0.5).collect();
                let row = s.tables[t].row_mut(self.map.local_index(tid, r));
                self.opt.apply(row, DIM, &grad);
                s.tracker.track(tid, &[r]);
            }
        }
        for s in &mut self.servers {
            let grad: Vec<f32> = (0..s.dense.len()).map(|_| rng.next_f32() - 0.5).collect();
            s.dense.apply(&dense_opt, &grad);
            s.tracker.compact();
        }
    }

    fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for s in &self.servers {
            d.merge(&snapshot::shard_digest(&self.shard(s)));
        }
        d
    }

    fn shard<'a>(&'a self, s: &'a ServerState) -> ServerShard<'a> {
        ServerShard {
            server: s.id,
            tables: s
                .tables
                .iter()
                .map(|t| TableShard {
                    table: t,
                    ids: RowIds::Sharded {
                        map: self.map,
                        server: s.id,
                    },
                })
                .collect(),
            dense: Some(DenseShard {
                first_block: s.first_block,
                params: &s.dense,
            }),
        }
    }

    /// A zeroed copy of the model's shapes, to restore into.
    fn blank(&self) -> Sim {
        let mut b = Sim::new(self.servers.len() as u32, self.seed ^ 0xdead);
        for s in &mut b.servers {
            for t in &mut s.tables {
                t.as_mut_slice().fill(0.0);
            }
            s.dense.values.fill(0.0);
            s.dense.state.fill(0.0);
        }
        b
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Env {
    rt: tokio::runtime::Runtime,
    ckpts: Checkpoints,
    staging: tempfile::TempDir,
    gauge: Arc<MemGauge>,
    chunk_bytes: usize,
    limit_bytes: Option<u64>,
}

impl Env {
    fn new(store: Arc<dyn ChunkStore>) -> Env {
        Env {
            rt: rt(),
            ckpts: Checkpoints::new(store),
            staging: tempfile::tempdir().unwrap(),
            gauge: MemGauge::new(),
            chunk_bytes: 1024,
            limit_bytes: None,
        }
    }

    fn opts(&self) -> StagingOptions {
        StagingOptions {
            chunk_bytes: self.chunk_bytes,
            staging_dir: self.staging.path().to_path_buf(),
            limit_bytes: self.limit_bytes,
        }
    }

    /// Save every server (all rows for a full, tracked rows for a delta) and commit.
    fn save(
        &self,
        sim: &mut Sim,
        kind: CheckpointKind,
        parent: Option<&CheckpointId>,
    ) -> Result<Manifest, CkptError> {
        let id = checkpoint_id(sim.step, kind, 0);
        let mut reports = Vec::new();
        let mut taken = Vec::new();
        for s in &mut sim.servers {
            taken.push(s.tracker.take(CK)?);
        }
        let mut pending = Vec::new();
        for (s, tracked) in sim.servers.iter().zip(&taken) {
            let (sink, up) = staging::start(
                self.ckpts.clone(),
                id.clone(),
                s.id,
                &self.opts(),
                self.gauge.clone(),
                self.rt.handle(),
            )?;
            let src = Source {
                server: s.id,
                tables: s
                    .tables
                    .iter()
                    .map(|t| SourceTable {
                        table: t.id,
                        layout: t.layout(),
                        data: t.as_slice(),
                        ids: RowIds::Sharded {
                            map: sim.map,
                            server: s.id,
                        },
                        rows: match kind {
                            CheckpointKind::Full => RowSelection::All,
                            _ => RowSelection::Only(tracked.of(t.id)),
                        },
                    })
                    .collect(),
                dense: Some((s.first_block, &s.dense)),
            };
            // The copy-out is the pause: it returns once the rows are handed on.
            let copied = sink.copy_out(&src);
            pending.push((copied, up));
        }
        let mut err = None;
        for (copied, up) in pending {
            let r = self.rt.block_on(up.wait());
            match (copied, r) {
                (Ok(_), Ok(rep)) => reports.push(rep),
                (Err(e), _) | (_, Err(e)) => err = err.or(Some(e)),
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        let m = deck::shard_manifest(
            id,
            kind,
            sim.step,
            parent.cloned(),
            DataPosition::Json(serde_json::json!({ "step": sim.step })),
            reports,
        );
        self.rt.block_on(self.ckpts.commit(&m))?;
        for (s, tracked) in sim.servers.iter_mut().zip(taken) {
            s.tracker.ack(CK, tracked.upto)?;
        }
        Ok(m)
    }

    /// Restore a blank model from `at` and return its digest.
    fn restore(
        &self,
        sim: &Sim,
        at: RestoreAt,
        fallback: bool,
    ) -> Result<(ModelDigest, Vec<Manifest>), CkptError> {
        let chain = self
            .rt
            .block_on(deck::select_chain(&self.ckpts, &at, fallback))?;
        let mut blank = sim.blank();
        let map = blank.map;
        for s in &mut blank.servers {
            let id = s.id;
            let mut w = TablesWriter {
                server: id,
                tables: s
                    .tables
                    .iter_mut()
                    .map(|t| (t, RowIds::Sharded { map, server: id }))
                    .collect(),
                dense: Some((s.first_block, &mut s.dense)),
            };
            self.rt
                .block_on(deck::restore_chain(&self.ckpts, &chain, &mut w))?;
        }
        Ok((blank.digest(), chain))
    }

    fn merge(&self, policy: MergePolicy) -> Result<deck::MergeReport, CkptError> {
        let m = Merger::new(self.ckpts.clone(), policy)?;
        self.rt.block_on(m.run_once())
    }
}

fn kinds(chain: &[Manifest]) -> Vec<CheckpointKind> {
    chain.iter().map(|m| m.kind).collect()
}

/// DECK §3.1–§3.3: full, deltas, hierarchical merges (s = 2, Fig. 5) and a merger full; every
/// committed point restores to the live digest at its step.
#[test]
fn restores_every_point_bit_for_bit_through_merges_and_fulls() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(2, 11);
    let mut digests: BTreeMap<u64, ModelDigest> = BTreeMap::new();
    let mut ids: BTreeMap<u64, CheckpointId> = BTreeMap::new();
    for _ in 0..3 {
        sim.step();
    }
    let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    digests.insert(sim.step, sim.digest());
    ids.insert(sim.step, full.id.clone());
    let mut parent = full.id.clone();
    let policy = MergePolicy {
        stride: 2,
        full_every_deltas: Some(8),
        chunk_bytes: 1024,
        ..Default::default()
    };
    for k in 1..=9 {
        for _ in 0..2 {
            sim.step();
        }
        let d = env
            .save(&mut sim, CheckpointKind::Delta, Some(&parent))
            .unwrap();
        digests.insert(sim.step, sim.digest());
        ids.insert(sim.step, d.id.clone());
        parent = d.id.clone();
        let rep = env.merge(policy.clone()).unwrap();
        if k == 2 {
            assert_eq!(rep.written.len(), 1, "D1 D2 -> M1");
        }
        if k == 4 {
            assert_eq!(rep.written.len(), 2, "D3 D4 -> M1', then M1 M1' -> M2");
            let (_, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
            assert_eq!(
                kinds(&chain),
                vec![CheckpointKind::Full, CheckpointKind::Merged]
            );
        }
        if k == 8 {
            // N = 8 deltas: the merger wrote a full standing for D8.
            let (_, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
            assert_eq!(kinds(&chain), vec![CheckpointKind::Full]);
            assert!(chain[0].id != full.id);
        }
        // The head always restores to the live model.
        let (d, _) = env.restore(&sim, RestoreAt::Current, false).unwrap();
        assert_eq!(d, sim.digest(), "head after delta {k}");
    }
    // Every point, by step, before GC.
    for (step, want) in &digests {
        let (d, _) = env.restore(&sim, RestoreAt::Step(*step), false).unwrap();
        assert_eq!(&d, want, "step {step}");
    }
    // GC keeps the head's lineage only; the head still restores exactly.
    let rep = env
        .rt
        .block_on(deck::gc(&env.ckpts, &GcOptions::default()))
        .unwrap();
    assert!(!rep.deleted.is_empty());
    let (d, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
    assert_eq!(d, sim.digest());
    assert_eq!(
        rep.kept.len(),
        chain.len(),
        "exactly the head's chain is kept: {rep:?}"
    );
    // Training goes on after GC: a new delta over the (deleted) last delta still restores.
    sim.step();
    let d = env
        .save(&mut sim, CheckpointKind::Delta, Some(&parent))
        .unwrap();
    let (got, _) = env
        .restore(&sim, RestoreAt::Id(d.id.clone()), false)
        .unwrap();
    assert_eq!(got, sim.digest());
}

/// A committed delta that the merger replaced and garbage collection deleted is still a state
/// the store can name: its id resolves to the merged checkpoint standing for it, whose manifest
/// carries the delta's data position, and restores the model of that step. (A recovery names
/// the committed delta it last heard of, whatever the merger did since.)
#[test]
fn a_delta_merged_away_and_collected_still_names_its_state() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(2, 17);
    sim.step();
    let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    let mut parent = full.id.clone();
    let mut last = None;
    for _ in 0..2 {
        sim.step();
        let d = env
            .save(&mut sim, CheckpointKind::Delta, Some(&parent))
            .unwrap();
        parent = d.id.clone();
        last = Some(d);
    }
    let d2 = last.unwrap();
    let policy = MergePolicy {
        stride: 2,
        chunk_bytes: 1024,
        ..Default::default()
    };
    assert_eq!(env.merge(policy).unwrap().written.len(), 1);
    let rep = env
        .rt
        .block_on(deck::gc(&env.ckpts, &GcOptions::default()))
        .unwrap();
    assert!(rep.deleted.contains(&d2.id), "{rep:?}");
    let gone = env.rt.block_on(env.ckpts.read_manifest(&d2.id, None));
    assert!(matches!(gone, Err(CkptError::NotFound { .. })), "{gone:?}");
    let (digest, chain) = env
        .restore(&sim, RestoreAt::Id(d2.id.clone()), false)
        .unwrap();
    assert_eq!(digest, sim.digest());
    let tip = chain.last().unwrap();
    assert_eq!(tip.kind, CheckpointKind::Merged);
    assert_eq!(tip.step, d2.step);
    assert_eq!(tip.data_position, d2.data_position);
}

/// DECK §3.2: at most four chunk sizes in memory, for two model sizes at one chunk size.
#[test]
fn staging_memory_does_not_grow_with_the_model() {
    for servers in [1u32, 2] {
        for scale in [1usize, 8] {
            let env = Env::new(Arc::new(MemoryStore::new()));
            let mut sim = Sim::new(servers, 3);
            // Bigger tables: scale the first table.
            let layout = sim.servers[0].tables[0].layout();
            for s in &mut sim.servers {
                s.tables[0] = EmbeddingTable::new_init(
                    TableId(0),
                    sim.map.rows_on(TableId(0), 2000 * scale as u64, s.id),
                    layout,
                    1,
                    0.1,
                );
            }
            env.save(&mut sim, CheckpointKind::Full, None).unwrap();
            // One gauge counts every server's pipeline: four chunk sizes each at most.
            let bound = servers as u64 * 4 * (env.chunk_bytes as u64 + 128);
            assert!(
                env.gauge.peak_bytes() <= bound,
                "peak {} bytes over {bound}",
                env.gauge.peak_bytes()
            );
            assert_eq!(env.gauge.bytes(), 0, "every buffer is released");
        }
    }
}

fn failing_env(plan: FaultPlan) -> (Env, Arc<FaultyStore>) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new()), plan));
    (Env::new(faulty.clone()), faulty)
}

/// A failed or torn upload during delta staging commits nothing; the lineage restores to its
/// last committed point, and the rows of the failed delta go into the next one.
#[test]
fn failed_and_torn_delta_uploads_leave_the_last_commit_restorable() {
    for action in [FaultAction::Fail, FaultAction::Tear(TearAt::Fraction(0.5))] {
        let plan = FaultPlan::new(5)
            .rule(FaultRule::new(Op::Put, Trigger::Nth(3), action).on_keys_containing("-delta-"));
        let (env, faulty) = failing_env(plan);
        let mut sim = Sim::new(2, 21);
        sim.step();
        let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
        let at_full = sim.digest();
        sim.step();
        sim.step();
        let err = env
            .save(&mut sim, CheckpointKind::Delta, Some(&full.id))
            .unwrap_err();
        assert!(
            matches!(err, CkptError::TemporarilyUnavailable { .. }),
            "{err}"
        );
        assert_eq!(faulty.injected().len(), 1);
        let (d, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
        assert_eq!(d, at_full);
        assert_eq!(chain.len(), 1);
        // Next delta (same parent) carries the rows the failed one had.
        sim.step();
        env.save(&mut sim, CheckpointKind::Delta, Some(&full.id))
            .unwrap();
        let (d, _) = env.restore(&sim, RestoreAt::Current, false).unwrap();
        assert_eq!(d, sim.digest());
    }
}

/// A failed put during a merge leaves the old lineage restorable and the merge can be redone.
#[test]
fn a_failed_merge_leaves_the_old_lineage_and_is_redone() {
    let plan = FaultPlan::new(9).rule(
        FaultRule::new(Op::Put, Trigger::Nth(2), FaultAction::Tear(TearAt::Random))
            .on_keys_containing("-m1/"),
    );
    let (env, faulty) = failing_env(plan);
    let mut sim = Sim::new(2, 31);
    sim.step();
    let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    let mut parent = full.id.clone();
    for _ in 0..2 {
        sim.step();
        parent = env
            .save(&mut sim, CheckpointKind::Delta, Some(&parent))
            .unwrap()
            .id;
    }
    let policy = MergePolicy {
        chunk_bytes: 1024,
        ..Default::default()
    };
    assert!(env.merge(policy.clone()).is_err());
    assert_eq!(faulty.injected().len(), 1);
    let (d, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
    assert_eq!(d, sim.digest());
    assert_eq!(chain.len(), 3, "full + two deltas, no merged checkpoint");
    let rep = env.merge(policy).unwrap();
    assert_eq!(rep.written.len(), 1);
    let (d, chain) = env.restore(&sim, RestoreAt::Current, false).unwrap();
    assert_eq!(d, sim.digest());
    assert_eq!(
        kinds(&chain),
        vec![CheckpointKind::Full, CheckpointKind::Merged]
    );
}

/// A corrupt delta is an error naming its file; with fallback, the newest intact point is
/// restored instead. A missing delta is an error naming it.
#[test]
fn corrupt_or_missing_deltas_are_named_and_fallback_finds_the_newest_intact_point() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(2, 41);
    sim.step();
    let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    sim.step();
    let d1 = env
        .save(&mut sim, CheckpointKind::Delta, Some(&full.id))
        .unwrap();
    let at_d1 = sim.digest();
    sim.step();
    let d2 = env
        .save(&mut sim, CheckpointKind::Delta, Some(&d1.id))
        .unwrap();
    // Flip one byte of one of d2's row files.
    let f = d2.files.iter().find(|f| f.path.ends_with(".rows")).unwrap();
    let key = env.ckpts.file_key(&d2.id, &f.path).unwrap();
    let store = env.ckpts.store().clone();
    let mut bytes = env.rt.block_on(store.get(&key)).unwrap().to_vec();
    let last = bytes.len() - 9;
    bytes[last] ^= 0x40;
    env.rt
        .block_on(store.put(&key, bytes.into(), ftrec_ckpt::PutMode::Overwrite))
        .unwrap();
    let err = env.restore(&sim, RestoreAt::Current, false).unwrap_err();
    assert_eq!(err.file(), Some(key.as_str()), "{err}");
    let (d, chain) = env.restore(&sim, RestoreAt::Current, true).unwrap();
    assert_eq!(d, at_d1);
    assert_eq!(chain.last().unwrap().id, d1.id);
    // Remove d1 entirely: d2's base is missing, and the error names it.
    env.rt
        .block_on(env.ckpts.delete_checkpoint(&d1.id))
        .unwrap();
    let err = env
        .restore(&sim, RestoreAt::Id(d2.id.clone()), false)
        .unwrap_err();
    assert!(err.to_string().contains(d1.id.as_str()), "{err}");
}

/// GC safety (DECK §4.3): it never deletes what the head's lineage needs, keeps older fulls at
/// broad intervals, and never touches a save in flight unless asked to remove orphans.
#[test]
fn gc_keeps_live_lineages_and_in_flight_saves() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(1, 51);
    let mut fulls = Vec::new();
    let mut parent = None;
    for i in 0..4 {
        for _ in 0..5 {
            sim.step();
        }
        let f = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
        fulls.push((sim.step, sim.digest(), f.id.clone()));
        parent = Some(f.id);
        let _ = i;
    }
    sim.step();
    env.save(&mut sim, CheckpointKind::Delta, parent.as_ref())
        .unwrap();
    // A save in flight: files without a manifest.
    let in_flight = checkpoint_id(999, CheckpointKind::Delta, 0);
    let key = env
        .ckpts
        .file_key(&in_flight, "s0000/t0000-000000.rows")
        .unwrap();
    env.rt
        .block_on(
            env.ckpts
                .store()
                .put(&key, vec![1, 2, 3].into(), ftrec_ckpt::PutMode::Create),
        )
        .unwrap();
    let opts = GcOptions {
        retention: Retention {
            full_every_steps: 10,
            max_old_fulls: 2,
        },
        remove_orphans: false,
    };
    let rep = env.rt.block_on(deck::gc(&env.ckpts, &opts)).unwrap();
    // Fulls at steps 5, 10, 15, 20: 20 is on the head's chain; 10 is kept as an old full.
    assert_eq!(rep.deleted, vec![fulls[0].2.clone(), fulls[2].2.clone()]);
    assert!(env.rt.block_on(env.ckpts.store().head(&key)).is_ok());
    let (d, _) = env
        .restore(&sim, RestoreAt::Id(fulls[1].2.clone()), false)
        .unwrap();
    assert_eq!(d, fulls[1].1);
    let (d, _) = env.restore(&sim, RestoreAt::Current, false).unwrap();
    assert_eq!(d, sim.digest());
    let rep = env
        .rt
        .block_on(deck::gc(
            &env.ckpts,
            &GcOptions {
                remove_orphans: true,
                ..opts
            },
        ))
        .unwrap();
    assert_eq!(rep.orphans_removed, vec![in_flight.to_string()]);
    assert!(rep.deleted.is_empty());
}

/// Files of a save dropped before the head's commit (written after the drop by a process that
/// did not know it was replaced) are removed while the job runs; a save in flight, newer than
/// the head, is not.
#[test]
fn dropped_saves_before_the_head_are_removed_and_a_save_in_flight_is_not() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(1, 52);
    let mut parent = None;
    for _ in 0..2 {
        for _ in 0..4 {
            sim.step();
        }
        parent = Some(env.save(&mut sim, CheckpointKind::Full, None).unwrap().id);
    }
    let head = env
        .rt
        .block_on(env.ckpts.read_current())
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(Some(&head), parent.as_ref());
    let put = |id: &CheckpointId| {
        let key = env.ckpts.file_key(id, "s0001/t0000-000000.rows").unwrap();
        env.rt
            .block_on(
                env.ckpts
                    .store()
                    .put(&key, vec![7].into(), ftrec_ckpt::PutMode::Create),
            )
            .unwrap();
    };
    // Dropped at step 6 (after the first full, before the head at step 8), and at step 8 by an
    // earlier attempt; one in flight at step 12.
    let dropped = [
        checkpoint_id(6, CheckpointKind::Delta, 0),
        checkpoint_id(8, CheckpointKind::Delta, 0),
    ];
    let in_flight = checkpoint_id(12, CheckpointKind::Full, 0);
    for id in dropped.iter().chain([&in_flight]) {
        put(id);
    }
    let removed = env
        .rt
        .block_on(deck::remove_dropped_saves(&env.ckpts, &head))
        .unwrap();
    assert_eq!(
        removed,
        dropped.iter().map(|i| i.to_string()).collect::<Vec<_>>()
    );
    let left = env
        .rt
        .block_on(
            env.ckpts
                .store()
                .list(Some(&env.ckpts.checkpoint_dir(&in_flight))),
        )
        .unwrap();
    assert_eq!(left.len(), 1);
    // Every committed checkpoint is still whole.
    let (d, _) = env.restore(&sim, RestoreAt::Current, false).unwrap();
    assert_eq!(d, sim.digest());
}

/// Row and dense files of deltas and merged checkpoints are the v1 formats: flipping any byte
/// of a delta's files or truncating them is refused naming the file.
#[test]
fn flip_and_truncate_every_delta_and_merged_file() {
    let env = Env::new(Arc::new(MemoryStore::new()));
    let mut sim = Sim::new(1, 61);
    sim.step();
    let full = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    sim.step();
    let d1 = env
        .save(&mut sim, CheckpointKind::Delta, Some(&full.id))
        .unwrap();
    sim.step();
    env.save(&mut sim, CheckpointKind::Delta, Some(&d1.id))
        .unwrap();
    let rep = env
        .merge(MergePolicy {
            chunk_bytes: 1024,
            ..Default::default()
        })
        .unwrap();
    let merged = env
        .rt
        .block_on(env.ckpts.read_manifest(&rep.written[0], None))
        .unwrap();
    assert_eq!(merged.kind, CheckpointKind::Merged);
    for m in [&d1, &merged] {
        for f in &m.files {
            let key = env.ckpts.file_key(&m.id, &f.path).unwrap();
            let data = env.rt.block_on(env.ckpts.store().get(&key)).unwrap();
            Checkpoints::verify_file(&key, f, &data).unwrap();
            for i in (0..data.len()).step_by(7) {
                let mut d = data.to_vec();
                d[i] ^= 0x08;
                let e = Checkpoints::verify_file(&key, f, &d).unwrap_err();
                assert_eq!(e.file(), Some(key.as_str()));
            }
            for len in (0..data.len()).step_by(5) {
                let e = Checkpoints::verify_file(&key, f, &data[..len]).unwrap_err();
                assert_eq!(e.file(), Some(key.as_str()));
            }
        }
    }
    // The merged manifest itself: flip and truncate.
    let mkey = env.ckpts.manifest_key(&merged.id);
    let data = env.rt.block_on(env.ckpts.store().get(&mkey)).unwrap();
    for i in (0..data.len()).step_by(3) {
        let mut d = data.to_vec();
        d[i] ^= 0x01;
        assert!(Manifest::decode("M", &d).unwrap_err().file() == Some("M"));
    }
}

/// A collection whose read of `CURRENT` fails stops instead of guessing the head: the newest
/// manifest may be one that was never committed, and taking it for the head would delete the
/// real one.
#[test]
fn gc_stops_when_current_cannot_be_read() {
    let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let env = Env::new(mem.clone());
    let mut sim = Sim::new(2, 23);
    sim.step();
    let f1 = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    let key = env.ckpts.current_key();
    let committed = env.rt.block_on(mem.get(&key)).unwrap();
    sim.step();
    let f2 = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    // f2's manifest landed but CURRENT still names f1 (a crash between the two).
    env.rt
        .block_on(mem.put(&key, committed, ftrec_ckpt::PutMode::Overwrite))
        .unwrap();
    let faulty: Arc<dyn ChunkStore> = Arc::new(FaultyStore::new(
        mem.clone(),
        FaultPlan {
            seed: 1,
            rules: vec![FaultRule::new(Op::Get, Trigger::Always, FaultAction::Fail)
                .on_keys_containing("CURRENT")],
        },
    ));
    let ck = Checkpoints::new(faulty);
    let err = env
        .rt
        .block_on(deck::gc(&ck, &GcOptions::default()))
        .unwrap_err();
    assert!(err.to_string().contains("CURRENT"), "{err}");
    for m in [&f1, &f2] {
        env.rt
            .block_on(env.ckpts.read_manifest(&m.id, None))
            .unwrap_or_else(|e| panic!("{} was deleted: {e}", m.id));
    }
    // With CURRENT readable again, the collection keeps f1 (the head) and what is newer.
    let rep = env
        .rt
        .block_on(deck::gc(&env.ckpts, &GcOptions::default()))
        .unwrap();
    assert!(!rep.deleted.contains(&f1.id), "{rep:?}");
}

/// A commit whose `CURRENT` write landed but whose acknowledgement was lost is a commit: the
/// committer reads `CURRENT` again before it reports failure (so nobody deletes a checkpoint
/// `CURRENT` names). Where even that read fails, the outcome is reported as uncertain.
#[test]
fn a_commit_whose_acknowledgement_is_lost_is_checked_before_it_fails() {
    let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let faulty = |rules: Vec<FaultRule>| -> Arc<dyn ChunkStore> {
        Arc::new(FaultyStore::new(mem.clone(), FaultPlan { seed: 2, rules }))
    };
    let lose = FaultRule::new(Op::Swap, Trigger::Nth(1), FaultAction::LoseAck)
        .on_keys_containing("CURRENT");
    let env = Env::new(faulty(vec![lose.clone()]));
    let mut sim = Sim::new(2, 29);
    sim.step();
    let f1 = env.save(&mut sim, CheckpointKind::Full, None).unwrap();
    let cur = env.rt.block_on(env.ckpts.read_current()).unwrap().unwrap();
    assert_eq!(cur.id, f1.id);
    // The same loss, and the read after it fails too: uncertain, never "failed".
    let reread_fails =
        FaultRule::new(Op::Get, Trigger::Nth(2), FaultAction::Fail).on_keys_containing("CURRENT");
    let env2 = Env {
        ckpts: Checkpoints::new(faulty(vec![lose, reread_fails])),
        ..Env::new(mem.clone())
    };
    sim.step();
    let err = env2.save(&mut sim, CheckpointKind::Full, None).unwrap_err();
    assert!(matches!(err, CkptError::CommitUncertain { .. }), "{err}");
}

/// A full staging disk is named as such wherever the failure surfaces (not "the pipeline
/// stopped, see elsewhere"), and a save fails cleanly.
#[test]
fn a_full_staging_disk_is_named_in_the_error() {
    let mut env = Env::new(Arc::new(MemoryStore::new()));
    env.limit_bytes = Some(1);
    let mut sim = Sim::new(1, 31);
    sim.step();
    let err = env.save(&mut sim, CheckpointKind::Full, None).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no space left on device"), "{text}");
    assert!(!text.contains("see the upload"), "{text}");
}

/// Upload folders of processes that no longer exist are removed; a live process's are kept.
#[test]
fn staging_folders_of_dead_processes_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let own = std::process::id();
    let dead_dir = dir
        .path()
        .join(format!("d-00000000000000000001-s0000-{dead}-0"));
    let live_dir = dir
        .path()
        .join(format!("d-00000000000000000001-s0000-{own}-0"));
    let other = dir.path().join("not-ours");
    for d in [&dead_dir, &live_dir, &other] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("x"), b"1").unwrap();
    }
    let removed = staging::remove_dead_folders(dir.path()).unwrap();
    assert_eq!(removed, vec![dead_dir.clone()]);
    assert!(!dead_dir.exists());
    assert!(live_dir.exists() && other.exists());
}

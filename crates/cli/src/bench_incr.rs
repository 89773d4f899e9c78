//! `ftrec bench incremental`: IncrCP against its baselines, measured as IncrCP §5 measures
//! them, in one invocation: `incrcp`, naive `incremental` and `cnr` (Check-N-Run differentials),
//! and `deck` for reference.
//!
//! The protocol (IncrCP §5.1.3): a checkpoint every 10 steps, 150 checkpoints after the first
//! full, all written first; then the recovery of each one (or an evenly spaced sample of them,
//! said so in the report) is timed, with the page cache warm and cold apart (cold: every file of
//! the store dropped with `posix_fadvise(DONTNEED)` first). As in §5.1.4 the figure compared is
//! the recovery of what lies over the base (the base's restore is the same for every scheme).
//! The headline is the mean over the checkpoints (§5.2.1's "average recovery time"): naive
//! incremental's mean recovery time over IncrCP's, one figure per pass over the checkpoints, and
//! the mean of the passes with its 95% interval. The recovery per depth and that of the newest
//! state (the cheapest for IncrCP: its rectangle is row 0 alone) are reported beside it.
//!
//! Every scheme restores through the same engine (`ftrec_ckpt::incr::restore`: the same span
//! reader, threads and zero-copy writes); the schemes differ only in what they read. Every
//! restore is checked against the digest the live model had at that checkpoint.
//!
//! One server's model in this process (the paper's single-node setting; one list per table, as
//! its implementation keeps): the tables of a preset capped at `--table-cap` rows, the preset's
//! embedding dim and optimizers, batches of 1024 samples (IncrCP Table 2). The workload is the
//! synthetic Criteo-like stream's Zipf ids: each step applies the optimizer to every row a
//! batch touches, and the same steps run under every strategy. Every save goes through the same
//! path as a server's checkpoint service: copy-out into the staging pipeline (the pause), upload
//! to a local store, then the piece's finishing (the piece index) and the commit; IncrCP's
//! extraction round runs after the commit, in the background while training goes on, and the
//! next piece commits it (waiting for it only if it is still running). The strategies' own
//! state machines decide what each save is.
//!
//! `--ablation` adds IncrCP §5.3's: the filter stages added one by one at `R` (Base, IF, IF+BF,
//! IF+BF+AF) and concatenation off and on at `R = 0`, each a run of its own, timed the same way.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftrec_ckpt::deck::{
    self, staging, ConsumerId, MemGauge, MergePolicy, Merger, RestoreAt, RowSelection, Source,
    SourceTable, StagingOptions, Tracker,
};
use ftrec_ckpt::incr::{
    self, ExtractConfig, Filters, MemShard, PieceScheme, PieceSpec, QuantBits, ServerChain,
};
use ftrec_ckpt::snapshot::{RowIds, ShardReport};
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition, LocalStore};
use ftrec_core::rng::hash3;
use ftrec_core::{
    DenseParams, EmbeddingTable, ModelDigest, Optimizer, Preset, RowId, RowLayout, ServerId,
    ShardMap, TableId,
};
use ftrec_data::{Split, SynthConfig, SyntheticSource};
use ftrec_strategy::{
    Action, BaseReset, CheckpointRef, Cnr, CnrConfig, Deck, DeckConfig, Event, IncrCp,
    IncrCpConfig, Incremental, Interval, PieceLayout, Strategy,
};
use serde::Serialize;

/// Flags of `ftrec bench incremental`.
#[derive(Args, Debug, Clone)]
pub struct IncrBenchArgs {
    /// Preset whose tables, dim and optimizers the model takes.
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Cap on every table's rows: the model's size (26 tables; with the default preset the
    /// default cap gives 287,398 rows, 18.6 MiB). A cap above the preset's largest table is
    /// refused: `--preset kaggle` has the Criteo Kaggle cardinalities, up to 10,131,227 rows a
    /// table [default: 30000].
    #[arg(long, visible_alias = "rows-per-table", value_name = "ROWS")]
    pub table_cap: Option<u64>,
    /// Zipf exponent of the ids [default: the preset's].
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Samples per step (IncrCP Table 2: 1024 for DLRM on Kaggle).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Steps between checkpoints (IncrCP §5.1.3: 10).
    #[arg(long, default_value_t = 10)]
    pub steps_per_ckpt: u64,
    /// Checkpoints after the first full (IncrCP §5.1.3: 150 for DLRM).
    #[arg(long, default_value_t = 150)]
    pub checkpoints: u64,
    /// Checkpoints whose recovery is timed: 0 times every one (the paper's protocol); N an
    /// evenly spaced sample of N, the first and the newest included (said so in the report).
    #[arg(long, default_value_t = 0)]
    pub sample: u64,
    /// Passes over the checkpoints timed: each gives one mean per scheme; the report gives the
    /// mean of the passes and its 95% interval.
    #[arg(long, default_value_t = 3)]
    pub passes: usize,
    /// IncrCP's extraction threshold R (IncrCP §5.2: 0.02).
    #[arg(long, default_value_t = 0.02)]
    pub threshold: f64,
    /// IncrCP's row-range size in local rows (0: one list per table).
    #[arg(long, default_value_t = 0)]
    pub range_rows: u64,
    /// IncrCP's compaction: move the live chunks of a row-0 file whose live share fell below
    /// this, so the file can go (0: never) [default: the store's, 0.5].
    #[arg(long, value_name = "SHARE")]
    pub compact_below: Option<f64>,
    /// Check-N-Run's base reset: a new full once a differential passes this share of the
    /// full (the runs with reset rules on).
    #[arg(long, default_value_t = 0.5)]
    pub cnr_reset_fraction: f64,
    /// Also run Check-N-Run with differentials quantized to 8 or 4 bits (storage and pauses
    /// only: its restores are approximate).
    #[arg(long)]
    pub quantize: Option<u32>,
    /// Skip the runs with each strategy's base-reset rule on.
    #[arg(long)]
    pub no_reset_runs: bool,
    /// Skip DECK (storage and pauses only: its merger rewrites older states).
    #[arg(long)]
    pub no_deck: bool,
    /// Also run IncrCP §5.3's ablation: the filter stages added one by one at R, and
    /// concatenation off and on at R = 0.
    #[arg(long)]
    pub ablation: bool,
    /// Where the stores go (a fresh directory, removed afterwards unless --keep).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long)]
    pub keep: bool,
    /// Staging and file chunk size in KiB.
    #[arg(long, default_value_t = 4096)]
    pub chunk_kib: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

const CK: ConsumerId = ConsumerId(0);

/// The workload: the touched rows of every step, per table (sorted, distinct), drawn on
/// demand from the seeded stream (the same for every run).
struct Workload {
    preset: Preset,
    table_rows: Vec<u64>,
    src: SyntheticSource,
    batch: usize,
    steps: u64,
}

impl Workload {
    fn new(a: &IncrBenchArgs) -> Result<Workload> {
        if let Some(c) = a.compact_below {
            if !(0.0..=1.0).contains(&c) {
                bail!("--compact-below {c} is not a share in [0, 1]");
            }
        }
        let mut preset = Preset::by_name(&a.preset)?;
        let largest = preset.table_rows.iter().copied().max().unwrap_or(0);
        if let Some(cap) = a.table_cap {
            if cap == 0 {
                bail!("--table-cap 0: every table needs at least one row");
            }
            if cap > largest {
                bail!(
                    "--table-cap {cap} is above preset {}'s largest table ({largest} rows), so it \
                     would not change the model; --preset kaggle has tables of up to {} rows",
                    preset.name,
                    ftrec_core::preset::KAGGLE_TABLE_ROWS
                        .iter()
                        .max()
                        .unwrap_or(&0)
                );
            }
        }
        let cap = a.table_cap.unwrap_or(30_000);
        preset.table_rows = preset.table_rows.iter().map(|&r| r.min(cap)).collect();
        let mut cfg = SynthConfig::from_preset(&preset, a.seed);
        if let Some(s) = a.zipf {
            cfg.zipf_exponents = vec![s; cfg.table_rows.len()];
        }
        Ok(Workload {
            table_rows: preset.table_rows.clone(),
            preset,
            src: SyntheticSource::new(cfg)?,
            batch: a.batch,
            steps: (a.checkpoints + 1) * a.steps_per_ckpt,
        })
    }

    /// The rows step `s` touches, per table.
    fn ids(&self, s: u64) -> Vec<Vec<RowId>> {
        let (batch, _) = self
            .src
            .batch_at(Split::Train, s * self.batch as u64, self.batch);
        batch
            .sparse
            .iter()
            .map(|f| {
                let mut ids = f.ids.clone();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect()
    }

    fn model_rows(&self) -> u64 {
        self.table_rows.iter().sum()
    }
}

/// The live model of the one server.
struct Model {
    tables: Vec<EmbeddingTable>,
    dense: DenseParams,
    sparse_opt: Optimizer,
    dense_opt: Optimizer,
    tracker: Tracker,
}

const DENSE_VALUES: usize = 4 * ftrec_core::DENSE_BLOCK;

impl Model {
    fn new(w: &Workload, seed: u64) -> Model {
        let p = &w.preset;
        let sparse_opt = Optimizer::new(p.sparse_optimizer, p.sparse_lr);
        let dense_opt = Optimizer::new(p.dense_optimizer, p.dense_lr);
        let layout = RowLayout::new(p.dim, sparse_opt.state_words(p.dim));
        let tables = w
            .table_rows
            .iter()
            .enumerate()
            .map(|(t, &r)| EmbeddingTable::new_init(TableId(t as u32), r, layout, seed, 0.05))
            .collect();
        let mut tracker = Tracker::new();
        tracker.register(CK).expect("a fresh tracker");
        Model {
            tables,
            dense: DenseParams::new(vec![0.01; DENSE_VALUES], &dense_opt),
            sparse_opt,
            dense_opt,
            tracker,
        }
    }

    /// Step `s`: one optimizer update of every touched row and of the dense part.
    fn step(&mut self, w: &Workload, s: u64) {
        let dim = self.tables[0].layout().dim;
        let mut grad = vec![0f32; dim];
        for (t, ids) in w.ids(s).iter().enumerate() {
            for &id in ids {
                let h = hash3(s, t as u64, id);
                for (k, g) in grad.iter_mut().enumerate() {
                    *g = (((h >> (k % 48)) & 0xff) as f32 - 127.5) * 1e-4;
                }
                self.sparse_opt
                    .apply(self.tables[t].row_mut(id), dim, &grad);
            }
            self.tracker.track(TableId(t as u32), ids);
        }
        let g: Vec<f32> = (0..DENSE_VALUES)
            .map(|i| ((hash3(s, 99, i as u64) & 0xff) as f32 - 127.5) * 1e-4)
            .collect();
        self.dense.apply(&self.dense_opt, &g);
        self.tracker.compact();
    }

    fn digest(&self) -> ModelDigest {
        digest_of(
            &self.tables,
            &self.dense.values,
            self.dense.state.as_slice(),
        )
    }

    fn bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.bytes()).sum()
    }
}

/// Every row (values and optimizer state) and the dense values and state: what a restore must
/// give back bit for bit.
fn digest_of(tables: &[EmbeddingTable], values: &[f32], state: &[f32]) -> ModelDigest {
    let mut d = ModelDigest::new();
    for t in tables {
        for r in 0..t.rows() {
            d.add_row(t.id.0, r, t.row(r));
        }
    }
    d.add_row(u32::MAX, 0, values);
    d.add_row(u32::MAX, 1, state);
    d
}

fn shard_digest(s: &MemShard) -> ModelDigest {
    let (v, st) = s
        .dense
        .as_ref()
        .map_or((&[][..], &[][..]), |d| (&d.1[..], &d.2[..]));
    digest_of(&s.tables, v, st)
}

/// A committed checkpoint of a run.
#[derive(Debug, Clone)]
struct Saved {
    id: CheckpointId,
    /// Pieces over its base (0: a full).
    depth: u64,
    digest: ModelDigest,
}

/// One strategy's run.
#[derive(Debug, Clone, Serialize)]
struct RunOut {
    name: String,
    resets: bool,
    fulls: u64,
    pieces: u64,
    /// Bytes in the store after the run (every checkpoint kept restorable; DECK after its
    /// merging and garbage collection).
    stored_bytes: u64,
    /// Of which the data of fulls.
    stored_full_bytes: u64,
    /// Mean copy-out pause of a piece (delta) and its 95% interval over the pieces, and the
    /// mean pause of a full.
    pause_piece_s: f64,
    pause_piece_ci95_s: f64,
    pause_full_s: f64,
    /// Mean time from a piece's save to its commit (copy-out, upload, the piece index; for
    /// IncrCP also the wait for the previous piece's extraction round if it still runs, the
    /// round itself running after the commit).
    save_piece_s: f64,
    save_piece_ci95_s: f64,
    save_full_s: f64,
    /// Background work after commits (DECK's merger passes), total.
    background_s: f64,
    extraction: Option<ftrec_ckpt::format::ExtractStats>,
    quant_max_abs_error: Option<f32>,
    decisions: Vec<ftrec_strategy::Decision>,
    #[serde(skip)]
    saved: Vec<Saved>,
    #[serde(skip)]
    dir: PathBuf,
}

struct Env<'a> {
    args: &'a IncrBenchArgs,
    work: &'a Workload,
    rt: &'a tokio::runtime::Runtime,
    root: PathBuf,
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Half-width of the 95% interval of the mean of `v` (Student's t; 0 below two values).
pub(crate) fn ci95(v: &[f64]) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let n = v.len();
    if n < 2 {
        return 0.0;
    }
    let m = mean(v);
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64;
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    t * (var / n as f64).sqrt()
}

/// What a staged save returns: its report, the tracked rows it saved, the tracker position it
/// covers, its pause in seconds and the largest quantization error.
type Staged = (ShardReport, Vec<(TableId, Vec<RowId>)>, u64, f64, f32);

/// Save the model (all rows, or the tracked ones) through the staging pipeline.
fn stage(
    env: &Env<'_>,
    ckpts: &Checkpoints,
    model: &mut Model,
    id: &CheckpointId,
    full: bool,
    quant: Option<QuantBits>,
) -> Result<Staged> {
    let opts = StagingOptions {
        chunk_bytes: env.args.chunk_kib.max(1) * 1024,
        staging_dir: env.root.join("staging"),
        limit_bytes: None,
    };
    let (sink, upload) = staging::start(
        ckpts.clone(),
        id.clone(),
        ServerId(0),
        &opts,
        MemGauge::new(),
        env.rt.handle(),
    )?;
    let t0 = Instant::now();
    let tracked = model.tracker.take(CK)?;
    let map = ShardMap::new(1)?;
    let src = Source {
        server: ServerId(0),
        tables: model
            .tables
            .iter()
            .map(|t| SourceTable {
                table: t.id,
                layout: t.layout(),
                data: t.as_slice(),
                ids: RowIds::Sharded {
                    map,
                    server: ServerId(0),
                },
                rows: if full {
                    RowSelection::All
                } else {
                    RowSelection::Only(tracked.of(t.id))
                },
            })
            .collect(),
        dense: Some((0, &model.dense)),
    };
    sink.quantized(quant).copy_out(&src)?;
    let pause = t0.elapsed().as_secs_f64();
    let progress = upload.progress().clone();
    let report = env.rt.block_on(upload.wait())?;
    Ok((
        report,
        tracked.tables,
        tracked.upto,
        pause,
        progress.quant_max_abs_error(),
    ))
}

fn restore_target(base: &ftrec_ckpt::Manifest) -> Result<MemShard> {
    let info = base
        .shard(ServerId(0))
        .context("the base holds no shard of server 0")?;
    Ok(MemShard::of(info, ShardMap::new(1)?))
}

/// Run one strategy over the whole workload, every checkpoint written and committed; returns
/// the run with its checkpoints (ids, depths and the digests the model had).
fn run_one(
    env: &Env<'_>,
    name: &str,
    mut strategy: Box<dyn Strategy>,
    resets: bool,
    filters: Option<Filters>,
) -> Result<RunOut> {
    let dir = env
        .root
        .join(format!("{name}{}", if resets { "-resets" } else { "" }));
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(&dir)?));
    let mut model = Model::new(env.work, env.args.seed);
    let chain = Arc::new(tokio::sync::Mutex::new(ServerChain::new(
        ServerId(0),
        ShardMap::new(1)?,
    )));
    // The extraction round of the newest chunk-list piece, running in the background.
    let mut round: Option<tokio::task::JoinHandle<ftrec_ckpt::Result<()>>> = None;
    let mut out = RunOut {
        name: name.to_string(),
        resets,
        fulls: 0,
        pieces: 0,
        stored_bytes: 0,
        stored_full_bytes: 0,
        pause_piece_s: 0.0,
        pause_piece_ci95_s: 0.0,
        pause_full_s: 0.0,
        save_piece_s: 0.0,
        save_piece_ci95_s: 0.0,
        save_full_s: 0.0,
        background_s: 0.0,
        extraction: None,
        quant_max_abs_error: None,
        decisions: Vec::new(),
        saved: Vec::new(),
        dir: dir.clone(),
    };
    let (mut pauses_p, mut pauses_f, mut saves_p, mut saves_f) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut committed: Option<CheckpointId> = None;
    let mut last_full: Option<CheckpointId> = None;
    let mut base_files = 0u64;
    let mut depth = 0u64;
    for s in 0..env.work.steps {
        model.step(env.work, s);
        let step = s + 1;
        let actions = strategy.on(&Event::StepDone {
            step,
            now_s: step as f64,
        });
        for a in actions {
            let (full, layout) = match a {
                Action::SaveFull { .. } => (true, None),
                Action::SavePiece { layout, .. } => (false, Some(Some(layout))),
                Action::SaveDelta { .. } => (false, Some(None)),
                _ => continue,
            };
            let kind = if full {
                CheckpointKind::Full
            } else {
                CheckpointKind::Delta
            };
            let id = deck::checkpoint_id(step, kind, 0);
            let t0 = Instant::now();
            let spec = layout
                .flatten()
                .map(|l| piece_spec(l, env.args.compact_below, filters))
                .transpose()?;
            let quant = spec.and_then(|p| p.quant);
            let (mut report, tracked, upto, pause, qerr) =
                stage(env, &ckpts, &mut model, &id, full, quant)?;
            // The previous piece's round, committed by this piece: waited for only if it is
            // still running (part of this save's time to commit).
            if let Some(h) = round.take() {
                env.rt.block_on(h)??;
            }
            if let Some(spec) = &spec {
                let done = env.rt.block_on(async {
                    let mut c = chain.lock().await;
                    c.finish_piece(&ckpts, &id, spec, &tracked, &report, qerr)
                        .await
                })?;
                report.bytes += done.files.iter().map(|f| f.size).sum::<u64>();
                report.files.extend(done.files);
                if let Some(st) = out.extraction.as_mut() {
                    st.add(&done.index.stats);
                } else if spec.scheme == PieceScheme::ChunkList {
                    out.extraction = Some(done.index.stats);
                }
                if spec.quant.is_some() {
                    out.quant_max_abs_error =
                        Some(out.quant_max_abs_error.unwrap_or(0.0).max(qerr));
                }
            }
            if full {
                env.rt.block_on(chain.lock()).set_base(id.clone(), &report);
            }
            let parent = if full {
                None
            } else if spec.is_some_and(|p| p.since_base()) {
                last_full.clone()
            } else {
                committed.clone()
            };
            let m = deck::shard_manifest(
                id.clone(),
                kind,
                step,
                parent,
                DataPosition::None,
                vec![report],
            );
            env.rt.block_on(ckpts.commit(&m))?;
            // Durable: the tracker forgets what this save holds (a differential's next one
            // saves every row since the full again).
            if !spec.is_some_and(|p| p.since_base()) {
                model.tracker.ack(CK, upto)?;
            }
            let save_s = t0.elapsed().as_secs_f64();
            // A chunk list's extraction round, off the commit path (IncrCP §4.3): in the
            // background while training goes on.
            if spec.is_some_and(|p| p.scheme == PieceScheme::ChunkList) {
                let (chain, ckpts) = (chain.clone(), ckpts.clone());
                round =
                    Some(env.rt.spawn(async move {
                        chain.lock().await.extract(&ckpts).await.map(|_| ())
                    }));
            }
            if full {
                last_full = Some(id.clone());
                out.fulls += 1;
                pauses_f.push(pause);
                saves_f.push(save_s);
                depth = 0;
            } else {
                out.pieces += 1;
                pauses_p.push(pause);
                saves_p.push(save_s);
                depth += 1;
            }
            committed = Some(id.clone());
            out.saved.push(Saved {
                id: id.clone(),
                depth,
                digest: model.digest(),
            });
            strategy.on(&Event::SaveFinished {
                checkpoint: CheckpointRef {
                    id: id.to_string(),
                    step,
                },
                cost_s: pause,
                bytes: m.data_bytes(),
            });
            if full {
                base_files = m.files.len() as u64;
            }
            if spec.is_some() {
                // What a restore of this newest state reads (IncrCP §4.5's inputs).
                let sums = env.rt.block_on(incr::piece_summaries(&ckpts, &m))?;
                if let Some(p) = sums.first() {
                    strategy.on(&Event::RestoreEstimate {
                        base_bytes: p.base_bytes,
                        base_files,
                        chain_bytes: p.restore_bytes,
                        chain_files: incr::newest_restore_files(p),
                    });
                }
            }
            if spec.is_none() && !full {
                // DECK: the merger's pass and garbage collection, off the training path.
                let t = Instant::now();
                let merger = Merger::new(ckpts.clone(), MergePolicy::default())?;
                env.rt.block_on(merger.run_once())?;
                env.rt
                    .block_on(deck::gc(&ckpts, &deck::GcOptions::default()))?;
                out.background_s += t.elapsed().as_secs_f64();
            }
        }
    }
    // The last piece's round: no piece follows to commit it; its files go.
    if let Some(h) = round.take() {
        env.rt.block_on(h)??;
        env.rt
            .block_on(async { chain.lock().await.discard_round(&ckpts).await });
    }
    if out.pieces > 0 && name.starts_with("incrcp") {
        let t = Instant::now();
        env.rt.block_on(incr::remove_dead_files(&ckpts))?;
        out.background_s += t.elapsed().as_secs_f64();
    }
    let sizes = env
        .rt
        .block_on(ftrec_ckpt::incr::store::stored_bytes(&ckpts))?;
    out.stored_bytes = sizes.values().sum();
    out.stored_full_bytes = sizes
        .iter()
        .filter(|(d, _)| d.ends_with("-full-a0"))
        .map(|(_, b)| b)
        .sum();
    out.pause_piece_s = mean(&pauses_p);
    out.pause_piece_ci95_s = ci95(&pauses_p);
    out.pause_full_s = mean(&pauses_f);
    out.save_piece_s = mean(&saves_p);
    out.save_piece_ci95_s = ci95(&saves_p);
    out.save_full_s = mean(&saves_f);
    out.decisions = strategy.decisions();
    Ok(out)
}

/// One timed recovery of one checkpoint.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Timed {
    /// Seconds restoring what lies over the base (IncrCP §5.1.4), page cache warm and cold.
    warm_s: f64,
    cold_s: f64,
    /// Of `warm_s`: reading (and for IncrCP folding) the piece indexes.
    index_warm_s: f64,
    /// Bytes and files read over the base, and rows written.
    bytes: u64,
    files: u64,
    rows_written: u64,
}

/// The recovery of one checkpoint (its position among the pieces, from 1) under each scheme
/// timed, in the order of [`TIMED`]; each figure the mean over the passes.
#[derive(Debug, Clone, Serialize)]
struct Point {
    checkpoint: usize,
    depth: u64,
    schemes: Vec<(String, Timed)>,
}

/// The schemes whose recoveries are timed (their runs without resets: the same chains).
const TIMED: [&str; 3] = ["incrcp", "incremental", "cnr"];

/// `n` of `len` positions evenly spaced, the first and the last included (all when `n` is 0
/// or at least `len`).
fn sample(len: usize, n: usize) -> Vec<usize> {
    if n == 0 || n >= len {
        return (0..len).collect();
    }
    if n == 1 {
        return vec![len - 1];
    }
    let mut v: Vec<usize> = (0..n)
        .map(|k| ((k * (len - 1)) as f64 / (n - 1) as f64).round() as usize)
        .collect();
    v.dedup();
    v
}

/// Restore checkpoint `s` of `run` into a fresh shard, check it against the digest the live
/// model had, and time what lies over the base.
fn restore_one(env: &Env<'_>, run: &RunOut, s: &Saved) -> Result<(f64, f64, Timed)> {
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(&run.dir)?));
    let chain = env
        .rt
        .block_on(incr::select(&ckpts, &RestoreAt::Id(s.id.clone())))?;
    let mut target = restore_target(&chain.base)?;
    let o = env
        .rt
        .block_on(incr::restore_server(&ckpts, &chain, &mut target))?;
    if shard_digest(&target) != s.digest {
        bail!(
            "{}: the restore of checkpoint {} differs from the model saved",
            run.name,
            s.id
        );
    }
    Ok((
        o.chain_s,
        o.index_s,
        Timed {
            bytes: o.bytes,
            files: o.files,
            rows_written: o.rows_written,
            ..Timed::default()
        },
    ))
}

/// What the timed passes gave for one set of runs.
#[derive(Debug, Clone, Serialize)]
struct Sweep {
    /// Each run's mean recovery time over the checkpoints timed, per pass: `[pass][run]`,
    /// (warm, cold).
    means: Vec<Vec<(f64, f64)>>,
    points: Vec<Point>,
    /// Whether every cold restore's page-cache drop was accepted by the kernel.
    cold_dropped: bool,
}

impl Sweep {
    /// Run `num`'s mean recovery time over run `den`'s, per pass.
    fn ratio(&self, num: usize, den: usize, cold: bool) -> Vec<f64> {
        let pick = |x: (f64, f64)| if cold { x.1 } else { x.0 };
        self.means
            .iter()
            .map(|p| pick(p[num]) / pick(p[den]).max(1e-12))
            .collect()
    }

    /// Run `r`'s mean recovery time, mean of the passes.
    fn mean_s(&self, r: usize, cold: bool) -> f64 {
        let v: Vec<f64> = self
            .means
            .iter()
            .map(|p| if cold { p[r].1 } else { p[r].0 })
            .collect();
        mean(&v)
    }
}

/// Time the recovery of the checkpoints at positions `which` of `runs` (the same positions in
/// each), `--passes` times, cold (every store file dropped from the page cache first) then
/// warm (right after); the runs take turns going first.
fn sweep(env: &Env<'_>, label: &'static str, runs: &[&RunOut], which: &[usize]) -> Result<Sweep> {
    let passes = env.args.passes.max(1);
    // [pass][point][run] = (warm, cold)
    let mut times = vec![vec![vec![(0.0, 0.0); runs.len()]; which.len()]; passes];
    let mut info = vec![vec![Timed::default(); runs.len()]; which.len()];
    let mut cold_dropped = true;
    let mut progress = crate::progress::Runs::new(label, passes);
    for (p, pass) in times.iter_mut().enumerate() {
        for (k, &i) in which.iter().enumerate() {
            for j in 0..runs.len() {
                let r = (j + k + p) % runs.len();
                let run = runs[r];
                let s = run
                    .saved
                    .get(i)
                    .with_context(|| format!("{} saved no checkpoint {}", run.name, i + 1))?;
                cold_dropped &= ftrec_ckpt::bench::drop_dir_cache(&run.dir);
                let (cold_s, _, t) = restore_one(env, run, s)?;
                let (warm_s, index_s, _) = restore_one(env, run, s)?;
                pass[k][r] = (warm_s, cold_s);
                info[k][r] = Timed {
                    index_warm_s: index_s,
                    ..t
                };
            }
        }
        progress.report(&format!("pass {}", p + 1), "done");
    }
    let means = times
        .iter()
        .map(|pass| {
            (0..runs.len())
                .map(|r| {
                    let w: Vec<f64> = pass.iter().map(|pt| pt[r].0).collect();
                    let c: Vec<f64> = pass.iter().map(|pt| pt[r].1).collect();
                    (mean(&w), mean(&c))
                })
                .collect()
        })
        .collect();
    let points = which
        .iter()
        .enumerate()
        .map(|(k, &i)| Point {
            checkpoint: i,
            depth: runs[0].saved[i].depth,
            schemes: runs
                .iter()
                .enumerate()
                .map(|(r, run)| {
                    let w: Vec<f64> = times.iter().map(|pass| pass[k][r].0).collect();
                    let c: Vec<f64> = times.iter().map(|pass| pass[k][r].1).collect();
                    (
                        run.name.clone(),
                        Timed {
                            warm_s: mean(&w),
                            cold_s: mean(&c),
                            ..info[k][r]
                        },
                    )
                })
                .collect(),
        })
        .collect();
    Ok(Sweep {
        means,
        points,
        cold_dropped,
    })
}

/// The storage-side spec of a strategy's piece layout (`filters`: the ablation's stages).
fn piece_spec(
    layout: PieceLayout,
    compact_below: Option<f64>,
    filters: Option<Filters>,
) -> Result<PieceSpec> {
    Ok(match layout {
        PieceLayout::Incremental => PieceSpec::incremental(),
        PieceLayout::Differential { quant_bits } => PieceSpec::differential(
            quant_bits
                .map(|b| {
                    QuantBits::from_bits(b as u32)
                        .with_context(|| format!("{b}-bit quantization (8 or 4)"))
                })
                .transpose()?,
        ),
        PieceLayout::ChunkList {
            threshold,
            range_rows,
            concat,
        } => PieceSpec {
            scheme: PieceScheme::ChunkList,
            quant: None,
            extract: ExtractConfig {
                threshold,
                range_rows,
                concat,
                compact_below: compact_below.unwrap_or(ExtractConfig::default().compact_below),
                filters: filters.unwrap_or_default(),
                ..ExtractConfig::default()
            },
        },
        other => bail!("piece layout {other:?} is not known to this benchmark"),
    })
}

/// IncrCP §5.3's ablation: IncrCP runs that differ in one switch, timed the same way.
#[derive(Debug, Serialize)]
struct Ablation {
    checkpoints: u64,
    variants: Vec<AblationRow>,
}

#[derive(Debug, Serialize)]
struct AblationRow {
    /// `base`, `if`, `if+bf`, `if+bf+af` at R; `concat-off`, `concat-on` at R = 0.
    variant: String,
    threshold: f64,
    save_piece_s: f64,
    save_piece_ci95_s: f64,
    stored_bytes: u64,
    /// Mean recovery over the checkpoints timed (warm, cold), and the files it read.
    recovery_warm_s: f64,
    recovery_cold_s: f64,
    mean_files: f64,
    extraction: Option<ftrec_ckpt::format::ExtractStats>,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct IncrBench {
    /// Naive incremental's mean recovery time over IncrCP's, the means over the checkpoints
    /// timed (IncrCP §5.2.1), page cache warm: the mean of the passes and its 95% interval.
    /// The runs without resets (the same chain under both).
    mean_recovery_speedup_vs_naive: f64,
    mean_recovery_speedup_vs_naive_ci95: f64,
    mean_recovery_speedup_vs_naive_cold: f64,
    mean_recovery_speedup_vs_naive_cold_ci95: f64,
    /// The same at the newest checkpoint only (IncrCP's cheapest recovery: row 0 alone).
    newest_recovery_speedup_vs_naive: f64,
    newest_recovery_speedup_vs_naive_cold: f64,
    /// The same, warm, with IncrCP's piece-index reads and fold left out (its chunk reads alone:
    /// the paper's implementation keeps the list in memory); from the means of the passes.
    mean_recovery_speedup_vs_naive_without_index: f64,
    /// IncrCP's mean recovery time over Check-N-Run's (the paper: 1.1-1.5x).
    mean_recovery_incrcp_over_cnr: f64,
    mean_recovery_incrcp_over_cnr_cold: f64,
    /// IncrCP's stored bytes over Check-N-Run's after every checkpoint, both with their
    /// base-reset rules (IncrCP §5.2.3; `_no_resets`: both without).
    storage_vs_cnr: Option<f64>,
    storage_vs_cnr_no_resets: f64,
    /// Checkpoints whose recovery was timed, of those written; `sampled`: an evenly spaced
    /// sample rather than every one.
    checkpoints_restored: usize,
    checkpoints_written: u64,
    sampled: bool,
    passes: usize,
    /// How the cold figures were made.
    cold_cache: String,
    /// Mean share of the model's rows one step updates (the paper's workload: 0.02%), and one
    /// checkpoint interval: what drives every ratio.
    rows_updated_per_step_share: f64,
    rows_updated_per_interval_share: f64,
    workload: WorkloadReport,
    runs: Vec<RunOut>,
    /// Per checkpoint timed: its depth and each scheme's recovery (means of the passes).
    points: Vec<Point>,
    ablation: Option<Ablation>,
}

#[derive(Debug, Serialize)]
struct WorkloadReport {
    preset: String,
    tables: usize,
    model_rows: u64,
    model_bytes: u64,
    dim: usize,
    zipf: f64,
    batch: usize,
    steps_per_ckpt: u64,
    checkpoints: u64,
}

/// The mean share of the model's rows a step updates, and an interval of `per` steps.
fn update_shares(w: &Workload, per: u64) -> (f64, f64) {
    let rows = w.model_rows().max(1) as f64;
    let (mut step_shares, mut interval_shares) = (Vec::new(), Vec::new());
    let mut union = std::collections::HashSet::new();
    for s in 0..w.steps {
        let ids = w.ids(s);
        step_shares.push(ids.iter().map(|v| v.len()).sum::<usize>() as f64 / rows);
        for (t, v) in ids.iter().enumerate() {
            union.extend(v.iter().map(|&i| (t, i)));
        }
        if (s + 1) % per == 0 {
            interval_shares.push(union.len() as f64 / rows);
            union.clear();
        }
    }
    (mean(&step_shares), mean(&interval_shares))
}

/// Run the benchmark.
pub fn run(a: IncrBenchArgs) -> Result<()> {
    if a.checkpoints == 0 || a.steps_per_ckpt == 0 || a.batch == 0 || a.passes == 0 {
        bail!("--checkpoints, --steps-per-ckpt, --batch and --passes must be at least 1");
    }
    if let Some(b) = a.quantize {
        if b != 8 && b != 4 {
            bail!("--quantize {b}: Check-N-Run quantizes to 8 or 4 bits");
        }
    }
    if !(a.cnr_reset_fraction.is_finite() && a.cnr_reset_fraction > 0.0) {
        bail!("--cnr-reset-fraction must be a positive number");
    }
    let work = Workload::new(&a)?;
    let (owned, root) = match &a.dir {
        Some(d) => {
            if d.exists() && std::fs::read_dir(d)?.next().is_some() {
                bail!("--dir {} is not empty", d.display());
            }
            (None, d.clone())
        }
        None => {
            let t = std::env::temp_dir().join(format!("ftrec-bench-incr-{}", std::process::id()));
            (Some(t.clone()), t)
        }
    };
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let env = Env {
        args: &a,
        work: &work,
        rt: &rt,
        root: root.clone(),
    };
    let result = bench(&env);
    if let Some(d) = owned {
        let _ = std::fs::remove_dir_all(d);
    } else if !a.keep {
        let _ = std::fs::remove_dir_all(&root);
    }
    let report = result?;
    print_summary(&report);
    if let Some(p) = &a.json {
        crate::write_json(p, &report)?;
    }
    Ok(())
}

fn incrcp(a: &IncrBenchArgs, reset: BaseReset, threshold: f64, concat: bool) -> Result<IncrCp> {
    Ok(IncrCp::new(IncrCpConfig {
        every: Interval::Steps(a.steps_per_ckpt),
        reset,
        threshold,
        range_rows: a.range_rows,
        concat,
        read: Default::default(),
    })?)
}

fn bench(env: &Env<'_>) -> Result<IncrBench> {
    let a = env.args;
    let work = env.work;
    let every = Interval::Steps(a.steps_per_ckpt);
    let cnr = |fraction, quant_bits| {
        Cnr::new(CnrConfig {
            every,
            reset_fraction: fraction,
            quant_bits,
        })
    };
    let mut runs = Vec::new();
    let total = 3
        + if a.no_reset_runs { 0 } else { 2 }
        + usize::from(a.quantize.is_some())
        + usize::from(!a.no_deck);
    let mut progress = crate::progress::Runs::new("bench incremental: writes", total);
    let mut go = |name: &str, s: Box<dyn Strategy>, resets: bool| -> Result<()> {
        let label = format!("{name}{}", if resets { " (resets on)" } else { "" });
        let r = run_one(env, name, s, resets, None)?;
        runs.push(r);
        progress.report(&label, "written");
        Ok(())
    };
    let all = BaseReset::Never;
    go(
        "incrcp",
        Box::new(incrcp(a, all, a.threshold, true)?),
        false,
    )?;
    go(
        "incremental",
        Box::new(Incremental::new(every, None)?),
        false,
    )?;
    go("cnr", Box::new(cnr(None, None)?), false)?;
    if !a.no_reset_runs {
        go(
            "incrcp",
            Box::new(incrcp(a, BaseReset::Auto, a.threshold, true)?),
            true,
        )?;
        go(
            "cnr",
            Box::new(cnr(Some(a.cnr_reset_fraction), None)?),
            true,
        )?;
    }
    if let Some(b) = a.quantize {
        go(
            &format!("cnr-q{b}"),
            Box::new(cnr(None, Some(b as u8))?),
            false,
        )?;
    }
    if !a.no_deck {
        go(
            "deck",
            Box::new(Deck::new(DeckConfig {
                delta_every: every,
                full_every_deltas: None,
            })?),
            false,
        )?;
    }
    let find = |n: &str, resets: bool| runs.iter().find(|r| r.name == n && r.resets == resets);
    let timed: Vec<&RunOut> = TIMED
        .iter()
        .map(|n| find(n, false).with_context(|| format!("no {n} run")))
        .collect::<Result<_>>()?;
    // The pieces: position 0 is the first full.
    let pieces = timed[0].saved.len().saturating_sub(1);
    let which: Vec<usize> = sample(pieces, a.sample as usize)
        .into_iter()
        .map(|i| i + 1)
        .collect();
    let sw = sweep(env, "bench incremental: recoveries", &timed, &which)?;
    let storage = |resets| {
        find("incrcp", resets)
            .zip(find("cnr", resets))
            .map(|(i, c)| i.stored_bytes as f64 / c.stored_bytes.max(1) as f64)
    };
    let newest = sw.points.last().context("no checkpoint timed")?;
    let t = |r: usize| newest.schemes[r].1;
    let ablation = if a.ablation {
        Some(ablation(env)?)
    } else {
        None
    };
    let (step_share, interval_share) = update_shares(work, a.steps_per_ckpt);
    let model = Model::new(work, a.seed);
    let (w, c) = (sw.ratio(1, 0, false), sw.ratio(1, 0, true));
    let point_mean = |f: &dyn Fn(&Point) -> f64| mean(&sw.points.iter().map(f).collect::<Vec<_>>());
    let without_index = point_mean(&|p| p.schemes[1].1.warm_s)
        / point_mean(&|p| p.schemes[0].1.warm_s - p.schemes[0].1.index_warm_s).max(1e-12);
    Ok(IncrBench {
        mean_recovery_speedup_vs_naive: mean(&w),
        mean_recovery_speedup_vs_naive_ci95: ci95(&w),
        mean_recovery_speedup_vs_naive_cold: mean(&c),
        mean_recovery_speedup_vs_naive_cold_ci95: ci95(&c),
        newest_recovery_speedup_vs_naive: t(1).warm_s / t(0).warm_s.max(1e-12),
        mean_recovery_speedup_vs_naive_without_index: without_index,
        newest_recovery_speedup_vs_naive_cold: t(1).cold_s / t(0).cold_s.max(1e-12),
        mean_recovery_incrcp_over_cnr: mean(&sw.ratio(0, 2, false)),
        mean_recovery_incrcp_over_cnr_cold: mean(&sw.ratio(0, 2, true)),
        storage_vs_cnr: storage(true),
        storage_vs_cnr_no_resets: storage(false).unwrap_or(f64::NAN),
        checkpoints_restored: which.len(),
        checkpoints_written: pieces as u64,
        sampled: which.len() < pieces,
        passes: a.passes,
        cold_cache: if sw.cold_dropped {
            "every file of the store dropped from the page cache (posix_fadvise DONTNEED) \
             before each cold restore"
                .into()
        } else {
            "posix_fadvise DONTNEED was refused for some file: the cold figures may be warm".into()
        },
        rows_updated_per_step_share: step_share,
        rows_updated_per_interval_share: interval_share,
        workload: WorkloadReport {
            preset: a.preset.clone(),
            tables: work.table_rows.len(),
            model_rows: work.model_rows(),
            model_bytes: model.bytes(),
            dim: work.preset.dim,
            zipf: a.zipf.unwrap_or(work.preset.zipf_exponent),
            batch: a.batch,
            steps_per_ckpt: a.steps_per_ckpt,
            checkpoints: a.checkpoints,
        },
        runs,
        points: sw.points,
        ablation,
    })
}

/// IncrCP §5.3: the filter stages added one by one at R (Fig. 14a) and concatenation off and
/// on at R = 0 (Fig. 14b), each an IncrCP run without resets over the first 50 checkpoints
/// (§5.3.1 averages over 50), timed as the main runs.
fn ablation(env: &Env<'_>) -> Result<Ablation> {
    let a = env.args;
    let n = a.checkpoints.min(50);
    let short = IncrBenchArgs {
        checkpoints: n,
        ..a.clone()
    };
    let work = Workload::new(&short)?;
    let senv = Env {
        args: &short,
        work: &work,
        rt: env.rt,
        root: env.root.join("ablation"),
    };
    let f = |range, bloom, actual| Filters {
        range,
        bloom,
        actual,
    };
    let variants: [(&str, f64, bool, Filters); 6] = [
        ("base", a.threshold, true, f(false, false, false)),
        ("if", a.threshold, true, f(true, false, false)),
        ("if+bf", a.threshold, true, f(true, true, false)),
        ("if+bf+af", a.threshold, true, f(true, true, true)),
        ("concat-off", 0.0, false, f(true, true, true)),
        ("concat-on", 0.0, true, f(true, true, true)),
    ];
    let mut progress = crate::progress::Runs::new("bench incremental: ablation", variants.len());
    let mut runs = Vec::new();
    for (name, r, concat, filters) in variants {
        let s = incrcp(a, BaseReset::Never, r, concat)?;
        runs.push(run_one(
            &senv,
            &format!("incrcp-{name}"),
            Box::new(s),
            false,
            Some(filters),
        )?);
        progress.report(name, "written");
    }
    let refs: Vec<&RunOut> = runs.iter().collect();
    let pieces = runs[0].saved.len().saturating_sub(1);
    let which: Vec<usize> = sample(pieces, a.sample as usize)
        .into_iter()
        .map(|i| i + 1)
        .collect();
    let sw = sweep(
        &senv,
        "bench incremental: ablation recoveries",
        &refs,
        &which,
    )?;
    let variants = variants
        .iter()
        .zip(&runs)
        .enumerate()
        .map(|(r, ((name, th, _, _), run))| AblationRow {
            variant: name.to_string(),
            threshold: *th,
            save_piece_s: run.save_piece_s,
            save_piece_ci95_s: run.save_piece_ci95_s,
            stored_bytes: run.stored_bytes,
            recovery_warm_s: sw.mean_s(r, false),
            recovery_cold_s: sw.mean_s(r, true),
            mean_files: mean(
                &sw.points
                    .iter()
                    .map(|p| p.schemes[r].1.files as f64)
                    .collect::<Vec<_>>(),
            ),
            extraction: run.extraction,
        })
        .collect();
    Ok(Ablation {
        checkpoints: n,
        variants,
    })
}

fn print_summary(r: &IncrBench) {
    let w = &r.workload;
    println!(
        "workload: {} tables, {} rows ({:.1} MiB), dim {}, Zipf {}, batch {}, a checkpoint every \
         {} steps, {} checkpoints; a step updates {:.3}% of the rows (the paper's: 0.02%), an \
         interval {:.2}%",
        w.tables,
        w.model_rows,
        w.model_bytes as f64 / (1 << 20) as f64,
        w.dim,
        w.zipf,
        w.batch,
        w.steps_per_ckpt,
        w.checkpoints,
        100.0 * r.rows_updated_per_step_share,
        100.0 * r.rows_updated_per_interval_share,
    );
    println!(
        "{:<14} {:>6} {:>6} {:>12} {:>18} {:>18} {:>10}",
        "strategy", "fulls", "pieces", "stored MiB", "piece pause ms", "piece save ms", "full ms"
    );
    for run in &r.runs {
        println!(
            "{:<14} {:>6} {:>6} {:>12.2} {:>18} {:>18} {:>10.2}",
            format!("{}{}", run.name, if run.resets { "+reset" } else { "" }),
            run.fulls,
            run.pieces,
            run.stored_bytes as f64 / (1 << 20) as f64,
            format!(
                "{:.2} ±{:.2}",
                run.pause_piece_s * 1e3,
                run.pause_piece_ci95_s * 1e3
            ),
            format!(
                "{:.2} ±{:.2}",
                run.save_piece_s * 1e3,
                run.save_piece_ci95_s * 1e3
            ),
            run.pause_full_s * 1e3,
        );
    }
    println!(
        "recovery over the base, ms (warm / cold), mean of {} pass(es), by checkpoint{}:",
        r.passes,
        if r.points.len() > 16 {
            " (16 of those timed; all in the JSON)"
        } else {
            ""
        }
    );
    println!(
        "{:>10} {:>6} {:>18} {:>18} {:>18}",
        "checkpoint", "depth", "incrcp", "incremental", "cnr"
    );
    for i in sample(r.points.len(), 16) {
        let p = &r.points[i];
        let cell = |k: usize| {
            p.schemes.get(k).map_or("-".into(), |(_, t)| {
                format!("{:.2} / {:.2}", t.warm_s * 1e3, t.cold_s * 1e3)
            })
        };
        println!(
            "{:>10} {:>6} {:>18} {:>18} {:>18}",
            p.checkpoint,
            p.depth,
            cell(0),
            cell(1),
            cell(2)
        );
    }
    println!(
        "mean_recovery_speedup_vs_naive {:.2} ±{:.2} warm, {:.2} ±{:.2} cold (mean over {} of {} \
         checkpoints{}; 95% intervals over the passes)",
        r.mean_recovery_speedup_vs_naive,
        r.mean_recovery_speedup_vs_naive_ci95,
        r.mean_recovery_speedup_vs_naive_cold,
        r.mean_recovery_speedup_vs_naive_cold_ci95,
        r.checkpoints_restored,
        r.checkpoints_written,
        if r.sampled {
            ", an evenly spaced sample"
        } else {
            ""
        }
    );
    println!(
        "newest_recovery_speedup_vs_naive {:.2} warm, {:.2} cold (the newest checkpoint only); \
         mean {:.2} warm with IncrCP's piece-index reads left out; IncrCP / Check-N-Run mean recovery {:.2} \
         warm, {:.2} cold",
        r.newest_recovery_speedup_vs_naive,
        r.newest_recovery_speedup_vs_naive_cold,
        r.mean_recovery_speedup_vs_naive_without_index,
        r.mean_recovery_incrcp_over_cnr,
        r.mean_recovery_incrcp_over_cnr_cold,
    );
    println!(
        "storage_vs_cnr {} with both reset rules, {:.3} without",
        r.storage_vs_cnr
            .map_or("-".to_string(), |v| format!("{v:.3}")),
        r.storage_vs_cnr_no_resets
    );
    println!("cold: {}", r.cold_cache);
    if let Some(ab) = &r.ablation {
        println!(
            "ablation (IncrCP §5.3, {} checkpoints; normalized to base):",
            ab.checkpoints
        );
        println!(
            "{:<12} {:>5} {:>16} {:>16} {:>16} {:>10} {:>12}",
            "variant", "R", "save ms", "recovery warm", "recovery cold", "files", "stored MiB"
        );
        let b = &ab.variants[0];
        for v in &ab.variants {
            println!(
                "{:<12} {:>5} {:>16} {:>16} {:>16} {:>10.1} {:>12.2}",
                v.variant,
                v.threshold,
                format!(
                    "{:.2} ({:.2})",
                    v.save_piece_s * 1e3,
                    v.save_piece_s / b.save_piece_s.max(1e-12)
                ),
                format!(
                    "{:.2} ({:.2})",
                    v.recovery_warm_s * 1e3,
                    v.recovery_warm_s / b.recovery_warm_s.max(1e-12)
                ),
                format!(
                    "{:.2} ({:.2})",
                    v.recovery_cold_s * 1e3,
                    v.recovery_cold_s / b.recovery_cold_s.max(1e-12)
                ),
                v.mean_files,
                v.stored_bytes as f64 / (1 << 20) as f64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_evenly_spaced_with_both_ends() {
        assert_eq!(sample(150, 0), (0..150).collect::<Vec<_>>());
        assert_eq!(sample(5, 9), vec![0, 1, 2, 3, 4]);
        let s = sample(150, 15);
        assert_eq!(s.len(), 15);
        assert_eq!((s[0], s[14]), (0, 149));
        assert!(
            s.windows(2).all(|w| (10..=11).contains(&(w[1] - w[0]))),
            "{s:?}"
        );
        assert_eq!(sample(10, 1), vec![9]);
    }

    #[test]
    fn ci95_of_constant_is_zero_and_widens_with_spread() {
        assert_eq!(ci95(&[2.0, 2.0, 2.0]), 0.0);
        assert_eq!(ci95(&[1.0]), 0.0);
        let c = ci95(&[1.0, 2.0, 3.0]);
        // t(2) = 4.303, s = 1, n = 3.
        assert!((c - 4.303 / 3f64.sqrt()).abs() < 1e-9, "{c}");
    }
}

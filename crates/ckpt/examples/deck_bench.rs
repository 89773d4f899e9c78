//! DECK benchmarks on a scaled-down Kaggle model (one server holding every table).
//!
//! ```text
//! cargo run --release -p ftrec-ckpt --example deck_bench -- [--dir PATH] [--scale 16] [--steps-per-delta 20] [--step-ms 214]
//! ```
//!
//! Table sizes are the Kaggle cardinalities divided by `--scale`, dim 16, Adagrad state. Every
//! step touches the rows a 2048-sample batch touches (26 skewed ids per sample, deduplicated
//! per table). Reports, all measured in the same run:
//! - tracking cost per step (track + compact) against the step's sparse optimizer work, and
//!   against a whole training step of `--step-ms` milliseconds (pull + MLP + push: this example
//!   runs no MLP, so the step time is an input; measure it with
//!   `ftrec bench train --preset small`, whose batch of 2048 and dim 16 match this example);
//! - pause (copy-out) per delta vs per full checkpoint, and the checkpoint-frequency ratio at
//!   equal pause overhead;
//! - staging peak memory for two model sizes at one chunk size;
//! - merge throughput; recovery time from full + k deltas, k = 1, 5, 20.

use std::sync::Arc;
use std::time::Instant;

use ftrec_ckpt::deck::{
    self, checkpoint_id, staging, ConsumerId, MemGauge, MergePolicy, Merger, RestoreAt,
    RowSelection, Source, SourceTable, StagingOptions, TablesWriter, Tracker,
};
use ftrec_ckpt::snapshot::RowIds;
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition, LocalStore};
use ftrec_core::preset::KAGGLE_TABLE_ROWS;
use ftrec_core::rng::SplitMix;
use ftrec_core::{
    DenseParams, EmbeddingTable, Optimizer, OptimizerKind, RowLayout, ServerId, TableId,
};

const CK: ConsumerId = ConsumerId(0);
const DIM: usize = 16;
const BATCH: usize = 2048;

struct Model {
    tables: Vec<EmbeddingTable>,
    dense: DenseParams,
    opt: Optimizer,
    tracker: Tracker,
    rng: SplitMix,
}

impl Model {
    fn new(scale: u64) -> Model {
        let opt = Optimizer::new(OptimizerKind::Adagrad, 0.01);
        let layout = RowLayout::new(DIM, opt.state_words(DIM));
        let tables = KAGGLE_TABLE_ROWS
            .iter()
            .enumerate()
            .map(|(t, &r)| {
                EmbeddingTable::new_init(TableId(t as u32), (r / scale).max(1), layout, 1, 0.1)
            })
            .collect();
        let mut tracker = Tracker::new();
        tracker.register(CK).unwrap();
        Model {
            tables,
            dense: DenseParams::new(vec![0.01; 600_000], &opt),
            opt,
            tracker,
            rng: SplitMix::new(7),
        }
    }

    fn bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.bytes()).sum()
    }

    /// One step; returns seconds of (sparse optimizer work, `track` on the update path,
    /// `compact`, which DECK runs off the critical path, overlapped with communication).
    fn step(&mut self) -> (f64, f64, f64) {
        let mut per_table: Vec<Vec<u64>> = vec![Vec::new(); self.tables.len()];
        for _ in 0..BATCH {
            for (t, ids) in per_table.iter_mut().enumerate() {
                let rows = self.tables[t].rows();
                // Skewed ids: cubing a uniform draw makes small ids hot.
                let u = self.rng.next_f64();
                ids.push(((u * u * u) * rows as f64) as u64 % rows);
            }
        }
        let grad = vec![0.001f32; DIM];
        let mut work = 0.0;
        let mut track = 0.0;
        for (t, mut ids) in per_table.into_iter().enumerate() {
            let a = Instant::now();
            ids.sort_unstable();
            ids.dedup();
            for &r in &ids {
                self.opt.apply(self.tables[t].row_mut(r), DIM, &grad);
            }
            work += a.elapsed().as_secs_f64();
            let b = Instant::now();
            self.tracker.track(TableId(t as u32), &ids);
            track += b.elapsed().as_secs_f64();
        }
        let b = Instant::now();
        self.tracker.compact();
        (work, track, b.elapsed().as_secs_f64())
    }
}

struct Saved {
    pause_s: f64,
    bytes: u64,
    id: CheckpointId,
}

/// Where a save goes.
struct Target<'a> {
    rt: &'a tokio::runtime::Runtime,
    ckpts: &'a Checkpoints,
    staging_dir: &'a std::path::Path,
    gauge: &'a Arc<MemGauge>,
}

fn save(
    t: &Target<'_>,
    m: &mut Model,
    step: u64,
    kind: CheckpointKind,
    parent: Option<CheckpointId>,
) -> Saved {
    let Target {
        rt,
        ckpts,
        staging_dir,
        gauge,
    } = *t;
    let id = checkpoint_id(step, kind, 0);
    let tracked = m.tracker.take(CK).unwrap();
    let opts = StagingOptions {
        chunk_bytes: 4 << 20,
        staging_dir: staging_dir.to_path_buf(),
        limit_bytes: None,
    };
    let (sink, up) = staging::start(
        ckpts.clone(),
        id.clone(),
        ServerId(0),
        &opts,
        gauge.clone(),
        rt.handle(),
    )
    .unwrap();
    let src = Source {
        server: ServerId(0),
        tables: m
            .tables
            .iter()
            .map(|t| SourceTable {
                table: t.id,
                layout: t.layout(),
                data: t.as_slice(),
                ids: RowIds::Identity,
                rows: match kind {
                    CheckpointKind::Full => RowSelection::All,
                    _ => RowSelection::Only(tracked.of(t.id)),
                },
            })
            .collect(),
        dense: Some((0, &m.dense)),
    };
    let a = Instant::now();
    sink.copy_out(&src).unwrap();
    let pause_s = a.elapsed().as_secs_f64();
    let rep = rt.block_on(up.wait()).unwrap();
    let bytes = rep.bytes;
    let man = deck::shard_manifest(
        id.clone(),
        kind,
        step,
        parent,
        DataPosition::None,
        vec![rep],
    );
    rt.block_on(ckpts.commit(&man)).unwrap();
    m.tracker.ack(CK, tracked.upto).unwrap();
    Saved { pause_s, bytes, id }
}

fn main() {
    let mut dir = std::env::temp_dir().join("ftrec-deck-bench");
    let mut scale: u64 = 16;
    let mut steps_per_delta: u64 = 20;
    let mut step_ms: f64 = 214.0;
    let mut args = std::env::args().skip(1);
    while let Some(f) = args.next() {
        let v = args.next().unwrap_or_else(|| panic!("{f} needs a value"));
        match f.as_str() {
            "--dir" => dir = v.into(),
            "--scale" => scale = v.parse().expect("--scale N"),
            "--steps-per-delta" => steps_per_delta = v.parse().expect("--steps-per-delta N"),
            "--step-ms" => step_ms = v.parse().expect("--step-ms MILLISECONDS"),
            _ => panic!("unknown flag {f}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ckpts = Checkpoints::new(Arc::new(LocalStore::new(dir.join("store")).unwrap()));
    let staging_dir = dir.join("staging");
    let gauge = MemGauge::new();
    let mut m = Model::new(scale);
    println!(
        "model: 26 Kaggle tables / {scale} = {} rows, dim {DIM}, Adagrad: {:.1} MiB with state",
        m.tables.iter().map(|t| t.rows()).sum::<u64>(),
        m.bytes() as f64 / (1 << 20) as f64
    );

    // Full checkpoint: the pause is the copy-out of every row.
    let full = save(
        &Target {
            rt: &rt,
            ckpts: &ckpts,
            staging_dir: &staging_dir,
            gauge: &gauge,
        },
        &mut m,
        0,
        CheckpointKind::Full,
        None,
    );
    let peak_full_large = gauge.peak_bytes();
    println!(
        "full: pause {:.3} s, {:.1} MiB",
        full.pause_s,
        full.bytes as f64 / (1 << 20) as f64
    );

    // Deltas, tracking measured every step.
    let (mut work, mut track, mut compact) = (0.0, 0.0, 0.0);
    let mut steps = 0u64;
    let mut delta_pauses = Vec::new();
    let mut delta_bytes = Vec::new();
    let mut parent = full.id.clone();
    let mut ids = Vec::new();
    for k in 1..=20u64 {
        for _ in 0..steps_per_delta {
            let (w, t, c) = m.step();
            work += w;
            track += t;
            compact += c;
            steps += 1;
        }
        let d = save(
            &Target {
                rt: &rt,
                ckpts: &ckpts,
                staging_dir: &staging_dir,
                gauge: &gauge,
            },
            &mut m,
            k * steps_per_delta,
            CheckpointKind::Delta,
            Some(parent.clone()),
        );
        delta_pauses.push(d.pause_s);
        delta_bytes.push(d.bytes);
        parent = d.id.clone();
        ids.push(d.id);
    }
    let mean_pause = delta_pauses.iter().sum::<f64>() / delta_pauses.len() as f64;
    let mean_bytes = delta_bytes.iter().sum::<u64>() as f64 / delta_bytes.len() as f64;
    let per = |x: f64| x / steps as f64 * 1e6;
    println!(
        "tracking per step: track {:.1} us (update path), compact {:.1} us (off path); \
         sparse optimizer work {:.1} us; share of (work + tracking): track {:.2}%, track + compact {:.2}%",
        per(track),
        per(compact),
        per(work),
        100.0 * track / (work + track + compact),
        100.0 * (track + compact) / (work + track + compact)
    );
    println!(
        "share of a {step_ms:.0} ms training step (--step-ms): track {:.3}%, track + compact {:.3}%; \
         tracker memory after the last delta: {} ids, {:.2} MiB of dedup bitmaps",
        100.0 * per(track) / (step_ms * 1e3),
        100.0 * per(track + compact) / (step_ms * 1e3),
        m.tracker.stats().distinct_ids,
        m.tracker.stats().dedup_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "delta every {steps_per_delta} steps: pause {:.4} s mean, {:.2} MiB mean",
        mean_pause,
        mean_bytes / (1 << 20) as f64
    );
    println!(
        "pause ratio full/delta = {:.1}x: checkpoint frequency DECK sustains at the overhead of full checkpoints",
        full.pause_s / mean_pause
    );

    // Recovery time from full + k deltas.
    for k in [1usize, 5, 20] {
        let chain = rt
            .block_on(deck::select_chain(
                &ckpts,
                &RestoreAt::Id(ids[k - 1].clone()),
                false,
            ))
            .unwrap();
        let mut blank = Model::new(scale);
        let mut w = TablesWriter {
            server: ServerId(0),
            tables: blank
                .tables
                .iter_mut()
                .map(|t| (t, RowIds::Identity))
                .collect(),
            dense: Some((0, &mut blank.dense)),
        };
        let a = Instant::now();
        let st = rt
            .block_on(deck::restore_chain(&ckpts, &chain, &mut w))
            .unwrap();
        let s = a.elapsed().as_secs_f64();
        println!(
            "recovery full + {k} deltas: {:.3} s ({} files, {:.1} MiB read, {:.0} MiB/s)",
            s,
            st.files_read,
            st.bytes_read as f64 / (1 << 20) as f64,
            st.bytes_read as f64 / (1 << 20) as f64 / s
        );
    }

    // Merge throughput: hierarchical merging of the 20 deltas with s = 2.
    let a = Instant::now();
    let rep = rt
        .block_on(
            Merger::new(ckpts.clone(), MergePolicy::default())
                .unwrap()
                .run_once(),
        )
        .unwrap();
    let s = a.elapsed().as_secs_f64();
    println!(
        "merge (s = 2): {} checkpoints written in {:.3} s, {:.1} MiB read at {:.0} MiB/s",
        rep.written.len(),
        s,
        rep.stats.bytes_read as f64 / (1 << 20) as f64,
        rep.stats.bytes_read as f64 / (1 << 20) as f64 / s
    );

    // Staging peak memory at one chunk size for a smaller model.
    let small = Model::new(scale * 8);
    let g2 = MemGauge::new();
    let ck2 = Checkpoints::new(Arc::new(LocalStore::new(dir.join("store-small")).unwrap()));
    let mut small = small;
    save(
        &Target {
            rt: &rt,
            ckpts: &ck2,
            staging_dir: &staging_dir,
            gauge: &g2,
        },
        &mut small,
        0,
        CheckpointKind::Full,
        None,
    );
    println!(
        "staging peak memory, 4 MiB chunks: {:.1} MiB for a {:.0} MiB model, {:.1} MiB for a {:.0} MiB model",
        g2.peak_bytes() as f64 / (1 << 20) as f64,
        small.bytes() as f64 / (1 << 20) as f64,
        peak_full_large as f64 / (1 << 20) as f64,
        m.bytes() as f64 / (1 << 20) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}

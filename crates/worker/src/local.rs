//! The single-process trainer.
//!
//! One step: pool the batch's embedding bags from the in-memory tables, run the dense model
//! forward and backward, scatter the pooled gradient to the looked-up rows (summed per row in
//! sample order), apply the sparse optimizer once per touched row and the dense optimizer once
//! per block. Every reduction has a fixed order, so the run is a pure function of its
//! [`TrainConfig`] and the final [`ftrec_core::ModelDigest`] is the oracle the distributed and
//! fault-tolerant runs are compared with.
//!
//! Batches come from a [`crate::feed::Feed`] (a prefetch thread, or synthetic batches made in
//! chunks by whichever thread has time); the order is the source's, so the feed changes timing
//! only.

use std::time::Instant;

use ftrec_core::{Batch, EmbeddingTable, ModelDigest, RowLayout, SparseGradAccumulator, TableId};
use ftrec_data::{BatchSource, EvalSet, Position};
use ftrec_model::{metrics, pool_sum_tables, update_tables, Dlrm, DlrmConfig, Workspace};
use serde::{Deserialize, Serialize};

use crate::config::{DataSpec, TrainConfig};
use crate::feed::Feed;
use crate::WorkerError;

/// Embedding tables + dense model + reusable buffers.
pub struct LocalTrainer {
    cfg: TrainConfig,
    tables: Vec<EmbeddingTable>,
    model: Dlrm,
    ws: Workspace,
    accs: Vec<SparseGradAccumulator>,
    pooled: Vec<f32>,
    step: u64,
    /// Seconds spent in each part of the step, for the report.
    pub timing: StepTiming,
}

/// Where a step's time goes (seconds, summed over the run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTiming {
    /// Waiting for the next batch (zero when prefetching keeps up).
    pub data_wait_s: f64,
    pub pool_s: f64,
    pub mlp_s: f64,
    pub sparse_update_s: f64,
    pub dense_update_s: f64,
    /// CPU time the data thread spent making the run's batches, by its own clock (0 where
    /// the platform has none): work that shares the cores with the steps.
    #[serde(default)]
    pub data_cpu_s: f64,
}

/// One gradient accumulator a table, each with a dense row index (the tables live here, so
/// their rows are known and the index costs 4 bytes a row next to the row's 64 or more).
fn accumulators(p: &ftrec_core::Preset) -> Vec<SparseGradAccumulator> {
    p.table_rows
        .iter()
        .map(|&rows| SparseGradAccumulator::with_dense_index(p.dim, rows))
        .collect()
}

impl LocalTrainer {
    /// Fresh tables and model, initialised from `cfg.seed`.
    pub fn new(cfg: &TrainConfig) -> Result<LocalTrainer, WorkerError> {
        cfg.validate()?;
        let p = &cfg.preset;
        let layout = RowLayout::new(p.dim, cfg.sparse_optimizer.state_words(p.dim));
        let tables = p
            .table_rows
            .iter()
            .enumerate()
            .map(|(t, &rows)| {
                EmbeddingTable::new_init(TableId(t as u32), rows, layout, cfg.seed, p.init_scale)
            })
            .collect();
        let model = Dlrm::new(DlrmConfig::from_preset(p), cfg.seed, &cfg.dense_optimizer)?;
        let ws = model.workspace(cfg.batch, cfg.threads)?;
        Ok(LocalTrainer {
            cfg: cfg.clone(),
            accs: accumulators(p),
            pooled: Vec::new(),
            tables,
            model,
            ws,
            step: 0,
            timing: StepTiming::default(),
        })
    }

    /// A trainer over existing tables and dense parameters (a restored checkpoint), at step
    /// `step`. `tables[t]` must be table `t` with the preset's rows, dim and the sparse
    /// optimizer's state width; `dense` must have the preset's parameter count and the dense
    /// optimizer's state width. A mismatch is an error naming it.
    pub fn from_state(
        cfg: &TrainConfig,
        tables: Vec<EmbeddingTable>,
        dense: ftrec_core::DenseParams,
        step: u64,
    ) -> Result<LocalTrainer, WorkerError> {
        cfg.validate()?;
        let p = &cfg.preset;
        let layout = RowLayout::new(p.dim, cfg.sparse_optimizer.state_words(p.dim));
        if tables.len() != p.table_rows.len() {
            return Err(WorkerError::Config(format!(
                "{} tables given, the model has {}",
                tables.len(),
                p.table_rows.len()
            )));
        }
        for (t, (table, &rows)) in tables.iter().zip(&p.table_rows).enumerate() {
            if table.id != TableId(t as u32) || table.rows() != rows || table.layout() != layout {
                return Err(WorkerError::Config(format!(
                    "table {} at index {t} has {} rows of {:?}; the model's table {t} has {rows} \
                     rows of {layout:?} ({} optimizer)",
                    table.id.0,
                    table.rows(),
                    table.layout(),
                    cfg.sparse_optimizer.kind
                )));
            }
        }
        let want_state = dense.blocks() * cfg.dense_optimizer.state_words(ftrec_core::DENSE_BLOCK);
        if dense.state.len() != want_state {
            return Err(WorkerError::Config(format!(
                "dense optimizer state of {} words; {} needs {want_state}",
                dense.state.len(),
                cfg.dense_optimizer.kind
            )));
        }
        let model = Dlrm::from_params(DlrmConfig::from_preset(p), dense)?;
        let ws = model.workspace(cfg.batch, cfg.threads)?;
        Ok(LocalTrainer {
            cfg: cfg.clone(),
            accs: accumulators(p),
            pooled: Vec::new(),
            tables,
            model,
            ws,
            step,
            timing: StepTiming::default(),
        })
    }

    /// Steps applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn tables(&self) -> &[EmbeddingTable] {
        &self.tables
    }

    pub fn model(&self) -> &Dlrm {
        &self.model
    }

    /// Bytes of parameters and optimizer state held (tables + dense).
    pub fn model_bytes(&self) -> u64 {
        let dense = self.model.params();
        self.tables.iter().map(|t| t.bytes()).sum::<u64>()
            + 4 * (dense.values.len() + dense.state.len()) as u64
    }

    /// Check `batch` against the preset and pool its bags into `self.pooled`.
    fn pool(&mut self, batch: &Batch) -> Result<(), WorkerError> {
        let p = &self.cfg.preset;
        batch.validate(p.dense_features(), &p.table_rows)?;
        self.pooled
            .resize(batch.size * p.table_rows.len() * p.dim, 0.0);
        pool_sum_tables(
            &batch.sparse,
            batch.size,
            &self.tables,
            &mut self.pooled,
            self.cfg.threads,
        )?;
        Ok(())
    }

    /// One training step on `batch`; returns the batch's mean loss. It runs on the math pool
    /// ([`ftrec_model::on_pool`]).
    pub fn step(&mut self, batch: &Batch) -> Result<f64, WorkerError> {
        ftrec_model::on_pool(|| self.step_here(batch))
    }

    fn step_here(&mut self, batch: &Batch) -> Result<f64, WorkerError> {
        let t0 = Instant::now();
        self.pool(batch)?;
        let t1 = Instant::now();
        let loss =
            self.model
                .forward_backward(&mut self.ws, &batch.dense, &self.pooled, &batch.labels)?;
        let t2 = Instant::now();

        update_tables(
            &batch.sparse,
            batch.size,
            self.ws.grad_pooled(),
            &mut self.tables,
            &mut self.accs,
            &self.cfg.sparse_optimizer,
            self.cfg.threads,
        )?;
        let t3 = Instant::now();
        self.model.apply_gradients(
            &self.cfg.dense_optimizer,
            self.ws.grad_params(),
            self.cfg.threads,
        )?;
        let t4 = Instant::now();

        self.timing.pool_s += (t1 - t0).as_secs_f64();
        self.timing.mlp_s += (t2 - t1).as_secs_f64();
        self.timing.sparse_update_s += (t3 - t2).as_secs_f64();
        self.timing.dense_update_s += (t4 - t3).as_secs_f64();
        self.step += 1;
        Ok(loss)
    }

    /// Click probabilities for `batch` (no update), on the math pool like a step.
    pub fn predict(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), WorkerError> {
        ftrec_model::on_pool(|| {
            self.pool(batch)?;
            self.model
                .predict(&mut self.ws, &batch.dense, &self.pooled, out)?;
            Ok(())
        })
    }

    /// AUC and logloss over a held-out set.
    pub fn evaluate(&mut self, eval: &EvalSet) -> Result<Evaluation, WorkerError> {
        let mut probs = Vec::with_capacity(eval.samples());
        let mut labels = Vec::with_capacity(eval.samples());
        let mut out = Vec::new();
        for batch in &eval.batches {
            self.predict(batch, &mut out)?;
            probs.extend_from_slice(&out);
            labels.extend_from_slice(&batch.labels);
        }
        Evaluation::of(&probs, &labels)
    }

    /// The model digest: every table row (values + optimizer state) and every dense block.
    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        for t in &self.tables {
            for r in 0..t.rows() {
                d.add_row(t.id.0, r, t.row(r));
            }
        }
        self.model.params().digest_into(&mut d);
        d
    }
}

/// AUC and logloss of predictions against labels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub auc: f64,
    pub logloss: f64,
    pub samples: usize,
}

impl Evaluation {
    /// The planted teacher's AUC and logloss on `eval`'s samples (synthetic data only; `None`
    /// for TSV data, which has no teacher).
    pub fn of_teacher(eval: &EvalSet) -> Result<Option<Evaluation>, WorkerError> {
        let Some(tp) = &eval.teacher_probs else {
            return Ok(None);
        };
        let labels: Vec<f32> = eval
            .batches
            .iter()
            .flat_map(|b| b.labels.iter().copied())
            .collect();
        Evaluation::of(tp, &labels).map(Some)
    }

    pub fn of(probs: &[f32], labels: &[f32]) -> Result<Evaluation, WorkerError> {
        let auc = metrics::auc(probs, labels)?;
        let logloss = metrics::logloss(probs, labels)?;
        Ok(Evaluation {
            auc,
            logloss,
            samples: probs.len(),
        })
    }
}

/// Progress of a run, handed to the caller's callback after every step.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub step: u64,
    pub steps: u64,
    pub samples: u64,
    /// Mean loss of the last [`LOSS_WINDOW`] steps.
    pub loss: f64,
    pub elapsed_s: f64,
    pub samples_per_s: f64,
}

/// Steps over which the reported training loss is averaged.
pub const LOSS_WINDOW: usize = 50;

/// What a run reports (serialised as the `--json` report).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainReport {
    pub steps: u64,
    pub samples: u64,
    /// Whole run: set-up, training and evaluation.
    pub wall_s: f64,
    /// Training steps only.
    pub train_s: f64,
    pub samples_per_s: f64,
    /// Mean loss of the last [`LOSS_WINDOW`] steps.
    pub train_loss: f64,
    pub auc: f64,
    pub logloss: f64,
    pub eval_samples: usize,
    /// The planted teacher's AUC on the same held-out samples (synthetic data only): the
    /// ceiling a model can reach.
    pub teacher_auc: Option<f64>,
    pub teacher_logloss: Option<f64>,
    pub model_digest: String,
    /// Parameters and optimizer state held (bytes).
    pub model_bytes: u64,
    /// Peak resident memory of the process (bytes), where the platform reports it.
    pub peak_rss_bytes: Option<u64>,
    pub malformed_skipped: u64,
    /// Where the data stream stands after the last step.
    pub position: Position,
    pub timing: StepTiming,
    /// The effective configuration.
    pub config: TrainConfig,
}

/// Build the configured data source.
pub fn open_source(cfg: &TrainConfig) -> Result<Box<dyn BatchSource>, WorkerError> {
    Ok(match &cfg.data {
        DataSpec::Synthetic => Box::new(synthetic_source(cfg)?),
        DataSpec::Tsv(tsv) => Box::new(ftrec_data::TsvReader::open(tsv.clone())?),
    })
}

fn synthetic_source(cfg: &TrainConfig) -> Result<ftrec_data::SyntheticSource, WorkerError> {
    Ok(ftrec_data::SyntheticSource::new(
        ftrec_data::SynthConfig::from_preset(&cfg.preset, cfg.seed),
    )?)
}

/// Where `train`'s batches come from: synthetic ones are made by the compute threads too
/// (`Feed::chunked`), lines of a file by a prefetch thread (`Feed::thread`).
enum Source {
    Synthetic(Box<ftrec_data::SyntheticSource>),
    Tsv(Box<dyn BatchSource>),
}

impl Source {
    fn open(cfg: &TrainConfig) -> Result<Source, WorkerError> {
        Ok(match &cfg.data {
            DataSpec::Synthetic => Source::Synthetic(Box::new(synthetic_source(cfg)?)),
            DataSpec::Tsv(_) => Source::Tsv(open_source(cfg)?),
        })
    }

    fn eval_set(&self, max_samples: usize, batch: usize) -> Result<EvalSet, WorkerError> {
        Ok(match self {
            Source::Synthetic(s) => s.eval_set(max_samples, batch)?,
            Source::Tsv(s) => s.eval_set(max_samples, batch)?,
        })
    }

    /// Starts making `cfg.steps` batches of `cfg.batch` samples.
    fn start_feed(self, cfg: &TrainConfig, background: bool) -> Feed {
        match self {
            Source::Synthetic(s) => {
                Feed::chunked(*s, cfg.batch, cfg.steps, cfg.threads, background)
            }
            Source::Tsv(s) => Feed::thread(s, cfg.batch, cfg.steps, background),
        }
    }
}

/// Train for `cfg.steps` steps or until the data ends (finite epochs), whichever comes first;
/// evaluate on the held-out split, report. `on_step` sees every step's progress. The last
/// batch of finite data may be short.
pub fn train(
    cfg: &TrainConfig,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<TrainReport, WorkerError> {
    let start = Instant::now();
    cfg.validate()?;
    // When the compute threads take every core, batches are made in the gaps they leave
    // (`crate::feed`); synthetic ones also by the compute threads when a step would wait.
    let background = cfg.threads >= crate::sys::cores();
    let eval_batch = cfg.batch.min(8192);
    // The held-out set is read and checked before the feed starts making batches.
    let source = Source::open(cfg)?;
    let eval = source.eval_set(cfg.eval_samples, eval_batch)?;
    if eval.samples() == 0 {
        return Err(WorkerError::NoEvalData(match &cfg.data {
            DataSpec::Tsv(t) => format!(
                "no held-out lines were found (every {}th line is held out; the data may be too short)",
                t.holdout_every
            ),
            DataSpec::Synthetic => "the generator produced no held-out samples".into(),
        }));
    }
    // Fail before training, not after: AUC needs both classes in the held-out set.
    let positives = eval
        .batches
        .iter()
        .flat_map(|b| &b.labels)
        .filter(|&&l| l > 0.5)
        .count();
    if positives == 0 || positives == eval.samples() {
        return Err(WorkerError::NoEvalData(format!(
            "all {} held-out samples have the same label, so AUC is undefined; hold out more \
             samples (more data, a smaller --holdout-every or more --eval-samples)",
            eval.samples()
        )));
    }
    let mut trainer = LocalTrainer::new(cfg)?;
    let mut feed = source.start_feed(cfg, background);

    let steps = cfg.steps;
    let train_start = Instant::now();
    let mut samples = 0u64;
    let mut window = std::collections::VecDeque::with_capacity(LOSS_WINDOW);
    let mut last_position = None;
    for step in 0..steps {
        let wait = Instant::now();
        let next = feed.next_batch()?;
        trainer.timing.data_wait_s += wait.elapsed().as_secs_f64();
        let Some((batch, position)) = next else {
            // The data ended before `steps` (finite epochs): the run is over, and the report
            // says how many steps and samples it had.
            if step == 0 {
                return Err(WorkerError::NoTrainingData);
            }
            break;
        };
        let loss = trainer.step(&batch)?;
        samples += batch.size as u64;
        last_position = Some(position);
        if window.len() == LOSS_WINDOW {
            window.pop_front();
        }
        window.push_back(loss);
        let elapsed_s = train_start.elapsed().as_secs_f64();
        on_step(&Progress {
            step: step + 1,
            steps,
            samples,
            loss: window.iter().sum::<f64>() / window.len() as f64,
            elapsed_s,
            samples_per_s: ftrec_core::samples_per_s(samples, elapsed_s),
        });
    }
    let train_s = train_start.elapsed().as_secs_f64();
    let steps = trainer.step_count();
    let fed = feed.finish()?;
    trainer.timing.data_cpu_s = fed.cpu_s;

    let evaluation = trainer.evaluate(&eval)?;
    let teacher = Evaluation::of_teacher(&eval)?;
    Ok(TrainReport {
        steps,
        samples,
        wall_s: start.elapsed().as_secs_f64(),
        train_s,
        samples_per_s: ftrec_core::samples_per_s(samples, train_s),
        train_loss: window.iter().sum::<f64>() / window.len().max(1) as f64,
        auc: evaluation.auc,
        logloss: evaluation.logloss,
        eval_samples: evaluation.samples,
        teacher_auc: teacher.map(|t| t.auc),
        teacher_logloss: teacher.map(|t| t.logloss),
        model_digest: trainer.digest().hex(),
        model_bytes: trainer.model_bytes(),
        peak_rss_bytes: crate::sys::peak_rss_bytes(),
        malformed_skipped: fed.malformed_skipped + eval.malformed_skipped,
        position: last_position.unwrap_or(fed.position),
        timing: trainer.timing,
        config: cfg.clone(),
    })
}

//! `Store.held_out()`: the held-out set the store's job evaluates on, and what the store's model
//! predicts for it, by the code `ftrec eval` runs (the job record's preset, seed, batch, data
//! and held-out size; [`LocalTrainer::evaluate`]'s predictions). A PyTorch rebuild of the model
//! is checked against these.

use ftrec_cluster::restored::{self as lib, JobDefaults, RestoreError, Shape};
use ftrec_core::Optimizer;
use ftrec_data::EvalSet;
use ftrec_worker::local::{open_source, Evaluation};
use ftrec_worker::{DataSpec, LocalTrainer, TrainConfig};

use crate::convert::ARGS;

/// The held-out set and the model's predictions for it.
pub struct HeldOut {
    pub eval: EvalSet,
    pub predictions: Vec<f32>,
    pub evaluation: Evaluation,
    pub step: u64,
}

fn worker(e: ftrec_worker::WorkerError) -> RestoreError {
    RestoreError::Shape(e.to_string())
}

/// The settings `ftrec eval` takes from the job record (`samples` for the held-out size when
/// given; a record of a run that evaluated nothing gives way to the preset's default).
fn config(
    shape: &Shape,
    job: Option<&JobDefaults>,
    samples: Option<usize>,
) -> Result<TrainConfig, RestoreError> {
    let data = match job.and_then(|j| j.data.clone()) {
        Some(t) => DataSpec::Tsv(t),
        None if !shape.preset_tables => {
            return Err(RestoreError::Shape(format!(
                "the checkpoint's tables are not preset {}'s and the store has no job record \
                 naming its data",
                shape.preset.name
            )))
        }
        None => DataSpec::Synthetic,
    };
    let mut cfg = TrainConfig::from_preset(&shape.preset.name, data).map_err(worker)?;
    if let Some(j) = job {
        cfg.seed = j.seed;
        cfg.batch = j.batch;
        if j.eval_samples > 0 {
            cfg.eval_samples = j.eval_samples;
        }
    }
    if let Some(n) = samples {
        cfg.eval_samples = n;
    }
    cfg.deterministic = true;
    cfg.sparse_optimizer = Optimizer::new(shape.sparse.kind, cfg.sparse_optimizer.lr);
    cfg.dense_optimizer = Optimizer::new(shape.dense.kind, cfg.dense_optimizer.lr);
    cfg.validate().map_err(worker)?;
    Ok(cfg)
}

/// Restore `at` from the store, make its job's held-out set and predict it.
pub fn held_out(
    rt: &tokio::runtime::Runtime,
    ckpts: &ftrec_ckpt::Checkpoints,
    location: &str,
    opts: &ftrec_ckpt::location::LocationOptions,
    at: &ftrec_ckpt::deck::RestoreAt,
    samples: Option<usize>,
) -> Result<HeldOut, RestoreError> {
    if samples == Some(0) {
        return Err(RestoreError::InvalidArgument {
            arg: "samples",
            value: "0".into(),
            reason: "the held-out set needs at least 1 sample".into(),
        });
    }
    let job = lib::job_defaults(location, opts)?;
    let mut state = rt.block_on(lib::restore_from(ckpts, location, at, ARGS.at))?;
    let shape = lib::shape_with_job(&state, job.as_ref(), None, None, None, &ARGS)?;
    let cfg = config(&shape, job.as_ref(), samples)?;
    let source = open_source(&cfg).map_err(worker)?;
    let eval = source
        .eval_set(cfg.eval_samples, cfg.batch.min(8192))
        .map_err(|e| RestoreError::Shape(e.to_string()))?;
    let step = state.step();
    let tables = std::mem::take(&mut state.tables);
    let dense = lib::dense_params(&mut state, &cfg.dense_optimizer)?;
    let mut trainer = LocalTrainer::from_state(&cfg, tables, dense, step).map_err(worker)?;
    let mut predictions = Vec::with_capacity(eval.samples());
    let mut out = Vec::new();
    for b in &eval.batches {
        trainer.predict(b, &mut out).map_err(worker)?;
        predictions.extend_from_slice(&out);
    }
    let labels: Vec<f32> = eval
        .batches
        .iter()
        .flat_map(|b| b.labels.iter().copied())
        .collect();
    let evaluation = Evaluation::of(&predictions, &labels).map_err(worker)?;
    Ok(HeldOut {
        eval,
        predictions,
        evaluation,
        step,
    })
}

//! `ftrec eval`: AUC and logloss of a checkpoint's model on the held-out set.
//!
//! The state (newest committed, or `--at` a step or id) is restored from any store into memory
//! ([`ftrec_ckpt::model_state`]), the shape worked out and checked ([`crate::restored`]), and
//! the model evaluated by the single-process trainer's evaluation ([`LocalTrainer::evaluate`])
//! on the held-out set `ftrec train` and `ftrec run` use: the synthetic preset's eval split
//! (the run's seed, its first `--eval-samples` samples, in batches of `min(batch, 8192)`) or
//! every `--holdout-every`-th line of the TSV data. Pooling sums a bag's rows in bag order and
//! the dense part's results do not depend on the thread count, so on a run's final checkpoint
//! this is the run's own end-of-run evaluation, bit for bit.
//!
//! A store written by a saving `ftrec run` carries the run's job record: its preset, seed,
//! batch, held-out samples, optimizers and data are the defaults of every flag not given, so
//! `ftrec eval --ckpt STORE` alone evaluates the run's model on the run's held-out set.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftrec_ckpt::location::LocationOptions;
use ftrec_core::Optimizer;
use ftrec_worker::local::{open_source, Evaluation};
use ftrec_worker::{DataSpec, LocalTrainer};
use serde::Serialize;

use crate::flags::{DataArgs, LayoutArg, OptimizerArgs, TrainArgs};
use crate::restored;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Checkpoint store of the run: a directory or s3://bucket/prefix (S3 settings from the
    /// AWS environment variables).
    #[arg(long, value_name = "LOCATION")]
    pub ckpt: String,
    /// The state at exactly this step, or a checkpoint id [default: CURRENT, the newest
    /// committed state].
    #[arg(long, value_name = "STEP|ID")]
    pub at: Option<String>,
    /// Preset the run trained (without --data: also the synthetic held-out set) [default: the
    /// job record's, else the preset whose tables and MLP the checkpoint has].
    #[arg(long)]
    pub preset: Option<String>,
    /// Criteo TSV data the run trained on (a file, several, or a directory); its held-out lines
    /// are the evaluation set [default: the job record's data, if the run read TSV data].
    #[arg(long, num_args = 1..)]
    pub data: Vec<PathBuf>,
    /// Layout of --data.
    #[arg(long, value_enum, default_value = "kaggle")]
    pub layout: LayoutArg,
    /// The run's cap on every table's rows (categoricals hashed into it; --data only).
    #[arg(long, value_name = "N")]
    pub rows_per_table: Option<u64>,
    /// Skip and count malformed held-out lines instead of stopping at the first one [default:
    /// as the job record's data does].
    #[arg(long)]
    pub skip_malformed: bool,
    /// Every N-th line of the data is held out [default: as the run held it out].
    #[arg(long, value_name = "N")]
    pub holdout_every: Option<u64>,
    /// Held-out samples [default: the job record's, else the preset's].
    #[arg(long, value_name = "N")]
    pub eval_samples: Option<usize>,
    /// The run's batch size; evaluation batches are min(batch, 8192) [default: the job
    /// record's, else the preset's].
    #[arg(long)]
    pub batch: Option<usize>,
    /// The run's seed (the synthetic held-out samples depend on it) [default: the job
    /// record's, else 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// The run's embedding optimizer, checked against the rows' state width [default: the
    /// job record's, else the preset's].
    #[arg(long)]
    pub optimizer: Option<String>,
    /// The run's dense optimizer, checked against the dense state width [default: the job
    /// record's, else the preset's].
    #[arg(long)]
    pub dense_optimizer: Option<String>,
    /// Matrix-kernel threads (results do not depend on it) [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the result as JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// What `ftrec eval` reports (the `--json` file).
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub location: String,
    pub checkpoint: String,
    pub step: u64,
    /// The checkpoints read, oldest first.
    pub chain: Vec<String>,
    pub servers: u32,
    pub preset: String,
    /// `synthetic` or `tsv`.
    pub data: String,
    pub seed: u64,
    pub auc: f64,
    pub logloss: f64,
    pub eval_samples: usize,
    /// The planted teacher's AUC and logloss on the same samples (synthetic data).
    pub teacher_auc: Option<f64>,
    pub teacher_logloss: Option<f64>,
    pub sparse_optimizer: String,
    pub dense_optimizer: String,
    /// Digest of every parameter and optimizer-state word restored (`model_digest`).
    pub model_digest: String,
}

pub fn run(a: EvalArgs) -> Result<()> {
    let at = restored::parse_at(a.at.as_deref())?;
    let job = restored::job_defaults(&a.ckpt, &LocationOptions::default())?;
    if let Some(j) = &job {
        eprintln!(
            "ftrec eval: the store's job record gives {} (flags given override it)",
            j.describe()
        );
    }
    // The run's TSV data from the record, when no --data is given.
    let mut job_tsv = match &job {
        Some(j) if a.data.is_empty() => j.data.clone(),
        _ => None,
    };
    if a.data.is_empty() {
        let mut not_for = vec![("--rows-per-table", a.rows_per_table.is_some())];
        if job_tsv.is_none() {
            not_for.push(("--skip-malformed", a.skip_malformed));
            not_for.push(("--holdout-every", a.holdout_every.is_some()));
        }
        for (flag, set) in not_for {
            if set {
                bail!(
                    "{flag} applies to --data only{}",
                    if job_tsv.is_some() {
                        " (the job record's data has the run's tables)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    if let Some(t) = &mut job_tsv {
        if let Some(h) = a.holdout_every {
            t.holdout_every = h;
        }
        t.skip_malformed |= a.skip_malformed;
    }
    for (flag, v) in [("--batch", a.batch), ("--threads", a.threads)] {
        if v == Some(0) {
            bail!("{flag} 0: give {flag} N with N at least 1");
        }
    }
    restored::check_names(
        a.preset.as_deref(),
        a.optimizer.as_deref(),
        a.dense_optimizer.as_deref(),
    )?;
    let eval_samples = held_out_samples(&a, job.as_ref())?;
    // Every setting that does not depend on the checkpoint's shape, checked with the preset the
    // flags or the record name (or `small`): the data, the batch, the held-out size, the
    // threads. The whole model is read only once they are known to be usable.
    let preset = a.preset.clone().or(job.as_ref().map(|j| j.preset.clone()));
    let train_args = |preset: Option<String>| TrainArgs {
        preset,
        data: DataArgs {
            data: a.data.clone(),
            layout: (!a.data.is_empty()).then_some(a.layout),
            rows_per_table: a.rows_per_table,
            // Without --data these went into the job record's data above.
            skip_malformed: a.skip_malformed && !a.data.is_empty(),
            holdout_every: a.holdout_every.filter(|_| !a.data.is_empty()),
            epochs: None,
        },
        steps: None,
        batch: a.batch.or(job.as_ref().map(|j| j.batch)),
        opt: OptimizerArgs::default(),
        seed: a.seed.or(job.as_ref().map(|j| j.seed)).unwrap_or(1),
        deterministic: true,
        threads: a.threads,
        eval_samples,
        json: None,
    };
    let mut pre = crate::train::config_from_args(&train_args(preset))?;
    if let Some(t) = &job_tsv {
        pre.preset.table_rows = t.table_rows.clone();
        pre.data = DataSpec::Tsv(t.clone());
    }
    pre.validate()?;

    let (mut state, shape) = restored::restore_shaped(
        "eval",
        &a.ckpt,
        &LocationOptions::default(),
        &at,
        job.as_ref(),
        a.preset.as_deref(),
        a.optimizer.as_deref(),
        a.dense_optimizer.as_deref(),
    )?;
    if a.data.is_empty() && job_tsv.is_none() && !shape.preset_tables {
        bail!(
            "the checkpoint's tables are not preset {}'s (a model of TSV data?): give the run's \
             --data, or the --preset whose synthetic data it trained on",
            shape.preset.name
        );
    }
    let mut cfg = crate::train::config_from_args(&train_args(Some(shape.preset.name.clone())))?;
    if let Some(t) = job_tsv {
        cfg.preset.table_rows = t.table_rows.clone();
        cfg.data = DataSpec::Tsv(t);
    }
    if cfg.preset.table_rows != shape.preset.table_rows {
        bail!(
            "the data's tables ({} rows{}) are not the checkpoint's ({} rows): give the run's \
             --rows-per-table",
            cfg.preset.total_rows(),
            a.rows_per_table
                .map_or(String::new(), |n| format!(" with --rows-per-table {n}")),
            shape.preset.total_rows()
        );
    }
    cfg.sparse_optimizer = Optimizer::new(shape.sparse.kind, cfg.sparse_optimizer.lr);
    cfg.dense_optimizer = Optimizer::new(shape.dense.kind, cfg.dense_optimizer.lr);
    cfg.validate()?;
    crate::set_threads(cfg.threads)?;

    let source = open_source(&cfg)?;
    let eval = source.eval_set(cfg.eval_samples, cfg.batch.min(8192))?;
    if eval.samples() == 0 {
        bail!("the held-out set is empty (no held-out lines in the data)");
    }
    let tables = std::mem::take(&mut state.tables);
    let dense = restored::dense_params(&mut state, &cfg.dense_optimizer)?;
    let mut trainer = LocalTrainer::from_state(&cfg, tables, dense, state.step())?;
    let ev = trainer
        .evaluate(&eval)
        .context("evaluating the restored model")?;
    let teacher = Evaluation::of_teacher(&eval)?;
    let report = EvalReport {
        location: a.ckpt.clone(),
        checkpoint: state.manifest.id.to_string(),
        step: state.step(),
        chain: state.chain.iter().map(|c| c.to_string()).collect(),
        servers: state.servers,
        preset: cfg.preset.name.clone(),
        data: match cfg.data {
            DataSpec::Synthetic => "synthetic",
            DataSpec::Tsv(_) => "tsv",
        }
        .into(),
        seed: cfg.seed,
        auc: ev.auc,
        logloss: ev.logloss,
        eval_samples: ev.samples,
        teacher_auc: teacher.map(|t| t.auc),
        teacher_logloss: teacher.map(|t| t.logloss),
        sparse_optimizer: cfg.sparse_optimizer.kind.to_string(),
        dense_optimizer: cfg.dense_optimizer.kind.to_string(),
        model_digest: trainer.digest().hex(),
    };
    println!(
        "checkpoint       {} (step {})",
        report.checkpoint, report.step
    );
    println!("eval samples     {}", report.eval_samples);
    match report.teacher_auc {
        Some(t) => println!(
            "auc              {:.4} (teacher ceiling {t:.4})",
            report.auc
        ),
        None => println!("auc              {:.4}", report.auc),
    }
    println!("logloss          {:.5}", report.logloss);
    println!("model_digest     {}", report.model_digest);
    if let Some(path) = &a.json {
        crate::write_json(path, &report).context("writing the JSON report")?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}

/// The held-out size: `--eval-samples` (at least 1), else the job record's; a record of a run
/// that evaluated nothing (`eval_samples = 0`) gives way to the preset's default, said in one
/// line. `None`: the preset's default.
fn held_out_samples(a: &EvalArgs, job: Option<&restored::JobDefaults>) -> Result<Option<usize>> {
    match (a.eval_samples, job) {
        (Some(0), _) => bail!("--eval-samples 0: evaluation needs at least 1 held-out sample"),
        (Some(n), _) => Ok(Some(n)),
        (None, Some(j)) if j.eval_samples == 0 => {
            let preset = a.preset.as_deref().unwrap_or(&j.preset);
            let n = ftrec_core::Preset::by_name(preset)?.eval_samples;
            eprintln!(
                "ftrec eval: the job record holds eval_samples = 0 (the run evaluated nothing): \
                 using preset {preset}'s default of {n} held-out samples (--eval-samples N sets it)"
            );
            Ok(None)
        }
        (None, Some(j)) => Ok(Some(j.eval_samples)),
        (None, None) => Ok(None),
    }
}

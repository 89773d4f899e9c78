//! `ftrec train`.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use ftrec_data::{DataPath, Layout, TsvConfig};
use ftrec_worker::{DataSpec, Progress, TrainConfig, TrainReport};
use indicatif::{ProgressBar, ProgressStyle};

use crate::flags::{DataArgs, LayoutArg, TrainArgs};

/// The data flags -> the TSV reader's configuration (`None`: synthetic data). Every data flag
/// without `--data` is an error naming it, and so is `--epochs 0` or `--rows-per-table 0`; the
/// files must exist. Shared by `ftrec train`, `ftrec run` and `ftrec coordinator`.
pub fn tsv_config(a: &DataArgs) -> Result<Option<TsvConfig>> {
    if a.data.is_empty() {
        for (flag, set) in [
            ("--layout", a.layout.is_some()),
            ("--rows-per-table", a.rows_per_table.is_some()),
            ("--skip-malformed", a.skip_malformed),
            ("--holdout-every", a.holdout_every.is_some()),
            ("--epochs", a.epochs.is_some()),
        ] {
            if set {
                bail!("{flag} applies to --data only (the synthetic data has no files)");
            }
        }
        return Ok(None);
    }
    let layout = match a.layout.unwrap_or(LayoutArg::Kaggle) {
        LayoutArg::Kaggle => Layout::Kaggle,
        LayoutArg::Terabyte => Layout::Terabyte,
    };
    // Absolute paths: the workers of `ftrec run` read them too, wherever they run.
    let paths = a
        .data
        .iter()
        .map(|p| {
            std::fs::canonicalize(p).map_err(|e| anyhow::anyhow!("--data {}: {e}", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = DataPath::from_paths(&paths).map_err(|e| anyhow::anyhow!("--data: {e}"))?;
    let mut tsv = TsvConfig::new(path, layout);
    // Every file must be there now, not when the first batch is read.
    tsv.path
        .resolve(layout)
        .map_err(|e| anyhow::anyhow!("--data: {e}"))?;
    if let Some(cap) = a.rows_per_table {
        if cap == 0 {
            bail!("--rows-per-table must be at least 1");
        }
        tsv = tsv.with_rows_per_table(cap);
    }
    if let Some(h) = a.holdout_every {
        tsv.holdout_every = h;
    }
    tsv.skip_malformed = a.skip_malformed;
    tsv.epochs = match a.epochs {
        Some(0) => bail!(
            "--epochs must be at least 1 (leave it out to pass over the data as often as the \
             steps need)"
        ),
        e => e,
    };
    Ok(Some(tsv))
}

/// Steps when `--epochs` is given without `--steps`: every batch of `batch` samples in the
/// configured passes over the data, `per_step` batches a step (the last step may have fewer,
/// and its last batch may be short).
pub fn steps_of_epochs(tsv: &TsvConfig, batch: usize, per_step: u64) -> Result<u64> {
    let (batches, _) =
        ftrec_data::count_batches(tsv, batch).context("counting the batches of --data")?;
    if batches == 0 {
        bail!("--data holds no training samples (every line held out or skipped)");
    }
    Ok(batches.div_ceil(per_step))
}

/// Flags -> validated configuration.
pub fn config_from_args(a: &TrainArgs) -> Result<TrainConfig> {
    let tsv = tsv_config(&a.data)?;
    let preset = a.preset.clone().unwrap_or_else(|| {
        if tsv.is_none() {
            "small".into()
        } else {
            "kaggle".into()
        }
    });
    let data = match &tsv {
        Some(t) => DataSpec::Tsv(t.clone()),
        None => DataSpec::Synthetic,
    };
    let mut cfg = TrainConfig::from_preset(&preset, data)?;
    if let Some(b) = a.batch {
        cfg.batch = b;
    }
    match (a.steps, &tsv) {
        (Some(s), _) => cfg.steps = s,
        (None, Some(t)) if t.epochs.is_some() && cfg.batch > 0 => {
            cfg.steps = steps_of_epochs(t, cfg.batch, 1)?;
        }
        _ => {}
    }
    if let Some(t) = a.threads {
        cfg.threads = t;
    }
    if let Some(e) = a.eval_samples {
        cfg.eval_samples = e;
    }
    cfg.seed = a.seed;
    cfg.deterministic = a.deterministic;
    a.opt
        .apply(&mut cfg.sparse_optimizer, &mut cfg.dense_optimizer)?;
    cfg.validate()?;
    Ok(cfg)
}

pub fn run(a: TrainArgs) -> Result<()> {
    let cfg = config_from_args(&a)?;
    crate::set_threads(cfg.threads)?;
    eprintln!(
        "ftrec train: preset {} | {} tables, {} rows, dim {} | {} steps x batch {} | sparse {} lr {} | dense {} lr {} | seed {}{}",
        cfg.preset.name,
        cfg.preset.table_rows.len(),
        cfg.preset.total_rows(),
        cfg.preset.dim,
        cfg.steps,
        cfg.batch,
        cfg.sparse_optimizer.kind,
        cfg.sparse_optimizer.lr,
        cfg.dense_optimizer.kind,
        cfg.dense_optimizer.lr,
        cfg.seed,
        if cfg.deterministic { " | deterministic" } else { "" },
    );
    let report = run_with_progress(&cfg)?;
    print_summary(&report);
    if let Some(path) = &a.json {
        crate::write_json(path, &report).with_context(|| "writing the JSON report")?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}

/// A progress bar on a terminal, a log line every 5% otherwise.
fn run_with_progress(cfg: &TrainConfig) -> Result<TrainReport> {
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let pb = ProgressBar::new(cfg.steps);
        pb.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps | {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        pb
    });
    let every = (cfg.steps / 20).max(1);
    let mut on_step = |p: &Progress| {
        if let Some(pb) = &bar {
            pb.set_position(p.step);
            pb.set_message(format!(
                "{:.0} samples/s | loss {:.4}",
                p.samples_per_s, p.loss
            ));
        } else if p.step.is_multiple_of(every) || p.step == p.steps {
            eprintln!(
                "step {}/{} | {:.0} samples/s | loss {:.4} | {:.1}s",
                p.step, p.steps, p.samples_per_s, p.loss, p.elapsed_s
            );
        }
    };
    let report = ftrec_worker::train(cfg, &mut on_step);
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    Ok(report?)
}

fn print_summary(r: &TrainReport) {
    println!("steps            {}", r.steps);
    println!("samples          {}", r.samples);
    println!(
        "train time       {:.2} s (wall {:.2} s)",
        r.train_s, r.wall_s
    );
    println!("samples/s        {:.0}", r.samples_per_s);
    println!("train loss       {:.5}", r.train_loss);
    println!("eval samples     {}", r.eval_samples);
    match r.teacher_auc {
        Some(t) => println!("auc              {:.4} (teacher ceiling {:.4})", r.auc, t),
        None => println!("auc              {:.4}", r.auc),
    }
    println!("logloss          {:.5}", r.logloss);
    println!("model bytes      {}", r.model_bytes);
    if let Some(p) = r.peak_rss_bytes {
        println!("peak RSS         {:.2} GiB", p as f64 / (1u64 << 30) as f64);
    }
    if r.malformed_skipped > 0 {
        println!("malformed lines  {} skipped", r.malformed_skipped);
    }
    println!("model_digest     {}", r.model_digest);
}

//! A checkpoint's model in memory with the shape it was trained with: what `ftrec eval` and
//! `ftrec ckpt export` start from.
//!
//! The store's manifests say the tables (rows, dim, optimizer words per row), the dense values
//! and their optimizer words per block, and how many servers saved them; they do not say the
//! preset (the MLP widths), the seed or the optimizer kinds. Those come from flags, else from
//! the store's job record when a saving `ftrec run` wrote one ([`job_defaults`]), else are
//! inferred (the preset whose tables, dim and dense size fit; the preset's optimizers), and
//! are checked against what the checkpoint holds: a mismatch is one error line naming both.

use anyhow::{bail, Context, Result};
use ftrec_ckpt::deck::RestoreAt;
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::model_state::{restore_model, ModelState};
use ftrec_ckpt::{CheckpointId, Checkpoints};
use ftrec_core::{DenseParams, Optimizer, OptimizerKind, Preset, DENSE_BLOCK};
use ftrec_data::tsv::TsvConfig;
use ftrec_model::DlrmConfig;

/// What a store's job record says about the run that wrote it: the defaults of `ftrec eval`
/// and `ftrec ckpt export` for the flags not given.
#[derive(Debug, Clone)]
pub struct JobDefaults {
    pub preset: String,
    pub seed: u64,
    pub batch: usize,
    pub eval_samples: usize,
    pub sparse: OptimizerKind,
    pub dense: OptimizerKind,
    /// The run's TSV data (`None`: the preset's synthetic data).
    pub data: Option<TsvConfig>,
}

impl JobDefaults {
    /// One line for the log: what the record supplies.
    pub fn describe(&self) -> String {
        format!(
            "preset {}, seed {}, batch {}, {} held-out samples, optimizers {}/{}, {}",
            self.preset,
            self.seed,
            self.batch,
            self.eval_samples,
            self.sparse,
            self.dense,
            if self.data.is_some() {
                "TSV data"
            } else {
                "synthetic data"
            }
        )
    }
}

/// The job record of the store at `location`, if it has one (a damaged one is an error).
pub fn job_defaults(location: &str, opts: &LocationOptions) -> Result<Option<JobDefaults>> {
    require_existing(location)?;
    let opts = opts.clone().or(LocationOptions::from_env());
    let Some(job) = ftrec_cluster::job::read_if_any(location, &opts)? else {
        return Ok(None);
    };
    let invocation =
        ftrec_cluster::RunConfig::new(Preset::tiny(), Default::default(), Default::default());
    let cfg = job
        .config(&invocation)
        .with_context(|| format!("the job record of {location}"))?;
    Ok(Some(JobDefaults {
        preset: cfg.preset.name.clone(),
        seed: cfg.seed,
        batch: cfg.batch,
        eval_samples: cfg.eval_samples,
        sparse: cfg.sparse_optimizer.kind,
        dense: cfg.dense_optimizer.kind,
        data: cfg.data,
    }))
}

/// A store directory must exist before it is opened (opening creates a missing one): a
/// mistyped path is an error, not a new empty store.
fn require_existing(location: &str) -> Result<()> {
    if let Ok(location::Location::Dir(dir)) = location::parse(location) {
        if !dir.exists() {
            bail!("checkpoint store {location} does not exist");
        }
        if !dir.is_dir() {
            bail!("checkpoint store {location} is not a directory");
        }
    }
    Ok(())
}

/// Open the store at `location` for reading or maintenance: it must exist and be a store (a
/// `CURRENT`, a job record or a checkpoint; a damaged one counts), else one error naming it.
/// Nothing is created: a mistyped path never looks like an empty store.
pub async fn open_store(location: &str, opts: &LocationOptions) -> Result<Checkpoints> {
    require_existing(location)?;
    let store = location::open(location, opts)
        .await
        .with_context(|| format!("opening checkpoint store {location}"))?;
    let ckpts = Checkpoints::new(store);
    let is_store = !matches!(ckpts.read_current().await, Ok(None))
        || !matches!(ckpts.read_job().await, Ok(None))
        || !matches!(ckpts.list_checkpoints().await, Ok(ids) if ids.is_empty());
    if !is_store {
        bail!("{location} is not a checkpoint store (no CURRENT, job record or checkpoint in it)");
    }
    Ok(ckpts)
}

/// `--at`: a step (exactly that step's state) or a checkpoint id; none: `CURRENT`.
pub fn parse_at(at: Option<&str>) -> Result<RestoreAt> {
    Ok(match at {
        None => RestoreAt::Current,
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            RestoreAt::Step(s.parse().with_context(|| format!("--at {s:?}"))?)
        }
        Some(s) => {
            RestoreAt::Id(CheckpointId::new(s.to_string()).with_context(|| format!("--at {s:?}"))?)
        }
    })
}

/// Restore the state `at` names from the store at `location` (a directory, which must exist,
/// or s3://bucket/prefix with the settings `opts` and the AWS variables give).
pub fn restore(location: &str, opts: &LocationOptions, at: &RestoreAt) -> Result<ModelState> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let ckpts = open_store(location, &opts.clone().or(LocationOptions::from_env())).await?;
        restore_model(&ckpts, at)
            .await
            .with_context(|| format!("restoring from {location}"))
    })
}

/// The model's shape and optimizers, as far as the checkpoint and the flags tell.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The preset: its MLP widths and dim are the checkpoint's; its tables the checkpoint's.
    pub preset: Preset,
    /// Whether the checkpoint's tables are the preset's own (else they came from TSV data).
    pub preset_tables: bool,
    pub sparse: Optimizer,
    pub dense: Optimizer,
}

/// Work out the shape of `state` from the flags: `preset` names the preset (else the one whose
/// tables, dim and dense size fit, or else the last one whose dim and dense size fit: `kaggle`,
/// as `ftrec train --data` names a model of TSV data), `sparse`/`dense` the
/// optimizer kinds (else the preset's); each is checked against the checkpoint.
pub fn shape(
    state: &ModelState,
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
) -> Result<Shape> {
    let rows = state.table_rows();
    let layout = state
        .layout()
        .context("the checkpoint holds no embedding table")?;
    let dense_values = state.dense_values.len();
    let fits_mlp = |p: &Preset| {
        let mut cfg = DlrmConfig::from_preset(p);
        cfg.tables = rows.len();
        p.dim == layout.dim && cfg.param_count() == dense_values
    };
    let described = || {
        format!(
            "{} tables ({} rows), dim {}, {dense_values} dense values",
            rows.len(),
            rows.iter().sum::<u64>(),
            layout.dim
        )
    };
    let mut p = match preset {
        Some(name) => {
            let p = Preset::by_name(name)?;
            if !fits_mlp(&p) {
                bail!(
                    "the checkpoint's model ({}) is not preset {name}'s shape (dim {}, bottom \
                     MLP {:?}, top MLP {:?})",
                    described(),
                    p.dim,
                    p.mlp.bottom,
                    p.mlp.top
                );
            }
            p
        }
        None => {
            let all: Vec<Preset> = Preset::NAMES
                .iter()
                .map(|n| Preset::by_name(n))
                .collect::<Result<_, _>>()?;
            match all
                .iter()
                .find(|p| p.table_rows == rows && fits_mlp(p))
                .or_else(|| all.iter().rev().find(|p| fits_mlp(p)))
            {
                Some(p) => p.clone(),
                None => bail!(
                    "the checkpoint's model ({}) fits no preset ({})",
                    described(),
                    Preset::NAMES.join(", ")
                ),
            }
        }
    };
    let preset_tables = p.table_rows == rows;
    p.table_rows = rows;
    let kind = |flag: &str, name: Option<&str>, default: OptimizerKind| -> Result<Optimizer> {
        let k = match name {
            Some(n) => n
                .parse::<OptimizerKind>()
                .with_context(|| format!("{flag} {n:?}"))?,
            None => default,
        };
        Ok(Optimizer::new(k, 0.0))
    };
    let sparse = kind("--optimizer", sparse, p.sparse_optimizer)?;
    let dense = kind("--dense-optimizer", dense, p.dense_optimizer)?;
    if sparse.state_words(layout.dim) != layout.state_words {
        bail!(
            "the checkpoint's rows carry {} optimizer words each; sparse optimizer {} keeps {} \
             (name the run's with --optimizer)",
            layout.state_words,
            sparse.kind,
            sparse.state_words(layout.dim)
        );
    }
    if !state.dense_values.is_empty()
        && dense.state_words(DENSE_BLOCK) != state.dense_state_per_block
    {
        bail!(
            "the checkpoint's dense blocks carry {} optimizer words each; dense optimizer {} \
             keeps {} (name the run's with --dense-optimizer)",
            state.dense_state_per_block,
            dense.kind,
            dense.state_words(DENSE_BLOCK)
        );
    }
    Ok(Shape {
        preset: p,
        preset_tables,
        sparse,
        dense,
    })
}

/// Check the names `--preset`, `--optimizer` and `--dense-optimizer` give before anything is
/// read: a misspelt one is refused up front, not after a restore.
pub fn check_names(preset: Option<&str>, sparse: Option<&str>, dense: Option<&str>) -> Result<()> {
    if let Some(p) = preset {
        Preset::by_name(p).with_context(|| format!("--preset {p:?}"))?;
    }
    for (flag, name) in [("--optimizer", sparse), ("--dense-optimizer", dense)] {
        if let Some(n) = name {
            n.parse::<OptimizerKind>()
                .with_context(|| format!("{flag} {n:?}"))?;
        }
    }
    Ok(())
}

/// [`shape`] with every setting not given by a flag taken from the job record `job`, if any.
pub fn shape_with_job(
    state: &ModelState,
    job: Option<&JobDefaults>,
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
) -> Result<Shape> {
    let sparse = sparse
        .map(str::to_string)
        .or(job.map(|j| j.sparse.to_string()));
    let dense = dense
        .map(str::to_string)
        .or(job.map(|j| j.dense.to_string()));
    shape(
        state,
        preset.or(job.map(|j| j.preset.as_str())),
        sparse.as_deref(),
        dense.as_deref(),
    )
}

/// Restore the state `at` names and work out its shape with [`shape_with_job`], saying on
/// stderr (as `ftrec COMMAND`) what was read.
#[allow(clippy::too_many_arguments)]
pub fn restore_shaped(
    command: &str,
    location: &str,
    opts: &LocationOptions,
    at: &RestoreAt,
    job: Option<&JobDefaults>,
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
) -> Result<(ModelState, Shape)> {
    let state = restore(location, opts, at)?;
    eprintln!("ftrec {command}: restored {}", describe(&state));
    let shape = shape_with_job(&state, job, preset, sparse, dense)?;
    Ok((state, shape))
}

/// The dense parameters of `state` with `opt`'s state layout (checked by [`shape`]).
pub fn dense_params(state: &mut ModelState, opt: &Optimizer) -> Result<DenseParams> {
    let mut d = DenseParams::new(std::mem::take(&mut state.dense_values), opt);
    if d.state.len() != state.dense_state.len() {
        bail!(
            "the checkpoint holds {} dense optimizer words; {} blocks of {} keep {}",
            state.dense_state.len(),
            d.blocks(),
            opt.kind,
            d.state.len()
        );
    }
    d.state = std::mem::take(&mut state.dense_state);
    Ok(d)
}

/// What a restore read, for a log line.
pub fn describe(state: &ModelState) -> String {
    format!(
        "step {} ({}; {} servers; {})",
        state.step(),
        state.manifest.id,
        state.servers,
        state
            .chain
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" -> ")
    )
}

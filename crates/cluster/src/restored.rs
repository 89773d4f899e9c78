//! A checkpoint's model in memory with the shape it was trained with, and its tensors: what
//! `ftrec eval`, `ftrec ckpt export` and the Python package's `Store.state_dict` start from.
//!
//! The store's manifests say the tables (rows, dim, optimizer words per row), the dense values
//! and their optimizer words per block, and how many servers saved them; they do not say the
//! preset (the MLP widths), the seed or the optimizer kinds. Those come from the caller's
//! arguments, else from the store's job record when a saving `ftrec run` wrote one
//! ([`job_defaults`]), else are inferred (the preset whose tables, dim and dense size fit; the
//! preset's optimizers), and are checked against what the checkpoint holds: a mismatch is one
//! error naming both, and the argument that would fix it as the caller spells it ([`ArgNames`]).
//!
//! The model's tensors ([`tensor_specs`]; the names and layout of the safetensors export):
//! - `bottom_mlp.{i}.weight` `[out, in]` and `bottom_mlp.{i}.bias` `[out]`, `i` the bottom
//!   MLP's linear layers from 0 (a ReLU after each); `top_mlp.{i}.weight`, `top_mlp.{i}.bias`
//!   likewise (a ReLU after each but the last, whose output is the click logit). The weight is
//!   PyTorch's `nn.Linear.weight` layout. The top MLP's input is the bottom output then the dots
//!   `z_a . z_b` for `a < b` in row-major order of the strict upper triangle (`z_0` the bottom
//!   output, `z_1..` the pooled embeddings in table order);
//! - `embedding.{t}.weight` `[rows, dim]`: table `t`, rows in global id order (sum pooling);
//! - with the optimizer state: `embedding.{t}.optimizer_state` `[rows, words]` (the sparse
//!   optimizer's words per row: row-wise Adagrad 1, Adagrad and momentum `dim`, Adam
//!   `2 * dim + 1`; SGD has none, so no tensor) and `dense.optimizer_state` `[blocks, words]`
//!   (none for SGD either): the dense vector (every layer's weight then bias, bottom then top,
//!   in the order above) is cut into blocks of 256 values, each with one slot of the dense
//!   optimizer's words for 256 values (the last block's slot is used as far as its values
//!   need).
//!
//! It never writes to the store, and never creates one: a location that does not exist or
//! holds no store is an error naming it.

use std::ops::Range;

use ftrec_ckpt::deck::{Lineage, RestoreAt};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::model_state::{restore_model, ModelState};
use ftrec_ckpt::{CheckpointId, Checkpoints, CkptError};
use ftrec_core::{DenseParams, Optimizer, OptimizerKind, Preset, RowLayout, DENSE_BLOCK};
use ftrec_data::tsv::TsvConfig;
use ftrec_model::DlrmConfig;

use crate::ClusterError;

/// Format name and version in a safetensors export's `__metadata__`.
pub const FORMAT: &str = "ftrec-dlrm";
pub const FORMAT_VERSION: &str = "1";

/// Why a store's model could not be restored or shaped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The directory named does not exist.
    #[error("checkpoint store {location} does not exist")]
    NoSuchStore { location: String },
    /// The path names a file, not a directory.
    #[error("checkpoint store {location} is not a directory")]
    NotADirectory { location: String },
    /// The location exists but holds no store.
    #[error("{location} is not a checkpoint store (no CURRENT, job record or checkpoint in it)")]
    NotAStore { location: String },
    /// The store could not be opened (a malformed location, an unreachable S3 service).
    #[error("opening checkpoint store {location}")]
    Open {
        location: String,
        #[source]
        source: CkptError,
    },
    /// An argument the caller gave cannot be used: its name (as the caller spells it), its
    /// value, and why.
    #[error("{arg} {value:?}: {reason}")]
    InvalidArgument {
        arg: &'static str,
        value: String,
        reason: String,
    },
    /// The state asked for is not in the store.
    #[error("{location} has no state {what}{}: give {arg} one of these", known_states(.steps))]
    NoState {
        location: String,
        arg: &'static str,
        /// `at step S` or the id asked for.
        what: String,
        /// Steps of the states the store has, oldest first.
        steps: Vec<u64>,
    },
    /// The store holds no checkpoint yet.
    #[error("{location} holds no checkpoint yet")]
    Empty { location: String },
    /// Restoring the state failed (damage, a store that stopped answering).
    #[error("restoring from {location}")]
    Restore {
        location: String,
        #[source]
        source: CkptError,
    },
    /// The job record is there but cannot be read.
    #[error(transparent)]
    Job(#[from] ClusterError),
    /// The job record does not describe a run of this build.
    #[error("the job record of {location}")]
    JobConfig {
        location: String,
        #[source]
        source: ClusterError,
    },
    /// The checkpoint's model does not fit the preset or optimizers given or recorded.
    #[error("{0}")]
    Shape(String),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
}

type Result<T, E = RestoreError> = std::result::Result<T, E>;

/// "(its states are at steps 4, 8, 12)", at most a few of many.
fn known_states(steps: &[u64]) -> String {
    const SHOWN: usize = 8;
    let list = |s: &[u64]| {
        s.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match steps.len() {
        1 => format!(" (its one state is at step {})", steps[0]),
        n if n <= SHOWN => format!(" (its states are at steps {})", list(steps)),
        n => format!(
            " (its {n} states are at steps {}, ..., {})",
            list(&steps[..SHOWN / 2]),
            list(&steps[n - SHOWN / 2..])
        ),
    }
}

/// How the caller spells the arguments an error asks to change: flags on the command line
/// ([`ArgNames::FLAGS`]), keyword arguments in Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgNames {
    pub at: &'static str,
    pub preset: &'static str,
    pub optimizer: &'static str,
    pub dense_optimizer: &'static str,
}

impl ArgNames {
    /// `ftrec eval` and `ftrec ckpt export`.
    pub const FLAGS: ArgNames = ArgNames {
        at: "--at",
        preset: "--preset",
        optimizer: "--optimizer",
        dense_optimizer: "--dense-optimizer",
    };
}

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
    let Some(job) = crate::job::read_if_any(location, &opts)? else {
        return Ok(None);
    };
    let invocation = crate::RunConfig::new(Preset::tiny(), Default::default(), Default::default());
    let cfg = job
        .config(&invocation)
        .map_err(|source| RestoreError::JobConfig {
            location: location.to_string(),
            source,
        })?;
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
pub fn require_existing(location: &str) -> Result<()> {
    if let Ok(location::Location::Dir(dir)) = location::parse(location) {
        if !dir.exists() {
            return Err(RestoreError::NoSuchStore {
                location: location.into(),
            });
        }
        if !dir.is_dir() {
            return Err(RestoreError::NotADirectory {
                location: location.into(),
            });
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
        .map_err(|source| RestoreError::Open {
            location: location.into(),
            source,
        })?;
    let ckpts = Checkpoints::new(store);
    let is_store = !matches!(ckpts.read_current().await, Ok(None))
        || !matches!(ckpts.read_job().await, Ok(None))
        || !matches!(ckpts.list_checkpoints().await, Ok(ids) if ids.is_empty());
    if !is_store {
        return Err(RestoreError::NotAStore {
            location: location.into(),
        });
    }
    Ok(ckpts)
}

/// `at`: a step (exactly that step's state) or a checkpoint id; none: `CURRENT`. `arg` names
/// the argument in errors.
pub fn parse_at(at: Option<&str>, arg: &'static str) -> Result<RestoreAt> {
    let invalid = |s: &str, reason: String| RestoreError::InvalidArgument {
        arg,
        value: s.into(),
        reason,
    };
    Ok(match at {
        None => RestoreAt::Current,
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            RestoreAt::Step(s.parse().map_err(|e| invalid(s, format!("{e}")))?)
        }
        Some(s) => {
            RestoreAt::Id(CheckpointId::new(s.to_string()).map_err(|e| invalid(s, e.to_string()))?)
        }
    })
}

/// Whether the store's graph names the state `at` asks for: some checkpoint at exactly that
/// step, or a checkpoint or state of that id. `CURRENT` is named when anything is there.
pub fn names_state(lineage: &Lineage, at: &RestoreAt) -> bool {
    match at {
        RestoreAt::Current => lineage.head().is_some(),
        RestoreAt::Step(s) => lineage.nodes().any(|n| n.step == *s),
        RestoreAt::Id(id) => lineage.nodes().any(|n| &n.id == id || &n.tip == id),
    }
}

/// Restore the state `at` names from `ckpts` (the store at `location`): a state the store does
/// not have is [`RestoreError::NoState`] (or [`RestoreError::Empty`]), naming the states it has;
/// any other failure (damage) is [`RestoreError::Restore`].
pub async fn restore_from(
    ckpts: &Checkpoints,
    location: &str,
    at: &RestoreAt,
    arg: &'static str,
) -> Result<ModelState> {
    let failed = |source| RestoreError::Restore {
        location: location.into(),
        source,
    };
    let lineage = Lineage::load(ckpts).await.map_err(failed)?;
    if !names_state(&lineage, at) {
        let mut steps: Vec<u64> = lineage
            .states_newest_first()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        steps.reverse();
        steps.dedup();
        let what = match at {
            _ if steps.is_empty() => {
                return Err(RestoreError::Empty {
                    location: location.into(),
                })
            }
            RestoreAt::Current => "named by CURRENT".to_string(),
            RestoreAt::Step(s) => format!("at step {s}"),
            RestoreAt::Id(id) => id.to_string(),
        };
        return Err(RestoreError::NoState {
            location: location.into(),
            arg,
            what,
            steps,
        });
    }
    restore_model(ckpts, at).await.map_err(failed)
}

/// Restore the state `at` names from the store at `location` (a directory, which must exist,
/// or s3://bucket/prefix with the settings `opts` and the AWS variables give), on a runtime of
/// its own.
pub fn restore(
    location: &str,
    opts: &LocationOptions,
    at: &RestoreAt,
    arg: &'static str,
) -> Result<ModelState> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(RestoreError::Runtime)?;
    rt.block_on(async {
        let ckpts = open_store(location, &opts.clone().or(LocationOptions::from_env())).await?;
        restore_from(&ckpts, location, at, arg).await
    })
}

/// The model's shape and optimizers, as far as the checkpoint and the arguments tell.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The preset: its MLP widths and dim are the checkpoint's; its tables the checkpoint's.
    pub preset: Preset,
    /// Whether the checkpoint's tables are the preset's own (else they came from TSV data).
    pub preset_tables: bool,
    pub sparse: Optimizer,
    pub dense: Optimizer,
}

/// Work out the shape of `state` from the arguments: `preset` names the preset (else the one
/// whose tables, dim and dense size fit, or else the last one whose dim and dense size fit:
/// `kaggle`, as `ftrec train --data` names a model of TSV data), `sparse`/`dense` the
/// optimizer kinds (else the preset's); each is checked against the checkpoint.
pub fn shape(
    state: &ModelState,
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
    names: &ArgNames,
) -> Result<Shape> {
    let rows = state.table_rows();
    let layout = state
        .layout()
        .ok_or_else(|| RestoreError::Shape("the checkpoint holds no embedding table".into()))?;
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
            let p = Preset::by_name(name).map_err(|e| RestoreError::InvalidArgument {
                arg: names.preset,
                value: name.into(),
                reason: e.to_string(),
            })?;
            if !fits_mlp(&p) {
                return Err(RestoreError::Shape(format!(
                    "the checkpoint's model ({}) is not preset {name}'s shape (dim {}, bottom \
                     MLP {:?}, top MLP {:?})",
                    described(),
                    p.dim,
                    p.mlp.bottom,
                    p.mlp.top
                )));
            }
            p
        }
        None => {
            let all: Vec<Preset> = Preset::NAMES
                .iter()
                .filter_map(|n| Preset::by_name(n).ok())
                .collect();
            match all
                .iter()
                .find(|p| p.table_rows == rows && fits_mlp(p))
                .or_else(|| all.iter().rev().find(|p| fits_mlp(p)))
            {
                Some(p) => p.clone(),
                None => {
                    return Err(RestoreError::Shape(format!(
                        "the checkpoint's model ({}) fits no preset ({})",
                        described(),
                        Preset::NAMES.join(", ")
                    )))
                }
            }
        }
    };
    let preset_tables = p.table_rows == rows;
    p.table_rows = rows;
    let kind = |arg: &'static str, name: Option<&str>, default: OptimizerKind| {
        let k = match name {
            Some(n) => n
                .parse::<OptimizerKind>()
                .map_err(|e| RestoreError::InvalidArgument {
                    arg,
                    value: n.into(),
                    reason: e.to_string(),
                })?,
            None => default,
        };
        Ok::<_, RestoreError>(Optimizer::new(k, 0.0))
    };
    let sparse = kind(names.optimizer, sparse, p.sparse_optimizer)?;
    let dense = kind(names.dense_optimizer, dense, p.dense_optimizer)?;
    if sparse.state_words(layout.dim) != layout.state_words {
        return Err(RestoreError::Shape(format!(
            "the checkpoint's rows carry {} optimizer words each; sparse optimizer {} keeps {} \
             (name the run's with {})",
            layout.state_words,
            sparse.kind,
            sparse.state_words(layout.dim),
            names.optimizer
        )));
    }
    if !state.dense_values.is_empty()
        && dense.state_words(DENSE_BLOCK) != state.dense_state_per_block
    {
        return Err(RestoreError::Shape(format!(
            "the checkpoint's dense blocks carry {} optimizer words each; dense optimizer {} \
             keeps {} (name the run's with {})",
            state.dense_state_per_block,
            dense.kind,
            dense.state_words(DENSE_BLOCK),
            names.dense_optimizer
        )));
    }
    Ok(Shape {
        preset: p,
        preset_tables,
        sparse,
        dense,
    })
}

/// Check the names of a preset and of the optimizers before anything is read: a misspelt one
/// is refused up front, not after a restore.
pub fn check_names(
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
    names: &ArgNames,
) -> Result<()> {
    if let Some(p) = preset {
        Preset::by_name(p).map_err(|e| RestoreError::InvalidArgument {
            arg: names.preset,
            value: p.into(),
            reason: e.to_string(),
        })?;
    }
    for (arg, name) in [(names.optimizer, sparse), (names.dense_optimizer, dense)] {
        if let Some(n) = name {
            n.parse::<OptimizerKind>()
                .map_err(|e| RestoreError::InvalidArgument {
                    arg,
                    value: n.into(),
                    reason: e.to_string(),
                })?;
        }
    }
    Ok(())
}

/// [`shape`] with every setting not given taken from the job record `job`, if any.
pub fn shape_with_job(
    state: &ModelState,
    job: Option<&JobDefaults>,
    preset: Option<&str>,
    sparse: Option<&str>,
    dense: Option<&str>,
    names: &ArgNames,
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
        names,
    )
}

/// The dense parameters of `state` with `opt`'s state layout (checked by [`shape`]).
pub fn dense_params(state: &mut ModelState, opt: &Optimizer) -> Result<DenseParams> {
    let mut d = DenseParams::new(std::mem::take(&mut state.dense_values), opt);
    if d.state.len() != state.dense_state.len() {
        return Err(RestoreError::Shape(format!(
            "the checkpoint holds {} dense optimizer words; {} blocks of {} keep {}",
            state.dense_state.len(),
            d.blocks(),
            opt.kind,
            d.state.len()
        )));
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

/// Where a tensor's values are in a [`ModelState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorSource {
    /// A range of the dense values.
    Dense(Range<usize>),
    /// The whole dense optimizer state.
    DenseState,
    /// Words `columns` of every row of table `table`.
    Table { table: usize, columns: Range<usize> },
}

/// One tensor of the model: its name, its shape (row-major) and where its values are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub source: TensorSource,
}

impl TensorSpec {
    /// Values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Call `f` with the tensor's values in order, a contiguous run at a time (the whole
    /// tensor, or one row's columns). `state` must be the one the spec was made for.
    pub fn visit(&self, state: &ModelState, mut f: impl FnMut(&[f32])) {
        match &self.source {
            TensorSource::Dense(r) => f(&state.dense_values[r.clone()]),
            TensorSource::DenseState => f(&state.dense_state),
            TensorSource::Table { table, columns } => {
                let t = &state.tables[*table];
                let w = t.layout().words();
                for row in t.as_slice().chunks_exact(w) {
                    f(&row[columns.clone()]);
                }
            }
        }
    }

    /// The tensor's values, copied out of `state`.
    pub fn to_vec(&self, state: &ModelState) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        self.visit(state, |run| out.extend_from_slice(run));
        out
    }
}

/// The tensors of a model of shape `cfg` (its MLPs; tables and dim from the arguments) with
/// rows of `layout`, tables of `table_rows` rows, `dense_values` dense values and
/// `dense_state_per_block` optimizer words per dense block; with `optimizer_state`, the
/// optimizer state too (none for an optimizer without state).
pub fn tensor_specs(
    cfg: &DlrmConfig,
    layout: RowLayout,
    table_rows: &[u64],
    dense_values: usize,
    dense_state_per_block: usize,
    optimizer_state: bool,
) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    for l in cfg.linear_layers() {
        let part = if l.top { "top_mlp" } else { "bottom_mlp" };
        out.push(TensorSpec {
            name: format!("{part}.{}.weight", l.index),
            shape: vec![l.output, l.input],
            source: TensorSource::Dense(l.weight_offset..l.bias_offset),
        });
        out.push(TensorSpec {
            name: format!("{part}.{}.bias", l.index),
            shape: vec![l.output],
            source: TensorSource::Dense(l.bias_offset..l.bias_offset + l.output),
        });
    }
    for (t, &rows) in table_rows.iter().enumerate() {
        let rows = rows as usize;
        out.push(TensorSpec {
            name: format!("embedding.{t}.weight"),
            shape: vec![rows, layout.dim],
            source: TensorSource::Table {
                table: t,
                columns: 0..layout.dim,
            },
        });
        if optimizer_state && layout.state_words > 0 {
            out.push(TensorSpec {
                name: format!("embedding.{t}.optimizer_state"),
                shape: vec![rows, layout.state_words],
                source: TensorSource::Table {
                    table: t,
                    columns: layout.dim..layout.words(),
                },
            });
        }
    }
    if optimizer_state && dense_state_per_block > 0 {
        out.push(TensorSpec {
            name: "dense.optimizer_state".into(),
            shape: vec![dense_values.div_ceil(DENSE_BLOCK), dense_state_per_block],
            source: TensorSource::DenseState,
        });
    }
    out
}

/// The tensors of `state`, shaped by `shape` (see [`tensor_specs`]).
pub fn tensors_of(
    state: &ModelState,
    shape: &Shape,
    optimizer_state: bool,
) -> Result<Vec<TensorSpec>> {
    let layout = state
        .layout()
        .ok_or_else(|| RestoreError::Shape("the checkpoint holds no embedding table".into()))?;
    Ok(tensor_specs(
        &DlrmConfig::from_preset(&shape.preset),
        layout,
        &state.table_rows(),
        state.dense_values.len(),
        state.dense_state_per_block,
        optimizer_state,
    ))
}

/// The tensors `specs` names, `state` consumed: a table's first columns (the embedding
/// weights) are compacted in its own buffer, which becomes the tensor (no copy when the rows
/// carry no optimizer state); other columns, and the dense tensors, are copied. The peak is
/// the model plus one table's optimizer state.
pub fn take_tensors(mut state: ModelState, specs: &[TensorSpec]) -> Vec<Vec<f32>> {
    let mut out: Vec<Option<Vec<f32>>> = vec![None; specs.len()];
    // Everything that is copied, first, while the tables are whole.
    let takes_table = |s: &TensorSpec| matches!(&s.source, TensorSource::Table { columns, .. } if columns.start == 0);
    let mut taker: Vec<Option<usize>> = vec![None; state.tables.len()];
    for (i, s) in specs.iter().enumerate() {
        match &s.source {
            TensorSource::Table { table, .. } if takes_table(s) && taker[*table].is_none() => {
                taker[*table] = Some(i)
            }
            _ => out[i] = Some(s.to_vec(&state)),
        }
    }
    let tables = std::mem::take(&mut state.tables);
    for (t, table) in tables.into_iter().enumerate() {
        let Some(i) = taker[t] else { continue };
        let TensorSource::Table { columns, .. } = &specs[i].source else {
            continue;
        };
        let (w, n) = (table.layout().words(), columns.end);
        let mut v = table.into_vec();
        if n < w {
            let rows = v.len() / w;
            for r in 1..rows {
                v.copy_within(r * w..r * w + n, r * n);
            }
            v.truncate(rows * n);
            v.shrink_to_fit();
        }
        out[i] = Some(v);
    }
    out.into_iter().map(Option::unwrap_or_default).collect()
}

/// The `__metadata__` of a safetensors export of `state` shaped by `shape`.
pub fn metadata(state: &ModelState, shape: &Shape, optimizer_state: bool) -> Vec<(String, String)> {
    [
        ("format", FORMAT.to_string()),
        ("format_version", FORMAT_VERSION.to_string()),
        ("step", state.step().to_string()),
        ("checkpoint", state.manifest.id.to_string()),
        ("preset", shape.preset.name.clone()),
        ("dim", state.layout().map_or(0, |l| l.dim).to_string()),
        ("tables", state.tables.len().to_string()),
        ("servers", state.servers.to_string()),
        ("sparse_optimizer", shape.sparse.kind.to_string()),
        ("dense_optimizer", shape.dense.kind.to_string()),
        ("dense_block", DENSE_BLOCK.to_string()),
        ("optimizer_state", optimizer_state.to_string()),
        (
            "interaction",
            "dot: bottom output, then z_a.z_b for a < b, row-major upper triangle".to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_ckpt::{CheckpointKind, DataPosition, Manifest};
    use ftrec_core::{EmbeddingTable, TableId};

    const PY: ArgNames = ArgNames {
        at: "at",
        preset: "preset",
        optimizer: "optimizer",
        dense_optimizer: "dense_optimizer",
    };

    fn manifest(id: &str, kind: CheckpointKind, step: u64, parent: Option<&str>) -> Manifest {
        Manifest {
            id: CheckpointId::new(id).unwrap(),
            kind,
            step,
            parents: parent
                .map(|p| CheckpointId::new(p).unwrap())
                .into_iter()
                .collect(),
            data_position: DataPosition::None,
            shards: vec![],
            files: vec![],
            extra: Default::default(),
        }
    }

    /// The tiny preset's model with distinct values in every word, rows carrying
    /// `state_words` optimizer words and dense blocks `dense_spb`.
    fn tiny_state(state_words: usize, dense_spb: usize) -> ModelState {
        let p = Preset::tiny();
        let layout = RowLayout::new(p.dim, state_words);
        let mut next = 0f32;
        let mut tables = Vec::new();
        for (t, &rows) in p.table_rows.iter().enumerate() {
            let mut table = EmbeddingTable::zeros(TableId(t as u32), rows, layout);
            for x in table.as_mut_slice() {
                *x = next;
                next += 1.0;
            }
            tables.push(table);
        }
        let dense_values = DlrmConfig::from_preset(&p).param_count();
        let blocks = dense_values.div_ceil(DENSE_BLOCK);
        ModelState {
            manifest: manifest("00000000000000000010-full", CheckpointKind::Full, 10, None),
            chain: vec![],
            servers: 2,
            tables,
            dense_values: (0..dense_values).map(|i| -(i as f32)).collect(),
            dense_state: (0..blocks * dense_spb).map(|i| i as f32 + 0.5).collect(),
            dense_state_per_block: dense_spb,
        }
    }

    #[test]
    fn at_is_a_step_or_an_id_and_a_bad_one_names_the_argument() {
        assert_eq!(parse_at(None, "--at").unwrap(), RestoreAt::Current);
        assert_eq!(parse_at(Some("42"), "--at").unwrap(), RestoreAt::Step(42));
        assert!(matches!(
            parse_at(Some("00000000000000000042-delta-a0"), "at").unwrap(),
            RestoreAt::Id(_)
        ));
        for bad in ["../x", "", "99999999999999999999999"] {
            let e = parse_at(Some(bad), "at").unwrap_err();
            assert!(
                matches!(&e, RestoreError::InvalidArgument { arg: "at", value, .. } if value == bad),
                "{e}"
            );
            assert!(e.to_string().starts_with(&format!("at {bad:?}: ")), "{e}");
        }
    }

    #[test]
    fn tensors_are_named_and_shaped_as_the_export_documents() {
        let p = Preset::tiny();
        let cfg = DlrmConfig::from_preset(&p);
        let layout = RowLayout::new(8, 1);
        let dense = cfg.param_count();
        let specs = tensor_specs(&cfg, layout, &p.table_rows, dense, 2, false);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            &names[..8],
            [
                "bottom_mlp.0.weight",
                "bottom_mlp.0.bias",
                "bottom_mlp.1.weight",
                "bottom_mlp.1.bias",
                "top_mlp.0.weight",
                "top_mlp.0.bias",
                "top_mlp.1.weight",
                "top_mlp.1.bias",
            ]
        );
        // 13 dense inputs -> 32 -> 8; the top MLP's input is 8 + C(27, 2) = 359 wide.
        assert_eq!(specs[0].shape, [32, 13]);
        assert_eq!(specs[2].shape, [8, 32]);
        assert_eq!(specs[4].shape, [32, 8 + 27 * 26 / 2]);
        assert_eq!(specs[7].shape, [1]);
        // The dense tensors tile the dense vector, in order.
        let mut at = 0;
        for s in &specs[..8] {
            let TensorSource::Dense(r) = &s.source else {
                panic!("{} is not dense", s.name)
            };
            assert_eq!((r.start, r.len()), (at, s.len()), "{}", s.name);
            at = r.end;
        }
        assert_eq!(at, dense);
        assert_eq!(specs.len(), 8 + 26);
        for (t, s) in specs[8..].iter().enumerate() {
            assert_eq!(s.name, format!("embedding.{t}.weight"));
            assert_eq!(s.shape, [p.table_rows[t] as usize, 8]);
            assert_eq!(
                s.source,
                TensorSource::Table {
                    table: t,
                    columns: 0..8
                }
            );
        }
        // The optimizer state: one tensor per table and one for the dense blocks.
        let with = tensor_specs(&cfg, layout, &p.table_rows, dense, 2, true);
        assert_eq!(with.len(), 8 + 2 * 26 + 1);
        assert_eq!(with[9].name, "embedding.0.optimizer_state");
        assert_eq!(with[9].shape, [p.table_rows[0] as usize, 1]);
        let last = with.last().unwrap();
        assert_eq!(last.name, "dense.optimizer_state");
        assert_eq!(last.shape, [dense.div_ceil(DENSE_BLOCK), 2]);
        // SGD keeps no state: no optimizer tensors at all.
        let sgd = tensor_specs(&cfg, RowLayout::new(8, 0), &p.table_rows, dense, 0, true);
        assert_eq!(sgd.len(), 8 + 26);
    }

    #[test]
    fn taken_tensors_are_the_visited_values() {
        for (words, spb, opt_state) in [(1, 2, false), (1, 2, true), (0, 0, true), (17, 3, true)] {
            let state = tiny_state(words, spb);
            let shape = Shape {
                preset: Preset::tiny(),
                preset_tables: true,
                sparse: Optimizer::new(OptimizerKind::Sgd, 0.0),
                dense: Optimizer::new(OptimizerKind::Sgd, 0.0),
            };
            let specs = tensors_of(&state, &shape, opt_state).unwrap();
            let copied: Vec<Vec<f32>> = specs.iter().map(|s| s.to_vec(&state)).collect();
            for (s, v) in specs.iter().zip(&copied) {
                assert_eq!(v.len(), s.len(), "{}", s.name);
            }
            // Row 1 of table 0 starts after row 0's words.
            let w1 = &copied[8];
            assert_eq!(&w1[8..10], [(8 + words) as f32, (9 + words) as f32]);
            let taken = take_tensors(state, &specs);
            assert_eq!(taken, copied, "words {words}, optimizer state {opt_state}");
        }
    }

    #[test]
    fn the_shape_comes_from_the_checkpoint_and_a_misfit_names_the_argument() {
        // The tiny preset's optimizers: row-wise Adagrad (1 word a row), Adagrad (a word a
        // dense value).
        let state = tiny_state(1, DENSE_BLOCK);
        let s = shape(&state, None, None, None, &PY).unwrap();
        assert_eq!(s.preset.name, "tiny");
        assert!(s.preset_tables);
        assert_eq!(s.sparse.kind, OptimizerKind::RowWiseAdagrad);
        let e = shape(&state, None, Some("adam"), None, &PY)
            .unwrap_err()
            .to_string();
        assert!(e.contains("(name the run's with optimizer)"), "{e}");
        let e = shape(&state, Some("small"), None, None, &ArgNames::FLAGS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not preset small's shape"), "{e}");
        let e = check_names(Some("huge"), None, None, &PY).unwrap_err();
        assert!(
            matches!(e, RestoreError::InvalidArgument { arg: "preset", .. }),
            "{e}"
        );
        let e = check_names(None, None, Some("lion"), &ArgNames::FLAGS).unwrap_err();
        assert!(
            e.to_string().starts_with("--dense-optimizer \"lion\": "),
            "{e}"
        );
    }

    #[test]
    fn a_state_is_named_by_its_step_or_id_and_a_missing_one_lists_the_steps() {
        let lineage = Lineage::from_manifests(
            &[
                manifest("00000000000000000004-full", CheckpointKind::Full, 4, None),
                manifest(
                    "00000000000000000008-delta",
                    CheckpointKind::Delta,
                    8,
                    Some("00000000000000000004-full"),
                ),
            ],
            None,
        );
        let id = |s: &str| RestoreAt::Id(CheckpointId::new(s).unwrap());
        assert!(names_state(&lineage, &RestoreAt::Current));
        assert!(names_state(&lineage, &RestoreAt::Step(8)));
        assert!(!names_state(&lineage, &RestoreAt::Step(7)));
        assert!(names_state(&lineage, &id("00000000000000000004-full")));
        assert!(!names_state(&lineage, &id("00000000000000000012-delta")));
        assert!(!names_state(&Lineage::default(), &RestoreAt::Current));
        let e = RestoreError::NoState {
            location: "st".into(),
            arg: "at",
            what: "at step 7".into(),
            steps: vec![4, 8],
        };
        assert_eq!(
            e.to_string(),
            "st has no state at step 7 (its states are at steps 4, 8): give at one of these"
        );
        assert_eq!(known_states(&[20]), " (its one state is at step 20)");
        let many: Vec<u64> = (1..=20).collect();
        assert_eq!(
            known_states(&many),
            " (its 20 states are at steps 1, 2, 3, 4, ..., 17, 18, 19, 20)"
        );
    }
}

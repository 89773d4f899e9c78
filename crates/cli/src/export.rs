//! `ftrec ckpt export`: a checkpoint's model as one safetensors file.
//!
//! Tensors (all `F32`, little-endian, row-major):
//! - `bottom_mlp.{i}.weight` `[out, in]` and `bottom_mlp.{i}.bias` `[out]`, `i` the bottom
//!   MLP's linear layers from 0 (a ReLU after each); `top_mlp.{i}.weight`, `top_mlp.{i}.bias`
//!   likewise (a ReLU after each but the last, whose output is the click logit). The weight is
//!   PyTorch's `nn.Linear.weight` layout. The top MLP's input is the bottom output then the dots
//!   `z_a . z_b` for `a < b` in row-major order of the strict upper triangle (`z_0` the bottom
//!   output, `z_1..` the pooled embeddings in table order);
//! - `embedding.{t}.weight` `[rows, dim]`: table `t`, rows in global id order (sum pooling);
//! - with `--optimizer-state`: `embedding.{t}.optimizer_state` `[rows, words]` (the sparse
//!   optimizer's words per row: row-wise Adagrad 1, Adagrad and momentum `dim`, Adam
//!   `2 * dim + 1`; SGD has none, so no tensor) and `dense.optimizer_state` `[blocks, words]`
//!   (none for SGD either):
//!   the dense vector (every layer's weight then bias, bottom then top, in the order above) is
//!   cut into blocks of 256 values, each with one slot of the dense optimizer's words for 256
//!   values (the last block's slot is used as far as its values need).
//!
//! `__metadata__` holds `format` (`ftrec-dlrm`), `format_version` (`1`), `step`, `checkpoint`,
//! `preset`, `dim`, `tables`, `servers`, `sparse_optimizer`, `dense_optimizer`,
//! `dense_block` (`256`), `optimizer_state` (`true`/`false`) and `interaction`.
//!
//! Memory: the restored model is held whole (values and optimizer state), plus one tensor's
//! bytes while it is written. The file is written to a temporary name next to `--out` and
//! renamed into place, so a failed export leaves no partial file.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use ftrec_core::{EmbeddingTable, DENSE_BLOCK};
use ftrec_model::DlrmConfig;
use safetensors::tensor::{Dtype, View};

use crate::restored;

/// Format name and version in `__metadata__`.
pub const FORMAT: &str = "ftrec-dlrm";
pub const FORMAT_VERSION: &str = "1";

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: crate::ckpt_cmd::StoreArgs,
    /// The state at exactly this step, or a checkpoint id [default: CURRENT, the newest
    /// committed state].
    #[arg(long, value_name = "STEP|ID")]
    pub at: Option<String>,
    /// The safetensors file to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Also write the embedding rows' and the dense blocks' optimizer state.
    #[arg(long)]
    pub optimizer_state: bool,
    /// Overwrite --out if it exists.
    #[arg(long)]
    pub force: bool,
    /// Preset the run trained (its MLP widths name the dense layers) [default: the store's job
    /// record's, else the preset whose tables and MLP the checkpoint has].
    #[arg(long)]
    pub preset: Option<String>,
    /// The run's embedding optimizer, checked against the rows' state width [default: the job
    /// record's, else the preset's].
    #[arg(long)]
    pub optimizer: Option<String>,
    /// The run's dense optimizer, checked against the dense state width [default: the job
    /// record's, else the preset's].
    #[arg(long)]
    pub dense_optimizer: Option<String>,
}

/// One tensor to write: where its values are, read when the writer asks for its bytes.
enum Source<'a> {
    /// A contiguous range of f32s.
    Flat(&'a [f32]),
    /// Words `lo..hi` of every row of a table.
    Columns {
        table: &'a EmbeddingTable,
        lo: usize,
        hi: usize,
    },
}

struct Tensor<'a> {
    shape: Vec<usize>,
    src: Source<'a>,
}

impl View for &Tensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data_len());
        match &self.src {
            Source::Flat(v) => {
                for x in *v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Source::Columns { table, lo, hi } => {
                let w = table.layout().words();
                for row in table.as_slice().chunks_exact(w) {
                    for x in &row[*lo..*hi] {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        4 * self.shape.iter().product::<usize>()
    }
}

pub fn run(a: ExportArgs) -> Result<()> {
    if a.out.exists() && !a.force {
        bail!(
            "--out {} exists (give --force to overwrite it)",
            a.out.display()
        );
    }
    let at = restored::parse_at(a.at.as_deref())?;
    restored::check_names(
        a.preset.as_deref(),
        a.optimizer.as_deref(),
        a.dense_optimizer.as_deref(),
    )?;
    // The job record (small) before the model (the whole of it): a damaged record is refused
    // before any restore work.
    let job = restored::job_defaults(&a.store.location, &a.store.options())?;
    let (state, shape) = restored::restore_shaped(
        "ckpt export",
        &a.store.location,
        &a.store.options(),
        &at,
        job.as_ref(),
        a.preset.as_deref(),
        a.optimizer.as_deref(),
        a.dense_optimizer.as_deref(),
    )?;
    let cfg = DlrmConfig::from_preset(&shape.preset);
    let layout = state
        .layout()
        .context("the checkpoint holds no embedding table")?;
    let dim = layout.dim;

    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let dense = &state.dense_values;
    for l in cfg.linear_layers() {
        let part = if l.top { "top_mlp" } else { "bottom_mlp" };
        tensors.push((
            format!("{part}.{}.weight", l.index),
            Tensor {
                shape: vec![l.output, l.input],
                src: Source::Flat(&dense[l.weight_offset..l.bias_offset]),
            },
        ));
        tensors.push((
            format!("{part}.{}.bias", l.index),
            Tensor {
                shape: vec![l.output],
                src: Source::Flat(&dense[l.bias_offset..l.bias_offset + l.output]),
            },
        ));
    }
    for (t, table) in state.tables.iter().enumerate() {
        let rows = table.rows() as usize;
        tensors.push((
            format!("embedding.{t}.weight"),
            Tensor {
                shape: vec![rows, dim],
                src: Source::Columns {
                    table,
                    lo: 0,
                    hi: dim,
                },
            },
        ));
        if a.optimizer_state && layout.state_words > 0 {
            tensors.push((
                format!("embedding.{t}.optimizer_state"),
                Tensor {
                    shape: vec![rows, layout.state_words],
                    src: Source::Columns {
                        table,
                        lo: dim,
                        hi: layout.words(),
                    },
                },
            ));
        }
    }
    if a.optimizer_state && state.dense_state_per_block > 0 {
        let blocks = dense.len().div_ceil(DENSE_BLOCK);
        tensors.push((
            "dense.optimizer_state".into(),
            Tensor {
                shape: vec![blocks, state.dense_state_per_block],
                src: Source::Flat(&state.dense_state),
            },
        ));
    }
    let metadata: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("format_version", FORMAT_VERSION.to_string()),
        ("step", state.step().to_string()),
        ("checkpoint", state.manifest.id.to_string()),
        ("preset", shape.preset.name.clone()),
        ("dim", dim.to_string()),
        ("tables", state.tables.len().to_string()),
        ("servers", state.servers.to_string()),
        ("sparse_optimizer", shape.sparse.kind.to_string()),
        ("dense_optimizer", shape.dense.kind.to_string()),
        ("dense_block", DENSE_BLOCK.to_string()),
        ("optimizer_state", a.optimizer_state.to_string()),
        (
            "interaction",
            "dot: bottom output, then z_a.z_b for a < b, row-major upper triangle".to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();

    let tmp = tmp_path(&a.out);
    let written = safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
        &tmp,
    );
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(anyhow::anyhow!("{e}")).with_context(|| format!("writing {}", tmp.display()));
    }
    if a.out.exists() && !a.force {
        let _ = std::fs::remove_file(&tmp);
        bail!("--out {} appeared while exporting", a.out.display());
    }
    std::fs::rename(&tmp, &a.out).with_context(|| format!("writing {}", a.out.display()))?;
    let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    println!(
        "exported step {} ({}) to {}: {} tensors, {bytes} bytes",
        state.step(),
        state.manifest.id,
        a.out.display(),
        tensors.len()
    );
    Ok(())
}

/// `DIR/.NAME.tmp-PID`: next to the output, so the rename stays on one file system.
fn tmp_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("export".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

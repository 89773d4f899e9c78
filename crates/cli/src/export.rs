//! `ftrec ckpt export`: a checkpoint's model as one safetensors file.
//!
//! Tensors (all `F32`, little-endian, row-major), named and laid out by
//! [`ftrec_cluster::restored`] (the names the Python package's `Store.state_dict` gives too):
//! - `bottom_mlp.{i}.weight` `[out, in]`, `bottom_mlp.{i}.bias` `[out]`, `top_mlp.{i}.weight`,
//!   `top_mlp.{i}.bias` (PyTorch's `nn.Linear` layout; the interaction and the ReLUs are in
//!   that module's doc);
//! - `embedding.{t}.weight` `[rows, dim]`: table `t`, rows in global id order (sum pooling);
//! - with `--optimizer-state`: `embedding.{t}.optimizer_state` `[rows, words]` and
//!   `dense.optimizer_state` `[blocks, words]` (none for SGD), the dense vector cut into blocks
//!   of 256 values.
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
use ftrec_ckpt::model_state::ModelState;
use ftrec_cluster::restored::{metadata, tensors_of, TensorSpec};
use safetensors::tensor::{Dtype, View};

use crate::restored;

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

/// One tensor to write: its values read out of the state when the writer asks for its bytes.
struct Tensor<'a> {
    spec: TensorSpec,
    state: &'a ModelState,
}

impl View for &Tensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.spec.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data_len());
        self.spec.visit(self.state, |run| {
            for x in run {
                out.extend_from_slice(&x.to_le_bytes());
            }
        });
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        4 * self.spec.len()
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
    let tensors: Vec<(String, Tensor)> = tensors_of(&state, &shape, a.optimizer_state)?
        .into_iter()
        .map(|spec| {
            (
                spec.name.clone(),
                Tensor {
                    spec,
                    state: &state,
                },
            )
        })
        .collect();
    let metadata: HashMap<String, String> = metadata(&state, &shape, a.optimizer_state)
        .into_iter()
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

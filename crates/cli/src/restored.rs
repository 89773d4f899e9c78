//! A checkpoint's model in memory with the shape it was trained with: what `ftrec eval` and
//! `ftrec ckpt export` start from. The work is [`ftrec_cluster::restored`]'s (shared with the
//! Python package); this module spells its arguments as flags and says on stderr what was read.

use anyhow::Result;
use ftrec_ckpt::deck::RestoreAt;
use ftrec_ckpt::location::LocationOptions;
use ftrec_ckpt::model_state::ModelState;
use ftrec_ckpt::Checkpoints;
use ftrec_cluster::restored::{self as lib, ArgNames};
pub use ftrec_cluster::restored::{dense_params, job_defaults, JobDefaults, Shape};

/// Open the store at `location` for reading or maintenance: it must exist and be a store,
/// else one error naming it ([`lib::open_store`]).
pub async fn open_store(location: &str, opts: &LocationOptions) -> Result<Checkpoints> {
    Ok(lib::open_store(location, opts).await?)
}

/// `--at`: a step (exactly that step's state) or a checkpoint id; none: `CURRENT`.
pub fn parse_at(at: Option<&str>) -> Result<RestoreAt> {
    Ok(lib::parse_at(at, ArgNames::FLAGS.at)?)
}

/// Check `--preset`, `--optimizer` and `--dense-optimizer` before anything is read.
pub fn check_names(preset: Option<&str>, sparse: Option<&str>, dense: Option<&str>) -> Result<()> {
    Ok(lib::check_names(preset, sparse, dense, &ArgNames::FLAGS)?)
}

/// Restore the state `at` names and work out its shape ([`lib::shape_with_job`]), saying on
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
    let state = lib::restore(location, opts, at, ArgNames::FLAGS.at)?;
    eprintln!("ftrec {command}: restored {}", lib::describe(&state));
    let shape = lib::shape_with_job(&state, job, preset, sparse, dense, &ArgNames::FLAGS)?;
    Ok((state, shape))
}

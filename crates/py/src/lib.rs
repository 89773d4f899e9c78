//! `ftrec-py`: the extension module `ftrec._ftrec` of the Python package `ftrec` (built by
//! maturin from `python/`; `scripts/python.sh` makes a venv with it).
//!
//! It owns the Python face of a checkpoint store, [`Store`]: a directory or
//! `s3://bucket/prefix` of any saving strategy opened from Python, its checkpoints as
//! `ftrec ckpt ls` lists them, its job record, what `ftrec ckpt verify` finds, and any
//! committed state as a dict of NumPy `float32` arrays under the names and shapes of
//! `ftrec ckpt export`'s safetensors file. It also owns the held-out set and reference
//! predictions of a store ([`heldout`]) and a Python trainer's door into a job,
//! [`client::EmbeddingClient`]: the worker loop of `ftrec worker` with the model handed to
//! Python. It only converts: opening, restoring, shaping and naming are
//! [`ftrec_cluster::restored`]'s and `ftrec_ckpt`'s, the code the `ftrec` binary runs. Work
//! on a store runs with the GIL released; a table's values become its array without a copy
//! when its rows carry no optimizer state (else the weights are compacted in place, still
//! without a second buffer). Every failure is a Python exception with one line
//! naming what to change ([`convert::raise_of`]), never a panic.
//!
//! ```python
//! import ftrec
//! store = ftrec.Store("deck-store")
//! [c["step"] for c in store.checkpoints()]
//! weights = store.state_dict(at=20)["embedding.0.weight"]   # numpy.ndarray [rows, dim]
//! ```

use std::path::PathBuf;

use ftrec_ckpt::deck::{Lineage, RestoreAt};
use ftrec_ckpt::location::LocationOptions;
use ftrec_ckpt::{incr, Checkpoints};
use ftrec_cluster::restored::{self as lib, RestoreError};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::PyArray;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

pub mod client;
pub mod convert;
pub mod heldout;

use convert::{Raise, ARGS};

create_exception!(
    ftrec,
    FtrecError,
    PyException,
    "A store could not be read: damage, or a store or service that failed."
);

/// `e` as the Python exception [`convert::raise_of`] picks.
fn py_err(e: RestoreError) -> PyErr {
    let msg = convert::message(&e);
    match convert::raise_of(&e) {
        Raise::FileNotFound => PyFileNotFoundError::new_err(msg),
        Raise::Value => PyValueError::new_err(msg),
        Raise::Ftrec => FtrecError::new_err(msg),
    }
}

/// A store failure while `doing` something with the store at `location`.
fn store_err(location: &str, doing: &str, e: &dyn std::error::Error) -> PyErr {
    FtrecError::new_err(format!("{doing} {location}: {}", convert::message(e)))
}

/// A JSON value as the Python object `json.loads` makes of it.
fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
}

/// The `at` argument: `None` (CURRENT), a step (an int, 0 or more) or a checkpoint id (a str;
/// a str of digits is a step, as `--at` reads it).
fn at_arg(at: Option<&Bound<'_, PyAny>>) -> PyResult<RestoreAt> {
    let Some(at) = at.filter(|a| !a.is_none()) else {
        return Ok(RestoreAt::Current);
    };
    if let Ok(s) = at.cast::<PyString>() {
        let s = s.to_cow()?;
        return lib::parse_at(Some(&s), ARGS.at).map_err(py_err);
    }
    if at.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "at={at}: give a step (int) or a checkpoint id (str), not a bool"
        )));
    }
    if let Ok(step) = at.extract::<u64>() {
        return Ok(RestoreAt::Step(step));
    }
    if at.hasattr("__index__")? {
        return Err(PyValueError::new_err(format!(
            "at={at}: a step is a whole number from 0 to {}",
            u64::MAX
        )));
    }
    Err(PyTypeError::new_err(format!(
        "at: give a step (int) or a checkpoint id (str), not {}",
        at.get_type().name()?
    )))
}

/// A checkpoint store: a directory or `s3://bucket/prefix` written by any saving strategy.
///
/// Opening checks that the location is a store (a missing directory is `FileNotFoundError`,
/// anything else that holds no store `ValueError`); nothing is created or written. S3 settings
/// not given come from the usual AWS variables, as the `ftrec` binary's do.
#[pyclass(module = "ftrec", name = "Store", frozen)]
struct Store {
    location: String,
    opts: LocationOptions,
    rt: tokio::runtime::Runtime,
    ckpts: Checkpoints,
}

impl Store {
    /// The key of a trainer's object `name`: under `trainer/` in the store's root.
    fn blob_key(&self, name: &str) -> PyResult<ftrec_ckpt::Key> {
        let bad = |why: String| PyValueError::new_err(format!("name {name:?}: {why}"));
        if name.is_empty()
            || name.starts_with('/')
            || name
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad(
                "give a relative path of plain names, e.g. dense/20.pt".into()
            ));
        }
        self.ckpts
            .key_of(&format!("trainer/{name}"))
            .map_err(|e| bad(e.to_string()))
    }
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (location, *, endpoint=None, region=None, access_key_id=None, secret_access_key=None, allow_http=None))]
    fn new(
        py: Python<'_>,
        location: PathBuf,
        endpoint: Option<String>,
        region: Option<String>,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        allow_http: Option<bool>,
    ) -> PyResult<Self> {
        let location = location
            .to_str()
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "location {location:?}: a store's location must be valid UTF-8"
                ))
            })?
            .to_string();
        let opts = LocationOptions {
            endpoint,
            region,
            access_key_id,
            secret_access_key,
            allow_http,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| FtrecError::new_err(format!("starting the async runtime: {e}")))?;
        let ckpts = py
            .detach(|| rt.block_on(lib::open_store(&location, &opts)))
            .map_err(py_err)?;
        Ok(Store {
            location,
            opts,
            rt,
            ckpts,
        })
    }

    /// The location given.
    #[getter]
    fn location(&self) -> &str {
        &self.location
    }

    fn __repr__(&self) -> String {
        format!("ftrec.Store({:?})", self.location)
    }

    /// Every readable checkpoint, in id order, as `ftrec ckpt ls` lists it: a dict with `id`,
    /// `kind` (`full`, `delta`, `merged`), `step`, `layer`, `bytes`, `parent`, `stands_for`,
    /// `merged_from`, `current` (CURRENT names it), `live` (the active lineage needs it), and
    /// for incremental pieces `scheme` and `column` (else None). Manifests that cannot be read
    /// are left out; `verify()` names them.
    fn checkpoints<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let listing = py
            .detach(|| {
                self.rt.block_on(async {
                    let lineage = Lineage::load(&self.ckpts).await?;
                    let incremental = incr::is_incremental_store(&self.ckpts).await?;
                    let mut out = Vec::new();
                    for l in lineage.listing() {
                        let piece = if incremental {
                            let m = self.ckpts.read_manifest(&l.node.id, None).await?;
                            let piece = m.pieces().next().map(|(_, s, c)| (s, c));
                            piece
                        } else {
                            None
                        };
                        out.push(convert::listed_json(&l, piece));
                    }
                    Ok::<_, ftrec_ckpt::CkptError>(out)
                })
            })
            .map_err(|e| store_err(&self.location, "listing", &e))?;
        to_py(py, &serde_json::Value::Array(listing))
    }

    /// The job record a saving `ftrec run` wrote into the store, as a dict (the run's settings:
    /// `preset`, `seed`, `servers`, `workers`, `strategy`, ...), or None for a store without
    /// one.
    fn job<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let job = py
            .detach(|| ftrec_cluster::job::read_if_any(&self.location, &self.opts))
            .map_err(|e| store_err(&self.location, "reading the job record of", &e))?;
        job.map(|j| to_py(py, &serde_json::Value::Object(j.fields)))
            .transpose()
    }

    /// Read every file of every checkpoint and check every checksum, as `ftrec ckpt verify`
    /// does. Damage is reported, not raised: `ok` (nothing found), `problems`, `checkpoints`
    /// (each with `ok`, `files`, `bytes`, `problem`), `unreadable` manifests, `damaged_files`
    /// and `down` states (incremental stores), `broken` (the head's lineage), `newest_intact`
    /// or `no_intact_state` after damage in an incremental store, and `report`, the lines the
    /// binary prints. Raises `FtrecError` only when the store cannot be read at all.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let check = py
            .detach(|| {
                self.rt
                    .block_on(ftrec_ckpt::verify::verify_store(&self.ckpts))
            })
            .map_err(|e| store_err(&self.location, "verifying", &e))?;
        to_py(py, &convert::check_json(&check))
    }

    /// The model of one state as a dict of NumPy `float32` arrays, with the names and shapes
    /// of `ftrec ckpt export`'s safetensors file (`bottom_mlp.{i}.weight`, ...,
    /// `embedding.{t}.weight` `[rows, dim]`; with `optimizer_state=True` also
    /// `embedding.{t}.optimizer_state` and `dense.optimizer_state`), in the file's order.
    ///
    /// `at`: None for the newest committed state (CURRENT), a step (int) for exactly that
    /// step's state, or a checkpoint id (str). `preset`, `optimizer` and `dense_optimizer`
    /// default to the store's job record, else to what the checkpoint's shape implies; each
    /// is checked against the checkpoint. The whole model is rebuilt in memory, the GIL
    /// released meanwhile; the arrays own the restored buffers.
    #[pyo3(signature = (at=None, *, optimizer_state=false, preset=None, optimizer=None, dense_optimizer=None))]
    fn state_dict<'py>(
        &self,
        py: Python<'py>,
        at: Option<&Bound<'py, PyAny>>,
        optimizer_state: bool,
        preset: Option<String>,
        optimizer: Option<String>,
        dense_optimizer: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let at = at_arg(at)?;
        let (preset, optimizer, dense_optimizer) = (
            preset.as_deref(),
            optimizer.as_deref(),
            dense_optimizer.as_deref(),
        );
        let (specs, values) = py
            .detach(|| {
                lib::check_names(preset, optimizer, dense_optimizer, &ARGS)?;
                // The job record (small) before the model (the whole of it).
                let job = lib::job_defaults(&self.location, &self.opts)?;
                let state = self.rt.block_on(lib::restore_from(
                    &self.ckpts,
                    &self.location,
                    &at,
                    ARGS.at,
                ))?;
                let shape = lib::shape_with_job(
                    &state,
                    job.as_ref(),
                    preset,
                    optimizer,
                    dense_optimizer,
                    &ARGS,
                )?;
                let specs = lib::tensors_of(&state, &shape, optimizer_state)?;
                let values = lib::take_tensors(state, &specs);
                Ok::<_, RestoreError>((specs, values))
            })
            .map_err(py_err)?;
        let out = PyDict::new(py);
        for (spec, v) in specs.into_iter().zip(values) {
            let array = ArrayD::from_shape_vec(IxDyn(&spec.shape), v)
                .map_err(|e| FtrecError::new_err(format!("tensor {}: {e}", spec.name)))?;
            out.set_item(spec.name, PyArray::from_owned_array(py, array))?;
        }
        Ok(out)
    }

    /// Keep `data` (bytes) in the store as `name` (a relative path such as `dense/20.pt`),
    /// beside the job's checkpoints and outside their collection: a trainer's own state for
    /// the job's steps (`ftrec.torch.DenseCheckpoints(store=...)`). Replaces an older object of
    /// that name.
    fn put_blob(&self, py: Python<'_>, name: &str, data: Vec<u8>) -> PyResult<()> {
        let key = self.blob_key(name)?;
        py.detach(|| {
            self.rt.block_on(self.ckpts.store().put(
                &key,
                data.into(),
                ftrec_ckpt::store::PutMode::Overwrite,
            ))
        })
        .map_err(|e| store_err(&self.location, &format!("writing {name} to"), &e))
    }

    /// The bytes `put_blob` kept as `name`, or None when there are none.
    fn get_blob<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let key = self.blob_key(name)?;
        match py.detach(|| self.rt.block_on(self.ckpts.store().get(&key))) {
            Ok(b) => Ok(Some(pyo3::types::PyBytes::new(py, &b))),
            Err(ftrec_ckpt::CkptError::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(
                &self.location,
                &format!("reading {name} from"),
                &e,
            )),
        }
    }

    /// The held-out set the store's job evaluates on and what the store's model predicts for
    /// it, as `ftrec eval --ckpt LOCATION` computes them (the job record's preset, seed, batch,
    /// data and held-out size; `samples` overrides the size): a dict with `dense` `[n, 13]`,
    /// `labels` `[n]`, `sparse` (per table a pair of `offsets` uint32 `[n + 1]` and `ids`
    /// uint64, sample `i` looking up `ids[offsets[i]:offsets[i+1]]`), `predictions` `[n]` (the
    /// click probabilities), `auc`, `logloss` and `step`. `at` as for `state_dict`.
    #[pyo3(signature = (at=None, *, samples=None))]
    fn held_out<'py>(
        &self,
        py: Python<'py>,
        at: Option<&Bound<'py, PyAny>>,
        samples: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let at = at_arg(at)?;
        let h = py
            .detach(|| {
                heldout::held_out(
                    &self.rt,
                    &self.ckpts,
                    &self.location,
                    &self.opts,
                    &at,
                    samples,
                )
            })
            .map_err(py_err)?;
        let n = h.eval.samples();
        let tables = h.eval.batches.first().map_or(0, |b| b.sparse.len());
        let mut dense = Vec::with_capacity(n * ftrec_core::NUM_DENSE);
        let mut labels = Vec::with_capacity(n);
        let mut offsets: Vec<Vec<u32>> = vec![vec![0]; tables];
        let mut ids: Vec<Vec<u64>> = vec![Vec::new(); tables];
        for b in &h.eval.batches {
            dense.extend_from_slice(&b.dense);
            labels.extend_from_slice(&b.labels);
            for (t, f) in b.sparse.iter().enumerate() {
                let base = ids[t].len() as u32;
                offsets[t].extend(f.offsets.iter().skip(1).map(|o| base + o));
                ids[t].extend_from_slice(&f.ids);
            }
        }
        let out = PyDict::new(py);
        let dense = numpy::ndarray::Array2::from_shape_vec((n, ftrec_core::NUM_DENSE), dense)
            .map_err(|e| FtrecError::new_err(format!("the held-out dense features: {e}")))?;
        out.set_item("dense", PyArray::from_owned_array(py, dense))?;
        out.set_item("labels", PyArray::from_vec(py, labels))?;
        let sparse = pyo3::types::PyList::empty(py);
        for (o, i) in offsets.into_iter().zip(ids) {
            sparse.append((PyArray::from_vec(py, o), PyArray::from_vec(py, i)))?;
        }
        out.set_item("sparse", sparse)?;
        out.set_item("predictions", PyArray::from_vec(py, h.predictions))?;
        out.set_item("auc", h.evaluation.auc)?;
        out.set_item("logloss", h.evaluation.logloss)?;
        out.set_item("step", h.step)?;
        Ok(out)
    }
}

/// AUC and logloss of click probabilities `probabilities` against 0/1 `labels` (float32 arrays
/// of one length), as every ftrec report computes them: a dict with `auc` and `logloss`.
#[pyfunction]
fn evaluate<'py>(
    py: Python<'py>,
    probabilities: numpy::PyReadonlyArray1<'py, f32>,
    labels: numpy::PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyDict>> {
    let (p, l) = (probabilities.as_slice()?, labels.as_slice()?);
    if p.len() != l.len() || p.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{} probabilities and {} labels: give one label per probability, at least one",
            p.len(),
            l.len()
        )));
    }
    let e = ftrec_worker::local::Evaluation::of(p, l)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let out = PyDict::new(py);
    out.set_item("auc", e.auc)?;
    out.set_item("logloss", e.logloss)?;
    Ok(out)
}

#[pymodule]
fn _ftrec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_class::<client::EmbeddingClient>()?;
    m.add_class::<client::Batch>()?;
    m.add("BatchLost", m.py().get_type::<client::BatchLost>())?;
    m.add("FtrecError", m.py().get_type::<FtrecError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

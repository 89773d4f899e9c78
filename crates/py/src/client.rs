//! `ftrec.EmbeddingClient`: a Python trainer as one worker of an ftrec job.
//!
//! The client is [`ftrec_cluster::worker::worker_process_with`], the worker the `ftrec worker`
//! command runs, on a thread of its own: it connects to the job's coordinator, takes the batches
//! the coordinator hands it, pulls the rows they look up from the servers, and pushes, stages
//! or commits (ECRec's two-phase commit) their gradients, as the strategy requires. Only the
//! model is different: instead of the preset's DLRM, [`External`] hands each batch to Python
//! and waits for the gradient of its pooled bags. Recovery stays the coordinator's: a batch
//! lost to a failure is sent again (to Python it is a [`BatchLost`] error), and a rollback of
//! the tables to a checkpoint is announced before the next batch (the hook the trainer
//! registers is called with the restored step).
//!
//! Python waits for the worker thread with the GIL released, in slices short enough to see
//! Ctrl-C; every message between the two is one of [`ToPy`] or [`FromPy`].

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ftrec_cluster::control::BatchTiming;
use ftrec_cluster::net::PeerAddr;
use ftrec_cluster::worker::{
    pull_pooled, sparse_update, worker_process_with, Trainer, WorkerLifetime, WorkerSetup,
};
use ftrec_cluster::ClusterError;
use ftrec_core::{Batch as DataBatch, SparseGradAccumulator, NUM_DENSE};
use ftrec_ps::grpc::GrpcClient;
use ftrec_ps::{ShardedClient, Update};
use numpy::ndarray::{Array1, Array2, Array3};
use numpy::{PyArray1, PyArray2, PyArray3, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::FtrecError;

create_exception!(
    ftrec,
    BatchLost,
    FtrecError,
    "A batch was lost to a failure before its update landed; the job sends it again. Skip to \
     the next batch (without stepping the dense optimizer)."
);

/// Longest wait for the coordinator's setup after connecting.
const SETUP_WAIT: Duration = Duration::from_secs(120);
/// How often a wait looks at Python's signals (Ctrl-C).
const SLICE: Duration = Duration::from_millis(100);

/// What the worker thread tells Python.
enum ToPy {
    /// The coordinator's setup: the job's tables and batch size.
    Setup {
        preset: String,
        table_rows: Vec<u64>,
        dim: usize,
        batch: usize,
        workers: u32,
        mlp: (Vec<usize>, Vec<usize>),
    },
    /// Train global batch `index`.
    Batch { index: u64, batch: Box<DataBatch> },
    /// The rows of the current batch, pooled `[batch x tables x dim]`.
    Rows(Result<Vec<f32>, String>),
    /// How the current batch ended.
    Finished {
        index: u64,
        outcome: Result<(), String>,
    },
    /// The tables were rolled back to their state after `batches` global batches.
    Rewound { batches: u64 },
    /// The worker ended: the coordinator stopped it (Ok) or it failed.
    Ended(Result<(), String>),
}

/// What Python tells the worker thread about the current batch.
enum FromPy {
    Lookup,
    Gradients { grad: Vec<f32>, loss: f64 },
    GiveUp(String),
}

/// The worker's model: Python, reached through two channels.
struct External {
    to_py: Sender<ToPy>,
    from_py: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<FromPy>>>,
    tables: usize,
    dim: usize,
    pooled: Vec<f32>,
    accs: Vec<SparseGradAccumulator>,
}

impl External {
    /// The trainer's answer for the batch being trained, in order.
    async fn answer(&self, index: u64) -> Result<FromPy, ClusterError> {
        self.from_py.lock().await.recv().await.ok_or_else(|| {
            ClusterError::Protocol(format!("the Python trainer went away during batch {index}"))
        })
    }
}

impl Trainer for External {
    async fn gradients(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &DataBatch,
        index: u64,
        timing: &mut BatchTiming,
    ) -> Result<(Update, f64), ClusterError> {
        let gone = || ClusterError::Protocol("the Python trainer went away".into());
        // Python's forward and backward count as compute: the time from handing the batch
        // over to its gradient, less the pulls made meanwhile.
        let start = std::time::Instant::now();
        let mut pulling = 0.0;
        self.to_py
            .send(ToPy::Batch {
                index,
                batch: Box::new(batch.clone()),
            })
            .map_err(|_| gone())?;
        loop {
            match self.answer(index).await? {
                FromPy::Lookup => {
                    let t = std::time::Instant::now();
                    let r =
                        pull_pooled(client, batch, self.dim, self.tables, &mut self.pooled, None)
                            .await;
                    let pulled = t.elapsed().as_secs_f64();
                    timing.pull_s += pulled;
                    pulling += pulled;
                    let reply = r
                        .as_ref()
                        .map(|_| self.pooled.clone())
                        .map_err(|e| e.to_string());
                    self.to_py.send(ToPy::Rows(reply)).map_err(|_| gone())?;
                    r?;
                }
                FromPy::Gradients { grad, loss } => {
                    let update = sparse_update(batch, self.dim, &grad, &mut self.accs)?;
                    timing.compute_s += (start.elapsed().as_secs_f64() - pulling).max(0.0);
                    return Ok((update, loss));
                }
                FromPy::GiveUp(reason) => {
                    return Err(ClusterError::Protocol(format!(
                        "the Python trainer gave batch {index} up: {reason}"
                    )))
                }
            }
        }
    }

    fn finished(&mut self, index: u64, outcome: Result<(), &ClusterError>) {
        let _ = self.to_py.send(ToPy::Finished {
            index,
            outcome: outcome.map_err(|e| e.to_string()),
        });
    }

    fn rewound(&mut self, batches: u64) {
        let _ = self.to_py.send(ToPy::Rewound { batches });
    }
}

/// The job's shape as the coordinator's setup gave it.
#[derive(Clone)]
struct Shape {
    preset: String,
    table_rows: Vec<u64>,
    dim: usize,
    batch: usize,
    workers: u32,
    /// The preset's DLRM MLP widths (bottom without its input, top without its input).
    mlp: (Vec<usize>, Vec<usize>),
}

/// The Python side's ends of the channels and where it stands.
struct Link {
    from_rust: Receiver<ToPy>,
    /// The batch Python holds (its index), if any.
    current: Option<u64>,
    /// The worker ended; its outcome.
    ended: Option<Result<(), String>>,
}

/// One worker of an ftrec job whose model is a Python trainer: the job's embedding tables live
/// on its servers, protected by its strategy.
///
/// `coordinator` is the job's control socket (`HOST:PORT`, what `ftrec run --workers-elsewhere`
/// prints, or `Job.control` of a job started from Python) and `worker` this worker's id (0 to
/// the job's workers - 1). The token and job id come from `$FTREC_AUTH_TOKEN` and
/// `$FTREC_JOB_ID` when the job uses them. Opening waits until the coordinator has set the
/// worker up and connected it to the servers.
///
/// Iterating gives the batches the coordinator hands this worker, until the job ends. For each:
/// `batch.lookup()` pulls the rows (a `[batch, tables, dim]` array of the pooled bags), and
/// `batch.send(grad, loss)` sends the gradient of that array; the servers apply the row
/// optimizer. A batch lost to a failure raises `BatchLost` from either call.
#[pyclass(module = "ftrec", name = "EmbeddingClient", frozen)]
pub struct EmbeddingClient {
    shape: Shape,
    worker: u32,
    to_rust: tokio::sync::mpsc::UnboundedSender<FromPy>,
    link: Mutex<Link>,
    on_rollback: Mutex<Option<Py<PyAny>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Wait for the worker thread's next message, the GIL released, Ctrl-C honoured.
fn recv(py: Python<'_>, link: &mut Link, limit: Option<Duration>) -> PyResult<ToPy> {
    let start = std::time::Instant::now();
    loop {
        if let Some(ended) = &link.ended {
            return Ok(ToPy::Ended(ended.clone()));
        }
        let rx = &mut link.from_rust;
        let got = py.detach(move || rx.recv_timeout(SLICE));
        match got {
            Ok(ToPy::Ended(r)) => {
                link.ended = Some(r.clone());
                return Ok(ToPy::Ended(r));
            }
            Ok(m) => return Ok(m),
            Err(RecvTimeoutError::Disconnected) => {
                let r = Err("the worker thread stopped".to_string());
                link.ended = Some(r.clone());
                return Ok(ToPy::Ended(r));
            }
            Err(RecvTimeoutError::Timeout) => {
                py.check_signals()?;
                if limit.is_some_and(|l| start.elapsed() >= l) {
                    return Err(FtrecError::new_err(format!(
                        "no word from the worker thread in {} s",
                        start.elapsed().as_secs()
                    )));
                }
            }
        }
    }
}

/// The worker's end as a Python exception (None: a normal stop).
fn ended_err(r: &Result<(), String>) -> Option<PyErr> {
    r.as_ref()
        .err()
        .map(|e| FtrecError::new_err(format!("the worker failed: {e}")))
}

#[pymethods]
impl EmbeddingClient {
    #[new]
    #[pyo3(signature = (coordinator, worker=0))]
    fn new(py: Python<'_>, coordinator: &str, worker: u32) -> PyResult<Self> {
        let addr: PeerAddr = coordinator
            .parse()
            .map_err(|e| PyValueError::new_err(format!("coordinator={coordinator:?}: {e}")))?;
        let auth = ftrec_cluster::auth::Auth::from_env()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let (to_py, from_rust) = std::sync::mpsc::channel();
        let (to_rust, from_py) = tokio::sync::mpsc::unbounded_channel();
        let from_py = Arc::new(tokio::sync::Mutex::new(from_py));
        let ends = to_py.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ftrec-worker-{worker}"))
            .spawn(move || {
                let r = worker_process_with(
                    &addr,
                    worker,
                    WorkerLifetime::Control,
                    &auth,
                    |setup: &WorkerSetup| {
                        let p = &setup.preset;
                        to_py
                            .send(ToPy::Setup {
                                preset: p.name.to_string(),
                                table_rows: p.table_rows.clone(),
                                dim: p.dim,
                                batch: setup.batch,
                                workers: setup.workers,
                                mlp: (p.mlp.bottom.clone(), p.mlp.top.clone()),
                            })
                            .map_err(|_| {
                                ClusterError::Protocol("the Python trainer went away".into())
                            })?;
                        Ok(External {
                            to_py: to_py.clone(),
                            from_py: from_py.clone(),
                            tables: p.table_rows.len(),
                            dim: p.dim,
                            pooled: Vec::new(),
                            accs: (0..p.table_rows.len())
                                .map(|_| SparseGradAccumulator::new(p.dim))
                                .collect(),
                        })
                    },
                );
                let _ = ends.send(ToPy::Ended(r.map_err(|e| e.to_string())));
            })
            .map_err(|e| PyRuntimeError::new_err(format!("starting the worker thread: {e}")))?;
        let mut link = Link {
            from_rust,
            current: None,
            ended: None,
        };
        let shape = match recv(py, &mut link, Some(SETUP_WAIT))? {
            ToPy::Setup {
                preset,
                table_rows,
                dim,
                batch,
                workers,
                mlp,
            } => Shape {
                preset,
                table_rows,
                dim,
                batch,
                workers,
                mlp,
            },
            ToPy::Ended(r) => {
                return Err(ended_err(&r).unwrap_or_else(|| {
                    FtrecError::new_err(format!(
                    "the coordinator at {coordinator} stopped worker {worker} before setting it up"
                ))
                }))
            }
            _ => {
                return Err(FtrecError::new_err(
                    "the worker thread spoke before its setup".to_string(),
                ))
            }
        };
        Ok(EmbeddingClient {
            shape,
            worker,
            to_rust,
            link: Mutex::new(link),
            on_rollback: Mutex::new(None),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// This worker's id.
    #[getter]
    fn worker(&self) -> u32 {
        self.worker
    }

    /// The job's workers.
    #[getter]
    fn workers(&self) -> u32 {
        self.shape.workers
    }

    /// The job's preset (its model shape and data).
    #[getter]
    fn preset(&self) -> &str {
        &self.shape.preset
    }

    /// Rows of each embedding table.
    #[getter]
    fn table_rows(&self) -> Vec<u64> {
        self.shape.table_rows.clone()
    }

    /// Embedding tables (one per categorical feature).
    #[getter]
    fn tables(&self) -> usize {
        self.shape.table_rows.len()
    }

    /// Width of a row.
    #[getter]
    fn dim(&self) -> usize {
        self.shape.dim
    }

    /// Samples per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.shape.batch
    }

    /// The preset's DLRM bottom MLP widths after its input (the dense features), e.g.
    /// `[512, 256, 64, 16]`: what `ftrec.torch.Dlrm` builds for this job.
    #[getter]
    fn bottom_mlp(&self) -> Vec<usize> {
        self.shape.mlp.0.clone()
    }

    /// The preset's DLRM top MLP widths after its input (the interaction), e.g. `[512, 256, 1]`.
    #[getter]
    fn top_mlp(&self) -> Vec<usize> {
        self.shape.mlp.1.clone()
    }

    /// Dense features per sample.
    #[getter]
    fn dense_features(&self) -> usize {
        NUM_DENSE
    }

    /// Call `hook(step)` when the job rolls its tables back to a checkpoint (full, deck,
    /// incrcp, incremental, cnr): `step` is the step the tables now hold, the batches after it
    /// come again, and the trainer reloads its dense part as of that step (see
    /// `ftrec.torch.DenseCheckpoints`). None removes the hook. Strategies that recover without
    /// a rollback (none, ecrec, cpr) never call it.
    fn on_rollback(&self, hook: Option<Py<PyAny>>) {
        *self.on_rollback.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next batch the coordinator hands this worker (None at the end of the job).
    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<Batch>>> {
        let py = slf.py();
        let me = slf.get();
        loop {
            let msg = {
                let mut link = me.link.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(index) = link.current {
                    return Err(PyRuntimeError::new_err(format!(
                        "batch {index} is still open: send its gradient (batch.send) or give it \
                         up (batch.give_up) before taking the next"
                    )));
                }
                recv(py, &mut link, None)?
            };
            match msg {
                ToPy::Batch { index, batch } => {
                    me.link.lock().unwrap_or_else(|e| e.into_inner()).current = Some(index);
                    let b = Batch::new(py, slf.clone().unbind(), index, &batch, &me.shape)?;
                    return Ok(Some(Py::new(py, b)?));
                }
                ToPy::Rewound { batches } => {
                    let hook = me
                        .on_rollback
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .map(|h| h.clone_ref(py));
                    if let Some(hook) = hook {
                        let step = batches / u64::from(me.shape.workers.max(1));
                        hook.call1(py, (step,))?;
                    }
                }
                ToPy::Ended(r) => {
                    me.join();
                    return match ended_err(&r) {
                        Some(e) => Err(e),
                        None => Ok(None),
                    };
                }
                ToPy::Setup { .. } | ToPy::Rows(_) | ToPy::Finished { .. } => {}
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ftrec.EmbeddingClient(worker={}, preset={:?}, tables={}, dim={}, batch_size={})",
            self.worker,
            self.shape.preset,
            self.shape.table_rows.len(),
            self.shape.dim,
            self.shape.batch
        )
    }
}

impl EmbeddingClient {
    fn join(&self) {
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }

    /// Send `msg` about batch `index` and wait for its answer.
    fn ask(&self, py: Python<'_>, index: u64, msg: FromPy) -> PyResult<ToPy> {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if link.current != Some(index) {
            return Err(PyRuntimeError::new_err(format!(
                "batch {index} is closed: it was sent or given up"
            )));
        }
        if self.to_rust.send(msg).is_err() {
            link.current = None;
            return Err(FtrecError::new_err("the worker thread stopped"));
        }
        recv(py, &mut link, None)
    }

    /// Close batch `index` (its update landed or it was lost).
    fn close(&self, index: u64) {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if link.current == Some(index) {
            link.current = None;
        }
    }
}

/// One batch of the job's data handed to this worker: `index` (global, from 1), `dense`
/// `[batch, 13]` float32 (the transformed dense features), `labels` `[batch]` float32, and
/// `sparse`, per table a pair (`offsets` uint32 `[batch + 1]`, `ids` uint64): sample `i` looks
/// up rows `ids[offsets[i]:offsets[i+1]]` (one for one-hot data, none for a missing value).
#[pyclass(module = "ftrec", name = "Batch", frozen)]
pub struct Batch {
    client: Py<EmbeddingClient>,
    #[pyo3(get)]
    index: u64,
    #[pyo3(get)]
    dense: Py<PyArray2<f32>>,
    #[pyo3(get)]
    labels: Py<PyArray1<f32>>,
    #[pyo3(get)]
    sparse: Py<PyAny>,
    size: usize,
    tables: usize,
    dim: usize,
}

impl Batch {
    fn new(
        py: Python<'_>,
        client: Py<EmbeddingClient>,
        index: u64,
        b: &DataBatch,
        shape: &Shape,
    ) -> PyResult<Batch> {
        let dense = Array2::from_shape_vec((b.size, NUM_DENSE), b.dense.clone())
            .map_err(|e| FtrecError::new_err(format!("batch {index}'s dense features: {e}")))?;
        let pairs = b
            .sparse
            .iter()
            .map(|f| {
                let offsets = PyArray1::from_owned_array(py, Array1::from(f.offsets.clone()));
                let ids = PyArray1::from_owned_array(py, Array1::from(f.ids.clone()));
                PyTuple::new(py, [offsets.into_any(), ids.into_any()]).map(|t| t.into_any())
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Batch {
            client,
            index,
            dense: PyArray2::from_owned_array(py, dense).unbind(),
            labels: PyArray1::from_owned_array(py, Array1::from(b.labels.clone())).unbind(),
            sparse: pyo3::types::PyList::new(py, pairs)?.into_any().unbind(),
            size: b.size,
            tables: shape.table_rows.len(),
            dim: shape.dim,
        })
    }

    fn lost(&self, index: u64, why: &str) -> PyErr {
        BatchLost::new_err(format!("batch {index} was lost: {why}"))
    }
}

#[pymethods]
impl Batch {
    /// Samples in the batch.
    fn __len__(&self) -> usize {
        self.size
    }

    fn __repr__(&self) -> String {
        format!("ftrec.Batch(index={}, size={})", self.index, self.size)
    }

    /// Pull the rows this batch looks up from the servers and sum each sample's bag: a new
    /// float32 array `[batch, tables, dim]`. Raises `BatchLost` when a failure took the batch.
    fn lookup<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        let client = self.client.get();
        match client.ask(py, self.index, FromPy::Lookup)? {
            ToPy::Rows(Ok(v)) => {
                let a = Array3::from_shape_vec((self.size, self.tables, self.dim), v)
                    .map_err(|e| FtrecError::new_err(format!("batch {}: {e}", self.index)))?;
                Ok(PyArray3::from_owned_array(py, a))
            }
            ToPy::Rows(Err(e)) => {
                // The worker reports the batch failed; wait for that to settle.
                let _ = client.ask_finished(py, self.index);
                Err(self.lost(self.index, &e))
            }
            ToPy::Ended(r) => {
                client.close(self.index);
                Err(ended_err(&r).unwrap_or_else(|| self.lost(self.index, "the job ended")))
            }
            _ => Err(FtrecError::new_err(format!(
                "batch {}: an answer out of order from the worker thread",
                self.index
            ))),
        }
    }

    /// Send the gradient of the loss with respect to `lookup()`'s array (float32, the same
    /// shape) and the batch's mean loss; returns when the update has landed on the servers
    /// (pushed, staged or committed, as the strategy requires). Raises `BatchLost` when a
    /// failure took the batch; the job then sends it again.
    #[pyo3(signature = (grad, loss=0.0))]
    fn send(&self, py: Python<'_>, grad: &Bound<'_, PyAny>, loss: f64) -> PyResult<()> {
        let want = [self.size, self.tables, self.dim];
        let grad: PyReadonlyArray3<f32> = grad.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "grad: give a float32 numpy array of shape {want:?} (got {})",
                describe(grad)
            ))
        })?;
        if grad.shape() != want {
            return Err(PyValueError::new_err(format!(
                "grad has shape {:?}, batch {} needs {want:?} (batch, tables, dim)",
                grad.shape(),
                self.index
            )));
        }
        let grad = grad.as_array().iter().copied().collect::<Vec<f32>>();
        if let Some(bad) = grad.iter().position(|g| !g.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "grad holds a non-finite value at flat index {bad}: a diverged model sends nothing"
            )));
        }
        if !loss.is_finite() {
            return Err(PyValueError::new_err(format!("loss {loss} is not finite")));
        }
        let client = self.client.get();
        match client.ask(py, self.index, FromPy::Gradients { grad, loss })? {
            ToPy::Finished { outcome, .. } => {
                client.close(self.index);
                outcome.map_err(|e| self.lost(self.index, &e))
            }
            ToPy::Ended(r) => {
                client.close(self.index);
                Err(ended_err(&r).unwrap_or_else(|| self.lost(self.index, "the job ended")))
            }
            _ => Err(FtrecError::new_err(format!(
                "batch {}: an answer out of order from the worker thread",
                self.index
            ))),
        }
    }

    /// Give the batch up (the trainer could not compute it): the coordinator is told the batch
    /// failed and sends it again.
    #[pyo3(signature = (reason="given up".to_string()))]
    fn give_up(&self, py: Python<'_>, reason: String) -> PyResult<()> {
        let client = self.client.get();
        let _ = client.ask(py, self.index, FromPy::GiveUp(reason))?;
        client.close(self.index);
        Ok(())
    }
}

impl EmbeddingClient {
    /// After a failed lookup: wait for the worker to report the batch, then close it.
    fn ask_finished(&self, py: Python<'_>, index: u64) -> PyResult<()> {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match recv(py, &mut link, None)? {
                ToPy::Finished { index: i, .. } if i == index => break,
                ToPy::Ended(_) => break,
                _ => {}
            }
        }
        link.current = None;
        Ok(())
    }
}

/// What an argument is, for an error message.
fn describe(v: &Bound<'_, PyAny>) -> String {
    if let Ok(a) = v.cast::<numpy::PyUntypedArray>() {
        return format!("an array of {} with shape {:?}", a.dtype(), a.shape());
    }
    v.get_type()
        .name()
        .map_or_else(|_| "an object".into(), |n| n.to_string())
}

//! A worker: the same math as the single-process trainer (`ftrec_worker::LocalTrainer::step`),
//! with rows and dense values pulled from the servers and gradients pushed back.
//!
//! One step of worker `w` of `M`, per-worker batch `B`, step `s` (from 1): the samples
//! `((s-1)*M + w)*B .. +B` of the synthetic training stream. So the M workers of step `s`
//! together read the `M*B` samples after those of steps `1..s`, in worker order, and with
//! `M = 1` a worker reads exactly the batches the single-process trainer reads.
//!
//! The update it sends is the trainer's: per table the touched rows in id order with their
//! gradients summed in sample order ([`scatter_grads`] into a [`SparseGradAccumulator`]), and
//! the whole dense gradient. The servers apply the optimizer once per row and per dense block,
//! as the trainer does, so with one worker the sharded model equals the single-process model
//! bit for bit.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use ftrec_core::{Batch, Preset, RowId, SparseGradAccumulator, TableId};
use ftrec_data::{Position, Split, SyntheticSource};
use ftrec_model::{pool_sum, scatter_grads, Dlrm, DlrmConfig, Workspace};
use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::{PulledRows, RowRequest, ShardedClient, Update};

use crate::ClusterError;

/// A worker's model buffers: the dense model (its values overwritten by each pull), the
/// workspace and the gradient accumulators.
pub struct Compute {
    model: Dlrm,
    ws: Workspace,
    accs: Vec<SparseGradAccumulator>,
    pooled: Vec<f32>,
    dim: usize,
    tables: usize,
}

impl Compute {
    pub fn new(
        preset: &Preset,
        seed: u64,
        batch: usize,
        threads: usize,
    ) -> Result<Self, ClusterError> {
        // The optimizer runs on the servers; the local state layout is irrelevant.
        let opt = ftrec_core::Optimizer::new(preset.dense_optimizer, preset.dense_lr);
        let model = Dlrm::new(DlrmConfig::from_preset(preset), seed, &opt)?;
        let ws = model.workspace(batch, threads)?;
        Ok(Compute {
            model,
            ws,
            accs: (0..preset.table_rows.len())
                .map(|_| SparseGradAccumulator::new(preset.dim))
                .collect(),
            pooled: Vec::new(),
            dim: preset.dim,
            tables: preset.table_rows.len(),
        })
    }

    /// Pull the rows `batch` looks up and the whole dense vector; pool the bags.
    async fn pull_and_pool(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
    ) -> Result<(), ClusterError> {
        let requests: Vec<RowRequest> = batch
            .sparse
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.ids.is_empty())
            .map(|(t, f)| RowRequest {
                table: TableId(t as u32),
                rows: f.ids.clone(),
            })
            .collect();
        let (rows, dense) = tokio::join!(client.pull_rows(&requests), client.pull_dense());
        let (rows, dense) = (rows?, dense?);
        let mut by_table: Vec<Option<&PulledRows>> = vec![None; self.tables];
        for p in &rows {
            if let Some(slot) = by_table.get_mut(p.table.0 as usize) {
                *slot = Some(p);
            }
        }
        let values = &mut self.model.params_mut().values;
        if dense.len() != values.len() {
            return Err(ClusterError::Protocol(format!(
                "the servers hold {} dense values, the model has {}",
                dense.len(),
                values.len()
            )));
        }
        values.copy_from_slice(&dense);
        let (b, d) = (batch.size, self.dim);
        self.pooled.resize(b * self.tables * d, 0.0);
        pool_sum(
            &batch.sparse,
            b,
            d,
            |t, row: RowId| {
                let p = by_table.get(t).copied().flatten()?;
                let i = p.rows.binary_search(&row).ok()?;
                p.values.get(i * d..(i + 1) * d)
            },
            &mut self.pooled,
        )?;
        Ok(())
    }

    /// Forward and backward on `batch` against the servers' current model: the update to send
    /// and the batch's mean loss.
    pub async fn gradients(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
    ) -> Result<(Update, f64), ClusterError> {
        self.pull_and_pool(client, batch).await?;
        let loss =
            self.model
                .forward_backward(&mut self.ws, &batch.dense, &self.pooled, &batch.labels)?;
        for acc in &mut self.accs {
            acc.clear();
        }
        scatter_grads(
            &batch.sparse,
            batch.size,
            self.dim,
            self.ws.grad_pooled(),
            &mut self.accs,
        )?;
        let mut update = Update::new();
        for (t, acc) in self.accs.iter().enumerate() {
            if acc.is_empty() {
                continue;
            }
            let sorted = acc.sorted();
            let mut rows = Vec::with_capacity(sorted.len());
            let mut grads = Vec::with_capacity(sorted.len() * self.dim);
            for (r, g) in sorted {
                rows.push(r);
                grads.extend_from_slice(g);
            }
            update = update.with_sparse(TableId(t as u32), rows, grads);
        }
        update = update.with_dense(0, self.ws.grad_params().to_vec());
        Ok((update, loss))
    }

    /// Click probabilities of `batch` under the servers' current model.
    pub async fn predict(
        &mut self,
        client: &ShardedClient<GrpcClient>,
        batch: &Batch,
        out: &mut Vec<f32>,
    ) -> Result<(), ClusterError> {
        self.pull_and_pool(client, batch).await?;
        self.model
            .predict(&mut self.ws, &batch.dense, &self.pooled, out)?;
        Ok(())
    }
}

/// Connect to servers `0..n` at `addrs` (in server order).
pub async fn connect_all(addrs: &[SocketAddr]) -> Result<ShardedClient<GrpcClient>, ClusterError> {
    let mut clients = Vec::with_capacity(addrs.len());
    for &a in addrs {
        clients.push(GrpcClient::connect(a, GrpcConfig::default()).await?);
    }
    Ok(ShardedClient::new(clients).await?)
}

/// What the coordinator asks of a worker thread.
#[derive(Debug)]
pub(crate) enum WorkerCmd {
    /// (Re)connect to the servers at these addresses.
    Connect(Vec<SocketAddr>),
    /// Compute step `step` and stage it as `seq` (sync) or push it (async).
    Step {
        step: u64,
        seq: u64,
    },
    Stop,
}

/// A worker's answer to one command.
#[derive(Debug)]
pub(crate) struct WorkerReply {
    pub worker: u32,
    pub result: Result<f64, ClusterError>,
}

/// Static settings of a worker thread.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSetup {
    pub id: u32,
    pub workers: u32,
    pub preset: Preset,
    pub seed: u64,
    pub batch: usize,
    pub threads: usize,
    pub sync: bool,
    /// Longest a step's RPCs may take before the step counts as failed.
    pub rpc_timeout: Duration,
}

impl WorkerSetup {
    /// First training sample of this worker's batch of step `step` (from 1).
    pub fn first_sample(&self, step: u64) -> u64 {
        ((step - 1) * self.workers as u64 + self.id as u64) * self.batch as u64
    }
}

/// Where a worker's data stream stands after `step` steps (the position saved in a checkpoint:
/// its next batch starts here).
pub fn position_after(workers: u32, worker: u32, batch: usize, step: u64) -> Position {
    Position::Synthetic {
        sample: (step * workers as u64 + worker as u64) * batch as u64,
    }
}

/// The worker thread's loop: one reply per command until `Stop` (or the coordinator is gone).
pub(crate) fn worker_loop(
    setup: WorkerSetup,
    cmds: mpsc::Receiver<WorkerCmd>,
    replies: mpsc::Sender<WorkerReply>,
) {
    let reply = |result| {
        let _ = replies.send(WorkerReply {
            worker: setup.id,
            result,
        });
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            reply(Err(ClusterError::Io {
                what: format!("starting worker {}'s runtime", setup.id),
                source: e,
            }));
            return;
        }
    };
    let source = SyntheticSource::from_preset(&setup.preset, setup.seed);
    let compute = Compute::new(&setup.preset, setup.seed, setup.batch, setup.threads);
    let (source, mut compute) = match (source, compute) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) => {
            reply(Err(e.into()));
            return;
        }
        (_, Err(e)) => {
            reply(Err(e));
            return;
        }
    };
    let mut client: Option<ShardedClient<GrpcClient>> = None;
    while let Ok(cmd) = cmds.recv() {
        match cmd {
            WorkerCmd::Stop => break,
            WorkerCmd::Connect(addrs) => {
                client = None;
                let r = rt.block_on(async {
                    tokio::time::timeout(setup.rpc_timeout, connect_all(&addrs))
                        .await
                        .map_err(|_| ClusterError::Timeout("connecting to the servers".into()))?
                });
                reply(r.map(|c| {
                    client = Some(c);
                    0.0
                }));
            }
            WorkerCmd::Step { step, seq } => {
                let Some(c) = client.as_ref() else {
                    reply(Err(ClusterError::Protocol(format!(
                        "worker {} was asked for step {step} before it was connected",
                        setup.id
                    ))));
                    continue;
                };
                let (batch, _) =
                    source.batch_at(Split::Train, setup.first_sample(step), setup.batch);
                let r = rt.block_on(async {
                    let work = async {
                        let (update, loss) = compute.gradients(c, &batch).await?;
                        if setup.sync {
                            c.stage_step(seq, setup.id, &update).await?;
                        } else {
                            c.push(&update).await?;
                        }
                        Ok::<f64, ClusterError>(loss)
                    };
                    tokio::time::timeout(setup.rpc_timeout, work)
                        .await
                        .map_err(|_| {
                            ClusterError::Timeout(format!("worker {} step {step}", setup.id))
                        })?
                });
                reply(r);
            }
        }
    }
}

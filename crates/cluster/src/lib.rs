//! `ftrec-cluster`: real multi-process training.
//!
//! It owns
//! - the one definition of its processes' flags ([`args`]: `server`, `worker`, `ckpt merge`,
//!   and the optimizer, ECRec and CPR flag groups `ftrec run` shares), used by the `ftrec`
//!   binary and by this crate's own process binary alike;
//! - the server process ([`serve_shard`], driven by a [`ServerSpec`]): one `ftrec-ps` shard
//!   served over gRPC, its bound address published through a port file, alive until its
//!   launcher's pipe closes;
//! - the worker process ([`worker_process`]): connects to the coordinator's control socket
//!   ([`control`]: JSON lines over TCP), then trains on the global batches it is handed, pulling
//!   from and pushing to the servers over gRPC; it holds no state between batches, so a lost
//!   worker is replaced by a new process with the same id;
//! - the launcher ([`ServerProcess`], [`control::WorkerPool`]): starts server and worker
//!   processes of a given executable (on the CPU sets a job gives them: [`cpus`]), waits until
//!   they are ready, kills (SIGKILL) and reaps
//!   them; no child outlives its handle, and a coordinator that dies takes its children with it
//!   (their standard input and control connection close);
//! - the coordinator ([`run`], configured by a [`RunConfig`]): synchronous deterministic mode
//!   (every step's contributions staged and committed in worker order) or asynchronous mode
//!   (each free worker gets the next batch and pushes when done); heartbeats, workers' RPC
//!   errors and control connections feed failure detection; a strategy state machine of
//!   `ftrec-strategy` (`none` | `full` | `deck` | `ecrec` | `cpr`) decides and the coordinator
//!   carries out its actions (pause, save, save prioritized rows, wait for a save, replace the
//!   lost server and restore everyone, replace the lost server and restore it alone, rebuild a
//!   lost server from the survivors, resume, abort); servers and workers
//!   may also be started elsewhere and reached by address;
//! - ECRec ([`ecrec`], ecrec.txt §3, synchronous mode only): every server is an ECRec node
//!   (parities, dense replicas, 2PC, rebuild; [`EcServerSpec`]), each step commits by two-phase
//!   commit across the nodes, and a lost server is replaced by an empty process that rebuilds
//!   in the background while training goes on, with no rollback ([`EcReport`] in the report);
//! - who may join a run ([`auth`]): the shared token and the job id every gRPC request and
//!   control connection carries, checked by every server and by the coordinator; a socket
//!   off loopback without a token is refused unless `--insecure` ([`auth::check_exposure`]);
//! - fault injection ([`KillSpec`]: SIGKILL a server or a worker after a step, at a time, or in
//!   a named [`Phase`], ECRec's 2PC phases and rebuilds included, or the whole job after a
//!   step), each kill fired or not in the report ([`KillOutcome`]), and the run's report with
//!   its event timeline, per-failure detect /
//!   replace / resume / recover times, CPR Eq. 1's overhead terms and a throughput timeline
//!   ([`RunReport`]);
//! - checkpoints of every saving strategy (`full`, `deck`, ...) through one path
//!   ([`coordinator`]'s store): the servers run the checkpoint service of `ftrec-ps::ckpt`
//!   (tracking, staging, save, restore, reset) and write their shards straight to the store
//!   in parallel; the coordinator carries out the strategy's save actions, commits one manifest
//!   per save (kind, step, parent, data position) once every server's files are durable,
//!   restores every server from the lineage of the newest committed checkpoint, collects
//!   garbage, and runs the merger ([`merger`]) as its own process when the strategy merges
//!   (`deck`, deck.txt §3–§4). Whether training waits for the commit is the strategy's call:
//!   `full` pauses until its checkpoint is committed, `deck` only for the copy-out;
//! - `cpr` ([`cpr`], cpr.txt §2.3, §4): partial recovery (a lost server is replaced and its
//!   shard alone restored from the newest saves of each row; survivors and workers go on, no
//!   step is redone), full saves every `T_save` from a target PLS or a step count, prioritized
//!   saves (MFU, SSU, SCAR) in between, PLS per failure in the report;
//! - whole-job resume ([`job`], [`resume`]): a saving run records its configuration in its
//!   store; a job whose processes all died starts again from the store alone, through the
//!   recovery path (every server restores the newest committed checkpoint, re-sharded onto
//!   another number of servers if need be; the workers rewind to its data position);
//! - a store's model read back ([`restored`]): any committed state restored in memory, its
//!   shape worked out from the arguments, the job record or the presets, and laid out as named
//!   tensors (the safetensors export's names; what `ftrec eval`, `ftrec ckpt export` and the
//!   Python package share).
//!
//! The data split: the training stream (synthetic, or Criteo TSV files with the batch order
//! of [`plan`]) is cut into global batches of `batch` samples. In
//! synchronous mode step `s` (from 1) is batches `(s-1)*M + 1 ..= s*M`, worker `w` taking the
//! `w`-th, and the servers sum the workers' contributions in worker order. With `M = 1` this
//! is exactly the single-process trainer's run, and the final digest equals
//! `ftrec_worker::train`'s.
//!
//! It never decides *when* to checkpoint or how to recover (the strategy does) and never
//! changes the model's math (the worker step is the single-process trainer's, so digests
//! compare bit for bit).
//!
//! ```no_run
//! use ftrec_cluster::{run, KillSpec, RunConfig, StrategyChoice};
//! let mut cfg = RunConfig::new(
//!     ftrec_core::Preset::tiny(),
//!     "target/debug/ftrec".into(),
//!     std::env::temp_dir().join("ftrec-run"),
//! );
//! cfg.steps = 20;
//! cfg.strategy = StrategyChoice::Full { every_steps: 5 };
//! cfg.kills = vec![KillSpec::server_at_step(1, 12), "worker=0@step=15".parse().unwrap()];
//! let report = run(&cfg).unwrap();
//! println!("{} failures, digest {}", report.failures.len(), report.model_digest);
//! ```

pub mod args;
pub mod auth;
pub mod control;
pub mod coordinator;
pub mod cpr;
pub mod cpus;
pub mod ecrec;
pub mod job;
pub mod launcher;
pub mod memory;
pub mod merger;
pub mod plan;
pub mod report;
pub mod restored;
pub mod shard_server;
pub mod spec;
pub mod worker;

pub use coordinator::{resume, run, ResumeReport};
pub use cpr::{CprFlags, ServerPriority};
pub use ecrec::{EcFlags, EcReport, EcServerSpec};
pub use ftrec_ec::CodeKind;
/// Peer addresses by name (`--server-addr`, `--coordinator`), looked up at every connection.
pub use ftrec_ps::fence;
pub use ftrec_ps::net;
pub use launcher::ServerProcess;
pub use report::{
    CpuReport, DataReport, EventKind, FailureReport, IntervalPoint, KillOutcome, Overheads,
    RunReport, StoreReport, TimedEvent,
};
pub use shard_server::{build_server, serve_shard};
pub use spec::{
    CkptSpec, KillAt, KillSpec, Lifetime, MergeSettings, Phase, Role, RunConfig, ServerSpec,
    StrategyChoice,
};
pub use worker::{worker_process, WorkerLifetime};

/// What can stop a cluster run or a server process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{what} could not be started: {reason}")]
    Spawn { what: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ps(#[from] ftrec_ps::PsError),
    #[error(transparent)]
    Model(#[from] ftrec_model::ModelError),
    #[error(transparent)]
    Data(#[from] ftrec_data::DataError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("timed out: {0}")]
    Timeout(String),
    /// A peer answered something the protocol does not allow.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A step failed and no server was found lost: the failure is not a fault the strategies
    /// handle.
    #[error("step {step} failed with every server alive: {reason}")]
    StepFailed { step: u64, reason: String },
    /// Recovery could not complete.
    #[error("recovery failed: {0}")]
    Recovery(String),
    /// A worker's control connection closed, or a new process took its id.
    #[error("worker {worker} was lost: {reason}")]
    WorkerLost { worker: u32, reason: String },
    /// A worker could not read a batch of the training data (a malformed line without
    /// `--skip-malformed`, an unreadable file).
    #[error("batch {index}: {reason}")]
    BadData { index: u64, reason: String },
    /// This run lost the store to another writer (or could not renew its lease): it stopped
    /// writing.
    #[error("stopped writing to the store: {0}")]
    Fenced(String),
}

//! `ftrec-cluster`: real multi-process training.
//!
//! It owns
//! - the server process ([`serve_shard`], driven by a [`ServerSpec`]): one `ftrec-ps` shard
//!   served over gRPC, its bound address published through a port file, alive until its
//!   launcher's pipe closes;
//! - the launcher ([`ServerProcess`]): starts server processes of a given executable, waits for
//!   their port files, kills (SIGKILL) and reaps them; no child outlives its handle;
//! - the coordinator ([`run`], configured by a [`RunConfig`]): M worker threads, each with its
//!   own gRPC connections, stepping in lockstep (synchronous deterministic mode: contributions
//!   staged and committed in worker order); heartbeats and worker RPC errors feed failure
//!   detection; a strategy state machine of `ftrec-strategy` (`none` | `full`) decides and the
//!   coordinator carries out its actions (pause, full checkpoint, replace the lost server and
//!   restore everyone, resume, abort);
//! - fault injection ([`KillSpec`]: SIGKILL server I after step S) and the run's report with
//!   its event timeline ([`RunReport`]);
//! - full checkpoints as files ([`image`]): every server's shard exported concurrently through
//!   the parameter server's export RPCs, one file per server, committed by a manifest renamed
//!   into place last; superseded checkpoints are deleted once a newer one commits. (The
//!   servers need no file system access and no second service this way; the price is that
//!   the bytes cross the coordinator, which matters for large shards on several hosts.)
//!
//! Synchronous mode, the data split: at step `s` (from 1) worker `w` of `M` trains on the
//! per-worker batch of samples `((s-1)*M + w)*B ..+B` of the synthetic stream, and the servers
//! sum the workers' contributions in worker order. With `M = 1` this is exactly the
//! single-process trainer's run, and the final digest equals `ftrec_worker::train`'s.
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
//! cfg.kills = vec![KillSpec { server: 1, step: 12 }];
//! let report = run(&cfg).unwrap();
//! println!("{} failures, digest {}", report.failures.len(), report.model_digest);
//! ```

pub mod coordinator;
pub mod image;
pub mod launcher;
pub mod report;
pub mod shard_server;
pub mod spec;
pub mod worker;

pub use coordinator::run;
pub use launcher::ServerProcess;
pub use report::{EventKind, FailureReport, RunReport, TimedEvent};
pub use shard_server::{build_server, serve_shard};
pub use spec::{KillSpec, Lifetime, RunConfig, ServerSpec, StrategyChoice};

/// What can stop a cluster run or a server process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("server {server} could not be started: {reason}")]
    Spawn { server: u32, reason: String },
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
}

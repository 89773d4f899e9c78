//! `ftrec-ps`: the parameter server.
//!
//! It owns
//! - the server's state ([`Server`]): for every table, the rows the [`ftrec_core::ShardMap`]
//!   places on this server (values and optimizer state, by local index, initialised with the
//!   same bits as the single-process model), and a contiguous range of the dense blocks with
//!   their optimizer state ([`dense_block_range`]); the optimizer runs here, on pushed
//!   gradients, with exactly one update per touched row and block per push;
//! - deterministic steps: contributions staged per worker and summed in an explicit worker
//!   order before one update ([`Server::apply_step`], [`Server::stage_step`],
//!   [`Server::commit_step`]);
//! - the hooks the fault-tolerance strategies attach to: a [`PushObserver`] on the update path,
//!   export and import of rows and dense blocks with their state by range, the shard's part of
//!   the [`ftrec_core::ModelDigest`];
//! - the service a client calls ([`PsService`]) and its two transports: in-process
//!   ([`InProcessClient`] on a [`SharedServer`]) and gRPC ([`grpc::serve`],
//!   [`grpc::GrpcClient`]);
//! - [`ShardedClient`], which routes a worker's rows and dense values to the servers that hold
//!   them;
//! - who may call a server ([`auth`]: the shared token, the job id, the in-flight limits),
//!   checked by an interceptor on every service and attached by every client; and mutual TLS
//!   on every connection ([`tls`]: the three PEM files, `https` endpoints, server and client
//!   configs);
//! - peers by name ([`net`]: `host:port` addresses, looked up again at every connect, so a
//!   server replaced at the same name and a new address is found);
//! - [`ec`]: ECRec on top of the server (parity rows, difference propagation server to server,
//!   dense replicas, two-phase commit, degraded reads, rebuild of a lost server).
//!
//! It never decides *when* to checkpoint, encode or recover (the strategies do), never reads
//! training data, and never panics on a request: a bad request gets a [`PsError`] reply and
//! changes nothing.
//!
//! ```
//! use ftrec_core::{Preset, RowId, ServerId, ShardMap, TableId};
//! use ftrec_ps::{InProcessClient, PsService, RowRequest, Server, ServerConfig, SharedServer, Update};
//!
//! let preset = Preset::tiny();
//! let map = ShardMap::new(1).unwrap();
//! let config = ServerConfig::from_preset(&preset, map, ServerId(0), 7);
//! let server = SharedServer::new(Server::new(config, &vec![0.0; 300]).unwrap());
//! let client = InProcessClient::new(server);
//!
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! rt.block_on(async {
//!     let rows: Vec<RowId> = vec![5, 1, 5];
//!     let before = client
//!         .pull_rows(vec![RowRequest { table: TableId(0), rows: rows.clone() }])
//!         .await
//!         .unwrap();
//!     assert_eq!(before[0].rows, vec![1, 5]); // deduplicated and sorted
//!     let grads = vec![0.5; rows.len() * preset.dim];
//!     let report = client
//!         .push(Update::new().with_sparse(TableId(0), rows, grads))
//!         .await
//!         .unwrap();
//!     assert_eq!(report.rows_updated, 2); // row 5 got one update with its summed gradient
//! });
//! ```

pub mod auth;
pub mod ckpt;
pub mod ec;
pub mod error;
pub mod fence;
pub mod grpc;
mod join;
pub mod net;
pub mod observer;
pub mod server;
pub mod service;
pub mod sharded;
pub mod tls;
pub mod update;

#[cfg(test)]
mod fuzz_support;

/// The decoders' property tests measure allocations (`fuzz_support`).
#[cfg(test)]
#[global_allocator]
static ALLOC: ftrec_core::fuzz::AllocProbe = ftrec_core::fuzz::AllocProbe;

pub use error::PsError;
pub use observer::{PushObserver, RowImages, UpdateOrigin};
pub use server::{
    dense_block_range, dense_value_range, Limits, PreparedDense, PreparedRows, PreparedStep,
    Server, ServerConfig,
};
pub use service::{
    InProcessClient, PsClient, PsService, RowSource, ServiceGate, ServiceOp, SharedServer,
};
pub use sharded::ShardedClient;
pub use update::{
    dedup_requests, ApplyReport, DenseBlock, DenseGrads, PulledRows, RowBlock, RowRequest,
    ServerInfo, SparseGrads, Update,
};

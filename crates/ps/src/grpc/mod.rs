//! The gRPC transport (tonic): [`serve`] puts a [`SharedServer`] on a socket, [`GrpcClient`]
//! implements [`crate::PsService`] against it.
//!
//! Both ends set their message size limits explicitly ([`GrpcConfig::max_message_bytes`]) and
//! cut large payloads into chunks of about [`GrpcConfig::chunk_bytes`]: pulls into several
//! requests, pushes, stages, imports and exports into streams whose chunks form one logical
//! message (a push is applied only once its whole stream has arrived and validated).

mod client;
pub mod handler;
pub(crate) mod wire;

/// Messages and service stubs generated from `proto/ps.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("ftrec.ps.v1");
}

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use client::GrpcClient;
pub use tonic::service::Routes;

/// Largest HTTP/2 frame either end accepts. The default 16 KiB cuts a push's dense gradients
/// (hundreds of KiB a server) and ECRec's difference batches into dozens of frames, each
/// framed, handed over and reassembled on its own; one frame per message is measurably
/// cheaper (docs/BENCHMARKS.md, "HTTP/2 frames"). Messages themselves stay bounded by
/// [`GrpcConfig`]'s limits.
pub(crate) const H2_MAX_FRAME: u32 = 1 << 20;
/// Flow-control windows of one stream and of one connection: a whole large message in flight
/// without waiting for window updates.
pub(crate) const H2_STREAM_WINDOW: u32 = 8 << 20;
pub(crate) const H2_CONNECTION_WINDOW: u32 = 16 << 20;

use crate::auth::{InFlightLayer, ServeOptions, ServerAuth};
use crate::{PsError, SharedServer};

/// Transport settings, the same on both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcConfig {
    /// Largest message either end sends or accepts.
    pub max_message_bytes: usize,
    /// Target size of one chunk of a large payload; well under `max_message_bytes`.
    pub chunk_bytes: usize,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            max_message_bytes: 16 << 20,
            chunk_bytes: 1 << 20,
        }
    }
}

impl GrpcConfig {
    pub fn validate(&self) -> Result<(), PsError> {
        // A chunk carries at least one row or one dense block plus framing; keep room for it.
        if self.chunk_bytes == 0 || self.chunk_bytes.saturating_mul(2) > self.max_message_bytes {
            return Err(PsError::InvalidConfig(format!(
                "chunk size {} must be positive and at most half the message limit {}",
                self.chunk_bytes, self.max_message_bytes
            )));
        }
        Ok(())
    }
}

/// A running gRPC server. Dropping the handle also shuts the server down.
#[derive(Debug)]
pub struct ServeHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ServeHandle {
    /// The address the server is bound to (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting connections, let requests in flight finish, then return.
    pub async fn shutdown(mut self) -> Result<(), PsError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PsError::Internal(format!(
                "server on {} failed: {e}",
                self.addr
            ))),
            Err(e) => Err(PsError::Internal(format!(
                "server task on {} ended: {e}",
                self.addr
            ))),
        }
    }
}

/// The parameter-server service of `server`, with `config`'s message limits, ready to be
/// served alone ([`serve`]) or next to other services on the same socket ([`serve_routes`]).
pub fn ps_service(
    server: SharedServer,
    config: GrpcConfig,
) -> proto::parameter_server_server::ParameterServerServer<handler::Handler> {
    proto::parameter_server_server::ParameterServerServer::new(handler::Handler::new(
        server, config,
    ))
    .max_decoding_message_size(config.max_message_bytes)
    .max_encoding_message_size(config.max_message_bytes)
}

/// Serve `server` on `addr` (port 0 picks a free port; see [`ServeHandle::local_addr`]).
/// Must be called inside a tokio runtime; the server runs as a task of that runtime.
pub async fn serve(
    server: SharedServer,
    addr: SocketAddr,
    config: GrpcConfig,
) -> Result<ServeHandle, PsError> {
    config.validate()?;
    serve_routes(Routes::new(ps_service(server, config)), addr).await
}

/// Serve several gRPC services on one socket: the parameter-server service and the services the
/// fault-tolerance strategies add (ECRec's parity and recovery traffic, checkpoint writes).
/// Build `routes` with [`Routes::new`] and [`Routes::add_service`]. No token, no job id, the
/// default in-flight limits ([`serve_routes_with`] sets them).
pub async fn serve_routes(routes: Routes, addr: SocketAddr) -> Result<ServeHandle, PsError> {
    serve_routes_with(routes, addr, &ServeOptions::default()).await
}

/// [`serve_routes`] with `options`: every request to every service first passes the token
/// and job check of `options.auth` ([`crate::auth::ServerAuth`]), then the in-flight limits.
pub async fn serve_routes_with(
    routes: Routes,
    addr: SocketAddr,
    options: &ServeOptions,
) -> Result<ServeHandle, PsError> {
    options.validate()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| PsError::Unavailable {
            addr: addr.to_string(),
            reason: format!("cannot bind: {e}"),
        })?;
    let bound = listener.local_addr().map_err(|e| PsError::Unavailable {
        addr: addr.to_string(),
        reason: format!("bound socket has no address: {e}"),
    })?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let (stop, stopped) = oneshot::channel::<()>();
    let mut builder = tonic::transport::Server::builder()
        .max_frame_size(H2_MAX_FRAME)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW);
    if let Some(tls) = &options.auth.tls {
        builder = builder.tls_config(tls.server_config()).map_err(|e| {
            PsError::InvalidConfig(format!(
                "TLS server setup (--tls-cert, --tls-key, --tls-ca): {}",
                crate::tls::chain(&e)
            ))
        })?;
    }
    let task = tokio::spawn(
        builder
            .concurrency_limit_per_connection(options.max_in_flight_per_connection)
            // The check runs first: a refused request takes no in-flight slot.
            .layer(tonic::service::InterceptorLayer::new(ServerAuth::new(
                options.auth.clone(),
            )))
            .layer(InFlightLayer::new(options.max_in_flight))
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move {
                // A sent signal and a dropped handle both stop the server.
                let _ = stopped.await;
            }),
    );
    Ok(ServeHandle {
        addr: bound,
        stop: Some(stop),
        task,
    })
}

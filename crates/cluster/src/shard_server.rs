//! The body of a server process (`ftrec server`): build the shard, serve it over gRPC, publish
//! the bound address, and live until the launcher goes away.

use std::io::Read;
use std::path::Path;

use ftrec_ckpt::deck::StagingOptions;
use ftrec_ckpt::location::LocationOptions;
use ftrec_core::{ServerId, ShardMap};
use ftrec_model::{Dlrm, DlrmConfig};
use ftrec_ps::auth::ServeOptions;
use ftrec_ps::ckpt::{grpc::ckpt_service, CkptNode};
use ftrec_ps::grpc::{ps_service, serve_routes_with, GrpcConfig, Routes};
use ftrec_ps::{Server, ServerConfig, SharedServer};

use crate::memory::MemoryParts;
use crate::spec::Lifetime;
use crate::{ClusterError, ServerSpec};

/// The shard `spec` describes, initialised exactly as the single-process model initialises the
/// same rows and dense values.
pub fn build_server(spec: &ServerSpec) -> Result<Server, ClusterError> {
    let (config, dense) = server_config(spec)?;
    Ok(Server::new(config, &dense)?)
}

/// The shard's configuration and the model's initial dense values (each server keeps its
/// range of them).
pub(crate) fn server_config(spec: &ServerSpec) -> Result<(ServerConfig, Vec<f32>), ClusterError> {
    spec.validate()?;
    let preset = spec.preset()?;
    let map = ShardMap::new(spec.servers).map_err(|e| ClusterError::Config(e.to_string()))?;
    let mut config = ServerConfig::from_preset(&preset, map, ServerId(spec.id), spec.seed);
    config.sparse_optimizer = spec.sparse_optimizer;
    config.dense_optimizer = spec.dense_optimizer;
    // The dense initial values are the model's, from the same seed; each server keeps its range.
    let dense = Dlrm::new(
        DlrmConfig::from_preset(&preset),
        spec.seed,
        &spec.dense_optimizer,
    )
    .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok((config, dense.into_params().values))
}

/// Bytes of a plain shard: rows with their optimizer state, and the dense range with its state.
fn shard_bytes(s: &Server) -> u64 {
    let rows: u64 = (0u32..)
        .map_while(|t| s.shard(ftrec_core::TableId(t)).map(|x| x.bytes()))
        .sum();
    rows + (s.dense().values.capacity() + s.dense().state.capacity()) as u64 * 4
}

/// Write `text` to `path` atomically: a reader sees nothing or all of it.
pub fn write_atomic(path: &Path, text: &[u8]) -> Result<(), ClusterError> {
    let io = |e: std::io::Error| ClusterError::Io {
        what: format!("writing {}", path.display()),
        source: e,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Wait for SIGINT/SIGTERM, or (with [`Lifetime::Stdin`]) for end of file on standard input.
async fn wait_for_end(until: Lifetime) {
    let signal = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    match until {
        Lifetime::Signal => signal.await,
        Lifetime::Stdin => {
            let stdin_closed = tokio::task::spawn_blocking(|| {
                let mut sink = [0u8; 256];
                let mut stdin = std::io::stdin();
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            });
            tokio::select! {
                _ = stdin_closed => {}
                _ = signal => {}
            }
        }
    }
}

/// Exit this process with one line on standard error and [`ftrec_ps::fence::FENCED_EXIT`]
/// once it learns that the coordinator replaced it ([`ftrec_ps::fence`]): a process paused
/// past its failure timeout, or cut off, that comes back does nothing more for the job. Its
/// own watcher thread, so it fires whatever the process's runtimes are doing.
pub(crate) fn exit_when_fenced(fences: &ftrec_ps::fence::Fences, what: String) {
    if !fences.can_be_fenced() {
        return;
    }
    let fences = fences.clone();
    let who = what.clone();
    let spawned = std::thread::Builder::new()
        .name("fence-watch".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
                return;
            };
            let line = rt.block_on(fences.fenced());
            tracing::error!("{who}: {line}");
            std::process::exit(i32::from(ftrec_ps::fence::FENCED_EXIT));
        });
    if let Err(e) = spawned {
        tracing::warn!("{what}: cannot watch for fencing: {e}");
    }
}

/// Run a server process: serve the shard until [`ServerSpec::until`] says stop (the launcher
/// asks for end of file on standard input: it holds the other end of the pipe, so a launcher
/// that exits or dies takes its servers with it and no orphan is left), then shut down cleanly.
pub fn serve_shard(spec: &ServerSpec) -> Result<(), ClusterError> {
    // With ECRec the node wraps the shard and serves its own service next to it.
    type Parts = Box<dyn Fn() -> MemoryParts + Send>;
    let (mut routes, shared, parts, ec_node): (_, _, Parts, _) = match &spec.ec {
        Some(ec) => {
            let (routes, node) = crate::ecrec::ec_routes(spec, ec)?;
            let watched = node.clone();
            let parts = move || watched.memory_parts().map(Into::into).unwrap_or_default();
            // The checkpoint service (ECRec's backstop) reads and loads the node's rows; the
            // node re-encodes its parities after a load.
            (
                routes,
                Some(node.shared().clone()),
                Box::new(parts),
                Some(node),
            )
        }
        None => {
            let server = SharedServer::new(build_server(spec)?);
            let routes = Routes::new(ps_service(server.clone(), GrpcConfig::default()));
            let watched = server.clone();
            let parts = move || MemoryParts {
                rows_bytes: watched.read().map_or(0, |s| shard_bytes(&s)),
                ..MemoryParts::default()
            };
            (routes, Some(server), Box::new(parts), None)
        }
    };
    if let Some(c) = &spec.ckpt {
        let server = shared.ok_or_else(|| {
            ClusterError::Config("the checkpoint service has no shard to serve".into())
        })?;
        // DECK's server side: the tracker observes every push from now on, and saves and
        // restores stream this shard to and from the store with bounded memory.
        let staging = StagingOptions {
            chunk_bytes: c.chunk_bytes,
            staging_dir: c.staging_dir.clone(),
            limit_bytes: None,
        };
        // Upload folders of servers that crashed here before (named by their pid).
        if let Ok(gone) = ftrec_ckpt::deck::staging::remove_dead_folders(&c.staging_dir) {
            if !gone.is_empty() {
                tracing::info!(
                    "removed {} staging folder(s) of processes that no longer run under {}",
                    gone.len(),
                    c.staging_dir.display()
                );
            }
        }
        // A recovery with nothing committed resets every server to this initial state.
        let initial_spec = spec.clone();
        let mut node = CkptNode::new(server, staging, LocationOptions::from_env())
            .map_err(|e| ClusterError::Checkpoint(e.to_string()))?
            .with_initial_state(std::sync::Arc::new(move || {
                build_server(&initial_spec).map_err(|e| e.to_string())
            }))
            .with_fences(spec.auth.fences.clone());
        if let Some(p) = &c.priority {
            // CPR §4.2: the priority rule watches every update from now on.
            node = node
                .with_priority(p.options(spec.seed, spec.id))
                .map_err(|e| ClusterError::Checkpoint(e.to_string()))?;
        }
        routes = routes.add_service(ckpt_service(node));
    }
    exit_when_fenced(&spec.auth.fences, format!("ftrec server {}", spec.id));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Io {
            what: "starting the server runtime".into(),
            source: e,
        })?;
    rt.block_on(async {
        // ECRec §3.5: a transaction its worker left half done is resolved after a lease.
        let _leases = ec_node.map(|n| n.start_lease_watcher(ftrec_ps::ec::TXN_LEASE));
        let options = ServeOptions::with_auth(spec.auth.clone());
        let handle = serve_routes_with(routes, spec.listen, &options).await?;
        let addr = handle.local_addr();
        ftrec_obs::set_ready(true);
        if let Some(path) = &spec.port_file {
            write_atomic(path, format!("{addr}\n").as_bytes())?;
        }
        println!(
            "ftrec server {} of {} listening on {addr}",
            spec.id, spec.servers
        );
        let sampler = spec.port_file.as_ref().map(|_| {
            let generation = spec.auth.fences.me().map_or(0, |i| i.epoch as u32);
            crate::memory::Sampler::start(spec.id, generation, parts)
        });
        wait_for_end(spec.until).await;
        if let (Some(sampler), Some(port)) = (sampler, &spec.port_file) {
            let m = sampler.finish();
            let text = serde_json::to_vec(&m).unwrap_or_default();
            if let Err(e) = write_atomic(&crate::memory::memory_file(port), &text) {
                tracing::warn!("ftrec server {}: no memory report: {e}", spec.id);
            }
        }
        // Graceful shutdown waits for open connections; a client that keeps one open must not
        // keep the process alive, so the wait is bounded.
        match tokio::time::timeout(std::time::Duration::from_secs(2), handle.shutdown()).await {
            Ok(r) => r?,
            Err(_) => tracing::warn!(
                "ftrec server {}: connections still open at shutdown",
                spec.id
            ),
        }
        Ok(())
    })
}

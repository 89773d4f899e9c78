//! Servers started elsewhere (`--server-addr`, in server order): reached by name, probed
//! rather than spawned, waited for rather than replaced. Whoever runs them (an operator, an
//! orchestrator such as a StatefulSet, a test) kills and restarts them; the coordinator only
//! sees a name stop and start answering. A name is looked up at every probe and connection
//! ([`ftrec_ps::net`]), so a server back behind the same name at a new address is found: a
//! replacement started on another host while the lost one still runs (cut off by a
//! partition) takes over once the name moves to it. Such servers have no epoch of their own:
//! each takes the one the coordinator's table names for it at the coordinator's first request
//! ([`ftrec_ps::fence::Fences::awaiting`]), which is why a lost server's epoch is raised
//! before the wait for its return.

use std::time::{Duration, Instant};

use ftrec_core::ServerId;
use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::PsService;

use super::Coordinator;
use crate::report::EventKind;
use crate::ClusterError;

impl Coordinator {
    /// Whether server `id` answers an `info` probe as itself within the heartbeat timeout.
    pub(super) fn probe(&self, id: u32) -> bool {
        self.probe_error(id).is_none()
    }

    /// Why server `id` does not answer an `info` probe as itself (`None`: it does).
    fn probe_error(&self, id: u32) -> Option<String> {
        let addr = self.server_addrs[id as usize].clone();
        let timeout = self.cfg.heartbeat_timeout;
        let auth = &self.cfg.auth;
        let alive = self.rt.block_on(async {
            tokio::time::timeout(timeout, async {
                let c = GrpcClient::connect_with(addr, GrpcConfig::default(), auth).await?;
                c.info().await
            })
            .await
        });
        match alive {
            Ok(Ok(info)) if info.server == ServerId(id) => None,
            Ok(Ok(info)) => Some(format!("it is server {}", info.server.0)),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("no answer within the heartbeat timeout".into()),
        }
    }

    /// At start: every server must answer as itself at its address within the start
    /// timeout (servers started at the same time as the coordinator may not listen yet, or
    /// their names may not resolve yet).
    pub(super) fn reach_outside_servers(&mut self) -> Result<(), ClusterError> {
        self.server_addrs = self.cfg.external_servers.clone();
        // Every request names each server's epoch: a server started without one takes it
        // from the first ([`ftrec_ps::fence::Fences::awaiting`]).
        for id in 0..self.cfg.servers {
            let me = crate::launcher::server_incarnation(id, self.generation[id as usize]);
            self.cfg.auth.fences.raise(me);
        }
        let wait = self.cfg.start_timeout;
        let deadline = Instant::now() + wait;
        for id in 0..self.cfg.servers {
            let mut said = false;
            while let Some(why) = self.probe_error(id) {
                if Instant::now() >= deadline {
                    return Err(ClusterError::Config(format!(
                        "server {id} at {} is unreachable or is not server {id} of this job \
                         (waited {:.0}s, --start-timeout-s): {why}",
                        self.server_addrs[id as usize],
                        wait.as_secs_f64()
                    )));
                }
                if !said {
                    tracing::info!(
                        "server {id} at {} does not answer yet ({why}); it has {:.0}s",
                        self.server_addrs[id as usize],
                        wait.as_secs_f64()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.addrs = self.server_addrs.iter().map(|a| a.to_string()).collect();
        Ok(())
    }

    /// A kill of a server started elsewhere: the job waits here (up to the start timeout)
    /// until it has been killed and stops answering. `Some(0)` (no pid known) once it is
    /// gone, `None` if it still answers at the deadline (the kill did not happen).
    pub(super) fn await_outside_kill(&mut self, id: u32, why: &str) -> Option<u32> {
        tracing::info!(
            "kill {why}: server {id} at {} was not started here; kill it now (the job waits \
             for its loss)",
            self.server_addrs[id as usize]
        );
        let deadline = Instant::now() + self.cfg.start_timeout;
        while self.probe(id) {
            if Instant::now() >= deadline {
                tracing::info!("kill {why}: server {id} still answers; the kill did not happen");
                return None;
            }
            std::thread::sleep(self.cfg.heartbeat);
        }
        Some(0)
    }

    /// A lost server started elsewhere: wait (up to the start timeout) until it answers as
    /// itself at its name again.
    pub(super) fn await_return(&mut self, id: u32) -> Result<(), ClusterError> {
        let addr = self.server_addrs[id as usize].clone();
        let wait = self.cfg.start_timeout;
        tracing::info!(
            "server {id} lost: waiting up to {:.0}s for it to come back at {addr}",
            wait.as_secs_f64()
        );
        let deadline = Instant::now() + wait;
        while !self.probe(id) {
            if Instant::now() >= deadline {
                return Err(ClusterError::Recovery(format!(
                    "server {id} at {addr} did not come back within {:.0}s",
                    wait.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.event(
            EventKind::ServerReplaced,
            Some(id),
            format!("back at {addr}"),
        );
        Ok(())
    }
}

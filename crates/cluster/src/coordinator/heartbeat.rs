//! The coordinator's heartbeats: every server probed at a fixed interval, a silent one
//! reported once per generation. The probes carry the coordinator's table of incarnations
//! ([`ftrec_ps::fence`]), so a server that missed an announcement learns it within one
//! interval. Beside it, the coordinator's own view of losses: a probe of every server, and the
//! heartbeat's reports for the servers' current generations.

use std::collections::HashMap;
use std::time::Duration;

use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::net::PeerAddr;
use ftrec_ps::PsService;
use tokio::sync::{mpsc as tmpsc, watch};

/// Probe every server every `every`; report `(server, generation, reason)` once per silent
/// server generation. Ends when the coordinator drops its target list.
pub(super) async fn heartbeat(
    mut targets: watch::Receiver<Vec<(u32, PeerAddr)>>,
    every: Duration,
    timeout: Duration,
    lost: tmpsc::UnboundedSender<(u32, u32, String)>,
    auth: crate::auth::Auth,
) {
    // A connection per address; a name is looked up again whenever its channel reconnects.
    let mut conns: HashMap<PeerAddr, GrpcClient> = HashMap::new();
    let mut reported: Vec<(u32, u32)> = Vec::new();
    loop {
        if targets.has_changed().is_err() {
            return;
        }
        let list = targets.borrow_and_update().clone();
        conns.retain(|a, _| list.iter().any(|(_, b)| a == b));
        for (i, (generation, addr)) in list.iter().enumerate() {
            let generation = *generation;
            let key = (i as u32, generation);
            if reported.contains(&key) {
                continue;
            }
            let probe = tokio::time::timeout(timeout, async {
                let c = match conns.get(addr) {
                    Some(c) => c.clone(),
                    None => {
                        GrpcClient::connect_with(addr.clone(), GrpcConfig::default(), &auth).await?
                    }
                };
                c.info().await?;
                Ok::<_, ftrec_ps::PsError>(c)
            })
            .await;
            match probe {
                Ok(Ok(c)) => {
                    conns.insert(addr.clone(), c);
                }
                Ok(Err(e)) => {
                    reported.push(key);
                    conns.remove(addr);
                    let _ = lost.send((key.0, generation, e.to_string()));
                }
                Err(_) => {
                    reported.push(key);
                    conns.remove(addr);
                    let _ = lost.send((key.0, generation, "probe timed out".into()));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

impl super::Coordinator {
    pub(super) fn update_heartbeat(&mut self) {
        let targets = self
            .server_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (self.generation[i], a.clone()))
            .collect();
        let _ = self.hb_targets.send(targets);
    }

    /// Servers that are lost now: exited, or silent for the heartbeat timeout.
    pub(super) fn probe_lost(&mut self) -> Vec<u32> {
        let mut lost = Vec::new();
        for i in 0..self.cfg.servers {
            let exited = self
                .procs
                .get_mut(i as usize)
                .is_some_and(|p| p.has_exited());
            if exited || !self.probe(i) {
                lost.push(i);
            }
        }
        lost
    }

    /// Losses the heartbeat task reported for the servers' current generations.
    pub(super) fn heartbeat_losses(&mut self) -> Vec<u32> {
        let mut lost = Vec::new();
        while let Ok((server, generation, _)) = self.lost_rx.try_recv() {
            if self.generation.get(server as usize) == Some(&generation) && !lost.contains(&server)
            {
                lost.push(server);
            }
        }
        lost
    }

    /// Heartbeat reports confirmed by a probe (one that times out once may be a slow server).
    pub(super) fn confirmed_heartbeat_losses(&mut self) -> Vec<u32> {
        let hb = self.heartbeat_losses();
        if hb.is_empty() {
            return hb;
        }
        self.probe_lost()
            .into_iter()
            .filter(|s| hb.contains(s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_server, ServerSpec};
    use ftrec_core::Preset;
    use ftrec_ps::SharedServer;
    use std::net::SocketAddr;

    #[test]
    fn the_heartbeat_reports_a_server_that_stops_answering_once_per_generation() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let spec = ServerSpec::from_preset(&Preset::tiny(), 0, 1, 3).unwrap();
            let server = SharedServer::new(build_server(&spec).unwrap());
            let handle = ftrec_ps::grpc::serve(
                server,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                GrpcConfig::default(),
            )
            .await
            .unwrap();
            let addr = handle.local_addr();
            let (targets, rx) = watch::channel(vec![(4u32, PeerAddr::from(addr))]);
            let (tx, mut lost) = tmpsc::unbounded_channel();
            let task = tokio::spawn(heartbeat(
                rx,
                Duration::from_millis(5),
                Duration::from_secs(2),
                tx,
                crate::auth::Auth::none(),
            ));
            // Let it probe the live server at least once: nothing is reported.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(lost.try_recv().is_err());
            handle.shutdown().await.unwrap();
            let (server, generation, reason) = lost.recv().await.unwrap();
            assert_eq!((server, generation), (0, 4));
            assert!(!reason.is_empty());
            // Reported once: the next report would need a new generation.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(lost.try_recv().is_err());
            drop(targets);
            task.await.unwrap();
        });
    }
}

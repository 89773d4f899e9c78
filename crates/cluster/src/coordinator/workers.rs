//! The coordinator's side of the control socket: one command to one worker and its answer,
//! and the servers' addresses told to every worker after a recovery.

use std::time::Instant;

use super::{Coordinator, STEP_TIMEOUT};
use crate::control::{FromWorker, PoolEvent, ToWorker};
use crate::ClusterError;

impl Coordinator {
    /// Send one command to worker `w` and wait for its answer (no other command may be
    /// outstanding).
    pub(super) fn ask_one(&mut self, w: u32, cmd: ToWorker) -> Result<FromWorker, ClusterError> {
        self.pool
            .send(w, &cmd)
            .map_err(|e| ClusterError::Protocol(format!("worker {w}: {e}")))?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        // Other workers' losses, put back for whoever waits next.
        let mut others = Vec::new();
        let answer = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(ClusterError::Timeout(format!("waiting for worker {w}")));
            }
            match self.pool.next(left) {
                Some(PoolEvent::Msg { worker, msg }) if worker == w => {
                    break match msg {
                        FromWorker::Failed { error, .. } => {
                            Err(ClusterError::Protocol(format!("worker {w}: {error}")))
                        }
                        other => Ok(other),
                    }
                }
                Some(PoolEvent::Lost { worker, reason }) if worker == w => {
                    break Err(ClusterError::WorkerLost { worker, reason })
                }
                Some(lost @ PoolEvent::Lost { .. }) => others.push(lost),
                _ => {}
            }
        };
        for e in others {
            self.pool.defer(e);
        }
        answer
    }

    /// The servers' current addresses and the newest incarnations, for a worker to connect.
    pub(super) fn connect_cmd(&self) -> ToWorker {
        ToWorker::Connect {
            servers: self.server_addrs.clone(),
            fences: self.cfg.auth.fences.table_text(),
        }
    }

    /// Tell every worker the servers' current addresses. A worker lost meanwhile (during a
    /// recovery, say) holds no state: a new one takes its place, set up and connected to the
    /// current addresses.
    pub(super) fn reconnect_workers(&mut self) -> Result<(), ClusterError> {
        for w in 0..self.workers() {
            match self.ask_one(w, self.connect_cmd()) {
                Ok(_) => {}
                Err(e @ ClusterError::WorkerLost { .. }) => {
                    self.replace_worker(w, &e.to_string())?
                }
                Err(e) if self.pool.is_connected(w) => return Err(e),
                Err(e) => self.replace_worker(w, &e.to_string())?,
            }
        }
        Ok(())
    }
}

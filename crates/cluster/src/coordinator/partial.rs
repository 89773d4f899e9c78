//! Partial recovery (CPR §2.3), carried out for [`ftrec_strategy::Action::RestorePartial`]
//! whatever strategy asks for it: replace only the lost servers and load only their shards
//! from the newest saves (the chain of the newest full and the saves after it, each row from
//! the newest save holding it, through the servers' checkpoint service), while every other
//! server keeps its rows and the workers keep their place in the data: nothing is rewound and
//! no step is redone. With no checkpoint committed, the replacement's own initial state (rows
//! from the seed) is what the lost shard gets back.
//!
//! A named server lost again during its restore is replaced again and the restore starts over;
//! a server *not* named that is lost meanwhile is replaced at once (every server must answer
//! for the restore to go on) but not restored here: it is reported to the strategy once this
//! recovery is done, which decides what to do about it (CPR restores its shard in turn).

use ftrec_ckpt::CheckpointId;
use ftrec_ps::ckpt::CkptApi;
use ftrec_strategy::CheckpointRef;

use super::Coordinator;
use crate::report::EventKind;
use crate::worker::connect_all;
use crate::{ClusterError, Phase, Role};

impl Coordinator {
    /// Replace `servers` and restore their shards alone from `checkpoint` (see the module
    /// docs). Survivors, the data position and the batch count are left as they are. Returns
    /// the servers not named that were lost meanwhile (replaced, not restored: still to be
    /// reported to the strategy).
    pub(super) fn restore_partial(
        &mut self,
        servers: &[u32],
        checkpoint: Option<CheckpointRef>,
    ) -> Result<Vec<u32>, ClusterError> {
        self.event(
            EventKind::RecoveryStart,
            None,
            format!(
                "partial: server(s) {servers:?} from {}",
                match &checkpoint {
                    Some(c) => format!("{} (step {})", c.id, c.step),
                    None => "the initial state (nothing committed)".into(),
                }
            ),
        );
        // A save in flight cannot commit without the lost server's part.
        self.store_quiesce();
        let id = checkpoint
            .as_ref()
            .map(|c| {
                CheckpointId::new(c.id.clone())
                    .map_err(|e| ClusterError::Checkpoint(format!("checkpoint id {:?}: {e}", c.id)))
            })
            .transpose()?;
        let rec = |e: ClusterError| ClusterError::Recovery(e.to_string());
        let mut replace: Vec<u32> = servers.to_vec();
        let mut others: Vec<u32> = Vec::new();
        loop {
            self.count_recovery()?;
            self.clients = None;
            for &s in &replace {
                if !self
                    .failures
                    .iter()
                    .any(|f| f.role == Role::Server && f.id == s && f.resumed_s.is_none())
                {
                    // Lost again during this recovery.
                    self.detected(Role::Server, s, "recovery");
                }
                self.replace_server(s).map_err(rec)?;
            }
            let now = self.now();
            for f in self.failures.iter_mut().filter(|f| {
                f.role == Role::Server && servers.contains(&f.id) && f.replaced_s.is_none()
            }) {
                f.replaced_s = Some(now - f.injected_t_s);
            }
            self.update_heartbeat();
            self.fire_phase_kills(Phase::Recovery);
            match self.load_partial(servers, id.as_ref()) {
                Ok(()) => break,
                Err(e) => {
                    let lost = self.probe_lost();
                    // Servers outside this recovery: a new process each, so that every server
                    // answers again; what they held is restored once the strategy hears of it.
                    let outside: Vec<u32> = lost
                        .iter()
                        .copied()
                        .filter(|s| !servers.contains(s))
                        .collect();
                    for &s in &outside {
                        self.replace_server(s).map_err(rec)?;
                        if !others.contains(&s) {
                            others.push(s);
                        }
                    }
                    replace = lost.into_iter().filter(|s| servers.contains(s)).collect();
                    if replace.is_empty() && outside.is_empty() {
                        return Err(rec(e));
                    }
                }
            }
        }
        for i in 0..self.failures.len() {
            let f = &mut self.failures[i];
            if f.role == Role::Server && servers.contains(&f.id) && f.resumed_s.is_none() {
                f.servers_restored = servers.to_vec();
                // Nothing to redo: back where it was as soon as training resumes.
                self.recover_at.push((i, self.batches));
            }
        }
        self.reconnect_workers().map_err(rec)?;
        // Reports about the servers just replaced are stale.
        let _ = self.heartbeat_losses();
        Ok(others)
    }

    /// Connect to every server and load `id` into `servers` only.
    fn load_partial(
        &mut self,
        servers: &[u32],
        id: Option<&CheckpointId>,
    ) -> Result<(), ClusterError> {
        let addrs = self.server_addrs.clone();
        self.clients = Some(self.rt.block_on(connect_all(&addrs, &self.cfg.auth))?);
        self.connect_store_clients()?;
        let Some(id) = id else {
            // The replacements started from the seed: the initial state is what they hold.
            return Ok(());
        };
        let st = self.store.as_ref().ok_or_else(|| {
            ClusterError::Protocol(
                "a partial restore was asked for in a run without a store".into(),
            )
        })?;
        let location = st.location.clone();
        let clients: Vec<_> = servers
            .iter()
            .map(|&s| {
                st.clients.get(s as usize).cloned().ok_or_else(|| {
                    ClusterError::Protocol(format!("no checkpoint client for server {s}"))
                })
            })
            .collect::<Result<_, _>>()?;
        // As for a full restore: no heartbeat probes while a server holds its shard's write
        // lock to load it (they would occupy its runtime); a server dying now fails the call.
        let _ = self.hb_targets.send(Vec::new());
        let done = self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (s, c) in servers.iter().copied().zip(clients) {
                let (loc, id) = (location.clone(), id.clone());
                set.spawn(async move { (s, c.restore(loc, id).await) });
            }
            let mut out = Vec::new();
            while let Some(r) = set.join_next().await {
                match r {
                    Ok((s, Ok(d))) => out.push((s, d)),
                    Ok((s, Err(e))) => return Err(format!("server {s}: {e}")),
                    Err(e) => return Err(format!("a restore task failed: {e}")),
                }
            }
            Ok(out)
        });
        self.update_heartbeat();
        let done = done.map_err(|e| ClusterError::Checkpoint(format!("restoring {id}: {e}")))?;
        for (s, d) in done {
            self.event(
                EventKind::ServerRestored,
                Some(s),
                format!(
                    "{id}: {} checkpoints, {} files, {} bytes",
                    d.checkpoints, d.files, d.bytes
                ),
            );
        }
        Ok(())
    }
}

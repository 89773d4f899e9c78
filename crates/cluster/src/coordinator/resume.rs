//! Starting a job again from its store ([`crate::resume`]): fresh servers and workers, then the
//! recovery path of every saving strategy (every server restores the newest committed
//! checkpoint, the workers rewind to its data position), then training to the job's end.
//!
//! - The point to resume from is the store's head: the checkpoint `CURRENT` names (or the newest
//!   committed state if `CURRENT` is unreadable), through a merged checkpoint if the merger
//!   replaced it. A store with nothing committed is an error.
//! - A job killed mid-save left files without a manifest: they are removed first (nothing else
//!   writes to the store of a job that is not running).
//! - Checkpoint ids carry an attempt number (`-a<N>`, the run's recovery count); the resumed run
//!   counts on from the largest the store holds, so its ids never meet an earlier run's.
//! - Restoring onto another number of servers than saved the checkpoint re-shards the rows by
//!   the shard map (each server reads every saved server's rows and keeps its own); the
//!   strategy then starts a new lineage with a full at its next save point.

use ftrec_ckpt::deck::{self, Lineage};
use ftrec_strategy::{CheckpointRef, Event};
use serde::{Deserialize, Serialize};

use super::store::{state_manifest, StoreState};
use super::Coordinator;
use crate::report::EventKind;
use crate::ClusterError;

/// What the report says about a resumed run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeReport {
    /// The store the job was resumed from.
    pub location: String,
    /// The checkpoint every server restored, and its step and batch count.
    pub checkpoint: String,
    pub step: u64,
    pub batches: u64,
    /// Servers that saved it, and servers it was restored onto (re-sharded when they differ).
    pub saved_servers: u32,
    pub servers: u32,
    /// Checkpoint directories without a manifest (saves the killed job never committed) that
    /// were removed first.
    pub orphans_removed: Vec<String>,
}

/// Where a resumed run starts.
pub(super) struct ResumePoint {
    pub checkpoint: CheckpointRef,
    pub saved_servers: u32,
    /// The first checkpoint attempt number no id in the store uses.
    pub attempt_base: u32,
    pub orphans_removed: Vec<String>,
}

/// The attempt number of a checkpoint id (`...-a<N>`, possibly followed by a merge suffix).
fn attempt_of(id: &str) -> Option<u32> {
    id.split('-')
        .filter_map(|p| p.strip_prefix('a'))
        .filter_map(|n| n.parse::<u32>().ok())
        .max()
}

/// Find the point to resume from in `st`'s store (before any process starts): an error if the
/// store holds no committed checkpoint, or one past the job's `steps`.
pub(super) fn resume_point(
    rt: &tokio::runtime::Runtime,
    st: &StoreState,
    steps: u64,
) -> Result<ResumePoint, ClusterError> {
    let ckpts = st.ckpts.clone();
    let location = st.location.clone();
    rt.block_on(async move {
        let err = |e: ftrec_ckpt::CkptError| ClusterError::Checkpoint(format!("{location}: {e}"));
        let orphans_removed = deck::remove_orphans(&ckpts).await.map_err(err)?;
        let lineage = Lineage::load(&ckpts).await.map_err(err)?;
        let Some(head) = lineage.head() else {
            return Err(ClusterError::Checkpoint(format!(
                "{location} has no committed checkpoint to resume from{}",
                if lineage.unreadable.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} unreadable: {})",
                        lineage.unreadable.len(),
                        lineage
                            .unreadable
                            .iter()
                            .map(|(id, why)| format!("{id}: {why}"))
                            .collect::<Vec<_>>()
                            .join("; ")
                    )
                }
            )));
        };
        let m = state_manifest(&ckpts, &head).await.map_err(err)?;
        if m.step > steps {
            return Err(ClusterError::Config(format!(
                "{location}: checkpoint {head} is at step {}, past the job's {steps} steps",
                m.step
            )));
        }
        let attempt_base = ckpts
            .list_checkpoints()
            .await
            .map_err(err)?
            .iter()
            .filter_map(|id| attempt_of(id.as_str()))
            .max()
            .map_or(0, |a| a + 1);
        Ok(ResumePoint {
            // The checkpoint that holds the state now: the head itself, or the merged
            // checkpoint standing for it once the merger collected it.
            checkpoint: CheckpointRef {
                id: m.id.to_string(),
                step: m.step,
            },
            saved_servers: m.shards.len() as u32,
            attempt_base,
            orphans_removed,
        })
    })
}

impl Coordinator {
    /// Restore every server from `p` through the recovery path, rewind the workers to its data
    /// position and tell the strategy where it stands. `Ok(false)`: the strategy ended the run.
    pub(super) fn resume_from(&mut self, p: ResumePoint) -> Result<bool, ClusterError> {
        let location = self
            .store
            .as_ref()
            .map(|s| s.location.clone())
            .unwrap_or_default();
        self.attempt_base = p.attempt_base;
        let servers = self.cfg.servers;
        self.event(
            EventKind::JobResumed,
            None,
            format!(
                "from {} (step {}) in {location}, saved by {} servers, onto {servers}{}",
                p.checkpoint.id,
                p.checkpoint.step,
                p.saved_servers,
                if p.orphans_removed.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; removed {} unfinished saves ({})",
                        p.orphans_removed.len(),
                        p.orphans_removed.join(", ")
                    )
                }
            ),
        );
        // The recovery path: every server loads the checkpoint's lineage, the workers rewind
        // to its data position.
        self.restore(Some(p.checkpoint.clone()))?;
        self.resumed = Some(ResumeReport {
            location,
            checkpoint: p.checkpoint.id.clone(),
            step: p.checkpoint.step,
            batches: self.batches,
            saved_servers: p.saved_servers,
            servers,
            orphans_removed: p.orphans_removed,
        });
        let actions = self.strategy.on(&Event::Resumed {
            checkpoint: p.checkpoint,
            continues: p.saved_servers == servers,
            now_s: self.now(),
        });
        self.execute(actions)
    }
}

#[cfg(test)]
mod tests {
    use super::attempt_of;

    #[test]
    fn attempts_are_read_from_every_kind_of_id() {
        assert_eq!(attempt_of("00000000000000000010-full-a0"), Some(0));
        assert_eq!(attempt_of("00000000000000000010-delta-a12"), Some(12));
        assert_eq!(attempt_of("00000000000000000010-delta-a3-m1"), Some(3));
        assert_eq!(attempt_of("00000000000000000010-prioritized-a2"), Some(2));
        assert_eq!(attempt_of("00000000000000000010-full"), None);
    }
}

//! A node's parities and dense replicas made whole again after its rows were restored from a
//! checkpoint: the second line of defence ECRec §4 names ("checkpoints at a much lower
//! frequency ... as a second layer of defense against concurrent failures"). When more servers
//! are lost at once than the code tolerates, every server loads its rows from the newest such
//! checkpoint; the parities and replicas they held belong to another state, so
//!
//! 1. [`EcNode::reset_for_restore`], on every node before the load: stops a rebuild under way
//!    (its decodes would install rows of the old state), forgets what was missing, prepared,
//!    staged or committed, and every transaction but the fences;
//! 2. the checkpoint service loads the rows and dense blocks;
//! 3. [`EcNode::reencode`], on every node after every load: encodes each parity slot it holds
//!    from its stripe's data rows, read from their owners, and copies each dense replica from
//!    its primary.
//!
//! The cluster must be quiet from step 1 to the end of step 3 (training paused, no transaction
//! in flight): the reads of step 3 are then one consistent cut.

use std::collections::BTreeMap;

use ftrec_core::ServerId;
use ftrec_ec::Location;

use super::node::EcNode;
use super::service::EcService;
use super::types::{MemberKey, RebuildStatus};
use crate::PsError;

/// Stripes whose data rows one read asks a peer for (bounded, so a message stays a few MiB).
const STRIPES_PER_READ: usize = 4096;

/// What [`EcNode::reencode`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReencodeReport {
    /// Parity rows encoded.
    pub parities: u64,
    /// Dense replicas copied from their primaries.
    pub replicas: u64,
}

impl EcNode {
    /// Step 1 of a restore (module doc): no rebuild runs, nothing is missing, prepared, staged or
    /// committed, and no transaction holds the node; the fences stay.
    pub async fn reset_for_restore(&self) -> Result<(), PsError> {
        let _control = self.inner.control.lock().await;
        {
            // A new generation first, so that a batch of the driver under way can no longer
            // install or merge anything; then stop the driver.
            let mut st = self.state()?;
            st.status.generation += 1;
        }
        self.stop_driver().await?;
        self.inner.server.set_row_source(None)?;
        let mut st = self.state()?;
        let generation = st.status.generation;
        st.missing = None;
        st.status = RebuildStatus {
            generation,
            ..RebuildStatus::default()
        };
        st.locks_open = 0;
        st.rebuild_t0 = None;
        st.committed = None;
        st.clear_steps();
        st.txn.clear_for_restore();
        drop(st);
        self.inner.server.write()?.clear_staged();
        self.inner.slot_freed.notify_waiters();
        Ok(())
    }

    /// Step 3 of a restore (module doc): every parity slot this node holds is encoded from its
    /// stripe's data rows as their owners hold them now, and every dense replica is copied from
    /// its primary.
    pub async fn reencode(&self) -> Result<ReencodeReport, PsError> {
        let layout = &self.inner.layout;
        let words = self.inner.words;
        let (k, r) = (layout.k(), layout.r());
        let slots: Vec<_> = layout.parity_slots(self.inner.me)?.collect();
        let mut report = ReencodeReport::default();
        let mut data = vec![vec![0.0f32; words]; k];
        let mut parity = vec![vec![0.0f32; words]; r];
        for chunk in slots.chunks(STRIPES_PER_READ) {
            // The data rows of the chunk's stripes, one read per owner.
            let mut keys: BTreeMap<ServerId, Vec<MemberKey>> = BTreeMap::new();
            let mut place: Vec<Vec<Option<(ServerId, usize)>>> = Vec::with_capacity(chunk.len());
            for &(_, stripe, _) in chunk {
                let mut at = vec![None; k];
                for m in layout.members(stripe)? {
                    if let Location::Row { table, local, .. } = m.location {
                        let list = keys.entry(m.server).or_default();
                        at[m.position] = Some((m.server, list.len()));
                        list.push(MemberKey::Row { table, local });
                    }
                }
                place.push(at);
            }
            let mut rows: BTreeMap<ServerId, Vec<f32>> = BTreeMap::new();
            for (server, list) in keys {
                let read = self.peer(server)?.read_members(list).await?;
                if read.words != words {
                    return Err(PsError::Coding(format!(
                        "server {} answered rows of {} words, this node's have {words}",
                        server.0, read.words
                    )));
                }
                rows.insert(server, read.data);
            }
            // The chunk's encoded parities, one after the other, written under one lock below.
            let mut encoded: Vec<f32> = Vec::with_capacity(chunk.len() * words);
            for (&(_, _, j), at) in chunk.iter().zip(&place) {
                for (pos, row) in data.iter_mut().enumerate() {
                    match at[pos] {
                        Some((server, i)) => {
                            row.copy_from_slice(&rows[&server][i * words..(i + 1) * words])
                        }
                        // Past the end of the table: read as zeros (ECRec's short stripe).
                        None => row.fill(0.0),
                    }
                }
                let ins: Vec<&[f32]> = data.iter().map(|v| v.as_slice()).collect();
                let mut outs: Vec<&mut [f32]> =
                    parity.iter_mut().map(|v| v.as_mut_slice()).collect();
                self.inner.code.encode(&ins, &mut outs)?;
                encoded.extend_from_slice(&parity[j]);
            }
            let mut st = self.state()?;
            for (&(slot, _, _), words_of) in chunk.iter().zip(encoded.chunks_exact(words)) {
                let p = &mut st.parity[slot.table.0 as usize];
                let at = slot.index as usize * words;
                p[at..at + words].copy_from_slice(words_of);
                report.parities += 1;
            }
        }
        let primaries: Vec<ServerId> = self.state()?.replicas.iter().map(|r| r.primary).collect();
        for primary in primaries {
            let read = self.peer(primary)?.read_dense(primary).await?;
            let mut st = self.state()?;
            let rep = st
                .replicas
                .iter_mut()
                .find(|r| r.primary == primary)
                .ok_or_else(|| PsError::Internal(format!("replica of {} vanished", primary.0)))?;
            if rep.blocks.start != read.block.first_block
                || rep.dense.values.len() != read.block.values.len()
                || rep.dense.state.len() != read.block.state.len()
            {
                return Err(PsError::Coding(format!(
                    "server {}'s dense range does not have the shape of the copy server {} holds",
                    primary.0, self.inner.me.0
                )));
            }
            rep.dense.values.copy_from_slice(&read.block.values);
            rep.dense.state.copy_from_slice(&read.block.state);
            report.replicas += 1;
        }
        Ok(report)
    }
}

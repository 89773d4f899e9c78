//! What an ECRec node holds in memory, part by part, for the memory report of a server
//! process: the model's rows, the redundancy ECRec adds (parity rows, dense replicas), and
//! what its transactions and a rebuild keep between calls. Read only; it never changes the
//! node.

use ftrec_core::TableId;

use std::sync::atomic::{AtomicU64, Ordering};

use super::node::{EcNode, StagedIncoming};
use crate::server::PreparedStep;
use crate::update::Update;
use crate::PsError;

/// Prepares waiting for a node's transaction slot, and the bytes of the shares they hold.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    prepares: AtomicU64,
    bytes: AtomicU64,
}

impl Waiting {
    /// Count `share` as waiting until the returned guard drops.
    pub(crate) fn enter<'a>(&'a self, share: &Update) -> WaitingGuard<'a> {
        let bytes = update_bytes(share);
        self.prepares.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        WaitingGuard { of: self, bytes }
    }
}

/// Counts a prepare as waiting while it lives.
pub(crate) struct WaitingGuard<'a> {
    of: &'a Waiting,
    bytes: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.of.prepares.fetch_sub(1, Ordering::Relaxed);
        self.of.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Heap bytes of an update (capacities).
fn update_bytes(u: &Update) -> u64 {
    let sparse: usize = u
        .sparse
        .iter()
        .map(|g| g.rows.capacity() * 8 + g.grads.capacity() * 4)
        .sum();
    let dense: usize = u.dense.iter().map(|g| g.grads.capacity() * 4).sum();
    (sparse + dense) as u64
}

/// Bytes one [`EcNode`] holds per part (capacities, so buffers kept for reuse count), at one
/// instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMemory {
    /// Rows of every table with their optimizer state, and the primary dense range with its
    /// state: what the node holds without ECRec.
    pub rows_bytes: u64,
    /// Parity rows (values and optimizer state, ECRec §3.2).
    pub parity_bytes: u64,
    /// Copies of other servers' dense ranges (ECRec §3.3).
    pub dense_replica_bytes: u64,
    /// Prepared steps of asynchronous transactions: the holder's, and the spare kept for the
    /// next prepare (its buffers are reused, ECRec §3.5).
    pub prepared_bytes: u64,
    /// Peers' deltas staged for transactions not yet committed: batches (one per transaction
    /// and sender) and their bytes.
    pub staged_batches: u64,
    pub staged_bytes: u64,
    /// Workers' shares held by prepares that wait for this node's transaction slot (each
    /// waits with its decoded update until the holder commits or aborts), and how many.
    pub waiting_prepares: u64,
    pub waiting_bytes: u64,
    /// A replacement's record of what it still has to rebuild (per row and parity slot).
    pub rebuild_bytes: u64,
}

pub(crate) fn prepared_capacity(p: &PreparedStep) -> u64 {
    let rows: usize = p
        .rows
        .iter()
        .map(|t| t.rows.capacity() * 8 + t.new.capacity() * 4)
        .sum();
    (rows
        + p.rows.capacity() * std::mem::size_of::<crate::server::PreparedRows>()
        + p.workers.capacity() * 4
        + p.dense.capacity() * std::mem::size_of::<crate::server::PreparedDense>()
        + p.dense_grads.capacity() * 4) as u64
}

impl EcNode {
    /// What this node holds now, part by part ([`NodeMemory`]).
    pub fn memory_parts(&self) -> Result<NodeMemory, PsError> {
        let st = self.state()?;
        let parity_bytes = st.parity.iter().map(|p| p.capacity() as u64 * 4).sum();
        let dense_replica_bytes = st
            .replicas
            .iter()
            .map(|r| (r.dense.values.capacity() + r.dense.state.capacity()) as u64 * 4)
            .sum();
        let prepared_bytes = st
            .txn
            .holder
            .iter()
            .map(|(_, p)| &**p)
            .chain(st.txn.spare.iter())
            .map(prepared_capacity)
            .sum::<u64>()
            + st.txn.behind.map_or(0, |b| b.prepared_bytes);
        let staged_batches = st.txn.incoming.values().map(|s| s.len() as u64).sum();
        let staged_bytes = st
            .txn
            .incoming
            .values()
            .flat_map(|s| s.values())
            .map(StagedIncoming::bytes)
            .sum();
        let rebuild_bytes = st.missing.as_ref().map_or(0, |m| {
            let flags: usize = m.rows.iter().chain(&m.parities).map(Vec::capacity).sum();
            let stamps: usize = m.stamps.iter().map(|s| s.capacity() * 8).sum();
            (flags + stamps) as u64
        });
        drop(st);
        let s = self.inner.server.read()?;
        let rows: u64 = (0..self.inner.layout.tables())
            .map(|t| s.shard(TableId(t as u32)).map_or(0, |x| x.bytes()))
            .sum();
        let dense = (s.dense().values.capacity() + s.dense().state.capacity()) as u64 * 4;
        Ok(NodeMemory {
            rows_bytes: rows + dense,
            parity_bytes,
            dense_replica_bytes,
            prepared_bytes,
            staged_batches,
            staged_bytes,
            waiting_prepares: self.inner.waiting.prepares.load(Ordering::Relaxed),
            waiting_bytes: self.inner.waiting.bytes.load(Ordering::Relaxed),
            rebuild_bytes,
        })
    }
}

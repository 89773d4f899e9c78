//! Plain values exchanged by ECRec nodes and their coordinator, shared by both transports.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ftrec_core::{RowId, ServerId, TableId};

use crate::update::DenseBlock;

/// The differences one owner sends one parity or replica holder for one step (ECRec §3.2,
/// difference propagation; §3.3, dense replication).
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaBatch {
    pub step: u64,
    pub from: ServerId,
    /// Apply on arrival (one-phase mode, `--no-2pc`) instead of staging under `step`.
    pub apply_now: bool,
    pub rows: Vec<RowDelta>,
    pub dense: Vec<DenseDelta>,
}

/// A [`DeltaBatch`] as it is built, sent and staged: every row delta in one flat buffer, every
/// dense gradient in another, so a step costs a few allocations per peer rather than one per
/// row (ECRec §3.2: the per-row difference is the unit of propagation, not of allocation).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PackedBatch {
    pub step: u64,
    pub from: ServerId,
    pub apply_now: bool,
    /// The transaction the deltas belong to (asynchronous training); `None`: step `step`.
    pub txn: Option<TxnId>,
    /// Words per row delta.
    pub words: usize,
    /// Table and global row of delta `i`, whose words are `deltas[i * words..(i + 1) * words]`.
    pub rows: Vec<(TableId, RowId)>,
    pub deltas: Vec<f32>,
    /// Global block index of dense gradient `i`, its length, and all gradients back to back.
    pub dense_blocks: Vec<u64>,
    pub dense_lens: Vec<u32>,
    pub dense_grads: Vec<f32>,
}

impl PackedBatch {
    pub fn new(step: u64, from: ServerId, apply_now: bool, words: usize) -> Self {
        PackedBatch {
            step,
            from,
            apply_now,
            txn: None,
            words,
            rows: Vec::new(),
            deltas: Vec::new(),
            dense_blocks: Vec::new(),
            dense_lens: Vec::new(),
            dense_grads: Vec::new(),
        }
    }

    /// The same batch for transaction `txn` (`None`: a step's).
    pub fn for_txn(mut self, txn: Option<TxnId>) -> Self {
        self.txn = txn;
        self
    }

    /// Pack `batch`; row deltas of unequal length are an error naming the row.
    pub fn from_batch(batch: DeltaBatch) -> Result<Self, crate::PsError> {
        let words = batch.rows.first().map_or(0, |r| r.delta.len());
        let mut p = PackedBatch::new(batch.step, batch.from, batch.apply_now, words);
        p.rows.reserve(batch.rows.len());
        p.deltas.reserve(batch.rows.len() * words);
        for d in batch.rows {
            if d.delta.len() != words {
                return Err(crate::PsError::ShapeMismatch {
                    what: format!("delta of row {} of table {}", d.row, d.table.0),
                    expected: words as u64,
                    got: d.delta.len() as u64,
                });
            }
            p.rows.push((d.table, d.row));
            p.deltas.extend_from_slice(&d.delta);
        }
        for d in batch.dense {
            p.dense_blocks.push(d.block);
            p.dense_lens.push(d.grad.len() as u32);
            p.dense_grads.extend_from_slice(&d.grad);
        }
        Ok(p)
    }
}

/// One worker's update as one transaction (ECRec §3.5: in asynchronous training each worker
/// coordinates the two-phase commit of its own update).
///
/// Every transaction takes part on every node (with an empty share where it touches
/// nothing), and a node holds one transaction between its prepare and its commit or abort,
/// so all nodes commit transactions in the same order: a node's count of committed
/// transactions names the same set of updates on every node, which is what makes a rebuild's
/// cut consistent. Conflicts are resolved by *wait-die* on `priority`: a transaction older
/// than the holder waits for it, a younger one is refused at once (a retryable
/// [`crate::PsError::NotReady`]) and its worker aborts and retries it with the same priority,
/// so it eventually is the oldest and never starves, and no wait cycle can form. Under
/// contention a worker prepares [`Admission::Queued`] instead: see there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId {
    pub worker: u32,
    /// The worker process's incarnation: leftovers of a lost worker are fenced off by it.
    pub epoch: u32,
    /// Increases with every transaction of the worker process.
    pub seq: u64,
    /// Wait-die age, lower is older: the global index of the batch the update comes from.
    pub priority: u64,
}

impl TxnId {
    /// Strictly older than `other` (ties broken by worker and sequence number).
    pub fn older_than(&self, other: &TxnId) -> bool {
        (self.priority, self.worker, self.epoch, self.seq)
            < (other.priority, other.worker, other.epoch, other.seq)
    }
}

/// How a prepare takes a node's transaction slot.
///
/// Every transaction takes part on every node, so under contention *wait-die* refuses most
/// attempts, and each refused attempt has already computed and propagated its prepare on the
/// nodes that let it in (at 15 workers on 5 servers, nine attempts per commit). A queued
/// prepare is never refused for its age: its worker first reserves the gate node's slot
/// (node 0, [`Admission::Reserve`]: no share, nothing computed), then prepares everywhere at
/// once ([`Admission::Queued`]), waiting wherever the slot is held. A wait-die prepare that
/// meets a queued or reserved holder is refused whatever its age. No wait
/// cycle can form: only a queued transaction waits for a queued one, and only at the gate,
/// where it holds nothing yet; a queued transaction waits past the gate only while it holds
/// the gate, so at most one does at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Wait for a younger holder; be refused by an older one, or by a queued or reserved
    /// one whatever its age (the default).
    #[default]
    WaitDie,
    /// Wait for any holder (only after reserving the gate node's slot); at the gate, take
    /// the slot this transaction reserved there.
    Queued,
    /// At the gate only: wait for any holder, then keep the slot for this transaction's
    /// queued prepare, computing nothing (the share must be empty). The reservation holds
    /// the slot under the lease like a prepared transaction. When the gate's holder is a
    /// prepared queued transaction, the reservation is taken *behind* it instead (the
    /// report's [`PrepareReport::after`] names it), and the prepares go as
    /// [`Admission::After`].
    Reserve,
    /// Queued, behind the named transaction (the gate's holder when this one reserved the
    /// gate): on every node, wait until that one has been there (prepared, committed or
    /// aborted), and where it is prepared and undecided, compute on top of its prepared
    /// rows and hold the vote until it is decided there (see the module docs of `txn`).
    After(TxnId),
}

impl Admission {
    /// Queued in either form: never refused for its age, waits for any holder.
    pub fn is_queued(self) -> bool {
        matches!(self, Admission::Queued | Admission::After(_))
    }
}

/// What a node holds of one transaction once a resolver blocked it there
/// ([`super::EcService::txn_block`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnOutcome {
    /// Committed here: its worker had decided to commit.
    Committed,
    /// Prepared here, neither committed nor aborted.
    Prepared,
    /// Neither: never prepared here, aborted, or resolved by an abort.
    Absent,
}

/// Transactions a node resolved (or helped resolve) since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnCounters {
    /// Resolutions this node started because a transaction outlived its lease here.
    pub lease_expiries: u64,
    /// Transactions committed and aborted here by a resolver (not by their worker).
    pub resolved_committed: u64,
    pub resolved_aborted: u64,
    /// Worker messages refused because a resolver had blocked their transaction.
    pub blocked_refusals: u64,
    /// Prepares computed behind the prepared holder ([`Admission::After`]), and those of them
    /// refused because that holder was aborted.
    pub behind: u64,
    pub behind_refused: u64,
}

/// The transaction behind a node's prepared holder ([`super::EcNode::txn_behind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BehindStatus {
    pub txn: TxnId,
    /// The holder it goes behind.
    pub base: TxnId,
    /// Whether its prepare is computed (it waits for `base` to be decided).
    pub computed: bool,
    /// Whether it is a reservation at the gate (nothing computed).
    pub reserved: bool,
}

/// What a node knows of one worker's transactions, as the coordinator's resolution of a lost
/// worker asks it ([`super::EcService::txn_fence`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnStatus {
    /// The worker's transaction holding this node (prepared here), if any.
    pub holding: Option<TxnId>,
    /// The worker's last transaction committed here.
    pub last_commit: Option<TxnId>,
    /// The worker's transactions with deltas staged here by peers.
    pub staged: Vec<TxnId>,
}

/// `delta` = code delta of one data row (values and optimizer state, old to new): the bits
/// of `old XOR new` for gf256, `new - old` for sum.
#[derive(Debug, Clone, PartialEq)]
pub struct RowDelta {
    pub table: TableId,
    pub row: RowId,
    pub delta: Vec<f32>,
}

/// The summed gradient of one dense block of the sender's primary range: a replica applies
/// the same optimizer step to it (ECRec §3.3).
#[derive(Debug, Clone, PartialEq)]
pub struct DenseDelta {
    /// Global block index.
    pub block: u64,
    pub grad: Vec<f32>,
}

/// A stored member of a stripe, addressed on the server that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemberKey {
    /// A data row by local index.
    Row { table: TableId, local: u64 },
    /// A parity row by parity slot.
    Parity { table: TableId, slot: u64 },
}

/// Words of some members taken at one instant, with the step the node had committed then
/// (`None` before the first commit). Readers compare the steps of all their reads to know that
/// they form one consistent cut.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRead {
    pub step: Option<u64>,
    /// Words per member (values then optimizer state).
    pub words: usize,
    /// `words` words per requested key, in request order.
    pub data: Vec<f32>,
}

/// One primary dense range (values and optimizer state) with the committed step it reflects.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseRead {
    pub step: Option<u64>,
    pub block: DenseBlock,
}

/// What phase 1 of a step did on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrepareReport {
    pub rows: u64,
    pub dense_blocks: u64,
    /// Row deltas sent to parity holders (one per row and parity holder).
    pub row_deltas_sent: u64,
    /// Dense block gradients sent to replica holders.
    pub dense_deltas_sent: u64,
    /// Payload bytes of everything sent to peers.
    pub bytes_sent: u64,
    /// Lost rows decoded on demand before the step could be computed (a replacement only).
    pub rows_decoded: u64,
    /// Microseconds the transaction waited for this node's slot (held by other transactions),
    /// and, behind another transaction, for that one to be decided here.
    pub slot_wait_us: u64,
    /// Of `slot_wait_us`, behind another transaction ([`Admission::After`]): the vote held
    /// until that one was decided here (the wait that early release leaves).
    pub behind_wait_us: u64,
    /// A reservation taken behind the gate's holder: that transaction (the queued prepares
    /// go as [`Admission::After`] it).
    pub after: Option<TxnId>,
}

/// Progress of a replacement's rebuild (ECRec §3.4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildStatus {
    /// Whether a rebuild was started on this node.
    pub started: bool,
    /// The node holds its dense part and takes part in steps.
    pub joined: bool,
    pub ranges_total: u64,
    pub ranges_done: u64,
    /// Data rows and parity rows still to rebuild.
    pub rows_missing: u64,
    pub parities_missing: u64,
    /// Rows decoded on demand because a pull or a step needed them before their range.
    pub rows_decoded_on_demand: u64,
    /// Lock switches that had to be retried because a step committed during the reads.
    pub cut_retries: u64,
    /// How many times the rebuild was started on this node: 1 for a plain rebuild, one more
    /// for every restart against a new set of lost servers.
    pub generation: u64,
    /// Commits this node applied while one of its rebuild batches held its lock (the deltas
    /// a zeroed parity slot collects between its lock and its merge).
    pub commits_in_lock: u64,
    /// Start and end of every lock range this generation ran, in microseconds after the
    /// rebuild (re)started on this node.
    pub range_spans_us: Vec<(u64, u64)>,
    /// Bytes the rebuild's batches decoded into this node: data rows installed and parity
    /// rows merged (rows decoded on demand are counted in `rows_decoded_on_demand`).
    pub bytes_rebuilt: u64,
    /// Batches the driver ran, and the microseconds they took (reads, decode, install and
    /// merge, retried cuts included): the rebuild's working time, its active bandwidth
    /// being `bytes_rebuilt / busy_us`.
    pub batches: u64,
    pub busy_us: u64,
    /// Microseconds the driver rested between batches as the rebuild share asked.
    pub rest_us: u64,
    /// Microseconds of the working time spent switching locks (ECRec §3.4, "Effect of lock
    /// granularity"): taking a batch's lock, merging the deltas its slots buffered, and
    /// waiting before a cut that has to be read again.
    pub lock_us: u64,
    /// Everything is rebuilt; the node is a full member again.
    pub finished: bool,
    /// Why the rebuild stopped, if it failed (start it again with the current lost set).
    pub error: Option<String>,
}

/// A point of a rebuild batch where a [`RebuildHook`] runs (and may hold the batch): fault
/// injection and tests that need an exact interleaving of a rebuild with steps or restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebuildPoint {
    /// The batch took its lock (zeroed its missing parity slots) and decoded its cut; nothing
    /// is installed or merged yet. `generation`: the rebuild start the driver belongs to.
    Decoded { generation: u64 },
    /// The batch installed its rows and merged its parities.
    Merged { generation: u64 },
}

/// Called by the rebuild driver at every [`RebuildPoint`]; the driver waits for the returned
/// future before it goes on.
pub type RebuildHook =
    Arc<dyn Fn(RebuildPoint) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

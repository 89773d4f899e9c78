//! Hooks that see every applied update, in the order the server applies them.
//!
//! This is where the fault-tolerance strategies attach to the update path:
//! - DECK records the ids of touched rows here (remote-form tracking: the server sees each
//!   touched row once per update, already deduplicated; DECK §3.1);
//! - ECRec's difference propagation needs each touched row's words before and after the
//!   optimizer step, values and optimizer state alike, to send their difference to the parity
//!   holder (ECRec §3.2); an observer asks for them with [`PushObserver::wants_row_images`].
//!
//! Observers run on the update path with the server's state locked, so they see updates in
//! exactly the order they were applied; they must be quick (record, enqueue) and must not call
//! back into the server. They are not told about imports (restores rewrite state, they do not
//! train it).

use ftrec_core::{RowId, TableId};

/// Why rows changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOrigin {
    /// An asynchronous push.
    Push,
    /// The commit of a deterministic step.
    Step(u64),
}

/// Words of the updated rows before and after the update: `old` and `new` hold `words`
/// words per row, aligned with the `rows` slice they come with.
#[derive(Debug, Clone, Copy)]
pub struct RowImages<'a> {
    pub words: usize,
    pub old: &'a [f32],
    pub new: &'a [f32],
}

/// Sees every applied update.
pub trait PushObserver: Send + Sync {
    /// Whether [`PushObserver::rows_updated`] needs the rows' words before and after the
    /// update. Copying them costs two row copies per touched row, so only ask when needed.
    fn wants_row_images(&self) -> bool {
        false
    }

    /// `rows` (global ids, sorted, distinct) of `table` received one optimizer update each.
    fn rows_updated(
        &mut self,
        origin: UpdateOrigin,
        table: TableId,
        rows: &[RowId],
        images: Option<RowImages<'_>>,
    );

    /// Dense blocks `blocks` (global block indices, sorted) received one update each.
    fn dense_updated(&mut self, _origin: UpdateOrigin, _blocks: &[u64]) {}
}

//! `ftrec-ckpt`: the checkpoint storage engine.
//!
//! It owns
//! - the [`ChunkStore`] trait, an async object store small enough for a local directory
//!   ([`LocalStore`]), an S3-compatible bucket ([`S3Store`], feature `s3`, on by default) and a
//!   map in memory ([`MemoryStore`]) to implement with one set of semantics, checked by one
//!   [`conformance`] suite; [`FaultyStore`], a seeded fault-injecting wrapper for tests; and
//!   [`RetryingStore`], bounded retries with seeded exponential backoff of transient failures
//!   (outages, a full disk), which every store opened from a location gets;
//! - the versioned on-disk [formats](mod@format): row files, dense files, manifests and the
//!   `CURRENT` pointer, each framed with magic, version, a header checksum and a payload
//!   checksum;
//! - checkpoint layout, commit and selection ([`Checkpoints`], [`Select`]): files create-only,
//!   then the manifest create-only, then `CURRENT` swapped atomically; readers verify all three
//!   levels and can fall back to the newest intact checkpoint; the store's job record
//!   ([`format::JobRecord`], [`Checkpoints::write_job`]): what job writes the store, as bytes
//!   this crate frames, checks and never interprets, so a job can be started again from its
//!   store;
//! - full snapshots of parameter-server shards ([`snapshot`]): bounded-size chunk files written
//!   with bounded memory by several servers into one checkpoint, and restore;
//! - a bandwidth benchmark of the local backend against the raw disk ([`bench`](mod@bench)).
//!
//! It never decides *when* to checkpoint or *what* a strategy saves (that is policy, above
//! this crate), never talks to the network except through a store, and never trusts bytes it
//! reads: a damaged file is an error naming it, never silently loaded.
//!
//! - DECK delta checkpointing ([`deck`], deck.txt §3–§4): the touched-row [`deck::Tracker`]
//!   with several consumers, the multi-layer staging pipeline ([`deck::staging`]: copy-out →
//!   staging directory → store, at most four chunk sizes in memory), the lineage graph
//!   ([`deck::Lineage`]), the hierarchical [`deck::Merger`], retention and [`deck::gc`], and
//!   restore of full + merged + deltas ([`deck::select_chain`], [`deck::restore_chain`]);
//! - CPR's prioritized partial saves ([`cpr`], cpr.txt §4.2): which rows a partial save
//!   writes, by access count (MFU), a sub-sampled list (SSU) or the size of each row's change
//!   since it was saved (SCAR); the save itself is a delta-shaped checkpoint of those rows;
//! - opening a store from a location string, a directory or `s3://bucket/prefix`
//!   ([`location::open`]);
//! - any committed state of any store rebuilt in memory as the whole model, tables in global
//!   row order and the dense vector end to end ([`model_state::restore_model`]), for evaluation
//!   and export;
//! - a whole store checked ([`verify::verify_store`]): every file of every checkpoint, the
//!   states damage takes down, the newest intact one.
//!
//! ```
//! use std::sync::Arc;
//! use ftrec_ckpt::snapshot::{self, RowIds, ServerShard, ShardTarget, SnapshotOptions, TableShard, TableTarget};
//! use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition, MemoryStore, Select};
//! use ftrec_core::{EmbeddingTable, RowLayout, ServerId, TableId};
//!
//! # fn main() -> Result<(), ftrec_ckpt::CkptError> {
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! rt.block_on(async {
//!     let ckpts = Checkpoints::new(Arc::new(MemoryStore::new()));
//!     let table = EmbeddingTable::new_init(TableId(0), 100, RowLayout::new(4, 1), 7, 0.1);
//!     let shard = ServerShard {
//!         server: ServerId(0),
//!         tables: vec![TableShard { table: &table, ids: RowIds::Identity }],
//!         dense: None,
//!     };
//!     let id = CheckpointId::for_step(10, CheckpointKind::Full);
//!     let opts = SnapshotOptions::default();
//!     snapshot::write_full(&ckpts, &id, 10, DataPosition::None, &[shard], &opts).await?;
//!
//!     let manifest = ckpts.select(&Select::Current, &[CheckpointKind::Full]).await?;
//!     let mut restored = EmbeddingTable::zeros(TableId(0), 100, RowLayout::new(4, 1));
//!     let mut target = ShardTarget {
//!         server: ServerId(0),
//!         tables: vec![TableTarget { table: &mut restored, ids: RowIds::Identity }],
//!         dense: None,
//!     };
//!     snapshot::restore_shard(&ckpts, &manifest, &mut target, &opts).await?;
//!     assert_eq!(restored, table);
//!     Ok(())
//! })
//! # }
//! ```

pub mod bench;
pub mod checkpoint;
pub mod conformance;
pub mod cpr;
pub mod deck;
pub mod error;
pub mod format;
pub mod incr;
pub mod key;
pub mod lease;
pub mod location;
pub mod model_state;
pub mod snapshot;
pub mod store;
#[cfg(feature = "s3-test-server")]
pub mod testing;
pub mod verify;

pub use bytes::Bytes;
pub use checkpoint::{Checkpoints, Select};
pub use error::{CkptError, Result};
pub use format::{CheckpointId, CheckpointKind, DataPosition, JobRecord, Manifest};
pub use key::Key;
pub use store::fault::{FaultPlan, FaultyStore};
pub use store::local::LocalStore;
pub use store::memory::MemoryStore;
pub use store::retry::{RetryPolicy, RetryingStore};
#[cfg(feature = "s3")]
pub use store::s3::{S3Config, S3Store};
pub use store::{ChunkStore, ObjectMeta, PutMode};

/// Give freed memory back to the operating system; call it after reading a lineage. A restore
/// reads a whole lineage through transient buffers (under naive incremental checkpoints, every
/// manifest and piece since the full), and glibc keeps freed pages. On its own this did not
/// keep a server flat across restores (the freed pages sat in per-thread arenas, pinned by
/// other allocations); with the cluster processes limited to two arenas (the `ftrec` binary's
/// `main`), it returns what a restore freed (`docs/BENCHMARKS.md`, "Soak").
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer; it only returns the allocator's free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

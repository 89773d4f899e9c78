//! The [`ChunkStore`] trait and its backends.
//!
//! A chunk store holds immutable-ish objects under [`Key`]s. It is deliberately small (put,
//! get, ranged get, head, list, delete) so that a local directory, an S3 bucket and an
//! in-memory map can all implement it with the same semantics, checked by one
//! [conformance suite](crate::conformance). Behaviour that is not storage (fault injection,
//! retries with backoff, later throttling or prefixing) wraps any store instead of living in
//! a backend.
//!
//! Semantics every backend keeps:
//! - `put` is atomic: a reader sees the old object, the new object or nothing, never a prefix.
//! - [`PutMode::Create`] fails with [`CkptError::AlreadyExists`] if the key exists. On the
//!   memory and local backends two racing creators cannot both win; on S3 this is the server's
//!   conditional put (`If-None-Match: *`).
//! - `get_range(start..end)` needs `start <= end <= size`, else [`CkptError::InvalidRange`].
//! - `list(prefix)` returns the objects strictly under `prefix/` (segment-wise), sorted by key.
//! - `delete` is idempotent: deleting a missing key succeeds.
//! - A missing key is [`CkptError::NotFound`] for `get`, `get_range` and `head`.
//! - `swap(key, expected, data)` replaces the object only if it holds exactly `expected` now
//!   (`None`: only if it is missing), else fails with [`CkptError::Precondition`]. Of two
//!   racing swaps from the same content exactly one wins. This is the one conditional write
//!   the store's small mutable objects (`CURRENT`, the lease, reader records) go through; on
//!   S3 it is a conditional put on the ETag read with the content (`If-Match`).

use std::fmt::Debug;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{CkptError, Result};
use crate::key::Key;

pub mod fault;
pub mod gated;
pub mod local;
pub mod memory;
pub mod retry;
#[cfg(feature = "s3")]
pub mod s3;

/// Whether a put may replace an existing object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Fail with [`CkptError::AlreadyExists`] if the key exists.
    Create,
    /// Replace any existing object atomically.
    Overwrite,
}

/// What `head` and `list` report about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: Key,
    pub size: u64,
}

/// Object storage for checkpoint files. Use it as `Arc<dyn ChunkStore>`.
#[async_trait]
pub trait ChunkStore: Send + Sync + Debug {
    /// Short backend name for messages (`memory`, `local`, `s3`, ...).
    fn backend(&self) -> &'static str;

    /// Store `data` under `key`, atomically.
    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()>;

    /// The whole object.
    async fn get(&self, key: &Key) -> Result<Bytes>;

    /// Bytes `range` of the object; `range.end` must not pass the object's size.
    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes>;

    /// Size of the object.
    async fn head(&self, key: &Key) -> Result<ObjectMeta>;

    /// Objects strictly under `prefix` (all objects if `None`), sorted by key.
    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>>;

    /// Remove the object; succeeds if it is already gone.
    async fn delete(&self, key: &Key) -> Result<()>;

    /// Replace `key` with `data` only if it holds exactly `expected` (`None`: only if it does
    /// not exist); otherwise [`CkptError::Precondition`] (or [`CkptError::AlreadyExists`] when
    /// `expected` is `None` and the key exists).
    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()>;
}

/// The error of a swap whose expected content is not what the store holds.
pub(crate) fn swap_conflict(key: &Key) -> CkptError {
    CkptError::Precondition {
        key: key.to_string(),
        reason: "the object changed since it was read (another writer replaced it)".into(),
    }
}

/// Check `range` against an object of `size` bytes.
pub(crate) fn check_range(key: &Key, range: &Range<u64>, size: u64) -> Result<()> {
    if range.start > range.end || range.end > size {
        return Err(CkptError::InvalidRange {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            size,
        });
    }
    Ok(())
}

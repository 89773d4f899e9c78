//! The crate's public error type.
//!
//! Backends keep their own failure types private and map them into [`CkptError`], whose variants
//! are the cases a caller can act on: retry ([`CkptError::TemporarilyUnavailable`]), give up on a
//! store ([`CkptError::Unavailable`]), fall back to an older checkpoint (the corruption variants,
//! each naming the file), or fix its own input ([`CkptError::InvalidKey`],
//! [`CkptError::InvalidArgument`]).

/// Result alias used throughout the crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;

/// Everything that can go wrong in checkpoint storage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CkptError {
    /// The object does not exist.
    #[error("object {key:?} not found")]
    NotFound { key: String },

    /// A create-only put found the object already present (another writer won, or the
    /// checkpoint id is reused).
    #[error("object {key:?} already exists")]
    AlreadyExists { key: String },

    /// The store refused the operation because a condition on the object's state did not hold.
    #[error("precondition failed for {key:?}: {reason}")]
    Precondition { key: String, reason: String },

    /// A checksum over part of a file does not match: the file is corrupt.
    #[error("{file}: {what} checksum mismatch (expected {expected:#010x}, computed {got:#010x})")]
    ChecksumMismatch {
        file: String,
        what: &'static str,
        expected: u32,
        got: u32,
    },

    /// The file is shorter (or longer) than its own header or its manifest says: torn or
    /// truncated.
    #[error("{file}: truncated or torn: expected {expected} bytes, found {found}")]
    Truncated {
        file: String,
        expected: u64,
        found: u64,
    },

    /// The file's structure is wrong (bad magic, wrong kind, impossible field values,
    /// inconsistent with its manifest).
    #[error("{file}: corrupt: {reason}")]
    Corrupt { file: String, reason: String },

    /// The file was written by a newer format version than this build reads.
    #[error("{file}: {kind} format version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        file: String,
        kind: &'static str,
        found: u16,
        supported: u16,
    },

    /// A key (object path) is malformed.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },

    /// A ranged read asked for bytes outside the object.
    #[error("range {start}..{end} is outside {key:?} ({size} bytes)")]
    InvalidRange {
        key: String,
        start: u64,
        end: u64,
        size: u64,
    },

    /// The store cannot serve requests and retrying will not help (configuration, credentials,
    /// permissions, unsupported operation).
    #[error("{backend} store unavailable: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },

    /// The store failed in a way that a later retry may not (network, overload, injected
    /// transient fault).
    #[error("{backend} store temporarily unavailable: {reason}")]
    TemporarilyUnavailable {
        backend: &'static str,
        reason: String,
    },

    /// Local I/O failed.
    #[error("I/O error on {key:?}: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },

    /// A checkpoint does not fit what the caller asked for (wrong kind, shapes that differ from
    /// the tables to restore into, a manifest inconsistent with itself).
    #[error("checkpoint {id}: {reason}")]
    InvalidCheckpoint { id: String, reason: String },

    /// There is no checkpoint at all.
    #[error("no checkpoint found in {root}")]
    NoCheckpoint { root: String },

    /// Every candidate checkpoint failed verification; each entry is `(id, why)`.
    #[error("no intact checkpoint in {root}: {}", summarize(.failures))]
    NoIntactCheckpoint {
        root: String,
        failures: Vec<(String, String)>,
    },

    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Another live job holds the store's writer lease.
    #[error("{key} is held by {holder}: wait for that job to end, or write to another store")]
    Held { key: String, holder: String },

    /// This writer lost the store to a newer one (its lease was taken over, or `CURRENT` carries
    /// a newer generation): it must stop writing.
    #[error("fenced: {what}")]
    Fenced { what: String },

    /// A garbage collection is deleting a checkpoint a reader wanted.
    #[error("checkpoint {id} is being deleted by a garbage collection (it is no longer needed by the job); read a newer state")]
    BeingCollected { id: String },

    /// A commit failed in a way that leaves open whether `CURRENT` names the checkpoint: keep
    /// its files.
    #[error("commit of {id} may or may not have landed ({reason}); its files are kept")]
    CommitUncertain { id: String, reason: String },
}

fn summarize(failures: &[(String, String)]) -> String {
    if failures.is_empty() {
        return "no candidates".into();
    }
    failures
        .iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl CkptError {
    /// The file a corruption error names, if this is one.
    pub fn file(&self) -> Option<&str> {
        match self {
            CkptError::ChecksumMismatch { file, .. }
            | CkptError::Truncated { file, .. }
            | CkptError::Corrupt { file, .. }
            | CkptError::UnsupportedVersion { file, .. } => Some(file),
            _ => None,
        }
    }

    /// True for errors that mean stored bytes are damaged or unreadable by this build (as
    /// opposed to the store being unreachable): falling back to another checkpoint helps.
    pub fn is_corruption(&self) -> bool {
        self.file().is_some()
    }

    /// True when retrying the same operation later may succeed: the store was temporarily
    /// unavailable (a network error, an overloaded or restarting S3 endpoint, an injected
    /// fault), or local I/O ran out of space or quota, was interrupted or timed out (space may
    /// come back once garbage collection or an operator frees some). The one definition the
    /// store's retries ([`crate::store::retry`]) and their callers share.
    pub fn is_retryable(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            CkptError::TemporarilyUnavailable { .. } => true,
            CkptError::Io { source, .. } => matches!(
                source.kind(),
                K::StorageFull | K::QuotaExceeded | K::Interrupted | K::TimedOut | K::WouldBlock
            ),
            _ => false,
        }
    }

    pub(crate) fn io(key: impl Into<String>, source: std::io::Error) -> Self {
        CkptError::Io {
            key: key.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn retryable_errors_are_unavailability_and_passing_io_conditions() {
        let io = |k: ErrorKind| CkptError::io("k", Error::from(k));
        for e in [
            CkptError::TemporarilyUnavailable {
                backend: "s3",
                reason: "503".into(),
            },
            io(ErrorKind::StorageFull),
            io(ErrorKind::Interrupted),
            io(ErrorKind::TimedOut),
        ] {
            assert!(e.is_retryable(), "{e}");
        }
        for e in [
            io(ErrorKind::PermissionDenied),
            io(ErrorKind::NotFound),
            CkptError::NotFound { key: "k".into() },
            CkptError::AlreadyExists { key: "k".into() },
        ] {
            assert!(!e.is_retryable(), "{e}");
        }
    }
}

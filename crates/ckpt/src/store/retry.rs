//! A [`ChunkStore`] wrapper that retries transient failures with a bounded exponential
//! backoff.
//!
//! What is transient is [`CkptError::is_retryable`]: [`CkptError::TemporarilyUnavailable`] (a
//! network error, an overloaded or restarting S3 endpoint, an injected fault) and local I/O
//! that ran out of space or quota, was interrupted or timed out (`ENOSPC`: space may come back
//! once garbage collection or an operator frees some). Everything else (not found, already
//! exists, corruption, permissions, bad arguments) fails at once.
//!
//! An operation is tried at most [`RetryPolicy::attempts`] times; before try `n + 1` it waits
//! `min(max_backoff, first_backoff * 2^(n-1))`, scaled by a jitter factor in `[0.5, 1]`
//! drawn from the policy's seed and a per-store call counter (seeded, so a test run sees the
//! same waits). After the last try the error is returned with how many tries were made, and
//! the caller (a checkpoint save) reports the failure and tries again at its next save.
//!
//! A create-only put that is retried may find its own earlier try in the store: a store
//! without atomic puts may have kept a torn prefix, or the earlier try may have succeeded
//! after its reply was lost. If the object holds exactly the data, the put succeeded; if it
//! holds a strict prefix of it (the torn leftover of this very put), it is overwritten;
//! anything else is [`CkptError::AlreadyExists`], as without retries.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ftrec_core::rng::{hash3, SplitMix};

use super::{ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

/// How often and how long to retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Tries per operation, the first included (1: no retries).
    pub attempts: u32,
    /// Wait before the second try.
    pub first_backoff: Duration,
    /// Longest wait between two tries.
    pub max_backoff: Duration,
    /// Seed of the jitter.
    pub seed: u64,
}

/// Default [`RetryPolicy::attempts`].
pub const DEFAULT_ATTEMPTS: u32 = 5;
/// Default [`RetryPolicy::first_backoff`].
pub const DEFAULT_FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Default [`RetryPolicy::max_backoff`].
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: DEFAULT_ATTEMPTS,
            first_backoff: DEFAULT_FIRST_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            seed: 0x5EED_B0FF,
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.attempts == 0 {
            return Err(CkptError::InvalidArgument(
                "store retries: attempts must be at least 1".into(),
            ));
        }
        if self.first_backoff > self.max_backoff {
            return Err(CkptError::InvalidArgument(format!(
                "store retries: the first backoff ({:?}) exceeds the longest ({:?})",
                self.first_backoff, self.max_backoff
            )));
        }
        Ok(())
    }

    /// The wait before try `n + 1` (`n >= 1`) of the `call`-th operation.
    pub fn backoff(&self, call: u64, n: u32) -> Duration {
        let exp = self
            .first_backoff
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(20))
            .min(self.max_backoff);
        let jitter = 0.5 + 0.5 * SplitMix::new(hash3(self.seed, call, n as u64)).next_f64();
        exp.mul_f64(jitter)
    }

    /// The longest an operation can spend waiting between its tries.
    pub fn worst_case_wait(&self) -> Duration {
        (1..self.attempts)
            .map(|n| {
                self.first_backoff
                    .saturating_mul(1u32 << (n - 1).min(20))
                    .min(self.max_backoff)
            })
            .sum()
    }
}

/// Wraps any store and retries its transient failures (see the module documentation).
#[derive(Debug)]
pub struct RetryingStore {
    inner: Arc<dyn ChunkStore>,
    policy: RetryPolicy,
    calls: AtomicU64,
    retries: AtomicU64,
}

impl RetryingStore {
    pub fn new(inner: Arc<dyn ChunkStore>, policy: RetryPolicy) -> Result<Self> {
        policy.validate()?;
        Ok(RetryingStore {
            inner,
            policy,
            calls: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        })
    }

    /// Tries made after a transient failure, over the store's life.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    pub fn inner(&self) -> &Arc<dyn ChunkStore> {
        &self.inner
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// `op(try)` under this store's policy (tries counted from 1), for a call that is not
    /// one of the store's own (an S3 store's bucket check at open).
    pub(crate) async fn run<T, F, Fut>(&self, what: &str, key: &str, mut op: F) -> Result<T>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut n = 1;
        loop {
            match op(n).await {
                Err(e) if e.is_retryable() && n < self.policy.attempts => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    ftrec_obs::metrics().store_retries.inc();
                    tokio::time::sleep(self.policy.backoff(call, n)).await;
                    n += 1;
                }
                Err(e) if e.is_retryable() && n > 1 => {
                    ftrec_obs::metrics().store_errors.inc();
                    return Err(CkptError::TemporarilyUnavailable {
                        backend: self.inner.backend(),
                        reason: format!("{what} {key:?}: gave up after {n} tries: {e}"),
                    });
                }
                Err(e) => {
                    // What a store says about its contents (absent, present, held, raced) is
                    // an answer, not an error of the store.
                    if failed_store(&e) {
                        ftrec_obs::metrics().store_errors.inc();
                    }
                    return Err(e);
                }
                ok => return ok,
            }
        }
    }
}

/// Whether `e` means the store failed (I/O, unreachable, damaged) rather than answered.
fn failed_store(e: &CkptError) -> bool {
    matches!(
        e,
        CkptError::Io { .. }
            | CkptError::Unavailable { .. }
            | CkptError::TemporarilyUnavailable { .. }
            | CkptError::Truncated { .. }
            | CkptError::ChecksumMismatch { .. }
            | CkptError::Corrupt { .. }
    )
}

#[async_trait]
impl ChunkStore for RetryingStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        self.run("put", key.as_str(), |n| {
            let data = data.clone();
            async move {
                match self.inner.put(key, data.clone(), mode).await {
                    // A retried create that meets an earlier try of itself.
                    Err(CkptError::AlreadyExists { .. }) if n > 1 => {
                        let found = self.inner.get(key).await?;
                        if found == data {
                            Ok(())
                        } else if found.len() < data.len() && data.starts_with(&found) {
                            self.inner.put(key, data, PutMode::Overwrite).await
                        } else {
                            Err(CkptError::AlreadyExists {
                                key: key.to_string(),
                            })
                        }
                    }
                    other => other,
                }
            }
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        self.run("get", key.as_str(), |_| self.inner.get(key)).await
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        self.run("get_range", key.as_str(), |_| {
            self.inner.get_range(key, range.clone())
        })
        .await
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        self.run("head", key.as_str(), |_| self.inner.head(key))
            .await
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        let what = prefix.map_or("", |p| p.as_str());
        self.run("list", what, |_| self.inner.list(prefix)).await
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        self.run("delete", key.as_str(), |_| self.inner.delete(key))
            .await
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        self.run("swap", key.as_str(), |n| {
            let (expected, data) = (expected.clone(), data.clone());
            async move {
                match self.inner.swap(key, expected, data.clone()).await {
                    // A retried swap that meets an earlier try of itself that landed.
                    Err(e @ (CkptError::Precondition { .. } | CkptError::AlreadyExists { .. }))
                        if n > 1 =>
                    {
                        match self.inner.get(key).await {
                            Ok(found) if found == data => Ok(()),
                            _ => Err(e),
                        }
                    }
                    other => other,
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fault::{
        FaultAction, FaultPlan, FaultRule, FaultyStore, Op, TearAt, Trigger,
    };
    use crate::store::memory::MemoryStore;

    fn key(s: &str) -> Key {
        Key::new(s).unwrap()
    }

    fn fast(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            attempts,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            seed: 3,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_bound_with_seeded_jitter() {
        let p = RetryPolicy {
            attempts: 8,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            seed: 9,
        };
        for n in 1..8u32 {
            let full = Duration::from_millis((100u64 << (n - 1)).min(1000));
            let b = p.backoff(7, n);
            assert!(b <= full && b >= full / 2, "try {n}: {b:?} vs {full:?}");
            assert_eq!(b, p.backoff(7, n), "seeded");
        }
        assert_ne!(p.backoff(1, 3), p.backoff(2, 3));
        assert_eq!(
            p.worst_case_wait(),
            Duration::from_millis(100 + 200 + 400 + 800 + 1000 * 3)
        );
        assert!(RetryPolicy { attempts: 0, ..p }.validate().is_err());
        assert!(RetryPolicy {
            first_backoff: Duration::from_secs(5),
            ..p
        }
        .validate()
        .is_err());
    }

    #[tokio::test]
    async fn a_short_outage_is_ridden_out_and_a_long_one_is_reported() {
        let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
        // The process metrics count at least this test's retries and give-ups (other tests of
        // the process add theirs).
        let metrics = ftrec_obs::metrics();
        let (retries0, errors0) = (metrics.store_retries.get(), metrics.store_errors.get());
        // Puts 1 to 3 fail: the first put succeeds on its fourth try.
        let plan = FaultPlan::new(1).rule(FaultRule::new(
            Op::Put,
            Trigger::Range(1, 3),
            FaultAction::Fail,
        ));
        let s = RetryingStore::new(Arc::new(FaultyStore::new(mem.clone(), plan)), fast(4)).unwrap();
        s.put(&key("a"), Bytes::from_static(b"abc"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(s.retries(), 3);
        assert_eq!(mem.get(&key("a")).await.unwrap(), &b"abc"[..]);
        // Disk full on every put: given up after the bound, naming the tries and the cause.
        let plan = FaultPlan::new(1).rule(FaultRule::new(
            Op::Put,
            Trigger::Always,
            FaultAction::StorageFull,
        ));
        let s = RetryingStore::new(Arc::new(FaultyStore::new(mem.clone(), plan)), fast(3)).unwrap();
        let e = s
            .put(&key("b"), Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("gave up after 3 tries") && m.contains("no space left"),
            "{m}"
        );
        assert_eq!(s.retries(), 2);
        assert!(metrics.store_retries.get() >= retries0 + 5);
        assert!(metrics.store_errors.get() > errors0);
        // Not transient: no retry.
        let s = RetryingStore::new(mem.clone(), fast(5)).unwrap();
        assert!(matches!(
            s.get(&key("missing")).await,
            Err(CkptError::NotFound { .. })
        ));
        assert!(matches!(
            s.put(&key("a"), Bytes::from_static(b"zzz"), PutMode::Create)
                .await,
            Err(CkptError::AlreadyExists { .. })
        ));
        assert_eq!(s.retries(), 0);
    }

    #[tokio::test]
    async fn a_retried_create_completes_its_own_torn_try_and_nothing_else() {
        let mem: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
        let plan = FaultPlan::new(2).tear_nth_put(1, TearAt::Fraction(0.5));
        let s = RetryingStore::new(Arc::new(FaultyStore::new(mem.clone(), plan)), fast(3)).unwrap();
        let data = Bytes::from_static(b"0123456789");
        s.put(&key("t"), data.clone(), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(mem.get(&key("t")).await.unwrap(), data);
        // A first try that failed after the object was stored: the retry sees it and succeeds.
        mem.put(&key("u"), data.clone(), PutMode::Create)
            .await
            .unwrap();
        let plan = FaultPlan::new(2).fail_nth_put(1);
        let s = RetryingStore::new(Arc::new(FaultyStore::new(mem.clone(), plan)), fast(3)).unwrap();
        s.put(&key("u"), data.clone(), PutMode::Create)
            .await
            .unwrap();
        // Someone else's object is never replaced.
        mem.put(&key("v"), Bytes::from_static(b"other"), PutMode::Create)
            .await
            .unwrap();
        let plan = FaultPlan::new(2).fail_nth_put(1);
        let s = RetryingStore::new(Arc::new(FaultyStore::new(mem.clone(), plan)), fast(3)).unwrap();
        assert!(matches!(
            s.put(&key("v"), data.clone(), PutMode::Create).await,
            Err(CkptError::AlreadyExists { .. })
        ));
        assert_eq!(mem.get(&key("v")).await.unwrap(), &b"other"[..]);
    }
}

//! One conformance suite for every [`ChunkStore`] backend (test support).
//!
//! Each case is an async function that takes a store, a base key under which it writes (so
//! cases can share a store or a bucket), and the backend's [`Capabilities`]; it panics with a
//! message naming the broken property. [`chunk_store_conformance!`](crate::chunk_store_conformance)
//! expands to one `#[tokio::test]` per case, so a backend's test file is a few lines:
//!
//! ```text
//! ftrec_ckpt::chunk_store_conformance!(memory, {
//!     let store: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
//!     (store, ())
//! }, Capabilities::FULL);
//! ```
//!
//! The using crate needs `tokio` (macros, multi-threaded runtime) as a dev-dependency.

use std::ops::Range;

use bytes::Bytes;
use ftrec_core::rng::SplitMix;

use crate::error::CkptError;
use crate::key::Key;
use crate::store::{ChunkStore, PutMode};

/// What a backend guarantees beyond the common contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Of several concurrent create-only puts of one key, exactly one succeeds (without it,
    /// at least one does and losers still see `AlreadyExists`).
    pub atomic_create: bool,
    /// Of several concurrent swaps from the same content, exactly one succeeds (without it, at
    /// least one does, and the object is one winner's bytes).
    pub atomic_swap: bool,
}

impl Capabilities {
    /// Everything (memory, local, AWS S3).
    pub const FULL: Capabilities = Capabilities {
        atomic_create: true,
        atomic_swap: true,
    };
}

/// Names of every case, in the order [`run_all`] runs them.
pub const CASES: [&str; 11] = [
    "put_get_round_trip",
    "create_only_refuses_existing",
    "overwrite_replaces",
    "missing_is_not_found",
    "ranged_get",
    "list_is_sorted_and_segment_wise",
    "delete_is_idempotent",
    "many_concurrent_puts",
    "overwrite_is_atomic_for_readers",
    "concurrent_creates_have_one_winner",
    "swaps_compare_and_have_one_winner",
];

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Bytes {
    let mut g = SplitMix::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&g.next_u64().to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

fn k(base: &Key, rel: &str) -> Key {
    base.join(rel).expect("conformance keys are valid")
}

fn must<T>(r: crate::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: unexpected error: {e}"),
    }
}

pub async fn put_get_round_trip(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let cases = [
        ("small", pattern(1, 17)),
        ("empty", Bytes::new()),
        ("big.bin", pattern(2, 3 << 20)),
        ("odd=name+x_y-z.v", pattern(3, 100)),
        ("deep/er/and/deeper", pattern(4, 5)),
    ];
    for (name, data) in &cases {
        let key = k(base, name);
        must(store.put(&key, data.clone(), PutMode::Create).await, "put");
        let got = must(store.get(&key).await, "get");
        assert!(got == *data, "{key}: read back differs from what was put");
        let meta = must(store.head(&key).await, "head");
        assert_eq!(meta.size, data.len() as u64, "{key}: head size");
        assert_eq!(meta.key, key);
    }
}

pub async fn create_only_refuses_existing(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let key = k(base, "once");
    let (v1, v2) = (pattern(10, 64), pattern(11, 32));
    must(
        store.put(&key, v1.clone(), PutMode::Create).await,
        "first create",
    );
    let second = store.put(&key, v2, PutMode::Create).await;
    assert!(
        matches!(second, Err(CkptError::AlreadyExists { .. })),
        "second create should be AlreadyExists, got {second:?}"
    );
    assert!(
        must(store.get(&key).await, "get") == v1,
        "a refused create must not change the object"
    );
}

pub async fn overwrite_replaces(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let key = k(base, "ow");
    let (v1, v2) = (pattern(20, 100), pattern(21, 7));
    must(
        store.put(&key, v1.clone(), PutMode::Overwrite).await,
        "overwrite a missing key",
    );
    assert!(must(store.get(&key).await, "get") == v1);
    must(
        store.put(&key, v2.clone(), PutMode::Overwrite).await,
        "overwrite",
    );
    assert!(
        must(store.get(&key).await, "get") == v2,
        "overwrite did not replace"
    );
    assert_eq!(must(store.head(&key).await, "head").size, 7);
    let create = store.put(&key, v1, PutMode::Create).await;
    assert!(
        matches!(create, Err(CkptError::AlreadyExists { .. })),
        "create over an existing object should be AlreadyExists, got {create:?}"
    );
}

pub async fn missing_is_not_found(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let key = k(base, "nothing/here");
    let e = store.get(&key).await.unwrap_err();
    assert!(matches!(e, CkptError::NotFound { .. }), "get: {e}");
    let e = store.get_range(&key, 0..1).await.unwrap_err();
    assert!(matches!(e, CkptError::NotFound { .. }), "get_range: {e}");
    let e = store.head(&key).await.unwrap_err();
    assert!(matches!(e, CkptError::NotFound { .. }), "head: {e}");
}

pub async fn ranged_get(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let key = k(base, "ranged");
    let data = pattern(30, 1000);
    must(store.put(&key, data.clone(), PutMode::Create).await, "put");
    let ok: [Range<u64>; 6] = [0..0, 0..1000, 10..20, 999..1000, 1000..1000, 0..1];
    for r in ok {
        let got = must(store.get_range(&key, r.clone()).await, "get_range");
        assert!(
            got[..] == data[r.start as usize..r.end as usize],
            "{key}: range {r:?} returned the wrong bytes"
        );
    }
    #[allow(clippy::reversed_empty_ranges)]
    let bad: [Range<u64>; 3] = [5..1001, 1001..1002, 20..10];
    for r in bad {
        let e = store.get_range(&key, r.clone()).await.unwrap_err();
        assert!(
            matches!(e, CkptError::InvalidRange { size: 1000, .. }),
            "range {r:?}: expected InvalidRange, got {e}"
        );
    }
}

pub async fn list_is_sorted_and_segment_wise(
    store: &dyn ChunkStore,
    base: &Key,
    _caps: Capabilities,
) {
    let names = ["l/b", "l/a/2", "l/a/1", "l/ab", "l/a/sub/3"];
    for (i, n) in names.iter().enumerate() {
        must(
            store
                .put(&k(base, n), pattern(40 + i as u64, i + 1), PutMode::Create)
                .await,
            "put",
        );
    }
    let rel = |metas: Vec<crate::store::ObjectMeta>| -> Vec<(String, u64)> {
        metas
            .into_iter()
            .map(|m| {
                (
                    m.key
                        .strip_prefix(base)
                        .expect("listed key under base")
                        .to_string(),
                    m.size,
                )
            })
            .collect()
    };
    let under_a = rel(must(store.list(Some(&k(base, "l/a"))).await, "list l/a"));
    assert_eq!(
        under_a,
        vec![
            ("l/a/1".to_string(), 3),
            ("l/a/2".to_string(), 2),
            ("l/a/sub/3".to_string(), 5)
        ],
        "list(l/a) must be sorted, include nested keys and exclude l/ab"
    );
    let all = rel(must(store.list(Some(&k(base, "l"))).await, "list l"));
    let mut expected: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(
        all.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        expected
    );
    assert!(must(store.list(Some(&k(base, "l/zzz"))).await, "list missing").is_empty());
    assert!(
        must(store.list(Some(&k(base, "l/b"))).await, "list of an object").is_empty(),
        "an object is not a prefix of itself"
    );
}

pub async fn delete_is_idempotent(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let key = k(base, "d/x");
    must(
        store.put(&key, pattern(50, 10), PutMode::Create).await,
        "put",
    );
    must(store.delete(&key).await, "delete");
    let e = store.get(&key).await.unwrap_err();
    assert!(
        matches!(e, CkptError::NotFound { .. }),
        "get after delete: {e}"
    );
    must(store.delete(&key).await, "delete of a missing key");
    assert!(must(store.list(Some(&k(base, "d"))).await, "list").is_empty());
    // A deleted key can be created again.
    must(
        store.put(&key, pattern(51, 3), PutMode::Create).await,
        "re-create",
    );
}

pub async fn many_concurrent_puts(store: &dyn ChunkStore, base: &Key, _caps: Capabilities) {
    let n = 40u64;
    let puts = (0..n).map(|i| async move {
        let key = k(base, &format!("many/{i:03}"));
        store
            .put(&key, pattern(60 + i, i as usize * 3), PutMode::Create)
            .await
    });
    for r in futures_util::future::join_all(puts).await {
        must(r, "concurrent put");
    }
    let listed = must(store.list(Some(&k(base, "many"))).await, "list");
    assert_eq!(listed.len(), n as usize);
    for (i, m) in listed.iter().enumerate() {
        assert_eq!(m.key, k(base, &format!("many/{i:03}")));
        assert_eq!(m.size, i as u64 * 3);
    }
}

pub async fn overwrite_is_atomic_for_readers(
    store: &dyn ChunkStore,
    base: &Key,
    _caps: Capabilities,
) {
    // Version v is v*997 + 1 bytes all equal to v: a reader seeing a mixed or short object
    // would see a length and content that disagree.
    let key = k(base, "atomic");
    let version = |v: u8| Bytes::from(vec![v; v as usize * 997 + 1]);
    must(store.put(&key, version(0), PutMode::Create).await, "put");
    let writer = async {
        for v in 1..=24u8 {
            must(
                store.put(&key, version(v), PutMode::Overwrite).await,
                "overwrite",
            );
        }
    };
    let reader = async {
        for _ in 0..48 {
            let got = must(store.get(&key).await, "get during overwrites");
            let v = got[0];
            assert_eq!(
                got.len(),
                v as usize * 997 + 1,
                "reader saw a torn object (first byte {v})"
            );
            assert!(got.iter().all(|&b| b == v), "reader saw mixed versions");
            tokio::task::yield_now().await;
        }
    };
    futures_util::join!(writer, reader);
}

pub async fn concurrent_creates_have_one_winner(
    store: &dyn ChunkStore,
    base: &Key,
    caps: Capabilities,
) {
    // Without atomic creates, still: at least one racer wins, every loser is told
    // AlreadyExists, and the object is exactly one winner's bytes (never a mix).
    for round in 0..5u64 {
        let key = k(base, &format!("race/{round}"));
        let racers = (0..8u64).map(|i| {
            let key = key.clone();
            async move {
                (
                    i,
                    store
                        .put(&key, pattern(100 * round + i, 4096), PutMode::Create)
                        .await,
                )
            }
        });
        let results = futures_util::future::join_all(racers).await;
        let stored = must(store.get(&key).await, "get");
        check_race(
            round,
            &results,
            caps.atomic_create,
            &stored,
            |e| matches!(e, CkptError::AlreadyExists { .. }),
            |w| pattern(100 * round + w, 4096),
        );
    }
}

/// `swap` replaces only from the expected content (`None`: only a missing key), a stale
/// expectation fails without writing, and of racers swapping from one content exactly one wins.
pub async fn swaps_compare_and_have_one_winner(
    store: &dyn ChunkStore,
    base: &Key,
    caps: Capabilities,
) {
    let key = k(base, "cas");
    let (a, b, c) = (pattern(1, 100), pattern(2, 90), pattern(3, 80));
    must(store.swap(&key, None, a.clone()).await, "swap from nothing");
    match store.swap(&key, None, b.clone()).await {
        Err(CkptError::AlreadyExists { .. }) => {}
        other => panic!("a swap from nothing over an object must fail AlreadyExists: {other:?}"),
    }
    match store.swap(&key, Some(b.clone()), c.clone()).await {
        Err(CkptError::Precondition { .. }) => {}
        other => panic!("a swap from stale content must fail Precondition: {other:?}"),
    }
    assert_eq!(must(store.get(&key).await, "get"), a, "a failed swap wrote");
    must(
        store.swap(&key, Some(a.clone()), b.clone()).await,
        "swap a->b",
    );
    assert_eq!(must(store.get(&key).await, "get"), b);
    match store
        .swap(&k(base, "missing"), Some(a.clone()), c.clone())
        .await
    {
        Err(CkptError::Precondition { .. }) => {}
        other => panic!("a swap of a missing key from content must fail Precondition: {other:?}"),
    }
    for round in 0..4u64 {
        let from = must(store.get(&key).await, "get");
        let racers = (0..6u64).map(|i| {
            let (key, from) = (key.clone(), from.clone());
            async move {
                let data = pattern(1000 * (round + 1) + i, 64);
                (i, store.swap(&key, Some(from), data).await)
            }
        });
        let results = futures_util::future::join_all(racers).await;
        let stored = must(store.get(&key).await, "get");
        check_race(
            round,
            &results,
            caps.atomic_swap,
            &stored,
            |e| matches!(e, CkptError::Precondition { .. }),
            |w| pattern(1000 * (round + 1) + w, 64),
        );
    }
}

/// A race of writers `(i, result)` of one key: exactly one won (`atomic`, else at least one),
/// every loser failed as `lost` says a loser fails, and `stored` is one winner's bytes
/// (`bytes_of(i)`).
fn check_race(
    round: u64,
    results: &[(u64, crate::Result<()>)],
    atomic: bool,
    stored: &Bytes,
    lost: impl Fn(&CkptError) -> bool,
    bytes_of: impl Fn(u64) -> Bytes,
) {
    let winners: Vec<u64> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(i, _)| *i)
        .collect();
    if atomic {
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
    } else {
        assert!(!winners.is_empty(), "round {round}: no racer won");
    }
    for (i, r) in results {
        if let Err(e) = r {
            assert!(lost(e), "racer {i}: {e}");
        }
    }
    assert!(
        winners.iter().any(|&w| *stored == bytes_of(w)),
        "round {round}: the stored object is no winner's bytes"
    );
}

/// Run case `name`.
pub async fn run_case(name: &str, store: &dyn ChunkStore, base: &Key, caps: Capabilities) {
    let base = &k(base, name);
    match name {
        "put_get_round_trip" => put_get_round_trip(store, base, caps).await,
        "create_only_refuses_existing" => create_only_refuses_existing(store, base, caps).await,
        "overwrite_replaces" => overwrite_replaces(store, base, caps).await,
        "missing_is_not_found" => missing_is_not_found(store, base, caps).await,
        "ranged_get" => ranged_get(store, base, caps).await,
        "list_is_sorted_and_segment_wise" => {
            list_is_sorted_and_segment_wise(store, base, caps).await
        }
        "delete_is_idempotent" => delete_is_idempotent(store, base, caps).await,
        "many_concurrent_puts" => many_concurrent_puts(store, base, caps).await,
        "overwrite_is_atomic_for_readers" => {
            overwrite_is_atomic_for_readers(store, base, caps).await
        }
        "concurrent_creates_have_one_winner" => {
            concurrent_creates_have_one_winner(store, base, caps).await
        }
        "swaps_compare_and_have_one_winner" => {
            swaps_compare_and_have_one_winner(store, base, caps).await
        }
        other => panic!("no conformance case named {other:?}"),
    }
}

/// Run every case under `base`.
pub async fn run_all(store: &dyn ChunkStore, base: &Key, caps: Capabilities) {
    for name in CASES {
        run_case(name, store, base, caps).await;
    }
}

/// One `#[tokio::test]` per conformance case, in a module named `$module`. `$setup` is an
/// expression (it may `.await`) giving `(Arc<dyn ChunkStore>, guard)`; the guard lives until
/// the test ends (a temporary directory, a server handle).
#[macro_export]
macro_rules! chunk_store_conformance {
    ($module:ident, $setup:expr, $caps:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_case!(put_get_round_trip, $setup, $caps);
            $crate::__conformance_case!(create_only_refuses_existing, $setup, $caps);
            $crate::__conformance_case!(overwrite_replaces, $setup, $caps);
            $crate::__conformance_case!(missing_is_not_found, $setup, $caps);
            $crate::__conformance_case!(ranged_get, $setup, $caps);
            $crate::__conformance_case!(list_is_sorted_and_segment_wise, $setup, $caps);
            $crate::__conformance_case!(delete_is_idempotent, $setup, $caps);
            $crate::__conformance_case!(many_concurrent_puts, $setup, $caps);
            $crate::__conformance_case!(overwrite_is_atomic_for_readers, $setup, $caps);
            $crate::__conformance_case!(concurrent_creates_have_one_winner, $setup, $caps);
            $crate::__conformance_case!(swaps_compare_and_have_one_winner, $setup, $caps);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_case {
    ($case:ident, $setup:expr, $caps:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let (store, _guard) = $setup;
            let base = $crate::Key::new(
                concat!("conformance/", module_path!(), "/", stringify!($case)).replace("::", "."),
            )
            .expect("valid base key");
            $crate::conformance::$case(&*store, &base, $caps).await;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn every_case_runs_on_memory() {
        let store = MemoryStore::new();
        run_all(&store, &Key::new("all").unwrap(), Capabilities::FULL).await;
    }

    /// The suite must catch a store that breaks the contract: here, one whose create-only put
    /// overwrites.
    #[derive(Debug, Default)]
    struct OverwritingStore(MemoryStore);

    #[async_trait::async_trait]
    impl ChunkStore for OverwritingStore {
        fn backend(&self) -> &'static str {
            "broken"
        }
        async fn put(&self, key: &Key, data: Bytes, _mode: PutMode) -> crate::Result<()> {
            self.0.put(key, data, PutMode::Overwrite).await
        }
        async fn get(&self, key: &Key) -> crate::Result<Bytes> {
            self.0.get(key).await
        }
        async fn get_range(&self, key: &Key, r: Range<u64>) -> crate::Result<Bytes> {
            self.0.get_range(key, r).await
        }
        async fn head(&self, key: &Key) -> crate::Result<crate::store::ObjectMeta> {
            self.0.head(key).await
        }
        async fn list(&self, p: Option<&Key>) -> crate::Result<Vec<crate::store::ObjectMeta>> {
            self.0.list(p).await
        }
        async fn delete(&self, key: &Key) -> crate::Result<()> {
            self.0.delete(key).await
        }
        async fn swap(&self, key: &Key, e: Option<Bytes>, d: Bytes) -> crate::Result<()> {
            self.0.swap(key, e, d).await
        }
    }

    #[tokio::test]
    #[should_panic(expected = "AlreadyExists")]
    async fn the_suite_catches_a_create_that_overwrites() {
        let store = OverwritingStore::default();
        create_only_refuses_existing(&store, &Key::new("b").unwrap(), Capabilities::FULL).await;
    }
}

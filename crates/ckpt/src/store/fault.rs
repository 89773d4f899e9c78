//! A [`ChunkStore`] wrapper that injects faults, for tests.
//!
//! Every choice is a pure function of the plan's seed and a per-rule call counter, so a test
//! that issues the same operations in the same order sees the same faults. Rules are checked
//! in order; every matching [`FaultAction::Delay`] applies, and the first matching rule with
//! another action decides the call's fate. Injected failures surface as
//! [`CkptError::TemporarilyUnavailable`] (or [`CkptError::Unavailable`] for
//! [`FaultAction::FailPermanently`]) with a reason starting `injected`.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use ftrec_core::rng::{hash3, SplitMix};

use super::{ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

/// Which operation a rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    /// Whole-object reads.
    Get,
    GetRange,
    Head,
    List,
    Delete,
    /// Conditional replaces ([`ChunkStore::swap`]).
    Swap,
}

/// When a rule fires, counting only the calls that match its op and key filter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On the n-th matching call only (1-based).
    Nth(u64),
    /// On every n-th matching call (n, 2n, ...).
    Every(u64),
    /// On each matching call with this probability, drawn from the seed.
    Probability(f64),
    /// On every matching call.
    Always,
    /// On matching calls `from` to `to`, both included (1-based): an outage of a window.
    Range(u64, u64),
}

/// How much of a torn write reaches the store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TearAt {
    /// The first `n` bytes (clamped to the object's size minus one).
    Bytes(u64),
    /// A fraction of the object in `[0, 1)`.
    Fraction(f64),
    /// A seeded random length in `[0, size)`.
    Random,
}

/// What happens to a call that a rule fires on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaultAction {
    /// Do nothing and return a transient error.
    Fail,
    /// Do nothing and return a permanent error.
    FailPermanently,
    /// Put only: store a prefix of the data (with the call's mode), then return a transient
    /// error. Models a store without atomic writes dying mid-write.
    Tear(TearAt),
    /// Put: store the data with one seeded byte flipped and report success. Get / ranged get:
    /// return the stored data with one byte flipped. Other ops: no effect.
    FlipByte,
    /// Wait this long, then carry on.
    Delay(Duration),
    /// Do nothing and fail as a full disk does: [`CkptError::Io`] of kind
    /// [`std::io::ErrorKind::StorageFull`] (`ENOSPC`).
    StorageFull,
    /// Put and swap: carry the write out, then return a transient error, as a store whose
    /// acknowledgement is lost does (a directory fsync failing after the rename).
    LoseAck,
}

/// One rule of a [`FaultPlan`].
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub op: Op,
    pub trigger: Trigger,
    pub action: FaultAction,
    /// Only calls whose key contains this string match (`None`: every key).
    pub key_contains: Option<String>,
}

impl FaultRule {
    pub fn new(op: Op, trigger: Trigger, action: FaultAction) -> Self {
        FaultRule {
            op,
            trigger,
            action,
            key_contains: None,
        }
    }

    pub fn on_keys_containing(mut self, s: impl Into<String>) -> Self {
        self.key_contains = Some(s.into());
        self
    }
}

/// A seeded list of rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub seed: u64,
    pub rules: Vec<FaultRule>,
}

impl FaultPlan {
    pub fn new(seed: u64) -> Self {
        FaultPlan {
            seed,
            rules: Vec::new(),
        }
    }

    pub fn rule(mut self, rule: FaultRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Fail the n-th put (1-based).
    pub fn fail_nth_put(self, n: u64) -> Self {
        self.rule(FaultRule::new(Op::Put, Trigger::Nth(n), FaultAction::Fail))
    }

    /// Tear the n-th put.
    pub fn tear_nth_put(self, n: u64, at: TearAt) -> Self {
        self.rule(FaultRule::new(
            Op::Put,
            Trigger::Nth(n),
            FaultAction::Tear(at),
        ))
    }

    /// Flip a byte in the n-th put.
    pub fn flip_nth_put(self, n: u64) -> Self {
        self.rule(FaultRule::new(
            Op::Put,
            Trigger::Nth(n),
            FaultAction::FlipByte,
        ))
    }

    /// Flip a byte in the n-th whole-object get.
    pub fn flip_nth_get(self, n: u64) -> Self {
        self.rule(FaultRule::new(
            Op::Get,
            Trigger::Nth(n),
            FaultAction::FlipByte,
        ))
    }

    /// Delay every call of `op`.
    pub fn delay(self, op: Op, d: Duration) -> Self {
        self.rule(FaultRule::new(op, Trigger::Always, FaultAction::Delay(d)))
    }
}

/// Environment variable naming faults that [`crate::location::open`] injects into every store
/// it opens (see [`FaultPlan::parse`]); for tests of whole runs, whose processes inherit it.
pub const FAULTS_ENV: &str = "FTREC_STORE_FAULTS";

impl FaultPlan {
    /// A plan from text: `;`-separated rules `OP:ACTION:CALLS[:KEY]`, optionally after a
    /// `seed=N;`. `OP` is `put`, `get`, `get_range`, `head`, `list`, `delete`, `swap` or `all`
    /// (one rule per op); `ACTION` is `fail`, `enospc`, `lose-ack` or `delay=MS`; `CALLS` is `N` (the n-th
    /// matching call), `A-B` (calls A to B), `A-` (from A on) or `*` (every call); `KEY` keeps
    /// the rule to keys containing it. Example: `put:enospc:3-40;all:delay=20:*`.
    pub fn parse(spec: &str) -> Result<FaultPlan> {
        let bad = |what: &str, why: String| {
            CkptError::InvalidArgument(format!("store faults {spec:?}: {what}: {why}"))
        };
        let num = |what: &str, s: &str| {
            s.parse::<u64>()
                .map_err(|e| bad(what, format!("{s:?} is not a number: {e}")))
        };
        let mut plan = FaultPlan::new(0);
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some(seed) = part.strip_prefix("seed=") {
                plan.seed = num(part, seed)?;
                continue;
            }
            let fields: Vec<&str> = part.split(':').collect();
            if !(3..=4).contains(&fields.len()) {
                return Err(bad(part, "want OP:ACTION:CALLS[:KEY]".into()));
            }
            let ops: Vec<Op> = match fields[0] {
                "put" => vec![Op::Put],
                "get" => vec![Op::Get],
                "get_range" => vec![Op::GetRange],
                "head" => vec![Op::Head],
                "list" => vec![Op::List],
                "delete" => vec![Op::Delete],
                "swap" => vec![Op::Swap],
                "all" => vec![
                    Op::Put,
                    Op::Get,
                    Op::GetRange,
                    Op::Head,
                    Op::List,
                    Op::Delete,
                    Op::Swap,
                ],
                other => return Err(bad(part, format!("unknown op {other:?}"))),
            };
            let action = match fields[1] {
                "fail" => FaultAction::Fail,
                "enospc" => FaultAction::StorageFull,
                "lose-ack" => FaultAction::LoseAck,
                other => match other.strip_prefix("delay=") {
                    Some(ms) => FaultAction::Delay(Duration::from_millis(num(part, ms)?)),
                    None => return Err(bad(part, format!("unknown action {other:?}"))),
                },
            };
            let trigger = match fields[2] {
                "*" => Trigger::Always,
                c => match c.split_once('-') {
                    Some((a, "")) => Trigger::Range(num(part, a)?, u64::MAX),
                    Some((a, b)) => Trigger::Range(num(part, a)?, num(part, b)?),
                    None => Trigger::Nth(num(part, c)?),
                },
            };
            for op in ops {
                let mut rule = FaultRule::new(op, trigger, action);
                if let Some(k) = fields.get(3) {
                    rule = rule.on_keys_containing(*k);
                }
                plan.rules.push(rule);
            }
        }
        Ok(plan)
    }
}

/// A fault that fired, for tests to check what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct InjectedFault {
    pub op: Op,
    pub key: String,
    /// Index of the rule in the plan.
    pub rule: usize,
    pub action: FaultAction,
    /// For flips: the byte offset; for tears: the bytes written.
    pub offset: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    /// Matching calls seen per rule.
    counts: Vec<u64>,
    log: Vec<InjectedFault>,
}

/// Wraps any store and injects the faults of a [`FaultPlan`].
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ChunkStore>,
    plan: FaultPlan,
    state: Mutex<State>,
}

/// What `decide` tells an operation to do.
struct Decision {
    delay: Duration,
    /// `(rule index, action, value drawn for this call)`.
    fault: Option<(usize, FaultAction, u64)>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ChunkStore>, plan: FaultPlan) -> Self {
        let n = plan.rules.len();
        FaultyStore {
            inner,
            plan,
            state: Mutex::new(State {
                counts: vec![0; n],
                log: Vec::new(),
            }),
        }
    }

    /// The faults injected so far, in order.
    pub fn injected(&self) -> Vec<InjectedFault> {
        self.lock().log.clone()
    }

    pub fn inner(&self) -> &Arc<dyn ChunkStore> {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn decide(&self, op: Op, key: &str) -> Decision {
        let mut st = self.lock();
        let mut d = Decision {
            delay: Duration::ZERO,
            fault: None,
        };
        for (i, rule) in self.plan.rules.iter().enumerate() {
            if rule.op != op {
                continue;
            }
            if let Some(s) = &rule.key_contains {
                if !key.contains(s.as_str()) {
                    continue;
                }
            }
            st.counts[i] += 1;
            let n = st.counts[i];
            let draw = hash3(self.plan.seed, i as u64, n);
            let fires = match rule.trigger {
                Trigger::Nth(k) => n == k,
                Trigger::Every(k) => k > 0 && n.is_multiple_of(k),
                Trigger::Probability(p) => SplitMix::new(draw).next_f64() < p,
                Trigger::Always => true,
                Trigger::Range(a, b) => (a..=b).contains(&n),
            };
            if !fires {
                continue;
            }
            match rule.action {
                FaultAction::Delay(t) => d.delay += t,
                other if d.fault.is_none() => d.fault = Some((i, other, draw)),
                _ => {}
            }
        }
        d
    }

    fn record(&self, op: Op, key: &Key, rule: usize, action: FaultAction, offset: Option<u64>) {
        self.lock().log.push(InjectedFault {
            op,
            key: key.to_string(),
            rule,
            action,
            offset,
        });
    }

    fn injected_error(&self, op: Op, key: &Key, action: FaultAction) -> CkptError {
        let reason = format!("injected {action:?} on {op:?} of {key}");
        match action {
            FaultAction::StorageFull => CkptError::io(
                key.to_string(),
                std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("no space left on device ({reason})"),
                ),
            ),
            FaultAction::FailPermanently => CkptError::Unavailable {
                backend: "faulty",
                reason,
            },
            _ => CkptError::TemporarilyUnavailable {
                backend: "faulty",
                reason,
            },
        }
    }

    async fn pre(&self, op: Op, key: &Key) -> Result<Option<(usize, FaultAction, u64)>> {
        let d = self.decide(op, key.as_str());
        if !d.delay.is_zero() {
            tokio::time::sleep(d.delay).await;
        }
        match d.fault {
            Some((
                i,
                a @ (FaultAction::Fail | FaultAction::FailPermanently | FaultAction::StorageFull),
                _,
            )) => {
                self.record(op, key, i, a, None);
                Err(self.injected_error(op, key, a))
            }
            other => Ok(other),
        }
    }

    fn flip(&self, op: Op, key: &Key, rule: usize, data: Bytes, draw: u64) -> Bytes {
        if data.is_empty() {
            return data;
        }
        let pos = (SplitMix::new(draw ^ 0xF11F).next_u64() % data.len() as u64) as usize;
        let bit = 1u8 << (draw % 8);
        let mut m = BytesMut::from(&data[..]);
        m[pos] ^= bit;
        self.record(op, key, rule, FaultAction::FlipByte, Some(pos as u64));
        m.freeze()
    }
}

#[async_trait]
impl ChunkStore for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        match self.pre(Op::Put, key).await? {
            Some((i, FaultAction::Tear(at), draw)) => {
                let size = data.len() as u64;
                let keep = match at {
                    TearAt::Bytes(n) => n,
                    TearAt::Fraction(f) => (size as f64 * f.clamp(0.0, 1.0)) as u64,
                    TearAt::Random => SplitMix::new(draw).next_u64() % size.max(1),
                }
                .min(size.saturating_sub(1));
                self.record(Op::Put, key, i, FaultAction::Tear(at), Some(keep));
                self.inner
                    .put(key, data.slice(..keep as usize), mode)
                    .await?;
                Err(self.injected_error(Op::Put, key, FaultAction::Tear(at)))
            }
            Some((i, FaultAction::FlipByte, draw)) => {
                let data = self.flip(Op::Put, key, i, data, draw);
                self.inner.put(key, data, mode).await
            }
            Some((i, FaultAction::LoseAck, _)) => {
                self.inner.put(key, data, mode).await?;
                self.record(Op::Put, key, i, FaultAction::LoseAck, None);
                Err(self.injected_error(Op::Put, key, FaultAction::LoseAck))
            }
            _ => self.inner.put(key, data, mode).await,
        }
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        match self.pre(Op::Swap, key).await? {
            Some((i, FaultAction::LoseAck, _)) => {
                self.inner.swap(key, expected, data).await?;
                self.record(Op::Swap, key, i, FaultAction::LoseAck, None);
                Err(self.injected_error(Op::Swap, key, FaultAction::LoseAck))
            }
            _ => self.inner.swap(key, expected, data).await,
        }
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        let fault = self.pre(Op::Get, key).await?;
        let data = self.inner.get(key).await?;
        Ok(match fault {
            Some((i, FaultAction::FlipByte, draw)) => self.flip(Op::Get, key, i, data, draw),
            _ => data,
        })
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        let fault = self.pre(Op::GetRange, key).await?;
        let data = self.inner.get_range(key, range).await?;
        Ok(match fault {
            Some((i, FaultAction::FlipByte, draw)) => self.flip(Op::GetRange, key, i, data, draw),
            _ => data,
        })
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        self.pre(Op::Head, key).await?;
        self.inner.head(key).await
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        let k = match prefix {
            Some(p) => p.clone(),
            None => Key::new("all").expect("literal key"),
        };
        self.pre(Op::List, &k).await?;
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        self.pre(Op::Delete, key).await?;
        self.inner.delete(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn key(s: &str) -> Key {
        Key::new(s).unwrap()
    }

    fn payload(n: usize) -> Bytes {
        Bytes::from((0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn nth_put_fails_and_writes_nothing() {
        let mem = Arc::new(MemoryStore::new());
        let s = FaultyStore::new(mem.clone(), FaultPlan::new(1).fail_nth_put(2));
        s.put(&key("a"), payload(10), PutMode::Create)
            .await
            .unwrap();
        let err = s
            .put(&key("b"), payload(10), PutMode::Create)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(matches!(
            mem.get(&key("b")).await,
            Err(CkptError::NotFound { .. })
        ));
        s.put(&key("c"), payload(10), PutMode::Create)
            .await
            .unwrap();
        let log = s.injected();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].key, "b");
    }

    #[tokio::test]
    async fn torn_put_leaves_a_strict_prefix() {
        let mem = Arc::new(MemoryStore::new());
        let s = FaultyStore::new(
            mem.clone(),
            FaultPlan::new(3).tear_nth_put(1, TearAt::Fraction(0.5)),
        );
        let data = payload(100);
        assert!(s
            .put(&key("a"), data.clone(), PutMode::Create)
            .await
            .is_err());
        let stored = mem.get(&key("a")).await.unwrap();
        assert_eq!(stored.len(), 50);
        assert_eq!(&stored[..], &data[..50]);
        // Random tears are seeded: the same seed tears at the same length.
        let mut lens = Vec::new();
        for _ in 0..2 {
            let mem = Arc::new(MemoryStore::new());
            let s = FaultyStore::new(
                mem.clone(),
                FaultPlan::new(99).tear_nth_put(1, TearAt::Random),
            );
            let _ = s.put(&key("a"), data.clone(), PutMode::Create).await;
            lens.push(mem.get(&key("a")).await.unwrap().len());
        }
        assert_eq!(lens[0], lens[1]);
        assert!(lens[0] < 100);
    }

    #[tokio::test]
    async fn flips_change_exactly_one_byte_deterministically() {
        let data = payload(64);
        let mut positions = Vec::new();
        for _ in 0..2 {
            let mem = Arc::new(MemoryStore::new());
            let s = FaultyStore::new(mem.clone(), FaultPlan::new(5).flip_nth_put(1));
            s.put(&key("a"), data.clone(), PutMode::Create)
                .await
                .unwrap();
            let stored = mem.get(&key("a")).await.unwrap();
            let diff: Vec<usize> = (0..64).filter(|&i| stored[i] != data[i]).collect();
            assert_eq!(diff.len(), 1);
            assert_eq!(s.injected()[0].offset, Some(diff[0] as u64));
            positions.push(diff[0]);
        }
        assert_eq!(positions[0], positions[1]);

        let mem = Arc::new(MemoryStore::new());
        mem.put(&key("a"), data.clone(), PutMode::Create)
            .await
            .unwrap();
        let s = FaultyStore::new(mem.clone(), FaultPlan::new(5).flip_nth_get(1));
        let read = s.get(&key("a")).await.unwrap();
        assert_eq!((0..64).filter(|&i| read[i] != data[i]).count(), 1);
        // Only the read was damaged, and only the first one.
        assert_eq!(mem.get(&key("a")).await.unwrap(), data);
        assert_eq!(s.get(&key("a")).await.unwrap(), data);
    }

    #[tokio::test]
    async fn probability_and_filters_are_seeded() {
        let run = |seed: u64| async move {
            let mem = Arc::new(MemoryStore::new());
            let plan = FaultPlan::new(seed).rule(
                FaultRule::new(Op::Put, Trigger::Probability(0.3), FaultAction::Fail)
                    .on_keys_containing("data"),
            );
            let s = FaultyStore::new(mem, plan);
            let mut failed = Vec::new();
            for i in 0..40 {
                let k = key(&format!("data/{i}"));
                if s.put(&k, payload(4), PutMode::Create).await.is_err() {
                    failed.push(i);
                }
                // Keys without "data" never fail.
                s.put(&key(&format!("meta/{i}")), payload(4), PutMode::Create)
                    .await
                    .unwrap();
            }
            failed
        };
        let a = run(11).await;
        let b = run(11).await;
        let c = run(12).await;
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(!a.is_empty() && a.len() < 40, "{a:?}");
    }

    #[tokio::test]
    async fn plans_parse_from_text_and_bad_text_is_one_error() {
        let plan = FaultPlan::parse("seed=7; put:enospc:2-3:ckpt/ ; all:delay=5:*").unwrap();
        assert_eq!(plan.seed, 7);
        assert_eq!(plan.rules.len(), 1 + 7);
        assert_eq!(plan.rules[0].trigger, Trigger::Range(2, 3));
        assert_eq!(plan.rules[0].action, FaultAction::StorageFull);
        assert_eq!(plan.rules[0].key_contains.as_deref(), Some("ckpt/"));
        assert_eq!(
            plan.rules[1].action,
            FaultAction::Delay(Duration::from_millis(5))
        );
        assert_eq!(
            FaultPlan::parse("get:fail:4-").unwrap().rules[0].trigger,
            Trigger::Range(4, u64::MAX)
        );
        for bad in [
            "put:fail",
            "pat:fail:1",
            "put:explode:1",
            "put:fail:x-2",
            "seed=q",
        ] {
            let e = FaultPlan::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && !e.contains('\n'), "{e}");
        }
        // Puts 2 and 3 under ckpt/ find the disk full, as an ENOSPC I/O error; others pass.
        let mem = Arc::new(MemoryStore::new());
        let s = FaultyStore::new(mem, FaultPlan::parse("put:enospc:2-3:ckpt/").unwrap());
        let mut outcomes = Vec::new();
        for i in 0..4 {
            s.put(&key(&format!("other/{i}")), payload(3), PutMode::Create)
                .await
                .unwrap();
            let r = s
                .put(&key(&format!("ckpt/{i}")), payload(3), PutMode::Create)
                .await;
            outcomes.push(match r {
                Err(CkptError::Io { source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::StorageFull);
                    "full"
                }
                Err(e) => panic!("{e}"),
                Ok(()) => "ok",
            });
        }
        assert_eq!(outcomes, ["ok", "full", "full", "ok"]);
    }
}

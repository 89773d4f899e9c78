//! The delta tracker: which rows of which table changed since a consumer last took a delta
//! (DECK §3.1, §4.2, Fig. 8).
//!
//! Ids are tracked in the remote form, on the server that owns the rows, as the update path
//! applies them ([`Tracker::track`] appends, nothing else). [`Tracker::compact`] is the timing
//! signal that removes duplicates; the owner calls it off the hot path (between steps), and
//! `track` compacts on its own when the raw log outgrows the deduplicated set, so memory stays
//! bounded even if nobody calls it.
//!
//! Several consumers (the checkpointer, a publisher streaming deltas to serving) read the same
//! tracked state at their own pace. Tracked ids live in *segments*: one open segment receives
//! new ids, and a consumer's [`Tracker::take`] seals it and opens the next. Compaction only
//! deduplicates inside a segment, never across segments, so every consumer can be served at its
//! own granularity from one store (Fig. 8). A segment is dropped once every consumer has
//! acknowledged it.
//!
//! Deduplication is O(ids) with no sorting and no hashing: each table has one bitmap over its
//! row ids that marks the ids the *open* segment already holds (DECK §3.1 asks for `compact` to
//! cost next to nothing, so it can hide behind communication; §4.1 does it with GPU kernels).
//! Sealing a segment clears the bits of that segment's ids only, so the cost stays proportional
//! to what was touched, never to the table.
//!
//! Memory: one id (8 bytes) per distinct touched row per live segment, plus the raw log between
//! compactions, plus one bitmap per touched table of `(largest id seen + 1) / 8` bytes (up to
//! twice that, as it grows geometrically), allocated lazily (only the open segment has
//! bitmaps; sealed segments keep their id lists only). For the Kaggle tables that is 1.3 MB for
//! the largest table and 4.2 MB for all 26, on a model of 2.2 GB: less than a hash set (about
//! 10 bytes per id) holds once more than one row in ~80 is touched. Ids at or above
//! [`BITMAP_LIMIT`] (a table of more than 2^28 rows; the bitmap would pass 32 MiB) are
//! deduplicated in a hash set instead, so a huge table costs memory in proportion to what is
//! touched.
//!
//! A take is not an acknowledgement: the cursor moves only on [`Tracker::ack`], once the
//! consumer's delta is durable. A failed delta is simply taken again later, as a superset, so a
//! failed upload never loses a touched row.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use ftrec_core::{RowId, TableId};

use crate::error::{CkptError, Result};

/// A cheap hasher for row ids (no untrusted input reaches it: ids come from validated pushes).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // One multiply-xorshift round: enough spread for a SwissTable-style probe.
        let x = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

type IdSet = HashSet<RowId, BuildHasherDefault<IdHasher>>;

/// Which consumer (checkpointer, publisher, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId(pub u32);

/// Ids below this are deduplicated with a bitmap (at most 32 MiB per table), ids at or above it
/// with a hash set.
pub const BITMAP_LIMIT: u64 = 1 << 28;

/// The ids the open segment holds for one table: a lazily grown bitmap for ids below
/// [`BITMAP_LIMIT`], a hash set above.
#[derive(Debug, Default)]
struct Seen {
    bits: Vec<u64>,
    high: IdSet,
}

impl Seen {
    /// Mark `id`; whether it was new.
    #[inline]
    fn insert(&mut self, id: RowId) -> bool {
        if id >= BITMAP_LIMIT {
            return self.high.insert(id);
        }
        let (w, b) = ((id >> 6) as usize, 1u64 << (id & 63));
        if w >= self.bits.len() {
            // Grow geometrically so a table whose ids arrive in ascending order does not
            // reallocate on every compaction.
            let want = (w + 1).max(self.bits.len() * 2);
            self.bits.resize(want.min((BITMAP_LIMIT >> 6) as usize), 0);
        }
        let word = &mut self.bits[w];
        let new = *word & b == 0;
        *word |= b;
        new
    }

    /// Forget `ids` (every id marked since the last clear), touching only their words: every
    /// set bit belongs to one of them, so their words can be zeroed whole.
    fn clear(&mut self, ids: &[RowId]) {
        if ids.len() >= self.bits.len() {
            self.bits.fill(0);
        } else {
            for &id in ids {
                if id < BITMAP_LIMIT {
                    self.bits[(id >> 6) as usize] = 0;
                }
            }
        }
        self.high.clear();
    }

    fn bytes(&self) -> u64 {
        (self.bits.capacity() * 8 + self.high.capacity() * 9) as u64
    }
}

#[derive(Debug, Default)]
struct TableLog {
    /// Appended by `track`, not yet deduplicated.
    raw: Vec<RowId>,
    /// Distinct ids of the segment, in the order they were first compacted.
    ids: Vec<RowId>,
    /// Which ids `ids` holds, while the segment is open (`None` once sealed).
    seen: Option<Seen>,
}

impl TableLog {
    fn compact(&mut self) {
        let seen = self.seen.get_or_insert_with(Seen::default);
        for &id in &self.raw {
            if seen.insert(id) {
                self.ids.push(id);
            }
        }
        self.raw.clear();
        if self.raw.capacity() > 4096 && self.raw.capacity() > 2 * self.ids.len() {
            self.raw.shrink_to(self.ids.len());
        }
    }

    /// Seal: hand the (cleared) bitmap on to the next open segment's log of the same table.
    fn seal(&mut self) -> Option<Seen> {
        let mut seen = self.seen.take()?;
        seen.clear(&self.ids);
        Some(seen)
    }
}

#[derive(Debug, Default)]
struct Segment {
    seq: u64,
    tables: BTreeMap<TableId, TableLog>,
}

/// The rows a consumer must save: per table, sorted distinct global ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackedRows {
    /// Tables in order; only tables with at least one row.
    pub tables: Vec<(TableId, Vec<RowId>)>,
    /// Acknowledge with this to release what was taken.
    pub upto: u64,
}

impl TrackedRows {
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, r)| r.len() as u64).sum()
    }

    /// The ids of `table` (empty if it had none).
    pub fn of(&self, table: TableId) -> &[RowId] {
        self.tables
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(&[], |(_, r)| r.as_slice())
    }
}

/// Memory the tracker holds, in ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackerStats {
    pub segments: usize,
    /// Distinct ids over all live segments.
    pub distinct_ids: u64,
    /// Ids appended since the last compaction.
    pub raw_ids: u64,
    /// Bytes of the open segment's deduplication bitmaps (and hash sets of ids at or above
    /// [`BITMAP_LIMIT`]).
    pub dedup_bytes: u64,
}

/// Touched-row tracker for one server. Not synchronised: the owner wraps it (the server's
/// update path already runs under its lock).
#[derive(Debug)]
pub struct Tracker {
    /// Live segments, oldest first; the last is open.
    segments: Vec<Segment>,
    /// Per consumer: the first segment seq it has not acknowledged.
    cursors: BTreeMap<ConsumerId, u64>,
    /// Auto-compaction threshold on the raw log, in ids per table.
    raw_limit: usize,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker {
    pub fn new() -> Self {
        Tracker {
            segments: vec![Segment::default()],
            cursors: BTreeMap::new(),
            raw_limit: 1 << 16,
        }
    }

    /// Add a consumer that sees every id tracked from now on.
    pub fn register(&mut self, consumer: ConsumerId) -> Result<()> {
        if self.cursors.contains_key(&consumer) {
            return Err(CkptError::InvalidArgument(format!(
                "tracker consumer {} is already registered",
                consumer.0
            )));
        }
        let open = self.open_seq();
        self.cursors.insert(consumer, open);
        Ok(())
    }

    /// Remove a consumer; segments only it needed are dropped.
    pub fn unregister(&mut self, consumer: ConsumerId) {
        self.cursors.remove(&consumer);
        self.drop_acknowledged();
    }

    fn open_seq(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.seq)
    }

    fn open(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("one segment is always open")
    }

    /// Record that `rows` of `table` were updated (any order, duplicates allowed).
    pub fn track(&mut self, table: TableId, rows: &[RowId]) {
        if self.cursors.is_empty() {
            // Nobody will ever read these ids.
            return;
        }
        let limit = self.raw_limit;
        let log = self.open().tables.entry(table).or_default();
        log.raw.extend_from_slice(rows);
        if log.raw.len() > limit.max(log.ids.len()) {
            log.compact();
        }
    }

    /// Deduplicate the open segment's ids (DECK §4.2: the `compact` timing signal).
    pub fn compact(&mut self) {
        for log in self.open().tables.values_mut() {
            log.compact();
        }
    }

    /// Seal the open segment and return every row `consumer` has not acknowledged, sorted per
    /// table. The ids stay tracked until [`Tracker::ack`]`(consumer, rows.upto)`.
    pub fn take(&mut self, consumer: ConsumerId) -> Result<TrackedRows> {
        let from = *self.cursors.get(&consumer).ok_or_else(|| {
            CkptError::InvalidArgument(format!("tracker consumer {} is not registered", consumer.0))
        })?;
        self.compact();
        let upto = self.open_seq();
        // Seal: later ids go to a fresh segment, which reuses the cleared bitmaps.
        let tables = self
            .open()
            .tables
            .iter_mut()
            .filter_map(|(t, log)| {
                log.seal().map(|seen| {
                    (
                        *t,
                        TableLog {
                            seen: Some(seen),
                            ..TableLog::default()
                        },
                    )
                })
            })
            .collect();
        self.segments.push(Segment {
            seq: upto + 1,
            tables,
        });
        let mut merged: BTreeMap<TableId, Vec<RowId>> = BTreeMap::new();
        let mut sealed = self
            .segments
            .iter()
            .filter(|s| s.seq >= from && s.seq <= upto);
        let single = sealed.clone().count() == 1;
        for seg in sealed.by_ref() {
            for (t, log) in &seg.tables {
                if !log.ids.is_empty() {
                    merged.entry(*t).or_default().extend_from_slice(&log.ids);
                }
            }
        }
        let tables = merged
            .into_iter()
            .filter_map(|(t, mut ids)| {
                ids.sort_unstable();
                if !single {
                    ids.dedup();
                }
                (!ids.is_empty()).then_some((t, ids))
            })
            .collect();
        Ok(TrackedRows { tables, upto })
    }

    /// `consumer` has made durable everything up to the segment `upto` of a [`TrackedRows`].
    pub fn ack(&mut self, consumer: ConsumerId, upto: u64) -> Result<()> {
        let open = self.open_seq();
        let cursor = self.cursors.get_mut(&consumer).ok_or_else(|| {
            CkptError::InvalidArgument(format!("tracker consumer {} is not registered", consumer.0))
        })?;
        if upto >= open {
            return Err(CkptError::InvalidArgument(format!(
                "cannot acknowledge segment {upto}: it is still open"
            )));
        }
        *cursor = (*cursor).max(upto + 1);
        self.drop_acknowledged();
        Ok(())
    }

    /// Forget everything tracked (after a restore made the state equal to a checkpoint): every
    /// consumer starts over from the restored state.
    pub fn reset(&mut self) {
        let next = self.open_seq() + 1;
        self.segments = vec![Segment {
            seq: next,
            tables: BTreeMap::new(),
        }];
        for c in self.cursors.values_mut() {
            *c = next;
        }
    }

    fn drop_acknowledged(&mut self) {
        let min = self
            .cursors
            .values()
            .copied()
            .min()
            .unwrap_or(u64::MAX)
            .min(self.open_seq());
        let open = self.open_seq();
        // Empty sealed segments hold nothing any consumer could take.
        self.segments.retain(|s| {
            s.seq >= min
                && (s.seq == open
                    || s.tables
                        .values()
                        .any(|t| !t.ids.is_empty() || !t.raw.is_empty()))
        });
        if self.segments.is_empty() {
            self.segments.push(Segment::default());
        }
    }

    pub fn stats(&self) -> TrackerStats {
        let mut st = TrackerStats {
            segments: self.segments.len(),
            ..Default::default()
        };
        for s in &self.segments {
            for log in s.tables.values() {
                st.distinct_ids += log.ids.len() as u64;
                st.raw_ids += log.raw.len() as u64;
                st.dedup_bytes += log.seen.as_ref().map_or(0, Seen::bytes);
            }
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CK: ConsumerId = ConsumerId(0);
    const PUB: ConsumerId = ConsumerId(1);

    #[test]
    fn track_compact_take_ack() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        t.track(TableId(1), &[5, 3, 5, 9]);
        t.track(TableId(0), &[7]);
        t.track(TableId(1), &[3]);
        assert_eq!(t.stats().raw_ids, 6);
        t.compact();
        // DECK §3.1: one id per distinct touched row.
        assert_eq!(t.stats().distinct_ids, 4);
        assert_eq!(t.stats().raw_ids, 0);
        let got = t.take(CK).unwrap();
        assert_eq!(
            got.tables,
            vec![(TableId(0), vec![7]), (TableId(1), vec![3, 5, 9])]
        );
        t.track(TableId(1), &[1]);
        t.ack(CK, got.upto).unwrap();
        let next = t.take(CK).unwrap();
        assert_eq!(next.tables, vec![(TableId(1), vec![1])]);
    }

    #[test]
    fn an_unacknowledged_take_is_taken_again_as_a_superset() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        t.track(TableId(0), &[1, 2]);
        let first = t.take(CK).unwrap();
        // The delta built from `first` failed to upload: no ack.
        t.track(TableId(0), &[2, 8]);
        let second = t.take(CK).unwrap();
        assert_eq!(second.tables, vec![(TableId(0), vec![1, 2, 8])]);
        assert!(second.upto > first.upto);
        t.ack(CK, second.upto).unwrap();
        assert!(t.take(CK).unwrap().tables.is_empty());
    }

    #[test]
    fn two_consumers_at_their_own_pace_fig8() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        t.register(PUB).unwrap();
        t.track(TableId(0), &[1, 2]);
        let p1 = t.take(PUB).unwrap();
        assert_eq!(p1.tables, vec![(TableId(0), vec![1, 2])]);
        t.ack(PUB, p1.upto).unwrap();
        t.track(TableId(0), &[2, 3]);
        let p2 = t.take(PUB).unwrap();
        assert_eq!(p2.tables, vec![(TableId(0), vec![2, 3])]);
        t.ack(PUB, p2.upto).unwrap();
        // Compaction stayed inside segments: row 2 is held once per segment until the
        // checkpointer, which has seen neither, takes both.
        assert_eq!(t.stats().distinct_ids, 4);
        t.track(TableId(0), &[9]);
        let c = t.take(CK).unwrap();
        assert_eq!(c.tables, vec![(TableId(0), vec![1, 2, 3, 9])]);
        t.ack(CK, c.upto).unwrap();
        // Every segment acknowledged by both is gone.
        assert_eq!(t.stats().distinct_ids, 1);
        let p3 = t.take(PUB).unwrap();
        assert_eq!(p3.tables, vec![(TableId(0), vec![9])]);
        t.ack(PUB, p3.upto).unwrap();
        assert_eq!(t.stats().distinct_ids, 0);
        assert_eq!(t.stats().segments, 1);
    }

    #[test]
    fn auto_compaction_bounds_the_raw_log() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        for _ in 0..100 {
            t.track(TableId(0), &(0..10_000).collect::<Vec<_>>());
        }
        let s = t.stats();
        assert_eq!(s.distinct_ids, 10_000);
        assert!(s.raw_ids <= 70_000, "{s:?}");
    }

    #[test]
    fn reset_forgets_and_unknown_consumers_are_errors() {
        let mut t = Tracker::new();
        assert!(matches!(
            t.take(CK),
            Err(CkptError::InvalidArgument(m)) if m.contains("not registered")
        ));
        t.register(CK).unwrap();
        assert!(t.register(CK).is_err());
        t.track(TableId(0), &[4]);
        t.reset();
        assert!(t.take(CK).unwrap().tables.is_empty());
        // Without consumers nothing is kept.
        t.unregister(CK);
        t.track(TableId(0), &[4]);
        assert_eq!(t.stats().distinct_ids + t.stats().raw_ids, 0);
    }

    #[test]
    fn acking_the_open_segment_is_refused() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        let got = t.take(CK).unwrap();
        t.track(TableId(0), &[1]);
        // `got.upto` names a sealed segment; acking past the open one is an error.
        t.ack(CK, got.upto).unwrap();
        assert!(t.ack(CK, got.upto + 5).is_err());
    }

    #[test]
    fn ids_above_the_bitmap_limit_are_deduplicated_in_a_set() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        let high = BITMAP_LIMIT + 5;
        t.track(TableId(0), &[high, 3, high, u64::MAX, 3]);
        t.compact();
        assert_eq!(t.stats().distinct_ids, 3);
        // The bitmap covers id 3 only, not the huge ids.
        assert!(t.stats().dedup_bytes < 4096, "{:?}", t.stats());
        let got = t.take(CK).unwrap();
        assert_eq!(got.tables, vec![(TableId(0), vec![3, high, u64::MAX])]);
        t.ack(CK, got.upto).unwrap();
        // A sealed segment's marks are cleared: the same ids count again in the next one.
        t.track(TableId(0), &[high, 3]);
        let again = t.take(CK).unwrap();
        assert_eq!(again.tables, vec![(TableId(0), vec![3, high])]);
    }

    #[test]
    fn the_bitmap_is_sized_by_the_largest_id_and_freed_by_reset() {
        let mut t = Tracker::new();
        t.register(CK).unwrap();
        t.track(TableId(0), &[100_000]);
        t.track(TableId(1), &[7]);
        t.compact();
        let bytes = t.stats().dedup_bytes;
        // 100,001 bits for table 0 (rounded up to words and doubled at most), one word for 1.
        assert!((12_500..=2 * 12_512 + 64).contains(&bytes), "{bytes}");
        let got = t.take(CK).unwrap();
        // The bitmaps move on to the open segment, cleared, not reallocated.
        assert_eq!(t.stats().dedup_bytes, bytes);
        t.ack(CK, got.upto).unwrap();
        t.reset();
        assert_eq!(t.stats().dedup_bytes, 0);
    }

    /// Random tracks, compactions, takes and acks of two consumers against a plain model:
    /// every take returns exactly the distinct ids tracked since the consumer's last
    /// acknowledged take, and the tracker holds one id per distinct row per live segment.
    #[test]
    fn matches_a_reference_model_of_segments() {
        use ftrec_core::rng::SplitMix;
        use std::collections::BTreeSet;
        type Seg = BTreeMap<TableId, BTreeSet<RowId>>;
        for seed in 0..20u64 {
            let mut g = SplitMix::new(seed);
            let mut t = Tracker::new();
            t.register(CK).unwrap();
            t.register(PUB).unwrap();
            // Reference: segments by seq (open one last), per-consumer cursor and pending take.
            let mut segs: Vec<(u64, Seg)> = vec![(0, Seg::new())];
            let mut cursor: BTreeMap<ConsumerId, u64> = [(CK, 0), (PUB, 0)].into();
            let mut pending: BTreeMap<ConsumerId, u64> = BTreeMap::new();
            for _ in 0..300 {
                match g.next_u64() % 10 {
                    0..=5 => {
                        let table = TableId((g.next_u64() % 3) as u32);
                        // Small ids collide often; a few exceed one bitmap word or the limit.
                        let ids: Vec<RowId> = (0..g.next_u64() % 40)
                            .map(|_| match g.next_u64() % 20 {
                                0 => BITMAP_LIMIT + g.next_u64() % 4,
                                1 => g.next_u64() % 100_000,
                                _ => g.next_u64() % 150,
                            })
                            .collect();
                        t.track(table, &ids);
                        segs.last_mut()
                            .unwrap()
                            .1
                            .entry(table)
                            .or_default()
                            .extend(&ids);
                    }
                    6 => t.compact(),
                    7 | 8 => {
                        let c = if g.next_u64() & 1 == 0 { CK } else { PUB };
                        let got = t.take(c).unwrap();
                        let upto = segs.last().unwrap().0;
                        let mut want: Seg = Seg::new();
                        for (seq, seg) in &segs {
                            if *seq >= cursor[&c] && *seq <= upto {
                                for (tb, ids) in seg {
                                    want.entry(*tb).or_default().extend(ids);
                                }
                            }
                        }
                        let want: Vec<(TableId, Vec<RowId>)> = want
                            .into_iter()
                            .filter(|(_, ids)| !ids.is_empty())
                            .map(|(tb, ids)| (tb, ids.into_iter().collect()))
                            .collect();
                        assert_eq!(got.tables, want, "seed {seed}");
                        assert_eq!(got.upto, upto);
                        segs.push((upto + 1, Seg::new()));
                        pending.insert(c, upto);
                    }
                    _ => {
                        let c = if g.next_u64() & 1 == 0 { CK } else { PUB };
                        if let Some(upto) = pending.remove(&c) {
                            t.ack(c, upto).unwrap();
                            let cur = cursor.get_mut(&c).unwrap();
                            *cur = (*cur).max(upto + 1);
                            let min = *cursor.values().min().unwrap();
                            let open = segs.last().unwrap().0;
                            segs.retain(|(seq, _)| *seq >= min || *seq == open);
                        }
                    }
                }
                t.compact();
                let distinct: u64 = segs
                    .iter()
                    .flat_map(|(_, s)| s.values())
                    .map(|ids| ids.len() as u64)
                    .sum();
                assert_eq!(t.stats().distinct_ids, distinct, "seed {seed}");
                assert_eq!(t.stats().raw_ids, 0);
            }
        }
    }
}

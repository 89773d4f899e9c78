//! Recovery plans: what to read and how to decode to rebuild lost servers (ECRec §3.4).
//!
//! A plan is pure data computed from the layout and the set of lost servers. For every stripe
//! with a stored member on a lost server it names the positions to rebuild, the `k` rows to
//! read (server and row or parity slot; absent positions of a short stripe read as zeros) and
//! the decode method. The affected stripes are cut, in (table, stripe) order, into `L`
//! consecutive *lock ranges* of near-equal size: recovery proceeds range by range, and while
//! range `i` is being rebuilt, servers buffer updates to every row and parity of its stripes
//! so the decoder never mixes a new row with an old parity (ECRec §3.4, granular locking).
//! More ranges mean less buffered memory and more lock switches.
//!
//! The plan never does IO: a recovery driver walks [`RecoveryPlan::tasks`], issues the reads,
//! and feeds them to the [`Decoder`](crate::Decoder) that
//! [`Code::decoder`](crate::Code::decoder)`(&task.available, &task.wanted())` returns, whose
//! [`reads`](crate::Decoder::reads) are exactly `task.reads` in the same order.

use ftrec_core::{RowId, ServerId, TableId};

use crate::layout::{
    AffectedStripes, Location, PeriodMembers, StripeId, StripeLayout, StripeMember,
};
use crate::{Code, CodeKind, EcError};

/// Knobs of a recovery plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryOptions {
    /// Number of lock ranges `L` (ECRec §3.4); at least 1. A plan with fewer affected
    /// stripes than `L` gets one range per stripe.
    pub lock_ranges: usize,
}

impl Default for RecoveryOptions {
    fn default() -> Self {
        RecoveryOptions { lock_ranges: 1 }
    }
}

/// How a task turns its reads into the lost rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeMethod {
    /// Sum code, a data row lost: parity minus the other data rows (ECRec §3.2).
    SumSubtract,
    /// Sum code, the parity lost: sum of the data rows.
    SumEncode,
    /// GF(2^8) code, only parities lost: re-encode them from the data rows read.
    Gf256Encode,
    /// GF(2^8) code, data rows lost: solve the system of the `k` rows read.
    Gf256Solve,
}

/// Rebuild of the lost positions of one stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryTask {
    pub stripe: StripeId,
    /// Positions not lost (including absent ones), ascending: the `available` argument of
    /// [`Code::decoder`](crate::Code::decoder).
    pub available: Vec<usize>,
    /// The `k` members to read, in decoder order; [`Location::Absent`] members are zeros.
    pub reads: Vec<StripeMember>,
    /// The lost members to rebuild, ascending by position (decoder output order).
    pub rebuild: Vec<StripeMember>,
    pub method: DecodeMethod,
}

impl RecoveryTask {
    /// Positions to decode: the `wanted` argument of [`Code::decoder`](crate::Code::decoder).
    pub fn wanted(&self) -> Vec<usize> {
        self.rebuild.iter().map(|m| m.position).collect()
    }

    /// Rows actually fetched from servers (reads of absent positions cost nothing).
    pub fn stored_reads(&self) -> usize {
        self.reads
            .iter()
            .filter(|m| !matches!(m.location, Location::Absent))
            .count()
    }
}

/// One lock range: a run of consecutive affected stripes recovered under one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRange {
    pub index: usize,
    /// First and last affected stripe of the range, in (table, stripe) order.
    pub first: StripeId,
    pub last: StripeId,
    /// Affected stripes in the range.
    pub stripes: u64,
    /// Data rows and parity rows to rebuild.
    pub lost_rows: u64,
    pub lost_parities: u64,
    /// Stored rows read from survivors.
    pub reads: u64,
}

/// The whole recovery of a set of lost servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    layout: StripeLayout,
    kind: CodeKind,
    lost: Vec<ServerId>,
    ranges: Vec<LockRange>,
}

fn check_code(layout: &StripeLayout, code: &Code) -> Result<(), EcError> {
    if code.k() != layout.k() || code.r() != layout.r() {
        return Err(EcError::InvalidParameters(format!(
            "code has k = {}, r = {} but the layout has k = {}, r = {}",
            code.k(),
            code.r(),
            layout.k(),
            layout.r()
        )));
    }
    Ok(())
}

fn normalise_lost(layout: &StripeLayout, lost: &[ServerId]) -> Result<Vec<ServerId>, EcError> {
    let mut lost = lost.to_vec();
    lost.sort_unstable();
    lost.dedup();
    for s in &lost {
        if s.0 >= layout.servers() {
            return Err(EcError::UnknownServer {
                server: s.0,
                servers: layout.servers(),
            });
        }
    }
    Ok(lost)
}

/// The members a decode reads, in decoder order: the decoder's choice, data before parity,
/// the lowest `k` positions not lost (absent ones included, read as zeros).
fn decoder_reads<'a>(
    members: &'a [StripeMember],
    lost: &'a [ServerId],
    k: usize,
) -> impl Iterator<Item = &'a StripeMember> + 'a {
    members.iter().filter(move |m| !m.is_lost(lost)).take(k)
}

/// Build the task that rebuilds `wanted` (all lost positions when `None`) of `stripe`.
fn build_task(
    layout: &StripeLayout,
    kind: CodeKind,
    stripe: StripeId,
    lost: &[ServerId],
    only: Option<usize>,
) -> Result<RecoveryTask, EcError> {
    let members = layout.members(stripe)?;
    let k = layout.k();
    let lost_count = members.iter().filter(|m| m.is_lost(lost)).count();
    if lost_count > layout.r() {
        return Err(EcError::TooManyErasures {
            lost: lost_count,
            tolerated: layout.r(),
        });
    }
    let available: Vec<usize> = members
        .iter()
        .filter(|m| !m.is_lost(lost))
        .map(|m| m.position)
        .collect();
    let reads: Vec<StripeMember> = decoder_reads(&members, lost, k).copied().collect();
    let rebuild: Vec<StripeMember> = members
        .iter()
        .filter(|m| m.is_lost(lost) && only.is_none_or(|p| p == m.position))
        .copied()
        .collect();
    let data_lost = rebuild.iter().any(|m| m.position < k);
    let method = match (kind, data_lost) {
        (CodeKind::Sum, true) => DecodeMethod::SumSubtract,
        (CodeKind::Sum, false) => DecodeMethod::SumEncode,
        (CodeKind::Gf256, true) => DecodeMethod::Gf256Solve,
        (CodeKind::Gf256, false) => DecodeMethod::Gf256Encode,
    };
    Ok(RecoveryTask {
        stripe,
        available,
        reads,
        rebuild,
        method,
    })
}

impl RecoveryPlan {
    /// Plan the rebuild of everything the `lost` servers held. Errors if `code` does not match
    /// the layout, a server is unknown, or some stripe lost more rows than the code tolerates
    /// ([`EcError::TooManyErasures`]; the caller must fall back to a checkpoint).
    pub fn new(
        layout: &StripeLayout,
        code: &Code,
        lost: &[ServerId],
        options: RecoveryOptions,
    ) -> Result<Self, EcError> {
        check_code(layout, code)?;
        if options.lock_ranges == 0 {
            return Err(EcError::InvalidParameters(
                "a recovery plan needs at least one lock range".into(),
            ));
        }
        let lost = normalise_lost(layout, lost)?;
        let worst = layout.max_lost_per_stripe(&lost)?;
        if worst > layout.r() {
            return Err(EcError::TooManyErasures {
                lost: worst,
                tolerated: layout.r(),
            });
        }
        let affected = layout.affected_count(&lost)?;
        let l = (options.lock_ranges as u64).min(affected);
        let mut ranges: Vec<LockRange> = Vec::with_capacity(l as usize);
        let mut members = Vec::with_capacity(layout.k() + layout.r());
        let mut period: Option<PeriodMembers> = None;
        for (i, stripe) in layout.affected_stripes(&lost)?.enumerate() {
            // Range of the i-th affected stripe: floor(i * L / A) gives L runs whose sizes
            // differ by at most one.
            let range = ((i as u128 * l as u128) / affected as u128) as usize;
            if ranges.len() == range {
                ranges.push(LockRange {
                    index: range,
                    first: stripe,
                    last: stripe,
                    stripes: 0,
                    lost_rows: 0,
                    lost_parities: 0,
                    reads: 0,
                });
            }
            if period.as_ref().is_none_or(|p| p.table() != stripe.table) {
                period = Some(layout.period_members(stripe.table));
            }
            if let Some(p) = &period {
                p.members_into(stripe.index, &mut members);
            }
            let r = &mut ranges[range];
            r.last = stripe;
            r.stripes += 1;
            for m in members.iter().filter(|m| m.is_lost(&lost)) {
                match m.location {
                    Location::Parity { .. } => r.lost_parities += 1,
                    _ => r.lost_rows += 1,
                }
            }
            r.reads += decoder_reads(&members, &lost, layout.k())
                .filter(|m| !matches!(m.location, Location::Absent))
                .count() as u64;
        }
        Ok(RecoveryPlan {
            layout: layout.clone(),
            kind: code.kind(),
            lost,
            ranges,
        })
    }

    /// The lost servers, sorted.
    pub fn lost(&self) -> &[ServerId] {
        &self.lost
    }

    pub fn code(&self) -> CodeKind {
        self.kind
    }

    pub fn layout(&self) -> &StripeLayout {
        &self.layout
    }

    pub fn ranges(&self) -> &[LockRange] {
        &self.ranges
    }

    /// Stripes to rebuild over all ranges.
    pub fn affected_stripes(&self) -> u64 {
        self.ranges.iter().map(|r| r.stripes).sum()
    }

    fn range(&self, range: usize) -> Result<&LockRange, EcError> {
        self.ranges.get(range).ok_or_else(|| {
            EcError::InvalidParameters(format!(
                "lock range {range} does not exist (the plan has {})",
                self.ranges.len()
            ))
        })
    }

    /// The tasks of lock range `range`, in stripe order.
    pub fn tasks(&self, range: usize) -> Result<impl Iterator<Item = RecoveryTask> + '_, EcError> {
        let r = self.range(range)?;
        Ok(self
            .layout
            .affected_stripes_from(&self.lost, r.first)?
            .take(r.stripes as usize)
            .filter_map(move |stripe| {
                // Validated when the plan was built: every affected stripe decodes.
                build_task(&self.layout, self.kind, stripe, &self.lost, None).ok()
            }))
    }

    /// A walk through the tasks of lock range `range` that fills [`TaskBatch`]es: the same
    /// tasks as [`RecoveryPlan::tasks`], in the same order, without allocating per stripe.
    pub fn cursor(&self, range: usize) -> Result<RangeCursor<'_>, EcError> {
        let r = self.range(range)?;
        Ok(RangeCursor {
            plan: self,
            stripes: self.layout.affected_stripes_from(&self.lost, r.first)?,
            left: r.stripes,
            members: Vec::with_capacity(self.layout.k() + self.layout.r()),
            period: None,
        })
    }

    /// Every task of the plan, range after range.
    pub fn all_tasks(&self) -> impl Iterator<Item = RecoveryTask> + '_ {
        (0..self.ranges.len()).flat_map(move |i| self.tasks(i).into_iter().flatten())
    }

    /// The lock range that rebuilds `stripe`, or `None` if the stripe lost nothing: while
    /// range `i` is active, updates to any member of a stripe with `lock_range_of == Some(i)`
    /// are buffered.
    pub fn lock_range_of(&self, stripe: StripeId) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.first <= stripe);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (stripe <= r.last && self.layout.is_affected(stripe, &self.lost)).then_some(r.index)
    }
}

/// The tasks of a rebuild batch in flat arrays, reused from batch to batch: per stripe a few
/// entries in shared vectors instead of a [`RecoveryTask`] with four vectors of its own, and
/// each distinct loss pattern (positions available, positions wanted) kept once, so a
/// decoder per pattern serves the whole batch.
#[derive(Debug, Clone, Default)]
pub struct TaskBatch {
    stripes: Vec<StripeId>,
    /// Per task: its pattern, an index into `patterns`.
    pattern: Vec<u32>,
    /// Distinct (available, wanted) position lists of the batch's tasks.
    patterns: Vec<(Vec<usize>, Vec<usize>)>,
    /// The tasks' reads one task after another; task `i`'s are `reads[read_start[i]..
    /// read_start[i + 1]]`.
    reads: Vec<StripeMember>,
    read_start: Vec<usize>,
    /// The tasks' members to rebuild, laid out as `reads`.
    rebuild: Vec<StripeMember>,
    rebuild_start: Vec<usize>,
    /// Per pattern: its two lists as bit sets, `None` beyond 64 positions.
    pattern_keys: Vec<Option<(u64, u64)>>,
    /// Scratch of `push_members`.
    available: Vec<usize>,
    wanted: Vec<usize>,
    lost_scratch: Vec<bool>,
}

impl TaskBatch {
    pub fn new() -> Self {
        TaskBatch::default()
    }

    /// Empty the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.stripes.clear();
        self.pattern.clear();
        self.patterns.clear();
        self.pattern_keys.clear();
        self.reads.clear();
        self.read_start.clear();
        self.rebuild.clear();
        self.rebuild_start.clear();
    }

    /// Tasks in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.stripes.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.stripes.is_empty()
    }

    /// Task `i`'s stripe.
    #[inline]
    pub fn stripe(&self, i: usize) -> StripeId {
        self.stripes[i]
    }

    /// Task `i`'s reads, in decoder order ([`RecoveryTask::reads`]).
    #[inline]
    pub fn reads(&self, i: usize) -> &[StripeMember] {
        task_span(&self.reads, &self.read_start, i)
    }

    /// Task `i`'s members to rebuild, ascending by position ([`RecoveryTask::rebuild`]).
    #[inline]
    pub fn rebuild(&self, i: usize) -> &[StripeMember] {
        task_span(&self.rebuild, &self.rebuild_start, i)
    }

    /// Every task's members to rebuild, one task after another.
    #[inline]
    pub fn all_rebuilt(&self) -> &[StripeMember] {
        &self.rebuild
    }

    /// Task `i`'s loss pattern, an index into [`TaskBatch::patterns`].
    #[inline]
    pub fn pattern(&self, i: usize) -> usize {
        self.pattern[i] as usize
    }

    /// The batch's distinct loss patterns: the `available` and `wanted` arguments of
    /// [`Code::decoder`](crate::Code::decoder).
    #[inline]
    pub fn patterns(&self) -> &[(Vec<usize>, Vec<usize>)] {
        &self.patterns
    }

    /// Append a task built elsewhere (a degraded read's).
    pub fn push(&mut self, task: &RecoveryTask) {
        self.available.clone_from(&task.available);
        self.wanted.clear();
        self.wanted.extend(task.rebuild.iter().map(|m| m.position));
        self.push_entry(
            task.stripe,
            task.reads.iter().copied(),
            task.rebuild.iter().copied(),
        );
    }

    /// Append the task that rebuilds every lost position of a stripe from its `members`
    /// (as `build_task` with no position singled out), without allocating once the
    /// batch's buffers have grown.
    fn push_members(
        &mut self,
        stripe: StripeId,
        members: &[StripeMember],
        lost: &[ServerId],
        k: usize,
    ) {
        self.available.clear();
        self.wanted.clear();
        self.lost_scratch.clear();
        for m in members {
            let l = m.is_lost(lost);
            self.lost_scratch.push(l);
            if l {
                self.wanted.push(m.position);
            } else {
                self.available.push(m.position);
            }
        }
        let p = self.pattern_index();
        // As `decoder_reads`: the first k members not lost.
        self.stripes.push(stripe);
        self.pattern.push(p as u32);
        self.read_start.push(self.reads.len());
        self.rebuild_start.push(self.rebuild.len());
        let mut taken = 0;
        for (m, &l) in members.iter().zip(&self.lost_scratch) {
            if l {
                self.rebuild.push(*m);
            } else if taken < k {
                self.reads.push(*m);
                taken += 1;
            }
        }
    }

    /// The index of the loss pattern in the `available` and `wanted` scratch, added if new.
    /// Patterns of up to 64 positions are compared as two bit sets (a range's stripes cycle
    /// through a few patterns, and a list compare per stripe shows in a rebuild's profile).
    fn pattern_index(&mut self) -> usize {
        let key = mask(&self.available).zip(mask(&self.wanted));
        let found = match key {
            Some(key) => self.pattern_keys.iter().position(|&k| k == Some(key)),
            None => self
                .patterns
                .iter()
                .position(|(a, w)| *a == self.available && *w == self.wanted),
        };
        found.unwrap_or_else(|| {
            self.patterns
                .push((self.available.clone(), self.wanted.clone()));
            self.pattern_keys.push(key);
            self.patterns.len() - 1
        })
    }

    /// Append a task whose loss pattern is in the `available` and `wanted` scratch.
    fn push_entry(
        &mut self,
        stripe: StripeId,
        reads: impl Iterator<Item = StripeMember>,
        rebuild: impl Iterator<Item = StripeMember>,
    ) {
        let p = self.pattern_index();
        self.stripes.push(stripe);
        self.pattern.push(p as u32);
        self.read_start.push(self.reads.len());
        self.reads.extend(reads);
        self.rebuild_start.push(self.rebuild.len());
        self.rebuild.extend(rebuild);
    }
}

/// `positions` as a bit set, `None` if one is 64 or more or they are not ascending (two
/// lists in different orders are different patterns: the decoder's outputs follow `wanted`).
fn mask(positions: &[usize]) -> Option<u64> {
    let ascending = positions.windows(2).all(|w| w[0] < w[1]);
    positions
        .iter()
        .try_fold(0u64, |m, &p| (ascending && p < 64).then(|| m | (1 << p)))
}

/// Task `i`'s entries of `all`, where task `i`'s start at `starts[i]` and each task's follow
/// the one before.
#[inline]
fn task_span<'a>(all: &'a [StripeMember], starts: &[usize], i: usize) -> &'a [StripeMember] {
    let end = starts.get(i + 1).copied().unwrap_or(all.len());
    &all[starts[i]..end]
}

/// A walk through one lock range's tasks ([`RecoveryPlan::cursor`]).
#[derive(Debug)]
pub struct RangeCursor<'a> {
    plan: &'a RecoveryPlan,
    stripes: AffectedStripes<'a>,
    /// Stripes of the range not walked yet.
    left: u64,
    members: Vec<StripeMember>,
    /// The members of the current table's period stripes.
    period: Option<PeriodMembers>,
}

impl RangeCursor<'_> {
    /// Append to `out` the tasks of the range's next stripes, in order, skipping those none
    /// of whose lost members `keep` accepts, until `out` holds `max` tasks or the range is
    /// done. Returns whether stripes are left.
    pub fn fill(
        &mut self,
        max: usize,
        mut keep: impl FnMut(&StripeMember) -> bool,
        out: &mut TaskBatch,
    ) -> bool {
        let layout = &self.plan.layout;
        let lost = &self.plan.lost;
        while out.len() < max && self.left > 0 {
            let Some(stripe) = self.stripes.next() else {
                self.left = 0;
                break;
            };
            self.left -= 1;
            if self
                .period
                .as_ref()
                .is_none_or(|p| p.table() != stripe.table)
            {
                self.period = Some(layout.period_members(stripe.table));
            }
            if let Some(p) = &self.period {
                p.members_into(stripe.index, &mut self.members);
            }
            if self.members.iter().any(|m| m.is_lost(lost) && keep(m)) {
                out.push_members(stripe, &self.members, lost, layout.k());
            }
        }
        self.left > 0
    }
}

/// Plan a degraded read (ECRec §3.4): rebuild data row `row` of `table`, whose server is lost,
/// from survivors of its stripe without touching the other lost positions.
pub fn degraded_read(
    layout: &StripeLayout,
    code: &Code,
    table: TableId,
    row: RowId,
    lost: &[ServerId],
) -> Result<RecoveryTask, EcError> {
    check_code(layout, code)?;
    let lost = normalise_lost(layout, lost)?;
    let (stripe, position) = layout.stripe_of(table, row)?;
    let owner = layout.shard_map().owner(table, row);
    if !lost.contains(&owner) {
        return Err(EcError::InvalidDecode(format!(
            "row {row} of table {} is on server {}, which is not lost: read it directly",
            table.0, owner.0
        )));
    }
    build_task(layout, code.kind(), stripe, &lost, Some(position))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (StripeLayout, Code) {
        let layout = StripeLayout::new(6, 3, 2, &[40, 7, 3]).unwrap();
        (layout, Code::new(CodeKind::Gf256, 3, 2).unwrap())
    }

    #[test]
    fn plan_covers_every_lost_row_and_parity_once() {
        let (layout, code) = setup();
        let lost = [ServerId(4), ServerId(1)];
        for l in [1, 2, 3, 100] {
            let plan = RecoveryPlan::new(&layout, &code, &lost, RecoveryOptions { lock_ranges: l })
                .unwrap();
            let tasks: Vec<RecoveryTask> = plan.all_tasks().collect();
            assert_eq!(tasks.len() as u64, plan.affected_stripes());
            assert_eq!(
                plan.affected_stripes(),
                layout.affected_count(&lost).unwrap()
            );
            let want_ranges = (l as u64).min(plan.affected_stripes()) as usize;
            assert_eq!(plan.ranges().len(), want_ranges);
            let sizes: Vec<u64> = plan.ranges().iter().map(|r| r.stripes).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            // Every stored row and parity of a lost server is rebuilt exactly once.
            let mut rebuilt_rows = std::collections::BTreeSet::new();
            let mut rebuilt_parity = std::collections::BTreeSet::new();
            for t in &tasks {
                assert_eq!(t.reads.len(), 3);
                for m in &t.reads {
                    assert!(!lost.contains(&m.server) || matches!(m.location, Location::Absent));
                }
                for m in &t.rebuild {
                    assert!(lost.contains(&m.server));
                    let fresh = match m.location {
                        Location::Row { table, row, .. } => rebuilt_rows.insert((table, row)),
                        Location::Parity { slot, .. } => rebuilt_parity.insert((m.server, slot)),
                        Location::Absent => panic!("absent member scheduled for rebuild"),
                    };
                    assert!(fresh, "{m:?} rebuilt twice");
                }
                let dec = code.decoder(&t.available, &t.wanted()).unwrap();
                let reads: Vec<usize> = t.reads.iter().map(|m| m.position).collect();
                assert_eq!(dec.reads(), reads.as_slice());
            }
            for range in 0..plan.ranges().len() {
                for t in plan.tasks(range).unwrap() {
                    assert_eq!(plan.lock_range_of(t.stripe), Some(range));
                }
            }
            for (t, _) in layout.table_rows().iter().enumerate() {
                let table = TableId(t as u32);
                for index in 0..layout.stripes(table).unwrap() {
                    let stripe = StripeId { table, index };
                    if !layout.is_affected(stripe, &lost) {
                        assert_eq!(plan.lock_range_of(stripe), None);
                    }
                }
            }
            let map = layout.shard_map();
            let mut want_rows = std::collections::BTreeSet::new();
            for (t, &rows) in layout.table_rows().iter().enumerate() {
                for row in 0..rows {
                    if lost.contains(&map.owner(TableId(t as u32), row)) {
                        want_rows.insert((TableId(t as u32), row));
                    }
                }
            }
            assert_eq!(rebuilt_rows, want_rows);
            let mut want_parity = std::collections::BTreeSet::new();
            for &s in &lost {
                for (slot, _, _) in layout.parity_slots(s).unwrap() {
                    want_parity.insert((s, slot));
                }
            }
            assert_eq!(rebuilt_parity, want_parity);
            let total_rows: u64 = plan.ranges().iter().map(|r| r.lost_rows).sum();
            assert_eq!(total_rows, want_rows.len() as u64);
            // Ranges are consecutive and ordered.
            for w in plan.ranges().windows(2) {
                assert!(w[0].last < w[1].first);
            }
        }
    }

    #[test]
    fn too_many_lost_servers_is_a_clear_error() {
        let (layout, code) = setup();
        let plan = RecoveryPlan::new(
            &layout,
            &code,
            &[ServerId(0), ServerId(1), ServerId(2)],
            RecoveryOptions::default(),
        );
        assert!(matches!(
            plan,
            Err(EcError::TooManyErasures {
                lost: 3,
                tolerated: 2
            })
        ));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (layout, code) = setup();
        let wrong = Code::new(CodeKind::Sum, 3, 1).unwrap();
        assert!(matches!(
            RecoveryPlan::new(&layout, &wrong, &[ServerId(0)], RecoveryOptions::default()),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            RecoveryPlan::new(&layout, &code, &[ServerId(6)], RecoveryOptions::default()),
            Err(EcError::UnknownServer { server: 6, .. })
        ));
        assert!(matches!(
            RecoveryPlan::new(
                &layout,
                &code,
                &[ServerId(0)],
                RecoveryOptions { lock_ranges: 0 }
            ),
            Err(EcError::InvalidParameters(_))
        ));
        let plan =
            RecoveryPlan::new(&layout, &code, &[ServerId(0)], RecoveryOptions::default()).unwrap();
        assert!(plan.tasks(1).is_err());
        assert!(matches!(
            degraded_read(&layout, &code, TableId(0), 1, &[ServerId(0)]),
            Err(EcError::InvalidDecode(_))
        ));
    }

    #[test]
    fn no_loss_means_an_empty_plan() {
        let (layout, code) = setup();
        let plan = RecoveryPlan::new(&layout, &code, &[], RecoveryOptions::default()).unwrap();
        assert!(plan.ranges().is_empty());
        assert_eq!(plan.all_tasks().count(), 0);
    }

    #[test]
    fn degraded_read_rebuilds_only_the_asked_row() {
        let (layout, code) = setup();
        // Row 5 of table 0 lives on server 5; server 0 is lost too.
        let task =
            degraded_read(&layout, &code, TableId(0), 5, &[ServerId(5), ServerId(0)]).unwrap();
        assert_eq!(task.rebuild.len(), 1);
        assert_eq!(task.rebuild[0].position, 2);
        assert!(matches!(
            task.rebuild[0].location,
            Location::Row { row: 5, .. }
        ));
        assert_eq!(task.method, DecodeMethod::Gf256Solve);
        assert_eq!(task.reads.len(), 3);
    }

    #[test]
    fn sum_plan_names_subtraction_and_reencode() {
        let layout = StripeLayout::new(4, 2, 1, &[8]).unwrap();
        let code = Code::new(CodeKind::Sum, 2, 1).unwrap();
        let plan =
            RecoveryPlan::new(&layout, &code, &[ServerId(1)], RecoveryOptions::default()).unwrap();
        let methods: std::collections::BTreeSet<_> = plan
            .all_tasks()
            .map(|t| format!("{:?}", t.method))
            .collect();
        assert!(methods.contains("SumSubtract"));
        assert!(methods.contains("SumEncode"));
    }

    /// The batches a cursor fills hold the plan's tasks, in order, field for field, whatever
    /// the batch size; a filter drops exactly the tasks none of whose lost members it keeps;
    /// a pushed task reads back as itself.
    #[test]
    fn cursor_batches_are_the_plan_s_tasks() {
        let (layout, code) = setup();
        let lost = [ServerId(4), ServerId(1)];
        let plan =
            RecoveryPlan::new(&layout, &code, &lost, RecoveryOptions { lock_ranges: 3 }).unwrap();
        let same = |b: &TaskBatch, i: usize, t: &RecoveryTask| {
            let (available, wanted) = &b.patterns()[b.pattern(i)];
            b.stripe(i) == t.stripe
                && b.reads(i) == t.reads.as_slice()
                && b.rebuild(i) == t.rebuild.as_slice()
                && *available == t.available
                && *wanted == t.wanted()
        };
        for max in [1, 2, 7, 1000] {
            for range in 0..plan.ranges().len() {
                let want: Vec<RecoveryTask> = plan.tasks(range).unwrap().collect();
                let mut cursor = plan.cursor(range).unwrap();
                let mut batch = TaskBatch::new();
                let mut got = 0;
                loop {
                    batch.clear();
                    let more = cursor.fill(max, |_| true, &mut batch);
                    assert!(batch.len() <= max);
                    for i in 0..batch.len() {
                        assert!(
                            same(&batch, i, &want[got + i]),
                            "task {} of range {range}",
                            got + i
                        );
                    }
                    got += batch.len();
                    if !more {
                        break;
                    }
                }
                assert_eq!(got, want.len());
            }
        }
        // Keep only parities on server 4: the tasks that rebuild one.
        let keep = |m: &StripeMember| {
            m.server == ServerId(4) && matches!(m.location, Location::Parity { .. })
        };
        let want: Vec<RecoveryTask> = plan
            .tasks(0)
            .unwrap()
            .filter(|t| t.rebuild.iter().any(keep))
            .collect();
        assert!(!want.is_empty() && want.len() < plan.ranges()[0].stripes as usize);
        let mut batch = TaskBatch::new();
        let mut cursor = plan.cursor(0).unwrap();
        while cursor.fill(usize::MAX, keep, &mut batch) {}
        assert_eq!(batch.len(), want.len());
        for (i, t) in want.iter().enumerate() {
            assert!(same(&batch, i, t));
        }
        let task =
            degraded_read(&layout, &code, TableId(0), 5, &[ServerId(5), ServerId(0)]).unwrap();
        let mut one = TaskBatch::new();
        one.push(&task);
        one.push(&task);
        assert_eq!(one.patterns().len(), 1);
        assert!(same(&one, 1, &task));
    }
}

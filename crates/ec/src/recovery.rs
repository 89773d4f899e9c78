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

use crate::layout::{Location, StripeId, StripeLayout, StripeMember};
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
    // The decoder's choice: data before parity, lowest positions first.
    let reads: Vec<StripeMember> = available.iter().take(k).map(|&p| members[p]).collect();
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
            let task = build_task(layout, code.kind(), stripe, &lost, None)?;
            let r = &mut ranges[range];
            r.last = stripe;
            r.stripes += 1;
            for m in &task.rebuild {
                match m.location {
                    Location::Parity { .. } => r.lost_parities += 1,
                    _ => r.lost_rows += 1,
                }
            }
            r.reads += task.stored_reads() as u64;
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

    /// The tasks of lock range `range`, in stripe order.
    pub fn tasks(&self, range: usize) -> Result<impl Iterator<Item = RecoveryTask> + '_, EcError> {
        let r = self.ranges.get(range).ok_or_else(|| {
            EcError::InvalidParameters(format!(
                "lock range {range} does not exist (the plan has {})",
                self.ranges.len()
            ))
        })?;
        Ok(self
            .layout
            .affected_stripes_from(&self.lost, r.first)?
            .take(r.stripes as usize)
            .filter_map(move |stripe| {
                // Validated when the plan was built: every affected stripe decodes.
                build_task(&self.layout, self.kind, stripe, &self.lost, None).ok()
            }))
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
}

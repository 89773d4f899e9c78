//! CPR's prioritized partial saves (cpr.txt §4.2): which rows of a shard a save writes when
//! only a share `r` of them fits.
//!
//! A [`PriorityTracker`] watches one server's updates (the owner feeds it from the update
//! path, as DECK's [`crate::deck::Tracker`] is fed) and, at a save, picks at most
//! `ceil(r * rows)` rows of every prioritized table by one of three rules:
//! - **MFU** (most frequently used): a 4-byte counter per row, incremented on every update of
//!   the row and cleared when the row is saved; the rows with the highest counts win (§4.2,
//!   "CPR-MFU"). Memory: 4 bytes per row.
//! - **SSU** (sub-sampled used): only every `period`-th update of a table is looked at, and the
//!   rows it touched go into a list of at most `ceil(r * rows)` entries; when the list is full,
//!   one of the full list and the newcomer is discarded at random, so rows that come back
//!   often are the likeliest to be in it (the paper's "high-pass filter"). The list is what is
//!   saved. Memory: 4 bytes per list entry plus a membership bit per row. The paper samples
//!   data points; a server sees whole updates (one per push, rows already deduplicated), so
//!   here the sampling unit is the update.
//! - **SCAR** (largest change, Qiao et al. as CPR §4.2 describes it): the rows whose values
//!   moved furthest (squared L2 distance) from what was last saved win. The update path only
//!   sets a dirty bit per row; the distances are computed at the save, for dirty rows only,
//!   against a copy of every row's values as last saved. That copy is SCAR's memory cost (the
//!   paper's "100% of the embedding tables", values only here: optimizer state is not
//!   compared), and keeping the distances out of the update path keeps pushes as cheap as
//!   MFU's.
//!
//! Ties are broken by row id, so a selection is a pure function of the updates seen (and, for
//! SSU, of the seed): a deterministic run saves the same rows every time.
//!
//! Tables the caller does not prioritize (the paper prioritizes the 7 largest tables and saves
//! the others whole, §5.1) have no state here; the caller saves them whole.
//!
//! The tracker works in local row indices (`0..rows` of the shard); mapping to global ids is
//! the caller's.
//!
//! Apart from the rule, the tracker *measures* what the saves leave out, for the PLS that
//! counts what was saved (CPR Eq. 3 per row): [`PriorityTracker::cover`] counts, per row of a
//! prioritized table, the updates since the newest save that held the row, and every row
//! update of the server; [`PriorityTracker::take_coverage`] reports both at a prioritized
//! save ([`Coverage`]). A row of a table saved whole is covered by every save. The counters are
//! 4 bytes a row, measurement only ([`PriorityTracker::memory_bytes`] leaves them out).
//!
//! ```
//! use ftrec_ckpt::cpr::{Priority, PriorityConfig, PriorityTracker, RowsView, TableSpec};
//! use ftrec_core::TableId;
//!
//! let cfg = PriorityConfig { priority: Priority::Mfu, r: 0.25, ssu_period: 2, seed: 1 };
//! let t = TableId(0);
//! let mut tracker = PriorityTracker::new(cfg, &[TableSpec { table: t, rows: 8, dim: 1 }]).unwrap();
//! for update in [&[1u64, 5][..], &[5], &[5, 6], &[6]] {
//!     tracker.record(t, update.iter().copied());
//! }
//! let values = vec![0.0f32; 8];
//! let view = RowsView { data: &values, words: 1, dim: 1 };
//! assert_eq!(tracker.select(t, view), vec![5, 6]); // 2 of 8 rows: the two most used
//! ```

use std::collections::BTreeMap;

use ftrec_core::rng::SplitMix;
use ftrec_core::TableId;
use serde::{Deserialize, Serialize};

use crate::error::{CkptError, Result};

/// Key of the marker a prioritized save's manifest carries in [`crate::Manifest::extra`]: the
/// checkpoint is delta-shaped (its rows apply on top of its parent), but holds the rows its
/// priority rule chose rather than every row touched since the parent.
pub const MANIFEST_KEY: &str = "cpr";

/// What a prioritized save's manifest records about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrioritizedMeta {
    /// The rule that chose the rows.
    pub priority: Priority,
    /// The share of each prioritized table's rows it may hold.
    pub r: f64,
}

impl PrioritizedMeta {
    pub fn of(m: &crate::Manifest) -> Option<PrioritizedMeta> {
        m.extra
            .get(MANIFEST_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    pub fn store_in(&self, m: &mut crate::Manifest) {
        m.extra.insert(
            MANIFEST_KEY.into(),
            serde_json::to_value(self).expect("meta serializes"),
        );
    }
}

/// Which rows a prioritized save prefers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Most frequently used since last saved.
    Mfu,
    /// Sub-sampled used.
    Ssu,
    /// Largest change since last saved.
    Scar,
}

impl Priority {
    pub fn name(self) -> &'static str {
        match self {
            Priority::Mfu => "mfu",
            Priority::Ssu => "ssu",
            Priority::Scar => "scar",
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Priority {
    type Err = CkptError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mfu" => Ok(Priority::Mfu),
            "ssu" => Ok(Priority::Ssu),
            "scar" => Ok(Priority::Scar),
            _ => Err(CkptError::InvalidArgument(format!(
                "priority {s:?} is not mfu, ssu or scar"
            ))),
        }
    }
}

/// How a tracker chooses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PriorityConfig {
    pub priority: Priority,
    /// Share of a table's rows one save may write, in (0, 1] (CPR §5.1: 0.125).
    pub r: f64,
    /// SSU: look at every `ssu_period`-th update of a table (CPR §5.1: 2).
    pub ssu_period: u32,
    /// SSU: seed of the random discards.
    pub seed: u64,
}

impl PriorityConfig {
    pub fn validate(&self) -> Result<()> {
        if !(self.r.is_finite() && self.r > 0.0 && self.r <= 1.0) {
            return Err(CkptError::InvalidArgument(format!(
                "prioritized share r = {} must be in (0, 1]",
                self.r
            )));
        }
        if self.ssu_period == 0 {
            return Err(CkptError::InvalidArgument(
                "SSU sampling period must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Rows one save writes of a table shard of `rows` rows: `ceil(r * rows)`, at least 1.
    pub fn budget(&self, rows: u64) -> usize {
        ((self.r * rows as f64).ceil() as usize).clamp(1, rows.max(1) as usize)
    }
}

/// One prioritized table shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    pub table: TableId,
    /// Rows of the shard (local indices `0..rows`).
    pub rows: u64,
    /// Embedding values per row (SCAR compares these).
    pub dim: usize,
}

/// A table shard's rows as stored: row `i` is `data[i * words..(i + 1) * words]`, its values
/// the first `dim` words.
#[derive(Debug, Clone, Copy)]
pub struct RowsView<'a> {
    pub data: &'a [f32],
    pub words: usize,
    pub dim: usize,
}

impl RowsView<'_> {
    #[inline]
    fn values(&self, i: usize) -> Option<&[f32]> {
        self.data.get(i * self.words..i * self.words + self.dim)
    }
}

#[derive(Debug)]
enum Kind {
    Mfu {
        counts: Vec<u32>,
    },
    Ssu {
        list: Vec<u32>,
        member: Vec<u64>,
        updates: u64,
        rng: SplitMix,
    },
    Scar {
        dirty: Vec<u64>,
        /// Values of every row as last saved, `dim` per row.
        saved: Vec<f32>,
    },
}

#[derive(Debug)]
struct TableState {
    rows: u64,
    dim: usize,
    budget: usize,
    kind: Kind,
}

#[inline]
fn bit(bits: &[u64], i: usize) -> bool {
    bits[i >> 6] & (1 << (i & 63)) != 0
}

#[inline]
fn set_bit(bits: &mut [u64], i: usize) {
    bits[i >> 6] |= 1 << (i & 63);
}

#[inline]
fn clear_bit(bits: &mut [u64], i: usize) {
    bits[i >> 6] &= !(1 << (i & 63));
}

/// Squared L2 distance of two value slices.
#[inline]
fn dist2(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = x - y;
            d * d
        })
        .sum()
}

/// Keep the `k` best of `cands` (higher score first, then lower id), returned sorted by id.
fn top_k<S: Copy>(
    mut cands: Vec<(S, u32)>,
    k: usize,
    better: impl Fn(&S, &S) -> std::cmp::Ordering,
) -> Vec<u64> {
    let order = |a: &(S, u32), b: &(S, u32)| better(&a.0, &b.0).then(a.1.cmp(&b.1));
    if cands.len() > k {
        if k == 0 {
            return Vec::new();
        }
        cands.select_nth_unstable_by(k - 1, order);
        cands.truncate(k);
    }
    let mut ids: Vec<u64> = cands.into_iter().map(|(_, i)| i as u64).collect();
    ids.sort_unstable();
    ids
}

/// What a server's prioritized save leaves out (see the module docs): written beside the
/// save's files, read by the coordinator for the PLS that counts what was saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Step of the save that took the previous report (`None`: none since this tracker
    /// started, a fresh server or a replacement).
    pub since_step: Option<u64>,
    /// Step of this save.
    pub step: u64,
    /// Row updates of the server (every table) since `since_step` (or since it started).
    pub updates: u64,
    /// Updates of prioritized rows since the newest save that held each row, summed over the
    /// rows, once this save's rows count as saved: what a loss right after it would lose.
    pub uncovered: u64,
}

impl Coverage {
    /// The file of server `server`'s report in its checkpoint's directory.
    pub fn file_name(server: u32) -> String {
        format!("cpr-coverage-{server}.json")
    }

    /// The report as its file holds it.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a coverage report serializes")
    }

    /// A report read back from its file.
    pub fn from_json(bytes: &[u8]) -> Result<Coverage> {
        serde_json::from_slice(bytes)
            .map_err(|e| CkptError::InvalidArgument(format!("a CPR coverage report: {e}")))
    }
}

/// Priority state of one server's prioritized tables (see the module docs).
#[derive(Debug)]
pub struct PriorityTracker {
    cfg: PriorityConfig,
    tables: BTreeMap<TableId, TableState>,
    /// Per prioritized table, updates of each row since the newest save that held it.
    pending: BTreeMap<TableId, Vec<u32>>,
    /// The sum of `pending`.
    uncovered: u64,
    /// Row updates of every table since the last report, and that report's step.
    updates: u64,
    since_step: Option<u64>,
}

impl PriorityTracker {
    /// A tracker for `tables`. SCAR starts from all-zero saved values: call
    /// [`PriorityTracker::reset`] with the shard's values before the first update (the state a
    /// restore falls back to, the initial one, is then "saved").
    pub fn new(cfg: PriorityConfig, tables: &[TableSpec]) -> Result<Self> {
        cfg.validate()?;
        let mut out = BTreeMap::new();
        for (i, t) in tables.iter().enumerate() {
            if t.rows > u32::MAX as u64 {
                return Err(CkptError::InvalidArgument(format!(
                    "table {} has {} rows on this server; prioritized saves handle up to 2^32",
                    t.table.0, t.rows
                )));
            }
            let rows = t.rows as usize;
            let words = rows.div_ceil(64);
            let budget = cfg.budget(t.rows);
            let kind = match cfg.priority {
                Priority::Mfu => Kind::Mfu {
                    counts: vec![0; rows],
                },
                Priority::Ssu => Kind::Ssu {
                    list: Vec::with_capacity(budget),
                    member: vec![0; words],
                    updates: 0,
                    rng: SplitMix::keyed(
                        cfg.seed,
                        0x55_5355,
                        t.table.0 as u64 ^ ((i as u64) << 32),
                    ),
                },
                Priority::Scar => Kind::Scar {
                    dirty: vec![0; words],
                    saved: vec![0.0; rows * t.dim],
                },
            };
            if out
                .insert(
                    t.table,
                    TableState {
                        rows: t.rows,
                        dim: t.dim,
                        budget,
                        kind,
                    },
                )
                .is_some()
            {
                return Err(CkptError::InvalidArgument(format!(
                    "table {} listed twice",
                    t.table.0
                )));
            }
        }
        let pending = out
            .iter()
            .map(|(&t, st)| (t, vec![0u32; st.rows as usize]))
            .collect();
        Ok(PriorityTracker {
            cfg,
            tables: out,
            pending,
            uncovered: 0,
            updates: 0,
            since_step: None,
        })
    }

    /// The update path's measurement (every table, not only prioritized ones): local rows
    /// `rows` of `table` got one update each.
    #[inline]
    pub fn cover(&mut self, table: TableId, rows: impl IntoIterator<Item = u64>) {
        match self.pending.get_mut(&table) {
            None => self.updates += rows.into_iter().count() as u64,
            Some(p) => {
                for i in rows {
                    self.updates += 1;
                    if let Some(c) = p.get_mut(i as usize) {
                        *c = c.saturating_add(1);
                        self.uncovered += 1;
                    }
                }
            }
        }
    }

    /// At a prioritized save of `step`, once its rows are [`PriorityTracker::saved`]: what it
    /// leaves out, and the row updates since the previous report (whose window then starts
    /// over).
    pub fn take_coverage(&mut self, step: u64) -> Coverage {
        let c = Coverage {
            since_step: self.since_step,
            step,
            updates: self.updates,
            uncovered: self.uncovered,
        };
        self.updates = 0;
        self.since_step = Some(step);
        c
    }

    fn uncover(&mut self, table: TableId, rows: &[u64]) {
        if let Some(p) = self.pending.get_mut(&table) {
            for &i in rows {
                if let Some(c) = p.get_mut(i as usize) {
                    self.uncovered -= u64::from(*c);
                    *c = 0;
                }
            }
        }
    }

    pub fn config(&self) -> &PriorityConfig {
        &self.cfg
    }

    /// Whether `table` is prioritized (tracked here).
    pub fn tracks(&self, table: TableId) -> bool {
        self.tables.contains_key(&table)
    }

    /// The most rows one save writes of `table`.
    pub fn budget(&self, table: TableId) -> Option<usize> {
        self.tables.get(&table).map(|t| t.budget)
    }

    /// The update path: local rows `rows` of `table` got one update each. Untracked tables
    /// and rows outside the shard are ignored (the update path has validated them already).
    #[inline]
    pub fn record(&mut self, table: TableId, rows: impl IntoIterator<Item = u64>) {
        let Some(t) = self.tables.get_mut(&table) else {
            return;
        };
        let n = t.rows;
        match &mut t.kind {
            Kind::Mfu { counts } => {
                for i in rows {
                    if i < n {
                        let c = &mut counts[i as usize];
                        *c = c.saturating_add(1);
                    }
                }
            }
            Kind::Ssu {
                list,
                member,
                updates,
                rng,
            } => {
                *updates += 1;
                if !updates.is_multiple_of(self.cfg.ssu_period as u64) {
                    return;
                }
                for i in rows {
                    if i >= n || bit(member, i as usize) {
                        continue;
                    }
                    if list.len() < t.budget {
                        list.push(i as u32);
                        set_bit(member, i as usize);
                        continue;
                    }
                    // Full: one of the `budget + 1` candidates goes, uniformly at random.
                    let j = (rng.next_u64() % (t.budget as u64 + 1)) as usize;
                    if j < list.len() {
                        clear_bit(member, list[j] as usize);
                        list[j] = i as u32;
                        set_bit(member, i as usize);
                    }
                }
            }
            Kind::Scar { dirty, .. } => {
                for i in rows {
                    if i < n {
                        set_bit(dirty, i as usize);
                    }
                }
            }
        }
    }

    /// The rows of `table` a prioritized save writes now: local indices, sorted, at most
    /// [`PriorityTracker::budget`]. `view` is the shard as it is now (SCAR measures the
    /// change). Rows with nothing new since last saved are never chosen.
    pub fn select(&self, table: TableId, view: RowsView<'_>) -> Vec<u64> {
        let Some(t) = self.tables.get(&table) else {
            return Vec::new();
        };
        match &t.kind {
            Kind::Mfu { counts } => {
                let cands: Vec<(u32, u32)> = counts
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(i, &c)| (c, i as u32))
                    .collect();
                top_k(cands, t.budget, |a, b| b.cmp(a))
            }
            Kind::Ssu { list, .. } => {
                let mut ids: Vec<u64> = list.iter().map(|&i| i as u64).collect();
                ids.sort_unstable();
                ids
            }
            Kind::Scar { dirty, saved } => {
                let mut cands = Vec::new();
                for (w, &word) in dirty.iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        let i = w * 64 + bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        let Some(now) = view.values(i) else { continue };
                        let d = dist2(now, &saved[i * t.dim..(i + 1) * t.dim]);
                        if d > 0.0 {
                            cands.push((d, i as u32));
                        }
                    }
                }
                top_k(cands, t.budget, |a, b| b.total_cmp(a))
            }
        }
    }

    /// Rows `rows` (local, as [`PriorityTracker::select`] returned them) of `table` were
    /// copied into a save: their priority starts over (MFU clears their counters, SSU drops
    /// them from its list, SCAR remembers their values from `view` as saved).
    pub fn saved(&mut self, table: TableId, rows: &[u64], view: RowsView<'_>) {
        self.uncover(table, rows);
        let Some(t) = self.tables.get_mut(&table) else {
            return;
        };
        let n = t.rows;
        match &mut t.kind {
            Kind::Mfu { counts } => {
                for &i in rows.iter().filter(|&&i| i < n) {
                    counts[i as usize] = 0;
                }
            }
            Kind::Ssu { list, member, .. } => {
                for &i in rows.iter().filter(|&&i| i < n) {
                    clear_bit(member, i as usize);
                }
                list.retain(|&i| bit(member, i as usize));
            }
            Kind::Scar { dirty, saved } => {
                let dim = t.dim;
                for &i in rows.iter().filter(|&&i| i < n) {
                    let i = i as usize;
                    clear_bit(dirty, i);
                    if let Some(v) = view.values(i) {
                        saved[i * dim..(i + 1) * dim].copy_from_slice(v);
                    }
                }
            }
        }
    }

    /// Every row of `table` is saved as it is in `view` (a full save, or a restore loaded it):
    /// all priority starts over.
    pub fn reset(&mut self, table: TableId, view: RowsView<'_>) {
        if let Some(p) = self.pending.get_mut(&table) {
            self.uncovered -= p.iter().map(|&c| u64::from(c)).sum::<u64>();
            p.fill(0);
        }
        let Some(t) = self.tables.get_mut(&table) else {
            return;
        };
        match &mut t.kind {
            Kind::Mfu { counts } => counts.fill(0),
            Kind::Ssu { list, member, .. } => {
                list.clear();
                member.fill(0);
            }
            Kind::Scar { dirty, saved } => {
                dirty.fill(0);
                let dim = t.dim;
                for i in 0..t.rows as usize {
                    if let Some(v) = view.values(i) {
                        saved[i * dim..(i + 1) * dim].copy_from_slice(v);
                    }
                }
            }
        }
    }

    /// Bytes the tracker holds (counters, lists, bitmaps, saved values).
    pub fn memory_bytes(&self) -> u64 {
        self.tables
            .values()
            .map(|t| match &t.kind {
                Kind::Mfu { counts } => counts.capacity() * 4,
                Kind::Ssu { list, member, .. } => list.capacity() * 4 + member.capacity() * 8,
                Kind::Scar { dirty, saved } => dirty.capacity() * 8 + saved.capacity() * 4,
            } as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement by hand: table 3 (8 rows) prioritized, table 4 not. Updates: rows 1, 5
    /// of table 3 and 3 rows of table 4, then row 5 twice more: 7 row updates, 4 of them to
    /// prioritized rows; after a save of row 5 only row 1's one update is uncovered. A reset
    /// (a full save) covers everything.
    #[test]
    fn coverage_counts_updates_since_the_newest_save_holding_each_row() {
        let mut t = PriorityTracker::new(
            PriorityConfig {
                priority: Priority::Mfu,
                r: 0.25,
                ssu_period: 1,
                seed: 1,
            },
            &[TableSpec {
                table: T,
                rows: 8,
                dim: 1,
            }],
        )
        .unwrap();
        let values = vec![0.0f32; 8];
        let view = RowsView {
            data: &values,
            words: 1,
            dim: 1,
        };
        t.cover(T, [1, 5]);
        t.cover(TableId(4), [0, 1, 2]);
        t.cover(T, [5]);
        t.cover(T, [5]);
        t.saved(T, &[5], view);
        assert_eq!(
            t.take_coverage(10),
            Coverage {
                since_step: None,
                step: 10,
                updates: 7,
                uncovered: 1
            }
        );
        t.cover(T, [1, 2]);
        t.saved(T, &[1], view);
        assert_eq!(
            t.take_coverage(20),
            Coverage {
                since_step: Some(10),
                step: 20,
                updates: 2,
                uncovered: 1
            }
        );
        t.reset(T, view);
        assert_eq!(t.take_coverage(30).uncovered, 0);
        let c = t.take_coverage(25);
        assert_eq!(Coverage::from_json(&c.to_json()).unwrap(), c);
        assert!(Coverage::from_json(b"{}").is_err());
        // Rows outside the shard are not counted as prioritized rows.
        t.cover(T, [99]);
        assert_eq!(
            t.take_coverage(40),
            Coverage {
                since_step: Some(25),
                step: 40,
                updates: 1,
                uncovered: 0
            }
        );
    }

    const T: TableId = TableId(3);

    fn tracker(priority: Priority, r: f64, rows: u64, dim: usize) -> PriorityTracker {
        let cfg = PriorityConfig {
            priority,
            r,
            ssu_period: 1,
            seed: 9,
        };
        PriorityTracker::new(
            cfg,
            &[TableSpec {
                table: T,
                rows,
                dim,
            }],
        )
        .unwrap()
    }

    fn view(data: &[f32], dim: usize) -> RowsView<'_> {
        RowsView {
            data,
            words: dim + 1,
            dim,
        }
    }

    #[test]
    fn budget_is_ceil_r_rows_at_least_one() {
        let cfg = PriorityConfig {
            priority: Priority::Mfu,
            r: 0.125,
            ssu_period: 2,
            seed: 0,
        };
        assert_eq!(cfg.budget(120_000), 15_000);
        assert_eq!(cfg.budget(9), 2);
        assert_eq!(cfg.budget(3), 1);
        assert_eq!(cfg.budget(0), 1);
        assert!(PriorityConfig { r: 0.0, ..cfg }.validate().is_err());
        assert!(PriorityConfig { r: 1.5, ..cfg }.validate().is_err());
        assert!(PriorityConfig {
            ssu_period: 0,
            ..cfg
        }
        .validate()
        .is_err());
    }

    /// CPR §4.2, MFU by hand: counts row 3: 5, rows 1, 2, 7: 4, row 9: 1; r = 0.3 of 10 rows
    /// = 3 rows: row 3, then the tie at 4 broken by id: rows 1 and 2. Saving them clears their
    /// counters, so the next pick is rows 7 and 9.
    #[test]
    fn mfu_picks_the_most_used_and_clears_saved_counters() {
        let mut t = tracker(Priority::Mfu, 0.3, 10, 2);
        for (row, n) in [(3u64, 5), (1, 4), (2, 4), (7, 4), (9, 1)] {
            for _ in 0..n {
                t.record(T, [row]);
            }
        }
        let data = vec![0.0; 30];
        assert_eq!(t.select(T, view(&data, 2)), vec![1, 2, 3]);
        t.saved(T, &[1, 2, 3], view(&data, 2));
        assert_eq!(t.select(T, view(&data, 2)), vec![7, 9]);
        // Out-of-range rows and untracked tables are ignored, not a panic.
        t.record(T, [10, 99]);
        t.record(TableId(0), [1]);
        assert_eq!(t.select(T, view(&data, 2)), vec![7, 9]);
        t.reset(T, view(&data, 2));
        assert!(t.select(T, view(&data, 2)).is_empty());
    }

    /// SCAR by hand (dim 2): row 0 moved by (3, 4) -> 25, row 2 by (1, 0) -> 1, row 3 by
    /// (0, 2) -> 4, row 1 was updated back to where it was -> 0 (nothing to save). Budget 2:
    /// rows 0 and 3; once they are saved, row 2.
    #[test]
    fn scar_picks_the_largest_changes_since_saved() {
        let mut t = tracker(Priority::Scar, 0.5, 4, 2);
        let mut data = vec![0.0f32; 12];
        for i in 0..4 {
            data[i * 3] = i as f32;
            data[i * 3 + 1] = -(i as f32);
            data[i * 3 + 2] = 7.0; // optimizer state: not compared
        }
        t.reset(T, view(&data, 2));
        assert!(t.select(T, view(&data, 2)).is_empty());
        data[0] += 3.0;
        data[1] += 4.0;
        data[6] += 1.0;
        data[10] += 2.0;
        data[5] = 99.0; // state of row 1 changed, values did not
        t.record(T, [0, 1, 2, 3]);
        assert_eq!(t.select(T, view(&data, 2)), vec![0, 3]);
        t.saved(T, &[0, 3], view(&data, 2));
        assert_eq!(t.select(T, view(&data, 2)), vec![2]);
        // A saved row that changes again competes with its new change only.
        data[0] += 0.5;
        t.record(T, [0]);
        assert_eq!(t.select(T, view(&data, 2)), vec![0, 2]);
        assert_eq!(t.memory_bytes(), 8 + 4 * 2 * 4);
    }

    /// SSU: every `period`-th update is looked at; the list never exceeds the budget, holds
    /// only rows the sampled updates touched, and rows that come back often are the likeliest
    /// to be in it.
    #[test]
    fn ssu_samples_updates_and_keeps_frequent_rows() {
        let cfg = PriorityConfig {
            priority: Priority::Ssu,
            r: 0.1,
            ssu_period: 2,
            seed: 4,
        };
        let mut t = PriorityTracker::new(
            cfg,
            &[TableSpec {
                table: T,
                rows: 1000,
                dim: 1,
            }],
        )
        .unwrap();
        let data = vec![0.0f32; 2000];
        let v = RowsView {
            data: &data,
            words: 2,
            dim: 1,
        };
        // Update 1 is skipped (period 2), update 2 is sampled.
        t.record(T, [500]);
        assert!(t.select(T, v).is_empty());
        t.record(T, [501]);
        assert_eq!(t.select(T, v), vec![501]);
        // 50 hot rows (0..50) in every update, 20 of the 950 cold ones at random (an update
        // touches fewer rows than the list holds, as on a real shard).
        let mut rng = SplitMix::new(77);
        for _ in 0..400 {
            let mut rows: Vec<u64> = (0..50).collect();
            for _ in 0..20 {
                rows.push(50 + rng.next_u64() % 950);
            }
            rows.sort_unstable();
            rows.dedup();
            t.record(T, rows.iter().copied());
        }
        let picked = t.select(T, v);
        assert_eq!(picked.len(), 100, "the list fills to its budget");
        let hot = picked.iter().filter(|&&i| i < 50).count();
        // Hot rows are 5% of the rows touched; in the list they are far more.
        assert!(hot >= 30, "only {hot} hot rows of 100");
        // Same seed, same updates: same list.
        let mut again = PriorityTracker::new(
            cfg,
            &[TableSpec {
                table: T,
                rows: 1000,
                dim: 1,
            }],
        )
        .unwrap();
        again.record(T, [500]);
        again.record(T, [501]);
        let mut rng = SplitMix::new(77);
        for _ in 0..400 {
            let mut rows: Vec<u64> = (0..50).collect();
            for _ in 0..20 {
                rows.push(50 + rng.next_u64() % 950);
            }
            rows.sort_unstable();
            rows.dedup();
            again.record(T, rows.iter().copied());
        }
        assert_eq!(again.select(T, v), picked);
        // Saved rows leave the list.
        t.saved(T, &picked[..10], v);
        let left = t.select(T, v);
        assert_eq!(left.len(), 90);
        assert!(left.iter().all(|i| !picked[..10].contains(i)));
    }

    #[test]
    fn bad_configs_and_tables_are_refused() {
        let cfg = PriorityConfig {
            priority: Priority::Mfu,
            r: 0.5,
            ssu_period: 1,
            seed: 0,
        };
        let spec = TableSpec {
            table: T,
            rows: 4,
            dim: 1,
        };
        assert!(PriorityTracker::new(cfg, &[spec, spec]).is_err());
        assert!("lru".parse::<Priority>().is_err());
        for p in [Priority::Mfu, Priority::Ssu, Priority::Scar] {
            assert_eq!(p.name().parse::<Priority>().unwrap(), p);
        }
    }
}

//! Stripes over the shard map, and where their parities live.
//!
//! # Stripes
//! [`ShardMap`] puts row `R` of table `t` on server `(R + t) mod n` at local index `R / n`, so
//! consecutive rows of a table sit on consecutive servers around the ring. Stripe `s` of table
//! `t` is rows `s*k .. s*k + k` (position `i` holds row `s*k + i`): `k` consecutive rows, hence
//! `k` different servers, and every server can name the stripe and position of its own row
//! `(t, local index L)` from `R = L*n + ((server - t) mod n)` alone. Since `k <= n`, a stripe
//! covers rows of at most two consecutive local-index groups `(t, L)` and `(t, L + 1)` (the
//! `n` rows of a group sit one per server). The last stripe of a table
//! whose row count is not a multiple of `k` is short: its missing positions are *absent*, read
//! as zeros and never stored.
//!
//! # Parity placement (ECRec §3.2, rotating parity)
//! The `r` parities of a stripe go to `r` of the `n - k` servers outside its data window. Which
//! ones follows a fixed pattern over a *rotation period* of `n` stripes (after `n` stripes every
//! data window has come back to where it started), chosen when the layout is built so that
//! - over every full period each server receives exactly `r` parity rows, whatever `n`, `k`,
//!   `r` (a fixed offset, such as the parity right after the data window as in ECRec Fig. 3,
//!   only works when `gcd(n, k) = 1`: otherwise the windows start at multiples of the gcd
//!   and the parities never reach the other servers);
//! - after any number of stripes of a table, per-server parity counts differ by at most
//!   [`StripeLayout::prefix_imbalance`], which is 1 whenever the data windows allow it (found by
//!   a bounded search) and otherwise the smallest bound the search could reach (2 in the
//!   configurations where 1 is impossible, e.g. `n = 6, k = 3, r = 2`).
//!
//! Table `t`'s stripe `s` uses pattern entry `s mod n` rotated by `t` (the shard map's offset).
//! On a server, a table's parity rows are numbered densely in stripe order (a [`ParitySlot`]):
//! parity rows of table `t` before stripe `s` on that server, computed in O(r) from per-period
//! occurrence lists, so a server can allocate its parity tables up front and address them
//! without a map.

use ftrec_core::{RowId, ServerId, ShardMap, TableId};

use crate::EcError;

/// Work budget (search nodes times servers squared) per bound tried by the placement search,
/// so that building a layout stays fast.
const SEARCH_WORK: u64 = 20_000_000;

/// Above this many servers the search is skipped for the closed-form rotation (even its
/// greedy first path costs `n^2 log n`).
const SEARCH_MAX_SERVERS: usize = 1024;

/// A stripe: its table and its index among that table's stripes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StripeId {
    pub table: TableId,
    pub index: u64,
}

/// A parity row's address on the server that holds it: the `index`-th parity row of `table`
/// on that server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParitySlot {
    pub table: TableId,
    pub index: u64,
}

/// What occupies one position of a stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// A data row (global row id and the owner's local index).
    Row {
        table: TableId,
        row: RowId,
        local: u64,
    },
    /// Parity `parity` of the stripe, stored in `slot` on its server.
    Parity { parity: usize, slot: ParitySlot },
    /// A position past the end of the table in a short last stripe: zeros, stored nowhere.
    Absent,
}

/// One position of a stripe and the server that holds it (for an absent position, the server
/// it would have been on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StripeMember {
    pub position: usize,
    pub server: ServerId,
    pub location: Location,
}

impl StripeMember {
    /// Whether this position is lost when `lost` servers are gone (absent rows never are).
    #[inline]
    pub fn is_lost(&self, lost: &[ServerId]) -> bool {
        !matches!(self.location, Location::Absent) && lost.contains(&self.server)
    }
}

/// The members of one table's period stripes (`0..n`) as at the first period: stripe
/// `q * n + v` of the table has period stripe `v`'s members moved by `q` periods, its data
/// rows by `q * n * k` (their local indices by `q * k`, their servers the same) and its parity
/// slots by `q * r` (as [`StripeLayout::members_into`] computes them). A rebuild walks every
/// affected stripe; this costs it one division a stripe instead of one per member.
#[derive(Debug, Clone)]
pub(crate) struct PeriodMembers {
    table: TableId,
    rows: u64,
    n: usize,
    k: usize,
    r: usize,
    /// `k + r` members per period stripe, data positions as rows whatever the table's size
    /// (a stripe's rows past the table's end are absent, decided per stripe).
    members: Vec<StripeMember>,
}

impl PeriodMembers {
    /// The table these are the members of.
    pub(crate) fn table(&self) -> TableId {
        self.table
    }

    /// [`StripeLayout::members_into`] of stripe `index` of the table.
    pub(crate) fn members_into(&self, index: u64, out: &mut Vec<StripeMember>) {
        out.clear();
        let n = self.n as u64;
        let (q, v) = (index / n, (index % n) as usize);
        let w = self.k + self.r;
        let rows = q * n * self.k as u64;
        let locals = q * self.k as u64;
        let slots = q * self.r as u64;
        for m in &self.members[v * w..(v + 1) * w] {
            let location = match m.location {
                Location::Row { table, row, local } if row + rows < self.rows => Location::Row {
                    table,
                    row: row + rows,
                    local: local + locals,
                },
                Location::Row { .. } | Location::Absent => Location::Absent,
                Location::Parity { parity, slot } => Location::Parity {
                    parity,
                    slot: ParitySlot {
                        table: slot.table,
                        index: slot.index + slots,
                    },
                },
            };
            out.push(StripeMember { location, ..*m });
        }
    }
}

/// Where a data row's redundancy lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowParities {
    pub stripe: StripeId,
    /// Position of the row in its stripe (`0..k`), the `position` argument of
    /// [`Code::apply_delta`](crate::Code::apply_delta).
    pub position: usize,
    /// Holder and slot of parity `j`, at index `j`.
    pub parities: Vec<(ServerId, ParitySlot)>,
}

/// The stripe layout of a whole model: `n` servers, `k` data and `r` parity rows per stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeLayout {
    map: ShardMap,
    n: usize,
    k: usize,
    r: usize,
    table_rows: Vec<u64>,
    /// `pattern[v * r + j]`: offset of parity `j` of period stripe `v` from the start of its
    /// data window, in `k..n`, ascending in `j`.
    pattern: Vec<u32>,
    /// `occurrence[y * r + m]`: the `m`-th period stripe with a parity on relative server `y`.
    occurrence: Vec<u32>,
    /// `holder_rel[v * r + j]`: relative server of parity `j` of period stripe `v`, and
    /// `holder_before[v * r + j]`: parity rows earlier stripes of the same period put there.
    /// Precomputed so that a row's parity holders cost a table lookup on the update path.
    holder_rel: Vec<u32>,
    holder_before: Vec<u32>,
    prefix_imbalance: u32,
}

impl StripeLayout {
    /// Stripes of `k` data rows and `r` parities over `servers` servers, for tables of
    /// `table_rows` rows. Needs `k >= 1`, `r >= 1` and `k + r <= servers` (the rows and
    /// parities of a stripe must sit on different servers, or one loss would take two).
    pub fn new(servers: u32, k: usize, r: usize, table_rows: &[u64]) -> Result<Self, EcError> {
        if k == 0 || r == 0 {
            return Err(EcError::InvalidParameters(format!(
                "a stripe layout needs k >= 1 and r >= 1, got k = {k}, r = {r}"
            )));
        }
        if k as u64 + r as u64 > u64::from(servers) {
            return Err(EcError::InvalidParameters(format!(
                "k + r = {} rows of a stripe need as many servers, but there are only {servers}",
                k + r
            )));
        }
        let map = ShardMap::new(servers).map_err(|e| EcError::InvalidParameters(e.to_string()))?;
        let n = servers as usize;
        let pattern = choose_pattern(n, k, r);
        let mut occurrence = vec![0u32; n * r];
        let mut counts = vec![0u32; n];
        let mut prefix_imbalance = 0;
        for v in 0..n {
            for j in 0..r {
                let y = (v * k + pattern[v * r + j] as usize) % n;
                occurrence[y * r + counts[y] as usize] = v as u32;
                counts[y] += 1;
            }
            prefix_imbalance = prefix_imbalance.max(spread(&counts));
        }
        debug_assert!(counts.iter().all(|&c| c as usize == r));
        let mut holder_rel = vec![0u32; n * r];
        let mut holder_before = vec![0u32; n * r];
        for v in 0..n {
            for j in 0..r {
                let y = (v * k + pattern[v * r + j] as usize) % n;
                holder_rel[v * r + j] = y as u32;
                holder_before[v * r + j] = occurrence[y * r..(y + 1) * r]
                    .iter()
                    .take_while(|&&o| (o as usize) < v)
                    .count() as u32;
            }
        }
        Ok(StripeLayout {
            map,
            n,
            k,
            r,
            table_rows: table_rows.to_vec(),
            pattern,
            occurrence,
            holder_rel,
            holder_before,
            prefix_imbalance,
        })
    }

    pub fn servers(&self) -> u32 {
        self.n as u32
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn r(&self) -> usize {
        self.r
    }

    pub fn shard_map(&self) -> ShardMap {
        self.map
    }

    pub fn tables(&self) -> usize {
        self.table_rows.len()
    }

    pub fn table_rows(&self) -> &[u64] {
        &self.table_rows
    }

    /// Stripes per rotation period: parity counts are exactly equal over each.
    pub fn period(&self) -> u64 {
        self.n as u64
    }

    /// Largest difference between two servers' parity counts over any prefix of a table's
    /// stripes (0 or 1 is perfect smoothing; see the module docs).
    pub fn prefix_imbalance(&self) -> u32 {
        self.prefix_imbalance
    }

    fn rows_of(&self, table: TableId) -> Result<u64, EcError> {
        self.table_rows
            .get(table.0 as usize)
            .copied()
            .ok_or(EcError::UnknownTable {
                table: table.0,
                tables: self.table_rows.len(),
            })
    }

    fn check_server(&self, server: ServerId) -> Result<(), EcError> {
        if (server.0 as usize) < self.n {
            Ok(())
        } else {
            Err(EcError::UnknownServer {
                server: server.0,
                servers: self.n as u32,
            })
        }
    }

    fn check_stripe(&self, stripe: StripeId) -> Result<u64, EcError> {
        let stripes = self.stripes(stripe.table)?;
        if stripe.index < stripes {
            Ok(stripes)
        } else {
            Err(EcError::StripeOutOfRange {
                table: stripe.table.0,
                stripe: stripe.index,
                stripes,
            })
        }
    }

    /// Number of stripes of `table`.
    pub fn stripes(&self, table: TableId) -> Result<u64, EcError> {
        Ok(self.rows_of(table)?.div_ceil(self.k as u64))
    }

    /// Total stripes over all tables.
    pub fn total_stripes(&self) -> u64 {
        self.table_rows
            .iter()
            .map(|r| r.div_ceil(self.k as u64))
            .sum()
    }

    /// Relative server `(server - table) mod n`.
    #[inline]
    fn relative(&self, table: TableId, server: usize) -> usize {
        let n = self.n;
        (server % n + n - table.0 as usize % n) % n
    }

    #[inline]
    fn absolute(&self, table: TableId, relative: u64) -> ServerId {
        let n = self.n as u64;
        ServerId(((relative % n + u64::from(table.0) % n) % n) as u32)
    }

    /// Offset of parity `j` of stripe `index` from the stripe's data window.
    #[inline]
    fn offset(&self, index: u64, j: usize) -> u64 {
        u64::from(self.pattern[(index % self.n as u64) as usize * self.r + j])
    }

    /// Parity rows of `table` that stripes before `index` put on relative server `y`.
    #[inline]
    fn parities_before(&self, index: u64, y: usize) -> u64 {
        let n = self.n as u64;
        let v = (index % n) as u32;
        let before_in_period = self.occurrence[y * self.r..(y + 1) * self.r]
            .iter()
            .take_while(|&&o| o < v)
            .count();
        (index / n) * self.r as u64 + before_in_period as u64
    }

    /// The stripe of data row `row` of `table` and its position in it.
    pub fn stripe_of(&self, table: TableId, row: RowId) -> Result<(StripeId, usize), EcError> {
        let rows = self.rows_of(table)?;
        if row >= rows {
            return Err(EcError::RowOutOfRange {
                table: table.0,
                row,
                rows,
            });
        }
        let k = self.k as u64;
        Ok((
            StripeId {
                table,
                index: row / k,
            },
            (row % k) as usize,
        ))
    }

    /// The stripe of the row a server holds at `local` index of `table`.
    pub fn stripe_of_local(
        &self,
        server: ServerId,
        table: TableId,
        local: u64,
    ) -> Result<(StripeId, usize), EcError> {
        self.check_server(server)?;
        self.stripe_of(table, self.map.global_row(table, server, local))
    }

    /// Server and slot of parity `parity` (`0..r`) of `stripe`.
    pub fn parity_holder(
        &self,
        stripe: StripeId,
        parity: usize,
    ) -> Result<(ServerId, ParitySlot), EcError> {
        self.check_stripe(stripe)?;
        if parity >= self.r {
            return Err(EcError::PositionOutOfRange {
                position: self.k + parity,
                width: self.k + self.r,
            });
        }
        Ok(self.parity_holder_unchecked(stripe, parity))
    }

    fn parity_holder_unchecked(&self, stripe: StripeId, parity: usize) -> (ServerId, ParitySlot) {
        // Stripe `q * n + v` has its parities where period stripe `v` has them (the data
        // window moves by `n * k`, a multiple of `n`), after `q` whole periods of `r` each.
        let n = self.n as u64;
        let (q, v) = (stripe.index / n, (stripe.index % n) as usize);
        let e = v * self.r + parity;
        let slot = ParitySlot {
            table: stripe.table,
            index: q * self.r as u64 + u64::from(self.holder_before[e]),
        };
        let t = u64::from(stripe.table.0) % n;
        let mut server = u64::from(self.holder_rel[e]) + t;
        if server >= n {
            server -= n;
        }
        (ServerId(server as u32), slot)
    }

    /// [`StripeLayout::row_parities`] without allocating, for the update path: the position
    /// of data row `row` of `table` in its stripe, with its `r` parity holders written into
    /// `holders` (cleared first; parity `j` at index `j`).
    pub fn row_parities_into(
        &self,
        table: TableId,
        row: RowId,
        holders: &mut Vec<(ServerId, ParitySlot)>,
    ) -> Result<(StripeId, usize), EcError> {
        let (stripe, position) = self.stripe_of(table, row)?;
        holders.clear();
        holders.extend((0..self.r).map(|j| self.parity_holder_unchecked(stripe, j)));
        Ok((stripe, position))
    }

    /// Which parity of data row `row` of `table` `server` holds, if any: the row's position
    /// in its stripe, the parity index and the slot (what a parity holder checks and
    /// resolves for every delta it receives).
    pub fn parity_on(
        &self,
        table: TableId,
        row: RowId,
        server: ServerId,
    ) -> Result<Option<(usize, usize, ParitySlot)>, EcError> {
        let (stripe, position) = self.stripe_of(table, row)?;
        Ok((0..self.r).find_map(|j| {
            let (holder, slot) = self.parity_holder_unchecked(stripe, j);
            (holder == server).then_some((position, j, slot))
        }))
    }

    /// Holders and slots of all `r` parities of `stripe`, parity `j` at index `j`.
    pub fn parity_holders(&self, stripe: StripeId) -> Result<Vec<(ServerId, ParitySlot)>, EcError> {
        self.check_stripe(stripe)?;
        Ok((0..self.r)
            .map(|j| self.parity_holder_unchecked(stripe, j))
            .collect())
    }

    /// For a data row: its stripe, its position and where its parities live (what a server
    /// needs to propagate the row's differences).
    pub fn row_parities(&self, table: TableId, row: RowId) -> Result<RowParities, EcError> {
        let (stripe, position) = self.stripe_of(table, row)?;
        Ok(RowParities {
            stripe,
            position,
            parities: self.parity_holders(stripe)?,
        })
    }

    /// All `k + r` positions of `stripe`: data (or absent) positions, then parities.
    pub fn members(&self, stripe: StripeId) -> Result<Vec<StripeMember>, EcError> {
        self.check_stripe(stripe)?;
        Ok(self.members_unchecked(stripe))
    }

    /// [`StripeLayout::members`] for a stripe known to exist.
    pub(crate) fn members_unchecked(&self, stripe: StripeId) -> Vec<StripeMember> {
        let mut out = Vec::with_capacity(self.k + self.r);
        self.members_into(stripe, &mut out);
        out
    }

    /// [`StripeLayout::members`] of a stripe known to exist, written into `out` (cleared
    /// first) without allocating once `out` has room for `k + r`: the rebuild's per-stripe
    /// path.
    pub(crate) fn members_into(&self, stripe: StripeId, out: &mut Vec<StripeMember>) {
        out.clear();
        let rows = self.table_rows[stripe.table.0 as usize];
        let k = self.k as u64;
        for i in 0..self.k {
            let row = stripe.index * k + i as u64;
            let server = self.absolute(stripe.table, row % self.n as u64);
            let location = if row < rows {
                Location::Row {
                    table: stripe.table,
                    row,
                    local: self.map.local_index(stripe.table, row),
                }
            } else {
                Location::Absent
            };
            out.push(StripeMember {
                position: i,
                server,
                location,
            });
        }
        for j in 0..self.r {
            let (server, slot) = self.parity_holder_unchecked(stripe, j);
            out.push(StripeMember {
                position: self.k + j,
                server,
                location: Location::Parity { parity: j, slot },
            });
        }
    }

    /// The members of `table`'s period stripes, from which [`PeriodMembers::members_into`]
    /// gives any stripe of the table's without a division per member.
    pub(crate) fn period_members(&self, table: TableId) -> PeriodMembers {
        let (n, k) = (self.n as u64, self.k as u64);
        let mut members = Vec::with_capacity(self.n * (self.k + self.r));
        for v in 0..n {
            for i in 0..self.k {
                let row = v * k + i as u64;
                members.push(StripeMember {
                    position: i,
                    server: self.absolute(table, row % n),
                    location: Location::Row {
                        table,
                        row,
                        local: self.map.local_index(table, row),
                    },
                });
            }
            for j in 0..self.r {
                let (server, slot) = self.parity_holder_unchecked(StripeId { table, index: v }, j);
                members.push(StripeMember {
                    position: self.k + j,
                    server,
                    location: Location::Parity { parity: j, slot },
                });
            }
        }
        PeriodMembers {
            table,
            rows: self.table_rows[table.0 as usize],
            n: self.n,
            k: self.k,
            r: self.r,
            members,
        }
    }

    /// Parity rows of `table` that `server` holds (the size of its parity table for `table`).
    pub fn parity_rows_on(&self, server: ServerId, table: TableId) -> Result<u64, EcError> {
        self.check_server(server)?;
        let stripes = self.stripes(table)?;
        Ok(self.parities_before(stripes, self.relative(table, server.0 as usize)))
    }

    /// Parity rows `server` holds, per table (index = table id).
    pub fn parity_rows_per_table(&self, server: ServerId) -> Result<Vec<u64>, EcError> {
        (0..self.tables())
            .map(|t| self.parity_rows_on(server, TableId(t as u32)))
            .collect()
    }

    /// Parity rows each server holds over all tables (index = server id).
    pub fn parity_counts(&self) -> Vec<u64> {
        (0..self.n as u32)
            .map(|s| {
                self.parity_rows_per_table(ServerId(s))
                    .map(|v| v.iter().sum())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The stripe and parity index stored in `slot` on `server`.
    pub fn parity_slot_stripe(
        &self,
        server: ServerId,
        slot: ParitySlot,
    ) -> Result<(StripeId, usize), EcError> {
        let slots = self.parity_rows_on(server, slot.table)?;
        if slot.index >= slots {
            return Err(EcError::ParitySlotOutOfRange {
                server: server.0,
                table: slot.table.0,
                slot: slot.index,
                slots,
            });
        }
        let y = self.relative(slot.table, server.0 as usize);
        let r = self.r as u64;
        let v = u64::from(self.occurrence[y * self.r + (slot.index % r) as usize]);
        let index = (slot.index / r) * self.n as u64 + v;
        let stripe = StripeId {
            table: slot.table,
            index,
        };
        let k = self.k as u64;
        let j = (0..self.r)
            .find(|&j| (index * k + self.offset(index, j)) % self.n as u64 == y as u64)
            .ok_or_else(|| {
                EcError::InvalidParameters(format!("layout tables disagree on slot {slot:?}"))
            })?;
        Ok((stripe, j))
    }

    /// Every parity slot `server` holds, in (table, slot) order, with its stripe and parity
    /// index.
    pub fn parity_slots(
        &self,
        server: ServerId,
    ) -> Result<impl Iterator<Item = (ParitySlot, StripeId, usize)> + '_, EcError> {
        let counts = self.parity_rows_per_table(server)?;
        Ok(counts.into_iter().enumerate().flat_map(move |(t, count)| {
            (0..count).map(move |index| {
                let slot = ParitySlot {
                    table: TableId(t as u32),
                    index,
                };
                let (stripe, j) = self
                    .parity_slot_stripe(server, slot)
                    .expect("slot index below the server's count for the table");
                (slot, stripe, j)
            })
        }))
    }

    /// Stripes of one period (indices `0..n`, relative to `table`'s rotation) that have a
    /// member on a lost server, ignoring absent positions (handled by the caller for the
    /// last, short stripe).
    fn affected_in_period(&self, table: TableId, lost: &[ServerId]) -> Vec<u64> {
        let mut lost_rel = vec![false; self.n];
        for s in lost {
            lost_rel[self.relative(table, s.0 as usize)] = true;
        }
        let k = self.k as u64;
        let n = self.n as u64;
        (0..n)
            .filter(|&v| {
                (0..k).any(|i| lost_rel[((v * k + i) % n) as usize])
                    || (0..self.r).any(|j| lost_rel[((v * k + self.offset(v, j)) % n) as usize])
            })
            .collect()
    }

    fn check_lost(&self, lost: &[ServerId]) -> Result<(), EcError> {
        for &s in lost {
            self.check_server(s)?;
        }
        Ok(())
    }

    /// Stripes with at least one stored member (data row or parity) on a lost server, in
    /// (table, index) order, starting at `from`.
    pub fn affected_stripes_from<'a>(
        &'a self,
        lost: &'a [ServerId],
        from: StripeId,
    ) -> Result<AffectedStripes<'a>, EcError> {
        self.check_lost(lost)?;
        let mut it = AffectedStripes {
            layout: self,
            lost,
            table: from.table.0 as usize,
            start: from.index,
            stripes: 0,
            period: Vec::new(),
            q: 0,
            at: 0,
        };
        it.enter_table();
        Ok(it)
    }

    /// Stripes with at least one stored member on a lost server, in (table, index) order.
    pub fn affected_stripes<'a>(
        &'a self,
        lost: &'a [ServerId],
    ) -> Result<AffectedStripes<'a>, EcError> {
        self.affected_stripes_from(
            lost,
            StripeId {
                table: TableId(0),
                index: 0,
            },
        )
    }

    /// Whether `stripe` has a stored member on a lost server.
    pub fn is_affected(&self, stripe: StripeId, lost: &[ServerId]) -> bool {
        self.check_stripe(stripe).is_ok()
            && self
                .members_unchecked(stripe)
                .iter()
                .any(|m| m.is_lost(lost))
    }

    /// Number of stripes with a stored member on a lost server, without enumerating them.
    pub fn affected_count(&self, lost: &[ServerId]) -> Result<u64, EcError> {
        self.check_lost(lost)?;
        let n = self.n as u64;
        let mut total = 0;
        for t in 0..self.tables() {
            let table = TableId(t as u32);
            let stripes = self.stripes(table)?;
            if stripes == 0 {
                continue;
            }
            let period = self.affected_in_period(table, lost);
            // All stripes but the last are full; the last is checked member by member.
            let full = stripes - 1;
            total += (full / n) * period.len() as u64
                + period.iter().filter(|&&v| v < full % n).count() as u64;
            total += u64::from(self.is_affected(StripeId { table, index: full }, lost));
        }
        Ok(total)
    }

    /// The most stored members any stripe loses when `lost` servers are gone.
    pub fn max_lost_per_stripe(&self, lost: &[ServerId]) -> Result<usize, EcError> {
        self.check_lost(lost)?;
        let mut worst = 0;
        for t in 0..self.tables() {
            let table = TableId(t as u32);
            let stripes = self.stripes(table)?;
            // The pattern repeats every n stripes; the short last stripe loses no more than
            // the full stripe with the same pattern entry.
            for index in 0..stripes.min(self.n as u64) {
                let members = self.members_unchecked(StripeId { table, index });
                worst = worst.max(members.iter().filter(|m| m.is_lost(lost)).count());
            }
        }
        Ok(worst)
    }
}

/// Iterator over the stripes a set of lost servers touches (see
/// [`StripeLayout::affected_stripes`]); walks only the affected entries of each period.
#[derive(Debug, Clone)]
pub struct AffectedStripes<'a> {
    layout: &'a StripeLayout,
    lost: &'a [ServerId],
    table: usize,
    /// First stripe index to report in the current table.
    start: u64,
    stripes: u64,
    /// Affected period entries of the current table.
    period: Vec<u64>,
    /// Current period and position in `period`.
    q: u64,
    at: usize,
}

impl AffectedStripes<'_> {
    fn enter_table(&mut self) {
        if self.table < self.layout.tables() {
            let table = TableId(self.table as u32);
            self.stripes = self.layout.stripes(table).unwrap_or(0);
            self.period = self.layout.affected_in_period(table, self.lost);
            let n = self.layout.n as u64;
            self.q = self.start / n;
            self.at = 0;
        }
    }
}

impl Iterator for AffectedStripes<'_> {
    type Item = StripeId;

    fn next(&mut self) -> Option<StripeId> {
        let n = self.layout.n as u64;
        while self.table < self.layout.tables() {
            let table = TableId(self.table as u32);
            while self.q * n < self.stripes && !self.period.is_empty() {
                if self.at == self.period.len() {
                    self.at = 0;
                    self.q += 1;
                    continue;
                }
                let index = self.q * n + self.period[self.at];
                self.at += 1;
                if index < self.start || index >= self.stripes {
                    continue;
                }
                let stripe = StripeId { table, index };
                // Only the last stripe can be short; its absent positions are never lost.
                if index + 1 < self.stripes || self.layout.is_affected(stripe, self.lost) {
                    return Some(stripe);
                }
            }
            self.table += 1;
            self.start = 0;
            self.enter_table();
        }
        None
    }
}

fn spread(counts: &[u32]) -> u32 {
    counts.iter().max().copied().unwrap_or(0) - counts.iter().min().copied().unwrap_or(0)
}

/// Parity offsets for one rotation period (`n` stripes, `r` offsets in `k..n` each).
///
/// Tries, for bounds 1, 2, 3 on the per-prefix spread, a depth-first search that fills the
/// least-loaded eligible servers first (so its first path is the greedy placement) and
/// requires every server to end the period with exactly `r` parities. If the budget runs out
/// for every bound, falls back to a closed-form rotation that is always exactly balanced.
fn choose_pattern(n: usize, k: usize, r: usize) -> Vec<u32> {
    if n > SEARCH_MAX_SERVERS {
        return closed_form_pattern(n, k, r);
    }
    for bound in 1..=3 {
        let mut search = Search {
            n,
            k,
            r,
            bound,
            // Enough for the greedy first path plus backtracking, within the work budget.
            budget: SEARCH_WORK / (n * n) as u64 + 2 * n as u64,
            counts: vec![0; n],
            pattern: vec![0; n * r],
        };
        if search.run(0) {
            return search.pattern;
        }
    }
    closed_form_pattern(n, k, r)
}

/// The fallback rotation: within each group of `n / g` stripes (`g = gcd(n, k)`) the data
/// windows start at every multiple of `g` once, so a fixed offset gives every server in one
/// residue class mod `g` one parity per parity index; shifting the offset by one for each of
/// the `g` groups walks the parities through all residue classes. Offsets wrap within the
/// `n - k` servers outside the window, which is a multiple of `g`, so the shift mod `g` is
/// preserved and the period ends exactly balanced.
fn closed_form_pattern(n: usize, k: usize, r: usize) -> Vec<u32> {
    let g = gcd(n, k);
    let d = n - k;
    let mut pattern = vec![0u32; n * r];
    for v in 0..n {
        let shift = (v / (n / g)) % g;
        let mut offs: Vec<u32> = (0..r).map(|j| (k + (shift + j) % d) as u32).collect();
        offs.sort_unstable();
        pattern[v * r..(v + 1) * r].copy_from_slice(&offs);
    }
    pattern
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

struct Search {
    n: usize,
    k: usize,
    r: usize,
    bound: u32,
    budget: u64,
    counts: Vec<u32>,
    pattern: Vec<u32>,
}

impl Search {
    fn run(&mut self, v: usize) -> bool {
        let (n, k, r) = (self.n, self.k, self.r);
        if v == n {
            return self.counts.iter().all(|&c| c as usize == r);
        }
        let base = v * k;
        // Eligible offsets, least-loaded server first, then nearest the window.
        let mut cand: Vec<usize> = (k..n).collect();
        cand.sort_by_key(|&off| (self.counts[(base + off) % n], off));
        let mut pick: Vec<usize> = (0..r).collect();
        loop {
            if self.budget == 0 {
                return false;
            }
            self.budget -= 1;
            for &p in &pick {
                self.counts[(base + cand[p]) % n] += 1;
            }
            let ok = spread(&self.counts) <= self.bound
                && pick
                    .iter()
                    .all(|&p| self.counts[(base + cand[p]) % n] as usize <= r);
            if ok {
                let mut offs: Vec<u32> = pick.iter().map(|&p| cand[p] as u32).collect();
                offs.sort_unstable();
                self.pattern[v * r..(v + 1) * r].copy_from_slice(&offs);
                if self.run(v + 1) {
                    return true;
                }
            }
            for &p in &pick {
                self.counts[(base + cand[p]) % n] -= 1;
            }
            if !next_combination(&mut pick, cand.len()) {
                return false;
            }
        }
    }
}

/// Advance `pick` (strictly increasing indices below `len`) to the next combination in
/// lexicographic order; false when it was the last.
fn next_combination(pick: &mut [usize], len: usize) -> bool {
    let r = pick.len();
    let mut i = r;
    while i > 0 {
        i -= 1;
        if pick[i] < len - r + i {
            pick[i] += 1;
            for j in i + 1..r {
                pick[j] = pick[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_members_give_every_stripe_s_members() {
        for (servers, k, r, rows) in [
            (5, 2, 1, vec![40u64, 7, 3, 1, 0, 123]),
            (6, 3, 2, vec![40, 7, 3]),
            (7, 4, 2, vec![100, 9, 8, 29]),
            (3, 2, 1, vec![1, 2, 5, 6]),
        ] {
            let layout = StripeLayout::new(servers, k, r, &rows).unwrap();
            let (mut want, mut got) = (Vec::new(), Vec::new());
            for t in 0..rows.len() {
                let table = TableId(t as u32);
                let period = layout.period_members(table);
                assert_eq!(period.table(), table);
                for index in 0..layout.stripes(table).unwrap() {
                    layout.members_into(StripeId { table, index }, &mut want);
                    period.members_into(index, &mut got);
                    assert_eq!(
                        got, want,
                        "{servers} servers, k {k}, r {r}, table {t}, stripe {index}"
                    );
                }
            }
        }
    }

    /// Parity rows per server over the first `stripes` stripes of table `t`.
    fn counts(layout: &StripeLayout, table: TableId, stripes: u64) -> Vec<u64> {
        let mut c = vec![0u64; layout.servers() as usize];
        for index in 0..stripes {
            for j in 0..layout.r() {
                let (s, _) = layout.parity_holder_unchecked(StripeId { table, index }, j);
                c[s.0 as usize] += 1;
            }
        }
        c
    }

    /// Whether any placement at all (not only periodic ones) keeps every prefix of the first
    /// `n` stripes within spread 1: exhaustive, no heuristics, independent of `Search`.
    fn spread_one_possible(n: usize, k: usize, r: usize) -> bool {
        fn rec(v: usize, n: usize, k: usize, r: usize, c: &mut Vec<u32>) -> bool {
            if v == n {
                return true;
            }
            let eligible: Vec<usize> = (k..n).map(|off| (v * k + off) % n).collect();
            let mut pick: Vec<usize> = (0..r).collect();
            loop {
                for &p in &pick {
                    c[eligible[p]] += 1;
                }
                if spread(c) <= 1 && rec(v + 1, n, k, r, c) {
                    return true;
                }
                for &p in &pick {
                    c[eligible[p]] -= 1;
                }
                if !next_combination(&mut pick, eligible.len()) {
                    return false;
                }
            }
        }
        rec(0, n, k, r, &mut vec![0; n])
    }

    // ECRec §3.2: rotating parity placement gives every server the same number of parities;
    // ours does so for every server count, including those where n shares a factor with k.
    #[test]
    fn parity_counts_are_balanced_for_every_server_count() {
        for n in 3u32..=12 {
            for k in 1..=5usize {
                for r in 1..=3usize {
                    if k + r > n as usize {
                        continue;
                    }
                    let periods = 3u64;
                    let rows = periods * u64::from(n) * k as u64;
                    let tables = vec![rows; n as usize + 1];
                    let layout = StripeLayout::new(n, k, r, &tables).unwrap();
                    let bound = layout.prefix_imbalance();
                    assert!(bound <= 2, "n={n} k={k} r={r}: bound {bound}");
                    if bound > 1 {
                        assert!(
                            !spread_one_possible(n as usize, k, r),
                            "n={n} k={k} r={r}: spread 1 was possible"
                        );
                    }
                    for t in 0..=n {
                        let table = TableId(t);
                        for stripes in 0..=periods * u64::from(n) {
                            let c = counts(&layout, table, stripes);
                            let spread = c.iter().max().unwrap() - c.iter().min().unwrap();
                            assert!(
                                spread <= u64::from(bound),
                                "n={n} k={k} r={r} t={t} after {stripes} stripes: {c:?}"
                            );
                            if stripes % layout.period() == 0 {
                                assert!(c.iter().all(|&x| x == c[0]), "unequal period {c:?}");
                            }
                        }
                        // The O(1) counts agree with the enumeration.
                        let all = counts(&layout, table, layout.stripes(table).unwrap());
                        for s in 0..n {
                            assert_eq!(
                                layout.parity_rows_on(ServerId(s), table).unwrap(),
                                all[s as usize]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn large_clusters_are_balanced_too() {
        for (n, k, r) in [
            (64u32, 8usize, 2usize),
            (100, 10, 4),
            (48, 6, 3),
            (37, 36, 1),
        ] {
            let layout = StripeLayout::new(n, k, r, &[u64::from(n) * k as u64]).unwrap();
            let c = counts(&layout, TableId(0), u64::from(n));
            assert!(c.iter().all(|&x| x == r as u64), "n={n} k={k} r={r}: {c:?}");
        }
    }

    #[test]
    fn closed_form_rotation_is_exactly_balanced() {
        for n in 2..=16usize {
            for k in 1..n {
                for r in 1..=n - k {
                    let p = closed_form_pattern(n, k, r);
                    let mut c = vec![0u32; n];
                    for v in 0..n {
                        for j in 0..r {
                            let off = p[v * r + j] as usize;
                            assert!((k..n).contains(&off));
                            c[(v * k + off) % n] += 1;
                        }
                    }
                    assert!(
                        c.iter().all(|&x| x as usize == r),
                        "n={n} k={k} r={r}: {c:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn lookups_agree_with_the_shard_map_and_each_other() {
        let tables = [1u64, 2, 3, 17, 40, 101];
        for (n, k, r) in [(5u32, 2usize, 1usize), (6, 3, 2), (7, 4, 3), (4, 1, 3)] {
            let layout = StripeLayout::new(n, k, r, &tables).unwrap();
            let map = layout.shard_map();
            let mut seen_slots = std::collections::BTreeSet::new();
            for (t, &rows) in tables.iter().enumerate() {
                let table = TableId(t as u32);
                assert_eq!(layout.stripes(table).unwrap(), rows.div_ceil(k as u64));
                for row in 0..rows {
                    let owner = map.owner(table, row);
                    let local = map.local_index(table, row);
                    let (stripe, pos) = layout.stripe_of(table, row).unwrap();
                    assert_eq!(
                        layout.stripe_of_local(owner, table, local).unwrap(),
                        (stripe, pos)
                    );
                    let members = layout.members(stripe).unwrap();
                    assert_eq!(members[pos].server, owner);
                    assert_eq!(members[pos].location, Location::Row { table, row, local });
                    let rp = layout.row_parities(table, row).unwrap();
                    assert_eq!((rp.stripe, rp.position), (stripe, pos));
                    for (j, &(server, slot)) in rp.parities.iter().enumerate() {
                        assert_eq!(
                            layout.parity_slot_stripe(server, slot).unwrap(),
                            (stripe, j)
                        );
                        assert_eq!(members[k + j].server, server);
                    }
                }
                for index in 0..layout.stripes(table).unwrap() {
                    let stripe = StripeId { table, index };
                    let members = layout.members(stripe).unwrap();
                    let mut servers: Vec<u32> = members.iter().map(|m| m.server.0).collect();
                    servers.sort_unstable();
                    servers.dedup();
                    assert_eq!(
                        servers.len(),
                        k + r,
                        "two members of {stripe:?} share a server"
                    );
                    for m in &members[k..] {
                        if let Location::Parity { slot, .. } = m.location {
                            assert!(seen_slots.insert((m.server, slot)), "slot used twice");
                        }
                    }
                }
            }
            // Slots are dense per (server, table) and enumerate back to their stripes.
            let mut enumerated = std::collections::BTreeSet::new();
            for s in 0..n {
                let server = ServerId(s);
                for (slot, stripe, j) in layout.parity_slots(server).unwrap() {
                    assert_eq!(layout.parity_holder(stripe, j).unwrap(), (server, slot));
                    enumerated.insert((server, slot));
                }
            }
            assert_eq!(enumerated, seen_slots);
            let total: u64 = layout.parity_counts().iter().sum();
            assert_eq!(total, layout.total_stripes() * r as u64);
        }
    }

    #[test]
    fn affected_stripes_match_a_brute_force_scan() {
        let tables = [1u64, 5, 23, 64];
        let layout = StripeLayout::new(7, 3, 2, &tables).unwrap();
        for lost in [vec![], vec![ServerId(0)], vec![ServerId(2), ServerId(6)]] {
            let mut want = Vec::new();
            for (t, _) in tables.iter().enumerate() {
                let table = TableId(t as u32);
                for index in 0..layout.stripes(table).unwrap() {
                    let stripe = StripeId { table, index };
                    if layout
                        .members(stripe)
                        .unwrap()
                        .iter()
                        .any(|m| m.is_lost(&lost))
                    {
                        want.push(stripe);
                    }
                }
            }
            let got: Vec<StripeId> = layout.affected_stripes(&lost).unwrap().collect();
            assert_eq!(got, want);
            assert_eq!(layout.affected_count(&lost).unwrap(), want.len() as u64);
            if want.len() > 3 {
                let from = want[3];
                let tail: Vec<StripeId> =
                    layout.affected_stripes_from(&lost, from).unwrap().collect();
                assert_eq!(tail, want[3..]);
            }
        }
    }

    #[test]
    fn short_last_stripe_has_absent_positions() {
        let layout = StripeLayout::new(5, 4, 1, &[6]).unwrap();
        let members = layout
            .members(StripeId {
                table: TableId(0),
                index: 1,
            })
            .unwrap();
        assert!(matches!(members[1].location, Location::Row { row: 5, .. }));
        assert_eq!(members[2].location, Location::Absent);
        assert_eq!(members[3].location, Location::Absent);
        // Rows 4, 5 sit on servers 4, 0; absent positions 2, 3 would be on servers 1, 2.
        assert_eq!(
            (members[2].server, members[3].server),
            (ServerId(1), ServerId(2))
        );
        // Losing server 1 touches stripe 0 (its row 1) but not stripe 1.
        let affected: Vec<StripeId> = layout.affected_stripes(&[ServerId(1)]).unwrap().collect();
        assert_eq!(
            affected,
            vec![StripeId {
                table: TableId(0),
                index: 0
            }]
        );
        assert_eq!(layout.affected_count(&[ServerId(1)]).unwrap(), 1);
    }

    #[test]
    fn bad_parameters_and_ids_are_errors() {
        assert!(matches!(
            StripeLayout::new(4, 3, 2, &[10]),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            StripeLayout::new(4, 0, 1, &[10]),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            StripeLayout::new(0, 1, 1, &[10]),
            Err(EcError::InvalidParameters(_))
        ));
        let layout = StripeLayout::new(4, 2, 1, &[10]).unwrap();
        assert!(matches!(
            layout.stripe_of(TableId(1), 0),
            Err(EcError::UnknownTable {
                table: 1,
                tables: 1
            })
        ));
        assert!(matches!(
            layout.stripe_of(TableId(0), 10),
            Err(EcError::RowOutOfRange {
                row: 10,
                rows: 10,
                ..
            })
        ));
        let past = StripeId {
            table: TableId(0),
            index: 5,
        };
        assert!(matches!(
            layout.members(past),
            Err(EcError::StripeOutOfRange {
                stripe: 5,
                stripes: 5,
                ..
            })
        ));
        assert!(matches!(
            layout.parity_holder(
                StripeId {
                    table: TableId(0),
                    index: 0
                },
                1
            ),
            Err(EcError::PositionOutOfRange { .. })
        ));
        assert!(matches!(
            layout.parity_rows_on(ServerId(4), TableId(0)),
            Err(EcError::UnknownServer {
                server: 4,
                servers: 4
            })
        ));
        let slots = layout.parity_rows_on(ServerId(0), TableId(0)).unwrap();
        assert!(matches!(
            layout.parity_slot_stripe(
                ServerId(0),
                ParitySlot {
                    table: TableId(0),
                    index: slots
                }
            ),
            Err(EcError::ParitySlotOutOfRange { .. })
        ));
        assert!(layout.affected_stripes(&[ServerId(9)]).is_err());
    }

    /// The update-path lookups agree with the general ones and with the slot numbering read
    /// back from the server side, for every row of a few tables in many shapes.
    #[test]
    fn update_path_lookups_match_the_general_ones() {
        let mut holders = Vec::new();
        for (n, k, r) in [
            (3, 2, 1),
            (4, 2, 2),
            (6, 3, 2),
            (6, 4, 1),
            (7, 3, 3),
            (9, 6, 3),
        ] {
            let layout = StripeLayout::new(n, k, r, &[50, 7, 1, 23]).unwrap();
            for t in 0..4u32 {
                let table = TableId(t);
                for row in 0..layout.table_rows()[t as usize] {
                    let want = layout.row_parities(table, row).unwrap();
                    let (stripe, position) =
                        layout.row_parities_into(table, row, &mut holders).unwrap();
                    assert_eq!((stripe, position), (want.stripe, want.position));
                    assert_eq!(holders, want.parities, "n={n} k={k} r={r} t={t} row={row}");
                    for s in 0..n {
                        let on = layout.parity_on(table, row, ServerId(s)).unwrap();
                        let j = want.parities.iter().position(|&(h, _)| h == ServerId(s));
                        assert_eq!(on, j.map(|j| (position, j, want.parities[j].1)));
                        if let Some((_, j, slot)) = on {
                            assert_eq!(
                                layout.parity_slot_stripe(ServerId(s), slot).unwrap(),
                                (stripe, j)
                            );
                        }
                    }
                }
                assert!(matches!(
                    layout.parity_on(table, layout.table_rows()[t as usize], ServerId(0)),
                    Err(EcError::RowOutOfRange { .. })
                ));
            }
        }
    }
}

//! The parameter server's state and every operation on it, without IO.
//!
//! A [`Server`] holds, for every table, the rows the [`ShardMap`] assigns to it (stored densely
//! by local index, values then optimizer state), and a contiguous range of the dense blocks
//! with their optimizer state. Workers pull values and push gradients; the optimizer runs here,
//! on the server, as in the XDL-style systems ECRec and CPR build on (ECRec §2.1, §3.1;
//! CPR §2.1: embedding tables are partitioned over "Emb PS" nodes and trained there).
//!
//! Every request is validated completely before anything changes: a refused request leaves
//! the state exactly as it was.

use std::collections::BTreeMap;
use std::ops::Range;

use ftrec_core::{
    dense::all_finite, prefetch::AHEAD, DenseParams, EmbeddingTable, ModelDigest, Optimizer,
    Preset, RowId, RowLayout, ServerId, ShardMap, SparseGradAccumulator, TableId, DENSE_BLOCK,
};

use crate::observer::{PushObserver, RowImages, UpdateOrigin};
use crate::update::{ApplyReport, DenseBlock, RowBlock, RowRequest, ServerInfo, Update};
use crate::PsError;

/// Resource limits a server enforces on requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest single update (push or staged contribution), in wire bytes.
    pub max_update_bytes: u64,
    /// Largest total of staged, not yet committed contributions, in wire bytes.
    pub max_staged_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_update_bytes: 256 << 20,
            max_staged_bytes: 1 << 30,
        }
    }
}

/// Everything a server needs to build its shard.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub server: ServerId,
    pub shard_map: ShardMap,
    /// Rows of every whole table.
    pub table_rows: Vec<u64>,
    pub dim: usize,
    pub sparse_optimizer: Optimizer,
    pub dense_optimizer: Optimizer,
    /// Seed of the embedding initialisation ([`EmbeddingTable::init_rows`]).
    pub seed: u64,
    pub init_scale: f32,
    pub limits: Limits,
}

impl ServerConfig {
    /// Server `server` of `shard_map` for a preset's tables and optimizers.
    pub fn from_preset(preset: &Preset, shard_map: ShardMap, server: ServerId, seed: u64) -> Self {
        ServerConfig {
            server,
            shard_map,
            table_rows: preset.table_rows.clone(),
            dim: preset.dim,
            sparse_optimizer: Optimizer::new(preset.sparse_optimizer, preset.sparse_lr),
            dense_optimizer: Optimizer::new(preset.dense_optimizer, preset.dense_lr),
            seed,
            init_scale: preset.init_scale,
            limits: Limits::default(),
        }
    }

    /// Check the configuration; a bad value names itself.
    pub fn validate(&self) -> Result<(), PsError> {
        let bad = |m: String| Err(PsError::InvalidConfig(m));
        if self.server.0 >= self.shard_map.servers() {
            return bad(format!(
                "server {} does not exist in a shard map of {} servers",
                self.server.0,
                self.shard_map.servers()
            ));
        }
        if self.table_rows.is_empty() {
            return bad("the model needs at least one table".into());
        }
        if let Some(t) = self.table_rows.iter().position(|&r| r == 0) {
            return bad(format!("table {t} has no rows"));
        }
        if self.dim == 0 {
            return bad("embedding dim must be positive".into());
        }
        if !(self.init_scale.is_finite() && self.init_scale >= 0.0) {
            return bad(format!("init scale {} is out of range", self.init_scale));
        }
        self.sparse_optimizer.validate()?;
        self.dense_optimizer.validate()?;
        Ok(())
    }
}

/// Global block indices of the dense blocks that `server` holds: the blocks are split into
/// `servers` contiguous, balanced ranges (contiguous so that a worker's dense pull and push to
/// one server is one slice).
pub fn dense_block_range(dense_len: u64, servers: u32, server: ServerId) -> Range<u64> {
    let blocks = dense_len.div_ceil(DENSE_BLOCK as u64);
    let n = servers.max(1) as u64;
    let s = server.0 as u64;
    (s * blocks / n)..((s + 1) * blocks / n)
}

/// Global value indices of the dense values that `server` holds.
pub fn dense_value_range(dense_len: u64, servers: u32, server: ServerId) -> Range<u64> {
    let b = dense_block_range(dense_len, servers, server);
    let block = DENSE_BLOCK as u64;
    (b.start * block).min(dense_len)..(b.end * block).min(dense_len)
}

/// Sums one or more updates per row and per dense block before the optimizer runs.
///
/// Sparse sums use the core accumulator, in arrival order (updates in the given order, rows
/// within an update in their order), the same fold a trainer uses for one batch. Dense sums
/// start from the first contribution itself rather than from zero, so a single push reaches
/// the optimizer bit for bit as sent (`0.0 + -0.0` would turn a negative zero positive).
struct Accumulator {
    dim: usize,
    tables: BTreeMap<TableId, SparseGradAccumulator>,
    dense_sum: Vec<f32>,
    dense_touched: Vec<bool>,
}

impl Accumulator {
    fn new(dim: usize) -> Self {
        Accumulator {
            dim,
            tables: BTreeMap::new(),
            dense_sum: Vec::new(),
            dense_touched: Vec::new(),
        }
    }

    /// Add an update already validated against a server whose dense values start at
    /// `dense_lo` and number `dense_len`.
    fn add(&mut self, update: &Update, dense_lo: u64, dense_len: usize) {
        let dim = self.dim;
        for part in &update.sparse {
            let acc = self
                .tables
                .entry(part.table)
                .or_insert_with(|| SparseGradAccumulator::new(dim));
            for (i, &row) in part.rows.iter().enumerate() {
                acc.add(row, &part.grads[i * dim..(i + 1) * dim]);
            }
        }
        if update.dense.iter().any(|d| !d.grads.is_empty()) && self.dense_sum.is_empty() {
            // Keeps the capacity of a reused buffer.
            self.dense_sum.resize(dense_len, 0.0);
            self.dense_touched = vec![false; dense_len.div_ceil(DENSE_BLOCK)];
        }
        for part in &update.dense {
            let lo = (part.offset - dense_lo) as usize;
            for (b, chunk) in part.grads.chunks(DENSE_BLOCK).enumerate() {
                let start = lo + b * DENSE_BLOCK;
                let block = start / DENSE_BLOCK;
                let dst = &mut self.dense_sum[start..start + chunk.len()];
                if self.dense_touched[block] {
                    for (d, g) in dst.iter_mut().zip(chunk) {
                        *d += g;
                    }
                } else {
                    dst.copy_from_slice(chunk);
                    self.dense_touched[block] = true;
                }
            }
        }
    }
}

/// Rows of one table as [`Server::prepare_step`] computed them: `new` holds `words` words per
/// row (values then optimizer state), aligned with `rows` (sorted, distinct).
///
/// The words before the step are not copied: they stay in the table, unchanged until the
/// prepared step is installed (the caller holds the server for the step between its prepare
/// and its commit, ECRec §3.5), and [`Server::prepared_row_pairs`] reads them from there.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedRows {
    pub table: TableId,
    pub rows: Vec<RowId>,
    pub words: usize,
    pub new: Vec<f32>,
}

impl Default for PreparedRows {
    fn default() -> Self {
        PreparedRows {
            table: TableId(0),
            rows: Vec::new(),
            words: 0,
            new: Vec::new(),
        }
    }
}

/// One dense block of a prepared step: its summed gradient is
/// `PreparedStep::dense_grads[at..at + len]`. Its new words are not precomputed: the
/// optimizer is deterministic, so applying the gradient at commit to the words the prepare
/// saw gives the same words (the replicas apply the same gradient, ECRec §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedDense {
    /// Global block index.
    pub block: u64,
    pub at: usize,
    pub len: usize,
}

/// A deterministic step computed but not applied: phase 1 of the two-phase commit.
///
/// A prepared step's buffers can be reused for the next one ([`Server::prepare_update_into`]),
/// so a node in steady state allocates nothing per update for them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparedStep {
    pub step: u64,
    pub workers: Vec<u32>,
    /// Touched tables, in table order; only the first `rows_used` entries belong to this step
    /// (the rest are spare buffers kept for reuse).
    pub rows: Vec<PreparedRows>,
    pub rows_used: usize,
    pub dense: Vec<PreparedDense>,
    /// Summed dense gradients of the touched blocks, block after block.
    pub dense_grads: Vec<f32>,
}

impl PreparedStep {
    /// The rows of this step, per touched table.
    pub fn tables(&self) -> &[PreparedRows] {
        &self.rows[..self.rows_used]
    }

    /// The gradient of dense block `d` of this step.
    pub fn dense_grad(&self, d: &PreparedDense) -> &[f32] {
        &self.dense_grads[d.at..d.at + d.len]
    }

    /// Forget the step, keeping the buffers.
    pub fn clear(&mut self) {
        self.step = 0;
        self.workers.clear();
        self.rows_used = 0;
        self.dense.clear();
        self.dense_grads.clear();
    }
}

/// The prepared rows of one table of a base step, walked alongside rows in ascending order
/// (both sides are sorted): the words `base` prepared for a row, if it prepared it.
struct Overlay<'a> {
    rows: &'a [RowId],
    new: &'a [f32],
    words: usize,
    at: usize,
}

impl<'a> Overlay<'a> {
    fn of(base: Option<&'a PreparedStep>, table: TableId, words: usize) -> Self {
        let p = base.and_then(|b| {
            b.tables()
                .iter()
                .find(|p| p.table == table && p.words == words)
        });
        Overlay {
            rows: p.map_or(&[][..], |p| &p.rows[..]),
            new: p.map_or(&[][..], |p| &p.new[..]),
            words,
            at: 0,
        }
    }

    /// The base's words of `row`; rows must be asked for in ascending order.
    fn row(&mut self, row: RowId) -> Option<&'a [f32]> {
        while self.at < self.rows.len() && self.rows[self.at] < row {
            self.at += 1;
        }
        (self.rows.get(self.at) == Some(&row))
            .then(|| &self.new[self.at * self.words..(self.at + 1) * self.words])
    }
}

/// One parameter server's shard of the model.
pub struct Server {
    config: ServerConfig,
    layout: RowLayout,
    tables: Vec<EmbeddingTable>,
    dense_len: u64,
    dense_range: Range<u64>,
    dense_blocks: Range<u64>,
    dense: DenseParams,
    staged: BTreeMap<u64, BTreeMap<u32, Update>>,
    staged_bytes: u64,
    last_committed_step: Option<u64>,
    observers: Vec<Box<dyn PushObserver>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("server", &self.config.server)
            .field("tables", &self.tables.len())
            .field("dense_range", &self.dense_range)
            .field("last_committed_step", &self.last_committed_step)
            .field("observers", &self.observers.len())
            .finish()
    }
}

impl Server {
    /// Build the shard: rows initialised exactly as the single-process model initialises the
    /// same global rows, and this server's slice of `dense_init` (the whole model's initial
    /// dense vector) with zeroed optimizer state.
    pub fn new(config: ServerConfig, dense_init: &[f32]) -> Result<Self, PsError> {
        config.validate()?;
        let opt = config.sparse_optimizer;
        let layout = RowLayout::new(config.dim, opt.state_words(config.dim));
        let map = config.shard_map;
        let me = config.server;
        let tables = config
            .table_rows
            .iter()
            .enumerate()
            .map(|(t, &rows)| {
                let id = TableId(t as u32);
                let local = map.rows_on(id, rows, me);
                let mut shard = EmbeddingTable::zeros(id, local, layout);
                shard.init_rows(config.seed, config.init_scale, |l| {
                    map.global_row(id, me, l)
                });
                shard
            })
            .collect();
        let dense_len = dense_init.len() as u64;
        let dense_range = dense_value_range(dense_len, map.servers(), me);
        let dense_blocks = dense_block_range(dense_len, map.servers(), me);
        let dense = DenseParams::new(
            dense_init[dense_range.start as usize..dense_range.end as usize].to_vec(),
            &config.dense_optimizer,
        );
        Ok(Server {
            config,
            layout,
            tables,
            dense_len,
            dense_range,
            dense_blocks,
            dense,
            staged: BTreeMap::new(),
            staged_bytes: 0,
            last_committed_step: None,
            observers: Vec::new(),
        })
    }

    /// Take over `fresh`'s whole state (tables, dense part, staged contributions, committed
    /// step) and keep this server's observers: a server reset to its initial state without
    /// restarting the process. `fresh` must be the same server of the same cluster.
    pub fn reset_from(&mut self, fresh: Server) -> Result<(), PsError> {
        if fresh.config != self.config || fresh.dense_len != self.dense_len {
            return Err(PsError::InvalidConfig(format!(
                "a reset of server {} needs the same server of the same model",
                self.config.server.0
            )));
        }
        let observers = std::mem::take(&mut self.observers);
        *self = Server { observers, ..fresh };
        Ok(())
    }

    /// Attach an observer of every later update.
    pub fn add_observer(&mut self, observer: Box<dyn PushObserver>) {
        self.observers.push(observer);
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn layout(&self) -> RowLayout {
        self.layout
    }

    /// This server's shard of `table` (indexed by local row index).
    pub fn shard(&self, table: TableId) -> Option<&EmbeddingTable> {
        self.tables.get(table.0 as usize)
    }

    /// This server's dense values and their optimizer state.
    pub fn dense(&self) -> &DenseParams {
        &self.dense
    }

    pub fn info(&self) -> ServerInfo {
        ServerInfo {
            server: self.config.server,
            servers: self.config.shard_map.servers(),
            dim: self.config.dim,
            state_words: self.layout.state_words,
            table_rows: self.config.table_rows.clone(),
            local_rows: self.tables.iter().map(|t| t.rows()).collect(),
            dense_len: self.dense_len,
            dense_range: self.dense_range.clone(),
            dense_state_per_block: self.dense_state_per_block(),
            last_committed_step: self.last_committed_step,
        }
    }

    fn dense_state_per_block(&self) -> usize {
        self.config.dense_optimizer.state_words(DENSE_BLOCK)
    }

    fn table_index(&self, table: TableId) -> Result<usize, PsError> {
        let t = table.0 as usize;
        if t < self.tables.len() {
            Ok(t)
        } else {
            Err(PsError::UnknownTable {
                table: table.0,
                tables: self.tables.len() as u64,
            })
        }
    }

    /// Local index of global row `row` of `table`, if the row exists and lives here.
    fn local_row(&self, t: usize, row: RowId) -> Result<u64, PsError> {
        let table = TableId(t as u32);
        let rows = self.config.table_rows[t];
        if row >= rows {
            return Err(PsError::RowOutOfRange {
                table: table.0,
                row,
                rows,
            });
        }
        let map = self.config.shard_map;
        let owner = map.owner(table, row);
        if owner != self.config.server {
            return Err(PsError::NotOwner {
                table: table.0,
                row,
                owner: owner.0,
                server: self.config.server.0,
            });
        }
        Ok(map.local_index(table, row))
    }

    /// Values (`dim` words per row, no optimizer state) of the requested rows, one vector per
    /// request part, rows in request order (duplicates are answered as asked).
    pub fn pull_rows(&self, parts: &[RowRequest]) -> Result<Vec<Vec<f32>>, PsError> {
        let dim = self.config.dim;
        let mut locals = Vec::with_capacity(parts.len());
        for part in parts {
            let t = self.table_index(part.table)?;
            let l = part
                .rows
                .iter()
                .map(|&r| self.local_row(t, r))
                .collect::<Result<Vec<u64>, _>>()?;
            locals.push((t, l));
        }
        Ok(locals
            .into_iter()
            .map(|(t, l)| {
                let shard = &self.tables[t];
                let mut out = Vec::with_capacity(l.len() * dim);
                for (i, &local) in l.iter().enumerate() {
                    if let Some(&ahead) = l.get(i + AHEAD) {
                        shard.prefetch_row(ahead);
                    }
                    out.extend_from_slice(&shard.row(local)[..dim]);
                }
                out
            })
            .collect())
    }

    fn check_dense_range(&self, lo: u64, hi: u64, reason: &str) -> Result<(), PsError> {
        if lo <= hi && lo >= self.dense_range.start && hi <= self.dense_range.end {
            Ok(())
        } else {
            Err(self.dense_error(lo, hi, reason))
        }
    }

    fn dense_error(&self, lo: u64, hi: u64, reason: &str) -> PsError {
        PsError::DenseRange {
            lo,
            hi,
            owned_lo: self.dense_range.start,
            owned_hi: self.dense_range.end,
            reason: reason.to_string(),
        }
    }

    /// Dense values of global indices `range`, which must lie inside this server's range.
    pub fn pull_dense(&self, range: Range<u64>) -> Result<Vec<f32>, PsError> {
        self.check_dense_range(
            range.start,
            range.end,
            "not inside this server's dense range",
        )?;
        let lo = (range.start - self.dense_range.start) as usize;
        let hi = (range.end - self.dense_range.start) as usize;
        Ok(self.dense.values[lo..hi].to_vec())
    }

    /// Check an update against this shard without changing anything.
    pub fn validate_update(&self, update: &Update) -> Result<(), PsError> {
        let bytes = update.payload_bytes();
        if bytes > self.config.limits.max_update_bytes {
            return Err(PsError::TooLarge {
                what: "update".into(),
                bytes,
                limit: self.config.limits.max_update_bytes,
            });
        }
        let dim = self.config.dim;
        for part in &update.sparse {
            let t = self.table_index(part.table)?;
            let expected = part.rows.len() as u64 * dim as u64;
            if part.grads.len() as u64 != expected {
                return Err(PsError::GradientLength {
                    table: part.table.0,
                    rows: part.rows.len() as u64,
                    expected,
                    got: part.grads.len() as u64,
                });
            }
            for &row in &part.rows {
                self.local_row(t, row)?;
            }
            if !all_finite(&part.grads) {
                // Name the first row whose gradient is not finite.
                let i = part
                    .grads
                    .chunks(dim.max(1))
                    .position(|g| !all_finite(g))
                    .unwrap_or(0);
                return Err(PsError::NonFiniteGradient {
                    table: part.table.0,
                    row: part.rows.get(i).copied().unwrap_or(0),
                });
            }
        }
        for part in &update.dense {
            let lo = part.offset;
            let hi = lo.saturating_add(part.grads.len() as u64);
            self.check_dense_range(lo, hi, "not inside this server's dense range")?;
            let block = DENSE_BLOCK as u64;
            if !lo.is_multiple_of(block) {
                return Err(self.dense_error(lo, hi, "offset is not at a block boundary"));
            }
            if !hi.is_multiple_of(block) && hi != self.dense_range.end {
                return Err(self.dense_error(
                    lo,
                    hi,
                    "does not end at a block boundary or at the end of the dense range",
                ));
            }
            if !all_finite(&part.grads) {
                let i = part.grads.iter().position(|g| !g.is_finite()).unwrap_or(0);
                return Err(PsError::NonFiniteDenseGradient {
                    index: lo + i as u64,
                });
            }
        }
        Ok(())
    }

    /// Apply one update now: per-row (and per-block) sums, then exactly one optimizer step per
    /// touched row and block.
    pub fn push(&mut self, update: &Update) -> Result<ApplyReport, PsError> {
        self.validate_update(update)?;
        let mut acc = Accumulator::new(self.config.dim);
        acc.add(update, self.dense_range.start, self.dense.len());
        Ok(self.apply(acc, UpdateOrigin::Push))
    }

    fn check_step_fresh(&self, step: u64) -> Result<(), PsError> {
        match self.last_committed_step {
            Some(last) if step <= last => Err(PsError::StepAlreadyCommitted { step, last }),
            _ => Ok(()),
        }
    }

    /// Deterministic mode: apply step `step` as the sum of `contributions` taken in the given
    /// order (the workers' order), one optimizer step per touched row and block. Steps commit
    /// in increasing order; nothing changes if any contribution is refused.
    pub fn apply_step(
        &mut self,
        step: u64,
        contributions: &[&Update],
    ) -> Result<ApplyReport, PsError> {
        self.check_step_fresh(step)?;
        for c in contributions {
            self.validate_update(c)?;
        }
        Ok(self.apply_step_validated(step, contributions))
    }

    fn apply_step_validated(&mut self, step: u64, contributions: &[&Update]) -> ApplyReport {
        let mut acc = Accumulator::new(self.config.dim);
        for c in contributions {
            acc.add(c, self.dense_range.start, self.dense.len());
        }
        let report = self.apply(acc, UpdateOrigin::Step(step));
        self.last_committed_step = Some(step);
        report
    }

    /// Hold `worker`'s contribution to `step` until [`Server::commit_step`]. The update is
    /// validated now, so a refused contribution is reported to the worker that sent it.
    pub fn stage_step(&mut self, step: u64, worker: u32, update: Update) -> Result<(), PsError> {
        self.check_step_fresh(step)?;
        self.validate_update(&update)?;
        if self
            .staged
            .get(&step)
            .is_some_and(|s| s.contains_key(&worker))
        {
            return Err(PsError::AlreadyStaged { step, worker });
        }
        let bytes = update.payload_bytes();
        let limit = self.config.limits.max_staged_bytes;
        if self.staged_bytes + bytes > limit {
            return Err(PsError::TooLarge {
                what: format!(
                    "staged contributions ({} bytes already held) plus this one",
                    self.staged_bytes
                ),
                bytes: self.staged_bytes + bytes,
                limit,
            });
        }
        self.staged_bytes += bytes;
        self.staged.entry(step).or_default().insert(worker, update);
        Ok(())
    }

    /// Apply step `step` from the contributions staged for it, summed in the order of
    /// `workers`, which must name exactly the workers that staged one. On a refusal the staged
    /// contributions stay, so the caller can retry with the right list or abort.
    pub fn commit_step(&mut self, step: u64, workers: &[u32]) -> Result<ApplyReport, PsError> {
        self.check_commit_workers(step, workers)?;
        let mut contributions = self.staged.remove(&step).unwrap_or_default();
        let ordered: Vec<Update> = workers
            .iter()
            .filter_map(|w| contributions.remove(w))
            .collect();
        let bytes: u64 = ordered.iter().map(Update::payload_bytes).sum();
        self.staged_bytes -= bytes;
        let refs: Vec<&Update> = ordered.iter().collect();
        Ok(self.apply_step_validated(step, &refs))
    }

    /// Check that `step` is fresh and `workers` names exactly the workers that staged a
    /// contribution to it.
    fn check_commit_workers(&self, step: u64, workers: &[u32]) -> Result<(), PsError> {
        self.check_step_fresh(step)?;
        let staged = self.staged.get(&step);
        let mismatch = |detail: String| PsError::StepWorkersMismatch { step, detail };
        let mut seen = std::collections::BTreeSet::new();
        for &w in workers {
            if !seen.insert(w) {
                return Err(mismatch(format!("worker {w} is named twice")));
            }
            if !staged.is_some_and(|s| s.contains_key(&w)) {
                return Err(mismatch(format!("worker {w} staged no contribution")));
            }
        }
        let staged_workers: Vec<u32> = staged
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default();
        if let Some(w) = staged_workers.iter().find(|w| !seen.contains(w)) {
            return Err(mismatch(format!(
                "worker {w} staged a contribution but is not in the commit order"
            )));
        }
        if workers.is_empty() {
            return Err(mismatch("the commit names no worker".into()));
        }
        Ok(())
    }

    /// Two-phase commit, phase 1 (ECRec §3.5): compute step `step` from its staged
    /// contributions summed in `workers` order, exactly as [`Server::commit_step`] would, but
    /// change nothing. The result holds every touched row's words before and after (values and
    /// optimizer state, what difference propagation sends, ECRec §3.2) and every touched dense
    /// block's summed gradient (what a dense replica applies, ECRec §3.3) and new words.
    pub fn prepare_step(&self, step: u64, workers: &[u32]) -> Result<PreparedStep, PsError> {
        self.check_commit_workers(step, workers)?;
        let staged = &self.staged[&step];
        let mut acc = Accumulator::new(self.config.dim);
        for w in workers {
            acc.add(&staged[w], self.dense_range.start, self.dense.len());
        }
        let mut p = PreparedStep::default();
        self.prepare_acc(acc, &mut p, None);
        p.step = step;
        p.workers = workers.to_vec();
        Ok(p)
    }

    /// Phase 1 of a transaction that carries its own update (ECRec §3.5, asynchronous
    /// training: one worker's push): validate `update` and compute into `out` the rows and
    /// dense blocks it would produce from the current state, exactly as [`Server::push`]
    /// would apply it, changing nothing; `out`'s buffers are reused (whatever it held is
    /// replaced). [`Server::install_prepared`] applies the result.
    ///
    /// With `base`, the state is the one `base` (a prepared step of this server not installed
    /// yet) would leave: a row `base` prepared starts from its prepared words instead of the
    /// table's, so that installing `base` and then `out` gives what applying the two updates
    /// one after the other gives.
    pub fn prepare_update_into(
        &self,
        update: &Update,
        out: &mut PreparedStep,
        base: Option<&PreparedStep>,
    ) -> Result<(), PsError> {
        self.validate_update(update)?;
        let mut acc = Accumulator::new(self.config.dim);
        acc.dense_sum = std::mem::take(&mut out.dense_grads);
        acc.dense_sum.clear();
        acc.add(update, self.dense_range.start, self.dense.len());
        self.prepare_acc(acc, out, base);
        Ok(())
    }

    fn prepare_acc(
        &self,
        mut acc: Accumulator,
        out: &mut PreparedStep,
        base: Option<&PreparedStep>,
    ) {
        let dim = self.config.dim;
        let words = self.layout.words();
        let opt = self.config.sparse_optimizer;
        let map = self.config.shard_map;
        out.clear();
        for (table, sums) in &acc.tables {
            let shard = &self.tables[table.0 as usize];
            let sorted = sums.sorted();
            if out.rows.len() == out.rows_used {
                out.rows.push(PreparedRows::default());
            }
            let p = &mut out.rows[out.rows_used];
            out.rows_used += 1;
            p.table = *table;
            p.words = words;
            p.rows.clear();
            p.new.clear();
            p.rows.reserve(sorted.len());
            p.new.reserve(sorted.len() * words);
            let mut over = Overlay::of(base, *table, words);
            for (i, &(row, grad)) in sorted.iter().enumerate() {
                if let Some(&(ahead, _)) = sorted.get(i + AHEAD) {
                    shard.prefetch_row(map.local_index(*table, ahead));
                }
                let r = match over.row(row) {
                    Some(r) => r,
                    None => shard.row(map.local_index(*table, row)),
                };
                p.rows.push(row);
                let at = p.new.len();
                p.new.extend_from_slice(r);
                opt.apply(&mut p.new[at..], dim, grad);
            }
        }
        // The summed dense gradient becomes `out`'s buffer (the one `prepare_update_into`
        // lent the accumulator, when reused).
        self.pack_dense(&acc.dense_touched, &mut acc.dense_sum, out);
    }

    /// Move the touched blocks of the summed dense gradient `sum` (this server's dense
    /// layout) to the front of `sum`, block after block, record them in `out`, and make
    /// `sum` `out`'s gradient buffer.
    fn pack_dense(&self, touched: &[bool], sum: &mut Vec<f32>, out: &mut PreparedStep) {
        out.dense.clear();
        let mut at = 0;
        for (b, &t) in touched.iter().enumerate() {
            if !t {
                continue;
            }
            let lo = b * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(sum.len());
            if at != lo {
                // Every block before this one was touched too: it is in place already.
                sum.copy_within(lo..hi, at);
            }
            out.dense.push(PreparedDense {
                block: self.dense_blocks.start + b as u64,
                at,
                len: hi - lo,
            });
            at += hi - lo;
        }
        sum.truncate(at);
        out.dense_grads = std::mem::take(sum);
    }

    /// Every prepared row of `prepared` with its words before (read from the table, which
    /// the step has not changed yet, or from `base` for a row `prepared` was computed on top
    /// of, see [`Server::prepare_update_into`]) and after the step: `f(table, row, old, new)`.
    pub fn prepared_row_pairs<F>(
        &self,
        prepared: &PreparedStep,
        base: Option<&PreparedStep>,
        mut f: F,
    ) -> Result<(), PsError>
    where
        F: FnMut(TableId, RowId, &[f32], &[f32]) -> Result<(), PsError>,
    {
        let words = self.layout.words();
        let map = self.config.shard_map;
        for p in prepared.tables() {
            let t = self.table_index(p.table)?;
            if p.words != words || p.new.len() != p.rows.len() * words {
                return Err(PsError::ShapeMismatch {
                    what: format!("prepared rows of table {}", p.table.0),
                    expected: (p.rows.len() * words) as u64,
                    got: p.new.len() as u64,
                });
            }
            let shard = &self.tables[t];
            let mut over = Overlay::of(base, p.table, words);
            for (&row, new) in p.rows.iter().zip(p.new.chunks_exact(words)) {
                self.local_row(t, row)?;
                let old = match over.row(row) {
                    Some(r) => r,
                    None => shard.row(map.local_index(p.table, row)),
                };
                f(p.table, row, old, new)?;
            }
        }
        Ok(())
    }

    /// Two-phase commit, phase 2: install a step computed by [`Server::prepare_step`] on this
    /// server and drop its staged contributions. The result is bit-identical to
    /// [`Server::commit_step`] with the same workers; observers see the same calls.
    pub fn commit_prepared(&mut self, prepared: &PreparedStep) -> Result<ApplyReport, PsError> {
        let step = prepared.step;
        self.check_commit_workers(step, &prepared.workers)?;
        self.check_prepared(prepared)?;
        if let Some(s) = self.staged.remove(&step) {
            self.staged_bytes -= s.values().map(Update::payload_bytes).sum::<u64>();
        }
        let report = self.install_checked(prepared, UpdateOrigin::Step(step));
        self.last_committed_step = Some(step);
        Ok(report)
    }

    /// Phase 2 of a transaction prepared with [`Server::prepare_update_into`]: install its rows
    /// and dense blocks (observers see a push).
    pub fn install_prepared(&mut self, prepared: &PreparedStep) -> Result<ApplyReport, PsError> {
        self.check_prepared(prepared)?;
        Ok(self.install_checked(prepared, UpdateOrigin::Push))
    }

    /// Check that every row and block of `prepared` lives here, with whole rows and blocks.
    fn check_prepared(&self, prepared: &PreparedStep) -> Result<(), PsError> {
        let step = prepared.step;
        let words = self.layout.words();
        if prepared.rows_used > prepared.rows.len() {
            return Err(PsError::MalformedRequest(format!(
                "prepared step {step} names {} tables but holds {}",
                prepared.rows_used,
                prepared.rows.len()
            )));
        }
        for p in prepared.tables() {
            let t = self.table_index(p.table)?;
            let expected = p.rows.len() * words;
            if p.words != words || p.new.len() != expected {
                return Err(PsError::ShapeMismatch {
                    what: format!("prepared rows of table {} for step {step}", p.table.0),
                    expected: expected as u64,
                    got: p.new.len() as u64,
                });
            }
            for &row in &p.rows {
                self.local_row(t, row)?;
            }
        }
        for d in &prepared.dense {
            self.check_block_range(d.block, d.block + 1)?;
            let b = (d.block - self.dense_blocks.start) as usize;
            let lo = b * DENSE_BLOCK;
            let len = (lo + DENSE_BLOCK).min(self.dense.len()) - lo;
            if d.len != len || d.at + d.len > prepared.dense_grads.len() {
                return Err(PsError::ShapeMismatch {
                    what: format!("prepared dense block {} for step {step}", d.block),
                    expected: len as u64,
                    got: d.len as u64,
                });
            }
        }
        Ok(())
    }

    fn install_checked(&mut self, prepared: &PreparedStep, origin: UpdateOrigin) -> ApplyReport {
        let words = self.layout.words();
        let map = self.config.shard_map;
        let want_images = self.observers.iter().any(|o| o.wants_row_images());
        let mut old = Vec::new();
        let mut report = ApplyReport::default();
        for p in prepared.tables() {
            let shard = &mut self.tables[p.table.0 as usize];
            if want_images {
                old.clear();
                old.reserve(p.new.len());
            }
            for (i, (&row, new)) in p.rows.iter().zip(p.new.chunks_exact(words)).enumerate() {
                if let Some(&ahead) = p.rows.get(i + AHEAD) {
                    shard.prefetch_row(map.local_index(p.table, ahead));
                }
                let r = shard.row_mut(map.local_index(p.table, row));
                if want_images {
                    old.extend_from_slice(r);
                }
                r.copy_from_slice(new);
            }
            report.rows_updated += p.rows.len() as u64;
            for o in &mut self.observers {
                let images = o.wants_row_images().then_some(RowImages {
                    words,
                    old: &old,
                    new: &p.new,
                });
                o.rows_updated(origin, p.table, &p.rows, images);
            }
        }
        let dopt = self.config.dense_optimizer;
        let mut blocks = Vec::with_capacity(prepared.dense.len());
        for d in &prepared.dense {
            let b = (d.block - self.dense_blocks.start) as usize;
            // The same gradient on the same words the prepare saw: the same new words.
            let (v, s) = self.dense.block_mut(b, &dopt);
            dopt.apply_split(v, s, prepared.dense_grad(d));
            blocks.push(d.block);
        }
        report.dense_blocks_updated = blocks.len() as u64;
        if !blocks.is_empty() {
            for o in &mut self.observers {
                o.dense_updated(origin, &blocks);
            }
        }
        report
    }

    /// Rows touched by the contributions staged for `step`, per table (sorted, distinct).
    pub fn staged_rows(&self, step: u64) -> Vec<RowRequest> {
        let mut reqs = Vec::new();
        if let Some(s) = self.staged.get(&step) {
            for u in s.values() {
                for part in &u.sparse {
                    reqs.push(RowRequest {
                        table: part.table,
                        rows: part.rows.clone(),
                    });
                }
            }
        }
        crate::update::dedup_requests(&reqs)
    }

    /// Set the last committed step after a restore or a rebuild brought the state to it.
    pub fn set_last_committed_step(&mut self, step: Option<u64>) {
        self.last_committed_step = step;
    }

    /// Global indices of the dense blocks this server holds.
    pub fn dense_blocks(&self) -> Range<u64> {
        self.dense_blocks.clone()
    }

    /// Drop every contribution staged for `step`; returns how many there were.
    pub fn abort_step(&mut self, step: u64) -> usize {
        match self.staged.remove(&step) {
            Some(s) => {
                self.staged_bytes -= s.values().map(Update::payload_bytes).sum::<u64>();
                s.len()
            }
            None => 0,
        }
    }

    /// Drop every staged contribution and forget the last committed step: the shard's rows
    /// are about to be replaced by a restore, and the steps after it are trained again.
    pub fn clear_staged(&mut self) {
        self.staged.clear();
        self.staged_bytes = 0;
        self.last_committed_step = None;
    }

    /// Steps with staged contributions, and the workers that staged each.
    pub fn staged_steps(&self) -> Vec<(u64, Vec<u32>)> {
        self.staged
            .iter()
            .map(|(s, w)| (*s, w.keys().copied().collect()))
            .collect()
    }

    pub fn last_committed_step(&self) -> Option<u64> {
        self.last_committed_step
    }

    fn apply(&mut self, acc: Accumulator, origin: UpdateOrigin) -> ApplyReport {
        let dim = self.config.dim;
        let words = self.layout.words();
        let opt = self.config.sparse_optimizer;
        let map = self.config.shard_map;
        let want_images = self.observers.iter().any(|o| o.wants_row_images());
        let mut report = ApplyReport::default();
        for (table, sums) in &acc.tables {
            let shard = &mut self.tables[table.0 as usize];
            let sorted = sums.sorted();
            let rows: Vec<RowId> = sorted.iter().map(|(r, _)| *r).collect();
            let (mut old, mut new) = (Vec::new(), Vec::new());
            if want_images {
                old.reserve(rows.len() * words);
                new.reserve(rows.len() * words);
            }
            for (i, &(row, grad)) in sorted.iter().enumerate() {
                if let Some(&(ahead, _)) = sorted.get(i + AHEAD) {
                    shard.prefetch_row(map.local_index(*table, ahead));
                }
                let r = shard.row_mut(map.local_index(*table, row));
                if want_images {
                    old.extend_from_slice(r);
                }
                opt.apply(r, dim, grad);
                if want_images {
                    new.extend_from_slice(r);
                }
            }
            report.rows_updated += rows.len() as u64;
            for o in &mut self.observers {
                let images = o.wants_row_images().then_some(RowImages {
                    words,
                    old: &old,
                    new: &new,
                });
                o.rows_updated(origin, *table, &rows, images);
            }
        }
        let dopt = self.config.dense_optimizer;
        let mut blocks = Vec::new();
        for (b, &touched) in acc.dense_touched.iter().enumerate() {
            if !touched {
                continue;
            }
            let lo = b * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(acc.dense_sum.len());
            let (v, s) = self.dense.block_mut(b, &dopt);
            dopt.apply_split(v, s, &acc.dense_sum[lo..hi]);
            blocks.push(self.dense_blocks.start + b as u64);
        }
        report.dense_blocks_updated = blocks.len() as u64;
        if !blocks.is_empty() {
            for o in &mut self.observers {
                o.dense_updated(origin, &blocks);
            }
        }
        report
    }

    /// This shard's part of the model digest: every row under its global id and every dense
    /// block under its global block index, so the servers' digests merge into the digest of
    /// the single-process model.
    pub fn digest(&self) -> ModelDigest {
        let mut d = ModelDigest::new();
        let map = self.config.shard_map;
        for shard in &self.tables {
            let words = self.layout.words();
            for (local, row) in shard.as_slice().chunks_exact(words).enumerate() {
                let global = map.global_row(shard.id, self.config.server, local as u64);
                d.add_row(shard.id.0, global, row);
            }
        }
        let spb = self.dense_state_per_block();
        for b in 0..self.dense.blocks() {
            let lo = b * DENSE_BLOCK;
            let hi = (lo + DENSE_BLOCK).min(self.dense.len());
            d.add_dense_block(
                self.dense_blocks.start + b as u64,
                &self.dense.values[lo..hi],
                &self.dense.state[b * spb..(b + 1) * spb],
            );
        }
        d
    }

    fn check_local_range(&self, t: usize, lo: u64, hi: u64) -> Result<(), PsError> {
        let rows = self.tables[t].rows();
        if lo <= hi && hi <= rows {
            Ok(())
        } else {
            Err(PsError::LocalRange {
                table: t as u32,
                lo,
                hi,
                rows,
            })
        }
    }

    /// The words of local row `local` of `table` (values, then optimizer state), borrowed.
    pub fn local_row_words(&self, table: TableId, local: u64) -> Result<&[f32], PsError> {
        let t = self.table_index(table)?;
        self.check_local_range(t, local, local.saturating_add(1))?;
        Ok(self.tables[t].row(local))
    }

    /// Whole rows (values and optimizer state) of local indices `local` of `table`.
    pub fn export_rows(&self, table: TableId, local: Range<u64>) -> Result<RowBlock, PsError> {
        let t = self.table_index(table)?;
        self.check_local_range(t, local.start, local.end)?;
        let w = self.layout.words();
        let data =
            self.tables[t].as_slice()[local.start as usize * w..local.end as usize * w].to_vec();
        Ok(RowBlock {
            table,
            first_local: local.start,
            data,
        })
    }

    /// Overwrite whole rows from an export. Observers are not told: a restore rewrites state,
    /// it does not train it.
    pub fn import_rows(&mut self, block: &RowBlock) -> Result<u64, PsError> {
        self.import_row_words(block.table, block.first_local, &block.data)
    }

    /// [`Server::import_rows`] from borrowed words: whole rows from local index `first_local`
    /// of `table` on.
    pub fn import_row_words(
        &mut self,
        table: TableId,
        first_local: u64,
        data: &[f32],
    ) -> Result<u64, PsError> {
        let t = self.table_index(table)?;
        let w = self.layout.words();
        if !data.len().is_multiple_of(w) {
            return Err(PsError::ShapeMismatch {
                what: format!(
                    "row import into table {} (whole rows of {w} words)",
                    table.0
                ),
                expected: (data.len() / w * w) as u64,
                got: data.len() as u64,
            });
        }
        let n = (data.len() / w) as u64;
        let hi = first_local.saturating_add(n);
        self.check_local_range(t, first_local, hi)?;
        let lo = first_local as usize * w;
        self.tables[t].as_mut_slice()[lo..lo + data.len()].copy_from_slice(data);
        Ok(n)
    }

    fn check_block_range(&self, lo: u64, hi: u64) -> Result<(), PsError> {
        let b = &self.dense_blocks;
        if lo <= hi && lo >= b.start && hi <= b.end {
            Ok(())
        } else {
            let block = DENSE_BLOCK as u64;
            Err(self.dense_error(
                lo * block,
                hi * block,
                &format!(
                    "blocks {lo}..{hi} are not inside this server's blocks {}..{}",
                    b.start, b.end
                ),
            ))
        }
    }

    /// Dense values and optimizer state of global blocks `blocks`.
    pub fn export_dense(&self, blocks: Range<u64>) -> Result<DenseBlock, PsError> {
        self.check_block_range(blocks.start, blocks.end)?;
        let first = (blocks.start - self.dense_blocks.start) as usize;
        let last = (blocks.end - self.dense_blocks.start) as usize;
        let spb = self.dense_state_per_block();
        // The last block may be short, so an empty range at the end starts past the values.
        let vhi = (last * DENSE_BLOCK).min(self.dense.len());
        let vlo = (first * DENSE_BLOCK).min(vhi);
        Ok(DenseBlock {
            first_block: blocks.start,
            values: self.dense.values[vlo..vhi].to_vec(),
            state: self.dense.state[first * spb..last * spb].to_vec(),
        })
    }

    /// Overwrite dense blocks from an export.
    pub fn import_dense(&mut self, block: &DenseBlock) -> Result<u64, PsError> {
        let spb = self.dense_state_per_block();
        let n = match block.state.len().checked_div(spb) {
            Some(n) => n as u64,
            // No state words (SGD): the values alone say how many blocks there are.
            None => block.values.len().div_ceil(DENSE_BLOCK) as u64,
        };
        let hi = block.first_block.saturating_add(n);
        self.check_block_range(block.first_block, hi)?;
        let first = (block.first_block - self.dense_blocks.start) as usize;
        let vhi = ((first + n as usize) * DENSE_BLOCK).min(self.dense.len());
        let vlo = (first * DENSE_BLOCK).min(vhi);
        let expected_values = (vhi - vlo) as u64;
        if block.values.len() as u64 != expected_values {
            return Err(PsError::ShapeMismatch {
                what: format!(
                    "dense import of {n} blocks from block {}",
                    block.first_block
                ),
                expected: expected_values,
                got: block.values.len() as u64,
            });
        }
        if block.state.len() != n as usize * spb {
            return Err(PsError::ShapeMismatch {
                what: format!("dense state import of {n} blocks ({spb} state words per block)"),
                expected: n * spb as u64,
                got: block.state.len() as u64,
            });
        }
        self.dense.values[vlo..vhi].copy_from_slice(&block.values);
        self.dense.state[first * spb..(first + n as usize) * spb].copy_from_slice(&block.state);
        Ok(n)
    }
}

//! Degraded reads, on-demand decodes and the lock-range rebuild of a replacement (ECRec §3.4).
//!
//! Every decode reads its stripe members from the survivors as one consistent cut: each
//! [`MemberRead`] carries the step its node had committed when it copied the words (under the
//! lock its commits take), and a decode goes ahead only when all of them, and the decoding
//! node where it matters, name the same step. Otherwise a commit ran in between: the reads
//! are retried (counted in [`RebuildStatus::cut_retries`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ftrec_core::{RowId, ServerId, TableId};
use ftrec_ec::{
    degraded_read, Decoder, Location, RecoveryOptions, RecoveryPlan, StripeMember, TaskBatch,
};

use super::node::{Driver, EcInner, EcNode, EcState, FULL_SHARE_PPM};
use super::service::EcService;
use super::types::{MemberKey, MemberRead, RebuildPoint, RebuildStatus};
use crate::update::{PulledRows, RowRequest};
use crate::{PsError, RowSource};

/// Attempts at a consistent cut before a decode gives up.
const CUT_ATTEMPTS: u32 = 200;

/// Bytes of rows (read and decoded) of one rebuild batch: large enough that a batch's
/// messages, its lock and its cut check are a small part of its time, small enough that its
/// reads fit between two commits and its buffers cost a replacement little memory.
const REBUILD_BATCH_BYTES: usize = 4 << 20;
const MIN_BATCH_STRIPES: usize = 64;
const MAX_BATCH_STRIPES: usize = 1 << 16;

/// Tasks of one loss pattern decoded by one call: their gathered rows (about 100 KiB for
/// rows of 17 words and k = 2) stay in cache between the gather, the decode and the scatter.
const DECODE_GROUP: usize = 512;

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn key_of(m: &StripeMember) -> Option<MemberKey> {
    match m.location {
        Location::Row { table, local, .. } => Some(MemberKey::Row { table, local }),
        Location::Parity { slot, .. } => Some(MemberKey::Parity {
            table: slot.table,
            slot: slot.index,
        }),
        Location::Absent => None,
    }
}

fn normalise(lost: &[ServerId], me: Option<ServerId>) -> Vec<ServerId> {
    let mut l = lost.to_vec();
    l.extend(me);
    l.sort_unstable();
    l.dedup();
    l
}

/// The rows a batch of tasks decoded, in one buffer, written by the decoder in place: the
/// tasks of one decode group lie together, output after output (row `o` of the group's task
/// `gi` at `(o * g + gi) * words` from the group's start), so task `i`'s rows are `count[i]`
/// rows `stride[i]` words apart from `first[i]`.
struct Decoded {
    words: usize,
    /// Per task: where its first row starts, in words, and the words between its rows.
    first: Vec<usize>,
    stride: Vec<usize>,
    /// Per task: how many rows it decoded.
    count: Vec<u32>,
    data: Vec<f32>,
    /// Words handed out to groups so far.
    used: usize,
}

impl Decoded {
    /// Room for `batch`'s decodes in `data`, a buffer of an earlier batch or a new one: the
    /// decoder writes every word a batch uses, so what the buffer held is never read.
    fn new(words: usize, batch: &TaskBatch, mut data: Vec<f32>) -> Self {
        let n: usize = batch.all_rebuilt().len() * words;
        if data.len() < n {
            data.resize(n, 0.0);
        }
        data.truncate(n);
        Decoded {
            words,
            first: vec![0; batch.len()],
            stride: vec![0; batch.len()],
            count: vec![0; batch.len()],
            data,
            used: 0,
        }
    }

    /// The output rows of a decode group of `tasks` with `outs` rows each: `outs` slices of
    /// `tasks.len()` rows, the decoder's `out` argument.
    fn group(&mut self, tasks: &[u32], outs: usize) -> Result<Vec<&mut [f32]>, PsError> {
        let (w, g) = (self.words, tasks.len());
        let start = self.used;
        let end = start + outs * g * w;
        if end > self.data.len() {
            return Err(PsError::Internal(format!(
                "a batch's decodes need more than its {} rebuilt words",
                self.data.len()
            )));
        }
        for (gi, &i) in tasks.iter().enumerate() {
            let i = i as usize;
            self.first[i] = start + gi * w;
            self.stride[i] = g * w;
            self.count[i] = outs as u32;
        }
        self.used = end;
        Ok(self.data[start..end]
            .chunks_exact_mut(g * w.max(1))
            .collect())
    }

    /// The one row a task of a degraded read decoded.
    fn first_row(&self, i: usize) -> Result<&[f32], PsError> {
        self.rows(i)
            .next()
            .ok_or_else(|| PsError::Internal(format!("decode task {i} produced no row")))
    }

    /// Task `i`'s decoded rows, in [`TaskBatch::rebuild`] order.
    fn rows(&self, i: usize) -> impl Iterator<Item = &[f32]> + '_ {
        let (first, stride, w) = (self.first[i], self.stride[i], self.words);
        (0..self.count[i] as usize).map(move |o| &self.data[first + o * stride..][..w])
    }
}

/// A batch's tasks grouped by table and loss pattern, the order its reads are sent and
/// decoded in: in one table the tasks of one pattern read each position from one survivor
/// (tables rotate the servers, so two tables' tasks of a pattern may not).
struct Groups {
    /// Task indices, the tasks of one group together, in task order within it.
    order: Vec<u32>,
    /// Per group: its pattern and its tasks' span in `order`.
    spans: Vec<(usize, std::ops::Range<usize>)>,
}

impl Groups {
    fn of(batch: &TaskBatch) -> Self {
        let patterns = batch.patterns().len();
        let mut order = Vec::with_capacity(batch.len());
        let mut spans = Vec::new();
        let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); patterns];
        let mut i = 0;
        while i < batch.len() {
            // The run of tasks of one table (a batch's stripes are in (table, index) order).
            let table = batch.stripe(i).table;
            let mut end = i;
            while end < batch.len() && batch.stripe(end).table == table {
                buckets[batch.pattern(end)].push(end as u32);
                end += 1;
            }
            for (p, b) in buckets.iter_mut().enumerate() {
                if !b.is_empty() {
                    spans.push((p, order.len()..order.len() + b.len()));
                    order.append(b);
                }
            }
            i = end;
        }
        Groups { order, spans }
    }
}

/// The reads of one decode, sent and not yet collected: the survivors' answers arrive in the
/// background (their tasks are dropped, and the calls abandoned, with this value).
struct CutReads {
    /// The batch's tasks by pattern, the order of `refs`.
    groups: Groups,
    /// (server, index among its keys) per read, `None` for an absent position: each task's
    /// reads one after the other, the tasks in `groups.order`.
    refs: Vec<Option<(u32, u32)>>,
    set: tokio::task::JoinSet<(usize, usize, Result<MemberRead, PsError>)>,
}

/// A rebuild batch whose lock is taken and whose reads are on their way; its tasks are
/// `batches[which]` of [`EcNode::rebuild_range`].
struct InFlight<'a> {
    which: usize,
    window: LockWindow<'a>,
    committed: Option<u64>,
    stamp: u64,
    reads: CutReads,
}

/// A rebuild batch between its lock and its merge, counted in [`super::node::EcState::locks_open`]
/// for as long as it lives (also when the batch's future is dropped half way).
struct LockWindow<'a>(&'a EcNode);

impl<'a> LockWindow<'a> {
    fn open(node: &'a EcNode) -> Result<Self, PsError> {
        node.state()?.locks_open += 1;
        Ok(LockWindow(node))
    }
}

impl Drop for LockWindow<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.state() {
            st.locks_open = st.locks_open.saturating_sub(1);
        }
    }
}

struct NodeRowSource(Weak<EcInner>);

impl RowSource for NodeRowSource {
    fn ensure_rows<'a>(
        &'a self,
        requests: &'a [RowRequest],
    ) -> Pin<Box<dyn Future<Output = Result<(), PsError>> + Send + 'a>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(inner) => EcNode { inner }.ensure_present(requests).await.map(|_| ()),
                None => Ok(()),
            }
        })
    }
}

impl EcNode {
    /// Decode every task from one consistent cut of the survivors' members. `Ok(None)`: the
    /// reads did not agree on a step (or not on `expect`); try again.
    async fn decode_cut(
        &self,
        batch: &TaskBatch,
        expect: Option<Option<u64>>,
    ) -> Result<Option<Decoded>, PsError> {
        let reads = self.start_reads(batch)?;
        self.finish_cut(batch, reads, expect).await
    }

    /// Send every survivor its part of `batch`'s reads (one message each, in the background):
    /// [`EcNode::finish_cut`] collects and decodes them.
    fn start_reads(&self, batch: &TaskBatch) -> Result<CutReads, PsError> {
        let servers = self.inner.layout.servers() as usize;
        let mut keys: Vec<Vec<MemberKey>> = vec![Vec::new(); servers];
        // The tasks of one loss pattern are asked for together: the members of a stripe are
        // on distinct servers, so a survivor's rows of one read position of a pattern's
        // tasks lie one after the other in its answer whenever that position is on the same
        // survivor in all of them (always with one server lost), and are decoded where they
        // arrived.
        let groups = Groups::of(batch);
        let mut refs: Vec<Option<(u32, u32)>> =
            Vec::with_capacity(batch.len() * self.inner.layout.k());
        for &i in &groups.order {
            for m in batch.reads(i as usize) {
                refs.push(key_of(m).map(|k| {
                    let v = &mut keys[m.server.0 as usize];
                    v.push(k);
                    (m.server.0, (v.len() - 1) as u32)
                }));
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for (s, k) in keys.into_iter().enumerate() {
            if k.is_empty() {
                continue;
            }
            let peer = self.peer(ServerId(s as u32))?;
            set.spawn(async move { (s, k.len(), peer.read_members(k).await) });
        }
        Ok(CutReads { groups, refs, set })
    }

    /// Collect the reads [`EcNode::start_reads`] sent for `batch` and decode every task, if
    /// they form one consistent cut (at `expect`, when given); `Ok(None)` otherwise.
    async fn finish_cut(
        &self,
        batch: &TaskBatch,
        reads: CutReads,
        expect: Option<Option<u64>>,
    ) -> Result<Option<Decoded>, PsError> {
        let servers = self.inner.layout.servers() as usize;
        let CutReads {
            groups,
            refs,
            mut set,
        } = reads;
        let w = self.inner.words;
        let mut reads: Vec<Option<MemberRead>> = (0..servers).map(|_| None).collect();
        while let Some(r) = set.join_next().await {
            let (s, asked, r) =
                r.map_err(|e| PsError::Internal(format!("read task failed: {e}")))?;
            let r = r?;
            if r.words != w || r.data.len() != asked * w {
                return Err(PsError::ShapeMismatch {
                    what: format!("members read from server {s}"),
                    expected: (asked * w) as u64,
                    got: r.data.len() as u64,
                });
            }
            reads[s] = Some(r);
        }
        let mut steps = reads.iter().flatten().map(|r| r.step);
        let first = steps.next();
        if let Some(f) = first {
            if steps.any(|s| s != f) || expect.is_some_and(|e| e != f) {
                return Ok(None);
            }
        }
        let rows_of = |s: u32, from: u32, n: usize| -> Result<&[f32], PsError> {
            let rd = reads[s as usize]
                .as_ref()
                .ok_or_else(|| PsError::Internal(format!("no read from server {s} in a decode")))?;
            let from = from as usize * w;
            rd.data.get(from..from + n * w).ok_or_else(|| {
                PsError::Internal(format!("a decode reads past server {s}'s answer"))
            })
        };
        let mut decoded = Decoded::new(w, batch, self.decode_buffer());
        // A batch has a handful of loss patterns. The tasks of one pattern are decoded in
        // groups with one decoder call per group: the codes work word by word, so the decode
        // of rows laid end to end is their decodes laid end to end. A read position whose
        // rows lie together in a survivor's answer is decoded from there, any other is
        // gathered (an absent position reads as zeros); the outputs are written where
        // [`Decoded`] keeps them. Groups stay small enough for the rows to stay in cache.
        let mut gathered: Vec<f32> = Vec::new();
        let mut at = 0;
        let mut decoders: Vec<Option<Decoder>> =
            (0..batch.patterns().len()).map(|_| None).collect();
        for (p, span) in &groups.spans {
            let decoder = match &mut decoders[*p] {
                Some(d) => &*d,
                slot => {
                    let (available, wanted) = &batch.patterns()[*p];
                    &*slot.insert(self.inner.code.decoder(available, wanted)?)
                }
            };
            let (n, outs_n) = (decoder.reads().len(), decoder.wanted().len());
            for group in groups.order[span.clone()].chunks(DECODE_GROUP) {
                let g = group.len();
                for &i in group {
                    let i = i as usize;
                    if batch.reads(i).len() != n || batch.rebuild(i).len() != outs_n {
                        return Err(PsError::Internal(format!(
                            "decode task {i} reads {} members and rebuilds {}, its pattern \
                             {n} and {outs_n}",
                            batch.reads(i).len(),
                            batch.rebuild(i).len()
                        )));
                    }
                }
                let refs = &refs[at..at + g * n];
                at += g * n;
                let run = |j: usize| match refs[j] {
                    Some((s, first)) => (0..g)
                        .all(|gi| refs[gi * n + j] == Some((s, first + gi as u32)))
                        .then_some((s, first)),
                    None => None,
                };
                let runs: Vec<Option<(u32, u32)>> = (0..n).map(run).collect();
                let to_gather = runs.iter().filter(|r| r.is_none()).count();
                gathered.clear();
                gathered.resize(to_gather * g * w, 0.0);
                let mut slot = 0;
                for (j, r) in runs.iter().enumerate() {
                    if r.is_some() {
                        continue;
                    }
                    let buf = &mut gathered[slot * g * w..(slot + 1) * g * w];
                    for (gi, row) in buf.chunks_exact_mut(w).enumerate() {
                        if let Some((s, jj)) = refs[gi * n + j] {
                            row.copy_from_slice(rows_of(s, jj, 1)?);
                        }
                    }
                    slot += 1;
                }
                let mut ins: Vec<&[f32]> = Vec::with_capacity(n);
                let mut slot = 0;
                for r in &runs {
                    ins.push(match *r {
                        Some((s, first)) => rows_of(s, first, g)?,
                        None => {
                            slot += 1;
                            &gathered[(slot - 1) * g * w..slot * g * w]
                        }
                    });
                }
                let mut outs = decoded.group(group, outs_n)?;
                decoder.decode(&ins, &mut outs)?;
            }
        }
        Ok(Some(decoded))
    }

    /// A buffer a batch decoded into before, if one is spare (two batches are in flight at
    /// most: the allocation, zeroing and page faults of a new one each batch show in a
    /// rebuild's profile).
    fn decode_buffer(&self) -> Vec<f32> {
        self.inner
            .decode_buffers
            .lock()
            .ok()
            .and_then(|mut v| v.pop())
            .unwrap_or_default()
    }

    /// Keep `outs`'s buffer for a later batch.
    fn recycle(&self, outs: Decoded) {
        if let Ok(mut v) = self.inner.decode_buffers.lock() {
            if v.len() < 2 {
                v.push(outs.data);
            }
        }
    }

    async fn run_hook(&self, point: RebuildPoint) -> Result<(), PsError> {
        let hook = self
            .inner
            .hook
            .read()
            .map_err(|_| PsError::Internal("rebuild hook lock poisoned".into()))?
            .clone();
        if let Some(h) = hook {
            h(point).await;
        }
        Ok(())
    }

    async fn pause_before_retry(&self) -> Result<(), PsError> {
        self.state()?.status.cut_retries += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }

    fn no_cut(&self) -> PsError {
        PsError::Coding(format!(
            "server {} could not read a consistent cut of the survivors in {CUT_ATTEMPTS} \
             attempts (steps kept committing during the reads)",
            self.inner.me.0
        ))
    }

    /// Decode and install every requested row of this node that is still missing (a
    /// replacement only). Returns the rows decoded.
    pub(crate) async fn ensure_present(&self, requests: &[RowRequest]) -> Result<u64, PsError> {
        let me = self.inner.me;
        let map = self.inner.layout.shard_map();
        let (lost, wanted) = {
            let st = self.state()?;
            let Some(m) = st.missing.as_ref() else {
                return Ok(0);
            };
            let mut wanted: Vec<(TableId, RowId)> = Vec::new();
            for req in requests {
                let rows = *self
                    .inner
                    .layout
                    .table_rows()
                    .get(req.table.0 as usize)
                    .unwrap_or(&0);
                for &r in &req.rows {
                    if r < rows
                        && map.owner(req.table, r) == me
                        && Self::row_missing(&st, req.table, self.local_of(req.table, r))
                    {
                        wanted.push((req.table, r));
                    }
                }
            }
            (m.lost.clone(), wanted)
        };
        if wanted.is_empty() {
            return Ok(0);
        }
        let mut tasks = TaskBatch::new();
        for &(t, r) in &wanted {
            tasks.push(&degraded_read(
                &self.inner.layout,
                &self.inner.code,
                t,
                r,
                &lost,
            )?);
        }
        for _ in 0..CUT_ATTEMPTS {
            let committed = self.state()?.committed;
            if let Some(outs) = self.decode_cut(&tasks, Some(committed)).await? {
                let rows = wanted
                    .iter()
                    .enumerate()
                    .map(|(i, &(t, r))| Ok((t, self.local_of(t, r), outs.first_row(i)?)))
                    .collect::<Result<Vec<_>, PsError>>()?;
                let installed = {
                    let mut st = self.state()?;
                    if st.committed == committed {
                        let n = self.install_rows(&mut st, &rows)?;
                        st.status.rows_decoded_on_demand += n;
                        Some(n)
                    } else {
                        // A commit slipped in: the decoded rows are of an older step.
                        None
                    }
                };
                if let Some(n) = installed {
                    return Ok(n);
                }
                self.pause_before_retry().await?;
                continue;
            }
            self.pause_before_retry().await?;
        }
        Err(self.no_cut())
    }

    /// Values (the first `dim` words) of lost rows, decoded here from the survivors.
    pub async fn degraded_read(
        &self,
        table: TableId,
        rows: &[RowId],
        lost: &[ServerId],
    ) -> Result<PulledRows, PsError> {
        let mut rows = rows.to_vec();
        rows.sort_unstable();
        rows.dedup();
        let lost = normalise(lost, None);
        let mut tasks = TaskBatch::new();
        for &r in &rows {
            tasks.push(&degraded_read(
                &self.inner.layout,
                &self.inner.code,
                table,
                r,
                &lost,
            )?);
        }
        let dim = self.inner.dim;
        for _ in 0..CUT_ATTEMPTS {
            if let Some(outs) = self.decode_cut(&tasks, None).await? {
                let mut values = Vec::with_capacity(rows.len() * dim);
                for i in 0..tasks.len() {
                    values.extend_from_slice(&outs.first_row(i)?[..dim]);
                }
                return Ok(PulledRows {
                    table,
                    rows,
                    values,
                    dim,
                });
            }
            self.pause_before_retry().await?;
        }
        Err(self.no_cut())
    }

    pub fn rebuild_status(&self) -> Result<RebuildStatus, PsError> {
        Ok(self.state()?.status.clone())
    }

    /// Start (or restart, with a new lost set after a further loss) the rebuild of this
    /// replacement: see [`EcService::start_rebuild`]. A rebuild that already finished is left
    /// as it is (the node is whole; there is nothing to restart).
    pub async fn start_rebuild(&self, lost: &[ServerId], background: bool) -> Result<(), PsError> {
        let generation = {
            let _one_at_a_time = self.inner.control.lock().await;
            let Some(generation) = self.begin(lost, !background).await? else {
                return Ok(());
            };
            if background {
                let node = self.clone();
                let handle = tokio::spawn(async move {
                    let _ = node.drive(generation, usize::MAX).await;
                });
                *self.driver_slot()? = Some(Driver { generation, handle });
                return Ok(());
            }
            generation
        };
        self.drive(generation, usize::MAX).await.map(|_| ())
    }

    /// The first half of [`EcNode::start_rebuild`]: plan the rebuild for the lost set `lost`,
    /// copy the dense part and join the steps. From here on the node serves every pull and
    /// step, decoding the rows they touch on demand (degraded mode); the lock ranges are run
    /// by [`EcNode::rebuild_ranges`]. A driver of an earlier start is stopped first.
    pub async fn begin_rebuild(&self, lost: &[ServerId]) -> Result<(), PsError> {
        let _one_at_a_time = self.inner.control.lock().await;
        self.begin(lost, true).await.map(|_| ())
    }

    fn driver_slot(&self) -> Result<std::sync::MutexGuard<'_, Option<Driver>>, PsError> {
        self.inner
            .driver
            .lock()
            .map_err(|_| PsError::Internal("rebuild driver lock poisoned".into()))
    }

    /// Stop the background driver under way, if any, and wait until it is gone: once this
    /// returns no batch of an earlier generation can install or merge anything.
    pub(crate) async fn stop_driver(&self) -> Result<(), PsError> {
        let old = self.driver_slot()?.take();
        if let Some(d) = old {
            // Its batches hold no lock across an await that matters: a batch cancelled
            // between its lock and its merge leaves its slots missing, to be zeroed again.
            d.handle.abort();
            let _ = d.handle.await;
        }
        Ok(())
    }

    /// [`EcNode::begin_rebuild`] under the control lock; `None`: the rebuild already finished.
    /// `plan_now`: make the plan here; otherwise (a background rebuild) its driver makes it
    /// first, so that training resumes without waiting for a pass over every affected stripe
    /// (about a second for a few million stripes). Whether the lost set decodes is checked
    /// here either way.
    async fn begin(&self, lost: &[ServerId], plan_now: bool) -> Result<Option<u64>, PsError> {
        let me = self.inner.me;
        let lost = normalise(lost, Some(me));
        let plan = if plan_now {
            Some(Arc::new(self.make_plan(&lost)?))
        } else {
            let worst = self.inner.layout.max_lost_per_stripe(&lost)?;
            if worst > self.inner.layout.r() {
                return Err(ftrec_ec::EcError::TooManyErasures {
                    lost: worst,
                    tolerated: self.inner.layout.r(),
                }
                .into());
            }
            None
        };
        // A new generation first, so that a driver of the old one, wherever it is, can no
        // longer change anything; then stop it.
        {
            let mut st = self.state()?;
            if st.missing.is_none() {
                if st.status.started && st.status.finished {
                    return Ok(None);
                }
                return Err(PsError::InvalidConfig(format!(
                    "server {} has nothing to rebuild (it is not a replacement)",
                    me.0
                )));
            }
            st.status.generation += 1;
        }
        self.stop_driver().await?;
        let (generation, dense_missing) = {
            let mut st = self.state()?;
            let generation = st.status.generation;
            let m = st.missing.as_mut().ok_or(PsError::Internal(
                "rebuild state vanished during a restart".into(),
            ))?;
            m.lost = lost.clone();
            m.plan = plan.clone();
            let dense_missing = m.dense_missing;
            st.status.started = true;
            st.status.error = None;
            st.status.ranges_total = plan.as_ref().map_or(0, |p| p.ranges().len() as u64);
            st.status.ranges_done = 0;
            st.status.range_spans_us.clear();
            st.rebuild_t0 = Some(Instant::now());
            (generation, dense_missing)
        };
        if dense_missing {
            if let Err(e) = self.join(&lost).await {
                self.note_error(generation, &e)?;
                return Err(e);
            }
        }
        let source: Arc<dyn RowSource> = Arc::new(NodeRowSource(super::node::downgrade(self)));
        self.inner.server.set_row_source(Some(source))?;
        Ok(Some(generation))
    }

    fn make_plan(&self, lost: &[ServerId]) -> Result<RecoveryPlan, PsError> {
        Ok(RecoveryPlan::new(
            &self.inner.layout,
            &self.inner.code,
            lost,
            RecoveryOptions {
                lock_ranges: self.inner.cfg.lock_ranges,
            },
        )?)
    }

    /// The plan of generation `generation`, made now if its start left it to the driver.
    async fn plan_of(&self, generation: u64) -> Result<Option<Arc<RecoveryPlan>>, PsError> {
        let lost = {
            let st = self.state()?;
            self.check_generation(&st, generation)?;
            match st.missing.as_ref() {
                Some(m) if m.plan.is_some() => return Ok(m.plan.clone()),
                Some(m) => m.lost.clone(),
                None => return Ok(None),
            }
        };
        let node = self.clone();
        let plan = tokio::task::spawn_blocking(move || node.make_plan(&lost))
            .await
            .map_err(|e| PsError::Internal(format!("rebuild plan task failed: {e}")))??;
        let plan = Arc::new(plan);
        let mut st = self.state()?;
        self.check_generation(&st, generation)?;
        st.status.ranges_total = plan.ranges().len() as u64;
        if let Some(m) = st.missing.as_mut() {
            m.plan = Some(plan.clone());
        }
        Ok(Some(plan))
    }

    /// Record why generation `generation` stopped, unless a newer one replaced it.
    fn note_error(&self, generation: u64, e: &PsError) -> Result<(), PsError> {
        let mut st = self.state()?;
        if st.status.generation == generation {
            st.status.error = Some(e.to_string());
        }
        Ok(())
    }

    /// The error a driver of generation `generation` stops with once a restart replaced it.
    fn superseded(&self, generation: u64, now: u64) -> PsError {
        PsError::Coding(format!(
            "rebuild generation {generation} of server {} was superseded by generation {now}",
            self.inner.me.0
        ))
    }

    /// Fail unless `generation` is still the current rebuild generation.
    fn check_generation(&self, st: &EcState, generation: u64) -> Result<(), PsError> {
        if st.status.generation == generation {
            Ok(())
        } else {
            Err(self.superseded(generation, st.status.generation))
        }
    }

    /// Rebuild up to `max` further lock ranges of the rebuild begun with
    /// [`EcNode::begin_rebuild`]; returns whether the rebuild finished. Drivers run one at a
    /// time: a call made while another driver runs waits for it, and a driver whose
    /// generation was replaced by a restart stops at its next step.
    pub async fn rebuild_ranges(&self, max: usize) -> Result<bool, PsError> {
        let generation = self.state()?.status.generation;
        self.drive(generation, max).await
    }

    /// Set the share of the time a background rebuild may work (see
    /// [`EcConfig::rebuild_share_ppm`](super::EcConfig::rebuild_share_ppm)); a rebuild
    /// resting or waiting picks the new share up at once.
    pub fn set_rebuild_share(&self, ppm: u32) {
        self.inner.share.send_replace(ppm.min(FULL_SHARE_PPM));
    }

    /// Wait before a batch as the rebuild share asks: nothing at the full share, `busy`
    /// (the previous batch's time) scaled to keep the work within the share, and until the
    /// share is raised at a share of 0.
    async fn pace(&self, busy: Duration) {
        let mut rx = self.inner.share.subscribe();
        loop {
            let ppm = *rx.borrow_and_update();
            if ppm >= FULL_SHARE_PPM {
                return;
            }
            if ppm > 0 {
                let rest = busy.mul_f64(f64::from(FULL_SHARE_PPM) / f64::from(ppm) - 1.0);
                tokio::select! {
                    _ = tokio::time::sleep(rest) => return,
                    changed = rx.changed() => if changed.is_err() { return },
                }
                // The share changed while resting: rest again under the new one.
                continue;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The rebuild driver of generation `generation`: up to `max` lock ranges, then, if they
    /// were the last, the end of the rebuild.
    async fn drive(&self, generation: u64, max: usize) -> Result<bool, PsError> {
        let _one_driver = self.inner.driving.lock().await;
        let r = self.drive_locked(generation, max).await;
        if let Err(e) = &r {
            self.note_error(generation, e)?;
        }
        r
    }

    async fn drive_locked(&self, generation: u64, max: usize) -> Result<bool, PsError> {
        self.plan_of(generation).await?;
        let (plan, first) = {
            let st = self.state()?;
            match st.missing.as_ref().and_then(|m| m.plan.clone()) {
                _ if st.status.generation != generation => {
                    return Err(self.superseded(generation, st.status.generation))
                }
                Some(p) => (p, st.status.ranges_done as usize),
                None if st.status.finished => return Ok(true),
                None => {
                    return Err(PsError::InvalidConfig(format!(
                        "server {} has no rebuild under way (call begin_rebuild first)",
                        self.inner.me.0
                    )))
                }
            }
        };
        let last = plan.ranges().len().min(first.saturating_add(max));
        let mut busy = Duration::ZERO;
        for i in first..last {
            if self.is_killed() {
                return Err(PsError::Unavailable {
                    addr: format!("server {}", self.inner.me.0),
                    reason: "killed during its rebuild".into(),
                });
            }
            let started = Instant::now();
            self.rebuild_range(generation, &plan, i, &mut busy).await?;
            let mut st = self.state()?;
            self.check_generation(&st, generation)?;
            st.status.ranges_done += 1;
            if let Some(t0) = st.rebuild_t0 {
                let us = |t: Instant| t.saturating_duration_since(t0).as_micros() as u64;
                st.status
                    .range_spans_us
                    .push((us(started), us(Instant::now())));
            }
        }
        if last < plan.ranges().len() {
            return Ok(false);
        }
        let mut st = self.state()?;
        self.check_generation(&st, generation)?;
        let done = st
            .missing
            .as_ref()
            .is_some_and(|m| m.rows_left == 0 && m.parities_left == 0 && !m.dense_missing);
        if !done {
            return Err(PsError::Internal(format!(
                "server {}: every lock range ran but {} rows and {} parities are still missing",
                self.inner.me.0, st.status.rows_missing, st.status.parities_missing
            )));
        }
        st.missing = None;
        st.status.finished = true;
        if let Ok(mut v) = self.inner.decode_buffers.lock() {
            *v = Vec::new();
        }
        ftrec_obs::metrics().ecrec_rebuild_progress_ratio.set(1.0);
        drop(st);
        self.inner.server.set_row_source(None)?;
        Ok(true)
    }

    /// Stripes of one rebuild batch: about [`REBUILD_BATCH_BYTES`] of rows read and decoded.
    fn batch_stripes(&self) -> usize {
        if let Some(n) = self.inner.cfg.rebuild_batch_stripes {
            return n.max(1);
        }
        let row = self.inner.words * std::mem::size_of::<f32>();
        // Per stripe: k rows read and (at most r, mostly one) row decoded.
        let per_stripe = row * (self.inner.layout.k() + 1);
        (REBUILD_BATCH_BYTES / per_stripe.max(1)).clamp(MIN_BATCH_STRIPES, MAX_BATCH_STRIPES)
    }

    /// Rebuild what lock range `range` of `plan` holds for this node (ECRec §3.4).
    async fn rebuild_range(
        &self,
        generation: u64,
        plan: &RecoveryPlan,
        range: usize,
        busy: &mut Duration,
    ) -> Result<(), PsError> {
        let me = self.inner.me;
        let mut cursor = plan.cursor(range)?;
        let stripes = self.batch_stripes();
        // A decode needs one consistent cut per stripe only, so the range is read in
        // batches, each under its own cut: a batch's reads (one message per survivor) fit
        // between two commits even while training runs at full speed, where one cut over a
        // whole server would be retried forever. A batch is a few MiB, so that per-message
        // and per-lock costs are spread over many rows, and its tasks are taken from the plan
        // one batch at a time (a whole range's tasks held at once cost a replacement as much
        // memory as its shard), each with what is still missing when it starts (training
        // decodes rows on demand meanwhile). Between batches the driver rests as the rebuild
        // share asks, so that the rebuild yields to training.
        //
        // At the full share batches are pipelined: the next batch's lock is taken and its
        // reads are sent before the current one is decoded and merged, so that the survivors'
        // reads overlap the replacement's decode (the two batches' stripes are disjoint, each
        // has its own cut and its own stamps, so neither sees the other).
        let mut batches = [TaskBatch::new(), TaskBatch::new()];
        let mut pending: Option<InFlight<'_>> = None;
        loop {
            let next = pending.as_ref().map_or(0, |p| 1 - p.which);
            batches[next].clear();
            {
                let st = self.state()?;
                self.check_generation(&st, generation)?;
                let Some(m) = st.missing.as_ref() else {
                    return Ok(());
                };
                let wanted = |x: &StripeMember| {
                    x.server == me
                        && match x.location {
                            Location::Row { table, local, .. } => {
                                m.rows[table.0 as usize][local as usize]
                            }
                            Location::Parity { slot, .. } => {
                                m.parities[slot.table.0 as usize][slot.index as usize]
                            }
                            Location::Absent => false,
                        }
                };
                cursor.fill(stripes, wanted, &mut batches[next]);
            }
            let rest = Instant::now();
            let (t0, started) = if batches[next].is_empty() {
                (rest, None)
            } else {
                self.pace(*busy).await;
                let t0 = Instant::now();
                let (window, committed, stamp) = self.lock_batch(generation, &batches[next])?;
                let reads = self.start_reads(&batches[next])?;
                let p = InFlight {
                    which: next,
                    window,
                    committed,
                    stamp,
                    reads,
                };
                (t0, Some(p))
            };
            let mut done = 0;
            if let Some(p) = pending.take() {
                let which = p.which;
                self.complete_batch(generation, &batches[which], p).await?;
                done += 1;
            }
            // Below the full share the batch is finished before the rest: its reads would
            // otherwise run during the rest, outside the busy time the share is kept on.
            let started = match started {
                Some(p) if *self.inner.share.borrow() < FULL_SHARE_PPM => {
                    let which = p.which;
                    self.complete_batch(generation, &batches[which], p).await?;
                    done += 1;
                    None
                }
                started => started,
            };
            *busy = t0.elapsed();
            {
                let mut st = self.state()?;
                st.status.batches += done;
                st.status.busy_us += micros(*busy);
                st.status.rest_us += micros(t0 - rest);
            }
            match started {
                Some(p) => pending = Some(p),
                None if batches[next].is_empty() => return Ok(()),
                None => {}
            }
        }
    }

    /// Take a batch's lock: note the committed step and start collecting the deltas
    /// committed after it in the batch's missing parity rows, stamped so that only this
    /// lock's decode is merged into them. Returns the lock's window, the step and the stamp.
    fn lock_batch(
        &self,
        generation: u64,
        tasks: &TaskBatch,
    ) -> Result<(LockWindow<'_>, Option<u64>, u64), PsError> {
        let me = self.inner.me;
        let w = self.inner.words;
        let lock = Instant::now();
        let window = LockWindow::open(self)?;
        let mut st = self.state()?;
        self.check_generation(&st, generation)?;
        let st = &mut *st;
        let m = st.missing.as_mut().ok_or(PsError::Internal(
            "rebuild state vanished during a range".into(),
        ))?;
        m.next_stamp += 1;
        let stamp = m.next_stamp;
        for x in tasks.all_rebuilt() {
            if let (true, Location::Parity { slot, .. }) = (x.server == me, x.location) {
                let (tt, si) = (slot.table.0 as usize, slot.index as usize);
                if m.parities[tt][si] {
                    st.parity[tt][si * w..(si + 1) * w].fill(0.0);
                    m.stamps[tt][si] = stamp;
                }
            }
        }
        st.status.lock_us += micros(lock.elapsed());
        Ok((window, st.committed, stamp))
    }

    /// Finish a batch whose lock is taken and whose reads were sent: decode and merge it,
    /// or, if its reads do not form the lock's cut, run it again from a new lock.
    async fn complete_batch(
        &self,
        generation: u64,
        tasks: &TaskBatch,
        p: InFlight<'_>,
    ) -> Result<(), PsError> {
        if self
            .finish_batch(generation, tasks, p.window, p.committed, p.stamp, p.reads)
            .await?
        {
            return Ok(());
        }
        self.rebuild_batch(generation, tasks).await
    }

    /// One batch from its lock to its merge, with a new lock for every cut that fails.
    async fn rebuild_batch(&self, generation: u64, tasks: &TaskBatch) -> Result<(), PsError> {
        for _ in 0..CUT_ATTEMPTS {
            let (window, committed, stamp) = self.lock_batch(generation, tasks)?;
            let reads = self.start_reads(tasks)?;
            if self
                .finish_batch(generation, tasks, window, committed, stamp, reads)
                .await?
            {
                return Ok(());
            }
        }
        Err(self.no_cut())
    }

    /// Collect a locked batch's reads, decode and merge it; `Ok(false)`: the reads were not
    /// the lock's cut (the lock is released and a pause taken before the caller retries).
    async fn finish_batch(
        &self,
        generation: u64,
        tasks: &TaskBatch,
        window: LockWindow<'_>,
        committed: Option<u64>,
        stamp: u64,
        reads: CutReads,
    ) -> Result<bool, PsError> {
        let Some(outs) = self.finish_cut(tasks, reads, Some(committed)).await? else {
            drop(window);
            let wait = Instant::now();
            self.pause_before_retry().await?;
            self.state()?.status.lock_us += micros(wait.elapsed());
            return Ok(false);
        };
        self.run_hook(RebuildPoint::Decoded { generation }).await?;
        self.merge_batch(generation, stamp, tasks, &outs)?;
        drop(window);
        self.recycle(outs);
        self.run_hook(RebuildPoint::Merged { generation }).await?;
        Ok(true)
    }

    /// Install the decoded rows of a batch and merge its decoded parities into the slots its
    /// lock zeroed (stamp `stamp`): a slot zeroed again since, by another batch, collects
    /// deltas from that later lock on, and only that batch's decode fits it.
    fn merge_batch(
        &self,
        generation: u64,
        stamp: u64,
        tasks: &TaskBatch,
        outs: &Decoded,
    ) -> Result<(), PsError> {
        let me = self.inner.me;
        let w = self.inner.words;
        let mut st = self.state()?;
        let merge = Instant::now();
        self.check_generation(&st, generation)?;
        let mut rows = Vec::new();
        let mut merged = 0u64;
        let st = &mut *st;
        let mut scratch = vec![0.0f32; w];
        for i in 0..tasks.len() {
            for (x, words) in tasks.rebuild(i).iter().zip(outs.rows(i)) {
                if x.server != me {
                    continue;
                }
                match x.location {
                    Location::Row { table, local, .. } => rows.push((table, local, words)),
                    Location::Parity { slot, .. } => {
                        let (tt, si) = (slot.table.0 as usize, slot.index as usize);
                        let Some(m) = st.missing.as_mut() else {
                            continue;
                        };
                        if m.parities[tt][si] && m.stamps[tt][si] == stamp {
                            scratch.copy_from_slice(words);
                            let acc = &st.parity[tt][si * w..(si + 1) * w];
                            self.inner.code.merge_parity(acc, &mut scratch)?;
                            st.parity[tt][si * w..(si + 1) * w].copy_from_slice(&scratch);
                            m.parities[tt][si] = false;
                            m.parities_left -= 1;
                            merged += 1;
                        }
                    }
                    Location::Absent => {}
                }
            }
        }
        st.status.lock_us += micros(merge.elapsed());
        // A missing row cannot have changed since the cut: only this node updates it, and
        // only after installing it.
        let installed = self.install_rows(st, &rows)?;
        st.status.parities_missing = st.missing.as_ref().map_or(0, |m| m.parities_left);
        let bytes = (installed + merged) * (w * std::mem::size_of::<f32>()) as u64;
        st.status.bytes_rebuilt += bytes;
        let m = ftrec_obs::metrics();
        m.ecrec_rebuild_bytes.inc_by(bytes);
        if let Some(miss) = st.missing.as_ref().filter(|m| m.total > 0) {
            let left = miss.rows_left + miss.parities_left;
            m.ecrec_rebuild_progress_ratio
                .set(1.0 - left as f64 / miss.total as f64);
        }
        Ok(())
    }

    /// Copy the dense part from surviving copies at one consistent step and take that step
    /// as this node's committed step: from then on it takes part in steps.
    async fn join(&self, lost: &[ServerId]) -> Result<(), PsError> {
        let me = self.inner.me;
        let n = self.inner.layout.servers();
        let d = self.inner.cfg.dense_replicas as u32;
        let alive = |s: ServerId| !lost.contains(&s);
        // Any surviving holder of `primary`'s range: the primary, then its replicas.
        let source = |primary: ServerId| -> Result<ServerId, PsError> {
            std::iter::once(primary)
                .chain((1..=d).map(|i| ServerId((primary.0 + i) % n)))
                .find(|&s| s != me && alive(s))
                .ok_or_else(|| {
                    PsError::Coding(format!(
                        "no surviving copy of server {}'s dense blocks ({} dense replicas, lost \
                         servers {:?}): the dense part cannot be rebuilt",
                        primary.0,
                        d,
                        lost.iter().map(|s| s.0).collect::<Vec<_>>()
                    ))
                })
        };
        let replica_primaries: Vec<ServerId> =
            self.state()?.replicas.iter().map(|r| r.primary).collect();
        let mut wanted = vec![(me, source(me)?)];
        for p in &replica_primaries {
            wanted.push((*p, source(*p)?));
        }
        for _ in 0..CUT_ATTEMPTS {
            let mut reads = Vec::with_capacity(wanted.len());
            for (primary, from) in &wanted {
                reads.push(self.peer(*from)?.read_dense(*primary).await?);
            }
            let step = reads[0].step;
            if reads.iter().any(|r| r.step != step) {
                self.pause_before_retry().await?;
                continue;
            }
            let mut st = self.state()?;
            let mut s = self.inner.server.write()?;
            s.import_dense(&reads[0].block)?;
            s.set_last_committed_step(step);
            drop(s);
            for (r, read) in st.replicas.iter_mut().zip(&reads[1..]) {
                if read.block.values.len() != r.dense.values.len()
                    || read.block.state.len() != r.dense.state.len()
                    || read.block.first_block != r.blocks.start
                {
                    return Err(PsError::ShapeMismatch {
                        what: format!("dense copy of server {}", r.primary.0),
                        expected: (r.dense.values.len() + r.dense.state.len()) as u64,
                        got: (read.block.values.len() + read.block.state.len()) as u64,
                    });
                }
                r.dense.values.copy_from_slice(&read.block.values);
                r.dense.state.copy_from_slice(&read.block.state);
            }
            st.committed = step;
            if let Some(m) = st.missing.as_mut() {
                m.dense_missing = false;
            }
            st.status.joined = true;
            return Ok(());
        }
        Err(self.no_cut())
    }
}

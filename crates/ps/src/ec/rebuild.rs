//! Degraded reads, on-demand decodes and the lock-range rebuild of a replacement (ECRec §3.4).
//!
//! Every decode reads its stripe members from the survivors as one consistent cut: each
//! [`MemberRead`] carries the step its node had committed when it copied the words (under the
//! lock its commits take), and a decode goes ahead only when all of them, and the decoding
//! node where it matters, name the same step. Otherwise a commit ran in between: the reads
//! are retried (counted in [`RebuildStatus::cut_retries`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ftrec_core::{RowId, ServerId, TableId};
use ftrec_ec::{
    degraded_read, Decoder, Location, RecoveryOptions, RecoveryPlan, RecoveryTask, StripeMember,
};

use super::node::{EcInner, EcNode};
use super::service::EcService;
use super::types::{MemberKey, MemberRead, RebuildStatus};
use crate::update::{PulledRows, RowRequest};
use crate::{PsError, RowSource};

/// Attempts at a consistent cut before a decode gives up.
const CUT_ATTEMPTS: u32 = 200;

/// Stripes decoded under one cut during a rebuild.
const CUT_BATCH_STRIPES: usize = 256;

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
        tasks: &[RecoveryTask],
        expect: Option<Option<u64>>,
    ) -> Result<Option<Vec<Vec<Vec<f32>>>>, PsError> {
        let mut keys: BTreeMap<u32, Vec<MemberKey>> = BTreeMap::new();
        // (server, index among its keys) per read, None for an absent position.
        let mut refs: Vec<Vec<Option<(u32, usize)>>> = Vec::with_capacity(tasks.len());
        for t in tasks {
            refs.push(
                t.reads
                    .iter()
                    .map(|m| {
                        key_of(m).map(|k| {
                            let v = keys.entry(m.server.0).or_default();
                            v.push(k);
                            (m.server.0, v.len() - 1)
                        })
                    })
                    .collect(),
            );
        }
        let mut set = tokio::task::JoinSet::new();
        for (s, k) in keys {
            let peer = self.peer(ServerId(s))?;
            set.spawn(async move { (s, peer.read_members(k).await) });
        }
        let mut reads: HashMap<u32, MemberRead> = HashMap::new();
        while let Some(r) = set.join_next().await {
            let (s, r) = r.map_err(|e| PsError::Internal(format!("read task failed: {e}")))?;
            reads.insert(s, r?);
        }
        let mut steps = reads.values().map(|r| r.step);
        let first = steps.next();
        if let Some(f) = first {
            if steps.any(|s| s != f) || expect.is_some_and(|e| e != f) {
                return Ok(None);
            }
        }
        let w = self.inner.words;
        let zeros = vec![0.0f32; w];
        let mut decoders: HashMap<(Vec<usize>, Vec<usize>), Decoder> = HashMap::new();
        let mut out = Vec::with_capacity(tasks.len());
        for (t, r) in tasks.iter().zip(&refs) {
            let wanted = t.wanted();
            let key = (t.available.clone(), wanted.clone());
            if !decoders.contains_key(&key) {
                let d = self.inner.code.decoder(&t.available, &wanted)?;
                decoders.insert(key.clone(), d);
            }
            let dec = &decoders[&key];
            let ins: Vec<&[f32]> = r
                .iter()
                .map(|x| match x {
                    Some((s, i)) => {
                        let rd = &reads[s];
                        &rd.data[i * rd.words..(i + 1) * rd.words]
                    }
                    None => &zeros[..],
                })
                .collect();
            let mut outs = vec![vec![0.0f32; w]; wanted.len()];
            {
                let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                dec.decode(&ins, &mut o)?;
            }
            out.push(outs);
        }
        Ok(Some(out))
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
        let tasks = wanted
            .iter()
            .map(|&(t, r)| degraded_read(&self.inner.layout, &self.inner.code, t, r, &lost))
            .collect::<Result<Vec<_>, _>>()?;
        for _ in 0..CUT_ATTEMPTS {
            let committed = self.state()?.committed;
            if let Some(outs) = self.decode_cut(&tasks, Some(committed)).await? {
                let rows: Vec<(TableId, u64, Vec<f32>)> = wanted
                    .iter()
                    .zip(outs)
                    .map(|(&(t, r), mut o)| (t, self.local_of(t, r), o.remove(0)))
                    .collect();
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
        let tasks = rows
            .iter()
            .map(|&r| degraded_read(&self.inner.layout, &self.inner.code, table, r, &lost))
            .collect::<Result<Vec<_>, _>>()?;
        let dim = self.inner.dim;
        for _ in 0..CUT_ATTEMPTS {
            if let Some(outs) = self.decode_cut(&tasks, None).await? {
                let mut values = Vec::with_capacity(rows.len() * dim);
                for o in outs {
                    values.extend_from_slice(&o[0][..dim]);
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
    /// replacement: see [`EcService::start_rebuild`].
    pub async fn start_rebuild(&self, lost: &[ServerId], background: bool) -> Result<(), PsError> {
        self.begin_rebuild(lost).await?;
        if background {
            let node = self.clone();
            tokio::spawn(async move {
                let _ = node.rebuild_ranges(usize::MAX).await;
            });
            Ok(())
        } else {
            self.rebuild_ranges(usize::MAX).await.map(|_| ())
        }
    }

    /// The first half of [`EcNode::start_rebuild`]: plan the rebuild for the lost set `lost`,
    /// copy the dense part and join the steps. From here on the node serves every pull and
    /// step, decoding the rows they touch on demand (degraded mode); the lock ranges are run
    /// by [`EcNode::rebuild_ranges`].
    pub async fn begin_rebuild(&self, lost: &[ServerId]) -> Result<(), PsError> {
        let me = self.inner.me;
        let lost = normalise(lost, Some(me));
        let plan = Arc::new(RecoveryPlan::new(
            &self.inner.layout,
            &self.inner.code,
            &lost,
            RecoveryOptions {
                lock_ranges: self.inner.cfg.lock_ranges,
            },
        )?);
        let dense_missing = {
            let mut st = self.state()?;
            let Some(m) = st.missing.as_mut() else {
                return Err(PsError::InvalidConfig(format!(
                    "server {} has nothing to rebuild (it is not a replacement, or its \
                     rebuild already finished)",
                    me.0
                )));
            };
            m.lost = lost.clone();
            m.plan = Some(plan.clone());
            let dense_missing = m.dense_missing;
            st.status.started = true;
            st.status.error = None;
            st.status.ranges_total = plan.ranges().len() as u64;
            st.status.ranges_done = 0;
            dense_missing
        };
        if dense_missing {
            if let Err(e) = self.join(&lost).await {
                self.state()?.status.error = Some(e.to_string());
                return Err(e);
            }
        }
        let source: Arc<dyn RowSource> = Arc::new(NodeRowSource(super::node::downgrade(self)));
        self.inner.server.set_row_source(Some(source))?;
        Ok(())
    }

    /// Rebuild up to `max` further lock ranges of the rebuild begun with
    /// [`EcNode::begin_rebuild`]; returns whether the rebuild finished. Run one driver at a
    /// time (a background rebuild is one).
    pub async fn rebuild_ranges(&self, max: usize) -> Result<bool, PsError> {
        let (plan, first) = {
            let st = self.state()?;
            match st.missing.as_ref().and_then(|m| m.plan.clone()) {
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
        for i in first..last {
            let r = if self.is_killed() {
                Err(PsError::Unavailable {
                    addr: format!("server {}", self.inner.me.0),
                    reason: "killed during its rebuild".into(),
                })
            } else {
                self.rebuild_range(&plan, i).await
            };
            if let Err(e) = r {
                self.state()?.status.error = Some(e.to_string());
                return Err(e);
            }
            self.state()?.status.ranges_done += 1;
        }
        if last < plan.ranges().len() {
            return Ok(false);
        }
        let mut st = self.state()?;
        let done = st
            .missing
            .as_ref()
            .is_some_and(|m| m.rows_left == 0 && m.parities_left == 0 && !m.dense_missing);
        if !done {
            let e = PsError::Internal(format!(
                "server {}: every lock range ran but {} rows and {} parities are still missing",
                self.inner.me.0, st.status.rows_missing, st.status.parities_missing
            ));
            st.status.error = Some(e.to_string());
            return Err(e);
        }
        st.missing = None;
        st.status.finished = true;
        drop(st);
        self.inner.server.set_row_source(None)?;
        Ok(true)
    }

    /// Rebuild what lock range `range` of `plan` holds for this node (ECRec §3.4).
    async fn rebuild_range(&self, plan: &RecoveryPlan, range: usize) -> Result<(), PsError> {
        let me = self.inner.me;
        let tasks: Vec<RecoveryTask> = {
            let st = self.state()?;
            let Some(m) = st.missing.as_ref() else {
                return Ok(());
            };
            plan.tasks(range)?
                .filter(|t| {
                    t.rebuild.iter().any(|x| {
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
                    })
                })
                .collect()
        };
        // A decode needs one consistent cut per stripe only, so the range is read in small
        // batches, each under its own cut: a batch's reads fit between two commits even while
        // training runs at full speed, where one cut over a whole server would be retried
        // forever.
        for batch in tasks.chunks(CUT_BATCH_STRIPES) {
            self.rebuild_batch(batch).await?;
        }
        Ok(())
    }

    async fn rebuild_batch(&self, tasks: &[RecoveryTask]) -> Result<(), PsError> {
        let me = self.inner.me;
        let w = self.inner.words;
        for _ in 0..CUT_ATTEMPTS {
            // The lock: note the step and start collecting the deltas committed after it in
            // the missing parity rows of the range.
            let committed = {
                let mut st = self.state()?;
                let st = &mut *st;
                let m = st.missing.as_ref().ok_or(PsError::Internal(
                    "rebuild state vanished during a range".into(),
                ))?;
                for t in tasks {
                    for x in &t.rebuild {
                        if let (true, Location::Parity { slot, .. }) = (x.server == me, x.location)
                        {
                            if m.parities[slot.table.0 as usize][slot.index as usize] {
                                let at = slot.index as usize * w;
                                st.parity[slot.table.0 as usize][at..at + w].fill(0.0);
                            }
                        }
                    }
                }
                st.committed
            };
            let Some(outs) = self.decode_cut(tasks, Some(committed)).await? else {
                self.pause_before_retry().await?;
                continue;
            };
            let mut st = self.state()?;
            let mut rows = Vec::new();
            for (t, o) in tasks.iter().zip(outs) {
                for (x, words) in t.rebuild.iter().zip(o) {
                    if x.server != me {
                        continue;
                    }
                    match x.location {
                        Location::Row { table, local, .. } => rows.push((table, local, words)),
                        Location::Parity { slot, .. } => {
                            let (tt, si) = (slot.table.0 as usize, slot.index as usize);
                            let missing = st.missing.as_ref().is_some_and(|m| m.parities[tt][si]);
                            if missing {
                                let mut words = words;
                                let acc = &st.parity[tt][si * w..(si + 1) * w];
                                self.inner.code.merge_parity(acc, &mut words)?;
                                st.parity[tt][si * w..(si + 1) * w].copy_from_slice(&words);
                                if let Some(m) = st.missing.as_mut() {
                                    m.parities[tt][si] = false;
                                    m.parities_left -= 1;
                                }
                            }
                        }
                        Location::Absent => {}
                    }
                }
            }
            // A missing row cannot have changed since the cut: only this node updates it, and
            // only after installing it.
            self.install_rows(&mut st, &rows)?;
            st.status.parities_missing = st.missing.as_ref().map_or(0, |m| m.parities_left);
            return Ok(());
        }
        Err(self.no_cut())
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

//! The lineage graph of full, merged and delta checkpoints (DECK §3.3, §4.3, Figs. 5 and 9).
//!
//! Every non-full checkpoint has one parent: the checkpoint whose state its rows apply to.
//! Each checkpoint also *stands for* a training state, named by its **tip**: a delta and a
//! trainer-written full stand for themselves; a merged checkpoint stands for the state of the
//! last checkpoint it merged, and so does a full the merger writes. Restoring a state means
//! finding the shortest chain `full, x1, ..., xk` where each `x` applies to a state the previous
//! element stands for; merged checkpoints shorten chains, fulls written by the merger truncate
//! them, and a checkpoint no longer on any wanted chain can be deleted.
//!
//! The graph is built from manifests only (cheap); files are verified when they are read.
//! Merge metadata lives in the manifest's `extra["deck"]` ([`DeckMeta`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoints;
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, CheckpointKind, Manifest};

/// Key of [`DeckMeta`] in [`Manifest::extra`].
pub const META_KEY: &str = "deck";

/// What a merged checkpoint (or a full written by the merger) records about its inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeckMeta {
    /// The state this checkpoint stands for.
    pub tip: CheckpointId,
    /// Merge layer: deltas are layer 0; merging `s` checkpoints of layer `i` gives `i + 1`.
    pub layer: u32,
    /// The checkpoints merged into this one, oldest first.
    pub merged_from: Vec<CheckpointId>,
    /// How many original deltas this one covers.
    pub deltas: u64,
}

impl DeckMeta {
    pub fn of(m: &Manifest) -> Option<DeckMeta> {
        m.extra
            .get(META_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    pub fn store_in(&self, m: &mut Manifest) {
        m.extra.insert(
            META_KEY.into(),
            serde_json::to_value(self).expect("meta serializes"),
        );
    }
}

/// One checkpoint of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: CheckpointId,
    pub kind: CheckpointKind,
    pub step: u64,
    pub parent: Option<CheckpointId>,
    pub tip: CheckpointId,
    pub layer: u32,
    /// Original deltas covered (1 for a delta, 0 for a full).
    pub deltas: u64,
    pub bytes: u64,
    pub merged_from: Vec<CheckpointId>,
}

impl Node {
    pub fn from_manifest(m: &Manifest) -> Node {
        let meta = DeckMeta::of(m);
        let (tip, layer, deltas, merged_from) = match (m.kind, meta) {
            (_, Some(meta)) => (meta.tip, meta.layer, meta.deltas, meta.merged_from),
            (CheckpointKind::Delta, None) => (m.id.clone(), 0, 1, Vec::new()),
            (CheckpointKind::Merged, None) => (m.id.clone(), 1, 1, Vec::new()),
            (CheckpointKind::Full, None) => (m.id.clone(), 0, 0, Vec::new()),
        };
        Node {
            id: m.id.clone(),
            kind: m.kind,
            step: m.step,
            parent: m.parents.first().cloned(),
            tip,
            layer,
            deltas: if m.kind == CheckpointKind::Full {
                0
            } else {
                deltas
            },
            bytes: m.data_bytes(),
            merged_from,
        }
    }
}

/// One checkpoint of a [`Lineage::listing`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Listed<'a> {
    pub node: &'a Node,
    /// `CURRENT` names it.
    pub current: bool,
    /// The active lineage needs it (kept by a collection with the default retention).
    pub live: bool,
}

/// Which checkpoints to keep (DECK §4.3). The default keeps the active lineage only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep older full checkpoints whose steps are at least this far apart (rollback points
    /// for data corruption); 0 keeps none beyond the active lineage.
    pub full_every_steps: u64,
    /// At most this many such older fulls (newest first).
    pub max_old_fulls: usize,
}

/// The graph of every readable checkpoint in a store.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    nodes: BTreeMap<CheckpointId, Node>,
    /// Manifests that could not be read, with the reason.
    pub unreadable: Vec<(CheckpointId, String)>,
    /// The id `CURRENT` points at, if readable.
    pub current: Option<CheckpointId>,
    /// Why `CURRENT` could not be read (present but unreadable, or the read failed). Then
    /// the head is a guess, and nothing may be collected on its strength.
    pub current_error: Option<String>,
}

impl Lineage {
    /// Read every manifest (and `CURRENT`) of `ckpts`.
    pub async fn load(ckpts: &Checkpoints) -> Result<Lineage> {
        let (current, current_error) = match ckpts.read_current().await {
            Ok(p) => (p.map(|p| p.id), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let mut l = Lineage {
            current,
            current_error,
            ..Default::default()
        };
        for id in ckpts.list_checkpoints().await? {
            match ckpts.read_manifest(&id, None).await {
                Ok(m) => l.insert(&m),
                Err(e) if e.is_corruption() || matches!(e, CkptError::NotFound { .. }) => {
                    l.unreadable.push((id, e.to_string()))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(l)
    }

    pub fn from_manifests<'a>(
        manifests: impl IntoIterator<Item = &'a Manifest>,
        current: Option<CheckpointId>,
    ) -> Lineage {
        let mut l = Lineage {
            current,
            ..Default::default()
        };
        for m in manifests {
            l.insert(m);
        }
        l
    }

    pub fn insert(&mut self, m: &Manifest) {
        self.nodes.insert(m.id.clone(), Node::from_manifest(m));
    }

    pub fn remove(&mut self, id: &CheckpointId) {
        self.nodes.remove(id);
    }

    /// Put back a node [`Lineage::take_dead`] took (its checkpoint could not be deleted).
    pub fn insert_node(&mut self, n: Node) {
        self.nodes.insert(n.id.clone(), n);
    }

    /// A commit: `m` joins the graph and `CURRENT` names it. A caller that keeps a lineage
    /// in memory (a coordinator) stays in step with the store without reading it again.
    pub fn commit(&mut self, m: &Manifest) {
        self.insert(m);
        self.current = Some(m.id.clone());
    }

    /// Remove and return every node no live lineage needs under `retention` (DECK §4.3), the
    /// checkpoints a collection deletes. In memory: reads nothing.
    /// Nothing while `CURRENT` is unreadable ([`Lineage::current_error`]): the head would be
    /// a guess.
    pub fn take_dead(&mut self, retention: &Retention) -> Vec<Node> {
        if self.current_error.is_some() {
            return Vec::new();
        }
        let live = self.live(retention);
        let dead: Vec<CheckpointId> = self
            .nodes
            .keys()
            .filter(|id| !live.contains(*id))
            .cloned()
            .collect();
        dead.iter().filter_map(|id| self.nodes.remove(id)).collect()
    }

    pub fn node(&self, id: &CheckpointId) -> Option<&Node> {
        self.nodes.get(id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// For every state, the checkpoints that stand for it (a checkpoint also stands for itself
    /// when named by its own id), in id order: one pass over the graph, so that walking a chain
    /// of `n` checkpoints costs `O(n)` lookups, not `n` scans of the graph.
    fn by_state(&self) -> HashMap<&CheckpointId, Vec<&Node>> {
        let mut out: HashMap<&CheckpointId, Vec<&Node>> = HashMap::new();
        for n in self.nodes.values() {
            out.entry(&n.tip).or_default().push(n);
            if n.id != n.tip {
                out.entry(&n.id).or_default().push(n);
            }
        }
        out
    }

    /// The shortest chain (full first) that rebuilds the state `state` names: a checkpoint id,
    /// or the id of a delta that merging has since replaced. Errors name the checkpoint whose
    /// base cannot be found.
    ///
    /// The walk is iterative with an explicit stack, and each state remembers only its chain's
    /// length and the checkpoint it ends with: a lineage of any depth (a `deck` run that never
    /// merges keeps one delta per save) resolves in memory and time linear in its size, with no
    /// recursion to overflow the stack.
    pub fn resolve(&self, state: &CheckpointId) -> Result<Vec<CheckpointId>> {
        self.resolve_state(state)
            .map_err(|reason| CkptError::InvalidCheckpoint {
                id: state.to_string(),
                reason,
            })
    }

    fn resolve_state(
        &self,
        target: &CheckpointId,
    ) -> std::result::Result<Vec<CheckpointId>, String> {
        /// What is known of a state: being resolved (a lineage that comes back to it loops), or
        /// its shortest chain's length and last checkpoint.
        enum Known<'a> {
            InProgress,
            Done(std::result::Result<(usize, &'a Node), String>),
        }
        /// A state being resolved: its candidates, the next one to look at, the best so far.
        struct Frame<'a> {
            state: &'a CheckpointId,
            candidates: &'a [&'a Node],
            next: usize,
            best: Option<(usize, &'a Node)>,
            why: Option<String>,
        }
        let index = self.by_state();
        let none: Vec<&Node> = Vec::new();
        let candidates = |s: &CheckpointId| index.get(s).unwrap_or(&none).as_slice();
        let frame = |state| Frame {
            state,
            candidates: candidates(state),
            next: 0,
            best: None,
            why: None,
        };
        let mut known: HashMap<&CheckpointId, Known> = HashMap::new();
        known.insert(target, Known::InProgress);
        let mut stack = vec![frame(target)];
        while let Some(f) = stack.last_mut() {
            if let Some(&n) = f.candidates.get(f.next) {
                let found = match (&n.kind, &n.parent) {
                    (CheckpointKind::Full, _) => Ok(1),
                    (_, None) => Err(format!("{} has no parent", n.id)),
                    (_, Some(p)) => match known.get(p) {
                        None => {
                            // Resolve the parent first; come back to this candidate after.
                            known.insert(p, Known::InProgress);
                            stack.push(frame(p));
                            continue;
                        }
                        Some(Known::InProgress) => {
                            Err(format!("lineage of {p} loops back to itself"))
                        }
                        Some(Known::Done(Ok((len, _)))) => Ok(len + 1),
                        Some(Known::Done(Err(e))) => Err(e.clone()),
                    },
                };
                match found {
                    Ok(len) if f.best.is_none_or(|(b, _)| len < b) => f.best = Some((len, n)),
                    Ok(_) => {}
                    Err(e) => f.why = Some(e),
                }
                f.next += 1;
                continue;
            }
            let f = stack.pop().expect("a frame is on the stack");
            let r = f.best.ok_or_else(|| {
                f.why.unwrap_or_else(|| {
                    format!(
                        "checkpoint {} is missing and nothing merged stands for it",
                        f.state
                    )
                })
            });
            known.insert(f.state, Known::Done(r));
        }
        // Follow each state's last checkpoint back to the full.
        let mut chain = Vec::new();
        let mut s = target;
        loop {
            match known.get(s) {
                Some(Known::Done(Ok((_, n)))) => {
                    chain.push(n.id.clone());
                    match (&n.kind, &n.parent) {
                        (CheckpointKind::Full, _) => break,
                        (_, Some(p)) => s = p,
                        (_, None) => return Err(format!("{} has no parent", n.id)),
                    }
                }
                Some(Known::Done(Err(e))) => return Err(e.clone()),
                _ => return Err(format!("lineage of {s} is unresolved")),
            }
        }
        chain.reverse();
        Ok(chain)
    }

    /// The newest state (by step, then id) among checkpoints that stand for themselves
    /// (deltas and trainer-written fulls): the last committed point of training.
    pub fn newest_state(&self) -> Option<&Node> {
        self.nodes
            .values()
            .filter(|n| n.tip == n.id)
            .max_by(|a, b| (a.step, &a.id).cmp(&(b.step, &b.id)))
    }

    /// The state training would resume from: `CURRENT`, or the newest state if `CURRENT` is
    /// unreadable.
    pub fn head(&self) -> Option<CheckpointId> {
        self.current
            .clone()
            .or_else(|| self.newest_state().map(|n| n.id.clone()))
    }

    /// The state at the newest step `<= step`, if any.
    /// Merged checkpoints count: a state merged away is still named by its tip.
    pub fn state_at_or_before(&self, step: u64) -> Option<CheckpointId> {
        self.nodes
            .values()
            .filter(|n| n.step <= step)
            .max_by(|a, b| (a.step, &a.tip).cmp(&(b.step, &b.tip)))
            .map(|n| n.tip.clone())
    }

    /// Every state (tip) the graph can name, newest first.
    pub fn states_newest_first(&self) -> Vec<(u64, CheckpointId)> {
        let mut v: Vec<(u64, CheckpointId)> = self
            .nodes
            .values()
            .map(|n| (n.step, n.tip.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        v.reverse();
        v
    }

    /// Every checkpoint a live lineage needs under `retention`: the chain of the head, the
    /// chain of every state newer than the head (commits in flight), and older fulls at broad
    /// intervals (DECK §4.3, Fig. 9). Also the merge inputs of nothing: merged-away deltas are
    /// not live once a merged checkpoint replaces them on every chain.
    pub fn live(&self, retention: &Retention) -> BTreeSet<CheckpointId> {
        let mut live = BTreeSet::new();
        let head = self.head();
        let head_step = head
            .as_ref()
            .and_then(|h| self.nodes.get(h).map(|n| n.step))
            .unwrap_or(0);
        let mut wanted: Vec<CheckpointId> = head.into_iter().collect();
        for n in self.nodes.values() {
            if n.step > head_step {
                wanted.push(n.tip.clone());
            }
        }
        for w in wanted {
            match self.resolve(&w) {
                Ok(chain) => live.extend(chain),
                // A state that cannot be rebuilt keeps everything it might still need.
                Err(_) => live.extend(self.ancestors_of_state(&w)),
            }
        }
        if retention.full_every_steps > 0 {
            let mut fulls: Vec<&Node> = self
                .nodes
                .values()
                .filter(|n| n.kind == CheckpointKind::Full)
                .collect();
            fulls.sort_by(|a, b| (b.step, &b.id).cmp(&(a.step, &a.id)));
            let mut kept = 0;
            let mut last_kept: Option<u64> = None;
            for f in fulls {
                if kept >= retention.max_old_fulls {
                    break;
                }
                if last_kept.is_none_or(|s| s.saturating_sub(f.step) >= retention.full_every_steps)
                {
                    live.insert(f.id.clone());
                    last_kept = Some(f.step);
                    kept += 1;
                }
            }
        }
        live
    }

    /// Everything reachable from the nodes standing for `state` through parents and tips.
    fn ancestors_of_state(&self, state: &CheckpointId) -> BTreeSet<CheckpointId> {
        let index = self.by_state();
        let mut out = BTreeSet::new();
        let mut todo = vec![state.clone()];
        while let Some(s) = todo.pop() {
            for n in index.get(&s).into_iter().flatten() {
                if out.insert(n.id.clone()) {
                    if let Some(p) = &n.parent {
                        todo.push(p.clone());
                    }
                }
            }
        }
        out
    }

    /// Every readable checkpoint in id order, with whether `CURRENT` names it and whether the
    /// active lineage needs it (under the default retention): what [`Lineage::render`] shows.
    pub fn listing(&self) -> Vec<Listed<'_>> {
        let live = self.live(&Retention::default());
        self.nodes
            .values()
            .map(|n| Listed {
                node: n,
                current: Some(&n.id) == self.current.as_ref(),
                live: live.contains(&n.id),
            })
            .collect()
    }

    /// The lineage as indented text, one checkpoint a line: kind, step, size, parent.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for Listed {
            node: n,
            current,
            live,
        } in self.listing()
        {
            let mark = if current {
                "*"
            } else if live {
                "+"
            } else {
                " "
            };
            out.push_str(&format!(
                "{mark} {:<40} {:<6} L{} step {:>10} {:>12} B  parent {}{}\n",
                n.id.as_str(),
                n.kind.name(),
                n.layer,
                n.step,
                n.bytes,
                n.parent.as_ref().map_or("-", |p| p.as_str()),
                if n.tip != n.id {
                    format!("  stands for {}", n.tip)
                } else {
                    String::new()
                }
            ));
        }
        for (id, why) in &self.unreadable {
            out.push_str(&format!("! {id}: {why}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DataPosition;

    fn id(s: &str) -> CheckpointId {
        CheckpointId::new(s).unwrap()
    }

    fn m(name: &str, kind: CheckpointKind, step: u64, parent: Option<&str>) -> Manifest {
        Manifest {
            id: id(name),
            kind,
            step,
            parents: parent.map(id).into_iter().collect(),
            data_position: DataPosition::None,
            shards: vec![],
            files: vec![],
            extra: Default::default(),
        }
    }

    fn merged(
        name: &str,
        step: u64,
        parent: &str,
        tip: &str,
        layer: u32,
        from: &[&str],
    ) -> Manifest {
        let mut x = m(name, CheckpointKind::Merged, step, Some(parent));
        DeckMeta {
            tip: id(tip),
            layer,
            merged_from: from.iter().map(|s| id(s)).collect(),
            deltas: from.len() as u64,
        }
        .store_in(&mut x);
        x
    }

    /// A run that saves a delta every step and never merges: 100,000 deltas over one full
    /// resolve to the whole chain, in order, in a test thread's small stack (the walk does not
    /// recurse) and in linear memory (states keep a length and a checkpoint, not a chain).
    /// A merged checkpoint over the first 99,990 deltas then shortens it to 12.
    #[test]
    fn a_lineage_100_000_deltas_deep_resolves_without_recursion() {
        const N: u64 = 100_000;
        let name = |i: u64| format!("d{i:06}");
        let mut ms = vec![m("f", CheckpointKind::Full, 0, None)];
        for i in 1..=N {
            let parent = if i == 1 { "f".to_string() } else { name(i - 1) };
            ms.push(m(&name(i), CheckpointKind::Delta, i, Some(&parent)));
        }
        let l = Lineage::from_manifests(&ms, Some(id(&name(N))));
        let chain = l.resolve(&id(&name(N))).unwrap();
        assert_eq!(chain.len() as u64, N + 1);
        assert_eq!(chain[0], id("f"));
        assert!(chain.windows(2).skip(1).all(|w| w[0] < w[1]));
        assert_eq!(chain[N as usize], id(&name(N)));
        ms.push(merged("m", 99_990, "f", &name(99_990), 1, &[]));
        let l = Lineage::from_manifests(&ms, Some(id(&name(N))));
        let chain = l.resolve(&id(&name(N))).unwrap();
        assert_eq!(chain.len(), 12);
        assert_eq!(chain[..2], [id("f"), id("m")]);
        assert_eq!(chain[2], id(&name(99_991)));
    }

    /// A parent cycle in damaged metadata is an error naming it, not a hang.
    #[test]
    fn a_parent_cycle_is_an_error() {
        let ms = vec![
            m("a", CheckpointKind::Delta, 1, Some("b")),
            m("b", CheckpointKind::Delta, 2, Some("a")),
        ];
        let l = Lineage::from_manifests(&ms, None);
        let e = l.resolve(&id("b")).unwrap_err().to_string();
        assert!(e.contains("loops back to itself"), "{e}");
    }

    /// DECK Fig. 5 with s = 2: D1 D2 -> M1; D3 D4 -> M1'; M1 M1' -> M2.
    #[test]
    fn resolves_fig5_chains_through_merged_checkpoints() {
        let mut ms = vec![
            m("f0", CheckpointKind::Full, 0, None),
            m("d1", CheckpointKind::Delta, 1, Some("f0")),
            m("d2", CheckpointKind::Delta, 2, Some("d1")),
        ];
        let l = Lineage::from_manifests(&ms, Some(id("d2")));
        assert_eq!(
            l.resolve(&id("d2")).unwrap(),
            vec![id("f0"), id("d1"), id("d2")]
        );
        ms.push(merged("m1", 2, "f0", "d2", 1, &["d1", "d2"]));
        ms.push(m("d3", CheckpointKind::Delta, 3, Some("d2")));
        ms.push(m("d4", CheckpointKind::Delta, 4, Some("d3")));
        let l = Lineage::from_manifests(&ms, Some(id("d4")));
        assert_eq!(l.resolve(&id("d2")).unwrap(), vec![id("f0"), id("m1")]);
        assert_eq!(
            l.resolve(&id("d4")).unwrap(),
            vec![id("f0"), id("m1"), id("d3"), id("d4")]
        );
        ms.push(merged("m1b", 4, "d2", "d4", 1, &["d3", "d4"]));
        ms.push(merged("m2", 4, "f0", "d4", 2, &["m1", "m1b"]));
        let l = Lineage::from_manifests(&ms, Some(id("d4")));
        assert_eq!(l.resolve(&id("d4")).unwrap(), vec![id("f0"), id("m2")]);
        // GC: only the full and M2 are live; M1 and every delta can go.
        let live = l.live(&Retention::default());
        assert_eq!(live, [id("f0"), id("m2")].into_iter().collect());
        // Delete the merged-away ones; the head still resolves.
        let mut l2 = l.clone();
        for gone in ["d1", "d2", "d3", "d4", "m1", "m1b"] {
            l2.remove(&id(gone));
        }
        assert_eq!(l2.resolve(&id("d4")).unwrap(), vec![id("f0"), id("m2")]);
        // A later delta applies to d4's state, which m2 stands for.
        ms.push(m("d5", CheckpointKind::Delta, 5, Some("d4")));
        let mut l3 = Lineage::from_manifests(&ms, Some(id("d5")));
        for gone in ["d1", "d2", "d3", "d4", "m1", "m1b"] {
            l3.remove(&id(gone));
        }
        assert_eq!(
            l3.resolve(&id("d5")).unwrap(),
            vec![id("f0"), id("m2"), id("d5")]
        );
    }

    #[test]
    fn a_missing_base_is_an_error_naming_it_and_gc_keeps_what_may_be_needed() {
        let ms = vec![
            m("f0", CheckpointKind::Full, 0, None),
            m("d2", CheckpointKind::Delta, 2, Some("d1")),
        ];
        let l = Lineage::from_manifests(&ms, Some(id("d2")));
        let e = l.resolve(&id("d2")).unwrap_err();
        assert!(e.to_string().contains("d1"), "{e}");
        let live = l.live(&Retention::default());
        assert!(live.contains(&id("d2")));
    }

    #[test]
    fn retention_keeps_older_fulls_at_broad_intervals() {
        let mut ms = Vec::new();
        for s in [0u64, 10, 20, 30, 40, 50] {
            ms.push(m(&format!("f{s}"), CheckpointKind::Full, s, None));
        }
        ms.push(m("d55", CheckpointKind::Delta, 55, Some("f50")));
        let l = Lineage::from_manifests(&ms, Some(id("d55")));
        let live = l.live(&Retention {
            full_every_steps: 20,
            max_old_fulls: 3,
        });
        let want: BTreeSet<_> = ["f50", "d55", "f30", "f10"].iter().map(|s| id(s)).collect();
        assert_eq!(live, want);
        assert_eq!(
            l.live(&Retention::default()),
            ["f50", "d55"].iter().map(|s| id(s)).collect()
        );
    }

    #[test]
    fn states_newer_than_current_stay_live() {
        let ms = vec![
            m("f0", CheckpointKind::Full, 0, None),
            m("d1", CheckpointKind::Delta, 1, Some("f0")),
            m("d2", CheckpointKind::Delta, 2, Some("d1")),
        ];
        // CURRENT was not moved yet after d2's manifest landed.
        let l = Lineage::from_manifests(&ms, Some(id("d1")));
        assert_eq!(l.live(&Retention::default()).len(), 3);
        assert_eq!(l.newest_state().unwrap().id, id("d2"));
        assert_eq!(l.state_at_or_before(1).unwrap(), id("d1"));
    }

    /// Which checkpoints a sequence of commits (a full, or a delta or piece over the newest
    /// commit, as a trainer writes them) leaves, and with what `CURRENT`.
    fn commits(fulls: &[bool]) -> Vec<Manifest> {
        let mut out: Vec<Manifest> = Vec::new();
        for (step, &full) in fulls.iter().enumerate() {
            let name = format!("c{step:04}");
            let parent = out.last().map(|p| p.id.to_string());
            out.push(match (full, parent) {
                (false, Some(p)) => m(&name, CheckpointKind::Delta, step as u64, Some(&p)),
                _ => m(&name, CheckpointKind::Full, step as u64, None),
            });
        }
        out
    }

    proptest::proptest! {
        /// A lineage kept in memory by commits and [`Lineage::take_dead`] (a coordinator's
        /// collection after every commit) deletes, commit after commit, exactly what a lineage
        /// read afresh from the surviving manifests would, and keeps the same graph.
        #[test]
        fn a_kept_lineage_collects_what_a_fresh_load_does(
            fulls in proptest::collection::vec(proptest::bool::weighted(0.2), 1..60),
        ) {
            let all = commits(&fulls);
            let mut kept = Lineage::default();
            let mut stored: Vec<Manifest> = Vec::new();
            for c in &all {
                stored.push(c.clone());
                kept.commit(c);
                let fresh = Lineage::from_manifests(&stored, Some(c.id.clone()));
                let live = fresh.live(&Retention::default());
                let want: BTreeSet<CheckpointId> = stored
                    .iter()
                    .map(|x| x.id.clone())
                    .filter(|x| !live.contains(x))
                    .collect();
                let got: BTreeSet<CheckpointId> = kept
                    .take_dead(&Retention::default())
                    .into_iter()
                    .map(|n| n.id)
                    .collect();
                proptest::prop_assert_eq!(&got, &want);
                stored.retain(|x| !want.contains(&x.id));
                let left: Vec<&CheckpointId> = kept.nodes().map(|n| &n.id).collect();
                let stored_ids: Vec<&CheckpointId> = stored.iter().map(|x| &x.id).collect();
                proptest::prop_assert_eq!(left, stored_ids);
                // What is left always restores the newest commit.
                proptest::prop_assert!(kept.resolve(&c.id).is_ok());
            }
        }
    }

    #[test]
    fn a_node_put_back_is_collected_again() {
        let mut l = Lineage::default();
        l.commit(&m("f0", CheckpointKind::Full, 0, None));
        l.commit(&m("d1", CheckpointKind::Delta, 1, Some("f0")));
        l.commit(&m("f2", CheckpointKind::Full, 2, None));
        let dead = l.take_dead(&Retention::default());
        assert_eq!(dead.len(), 2);
        assert!(l.take_dead(&Retention::default()).is_empty());
        // Deleting one failed: the next pass offers it again.
        for n in dead {
            l.insert_node(n);
        }
        let again: Vec<CheckpointId> = l
            .take_dead(&Retention::default())
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(again, vec![id("d1"), id("f0")]);
        assert_eq!(l.head(), Some(id("f2")));
    }
}

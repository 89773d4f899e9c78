//! Fencing tokens: which incarnation of each process of a job is the live one, carried on every
//! RPC, so that a process the coordinator replaced (paused past its failure timeout, cut off by
//! a partition) cannot act on the job when it comes back.
//!
//! - Every process started for a job has an **incarnation**: its role, its id and an epoch
//!   ([`Incarnation`], written `s1.3`: server 1, epoch 3). The coordinator issues them: epoch 0
//!   at start, one more for each replacement of the same role and id; its own epoch is the
//!   store lease's generation, so a coordinator that took a job over outranks the one before.
//!   A process learns its own from `$FTREC_INCARNATION` ([`INCARNATION_ENV`]). A server
//!   started elsewhere (by an operator or an orchestrator, which cannot know the job's epochs)
//!   runs without one and takes the epoch its job's coordinator names for it in the first
//!   request the coordinator sends it ([`Fences::awaiting`]): the coordinator raises a lost
//!   server's epoch before it waits for a replacement, so the replacement takes the new epoch
//!   and the process it replaced keeps the old one.
//! - Every request a process sends carries its incarnation (`x-ftrec-from`) and the newest
//!   epochs it knows for the job's processes (`x-ftrec-fence`, the [`Fences`] table). Clients
//!   built from an [`crate::auth::Auth`] attach both ([`crate::auth::ClientAuth`]).
//! - A server merges every table it is sent (epochs only grow) and refuses a request whose
//!   sender is older than the newest incarnation of its role and id it knows of
//!   ([`PsError::Fenced`], naming both). The coordinator raises an epoch the moment it declares
//!   a process lost, before the replacement exists, and tells every live server.
//! - A process that learns it is itself replaced (a table naming a newer incarnation of it, or
//!   a refusal naming it) is **fenced**: from then on it refuses every request and its main
//!   loop exits with one line ([`Fences::fenced`]). Nothing it sends afterwards lands: its peers
//!   know the newer epoch.
//!
//! Epochs cover RPCs. Writes to the checkpoint store are fenced by the store lease
//! (`ftrec_ckpt::lease`) and by the coordinator, which commits only the files of the
//! incarnation it asked to save.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};

use crate::PsError;

/// Metadata key of the sender's incarnation (`s1.3`).
pub const FROM_HEADER: &str = "x-ftrec-from";
/// Metadata key of the sender's table of newest epochs (`c.2,s0.0,s1.3,w0.1`).
pub const FENCE_HEADER: &str = "x-ftrec-fence";
/// Environment variable holding a process's own incarnation.
pub const INCARNATION_ENV: &str = "FTREC_INCARNATION";
/// Exit status of a process that learned it was replaced.
pub const FENCED_EXIT: u8 = 3;
/// Most entries one table header may hold (a job's processes; more is a malformed request).
const MAX_ENTRIES: usize = 4096;

/// What kind of process an incarnation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FenceRole {
    Coordinator,
    Server,
    Worker,
    Merger,
}

impl FenceRole {
    fn letter(self) -> char {
        match self {
            FenceRole::Coordinator => 'c',
            FenceRole::Server => 's',
            FenceRole::Worker => 'w',
            FenceRole::Merger => 'm',
        }
    }

    fn of(letter: char) -> Option<FenceRole> {
        Some(match letter {
            'c' => FenceRole::Coordinator,
            's' => FenceRole::Server,
            'w' => FenceRole::Worker,
            'm' => FenceRole::Merger,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            FenceRole::Coordinator => "coordinator",
            FenceRole::Server => "server",
            FenceRole::Worker => "worker",
            FenceRole::Merger => "merger",
        }
    }
}

/// One process of a job: role, id (0 for the coordinator) and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Incarnation {
    pub role: FenceRole,
    pub id: u32,
    pub epoch: u64,
}

impl Incarnation {
    pub fn new(role: FenceRole, id: u32, epoch: u64) -> Incarnation {
        Incarnation { role, id, epoch }
    }

    /// The process this is an incarnation of.
    pub fn key(&self) -> (FenceRole, u32) {
        (self.role, self.id)
    }

    /// `s1.3`, `w0.0`, `c.2` (the coordinator has no id).
    pub fn parse(text: &str) -> Result<Incarnation, PsError> {
        let bad = || {
            PsError::MalformedRequest(format!(
                "incarnation {text:?}: expected a role letter (c, s, w, m), an id and '.EPOCH', \
                 e.g. s1.3 or c.2"
            ))
        };
        let mut chars = text.chars();
        let role = chars.next().and_then(FenceRole::of).ok_or_else(bad)?;
        let (id, epoch) = chars.as_str().split_once('.').ok_or_else(bad)?;
        let id = match (role, id) {
            (FenceRole::Coordinator, "") => 0,
            (_, id) => id.parse().map_err(|_| bad())?,
        };
        let epoch = epoch.parse().map_err(|_| bad())?;
        Ok(Incarnation { role, id, epoch })
    }

    /// The incarnation in `$FTREC_INCARNATION`, if set.
    pub fn from_env() -> Result<Option<Incarnation>, PsError> {
        match std::env::var(INCARNATION_ENV) {
            Ok(v) => Incarnation::parse(&v)
                .map(Some)
                .map_err(|e| PsError::InvalidConfig(format!("${INCARNATION_ENV}: {e}"))),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(PsError::InvalidConfig(format!(
                "${INCARNATION_ENV} is not valid text"
            ))),
        }
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            FenceRole::Coordinator => write!(f, "c.{}", self.epoch),
            r => write!(f, "{}{}.{}", r.letter(), self.id, self.epoch),
        }
    }
}

/// Words for an incarnation in a message: "server 1 (epoch 3)".
pub fn describe(i: &Incarnation) -> String {
    match i.role {
        FenceRole::Coordinator => format!("the coordinator (epoch {})", i.epoch),
        r => format!("{} {} (epoch {})", r.name(), i.id, i.epoch),
    }
}

/// A process's view of which incarnations are live: its own, the newest epoch of every
/// process it has heard of, and whether it learned it was replaced. Clones share one table.
#[derive(Clone)]
pub struct Fences(Arc<Inner>);

struct Inner {
    me: OnceLock<Incarnation>,
    /// The role and id of a process whose epoch its coordinator assigns ([`Fences::awaiting`]).
    awaiting: Option<(FenceRole, u32)>,
    /// `me` as a header value, made once.
    from_value: OnceLock<MetadataValue<Ascii>>,
    table: Mutex<Table>,
    /// The newer epoch of this process, once it learned of one.
    fenced: watch::Sender<Option<u64>>,
}

/// The newest epochs known, and the job they belong to (a server started without a job id
/// serves any job: a request of another job starts a new table).
#[derive(Default)]
struct Table {
    job: Option<String>,
    epochs: BTreeMap<(FenceRole, u32), u64>,
    /// Bumped at every change of `epochs`: the header value below is rebuilt only then.
    version: u64,
    sent: Option<(u64, MetadataValue<Ascii>)>,
    /// The table header merged last, and the job it came with: the same text of the same job
    /// again (every request of one sender, in the steady state) is not parsed again, since
    /// merging only raises epochs.
    merged: Option<(Option<String>, String)>,
}

impl Default for Fences {
    fn default() -> Self {
        Fences::new(None)
    }
}

impl fmt::Debug for Fences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fences")
            .field("me", &self.me())
            .field("table", &self.entries())
            .finish()
    }
}

/// Two views are equal when they name the same process and hold the same epochs.
impl PartialEq for Fences {
    fn eq(&self, other: &Self) -> bool {
        self.me() == other.me() && self.entries() == other.entries()
    }
}

impl Eq for Fences {}

impl Fences {
    /// The view of process `me` (`None`: a process outside any job, such as a tool or a
    /// server started by hand, which carries no incarnation and is never fenced).
    pub fn new(me: Option<Incarnation>) -> Fences {
        let f = Fences::make(None);
        if let Some(me) = me {
            f.become_(me);
        }
        f
    }

    /// The view of process `role` `id` started without an incarnation (a server an operator
    /// or an orchestrator started): its epoch is the newest one the table names for it when
    /// the first request of a coordinator arrives, and from then on it is fenced like any
    /// other incarnation. Until then it is never fenced.
    pub fn awaiting(role: FenceRole, id: u32) -> Fences {
        Fences::make(Some((role, id)))
    }

    fn make(awaiting: Option<(FenceRole, u32)>) -> Fences {
        let (fenced, _) = watch::channel(None);
        Fences(Arc::new(Inner {
            me: OnceLock::new(),
            awaiting,
            from_value: OnceLock::new(),
            table: Mutex::new(Table::default()),
            fenced,
        }))
    }

    /// Take incarnation `me` (once; later calls change nothing).
    fn become_(&self, me: Incarnation) {
        if self.0.me.set(me).is_ok() {
            if let Ok(v) = MetadataValue::try_from(me.to_string()) {
                let _ = self.0.from_value.set(v);
            }
            self.raise(me);
        }
    }

    /// This process's incarnation (`None` for a process outside any job, and for one
    /// [`Fences::awaiting`] its coordinator's first request).
    pub fn me(&self) -> Option<Incarnation> {
        self.0.me.get().copied()
    }

    /// Whether this process can ever be fenced: it has an incarnation or will take one.
    pub fn can_be_fenced(&self) -> bool {
        self.me().is_some() || self.0.awaiting.is_some()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table is a map of numbers; a panic elsewhere cannot leave it half-written.
        self.0.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every known process's newest epoch, in order.
    pub fn entries(&self) -> Vec<Incarnation> {
        self.table()
            .epochs
            .iter()
            .map(|(&(role, id), &epoch)| Incarnation { role, id, epoch })
            .collect()
    }

    /// The newest epoch known for `role` `id`.
    pub fn newest(&self, role: FenceRole, id: u32) -> Option<u64> {
        self.table().epochs.get(&(role, id)).copied()
    }

    /// Record `who` as live unless a newer incarnation of it is known; returns the newest
    /// epoch known afterwards. A newer incarnation of this process itself fences it.
    pub fn raise(&self, who: Incarnation) -> u64 {
        let newest = {
            let mut t = self.table();
            let (newest, changed) = match t.epochs.get(&who.key()) {
                Some(&e) if e >= who.epoch => (e, false),
                _ => (who.epoch, true),
            };
            if changed {
                t.epochs.insert(who.key(), who.epoch);
                t.version += 1;
            }
            newest
        };
        if let Some(me) = self.me() {
            if me.key() == who.key() && newest > me.epoch {
                self.fence_me(newest);
            }
        }
        newest
    }

    /// Declare the incarnation `who` replaced: its role and id's newest epoch becomes at least
    /// `who.epoch + 1`, which is returned (the replacement's epoch).
    pub fn supersede(&self, who: Incarnation) -> u64 {
        self.raise(Incarnation {
            epoch: who.epoch + 1,
            ..who
        })
    }

    fn fence_me(&self, newer: u64) {
        self.0.fenced.send_if_modified(|f| {
            if f.is_none_or(|old| old < newer) {
                *f = Some(newer);
                true
            } else {
                false
            }
        });
    }

    /// The newer epoch of this process, if it learned it was replaced.
    pub fn replaced_by(&self) -> Option<u64> {
        *self.0.fenced.borrow()
    }

    /// Resolves when this process learns it was replaced, with the one line its main loop
    /// prints before it exits with [`FENCED_EXIT`].
    pub async fn fenced(&self) -> String {
        let mut rx = self.0.fenced.subscribe();
        let newer = loop {
            if let Some(n) = *rx.borrow_and_update() {
                break n;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`: never reached while `self` lives.
                std::future::pending::<()>().await;
            }
        };
        self.fenced_line(newer)
    }

    fn fenced_line(&self, newer: u64) -> String {
        match self.me() {
            Some(me) => format!(
                "fenced: {} was replaced by epoch {newer}; this process no longer belongs to \
                 the job and exits",
                describe(&me)
            ),
            None => "fenced".to_string(),
        }
    }

    /// Learn from an error a request of this process got back: a refusal naming this process
    /// fences it. Returns whether it did.
    pub fn learn(&self, e: &PsError) -> bool {
        match (e, self.me()) {
            (PsError::Fenced { who, newer }, Some(me))
                if Incarnation::parse(who).ok() == Some(me) =>
            {
                self.raise(Incarnation {
                    epoch: *newer,
                    ..me
                });
                true
            }
            _ => false,
        }
    }

    /// The verdict on one incoming request's metadata (of job `job`, already admitted by the
    /// job check): merge its table, then refuse it if this process is fenced or its sender is
    /// older than the newest incarnation known. A request of another job than the table's
    /// (possible only on a server that serves any job) starts a new table.
    pub fn admit(&self, md: &MetadataMap, job: Option<&str>) -> Result<(), PsError> {
        {
            let mut t = self.table();
            if t.job.as_deref() != job {
                t.job = job.map(str::to_string);
                t.epochs.clear();
                if let Some(me) = self.me() {
                    t.epochs.insert(me.key(), me.epoch);
                }
                t.version += 1;
                t.merged = None;
            }
        }
        if let Some(v) = md.get(FENCE_HEADER) {
            let text = v
                .to_str()
                .map_err(|_| PsError::MalformedRequest(format!("{FENCE_HEADER} is not text")))?;
            let seen = |t: &Table| {
                t.merged
                    .as_ref()
                    .is_some_and(|(j, m)| j.as_deref() == job && m == text)
            };
            if !seen(&self.table()) {
                self.merge(text)?;
                let mut t = self.table();
                if t.job.as_deref() == job {
                    t.merged = Some((job.map(str::to_string), text.to_string()));
                }
            }
        }
        let from = match md.get(FROM_HEADER) {
            Some(v) => {
                let text = v
                    .to_str()
                    .map_err(|_| PsError::MalformedRequest(format!("{FROM_HEADER} is not text")))?;
                Some(Incarnation::parse(text)?)
            }
            None => None,
        };
        if let (None, Some((role, id)), Some(c)) = (self.me(), self.0.awaiting, from) {
            if c.role == FenceRole::Coordinator {
                let epoch = self.newest(role, id).unwrap_or(0);
                self.become_(Incarnation::new(role, id, epoch));
            }
        }
        if let (Some(me), Some(newer)) = (self.me(), self.replaced_by()) {
            return Err(PsError::Fenced {
                who: me.to_string(),
                newer,
            });
        }
        if let Some(from) = from {
            let newest = self.raise(from);
            if newest > from.epoch {
                return Err(PsError::Fenced {
                    who: from.to_string(),
                    newer: newest,
                });
            }
        }
        Ok(())
    }

    /// The table as text (`c.2,s0.0,s1.3`): what [`Fences::merge`] reads, and what the
    /// coordinator hands its workers with every batch, so that they carry it to servers it
    /// cannot reach itself (a server cut off from the coordinator learns it was replaced from
    /// the next worker request).
    pub fn table_text(&self) -> String {
        self.entries()
            .iter()
            .map(Incarnation::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Raise every entry of a table in text form ([`Fences::table_text`]).
    pub fn merge(&self, text: &str) -> Result<(), PsError> {
        for (n, part) in text.split(',').filter(|p| !p.is_empty()).enumerate() {
            if n >= MAX_ENTRIES {
                return Err(PsError::MalformedRequest(format!(
                    "a table of incarnations holds more than {MAX_ENTRIES} entries"
                )));
            }
            self.raise(Incarnation::parse(part)?);
        }
        Ok(())
    }

    /// The two headers a request of this process carries (none for a process without an
    /// incarnation and an empty table).
    pub(crate) fn headers(&self) -> Vec<(&'static str, MetadataValue<Ascii>)> {
        let mut out = Vec::new();
        if let Some(v) = self.0.from_value.get() {
            out.push((FROM_HEADER, v.clone()));
        }
        let version = self.table().version;
        let cached = match &self.table().sent {
            Some((v, value)) if *v == version => Some(value.clone()),
            _ => None,
        };
        let value = cached.or_else(|| {
            let table = self.table_text();
            let value = (!table.is_empty())
                .then(|| MetadataValue::try_from(table).ok())
                .flatten()?;
            self.table().sent = Some((version, value.clone()));
            Some(value)
        });
        if let Some(v) = value {
            out.push((FENCE_HEADER, v));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn incarnations_round_trip_and_bad_text_is_named() {
        for t in ["s1.3", "w0.0", "c.2", "m0.7"] {
            assert_eq!(Incarnation::parse(t).unwrap().to_string(), t);
        }
        for t in ["", "x1.2", "s1", "s.2", "s1.-1", "c1x.2", "s1.2.3"] {
            let e = Incarnation::parse(t).unwrap_err();
            assert!(e.to_string().contains("s1.3"), "{t}: {e}");
        }
    }

    #[test]
    fn a_sender_older_than_the_newest_known_is_refused_naming_both() {
        let server = Fences::new(Some(Incarnation::new(FenceRole::Server, 0, 0)));
        // Worker 1's epoch 2 is heard of first (from the coordinator's table) ...
        server
            .admit(&md(&[(FENCE_HEADER, "c.1,w1.2")]), None)
            .unwrap();
        // ... so epoch 1 of the same worker is refused, epoch 2 and other workers are not.
        let e = server
            .admit(&md(&[(FROM_HEADER, "w1.1")]), None)
            .unwrap_err();
        assert_eq!(
            e,
            PsError::Fenced {
                who: "w1.1".into(),
                newer: 2
            }
        );
        server.admit(&md(&[(FROM_HEADER, "w1.2")]), None).unwrap();
        server.admit(&md(&[(FROM_HEADER, "w0.0")]), None).unwrap();
        // A newer sender raises the table by itself: the older one is refused from then on.
        server.admit(&md(&[(FROM_HEADER, "w0.4")]), None).unwrap();
        assert!(server.admit(&md(&[(FROM_HEADER, "w0.3")]), None).is_err());
        // An older coordinator is refused too.
        assert!(server.admit(&md(&[(FROM_HEADER, "c.0")]), None).is_err());
        assert_eq!(server.replaced_by(), None);
    }

    #[test]
    fn a_process_told_of_its_replacement_refuses_everything_and_says_so() {
        let me = Incarnation::new(FenceRole::Server, 1, 3);
        let zombie = Fences::new(Some(me));
        zombie.admit(&md(&[(FROM_HEADER, "w0.0")]), None).unwrap();
        let e = zombie
            .admit(
                &md(&[(FENCE_HEADER, "c.0,s1.4"), (FROM_HEADER, "c.0")]),
                None,
            )
            .unwrap_err();
        assert_eq!(
            e,
            PsError::Fenced {
                who: "s1.3".into(),
                newer: 4
            }
        );
        // Every later request is refused, whoever sends it.
        assert!(zombie.admit(&md(&[(FROM_HEADER, "w0.0")]), None).is_err());
        assert_eq!(zombie.replaced_by(), Some(4));
        let line = futures_lite_block_on(zombie.fenced());
        assert!(
            line.contains("server 1 (epoch 3)") && line.contains("epoch 4"),
            "{line}"
        );
    }

    #[test]
    fn a_refusal_naming_this_process_fences_it_and_one_naming_another_does_not() {
        let me = Incarnation::new(FenceRole::Worker, 2, 0);
        let f = Fences::new(Some(me));
        let other = PsError::Fenced {
            who: "w1.0".into(),
            newer: 1,
        };
        assert!(!f.learn(&other));
        assert_eq!(f.replaced_by(), None);
        let mine = PsError::Fenced {
            who: "w2.0".into(),
            newer: 1,
        };
        assert!(f.learn(&mine));
        assert_eq!(f.replaced_by(), Some(1));
    }

    #[test]
    fn headers_carry_the_sender_and_the_table_and_malformed_ones_are_refused() {
        let c = Fences::new(Some(Incarnation::new(FenceRole::Coordinator, 0, 2)));
        c.supersede(Incarnation::new(FenceRole::Server, 1, 0));
        let mut m = MetadataMap::new();
        for (k, v) in c.headers() {
            m.insert(k, v);
        }
        assert_eq!(m.get(FROM_HEADER).unwrap(), "c.2");
        assert_eq!(m.get(FENCE_HEADER).unwrap(), "c.2,s1.1");
        let s = Fences::new(None);
        s.admit(&m, None).unwrap();
        assert_eq!(s.newest(FenceRole::Server, 1), Some(1));
        assert!(matches!(
            s.admit(&md(&[(FENCE_HEADER, "s1.x")]), None),
            Err(PsError::MalformedRequest(_))
        ));
        // A server of any job keeps the table of the job it served last: job b's request is not
        // judged by job a's epochs, while job a's own are.
        s.admit(&m, Some("job-a")).unwrap();
        assert!(s
            .admit(&md(&[(FROM_HEADER, "s1.0")]), Some("job-a"))
            .is_err());
        s.admit(&md(&[(FROM_HEADER, "s1.0")]), Some("job-b"))
            .unwrap();
        // A process without an incarnation sends nothing.
        assert!(Fences::new(None).headers().is_empty());
    }

    #[test]
    fn the_cached_header_and_the_skipped_merge_follow_every_change() {
        let table = |f: &Fences| {
            f.headers()
                .into_iter()
                .find(|(k, _)| *k == FENCE_HEADER)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        let c = Fences::new(Some(Incarnation::new(FenceRole::Coordinator, 0, 0)));
        assert_eq!(table(&c).as_deref(), Some("c.0"));
        assert_eq!(table(&c).as_deref(), Some("c.0"));
        c.raise(Incarnation::new(FenceRole::Server, 1, 2));
        assert_eq!(table(&c).as_deref(), Some("c.0,s1.2"));
        // A server of any job: the same text of another job is merged into that job's table.
        let s = Fences::new(None);
        let m = md(&[(FENCE_HEADER, "s1.2")]);
        s.admit(&m, Some("job-a")).unwrap();
        s.admit(&m, Some("job-a")).unwrap();
        s.admit(&m, Some("job-b")).unwrap();
        assert_eq!(s.newest(FenceRole::Server, 1), Some(2));
        assert!(s
            .admit(&md(&[(FROM_HEADER, "s1.1")]), Some("job-b"))
            .is_err());
    }

    #[test]
    fn a_server_started_elsewhere_takes_the_epoch_its_coordinator_names_and_is_fenced_by_a_newer_one(
    ) {
        // Started at epoch 0 of server 1: its first coordinator request names no epoch for it.
        let first = Fences::awaiting(FenceRole::Server, 1);
        assert!(first.can_be_fenced() && first.me().is_none());
        // A worker's request assigns nothing, and nothing fences a process without an epoch.
        first
            .admit(&md(&[(FROM_HEADER, "w0.0"), (FENCE_HEADER, "w0.0")]), None)
            .unwrap();
        assert_eq!(first.me(), None);
        first
            .admit(
                &md(&[(FROM_HEADER, "c.1"), (FENCE_HEADER, "c.1,s0.0")]),
                None,
            )
            .unwrap();
        assert_eq!(first.me(), Some(Incarnation::new(FenceRole::Server, 1, 0)));
        // Its replacement, started after the coordinator raised server 1's epoch, takes epoch 1.
        let second = Fences::awaiting(FenceRole::Server, 1);
        second
            .admit(
                &md(&[(FROM_HEADER, "c.1"), (FENCE_HEADER, "c.1,s1.1")]),
                None,
            )
            .unwrap();
        assert_eq!(second.me(), Some(Incarnation::new(FenceRole::Server, 1, 1)));
        let mut m = MetadataMap::new();
        for (k, v) in second.headers() {
            m.insert(k, v);
        }
        assert_eq!(m.get(FROM_HEADER).unwrap(), "s1.1");
        // A worker carrying the coordinator's table reaches the first one: it is fenced, and
        // the epoch it took once does not change with later coordinator requests.
        let e = first
            .admit(
                &md(&[(FROM_HEADER, "w0.0"), (FENCE_HEADER, "c.1,s1.1,w0.0")]),
                None,
            )
            .unwrap_err();
        assert_eq!(
            e,
            PsError::Fenced {
                who: "s1.0".into(),
                newer: 1
            }
        );
        assert!(first.admit(&md(&[(FROM_HEADER, "c.1")]), None).is_err());
        assert_eq!(first.me(), Some(Incarnation::new(FenceRole::Server, 1, 0)));
        assert_eq!(first.replaced_by(), Some(1));
        assert_eq!(second.replaced_by(), None);
        // A process outside any job takes nothing.
        let none = Fences::new(None);
        none.admit(&md(&[(FROM_HEADER, "c.1"), (FENCE_HEADER, "s1.3")]), None)
            .unwrap();
        assert!(!none.can_be_fenced() && none.me().is_none());
    }

    fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }
}

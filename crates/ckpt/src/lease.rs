//! Who may write a store, and what garbage collection must leave alone.
//!
//! **The writer lease.** A job that writes a store holds `LEASE` (outside `ckpt/`): a small
//! JSON record with the job's id, the holder (`host:pid`), a generation and an expiry in wall
//! time. It is created with a create-only put and changed only by [`ChunkStore::swap`] from the
//! bytes its holder last wrote, so of two processes that race for it exactly one wins, and a
//! holder that was replaced finds out at its next renewal (the swap fails). Taking over
//! (a record released, or expired by the clock) increments the generation, and the new holder
//! stamps that generation into `CURRENT` at once: from then on a commit of an older generation
//! fails its compare-and-swap of `CURRENT` ([`crate::Checkpoints::commit`]) even if it was
//! paused before its lease check. The clocks of the hosts must agree to well within the lease's
//! time to live; a holder stops writing when it has not renewed for a whole time to live,
//! before anyone else may take over.
//!
//! **Readers.** A command that reads checkpoints a job may collect (`eval`, `export`,
//! `ckpt restore`, a resuming job) registers under `readers/` the ids it will read, with an
//! expiry it renews. A collection ([`sweep`]) first announces the ids it is about to delete
//! under `gc/` (one object per sweep), then lists the readers, then deletes what no live reader
//! holds, then withdraws its announcement. A reader registers first and checks the
//! announcements second ([`ReaderLease::register`]): either its registration was visible to
//! the sweep (which then keeps its checkpoints) or the announcement is visible to it (and it
//! refuses, naming the checkpoint that is being collected). Read-after-write consistency of the
//! store (local directories, S3) is all this needs; no timing.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{CkptError, Result};
use crate::format::CheckpointId;
use crate::key::Key;
use crate::store::PutMode;
use crate::Checkpoints;

/// The time a lease lives without renewal unless a caller says otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `host:pid` of this process: who holds a lease or reads a store.
pub fn this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// Whether `holder` (`host:pid`) is a process of this host that no longer exists: its lease is
/// free at once (a job killed here can be resumed without waiting for the expiry). A holder on
/// another host is never taken for gone.
pub fn holder_is_gone(holder: &str) -> bool {
    let Some((host, pid)) = holder.rsplit_once(':') else {
        return false;
    };
    let me = this_process();
    let Some((my_host, _)) = me.rsplit_once(':') else {
        return false;
    };
    match pid.parse::<i32>() {
        Ok(pid) if host == my_host && pid > 0 => !process_alive(pid),
        _ => false,
    }
}

/// Whether process `pid` exists (signal 0 probes without sending anything).
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The `LEASE` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The job's id (the store's job record names the same job).
    pub job: String,
    /// `host:pid` of the process that holds it.
    pub holder: String,
    /// Incremented at every takeover; stamped into `CURRENT` by every commit.
    pub generation: u64,
    /// Wall time (ms since the Unix epoch) after which another job may take over.
    pub expires_unix_ms: u64,
    /// The holder ended and gave it up.
    #[serde(default)]
    pub released: bool,
}

impl LeaseRecord {
    fn encode(&self) -> Bytes {
        let mut v = serde_json::to_vec_pretty(self).expect("a lease record serializes");
        v.push(b'\n');
        Bytes::from(v)
    }

    fn decode(key: &Key, data: &[u8]) -> Result<Self> {
        serde_json::from_slice(data).map_err(|e| CkptError::Corrupt {
            file: key.to_string(),
            reason: format!("not a lease record: {e}"),
        })
    }

    /// Whether another job may take it over at wall time `now_ms`.
    pub fn is_free(&self, now_ms: u64) -> bool {
        self.released || now_ms > self.expires_unix_ms
    }

    /// One line for messages: `job J (holder H, generation G, expires in Ns)`.
    pub fn describe(&self, now_ms: u64) -> String {
        let state = if self.released {
            "released".to_string()
        } else if now_ms > self.expires_unix_ms {
            format!(
                "expired {:.0}s ago",
                (now_ms - self.expires_unix_ms) as f64 / 1000.0
            )
        } else {
            format!(
                "expires in {:.0}s unless renewed",
                (self.expires_unix_ms - now_ms) as f64 / 1000.0
            )
        };
        format!(
            "job {} (held by {}, generation {}, {state})",
            self.job, self.holder, self.generation
        )
    }
}

/// The store's writer lease, held by this process.
#[derive(Debug, Clone)]
pub struct Lease {
    ckpts: Checkpoints,
    record: LeaseRecord,
    /// The bytes this holder last wrote: the expected content of its next swap.
    raw: Bytes,
    ttl: Duration,
    /// Wall time of the last successful write of the lease.
    renewed_ms: u64,
}

/// The key of the lease of `ckpts`.
pub fn lease_key(ckpts: &Checkpoints) -> Key {
    ckpts.rel_key("LEASE")
}

/// The store's lease record, if any.
pub async fn read_lease(ckpts: &Checkpoints) -> Result<Option<LeaseRecord>> {
    let key = lease_key(ckpts);
    match ckpts.store().get(&key).await {
        Ok(d) => LeaseRecord::decode(&key, &d).map(Some),
        Err(CkptError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Lease {
    /// Take the store's lease for `job`: create it, or take over a released or expired one
    /// (the generation grows by one and `CURRENT` is stamped with it). A live lease of anyone
    /// else, this job's included, is [`CkptError::Held`].
    pub async fn acquire(ckpts: &Checkpoints, job: &str, ttl: Duration) -> Result<Lease> {
        let key = lease_key(ckpts);
        let store = ckpts.store();
        let holder = this_process();
        let (expected, generation) = match store.get(&key).await {
            Ok(d) => {
                let old = LeaseRecord::decode(&key, &d)?;
                let now = now_ms();
                if !old.is_free(now) && !holder_is_gone(&old.holder) {
                    return Err(CkptError::Held {
                        key: key.to_string(),
                        holder: old.describe(now),
                    });
                }
                (Some(d), old.generation + 1)
            }
            Err(CkptError::NotFound { .. }) => {
                let current = ckpts.read_current().await.ok().flatten();
                (None, current.map_or(0, |c| c.generation) + 1)
            }
            Err(e) => return Err(e),
        };
        let now = now_ms();
        let record = LeaseRecord {
            job: job.to_string(),
            holder,
            generation,
            expires_unix_ms: now + ttl.as_millis() as u64,
            released: false,
        };
        let raw = record.encode();
        store
            .swap(&key, expected, raw.clone())
            .await
            .map_err(|e| match e {
                CkptError::Precondition { .. } | CkptError::AlreadyExists { .. } => {
                    CkptError::Held {
                        key: key.to_string(),
                        holder: "another process that took it at the same moment".into(),
                    }
                }
                e => e,
            })?;
        let lease = Lease {
            ckpts: ckpts.clone(),
            record,
            raw,
            ttl,
            renewed_ms: now,
        };
        lease.stamp_current().await?;
        Ok(lease)
    }

    /// Rewrite `CURRENT` with this lease's generation (same checkpoint), so that a writer of
    /// an older generation cannot move it any more.
    async fn stamp_current(&self) -> Result<()> {
        let key = self.ckpts.current_key();
        let store = self.ckpts.store();
        loop {
            let raw = match store.get(&key).await {
                Ok(d) => d,
                Err(CkptError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut p = crate::format::CurrentPointer::decode(key.as_str(), &raw)?;
            if p.generation >= self.record.generation {
                return Err(CkptError::Fenced {
                    what: format!(
                        "{key} carries generation {}, not older than this lease's {}",
                        p.generation, self.record.generation
                    ),
                });
            }
            p.generation = self.record.generation;
            match store.swap(&key, Some(raw), p.encode().bytes).await {
                Ok(()) => return Ok(()),
                // A zombie's commit moved it meanwhile: stamp what it wrote.
                Err(CkptError::Precondition { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub fn generation(&self) -> u64 {
        self.record.generation
    }

    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether this holder may still write: its last renewal is less than a time to live old
    /// (by its own clock, so it stops before anyone else may take over).
    pub fn is_fresh(&self) -> bool {
        now_ms() < self.renewed_ms + self.ttl.as_millis() as u64
    }

    /// Extend the lease by its time to live. [`CkptError::Fenced`] if another process took it
    /// (this holder must stop writing); a store error is returned as it is (try again; stop
    /// writing once [`Lease::is_fresh`] is false).
    pub async fn renew(&mut self) -> Result<()> {
        let now = now_ms();
        let mut next = self.record.clone();
        next.expires_unix_ms = now + self.ttl.as_millis() as u64;
        self.write(next, now).await
    }

    /// Give the lease up at the end of the job: anyone may take it at once.
    pub async fn release(&mut self) -> Result<()> {
        let now = now_ms();
        let mut next = self.record.clone();
        next.released = true;
        next.expires_unix_ms = now;
        self.write(next, now).await
    }

    async fn write(&mut self, next: LeaseRecord, now: u64) -> Result<()> {
        let key = lease_key(&self.ckpts);
        let raw = next.encode();
        match self
            .ckpts
            .store()
            .swap(&key, Some(self.raw.clone()), raw.clone())
            .await
        {
            Ok(()) => {
                self.record = next;
                self.raw = raw;
                self.renewed_ms = now;
                Ok(())
            }
            Err(CkptError::Precondition { .. }) | Err(CkptError::NotFound { .. }) => {
                let now_holder = match read_lease(&self.ckpts).await {
                    Ok(Some(r)) => r.describe(now_ms()),
                    Ok(None) => "nobody (the lease was deleted)".into(),
                    Err(e) => format!("unknown ({e})"),
                };
                Err(CkptError::Fenced {
                    what: format!(
                        "the lease of {} (generation {}) was taken over: it is now {now_holder}",
                        self.record.job, self.record.generation
                    ),
                })
            }
            Err(e) => Err(e),
        }
    }
}

/// A reader's record under `readers/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderRecord {
    pub holder: String,
    /// What the reader does (`eval`, `export`, ...), for messages.
    pub what: String,
    pub checkpoints: Vec<String>,
    pub expires_unix_ms: u64,
}

/// A registration of this process as a reader of some checkpoints.
#[derive(Debug)]
pub struct ReaderLease {
    ckpts: Checkpoints,
    key: Key,
    record: ReaderRecord,
    ttl: Duration,
}

fn readers_dir(ckpts: &Checkpoints) -> Key {
    ckpts.rel_key("readers")
}

fn gc_dir(ckpts: &Checkpoints) -> Key {
    ckpts.rel_key("gc")
}

fn unique_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let holder = this_process().replace([':', '/'], "-");
    format!(
        "{holder}-{}-{}",
        now_ms(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl ReaderLease {
    /// Register as a reader of `ids`, then check that no collection is deleting any of them.
    /// [`CkptError::BeingCollected`] names the first one that is (the caller picks another
    /// state or tells the user); the registration is withdrawn then.
    pub async fn register(
        ckpts: &Checkpoints,
        what: &str,
        ids: &[CheckpointId],
        ttl: Duration,
    ) -> Result<ReaderLease> {
        let key = readers_dir(ckpts).join(&unique_name())?;
        let record = ReaderRecord {
            holder: this_process(),
            what: what.to_string(),
            checkpoints: ids.iter().map(|i| i.to_string()).collect(),
            expires_unix_ms: now_ms() + ttl.as_millis() as u64,
        };
        let data = serde_json::to_vec(&record).expect("a reader record serializes");
        ckpts
            .store()
            .put(&key, Bytes::from(data), PutMode::Create)
            .await?;
        let lease = ReaderLease {
            ckpts: ckpts.clone(),
            key,
            record,
            ttl,
        };
        let doomed = match doomed_ids(ckpts).await {
            Ok(d) => d,
            Err(e) => {
                lease.release().await;
                return Err(e);
            }
        };
        if let Some(id) = ids.iter().find(|i| doomed.contains(i.as_str())) {
            lease.release().await;
            return Err(CkptError::BeingCollected { id: id.to_string() });
        }
        Ok(lease)
    }

    /// Push the expiry a time to live ahead (call it well within the time to live while the
    /// read goes on).
    pub async fn renew(&mut self) -> Result<()> {
        self.record.expires_unix_ms = now_ms() + self.ttl.as_millis() as u64;
        let data = serde_json::to_vec(&self.record).expect("a reader record serializes");
        self.ckpts
            .store()
            .put(&self.key, Bytes::from(data), PutMode::Overwrite)
            .await
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Withdraw the registration (best effort: an expired one is ignored by every sweep).
    pub async fn release(self) {
        let _ = self.ckpts.store().delete(&self.key).await;
    }
}

/// The live readers' records (expired ones are skipped, and removed).
pub async fn live_readers(ckpts: &Checkpoints) -> Result<Vec<ReaderRecord>> {
    let store = ckpts.store();
    let now = now_ms();
    let mut out = Vec::new();
    for meta in store.list(Some(&readers_dir(ckpts))).await? {
        let data = match store.get(&meta.key).await {
            Ok(d) => d,
            Err(CkptError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<ReaderRecord>(&data) {
            Ok(r) if r.expires_unix_ms >= now => out.push(r),
            // Expired, or not a record at all: nobody reads under it.
            _ => {
                let _ = store.delete(&meta.key).await;
            }
        }
    }
    Ok(out)
}

/// Every id some sweep has announced it is deleting.
async fn doomed_ids(ckpts: &Checkpoints) -> Result<BTreeSet<String>> {
    let store = ckpts.store();
    let mut out = BTreeSet::new();
    for meta in store.list(Some(&gc_dir(ckpts))).await? {
        let data = match store.get(&meta.key).await {
            Ok(d) => d,
            Err(CkptError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        if let Ok(ids) = serde_json::from_slice::<Vec<String>>(&data) {
            out.extend(ids);
        }
    }
    Ok(out)
}

/// `Ok` while the store's lease is held, not given up, at `generation`;
/// [`CkptError::Fenced`] otherwise.
pub async fn still_writer(ckpts: &Checkpoints, generation: u64) -> Result<()> {
    match read_lease(ckpts).await? {
        Some(r) if r.generation == generation && !r.released => Ok(()),
        other => Err(CkptError::Fenced {
            what: format!(
                "a collection of the writer of generation {generation} stopped: the store's lease \
                 is {}",
                match other {
                    Some(r) => format!(
                        "at generation {} ({} by {})",
                        r.generation,
                        if r.released { "given up" } else { "held" },
                        r.holder
                    ),
                    None => "gone".into(),
                }
            ),
        }),
    }
}

/// Withdraw the announcements the sweeps of writers older than `generation` left: the writer
/// that takes the store over at `generation` calls it. Those sweeps are fenced
/// ([`still_writer`]) and delete nothing more, and an announcement a paused or killed sweep
/// left would keep readers from its checkpoints. Announcements of sweeps that are no writer's
/// (`ftrec ckpt gc`) are left alone. Returns how many it withdrew.
pub async fn clear_announcements(ckpts: &Checkpoints, generation: u64) -> Result<usize> {
    let store = ckpts.store();
    let mut n = 0;
    for meta in store.list(Some(&gc_dir(ckpts))).await? {
        let name = meta.key.as_str().rsplit('/').next().unwrap_or("");
        let older = name
            .strip_prefix("writer-g")
            .and_then(|r| r.split_once('-'))
            .and_then(|(g, _)| g.parse::<u64>().ok())
            .is_some_and(|g| g < generation);
        if !older {
            continue;
        }
        match store.delete(&meta.key).await {
            Ok(()) | Err(CkptError::NotFound { .. }) => n += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What [`sweep`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub deleted: Vec<CheckpointId>,
    /// Candidates kept because a live reader holds them.
    pub held: Vec<CheckpointId>,
    /// Candidates whose deletion failed (a later sweep tries again).
    pub failed: Vec<CheckpointId>,
    /// Whether any reader was live (a caller skips sweeps of shared files then).
    pub readers: usize,
}

/// Delete `candidates` that no live reader holds, with the announce / list / delete /
/// withdraw protocol of the module's docs. Deletion is manifest first, so a half-deleted
/// checkpoint is never taken for a readable one.
pub async fn sweep(ckpts: &Checkpoints, candidates: &[CheckpointId]) -> Result<SweepReport> {
    let mut report = SweepReport::default();
    // A writer's sweep (its generation set) deletes only while it holds the store: one that
    // was paused and taken over stops before it deletes anything more, whatever it listed
    // before (checked again before each deletion; a caller that sweeps more by the report
    // stops too, on the error).
    let writer = ckpts.generation();
    if let Some(g) = writer {
        still_writer(ckpts, g).await?;
    }
    if candidates.is_empty() {
        // Nothing to delete, but the caller may sweep shared files by the reader count.
        report.readers = live_readers(ckpts).await?.len();
        return Ok(report);
    }
    let store = ckpts.store();
    // A writer's announcement names its generation, so that the next writer can withdraw it
    // ([`clear_announcements`]).
    let name = match writer {
        Some(g) => format!("writer-g{g}-{}", unique_name()),
        None => unique_name(),
    };
    let mark = gc_dir(ckpts).join(&name)?;
    let ids: Vec<String> = candidates.iter().map(|c| c.to_string()).collect();
    store
        .put(
            &mark,
            Bytes::from(serde_json::to_vec(&ids).expect("ids serialize")),
            PutMode::Create,
        )
        .await?;
    let result = async {
        let readers = live_readers(ckpts).await?;
        report.readers = readers.len();
        let held: BTreeSet<&str> = readers
            .iter()
            .flat_map(|r| r.checkpoints.iter().map(String::as_str))
            .collect();
        for c in candidates {
            if held.contains(c.as_str()) {
                report.held.push(c.clone());
                continue;
            }
            if let Some(g) = writer {
                still_writer(ckpts, g).await?;
            }
            if ckpts.delete_checkpoint(c).await.is_ok() {
                report.deleted.push(c.clone());
            } else {
                report.failed.push(c.clone());
            }
        }
        Ok::<(), CkptError>(())
    }
    .await;
    let _ = store.delete(&mark).await;
    result.map(|()| report)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::format::{CheckpointKind, Manifest};
    use crate::store::memory::MemoryStore;

    fn store() -> Checkpoints {
        Checkpoints::new(Arc::new(MemoryStore::new()))
    }

    fn manifest(step: u64) -> Manifest {
        Manifest {
            id: CheckpointId::for_step(step, CheckpointKind::Full),
            kind: CheckpointKind::Full,
            step,
            parents: Vec::new(),
            data_position: crate::DataPosition::None,
            shards: Vec::new(),
            files: Vec::new(),
            extra: Default::default(),
        }
    }

    /// Make the store's lease look as if its holder stopped renewing long ago.
    async fn expire(ckpts: &Checkpoints) {
        let mut r = read_lease(ckpts).await.unwrap().unwrap();
        r.expires_unix_ms = 1;
        ckpts
            .store()
            .put(&lease_key(ckpts), r.encode(), PutMode::Overwrite)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_live_lease_refuses_a_second_job_and_an_expired_one_is_taken_over() {
        let ckpts = store();
        let ttl = Duration::from_secs(600);
        let mut a = Lease::acquire(&ckpts, "job-a", ttl).await.unwrap();
        assert_eq!(a.generation(), 1);
        let err = Lease::acquire(&ckpts, "job-b", ttl).await.unwrap_err();
        assert!(
            matches!(&err, CkptError::Held { holder, .. } if holder.contains("job-a")),
            "{err}"
        );
        // The same job's resume is refused too while the lease lives.
        assert!(matches!(
            Lease::acquire(&ckpts, "job-a", ttl).await,
            Err(CkptError::Held { .. })
        ));
        a.renew().await.unwrap();
        expire(&ckpts).await;
        let mut b = Lease::acquire(&ckpts, "job-b", ttl).await.unwrap();
        assert_eq!(b.generation(), 2);
        // The old holder learns it was replaced at its next renewal and must stop.
        let err = a.renew().await.unwrap_err();
        assert!(
            matches!(&err, CkptError::Fenced { what } if what.contains("job-b")),
            "{err}"
        );
        b.release().await.unwrap();
        let c = Lease::acquire(&ckpts, "job-c", ttl).await.unwrap();
        assert_eq!(c.generation(), 3, "a released lease is free at once");
    }

    #[tokio::test]
    async fn a_replaced_writer_cannot_move_current_any_more() {
        let ckpts = store();
        let ttl = Duration::from_secs(600);
        let a = Lease::acquire(&ckpts, "job-a", ttl).await.unwrap();
        let old = ckpts.clone().with_generation(a.generation());
        old.commit(&manifest(10)).await.unwrap();
        expire(&ckpts).await;
        let b = Lease::acquire(&ckpts, "job-b", ttl).await.unwrap();
        // Taking over stamps CURRENT with the new generation, same checkpoint.
        let cur = ckpts.read_current().await.unwrap().unwrap();
        assert_eq!(
            (cur.id.clone(), cur.generation),
            (manifest(10).id, b.generation())
        );
        // The zombie's commit of a newer step is refused and CURRENT stays.
        let err = old.commit(&manifest(20)).await.unwrap_err();
        assert!(matches!(err, CkptError::Fenced { .. }), "{err}");
        assert_eq!(ckpts.read_current().await.unwrap().unwrap().id, cur.id);
        let new = ckpts.clone().with_generation(b.generation());
        new.commit(&manifest(30)).await.unwrap();
        assert_eq!(
            ckpts.read_current().await.unwrap().unwrap().id,
            manifest(30).id
        );
    }

    /// A writer paused between planning a collection and deleting (a frozen host) and taken
    /// over deletes nothing once it wakes, and the new writer withdraws the announcements of
    /// the old one's sweeps (not those of sweeps that are no writer's).
    #[tokio::test]
    async fn a_replaced_writer_s_sweep_deletes_nothing_and_its_announcements_are_withdrawn() {
        let ckpts = store();
        let ttl = Duration::from_secs(600);
        let a = Lease::acquire(&ckpts, "job-a", ttl).await.unwrap();
        let old = ckpts.clone().with_generation(a.generation());
        for step in [1, 2, 3] {
            old.commit(&manifest(step)).await.unwrap();
        }
        // While it holds the store its sweep deletes, and names its generation.
        let rep = sweep(&old, &[manifest(1).id]).await.unwrap();
        assert_eq!(rep.deleted, vec![manifest(1).id]);
        // Announcements a paused sweep of generation 1 left, one of a user's `ckpt gc`.
        let gc = gc_dir(&ckpts);
        for name in ["writer-g1-vm-7-1-0", "vm-8-1-0"] {
            ckpts
                .store()
                .put(
                    &gc.join(name).unwrap(),
                    Bytes::from_static(b"[]"),
                    PutMode::Create,
                )
                .await
                .unwrap();
        }
        expire(&ckpts).await;
        let b = Lease::acquire(&ckpts, "job-b", ttl).await.unwrap();
        assert_eq!(
            clear_announcements(&ckpts, b.generation()).await.unwrap(),
            1
        );
        let left: Vec<String> = ckpts
            .store()
            .list(Some(&gc))
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key.as_str().rsplit('/').next().unwrap().to_string())
            .collect();
        assert_eq!(left, vec!["vm-8-1-0".to_string()]);
        // The woken writer's sweep, with or without candidates: fenced, nothing deleted.
        for candidates in [vec![manifest(2).id], vec![]] {
            let err = sweep(&old, &candidates).await.unwrap_err();
            assert!(
                matches!(&err, CkptError::Fenced { what } if what.contains("generation 2")),
                "{err}"
            );
        }
        assert!(ckpts.read_manifest(&manifest(2).id, None).await.is_ok());
        assert_eq!(ckpts.store().list(Some(&gc)).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_sweep_keeps_what_a_live_reader_holds_and_a_reader_refuses_what_a_sweep_deletes() {
        let ckpts = store();
        for step in [1, 2, 3] {
            ckpts.commit(&manifest(step)).await.unwrap();
        }
        let ids: Vec<CheckpointId> = [1, 2].iter().map(|&s| manifest(s).id).collect();
        let ttl = Duration::from_secs(600);
        let reader = ReaderLease::register(&ckpts, "eval", &ids[..1], ttl)
            .await
            .unwrap();
        let rep = sweep(&ckpts, &ids).await.unwrap();
        assert_eq!(rep.held, ids[..1].to_vec());
        assert_eq!(rep.deleted, ids[1..].to_vec());
        assert!(ckpts.read_manifest(&ids[0], None).await.is_ok());
        assert!(ckpts.read_manifest(&ids[1], None).await.is_err());
        reader.release().await;
        // A sweep's announcement is visible to a reader that registers meanwhile.
        let mark = gc_dir(&ckpts).join("other-sweep").unwrap();
        let doomed = serde_json::to_vec(&vec![ids[0].to_string()]).unwrap();
        ckpts
            .store()
            .put(&mark, Bytes::from(doomed), PutMode::Create)
            .await
            .unwrap();
        let err = ReaderLease::register(&ckpts, "eval", &ids[..1], ttl)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CkptError::BeingCollected { id } if *id == ids[0].to_string()),
            "{err}"
        );
        assert!(
            live_readers(&ckpts).await.unwrap().is_empty(),
            "a refused reader withdraws its registration"
        );
        ckpts.store().delete(&mark).await.unwrap();
        // An expired reader holds nothing.
        let stale = ReaderLease::register(&ckpts, "eval", &ids[..1], Duration::ZERO)
            .await
            .unwrap();
        let mut rec = stale.record.clone();
        rec.expires_unix_ms = 1;
        ckpts
            .store()
            .put(
                &stale.key,
                Bytes::from(serde_json::to_vec(&rec).unwrap()),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        let rep = sweep(&ckpts, &ids[..1]).await.unwrap();
        assert_eq!(rep.deleted, ids[..1].to_vec());
    }
}

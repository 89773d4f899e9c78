//! A [`ChunkStore`] in a local directory.
//!
//! Key `a/b/c` is the file `<root>/a/b/c`. Writes are crash-atomic: the bytes go to a
//! temporary file in the destination directory (named `.c.tmp-<pid>-<n>`, which no valid key
//! can name and `list` skips), are fsynced, then the temporary file is renamed over the
//! destination and the directory is fsynced so the rename itself is durable. A create-only
//! put renames with `RENAME_NOREPLACE` (Linux) or hard-links (elsewhere, or where the file
//! system lacks the flag): both fail if the destination exists, so of two racing creators
//! exactly one wins.
//!
//! A swap (compare and replace) holds an exclusive `flock` on `<root>/.swap.lock` while it
//! reads, compares and renames, so swaps from any process on this machine are serialized; the
//! lock dies with its holder. A holder that is paused (SIGSTOP, a debugger) keeps it, and its
//! swap must finish before any other may start (letting another in would let the paused one's
//! stale comparison land when it wakes): a swap waits for the lock at most
//! [`SWAP_LOCK_WAIT`], then fails (the store unavailable) naming the holder's pid and whether
//! it is stopped, instead of waiting for ever. A process that pauses itself on purpose
//! first closes its own swaps ([`pause_swaps`]); [`swap_lock_holder`] tells whether another
//! process holds the lock, so that whoever pauses it can do so outside a swap.
//!
//! Blocking file-system calls run on tokio's blocking pool, so a caller must be inside a tokio
//! runtime.
//!
//! Limits: a key cannot be both an object and a prefix of other keys (`a` and `a/b`), because
//! a path cannot be both a file and a directory; such a put fails with
//! [`CkptError::Precondition`]. A crash can leave temporary files behind; they are invisible to
//! `list` and `get`, and [`LocalStore::remove_temp_files`] deletes them when no writer runs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::{check_range, swap_conflict, ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

/// Objects as files under a root directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    inner: Arc<Inner>,
    /// How long a swap waits for the swap lock ([`SWAP_LOCK_WAIT`] unless set).
    swap_wait: Duration,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    tmp_counter: AtomicU64,
}

/// How long a swap waits for another process's swap to release the lock before it fails. A
/// swap holds it for a read, a compare and a rename with two fsyncs: milliseconds even on a
/// loaded machine, so this is only ever reached when the holder is paused or hung.
pub const SWAP_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The swaps of this process (each holds it shared from before it takes the swap lock until
/// after it releases it); [`pause_swaps`] holds it exclusively.
static SWAPS: RwLock<()> = RwLock::new(());

/// Held by a process that is about to pause itself: no swap of this process holds the swap
/// lock while it lives ([`pause_swaps`]).
pub struct SwapsPaused(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

/// Wait until no swap of this process is in flight, and keep new ones from starting until the
/// returned guard is dropped: a process that stops itself (`SIGSTOP` to its own pid) while
/// holding it cannot stop inside a swap and block every other writer of its stores.
pub fn pause_swaps() -> SwapsPaused {
    SwapsPaused(SWAPS.write().unwrap_or_else(|p| p.into_inner()))
}

/// The pid of the process holding the swap lock of the store at `root`, if one does and the
/// kernel says which (`/proc/locks`, Linux); `None` otherwise.
pub fn swap_lock_holder(root: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(root.join(".swap.lock")).ok()?.ino();
    let locks = fs::read_to_string("/proc/locks").ok()?;
    // `1: FLOCK  ADVISORY  WRITE 28865 fe:00:10017711 0 EOF`; a waiter's line has `->` after
    // the number.
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            return None;
        }
        let file_ino: u64 = f[5].rsplit(':').next()?.parse().ok()?;
        (file_ino == ino).then(|| f[4].parse().ok()).flatten()
    })
}

/// The state letter of process `pid` from `/proc/PID/stat` (`T` stopped, `Z` a zombie, ...);
/// `None` once it is gone (or off Linux).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: the command name may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Attempts at stopping a child outside a swap before it is left stopped wherever it is.
pub const STOP_ATTEMPTS: u32 = 1000;

/// SIGSTOP process `pid` (a child of the caller, so that its pid cannot be reused meanwhile)
/// at a moment it does not hold the swap lock of the local store at `root` (none to check
/// without one): stopped inside a swap, it is woken, given a moment to finish it, and stopped
/// again. What anyone who pauses a writer of a local store should use, so that the pause
/// never leaves every other writer waiting for the lock. `false` when it is left stopped
/// holding the lock after [`STOP_ATTEMPTS`] tries (it swapped each time it was stopped).
pub fn stop_outside_swaps(pid: u32, root: Option<&Path>) -> bool {
    for _ in 0..STOP_ATTEMPTS {
        // SAFETY: kill(2) with SIGSTOP on a child of the caller it has not reaped (so the
        // pid is not reused).
        unsafe {
            libc::kill(pid as i32, libc::SIGSTOP);
        }
        let Some(root) = root else { return true };
        if !wait_stopped(pid) || swap_lock_holder(root) != Some(pid) {
            return true;
        }
        // SAFETY: as above, with SIGCONT.
        unsafe {
            libc::kill(pid as i32, libc::SIGCONT);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// Wait until process `pid` is stopped (its state `T`); `false` if it is gone or does not
/// stop within a few seconds.
fn wait_stopped(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match process_state(pid) {
            Some('T') => return true,
            Some('Z') | Some('X') | None => return false,
            Some(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    false
}

/// The holder of the swap lock of the store at `root` as a swap's error names it: `process
/// 123`, and whether it is stopped.
fn describe_holder(root: &Path) -> String {
    let Some(pid) = swap_lock_holder(root) else {
        return "another process".into();
    };
    match process_state(pid) {
        Some('T') | Some('t') => {
            format!("process {pid}, which is stopped (wake it with SIGCONT or end it)")
        }
        _ => format!("process {pid}"),
    }
}

/// Failures inside the local backend, before they are mapped to [`CkptError`].
#[derive(Debug)]
enum LocalFailure {
    Io(io::Error),
    /// An object and a directory would share a path.
    PathConflict(&'static str),
    /// The blocking task panicked or was cancelled.
    Join(tokio::task::JoinError),
}

impl From<io::Error> for LocalFailure {
    fn from(e: io::Error) -> Self {
        LocalFailure::Io(e)
    }
}

impl LocalFailure {
    fn into_error(self, key: &str) -> CkptError {
        match self {
            LocalFailure::Io(e) => match e.kind() {
                io::ErrorKind::NotFound => CkptError::NotFound {
                    key: key.to_string(),
                },
                io::ErrorKind::AlreadyExists => CkptError::AlreadyExists {
                    key: key.to_string(),
                },
                _ => CkptError::io(key, e),
            },
            LocalFailure::PathConflict(why) => CkptError::Precondition {
                key: key.to_string(),
                reason: why.to_string(),
            },
            LocalFailure::Join(e) => CkptError::TemporarilyUnavailable {
                backend: "local",
                reason: format!("blocking file task failed: {e}"),
            },
        }
    }
}

type LResult<T> = std::result::Result<T, LocalFailure>;

impl LocalStore {
    /// A store rooted at `root`, which is created if missing.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| CkptError::io(root.display().to_string(), e))?;
        Ok(LocalStore {
            inner: Arc::new(Inner {
                root,
                tmp_counter: AtomicU64::new(0),
            }),
            swap_wait: SWAP_LOCK_WAIT,
        })
    }

    /// The same store, whose swaps wait at most `wait` for the swap lock.
    pub fn with_swap_wait(self, wait: Duration) -> Self {
        LocalStore {
            swap_wait: wait,
            ..self
        }
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The file that holds `key`.
    pub fn path_of(&self, key: &Key) -> PathBuf {
        let mut p = self.inner.root.clone();
        p.extend(key.segments());
        p
    }

    /// Delete temporary files left by crashed writers. Only call it when no writer is active
    /// on this directory. Returns how many were removed.
    pub async fn remove_temp_files(&self) -> Result<u64> {
        let root = self.inner.root.clone();
        let root_key = root.display().to_string();
        run_blocking(move || {
            let mut removed = 0;
            let mut stack = vec![root];
            while let Some(dir) = stack.pop() {
                for entry in fs::read_dir(&dir)? {
                    let entry = entry?;
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    let ft = entry.file_type()?;
                    if ft.is_dir() {
                        stack.push(entry.path());
                    } else if name.starts_with('.') && name.contains(".tmp-") {
                        fs::remove_file(entry.path())?;
                        removed += 1;
                    }
                }
            }
            Ok(removed)
        })
        .await
        .map_err(|e| e.into_error(&root_key))
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> LResult<T> + Send + 'static,
) -> LResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(LocalFailure::Join(e)),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Create `dir` and any missing parents below `root`, fsyncing each parent that gained an
/// entry so the new directories survive a crash.
fn ensure_dir(root: &Path, dir: &Path) -> LResult<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut cur = dir;
    while cur != root {
        // One metadata call per level: a directory that another writer creates meanwhile is
        // seen as a directory, never as a conflict.
        match fs::metadata(cur) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(LocalFailure::PathConflict(
                    "a parent of this key is an object; an object and a prefix cannot share a path on the local backend",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(cur.to_path_buf()),
            Err(e) => return Err(e.into()),
        }
        match cur.parent() {
            Some(p) => cur = p,
            None => break,
        }
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {
                if let Some(parent) = d.parent() {
                    sync_dir(parent)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(LocalFailure::PathConflict(
                    "a parent of this key is an object; an object and a prefix cannot share a path on the local backend",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Rename `from` to `to` unless `to` exists. Returns `AlreadyExists` if it does.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let cfrom = CString::new(from.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let cto = CString::new(to.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: both pointers are valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cfrom.as_ptr(),
                libc::AT_FDCWD,
                cto.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // The file system does not support the flag: fall back to link + unlink.
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => {}
            _ => return Err(err),
        }
    }
    fs::hard_link(from, to)?;
    fs::remove_file(from)
}

fn put_blocking(inner: &Inner, path: &Path, data: &[u8], mode: PutMode) -> LResult<()> {
    let dir = path.parent().expect("a key path has a parent (the root)");
    ensure_dir(&inner.root, dir)?;
    if path.is_dir() {
        return Err(LocalFailure::PathConflict(
            "this key is a prefix of other objects; an object and a prefix cannot share a path on the local backend",
        ));
    }
    let name = path
        .file_name()
        .expect("a key path has a file name")
        .to_string_lossy();
    let n = inner.tmp_counter.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let result = (|| -> LResult<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        match mode {
            PutMode::Overwrite => fs::rename(&tmp, path)?,
            PutMode::Create => rename_noreplace(&tmp, path)?,
        }
        Ok(())
    })();
    if result.is_err() {
        // Best effort: the temporary file is invisible anyway.
        let _ = fs::remove_file(&tmp);
        result?;
    }
    sync_dir(dir)?;
    Ok(())
}

/// Compare `path`'s content with `expected` and replace it, under the store's swap lock
/// (waited for at most `wait`).
fn swap_blocking(
    inner: &Inner,
    path: &Path,
    key: &Key,
    expected: Option<&[u8]>,
    data: &[u8],
    wait: Duration,
) -> LResult<Result<()>> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(inner.root.join(".swap.lock"))?;
    let _in_flight = SWAPS.read().unwrap_or_else(|p| p.into_inner());
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_micros(200);
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(fs::TryLockError::WouldBlock) => {
                // Not worth a retry: the wait was the retry.
                return Ok(Err(CkptError::Unavailable {
                    backend: "local",
                    reason: format!(
                        "the swap lock {} has been held for {:.0}s by {}: no other writer can \
                         change {key} until it lets go",
                        inner.root.join(".swap.lock").display(),
                        wait.as_secs_f64(),
                        describe_holder(&inner.root),
                    ),
                }));
            }
            Err(fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
    let have = match open_object(path) {
        Ok(mut f) => {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            Some(buf)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let r = match (have, expected) {
        (None, None) => put_blocking(inner, path, data, PutMode::Create).map(Ok),
        (Some(_), None) => Ok(Err(CkptError::AlreadyExists {
            key: key.to_string(),
        })),
        (Some(h), Some(want)) if h == want => {
            put_blocking(inner, path, data, PutMode::Overwrite).map(Ok)
        }
        _ => Ok(Err(swap_conflict(key))),
    };
    // Closing the file releases the lock as well; unlocking first keeps the window short.
    let _ = lock.unlock();
    r
}

/// Map "is a directory" on read to NotFound: a prefix is not an object.
fn open_object(path: &Path) -> io::Result<File> {
    let f = File::open(path)?;
    if f.metadata()?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "a prefix, not an object",
        ));
    }
    Ok(f)
}

fn list_blocking(root: &Path, prefix: Option<&Key>) -> LResult<Vec<ObjectMeta>> {
    let mut base = root.to_path_buf();
    let mut base_key = String::new();
    if let Some(p) = prefix {
        base.extend(p.segments());
        base_key = p.as_str().to_string();
    }
    let mut out = Vec::new();
    match fs::metadata(&base) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(out),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e.into()),
    }
    let mut stack = vec![(base, base_key)];
    while let Some((dir, dir_key)) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            // Removed concurrently: nothing to list there.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let key_str = if dir_key.is_empty() {
                name.to_string()
            } else {
                format!("{dir_key}/{name}")
            };
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push((entry.path(), key_str));
            } else if ft.is_file() {
                // Files that are not valid keys were not written through this store: skip.
                let Ok(key) = Key::new(key_str) else { continue };
                let size = match entry.metadata() {
                    Ok(m) => m.len(),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                out.push(ObjectMeta { key, size });
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

#[async_trait]
impl ChunkStore for LocalStore {
    fn backend(&self) -> &'static str {
        "local"
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        let inner = self.inner.clone();
        let path = self.path_of(key);
        run_blocking(move || put_blocking(&inner, &path, &data, mode))
            .await
            .map_err(|e| e.into_error(key.as_str()))
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        let inner = self.inner.clone();
        let path = self.path_of(key);
        let k = key.clone();
        let wait = self.swap_wait;
        run_blocking(move || swap_blocking(&inner, &path, &k, expected.as_deref(), &data, wait))
            .await
            .map_err(|e| e.into_error(key.as_str()))?
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        let path = self.path_of(key);
        run_blocking(move || {
            let mut f = open_object(&path)?;
            let len = f.metadata()?.len() as usize;
            let mut buf = Vec::with_capacity(len);
            f.read_to_end(&mut buf)?;
            Ok(Bytes::from(buf))
        })
        .await
        .map_err(|e| e.into_error(key.as_str()))
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        let path = self.path_of(key);
        let k = key.clone();
        run_blocking(move || {
            let mut f = open_object(&path)?;
            let size = f.metadata()?.len();
            if let Err(e) = check_range(&k, &range, size) {
                return Ok(Err(e));
            }
            // Read into spare capacity: no zero-fill of a buffer the read overwrites anyway.
            let n = range.end - range.start;
            let mut buf = Vec::with_capacity(n as usize);
            f.seek(SeekFrom::Start(range.start))?;
            f.take(n).read_to_end(&mut buf)?;
            if buf.len() as u64 != n {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            Ok(Ok(Bytes::from(buf)))
        })
        .await
        .map_err(|e| e.into_error(key.as_str()))?
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        let path = self.path_of(key);
        let size = run_blocking(move || {
            let m = fs::metadata(&path)?;
            if m.is_dir() {
                return Err(
                    io::Error::new(io::ErrorKind::NotFound, "a prefix, not an object").into(),
                );
            }
            Ok(m.len())
        })
        .await
        .map_err(|e| e.into_error(key.as_str()))?;
        Ok(ObjectMeta {
            key: key.clone(),
            size,
        })
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        let root = self.inner.root.clone();
        let p = prefix.cloned();
        let err_key = prefix.map_or_else(|| self.inner.root.display().to_string(), Key::to_string);
        run_blocking(move || list_blocking(&root, p.as_ref()))
            .await
            .map_err(|e| e.into_error(&err_key))
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        let path = self.path_of(key);
        run_blocking(move || match fs::remove_file(&path) {
            Ok(()) => {
                if let Some(dir) = path.parent() {
                    sync_dir(dir)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        })
        .await
        .map_err(|e| e.into_error(key.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A swap lock held elsewhere (here: a second open file description of this process, as
    /// a paused process would hold it) makes a swap fail after its bound, naming the lock and
    /// its holder, and changes nothing; once it is let go, the same swap goes through.
    #[tokio::test]
    async fn a_swap_waits_a_bounded_time_for_a_held_lock_and_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path())
            .unwrap()
            .with_swap_wait(Duration::from_millis(50));
        let key = Key::new("LEASE").unwrap();
        store
            .put(&key, Bytes::from_static(b"old"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(swap_lock_holder(dir.path()), None);
        let held = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.path().join(".swap.lock"))
            .unwrap();
        held.lock().unwrap();
        assert_eq!(swap_lock_holder(dir.path()), Some(std::process::id()));
        let swap = || {
            store.swap(
                &key,
                Some(Bytes::from_static(b"old")),
                Bytes::from_static(b"new"),
            )
        };
        match swap().await {
            Err(e @ CkptError::Unavailable { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(".swap.lock"), "{msg}");
                assert!(
                    msg.contains(&format!("process {}", std::process::id())),
                    "{msg}"
                );
            }
            other => panic!("expected a bounded wait, got {other:?}"),
        }
        assert_eq!(&store.get(&key).await.unwrap()[..], b"old");
        held.unlock().unwrap();
        swap().await.unwrap();
        assert_eq!(&store.get(&key).await.unwrap()[..], b"new");
    }

    #[tokio::test]
    async fn writes_leave_no_temp_files_and_stay_inside_root() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("root")).unwrap();
        let key = Key::new("a/b/c.bin").unwrap();
        store
            .put(&key, Bytes::from_static(b"hello"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(
            fs::read(dir.path().join("root/a/b/c.bin")).unwrap(),
            b"hello"
        );
        let names: Vec<_> = fs::read_dir(dir.path().join("root/a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["c.bin".to_string()]);
        assert_eq!(store.remove_temp_files().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn stale_temp_files_are_invisible_and_removable() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path()).unwrap();
        let key = Key::new("x/y").unwrap();
        store
            .put(&key, Bytes::from_static(b"1"), PutMode::Create)
            .await
            .unwrap();
        fs::write(dir.path().join("x/.y.tmp-1-0"), b"partial").unwrap();
        let listed = store.list(None).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, key);
        assert_eq!(store.remove_temp_files().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn object_and_prefix_cannot_share_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path()).unwrap();
        let a = Key::new("a").unwrap();
        let ab = Key::new("a/b").unwrap();
        store
            .put(&a, Bytes::from_static(b"1"), PutMode::Create)
            .await
            .unwrap();
        let err = store
            .put(&ab, Bytes::from_static(b"2"), PutMode::Create)
            .await
            .unwrap_err();
        assert!(matches!(err, CkptError::Precondition { .. }), "{err}");
        let c = Key::new("c/d").unwrap();
        store
            .put(&c, Bytes::from_static(b"1"), PutMode::Create)
            .await
            .unwrap();
        let err = store
            .put(&Key::new("c").unwrap(), Bytes::new(), PutMode::Overwrite)
            .await
            .unwrap_err();
        assert!(matches!(err, CkptError::Precondition { .. }), "{err}");
        assert!(matches!(
            store.get(&Key::new("c").unwrap()).await,
            Err(CkptError::NotFound { .. })
        ));
    }

    /// A child stopped while it holds the local store's swap lock is woken and stopped again
    /// until it holds it no more: a frozen job never leaves the lock to a stopped process.
    /// (`flock` holds the lock while its command runs, then lets go and exits.)
    #[test]
    fn a_child_is_never_left_stopped_holding_the_swap_lock() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("flock")
            .arg(dir.path().join(".swap.lock"))
            .args(["sleep", "0.3"])
            .spawn()
            .unwrap();
        let pid = child.id();
        // A condition, not a duration; the bound only stops a hang.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while swap_lock_holder(dir.path()) != Some(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "flock never took the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(stop_outside_swaps(pid, Some(dir.path())));
        assert_ne!(swap_lock_holder(dir.path()), Some(pid));
        // SAFETY: kill(2) on the child this test started and has not reaped.
        unsafe {
            libc::kill(pid as i32, libc::SIGCONT);
        }
        child.wait().unwrap();
    }
}

//! A server process's memory, measured by the process itself: its peak anonymous resident
//! memory (sampled, the kernel keeps no high-water mark of it), the kernel's peak of all
//! resident pages, the allocator's view (bytes in use, bytes free but kept), and what the
//! shard holds part by part (rows, ECRec's parities and dense replicas, prepared steps).
//!
//! The process writes its figures next to its port file when it stops normally
//! ([`memory_file`]); the coordinator reads them after stopping its servers and puts them in
//! the run's report. A process that is killed writes nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often the sampler reads the anonymous RSS: short enough to catch the peak of a step's
/// buffers (a step takes tens to hundreds of milliseconds).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// Resident free memory the allocator may keep before the sampler hands it back to the system
/// (`malloc_trim`): a rebuild's lock range allocates a plan of tens of megabytes and frees it,
/// and glibc keeps such holes in the middle of its heap resident for good otherwise.
pub const TRIM_FREE_ABOVE: u64 = 32 << 20;

/// How often the sampler checks the allocator's free memory and reads `/proc/self/status`
/// (the kernel's peak of resident pages, which it keeps itself, and the thread count), in
/// samples (once a second).
pub const TRIM_CHECK_EVERY: u64 = 50;

/// What a shard holds, part by part, in bytes (capacities: buffers kept for reuse count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryParts {
    /// Rows of every table with their optimizer state, and the primary dense range with its
    /// state: the model's part, as without ECRec.
    pub rows_bytes: u64,
    /// ECRec: parity rows (values and optimizer state).
    pub parity_bytes: u64,
    /// ECRec: copies of other servers' dense ranges.
    pub dense_replica_bytes: u64,
    /// ECRec, asynchronous training: the prepared steps of transactions (the slot holder's,
    /// and the spare kept for the next prepare).
    pub prepared_bytes: u64,
    /// ECRec, asynchronous training: peers' delta batches staged for transactions not yet
    /// committed, and their bytes.
    pub staged_batches: u64,
    #[serde(default)]
    pub staged_bytes: u64,
    /// ECRec, asynchronous training: prepares waiting for the node's transaction slot, and
    /// the bytes of the workers' shares they hold meanwhile.
    #[serde(default)]
    pub waiting_prepares: u64,
    #[serde(default)]
    pub waiting_bytes: u64,
    /// ECRec replacement: the record of the rows and parities still to rebuild.
    pub rebuild_bytes: u64,
}

impl MemoryParts {
    /// Bytes of the parts counted in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.rows_bytes
            + self.parity_bytes
            + self.dense_replica_bytes
            + self.prepared_bytes
            + self.staged_bytes
            + self.waiting_bytes
            + self.rebuild_bytes
    }

    fn max(self, o: MemoryParts) -> MemoryParts {
        MemoryParts {
            rows_bytes: self.rows_bytes.max(o.rows_bytes),
            parity_bytes: self.parity_bytes.max(o.parity_bytes),
            dense_replica_bytes: self.dense_replica_bytes.max(o.dense_replica_bytes),
            prepared_bytes: self.prepared_bytes.max(o.prepared_bytes),
            staged_batches: self.staged_batches.max(o.staged_batches),
            staged_bytes: self.staged_bytes.max(o.staged_bytes),
            waiting_prepares: self.waiting_prepares.max(o.waiting_prepares),
            waiting_bytes: self.waiting_bytes.max(o.waiting_bytes),
            rebuild_bytes: self.rebuild_bytes.max(o.rebuild_bytes),
        }
    }
}

impl From<ftrec_ps::ec::NodeMemory> for MemoryParts {
    fn from(m: ftrec_ps::ec::NodeMemory) -> Self {
        MemoryParts {
            rows_bytes: m.rows_bytes,
            parity_bytes: m.parity_bytes,
            dense_replica_bytes: m.dense_replica_bytes,
            prepared_bytes: m.prepared_bytes,
            staged_batches: m.staged_batches,
            staged_bytes: m.staged_bytes,
            waiting_prepares: m.waiting_prepares,
            waiting_bytes: m.waiting_bytes,
            rebuild_bytes: m.rebuild_bytes,
        }
    }
}

/// The allocator's view (glibc `mallinfo2`, summed over its arenas); zeros elsewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapFigures {
    /// Bytes handed out and not freed (small allocations and mmapped large ones).
    pub in_use_bytes: u64,
    /// Bytes freed but kept by the allocator in its arenas (not returned to the system).
    pub free_kept_bytes: u64,
}

/// One process's memory report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerMemory {
    pub server: u32,
    /// The process's incarnation (0: the first; a replacement has a higher one).
    pub generation: u32,
    /// Largest `RssAnon` (anonymous resident memory: heap, stacks, allocator arenas) over
    /// samples every [`SAMPLE_EVERY`] from the start of serving to the stop.
    pub peak_anon_bytes: u64,
    /// `VmHWM` at the stop: the kernel's peak of every resident page, the binary's mapped
    /// file pages included (about 13 MiB more than the anonymous peak, release build).
    pub vm_hwm_bytes: u64,
    /// Most threads seen at once, read once a second and at the stop (each thread that
    /// allocates may get an allocator arena).
    pub peak_threads: u64,
    pub samples: u64,
    /// The parts at the sample of the anonymous peak, and the largest of each part over all
    /// samples.
    pub parts_at_peak: MemoryParts,
    pub parts_max: MemoryParts,
    /// The allocator at the sample of the anonymous peak.
    pub heap_at_peak: HeapFigures,
    /// `MALLOC_ARENA_MAX` from the environment (`None`: the binary's own limit of two arenas,
    /// set at start).
    pub malloc_arena_max: Option<u32>,
    /// Times the sampler handed free memory back (more than [`TRIM_FREE_ABOVE`] kept), and
    /// the free bytes the allocator held just before.
    #[serde(default)]
    pub trims: u64,
    #[serde(default)]
    pub trimmed_free_bytes: u64,
}

/// Where the process that writes its address to `port_file` writes its [`ServerMemory`].
pub fn memory_file(port_file: &Path) -> PathBuf {
    port_file.with_extension("mem.json")
}

/// Current `RssAnon`, `VmHWM` and thread count of this process, in bytes and threads.
fn status() -> Option<(u64, u64, u64)> {
    let [anon, hwm, threads] = ftrec_worker::sys::status(["RssAnon:", "VmHWM:", "Threads:"])?;
    Some((anon * 1024, hwm * 1024, threads))
}

/// `/proc/self/statm`, kept open and read again from its start at each sample. The anonymous
/// RSS is its resident pages less its shared ones (the kernel counts as resident the file,
/// shared-memory and anonymous pages, as shared the first two): the `RssAnon` of
/// `/proc/self/status` without an open and the formatting and parsing of some fifty lines 50
/// times a second (the sampler was 9% of a `none` server's CPU samples that way).
struct Statm {
    file: std::fs::File,
    page_bytes: u64,
}

impl Statm {
    fn open() -> Option<Statm> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: sysconf only reads a constant of the system.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let file = std::fs::File::open("/proc/self/statm").ok()?;
            Some(Statm {
                file,
                page_bytes: u64::try_from(page).ok().filter(|&p| p > 0)?,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    /// The anonymous RSS now, in bytes.
    fn anon_bytes(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; 160];
            let n = self.file.read_at(&mut buf, 0).ok()?;
            let text = std::str::from_utf8(&buf[..n]).ok()?;
            let mut fields = text.split_ascii_whitespace().skip(1);
            let resident: u64 = fields.next()?.parse().ok()?;
            let shared: u64 = fields.next()?.parse().ok()?;
            Some(resident.saturating_sub(shared) * self.page_bytes)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = self;
            None
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap() -> HeapFigures {
    // SAFETY: mallinfo2 only reads the allocator's counters (under its arena locks).
    let m = unsafe { libc::mallinfo2() };
    HeapFigures {
        in_use_bytes: (m.uordblks + m.hblkhd) as u64,
        free_kept_bytes: m.fordblks as u64,
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap() -> HeapFigures {
    HeapFigures::default()
}

/// Samples this process's memory on a thread of its own until [`Sampler::finish`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<ServerMemory>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Start sampling; `parts` reads what the shard holds (called at every sample).
    pub fn start(
        server: u32,
        generation: u32,
        parts: impl Fn() -> MemoryParts + Send + 'static,
    ) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(ServerMemory {
            server,
            generation,
            malloc_arena_max: std::env::var("MALLOC_ARENA_MAX")
                .ok()
                .and_then(|v| v.parse().ok()),
            ..ServerMemory::default()
        }));
        let (s, r) = (stop.clone(), report.clone());
        let thread = std::thread::Builder::new()
            .name("mem-sample".into())
            .spawn(move || {
                let statm = Statm::open();
                let mut n = 0u64;
                while !s.load(Ordering::Relaxed) {
                    // The whole status at the first sample and once a second.
                    let whole = n.is_multiple_of(TRIM_CHECK_EVERY);
                    sample(&r, &parts, statm.as_ref().filter(|_| !whole));
                    n += 1;
                    if n.is_multiple_of(TRIM_CHECK_EVERY) {
                        trim_if_kept(&r);
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
                sample(&r, &parts, None);
            })
            .ok();
        Sampler {
            stop,
            report,
            thread,
        }
    }

    /// Stop sampling and return the figures.
    pub fn finish(mut self) -> ServerMemory {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let r = self.report.lock().map(|r| r.clone()).unwrap_or_default();
        r
    }
}

/// Give back the allocator's free memory if more than [`TRIM_FREE_ABOVE`] of it is resident:
/// anonymous RSS beyond the bytes in use (stacks and the like count too, a few MiB). Memory
/// handed back stays free in the allocator's books but leaves the RSS, so this fires again
/// only once new free memory has become resident.
fn trim_if_kept(report: &Mutex<ServerMemory>) {
    let Some((anon, _, _)) = status() else {
        return;
    };
    let h = heap();
    if anon.saturating_sub(h.in_use_bytes) <= TRIM_FREE_ABOVE {
        return;
    }
    let free = h.free_kept_bytes;
    ftrec_ckpt::release_free_memory();
    if let Ok(mut r) = report.lock() {
        r.trims += 1;
        r.trimmed_free_bytes += free;
    }
}

/// One sample: the anonymous RSS from `statm` where given, else with the kernel's peak and the
/// thread count from the whole status.
fn sample(report: &Mutex<ServerMemory>, parts: &dyn Fn() -> MemoryParts, statm: Option<&Statm>) {
    let (anon, whole) = match statm.and_then(Statm::anon_bytes) {
        Some(anon) => (anon, None),
        None => match status() {
            Some((anon, hwm, threads)) => (anon, Some((hwm, threads))),
            None => return,
        },
    };
    let p = parts();
    let Ok(mut r) = report.lock() else {
        return;
    };
    r.samples += 1;
    if let Some((hwm, threads)) = whole {
        r.vm_hwm_bytes = r.vm_hwm_bytes.max(hwm);
        r.peak_threads = r.peak_threads.max(threads);
    }
    r.parts_max = r.parts_max.max(p);
    // The allocator's books (a walk of its free lists) only at a new peak, not at every
    // sample that equals it.
    if anon > r.peak_anon_bytes {
        r.peak_anon_bytes = anon;
        r.parts_at_peak = p;
        r.heap_at_peak = heap();
    }
}

/// Read the [`ServerMemory`] a stopped server wrote next to `port_file` (`None`: it wrote
/// none, e.g. it was killed).
pub fn read_memory_file(port_file: &Path) -> Option<ServerMemory> {
    let text = std::fs::read_to_string(memory_file(port_file)).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's heap and RSS are shared by the tests of this binary, which run in
    /// parallel: the sampler's own trims would hand back the holes the trim test makes
    /// before that test looks. The two take this lock.
    static HEAP: Mutex<()> = Mutex::new(());

    #[test]
    fn the_sampler_sees_an_allocation_and_the_parts() {
        let _heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        let s = Sampler::start(3, 1, || MemoryParts {
            rows_bytes: 7,
            ..MemoryParts::default()
        });
        let big = vec![1u8; 48 << 20];
        std::thread::sleep(SAMPLE_EVERY * 4);
        let m = s.finish();
        drop(big);
        assert_eq!((m.server, m.generation), (3, 1));
        assert!(m.samples >= 2, "{m:?}");
        if cfg!(target_os = "linux") {
            assert!(m.peak_anon_bytes >= 48 << 20, "{m:?}");
            assert!(m.vm_hwm_bytes >= m.peak_anon_bytes / 2, "{m:?}");
            assert!(m.peak_threads >= 2, "{m:?}");
        }
        assert_eq!(m.parts_at_peak.rows_bytes, 7);
        assert_eq!(m.parts_max.total_bytes(), 7);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn statm_gives_the_anonymous_rss_of_the_status() {
        let _heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        let statm = Statm::open().unwrap();
        let big = vec![1u8; 64 << 20];
        let (from_statm, (from_status, _, _)) = (statm.anon_bytes().unwrap(), status().unwrap());
        // Read one after the other while other tests may allocate: equal within a few MiB,
        // and both see the 64 MiB just touched.
        assert!(
            from_statm.abs_diff(from_status) < 16 << 20,
            "{from_statm} {from_status}"
        );
        assert!(from_statm >= 64 << 20, "{from_statm}");
        drop(big);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn free_memory_kept_past_the_limit_is_handed_back() {
        let _heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        // Every other 8 KiB block freed: 64 MiB of holes between live blocks, which glibc
        // keeps (only a free top of the heap goes back by itself).
        let mut blocks: Vec<Vec<u8>> = (0..(16 << 10)).map(|i| vec![i as u8; 8 << 10]).collect();
        let mut i = 0;
        blocks.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        assert!(heap().free_kept_bytes > TRIM_FREE_ABOVE);
        let r = Mutex::new(ServerMemory::default());
        trim_if_kept(&r);
        let r = r.into_inner().unwrap();
        assert_eq!(r.trims, 1, "{r:?}");
        assert!(r.trimmed_free_bytes > TRIM_FREE_ABOVE, "{r:?}");
        drop(blocks);
    }

    #[test]
    fn the_memory_file_sits_next_to_the_port_file_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let port = dir.path().join("server-2.1.port");
        assert_eq!(memory_file(&port), dir.path().join("server-2.1.mem.json"));
        assert_eq!(read_memory_file(&port), None);
        let m = ServerMemory {
            server: 2,
            generation: 1,
            peak_anon_bytes: 5 << 20,
            ..ServerMemory::default()
        };
        std::fs::write(memory_file(&port), serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(read_memory_file(&port), Some(m));
    }
}

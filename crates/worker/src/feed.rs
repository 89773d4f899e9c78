//! How the single-process trainer gets its batches while it trains.
//!
//! Two feeds, one interface ([`Feed::next_batch`], [`Feed::finish`]):
//! - [`Feed::thread`]: a prefetch thread owns the source and hands whole batches over a
//!   channel (a TSV reader, which can only go forward).
//! - [`Feed::chunked`]: synthetic batches cut into chunks of [`CHUNK`] samples, made by
//!   whichever thread has time. A background thread makes chunks up to [`AHEAD`] batches
//!   ahead; when the trainer needs a batch that is not complete, it makes the chunks nobody
//!   has claimed on its own threads (rayon's pool, the one the step's parallel sections use)
//!   instead of waiting with a core idle. A sample is a pure function of its index
//!   ([`SyntheticSource::batch_at`]), so a batch has the same bits whoever made which chunk.
//!
//! Why chunks: the generator costs about a tenth of a one-thread step's CPU
//! (`docs/BENCHMARKS.md`, "The trainer against PyTorch"). When the compute threads take every
//! core, the background thread runs in the idle scheduling class so it only uses the gaps the
//! step leaves; but a thread in that class keeps its core until the scheduler's next tick
//! (up to 4 ms at 250 Hz) when a parallel section wakes its helper there, and the section
//! waits for the helper. Yielding after every chunk bounds that delay by one chunk's time
//! (about 0.1 ms); the shortfall the gaps cannot cover is made on both cores at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ftrec_core::Batch;
use ftrec_data::{BatchSource, DataError, Position, Split, SyntheticSource};

use crate::WorkerError;

/// Samples per chunk of a synthetic batch: about 0.1 ms of the generator's time.
pub const CHUNK: usize = 64;
/// Batches the background thread may have in the making ahead of the trainer.
pub const AHEAD: u64 = 2;

type Prefetched = Result<Option<(Batch, Position)>, DataError>;

/// The trainer's supply of batches (see the module docs).
pub enum Feed {
    Thread {
        rx: mpsc::Receiver<Prefetched>,
        producer: JoinHandle<(Position, u64, f64)>,
    },
    Chunked(Chunked),
}

/// What a feed reports when it is done.
pub struct FeedEnd {
    /// The position after the last sample the feed made (may be past the last one trained).
    pub position: Position,
    /// Malformed lines the reader skipped.
    pub malformed_skipped: u64,
    /// CPU seconds spent making batches, on any thread.
    pub cpu_s: f64,
}

impl Feed {
    /// Whole batches from `source` on a prefetch thread, at most `batches` of `batch` samples;
    /// the thread runs in the idle scheduling class when `background`.
    pub fn thread(
        mut source: Box<dyn BatchSource>,
        batch: usize,
        batches: u64,
        background: bool,
    ) -> Feed {
        let (tx, rx) = mpsc::sync_channel::<Prefetched>(2);
        let producer = std::thread::spawn(move || {
            if background {
                crate::sys::lowest_priority();
            }
            for _ in 0..batches {
                let item = source
                    .next_batch(batch)
                    .map(|b| b.map(|b| (b, source.position())));
                let stop = !matches!(item, Ok(Some(_)));
                if tx.send(item).is_err() || stop {
                    break;
                }
            }
            (
                source.position(),
                source.malformed_skipped(),
                crate::sys::thread_cpu_s().unwrap_or(0.0),
            )
        });
        Feed::Thread { rx, producer }
    }

    /// `source`'s training samples from its position on, at most `batches` batches of `batch`
    /// samples, made in chunks (see the module docs); the background thread runs in the idle
    /// scheduling class when `background`, and the trainer helps on `threads` threads.
    pub fn chunked(
        source: SyntheticSource,
        batch: usize,
        batches: u64,
        threads: usize,
        background: bool,
    ) -> Feed {
        Feed::Chunked(Chunked::start(source, batch, batches, threads, background))
    }

    /// The next batch and the position after it; `None` once the data or the batch count ends.
    pub fn next_batch(&mut self) -> Result<Option<(Batch, Position)>, WorkerError> {
        match self {
            Feed::Thread { rx, .. } => Ok(rx.recv().unwrap_or(Ok(None))?),
            Feed::Chunked(c) => Ok(c.take()),
        }
    }

    /// Stop making batches and report.
    pub fn finish(self) -> Result<FeedEnd, WorkerError> {
        match self {
            Feed::Thread { rx, producer } => {
                drop(rx);
                let (position, malformed_skipped, cpu_s) = producer
                    .join()
                    .map_err(|_| WorkerError::Config("the data prefetch thread panicked".into()))?;
                Ok(FeedEnd {
                    position,
                    malformed_skipped,
                    cpu_s,
                })
            }
            Feed::Chunked(c) => c.finish(),
        }
    }
}

/// Synthetic batches made in chunks by a background thread and by the trainer's threads.
pub struct Chunked {
    shared: Arc<Shared>,
    background: Option<JoinHandle<()>>,
    threads: usize,
}

struct Shared {
    source: SyntheticSource,
    batch: usize,
    /// The first sample of batch 0.
    first: u64,
    /// One past the last sample to make.
    end: u64,
    state: Mutex<State>,
    changed: Condvar,
    cpu_ns: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Batches handed to the trainer; `slots[i]` is batch `taken + i`.
    taken: u64,
    slots: VecDeque<Slot>,
    stop: bool,
}

struct Slot {
    /// The chunks made so far (emptied when the batch is put together).
    chunks: Vec<Option<Batch>>,
    total: usize,
    claimed: usize,
    made: usize,
    /// The whole batch, put together by the thread that made its last chunk.
    ready: Option<Batch>,
}

/// One chunk to make: batch `batch`'s chunk `chunk`, samples `start..start + count`.
#[derive(Clone, Copy)]
struct Claim {
    batch: u64,
    chunk: usize,
    start: u64,
    count: usize,
}

impl Shared {
    fn batches(&self) -> u64 {
        (self.end - self.first).div_ceil(self.batch as u64)
    }

    /// Samples `start..start + len` of batch `b`.
    fn range(&self, b: u64) -> (u64, usize) {
        let start = self.first + b * self.batch as u64;
        (start, (self.end - start).min(self.batch as u64) as usize)
    }

    /// The next unclaimed chunk: of batch `only`, or of any batch within [`AHEAD`] of the
    /// trainer's. Creates the slots it needs.
    fn claim(&self, st: &mut State, only: Option<u64>) -> Option<Claim> {
        let last = match only {
            Some(b) => b + 1,
            None => (st.taken + AHEAD).min(self.batches()),
        };
        for b in st.taken..last {
            let i = (b - st.taken) as usize;
            if i == st.slots.len() {
                let chunks = self.range(b).1.div_ceil(CHUNK);
                st.slots.push_back(Slot {
                    chunks: vec![None; chunks],
                    total: chunks,
                    claimed: 0,
                    made: 0,
                    ready: None,
                });
            }
            let slot = &mut st.slots[i];
            if slot.claimed < slot.total {
                let chunk = slot.claimed;
                slot.claimed += 1;
                let (start, len) = self.range(b);
                let offset = chunk * CHUNK;
                return Some(Claim {
                    batch: b,
                    chunk,
                    start: start + offset as u64,
                    count: (len - offset).min(CHUNK),
                });
            }
        }
        None
    }

    /// Make a claimed chunk and file it; put the batch together if it was the last.
    fn make(&self, c: Claim) {
        let cpu0 = crate::sys::thread_cpu_s();
        let (made, _) = self.source.batch_at(Split::Train, c.start, c.count);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // A batch is taken only once it is ready, so its slot is still here.
        let i = (c.batch - st.taken) as usize;
        let slot = &mut st.slots[i];
        slot.chunks[c.chunk] = Some(made);
        slot.made += 1;
        if slot.made == slot.total {
            let chunks = std::mem::take(&mut slot.chunks);
            drop(st);
            let batch = put_together(chunks.into_iter().flatten().collect());
            st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let i = (c.batch - st.taken) as usize;
            st.slots[i].ready = Some(batch);
            self.changed.notify_all();
        }
        drop(st);
        if let (Some(a), Some(b)) = (cpu0, crate::sys::thread_cpu_s()) {
            self.cpu_ns
                .fetch_add(((b - a).max(0.0) * 1e9) as u64, Ordering::Relaxed);
        }
    }

    /// Make chunks of batch `b` until none is left to claim.
    fn help(&self, b: u64) {
        loop {
            let claim = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                self.claim(&mut st, Some(b))
            };
            match claim {
                Some(c) => self.make(c),
                None => return,
            }
        }
    }

    /// The background thread: chunks ahead of the trainer until told to stop.
    fn run(&self, background: bool) {
        if background {
            crate::sys::lowest_priority();
        }
        loop {
            let claim = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if st.stop {
                        return;
                    }
                    if let Some(c) = self.claim(&mut st, None) {
                        break c;
                    }
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.make(claim);
            if background {
                // Let a compute thread woken on this core have it now, not at the next tick.
                std::thread::yield_now();
            }
        }
    }
}

/// One batch of `chunks` in order, allocated once at its full size.
fn put_together(chunks: Vec<Batch>) -> Batch {
    let samples = chunks.iter().map(|c| c.size).sum();
    let (dense, tables) = chunks
        .first()
        .map_or((0, 0), |c| (c.dense.len() / c.size.max(1), c.sparse.len()));
    let mut batch = Batch::with_capacity(samples, dense, tables);
    for c in &chunks {
        batch
            .append(c)
            .expect("chunks of one source have the same tables");
    }
    batch
}

impl Chunked {
    fn start(
        source: SyntheticSource,
        batch: usize,
        batches: u64,
        threads: usize,
        background: bool,
    ) -> Chunked {
        let first = source.next_sample();
        let stream_end = source.config().samples.unwrap_or(u64::MAX);
        let end = first
            .saturating_add((batch as u64).saturating_mul(batches))
            .min(stream_end)
            .max(first);
        let shared = Arc::new(Shared {
            source,
            batch: batch.max(1),
            first,
            end,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            cpu_ns: AtomicU64::new(0),
        });
        let background = {
            let shared = Arc::clone(&shared);
            Some(std::thread::spawn(move || shared.run(background)))
        };
        Chunked {
            shared,
            background,
            threads: threads.max(1),
        }
    }

    fn take(&mut self) -> Option<(Batch, Position)> {
        let sh = &*self.shared;
        let b = {
            let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.taken == sh.batches() {
                return None;
            }
            // Creates the slot if the background thread has not reached this batch yet.
            let b = st.taken;
            if let Some(c) = sh.claim(&mut st, Some(b)) {
                let left = st.slots[0].total - st.slots[0].claimed;
                drop(st);
                if self.threads > 1 && left > 0 {
                    rayon::in_place_scope(|s| {
                        for _ in 1..self.threads.min(left + 1) {
                            s.spawn(|_| sh.help(b));
                        }
                        sh.make(c);
                        sh.help(b);
                    });
                } else {
                    sh.make(c);
                    sh.help(b);
                }
            }
            b
        };
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        // Chunks the background thread claimed may still be in the making.
        while st.slots[0].ready.is_none() {
            st = sh.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let batch = st.slots.pop_front().and_then(|s| s.ready)?;
        st.taken += 1;
        sh.changed.notify_all();
        drop(st);
        let (start, len) = sh.range(b);
        Some((
            batch,
            Position::Synthetic {
                sample: start + len as u64,
            },
        ))
    }

    fn finish(mut self) -> Result<FeedEnd, WorkerError> {
        let sh = &*self.shared;
        let position = {
            let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
            st.stop = true;
            sh.changed.notify_all();
            let made = (sh.first + st.taken * sh.batch as u64).min(sh.end);
            Position::Synthetic { sample: made }
        };
        if let Some(h) = self.background.take() {
            h.join()
                .map_err(|_| WorkerError::Config("the data background thread panicked".into()))?;
        }
        Ok(FeedEnd {
            position,
            malformed_skipped: 0,
            cpu_s: sh.cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        })
    }
}

impl Drop for Chunked {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stop = true;
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_data::SynthConfig;

    fn source(samples: Option<u64>) -> SyntheticSource {
        let preset = ftrec_core::Preset::by_name("tiny").unwrap();
        let mut cfg = SynthConfig::from_preset(&preset, 7);
        cfg.samples = samples;
        SyntheticSource::new(cfg).unwrap()
    }

    /// The batches a plain reader of the same source gives, and the position after each.
    fn plain(mut src: SyntheticSource, batch: usize, batches: u64) -> Vec<(Batch, Position)> {
        let mut out = Vec::new();
        for _ in 0..batches {
            match src.next_batch(batch).unwrap() {
                Some(b) => out.push((b, src.position())),
                None => break,
            }
        }
        out
    }

    #[test]
    fn chunked_batches_are_the_plain_readers_whoever_makes_them() {
        // Batch sizes around the chunk, a finite stream ending mid-batch, and more batches
        // asked for than the stream holds.
        for (batch, samples, batches) in [
            (CHUNK, None, 5),
            (3 * CHUNK + 5, None, 4),
            (100, Some(730), 20),
            (1, Some(3), 9),
        ] {
            for (threads, background) in [(1, false), (2, false), (2, true), (3, false)] {
                let want = plain(source(samples), batch, batches);
                let mut feed = Feed::chunked(source(samples), batch, batches, threads, background);
                let mut got = Vec::new();
                while let Some(item) = feed.next_batch().unwrap() {
                    got.push(item);
                }
                let end = feed.finish().unwrap();
                assert!(
                    got == want,
                    "batch {batch}, samples {samples:?}, {threads} threads, background {background}"
                );
                let last = want.last().map(|(_, p)| p.clone());
                assert_eq!(Some(end.position), last);
            }
        }
    }

    #[test]
    fn a_feed_dropped_early_stops_its_thread() {
        let mut feed = Feed::chunked(source(None), 2 * CHUNK, 1000, 2, false);
        assert!(feed.next_batch().unwrap().is_some());
        let end = feed.finish().unwrap();
        assert_eq!(
            end.position,
            Position::Synthetic {
                sample: 2 * CHUNK as u64
            }
        );
        assert!(end.cpu_s > 0.0);
    }
}

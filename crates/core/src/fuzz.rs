//! Support for the property tests and fuzz targets that feed untrusted bytes to ftrec's readers
//! (checkpoint files, TSV lines, job files, control lines, RPC messages): byte mutations of a
//! valid encoding, and a probe of the largest single allocation a call makes, so a test can
//! assert that no reader allocates by a declared length the input does not back.
//!
//! The probe is a global allocator a test binary opts into:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: ftrec_core::fuzz::AllocProbe = ftrec_core::fuzz::AllocProbe;
//! let (result, largest) = ftrec_core::fuzz::largest_allocation(|| decode(&bytes));
//! assert!(largest <= ftrec_core::fuzz::alloc_bound(bytes.len()));
//! ```
//!
//! It refuses any single allocation above [`HARD_CAP`] (the process aborts with "memory
//! allocation of N bytes failed", naming the size) instead of letting a huge declared length
//! thrash the machine; an allocator must not unwind, so that is the loudest failure it can give.
//!
//! With the `proptest` feature (enabled by the dev-dependencies of the crates that fuzz),
//! the `strategies` module holds the proptest strategies those tests share: the case count,
//! the values written over length fields, and the mutations themselves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Values a mutation writes over a length or count field: the edges where unchecked arithmetic
/// overflows or an unchecked allocation explodes.
pub const HUGE: [u64; 10] = [
    u64::MAX,
    u64::MAX - 7,
    1 << 63,
    (1 << 62) + 1,
    1 << 40,
    1 << 32,
    u32::MAX as u64,
    (1 << 31) + 3,
    0x00ff_ffff,
    0,
];

/// One change to a byte string. Positions are taken modulo the length, so any value applies to
/// any input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Flip one bit.
    Flip { at: usize, bit: u8 },
    /// Insert a byte before `at` (or at the end).
    Insert { at: usize, byte: u8 },
    /// Delete one byte.
    Delete { at: usize },
    /// Keep the first `len % (len + 1)` bytes.
    Truncate { len: usize },
    /// Overwrite a little-endian field of `width` bytes (1, 2, 4 or 8) at the `width`-aligned
    /// position at or below `at` with `value` (its low bytes): a length field set to a huge
    /// value, a count set to zero.
    Overwrite { at: usize, width: u8, value: u64 },
}

/// Apply `m` to `b`.
pub fn apply(b: &mut Vec<u8>, m: &Mutation) {
    match *m {
        Mutation::Flip { at, bit } => {
            if !b.is_empty() {
                let i = at % b.len();
                b[i] ^= 1 << (bit % 8);
            }
        }
        Mutation::Insert { at, byte } => {
            let i = at % (b.len() + 1);
            b.insert(i, byte);
        }
        Mutation::Delete { at } => {
            if !b.is_empty() {
                let i = at % b.len();
                b.remove(i);
            }
        }
        Mutation::Truncate { len } => {
            let n = len % (b.len() + 1);
            b.truncate(n);
        }
        Mutation::Overwrite { at, width, value } => {
            let w = match width {
                1 | 2 | 4 | 8 => width as usize,
                _ => 8,
            };
            if b.len() >= w {
                let i = (at % b.len()).min(b.len() - w) / w * w;
                b[i..i + w].copy_from_slice(&value.to_le_bytes()[..w]);
            }
        }
    }
}

/// `b` with every mutation of `ms` applied in order.
pub fn mutated(b: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut v = b.to_vec();
    for m in ms {
        apply(&mut v, m);
    }
    v
}

/// The largest single allocation a reader of `input_len` bytes may make: a small multiple of
/// what it was given, plus a fixed allowance for buffers and messages. A reader that allocates
/// by a declared length it did not check against the input breaks this bound by orders of
/// magnitude.
pub fn alloc_bound(input_len: usize) -> usize {
    16 * input_len + (1 << 20)
}

/// No single allocation above this is made while the probe is installed (1 GiB).
pub const HARD_CAP: usize = 1 << 30;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|c| {
        if size > c.get() {
            c.set(size);
        }
    });
}

/// The system allocator, recording the largest allocation of each thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllocProbe;

// SAFETY: every call is forwarded to `System` unchanged, except requests above `HARD_CAP`,
// which fail (null), as an allocator may; the thread-local is a `Cell<usize>` with a const
// initializer and no destructor, so touching it never allocates or unwinds.
unsafe impl GlobalAlloc for AllocProbe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        if new_size > HARD_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Run `f` and return its result with the largest single allocation it made on this thread
/// (0 unless [`AllocProbe`] is the global allocator).
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|c| c.set(0));
    let r = f();
    (r, LARGEST.with(|c| c.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_apply_at_any_position() {
        let b = vec![0u8; 10];
        assert_eq!(mutated(&b, &[Mutation::Flip { at: 13, bit: 9 }])[3], 2);
        assert_eq!(
            mutated(&b, &[Mutation::Insert { at: 11, byte: 7 }]).len(),
            11
        );
        assert_eq!(mutated(&b, &[Mutation::Delete { at: 99 }]).len(), 9);
        assert_eq!(mutated(&b, &[Mutation::Truncate { len: 14 }]).len(), 3);
        let o = mutated(
            &b,
            &[Mutation::Overwrite {
                at: 7,
                width: 4,
                value: u64::MAX,
            }],
        );
        assert_eq!(o, [0, 0, 0, 0, 255, 255, 255, 255, 0, 0]);
        // Nothing to change in an empty input, and no panic.
        assert!(mutated(&[], &[Mutation::Flip { at: 1, bit: 1 }]).is_empty());
        assert!(
            mutated(
                &[1],
                &[Mutation::Overwrite {
                    at: 0,
                    width: 8,
                    value: 1
                }]
            )
            .len()
                == 1
        );
    }
}

/// The proptest strategies every fuzzing property test draws from.
#[cfg(feature = "proptest")]
pub mod strategies {
    use super::{Mutation, HUGE};
    use proptest::prelude::*;

    /// `cases` cases (`PROPTEST_CASES=N` raises the count for a longer local run), no failure
    /// files written into the source tree.
    pub fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(cases),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// A value to write over a length or count: an edge of [`HUGE`], any `u64`, or a small
    /// one below `small`.
    pub fn huge(small: u64) -> impl Strategy<Value = u64> {
        prop_oneof![prop::sample::select(HUGE.to_vec()), any::<u64>(), 0..small]
    }

    /// Any [`Mutation`]: inserted bytes from `insert`, overwrites of 1, 2, 4 or 8 bytes with a
    /// value from `over`.
    pub fn mutation_with(
        insert: impl Strategy<Value = u8>,
        over: impl Strategy<Value = u64>,
    ) -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
            (any::<usize>(), insert).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
            any::<usize>().prop_map(|at| Mutation::Delete { at }),
            any::<usize>().prop_map(|len| Mutation::Truncate { len }),
            (
                any::<usize>(),
                prop::sample::select(vec![1u8, 2, 4, 8]),
                over
            )
                .prop_map(|(at, width, value)| Mutation::Overwrite {
                    at,
                    width,
                    value
                }),
        ]
    }

    /// Any [`Mutation`] of any byte, overwrites from [`huge`]`(small)`.
    pub fn mutation(small: u64) -> impl Strategy<Value = Mutation> {
        mutation_with(any::<u8>(), huge(small))
    }
}

//! Software prefetch of rows about to be read or written.
//!
//! A step touches a few thousand rows scattered over tables of tens of MiB, so each touch is
//! a cache miss (and often a TLB miss) that the loop waits for in turn: profiles of the
//! servers put these misses, not the arithmetic, under the row copies, optimizer steps and
//! parity updates (docs/BENCHMARKS.md). Loops over such rows ask for the row [`AHEAD`]
//! positions further on before working on the current one, so that the misses overlap.

/// How many rows ahead of the current one a loop prefetches: far enough for a miss to be
/// served meanwhile (a row's work is tens of nanoseconds, a miss a hundred or more), near
/// enough that the prefetched lines are still cached when the loop gets there.
pub const AHEAD: usize = 8;

/// Hint that `words` will be used soon: its first and last cache lines are requested (a row of
/// tens of words spans one or two lines). Only a hint: it changes no value and never faults,
/// whatever the slice; a no-op on targets without a stable prefetch instruction.
#[inline(always)]
pub fn prefetch(words: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if let (Some(first), Some(last)) = (words.first(), words.last()) {
            // SAFETY: `prefetch` is a hint to the cache: it does not dereference the address
            // in the program's sense, cannot fault, and both addresses lie inside `words`.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(first).cast::<i8>());
                _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(last).cast::<i8>());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = words;
}

/// Hint that the value `x` will be used soon: its cache line is requested.
#[inline(always)]
pub fn prefetch_value<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: as in `prefetch`: a hint that cannot fault, at the address of a live value.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_changes_no_value_and_takes_any_slice() {
        let words: Vec<f32> = (0..40).map(|i| i as f32).collect();
        prefetch(&words);
        prefetch(&words[3..4]);
        prefetch(&[]);
        prefetch_value(&words[7]);
        assert_eq!(words, (0..40).map(|i| i as f32).collect::<Vec<_>>());
    }
}

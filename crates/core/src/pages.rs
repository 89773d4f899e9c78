//! Transparent huge pages for the large buffers read at random rows.
//!
//! A step reads and updates a few thousand rows scattered over embedding tables of tens to
//! hundreds of MiB. With 4 KiB pages each of those touches also misses the TLB (the second-
//! level TLB of a current x86 core maps about 12 MiB of 4 KiB pages), and the page walk
//! comes on top of the cache miss that the row prefetches hide. Backed by 2 MiB pages, the same
//! tables fit in the TLB. Kernels that hand out huge pages only where asked (`madvise` mode,
//! the common default) need the request before the memory is first touched.

/// Buffers below this many bytes are left alone: they fit in the TLB with small pages.
const HUGE_FROM: usize = 4 << 20;

/// A zero-filled vector of `len` floats; on Linux, if it is at least a few MiB, the kernel is
/// asked to back it with transparent huge pages (a hint: where the kernel declines, or on
/// other systems, it is an ordinary vector). Its values are zeros either way.
pub fn zeroed(len: usize) -> Vec<f32> {
    // A large zeroed allocation is fresh mapped memory, untouched until written, so the
    // advice comes before the first fault.
    let v = vec![0.0f32; len];
    advise_huge(&v);
    v
}

/// Ask the kernel to back the whole pages inside `v` with huge pages.
#[cfg(target_os = "linux")]
fn advise_huge(v: &[f32]) {
    const PAGE: usize = 4096;
    let bytes = std::mem::size_of_val(v);
    if bytes < HUGE_FROM {
        return;
    }
    let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (v.as_ptr() as usize + bytes) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies inside `v`'s allocation, and MADV_HUGEPAGE changes how the
        // kernel backs those pages, never their contents. A failure (a kernel without
        // transparent huge pages) leaves the ordinary pages, so its result is not needed.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: &[f32]) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_zeros_of_the_length_asked_for_any_size() {
        for len in [0, 1, 1000, (HUGE_FROM / 4) + 17] {
            let v = zeroed(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x.to_bits() == 0));
        }
    }
}

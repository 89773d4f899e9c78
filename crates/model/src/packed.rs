//! A packed single-precision matrix product with ftrec's own micro-kernels: the default
//! backend on CPUs that have AVX-512F ([`crate::gemm::Backend::Avx512`]), and on request the
//! same bits on CPUs with AVX2 and FMA ([`crate::gemm::Backend::Avx2`]).
//!
//! The `gemm` crate's AVX-512 kernels need a nightly compiler and `matrixmultiply` has none
//! for `f32`, so on a CPU with two 512-bit FMA units both leave half of its peak unused. This
//! is the classic scheme (Goto's): for each block of `KC` steps of `k`, the block of `B` is
//! packed into panels of [`NR`] columns, and each thread takes blocks of [`MC`] rows of `A`
//! and runs the micro-kernel over every pair of an `A` panel of [`MR`] rows and a `B` panel.
//! The AVX-512 micro-kernel keeps an `MR x NR` tile of `C` in 24 of the 32 vector registers
//! and, for each step of `k`, loads two vectors of the `B` panel and broadcasts each of the
//! `MR` values of `A` into a fused multiply-add. The AVX2 one has 16 registers of 8 lanes: it
//! runs the same tile as four quarters of 6 x 16 (12 accumulators, two `B` vectors and the
//! broadcast), each over every step of `k` of the block, the two quarters that read the same
//! half of the `B` panel one after the other. A row-major `A` (the forward pass and the input
//! gradient) is read in place, `MR` rows side by side, since packing it would be a transpose
//! that costs more than it saves; a column-major one (the weight gradient) is packed. `B` is
//! always packed: read in place, a panel's rows would lie one row of `B` apart, and at the
//! DLRM's power-of-two widths they would all fall into a few sets of the first-level cache.
//! Partial tiles (the matrix's last rows and columns) run the same kernel on zero-padded
//! panels into a scratch tile, so every element of `C` is computed by the same sequence of
//! operations; a panel with at most `NR / 2` live columns (a 13- or 16-wide `C`) computes the
//! tile's first half only, each element by the same chain.
//!
//! # Same bits for every thread count
//! Threads split `C` by whole tiles: by rows where it has many (the forward pass and the input
//! gradient, batch rows), else by column panels (a weight gradient, whose `B` is the large
//! operand: each thread packs its own part of it). An element's sum runs over `k` in order,
//! one fused multiply-add per step within a `KC` block, the blocks added to `C` one after the
//! other, `KC` fixed. Which thread runs a tile changes nothing, so a product gives the same
//! bits for every thread count (the `gemm_threads` integration test checks it on a whole step).
//!
//! # Same bits for both kernels
//! Both kernels compute an element of a block of `k` as the same chain of fused multiply-adds
//! from zero, in the order of `k`, and add it to `C` the same way; a fused multiply-add rounds
//! once whatever the vector width. So the AVX2 kernel gives the AVX-512 kernel's bits, and a
//! model trained on one CPU has the digest of the other (the tests compare both with a scalar
//! chain of `f32::mul_add`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use std::cell::RefCell;

/// Rows of a micro-tile.
pub(crate) const MR: usize = 12;
/// Columns of a micro-tile: two 16-lane vectors.
pub(crate) const NR: usize = 32;
/// Steps of `k` per packed block: a `B` panel (`KC x NR`, 32 KiB) stays in the first-level
/// cache while a thread runs the `A` panels of its block past it.
const KC: usize = 256;
/// Rows of `A` per packed block and unit of work of a thread (a multiple of [`MR`]).
const MC: usize = 96;

/// The instruction set a micro-kernel is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F: an `MR x NR` tile in 24 of the 32 registers of 16 lanes.
    Avx512,
    /// AVX2 with FMA: the same tile as four quarters of 6 x 16.
    Avx2,
}

impl Isa {
    /// The instructions the kernel needs, as an error message names them.
    pub(crate) fn needs(self) -> &'static str {
        match self {
            Isa::Avx512 => "AVX-512F",
            Isa::Avx2 => "AVX2 and FMA",
        }
    }

    /// Whether this CPU runs the kernel (has what [`Isa::needs`] names).
    pub(crate) fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }
}

thread_local! {
    /// Each thread's packed block of `A`.
    static A_PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's packed block of `B`.
    static B_PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with this thread's buffer in `key`, or with a fresh one if the thread is already
/// using it (a product run from inside a job that another product's thread stole).
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    f: impl FnOnce(&mut Vec<f32>) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => f(&mut buf),
        Err(_) => f(&mut Vec::new()),
    })
}

/// A read-only strided matrix: element `(i, p)` at `ptr[i * rs + p * cs]`.
#[derive(Clone, Copy)]
struct Strided {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

// SAFETY: only ever read, while the caller's borrow of the slice it points into is alive.
unsafe impl Send for Strided {}
unsafe impl Sync for Strided {}

/// Make `buf` hold `len` floats, without clearing what it held: packing overwrites every
/// element but the padding, which it zeroes itself.
fn fit(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// Pack rows `i0..i0 + rows` and steps `p0..p0 + kc` of `a` into panels of [`MR`] rows:
/// panel `t` holds, for each step, the values of its `MR` rows one after the other, zeros past
/// the last row.
///
/// # Safety
/// Every element named must lie inside the matrix `a` points into.
unsafe fn pack_a(a: Strided, i0: usize, rows: usize, p0: usize, kc: usize, out: &mut Vec<f32>) {
    let panels = rows.div_ceil(MR);
    if panels == 0 {
        return;
    }
    fit(out, panels * MR * kc);
    // Only the last panel can be partial: zeros past its last row.
    let last_live = rows - (panels - 1) * MR;
    if last_live < MR {
        let dst = out[(panels - 1) * MR * kc..panels * MR * kc].as_mut_ptr();
        for p in 0..kc {
            std::slice::from_raw_parts_mut(dst.add(p * MR + last_live), MR - last_live).fill(0.0);
        }
    }
    let first = a.ptr.add(i0 * a.rs + p0 * a.cs);
    if a.rs == 1 {
        // Column-major (a transposed operand): a step's rows lie side by side, so each step
        // is read once, in order, and dealt out to the panels.
        for p in 0..kc {
            let s = first.add(p * a.cs);
            for t in 0..panels {
                let (s, d) = (s.add(t * MR), out.as_mut_ptr().add(t * MR * kc + p * MR));
                if t + 1 < panels || last_live == MR {
                    // A fixed-size copy the compiler turns into vector moves.
                    std::ptr::write_unaligned(
                        d as *mut [f32; MR],
                        std::ptr::read_unaligned(s as *const [f32; MR]),
                    );
                } else {
                    for r in 0..last_live {
                        *d.add(r) = *s.add(r);
                    }
                }
            }
        }
        return;
    }
    for t in 0..panels {
        let dst = out[t * MR * kc..(t + 1) * MR * kc].as_mut_ptr();
        let live = (rows - t * MR).min(MR);
        let first = first.add(t * MR * a.rs);
        if a.cs == 1 {
            // Row-major: read each row's steps in order, a transpose into the panel.
            let mut rowp = [first; MR];
            for (r, q) in rowp.iter_mut().enumerate().take(live) {
                *q = first.add(r * a.rs);
            }
            for p in 0..kc {
                let d = dst.add(p * MR);
                for (r, q) in rowp.iter().enumerate().take(live) {
                    *d.add(r) = *q.add(p);
                }
            }
        } else {
            for r in 0..live {
                let row = first.add(r * a.rs);
                for p in 0..kc {
                    *dst.add(p * MR + r) = *row.add(p * a.cs);
                }
            }
        }
    }
}

/// Pack steps `p0..p0 + kc` and the columns of panels `lo..hi` of `b` (`n` columns in all)
/// into panels of [`NR`] columns, zeros past the last column. For the AVX-512 kernel a panel
/// holds, step after step, its `NR` values; for the AVX2 one it holds every step of its first
/// [`QC`] columns, then every step of the others, so that each quarter of the tile reads its
/// half of the panel in order.
///
/// # Safety
/// As [`pack_a`].
#[allow(clippy::too_many_arguments)]
unsafe fn pack_b(
    isa: Isa,
    b: Strided,
    p0: usize,
    kc: usize,
    n: usize,
    (lo, hi): (usize, usize),
    out: &mut Vec<f32>,
) {
    let halves = isa == Isa::Avx2;
    // Where step `p` of column `j` of a panel goes.
    let at = |p: usize, j: usize| {
        if halves {
            (j / QC) * kc * QC + p * QC + j % QC
        } else {
            p * NR + j
        }
    };
    if hi <= lo {
        return;
    }
    fit(out, (hi - lo) * NR * kc);
    // Only the last panel of `B` can be partial: zeros past its last column.
    let last_live = (n - (hi - 1) * NR).min(NR);
    if last_live < NR {
        let dst = &mut out[(hi - 1 - lo) * NR * kc..(hi - lo) * NR * kc];
        for p in 0..kc {
            for j in last_live..NR {
                dst[at(p, j)] = 0.0;
            }
        }
    }
    if b.cs == 1 {
        // Row-major: each step's row is read once, in order, and dealt out to the panels
        // (reading a panel's steps one after the other would stride a whole row of `B` per
        // step, which the prefetchers follow less well: packing took 4.1% of a step's cycles
        // that way on a Zen 4).
        for p in 0..kc {
            let src = b.ptr.add((p0 + p) * b.rs);
            for t in lo..hi {
                let dst = &mut out[(t - lo) * NR * kc..(t - lo + 1) * NR * kc];
                let j0 = t * NR;
                let src = src.add(j0);
                if t + 1 < hi || last_live == NR {
                    // A fixed-size copy the compiler turns into vector moves.
                    let row = std::ptr::read_unaligned(src as *const [f32; NR]);
                    if halves {
                        dst[p * QC..(p + 1) * QC].copy_from_slice(&row[..QC]);
                        dst[(kc + p) * QC..(kc + p + 1) * QC].copy_from_slice(&row[QC..]);
                    } else {
                        dst[p * NR..(p + 1) * NR].copy_from_slice(&row);
                    }
                } else {
                    for j in 0..last_live {
                        dst[at(p, j)] = *src.add(j);
                    }
                }
            }
        }
    } else {
        for t in lo..hi {
            let dst = &mut out[(t - lo) * NR * kc..(t - lo + 1) * NR * kc];
            let j0 = t * NR;
            let live = (n - j0).min(NR);
            for j in 0..live {
                let col = b.ptr.add(p0 * b.rs + (j0 + j) * b.cs);
                for p in 0..kc {
                    dst[at(p, j)] = *col.add(p * b.rs);
                }
            }
        }
    }
}

/// `C[MR x NR] (+)= A * Bpanel` over `kc` steps (`Bpanel` a panel of [`pack_b`]), `A`'s
/// element `(r, p)` at
/// `a[r * lda + p]` (`PACKED` off: rows of a row-major matrix) or at `a[p * MR + r]` (`PACKED`
/// on: a panel of [`pack_a`]); `c` has row stride `ldc`. Without `accumulate` the tile is
/// overwritten, with it the sum is added to what `C` holds. With `HALF` only the tile's first
/// `NR / 2` columns are computed and written (a panel with no more live columns than that);
/// each of them by the same chain as without it.
///
/// # Safety
/// The CPU has AVX-512F; `a` and `b` hold the values named, and `c` an `MR x NR` tile at row
/// stride `ldc` (`MR x NR / 2` with `HALF`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<const PACKED: bool, const HALF: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let mut b = b;
    if PACKED {
        let mut a = a;
        for _ in 0..kc {
            let b0 = _mm512_loadu_ps(b);
            let b1 = if HALF { b0 } else { _mm512_loadu_ps(b.add(16)) };
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(r));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                if !HALF {
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    } else {
        let rows: [*const f32; MR] = std::array::from_fn(|r| a.add(r * lda));
        for p in 0..kc {
            let b0 = _mm512_loadu_ps(b);
            let b1 = if HALF { b0 } else { _mm512_loadu_ps(b.add(16)) };
            for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                let x = _mm512_set1_ps(*row.add(p));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                if !HALF {
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }
            b = b.add(NR);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = c.add(r * ldc);
        if accumulate {
            _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), acc[0]));
            if !HALF {
                _mm512_storeu_ps(
                    row.add(16),
                    _mm512_add_ps(_mm512_loadu_ps(row.add(16)), acc[1]),
                );
            }
        } else {
            _mm512_storeu_ps(row, acc[0]);
            if !HALF {
                _mm512_storeu_ps(row.add(16), acc[1]);
            }
        }
    }
}

/// [`tile`] on a packed `A` panel (`half`: [`tile`]'s `HALF`).
///
/// # Safety
/// As [`tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    if half {
        tile::<true, true>(kc, a, 0, b, c, ldc, accumulate)
    } else {
        tile::<true, false>(kc, a, 0, b, c, ldc, accumulate)
    }
}

/// [`tile`] on [`MR`] rows of a row-major `A` read in place (row stride `lda`): its packing
/// would be a transpose, which costs more than the reads it saves (`half`: [`tile`]'s `HALF`).
///
/// # Safety
/// As [`tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_rows(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    if half {
        tile::<false, true>(kc, a, lda, b, c, ldc, accumulate)
    } else {
        tile::<false, false>(kc, a, lda, b, c, ldc, accumulate)
    }
}

/// Rows of a quarter of the AVX2 tile.
const QR: usize = 6;
/// Columns of a quarter of the AVX2 tile: two 8-lane vectors.
const QC: usize = 16;

/// [`tile`] with AVX2 and FMA on a `B` panel packed for it ([`pack_b`]): the `MR x NR` tile as
/// four `QR x QC` quarters, each a chain of fused multiply-adds over the `kc` steps from zero,
/// like [`tile`]'s (so the same bits); with `HALF` the two quarters of the first `QC` columns.
///
/// # Safety
/// The CPU has AVX2 and FMA; otherwise as [`tile`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_avx2<const PACKED: bool, const HALF: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // The two quarters that read the same half of the `B` panel (every step of its first
    // `QC` columns, then of the others: see `pack_b`) run one after the other; a half tile
    // runs the first two only.
    let quarters: &[(usize, usize)] = if HALF {
        &[(0, 0), (QR, 0)]
    } else {
        &[(0, 0), (QR, 0), (0, QC), (QR, QC)]
    };
    for &(r0, j0) in quarters {
        let mut acc = [[_mm256_setzero_ps(); 2]; QR];
        let mut bq = b.add(j0 / QC * kc * QC);
        if PACKED {
            let mut aq = a.add(r0);
            for _ in 0..kc {
                let b0 = _mm256_loadu_ps(bq);
                let b1 = _mm256_loadu_ps(bq.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*aq.add(r));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
                aq = aq.add(MR);
                bq = bq.add(QC);
            }
        } else {
            let rows: [*const f32; QR] = std::array::from_fn(|r| a.add((r0 + r) * lda));
            for p in 0..kc {
                let b0 = _mm256_loadu_ps(bq);
                let b1 = _mm256_loadu_ps(bq.add(8));
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    let x = _mm256_broadcast_ss(&*row.add(p));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
                bq = bq.add(QC);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = c.add((r0 + r) * ldc + j0);
            if accumulate {
                _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), acc[0]));
                _mm256_storeu_ps(
                    row.add(8),
                    _mm256_add_ps(_mm256_loadu_ps(row.add(8)), acc[1]),
                );
            } else {
                _mm256_storeu_ps(row, acc[0]);
                _mm256_storeu_ps(row.add(8), acc[1]);
            }
        }
    }
}

/// [`kernel`] with AVX2 and FMA.
///
/// # Safety
/// As [`tile_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    if half {
        tile_avx2::<true, true>(kc, a, 0, b, c, ldc, accumulate)
    } else {
        tile_avx2::<true, false>(kc, a, 0, b, c, ldc, accumulate)
    }
}

/// [`kernel_rows`] with AVX2 and FMA.
///
/// # Safety
/// As [`tile_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_rows_avx2(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    if half {
        tile_avx2::<false, true>(kc, a, lda, b, c, ldc, accumulate)
    } else {
        tile_avx2::<false, false>(kc, a, lda, b, c, ldc, accumulate)
    }
}

/// The micro-kernel of `isa` on a packed `A` panel ([`kernel`], [`kernel_avx2`]).
///
/// # Safety
/// The CPU runs `isa`; otherwise as [`tile`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run_kernel(
    isa: Isa,
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    match isa {
        Isa::Avx512 => kernel(kc, a, b, c, ldc, accumulate, half),
        Isa::Avx2 => kernel_avx2(kc, a, b, c, ldc, accumulate, half),
    }
}

/// The micro-kernel of `isa` on rows of `A` read in place ([`kernel_rows`],
/// [`kernel_rows_avx2`]).
///
/// # Safety
/// As [`run_kernel`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run_kernel_rows(
    isa: Isa,
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    half: bool,
) {
    match isa {
        Isa::Avx512 => kernel_rows(kc, a, lda, b, c, ldc, accumulate, half),
        Isa::Avx2 => kernel_rows_avx2(kc, a, lda, b, c, ldc, accumulate, half),
    }
}

/// `C` shared by threads that write disjoint parts of it: row-major, `n` columns.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    n: usize,
}

// SAFETY: threads given an `Out` write disjoint tiles, and the caller's exclusive borrow of
// `C` outlives them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// One thread's block: rows `i0..i0 + rows` of `C`, steps `p0..p0 + kc`, the columns of
/// panels `lo..lo + bp.len() / (NR * kc)`, with that block of `B` packed in `bp`.
///
/// # Safety
/// The CPU runs `isa`; `a` covers rows `i0..i0 + rows` and steps `p0..p0 + kc`; `c` is `C`
/// (`m x n`, `m >= i0 + rows`), written here by this thread alone in these rows and columns;
/// `bp` is `pack_b`'s block for the same steps and panels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    isa: Isa,
    a: Strided,
    i0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    bp: &[f32],
    lo: usize,
    c: Out,
) {
    let n = c.n;
    let accumulate = p0 > 0;
    // A row-major `A` is read in place, all but a last partial panel; any other is packed.
    let in_place = if a.cs == 1 { rows / MR } else { 0 };
    with_buffer(&A_PACK, |ap| {
        let packed_rows = rows - in_place * MR;
        pack_a(a, i0 + in_place * MR, packed_rows, p0, kc, ap);
        let ap = &ap[..packed_rows.div_ceil(MR) * MR * kc];
        let mut scratch = [0.0f32; MR * NR];
        for (jt, bpanel) in bp.chunks_exact(NR * kc).enumerate() {
            let j0 = (lo + jt) * NR;
            let cols = (n - j0).min(NR);
            let (bpanel, full_cols) = (bpanel.as_ptr(), cols == NR);
            // A panel with no more than half its columns live (a narrow `C`: the first
            // layer's weight gradient, 13 wide; a 16-wide layer) computes the half only.
            let half = cols <= NR / 2;
            for it in 0..in_place {
                let r0 = it * MR;
                let arows = a.ptr.add((i0 + r0) * a.rs + p0);
                let tile = c.ptr.add((i0 + r0) * n + j0);
                if full_cols {
                    run_kernel_rows(isa, kc, arows, a.rs, bpanel, tile, n, accumulate, false);
                } else {
                    run_kernel_rows(
                        isa,
                        kc,
                        arows,
                        a.rs,
                        bpanel,
                        scratch.as_mut_ptr(),
                        NR,
                        false,
                        half,
                    );
                    add_part(&scratch, MR, tile, n, cols, accumulate);
                }
            }
            for (it, apanel) in ap.chunks_exact(MR * kc).enumerate() {
                let r0 = (in_place + it) * MR;
                let live = (rows - r0).min(MR);
                let tile = c.ptr.add((i0 + r0) * n + j0);
                if live == MR && full_cols {
                    run_kernel(isa, kc, apanel.as_ptr(), bpanel, tile, n, accumulate, false);
                } else {
                    run_kernel(
                        isa,
                        kc,
                        apanel.as_ptr(),
                        bpanel,
                        scratch.as_mut_ptr(),
                        NR,
                        false,
                        half,
                    );
                    add_part(&scratch, live, tile, n, cols, accumulate);
                }
            }
        }
    });
}

/// Write (or with `accumulate`, add) the first `rows x cols` of a scratch tile into `C`.
///
/// # Safety
/// `tile` starts a `rows x cols` block of `C` at row stride `n`.
unsafe fn add_part(
    scratch: &[f32; MR * NR],
    rows: usize,
    tile: *mut f32,
    n: usize,
    cols: usize,
    accumulate: bool,
) {
    for r in 0..rows {
        let dst = std::slice::from_raw_parts_mut(tile.add(r * n), cols);
        let src = &scratch[r * NR..r * NR + cols];
        if accumulate {
            for (d, s) in dst.iter_mut().zip(src) {
                *d += *s;
            }
        } else {
            dst.copy_from_slice(src);
        }
    }
}

/// `C[m x n] = A * B` (see [`crate::gemm`]'s `product` for the strides), on up to `threads`
/// threads of rayon's global pool, with the micro-kernel of `isa`.
///
/// # Safety
/// The CPU runs `isa` ([`Isa::available`]); `a` and `b` cover every element their strides
/// reach for these shapes, and `c` holds `m * n` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    isa: Isa,
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    c: &mut [f32],
    threads: usize,
) {
    product_then(isa, m, k, n, a, a_strides, b, b_strides, c, threads, None)
}

/// A bias added to every row of a product's `C`, then ReLU if asked: the model's own
/// element-wise kernel (`t = c + bias; c = t > 0 ? t : 0`), run on each block of rows.
#[derive(Clone, Copy)]
pub(crate) struct BiasAct<'a> {
    pub bias: &'a [f32],
    pub relu: bool,
}

/// [`product`], then `then` applied to each block of rows of `C` by the thread that computed
/// it, right after its last block of `k` (while it is still in that core's cache).
///
/// # Safety
/// As [`product`]; `then`'s bias holds `n` values.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_then(
    isa: Isa,
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    c: &mut [f32],
    threads: usize,
    then: Option<BiasAct<'_>>,
) {
    let c = &mut c[..m * n];
    if let Some(t) = then {
        assert!(
            t.bias.len() >= n,
            "a bias of {} for {n} columns",
            t.bias.len()
        );
    }
    if k == 0 {
        c.fill(0.0);
        if let Some(t) = then {
            crate::dlrm::kernels::bias_act(c, &t.bias[..n], t.relu);
        }
        return;
    }
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let a = Strided {
            ptr: a.as_ptr(),
            rs: a_rs,
            cs: a_cs,
        };
        let b = Strided {
            ptr: b.as_ptr(),
            rs: b_rs,
            cs: b_cs,
        };
        let out = Out {
            ptr: c.as_mut_ptr(),
            n,
        };
        let panels = n.div_ceil(NR);
        // Rows `r0..r1` against panels `lo..hi`, every block of `k` in order, each thread
        // packing the blocks of `B` it reads. (Packing `B` once for all the threads of a
        // split by rows, their panels split between them, then computing in a second
        // parallel part was slower: the MLP at two threads 16.3 ms against 16.0, 4 pairs.)
        let part = |(r0, r1): (usize, usize), (lo, hi): (usize, usize)| {
            with_buffer(&B_PACK, |bp| {
                let mut p0 = 0;
                while p0 < k {
                    let kc = (k - p0).min(KC);
                    // `B` is always packed: read in place, a panel's rows would lie a row of
                    // `B` apart, which at the DLRM's power-of-two widths puts them all in a
                    // few sets of the first-level cache (measured: 146 -> 116 GFLOP/s).
                    pack_b(isa, b, p0, kc, n, (lo, hi), bp);
                    let bp = &bp[..(hi - lo) * NR * kc];
                    let last = p0 + kc == k;
                    let mut i0 = r0;
                    while i0 < r1 {
                        let rows = (r1 - i0).min(MC);
                        block(isa, a, i0, rows, p0, kc, bp, lo, out);
                        if let (true, Some(t)) = (last, then) {
                            let (c0, c1) = (lo * NR, (hi * NR).min(n));
                            for r in i0..i0 + rows {
                                let row = std::slice::from_raw_parts_mut(
                                    out.ptr.add(r * n + c0),
                                    c1 - c0,
                                );
                                crate::dlrm::kernels::bias_act(row, &t.bias[c0..c1], t.relu);
                            }
                        }
                        i0 += rows;
                    }
                    p0 += kc;
                }
            })
        };
        // Below ~4 M multiply-adds a second thread costs more than it saves (measured on the
        // DLRM's 16- and 64-wide layers: 2 M took 1.3-2.2x as long on two threads as on one).
        let parallel = threads > 1 && m * n * k >= 1 << 22;
        // Split `C` by rows where it has many (each thread packs all of `B`, which is
        // small next to `A` there), else by column panels (each thread packs its own part
        // of `B`, the large operand of a weight gradient). Parts are whole tiles.
        let by_rows = m.div_ceil(MR) >= 2 * threads && m >= n;
        let parts: Vec<((usize, usize), (usize, usize))> = if !parallel {
            vec![((0, m), (0, panels))]
        } else if by_rows {
            let per = m.div_ceil(MR).div_ceil(threads) * MR;
            (0..m)
                .step_by(per)
                .map(|r0| ((r0, (r0 + per).min(m)), (0, panels)))
                .collect()
        } else {
            let per = panels.div_ceil(threads.min(panels));
            (0..panels)
                .step_by(per)
                .map(|lo| ((0, m), (lo, (lo + per).min(panels))))
                .collect()
        };
        if parts.len() == 1 {
            part(parts[0].0, parts[0].1);
        } else {
            rayon::in_place_scope(|s| {
                let part = &part;
                for &(rows, cols) in &parts[1..] {
                    s.spawn(move |_| part(rows, cols));
                }
                part(parts[0].0, parts[0].1);
            });
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, a, a_rs, a_cs, b, b_rs, b_cs, threads);
        unreachable!("the packed backends are only chosen on x86-64 CPUs that run their kernel");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        ars: (usize, usize),
        b: &[f32],
        brs: (usize, usize),
    ) -> Vec<f64> {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| {
                        f64::from(a[i * ars.0 + p * ars.1]) * f64::from(b[p * brs.0 + j * brs.1])
                    })
                    .sum();
            }
        }
        c
    }

    /// The kernels this CPU runs (a line says so when it runs none).
    fn isas() -> Vec<Isa> {
        let v: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|i| i.available())
            .collect();
        if v.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 with FMA");
        }
        v
    }

    fn run(
        isa: Isa,
        m: usize,
        k: usize,
        n: usize,
        threads: usize,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Vec<f32> {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 19) as f32 - 9.0) / 4.0)
            .collect();
        let ars = if transpose_a { (1, m) } else { (k, 1) };
        let brs = if transpose_b { (1, k) } else { (n, 1) };
        let mut c = vec![f32::NAN; m * n];
        // SAFETY: checked by the caller's `available`; the strides stay inside `a` and `b`.
        unsafe { product(isa, m, k, n, &a, ars, &b, brs, &mut c, threads) };
        let want = naive(m, k, n, &a, ars, &b, brs);
        for (i, (x, y)) in c.iter().zip(&want).enumerate() {
            // Inputs are multiples of 1/32 with small numerators: every product and partial
            // sum is exact in f32, so any order gives the exact value.
            assert_eq!(f64::from(*x), *y, "{isa:?} m {m} k {k} n {n}: element {i}");
        }
        c
    }

    #[test]
    fn every_shape_and_stride_matches_exact_sums() {
        for isa in isas() {
            every_shape(isa);
        }
    }

    fn every_shape(isa: Isa) {
        for &(m, k, n) in &[
            (1, 1, 1),
            (12, 256, 32),
            (13, 257, 33),
            (97, 300, 16),
            (200, 13, 512),
            (2, 600, 1),
            (193, 64, 367),
            // Last panels with more than half their columns live, and a narrow `C` over
            // several blocks of `k` (the first layer's weight gradient).
            (30, 70, 50),
            (40, 600, 13),
        ] {
            for (ta, tb) in [(false, false), (false, true), (true, false)] {
                run(isa, m, k, n, 1, ta, tb);
            }
        }
    }

    #[test]
    fn threads_give_the_same_bits() {
        for isa in isas() {
            same_bits_for_threads(isa);
        }
    }

    fn same_bits_for_threads(isa: Isa) {
        // Split by rows (m >= n) and by column panels (m < n), each operand layout.
        for (m, k, n) in [(400, 700, 77), (64, 700, 400), (30, 2048, 367)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            for (ars, brs) in [((k, 1), (n, 1)), ((1, m), (n, 1)), ((k, 1), (1, k))] {
                let mut c1 = vec![0.0f32; m * n];
                // SAFETY: as above.
                unsafe { product(isa, m, k, n, &a, ars, &b, brs, &mut c1, 1) };
                for threads in [2, 3] {
                    let mut c2 = vec![1.0f32; m * n];
                    // SAFETY: as above.
                    unsafe { product(isa, m, k, n, &a, ars, &b, brs, &mut c2, threads) };
                    assert!(
                        c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{isa:?} m {m} k {k} n {n} strides {ars:?} {brs:?}: {threads} threads differ"
                    );
                }
            }
        }
    }

    #[test]
    fn a_fused_bias_and_relu_gives_the_separate_pass_bits() {
        for isa in isas() {
            fused_bias_act(isa);
        }
    }

    fn fused_bias_act(isa: Isa) {
        // Partial tiles, more than one block of k, a split by rows and one by column panels,
        // and no k at all.
        for (m, k, n) in [
            (97, 300, 33),
            (200, 13, 512),
            (400, 700, 77),
            (64, 700, 400),
            (5, 0, 3),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bias: Vec<f32> = (0..n).map(|j| (j as f32 * 0.7).sin() * 4.0).collect();
            let (ars, brs) = ((k, 1), (1, k));
            for relu in [false, true] {
                let mut want = vec![0.0f32; m * n];
                // SAFETY: as above.
                unsafe { product(isa, m, k, n, &a, ars, &b, brs, &mut want, 1) };
                for v in want.chunks_exact_mut(n) {
                    for (x, bb) in v.iter_mut().zip(&bias) {
                        let t = *x + bb;
                        *x = if !relu || t > 0.0 { t } else { 0.0 };
                    }
                }
                assert!(
                    !relu || want.contains(&0.0) || k == 0,
                    "the case has no negative sums"
                );
                for threads in [1, 2, 3] {
                    let mut c = vec![f32::NAN; m * n];
                    let then = Some(BiasAct { bias: &bias, relu });
                    // SAFETY: as above; `bias` holds `n` values.
                    unsafe { product_then(isa, m, k, n, &a, ars, &b, brs, &mut c, threads, then) };
                    assert!(
                        c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{isa:?} m {m} k {k} n {n} relu {relu}: {threads} threads differ from the passes"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_k_gives_zeros() {
        for isa in isas() {
            let mut c = vec![f32::NAN; 6];
            // SAFETY: nothing is read with k = 0.
            unsafe { product(isa, 2, 0, 3, &[], (0, 1), &[], (3, 1), &mut c, 1) };
            assert!(c.iter().all(|&x| x == 0.0), "{isa:?}");
        }
    }

    /// What both kernels compute, one scalar at a time: per block of [`KC`] steps a chain
    /// of fused multiply-adds from zero in the order of `k`, added to `C` block after block.
    fn fused_chain(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        (ars, acs): (usize, usize),
        b: &[f32],
        (brs, bcs): (usize, usize),
    ) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut p0 = 0;
                while p0 < k {
                    let mut acc = 0.0f32;
                    for p in p0..(p0 + KC).min(k) {
                        acc = a[i * ars + p * acs].mul_add(b[p * brs + j * bcs], acc);
                    }
                    c[i * n + j] = if p0 == 0 { acc } else { c[i * n + j] + acc };
                    p0 += KC;
                }
            }
        }
        c
    }

    #[test]
    fn both_kernels_give_the_bits_of_one_fused_chain() {
        // Inputs whose products round, partial tiles, several blocks of k, every layout and
        // both splits: equal bits to the scalar chain means equal bits to each other, so a
        // model's digest does not depend on which of the two kernels trained it.
        for isa in isas() {
            for (m, k, n) in [(13, 600, 33), (97, 300, 77), (30, 520, 367), (64, 700, 400)] {
                let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
                let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos() * 1.7).collect();
                for (ars, brs) in [((k, 1), (n, 1)), ((1, m), (n, 1)), ((k, 1), (1, k))] {
                    let want = fused_chain(m, k, n, &a, ars, &b, brs);
                    for threads in [1, 2] {
                        let mut c = vec![f32::NAN; m * n];
                        // SAFETY: as above.
                        unsafe { product(isa, m, k, n, &a, ars, &b, brs, &mut c, threads) };
                        let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{isa:?} m {m} k {k} n {n} strides {ars:?} {brs:?}, {threads} threads"
                        );
                    }
                }
            }
        }
    }
}

//! The pairwise dot interaction, one sample at a time.
//!
//! A sample brings `n = tables + 1` vectors of width `dim`: `z_0` (the bottom MLP's output)
//! and `z_1..z_tables` (the pooled embeddings, table order). The output is `z_0` followed by
//! the dots `z_a . z_b` for every pair `a < b`, in row-major order of the strict upper
//! triangle: `(0,1), (0,2), .., (0,n-1), (1,2), .., (n-2,n-1)`.

/// Lanes of the dot-product accumulator: independent partial sums the compiler can keep in
/// vector registers. The lane split is fixed, so the result does not depend on the machine.
const LANES: usize = 8;

/// `a . b`, summed lane-wise then across lanes in a fixed order.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
    let a4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (a4[0] + a4[2]) + (a4[1] + a4[3])
}

/// `y += g * x`.
#[inline(always)]
fn axpy(g: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += g * x;
    }
}

/// Vectors per sample that the column-wise forward handles (`tables + 1 <= LANES_N`); wider
/// samples take the dot-by-dot path.
const LANES_N: usize = 32;

/// Forward for one sample: `z0` (`dim`), `emb` (`tables x dim`), the interaction into
/// `out[..width]`. Where `out` has at least [`LANES_N`] more floats, the common dims write their
/// rows of dots as fixed-width blocks whose tails land past the row (the next row overwrites
/// them, and past the sample they are scratch for the caller to overwrite): `out[width..]`
/// then holds no meaning. Always inlined, so that it is compiled for the caller's CPU features.
#[inline(always)]
pub(crate) fn forward(dim: usize, z0: &[f32], emb: &[f32], out: &mut [f32]) {
    let n = emb.len() / dim.max(1) + 1;
    // Common dims get a copy with constant trip counts. Up to `LANES_N` vectors, the dots of
    // one vector with all the others are computed together, lane `b` holding `z_a . z_b`
    // summed in dim order (vectorised across `b`); the generic path sums each dot by lanes.
    // Each path is a fixed function of its inputs, so either is reproducible.
    match dim {
        8 if n <= LANES_N => forward_columns::<8>(z0, emb, out),
        16 if n <= LANES_N => forward_columns::<16>(z0, emb, out),
        32 if n <= LANES_N => forward_columns::<32>(z0, emb, out),
        _ => forward_dots(dim, z0, emb, out),
    }
}

#[inline(always)]
fn forward_columns<const D: usize>(z0: &[f32], emb: &[f32], out: &mut [f32]) {
    const HALF: usize = LANES_N / 2;
    let n = emb.len() / D + 1;
    // Room past the sample's `width` floats for a row's fixed-width block: without it every
    // row is copied at its exact length, a call to `memmove` each (1% of a step's cycles).
    let room = out.len() >= D + n * (n - 1) / 2 + LANES_N;
    // zt[d] = (z_0[d], z_1[d], ..): every vector as a column, padded with zeros.
    let mut zt = [[0.0f32; LANES_N]; D];
    for (d, &v) in z0[..D].iter().enumerate() {
        zt[d][0] = v;
    }
    for (b, e) in emb.chunks_exact(D).enumerate() {
        for (d, &v) in e.iter().enumerate() {
            zt[d][b + 1] = v;
        }
    }
    out[..D].copy_from_slice(&z0[..D]);
    // Rows of dots are computed `GROUP` at a time: each lane's sum over the dim is a chain of
    // adds, and interleaving independent rows keeps the adder busy instead of waiting for
    // the chain (the same sums in the same order, so the same bits). Groups start at
    // multiples of `GROUP`, which divides `HALF`: a group lies wholly in one half.
    const GROUP: usize = 4;
    const { assert!(HALF.is_multiple_of(GROUP)) };
    let mut k = D;
    for a0 in (0..n - 1).step_by(GROUP) {
        let rows = (n - 1 - a0).min(GROUP);
        // Rows past the last repeat it; their sums are not stored.
        let at = |r: usize| (a0 + r).min(n - 2);
        if a0 < HALF {
            // Lanes past `LANES_N` stay zero: the source of a fixed-width block's tail.
            let mut acc = [[0.0f32; LANES_N + HALF]; GROUP];
            for row in &zt {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = row[at(r)];
                    for j in 0..LANES_N {
                        acc[j] += x * row[j];
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let a = a0 + r;
                let count = n - a - 1;
                if room {
                    let block: [f32; LANES_N] = acc[a + 1..a + 1 + LANES_N]
                        .try_into()
                        .expect("LANES_N lanes");
                    out[k..k + LANES_N].copy_from_slice(&block);
                } else {
                    out[k..k + count].copy_from_slice(&acc[a + 1..n]);
                }
                k += count;
            }
        } else {
            // Lanes below a + 1 are not needed: only the upper half is computed.
            let mut acc = [[0.0f32; LANES_N]; GROUP];
            for row in &zt {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = row[at(r)];
                    for j in 0..HALF {
                        acc[j] += x * row[HALF + j];
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let a = a0 + r;
                let count = n - a - 1;
                if room {
                    let block: [f32; HALF] =
                        acc[a + 1 - HALF..a + 1].try_into().expect("HALF lanes");
                    out[k..k + HALF].copy_from_slice(&block);
                } else {
                    out[k..k + count].copy_from_slice(&acc[a + 1 - HALF..n - HALF]);
                }
                k += count;
            }
        }
    }
}

#[inline(always)]
fn forward_dots(dim: usize, z0: &[f32], emb: &[f32], out: &mut [f32]) {
    let n = emb.len() / dim + 1;
    let z = |a: usize| -> &[f32] {
        if a == 0 {
            z0
        } else {
            &emb[(a - 1) * dim..a * dim]
        }
    };
    out[..dim].copy_from_slice(z0);
    let mut k = dim;
    for a in 0..n {
        let za = z(a);
        for b in a + 1..n {
            out[k] = dot(za, z(b));
            k += 1;
        }
    }
}

/// Backward for one sample: given the output gradient `g` (interaction width), write the
/// gradients of `z0` into `dz0` and of the embeddings into `demb` (both overwritten).
///
/// Vector `a`'s gradient is `sum over b != a of g(a, b) * z_b`, added in ascending `b` (for
/// `z0`, onto its own copy's gradient `g[..dim]`), accumulated in registers and stored once.
/// Always inlined, so that it is compiled for the caller's CPU features.
#[inline(always)]
pub(crate) fn backward(
    dim: usize,
    z0: &[f32],
    emb: &[f32],
    g: &[f32],
    dz0: &mut [f32],
    demb: &mut [f32],
) {
    let n = emb.len() / dim.max(1) + 1;
    match dim {
        8 if n <= LANES_N => backward_rows::<8>(z0, emb, g, dz0, demb),
        16 if n <= LANES_N => backward_rows::<16>(z0, emb, g, dz0, demb),
        32 if n <= LANES_N => backward_rows::<32>(z0, emb, g, dz0, demb),
        _ => backward_generic(dim, z0, emb, g, dz0, demb),
    }
}

/// Index in `g` of pair `(lo, hi)`, `lo < hi`, of `n` vectors after the `dim` copied values:
/// pairs are listed row by row of the strict upper triangle.
#[inline(always)]
fn pair_index(dim: usize, n: usize, lo: usize, hi: usize) -> usize {
    dim + lo * (2 * n - lo - 1) / 2 + (hi - lo - 1)
}

#[inline(always)]
fn backward_rows<const D: usize>(
    z0: &[f32],
    emb: &[f32],
    g: &[f32],
    dz0: &mut [f32],
    demb: &mut [f32],
) {
    let n = emb.len() / D + 1;
    let z = |b: usize| -> &[f32; D] {
        let s = if b == 0 {
            &z0[..D]
        } else {
            &emb[(b - 1) * D..b * D]
        };
        s.try_into().expect("D values")
    };
    // Pair (lo, hi), lo < hi, is at g[row[lo] + hi].
    let mut row = [0usize; LANES_N];
    for (lo, r) in row.iter_mut().enumerate().take(n) {
        *r = pair_index(D, n, lo, lo + 1) - (lo + 1);
    }
    let add = |acc: &mut [f32; D], gp: f32, zb: &[f32; D]| {
        for j in 0..D {
            acc[j] += gp * zb[j];
        }
    };
    for a in 0..n {
        let mut acc = [0.0f32; D];
        if a == 0 {
            acc.copy_from_slice(&g[..D]);
        }
        for b in 0..a {
            add(&mut acc, g[row[b] + a], z(b));
        }
        for b in a + 1..n {
            add(&mut acc, g[row[a] + b], z(b));
        }
        let dst = if a == 0 {
            &mut dz0[..D]
        } else {
            &mut demb[(a - 1) * D..a * D]
        };
        dst.copy_from_slice(&acc);
    }
}

#[inline(always)]
fn backward_generic(
    dim: usize,
    z0: &[f32],
    emb: &[f32],
    g: &[f32],
    dz0: &mut [f32],
    demb: &mut [f32],
) {
    let n = emb.len() / dim + 1;
    dz0.copy_from_slice(&g[..dim]);
    demb.fill(0.0);
    let mut k = dim;
    // Pairs (0, b): z0 against every embedding.
    for b in 1..n {
        let gp = g[k];
        k += 1;
        let zb = &emb[(b - 1) * dim..b * dim];
        axpy(gp, zb, dz0);
        axpy(gp, z0, &mut demb[(b - 1) * dim..b * dim]);
    }
    // Pairs (a, b) with 1 <= a < b: both sides are embeddings of the same sample. Each
    // gradient receives its terms in ascending partner order, as `backward_rows` adds them.
    for a in 1..n {
        for b in a + 1..n {
            let gp = g[k];
            k += 1;
            let (lo, hi) = demb.split_at_mut((b - 1) * dim);
            let da = &mut lo[(a - 1) * dim..a * dim];
            let db = &mut hi[..dim];
            axpy(gp, &emb[(b - 1) * dim..b * dim], da);
            axpy(gp, &emb[(a - 1) * dim..a * dim], db);
        }
    }
    debug_assert_eq!(k, g.len());
}

/// The interaction at `dim` 16 with AVX-512F, one vector a register: the column-wise forward
/// and the register-accumulated backward with explicit vectors, rows of dots written by masked
/// stores (no copy of a row at its length) and `GROUP` independent sums interleaved (each is
/// a chain of adds that would otherwise wait on the adder's latency). Every value is the same
/// chain of multiplies and adds, in the same order, as [`forward`] and [`backward`] compute
/// it, so the same bits (the tests compare them).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::{pair_index, LANES_N};

    /// Rows computed together.
    const GROUP: usize = 4;

    /// Whether these kernels serve `dim` with `n` vectors a sample on this CPU.
    pub(crate) fn serves(dim: usize, n: usize) -> bool {
        dim == 16 && (1..=LANES_N).contains(&n) && std::arch::is_x86_feature_detected!("avx512f")
    }

    /// Lanes `from..to` (`0 <= from <= to <= 16`) as a write mask.
    #[inline(always)]
    fn lanes(from: usize, to: usize) -> u16 {
        ((1u32 << to) - (1u32 << from)) as u16
    }

    /// Permutation indices of stage `bit` of [`transpose`]: lanes of the row whose index has
    /// `bit` clear (`keep_clear`) or set.
    #[inline(always)]
    unsafe fn stage_indices(bit: usize, keep_clear: bool) -> __m512i {
        let mut idx = [0i32; 16];
        for (d, x) in idx.iter_mut().enumerate() {
            let own = (d & bit == 0) == keep_clear;
            // Lanes 16.. of `permutex2var`'s index pick from the second (partner) row.
            *x = match (own, keep_clear) {
                (true, true) => d,
                (false, true) => 16 + (d ^ bit),
                (true, false) => 16 + d,
                (false, false) => d ^ bit,
            } as i32;
        }
        _mm512_loadu_si512(idx.as_ptr().cast())
    }

    /// Transposes the 16x16 matrix whose rows are `r` in registers: afterwards lane `b` of
    /// `r[d]` is what lane `d` of `r[b]` was. Four stages, each swapping one bit of the row
    /// index with the same bit of the lane index (rows `i` and `i | bit` trade the lanes in
    /// which they differ), 64 two-source permutes in all.
    #[inline(always)]
    unsafe fn transpose(r: &mut [__m512; 16]) {
        for bit in [1usize, 2, 4, 8] {
            let (lo_idx, hi_idx) = (stage_indices(bit, true), stage_indices(bit, false));
            for i in (0..16).filter(|i| i & bit == 0) {
                let (a, b) = (r[i], r[i | bit]);
                r[i] = _mm512_permutex2var_ps(a, lo_idx, b);
                r[i | bit] = _mm512_permutex2var_ps(a, hi_idx, b);
            }
        }
    }

    /// Where vector `b` of a sample starts: `z0` for 0, then the pooled embeddings.
    #[inline(always)]
    fn vector_ptrs(z0: &[f32], emb: &[f32], n: usize) -> [*const f32; LANES_N] {
        let mut p = [z0.as_ptr(); LANES_N];
        for (pb, e) in p[1..n].iter_mut().zip(emb.chunks_exact(16)) {
            *pb = e.as_ptr();
        }
        p
    }

    /// [`super::forward`] at `dim` 16: `out[..16 + n (n - 1) / 2]` written, nothing past it.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `z0` holds 16 values, `emb` `16 (n - 1)` with `n <= LANES_N`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn forward(z0: &[f32], emb: &[f32], out: &mut [f32]) {
        const D: usize = 16;
        let n = emb.len() / D + 1;
        let width = D + n * (n - 1) / 2;
        assert!(n <= LANES_N && z0.len() >= D && out.len() >= width);
        let vp = vector_ptrs(z0, emb, n);
        // zt[h][d] = (z_16h[d], z_16h+1[d], ..): the vectors as columns, transposed in
        // registers, zeros past the last vector.
        let mut zt = [[_mm512_setzero_ps(); D]; 2];
        for (h, half) in zt.iter_mut().enumerate() {
            for (j, r) in half.iter_mut().enumerate() {
                let b = 16 * h + j;
                if b < n {
                    *r = _mm512_loadu_ps(vp[b]);
                }
            }
            if 16 * h < n {
                transpose(half);
            }
        }
        out[..D].copy_from_slice(&z0[..D]);
        let base = out.as_mut_ptr();
        let mut k = D;
        let mut a0 = 0;
        while a0 + 1 < n {
            let rows = (n - 1 - a0).min(GROUP);
            // Lanes below 16 are needed by the rows whose partners start there.
            let low = a0 + 1 < D;
            // Rows past the last repeat it; their sums are not stored.
            let row: [*const f32; GROUP] = std::array::from_fn(|r| vp[(a0 + r).min(n - 1)]);
            let mut lo = [_mm512_setzero_ps(); GROUP];
            let mut hi = [_mm512_setzero_ps(); GROUP];
            for (d, (&rlo, &rhi)) in zt[0].iter().zip(&zt[1]).enumerate() {
                for r in 0..GROUP {
                    let x = _mm512_set1_ps(*row[r].add(d));
                    if low {
                        lo[r] = _mm512_add_ps(lo[r], _mm512_mul_ps(x, rlo));
                    }
                    hi[r] = _mm512_add_ps(hi[r], _mm512_mul_ps(x, rhi));
                }
            }
            for r in 0..rows {
                let a = a0 + r;
                // Lane `b` of row `a` goes to out[k + b - (a + 1)], for b in a + 1..n.
                let row = base.wrapping_add(k).wrapping_sub(a + 1);
                if a + 1 < 16 {
                    _mm512_mask_storeu_ps(row, lanes(a + 1, n.min(16)), lo[r]);
                }
                if n > 16 {
                    let from = (a + 1).max(16) - 16;
                    _mm512_mask_storeu_ps(row.wrapping_add(16), lanes(from, n - 16), hi[r]);
                }
                k += n - a - 1;
            }
            a0 += rows;
        }
    }

    /// [`super::backward`] at `dim` 16.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `z0` and `dz0` hold 16 values, `emb` and `demb` `16 (n - 1)` with
    /// `n <= LANES_N`, `g` the interaction's width.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn backward(
        z0: &[f32],
        emb: &[f32],
        g: &[f32],
        dz0: &mut [f32],
        demb: &mut [f32],
    ) {
        const D: usize = 16;
        let n = emb.len() / D + 1;
        assert!(
            n <= LANES_N
                && z0.len() >= D
                && dz0.len() >= D
                && demb.len() >= emb.len()
                && g.len() >= D + n * (n - 1) / 2
        );
        let mut v = [_mm512_setzero_ps(); LANES_N];
        v[0] = _mm512_loadu_ps(z0.as_ptr());
        for (vb, e) in v[1..n].iter_mut().zip(emb.chunks_exact(D)) {
            *vb = _mm512_loadu_ps(e.as_ptr());
        }
        // Pair (lo, hi), lo < hi, is at g[row[lo] + hi].
        let mut row = [0usize; LANES_N];
        for (lo, r) in row.iter_mut().enumerate().take(n) {
            *r = pair_index(D, n, lo, lo + 1) - (lo + 1);
        }
        let mut a0 = 0;
        while a0 < n {
            let rows = (n - a0).min(GROUP);
            let mut acc = [_mm512_setzero_ps(); GROUP];
            if a0 == 0 {
                acc[0] = _mm512_loadu_ps(g.as_ptr());
            }
            // Step t adds vector a's t-th partner: t below a, t + 1 from a on.
            for t in 0..n - 1 {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = (a0 + r).min(n - 1);
                    let (at, b) = if t < a {
                        (row[t] + a, t)
                    } else {
                        (row[a] + t + 1, t + 1)
                    };
                    let gp = _mm512_set1_ps(g[at]);
                    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(gp, v[b]));
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let a = a0 + r;
                let dst = if a == 0 {
                    &mut dz0[..D]
                } else {
                    &mut demb[(a - 1) * D..a * D]
                };
                _mm512_storeu_ps(dst.as_mut_ptr(), *acc);
            }
            a0 += rows;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum_for_every_length() {
        for len in 0..40 {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.3).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.7).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-5, "length {len}");
        }
    }

    #[test]
    fn forward_lists_bottom_then_upper_triangle_dots() {
        // dim 2, two tables: z0 = (1, 2), z1 = (3, 4), z2 = (5, 6).
        let mut out = [0.0; 5];
        forward(2, &[1.0, 2.0], &[3.0, 4.0, 5.0, 6.0], &mut out);
        assert_eq!(out, [1.0, 2.0, 11.0, 17.0, 39.0]);
    }

    /// The column-wise forward and the register-accumulated backward against the dot-by-dot
    /// and axpy paths: the forward within rounding (it sums each dot in another order), the
    /// backward bit for bit (it adds the same terms in the same order).
    #[test]
    fn fast_paths_match_the_generic_ones() {
        for (dim, tables) in [
            (8, 3),
            (16, 26),
            (16, 15),
            (16, 16),
            (16, 31),
            (16, 1),
            (16, 3),
            (32, 31),
            (8, 1),
        ] {
            let n = tables + 1;
            let iw = dim + n * (n - 1) / 2;
            let f = |seed: f32, len: usize| -> Vec<f32> {
                (0..len).map(|i| (i as f32 * seed).sin()).collect()
            };
            let (z0, emb, g) = (f(0.37, dim), f(0.11, tables * dim), f(0.23, iw));
            let (mut fast, mut slow) = (vec![0.0; iw], vec![0.0; iw]);
            forward(dim, &z0, &emb, &mut fast);
            forward_dots(dim, &z0, &emb, &mut slow);
            // With room past the sample, rows are written as fixed-width blocks: the same
            // values in the sample's width.
            let mut roomy = vec![5.0; iw + LANES_N];
            forward(dim, &z0, &emb, &mut roomy);
            assert_eq!(
                roomy[..iw].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                fast.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "dim {dim}, {tables} tables: blocks against exact rows"
            );
            for (i, (x, y)) in fast.iter().zip(&slow).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "dim {dim} out {i}"
                );
            }
            let (mut dz_f, mut de_f) = (vec![9.0; dim], vec![9.0; tables * dim]);
            let (mut dz_s, mut de_s) = (vec![7.0; dim], vec![7.0; tables * dim]);
            backward(dim, &z0, &emb, &g, &mut dz_f, &mut de_f);
            backward_generic(dim, &z0, &emb, &g, &mut dz_s, &mut de_s);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            #[cfg(target_arch = "x86_64")]
            if avx512::serves(dim, n) {
                // SAFETY: `serves` checked the CPU and the shape.
                let mut vec_out = vec![3.0; iw + 7];
                unsafe { avx512::forward(&z0, &emb, &mut vec_out) };
                assert_eq!(
                    bits(&vec_out[..iw]),
                    bits(&fast),
                    "dim {dim}, {tables}: forward"
                );
                assert!(
                    vec_out[iw..].iter().all(|&x| x == 3.0),
                    "written past the width"
                );
                let (mut dz_v, mut de_v) = (vec![1.0; dim], vec![1.0; tables * dim]);
                unsafe { avx512::backward(&z0, &emb, &g, &mut dz_v, &mut de_v) };
                assert_eq!(bits(&dz_v), bits(&dz_s), "dim {dim}, {tables} tables: dz0");
                assert_eq!(bits(&de_v), bits(&de_s), "dim {dim}, {tables} tables: demb");
            }
            assert_eq!(bits(&dz_f), bits(&dz_s), "dim {dim}, {tables} tables: dz0");
            assert_eq!(bits(&de_f), bits(&de_s), "dim {dim}, {tables} tables: demb");
        }
    }

    #[test]
    fn backward_hand_computed() {
        let (z0, emb) = ([1.0, 2.0], [3.0, 4.0, 5.0, 6.0]);
        // Gradient only on the (1,2) dot and on z0's copy.
        let g = [0.5, -1.0, 0.0, 0.0, 2.0];
        let (mut dz0, mut demb) = ([9.0; 2], [9.0; 4]);
        backward(2, &z0, &emb, &g, &mut dz0, &mut demb);
        assert_eq!(dz0, [0.5, -1.0]);
        assert_eq!(demb, [10.0, 12.0, 6.0, 8.0]);
    }
}

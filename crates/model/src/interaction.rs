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

/// Forward for one sample: `z0` (`dim`), `emb` (`tables x dim`), `out` (interaction width).
#[inline]
pub(crate) fn forward(dim: usize, z0: &[f32], emb: &[f32], out: &mut [f32]) {
    // Common dims get a copy of the loop with a constant trip count (fully unrolled dots);
    // the arithmetic is the same as the generic path's, so the results are too.
    match dim {
        8 => forward_impl(8, z0, emb, out),
        16 => forward_impl(16, z0, emb, out),
        32 => forward_impl(32, z0, emb, out),
        _ => forward_impl(dim, z0, emb, out),
    }
}

#[inline(always)]
fn forward_impl(dim: usize, z0: &[f32], emb: &[f32], out: &mut [f32]) {
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
/// Contributions are added in pair order, so the result is reproducible.
#[inline]
pub(crate) fn backward(
    dim: usize,
    z0: &[f32],
    emb: &[f32],
    g: &[f32],
    dz0: &mut [f32],
    demb: &mut [f32],
) {
    match dim {
        8 => backward_impl(8, z0, emb, g, dz0, demb),
        16 => backward_impl(16, z0, emb, g, dz0, demb),
        32 => backward_impl(32, z0, emb, g, dz0, demb),
        _ => backward_impl(dim, z0, emb, g, dz0, demb),
    }
}

#[inline(always)]
fn backward_impl(
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
    // Pairs (a, b) with 1 <= a < b: both sides are embeddings of the same sample.
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

//! GF(2^8) arithmetic for the exact code: byte views of rows, slice kernels, small matrices.
//!
//! Scalar and slice products both come from `reed-solomon-erasure`'s `galois_8` so that the
//! coefficients chosen here and the SIMD kernels that apply them live in the same field.

use reed_solomon_erasure::galois_8;

/// The bytes of a row of 32-bit words, in the machine's byte order (little-endian on every
/// target we build for). Coding works on this image, so rows come back bit for bit.
#[inline]
pub(crate) fn bytes(words: &[f32]) -> &[u8] {
    bytemuck::cast_slice(words)
}

#[inline]
pub(crate) fn bytes_mut(words: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(words)
}

/// `dst ^= src`.
#[inline]
pub(crate) fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    // Eight bytes at a time: rows are short (tens of words), so the byte loop's per-element
    // overhead, not memory, was the cost of applying a delta.
    let mut d8 = dst.chunks_exact_mut(8);
    let mut s8 = src.chunks_exact(8);
    for (d, s) in d8.by_ref().zip(s8.by_ref()) {
        let x = u64::from_ne_bytes(d[..8].try_into().expect("8-byte chunk"))
            ^ u64::from_ne_bytes(s[..8].try_into().expect("8-byte chunk"));
        d.copy_from_slice(&x.to_ne_bytes());
    }
    for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d ^= *s;
    }
}

/// `dst ^= c * src`; lengths must match (checked by callers, which return errors).
#[inline]
pub(crate) fn mul_xor_into(c: u8, src: &[u8], dst: &mut [u8]) {
    match c {
        0 => {}
        1 => xor_into(dst, src),
        // The SIMD kernel indexes element 0, so an empty row must not reach it.
        _ if src.is_empty() => {}
        _ => galois_8::mul_slice_xor(c, src, dst),
    }
}

#[inline]
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    galois_8::mul(a, b)
}

/// `a / b` for `b != 0`.
#[inline]
pub(crate) fn div(a: u8, b: u8) -> u8 {
    debug_assert_ne!(b, 0);
    galois_8::div(a, b)
}

/// The `r x k` parity matrix `P` of the systematic code `[I; P]`.
///
/// A Cauchy matrix `C[j][i] = 1 / (x_j + y_i)` with distinct `x_0..x_{r-1}, y_0..y_{k-1}` has
/// every square submatrix nonsingular, and that is exactly the condition for every `k x k`
/// submatrix of `[I; P]` to be invertible (a square submatrix of `[I; P]` is, after deleting
/// the identity rows, a square minor of `P`). Scaling rows and columns of `P` by nonzero
/// constants keeps every minor nonsingular, so the matrix is normalised to have a first row
/// and a first column of ones: with one parity the code is then plain XOR, and the first
/// parity and the first data row need no multiplications at all.
pub(crate) fn cauchy_parity_matrix(k: usize, r: usize) -> Vec<Vec<u8>> {
    debug_assert!(k >= 1 && r >= 1 && k + r <= 256);
    let x = |j: usize| j as u8;
    let y = |i: usize| (r + i) as u8;
    let mut p: Vec<Vec<u8>> = (0..r)
        .map(|j| (0..k).map(|i| div(1, x(j) ^ y(i))).collect())
        .collect();
    for i in 0..k {
        let s = p[0][i];
        for row in p.iter_mut() {
            row[i] = div(row[i], s);
        }
    }
    for row in p.iter_mut() {
        let s = row[0];
        for v in row.iter_mut() {
            *v = div(*v, s);
        }
    }
    p
}

/// Inverse of a square matrix over GF(2^8) by Gauss–Jordan elimination, or `None` if singular.
pub(crate) fn invert(m: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    let n = m.len();
    let mut a: Vec<Vec<u8>> = m.to_vec();
    let mut inv: Vec<Vec<u8>> = (0..n)
        .map(|i| (0..n).map(|j| u8::from(i == j)).collect())
        .collect();
    for col in 0..n {
        let pivot = (col..n).find(|&row| a[row][col] != 0)?;
        a.swap(col, pivot);
        inv.swap(col, pivot);
        let scale = div(1, a[col][col]);
        for j in 0..n {
            a[col][j] = mul(a[col][j], scale);
            inv[col][j] = mul(inv[col][j], scale);
        }
        for row in 0..n {
            let f = a[row][col];
            if row == col || f == 0 {
                continue;
            }
            for j in 0..n {
                a[row][j] ^= mul(f, a[col][j]);
                inv[row][j] ^= mul(f, inv[col][j]);
            }
        }
    }
    Some(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `size x size` minor of `p`, for every size.
    fn all_minors_nonsingular(p: &[Vec<u8>]) -> bool {
        let r = p.len();
        let k = p[0].len();
        for size in 1..=r.min(k) {
            for rows in subsets(r, size) {
                for cols in subsets(k, size) {
                    let m: Vec<Vec<u8>> = rows
                        .iter()
                        .map(|&j| cols.iter().map(|&i| p[j][i]).collect())
                        .collect();
                    if invert(&m).is_none() {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn subsets(n: usize, size: usize) -> Vec<Vec<usize>> {
        (0u32..1 << n)
            .filter(|m| m.count_ones() as usize == size)
            .map(|m| (0..n).filter(|i| m >> i & 1 == 1).collect())
            .collect()
    }

    #[test]
    fn cauchy_matrix_is_mds_and_normalised() {
        for k in 1..=8 {
            for r in 1..=4 {
                let p = cauchy_parity_matrix(k, r);
                assert!(p[0].iter().all(|&c| c == 1), "first row k={k} r={r}");
                assert!(p.iter().all(|row| row[0] == 1), "first column k={k} r={r}");
                assert!(all_minors_nonsingular(&p), "singular minor k={k} r={r}");
            }
        }
    }

    #[test]
    fn inverse_times_matrix_is_identity() {
        let p = cauchy_parity_matrix(4, 4);
        let inv = invert(&p).expect("cauchy is invertible");
        // (p * inv)[i][j] = XOR over t of p[i][t] * inv[t][j].
        let product: Vec<Vec<u8>> = p
            .iter()
            .map(|p_row| {
                p_row
                    .iter()
                    .zip(&inv)
                    .fold(vec![0u8; 4], |mut acc, (&a, inv_row)| {
                        for (x, &b) in acc.iter_mut().zip(inv_row) {
                            *x ^= mul(a, b);
                        }
                        acc
                    })
            })
            .collect();
        let identity: Vec<Vec<u8>> = (0..4)
            .map(|i| (0..4).map(|j| u8::from(i == j)).collect())
            .collect();
        assert_eq!(product, identity);
        assert!(invert(&[vec![1, 2], vec![1, 2]]).is_none());
    }

    #[test]
    fn slice_kernel_matches_scalar_product() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for c in [0u8, 1, 2, 29, 255] {
            let mut dst: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
            let want: Vec<u8> = dst.iter().zip(&src).map(|(d, s)| d ^ mul(c, *s)).collect();
            mul_xor_into(c, &src, &mut dst);
            assert_eq!(dst, want, "c = {c}");
        }
        let mut empty: [u8; 0] = [];
        mul_xor_into(7, &[], &mut empty);
    }

    #[test]
    fn word_wise_xor_matches_byte_xor_at_every_length_and_offset() {
        let src: Vec<u8> = (0..80u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..40 {
            for off in 0..8 {
                let mut dst: Vec<u8> = (0..80u32).map(|i| (i * 5 + 1) as u8).collect();
                let want: Vec<u8> = dst
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        if (off..off + len).contains(&i) {
                            d ^ src[i]
                        } else {
                            *d
                        }
                    })
                    .collect();
                xor_into(&mut dst[off..off + len], &src[off..off + len]);
                assert_eq!(dst, want, "len {len} offset {off}");
            }
        }
    }
}

//! Safe wrappers around `matrixmultiply::sgemm` and the process-wide gemm thread count.
//!
//! All matrices are row-major slices; transposes are expressed through sgemm's strides, never
//! by copying. Each wrapper checks the slice lengths before handing raw pointers to sgemm.
//!
//! # Gemm threads
//! `matrixmultiply` (feature `threading`) reads `MATMUL_NUM_THREADS` once, on its first
//! product in the process, clamps it to `1..=4`, and defaults to the number of physical
//! cores when it is unset. [`set_gemm_threads`] sets that variable and must therefore run
//! before the first forward pass of any model in the process (best: at program start, before
//! other threads exist, since it writes the environment). Afterwards it only succeeds when it
//! asks for the count already in force.
//!
//! Products are bit-identical for every gemm thread count: the backend splits work over
//! threads by whole output tiles, and each tile's dot products are accumulated in the same
//! k order whichever thread runs it (checked by the `gemm_threads` integration test, which runs
//! the same step in child processes with 1, 2 and 4 gemm threads).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::ModelError;

/// The environment variable `matrixmultiply` reads for its thread count.
pub const GEMM_THREADS_ENV: &str = "MATMUL_NUM_THREADS";
/// The most threads the gemm backend uses.
pub const MAX_GEMM_THREADS: usize = 4;

static STARTED: AtomicBool = AtomicBool::new(false);
static SET_LOCK: Mutex<()> = Mutex::new(());

/// Set the number of threads every matrix product of this process will use (capped at
/// [`MAX_GEMM_THREADS`]); returns the count in force. Call it before the first forward pass:
/// once a product has run the count is fixed, and asking for a different one is
/// [`ModelError::GemmThreadsFixed`].
///
/// This writes `MATMUL_NUM_THREADS` into the process environment, so call it while the
/// process is single-threaded (e.g. first thing in `main`).
pub fn set_gemm_threads(threads: usize) -> Result<usize, ModelError> {
    if threads == 0 {
        return Err(ModelError::InvalidThreads(0));
    }
    let want = threads.min(MAX_GEMM_THREADS);
    let _guard = SET_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if STARTED.load(Ordering::Acquire) {
        let current = gemm_threads();
        return if current == want {
            Ok(want)
        } else {
            Err(ModelError::GemmThreadsFixed {
                requested: threads,
                current,
            })
        };
    }
    std::env::set_var(GEMM_THREADS_ENV, want.to_string());
    Ok(want)
}

/// The gemm thread count in force (or that the first product will fix), following the
/// backend's rules: `MATMUL_NUM_THREADS` clamped to `1..=4` (1 if unparsable), else the core
/// count (the backend counts physical cores; this reports logical ones, which only differ on
/// SMT machines).
pub fn gemm_threads() -> usize {
    match std::env::var(GEMM_THREADS_ENV) {
        Ok(s) if !s.is_empty() => s.parse::<usize>().unwrap_or(1).clamp(1, MAX_GEMM_THREADS),
        _ => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_GEMM_THREADS),
    }
}

/// Whether a product has run in this process (after which the thread count is fixed).
pub fn gemm_threads_fixed() -> bool {
    STARTED.load(Ordering::Acquire)
}

#[inline]
fn mark_started() {
    if !STARTED.load(Ordering::Relaxed) {
        // Taking the lock orders the first product after any `set_gemm_threads` in flight.
        let _guard = SET_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        STARTED.store(true, Ordering::Release);
    }
}

/// `C[m x n] = A[m x k] * B[n x k]^T` (a linear layer's forward: `B` is the weight
/// `[out x in]`).
pub(crate) fn a_bt(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
    mark_started();
    // SAFETY: the lengths above cover every element the strides reach; `c` is exclusive.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            1,
            k as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `C[m x n] = A[m x k] * B[k x n]` (a linear layer's input gradient: `A` is the output
/// gradient, `B` the weight `[out x in]`).
pub(crate) fn a_b(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    mark_started();
    // SAFETY: as in `a_bt`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `C[m x n] = A[k x m]^T * B[k x n]` (a linear layer's weight gradient: `A` is the output
/// gradient `[batch x out]`, `B` the input `[batch x in]`).
pub(crate) fn at_b(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= k * m && b.len() >= k * n && c.len() >= m * n);
    mark_started();
    // SAFETY: as in `a_bt`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            1,
            m as isize,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(
        m: usize,
        k: usize,
        n: usize,
        a: impl Fn(usize, usize) -> f32,
        b: impl Fn(usize, usize) -> f32,
    ) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a(i, p) * b(p, j)).sum();
            }
        }
        c
    }

    fn close(x: &[f32], y: &[f32]) {
        assert_eq!(x.len(), y.len());
        for (i, (a, b)) in x.iter().zip(y).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "element {i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn strided_products_match_naive_loops() {
        let (m, k, n) = (7, 5, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c = vec![f32::NAN; m * n];
        a_bt(m, k, n, &a, &bt, &mut c);
        close(
            &c,
            &naive(m, k, n, |i, p| a[i * k + p], |p, j| bt[j * k + p]),
        );

        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.23).cos()).collect();
        a_b(m, k, n, &a, &b, &mut c);
        close(
            &c,
            &naive(m, k, n, |i, p| a[i * k + p], |p, j| b[p * n + j]),
        );

        // A is [k x m] here: reuse `a` as a 5x7 matrix.
        at_b(m, k, n, &a, &b, &mut c);
        close(
            &c,
            &naive(m, k, n, |i, p| a[p * m + i], |p, j| b[p * n + j]),
        );
    }

    #[test]
    fn zero_threads_is_rejected() {
        assert!(matches!(
            set_gemm_threads(0),
            Err(ModelError::InvalidThreads(0))
        ));
    }
}

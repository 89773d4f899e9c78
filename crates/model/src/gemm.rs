//! Safe wrappers around the matrix-product backend and the process-wide gemm thread count.
//!
//! All matrices are row-major slices; transposes are expressed through strides, never by
//! copying. Each wrapper checks the slice lengths before handing raw pointers to the backend.
//!
//! # Backends
//! On a CPU with AVX-512F the default is ftrec's own packed product with an AVX-512 micro-kernel
//! (`crates/model/src/packed.rs`): neither crate below has an AVX-512 `f32` kernel on a stable compiler,
//! and on a CPU with two 512-bit FMA units that is half its peak (`docs/BENCHMARKS.md`, "The
//! trainer against PyTorch"). Elsewhere the default is the `gemm` crate (the faer project's),
//! which picks AVX2 with FMA at run time and does not pack the operands of the small products
//! of the DLRM's narrow layers. `FTREC_GEMM` selects one by name: `avx512` (refused on a CPU
//! without AVX-512F), `avx2` (the packed product with an AVX2 micro-kernel that gives the
//! `avx512` bits, so a model trained on a CPU without AVX-512 has the digest of one trained
//! with it; refused without AVX2 and FMA; on an AVX2 CPU about 10% slower than `gemm` on the
//! DLRM's MLP, hence not the default there), `gemm`, or `matrixmultiply` (always packing, AVX2
//! kernels). The backend is read once, at the first product or at [`set_gemm_threads`], which
//! refuses a name it does not know.
//!
//! # Gemm threads
//! The thread count is `MATMUL_NUM_THREADS` (the variable `matrixmultiply` reads), fixed at the
//! first product in the process, clamped to `1..=4`, and the core count when it is unset.
//! [`set_gemm_threads`] sets that variable and must therefore run before the first forward pass
//! of any model in the process (best: at program start, before other threads exist, since it
//! writes the environment). Afterwards it only succeeds when it asks for the count already in
//! force. The `gemm` backend runs its threads on rayon's global pool.
//!
//! Products are bit-identical for every gemm thread count, with every backend: each splits work
//! over threads by whole output tiles and accumulate each tile's dot products in the same k
//! order (blocks of k chosen from the shape, not the thread count) whichever thread runs it
//! (checked by the `gemm_threads` integration test, which runs the same step in child processes
//! with 1, 2 and 4 gemm threads). The backends do not give the same bits as each other: a
//! digest depends on the backend, as it depends on the CPU's kernels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::ModelError;

/// The environment variable `matrixmultiply` reads for its thread count (both backends use it).
pub const GEMM_THREADS_ENV: &str = "MATMUL_NUM_THREADS";
/// The environment variable that selects the backend: `avx512` (the default where the CPU has
/// AVX-512F), `avx2` (the same bits with AVX2 and FMA), `gemm` (the default elsewhere) or
/// `matrixmultiply`.
pub const GEMM_BACKEND_ENV: &str = "FTREC_GEMM";
/// The most threads the gemm backend uses.
pub const MAX_GEMM_THREADS: usize = 4;

static STARTED: AtomicBool = AtomicBool::new(false);
static ALL_IN_POOL: AtomicBool = AtomicBool::new(false);
static SET_LOCK: Mutex<()> = Mutex::new(());
/// Backend and thread count, fixed at the first product.
static FIXED: OnceLock<(Backend, usize)> = OnceLock::new();

/// A matrix-product implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// ftrec's packed product with an AVX-512F micro-kernel (`crates/model/src/packed.rs`).
    Avx512,
    /// ftrec's packed product with an AVX2 and FMA micro-kernel: the same bits as
    /// [`Backend::Avx512`] (`crates/model/src/packed.rs`).
    Avx2,
    /// The `gemm` crate (AVX2 with FMA where the CPU has it, picked at run time).
    Gemm,
    /// `matrixmultiply::sgemm`.
    MatrixMultiply,
}

impl Backend {
    /// Every backend, in the order `FTREC_GEMM`'s documentation names them.
    pub const ALL: [Backend; 4] = [
        Backend::Avx512,
        Backend::Avx2,
        Backend::Gemm,
        Backend::MatrixMultiply,
    ];

    /// The default on this CPU: [`Backend::Avx512`] where it has AVX-512F, else
    /// [`Backend::Gemm`].
    pub fn default_for_cpu() -> Backend {
        if Backend::Avx512.runs_here() {
            Backend::Avx512
        } else {
            Backend::Gemm
        }
    }

    /// Whether this CPU runs the backend: the packed ones need their instruction sets
    /// (AVX-512F; AVX2 and FMA), the crates run everywhere.
    pub fn runs_here(self) -> bool {
        self.isa().is_none_or(|isa| isa.available())
    }

    /// The backend `FTREC_GEMM` names (unset or empty: [`Backend::default_for_cpu`]).
    pub fn from_env() -> Result<Backend, ModelError> {
        let name = match std::env::var(GEMM_BACKEND_ENV) {
            Ok(s) if s.is_empty() => return Ok(Backend::default_for_cpu()),
            Ok(s) => s,
            Err(std::env::VarError::NotPresent) => return Ok(Backend::default_for_cpu()),
            Err(std::env::VarError::NotUnicode(s)) => {
                return Err(ModelError::UnknownGemmBackend(
                    s.to_string_lossy().into_owned(),
                ))
            }
        };
        let Some(backend) = Backend::ALL.into_iter().find(|b| b.name() == name) else {
            return Err(ModelError::UnknownGemmBackend(name));
        };
        match backend.isa() {
            Some(isa) if !isa.available() => Err(ModelError::GemmBackendUnsupported {
                name: backend.name(),
                needs: isa.needs(),
            }),
            _ => Ok(backend),
        }
    }

    /// The micro-kernel of a packed backend.
    pub(crate) fn isa(self) -> Option<crate::packed::Isa> {
        match self {
            Backend::Avx512 => Some(crate::packed::Isa::Avx512),
            Backend::Avx2 => Some(crate::packed::Isa::Avx2),
            Backend::Gemm | Backend::MatrixMultiply => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Avx512 => "avx512",
            Backend::Avx2 => "avx2",
            Backend::Gemm => "gemm",
            Backend::MatrixMultiply => "matrixmultiply",
        }
    }
}

/// Set the number of threads every matrix product of this process will use (capped at
/// [`MAX_GEMM_THREADS`]); returns the count in force. Call it before the first forward pass:
/// once a product has run the count is fixed, and asking for a different one is
/// [`ModelError::GemmThreadsFixed`]. Also checks `FTREC_GEMM` ([`Backend::from_env`]).
///
/// This writes `MATMUL_NUM_THREADS` into the process environment, so call it while the
/// process is single-threaded (e.g. first thing in `main`).
pub fn set_gemm_threads(threads: usize) -> Result<usize, ModelError> {
    set_threads(threads, None)
}

/// [`set_gemm_threads`] for a process whose calling thread has other work to stay free for (a
/// cluster worker's messages): the math pool gets every thread the products use,
/// [`crate::on_pool`] hands every call to it (one thread too: the caller waits meanwhile), and
/// each pool thread runs `on_start` before anything else (to lower its own scheduling
/// priority, say); it returns once every one has. If the pool was started already, it stays as
/// it was and `on_pool` keeps its usual rule.
pub fn set_gemm_threads_in_pool(
    threads: usize,
    on_start: impl Fn() + Send + Sync + 'static,
) -> Result<usize, ModelError> {
    set_threads(threads, Some(Box::new(on_start)))
}

/// Whether [`set_gemm_threads_in_pool`] built the pool: every [`crate::on_pool`] call runs on
/// it.
pub(crate) fn all_in_pool() -> bool {
    ALL_IN_POOL.load(Ordering::Acquire)
}

type OnStart = Box<dyn Fn() + Send + Sync>;

fn set_threads(threads: usize, in_pool: Option<OnStart>) -> Result<usize, ModelError> {
    if threads == 0 {
        return Err(ModelError::InvalidThreads(0));
    }
    Backend::from_env()?;
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
    // ftrec's own product and the per-sample splits run their first part on the calling
    // thread, so `want - 1` pool threads complete `want`; an idle extra pool thread would only
    // wake, find nothing and yield the core back. The `gemm` crate runs a whole product
    // inside the pool, so it gets `want`, and a training step then runs on the pool itself
    // (`par::on_pool`) rather than as one thread more beside it. The pool exists once per
    // process: if something started it already, it stays as it is.
    // In the pool (`set_gemm_threads_in_pool`) the caller completes nothing, so the pool has
    // them all.
    let pool = match (Backend::from_env()?, &in_pool) {
        (Backend::Gemm, _) | (_, Some(_)) => want,
        _ => want.saturating_sub(1).max(1),
    };
    let all = in_pool.is_some();
    let mut builder = rayon::ThreadPoolBuilder::new()
        .num_threads(pool)
        .thread_name(|i| format!("ftrec-math-{i}"));
    if let Some(on_start) = in_pool {
        builder = builder.start_handler(move |_| on_start());
    }
    if builder.build_global().is_ok() && all {
        // A pool thread runs its start handler before any job: once each ran this one, each
        // ran `on_start`.
        rayon::broadcast(|_| ());
        ALL_IN_POOL.store(true, Ordering::Release);
    }
    Ok(want)
}

/// The gemm thread count in force (or that the first product will fix):
/// `MATMUL_NUM_THREADS` clamped to `1..=4` (1 if unparsable), else the core count (the
/// `matrixmultiply` backend counts physical cores; this reports logical ones, which only differ
/// on SMT machines).
pub fn gemm_threads() -> usize {
    if let Some(&(_, threads)) = FIXED.get() {
        return threads;
    }
    match std::env::var(GEMM_THREADS_ENV) {
        Ok(s) if !s.is_empty() => s.parse::<usize>().unwrap_or(1).clamp(1, MAX_GEMM_THREADS),
        _ => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_GEMM_THREADS),
    }
}

/// The backend in force (or that the first product will fix; an `FTREC_GEMM` that cannot be
/// used falls back to [`Backend::default_for_cpu`] here, and [`set_gemm_threads`] is where it
/// is refused).
pub fn gemm_backend() -> Backend {
    FIXED.get().map_or_else(
        || Backend::from_env().unwrap_or_else(|_| Backend::default_for_cpu()),
        |f| f.0,
    )
}

/// Whether a product has run in this process (after which the thread count is fixed).
pub fn gemm_threads_fixed() -> bool {
    STARTED.load(Ordering::Acquire)
}

#[inline]
fn fixed() -> (Backend, usize) {
    *FIXED.get_or_init(|| {
        // Taking the lock orders the first product after any `set_gemm_threads` in flight.
        let _guard = SET_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        STARTED.store(true, Ordering::Release);
        (gemm_backend(), gemm_threads())
    })
}

/// `C[m x n] = A * B` where element `(i, p)` of `A` is `a[i * a_rs + p * a_cs]` and element
/// `(p, j)` of `B` is `b[p * b_rs + j * b_cs]`; `C` is row-major. The caller checked that the
/// slices cover every element the strides reach.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    c: &mut [f32],
) {
    let (backend, threads) = fixed();
    match backend {
        // SAFETY: a packed backend is only chosen where the CPU runs its kernel; the caller
        // checked the slices.
        Backend::Avx512 | Backend::Avx2 => {
            let isa = backend.isa().expect("a packed backend");
            crate::packed::product(isa, m, k, n, a, (a_rs, a_cs), b, (b_rs, b_cs), c, threads)
        }
        Backend::Gemm => gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            },
        ),
        Backend::MatrixMultiply => matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            a_rs as isize,
            a_cs as isize,
            b.as_ptr(),
            b_rs as isize,
            b_cs as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        ),
    }
}

/// `C[m x n] = A[m x k] * B[n x k]^T` (a linear layer's forward: `B` is the weight
/// `[out x in]`).
pub(crate) fn a_bt(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
    // SAFETY: the lengths above cover every element the strides reach; `c` is exclusive.
    unsafe { product(m, k, n, a, (k, 1), b, (1, k), c) }
}

/// [`a_bt`], then `C[i][j] = act(C[i][j] + bias[j])` (ReLU if `relu`) fused into the product
/// where the backend can (the packed ones: each block of rows while it is in cache); returns
/// whether it did, so the caller runs the separate pass otherwise. The same bits either way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn a_bt_bias_act(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    bias: &[f32],
    relu: bool,
) -> bool {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n && bias.len() >= n);
    let (backend, threads) = fixed();
    let Some(isa) = backend.isa() else {
        a_bt(m, k, n, a, b, c);
        return false;
    };
    let then = crate::packed::BiasAct { bias, relu };
    // SAFETY: a packed backend is only chosen where the CPU runs its kernel; the lengths
    // above cover every element the strides reach; `c` is exclusive.
    unsafe {
        crate::packed::product_then(isa, m, k, n, a, (k, 1), b, (1, k), c, threads, Some(then));
    }
    true
}

/// `C[m x n] = A[m x k] * B[k x n]` (a linear layer's input gradient: `A` is the output
/// gradient, `B` the weight `[out x in]`).
pub(crate) fn a_b(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: as in `a_bt`.
    unsafe { product(m, k, n, a, (k, 1), b, (n, 1), c) }
}

/// `C[m x n] = A[k x m]^T * B[k x n]` (a linear layer's weight gradient: `A` is the output
/// gradient `[batch x out]`, `B` the input `[batch x in]`).
pub(crate) fn at_b(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= k * m && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: as in `a_bt`.
    unsafe { product(m, k, n, a, (1, m), b, (n, 1), c) }
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
    fn an_unknown_backend_is_named() {
        let e = ModelError::UnknownGemmBackend("mkl".into()).to_string();
        assert!(
            e.contains("FTREC_GEMM=mkl") && e.contains("matrixmultiply"),
            "{e}"
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

//! Splitting per-sample work over threads.
//!
//! Every split here is by contiguous ranges of independent units (samples, or fixed blocks of
//! samples), and each unit's arithmetic is the same whichever thread runs it, so results are
//! bit-identical for every thread count. The parts run on rayon's global pool (the threads the
//! `gemm` backend's products use), the first on the calling thread; work too small to pay for
//! handing it to another thread runs inline.

/// Elements of work (roughly: floats touched) below which another thread is not worth using.
pub(crate) const MIN_WORK_PER_THREAD: usize = 24 * 1024;

/// Units per part when `units` units of `unit_cost` work each are split over up to `threads`
/// threads (`units` itself when the work stays on the calling thread).
fn units_per_part(threads: usize, units: usize, unit_cost: usize) -> usize {
    let by_work = (units.saturating_mul(unit_cost) / MIN_WORK_PER_THREAD).max(1);
    let parts = threads.min(by_work).min(units).max(1);
    units.div_ceil(parts).max(1)
}

/// Run `f(first_unit, chunk)` over `a` cut into chunks of whole units (`a_unit` floats each).
pub(crate) fn split1<F>(
    threads: usize,
    units: usize,
    unit_cost: usize,
    a: &mut [f32],
    a_unit: usize,
    f: F,
) where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let per = units_per_part(threads, units, unit_cost);
    if per >= units {
        f(0, a);
        return;
    }
    rayon::in_place_scope(|s| {
        let mut chunks = a.chunks_mut(per * a_unit).enumerate();
        let head = chunks.next();
        for (i, chunk) in chunks {
            let f = &f;
            s.spawn(move |_| f(i * per, chunk));
        }
        if let Some((_, chunk)) = head {
            f(0, chunk);
        }
    });
}

/// [`split1`] over two outputs cut at the same unit boundaries (`a_unit` and `b_unit` floats
/// per unit; the last unit of `a` may be short).
#[allow(clippy::too_many_arguments)]
pub(crate) fn split2<F>(
    threads: usize,
    units: usize,
    unit_cost: usize,
    a: &mut [f32],
    a_unit: usize,
    b: &mut [f32],
    b_unit: usize,
    f: F,
) where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync,
{
    let per = units_per_part(threads, units, unit_cost);
    if per >= units {
        f(0, a, b);
        return;
    }
    rayon::in_place_scope(|s| {
        let mut chunks = a
            .chunks_mut(per * a_unit)
            .zip(b.chunks_mut(per * b_unit))
            .enumerate();
        let head = chunks.next();
        for (i, (ca, cb)) in chunks {
            let f = &f;
            s.spawn(move |_| f(i * per, ca, cb));
        }
        if let Some((_, (ca, cb))) = head {
            f(0, ca, cb);
        }
    });
}

/// Run `f` on a thread of the math pool when the pool alone has as many threads as the
/// products use, two or more, or when it was built to run all the math
/// ([`crate::set_gemm_threads_in_pool`]); inline otherwise, and when the caller is already on
/// the pool. The parallel sections and the products `f` runs are then shared by the pool's
/// threads, the one running `f` among them.
///
/// Why: with the `gemm` backend the pool has as many threads as the products use (that crate
/// runs a whole product inside the pool), so a caller outside it is one thread too many: a
/// section's first part runs on the caller while a pool thread with nothing to do spins beside
/// it for the same cores, and every product puts the caller to sleep and wakes it again
/// (`docs/BENCHMARKS.md`, "The step on the math pool"). With ftrec's own product the pool has
/// one thread fewer than the products use and the caller completes them, so `f` stays on the
/// caller. Which thread runs what changes no result: every split is by units whose arithmetic
/// does not depend on the thread.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = rayon::current_num_threads();
    if rayon::current_thread_index().is_some() {
        return f();
    }
    if !crate::gemm::all_in_pool() && (pool < 2 || pool < crate::gemm::gemm_threads()) {
        return f();
    }
    rayon::scope(|_| f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_visited_once_with_its_index() {
        for threads in [1, 2, 3, 7] {
            let units = 100_001;
            let mut a = vec![0.0f32; units];
            split1(threads, units, 1, &mut a, 1, |first, chunk| {
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v += (first + i) as f32;
                }
            });
            assert!(a.iter().enumerate().all(|(i, &v)| v == i as f32));
            let mut b = vec![0.0f32; units * 2];
            let mut c = vec![0.0f32; units];
            split2(threads, units, 3, &mut b, 2, &mut c, 1, |first, cb, cc| {
                assert_eq!(cb.len(), 2 * cc.len());
                for (i, v) in cc.iter_mut().enumerate() {
                    *v = (first + i) as f32;
                    cb[2 * i] = -*v;
                }
            });
            assert!(c.iter().enumerate().all(|(i, &v)| v == i as f32));
            assert!(b.chunks(2).enumerate().all(|(i, p)| p[0] == -(i as f32)));
        }
    }

    #[test]
    fn on_pool_runs_on_a_pool_thread_when_the_pool_has_several() {
        let pool = rayon::current_num_threads();
        let several = pool >= 2 && pool >= crate::gemm::gemm_threads();
        let (outer, inner) = on_pool(|| {
            let here = rayon::current_thread_index();
            // Already on the pool (or inline): the nested call stays on this thread.
            (here, on_pool(rayon::current_thread_index))
        });
        assert_eq!(outer.is_some(), several, "pool of {pool}");
        assert_eq!(inner, outer);
        assert_eq!(on_pool(|| 7), 7);
    }

    #[test]
    fn small_work_stays_on_one_part() {
        assert_eq!(units_per_part(8, 10, 10), 10);
        assert_eq!(units_per_part(2, 4096, 512), 2048);
        assert_eq!(units_per_part(3, 10, 1 << 20), 4);
    }
}

//! Embedding bags with sum pooling: from a batch's looked-up rows to the pooled input of the
//! model, and from the pooled gradient back to per-row gradients.
//!
//! Shared by the single-process trainer and the distributed worker, so both pool and scatter
//! in exactly the same order. Pooling sums a bag's rows in bag order; scattering walks each
//! table's bags in sample order, then bag order, which fixes the order in which a row's
//! contributions are summed and makes the result bit-reproducible (see
//! `ftrec_core::SparseGradAccumulator`).

use ftrec_core::prefetch::AHEAD;
use ftrec_core::{EmbeddingTable, Optimizer, RowId, SparseFeature, SparseGradAccumulator};

use crate::ModelError;

/// Check that every feature is a well-formed CSR index over `batch` samples.
pub fn check_features(features: &[SparseFeature], batch: usize) -> Result<(), ModelError> {
    for (table, f) in features.iter().enumerate() {
        let bad = |reason: String| Err(ModelError::InvalidFeature { table, reason });
        if f.offsets.len() != batch + 1 {
            return bad(format!("{} offsets for {batch} samples", f.offsets.len()));
        }
        if f.offsets[0] != 0
            || f.offsets.windows(2).any(|w| w[0] > w[1])
            || f.offsets[batch] as usize != f.ids.len()
        {
            return bad(format!(
                "offsets do not index the {} ids as a CSR list",
                f.ids.len()
            ));
        }
    }
    Ok(())
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), ModelError> {
    if expected == got {
        Ok(())
    } else {
        Err(ModelError::ShapeMismatch {
            what,
            expected,
            got,
        })
    }
}

/// Sum-pool every bag of `batch` samples into `pooled` `[batch x tables x dim]`, tables
/// being `features.len()`. `fetch(table, row)` returns the row's stored words (at least `dim`;
/// only the first `dim` are read, so a full row with optimizer state is fine), or `None` if the
/// row is not available, which is an error. An empty bag pools to zeros.
pub fn pool_sum<'a, F>(
    features: &[SparseFeature],
    batch: usize,
    dim: usize,
    fetch: F,
    pooled: &mut [f32],
) -> Result<(), ModelError>
where
    F: FnMut(usize, RowId) -> Option<&'a [f32]>,
{
    check_pooled(features, batch, dim, pooled)?;
    pool_range(features, 0, dim, fetch, |_, _| {}, pooled)
}

/// Check that `tables` serve `features` (one table a feature, one dim, every id inside its
/// table: `CoreError::RowOutOfRange` otherwise); returns the dim.
fn check_tables(
    features: &[SparseFeature],
    tables: &[EmbeddingTable],
) -> Result<usize, ModelError> {
    check_len("embedding tables", features.len(), tables.len())?;
    let dim = tables.first().map_or(0, |t| t.layout().dim);
    if let Some(t) = tables.iter().find(|t| t.layout().dim != dim) {
        return Err(ModelError::InvalidConfig(format!(
            "table {} has dim {}, table 0 has dim {dim}",
            t.id.0,
            t.layout().dim
        )));
    }
    for (f, t) in features.iter().zip(tables) {
        if let Some(&row) = f.ids.iter().find(|&&r| r >= t.rows()) {
            t.check_row(row)?;
        }
    }
    Ok(dim)
}

/// The checks every pooling makes first: `pooled` fits `batch` samples and the features are
/// CSR lists over them.
fn check_pooled(
    features: &[SparseFeature],
    batch: usize,
    dim: usize,
    pooled: &[f32],
) -> Result<(), ModelError> {
    check_len(
        "pooled embeddings",
        batch * features.len() * dim,
        pooled.len(),
    )?;
    check_features(features, batch)
}

/// Pool the samples from `first` on into `out` (whole samples of `tables x dim` floats), sample
/// by sample, so that `out` is written in order (table by table, each table's pass wrote one
/// 64-byte piece per sample a whole sample apart, a miss each: pooling 1.7-2.5 -> 1.4-1.5 ms a
/// step on `small`). Before a sample is pooled, `ahead(table, row)` is called for every row of
/// the sample [`SAMPLES_AHEAD`] further on (a prefetch hint; it changes no value).
fn pool_range<'a, F, A>(
    features: &[SparseFeature],
    first: usize,
    dim: usize,
    mut fetch: F,
    mut ahead: A,
    out: &mut [f32],
) -> Result<(), ModelError>
where
    F: FnMut(usize, RowId) -> Option<&'a [f32]>,
    A: FnMut(usize, RowId),
{
    let tables = features.len();
    if tables == 0 || dim == 0 {
        return Ok(());
    }
    let samples = out.len() / (tables * dim);
    for (j, sample) in out.chunks_exact_mut(tables * dim).enumerate() {
        let i = first + j;
        if j + SAMPLES_AHEAD < samples {
            for (t, f) in features.iter().enumerate() {
                for &row in f.bag(i + SAMPLES_AHEAD) {
                    ahead(t, row);
                }
            }
        }
        for ((t, f), out) in features
            .iter()
            .enumerate()
            .zip(sample.chunks_exact_mut(dim))
        {
            let mut rows = f.bag(i).iter().map(|&row| {
                let values = fetch(t, row).ok_or(ModelError::RowUnavailable { table: t, row })?;
                values.get(..dim).ok_or(ModelError::RowTooShort {
                    table: t,
                    row,
                    got: values.len(),
                    dim,
                })
            });
            // The common dim with a fixed length: no call to `memset` for every bag.
            if dim == 16 {
                let mut acc = [0.0f32; 16];
                for values in &mut rows {
                    for (a, v) in acc.iter_mut().zip(values?) {
                        *a += v;
                    }
                }
                out.copy_from_slice(&acc);
            } else {
                out.fill(0.0);
                for values in &mut rows {
                    for (o, v) in out.iter_mut().zip(values?) {
                        *o += v;
                    }
                }
            }
        }
    }
    Ok(())
}

/// How many samples ahead [`pool_range`] asks for rows: a sample brings one row a table or
/// more, so the next sample's rows are already a few dozen misses in flight.
const SAMPLES_AHEAD: usize = 1;

/// [`pool_sum`] over whole tables (`tables[t]` serves feature `t`); the dim is the tables'.
/// An id beyond its table is `CoreError::RowOutOfRange`. The samples are split over up to
/// `threads` threads; each pooled bag is summed in bag order whichever thread pools it, so the
/// result is the same for every thread count.
pub fn pool_sum_tables(
    features: &[SparseFeature],
    batch: usize,
    tables: &[EmbeddingTable],
    pooled: &mut [f32],
    threads: usize,
) -> Result<(), ModelError> {
    let dim = check_tables(features, tables)?;
    // The ids are random over tables far larger than the caches: each read is a miss that the
    // loop would otherwise wait for in turn, so the next sample's rows are requested first.
    check_pooled(features, batch, dim, pooled)?;
    let sample_floats = features.len() * dim;
    if sample_floats == 0 {
        return Ok(());
    }
    let ids_per_sample = features.iter().map(|f| f.ids.len()).sum::<usize>() / batch.max(1);
    let failed = std::sync::Mutex::new(None);
    crate::par::split1(
        threads,
        batch,
        ids_per_sample.max(1) * dim,
        pooled,
        sample_floats,
        |first, out| {
            let done = pool_range(
                features,
                first,
                dim,
                |t, row| Some(tables[t].row(row)),
                |t, row| tables[t].prefetch_row(row),
                out,
            );
            if let Err(e) = done {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
        },
    );
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Feed the pooled gradient `[batch x tables x dim]` back to every looked-up row: each id in
/// sample `i`'s bag of table `t` receives `grad_pooled[i, t]` (the derivative of a sum), added
/// to `accs[t]` (which must have been built with the same `dim`). Contributions are added per
/// table in sample order, then bag order, so a row used several times gets the sum in a fixed
/// order. The accumulators are added to, not cleared.
pub fn scatter_grads(
    features: &[SparseFeature],
    batch: usize,
    dim: usize,
    grad_pooled: &[f32],
    accs: &mut [SparseGradAccumulator],
) -> Result<(), ModelError> {
    let tables = features.len();
    check_len("gradient accumulators", tables, accs.len())?;
    check_len("pooled gradient", batch * tables * dim, grad_pooled.len())?;
    check_features(features, batch)?;
    for (t, (f, acc)) in features.iter().zip(accs.iter_mut()).enumerate() {
        scatter_table(f, t, tables, dim, grad_pooled, acc);
    }
    Ok(())
}

/// Table `t`'s part of [`scatter_grads`] (`tables` features in the pooled gradient).
fn scatter_table(
    f: &SparseFeature,
    t: usize,
    tables: usize,
    dim: usize,
    grad_pooled: &[f32],
    acc: &mut SparseGradAccumulator,
) {
    let samples = f.offsets.len() - 1;
    for i in 0..samples {
        // A table's gradients lie a whole sample apart, several to a page: a stride the
        // hardware's prefetchers do not follow across pages, so it is asked for ahead.
        if i + AHEAD < samples {
            let next = ((i + AHEAD) * tables + t) * dim;
            ftrec_core::prefetch::prefetch(&grad_pooled[next..next + dim]);
            for &row in f.bag(i + AHEAD) {
                acc.prefetch(row);
            }
        }
        let g = &grad_pooled[(i * tables + t) * dim..(i * tables + t + 1) * dim];
        for &row in f.bag(i) {
            acc.add(row, g);
        }
    }
}

/// The sparse half of a training step on in-memory tables: clear `accs`, scatter the pooled
/// gradient into them as [`scatter_grads`] does, then apply `opt` once per touched row, in id
/// order within a table. Tables are independent, so they are spread over up to `threads`
/// threads (the largest first, each to the least loaded); the result does not depend on the
/// thread count.
pub fn update_tables(
    features: &[SparseFeature],
    batch: usize,
    grad_pooled: &[f32],
    tables: &mut [EmbeddingTable],
    accs: &mut [SparseGradAccumulator],
    opt: &Optimizer,
    threads: usize,
) -> Result<(), ModelError> {
    let n = features.len();
    check_len("gradient accumulators", n, accs.len())?;
    let dim = check_tables(features, tables)?;
    check_len("pooled gradient", batch * n * dim, grad_pooled.len())?;
    check_features(features, batch)?;
    let one = |t: usize, table: &mut EmbeddingTable, acc: &mut SparseGradAccumulator| {
        acc.clear();
        scatter_table(&features[t], t, n, dim, grad_pooled, acc);
        let rows = acc.sorted();
        for (k, &(row, grad)) in rows.iter().enumerate() {
            if let Some(&(next, _)) = rows.get(k + AHEAD) {
                table.prefetch_row(next);
            }
            opt.apply(table.row_mut(row), dim, grad);
        }
    };
    let ids: usize = features.iter().map(|f| f.ids.len()).sum();
    let parts = threads
        .min(n)
        .min(ids * dim / crate::par::MIN_WORK_PER_THREAD)
        .max(1);
    if parts <= 1 {
        for (t, (table, acc)) in tables.iter_mut().zip(accs.iter_mut()).enumerate() {
            one(t, table, acc);
        }
        return Ok(());
    }
    let work: Vec<_> = tables.iter_mut().zip(accs.iter_mut()).enumerate().collect();
    // A table costs a scatter per id and an optimizer step per distinct row, of which it has
    // at most its row count (a 3-row table scatters 2,048 ids into 3 rows). Deal the costliest
    // out first, each to the least loaded part.
    let cost = |t: usize, table: &EmbeddingTable| {
        let ids = features[t].ids.len();
        ids + 3 * ids.min(usize::try_from(table.rows()).unwrap_or(usize::MAX))
    };
    let mut work: Vec<_> = work
        .into_iter()
        .map(|(t, (table, acc))| (cost(t, table), t, table, acc))
        .collect();
    work.sort_by_key(|w| std::cmp::Reverse(w.0));
    let mut bins: Vec<Vec<_>> = (0..parts).map(|_| Vec::new()).collect();
    let mut load = vec![0usize; parts];
    for (c, t, table, acc) in work {
        let i = (0..parts).min_by_key(|&i| load[i]).unwrap_or(0);
        load[i] += c;
        bins[i].push((t, (table, acc)));
    }
    let one = &one;
    rayon::in_place_scope(|s| {
        let mut bins = bins.into_iter();
        let head = bins.next();
        for bin in bins {
            s.spawn(move |_| {
                for (t, (table, acc)) in bin {
                    one(t, table, acc);
                }
            });
        }
        for (t, (table, acc)) in head.into_iter().flatten() {
            one(t, table, acc);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_core::{CoreError, RowLayout, TableId};

    fn two_tables() -> Vec<EmbeddingTable> {
        let layout = RowLayout::new(2, 1);
        (0..2)
            .map(TableId)
            .map(|id| {
                let mut t = EmbeddingTable::zeros(id, 4, layout);
                for r in 0..4 {
                    let base = (id.0 * 10 + r as u32) as f32;
                    t.row_mut(r).copy_from_slice(&[base, -base, 99.0]);
                }
                t
            })
            .collect()
    }

    fn features() -> Vec<SparseFeature> {
        // Sample 0: table 0 bag [1, 3], table 1 bag [2]; sample 1: table 0 bag [1], table 1 empty.
        let mut f0 = SparseFeature::with_capacity(2);
        f0.push_bag(&[1, 3]);
        f0.push_bag(&[1]);
        let mut f1 = SparseFeature::with_capacity(2);
        f1.push_bag(&[2]);
        f1.push_bag(&[]);
        vec![f0, f1]
    }

    #[test]
    fn pooling_sums_bags_and_empty_bags_are_zero() {
        let tables = two_tables();
        let mut pooled = vec![f32::NAN; 2 * 2 * 2];
        pool_sum_tables(&features(), 2, &tables, &mut pooled, 1).unwrap();
        assert_eq!(pooled, [4.0, -4.0, 12.0, -12.0, 1.0, -1.0, 0.0, 0.0]);
    }

    #[test]
    fn a_row_used_twice_gets_the_sum_of_its_gradients() {
        let grad = [1.0, 2.0, 3.0, 4.0, 0.5, 0.25, 7.0, 8.0];
        let mut accs = vec![SparseGradAccumulator::new(2), SparseGradAccumulator::new(2)];
        scatter_grads(&features(), 2, 2, &grad, &mut accs).unwrap();
        let t0 = accs[0].sorted();
        // Row 1 is in sample 0's and sample 1's bag of table 0; row 3 only in sample 0's.
        assert_eq!(t0, vec![(1, &[1.5f32, 2.25][..]), (3, &[1.0f32, 2.0][..])]);
        assert_eq!(accs[1].sorted(), vec![(2, &[3.0f32, 4.0][..])]);
    }

    #[test]
    fn bad_inputs_are_named_errors() {
        let tables = two_tables();
        let mut pooled = vec![0.0; 8];
        let mut f = features();
        f[1].ids[0] = 4;
        assert!(matches!(
            pool_sum_tables(&f, 2, &tables, &mut pooled, 1),
            Err(ModelError::Core(CoreError::RowOutOfRange {
                table: 1,
                row: 4,
                ..
            }))
        ));
        let mut f = features();
        f[0].offsets[1] = 5;
        assert!(matches!(
            pool_sum_tables(&f, 2, &tables, &mut pooled, 1),
            Err(ModelError::InvalidFeature { table: 0, .. })
        ));
        assert!(matches!(
            pool_sum_tables(&features(), 3, &tables, &mut [0.0; 12], 1),
            Err(ModelError::InvalidFeature { table: 0, .. })
        ));
        assert!(matches!(
            pool_sum_tables(&features(), 2, &tables, &mut [0.0; 7], 1),
            Err(ModelError::ShapeMismatch {
                expected: 8,
                got: 7,
                ..
            })
        ));
        let missing = pool_sum(
            &features(),
            2,
            2,
            |t, r| (r != 3).then(|| tables[t].row(r)),
            &mut pooled,
        );
        assert!(matches!(
            missing,
            Err(ModelError::RowUnavailable { table: 0, row: 3 })
        ));
        let short = pool_sum(
            &features(),
            2,
            4,
            |t, r| Some(tables[t].row(r)),
            &mut [0.0; 16],
        );
        assert!(matches!(
            short,
            Err(ModelError::RowTooShort { got: 3, dim: 4, .. })
        ));
        let mut accs = vec![SparseGradAccumulator::new(2)];
        let opt = Optimizer::new(ftrec_core::OptimizerKind::Sgd, 0.1);
        let mut tables = two_tables();
        assert!(matches!(
            update_tables(&features(), 2, &[0.0; 8], &mut tables, &mut accs, &opt, 2),
            Err(ModelError::ShapeMismatch {
                what: "gradient accumulators",
                ..
            })
        ));
        let mut f = features();
        f[0].ids[0] = 7;
        let mut two = vec![SparseGradAccumulator::new(2); 2];
        assert!(matches!(
            update_tables(&f, 2, &[0.0; 8], &mut tables, &mut two, &opt, 2),
            Err(ModelError::Core(CoreError::RowOutOfRange {
                table: 0,
                row: 7,
                ..
            }))
        ));
        assert!(matches!(
            scatter_grads(&features(), 2, 2, &[0.0; 8], &mut accs),
            Err(ModelError::ShapeMismatch {
                what: "gradient accumulators",
                ..
            })
        ));
    }

    /// A batch big enough that pooling and the table update are split over threads, with
    /// hot rows shared by many samples and multi-id bags.
    fn large() -> (Vec<EmbeddingTable>, Vec<SparseFeature>, Vec<f32>, usize) {
        let (n, rows, dim, batch) = (6usize, 500u64, 8usize, 1024usize);
        let layout = RowLayout::new(dim, 1);
        let tables: Vec<_> = (0..n)
            .map(|t| EmbeddingTable::new_init(TableId(t as u32), rows, layout, 3, 0.1))
            .collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let features = (0..n)
            .map(|t| {
                let mut f = SparseFeature::with_capacity(batch);
                for _ in 0..batch {
                    let len = (next() % (t as u64 + 2)) as usize;
                    let bag: Vec<u64> = (0..len).map(|_| (next() % rows).pow(2) / rows).collect();
                    f.push_bag(&bag);
                }
                f
            })
            .collect();
        let grad = (0..batch * n * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        (tables, features, grad, batch)
    }

    #[test]
    fn pooling_and_the_table_update_are_bit_identical_for_every_thread_count() {
        let opt = Optimizer::new(ftrec_core::OptimizerKind::RowWiseAdagrad, 0.05);
        let mut results = Vec::new();
        for threads in [1, 2, 3] {
            let (mut tables, features, grad, batch) = large();
            let dim = tables[0].layout().dim;
            let mut pooled = vec![f32::NAN; batch * tables.len() * dim];
            pool_sum_tables(&features, batch, &tables, &mut pooled, threads).unwrap();
            let mut accs = vec![SparseGradAccumulator::new(dim); tables.len()];
            update_tables(
                &features,
                batch,
                &grad,
                &mut tables,
                &mut accs,
                &opt,
                threads,
            )
            .unwrap();
            // The sequential reference: pool_sum and scatter_grads, then the optimizer by id.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let rows: Vec<Vec<u32>> = tables
                .iter()
                .map(|t| (0..t.rows()).flat_map(|r| bits(t.row(r))).collect())
                .collect();
            results.push((bits(&pooled), rows));
        }
        let (mut tables, features, grad, batch) = large();
        let dim = tables[0].layout().dim;
        let mut pooled = vec![0.0; batch * tables.len() * dim];
        pool_sum(
            &features,
            batch,
            dim,
            |t, r| Some(tables[t].row(r)),
            &mut pooled,
        )
        .unwrap();
        let mut accs = vec![SparseGradAccumulator::new(dim); tables.len()];
        scatter_grads(&features, batch, dim, &grad, &mut accs).unwrap();
        for (table, acc) in tables.iter_mut().zip(&accs) {
            for (row, g) in acc.sorted() {
                opt.apply(table.row_mut(row), dim, g);
            }
        }
        assert!(pooled.iter().any(|&v| v != 0.0));
        for (threads, (p, rows)) in [1, 2, 3].iter().zip(&results) {
            assert!(
                p.iter().zip(&pooled).all(|(a, b)| *a == b.to_bits()),
                "pooled with {threads} threads"
            );
            for (t, table) in tables.iter().enumerate() {
                let want: Vec<u32> = (0..table.rows())
                    .flat_map(|r| table.row(r).iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .collect();
                assert_eq!(rows[t], want, "table {t} updated with {threads} threads");
            }
        }
    }
}

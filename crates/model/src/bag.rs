//! Embedding bags with sum pooling: from a batch's looked-up rows to the pooled input of the
//! model, and from the pooled gradient back to per-row gradients.
//!
//! Shared by the single-process trainer and the distributed worker, so both pool and scatter
//! in exactly the same order. Pooling sums a bag's rows in bag order; scattering walks each
//! table's bags in sample order, then bag order, which fixes the order in which a row's
//! contributions are summed and makes the result bit-reproducible (see
//! `ftrec_core::SparseGradAccumulator`).

use ftrec_core::prefetch::AHEAD;
use ftrec_core::{EmbeddingTable, RowId, SparseFeature, SparseGradAccumulator};

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
    pool_with(features, batch, dim, fetch, |_, _| {}, pooled)
}

/// [`pool_sum`], calling `ahead(table, row)` for the id [`AHEAD`] places further on in the
/// table's ids before each row is read (a prefetch hint; it changes no value).
fn pool_with<'a, F, A>(
    features: &[SparseFeature],
    batch: usize,
    dim: usize,
    mut fetch: F,
    mut ahead: A,
    pooled: &mut [f32],
) -> Result<(), ModelError>
where
    F: FnMut(usize, RowId) -> Option<&'a [f32]>,
    A: FnMut(usize, RowId),
{
    let tables = features.len();
    check_len("pooled embeddings", batch * tables * dim, pooled.len())?;
    check_features(features, batch)?;
    for (t, f) in features.iter().enumerate() {
        for i in 0..batch {
            let out = &mut pooled[(i * tables + t) * dim..(i * tables + t + 1) * dim];
            out.fill(0.0);
            let first = f.offsets[i] as usize;
            for (k, &row) in f.bag(i).iter().enumerate() {
                if let Some(&next) = f.ids.get(first + k + AHEAD) {
                    ahead(t, next);
                }
                let values = fetch(t, row).ok_or(ModelError::RowUnavailable { table: t, row })?;
                if values.len() < dim {
                    return Err(ModelError::RowTooShort {
                        table: t,
                        row,
                        got: values.len(),
                        dim,
                    });
                }
                for (o, v) in out.iter_mut().zip(values) {
                    *o += v;
                }
            }
        }
    }
    Ok(())
}

/// [`pool_sum`] over whole tables (`tables[t]` serves feature `t`); the dim is the tables'.
/// An id beyond its table is `CoreError::RowOutOfRange`.
pub fn pool_sum_tables(
    features: &[SparseFeature],
    batch: usize,
    tables: &[EmbeddingTable],
    pooled: &mut [f32],
) -> Result<(), ModelError> {
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
    // The ids are random over tables far larger than the caches: each read is a miss that the
    // loop would otherwise wait for in turn, so the row `AHEAD` ids on is requested first.
    pool_with(
        features,
        batch,
        dim,
        |t, row| Some(tables[t].row(row)),
        |t, row| tables[t].prefetch_row(row),
        pooled,
    )
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
        for i in 0..batch {
            let g = &grad_pooled[(i * tables + t) * dim..(i * tables + t + 1) * dim];
            for &row in f.bag(i) {
                acc.add(row, g);
            }
        }
    }
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
        pool_sum_tables(&features(), 2, &tables, &mut pooled).unwrap();
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
            pool_sum_tables(&f, 2, &tables, &mut pooled),
            Err(ModelError::Core(CoreError::RowOutOfRange {
                table: 1,
                row: 4,
                ..
            }))
        ));
        let mut f = features();
        f[0].offsets[1] = 5;
        assert!(matches!(
            pool_sum_tables(&f, 2, &tables, &mut pooled),
            Err(ModelError::InvalidFeature { table: 0, .. })
        ));
        assert!(matches!(
            pool_sum_tables(&features(), 3, &tables, &mut [0.0; 12]),
            Err(ModelError::InvalidFeature { table: 0, .. })
        ));
        assert!(matches!(
            pool_sum_tables(&features(), 2, &tables, &mut [0.0; 7]),
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
        assert!(matches!(
            scatter_grads(&features(), 2, 2, &[0.0; 8], &mut accs),
            Err(ModelError::ShapeMismatch {
                what: "gradient accumulators",
                ..
            })
        ));
    }
}

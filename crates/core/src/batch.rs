//! The training batch handed from data readers to trainers.

use crate::CoreError;

/// Dense (integer) features of a Criteo sample.
pub const NUM_DENSE: usize = 13;
/// Categorical features of a Criteo sample (one embedding table each).
pub const NUM_SPARSE: usize = 26;

/// One categorical feature over a batch, as a bag of rows per sample (CSR): sample `i` looks up
/// `ids[offsets[i]..offsets[i+1]]`. One-hot Criteo data has one id per sample, or none for a
/// missing value (an empty bag pools to zeros); multi-hot is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseFeature {
    pub offsets: Vec<u32>,
    pub ids: Vec<u64>,
}

impl SparseFeature {
    pub fn with_capacity(samples: usize) -> Self {
        let mut offsets = Vec::with_capacity(samples + 1);
        offsets.push(0);
        SparseFeature {
            offsets,
            ids: Vec::with_capacity(samples),
        }
    }

    /// Append one sample's bag.
    pub fn push_bag(&mut self, ids: &[u64]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        match ids {
            // One id (a one-hot feature, the common bag) without a call to copy 8 bytes.
            &[id] => self.ids.push(id),
            _ => self.ids.extend_from_slice(ids),
        }
        self.offsets.push(self.ids.len() as u32);
    }

    /// The bag of sample `i`.
    #[inline]
    pub fn bag(&self, i: usize) -> &[u64] {
        &self.ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// A batch of samples: labels, transformed dense features (`size x dense_dim`, row-major) and
/// one [`SparseFeature`] per table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub size: usize,
    pub labels: Vec<f32>,
    pub dense: Vec<f32>,
    pub sparse: Vec<SparseFeature>,
}

impl Batch {
    /// An empty batch with room for `samples` samples of `dense_dim` dense and `tables`
    /// categorical features.
    pub fn with_capacity(samples: usize, dense_dim: usize, tables: usize) -> Self {
        Batch {
            size: 0,
            labels: Vec::with_capacity(samples),
            dense: Vec::with_capacity(samples * dense_dim),
            sparse: (0..tables)
                .map(|_| SparseFeature::with_capacity(samples))
                .collect(),
        }
    }

    /// Append `other`'s samples after this batch's (the same tables and dense width): the
    /// batch two readers would have made of the two ranges in a row.
    pub fn append(&mut self, other: &Batch) -> Result<(), CoreError> {
        if other.sparse.len() != self.sparse.len() {
            return Err(CoreError::InvalidBatch(format!(
                "appending a batch of {} categorical features to one of {}",
                other.sparse.len(),
                self.sparse.len()
            )));
        }
        self.size += other.size;
        self.labels.extend_from_slice(&other.labels);
        self.dense.extend_from_slice(&other.dense);
        for (f, o) in self.sparse.iter_mut().zip(&other.sparse) {
            if f.offsets.is_empty() {
                f.offsets.push(0);
            }
            let base = f.ids.len() as u32;
            f.ids.extend_from_slice(&o.ids);
            f.offsets
                .extend(o.offsets.iter().skip(1).map(|&end| base + end));
        }
        Ok(())
    }

    /// Check internal consistency and that every id is below its table's row count.
    pub fn validate(&self, dense_dim: usize, table_rows: &[u64]) -> Result<(), CoreError> {
        let bad = |m: String| Err(CoreError::InvalidBatch(m));
        if self.labels.len() != self.size {
            return bad(format!(
                "{} labels for {} samples",
                self.labels.len(),
                self.size
            ));
        }
        if self.dense.len() != self.size * dense_dim {
            return bad(format!(
                "{} dense values for {} samples x {dense_dim}",
                self.dense.len(),
                self.size
            ));
        }
        if self.sparse.len() != table_rows.len() {
            return bad(format!(
                "{} categorical features for {} tables",
                self.sparse.len(),
                table_rows.len()
            ));
        }
        for (t, (f, &rows)) in self.sparse.iter().zip(table_rows).enumerate() {
            if f.offsets.len() != self.size + 1 {
                return bad(format!(
                    "feature {t}: {} offsets for {} samples",
                    f.offsets.len(),
                    self.size
                ));
            }
            if f.offsets.windows(2).any(|w| w[0] > w[1])
                || *f.offsets.last().unwrap_or(&0) as usize != f.ids.len()
            {
                return bad(format!("feature {t}: offsets are not a valid CSR index"));
            }
            if let Some(&id) = f.ids.iter().find(|&&id| id >= rows) {
                return Err(CoreError::RowOutOfRange {
                    table: t as u32,
                    row: id,
                    rows,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples `first..` of a made-up stream, one bag each from `bags`.
    fn batch(bags: &[&[u64]], first: usize) -> Batch {
        let mut b = Batch::with_capacity(bags.len(), 1, 2);
        for (i, bag) in bags.iter().enumerate() {
            b.size += 1;
            b.labels.push(((first + i) % 2) as f32);
            b.dense.push((first + i) as f32);
            b.sparse[0].push_bag(bag);
            b.sparse[1].push_bag(&bag[bag.len().min(1)..]);
        }
        b
    }

    #[test]
    fn appending_gives_the_batch_of_both_ranges() {
        let bags: [&[u64]; 5] = [&[1], &[], &[2, 3], &[4], &[5, 6, 7]];
        let whole = batch(&bags, 0);
        let mut front = batch(&bags[..2], 0);
        front.append(&batch(&bags[2..], 2)).unwrap();
        assert_eq!(front, whole);
        assert!(front.validate(1, &[8, 8]).is_ok());
        let mut empty = Batch {
            sparse: vec![SparseFeature::default(); 2],
            ..Batch::default()
        };
        empty.append(&whole).unwrap();
        assert_eq!(empty, whole);
        assert!(matches!(
            empty.append(&Batch::with_capacity(1, 1, 3)),
            Err(CoreError::InvalidBatch(_))
        ));
    }

    #[test]
    fn validate_catches_out_of_range_ids_and_bad_shapes() {
        let mut b = Batch::with_capacity(2, 1, 1);
        b.size = 2;
        b.labels = vec![0.0, 1.0];
        b.dense = vec![0.5, 0.25];
        b.sparse[0].push_bag(&[3]);
        b.sparse[0].push_bag(&[]);
        assert!(b.validate(1, &[4]).is_ok());
        assert_eq!(b.sparse[0].bag(1), &[] as &[u64]);
        assert!(matches!(
            b.validate(1, &[3]),
            Err(CoreError::RowOutOfRange { row: 3, .. })
        ));
        b.labels.pop();
        assert!(matches!(
            b.validate(1, &[4]),
            Err(CoreError::InvalidBatch(_))
        ));
    }
}

/// Training throughput, the one definition of samples/s every report and table uses: samples
/// trained over training time (first step to last, pauses and recoveries included; start-up,
/// a final save and evaluation are not training). Zero when nothing was trained.
pub fn samples_per_s(samples_trained: u64, train_s: f64) -> f64 {
    if samples_trained == 0 || train_s.is_nan() || train_s <= 0.0 {
        0.0
    } else {
        samples_trained as f64 / train_s
    }
}

#[cfg(test)]
mod throughput_tests {
    use super::samples_per_s;

    #[test]
    fn samples_per_s_is_samples_trained_over_training_time() {
        assert_eq!(samples_per_s(1000, 2.0), 500.0);
        // Nothing trained (a resumed run of a finished job): no throughput, not a division.
        assert_eq!(samples_per_s(0, 0.0), 0.0);
        assert_eq!(samples_per_s(10, 0.0), 0.0);
    }
}

//! `ftrec-core`: the vocabulary every other ftrec crate speaks.
//!
//! It owns
//! - identifiers ([`TableId`], [`RowId`], [`ServerId`]) and the [`ShardMap`] that places rows on
//!   parameter servers,
//! - the row layout: a row is `dim` embedding values followed by the optimizer's state words,
//!   stored contiguously so that a row can be copied, checkpointed, erasure-coded and restored
//!   as one unit ([`RowLayout`], [`EmbeddingTable`]),
//! - optimizers as pure functions on one row and its gradient ([`Optimizer`]),
//! - the training [`Batch`] handed from data readers to trainers,
//! - workload [`Preset`]s (`tiny`, `small`, `kaggle`),
//! - the [`ModelDigest`], the single number the correctness oracle compares,
//! - a small counter-based RNG ([`rng`]) so that every row's initial value is a pure function of
//!   `(seed, table, row)`, whatever the sharding,
//! - software [`prefetch`] of the rows a loop is about to touch, transparent huge [`pages`] for
//!   large tables, and [`simd`] kernels compiled
//!   for the CPU they run on (AVX-512F, AVX2 or the baseline) with the same bits on each,
//! - support for the tests that fuzz every reader of untrusted bytes ([`fuzz`]: byte mutations
//!   and a probe of the largest allocation a call makes).
//!
//! It never does IO.
//!
//! ```
//! use ftrec_core::{EmbeddingTable, Optimizer, OptimizerKind, RowLayout, TableId};
//! let opt = Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.1);
//! let layout = RowLayout::new(4, opt.state_words(4));
//! let mut table = EmbeddingTable::new_init(TableId(0), 10, layout, 42, 0.05);
//! let before = table.row(3).to_vec();
//! opt.apply(table.row_mut(3), 4, &[1.0, 0.0, -1.0, 0.5]);
//! assert_ne!(before, table.row(3));
//! ```

pub mod batch;
pub mod dense;
pub mod digest;
pub mod error;
pub mod fuzz;
pub mod ids;
pub mod optimizer;
pub mod pages;
pub mod prefetch;
pub mod preset;
pub mod rng;
pub mod simd;
pub mod sparse;
pub mod table;

pub use batch::{samples_per_s, Batch, SparseFeature, NUM_DENSE, NUM_SPARSE};
pub use dense::{DenseParams, DenseRange, DENSE_BLOCK};
pub use digest::ModelDigest;
pub use error::CoreError;
pub use ids::{RowId, ServerId, ShardMap, TableId};
pub use optimizer::{Optimizer, OptimizerKind};
pub use preset::{MlpShape, Preset};
pub use sparse::{RowIdHasher, RowIdMap, SparseGradAccumulator};
pub use table::{EmbeddingTable, RowLayout};

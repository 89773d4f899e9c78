//! `ftrec-model`: the DLRM dense part, embedding-bag pooling, evaluation metrics and the MLP
//! benchmark.
//!
//! It owns
//! - the model's math on one batch: bottom MLP, pairwise dot interaction, top MLP and binary
//!   cross-entropy, with hand-written forward and backward passes on the matrix products of
//!   [`gemm`] (an AVX-512 packed product of its own where the CPU has AVX-512F)
//!   ([`Dlrm`], its shape [`DlrmConfig`], the reusable buffers [`Workspace`]);
//! - sum pooling of embedding bags and the scatter of pooled gradients back to rows
//!   ([`pool_sum`], [`pool_sum_tables`], [`scatter_grads`]), shared by every trainer so they
//!   all sum in the same order;
//! - [`metrics`]: exact AUC and log loss;
//! - [`bench_mlp`]: model-step speed against raw sgemm speed, measured in one run.
//!
//! It never does IO, never owns embedding tables (callers hand rows in through a closure) and
//! never decides how training is scheduled or made fault tolerant. Given the same parameters
//! and inputs every result is the same, bit for bit, for any thread count.
//!
//! ```
//! use ftrec_core::{
//!     EmbeddingTable, Optimizer, OptimizerKind, Preset, RowLayout, SparseFeature,
//!     SparseGradAccumulator, TableId,
//! };
//! use ftrec_model::{pool_sum_tables, scatter_grads, Dlrm, DlrmConfig, Workspace};
//!
//! let preset = Preset::tiny();
//! let cfg = DlrmConfig::from_preset(&preset);
//! let opt = Optimizer::new(preset.dense_optimizer, preset.dense_lr);
//! let mut model = Dlrm::new(cfg.clone(), 7, &opt)?;
//!
//! // Two samples, one id per table.
//! let layout = RowLayout::new(cfg.dim, 0);
//! let tables: Vec<EmbeddingTable> = (0..cfg.tables as u32)
//!     .map(|t| EmbeddingTable::new_init(TableId(t), 3, layout, 7, 0.05))
//!     .collect();
//! let features: Vec<SparseFeature> = (0..cfg.tables)
//!     .map(|t| {
//!         let mut f = SparseFeature::with_capacity(2);
//!         f.push_bag(&[t as u64 % 3]);
//!         f.push_bag(&[2]);
//!         f
//!     })
//!     .collect();
//! let mut pooled = vec![0.0; 2 * cfg.tables * cfg.dim];
//! pool_sum_tables(&features, 2, &tables, &mut pooled, 1)?;
//!
//! let dense = vec![0.5; 2 * cfg.dense_in];
//! let mut ws = Workspace::new(1)?;
//! let loss = model.forward_backward(&mut ws, &dense, &pooled, &[1.0, 0.0])?;
//! assert!(loss.is_finite() && loss > 0.0);
//!
//! let mut accs = vec![SparseGradAccumulator::new(cfg.dim); cfg.tables];
//! scatter_grads(&features, 2, cfg.dim, ws.grad_pooled(), &mut accs)?;
//! model.apply_gradients(&opt, ws.grad_params(), 1)?;
//! # Ok::<(), ftrec_model::ModelError>(())
//! ```

pub mod bag;
pub mod bench;
pub mod config;
pub mod dlrm;
pub mod error;
pub mod gemm;
mod interaction;
pub mod metrics;
mod packed;
mod par;

pub use bag::{check_features, pool_sum, pool_sum_tables, scatter_grads, update_tables};
pub use bench::{bench_mlp, MlpBench};
pub use config::{DlrmConfig, LinearLayer};
pub use dlrm::{Dlrm, Workspace};
pub use error::ModelError;
pub use gemm::{
    gemm_backend, gemm_threads, set_gemm_threads, set_gemm_threads_in_pool, Backend as GemmBackend,
};
pub use metrics::{auc, logloss};
pub use par::on_pool;

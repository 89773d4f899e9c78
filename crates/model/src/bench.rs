//! The MLP benchmark: how close the model's forward+backward gets to the raw matrix-product
//! speed of this machine, measured in the same run.

use std::time::Instant;

use ftrec_core::rng::SplitMix;
use ftrec_core::{Optimizer, OptimizerKind};
use serde::{Deserialize, Serialize};

use crate::{gemm, Dlrm, DlrmConfig, ModelError, Workspace};

/// Result of [`bench_mlp`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpBench {
    pub batch: usize,
    /// Threads for element-wise and interaction work.
    pub threads: usize,
    /// Threads the matrix products used.
    pub gemm_threads: usize,
    pub iters: usize,
    /// `[m, k, n]` of the raw sgemm measured: `m` = batch, `k` = `n` = the widest layer.
    pub sgemm_shape: [usize; 3],
    /// Raw sgemm speed (`2*m*k*n` flops over the median time).
    pub sgemm_gflops: f64,
    /// Matrix-product flops of one model step (`DlrmConfig::flops_per_sample * batch`).
    pub step_flops: u64,
    /// Median time of one full `forward_backward` (interaction, loss and element-wise work
    /// included), in milliseconds.
    pub step_ms: f64,
    /// Fastest step, in milliseconds.
    pub step_ms_min: f64,
    /// `step_flops` over the median step time.
    pub mlp_gflops: f64,
    /// `mlp_gflops / sgemm_gflops`.
    pub ratio: f64,
}

impl std::fmt::Display for MlpBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [m, k, n] = self.sgemm_shape;
        write!(
            f,
            "raw sgemm {m}x{k}x{n}: {:.1} GFLOP/s | MLP fwd+bwd batch {}: {:.2} ms/step \
             (min {:.2}), {:.1} GFLOP/s | ratio {:.2} | threads {} (gemm {}), {} iters",
            self.sgemm_gflops,
            self.batch,
            self.step_ms,
            self.step_ms_min,
            self.mlp_gflops,
            self.ratio,
            self.threads,
            self.gemm_threads,
            self.iters
        )
    }
}

fn median_and_min(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0])
}

/// Measure (a) raw `sgemm` on a `batch x width x width` product, `width` being the widest
/// layer of `cfg` (2048x512x512 for the Kaggle shape at batch 2048), and (b) full model steps
/// (`Dlrm::forward_backward` on seeded random inputs), `iters` times each, alternating, after
/// a warm-up; report median speeds and their ratio.
///
/// Sets the process's gemm thread count to `threads` (see [`crate::set_gemm_threads`]); if
/// an earlier product already fixed a different count this is
/// [`ModelError::GemmThreadsFixed`].
pub fn bench_mlp(
    cfg: &DlrmConfig,
    batch: usize,
    threads: usize,
    iters: usize,
) -> Result<MlpBench, ModelError> {
    cfg.validate()?;
    if batch == 0 || iters == 0 {
        return Err(ModelError::InvalidConfig(format!(
            "the benchmark needs a positive batch and iteration count (batch {batch}, iters {iters})"
        )));
    }
    let gemm_threads = gemm::set_gemm_threads(threads)?;
    let mut rng = SplitMix::new(0xBE7C);
    let mut fill = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * rng.next_f32()).collect()
    };

    // (a) raw sgemm inputs.
    let width = cfg
        .bottom
        .iter()
        .chain(&cfg.top)
        .copied()
        .max()
        .unwrap_or(1);
    let (m, k, n) = (batch, width, width);
    let a = fill(m * k, -1.0, 1.0);
    let b = fill(k * n, -1.0, 1.0);
    let mut c = vec![0.0f32; m * n];

    // (b) model and step inputs.
    let model = Dlrm::new(
        cfg.clone(),
        0x5EED,
        &Optimizer::new(OptimizerKind::Sgd, 0.01),
    )?;
    let dense = fill(batch * cfg.dense_in, 0.0, 3.0);
    let pooled = fill(batch * cfg.tables * cfg.dim, -0.05, 0.05);
    let labels: Vec<f32> = fill(batch, 0.0, 1.0)
        .into_iter()
        .map(|u| if u < 0.25 { 1.0 } else { 0.0 })
        .collect();
    let mut ws: Workspace = model.workspace(batch, threads)?;

    // Warm up, then alternate the two measurements so that both see the same machine (other
    // load, clock changes) and their ratio stays meaningful on a shared box. Both run where a
    // training step runs (`on_pool`).
    let (sgemm_times, step_times) = crate::par::on_pool(|| {
        for _ in 0..2 {
            gemm::a_b(m, k, n, &a, &b, &mut c);
            model.forward_backward(&mut ws, &dense, &pooled, &labels)?;
        }
        let mut sgemm_times = Vec::with_capacity(iters);
        let mut step_times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            gemm::a_b(m, k, n, &a, &b, &mut c);
            sgemm_times.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            model.forward_backward(&mut ws, &dense, &pooled, &labels)?;
            step_times.push(t.elapsed().as_secs_f64());
        }
        Ok::<_, ModelError>((sgemm_times, step_times))
    })?;
    let (sgemm_s, _) = median_and_min(sgemm_times);
    let sgemm_gflops = 2.0 * (m * k * n) as f64 / sgemm_s / 1e9;
    let (step_s, step_min_s) = median_and_min(step_times);
    let step_flops = cfg.flops_per_sample() * batch as u64;
    let mlp_gflops = step_flops as f64 / step_s / 1e9;
    Ok(MlpBench {
        batch,
        threads,
        gemm_threads,
        iters,
        sgemm_shape: [m, k, n],
        sgemm_gflops,
        step_flops,
        step_ms: step_s * 1e3,
        step_ms_min: step_min_s * 1e3,
        mlp_gflops,
        ratio: mlp_gflops / sgemm_gflops,
    })
}

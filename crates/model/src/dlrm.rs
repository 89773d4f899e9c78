//! The DLRM dense part: bottom MLP, dot interaction, top MLP, binary cross-entropy.
//!
//! Data flow for a batch of `B` samples (all buffers row-major, sample-major):
//! ```text
//! dense [B x dense_in] -> bottom MLP (ReLU after every layer, the last too) -> z0 [B x dim]
//! (z0, pooled [B x tables x dim]) -> interaction -> top_in [B x (dim + n(n-1)/2)], n = tables+1
//! top_in -> top MLP (ReLU between layers, none after the last) -> logit [B] -> sigmoid
//! loss = mean over the batch of BCE(logit, label), computed from the logit
//! ```
//!
//! # Parameters
//! One [`DenseParams`]: for each layer in order (bottom layers, then top layers) the weight
//! `W [out x in]` row-major (PyTorch's `nn.Linear` orientation: `y = x W^T + b`), then the
//! bias `[out]`. Initialisation is a pure function of the seed: every layer's weights are
//! Xavier-uniform (`U(-sqrt(6/(in+out)), ..)`), as the DLRM reference initialises them, except
//! the output layer's, scaled by 0.01 so that the first logits are near zero (an initial loss
//! near ln 2 rather than 7-14), and biases start at zero. (He init was tried first: on log-scaled Criteo counts it starts the
//! logit in the hundreds, an initial loss of ~50 and Adagrad accumulators saturated by the
//! first steps.) Row `r` of layer `l` draws from
//! `SplitMix::keyed(seed, DENSE_INIT_STREAM + l, r)`.
//!
//! # Determinism
//! A step's results (loss, gradients, predictions) are a pure function of the parameters and
//! the inputs, bit for bit, whatever [`Workspace::threads`] is: per-sample work is split over
//! threads by sample range, and bias gradients are summed over fixed blocks of
//! [`BIAS_BLOCK`] samples whose partial sums are then added in block order. The gemm thread
//! count does not change results either (see [`crate::gemm`]).

use ftrec_core::rng::SplitMix;
use ftrec_core::{DenseParams, Optimizer, DENSE_BLOCK};

use crate::config::LayerShape;
use crate::{gemm, par, DlrmConfig, ModelError};

/// RNG stream base of the dense initialisation (`+ layer index`).
pub const DENSE_INIT_STREAM: u64 = 0xDE45_0000;

/// Scale of the output layer's initial weights relative to Xavier-uniform.
const OUTPUT_INIT_SCALE: f32 = 0.01;

/// Samples per bias-gradient block: bias gradients are summed within fixed blocks, then across
/// blocks in order, so the summation order never depends on the thread count.
pub const BIAS_BLOCK: usize = 256;

/// Reusable buffers for [`Dlrm::forward_backward`] and [`Dlrm::predict`].
///
/// Buffers grow to the largest batch seen and are then reused: a step with a batch no larger
/// than an earlier one allocates nothing here. (The gemm backend allocates one packing buffer
/// per product internally, and spawning helper threads costs what a spawn costs; neither
/// scales with the batch.)
#[derive(Debug, Clone)]
pub struct Workspace {
    threads: usize,
    batch: usize,
    /// Post-activation output of every layer, bottom then top (the last is the logit).
    acts: Vec<Vec<f32>>,
    top_in: Vec<f32>,
    grad_a: Vec<f32>,
    grad_b: Vec<f32>,
    partials: Vec<f32>,
    grad_params: Vec<f32>,
    grad_pooled: Vec<f32>,
}

impl Default for Workspace {
    fn default() -> Self {
        Workspace {
            threads: 1,
            batch: 0,
            acts: Vec::new(),
            top_in: Vec::new(),
            grad_a: Vec::new(),
            grad_b: Vec::new(),
            partials: Vec::new(),
            grad_params: Vec::new(),
            grad_pooled: Vec::new(),
        }
    }
}

impl Workspace {
    /// An empty workspace whose element-wise and interaction work uses up to `threads`
    /// threads (the matrix products use the process-wide gemm count, see
    /// [`crate::set_gemm_threads`]).
    pub fn new(threads: usize) -> Result<Self, ModelError> {
        let mut ws = Workspace::default();
        ws.set_threads(threads)?;
        Ok(ws)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn set_threads(&mut self, threads: usize) -> Result<(), ModelError> {
        if threads == 0 {
            return Err(ModelError::InvalidThreads(0));
        }
        self.threads = threads;
        Ok(())
    }

    /// Grow every buffer for `batch` samples of `cfg` now rather than on the first step.
    pub fn reserve(&mut self, cfg: &DlrmConfig, batch: usize) {
        self.prepare(cfg, batch, true);
    }

    /// Samples of the last forward pass.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Gradient of the mean loss with respect to every dense parameter (layout of
    /// [`DenseParams::values`]), from the last [`Dlrm::forward_backward`].
    pub fn grad_params(&self) -> &[f32] {
        &self.grad_params
    }

    /// Gradient of the mean loss with respect to the pooled embeddings `[B x tables x dim]`,
    /// from the last [`Dlrm::forward_backward`].
    pub fn grad_pooled(&self) -> &[f32] {
        &self.grad_pooled
    }

    /// Logits of the last forward pass `[B]`.
    pub fn logits(&self) -> &[f32] {
        self.acts.last().map_or(&[][..], |v| &v[..self.batch])
    }

    /// Size the buffers for `batch` samples; gradient buffers only for training (`train`),
    /// so that a prediction leaves the last step's gradients readable.
    fn prepare(&mut self, cfg: &DlrmConfig, batch: usize, train: bool) {
        let layers = cfg.layers();
        self.batch = batch;
        self.acts.resize_with(layers.len(), Vec::new);
        for (buf, l) in self.acts.iter_mut().zip(&layers) {
            buf.resize(batch * l.output, 0.0);
        }
        self.top_in.resize(batch * cfg.interaction_width(), 0.0);
        if !train {
            return;
        }
        let widest = batch * cfg.max_width();
        self.grad_a.resize(widest, 0.0);
        self.grad_b.resize(widest, 0.0);
        self.partials
            .resize(batch.div_ceil(BIAS_BLOCK) * cfg.max_width(), 0.0);
        self.grad_params.resize(cfg.param_count(), 0.0);
        self.grad_pooled.resize(batch * cfg.tables * cfg.dim, 0.0);
    }

    /// Addresses and capacities of every buffer (for the reuse test).
    #[cfg(test)]
    pub(crate) fn buffer_fingerprint(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = self
            .acts
            .iter()
            .chain([
                &self.top_in,
                &self.grad_a,
                &self.grad_b,
                &self.partials,
                &self.grad_params,
                &self.grad_pooled,
            ])
            .map(|b| (b.as_ptr() as usize, b.capacity()))
            .collect();
        v.push((self.acts.as_ptr() as usize, self.acts.capacity()));
        v
    }
}

/// The DLRM dense part: its shape and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Dlrm {
    cfg: DlrmConfig,
    layers: Vec<LayerShape>,
    params: DenseParams,
}

impl Dlrm {
    /// A freshly initialised model (see the module doc for the initialisation), with zeroed
    /// optimizer state laid out for `dense_opt`.
    pub fn new(cfg: DlrmConfig, seed: u64, dense_opt: &Optimizer) -> Result<Self, ModelError> {
        cfg.validate()?;
        dense_opt.validate()?;
        let layers = cfg.layers();
        let mut values = vec![0.0f32; cfg.param_count()];
        let last = layers.len() - 1;
        for (li, l) in layers.iter().enumerate() {
            let mut bound = (6.0 / (l.input + l.output) as f64).sqrt() as f32;
            if li == last {
                // The output layer starts small, so the first logits are near zero and the
                // initial loss near ln 2 instead of 7-14: large first logits saturate the
                // sigmoid and the Adagrad accumulators, which asynchronous training (two
                // workers computing on the same initial model) does not always recover from.
                bound *= OUTPUT_INIT_SCALE;
            }
            let w = &mut values[l.offset..l.bias_offset()];
            for (r, row) in w.chunks_exact_mut(l.input).enumerate() {
                let mut g = SplitMix::keyed(seed, DENSE_INIT_STREAM + li as u64, r as u64);
                for v in row {
                    *v = (g.next_f32() * 2.0 - 1.0) * bound;
                }
            }
        }
        Ok(Dlrm {
            cfg,
            layers,
            params: DenseParams::new(values, dense_opt),
        })
    }

    /// A model over existing parameters (restored from a checkpoint or pulled from servers).
    pub fn from_params(cfg: DlrmConfig, params: DenseParams) -> Result<Self, ModelError> {
        cfg.validate()?;
        if params.len() != cfg.param_count() {
            return Err(ModelError::ShapeMismatch {
                what: "dense parameters",
                expected: cfg.param_count(),
                got: params.len(),
            });
        }
        Ok(Dlrm {
            layers: cfg.layers(),
            cfg,
            params,
        })
    }

    pub fn config(&self) -> &DlrmConfig {
        &self.cfg
    }

    pub fn params(&self) -> &DenseParams {
        &self.params
    }

    /// Mutable parameters. Keep the length: every method checks it and reports a change as
    /// [`ModelError::ShapeMismatch`].
    pub fn params_mut(&mut self) -> &mut DenseParams {
        &mut self.params
    }

    pub fn into_params(self) -> DenseParams {
        self.params
    }

    /// A workspace already sized for `batch` samples.
    pub fn workspace(&self, batch: usize, threads: usize) -> Result<Workspace, ModelError> {
        let mut ws = Workspace::new(threads)?;
        ws.reserve(&self.cfg, batch);
        Ok(ws)
    }

    fn check_inputs(&self, batch: usize, dense: &[f32], pooled: &[f32]) -> Result<(), ModelError> {
        if batch == 0 {
            return Err(ModelError::Empty("a model step"));
        }
        let cfg = &self.cfg;
        let check = |what, expected: usize, got: usize| {
            if expected == got {
                Ok(())
            } else {
                Err(ModelError::ShapeMismatch {
                    what,
                    expected,
                    got,
                })
            }
        };
        check("dense features", batch * cfg.dense_in, dense.len())?;
        check(
            "pooled embeddings",
            batch * cfg.tables * cfg.dim,
            pooled.len(),
        )?;
        check("dense parameters", cfg.param_count(), self.params.len())
    }

    /// One forward and backward pass.
    ///
    /// `dense`: `[B x dense_in]`, `pooled`: `[B x tables x dim]` (sample-major), `labels`:
    /// `[B]` in `[0, 1]`. Returns the mean loss; fills [`Workspace::grad_params`] (same layout
    /// as the parameter values) and [`Workspace::grad_pooled`] (`[B x tables x dim]`), both
    /// gradients of the mean loss.
    pub fn forward_backward(
        &self,
        ws: &mut Workspace,
        dense: &[f32],
        pooled: &[f32],
        labels: &[f32],
    ) -> Result<f64, ModelError> {
        let batch = labels.len();
        self.check_inputs(batch, dense, pooled)?;
        if let Some((index, &value)) = labels
            .iter()
            .enumerate()
            .find(|(_, l)| !(0.0..=1.0).contains(*l))
        {
            return Err(ModelError::InvalidLabel { index, value });
        }
        ws.prepare(&self.cfg, batch, true);
        self.forward(ws, dense, pooled);
        let loss = self.loss_and_logit_grad(ws, labels);
        self.backward(ws, dense, pooled);
        Ok(loss)
    }

    /// Click probabilities for a batch (`dense` `[B x dense_in]`, `pooled`
    /// `[B x tables x dim]`), written to `out` (cleared first). The workspace's gradients from
    /// the last [`Dlrm::forward_backward`] are left as they were.
    pub fn predict(
        &self,
        ws: &mut Workspace,
        dense: &[f32],
        pooled: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let batch = dense.len() / self.cfg.dense_in;
        self.check_inputs(batch, dense, pooled)?;
        ws.prepare(&self.cfg, batch, false);
        self.forward(ws, dense, pooled);
        out.clear();
        out.extend(ws.logits().iter().map(|&s| sigmoid(s as f64) as f32));
        Ok(())
    }

    /// One optimizer step on the dense parameters with the gradient `grad` (layout of the
    /// values, e.g. [`Workspace::grad_params`] or a sum of workers' gradients), its blocks
    /// spread over up to `threads` threads.
    pub fn apply_gradients(
        &mut self,
        opt: &Optimizer,
        grad: &[f32],
        threads: usize,
    ) -> Result<(), ModelError> {
        if grad.len() != self.params.len() {
            return Err(ModelError::ShapeMismatch {
                what: "dense gradient",
                expected: self.params.len(),
                got: grad.len(),
            });
        }
        let expected = self.params.blocks() * opt.state_words(DENSE_BLOCK);
        if self.params.state.len() != expected {
            return Err(ModelError::OptimizerMismatch {
                optimizer: opt.kind.to_string(),
                expected,
                got: self.params.state.len(),
            });
        }
        // Blocks are independent (`DenseParams::split_mut`): the same bits at any thread count.
        let parts = threads
            .min(self.params.len() / crate::par::MIN_WORK_PER_THREAD)
            .max(1);
        let mut ranges = self.params.split_mut(parts).into_iter();
        let head = ranges.next();
        rayon::in_place_scope(|s| {
            for mut range in ranges {
                s.spawn(move |_| range.apply(opt, grad));
            }
            if let Some(mut range) = head {
                range.apply(opt, grad);
            }
        });
        Ok(())
    }

    fn forward(&self, ws: &mut Workspace, dense: &[f32], pooled: &[f32]) {
        let b = ws.batch;
        let threads = ws.threads;
        let nb = self.cfg.bottom.len();
        let dim = self.cfg.dim;
        let emb_w = self.cfg.tables * dim;
        let iw = self.cfg.interaction_width();
        let sh = kernels::Inter { dim, iw, emb_w };
        let p = &self.params.values;
        for (li, l) in self.layers.iter().enumerate() {
            let (done, rest) = ws.acts.split_at_mut(li);
            let x: &[f32] = match li {
                0 => &dense[..b * l.input],
                _ if li == nb => &ws.top_in[..b * l.input],
                _ => &done[li - 1][..b * l.input],
            };
            let y = &mut rest[0][..b * l.output];
            let w = &p[l.offset..l.bias_offset()];
            let bias = &p[l.bias_offset()..l.end()];
            let relu = l.relu;
            if l.output == 1 {
                // A gemm with one output column wastes most of its micro-kernel; per-sample
                // dots are an order of magnitude faster here.
                par::split1(threads, b, l.input, y, 1, |first, y| {
                    kernels::matvec_bias_act(&x[first * l.input..], w, bias[0], relu, y)
                });
            } else {
                if !gemm::a_bt_bias_act(b, l.input, l.output, x, w, y, bias, relu) {
                    par::split1(threads, b, l.output, y, l.output, |_, rows| {
                        kernels::bias_act(rows, bias, relu)
                    });
                }
            }
            if li + 1 == nb {
                let z0 = &rest[0][..b * dim];
                let top_in = &mut ws.top_in[..b * iw];
                par::split1(threads, b, iw * dim, top_in, iw, |first, out| {
                    kernels::interaction_forward(sh, first, z0, pooled, out)
                });
            }
        }
    }

    /// Mean BCE over the batch from the logits; writes `d loss / d logit` into `grad_a`.
    fn loss_and_logit_grad(&self, ws: &mut Workspace, labels: &[f32]) -> f64 {
        let b = ws.batch;
        let inv_b = 1.0 / b as f64;
        let logits = &ws.acts[self.layers.len() - 1][..b];
        let mut sum = 0.0f64;
        for ((g, &s), &y) in ws.grad_a[..b].iter_mut().zip(logits).zip(labels) {
            let (s, y) = (s as f64, y as f64);
            // max(s, 0) - s*y + log(1 + exp(-|s|)): no overflow for any finite logit.
            sum += s.max(0.0) - s * y + (-s.abs()).exp().ln_1p();
            *g = ((sigmoid(s) - y) * inv_b) as f32;
        }
        sum * inv_b
    }

    fn backward(&self, ws: &mut Workspace, dense: &[f32], pooled: &[f32]) {
        let Workspace {
            threads,
            batch,
            acts,
            top_in,
            grad_a,
            grad_b,
            partials,
            grad_params,
            grad_pooled,
        } = ws;
        let (b, threads) = (*batch, *threads);
        let nb = self.cfg.bottom.len();
        let dim = self.cfg.dim;
        let emb_w = self.cfg.tables * dim;
        let iw = self.cfg.interaction_width();
        let sh = kernels::Inter { dim, iw, emb_w };
        let p = &self.params.values;
        // `g` holds the gradient of the current layer's output, `h` receives its input's.
        let (mut g, mut h) = (grad_a, grad_b);
        for li in (0..self.layers.len()).rev() {
            let l = self.layers[li];
            let gl = &mut g[..b * l.output];
            let (gw, gb) = grad_params[l.offset..l.end()].split_at_mut(l.weights());
            // ReLU backward (mask by the stored activation) fused with the bias gradient.
            let mask = l.relu.then(|| &acts[li][..b * l.output]);
            bias_grad(threads, gl, l.output, mask, partials, gb);
            let gl = &*gl;
            let x: &[f32] = match li {
                0 => &dense[..b * l.input],
                _ if li == nb => &top_in[..b * l.input],
                _ => &acts[li - 1][..b * l.input],
            };
            let w = &p[l.offset..l.bias_offset()];
            if l.output == 1 {
                kernels::outer_sum(gl, x, gw);
            } else {
                gemm::at_b(l.output, b, l.input, gl, x, gw);
            }
            if li == 0 {
                break;
            }
            let hl = &mut h[..b * l.input];
            if l.output == 1 {
                par::split1(threads, b, l.input, hl, l.input, |first, rows| {
                    kernels::scale_rows(&gl[first..], w, rows)
                });
            } else {
                gemm::a_b(b, l.output, l.input, gl, w, hl);
            }
            std::mem::swap(&mut g, &mut h);
            if li == nb {
                // `g` is now d top_in: back through the interaction to z0 and the embeddings.
                let z0 = &acts[nb - 1][..b * dim];
                let gi = &g[..b * iw];
                let dz0 = &mut h[..b * dim];
                let gp = &mut grad_pooled[..b * emb_w];
                par::split2(
                    threads,
                    b,
                    iw * dim * 2,
                    dz0,
                    dim,
                    gp,
                    emb_w,
                    |first, dz, de| {
                        kernels::interaction_backward(sh, first, z0, pooled, gi, dz, de)
                    },
                );
                std::mem::swap(&mut g, &mut h);
            }
        }
    }
}

/// Bias gradient of one layer: column sums of `g` `[B x width]`, after zeroing the entries
/// whose activation in `mask` is not positive (ReLU backward; `g` keeps the masked values).
/// Sums run within fixed blocks of [`BIAS_BLOCK`] rows, then across blocks in order.
fn bias_grad(
    threads: usize,
    g: &mut [f32],
    width: usize,
    mask: Option<&[f32]>,
    partials: &mut [f32],
    db: &mut [f32],
) {
    let rows = g.len() / width;
    let blocks = rows.div_ceil(BIAS_BLOCK);
    let partials = &mut partials[..blocks * width];
    par::split2(
        threads,
        blocks,
        BIAS_BLOCK * width,
        g,
        BIAS_BLOCK * width,
        partials,
        width,
        |first_block, g, part| {
            let mask = mask.map(|m| &m[first_block * BIAS_BLOCK * width..]);
            kernels::mask_and_block_sums(g, mask, width, part)
        },
    );
    db.fill(0.0);
    for part in partials.chunks_exact(width) {
        for (d, v) in db.iter_mut().zip(part) {
            *d += v;
        }
    }
}

/// The per-chunk loops, kept out of line so that profiles name them.
pub(crate) mod kernels {
    use super::BIAS_BLOCK;
    use crate::interaction;

    ftrec_core::simd_kernel! {
        /// `row += bias`, then ReLU if `relu`, for every row.
        pub fn bias_act(rows: &mut [f32], bias: &[f32], relu: bool) {
            for row in rows.chunks_exact_mut(bias.len()) {
                if relu {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        let t = *v + bb;
                        *v = if t > 0.0 { t } else { 0.0 };
                    }
                } else {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        *v += bb;
                    }
                }
            }
        }
    }

    ftrec_core::simd_kernel! {
        /// `y[i] = act(x[i] . w + bias)` for the `y.len()` rows of `x` (row width `w.len()`).
        pub fn matvec_bias_act(x: &[f32], w: &[f32], bias: f32, relu: bool, y: &mut [f32]) {
            for (y, xr) in y.iter_mut().zip(x.chunks_exact(w.len())) {
                let t = interaction::dot(xr, w) + bias;
                *y = if !relu || t > 0.0 { t } else { 0.0 };
            }
        }
    }

    ftrec_core::simd_kernel! {
        /// `out = sum_i g[i] * x[i]` over the rows of `x`, in row order.
        pub fn outer_sum(g: &[f32], x: &[f32], out: &mut [f32]) {
            out.fill(0.0);
            for (gi, xr) in g.iter().zip(x.chunks_exact(out.len())) {
                for (o, xv) in out.iter_mut().zip(xr) {
                    *o += gi * xv;
                }
            }
        }
    }

    ftrec_core::simd_kernel! {
        /// Row `i` of `rows` = `g[i] * w`.
        pub fn scale_rows(g: &[f32], w: &[f32], rows: &mut [f32]) {
            for (gi, row) in g.iter().zip(rows.chunks_exact_mut(w.len())) {
                for (r, wv) in row.iter_mut().zip(w) {
                    *r = gi * wv;
                }
            }
        }
    }

    ftrec_core::simd_kernel! {
        /// For each block of [`BIAS_BLOCK`] rows of `g`: zero the entries whose `mask` entry is not
        /// positive, and write the block's column sums to the block's row of `part`.
        pub fn mask_and_block_sums(
            g: &mut [f32],
            mask: Option<&[f32]>,
            width: usize,
            part: &mut [f32],
        ) {
            for (bi, (gblock, acc)) in g
                .chunks_mut(BIAS_BLOCK * width)
                .zip(part.chunks_exact_mut(width))
                .enumerate()
            {
                acc.fill(0.0);
                match mask {
                    Some(mask) => {
                        let mblock = &mask[bi * BIAS_BLOCK * width..];
                        for (grow, mrow) in gblock
                            .chunks_exact_mut(width)
                            .zip(mblock.chunks_exact(width))
                        {
                            for ((gv, m), s) in grow.iter_mut().zip(mrow).zip(acc.iter_mut()) {
                                let v = if *m > 0.0 { *gv } else { 0.0 };
                                *gv = v;
                                *s += v;
                            }
                        }
                    }
                    None => {
                        for grow in gblock.chunks_exact(width) {
                            for (gv, s) in grow.iter().zip(acc.iter_mut()) {
                                *s += gv;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Widths of one sample's interaction buffers.
    #[derive(Debug, Clone, Copy)]
    pub struct Inter {
        /// Embedding dim.
        pub dim: usize,
        /// Interaction output width.
        pub iw: usize,
        /// Pooled embeddings per sample (`tables * dim`).
        pub emb_w: usize,
    }

    ftrec_core::simd_kernel! {
        /// Interaction forward for the samples of `out` (starting at sample `first`).
        pub fn interaction_forward(
            sh: Inter,
            first: usize,
            z0: &[f32],
            pooled: &[f32],
            out: &mut [f32],
        ) {
            let Inter { dim, iw, emb_w } = sh;
            #[cfg(target_arch = "x86_64")]
            if interaction::avx512::serves(dim, emb_w / dim.max(1) + 1) {
                for (i, o) in out.chunks_exact_mut(iw).enumerate() {
                    let s = first + i;
                    // SAFETY: `serves` checked the CPU and the shape.
                    unsafe {
                        interaction::avx512::forward(
                            &z0[s * dim..(s + 1) * dim],
                            &pooled[s * emb_w..(s + 1) * emb_w],
                            o,
                        )
                    };
                }
                return;
            }
            // Each sample gets the rest of `out`: the scratch it may write past its own
            // width lands on the next sample's, which is written after it.
            for i in 0..out.len() / iw.max(1) {
                let s = first + i;
                interaction::forward(
                    dim,
                    &z0[s * dim..(s + 1) * dim],
                    &pooled[s * emb_w..(s + 1) * emb_w],
                    &mut out[i * iw..],
                );
            }
        }
    }

    ftrec_core::simd_kernel! {
        /// Interaction backward for the samples of `dz` / `de` (starting at sample `first`).
        pub fn interaction_backward(
            sh: Inter,
            first: usize,
            z0: &[f32],
            pooled: &[f32],
            g: &[f32],
            dz: &mut [f32],
            de: &mut [f32],
        ) {
            let Inter { dim, iw, emb_w } = sh;
            #[cfg(target_arch = "x86_64")]
            let vector = interaction::avx512::serves(dim, emb_w / dim.max(1) + 1);
            for (i, (dz, de)) in dz
                .chunks_exact_mut(dim)
                .zip(de.chunks_exact_mut(emb_w))
                .enumerate()
            {
                let s = first + i;
                #[cfg(target_arch = "x86_64")]
                if vector {
                    // SAFETY: `serves` checked the CPU and the shape.
                    unsafe {
                        interaction::avx512::backward(
                            &z0[s * dim..(s + 1) * dim],
                            &pooled[s * emb_w..(s + 1) * emb_w],
                            &g[s * iw..(s + 1) * iw],
                            dz,
                            de,
                        )
                    };
                    continue;
                }
                interaction::backward(
                    dim,
                    &z0[s * dim..(s + 1) * dim],
                    &pooled[s * emb_w..(s + 1) * emb_w],
                    &g[s * iw..(s + 1) * iw],
                    dz,
                    de,
                );
            }
        }
    }
}

#[inline]
fn sigmoid(s: f64) -> f64 {
    if s >= 0.0 {
        1.0 / (1.0 + (-s).exp())
    } else {
        let e = s.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::auc;
    use ftrec_core::OptimizerKind;

    fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        let mut g = SplitMix::new(seed);
        (0..n).map(|_| lo + (hi - lo) * g.next_f32()).collect()
    }

    fn sgd() -> Optimizer {
        Optimizer::new(OptimizerKind::Sgd, 0.1)
    }

    /// An independent f64 reference of the model: plain loops, no workspace, no threads.
    /// Returns (mean loss, logits, smallest |pre-activation| of any ReLU unit).
    fn reference(
        cfg: &DlrmConfig,
        p: &[f64],
        dense: &[f64],
        pooled: &[f64],
        labels: &[f64],
    ) -> (f64, Vec<f64>, f64) {
        let b = labels.len();
        let layers = cfg.layers();
        let mut min_pre = f64::INFINITY;
        let linear = |l: &LayerShape, x: &[f64], min_pre: &mut f64| -> Vec<f64> {
            (0..l.output)
                .map(|o| {
                    let mut s = p[l.bias_offset() + o];
                    for i in 0..l.input {
                        s += p[l.offset + o * l.input + i] * x[i];
                    }
                    if l.relu {
                        *min_pre = min_pre.min(s.abs());
                        s.max(0.0)
                    } else {
                        s
                    }
                })
                .collect()
        };
        let (mut loss, mut logits) = (0.0, Vec::new());
        let t = cfg.tables;
        let d = cfg.dim;
        for s in 0..b {
            let mut x = dense[s * cfg.dense_in..(s + 1) * cfg.dense_in].to_vec();
            for l in &layers[..cfg.bottom.len()] {
                x = linear(l, &x, &mut min_pre);
            }
            let mut vecs = vec![x.clone()];
            for k in 0..t {
                vecs.push(pooled[(s * t + k) * d..(s * t + k + 1) * d].to_vec());
            }
            let mut top = x;
            for a in 0..=t {
                for c in a + 1..=t {
                    top.push((0..d).map(|i| vecs[a][i] * vecs[c][i]).sum());
                }
            }
            for l in &layers[cfg.bottom.len()..] {
                top = linear(l, &top, &mut min_pre);
            }
            let z = top[0];
            let y = labels[s];
            let prob = 1.0 / (1.0 + (-z).exp());
            loss -= y * prob.ln() + (1.0 - y) * (1.0 - prob).ln();
            logits.push(z);
        }
        (loss / b as f64, logits, min_pre)
    }

    fn to64(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    fn small_cfg() -> DlrmConfig {
        DlrmConfig {
            dense_in: 3,
            bottom: vec![6, 4],
            top: vec![5, 3, 1],
            tables: 3,
            dim: 4,
        }
    }

    /// Check analytic gradients against central differences of the f64 reference, per
    /// parameter group (each layer's weights and bias) and for the pooled inputs. Dim 4 runs
    /// the generic interaction, dim 8 the unrolled one.
    #[test]
    fn gradients_match_finite_differences() {
        check_gradients(small_cfg());
        check_gradients(DlrmConfig {
            dense_in: 2,
            bottom: vec![5, 8],
            top: vec![4, 1],
            tables: 2,
            dim: 8,
        });
    }

    fn check_gradients(cfg: DlrmConfig) {
        let b = 5;
        let mut model = Dlrm::new(cfg.clone(), 3, &sgd()).unwrap();
        // Random biases too, so that no ReLU sits at its kink.
        let n = model.params().len();
        model.params_mut().values = uniform(11, n, -0.6, 0.6);
        let dense = uniform(12, b * cfg.dense_in, -1.0, 1.0);
        let pooled = uniform(13, b * cfg.tables * cfg.dim, -0.8, 0.8);
        let labels = [1.0, 0.0, 0.3, 1.0, 0.0];
        let mut ws = Workspace::new(1).unwrap();
        let loss = model
            .forward_backward(&mut ws, &dense, &pooled, &labels)
            .unwrap();

        let p64 = to64(&model.params().values);
        let (d64, e64, l64) = (to64(&dense), to64(&pooled), to64(&labels));
        let (ref_loss, _, min_pre) = reference(&cfg, &p64, &d64, &e64, &l64);
        assert!(
            min_pre > 1e-4,
            "a ReLU input is {min_pre}, too close to its kink"
        );
        assert!(
            (loss - ref_loss).abs() < 1e-5 * ref_loss,
            "{loss} vs {ref_loss}"
        );

        let h = 1e-6;
        let close = |what: String, got: f32, want: f64| {
            let err = (got as f64 - want).abs();
            assert!(
                err <= 1e-3 * want.abs() + 2e-6,
                "{what}: analytic {got}, numeric {want}"
            );
        };
        let mut groups = Vec::new();
        for (li, l) in cfg.layers().iter().enumerate() {
            groups.push((format!("layer {li} weight"), l.offset..l.bias_offset()));
            groups.push((format!("layer {li} bias"), l.bias_offset()..l.end()));
        }
        for (name, range) in groups {
            let mut nonzero = 0;
            for i in range {
                let mut p = p64.clone();
                p[i] += h;
                let up = reference(&cfg, &p, &d64, &e64, &l64).0;
                p[i] -= 2.0 * h;
                let down = reference(&cfg, &p, &d64, &e64, &l64).0;
                let fd = (up - down) / (2.0 * h);
                close(format!("{name} [{i}]"), ws.grad_params()[i], fd);
                nonzero += usize::from(fd.abs() > 1e-6);
            }
            assert!(
                nonzero > 0,
                "{name}: every gradient is zero, the check proves nothing"
            );
        }
        for i in 0..e64.len() {
            let mut e = e64.clone();
            e[i] += h;
            let up = reference(&cfg, &p64, &d64, &e, &l64).0;
            e[i] -= 2.0 * h;
            let down = reference(&cfg, &p64, &d64, &e, &l64).0;
            close(
                format!("pooled [{i}]"),
                ws.grad_pooled()[i],
                (up - down) / (2.0 * h),
            );
        }
    }

    #[test]
    fn predict_is_the_sigmoid_of_the_reference_logits() {
        let cfg = small_cfg();
        let model = Dlrm::new(cfg.clone(), 5, &sgd()).unwrap();
        let b = 9;
        let dense = uniform(1, b * cfg.dense_in, 0.0, 2.0);
        let pooled = uniform(2, b * cfg.tables * cfg.dim, -0.5, 0.5);
        let mut ws = Workspace::new(2).unwrap();
        let mut out = vec![7.0; 3];
        model.predict(&mut ws, &dense, &pooled, &mut out).unwrap();
        let (_, logits, _) = reference(
            &cfg,
            &to64(&model.params().values),
            &to64(&dense),
            &to64(&pooled),
            &[0.0; 9],
        );
        assert_eq!(out.len(), b);
        for (p, z) in out.iter().zip(&logits) {
            assert!((*p as f64 - 1.0 / (1.0 + (-z).exp())).abs() < 1e-6);
        }
    }

    fn mid_cfg() -> DlrmConfig {
        DlrmConfig {
            dense_in: 13,
            bottom: vec![128, 64, 16],
            top: vec![128, 64, 1],
            tables: 26,
            dim: 16,
        }
    }

    fn mid_inputs(cfg: &DlrmConfig, b: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let dense = uniform(21, b * cfg.dense_in, 0.0, 3.0);
        let pooled = uniform(22, b * cfg.tables * cfg.dim, -0.3, 0.3);
        let labels = uniform(23, b, 0.0, 1.0)
            .into_iter()
            .map(|u| (u < 0.3) as u8 as f32)
            .collect();
        (dense, pooled, labels)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn results_are_bit_identical_for_every_thread_count() {
        let cfg = mid_cfg();
        let model = Dlrm::new(cfg.clone(), 9, &sgd()).unwrap();
        // Not a multiple of BIAS_BLOCK, and large enough that every pass really splits.
        let b = 700;
        let (dense, pooled, labels) = mid_inputs(&cfg, b);
        let run = |threads: usize| {
            let mut ws = Workspace::new(threads).unwrap();
            let loss = model
                .forward_backward(&mut ws, &dense, &pooled, &labels)
                .unwrap();
            let mut probs = Vec::new();
            model.predict(&mut ws, &dense, &pooled, &mut probs).unwrap();
            (
                loss.to_bits(),
                bits(ws.grad_params()),
                bits(ws.grad_pooled()),
                bits(&probs),
            )
        };
        let one = run(1);
        assert!(one.1.iter().any(|&g| g != 0) && one.2.iter().any(|&g| g != 0));
        for threads in [2, 3, 5] {
            assert!(run(threads) == one, "{threads} threads differ from one");
        }
    }

    #[test]
    fn workspace_is_reused_and_carries_nothing_between_steps() {
        let cfg = mid_cfg();
        let model = Dlrm::new(cfg.clone(), 4, &sgd()).unwrap();
        let (dense, pooled, labels) = mid_inputs(&cfg, 300);
        let mut ws = model.workspace(300, 2).unwrap();
        let before = ws.buffer_fingerprint();
        model
            .forward_backward(&mut ws, &dense, &pooled, &labels)
            .unwrap();
        assert_eq!(
            ws.buffer_fingerprint(),
            before,
            "a step at the reserved batch reallocated"
        );
        let b = 100;
        let (d, p, l) = (&dense[..b * 13], &pooled[..b * 26 * 16], &labels[..b]);
        let loss = model.forward_backward(&mut ws, d, p, l).unwrap();
        assert_eq!(
            ws.buffer_fingerprint(),
            before,
            "a smaller batch reallocated"
        );
        assert_eq!(ws.grad_pooled().len(), b * 26 * 16);
        assert_eq!(ws.logits().len(), b);
        let grads_before = bits(ws.grad_pooled());
        model
            .predict(&mut ws, &dense[..13], &pooled[..26 * 16], &mut Vec::new())
            .unwrap();
        assert_eq!(
            bits(ws.grad_pooled()),
            grads_before,
            "predict touched the gradients"
        );
        let mut fresh = Workspace::new(2).unwrap();
        let fresh_loss = model.forward_backward(&mut fresh, d, p, l).unwrap();
        assert_eq!(loss.to_bits(), fresh_loss.to_bits());
        assert_eq!(bits(ws.grad_params()), bits(fresh.grad_params()));
        assert_eq!(bits(ws.grad_pooled()), bits(fresh.grad_pooled()));
    }

    #[test]
    fn init_is_seeded_and_scaled() {
        let cfg = mid_cfg();
        let a = Dlrm::new(cfg.clone(), 1, &sgd()).unwrap();
        let b = Dlrm::new(cfg.clone(), 1, &sgd()).unwrap();
        let c = Dlrm::new(cfg.clone(), 2, &sgd()).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.params().values, c.params().values);
        let layers = cfg.layers();
        for (li, l) in layers.iter().enumerate() {
            let w = &a.params().values[l.offset..l.bias_offset()];
            let mut bound = (6.0 / (l.input + l.output) as f32).sqrt();
            if li == layers.len() - 1 {
                bound *= OUTPUT_INIT_SCALE;
            }
            assert!(
                w.iter().all(|v| v.abs() <= bound),
                "layer {li} exceeds its bound"
            );
            let mean_sq = w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
            // Uniform on [-bound, bound] has variance bound^2 / 3.
            assert!(
                (mean_sq / (bound * bound / 3.0) - 1.0).abs() < 0.3,
                "layer {li}"
            );
            assert!(a.params().values[l.bias_offset()..l.end()]
                .iter()
                .all(|&v| v == 0.0));
        }
    }

    #[test]
    fn bad_shapes_and_labels_are_errors() {
        let cfg = small_cfg();
        let mut model = Dlrm::new(cfg.clone(), 1, &sgd()).unwrap();
        let mut ws = Workspace::new(1).unwrap();
        let dense = vec![0.5; 2 * 3];
        let pooled = vec![0.1; 2 * 3 * 4];
        assert!(matches!(
            model.forward_backward(&mut ws, &dense[..5], &pooled, &[0.0, 1.0]),
            Err(ModelError::ShapeMismatch {
                what: "dense features",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            model.forward_backward(&mut ws, &dense, &pooled[1..], &[0.0, 1.0]),
            Err(ModelError::ShapeMismatch {
                what: "pooled embeddings",
                ..
            })
        ));
        assert!(matches!(
            model.forward_backward(&mut ws, &dense, &pooled, &[0.0, f32::NAN]),
            Err(ModelError::InvalidLabel { index: 1, .. })
        ));
        assert!(matches!(
            model.forward_backward(&mut ws, &[], &[], &[]),
            Err(ModelError::Empty(_))
        ));
        assert!(matches!(
            model.predict(&mut ws, &dense[..4], &pooled, &mut Vec::new()),
            Err(ModelError::ShapeMismatch {
                what: "dense features",
                ..
            })
        ));
        assert!(matches!(
            Workspace::new(0),
            Err(ModelError::InvalidThreads(0))
        ));
        let n = model.params().len();
        assert!(matches!(
            model.apply_gradients(&sgd(), &vec![0.0; n - 1], 1),
            Err(ModelError::ShapeMismatch {
                what: "dense gradient",
                ..
            })
        ));
        let adam = Optimizer::new(OptimizerKind::Adam, 0.01);
        assert!(matches!(
            model.apply_gradients(&adam, &vec![0.0; n], 1),
            Err(ModelError::OptimizerMismatch { .. })
        ));
        model.params_mut().values.pop();
        assert!(matches!(
            model.forward_backward(&mut ws, &dense, &pooled, &[0.0, 1.0]),
            Err(ModelError::ShapeMismatch {
                what: "dense parameters",
                ..
            })
        ));
        let bad = DlrmConfig {
            top: vec![4],
            ..cfg.clone()
        };
        assert!(matches!(
            Dlrm::new(bad, 1, &sgd()),
            Err(ModelError::InvalidConfig(_))
        ));
        let p = Dlrm::new(cfg.clone(), 1, &sgd()).unwrap().into_params();
        let other = DlrmConfig {
            bottom: vec![7, 4],
            ..cfg
        };
        assert!(matches!(
            Dlrm::from_params(other, p),
            Err(ModelError::ShapeMismatch {
                what: "dense parameters",
                ..
            })
        ));
    }

    /// End to end: the gradients drive an optimizer to fit a planted rule that needs both the
    /// dense path and the interaction.
    #[test]
    fn training_fits_a_planted_rule() {
        let cfg = DlrmConfig {
            dense_in: 4,
            bottom: vec![16, 4],
            top: vec![16, 1],
            tables: 2,
            dim: 4,
        };
        let opt = Optimizer::new(OptimizerKind::Adagrad, 0.05);
        let mut model = Dlrm::new(cfg.clone(), 8, &opt).unwrap();
        let b = 128;
        let make = |seed: u64| {
            let dense = uniform(seed, b * 4, -1.0, 1.0);
            let pooled = uniform(seed + 1, b * 2 * 4, -1.0, 1.0);
            let labels: Vec<f32> = (0..b)
                .map(|s| {
                    let e = &pooled[s * 8..s * 8 + 8];
                    let dot: f32 = (0..4).map(|i| e[i] * e[4 + i]).sum();
                    (dense[s * 4] + dot > 0.0) as u8 as f32
                })
                .collect();
            (dense, pooled, labels)
        };
        let mut ws = Workspace::new(1).unwrap();
        let (d0, p0, l0) = make(1000);
        let first = model.forward_backward(&mut ws, &d0, &p0, &l0).unwrap();
        for step in 0..400u64 {
            let (d, p, l) = make(2 * step + 1);
            model.forward_backward(&mut ws, &d, &p, &l).unwrap();
            model.apply_gradients(&opt, ws.grad_params(), 1).unwrap();
        }
        let last = model.forward_backward(&mut ws, &d0, &p0, &l0).unwrap();
        let mut probs = Vec::new();
        model.predict(&mut ws, &d0, &p0, &mut probs).unwrap();
        let a = auc(&probs, &l0).unwrap();
        assert!(last < 0.5 * first, "held-out loss {first} -> {last}");
        assert!(a > 0.95, "held-out AUC {a}");
    }
}

//! Optimizers as pure functions on one row.
//!
//! A row is `[values (dim) | state (state_words)]`. [`Optimizer::apply`] takes the row and the
//! row's gradient, already summed over every occurrence of the row in the batch, and performs
//! exactly one update. The same functions update dense parameters (one "row" per neuron) on a
//! trainer and rows on a parameter server, so the optimizer math exists once.
//!
//! State layouts (words after the `dim` values):
//! - `sgd`: none.
//! - `momentum`: velocity (dim). `v = mu*v + g; w -= lr*v` (PyTorch's form).
//! - `adagrad`: accumulator (dim). `a += g^2; w -= lr*g/(sqrt(a0+a)+eps)`.
//! - `rowwise_adagrad`: one accumulator per row. `a += mean(g^2); w -= lr*g/(sqrt(a0+a)+eps)`
//!   (the FBGEMM / DLRM form: one state word per row instead of `dim`).
//!
//!   `a0` is [`Optimizer::initial_accumulator`], 0 unless asked for: the value every
//!   accumulator is taken to start from (TensorFlow's `initial_accumulator_value`). The state
//!   holds the sum of squares alone, so a checkpoint's state does not depend on it.
//! - `adam`: m (dim), v (dim), step (1 word holding a `u32`'s bits). The step count is per row,
//!   as in sparse ("lazy") Adam: a row is corrected by the number of updates it has received.

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// Which update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Sgd,
    Momentum,
    Adagrad,
    RowWiseAdagrad,
    Adam,
}

impl OptimizerKind {
    pub const ALL: [OptimizerKind; 5] = [
        OptimizerKind::Sgd,
        OptimizerKind::Momentum,
        OptimizerKind::Adagrad,
        OptimizerKind::RowWiseAdagrad,
        OptimizerKind::Adam,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adagrad => "adagrad",
            OptimizerKind::RowWiseAdagrad => "rowwise_adagrad",
            OptimizerKind::Adam => "adam",
        }
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "sgd" => Ok(OptimizerKind::Sgd),
            "momentum" | "momentum_sgd" => Ok(OptimizerKind::Momentum),
            "adagrad" => Ok(OptimizerKind::Adagrad),
            "rowwise_adagrad" | "row_wise_adagrad" => Ok(OptimizerKind::RowWiseAdagrad),
            "adam" => Ok(OptimizerKind::Adam),
            _ => Err(CoreError::UnknownOptimizer(s.to_string())),
        }
    }
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An update rule with its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Optimizer {
    pub kind: OptimizerKind,
    pub lr: f32,
    /// Momentum coefficient (momentum).
    pub momentum: f32,
    /// Adam's beta1 / beta2.
    pub beta1: f32,
    pub beta2: f32,
    /// Added to the denominator (adagrad, rowwise_adagrad, adam).
    pub eps: f32,
    /// Adagrad and row-wise Adagrad: added to every accumulator under the square root, as if
    /// it had started there. At 0 (the default) each of a value's first Adagrad steps is about
    /// the learning rate whatever the gradient's size, and asynchronous workers, whose first
    /// updates all come from the initial model, take several such steps in one direction;
    /// with it a small gradient takes a small step. Written out only when set, so records
    /// without it read and write as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub initial_accumulator: f32,
}

fn is_zero(x: &f32) -> bool {
    *x == 0.0
}

impl Optimizer {
    /// `kind` with learning rate `lr` and the usual defaults for the rest.
    pub fn new(kind: OptimizerKind, lr: f32) -> Self {
        Optimizer {
            kind,
            lr,
            momentum: 0.9,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            initial_accumulator: 0.0,
        }
    }

    /// The same rule with every Adagrad accumulator starting from `a0`
    /// ([`Optimizer::initial_accumulator`]).
    pub fn with_initial_accumulator(self, a0: f32) -> Self {
        Optimizer {
            initial_accumulator: a0,
            ..self
        }
    }

    /// Check the hyper-parameters; a bad value names itself.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |what: &str, v: f32| {
            Err(CoreError::InvalidConfig(format!(
                "optimizer {what} = {v} is out of range"
            )))
        };
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("learning rate", self.lr);
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad("momentum", self.momentum);
        }
        if !(0.0..1.0).contains(&self.beta1) {
            return bad("beta1", self.beta1);
        }
        if !(0.0..1.0).contains(&self.beta2) {
            return bad("beta2", self.beta2);
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad("eps", self.eps);
        }
        let a0 = self.initial_accumulator;
        if !(a0.is_finite() && a0 >= 0.0) {
            return bad("initial accumulator", a0);
        }
        if a0 > 0.0 && !self.is_adagrad() {
            return Err(CoreError::InvalidConfig(format!(
                "an initial accumulator ({a0}) applies to adagrad and rowwise_adagrad only, not \
                 to {}: drop it or choose one of those",
                self.kind
            )));
        }
        Ok(())
    }

    fn is_adagrad(&self) -> bool {
        matches!(
            self.kind,
            OptimizerKind::Adagrad | OptimizerKind::RowWiseAdagrad
        )
    }

    /// Number of state words that follow `dim` values in a row.
    pub fn state_words(&self, dim: usize) -> usize {
        match self.kind {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Momentum | OptimizerKind::Adagrad => dim,
            OptimizerKind::RowWiseAdagrad => 1,
            OptimizerKind::Adam => 2 * dim + 1,
        }
    }

    /// One update of `row` (= `dim` values then the state words) by `grad` (`dim` long).
    ///
    /// Panics only on a row or gradient of the wrong length, a caller bug that the layout
    /// rules out.
    pub fn apply(&self, row: &mut [f32], dim: usize, grad: &[f32]) {
        let (w, state) = row.split_at_mut(dim);
        self.apply_split(w, state, grad);
    }

    /// [`Optimizer::apply`] with values and state in separate slices (dense parameters keep
    /// their values contiguous for the matrix kernels and their state apart).
    pub fn apply_split(&self, w: &mut [f32], state: &mut [f32], grad: &[f32]) {
        let dim = w.len();
        assert_eq!(grad.len(), dim, "gradient length");
        assert_eq!(state.len(), self.state_words(dim), "state length");
        update(self, w, state, grad);
    }

    /// The number of updates an Adam row has received (0 for other optimizers).
    pub fn adam_step(&self, row: &[f32], dim: usize) -> u32 {
        match self.kind {
            OptimizerKind::Adam => row[dim + 2 * dim].to_bits(),
            _ => 0,
        }
    }
}

crate::simd_kernel! {
    /// The body of [`Optimizer::apply_split`] (lengths checked there), compiled for AVX-512F,
    /// AVX2 and the baseline: element-wise, so every copy gives the same bits.
    fn update(opt: &Optimizer, w: &mut [f32], state: &mut [f32], grad: &[f32]) {
        let dim = w.len();
        let lr = opt.lr;
        match opt.kind {
            OptimizerKind::Sgd => {
                for (w, g) in w.iter_mut().zip(grad) {
                    *w -= lr * g;
                }
            }
            OptimizerKind::Momentum => {
                let mu = opt.momentum;
                for ((w, v), g) in w.iter_mut().zip(state.iter_mut()).zip(grad) {
                    *v = mu * *v + g;
                    *w -= lr * *v;
                }
            }
            OptimizerKind::Adagrad => {
                // `a0 + a` is `a` bit for bit at `a0` = 0 (a sum of squares is never -0.0): the
                // update without an initial accumulator is the one before it existed.
                let a0 = opt.initial_accumulator;
                for ((w, a), g) in w.iter_mut().zip(state.iter_mut()).zip(grad) {
                    *a += g * g;
                    *w -= lr * g / ((a0 + *a).sqrt() + opt.eps);
                }
            }
            OptimizerKind::RowWiseAdagrad => {
                let mean_sq = grad.iter().map(|g| g * g).sum::<f32>() / dim as f32;
                state[0] += mean_sq;
                let scale = lr / ((opt.initial_accumulator + state[0]).sqrt() + opt.eps);
                for (w, g) in w.iter_mut().zip(grad) {
                    *w -= scale * g;
                }
            }
            OptimizerKind::Adam => {
                let (m, rest) = state.split_at_mut(dim);
                let (v, step) = rest.split_at_mut(dim);
                let t = step[0].to_bits().wrapping_add(1);
                step[0] = f32::from_bits(t);
                let (b1, b2) = (opt.beta1, opt.beta2);
                let c1 = 1.0 - b1.powi(t as i32);
                let c2 = 1.0 - b2.powi(t as i32);
                let step_size = lr * c2.sqrt() / c1;
                for i in 0..dim {
                    let g = grad[i];
                    m[i] = b1 * m[i] + (1.0 - b1) * g;
                    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                    w[i] -= step_size * m[i] / (v[i].sqrt() + opt.eps * c2.sqrt());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
    }

    #[test]
    fn sgd_hand_computed() {
        let o = Optimizer::new(OptimizerKind::Sgd, 0.5);
        let mut row = vec![1.0, -2.0];
        o.apply(&mut row, 2, &[0.2, -0.4]);
        close(row[0], 0.9);
        close(row[1], -1.8);
    }

    #[test]
    fn momentum_hand_computed() {
        let o = Optimizer::new(OptimizerKind::Momentum, 0.1);
        // step 1: v = 2, w = 1 - 0.2 = 0.8
        let mut row1 = vec![1.0, 0.0];
        o.apply(&mut row1, 1, &[2.0]);
        close(row1[0], 0.8);
        close(row1[1], 2.0);
        // step 2: v = 0.9*2 + 1 = 2.8, w = 0.8 - 0.28 = 0.52
        o.apply(&mut row1, 1, &[1.0]);
        close(row1[1], 2.8);
        close(row1[0], 0.52);
    }

    #[test]
    fn an_initial_accumulator_starts_adagrad_from_it() {
        // a0 = 1, g = 0.5: a = 0.25, w = 1 - 0.1 * 0.5 / sqrt(1.25); without it the step is
        // 0.1 * 0.5 / 0.5 = 0.1, the full rate.
        let o = Optimizer::new(OptimizerKind::Adagrad, 0.1).with_initial_accumulator(1.0);
        let mut row = vec![1.0, 0.0];
        o.apply(&mut row, 1, &[0.5]);
        close(row[1], 0.25);
        close(row[0], 1.0 - 0.05 / 1.25f32.sqrt());
        let o = Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.1).with_initial_accumulator(1.0);
        let mut row = vec![1.0, 1.0, 0.0];
        o.apply(&mut row, 2, &[0.5, 0.5]);
        close(row[2], 0.25);
        close(row[0], 1.0 - 0.05 / 1.25f32.sqrt());
        // At 0 the update is bit for bit the one of an optimizer that never had the field.
        let plain = Optimizer::new(OptimizerKind::Adagrad, 0.1);
        let mut a = vec![0.3f32, 0.0];
        plain.apply(&mut a, 1, &[0.7]);
        let expect = 0.3f32 - 0.1 * 0.7 / ((0.7f32 * 0.7).sqrt() + 1e-8);
        assert_eq!(a[0].to_bits(), expect.to_bits());
    }

    #[test]
    fn an_initial_accumulator_is_refused_where_it_means_nothing() {
        let e = Optimizer::new(OptimizerKind::Sgd, 0.1)
            .with_initial_accumulator(0.1)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("adagrad") && e.contains("sgd"), "{e}");
        for bad in [-0.1, f32::NAN, f32::INFINITY] {
            let e = Optimizer::new(OptimizerKind::Adagrad, 0.1)
                .with_initial_accumulator(bad)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains("initial accumulator"), "{e}");
        }
        // Written out only when set: a record without it reads back the same.
        let o = Optimizer::new(OptimizerKind::Adagrad, 0.1);
        let json = serde_json::to_string(&o).unwrap();
        assert!(!json.contains("initial_accumulator"), "{json}");
        assert_eq!(serde_json::from_str::<Optimizer>(&json).unwrap(), o);
        let o = o.with_initial_accumulator(0.1);
        let back: Optimizer = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn adagrad_hand_computed() {
        let mut o = Optimizer::new(OptimizerKind::Adagrad, 0.1);
        o.eps = 0.0;
        let mut row = vec![1.0, 1.0, 0.0, 0.0];
        o.apply(&mut row, 2, &[3.0, -4.0]);
        // a = [9, 16]; w -= 0.1 * g / sqrt(a) = 0.1 * [1, -1]
        close(row[0], 0.9);
        close(row[1], 1.1);
        close(row[2], 9.0);
        close(row[3], 16.0);
        o.apply(&mut row, 2, &[4.0, 0.0]);
        // a0 = 25, w0 -= 0.1 * 4/5 = 0.08
        close(row[0], 0.82);
        close(row[2], 25.0);
        close(row[1], 1.1);
    }

    #[test]
    fn rowwise_adagrad_hand_computed() {
        let mut o = Optimizer::new(OptimizerKind::RowWiseAdagrad, 1.0);
        o.eps = 0.0;
        let mut row = vec![0.0, 0.0, 0.0];
        o.apply(&mut row, 2, &[3.0, 4.0]);
        // mean(g^2) = 12.5 ; scale = 1/sqrt(12.5)
        close(row[2], 12.5);
        let s = 1.0 / 12.5f32.sqrt();
        close(row[0], -3.0 * s);
        close(row[1], -4.0 * s);
    }

    #[test]
    fn adam_hand_computed() {
        let mut o = Optimizer::new(OptimizerKind::Adam, 0.001);
        o.eps = 0.0;
        let mut row = vec![0.5, 0.0, 0.0, 0.0];
        o.apply(&mut row, 1, &[2.0]);
        // t=1: m = 0.2, v = 0.004; mhat = 2, vhat = 4; w -= 0.001 * 2/2 = 0.001
        close(row[0], 0.499);
        close(row[1], 0.2);
        close(row[2], 0.004);
        assert_eq!(o.adam_step(&row, 1), 1);
        o.apply(&mut row, 1, &[2.0]);
        // t=2: m = 0.38, v = 0.007996; mhat = 2, vhat = 4 => again -0.001
        close(row[0], 0.498);
        assert_eq!(o.adam_step(&row, 1), 2);
    }

    #[test]
    fn parse_names() {
        for k in OptimizerKind::ALL {
            assert_eq!(k.name().parse::<OptimizerKind>().unwrap(), k);
        }
        assert!(matches!(
            "rmsprop".parse::<OptimizerKind>(),
            Err(CoreError::UnknownOptimizer(_))
        ));
    }

    #[test]
    fn validate_rejects_bad_lr() {
        let mut o = Optimizer::new(OptimizerKind::Sgd, 0.1);
        assert!(o.validate().is_ok());
        o.lr = -1.0;
        assert!(o.validate().is_err());
        o.lr = f32::NAN;
        assert!(o.validate().is_err());
    }
}

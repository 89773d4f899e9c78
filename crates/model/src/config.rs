//! The model shape.

use ftrec_core::Preset;

use crate::ModelError;

/// Shape of the DLRM dense part.
///
/// `bottom` lists the bottom MLP's layer widths after the `dense_in` inputs and must end at
/// `dim` (the interaction dots the bottom output with embedding vectors); `top` lists the top
/// MLP's widths after the interaction and must end at 1 (the click logit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlrmConfig {
    pub dense_in: usize,
    pub bottom: Vec<usize>,
    pub top: Vec<usize>,
    /// Embedding tables (one pooled vector each per sample).
    pub tables: usize,
    /// Embedding dim.
    pub dim: usize,
}

/// One linear layer's place in the flat parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerShape {
    pub input: usize,
    pub output: usize,
    /// Offset of the weight `[output x input]` (row-major); the bias `[output]` follows it.
    pub offset: usize,
    pub relu: bool,
}

impl LayerShape {
    pub fn weights(&self) -> usize {
        self.input * self.output
    }

    pub fn bias_offset(&self) -> usize {
        self.offset + self.weights()
    }

    pub fn end(&self) -> usize {
        self.bias_offset() + self.output
    }
}

/// One linear layer of the dense part, as [`DlrmConfig::linear_layers`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearLayer {
    /// Of the top MLP (else the bottom MLP).
    pub top: bool,
    /// Index within its MLP, from 0.
    pub index: usize,
    pub input: usize,
    pub output: usize,
    /// Offset of the weight `[output x input]` (row-major) in the flat parameter vector.
    pub weight_offset: usize,
    /// Offset of the bias `[output]`.
    pub bias_offset: usize,
    /// A ReLU follows it (every layer but the top MLP's last).
    pub relu: bool,
}

impl DlrmConfig {
    /// The shape a workload preset trains.
    pub fn from_preset(p: &Preset) -> Self {
        DlrmConfig {
            dense_in: p.dense_features(),
            bottom: p.mlp.bottom.clone(),
            top: p.mlp.top.clone(),
            tables: p.table_rows.len(),
            dim: p.dim,
        }
    }

    /// Check the shape rules; a violation names itself.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::InvalidConfig(m));
        if self.dense_in == 0 {
            return bad("the model needs at least one dense input".into());
        }
        if self.dim == 0 {
            return bad("embedding dim must be positive".into());
        }
        if self.tables == 0 {
            return bad("the model needs at least one embedding table".into());
        }
        if self.bottom.is_empty() || self.top.is_empty() {
            return bad(format!(
                "both MLPs need at least one layer (bottom {:?}, top {:?})",
                self.bottom, self.top
            ));
        }
        if self.bottom.contains(&0) || self.top.contains(&0) {
            return bad(format!(
                "MLP layers must have positive width (bottom {:?}, top {:?})",
                self.bottom, self.top
            ));
        }
        if self.bottom.last() != Some(&self.dim) {
            return bad(format!(
                "bottom MLP must end at the embedding dim {} (got {:?})",
                self.dim, self.bottom
            ));
        }
        if self.top.last() != Some(&1) {
            return bad(format!("top MLP must end at 1 (got {:?})", self.top));
        }
        Ok(())
    }

    /// Vectors that meet in the interaction: the bottom output and one per table.
    pub fn interaction_vectors(&self) -> usize {
        self.tables + 1
    }

    /// Width of the top MLP's input: the bottom output then the strictly-upper pairwise dots
    /// (equal to `Preset::interaction_width` for a preset's shape).
    pub fn interaction_width(&self) -> usize {
        let n = self.interaction_vectors();
        self.dim + n * (n - 1) / 2
    }

    /// Every linear layer, bottom then top, with its parameter offsets.
    pub(crate) fn layers(&self) -> Vec<LayerShape> {
        let mut out = Vec::with_capacity(self.bottom.len() + self.top.len());
        let mut offset = 0;
        let mut input = self.dense_in;
        for &w in &self.bottom {
            let l = LayerShape {
                input,
                output: w,
                offset,
                relu: true,
            };
            offset = l.end();
            input = w;
            out.push(l);
        }
        input = self.interaction_width();
        for (i, &w) in self.top.iter().enumerate() {
            let l = LayerShape {
                input,
                output: w,
                offset,
                relu: i + 1 < self.top.len(),
            };
            offset = l.end();
            input = w;
            out.push(l);
        }
        out
    }

    /// Every linear layer's place in the flat dense parameter vector ([`Self::param_count`]
    /// values): the bottom MLP's layers, then the top MLP's, each a weight `[output x input]`
    /// (row-major, as PyTorch's `nn.Linear.weight`) followed by its bias `[output]`.
    pub fn linear_layers(&self) -> Vec<LinearLayer> {
        let bottom = self.bottom.len();
        self.layers()
            .into_iter()
            .enumerate()
            .map(|(i, l)| LinearLayer {
                top: i >= bottom,
                index: if i >= bottom { i - bottom } else { i },
                input: l.input,
                output: l.output,
                weight_offset: l.offset,
                bias_offset: l.bias_offset(),
                relu: l.relu,
            })
            .collect()
    }

    /// Dense parameters: every layer's weights and bias.
    pub fn param_count(&self) -> usize {
        self.layers().last().map_or(0, |l| l.end())
    }

    /// Floating-point operations of the MLP matrix products for one sample, forward and
    /// backward: per layer `2*in*out` forward, `2*in*out` for the weight gradient and
    /// `2*in*out` for the input gradient, except the first bottom layer, whose input (the dense
    /// features) needs no gradient. The batch's total is this times the batch size, i.e. the sum
    /// of `2*M*N*K` over every gemm of a step (a layer with one output runs as per-sample dots
    /// rather than a gemm, and is counted the same). Bias, ReLU, interaction and loss work is
    /// left out.
    pub fn flops_per_sample(&self) -> u64 {
        self.layers()
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mac = (l.input * l.output) as u64;
                if i == 0 {
                    4 * mac
                } else {
                    6 * mac
                }
            })
            .sum()
    }

    /// The widest activation any layer reads or writes (sizes the gradient buffers).
    pub(crate) fn max_width(&self) -> usize {
        self.layers()
            .iter()
            .map(|l| l.input.max(l.output))
            .max()
            .unwrap_or(0)
            .max(self.interaction_width())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kaggle_shape_counts() {
        let cfg = DlrmConfig::from_preset(&Preset::kaggle());
        cfg.validate().unwrap();
        assert_eq!(
            cfg.interaction_width(),
            Preset::kaggle().interaction_width()
        );
        // 13-512-256-64-16 then 367-512-256-1, weights plus biases.
        let expect = (13 * 512 + 512)
            + (512 * 256 + 256)
            + (256 * 64 + 64)
            + (64 * 16 + 16)
            + (367 * 512 + 512)
            + (512 * 256 + 256)
            + (256 + 1);
        assert_eq!(cfg.param_count(), expect);
        let macs: u64 = 13 * 512 + 512 * 256 + 256 * 64 + 64 * 16 + 367 * 512 + 512 * 256 + 256;
        assert_eq!(cfg.flops_per_sample(), 6 * macs - 2 * 13 * 512);
        let layers = cfg.layers();
        assert!(layers[..4].iter().all(|l| l.relu));
        assert!(layers[4].relu && layers[5].relu && !layers[6].relu);
        assert_eq!(layers[4].input, 367);
    }

    #[test]
    fn validate_names_the_broken_rule() {
        let good = DlrmConfig::from_preset(&Preset::tiny());
        good.validate().unwrap();
        let cases: Vec<(DlrmConfig, &str)> = vec![
            (
                DlrmConfig {
                    bottom: vec![32, 4],
                    ..good.clone()
                },
                "embedding dim",
            ),
            (
                DlrmConfig {
                    top: vec![32, 2],
                    ..good.clone()
                },
                "end at 1",
            ),
            (
                DlrmConfig {
                    top: vec![],
                    ..good.clone()
                },
                "at least one layer",
            ),
            (
                DlrmConfig {
                    bottom: vec![0, 8],
                    ..good.clone()
                },
                "positive width",
            ),
            (
                DlrmConfig {
                    dense_in: 0,
                    ..good.clone()
                },
                "dense input",
            ),
            (
                DlrmConfig {
                    tables: 0,
                    ..good.clone()
                },
                "embedding table",
            ),
            (
                DlrmConfig {
                    dim: 0,
                    bottom: vec![0],
                    ..good.clone()
                },
                "dim",
            ),
        ];
        for (cfg, needle) in cases {
            match cfg.validate() {
                Err(ModelError::InvalidConfig(m)) => {
                    assert!(m.contains(needle), "{m:?} lacks {needle:?}")
                }
                other => panic!("{cfg:?} gave {other:?}"),
            }
        }
    }
}

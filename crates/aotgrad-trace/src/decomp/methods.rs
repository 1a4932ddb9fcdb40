//! The composite ops as [`Tensor`] methods with PyTorch names and argument
//! conventions. Each one is `#[track_caller]`, normalizes its arguments (negative dims,
//! `normalized_shape`, dropout's identity cases) and goes through
//! [`apply_composite`](super::apply_composite).

use super::apply_composite;
use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::ops::wrap;
use crate::rng::RngSeed;
use crate::tensor::Tensor;
use aotgrad_ir::{CompositeOp, Dim, DimList, Op, Rel, Scalar, ShapeError, SourceLoc};

impl Tensor {
    /// `torch.nn.functional.linear`: `self @ weight.T + bias`, with `self` of shape
    /// `(*, in)`, `weight` `(out, in)` and `bias` broadcastable to `(*, out)`.
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        match bias {
            Some(b) => apply_composite(CompositeOp::Linear, &[self, weight, b], &loc),
            None => apply_composite(CompositeOp::Linear, &[self, weight], &loc),
        }
    }

    /// `torch.matmul`: a dot product for two 1-D tensors, a matrix product for 2-D
    /// ones, and a batched product with broadcast batch dims otherwise (a 1-D operand
    /// is treated as a row / column vector and its dim removed from the result).
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        apply_composite(CompositeOp::Matmul, &[self, other], &SourceLoc::caller())
    }

    /// Exact GELU: `x * Φ(x) = 0.5 * x * (1 + erf(x / sqrt(2)))`.
    #[track_caller]
    pub fn gelu(&self) -> Result<Tensor> {
        apply_composite(CompositeOp::Gelu { tanh: false }, &[self], &SourceLoc::caller())
    }

    /// GELU with PyTorch's tanh approximation (`approximate="tanh"`):
    /// `0.5 * x * (1 + tanh(sqrt(2/π) * (x + 0.044715 * x³)))`.
    #[track_caller]
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        apply_composite(CompositeOp::Gelu { tanh: true }, &[self], &SourceLoc::caller())
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        apply_composite(CompositeOp::Silu, &[self], &SourceLoc::caller())
    }

    /// Softmax over `dim` (negative counts from the end); floating inputs only.
    #[track_caller]
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("softmax", dim, self.dim(), &loc)?;
        apply_composite(CompositeOp::Softmax { dim }, &[self], &loc)
    }

    /// Log-softmax over `dim` (negative counts from the end); floating inputs only.
    #[track_caller]
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("log_softmax", dim, self.dim(), &loc)?;
        apply_composite(CompositeOp::LogSoftmax { dim }, &[self], &loc)
    }

    /// `torch.nn.functional.layer_norm`: normalize over the trailing dims given by
    /// `normalized_shape` (which must equal them) with the biased variance, then scale
    /// by `weight` and shift by `bias` (both of shape `normalized_shape`) when given.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[i64],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let shape = self.shape();
        let nr = normalized_shape.len();
        let trailing = shape.len().checked_sub(nr).map(|start| &shape[start..]);
        let matches = match trailing {
            Some(t) if nr > 0 => self.with_oracle("layer_norm", &loc, |o| {
                Ok(t.iter().zip(normalized_shape).all(|(d, &n)| o.decide(d, Rel::Eq, &Dim::Const(n))))
            })?,
            _ => false,
        };
        if !matches {
            return Err(Error::shape(
                "layer_norm",
                &loc,
                ShapeError::Invalid {
                    op: "layer_norm".into(),
                    msg: format!(
                        "given normalized_shape={normalized_shape:?}, expected an input with shape [*, {}], but got \
                         input of shape {}",
                        normalized_shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                        DimList(&shape)
                    ),
                },
            ));
        }
        let op = CompositeOp::LayerNorm { normalized_rank: nr, eps };
        match (weight, bias) {
            (None, None) => apply_composite(op, &[self], &loc),
            (Some(w), None) => apply_composite(op, &[self, w], &loc),
            (Some(w), Some(b)) => apply_composite(op, &[self, w, b], &loc),
            (None, Some(b)) => {
                // The composite's arguments are positional: a bias alone gets a unit weight
                // (of the normalized shape, so a misshapen bias is reported as such).
                let ones = Op::Full {
                    shape: (trailing.map(<[Dim]>::to_vec).unwrap_or_default()).into(),
                    value: Scalar::Int(1),
                    dtype: self.dtype(),
                };
                let w = dispatch(ones, &[], &loc)?;
                apply_composite(op, &[self, &w, b], &loc)
            }
        }
    }

    /// `torch.nn.functional.dropout`: in training mode (`train`) each element is zeroed
    /// with probability `p` and the others scaled by `1 / (1 - p)`, the mask drawn from
    /// `seed`: a fixed seed (the same mask every call) or [`RngSeed::Global`] (the
    /// thread's generator; compiled functions take its state as graph inputs, so each
    /// call draws a fresh mask, as in eager mode). With `train == false` or `p == 0`
    /// this is the identity and returns this very handle; `p == 1` gives `self * 0`.
    #[track_caller]
    pub fn dropout(&self, p: f64, train: bool, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::shape(
                "dropout",
                &loc,
                ShapeError::Invalid {
                    op: "dropout".into(),
                    msg: format!("dropout probability has to be between 0 and 1, but got {p}"),
                },
            ));
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        let d = crate::rng::draw(seed.into());
        apply_composite(CompositeOp::Dropout { p, seed: d.seed, offset: d.offset }, &d.args(&[self]), &loc)
    }

    /// `torch.nn.functional.embedding(indices, weight)`: the rows of the 2-D `weight`
    /// picked by the integer tensor `indices`, of shape `indices.shape + [weight.size(1)]`.
    /// An associated function taking the indices first, like the PyTorch functional
    /// form (the recorded composite's arguments are `[weight, indices]`).
    #[track_caller]
    pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
        apply_composite(CompositeOp::Embedding, &[weight, indices], &SourceLoc::caller())
    }

    /// `torch.nn.functional.mse_loss` with mean reduction: `mean((self - target)²)`
    /// (`target` broadcasts against `self`).
    #[track_caller]
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        apply_composite(CompositeOp::MseLoss, &[self, target], &SourceLoc::caller())
    }

    /// `torch.nn.functional.cross_entropy` with class-index targets and mean reduction:
    /// `self` holds logits `(N, C, d1, ...)` (or `(C)`), `target` i64 class indices
    /// `(N, d1, ...)` (or 0-d). Class probabilities as targets, `ignore_index`, weights
    /// and label smoothing are not supported.
    #[track_caller]
    pub fn cross_entropy(&self, target: &Tensor) -> Result<Tensor> {
        apply_composite(CompositeOp::CrossEntropy, &[self, target], &SourceLoc::caller())
    }
}

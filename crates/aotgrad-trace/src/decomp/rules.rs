//! The default decomposition of each composite op into core ops, following PyTorch's
//! kernels and reference decompositions (`torch._refs`, `torch._decomp`) step by step.
//!
//! Arguments reach these functions already checked by the composite's own inference
//! rule (arity, ranks, dtypes, matching sizes), so the only errors left are internal
//! ones. Every op is emitted through [`Emit`], which stamps it with the user's line.

use super::prim::{compute_dtype, Emit};
use crate::error::Result;
use crate::ops::composed;
use crate::tensor::Tensor;
use aotgrad_ir::Dims;
use aotgrad_ir::{BinaryOp, CompositeOp, DType, Dim, ReduceOp, UnaryOp};

/// `args[i]`, or an internal error (arity was checked by inference).
fn arg<'t>(e: &Emit, args: &[&'t Tensor], i: usize) -> Result<&'t Tensor> {
    args.get(i).copied().ok_or_else(|| e.internal(format!("missing argument {i}")))
}

/// Decompose `op` applied to `args` into core ops. `out_dtype` is the dtype the
/// composite's inference rule promises; the result is cast to it when a computation
/// ran in a wider type.
pub(crate) fn decompose(e: &Emit, op: &CompositeOp, args: &[&Tensor], out_dtype: DType) -> Result<Tensor> {
    let x = arg(e, args, 0)?;
    let out = match op {
        CompositeOp::Linear => linear(e, x, arg(e, args, 1)?, args.get(2).copied())?,
        CompositeOp::Matmul => matmul(e, x, arg(e, args, 1)?)?,
        CompositeOp::Gelu { tanh } => {
            let xc = e.cast(x, compute_dtype(x.dtype()))?;
            if *tanh {
                gelu_tanh(e, &xc)?
            } else {
                gelu(e, &xc)?
            }
        }
        CompositeOp::Silu => {
            let xc = e.cast(x, compute_dtype(x.dtype()))?;
            let s = e.unary(&xc, UnaryOp::Sigmoid)?;
            e.binary(&xc, BinaryOp::Mul, &s)?
        }
        CompositeOp::Softmax { dim } => softmax(e, &e.cast(x, compute_dtype(x.dtype()))?, *dim)?,
        CompositeOp::LogSoftmax { dim } => log_softmax(e, &e.cast(x, compute_dtype(x.dtype()))?, *dim)?,
        CompositeOp::LayerNorm { normalized_rank, eps } => {
            layer_norm(e, x, *normalized_rank, *eps, args.get(1).copied(), args.get(2).copied())?
        }
        CompositeOp::Dropout { p, seed, offset } => {
            let rng = match (args.get(1), args.get(2)) {
                (Some(s), Some(b)) => Some((*s, *b)),
                _ => None,
            };
            dropout(e, x, *p, *seed, *offset, rng)?
        }
        CompositeOp::Embedding => embedding(e, x, arg(e, args, 1)?)?,
        CompositeOp::MseLoss => {
            let d = e.binary(x, BinaryOp::Sub, arg(e, args, 1)?)?;
            let sq = e.binary(&d, BinaryOp::Mul, &d)?;
            e.reduce(&sq, ReduceOp::Mean, Vec::new(), false)?
        }
        CompositeOp::CrossEntropy => cross_entropy(e, x, arg(e, args, 1)?)?,
        CompositeOp::MaskedFill { value } => composed::masked_fill_rule(x, arg(e, args, 1)?, *value)?,
        CompositeOp::Tril { diagonal } => composed::triangle_rule(x, *diagonal, true)?,
        CompositeOp::Triu { diagonal } => composed::triangle_rule(x, *diagonal, false)?,
        CompositeOp::Var { dims, correction, keepdim } => composed::var_rule(x, dims, *correction, *keepdim, e.loc)?,
        CompositeOp::OneHot { num_classes } => composed::one_hot_rule(x, *num_classes)?,
    };
    e.cast(&out, out_dtype)
}

/// `torch.matmul`: dot for 1-D @ 1-D, `mm` for 2-D (a 1-D operand gets a temporary
/// size-1 dim), batch dims of a >= 3-D left operand folded into `mm` rows when the
/// right one has at most 2 dims, and otherwise `bmm` over the broadcast batch dims.
pub(crate) fn matmul(e: &Emit, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    match (ra, rb) {
        (0, _) | (_, 0) => Err(e.internal("0-d operand reached the matmul decomposition")),
        (1, 1) => {
            let r = e.mm(&e.unsqueeze(a, 0)?, &e.unsqueeze(b, 1)?)?;
            e.unsafe_view(&r, Dims::new())
        }
        (2, 1) => {
            let r = e.mm(a, &e.unsqueeze(b, 1)?)?;
            e.unsafe_view(&r, aotgrad_ir::dims![sa[0].clone()])
        }
        (1, 2) => {
            let r = e.mm(&e.unsqueeze(a, 0)?, b)?;
            e.unsafe_view(&r, aotgrad_ir::dims![sb[1].clone()])
        }
        (2, 2) => e.mm(a, b),
        (_, 1 | 2) => {
            // Fold a's batch dims into the rows of one mm, like PyTorch's `should_fold`.
            let rows = Dim::product(&sa[..ra - 1]);
            let a2 = e.reshape(a, aotgrad_ir::dims![rows, sa[ra - 1].clone()])?;
            let b2 = if rb == 1 { e.unsqueeze(b, 1)? } else { b.clone() };
            let r = e.mm(&a2, &b2)?;
            let mut shape = sa[..ra - 1].to_vec();
            if rb == 2 {
                shape.push(sb[1].clone());
            }
            e.unsafe_view(&r, shape.into())
        }
        _ => batched_matmul(e, a, b),
    }
}

/// The general case of [`matmul`]: expand both operands to the broadcast batch dims,
/// flatten those into one, `bmm`, and reshape the result (`_unsafe_view`) to PyTorch's shape.
fn batched_matmul(e: &Emit, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.dim(), b.dim());
    let a3 = if ra == 1 { e.unsqueeze(a, 0)? } else { a.clone() };
    let b3 = if rb == 1 { e.unsqueeze(b, 1)? } else { b.clone() };
    let (sa, sb) = (a3.shape(), b3.shape());
    let (na, nb) = (sa.len(), sb.len());
    let batch = e.broadcast(a, &sa[..na - 2], &sb[..nb - 2])?;
    let flat = Dim::product(&batch);
    let (n, k, k2, m) = (&sa[na - 2], &sa[na - 1], &sb[nb - 2], &sb[nb - 1]);
    let mut a_shape = batch.clone();
    a_shape.extend([n.clone(), k.clone()]);
    let mut b_shape = batch.clone();
    b_shape.extend([k2.clone(), m.clone()]);
    let a_flat = e.reshape(&e.expand(&a3, a_shape)?, aotgrad_ir::dims![flat.clone(), n.clone(), k.clone()])?;
    let b_flat = e.reshape(&e.expand(&b3, b_shape)?, aotgrad_ir::dims![flat, k2.clone(), m.clone()])?;
    let r = e.bmm(&a_flat, &b_flat)?;
    let mut shape = batch;
    if ra >= 2 {
        shape.push(n.clone());
    }
    if rb >= 2 {
        shape.push(m.clone());
    }
    e.unsafe_view(&r, shape)
}

/// `x @ w.T (+ b)`.
fn linear(e: &Emit, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let out = matmul(e, x, &e.t(w)?)?;
    match b {
        Some(b) => e.binary(&out, BinaryOp::Add, b),
        None => Ok(out),
    }
}

/// Exact GELU, as PyTorch's CPU kernel: `x * 0.5 * (1 + erf(x * M_SQRT1_2))`.
fn gelu(e: &Emit, x: &Tensor) -> Result<Tensor> {
    let inner = e.scalar(x, BinaryOp::Mul, std::f64::consts::FRAC_1_SQRT_2)?;
    let erf1 = e.scalar(&e.unary(&inner, UnaryOp::Erf)?, BinaryOp::Add, 1.0)?;
    let half = e.scalar(x, BinaryOp::Mul, 0.5)?;
    e.binary(&half, BinaryOp::Mul, &erf1)
}

/// Tanh-approximated GELU, as PyTorch:
/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`.
fn gelu_tanh(e: &Emit, x: &Tensor) -> Result<Tensor> {
    const KAPPA: f64 = 0.044715;
    let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
    let cube = e.binary(&e.binary(x, BinaryOp::Mul, x)?, BinaryOp::Mul, x)?;
    let poly = e.binary(x, BinaryOp::Add, &e.scalar(&cube, BinaryOp::Mul, KAPPA)?)?;
    let th = e.unary(&e.scalar(&poly, BinaryOp::Mul, beta)?, UnaryOp::Tanh)?;
    let half = e.scalar(x, BinaryOp::Mul, 0.5)?;
    e.binary(&half, BinaryOp::Mul, &e.scalar(&th, BinaryOp::Add, 1.0)?)
}

/// `exp(x - max) * (1 / sum(exp(x - max)))` over `dim` (stable for large inputs), as
/// PyTorch's CPU kernel: one reciprocal per row and a product per element, so neither
/// the forward nor the backward divides per element (a division costs several
/// multiplies). The shift cancels out of the result, so it passes no gradient (as JAX
/// stops it): the backward is `e * (g * r - r^2 * sum(g * e))`, which is PyTorch's
/// `y * (g - sum(g * y))`, with no pass through `amax`.
fn softmax(e: &Emit, x: &Tensor, dim: usize) -> Result<Tensor> {
    let max = e.stop_gradient(&e.reduce(x, ReduceOp::Amax, vec![dim], true)?)?;
    let ex = e.unary(&e.binary(x, BinaryOp::Sub, &max)?, UnaryOp::Exp)?;
    let den = e.reduce(&ex, ReduceOp::Sum, vec![dim], true)?;
    e.binary(&ex, BinaryOp::Mul, &e.unary(&den, UnaryOp::Reciprocal)?)
}

/// `(x - max) - log(sum(exp(x - max)))` over `dim`; the shift cancels out and passes
/// no gradient (see [`softmax`]).
fn log_softmax(e: &Emit, x: &Tensor, dim: usize) -> Result<Tensor> {
    let max = e.stop_gradient(&e.reduce(x, ReduceOp::Amax, vec![dim], true)?)?;
    let shifted = e.binary(x, BinaryOp::Sub, &max)?;
    let sum = e.reduce(&e.unary(&shifted, UnaryOp::Exp)?, ReduceOp::Sum, vec![dim], true)?;
    e.binary(&shifted, BinaryOp::Sub, &e.unary(&sum, UnaryOp::Log)?)
}

/// `(x - mean) * rsqrt(var + eps) (* w) (+ b)` with the mean and the biased variance
/// over the trailing `nr` dims, computed in f32 for half-precision inputs.
fn layer_norm(e: &Emit, x: &Tensor, nr: usize, eps: f64, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Tensor> {
    let rank = x.dim();
    let dims: Vec<usize> = (rank.saturating_sub(nr)..rank).collect();
    let x = e.cast(x, compute_dtype(x.dtype()))?;
    let mean = e.reduce(&x, ReduceOp::Mean, dims.clone(), true)?;
    let centered = e.binary(&x, BinaryOp::Sub, &mean)?;
    let var = e.reduce(&e.binary(&centered, BinaryOp::Mul, &centered)?, ReduceOp::Mean, dims, true)?;
    let rstd = e.unary(&e.scalar(&var, BinaryOp::Add, eps)?, UnaryOp::Rsqrt)?;
    let mut out = e.binary(&centered, BinaryOp::Mul, &rstd)?;
    if let Some(w) = w {
        out = e.binary(&out, BinaryOp::Mul, &e.cast(w, compute_dtype(w.dtype()))?)?;
    }
    if let Some(b) = b {
        out = e.binary(&out, BinaryOp::Add, &e.cast(b, compute_dtype(b.dtype()))?)?;
    }
    Ok(out)
}

/// Training-mode dropout, as PyTorch's `_dropout_impl`: `p == 1` gives `x * 0`;
/// otherwise `x * (bernoulli(1 - p) / (1 - p))`, the mask drawn from `(seed, offset)`.
fn dropout(e: &Emit, x: &Tensor, p: f64, seed: u64, offset: u64, rng: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    if p >= 1.0 {
        return e.scalar(x, BinaryOp::Mul, 0.0);
    }
    let keep = 1.0 - p;
    let noise = e.scalar(&e.bernoulli(x, keep, seed, offset, rng)?, BinaryOp::Div, keep)?;
    e.binary(x, BinaryOp::Mul, &noise)
}

/// `weight[indices]`: `index_select` of the flattened indices, reshaped (a fresh
/// tensor, `_unsafe_view`) to `indices.shape + [embedding_dim]`.
fn embedding(e: &Emit, weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    let ishape = indices.shape();
    let flat = e.reshape(indices, aotgrad_ir::dims![Dim::product(&ishape)])?;
    let rows = e.index_select(weight, 0, &flat)?;
    let mut shape = ishape;
    let d = weight.shape().get(1).cloned().ok_or_else(|| e.internal("weight is not 2-D"))?;
    shape.push(d);
    e.unsafe_view(&rows, shape.into())
}

/// `-mean(gather(log_softmax(logits, c), c, target.unsqueeze(c)))` with the class dim
/// `c` = 1 (0 for unbatched 1-D logits), computed in f32 for half-precision logits.
fn cross_entropy(e: &Emit, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let c = if logits.dim() == 1 { 0 } else { 1 };
    let x = e.cast(logits, compute_dtype(logits.dtype()))?;
    let lsm = log_softmax(e, &x, c)?;
    let picked = e.gather(&lsm, c, &e.unsqueeze(target, c)?)?;
    let mean = e.reduce(&picked, ReduceOp::Mean, Vec::new(), false)?;
    e.unary(&mean, UnaryOp::Neg)
}

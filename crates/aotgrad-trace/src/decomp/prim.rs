//! Core-op builders for the decompositions: thin wrappers over the one dispatch
//! function that take the user's source location explicitly, so every node a
//! decomposition records (or runs) carries the line of the user's composite call —
//! no `#[track_caller]` chain or closure can lose it.

use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::infer::broadcast_shapes;
use aotgrad_ir::Dims;
use aotgrad_ir::{BinaryOp, DType, Dim, Op, ReduceOp, Scalar, SourceLoc, UnaryOp};

/// Records (or runs) core ops at one source location on behalf of one composite op.
pub(crate) struct Emit<'a> {
    /// The composite's name (for internal errors).
    pub(crate) name: &'static str,
    /// The user's call site.
    pub(crate) loc: &'a SourceLoc,
}

impl Emit<'_> {
    fn op(&self, op: Op, args: &[&Tensor]) -> Result<Tensor> {
        dispatch(op, args, self.loc)
    }
    /// `x` detached from autograd (JAX's `stop_gradient`): a value the result does not
    /// depend on mathematically, such as a softmax's shift, passes no gradient.
    pub(crate) fn stop_gradient(&self, x: &Tensor) -> Result<Tensor> {
        x.detach_at(self.loc)
    }
    /// A failed internal invariant of a decomposition.
    pub(crate) fn internal(&self, msg: impl std::fmt::Display) -> Error {
        Error::Internal(format!("{} decomposition at {}: {msg}", self.name, self.loc))
    }

    // ---- pointwise ---------------------------------------------------------------------

    /// `u(x)`.
    pub(crate) fn unary(&self, x: &Tensor, u: UnaryOp) -> Result<Tensor> {
        self.op(Op::Unary(u), &[x])
    }
    /// `a op b`, broadcasting.
    pub(crate) fn binary(&self, a: &Tensor, op: BinaryOp, b: &Tensor) -> Result<Tensor> {
        self.op(Op::Binary(op), &[a, b])
    }
    /// `a op s` with a float wrapped number.
    pub(crate) fn scalar(&self, a: &Tensor, op: BinaryOp, s: f64) -> Result<Tensor> {
        self.op(Op::BinaryScalar(op, Scalar::Float(s)), &[a])
    }
    /// `x.to(dtype)`; the same handle when `x` already has it.
    pub(crate) fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        if x.dtype() == dtype {
            return Ok(x.clone());
        }
        self.op(Op::Cast(dtype), &[x])
    }
    /// `1` with probability `p` (else `0`), shaped and typed like `x`.
    /// `rng`: the RNG-state tensors `(seed, base)` when drawing from graph inputs.
    pub(crate) fn bernoulli(
        &self,
        x: &Tensor,
        p: f64,
        seed: u64,
        offset: u64,
        rng: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        match rng {
            Some((s, b)) => self.op(Op::Bernoulli { p, seed, offset }, &[x, s, b]),
            None => self.op(Op::Bernoulli { p, seed, offset }, &[x]),
        }
    }

    // ---- reductions and products ---------------------------------------------------------

    /// Reduce over `dims` (already wrapped; a 0-d input reduces over "all dims").
    pub(crate) fn reduce(&self, x: &Tensor, op: ReduceOp, mut dims: Vec<usize>, keepdim: bool) -> Result<Tensor> {
        if x.dim() == 0 {
            dims.clear();
        }
        dims.sort_unstable();
        dims.dedup();
        self.op(Op::Reduce { op, dims, keepdim }, &[x])
    }
    /// `a @ b` for 2-D operands.
    pub(crate) fn mm(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.op(Op::Mm, &[a, b])
    }
    /// Batched `a @ b` for 3-D operands.
    pub(crate) fn bmm(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.op(Op::Bmm, &[a, b])
    }

    // ---- views ---------------------------------------------------------------------------

    /// `_unsafe_view`: a fresh tensor with `x`'s elements in these sizes. For reshaping
    /// an intermediate the decomposition produced itself, so the composite's result is
    /// not a view of it (as in PyTorch's `matmul`). The same handle when the sizes do
    /// not change (`x` is then already the fresh result).
    pub(crate) fn unsafe_view(&self, x: &Tensor, shape: Dims) -> Result<Tensor> {
        if x.shape()[..] == shape[..] {
            return Ok(x.clone());
        }
        self.op(Op::UnsafeView(shape), &[x])
    }
    /// PyTorch's `reshape` ([`Tensor::reshape_to`]); the same handle when nothing changes.
    pub(crate) fn reshape(&self, x: &Tensor, shape: Dims) -> Result<Tensor> {
        if x.shape()[..] == shape[..] {
            return Ok(x.clone());
        }
        x.reshape_to(self.name, shape, self.loc)
    }
    /// Broadcast to `shape` (new leading dims allowed); the same handle when nothing changes.
    pub(crate) fn expand(&self, x: &Tensor, shape: Dims) -> Result<Tensor> {
        if x.shape()[..] == shape[..] {
            return Ok(x.clone());
        }
        self.op(Op::Expand(shape), &[x])
    }
    /// Insert a size-1 dim at `dim` of the result.
    pub(crate) fn unsqueeze(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        self.op(Op::Unsqueeze(dim), &[x])
    }
    /// Transpose of a tensor with at most 2 dims.
    pub(crate) fn t(&self, x: &Tensor) -> Result<Tensor> {
        self.op(Op::T, &[x])
    }

    // ---- indexing --------------------------------------------------------------------------

    /// Rows of `x` along `dim` picked by a 1-D integer index.
    pub(crate) fn index_select(&self, x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
        self.op(Op::IndexSelect(dim), &[x, index])
    }
    /// `out[..i..] = x[..index[..i..]..]` along `dim`.
    pub(crate) fn gather(&self, x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
        self.op(Op::Gather(dim), &[x, index])
    }

    // ---- shape arithmetic ------------------------------------------------------------------

    /// The broadcast of two shapes, deciding symbolic sizes with the mode's oracle.
    pub(crate) fn broadcast(&self, like: &Tensor, a: &[Dim], b: &[Dim]) -> Result<Dims> {
        let name = self.name;
        like.with_oracle(name, self.loc, |o| broadcast_shapes(name, a, b, o))
    }
}

/// The dtype a composite computes in: f16/bf16 are computed in f32 and rounded once at
/// the end (as PyTorch's fused kernels and reference decompositions do).
pub(crate) fn compute_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

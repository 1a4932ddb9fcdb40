//! The joint graph under construction: emits nodes with metadata from
//! [`aotgrad_ir::infer::infer`], tracks storage identity, and offers the small
//! tensor-algebra vocabulary the derivative rules are written in.
//!
//! Every node emitted gets the builder's current source location ([`Builder::loc`]),
//! which the joint pass sets to the location of the forward node being
//! differentiated, so backward nodes point at the user's line.

use crate::{AutodiffError, Result};
use aotgrad_ir::Dims;
use aotgrad_ir::{
    BinaryOp, CmpOp, DType, Dim, DimOracle, Graph, GraphBuilder, Op, ReduceOp, Rel, Scalar, SourceLoc, TensorMeta,
    UnaryOp, ValueId,
};
use std::ops::{Deref, DerefMut};

/// The joint graph under construction: a [`GraphBuilder`] (reached through `Deref`)
/// plus the source location given to every node emitted.
pub(crate) struct Builder<'o> {
    inner: GraphBuilder<'o>,
    /// Source location given to every node emitted.
    pub loc: Option<SourceLoc>,
}

impl<'o> Deref for Builder<'o> {
    type Target = GraphBuilder<'o>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for Builder<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl<'o> Builder<'o> {
    /// A builder holding a copy of `fw` (same value and storage ids), without its outputs.
    pub fn from_forward(fw: &Graph, oracle: &'o mut dyn DimOracle) -> Result<Self> {
        Ok(Builder { inner: GraphBuilder::from_graph(fw, oracle)?, loc: None })
    }

    /// The graph built.
    pub fn into_graph(self) -> Graph {
        self.inner.graph
    }

    /// Metadata of `v`.
    pub fn meta(&self, v: ValueId) -> Result<&TensorMeta> {
        Ok(self.inner.meta(v)?)
    }

    /// Append a graph input with fresh value and storage ids.
    pub fn add_input(&mut self, name: String, meta: TensorMeta) -> Result<ValueId> {
        Ok(self.inner.add_input(name, meta)?)
    }

    /// Append `op(args)` at [`Builder::loc`], inferring its metadata.
    pub fn emit(&mut self, op: Op, args: Vec<ValueId>) -> Result<ValueId> {
        let loc = self.loc.clone();
        Ok(self.inner.emit(op, args, loc)?)
    }

    /// Decide `a == b` for dims through the oracle (structural equality first).
    pub fn dim_eq(&mut self, a: &Dim, b: &Dim) -> bool {
        if a == b {
            return true;
        }
        match b.sub(a) {
            Dim::Const(d) => d == 0,
            Dim::Sym(_) => self.inner.oracle().decide(a, Rel::Eq, b),
        }
    }

    // ---- vocabulary ---------------------------------------------------------------

    /// `u(x)`.
    pub fn unary(&mut self, u: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.emit(Op::Unary(u), vec![x])
    }
    /// `-x`.
    pub fn neg(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Neg, x)
    }
    /// `a op b` (broadcasting).
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.emit(Op::Binary(op), vec![a, b])
    }
    /// `a * b`.
    pub fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// `a / b`.
    pub fn div(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, a, b)
    }
    /// `a op s`.
    pub fn scalar(&mut self, op: BinaryOp, a: ValueId, s: Scalar) -> Result<ValueId> {
        self.emit(Op::BinaryScalar(op, s), vec![a])
    }
    /// `a * s` for a float constant.
    pub fn mul_f(&mut self, a: ValueId, s: f64) -> Result<ValueId> {
        self.scalar(BinaryOp::Mul, a, Scalar::Float(s))
    }
    /// `1 - a`.
    pub fn one_minus(&mut self, a: ValueId) -> Result<ValueId> {
        let n = self.neg(a)?;
        self.scalar(BinaryOp::Add, n, Scalar::Float(1.0))
    }
    /// `a cmp b` (bool).
    pub fn cmp(&mut self, op: CmpOp, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.emit(Op::Compare(op), vec![a, b])
    }
    /// `a cmp s` (bool).
    pub fn cmp_scalar(&mut self, op: CmpOp, a: ValueId, s: Scalar) -> Result<ValueId> {
        self.emit(Op::CompareScalar(op, s), vec![a])
    }
    /// `where(cond, a, b)`.
    pub fn where_(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.emit(Op::Where, vec![cond, a, b])
    }
    /// A 0-d zero of `dtype` (broadcasts anywhere).
    pub fn zero_scalar(&mut self, dtype: DType) -> Result<ValueId> {
        self.zeros(Dims::new(), dtype)
    }
    /// A contiguous zero tensor.
    pub fn zeros(&mut self, shape: Dims, dtype: DType) -> Result<ValueId> {
        let value = if dtype.is_float() { Scalar::Float(0.0) } else { Scalar::Int(0) };
        self.emit(Op::Full { shape, value, dtype }, vec![])
    }
    /// `where(cond, g, 0)`.
    pub fn keep_where(&mut self, cond: ValueId, g: ValueId) -> Result<ValueId> {
        let z = self.zero_scalar(self.meta(g)?.dtype)?;
        self.where_(cond, g, z)
    }
    /// `where(cond, 0, g)`.
    pub fn zero_where(&mut self, cond: ValueId, g: ValueId) -> Result<ValueId> {
        let z = self.zero_scalar(self.meta(g)?.dtype)?;
        self.where_(cond, z, g)
    }
    /// `x` converted to `dtype` (no node when it already has it).
    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        if self.meta(x)?.dtype == dtype {
            return Ok(x);
        }
        self.emit(Op::Cast(dtype), vec![x])
    }
    /// `sum(x, dims, keepdim)`; `dims` must not be empty (empty means "all dims" in the IR).
    pub fn sum(&mut self, x: ValueId, dims: Vec<usize>, keepdim: bool) -> Result<ValueId> {
        if dims.is_empty() {
            return Err(AutodiffError::Internal("sum over an explicit empty dim list".into()));
        }
        self.emit(Op::Reduce { op: ReduceOp::Sum, dims, keepdim }, vec![x])
    }
    /// `x.view(shape)`, or `x.clone().view(shape)` when `x`'s strides do not allow a view.
    pub fn reshape(&mut self, x: ValueId, shape: Dims) -> Result<ValueId> {
        let loc = self.loc.clone();
        Ok(self.inner.reshape(x, shape, loc)?)
    }
    /// `x` laid out contiguously at offset 0 (a `clone` unless it already is).
    pub fn contiguous(&mut self, x: ValueId) -> Result<ValueId> {
        let m = self.meta(x)?;
        if *m == m.to_contiguous() {
            return Ok(x);
        }
        self.emit(Op::Clone, vec![x])
    }
    /// `g` summed over the dims broadcasting stretched, viewed as `target` (the shape of
    /// an operand that was broadcast to `g`'s shape).
    pub fn sum_to(&mut self, g: ValueId, target: &[Dim]) -> Result<ValueId> {
        let gshape = self.meta(g)?.shape.clone();
        if gshape.as_slice() == target {
            return Ok(g);
        }
        let (n, r) = (gshape.len(), target.len());
        if n < r {
            return Err(AutodiffError::Internal(format!(
                "gradient of rank {n} cannot be reduced to a tensor of rank {r}"
            )));
        }
        let lead = n - r;
        let mut dims: Vec<usize> = (0..lead).collect();
        let one = Dim::Const(1);
        for (i, t) in target.iter().enumerate() {
            let o = &gshape[lead + i];
            if t != o && (*t == one || (!t.is_const() && self.dim_eq(t, &one))) {
                dims.push(lead + i);
            }
        }
        let v = if dims.is_empty() { g } else { self.sum(g, dims, true)? };
        self.reshape(v, target.into())
    }
    /// `g` reduced to the shape and converted to the dtype of a tensor with meta `m`.
    pub fn fit_to(&mut self, g: ValueId, m: &TensorMeta) -> Result<ValueId> {
        let v = self.sum_to(g, &m.shape)?;
        self.cast(v, m.dtype)
    }
}

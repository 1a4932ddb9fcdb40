//! The joint graph under construction: emits nodes with metadata from
//! [`aotgrad_ir::infer::infer`], tracks storage identity, and offers the small
//! tensor-algebra vocabulary the derivative rules are written in.
//!
//! Every node emitted gets the builder's current source location ([`Builder::loc`]),
//! which the joint pass sets to the location of the forward node being
//! differentiated, so backward nodes point at the user's line.

use crate::{AutodiffError, Result};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    Aliasing, BinaryOp, CmpOp, DType, Dim, DimOracle, Graph, Input, Node, Op, ReduceOp, Rel, Scalar, SourceLoc,
    StorageId, TensorMeta, UnaryOp, ValueId,
};
use std::collections::HashMap;

/// The joint graph under construction.
pub(crate) struct Builder<'o> {
    /// The graph built so far.
    pub graph: Graph,
    metas: HashMap<ValueId, (TensorMeta, StorageId)>,
    next_value: u32,
    next_storage: u32,
    oracle: &'o mut dyn DimOracle,
    /// Source location given to every node emitted.
    pub loc: Option<SourceLoc>,
}

fn bump(counter: &mut u32, what: &str) -> Result<u32> {
    let v = *counter;
    *counter = v.checked_add(1).ok_or_else(|| AutodiffError::Internal(format!("ran out of {what} ids")))?;
    Ok(v)
}

impl<'o> Builder<'o> {
    /// A builder holding a copy of `fw` (same value and storage ids), without its outputs.
    pub fn from_forward(fw: &Graph, oracle: &'o mut dyn DimOracle) -> Result<Self> {
        let mut metas = HashMap::with_capacity(2 * (fw.inputs.len() + fw.nodes.len()) + 8);
        let mut max_v: Option<u32> = None;
        let mut max_s: Option<u32> = None;
        let mut note = |v: ValueId, s: StorageId| {
            max_v = Some(max_v.map_or(v.0, |m| m.max(v.0)));
            max_s = Some(max_s.map_or(s.0, |m| m.max(s.0)));
        };
        for i in &fw.inputs {
            note(i.id, i.storage);
            if metas.insert(i.id, (i.meta.clone(), i.storage)).is_some() {
                return Err(AutodiffError::Internal(format!("forward graph defines {} twice", i.id)));
            }
        }
        for n in &fw.nodes {
            note(n.out, n.storage);
            for a in &n.args {
                if !metas.contains_key(a) {
                    return Err(AutodiffError::Internal(format!(
                        "forward node {} ({}) uses {a} before it is defined",
                        n.out,
                        n.op.name()
                    )));
                }
            }
            if metas.insert(n.out, (n.meta.clone(), n.storage)).is_some() {
                return Err(AutodiffError::Internal(format!("forward graph defines {} twice", n.out)));
            }
        }
        let next = |m: Option<u32>, what: &str| -> Result<u32> {
            m.map_or(Ok(0), |m| {
                m.checked_add(1).ok_or_else(|| AutodiffError::Internal(format!("ran out of {what} ids")))
            })
        };
        let graph = Graph { inputs: fw.inputs.clone(), nodes: fw.nodes.clone(), outputs: Vec::new() };
        Ok(Builder {
            graph,
            metas,
            next_value: next(max_v, "value")?,
            next_storage: next(max_s, "storage")?,
            oracle,
            loc: None,
        })
    }

    /// Metadata of `v`.
    pub fn meta(&self, v: ValueId) -> Result<&TensorMeta> {
        self.metas.get(&v).map(|m| &m.0).ok_or_else(|| AutodiffError::Internal(format!("{v} has no metadata")))
    }

    /// Append a graph input with fresh value and storage ids.
    pub fn add_input(&mut self, name: String, meta: TensorMeta) -> Result<ValueId> {
        let id = ValueId(bump(&mut self.next_value, "value")?);
        let storage = StorageId(bump(&mut self.next_storage, "storage")?);
        self.metas.insert(id, (meta.clone(), storage));
        self.graph.inputs.push(Input { id, name, meta, storage });
        Ok(id)
    }

    /// Append `op(args)`, inferring its metadata; views share `args[0]`'s storage.
    pub fn emit(&mut self, op: Op, args: Vec<ValueId>) -> Result<ValueId> {
        let mut refs: Vec<&TensorMeta> = Vec::with_capacity(args.len());
        for a in &args {
            refs.push(
                self.metas
                    .get(a)
                    .map(|m| &m.0)
                    .ok_or_else(|| AutodiffError::Internal(format!("{a} has no metadata")))?,
            );
        }
        let meta = infer(&op, &refs, self.oracle)?;
        let storage = match op.aliasing() {
            Aliasing::Fresh => StorageId(bump(&mut self.next_storage, "storage")?),
            _ => {
                let a = args.first().ok_or_else(|| AutodiffError::Internal(format!("{} without args", op.name())))?;
                self.metas[a].1
            }
        };
        let out = ValueId(bump(&mut self.next_value, "value")?);
        self.metas.insert(out, (meta.clone(), storage));
        self.graph.nodes.push(Node { out, op, args, meta, storage, loc: self.loc.clone() });
        Ok(out)
    }

    /// Decide `a == b` for dims through the oracle (structural equality first).
    pub fn dim_eq(&mut self, a: &Dim, b: &Dim) -> bool {
        if a == b {
            return true;
        }
        match b.sub(a) {
            Dim::Const(d) => d == 0,
            Dim::Sym(_) => self.oracle.decide(a, Rel::Eq, b),
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
        self.zeros(Vec::new(), dtype)
    }
    /// A contiguous zero tensor.
    pub fn zeros(&mut self, shape: Vec<Dim>, dtype: DType) -> Result<ValueId> {
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
    pub fn reshape(&mut self, x: ValueId, shape: Vec<Dim>) -> Result<ValueId> {
        let m = self.meta(x)?.clone();
        if m.shape == shape {
            return Ok(x);
        }
        let probe = infer(&Op::View(shape.clone()), &[&m], self.oracle);
        match probe {
            Ok(_) => self.emit(Op::View(shape), vec![x]),
            Err(_) => {
                let c = self.emit(Op::Clone, vec![x])?;
                self.emit(Op::View(shape), vec![c])
            }
        }
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
        self.reshape(v, target.to_vec())
    }
    /// `g` reduced to the shape and converted to the dtype of a tensor with meta `m`.
    pub fn fit_to(&mut self, g: ValueId, m: &TensorMeta) -> Result<ValueId> {
        let v = self.sum_to(g, &m.shape)?;
        self.cast(v, m.dtype)
    }
}

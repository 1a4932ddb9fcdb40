//! Node classification: what each node of the graph is to the planner.
//!
//! [`Ctx`] finds where every value is defined (a graph input or a node) and refuses
//! graphs that mutate or keep composite ops. [`classify`] is step 1 of the planner and
//! the node classes: which nodes reach an output, who reads each one, and which are
//! fusible pointwise nodes or plannable reductions, with the compute type each is
//! evaluated in. The op predicates the later steps ask (matmuls, scatters and the view
//! they replace, full contiguous layouts) live here too.

use crate::plan::*;
use crate::PlanError;
use aotgrad_ir::{result_type, DType, Dim, Graph, Op, Operand, ReduceOp, TensorMeta, UnaryOp, ValueId, ValueMap};

/// Compute type of a float result dtype.
fn float_kind(d: DType) -> Option<Compute> {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => Some(Compute::F32),
        DType::F64 => Some(Compute::F64),
        _ => None,
    }
}

/// Compute type that represents values of `d` exactly enough for comparisons.
pub(crate) fn value_kind(d: DType) -> Option<Compute> {
    match d {
        DType::Bool => Some(Compute::F32),
        d => float_kind(d),
    }
}

/// The compute type of a pointwise node when it can be fused, else `None`.
pub(crate) fn pointwise_compute(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> Option<Compute> {
    match op {
        Op::Unary(UnaryOp::LogicalNot) => value_kind(args.first()?.dtype),
        Op::Unary(_) | Op::Binary(_) | Op::BinaryScalar(..) | Op::Where | Op::Clamp { .. } => float_kind(out.dtype),
        Op::Compare(_) => {
            value_kind(result_type(&[Operand::of(args.first()?), Operand::of(args.get(1)?)])).filter(|_| {
                // Integer comparisons need exact i64 arithmetic: not fused.
                args.iter().all(|a| value_kind(a.dtype).is_some())
            })
        }
        Op::CompareScalar(_, s) => {
            let a = args.first()?;
            value_kind(a.dtype)?;
            value_kind(result_type(&[Operand::of(a), Operand::Scalar(*s)]))
        }
        Op::Cast(_) | Op::Copy => {
            let src = if matches!(op, Op::Copy) { args.get(1)? } else { args.first()? };
            match out.dtype {
                DType::Bool => value_kind(src.dtype),
                d => float_kind(d),
            }
        }
        Op::Clone => value_kind(out.dtype),
        Op::FullLike { .. } | Op::Full { .. } => value_kind(out.dtype),
        _ => None,
    }
}

/// The prologue compute type of a reduction when it can be planned.
pub(crate) fn reduce_compute(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> Option<Compute> {
    match op {
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Amax | ReduceOp::Amin, .. } => {
            float_kind(out.dtype)?;
            float_kind(args.first()?.dtype)
        }
        _ => None,
    }
}

/// For `select_scatter` / `slice_scatter` with result layout `meta`: the view of the
/// result that the source replaces.
pub(crate) fn scatter_view(op: &Op, meta: &TensorMeta) -> Option<TensorMeta> {
    let view = match op {
        Op::SelectScatter { dim, index } => Op::Select { dim: *dim, index: index.clone() },
        Op::SliceScatter { dim, start, end, step } => {
            Op::Slice { dim: *dim, start: start.clone(), end: end.clone(), step: *step }
        }
        _ => return None,
    };
    aotgrad_ir::infer::infer(&view, &[meta], &mut aotgrad_ir::StaticOracle).ok()
}

/// Whether a node is a matmul the plan computes itself (mm/bmm of f32/f64).
pub(crate) fn is_matmul(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> bool {
    matches!(op, Op::Mm | Op::Bmm)
        && matches!(out.dtype, DType::F32 | DType::F64)
        && args.len() == 2
        && args.iter().all(|a| a.dtype == out.dtype)
}

/// Element offsets of a dense row-major full view of its buffer.
pub(crate) fn is_full_contiguous(meta: &TensorMeta) -> bool {
    meta.is_contiguous() && meta.offset == Dim::Const(0)
}

/// Where a value is defined.
#[derive(Clone, Copy)]
pub(crate) enum Def {
    /// Graph input `i`.
    Input(usize),
    /// Node `j`.
    Node(usize),
}

/// The graph being planned and where each of its values is defined.
pub(crate) struct Ctx<'g> {
    pub(crate) g: &'g Graph,
    pub(crate) def: ValueMap<Def>,
}

impl<'g> Ctx<'g> {
    /// The definitions of `g`; graphs with mutations or composite ops are refused.
    pub(crate) fn new(g: &'g Graph) -> Result<Self, PlanError> {
        let mut ctx = Ctx { g, def: ValueMap::for_graph(g) };
        for (i, inp) in g.inputs.iter().enumerate() {
            ctx.def.insert(inp.id, Def::Input(i));
        }
        for (j, node) in g.nodes.iter().enumerate() {
            if node.op.is_mutation() || matches!(node.op, Op::Composite(_)) {
                return Err(PlanError::Unsupported { op: node.op.name(), value: node.out });
            }
            ctx.def.insert(node.out, Def::Node(j));
        }
        Ok(ctx)
    }
    pub(crate) fn meta(&self, v: ValueId) -> Result<&'g TensorMeta, PlanError> {
        match self.def.get(&v) {
            Some(Def::Input(i)) => Ok(&self.g.inputs[*i].meta),
            Some(Def::Node(j)) => Ok(&self.g.nodes[*j].meta),
            None => Err(PlanError::Internal(format!("{v} is used but never defined"))),
        }
    }
    pub(crate) fn node_of(&self, v: ValueId) -> Option<usize> {
        match self.def.get(&v) {
            Some(Def::Node(j)) => Some(*j),
            _ => None,
        }
    }
    pub(crate) fn arg_metas(&self, j: usize) -> Result<Vec<&'g TensorMeta>, PlanError> {
        self.g.nodes[j].args.iter().map(|a| self.meta(*a)).collect()
    }
}

/// Step 1 and the node classes, per node of the graph.
pub(crate) struct Classes {
    /// The node reaches a graph output.
    pub(crate) live: Vec<bool>,
    /// The node's value is a graph output.
    pub(crate) is_output: Vec<bool>,
    /// The live nodes reading the node's value, each once, in node order.
    pub(crate) users: Vec<Vec<usize>>,
    /// The compute type of a fusible pointwise node.
    pub(crate) pw: Vec<Option<Compute>>,
    /// The prologue compute type of a plannable reduction.
    pub(crate) red: Vec<Option<Compute>>,
}

/// Liveness, readers and classes of the nodes of `ctx`'s graph.
pub(crate) fn classify(ctx: &Ctx) -> Result<Classes, PlanError> {
    let g = ctx.g;
    let n = g.nodes.len();
    // 1. liveness of nodes.
    let mut live = vec![false; n];
    let mut is_output = vec![false; n];
    for o in &g.outputs {
        ctx.meta(*o)?;
        if let Some(j) = ctx.node_of(*o) {
            live[j] = true;
            is_output[j] = true;
        }
    }
    for j in (0..n).rev() {
        if live[j] {
            for a in &g.nodes[j].args {
                if let Some(k) = ctx.node_of(*a) {
                    live[k] = true;
                }
            }
        }
    }
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for j in (0..n).filter(|&j| live[j]) {
        let mut seen: Vec<usize> = Vec::new();
        for a in &g.nodes[j].args {
            if let Some(k) = ctx.node_of(*a) {
                if !seen.contains(&k) {
                    seen.push(k);
                    users[k].push(j);
                }
            }
        }
    }
    // Classes.
    let mut pw: Vec<Option<Compute>> = vec![None; n];
    let mut red: Vec<Option<Compute>> = vec![None; n];
    for j in (0..n).filter(|&j| live[j]) {
        let node = &g.nodes[j];
        let args = ctx.arg_metas(j)?;
        pw[j] = pointwise_compute(&node.op, &args, &node.meta);
        red[j] = reduce_compute(&node.op, &args, &node.meta);
    }
    Ok(Classes { live, is_output, users, pw, red })
}

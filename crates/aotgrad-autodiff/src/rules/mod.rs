//! Derivative rules: the vector-Jacobian product of every core op, one themed module
//! per op family ([`pointwise`], [`reduce`], [`views`], [`indexing`], [`linalg`],
//! [`conv`]).
//!
//! A rule receives the forward node, the gradient `g` of its result (the result's
//! shape and dtype, any layout) and which arguments need a gradient; it returns one
//! optional contribution per argument. A contribution may still have a broadcast
//! shape or the result's dtype: the joint pass reduces it to the argument's shape and
//! casts it to the argument's dtype (see [`crate::builder::Builder::fit_to`]).
//! `None` means "zero" (no contribution).

pub(crate) mod conv;
pub(crate) mod indexing;
pub(crate) mod linalg;
pub(crate) mod pointwise;
pub(crate) mod reduce;
pub(crate) mod views;

use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::{Node, Op, UnaryOp, ValueId};

/// Whether a gradient can flow from `op`'s result into its argument `i` at all
/// (dtypes aside: only floating values ever carry gradients). Ops without a rule
/// (composites, in-place ops) answer `true`, so that lying on a differentiated path
/// reports them.
pub(crate) fn grad_flows(op: &Op, i: usize) -> bool {
    match op {
        // sign's and the rounding ops' derivatives are zero almost everywhere (PyTorch
        // returns zeros); logical_not's result is bool.
        Op::Unary(u) => !matches!(u, UnaryOp::Sign | UnaryOp::LogicalNot) && !u.is_rounding(),
        Op::Binary(_) | Op::BinaryScalar(..) | Op::Clamp { .. } | Op::Cast(_) | Op::Clone | Op::UnsafeView(_) => true,
        // Constants with respect to their inputs.
        Op::Compare(_)
        | Op::CompareScalar(..)
        | Op::ArgMax { .. }
        | Op::ArgMin { .. }
        | Op::Argsort { .. }
        | Op::Full { .. }
        | Op::FullLike { .. }
        | Op::Arange { .. }
        | Op::Rand { .. }
        | Op::Randn { .. }
        | Op::Bernoulli { .. } => false,
        Op::Where => i == 1 || i == 2,
        Op::Copy => i == 1,
        Op::Reduce { .. } | Op::Cumsum(_) | Op::Mm | Op::Bmm => true,
        Op::View(_)
        | Op::Permute(_)
        | Op::Transpose(..)
        | Op::T
        | Op::Expand(_)
        | Op::Squeeze(_)
        | Op::Unsqueeze(_)
        | Op::Slice { .. }
        | Op::Select { .. }
        | Op::AsStrided { .. }
        | Op::Alias => true,
        Op::IndexSelect(_) | Op::Gather(_) => i == 0,
        Op::ScatterAdd(_) => i == 0 || i == 2,
        Op::Cat(_) | Op::SliceScatter { .. } | Op::SelectScatter { .. } | Op::AsStridedScatter { .. } => true,
        Op::Conv2d(_) | Op::Conv2dInputGrad { .. } | Op::Conv2dWeightGrad { .. } | Op::MaxPool2d(_) => true,
        Op::MaxPool2dGrad(_) => i == 0,
        Op::Composite(_) | Op::InPlace(_) | Op::MetaInPlace(_) => true,
    }
}

/// The contributions of `g` (the gradient of `node`'s result) to `node`'s arguments;
/// `needs[i]` says whether argument `i` wants one.
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    if needs.len() != node.args.len() {
        return Err(AutodiffError::Internal(format!(
            "node {} ({}): {} argument flags for {} arguments",
            node.out,
            node.op.name(),
            needs.len(),
            node.args.len()
        )));
    }
    let out = match &node.op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::BinaryScalar(..)
        | Op::Compare(_)
        | Op::CompareScalar(..)
        | Op::Where
        | Op::Clamp { .. }
        | Op::Cast(_)
        | Op::Copy
        | Op::Clone
        | Op::FullLike { .. }
        | Op::Bernoulli { .. } => pointwise::vjp(b, node, g, needs)?,
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::ArgMin { .. } => reduce::vjp(b, node, g, needs)?,
        Op::Cumsum(_) | Op::Argsort { .. } => reduce::scan_vjp(b, node, g, needs)?,
        Op::Mm | Op::Bmm => linalg::vjp(b, node, g, needs)?,
        // `_unsafe_view` (a reshaped fresh copy): the gradient reshaped back to the input's shape.
        Op::UnsafeView(_) if needs[0] => {
            let shape = b.meta(arg(node, 0)?)?.shape.clone();
            vec![Some(b.reshape(g, shape)?)]
        }
        Op::UnsafeView(_) => vec![None],
        Op::View(_)
        | Op::Permute(_)
        | Op::Transpose(..)
        | Op::T
        | Op::Expand(_)
        | Op::Squeeze(_)
        | Op::Unsqueeze(_)
        | Op::Slice { .. }
        | Op::Select { .. }
        | Op::AsStrided { .. }
        | Op::Alias => views::vjp(b, node, g, needs)?,
        Op::IndexSelect(_)
        | Op::Gather(_)
        | Op::ScatterAdd(_)
        | Op::Cat(_)
        | Op::SliceScatter { .. }
        | Op::SelectScatter { .. }
        | Op::AsStridedScatter { .. } => indexing::vjp(b, node, g, needs)?,
        Op::Full { .. } | Op::Arange { .. } | Op::Rand { .. } | Op::Randn { .. } => Vec::new(),
        Op::Conv2d(_)
        | Op::Conv2dInputGrad { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::MaxPool2d(_)
        | Op::MaxPool2dGrad(_) => conv::vjp(b, node, g, needs)?,
        Op::Composite(c) => {
            return Err(AutodiffError::NotDifferentiable {
                op: c.name().to_string(),
                msg: "composite ops kept whole have no derivative rule; decompose them into core ops before \
                      autodiff"
                    .into(),
            })
        }
        Op::InPlace(_) | Op::MetaInPlace(_) => return Err(not_functional(&node.op)),
    };
    if out.len() != node.args.len() {
        return Err(AutodiffError::Internal(format!(
            "rule of {} returned {} contributions for {} arguments",
            node.op.name(),
            out.len(),
            node.args.len()
        )));
    }
    Ok(out)
}

/// The error for an in-place op found in a graph that should be functional.
pub(crate) fn not_functional(op: &Op) -> AutodiffError {
    AutodiffError::NotDifferentiable {
        op: op.name(),
        msg: "in-place ops are not differentiated; functionalize the graph before autodiff".into(),
    }
}

/// Argument `i` of `node`.
pub(crate) fn arg(node: &Node, i: usize) -> Result<ValueId> {
    node.args
        .get(i)
        .copied()
        .ok_or_else(|| AutodiffError::Internal(format!("node {} ({}) has no argument {i}", node.out, node.op.name())))
}

/// A contribution list with only `needs`-flagged entries kept.
pub(crate) fn only_needed(needs: &[bool], v: Vec<Option<ValueId>>) -> Vec<Option<ValueId>> {
    v.into_iter().zip(needs).map(|(c, &n)| if n { c } else { None }).collect()
}

//! Rules of reductions: `sum`, `mean`, `amax`, `amin`; `argmax`/`argmin` have integer
//! results and pass no gradient.
//!
//! The gradient of the result is first viewed with the reduced dims kept (size 1),
//! then:
//! - `sum`: expanded back to the input's shape;
//! - `mean`: the same, divided by the number of reduced elements (a constant when the
//!   reduced sizes are concrete, else a count computed in the graph);
//! - `amax`/`amin`: spread equally over the elements equal to the result, like
//!   PyTorch's `amax` backward: `mask = (x == out)`, `g * mask / mask.sum(dims)`.

use super::arg;
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::Dims;
use aotgrad_ir::{BinaryOp, CmpOp, Dim, Node, Op, ReduceOp, Scalar, ValueId};

/// The rule of a reduction node (see the module docs).
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (op, dims, keepdim) = match &node.op {
        Op::ArgMax { .. } | Op::ArgMin { .. } => return Ok(vec![None]),
        Op::Reduce { op, dims, keepdim } => (*op, dims, *keepdim),
        other => return Err(AutodiffError::Internal(format!("{} is not a reduction", other.name()))),
    };
    if !needs[0] {
        return Ok(vec![None]);
    }
    let x = arg(node, 0)?;
    let xm = b.meta(x)?.clone();
    let reduced: Vec<usize> = if dims.is_empty() { (0..xm.rank()).collect() } else { dims.clone() };
    let kd_shape: Dims = xm
        .shape
        .iter()
        .enumerate()
        .map(|(i, d)| if reduced.contains(&i) { Dim::Const(1) } else { d.clone() })
        .collect();
    let g_kd = if keepdim { g } else { b.reshape(g, kd_shape.clone())? };
    let v = match op {
        ReduceOp::Sum => expand_to(b, g_kd, &xm.shape)?,
        ReduceOp::Mean => {
            let sizes: Option<Vec<i64>> = reduced.iter().map(|&d| xm.shape[d].as_const()).collect();
            let scaled = match sizes {
                Some(s) => {
                    let n: i64 = s.iter().product();
                    if n == 1 {
                        g_kd
                    } else {
                        b.scalar(BinaryOp::Div, g_kd, Scalar::Float(n as f64))?
                    }
                }
                None => {
                    // A symbolic count: sum a tensor of ones over the reduced dims.
                    let ones = b.emit(Op::FullLike { value: Scalar::Float(1.0), dtype: None }, vec![x])?;
                    let count = b.sum(ones, reduced.clone(), true)?;
                    b.div(g_kd, count)?
                }
            };
            expand_to(b, scaled, &xm.shape)?
        }
        ReduceOp::Amax | ReduceOp::Amin => {
            if reduced.is_empty() {
                g_kd
            } else {
                let out_kd = if keepdim { node.out } else { b.reshape(node.out, kd_shape)? };
                let mask = b.cmp(CmpOp::Eq, x, out_kd)?;
                let maskf = b.cast(mask, b.meta(g)?.dtype)?;
                let count = b.sum(maskf, reduced, true)?;
                let share = b.div(g_kd, count)?;
                b.mul(share, maskf)?
            }
        }
    };
    Ok(vec![Some(v)])
}

/// Rules of the scans along one dim:
/// - `cumsum`: each input element feeds every later output, so its gradient is the
///   reversed cumulative sum of `g`: `sum(g, dim) - cumsum(g, dim) + g`;
/// - `argsort`: integer result, no gradient (`sort` gathers at its indices, and the
///   gradient flows through the gather).
pub(crate) fn scan_vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    if !needs[0] || matches!(node.op, Op::Argsort { .. }) {
        return Ok(vec![None]);
    }
    let x = arg(node, 0)?;
    if b.meta(x)?.rank() == 0 {
        // One element: the scan is the identity.
        return Ok(vec![Some(g)]);
    }
    let v = match &node.op {
        Op::Cumsum(dim) => {
            let total = b.sum(g, vec![*dim], true)?;
            let c = b.emit(Op::Cumsum(*dim), vec![g])?;
            let rest = b.binary(BinaryOp::Sub, total, c)?;
            b.binary(BinaryOp::Add, rest, g)?
        }
        other => return Err(AutodiffError::Internal(format!("{} is not a scan", other.name()))),
    };
    Ok(vec![Some(v)])
}

/// `v` (of the input's rank, reduced dims of size 1) expanded to `shape`.
fn expand_to(b: &mut Builder, v: ValueId, shape: &[Dim]) -> Result<ValueId> {
    if b.meta(v)?.shape.as_slice() == shape {
        return Ok(v);
    }
    b.emit(Op::Expand(shape.into()), vec![v])
}

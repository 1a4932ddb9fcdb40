//! Rules of matrix products: for `out = a @ b`, `grad_a = g @ b^T` and
//! `grad_b = a^T @ g` (`mm` with `t`, `bmm` with `transpose(1, 2)`).

use super::arg;
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::{Node, Op, ValueId};

/// The rule of an `mm` or `bmm` node.
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (x, y) = (arg(node, 0)?, arg(node, 1)?);
    let (prod, tr) = match node.op {
        Op::Mm => (Op::Mm, Op::T),
        Op::Bmm => (Op::Bmm, Op::Transpose(1, 2)),
        ref other => return Err(AutodiffError::Internal(format!("{} is not a matrix product", other.name()))),
    };
    let gx = if needs[0] {
        let yt = b.emit(tr.clone(), vec![y])?;
        Some(b.emit(prod.clone(), vec![g, yt])?)
    } else {
        None
    };
    let gy = if needs[1] {
        let xt = b.emit(tr, vec![x])?;
        Some(b.emit(prod, vec![xt, g])?)
    } else {
        None
    };
    Ok(vec![gx, gy])
}

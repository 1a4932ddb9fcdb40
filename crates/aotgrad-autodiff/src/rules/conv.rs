//! Rules of convolution and pooling. `conv2d(x, w)`, its input gradient and its weight
//! gradient are bilinear in their two arguments, and each one's derivatives are the
//! other two: for `y = conv2d(x, w)` with gradient `g`,
//! `grad_x = conv2d_input_grad(g, w)` and `grad_w = conv2d_weight_grad(g, x)`; for
//! `gx = conv2d_input_grad(gy, w)`, `grad_gy = conv2d(g, w)` and
//! `grad_w = conv2d_weight_grad(gy, g)`; for `gw = conv2d_weight_grad(gy, x)`,
//! `grad_gy = conv2d(x, g)` and `grad_x = conv2d_input_grad(gy, g)`. Max pooling sends
//! its gradient to each window's selected element (`max_pool2d_grad`), which is linear
//! in the gradient and piecewise constant in the input.

use super::arg;
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::{Node, Op, ValueId};

/// Spatial sizes of a 4-D value.
fn spatial(b: &Builder, v: ValueId, what: &str) -> Result<[usize; 2]> {
    let m = b.meta(v)?;
    let size = |d: usize| m.shape.get(d).and_then(|s| s.as_const()).map(|s| s as usize);
    match (size(2), size(3)) {
        (Some(h), Some(w)) => Ok([h, w]),
        _ => Err(AutodiffError::Internal(format!("{what} of a convolution has no concrete spatial size"))),
    }
}

/// The rule of a convolution or pooling node.
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (a0, a1) = (arg(node, 0)?, node.args.get(1).copied());
    let second = || a1.ok_or_else(|| AutodiffError::Internal(format!("{} has one argument", node.op.name())));
    Ok(match &node.op {
        Op::Conv2d(c) => {
            let (x, w) = (a0, second()?);
            let gx = if needs[0] {
                let input = spatial(b, x, "the input")?;
                Some(b.emit(Op::Conv2dInputGrad { conv: *c, input }, vec![g, w])?)
            } else {
                None
            };
            let gw = if needs[1] {
                let kernel = spatial(b, w, "the weight")?;
                Some(b.emit(Op::Conv2dWeightGrad { conv: *c, kernel }, vec![g, x])?)
            } else {
                None
            };
            vec![gx, gw]
        }
        Op::Conv2dInputGrad { conv, .. } => {
            let (gy, w) = (a0, second()?);
            let ggy = if needs[0] { Some(b.emit(Op::Conv2d(*conv), vec![g, w])?) } else { None };
            let gw = if needs[1] {
                let kernel = spatial(b, w, "the weight")?;
                Some(b.emit(Op::Conv2dWeightGrad { conv: *conv, kernel }, vec![gy, g])?)
            } else {
                None
            };
            vec![ggy, gw]
        }
        Op::Conv2dWeightGrad { conv, .. } => {
            let (gy, x) = (a0, second()?);
            let ggy = if needs[0] { Some(b.emit(Op::Conv2d(*conv), vec![x, g])?) } else { None };
            let gx = if needs[1] {
                let input = spatial(b, x, "the input")?;
                Some(b.emit(Op::Conv2dInputGrad { conv: *conv, input }, vec![gy, g])?)
            } else {
                None
            };
            vec![ggy, gx]
        }
        Op::MaxPool2d(p) => vec![if needs[0] { Some(b.emit(Op::MaxPool2dGrad(*p), vec![g, a0])?) } else { None }],
        Op::MaxPool2dGrad(_) => {
            if needs[0] {
                return Err(AutodiffError::NotDifferentiable {
                    op: node.op.name(),
                    msg: "the gradient of max pooling's gradient (a double backward through max_pool2d) is not \
                          supported"
                        .into(),
                });
            }
            // Piecewise constant in the input: no contribution.
            vec![None, None]
        }
        other => return Err(AutodiffError::Internal(format!("{} is not a convolution or pooling op", other.name()))),
    })
}

//! Rules of pointwise ops: unary and binary functions (tensor and scalar forms),
//! `where`, `clamp`, `to` (cast), `copy`, `clone`; comparisons, `full_like` and
//! `bernoulli` are constants with respect to their inputs.
//!
//! Broadcasting is undone by the joint pass (contributions are summed back to each
//! operand's shape there). Conventions follow PyTorch's `derivatives.yaml`:
//! - `maximum`/`minimum` split the gradient in half between tied operands;
//! - `clamp` passes the gradient where `min <= x <= max` (bounds inclusive);
//! - `relu` passes it where the result is positive; `abs` multiplies by `sign(x)`;
//! - `pow(a, b)`: `d/da = b * a^(b-1)`, zero where `b == 0`; `d/db = a^b * ln(a)`,
//!   zero where `a == 0` and `b >= 0`.

use super::{arg, only_needed};
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::{BinaryOp, CmpOp, Node, Op, Scalar, UnaryOp, ValueId};

/// The rule of a pointwise node (see the module docs).
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let none = vec![None; node.args.len()];
    Ok(match &node.op {
        Op::Unary(u) => vec![unary(b, *u, arg(node, 0)?, node.out, g)?],
        Op::Binary(op) => binary(b, *op, arg(node, 0)?, arg(node, 1)?, node.out, g, needs)?,
        Op::BinaryScalar(op, s) => vec![binary_scalar(b, *op, *s, arg(node, 0)?, g)?],
        Op::Where => {
            let cond = arg(node, 0)?;
            let ga = if needs[1] { Some(b.keep_where(cond, g)?) } else { None };
            let gb = if needs[2] { Some(b.zero_where(cond, g)?) } else { None };
            vec![None, ga, gb]
        }
        Op::Clamp { min, max } => {
            let x = arg(node, 0)?;
            let mut v = g;
            if let Some(lo) = min {
                let c = b.cmp_scalar(CmpOp::Ge, x, *lo)?;
                v = b.keep_where(c, v)?;
            }
            if let Some(hi) = max {
                let c = b.cmp_scalar(CmpOp::Le, x, *hi)?;
                v = b.keep_where(c, v)?;
            }
            vec![Some(v)]
        }
        // The joint pass casts the gradient back to the input's dtype.
        Op::Cast(_) | Op::Clone => vec![Some(g)],
        // `copy(dst, src)`: the result is `src` broadcast and cast; `dst` only lends
        // its shape and dtype.
        Op::Copy => vec![None, Some(g)],
        Op::Compare(_) | Op::CompareScalar(..) | Op::FullLike { .. } | Op::Bernoulli { .. } => none,
        other => return Err(AutodiffError::Internal(format!("{} is not a pointwise op", other.name()))),
    })
}

/// `g * f'(x)` for a unary `f`; `out` is `f(x)`.
fn unary(b: &mut Builder, u: UnaryOp, x: ValueId, out: ValueId, g: ValueId) -> Result<Option<ValueId>> {
    use UnaryOp::*;
    let v = match u {
        Neg => b.neg(g)?,
        Abs => {
            let s = b.unary(Sign, x)?;
            b.mul(g, s)?
        }
        Exp => b.mul(g, out)?,
        Log => b.div(g, x)?,
        // d sqrt(x) = 1 / (2 sqrt(x))
        Sqrt => {
            let two_out = b.mul_f(out, 2.0)?;
            b.div(g, two_out)?
        }
        // d x^-1/2 = -1/2 x^-3/2 = -1/2 rsqrt(x)^3
        Rsqrt => {
            let cube = b.scalar(BinaryOp::Pow, out, Scalar::Int(3))?;
            let t = b.mul(g, cube)?;
            b.mul_f(t, -0.5)?
        }
        Sin => {
            let c = b.unary(Cos, x)?;
            b.mul(g, c)?
        }
        Cos => {
            let s = b.unary(Sin, x)?;
            let t = b.mul(g, s)?;
            b.neg(t)?
        }
        // d tanh = 1 - tanh^2
        Tanh => {
            let sq = b.mul(out, out)?;
            let d = b.one_minus(sq)?;
            b.mul(g, d)?
        }
        // d sigmoid = s (1 - s)
        Sigmoid => {
            let om = b.one_minus(out)?;
            let d = b.mul(out, om)?;
            b.mul(g, d)?
        }
        Relu => {
            let pos = b.cmp_scalar(CmpOp::Gt, out, Scalar::Float(0.0))?;
            b.keep_where(pos, g)?
        }
        // d erf = 2/sqrt(pi) e^{-x^2}
        Erf => {
            let sq = b.mul(x, x)?;
            let nsq = b.neg(sq)?;
            let e = b.unary(Exp, nsq)?;
            let t = b.mul(g, e)?;
            b.mul_f(t, std::f64::consts::FRAC_2_SQRT_PI)?
        }
        // d 1/x = -1/x^2
        Reciprocal => {
            let sq = b.mul(out, out)?;
            let t = b.mul(g, sq)?;
            b.neg(t)?
        }
        // d log(1+x) = 1/(1+x)
        Log1p => {
            let xp1 = b.scalar(BinaryOp::Add, x, Scalar::Float(1.0))?;
            b.div(g, xp1)?
        }
        // d (e^x - 1) = e^x = out + 1
        Expm1 => {
            let ex = b.scalar(BinaryOp::Add, out, Scalar::Float(1.0))?;
            b.mul(g, ex)?
        }
        Sign | LogicalNot | Floor | Ceil | Round | Trunc => return Ok(None),
    };
    Ok(Some(v))
}

/// Rules of `a op b` for tensors `a`, `b`; `out` is the result.
fn binary(
    b: &mut Builder,
    op: BinaryOp,
    x: ValueId,
    y: ValueId,
    out: ValueId,
    g: ValueId,
    needs: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let (nx, ny) = (needs[0], needs[1]);
    let v = match op {
        BinaryOp::Add => vec![Some(g), Some(g)],
        BinaryOp::Sub => vec![Some(g), if ny { Some(b.neg(g)?) } else { None }],
        BinaryOp::Mul => vec![if nx { Some(b.mul(g, y)?) } else { None }, if ny { Some(b.mul(g, x)?) } else { None }],
        BinaryOp::Div => {
            let gx = if nx { Some(b.div(g, y)?) } else { None };
            // d(x/y)/dy = -x/y^2 = -(x/y)/y
            let gy = if ny {
                let t = b.mul(g, out)?;
                let t = b.div(t, y)?;
                Some(b.neg(t)?)
            } else {
                None
            };
            vec![gx, gy]
        }
        BinaryOp::Pow => {
            let gx = if nx {
                // g * y * x^(y-1), zero where y == 0
                // (a bool exponent has no `- 1`: compute in the result's dtype)
                let yf = b.cast(y, b.meta(out)?.dtype)?;
                let ym1 = b.scalar(BinaryOp::Sub, yf, Scalar::Int(1))?;
                let p = b.binary(BinaryOp::Pow, x, ym1)?;
                let t = b.mul(p, yf)?;
                let t = b.mul(g, t)?;
                let y0 = b.cmp_scalar(CmpOp::Eq, y, Scalar::Int(0))?;
                Some(b.zero_where(y0, t)?)
            } else {
                None
            };
            let gy = if ny {
                // g * out * ln(x), zero where x == 0 and y >= 0
                let l = b.unary(UnaryOp::Log, x)?;
                let t = b.mul(out, l)?;
                let t = b.mul(g, t)?;
                let ypos = b.cmp_scalar(CmpOp::Ge, y, Scalar::Int(0))?;
                let masked = b.zero_where(ypos, t)?;
                let x0 = b.cmp_scalar(CmpOp::Eq, x, Scalar::Int(0))?;
                Some(b.where_(x0, masked, t)?)
            } else {
                None
            };
            vec![gx, gy]
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // The winning operand gets g, ties split it in half.
            let wins = if op == BinaryOp::Maximum { CmpOp::Gt } else { CmpOp::Lt };
            let loses = if op == BinaryOp::Maximum { CmpOp::Lt } else { CmpOp::Gt };
            let tie = b.cmp(CmpOp::Eq, x, y)?;
            let half = b.mul_f(g, 0.5)?;
            let side = |b: &mut Builder, c: CmpOp| -> Result<ValueId> {
                let w = b.cmp(c, x, y)?;
                let won = b.keep_where(w, g)?;
                b.where_(tie, half, won)
            };
            vec![if nx { Some(side(b, wins)?) } else { None }, if ny { Some(side(b, loses)?) } else { None }]
        }
    };
    Ok(only_needed(needs, v))
}

/// Rule of `a op s` for a scalar `s` (the gradient goes to `a` only).
fn binary_scalar(b: &mut Builder, op: BinaryOp, s: Scalar, x: ValueId, g: ValueId) -> Result<Option<ValueId>> {
    let v = match op {
        BinaryOp::Add | BinaryOp::Sub => g,
        BinaryOp::Mul => b.scalar(BinaryOp::Mul, g, s)?,
        BinaryOp::Div => b.scalar(BinaryOp::Div, g, s)?,
        BinaryOp::Pow => {
            // g * s * x^(s-1); zero for s == 0.
            let sm1 = match s {
                Scalar::Float(0.0) => return Ok(None),
                Scalar::Float(1.0) => return Ok(Some(g)),
                Scalar::Float(f) => Scalar::Float(f - 1.0),
                other => match other.to_i64() {
                    0 => return Ok(None),
                    1 => return Ok(Some(g)),
                    i => Scalar::Int(i - 1),
                },
            };
            let p = if sm1 == Scalar::Int(1) { x } else { b.scalar(BinaryOp::Pow, x, sm1)? };
            let t = b.mul(g, p)?;
            b.scalar(BinaryOp::Mul, t, s)?
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let wins = if op == BinaryOp::Maximum { CmpOp::Gt } else { CmpOp::Lt };
            let tie = b.cmp_scalar(CmpOp::Eq, x, s)?;
            let half = b.mul_f(g, 0.5)?;
            let w = b.cmp_scalar(wins, x, s)?;
            let won = b.keep_where(w, g)?;
            b.where_(tie, half, won)?
        }
    };
    Ok(Some(v))
}

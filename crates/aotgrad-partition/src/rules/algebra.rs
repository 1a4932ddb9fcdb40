//! Algebraic identities.
//!
//! Every rewrite holds for all inputs in IEEE arithmetic, with two documented
//! exceptions that only ever make results closer to the exact real-number value:
//! - `x + 0.0 -> x` turns a `-0.0 + 0.0 = +0.0` into `-0.0` (the values compare equal);
//! - `log(exp x) -> x` is the exact real identity; it also avoids the overflow of
//!   `exp` for large `x`.
//!
//! Deliberately absent:
//! - `exp(log x) -> x` in general: for `x < 0` the left side is NaN. It fires only when
//!   `x` is known non-negative (its class holds an `exp`, `abs`, `relu`, `sqrt`,
//!   `sigmoid`, a non-negative fill, or it is bool);
//! - `x * 0 -> 0` for floating results: `inf * 0` and `NaN * 0` are NaN. It fires only
//!   for integer and bool results;
//! - `x - x -> 0`, `x / x -> 1`: NaN and infinities again.
//!
//! Sums of scatters into zeros: `add(x, scatter(zeros, y, region))` where `x` is zero
//! on `region` (a zero fill, or scatters of other regions of the same dim into one)
//! is `scatter(x, y, region)`, for `select_scatter` and unit-step `slice_scatter`.
//! This is the gradient of `unbind` / `chunk` / `split` (a transformer's fused QKV
//! projection): the sum of one zero-padded tensor per part becomes one buffer that
//! each part is written into, with no additions. Where the regions meet zeros, the
//! sign of a zero may change as for `x + 0.0`.
//!
//! The sum of an expand is a scaled sum: when every broadcast dim of `expand(x, shape)`
//! is reduced, `sum(expand(x), D) = k * sum(x, D')` with `k` the product of the
//! broadcast sizes (concrete only) and `D'` the reduced dims of `x`, and
//! `mean(expand(x), D) = mean(x, D')`. For floats this reassociates the sum.

use super::{meta, ops_of, same_value, Candidate, Rhs, Rule};
use crate::simplify::lang::{ENode, EG};
use aotgrad_ir::{BinaryOp, DType, Op, ReduceOp, Scalar, UnaryOp};
use egg::Id;

/// The rules of this theme.
pub(crate) static RULES: &[Rule] = &[
    Rule::new("mul-one", mul_one),
    Rule::new("add-zero", add_zero),
    Rule::new("div-one", div_one),
    Rule::new("int-mul-zero", int_mul_zero),
    Rule::new("neg-neg", neg_neg),
    Rule::new("log-exp", log_exp),
    Rule::new("exp-log", exp_log),
    Rule::new("cast-noop", cast_noop),
    Rule::new("cast-roundtrip", cast_roundtrip),
    Rule::new("reduce-of-expand", reduce_of_expand),
    Rule::new("add-disjoint-scatters", add_disjoint_scatters),
];

fn is_one(s: Scalar) -> bool {
    match s {
        Scalar::Bool(b) => b,
        Scalar::Int(i) => i == 1,
        Scalar::Float(x) => x == 1.0,
    }
}

fn is_zero(s: Scalar) -> bool {
    match s {
        Scalar::Bool(b) => !b,
        Scalar::Int(i) => i == 0,
        Scalar::Float(x) => x == 0.0,
    }
}

/// True when the class holds a fill (`full`/`full_like`) whose value satisfies `pred`.
fn is_fill(eg: &EG, id: Id, pred: fn(Scalar) -> bool) -> bool {
    ops_of(eg, id).any(|(op, _)| match op {
        Op::Full { value, .. } | Op::FullLike { value, .. } => pred(*value),
        _ => false,
    })
}

fn binary(node: &ENode) -> Option<(&Op, Id, Id)> {
    match (node.op(), node.args()) {
        (Some(op), [a, b]) => Some((op, *a, *b)),
        _ => None,
    }
}

fn mul_one(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let dtype = meta(eg, class).dtype;
    match (node.op(), node.args()) {
        (Some(Op::BinaryScalar(BinaryOp::Mul, s)), [x]) if is_one(*s) => out.push(same_value(*x, dtype)),
        _ => {
            if let Some((Op::Binary(BinaryOp::Mul), a, b)) = binary(node) {
                if is_fill(eg, b, is_one) {
                    out.push(same_value(a, dtype));
                }
                if is_fill(eg, a, is_one) {
                    out.push(same_value(b, dtype));
                }
            }
        }
    }
}

fn add_zero(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let dtype = meta(eg, class).dtype;
    match (node.op(), node.args()) {
        (Some(Op::BinaryScalar(BinaryOp::Add | BinaryOp::Sub, s)), [x]) if is_zero(*s) => {
            out.push(same_value(*x, dtype))
        }
        _ => match binary(node) {
            Some((Op::Binary(BinaryOp::Add), a, b)) => {
                if is_fill(eg, b, is_zero) {
                    out.push(same_value(a, dtype));
                }
                if is_fill(eg, a, is_zero) {
                    out.push(same_value(b, dtype));
                }
            }
            Some((Op::Binary(BinaryOp::Sub), a, b)) if is_fill(eg, b, is_zero) => out.push(same_value(a, dtype)),
            _ => {}
        },
    }
}

fn div_one(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let dtype = meta(eg, class).dtype;
    match (node.op(), node.args()) {
        (Some(Op::BinaryScalar(BinaryOp::Div, s)), [x]) if is_one(*s) => out.push(same_value(*x, dtype)),
        _ => {
            if let Some((Op::Binary(BinaryOp::Div), a, b)) = binary(node) {
                if is_fill(eg, b, is_one) {
                    out.push(same_value(a, dtype));
                }
            }
        }
    }
}

/// `x * 0 -> zeros` for integer and bool results only (never for floats: NaN, inf).
fn int_mul_zero(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let dtype = meta(eg, class).dtype;
    if dtype.is_float() {
        return;
    }
    let zero = |x: Id| vec![Rhs::op(Op::FullLike { value: Scalar::Int(0), dtype: Some(dtype) }, &[x])];
    match (node.op(), node.args()) {
        (Some(Op::BinaryScalar(BinaryOp::Mul, s)), [x]) if is_zero(*s) => out.push(zero(*x)),
        _ => {
            if let Some((Op::Binary(BinaryOp::Mul), a, b)) = binary(node) {
                if is_fill(eg, b, is_zero) {
                    out.push(zero(a));
                }
                if is_fill(eg, a, is_zero) {
                    out.push(zero(b));
                }
            }
        }
    }
}

/// `f(g(x)) -> x` for an outer unary op `outer` over an inner unary op `inner`.
fn unary_pair(eg: &EG, class: Id, node: &ENode, outer: UnaryOp, inner: UnaryOp, out: &mut Vec<Candidate>) {
    if let (Some(Op::Unary(u)), [y]) = (node.op(), node.args()) {
        if *u != outer {
            return;
        }
        let dtype = meta(eg, class).dtype;
        for (op, args) in ops_of(eg, *y) {
            if let (Op::Unary(v), [x]) = (op, args) {
                if *v == inner && (inner != UnaryOp::Log || nonneg(eg, *x)) {
                    out.push(same_value(*x, dtype));
                }
            }
        }
    }
}

fn neg_neg(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    unary_pair(eg, class, node, UnaryOp::Neg, UnaryOp::Neg, out)
}

fn log_exp(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    unary_pair(eg, class, node, UnaryOp::Log, UnaryOp::Exp, out)
}

/// `exp(log x) -> x`, only for `x` known to be non-negative (see [`nonneg`]).
fn exp_log(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    unary_pair(eg, class, node, UnaryOp::Exp, UnaryOp::Log, out)
}

/// True when every element of the class is `>= 0` or NaN, whatever the inputs.
fn nonneg(eg: &EG, id: Id) -> bool {
    meta(eg, id).dtype == DType::Bool
        || ops_of(eg, id).any(|(op, _)| match op {
            Op::Unary(UnaryOp::Exp | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sqrt | UnaryOp::Sigmoid) => true,
            Op::Full { value, .. } | Op::FullLike { value, .. } => value.to_f64() >= 0.0,
            _ => false,
        })
}

fn cast_noop(eg: &EG, _class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    if let (Some(Op::Cast(d)), [x]) = (node.op(), node.args()) {
        if meta(eg, *x).dtype == *d {
            out.push(same_value(*x, *d));
        }
    }
}

/// Whether every value of `from` converts to `to` and back unchanged.
fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to || matches!((from, to), (Bool, _) | (I32, I64 | F64) | (F16, F32 | F64) | (BF16, F32 | F64) | (F32, F64))
}

/// `cast(cast(x, a), dtype(x)) -> x` when `dtype(x) -> a` is lossless.
fn cast_roundtrip(eg: &EG, _class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    if let (Some(Op::Cast(b)), [y]) = (node.op(), node.args()) {
        for (op, args) in ops_of(eg, *y) {
            if let (Op::Cast(a), [x]) = (op, args) {
                let xd = meta(eg, *x).dtype;
                if xd == *b && lossless(xd, *a) {
                    out.push(same_value(*x, *b));
                }
            }
        }
    }
}

/// `sum(expand(x, shape), D) -> k * sum(x, D')` and `mean(expand(x), D) -> mean(x, D')`
/// when every broadcast dim is reduced (see the module docs).
fn reduce_of_expand(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let (Some(Op::Reduce { op: r @ (ReduceOp::Sum | ReduceOp::Mean), dims, keepdim }), [e]) = (node.op(), node.args())
    else {
        return;
    };
    let dtype = meta(eg, class).dtype;
    for (op, args) in ops_of(eg, *e) {
        let (Op::Expand(shape), [x]) = (op, args) else { continue };
        let xm = meta(eg, *x);
        let (big, small) = (shape.len(), xm.rank());
        if big < small || (*keepdim && big != small) {
            continue;
        }
        let lead = big - small;
        let reduced: Vec<usize> = if dims.is_empty() { (0..big).collect() } else { dims.clone() };
        let broadcast: Vec<usize> = (0..big).filter(|&i| i < lead || xm.shape[i - lead] != shape[i]).collect();
        if !broadcast.iter().all(|i| reduced.contains(i)) {
            continue;
        }
        let inner_dims: Vec<usize> = reduced.iter().filter(|&&i| i >= lead).map(|&i| i - lead).collect();
        let inner = if inner_dims.is_empty() {
            if xm.dtype == dtype {
                Rhs::Class(*x)
            } else {
                Rhs::op(Op::Cast(dtype), &[*x])
            }
        } else {
            Rhs::op(Op::Reduce { op: *r, dims: inner_dims, keepdim: *keepdim }, &[*x])
        };
        if *r == ReduceOp::Mean {
            out.push(vec![inner]);
            continue;
        }
        let k = broadcast.iter().map(|&i| shape[i].as_const()).try_fold(1i64, |acc, d| acc.checked_mul(d?));
        match k {
            Some(1) => out.push(vec![inner]),
            Some(k) => out.push(vec![Rhs::Node(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(k)), vec![inner])]),
            None => {}
        }
    }
}

/// The part of one dim a scatter writes: an index, or a unit-step index range.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Region {
    Index(i64),
    Range(i64, i64),
}

impl Region {
    fn disjoint(self, other: Region) -> bool {
        let (a0, a1) = self.bounds();
        let (b0, b1) = other.bounds();
        a1 <= b0 || b1 <= a0
    }
    fn bounds(self) -> (i64, i64) {
        match self {
            Region::Index(i) => (i, i + 1),
            Region::Range(s, e) => (s, e),
        }
    }
}

/// `(base, src, dim, region)` of a scatter with concrete bounds.
fn scatter_of(op: &Op, args: &[Id]) -> Option<(Id, Id, usize, Region)> {
    let [base, src] = args else { return None };
    match op {
        Op::SelectScatter { dim, index } => Some((*base, *src, *dim, Region::Index(index.as_const()?))),
        Op::SliceScatter { dim, start, end, step: 1 } => {
            Some((*base, *src, *dim, Region::Range(start.as_const()?, end.as_const()?)))
        }
        _ => None,
    }
}

/// Whether class `x` is zero on `region` of dim `dim`: a zero fill, or a scatter of a
/// disjoint region of that dim into such a class (at most `depth` scatters deep).
fn zero_on(eg: &EG, x: Id, dim: usize, region: Region, depth: usize) -> bool {
    if is_fill(eg, x, is_zero) {
        return true;
    }
    depth > 0
        && ops_of(eg, x).any(|(op, args)| {
            scatter_of(op, args).is_some_and(|(base, _, d, r)| {
                d == dim && r.disjoint(region) && zero_on(eg, base, dim, region, depth - 1)
            })
        })
}

fn add_disjoint_scatters(eg: &EG, _class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let Some((Op::Binary(BinaryOp::Add), a, b)) = binary(node) else { return };
    for (x, s) in [(a, b), (b, a)] {
        for (op, args) in ops_of(eg, s) {
            let Some((base, src, dim, region)) = scatter_of(op, args) else { continue };
            if is_fill(eg, base, is_zero) && zero_on(eg, x, dim, region, 8) {
                out.push(vec![Rhs::Node(op.clone(), vec![Rhs::Class(x), Rhs::Class(src)])]);
            }
        }
    }
}

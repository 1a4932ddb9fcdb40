//! Hand-built joint graphs following the `JointGraph` convention: inputs = primals then
//! tangents; outputs = forward outputs then gradients (one per primal in
//! `grad_primals`); a node is forward iff it does not depend on a tangent.

use super::B;
use aotgrad_autodiff::JointGraph;
use aotgrad_ir::{BinaryOp, DType, Op, ReduceOp, Scalar, UnaryOp, ValueId};

const F32: DType = DType::F32;

pub fn mul_s(b: &mut B, x: ValueId, s: f64) -> ValueId {
    b.op(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(s)), &[x])
}
pub fn add_s(b: &mut B, x: ValueId, s: f64) -> ValueId {
    b.op(Op::BinaryScalar(BinaryOp::Add, Scalar::Float(s)), &[x])
}
pub fn bin(b: &mut B, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    b.op(Op::Binary(op), &[x, y])
}
pub fn un(b: &mut B, op: UnaryOp, x: ValueId) -> ValueId {
    b.op(Op::Unary(op), &[x])
}
pub fn reduce(b: &mut B, op: ReduceOp, x: ValueId, dims: &[usize], keepdim: bool) -> ValueId {
    b.op(Op::Reduce { op, dims: dims.to_vec(), keepdim }, &[x])
}

/// One MLP layer `out = gelu(x @ w1 + b1) @ w2` with the erf GELU written as a pointwise
/// chain, and its hand-derived backward. `dropout` inserts a Bernoulli mask (a random
/// op) after the GELU. Sizes: x [4, 8], w1 [8, 16], b1 [16], w2 [16, 8].
pub fn mlp_joint(dropout: bool) -> JointGraph {
    use BinaryOp::*;
    let mut b = B::new();
    let x = b.input("x", &[4, 8], F32);
    let w1 = b.input("w1", &[8, 16], F32);
    let b1 = b.input("b1", &[16], F32);
    let w2 = b.input("w2", &[16, 8], F32);
    let dout = b.input("dout", &[4, 8], F32);
    let h = b.op(Op::Mm, &[x, w1]);
    let y = bin(&mut b, Add, h, b1);
    let a = mul_s(&mut b, y, std::f64::consts::FRAC_1_SQRT_2);
    let e = un(&mut b, UnaryOp::Erf, a);
    let e1 = add_s(&mut b, e, 1.0);
    let hy = mul_s(&mut b, y, 0.5);
    let g0 = bin(&mut b, Mul, hy, e1);
    let (g, mask) = if dropout {
        let m = b.op(Op::Bernoulli { p: 0.5, seed: 7, offset: 0 }, &[g0]);
        (bin(&mut b, Mul, g0, m), Some(m))
    } else {
        (g0, None)
    };
    let out = b.op(Op::Mm, &[g, w2]);
    // backward
    let tg = b.op(Op::T, &[g]);
    let dw2 = b.op(Op::Mm, &[tg, dout]);
    let tw2 = b.op(Op::T, &[w2]);
    let dg_ = b.op(Op::Mm, &[dout, tw2]);
    let dg = match mask {
        Some(m) => bin(&mut b, Mul, dg_, m),
        None => dg_,
    };
    let p = bin(&mut b, Mul, dg, e1);
    let p5 = mul_s(&mut b, p, 0.5);
    let a2 = bin(&mut b, Mul, a, a);
    let na2 = un(&mut b, UnaryOp::Neg, a2);
    let ex = un(&mut b, UnaryOp::Exp, na2);
    let q = mul_s(&mut b, ex, std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
    let r = bin(&mut b, Mul, hy, q);
    let s = bin(&mut b, Mul, dg, r);
    let dy = bin(&mut b, Add, p5, s);
    let db1 = reduce(&mut b, ReduceOp::Sum, dy, &[0], false);
    let tx = b.op(Op::T, &[x]);
    let dw1 = b.op(Op::Mm, &[tx, dy]);
    let tw1 = b.op(Op::T, &[w1]);
    let dx = b.op(Op::Mm, &[dy, tw1]);
    b.g.outputs = vec![out, dx, dw1, db1, dw2];
    JointGraph {
        graph: b.g,
        num_primals: 4,
        num_tangents: 1,
        num_fw_outputs: 1,
        tangent_outputs: vec![0],
        grad_primals: vec![0, 1, 2, 3],
    }
}

/// A single-head attention block `o = softmax(q k^T / 2) v` with `q, k, v = x @ w*`,
/// and its hand-derived backward. Sizes: x [6, 4], w* [4, 4].
pub fn attention_joint() -> JointGraph {
    use BinaryOp::*;
    let mut b = B::new();
    let x = b.input("x", &[6, 4], F32);
    let wq = b.input("wq", &[4, 4], F32);
    let wk = b.input("wk", &[4, 4], F32);
    let wv = b.input("wv", &[4, 4], F32);
    let dout = b.input("dout", &[6, 4], F32);
    let q = b.op(Op::Mm, &[x, wq]);
    let k = b.op(Op::Mm, &[x, wk]);
    let v = b.op(Op::Mm, &[x, wv]);
    let kt = b.op(Op::T, &[k]);
    let sc0 = b.op(Op::Mm, &[q, kt]);
    let sc = mul_s(&mut b, sc0, 0.5);
    let m = reduce(&mut b, ReduceOp::Amax, sc, &[1], true);
    let z = bin(&mut b, Sub, sc, m);
    let ez = un(&mut b, UnaryOp::Exp, z);
    let ss = reduce(&mut b, ReduceOp::Sum, ez, &[1], true);
    let p = bin(&mut b, Div, ez, ss);
    let o = b.op(Op::Mm, &[p, v]);
    // backward
    let vt = b.op(Op::T, &[v]);
    let dp = b.op(Op::Mm, &[dout, vt]);
    let pt = b.op(Op::T, &[p]);
    let dv = b.op(Op::Mm, &[pt, dout]);
    let dpp = bin(&mut b, Mul, dp, p);
    let sdp = reduce(&mut b, ReduceOp::Sum, dpp, &[1], true);
    let dd = bin(&mut b, Sub, dp, sdp);
    let ds = bin(&mut b, Mul, p, dd);
    let dsc = mul_s(&mut b, ds, 0.5);
    let dq = b.op(Op::Mm, &[dsc, k]);
    let dsct = b.op(Op::T, &[dsc]);
    let dk = b.op(Op::Mm, &[dsct, q]);
    let xt = b.op(Op::T, &[x]);
    let dwq = b.op(Op::Mm, &[xt, dq]);
    let dwk = b.op(Op::Mm, &[xt, dk]);
    let dwv = b.op(Op::Mm, &[xt, dv]);
    let wqt = b.op(Op::T, &[wq]);
    let wkt = b.op(Op::T, &[wk]);
    let wvt = b.op(Op::T, &[wv]);
    let dx1 = b.op(Op::Mm, &[dq, wqt]);
    let dx2 = b.op(Op::Mm, &[dk, wkt]);
    let dx3 = b.op(Op::Mm, &[dv, wvt]);
    let dx12 = bin(&mut b, Add, dx1, dx2);
    let dx = bin(&mut b, Add, dx12, dx3);
    b.g.outputs = vec![o, dx, dwq, dwk, dwv];
    JointGraph {
        graph: b.g,
        num_primals: 4,
        num_tangents: 1,
        num_fw_outputs: 1,
        tangent_outputs: vec![0],
        grad_primals: vec![0, 1, 2, 3],
    }
}

/// `out = sum(exp(sum(x1, 1)) * exp(sum(x2, 1)))` with x1 f32 [8, 8], x2 f64 [8, 8]
/// (cast to f32 after the reduction), whose backward uses the two small `exp` values:
/// min-cut saves them (or their sums), budget 0 saves only the primals.
pub fn budget_joint() -> JointGraph {
    use BinaryOp::*;
    let mut b = B::new();
    let x1 = b.input("x1", &[8, 8], F32);
    let x2 = b.input("x2", &[8, 8], DType::F64);
    let dout = b.input("dout", &[], F32);
    let s1 = reduce(&mut b, ReduceOp::Sum, x1, &[1], false);
    let u1 = un(&mut b, UnaryOp::Exp, s1);
    let s2 = reduce(&mut b, ReduceOp::Sum, x2, &[1], false);
    let u2 = un(&mut b, UnaryOp::Exp, s2);
    let u2f = b.op(Op::Cast(F32), &[u2]);
    let prod = bin(&mut b, Mul, u1, u2f);
    let out = reduce(&mut b, ReduceOp::Sum, prod, &[], false);
    // backward: d/dx1 = dout * u2f * u1 broadcast over dim 1; d/dx2 likewise.
    let dprod = b.op(Op::Expand(aotgrad_ir::dims![8.into()]), &[dout]);
    let du1 = bin(&mut b, Mul, dprod, u2f);
    let ds1 = bin(&mut b, Mul, du1, u1);
    let ds1c = b.op(Op::Unsqueeze(1), &[ds1]);
    let dx1 = b.op(Op::Expand(aotgrad_ir::dims![8.into(), 8.into()]), &[ds1c]);
    let dx1c = b.op(Op::Clone, &[dx1]);
    let du2f = bin(&mut b, Mul, dprod, u1);
    let du2 = b.op(Op::Cast(DType::F64), &[du2f]);
    let ds2 = bin(&mut b, Mul, du2, u2);
    let ds2c = b.op(Op::Unsqueeze(1), &[ds2]);
    let dx2 = b.op(Op::Expand(aotgrad_ir::dims![8.into(), 8.into()]), &[ds2c]);
    let dx2c = b.op(Op::Clone, &[dx2]);
    b.g.outputs = vec![out, dx1c, dx2c];
    JointGraph {
        graph: b.g,
        num_primals: 2,
        num_tangents: 1,
        num_fw_outputs: 1,
        tangent_outputs: vec![0],
        grad_primals: vec![0, 1],
    }
}

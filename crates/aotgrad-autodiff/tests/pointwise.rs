//! Gradient checks of the pointwise rules against central finite differences.

mod common;

use aotgrad_ir::{BinaryOp, CmpOp, DType, Op, Scalar, TensorMeta, UnaryOp};
use common::*;
use proptest::prelude::*;

const F: DType = DType::F64;

#[test]
fn every_differentiable_unary_op() {
    for u in UnaryOp::ALL {
        if matches!(u, UnaryOp::Sign | UnaryOp::LogicalNot) || u.is_rounding() {
            continue;
        }
        let mut g = GB::new();
        let x = g.inp("x", &[3, 4], F);
        let y = g.op(Op::Unary(u), &[x]);
        let fw = g.outputs(&[y]);
        let mut rng = Rng(u as u64 + 1);
        let vals = match u {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log1p => rng.vec(12, 0.5, 2.0),
            _ => rng.vec_away(12, 0.1, 2.0),
        };
        let c = gradcheck_all(&fw, &[t64(&vals, &[3, 4])]);
        assert_eq!(c.grads.len(), 1, "{}", u.name());
    }
}

/// floor, ceil, round and trunc: zero gradient (PyTorch's), checked where they are
/// differentiable (away from integers and halves).
#[test]
fn rounding_ops_pass_zero_gradient() {
    for u in [UnaryOp::Floor, UnaryOp::Ceil, UnaryOp::Round, UnaryOp::Trunc] {
        let mut g = GB::new();
        let x = g.inp("x", &[4], F);
        let r = g.op(Op::Unary(u), &[x]);
        let e = g.op(Op::Unary(UnaryOp::Exp), &[x]);
        let s = g.op(Op::Binary(aotgrad_ir::BinaryOp::Add), &[r, e]);
        let fw = g.outputs(&[s]);
        let c = gradcheck_all(&fw, &[t64(&[-1.3, 2.2, 0.7, -3.6], &[4])]);
        assert_eq!(c.grads.len(), 1, "{}", u.name());
    }
}

#[test]
fn sign_and_logical_not_pass_no_gradient() {
    let mut g = GB::new();
    let x = g.inp("x", &[4], F);
    let s = g.op(Op::Unary(UnaryOp::Sign), &[x]);
    let n = g.op(Op::Unary(UnaryOp::LogicalNot), &[x]);
    let fw = g.outputs(&[s, n]);
    let c = gradcheck_all(&fw, &[t64(&[-1.0, 2.0, 0.5, -3.0], &[4])]);
    assert_eq!(c.joint.tangent_outputs, vec![0], "the bool output gets no tangent");
    assert_eq!(c.grads[0], vec![0.0; 4]);
}

fn binary_graph(op: BinaryOp, a: &[usize], b: &[usize]) -> aotgrad_ir::Graph {
    let mut g = GB::new();
    let x = g.inp("a", a, F);
    let y = g.inp("b", b, F);
    let z = g.op(Op::Binary(op), &[x, y]);
    g.outputs(&[z])
}

fn binary_inputs(op: BinaryOp, a: &[usize], b: &[usize], seed: u64) -> Vec<aotgrad_cpu::CpuTensor> {
    let mut rng = Rng(seed);
    let (na, nb) = (a.iter().product(), b.iter().product());
    let av = if op == BinaryOp::Pow { rng.vec(na, 0.5, 2.0) } else { rng.vec_away(na, 0.2, 2.0) };
    let bv = rng.vec_away(nb, 0.2, 2.0);
    vec![t64(&av, a), t64(&bv, b)]
}

#[test]
fn every_binary_op_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 4] =
        [(&[3, 1, 4], &[2, 4]), (&[4], &[3, 4]), (&[], &[2, 3]), (&[2, 3], &[2, 3])];
    for op in BinaryOp::ALL {
        for (k, (a, b)) in shapes.iter().enumerate() {
            let fw = binary_graph(op, a, b);
            let c = gradcheck_all(&fw, &binary_inputs(op, a, b, k as u64 * 31 + op as u64));
            assert_eq!(c.grads.len(), 2);
        }
    }
}

/// Random broadcast-compatible shapes: an output shape, then two operand shapes that
/// drop leading dims or shrink dims to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec((1usize..4, any::<bool>(), any::<bool>()), 0..4).prop_flat_map(|dims| {
        let out: Vec<usize> = dims.iter().map(|d| d.0).collect();
        let a: Vec<usize> = dims.iter().map(|d| if d.1 { 1 } else { d.0 }).collect();
        let b: Vec<usize> = dims.iter().map(|d| if d.2 && !d.1 { 1 } else { d.0 }).collect();
        let n = out.len();
        (Just(a), Just(b), 0..=n, 0..=n).prop_map(|(a, b, da, db)| (a[da.min(a.len())..].to_vec(), b[db..].to_vec()))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn binary_ops_on_random_broadcast_shapes((a, b) in broadcast_pair(), op in 0usize..7, seed in any::<u64>()) {
        let op = BinaryOp::ALL[op];
        let fw = binary_graph(op, &a, &b);
        gradcheck_all(&fw, &binary_inputs(op, &a, &b, seed));
    }
}

#[test]
fn every_scalar_variant() {
    let scalars = [
        (BinaryOp::Add, Scalar::Float(1.5)),
        (BinaryOp::Sub, Scalar::Int(2)),
        (BinaryOp::Mul, Scalar::Float(2.5)),
        (BinaryOp::Div, Scalar::Float(-1.5)),
        (BinaryOp::Pow, Scalar::Int(3)),
        (BinaryOp::Pow, Scalar::Int(2)),
        (BinaryOp::Pow, Scalar::Int(1)),
        (BinaryOp::Pow, Scalar::Int(0)),
        (BinaryOp::Pow, Scalar::Float(0.5)),
        (BinaryOp::Pow, Scalar::Float(-2.0)),
        (BinaryOp::Maximum, Scalar::Float(0.3)),
        (BinaryOp::Minimum, Scalar::Float(0.3)),
    ];
    for (i, (op, s)) in scalars.into_iter().enumerate() {
        let mut g = GB::new();
        let x = g.inp("x", &[2, 3], F);
        let y = g.op(Op::BinaryScalar(op, s), &[x]);
        let fw = g.outputs(&[y]);
        let vals = Rng(i as u64)
            .vec(6, 0.5, 2.0)
            .iter()
            .enumerate()
            .map(|(k, v)| if k % 2 == 0 { -v + 0.4 } else { *v })
            .collect::<Vec<_>>();
        let vals = if op == BinaryOp::Pow { vals.iter().map(|v| v.abs() + 0.1).collect() } else { vals };
        gradcheck_all(&fw, &[t64(&vals, &[2, 3])]);
    }
}

#[test]
fn maximum_and_minimum_split_ties_in_half() {
    for op in [BinaryOp::Maximum, BinaryOp::Minimum] {
        let fw = binary_graph(op, &[3], &[3]);
        let ins = [t64(&[1.0, 2.0, 3.0], &[3]), t64(&[1.0, 5.0, 0.0], &[3])];
        // A central difference at a tie also gives the half split, so the check holds;
        // compare by hand too: element 0 ties, element 1 b is larger, element 2 a is.
        let c = gradcheck(&fw, &ins, &[true, true], &[true]);
        let t = &c.tangents[0];
        let (big_a, big_b) = if op == BinaryOp::Maximum { (0.0, 1.0) } else { (1.0, 0.0) };
        assert_close(&c.grads[0], &[t[0] / 2.0, t[1] * big_a, t[2] * big_b], 1e-15);
        assert_close(&c.grads[1], &[t[0] / 2.0, t[1] * big_b, t[2] * big_a], 1e-15);
    }
}

#[test]
fn scalar_maximum_splits_ties_in_half() {
    let mut g = GB::new();
    let x = g.inp("x", &[3], F);
    let y = g.op(Op::BinaryScalar(BinaryOp::Maximum, Scalar::Float(1.0)), &[x]);
    let fw = g.outputs(&[y]);
    let c = gradcheck_all(&fw, &[t64(&[1.0, 2.0, 0.0], &[3])]);
    let t = &c.tangents[0];
    assert_close(&c.grads[0], &[t[0] / 2.0, t[1], 0.0], 1e-15);
}

#[test]
fn pow_masks_zero_exponent_and_zero_base() {
    let fw = binary_graph(BinaryOp::Pow, &[3], &[3]);
    // a = 0 with b >= 0: d/db is 0 (not 0 * -inf); b = 0: d/da is 0.
    let ins = [t64(&[0.0, 0.0, 1.5], &[3]), t64(&[2.0, 0.0, 0.0], &[3])];
    let c = run_joint(&fw, &ins, &[true, true], &[true]);
    let t = &c.tangents[0];
    // d/da = b a^(b-1): [2*0, 0 (masked), 0 (masked)]
    assert_eq!(c.grads[0], vec![0.0, 0.0, 0.0]);
    // d/db = a^b ln a: [0 (masked), 0 (masked), 1 * ln 1.5]
    assert_close(&c.grads[1], &[0.0, 0.0, t[2] * 1.5f64.ln()], 1e-15);
}

#[test]
fn where_sends_gradients_to_the_chosen_branch_only() {
    let mut g = GB::new();
    let c = g.inp("c", &[3, 4], DType::Bool);
    let a = g.inp("a", &[3, 1], F);
    let b = g.inp("b", &[4], F);
    let y = g.op(Op::Where, &[c, a, b]);
    let fw = g.outputs(&[y]);
    let mut rng = Rng(9);
    let cond: Vec<f64> = (0..12).map(|_| (rng.next_u64() & 1) as f64).collect();
    let ins = [
        strided(&cond, &TensorMeta::from_sizes(&[3, 4], DType::Bool)),
        t64(&rng.vec(3, -1.0, 1.0), &[3, 1]),
        t64(&rng.vec(4, -1.0, 1.0), &[4]),
    ];
    let ch = gradcheck(&fw, &ins, &[true, true, true], &[true]);
    assert_eq!(ch.joint.grad_primals, vec![1, 2], "the bool condition gets no gradient");
    let t = &ch.tangents[0];
    let ga: Vec<f64> = (0..3).map(|i| (0..4).map(|j| cond[i * 4 + j] * t[i * 4 + j]).sum()).collect();
    let gb: Vec<f64> = (0..4).map(|j| (0..3).map(|i| (1.0 - cond[i * 4 + j]) * t[i * 4 + j]).sum()).collect();
    assert_close(&ch.grads[0], &ga, 1e-14);
    assert_close(&ch.grads[1], &gb, 1e-14);
}

#[test]
fn clamp_passes_the_gradient_inside_the_bounds_inclusive() {
    for (min, max) in [(Some(-0.5), None), (None, Some(0.5)), (Some(-0.5), Some(0.5))] {
        let mut g = GB::new();
        let x = g.inp("x", &[2, 4], F);
        let y = g.op(Op::Clamp { min: min.map(Scalar::Float), max: max.map(Scalar::Float) }, &[x]);
        let fw = g.outputs(&[y]);
        gradcheck_all(&fw, &[t64(&[-1.0, -0.7, -0.3, -0.1, 0.2, 0.4, 0.6, 1.1], &[2, 4])]);
    }
    // On the bounds the gradient passes (PyTorch: min <= x <= max).
    let mut g = GB::new();
    let x = g.inp("x", &[3], F);
    let y = g.op(Op::Clamp { min: Some(Scalar::Int(0)), max: Some(Scalar::Int(1)) }, &[x]);
    let fw = g.outputs(&[y]);
    let c = run_joint(&fw, &[t64(&[0.0, 0.5, 1.0], &[3])], &[true], &[true]);
    assert_eq!(c.grads[0], c.tangents[0]);
}

#[test]
fn cast_returns_the_gradient_in_the_input_dtype() {
    // x: f32 -> to(f64) * w -> out (f64); grad_x = t * w rounded to f32.
    let mut g = GB::new();
    let x = g.inp("x", &[4], DType::F32);
    let w = g.inp("w", &[4], F);
    let xc = g.op(Op::Cast(F), &[x]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[xc, w]);
    let fw = g.outputs(&[y]);
    let xs = [0.5, -1.25, 2.0, 3.5];
    let ws = [0.3, -0.7, 1.1, 2.3];
    let ins = [aotgrad_cpu::CpuTensor::from_f64(&xs, &[4], DType::F32).unwrap(), t64(&ws, &[4])];
    let c = run_joint(&fw, &ins, &[true, true], &[true]);
    assert_eq!(c.outs[1].dtype(), DType::F32);
    let want: Vec<f64> = c.tangents[0].iter().zip(&ws).map(|(t, w)| ((t * w) as f32) as f64).collect();
    assert_eq!(c.grads[0], want);
    assert_close(&c.grads[1], &c.tangents[0].iter().zip(&xs).map(|(t, x)| t * x).collect::<Vec<_>>(), 1e-15);
    // Casting to an integer type cuts the gradient: x gets zeros.
    let mut g = GB::new();
    let x = g.inp("x", &[3], F);
    let i = g.op(Op::Cast(DType::I64), &[x]);
    let back = g.op(Op::Cast(F), &[i]);
    let y = g.op(Op::Binary(BinaryOp::Add), &[back, x]);
    let fw = g.outputs(&[y]);
    let c = run_joint(&fw, &[t64(&[0.3, 1.7, -2.2], &[3])], &[true], &[true]);
    assert_eq!(c.grads[0], c.tangents[0], "only the direct path contributes");
}

#[test]
fn mixed_dtype_operands_get_gradients_in_their_own_dtype() {
    // a: f64, b: f32, c: i64; a * b * c is f64.
    let mut g = GB::new();
    let a = g.inp("a", &[3], F);
    let b = g.inp("b", &[3], DType::F32);
    let k = g.inp("k", &[3], DType::I64);
    let ab = g.op(Op::Binary(BinaryOp::Mul), &[a, b]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[ab, k]);
    let fw = g.outputs(&[y]);
    let (av, bv, kv) = ([0.5, 1.5, -2.0], [2.0, -0.25, 4.0], [3i64, -1, 2]);
    let ins = [
        t64(&av, &[3]),
        aotgrad_cpu::CpuTensor::from_f64(&bv, &[3], DType::F32).unwrap(),
        aotgrad_cpu::CpuTensor::from_i64(&kv, &[3], DType::I64).unwrap(),
    ];
    let c = run_joint(&fw, &ins, &[true, true, true], &[true]);
    assert_eq!(c.joint.grad_primals, vec![0, 1], "the integer input gets no gradient");
    let t = &c.tangents[0];
    let ga: Vec<f64> = (0..3).map(|i| t[i] * bv[i] * kv[i] as f64).collect();
    let gb: Vec<f64> = (0..3).map(|i| ((t[i] * av[i] * kv[i] as f64) as f32) as f64).collect();
    assert_close(&c.grads[0], &ga, 1e-15);
    assert_eq!(c.outs[2].dtype(), DType::F32);
    assert_close(&c.grads[1], &gb, 1e-7);
}

#[test]
fn copy_sends_the_gradient_to_src_reduced_and_cast() {
    let mut g = GB::new();
    let dst = g.inp("dst", &[3, 4], F);
    let src = g.inp("src", &[4], F);
    let y = g.op(Op::Copy, &[dst, src]);
    let fw = g.outputs(&[y]);
    let mut rng = Rng(4);
    let c = gradcheck_all(&fw, &[t64(&rng.vec(12, -1.0, 1.0), &[3, 4]), t64(&rng.vec(4, -1.0, 1.0), &[4])]);
    assert_eq!(c.grads[0], vec![0.0; 12], "dst only lends its shape");
    // src f32 into an f64 dst: its gradient is f32.
    let mut g = GB::new();
    let dst = g.inp("dst", &[2, 2], F);
    let src = g.inp("src", &[2], DType::F32);
    let y = g.op(Op::Copy, &[dst, src]);
    let fw = g.outputs(&[y]);
    let ins = [t64(&[0.0; 4], &[2, 2]), aotgrad_cpu::CpuTensor::from_f64(&[1.0, 2.0], &[2], DType::F32).unwrap()];
    let c = run_joint(&fw, &ins, &[false, true], &[true]);
    let t = &c.tangents[0];
    assert_eq!(c.outs[1].dtype(), DType::F32);
    assert_close(&c.grads[0], &[t[0] + t[2], t[1] + t[3]], 1e-7);
}

#[test]
fn clone_and_constants() {
    // clone passes the gradient; full_like, bernoulli and comparisons are constants.
    let mut g = GB::new();
    let x = g.inp("x", &[2, 3], F);
    let c = g.op(Op::Clone, &[x]);
    let f = g.op(Op::FullLike { value: Scalar::Float(2.0), dtype: None }, &[x]);
    let r = g.op(Op::Bernoulli { p: 0.5, seed: 3, offset: 0 }, &[x]);
    let m = g.op(Op::CompareScalar(CmpOp::Gt, Scalar::Float(0.0)), &[x]);
    let mf = g.op(Op::Cast(F), &[m]);
    let s1 = g.op(Op::Binary(BinaryOp::Mul), &[c, f]);
    let s2 = g.op(Op::Binary(BinaryOp::Add), &[s1, r]);
    let y = g.op(Op::Binary(BinaryOp::Add), &[s2, mf]);
    let fw = g.outputs(&[y]);
    let ch = gradcheck_all(&fw, &[t64(&Rng(2).vec_away(6, 0.1, 1.0), &[2, 3])]);
    let want: Vec<f64> = ch.tangents[0].iter().map(|t| 2.0 * t).collect();
    assert_close(&ch.grads[0], &want, 1e-15);
}

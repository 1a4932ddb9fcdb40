//! Pointwise kernels against f64 formulas on logical indices.

mod common;

use aotgrad_cpu::{execute, CpuError, CpuTensor};
use aotgrad_ir::{BinaryOp, CmpOp, DType, Op, Scalar, UnaryOp};
use common::*;

/// A reference erf: the Maclaurin series (accurate to ~1e-12 for |x| <= 3).
fn erf_series(x: f64) -> f64 {
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let t = term / (2 * n + 1) as f64;
        sum += t;
        if t.abs() < 1e-18 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Erf => erf_series(x),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::LogicalNot => (x == 0.0) as u8 as f64,
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        // Halves go to the even neighbour (PyTorch's round).
        UnaryOp::Round => {
            if (x - x.trunc()).abs() == 0.5 {
                2.0 * (x / 2.0).round()
            } else {
                x.round()
            }
        }
        UnaryOp::Trunc => x.trunc(),
        // Independent identities: ln(1+x) = 2 artanh(x / (2 + x)),
        // e^x - 1 = 2 tanh(x/2) / (1 - tanh(x/2)).
        UnaryOp::Log1p => 2.0 * (x / (2.0 + x)).atanh(),
        UnaryOp::Expm1 => {
            let t = (x / 2.0).tanh();
            2.0 * t / (1.0 - t)
        }
    }
}

fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-11, 1e-12),
        DType::F32 => (2e-6, 1e-6),
        DType::F16 => (2e-3, 1e-3),
        _ => (1e-2, 1e-2),
    }
}

#[test]
fn unary_float_ops_on_strided_views_all_float_dtypes() {
    // Base 5x6; the view is the transposed 3x4 block starting at (1, 1) with row step 1.
    let base_data: Vec<f64> = vals(30, 0.2).into_iter().map(|v| v * 0.9).collect();
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let base = tf(&base_data, &[5, 6], dtype);
        let stored = base.to_vec_f64();
        let (shape, strides, offset) = ([4, 3], [1, 6], 7);
        let x = strided(&base, &shape, &strides, offset);
        let xs = logical(&stored, &shape, &strides, offset);
        for op in UnaryOp::ALL {
            if op == UnaryOp::LogicalNot {
                continue;
            }
            let got = exec(&Op::Unary(op), &[&x], &out(&shape, dtype));
            assert_eq!(got.dtype(), dtype);
            assert_eq!(got.shape(), shape);
            let want: Vec<f64> = xs.iter().map(|&v| unary_ref(op, v)).collect();
            let (rtol, atol) = tol(dtype);
            assert_close(&got.to_vec_f64(), &want, rtol, atol);
        }
    }
}

#[test]
fn unary_special_values_follow_pytorch() {
    let x = tf(&[f64::NAN, 0.0, -0.0, -2.0, 3.0], &[5], DType::F32);
    let run = |op| exec(&Op::Unary(op), &[&x], &out(&[5], DType::F32)).to_vec_f64();
    assert_close(&run(UnaryOp::Relu), &[f64::NAN, 0.0, 0.0, 0.0, 3.0], 0.0, 0.0);
    assert_eq!(run(UnaryOp::Sign), vec![0.0, 0.0, 0.0, -1.0, 1.0]);
    let not = exec(&Op::Unary(UnaryOp::LogicalNot), &[&x], &out(&[5], DType::Bool));
    assert_eq!(not.to_vec_bool(), vec![false, true, true, false, false]);
    // erf against tabulated values (Abramowitz & Stegun), in f64.
    let e = tf(&[0.5, 1.0, 2.0, -0.3, 0.0], &[5], DType::F64);
    let got = exec(&Op::Unary(UnaryOp::Erf), &[&e], &out(&[5], DType::F64)).to_vec_f64();
    let want =
        [0.520_499_877_813_046_5, 0.842_700_792_949_714_9, 0.995_322_265_018_952_7, -0.328_626_759_459_127_4, 0.0];
    assert_close(&got, &want, 1e-15, 1e-16);
}

#[test]
fn unary_integer_ops_keep_dtype_and_wrap() {
    let x = ti(&[-3, 0, 5, i32::MIN as i64], &[4], DType::I32);
    let run = |op| exec(&Op::Unary(op), &[&x], &out(&[4], DType::I32)).to_vec_i64();
    assert_eq!(run(UnaryOp::Neg), vec![3, 0, -5, i32::MIN as i64]);
    assert_eq!(run(UnaryOp::Abs), vec![3, 0, 5, i32::MIN as i64]);
    assert_eq!(run(UnaryOp::Relu), vec![0, 0, 5, 0]);
    assert_eq!(run(UnaryOp::Sign), vec![-1, 0, 1, -1]);
    // Integer inputs of float functions are promoted by inference; the kernel computes
    // in the output dtype.
    let e = exec(&Op::Unary(UnaryOp::Exp), &[&x], &out(&[4], DType::F32)).to_vec_f64();
    assert_close(&e[..3], &[(-3f64).exp(), 1.0, 5f64.exp()], 1e-6, 0.0);
}

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

#[test]
fn binary_float_ops_broadcast_over_noncontiguous_inputs() {
    // a: (2, 3, 4) permuted view of a (4, 3, 2) contiguous base (positive for pow).
    let a_base: Vec<f64> = vals(24, 0.1).iter().map(|v| v.abs() + 0.5).collect();
    // b: shape (3, 1), a column sliced with step 2 from a (6,) base.
    let b_base: Vec<f64> = vals(6, 1.3);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let ab = tf(&a_base, &[4, 3, 2], dtype);
        let bb = tf(&b_base, &[6], dtype);
        let a = strided(&ab, &[2, 3, 4], &[1, 2, 6], 0);
        let b = strided(&bb, &[3, 1], &[2, 1], 1);
        let av = logical(&ab.to_vec_f64(), &[2, 3, 4], &[1, 2, 6], 0);
        let bv = broadcast(&logical(&bb.to_vec_f64(), &[3, 1], &[2, 1], 1), &[3, 1], &[2, 3, 4]);
        for op in BinaryOp::ALL {
            let got = exec(&Op::Binary(op), &[&a, &b], &out(&[2, 3, 4], dtype));
            let want: Vec<f64> = av.iter().zip(&bv).map(|(&x, &y)| binary_ref(op, x, y)).collect();
            let (rtol, atol) = tol(dtype);
            assert_close(&got.to_vec_f64(), &want, rtol * 4.0, atol * 4.0);
        }
    }
}

#[test]
fn binary_mixed_dtypes_compute_in_the_output_dtype() {
    // f32 + f64 -> f64: the f32 operand is widened exactly, the sum is not rounded to f32.
    let a = tf(&[0.1, 0.2], &[2], DType::F32);
    let b = tf(&[1e-10, 0.3], &[2], DType::F64);
    let got = exec(&Op::Binary(BinaryOp::Add), &[&a, &b], &out(&[2], DType::F64)).to_vec_f64();
    assert_eq!(got, vec![0.1f32 as f64 + 1e-10, 0.2f32 as f64 + 0.3]);
    // i32 / i32 is true division into f32.
    let x = ti(&[7, -7, 1], &[3], DType::I32);
    let y = ti(&[2, 2, 0], &[3], DType::I32);
    let q = exec(&Op::Binary(BinaryOp::Div), &[&x, &y], &out(&[3], DType::F32)).to_vec_f64();
    assert_eq!(q, vec![3.5, -3.5, f64::INFINITY]);
}

#[test]
fn binary_integer_ops_wrap_like_their_dtype() {
    let a = ti(&[i32::MAX as i64, 3, -2, 2, 7], &[5], DType::I32);
    let b = ti(&[1, 4, 3, 31, -9], &[5], DType::I32);
    let run = |op, d| exec(&Op::Binary(op), &[&a, &b], &out(&[5], d)).to_vec_i64();
    assert_eq!(run(BinaryOp::Add, DType::I32), vec![i32::MIN as i64, 7, 1, 33, -2]);
    assert_eq!(run(BinaryOp::Sub, DType::I32), vec![i32::MAX as i64 - 1, -1, -5, -29, 16]);
    assert_eq!(run(BinaryOp::Mul, DType::I32), vec![i32::MAX as i64, 12, -6, 62, -63]);
    assert_eq!(run(BinaryOp::Maximum, DType::I32), vec![i32::MAX as i64, 4, 3, 31, 7]);
    assert_eq!(run(BinaryOp::Minimum, DType::I32), vec![1, 3, -2, 2, -9]);
    let p = ti(&[3, -2, 2, 2, 0], &[5], DType::I32);
    let e = ti(&[4, 3, 31, 30, 0], &[5], DType::I32);
    let pow = exec(&Op::Binary(BinaryOp::Pow), &[&p, &e], &out(&[5], DType::I32)).to_vec_i64();
    // 2^31 wraps to i32::MIN; 0^0 = 1.
    assert_eq!(pow, vec![81, -8, i32::MIN as i64, 1 << 30, 1]);
    let p64 = ti(&[2, 3], &[2], DType::I64);
    let e64 = ti(&[62, 40], &[2], DType::I64);
    let pow64 = exec(&Op::Binary(BinaryOp::Pow), &[&p64, &e64], &out(&[2], DType::I64)).to_vec_i64();
    assert_eq!(pow64, vec![1 << 62, 3i64.wrapping_pow(40)]);
}

#[test]
fn integer_pow_with_negative_exponent_is_a_kernel_error() {
    let a = ti(&[2, 3], &[2], DType::I64);
    let b = ti(&[1, -1], &[2], DType::I64);
    let err = execute(&Op::Binary(BinaryOp::Pow), &[&a, &b], &out(&[2], DType::I64)).unwrap_err();
    assert!(matches!(&err, CpuError::Kernel { op, .. } if op == "pow"), "{err}");
    assert!(err.to_string().contains("negative integer powers"), "{err}");
    let err = execute(&Op::BinaryScalar(BinaryOp::Pow, Scalar::Int(-2)), &[&a], &out(&[2], DType::I64)).unwrap_err();
    assert!(matches!(err, CpuError::Kernel { .. }));
}

#[test]
fn maximum_and_minimum_propagate_nan() {
    let a = tf(&[f64::NAN, 1.0, 2.0], &[3], DType::F32);
    let b = tf(&[0.0, f64::NAN, 1.0], &[3], DType::F32);
    let mx = exec(&Op::Binary(BinaryOp::Maximum), &[&a, &b], &out(&[3], DType::F32)).to_vec_f64();
    let mn = exec(&Op::Binary(BinaryOp::Minimum), &[&a, &b], &out(&[3], DType::F32)).to_vec_f64();
    assert_close(&mx, &[f64::NAN, f64::NAN, 2.0], 0.0, 0.0);
    assert_close(&mn, &[f64::NAN, f64::NAN, 1.0], 0.0, 0.0);
}

#[test]
fn bool_arithmetic_is_logical_and_sub_is_rejected() {
    let a = CpuTensor::from_bool(&[true, true, false, false], &[4]).unwrap();
    let b = CpuTensor::from_bool(&[true, false, true, false], &[4]).unwrap();
    let add = exec(&Op::Binary(BinaryOp::Add), &[&a, &b], &out(&[4], DType::Bool));
    assert_eq!(add.to_vec_bool(), vec![true, true, true, false]);
    let mul = exec(&Op::Binary(BinaryOp::Mul), &[&a, &b], &out(&[4], DType::Bool));
    assert_eq!(mul.to_vec_bool(), vec![true, false, false, false]);
    assert!(matches!(
        execute(&Op::Binary(BinaryOp::Sub), &[&a, &b], &out(&[4], DType::Bool)),
        Err(CpuError::Kernel { .. })
    ));
}

#[test]
fn binary_scalar_uses_the_output_dtype() {
    let x = ti(&[1, -3, 4], &[3], DType::I32);
    let f = exec(&Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.5)), &[&x], &out(&[3], DType::F32));
    assert_eq!((f.dtype(), f.to_vec_f64()), (DType::F32, vec![2.5, -7.5, 10.0]));
    let i = exec(&Op::BinaryScalar(BinaryOp::Add, Scalar::Int(3)), &[&x], &out(&[3], DType::I32));
    assert_eq!((i.dtype(), i.to_vec_i64()), (DType::I32, vec![4, 0, 7]));
    let d = exec(&Op::BinaryScalar(BinaryOp::Div, Scalar::Int(2)), &[&x], &out(&[3], DType::F32));
    assert_eq!(d.to_vec_f64(), vec![0.5, -1.5, 2.0]);
    let p = exec(&Op::BinaryScalar(BinaryOp::Pow, Scalar::Int(3)), &[&x], &out(&[3], DType::I32));
    assert_eq!(p.to_vec_i64(), vec![1, -27, 64]);
    // f16 tensor with a float scalar stays f16 (the value is rounded to f16).
    let h = tf(&[1.0, 2.0], &[2], DType::F16);
    let hs = exec(&Op::BinaryScalar(BinaryOp::Add, Scalar::Float(0.1)), &[&h], &out(&[2], DType::F16));
    assert_eq!(hs.dtype(), DType::F16);
    assert_eq!(hs.to_vec_f64(), vec![round_to(1.1, DType::F16), round_to(2.1, DType::F16)]);
    // Maximum with a scalar broadcasts the scalar.
    let y = tf(&[-1.0, 0.5, f64::NAN], &[3], DType::F64);
    let m = exec(&Op::BinaryScalar(BinaryOp::Maximum, Scalar::Float(0.0)), &[&y], &out(&[3], DType::F64));
    assert_close(&m.to_vec_f64(), &[0.0, 0.5, f64::NAN], 0.0, 0.0);
}

#[test]
fn comparisons_promote_inputs_and_broadcast() {
    // f32(0.1) != f64(0.1) once compared in f64 (the promoted dtype).
    let a = tf(&[0.1, 0.5], &[2], DType::F32);
    let b = tf(&[0.1, 0.5], &[2], DType::F64);
    let eq = exec(&Op::Compare(CmpOp::Eq), &[&a, &b], &out(&[2], DType::Bool));
    assert_eq!(eq.to_vec_bool(), vec![false, true]);
    // (2, 1) vs (3,) -> (2, 3).
    let x = tf(&[1.0, 2.0], &[2, 1], DType::F32);
    let y = ti(&[0, 1, 2], &[3], DType::I64);
    let expect = |f: fn(f64, f64) -> bool| -> Vec<bool> {
        indices(&[2, 3]).iter().map(|ix| f([1.0, 2.0][ix[0]], ix[1] as f64)).collect()
    };
    type Pred = fn(f64, f64) -> bool;
    let cases: [(CmpOp, Pred); 6] = [
        (CmpOp::Eq, |p, q| p == q),
        (CmpOp::Ne, |p, q| p != q),
        (CmpOp::Lt, |p, q| p < q),
        (CmpOp::Le, |p, q| p <= q),
        (CmpOp::Gt, |p, q| p > q),
        (CmpOp::Ge, |p, q| p >= q),
    ];
    for (op, f) in cases {
        let got = exec(&Op::Compare(op), &[&x, &y], &out(&[2, 3], DType::Bool));
        assert_eq!(got.to_vec_bool(), expect(f), "{op:?}");
    }
    // Scalar comparisons: an int tensor against a float scalar compares as float.
    let i = ti(&[1, 2, 3], &[3], DType::I64);
    let gt = exec(&Op::CompareScalar(CmpOp::Gt, Scalar::Float(2.5)), &[&i], &out(&[3], DType::Bool));
    assert_eq!(gt.to_vec_bool(), vec![false, false, true]);
    let n = tf(&[f64::NAN, 1.0], &[2], DType::F32);
    let ne = exec(&Op::CompareScalar(CmpOp::Ne, Scalar::Float(1.0)), &[&n], &out(&[2], DType::Bool));
    assert_eq!(ne.to_vec_bool(), vec![true, false]);
    let ge = exec(&Op::CompareScalar(CmpOp::Ge, Scalar::Float(f64::NAN)), &[&n], &out(&[2], DType::Bool));
    assert_eq!(ge.to_vec_bool(), vec![false, false]);
}

#[test]
fn where_broadcasts_and_promotes() {
    let c = CpuTensor::from_bool(&[true, false, true], &[3]).unwrap();
    let a = ti(&[1, 2], &[2, 1], DType::I32);
    let b = tf(&[0.5, 1.5, 2.5], &[3], DType::F32);
    let got = exec(&Op::Where, &[&c, &a, &b], &out(&[2, 3], DType::F32));
    assert_eq!(got.to_vec_f64(), vec![1.0, 1.5, 1.0, 2.0, 1.5, 2.0]);
}

#[test]
fn clamp_handles_nan_and_crossed_bounds() {
    let x = tf(&[-2.0, 0.5, 3.0, f64::NAN], &[4], DType::F32);
    let op = Op::Clamp { min: Some(Scalar::Float(-1.0)), max: Some(Scalar::Float(1.0)) };
    assert_close(&exec(&op, &[&x], &out(&[4], DType::F32)).to_vec_f64(), &[-1.0, 0.5, 1.0, f64::NAN], 0.0, 0.0);
    let crossed = Op::Clamp { min: Some(Scalar::Float(2.0)), max: Some(Scalar::Float(1.0)) };
    assert_close(&exec(&crossed, &[&x], &out(&[4], DType::F32)).to_vec_f64(), &[1.0, 1.0, 1.0, f64::NAN], 0.0, 0.0);
    let lo = Op::Clamp { min: Some(Scalar::Int(0)), max: None };
    let i = ti(&[-5, 5], &[2], DType::I64);
    assert_eq!(exec(&lo, &[&i], &out(&[2], DType::I64)).to_vec_i64(), vec![0, 5]);
    // An int tensor clamped by a float bound computes in the promoted float dtype.
    let hi = Op::Clamp { min: None, max: Some(Scalar::Float(2.5)) };
    assert_eq!(exec(&hi, &[&i], &out(&[2], DType::F32)).to_vec_f64(), vec![-5.0, 2.5]);
}

#[test]
fn casts_truncate_wrap_and_round_once() {
    let x = tf(&[-2.7, 2.7, f64::NAN, 0.0, 0.1], &[5], DType::F64);
    let to = |d| exec(&Op::Cast(d), &[&x], &out(&[5], d));
    assert_eq!(to(DType::I64).to_vec_i64()[..2], [-2, 2]);
    assert_eq!(to(DType::Bool).to_vec_bool(), vec![true, true, true, false, true]);
    let h = to(DType::F16).to_vec_f64();
    assert_eq!(h[4], 0.0999755859375, "f64 -> f16 rounds directly to nearest");
    let big = ti(&[(1 << 32) + 7, -1], &[2], DType::I64);
    assert_eq!(exec(&Op::Cast(DType::I32), &[&big], &out(&[2], DType::I32)).to_vec_i64(), vec![7, -1]);
    let b = CpuTensor::from_bool(&[true, false], &[2]).unwrap();
    assert_eq!(exec(&Op::Cast(DType::BF16), &[&b], &out(&[2], DType::BF16)).to_vec_f64(), vec![1.0, 0.0]);
    // Cast of a transposed view reads logically.
    let m = tf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32);
    let mt = strided(&m, &[3, 2], &[1, 3], 0);
    assert_eq!(exec(&Op::Cast(DType::I32), &[&mt], &out(&[3, 2], DType::I32)).to_vec_i64(), vec![1, 4, 2, 5, 3, 6]);
}

#[test]
fn copy_broadcasts_src_and_casts_to_dst() {
    let dst = CpuTensor::zeros(&[2, 3], DType::I64);
    let src = tf(&[1.9, -2.9, 3.5], &[3], DType::F64);
    let got = exec(&Op::Copy, &[&dst, &src], &out(&[2, 3], DType::I64));
    assert_eq!(got.to_vec_i64(), vec![1, -2, 3, 1, -2, 3]);
    assert!(!got.same_storage(&dst), "out-of-place copy returns fresh storage");
    assert_eq!(dst.to_vec_i64(), vec![0; 6]);
}

//! Reductions and arg-reductions against loops over logical indices.

mod common;

use aotgrad_cpu::{execute, CpuError};
use aotgrad_ir::{DType, Op, ReduceOp};
use common::*;

/// Reference reduction of `v` (shape `shape`) over `dims`, output in row-major kept order.
fn reduce_ref(v: &[f64], shape: &[usize], dims: &[usize], f: fn(&[f64]) -> f64) -> Vec<f64> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let kshape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    indices(&kshape)
        .iter()
        .map(|k| {
            let group: Vec<f64> = indices(shape)
                .iter()
                .filter(|ix| kept.iter().zip(k).all(|(&d, &i)| ix[d] == i))
                .map(|ix| v[flat(shape, ix)])
                .collect();
            f(&group)
        })
        .collect()
}

fn sum(g: &[f64]) -> f64 {
    g.iter().sum()
}
fn mean(g: &[f64]) -> f64 {
    g.iter().sum::<f64>() / g.len() as f64
}
fn amax(g: &[f64]) -> f64 {
    g.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
fn amin(g: &[f64]) -> f64 {
    g.iter().copied().fold(f64::INFINITY, f64::min)
}

#[test]
fn reductions_over_dim_sets_of_a_permuted_view() {
    let shape = [3, 4, 2];
    // A (3, 4, 2) view of a contiguous (2, 4, 3) base, dims permuted (2, 1, 0).
    let base_data = vals(24, 0.4);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let base = tf(&base_data, &[2, 4, 3], dtype);
        let x = strided(&base, &shape, &[1, 3, 12], 0);
        let xv = logical(&base.to_vec_f64(), &shape, &[1, 3, 12], 0);
        for dims in [vec![], vec![0], vec![1], vec![2], vec![0, 2], vec![1, 2]] {
            for keepdim in [false, true] {
                let all: Vec<usize> = (0..3).collect();
                let red = if dims.is_empty() { &all } else { &dims };
                let oshape: Vec<usize> = (0..3)
                    .filter_map(|d| if red.contains(&d) { keepdim.then_some(1) } else { Some(shape[d]) })
                    .collect();
                for (op, f) in [
                    (ReduceOp::Sum, sum as fn(&[f64]) -> f64),
                    (ReduceOp::Mean, mean),
                    (ReduceOp::Amax, amax),
                    (ReduceOp::Amin, amin),
                ] {
                    let got = exec(&Op::Reduce { op, dims: dims.clone(), keepdim }, &[&x], &out(&oshape, dtype));
                    assert_eq!(got.shape(), oshape);
                    let want: Vec<f64> =
                        reduce_ref(&xv, &shape, red, f).into_iter().map(|w| round_to(w, dtype)).collect();
                    let rtol = if matches!(dtype, DType::F16 | DType::BF16) { 1e-2 } else { 1e-6 };
                    assert_close(&got.to_vec_f64(), &want, rtol, 1e-6);
                }
            }
        }
    }
}

#[test]
fn float_sums_are_accurate() {
    // 2^24 followed by 1000 ones in f32: sequential f32 accumulation stalls at 2^24
    // (2^24 + 1 rounds back to 2^24); the f64 accumulator gets the exact 2^24 + 1000.
    let mut data = vec![16_777_216.0];
    data.extend(std::iter::repeat_n(1.0, 1000));
    let x = tf(&data, &[data.len()], DType::F32);
    let s = exec(&Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[&x], &out(&[], DType::F32));
    assert_eq!(s.to_vec_f64(), vec![16_778_216.0]);
    // 0.1 summed 10^6 times in f64: pairwise summation keeps the error tiny.
    let m = 1_000_000;
    let y = tf(&vec![0.1; m], &[m], DType::F64);
    let s = exec(&Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[&y], &out(&[], DType::F64));
    assert!((s.to_vec_f64()[0] - 100_000.0).abs() < 1e-8, "{:?}", s.to_vec_f64());
}

#[test]
fn integer_and_bool_sums_accumulate_in_i64() {
    let x = ti(&[i32::MAX as i64, i32::MAX as i64, 1, 2], &[2, 2], DType::I32);
    let s = exec(&Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: true }, &[&x], &out(&[1, 2], DType::I64));
    assert_eq!(s.to_vec_i64(), vec![i32::MAX as i64 + 1, i32::MAX as i64 + 2]);
    let mx = exec(&Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: false }, &[&x], &out(&[2], DType::I32));
    assert_eq!(mx.to_vec_i64(), vec![i32::MAX as i64, 2]);
    let b = aotgrad_cpu::CpuTensor::from_bool(&[true, false, true, true], &[4]).unwrap();
    let s = exec(&Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[&b], &out(&[], DType::I64));
    assert_eq!(s.to_vec_i64(), vec![3]);
    let any = exec(&Op::Reduce { op: ReduceOp::Amax, dims: vec![], keepdim: false }, &[&b], &out(&[], DType::Bool));
    assert_eq!(any.to_vec_bool(), vec![true]);
}

#[test]
fn reductions_propagate_nan_and_handle_empty_and_scalar_inputs() {
    let x = tf(&[1.0, f64::NAN, 3.0, 2.0], &[2, 2], DType::F32);
    let r = |op| exec(&Op::Reduce { op, dims: vec![1], keepdim: false }, &[&x], &out(&[2], DType::F32)).to_vec_f64();
    assert_close(&r(ReduceOp::Amax), &[f64::NAN, 3.0], 0.0, 0.0);
    assert_close(&r(ReduceOp::Amin), &[f64::NAN, 2.0], 0.0, 0.0);
    assert_close(&r(ReduceOp::Sum), &[f64::NAN, 5.0], 0.0, 0.0);
    // Sum over an empty dim is 0, mean is NaN, amax is an error.
    let e = tf(&[], &[2, 0], DType::F32);
    let s = exec(&Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[&e], &out(&[2], DType::F32));
    assert_eq!(s.to_vec_f64(), vec![0.0, 0.0]);
    let m = exec(&Op::Reduce { op: ReduceOp::Mean, dims: vec![1], keepdim: false }, &[&e], &out(&[2], DType::F32));
    let mv = m.try_to_vec_f64().unwrap();
    assert!(mv.len() == 2 && mv.iter().all(|v| v.is_nan()), "{mv:?}");
    let err = execute(&Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: false }, &[&e], &out(&[2], DType::F32));
    assert!(matches!(err, Err(CpuError::Kernel { .. })));
    // A 0-d tensor reduces to itself.
    let z = tf(&[4.5], &[], DType::F64);
    let s = exec(&Op::Reduce { op: ReduceOp::Mean, dims: vec![0], keepdim: false }, &[&z], &out(&[], DType::F64));
    assert_eq!(s.to_vec_f64(), vec![4.5]);
}

#[test]
fn argmax_argmin_take_first_extreme_and_nan() {
    // Transposed view of [[1, 5, 5], [7, 0, 7]] -> shape (3, 2).
    let base = tf(&[1.0, 5.0, 5.0, 7.0, 0.0, 7.0], &[2, 3], DType::F32);
    let x = strided(&base, &[3, 2], &[1, 3], 0);
    let am = |dim, keep: bool, o: &[usize]| {
        exec(&Op::ArgMax { dim, keepdim: keep }, &[&x], &out(o, DType::I64)).to_vec_i64()
    };
    let an = |dim, keep: bool, o: &[usize]| {
        exec(&Op::ArgMin { dim, keepdim: keep }, &[&x], &out(o, DType::I64)).to_vec_i64()
    };
    // x = [[1, 7], [5, 0], [5, 7]]
    assert_eq!(am(0, false, &[2]), vec![1, 0]);
    assert_eq!(am(1, true, &[3, 1]), vec![1, 0, 1]);
    assert_eq!(an(0, false, &[2]), vec![0, 1]);
    assert_eq!(an(1, false, &[3]), vec![0, 1, 0]);
    let n = tf(&[1.0, f64::NAN, 9.0, f64::NAN], &[4], DType::F64);
    assert_eq!(exec(&Op::ArgMax { dim: 0, keepdim: false }, &[&n], &out(&[], DType::I64)).to_vec_i64(), vec![1]);
    assert_eq!(exec(&Op::ArgMin { dim: 0, keepdim: false }, &[&n], &out(&[], DType::I64)).to_vec_i64(), vec![1]);
    let i = ti(&[3, -4, 9, 9], &[4], DType::I32);
    assert_eq!(exec(&Op::ArgMax { dim: 0, keepdim: false }, &[&i], &out(&[], DType::I64)).to_vec_i64(), vec![2]);
    assert_eq!(exec(&Op::ArgMin { dim: 0, keepdim: false }, &[&i], &out(&[], DType::I64)).to_vec_i64(), vec![1]);
    let e = tf(&[], &[0, 2], DType::F32);
    assert!(matches!(
        execute(&Op::ArgMax { dim: 0, keepdim: false }, &[&e], &out(&[2], DType::I64)),
        Err(CpuError::Kernel { .. })
    ));
}

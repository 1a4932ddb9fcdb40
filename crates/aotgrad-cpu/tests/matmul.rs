//! `mm`/`bmm` against a naive f64 triple loop, on strided operands and every dtype family.

mod common;

use aotgrad_cpu::{execute, CpuError, CpuTensor};
use aotgrad_ir::{DType, Op};
use common::*;

/// Naive (n, k) @ (k, m) in f64.
fn naive(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            c[i * m + j] = (0..k).map(|q| a[i * k + q] * b[q * m + j]).sum();
        }
    }
    c
}

#[test]
fn mm_on_transposed_and_sliced_operands_all_float_dtypes() {
    let (n, k, m) = (5, 7, 4);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        // a = transpose of a contiguous (k, n) matrix.
        let abase = tf(&vals(k * n, 0.3), &[k, n], dtype);
        let a = strided(&abase, &[n, k], &[1, n], 0);
        let av = logical(&abase.to_vec_f64(), &[n, k], &[1, n], 0);
        // b = every other row of a (2k, m + 1) matrix, skipping the first column.
        let bbase = tf(&vals(2 * k * (m + 1), 1.1), &[2 * k, m + 1], dtype);
        let b = strided(&bbase, &[k, m], &[2 * (m + 1), 1], 1);
        let bv = logical(&bbase.to_vec_f64(), &[k, m], &[2 * (m + 1), 1], 1);
        let got = exec(&Op::Mm, &[&a, &b], &out(&[n, m], dtype));
        assert_eq!((got.shape(), got.dtype()), (vec![n, m], dtype));
        let want: Vec<f64> = naive(&av, &bv, n, k, m).into_iter().map(|w| round_to(w, dtype)).collect();
        let (rtol, atol) = match dtype {
            DType::F64 => (1e-13, 1e-13),
            DType::F32 => (1e-5, 1e-5),
            _ => (1e-2, 5e-2),
        };
        assert_close(&got.to_vec_f64(), &want, rtol, atol);
    }
}

#[test]
fn mm_of_a_matrix_with_its_own_transpose_and_expanded_operands() {
    // Both operands share one storage (x @ x.t()).
    let x = tf(&vals(12, 0.0), &[3, 4], DType::F64);
    let xt = strided(&x, &[4, 3], &[1, 4], 0);
    let xv = x.to_vec_f64();
    let xtv = logical(&xv, &[4, 3], &[1, 4], 0);
    let got = exec(&Op::Mm, &[&x, &xt], &out(&[3, 3], DType::F64));
    assert_close(&got.to_vec_f64(), &naive(&xv, &xtv, 3, 4, 3), 1e-13, 1e-13);
    // A row expanded to (2, 4) (stride 0) times (4, 1): 1 + 2*0.5 + 3*0.25 + 4*2.
    let row = tf(&[1.0, 2.0, 3.0, 4.0], &[1, 4], DType::F32);
    let e = strided(&row, &[2, 4], &[0, 1], 0);
    let col = tf(&[1.0, 0.5, 0.25, 2.0], &[4, 1], DType::F32);
    let got = exec(&Op::Mm, &[&e, &col], &out(&[2, 1], DType::F32));
    assert_eq!(got.to_vec_f64(), vec![10.75, 10.75]);
}

#[test]
fn bmm_on_transposed_batches() {
    let (bt, n, k, m) = (3, 2, 5, 4);
    for dtype in [DType::F32, DType::F64] {
        // a: (bt, n, k) as a transpose of contiguous (bt, k, n).
        let abase = tf(&vals(bt * k * n, 0.7), &[bt, k, n], dtype);
        let a = strided(&abase, &[bt, n, k], &[k * n, 1, n], 0);
        let av = logical(&abase.to_vec_f64(), &[bt, n, k], &[k * n, 1, n], 0);
        // b: (bt, k, m) with the batch dim outermost in memory reversed order via a permute:
        // contiguous (k, bt, m) seen as (bt, k, m).
        let bbase = tf(&vals(k * bt * m, 2.2), &[k, bt, m], dtype);
        let b = strided(&bbase, &[bt, k, m], &[m, bt * m, 1], 0);
        let bv = logical(&bbase.to_vec_f64(), &[bt, k, m], &[m, bt * m, 1], 0);
        let got = exec(&Op::Bmm, &[&a, &b], &out(&[bt, n, m], dtype));
        let mut want = Vec::new();
        for i in 0..bt {
            want.extend(naive(&av[i * n * k..(i + 1) * n * k], &bv[i * k * m..(i + 1) * k * m], n, k, m));
        }
        let want: Vec<f64> = want.into_iter().map(|w| round_to(w, dtype)).collect();
        assert_close(&got.to_vec_f64(), &want, 1e-5, 1e-5);
    }
}

#[test]
fn integer_matmul_wraps_and_empty_inner_dim_gives_zeros() {
    let a = ti(&[1, 2, 3, 4, 5, 6], &[2, 3], DType::I64);
    let b = ti(&[7, 8, 9, 10, 11, 12], &[3, 2], DType::I64);
    let got = exec(&Op::Mm, &[&a, &b], &out(&[2, 2], DType::I64));
    assert_eq!(got.to_vec_i64(), vec![58, 64, 139, 154]);
    let big = ti(&[i32::MAX as i64, 1], &[1, 2], DType::I32);
    let one = ti(&[1, 1], &[2, 1], DType::I32);
    assert_eq!(exec(&Op::Mm, &[&big, &one], &out(&[1, 1], DType::I32)).to_vec_i64(), vec![i32::MIN as i64]);
    let e1 = CpuTensor::zeros(&[2, 0], DType::F32);
    let e2 = CpuTensor::zeros(&[0, 3], DType::F32);
    assert_eq!(exec(&Op::Mm, &[&e1, &e2], &out(&[2, 3], DType::F32)).to_vec_f64(), vec![0.0; 6]);
}

#[test]
fn mismatched_shapes_are_kernel_errors() {
    let a = CpuTensor::zeros(&[2, 3], DType::F32);
    let b = CpuTensor::zeros(&[4, 2], DType::F32);
    assert!(matches!(execute(&Op::Mm, &[&a, &b], &out(&[2, 2], DType::F32)), Err(CpuError::Kernel { .. })));
}

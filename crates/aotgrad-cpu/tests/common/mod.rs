//! Shared helpers for the aotgrad-cpu integration tests.
#![allow(dead_code)]

use aotgrad_cpu::{execute, CpuTensor};
use aotgrad_ir::{DType, Dim, Op, TensorMeta};

/// A contiguous tensor from f64 values.
pub fn tf(data: &[f64], shape: &[usize], dtype: DType) -> CpuTensor {
    CpuTensor::from_f64(data, shape, dtype).unwrap()
}

/// A contiguous tensor from i64 values.
pub fn ti(data: &[i64], shape: &[usize], dtype: DType) -> CpuTensor {
    CpuTensor::from_i64(data, shape, dtype).unwrap()
}

/// Deterministic, varied test values in about [-3, 3].
pub fn vals(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 + 1.0) * 0.731 + seed).sin() * 3.0).collect()
}

/// A concrete meta with explicit strides and offset.
pub fn meta(shape: &[usize], strides: &[usize], offset: usize, dtype: DType) -> TensorMeta {
    TensorMeta {
        shape: shape.iter().map(|&s| Dim::from(s)).collect(),
        strides: strides.iter().map(|&s| Dim::from(s)).collect(),
        offset: Dim::from(offset),
        dtype,
    }
}

/// A contiguous result meta.
pub fn out(shape: &[usize], dtype: DType) -> TensorMeta {
    TensorMeta::from_sizes(shape, dtype)
}

/// Run an op, panicking on error.
pub fn exec(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> CpuTensor {
    execute(op, args, out).unwrap_or_else(|e| panic!("{}: {e}", op.name()))
}

/// A view of `t` with the given layout (through `as_strided`).
pub fn strided(t: &CpuTensor, shape: &[usize], strides: &[usize], offset: usize) -> CpuTensor {
    let op = Op::AsStrided {
        size: shape.iter().map(|&s| Dim::from(s)).collect(),
        stride: strides.iter().map(|&s| Dim::from(s)).collect(),
        offset: Dim::from(offset),
    };
    exec(&op, &[t], &meta(shape, strides, offset, t.meta.dtype))
}

/// `x[idx]` for a row-major multi-index into a logical shape.
pub fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// Every multi-index of `shape`, row-major.
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut k| {
            let mut ix = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                ix[d] = k % shape[d];
                k /= shape[d];
            }
            ix
        })
        .collect()
}

/// Assert element-wise closeness: |got - want| <= atol + rtol * |want| (NaN == NaN).
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "length mismatch: got {got:?}, want {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "element {i}: got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "element {i}");
            continue;
        }
        assert!((g - w).abs() <= atol + rtol * w.abs(), "element {i}: got {g}, want {w} (got {got:?})");
    }
}

/// Round an f64 through a dtype (what storing it in that dtype does).
pub fn round_to(x: f64, dtype: DType) -> f64 {
    CpuTensor::from_f64(&[x], &[1], dtype).unwrap().to_vec_f64()[0]
}

/// The logical (row-major) values of a strided view over contiguous `base` data.
pub fn logical(base: &[f64], shape: &[usize], strides: &[usize], offset: usize) -> Vec<f64> {
    indices(shape).iter().map(|ix| base[offset + ix.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>()]).collect()
}

/// Values of a tensor of `shape` broadcast (right-aligned) to `to`.
pub fn broadcast(v: &[f64], shape: &[usize], to: &[usize]) -> Vec<f64> {
    let lead = to.len() - shape.len();
    indices(to)
        .iter()
        .map(|ix| {
            let src: Vec<usize> =
                shape.iter().enumerate().map(|(d, &s)| if s == 1 { 0 } else { ix[d + lead] }).collect();
            v[flat(shape, &src)]
        })
        .collect()
}

//! Shared helpers of the module and export tests: plain-Rust f64 references and
//! central finite differences.
#![allow(dead_code)]

use aotgrad::nn::Module;
use aotgrad::prelude::*;

/// A deterministic tensor with values in `[-scale, scale)`.
pub fn data(shape: &[usize], dtype: DType, seed: u64, scale: f64) -> Tensor {
    Tensor::rand(shape, dtype, seed).and_then(|t| t.mul(2.0 * scale)).and_then(|t| t.sub(scale)).expect("rand")
}

/// The elements of a tensor as f64.
pub fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().expect("eager tensor")
}

/// `|a - b| <= atol + rtol * |b|` elementwise, with a message naming the first failure.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}]: got {g}, want {w} (atol {atol}, rtol {rtol})");
    }
}

/// erf by its Maclaurin series (|x| <= 3.5) or its asymptotic expansion.
pub fn erf(x: f64) -> f64 {
    if x.abs() > 3.5 {
        let t = 1.0 / (x * x);
        let tail = (-x * x).exp() / (x.abs() * std::f64::consts::PI.sqrt()) * (1.0 - 0.5 * t + 0.75 * t * t);
        return x.signum() * (1.0 - tail);
    }
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 || n < 3.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

/// Exact GELU.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// Row-major matrix `(rows, cols)` times the transpose of `w` `(out, cols)` plus `b`.
pub fn linear_ref(x: &[f64], rows: usize, cols: usize, w: &[f64], b: Option<&[f64]>, out: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let mut acc = b.map_or(0.0, |b| b[o]);
            for c in 0..cols {
                acc += x[r * cols + c] * w[o * cols + c];
            }
            y[r * out + o] = acc;
        }
    }
    y
}

/// Layer norm over rows of width `d` (biased variance), then `* w + b`.
pub fn layer_norm_ref(x: &[f64], d: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
        for i in 0..d {
            out[i] = (row[i] - mean) / (var + eps).sqrt() * w[i] + b[i];
        }
    }
    y
}

/// Multi-head self-attention of `x` `(batch, seq, d)` given projected `q`, `k`, `v`
/// (each `(batch, seq, d)`, heads interleaved as contiguous `d / heads` chunks).
pub fn attention_ref(q: &[f64], k: &[f64], v: &[f64], batch: usize, seq: usize, d: usize, heads: usize) -> Vec<f64> {
    let dh = d / heads;
    let mut out = vec![0.0; batch * seq * d];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                let at = |t: &[f64], s: usize, j: usize| t[(b * seq + s) * d + h * dh + j];
                let scores: Vec<f64> = (0..seq)
                    .map(|s| (0..dh).map(|j| at(q, i, j) * at(k, s, j)).sum::<f64>() / (dh as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..dh {
                    out[(b * seq + i) * d + h * dh + j] = (0..seq).map(|s| e[s] / z * at(v, s, j)).sum();
                }
            }
        }
    }
    out
}

/// `sum(outputs[0] * weights)`, computed from an eager forward (no grad).
pub fn weighted_loss(module: &dyn Module, inputs: &[Tensor], weights: &[f64]) -> f64 {
    let _g = NoGradGuard::new();
    let out = module.forward_eager(inputs).expect("eager forward");
    vals(&out[0]).iter().zip(weights).map(|(a, b)| a * b).sum()
}

/// Central finite differences of `loss` with respect to the elements `idx` of `t`
/// (changed in place under no-grad and restored).
pub fn finite_diff(t: &Tensor, idx: &[usize], eps: f64, mut loss: impl FnMut() -> f64) -> Vec<f64> {
    let _g = NoGradGuard::new();
    let shape = t.sizes().expect("concrete");
    let orig = vals(t);
    let set = |v: &[f64]| {
        t.copy_(&Tensor::from_f64(v, &shape, t.dtype()).expect("data")).expect("copy_");
    };
    let mut out = Vec::with_capacity(idx.len());
    for &i in idx {
        let mut v = orig.clone();
        v[i] = orig[i] + eps;
        set(&v);
        let plus = loss();
        v[i] = orig[i] - eps;
        set(&v);
        let minus = loss();
        out.push((plus - minus) / (2.0 * eps));
    }
    set(&orig);
    out
}

/// Up to `k` element indices of a tensor with `n` elements, spread over it.
pub fn sample_indices(n: usize, k: usize) -> Vec<usize> {
    if n <= k {
        return (0..n).collect();
    }
    (0..k).map(|j| (j * (n - 1)) / (k - 1)).collect()
}

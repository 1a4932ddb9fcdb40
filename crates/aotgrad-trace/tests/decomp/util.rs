//! Shared helpers: deterministic inputs, tolerances, f64 reference formulas, tracing.

use aotgrad_ir::{CompositeOp, Op};
use aotgrad_trace::decomp::DecompTable;
use aotgrad_trace::{trace, DType, Result, Tensor, TraceConfig, Traced};

/// Deterministic values in `[-scale, scale)`.
pub fn vals(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// An eager tensor of `dtype` with deterministic values, and its values as stored (rounded).
pub fn input(shape: &[usize], dtype: DType, seed: u64, scale: f64) -> (Tensor, Vec<f64>) {
    let n = shape.iter().product();
    let t = Tensor::from_f64(&vals(n, seed, scale), shape, dtype).unwrap();
    let v = t.to_vec_f64().unwrap();
    (t, v)
}

pub fn sizes(t: &Tensor) -> Vec<usize> {
    t.sizes().unwrap()
}

#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "element {i}: got {g}, want {w}");
    }
}

/// Tolerances by dtype: (atol, rtol).
pub fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (2e-6, 2e-6),
        DType::F16 => (2e-3, 2e-3),
        DType::BF16 => (1.6e-2, 1.6e-2),
        _ => (0.0, 0.0),
    }
}

#[track_caller]
pub fn check(t: &Tensor, shape: &[usize], dtype: DType, want: &[f64]) {
    assert_eq!(sizes(t), shape, "shape");
    assert_eq!(t.dtype(), dtype, "dtype");
    let (a, r) = tol(dtype);
    assert_close(&t.to_vec_f64().unwrap(), want, a, r);
}

/// erf by its Maclaurin series (accurate to ~1e-12 for |x| <= 4).
pub fn erf(x: f64) -> f64 {
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
        if n > 200.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// Row-major groups along `dim` of a tensor of `shape`: the flat indices of each
/// 1-D lane through `dim`.
pub fn lanes(shape: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            out.push((0..shape[dim]).map(|k| (o * shape[dim] + k) * inner + i).collect());
        }
    }
    out
}

pub fn softmax_ref(v: &[f64], shape: &[usize], dim: usize, log: bool) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for lane in lanes(shape, dim) {
        let m = lane.iter().map(|&i| v[i]).fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = lane.iter().map(|&i| (v[i] - m).exp()).sum();
        for &i in &lane {
            out[i] = if log { v[i] - m - s.ln() } else { (v[i] - m).exp() / s };
        }
    }
    out
}

pub fn traced(f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>, inputs: &[Tensor], decomps: DecompTable) -> Traced {
    trace(f, inputs, &TraceConfig { decomps, ..TraceConfig::default() }).unwrap()
}

pub fn run_graph(t: &Traced, inputs: &[Tensor]) -> Vec<Tensor> {
    let cpu: Vec<_> = inputs.iter().map(|x| x.to_cpu().unwrap()).collect();
    aotgrad_cpu::interpret(&t.graph, &cpu).unwrap().into_iter().map(Tensor::from_cpu).collect()
}

pub fn composite_nodes(t: &Traced) -> Vec<&CompositeOp> {
    t.graph
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Composite(c) => Some(c),
            _ => None,
        })
        .collect()
}

//! Eager values of the pointwise, softmax, normalization, dropout, embedding and loss
//! composites against f64 formulas.

use crate::util::{assert_close, check, erf, input, softmax_ref};
use aotgrad_trace::{DType, Tensor};

// ---- pointwise composites --------------------------------------------------------------

#[test]
fn gelu_matches_erf_formula() {
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let (x, v) = input(&[3, 5], dtype, 1, 4.0);
        let want: Vec<f64> = v.iter().map(|&x| 0.5 * x * (1.0 + erf(x / 2f64.sqrt()))).collect();
        check(&x.gelu().unwrap(), &[3, 5], dtype, &want);
    }
}

#[test]
fn gelu_tanh_matches_formula() {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let (x, v) = input(&[2, 7], dtype, 2, 5.0);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let want: Vec<f64> = v.iter().map(|&x| 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())).collect();
        check(&x.gelu_tanh().unwrap(), &[2, 7], dtype, &want);
    }
}

#[test]
fn silu_matches_formula() {
    for dtype in [DType::F32, DType::F64] {
        let (x, v) = input(&[11], dtype, 3, 6.0);
        let want: Vec<f64> = v.iter().map(|&x| x / (1.0 + (-x).exp())).collect();
        check(&x.silu().unwrap(), &[11], dtype, &want);
    }
}

// ---- softmax family --------------------------------------------------------------------

#[test]
fn softmax_and_log_softmax_over_each_dim() {
    let shape = [2, 3, 4];
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let (x, v) = input(&shape, dtype, 4, 3.0);
        for (d, wrapped) in [(0i64, 0usize), (1, 1), (-1, 2)] {
            check(&x.softmax(d).unwrap(), &shape, dtype, &softmax_ref(&v, &shape, wrapped, false));
            check(&x.log_softmax(d).unwrap(), &shape, dtype, &softmax_ref(&v, &shape, wrapped, true));
        }
    }
}

#[test]
fn softmax_is_stable_for_large_inputs() {
    let v = [1000.0, 1001.0, 999.0, -1000.0, 0.0, 1000.0];
    let x = Tensor::from_f64(&v, &[2, 3], DType::F32).unwrap();
    let y = x.softmax(1).unwrap().to_vec_f64().unwrap();
    assert!(y.iter().all(|p| p.is_finite()));
    assert_close(&y, &softmax_ref(&v, &[2, 3], 1, false), 1e-6, 1e-6);
    let y = x.log_softmax(1).unwrap().to_vec_f64().unwrap();
    assert_close(&y, &softmax_ref(&v, &[2, 3], 1, true), 1e-4, 1e-6);
}

#[test]
fn softmax_of_a_0d_tensor_is_one() {
    let x = Tensor::from_f64(&[3.5], &[], DType::F32).unwrap();
    check(&x.softmax(0).unwrap(), &[], DType::F32, &[1.0]);
    check(&x.log_softmax(-1).unwrap(), &[], DType::F32, &[0.0]);
}

// ---- layer_norm ------------------------------------------------------------------------

fn layer_norm_ref(v: &[f64], shape: &[usize], nr: usize, w: Option<&[f64]>, b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let group: usize = shape[shape.len() - nr..].iter().product();
    let mut out = Vec::with_capacity(v.len());
    for chunk in v.chunks(group) {
        let mean = chunk.iter().sum::<f64>() / group as f64;
        let var = chunk.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / group as f64;
        for (j, x) in chunk.iter().enumerate() {
            let y = (x - mean) / (var + eps).sqrt();
            out.push(y * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]));
        }
    }
    out
}

#[test]
fn layer_norm_matches_formula() {
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let shape = [2, 3, 4];
        let (x, v) = input(&shape, dtype, 5, 2.0);
        let (w1, wv1) = input(&[4], dtype, 6, 1.5);
        let (b1, bv1) = input(&[4], dtype, 7, 1.0);
        let eps = 1e-5;
        let y = x.layer_norm(&[4], Some(&w1), Some(&b1), eps).unwrap();
        check(&y, &shape, dtype, &layer_norm_ref(&v, &shape, 1, Some(&wv1), Some(&bv1), eps));
        let y = x.layer_norm(&[4], None, None, eps).unwrap();
        check(&y, &shape, dtype, &layer_norm_ref(&v, &shape, 1, None, None, eps));
        let y = x.layer_norm(&[4], None, Some(&b1), eps).unwrap();
        check(&y, &shape, dtype, &layer_norm_ref(&v, &shape, 1, None, Some(&bv1), eps));
        let (w2, wv2) = input(&[3, 4], dtype, 8, 1.5);
        let y = x.layer_norm(&[3, 4], Some(&w2), None, 0.1).unwrap();
        check(&y, &shape, dtype, &layer_norm_ref(&v, &shape, 2, Some(&wv2), None, 0.1));
    }
}

// ---- dropout ---------------------------------------------------------------------------

/// The counter-based generator of `aotgrad_cpu::random`, re-derived from its spec.
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}
fn bits(seed: u64, ctr: u64) -> u32 {
    let k0 = fmix32((seed as u32) ^ 0x9E37_79B9);
    let k1 = fmix32(((seed >> 32) as u32) ^ 0x632B_E5AB ^ k0);
    let h = fmix32((ctr as u32) ^ k1);
    fmix32(h ^ fmix32(((ctr >> 32) as u32) ^ k0))
}

#[test]
fn dropout_masks_and_scales() {
    let (p, seed) = (0.3, 42);
    let shape = [50, 40];
    let (x, v) = input(&shape, DType::F32, 9, 2.0);
    let y = x.dropout(p, true, seed).unwrap();
    let want: Vec<f64> = v
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let u = (bits(seed, i as u64) >> 8) as f64 * 2f64.powi(-24);
            if u < 1.0 - p {
                x / (1.0 - p)
            } else {
                0.0
            }
        })
        .collect();
    check(&y, &shape, DType::F32, &want);
    let kept = want.iter().filter(|w| **w != 0.0).count() as f64 / want.len() as f64;
    assert!((kept - 0.7).abs() < 0.03, "kept fraction {kept}");
    // Another seed gives another mask.
    let z = x.dropout(p, true, seed + 1).unwrap().to_vec_f64().unwrap();
    assert_ne!(z, y.to_vec_f64().unwrap());
}

#[test]
fn dropout_identity_and_extremes() {
    let (x, v) = input(&[4, 5], DType::F64, 10, 1.0);
    assert!(x.dropout(0.5, false, 1).unwrap().same_object(&x));
    assert!(x.dropout(0.0, true, 1).unwrap().same_object(&x));
    let z = x.dropout(1.0, true, 1).unwrap();
    check(&z, &[4, 5], DType::F64, &vec![0.0; v.len()]);
    for bad in [-0.1, 1.5, f64::NAN] {
        let e = x.dropout(bad, true, 1).unwrap_err();
        assert_eq!(e.op(), Some("dropout"), "{e}");
    }
}

// ---- embedding and losses --------------------------------------------------------------

#[test]
fn embedding_picks_rows() {
    let (w, wv) = input(&[5, 3], DType::F32, 11, 1.0);
    let idx = [4i64, 0, 2, 2, 1, 3];
    let indices = Tensor::from_i64(&idx, &[2, 3]).unwrap();
    let want: Vec<f64> = idx.iter().flat_map(|&i| wv[i as usize * 3..i as usize * 3 + 3].to_vec()).collect();
    check(&Tensor::embedding(&indices, &w).unwrap(), &[2, 3, 3], DType::F32, &want);
    let one = Tensor::from_i64(&[3], &[]).unwrap();
    check(&Tensor::embedding(&one, &w).unwrap(), &[3], DType::F32, &wv[9..12]);
    let i32s = Tensor::from_vec(vec![1i32, 1], &[2]).unwrap();
    check(&Tensor::embedding(&i32s, &w).unwrap(), &[2, 3], DType::F32, &[&wv[3..6], &wv[3..6]].concat());
}

#[test]
fn mse_loss_matches_formula() {
    let (x, xv) = input(&[3, 4], DType::F64, 12, 2.0);
    let (t, tv) = input(&[3, 4], DType::F64, 13, 2.0);
    let want = xv.iter().zip(&tv).map(|(a, b)| (a - b) * (a - b)).sum::<f64>() / 12.0;
    check(&x.mse_loss(&t).unwrap(), &[], DType::F64, &[want]);
    // A target broadcast along the rows.
    let (r, rv) = input(&[4], DType::F64, 14, 2.0);
    let want = xv.iter().enumerate().map(|(i, a)| (a - rv[i % 4]) * (a - rv[i % 4])).sum::<f64>() / 12.0;
    check(&x.mse_loss(&r).unwrap(), &[], DType::F64, &[want]);
}

fn cross_entropy_ref(v: &[f64], shape: &[usize], target: &[i64]) -> f64 {
    let c = if shape.len() == 1 { 0 } else { 1 };
    let lsm = softmax_ref(v, shape, c, true);
    let inner: usize = shape[c + 1..].iter().product();
    let total: f64 = target
        .iter()
        .enumerate()
        .map(|(j, &t)| {
            let (o, i) = (j / inner, j % inner);
            -lsm[(o * shape[c] + t as usize) * inner + i]
        })
        .sum();
    total / target.len() as f64
}

#[test]
fn cross_entropy_matches_formula() {
    for dtype in [DType::F32, DType::F64] {
        let (x, v) = input(&[4, 5], dtype, 15, 3.0);
        let tgt = [1i64, 4, 0, 4];
        let t = Tensor::from_i64(&tgt, &[4]).unwrap();
        check(&x.cross_entropy(&t).unwrap(), &[], dtype, &[cross_entropy_ref(&v, &[4, 5], &tgt)]);
        // Unbatched logits with a 0-d target.
        let (x, v) = input(&[6], dtype, 16, 3.0);
        let t = Tensor::from_i64(&[2], &[]).unwrap();
        check(&x.cross_entropy(&t).unwrap(), &[], dtype, &[cross_entropy_ref(&v, &[6], &[2])]);
        // Extra spatial dims: logits (N, C, d), target (N, d).
        let (x, v) = input(&[2, 3, 4], dtype, 17, 3.0);
        let tgt = [0i64, 1, 2, 1, 2, 2, 0, 0];
        let t = Tensor::from_i64(&tgt, &[2, 4]).unwrap();
        check(&x.cross_entropy(&t).unwrap(), &[], dtype, &[cross_entropy_ref(&v, &[2, 3, 4], &tgt)]);
    }
}

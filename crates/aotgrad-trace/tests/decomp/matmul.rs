//! `matmul` and `linear`: PyTorch's result shapes and a naive f64 loop.

use crate::util::{assert_close, check, input, sizes, tol};
use aotgrad_trace::DType;

// ---- matmul and linear -----------------------------------------------------------------

/// PyTorch's matmul by definition: 1-D operands promoted to a row / column, batch dims
/// broadcast, a naive triple loop in f64.
fn matmul_ref(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> Vec<f64> {
    let sa2: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
    let sb2: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
    let (ba, bb) = (&sa2[..sa2.len() - 2], &sb2[..sb2.len() - 2]);
    let nb = ba.len().max(bb.len());
    let pad = |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, nb - s.len()).chain(s.iter().copied()).collect() };
    let (pa, pb) = (pad(ba), pad(bb));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| if x == 1 { y } else { x }).collect();
    let (n, k, m) = (sa2[sa2.len() - 2], sa2[sa2.len() - 1], sb2[sb2.len() - 1]);
    let nbatch: usize = batch.iter().product();
    let mut out = Vec::with_capacity(nbatch * n * m);
    for bi in 0..nbatch {
        // Multi-index of the batch, then the broadcast flat batch index of each operand.
        let mut rem = bi;
        let mut idx = vec![0; nb];
        for d in (0..nb).rev() {
            idx[d] = rem % batch[d];
            rem /= batch[d];
        }
        let flat = |p: &[usize]| idx.iter().zip(p).fold(0, |acc, (i, s)| acc * s + if *s == 1 { 0 } else { *i });
        let (oa, ob) = (flat(&pa) * n * k, flat(&pb) * k * m);
        for i in 0..n {
            for j in 0..m {
                out.push((0..k).map(|l| a[oa + i * k + l] * b[ob + l * m + j]).sum());
            }
        }
    }
    out
}

#[test]
fn matmul_follows_pytorch_shapes() {
    // (a shape, b shape, result shape as PyTorch gives it)
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[3], &[3], &[]),
        (&[2, 3], &[3], &[2]),
        (&[3], &[3, 4], &[4]),
        (&[2, 3], &[3, 4], &[2, 4]),
        (&[5, 2, 3], &[3], &[5, 2]),
        (&[5, 2, 3], &[3, 4], &[5, 2, 4]),
        (&[2, 5, 2, 3], &[3, 4], &[2, 5, 2, 4]),
        (&[3], &[5, 3, 4], &[5, 4]),
        (&[2, 3], &[5, 3, 4], &[5, 2, 4]),
        (&[5, 2, 3], &[5, 3, 4], &[5, 2, 4]),
        (&[5, 1, 2, 3], &[4, 3, 2], &[5, 4, 2, 2]),
        (&[1, 2, 3], &[6, 3, 1], &[6, 2, 1]),
        (&[2, 1, 2, 3], &[3], &[2, 1, 2]),
        (&[0, 2, 3], &[3, 4], &[0, 2, 4]),
    ];
    for dtype in [DType::F64, DType::F32] {
        for (i, &(sa, sb, so)) in cases.iter().enumerate() {
            let (a, av) = input(sa, dtype, 20 + i as u64, 2.0);
            let (b, bv) = input(sb, dtype, 40 + i as u64, 2.0);
            let y = a.matmul(&b).unwrap();
            assert_eq!(sizes(&y), so, "case {i}: {sa:?} @ {sb:?}");
            let (atol, rtol) = tol(dtype);
            assert_close(&y.to_vec_f64().unwrap(), &matmul_ref(&av, sa, &bv, sb), atol * 10.0, rtol * 10.0);
        }
    }
}

#[test]
fn matmul_of_non_contiguous_operands() {
    // A transposed batch (folded rows need a copy) and a transposed right operand.
    let (a, _) = input(&[3, 4, 2], DType::F64, 60, 2.0);
    let a = a.transpose(0, 1).unwrap(); // [4, 3, 2], strided
    let av = a.contiguous().unwrap().to_vec_f64().unwrap();
    let (b, _) = input(&[5, 2], DType::F64, 61, 2.0);
    let b = b.t().unwrap(); // [2, 5]
    let bv = b.contiguous().unwrap().to_vec_f64().unwrap();
    let y = a.matmul(&b).unwrap();
    check(&y, &[4, 3, 5], DType::F64, &matmul_ref(&av, &[4, 3, 2], &bv, &[2, 5]));
    let (c, _) = input(&[2, 2, 3], DType::F64, 62, 2.0);
    let c = c.transpose(1, 2).unwrap(); // [2, 3, 2]
    let cv = c.contiguous().unwrap().to_vec_f64().unwrap();
    let (d, dv) = input(&[2, 5], DType::F64, 63, 2.0);
    let z = c.matmul(&d.unsqueeze(0).unwrap().expand(&[2, 2, 5]).unwrap()).unwrap();
    check(&z, &[2, 3, 5], DType::F64, &matmul_ref(&cv, &[2, 3, 2], &dv, &[2, 5]));
}

#[test]
fn linear_matches_matmul_with_transposed_weight() {
    for xs in [&[4][..], &[2, 4], &[3, 2, 4]] {
        let (x, xv) = input(xs, DType::F64, 70, 2.0);
        let (w, wv) = input(&[5, 4], DType::F64, 71, 1.0);
        let (b, bv) = input(&[5], DType::F64, 72, 1.0);
        let rows = xv.len() / 4;
        // x @ w^T by definition.
        let mut want = Vec::new();
        for r in 0..rows {
            for o in 0..5 {
                want.push((0..4).map(|i| xv[r * 4 + i] * wv[o * 4 + i]).sum::<f64>());
            }
        }
        let mut out_shape = xs[..xs.len() - 1].to_vec();
        out_shape.push(5);
        check(&x.linear(&w, None).unwrap(), &out_shape, DType::F64, &want);
        let with_bias: Vec<f64> = want.iter().enumerate().map(|(i, y)| y + bv[i % 5]).collect();
        check(&x.linear(&w, Some(&b)).unwrap(), &out_shape, DType::F64, &with_bias);
    }
}

//! The convolution and max-pooling kernels against their definitions written as plain
//! loops (f64), over random geometries (batch, groups, channels, sizes, kernels,
//! strides, padding, dilation), eagerly and through compiled graphs at 1 and 2
//! threads, which must agree bit for bit (images and weight-gradient chunks are
//! summed in an order that does not depend on the thread count).

use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    window_out, Backend, Conv2dParams, DType, Graph, Op, Pool2dParams, StaticOracle, StorageId, TensorMeta,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    g: usize,
    cg: usize,
    ocg: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    p: Conv2dParams,
}

impl Case {
    fn out(&self) -> Option<[usize; 2]> {
        let p = &self.p;
        Some([
            window_out(self.h, self.k[0], p.stride[0], p.padding[0], p.dilation[0])?,
            window_out(self.w, self.k[1], p.stride[1], p.padding[1], p.dilation[1])?,
        ])
    }
    fn c(&self) -> usize {
        self.g * self.cg
    }
    fn oc(&self) -> usize {
        self.g * self.ocg
    }
}

fn case() -> impl Strategy<Value = Case> {
    (1..3usize, 1..3usize, 1..4usize, 1..3usize, 1..9usize, 1..9usize, 1..4usize, 1..4usize)
        .prop_flat_map(|(n, g, cg, ocg, h, w, kh, kw)| {
            (
                Just((n, g, cg, ocg, h, w, kh, kw)),
                [1..3usize, 1..3usize],
                [0..3usize, 0..3usize],
                [1..3usize, 1..3usize],
            )
        })
        .prop_map(|((n, g, cg, ocg, h, w, kh, kw), stride, padding, dilation)| Case {
            n,
            g,
            cg,
            ocg,
            h,
            w,
            k: [kh, kw],
            p: Conv2dParams { stride, padding, dilation, groups: g },
        })
}

fn vals(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 * 0.731 + seed).sin() * 1.7).round() / 4.0 + 0.01 * (i % 7) as f64).collect()
}

fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> CpuTensor {
    CpuTensor::from_f64(v, shape, dtype).unwrap()
}

/// The input position tap `(a, b)` of output `(o, q)` reads, if inside.
fn pos(c: &Case, o: usize, q: usize, a: usize, b: usize) -> Option<(usize, usize)> {
    let i = (o * c.p.stride[0] + a * c.p.dilation[0]).checked_sub(c.p.padding[0])?;
    let j = (q * c.p.stride[1] + b * c.p.dilation[1]).checked_sub(c.p.padding[1])?;
    (i < c.h && j < c.w).then_some((i, j))
}

/// Every term of the convolution: the indices of the output, input (`None` in the
/// padding, whose zeros take part in the products as in PyTorch's im2col: a NaN
/// weight makes a padded window NaN) and weight elements it multiplies.
fn terms(c: &Case, mut f: impl FnMut(usize, Option<usize>, usize)) {
    let [oh, ow] = c.out().unwrap();
    for n in 0..c.n {
        for gi in 0..c.g {
            for oc in gi * c.ocg..(gi + 1) * c.ocg {
                for ci in 0..c.cg {
                    let ch = gi * c.cg + ci;
                    for o in 0..oh {
                        for q in 0..ow {
                            for a in 0..c.k[0] {
                                for b in 0..c.k[1] {
                                    let y = ((n * c.oc() + oc) * oh + o) * ow + q;
                                    let x = pos(c, o, q, a, b).map(|(i, j)| ((n * c.c() + ch) * c.h + i) * c.w + j);
                                    let w = ((oc * c.cg + ci) * c.k[0] + a) * c.k[1] + b;
                                    f(y, x, w);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The convolution of `x` by `w`, and the gradients of input and weight for output
/// gradient `gy`, straight from the definition in f64 (padding reads zero).
fn definition(c: &Case, xv: &[f64], wv: &[f64], gv: &[f64], ys: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut dx, mut dw) = (vec![0.0; ys], vec![0.0; xv.len()], vec![0.0; wv.len()]);
    terms(c, |yi, xi, wi| {
        let xval = xi.map_or(0.0, |i| xv[i]);
        y[yi] += xval * wv[wi];
        if let Some(i) = xi {
            dx[i] += gv[yi] * wv[wi];
        }
        dw[wi] += gv[yi] * xval;
    });
    (y, dx, dw)
}

/// `op(args)` eagerly and compiled at 1 and 2 threads: the three must agree bit for
/// bit; returns the values.
fn run(op: Op, args: &[CpuTensor]) -> Vec<f64> {
    let metas: Vec<&TensorMeta> = args.iter().map(|a| &a.meta).collect();
    let out = infer(&op, &metas, &mut StaticOracle).unwrap_or_else(|e| panic!("{e}"));
    let refs: Vec<&CpuTensor> = args.iter().collect();
    let eager = aotgrad_cpu::execute(&op, &refs, &out).unwrap().to_vec_f64();
    let mut g = Graph::new();
    let ins: Vec<_> = args
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(format!("a{i}"), a.meta.clone(), StorageId(i as u32)))
        .collect();
    let s = g.next_storage();
    let y = g.add_node(op, ins, out, s, None);
    g.outputs = vec![y];
    for threads in [1, 2] {
        let c = CpuBackend::new(threads).compile(&g).unwrap();
        let got = c.run(args).unwrap()[0].to_vec_f64();
        assert!(got.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} thread(s) differ");
    }
    eager
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn convolution_and_its_gradients_match_their_definitions(c in case(), dtype in prop_oneof![Just(DType::F64), Just(DType::F32)]) {
        let Some([oh, ow]) = c.out() else { return Ok(()) };
        let xs = [c.n, c.c(), c.h, c.w];
        let ws = [c.oc(), c.cg, c.k[0], c.k[1]];
        let ys = [c.n, c.oc(), oh, ow];
        let n = |s: &[usize]| s.iter().product::<usize>();
        let (xv, wv, gv) = (vals(n(&xs), 0.3), vals(n(&ws), 1.1), vals(n(&ys), 2.7));
        let (x, w, gy) = (tensor(&xv, &xs, dtype), tensor(&wv, &ws, dtype), tensor(&gv, &ys, dtype));
        // Values exactly representable in f32 (quarters plus small multiples of 0.01
        // rounded by the cast): compare with the definition over the cast inputs.
        let (xv, wv, gv) = (x.to_vec_f64(), w.to_vec_f64(), gy.to_vec_f64());
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        let (y, dx, dw) = definition(&c, &xv, &wv, &gv, n(&ys));
        close("conv2d", &run(Op::Conv2d(c.p), &[x.clone(), w.clone()]), &y, tol);
        close("input grad", &run(Op::Conv2dInputGrad { conv: c.p, input: [c.h, c.w] }, &[gy.clone(), w]), &dx, tol);
        close("weight grad", &run(Op::Conv2dWeightGrad { conv: c.p, kernel: c.k }, &[gy, x]), &dw, tol);
    }

    #[test]
    fn max_pooling_and_its_gradient_match_their_definition(c in case()) {
        let p = Pool2dParams { kernel: c.k, stride: c.p.stride, padding: c.p.padding, dilation: c.p.dilation };
        if p.padding.iter().zip(p.kernel).any(|(pad, k)| 2 * pad > k) {
            return Ok(());
        }
        let Some([oh, ow]) = c.out() else { return Ok(()) };
        let planes = c.n * c.c();
        let xs = [c.n, c.c(), c.h, c.w];
        // Few distinct values: ties are frequent; one NaN now and then.
        let mut xv: Vec<f64> = vals(planes * c.h * c.w, 0.9).iter().map(|v| (v * 2.0).round()).collect();
        if xv.len() > 5 {
            let third = xv.len() / 3;
            xv[third] = f64::NAN;
        }
        let gv = vals(planes * oh * ow, 3.3);
        let x = tensor(&xv, &xs, DType::F32);
        let gy = tensor(&gv, &[c.n, c.c(), oh, ow], DType::F32);
        let (xv, gv) = (x.to_vec_f64(), gy.to_vec_f64());
        let (mut y, mut dx) = (vec![f64::NEG_INFINITY; planes * oh * ow], vec![0.0; xv.len()]);
        for pl in 0..planes {
            for o in 0..oh {
                for q in 0..ow {
                    // PyTorch's pick: the first maximum, or the last NaN.
                    let (mut best, mut max) = (None, f64::NEG_INFINITY);
                    for a in 0..c.k[0] {
                        for b in 0..c.k[1] {
                            if let Some((i, j)) = pos(&c, o, q, a, b) {
                                let k = pl * c.h * c.w + i * c.w + j;
                                if best.is_none() {
                                    best = Some(k);
                                }
                                if xv[k] > max || xv[k].is_nan() {
                                    max = xv[k];
                                    best = Some(k);
                                }
                            }
                        }
                    }
                    let yi = (pl * oh + o) * ow + q;
                    if let Some(k) = best {
                        y[yi] = xv[k];
                        dx[k] += gv[yi];
                    }
                }
            }
        }
        let got = run(Op::MaxPool2d(p), std::slice::from_ref(&x));
        prop_assert!(got.iter().zip(&y).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())), "{got:?} vs {y:?}");
        close("max_pool2d_grad", &run(Op::MaxPool2dGrad(p), &[gy, x]), &dx, 1e-6);
    }
}

/// Infinities and NaNs in the input, the weight or the gradient reach exactly the
/// elements the definition says, padding included (the kernels' extended output grid
/// adds zeros, never `0 * inf`, to other elements).
#[test]
fn non_finite_values_stay_where_the_definition_puts_them() {
    let c = Case {
        n: 2,
        g: 1,
        cg: 2,
        ocg: 2,
        h: 5,
        w: 6,
        k: [3, 3],
        p: Conv2dParams { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 },
    };
    let [oh, ow] = c.out().unwrap();
    let (xs, ws, ys) = ([c.n, c.c(), c.h, c.w], [c.oc(), c.cg, c.k[0], c.k[1]], [c.n, c.oc(), oh, ow]);
    let n = |s: &[usize]| s.iter().product::<usize>();
    let (mut xv, mut wv, mut gv) = (vals(n(&xs), 0.3), vals(n(&ws), 1.1), vals(n(&ys), 2.7));
    // An infinite pixel at a row's end, a NaN weight tap, an infinite gradient.
    xv[c.w - 1] = f64::INFINITY;
    wv[0] = f64::NAN;
    gv[7] = f64::NEG_INFINITY;
    let (x, w, gy) = (tensor(&xv, &xs, DType::F32), tensor(&wv, &ws, DType::F32), tensor(&gv, &ys, DType::F32));
    let (y, dx, dw) = definition(&c, &xv, &wv, &gv, n(&ys));
    let same = |what: &str, got: &[f64], want: &[f64]| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let ok = if w.is_finite() {
                (g - w).abs() <= 1e-4 * (1.0 + w.abs())
            } else {
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
            };
            assert!(ok, "{what}[{i}]: {g} vs {w}");
        }
    };
    same("conv2d", &run(Op::Conv2d(c.p), &[x.clone(), w.clone()]), &y);
    same("input grad", &run(Op::Conv2dInputGrad { conv: c.p, input: [c.h, c.w] }, &[gy.clone(), w]), &dx);
    same("weight grad", &run(Op::Conv2dWeightGrad { conv: c.p, kernel: c.k }, &[gy, x]), &dw);
}

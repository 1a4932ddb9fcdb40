//! floor, ceil, round, trunc, log1p, expm1 and the in-place variants of the unary ops:
//! values against hand-checked PyTorch results, dtypes and errors as PyTorch's, the
//! compiled function against eager on non-contiguous inputs and in place, gradients
//! against hand-derived ones.

use aotgrad::prelude::*;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).unwrap()
}

type UnaryFn = fn(&Tensor) -> aotgrad::trace::Result<Tensor>;

fn vals(x: &Tensor) -> Vec<f64> {
    x.to_vec_f64().unwrap()
}

#[test]
fn rounding_values_match_pytorch() {
    let x = t(&[-1.5, -0.2, 0.2, 1.7], &[4]);
    // torch.tensor([-1.5, -0.2, 0.2, 1.7]).floor() / .ceil() / .trunc()
    assert_eq!(vals(&x.floor().unwrap()), vec![-2.0, -1.0, 0.0, 1.0]);
    assert_eq!(vals(&x.ceil().unwrap()), vec![-1.0, -0.0, 1.0, 2.0]);
    assert_eq!(vals(&x.trunc().unwrap()), vec![-1.0, -0.0, 0.0, 1.0]);
    // torch.round rounds halves to even: [-2., -2., -0., 0., 2., 2., 3.]
    let h = t(&[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6], &[7]);
    let r = vals(&h.round().unwrap());
    assert_eq!(r, vec![-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 3.0]);
    assert!(r[2].is_sign_negative(), "round(-0.5) is -0.");
    // Integers are returned unchanged, in their dtype; bool is refused.
    let i = Tensor::from_i64(&[3, -2], &[2]).unwrap();
    for f in [Tensor::floor, Tensor::ceil, Tensor::round, Tensor::trunc] {
        let y = f(&i).unwrap();
        assert_eq!(y.dtype(), DType::I64);
        assert_eq!(y.to_vec_i64().unwrap(), vec![3, -2]);
    }
    let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    let e = b.floor().unwrap_err().to_string();
    assert!(e.contains("floor") && e.contains("bool"), "{e}");
    // NaN and infinities pass through.
    let s = t(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY], &[3]);
    let f = vals(&s.floor().unwrap());
    assert!(f[0].is_nan() && f[1] == f64::INFINITY && f[2] == f64::NEG_INFINITY);
}

#[test]
fn log1p_and_expm1_are_accurate_near_zero() {
    let x = t(&[1e-10, -1e-12, 0.5, 3.0], &[4]);
    let l = vals(&x.log1p().unwrap());
    let e = vals(&x.expm1().unwrap());
    // log(1 + 1e-10) computed naively loses 6 digits; log1p keeps them all.
    assert!((l[0] - (1e-10 - 5e-21)).abs() < 1e-25, "{}", l[0]);
    assert!((e[0] - (1e-10 + 5e-21)).abs() < 1e-25, "{}", e[0]);
    assert!((l[1] - (-1e-12 - 5e-25)).abs() < 1e-27 && (e[1] - (-1e-12 + 5e-25)).abs() < 1e-27);
    assert!((l[2] - 1.5f64.ln()).abs() < 1e-15 && (e[3] - (3f64.exp() - 1.0)).abs() < 1e-13);
    // Integers promote to the default float (torch.tensor([0, 1]).log1p() is float32).
    let i = Tensor::from_i64(&[0, 1], &[2]).unwrap();
    let y = i.log1p().unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert!((vals(&y)[1] - 2f64.ln()).abs() < 1e-6);
    // log1p(-1) = -inf, below it NaN, as PyTorch.
    let edge = vals(&t(&[-1.0, -2.0], &[2]).log1p().unwrap());
    assert!(edge[0] == f64::NEG_INFINITY && edge[1].is_nan());
}

#[test]
fn every_unary_op_has_an_in_place_variant() {
    let x = t(&[0.25, 1.5, 2.75], &[3]);
    let cases: Vec<(UnaryFn, UnaryFn)> = vec![
        (Tensor::abs_, Tensor::abs),
        (Tensor::exp_, Tensor::exp),
        (Tensor::log_, Tensor::log),
        (Tensor::sqrt_, Tensor::sqrt),
        (Tensor::rsqrt_, Tensor::rsqrt),
        (Tensor::sin_, Tensor::sin),
        (Tensor::cos_, Tensor::cos),
        (Tensor::tanh_, Tensor::tanh),
        (Tensor::sigmoid_, Tensor::sigmoid),
        (Tensor::erf_, Tensor::erf),
        (Tensor::reciprocal_, Tensor::reciprocal),
        (Tensor::sign_, Tensor::sign),
        (Tensor::floor_, Tensor::floor),
        (Tensor::ceil_, Tensor::ceil),
        (Tensor::round_, Tensor::round),
        (Tensor::trunc_, Tensor::trunc),
        (Tensor::log1p_, Tensor::log1p),
        (Tensor::expm1_, Tensor::expm1),
        (Tensor::neg_, Tensor::neg),
        (Tensor::relu_, Tensor::relu),
    ];
    for (inplace, op) in cases {
        let y = x.clone_tensor().unwrap();
        let v0 = y.version().unwrap();
        let r = inplace(&y).unwrap();
        assert!(r.same_object(&y));
        assert!(y.version().unwrap() > v0);
        assert_eq!(vals(&y), vals(&op(&x).unwrap()));
    }
    // An in-place op whose result dtype cannot be cast back is refused, as PyTorch's
    // "result type Float can't be cast to the desired output type Long".
    let i = Tensor::from_i64(&[1, 2], &[2]).unwrap();
    assert!(i.exp_().is_err());
    assert_eq!(i.to_vec_i64().unwrap(), vec![1, 2], "the refused call wrote nothing");
    assert_eq!(i.floor_().unwrap().to_vec_i64().unwrap(), vec![1, 2]);
}

/// Non-contiguous inputs and an in-place op through a transposed view, compiled
/// (CPU backend) against eager.
#[test]
fn compiled_matches_eager_on_views_and_in_place() {
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        let xt = a[0].t()?;
        let r = xt.round()?.add(&xt.floor()?)?.add(&xt.ceil()?)?.add(&xt.trunc()?)?;
        let s = xt.log1p()?.expm1()?;
        a[1].t()?.floor_()?;
        Ok(vec![r, s])
    };
    let make = || {
        let x = t(&[0.5, 1.5, 2.5, -0.7, 3.2, 4.49], &[2, 3]);
        let y = t(&[0.5, -1.5, 2.7, -0.2, 3.9, 4.0], &[2, 3]);
        vec![x, y]
    };
    let (eager_in, comp_in) = (make(), make());
    let want = f(&eager_in).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let got = c.call(&comp_in).unwrap();
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.sizes().unwrap(), g.sizes().unwrap());
        let (w, g) = (vals(w), vals(g));
        for (a, b) in w.iter().zip(&g) {
            assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{w:?} vs {g:?}");
        }
    }
    assert_eq!(vals(&comp_in[1]), vals(&eager_in[1]));
    assert_eq!(vals(&comp_in[1]), vec![0.0, -2.0, 2.0, -1.0, 3.0, 4.0]);
}

/// d/dx sum(log1p(x) * floor(x) + expm1(x)) = floor(x)/(1+x) + e^x (floor contributes
/// nothing), through the compiled training path.
#[test]
fn gradients_through_the_compiled_training_path() {
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].log1p()?.mul(&a[0].floor()?)?.add(&a[0].expm1()?)?.sum_all()?])
    };
    let xs = [0.3, 1.7, 2.2, 5.5];
    let x = t(&xs, &[4]).requires_grad(true).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let (out, pending) = c.forward(std::slice::from_ref(&x)).unwrap();
    let g = pending.backward(&[out[0].ones_like().unwrap()]).unwrap();
    let g = vals(g[0].as_ref().unwrap());
    for (gi, &xi) in g.iter().zip(&xs) {
        let want = xi.floor() / (1.0 + xi) + xi.exp();
        assert!((gi - want).abs() < 1e-12 * want.abs().max(1.0), "{gi} vs {want}");
    }
}

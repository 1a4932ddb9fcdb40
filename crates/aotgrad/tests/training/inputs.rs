//! Calling conventions on the training path: inputs aliasing each other (a synthetic
//! base, its gradient mapped back to every argument), the same tensor passed twice
//! (dedupe: the total gradient at both positions), inputs of which only some require
//! grad, integer inputs and plain values, and a scalar loss seeded with ones.

use crate::checker::{check, data, leaf, nonleaf, scalar_fd, tensor, UserFn};
use aotgrad::trace::Tensor;
use aotgrad::{aot_function_args, AotConfig, Arg};
use expect_test::expect;
use std::sync::Arc;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().expect("eager tensor")
}

/// The seed's case 4: `f(x, x.view(-1))` with `x.mul_(2); return x * x_view`.
#[test]
fn synthetic_base() {
    let c = check(
        |a: &[Arg]| {
            let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
            x.mul_(2)?;
            Ok(vec![x.mul(&xv.view(&[2, 3])?)?])
        },
        || {
            let x = nonleaf(&[2, 3], 1);
            let xv = x.view(&[-1]).expect("view");
            vec![x.into(), xv.into()]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[6] #0 "base0") {
          %8: f64[2, 3] #0 = as_strided(%0, size=[2, 3], stride=[3, 1], offset=0)
          %9: f64[2, 3] #6 = mul(%8, 2)
          %10: f64[6] #7 = as_strided_scatter(%0, %9, size=[2, 3], stride=[3, 1], offset=0)
          %11: f64[2, 3] #7 = view(%10, [2, 3])
          %12: f64[2, 3] #8 = mul(%9, %11)
          return (%10, %12, %0)
        }
        backward:
        graph(%0: f64[6] #0 "base0", %6: f64[6] #4 "tangent0", %7: f64[2, 3] #5 "tangent1") {
          %8: f64[2, 3] #0 = as_strided(%0, size=[2, 3], stride=[3, 1], offset=0)
          %9: f64[2, 3] #6 = mul(%8, 2)
          %10: f64[6] #7 = as_strided_scatter(%0, %9, size=[2, 3], stride=[3, 1], offset=0)
          %11: f64[2, 3] #7 = view(%10, [2, 3])
          %13: f64[2, 3] #9 = mul(%7, %11)
          %14: f64[2, 3] #10 = mul(%7, %9)
          %15: f64[6] #10 = view(%14, [6])
          %16: f64[6] #11 = add(%6, %15)
          %17: f64[2, 3] #12 = full(shape=[2, 3], value=0.0, dtype=f64)
          %18: f64[6] #13 = as_strided_scatter(%16, %17, size=[2, 3], stride=[3, 1], offset=0)
          %19: f64[2, 3] #11 = as_strided(%16, size=[2, 3], stride=[3, 1], offset=0)
          %20: f64[2, 3] #14 = add(%13, %19)
          %21: f64[2, 3] #15 = mul(%20, 2)
          %22: f64[6] #16 = full(shape=[6], value=0.0, dtype=f64)
          %23: f64[6] #17 = as_strided_scatter(%22, %21, size=[2, 3], stride=[3, 1], offset=0)
          %24: f64[6] #18 = add(%18, %23)
          return (%24)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "base0": f64[6] (48 bytes)
        recomputed 6 ops, 12 FLOPs: %8 (as_strided), %9 (mul), %10 (as_strided_scatter), %11 (view), %17 (full), %22 (full)"#]],
        &c.text,
    );
    // Both arguments view the same six elements, merged into a synthetic base: each
    // element's gradient goes to the first argument viewing it, so the caller's
    // autograd, which sums the two where they meet, counts it once.
    let (g0, g1) = (vals(c.grads[0].as_ref().expect("grad")), vals(c.grads[1].as_ref().expect("grad")));
    assert!(g0.iter().any(|v| *v != 0.0));
    assert!(g1.iter().all(|v| *v == 0.0), "{g1:?}");
    // Both changed: each got a gradient for its new value.
    assert_eq!(c.updated_grads.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![0, 1]);
}

/// Two overlapping slices of one tensor, one mutated through the other's elements.
#[test]
fn synthetic_base_of_overlapping_slices() {
    let c = check(
        |a: &[Arg]| {
            let (p, q) = (tensor(&a[0])?, tensor(&a[1])?);
            p.mul_(&q.slice(0, Some(0), Some(3), 1)?.exp()?)?;
            Ok(vec![q.mul(q)?.sum_all()?, p.clone()])
        },
        || {
            let base = nonleaf(&[6], 1);
            vec![
                base.slice(0, Some(0), Some(3), 1).expect("slice").into(),
                base.slice(0, Some(2), None, 1).expect("slice").into(),
            ]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[6] #0 "base0") {
          %12: f64[3] #0 = as_strided(%0, size=[3], stride=[1], offset=0)
          %13: f64[4] offset=2 #0 = as_strided(%0, size=[4], stride=[1], offset=2)
          %14: f64[3] offset=2 #0 = slice(%13, dim=0, start=0, end=3, step=1)
          %15: f64[3] #8 = exp(%14)
          %16: f64[3] #9 = mul(%12, %15)
          %17: f64[6] #10 = as_strided_scatter(%0, %16, size=[3], stride=[1], offset=0)
          %18: f64[4] offset=2 #10 = as_strided(%17, size=[4], stride=[1], offset=2)
          %19: f64[4] #11 = mul(%18, %18)
          %20: f64[] #12 = sum(%19, dims=[], keepdim=false)
          return (%17, %20, %16, %0)
        }
        backward:
        graph(%0: f64[6] #0 "base0", %10: f64[6] #6 "tangent0", %11: f64[] #7 "tangent1") {
          %12: f64[3] #0 = as_strided(%0, size=[3], stride=[1], offset=0)
          %13: f64[4] offset=2 #0 = as_strided(%0, size=[4], stride=[1], offset=2)
          %14: f64[3] offset=2 #0 = slice(%13, dim=0, start=0, end=3, step=1)
          %15: f64[3] #8 = exp(%14)
          %16: f64[3] #9 = mul(%12, %15)
          %17: f64[6] #10 = as_strided_scatter(%0, %16, size=[3], stride=[1], offset=0)
          %18: f64[4] offset=2 #10 = as_strided(%17, size=[4], stride=[1], offset=2)
          %21: f64[1] #7 = view(%11, [1])
          %22: f64[4] strides=[0] #7 = expand(%21, [4])
          %23: f64[4] #13 = mul(%22, %18)
          %24: f64[4] #14 = add(%23, %23)
          %25: f64[6] #15 = full(shape=[6], value=0.0, dtype=f64)
          %26: f64[6] #16 = as_strided_scatter(%25, %24, size=[4], stride=[1], offset=2)
          %27: f64[6] #17 = add(%10, %26)
          %28: f64[3] #18 = full(shape=[3], value=0.0, dtype=f64)
          %29: f64[6] #19 = as_strided_scatter(%27, %28, size=[3], stride=[1], offset=0)
          %30: f64[3] #17 = as_strided(%27, size=[3], stride=[1], offset=0)
          %31: f64[3] #20 = mul(%30, %15)
          %32: f64[3] #21 = mul(%30, %12)
          %33: f64[3] #22 = mul(%32, %15)
          %34: f64[4] #23 = full(shape=[4], value=0.0, dtype=f64)
          %35: f64[4] #24 = slice_scatter(%34, %33, dim=0, start=0, end=3, step=1)
          %36: f64[6] #25 = as_strided_scatter(%25, %35, size=[4], stride=[1], offset=2)
          %37: f64[6] #26 = add(%29, %36)
          %38: f64[6] #27 = as_strided_scatter(%25, %31, size=[3], stride=[1], offset=0)
          %39: f64[6] #28 = add(%37, %38)
          return (%39)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "base0": f64[6] (48 bytes)
        recomputed 10 ops, 12 FLOPs: %12 (as_strided), %13 (as_strided), %14 (slice), %15 (exp), %16 (mul), %17 (as_strided_scatter), %18 (as_strided), %25 (full), %28 (full), %34 (full)"#]],
        &c.text,
    );
}

/// Aliased inputs that are only read (no synthetic base: two graph inputs): each
/// still gets the gradient of the storage elements it views, contributions through
/// the other included, like the arguments of a synthetic base.
#[test]
fn aliased_inputs_not_mutated() {
    let c = check(
        |a: &[Arg]| {
            let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.sin()?.view(&[-1])?.mul(xv)?])
        },
        || {
            let x = nonleaf(&[2, 3], 1);
            let xv = x.view(&[-1]).expect("view");
            vec![x.into(), xv.into()]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[6] #1 "arg1") {
          %6: f64[2, 3] #5 = sin(%0)
          %7: f64[6] #5 = view(%6, [6])
          %8: f64[6] #6 = mul(%7, %1)
          return (%8, %0, %1)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[6] #1 "arg1", %5: f64[6] #4 "tangent0") {
          %6: f64[2, 3] #5 = sin(%0)
          %7: f64[6] #5 = view(%6, [6])
          %9: f64[6] #7 = mul(%5, %1)
          %10: f64[6] #8 = mul(%5, %7)
          %11: f64[2, 3] #7 = view(%9, [2, 3])
          %12: f64[2, 3] #9 = cos(%0)
          %13: f64[2, 3] #10 = mul(%11, %12)
          return (%13, %10)
        }
        saved 2 values, 96 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
          %1 "arg1": f64[6] (48 bytes)
        recomputed 3 ops, 12 FLOPs: %6 (sin), %7 (view), %12 (cos)"#]],
        &c.text,
    );
}

/// Disjoint views of one storage, and an input repeating its elements (`expand`):
/// gradients follow tensors, so the expanded input gets one per element (PyTorch's
/// gradient for that argument; its base would get their sum).
#[test]
fn disjoint_views_and_an_expanded_input() {
    let c = check(
        |a: &[Arg]| {
            let (even, odd, e) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
            Ok(vec![even.mul(odd)?.exp()?.add(&e.sum(&[0], false)?)?])
        },
        || {
            let base = nonleaf(&[6], 1);
            let even = base.slice(0, Some(0), None, 2).expect("slice");
            let odd = base.slice(0, Some(1), None, 2).expect("slice");
            let e = nonleaf(&[3], 2).unsqueeze(0).and_then(|t| t.expand(&[2, 3])).expect("expand");
            vec![even.into(), odd.into(), e.into()]
        },
        AotConfig::default(),
    );
    // Both rows of the expanded argument get the same gradient, each half of what
    // perturbing the shared element measures.
    let ge = c.grads[2].as_ref().expect("gradient of the expanded argument").to_vec_f64().expect("values");
    assert_eq!(ge[..3], ge[3..]);
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] strides=[2] #0 "arg0", %1: f64[3] strides=[2] offset=1 #1 "arg1", %2: f64[2, 3] strides=[0, 1] #2 "arg2") {
          %8: f64[3] #8 = mul(%0, %1)
          %9: f64[3] #9 = exp(%8)
          %10: f64[3] #10 = sum(%2, dims=[0], keepdim=false)
          %11: f64[3] #11 = add(%9, %10)
          return (%11, %0, %1, %9)
        }
        backward:
        graph(%0: f64[3] strides=[2] #0 "arg0", %1: f64[3] strides=[2] offset=1 #1 "arg1", %9: f64[3] #9 "saved_9", %7: f64[3] #7 "tangent0") {
          %12: f64[1, 3] #7 = view(%7, [1, 3])
          %13: f64[2, 3] strides=[0, 1] #7 = expand(%12, [2, 3])
          %14: f64[3] #12 = mul(%7, %9)
          %15: f64[3] #13 = mul(%14, %1)
          %16: f64[3] #14 = mul(%14, %0)
          %17: f64[2, 3] #15 = clone(%13)
          return (%15, %16, %17)
        }
        saved 3 values, 72 bytes (24 activation bytes):
          %0 "arg0": f64[3] strides=[2] (24 bytes)
          %1 "arg1": f64[3] strides=[2] offset=1 (24 bytes)
          %9 (exp): f64[3] (24 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// Dedupe: `f(x, x)` is traced with one input; both positions get the total gradient.
#[test]
fn duplicate_inputs() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.mul(y)?.add(x)?])
        },
        || {
            let x = leaf(&[3], 1);
            vec![x.clone().into(), x.into()]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %4: f64[3] #4 = mul(%0, %0)
          %5: f64[3] #5 = add(%4, %0)
          return (%5, %0)
        }
        backward:
        graph(%0: f64[3] #0 "arg0", %3: f64[3] #3 "tangent0") {
          %6: f64[3] #6 = mul(%3, %0)
          %7: f64[3] #7 = add(%3, %6)
          %8: f64[3] #8 = add(%7, %6)
          return (%8)
        }
        saved 1 value, 24 bytes (0 activation bytes):
          %0 "arg0": f64[3] (24 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    // d/dx (x*x + x) = 2x + 1, the total, at both positions.
    let x = vals(tensor(&c.inputs[0]).expect("tensor"));
    let g = vals(&c.out_grads[0]);
    for k in 0..2 {
        let got = vals(c.grads[k].as_ref().expect("grad"));
        for i in 0..3 {
            assert!((got[i] - (2.0 * x[i] + 1.0) * g[i]).abs() < crate::checker::tol_of(1e-12));
        }
    }
    // Two distinct tensors are another calling convention: a second specialization.
    let (outs, _) = c.compiled.forward(&[leaf(&[3], 1), leaf(&[3], 2)]).expect("forward");
    assert_eq!(c.compiled.num_compiled(), 2);
    assert!(outs[0].is_requires_grad());
}

/// Dedupe with a mutation of the duplicated input.
#[test]
fn duplicate_inputs_with_mutation() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.mul_(3)?;
            Ok(vec![x.add(y)?, y.clone()])
        },
        || {
            let x = nonleaf(&[2, 2], 1);
            vec![x.clone().into(), x.into()]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 2] #0 "arg0") {
          %5: f64[2, 2] #5 = mul(%0, 3)
          %6: f64[2, 2] #6 = add(%5, %5)
          return (%5, %6, %5)
        }
        backward:
        graph(%3: f64[2, 2] #3 "tangent0", %4: f64[2, 2] #4 "tangent1") {
          %7: f64[2, 2] #7 = add(%3, %4)
          %8: f64[2, 2] #8 = add(%7, %4)
          %9: f64[2, 2] #9 = mul(%8, 3)
          return (%9)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// Only some inputs require grad; an index input (i64), a plain float argument, and
/// a non-float output.
#[test]
fn mixed_inputs() {
    let c = check(
        |a: &[Arg]| {
            let (x, w, idx) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
            let Arg::Float(s) = a[3] else { return Err(aotgrad::Error::Internal("not a float".into())) };
            let y = x.index_select(0, idx)?.mul(w)?.mul(s)?;
            Ok(vec![y.sin()?, y.argmax(1, false)?])
        },
        || {
            let idx = Tensor::from_i64(&[2, 0, 2], &[3]).expect("index");
            vec![leaf(&[3, 4], 1).into(), data(&[4], 2).into(), idx.into(), Arg::Float(0.5)]
        },
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3, 4] #0 "arg0", %1: f64[4] #1 "arg1", %2: i64[3] #2 "arg2") {
          %9: f64[3, 4] #9 = index_select(%0, %2, dim=0)
          %10: f64[3, 4] #10 = mul(%9, %1)
          %11: f64[3, 4] #11 = mul(%10, 0.5)
          %12: f64[3, 4] #12 = sin(%11)
          %13: i64[3] #13 = argmax(%11, dim=1, keepdim=false)
          %14: f64[3, 4] #14 = cos(%11)
          return (%12, %13, %1, %2, %14)
        }
        backward:
        graph(%1: f64[4] #1 "arg1", %2: i64[3] #2 "arg2", %14: f64[3, 4] #14 "saved_14", %8: f64[3, 4] #8 "tangent0") {
          %15: f64[3, 4] #15 = mul(%8, %14)
          %16: f64[3, 4] #16 = mul(%15, 0.5)
          %17: f64[3, 4] #17 = mul(%16, %1)
          %18: i64[3, 1] #2 = view(%2, [3, 1])
          %19: i64[3, 4] strides=[1, 0] #2 = expand(%18, [3, 4])
          %20: f64[3, 4] #18 = full(shape=[3, 4], value=0.0, dtype=f64)
          %21: f64[3, 4] #19 = scatter_add(%20, %19, %17, dim=0)
          return (%21)
        }
        saved 3 values, 152 bytes (96 activation bytes):
          %1 "arg1": f64[4] (32 bytes)
          %2 "arg2": i64[3] (24 bytes)
          %14 (cos): f64[3, 4] (96 bytes)
        recomputed 3 ops, 0 FLOPs: %18 (view), %19 (expand), %20 (full)"#]],
        &c.text,
    );
    assert!(c.grads[1].is_none() && c.grads[2].is_none() && c.grads[3].is_none());
}

/// A scalar loss, its backward seeded by ones, equals the finite differences of the
/// loss itself.
#[test]
fn scalar_loss_seeded_by_ones() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, w, t) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
        Ok(vec![x.matmul(w)?.gelu()?.mse_loss(t)?])
    });
    let inputs = || -> Vec<Arg> { vec![leaf(&[4, 3], 1).into(), leaf(&[3, 2], 2).into(), data(&[4, 2], 3).into()] };
    let ff = f.clone();
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), AotConfig::default()).expect("compile");
    let args = inputs();
    let (outs, pending) = compiled.forward_args(&args).expect("forward");
    assert_eq!(outs[0].dim(), 0);
    assert!(outs[0].is_requires_grad() && !outs[0].is_leaf());
    let grads = pending.backward(&[Tensor::ones(&[], crate::checker::float_dtype()).expect("ones")]).expect("backward");
    assert!(grads[2].is_none());
    for (k, g) in grads.iter().enumerate().take(2) {
        let got = vals(g.as_ref().expect("grad"));
        let fd = scalar_fd(f.clone(), &inputs(), k);
        for (a, b) in got.iter().zip(&fd) {
            // (f32 finite differences on wgpu: a looser bound.)
            let tol = if crate::checker::on_wgpu() { 5e-3 } else { 1e-6 };
            assert!((a - b).abs() <= tol * b.abs().max(1.0), "d loss / d arg{k}: {got:?} != {fd:?}");
        }
    }
}

/// One input that gets a synthetic base of its own: `as_strided` of a transposed
/// (not row-major) input reads the storage in its own order. Its gradient is the base
/// graph input's, read back at the input's storage positions (it used to be taken from
/// a graph input of its own, which it does not have: zeros).
#[test]
fn single_input_with_a_synthetic_base() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.as_strided(&[6], &[1], 0)?.exp()?.sum_all()?])
        },
        || vec![nonleaf(&[3, 2], 1).t().expect("t").into()],
        AotConfig::default(),
    );
    // d/dx (g * sum(exp(storage))) = g * exp(x), element by element.
    let g = vals(&c.out_grads[0])[0];
    let x = nonleaf(&[3, 2], 1).t().expect("t");
    let want: Vec<f64> = vals(&x).iter().map(|v| g * v.exp()).collect();
    let got = vals(c.grads[0].as_ref().expect("grad"));
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < crate::checker::tol_of(1e-12)), "{got:?} vs {want:?}");
    assert_eq!(c.compiled.functionalized()[0].convention.bases.len(), 1, "the input has a synthetic base");
}

/// One input whose `as_strided` view reaches outside it (the input is a narrow slice of
/// a larger storage): a synthetic base covers the reached elements, and the input gets
/// the gradient of its own elements only.
#[test]
fn single_input_whose_as_strided_reaches_outside_it() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.as_strided(&[4], &[1], 1)?.mul(&x.as_strided(&[4], &[1], 0)?)?.sum_all()?])
        },
        || vec![nonleaf(&[6], 2).narrow(0, 1, 2).expect("narrow").into()],
        AotConfig::default(),
    );
    // L = g * sum_i s[i+1] s[i] for i < 4 over storage s; x = s[1..3]:
    // dL/ds[1] = g (s[2] + s[0]), dL/ds[2] = g (s[3] + s[1]).
    let (g, s) = (vals(&c.out_grads[0])[0], vals(&nonleaf(&[6], 2)));
    let want = [g * (s[2] + s[0]), g * (s[3] + s[1])];
    let got = vals(c.grads[0].as_ref().expect("grad"));
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < crate::checker::tol_of(1e-12)), "{got:?} vs {want:?}");
    assert_eq!(c.compiled.functionalized()[0].convention.bases.len(), 1, "the input has a synthetic base");
}

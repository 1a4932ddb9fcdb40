//! Input mutation on the training path: data mutation of an input requiring grad
//! (its new value gets a gradient too), leaf rules, metadata mutation, mutation
//! through strided views, and mutations hidden from autograd.

use crate::checker::{both_reject, check, check_with, data, leaf, nonleaf, tensor, Grads};
use aotgrad::trace::{no_grad, Tensor};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().expect("eager tensor")
}

/// The seed's case: `x.mul_(2); return x * 3` with `x` a non-leaf requiring grad.
#[test]
fn mutated_input_requiring_grad() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.mul(3)?])
        },
        || vec![nonleaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %5: f64[2, 3] #5 = mul(%0, 2)
          %6: f64[2, 3] #6 = mul(%5, 3)
          return (%5, %6)
        }
        backward:
        graph(%3: f64[2, 3] #3 "tangent0", %4: f64[2, 3] #4 "tangent1") {
          %7: f64[2, 3] #7 = mul(%4, 3)
          %8: f64[2, 3] #8 = add(%3, %7)
          %9: f64[2, 3] #9 = mul(%8, 2)
          return (%9)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    // The updated input got a gradient of its own: grad x = 2 * (h + 3 g).
    assert_eq!(c.updated_grads.len(), 1);
    let (g, h) = (vals(&c.out_grads[0]), vals(&c.updated_grads[0].1));
    let got = vals(c.grads[0].as_ref().expect("gradient"));
    for i in 0..6 {
        assert!((got[i] - 2.0 * (h[i] + 3.0 * g[i])).abs() < crate::checker::tol_of(1e-12));
    }
}

/// A leaf requiring grad mutated in place is rejected, in eager and when compiled.
#[test]
fn mutated_leaf_requiring_grad_is_rejected() {
    let err = both_reject(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.mul(3)?])
        },
        &|| vec![leaf(&[2, 3], 1).into()],
    );
    expect!["crates/aotgrad/tests/training/mutation.rs:<line>:<col>: mul_: a leaf Variable that requires grad is being used in an in-place operation."].assert_eq(&err);
}

/// A view of a leaf requiring grad mutated in place is rejected too.
#[test]
fn mutated_view_of_leaf_requiring_grad_is_rejected() {
    let err = both_reject(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.add_(1)?;
            Ok(vec![x.mul(3)?])
        },
        &|| vec![leaf(&[2, 3], 1).view(&[-1]).expect("view").into()],
    );
    expect!["crates/aotgrad/tests/training/mutation.rs:<line>:<col>: add_: a view of a leaf Variable that requires grad is being used in an in-place operation."].assert_eq(&err);
}

/// An input that does not require grad, mutated with a value that does: afterwards
/// it requires grad (as in eager), and its new value's gradient reaches `w`.
#[test]
fn input_mutated_with_a_value_requiring_grad() {
    let c = check(
        |a: &[Arg]| {
            let (x, w) = (tensor(&a[0])?, tensor(&a[1])?);
            x.mul_(w)?;
            Ok(vec![x.sum(&[0], false)?])
        },
        || vec![data(&[2, 3], 1).into(), leaf(&[3], 2).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1") {
          %6: f64[2, 3] #6 = mul(%0, %1)
          %7: f64[3] #7 = sum(%6, dims=[0], keepdim=false)
          return (%6, %7, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %4: f64[2, 3] #4 "tangent0", %5: f64[3] #5 "tangent1") {
          %8: f64[1, 3] #5 = view(%5, [1, 3])
          %9: f64[2, 3] strides=[0, 1] #5 = expand(%8, [2, 3])
          %10: f64[2, 3] #8 = add(%4, %9)
          %11: f64[2, 3] #9 = mul(%10, %0)
          %12: f64[1, 3] #10 = sum(%11, dims=[0], keepdim=true)
          %13: f64[3] #10 = view(%12, [3])
          return (%13)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    assert!(c.grads[0].is_none());
    assert!(tensor(&c.inputs[0]).expect("tensor").is_requires_grad());
}

/// Metadata mutation of an input requiring grad: `x.t_(); return x * 3`.
#[test]
fn metadata_mutation_of_input_requiring_grad() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.t_()?;
            Ok(vec![x.mul(3)?])
        },
        || vec![nonleaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %4: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %5: f64[3, 2] strides=[1, 3] #3 = mul(%4, 3)
          return (%5)
        }
        backward:
        graph(%3: f64[3, 2] #2 "tangent0") {
          %6: f64[3, 2] #4 = mul(%3, 3)
          %7: f64[2, 3] strides=[1, 2] #4 = t(%6)
          %8: f64[2, 3] #5 = clone(%7)
          return (%8)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// Data and metadata mutation of one input.
#[test]
fn data_and_metadata_mutation() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.mul_(y)?;
            x.t_()?;
            Ok(vec![x.add(1)?])
        },
        || vec![nonleaf(&[2, 3], 1).into(), leaf(&[3], 2).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1") {
          %7: f64[2, 3] #6 = mul(%0, %1)
          %8: f64[3, 2] strides=[1, 3] #6 = t(%7)
          %9: f64[3, 2] strides=[1, 3] #7 = add(%8, 1)
          return (%7, %9, %0, %1)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1", %5: f64[2, 3] #4 "tangent0", %6: f64[3, 2] #5 "tangent1") {
          %10: f64[2, 3] strides=[1, 2] #5 = t(%6)
          %11: f64[2, 3] #8 = add(%5, %10)
          %12: f64[2, 3] #9 = mul(%11, %1)
          %13: f64[2, 3] #10 = mul(%11, %0)
          %14: f64[1, 3] #11 = sum(%13, dims=[0], keepdim=true)
          %15: f64[3] #11 = view(%14, [3])
          return (%12, %15)
        }
        saved 2 values, 72 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
          %1 "arg1": f64[3] (24 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// Mutation through a strided slice and a select of an input requiring grad.
#[test]
fn mutation_through_strided_views() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.slice(1, Some(0), None, 2)?.mul_(y)?;
            x.select(0, 1)?.add_(2)?;
            Ok(vec![x.exp()?])
        },
        || vec![nonleaf(&[2, 4], 1).into(), leaf(&[2, 2], 2).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 4] #0 "arg0", %1: f64[2, 2] #1 "arg1") {
          %11: f64[2, 2] strides=[4, 2] #0 = slice(%0, dim=1, start=0, end=4, step=2)
          %12: f64[2, 2] #9 = mul(%11, %1)
          %13: f64[2, 4] #10 = slice_scatter(%0, %12, dim=1, start=0, end=4, step=2)
          %14: f64[4] offset=4 #10 = select(%13, dim=0, index=1)
          %15: f64[4] #11 = add(%14, 2)
          %16: f64[2, 4] #12 = select_scatter(%13, %15, dim=0, index=1)
          %17: f64[2, 4] #13 = exp(%16)
          return (%16, %17, %1, %11, %17)
        }
        backward:
        graph(%1: f64[2, 2] #1 "arg1", %11: f64[2, 2] strides=[4, 2] #0 "saved_11", %17: f64[2, 4] #13 "saved_17", %9: f64[2, 4] #7 "tangent0", %10: f64[2, 4] #8 "tangent1") {
          %18: f64[2, 4] #14 = mul(%10, %17)
          %19: f64[2, 4] #15 = add(%9, %18)
          %20: f64[4] #16 = full(shape=[4], value=0.0, dtype=f64)
          %21: f64[2, 4] #17 = select_scatter(%19, %20, dim=0, index=1)
          %22: f64[4] offset=4 #15 = select(%19, dim=0, index=1)
          %23: f64[2, 4] #18 = full(shape=[2, 4], value=0.0, dtype=f64)
          %24: f64[2, 4] #19 = select_scatter(%23, %22, dim=0, index=1)
          %25: f64[2, 4] #20 = add(%21, %24)
          %26: f64[2, 2] #21 = full(shape=[2, 2], value=0.0, dtype=f64)
          %27: f64[2, 4] #22 = slice_scatter(%25, %26, dim=1, start=0, end=4, step=2)
          %28: f64[2, 2] strides=[4, 2] #20 = slice(%25, dim=1, start=0, end=4, step=2)
          %29: f64[2, 2] #23 = mul(%28, %1)
          %30: f64[2, 2] #24 = mul(%28, %11)
          %31: f64[2, 4] #25 = slice_scatter(%23, %29, dim=1, start=0, end=4, step=2)
          %32: f64[2, 4] #26 = add(%27, %31)
          return (%32, %30)
        }
        saved 3 values, 128 bytes (96 activation bytes):
          %1 "arg1": f64[2, 2] (32 bytes)
          %11 (slice): f64[2, 2] strides=[4, 2] (32 bytes)
          %17 (exp): f64[2, 4] (64 bytes)
        recomputed 3 ops, 0 FLOPs: %20 (full), %23 (full), %26 (full)"#]],
        &c.text,
    );
}

/// Several inputs mutated, one of them not requiring grad.
#[test]
fn several_inputs_mutated() {
    let c = check(
        |a: &[Arg]| {
            let (x, y, z) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
            x.add_(1)?;
            y.mul_(&x.select(0, 1)?)?;
            z.sub_(2)?;
            Ok(vec![x.add(y)?.add(z)?])
        },
        || vec![nonleaf(&[2, 3], 1).into(), nonleaf(&[3], 2).into(), data(&[2, 3], 3).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1", %2: f64[2, 3] #2 "arg2") {
          %12: f64[2, 3] #11 = add(%0, 1)
          %13: f64[3] offset=3 #11 = select(%12, dim=0, index=1)
          %14: f64[3] #12 = mul(%1, %13)
          %15: f64[2, 3] #13 = sub(%2, 2)
          %16: f64[2, 3] #14 = add(%12, %14)
          %17: f64[2, 3] #15 = add(%16, %15)
          return (%12, %14, %15, %17, %1, %13)
        }
        backward:
        graph(%1: f64[3] #1 "arg1", %13: f64[3] offset=3 #11 "saved_13", %9: f64[2, 3] #8 "tangent0", %10: f64[3] #9 "tangent1", %11: f64[2, 3] #10 "tangent2") {
          %18: f64[2, 3] #16 = add(%9, %11)
          %19: f64[1, 3] #17 = sum(%11, dims=[0], keepdim=true)
          %20: f64[3] #17 = view(%19, [3])
          %21: f64[3] #18 = add(%10, %20)
          %22: f64[3] #19 = mul(%21, %13)
          %23: f64[3] #20 = mul(%21, %1)
          %24: f64[2, 3] #21 = full(shape=[2, 3], value=0.0, dtype=f64)
          %25: f64[2, 3] #22 = select_scatter(%24, %23, dim=0, index=1)
          %26: f64[2, 3] #23 = add(%18, %25)
          return (%26, %22)
        }
        saved 2 values, 48 bytes (24 activation bytes):
          %1 "arg1": f64[3] (24 bytes)
          %13 (select): f64[3] offset=3 (24 bytes)
        recomputed 1 op, 0 FLOPs: %24 (full)"#]],
        &c.text,
    );
}

/// A mutation under no-grad of a leaf requiring grad is hidden from autograd: the
/// leaf keeps being the leaf, now holding `2 x`, so `d(3 x_new)/d x = 3` and the
/// gradient of its new value passes through unchanged: `grad x = 3 g + h`.
#[test]
fn mutation_under_no_grad_is_hidden_from_autograd() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            no_grad(|| x.mul_(2))?;
            Ok(vec![x.mul(3)?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %5: f64[2, 3] #5 = mul(%0, 2)
          %6: f64[2, 3] #6 = mul(%5, 3)
          return (%5, %6)
        }
        backward:
        graph(%3: f64[2, 3] #3 "tangent0", %4: f64[2, 3] #4 "tangent1") {
          %7: f64[2, 3] #7 = mul(%4, 3)
          %8: f64[2, 3] #8 = add(%3, %7)
          return (%8)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    let x = tensor(&c.inputs[0]).expect("tensor");
    assert!(x.is_leaf() && x.is_requires_grad(), "still a leaf requiring grad");
    let (g, got) = (vals(&c.out_grads[0]), vals(c.grads[0].as_ref().expect("gradient")));
    assert_eq!(c.updated_grads.len(), 1, "the new value of x gets a gradient");
    let h = vals(&c.updated_grads[0].1);
    for i in 0..6 {
        assert!((got[i] - (3.0 * g[i] + h[i])).abs() < crate::checker::tol_of(1e-12), "{got:?}");
    }
}

/// A mutation through a detached alias is hidden from autograd too.
#[test]
fn mutation_through_a_detached_alias_is_hidden() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.detach()?.add_(1)?;
            Ok(vec![x.mul(x)?])
        },
        || vec![leaf(&[3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %7: f64[3] #5 = add(%0, 1)
          %8: f64[3] #6 = mul(%7, %7)
          return (%7, %8, %0)
        }
        backward:
        graph(%0: f64[3] #0 "arg0", %5: f64[3] #3 "tangent0", %6: f64[3] #4 "tangent1") {
          %7: f64[3] #5 = add(%0, 1)
          %9: f64[3] #7 = mul(%6, %7)
          %10: f64[3] #8 = add(%5, %9)
          %11: f64[3] #9 = add(%10, %9)
          return (%11)
        }
        saved 1 value, 24 bytes (0 activation bytes):
          %0 "arg0": f64[3] (24 bytes)
        recomputed 1 op, 3 FLOPs: %7 (add)"#]],
        &c.text,
    );
    let x_new = vals(tensor(&c.inputs[0]).expect("tensor"));
    let (g, got) = (vals(&c.out_grads[0]), vals(c.grads[0].as_ref().expect("gradient")));
    assert_eq!(c.updated_grads.len(), 1, "the new value of x gets a gradient");
    let h = vals(&c.updated_grads[0].1);
    for i in 0..3 {
        assert!((got[i] - (2.0 * x_new[i] * g[i] + h[i])).abs() < crate::checker::tol_of(1e-12), "{got:?}");
    }
}

/// `keep_inference_input_mutations` is about inference graphs: the training path
/// still returns the new value (it gets a gradient) and copies it back afterwards.
#[test]
fn keep_inference_input_mutations_does_not_apply_to_training() {
    let config = AotConfig { keep_inference_input_mutations: true, ..AotConfig::default() };
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.mul(3)?])
        },
        || vec![nonleaf(&[2, 3], 1).into()],
        config,
    );
    assert!(c.text.contains("return (%5, %6)"), "{}", c.text);
}

/// A view argument written with a value that requires grad: in eager its base (here a
/// leaf that does not require grad) then requires grad and is no longer a leaf; the
/// compiled forward leaves the base the same way (it used to mark only the view).
#[test]
fn writing_a_view_marks_its_base_as_requiring_grad() {
    let f = |a: &[Arg]| {
        let (v, w) = (tensor(&a[0])?, tensor(&a[1])?);
        v.mul_(w)?;
        Ok(vec![v.sum_all()?])
    };
    let inputs = || {
        let base = data(&[2, 3], 1);
        let v = base.slice(1, Some(0), Some(2), 1).expect("slice");
        (base, vec![Arg::from(v), leaf(&[2, 2], 2).into()])
    };
    let (eager_base, eager_args) = inputs();
    f(&eager_args).expect("eager");
    assert!(eager_base.is_requires_grad() && !eager_base.is_leaf(), "eager marks the base");
    let c = aotgrad::aot_function_args(f, AotConfig::default()).expect("compile");
    let (base, args) = inputs();
    c.forward_args(&args).expect("compiled forward");
    assert_eq!((base.is_requires_grad(), base.is_leaf()), (true, false), "compiled marks the base as eager does");
    let v = tensor(&args[0]).expect("tensor");
    assert_eq!((v.is_requires_grad(), v.is_leaf()), (true, false));
    assert_eq!(vals(&base), vals(&eager_base));
}

//! Outputs that alias on the training path: views of inputs requiring grad, views of
//! intermediates (their gradient reaches the intermediate base), an intermediate
//! returned with its view, outputs aliasing each other, the same output twice, and
//! overlapping `as_strided` views (gradients summed over repeated elements).

use crate::checker::{check, leaf, nonleaf, tensor};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

/// The plain case: `sum(relu(x @ w) * 2)`.
#[test]
fn plain_function() {
    let c = check(
        |a: &[Arg]| {
            let (x, w) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.matmul(w)?.relu()?.mul(2)?.sum_all()?])
        },
        || vec![leaf(&[2, 3], 1).into(), leaf(&[3, 4], 2).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3, 4] #1 "arg1") {
          %7: f64[2, 4] #7 = mm(%0, %1)
          %8: f64[2, 4] #8 = relu(%7)
          %9: f64[2, 4] #9 = mul(%8, 2)
          %10: f64[] #10 = sum(%9, dims=[], keepdim=false)
          %14: bool[2, 4] #12 = gt(%8, 0.0)
          return (%10, %0, %1, %14)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3, 4] #1 "arg1", %14: bool[2, 4] #12 "saved_14", %6: f64[] #6 "tangent0") {
          %11: f64[1, 1] #6 = view(%6, [1, 1])
          %12: f64[2, 4] strides=[0, 0] #6 = expand(%11, [2, 4])
          %13: f64[2, 4] #11 = mul(%12, 2)
          %15: f64[] #13 = full(shape=[], value=0.0, dtype=f64)
          %16: f64[2, 4] #14 = where(%14, %13, %15)
          %17: f64[4, 3] strides=[1, 4] #1 = t(%1)
          %18: f64[2, 3] #15 = mm(%16, %17)
          %19: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %20: f64[3, 4] #16 = mm(%19, %16)
          return (%18, %20)
        }
        saved 3 values, 152 bytes (8 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
          %1 "arg1": f64[3, 4] (96 bytes)
          %14 (gt): bool[2, 4] (8 bytes)
        recomputed 3 ops, 0 FLOPs: %15 (full), %17 (t), %19 (t)"#]],
        &c.text,
    );
}

/// An output that is a view of an input requiring grad, next to a fresh one.
#[test]
fn output_is_a_view_of_an_input() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?, x.mul(x)?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %4: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %5: f64[2, 3] #3 = mul(%0, %0)
          return (%4, %5, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %3: f64[2, 3] #2 "tangent0") {
          %6: f64[2, 3] #4 = mul(%3, %0)
          %7: f64[2, 3] #5 = add(%6, %6)
          return (%7)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// The only output is a view of the input: no tangent at all, the gradient is the
/// output gradient moved back through the view.
#[test]
fn only_output_is_a_view_of_an_input() {
    let c = check(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.select(1, 2)?]),
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %1: f64[2] strides=[3] offset=2 #0 = select(%0, dim=1, index=2)
          return (%1)
        }
        backward:
        graph() {
          %2: f64[2, 3] #1 = full(shape=[2, 3], value=0.0, dtype=f64)
          return (%2)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 1 op, 0 FLOPs: %2 (full)"#]],
        &c.text,
    );
}

/// The output is the input itself (mutated first): the same object, whose gradient
/// is that of its new value.
#[test]
fn output_is_the_mutated_input() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.sub_(1)?;
            Ok(vec![x.clone(), x.mul(2)?])
        },
        || vec![nonleaf(&[3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %5: f64[3] #5 = sub(%0, 1)
          %6: f64[3] #6 = mul(%5, 2)
          return (%5, %5, %6)
        }
        backward:
        graph(%3: f64[3] #3 "tangent0", %4: f64[3] #4 "tangent1") {
          %7: f64[3] #7 = mul(%4, 2)
          %8: f64[3] #8 = add(%3, %7)
          return (%8)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// An output viewing an intermediate: its gradient reaches the intermediate base.
#[test]
fn output_is_a_view_of_an_intermediate() {
    let c = check(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.exp()?.view(&[-1])?]),
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %4: f64[2, 3] #3 = exp(%0)
          %5: f64[6] #3 = view(%4, [6])
          return (%5, %4, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %3: f64[2, 3] #2 "tangent0") {
          %4: f64[2, 3] #3 = exp(%0)
          %6: f64[2, 3] #4 = mul(%3, %4)
          return (%6)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 1 op, 6 FLOPs: %4 (exp)"#]],
        &c.text,
    );
}

/// The seed's case 3: `(x.t(), x.mul(2).view(-1))`.
#[test]
fn outputs_alias_an_input_and_an_intermediate() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?, x.mul(2)?.view(&[-1])?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %5: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %6: f64[2, 3] #3 = mul(%0, 2)
          %7: f64[6] #3 = view(%6, [6])
          return (%5, %7, %6)
        }
        backward:
        graph(%4: f64[2, 3] #2 "tangent0") {
          %8: f64[2, 3] #4 = mul(%4, 2)
          return (%8)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// An intermediate and its view, both returned: the view's gradient joins the
/// intermediate's.
#[test]
fn an_intermediate_and_its_view_both_returned() {
    let c = check(
        |a: &[Arg]| {
            let b = tensor(&a[0])?.sin()?;
            Ok(vec![b.clone(), b.t()?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %4: f64[2, 3] #3 = sin(%0)
          %5: f64[3, 2] strides=[1, 3] #3 = t(%4)
          return (%4, %5, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %3: f64[2, 3] #2 "tangent0") {
          %6: f64[2, 3] #4 = cos(%0)
          %7: f64[2, 3] #5 = mul(%3, %6)
          return (%7)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 1 op, 6 FLOPs: %6 (cos)"#]],
        &c.text,
    );
}

/// Outputs aliasing each other (two views of one intermediate, one of them twice).
#[test]
fn outputs_alias_each_other() {
    let c = check(
        |a: &[Arg]| {
            let b = tensor(&a[0])?.mul(tensor(&a[1])?)?;
            let v = b.view(&[-1])?;
            Ok(vec![v.clone(), b.select(1, 2)?, v.clone()])
        },
        || vec![leaf(&[2, 3], 1).into(), leaf(&[3], 2).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1") {
          %6: f64[2, 3] #4 = mul(%0, %1)
          %7: f64[6] #4 = view(%6, [6])
          %8: f64[2] strides=[3] offset=2 #4 = select(%6, dim=1, index=2)
          return (%7, %8, %7, %6, %0, %1)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %1: f64[3] #1 "arg1", %5: f64[2, 3] #3 "tangent0") {
          %9: f64[2, 3] #5 = mul(%5, %1)
          %10: f64[2, 3] #6 = mul(%5, %0)
          %11: f64[1, 3] #7 = sum(%10, dims=[0], keepdim=true)
          %12: f64[3] #7 = view(%11, [3])
          return (%9, %12)
        }
        saved 2 values, 72 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
          %1 "arg1": f64[3] (24 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
}

/// A view of a view of an input, and an overlapping `as_strided` of an input: the
/// gradient of a repeated element is the sum over its repetitions.
#[test]
fn views_of_views_and_overlapping_as_strided() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?.slice(0, Some(1), None, 1)?, x.as_strided(&[3, 2], &[1, 1], 1)?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %1: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f64[2, 2] strides=[1, 3] offset=1 #0 = slice(%1, dim=0, start=1, end=3, step=1)
          %3: f64[3, 2] strides=[1, 1] offset=1 #0 = as_strided(%0, size=[3, 2], stride=[1, 1], offset=1)
          return (%2, %3)
        }
        backward:
        graph() {
          %4: f64[2, 3] #1 = full(shape=[2, 3], value=0.0, dtype=f64)
          return (%4)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 1 op, 0 FLOPs: %4 (full)"#]],
        &c.text,
    );
}

/// An overlapping `as_strided` of an intermediate, returned.
#[test]
fn overlapping_view_of_an_intermediate() {
    let c = check(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.tanh()?.as_strided(&[2, 3], &[1, 1], 0)?]),
        || vec![leaf(&[6], 1).into()],
        AotConfig::default(),
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[6] #0 "arg0") {
          %4: f64[6] #3 = tanh(%0)
          %5: f64[2, 3] strides=[1, 1] #3 = as_strided(%4, size=[2, 3], stride=[1, 1], offset=0)
          return (%5, %4, %0)
        }
        backward:
        graph(%0: f64[6] #0 "arg0", %3: f64[6] #2 "tangent0") {
          %4: f64[6] #3 = tanh(%0)
          %6: f64[6] #4 = mul(%4, %4)
          %7: f64[6] #5 = neg(%6)
          %8: f64[6] #6 = add(%7, 1.0)
          %9: f64[6] #7 = mul(%3, %8)
          return (%9)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[6] (48 bytes)
        recomputed 4 ops, 24 FLOPs: %4 (tanh), %6 (mul), %7 (neg), %8 (add)"#]],
        &c.text,
    );
}

//! What autograd does not see: values computed under no-grad and detached views are
//! constants to it, and a mutation it does not see leaves the mutated tensor's
//! autograd identity alone (its new value passes gradients straight through). The
//! gradients then differ from the function's mathematics, so the tests derive them by
//! hand from the output gradients the checker used.

use crate::checker::{check_with, leaf, tensor, Grads, Trained};
use aotgrad::trace::{no_grad, Tensor};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().expect("eager tensor")
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= crate::checker::tol_of(1e-12) * b.abs().max(1.0), "{what}: {got:?} != {want:?}");
    }
}

/// The gradient of the first input is `want(x, g)` elementwise, `g` being the gradient
/// the checker gave output 0.
fn assert_grad_x(c: &Trained, want: impl Fn(f64, f64) -> f64) {
    let (x, g) = (vals(tensor(&c.inputs[0]).expect("x")), vals(&c.out_grads[0]));
    let want: Vec<f64> = x.iter().zip(&g).map(|(x, g)| want(*x, *g)).collect();
    assert_close("grad x", &vals(c.grads[0].as_ref().expect("grad")), &want);
}

/// `x * x.detach()`: only the first factor carries a gradient: `grad x = x g`.
#[test]
fn detached_factor() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.mul(&x.detach()?)?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %4: f64[2, 3] #3 = mul(%0, %0)
          return (%4, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %3: f64[2, 3] #2 "tangent0") {
          %5: f64[2, 3] #4 = mul(%3, %0)
          return (%5)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    assert_grad_x(&c, |x, g| x * g);
}

/// A factor computed under no-grad: `c = no_grad(2 x); x * c` gives `grad x = 2 x g`.
#[test]
fn value_computed_under_no_grad() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            let k = no_grad(|| x.mul(2))?;
            Ok(vec![x.mul(&k)?, k.clone()])
        },
        || vec![leaf(&[3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %4: f64[3] #4 = mul(%0, 2)
          %5: f64[3] #5 = mul(%0, %4)
          return (%5, %4, %0)
        }
        backward:
        graph(%0: f64[3] #0 "arg0", %3: f64[3] #3 "tangent0") {
          %4: f64[3] #4 = mul(%0, 2)
          %6: f64[3] #6 = mul(%3, %4)
          return (%6)
        }
        saved 1 value, 24 bytes (0 activation bytes):
          %0 "arg0": f64[3] (24 bytes)
        recomputed 1 op, 3 FLOPs: %4 (mul)"#]],
        &c.text,
    );
    assert_grad_x(&c, |x, g| 2.0 * x * g);
}

/// A view taken under no-grad is a constant too: `x * no_grad(x.t()).t()`.
#[test]
fn view_taken_under_no_grad() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            let v = no_grad(|| x.t())?;
            Ok(vec![x.mul(&v.t()?)?])
        },
        || vec![leaf(&[2, 3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[2, 3] #0 "arg0") {
          %6: f64[2, 3] #3 = mul(%0, %0)
          return (%6, %0)
        }
        backward:
        graph(%0: f64[2, 3] #0 "arg0", %5: f64[2, 3] #2 "tangent0") {
          %7: f64[2, 3] #4 = mul(%5, %0)
          return (%7)
        }
        saved 1 value, 48 bytes (0 activation bytes):
          %0 "arg0": f64[2, 3] (48 bytes)
        recomputed 0 ops, 0 FLOPs"#]],
        &c.text,
    );
    assert_grad_x(&c, |x, g| x * g);
}

/// A hidden mutation of an intermediate: `t = 2 x; no_grad(t *= 5); t * t`. Autograd
/// still sees `t = 2 x`, holding `10 x`: `grad x = 2 * 2 t_new g = 40 x g`.
#[test]
fn hidden_mutation_of_an_intermediate() {
    let c = check_with(
        |a: &[Arg]| {
            let t = tensor(&a[0])?.mul(2)?;
            no_grad(|| t.mul_(5))?;
            Ok(vec![t.mul(&t)?])
        },
        || vec![leaf(&[3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %5: f64[3] #5 = mul(%0, 2)
          %6: f64[3] #6 = mul(%5, 5)
          %7: f64[3] #7 = mul(%6, %6)
          return (%7, %0)
        }
        backward:
        graph(%0: f64[3] #0 "arg0", %4: f64[3] #4 "tangent0") {
          %5: f64[3] #5 = mul(%0, 2)
          %6: f64[3] #6 = mul(%5, 5)
          %8: f64[3] #8 = mul(%4, %6)
          %9: f64[3] #9 = add(%8, %8)
          %10: f64[3] #10 = mul(%9, 2)
          return (%10)
        }
        saved 1 value, 24 bytes (0 activation bytes):
          %0 "arg0": f64[3] (24 bytes)
        recomputed 2 ops, 6 FLOPs: %5 (mul), %6 (mul)"#]],
        &c.text,
    );
    assert_grad_x(&c, |x, g| 40.0 * x * g);
}

/// An output computed entirely under no-grad does not require grad (in both worlds),
/// and a detached alias returned is a leaf: gradients are zero.
#[test]
fn outputs_outside_autograd() {
    let c = check_with(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![no_grad(|| x.exp())?, x.detach()?])
        },
        || vec![leaf(&[3], 1).into()],
        AotConfig::default(),
        Grads::ByTheTest,
    );
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[3] #0 "arg0") {
          %1: f64[3] #1 = exp(%0)
          return (%1, %0)
        }
        backward:
        graph() {
          %2: f64[3] #2 = full(shape=[3], value=0.0, dtype=f64)
          return (%2)
        }
        saved 0 values, 0 bytes (0 activation bytes):
        recomputed 1 op, 0 FLOPs: %2 (full)"#]],
        &c.text,
    );
    assert_close("grad x", &vals(c.grads[0].as_ref().expect("grad")), &[0.0; 3]);
}

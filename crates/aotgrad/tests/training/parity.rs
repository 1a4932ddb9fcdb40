//! Gradients as PyTorch's autograd gives them where views, no-grad regions and
//! detached aliases meet (each case checked in PyTorch 2.15 eager).

use crate::checker::tensor;
use aotgrad::trace::{no_grad, DType, Tensor};
use aotgrad::{aot_function_args, AotConfig, Arg};

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).expect("data").requires_grad(true).expect("leaf")
}

/// Outputs' values, their `requires_grad` flags, and the arguments' gradients.
type Run = (Vec<Vec<f64>>, Vec<bool>, Vec<Option<Vec<f64>>>);

/// One compiled forward and a backward with all-ones output gradients.
fn run(f: fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>, args: Vec<Arg>) -> Run {
    let c = aot_function_args(f, AotConfig::default()).expect("compile");
    let (outs, pending) = c.forward_args(&args).expect("forward");
    let ones: Vec<Tensor> = outs.iter().map(|o| o.ones_like().expect("ones")).collect();
    let grads = pending.backward(&ones).expect("backward");
    (
        outs.iter().map(|o| o.to_vec_f64().expect("values")).collect(),
        outs.iter().map(Tensor::is_requires_grad).collect(),
        grads.iter().map(|g| g.as_ref().map(|g| g.to_vec_f64().expect("values"))).collect(),
    )
}

#[test]
fn an_expanded_argument_returned_gets_one_per_element() {
    // PyTorch: `a = L.expand(2, 3)`, `f(a) = a`: the gradient for `a` is 1 per
    // element (and `L`'s, through the expand, 2); `a * 1` gives the same.
    let l = leaf(&[1.0, 2.0, 3.0], &[3]);
    for f in
        [(|a: &[Arg]| Ok(vec![tensor(&a[0])?.clone()])) as fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>, |a: &[Arg]| {
            Ok(vec![tensor(&a[0])?.mul(1.0)?])
        }]
    {
        let (_, _, g) = run(f, vec![l.expand(&[2, 3]).expect("expand").into()]);
        assert_eq!(g[0].as_deref(), Some(&[1.0; 6][..]));
    }
}

#[test]
fn a_view_of_a_no_grad_view_passes_no_gradient() {
    // PyTorch: `y = a * 2`; under no_grad `v = y.view(6)`; `v.view(3, 2)` requires
    // grad but `a.grad` stays None (here: zeros).
    let (vals, rg, g) = run(
        |a| {
            let y = tensor(&a[0])?.mul(2.0)?;
            let v = no_grad(|| y.view(&[6]))?;
            Ok(vec![v.view(&[3, 2])?])
        },
        vec![leaf(&[1.0; 6], &[2, 3]).into()],
    );
    assert_eq!(vals[0], [2.0; 6]);
    assert_eq!(rg, [true]);
    assert_eq!(g[0].as_deref(), Some(&[0.0; 6][..]));
}

#[test]
fn a_no_grad_in_place_op_after_a_grad_mode_one_is_hidden() {
    // PyTorch: `v = (a * 2).t(); v.add_(1)`; under no_grad `v.mul_(3)`; `a.grad` is 2
    // (autograd never saw the multiplication by 3), while the values are 9.
    let (vals, rg, g) = run(
        |a| {
            let v = tensor(&a[0])?.mul(2.0)?.t()?;
            v.add_(1.0)?;
            no_grad(|| v.mul_(3.0))?;
            Ok(vec![v])
        },
        vec![leaf(&[1.0; 6], &[2, 3]).into()],
    );
    assert_eq!(vals[0], [9.0; 6]);
    assert_eq!(rg, [true]);
    assert_eq!(g[0].as_deref(), Some(&[2.0; 6][..]));
}

#[test]
fn an_in_place_op_on_a_detached_alias_is_hidden_from_the_original() {
    // PyTorch: `y = a * 2; z = a * 3; y.detach().mul_(z); return y`: y is
    // [0.06, 0.24, 0.54] and `a.grad` is 2 (y's history is still `a * 2`).
    let (vals, _, g) = run(
        |a| {
            let x = tensor(&a[0])?;
            let (y, z) = (x.mul(2.0)?, x.mul(3.0)?);
            y.detach()?.mul_(&z)?;
            Ok(vec![y])
        },
        vec![leaf(&[0.1, 0.2, 0.3], &[3]).into()],
    );
    for (v, w) in vals[0].iter().zip([0.06, 0.24, 0.54]) {
        assert!((v - w).abs() < 1e-12, "{:?}", vals[0]);
    }
    assert_eq!(g[0].as_deref(), Some(&[2.0; 3][..]));
}

#[test]
fn views_taken_under_no_grad_require_grad_and_refuse_in_place_ops_in_grad_mode() {
    // PyTorch: under no_grad `w = a.view(3)` of an `a` requiring grad has
    // `requires_grad` True, and `w.mul_(2)` with grad mode back on raises.
    let a = leaf(&[1.0, 2.0, 3.0], &[3]);
    let w = no_grad(|| a.view(&[3])).expect("view");
    assert!(w.is_requires_grad());
    let e = w.mul_(2.0).expect_err("in-place on a no-grad view in grad mode");
    assert!(e.to_string().contains("A view was created in no_grad mode and is being modified inplace"), "{e}");
    // Inside no_grad the same write is allowed (autograd does not track it).
    no_grad(|| w.mul_(2.0)).expect("in-place under no_grad");
    // The same program compiled is refused the same way.
    let msg = crate::checker::both_reject(
        |a: &[Arg]| {
            let y = tensor(&a[0])?.mul(1.0)?;
            let v = no_grad(|| y.view(&[3]))?;
            v.mul_(2.0)?;
            Ok(vec![v])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0], &[3]).into()],
    );
    assert!(msg.contains("A view was created in no_grad mode"), "{msg}");
}

#[test]
fn an_as_strided_view_repeating_elements_is_differentiated() {
    // PyTorch: `a.as_strided([2, 2], [2, 2], 0).sin()` names a[2] twice; with output
    // weights [[1, 2], [3, 4]] the gradient is [0.9950, 0, 4.7767, 0, 3.5103, 0]
    // (a[2]'s two uses add up).
    let c = aot_function_args(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.as_strided(&[2, 2], &[2, 2], 0)?.sin()?]),
        AotConfig::default(),
    )
    .expect("compile");
    let a = leaf(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[6]);
    let (outs, pending) = c.forward_args(&[a.into()]).expect("forward");
    let want_out = [0.0998, 0.2955, 0.2955, 0.4794];
    for (o, w) in outs[0].to_vec_f64().expect("values").iter().zip(want_out) {
        assert!((o - w).abs() < 1e-4, "{o} vs {w}");
    }
    let w = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64).expect("weights");
    let g = pending.backward(&[w]).expect("backward")[0].as_ref().expect("grad").to_vec_f64().expect("values");
    for (x, w) in g.iter().zip([0.9950, 0.0, 4.7767, 0.0, 3.5103, 0.0]) {
        assert!((x - w).abs() < 1e-4, "{g:?}");
    }
}

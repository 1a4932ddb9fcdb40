//! Gradients as PyTorch's autograd gives them where views, no-grad regions and
//! detached aliases meet (each case checked in PyTorch 2.15 eager).

use crate::checker::tensor;
use aotgrad::trace::{no_grad, DType, Tensor};
use aotgrad::{aot_function_args, AotConfig, Arg};

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, crate::checker::float_dtype()).expect("data").requires_grad(true).expect("leaf")
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
        assert!((v - w).abs() < crate::checker::tol_of(1e-12), "{:?}", vals[0]);
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
    let w = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], crate::checker::float_dtype()).expect("weights");
    let g = pending.backward(&[w]).expect("backward")[0].as_ref().expect("grad").to_vec_f64().expect("values");
    for (x, w) in g.iter().zip([0.9950, 0.0, 4.7767, 0.0, 3.5103, 0.0]) {
        assert!((x - w).abs() < 1e-4, "{g:?}");
    }
}

/// The expected error of an in-place op on output `i` of a multi-output view op `op`.
fn multi_output_error(op: &str, i: usize) -> String {
    format!(
        "Output {i} of {op} is a view and is being modified inplace. This view is the output of a function that \
         returns multiple views. Such functions do not allow the output views to be modified inplace."
    )
}

#[test]
fn outputs_of_multi_output_view_ops_refuse_in_place_ops_as_in_pytorch() {
    // PyTorch 2.15, `a = torch.ones(6, requires_grad=True).clone()`:
    // `a.split(2)[1].add_(1)` -> "Output 1 of Split is a view ...", `a.chunk(3)[2]` ->
    // "Output 2 of Split", `a.view(2, 3).unbind(0)[0]` -> "Output 0 of Unbind", a view
    // of a split output -> "Output 0 of View" / "of Transpose" / "of AsStrided".
    let a = leaf(&[1.0; 6], &[6]).mul(1.0).expect("non-leaf");
    let cases: Vec<(Tensor, String)> = vec![
        (a.split(2, 0).unwrap()[1].clone(), multi_output_error("Split", 1)),
        (a.chunk(3, 0).unwrap()[2].clone(), multi_output_error("Split", 2)),
        (a.view(&[2, 3]).unwrap().unbind(0).unwrap()[0].clone(), multi_output_error("Unbind", 0)),
        (a.split(2, 0).unwrap()[1].view(&[2]).unwrap(), multi_output_error("View", 0)),
        (a.split(2, 0).unwrap()[1].transpose(0, 0).unwrap(), multi_output_error("Transpose", 0)),
        (a.split(2, 0).unwrap()[1].as_strided(&[2], &[1], 0).unwrap(), multi_output_error("AsStrided", 0)),
    ];
    for (v, want) in &cases {
        let e = v.add_(1.0).expect_err("in-place on a multi-output view").to_string();
        assert!(e.contains(want), "{e}\nwanted: {want}");
    }
    // Allowed, as in PyTorch: a detached output, a clone, no-grad mode, and a base
    // that does not require grad with an operand that does not either.
    a.split(2, 0).unwrap()[0].detach().unwrap().add_(1.0).expect("detached output");
    a.split(2, 0).unwrap()[0].clone_tensor().unwrap().add_(1.0).expect("clone");
    no_grad(|| a.split(2, 0).unwrap()[0].add_(1.0)).expect("no-grad mode");
    let plain = Tensor::ones(&[6], crate::checker::float_dtype()).unwrap();
    plain.split(2, 0).unwrap()[0].add_(1.0).expect("nothing requires grad");
    assert_eq!(plain.to_vec_f64().unwrap(), vec![2.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
    // A base without grad but an operand requiring it: PyTorch's no-grad wording.
    let e = plain.split(2, 0).unwrap()[0].add_(&leaf(&[1.0, 1.0], &[2])).expect_err("tracked write").to_string();
    assert!(e.contains("A view was created in no_grad mode and is being modified inplace with grad mode enabled. This view is the output of a function that returns multiple views"), "{e}");
}

#[test]
fn compiled_functions_refuse_in_place_ops_on_split_outputs_like_eager() {
    let f = |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
        let x = tensor(&a[0])?.mul(2.0)?;
        let parts = x.split(2, 0)?;
        parts[1].mul_(3.0)?;
        Ok(vec![x])
    };
    let a = leaf(&[1.0; 6], &[6]);
    let eager = f(&[a.clone().into()]).expect_err("eager").to_string();
    let compiled =
        aot_function_args(f, AotConfig::default().no_cache()).unwrap().forward_args(&[a.into()]).err().unwrap();
    for e in [eager, compiled.to_string()] {
        assert!(e.contains(&multi_output_error("Split", 1)), "{e}");
    }
}

#[test]
fn detach_in_place_and_requires_grad_in_place_are_spelled_as_in_pytorch() {
    // PyTorch: `c = torch.ones(3, requires_grad=True) * 2; c.detach_()` leaves a leaf
    // that does not require grad; `detach_()` on any view raises "Can't detach views
    // in-place. Use detach() instead."
    let c = leaf(&[1.0; 3], &[3]).mul(2.0).unwrap();
    let same = c.detach_().unwrap();
    assert!(same.same_object(&c) && c.is_leaf() && !c.is_requires_grad());
    for v in [
        leaf(&[1.0; 6], &[6]).mul(1.0).unwrap().view(&[2, 3]).unwrap(),
        Tensor::ones(&[6], crate::checker::float_dtype()).unwrap().split(2, 0).unwrap().remove(0),
    ] {
        let e = v.detach_().expect_err("detach_ on a view").to_string();
        assert!(e.contains("Can't detach views in-place. Use detach() instead."), "{e}");
    }
    let w = Tensor::ones(&[2], DType::F32).unwrap().requires_grad_(true).unwrap();
    assert!(w.is_requires_grad() && w.is_leaf());
    assert!(w.requires_grad_(false).is_ok() && !w.is_requires_grad());
}

#[test]
fn a_detached_alias_mutated_with_a_grad_value_passes_its_gradient_to_that_value() {
    // PyTorch 2.15: `y = a * 2; z = a * 3; d = y.detach(); d.mul_(z)`: d requires grad
    // (MulBackward0, not a leaf); `(y.sum() + d.sum()).backward()` gives `a.grad`
    // [2.6, 3.2, 3.8] (2 through y, 3 * y through z), and `d.sum()` alone
    // [0.6, 1.2, 1.8].
    let (vals, rg, g) = run(
        |a| {
            let x = tensor(&a[0])?;
            let (y, z) = (x.mul(2.0)?, x.mul(3.0)?);
            let d = y.detach()?;
            d.mul_(&z)?;
            Ok(vec![y, d])
        },
        vec![leaf(&[0.1, 0.2, 0.3], &[3]).into()],
    );
    for v in &vals {
        for (v, w) in v.iter().zip([0.06, 0.24, 0.54]) {
            assert!((v - w).abs() < crate::checker::tol_of(1e-12), "{vals:?}");
        }
    }
    assert_eq!(rg, vec![true, true]);
    let g = g[0].clone().expect("a gradient");
    for (v, w) in g.iter().zip([2.6, 3.2, 3.8]) {
        assert!((v - w).abs() < crate::checker::tol_of(1e-12), "{g:?}");
    }
}

#[test]
fn a_detached_alias_written_under_and_out_of_autograd_keeps_both_histories() {
    // PyTorch 2.15 (f64): `l = arange(24) / 10 - 1` (requires grad);
    // `x0 = (l * 1).view(4, 6).t()`; `v1 = x0.sin()`; `v2 = v1.detach()`;
    // `v2.add_(0.5)` (no gradient); `v2.mul_(0.1 * x0.transpose(0, 1)[1:].sum())`;
    // with `w = arange(24).view(6, 4) / 7`, `L = (v1 * w).sum() + (v2 * w * w).sum()`:
    // v1 keeps sin's history (its storage was written only through the alias), v2's
    // gradient reaches x0 only through the sum. `l.grad` below.
    let want = [
        0.0, 0.355206, 0.796236, 1.311158, 1.886481, 2.507379, 7.295275, 7.846078, 8.42378, 9.01156, 9.592266,
        10.148707, 7.443714, 7.982555, 8.479496, 8.91886, 9.285986, 9.567484, 7.462283, 7.785305, 8.012741, 8.135686,
        8.147237, 8.042619,
    ];
    let prog = |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
        let x0 = tensor(&a[0])?;
        let v1 = x0.sin()?;
        let v2 = v1.detach()?;
        v2.add_(0.5)?;
        let s = x0.transpose(0, 1)?.slice(0, Some(1), None, 1)?.sum_all()?.mul(0.1)?;
        v2.mul_(&s)?;
        Ok(vec![v1, v2])
    };
    let w = Tensor::arange(0, 24, 1, crate::checker::float_dtype()).unwrap().view(&[6, 4]).unwrap().div(7.0).unwrap();
    let l = Tensor::arange(0, 24, 1, crate::checker::float_dtype()).unwrap().div(10.0).unwrap().sub(1.0).unwrap();
    let l = l.requires_grad(true).unwrap();
    let x0 = l.mul(1.0).unwrap().view(&[4, 6]).unwrap().t().unwrap();
    let edge = x0.grad_edge().unwrap();
    let f = aot_function_args(prog, AotConfig::default()).expect("compile");
    let (_, pending) = f.forward_args(&[x0.into()]).expect("forward");
    let g = pending.backward(&[w.clone(), w.mul(&w).unwrap()]).expect("backward");
    // The argument's gradient continues through its eager history to `l`.
    aotgrad::backward_from_edges(&[(edge, g[0].clone().expect("a gradient"))], false).unwrap();
    let got = l.grad().unwrap().to_vec_f64().unwrap();
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{got:?}");
    }
}

#[test]
fn a_detached_alias_keeps_its_own_history_when_its_storage_is_written_through_another_alias() {
    // PyTorch 2.15 (f64): `l0[i] = (7i mod 11) / 10 - 0.4`, `l1[i] = (5i mod 13) / 10 - 0.6`
    // (both require grad); `v0 = (l1 * 1).view(2, 12)`, `v1 = (l0 * 1).view(-1)`;
    // `v0.t_(); v2 = v0.detach(); v2.mul_(0.1 * v1.sum()); v0.tanh_()`. v2's data is
    // now tanh'd but its history is still `MulBackward0` of its values before: with
    // `L = v1.sum() + (v2 * arange(24).view(12, 2)).sum()`, every `l0.grad` is 2.31
    // (1 + 0.1 * sum(w * v2 before tanh_)), and l1 gets no gradient.
    let prog = |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
        let (v0, v1) = (tensor(&a[0])?, tensor(&a[1])?);
        v0.t_()?;
        let v2 = v0.detach()?;
        v2.mul_(&v1.sum_all()?.mul(0.1)?)?;
        v0.tanh_()?;
        Ok(vec![v1.clone(), v2])
    };
    let vals = |k: usize, m: usize, c: f64| -> Vec<f64> { (0..24).map(|i| ((i * k) % m) as f64 / 10.0 - c).collect() };
    let l0 =
        Tensor::from_f64(&vals(7, 11, 0.4), &[24], crate::checker::float_dtype()).unwrap().requires_grad(true).unwrap();
    let l1 =
        Tensor::from_f64(&vals(5, 13, 0.6), &[24], crate::checker::float_dtype()).unwrap().requires_grad(true).unwrap();
    let v0 = l1.mul(1.0).unwrap().view(&[2, 12]).unwrap();
    let v1 = l0.mul(1.0).unwrap().view(&[-1]).unwrap();
    let edges = [v0.grad_edge().unwrap(), v1.grad_edge().unwrap()];
    let f = aot_function_args(prog, AotConfig::default().no_cache()).expect("compile");
    let (outs, pending) = f.forward_args(&[v0.into(), v1.into()]).expect("forward");
    assert!(outs[1].is_requires_grad());
    let w = Tensor::arange(0, 24, 1, crate::checker::float_dtype()).unwrap().view(&[12, 2]).unwrap();
    let ones = Tensor::ones(&[24], crate::checker::float_dtype()).unwrap();
    let g = pending.backward(&[ones, w]).expect("backward");
    let roots: Vec<_> = edges.into_iter().zip(g).filter_map(|(e, g)| Some((e, g?))).collect();
    aotgrad::backward_from_edges(&roots, false).unwrap();
    for v in l0.grad().unwrap().to_vec_f64().unwrap() {
        assert!((v - 2.31).abs() < crate::checker::tol_of(1e-9), "{v}");
    }
    assert!(l1.grad().is_none_or(|g| g.to_vec_f64().unwrap().iter().all(|v| *v == 0.0)));
}

#[test]
fn requires_grad_inside_a_compiled_function_reaches_the_callers_tensor() {
    // PyTorch 2.15 (f64): `x = [[1, 2], [3, 4]]` (no grad), `y = [[.5, .25], [2, 1]]`
    // (requires grad); `f(x, y) = (a + x * x, x.t())` with `a = x * y` computed before
    // `x.requires_grad_()`: both outputs require grad (non-leaves), `x` requires grad
    // and stays a leaf; with `L = o0.sum() + (o1 * [[1, 10], [100, 1000]]).sum()`,
    // `x.grad = [[3, 104], [16, 1008]]` (2x, plus the transposed weights; nothing
    // through `a`) and `y.grad = x`.
    let prog = |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        let before = x.mul(y)?;
        x.requires_grad_(true)?;
        Ok(vec![before.add(&x.mul(x)?)?, x.t()?])
    };
    let f = aot_function_args(prog, AotConfig::default().no_cache()).expect("compile");
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], crate::checker::float_dtype()).unwrap();
    let y = Tensor::from_f64(&[0.5, 0.25, 2.0, 1.0], &[2, 2], crate::checker::float_dtype())
        .unwrap()
        .requires_grad(true)
        .unwrap();
    let (outs, pending) = f.forward_args(&[x.clone().into(), y.into()]).expect("forward");
    assert!(x.is_requires_grad() && x.is_leaf());
    assert!(outs.iter().all(|o| o.is_requires_grad() && !o.is_leaf()));
    let w = Tensor::from_f64(&[1.0, 10.0, 100.0, 1000.0], &[2, 2], crate::checker::float_dtype()).unwrap();
    let g = pending.backward(&[Tensor::ones(&[2, 2], crate::checker::float_dtype()).unwrap(), w]).expect("backward");
    let vals = |k: usize| g[k].as_ref().expect("a gradient").to_vec_f64().unwrap();
    assert_eq!(vals(0), vec![3.0, 104.0, 16.0, 1008.0]);
    assert_eq!(vals(1), vec![1.0, 2.0, 3.0, 4.0]);

    // A view argument of a tensor without grad: `v = d.t()`; `g(v) = (v * 2, v[0])`
    // after `v.requires_grad_()`: `v` is a leaf requiring grad, `d` does not require
    // grad, and `v.grad = [[3, 3], [2, 2]]` for `L = o0.sum() + o1.sum()`.
    let prog = |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
        let v = tensor(&a[0])?;
        v.requires_grad_(true)?;
        Ok(vec![v.mul(2.0)?, v.select(0, 0)?])
    };
    let f = aot_function_args(prog, AotConfig::default().no_cache()).expect("compile");
    let d = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], crate::checker::float_dtype()).unwrap();
    let v = d.t().unwrap();
    let (outs, pending) = f.forward_args(&[v.clone().into()]).expect("forward");
    assert!(v.is_requires_grad() && v.is_leaf() && !d.is_requires_grad());
    assert!(outs.iter().all(|o| o.is_requires_grad() && !o.is_leaf()));
    let g = pending.backward(&[
        Tensor::ones(&[2, 2], crate::checker::float_dtype()).unwrap(),
        Tensor::ones(&[2], crate::checker::float_dtype()).unwrap(),
    ]);
    let g = g.expect("backward")[0].clone().expect("a gradient").to_vec_f64().unwrap();
    assert_eq!(g, vec![3.0, 3.0, 2.0, 2.0]);

    // Turning tracking off part way is refused with a clear error.
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let x = tensor(&a[0])?;
            x.requires_grad_(false)?;
            Ok(vec![x.mul(2.0)?])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let x = Tensor::ones(&[2], crate::checker::float_dtype()).unwrap().requires_grad(true).unwrap();
    let e = f.call(&[x]).unwrap_err().to_string();
    assert!(e.contains("requires_grad_(false)"), "{e}");
}

#[test]
fn returned_views_of_inputs_without_grad_are_leaves_that_do_not_require_grad() {
    // PyTorch 2.15: `h(z, w) = (z.t(), z[0], z * w)` with only `w` requiring grad:
    // flags `(False, True), (False, True), (True, False)` (requires_grad, is_leaf).
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let (z, w) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![z.t()?, z.select(0, 0)?, z.mul(w)?])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let z = Tensor::ones(&[2, 3], crate::checker::float_dtype()).unwrap();
    let w = Tensor::ones(&[3], crate::checker::float_dtype()).unwrap().requires_grad(true).unwrap();
    let (outs, _) = f.forward_args(&[z.into(), w.into()]).expect("forward");
    let flags: Vec<(bool, bool)> = outs.iter().map(|o| (o.is_requires_grad(), o.is_leaf())).collect();
    assert_eq!(flags, vec![(false, true), (false, true), (true, false)]);
}

#[test]
fn arguments_viewing_one_another_get_their_own_gradients() {
    // PyTorch 2.15: `L = ones(2, 3)` (requires grad), `B = L * 1`, `a = B[0]`, `b = B`,
    // both retaining their gradients; `(a * 2).sum() + (b * 3).sum()` gives `a.grad =
    // [2, 2, 2]`, `b.grad = L.grad = [[5, 5, 5], [3, 3, 3]]` (a's gradient reaches b
    // through a's view). Compiled, each argument's gradient holds the contributions
    // through it alone (2 for `a`, 3 for `b`): continued through the arguments' own
    // history, every `.grad` and retained gradient is PyTorch's.
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.mul(2.0)?.sum_all()?.add(&y.mul(3.0)?.sum_all()?)?])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let l = Tensor::ones(&[2, 3], crate::checker::float_dtype()).unwrap().requires_grad(true).unwrap();
    let b = l.mul(1.0).unwrap();
    let a = b.select(0, 0).unwrap();
    a.retain_grad().unwrap();
    b.retain_grad().unwrap();
    let edges = [a.grad_edge().unwrap(), b.grad_edge().unwrap()];
    let (_, pending) = f.forward_args(&[a.clone().into(), b.clone().into()]).expect("forward");
    let g = pending.backward(&[Tensor::ones(&[], crate::checker::float_dtype()).unwrap()]).expect("backward");
    let vals = |t: &Option<Tensor>| t.as_ref().expect("a gradient").to_vec_f64().unwrap();
    assert_eq!(vals(&g[0]), vec![2.0; 3]);
    assert_eq!(vals(&g[1]), vec![3.0; 6]);
    let roots: Vec<_> = edges.into_iter().zip(g).filter_map(|(e, g)| Some((e, g?))).collect();
    aotgrad::backward_from_edges(&roots, false).unwrap();
    let want = vec![5.0, 5.0, 5.0, 3.0, 3.0, 3.0];
    assert_eq!(vals(&a.grad()), vec![2.0; 3]);
    assert_eq!(vals(&b.grad()), want);
    assert_eq!(vals(&l.grad()), want);
}

#[test]
fn the_compiled_backward_refuses_a_saved_value_changed_in_place_as_pytorch_does() {
    // PyTorch 2.15: `b = a * 1; b.mul_(b); b.sum().backward()` raises "one of the
    // variables needed for gradient computation has been modified by an inplace
    // operation: [torch.DoubleTensor [3]], which is output 0 of Mul, is at
    // version 1; expected version 0 instead" (mul_ saved `b` before writing it). The
    // forward runs; the compiled backward refuses with the gist of that message.
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let b = tensor(&a[0])?.mul(1.0)?;
            b.mul_(&b)?;
            Ok(vec![b])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let a = leaf(&[1.0, 2.0, 3.0], &[3]);
    let (outs, pending) = f.forward_args(&[a.into()]).expect("forward");
    assert_eq!(outs[0].to_vec_f64().unwrap(), vec![1.0, 4.0, 9.0]);
    let e = pending.backward(&[Tensor::ones(&[3], crate::checker::float_dtype()).unwrap()]).unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation") && e.contains("is at version 1; expected version 0"), "{e}");
    // Without the in-place op on a saved value, the same function differentiates.
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let b = tensor(&a[0])?.mul(1.0)?;
            let c = b.mul(&b)?;
            Ok(vec![c])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let (_, pending) = f.forward_args(&[leaf(&[1.0, 2.0, 3.0], &[3]).into()]).expect("forward");
    let g = pending.backward(&[Tensor::ones(&[3], crate::checker::float_dtype()).unwrap()]).expect("backward");
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn the_compiled_backward_refuses_a_gradient_whose_shape_a_no_grad_metadata_op_changed() {
    // PyTorch 2.15: `b = x * 1` (x [2, 3] requires grad); under no_grad `b.t_()`;
    // `(b * 2).sum().backward()` raises "Function MulBackward0 returned an invalid
    // gradient at index 0 - got [3, 2] but expected shape compatible with [2, 3]" (b's
    // own node still has the old shape). Compiled: the same refusal at backward.
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let b = tensor(&a[0])?.mul(1.0)?;
            no_grad(|| b.t_())?;
            Ok(vec![b.mul(2.0)?])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let x = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let (outs, pending) = f.forward_args(&[x.into()]).expect("forward");
    assert_eq!(outs[0].shape().len(), 2);
    let e = pending.backward(&[Tensor::ones(&[3, 2], crate::checker::float_dtype()).unwrap()]).unwrap_err().to_string();
    assert!(
        e.contains(
            "Function MulBackward0 returned an invalid gradient at index 0 - got [3, 2] but expected shape \
             compatible with [2, 3]"
        ),
        "{e}"
    );
}

#[test]
fn an_expanded_argument_whose_base_is_written_through_another_argument() {
    // PyTorch 2.15 (f64): `L = [1, 2, 3]` (requires grad), `B = L * 1`, `e =
    // B.expand(2, 3)`; `f(B, e)`: `B.mul_(2)`, then `(e * [[1, 2, 3], [4, 5, 6]]).sum()`:
    // `L.grad = [10, 14, 18]` (the write doubles what both rows of `e` read).
    let f = aot_function_args(
        |a: &[Arg]| -> aotgrad::Result<Vec<Tensor>> {
            let (b, e) = (tensor(&a[0])?, tensor(&a[1])?);
            b.mul_(2.0)?;
            let w = Tensor::arange(1, 7, 1, crate::checker::float_dtype())?.view(&[2, 3])?;
            Ok(vec![e.mul(&w)?.sum_all()?])
        },
        AotConfig::default().no_cache(),
    )
    .expect("compile");
    let l = leaf(&[1.0, 2.0, 3.0], &[3]);
    let b = l.mul(1.0).unwrap();
    let e = b.expand(&[2, 3]).unwrap();
    let edges = [b.grad_edge().unwrap(), e.grad_edge().unwrap()];
    let (_, pending) = f.forward_args(&[b.into(), e.into()]).expect("forward");
    let g = pending.backward(&[Tensor::ones(&[], crate::checker::float_dtype()).unwrap()]).expect("backward");
    let roots: Vec<_> = edges.into_iter().zip(g).filter_map(|(e, g)| Some((e, g?))).collect();
    aotgrad::backward_from_edges(&roots, false).unwrap();
    assert_eq!(l.grad().unwrap().to_vec_f64().unwrap(), vec![10.0, 14.0, 18.0]);
}

//! Compiled equals eager (issue 33): each case where a compiled function once differed
//! from eager mode, with PyTorch 2.15's values or messages (checked in a local
//! PyTorch; never a test dependency). The extended random programs
//! (`random::extended_random_programs_compile_to_what_eager_does`) keep finding the
//! rest.

use crate::checker::{both_reject, tensor};
use aotgrad::trace::{no_grad, NoGradGuard, Tensor};
use aotgrad::{aot_function_args, backward_from_edges, AotConfig, Arg};

type Prog = fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>;

fn vals(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, crate::checker::float_dtype()).expect("data")
}

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    vals(v, shape).requires_grad(true).expect("leaf")
}

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
    }
}

const NO_GRAD_VIEW_INPLACE: &str = "A view was created in no_grad mode and is being modified inplace with grad mode \
                                    enabled. Given that this use case is ambiguous and error-prone, it is forbidden.";

#[test]
fn a_call_under_no_grad_returns_views_that_require_grad_and_refuse_in_place_ops() {
    // PyTorch: under no_grad, `f(a) = (a.view(-1), a.unbind(0)[1])` of an `a` requiring
    // grad gives views with `requires_grad` True and `is_leaf` True; `add_` on either
    // with grad mode back on raises the no-grad view error. Eager and compiled alike.
    let prog: Prog = |a| {
        let x = tensor(&a[0])?;
        Ok(vec![x.view(&[-1])?, x.unbind(0)?[1].clone()])
    };
    let compiled = aot_function_args(prog, AotConfig::default().no_cache()).expect("compile");
    for world in ["eager", "compiled"] {
        let a = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let outs = {
            let _g = NoGradGuard::new();
            if world == "eager" { prog(&[a.into()]) } else { compiled.call_args(&[a.into()]) }.expect("call")
        };
        for o in &outs {
            assert_eq!((o.is_requires_grad(), o.is_leaf()), (true, true), "{world}");
            let e = o.add_(1.0).expect_err("in-place on a no-grad view in grad mode").to_string();
            assert!(e.contains(NO_GRAD_VIEW_INPLACE), "{world}: {e}");
        }
    }
}

/// The gradient of leaf `l` after the compiled gradients `grads` of the arguments
/// continue through the arguments' history (`edges`, taken before the call).
fn through_history(edges: &[aotgrad::trace::autograd::Edge], grads: &[Option<Tensor>], l: &Tensor) -> Vec<f64> {
    let roots: Vec<_> = edges.iter().cloned().zip(grads).filter_map(|(e, g)| Some((e, g.clone()?))).collect();
    backward_from_edges(&roots, false).expect("backward through the arguments' history");
    l.grad().expect("a gradient").to_vec_f64().unwrap()
}

#[test]
fn an_expanded_argument_passes_each_storage_element_its_gradient_once() {
    // PyTorch: `L = [1, 2, 3]`, `a = L.expand(2, 3)`, `f(a) = a.t()`, output gradient
    // `[[1, 2], [3, 4], [5, 6]]`: `L.grad = [3, 7, 11]`.
    let f = aot_function_args(|a: &[Arg]| Ok(vec![tensor(&a[0])?.t()?]), AotConfig::default().no_cache()).unwrap();
    let l = leaf(&[1.0, 2.0, 3.0], &[3]);
    let a = l.expand(&[2, 3]).unwrap();
    let edges = vec![a.grad_edge().unwrap()];
    let (_, pending) = f.forward_args(&[a.into()]).unwrap();
    let g = pending.backward(&[vals(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])]).unwrap();
    assert_eq!(through_history(&edges, &g, &l), vec![3.0, 7.0, 11.0]);

    // `L = [.1, .2, .3, .4, .5, .6]`, `a = L.expand(4, 6)`,
    // `f(a) = a.as_strided([2, 3], [3, 1], 0).sin()`, output gradient `[[1, 2, 3], [4,
    // 5, 6]]`: values `sin(L)`, `L.grad = [0.995, 1.9601, 2.866, 3.6842, 4.3879,
    // 4.952]`; eager autograd (which refused an `as_strided` of an input repeating
    // elements) and compiled alike.
    let prog: Prog = |a| Ok(vec![tensor(&a[0])?.as_strided(&[2, 3], &[3, 1], 0)?.sin()?]);
    let want = [0.995, 1.9601, 2.866, 3.6842, 4.3879, 4.952];
    let w = || vals(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let l = leaf(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[6]);
    let o = prog(&[l.expand(&[4, 6]).unwrap().into()]).unwrap();
    close(&o[0].to_vec_f64().unwrap(), &[0.0998, 0.1987, 0.2955, 0.3894, 0.4794, 0.5646]);
    aotgrad::Backward::backward(&o[0].mul(&w()).unwrap().sum_all().unwrap()).unwrap();
    close(&l.grad().unwrap().to_vec_f64().unwrap(), &want);
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let l = leaf(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[6]);
    let a = l.expand(&[4, 6]).unwrap();
    let edges = vec![a.grad_edge().unwrap()];
    let (_, pending) = f.forward_args(&[a.into()]).unwrap();
    close(&through_history(&edges, &pending.backward(&[w()]).unwrap(), &l), &want);

    // An argument aliasing it changed in place: `b = L * 1`, `a = b.expand(2, 3)`,
    // `f(a, b) = (b.mul_(2); a.sin())` (output gradient `[[1, 2, 3], [4, 5, 6]]`):
    // `L.grad = [-4.1615, -9.151, 17.2831]`; returning `a.t()` instead (gradient
    // `[[1, 2], [3, 4], [5, 6]]`): `[6, 14, 22]`.
    let cases: [(Prog, &[usize], [f64; 3]); 2] = [
        (
            |a| {
                tensor(&a[1])?.mul_(2.0)?;
                Ok(vec![tensor(&a[0])?.sin()?])
            },
            &[2, 3],
            [-4.1615, -9.151, 17.2831],
        ),
        (
            |a| {
                tensor(&a[1])?.mul_(2.0)?;
                Ok(vec![tensor(&a[0])?.t()?])
            },
            &[3, 2],
            [6.0, 14.0, 22.0],
        ),
    ];
    for (prog, shape, want) in cases {
        let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
        let l = leaf(&[1.0, 2.0, 3.0], &[3]);
        let b = l.mul(1.0).unwrap();
        let a = b.expand(&[2, 3]).unwrap();
        let edges = vec![a.grad_edge().unwrap(), b.grad_edge().unwrap()];
        let (_, pending) = f.forward_args(&[a.into(), b.into()]).unwrap();
        let g = pending.backward(&[vals(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], shape)]).unwrap();
        close(&through_history(&edges, &g, &l), &want);
    }
}

const STALE_MULTI_OUTPUT: &str = "Output 0 of Split is a view and its base or another view of its base has been \
                                  modified inplace. This view is the output of a function that returns multiple views.";

#[test]
fn outputs_of_split_and_unbind_returned_from_a_compiled_function_keep_pytorchs_rules() {
    // PyTorch: `f(a) = (a * 2).unbind(0)`: `add_` on an output raises "Output 0 of
    // Unbind is a view and is being modified inplace...".
    let f = aot_function_args(|a: &[Arg]| Ok(tensor(&a[0])?.mul(2.0)?.unbind(0)?), AotConfig::default().no_cache())
        .unwrap();
    let (outs, _) = f.forward_args(&[leaf(&[1.0; 6], &[2, 3]).into()]).unwrap();
    let e = outs[0].add_(1.0).expect_err("in-place on an unbind output").to_string();
    assert!(e.contains("Output 0 of Unbind is a view and is being modified inplace."), "{e}");

    // `f(x) = x.split(1)` of a non-leaf `x`; then `x.add_(1)`: using output 0 in grad
    // mode raises "Output 0 of Split is a view and its base or another view of its
    // base has been modified inplace...", and so does using it after a `detach`ed
    // alias of `x` was changed. Eager (which let both through) and compiled alike.
    let prog: Prog = |a| Ok(tensor(&a[0])?.split(1, 0)?);
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    for world in ["eager", "compiled"] {
        for through_detach in [false, true] {
            let x = leaf(&[1.0; 6], &[2, 3]).mul(1.0).unwrap();
            let outs = if world == "eager" {
                prog(&[x.clone().into()]).unwrap()
            } else {
                f.forward_args(&[x.clone().into()]).unwrap().0
            };
            outs[0].mul(2.0).expect("usable before its base changes");
            if through_detach {
                x.detach().unwrap().add_(1.0).unwrap();
            } else {
                x.add_(1.0).unwrap();
            }
            let e = outs[0].mul(2.0).expect_err("stale multi-output view").to_string();
            assert!(e.contains(STALE_MULTI_OUTPUT), "{world}: {e}");
            // Under no_grad it may still be read.
            no_grad(|| outs[0].mul(2.0)).expect("read under no_grad");
        }
    }
}

#[test]
fn a_no_grad_view_used_after_its_base_changed_is_refused() {
    // PyTorch: `y = a * 2`; under no_grad `v = y.view(-1)`; `y.add_(1)`; `v.mul(2)`
    // raises "A view was created in no_grad mode and its base or another view of its
    // base has been modified inplace with grad mode enabled...".
    let msg = both_reject(
        |a: &[Arg]| {
            let y = tensor(&a[0])?.mul(2.0)?;
            let v = no_grad(|| y.view(&[-1]))?;
            y.add_(1.0)?;
            Ok(vec![v.mul(2.0)?])
        },
        &|| vec![leaf(&[1.0; 6], &[2, 3]).into()],
    );
    assert!(
        msg.contains(
            "A view was created in no_grad mode and its base or another view of its base has been modified inplace \
             with grad mode enabled."
        ),
        "{msg}"
    );
}

#[test]
fn a_view_made_to_require_grad_is_a_leaf() {
    // PyTorch: `f(d) = d.view(-1).requires_grad_()` of a `d` without grad: the result
    // is a leaf requiring grad (`is_leaf` True).
    let prog: Prog = |a| {
        let v = tensor(&a[0])?.view(&[-1])?;
        v.requires_grad_(true)?;
        Ok(vec![v])
    };
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    // Alone (the inference path), and beside an argument requiring grad (training).
    let d = vals(&[1.0; 6], &[2, 3]);
    let outs = f.call_args(&[d.clone().into()]).unwrap();
    assert_eq!((outs[0].is_requires_grad(), outs[0].is_leaf()), (true, true));
    assert!(!d.is_requires_grad());
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let d = vals(&[1.0; 6], &[2, 3]);
    let (outs, _) = f.forward_args(&[d.clone().into(), leaf(&[1.0], &[1]).into()]).unwrap();
    assert_eq!((outs[0].is_requires_grad(), outs[0].is_leaf()), (true, true));
    assert!(!d.is_requires_grad());
}

#[test]
fn a_metadata_change_under_no_grad_passes_the_gradient_element_by_element() {
    // PyTorch: `a = [[1, 2], [3, 4]]`, `v = a.clone()`, under no_grad `v.transpose_(0,
    // 1)`; `(v * [[10, 20], [30, 40]]).sum().backward()`: `a.grad = [[10, 20], [30,
    // 40]]` (autograd's history of `v` keeps its old layout).
    let prog: Prog = |a| {
        let v = tensor(&a[0])?.clone_tensor()?;
        no_grad(|| v.transpose_(0, 1))?;
        Ok(vec![v])
    };
    let g = || vals(&[10.0, 20.0, 30.0, 40.0], &[2, 2]);
    let a = leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let o = prog(&[a.clone().into()]).unwrap();
    aotgrad::Backward::backward(&o[0].mul(&g()).unwrap().sum_all().unwrap()).unwrap();
    assert_eq!(a.grad().unwrap().to_vec_f64().unwrap(), vec![10.0, 20.0, 30.0, 40.0]);
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let (o, pending) = f.forward_args(&[leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).into()]).unwrap();
    assert_eq!(o[0].to_vec_f64().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    let got = pending.backward(&[g()]).unwrap()[0].clone().unwrap().to_vec_f64().unwrap();
    assert_eq!(got, vec![10.0, 20.0, 30.0, 40.0]);
}

#[test]
fn metadata_mutations_of_two_aliasing_arguments_count_in_their_shared_version() {
    // PyTorch: `base = zeros(6)`, `x = base.view(2, 3)`, `y = base.view(3, 2)`;
    // `x.t_(); y.t_()` moves the version they share by 2.
    let prog: Prog = |a| {
        tensor(&a[0])?.t_()?;
        tensor(&a[1])?.t_()?;
        Ok(vec![tensor(&a[0])?.mul(2.0)?])
    };
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let base = leaf(&[1.0; 6], &[6]).mul(1.0).unwrap();
    let (x, y) = (base.view(&[2, 3]).unwrap(), base.view(&[3, 2]).unwrap());
    let v0 = x.version().unwrap();
    f.forward_args(&[x.clone().into(), y.clone().into()]).unwrap();
    assert_eq!((x.version().unwrap() - v0, y.version().unwrap() - v0), (2, 2));
    assert_eq!((x.sizes().unwrap(), y.sizes().unwrap()), (vec![3, 2], vec![2, 3]));
}

#[test]
fn a_clone_of_a_slice_returned_beside_its_base_has_a_storage_of_its_own() {
    // PyTorch: `y = a * 1.5` (under no_grad), `(y[0:1].clone(), y)`: the clone's
    // storage holds its one element (the simplifier once returned the slice itself,
    // a view of `y`'s 24).
    let prog: Prog = |a| {
        let y = no_grad(|| tensor(&a[0])?.mul(1.5))?;
        let c = y.narrow(0, 0, 1)?.clone_tensor()?;
        let s = y.sin()?;
        Ok(vec![c, y, s])
    };
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let (outs, _) = f.forward_args(&[leaf(&[1.0; 24], &[24]).into()]).unwrap();
    assert_eq!(outs[0].to_cpu().unwrap().storage.len(), 1);
    assert!(!outs[0].shares_storage_with(&outs[1]));
}

#[test]
fn a_detached_alias_returned_is_no_view_of_the_argument() {
    // PyTorch: `f(a) = a.detach()` of a leaf `a`; `out.mul_(w)` with `w` requiring grad
    // makes `out` a non-leaf requiring grad and leaves `a` a leaf.
    let prog: Prog = |a| Ok(vec![tensor(&a[0])?.detach()?]);
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let a = leaf(&[1.0; 6], &[2, 3]);
    let (outs, _) = f.forward_args(&[a.clone().into()]).unwrap();
    outs[0].mul_(&leaf(&[2.0], &[])).unwrap();
    assert_eq!((outs[0].is_requires_grad(), outs[0].is_leaf()), (true, false));
    assert_eq!((a.is_requires_grad(), a.is_leaf()), (true, true));
    assert_eq!(a.to_vec_f64().unwrap(), vec![2.0; 6]);
}

#[test]
fn a_result_relu_saved_changed_in_place_fails_the_backward_eager_and_compiled() {
    // PyTorch: `y = a.relu(); s = y.sum(); y.add_(1); s.backward()` raises "one of the
    // variables needed for gradient computation has been modified by an inplace
    // operation: [torch.DoubleTensor [2, 3]], which is output 0 of Relu, is at version
    // 1; expected version 0 instead" (relu's derivative reads its result).
    let prog: Prog = |a| {
        let y = tensor(&a[0])?.relu()?;
        let s = y.sum_all()?;
        y.add_(1.0)?;
        Ok(vec![s])
    };
    let a = || leaf(&[1.0, -2.0, 3.0, -4.0, 5.0, 6.0], &[2, 3]);
    let o = prog(&[a().into()]).unwrap();
    let e = aotgrad::Backward::backward(&o[0]).unwrap_err().to_string();
    assert!(e.contains("which is output 0 of Relu, is at version 1; expected version 0 instead"), "{e}");
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let (_, pending) = f.forward_args(&[a().into()]).unwrap();
    let e = pending.backward(&[vals(&[1.0], &[])]).unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation") && e.contains("is at version 1; expected version 0"), "{e}");
}

#[test]
fn a_gradient_of_a_shape_a_no_grad_transpose_changed_is_invalid_eager_and_compiled() {
    // PyTorch: `y = (x * 0.1).exp()` (`x` of shape [4, 6]); under no_grad
    // `y.transpose_(0, 1)`; `(y * ones(6, 4)).sum().backward()` raises "Function
    // MulBackward0 returned an invalid gradient at index 0 - got [6, 4] but expected
    // shape compatible with [4, 6]" (eager once failed adding the gradients up).
    let prog: Prog = |a| {
        let y = tensor(&a[0])?.mul(0.1)?.exp()?;
        let _other_use = y.slice(0, Some(0), None, 2)?;
        no_grad(|| y.transpose_(0, 1))?;
        Ok(vec![y])
    };
    let x = || leaf(&[0.5; 24], &[4, 6]);
    let o = prog(&[x().into()]).unwrap();
    let loss = o[0].mul(&vals(&[1.0; 24], &[6, 4])).unwrap().sum_all().unwrap();
    let e = aotgrad::Backward::backward(&loss).unwrap_err().to_string();
    assert!(
        e.contains(
            "Function MulBackward0 returned an invalid gradient at index 0 - got [6, 4] but expected shape \
             compatible with [4, 6]"
        ),
        "{e}"
    );
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let (_, pending) = f.forward_args(&[x().into()]).unwrap();
    let e = pending.backward(&[vals(&[1.0; 24], &[6, 4])]).unwrap_err().to_string();
    assert!(e.contains("invalid gradient: got [6, 4] but expected shape compatible with [4, 6]"), "{e}");
}

#[test]
fn an_as_strided_reaching_outside_its_input_view_leaves_those_elements_out() {
    // PyTorch: `L = arange(24) / 10` (requires grad), `b = L * 1`, `a = b[6:12]`,
    // `f(a) = a.as_strided([2, 3], [6, 1], 0).sin()` (storage elements 0..3 and 6..9,
    // the first three outside `a`), output gradient `[[1, 2, 3], [4, 5, 6]]`: values
    // `[0, .0998, .1987, .5646, .6442, .7174]`, and `L.grad` is `[3.3013, 3.8242,
    // 4.1802]` at 6..9, zero elsewhere (elements outside `a` get nothing).
    let prog: Prog = |a| Ok(vec![tensor(&a[0])?.as_strided(&[2, 3], &[6, 1], 0)?.sin()?]);
    let f = aot_function_args(prog, AotConfig::default().no_cache()).unwrap();
    let mut want = vec![0.0; 24];
    want[6..9].copy_from_slice(&[3.3013, 3.8242, 4.1802]);
    for world in ["eager", "compiled"] {
        let l = leaf(&(0..24).map(|i| f64::from(i) / 10.0).collect::<Vec<_>>(), &[24]);
        let a = l.mul(1.0).unwrap().narrow(0, 6, 6).unwrap();
        let w = vals(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let out = if world == "eager" {
            let o = prog(&[a.into()]).unwrap();
            aotgrad::Backward::backward(&o[0].mul(&w).unwrap().sum_all().unwrap()).unwrap();
            o[0].to_vec_f64().unwrap()
        } else {
            let edges = vec![a.grad_edge().unwrap()];
            let (o, pending) = f.forward_args(&[a.into()]).unwrap();
            through_history(&edges, &pending.backward(&[w]).unwrap(), &l);
            o[0].to_vec_f64().unwrap()
        };
        close(&out, &[0.0, 0.0998, 0.1987, 0.5646, 0.6442, 0.7174]);
        close(&l.grad().unwrap().to_vec_f64().unwrap(), &want);
    }
}

/// The whole training contract (values, flags, storage, versions, aliasing, which
/// outputs autograd can use, in-place ops on the outputs with and without an operand
/// requiring grad, gradients against eager autograd, the cache round trip).
fn contract(prog: Prog, inputs: &dyn Fn() -> Vec<Arg>) {
    crate::checker::check_with(prog, inputs, AotConfig::default(), crate::checker::Grads::EagerAutograd);
}

#[test]
fn outputs_made_from_detached_aliases_keep_eagers_bases() {
    // A `detach`ed alias returned beside a view of it: writing the alias with a value
    // requiring grad makes the view require grad (its base is the alias), and leaves
    // the argument alone.
    contract(
        |a| {
            let d = tensor(&a[0])?.detach()?;
            let v = d.t()?;
            Ok(vec![d, v, tensor(&a[0])?.mul(2.0)?])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).into()],
    );
    // Two views of one `detach`ed alias of the argument: one base for both.
    contract(
        |a| {
            let d = tensor(&a[0])?.detach()?;
            Ok(vec![d.select(0, 0)?, d.select(0, 1)?, tensor(&a[0])?.sin()?])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).into()],
    );
    // A view of a `detach`ed alias made to require grad: a view of a leaf requiring
    // grad, which refuses in-place ops.
    contract(
        |a| {
            let d = tensor(&a[0])?.detach()?;
            d.requires_grad_(true)?;
            Ok(vec![tensor(&a[0])?.mul(2.0)?, d.narrow(0, 0, 1)?])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).into()],
    );
    // Outputs of `chunk` returned after their base changed: stale, refused in grad
    // mode after the call as eagerly.
    contract(
        |a| {
            let y = tensor(&a[0])?.mul(2.0)?;
            let parts = y.chunk(2, 0)?;
            y.add_(1.0)?;
            Ok(vec![parts[0].clone(), y])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).into()],
    );
}

#[test]
fn a_view_of_a_clone_of_a_row_views_the_clones_storage() {
    // PyTorch: `m = a[:, None] @ a[None, :]`, `c = m[1].clone()`, `f(a) = c.split(2)[0]`:
    // `[a1 * a0, a1 * a1]`, a view of `c`'s 6 elements (the simplifier once dropped the
    // clone, so the output viewed `m`'s 36).
    contract(
        |a| {
            let x = tensor(&a[0])?;
            let m = x.unsqueeze(1)?.matmul(&x.unsqueeze(0)?)?;
            let c = m.select(0, 1)?.clone_tensor()?;
            Ok(vec![c.split(2, 0)?[0].clone(), m.clone_tensor()?])
        },
        &|| vec![leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[6]).into()],
    );
    let f = aot_function_args(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            let m = x.unsqueeze(1)?.matmul(&x.unsqueeze(0)?)?;
            Ok(vec![m.select(0, 1)?.clone_tensor()?.split(2, 0)?[0].clone()])
        },
        AotConfig::default().no_cache(),
    )
    .unwrap();
    let (outs, _) = f.forward_args(&[leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[6]).into()]).unwrap();
    assert_eq!(outs[0].to_vec_f64().unwrap(), vec![2.0, 4.0]);
    assert_eq!(outs[0].to_cpu().unwrap().storage.len(), 6);
}

//! Misusing the training path gives clear errors: a second backward, the wrong number
//! or shape of gradients, a gradient for an argument the call did not change, an
//! argument or output the backward needs modified in place before it runs, `forward`
//! with nothing requiring grad, and an in-place op on a leaf (or a view of one) that
//! requires grad after the program was compiled for a non-leaf.

use crate::checker::{data, leaf, nonleaf, tensor, without_lines};
use aotgrad::runtime::{Partitioner, PendingBackward};
use aotgrad::trace::{no_grad, Tensor};
use aotgrad::{aot_function_args, AotConfig, AotFunction, Arg};
use expect_test::expect;

fn compiled() -> AotFunction {
    aot_function_args(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            y.add_(1)?;
            Ok(vec![x.mul(y)?, x.sum_all()?])
        },
        AotConfig::default(),
    )
    .expect("compile")
}

fn forward(c: &AotFunction) -> (Vec<Tensor>, PendingBackward, Vec<Arg>) {
    let args: Vec<Arg> = vec![leaf(&[2, 3], 1).into(), nonleaf(&[3], 2).into()];
    let (outs, pending) = c.forward_args(&args).expect("forward");
    (outs, pending, args)
}

fn ones(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, crate::checker::float_dtype()).expect("ones")
}

fn error(r: aotgrad::Result<Vec<Option<Tensor>>>) -> String {
    r.err().map(|e| e.to_string()).expect("an error")
}

#[test]
fn backward_twice_is_an_error() {
    let c = compiled();
    let (outs, pending, _) = forward(&c);
    let grads: Vec<Tensor> = outs.iter().map(|o| o.ones_like().expect("ones")).collect();
    pending.backward(&grads).expect("first backward");
    expect!["compiled function `aot_fn`: backward was already run for this forward call (saved values are freed)"]
        .assert_eq(&error(pending.backward(&grads)));
}

#[test]
fn wrong_number_of_gradients() {
    let c = compiled();
    let (_, pending, _) = forward(&c);
    expect!["compiled function `aot_fn`: backward expects 2 output gradient(s), one per output, got 1"]
        .assert_eq(&error(pending.backward(&[ones(&[2, 3])])));
}

#[test]
fn wrong_gradient_shape() {
    let c = compiled();
    let (_, pending, _) = forward(&c);
    expect!["compiled function `aot_fn`: backward: gradient 0 has shape [3, 2], but output 0 has shape [2, 3]"]
        .assert_eq(&error(pending.backward(&[ones(&[3, 2]), ones(&[])])));
    // A failed check leaves the backward available.
    pending.backward(&[ones(&[2, 3]), ones(&[])]).expect("a retry with the right shapes");
}

#[test]
fn wrong_shape_for_an_updated_input() {
    let c = compiled();
    let (_, pending, _) = forward(&c);
    expect!["compiled function `aot_fn`: backward: the gradient for argument 1's new value has shape [2], but the argument has shape [3] after the call"].assert_eq(&error(pending.backward_with(&[None, None], &[(1, ones(&[2]))])));
}

#[test]
fn gradient_for_an_unchanged_argument() {
    let c = compiled();
    let (_, pending, _) = forward(&c);
    expect!["compiled function `aot_fn`: backward: argument 0 was not changed by the call, so its new value has no gradient"].assert_eq(&error(pending.backward_with(&[None, None], &[(0, ones(&[2, 3]))])));
}

/// `y` is saved for the backward (`d(x * y)/dx = y`); writing it in between is caught.
#[test]
fn saved_argument_modified_before_backward() {
    let c = aot_function_args(|a: &[Arg]| Ok(vec![tensor(&a[0])?.mul(tensor(&a[1])?)?]), AotConfig::default())
        .expect("compile");
    let (x, y) = (leaf(&[2, 3], 1), data(&[3], 2));
    let (_, pending) = c.forward(&[x, y.clone()]).expect("forward");
    no_grad(|| y.mul_(2)).expect("mutate");
    crate::checker::golden(expect!["compiled function `aot_fn`: backward: one of the values saved for it (f64[3]) has been modified by an inplace operation after the forward (an argument or an output sharing its storage was written)"], &error(pending.backward(&[ones(&[2, 3])])));
}

#[test]
fn forward_without_grad_inputs() {
    let c = compiled();
    let err = c.forward_args(&[data(&[2, 3], 1).into(), data(&[3], 2).into()]).err().map(|e| e.to_string());
    expect!["compiled function `aot_fn`: forward needs grad mode on and at least one argument that requires grad; use `call`"].assert_eq(&err.expect("an error"));
}

/// `exp` saves its output (default partition: every value the backward needs is
/// saved); the caller writing that output in place before the backward is caught, as
/// PyTorch catches it. (Only saved values sharing an argument's storage used to be
/// checked: the backward silently used the doubled output.)
#[test]
fn saved_output_modified_before_backward() {
    let config = AotConfig { partitioner: Partitioner::Default, ..AotConfig::default() };
    let c = aot_function_args(|a: &[Arg]| Ok(vec![tensor(&a[0])?.exp()?]), config).expect("compile");
    let (outs, pending) = c.forward(&[leaf(&[3], 1)]).expect("forward");
    let (_, _, report) = c.training_graphs().pop().expect("a training entry");
    assert!(report.to_string().contains("(exp)"), "the output is saved:\n{report}");
    outs[0].mul_(2).expect("an in-place op on a non-leaf output is allowed");
    crate::checker::golden(expect!["compiled function `aot_fn`: backward: one of the values saved for it (f64[3]) has been modified by an inplace operation after the forward (an argument or an output sharing its storage was written)"], &error(pending.backward(&[ones(&[3])])));
}

/// The same program compiled for a non-leaf `x` (`x.mul_(2)` is fine), then called with
/// a leaf that requires grad of the same metadata: eager refuses the in-place op, and
/// so must the compiled function (leafness is part of the cache key; the entry used to
/// be reused, writing the leaf).
#[test]
fn in_place_on_a_leaf_after_compiling_for_a_non_leaf() {
    let f = |a: &[Arg]| {
        let x = tensor(&a[0])?;
        x.mul_(2)?;
        Ok(vec![x.sum_all()?])
    };
    let c = aot_function_args(f, AotConfig::default()).expect("compile");
    c.forward_args(&[nonleaf(&[3], 1).into()]).expect("a non-leaf may be written");
    let x = leaf(&[3], 1);
    let before = x.to_vec_f64().expect("data");
    let eager = f(&[x.clone().into()]).err().map(|e| without_lines(&e.to_string())).expect("eager refuses");
    let err = c.forward_args(&[x.clone().into()]).err().map(|e| without_lines(&e.to_string()));
    assert_eq!(err.as_deref(), Some(eager.as_str()));
    expect!["crates/aotgrad/tests/training/errors.rs:<line>:<col>: mul_: a leaf Variable that requires grad is being used in an in-place operation."].assert_eq(&eager);
    assert_eq!(x.to_vec_f64().expect("data"), before, "the leaf is untouched");
    assert_eq!(c.num_compiled(), 1, "the failed trace adds no entry");
}

/// The same with views: compiled for a view of a non-leaf, then called with a view (of
/// the same metadata) of a leaf that requires grad, which eager refuses to write (the
/// view's base is part of the cache key).
#[test]
fn in_place_on_a_view_of_a_leaf_after_compiling_for_a_view_of_a_non_leaf() {
    let f = |a: &[Arg]| {
        let x = tensor(&a[0])?;
        x.add_(1)?;
        Ok(vec![x.sum_all()?])
    };
    let c = aot_function_args(f, AotConfig::default()).expect("compile");
    let view = |t: Tensor| -> Arg { t.view(&[2, 3]).expect("view").into() };
    c.forward_args(&[view(nonleaf(&[6], 1))]).expect("a view of a non-leaf may be written");
    let base = leaf(&[6], 1);
    let before = base.to_vec_f64().expect("data");
    let eager = f(&[view(base.clone())]).err().map(|e| without_lines(&e.to_string())).expect("eager refuses");
    let err = c.forward_args(&[view(base.clone())]).err().map(|e| without_lines(&e.to_string()));
    assert_eq!(err.as_deref(), Some(eager.as_str()));
    expect!["crates/aotgrad/tests/training/errors.rs:<line>:<col>: add_: a view of a leaf Variable that requires grad is being used in an in-place operation."].assert_eq(&eager);
    assert_eq!(base.to_vec_f64().expect("data"), before, "the leaf is untouched");
}

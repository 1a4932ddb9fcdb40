//! Misusing the training path gives clear errors: a second backward, the wrong number
//! or shape of gradients, a gradient for an argument the call did not change, an
//! argument the backward needs modified in place before it runs, and `forward` with
//! nothing requiring grad.

use crate::checker::{data, leaf, nonleaf, tensor};
use aotgrad::runtime::PendingBackward;
use aotgrad::trace::{no_grad, DType, Tensor};
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
    Tensor::ones(shape, DType::F64).expect("ones")
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
    expect!["compiled function `aot_fn`: backward: a value saved for it (f64[3]) was modified by an in-place operation after the forward (an argument's storage was written)"].assert_eq(&error(pending.backward(&[ones(&[2, 3])])));
}

#[test]
fn forward_without_grad_inputs() {
    let c = compiled();
    let err = c.forward_args(&[data(&[2, 3], 1).into(), data(&[3], 2).into()]).err().map(|e| e.to_string());
    expect!["compiled function `aot_fn`: forward needs grad mode on and at least one argument that requires grad; use `call`"].assert_eq(&err.expect("an error"));
}

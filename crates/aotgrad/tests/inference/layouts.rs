//! The layout of fresh elementwise results follows PyTorch's `TensorIterator`: a
//! result takes its operands' memory order (the first operand whose strides differ
//! decides, broadcast operands take no part, a scalar is a 0-d operand), `to` and
//! `zeros_like` keep a dense layout, and `contiguous` does not. Every expectation
//! below was checked in PyTorch 2.15 eager; each runs eagerly and compiled (where the
//! contract checker also compares strides of every output with eager's).

use crate::contract::{check, seq, tensor};
use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function_args, AotConfig, Arg};

fn strides(t: &Tensor) -> Vec<i64> {
    t.meta().strides.iter().map(|d| d.as_const().expect("concrete")).collect()
}

/// `f`'s outputs' strides, eagerly; and the compiled function satisfies the whole
/// contract (values, strides, offsets, aliasing) on the same inputs.
fn layouts(f: fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>, inputs: fn() -> Vec<Arg>) -> Vec<Vec<i64>> {
    let eager: Vec<Vec<i64>> = f(&inputs()).expect("eager").iter().map(strides).collect();
    check(f, inputs, AotConfig::default());
    let c = aot_function_args(f, AotConfig::default()).expect("compile");
    let compiled: Vec<Vec<i64>> = c.call_args(&inputs()).expect("call").iter().map(strides).collect();
    assert_eq!(compiled, eager, "compiled strides differ from eager's");
    eager
}

fn x23() -> Vec<Arg> {
    vec![seq(&[2, 3], 0.0).into()]
}

#[test]
fn unary_and_scalar_results_keep_a_transposed_layout() {
    let got = layouts(
        |a| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?.mul(2)?, x.t()?.exp()?, x.t()?.gt(2)?, x.t()?.clamp(Some(1.0), Some(4.0))?])
        },
        x23,
    );
    assert_eq!(got, vec![vec![1, 3]; 4]);
}

#[test]
fn metadata_mutation_then_pointwise() {
    // `a.t_(); a.mul(3)`: strides [1, 3].
    let got = layouts(
        |a| {
            let x = tensor(&a[0])?;
            x.t_()?;
            Ok(vec![x.mul(3)?])
        },
        x23,
    );
    assert_eq!(got, vec![vec![1, 3]]);
    // `[1, 2, 4]` a, `a.transpose_(1, 0)`, `(a * 2).transpose(1, 0)`: [8, 4, 1].
    let got = layouts(
        |a| {
            let x = tensor(&a[0])?;
            x.transpose_(1, 0)?;
            Ok(vec![x.mul(2)?.transpose(1, 0)?])
        },
        || vec![seq(&[1, 2, 4], 0.0).into()],
    );
    assert_eq!(got, vec![vec![8, 4, 1]]);
}

#[test]
fn binary_results_follow_the_first_deciding_operand() {
    let got = layouts(
        |a| {
            let (x, c) = (tensor(&a[0])?, tensor(&a[1])?);
            let xt = x.t()?;
            Ok(vec![
                xt.add(c)?,                             // [1, 3]
                c.add(&xt)?,                            // [2, 1]
                xt.add(&c.select(0, 0)?)?,              // broadcast [2]: [1, 3]
                Tensor::where_(&xt.gt(2)?, &xt, c)?,    // the condition decides: [1, 3]
                Tensor::where_(&c.gt(100)?, &xt, &xt)?, // a contiguous condition: [2, 1]
            ])
        },
        || vec![seq(&[2, 3], 0.0).into(), seq(&[3, 2], 10.0).into()],
    );
    assert_eq!(got, vec![vec![1, 3], vec![2, 1], vec![1, 3], vec![1, 3], vec![2, 1]]);
}

#[test]
fn non_dense_operands_give_dense_results_in_their_order() {
    // `z[:, ::2].t()` of a [4, 6] z has strides [2, 6]: `+ 1` gives [1, 3].
    let got = layouts(
        |a| {
            let z = tensor(&a[0])?;
            let v = z.slice(1, Some(0), None, 2)?.t()?;
            Ok(vec![v.add(1.0)?, v.sin()?, z.slice(1, Some(0), None, 2)?.sin()?])
        },
        || vec![seq(&[4, 6], 0.0).into()],
    );
    assert_eq!(got, vec![vec![1, 3], vec![1, 3], vec![3, 1]]);
}

#[test]
fn like_ops_keep_the_layout_and_contiguous_does_not() {
    if crate::contract::skip_f64_on_wgpu("like_ops_keep_the_layout_and_contiguous_does_not") {
        return;
    }
    let got = layouts(
        |a| {
            let xt = tensor(&a[0])?.t()?;
            Ok(vec![xt.to(DType::F64)?, xt.zeros_like()?, xt.contiguous()?])
        },
        x23,
    );
    assert_eq!(got, vec![vec![1, 3], vec![1, 3], vec![2, 1]]);
}

#[test]
fn a_transposed_result_changes_what_as_strided_reads() {
    if crate::contract::skip_f64_on_wgpu("a_transposed_result_changes_what_as_strided_reads") {
        return;
    }
    // PyTorch: `(a.t() * 2).as_strided([2], [3], 1)` is [0.4, 1.0] for
    // a = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]] (the product has strides [1, 3]).
    let f = |a: &[Arg]| Ok(vec![tensor(&a[0])?.t()?.mul(2)?.as_strided(&[2], &[3], 1)?]);
    let a = || vec![Tensor::from_f64(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3], DType::F64).expect("a").into()];
    let want = [0.4, 1.0];
    for v in [
        f(&a()).expect("eager"),
        aot_function_args(f, AotConfig::default()).expect("compile").call_args(&a()).expect("call"),
    ] {
        let got = v[0].to_vec_f64().expect("values");
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12), "{got:?}");
    }
    check(f, a, AotConfig::default());
    // Its gradient lands where those elements came from: PyTorch gives
    // [[0, 2, 0], [0, 20, 0]] for the weights [1, 10].
    let x = Tensor::from_f64(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3], DType::F64)
        .expect("a")
        .requires_grad(true)
        .expect("leaf");
    let c = aot_function_args(f, AotConfig::default()).expect("compile");
    let (_, pending) = c.forward_args(&[x.into()]).expect("forward");
    let g = pending.backward(&[Tensor::from_f64(&[1.0, 10.0], &[2], DType::F64).expect("g")]).expect("backward");
    assert_eq!(g[0].as_ref().expect("grad").to_vec_f64().expect("values"), [0.0, 2.0, 0.0, 0.0, 20.0, 0.0]);
}

#[test]
fn a_transposed_result_cannot_be_viewed_flat() {
    // PyTorch: `x.t().mul(2).view(-1)` fails ("view size is not compatible with input
    // tensor's size and stride"); `reshape` copies.
    let e = (|| tensor(&x23()[0])?.t()?.mul(2)?.view(&[-1]))().expect_err("view of a transposed result");
    assert!(e.to_string().contains("not compatible with the input's size and stride"), "{e}");
    let r = tensor(&x23()[0]).unwrap().t().unwrap().mul(2).unwrap().reshape(&[-1]).unwrap();
    assert_eq!(r.to_vec_f64().unwrap(), [0.0, 6.0, 2.0, 8.0, 4.0, 10.0]);
}

#[test]
fn clone_preserves_a_dense_layout() {
    // PyTorch: `x.t().clone()` has strides [1, 3]; `z[:, ::2].t().clone()` [1, 3];
    // a [4, 1] `k.t()` of strides [1, 4] keeps them exactly.
    let got = layouts(
        |a| {
            let (x, z, k) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
            Ok(vec![x.t()?.clone_tensor()?, z.slice(1, Some(0), None, 2)?.t()?.clone_tensor()?, k.t()?.clone_tensor()?])
        },
        || vec![seq(&[2, 3], 0.0).into(), seq(&[4, 6], 0.0).into(), seq(&[1, 4], 0.0).into()],
    );
    assert_eq!(got, vec![vec![1, 3], vec![1, 3], vec![1, 4]]);
}

//! Edge cases found while testing the pass: as_strided reads after a mutation
//! through a permuting view, layouts of mutated intermediates, as_strided views
//! reaching past an input's own elements, writes through a non-repeating expand.

use crate::contract::{check, seq, tensor};
use aotgrad::prelude::{DType, Tensor};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

/// After a write through `x.t()`, an `as_strided` read of `x`'s storage must see
/// the storage order, not the transposed order of the scattered value.
#[test]
fn as_strided_read_after_write_through_transpose() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.t()?.select(0, 1)?.mul_(10)?;
            Ok(vec![x.as_strided(&[4], &[1], 0)?.mul(1)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[2] strides=[3] offset=1 #0 = select(%1, dim=0, index=1)
          %3: f32[2] #1 = mul(%2, 10)
          %4: f32[3, 2] strides=[1, 3] #2 = select_scatter(%1, %3, dim=0, index=1)
          %5: f32[2, 3] #2 = t(%4)
          %6: f32[4] #2 = as_strided(%5, size=[4], stride=[1], offset=0)
          %7: f32[4] #3 = mul(%6, 1)
          return (%5, %7)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[4]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// An intermediate mutated through a transposed view keeps its row-major layout.
#[test]
fn intermediate_mutated_through_transpose_returned() {
    let c = check(
        |a: &[Arg]| {
            let b = tensor(&a[0])?.add(1)?;
            b.t()?.mul_(2)?;
            Ok(vec![b.clone(), b.select(0, 1)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = add(%0, 1)
          %2: f32[3, 2] strides=[1, 3] #1 = t(%1)
          %3: f32[3, 2] strides=[1, 3] #2 = mul(%2, 2)
          %4: f32[2, 3] #2 = t(%3)
          %5: f32[3] offset=3 #2 = select(%4, dim=0, index=1)
          return (%4, %5)
        }
        input 0: -
        output 0: non_alias f32[2, 3]
        output 1: alias_of_output 0 f32[3] offset=3
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// `as_strided` of a contiguous input reaching storage elements outside the input.
#[test]
fn as_strided_beyond_the_input_after_mutation() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.as_strided(&[4], &[1], 0)?.mul(1)?, x.as_strided(&[2], &[2], 3)?])
        },
        || vec![seq(&[8], 0.0).narrow(0, 2, 3).expect("narrow").into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[6] #0 "base0") {
          %1: f32[3] offset=2 #0 = as_strided(%0, size=[3], stride=[1], offset=2)
          %2: f32[3] #1 = mul(%1, 2)
          %3: f32[6] #2 = as_strided_scatter(%0, %2, size=[3], stride=[1], offset=2)
          %4: f32[4] #2 = as_strided(%3, size=[4], stride=[1], offset=0)
          %5: f32[4] #3 = mul(%4, 1)
          %6: f32[2] strides=[2] offset=3 #2 = as_strided(%3, size=[2], stride=[2], offset=3)
          return (%3, %5, %6)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[4]
        output 1: alias_of_input 0 f32[2] strides=[2] offset=3
        mutated graph inputs: [0]
        convention: [view of base 0]
        synthetic base: graph input 0 = storage[0..6] for traced inputs [0]
    "#]]
    .assert_eq(&c.text);
}

/// Writing through `x.expand(..).select(0, 0)` writes each element of `x` once: eager
/// accepts it.
#[test]
fn write_through_a_non_repeating_expand() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.expand(&[2, 3])?.select(0, 0)?.add_(1)?;
            Ok(vec![x.mul(1)?])
        },
        || vec![seq(&[1, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[1, 3] #0 "arg0") {
          %1: f32[2, 3] strides=[0, 1] #0 = expand(%0, [2, 3])
          %2: f32[3] #0 = select(%1, dim=0, index=0)
          %3: f32[3] #1 = add(%2, 1)
          %4: f32[1, 3] #2 = as_strided_scatter(%0, %3, size=[3], stride=[1], offset=0)
          %5: f32[1, 3] #3 = mul(%4, 1)
          return (%4, %5)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[1, 3]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// A write through a view of an `as_strided` view that repeats an element: the
/// repetition must not write a stale copy back (found by the property test).
#[test]
fn write_through_a_select_of_a_repeating_as_strided_view() {
    let c = check(
        |a: &[Arg]| {
            let (x0, x1) = (tensor(&a[0])?, tensor(&a[1])?);
            let v = x1.as_strided(&[2], &[0], 1)?;
            let w = v.add(&v)?;
            v.select(0, 0)?.add_(-1)?;
            Ok(vec![w, x0.mul(1)?, v])
        },
        || {
            let base = seq(&[24], 0.0);
            vec![base.view(&[4, 6]).expect("view").into(), base.view(&[4, 6]).expect("view").into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[24] #0 "base0") {
          %1: f32[2] strides=[0] offset=1 #0 = as_strided(%0, size=[2], stride=[0], offset=1)
          %2: f32[2] #1 = add(%1, %1)
          %3: f32[] offset=1 #0 = select(%1, dim=0, index=0)
          %4: f32[] #2 = add(%3, -1)
          %5: f32[24] #3 = as_strided_scatter(%0, %4, size=[], stride=[], offset=1)
          %6: f32[4, 6] #3 = as_strided(%5, size=[4, 6], stride=[6, 1], offset=0)
          %7: f32[4, 6] #4 = mul(%6, 1)
          %8: f32[2] strides=[0] offset=1 #3 = as_strided(%5, size=[2], stride=[0], offset=1)
          return (%5, %2, %7, %8)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2]
        output 1: non_alias f32[4, 6]
        output 2: alias_of_input 1 f32[2] strides=[0] offset=1
        mutated graph inputs: [0]
        convention: [view of base 0, view of base 0]
        synthetic base: graph input 0 = storage[0..24] for traced inputs [0, 1]
    "#]]
    .assert_eq(&c.text);
}

/// An expanded input (every row is the same memory) written through one row: all
/// rows see it.
#[test]
fn write_through_a_row_of_an_expanded_input() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.select(0, 1)?.mul_(10)?;
            Ok(vec![x.add(0)?, x.select(0, 0)?])
        },
        || vec![seq(&[8], 0.0).narrow(0, 2, 3).expect("narrow").expand(&[2, 3]).expect("expand").into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[3] offset=2 #0 "base0") {
          %1: f32[2, 3] strides=[0, 1] offset=2 #0 = as_strided(%0, size=[2, 3], stride=[0, 1], offset=2)
          %2: f32[3] offset=2 #0 = select(%1, dim=0, index=1)
          %3: f32[3] #1 = mul(%2, 10)
          %4: f32[3] #2 = as_strided_scatter(%0, %3, size=[3], stride=[1], offset=0)
          %5: f32[2, 3] strides=[0, 1] #2 = as_strided(%4, size=[2, 3], stride=[0, 1], offset=0)
          %6: f32[2, 3] #3 = add(%5, 0)
          %7: f32[3] #2 = select(%5, dim=0, index=0)
          return (%4, %6, %7)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        output 1: alias_of_input 0 f32[3] offset=2
        mutated graph inputs: [0]
        convention: [view of base 0]
        synthetic base: graph input 0 = storage[2..5] for traced inputs [0]
    "#]]
    .assert_eq(&c.text);
}

/// A reduction over a copy of a sum of an argument transposed in place, its result
/// then squared in place (PyTorch: `a = arange(24.).view(2, 3, 4); a.transpose_(2, 0);
/// s = (a + a).clone().sum(); s.mul_(s)` gives 304704.0 = (2 * 276)^2).
#[test]
fn sum_of_a_copy_of_an_argument_transposed_in_place() {
    let inputs = || vec![seq(&[2, 3, 4], 0.0).into()];
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.transpose_(2, 0)?;
            let s = x.add(x)?.clone_tensor()?.sum_all()?;
            s.mul_(&s)?;
            Ok(vec![s])
        },
        inputs,
        AotConfig::default(),
    );
    assert_eq!(c.compiled.call_args(&inputs()).unwrap()[0].item().unwrap(), 304704.0);
}

/// A view of a matmul result returned beside a copy of it (PyTorch, `x = [[.1, .2, .3],
/// [.4, .5, .6]]`, `w = x.view(3, 2)`: `m[:, 0:1] = [[.22], [.49]]`); the view must read
/// the product, which the copy must not take over.
#[test]
fn a_view_of_a_product_beside_its_copy() {
    let inputs = || vec![Tensor::from_f64(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3], DType::F32).unwrap().into()];
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            let m = x.matmul(&x.view(&[3, 2])?)?;
            Ok(vec![m.slice(1, Some(0), Some(1), 1)?, m.clone_tensor()?, m.select(0, 1)?, m.t()?])
        },
        inputs,
        AotConfig::default(),
    );
    let outs = c.compiled.call_args(&inputs()).unwrap();
    let close = |got: Vec<f64>, want: &[f64]| {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs PyTorch {want:?}");
        }
    };
    close(outs[0].to_vec_f64().unwrap(), &[0.22, 0.49]);
    close(outs[1].to_vec_f64().unwrap(), &[0.22, 0.28, 0.49, 0.64]);
    close(outs[2].to_vec_f64().unwrap(), &[0.49, 0.64]);
    close(outs[3].to_vec_f64().unwrap(), &[0.22, 0.49, 0.28, 0.64]);
}

//! Cases about aliasing: outputs that are or view inputs, intermediates or each
//! other; inputs that alias each other (synthetic bases); duplicate inputs.

use crate::contract::{check, seq, tensor, traced_text};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

fn keep() -> AotConfig {
    AotConfig { keep_inference_input_mutations: true, ..AotConfig::default() }
}

#[test]
fn output_is_the_input() {
    let c =
        check(|a: &[Arg]| Ok(vec![tensor(&a[0])?.clone()]), || vec![seq(&[2, 3], 1.0).into()], AotConfig::default());
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          return (%0)
        }
        input 0: -
        output 0: is_input 0 f32[2, 3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn output_is_a_view_of_an_input() {
    let c = check(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.view(&[-1])?]),
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[6] #0 = view(%0, [6])
          return (%1)
        }
        input 0: -
        output 0: alias_of_input 0 f32[6]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn several_outputs_view_one_input() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?, x.select(0, 1)?, x.slice(1, Some(0), None, 2)?, x.unsqueeze(0)?.expand(&[2, 2, 3])?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[3] offset=3 #0 = select(%0, dim=0, index=1)
          %3: f32[2, 2] strides=[3, 2] #0 = slice(%0, dim=1, start=0, end=3, step=2)
          %4: f32[1, 2, 3] #0 = unsqueeze(%0, dim=0)
          %5: f32[2, 2, 3] strides=[0, 3, 1] #0 = expand(%4, [2, 2, 3])
          return (%1, %2, %3, %5)
        }
        input 0: -
        output 0: alias_of_input 0 f32[3, 2] strides=[1, 3]
        output 1: alias_of_input 0 f32[3] offset=3
        output 2: alias_of_input 0 f32[2, 2] strides=[3, 2]
        output 3: alias_of_input 0 f32[2, 2, 3] strides=[0, 3, 1]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn output_is_a_view_of_an_intermediate() {
    let c = check(
        |a: &[Arg]| Ok(vec![tensor(&a[0])?.mul(2)?.view(&[-1])?]),
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = mul(%0, 2)
          %2: f32[6] #1 = view(%1, [6])
          return (%2, %1)
        }
        input 0: -
        output 0: alias_of_intermediate 0 f32[6]
        intermediate bases: 1
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// The seed's case 3: `(x.t(), x.mul(2).view(-1))`.
#[test]
fn outputs_alias_an_input_and_an_intermediate() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            Ok(vec![x.t()?, x.mul(2)?.view(&[-1])?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[2, 3] #1 = mul(%0, 2)
          %3: f32[6] #1 = view(%2, [6])
          return (%1, %3, %2)
        }
        input 0: -
        output 0: alias_of_input 0 f32[3, 2] strides=[1, 3]
        output 1: alias_of_intermediate 0 f32[6]
        intermediate bases: 1
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn an_intermediate_and_its_view_both_returned() {
    let c = check(
        |a: &[Arg]| {
            let b = tensor(&a[0])?.add(1)?;
            Ok(vec![b.clone(), b.t()?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = add(%0, 1)
          %2: f32[3, 2] strides=[1, 3] #1 = t(%1)
          return (%1, %2)
        }
        input 0: -
        output 0: non_alias f32[2, 3]
        output 1: alias_of_output 0 f32[3, 2] strides=[1, 3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn outputs_alias_each_other() {
    let c = check(
        |a: &[Arg]| {
            let b = tensor(&a[0])?.add(1)?;
            let v = b.view(&[-1])?;
            Ok(vec![v.clone(), b.select(1, 2)?, v.clone()])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = add(%0, 1)
          %2: f32[6] #1 = view(%1, [6])
          %3: f32[2] strides=[3] offset=2 #1 = select(%1, dim=1, index=2)
          return (%2, %3, %2, %1)
        }
        input 0: -
        output 0: alias_of_intermediate 0 f32[6]
        output 1: alias_of_intermediate 0 f32[2] strides=[3] offset=2
        output 2: same_as 0 f32[6]
        intermediate bases: 1
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// The seed's case 4: `f(x, x.view(-1))` with `x.mul_(2); return x * x_view`.
#[test]
fn mutated_input_aliasing_another_input() {
    let f = |a: &[Arg]| {
        let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
        x.mul_(2)?;
        Ok(vec![x.mul(&xv.view(&[2, 3])?)?])
    };
    let inputs = || {
        let x = seq(&[2, 3], 1.0);
        let xv = x.view(&[-1]).expect("view");
        vec![x.into(), xv.into()]
    };
    let c = check(f, inputs, AotConfig::default());
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0", %1: f32[6] #0 "arg1") {
          %2: f32[2, 3] #0 = mul_(%0, 2)
          %3: f32[2, 3] #0 = view(%1, [2, 3])
          %4: f32[2, 3] #1 = mul(%2, %3)
          return (%4)
        }
    "#]]
    .assert_eq(&traced_text(&c));
    expect![[r#"
        graph(%0: f32[6] #0 "base0") {
          %1: f32[2, 3] #0 = as_strided(%0, size=[2, 3], stride=[3, 1], offset=0)
          %2: f32[2, 3] #1 = mul(%1, 2)
          %3: f32[6] #2 = as_strided_scatter(%0, %2, size=[2, 3], stride=[3, 1], offset=0)
          %4: f32[2, 3] #2 = view(%3, [2, 3])
          %5: f32[2, 3] #3 = mul(%2, %4)
          return (%3, %5)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        mutated graph inputs: [0]
        convention: [view of base 0, view of base 0]
        synthetic base: graph input 0 = storage[0..6] for traced inputs [0, 1]
    "#]]
    .assert_eq(&c.text);
    let c = check(f, inputs, keep());
    expect![[r#"
        graph(%0: f32[6] #0 "base0") {
          %1: f32[2, 3] #0 = as_strided(%0, size=[2, 3], stride=[3, 1], offset=0)
          %2: f32[2, 3] #1 = mul(%1, 2)
          %3: f32[6] #2 = as_strided_scatter(%0, %2, size=[2, 3], stride=[3, 1], offset=0)
          %4: f32[2, 3] #2 = view(%3, [2, 3])
          %5: f32[2, 3] #3 = mul(%2, %4)
          %6: f32[6] #0 = copy_(%0, %3)
          return (%5)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        convention: [view of base 0, view of base 0]
        synthetic base: graph input 0 = storage[0..6] for traced inputs [0, 1]
    "#]]
    .assert_eq(&c.text);
}

/// Two overlapping views of a base that is not itself an input; the write goes
/// through the second one.
#[test]
fn mutation_through_one_overlapping_view_seen_by_another() {
    let c = check(
        |a: &[Arg]| {
            let (rows, col) = (tensor(&a[0])?, tensor(&a[1])?);
            col.add_(100)?;
            Ok(vec![rows.sum(&[1], false)?, col.mul(1)?])
        },
        || {
            let base = seq(&[4, 4], 0.0);
            let rows = base.slice(0, Some(1), Some(3), 1).expect("slice");
            let col = base.select(1, 2).expect("select");
            vec![rows.into(), col.into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[13] offset=2 #0 "base0") {
          %1: f32[4] strides=[4] offset=2 #0 = as_strided(%0, size=[4], stride=[4], offset=2)
          %2: f32[4] #1 = add(%1, 100)
          %3: f32[13] #2 = as_strided_scatter(%0, %2, size=[4], stride=[4], offset=0)
          %4: f32[2, 4] offset=2 #2 = as_strided(%3, size=[2, 4], stride=[4, 1], offset=2)
          %5: f32[2] #3 = sum(%4, dims=[1], keepdim=false)
          %6: f32[4] strides=[4] #2 = as_strided(%3, size=[4], stride=[4], offset=0)
          %7: f32[4] #4 = mul(%6, 1)
          return (%3, %5, %7)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2]
        output 1: non_alias f32[4]
        mutated graph inputs: [0]
        convention: [view of base 0, view of base 0]
        synthetic base: graph input 0 = storage[2..15] for traced inputs [0, 1]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn aliased_inputs_not_mutated() {
    let c = check(
        |a: &[Arg]| {
            let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.view(&[-1])?.add(xv)?])
        },
        || {
            let x = seq(&[2, 3], 1.0);
            let xv = x.view(&[-1]).expect("view");
            vec![x.into(), xv.into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0", %1: f32[6] #1 "arg1") {
          %2: f32[6] #0 = view(%0, [6])
          %3: f32[6] #2 = add(%2, %1)
          return (%3)
        }
        input 0: -
        input 1: -
        output 0: non_alias f32[6]
        convention: [input 0, input 1]
    "#]]
    .assert_eq(&c.text);
}

/// Even and odd elements of one storage, both mutated: disjoint, so no synthetic base.
#[test]
fn disjoint_aliased_inputs_mutated() {
    let c = check(
        |a: &[Arg]| {
            let (even, odd) = (tensor(&a[0])?, tensor(&a[1])?);
            even.mul_(2)?;
            odd.add_(even)?;
            Ok(vec![odd.clone()])
        },
        || {
            let base = seq(&[8], 0.0);
            let even = base.slice(0, Some(0), None, 2).expect("slice");
            let odd = base.slice(0, Some(1), None, 2).expect("slice");
            vec![even.into(), odd.into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[4] strides=[2] #0 "arg0", %1: f32[4] strides=[2] offset=1 #1 "arg1") {
          %2: f32[4] #2 = mul(%0, 2)
          %3: f32[4] strides=[2] #3 = copy(%0, %2)
          %4: f32[4] #4 = add(%1, %3)
          %5: f32[4] strides=[2] #5 = copy(%1, %4)
          return (%3, %5, %5)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        output 0: is_input 1 f32[4] strides=[2] offset=1
        mutated graph inputs: [0, 1]
        convention: [input 0, input 1]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn duplicate_inputs() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            Ok(vec![x.add(y)?])
        },
        || {
            let x = seq(&[3], 1.0);
            vec![x.clone().into(), x.into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[3] #0 "arg0") {
          %1: f32[3] #1 = add(%0, %0)
          return (%1)
        }
        input 0: -
        output 0: non_alias f32[3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn duplicate_inputs_with_mutation() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.mul_(2)?;
            Ok(vec![x.add(y)?, y.clone()])
        },
        || {
            let x = seq(&[3], 1.0);
            vec![x.clone().into(), x.into()]
        },
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[3] #0 "arg0") {
          %1: f32[3] #1 = mul(%0, 2)
          %2: f32[3] #2 = add(%1, %1)
          return (%1, %2, %1)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[3]
        output 1: is_input 0 f32[3]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// A view of an intermediate returned beside a copy of it: the intermediate is the
/// view's base, so the plan must fill it even though the clone reads it too.
/// PyTorch: `m[:, 0:1]` is `[[0.22], [0.49]]` for these inputs.
#[test]
fn a_view_of_a_matmul_result_beside_its_clone() {
    let inputs = || {
        let x = aotgrad::prelude::Tensor::from_vec(vec![0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3]).unwrap();
        vec![x.clone().into(), x.view(&[3, 2]).unwrap().into()]
    };
    for view in 0..3 {
        let c = check(
            move |a: &[Arg]| {
                let m = tensor(&a[0])?.matmul(tensor(&a[1])?)?;
                let v = match view {
                    0 => m.slice(1, Some(0), Some(1), 1)?,
                    1 => m.select(1, 0)?,
                    _ => m.t()?,
                };
                Ok(vec![v, m.clone()])
            },
            inputs,
            AotConfig::default(),
        );
        let out = c.compiled.call_args(&inputs()).unwrap();
        let got = out[0].contiguous().unwrap().to_vec_f64().unwrap();
        let want: &[f64] = match view {
            0 | 1 => &[0.22, 0.49],
            _ => &[0.22, 0.49, 0.28, 0.64],
        };
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "view {view}: {got:?}, PyTorch {want:?}");
        }
    }
}

/// A reduction over a transposed (in place) argument whose sum is then squared in
/// place: planned without an internal error, with eager's value.
#[test]
fn a_sum_over_an_argument_transposed_in_place() {
    let inputs = || vec![seq(&[2, 3, 4], 0.5).into()];
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.transpose_(2, 0)?;
            let s = x.add(x)?.clone().sum_all()?;
            s.mul_(&s)?;
            Ok(vec![s])
        },
        inputs,
        AotConfig::default(),
    );
    // 2 * sum(0.5 + i for i in 0..24) = 576, squared.
    assert_eq!(c.compiled.call_args(&inputs()).unwrap()[0].item().unwrap(), 576.0 * 576.0);
}

/// Metadata mutations of two arguments viewing one storage: their shared version
/// counter moves on once per op, as in eager and PyTorch (`a.t_(); b.unsqueeze_(0)`
/// on two views of one base: +2 for both), on the compiled and the cached call.
#[test]
fn metadata_mutations_of_aliasing_arguments_count_on_their_shared_version() {
    let f = |a: &[Arg]| {
        let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
        x.t_()?;
        xv.unsqueeze_(0)?;
        Ok(vec![x.mul(2.0)?, xv.mul(3.0)?])
    };
    let inputs = || {
        let base = seq(&[2, 3], 1.0);
        let (x, xv) = (base.view(&[3, 2]).expect("view"), base.view(&[-1]).expect("view"));
        vec![x.into(), xv.into()]
    };
    let c = check(f, inputs, AotConfig::default());
    for call in 0..2 {
        let ins = inputs();
        let (x, xv) = (ins[0].tensor().unwrap(), ins[1].tensor().unwrap());
        let before = x.version().unwrap();
        c.compiled.call_args(&ins).unwrap();
        assert_eq!((x.version().unwrap() - before, xv.version().unwrap() - before), (2, 2), "call {call}");
    }
}

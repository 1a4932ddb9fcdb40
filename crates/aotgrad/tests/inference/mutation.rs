//! Cases about input mutation: data, metadata, through views, kept in the graph.

use crate::contract::{check, seq, tensor};
use aotgrad::trace::{no_grad, Tensor};
use aotgrad::{AotConfig, Arg};
use expect_test::expect;

fn keep() -> AotConfig {
    AotConfig { keep_inference_input_mutations: true, ..AotConfig::default() }
}

#[test]
fn input_data_mutation() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.mul(3)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = mul(%0, 2)
          %2: f32[2, 3] #2 = mul(%1, 3)
          return (%1, %2)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn input_data_mutation_kept_in_graph() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.mul_(2)?;
            Ok(vec![x.mul(3)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        keep(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[2, 3] #1 = mul(%0, 2)
          %2: f32[2, 3] #2 = mul(%1, 3)
          %3: f32[2, 3] #0 = copy_(%0, %1)
          return (%2)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn several_inputs_mutated() {
    let c = check(
        |a: &[Arg]| {
            let (x, y, z) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?);
            x.add_(1)?;
            y.mul_(&x.select(0, 1)?)?;
            Ok(vec![x.add(y)?.add(z)?])
        },
        || vec![seq(&[2, 3], 1.0).into(), seq(&[3], 10.0).into(), seq(&[2, 3], 20.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0", %1: f32[3] #1 "arg1", %2: f32[2, 3] #2 "arg2") {
          %3: f32[2, 3] #3 = add(%0, 1)
          %4: f32[3] offset=3 #3 = select(%3, dim=0, index=1)
          %5: f32[3] #4 = mul(%1, %4)
          %6: f32[2, 3] #5 = add(%3, %5)
          %7: f32[2, 3] #6 = add(%6, %2)
          return (%3, %5, %7)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: mutates_data, hidden_from_autograd
        input 2: -
        output 0: non_alias f32[2, 3]
        mutated graph inputs: [0, 1]
        convention: [input 0, input 1, input 2]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn mutated_input_returned_as_output() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.sub_(1)?;
            Ok(vec![x.clone(), x.mul(2)?])
        },
        || vec![seq(&[3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[3] #0 "arg0") {
          %1: f32[3] #1 = sub(%0, 1)
          %2: f32[3] #2 = mul(%1, 2)
          return (%1, %1, %2)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: is_input 0 f32[3]
        output 1: non_alias f32[3]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// `t[0::2]` of a larger tensor: the odd elements of the base must stay untouched.
#[test]
fn mutation_of_a_strided_slice_input() {
    let inputs = || vec![seq(&[8], 0.0).slice(0, Some(0), None, 2).expect("slice").into()];
    let f = |a: &[Arg]| {
        let x = tensor(&a[0])?;
        x.mul_(10)?;
        Ok(vec![x.add(1)?])
    };
    let c = check(f, inputs, AotConfig::default());
    expect![[r#"
        graph(%0: f32[4] strides=[2] #0 "arg0") {
          %1: f32[4] #1 = mul(%0, 10)
          %2: f32[4] strides=[2] #2 = copy(%0, %1)
          %3: f32[4] #3 = add(%2, 1)
          return (%2, %3)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[4]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
    let c = check(f, inputs, keep());
    expect![[r#"
        graph(%0: f32[4] strides=[2] #0 "arg0") {
          %1: f32[4] #1 = mul(%0, 10)
          %2: f32[4] strides=[2] #2 = copy(%0, %1)
          %3: f32[4] #3 = add(%2, 1)
          %4: f32[4] strides=[2] #0 = copy_(%0, %2)
          return (%3)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[4]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn input_metadata_mutation() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.t_()?;
            Ok(vec![x.mul(3)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[3, 2] strides=[1, 3] #1 = mul(%1, 3)
          return (%2)
        }
        input 0: mutates_metadata, final_meta=f32[3, 2] strides=[1, 3]
        output 0: non_alias f32[3, 2] strides=[1, 3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn data_and_metadata_mutation_of_one_input() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.t_()?;
            x.select(0, 1)?.mul_(-1)?;
            x.unsqueeze_(0)?;
            Ok(vec![x.add(1)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[2] strides=[3] offset=1 #0 = select(%1, dim=0, index=1)
          %3: f32[2] #1 = mul(%2, -1)
          %4: f32[3, 2] strides=[1, 3] #2 = select_scatter(%1, %3, dim=0, index=1)
          %5: f32[2, 3] #2 = t(%4)
          %6: f32[3, 2] strides=[1, 3] #2 = t(%5)
          %7: f32[1, 3, 2] strides=[3, 1, 3] #2 = unsqueeze(%6, dim=0)
          %8: f32[1, 3, 2] strides=[3, 1, 3] #3 = add(%7, 1)
          return (%5, %8)
        }
        input 0: mutates_data, mutates_metadata, hidden_from_autograd, final_meta=f32[1, 3, 2] strides=[3, 1, 3]
        output 0: non_alias f32[1, 3, 2] strides=[3, 1, 3]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn mutation_through_views_of_views() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            let v = x.view(&[3, 4])?.t()?.slice(1, Some(1), Some(3), 1)?;
            v.select(0, 2)?.fill_(-5)?;
            v.mul_(2)?;
            Ok(vec![v.clone(), x.sum(&[1], false)?])
        },
        || vec![seq(&[2, 6], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 6] #0 "arg0") {
          %1: f32[3, 4] #0 = view(%0, [3, 4])
          %2: f32[4, 3] strides=[1, 4] #0 = t(%1)
          %3: f32[4, 2] strides=[1, 4] offset=4 #0 = slice(%2, dim=1, start=1, end=3, step=1)
          %4: f32[2] strides=[4] offset=6 #0 = select(%3, dim=0, index=2)
          %5: f32[2] #1 = full_like(%4, value=-5, dtype=None)
          %6: f32[4, 2] strides=[1, 4] #2 = select_scatter(%3, %5, dim=0, index=2)
          %7: f32[4, 3] strides=[1, 4] #3 = slice_scatter(%2, %6, dim=1, start=1, end=3, step=1)
          %8: f32[3, 4] #3 = t(%7)
          %9: f32[2, 6] #3 = view(%8, [2, 6])
          %10: f32[3, 4] #3 = view(%9, [3, 4])
          %11: f32[4, 3] strides=[1, 4] #3 = t(%10)
          %12: f32[4, 2] strides=[1, 4] offset=4 #3 = slice(%11, dim=1, start=1, end=3, step=1)
          %13: f32[4, 2] strides=[1, 4] #4 = mul(%12, 2)
          %14: f32[4, 3] strides=[1, 4] #5 = slice_scatter(%11, %13, dim=1, start=1, end=3, step=1)
          %15: f32[3, 4] #5 = t(%14)
          %16: f32[2, 6] #5 = view(%15, [2, 6])
          %17: f32[2] #6 = sum(%16, dims=[1], keepdim=false)
          return (%16, %13, %17)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: alias_of_input 0 f32[4, 2] strides=[1, 4] offset=4
        output 1: non_alias f32[2]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// An input that is an `as_strided` view of a larger storage, mutated, with an
/// `as_strided` output over the same storage.
#[test]
fn as_strided_input_and_output() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.add_(100)?;
            Ok(vec![x.as_strided(&[2, 2], &[3, 1], 2)?, x.mul(2)?])
        },
        || vec![seq(&[10], 0.0).as_strided(&[3, 2], &[1, 3], 1).expect("as_strided").into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[6] offset=1 #0 "base0") {
          %1: f32[3, 2] strides=[1, 3] offset=1 #0 = as_strided(%0, size=[3, 2], stride=[1, 3], offset=1)
          %2: f32[3, 2] strides=[1, 3] #1 = add(%1, 100)
          %3: f32[6] #2 = as_strided_scatter(%0, %2, size=[3, 2], stride=[1, 3], offset=0)
          %4: f32[2, 2] strides=[3, 1] offset=1 #2 = as_strided(%3, size=[2, 2], stride=[3, 1], offset=1)
          %5: f32[3, 2] strides=[1, 3] #3 = mul(%2, 2)
          return (%3, %4, %5)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: alias_of_input 0 f32[2, 2] strides=[3, 1] offset=2
        output 1: non_alias f32[3, 2] strides=[1, 3]
        mutated graph inputs: [0]
        convention: [view of base 0]
        synthetic base: graph input 0 = storage[1..7] for traced inputs [0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn mutation_under_no_grad() {
    let c = check(
        |a: &[Arg]| {
            let (x, w) = (tensor(&a[0])?, tensor(&a[1])?);
            no_grad(|| x.mul_(2))?;
            Ok(vec![x.mul(w)?])
        },
        || vec![seq(&[3], 1.0).into(), seq(&[3], 5.0).requires_grad(true).expect("float").into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[3] #0 "arg0", %1: f32[3] #1 "arg1") {
          %2: f32[3] #2 = mul(%0, 2)
          %3: f32[3] #3 = mul(%2, %1)
          return (%2, %3)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: requires_grad
        output 0: non_alias f32[3]
        mutated graph inputs: [0]
        convention: [input 0, input 1]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn mutation_of_a_detached_alias() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.detach()?.add_(1)?;
            Ok(vec![x.mul(2)?])
        },
        || vec![seq(&[2, 2], 1.0).requires_grad(true).expect("float").into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 2] #0 "arg0") {
          %1: f32[2, 2] #0 = alias(%0)
          %2: f32[2, 2] #1 = add(%1, 1)
          %3: f32[2, 2] #1 = alias(%2)
          %4: f32[2, 2] #2 = mul(%3, 2)
          return (%3, %4)
        }
        input 0: mutates_data, hidden_from_autograd, requires_grad
        output 0: non_alias f32[2, 2]
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn empty_output_tuple() {
    let c = check(
        |a: &[Arg]| {
            tensor(&a[0])?.zero_()?;
            Ok(vec![])
        },
        || vec![seq(&[2, 2], 1.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2, 2] #0 "arg0") {
          %1: f32[2, 2] #1 = full_like(%0, value=0, dtype=None)
          return (%1)
        }
        input 0: mutates_data, hidden_from_autograd
        mutated graph inputs: [0]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

#[test]
fn non_tensor_inputs_pass_through() {
    let c = check(
        |a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[3])?);
            let k = match a[1] {
                Arg::Int(k) => k,
                _ => 0,
            };
            let extra = if matches!(a[2], Arg::None) { 0.5 } else { 7.0 };
            x.add_(k)?;
            Ok(vec![x.mul(y)?.add(extra)?])
        },
        || vec![seq(&[2], 1.0).into(), Arg::Int(3), Arg::None, seq(&[2], 4.0).into()],
        AotConfig::default(),
    );
    expect![[r#"
        graph(%0: f32[2] #0 "arg0", %1: f32[2] #1 "arg3") {
          %2: f32[2] #2 = add(%0, 3)
          %3: f32[2] #3 = mul(%2, %1)
          %4: f32[2] #4 = add(%3, 0.5)
          return (%2, %4)
        }
        input 0: mutates_data, hidden_from_autograd
        input 1: -
        output 0: non_alias f32[2]
        mutated graph inputs: [0]
        convention: [input 0, input 1]
    "#]]
    .assert_eq(&c.text);
}

/// Keep mode with an input mutated through an intermediate view chain.
#[test]
fn view_mutation_kept_in_graph() {
    let c = check(
        |a: &[Arg]| {
            let x = tensor(&a[0])?;
            x.t()?.select(0, 0)?.copy_(&Tensor::full(&[2], 9.0, aotgrad::trace::DType::F32)?)?;
            Ok(vec![x.add(1)?])
        },
        || vec![seq(&[2, 3], 1.0).into()],
        keep(),
    );
    expect![[r#"
        graph(%0: f32[2, 3] #0 "arg0") {
          %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
          %2: f32[2] strides=[3] #0 = select(%1, dim=0, index=0)
          %3: f32[2] #1 = full(shape=[2], value=9.0, dtype=f32)
          %4: f32[2] strides=[3] #2 = copy(%2, %3)
          %5: f32[3, 2] strides=[1, 3] #3 = select_scatter(%1, %4, dim=0, index=0)
          %6: f32[2, 3] #3 = t(%5)
          %7: f32[2, 3] #4 = add(%6, 1)
          %8: f32[2, 3] #0 = copy_(%0, %6)
          return (%7)
        }
        input 0: mutates_data, hidden_from_autograd
        output 0: non_alias f32[2, 3]
        convention: [input 0]
    "#]]
    .assert_eq(&c.text);
}

/// The caller's version counter moves on once per in-place op on the argument's
/// storage, data or metadata, through the argument or any view or alias of it, as
/// PyTorch's `_version` does (values from PyTorch 2.15); the contract check compares
/// every case with eager too, on the compiled and the cached call.
#[test]
fn version_counters_count_every_in_place_op() {
    type F = fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>;
    let cases: [(&str, F, u64); 6] = [
        (
            "mul_ add_",
            |a| {
                let x = tensor(&a[0])?;
                x.mul_(2.0)?.add_(1.0)?;
                Ok(vec![x.mul(1.0)?])
            },
            2,
        ),
        (
            "view t_",
            |a| {
                let v = tensor(&a[0])?.view(&[3, 2])?;
                v.t_()?;
                Ok(vec![v.mul(1.0)?])
            },
            1,
        ),
        (
            "t_ t_",
            |a| {
                let x = tensor(&a[0])?;
                x.t_()?;
                x.t_()?;
                Ok(vec![x.mul(1.0)?])
            },
            2,
        ),
        (
            "view mul_ t_",
            |a| {
                let v = tensor(&a[0])?.view(&[3, 2])?;
                v.mul_(2.0)?;
                v.t_()?;
                Ok(vec![v.mul(1.0)?])
            },
            2,
        ),
        (
            "t_ mul_",
            |a| {
                let x = tensor(&a[0])?;
                x.t_()?;
                x.mul_(2.0)?;
                Ok(vec![x.mul(1.0)?])
            },
            2,
        ),
        (
            "unsqueeze_ of a detached alias",
            |a| {
                let d = tensor(&a[0])?.detach()?;
                d.unsqueeze_(0)?;
                Ok(vec![d.mul(1.0)?])
            },
            1,
        ),
    ];
    for (name, f, want) in cases {
        let inputs = || vec![seq(&[2, 3], 1.0).into()];
        let c = check(f, inputs, AotConfig::default());
        for call in 0..2 {
            let ins = inputs();
            let x = ins[0].tensor().unwrap();
            let before = x.version().unwrap();
            c.compiled.call_args(&ins).unwrap();
            assert_eq!(x.version().unwrap() - before, want, "{name}, call {call}");
        }
    }
}

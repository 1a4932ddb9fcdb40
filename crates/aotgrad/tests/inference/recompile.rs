//! Calling a compiled function with other inputs than it was compiled for: a wrong
//! argument count is a clear error; another dtype, shape or aliasing pattern
//! recompiles (and the answer is right); with dynamic dims a new size reuses the
//! entry, and a size that breaks a guard recompiles or fails like eager — never a
//! wrong answer.

use crate::contract::{agree, seq, tensor, Outcome, UserFn};
use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function_args, AotConfig, AotFunction, Arg, Error};
use std::sync::Arc;

fn compile(f: &UserFn, config: AotConfig) -> AotFunction {
    let f = f.clone();
    aot_function_args(move |a: &[Arg]| f(a), config).expect("aot_function_args")
}

/// `x.mul_(2); y.add_(1); return x + y`: wrong if `x` and `y` are confused with
/// one another or with a duplicate.
fn mutate_both() -> UserFn {
    Arc::new(|a: &[Arg]| {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        x.mul_(2)?;
        y.add_(1)?;
        Ok(vec![x.add(y)?])
    })
}

/// Calls agree with eager, returning `true` when both failed.
fn agrees(c: &AotFunction, f: &UserFn, inputs: &dyn Fn() -> Vec<Arg>) -> bool {
    match agree(c, f, inputs, true) {
        Ok(None) => false,
        Ok(Some(Outcome::BothFailed { .. })) => true,
        Ok(Some(Outcome::Agree(_))) => unreachable!("agree never returns Agree"),
        Err(v) => panic!("contract violated: {v}"),
    }
}

#[test]
fn wrong_number_of_arguments_is_a_call_error() {
    let f = mutate_both();
    let c = compile(&f, AotConfig { name: "two_args".into(), ..AotConfig::default() });
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[3], 5.0).into()]));
    let err = c.call(&[seq(&[3], 1.0)]).expect_err("one argument for two");
    assert!(matches!(err, Error::Call { .. }), "{err:?}");
    assert_eq!(err.to_string(), "compiled function `two_args`: expected 2 argument(s) (as in its first call), got 1");
    assert_eq!(c.num_compiled(), 1);
}

#[test]
fn other_dtype_or_shape_recompiles() {
    if crate::contract::skip_f64_on_wgpu("other_dtype_or_shape_recompiles") {
        return;
    }
    let f = mutate_both();
    let c = compile(&f, AotConfig::default());
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[3], 5.0).into()]));
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 2.0).into(), seq(&[3], 7.0).into()]));
    assert_eq!(c.num_compiled(), 1);
    let f64_inputs = || {
        let x = Tensor::from_f64(&[1.5, 2.5, 3.5], &[3], DType::F64).expect("data");
        vec![x.into(), seq(&[3], 5.0).into()]
    };
    assert!(!agrees(&c, &f, &f64_inputs));
    assert_eq!(c.num_compiled(), 2);
    assert!(!agrees(&c, &f, &|| vec![seq(&[2, 3], 1.0).into(), seq(&[3], 5.0).into()]));
    assert_eq!(c.num_compiled(), 3);
    // Other strides (a transposed input) are other metadata too.
    assert!(!agrees(&c, &f, &|| vec![seq(&[3, 2], 1.0).t().expect("t").into(), seq(&[3], 5.0).into()]));
    assert_eq!(c.num_compiled(), 4);
    // Each earlier specialization is still found.
    assert!(!agrees(&c, &f, &f64_inputs));
    assert_eq!(c.num_compiled(), 4);
}

#[test]
fn distinct_tensors_after_a_duplicate_recompile() {
    let f = mutate_both();
    let c = compile(&f, AotConfig::default());
    let dup = || {
        let x = seq(&[3], 1.0);
        vec![x.clone().into(), x.into()]
    };
    assert!(!agrees(&c, &f, &dup));
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[3], 1.0).into()]));
    assert_eq!(c.num_compiled(), 2);
    // Two different tensor objects over the same storage: a third pattern.
    let aliased = || {
        let x = seq(&[3], 1.0);
        vec![x.view(&[3]).expect("view").into(), x.into()]
    };
    assert!(!agrees(&c, &f, &aliased));
    assert_eq!(c.num_compiled(), 3);
    assert!(!agrees(&c, &f, &dup));
    assert_eq!(c.num_compiled(), 3);
}

#[test]
fn other_plain_values_recompile() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let x = tensor(&a[0])?;
        let k = if let Arg::Int(k) = a[1] { k } else { -1 };
        x.add_(k)?;
        Ok(vec![x.mul(2)?])
    });
    let c = compile(&f, AotConfig::default());
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), Arg::Int(2)]));
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), Arg::Int(5)]));
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), Arg::None]));
    assert_eq!(c.num_compiled(), 3);
}

#[test]
fn dynamic_batch_reuses_the_entry() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, w) = (tensor(&a[0])?, tensor(&a[1])?);
        x.mul_(w)?;
        let rows = x.sum(&[1], false)?;
        Ok(vec![rows, x.t()?, x.select(1, 0)?])
    });
    let c = compile(&f, AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() });
    for batch in [2, 5, 1, 7] {
        assert!(!agrees(&c, &f, &|| vec![seq(&[batch, 3], 1.0).into(), seq(&[3], 2.0).into()]), "batch {batch}");
    }
    // Batches 2, 5 and 7 share the symbolic entry; batch 1 specializes (a symbol
    // stands for sizes >= 2, as in PyTorch).
    assert_eq!(c.num_compiled(), 2);
    let g = &c.compiled_graphs()[0];
    assert!(!g.inputs[0].meta.is_concrete(), "the batch dim is symbolic: {}", g.inputs[0].meta);
    assert_eq!(c.compiled_graphs()[1].inputs[0].meta.shape[0], aotgrad::trace::Dim::Const(1));
}

/// Duck sizing: `x` and `y` traced with equal batch sizes share one symbol, so the
/// entry requires them to stay equal.
#[test]
fn duck_sized_dims_that_stop_being_equal() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        x.add_(y)?;
        Ok(vec![x.mul(y)?])
    });
    let c = compile(&f, AotConfig { dynamic: vec![(0, 0), (1, 0)], ..AotConfig::default() });
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[3], 5.0).into()]));
    assert!(!agrees(&c, &f, &|| vec![seq(&[6], 1.0).into(), seq(&[6], 5.0).into()]));
    assert_eq!(c.num_compiled(), 1);
    // Unequal sizes do not bind the shared symbol: a new trace, which fails as eager does.
    assert!(agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[4], 5.0).into()]));
    // Broadcasting `y` of size 1 into `x` is a different program: it recompiles.
    assert!(!agrees(&c, &f, &|| vec![seq(&[4], 1.0).into(), seq(&[1], 5.0).into()]));
    assert_eq!(c.num_compiled(), 2);
}

/// A guard recorded while tracing (`x`'s dynamic size equals `y`'s static one, for
/// broadcasting) is checked before an entry is reused.
#[test]
fn a_broken_guard_recompiles() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        Ok(vec![x.add(y)?])
    });
    let c = compile(&f, AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() });
    assert!(!agrees(&c, &f, &|| vec![seq(&[3], 1.0).into(), seq(&[3], 5.0).into()]));
    assert_eq!(c.num_compiled(), 1);
    // Size 1 broadcasts: allowed, but not by the entry traced with size 3.
    assert!(!agrees(&c, &f, &|| vec![seq(&[1], 1.0).into(), seq(&[3], 5.0).into()]));
    assert_eq!(c.num_compiled(), 2);
    // Size 5 cannot broadcast against 3: eager and compiled both refuse.
    assert!(agrees(&c, &f, &|| vec![seq(&[5], 1.0).into(), seq(&[3], 5.0).into()]));
}

/// A synthetic base needs concrete layouts: dynamic dims on mutated aliased inputs
/// are refused with a clear error (mark the dims static instead).
#[test]
fn dynamic_dims_on_a_synthetic_base_are_unsupported() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, xv) = (tensor(&a[0])?, tensor(&a[1])?);
        x.mul_(2)?;
        Ok(vec![xv.add(1)?])
    });
    let c = compile(&f, AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() });
    let x = seq(&[2, 3], 1.0);
    let err = c.call(&[x.clone(), x.view(&[-1]).expect("view")]).expect_err("symbolic synthetic base");
    assert!(
        matches!(err, Error::Functionalize(aotgrad::functionalize::FunctionalizeError::Unsupported { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("synthetic base"), "{err}");
    assert_eq!(x.to_vec_f64().expect("data"), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "the failed call wrote nothing");
}

/// Two views of one storage with dynamic sizes, one written: whether they overlap
/// depends on the sizes, so the pass refuses rather than assume they never do.
#[test]
fn dynamic_aliased_inputs_with_a_write_are_unsupported() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        x.add_(100)?;
        Ok(vec![y.mul(1)?])
    });
    let c = compile(&f, AotConfig { dynamic: vec![(0, 0), (1, 0)], ..AotConfig::default() });
    let base = seq(&[12], 0.0);
    let (x, y) = (base.narrow(0, 0, 3).expect("narrow"), base.narrow(0, 3, 3).expect("narrow"));
    let err = c.call(&[x, y]).expect_err("sizes decide the aliasing");
    assert!(
        matches!(err, Error::Functionalize(aotgrad::functionalize::FunctionalizeError::Unsupported { .. })),
        "{err:?}"
    );
    // Static sizes are fine: the disjoint views need no synthetic base.
    let c = compile(&f, AotConfig::default());
    let views = || {
        let base = seq(&[12], 0.0);
        vec![base.narrow(0, 0, 3).expect("narrow").into(), base.narrow(0, 3, 3).expect("narrow").into()]
    };
    assert!(!agrees(&c, &f, &views));
    assert_eq!(c.functionalized()[0].convention.bases.len(), 0);
}

/// The same input metadata over a smaller storage: an `as_strided` view that fit
/// the first storage does not fit this one, so eager fails — and so must the call
/// (a synthetic base sized for the first storage must not read past this one).
#[test]
fn a_smaller_storage_under_the_same_metadata() {
    let f: UserFn = Arc::new(|a: &[Arg]| {
        let x = tensor(&a[0])?;
        x.mul_(2)?;
        Ok(vec![x.as_strided(&[2], &[2], 3)?.mul(1)?])
    });
    let c = compile(&f, AotConfig::default());
    assert!(!agrees(&c, &f, &|| vec![seq(&[8], 0.0).narrow(0, 2, 3).expect("narrow").into()]));
    assert!(agrees(&c, &f, &|| vec![seq(&[5], 0.0).narrow(0, 2, 3).expect("narrow").into()]));
    let x = seq(&[5], 0.0);
    let err = c.call(&[x.narrow(0, 2, 3).expect("narrow")]).expect_err("too small");
    // Checked before anything runs, naming the argument (not a kernel deep inside).
    assert!(matches!(err, Error::Call { .. }), "{err:?}");
    expect_test::expect!["compiled function `aot_fn`: argument 0: the compiled function reads storage elements 2..6 of its storage (it views them with as_strided, or through an argument aliasing it), but this call's storage has only 5 elements"].assert_eq(&err.to_string());
    assert_eq!(x.to_vec_f64().expect("data"), vec![0.0, 1.0, 2.0, 3.0, 4.0], "the failed call wrote nothing");
}

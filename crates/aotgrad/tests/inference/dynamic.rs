//! Mutation and aliasing with a dynamic batch dim: one entry serves several batch
//! sizes, and every call satisfies the contract.

use crate::contract::{agree, describe, seq, tensor, UserFn};
use aotgrad::{aot_function_args, AotConfig, Arg};
use expect_test::{expect, Expect};
use std::sync::Arc;

/// Run `f` over batch sizes 2, 3 and 5 of a `[batch, 4]` input (dim 0 dynamic) and
/// a static `[4]` one; one entry, every call agreeing with eager.
fn check_batches(f: UserFn, keep: bool, want: Expect) {
    let ff = f.clone();
    let config = AotConfig { dynamic: vec![(0, 0)], keep_inference_input_mutations: keep, ..AotConfig::default() };
    let c = aot_function_args(move |a: &[Arg]| ff(a), config).expect("aot_function_args");
    for batch in [2, 3, 5] {
        let inputs = || vec![seq(&[batch, 4], 1.0).into(), seq(&[4], 10.0).into()];
        if let Err(v) = agree(&c, &f, &inputs, true) {
            panic!("batch {batch}: contract violated: {v}");
        }
    }
    assert_eq!(c.num_compiled(), 1);
    want.assert_eq(&describe(&c.functionalized()[0]));
}

#[test]
fn dynamic_mutation_through_strided_slices() {
    check_batches(
        Arc::new(|a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.slice(1, Some(0), None, 2)?.mul_(&y.slice(0, Some(1), Some(3), 1)?)?;
            x.slice(0, Some(1), None, 1)?.select(1, 3)?.fill_(-1)?;
            Ok(vec![x.sum(&[0], false)?, x.t()?])
        }),
        false,
        expect![[r#"
            graph(%0: f32[s0, 4] #0 "arg0", %1: f32[4] #1 "arg1") {
              %2: f32[s0, 2] strides=[4, 2] #0 = slice(%0, dim=1, start=0, end=4, step=2)
              %3: f32[2] offset=1 #1 = slice(%1, dim=0, start=1, end=3, step=1)
              %4: f32[s0, 2] #2 = mul(%2, %3)
              %5: f32[s0, 4] #3 = slice_scatter(%0, %4, dim=1, start=0, end=4, step=2)
              %6: f32[s0 - 1, 4] offset=4 #3 = slice(%5, dim=0, start=1, end=s0, step=1)
              %7: f32[s0 - 1] strides=[4] offset=7 #3 = select(%6, dim=1, index=3)
              %8: f32[s0 - 1] #4 = full_like(%7, value=-1, dtype=None)
              %9: f32[s0 - 1, 4] #5 = select_scatter(%6, %8, dim=1, index=3)
              %10: f32[s0, 4] #6 = slice_scatter(%5, %9, dim=0, start=1, end=s0, step=1)
              %11: f32[4] #7 = sum(%10, dims=[0], keepdim=false)
              %12: f32[4, s0] strides=[1, 4] #6 = t(%10)
              return (%10, %11, %12)
            }
            input 0: mutates_data, hidden_from_autograd
            input 1: -
            output 0: non_alias f32[4]
            output 1: alias_of_input 0 f32[4, s0] strides=[1, 4]
            mutated graph inputs: [0]
            convention: [input 0, input 1]
        "#]],
    );
}

#[test]
fn dynamic_metadata_mutation_and_views() {
    check_batches(
        Arc::new(|a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.t_()?;
            // `z` takes `x`'s transposed layout (as in PyTorch), so flattening it
            // copies: `view` would fail as it does in PyTorch.
            let z = x.mul(3)?;
            Ok(vec![z.reshape(&[-1])?, x.clone(), y.unsqueeze(1)?.expand(&[4, 2])?])
        }),
        false,
        expect![[r#"
            graph(%0: f32[s0, 4] #0 "arg0", %1: f32[4] #1 "arg1") {
              %2: f32[4, s0] strides=[1, 4] #0 = t(%0)
              %3: f32[4, s0] strides=[1, 4] #2 = mul(%2, 3)
              %4: f32[4, s0] #3 = clone(%3)
              %5: f32[4*s0] #4 = _unsafe_view(%4, [4*s0])
              %6: f32[4, 1] #1 = unsqueeze(%1, dim=1)
              %7: f32[4, 2] strides=[1, 0] #1 = expand(%6, [4, 2])
              return (%5, %2, %7)
            }
            input 0: mutates_metadata, final_meta=f32[4, s0] strides=[1, 4]
            input 1: -
            output 0: non_alias f32[4*s0]
            output 1: is_input 0 f32[4, s0] strides=[1, 4]
            output 2: alias_of_input 1 f32[4, 2] strides=[1, 0]
            convention: [input 0, input 1]
        "#]],
    );
}

#[test]
fn dynamic_mutation_kept_in_graph() {
    check_batches(
        Arc::new(|a: &[Arg]| {
            let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
            x.add_(y)?;
            x.t()?.select(0, 0)?.zero_()?;
            Ok(vec![x.mul(2)?])
        }),
        true,
        expect![[r#"
            graph(%0: f32[s0, 4] #0 "arg0", %1: f32[4] #1 "arg1") {
              %2: f32[s0, 4] #2 = add(%0, %1)
              %3: f32[4, s0] strides=[1, 4] #2 = t(%2)
              %4: f32[s0] strides=[4] #2 = select(%3, dim=0, index=0)
              %5: f32[s0] #3 = full_like(%4, value=0, dtype=None)
              %6: f32[4, s0] strides=[1, 4] #4 = select_scatter(%3, %5, dim=0, index=0)
              %7: f32[s0, 4] #4 = t(%6)
              %8: f32[s0, 4] #5 = mul(%7, 2)
              %9: f32[s0, 4] #0 = copy_(%0, %7)
              return (%8)
            }
            input 0: mutates_data, hidden_from_autograd
            input 1: -
            output 0: non_alias f32[s0, 4]
            convention: [input 0, input 1]
        "#]],
    );
}

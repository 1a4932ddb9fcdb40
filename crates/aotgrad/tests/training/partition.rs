//! Partitioner choices change what the forward saves, never the results: on a small
//! MLP-like function, the default partition, min-cut at budgets 1, 0.5 and 0, and the
//! unsimplified joint graph give bit-identical outputs and gradients, and min-cut
//! with budget 0 passes the whole contract (finite differences included).

use crate::checker::{check, data, leaf, rand_vals, tensor};
use aotgrad::runtime::Partitioner;
use aotgrad::trace::Tensor;
use aotgrad::{aot_function_args, AotConfig, Arg};
use expect_test::expect;

fn mlp(a: &[Arg]) -> aotgrad::Result<Vec<Tensor>> {
    let (x, w1, b1, w2, b2, t) =
        (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?, tensor(&a[3])?, tensor(&a[4])?, tensor(&a[5])?);
    let h = x.matmul(w1)?.add(b1)?.gelu()?;
    let y = h.matmul(w2)?.add(b2)?.tanh()?;
    Ok(vec![y.mse_loss(t)?, h])
}

fn inputs() -> Vec<Arg> {
    vec![
        data(&[4, 5], 1).into(),
        leaf(&[5, 6], 2).into(),
        leaf(&[6], 3).into(),
        leaf(&[6, 3], 4).into(),
        leaf(&[3], 5).into(),
        data(&[4, 3], 6).into(),
    ]
}

/// On the reference interpreter: every partition computes each value with the same
/// kernels, so results agree bit for bit. (A fusing backend may sum in another order
/// when a partition changes a reduction's input layout; its agreement with the
/// reference is checked with tolerances by the backend differential suite.)
fn config(partitioner: Partitioner, simplify: bool) -> AotConfig {
    AotConfig { partitioner, simplify, ..AotConfig::default() }.reference_backend()
}

/// Outputs and gradients (as f64 bits) of one forward + backward, and the saved bytes.
fn run(cfg: AotConfig) -> (Vec<Vec<u64>>, u64, u64) {
    let compiled = aot_function_args(mlp, cfg).expect("compile");
    let (outs, pending) = compiled.forward_args(&inputs()).expect("forward");
    let g = Tensor::from_f64(&rand_vals(24, 9), &[4, 6], crate::checker::float_dtype()).expect("g");
    let grads =
        pending.backward(&[Tensor::ones(&[], crate::checker::float_dtype()).expect("ones"), g]).expect("backward");
    let bits = |t: &Tensor| t.to_vec_f64().expect("values").iter().map(|v| v.to_bits()).collect::<Vec<u64>>();
    let mut all: Vec<Vec<u64>> = outs.iter().map(bits).collect();
    all.extend(grads.iter().flatten().map(bits));
    let (_, _, report) = compiled.training_graphs().pop().expect("a training entry");
    (all, report.saved_bytes, report.activation_bytes)
}

#[test]
fn partitioners_give_identical_results() {
    let (reference, default_bytes, default_act) = run(config(Partitioner::Default, true));
    assert_eq!(reference.len(), 2 + 4, "two outputs, four gradients");
    let budget = |b: f64| Partitioner::MinCut { activation_memory_budget: b };
    let (_, full_bytes, full_act) = {
        let r = run(config(budget(1.0), true));
        assert_eq!(r.0, reference, "min-cut (budget 1) differs from the default partition");
        r
    };
    for b in [0.5, 0.0] {
        let (got, _, act) = run(config(budget(b), true));
        assert_eq!(got, reference, "min-cut (budget {b}) differs from the default partition");
        assert!(act <= full_act, "budget {b} saves {act} activation bytes, more than budget 1 ({full_act})");
    }
    let (got, _, _) = run(config(Partitioner::Default, false));
    assert_eq!(got, reference, "the unsimplified joint graph differs");
    assert!(full_bytes <= default_bytes, "min-cut saves {full_bytes} bytes, default {default_bytes}");
    assert!(full_act <= default_act);
}

#[test]
fn budget_zero_passes_the_contract() {
    let c = check(mlp, inputs, config(Partitioner::MinCut { activation_memory_budget: 0.0 }, true));
    crate::checker::golden(
        expect![[r#"
        forward:
        graph(%0: f64[4, 5] #0 "arg0", %1: f64[5, 6] #1 "arg1", %2: f64[6] #2 "arg2", %3: f64[6, 3] #3 "arg3", %4: f64[3] #4 "arg4", %5: f64[4, 3] #5 "arg5") {
          %21: f64[4, 6] #21 = mm(%0, %1)
          %22: f64[4, 6] #22 = add(%21, %2)
          %23: f64[4, 6] #23 = mul(%22, 0.7071067811865476)
          %24: f64[4, 6] #24 = erf(%23)
          %25: f64[4, 6] #25 = add(%24, 1.0)
          %26: f64[4, 6] #26 = mul(%22, 0.5)
          %27: f64[4, 6] #27 = mul(%26, %25)
          %28: f64[4, 3] #28 = mm(%27, %3)
          %29: f64[4, 3] #29 = add(%28, %4)
          %30: f64[4, 3] #30 = tanh(%29)
          %31: f64[4, 3] #31 = sub(%30, %5)
          %32: f64[4, 3] #32 = mul(%31, %31)
          %33: f64[] #33 = mean(%32, dims=[], keepdim=false)
          return (%33, %27, %0, %2, %3, %4, %5, %21, %28)
        }
        backward:
        graph(%0: f64[4, 5] #0 "arg0", %2: f64[6] #2 "arg2", %3: f64[6, 3] #3 "arg3", %4: f64[3] #4 "arg4", %5: f64[4, 3] #5 "arg5", %21: f64[4, 6] #21 "saved_21", %28: f64[4, 3] #28 "saved_28", %19: f64[] #19 "tangent0", %20: f64[4, 6] #20 "tangent1") {
          %22: f64[4, 6] #22 = add(%21, %2)
          %23: f64[4, 6] #23 = mul(%22, 0.7071067811865476)
          %24: f64[4, 6] #24 = erf(%23)
          %25: f64[4, 6] #25 = add(%24, 1.0)
          %26: f64[4, 6] #26 = mul(%22, 0.5)
          %27: f64[4, 6] #27 = mul(%26, %25)
          %29: f64[4, 3] #29 = add(%28, %4)
          %30: f64[4, 3] #30 = tanh(%29)
          %31: f64[4, 3] #31 = sub(%30, %5)
          %34: f64[1, 1] #19 = view(%19, [1, 1])
          %35: f64[1, 1] #34 = div(%34, 12.0)
          %36: f64[4, 3] strides=[0, 0] #34 = expand(%35, [4, 3])
          %37: f64[4, 3] #35 = mul(%36, %31)
          %38: f64[4, 3] #36 = add(%37, %37)
          %39: f64[4, 3] #37 = mul(%30, %30)
          %40: f64[4, 3] #38 = neg(%39)
          %41: f64[4, 3] #39 = add(%40, 1.0)
          %42: f64[4, 3] #40 = mul(%38, %41)
          %43: f64[1, 3] #41 = sum(%42, dims=[0], keepdim=true)
          %44: f64[3] #41 = view(%43, [3])
          %45: f64[3, 6] strides=[1, 3] #3 = t(%3)
          %46: f64[4, 6] #42 = mm(%42, %45)
          %47: f64[6, 4] strides=[1, 6] #27 = t(%27)
          %48: f64[6, 3] #43 = mm(%47, %42)
          %49: f64[4, 6] #44 = add(%20, %46)
          %50: f64[4, 6] #45 = mul(%49, %25)
          %51: f64[4, 6] #46 = mul(%49, %26)
          %52: f64[4, 6] #47 = mul(%50, 0.5)
          %53: f64[4, 6] #48 = mul(%23, %23)
          %54: f64[4, 6] #49 = neg(%53)
          %55: f64[4, 6] #50 = exp(%54)
          %56: f64[4, 6] #51 = mul(%51, %55)
          %57: f64[4, 6] #52 = mul(%56, 1.1283791670955126)
          %58: f64[4, 6] #53 = mul(%57, 0.7071067811865476)
          %59: f64[4, 6] #54 = add(%52, %58)
          %60: f64[1, 6] #55 = sum(%59, dims=[0], keepdim=true)
          %61: f64[6] #55 = view(%60, [6])
          %62: f64[5, 4] strides=[1, 5] #0 = t(%0)
          %63: f64[5, 6] #56 = mm(%62, %59)
          return (%63, %61, %48, %44)
        }
        saved 7 values, 760 bytes (288 activation bytes):
          %0 "arg0": f64[4, 5] (160 bytes)
          %2 "arg2": f64[6] (48 bytes)
          %3 "arg3": f64[6, 3] (144 bytes)
          %4 "arg4": f64[3] (24 bytes)
          %5 "arg5": f64[4, 3] (96 bytes)
          %21 (mm): f64[4, 6] (192 bytes)
          %28 (mm): f64[4, 3] (96 bytes)
        recomputed 18 ops, 288 FLOPs: %22 (add), %23 (mul), %24 (erf), %25 (add), %26 (mul), %27 (mul), %29 (add), %30 (tanh), %31 (sub), %39 (mul), %40 (neg), %41 (add), %45 (t), %47 (t), %53 (mul), %54 (neg), %55 (exp), %62 (t)"#]],
        &c.text,
    );
}

//! `aot_export_module` and `aot_export_joint_simple`: golden graphs and signatures,
//! the exported graphs run through the reference interpreter (values against
//! hand-derived formulas and central finite differences), and one test per export
//! restriction showing its error. Re-bless with
//! `UPDATE_EXPECT=1 cargo test -p aotgrad --test export`.

mod modules_util;

use aotgrad::ir::text::print_graph;
use aotgrad::ir::Graph;
use aotgrad::meta::{InputSpecKind, OutputSpecKind};
use aotgrad::nn::{Linear, Module, ParamStore, Params};
use aotgrad::prelude::*;
use aotgrad::{aot_export_joint_simple, aot_export_module};
use expect_test::{expect, Expect};
use modules_util::{assert_close, finite_diff, vals};

type Forward = dyn Fn(&Params, &[Tensor]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync;

/// A module whose forward is a closure (for the restriction tests).
struct FnModule {
    store: ParamStore,
    f: Box<Forward>,
}

impl Module for FnModule {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        (self.f)(p, inputs)
    }
}

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).unwrap()
}

/// `weight` (2, 3), `bias` (2), buffer `running_mean` (3).
fn store() -> ParamStore {
    let mut s = ParamStore::new();
    s.add_param("weight", t(&[0.5, -1.0, 0.25, 2.0, 0.0, -0.5], &[2, 3])).unwrap();
    s.add_param("bias", t(&[0.1, -0.2], &[2])).unwrap();
    s.add_buffer("running_mean", Tensor::zeros(&[3], DType::F64).unwrap()).unwrap();
    s
}

/// Updates `running_mean` under no-grad, returns `(mse(linear(x - rm), target), y.detach())`.
fn regressor() -> FnModule {
    FnModule {
        store: store(),
        f: Box::new(|p, a| {
            let rm = p.get("running_mean")?;
            no_grad(|| -> aotgrad::Result<()> {
                rm.mul_(0.9)?;
                rm.add_(&a[0].mean(&[0], false)?.mul(0.1)?)?;
                Ok(())
            })?;
            let y = a[0].sub(rm)?.linear(p.get("weight")?, Some(p.get("bias")?))?;
            Ok(vec![y.mse_loss(&a[1])?, y.detach()?])
        }),
    }
}

fn x_and_target() -> (Tensor, Tensor) {
    (t(&[1.0, 2.0, 3.0, -1.0, 0.5, 2.0], &[2, 3]), t(&[0.0, 1.0, 2.0, -1.0], &[2, 2]))
}

/// The graph text without source locations (which depend on line numbers).
fn text(g: &Graph) -> String {
    let mut g = g.clone();
    for n in &mut g.nodes {
        n.loc = None;
    }
    print_graph(&g)
}

fn check(g: &Graph, want: Expect) {
    want.assert_eq(&text(g));
}

fn run(g: &Graph, inputs: &[Tensor]) -> Vec<Vec<f64>> {
    let cpu: Vec<_> = inputs.iter().map(|t| t.to_cpu().unwrap()).collect();
    aotgrad::cpu::interpret(g, &cpu).unwrap().iter().map(|o| o.to_vec_f64()).collect()
}

/// Eager loss of the regressor with the given parameters (the buffer starts at zero).
fn eager_loss(w: &Tensor, b: &Tensor, x: &Tensor, target: &Tensor) -> f64 {
    let _g = NoGradGuard::new();
    let rm = x.mean(&[0], false).unwrap().mul(0.1).unwrap();
    x.sub(&rm).unwrap().linear(w, Some(b)).unwrap().mse_loss(target).unwrap().item().unwrap()
}

#[test]
fn joint_export_golden_signature_graph_and_values() {
    let m = regressor();
    let (x, target) = x_and_target();
    let (g, sig) = aot_export_module(&m, &[x.clone(), target.clone()], true, Some(0)).unwrap();
    expect![[r#"
        inputs:
          0 "weight": parameter weight
          1 "bias": parameter bias
          2 "running_mean": buffer running_mean
          3 "arg0": user input 0
          4 "arg1": user input 1
        outputs:
          0 %8: mutated buffer running_mean
          1 %15: user output 0 (loss)
          2 %16: user output 1
          3 %29: gradient of parameter weight
          4 %25: gradient of parameter bias
    "#]]
    .assert_eq(&sig.to_string());
    assert_eq!(sig.parameters(), vec!["weight", "bias"]);
    assert_eq!(sig.buffers(), vec!["running_mean"]);
    assert_eq!(sig.user_inputs(), vec![3, 4]);
    assert_eq!(sig.user_outputs(), vec![1, 2]);
    assert_eq!(sig.buffers_to_mutate(), vec![(0, "running_mean")]);
    assert_eq!(sig.gradients_to_parameters(), vec![(3, "weight"), (4, "bias")]);
    assert_eq!(sig.loss_output_position(), Some(1));
    assert_eq!(g.inputs.len(), 5, "no tangent input: the loss is seeded with ones");
    check(
        &g,
        expect![[r#"
        graph(%0: f64[2, 3] #0 "weight", %1: f64[2] #1 "bias", %2: f64[3] #2 "running_mean", %3: f64[2, 3] #3 "arg0", %4: f64[2, 2] #4 "arg1") {
          %17: f64[] #15 = full(shape=[], value=1.0, dtype=f64)
          %5: f64[3] #5 = mul(%2, 0.9)
          %6: f64[3] #6 = mean(%3, dims=[0], keepdim=false)
          %7: f64[3] #7 = mul(%6, 0.1)
          %8: f64[3] #8 = add(%5, %7)
          %9: f64[2, 3] #9 = sub(%3, %8)
          %10: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %11: f64[2, 2] #10 = mm(%9, %10)
          %12: f64[2, 2] #11 = add(%11, %1)
          %13: f64[2, 2] #12 = sub(%12, %4)
          %14: f64[2, 2] #13 = mul(%13, %13)
          %15: f64[] #14 = mean(%14, dims=[], keepdim=false)
          %16: f64[2, 2] #11 = alias(%12)
          %18: f64[1, 1] #15 = view(%17, [1, 1])
          %19: f64[1, 1] #16 = div(%18, 4.0)
          %20: f64[2, 2] strides=[0, 0] #16 = expand(%19, [2, 2])
          %21: f64[2, 2] #17 = mul(%20, %13)
          %22: f64[2, 2] #18 = mul(%20, %13)
          %23: f64[2, 2] #19 = add(%21, %22)
          %24: f64[1, 2] #20 = sum(%23, dims=[0], keepdim=true)
          %25: f64[2] #20 = view(%24, [2])
          %26: f64[3, 2] strides=[1, 3] #9 = t(%9)
          %27: f64[3, 2] #21 = mm(%26, %23)
          %28: f64[2, 3] strides=[1, 2] #21 = t(%27)
          %29: f64[2, 3] #22 = clone(%28)
          return (%8, %15, %16, %29, %25)
        }
    "#]],
    );

    // Run it: the new buffer, the loss, the detached output and the gradients.
    let s = m.store();
    let (w, b, rm) = (s.get("weight").unwrap(), s.get("bias").unwrap(), s.get("running_mean").unwrap());
    let outs = run(&g, &[w.clone(), b.clone(), rm.clone(), x.clone(), target.clone()]);
    assert_close("running_mean", &outs[0], &[0.0, 0.125, 0.25], 1e-12, 0.0);
    assert_close("loss", &outs[1], &[eager_loss(w, b, &x, &target)], 1e-12, 1e-12);
    assert_eq!(outs[2].len(), 4);
    let fd_w = finite_diff(w, &(0..6).collect::<Vec<_>>(), 1e-6, || eager_loss(w, b, &x, &target));
    assert_close("d loss / d weight", &outs[3], &fd_w, 1e-7, 1e-6);
    let fd_b = finite_diff(b, &[0, 1], 1e-6, || eager_loss(w, b, &x, &target));
    assert_close("d loss / d bias", &outs[4], &fd_b, 1e-7, 1e-6);
    // Exporting does not run the module: the real buffer is untouched.
    assert_eq!(vals(rm), vec![0.0; 3]);
}

#[test]
fn inference_export_golden() {
    let m = regressor();
    let (x, target) = x_and_target();
    let (g, sig) = aot_export_module(&m, &[x.clone(), target], false, None).unwrap();
    assert_eq!(sig.loss_output, None);
    assert!(sig.gradients_to_parameters().is_empty());
    assert_eq!(
        sig.outputs.iter().map(|o| o.kind.clone()).collect::<Vec<_>>(),
        vec![
            OutputSpecKind::BufferMutation("running_mean".into()),
            OutputSpecKind::UserOutput(0),
            OutputSpecKind::UserOutput(1)
        ]
    );
    assert_eq!(sig.inputs[3].kind, InputSpecKind::UserInput(0));
    check(
        &g,
        expect![[r#"
        graph(%0: f64[2, 3] #0 "weight", %1: f64[2] #1 "bias", %2: f64[3] #2 "running_mean", %3: f64[2, 3] #3 "arg0", %4: f64[2, 2] #4 "arg1") {
          %5: f64[3] #5 = mul(%2, 0.9)
          %6: f64[3] #6 = mean(%3, dims=[0], keepdim=false)
          %7: f64[3] #7 = mul(%6, 0.1)
          %8: f64[3] #8 = add(%5, %7)
          %9: f64[2, 3] #9 = sub(%3, %8)
          %10: f64[3, 2] strides=[1, 3] #0 = t(%0)
          %11: f64[2, 2] #10 = mm(%9, %10)
          %12: f64[2, 2] #11 = add(%11, %1)
          %13: f64[2, 2] #12 = sub(%12, %4)
          %14: f64[2, 2] #13 = mul(%13, %13)
          %15: f64[] #14 = mean(%14, dims=[], keepdim=false)
          %16: f64[2, 2] #11 = alias(%12)
          return (%8, %15, %16)
        }
    "#]],
    );
}

#[test]
fn joint_export_of_user_input_gradient_and_nn_module() {
    // A user input that requires grad gets a gradient after the parameters'.
    let lin = Linear::new(3, 2, true, DType::F64, 4).unwrap();
    let m = FnModule {
        store: lin.store().clone(),
        f: Box::new(move |p, a| Ok(vec![lin.apply(p, &a[0])?.pow(2.0)?.sum_all()?])),
    };
    let x = t(&[1.0, -2.0, 0.5, 3.0, 1.0, -1.0], &[2, 3]).requires_grad(true).unwrap();
    let (g, sig) = aot_export_module(&m, std::slice::from_ref(&x), true, Some(0)).unwrap();
    assert_eq!(sig.gradients_to_parameters(), vec![(1, "weight"), (2, "bias")]);
    assert_eq!(sig.gradients_to_user_inputs(), vec![(3, 0)]);
    let (w, b) = (m.store.get("weight").unwrap(), m.store.get("bias").unwrap());
    let outs = run(&g, &[w.clone(), b.clone(), x.clone()]);
    let loss = || {
        let _g = NoGradGuard::new();
        x.linear(w, Some(b)).unwrap().pow(2.0).unwrap().sum_all().unwrap().item().unwrap()
    };
    assert_close("loss", &outs[0], &[loss()], 1e-12, 1e-12);
    assert_close("d/dx", &outs[3], &finite_diff(&x, &(0..6).collect::<Vec<_>>(), 1e-6, loss), 1e-6, 1e-6);
    assert_close("d/dw", &outs[1], &finite_diff(w, &(0..6).collect::<Vec<_>>(), 1e-6, loss), 1e-6, 1e-6);
}

#[test]
fn joint_simple_inference_and_joint_graphs() {
    let f = |a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.sum(&[1], false)?, a[1].exp()?]);
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).requires_grad(true).unwrap();
    let y = t(&[0.5, -1.0, 2.0, 0.0], &[2, 2]);
    let inference = aot_export_joint_simple(f, &[x.clone(), y.clone()], false).unwrap();
    check(
        &inference,
        expect![[r#"
        graph(%0: f64[2, 2] #0 "arg0", %1: f64[2, 2] #1 "arg1") {
          %2: f64[2, 2] #2 = mul(%0, %1)
          %3: f64[2] #3 = sum(%2, dims=[1], keepdim=false)
          %4: f64[2, 2] #4 = exp(%1)
          return (%3, %4)
        }
    "#]],
    );
    let joint = aot_export_joint_simple(f, &[x.clone(), y.clone()], true).unwrap();
    check(
        &joint,
        expect![[r#"
        graph(%0: f64[2, 2] #0 "arg0", %1: f64[2, 2] #1 "arg1", %5: f64[2] #5 "tangent0") {
          %2: f64[2, 2] #2 = mul(%0, %1)
          %3: f64[2] #3 = sum(%2, dims=[1], keepdim=false)
          %4: f64[2, 2] #4 = exp(%1)
          %6: f64[2, 1] #5 = view(%5, [2, 1])
          %7: f64[2, 2] strides=[1, 0] #5 = expand(%6, [2, 2])
          %8: f64[2, 2] #6 = mul(%7, %1)
          return (%3, %4, %8)
        }
    "#]],
    );
    // Inputs: x, y, then one tangent (only output 0 requires grad); outputs: both
    // forward outputs, then d/dx = tangent[i] * y[i, j].
    let tangent = t(&[10.0, 100.0], &[2]);
    let outs = run(&joint, &[x, y, tangent]);
    assert_eq!(outs[0], vec![-1.5, 6.0]);
    assert_close("exp", &outs[1], &[0.5f64.exp(), (-1f64).exp(), 2f64.exp(), 1.0], 1e-12, 0.0);
    assert_eq!(outs[2], vec![5.0, -10.0, 200.0, 0.0]);
    assert_eq!(outs.len(), 3);
}

// ---- restrictions ----------------------------------------------------------------

fn module(f: impl Fn(&Params, &[Tensor]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static) -> FnModule {
    FnModule { store: store(), f: Box::new(f) }
}

fn export_err(m: &FnModule, args: &[Tensor], trace_joint: bool, loss: Option<usize>) -> String {
    match aot_export_module(m, args, trace_joint, loss) {
        Ok((g, _)) => panic!("export succeeded:\n{}", text(&g)),
        Err(e) => e.to_string(),
    }
}

fn x() -> Tensor {
    t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
}

fn loss_of(p: &Params, x: &Tensor) -> aotgrad::Result<Tensor> {
    Ok(x.linear(p.get("weight")?, Some(p.get("bias")?))?.sum_all()?)
}

#[test]
fn refuses_metadata_mutation_of_an_input() {
    let m = module(|p, a| {
        a[0].t_()?;
        Ok(vec![a[0].t()?.linear(p.get("weight")?, None)?])
    });
    expect![[r#"aot_export_module: user input 0 receives a metadata mutation (e.g. `t_`, `transpose_`, `unsqueeze_`, `as_strided_`); export does not support metadata mutations of inputs"#]]
        .assert_eq(&export_err(&m, &[x()], false, None));
}

#[test]
fn refuses_data_mutation_of_an_input_that_requires_grad() {
    let m = module(|p, a| {
        no_grad(|| a[0].mul_(2.0))?;
        Ok(vec![loss_of(p, &a[0])?])
    });
    let xr = x().requires_grad(true).unwrap();
    expect![[r#"aot_export_module: user input 0 requires grad and its data is mutated; export does not support data mutations of inputs that require grad"#]]
        .assert_eq(&export_err(&m, &[xr], true, Some(0)));
}

#[test]
fn refuses_mutation_of_a_parameter() {
    let m = module(|p, a| {
        no_grad(|| p.get("bias")?.add_(1.0))?;
        Ok(vec![loss_of(p, &a[0])?])
    });
    expect![[r#"aot_export_module: parameter `bias` is mutated; export does not support mutating parameters (update them outside the exported graph, e.g. in an optimizer step)"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(0)));
    // Outside no-grad, tracing itself rejects it, as eager mode would.
    let m = module(|p, a| {
        p.get("bias")?.add_(1.0)?;
        Ok(vec![loss_of(p, &a[0])?])
    });
    let msg = export_err(&m, &[x()], true, Some(0));
    assert!(msg.contains("a leaf Variable that requires grad is being used in an in-place operation"), "{msg}");
}

#[test]
fn refuses_aliased_mutated_inputs() {
    let m = module(|p, a| {
        a[0].mul_(2.0)?;
        Ok(vec![a[1].view(&[2, 3])?.add(&a[0])?.linear(p.get("weight")?, None)?])
    });
    let base = x();
    let flat = base.view(&[6]).unwrap();
    expect![[r#"aot_export_module: user input 0 and user input 1 alias one storage and are mutated or viewed with as_strided, which needs a synthetic base; export does not support mutated inputs that alias other inputs"#]]
        .assert_eq(&export_err(&m, &[base, flat], false, None));
}

#[test]
fn refuses_duplicated_inputs() {
    let m = module(|p, a| Ok(vec![a[0].add(&a[1])?.linear(p.get("weight")?, None)?]));
    let a = x();
    expect![[r#"aot_export_module: user input 0 and user input 1 are the same tensor (duplicated inputs); export needs every graph input to be a distinct tensor (parameters must not be duplicated)"#]]
        .assert_eq(&export_err(&m, &[a.clone(), a], false, None));
    let w = m.store.get("weight").unwrap().clone();
    let msg = export_err(&m, &[w.clone(), w], false, None);
    assert!(msg.starts_with("aot_export_module: parameter `weight` and user input 0 are the same tensor"), "{msg}");
}

#[test]
fn refuses_mutation_of_a_user_input() {
    let m = module(|p, a| {
        a[0].mul_(2.0)?;
        Ok(vec![loss_of(p, &a[0])?])
    });
    expect![[
        r#"aot_export_module: user input 0 is mutated; export does not support this (only buffers may be mutated)"#
    ]]
    .assert_eq(&export_err(&m, &[x()], false, None));
}

#[test]
fn refuses_a_loss_that_is_not_a_scalar() {
    let m = module(|p, a| Ok(vec![a[0].linear(p.get("weight")?, Some(p.get("bias")?))?]));
    expect![[r#"aot_export_module: the loss (output 0) must be a scalar (one element), but it has shape [2, 2]"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(0)));
}

#[test]
fn refuses_a_loss_that_does_not_require_grad() {
    let m = module(|p, a| Ok(vec![loss_of(p, &a[0])?.detach()?]));
    expect![[r#"aot_export_module: output 0 is marked as the loss, but it does not require grad"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(0)));
}

#[test]
fn refuses_another_output_requiring_grad() {
    let m = module(|p, a| {
        let y = a[0].linear(p.get("weight")?, Some(p.get("bias")?))?;
        Ok(vec![y.sum_all()?, y])
    });
    expect![[r#"aot_export_module: output 1 requires grad but is not the loss (output 0); with trace_joint every output other than the scalar loss must not require grad, because only the loss is differentiated: call .detach() on the other outputs"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(0)));
}

#[test]
fn refuses_a_missing_or_out_of_range_loss_index() {
    let m = module(|p, a| Ok(vec![loss_of(p, &a[0])?]));
    expect![[r#"aot_export_module: trace_joint needs one of the forward's outputs to be a scalar loss: give its index as output_loss_index"#]]
        .assert_eq(&export_err(&m, &[x()], true, None));
    expect![[r#"aot_export_module: output_loss_index is 3, but the forward returns 1 output(s)"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(3)));
}

#[test]
fn joint_simple_refuses_mutations_and_aliasing_outputs() {
    let err = |f: &dyn Fn(&[Tensor]) -> aotgrad::Result<Vec<Tensor>>, trace_joint: bool| {
        aot_export_joint_simple(f, &[x()], trace_joint).map(|g| text(&g)).unwrap_err().to_string()
    };
    expect![[
        r#"aot_export_joint_simple: user input 0 is mutated; export does not support this (no input may be mutated)"#
    ]]
    .assert_eq(&err(&|a| Ok(vec![a[0].add_(1.0)?.exp()?]), false));
    expect![[r#"aot_export_joint_simple: output 0 aliases an input or another output (AliasOfInput(0)); aot_export_joint_simple does not support outputs that alias"#]]
        .assert_eq(&err(&|a| Ok(vec![a[0].t()?]), false));
    expect![[r#"aot_export_joint_simple: user input 0 receives a metadata mutation (e.g. `t_`, `transpose_`, `unsqueeze_`, `as_strided_`); export does not support metadata mutations of inputs"#]]
        .assert_eq(&err(&|a| Ok(vec![a[0].t_()?.exp()?]), true));
    let a = x();
    let msg = aot_export_joint_simple(|a| Ok(vec![a[0].add(&a[1])?]), &[a.clone(), a], false).unwrap_err().to_string();
    assert!(msg.contains("user input 0 and user input 1 are the same tensor (duplicated inputs)"), "{msg}");
}

#[test]
fn joint_export_of_a_transformer_block_matches_finite_differences() {
    use aotgrad::nn::TransformerBlock;
    use modules_util::{data, sample_indices, weighted_loss};
    let (b, s, d) = (2, 4, 16);
    let blk = TransformerBlock::new(d, 2, DType::F64, 17).unwrap();
    {
        let _g = NoGradGuard::new();
        for (k, n) in ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"].iter().enumerate() {
            blk.store().get(n).unwrap().add_(&data(&[d], DType::F64, 30 + k as u64, 0.5)).unwrap();
        }
    }
    let inner = blk.clone();
    // loss = sum(block(x) * weights), weights a user input that does not require grad.
    let m = FnModule {
        store: blk.store().clone(),
        f: Box::new(move |p, a| Ok(vec![inner.apply(p, &a[0])?.mul(&a[1])?.sum_all()?])),
    };
    let x = data(&[b, s, d], DType::F64, 5, 1.0);
    let w = data(&[b, s, d], DType::F64, 6, 1.0);
    let (g, sig) = aot_export_module(&m, &[x.clone(), w.clone()], true, Some(0)).unwrap();
    let mut inputs = blk.store().tensors();
    inputs.extend([x.clone(), w.clone()]);
    let outs = run(&g, &inputs);
    let wv = vals(&w);
    let loss = || weighted_loss(&blk, std::slice::from_ref(&x), &wv);
    assert_close("loss", &outs[0], &[loss()], 1e-10, 1e-10);
    assert_eq!(sig.gradients_to_parameters().len(), 12);
    for (pos, name) in sig.gradients_to_parameters() {
        let p = blk.store().get(name).unwrap();
        let idx = sample_indices(outs[pos].len(), 6);
        let fd = finite_diff(p, &idx, 1e-6, loss);
        let got: Vec<f64> = idx.iter().map(|&i| outs[pos][i]).collect();
        assert_close(&format!("d/d {name}"), &got, &fd, 1e-6, 1e-5);
    }
}

#[test]
fn refuses_functionalized_rng() {
    use aotgrad::trace::RngSeed;
    let m = module(|p, a| Ok(vec![loss_of(p, &a[0].dropout(0.5, true, RngSeed::Global)?)?]));
    expect![[r#"aot_export_module: the program draws from the global random generator (e.g. `dropout` or `randn` with `RngSeed::Global`), which would add generator-state inputs; export does not support functionalized RNG: give those ops a fixed seed"#]]
        .assert_eq(&export_err(&m, &[x()], true, Some(0)));
    // A fixed seed is part of the graph: exporting works, and the graph has no extra input.
    let m = module(|p, a| Ok(vec![loss_of(p, &a[0].dropout(0.5, true, 7u64)?)?]));
    let (g, sig) = aot_export_module(&m, &[x()], true, Some(0)).unwrap();
    assert_eq!(g.inputs.len(), 4);
    assert_eq!(sig.inputs.len(), 4);
}

#[test]
fn exported_joint_does_not_differentiate_through_detach() {
    // f(x) = x * x.detach(): the gradient is x (the detached factor is a constant), not 2x.
    let f = |a: &[Tensor]| Ok(vec![a[0].mul(&a[0].detach()?)?]);
    let x = t(&[1.0, -2.0, 3.0], &[3]).requires_grad(true).unwrap();
    let joint = aot_export_joint_simple(f, std::slice::from_ref(&x), true).unwrap();
    let tangent = t(&[1.0, 1.0, 1.0], &[3]);
    let outs = aotgrad::cpu::interpret(&joint, &[x.to_cpu().unwrap(), tangent.to_cpu().unwrap()]).unwrap();
    assert_eq!(outs[0].to_vec_f64(), vec![1.0, 4.0, 9.0]);
    assert_eq!(outs[1].to_vec_f64(), vec![1.0, -2.0, 3.0]);
}

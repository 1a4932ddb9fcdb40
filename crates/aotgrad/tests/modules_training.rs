//! `aot_module`'s training path: gradients of every parameter (and of inputs that
//! require grad) against central finite differences in f64, for the MLP and the
//! transformer block; buffers updated in training mode; an SGD loop that lowers the
//! loss; `aot_module_simplified` on the training path.

mod modules_util;

use aotgrad::nn::{Linear, Mlp, Module, ParamStore, Params, Sgd, TransformerBlock};
use aotgrad::prelude::*;
use aotgrad::ModuleGrads;
use modules_util::{assert_close, data, finite_diff, sample_indices, vals, weighted_loss};
use std::sync::Arc;

/// Compiled forward + backward of `sum(out * weights)`, checked against eager outputs.
fn compiled_grads(m: &Arc<dyn Module>, inputs: &[Tensor], weights: &Tensor) -> ModuleGrads {
    let compiled = aot_module(m.clone(), AotConfig::default()).expect("aot_module");
    let (outs, back) = compiled.forward(inputs).expect("compiled forward");
    let eager = {
        let _g = NoGradGuard::new();
        m.forward_eager(inputs).expect("eager")
    };
    assert_close("forward", &vals(&outs[0]), &vals(&eager[0]), 1e-12, 1e-12);
    assert!(outs[0].is_requires_grad());
    back.backward(std::slice::from_ref(weights)).expect("backward")
}

/// Every parameter (sampling up to `per_param` elements each) and every input that
/// requires grad: compiled gradient == central finite difference.
fn check_against_finite_differences(m: Arc<dyn Module>, inputs: &[Tensor], out_shape: &[usize], per_param: usize) {
    let weights = data(out_shape, DType::F64, 99, 1.0);
    let w = vals(&weights);
    let grads = compiled_grads(&m, inputs, &weights);
    let names: Vec<String> = m.store().params().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(grads.params.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(), names, "one gradient per parameter");
    let loss = || weighted_loss(&*m, inputs, &w);
    for (name, p) in m.store().params() {
        let g = vals(grads.param(name).expect("gradient"));
        assert_eq!(g.len(), vals(p).len(), "{name}: gradient size");
        let idx = sample_indices(g.len(), per_param);
        let fd = finite_diff(p, &idx, 1e-6, loss);
        let got: Vec<f64> = idx.iter().map(|&i| g[i]).collect();
        assert_close(&format!("d/d {name}"), &got, &fd, 1e-6, 1e-5);
    }
    assert_eq!(grads.inputs.len(), inputs.len());
    for (k, x) in inputs.iter().enumerate() {
        match &grads.inputs[k] {
            Some(g) => {
                assert!(x.is_requires_grad());
                let g = vals(g);
                let idx = sample_indices(g.len(), per_param);
                let fd = finite_diff(x, &idx, 1e-6, loss);
                let got: Vec<f64> = idx.iter().map(|&i| g[i]).collect();
                assert_close(&format!("d/d input {k}"), &got, &fd, 1e-6, 1e-5);
            }
            None => assert!(!x.is_requires_grad(), "input {k} requires grad but got no gradient"),
        }
    }
}

#[test]
fn mlp_gradients_match_finite_differences() {
    let mlp = Mlp::new(&[3, 5, 4], DType::F64, 1).unwrap();
    let x = data(&[6, 3], DType::F64, 2, 2.0).requires_grad(true).unwrap();
    check_against_finite_differences(Arc::new(mlp), &[x], &[6, 4], usize::MAX);
}

#[test]
fn transformer_block_gradients_match_finite_differences() {
    let (b, s, d) = (2, 4, 16);
    let blk = TransformerBlock::new(d, 2, DType::F64, 3).unwrap();
    {
        // Move the layer norms off their identity initialization.
        let _g = NoGradGuard::new();
        for (k, n) in ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"].iter().enumerate() {
            blk.store().get(n).unwrap().add_(&data(&[d], DType::F64, 10 + k as u64, 0.5)).unwrap();
        }
    }
    let x = data(&[b, s, d], DType::F64, 4, 1.0);
    check_against_finite_differences(Arc::new(blk.clone()), &[x], &[b, s, d], 8);
    let x = data(&[b, s, d], DType::F64, 5, 1.0).requires_grad(true).unwrap();
    check_against_finite_differences(Arc::new(blk), &[x], &[b, s, d], 4);
}

/// `mse(head(gelu-mlp(x)), target)`, with a step counter buffer bumped under no-grad.
struct Regressor {
    store: ParamStore,
    body: Mlp,
    head: Linear,
}

impl Regressor {
    fn new(dtype: DType) -> Regressor {
        let body = Mlp::new(&[4, 16], dtype, 7).unwrap();
        let head = Linear::new(16, 1, true, dtype, 8).unwrap();
        let mut store = ParamStore::new();
        store.add_child("body", body.store()).unwrap();
        store.add_child("head", head.store()).unwrap();
        store.add_buffer("steps", Tensor::zeros(&[], dtype).unwrap()).unwrap();
        Regressor { store, body, head }
    }
}

impl Module for Regressor {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        no_grad(|| p.get("steps")?.add_(1.0))?;
        let h = self.body.apply(&p.scope("body"), &inputs[0])?;
        let y = self.head.apply(&p.scope("head"), &h)?;
        Ok(vec![y.mse_loss(&inputs[1])?])
    }
}

/// Inputs `(32, 4)` and targets `x · [1, -2, 0.5, 1] + 0.3` `(32, 1)`.
fn regression_data(dtype: DType) -> (Tensor, Tensor) {
    let x = data(&[32, 4], dtype, 21, 1.0);
    let a = Tensor::from_f64(&[1.0, -2.0, 0.5, 1.0], &[4, 1], dtype).unwrap();
    let y = x.matmul(&a).unwrap().add(0.3).unwrap();
    (x, y)
}

#[test]
fn sgd_lowers_the_loss_and_updates_buffers() {
    let m = Arc::new(Regressor::new(DType::F32));
    let compiled = aot_module(m.clone(), AotConfig::default()).unwrap();
    let (x, y) = regression_data(DType::F32);
    let sgd = Sgd::new(0.1);
    let mut losses = Vec::new();
    for _ in 0..40 {
        let (outs, back) = compiled.forward(&[x.clone(), y.clone()]).unwrap();
        losses.push(outs[0].item().unwrap());
        let grads = back.backward(&[Tensor::ones(&[], DType::F32).unwrap()]).unwrap();
        assert_eq!(grads.params.len(), 4);
        assert!(grads.inputs.iter().all(Option::is_none));
        sgd.step(m.store(), &grads.params).unwrap();
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(last < 0.25 * first, "loss went from {first} to {last}: {losses:?}");
    assert_eq!(compiled.function().num_compiled(), 1, "parameter updates do not recompile");
    assert_eq!(m.store().get("steps").unwrap().item().unwrap(), 40.0);
    // The compiled loss after training equals the eager one with the trained parameters.
    let eager = {
        let _g = NoGradGuard::new();
        m.forward_eager(&[x.clone(), y.clone()]).unwrap()[0].item().unwrap()
    };
    let again = compiled.call(&[x, y]).unwrap()[0].item().unwrap();
    assert!((eager - again).abs() <= 1e-5 * eager.abs().max(1.0), "eager {eager}, compiled {again}");
}

#[test]
fn sgd_step_is_p_minus_lr_grad() {
    let lin = Linear::new(2, 1, true, DType::F64, 0).unwrap();
    let w0 = vals(lin.store().get("weight").unwrap());
    let grads = vec![
        ("weight".to_string(), Tensor::from_f64(&[1.0, -2.0], &[1, 2], DType::F64).unwrap()),
        ("bias".to_string(), Tensor::from_f64(&[0.5], &[1], DType::F64).unwrap()),
    ];
    let b0 = vals(lin.store().get("bias").unwrap());
    Sgd::new(0.5).step(lin.store(), &grads).unwrap();
    assert_close("weight", &vals(lin.store().get("weight").unwrap()), &[w0[0] - 0.5, w0[1] + 1.0], 1e-15, 0.0);
    assert_close("bias", &vals(lin.store().get("bias").unwrap()), &[b0[0] - 0.25], 1e-15, 0.0);
    assert!(lin.store().get("weight").unwrap().is_leaf());
    let err = Sgd::new(0.1).step(lin.store(), &[("nope".into(), Tensor::zeros(&[1], DType::F64).unwrap())]);
    assert!(err.unwrap_err().to_string().contains("no parameter named `nope`"));
    let err = Sgd::new(0.1).step(lin.store(), &[("bias".into(), Tensor::zeros(&[2], DType::F64).unwrap())]);
    assert!(err.unwrap_err().to_string().contains("gradient of `bias` has shape [2], parameter has [1]"));
}

#[test]
fn simplified_training_path() {
    let m = Arc::new(Regressor::new(DType::F64));
    let (x, y) = regression_data(DType::F64);
    let compiled = aot_module_simplified(m.clone(), &[x.clone(), y.clone()], AotConfig::default()).unwrap();
    assert_eq!(compiled.function().num_compiled(), 1);
    assert_eq!(m.store().get("steps").unwrap().item().unwrap(), 0.0, "compiling ran on private copies");
    let (outs, back) = compiled.forward(&[x.clone(), y.clone()]).unwrap();
    let grads = back.backward(&[Tensor::ones(&[], DType::F64).unwrap()]).unwrap();
    let head_b = vals(grads.param("head.bias").unwrap());
    // d mse / d bias = 2 * mean(pred - y); pred - y recomputed eagerly.
    let eager_pred = {
        let _g = NoGradGuard::new();
        let p = Params::from_store(m.store());
        let h = m.body.apply(&p.scope("body"), &x).unwrap();
        m.head.apply(&p.scope("head"), &h).unwrap()
    };
    let diff: Vec<f64> = vals(&eager_pred).iter().zip(vals(&y)).map(|(a, b)| a - b).collect();
    let want = 2.0 * diff.iter().sum::<f64>() / diff.len() as f64;
    assert_close("d loss / d head.bias", &head_b, &[want], 1e-12, 1e-10);
    assert_close("loss", &vals(&outs[0]), &[diff.iter().map(|d| d * d).sum::<f64>() / 32.0], 1e-12, 1e-12);
    let err = back.backward(&[Tensor::ones(&[], DType::F64).unwrap()]).unwrap_err();
    assert!(err.to_string().contains("backward was already run"), "{err}");
    let err = compiled.forward(&[x.slice(0, Some(0), Some(16), 1).unwrap(), y.clone()]).err().expect("refused");
    assert!(err.to_string().contains("does not recompile"), "{err}");
    // Same metadata, but a non-leaf requiring grad where the example was a plain leaf:
    // the key `aot_function` selects entries by (leafness included) refuses it too.
    let x_rg = x.clone_tensor().unwrap().requires_grad(true).unwrap().mul(1.0).unwrap();
    let err = compiled.forward(&[x_rg, y]).err().expect("refused");
    assert!(err.to_string().contains("input 0 has requires_grad=true, compiled for false"), "{err}");
}

/// With grad mode on, leafness is part of what `aot_module_simplified` compiled for:
/// a view of a leaf that requires grad is not a view of a non-leaf (eager refuses to
/// write the former in place).
#[test]
fn simplified_refuses_other_leafness() {
    let m = Arc::new(Linear::new(3, 2, true, DType::F64, 0).unwrap());
    let example = data(&[4, 3], DType::F64, 1, 1.0).requires_grad(true).unwrap().mul(1.0).unwrap();
    let compiled = aot_module_simplified(m.clone(), &[example.view(&[4, 3]).unwrap()], AotConfig::default()).unwrap();
    let leaf = data(&[4, 3], DType::F64, 1, 1.0).requires_grad(true).unwrap();
    let err = compiled.forward(&[leaf.view(&[4, 3]).unwrap()]).err().expect("refused");
    assert_eq!(
        err.to_string(),
        "compiled function `aot_fn`: input 0 differs in leafness (or in its base's autograd flags) from the example: \
         a non-leaf view of a leaf that requires grad, compiled for a non-leaf view of a non-leaf that requires grad; \
         aot_module_simplified compiled for its example inputs and does not recompile (use aot_module for inputs \
         whose metadata changes)"
    );
    compiled.forward(&[example.view(&[4, 3]).unwrap()]).expect("the example's pattern is accepted");
}

/// `Sequential` of a linear layer, an activation, dropout in eval mode and a second
/// linear layer: PyTorch's state-dict names, gradients against finite differences.
#[test]
fn sequential_gradients_match_finite_differences() {
    use aotgrad::nn::{Activation, ActivationKind, Dropout, Sequential};
    let seq = Sequential::new()
        .push(Linear::new(4, 6, true, DType::F64, 1).unwrap())
        .and_then(|s| s.push(Activation::new(ActivationKind::Tanh)))
        .and_then(|s| s.push(Dropout::new(0.5).unwrap().eval()))
        .and_then(|s| s.push(Linear::new(6, 3, true, DType::F64, 2).unwrap()))
        .unwrap();
    assert_eq!(seq.len(), 4);
    assert_eq!(seq.store().names(), vec!["0.weight", "0.bias", "3.weight", "3.bias"]);
    let x = data(&[5, 4], DType::F64, 3, 1.0);
    check_against_finite_differences(Arc::new(seq), &[x], &[5, 3], 8);
}

/// `Dropout` in training mode draws a fresh mask per call from the thread's generator,
/// compiled exactly as eagerly; in eval mode it is the identity.
#[test]
fn dropout_layer_trains_and_evaluates() {
    use aotgrad::nn::Dropout;
    use aotgrad::trace::manual_seed;
    let x = Tensor::ones(&[4, 8], DType::F64).unwrap();
    let d: Arc<dyn Module> = Arc::new(Dropout::new(0.25).unwrap());
    manual_seed(5);
    let e1 = vals(&d.forward_eager(std::slice::from_ref(&x)).unwrap()[0]);
    let e2 = vals(&d.forward_eager(std::slice::from_ref(&x)).unwrap()[0]);
    assert_ne!(e1, e2, "a fresh mask per call");
    assert!(e1.iter().all(|v| *v == 0.0 || (*v - 1.0 / 0.75).abs() < 1e-12));
    let compiled = aot_module(d, AotConfig::default()).unwrap();
    manual_seed(5);
    let c1 = vals(&compiled.call(std::slice::from_ref(&x)).unwrap()[0]);
    let c2 = vals(&compiled.call(std::slice::from_ref(&x)).unwrap()[0]);
    assert_eq!((c1, c2), (e1, e2));
    let eval: Arc<dyn Module> = Arc::new(Dropout::new(0.25).unwrap().eval());
    assert_eq!(
        vals(&aot_module(eval, AotConfig::default()).unwrap().call(std::slice::from_ref(&x)).unwrap()[0]),
        vals(&x)
    );
    assert!(Dropout::new(1.5).unwrap_err().to_string().contains("between 0 and 1"));
}

/// A small CNN as a `Sequential`: conv (padding 1) → ReLU → max pool → conv with two
/// groups and stride 2 → flatten → linear. Every parameter's gradient against finite
/// differences, through `aot_module`'s training path.
#[test]
fn cnn_gradients_match_finite_differences() {
    use aotgrad::nn::{Activation, ActivationKind, Conv2d, Flatten, MaxPool2d, Sequential};
    use aotgrad::trace::Conv2dOpts;
    let f = DType::F64;
    let cnn = Sequential::new()
        .push(Conv2d::new(2, 4, [3, 3], Conv2dOpts::default().padding(1), true, f, 1).unwrap())
        .and_then(|s| s.push(Activation::new(ActivationKind::Relu)))
        .and_then(|s| s.push(MaxPool2d::new([2, 2])))
        .and_then(|s| {
            s.push(Conv2d::new(4, 4, [2, 2], Conv2dOpts::default().groups(2).stride(2), false, f, 2).unwrap())
        })
        .and_then(|s| s.push(Flatten::new()))
        .and_then(|s| s.push(Linear::new(4, 3, true, f, 3).unwrap()))
        .unwrap();
    assert_eq!(cnn.store().names(), vec!["0.weight", "0.bias", "3.weight", "5.weight", "5.bias"]);
    // [2, 2, 4, 4] -> conv [2, 4, 4, 4] -> pool [2, 4, 2, 2] -> conv [2, 4, 1, 1] -> flatten [2, 4] -> [2, 3].
    let x = data(&[2, 2, 4, 4], DType::F64, 4, 1.0).requires_grad(true).unwrap();
    check_against_finite_differences(Arc::new(cnn), &[x], &[2, 3], 12);
}

/// `BatchNorm2d` in training mode: gradients of its scale and shift, and of the input,
/// against finite differences (the running statistics change at every call and do not
/// enter the training-mode output).
#[test]
fn batch_norm_gradients_match_finite_differences() {
    use aotgrad::nn::BatchNorm2d;
    let bn = BatchNorm2d::new(3, DType::F64).unwrap();
    let x = data(&[2, 3, 2, 2], DType::F64, 5, 1.0).requires_grad(true).unwrap();
    check_against_finite_differences(Arc::new(bn), &[x], &[2, 3, 2, 2], usize::MAX);
}

/// The CNN of PyTorch tutorials: (`Conv2d` → `BatchNorm2d` → ReLU → `MaxPool2d`) × 2,
/// then a linear head. Gradients against finite differences, and the running
/// statistics after two compiled training calls equal to eager's after two calls.
#[test]
fn cnn_with_batch_norm_updates_running_statistics_as_eager() {
    use aotgrad::nn::{Activation, ActivationKind, BatchNorm2d, Conv2d, Flatten, MaxPool2d, Sequential};
    use aotgrad::trace::Conv2dOpts;
    let f = DType::F64;
    let make = || {
        let same = Conv2dOpts::default().padding(1);
        Sequential::new()
            .push(Conv2d::new(2, 4, [3, 3], same, true, f, 1).unwrap())
            .and_then(|s| s.push(BatchNorm2d::new(4, f).unwrap()))
            .and_then(|s| s.push(Activation::new(ActivationKind::Relu)))
            .and_then(|s| s.push(MaxPool2d::new([2, 2])))
            .and_then(|s| s.push(Conv2d::new(4, 4, [3, 3], same, true, f, 2).unwrap()))
            .and_then(|s| s.push(BatchNorm2d::new(4, f).unwrap()))
            .and_then(|s| s.push(Activation::new(ActivationKind::Relu)))
            .and_then(|s| s.push(MaxPool2d::new([2, 2])))
            .and_then(|s| s.push(Flatten::new()))
            .and_then(|s| s.push(Linear::new(4, 3, true, f, 3).unwrap()))
            .unwrap()
    };
    // [2, 2, 4, 4] -> conv, bn [2, 4, 4, 4] -> pool [2, 4, 2, 2] -> conv, bn -> pool [2, 4, 1, 1] -> [2, 3].
    let x = data(&[2, 2, 4, 4], DType::F64, 4, 1.0);
    check_against_finite_differences(Arc::new(make()), std::slice::from_ref(&x), &[2, 3], 12);
    let eager = make();
    let m = Arc::new(make());
    let compiled = aot_module(m.clone(), AotConfig::default().no_cache()).unwrap();
    for _ in 0..2 {
        eager.forward_eager(std::slice::from_ref(&x)).unwrap();
        let (_, back) = compiled.forward(std::slice::from_ref(&x)).unwrap();
        back.backward(&[Tensor::ones(&[2, 3], DType::F64).unwrap()]).unwrap();
    }
    let buffers: Vec<String> = eager.store().buffers().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(buffers.len(), 6, "{buffers:?}");
    for name in &buffers {
        let (e, c) = (vals(eager.store().get(name).unwrap()), vals(m.store().get(name).unwrap()));
        assert_close(name, &c, &e, 1e-12, 1e-12);
    }
    assert_eq!(vals(m.store().get("1.num_batches_tracked").unwrap()), vec![2.0]);
}

/// `x *= w` in place on the user's input, then `sum(3 x)`.
struct ScaleInPlace {
    store: ParamStore,
}

impl Module for ScaleInPlace {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        inputs[0].mul_(p.get("w")?)?;
        Ok(vec![inputs[0].mul(3.0)?.sum_all()?])
    }
}

/// `ModuleBackward::backward_with` takes what `PendingBackward::backward_with` takes:
/// optional output gradients and gradients of changed inputs' new values, indexed by
/// user input. With `g` for the new `x = x0 * w`: `dw = (3 + g) x0`, `dx0 = (3 + g) w`.
#[test]
fn module_backward_with_takes_gradients_of_changed_inputs() {
    let mut store = ParamStore::new();
    store.add_param("w", Tensor::from_f64(&[0.5, -1.0, 2.0], &[3], DType::F64).unwrap()).unwrap();
    let m = aot_module(Arc::new(ScaleInPlace { store }), AotConfig::default().no_cache()).unwrap();
    let leaf = Tensor::from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap().requires_grad(true).unwrap();
    let x = leaf.mul(1.0).unwrap();
    let (outs, back) = m.forward(std::slice::from_ref(&x)).unwrap();
    assert_eq!(outs[0].to_vec_f64().unwrap(), vec![3.0 * (0.5 - 2.0 + 6.0)]);
    assert_eq!(x.to_vec_f64().unwrap(), vec![0.5, -2.0, 6.0]);
    let g = Tensor::from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let grads = back.backward_with(&[Some(outs[0].ones_like().unwrap())], &[(0, g)]).unwrap();
    assert_eq!(grads.param("w").unwrap().to_vec_f64().unwrap(), vec![4.0, 10.0, 18.0]);
    assert_eq!(grads.inputs[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![2.0, -5.0, 12.0]);
}

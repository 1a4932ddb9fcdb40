//! Whole models through the facade on the wgpu backend, against the compiled CPU
//! backend: forward values and every parameter gradient of the MLP and the
//! transformer block, and a few SGD steps of a classifier (losses equal within
//! tolerance at every step).

mod gpu;

use aotgrad::nn::{Mlp, Module, Sgd, TransformerBlock};
use aotgrad::prelude::*;
use aotgrad_wgpu::WgpuBackend;
use std::sync::Arc;

fn wgpu_config() -> AotConfig {
    AotConfig { backend: Arc::new(WgpuBackend::new()), ..AotConfig::default() }
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: wgpu {g}, cpu {w}");
    }
}

/// Forward and backward of `sum(out * weights)` on both backends.
fn compare(m: Arc<dyn Module>, x: &Tensor, tol: f64) {
    let run = |config: AotConfig| {
        let compiled = aot_module(m.clone(), config).expect("aot_module");
        let (outs, back) = compiled.forward(std::slice::from_ref(x)).expect("forward");
        let w = Tensor::randn(&outs[0].sizes().unwrap(), DType::F32, 5).unwrap();
        let grads = back.backward(&[w]).expect("backward");
        (outs[0].to_vec_f64().unwrap(), grads)
    };
    let (cpu_out, cpu_grads) = run(AotConfig::default().threads(1));
    let (gpu_out, gpu_grads) = run(wgpu_config());
    close("forward", &gpu_out, &cpu_out, tol);
    assert_eq!(gpu_grads.params.len(), cpu_grads.params.len());
    for ((name, g), (_, c)) in gpu_grads.params.iter().zip(&cpu_grads.params) {
        close(name, &g.to_vec_f64().unwrap(), &c.to_vec_f64().unwrap(), tol);
    }
}

#[test]
fn mlp_forward_and_backward_match_the_cpu_backend() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let m = Mlp::new(&[24, 32, 32, 8], DType::F32, 1).unwrap();
    compare(Arc::new(m), &Tensor::randn(&[6, 24], DType::F32, 2).unwrap(), 1e-4);
}

#[test]
fn transformer_block_forward_and_backward_match_the_cpu_backend() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let blk = TransformerBlock::new(16, 2, DType::F32, 3).unwrap();
    compare(Arc::new(blk), &Tensor::randn(&[2, 5, 16], DType::F32, 4).unwrap(), 2e-4);
}

/// `cross_entropy(mlp(x), labels)`: the main job's loss on a small MLP classifier.
struct Classifier {
    mlp: Mlp,
}

impl Module for Classifier {
    fn store(&self) -> &aotgrad::nn::ParamStore {
        self.mlp.store()
    }
    fn forward(&self, p: &aotgrad::nn::Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        let logits = self.mlp.apply(p, &inputs[0])?;
        Ok(vec![logits.cross_entropy(&inputs[1])?])
    }
}

#[test]
fn sgd_steps_give_the_cpu_backends_losses() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let x = Tensor::randn(&[16, 12], DType::F32, 7).unwrap();
    let labels = Tensor::from_i64(&(0..16).map(|i| i % 4).collect::<Vec<i64>>(), &[16]).unwrap();
    let train = |config: AotConfig| {
        let m = Arc::new(Classifier { mlp: Mlp::new(&[12, 20, 4], DType::F32, 11).unwrap() });
        let compiled = aot_module(m.clone(), config).unwrap();
        let sgd = Sgd::new(0.5);
        let mut losses = Vec::new();
        for _ in 0..5 {
            let (outs, back) = compiled.forward(&[x.clone(), labels.clone()]).unwrap();
            losses.push(outs[0].item().unwrap());
            let grads = back.backward(&[Tensor::ones(&[], DType::F32).unwrap()]).unwrap();
            sgd.step(m.store(), &grads.params).unwrap();
        }
        losses
    };
    let cpu = train(AotConfig::default().threads(1));
    let gpu = train(wgpu_config());
    close("losses", &gpu, &cpu, 1e-4);
    assert!(cpu[4] < cpu[0], "the model learns: {cpu:?}");
}

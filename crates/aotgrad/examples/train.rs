//! The main job: train a small MLP regressor on generated data through
//! `aot_module`'s training path (compiled forward, partitioned compiled backward,
//! parameter gradients by name, an SGD step in place), printing the loss every few
//! steps. Exits non-zero unless the loss fell to under a quarter of its first value.
//!
//! ```sh
//! cargo run --release -p aotgrad --example train
//! ```

use aotgrad::nn::{Linear, Mlp, Module, ParamStore, Params, Sgd};
use aotgrad::prelude::*;
use std::sync::Arc;
use std::time::Instant;

const FEATURES: usize = 16;
const HIDDEN: usize = 64;
const BATCH: usize = 256;
const STEPS: usize = 300;
const LR: f64 = 0.3;

/// `mse(head(mlp(x)), y)`: a 2-layer GELU MLP and a linear head, the loss fused in.
struct Regressor {
    store: ParamStore,
    body: Mlp,
    head: Linear,
}

impl Regressor {
    fn new(seed: u64) -> aotgrad::Result<Regressor> {
        let body = Mlp::new(&[FEATURES, HIDDEN, HIDDEN], DType::F32, seed)?;
        let head = Linear::new(HIDDEN, 1, true, DType::F32, seed + 1)?;
        let mut store = ParamStore::new();
        store.add_child("body", body.store())?;
        store.add_child("head", head.store())?;
        Ok(Regressor { store, body, head })
    }
}

impl Module for Regressor {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::trace::Result<Vec<Tensor>> {
        let h = self.body.apply(&p.scope("body"), &inputs[0])?;
        let pred = self.head.apply(&p.scope("head"), &h)?;
        Ok(vec![pred.mse_loss(&inputs[1])?])
    }
}

/// Inputs uniform in `[-1, 1)` and a smooth nonlinear target `sin(x·a) + 0.5·(x·b)²`.
fn generated_data() -> aotgrad::Result<(Tensor, Tensor)> {
    let x = Tensor::rand(&[BATCH, FEATURES], DType::F32, 1)?.mul(2.0)?.sub(1.0)?;
    let a = Tensor::randn(&[FEATURES, 1], DType::F32, 2)?.mul(0.5)?;
    let b = Tensor::randn(&[FEATURES, 1], DType::F32, 3)?.mul(0.25)?;
    let y = x.matmul(&a)?.sin()?.add(&x.matmul(&b)?.pow(2.0)?.mul(0.5)?)?;
    Ok((x, y))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    aotgrad::init_logging();
    let model = Arc::new(Regressor::new(0)?);
    let (x, y) = generated_data()?;
    let config = AotConfig { name: "train".into(), ..AotConfig::default() };
    let compiled = aot_module(model.clone(), config)?;
    let sgd = Sgd::new(LR);
    println!(
        "training a {FEATURES}-{HIDDEN}-{HIDDEN}-1 GELU MLP ({} parameters) on {BATCH} generated samples, SGD lr {LR}",
        model.store().num_param_elements()
    );

    let start = Instant::now();
    let mut first = None;
    let mut last = f64::NAN;
    for step in 0..STEPS {
        let t = Instant::now();
        let (outs, back) = compiled.forward(&[x.clone(), y.clone()])?;
        let grads = back.backward(&[Tensor::ones(&[], DType::F32)?])?;
        if step == 0 {
            println!("step    0: compiled forward + backward in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
        }
        sgd.step(model.store(), &grads.params)?;
        last = outs[0].item()?;
        first.get_or_insert(last);
        if step % 25 == 0 || step + 1 == STEPS {
            println!("step {step:4}: loss {last:.6}");
        }
    }
    let first = first.unwrap_or(f64::NAN);
    println!(
        "{STEPS} steps in {:.2} s ({} compiled specialization(s)); loss {first:.6} -> {last:.6}",
        start.elapsed().as_secs_f64(),
        compiled.function().num_compiled()
    );
    if last.is_nan() || last >= 0.25 * first {
        eprintln!("error: the loss did not fall to under a quarter of its first value");
        std::process::exit(1);
    }
    println!("ok: the loss fell by {:.1}x", first / last);
    Ok(())
}

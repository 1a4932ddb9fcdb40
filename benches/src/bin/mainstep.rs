//! Where one main-job training step's time goes (dev): `cargo run --release -p aotgrad-benches --bin mainstep`;
//! `MODEL=mlp|cnn|vit`, `THREADS=n`, `STEPS=n`. Times each phase of `aotgrad train`'s step loop
//! (batch, forward, backward, optimizer, loss read) on real Fashion-MNIST batches.
use aotgrad::nn::{AdamW, Module, Optimizer};
use aotgrad::prelude::*;
use aotgrad_cli::models::ModelKind;
use aotgrad_cli::train::{batch, epoch_order};
use std::sync::Arc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let model = match std::env::var("MODEL").as_deref() {
        Ok("cnn") => ModelKind::Cnn,
        Ok("vit") => ModelKind::Vit,
        _ => ModelKind::Mlp,
    };
    let threads: usize = std::env::var("THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let steps: usize = std::env::var("STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let data = aotgrad_cli::data::load(&aotgrad_cli::data::find_dir(None)?)?;
    let m = Arc::new(model.build(0)?);
    let config = AotConfig::default().threads(threads).no_cache();
    let f = aot_module(m.clone(), config.clone())?;
    let mut opt = AdamW::with(2e-3, (0.9, 0.999), 1e-8, 0.05)?.with_cache(None).with_backend(config.backend);
    let one = Tensor::ones(&[], DType::F32)?;
    let order = epoch_order(data.train.len(), 0, 0);
    let mut t = [0.0f64; 5];
    let bs = 128;
    for s in 0..steps + 20 {
        let s0 = Instant::now();
        let (x, y) = batch(&data.train, &order[s * bs..(s + 1) * bs])?;
        let s1 = Instant::now();
        let (outs, back) = f.forward(&[x, y])?;
        let s2 = Instant::now();
        let grads = back.backward_with(&[Some(one.clone()), None], &[])?;
        let s3 = Instant::now();
        opt.step(m.store(), &grads.params)?;
        let s4 = Instant::now();
        let _ = outs[0].item()?;
        let s5 = Instant::now();
        if s == 10 {
            aotgrad_cpu::wait_for_jit_idle(std::time::Duration::from_secs(10));
        }
        if s >= 20 {
            for (k, (a, b)) in [(s0, s1), (s1, s2), (s2, s3), (s3, s4), (s4, s5)].into_iter().enumerate() {
                t[k] += (b - a).as_secs_f64();
            }
        }
    }
    let per = |x: f64| x * 1e3 / steps as f64;
    let total: f64 = t.iter().sum();
    println!(
        "{model:?} threads {threads}: step {:.3} ms ({:.0} samples/s): batch {:.3} · forward {:.3} · backward {:.3} · optimizer {:.3} · item {:.3}",
        per(total),
        (steps * bs) as f64 / total,
        per(t[0]),
        per(t[1]),
        per(t[2]),
        per(t[3]),
        per(t[4])
    );
    Ok(())
}

//! Functional RNG: a compiled function drawing from the global generator takes the
//! generator state as graph inputs, so it draws exactly what eager mode draws, fresh
//! values at every call, and its forward and backward agree on the values.

use aotgrad::prelude::*;
use aotgrad::trace::{manual_seed, rng_state, RngSeed};

fn f(a: &[Tensor]) -> aotgrad::trace::Result<Vec<Tensor>> {
    let noise = Tensor::rand(&[3, 4], DType::F64, RngSeed::Global)?;
    Ok(vec![a[0].dropout(0.5, true, RngSeed::Global)?.add(&noise)?])
}

#[test]
fn compiled_calls_draw_what_eager_draws() -> Result<(), Box<dyn std::error::Error>> {
    let x = Tensor::ones(&[3, 4], DType::F64)?;
    manual_seed(11);
    let e1 = f(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    let e2 = f(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    let after_eager = rng_state();
    assert_ne!(e1, e2, "two eager calls draw different values");

    let compiled = aot_function(f, AotConfig::default())?;
    manual_seed(11);
    let c1 = compiled.call(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    let c2 = compiled.call(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    assert_eq!(compiled.num_compiled(), 1, "the generator state is an input, not a specialization");
    assert_eq!((c1, c2), (e1, e2));
    assert_eq!(rng_state(), after_eager, "the generator advanced exactly as in eager mode");

    let text = compiled.compiled_graphs()[0].to_string();
    assert!(text.contains("\"rng_seed\"") && text.contains("\"rng_base\""), "{text}");
    Ok(())
}

#[test]
fn fixed_seeds_stay_specialized_and_reproducible() -> Result<(), Box<dyn std::error::Error>> {
    let g = |a: &[Tensor]| Ok(vec![a[0].dropout(0.5, true, 5)?]);
    let compiled = aot_function(g, AotConfig::default())?;
    let x = Tensor::ones(&[64], DType::F32)?;
    let a = compiled.call(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    let b = compiled.call(std::slice::from_ref(&x))?[0].to_vec_f64()?;
    assert_eq!(a, b);
    assert_eq!(a, x.dropout(0.5, true, 5)?.to_vec_f64()?);
    assert!(!compiled.compiled_graphs()[0].to_string().contains("rng_seed"));
    Ok(())
}

#[test]
fn backward_sees_the_forward_mask() -> Result<(), Box<dyn std::error::Error>> {
    // loss = sum(dropout(x * w)): d loss / d w = x * mask / (1 - p), with the mask of
    // this very call (the recomputation-free partition saves it, and a global draw is
    // never recomputed with other values).
    let h = |a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.dropout(0.25, true, RngSeed::Global)?.sum_all()?]);
    let compiled = aot_function(h, AotConfig::default())?;
    let x = Tensor::from_f64(&(1..=16).map(|v| v as f64).collect::<Vec<_>>(), &[16], DType::F64)?;
    let w = Tensor::ones(&[16], DType::F64)?.requires_grad(true)?;
    manual_seed(2);
    for _ in 0..2 {
        let state = rng_state();
        let (outs, pending) = compiled.forward(&[x.clone(), w.clone()])?;
        let grads = pending.backward(&[outs[0].ones_like()?])?;
        let gw = grads[1].as_ref().ok_or("no grad for w")?.to_vec_f64()?;
        // Replay the same draw eagerly to get the mask.
        let after = rng_state();
        aotgrad::trace::set_rng_state(state.0, state.1);
        let mask = no_grad(|| Tensor::ones(&[16], DType::F64)?.dropout(0.25, true, RngSeed::Global))?.to_vec_f64()?;
        aotgrad::trace::set_rng_state(after.0, after.1);
        let xs = x.to_vec_f64()?;
        for i in 0..16 {
            assert!((gw[i] - xs[i] * mask[i]).abs() < 1e-12, "element {i}: {} vs {}", gw[i], xs[i] * mask[i]);
        }
        let loss: f64 = (0..16).map(|i| xs[i] * mask[i]).sum();
        assert!((outs[0].item()? - loss).abs() < 1e-9);
    }
    Ok(())
}

//! Functional RNG: a compiled function drawing from the global generator takes the
//! generator state as graph inputs, so it draws exactly what eager mode draws, fresh
//! values at every call, and its forward and backward agree on the values.

use aotgrad::prelude::*;
use aotgrad::trace::{manual_seed, rng_state, RngSeed};

fn f(a: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
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

fn counts(samples: &[i64], n: usize) -> Vec<f64> {
    let mut c = vec![0.0; n];
    for &s in samples {
        c[s as usize] += 1.0;
    }
    c.iter().map(|x| x / samples.len() as f64).collect()
}

#[test]
fn multinomial_draws_follow_the_weights() -> Result<(), Box<dyn std::error::Error>> {
    // Unnormalized weights: 0.1 : 0 : 0.6 : 0.3.
    let p = Tensor::from_f64(&[1.0, 0.0, 6.0, 3.0], &[4], DType::F32)?;
    let s = p.multinomial(20_000, true, 5)?;
    assert_eq!((s.dtype(), s.sizes()?), (DType::I64, vec![20_000]));
    let f = counts(&s.to_vec_i64()?, 4);
    assert_eq!(f[1], 0.0, "a zero weight is never drawn");
    for (got, want) in f.iter().zip([0.1, 0.0, 0.6, 0.3]) {
        assert!((got - want).abs() < 0.015, "frequencies {f:?}");
    }
    // Without replacement: distinct categories; the first draw of each row follows the
    // weights, and a row of as many samples as positive weights never draws the zero.
    let rows = Tensor::from_f64(&[1.0, 0.0, 6.0, 3.0].repeat(4000), &[4000, 4], DType::F64)?;
    let s = rows.multinomial(3, false, 9)?;
    assert_eq!(s.sizes()?, vec![4000, 3]);
    let v = s.to_vec_i64()?;
    for r in v.chunks(3) {
        let mut r = r.to_vec();
        r.sort();
        assert_eq!(r, vec![0, 2, 3]);
    }
    let first: Vec<i64> = v.chunks(3).map(|r| r[0]).collect();
    let f = counts(&first, 4);
    for (got, want) in f.iter().zip([0.1, 0.0, 0.6, 0.3]) {
        assert!((got - want).abs() < 0.03, "first-draw frequencies {f:?}");
    }
    Ok(())
}

#[test]
fn multinomial_compiled_draws_what_eager_draws_and_bad_weights_are_errors() -> Result<(), Box<dyn std::error::Error>> {
    let g = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].multinomial(6, true, RngSeed::Global)?, a[0].multinomial(2, false, RngSeed::Global)?])
    };
    let p = Tensor::from_f64(&[0.2, 0.3, 0.5, 1.0, 1.0, 0.0], &[2, 3], DType::F64)?;
    manual_seed(3);
    let eager = g(std::slice::from_ref(&p))?;
    let compiled = aot_function(g, AotConfig::default())?;
    manual_seed(3);
    let got = compiled.call(std::slice::from_ref(&p))?;
    for (e, c) in eager.iter().zip(&got) {
        assert_eq!(e.to_vec_i64()?, c.to_vec_i64()?);
        assert_eq!(e.sizes()?, c.sizes()?);
    }
    let err = |t: &Tensor, n: usize, repl: bool| t.multinomial(n, repl, 0).unwrap_err().to_string();
    let neg = Tensor::from_f64(&[0.5, -0.1], &[2], DType::F64)?;
    assert!(err(&neg, 1, true).contains("element < 0"));
    let zero = Tensor::from_f64(&[0.0, 0.0], &[2], DType::F64)?;
    assert!(err(&zero, 1, true).contains("sum of probabilities"));
    let one = Tensor::from_f64(&[0.0, 2.0, 0.0], &[3], DType::F64)?;
    assert!(err(&one, 2, false).contains("not enough non-negative"));
    assert!(err(&one, 4, false).contains("n_sample (4) > prob_dist.size(-1) (3)"));
    assert!(err(&Tensor::ones(&[2, 2, 2], DType::F64)?, 1, true).contains("1 or 2 dim"));
    assert!(err(&one, 0, true).contains("num_samples = 0"));
    Ok(())
}

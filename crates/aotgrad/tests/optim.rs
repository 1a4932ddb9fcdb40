//! Optimizers, the learning-rate schedule and checkpoints: AdamW against steps
//! computed by hand in f64, the schedule's shape, safetensors round trips and their
//! errors.

use aotgrad::nn::{checkpoint, AdamW, Linear, Module, Optimizer, ParamStore, Sgd, WarmupCosine};
use aotgrad::prelude::*;

fn store_with(values: &[f64]) -> ParamStore {
    let mut store = ParamStore::new();
    store.add_param("w", Tensor::from_f64(values, &[values.len()], DType::F32).unwrap()).unwrap();
    store
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "got {got:?}, want {want:?}");
    }
}

/// AdamW in f64, written out from its definition (PyTorch's `torch.optim.AdamW`).
fn adamw_reference(p: &mut [f64], grads: &[Vec<f64>], lr: f64, b1: f64, b2: f64, eps: f64, wd: f64) {
    let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
    for (t, g) in grads.iter().enumerate() {
        let t = (t + 1) as f64;
        for i in 0..p.len() {
            p[i] *= 1.0 - lr * wd;
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let mhat = m[i] / (1.0 - b1.powf(t));
            let vhat = v[i] / (1.0 - b2.powf(t));
            p[i] -= lr * mhat / (vhat.sqrt() + eps);
        }
    }
}

#[test]
fn adamw_first_step_by_hand() {
    // Step 1: m̂ = g and v̂ = g², so the update is lr·g/(|g| + eps) = ±lr (for eps ≪ |g|),
    // after the decay p·(1 − lr·wd). p = [1, -2, 0.5], g = [0.5, -4, 1e-3], lr 0.1, wd 0.1.
    let store = store_with(&[1.0, -2.0, 0.5]);
    let mut opt = AdamW::with(0.1, (0.9, 0.999), 1e-8, 0.1).unwrap();
    let g = Tensor::from_f64(&[0.5, -4.0, 1e-3], &[3], DType::F32).unwrap();
    opt.step(&store, &[("w".into(), g)]).unwrap();
    let want = [1.0 * 0.99 - 0.1, -2.0 * 0.99 + 0.1, 0.5 * 0.99 - 0.1 * 1e-3 / (1e-3 + 1e-8)];
    close(&store.params()[0].1.to_vec_f64().unwrap(), &want, 1e-6);
    let (m, v) = opt.moments("w").unwrap();
    close(&m.to_vec_f64().unwrap(), &[0.05, -0.4, 1e-4], 1e-6);
    close(&v.to_vec_f64().unwrap(), &[0.00025, 0.016, 1e-9], 1e-5);
    assert_eq!(opt.steps(), 1);
}

#[test]
fn adamw_matches_its_definition_over_many_steps() {
    let p0 = [0.3, -1.2, 2.5, 0.0, -0.7];
    let grads: Vec<Vec<f64>> =
        (0..12).map(|t| (0..5).map(|i| ((t * 7 + i * 3) % 11) as f64 / 5.0 - 1.0).collect()).collect();
    let store = store_with(&p0);
    let mut opt = AdamW::with(0.05, (0.8, 0.99), 1e-6, 0.02).unwrap();
    for (t, g) in grads.iter().enumerate() {
        // A learning rate change between steps (what a schedule does) must not recompile
        // and must take effect; the reference uses the same constant rate, so only
        // change it to the same value here and check the count below.
        opt.set_lr(0.05);
        let gt = Tensor::from_f64(g, &[5], DType::F32).unwrap();
        opt.step(&store, &[("w".into(), gt)]).unwrap();
        assert_eq!(opt.steps(), t as u64 + 1);
    }
    let mut want = p0.to_vec();
    adamw_reference(&mut want, &grads, 0.05, 0.8, 0.99, 1e-6, 0.02);
    close(&store.params()[0].1.to_vec_f64().unwrap(), &want, 1e-5);
}

#[test]
fn adamw_learning_rate_changes_take_effect() {
    let store = store_with(&[1.0]);
    let mut opt = AdamW::with(0.5, (0.9, 0.999), 0.0, 0.0).unwrap();
    let g = || Tensor::from_f64(&[2.0], &[1], DType::F32).unwrap();
    opt.step(&store, &[("w".into(), g())]).unwrap(); // -0.5 (a constant gradient: m̂/sqrt(v̂) = 1)
    opt.set_lr(0.25);
    opt.step(&store, &[("w".into(), g())]).unwrap(); // -0.25
    close(&store.params()[0].1.to_vec_f64().unwrap(), &[0.25], 1e-6);
}

#[test]
fn adamw_rejects_bad_hyperparameters_and_gradients() {
    assert!(AdamW::with(-1.0, (0.9, 0.999), 1e-8, 0.0).unwrap_err().to_string().contains("learning rate"));
    assert!(AdamW::with(0.1, (1.0, 0.999), 1e-8, 0.0).unwrap_err().to_string().contains("betas"));
    assert!(AdamW::with(0.1, (0.9, 0.999), 1e-8, -0.1).unwrap_err().to_string().contains("weight decay"));
    let store = store_with(&[1.0, 2.0]);
    let mut opt = AdamW::new(0.1);
    let g = Tensor::from_f64(&[1.0], &[1], DType::F32).unwrap();
    let e = opt.step(&store, &[("w".into(), g.clone())]).unwrap_err().to_string();
    assert!(e.contains("gradient of `w` has shape [1], parameter has [2]"), "{e}");
    let e = opt.step(&store, &[("nope".into(), g)]).unwrap_err().to_string();
    assert!(e.contains("no parameter named `nope`"), "{e}");
}

#[test]
fn warmup_cosine_schedule() {
    let s = WarmupCosine { peak_lr: 1.0, final_lr: 0.1, warmup_steps: 4, total_steps: 14 };
    close(&[s.lr_at(0), s.lr_at(1), s.lr_at(3)], &[0.25, 0.5, 1.0], 1e-12);
    // Halfway through the decay: the mean of peak and final.
    close(&[s.lr_at(9)], &[0.55], 1e-12);
    close(&[s.lr_at(14), s.lr_at(100)], &[0.1, 0.1], 1e-12);
    let lrs: Vec<f64> = (4..14).map(|t| s.lr_at(t)).collect();
    assert!(lrs.windows(2).all(|w| w[1] < w[0]), "decays monotonically: {lrs:?}");
    let none = WarmupCosine { peak_lr: 2.0, final_lr: 0.0, warmup_steps: 0, total_steps: 2 };
    close(&[none.lr_at(0), none.lr_at(1)], &[2.0, 1.0], 1e-12);
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("aotgrad-optim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn checkpoint_round_trip_restores_parameters_and_optimizer() {
    let a = Linear::new(3, 2, true, DType::F32, 7).unwrap();
    let mut opt = AdamW::new(0.01);
    let grads: Vec<(String, Tensor)> =
        a.store().params().iter().map(|(n, p)| (n.clone(), p.ones_like().unwrap().mul(0.5).unwrap())).collect();
    opt.step(a.store(), &grads).unwrap();
    let path = tmp("roundtrip.safetensors");
    checkpoint::save(&path, a.store(), Some(&opt), &[("epoch".into(), "3".into())]).unwrap();

    let b = Linear::new(3, 2, true, DType::F32, 99).unwrap();
    let handle = b.store().params()[0].1.clone();
    let mut opt_b = AdamW::new(0.5);
    let loaded = checkpoint::load(&path, b.store(), Some(&mut opt_b)).unwrap();
    assert_eq!(loaded.metadata.get("epoch").map(String::as_str), Some("3"));
    for ((_, pa), (_, pb)) in a.store().params().iter().zip(b.store().params()) {
        assert_eq!(pa.to_vec_f64().unwrap(), pb.to_vec_f64().unwrap());
    }
    assert!(handle.same_object(&b.store().params()[0].1), "loaded in place");
    assert_eq!(opt_b.steps(), 1);
    assert_eq!(opt_b.lr(), 0.01);
    // The next step of both optimizers agrees exactly.
    opt.step(a.store(), &grads).unwrap();
    opt_b.step(b.store(), &grads).unwrap();
    for ((_, pa), (_, pb)) in a.store().params().iter().zip(b.store().params()) {
        assert_eq!(pa.to_vec_f64().unwrap(), pb.to_vec_f64().unwrap());
    }
}

#[test]
fn checkpoint_errors_name_the_file_and_tensor() {
    let a = Linear::new(3, 2, true, DType::F32, 1).unwrap();
    let path = tmp("shape.safetensors");
    checkpoint::save(&path, a.store(), Some(&Sgd::new(0.1)), &[]).unwrap();
    let other = Linear::new(4, 2, true, DType::F32, 1).unwrap();
    let e = checkpoint::load(&path, other.store(), None).unwrap_err().to_string();
    assert!(e.contains("shape.safetensors") && e.contains("`param.weight`"), "{e}");
    // Loading SGD state into AdamW is refused.
    let e = checkpoint::load(&path, a.store(), Some(&mut AdamW::new(0.1))).unwrap_err().to_string();
    assert!(e.contains("cannot load the state of a `sgd` optimizer"), "{e}");
    // A truncated file is detected.
    let bytes = std::fs::read(&path).unwrap();
    let cut = tmp("truncated.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let e = checkpoint::load(&cut, a.store(), None).unwrap_err().to_string();
    assert!(e.contains("truncated.safetensors") && e.contains("not a safetensors file"), "{e}");
    let e = checkpoint::load(&tmp("missing.safetensors"), a.store(), None).unwrap_err().to_string();
    assert!(e.contains("missing.safetensors"), "{e}");
}

#[test]
fn adam_adds_the_l2_penalty_to_the_gradient() {
    // torch.optim.Adam(weight_decay=wd): g <- g + wd * p, then the Adam update.
    let p0 = [0.5, -1.5, 2.0];
    let grads: Vec<Vec<f64>> = (0..5).map(|t| (0..3).map(|i| ((t + 2 * i) % 5) as f64 / 4.0 - 0.5).collect()).collect();
    let store = store_with(&p0);
    let mut opt = AdamW::adam(0.1, (0.9, 0.99), 1e-8, 0.3).unwrap();
    for g in &grads {
        opt.step(&store, &[("w".into(), Tensor::from_f64(g, &[3], DType::F32).unwrap())]).unwrap();
    }
    let (mut p, mut m, mut v) = (p0.to_vec(), vec![0.0; 3], vec![0.0; 3]);
    for (t, g) in grads.iter().enumerate() {
        let t = (t + 1) as f64;
        for i in 0..3 {
            let gi = g[i] + 0.3 * p[i];
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.99 * v[i] + 0.01 * gi * gi;
            p[i] -= 0.1 * (m[i] / (1.0 - 0.9f64.powf(t))) / ((v[i] / (1.0 - 0.99f64.powf(t))).sqrt() + 1e-8);
        }
    }
    close(&store.params()[0].1.to_vec_f64().unwrap(), &p, 1e-5);
    assert_eq!(opt.state().kind, "adam");
    let e = AdamW::new(0.1).load_state(&store, &opt.state()).unwrap_err().to_string();
    assert!(e.contains("cannot load the state of a `adam` optimizer"), "{e}");
}

#[test]
fn clip_grad_norm_scales_to_the_max_norm() {
    let g1 = Tensor::from_f64(&[3.0, 0.0], &[2], DType::F32).unwrap();
    let g2 = Tensor::from_f64(&[4.0], &[1], DType::F32).unwrap();
    let grads = vec![("a".to_string(), g1.clone()), ("b".to_string(), g2.clone())];
    // Norm 5; clipped to 1: every element scaled by 1 / (5 + 1e-6).
    let norm = aotgrad::nn::clip_grad_norm(&grads, 1.0).unwrap();
    assert!((norm - 5.0).abs() < 1e-12);
    close(&g1.to_vec_f64().unwrap(), &[0.6, 0.0], 1e-6);
    close(&g2.to_vec_f64().unwrap(), &[0.8], 1e-6);
    // Under the limit: untouched.
    assert!((aotgrad::nn::clip_grad_norm(&grads, 10.0).unwrap() - 1.0).abs() < 1e-5);
    close(&g2.to_vec_f64().unwrap(), &[0.8], 1e-6);
    assert!(aotgrad::nn::clip_grad_norm(&grads, -1.0).is_err());
}

#[test]
fn sgd_momentum_weight_decay_and_nesterov_match_their_definition() {
    let p0 = [1.0, -2.0];
    let grads: Vec<Vec<f64>> = vec![vec![0.5, 1.0], vec![-1.0, 0.25], vec![0.0, -0.5], vec![2.0, 1.0]];
    for nesterov in [false, true] {
        let store = store_with(&p0);
        let opt = Sgd::with(0.1, 0.9, 0.05, nesterov).unwrap();
        for g in &grads {
            opt.step(&store, &[("w".into(), Tensor::from_f64(g, &[2], DType::F32).unwrap())]).unwrap();
        }
        // torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.05, nesterov=...), by hand.
        let (mut p, mut b) = (p0.to_vec(), vec![0.0; 2]);
        for (t, g) in grads.iter().enumerate() {
            for i in 0..2 {
                let d = g[i] + 0.05 * p[i];
                b[i] = if t == 0 { d } else { 0.9 * b[i] + d };
                let step = if nesterov { d + 0.9 * b[i] } else { b[i] };
                p[i] -= 0.1 * step;
            }
        }
        close(&store.params()[0].1.to_vec_f64().unwrap(), &p, 1e-6);
        let st = Optimizer::state(&opt);
        assert_eq!(st.tensors.len(), 1, "one momentum buffer");
        close(&st.tensors[0].1.to_vec_f64().unwrap(), &b, 1e-6);
    }
    assert!(Sgd::with(0.1, 0.0, 0.0, true).unwrap_err().to_string().contains("Nesterov"));
    assert!(Sgd::with(-0.1, 0.0, 0.0, false).is_err());
}

//! Host↔device traffic of a call (its own test binary: the counters are per process).

mod gpu;

use aotgrad_cpu::CpuTensor;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{BinaryOp, CompiledGraph, DType, Graph, Op, StaticOracle, StorageId, TensorMeta, UnaryOp};
use aotgrad_wgpu::{transfers, WgpuBackend};
use std::sync::{Arc, Mutex};

/// The counters are per process: the tests of this binary take turns.
static TURN: Mutex<()> = Mutex::new(());

#[test]
fn a_call_uploads_its_inputs_once_and_reads_back_only_its_outputs() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // exp(x) feeds a reduction and a pointwise kernel: an intermediate that stays on
    // the device; two outputs come back in one submission.
    let mut g = Graph::new();
    let xm = TensorMeta::from_sizes(&[8, 16], DType::F32);
    let x = g.add_input("x", xm.clone(), StorageId(0));
    let add = |g: &mut Graph, op: Op, args: &[aotgrad_ir::ValueId]| {
        let metas: Vec<TensorMeta> = args.iter().map(|a| g.meta_of(*a).unwrap().clone()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let meta = infer(&op, &refs, &mut StaticOracle).unwrap();
        let s = g.next_storage();
        g.add_node(op, args.to_vec(), meta, s, None)
    };
    let e = add(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let s = add(&mut g, Op::Reduce { op: aotgrad_ir::ReduceOp::Sum, dims: vec![1], keepdim: true }, &[e]);
    let p = add(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs = vec![p, s];
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let data: Vec<f64> = (0..128).map(|i| (i as f64 * 0.37).sin()).collect();
    let xs = CpuTensor::from_f64(&data, &[8, 16], DType::F32).unwrap();
    let before = transfers();
    let steps = 3;
    let mut last = Vec::new();
    for _ in 0..steps {
        let outs = c.run(std::slice::from_ref(&xs)).unwrap();
        // Results stay on the device until read.
        assert!(!outs[0].storage.on_host() && !outs[1].storage.on_host());
        let rows = outs[0].to_vec_f64();
        assert!((rows[..16].iter().sum::<f64>() - 1.0).abs() < 1e-5);
        assert!(outs[0].storage.on_host() && !outs[1].storage.on_host());
        last = outs;
    }
    let t = transfers();
    // The input is uploaded whole once and stays with its storage.
    assert_eq!(t.uploads - before.uploads, 1, "one upload in all: {t:?}");
    assert_eq!(t.upload_bytes - before.upload_bytes, 128 * 4);
    // Only what was read came back: output 0, once per step.
    assert_eq!(t.readbacks - before.readbacks, steps, "only the rows read: {t:?}");
    assert_eq!(t.readback_bytes - before.readback_bytes, steps * 128 * 4);
    // One submission per call, one per readback.
    assert_eq!(t.submits - before.submits, 2 * steps, "{t:?}");

    // A result fed back in is not copied: exp(p) with p on the device.
    let before = transfers();
    let p = last.remove(0);
    let s_dev = last.remove(0);
    let again = c.run(std::slice::from_ref(&CpuTensor { storage: s_dev.storage.clone(), meta: s_dev.meta.clone() }));
    // The row sums have shape [8, 1]: not the graph's [8, 16] input.
    assert!(again.is_err());
    let outs = c.run(std::slice::from_ref(&p)).unwrap();
    let t = transfers();
    assert_eq!(t.uploads - before.uploads, 0, "a device tensor is bound, not uploaded: {t:?}");
    assert_eq!(t.readbacks - before.readbacks, 0, "{t:?}");
    let want: Vec<f64> = {
        let pv = p.to_vec_f64();
        let e: Vec<f64> = pv.iter().map(|v| v.exp()).collect();
        e.chunks(16).flat_map(|r| r.iter().map(|v| v / r.iter().sum::<f64>()).collect::<Vec<_>>()).collect()
    };
    let got = outs[0].to_vec_f64();
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{got:?}");

    // Writing the host tensor drops its device copy: the next call uploads again and
    // sees the new values.
    {
        let mut w = xs.storage.write();
        if let aotgrad_cpu::Buffer::F32(v) = &mut *w {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    let before = transfers();
    let outs = c.run(std::slice::from_ref(&xs)).unwrap();
    assert_eq!(transfers().uploads - before.uploads, 1);
    assert!(outs[0].to_vec_f64().iter().all(|v| (v - 1.0 / 16.0).abs() < 1e-6));
}

/// `mean((mlp(x) - y)^2)`: an all-f32 regression loss.
struct Regressor {
    mlp: aotgrad::nn::Mlp,
}

impl aotgrad::nn::Module for Regressor {
    fn store(&self) -> &aotgrad::nn::ParamStore {
        self.mlp.store()
    }
    fn forward(
        &self,
        p: &aotgrad::nn::Params,
        inputs: &[aotgrad::prelude::Tensor],
    ) -> aotgrad::Result<Vec<aotgrad::prelude::Tensor>> {
        let d = self.mlp.apply(p, &inputs[0])?.sub(&inputs[1])?;
        Ok(vec![d.mul(&d)?.mean(&[0, 1], false)?])
    }
}

#[test]
fn a_training_loop_reads_back_only_the_losses_it_reads() {
    use aotgrad::nn::{AdamW, Mlp, Module, Optimizer};
    use aotgrad::prelude::*;
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::randn(&[8, 12], DType::F32, 1).unwrap();
    let y = Tensor::randn(&[8, 4], DType::F32, 2).unwrap();
    let steps = 4;
    // Forward, read the loss, backward, AdamW: on `backend`, or on the CPU.
    let train = |backend: Option<Arc<dyn aotgrad_ir::Backend<CpuTensor>>>| {
        let m = Arc::new(Regressor { mlp: Mlp::new(&[12, 16, 4], DType::F32, 3).unwrap() });
        let mut config = AotConfig::default().no_cache();
        let mut opt = AdamW::new(0.05).with_cache(None);
        if let Some(b) = &backend {
            config.backend = b.clone();
            opt = opt.with_backend(b.clone());
        }
        let compiled = aot_module(m.clone(), config).unwrap();
        let before = transfers();
        let mut losses = Vec::new();
        for _ in 0..steps {
            let (outs, back) = compiled.forward(&[x.clone(), y.clone()]).unwrap();
            losses.push(outs[0].item().unwrap());
            let grads = back.backward(&[Tensor::ones(&[], DType::F32).unwrap()]).unwrap();
            opt.step(m.store(), &grads.params).unwrap();
        }
        let t = transfers();
        let params: Vec<Vec<f64>> = m.store().params().iter().map(|(_, p)| p.to_vec_f64().unwrap()).collect();
        (losses, params, (t.readbacks - before.readbacks, t.uploads - before.uploads))
    };
    let (gpu_losses, gpu_params, (readbacks, uploads)) = train(Some(Arc::new(WgpuBackend::new())));
    // The losses the loop read, and nothing else: activations, gradients, moments
    // and the updated parameters stayed on the device.
    assert_eq!(readbacks, steps as u64, "readbacks of {steps} steps");
    assert!(uploads > 0);
    let (cpu_losses, cpu_params, _) = train(None);
    for (g, c) in gpu_losses.iter().zip(&cpu_losses) {
        assert!((g - c).abs() <= 1e-4 * (1.0 + c.abs()), "losses: wgpu {gpu_losses:?}, cpu {cpu_losses:?}");
    }
    assert!(cpu_losses[steps - 1] < cpu_losses[0], "it learns: {cpu_losses:?}");
    for (g, c) in gpu_params.iter().zip(&cpu_params) {
        assert_eq!(g.len(), c.len());
        assert!(g.iter().zip(c).all(|(a, b)| (a - b).abs() <= 1e-4 * (1.0 + b.abs())));
    }
}

//! Host↔device traffic of a call (its own test binary: the counters are per process).

mod gpu;

use aotgrad_cpu::CpuTensor;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{BinaryOp, CompiledGraph, DType, Graph, Op, StaticOracle, StorageId, TensorMeta, UnaryOp};
use aotgrad_wgpu::{transfers, WgpuBackend};

#[test]
fn a_call_uploads_its_inputs_once_and_reads_back_only_its_outputs() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
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
    for _ in 0..steps {
        let outs = c.run(std::slice::from_ref(&xs)).unwrap();
        let rows = outs[0].to_vec_f64();
        assert!((rows[..16].iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
    let t = transfers();
    assert_eq!(t.uploads - before.uploads, steps, "one upload per call: {t:?}");
    assert_eq!(t.upload_bytes - before.upload_bytes, steps * 128 * 4);
    assert_eq!(t.readbacks - before.readbacks, steps * 2, "the two outputs only: {t:?}");
    assert_eq!(t.readback_bytes - before.readback_bytes, steps * (128 + 8) * 4);
    assert_eq!(t.submits - before.submits, steps, "one submission per call: {t:?}");
}

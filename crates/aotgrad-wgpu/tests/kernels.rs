//! What the wgpu backend launches: golden kernel lists (WGSL entry points and what
//! each fuses) for a pointwise chain and for the transformer block's forward and
//! backward graphs, and the errors of kernels it cannot run.

#[path = "../../aotgrad-cpu/tests/common/mod.rs"]
mod common;
#[path = "../../aotgrad-cpu/tests/differential/mod.rs"]
mod differential;
mod gpu;

use aotgrad::nn::TransformerBlock;
use aotgrad::prelude::*;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::CompiledGraph;
use aotgrad_ir::{BinaryOp, Graph, Op, UnaryOp};
use aotgrad_wgpu::WgpuBackend;
use differential::{input, m, node, pointwise_graph, tensor_for, Suite};
use expect_test::expect;
use std::sync::Arc;

#[test]
fn a_pointwise_chain_is_one_kernel() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    // x.sin().mul(2).add(y).relu()
    let g = pointwise_graph();
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    expect![[r#"
        k0_pointwise: pointwise sin mul add relu over [4, 8]
    "#]]
    .assert_eq(&c.kernel_list().unwrap());
    let wgsl = c.wgsl_sources().unwrap();
    assert_eq!(wgsl.len(), 1);
    assert!(wgsl[0].contains("fn k0_pointwise("), "{}", wgsl[0]);
    let suite = Suite { backends: vec![("wgpu".into(), Box::new(WgpuBackend::new()))], f64: false, tol_scale: 20.0 };
    let ins: Vec<_> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    suite.check(&g, &ins, 1e-6);
    // Device memory of a call: no slots (nothing intermediate), one output.
    assert_eq!(c.device_bytes(), Some((0, 4 * 8 * 4)));
}

#[test]
fn transformer_block_forward_and_backward_kernels() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let blk = Arc::new(TransformerBlock::new(16, 2, DType::F32, 3).unwrap());
    let compiled = aot_module(blk, AotConfig::default().no_cache()).unwrap();
    let x = Tensor::randn(&[2, 4, 16], DType::F32, 4).unwrap();
    let (_, back) = compiled.forward(std::slice::from_ref(&x)).unwrap();
    drop(back);
    let graphs = compiled.function().training_graphs();
    assert_eq!(graphs.len(), 1);
    let (fw, bw, _) = &graphs[0];
    let list = |g: &Graph| {
        let c = WgpuBackend::new().compile_graph(g).unwrap();
        assert!(c.fallback_reason().is_none(), "{:?}", c.fallback_reason());
        c.kernel_list().unwrap()
    };
    expect![[r#"
        k0_0_reduce: reduce mean over [2, 4, 16] reducing [2]
        k0_1_reduce: reduce mean of sub mul over [2, 4, 16] reducing [2]
        k0_2_pointwise: pointwise add rsqrt over [2, 4, 1]
        k0_3_pointwise: pointwise sub mul mul add over [2, 4, 16]
        k1_matmul: matmul [8, 16] x [16, 48] + epilogue add
        k2_pointwise: pointwise copy over [2, 2, 4, 8]
        k3_pointwise: pointwise copy over [2, 2, 8, 4]
        k4_matmul: matmul [4, 4, 8] x [4, 8, 4]
        k5_0_reduce: reduce amax of mul over [2, 2, 4, 4] reducing [3]
        k5_1_pointwise: pointwise mul sub exp over [2, 2, 4, 4]
        k5_2_reduce: reduce sum over [2, 2, 4, 4] reducing [3]
        k5_3_pointwise: pointwise reciprocal over [2, 2, 4, 1]
        k5_4_pointwise: pointwise mul over [2, 2, 4, 4]
        k6_pointwise: pointwise copy over [2, 2, 4, 8]
        k7_matmul: matmul [4, 4, 4] x [4, 4, 8]
        k8_pointwise: pointwise copy over [2, 4, 2, 8]
        k9_matmul: matmul [8, 16] x [16, 16] + epilogue add add
        k10_0_reduce: reduce mean over [2, 4, 16] reducing [2]
        k10_1_pointwise: pointwise sub over [2, 4, 16]
        k10_2_reduce: reduce mean of mul over [2, 4, 16] reducing [2]
        k10_3_pointwise: pointwise add rsqrt over [2, 4, 1]
        k10_4_pointwise: pointwise mul mul add over [2, 4, 16]
        k11_matmul: matmul [8, 16] x [16, 64] + epilogue add mul erf add mul mul
        k12_matmul: matmul [8, 64] x [64, 16] + epilogue add add
    "#]]
    .assert_eq(&list(fw));
    expect![[r#"
        k0_0_reduce: reduce mean over [2, 4, 16] reducing [2]
        k0_1_reduce: reduce mean of sub mul over [2, 4, 16] reducing [2]
        k0_2_pointwise: pointwise add rsqrt over [2, 4, 1]
        k0_3_pointwise: pointwise sub mul mul add over [2, 4, 16]
        k1_pointwise: pointwise copy over [2, 2, 4, 8]
        k2_pointwise: pointwise copy over [2, 2, 8, 4]
        k3_0_reduce: reduce sum over [2, 2, 4, 4] reducing [3]
        k3_1_pointwise: pointwise reciprocal over [2, 2, 4, 1]
        k3_2_pointwise: pointwise mul over [2, 2, 4, 4]
        k4_pointwise: pointwise copy over [2, 2, 4, 8]
        k5_0_reduce: reduce mean of mul over [2, 4, 16] reducing [2]
        k5_1_pointwise: pointwise add rsqrt over [2, 4, 1]
        k6_pointwise: pointwise mul erf add mul mul over [2, 4, 64]
        k7_reduce: reduce sum over [2, 4, 16] reducing [0, 1]
        k8_matmul: matmul [8, 16] x [16, 64] + epilogue mul add mul mul mul mul mul neg exp mul mul mul add
        k9_matmul: matmul [64, 8] x [8, 16]
        k10_reduce: reduce sum over [2, 4, 64] reducing [0, 1]
        k11_matmul: matmul [8, 64] x [64, 16]
        k12_matmul: matmul [16, 8] x [8, 64]
        k13_reduce: reduce sum over [2, 4, 16] reducing [0, 1]
        k14_reduce: reduce sum of mul mul over [2, 4, 16] reducing [0, 1]
        k15_0_reduce: reduce sum of mul mul over [2, 4, 16] reducing [2]
        k15_1_pointwise: pointwise pow mul mul div over [2, 4, 1]
        k15_2_pointwise: pointwise mul mul mul add add over [2, 4, 16]
        k15_3_reduce: reduce sum of neg over [2, 4, 16] reducing [2]
        k15_4_pointwise: pointwise div over [2, 4, 1]
        k15_5_pointwise: pointwise add add over [2, 4, 16]
        k16_reduce: reduce sum over [2, 4, 16] reducing [0, 1]
        k17_matmul: matmul [8, 16] x [16, 16]
        k18_matmul: matmul [16, 8] x [8, 16]
        k19_pointwise: pointwise copy over [2, 2, 4, 8]
        k20_matmul: matmul [4, 4, 8] x [4, 8, 4]
        k21_matmul: matmul [4, 4, 4] x [4, 4, 8]
        k22_0_reduce: reduce sum of mul over [2, 2, 4, 4] reducing [3]
        k22_1_pointwise: pointwise mul mul neg over [2, 2, 4, 1]
        k22_2_pointwise: pointwise mul add mul mul over [2, 2, 4, 4]
        k23_matmul: matmul [4, 4, 4] x [4, 4, 8]
        k24_matmul: matmul [4, 8, 4] x [4, 4, 4]
        k25_pointwise: pointwise copy over [3, 2, 2, 4, 8]
        k26_pointwise: pointwise copy over [2, 2, 4, 8]
        k27_pointwise: pointwise copy over [2, 2, 4, 8]
        k28_pointwise: pointwise copy over [2, 2, 4, 8]
        k29_pointwise: pointwise copy over [2, 4, 3, 2, 8]
        k30_reduce: reduce sum over [2, 4, 48] reducing [0, 1]
        k31_matmul: matmul [8, 48] x [48, 16]
        k32_matmul: matmul [16, 8] x [8, 48]
        k33_reduce: reduce sum over [2, 4, 16] reducing [0, 1]
        k34_reduce: reduce sum of sub mul mul over [2, 4, 16] reducing [0, 1]
    "#]]
    .assert_eq(&list(bw));
}

#[test]
fn kernels_the_backend_cannot_run_are_clear_errors() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    // f64 arithmetic: WGSL has none.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[3], DType::F64));
    let y = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    g.outputs = vec![y];
    let e = WgpuBackend::new().compile_graph(&g).unwrap_err().to_string();
    assert!(e.contains("pointwise exp") && e.contains("f64") && e.contains("WGSL has no 64-bit floats"), "{e}");
    // Beyond the adapter's limits (and WGSL's 32-bit indices): planned, never run.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[1 << 31, 4], DType::F32));
    let y = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, aotgrad_ir::Scalar::Float(2.0)), &[x]);
    g.outputs = vec![y];
    let e = WgpuBackend::new().compile_graph(&g).unwrap_err().to_string();
    assert!(e.contains("beyond the adapter's limits") && e.contains("pointwise mul"), "{e}");
    // The error reaches the user through the facade, naming the backend.
    let f = aot_function(
        |xs: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![xs[0].exp()?]) },
        AotConfig { backend: Arc::new(WgpuBackend::new()), ..AotConfig::default().no_cache() },
    )
    .unwrap();
    let x = Tensor::from_f64(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let e = f.call(&[x]).unwrap_err().to_string();
    assert!(e.contains("wgpu") && e.contains("f64"), "{e}");
}

#[test]
fn device_timing_runs_the_kernels_and_refuses_graphs_with_host_steps() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    // The bench's measurement: a positive time per run, and the graph still computes
    // the same values afterwards (the timing shares its buffers).
    let g = pointwise_graph();
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let ins: Vec<_> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    let before = c.run(&ins).unwrap()[0].to_vec_f64();
    let s = c.device_seconds(&ins, 3).unwrap();
    assert!(s.is_finite() && s > 0.0, "{s}");
    assert_eq!(c.run(&ins).unwrap()[0].to_vec_f64(), before);
    // cumsum runs on the host: its time would not be the device's.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[4, 8], DType::F32));
    let y = node(&mut g, Op::Cumsum(1), &[x]);
    let z = node(&mut g, Op::Unary(UnaryOp::Exp), &[y]);
    g.outputs = vec![z];
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let ins = vec![tensor_for(&g.inputs[0].meta, 0.0, false)];
    let e = c.device_seconds(&ins, 1).unwrap_err().to_string();
    assert!(e.contains("device timing") && e.contains("host-run steps"), "{e}");
}

#[test]
fn f16_kernels_match_the_interpreter_where_the_adapter_has_shader_f16() {
    let Some(a) = gpu::adapter_or_skip() else { return };
    let h = DType::F16;
    let mut x_sin = Graph::new();
    {
        // x.sin().mul(2).add(y).relu(), stored as f16.
        let g = &mut x_sin;
        let x = input(g, "x", m(&[4, 8], h));
        let y = input(g, "y", m(&[8], h));
        let s = node(g, Op::Unary(UnaryOp::Sin), &[x]);
        let t = node(g, Op::BinaryScalar(BinaryOp::Mul, aotgrad_ir::Scalar::Float(2.0)), &[s]);
        let u = node(g, Op::Binary(BinaryOp::Add), &[t, y]);
        let r = node(g, Op::Unary(UnaryOp::Relu), &[u]);
        g.outputs = vec![r];
    }
    if !a.shader_f16 {
        // Without the feature: a clear error naming the kernel and what is missing.
        let e = WgpuBackend::new().compile_graph(&x_sin).unwrap_err().to_string();
        assert!(e.contains("f16") && e.contains("SHADER_F16"), "{e}");
        return;
    }
    let suite = Suite { backends: vec![("wgpu".into(), Box::new(WgpuBackend::new()))], f64: false, tol_scale: 1.0 };
    let ins = |g: &Graph, scale: f64| -> Vec<CpuTensor> {
        g.inputs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let t = tensor_for(&x.meta, i as f64, false);
                let v: Vec<f64> = t.to_vec_f64().iter().map(|v| v * scale).collect();
                CpuTensor::from_f64(&v, &t.meta.concrete_shape().unwrap(), x.meta.dtype).unwrap()
            })
            .collect()
    };
    // One f16 ulp is about 1e-3 relative.
    suite.check(&x_sin, &ins(&x_sin, 1.0), 2e-3);
    // Overflow rounds to infinity, as on the CPU: x * 1000 for |x| up to 1000.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[64], h));
    let y = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, aotgrad_ir::Scalar::Float(1000.0)), &[x]);
    g.outputs = vec![y];
    let big = ins(&g, 1000.0);
    suite.check(&g, &big, 2e-3);
    let got = WgpuBackend::new().compile_graph(&g).unwrap().run(&big).unwrap()[0].to_vec_f64();
    assert!(got.iter().any(|v| v.is_infinite()), "{got:?}");
    // NaN stays NaN: log of negative values.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[16], h));
    let y = node(&mut g, Op::Unary(UnaryOp::Log), &[x]);
    g.outputs = vec![y];
    let xs = ins(&g, 1.0);
    suite.check(&g, &xs, 2e-3);
    let got = WgpuBackend::new().compile_graph(&g).unwrap().run(&xs).unwrap()[0].to_vec_f64();
    assert!(got.iter().any(|v| v.is_nan()) && got.iter().any(|v| v.is_finite()), "{got:?}");
    // A reduction and a matmul over f16 operands (f32 accumulation, f16 results).
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[6, 16], h));
    let w = input(&mut g, "w", m(&[16, 5], h));
    let p = node(&mut g, Op::Mm, &[x, w]);
    let s = node(&mut g, Op::Reduce { op: aotgrad_ir::ReduceOp::Sum, dims: vec![1], keepdim: false }, &[x]);
    g.outputs = vec![p, s];
    suite.check(&g, &ins(&g, 1.0), 4e-3);
    // Mixed: f16 in, f32 out.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[3, 7], h));
    let c = node(&mut g, Op::Cast(DType::F32), &[x]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[c]);
    g.outputs = vec![e];
    suite.check(&g, &ins(&g, 1.0), 1e-5);
}

#[test]
fn i64_values_live_on_the_device_as_checked_i32() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    // An i64 tensor read by a fused kernel: `x * 2.5` is f32 (type promotion).
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[2, 5], DType::I64));
    let y = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, aotgrad_ir::Scalar::Float(2.5)), &[x]);
    g.outputs = vec![y];
    let suite = Suite { backends: vec![("wgpu".into(), Box::new(WgpuBackend::new()))], f64: false, tol_scale: 1.0 };
    let small =
        CpuTensor::from_i64(&[-7, 0, 3, 2_147_483_647, -2_147_483_648, 1, 2, 3, 4, 5], &[2, 5], DType::I64).unwrap();
    suite.check(&g, std::slice::from_ref(&small), 1e-6);
    // A value beyond i32: a clear error naming the kernel and the value, not a wrap.
    let big = CpuTensor::from_i64(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 3_000_000_000], &[2, 5], DType::I64).unwrap();
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let e = c.run(&[big]).unwrap_err().to_string();
    assert!(e.contains("pointwise mul") && e.contains("3000000000") && e.contains("i32"), "{e}");
}

#[test]
fn artifacts_hold_the_wgsl_launch_and_buffer_plans_and_reload() {
    use aotgrad_ir::Backend;
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let g = pointwise_graph();
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let a = c.artifact();
    assert_eq!(a.format, aotgrad_wgpu::ARTIFACT_FORMAT);
    assert!(a.features.is_empty());
    let bytes = c.serialize();
    let ins: Vec<_> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    let want = c.run(&ins).unwrap()[0].to_vec_f64();
    // Bytes from a checked cache entry and bytes from anywhere alike: planned again
    // and compared with what they store.
    for loaded in [WgpuBackend::new().load_verified(&bytes).unwrap(), WgpuBackend::new().deserialize(&bytes).unwrap()] {
        assert_eq!(loaded.run(&ins).unwrap()[0].to_vec_f64(), want);
        assert_eq!(loaded.serialize(), bytes, "a loaded graph saves the same artifact");
    }
    // Stored kernels that are not the graph's are refused by the untrusted path.
    let mut other = a.clone();
    other.graph = other.graph.replace("sin(", "cos(");
    assert_ne!(other.graph, a.graph);
    let forged = aotgrad_ir::codec::encode("test", &other).unwrap();
    let err = |r: Result<Box<dyn CompiledGraph<CpuTensor>>, aotgrad_ir::BackendError>| match r {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };
    for e in [err(WgpuBackend::new().deserialize(&forged)), err(WgpuBackend::new().load_verified(&forged))] {
        assert!(e.contains("stored kernels differ"), "{e}");
    }
    // Another format, or bytes that are no artifact: clear errors.
    let mut old = a.clone();
    old.format = "aotgrad-wgpu/1".into();
    let e = err(WgpuBackend::new().load_verified(&aotgrad_ir::codec::encode("test", &old).unwrap()));
    assert!(e.contains("format") && e.contains("aotgrad-wgpu/1"), "{e}");
    let e = err(WgpuBackend::new().load_verified(b"graph("));
    assert!(e.contains("not a wgpu artifact"), "{e}");
    // f16 kernels name the feature they need.
    if aotgrad_wgpu::adapter().unwrap().shader_f16 {
        let mut g = Graph::new();
        let x = input(&mut g, "x", m(&[4], DType::F16));
        let y = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
        g.outputs = vec![y];
        let a = WgpuBackend::new().compile_graph(&g).unwrap().artifact();
        assert_eq!(a.features, vec!["shader-f16".to_string()]);
    }
}

//! An adapter without `SHADER_F16` (simulated with `AOTGRAD_WGPU_NO_F16=1`; its own
//! test binary, since the device is opened once per process): f16 graphs are a clear
//! error naming the kernel and the missing feature, at compile and through the facade.

mod gpu;

use aotgrad_ir::infer::infer;
use aotgrad_ir::{DType, Graph, Op, StaticOracle, StorageId, TensorMeta, UnaryOp};
use aotgrad_wgpu::{WgpuBackend, NO_F16_ENV};

#[test]
fn f16_graphs_are_a_clear_error_without_shader_f16() {
    // Before anything opens the device (this binary's only test).
    std::env::set_var(NO_F16_ENV, "1");
    let Some(a) = gpu::adapter_or_skip() else { return };
    assert!(!a.shader_f16);
    let mut g = Graph::new();
    let xm = TensorMeta::from_sizes(&[3, 4], DType::F16);
    let x = g.add_input("x", xm.clone(), StorageId(0));
    let meta = infer(&Op::Unary(UnaryOp::Exp), &[&xm], &mut StaticOracle).unwrap();
    let s = g.next_storage();
    let y = g.add_node(Op::Unary(UnaryOp::Exp), vec![x], meta, s, None);
    g.outputs = vec![y];
    let e = WgpuBackend::new().compile_graph(&g).unwrap_err().to_string();
    assert!(e.contains("pointwise exp") && e.contains("f16") && e.contains("SHADER_F16"), "{e}");
    // f32 graphs still run.
    let mut g = Graph::new();
    let xm = TensorMeta::from_sizes(&[3, 4], DType::F32);
    let x = g.add_input("x", xm.clone(), StorageId(0));
    let meta = infer(&Op::Unary(UnaryOp::Exp), &[&xm], &mut StaticOracle).unwrap();
    let s = g.next_storage();
    let y = g.add_node(Op::Unary(UnaryOp::Exp), vec![x], meta, s, None);
    g.outputs = vec![y];
    assert!(WgpuBackend::new().compile_graph(&g).is_ok());
}

//! Losing the device (its own test binary: the device stays lost for the process):
//! every later call, and every read of a tensor that lived on it, is a clear error,
//! never a panic or a hang.

mod gpu;

use aotgrad_cpu::CpuTensor;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{CompiledGraph, DType, Graph, Op, StaticOracle, StorageId, TensorMeta, UnaryOp};
use aotgrad_wgpu::{lose_device_for_tests, WgpuBackend};

#[test]
fn a_lost_device_is_a_clear_error_for_calls_and_reads() {
    if gpu::adapter_or_skip().is_none() {
        return;
    }
    let mut g = Graph::new();
    let xm = TensorMeta::from_sizes(&[4, 4], DType::F32);
    let x = g.add_input("x", xm.clone(), StorageId(0));
    let meta = infer(&Op::Unary(UnaryOp::Exp), &[&xm], &mut StaticOracle).unwrap();
    let s = g.next_storage();
    let y = g.add_node(Op::Unary(UnaryOp::Exp), vec![x], meta, s, None);
    g.outputs = vec![y];
    let c = WgpuBackend::new().compile_graph(&g).unwrap();
    let xs = CpuTensor::from_f64(&[0.5; 16], &[4, 4], DType::F32).unwrap();
    let read = c.run(std::slice::from_ref(&xs)).unwrap();
    assert!((read[0].to_vec_f64()[0] - 0.5f64.exp()).abs() < 1e-6);
    // A result still on the device when it is lost.
    let held = c.run(std::slice::from_ref(&xs)).unwrap();
    assert!(!held[0].storage.on_host());
    lose_device_for_tests();
    let e = c.run(std::slice::from_ref(&xs)).unwrap_err().to_string();
    assert!(e.contains("wgpu") && e.contains("lost"), "{e}");
    let e = held[0].try_to_vec_f64().unwrap_err().to_string();
    assert!(e.contains("device") && e.contains("lost"), "{e}");
    // What was read before stays readable.
    assert_eq!(read[0].to_vec_f64().len(), 16);
}

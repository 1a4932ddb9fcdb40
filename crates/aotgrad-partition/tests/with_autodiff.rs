//! End to end with the real autodiff (`aotgrad_autodiff::build_joint`): an MLP of
//! `Linear + erf-GELU` layers (the GELU written as its pointwise chain, as the tracer's
//! decomposition does). Partitions of the joint graph, raw and simplified, reproduce the
//! joint graph's results; on the benchmark MLP (4 × 512→512, batch 64) min-cut saves
//! only the four pre-GELU activations, within the design targets (≤ 0.7 × PyTorch's
//! 917,504 saved activation bytes, ≤ 5% extra FLOPs).

mod common;

use aotgrad_autodiff::build_joint;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{BinaryOp, DType, Graph, Op, TensorMeta, UnaryOp};
use aotgrad_partition::cost::flops_of;
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, Partitioned, SimplifyLimits,
};
use common::joints::{add_s, bin, mul_s, un};
use common::{assert_results_close, random_inputs, run, B};

/// `layers` × (`h @ w + b`, erf-GELU) on `x: f32[batch, d]`; weights and biases require
/// grad, `x` does not.
fn mlp(batch: usize, d: usize, layers: usize) -> (Graph, Vec<bool>) {
    let mut b = B::new();
    let x = b.input("x", &[batch, d], DType::F32);
    let mut requires_grad = vec![false];
    let params: Vec<_> = (0..layers)
        .map(|l| {
            requires_grad.extend([true, true]);
            (b.input(&format!("w{l}"), &[d, d], DType::F32), b.input(&format!("b{l}"), &[d], DType::F32))
        })
        .collect();
    let mut h = x;
    for (w, bias) in params {
        let m = b.op(Op::Mm, &[h, w]);
        let y = bin(&mut b, BinaryOp::Add, m, bias);
        let a = mul_s(&mut b, y, std::f64::consts::FRAC_1_SQRT_2);
        let e = un(&mut b, UnaryOp::Erf, a);
        let e1 = add_s(&mut b, e, 1.0);
        let hy = mul_s(&mut b, y, 0.5);
        h = bin(&mut b, BinaryOp::Mul, hy, e1);
    }
    b.g.outputs = vec![h];
    (b.g, requires_grad)
}

#[test]
fn partitions_of_a_real_joint_graph_reproduce_it() {
    let (g, rg) = mlp(3, 4, 2);
    let j = build_joint(&g, &rg, &[true]).expect("joint");
    let s = simplify_joint(&j, &SimplifyLimits::default()).expect("simplify");
    let inputs = random_inputs(&j.graph, 5);
    let want = run(&j.graph, &inputs);
    for jj in [&j, &s] {
        let parts: Vec<Partitioned> = vec![
            default_partition(jj).expect("default"),
            min_cut_partition(jj, &MinCutConfig::default()).expect("min-cut"),
            min_cut_partition(jj, &MinCutConfig { activation_memory_budget: 0.5 }).expect("b=0.5"),
            min_cut_partition(jj, &MinCutConfig { activation_memory_budget: 0.0 }).expect("b=0"),
        ];
        for p in parts {
            let (primals, tangents) = inputs.split_at(jj.num_primals);
            let fw = run(&p.forward, primals);
            let mut bw_in: Vec<CpuTensor> = fw[jj.num_fw_outputs..].to_vec();
            bw_in.extend_from_slice(tangents);
            let grads = run(&p.backward, &bw_in);
            assert_results_close(&fw[..jj.num_fw_outputs], &want[..jj.num_fw_outputs], 1e-5, 1e-6);
            assert_results_close(&grads, &want[jj.num_fw_outputs..], 1e-5, 1e-6);
        }
    }
}

#[test]
fn benchmark_mlp_min_cut_meets_the_saved_bytes_target() {
    let (g, rg) = mlp(64, 512, 4);
    let j = build_joint(&g, &rg, &[true]).expect("joint");
    let d = default_partition(&j).expect("default");
    let m = min_cut_partition(&j, &MinCutConfig::default()).expect("min-cut");
    // The four pre-GELU activations, f32[64, 512] each.
    assert_eq!(m.report.activation_bytes, 4 * 64 * 512 * 4);
    assert!(m.report.activation_bytes as f64 <= 0.7 * 917_504.0);
    assert!(m.report.activation_bytes < d.report.activation_bytes);
    let total: u64 = j
        .graph
        .nodes
        .iter()
        .map(|n| {
            let metas: Vec<&TensorMeta> = n.args.iter().filter_map(|a| j.graph.meta_of(*a)).collect();
            flops_of(&n.op, &metas, &n.meta)
        })
        .sum();
    assert!(m.report.recompute_flops as f64 <= 0.05 * total as f64, "{} of {total}", m.report.recompute_flops);
    assert!(!m.report.recomputed_ops.iter().any(|o| o.contains("(mm)")));
}

//! Partition tests on hand-built joint graphs: forward + backward reproduce the joint
//! graph's results exactly, min-cut saves less than the default, banned ops are never
//! recomputed, and the memory budget behaves as documented.

mod common;

use aotgrad_autodiff::JointGraph;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{BinaryOp, DType, Dim, Op, ReduceOp, SymId, TensorMeta, UnaryOp};
use aotgrad_ir::{Graph, ValueId};
use aotgrad_partition::partition::is_banned;
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, PartitionError, Partitioned, SimplifyLimits,
};
use common::joints::{attention_joint, budget_joint, mlp_joint};
use common::{assert_results_close, random_inputs, run, B};
use expect_test::expect;
use std::collections::HashSet;

/// Run the joint graph and the partition on the same inputs; results must be identical.
fn check_equivalent(j: &JointGraph, p: &Partitioned, seed: u64) {
    let inputs = random_inputs(&j.graph, seed);
    let expected = run(&j.graph, &inputs);
    let (primals, tangents) = inputs.split_at(j.num_primals);
    let fw = run(&p.forward, primals);
    assert_eq!(fw.len(), j.num_fw_outputs + p.saved.len());
    let mut bw_in: Vec<CpuTensor> = fw[j.num_fw_outputs..].to_vec();
    bw_in.extend_from_slice(tangents);
    let grads = run(&p.backward, &bw_in);
    assert_results_close(&fw[..j.num_fw_outputs], &expected[..j.num_fw_outputs], 0.0, 0.0);
    assert_results_close(&grads, &expected[j.num_fw_outputs..], 0.0, 0.0);
}

/// Values of the joint graph that do not depend on a tangent (computed independently of
/// the crate).
fn forward_values(j: &JointGraph) -> HashSet<ValueId> {
    let mut fw: HashSet<ValueId> = j.graph.inputs[..j.num_primals].iter().map(|i| i.id).collect();
    for n in &j.graph.nodes {
        if n.args.iter().all(|a| fw.contains(a)) {
            fw.insert(n.out);
        }
    }
    fw
}

fn assert_no_banned_recompute(j: &JointGraph, p: &Partitioned) {
    let fw = forward_values(j);
    for n in &p.backward.nodes {
        if fw.contains(&n.out) {
            assert!(!is_banned(&n.op), "backward recomputes the banned {} ({})", n.out, n.op.name());
        }
    }
    for s in &p.report.recomputed_ops {
        assert!(!s.contains("(mm)") && !s.contains("(bernoulli)"), "recomputed {s}");
    }
}

fn names(p: &Partitioned) -> Vec<String> {
    p.saved.iter().map(|s| s.name.clone()).collect()
}

fn budget(b: f64) -> MinCutConfig {
    MinCutConfig { activation_memory_budget: b }
}

#[test]
fn default_and_min_cut_reproduce_the_joint_graph() {
    let joints = [mlp_joint(false), mlp_joint(true), attention_joint(), budget_joint()];
    for (i, j) in joints.iter().enumerate() {
        let mut parts = vec![default_partition(j).expect("default")];
        for b in [1.0, 0.6, 0.3, 0.0] {
            parts.push(min_cut_partition(j, &budget(b)).expect("min-cut"));
        }
        for (k, p) in parts.iter().enumerate() {
            check_equivalent(j, p, 100 + 10 * i as u64 + k as u64);
            assert_no_banned_recompute(j, p);
        }
    }
}

#[test]
fn min_cut_saves_fewer_bytes_than_default() {
    for j in [mlp_joint(false), mlp_joint(true), attention_joint()] {
        let d = default_partition(&j).expect("default");
        let m = min_cut_partition(&j, &MinCutConfig::default()).expect("min-cut");
        assert!(m.report.saved_bytes < d.report.saved_bytes, "{} vs {}", m.report, d.report);
        assert!(d.report.recomputed_ops.is_empty());
        assert_eq!(d.report.recompute_flops, 0);
    }
    // MLP: the default saves t(g), t(w2), e1, r, t(x), t(w1) = 3 * 256 + 2 * 512 + 128 bytes;
    // min-cut saves x, w1, w2 and the pre-GELU y = 128 + 512 + 512 + 256 bytes.
    let j = mlp_joint(false);
    let d = default_partition(&j).expect("default");
    let m = min_cut_partition(&j, &MinCutConfig::default()).expect("min-cut");
    assert_eq!(d.report.saved_bytes, 1920);
    assert_eq!(m.report.saved_bytes, 1408);
    assert_eq!(names(&m), ["x", "w1", "w2", "saved_6"]);
    assert_eq!(m.report.activation_bytes, 256);
}

#[test]
fn dropout_mask_is_saved_never_recomputed() {
    let j = mlp_joint(true);
    let m = min_cut_partition(&j, &MinCutConfig::default()).expect("min-cut");
    let mask = j.graph.nodes.iter().find(|n| n.op.is_random()).expect("mask").out;
    assert!(m.saved.iter().any(|s| s.value == mask), "{}", m.report);
    assert!(!m.backward.nodes.iter().any(|n| n.op.is_random()));
    let z = min_cut_partition(&j, &budget(0.0)).expect("budget 0");
    assert!(z.saved.iter().any(|s| s.value == mask), "{}", z.report);
}

#[test]
fn budget_zero_saves_only_primals_and_banned_outputs() {
    // MLP: the backward needs x, w1, w2 (for views), b1 and h = x @ w1 (to recompute the
    // GELU chain; h is an mm, so it must be saved).
    let j = mlp_joint(false);
    let z = min_cut_partition(&j, &budget(0.0)).expect("budget 0");
    assert_eq!(names(&z), ["x", "w1", "b1", "w2", "saved_5"]);
    assert_eq!(z.report.activation_bytes, 4 * 16 * 4);
    assert!(z.report.recompute_flops > 0);
    let j = budget_joint();
    let z = min_cut_partition(&j, &budget(0.0)).expect("budget 0");
    assert_eq!(names(&z), ["x1", "x2"]);
    assert_eq!(z.report.activation_bytes, 0);
}

#[test]
fn budget_trades_memory_for_recompute_monotonically() {
    let j = budget_joint();
    let one = min_cut_partition(&j, &budget(1.0)).expect("b=1");
    // u1 = exp(sum(x1)) f32[8] and u2 = exp(sum(x2)) f64[8]: 32 + 64 activation bytes.
    assert_eq!(names(&one), ["saved_4", "saved_6"]);
    assert_eq!(one.report.activation_bytes, 96);
    // b = 0.5: target 48 bytes; dropping u2 frees 64 bytes for the same FLOPs as u1's 32.
    let half = min_cut_partition(&j, &budget(0.5)).expect("b=0.5");
    assert_eq!(names(&half), ["x2", "saved_4"]);
    assert_eq!(half.report.activation_bytes, 32);
    let low = min_cut_partition(&j, &budget(0.2)).expect("b=0.2");
    assert_eq!(names(&low), ["x1", "x2"]);
    let mut last = (u64::MAX, 0u64);
    for b in [1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0] {
        let p = min_cut_partition(&j, &budget(b)).expect("budget");
        assert!(p.report.activation_bytes as f64 <= (b * 96.0).max(0.0) + 1e-9 || b == 1.0);
        assert!(p.report.activation_bytes <= last.0, "budget {b}: {}", p.report);
        assert!(p.report.recompute_flops >= last.1, "budget {b}: {}", p.report);
        last = (p.report.activation_bytes, p.report.recompute_flops);
    }
}

#[test]
fn golden_min_cut_report_of_the_mlp() {
    let m = min_cut_partition(&mlp_joint(false), &MinCutConfig::default()).expect("min-cut");
    expect![[r#"
        saved 4 values, 1408 bytes (256 activation bytes):
          %0 "x": f32[4, 8] (128 bytes)
          %1 "w1": f32[8, 16] (512 bytes)
          %3 "w2": f32[16, 8] (512 bytes)
          %6 (add): f32[4, 16] (256 bytes)
        recomputed 14 ops, 640 FLOPs: %7 (mul), %8 (erf), %9 (add), %10 (mul), %11 (mul), %13 (t), %15 (t), %19 (mul), %20 (neg), %21 (exp), %22 (mul), %23 (mul), %27 (t), %29 (t)"#]].assert_eq(&m.report.to_string());
}

#[test]
fn golden_report_text_and_graphs_of_a_small_example() {
    let j = budget_joint();
    let d = default_partition(&j).expect("default");
    expect![[r#"
        saved 3 values, 128 bytes (128 activation bytes):
          %4 (exp): f32[8] (32 bytes)
          %6 (exp): f64[8] (64 bytes)
          %7 (to): f32[8] (32 bytes)
        recomputed 0 ops, 0 FLOPs"#]]
    .assert_eq(&d.report.to_string());
    let m = min_cut_partition(&j, &budget(0.5)).expect("min-cut");
    expect![[r#"
        saved 2 values, 544 bytes (32 activation bytes):
          %1 "x2": f64[8, 8] (512 bytes)
          %4 (exp): f32[8] (32 bytes)
        recomputed 3 ops, 80 FLOPs: %5 (sum), %6 (exp), %7 (to)
        graph(%0: f32[8, 8] #0 "x1", %1: f64[8, 8] #1 "x2") {
          %3: f32[8] #3 = sum(%0, dims=[1], keepdim=false)
          %4: f32[8] #4 = exp(%3)
          %5: f64[8] #5 = sum(%1, dims=[1], keepdim=false)
          %6: f64[8] #6 = exp(%5)
          %7: f32[8] #7 = to(%6, dtype=f32)
          %8: f32[8] #8 = mul(%4, %7)
          %9: f32[] #9 = sum(%8, dims=[], keepdim=false)
          return (%9, %1, %4)
        }

        graph(%1: f64[8, 8] #1 "x2", %4: f32[8] #4 "saved_4", %2: f32[] #2 "dout") {
          %5: f64[8] #5 = sum(%1, dims=[1], keepdim=false)
          %6: f64[8] #6 = exp(%5)
          %7: f32[8] #7 = to(%6, dtype=f32)
          %10: f32[8] strides=[0] #2 = expand(%2, [8])
          %11: f32[8] #10 = mul(%10, %7)
          %12: f32[8] #11 = mul(%11, %4)
          %13: f32[8, 1] #11 = unsqueeze(%12, dim=1)
          %14: f32[8, 8] strides=[1, 0] #11 = expand(%13, [8, 8])
          %15: f32[8, 8] #12 = clone(%14)
          %16: f32[8] #13 = mul(%10, %4)
          %17: f64[8] #14 = to(%16, dtype=f64)
          %18: f64[8] #15 = mul(%17, %6)
          %19: f64[8, 1] #15 = unsqueeze(%18, dim=1)
          %20: f64[8, 8] strides=[1, 0] #15 = expand(%19, [8, 8])
          %21: f64[8, 8] #16 = clone(%20)
          return (%15, %21)
        }
    "#]]
    .assert_eq(&format!("{}\n{}\n{}", m.report, m.forward, m.backward));
}

#[test]
fn invalid_joint_graphs_and_budgets_are_rejected() {
    let mut j = mlp_joint(false);
    j.num_fw_outputs = 2; // now a gradient counts as a forward output
    j.grad_primals.pop();
    let e = default_partition(&j).expect_err("tangent-dependent forward output");
    assert!(matches!(e, PartitionError::InvalidJoint(_)), "{e}");
    assert!(e.to_string().contains("depends on a tangent"), "{e}");
    let mut j = mlp_joint(false);
    j.num_tangents = 2;
    assert!(matches!(default_partition(&j), Err(PartitionError::InvalidJoint(_))));
    let j = mlp_joint(false);
    for b in [-0.1, 1.5, f64::NAN] {
        let e = min_cut_partition(&j, &budget(b)).expect_err("bad budget");
        assert!(matches!(e, PartitionError::Config(_)), "{e}");
    }
    let _: &Graph = &j.graph;
}

#[test]
fn simplified_joint_graphs_partition_to_the_same_results() {
    for j in [mlp_joint(false), mlp_joint(true), attention_joint(), budget_joint()] {
        let s = simplify_joint(&j, &SimplifyLimits::default()).expect("simplify");
        assert!(s.graph.nodes.len() <= j.graph.nodes.len());
        for p in [default_partition(&s).expect("default"), min_cut_partition(&s, &budget(1.0)).expect("min-cut")] {
            let inputs = random_inputs(&j.graph, 9);
            let expected = run(&j.graph, &inputs);
            let (primals, tangents) = inputs.split_at(j.num_primals);
            let fw = run(&p.forward, primals);
            let mut bw_in: Vec<CpuTensor> = fw[j.num_fw_outputs..].to_vec();
            bw_in.extend_from_slice(tangents);
            let grads = run(&p.backward, &bw_in);
            assert_results_close(&fw[..j.num_fw_outputs], &expected[..j.num_fw_outputs], 1e-6, 1e-6);
            assert_results_close(&grads, &expected[j.num_fw_outputs..], 1e-6, 1e-6);
        }
    }
}

#[test]
fn symbolic_sizes_use_the_hint_and_run_once_bound() {
    // out = sum(exp(x)) with x: f32[s0, 3]; dx = dout * exp(x). Min-cut saves x (as large
    // as exp(x); ties go to primals): 64 * 3 * 4 bytes with s0 estimated at 64.
    let mut b = B::new();
    let st = b.g.next_storage();
    let x = b.g.add_input("x", TensorMeta::contiguous(vec![Dim::sym(SymId(0)), Dim::Const(3)], DType::F32), st);
    let dout = b.input("dout", &[], DType::F32);
    let e = b.op(Op::Unary(UnaryOp::Exp), &[x]);
    let out = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[e]);
    let shape = b.meta(x).shape;
    let dexp = b.op(Op::Expand(shape), &[dout]);
    let dx = b.op(Op::Binary(BinaryOp::Mul), &[dexp, e]);
    b.g.outputs = vec![out, dx];
    let j = JointGraph {
        graph: b.g,
        num_primals: 1,
        num_tangents: 1,
        num_fw_outputs: 1,
        tangent_outputs: vec![0],
        grad_primals: vec![0],
    };
    let m = min_cut_partition(&j, &MinCutConfig::default()).expect("min-cut");
    assert_eq!(m.report.saved_bytes, 64 * 3 * 4);
    assert_eq!(names(&m), ["x"]);
    assert_eq!(m.report.recomputed_ops, ["%2 (exp)"]);
    let xs =
        vec![CpuTensor::from_f64(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], &[5, 2], DType::F32).expect("t")];
    // A wrong shape is rejected by the interpreter (the graph wants [s0, 3]) ...
    assert!(aotgrad_cpu::interpret(&m.forward, &xs).is_err());
    // ... the right one binds s0 = 4.
    let x4 =
        CpuTensor::from_f64(&(0..12).map(|i| i as f64 / 10.0).collect::<Vec<_>>(), &[4, 3], DType::F32).expect("t");
    let fw = run(&m.forward, std::slice::from_ref(&x4));
    let t = CpuTensor::from_f64(&[2.0], &[], DType::F32).expect("t");
    let grads = run(&m.backward, &[fw[1].clone(), t]);
    let want: Vec<f64> = (0..12).map(|i| 2.0 * ((i as f64 / 10.0) as f32).exp() as f64).collect();
    for (g, w) in common::vals(&grads[0]).iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "{g} vs {w}");
    }
}

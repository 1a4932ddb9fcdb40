//! Golden tests of individual rewrites: each prints the simplified graph, and checks
//! it computes what the original computes.

mod common;

use aotgrad_ir::text::print_graph;
use aotgrad_ir::{BinaryOp, DType, Graph, Op, ReduceOp, Scalar, SourceLoc, UnaryOp};
use aotgrad_partition::{
    simplify, simplify_joint, simplify_with_stats, PartitionError, SimplifyLimits, SimplifyOutcome,
};
use common::joints::{add_s, bin, mlp_joint, mul_s, reduce, un};
use common::{assert_results_close, random_inputs, run, B};
use expect_test::{expect, Expect};

const F32: DType = DType::F32;

/// Simplify, compare results with the original on random inputs, print.
fn check(g: &Graph, want: Expect) {
    let s = simplify(g, &SimplifyLimits::default()).expect("simplify");
    assert!(s.nodes.len() <= g.nodes.len());
    let inputs = random_inputs(g, 42);
    assert_results_close(&run(g, &inputs), &run(&s, &inputs), 1e-6, 1e-6);
    want.assert_eq(&print_graph(&s));
}

#[test]
fn identities_and_cse() {
    let mut b = B::new();
    let x = b.input("x", &[2, 3], F32);
    let y = b.input("y", &[2, 3], F32);
    let n1 = un(&mut b, UnaryOp::Neg, x);
    let n2 = un(&mut b, UnaryOp::Neg, n1);
    let m1 = mul_s(&mut b, n2, 1.0);
    let a0 = add_s(&mut b, m1, 0.0);
    let e1 = un(&mut b, UnaryOp::Exp, y);
    let e2 = un(&mut b, UnaryOp::Exp, y);
    let s = bin(&mut b, BinaryOp::Add, e1, e2);
    let out = bin(&mut b, BinaryOp::Mul, a0, s);
    b.g.outputs = vec![out];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[2, 3] #0 "x", %1: f32[2, 3] #1 "y") {
              %2: f32[2, 3] #2 = exp(%1)
              %3: f32[2, 3] #3 = add(%2, %2)
              %4: f32[2, 3] #4 = mul(%0, %3)
              return (%4)
            }
        "#]],
    );
}

#[test]
fn log_exp_and_guarded_exp_log() {
    let mut b = B::new();
    let x = b.input("x", &[4], F32);
    let e = un(&mut b, UnaryOp::Exp, x);
    let l = un(&mut b, UnaryOp::Log, e); // log(exp x) = x
    let lx = un(&mut b, UnaryOp::Log, x);
    let el = un(&mut b, UnaryOp::Exp, lx); // exp(log x): x may be negative: kept
    let ab = un(&mut b, UnaryOp::Abs, x);
    let la = un(&mut b, UnaryOp::Log, ab);
    let ea = un(&mut b, UnaryOp::Exp, la); // exp(log |x|) = |x|
    let s = bin(&mut b, BinaryOp::Add, l, el);
    let out = bin(&mut b, BinaryOp::Add, s, ea);
    b.g.outputs = vec![out];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[4] #0 "x") {
              %1: f32[4] #1 = log(%0)
              %2: f32[4] #2 = exp(%1)
              %3: f32[4] #3 = abs(%0)
              %4: f32[4] #4 = add(%0, %2)
              %5: f32[4] #5 = add(%4, %3)
              return (%5)
            }
        "#]],
    );
}

#[test]
fn float_times_zero_is_kept_int_times_zero_is_not() {
    let mut b = B::new();
    let x = b.input("x", &[3], F32);
    let i = b.input("i", &[3], DType::I64);
    let fz = b.op(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.0)), &[x]);
    let iz = b.op(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(0)), &[i]);
    b.g.outputs = vec![fz, iz];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[3] #0 "x", %1: i64[3] #1 "i") {
              %2: f32[3] #2 = mul(%0, 0.0)
              %3: i64[3] #3 = full_like(%1, value=0, dtype=i64)
              return (%2, %3)
            }
        "#]],
    );
}

#[test]
fn view_rewrites() {
    let mut b = B::new();
    let x = b.input("x", &[2, 3, 4], F32);
    let p1 = b.op(Op::Permute(vec![2, 0, 1]), &[x]);
    let p2 = b.op(Op::Transpose(0, 2), &[p1]); // = permute(x, [1, 0, 2])
    let c = b.op(Op::Clone, &[p2]);
    let v1 = b.op(Op::View(aotgrad_ir::dims![6.into(), 4.into()]), &[x]);
    let v2 = b.op(Op::View(aotgrad_ir::dims![24.into()]), &[v1]); // = view(x, [24])
    let al = b.op(Op::Alias, &[v2]); // alias elimination
    let t1 = b.op(Op::T, &[v1]);
    let t2 = b.op(Op::T, &[t1]); // = v1
    let e1 = b.op(Op::Expand(aotgrad_ir::dims![3.into(), 6.into(), 4.into()]), &[t2]);
    let u = b.op(Op::Unsqueeze(0), &[e1]);
    let sq = b.op(Op::Squeeze(vec![0]), &[u]); // = e1
    let r = reduce(&mut b, ReduceOp::Sum, sq, &[1, 2], false);
    let neg = un(&mut b, UnaryOp::Neg, al);
    b.g.outputs = vec![c, neg, r];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[2, 3, 4] #0 "x") {
              %1: f32[3, 2, 4] strides=[4, 12, 1] #0 = permute(%0, [1, 0, 2])
              %2: f32[3, 2, 4] #1 = clone(%1)
              %3: f32[6, 4] #0 = view(%0, [6, 4])
              %4: f32[24] #0 = view(%0, [24])
              %5: f32[3, 6, 4] strides=[0, 4, 1] #0 = expand(%3, [3, 6, 4])
              %6: f32[3] #2 = sum(%5, dims=[1, 2], keepdim=false)
              %7: f32[24] #3 = neg(%4)
              return (%2, %7, %6)
            }
        "#]],
    );
}

#[test]
fn sum_and_mean_of_an_expand() {
    // Each expand feeds one reduction, so the rewrites free the expands.
    let mut b = B::new();
    let x = b.input("x", &[3, 1], F32);
    let shape = vec![5.into(), 3.into(), 4.into()];
    let e1 = b.op(Op::Expand(shape.clone().into()), &[x]);
    let s_all = reduce(&mut b, ReduceOp::Sum, e1, &[], false); // 20 * sum(x)
    let e2 = b.op(Op::Expand(shape.clone().into()), &[x]);
    let s_bc = reduce(&mut b, ReduceOp::Sum, e2, &[0, 2], false); // 20 * sum(x, [1])
    let e3 = b.op(Op::Expand(shape.clone().into()), &[x]);
    let m = reduce(&mut b, ReduceOp::Mean, e3, &[0, 2], false); // mean(x, [1])
    let e4 = b.op(Op::Expand(aotgrad_ir::dims![4.into(), 3.into(), 1.into()]), &[x]);
    let m1 = reduce(&mut b, ReduceOp::Mean, e4, &[0], false); // = x (only a new dim reduced)
    let i = b.input("i", &[2], DType::I32);
    let ie = b.op(Op::Expand(aotgrad_ir::dims![50.into(), 2.into()]), &[i]);
    let is = reduce(&mut b, ReduceOp::Sum, ie, &[0], false); // 50 * to(i, i64)
    b.g.outputs = vec![s_all, s_bc, m, m1, is];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[3, 1] #0 "x", %9: i32[2] #5 "i") {
              %10: f32[] #6 = sum(%0, dims=[0, 1], keepdim=false)
              %11: f32[] #7 = mul(%10, 20)
              %12: f32[3] #8 = sum(%0, dims=[1], keepdim=false)
              %13: f32[3] #9 = mul(%12, 20)
              %14: f32[3] #10 = mean(%0, dims=[1], keepdim=false)
              %15: i64[2] #11 = to(%9, dtype=i64)
              %16: i64[2] #12 = mul(%15, 50)
              %17: f32[3, 1] #13 = clone(%0)
              return (%11, %13, %14, %17, %16)
            }
        "#]],
    );
}

#[test]
fn sums_of_disjoint_scatters_into_zeros_become_one_buffer() {
    // The gradient of `unbind(0)` of a [3, 2, 4] tensor: one zero-padded tensor per
    // part, summed; and of a `split` along dim 1 into [2, 1, 4] and [2, 3, 4] parts.
    // A scatter into a region another one already wrote (`overlap`) stays a sum.
    let mut b = B::new();
    let parts: Vec<_> = (0..3).map(|i| b.input(&format!("g{i}"), &[2, 4], F32)).collect();
    let zeros = |b: &mut B, shape: &[usize]| {
        let shape = shape.iter().map(|&s| s.into()).collect();
        b.op(Op::Full { shape, value: Scalar::Float(0.0), dtype: F32 }, &[])
    };
    let mut acc = None;
    for (i, p) in parts.iter().enumerate().rev() {
        let z = zeros(&mut b, &[3, 2, 4]);
        let s = b.op(Op::SelectScatter { dim: 0, index: (i as i64).into() }, &[z, *p]);
        acc = Some(match acc {
            None => s,
            Some(a) => bin(&mut b, BinaryOp::Add, a, s),
        });
    }
    let h0 = b.input("h0", &[2, 1, 4], F32);
    let h1 = b.input("h1", &[2, 3, 4], F32);
    let z = zeros(&mut b, &[2, 4, 4]);
    let s0 = b.op(Op::SliceScatter { dim: 1, start: 0.into(), end: 1.into(), step: 1 }, &[z, h0]);
    let z = zeros(&mut b, &[2, 4, 4]);
    let s1 = b.op(Op::SliceScatter { dim: 1, start: 1.into(), end: 4.into(), step: 1 }, &[z, h1]);
    let split = bin(&mut b, BinaryOp::Add, s0, s1);
    let z = zeros(&mut b, &[2, 4, 4]);
    let s2 = b.op(Op::SliceScatter { dim: 1, start: 0.into(), end: 3.into(), step: 1 }, &[z, h1]);
    let overlap = bin(&mut b, BinaryOp::Add, s0, s2);
    b.g.outputs = vec![acc.unwrap(), split, overlap];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[2, 4] #0 "g0", %1: f32[2, 4] #1 "g1", %2: f32[2, 4] #2 "g2", %11: f32[2, 1, 4] #11 "h0", %12: f32[2, 3, 4] #12 "h1") {
              %13: f32[3, 2, 4] #13 = full(shape=[3, 2, 4], value=0.0, dtype=f32)
              %14: f32[3, 2, 4] #14 = select_scatter(%13, %2, dim=0, index=2)
              %15: f32[3, 2, 4] #15 = select_scatter(%14, %1, dim=0, index=1)
              %16: f32[3, 2, 4] #16 = select_scatter(%15, %0, dim=0, index=0)
              %17: f32[2, 4, 4] #17 = full(shape=[2, 4, 4], value=0.0, dtype=f32)
              %18: f32[2, 4, 4] #18 = slice_scatter(%17, %11, dim=1, start=0, end=1, step=1)
              %19: f32[2, 4, 4] #19 = slice_scatter(%17, %12, dim=1, start=1, end=4, step=1)
              %20: f32[2, 4, 4] #20 = slice_scatter(%19, %11, dim=1, start=0, end=1, step=1)
              %21: f32[2, 4, 4] #21 = slice_scatter(%17, %12, dim=1, start=0, end=3, step=1)
              %22: f32[2, 4, 4] #22 = add(%18, %21)
              return (%16, %20, %22)
            }
        "#]],
    );
}

/// One expand shared by two sums that could each become `k * sum(x)` and by a mean that
/// cannot; with `neg_neg`, the mean is also negated twice.
fn shared_expand(neg_neg: bool) -> Graph {
    let mut b = B::new();
    let x = b.input("x", &[3, 1], F32);
    let e = b.op(Op::Expand(aotgrad_ir::dims![5.into(), 3.into(), 4.into()]), &[x]);
    let s_all = reduce(&mut b, ReduceOp::Sum, e, &[], false);
    let s_bc = reduce(&mut b, ReduceOp::Sum, e, &[0, 2], false);
    let mut m = reduce(&mut b, ReduceOp::Mean, e, &[0], false); // not every broadcast dim reduced
    if neg_neg {
        let n1 = un(&mut b, UnaryOp::Neg, m);
        m = un(&mut b, UnaryOp::Neg, n1);
    }
    b.g.outputs = vec![s_all, s_bc, m];
    b.g
}

#[test]
fn rewrites_that_would_add_nodes_are_reverted() {
    // The expand stays alive for the mean, so each scaled sum adds a node: both revert.
    check(
        &shared_expand(false),
        expect![[r#"
            graph(%0: f32[3, 1] #0 "x") {
              %1: f32[5, 3, 4] strides=[0, 1, 0] #0 = expand(%0, [5, 3, 4])
              %2: f32[] #1 = sum(%1, dims=[], keepdim=false)
              %3: f32[3] #2 = sum(%1, dims=[0, 2], keepdim=false)
              %4: f32[3, 4] #3 = mean(%1, dims=[0], keepdim=false)
              return (%2, %3, %4)
            }
        "#]],
    );
    // Removing neg(neg(.)) frees two nodes, so both scaled sums fit.
    check(
        &shared_expand(true),
        expect![[r#"
            graph(%0: f32[3, 1] #0 "x") {
              %1: f32[5, 3, 4] strides=[0, 1, 0] #0 = expand(%0, [5, 3, 4])
              %2: f32[] #1 = sum(%0, dims=[0, 1], keepdim=false)
              %3: f32[] #2 = mul(%2, 20)
              %4: f32[3] #3 = sum(%0, dims=[1], keepdim=false)
              %5: f32[3] #4 = mul(%4, 20)
              %6: f32[3, 4] #5 = mean(%1, dims=[0], keepdim=false)
              return (%3, %5, %6)
            }
        "#]],
    );
}

#[test]
fn outputs_keep_their_aliasing() {
    // `clone(x)` must not become the input itself; two distinct outputs computing the
    // same value must not become one tensor.
    let mut b = B::new();
    let x = b.input("x", &[2], F32);
    let c = b.op(Op::Clone, &[x]);
    let m1 = mul_s(&mut b, x, 1.0);
    let e1 = un(&mut b, UnaryOp::Exp, x);
    let e2 = un(&mut b, UnaryOp::Exp, x);
    let v = b.op(Op::Alias, &[x]);
    b.g.outputs = vec![c, m1, e1, e2, v, e1];
    check(
        &b.g,
        expect![[r#"
            graph(%0: f32[2] #0 "x") {
              %1: f32[2] #1 = exp(%0)
              %2: f32[2] #2 = clone(%0)
              %3: f32[2] #3 = clone(%0)
              %4: f32[2] #4 = clone(%1)
              return (%2, %3, %1, %4, %0, %1)
            }
        "#]],
    );
}

#[test]
fn source_locations_follow_their_class() {
    let mut b = B::new();
    let x = b.input("x", &[2], F32);
    let n1 = un(&mut b, UnaryOp::Neg, x);
    let n2 = un(&mut b, UnaryOp::Neg, n1);
    let e = un(&mut b, UnaryOp::Exp, n2);
    b.g.nodes[2].loc = Some(SourceLoc { file: "model.rs".into(), line: 7, col: 3 });
    b.g.outputs = vec![e];
    let (s, stats) = simplify_with_stats(&b.g, &SimplifyLimits::default()).expect("simplify");
    assert_eq!(stats.outcome, SimplifyOutcome::Rewritten);
    assert_eq!((stats.nodes_before, stats.nodes_after), (3, 1));
    expect![[r#"
        graph(%0: f32[2] #0 "x") {
          %1: f32[2] #1 = exp(%0)  # model.rs:7:3
          return (%1)
        }
    "#]]
    .assert_eq(&print_graph(&s));
}

#[test]
fn joint_graph_structure_is_kept_and_mutations_are_rejected() {
    let j = mlp_joint(false);
    let s = simplify_joint(&j, &SimplifyLimits::default()).expect("simplify");
    assert_eq!(s.graph.inputs, j.graph.inputs);
    assert_eq!(s.graph.outputs.len(), j.graph.outputs.len());
    assert_eq!((s.num_primals, s.num_tangents, s.num_fw_outputs), (4, 1, 1));
    assert!(s.graph.nodes.len() <= j.graph.nodes.len());
    let inputs = random_inputs(&j.graph, 3);
    assert_results_close(&run(&j.graph, &inputs), &run(&s.graph, &inputs), 1e-6, 1e-6);

    let mut b = B::new();
    let x = b.input("x", &[2], F32);
    let m = b.op(Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)))), &[x]);
    b.g.outputs = vec![m];
    let e = simplify(&b.g, &SimplifyLimits::default()).expect_err("mutation");
    assert!(matches!(e, PartitionError::Unsupported(_)), "{e}");
}

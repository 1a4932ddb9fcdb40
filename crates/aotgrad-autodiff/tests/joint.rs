//! The joint graph as a whole: golden text, which outputs get tangents, which primals
//! get gradients, source locations, symbolic shapes, and rejected graphs.

mod common;

use aotgrad_autodiff::{build_joint, build_joint_with_oracle, AutodiffError};
use aotgrad_ir::text::{parse_graph, print_graph};
use aotgrad_ir::{
    BinaryOp, CompositeOp, DType, Dim, Op, ReduceOp, Scalar, SourceLoc, StaticOracle, SymId, TensorMeta, UnaryOp,
};
use common::*;
use expect_test::expect;

const F: DType = DType::F32;

fn loc(line: u32) -> Option<SourceLoc> {
    Some(SourceLoc { file: "model.rs".into(), line, col: 5 })
}

/// `y = relu(x @ w) * 2; return y.sum()`
fn mlp_graph(dtype: DType) -> aotgrad_ir::Graph {
    let mut g = GB::new();
    let x = g.inp("x", &[2, 3], dtype);
    let w = g.inp("w", &[3, 4], dtype);
    g.loc = loc(10);
    let h = g.op(Op::Mm, &[x, w]);
    g.loc = loc(11);
    let r = g.op(Op::Unary(UnaryOp::Relu), &[h]);
    g.loc = loc(12);
    let y = g.op(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(2)), &[r]);
    g.loc = loc(13);
    let s = g.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[y]);
    g.outputs(&[s])
}

#[test]
fn golden_joint_graph_of_a_small_mlp() {
    let fw = mlp_graph(F);
    let jg = build_joint(&fw, &[true, true], &[true]).unwrap();
    assert_eq!((jg.num_primals, jg.num_tangents, jg.num_fw_outputs), (2, 1, 1));
    assert_eq!(jg.tangent_outputs, vec![0]);
    assert_eq!(jg.grad_primals, vec![0, 1]);
    let text = print_graph(&jg.graph);
    expect![[r#"
        graph(%0: f32[2, 3] #0 "x", %1: f32[3, 4] #1 "w", %6: f32[] #6 "tangent0") {
          %2: f32[2, 4] #2 = mm(%0, %1)  # model.rs:10:5
          %3: f32[2, 4] #3 = relu(%2)  # model.rs:11:5
          %4: f32[2, 4] #4 = mul(%3, 2)  # model.rs:12:5
          %5: f32[] #5 = sum(%4, dims=[], keepdim=false)  # model.rs:13:5
          %7: f32[1, 1] #6 = view(%6, [1, 1])  # model.rs:13:5
          %8: f32[2, 4] strides=[0, 0] #6 = expand(%7, [2, 4])  # model.rs:13:5
          %9: f32[2, 4] #7 = mul(%8, 2)  # model.rs:12:5
          %10: bool[2, 4] #8 = gt(%3, 0.0)  # model.rs:11:5
          %11: f32[] #9 = full(shape=[], value=0.0, dtype=f32)  # model.rs:11:5
          %12: f32[2, 4] #10 = where(%10, %9, %11)  # model.rs:11:5
          %13: f32[4, 3] strides=[1, 4] #1 = t(%1)  # model.rs:10:5
          %14: f32[2, 3] #11 = mm(%12, %13)  # model.rs:10:5
          %15: f32[3, 2] strides=[1, 3] #0 = t(%0)  # model.rs:10:5
          %16: f32[3, 4] #12 = mm(%15, %12)  # model.rs:10:5
          return (%5, %14, %16)
        }
    "#]]
    .assert_eq(&text);
    assert_eq!(parse_graph(&text).unwrap(), jg.graph, "the joint graph round-trips through text");
    // The forward part is the forward graph, ids untouched.
    assert_eq!(jg.graph.nodes[..fw.nodes.len()], fw.nodes[..]);
    assert_eq!(jg.graph.inputs[..2], fw.inputs[..]);
    // And the numbers are right.
    gradcheck_all(
        &mlp_graph(DType::F64),
        &[t64(&Rng(1).vec(6, -1.0, 1.0), &[2, 3]), t64(&Rng(2).vec(12, -1.0, 1.0), &[3, 4])],
    );
}

#[test]
fn backward_nodes_carry_the_forward_source_location() {
    let fw = mlp_graph(F);
    let jg = build_joint(&fw, &[true, true], &[true]).unwrap();
    let bw = &jg.graph.nodes[fw.nodes.len()..];
    assert!(!bw.is_empty());
    // Every backward node differentiates one of lines 10..=13 (or is an output clone).
    for n in bw {
        let line = n.loc.as_ref().map(|l| l.line);
        assert!(matches!(line, Some(10..=13)), "{} has loc {:?}", n.out, n.loc);
    }
    // The mm rule's nodes point at line 10.
    assert!(bw.iter().filter(|n| n.op == Op::Mm).all(|n| n.loc == loc(10)));
    assert!(bw.iter().filter(|n| matches!(n.op, Op::Where)).all(|n| n.loc == loc(11)));
}

#[test]
fn outputs_without_tangents_and_primals_without_grad() {
    // outs: a = x * w (tangent), b = exp(x) (no tangent); only w requires grad.
    let mut g = GB::new();
    let x = g.inp("x", &[3], DType::F64);
    let w = g.inp("w", &[3], DType::F64);
    let a = g.op(Op::Binary(BinaryOp::Mul), &[x, w]);
    let b = g.op(Op::Unary(UnaryOp::Exp), &[w]);
    let fw = g.outputs(&[a, b]);
    let ins = [t64(&[1.0, 2.0, 3.0], &[3]), t64(&[0.5, -0.5, 0.25], &[3])];
    let c = gradcheck(&fw, &ins, &[false, true], &[true, false]);
    assert_eq!(c.joint.tangent_outputs, vec![0]);
    assert_eq!(c.joint.grad_primals, vec![1]);
    assert_eq!(c.joint.graph.inputs.len(), 3);
    assert_eq!(c.joint.graph.inputs[2].name, "tangent0");
    let t = &c.tangents[0];
    assert_close(&c.grads[0], &[t[0] * 1.0, t[1] * 2.0, t[2] * 3.0], 1e-15);
    // exp(w) has no tangent: it is not differentiated.
    let bw = &c.joint.graph.nodes[fw.nodes.len()..];
    assert!(bw.iter().all(|n| n.op != Op::Binary(BinaryOp::Add)), "no second contribution to w");
    assert_eq!(bw.len(), 1, "one mul: t * x");
}

#[test]
fn primals_no_tangent_reaches_get_zeros() {
    let mut g = GB::new();
    let x = g.inp("x", &[2, 2], DType::F64);
    let w = g.inp("w", &[3], DType::F64);
    let y = g.op(Op::Unary(UnaryOp::Sin), &[x]);
    let fw = g.outputs(&[y]);
    let c = gradcheck_all(&fw, &[t64(&[0.1, 0.2, 0.3, 0.4], &[2, 2]), t64(&[1.0, 2.0, 3.0], &[3])]);
    assert_eq!(c.grads[1], vec![0.0; 3]);
    let last = c.joint.graph.nodes.last().unwrap();
    assert!(matches!(last.op, Op::Full { .. }));
    assert_eq!(Some(last.out), c.joint.graph.outputs.last().copied());
    let _ = w;
}

#[test]
fn integer_primals_never_get_gradients() {
    let mut g = GB::new();
    let x = g.inp("x", &[3], DType::F64);
    let k = g.inp("k", &[3], DType::I64);
    let b = g.inp("b", &[3], DType::Bool);
    let kf = g.op(Op::Cast(DType::F64), &[k]);
    let bf = g.op(Op::Cast(DType::F64), &[b]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, kf]);
    let z = g.op(Op::Binary(BinaryOp::Add), &[y, bf]);
    let fw = g.outputs(&[z]);
    let jg = build_joint(&fw, &[true, true, true], &[true]).unwrap();
    assert_eq!(jg.grad_primals, vec![0]);
    assert_eq!(jg.graph.outputs.len(), 2);
    // No backward node touches k's or b's casts.
    let bw = &jg.graph.nodes[fw.nodes.len()..];
    assert!(bw.iter().all(|n| !matches!(n.op, Op::Cast(_))));
}

#[test]
fn outputs_that_are_primals_or_repeat_accumulate() {
    // return (x, x * x, x): three tangents reach x.
    let mut g = GB::new();
    let x = g.inp("x", &[2], DType::F64);
    let sq = g.op(Op::Binary(BinaryOp::Mul), &[x, x]);
    let fw = g.outputs(&[x, sq, x]);
    let xs = [0.5, -2.0];
    let c = gradcheck_all(&fw, &[t64(&xs, &[2])]);
    let t = &c.tangents;
    let want: Vec<f64> = (0..2).map(|i| t[0][i] + 2.0 * xs[i] * t[1][i] + t[2][i]).collect();
    assert_close(&c.grads[0], &want, 1e-15);
}

#[test]
fn symbolic_shapes_flow_through() {
    // x: [s0, 3]; y = mean(x * b, dim 0) with b: [3] broadcast.
    let s0 = Dim::sym(SymId(0));
    let mut g = GB::new();
    let x = g.input("x", TensorMeta::contiguous(vec![s0.clone(), Dim::Const(3)], DType::F64));
    let b = g.inp("b", &[3], DType::F64);
    let m = g.op(Op::Binary(BinaryOp::Mul), &[x, b]);
    let y = g.op(Op::Reduce { op: ReduceOp::Mean, dims: vec![0], keepdim: false }, &[m]);
    let e = g.op(Op::Expand(aotgrad_ir::dims![s0.clone(), Dim::Const(3)]), &[y]);
    let fw = g.outputs(&[y, e]);
    let jg = build_joint_with_oracle(&fw, &[true, true], &[true, true], &mut StaticOracle).unwrap();
    assert_eq!(jg.graph.inputs[3].meta.shape, aotgrad_ir::dims![s0.clone(), Dim::Const(3)], "tangent1 is symbolic");
    assert_eq!(jg.graph.outputs.len(), 4);
    // The mean's count is symbolic: computed in the graph, not a constant.
    assert!(jg.graph.nodes.iter().any(|n| matches!(n.op, Op::FullLike { .. })));
    // (Sizes 0 and 1 are specialized by the shape environment, never bound to a symbol.)
    for rows in [2usize, 3, 5] {
        let mut rng = Rng(rows as u64);
        let ins = [t64(&rng.vec(rows * 3, -1.0, 1.0), &[rows, 3]), t64(&rng.vec(3, -1.0, 1.0), &[3])];
        gradcheck_all(&fw, &ins);
    }
}

#[test]
fn in_place_and_composite_ops_are_rejected_by_name() {
    let mut g = GB::new();
    let x = g.inp("x", &[3], F);
    let y = g.op(Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(2)))), &[x]);
    let fw = g.outputs(&[y]);
    match build_joint(&fw, &[true], &[true]) {
        Err(AutodiffError::NotDifferentiable { op, .. }) => assert_eq!(op, "mul_"),
        other => panic!("expected NotDifferentiable, got {other:?}"),
    }
    let mut g = GB::new();
    let x = g.inp("x", &[2, 3], F);
    let y = g.op(Op::Composite(CompositeOp::Softmax { dim: 1 }), &[x]);
    let fw = g.outputs(&[y]);
    let err = build_joint(&fw, &[true], &[true]).unwrap_err();
    assert!(matches!(&err, AutodiffError::NotDifferentiable { op, .. } if op == "softmax"));
    assert!(err.to_string().starts_with("softmax: no derivative"), "{err}");
    // Off the differentiated path a composite is fine.
    let jg = build_joint(&fw, &[false], &[true]).unwrap();
    assert!(jg.grad_primals.is_empty());
    assert_eq!(jg.graph.nodes.len(), 1);
}

#[test]
fn flag_lengths_must_match() {
    let fw = mlp_graph(F);
    assert!(matches!(build_joint(&fw, &[true], &[true]), Err(AutodiffError::Internal(_))));
    assert!(matches!(build_joint(&fw, &[true, true], &[]), Err(AutodiffError::Internal(_))));
}

#[test]
fn forward_ids_stay_and_new_ids_are_fresh() {
    // A forward graph with sparse ids (as a parsed or pruned graph may have).
    let text = "graph(%3: f64[2] #4 \"x\") {\n  %7: f64[2] #9 = exp(%3)\n  return (%7)\n}\n";
    let fw = parse_graph(text).unwrap();
    let jg = build_joint(&fw, &[true], &[true]).unwrap();
    assert_eq!(jg.graph.inputs[1].id.0, 8);
    assert!(jg.graph.nodes[1..].iter().all(|n| n.out.0 > 8 && n.storage.0 > 9));
    let c = gradcheck_all(&fw, &[t64(&[0.5, 1.5], &[2])]);
    assert_eq!(c.grads.len(), 1);
}

//! The reference interpreter on small hand-built graphs (node metadata from `infer`).

mod common;

use aotgrad_cpu::{interpret, CpuError, CpuTensor};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    BinaryOp, CompositeOp, DType, Dim, Graph, Op, ReduceOp, Scalar, SourceLoc, StaticOracle, StorageId, SymId,
    TensorMeta, UnaryOp, ValueId,
};
use common::*;

/// Append a node whose metadata comes from shape inference.
fn node(g: &mut Graph, op: Op, args: &[ValueId]) -> ValueId {
    let metas: Vec<TensorMeta> = args.iter().map(|a| g.meta_of(*a).unwrap().clone()).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let meta = infer(&op, &refs, &mut StaticOracle).unwrap_or_else(|e| panic!("infer {}: {e}", op.name()));
    let fresh = g.next_storage();
    g.add_node(op, args.to_vec(), meta, fresh, None)
}

fn sym_meta(shape: aotgrad_ir::Dims, dtype: DType) -> TensorMeta {
    TensorMeta::contiguous(shape, dtype)
}

/// x: (s0, 3), y: (3,) -> [sum(x * y, dim 0), x.t() @ x, x.t(), relu(x)]
fn symbolic_graph() -> Graph {
    let s0 = Dim::sym(SymId(0));
    let mut g = Graph::new();
    let x = g.add_input("x", sym_meta(aotgrad_ir::dims![s0.clone(), Dim::from(3usize)], DType::F64), StorageId(0));
    let y = g.add_input("y", sym_meta(aotgrad_ir::dims![Dim::from(3usize)], DType::F64), StorageId(1));
    let xy = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, y]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[xy]);
    let xt = node(&mut g, Op::T, &[x]);
    let gram = node(&mut g, Op::Mm, &[xt, x]);
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[x]);
    g.outputs = vec![s, gram, xt, r];
    g
}

#[test]
fn symbolic_graph_runs_at_two_sizes() {
    let g = symbolic_graph();
    for n in [2usize, 5] {
        let xv = vals(n * 3, n as f64);
        let yv = vec![0.5, -1.0, 2.0];
        let x = tf(&xv, &[n, 3], DType::F64);
        let y = tf(&yv, &[3], DType::F64);
        let outs = interpret(&g, &[x.clone(), y]).unwrap();
        assert_eq!(outs.len(), 4);
        let want_s: Vec<f64> = (0..3).map(|j| (0..n).map(|i| xv[i * 3 + j] * yv[j]).sum()).collect();
        assert_close(&outs[0].to_vec_f64(), &want_s, 1e-12, 1e-12);
        let want_gram: Vec<f64> =
            indices(&[3, 3]).iter().map(|ix| (0..n).map(|i| xv[i * 3 + ix[0]] * xv[i * 3 + ix[1]]).sum()).collect();
        assert_eq!(outs[1].shape(), vec![3, 3]);
        assert_close(&outs[1].to_vec_f64(), &want_gram, 1e-12, 1e-12);
        assert!(outs[2].same_storage(&x), "x.t() is a view of the input");
        assert_eq!(outs[2].shape(), vec![3, n]);
        assert_eq!(outs[2].to_vec_f64(), logical(&xv, &[3, n], &[1, 3], 0));
        assert_eq!(outs[3].to_vec_f64(), xv.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    }
}

#[test]
fn input_mismatches_are_input_errors() {
    let g = symbolic_graph();
    let x = tf(&[0.0; 6], &[2, 3], DType::F64);
    let y = tf(&[0.0; 3], &[3], DType::F64);
    let input_err = |r: aotgrad_cpu::Result<Vec<CpuTensor>>| match r {
        Err(CpuError::Input { index, msg }) => (index, msg),
        other => panic!("expected an input error, got {other:?}"),
    };
    let (_, msg) = input_err(interpret(&g, std::slice::from_ref(&x)));
    assert!(msg.contains("takes 2 inputs, got 1"), "{msg}");
    let (i, msg) = input_err(interpret(&g, &[x.clone(), tf(&[0.0; 4], &[4], DType::F64)]));
    assert_eq!(i, 1);
    assert!(msg.contains("size 0 is 4"), "{msg}");
    let (i, msg) = input_err(interpret(&g, &[x.clone(), tf(&[0.0; 3], &[3], DType::F32)]));
    assert_eq!(i, 1);
    assert!(msg.contains("dtype f32"), "{msg}");
    let (i, msg) = input_err(interpret(&g, &[tf(&[0.0; 6], &[6], DType::F64), y.clone()]));
    assert_eq!(i, 0);
    assert!(msg.contains("rank 1"), "{msg}");
    // A transposed input does not match the graph's contiguous strides.
    let xt = strided(&tf(&[0.0; 6], &[3, 2], DType::F64), &[2, 3], &[1, 2], 0);
    let (i, msg) = input_err(interpret(&g, &[xt, y]));
    assert_eq!(i, 0);
    assert!(msg.contains("stride"), "{msg}");
}

#[test]
fn a_symbol_bound_twice_must_agree() {
    let s0 = Dim::sym(SymId(0));
    let mut g = Graph::new();
    let a = g.add_input("a", sym_meta(aotgrad_ir::dims![s0.clone()], DType::F32), StorageId(0));
    let b = g.add_input("b", sym_meta(aotgrad_ir::dims![s0], DType::F32), StorageId(1));
    let c = node(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    g.outputs = vec![c];
    let ok = interpret(&g, &[tf(&[1.0, 2.0], &[2], DType::F32), tf(&[3.0, 4.0], &[2], DType::F32)]).unwrap();
    assert_eq!(ok[0].to_vec_f64(), vec![4.0, 6.0]);
    let err = interpret(&g, &[tf(&[1.0, 2.0], &[2], DType::F32), tf(&[3.0], &[1], DType::F32)]).unwrap_err();
    assert!(matches!(&err, CpuError::Input { index: 1, msg } if msg.contains("s0")), "{err}");
}

#[test]
fn mutations_reach_aliased_inputs() {
    // a: (4,) and b: (2, 2) share one storage; a.mul_(2); return b + 1, a
    let mut g = Graph::new();
    let a = g.add_input("a", TensorMeta::from_sizes(&[4], DType::F32), StorageId(0));
    let b = g.add_input("b", TensorMeta::from_sizes(&[2, 2], DType::F32), StorageId(0));
    let m = node(&mut g, Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)))), &[a]);
    let c = node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(1.0)), &[b]);
    g.outputs = vec![c, m];
    let at = tf(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    let bt = strided(&at, &[2, 2], &[2, 1], 0);
    let outs = interpret(&g, &[at.clone(), bt.clone()]).unwrap();
    assert_eq!(outs[0].to_vec_f64(), vec![3.0, 5.0, 7.0, 9.0]);
    assert!(outs[1].same_storage(&at), "the mutated input is returned as itself");
    assert_eq!(at.to_vec_f64(), vec![2.0, 4.0, 6.0, 8.0], "the caller sees the mutation");
    assert_eq!(bt.to_vec_f64(), vec![2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn a_wrong_recorded_meta_is_an_internal_error_naming_the_node() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[2], DType::F32), StorageId(0));
    let y = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    g.nodes[0].meta.dtype = DType::F64;
    g.outputs = vec![y];
    let err = interpret(&g, &[tf(&[0.0, 1.0], &[2], DType::F32)]).unwrap_err();
    assert!(matches!(&err, CpuError::Internal(msg) if msg.contains("%1") && msg.contains("exp")), "{err}");
}

#[test]
fn kernel_errors_and_composites_surface_from_the_interpreter() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[3], DType::F32), StorageId(0));
    let idx = g.add_input("i", TensorMeta::from_sizes(&[1], DType::I64), StorageId(1));
    let s = node(&mut g, Op::IndexSelect(0), &[x, idx]);
    g.outputs = vec![s];
    let loc = SourceLoc { file: "src/model.rs".into(), line: 12, col: 5 };
    g.nodes[0].loc = Some(loc.clone());
    let err = interpret(&g, &[tf(&[1.0, 2.0, 3.0], &[3], DType::F32), ti(&[7], &[1], DType::I64)]).unwrap_err();
    // The kernel's error, wrapped with the node, its op and the user's source line.
    match &err {
        CpuError::Node { value, op, loc: Some(l), source } => {
            assert_eq!((*value, op.as_str(), l), (s, "index_select", &loc));
            assert!(
                matches!(&**source, CpuError::Kernel { op, msg } if op == "index_select" && msg.contains("index 7"))
            );
        }
        other => panic!("expected a node error, got {other:?}"),
    }
    assert!(matches!(err.root(), CpuError::Kernel { .. }));
    assert_eq!(
        err.to_string(),
        "src/model.rs:12:5: index_select (%2): index_select: index 7 is out of range for dimension 0 with size 3"
    );
    // A node without a source location prints without one.
    g.nodes[0].loc = None;
    let err = interpret(&g, &[tf(&[1.0, 2.0, 3.0], &[3], DType::F32), ti(&[7], &[1], DType::I64)]).unwrap_err();
    assert!(err.to_string().starts_with("index_select (%2): index_select: index 7"), "{err}");
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[3], DType::F32), StorageId(0));
    let s = node(&mut g, Op::Composite(CompositeOp::Silu), &[x]);
    g.outputs = vec![s];
    let err = interpret(&g, &[tf(&[1.0, 2.0, 3.0], &[3], DType::F32)]).unwrap_err();
    assert!(matches!(&err, CpuError::Node { value, op, .. } if *value == s && op == "silu"), "{err:?}");
    assert!(err.to_string().contains("decompose it"), "{err}");
}

#[test]
fn shape_errors_and_overflowing_sizes_name_the_node() {
    // A node recorded for a larger input: inference rejects the concrete arguments.
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[3], DType::F32), StorageId(0));
    let y = g.add_input("y", TensorMeta::from_sizes(&[2], DType::F32), StorageId(1));
    let meta = TensorMeta::from_sizes(&[3], DType::F32);
    let loc = SourceLoc { file: "m.rs".into(), line: 3, col: 9 };
    let z = g.add_node(Op::Binary(BinaryOp::Add), vec![x, y], meta, StorageId(2), Some(loc));
    g.outputs = vec![z];
    let err = interpret(&g, &[tf(&[1.0, 2.0, 3.0], &[3], DType::F32), tf(&[1.0, 2.0], &[2], DType::F32)]).unwrap_err();
    assert!(matches!(&err, CpuError::Node { value, .. } if *value == z), "{err:?}");
    assert!(matches!(err.root(), CpuError::Shape(e) if e.kind() == "broadcast"), "{err:?}");
    assert!(err.to_string().starts_with("m.rs:3:9: add (%2): add: "), "{err}");
    // A symbol bound from a huge stride: the node's size s0 * s0 overflows i64.
    let s0 = Dim::sym(SymId(0));
    let mut g = Graph::new();
    let xm = TensorMeta {
        shape: aotgrad_ir::dims![Dim::Const(1)],
        strides: aotgrad_ir::dims![s0.clone()],
        offset: Dim::Const(0),
        dtype: DType::F32,
    };
    let x = g.add_input("x", xm, StorageId(0));
    let sq = s0.mul(&s0);
    let op = Op::Full { shape: aotgrad_ir::dims![sq.clone()], value: Scalar::Float(0.0), dtype: DType::F32 };
    let z = g.add_node(op, vec![], TensorMeta::contiguous(vec![sq], DType::F32), StorageId(1), None);
    g.outputs = vec![z, x];
    let base = tf(&[5.0], &[1], DType::F32);
    let err = interpret(&g, &[strided(&base, &[1], &[1 << 40], 0)]).unwrap_err();
    assert!(matches!(&err, CpuError::Node { value, .. } if *value == z), "{err:?}");
    assert_eq!(err.to_string(), "full (%1): full: s0*s0 overflows i64 for the symbol values of these inputs");
}

fn d(v: usize) -> Dim {
    Dim::from(v)
}

#[test]
fn a_graph_mixing_every_op_family_agrees_with_inference_and_hand_values() {
    use aotgrad_ir::CmpOp;
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[2, 3], DType::F32), StorageId(0));
    let u = node(&mut g, Op::Unsqueeze(0), &[x]);
    let e = node(&mut g, Op::Expand(aotgrad_ir::dims![d(4), d(2), d(3)]), &[u]);
    let et = node(&mut g, Op::Transpose(1, 2), &[e]);
    let bm = node(&mut g, Op::Bmm, &[e, et]);
    let sel = node(&mut g, Op::Select { dim: 0, index: d(1) }, &[x]);
    let c = node(&mut g, Op::Compare(CmpOp::Gt), &[x, sel]);
    let zero = node(&mut g, Op::Full { shape: aotgrad_ir::dims![], value: Scalar::Float(0.0), dtype: DType::F32 }, &[]);
    let w = node(&mut g, Op::Where, &[c, x, zero]);
    let cl = node(&mut g, Op::Clamp { min: Some(Scalar::Float(-1.0)), max: Some(Scalar::Float(1.0)) }, &[x]);
    let ca = node(&mut g, Op::Cast(DType::I64), &[x]);
    let am = node(&mut g, Op::ArgMax { dim: 1, keepdim: true }, &[x]);
    let ga = node(&mut g, Op::Gather(1), &[x, am]);
    let sa = node(&mut g, Op::ScatterAdd(1), &[x, am, ga]);
    let ar = node(
        &mut g,
        Op::Arange { start: Scalar::Int(2), end: Scalar::Int(-1), step: Scalar::Int(-1), dtype: DType::I64 },
        &[],
    );
    let is = node(&mut g, Op::IndexSelect(1), &[x, ar]);
    let cat = node(&mut g, Op::Cat(0), &[x, is]);
    let v = node(&mut g, Op::View(aotgrad_ir::dims![d(3), d(4)]), &[cat]);
    let red = node(&mut g, Op::Reduce { op: ReduceOp::Amax, dims: vec![0], keepdim: false }, &[v]);
    // Mutate a clone through a strided slice, then transpose it in place.
    let cx = node(&mut g, Op::Clone, &[x]);
    let sl = node(&mut g, Op::Slice { dim: 1, start: d(0), end: d(3), step: 2 }, &[cx]);
    let _mut = node(&mut g, Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(10)))), &[sl]);
    let mt = node(&mut g, Op::MetaInPlace(Box::new(Op::Transpose(0, 1))), &[cx]);
    let src =
        node(&mut g, Op::Full { shape: aotgrad_ir::dims![d(2)], value: Scalar::Float(-7.0), dtype: DType::F32 }, &[]);
    let ss = node(&mut g, Op::SelectScatter { dim: 1, index: d(1) }, &[x, src]);
    let r =
        node(&mut g, Op::Randn { shape: aotgrad_ir::dims![d(2), d(3)], dtype: DType::F32, seed: 1, offset: 0 }, &[]);
    let b = node(&mut g, Op::Bernoulli { p: 0.5, seed: 1, offset: 0 }, &[r]);
    g.outputs = vec![bm, w, cl, ca, am, sa, cat, red, mt, ss, b];

    let xv = [0.5, -2.0, 3.0, 1.5, 4.0, -0.25];
    let outs = interpret(&g, &[tf(&xv, &[2, 3], DType::F32)]).unwrap();
    let f = |i: usize| outs[i].to_vec_f64();
    assert_eq!(outs[0].shape(), vec![4, 2, 2]);
    assert_eq!(f(0)[..4], [13.25, -8.0, -8.0, 18.3125]);
    assert_eq!(f(0)[12..], [13.25, -8.0, -8.0, 18.3125]);
    assert_eq!(f(1), vec![0.0, 0.0, 3.0, 0.0, 0.0, 0.0]);
    assert_eq!(f(2), vec![0.5, -1.0, 1.0, 1.0, 1.0, -0.25]);
    assert_eq!(outs[3].to_vec_i64(), vec![0, -2, 3, 1, 4, 0]);
    assert_eq!(outs[4].to_vec_i64(), vec![2, 1]);
    assert_eq!(f(5), vec![0.5, -2.0, 6.0, 1.5, 8.0, -0.25]);
    assert_eq!(f(6), vec![0.5, -2.0, 3.0, 1.5, 4.0, -0.25, 3.0, -2.0, 0.5, -0.25, 4.0, 1.5]);
    // cat viewed as (3, 4): rows [0.5 -2 3 1.5], [4 -0.25 3 -2], [0.5 -0.25 4 1.5].
    assert_eq!(f(7), vec![4.0, -0.25, 4.0, 1.5]);
    assert_eq!(outs[8].shape(), vec![3, 2]);
    assert_eq!(f(8), vec![5.0, 15.0, -2.0, 4.0, 30.0, -2.5]);
    assert_eq!(f(9), vec![0.5, -7.0, 3.0, 1.5, -7.0, -0.25]);
    assert!(f(10).iter().all(|&v| v == 0.0 || v == 1.0));
}

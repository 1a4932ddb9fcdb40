//! Golden tests of the printed text, hand-checked parses, and exact parse errors.

use super::ops::Base;
use super::{parse_graph, parse_graph_unchecked, print_graph};
use crate::dtype::{DType, Scalar};
use crate::error::ParseError;
use crate::graph::{Graph, Input, Node, SourceLoc, StorageId, ValueId};
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::{BinaryOp, CmpOp, CompositeOp, Op, ReduceOp, UnaryOp};
use crate::sym::{Dim, SymId};
use expect_test::expect;

fn s(i: u32) -> Dim {
    Dim::sym(SymId(i))
}
fn c(v: i64) -> Dim {
    Dim::Const(v)
}
fn meta(shape: Dims, strides: Option<Dims>, offset: Dim, dtype: DType) -> TensorMeta {
    let mut m = TensorMeta::contiguous(shape, dtype);
    if let Some(st) = strides {
        m.strides = st;
    }
    m.offset = offset;
    m
}
fn node(out: u32, op: Op, args: &[u32], meta: TensorMeta, storage: u32) -> Node {
    Node {
        out: ValueId(out),
        op,
        args: args.iter().map(|&a| ValueId(a)).collect(),
        meta,
        storage: StorageId(storage),
        loc: None,
    }
}

/// `x: f32[s0, 3]`, `w: f32[3, 4]`: an in-place op on an input, views of it (one through
/// a symbolic slice), a metadata mutation, and a fill through a view.
fn golden_graph() -> Graph {
    let f32 = DType::F32;
    let n = s(0).scale(3); // 3*s0
    let mut g = Graph::new();
    g.inputs.push(Input {
        id: ValueId(0),
        name: "x".into(),
        meta: TensorMeta::contiguous(vec![s(0), c(3)], f32),
        storage: StorageId(0),
    });
    g.inputs.push(Input {
        id: ValueId(1),
        name: "w \"weight\"".into(),
        meta: TensorMeta::contiguous(vec![c(3), c(4)], f32),
        storage: StorageId(1),
    });
    let mut mul = node(
        2,
        Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)))),
        &[0],
        TensorMeta::contiguous(vec![s(0), c(3)], f32),
        0,
    );
    mul.loc = Some(SourceLoc { file: "tests/golden.rs".into(), line: 10, col: 5 });
    g.nodes.push(mul);
    g.nodes.push(node(3, Op::T, &[2], meta(crate::dims![c(3), s(0)], Some(crate::dims![c(1), c(3)]), c(0), f32), 0));
    g.nodes.push(node(4, Op::View(crate::dims![n.clone()]), &[2], TensorMeta::contiguous(vec![n.clone()], f32), 0));
    let end = n.sub(&c(1));
    g.nodes.push(node(
        5,
        Op::Slice { dim: 0, start: c(1), end: end.clone(), step: 1 },
        &[4],
        meta(crate::dims![end.sub(&c(1))], None, c(1), f32),
        0,
    ));
    let mut zero = node(
        6,
        Op::InPlace(Box::new(Op::FullLike { value: Scalar::Float(0.0), dtype: None })),
        &[5],
        meta(crate::dims![end.sub(&c(1))], None, c(1), f32),
        0,
    );
    zero.loc = Some(SourceLoc { file: "C:\\src\\my model.rs".into(), line: 12, col: 9 });
    g.nodes.push(zero);
    g.nodes.push(node(
        7,
        Op::MetaInPlace(Box::new(Op::T)),
        &[1],
        meta(crate::dims![c(4), c(3)], Some(crate::dims![c(1), c(4)]), c(0), f32),
        1,
    ));
    g.nodes.push(node(8, Op::Mm, &[2, 3], TensorMeta::contiguous(vec![s(0), s(0)], f32), 2));
    g.nodes.push(node(
        9,
        Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false },
        &[8],
        TensorMeta::contiguous(vec![s(0)], f32),
        3,
    ));
    g.nodes.push(node(
        10,
        Op::CompareScalar(CmpOp::Gt, Scalar::Int(0)),
        &[9],
        TensorMeta::contiguous(vec![s(0)], DType::Bool),
        4,
    ));
    g.outputs = vec![ValueId(2), ValueId(3), ValueId(9), ValueId(10), ValueId(2)];
    g
}

#[test]
fn text_golden_views_inplace_symbolic() {
    let g = golden_graph();
    let text = print_graph(&g);
    expect![[r#"
        graph(%0: f32[s0, 3] #0 "x", %1: f32[3, 4] #1 "w \"weight\"") {
          %2: f32[s0, 3] #0 = mul_(%0, 2.0)  # tests/golden.rs:10:5
          %3: f32[3, s0] strides=[1, 3] #0 = t(%2)
          %4: f32[3*s0] #0 = view(%2, [3*s0])
          %5: f32[3*s0 - 2] offset=1 #0 = slice(%4, dim=0, start=1, end=3*s0 - 1, step=1)
          %6: f32[3*s0 - 2] offset=1 #0 = full_like_(%5, value=0.0, dtype=None)  # C:\src\my model.rs:12:9
          %7: f32[4, 3] strides=[1, 4] #1 = t_(%1)
          %8: f32[s0, s0] #2 = mm(%2, %3)
          %9: f32[s0] #3 = sum(%8, dims=[1], keepdim=false)
          %10: bool[s0] #4 = gt(%9, 0)
          return (%2, %3, %9, %10, %2)
        }
    "#]]
    .assert_eq(&text);
    assert_eq!(parse_graph(&text), Ok(g.clone()));
    assert_eq!(g.to_string(), text);
    assert_eq!(text.parse::<Graph>(), Ok(g));
}

#[test]
fn text_golden_every_family() {
    let mut g = Graph::new();
    let m = TensorMeta::from_sizes(&[2, 3], DType::F32);
    g.inputs.push(Input { id: ValueId(0), name: "a".into(), meta: m.clone(), storage: StorageId(0) });
    let ops = vec![
        Op::Unary(UnaryOp::LogicalNot),
        Op::Binary(BinaryOp::Pow),
        Op::BinaryScalar(BinaryOp::Div, Scalar::Float(1e20)),
        Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))),
        Op::InPlace(Box::new(Op::Copy)),
        Op::Clamp { min: Some(Scalar::Float(-0.0)), max: None },
        Op::Cast(DType::BF16),
        Op::ArgMin { dim: 1, keepdim: true },
        Op::Permute(vec![1, 0]),
        Op::MetaInPlace(Box::new(Op::Transpose(0, 1))),
        Op::Expand(crate::dims![c(4), s(1).mul(&s(1)), c(3)]),
        Op::Squeeze(vec![0, 2]),
        Op::MetaInPlace(Box::new(Op::Unsqueeze(0))),
        Op::Select { dim: 1, index: s(0).scale(-1).add(&c(1)) },
        Op::AsStrided { size: (crate::dims![c(2)]).to_vec(), stride: (crate::dims![c(3)]).to_vec(), offset: c(1) },
        Op::Full { shape: crate::dims![], value: Scalar::Bool(true), dtype: DType::Bool },
        Op::Arange {
            start: Scalar::Int(-3),
            end: Scalar::Float(f64::INFINITY),
            step: Scalar::Float(1e-5),
            dtype: DType::F64,
        },
        Op::Randn { shape: crate::dims![c(2)], dtype: DType::F16, seed: u64::MAX, offset: 7 },
        Op::Bernoulli { p: f64::from_bits(0x7ff8_0000_0000_0001), seed: 0, offset: 0 },
        Op::Cat(1),
        Op::SelectScatter { dim: 0, index: c(0) },
        Op::InPlace(Box::new(Op::Mm)),
        Op::MetaInPlace(Box::new(Op::Unary(UnaryOp::Relu))),
        Op::InPlace(Box::new(Op::InPlace(Box::new(Op::Binary(BinaryOp::Mul))))),
        Op::Composite(CompositeOp::LayerNorm { normalized_rank: 2, eps: 1e-5 }),
        Op::Composite(CompositeOp::Gelu { tanh: true }),
    ];
    for (i, op) in ops.into_iter().enumerate() {
        g.nodes.push(node(i as u32 + 1, op, &[0, i as u32], m.clone(), 1));
    }
    g.outputs = vec![];
    let text = print_graph(&g);
    expect![[r#"
        graph(%0: f32[2, 3] #0 "a") {
          %1: f32[2, 3] #1 = logical_not(%0, %0)
          %2: f32[2, 3] #1 = pow(%0, %1)
          %3: f32[2, 3] #1 = div(%0, %2, 1e20)
          %4: f32[2, 3] #1 = add_(%0, %3)
          %5: f32[2, 3] #1 = copy_(%0, %4)
          %6: f32[2, 3] #1 = clamp(%0, %5, min=-0.0, max=None)
          %7: f32[2, 3] #1 = to(%0, %6, dtype=bf16)
          %8: f32[2, 3] #1 = argmin(%0, %7, dim=1, keepdim=true)
          %9: f32[2, 3] #1 = permute(%0, %8, [1, 0])
          %10: f32[2, 3] #1 = transpose_(%0, %9, 0, 1)
          %11: f32[2, 3] #1 = expand(%0, %10, [4, s1*s1, 3])
          %12: f32[2, 3] #1 = squeeze(%0, %11, dims=[0, 2])
          %13: f32[2, 3] #1 = unsqueeze_(%0, %12, dim=0)
          %14: f32[2, 3] #1 = select(%0, %13, dim=1, index=-s0 + 1)
          %15: f32[2, 3] #1 = as_strided(%0, %14, size=[2], stride=[3], offset=1)
          %16: f32[2, 3] #1 = full(%0, %15, shape=[], value=true, dtype=bool)
          %17: f32[2, 3] #1 = arange(%0, %16, start=-3, end=inf, step=1e-5, dtype=f64)
          %18: f32[2, 3] #1 = randn(%0, %17, shape=[2], dtype=f16, seed=18446744073709551615, offset=7)
          %19: f32[2, 3] #1 = bernoulli(%0, %18, p=NaN(0x7ff8000000000001), seed=0, offset=0)
          %20: f32[2, 3] #1 = cat(%0, %19, dim=1)
          %21: f32[2, 3] #1 = select_scatter(%0, %20, dim=0, index=0)
          %22: f32[2, 3] #1 = inplace.mm(%0, %21)
          %23: f32[2, 3] #1 = meta_inplace.relu(%0, %22)
          %24: f32[2, 3] #1 = inplace.mul_(%0, %23)
          %25: f32[2, 3] #1 = layer_norm(%0, %24, normalized_rank=2, eps=1e-5)
          %26: f32[2, 3] #1 = gelu(%0, %25, tanh=true)
          return ()
        }
    "#]]
    .assert_eq(&text);
    // Not a valid program (the ops get one argument too many): syntax only.
    let back = parse_graph_unchecked(&text).expect("parses");
    assert_eq!(print_graph(&back), text);
    assert!(parse_graph(&text).unwrap_err().msg.starts_with("invalid program"));
    match &back.nodes[18].op {
        Op::Bernoulli { p, .. } => assert_eq!(p.to_bits(), 0x7ff8_0000_0000_0001),
        other => panic!("node 19 parsed as {other:?}"),
    }
    let without_nan: Vec<_> = back.nodes.iter().enumerate().filter(|(i, _)| *i != 18).map(|(_, n)| n).collect();
    let want: Vec<_> = g.nodes.iter().enumerate().filter(|(i, _)| *i != 18).map(|(_, n)| n).collect();
    assert_eq!(without_nan, want);
}

/// The ambiguous spellings resolve as documented.
#[test]
fn text_parse_disambiguates_scalar_and_inplace_forms() {
    let src = "graph(%0: i64[2] #0 \"x\", %1: i64[2] #1 \"y\") {
        %2: i64[2] #2 = mul(%0, %1)
        %3: i64[2] #3 = mul(%0, 2)
        %4: f32[2] #4 = mul(%0, 2.0)
        %5: i64[2] #0 = mul_(%0, %1)
        %6: i64[2] #0 = mul_(%0, -9223372036854775808)
        %7: bool[2] #5 = eq(%0, true)
        %8: i64[2] #0 = relu_(%0)
        %9: i64[2] #0 = t_(%0)
        return (%9)
    }";
    let g = parse_graph(src).expect("parses");
    let ops: Vec<Op> = g.nodes.iter().map(|n| n.op.clone()).collect();
    assert_eq!(
        ops,
        vec![
            Op::Binary(BinaryOp::Mul),
            Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(2)),
            Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)),
            Op::InPlace(Box::new(Op::Binary(BinaryOp::Mul))),
            Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(i64::MIN)))),
            Op::CompareScalar(CmpOp::Eq, Scalar::Bool(true)),
            Op::InPlace(Box::new(Op::Unary(UnaryOp::Relu))),
            Op::MetaInPlace(Box::new(Op::T)),
        ]
    );
    assert_eq!(g.nodes[0].args, vec![ValueId(0), ValueId(1)]);
    assert_eq!(g.nodes[1].args, vec![ValueId(0)]);
}

/// Symbolic dims in any term order parse to the canonical polynomial.
#[test]
fn text_parse_symbolic_dims() {
    let src = "graph(%0: f32[s1*s0 + 3*s0 - 2, -s0 + 1, s0*s0, 2 + s0 + s0] strides=[1, 0, -1, 9223372036854775807] offset=-9223372036854775808*s2 #7 \"\") {
        return (%0)
    }";
    let g = parse_graph(src).expect("parses");
    let m = &g.inputs[0].meta;
    let want0 = s(0).mul(&s(1)).add(&s(0).scale(3)).sub(&c(2));
    assert_eq!(m.shape, crate::dims![want0, c(1).sub(&s(0)), s(0).mul(&s(0)), s(0).scale(2).add(&c(2))]);
    assert_eq!(m.shape[0].to_string(), "3*s0 + s0*s1 - 2");
    assert_eq!(m.strides, crate::dims![c(1), c(0), c(-1), c(i64::MAX)]);
    assert_eq!(m.offset, s(2).scale(i64::MIN));
    assert_eq!(g.inputs[0].storage, StorageId(7));
}

#[test]
fn text_source_locations_with_odd_file_names() {
    for file in
        ["a:b:c.rs", " lead space.rs", "trail space ", "", "\"quoted\".rs", "new\nline.rs", "tab\there", "#7.rs"]
    {
        let mut g = Graph::new();
        g.nodes.push(Node {
            out: ValueId(0),
            op: Op::Full { shape: crate::dims![], value: Scalar::Int(1), dtype: DType::I64 },
            args: vec![],
            meta: TensorMeta::contiguous(vec![], DType::I64),
            storage: StorageId(0),
            loc: Some(SourceLoc { file: file.into(), line: u32::MAX, col: 0 }),
        });
        let text = print_graph(&g);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert_eq!(parse_graph(&text), Ok(g), "{text}");
    }
    // CRLF line ends and trailing blanks after the column are accepted.
    let src =
        "graph() {\r\n  %0: i64[] #0 = full(shape=[], value=1, dtype=i64)  # x.rs:3:4  \r\n  return (%0)\r\n}\r\n";
    let g = parse_graph(src).expect("parses");
    assert_eq!(g.nodes[0].loc, Some(SourceLoc { file: "x.rs".into(), line: 3, col: 4 }));
}

fn err(src: &str) -> ParseError {
    match parse_graph(src) {
        Ok(g) => panic!("parsed: {g:?}"),
        Err(e) => e,
    }
}

fn pe(line: usize, col: usize, msg: &str) -> ParseError {
    ParseError { line, col, msg: msg.into() }
}

#[test]
fn text_parse_errors_say_where_and_what() {
    assert_eq!(err(""), pe(1, 1, "expected `graph` at the start of a graph, found end of input"));
    assert_eq!(
        err("graph(%0: f33[2] #0 \"x\") {"),
        pe(1, 11, "unknown dtype `f33` for the tensor type (expected bool, i32, i64, f16, bf16, f32 or f64)")
    );
    assert_eq!(
        err("graph(%0: f32[2 #0 \"x\") {"),
        pe(1, 17, "expected `,` or `]` in the list for the shape, found `#0`")
    );
    assert_eq!(
        err("graph(%0: f32[2] \"x\") {"),
        pe(1, 18, "expected a storage id `#N` after the tensor type, found a string")
    );
    assert_eq!(err("graph() {\n  %1: f32[2] #0 = frob(%0)\n"), pe(2, 19, "unknown op `frob`"));
    assert_eq!(err("graph() {\n  %1: f32[2] #0 = mm_(%0, %1)\n"), pe(2, 19, "`mm_`: a trailing `_` marks an in-place op, which needs a pointwise or view op, and `mm` is neither (write `inplace.mm` or `meta_inplace.mm`)"));
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = slice(%0, dim=0, end=1)\n"),
        pe(2, 36, "slice: expected `start=`, found `end`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = slice(%0, dim=0, start=0)\n"),
        pe(2, 43, "slice: expected `,` and `end=`, found `)`")
    );
    assert_eq!(err("graph() {\n  %1: f32[2] #0 = sum(%0)\n"), pe(2, 25, "sum: expected `dims=`, found `)`"));
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = relu(%0, 2)\n"),
        pe(2, 28, "relu: expected a tensor argument `%N` after `,`, found `2`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = argmax(%0, dim=-1, keepdim=true)\n"),
        pe(2, 34, "expected a non-negative integer for `argmax` parameter `dim`, found `-`")
    );
    assert_eq!(err("graph() {\n  %1: f32[2] #0 = mul(%0, 1.5.2)\n"), pe(2, 27, "invalid number `1.5.2`"));
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = mul(%0, 99999999999999999999)\n"),
        pe(2, 27, "integer `99999999999999999999` is out of range (i64) for `mul` parameter `other`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2*3] #0 = t(%0)\n"),
        pe(2, 13, "expected a symbol like `s0` after `*` in the dim for the shape, found `3`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = t(%0)  # no location here\n"),
        pe(2, 28, "expected a source location `file:line:col` after `#`, found `no location here`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = t(%0)  # f.rs:1:x\n"),
        pe(2, 35, "expected a column number in the source location, found `x`")
    );
    assert_eq!(
        err("graph() {\n  return (%0)\n}\n}"),
        pe(4, 1, "expected end of input after the closing `}`, found `}`")
    );
    assert_eq!(
        err("graph(%0: f32[] #0 \"a\\q\") {"),
        pe(1, 22, "unknown escape `\\q` in a string (expected \\\\, \\\", \\n, \\r, \\t or \\u{..})")
    );
    assert_eq!(err("graph(%0: f32[] #0 \"abc"), pe(1, 20, "unterminated string: no closing `\"`"));
    assert_eq!(err("graph(%4294967296"), pe(1, 7, "value number `4294967296` does not fit in u32"));
    assert_eq!(err("graph() { @"), pe(1, 11, "unexpected character `@`"));
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = t(%0)  # \"f.rs:1:2\n"),
        pe(2, 28, "unterminated string: no closing `\"`")
    );
    assert_eq!(
        err("graph() {\n  %1: f32[2] #0 = t(%0)  # \"f.rs\":1:99999999999\n"),
        pe(2, 37, "column number `99999999999` in the source location is out of range (u32)")
    );
    assert_eq!(
        err("graph(%0: f32[9223372036854775807, 2] strides=[1, 1] #0 \"\")"),
        pe(1, 14, "the shape [9223372036854775807, 2] has more elements than fit in i64")
    );
    assert_eq!(
        err("graph(%0: f32[4611686018427387904*s0, s1, 2] #0 \"\")"),
        pe(1, 14, "the shape [4611686018427387904*s0, s1, 2] has more elements than fit in i64")
    );
    assert_eq!(
        err("graph(%0: f32[s0 + s0 + 9223372036854775807*s0] #0 \"\")"),
        pe(1, 25, "coefficient out of range (i64) in the dim for the shape")
    );
}

#[test]
fn text_empty_graph() {
    let g = Graph::new();
    expect![[r#"
        graph() {
          return ()
        }
    "#]]
    .assert_eq(&print_graph(&g));
    assert_eq!(parse_graph(&print_graph(&g)), Ok(g));
}

/// An op of each base, with arbitrary parameters.
fn proto(b: Base) -> Op {
    let d = || vec![Dim::Const(2)];
    match b {
        Base::Unary(u) => Op::Unary(u),
        Base::Binary(x) => Op::Binary(x),
        Base::Compare(c) => Op::Compare(c),
        Base::Reduce(r) => Op::Reduce { op: r, dims: vec![], keepdim: false },
        Base::Where => Op::Where,
        Base::Clamp => Op::Clamp { min: None, max: None },
        Base::Cast => Op::Cast(crate::DType::F32),
        Base::ArgMax => Op::ArgMax { dim: 0, keepdim: false },
        Base::ArgMin => Op::ArgMin { dim: 0, keepdim: false },
        Base::Cumsum => Op::Cumsum(0),
        Base::Argsort => Op::Argsort { dim: 0, descending: false },
        Base::Mm => Op::Mm,
        Base::Bmm => Op::Bmm,
        Base::View => Op::View(d().into()),
        Base::Permute => Op::Permute(vec![0]),
        Base::Transpose => Op::Transpose(0, 1),
        Base::T => Op::T,
        Base::Expand => Op::Expand(d().into()),
        Base::Squeeze => Op::Squeeze(vec![]),
        Base::Unsqueeze => Op::Unsqueeze(0),
        Base::Slice => Op::Slice { dim: 0, start: Dim::Const(0), end: Dim::Const(1), step: 1 },
        Base::Select => Op::Select { dim: 0, index: Dim::Const(0) },
        Base::AsStrided => Op::AsStrided { size: d(), stride: d(), offset: Dim::Const(0) },
        Base::Alias => Op::Alias,
        Base::Clone => Op::Clone,
        Base::UnsafeView => Op::UnsafeView(d().into()),
        Base::Copy => Op::Copy,
        Base::Full => Op::Full { shape: d().into(), value: Scalar::Int(0), dtype: crate::DType::F32 },
        Base::FullLike => Op::FullLike { value: Scalar::Int(0), dtype: None },
        Base::Arange => {
            Op::Arange { start: Scalar::Int(0), end: Scalar::Int(1), step: Scalar::Int(1), dtype: crate::DType::I64 }
        }
        Base::Rand => Op::Rand { shape: d().into(), dtype: crate::DType::F32, seed: 0, offset: 0 },
        Base::Randn => Op::Randn { shape: d().into(), dtype: crate::DType::F32, seed: 0, offset: 0 },
        Base::Bernoulli => Op::Bernoulli { p: 0.5, seed: 0, offset: 0 },
        Base::IndexSelect => Op::IndexSelect(0),
        Base::Gather => Op::Gather(0),
        Base::ScatterAdd => Op::ScatterAdd(0),
        Base::Cat => Op::Cat(0),
        Base::SliceScatter => Op::SliceScatter { dim: 0, start: Dim::Const(0), end: Dim::Const(1), step: 1 },
        Base::SelectScatter => Op::SelectScatter { dim: 0, index: Dim::Const(0) },
        Base::AsStridedScatter => Op::AsStridedScatter { size: d(), stride: d(), offset: Dim::Const(0) },
        Base::Linear => Op::Composite(CompositeOp::Linear),
        Base::Matmul => Op::Composite(CompositeOp::Matmul),
        Base::Gelu => Op::Composite(CompositeOp::Gelu { tanh: true }),
        Base::Silu => Op::Composite(CompositeOp::Silu),
        Base::Softmax => Op::Composite(CompositeOp::Softmax { dim: 1 }),
        Base::LogSoftmax => Op::Composite(CompositeOp::LogSoftmax { dim: 1 }),
        Base::LayerNorm => Op::Composite(CompositeOp::LayerNorm { normalized_rank: 1, eps: 1e-5 }),
        Base::Dropout => Op::Composite(CompositeOp::Dropout { p: 0.1, seed: 1, offset: 2 }),
        Base::Embedding => Op::Composite(CompositeOp::Embedding),
        Base::MseLoss => Op::Composite(CompositeOp::MseLoss),
        Base::CrossEntropy => Op::Composite(CompositeOp::CrossEntropy),
        Base::MaskedFill => Op::Composite(CompositeOp::MaskedFill { value: crate::Scalar::Float(-1.5) }),
        Base::Tril => Op::Composite(CompositeOp::Tril { diagonal: -1 }),
        Base::Triu => Op::Composite(CompositeOp::Triu { diagonal: 2 }),
        Base::Var => Op::Composite(CompositeOp::Var { dims: vec![0, 2], correction: 1, keepdim: true }),
        Base::OneHot => Op::Composite(CompositeOp::OneHot { num_classes: 4 }),
        Base::Conv2d => Op::Conv2d(conv()),
        Base::Conv2dInputGrad => Op::Conv2dInputGrad { conv: conv(), input: [7, 5] },
        Base::Conv2dWeightGrad => Op::Conv2dWeightGrad { conv: conv(), kernel: [3, 1] },
        Base::MaxPool2d => Op::MaxPool2d(pool()),
        Base::MaxPool2dGrad => Op::MaxPool2dGrad(pool()),
    }
}

fn conv() -> crate::Conv2dParams {
    crate::Conv2dParams { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 3 }
}

fn pool() -> crate::Pool2dParams {
    crate::Pool2dParams { kernel: [3, 2], stride: [2, 2], padding: [1, 0], dilation: [1, 1] }
}

#[test]
fn text_base_names_agree_with_op_name_and_are_unambiguous() {
    let all: Vec<Base> = Base::all().collect();
    assert_eq!(all.len(), 21 + 7 + 6 + 4 + 57);
    for &b in &all {
        assert_eq!(b.name(), proto(b).name(), "{b:?}");
        assert_eq!(Base::lookup(b.name()), Some(b), "name {} is used twice", b.name());
        // `x_` must stay free for the in-place spelling of `x`.
        assert!(!b.name().ends_with('_'), "{}", b.name());
        assert_eq!(Base::lookup(&format!("{}_", b.name())), None);
        assert!(b.name() != "inplace" && b.name() != "meta_inplace");
    }
}

//! Property tests of the graph text format: random graphs covering every op variant,
//! every parameter and odd metas, names and file names print and parse back exactly;
//! random and mutated text never makes the parser panic.

use aotgrad_ir::text::{parse_graph_unchecked, print_graph};
use aotgrad_ir::{
    BinaryOp, CmpOp, CompositeOp, DType, Dim, Graph, Input, Node, Op, ReduceOp, Scalar, SourceLoc, StorageId, SymId,
    TensorMeta, UnaryOp, ValueId,
};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use std::collections::BTreeMap;

// ---- metas -------------------------------------------------------------------------

fn coef() -> impl Strategy<Value = i64> {
    prop_oneof![4 => -5i64..=5, 1 => any::<i64>(), 1 => select(vec![i64::MIN, i64::MAX, i64::MIN + 1])]
}

/// A polynomial over s0..s3 with up to 4 terms of degree up to 3 (distinct monomials, so
/// building it cannot overflow).
fn poly() -> impl Strategy<Value = Dim> {
    vec((vec(0u32..4, 0..4), coef()), 1..5).prop_map(|terms| {
        let mut m: BTreeMap<Vec<u32>, i64> = BTreeMap::new();
        for (mut mono, c) in terms {
            mono.sort();
            m.insert(mono, c);
        }
        let mut acc = Dim::Const(0);
        for (mono, c) in m {
            let t = mono.iter().fold(Dim::Const(c), |t, s| t.mul(&Dim::sym(SymId(*s))));
            acc = acc.add(&t);
        }
        acc
    })
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![
        4 => (-2i64..20).prop_map(Dim::Const),
        1 => any::<i64>().prop_map(Dim::Const),
        1 => any::<u32>().prop_map(|s| Dim::sym(SymId(s))),
        3 => poly(),
    ]
}

fn dims() -> impl Strategy<Value = aotgrad_ir::Dims> {
    vec(dim(), 0..4).prop_map(aotgrad_ir::Dims::from)
}

fn dtype() -> impl Strategy<Value = DType> {
    select(DType::ALL.to_vec())
}

/// True when the product of the sizes (what contiguous strides multiply) fits in i64;
/// the parser rejects other shapes.
fn shape_fits(shape: &[Dim]) -> bool {
    let mut acc = Some(Dim::Const(1));
    for d in shape.iter().rev() {
        let factor = match d {
            Dim::Const(c) => Dim::Const((*c).max(1)),
            d => d.clone(),
        };
        acc = acc.and_then(|a| a.checked_mul(&factor));
    }
    acc.is_some()
}

fn meta() -> impl Strategy<Value = TensorMeta> {
    let shape = dims().prop_filter("element count fits i64", |s| shape_fits(s));
    (shape, option::of(vec(dim(), 0..5)), prop_oneof![Just(Dim::Const(0)), dim()], dtype()).prop_map(
        |(shape, strides, offset, dtype)| {
            let mut m = TensorMeta::contiguous(shape, dtype);
            if let Some(s) = strides {
                m.strides = s.into();
            }
            m.offset = offset;
            m
        },
    )
}

// ---- scalars ---------------------------------------------------------------------------

/// Any f64 but NaN (NaN != NaN would fail graph equality; NaN has its own test).
fn float(nan: bool) -> BoxedStrategy<f64> {
    let special = select(vec![
        0.0,
        -0.0,
        1.0,
        2.0,
        0.1,
        1e20,
        1e-5,
        1e16,
        123456789012345680.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        f64::EPSILON,
        5e-324,
    ]);
    let bits = any::<u64>().prop_map(f64::from_bits);
    if nan {
        let nans = any::<u64>().prop_map(|b| f64::from_bits(b | 0x7ff0_0000_0000_0001));
        prop_oneof![2 => special, 2 => bits, 1 => Just(f64::NAN), 2 => nans].boxed()
    } else {
        prop_oneof![special, bits.prop_filter("not NaN", |x| !x.is_nan()), -1e6f64..1e6].boxed()
    }
}

fn scalar(nan: bool) -> BoxedStrategy<Scalar> {
    prop_oneof![
        any::<bool>().prop_map(Scalar::Bool),
        prop_oneof![-3i64..10, any::<i64>()].prop_map(Scalar::Int),
        float(nan).prop_map(Scalar::Float),
    ]
    .boxed()
}

// ---- ops ------------------------------------------------------------------------------

fn usz() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..5, 1 => any::<usize>()]
}

fn usizes() -> impl Strategy<Value = Vec<usize>> {
    vec(usz(), 0..4)
}

fn seed() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..10, any::<u64>()]
}

/// Ops an `InPlace` wraps (pointwise).
fn pointwise_op(nan: bool) -> BoxedStrategy<Op> {
    prop_oneof![
        select(UnaryOp::ALL.to_vec()).prop_map(Op::Unary),
        select(BinaryOp::ALL.to_vec()).prop_map(Op::Binary),
        (select(BinaryOp::ALL.to_vec()), scalar(nan)).prop_map(|(b, s)| Op::BinaryScalar(b, s)),
        select(CmpOp::ALL.to_vec()).prop_map(Op::Compare),
        (select(CmpOp::ALL.to_vec()), scalar(nan)).prop_map(|(c, s)| Op::CompareScalar(c, s)),
        Just(Op::Where),
        (option::of(scalar(nan)), option::of(scalar(nan))).prop_map(|(min, max)| Op::Clamp { min, max }),
        dtype().prop_map(Op::Cast),
        Just(Op::Copy),
        (scalar(nan), option::of(dtype())).prop_map(|(value, dtype)| Op::FullLike { value, dtype }),
        (float(nan), seed(), seed()).prop_map(|(p, seed, offset)| Op::Bernoulli { p, seed, offset }),
    ]
    .boxed()
}

/// View ops (what a `MetaInPlace` wraps).
fn view_op() -> BoxedStrategy<Op> {
    prop_oneof![
        dims().prop_map(Op::View),
        usizes().prop_map(Op::Permute),
        (usz(), usz()).prop_map(|(a, b)| Op::Transpose(a, b)),
        Just(Op::T),
        dims().prop_map(Op::Expand),
        usizes().prop_map(Op::Squeeze),
        usz().prop_map(Op::Unsqueeze),
        (usz(), dim(), dim(), prop_oneof![1i64..4, any::<i64>()]).prop_map(|(dim, start, end, step)| Op::Slice {
            dim,
            start,
            end,
            step
        }),
        (usz(), dim()).prop_map(|(dim, index)| Op::Select { dim, index }),
        (dims(), dims(), dim()).prop_map(|(size, stride, offset)| Op::AsStrided {
            size: size.to_vec(),
            stride: stride.to_vec(),
            offset
        }),
        Just(Op::Alias),
    ]
    .boxed()
}

fn composite_op(nan: bool) -> BoxedStrategy<Op> {
    prop_oneof![
        Just(CompositeOp::Linear),
        Just(CompositeOp::Matmul),
        any::<bool>().prop_map(|tanh| CompositeOp::Gelu { tanh }),
        Just(CompositeOp::Silu),
        usz().prop_map(|dim| CompositeOp::Softmax { dim }),
        usz().prop_map(|dim| CompositeOp::LogSoftmax { dim }),
        (usz(), float(nan)).prop_map(|(normalized_rank, eps)| CompositeOp::LayerNorm { normalized_rank, eps }),
        (float(nan), seed(), seed()).prop_map(|(p, seed, offset)| CompositeOp::Dropout { p, seed, offset }),
        Just(CompositeOp::Embedding),
        Just(CompositeOp::MseLoss),
        Just(CompositeOp::CrossEntropy),
    ]
    .prop_map(Op::Composite)
    .boxed()
}

/// Every other op.
fn other_op(nan: bool) -> BoxedStrategy<Op> {
    let reduce = select(vec![ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Amin]);
    prop_oneof![
        (reduce, usizes(), any::<bool>()).prop_map(|(op, dims, keepdim)| Op::Reduce { op, dims, keepdim }),
        (usz(), any::<bool>()).prop_map(|(dim, keepdim)| Op::ArgMax { dim, keepdim }),
        (usz(), any::<bool>()).prop_map(|(dim, keepdim)| Op::ArgMin { dim, keepdim }),
        Just(Op::Mm),
        Just(Op::Bmm),
        Just(Op::Clone),
        dims().prop_map(Op::UnsafeView),
        (dims(), scalar(nan), dtype()).prop_map(|(shape, value, dtype)| Op::Full { shape, value, dtype }),
        (scalar(nan), scalar(nan), scalar(nan), dtype()).prop_map(|(start, end, step, dtype)| Op::Arange {
            start,
            end,
            step,
            dtype
        }),
        (dims(), dtype(), seed(), seed()).prop_map(|(shape, dtype, seed, offset)| Op::Rand {
            shape,
            dtype,
            seed,
            offset
        }),
        (dims(), dtype(), seed(), seed()).prop_map(|(shape, dtype, seed, offset)| Op::Randn {
            shape,
            dtype,
            seed,
            offset
        }),
        usz().prop_map(Op::IndexSelect),
        usz().prop_map(Op::Gather),
        usz().prop_map(Op::ScatterAdd),
        usz().prop_map(Op::Cat),
        (usz(), dim(), dim(), any::<i64>()).prop_map(|(dim, start, end, step)| Op::SliceScatter {
            dim,
            start,
            end,
            step
        }),
        (usz(), dim()).prop_map(|(dim, index)| Op::SelectScatter { dim, index }),
        (dims(), dims(), dim()).prop_map(|(size, stride, offset)| Op::AsStridedScatter {
            size: size.to_vec(),
            stride: stride.to_vec(),
            offset
        }),
        composite_op(nan),
    ]
    .boxed()
}

fn base_op(nan: bool) -> BoxedStrategy<Op> {
    prop_oneof![pointwise_op(nan), view_op(), other_op(nan)].boxed()
}

fn op(nan: bool) -> BoxedStrategy<Op> {
    prop_oneof![
        3 => pointwise_op(nan),
        3 => view_op(),
        4 => other_op(nan),
        2 => pointwise_op(nan).prop_map(|o| Op::InPlace(Box::new(o))),
        2 => view_op().prop_map(|o| Op::MetaInPlace(Box::new(o))),
        // Wrappings with no `_` spelling, and nesting.
        1 => (base_op(nan), vec(any::<bool>(), 1..4)).prop_map(|(mut o, wraps)| {
            for w in wraps {
                o = if w { Op::InPlace(Box::new(o)) } else { Op::MetaInPlace(Box::new(o)) };
            }
            o
        }),
    ]
    .boxed()
}

// ---- graphs ---------------------------------------------------------------------------

fn name() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z_][a-z0-9_]{0,8}", 1 => any::<String>(), 1 => "[ \"\\\\\n\t:#%]{0,6}"]
}

fn file() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z/_]{1,12}\\.rs",
        2 => "[ :a-z0-9#%\"\\\\/()=,]{0,12}",
        1 => any::<String>(),
    ]
}

fn loc() -> impl Strategy<Value = Option<SourceLoc>> {
    option::of((file(), any::<u32>(), any::<u32>()).prop_map(|(file, line, col)| SourceLoc {
        file: file.into(),
        line,
        col,
    }))
}

fn id() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..16, 1 => any::<u32>()]
}

prop_compose! {
    fn graph(nan: bool)(
        base in prop_oneof![Just(0u32), any::<u32>()],
        inputs in vec((name(), meta(), id()), 0..4),
        nodes in vec((op(nan), vec(id(), 0..4), meta(), id(), loc()), 0..10),
        outputs in vec(id(), 0..4),
    ) -> Graph {
        let mut g = Graph::new();
        let mut next = base;
        let mut fresh = || {
            let v = ValueId(next);
            next = next.wrapping_add(1);
            v
        };
        for (name, meta, storage) in inputs {
            g.inputs.push(Input { id: fresh(), name, meta, storage: StorageId(storage) });
        }
        for (op, args, meta, storage, loc) in nodes {
            let args = args.into_iter().map(ValueId).collect();
            g.nodes.push(Node { out: fresh(), op, args, meta, storage: StorageId(storage), loc });
        }
        g.outputs = outputs.into_iter().map(ValueId).collect();
        g
    }
}

/// Text edits applied to a valid graph's text.
#[derive(Clone, Debug)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, char),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let snippet = prop_oneof![
        select(vec![
            "%",
            "#",
            "#0",
            "%99999999999",
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            ",",
            "=",
            "-",
            "*",
            ".",
            "\"",
            "\\",
            "\n",
            " ",
            "# a:1:2",
            "s0",
            "s",
            "1e",
            "0x",
            "NaN(",
            "inf",
            "None",
            "_",
            "inplace.",
            "meta_inplace.",
            "mul_",
            "f32",
            "strides=",
            "offset=",
            "return",
            "graph",
            "\\u{",
            "99999999999999999999",
        ])
        .prop_map(String::from),
        any::<String>(),
    ];
    prop_oneof![
        (any::<usize>(), 1usize..8).prop_map(|(a, n)| Edit::Delete(a, n)),
        (any::<usize>(), snippet).prop_map(|(a, s)| Edit::Insert(a, s)),
        (any::<usize>(), any::<char>()).prop_map(|(a, c)| Edit::Replace(a, c)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..20).prop_map(|(a, n)| Edit::Duplicate(a, n)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut cs: Vec<char> = text.chars().collect();
    for e in edits {
        let len = cs.len().max(1);
        match e {
            Edit::Delete(a, n) => {
                let a = a % len;
                let b = (a + n).min(cs.len());
                if a < b {
                    cs.drain(a..b);
                }
            }
            Edit::Insert(a, s) => {
                let a = a % (cs.len() + 1);
                cs.splice(a..a, s.chars());
            }
            Edit::Replace(a, c) => {
                if !cs.is_empty() {
                    let a = a % cs.len();
                    cs[a] = *c;
                }
            }
            Edit::Truncate(a) => cs.truncate(a % len),
            Edit::Duplicate(a, n) => {
                let a = a % len;
                let b = (a + n).min(cs.len());
                if a < b {
                    let part: Vec<char> = cs[a..b].to_vec();
                    cs.splice(b..b, part);
                }
            }
        }
    }
    cs.into_iter().collect()
}

/// If `text` parses, printing the result and parsing again gives the same text; the
/// checked parse (which runs shape inference over whatever the text says) returns,
/// whatever the text, without panicking.
fn check_reparse(text: &str) -> Result<(), TestCaseError> {
    let _ = aotgrad_ir::text::parse_graph(text);
    if let Ok(g) = parse_graph_unchecked(text) {
        let printed = print_graph(&g);
        let again = parse_graph_unchecked(&printed).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        prop_assert_eq!(print_graph(&again), printed);
    }
    Ok(())
}

proptest! {
    // 512 cases unless PROPTEST_CASES says otherwise (for longer fuzzing runs).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    /// `parse_graph_unchecked(print_graph(g)) == g` for every graph (no NaN, so `==` is meaningful).
    #[test]
    fn text_roundtrip_random_graphs(g in graph(false)) {
        let text = print_graph(&g);
        let back = parse_graph_unchecked(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &g, "{}", text);
        prop_assert_eq!(print_graph(&back), text);
    }

    /// With NaNs of any bit pattern: the text is a fixed point, and since the printed
    /// float text is injective on f64 bits (NaNs print their bits), every value survives.
    #[test]
    fn text_roundtrip_graphs_with_nan(g in graph(true)) {
        let text = print_graph(&g);
        let back = parse_graph_unchecked(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(print_graph(&back), text);
    }

    /// Every f64 bit pattern round-trips through a scalar parameter.
    #[test]
    fn text_roundtrip_f64_bits(bits in any::<u64>(), int in any::<i64>()) {
        let x = f64::from_bits(bits);
        let mut g = Graph::new();
        let m = TensorMeta::contiguous(vec![], DType::F64);
        for op in [
            Op::BinaryScalar(BinaryOp::Add, Scalar::Float(x)),
            Op::BinaryScalar(BinaryOp::Add, Scalar::Int(int)),
            Op::Bernoulli { p: x, seed: 0, offset: 0 },
        ] {
            g.nodes.push(Node { out: ValueId(0), op, args: vec![], meta: m.clone(), storage: StorageId(0), loc: None });
        }
        let back = parse_graph_unchecked(&print_graph(&g)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        match (&back.nodes[0].op, &back.nodes[1].op, &back.nodes[2].op) {
            (Op::BinaryScalar(_, Scalar::Float(a)), Op::BinaryScalar(_, Scalar::Int(i)), Op::Bernoulli { p, .. }) => {
                prop_assert_eq!(a.to_bits(), bits);
                prop_assert_eq!(*i, int);
                prop_assert_eq!(p.to_bits(), bits);
            }
            other => prop_assert!(false, "parsed as {:?}", other),
        }
    }

    /// Random text never panics the parser.
    #[test]
    fn text_parse_random_strings_never_panics(
        s in prop_oneof![any::<String>(), "[%#a-z0-9_\\[\\](){}=,:.+*\" \n\\\\-]{0,80}"]
    ) {
        check_reparse(&s)?;
        check_reparse(&format!("graph() {{ {s}"))?;
    }

    /// Mutations of valid text never panic the parser; what still parses reprints stably.
    #[test]
    fn text_parse_mutated_text_never_panics(g in graph(true), edits in vec(edit(), 1..6)) {
        let text = apply(&print_graph(&g), &edits);
        check_reparse(&text)?;
    }
}

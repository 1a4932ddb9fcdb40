//! Traced graphs: core ops only by default, single nodes when kept, user overrides,
//! symbolic dims, the user's source line on every node, and errors naming the op.

use crate::util::{composite_nodes, input, run_graph, traced};
use aotgrad_ir::{CompositeOp, Dim, Op, UnaryOp};
use aotgrad_trace::decomp::{CompositeKind, DecompPolicy, DecompTable};
use aotgrad_trace::{trace, DType, Result, Tensor, TraceConfig};

// ---- tracing: decomposed, kept, overridden ---------------------------------------------

/// One call of every composite, on inputs `[x (4, 6), w (5, 6), b (5), idx (4) i64, t (4) i64]`.
fn all_composites(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, w, b, idx, t) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
    let h = x.linear(w, Some(b))?;
    Ok(vec![
        h.gelu()?,
        h.gelu_tanh()?,
        h.silu()?,
        h.softmax(-1)?,
        h.log_softmax(0)?,
        x.layer_norm(&[6], None, None, 1e-5)?,
        x.dropout(0.25, true, 7)?,
        Tensor::embedding(idx, w)?,
        h.mse_loss(&h.gelu()?)?,
        h.cross_entropy(t)?,
        x.matmul(&w.t()?)?,
        x.masked_fill(&x.gt(0.0)?, 0.5)?,
        x.tril(-1)?,
        x.triu(1)?,
        x.var(&[1], 1, false)?,
        idx.one_hot(5)?,
    ])
}

fn all_inputs() -> Vec<Tensor> {
    vec![
        input(&[4, 6], DType::F32, 80, 2.0).0,
        input(&[5, 6], DType::F32, 81, 1.0).0,
        input(&[5], DType::F32, 82, 1.0).0,
        Tensor::from_i64(&[1, 4, 0, 2], &[4]).unwrap(),
        Tensor::from_i64(&[0, 3, 4, 1], &[4]).unwrap(),
    ]
}

#[test]
fn traced_composites_are_core_ops_and_match_eager() {
    let inputs = all_inputs();
    let t = traced(all_composites, &inputs, DecompTable::default());
    assert!(composite_nodes(&t).is_empty(), "a composite node was recorded");
    let eager = all_composites(&inputs).unwrap();
    let replay = run_graph(&t, &inputs);
    assert_eq!(replay.len(), eager.len());
    for (i, (r, e)) in replay.iter().zip(&eager).enumerate() {
        assert_eq!(r.sizes().unwrap(), e.sizes().unwrap(), "output {i}");
        assert_eq!(r.to_vec_f64().unwrap(), e.to_vec_f64().unwrap(), "output {i}");
    }
}

#[test]
fn kept_composites_are_single_nodes() {
    let inputs = all_inputs();
    let t = traced(all_composites, &inputs, DecompTable::keep_all());
    let kinds: Vec<CompositeKind> = composite_nodes(&t).into_iter().map(CompositeKind::of).collect();
    use CompositeKind::*;
    let want = [
        Linear,
        Gelu,
        Gelu,
        Silu,
        Softmax,
        LogSoftmax,
        LayerNorm,
        Dropout,
        Embedding,
        Gelu,
        MseLoss,
        CrossEntropy,
        Matmul,
        MaskedFill,
        Tril,
        Triu,
        Var,
        OneHot,
    ];
    assert_eq!(kinds, want);
    // Only the composites, the transpose of `w` and the mask's `gt` are recorded.
    assert_eq!(t.graph.nodes.len(), want.len() + 2);

    let mut table = DecompTable::default();
    table.keep(CompositeKind::Softmax);
    let t = traced(|a| Ok(vec![a[0].softmax(1)?]), &inputs[..1], table);
    assert_eq!(t.graph.nodes.len(), 1);
    let node = &t.graph.nodes[0];
    assert_eq!(node.op, Op::Composite(CompositeOp::Softmax { dim: 1 }));
    assert_eq!(node.args, vec![t.graph.inputs[0].id]);
    assert_eq!(node.meta.shape, aotgrad_ir::dims![Dim::Const(4), Dim::Const(6)]);
}

#[test]
fn keeping_one_kind_leaves_the_others_decomposed() {
    let inputs = all_inputs();
    let mut table = DecompTable::default();
    table.keep(CompositeKind::Gelu);
    let t = traced(|a| Ok(vec![a[0].gelu()?.softmax(0)?]), &inputs[..1], table);
    assert_eq!(composite_nodes(&t), vec![&CompositeOp::Gelu { tanh: false }]);
    assert!(t.graph.nodes.len() > 2);
}

#[test]
fn overrides_replace_the_decomposition() {
    let inputs = all_inputs();
    let mut table = DecompTable::default();
    table.set_override(CompositeKind::Gelu, |args, op| {
        assert_eq!(op, &CompositeOp::Gelu { tanh: false });
        args[0].relu()
    });
    assert!(matches!(table.policy(CompositeKind::Gelu), DecompPolicy::Override(_)));
    let t = traced(|a| Ok(vec![a[0].gelu()?]), &inputs[..1], table.clone());
    assert!(t.graph.nodes.iter().all(|n| n.op != Op::Unary(UnaryOp::Erf)));
    assert!(t.graph.nodes.iter().any(|n| n.op == Op::Unary(UnaryOp::Relu)));
    let got = run_graph(&t, &inputs[..1])[0].to_vec_f64().unwrap();
    let want: Vec<f64> = inputs[0].to_vec_f64().unwrap().iter().map(|x| x.max(0.0)).collect();
    assert_eq!(got, want);

    // The ops added with issue 12 are overridable the same way: `var` without
    // Bessel's correction, whatever the call asked for.
    let mut t2 = DecompTable::default();
    t2.set_override(CompositeKind::Var, |args, op| {
        let CompositeOp::Var { dims, keepdim, .. } = op else { unreachable!("var override called for {op:?}") };
        let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let c = args[0].sub(&args[0].mean(&d, true)?)?;
        c.mul(&c)?.mean(&d, *keepdim)
    });
    let t = traced(|a| Ok(vec![a[0].var(&[1], 1, false)?]), &inputs[..1], t2);
    let got = run_graph(&t, &inputs[..1])[0].to_vec_f64().unwrap();
    let want = inputs[0].var(&[1], 0, false).unwrap().to_vec_f64().unwrap();
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5), "{got:?} vs {want:?}");

    // An override returning the wrong shape is rejected, naming the op.
    table.set_override(CompositeKind::Gelu, |args, _| args[0].sum(&[0], false));
    let e =
        trace(|a| Ok(vec![a[0].gelu()?]), &inputs[..1], &TraceConfig { decomps: table.clone(), ..Default::default() })
            .unwrap_err();
    assert_eq!(e.op(), Some("gelu"), "{e}");

    table.reset(CompositeKind::Gelu);
    assert!(matches!(table.policy(CompositeKind::Gelu), DecompPolicy::Decompose));
}

#[test]
fn composite_kinds_mirror_composite_ops() {
    let ops = [
        CompositeOp::Linear,
        CompositeOp::Matmul,
        CompositeOp::Gelu { tanh: true },
        CompositeOp::Silu,
        CompositeOp::Softmax { dim: 0 },
        CompositeOp::LogSoftmax { dim: 0 },
        CompositeOp::LayerNorm { normalized_rank: 1, eps: 1e-5 },
        CompositeOp::Dropout { p: 0.5, seed: 0, offset: 0 },
        CompositeOp::Embedding,
        CompositeOp::MseLoss,
        CompositeOp::CrossEntropy,
        CompositeOp::MaskedFill { value: 1.0.into() },
        CompositeOp::Tril { diagonal: 0 },
        CompositeOp::Triu { diagonal: 1 },
        CompositeOp::Var { dims: vec![0], correction: 1, keepdim: false },
        CompositeOp::OneHot { num_classes: 3 },
    ];
    let kinds: Vec<CompositeKind> = ops.iter().map(CompositeKind::of).collect();
    assert_eq!(kinds, CompositeKind::ALL);
    for (op, k) in ops.iter().zip(kinds) {
        assert_eq!(op.name(), k.name());
    }
    let table = DecompTable::default();
    assert!(CompositeKind::ALL.iter().all(|k| matches!(table.policy(*k), DecompPolicy::Decompose)));
}

#[test]
fn symbolic_batch_dims_flow_through() {
    let (x, _) = input(&[3, 4, 6], DType::F32, 90, 1.0);
    let (w, _) = input(&[5, 6], DType::F32, 91, 1.0);
    let config = TraceConfig { dynamic: vec![(0, 0), (0, 1)], ..TraceConfig::default() };
    let t =
        trace(|a| Ok(vec![a[0].linear(&a[1], None)?.softmax(-1)?.matmul(&a[1])?]), &[x.clone(), w.clone()], &config)
            .unwrap();
    let out = t.graph.outputs[0];
    let meta = &t.graph.nodes.iter().find(|n| n.out == out).unwrap().meta;
    assert_eq!(meta.shape.len(), 3);
    assert!(!meta.shape[0].is_const() && !meta.shape[1].is_const());
    assert_eq!(meta.shape[2], Dim::Const(6));
    let eager = x.linear(&w, None).unwrap().softmax(-1).unwrap().matmul(&w).unwrap();
    assert_eq!(run_graph(&t, &[x, w])[0].to_vec_f64().unwrap(), eager.to_vec_f64().unwrap());
}

// ---- source locations and errors -------------------------------------------------------

#[test]
fn decomposed_nodes_carry_the_user_line() {
    let inputs = all_inputs();
    let mut line = 0;
    let t = traced(
        |a| {
            let (y, l) = (a[0].layer_norm(&[6], Some(&a[0].select(0, 0)?), None, 1e-5)?.cross_entropy(&a[4])?, line!());
            line = l;
            Ok(vec![y])
        },
        &inputs,
        DecompTable::default(),
    );
    assert!(t.graph.nodes.len() > 10);
    for n in &t.graph.nodes {
        let loc = n.loc.as_ref().unwrap();
        assert_eq!(&*loc.file, file!(), "{loc}");
        assert_eq!(loc.line, line, "node {} ({})", n.out, n.op.name());
    }
}

#[test]
fn errors_name_the_composite_and_the_line() {
    let ints = Tensor::from_i64(&[1, 2, 3], &[3]).unwrap();
    let (e, line) = (ints.softmax(0).unwrap_err(), line!());
    assert_eq!(e.op(), Some("softmax"), "{e}");
    assert!(e.to_string().contains("softmax"), "{e}");
    assert_eq!(e.loc().unwrap().line, line);
    assert_eq!(ints.gelu().unwrap_err().op(), Some("gelu"));
    assert_eq!(ints.log_softmax(0).unwrap_err().op(), Some("log_softmax"));

    let (x, _) = input(&[2, 3], DType::F32, 100, 1.0);
    let (w, _) = input(&[4, 5], DType::F32, 101, 1.0);
    let e = x.linear(&w, None).unwrap_err();
    assert_eq!(e.op(), Some("linear"), "{e}");
    assert!(e.to_string().contains("linear"), "{e}");
    assert_eq!(x.matmul(&w).unwrap_err().op(), Some("matmul"));
    let scalar = Tensor::from_f64(&[1.0], &[], DType::F32).unwrap();
    assert_eq!(x.matmul(&scalar).unwrap_err().op(), Some("matmul"));

    let float_target = Tensor::from_f64(&[0.0, 1.0], &[2], DType::F32).unwrap();
    let e = x.cross_entropy(&float_target).unwrap_err();
    assert_eq!(e.op(), Some("cross_entropy"), "{e}");
    assert!(e.to_string().contains("cross_entropy"), "{e}");
    // A class index out of range is found by the decomposition's gather kernel.
    let out_of_range = Tensor::from_i64(&[0, 7], &[2]).unwrap();
    let (e, line) = (x.cross_entropy(&out_of_range).unwrap_err(), line!());
    assert_eq!(e.op(), Some("cross_entropy"), "{e}");
    assert!(e.to_string().contains("cross_entropy") && e.to_string().contains('7'), "{e}");
    assert_eq!(e.loc().unwrap().line, line);
    assert_eq!(Tensor::embedding(&out_of_range, &w).unwrap_err().op(), Some("embedding"));
    let bad_shape = Tensor::from_i64(&[0, 1, 2], &[3]).unwrap();
    assert_eq!(x.cross_entropy(&bad_shape).unwrap_err().op(), Some("cross_entropy"));

    assert_eq!(x.softmax(2).unwrap_err().op(), Some("softmax"));
    assert_eq!(x.layer_norm(&[2], None, None, 1e-5).unwrap_err().op(), Some("layer_norm"));
    let (w3, _) = input(&[2], DType::F32, 102, 1.0);
    assert_eq!(x.layer_norm(&[3], Some(&w3), None, 1e-5).unwrap_err().op(), Some("layer_norm"));
    let e = x.layer_norm(&[3], None, Some(&w3), 1e-5).unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
    assert_eq!(Tensor::embedding(&float_target, &w).unwrap_err().op(), Some("embedding"));

    // The same rejections while tracing.
    let e = trace(|a| Ok(vec![a[0].linear(&a[1], None)?]), &[x, w], &TraceConfig::default()).unwrap_err();
    assert_eq!(e.op(), Some("linear"), "{e}");
}

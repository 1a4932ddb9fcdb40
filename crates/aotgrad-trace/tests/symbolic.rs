//! Symbolic dims: dynamic input dims become symbols (shared under duck sizing), the
//! guards tracing relied on are recorded, and `check` accepts or rejects new sizes.

use aotgrad_ir::text::print_graph;
use aotgrad_ir::{DimList, SymId};
use aotgrad_trace::{trace, DType, Dim, GuardFailure, Result, Tensor, TraceConfig};
use std::collections::HashMap;

fn x(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f64(&vec![1.0; n], shape, DType::F32).expect("valid data")
}

fn add(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![a[0].add(&a[1])?])
}

fn shape_text(t: &aotgrad_trace::Traced, v: aotgrad_ir::ValueId) -> String {
    DimList(&t.graph.meta_of(v).expect("value").shape).to_string()
}

#[test]
fn duck_sizing_shares_one_symbol() -> Result<()> {
    let cfg = TraceConfig { dynamic: vec![(0, 0), (1, 0)], ..TraceConfig::default() };
    let t = trace(add, &[x(&[4, 3]), x(&[4, 3])], &cfg)?;
    assert_eq!(t.shape_env.num_symbols(), 1);
    assert_eq!(shape_text(&t, t.graph.inputs[0].id), "[s0, 3]");
    assert_eq!(shape_text(&t, t.graph.inputs[1].id), "[s0, 3]");
    assert_eq!(shape_text(&t, t.graph.outputs[0]), "[s0, 3]");
    assert!(t.shape_env.guards().is_empty(), "{:?}", t.shape_env.guards());
    // Contiguous inputs get symbolic contiguous strides.
    assert_eq!(DimList(&t.graph.inputs[0].meta.strides).to_string(), "[3, 1]");
    let metas: Vec<_> = t.graph.inputs.iter().map(|i| i.meta.clone()).collect();
    let b = t.shape_env.check_inputs(&metas, &[vec![7, 3], vec![7, 3]])?;
    assert_eq!(b, HashMap::from([(SymId(0), 7)]));
    assert!(t.shape_env.check_inputs(&metas, &[vec![7, 3], vec![8, 3]]).is_err());
    Ok(())
}

#[test]
fn without_duck_sizing_equal_sizes_are_guarded() -> Result<()> {
    let cfg = TraceConfig { dynamic: vec![(0, 0), (1, 0)], duck_shape: false, ..TraceConfig::default() };
    let t = trace(add, &[x(&[4, 3]), x(&[4, 3])], &cfg)?;
    assert_eq!(t.shape_env.num_symbols(), 2);
    assert_eq!(shape_text(&t, t.graph.inputs[0].id), "[s0, 3]");
    assert_eq!(shape_text(&t, t.graph.inputs[1].id), "[s1, 3]");
    let guards: Vec<String> = t.shape_env.guards().iter().map(|g| g.to_string()).collect();
    assert_eq!(guards, vec!["s0 == s1"]);
    let metas: Vec<_> = t.graph.inputs.iter().map(|i| i.meta.clone()).collect();
    let b = t.shape_env.bind_inputs(&metas, &[vec![5, 3], vec![5, 3]])?;
    assert_eq!(b, HashMap::from([(SymId(0), 5), (SymId(1), 5)]));
    t.shape_env.check(&b)?;
    let b = t.shape_env.bind_inputs(&metas, &[vec![5, 3], vec![6, 3]])?;
    let e = t.shape_env.check(&b).unwrap_err();
    assert!(matches!(e, GuardFailure::Guard { .. }));
    assert_eq!(e.to_string(), "guard `s0 == s1` failed: s0 = 5, s1 = 6");
    // A size of 1 would broadcast differently: symbols stand for sizes >= 2 only.
    assert!(t.shape_env.bind_inputs(&metas, &[vec![1, 3], vec![1, 3]]).is_err());
    Ok(())
}

#[test]
fn view_of_a_symbolic_input() -> Result<()> {
    let cfg = TraceConfig { dynamic: vec![(0, 0)], ..TraceConfig::default() };
    let t = trace(
        |a| {
            let flat = a[0].view(&[-1])?;
            let back = flat.view_dims(&[Dim::Const(-1), Dim::Const(3)])?;
            let first = a[0].shape()[0].clone();
            assert!(a[0].sizes().is_err(), "symbolic sizes are not concrete");
            let z = Tensor::zeros_dims(&[first, Dim::Const(3)], DType::F32)?;
            Ok(vec![flat, back.add(&z)?, a[0].sum(&[0], false)?])
        },
        &[x(&[5, 3])],
        &cfg,
    )?;
    let shapes: Vec<String> = t.graph.outputs.iter().map(|v| shape_text(&t, *v)).collect();
    assert_eq!(shapes, vec!["[3*s0]", "[s0, 3]", "[3]"]);
    assert!(t.shape_env.guards().is_empty(), "{:?}", t.shape_env.guards());
    assert_eq!(t.shape_env.hint(SymId(0)), Some(5));
    let text = print_graph(&t.graph);
    assert!(text.contains("s0"), "{text}");
    assert_eq!(aotgrad_ir::text::parse_graph(&text).expect("parses"), t.graph);
    Ok(())
}

#[test]
fn sizes_zero_and_one_are_specialized() -> Result<()> {
    let cfg = TraceConfig { dynamic: vec![(0, 0), (0, 1)], ..TraceConfig::default() };
    let t = trace(|a| Ok(vec![a[0].mul(2)?]), &[x(&[1, 6])], &cfg)?;
    assert_eq!(shape_text(&t, t.graph.inputs[0].id), "[1, s0]");
    Ok(())
}

#[test]
fn branching_on_a_symbolic_size_records_a_guard() -> Result<()> {
    let cfg = TraceConfig { dynamic: vec![(0, 0)], ..TraceConfig::default() };
    // narrow needs `2 + 3 <= s0`: decided from the hint 8 and guarded.
    let t = trace(|a| Ok(vec![a[0].narrow(0, 2, 3)?]), &[x(&[8])], &cfg)?;
    let guards: Vec<String> = t.shape_env.guards().iter().map(|g| g.to_string()).collect();
    assert_eq!(guards, vec!["5 <= s0"]);
    let metas = vec![t.graph.inputs[0].meta.clone()];
    assert!(t.shape_env.check_inputs(&metas, &[vec![5]]).is_ok());
    let e = t.shape_env.check_inputs(&metas, &[vec![4]]).unwrap_err();
    assert_eq!(e.to_string(), "guard `5 <= s0` failed: s0 = 4");
    Ok(())
}

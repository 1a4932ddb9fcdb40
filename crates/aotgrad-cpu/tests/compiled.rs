//! The backend differential suite: every backend runs the same graphs as the reference
//! interpreter and must return the same metadata and values within explicit
//! tolerances. Here: the compiled CPU backend at 1 thread (deterministic) and 2
//! threads, on every core op family over random shapes, including non-contiguous,
//! broadcast, expanded, zero-size and 0-d inputs; plus golden kernel plans and the
//! buffer plan's accounting.

mod common;
mod differential;

use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::{Backend, BinaryOp, CompiledGraph, DType, Dim, Graph, Op, ReduceOp, Scalar, UnaryOp, ValueId};
use differential::*;
use expect_test::expect;

/// The compiled CPU backend at 1 thread (deterministic) and 2 threads, with its
/// pointwise kernels compiled to machine code where the machine allows (the
/// default), and at 1 thread on the block interpreter alone.
fn suite() -> Suite {
    Suite {
        backends: vec![
            ("cpu, 1 thread".into(), Box::new(CpuBackend::new(1))),
            ("cpu, 2 threads".into(), Box::new(CpuBackend::new(2))),
            ("cpu, 1 thread, interpreted bodies".into(), Box::new(CpuBackend::new(1).jit(false))),
        ],
        f64: true,
        tol_scale: 1.0,
    }
}

fn check(g: &Graph, inputs: &[CpuTensor], tol: f64) {
    suite().check(g, inputs, tol)
}

#[test]
fn unary_ops_on_every_layout() {
    differential::unary_ops_on_every_layout(&suite());
}

#[test]
fn binary_compare_where_with_broadcasting() {
    differential::binary_compare_where_with_broadcasting(&suite());
}

#[test]
fn reductions_with_prologues() {
    differential::reductions_with_prologues(&suite());
}

#[test]
fn softmax_like_row_and_column_chains() {
    differential::softmax_like_row_and_column_chains(&suite());
}

#[test]
fn matmuls_with_transposed_operands_and_epilogues() {
    differential::matmuls_with_transposed_operands_and_epilogues(&suite());
}

#[test]
fn reductions_over_copies_of_transposed_values() {
    differential::reductions_over_copies_of_transposed_values(&suite());
}

#[test]
fn views_of_a_value_beside_its_copy() {
    differential::views_of_a_value_beside_its_copy(&suite());
}

#[test]
fn extern_ops_views_and_aliasing_outputs() {
    differential::extern_ops_views_and_aliasing_outputs(&suite());
}

#[test]
fn scatters_in_place_and_copying() {
    differential::scatters_in_place_and_copying(&suite());
}

#[test]
fn dynamic_shapes_lower_per_binding() {
    differential::dynamic_shapes_lower_per_binding(&suite());
}

#[test]
fn input_checks_match_the_interpreter() {
    differential::input_checks_match_the_interpreter(&suite());
}

#[test]
fn tiles_of_short_rows_cross_dims_and_thread_chunks() {
    differential::tiles_of_short_rows_cross_dims_and_thread_chunks(&suite());
}

#[test]
fn scans_on_every_layout() {
    differential::scans_on_every_layout(&suite());
}

#[test]
fn independent_chains_of_several_tensors() {
    differential::independent_chains_of_several_tensors_match(&suite());
}

/// Consecutive independent pointwise kernels run as one dispatch (a multi-tensor
/// kernel); the kernel that reads one of their results stays out of it.
#[test]
fn independent_pointwise_kernels_are_one_dispatch() {
    let g = differential::independent_chains_of_several_tensors(DType::F64);
    let c = CpuBackend::new(2).compile_graph(&g).unwrap();
    assert_eq!(kinds(&c), vec!["pointwise"; 6]);
    assert_eq!(c.dispatch_groups(), Some(vec![(0, 5)]));
}

#[test]
fn golden_plan_of_a_pointwise_chain_is_one_kernel() {
    let g = pointwise_graph();
    let c = CpuBackend::new(1).compile_graph(&g).unwrap();
    expect![[r#"
        plan: 4 nodes -> 1 kernels, 0 slots, arena 0 B (unshared 0 B), outputs 128 B, peak 128 B
        b0 = input 0 f32[4, 8]
        b1 = input 1 f32[8]
        b2 = output f32[4, 8]
        k0: pointwise [4, 8] f32 (4 nodes)
            r0 = load b0 [8, 1]+0
            r1 = sin r0
            r2 = const 2
            r3 = mul r1, r2
            r4 = load b1 [0, 1]+0
            r5 = add r3, r4
            r6 = relu r5
            store r6 -> b2 [8, 1]+0
        outputs: b2 f32[4, 8]
    "#]]
    .assert_eq(&c.plan_text().unwrap());
    let ins: Vec<CpuTensor> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    check(&g, &ins, 1e-6);
}

#[test]
fn a_long_pointwise_reduce_chain_uses_bounded_buffers() {
    // Rounds of (30 pointwise ops, then a row softmax-like normalisation): every round
    // materializes a few values, yet the arena keeps a bounded number of slots: row
    // groups keep at most four buffers of the whole space (and their row results)
    // live, whatever the number of rounds.
    let chain = |rounds: usize| {
        let mut g = Graph::new();
        let mut v = input(&mut g, "x", m(&[16, 32], DType::F32));
        for round in 0..rounds {
            for i in 0..30 {
                let op = if i % 3 == 0 {
                    Op::Unary(UnaryOp::Tanh)
                } else {
                    Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.01))
                };
                v = node(&mut g, op, &[v]);
            }
            let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[v]);
            let d = node(&mut g, Op::Binary(BinaryOp::Div), &[v, s]);
            v = node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(round as f64)), &[d]);
        }
        g.outputs = vec![v];
        g
    };
    let slots_of = |g: &Graph| {
        let c = CpuBackend::new(1).compile_graph(g).unwrap();
        let plan = c.plan().unwrap();
        assert!(plan.kernels.len() <= 12 + 1, "{} kernels for {} nodes", plan.kernels.len(), g.nodes.len());
        let text = c.plan_text().unwrap();
        let slots: usize = text.split(", ").find_map(|p| p.strip_suffix(" slots")).unwrap().parse().unwrap();
        assert!(slots <= 10, "{slots} slots:\n{text}");
        slots
    };
    let g = chain(12);
    assert_eq!(slots_of(&g), slots_of(&chain(36)), "the arena grows with the chain");
    let xm = g.inputs[0].meta.clone();
    let x = tensor_for(&xm, 0.2, false);
    check(&g, std::slice::from_ref(&x), 1e-4);
    // What a call allocates is exactly the reported peak (first call: arena + outputs);
    // a second call reuses the arena and allocates only its outputs.
    let c = CpuBackend::new(1).compile_graph(&g).unwrap();
    c.run(std::slice::from_ref(&x)).unwrap();
    let first = c.alloc_stats();
    assert_eq!(first.arena_bytes + first.output_bytes, c.peak_bytes().unwrap());
    c.run(&[x]).unwrap();
    let second = c.alloc_stats();
    assert_eq!(second.arena_bytes, first.arena_bytes);
    assert_eq!(second.output_bytes, 2 * first.output_bytes);
}

#[test]
fn artifacts_round_trip_and_corruption_is_detected() {
    let g = pointwise_graph();
    let b = CpuBackend::new(1);
    let c = b.compile(&g).unwrap();
    let bytes = c.serialize();
    let back = b.deserialize(&bytes).expect("deserialize");
    let ins: Vec<CpuTensor> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    assert_eq!(back.run(&ins).unwrap()[0].to_vec_f64(), c.run(&ins).unwrap()[0].to_vec_f64());
    // A plan that does not match its graph (here: another graph's plan) is rejected.
    let mut art: aotgrad_cpu::compiled::CpuArtifact = aotgrad_ir::codec::decode("artifact", &bytes).unwrap();
    let mut other = g.clone();
    for n in &mut other.nodes {
        if n.op == Op::Unary(UnaryOp::Sin) {
            n.op = Op::Unary(UnaryOp::Cos);
        }
    }
    assert_ne!(other, g);
    let other_art: aotgrad_cpu::compiled::CpuArtifact =
        aotgrad_ir::codec::decode("artifact", &b.compile(&other).unwrap().serialize()).unwrap();
    let own_plan = std::mem::replace(&mut art.plan, other_art.plan.clone());
    let bad = aotgrad_ir::codec::encode("artifact", &art).unwrap();
    let e = b.deserialize(&bad).err().expect("mismatched plan").to_string();
    assert!(e.contains("plan does not match its graph"), "{e}");
    // So is a lowered plan that is not the graph's.
    art.plan = own_plan;
    art.lowered = other_art.lowered.clone();
    let bad = aotgrad_ir::codec::encode("artifact", &art).unwrap();
    let e = b.deserialize(&bad).err().expect("mismatched lowered plan").to_string();
    assert!(e.contains("lowered plan does not match its graph"), "{e}");
    assert!(b.deserialize(b"not an artifact").is_err());
    // Every truncation is rejected.
    for len in 0..bytes.len() {
        assert!(b.deserialize(&bytes[..len]).is_err(), "truncated to {len}");
    }
}

fn kinds(c: &aotgrad_cpu::compiled::CpuCompiledGraph) -> Vec<String> {
    c.plan()
        .unwrap()
        .kernels
        .iter()
        .map(|k| match k {
            aotgrad_fusion::Kernel::Rows(r) => {
                let st: Vec<&str> = r.stages.iter().map(|s| s.kind_name()).collect();
                format!("rows({})", st.join(" "))
            }
            k => k.kind_name().to_string(),
        })
        .collect()
}

#[test]
fn golden_plan_of_a_row_softmax_is_one_row_group() {
    let g = softmax_graph(4, 8, DType::F32);
    let c = CpuBackend::new(1).compile_graph(&g).unwrap();
    expect![[r#"
        plan: 5 nodes -> 1 kernels, 3 slots, arena 160 B (unshared 160 B), outputs 128 B, peak 288 B
        b0 = input 0 f32[4, 8]
        b1 = slot 0 f32[4, 1]
        b2 = slot 1 f32[4, 8]
        b3 = slot 2 f32[4, 1]
        b4 = output f32[4, 8]
        k0: rows [4, 8] outer 1 (4 stages, 5 nodes)
          s0: reduce amax over [1] of [4, 8] f32 (1 nodes) -> b1 [1, 0]+0
              r0 = load b0 [8, 1]+0
          s1: pointwise [4, 8] f32 (2 nodes)
              r0 = load b0 [8, 1]+0
              r1 = load b1 [1, 0]+0
              r2 = sub r0, r1
              r3 = exp r2
              store r3 -> b2 [8, 1]+0
          s2: reduce sum over [1] of [4, 8] f32 (1 nodes) -> b3 [1, 0]+0
              r0 = load b2 [8, 1]+0
          s3: pointwise [4, 8] f32 (1 nodes)
              r0 = load b2 [8, 1]+0
              r1 = load b3 [1, 0]+0
              r2 = div r0, r1
              store r2 -> b4 [8, 1]+0
        outputs: b4 f32[4, 8]
    "#]]
    .assert_eq(&c.plan_text().unwrap());
    check(&g, &[tensor_for(&g.inputs[0].meta, 0.3, false)], 1e-6);
}

#[test]
fn row_groups_match_the_interpreter_across_blocks_threads_and_dtypes() {
    // Rows shorter than a block (several rows per block, several blocks per task),
    // rows longer than a block, one row (not grouped), and f64.
    for (rows, len, dtype) in
        [(300, 70, DType::F32), (5, 20_000, DType::F32), (1, 64, DType::F32), (64, 33, DType::F64), (0, 8, DType::F32)]
    {
        let g = softmax_graph(rows, len, dtype);
        let c = CpuBackend::new(2).compile_graph(&g).unwrap();
        let grouped = kinds(&c) == ["rows(reduce pointwise reduce pointwise)"];
        assert_eq!(grouped, rows != 1, "{rows}x{len}: {:?}", kinds(&c));
        check(&g, &[tensor_for(&g.inputs[0].meta, 0.3, false)], 1e-6);
    }
    for (b, rows, len) in [(2, 3, 16), (4, 130, 96), (1, 1, 5)] {
        let g = layer_norm_graph(b, rows, len);
        let c = CpuBackend::new(2).compile_graph(&g).unwrap();
        let want: &[&str] = if b * rows > 1 {
            // `x - mean` is recomputed by the variance and the output rather than stored.
            &["rows(pointwise reduce reduce pointwise pointwise)"]
        } else {
            &["pointwise", "reduce", "reduce", "pointwise", "pointwise"]
        };
        assert_eq!(kinds(&c), want, "{b}x{rows}x{len}");
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, 0.2 + i as f64, false)).collect();
        check(&g, &ins, 1e-5);
    }
}

#[test]
fn row_groups_stop_where_a_stage_reads_another_row() {
    // The second reduction reads the exponentials transposed (a [n, n] space): a
    // stage would read rows another block has not written yet, so it is not grouped.
    let n = 40;
    let mut g = Graph::new();
    let xm = m(&[n, n], DType::F32);
    let x = input(&mut g, "x", xm.clone());
    let mx = node(&mut g, Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: true }, &[x]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, mx]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let et = node(&mut g, Op::Transpose(0, 1), &[e]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[et]);
    let p = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs = vec![p];
    let c = CpuBackend::new(2).compile_graph(&g).unwrap();
    assert_eq!(kinds(&c), ["rows(reduce pointwise)", "rows(reduce pointwise)"]);
    check(&g, &[tensor_for(&xm, 0.5, false)], 1e-6);
}

#[test]
fn concatenations_are_copy_kernels_into_windows_of_the_result() {
    for dim in [0usize, 1] {
        let mut g = Graph::new();
        let a = input(&mut g, "a", m(&[3, 4], DType::F32));
        let b = input(&mut g, "b", m(&[4, 3], DType::F32));
        let c = input(&mut g, "c", m(&[4], DType::F32));
        let bt = node(&mut g, Op::Transpose(0, 1), &[b]);
        let c1 = node(&mut g, Op::Unsqueeze(0), &[c]);
        let ce = node(&mut g, Op::Expand(aotgrad_ir::dims![Dim::Const(2), Dim::Const(4)]), &[c1]);
        let s = node(&mut g, Op::Unary(UnaryOp::Sin), &[a]);
        let (x, y, z) = if dim == 0 { (s, bt, ce) } else { (s, bt, bt) };
        let e = node(&mut g, Op::Slice { dim, start: Dim::Const(0), end: Dim::Const(0), step: 1 }, &[x]);
        let out = node(&mut g, Op::Cat(dim), &[x, e, y, z]);
        g.outputs = vec![out];
        let c = CpuBackend::new(1).compile_graph(&g).unwrap();
        assert!(!kinds(&c).iter().any(|k| k == "extern"), "{:?}", kinds(&c));
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        check(&g, &ins, 1e-6);
    }
}

/// Plans holding every kind of kernel (pointwise, reductions, row groups, products
/// with and without epilogues, extern ops) and symbolic sizes.
fn plans_of_every_kind() -> Vec<aotgrad_fusion::KernelPlan> {
    let graphs = graphs_of_every_kind();
    let plans: Vec<_> =
        graphs.iter().map(|g| CpuBackend::new(1).compile_graph(g).unwrap().plan().unwrap().clone()).collect();
    let kinds: std::collections::BTreeSet<&str> =
        plans.iter().flat_map(|p| p.kernels.iter().map(|k| k.kind_name())).collect();
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), ["extern", "matmul", "pointwise", "reduce", "rows"]);
    assert!(plans.iter().any(|p| !p.is_static()), "a symbolic plan");
    assert!(plans
        .iter()
        .any(|p| p.kernels.iter().any(|k| matches!(k, aotgrad_fusion::Kernel::Matmul(m) if m.epilogue.is_some()))));
    plans
}

/// Graphs whose plans hold every kind of kernel, and one with symbolic sizes.
fn graphs_of_every_kind() -> Vec<Graph> {
    let mut graphs = vec![pointwise_graph(), softmax_graph(4, 8, DType::F32), layer_norm_graph(2, 3, 8)];
    // A product with an epilogue, and one without.
    let mut g = Graph::new();
    let a = input(&mut g, "a", m(&[5, 7], DType::F32));
    let bt = input(&mut g, "bt", m(&[3, 7], DType::F32));
    let bias = input(&mut g, "bias", m(&[3], DType::F32));
    let b = node(&mut g, Op::T, &[bt]);
    let p = node(&mut g, Op::Mm, &[a, b]);
    let q = node(&mut g, Op::Binary(BinaryOp::Add), &[p, bias]);
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[q]);
    let p2 = node(&mut g, Op::Mm, &[a, b]);
    g.outputs = vec![r, p2];
    graphs.push(g);
    // Extern ops.
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[4, 3], DType::F32));
    let idx = input(&mut g, "i", m(&[2], DType::I64));
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let sel = node(&mut g, Op::IndexSelect(0), &[e, idx]);
    g.outputs = vec![sel];
    graphs.push(g);
    // Symbolic sizes.
    let s0 = Dim::sym(aotgrad_ir::SymId(0));
    let mut g = Graph::new();
    let x = input(&mut g, "x", aotgrad_ir::TensorMeta::contiguous(vec![s0, Dim::from(3usize)], DType::F32));
    let y = input(&mut g, "y", m(&[3], DType::F32));
    let xy = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, y]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[xy]);
    let xt = node(&mut g, Op::T, &[x]);
    let gram = node(&mut g, Op::Mm, &[xt, x]);
    g.outputs = vec![s, gram];
    graphs.push(g);
    graphs
}

/// A loaded artifact runs its stored lowered plan (static plans; a symbolic one is
/// lowered per binding) and gives what the compiled graph gives. The lowered plan is
/// checked before it runs: damage to it is an error or another plan within bounds,
/// never a panic or an access outside a buffer (each damaged plan that loads is run).
#[test]
fn stored_lowered_plans_are_checked_before_they_run() {
    let mut rejected = 0usize;
    for g in graphs_of_every_kind() {
        let b = CpuBackend::new(1);
        let c = b.compile_graph(&g).unwrap();
        let bytes = c.serialize();
        let art: aotgrad_cpu::compiled::CpuArtifact = aotgrad_ir::codec::decode("artifact", &bytes).unwrap();
        let is_static = c.plan().unwrap().is_static();
        assert_eq!(!art.lowered.is_empty(), is_static, "a lowered plan is stored exactly for a static plan");
        if !is_static {
            continue;
        }
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        let want: Vec<Vec<f64>> = c.run(&ins).unwrap().iter().map(|t| t.to_vec_f64()).collect();
        let loaded = b.load_verified(&bytes).unwrap();
        let got: Vec<Vec<f64>> = loaded.run(&ins).unwrap().iter().map(|t| t.to_vec_f64()).collect();
        assert_eq!(got, want);
        // Saving a loaded graph writes the artifact it was loaded from.
        assert_eq!(loaded.serialize(), bytes);
        let interp = CpuBackend::new(1).jit(false);
        for i in 0..art.lowered.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut damaged = art.clone();
                damaged.lowered[i] ^= flip;
                let bad = aotgrad_ir::codec::encode("artifact", &damaged).unwrap();
                match interp.load_verified(&bad) {
                    Err(e) => {
                        let e = e.to_string();
                        assert!(e.contains("lowered plan"), "{e}");
                        rejected += usize::from(e.contains("is inconsistent"));
                    }
                    Ok(l) => {
                        let _ = l.run(&ins);
                    }
                }
            }
        }
        // And a few bytes at once, set to arbitrary values (a fixed pseudo-random walk).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let mut damaged = art.clone();
            for _ in 0..3 {
                let at = (next() % damaged.lowered.len() as u64) as usize;
                damaged.lowered[at] = next() as u8;
            }
            let bad = aotgrad_ir::codec::encode("artifact", &damaged).unwrap();
            if let Ok(l) = interp.load_verified(&bad) {
                let _ = l.run(&ins);
            }
        }
    }
    assert!(rejected > 0, "some damage is caught by the lowered plan's check");
}

/// A plan's binary form (flat tables) and its readable form (nested) both give the
/// plan back; any damage to the binary form is an error or another valid plan, never
/// a panic, and every truncation is an error.
#[test]
fn kernel_plans_round_trip_through_both_forms() {
    use aotgrad_fusion::KernelPlan;
    for plan in plans_of_every_kind() {
        let bytes = aotgrad_ir::codec::encode("plan", &plan).unwrap();
        assert_eq!(aotgrad_ir::codec::decode::<KernelPlan>("plan", &bytes).unwrap(), plan);
        let json = serde_json::to_string(&plan).unwrap();
        assert!(json.contains("\"kernels\""), "the readable form is nested: {json}");
        assert_eq!(serde_json::from_str::<KernelPlan>(&json).unwrap(), plan);
        for len in 0..bytes.len() {
            assert!(aotgrad_ir::codec::decode::<KernelPlan>("plan", &bytes[..len]).is_err(), "truncated to {len}");
        }
        let mut inconsistent = 0;
        for i in 0..bytes.len() {
            for flip in [1u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[i] ^= flip;
                if let Err(e) = aotgrad_ir::codec::decode::<KernelPlan>("plan", &bad) {
                    inconsistent += e.to_string().contains("malformed kernel plan") as usize;
                }
            }
        }
        assert!(inconsistent > 0, "some damage decodes as tables that disagree with the kernels");
        // Tables that disagree with the kernels are errors naming the plan.
        let mut longer = bytes.clone();
        longer.push(0);
        let e = aotgrad_ir::codec::decode::<KernelPlan>("plan", &longer).unwrap_err().to_string();
        assert!(e.contains("trailing"), "{e}");
    }
}

/// `p - 0.1 * g` and `m * 0.9 + g`, the new values of the mutated inputs `p` and `m`
/// (graph outputs 0 and 1), then `s = sum(g)`: an optimizer step's shape.
fn update_graph() -> (Graph, [ValueId; 3]) {
    let mut g = Graph::new();
    let p = input(&mut g, "p", m(&[4, 8], DType::F32));
    let gr = input(&mut g, "g", m(&[4, 8], DType::F32));
    let mo = input(&mut g, "m", m(&[4, 8], DType::F32));
    let step = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.1)), &[gr]);
    let p2 = node(&mut g, Op::Binary(BinaryOp::Sub), &[p, step]);
    let decayed = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.9)), &[mo]);
    let m2 = node(&mut g, Op::Binary(BinaryOp::Add), &[decayed, gr]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[gr]);
    g.outputs = vec![p2, m2, s];
    (g, [p, gr, mo])
}

/// With [`aotgrad_ir::CompileOptions::input_updates`], a mutated input's new value is
/// stored into the input's own buffer: no output buffer, the returned tensor shares
/// the input's storage (the caller then skips its copy), and the values are the
/// interpreter's. The storage's version is left to the caller.
#[test]
fn mutated_inputs_are_updated_in_place_when_asked() {
    let (g, _) = update_graph();
    let opts = aotgrad_ir::CompileOptions { input_updates: vec![(0, 0), (1, 2)] };
    for backend in [CpuBackend::new(1), CpuBackend::new(2), CpuBackend::new(1).jit(false)] {
        let c = backend.compile_graph_with(&g, &opts).unwrap();
        expect![[r#"
            plan: 5 nodes -> 3 kernels, 0 slots, arena 0 B (unshared 0 B), outputs 4 B, peak 4 B
            b0 = input 0 (updated in place) f32[4, 8]
            b1 = input 1 f32[4, 8]
            b2 = input 2 (updated in place) f32[4, 8]
            b3 = output f32[]
            k0: pointwise [4, 8] f32 (2 nodes)
                r0 = load b1 [8, 1]+0
                r1 = const 0.1
                r2 = mul r0, r1
                r3 = load b0 [8, 1]+0
                r4 = sub r3, r2
                store r4 -> b0 [8, 1]+0
            k1: pointwise [4, 8] f32 (2 nodes)
                r0 = load b2 [8, 1]+0
                r1 = const 0.9
                r2 = mul r0, r1
                r3 = load b1 [8, 1]+0
                r4 = add r2, r3
                store r4 -> b2 [8, 1]+0
            k2: reduce sum over [0, 1] of [4, 8] f32 (1 nodes) -> b3 [0, 0]+0
                r0 = load b1 [8, 1]+0
            outputs: b0 f32[4, 8], b2 f32[4, 8], b3 f32[]
        "#]]
        .assert_eq(&c.plan_text().unwrap());
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        let fresh: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        let want = aotgrad_cpu::interpret(&g, &fresh).unwrap();
        let versions: Vec<u64> = ins.iter().map(|t| t.storage.version()).collect();
        let got = c.run(&ins).unwrap();
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_vec_f64(), b.to_vec_f64(), "output {k}");
        }
        assert!(got[0].same_storage(&ins[0]) && got[1].same_storage(&ins[2]));
        assert_eq!(ins[0].to_vec_f64(), want[0].to_vec_f64(), "the input holds its new value");
        assert_eq!(ins.iter().map(|t| t.storage.version()).collect::<Vec<_>>(), versions);
        // The artifact keeps the updates: a checked load and a full re-check agree.
        let bytes = c.serialize();
        for loaded in [backend.load_verified(&bytes).unwrap(), backend.deserialize(&bytes).unwrap()] {
            let again: Vec<CpuTensor> =
                g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
            let out = loaded.run(&again).unwrap();
            assert!(out[0].same_storage(&again[0]));
            assert_eq!(again[2].to_vec_f64(), want[1].to_vec_f64());
        }
    }
}

/// Where storing in place could change what the graph computes, the value gets a
/// fresh output as before: the old value is read after the new one is written (by a
/// later kernel, or in the writing kernel at another index), the input is itself an
/// output, or the new value is another output too.
#[test]
fn input_updates_that_are_unsafe_stay_out_of_place() {
    let updated = |g: &Graph, updates: Vec<(usize, usize)>| -> String {
        let c =
            CpuBackend::new(1).compile_graph_with(g, &aotgrad_ir::CompileOptions { input_updates: updates }).unwrap();
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        let fresh: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        let want = aotgrad_cpu::interpret(g, &fresh).unwrap();
        let got = c.run(&ins).unwrap();
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            for (x, y) in a.to_vec_f64().iter().zip(b.to_vec_f64()) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "output {k}: {x} vs {y}");
            }
        }
        c.plan_text().unwrap()
    };
    // A later kernel reads the old value (`sum(p)` after `p2` is stored).
    let mut g = Graph::new();
    let p = input(&mut g, "p", m(&[4, 8], DType::F32));
    let p2 = node(&mut g, Op::Unary(UnaryOp::Exp), &[p]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[p]);
    g.outputs = vec![p2, s];
    assert!(!updated(&g, vec![(0, 0)]).contains("updated in place"));
    // The writing kernel reads the input transposed.
    let mut g = Graph::new();
    let p = input(&mut g, "p", m(&[4, 4], DType::F32));
    let pt = node(&mut g, Op::T, &[p]);
    let p2 = node(&mut g, Op::Binary(BinaryOp::Add), &[p, pt]);
    g.outputs = vec![p2];
    assert!(!updated(&g, vec![(0, 0)]).contains("updated in place"));
    // The input is returned too, or the new value is returned twice.
    let (mut g, [p, ..]) = update_graph();
    g.outputs.push(p);
    assert!(!updated(&g, vec![(0, 0)]).contains("input 0 (updated in place)"));
    let (mut g, _) = update_graph();
    let twice = g.outputs[0];
    g.outputs.push(twice);
    assert!(!updated(&g, vec![(0, 0)]).contains("input 0 (updated in place)"));
    // A later kernel reading the *new* value is fine: it reads the input's buffer.
    let (mut g, _) = update_graph();
    let p2 = g.outputs[0];
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[p2]);
    g.outputs.push(e);
    assert!(updated(&g, vec![(0, 0)]).contains("input 0 (updated in place)"));
}

/// Products split across threads sum every element as one thread does, bit for bit:
/// the `gemm` crate blocks the inner dim differently for small and large products and
/// runs single rows or columns as matrix-vector products, so a split must keep every
/// block on the whole product's side (inner dims above 512, blocks near 64, 1-wide
/// remainders; transposed and plain right operands, and products computed
/// column-major and copied row-major).
#[test]
fn split_products_match_one_thread_bit_for_bit() {
    for (n, k, mm, transposed) in [
        (128, 1568, 10, true),
        (128, 1568, 10, false),
        (100, 600, 70, false),
        (17, 700, 130, true),
        (130, 520, 17, false),
        (64, 513, 200, true),
        (66, 1030, 66, false),
        (33, 2048, 129, true),
        (64, 512, 512, true),
        (128, 784, 256, true),
        (40, 600, 96, true),
        // Row-major right operands (a backward's `g @ w`): column-major at 1 thread.
        (64, 512, 512, false),
        (128, 256, 128, false),
    ] {
        let mut g = Graph::new();
        let a = input(&mut g, "a", m(&[n, k], DType::F32));
        let b = if transposed {
            let bt = input(&mut g, "bt", m(&[mm, k], DType::F32));
            node(&mut g, Op::T, &[bt])
        } else {
            input(&mut g, "b", m(&[k, mm], DType::F32))
        };
        let p = node(&mut g, Op::Mm, &[a, b]);
        g.outputs = vec![p];
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64 + 0.5, false)).collect();
        let one = CpuBackend::new(1).compile(&g).unwrap().run(&ins).unwrap()[0].to_vec_f64();
        let two = CpuBackend::new(2).compile(&g).unwrap().run(&ins).unwrap()[0].to_vec_f64();
        let differ = one.iter().zip(&two).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "{n}x{k}x{mm} (transposed {transposed}): {differ} elements differ");
    }
}

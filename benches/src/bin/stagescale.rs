//! Dev: every compile stage of a pathological program (`KIND=chain`, the matmul →
//! softmax → relu chain, by default; `KIND=mixed` adds a transpose and a weight
//! between ops; any kind of `aotgrad_benches::pathological`) timed on its own at
//! several lengths (`SIZES=1000,10000,100000`), training path, with node counts, to
//! find which stage stops being linear.
use aotgrad_trace::{trace, TraceConfig};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "1000,10000,100000".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let kind = std::env::var("KIND").unwrap_or_else(|_| "chain".into());
    println!("kind: {kind}");
    println!(
        "sizes: Node {} B, Op {} B, TensorMeta {} B, Kernel {} B",
        std::mem::size_of::<aotgrad_ir::Node>(),
        std::mem::size_of::<aotgrad_ir::Op>(),
        std::mem::size_of::<aotgrad_ir::TensorMeta>(),
        std::mem::size_of::<aotgrad_fusion::Kernel>()
    );
    for n in sizes {
        let inputs = aotgrad_benches::pathological_inputs(&kind, true)?;
        let mut times: Vec<(&str, f64, usize)> = Vec::new();
        let mut t0 = Instant::now();
        let mut lap = |name: &'static str, nodes: usize, times: &mut Vec<(&str, f64, usize)>| {
            times.push((name, t0.elapsed().as_secs_f64(), nodes));
            t0 = Instant::now();
        };
        let k = kind.clone();
        let t = trace(
            move |a: &[aotgrad_trace::Tensor]| aotgrad_benches::pathological_program(&k, n, a),
            &inputs,
            &TraceConfig::default(),
        )?;
        lap("trace", t.graph.nodes.len(), &mut times);
        let f = aotgrad_benches::functionalize_stage(&t)?;
        lap("functionalize", f.graph.nodes.len(), &mut times);
        let j = aotgrad_benches::joint_stage(&t, &f)?;
        lap("joint", j.graph.nodes.len(), &mut times);
        let s = aotgrad_benches::simplify_stage(&j)?;
        lap("simplify", s.graph.nodes.len(), &mut times);
        let p = aotgrad_benches::mincut_stage(&s, 1.0)?;
        lap("partition", p.forward.nodes.len() + p.backward.nodes.len(), &mut times);
        let be = aotgrad_cpu::CpuBackend::new(1);
        let plan = aotgrad_fusion::plan_graph(&p.backward)?;
        lap("plan backward", plan.kernels.len(), &mut times);
        drop(plan);
        let fw = be.compile_graph(&p.forward)?;
        lap("backend forward", p.forward.nodes.len(), &mut times);
        let bw = be.compile_graph(&p.backward)?;
        lap("backend backward", p.backward.nodes.len(), &mut times);
        drop((fw, bw));
        println!(
            "n={n}: {}",
            times
                .iter()
                .map(|(s, t, k)| format!("{s} {:.3}s ({k} nodes, {:.2} µs/node)", t, t * 1e6 / *k as f64))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}

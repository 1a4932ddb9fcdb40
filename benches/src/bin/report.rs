//! `cargo xtask bench` prints this: node counts, saved bytes per partitioner (vs
//! PyTorch's anchors), recomputation, and median stage times over repeated runs.

use anyhow::Result;
use aotgrad_benches::*;
use std::time::Instant;

fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

fn main() -> Result<()> {
    let runs: usize = std::env::var("AOTGRAD_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    for w in [mlp()?, transformer()?] {
        let t = trace_stage(&w)?;
        let f = functionalize_stage(&t)?;
        let j = joint_stage(&t, &f)?;
        let s = simplify_stage(&j)?;
        let d = default_stage(&s)?;
        println!("== {} ==", w.name);
        println!(
            "nodes: traced {}, functional {}, joint {}, simplified {}",
            t.graph.nodes.len(),
            f.graph.nodes.len(),
            j.graph.nodes.len(),
            s.graph.nodes.len()
        );
        println!(
            "saved activation bytes: default {} | PyTorch min-cut anchor {}",
            d.report.activation_bytes, w.pytorch_saved_bytes
        );
        let total = graph_flops(&s.graph);
        println!("joint graph FLOPs: {total}");
        for budget in [1.0, 0.5, 0.0] {
            let m = mincut_stage(&s, budget)?;
            let ratio = m.report.activation_bytes as f64 / w.pytorch_saved_bytes as f64;
            println!(
                "  min-cut budget {budget:.1}: {} activation bytes ({ratio:.2}x PyTorch), {} total saved, \
                 {} ops recomputed, {} recompute FLOPs (+{:.2}% of the joint)",
                m.report.activation_bytes,
                m.report.saved_bytes,
                m.report.recomputed_ops.len(),
                m.report.recompute_flops,
                100.0 * m.report.recompute_flops as f64 / total.max(1) as f64
            );
        }
        let stage = |name: &str, ms: f64| println!("  {name:<22} {ms:>9.3} ms (median of {runs})");
        println!("stage times:");
        stage("trace", median_ms(runs, || trace_stage(&w).map(drop))?);
        stage("functionalize", median_ms(runs, || functionalize_stage(&t).map(drop))?);
        stage("joint", median_ms(runs, || joint_stage(&t, &f).map(drop))?);
        stage("simplify", median_ms(runs, || simplify_stage(&j).map(drop))?);
        stage("partition default", median_ms(runs, || default_stage(&s).map(drop))?);
        stage("partition min-cut", median_ms(runs, || mincut_stage(&s, 1.0).map(drop))?);
        stage("pipeline (no simplify)", median_ms(runs, || pipeline(&w, false).map(drop))?);
        stage("pipeline", median_ms(runs, || pipeline(&w, true).map(drop))?);
    }
    Ok(())
}

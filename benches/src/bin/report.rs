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
    // Scaling: per-stage times against graph size (one run each: these are large).
    println!("== scaling (deep narrow MLP, one run per size) ==");
    for layers in [100usize, 1000, 4000] {
        let w = deep_mlp(layers)?;
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            f()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        let mut t = None;
        let tt = time(&mut || {
            t = Some(trace_stage(&w)?);
            Ok(())
        })?;
        let t = t.ok_or_else(|| anyhow::anyhow!("no trace"))?;
        let mut f = None;
        let tf = time(&mut || {
            f = Some(functionalize_stage(&t)?);
            Ok(())
        })?;
        let f = f.ok_or_else(|| anyhow::anyhow!("no functional graph"))?;
        let mut j = None;
        let tj = time(&mut || {
            j = Some(joint_stage(&t, &f)?);
            Ok(())
        })?;
        let j = j.ok_or_else(|| anyhow::anyhow!("no joint"))?;
        let ts = time(&mut || simplify_stage(&j).map(drop))?;
        let td = time(&mut || default_stage(&j).map(drop))?;
        let tm = time(&mut || mincut_stage(&j, 1.0).map(drop))?;
        println!(
            "  {layers:>5} layers: {:>6} traced / {:>6} joint nodes | trace {tt:.1} ms, functionalize {tf:.1} ms, \
             joint {tj:.1} ms, simplify {ts:.1} ms, default {td:.1} ms, min-cut {tm:.1} ms",
            t.graph.nodes.len(),
            j.graph.nodes.len()
        );
    }
    Ok(())
}

//! Dev: simplification time per joint node of the deep narrow MLP at several depths
//! (`LAYERS=4,40,400,4000`), to find where it stops being linear.
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let layers: Vec<usize> = std::env::var("LAYERS")
        .unwrap_or_else(|_| "40,400,4000".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    for l in layers {
        let w = aotgrad_benches::deep_mlp(l)?;
        let t = aotgrad_benches::trace_stage(&w)?;
        let f = aotgrad_benches::functionalize_stage(&t)?;
        let j = aotgrad_benches::joint_stage(&t, &f)?;
        let n = j.graph.nodes.len();
        let start = Instant::now();
        let s = aotgrad_benches::simplify_stage(&j)?;
        let dt = start.elapsed().as_secs_f64();
        println!(
            "{l} layers, {n} joint nodes -> {}: simplify {:.1} ms, {:.2} us/node",
            s.graph.nodes.len(),
            dt * 1e3,
            dt * 1e6 / n as f64
        );
    }
    Ok(())
}

//! `cargo xtask bench` prints this and writes it as markdown and JSON under
//! `target/bench/` (`report.md`, `report.json`):
//!
//! 1. run time: the training step of each workload on the eager mode (forward only:
//!    eager has no autograd yet), the reference interpreter and the compiled CPU
//!    backend at 1 and 2 threads (default and min-cut partitions), with the tensor
//!    memory one step adds according to the buffer plans;
//! 2. GEMM GFLOP/s next to the `gemm` crate called directly, a fused 8-op
//!    elementwise chain's GB/s next to a plain copy, a convolution layer (forward and
//!    both gradients) next to the `gemm` crate on the equivalent GEMM, and the fixed
//!    cost of a compiled call (16 elements, forward and backward), in the same run;
//! 3. compile time per stage, including the backend's, for both workloads;
//! 4. scaling: per-stage compile times from about 100 to 100k nodes;
//! 5. saved activation bytes per partitioner against PyTorch's anchors.
//!
//! `AOTGRAD_BENCH_RUNS` sets the repetitions (default 15); `AOTGRAD_BENCH_QUICK=1`
//! skips the two largest scaling sizes.

use anyhow::Result;
use aotgrad::runtime::Partitioner;
use aotgrad::AotConfig;
use aotgrad_benches::runtime::*;
use aotgrad_benches::*;
use aotgrad_cpu::CpuBackend;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::Instant;

fn once_ms<T>(f: impl FnOnce() -> Result<T>) -> Result<(f64, T)> {
    let t = Instant::now();
    let v = f()?;
    Ok((t.elapsed().as_secs_f64() * 1e3, v))
}

/// Tensor bytes one training step adds, from the buffer plans of the compiled
/// forward and backward: the forward's outputs (saved values) stay alive while the
/// backward runs with its arena and gradients.
fn step_bytes(p: &aotgrad_partition::Partitioned) -> Result<(usize, usize, usize)> {
    let b = CpuBackend::new(1);
    let fw = b.compile_graph(&p.forward)?;
    let bw = b.compile_graph(&p.backward)?;
    let (fa, fo) = fw.plan_bytes().unwrap_or((0, 0));
    let (ba, bo) = bw.plan_bytes().unwrap_or((0, 0));
    Ok((fa + fo, ba + bo, fo + fa.max(ba + bo)))
}

fn rss(key: &str) -> Option<i64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<i64>().ok()? * 1024)
}

/// One row of the scaling table: every stage of `layers` deep-MLP compile, timed
/// once, as `[joint nodes, trace, functionalize, joint, simplify, min-cut, backend]`.
fn scaling_row(layers: usize) -> Result<Vec<f64>> {
    let w = deep_mlp(layers)?;
    let (tt, t) = once_ms(|| trace_stage(&w))?;
    let (tf, f) = once_ms(|| functionalize_stage(&t))?;
    let (tj, j) = once_ms(|| joint_stage(&t, &f))?;
    let (ts, s) = once_ms(|| simplify_stage(&j))?;
    let (tm, p) = once_ms(|| mincut_stage(&s, 1.0))?;
    let b = CpuBackend::new(1);
    let (tb, _) = once_ms(|| {
        b.compile_graph(&p.forward)?;
        b.compile_graph(&p.backward)?;
        Ok(())
    })?;
    Ok(vec![j.graph.nodes.len() as f64, tt, tf, tj, ts, tm, tb])
}

/// [`scaling_row`] in a fresh process (this binary again), so that each size is timed
/// as a user compiling one program sees it, not on a heap the earlier rows grew.
fn scaling_row_isolated(layers: usize) -> Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe).env("AOTGRAD_REPORT_SCALING_ROW", layers.to_string()).output()?;
    if !out.status.success() {
        anyhow::bail!("scaling row {layers}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn main() -> Result<()> {
    if let Some(layers) = std::env::var("AOTGRAD_REPORT_SCALING_ROW").ok().and_then(|s| s.parse().ok()) {
        println!("{}", serde_json::to_string(&scaling_row(layers)?)?);
        return Ok(());
    }
    let runs: usize = std::env::var("AOTGRAD_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let quick = std::env::var_os("AOTGRAD_BENCH_QUICK").is_some();
    let mut md = String::new();
    let mut js = serde_json::Map::new();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let _ = writeln!(md, "# aotgrad bench report\n\n{threads} cores; medians of {runs} runs, all in this one run.\n");

    // 1. Training step.
    let _ = writeln!(md, "## Training step (forward + backward, loss `sum(model(x))`)\n");
    let _ = writeln!(
        md,
        "| workload | eager fw only | reference | cpu 1 thread | cpu 2 threads | 2t speed-up | cpu 1t default partition | step tensor bytes (plan) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut steps = Vec::new();
    for w in [mlp()?, transformer()?] {
        let ins = step_inputs(&w);
        let eager = median_ms(runs, || eager_forward(&w))?;
        let time = |cfg: AotConfig| -> Result<f64> {
            let f = compiled_step(&w, cfg)?;
            median_ms(runs, || run_step(&f, &ins))
        };
        let reference = time(AotConfig::default().reference_backend())?;
        let c1 = time(AotConfig::default().threads(1))?;
        let c2 = time(AotConfig::default().threads(2))?;
        let d1 = time(AotConfig { partitioner: Partitioner::Default, ..AotConfig::default() }.threads(1))?;
        let p = pipeline(&w, true)?;
        let (fw_peak, bw_peak, step) = step_bytes(&p)?;
        let _ = writeln!(
            md,
            "| {} | {eager:.2} ms | {reference:.2} ms | {c1:.2} ms | {c2:.2} ms | {:.2}x | {d1:.2} ms | {:.1} MB (fw peak {:.1} MB, bw peak {:.1} MB) |",
            w.name,
            c1 / c2,
            step as f64 / 1e6,
            fw_peak as f64 / 1e6,
            bw_peak as f64 / 1e6
        );
        steps.push(json!({
            "workload": w.name, "eager_forward_ms": eager, "reference_ms": reference, "cpu_1t_ms": c1,
            "cpu_2t_ms": c2, "cpu_1t_default_partition_ms": d1, "step_tensor_bytes": step,
            "forward_peak_bytes": fw_peak, "backward_peak_bytes": bw_peak,
        }));
    }
    js.insert("training_step".into(), Value::Array(steps));

    // 2. Kernels.
    let _ = writeln!(md, "\n## Kernels\n\n| what | 1 thread | 2 threads |\n|---|---|---|");
    let mut kern = Vec::new();
    for n in [256usize, 512, 1024] {
        let (o1, d1) = gemm_gflops(n, 1, runs)?;
        let (o2, d2) = gemm_gflops(n, 2, runs)?;
        let _ = writeln!(
            md,
            "| GEMM f32 {n}³: compiled / gemm crate | {o1:.1} / {d1:.1} GFLOP/s | {o2:.1} / {d2:.1} GFLOP/s |"
        );
        kern.push(
            json!({"gemm": n, "cpu_1t_gflops": o1, "gemm_1t_gflops": d1, "cpu_2t_gflops": o2, "gemm_2t_gflops": d2}),
        );
    }
    for n in [1usize << 16, 1 << 22] {
        let (o1, c1) = fused_chain_gbps(n, 1, runs)?;
        let (o2, c2) = fused_chain_gbps(n, 2, runs)?;
        let _ = writeln!(
            md,
            "| fused 8-op chain, {n} f32: compiled / copy | {o1:.1} / {c1:.1} GB/s ({:.0}%) | {o2:.1} / {c2:.1} GB/s ({:.0}%) |",
            100.0 * o1 / c1,
            100.0 * o2 / c2
        );
        kern.push(
            json!({"chain_elems": n, "cpu_1t_gbps": o1, "copy_1t_gbps": c1, "cpu_2t_gbps": o2, "copy_2t_gbps": c2}),
        );
    }
    let ((c1, g1), (c2, g2)) = (conv_gflops(1, runs)?, conv_gflops(2, runs)?);
    for (k, what) in ["forward", "input gradient", "weight gradient"].iter().enumerate() {
        let _ = writeln!(
            md,
            "| conv 3×3 16→32 over 128×14×14, {what}: compiled / gemm crate on the equivalent GEMM | {:.1} / {g1:.1} \
             GFLOP/s ({:.2}x) | {:.1} / {g2:.1} GFLOP/s ({:.2}x) |",
            c1[k],
            g1 / c1[k],
            c2[k],
            g2 / c2[k]
        );
        kern.push(json!({"conv": what, "cpu_1t_gflops": c1[k], "gemm_1t_gflops": g1, "cpu_2t_gflops": c2[k], "gemm_2t_gflops": g2}));
    }
    let ((f1, a1), (f2, a2)) = (fixed_cost_us(1, 2000)?, fixed_cost_us(2, 2000)?);
    let _ = writeln!(
        md,
        "| fixed cost of a call (16 elements): forward / forward + backward | {f1:.1} / {a1:.1} µs | {f2:.1} / {a2:.1} µs |"
    );
    kern.push(json!({"fixed_cost_forward_us": [f1, f2], "fixed_cost_step_us": [a1, a2]}));
    js.insert("kernels".into(), Value::Array(kern));

    // 3. Compile stages.
    let _ = writeln!(md, "\n## Compile time per stage (ms, medians)\n");
    let _ = writeln!(
        md,
        "| workload | trace | functionalize | joint | simplify | min-cut | backend fw+bw | whole (first call) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut comp = Vec::new();
    for w in [mlp()?, transformer()?] {
        let t = trace_stage(&w)?;
        let f = functionalize_stage(&t)?;
        let j = joint_stage(&t, &f)?;
        let s = simplify_stage(&j)?;
        let p = mincut_stage(&s, 1.0)?;
        let b = CpuBackend::new(1);
        let tt = median_ms(runs, || trace_stage(&w).map(drop))?;
        let tf = median_ms(runs, || functionalize_stage(&t).map(drop))?;
        let tj = median_ms(runs, || joint_stage(&t, &f).map(drop))?;
        let ts = median_ms(runs, || simplify_stage(&j).map(drop))?;
        let tm = median_ms(runs, || mincut_stage(&s, 1.0).map(drop))?;
        let tb = median_ms(runs, || {
            b.compile_graph(&p.forward)?;
            b.compile_graph(&p.backward)?;
            Ok(())
        })?;
        let whole = median_ms(runs, || {
            let f = compiled_step(&w, AotConfig::default().threads(1))?;
            f.compile_for(&step_inputs(&w).into_iter().map(Into::into).collect::<Vec<_>>())?;
            Ok(())
        })?;
        let _ = writeln!(
            md,
            "| {} ({} joint nodes) | {tt:.3} | {tf:.3} | {tj:.3} | {ts:.3} | {tm:.3} | {tb:.3} | {whole:.3} |",
            w.name,
            j.graph.nodes.len()
        );
        comp.push(json!({"workload": w.name, "joint_nodes": j.graph.nodes.len(), "trace_ms": tt,
            "functionalize_ms": tf, "joint_ms": tj, "simplify_ms": ts, "mincut_ms": tm, "backend_ms": tb, "whole_ms": whole}));
    }
    js.insert("compile".into(), Value::Array(comp));

    // 4. Scaling.
    let _ = writeln!(
        md,
        "\n## Compile scaling (deep narrow MLP, one run per size in a fresh process, µs per joint node in brackets)\n"
    );
    let _ =
        writeln!(md, "| layers | joint nodes | trace | functionalize | joint | simplify | min-cut | backend fw+bw |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut scale = Vec::new();
    let sizes: &[usize] = if quick { &[4, 40, 400] } else { &[4, 40, 400, 4000, 12000] };
    for &layers in sizes {
        let row = scaling_row_isolated(layers)?;
        let [nodes, tt, tf, tj, ts, tm, tb] = row[..] else { anyhow::bail!("scaling row {layers}: {row:?}") };
        let n = nodes.max(1.0);
        let per = |ms: f64| format!("{ms:.1} ({:.1})", ms * 1e3 / n);
        let _ = writeln!(
            md,
            "| {layers} | {nodes} | {} | {} | {} | {} | {} | {} |",
            per(tt),
            per(tf),
            per(tj),
            per(ts),
            per(tm),
            per(tb)
        );
        scale.push(json!({"layers": layers, "joint_nodes": nodes, "trace_ms": tt, "functionalize_ms": tf,
            "joint_ms": tj, "simplify_ms": ts, "mincut_ms": tm, "backend_ms": tb}));
    }
    js.insert("scaling".into(), Value::Array(scale));

    // 4b. Pathological program shapes (every stage near-linear in the node count).
    let _ = writeln!(
        md,
        "\n## Compile scaling on pathological shapes (training path, one run per size; per user op and per traced node)\n"
    );
    let _ = writeln!(
        md,
        "| shape | ops | traced nodes | whole compile | µs/op | µs/node | slowest stage | peak RSS growth per op | per node |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut patho = Vec::new();
    // `mixed` (the chain with a transpose and a bias between ops, gradients for both
    // weights) sits right after `chain`: a weight every step reads joins the whole
    // min-cut network into one component, so its per-op time checks that the
    // partitioner does not depend on the op mix.
    let mut per_op: Vec<(&str, usize, f64)> = Vec::new();
    for kind in ["view", "chain", "mixed", "fanout"] {
        let sizes: &[usize] = if quick { &[1000] } else { &[1000, 10000, 100000] };
        for &n in sizes {
            let (af, ins) = aotgrad_benches::pathological(kind, n, true)?;
            let base = rss("VmRSS:");
            let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
            af.forward(&ins)?;
            let peak = match (reset, base, rss("VmHWM:")) {
                (true, Some(b), Some(p)) => Some((p - b).max(0) as f64 / n as f64),
                _ => None,
            };
            let r = af.compile_reports().into_iter().next().expect("compiled");
            let nodes = af.results().first().map_or(n, |r| r.meta.traced_nodes).max(1);
            let total = r.total_seconds();
            let (slow, st) = r.stages.iter().fold(("", 0.0), |a, (s, t)| if *t > a.1 { (s, *t) } else { a });
            let kb = |per: usize| peak.map_or("n/a".into(), |b| format!("{:.1} KB", b * n as f64 / per as f64 / 1e3));
            let _ = writeln!(
                md,
                "| {kind} | {n} | {nodes} | {:.1} ms | {:.1} | {:.1} | {slow} {:.1} ms | {} | {} |",
                total * 1e3,
                total * 1e6 / n as f64,
                total * 1e6 / nodes as f64,
                st * 1e3,
                kb(n),
                kb(nodes)
            );
            per_op.push((kind, n, total * 1e6 / n as f64));
            patho.push(json!({"shape": kind, "ops": n, "traced_nodes": nodes, "compile_s": total,
                "us_per_op": total * 1e6 / n as f64, "us_per_node": total * 1e6 / nodes as f64,
                "stages": r.stages.iter().map(|(s, t)| json!([s, t])).collect::<Vec<_>>(), "peak_rss_bytes_per_op": peak,
                "peak_rss_bytes_per_node": peak.map(|b| b * n as f64 / nodes as f64)}));
        }
    }
    let ratios: Vec<String> = per_op
        .iter()
        .filter(|(k, ..)| *k == "mixed")
        .filter_map(|&(_, n, mixed)| {
            let chain = per_op.iter().find(|&&(k, m, _)| k == "chain" && m == n)?.2;
            Some(format!("{:.1}× at {n} ops", mixed / chain))
        })
        .collect();
    if !ratios.is_empty() {
        let _ = writeln!(md, "\nmixed / chain compile time per op: {}.", ratios.join(", "));
    }
    js.insert("pathological".into(), Value::Array(patho));

    // 5. Saved bytes.
    let _ = writeln!(md, "\n## Saved activation bytes\n\n| workload | default | min-cut 1.0 | min-cut 0.0 | PyTorch min-cut |\n|---|---|---|---|---|");
    let mut saved = Vec::new();
    for w in [mlp()?, transformer()?] {
        let t = trace_stage(&w)?;
        let f = functionalize_stage(&t)?;
        let s = simplify_stage(&joint_stage(&t, &f)?)?;
        let d = default_stage(&s)?.report.activation_bytes;
        let m1 = mincut_stage(&s, 1.0)?.report.activation_bytes;
        let m0 = mincut_stage(&s, 0.0)?.report.activation_bytes;
        let _ = writeln!(
            md,
            "| {} | {d} | {m1} ({:.2}x) | {m0} | {} |",
            w.name,
            m1 as f64 / w.pytorch_saved_bytes as f64,
            w.pytorch_saved_bytes
        );
        saved.push(
            json!({"workload": w.name, "default": d, "mincut_1": m1, "mincut_0": m0, "pytorch": w.pytorch_saved_bytes}),
        );
    }
    js.insert("saved_bytes".into(), Value::Array(saved));

    print!("{md}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&Value::Object(js))?)?;
    eprintln!("wrote {}", dir.join("report.md").display());
    Ok(())
}

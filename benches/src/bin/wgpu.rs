//! The wgpu backend next to the compiled CPU backend: achieved GB/s of fused
//! elementwise kernels and reductions, GFLOP/s of f32 matmuls, with the adapter's name.
//!
//! The wgpu figures are device time ([`WgpuCompiledGraph::device_seconds`]: inputs
//! uploaded once, many runs in one submission, transfers excluded); the CPU figures
//! are whole calls of the compiled CPU backend on every core. Bytes are the bytes a
//! kernel must move (each input read once, each output written once).
//!
//! On a software adapter (lavapipe) the figures are a smoke test of the path, not a
//! measure of anything a GPU does, and the largest sizes are skipped unless `--full`.
//!
//! `cargo xtask bench --backend wgpu`, or
//! `cargo run --release -p aotgrad-benches --bin wgpu [-- --quick | --full]`;
//! written to `target/bench/wgpu.{md,json}`.

use anyhow::{Context, Result};
use aotgrad_benches::runtime::{filled, median_ms, node};
use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::{Backend, BinaryOp, DType, Graph, Op, ReduceOp, Scalar, StorageId, TensorMeta, UnaryOp};
use aotgrad_wgpu::{adapter, WgpuBackend, WgpuCompiledGraph};
use serde_json::json;
use std::fmt::Write as _;

/// One workload: a graph, its inputs, and the work one run does.
struct Case {
    name: String,
    graph: Graph,
    inputs: Vec<CpuTensor>,
    /// Bytes moved (for GB/s) or floating-point operations (for GFLOP/s).
    work: f64,
    unit: &'static str,
}

fn input(g: &mut Graph, name: &str, shape: &[usize], storage: u32) -> aotgrad_ir::ValueId {
    g.add_input(name, TensorMeta::from_sizes(shape, DType::F32), StorageId(storage))
}

/// `x.sin().mul(2).add(y).relu()` over `n` elements: reads 2n, writes n.
fn elementwise(n: usize) -> Result<Case> {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[n], 0);
    let y = input(&mut g, "y", &[n], 1);
    let s = node(&mut g, Op::Unary(UnaryOp::Sin), &[x])?;
    let m = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)), &[s])?;
    let a = node(&mut g, Op::Binary(BinaryOp::Add), &[m, y])?;
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[a])?;
    g.outputs = vec![r];
    Ok(Case {
        name: format!("fused elementwise sin·mul·add·relu, {n} f32"),
        graph: g,
        inputs: vec![filled(&[n], 0.1)?, filled(&[n], 0.2)?],
        work: 12.0 * n as f64,
        unit: "GB/s",
    })
}

/// `(x * x).sum(1)` over `[rows, cols]`: a reduction with a fused prologue.
fn row_sum_of_squares(rows: usize, cols: usize) -> Result<Case> {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[rows, cols], 0);
    let sq = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, x])?;
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[sq])?;
    g.outputs = vec![s];
    Ok(Case {
        name: format!("reduction (x·x).sum(1), [{rows}, {cols}] f32"),
        graph: g,
        inputs: vec![filled(&[rows, cols], 0.3)?],
        work: 4.0 * (rows * cols + rows) as f64,
        unit: "GB/s",
    })
}

/// `x.sum(0)` over `[rows, cols]`: a reduction across rows (strided).
fn column_sum(rows: usize, cols: usize) -> Result<Case> {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[rows, cols], 0);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x])?;
    g.outputs = vec![s];
    Ok(Case {
        name: format!("reduction x.sum(0), [{rows}, {cols}] f32"),
        graph: g,
        inputs: vec![filled(&[rows, cols], 0.4)?],
        work: 4.0 * (rows * cols + cols) as f64,
        unit: "GB/s",
    })
}

/// `a @ b`, `n x n x n`.
fn matmul(n: usize) -> Result<Case> {
    let mut g = Graph::new();
    let a = input(&mut g, "a", &[n, n], 0);
    let b = input(&mut g, "b", &[n, n], 1);
    let c = node(&mut g, Op::Mm, &[a, b])?;
    g.outputs = vec![c];
    Ok(Case {
        name: format!("matmul {n}³ f32"),
        graph: g,
        inputs: vec![filled(&[n, n], 0.5)?, filled(&[n, n], 0.6)?],
        work: 2.0 * (n as f64).powi(3),
        unit: "GFLOP/s",
    })
}

/// Median device seconds of one run over `rounds` rounds, with the repetitions per
/// round chosen so that a round takes about `target` seconds.
fn device_time(c: &WgpuCompiledGraph, inputs: &[CpuTensor], rounds: usize, target: f64) -> Result<f64> {
    let one = c.device_seconds(inputs, 1)?;
    let reps = ((target / one.max(1e-9)) as usize).clamp(1, 500);
    let mut v = (0..rounds).map(|_| c.device_seconds(inputs, reps)).collect::<Result<Vec<_>, _>>()?;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let full = args.iter().any(|a| a == "--full");
    let a = adapter().context("the wgpu bench needs an adapter (on Debian: apt-get install mesa-vulkan-drivers)")?;
    let small = a.software && !full;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cases = Vec::new();
    let (elems, rows, dims): (Vec<usize>, usize, Vec<usize>) = if quick {
        (vec![1 << 16], 256, vec![128])
    } else if small {
        (vec![1 << 20, 1 << 22], 2048, vec![512, 1024])
    } else {
        (vec![1 << 22, 1 << 24, 1 << 26], 8192, vec![512, 1024, 2048, 4096])
    };
    for n in elems {
        cases.push(elementwise(n)?);
    }
    cases.push(row_sum_of_squares(rows, rows)?);
    cases.push(column_sum(rows, rows)?);
    for n in dims {
        cases.push(matmul(n)?);
    }
    let (rounds, target) = if quick { (1, 0.02) } else { (5, 0.2) };
    let mut md = String::new();
    writeln!(md, "adapter: {} ({}, {}) — {}; SHADER_F16: {}", a.name, a.backend, a.driver, a.reason, a.shader_f16)?;
    if a.software {
        writeln!(
            md,
            "a software adapter: its figures are a smoke test of the wgpu path, not GPU performance{}",
            if small { "; the largest sizes are skipped (--full runs them)" } else { "" }
        )?;
    }
    writeln!(md, "\n| workload | wgpu (device time) | compiled CPU ({threads} threads) | wgpu / CPU |")?;
    writeln!(md, "|---|---|---|---|")?;
    let cpu = CpuBackend::new(threads);
    let wgpu = WgpuBackend::new();
    let mut out = Vec::new();
    for c in &cases {
        let g = wgpu.compile_graph(&c.graph)?;
        let gpu_s = device_time(&g, &c.inputs, rounds, target)?;
        let cc = cpu.compile(&c.graph)?;
        let cpu_ms = median_ms(if quick { 1 } else { 7 }, || cc.run(&c.inputs).map(drop).map_err(Into::into))?;
        let scale = 1e-9;
        let (gpu_rate, cpu_rate) = (c.work * scale / gpu_s, c.work * scale / (cpu_ms * 1e-3));
        writeln!(
            md,
            "| {} | {gpu_rate:.1} {u} ({:.3} ms) | {cpu_rate:.1} {u} ({cpu_ms:.3} ms) | {:.2}× |",
            c.name,
            gpu_s * 1e3,
            gpu_rate / cpu_rate,
            u = c.unit
        )?;
        out.push(json!({"workload": c.name, "unit": c.unit, "wgpu": gpu_rate, "wgpu_ms": gpu_s * 1e3,
            "cpu": cpu_rate, "cpu_ms": cpu_ms, "cpu_threads": threads}));
    }
    print!("{md}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("wgpu.md"), &md)?;
    let doc = json!({"adapter": a.name, "backend": a.backend, "driver": a.driver, "software": a.software, "rows": out});
    std::fs::write(dir.join("wgpu.json"), serde_json::to_vec_pretty(&doc)?)?;
    Ok(())
}

//! The data-parallel bench (`cargo xtask bench --dist`): `dist --single` in one
//! process, then `mpirun -np 2 dist` (2 processes × 1 thread) on this machine.
//!
//! 1. Allreduce GB/s of `aotgrad-dist`'s bucket exchange (`World::average_f32`: the
//!    allreduce DDP hands its MPI thread per bucket, averaged there, waited for) next
//!    to a raw blocking `MPI_Allreduce` of the same bytes through rsmpi, timed on the
//!    MPI thread itself, in the same run.
//!    GB/s is algorithm bandwidth: the buffer's bytes over the time (as nccl-tests'
//!    "algbw"); a ring allreduce moves about 2 (N-1)/N times that per rank.
//! 2. The training step (forward + backward + gradient averaging; loss
//!    `sum(model(x))`) of the bench MLP (global batch 64) and transformer block (global
//!    batch 8): 2 processes × 1 thread (each rank on half the batch) with the buckets
//!    exchanged while the backward runs, and after it, next to 1 process × 2 threads
//!    on the whole batch (`--single`, written to `target/bench/dist-single.json`
//!    and read back here). Overlap: the share of communication time (first bucket
//!    started to last one done) before the backward ended.
//! 3. ZeRO-1: AdamW's optimizer state per rank (bytes) against AdamW's in one
//!    process, and one optimizer step's time.
//!
//! Writes `target/bench/dist.{md,json}`. `AOTGRAD_BENCH_RUNS` sets the repetitions
//! (default 30).

use anyhow::{Context, Result};
use aotgrad::dist::{DdpConfig, DistributedDataParallel, World, ZeroAdamW};
use aotgrad::nn::{AdamW, Module, Optimizer, ParamStore, Params};
use aotgrad::prelude::*;
use aotgrad_benches::runtime::median_ms;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

/// `sum(model(x))`, the bench's loss.
struct SumLoss(Arc<dyn Module>);

impl Module for SumLoss {
    fn store(&self) -> &ParamStore {
        self.0.store()
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![self.0.forward(p, inputs)?[0].sum_all()?])
    }
}

fn runs() -> usize {
    std::env::var("AOTGRAD_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(30)
}

fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// The workload with its input cut to `parts` of the batch.
fn workload(name: &str, parts: usize) -> Result<(Arc<dyn Module>, Tensor)> {
    let w = match name {
        "mlp" => aotgrad_benches::mlp()?,
        _ => aotgrad_benches::transformer()?,
    };
    let mut shape = w.input.sizes()?;
    shape[0] /= parts;
    Ok((w.module.clone(), Tensor::randn(&shape, DType::F32, 1)?))
}

/// 1 process × 2 threads: the step's median per workload.
fn single() -> Result<()> {
    let mut out = serde_json::Map::new();
    for name in ["mlp", "transformer"] {
        let (module, x) = workload(name, 1)?;
        let m = aot_module(Arc::new(SumLoss(module)), AotConfig::default().threads(2))?;
        let ms = median_ms(runs(), || {
            let (outs, back) = m.forward(std::slice::from_ref(&x))?;
            back.backward(&[outs[0].ones_like()?])?;
            Ok(())
        })?;
        out.insert(name.into(), json!(ms));
        println!("{name}: 1 process x 2 threads: {ms:.2} ms");
    }
    std::fs::write(out_dir().join("dist-single.json"), Value::Object(out).to_string())?;
    Ok(())
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--single") {
        return single();
    }
    let world = Rc::new(World::init()?);
    let (rank, n) = (world.rank(), world.size());
    let root = world.is_root();
    let mut md = String::new();
    let mut js = serde_json::Map::new();
    let runs = runs();
    writeln!(
        md,
        "# aotgrad-dist bench\n\n{n} processes × 1 thread on this machine (shared memory); medians of {runs} runs.\n"
    )?;

    // 1. Allreduce bandwidth.
    writeln!(md, "## Allreduce, f32 (algorithm bandwidth)\n")?;
    writeln!(md, "| bytes | aotgrad-dist exchange | raw MPI_Allreduce | ratio |\n|---|---|---|---|")?;
    let mut rows = Vec::new();
    for bytes in [4usize << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20] {
        let len = bytes / 4;
        let label = if bytes < 1 << 20 { format!("{} KiB", bytes >> 10) } else { format!("{} MiB", bytes >> 20) };
        let mut bufs = vec![vec![1.0f32 + rank as f32; len]];
        let ours = median_ms(runs, || {
            world.average_f32(&mut bufs, false, 0)?;
            Ok(())
        })?;
        // The same bytes through a plain blocking MPI_Allreduce, timed on the MPI thread.
        let raw = world.run("raw allreduce", 0, move |comm| {
            let send = vec![1.0f32; len];
            let mut recv = vec![0.0f32; len];
            comm.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            let mut v: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = std::time::Instant::now();
                    comm.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })?;
        let gbs = |ms: f64| (len * 4) as f64 / (ms * 1e-3) / 1e9;
        writeln!(
            md,
            "| {label} | {:.2} GB/s ({ours:.3} ms) | {:.2} GB/s ({raw:.3} ms) | {:.2}x |",
            gbs(ours),
            gbs(raw),
            raw / ours
        )?;
        rows.push(
            json!({"bytes": len * 4, "aotgrad_ms": ours, "raw_ms": raw, "aotgrad_gbs": gbs(ours), "raw_gbs": gbs(raw)}),
        );
    }
    js.insert("allreduce".into(), Value::Array(rows));

    // 2. The step.
    let single: Value = std::fs::read_to_string(out_dir().join("dist-single.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    writeln!(md, "\n## Training step (forward + backward + gradient averaging)\n")?;
    writeln!(
        md,
        "| workload | {n} processes × 1 thread, overlapped | overlap | exposed comm | same, exchanged after the backward | 1 process × 2 threads |\n|---|---|---|---|---|---|"
    )?;
    let mut steps = serde_json::Map::new();
    for name in ["mlp", "transformer"] {
        let (module, x) = workload(name, n)?;
        let mut row = Vec::new();
        for overlap in [true, false] {
            let m = aot_module(Arc::new(SumLoss(module.clone())), AotConfig::default().threads(1))?;
            let ddp = DistributedDataParallel::new(world.clone(), m, DdpConfig { overlap, ..DdpConfig::default() })?;
            let step = || -> Result<()> {
                let (outs, back) = ddp.forward(std::slice::from_ref(&x))?;
                back.backward(&[outs[0].ones_like()?])?;
                Ok(())
            };
            step()?;
            let before = ddp.stats();
            let ms = median_ms(runs, step)?;
            let after = ddp.stats();
            let comm = after.comm_seconds - before.comm_seconds;
            let exposed = after.exposed_seconds - before.exposed_seconds;
            let syncs = (after.syncs - before.syncs).max(1) as f64;
            let share = if comm > 0.0 { 1.0 - exposed / comm } else { 0.0 };
            row.push(json!({"overlap": overlap, "step_ms": ms, "overlap_share": share,
                "comm_ms_per_step": comm / syncs * 1e3, "exposed_ms_per_step": exposed / syncs * 1e3,
                "buckets": ddp.plan().buckets.len(), "bytes": ddp.plan().bytes()}));
        }
        let one = single.get(name).and_then(Value::as_f64);
        let (a, b) = (&row[0], &row[1]);
        writeln!(
            md,
            "| {name} ({} MB of gradients, {} bucket(s)) | {:.2} ms | {:.0}% | {:.3} of {:.3} ms | {:.2} ms | {} |",
            a["bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
            a["buckets"],
            a["step_ms"].as_f64().unwrap_or(0.0),
            100.0 * a["overlap_share"].as_f64().unwrap_or(0.0),
            a["exposed_ms_per_step"].as_f64().unwrap_or(0.0),
            a["comm_ms_per_step"].as_f64().unwrap_or(0.0),
            b["step_ms"].as_f64().unwrap_or(0.0),
            one.map_or("— (run `dist --single` first)".to_string(), |v| format!("{v:.2} ms")),
        )?;
        steps.insert(name.into(), json!({"ranks": row, "single_2_threads_ms": one}));
    }
    js.insert("step".into(), Value::Object(steps));

    // 3. ZeRO-1's optimizer state.
    writeln!(md, "\n## ZeRO-1 optimizer state per rank\n")?;
    writeln!(md, "| workload | parameters | AdamW, one process | ZeroAdamW per rank | AdamW step | ZeroAdamW step |\n|---|---|---|---|---|---|")?;
    let mut zero_rows = Vec::new();
    for name in ["mlp", "transformer"] {
        let (module, _) = workload(name, n)?;
        let store = module.store();
        let params = store.num_param_elements();
        let grads: Vec<(String, Tensor)> =
            store.params().iter().map(|(k, t)| Ok((k.clone(), t.ones_like()?.mul(1e-3)?))).collect::<Result<_>>()?;
        let mut adamw = AdamW::new(1e-3).with_cache(None);
        let t_adamw = median_ms(runs, || Ok(adamw.step(store, &grads)?))?;
        let mut zero = ZeroAdamW::new(world.clone(), store, AdamW::new(1e-3).with_cache(None))?;
        let t_zero = median_ms(runs, || Ok(zero.step(store, &grads)?))?;
        let full = 2 * 4 * params;
        writeln!(
            md,
            "| {name} | {params} | {:.2} MB | {:.2} MB ({:.2}x), + {:.2} MB working copy | {t_adamw:.3} ms | {t_zero:.3} ms |",
            full as f64 / 1e6,
            zero.state_bytes() as f64 / 1e6,
            zero.state_bytes() as f64 / full as f64,
            zero.working_bytes() as f64 / 1e6
        )?;
        zero_rows.push(json!({"workload": name, "parameters": params, "adamw_bytes": full,
            "zero_bytes_per_rank": zero.state_bytes(), "zero_working_bytes": zero.working_bytes(), "adamw_step_ms": t_adamw, "zero_step_ms": t_zero}));
    }
    js.insert("zero1".into(), Value::Array(zero_rows));
    if root {
        print!("{md}");
        std::fs::write(out_dir().join("dist.md"), &md).context("writing dist.md")?;
        std::fs::write(out_dir().join("dist.json"), serde_json::to_string_pretty(&Value::Object(js))?)?;
        println!("wrote {}", out_dir().join("dist.md").display());
    }
    Ok(())
}

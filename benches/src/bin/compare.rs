//! `cargo xtask bench --compare`: aotgrad next to PyTorch eager, torch.compile and JAX
//! jit on the bench workloads and the main job's, measured in one run, round after
//! round (every system once per round, so all see the same machine load), with ratios.
//!
//! Workloads (`benches/compare/peers.py` has the peers' versions): `mlp` and
//! `transformer` (the bench MLP and block, a gradient step of `sum(model(x))`), and the
//! main job's `main-mlp`, `main-cnn`, `main-vit` (cross-entropy, backward and an AdamW
//! step on a fixed batch of 128). "1 thread" is one core for every system: aotgrad's
//! side runs in a child process under `taskset -c 0`, and the peers pin themselves.
//! Every aotgrad measurement is a fresh process (its first call is a cold compile, its
//! step memory the resident-set growth of that first call); the peers' step memory is
//! measured the same way in fresh processes (torch.compile's is left out: its first
//! step holds the compiler's memory). Then the main job's loop on Fashion-MNIST (batch
//! building, step, loss read back) gives each side's training samples/s.
//!
//! Needs a Python with torch (and jax for the JAX column), named by
//! `AOTGRAD_COMPARE_PYTHON`. `AOTGRAD_BENCH_RUNS` sets the steps per median (default
//! 15), `AOTGRAD_COMPARE_ROUNDS` the rounds (default 3), `AOTGRAD_COMPARE_ONLY` a
//! comma-separated list of workloads, `AOTGRAD_COMPARE_TRAIN_STEPS` the main-job loop's
//! steps (default 150). Writes `target/bench/compare.{md,json}`.

use anyhow::{bail, Context, Result};
use aotgrad::nn::{AdamW, Module, Optimizer};
use aotgrad::AotConfig;
use aotgrad_benches::runtime::{compiled_step, median_ms, run_step, step_inputs};
use aotgrad_cli::models::ModelKind;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

const WORKLOADS: [&str; 5] = ["mlp", "transformer", "main-mlp", "main-cnn", "main-vit"];
const PEERS: [&str; 3] = ["eager", "compile", "jax"];

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn status_bytes(key: &str) -> Option<i64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<i64>().ok()? * 1024)
}

// ---- aotgrad's side (a child process: `compare side WORKLOAD THREADS RUNS`) -------

/// One step of a main-job workload: forward, backward, AdamW, the loss read back.
struct MainStep {
    model: Arc<aotgrad_cli::models::Classifier>,
    f: aotgrad::AotModule,
    opt: AdamW,
    one: aotgrad::prelude::Tensor,
}

impl MainStep {
    fn new(kind: ModelKind, threads: usize) -> Result<MainStep> {
        let model = Arc::new(kind.build(0)?);
        let config = AotConfig::default().threads(threads).no_cache();
        let f = aotgrad::aot_module(model.clone(), config.clone())?;
        let opt = AdamW::with(2e-3, (0.9, 0.999), 1e-8, 0.05)?.with_cache(None).with_backend(config.backend);
        Ok(MainStep { model, f, opt, one: aotgrad::prelude::Tensor::ones(&[], aotgrad::prelude::DType::F32)? })
    }
    fn step(&mut self, x: &aotgrad::prelude::Tensor, y: &aotgrad::prelude::Tensor) -> Result<f64> {
        let (outs, back) = self.f.forward(&[x.clone(), y.clone()])?;
        let grads = back.backward_with(&[Some(self.one.clone()), None], &[])?;
        self.opt.step(self.model.store(), &grads.params)?;
        Ok(outs[0].item()?)
    }
}

fn main_kind(w: &str) -> Option<ModelKind> {
    match w {
        "main-mlp" => Some(ModelKind::Mlp),
        "main-cnn" => Some(ModelKind::Cnn),
        "main-vit" => Some(ModelKind::Vit),
        _ => None,
    }
}

fn side(workload: &str, threads: usize, runs: usize) -> Result<Value> {
    // The model and its inputs exist before the memory baseline (as on the peers'
    // side): the first call's growth is compiling plus running the step.
    let compile_ms =
        |reports: Vec<aotgrad::CompileReport>| reports.iter().map(|r| r.total_seconds()).sum::<f64>() * 1e3;
    let baseline = || {
        let base = status_bytes("VmRSS:");
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        (base, reset, Instant::now())
    };
    let peak_since = |(base, reset, _): (Option<i64>, bool, Instant)| match (reset, base, status_bytes("VmHWM:")) {
        (true, Some(b), Some(p)) => Some(p - b),
        _ => None,
    };
    let (first, step_ms, compile, peak) = if let Some(kind) = main_kind(workload) {
        let x = aotgrad::prelude::Tensor::randn(&[128, 784], aotgrad::prelude::DType::F32, 7)?;
        let labels: Vec<i64> = (0..128).map(|i| (i * 7 % 10) as i64).collect();
        let y = aotgrad::prelude::Tensor::from_vec(labels, &[128])?;
        let mut s = MainStep::new(kind, threads)?;
        let b = baseline();
        s.step(&x, &y)?;
        let first = b.2.elapsed().as_secs_f64() * 1e3;
        let peak = peak_since(b);
        let step = median_ms(runs, || s.step(&x, &y).map(drop))?;
        // The training step's compile (the optimizer's update compiles separately).
        (first, step, compile_ms(s.f.function().compile_reports()), peak)
    } else {
        let w = match workload {
            "mlp" => aotgrad_benches::mlp()?,
            "transformer" => aotgrad_benches::transformer()?,
            other => bail!("unknown workload {other}"),
        };
        let ins = step_inputs(&w);
        let f = compiled_step(&w, AotConfig::default().threads(threads).no_cache())?;
        let b = baseline();
        run_step(&f, &ins)?;
        let first = b.2.elapsed().as_secs_f64() * 1e3;
        let peak = peak_since(b);
        (first, median_ms(runs, || run_step(&f, &ins))?, compile_ms(f.compile_reports()), peak)
    };
    Ok(json!({"first_call_ms": first, "compile_ms": compile, "step_ms": step_ms, "peak_rss_delta_bytes": peak}))
}

/// The main job's loop for `steps` steps after 3 warm-up steps: samples/s.
fn train(workload: &str, threads: usize, steps: usize) -> Result<Value> {
    let kind = main_kind(workload).context("not a main-job workload")?;
    let data = aotgrad_cli::data::load(&aotgrad_cli::data::find_dir(None)?)?;
    let order = aotgrad_cli::train::epoch_order(data.train.len(), 0, 0);
    let mut s = MainStep::new(kind, threads)?;
    let per_epoch = data.train.len() / 128;
    let batch = |i: usize| aotgrad_cli::train::batch(&data.train, &order[(i % per_epoch) * 128..][..128]);
    for i in 0..3 {
        let (x, y) = batch(i)?;
        s.step(&x, &y)?;
    }
    aotgrad_cpu::wait_for_jit_idle(std::time::Duration::from_secs(10));
    let t = Instant::now();
    let mut loss = 0.0;
    for i in 3..3 + steps {
        let (x, y) = batch(i)?;
        loss = s.step(&x, &y)?;
    }
    Ok(json!({"samples_per_s": (steps * 128) as f64 / t.elapsed().as_secs_f64(), "loss": loss}))
}

// ---- the driver -------------------------------------------------------------------

/// A peer server: `peers.py serve SYSTEM THREADS`.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(python: &str, system: &str, threads: usize) -> Result<Peer> {
        let mut child = Command::new(python)
            .arg(script())
            .args(["serve", system, &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {python} {}", script().display()))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(Peer { child, stdin, stdout })
    }
    fn ask(&mut self, req: Value) -> Result<Value> {
        writeln!(self.stdin, "{req}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the peer script exited (are torch and jax installed in AOTGRAD_COMPARE_PYTHON?)");
        }
        Ok(serde_json::from_str(&line)?)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.child.wait();
    }
}

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compare/peers.py")
}

fn pinned(threads: usize) -> bool {
    threads == 1 && Command::new("taskset").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// Run this binary as aotgrad's side in a fresh process (`taskset -c 0` for 1 thread).
fn aotgrad_child(args: &[String]) -> Result<Value> {
    let exe = std::env::current_exe()?;
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut cmd = if pinned(threads) {
        let mut c = Command::new("taskset");
        c.arg("-c").arg("0").arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd.args(args).stderr(Stdio::inherit()).output().context("could not run aotgrad's side")?;
    if !out.status.success() {
        bail!("aotgrad's side {args:?} failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().context("aotgrad's side printed nothing")?;
    Ok(serde_json::from_str(last)?)
}

fn python_memory(python: &str, system: &str, workload: &str, threads: usize) -> Option<f64> {
    let out = Command::new(python)
        .arg(script())
        .args(["memory", system, workload, &threads.to_string()])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last()?).ok()?;
    v["peak_rss_delta_bytes"].as_f64()
}

fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// `median (min–max)` of per-round values.
fn cell(v: &[f64], digits: usize) -> String {
    let m = median(v);
    if m.is_nan() {
        return "n/a".into();
    }
    let lo = v.iter().copied().filter(|x| x.is_finite()).fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().filter(|x| x.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    if v.len() > 1 {
        format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
    } else {
        format!("{m:.digits$}")
    }
}

fn driver() -> Result<()> {
    let python = std::env::var("AOTGRAD_COMPARE_PYTHON").context(
        "set AOTGRAD_COMPARE_PYTHON to a Python that has torch and jax (e.g. python3 -m venv /tmp/t && \
         /tmp/t/bin/pip install torch 'jax[cpu]')",
    )?;
    let runs = env_usize("AOTGRAD_BENCH_RUNS", 15);
    let rounds = env_usize("AOTGRAD_COMPARE_ROUNDS", 3).max(1);
    let train_steps = env_usize("AOTGRAD_COMPARE_TRAIN_STEPS", 150);
    let only: Vec<String> = std::env::var("AOTGRAD_COMPARE_ONLY")
        .map(|s| s.split(',').map(|w| w.trim().to_string()).filter(|w| !w.is_empty()).collect())
        .unwrap_or_default();
    let workloads: Vec<&str> =
        WORKLOADS.iter().copied().filter(|w| only.is_empty() || only.iter().any(|o| o == w)).collect();
    let mut peers: BTreeMap<(String, usize), Peer> = BTreeMap::new();
    for threads in [1usize, 2] {
        peers.insert(("torch".into(), threads), Peer::start(&python, "torch", threads)?);
        peers.insert(("jax".into(), threads), Peer::start(&python, "jax", threads)?);
    }
    let info = peers.get_mut(&("torch".to_string(), 1)).context("no peer")?.ask(json!({"op": "info"}))?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // (workload, threads, system, key) -> per-round values
    let mut data: BTreeMap<(String, usize, String, String), Vec<f64>> = BTreeMap::new();
    let mut put = |w: &str, t: usize, s: &str, k: &str, v: Option<f64>| {
        data.entry((w.into(), t, s.into(), k.into())).or_default().push(v.unwrap_or(f64::NAN));
    };
    for round in 0..rounds {
        for &w in &workloads {
            for threads in [1usize, 2] {
                let ours = aotgrad_child(&["side".into(), w.into(), threads.to_string(), runs.to_string()])?;
                put(w, threads, "aotgrad", "step_ms", ours["step_ms"].as_f64());
                put(w, threads, "aotgrad", "first_call_ms", ours["first_call_ms"].as_f64());
                put(w, threads, "aotgrad", "compile_ms", ours["compile_ms"].as_f64());
                put(w, threads, "aotgrad", "memory", ours["peak_rss_delta_bytes"].as_f64());
                for system in PEERS {
                    let server = if system == "jax" { "jax" } else { "torch" };
                    let peer = peers.get_mut(&(server.to_string(), threads)).context("no peer")?;
                    let r = peer.ask(json!({"op": "step", "system": system, "workload": w, "runs": runs}))?;
                    if let Some(e) = r["error"].as_str() {
                        eprintln!("{system} {w} {threads}t: {e}");
                    }
                    put(w, threads, system, "step_ms", r["step_ms"].as_f64());
                    if round == 0 {
                        put(w, threads, system, "first_call_ms", r["first_call_ms"].as_f64());
                    }
                }
                eprintln!("round {}/{rounds}: {w} at {threads} thread(s) done", round + 1);
            }
        }
        for &w in workloads.iter().filter(|w| main_kind(w).is_some()) {
            for threads in [1usize, 2] {
                let ours = aotgrad_child(&["train".into(), w.into(), threads.to_string(), train_steps.to_string()])?;
                put(w, threads, "aotgrad", "samples_per_s", ours["samples_per_s"].as_f64());
                for system in PEERS {
                    let server = if system == "jax" { "jax" } else { "torch" };
                    let peer = peers.get_mut(&(server.to_string(), threads)).context("no peer")?;
                    let r = peer.ask(json!({"op": "train", "system": system, "workload": w, "steps": train_steps}))?;
                    put(w, threads, system, "samples_per_s", r["samples_per_s"].as_f64());
                }
            }
        }
    }
    // Step memory of the peers, each in a fresh process (eager and JAX, 2 threads).
    for &w in &workloads {
        for system in ["eager", "jax"] {
            let m = python_memory(&python, system, w, 2);
            put(w, 2, system, "memory", m);
        }
    }
    drop(peers);
    let get = |w: &str, t: usize, s: &str, k: &str| {
        data.get(&(w.to_string(), t, s.to_string(), k.to_string())).cloned().unwrap_or_default()
    };
    let systems = ["aotgrad", "eager", "compile", "jax"];
    let mut md = String::new();
    let isa = aotgrad_cpu::CpuBackend::new(1).jit_isa().unwrap_or("none (block interpreter)");
    let _ = writeln!(
        md,
        "# aotgrad next to PyTorch {} eager, torch.compile and JAX {}\n\nOn {cpu}, {} core(s); aotgrad's compiled \
         kernels: {isa}; one run, {rounds} round(s), each median over {runs} steps; cells are medians with the \
         rounds' range. 1 thread: one core for every system{}.\n",
        info["torch"].as_str().unwrap_or("?"),
        info["jax"].as_str().unwrap_or("(not installed)"),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        if pinned(1) { " (aotgrad under `taskset -c 0`, the peers pinned by `sched_setaffinity`)" } else { "" }
    );
    let _ = writeln!(md, "## Training step, ms\n");
    let _ = writeln!(md, "| workload | threads | aotgrad | PyTorch eager | torch.compile | JAX jit | aotgrad / best peer | aotgrad / eager |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &w in &workloads {
        for threads in [1usize, 2] {
            let cells: Vec<String> = systems.iter().map(|s| cell(&get(w, threads, s, "step_ms"), 2)).collect();
            let ours = median(&get(w, threads, "aotgrad", "step_ms"));
            let best = PEERS
                .iter()
                .map(|s| median(&get(w, threads, s, "step_ms")))
                .filter(|x| x.is_finite())
                .fold(f64::INFINITY, f64::min);
            let eager = median(&get(w, threads, "eager", "step_ms"));
            let _ = writeln!(
                md,
                "| {w} | {threads} | {} | {:.2}x | {:.2}x |",
                cells.join(" | "),
                ours / best,
                ours / eager
            );
            let mut row = json!({"workload": w, "threads": threads});
            for s in systems {
                for k in ["step_ms", "first_call_ms", "compile_ms", "samples_per_s", "memory"] {
                    let v = get(w, threads, s, k);
                    if !v.is_empty() {
                        row[format!("{s}_{k}")] = json!(v);
                    }
                }
            }
            rows.push(row);
        }
    }
    let _ = writeln!(md, "\n## 2 threads over 1 thread (step time)\n");
    let _ = writeln!(md, "| workload | aotgrad | PyTorch eager | torch.compile | JAX jit |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for &w in &workloads {
        let s: Vec<String> = systems
            .iter()
            .map(|s| format!("{:.2}x", median(&get(w, 1, s, "step_ms")) / median(&get(w, 2, s, "step_ms"))))
            .collect();
        let _ = writeln!(md, "| {w} | {} |", s.join(" | "));
    }
    let mains: Vec<&str> = workloads.iter().copied().filter(|w| main_kind(w).is_some()).collect();
    if !mains.is_empty() {
        let _ = writeln!(md, "\n## Main job on Fashion-MNIST, training samples/s ({train_steps} steps of batch 128 after 3 warm-up steps)\n");
        let _ = writeln!(
            md,
            "| workload | threads | aotgrad | PyTorch eager | torch.compile | JAX jit | aotgrad / eager |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for &w in &mains {
            for threads in [1usize, 2] {
                let cells: Vec<String> =
                    systems.iter().map(|s| cell(&get(w, threads, s, "samples_per_s"), 0)).collect();
                let r = median(&get(w, threads, "aotgrad", "samples_per_s"))
                    / median(&get(w, threads, "eager", "samples_per_s"));
                let _ = writeln!(md, "| {w} | {threads} | {} | {r:.2}x |", cells.join(" | "));
            }
        }
    }
    let _ = writeln!(
        md,
        "\n## Compile and first call (a fresh process: cold compile and one step), ms; step memory (resident-set \
         growth of the first step in a fresh process), MB\n"
    );
    let _ = writeln!(
        md,
        "| workload | aotgrad compile | aotgrad first call | torch.compile first call | JAX first call | aotgrad memory \
         | PyTorch eager memory | JAX memory |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for &w in &workloads {
        let mb = |s: &str, t: usize| {
            let v: Vec<f64> = get(w, t, s, "memory").iter().map(|b| b / 1e6).collect();
            cell(&v, 1)
        };
        let _ = writeln!(
            md,
            "| {w} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&get(w, 2, "aotgrad", "compile_ms"), 2),
            cell(&get(w, 2, "aotgrad", "first_call_ms"), 1),
            cell(&get(w, 2, "compile", "first_call_ms"), 0),
            cell(&get(w, 2, "jax", "first_call_ms"), 0),
            mb("aotgrad", 2),
            mb("eager", 2),
            mb("jax", 2)
        );
    }
    let _ = writeln!(md, "\nRatios below 1 mean aotgrad is faster. torch.compile's memory is not measured (its first step holds the compiler's own memory).");
    print!("{md}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("compare.md"), &md)?;
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_string_pretty(
            &json!({"info": info, "cpu": cpu, "jit": isa, "rounds": rounds, "runs": runs, "rows": rows}),
        )?,
    )?;
    eprintln!("wrote {}", dir.join("compare.md").display());
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> Result<usize> { args.get(i).and_then(|s| s.parse().ok()).context("expected a number") };
    match args.first().map(String::as_str) {
        Some("side") => {
            let v = side(args.get(1).context("workload")?, num(2)?, num(3)?)?;
            println!("{v}");
            Ok(())
        }
        Some("train") => {
            let v = train(args.get(1).context("workload")?, num(2)?, num(3)?)?;
            println!("{v}");
            Ok(())
        }
        _ => driver(),
    }
}

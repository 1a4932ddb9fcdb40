//! `cargo xtask bench --compare`: aotgrad next to PyTorch eager on the bench workloads,
//! measured in one run, interleaved (aotgrad, then PyTorch, round after round, so both
//! see the same machine load), with ratios.
//!
//! Needs a Python with torch, named by `AOTGRAD_COMPARE_PYTHON` (e.g. a virtual
//! environment's `bin/python`); it runs `benches/compare/torch_workloads.py`. Writes
//! `target/bench/compare.{md,json}`. `AOTGRAD_BENCH_RUNS` sets the runs per
//! measurement (default 15), `AOTGRAD_COMPARE_ROUNDS` the rounds (default 3).

use anyhow::{bail, Context, Result};
use aotgrad::AotConfig;
use aotgrad_benches::runtime::{compiled_step, eager_forward, median_ms, run_step, step_inputs};
use aotgrad_benches::{mlp, transformer, Workload};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Torch {
    fn start(python: &str) -> Result<Torch> {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compare/torch_workloads.py");
        let mut child = Command::new(python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {python} {}", script.display()))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(Torch { child, stdin, stdout })
    }

    fn ask(&mut self, req: Value) -> Result<Value> {
        writeln!(self.stdin, "{req}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the PyTorch script exited (is torch installed in AOTGRAD_COMPARE_PYTHON?)");
        }
        Ok(serde_json::from_str(&line)?)
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.child.wait();
    }
}

fn status_bytes(key: &str) -> Option<i64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<i64>().ok()? * 1024)
}

/// Peak resident-set growth of one `f()`: reset the high-water mark, run, read it.
fn peak_rss_delta(f: impl FnOnce() -> Result<()>) -> Result<Option<i64>> {
    let base = status_bytes("VmRSS:");
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    f()?;
    Ok(match (reset, base, status_bytes("VmHWM:")) {
        (true, Some(b), Some(p)) => Some(p - b),
        _ => None,
    })
}

fn aotgrad_side(w: &Workload, threads: usize, runs: usize) -> Result<Value> {
    let ins = step_inputs(w);
    let f = compiled_step(w, AotConfig::default().threads(threads))?;
    // The first call from a cold start (compile + step): its time, and how far it
    // raises the resident set (later steps reuse the memory it obtained).
    let mut first = 0.0;
    let peak = peak_rss_delta(|| {
        let t = Instant::now();
        run_step(&f, &ins)?;
        first = t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    })?;
    let step = median_ms(runs, || run_step(&f, &ins))?;
    let eager = median_ms(runs, || eager_forward(w))?;
    let saved = f.training_graphs().first().map(|(_, _, r)| r.activation_bytes).unwrap_or(0);
    Ok(json!({"first_call_ms": first, "step_ms": step, "eager_forward_ms": eager, "saved_bytes": saved,
        "peak_rss_delta_bytes": peak}))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<()> {
    let python = std::env::var("AOTGRAD_COMPARE_PYTHON").context(
        "set AOTGRAD_COMPARE_PYTHON to a Python that has torch (e.g. python3 -m venv /tmp/t && /tmp/t/bin/pip install torch)",
    )?;
    let runs: usize = std::env::var("AOTGRAD_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let rounds: usize = std::env::var("AOTGRAD_COMPARE_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let mut torch = Torch::start(&python)?;
    let info = torch.ask(json!({"op": "info"}))?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# aotgrad vs PyTorch {} eager{}\n\nMedians of {rounds} interleaved rounds of {runs} runs each, in this one run.\n",
        info["torch"].as_str().unwrap_or("?"),
        info["jax"].as_str().map(|v| format!(" (JAX {v} installed but not driven yet)")).unwrap_or_default()
    );
    let _ = writeln!(
        md,
        "| workload | threads | first call (compile + step) | training step | eager forward | saved activation bytes | peak RSS growth of the first call |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    let keys = ["first_call_ms", "step_ms", "eager_forward_ms"];
    for w in [mlp()?, transformer()?] {
        for threads in [1usize, 2] {
            let (mut ours, mut theirs): (Vec<Value>, Vec<Value>) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                ours.push(aotgrad_side(&w, threads, runs)?);
                theirs.push(torch.ask(json!({"op": "step", "workload": w.name, "threads": threads, "runs": runs}))?);
            }
            let med = |side: &[Value], k: &str| median(&side.iter().filter_map(|v| v[k].as_f64()).collect::<Vec<_>>());
            let mut cells = Vec::new();
            let mut row = json!({"workload": w.name, "threads": threads});
            for k in keys {
                let (a, t) = (med(&ours, k), med(&theirs, k));
                cells.push(format!("{a:.2} / {t:.2} ms ({:.2}x)", a / t));
                row[format!("aotgrad_{k}")] = json!(a);
                row[format!("torch_{k}")] = json!(t);
            }
            for k in ["saved_bytes", "peak_rss_delta_bytes"] {
                let (a, t) = (med(&ours, k), med(&theirs, k));
                cells.push(if a.is_nan() || t.is_nan() {
                    "n/a".into()
                } else {
                    format!("{:.1} / {:.1} MB ({:.2}x)", a / 1e6, t / 1e6, a / t)
                });
                row[format!("aotgrad_{k}")] = json!(a);
                row[format!("torch_{k}")] = json!(t);
            }
            let _ = writeln!(md, "| {} | {threads} | {} |", w.name, cells.join(" | "));
            eprintln!("{} {threads}t done", w.name);
            rows.push(row);
        }
    }
    let _ = writeln!(md, "\nEach cell: aotgrad / PyTorch (ratio; below 1 means aotgrad is faster or smaller).");
    print!("{md}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("compare.md"), &md)?;
    std::fs::write(dir.join("compare.json"), serde_json::to_string_pretty(&json!({"info": info, "rows": rows}))?)?;
    eprintln!("wrote {}", dir.join("compare.md").display());
    Ok(())
}

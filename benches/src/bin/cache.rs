//! Cold compile vs warm start from the disk cache, per workload: the bench MLP and
//! transformer block (training), and a 100k-node graph (`fanout`, training).
//!
//! Cold: a new function compiles with an empty cache (and writes the entry). Warm: a
//! new function with the filled cache (what a new process does: trace, key, load,
//! verify, instantiate). Reported: medians over several fresh functions (five warm
//! starts per cold compile), and the warm start's parts — "load" is reading + checking + decoding + instantiating the entry
//! (the cache's own cost), "key" is the canonical graph and its hash; the rest is
//! tracing the user's function.
//!
//! The MLP and transformer rows also time a cold compile and a warm start each in a
//! new process (`--child WORKLOAD DIR` runs one compile and prints its milliseconds
//! and hits): the first-use costs of a process (CPU feature detection, page faults,
//! lazily built tables) count there, as they do for a user's next run.
//!
//! `cargo run --release -p aotgrad-benches --bin cache [-- --quick]`

use anyhow::{ensure, Result};
use aotgrad::{AotConfig, AotFunction, Cache, EntrySource};
use aotgrad_benches::runtime::{compiled_step, run_step};
use aotgrad_benches::{mlp, pathological_with, transformer, Workload};
use aotgrad_trace::Tensor;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

struct Row {
    name: String,
    nodes: usize,
    entry_bytes: u64,
    cold_ms: f64,
    warm_ms: f64,
    load_ms: f64,
    key_ms: f64,
    /// Warm start with an empty local cache and the entry in Redis on loopback.
    redis_ms: Option<f64>,
    /// Cold compile and warm start each in a new process (`--child`): what a user's
    /// next run sees, first-use costs of the process included.
    fresh: Option<(f64, f64, f64)>,
}

/// Medians of `runs` cold compiles and warm starts of `workload` (`mlp` or
/// `transformer`), each in a new process of this binary, and of the warm starts' load
/// part.
fn fresh_process(workload: &str, runs: usize) -> Result<(f64, f64, f64)> {
    let exe = std::env::current_exe()?;
    let once = |dir: &std::path::Path| -> Result<(f64, u64, f64)> {
        let out = std::process::Command::new(&exe).arg("--child").arg(workload).arg(dir).output()?;
        ensure!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        let ms: f64 = it.next().and_then(|v| v.parse().ok()).ok_or_else(|| anyhow::anyhow!("child said {text:?}"))?;
        let hits: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let load: f64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        Ok((ms, hits, load))
    };
    let (mut cold, mut warm, mut load) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let dir = tempdir()?;
        let (c, h0, _) = once(&dir)?;
        let (w, h1, l) = once(&dir)?;
        ensure!(h0 == 0 && h1 == 1, "{workload}: fresh-process hits {h0} then {h1}");
        cold.push(c);
        warm.push(w);
        load.push(l);
        std::fs::remove_dir_all(&dir)?;
    }
    Ok((median(cold), median(warm), median(load)))
}

/// A `redis-server` on a loopback port for the Redis rows (none: no binary).
struct Redis(std::process::Child, u16);

impl Redis {
    fn start() -> Option<Redis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t.elapsed().as_secs() > 10 {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(Redis(child, port))
    }
    fn store(&self) -> Box<aotgrad::cache::RedisStore> {
        let url = format!("redis://127.0.0.1:{}/", self.1);
        Box::new(aotgrad::cache::RedisStore::new(&url, std::time::Duration::from_secs(2), 3600).expect("url"))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Warm starts timed per cold compile in [`measure`].
const WARM_REPEATS: usize = 5;

fn measure(
    name: &str,
    runs: usize,
    redis: Option<&Redis>,
    make: &dyn Fn(AotConfig) -> Result<(AotFunction, Vec<Tensor>)>,
) -> Result<Row> {
    let mut remote = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut load = Vec::new();
    let mut key = Vec::new();
    let mut nodes = 0;
    let mut entry_bytes = 0;
    for _ in 0..runs {
        let dir = tempdir()?;
        let cache = Arc::new(Cache::disk(&dir));
        let config = AotConfig::default().threads(1).cache(cache.clone());
        let (f, inputs) = make(config.clone())?;
        let t = Instant::now();
        f.compile_for(&inputs.iter().map(|t| t.into()).collect::<Vec<_>>())?;
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        nodes = f.results()[0].meta.traced_nodes;
        entry_bytes = cache.list()?.iter().map(|b| b.bytes).sum();
        // Several warm starts per entry (each a new function), as a benchmark harness
        // would repeat one: the first after a cold compile pays for the allocator and
        // caches the compile left behind, which a new process does not inherit.
        for _ in 0..WARM_REPEATS {
            let (g, inputs) = make(config.clone())?;
            let t = Instant::now();
            g.compile_for(&inputs.iter().map(|t| t.into()).collect::<Vec<_>>())?;
            warm.push(t.elapsed().as_secs_f64() * 1e3);
            let s = g.cache_stats();
            ensure!(s.hits == 1 && g.compile_reports()[0].source == EntrySource::Cache, "{name}: no hit: {s:?}");
            load.push(s.load_seconds * 1e3);
            key.push(s.key_seconds * 1e3);
        }
        std::fs::remove_dir_all(&dir)?;
        if let Some(r) = redis {
            // Fill Redis through one machine, then start warm on another (empty local dir).
            let (a, b) = (tempdir()?, tempdir()?);
            let fill = Arc::new(Cache::disk(&a).signed(b"bench").with_remote(r.store()));
            let (f, inputs) = make(AotConfig::default().threads(1).cache(fill))?;
            f.compile_for(&inputs.iter().map(|t| t.into()).collect::<Vec<_>>())?;
            let warm_remote = Arc::new(Cache::disk(&b).signed(b"bench").with_remote(r.store()));
            let (g, inputs) = make(AotConfig::default().threads(1).cache(warm_remote))?;
            let t = Instant::now();
            g.compile_for(&inputs.iter().map(|t| t.into()).collect::<Vec<_>>())?;
            remote.push(t.elapsed().as_secs_f64() * 1e3);
            ensure!(g.cache_stats().hits == 1, "{name}: no Redis hit: {:?}", g.cache_stats());
            std::fs::remove_dir_all(&a)?;
            std::fs::remove_dir_all(&b)?;
        }
    }
    Ok(Row {
        name: name.to_string(),
        nodes,
        entry_bytes,
        cold_ms: median(cold),
        warm_ms: median(warm),
        load_ms: median(load),
        key_ms: median(key),
        redis_ms: (!remote.is_empty()).then(|| median(remote)),
        fresh: None,
    })
}

fn tempdir() -> Result<std::path::PathBuf> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "aotgrad-cache-bench-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Builds the compiled function of one workload under a config, with its example inputs.
type Make = Box<dyn Fn(AotConfig) -> Result<(AotFunction, Vec<Tensor>)>>;

fn workload(w: Workload) -> impl Fn(AotConfig) -> Result<(AotFunction, Vec<Tensor>)> {
    move |config| {
        let f = compiled_step(&w, config)?;
        let inputs = aotgrad_benches::example_inputs(&w);
        Ok((f, inputs))
    }
}

fn main() -> Result<()> {
    // `--loop-warm N [WORKLOAD]`: N warm starts in a row (for profiling) of the
    // transformer block, or of `mlp`, or of `fanoutK` (the fanout graph of K nodes).
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--loop-warm") {
        let n: usize = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(100);
        let which = args.get(i + 2).map(String::as_str).unwrap_or("transformer");
        let make: Make = match which {
            "transformer" => Box::new(workload(transformer()?)),
            "mlp" => Box::new(workload(mlp()?)),
            f if f.starts_with("fanout") => {
                let k: usize = f["fanout".len()..].parse()?;
                Box::new(move |config| pathological_with("fanout", k, true, config))
            }
            other => anyhow::bail!("unknown workload {other:?} (transformer, mlp, fanoutK)"),
        };
        let dir = tempdir()?;
        let config = AotConfig::default().threads(1).cache(Arc::new(Cache::disk(&dir)));
        let (f, inputs) = make(config.clone())?;
        let inputs: Vec<aotgrad::Arg> = inputs.iter().map(|t| t.into()).collect();
        f.compile_for(&inputs)?;
        let (mut total, mut load) = (0.0, 0.0);
        for _ in 0..n {
            let (g, _) = make(config.clone())?;
            let t = Instant::now();
            g.compile_for(&inputs)?;
            total += t.elapsed().as_secs_f64();
            load += g.cache_stats().load_seconds;
        }
        println!(
            "{which}: {:.3} ms per warm start, of which load {:.3} ms",
            total * 1e3 / n as f64,
            load * 1e3 / n as f64
        );
        std::fs::remove_dir_all(&dir)?;
        return Ok(());
    }
    // `--child WORKLOAD DIR`: one compile of WORKLOAD with the disk cache in DIR, in this
    // (fresh) process; prints its milliseconds, whether it hit and the load milliseconds.
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let (name, dir) = (&args[i + 1], std::path::PathBuf::from(&args[i + 2]));
        let w = if name == "mlp" { mlp()? } else { transformer()? };
        let config = AotConfig::default().threads(1).cache(Arc::new(Cache::disk(&dir)));
        let f = compiled_step(&w, config)?;
        let inputs: Vec<aotgrad::Arg> = aotgrad_benches::example_inputs(&w).iter().map(|t| t.into()).collect();
        let t = Instant::now();
        f.compile_for(&inputs)?;
        let s = f.cache_stats();
        println!("{} {} {}", t.elapsed().as_secs_f64() * 1e3, s.hits, s.load_seconds * 1e3);
        return Ok(());
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 1 } else { 5 };
    let redis = Redis::start();
    if redis.is_none() {
        eprintln!("no redis-server: the Redis column is left out (apt-get install redis-server)");
    }
    let r = redis.as_ref();
    let mut rows = vec![
        measure("mlp (training)", runs, r, &workload(mlp()?))?,
        measure("transformer block (training)", runs, r, &workload(transformer()?))?,
    ];
    rows[0].fresh = Some(fresh_process("mlp", if quick { 1 } else { 7 })?);
    rows[1].fresh = Some(fresh_process("transformer", if quick { 1 } else { 7 })?);
    let big = if quick { 10_000 } else { 100_000 };
    rows.push(measure(&format!("fanout {big} (training)"), if quick { 1 } else { 3 }, r, &|config| {
        pathological_with("fanout", big, true, config)
    })?);
    // A check that a loaded step runs: the transformer block, warm, one step.
    {
        let w = transformer()?;
        let dir = tempdir()?;
        let config = AotConfig::default().cache(Arc::new(Cache::disk(&dir)));
        let inputs = aotgrad_benches::example_inputs(&w);
        run_step(&compiled_step(&w, config.clone())?, &inputs)?;
        run_step(&compiled_step(&w, config)?, &inputs)?;
        std::fs::remove_dir_all(&dir)?;
    }
    println!(
        "| workload | traced nodes | entry bytes | cold compile | warm start (disk) | of which load | of which key | \
         cold / warm | cold / load | warm start (Redis, empty disk) | new process: cold / warm; load |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut out = Vec::new();
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} ms | {:.2} ms | {:.3} ms | {:.3} ms | {:.0}× | {:.0}× | {} | {} |",
            r.name,
            r.nodes,
            r.entry_bytes,
            r.cold_ms,
            r.warm_ms,
            r.load_ms,
            r.key_ms,
            r.cold_ms / r.warm_ms,
            r.cold_ms / r.load_ms,
            r.redis_ms.map_or("—".to_string(), |m| format!("{m:.2} ms ({:.0}×)", r.cold_ms / m)),
            r.fresh.map_or("—".to_string(), |(c, w, l)| format!(
                "{c:.2} / {w:.2} ms ({:.1}×); load {l:.3} ms ({:.0}×)",
                c / w,
                c / l
            ))
        );
        out.push(json!({"workload": r.name, "nodes": r.nodes, "entry_bytes": r.entry_bytes, "cold_ms": r.cold_ms,
            "warm_ms": r.warm_ms, "load_ms": r.load_ms, "key_ms": r.key_ms, "redis_warm_ms": r.redis_ms,
            "fresh_process_cold_ms": r.fresh.map(|f| f.0), "fresh_process_warm_ms": r.fresh.map(|f| f.1),
            "fresh_process_load_ms": r.fresh.map(|f| f.2)}));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("cache.json"), serde_json::to_vec_pretty(&out)?)?;
    Ok(())
}

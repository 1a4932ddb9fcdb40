//! Dev: time (and profile) the compiled CPU backend's compile of the bench workloads'
//! forward and backward graphs: `N` compiles each, `JIT=0` without machine code,
//! `DEEP=layers` for the deep narrow MLP of the scaling rows instead.
use aotgrad_cpu::CpuBackend;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let jit = std::env::var("JIT").map_or(true, |v| v != "0");
    let deep: Option<usize> = std::env::var("DEEP").ok().and_then(|s| s.parse().ok());
    let works = match deep {
        Some(layers) => vec![aotgrad_benches::deep_mlp(layers)?],
        None => vec![aotgrad_benches::mlp()?, aotgrad_benches::transformer()?],
    };
    for w in works {
        let p = aotgrad_benches::pipeline(&w, true)?;
        let be = CpuBackend::new(1).jit(jit);
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(be.compile_graph(&p.forward)?);
            std::hint::black_box(be.compile_graph(&p.backward)?);
        }
        println!("{}: backend fw+bw {:.3} ms (jit {jit})", w.name, t.elapsed().as_secs_f64() * 1e3 / n as f64);
    }
    Ok(())
}

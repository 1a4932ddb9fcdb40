//! Training-step medians per backend (dev): `cargo run --release -p aotgrad-benches --bin steps`; `ONLY=mlp`, `WHICH=cpu1` (reference, cpu1, cpu2), `RUNS=n`; with `AOTGRAD_CPU_PROFILE=1` the compiled graphs print per-kernel times, with `RUST_LOG=aotgrad=debug` their kernel plans.
use aotgrad::AotConfig;
use aotgrad_benches::runtime::*;

fn main() -> anyhow::Result<()> {
    aotgrad::init_logging();
    let runs: usize = std::env::var("RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let only = std::env::var("ONLY").unwrap_or_default();
    let which = std::env::var("WHICH").unwrap_or_default();
    for w in [aotgrad_benches::mlp()?, aotgrad_benches::transformer()?] {
        if !only.is_empty() && !w.name.starts_with(&only) {
            continue;
        }
        let ins = step_inputs(&w);
        let eager = if which.is_empty() { median_ms(runs, || eager_forward(&w))? } else { 0.0 };
        let mut line = format!("{}: eager fw {eager:.2} ms", w.name);
        for (name, cfg) in [
            ("reference", AotConfig::default().reference_backend()),
            ("cpu1", AotConfig::default().threads(1)),
            ("cpu2", AotConfig::default().threads(2)),
        ] {
            if !which.is_empty() && which != name {
                continue;
            }
            let f = compiled_step(&w, cfg)?;
            let t = median_ms(runs, || run_step(&f, &ins))?;
            line += &format!(", {name} {t:.2} ms");
        }
        println!("{line}");
    }
    Ok(())
}

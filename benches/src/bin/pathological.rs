//! Compile time per stage on pathological program shapes (issue: linear-time passes):
//! `cargo run --release -p aotgrad-benches --bin pathological -- [view|chain|mixed|fanout] N [train]`.
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind = args.first().map(String::as_str).unwrap_or("view").to_string();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let train = args.get(2).is_some_and(|s| s == "train");
    let (af, ins) = aotgrad_benches::pathological(&kind, n, train)?;
    let t = Instant::now();
    if train {
        af.forward(&ins)?;
    } else {
        af.call(&ins)?;
    }
    let total = t.elapsed().as_secs_f64();
    let r = &af.compile_reports()[0];
    println!(
        "{kind} n={n} train={train}: {:.3} s total ({:.1} µs/op); {}",
        total,
        total * 1e6 / n as f64,
        r.stages.iter().map(|(s, t)| format!("{s} {:.3}s", t)).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

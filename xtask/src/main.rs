//! `cargo xtask`: project chores.
//!
//! - `cargo xtask ci`: formatting check, clippy with warnings denied, the whole test suite.
//!   This is what `.ci/run` and the README's test command run.
//! - `cargo xtask bench`: criterion benches (compile stages, training step) and the
//!   report (`benches/src/bin/report.rs`), also written to `target/bench/report.{md,json}`
//!   (`--report` for only it).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

fn run(step: &str, args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    eprintln!("==> {step}: cargo {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new(&cargo).args(args).status().with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    eprintln!("==> {step}: ok in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// Run a `cargo test` command, echoing its output, and count the tests of every
/// `test result:` line it prints: `(passed, failed)`.
fn run_tests(step: &str, args: &[&str]) -> Result<(u64, u64)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    eprintln!("==> {step}: cargo {}", args.join(" "));
    let start = Instant::now();
    let mut child = Command::new(&cargo)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {cargo}"))?;
    let (mut passed, mut failed) = (0, 0);
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                let count = |what: &str| {
                    rest.split(';')
                        .find_map(|part| part.trim().strip_suffix(what)?.trim().rsplit(' ').next()?.parse().ok())
                };
                passed += count("passed").unwrap_or(0);
                failed += count("failed").unwrap_or(0);
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{step} failed ({status}): {passed} passed, {failed} failed");
    }
    eprintln!("==> {step}: ok in {:.1}s ({passed} passed)", start.elapsed().as_secs_f64());
    Ok((passed, failed))
}

fn ci() -> Result<()> {
    run("fmt", &["fmt", "--all", "--", "--check"])?;
    run("clippy", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    // The README's main job must keep working: train through the compiler.
    run("main job", &["run", "-q", "-p", "aotgrad", "--example", "train"])?;
    let (p1, f1) = run_tests("test", &["test", "--workspace", "--all-targets"])?;
    let (p2, f2) = run_tests("doctest", &["test", "--workspace", "--doc"])?;
    // The plain closing line: the whole suite's count.
    println!("ci: {} passed, {} failed", p1 + p2, f1 + f2);
    Ok(())
}

fn bench(args: &[String]) -> Result<()> {
    // Criterion benches (per-stage compile times, training step), then the report of
    // saved bytes, recomputation and stage medians. `--report` skips criterion.
    if !args.iter().any(|a| a == "--report") {
        run("criterion", &["bench", "-p", "aotgrad-benches"])?;
    }
    run("report", &["run", "--release", "-q", "-p", "aotgrad-benches", "--bin", "report"])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(&args[1..]),
        Some("help") | None => {
            println!("usage: cargo xtask <task>\n\ntasks:\n  ci       fmt check, clippy -D warnings, all tests\n  bench    criterion benches + the report written to target/bench/report.{{md,json}} (--report: report only)");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask help`)"),
    }
}

//! `cargo xtask`: project chores.
//!
//! - `cargo xtask ci`: formatting check, clippy with warnings denied, the whole test suite.
//!   This is what `.ci/run` and the README's test command run.

use anyhow::{bail, Context, Result};
use std::process::Command;
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

fn ci() -> Result<()> {
    run("fmt", &["fmt", "--all", "--", "--check"])?;
    run("clippy", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    run("test", &["test", "--workspace", "--all-targets"])?;
    run("doctest", &["test", "--workspace", "--doc"])?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("help") | None => {
            println!("usage: cargo xtask <task>\n\ntasks:\n  ci    fmt check, clippy -D warnings, all tests");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask help`)"),
    }
}

//! `cargo xtask`: project chores.
//!
//! - `cargo xtask ci`: formatting check, clippy with warnings denied, the whole test suite,
//!   then the inference and training contract suites again with `AOTGRAD_BACKEND=wgpu`,
//!   and the CPU backend's differential, JIT and convolution tests on its AVX2 code
//!   (`AOTGRAD_CPU_ISA=avx2`).
//!   This is what `.ci/run` and the README's test command run.
//! - `cargo xtask train [ARGS]`: the main job — installs Fashion-MNIST when it is missing
//!   (Debian's `dataset-fashion-mnist`, when running as root with apt), then runs
//!   `aotgrad train ARGS` from a release build.
//! - `cargo xtask bench`: criterion benches (compile stages, training step) and the
//!   report (`benches/src/bin/report.rs`), also written to `target/bench/report.{md,json}`
//!   (`--report` for only it), then cold compile vs warm cache start
//!   (`benches/src/bin/cache.rs`, `target/bench/cache.json`). `cargo xtask bench --compare` runs the bench and
//!   main-job workloads next to PyTorch eager, torch.compile and JAX (`benches/compare/peers.py`, with the
//!   Python named by `AOTGRAD_COMPARE_PYTHON`), round by round in one run, with ratios.
//!   `cargo xtask bench --dist` runs the data-parallel bench (`benches/src/bin/dist.rs`,
//!   under `mpirun -np 2`: allreduce GB/s next to raw MPI, step time and overlap at 2
//!   processes × 1 thread next to 1 process × 2 threads, ZeRO-1's optimizer memory).
//!   `cargo xtask bench --backend wgpu [--quick|--full]` runs the wgpu backend's bench
//!   (`benches/src/bin/wgpu.rs`): GB/s and GFLOP/s next to the compiled CPU backend,
//!   with the adapter's name (`target/bench/wgpu.{md,json}`).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

fn run(step: &str, args: &[&str]) -> Result<()> {
    run_with(step, args, &[])
}

/// [`run`] with extra environment variables for cargo.
fn run_with(step: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let shown: Vec<String> = envs.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("==> {step}: {}cargo {}", shown.concat(), args.join(" "));
    let start = Instant::now();
    let status = Command::new(&cargo)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    eprintln!("==> {step}: ok in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// Run a `cargo test` command, echoing its output, and count the tests of every
/// `test result:` line it prints: `(passed, failed)`.
fn run_tests(step: &str, args: &[&str]) -> Result<(u64, u64)> {
    run_tests_with(step, args, &[])
}

/// [`run_tests`] with environment variables set.
fn run_tests_with(step: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<(u64, u64)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let shown: Vec<String> = envs.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("==> {step}: {}cargo {}", shown.concat(), args.join(" "));
    let start = Instant::now();
    let mut child = Command::new(&cargo)
        .args(args)
        .envs(envs.iter().copied())
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

/// Where Debian's `dataset-fashion-mnist` installs the IDX files.
const DATASET_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Make sure Fashion-MNIST is there (unless `AOTGRAD_DATA` points elsewhere): install
/// the Debian package when this process may (root, apt-get present). Otherwise leave
/// it to `aotgrad train`, whose error says how to install it.
fn ensure_dataset() -> Result<()> {
    if std::env::var_os("AOTGRAD_DATA").is_some()
        || std::path::Path::new(DATASET_DIR).join("train-images-idx3-ubyte.gz").is_file()
    {
        return Ok(());
    }
    ensure_package("dataset", "dataset-fashion-mnist", &format!("{DATASET_DIR} is missing"))
}

/// Make sure `redis-server` is installed: the Redis tier's tests start one on a
/// loopback port (they fail without it, saying how to get it, unless
/// `AOTGRAD_SKIP_REDIS_TESTS=1`).
fn ensure_redis() -> Result<()> {
    let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_ok();
    if found || std::env::var("AOTGRAD_SKIP_REDIS_TESTS").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    ensure_package("redis", "redis-server", "redis-server is missing")
}

/// The wgpu tests need a Vulkan driver: lavapipe (Debian's `mesa-vulkan-drivers`)
/// when the machine has none. `AOTGRAD_SKIP_GPU_TESTS=1` skips them instead.
fn ensure_vulkan() -> Result<()> {
    let icd_dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"];
    let found = icd_dirs.iter().any(|d| std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some()));
    if found || std::env::var("AOTGRAD_SKIP_GPU_TESTS").is_ok_and(|v| v == "1") || cfg!(not(target_os = "linux")) {
        return Ok(());
    }
    ensure_package("vulkan", "mesa-vulkan-drivers", "no Vulkan driver is installed")
}

/// `aotgrad-dist` builds its MPI bindings against Open MPI's `mpi.h` with libclang
/// (bindgen), and its tests launch `mpirun`: install Debian's `openmpi-bin`,
/// `libopenmpi-dev` and `libclang-dev` when they are missing.
fn ensure_mpi() -> Result<()> {
    let ok = |cmd: &str, arg: &str| {
        Command::new(cmd).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    let libclang = std::fs::read_dir("/usr/lib").is_ok_and(|dirs| {
        dirs.flatten().any(|d| {
            d.file_name().to_string_lossy().starts_with("llvm-")
                && std::fs::read_dir(d.path().join("lib"))
                    .is_ok_and(|l| l.flatten().any(|f| f.file_name().to_string_lossy().starts_with("libclang.so")))
        })
    });
    if !ok("mpirun", "--version") {
        ensure_package("mpi", "openmpi-bin", "mpirun is missing")?;
    }
    if !ok("mpicc", "-showme:version") {
        ensure_package("mpi", "libopenmpi-dev", "Open MPI's headers (mpicc) are missing")?;
    }
    if !libclang {
        ensure_package("mpi", "libclang-dev", "libclang (for the MPI bindings) is missing")?;
    }
    Ok(())
}

/// `mpirun -np N` with the options this project's machines need: as root (CI's
/// user) Open MPI must be told it may run; more ranks than cores; shared memory
/// without the single-copy mechanism, which containers often forbid.
fn mpirun_args(np: usize) -> Vec<String> {
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.trim_ascii() == b"0").unwrap_or(false);
    let mut a: Vec<String> = Vec::new();
    if root {
        a.push("--allow-run-as-root".into());
    }
    for s in ["--oversubscribe", "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"] {
        a.push(s.into());
    }
    a.push("-np".into());
    a.push(np.to_string());
    a
}

/// Run `mpirun ARGS` (a step of this task).
fn run_mpirun(step: &str, args: &[String]) -> Result<()> {
    eprintln!("==> {step}: mpirun {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new("mpirun").args(args).status().context("could not start mpirun")?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    eprintln!("==> {step}: ok in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// Install Debian package `package` when this process may (root, apt-get present);
/// otherwise say how to.
fn ensure_package(step: &str, package: &str, why: &str) -> Result<()> {
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.trim_ascii() == b"0").unwrap_or(false);
    let apt = Command::new("apt-get").arg("--version").stdout(Stdio::null()).status().is_ok();
    if !(root && apt) {
        eprintln!("==> {step}: {why} and this user cannot install it; run `sudo apt-get install {package}`");
        return Ok(());
    }
    eprintln!("==> {step}: installing {package} (apt-get)");
    let install = || {
        Command::new("apt-get").args(["install", "-y", "-q", package]).env("DEBIAN_FRONTEND", "noninteractive").status()
    };
    if !install().map(|s| s.success()).unwrap_or(false) {
        // A fresh machine may have no package lists yet.
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        let status = install().context("could not run apt-get")?;
        if !status.success() {
            bail!("apt-get install {package} failed ({status})");
        }
    }
    Ok(())
}

/// The main job: `aotgrad train ARGS` from a release build; `--np N` (before any
/// `--`) trains on N processes under `mpirun` (the CLI built with its `mpi` feature).
fn train(args: &[String]) -> Result<()> {
    ensure_dataset()?;
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(i) = args[..split].iter().position(|a| a == "--np") {
        let np: usize = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .context("--np takes a number of processes")?;
        let rest: Vec<String> =
            args.iter().enumerate().filter(|(j, _)| *j != i && *j != i + 1).map(|(_, a)| a.clone()).collect();
        let rest = rest.strip_prefix(&["--".to_string()]).unwrap_or(&rest);
        ensure_mpi()?;
        run("build", &["build", "--release", "-q", "-p", "aotgrad-cli", "--features", "mpi", "--bin", "aotgrad"])?;
        let mut m = mpirun_args(np);
        m.push(target_dir().join("release/aotgrad").to_string_lossy().into_owned());
        m.push("train".into());
        m.extend(rest.iter().cloned());
        return run_mpirun("train", &m);
    }
    let mut cargo_args = vec!["run", "--release", "-q", "-p", "aotgrad-cli", "--bin", "aotgrad", "--", "train"];
    // `cargo xtask train -- --help` and `cargo xtask train --help` both reach aotgrad.
    let args = args.strip_prefix(&["--".to_string()]).unwrap_or(args);
    cargo_args.extend(args.iter().map(String::as_str));
    run("train", &cargo_args)
}

/// The workspace's target directory (`CARGO_TARGET_DIR`, else `target/`).
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| std::path::PathBuf::from("target"), std::path::PathBuf::from)
}

fn ci() -> Result<()> {
    run("fmt", &["fmt", "--all", "--", "--check"])?;
    // aotgrad-dist (a workspace member) needs Open MPI to build and to test.
    ensure_mpi()?;
    run("clippy", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    // Every public item documented, every intra-doc link resolving.
    run_with("doc", &["doc", "--workspace", "--no-deps"], &[("RUSTDOCFLAGS", "-D warnings")])?;
    // The README's main job must keep working: a short run on real data that must
    // learn (one epoch on a subset, asserting the test accuracy).
    ensure_dataset()?;
    // Twice, in two processes, with a fresh cache: the second run must load every
    // specialization from the first one's cache and learn the same.
    let cache_dir = std::env::temp_dir().join(format!("aotgrad-ci-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache_dir);
    let cache = cache_dir.to_string_lossy().into_owned();
    let short: Vec<&str> = vec![
        "run",
        "-q",
        "-p",
        "aotgrad-cli",
        "--bin",
        "aotgrad",
        "--",
        "train",
        "--epochs",
        "1",
        "--train-limit",
        "12800",
        "--test-limit",
        "2000",
        "--warmup-steps",
        "20",
        "--min-accuracy",
        "0.75",
        "--no-progress",
        "--cache-dir",
        &cache,
    ];
    run("main job (short)", &short)?;
    let mut rerun = short.clone();
    rerun.push("--require-cache-hits");
    run("main job (short, rerun from the cache)", &rerun)?;
    // The same short run data-parallel on 2 processes (the CLI with its `mpi`
    // feature), from the cache the runs above filled: rank 0 loads, then the others.
    run("build (mpi)", &["build", "-q", "-p", "aotgrad-cli", "--features", "mpi", "--bin", "aotgrad"])?;
    let mut m = mpirun_args(2);
    m.push(target_dir().join("debug/aotgrad").to_string_lossy().into_owned());
    m.extend(short[7..].iter().map(|s| s.to_string()));
    run_mpirun("main job (short) on 2 processes", &m)?;
    let _ = std::fs::remove_dir_all(&cache_dir);
    ensure_redis()?;
    ensure_vulkan()?;
    let (p1, f1) = run_tests("test", &["test", "--workspace", "--all-targets"])?;
    let (p2, f2) = run_tests("doctest", &["test", "--workspace", "--doc"])?;
    // The inference and training contract suites again with wgpu as the default
    // backend (on lavapipe here): device-resident results through every aliasing,
    // mutation and gradient case of the contract (in f32: WGSL has no f64).
    let (p3, f3) = if std::env::var("AOTGRAD_SKIP_GPU_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("==> contract on wgpu: skipped (AOTGRAD_SKIP_GPU_TESTS=1)");
        (0, 0)
    } else {
        run_tests_with(
            "contract on wgpu",
            &["test", "-p", "aotgrad", "--features", "wgpu", "--test", "inference", "--test", "training"],
            &[("AOTGRAD_BACKEND", "wgpu")],
        )?
    };
    // The compiled CPU backend's differential suite, JIT and convolution tests again on
    // its AVX2 code (this machine's AVX-512 capped: both paths checked bit for bit
    // against the interpreter on one machine).
    let (p4, f4) = run_tests_with(
        "cpu backend on AVX2",
        &["test", "-p", "aotgrad-cpu", "--test", "jit", "--test", "compiled", "--test", "conv"],
        &[("AOTGRAD_CPU_ISA", "avx2")],
    )?;
    // The plain closing line: the whole suite's count.
    println!("ci: {} passed, {} failed", p1 + p2 + p3 + p4, f1 + f2 + f3 + f4);
    Ok(())
}

fn bench(args: &[String]) -> Result<()> {
    // `--compare`: only the side-by-side run against PyTorch (needs AOTGRAD_COMPARE_PYTHON).
    if args.iter().any(|a| a == "--compare") {
        if std::env::var_os("AOTGRAD_COMPARE_PYTHON").is_none() {
            bail!(
                "--compare needs AOTGRAD_COMPARE_PYTHON: a Python with torch and jax, e.g. \
                 `python3 -m venv ~/torch-venv && ~/torch-venv/bin/pip install torch 'jax[cpu]'`, then \
                 `AOTGRAD_COMPARE_PYTHON=~/torch-venv/bin/python cargo xtask bench --compare`"
            );
        }
        return run("compare", &["run", "--release", "-q", "-p", "aotgrad-benches", "--bin", "compare"]);
    }
    // `--dist`: the data-parallel bench: one process × 2 threads, then 2 processes × 1
    // thread under mpirun (benches/src/bin/dist.rs; target/bench/dist.{md,json}).
    if args.iter().any(|a| a == "--dist") {
        ensure_mpi()?;
        run("build", &["build", "--release", "-q", "-p", "aotgrad-benches", "--features", "mpi", "--bin", "dist"])?;
        let bin = target_dir().join("release/dist").to_string_lossy().into_owned();
        let status = Command::new(&bin).arg("--single").status().context("could not start the dist bench")?;
        if !status.success() {
            bail!("dist --single failed ({status})");
        }
        let mut m = mpirun_args(2);
        m.push(bin);
        return run_mpirun("dist bench", &m);
    }
    // `--backend wgpu`: the wgpu backend's GB/s and GFLOP/s next to the compiled CPU
    // backend, with the adapter (benches/src/bin/wgpu.rs; target/bench/wgpu.{md,json}).
    if let Some(i) = args.iter().position(|a| a == "--backend") {
        return match args.get(i + 1).map(String::as_str) {
            Some("wgpu") => {
                let mut cmd = vec!["run", "--release", "-q", "-p", "aotgrad-benches", "--bin", "wgpu", "--"];
                cmd.extend(args.iter().filter(|a| *a == "--quick" || *a == "--full").map(String::as_str));
                run("wgpu bench", &cmd)
            }
            Some("cpu") => {
                bench(&args.iter().filter(|a| *a != "--backend" && *a != "cpu").cloned().collect::<Vec<_>>())
            }
            Some(other) => bail!("--backend takes cpu or wgpu, not {other:?}"),
            None => bail!("--backend takes cpu or wgpu"),
        };
    }
    // Criterion benches (per-stage compile times, training step), then the report of
    // saved bytes, recomputation and stage medians. `--report` skips criterion.
    if !args.iter().any(|a| a == "--report") {
        run("criterion", &["bench", "-p", "aotgrad-benches"])?;
    }
    run("report", &["run", "--release", "-q", "-p", "aotgrad-benches", "--bin", "report"])?;
    // Cold compile vs warm start from the cache (disk; Redis on loopback when
    // redis-server is installed), also written to target/bench/cache.json.
    run("cache", &["run", "--release", "-q", "-p", "aotgrad-benches", "--bin", "cache"])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(&args[1..]),
        Some("train") => train(&args[1..]),
        Some("help") | None => {
            println!("usage: cargo xtask <task>\n\ntasks:\n  ci       fmt check, clippy -D warnings, a short main job, all tests\n  train    the main job: install Fashion-MNIST if missing, then `aotgrad train ARGS` (release build; try `-- --help`)\n  bench    criterion benches + the report written to target/bench/report.{{md,json}} (--report: report only;\n           --compare: aotgrad next to PyTorch eager, torch.compile and JAX, round by round,
           with AOTGRAD_COMPARE_PYTHON=a python with torch and jax;\n           --dist: data-parallel training on 2 processes (allreduce GB/s, overlap, ZeRO-1 memory);\n           --backend wgpu [--quick|--full]: the wgpu backend's GB/s and GFLOP/s next to the CPU backend)");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask help`)"),
    }
}

//! Stored results whose checksum is valid but whose contents were changed: what
//! someone who can write an unsigned cache (or holds its key), or hands over a
//! precompiled file, can do. Every field of real stored results — the runtime
//! metadata, the CPU artifact's fields, its kernel plan and its lowered program — is
//! changed one at a time (the checksum recomputed), and the program is loaded and
//! called again. The property: the forged result is rejected (a cache entry is then
//! recompiled and the call gives the right values; a precompiled file is refused
//! with an error naming it), or it is loaded and runs. Never a panic, an abort, a
//! hang, or an internal error.
//!
//! Values are not part of the property for a result that loads: a forged result that
//! passes every consistency check is a *different valid program* (say, a constant
//! changed in its graph, or two outputs swapped), which no check can tell from the
//! real one; keeping a forger from substituting programs is what signing the cache
//! is for ([`Cache::signed`]). The test counts such loads and prints them.
//!
//! CI runs a seeded sample of each kind's mutations (`AOTGRAD_FORGED_SAMPLE`, default
//! 60 per kind); `AOTGRAD_FORGED_SAMPLE=all` runs every one.

use aotgrad::cache::envelope::{self, Kind};
use aotgrad::cache::{Cache, StoredArtifact, StoredEntry, StoredResult};
use aotgrad::cpu::compiled::CpuArtifact;
use aotgrad::ir::codec;
use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function, AotConfig, AotFunction};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

type Out = aotgrad::Result<Vec<Tensor>>;
type Values = Vec<Vec<f64>>;

fn data(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        })
        .collect();
    Tensor::from_f64(&vals, shape, DType::F32).expect("data")
}

/// Inference: an input mutation, a metadata mutation, outputs that alias an input,
/// an intermediate and each other.
fn inference(a: &[Tensor]) -> Out {
    let (x, y) = (&a[0], &a[1]);
    x.mul_(2.0)?;
    let t = x.t()?;
    let s = y.add(&t.sum(&[1], false)?)?;
    let h = s.exp()?;
    let v = h.view(&[2, 2])?;
    Ok(vec![t.clone(), s.clone(), v, h.clone(), h])
}

fn run_inference(f: &AotFunction) -> aotgrad::Result<Values> {
    let inputs = vec![data(&[3, 4], 5), data(&[4], 6)];
    let outs = f.call(&inputs)?;
    let mut v: Values = outs.iter().map(|t| Ok(t.to_vec_f64()?)).collect::<aotgrad::Result<_>>()?;
    v.push(inputs[0].to_vec_f64()?);
    v.push(vec![inputs[0].version()? as f64]);
    Ok(v)
}

/// Training: two layers, a loss, an output that views the hidden layer.
fn training(a: &[Tensor]) -> Out {
    let (x, w1, b1, w2) = (&a[0], &a[1], &a[2], &a[3]);
    let h = x.matmul(w1)?.add(b1)?.relu()?;
    let y = h.matmul(w2)?.tanh()?;
    Ok(vec![y.mul(&y)?.mean_all()?, y.clone(), h.t()?])
}

fn run_training(f: &AotFunction, batch: usize) -> aotgrad::Result<Values> {
    let leaf = |t: Tensor| t.requires_grad(true);
    let inputs = vec![data(&[batch, 4], 1), leaf(data(&[4, 8], 2))?, leaf(data(&[8], 3))?, leaf(data(&[8, 3], 4))?];
    let (outs, pending) = f.forward(&inputs)?;
    let ones = Tensor::from_f64(&[1.0], &[], DType::F32)?;
    let zeros = |t: &Tensor| -> aotgrad::Result<Tensor> { Ok(Tensor::zeros(&t.sizes()?, DType::F32)?) };
    let grads = pending.backward(&[ones, zeros(&outs[1])?, zeros(&outs[2])?])?;
    let mut v: Values = outs.iter().map(|t| Ok(t.to_vec_f64()?)).collect::<aotgrad::Result<_>>()?;
    for g in grads.iter().flatten() {
        v.push(g.to_vec_f64()?);
    }
    Ok(v)
}

/// One kind of stored result.
struct Case {
    name: &'static str,
    make: fn(AotConfig) -> AotFunction,
    run: fn(&AotFunction) -> aotgrad::Result<Values>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "inference",
            make: |c| aot_function(inference, AotConfig { name: "inference".into(), ..c }).expect("aot"),
            run: run_inference,
        },
        Case {
            name: "training",
            make: |c| aot_function(training, AotConfig { name: "training".into(), ..c }).expect("aot"),
            run: |f| run_training(f, 5),
        },
        Case {
            name: "dynamic training",
            make: |c| {
                aot_function(training, AotConfig { name: "dynamic".into(), dynamic: vec![(0, 0)], ..c }).expect("aot")
            },
            run: |f| run_training(f, 6),
        },
    ]
}

/// A place in a stored result: a path of JSON keys and indices, and in which layer.
#[derive(Clone, Debug)]
enum Layer {
    /// The stored result itself (runtime metadata).
    Result,
    /// Artifact `which` (0: forward, 1: backward) decoded as a CPU artifact.
    Artifact(usize),
    /// That artifact's kernel plan.
    Plan(usize),
    /// A byte of that artifact's lowered program (private to the backend: bytes only).
    Lowered(usize),
}

#[derive(Clone, Debug)]
struct Mutation {
    layer: Layer,
    path: Vec<PathStep>,
    value: Value,
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

/// Every number and bool under `v` (byte strings and the packed graphs, which only
/// logs read, are left out), with the values to put there.
fn leaves(v: &Value, path: &mut Vec<PathStep>, out: &mut Vec<(Vec<PathStep>, Value)>) {
    match v {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                for w in [u.wrapping_add(1), u.saturating_sub(1), 0, 7, 1 << 31, (1 << 32) + 1, i64::MAX as u64] {
                    if w != u {
                        out.push((path.clone(), Value::from(w)));
                    }
                }
            } else if let Some(i) = n.as_i64() {
                for w in [i.wrapping_add(1), i.wrapping_sub(1), 0, i64::MIN, i64::MAX] {
                    if w != i {
                        out.push((path.clone(), Value::from(w)));
                    }
                }
            }
        }
        Value::Bool(b) => out.push((path.clone(), Value::Bool(!b))),
        Value::Array(items) => {
            // A byte string: not a field of its own.
            if items.len() > 16 && items.iter().all(|x| x.as_u64().is_some_and(|b| b < 256)) {
                return;
            }
            for (i, x) in items.iter().enumerate() {
                path.push(PathStep::Index(i));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Object(fields) => {
            for (k, x) in fields {
                if k == "graphs" || k == "graph" || k == "plan" || k == "lowered" || k == "Bundled" {
                    continue;
                }
                path.push(PathStep::Key(k.clone()));
                leaves(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        PathStep::Key(k) => &mut v[k.as_str()],
        PathStep::Index(i) => &mut v[*i],
    })
}

fn bundled(a: &StoredArtifact) -> &[u8] {
    match a {
        StoredArtifact::Bundled(b) => b,
        StoredArtifact::Referenced { .. } => panic!("a bundled cache stores its artifacts inside entries"),
    }
}

fn artifacts(r: &StoredResult) -> Vec<&StoredArtifact> {
    std::iter::once(&r.forward).chain(r.backward.as_ref()).collect()
}

fn cpu_artifact(bytes: &[u8]) -> CpuArtifact {
    codec::decode("cpu artifact", bytes).expect("a CPU artifact")
}

/// Every mutation of `r`'s fields.
fn mutations(r: &StoredResult) -> Vec<Mutation> {
    fn push(out: &mut Vec<Mutation>, layer: Layer, v: &Value) {
        let mut found = Vec::new();
        leaves(v, &mut Vec::new(), &mut found);
        out.extend(found.into_iter().map(|(path, value)| Mutation { layer: layer.clone(), path, value }));
    }
    let mut out = Vec::new();
    push(&mut out, Layer::Result, &serde_json::to_value(r).expect("json"));
    for (i, a) in artifacts(r).into_iter().enumerate() {
        let art = cpu_artifact(bundled(a));
        push(&mut out, Layer::Artifact(i), &serde_json::to_value(&art).expect("json"));
        if let Some(plan) = art.decode_plan().expect("plan") {
            push(&mut out, Layer::Plan(i), &serde_json::to_value(&plan).expect("json"));
        }
        for b in 0..art.lowered.len() {
            for x in [1u8, 0x80, 0xff] {
                out.push(Mutation {
                    layer: Layer::Lowered(i),
                    path: vec![PathStep::Index(b)],
                    value: Value::from(art.lowered[b] ^ x),
                });
            }
        }
    }
    out
}

/// `r` with `m` applied; `None` when the changed value does not fit the field's type.
fn apply(r: &StoredResult, m: &Mutation) -> Option<StoredResult> {
    let mut r = r.clone();
    fn slot(r: &mut StoredResult, i: usize) -> &mut Vec<u8> {
        let a = if i == 0 { &mut r.forward } else { r.backward.as_mut().expect("backward") };
        match a {
            StoredArtifact::Bundled(b) => b,
            StoredArtifact::Referenced { .. } => unreachable!("bundled"),
        }
    }
    match m.layer {
        Layer::Result => {
            let mut v = serde_json::to_value(&r).ok()?;
            *at(&mut v, &m.path) = m.value.clone();
            r = serde_json::from_value(v).ok()?;
        }
        Layer::Artifact(i) => {
            let mut v = serde_json::to_value(cpu_artifact(slot(&mut r, i))).ok()?;
            *at(&mut v, &m.path) = m.value.clone();
            let art: CpuArtifact = serde_json::from_value(v).ok()?;
            *slot(&mut r, i) = codec::encode("cpu artifact", &art).ok()?;
        }
        Layer::Plan(i) => {
            let mut art = cpu_artifact(slot(&mut r, i));
            let plan = art.decode_plan().ok()??;
            let mut v = serde_json::to_value(&plan).ok()?;
            *at(&mut v, &m.path) = m.value.clone();
            let plan: aotgrad_fusion::KernelPlan = serde_json::from_value(v).ok()?;
            art.plan = codec::encode("kernel plan", &plan).ok()?;
            *slot(&mut r, i) = codec::encode("cpu artifact", &art).ok()?;
        }
        Layer::Lowered(i) => {
            let mut art = cpu_artifact(slot(&mut r, i));
            let PathStep::Index(b) = m.path[0] else { unreachable!("a byte index") };
            art.lowered[b] = m.value.as_u64()? as u8;
            *slot(&mut r, i) = codec::encode("cpu artifact", &art).ok()?;
        }
    }
    Some(r)
}

/// A seeded sample of `n` of `all` (all of them with `AOTGRAD_FORGED_SAMPLE=all`).
fn sample<T: Clone>(all: &[T], seed: u64) -> Vec<T> {
    let n = match std::env::var("AOTGRAD_FORGED_SAMPLE") {
        Ok(v) if v == "all" => return all.to_vec(),
        Ok(v) => v.parse().expect("AOTGRAD_FORGED_SAMPLE is a count or `all`"),
        Err(_) => 60,
    };
    let mut s = seed;
    let mut idx: Vec<usize> = (0..all.len()).collect();
    // Fisher-Yates with a fixed LCG: the same sample every run.
    for i in (1..idx.len()).rev() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        idx.swap(i, (s >> 33) as usize % (i + 1));
    }
    idx.into_iter().take(n).map(|i| all[i].clone()).collect()
}

/// What one forged result did.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Rejected (and recompiled, or refused with a clear error).
    Rejected,
    /// Loaded and ran with the right values.
    Loaded,
    /// Loaded and ran with other values: a different valid program.
    LoadedOther,
    /// Loaded, and the call refused with a clear error: a forged symbolic kernel plan
    /// whose accesses overrun a buffer only at the call's sizes (checked when the plan
    /// is lowered for them), or a forged signature no call matches.
    RefusedAtCall,
}

/// Run `body` on its own thread: a panic or a hang is a failure naming `what`.
fn guarded<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: panicked: {msg}")
        }
        Err(_) => panic!("{what}: no answer in 120 s (a hang)"),
    }
}

fn entry_file(root: &Path) -> PathBuf {
    let mut out = Vec::new();
    for k in std::fs::read_dir(root.join("v1/entries")).expect("entries").filter_map(|e| e.ok()) {
        for e in std::fs::read_dir(k.path()).expect("key").filter_map(|e| e.ok()) {
            if e.path().extension().is_some_and(|x| x == "entry") {
                out.push(e.path());
            }
        }
    }
    assert_eq!(out.len(), 1, "one entry: {out:?}");
    out.pop().expect("entry")
}

fn tally(name: &str, outcomes: &[Outcome]) {
    let count = |o: Outcome| outcomes.iter().filter(|x| **x == o).count();
    eprintln!(
        "{name}: {} forged results: {} rejected, {} loaded with the right values, {} loaded as another valid \
         program, {} refused at the call",
        outcomes.len(),
        count(Outcome::Rejected),
        count(Outcome::Loaded),
        count(Outcome::LoadedOther),
        count(Outcome::RefusedAtCall)
    );
}

#[test]
fn forged_cache_entries_are_rejected_or_run_never_crash() {
    for (ci, case) in cases().into_iter().enumerate() {
        if std::env::var("AOTGRAD_FORGED_ONLY").is_ok_and(|only| only != case.name) {
            continue;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let config = AotConfig::default().cache(Arc::new(Cache::disk(dir.path())));
        let want = (case.run)(&(case.make)(config.clone())).expect("first run");
        let file = entry_file(dir.path());
        let good = std::fs::read(&file).expect("entry");
        let payload = envelope::open(&good, Kind::Entry, None, false).expect("valid").to_vec();
        let entry: StoredEntry = codec::decode("cache entry", &payload).expect("decodes");
        let all = mutations(&entry.result);
        let mut outcomes = Vec::new();
        for m in sample(&all, 0x5eed + ci as u64) {
            let Some(result) = apply(&entry.result, &m) else { continue };
            if result == entry.result {
                continue;
            }
            let forged = StoredEntry { key: entry.key.clone(), result };
            let bytes = codec::encode("cache entry", &forged).expect("encode");
            std::fs::write(&file, envelope::seal(Kind::Entry, &bytes, None)).expect("write");
            let what = format!("{}: {m:?}", case.name);
            if std::env::var_os("AOTGRAD_FORGED_VERBOSE").is_some() {
                eprintln!("{what}");
            }
            let (make, run, config) = (case.make, case.run, config.clone());
            let (values, stats) = guarded(&what, move || {
                let f = make(config);
                (run(&f), f.cache_stats())
            });
            let values = match values {
                Ok(v) => v,
                Err(e) => {
                    let e = e.to_string();
                    assert!(stats.hits == 1 && !e.contains("internal error"), "{what}: the call failed: {e}");
                    outcomes.push(Outcome::RefusedAtCall);
                    std::fs::write(&file, &good).expect("restore");
                    continue;
                }
            };
            outcomes.push(if stats.hits == 0 {
                // Rejected, or its forged guards or input metadata never accept a
                // call (a guard miss): either way compiled again.
                assert_eq!(values, want, "{what}: recompiled with other values");
                assert!(
                    stats.rejected + stats.guard_misses >= 1,
                    "{what}: a forged entry was neither loaded nor rejected: {stats:?}"
                );
                Outcome::Rejected
            } else if values == want {
                Outcome::Loaded
            } else {
                Outcome::LoadedOther
            });
            std::fs::write(&file, &good).expect("restore");
        }
        tally(case.name, &outcomes);
    }
}

#[test]
fn forged_precompiled_files_are_refused_or_run_never_crash() {
    for (ci, case) in cases().into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f.aotp");
        let f = (case.make)(AotConfig::default().no_cache());
        let want = (case.run)(&f).expect("first run");
        f.save_precompiled(&path).expect("save");
        let good = std::fs::read(&path).expect("read");
        let payload = envelope::open(&good, Kind::Precompiled, None, false).expect("valid").to_vec();
        let stored: Vec<StoredResult> = codec::decode("precompiled", &payload).expect("decodes");
        assert_eq!(stored.len(), 1);
        let all = mutations(&stored[0]);
        let mut outcomes = Vec::new();
        for m in sample(&all, 0xf11e + ci as u64) {
            let Some(result) = apply(&stored[0], &m) else { continue };
            if result == stored[0] {
                continue;
            }
            let bytes = codec::encode("precompiled", &vec![result]).expect("encode");
            std::fs::write(&path, envelope::seal(Kind::Precompiled, &bytes, None)).expect("write");
            let what = format!("{} (precompiled): {m:?}", case.name);
            let (run, p) = (case.run, path.clone());
            let outcome = guarded(&what, move || match AotFunction::load_precompiled(&p, AotConfig::default()) {
                Err(e) => Err(e.to_string()),
                Ok(f) => Ok(run(&f).map_err(|e| e.to_string())),
            });
            outcomes.push(match outcome {
                Err(e) => {
                    assert!(!e.contains("internal error"), "{what}: {e}");
                    assert!(e.contains("f.aotp"), "{what}: the error names the file: {e}");
                    Outcome::Rejected
                }
                Ok(Err(e)) => {
                    assert!(!e.contains("internal error"), "{what}: loaded, then the call failed: {e}");
                    Outcome::RefusedAtCall
                }
                Ok(Ok(v)) if v == want => Outcome::Loaded,
                Ok(Ok(_)) => Outcome::LoadedOther,
            });
        }
        tally(case.name, &outcomes);
    }
}

//! The compiled-result cache: round trips in a fresh process, keys, guards, every way
//! an entry can be damaged, concurrent processes, precompiled files.
//!
//! (Every inference and training contract test also round-trips its result through a
//! disk cache: see `inference/contract.rs` and `training/checker.rs`.)

use aotgrad::cache::{Cache, Flavour, StoredResult};
use aotgrad::ir::{Backend, Dim, Guard, Rel, SymId};
use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function, AotConfig, AotFunction, EntrySource};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

type Out = aotgrad::Result<Vec<Tensor>>;

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

/// A training step: two linear layers with GELU, a mean-square loss.
fn mlp(a: &[Tensor]) -> Out {
    let (x, w1, b1, w2) = (&a[0], &a[1], &a[2], &a[3]);
    let h = x.matmul(w1)?.add(b1)?.gelu()?;
    let y = h.matmul(w2)?;
    Ok(vec![y.mul(&y)?.mean_all()?, y])
}

/// Inference with an input mutation and an output viewing an input.
fn mutating(a: &[Tensor]) -> Out {
    let (x, y) = (&a[0], &a[1]);
    x.mul_(2.0)?;
    let t = x.t()?;
    Ok(vec![t.clone(), y.add(&t.sum(&[1], false)?)?])
}

fn mlp_inputs(batch: usize) -> Vec<Tensor> {
    let leaf = |t: Tensor| t.requires_grad(true).expect("float");
    vec![data(&[batch, 8], 1), leaf(data(&[8, 16], 2)), leaf(data(&[16], 3)), leaf(data(&[16, 4], 4))]
}

fn mutating_inputs() -> Vec<Tensor> {
    vec![data(&[3, 4], 5), data(&[4], 6)]
}

fn disk(dir: &Path) -> Arc<Cache> {
    Arc::new(Cache::disk(dir))
}

fn mlp_fn(config: AotConfig) -> AotFunction {
    aot_function(mlp, AotConfig { name: "mlp".into(), ..config }).expect("aot_function")
}

/// Run the MLP step: loss, output, and the gradients of the three weights.
fn run_mlp(f: &AotFunction, batch: usize) -> Vec<Vec<f64>> {
    let inputs = mlp_inputs(batch);
    let (outs, pending) = f.forward(&inputs).expect("forward");
    let ones = Tensor::from_f64(&[1.0], &[], DType::F32).expect("scalar");
    let zeros = Tensor::zeros(&outs[1].sizes().expect("sizes"), DType::F32).expect("zeros");
    let grads = pending.backward(&[ones, zeros]).expect("backward");
    let mut v: Vec<Vec<f64>> = outs.iter().map(|t| t.to_vec_f64().expect("values")).collect();
    v.extend(grads.iter().flatten().map(|g| g.to_vec_f64().expect("values")));
    v
}

fn run_mutating(f: &AotFunction) -> Vec<Vec<f64>> {
    let inputs = mutating_inputs();
    let outs = f.call(&inputs).expect("call");
    assert!(outs[0].shares_storage_with(&inputs[0]), "output 0 views input 0");
    let mut v: Vec<Vec<f64>> = outs.iter().map(|t| t.to_vec_f64().expect("values")).collect();
    v.push(inputs[0].to_vec_f64().expect("values"));
    v
}

fn only_hits(f: &AotFunction, hits: u64) {
    let s = f.cache_stats();
    assert_eq!((s.hits, s.misses, s.guard_misses, s.rejected), (hits, 0, 0, 0), "{s:?}");
    assert!(f.compile_reports().iter().all(|r| r.source == EntrySource::Cache), "{:?}", f.compile_reports());
}

/// Run this test binary again as a child process for `test` (an ignored test).
fn spawn_child(test: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--ignored", "--nocapture", "--test-threads", "1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child `{test}` failed:\n{text}");
    assert!(text.contains("1 passed"), "child `{test}` did not run:\n{text}");
    text
}

/// Values travel between processes as bit patterns (exact).
fn write_json(path: &Path, v: &[Vec<f64>]) {
    let bits: Vec<Vec<u64>> = v.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect();
    std::fs::write(path, serde_json::to_vec(&bits).expect("json")).expect("write");
}

fn read_json(path: &Path) -> Vec<Vec<f64>> {
    let bits: Vec<Vec<u64>> = serde_json::from_slice(&std::fs::read(path).expect("read")).expect("json");
    bits.iter().map(|r| r.iter().map(|&b| f64::from_bits(b)).collect()).collect()
}

#[test]
fn a_fresh_process_loads_every_result_and_compiles_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let train = mlp_fn(config.clone());
    let want_train = run_mlp(&train, 6);
    let infer = aot_function(mutating, config).expect("aot_function");
    let want_infer = run_mutating(&infer);
    assert_eq!(train.cache_stats().misses, 1);
    assert_eq!(infer.cache_stats().misses, 1);
    let out = dir.path().join("child.json");
    let log = spawn_child(
        "child_loads_from_the_cache",
        &[
            ("AOTGRAD_TEST_CHILD_CACHE", dir.path().to_str().expect("utf-8")),
            ("AOTGRAD_TEST_CHILD_OUT", out.to_str().expect("utf-8")),
        ],
    );
    let got = read_json(&out);
    let mut want = want_train;
    want.extend(want_infer);
    assert_eq!(got, want, "the child's values differ:\n{log}");
}

#[test]
#[ignore = "the child of a_fresh_process_loads_every_result_and_compiles_nothing"]
fn child_loads_from_the_cache() {
    let (Ok(dir), Ok(out)) = (std::env::var("AOTGRAD_TEST_CHILD_CACHE"), std::env::var("AOTGRAD_TEST_CHILD_OUT"))
    else {
        eprintln!("run by a_fresh_process_loads_every_result_and_compiles_nothing");
        return;
    };
    let config = AotConfig::default().cache(disk(Path::new(&dir)));
    let train = mlp_fn(config.clone());
    let mut got = run_mlp(&train, 6);
    only_hits(&train, 1);
    let infer = aot_function(mutating, config).expect("aot_function");
    got.extend(run_mutating(&infer));
    only_hits(&infer, 1);
    write_json(Path::new(&out), &got);
}

#[test]
fn renaming_arguments_and_moving_lines_keep_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let first = aot_function(|a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.sin()?]), config.clone()).expect("aot");
    let x = || vec![data(&[5], 1), data(&[5], 2)];
    let want = first.call(&x()).expect("call")[0].to_vec_f64().expect("values");
    // The same program on another source line, with named arguments.
    let named = AotConfig { arg_names: vec!["left".into(), "right".into()], name: "other".into(), ..config };
    let second = aot_function(
        |a: &[Tensor]| {
            let y = a[0].mul(&a[1])?;
            Ok(vec![y.sin()?])
        },
        named,
    )
    .expect("aot");
    assert_eq!(second.call(&x()).expect("call")[0].to_vec_f64().expect("values"), want);
    only_hits(&second, 1);
}

/// The miss reason of the second of two functions that differ in one ingredient.
fn miss_reason(
    a: AotConfig,
    b: AotConfig,
    f: fn(&[Tensor]) -> Out,
    g: fn(&[Tensor]) -> Out,
    grad: [bool; 2],
) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = disk(dir.path());
    let inputs = |grad: bool| {
        let x = data(&[4, 3], 1);
        vec![if grad { x.requires_grad(true).expect("float") } else { x }]
    };
    let first = aot_function(f, a.cache(cache.clone())).expect("aot");
    first.call(&inputs(grad[0])).expect("call");
    let second = aot_function(g, b.cache(cache)).expect("aot");
    second.call(&inputs(grad[1])).expect("call");
    let s = second.cache_stats();
    assert_eq!((s.hits, s.misses), (0, 1), "{s:?}");
    s.reasons.last().cloned().expect("a reason")
}

#[test]
fn changing_one_ingredient_misses_and_names_it() {
    let base = AotConfig::default;
    let f: fn(&[Tensor]) -> Out = |a| Ok(vec![a[0].exp()?.sum_all()?]);
    let g: fn(&[Tensor]) -> Out = |a| Ok(vec![a[0].exp()?.mean_all()?]);
    let cases: Vec<(&str, String)> = vec![
        ("graph", miss_reason(base(), base(), f, g, [false; 2])),
        ("simplify", miss_reason(base(), AotConfig { simplify: false, ..base() }, f, f, [true; 2])),
        (
            "partitioner",
            miss_reason(
                base(),
                AotConfig { partitioner: aotgrad::runtime::Partitioner::Default, ..base() },
                f,
                f,
                [true; 2],
            ),
        ),
        (
            "keep_inference_input_mutations",
            miss_reason(base(), AotConfig { keep_inference_input_mutations: true, ..base() }, f, f, [false; 2]),
        ),
        ("backend", miss_reason(base(), base().reference_backend(), f, f, [false; 2])),
        ("dynamic", miss_reason(base(), AotConfig { dynamic: vec![(0, 0)], ..base() }, f, f, [false; 2])),
        ("call signature", miss_reason(base(), base(), f, f, [false, true])),
    ];
    for (ingredient, reason) in cases {
        assert!(reason.contains("differs in:") && reason.contains(ingredient), "{ingredient}: {reason}");
    }
    // Another decomposition table is another key, even for a program it leaves alone.
    let kept = AotConfig { decomps: aotgrad::trace::DecompTable::keep_all(), ..base() };
    let reason = miss_reason(base(), kept, f, f, [false; 2]);
    assert!(reason.ends_with("differs in: decompositions"), "{reason}");
}

#[test]
fn a_symbolic_batch_is_hit_for_other_batches_and_guards_are_checked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = disk(dir.path());
    let config = AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() }.cache(cache.clone());
    let first = mlp_fn(config.clone());
    run_mlp(&first, 4);
    // Another batch in a new function: the same key, the guards hold.
    let second = mlp_fn(config.clone());
    let got = run_mlp(&second, 7);
    only_hits(&second, 1);
    let fresh = run_mlp(&mlp_fn(AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() }.no_cache()), 7);
    assert_eq!(got, fresh);
    // Make the stored entry's guards exclude batch 7 (`s0 <= 5`; the tracer itself
    // never records guards that leave the graph unchanged): a guard miss, a compile,
    // and a second entry beside the first under the same key.
    let keys = cache.list().expect("list");
    let key_hex = keys.iter().find(|b| !b.id.is_empty()).expect("an entry").key.clone();
    let entry_path = dir.path().join("v1/entries").join(&key_hex);
    let file = std::fs::read_dir(&entry_path)
        .expect("key dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "entry"))
        .expect("entry file");
    let entry = cache.decode_entry(&std::fs::read(&file).expect("read")).expect("valid");
    let mut stored: StoredResult = entry.result;
    let s0 = stored.meta.input_metas[0].shape[0].clone();
    assert_eq!(s0, Dim::sym(SymId(0)));
    stored.meta.guards.push(Guard::new(s0, Rel::Le, Dim::Const(5), true));
    std::fs::remove_file(&file).expect("remove");
    let narrowed = cache.instantiate::<aotgrad::cpu::CpuTensor>(stored).expect("instantiate");
    cache.insert(&entry.key, &narrowed).expect("insert");
    let third = mlp_fn(config.clone());
    assert_eq!(run_mlp(&third, 7), fresh);
    let s = third.cache_stats();
    assert_eq!((s.hits, s.guard_misses, s.misses), (0, 1, 0), "{s:?}");
    assert!(s.reasons[0].contains("guard miss"), "{s:?}");
    // Batch 3 satisfies the narrowed guards; batch 7 now has its own entry.
    let fourth = mlp_fn(config);
    run_mlp(&fourth, 3);
    run_mlp(&fourth, 7);
    only_hits(&fourth, 2);
    let entries = cache.list().expect("list").into_iter().filter(|b| b.key == key_hex).count();
    assert_eq!(entries, 2);
}

/// Damage the only stored entry with `damage`; a new function must reject it, compile,
/// give the right values, and leave a valid entry that the next function hits.
fn survives(damage: impl Fn(&Path)) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let want = run_mutating(&aot_function(mutating, config.clone()).expect("aot"));
    let entries = dir.path().join("v1/entries");
    let key_dir = std::fs::read_dir(&entries).expect("entries").next().expect("a key").expect("entry").path();
    let file = std::fs::read_dir(&key_dir)
        .expect("key dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "entry"))
        .expect("entry file");
    damage(&file);
    let second = aot_function(mutating, config.clone()).expect("aot");
    assert_eq!(run_mutating(&second), want);
    let s = second.cache_stats();
    assert_eq!((s.hits, s.rejected, s.misses), (0, 1, 1), "{s:?}");
    assert!(s.reasons[1].contains("is stored, but its 1 entry could not be used"), "{s:?}");
    let third = aot_function(mutating, config).expect("aot");
    assert_eq!(run_mutating(&third), want);
    only_hits(&third, 1);
}

#[test]
fn a_damaged_entry_is_rejected_and_replaced() {
    survives(|p| {
        let b = std::fs::read(p).expect("read");
        std::fs::write(p, &b[..b.len() / 2]).expect("truncate");
    });
    survives(|p| std::fs::write(p, b"").expect("empty"));
    survives(|p| {
        std::fs::remove_file(p).expect("remove");
        std::fs::create_dir(p).expect("a directory in its place");
    });
    survives(|p| {
        let mut b = std::fs::read(p).expect("read");
        b[8] ^= 0x40; // the format version
        std::fs::write(p, b).expect("write");
    });
    survives(|p| std::fs::write(p, b"not an aotgrad file at all, but long enough for a header....").expect("write"));
    // A foreign entry: a valid entry of another program copied over this one.
    survives(|p| {
        let other = tempfile::tempdir().expect("temp dir");
        let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].neg()?]), AotConfig::default().cache(disk(other.path())))
            .expect("aot");
        f.call(&[data(&[2], 1)]).expect("call");
        let blob = aotgrad_cache_files(other.path()).pop().expect("an entry");
        std::fs::copy(blob, p).expect("copy");
    });
}

#[test]
fn every_flipped_byte_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let want = run_mutating(&aot_function(mutating, config.clone()).expect("aot"));
    let file = aotgrad_cache_files(dir.path()).pop().expect("an entry");
    let good = std::fs::read(&file).expect("read");
    let cache = Cache::disk(dir.path());
    // Every byte position (with a stride on long entries), each bit pattern once.
    let step = (good.len() / 509).max(1);
    for i in (0..good.len()).step_by(step) {
        let mut bad = good.clone();
        bad[i] ^= 1 << (i % 8);
        assert!(cache.decode_entry(&bad).is_err(), "flipping byte {i} went unnoticed");
    }
    std::fs::write(&file, {
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        bad
    })
    .expect("write");
    let second = aot_function(mutating, config).expect("aot");
    assert_eq!(run_mutating(&second), want);
    assert_eq!(second.cache_stats().rejected, 1);
}

fn aotgrad_cache_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(keys) = std::fs::read_dir(root.join("v1/entries")) else { return out };
    for k in keys.filter_map(|e| e.ok()) {
        for e in std::fs::read_dir(k.path()).into_iter().flatten().filter_map(|e| e.ok()) {
            if e.path().extension().is_some_and(|x| x == "entry") {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_signed_cache_refuses_entries_written_without_its_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let unsigned = AotConfig::default().cache(disk(dir.path()));
    let want = run_mutating(&aot_function(mutating, unsigned.clone()).expect("aot"));
    let signed = |secret: &str| AotConfig::default().cache(Arc::new(Cache::disk(dir.path()).signed(secret.as_bytes())));
    // The unsigned entry is not used (nor removed): key "alpha" compiles and stores
    // its own beside it.
    let a = aot_function(mutating, signed("alpha")).expect("aot");
    assert_eq!(run_mutating(&a), want);
    let s = a.cache_stats();
    assert_eq!((s.hits, s.rejected, s.skipped, s.misses), (0, 0, 1, 1), "{s:?}");
    assert!(s.reasons[0].contains("written without a cache key"), "{s:?}");
    assert!(s.reasons[1].contains("holds only entries written with another cache key"), "{s:?}");
    assert_eq!(aotgrad_cache_files(dir.path()).len(), 2);
    // Another key neither uses nor replaces alpha's entry: it stores a third.
    let b = aot_function(mutating, signed("beta")).expect("aot");
    assert_eq!(run_mutating(&b), want);
    let s = b.cache_stats();
    assert_eq!((s.hits, s.rejected, s.skipped), (0, 0, 2), "{s:?}");
    assert_eq!(aotgrad_cache_files(dir.path()).len(), 3);
    // Each process hits its own entry, and the unsigned one still hits its own.
    for config in [signed("beta"), signed("alpha"), unsigned] {
        let c = aot_function(mutating, config).expect("aot");
        assert_eq!(run_mutating(&c), want);
        assert_eq!(c.cache_stats().hits, 1, "{:?}", c.cache_stats());
    }
    // A forged entry under alpha's id (an unsigned blob, or one signed with another
    // key) is alpha's to judge: rejected and replaced.
    let alpha_entry = aotgrad_cache_files(dir.path())
        .into_iter()
        .find(|p| {
            let b = std::fs::read(p).expect("read");
            aotgrad::cache::envelope::is_signed(&b) && Cache::disk(dir.path()).signed(b"alpha").decode_entry(&b).is_ok()
        })
        .expect("alpha's entry");
    let unsigned_blob = aotgrad_cache_files(dir.path())
        .into_iter()
        .map(|p| std::fs::read(p).expect("read"))
        .find(|b| !aotgrad::cache::envelope::is_signed(b))
        .expect("the unsigned entry");
    std::fs::write(&alpha_entry, unsigned_blob).expect("forge");
    let d = aot_function(mutating, signed("alpha")).expect("aot");
    assert_eq!(run_mutating(&d), want);
    let s = d.cache_stats();
    assert_eq!((s.hits, s.rejected), (0, 1), "{s:?}");
    assert!(s.reasons.iter().any(|r| r.contains("not signed")), "{s:?}");
    let e = aot_function(mutating, signed("alpha")).expect("aot");
    assert_eq!(run_mutating(&e), want);
    only_hits(&e, 1);
}

#[test]
fn referencing_entries_share_artifacts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(Cache::disk(dir.path()).flavour(Flavour::Referencing));
    let config = AotConfig::default().cache(cache.clone());
    let want = run_mlp(&mlp_fn(config.clone()), 5);
    let blobs = cache.list().expect("list");
    let artifacts = blobs.iter().filter(|b| b.id.is_empty()).count();
    assert_eq!(artifacts, 2, "forward and backward artifacts: {blobs:?}");
    let loaded = mlp_fn(config.clone());
    assert_eq!(run_mlp(&loaded, 5), want);
    only_hits(&loaded, 1);
    // An evicted artifact is a rejected entry and a recompile, not an error.
    for b in &blobs {
        if b.id.is_empty() {
            std::fs::remove_file(dir.path().join("v1/artifacts").join(format!("{}.artifact", b.key))).expect("rm");
        }
    }
    let again = mlp_fn(config);
    assert_eq!(run_mlp(&again, 5), want);
    assert_eq!(again.cache_stats().rejected, 1, "{:?}", again.cache_stats());
}

#[test]
fn the_size_limit_evicts_the_least_recently_used() {
    let inputs = |n: usize| [data(&[n, 4], 1), data(&[4], 2)];
    // The size of one entry, from a cache without a limit.
    let probe = tempfile::tempdir().expect("temp dir");
    let unlimited = disk(probe.path());
    aot_function(mutating, AotConfig::default().cache(unlimited.clone())).expect("aot").call(&inputs(1)).expect("call");
    let one = unlimited.list().expect("list")[0].bytes;
    // A cache that holds two such entries, not three.
    let dir = tempfile::tempdir().expect("temp dir");
    let small = Arc::new(Cache::new(Box::new(aotgrad::cache::DiskStore::new(dir.path(), one * 5 / 2))));
    let config = AotConfig::default().cache(small.clone());
    let call = |n: usize| {
        let f = aot_function(mutating, config.clone()).expect("aot");
        f.call(&inputs(n)).expect("call");
        f.cache_stats()
    };
    call(1);
    call(2);
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Using batch 1 again makes batch 2's entry the least recently used one.
    assert_eq!(call(1).hits, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    call(3);
    assert_eq!(small.list().expect("list").len(), 2, "{:?}", small.list());
    assert_eq!(call(1).hits, 1, "the entry used recently stays");
    assert_eq!(call(3).hits, 1, "the newest entry stays");
    assert_eq!(call(2).misses, 1, "the least recently used entry was evicted");
}

#[test]
fn a_corrupt_referenced_artifact_is_removed_and_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(Cache::disk(dir.path()).flavour(Flavour::Referencing));
    let config = AotConfig::default().cache(cache.clone());
    let want = run_mlp(&mlp_fn(config.clone()), 5);
    let artifacts = dir.path().join("v1/artifacts");
    for e in std::fs::read_dir(&artifacts).expect("artifacts").filter_map(|e| e.ok()) {
        let mut b = std::fs::read(e.path()).expect("read");
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(e.path(), b).expect("write");
    }
    let second = mlp_fn(config.clone());
    assert_eq!(run_mlp(&second, 5), want);
    let s = second.cache_stats();
    assert_eq!((s.hits, s.rejected), (0, 1), "{s:?}");
    assert!(s.reasons[0].contains("checksum"), "{s:?}");
    // The bad copy was removed and the recompile wrote a good one: the next load hits.
    let third = mlp_fn(config);
    assert_eq!(run_mlp(&third, 5), want);
    only_hits(&third, 1);
}

#[test]
fn a_cache_without_the_key_leaves_signed_entries_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let signed = Arc::new(Cache::disk(dir.path()).signed(b"team secret"));
    let want = run_mutating(&aot_function(mutating, AotConfig::default().cache(signed.clone())).expect("aot"));
    let before = aotgrad_cache_files(dir.path());
    // A tool or program without the key cannot check the entry; it must not delete it.
    let unsigned = Cache::disk(dir.path());
    let key = unsigned.list().expect("list")[0].key.clone();
    let keys = aotgrad::cache::Store::keys(&aotgrad::cache::DiskStore::new(dir.path(), u64::MAX)).expect("keys");
    let found = unsigned.lookup(keys.iter().find(|k| k.hex == key).expect("the key"));
    assert!(found.candidates.is_empty() && found.rejected.is_empty());
    assert!(found.skipped[0].contains("left in place"), "{:?}", found.skipped);
    assert_eq!(aotgrad_cache_files(dir.path()), before);
    // A program without the key misses, compiles, and still leaves the entry alone.
    let keyless = aot_function(mutating, AotConfig::default().cache(Arc::new(unsigned))).expect("aot");
    assert_eq!(run_mutating(&keyless), want);
    let s = keyless.cache_stats();
    assert_eq!((s.hits, s.misses, s.write_errors), (0, 1, 0), "{s:?}");
    let blobs: Vec<Vec<u8>> = before.iter().map(|p| std::fs::read(p).expect("read")).collect();
    assert!(blobs.iter().all(|b| aotgrad::cache::envelope::is_signed(b)), "still the signed entry");
    let f = aot_function(mutating, AotConfig::default().cache(signed)).expect("aot");
    assert_eq!(run_mutating(&f), want);
    only_hits(&f, 1);
}

/// The compiled CPU backend under another name that declares no cache identity (as a
/// user's backend does by default).
struct NoIdentity(aotgrad::cpu::CpuBackend);

impl Backend<aotgrad::cpu::CpuTensor> for NoIdentity {
    fn name(&self) -> &str {
        "no-identity"
    }
    fn compile(
        &self,
        graph: &aotgrad::ir::Graph,
    ) -> Result<Box<dyn aotgrad::ir::CompiledGraph<aotgrad::cpu::CpuTensor>>, aotgrad::ir::BackendError> {
        self.0.compile(graph)
    }
    fn deserialize(
        &self,
        bytes: &[u8],
    ) -> Result<Box<dyn aotgrad::ir::CompiledGraph<aotgrad::cpu::CpuTensor>>, aotgrad::ir::BackendError> {
        self.0.deserialize(bytes)
    }
}

#[test]
fn a_backend_without_a_cache_identity_neither_saves_nor_loads_precompiled_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("f.aotp");
    let plain = AotConfig::default().no_cache();
    let other = AotConfig { backend: Arc::new(NoIdentity(aotgrad::cpu::CpuBackend::new(1))), ..plain.clone() };
    let f = aot_function(mutating, other.clone()).expect("aot");
    run_mutating(&f);
    let err = f.save_precompiled(&path).expect_err("no identity");
    assert!(err.to_string().contains("declares no cache identity"), "{err}");
    assert!(!path.exists());
    // A file from a backend with an identity is not loaded into one without.
    let g = aot_function(mutating, plain).expect("aot");
    run_mutating(&g);
    g.save_precompiled(&path).expect("save");
    let err = AotFunction::load_precompiled(&path, other).err().expect("no identity");
    assert!(err.to_string().contains("declares no cache identity"), "{err}");
}

#[test]
fn several_processes_hammering_one_cache_lose_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let children: Vec<_> = (0..4)
        .map(|i| {
            let exe = std::env::current_exe().expect("test binary");
            Command::new(exe)
                .args(["--exact", "child_hammers_the_cache", "--ignored", "--test-threads", "1"])
                .env("AOTGRAD_TEST_CHILD_CACHE", dir.path())
                .env("AOTGRAD_TEST_CHILD_SEED", i.to_string())
                .output()
        })
        .map(|o| std::thread::spawn(move || o))
        .collect();
    for c in children {
        let out = c.join().expect("thread").expect("spawn");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cache = Cache::disk(dir.path());
    let files = aotgrad_cache_files(dir.path());
    assert_eq!(files.len(), 3, "one entry per program: {files:?}");
    for f in files {
        cache.decode_entry(&std::fs::read(&f).expect("read")).expect("every entry is valid");
    }
}

#[test]
#[ignore = "a child of several_processes_hammering_one_cache_lose_nothing"]
fn child_hammers_the_cache() {
    let Ok(dir) = std::env::var("AOTGRAD_TEST_CHILD_CACHE") else {
        eprintln!("run by several_processes_hammering_one_cache_lose_nothing");
        return;
    };
    let config = AotConfig::default().cache(disk(Path::new(&dir)));
    for round in 0..6 {
        for batch in [2usize, 3, 4] {
            let f = aot_function(mutating, config.clone()).expect("aot");
            let got = f.call(&[data(&[batch, 4], round), data(&[4], 2)]).expect("call");
            let fresh = aot_function(mutating, AotConfig::default().no_cache()).expect("aot");
            let want = fresh.call(&[data(&[batch, 4], round), data(&[4], 2)]).expect("call");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.to_vec_f64().expect("values"), w.to_vec_f64().expect("values"));
            }
        }
    }
}

#[test]
fn a_precompiled_function_runs_in_another_process_without_the_user_function() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("mlp.aotp");
    let f = mlp_fn(AotConfig::default().no_cache());
    let want = run_mlp(&f, 6);
    f.save_precompiled(&path).expect("save");
    let out = dir.path().join("child.json");
    spawn_child(
        "child_runs_a_precompiled_function",
        &[
            ("AOTGRAD_TEST_CHILD_FILE", path.to_str().expect("utf-8")),
            ("AOTGRAD_TEST_CHILD_OUT", out.to_str().expect("utf-8")),
        ],
    );
    assert_eq!(read_json(&out), want);
    // Another backend is a clear error, and so is a damaged file.
    let err = AotFunction::load_precompiled(&path, AotConfig::default().reference_backend()).err().expect("mismatch");
    assert!(err.to_string().contains("was compiled by"), "{err}");
    let mut bytes = std::fs::read(&path).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&path, bytes).expect("write");
    let err = AotFunction::load_precompiled(&path, AotConfig::default()).err().expect("corrupt");
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
#[ignore = "the child of a_precompiled_function_runs_in_another_process_without_the_user_function"]
fn child_runs_a_precompiled_function() {
    let (Ok(file), Ok(out)) = (std::env::var("AOTGRAD_TEST_CHILD_FILE"), std::env::var("AOTGRAD_TEST_CHILD_OUT"))
    else {
        eprintln!("run by a_precompiled_function_runs_in_another_process_without_the_user_function");
        return;
    };
    let f = AotFunction::load_precompiled(&file, AotConfig::default()).expect("load");
    write_json(Path::new(&out), &run_mlp(&f, 6));
    assert_eq!(f.compile_reports()[0].source, EntrySource::Precompiled);
    // A call no saved specialization accepts: there is nothing to trace.
    let err = f.forward(&mlp_inputs(9)).err().expect("no specialization for batch 9");
    assert!(err.to_string().contains("precompiled"), "{err}");
}

#[test]
fn no_cache_configured_means_no_files_and_no_counts() {
    let f = aot_function(mutating, AotConfig::default().no_cache()).expect("aot");
    run_mutating(&f);
    assert_eq!(f.cache_stats(), aotgrad::CacheStats::default());
    assert_eq!(f.compile_reports()[0].source, EntrySource::Compiled);
}

mod decoder {
    use super::*;
    use proptest::prelude::*;

    fn real_entry() -> &'static [u8] {
        static ENTRY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        ENTRY.get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            run_mlp(&mlp_fn(AotConfig::default().cache(disk(dir.path()))), 3);
            std::fs::read(aotgrad_cache_files(dir.path()).pop().expect("an entry")).expect("read")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random bytes, and real entries with random bytes overwritten, cut or
        /// appended: the decoder returns an error or a valid entry, never panics.
        #[test]
        fn never_panics(
            noise in proptest::collection::vec(any::<u8>(), 0..300),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let cache = Cache::disk(std::env::temp_dir().join("aotgrad-never-written"));
            let _ = cache.decode_entry(&noise);
            let mut bytes = real_entry().to_vec();
            for (at, v) in &edits {
                let i = at.index(bytes.len());
                bytes[i] = *v;
            }
            let _ = cache.decode_entry(&bytes);
            let _ = cache.decode_entry(&bytes[..cut.index(bytes.len())]);
            bytes.extend_from_slice(&noise);
            let _ = cache.decode_entry(&bytes);
            // Past the checksum, the payload decoder itself: bytes with a valid frame.
            let sealed = aotgrad::cache::envelope::seal(aotgrad::cache::envelope::Kind::Entry, &noise, None);
            prop_assert!(cache.decode_entry(&sealed).is_err());
        }
    }
}

#[test]
fn an_unsigned_entry_whose_signed_flag_flipped_is_replaced() {
    // The flag is covered by the checksum: flipped, the entry is one a keyless cache
    // cannot check. It is still the keyless cache's own (its id says so), so it is
    // rejected and replaced, not skipped forever.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let want = run_mutating(&aot_function(mutating, config.clone()).expect("aot"));
    let file = aotgrad_cache_files(dir.path()).pop().expect("an entry");
    let mut b = std::fs::read(&file).expect("read");
    b[13] = 1;
    std::fs::write(&file, b).expect("write");
    let second = aot_function(mutating, config.clone()).expect("aot");
    assert_eq!(run_mutating(&second), want);
    let s = second.cache_stats();
    assert_eq!((s.hits, s.rejected, s.skipped), (0, 1, 0), "{s:?}");
    assert!(s.reasons[0].contains("signed with a cache key, and none is configured"), "{s:?}");
    let third = aot_function(mutating, config).expect("aot");
    assert_eq!(run_mutating(&third), want);
    only_hits(&third, 1);
}

#[test]
fn precompiled_files_are_signed_with_the_cache_key_and_checked_with_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (signed, unsigned) = (dir.path().join("signed.aotp"), dir.path().join("unsigned.aotp"));
    let f = mlp_fn(AotConfig::default().no_cache());
    let want = run_mlp(&f, 6);
    f.save_precompiled(&unsigned).expect("save");
    let out = dir.path().join("child.json");
    let child = |mode: &str, key: &str| {
        spawn_child(
            "child_signs_and_checks_precompiled_files",
            &[
                ("AOTGRAD_TEST_CHILD_MODE", mode),
                ("AOTGRAD_CACHE_KEY", key),
                ("AOTGRAD_TEST_CHILD_FILE", signed.to_str().expect("utf-8")),
                ("AOTGRAD_TEST_CHILD_UNSIGNED", unsigned.to_str().expect("utf-8")),
                ("AOTGRAD_TEST_CHILD_OUT", out.to_str().expect("utf-8")),
            ],
        )
    };
    // Saved with a key: signed; loaded with the key: runs.
    child("save", "fleet secret");
    assert!(aotgrad::cache::envelope::is_signed(&std::fs::read(&signed).expect("read")));
    child("load", "fleet secret");
    assert_eq!(read_json(&out), want);
    // Without the key it cannot be checked: refused, as is a file signed with another.
    let err = AotFunction::load_precompiled(&signed, AotConfig::default()).err().expect("no key");
    assert!(err.to_string().contains("set AOTGRAD_CACHE_KEY"), "{err}");
    child("refuse", "another secret");
}

#[test]
#[ignore = "the child of precompiled_files_are_signed_with_the_cache_key_and_checked_with_it"]
fn child_signs_and_checks_precompiled_files() {
    let (Ok(mode), Ok(file), Ok(unsigned), Ok(out)) = (
        std::env::var("AOTGRAD_TEST_CHILD_MODE"),
        std::env::var("AOTGRAD_TEST_CHILD_FILE"),
        std::env::var("AOTGRAD_TEST_CHILD_UNSIGNED"),
        std::env::var("AOTGRAD_TEST_CHILD_OUT"),
    ) else {
        eprintln!("run by precompiled_files_are_signed_with_the_cache_key_and_checked_with_it");
        return;
    };
    match mode.as_str() {
        "save" => {
            let f = mlp_fn(AotConfig::default().no_cache());
            run_mlp(&f, 6);
            f.save_precompiled(&file).expect("save");
        }
        "load" => {
            let f = AotFunction::load_precompiled(&file, AotConfig::default()).expect("load");
            write_json(Path::new(&out), &run_mlp(&f, 6));
            // With a key, an unsigned file is refused (anyone could have written it).
            let err = AotFunction::load_precompiled(&unsigned, AotConfig::default()).err().expect("unsigned");
            assert!(err.to_string().contains("not signed"), "{err}");
        }
        _ => {
            let err = AotFunction::load_precompiled(&file, AotConfig::default()).err().expect("another key");
            assert!(err.to_string().contains("MAC mismatch"), "{err}");
        }
    }
}

#[test]
fn outputs_that_alias_each_other_round_trip_through_the_cache() {
    // `[NonAlias, AliasOfOutput(0), SameAs(1)]`: a view of an output, returned twice.
    fn f(a: &[Tensor]) -> Out {
        let y = a[0].exp()?;
        let v = y.view(&[6])?;
        Ok(vec![y, v.clone(), v])
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AotConfig::default().cache(disk(dir.path()));
    let x = data(&[2, 3], 7);
    let run = |g: &AotFunction| -> Vec<Vec<f64>> {
        let outs = g.call(std::slice::from_ref(&x)).expect("call");
        assert!(outs[1].shares_storage_with(&outs[0]) && outs[2].shares_storage_with(&outs[1]));
        outs.iter().map(|t| t.to_vec_f64().expect("values")).collect()
    };
    let want = run(&aot_function(f, config.clone()).expect("aot"));
    let loaded = aot_function(f, config).expect("aot");
    assert_eq!(run(&loaded), want);
    only_hits(&loaded, 1);
}

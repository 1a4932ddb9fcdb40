//! The semantics-contract checker: runs a user function eagerly and through
//! `aot_function_args` on identical, freshly built inputs and checks everything
//! DESIGN.md's "Semantics contract" promises for the inference path:
//!
//! (a) outputs equal eager's: values, shape, dtype, strides, storage offset;
//! (b) every input afterwards holds what eager left: values, metadata, and the whole
//!     underlying storage (untouched elements of a larger base included);
//! (c) aliasing: `shares_storage_with` and `same_object` agree with eager for every
//!     (output, input) and (output, output) pair;
//! (d) adding 1 to each float output in turn (under no-grad) leaves inputs and other
//!     outputs in identical states in both worlds;
//! (e) the functional graph passes `verify_functional` (no in-place op but the
//!     trailing `copy_`s of keep mode) and round-trips through the text format.
//!
//! The compiled function is called twice on fresh inputs: the first call compiles,
//! the second must reuse the entry; both calls are checked. The first compile also
//! stores its result in a fresh disk cache, and a second compiled function (no
//! in-memory entry) must load it from there, compile nothing, and satisfy the same
//! contract (the cache round trip of every contract test).

use crate::worlds::compare_worlds;
use aotgrad::functionalize::{verify_functional, Functionalized};
use aotgrad::ir::text::{parse_graph, print_graph};
use aotgrad::ir::{StaticOracle, TensorMeta};
use aotgrad::meta::{ArgSlot, OutputKind};
use aotgrad::trace::{DType, NoGradGuard, Tensor};
use aotgrad::{aot_function_args, AotConfig, AotFunction, Arg};
use std::fmt::Write as _;
use std::sync::Arc;

/// A user function over [`Arg`]s.
pub type UserFn = Arc<dyn Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync>;

/// What a successful check returns.
pub struct Checked {
    /// The functional graph and the metadata, printed for golden comparison.
    pub text: String,
    /// The compiled function (for further calls).
    pub compiled: AotFunction,
}

/// The outcome of [`try_check`] when the contract holds.
pub enum Outcome {
    /// Both worlds ran and agree.
    Agree(Box<Checked>),
    /// Eager rejected the program, and so did the compiled function.
    BothFailed {
        /// Eager's error.
        eager: String,
        /// The compiled function's error.
        compiled: String,
    },
}

/// The tensor of an argument (tests pass tensors where they say so).
pub fn tensor(a: &Arg) -> aotgrad::Result<&Tensor> {
    a.tensor().ok_or_else(|| aotgrad::Error::Internal("argument is not a tensor".into()))
}

/// Whether a test about f64 values must skip: the default backend is wgpu
/// (`AOTGRAD_BACKEND=wgpu`), which has no f64 (WGSL has none; such graphs are a clear
/// error, tested in `aotgrad-wgpu`). Says so on stderr.
pub fn skip_f64_on_wgpu(test: &str) -> bool {
    let wgpu = aotgrad::default_backend().0.name() == "wgpu";
    if wgpu {
        eprintln!("{test}: skipped on the wgpu backend, which has no f64 values");
    }
    wgpu
}

/// An f32 tensor holding `start, start+1, ...` in row-major order.
pub fn seq(shape: &[usize], start: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| start + i as f64).collect();
    Tensor::from_f64(&data, shape, DType::F32).expect("valid data")
}

/// Check the whole contract; panics with a description of the first violation.
pub fn check<F, I>(f: F, inputs: I, config: AotConfig) -> Checked
where
    F: Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static,
    I: Fn() -> Vec<Arg>,
{
    match try_check(Arc::new(f), &inputs, config) {
        Ok(Outcome::Agree(c)) => *c,
        Ok(Outcome::BothFailed { eager, compiled }) => {
            panic!("the program fails in both worlds:\n  eager: {eager}\n  compiled: {compiled}")
        }
        Err(violation) => panic!("contract violated: {violation}"),
    }
}

/// Check the whole contract; `Err` describes the first violation.
pub fn try_check(f: UserFn, inputs: &dyn Fn() -> Vec<Arg>, config: AotConfig) -> Result<Outcome, String> {
    let keep = config.keep_inference_input_mutations;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let config = config.cache(Arc::new(aotgrad::Cache::disk(dir.path())));
    let ff = f.clone();
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), config.clone()).map_err(|e| e.to_string())?;
    // Compiled, twice: compile + cached call.
    for call in 0..2 {
        match agree(&compiled, &f, inputs, call == 1).map_err(|e| format!("call {call}: {e}"))? {
            Some(failed) => return Ok(failed),
            None if compiled.num_compiled() != 1 => {
                return Err(format!("call {call}: {} entries compiled for one input pattern", compiled.num_compiled()))
            }
            None => {}
        }
    }
    let fz = compiled.functionalized();
    let fz = fz.last().ok_or("no functionalized graph")?;
    check_graph(fz, keep)?;
    let text = describe(fz);
    // The cache round trip: a new function finds the stored result and compiles nothing.
    let ff = f.clone();
    let loaded = aot_function_args(move |a: &[Arg]| ff(a), config).map_err(|e| e.to_string())?;
    if let Some(Outcome::BothFailed { compiled, .. }) =
        agree(&loaded, &f, inputs, true).map_err(|e| format!("loaded from the cache: {e}"))?
    {
        return Err(format!("the call succeeded when compiled, but fails when loaded from the cache: {compiled}"));
    }
    check_loaded(&loaded)?;
    let loaded_fz = loaded.functionalized();
    if loaded_fz.last().map(describe) != Some(text.clone()) {
        return Err("the loaded result's functional graph or metadata differ from the compiled one".into());
    }
    Ok(Outcome::Agree(Box::new(Checked { text, compiled })))
}

/// A function whose only entry was loaded from the cache: one hit, nothing compiled.
pub fn check_loaded(loaded: &AotFunction) -> Result<(), String> {
    let stats = loaded.cache_stats();
    let reports = loaded.compile_reports();
    if stats.hits != 1
        || stats.misses + stats.guard_misses + stats.rejected != 0
        || reports.len() != 1
        || reports[0].source != aotgrad::runtime::EntrySource::Cache
    {
        return Err(format!("expected one cache hit and no compilation, got {stats:?} and {reports:?}"));
    }
    Ok(())
}

/// Call `compiled` and `f` (eagerly) on fresh inputs each and check (a)-(c), and (d)
/// when `mutate` is set. `Ok(Some(BothFailed))` when both reject the call.
pub fn agree(
    compiled: &AotFunction,
    f: &UserFn,
    inputs: &dyn Fn() -> Vec<Arg>,
    mutate: bool,
) -> Result<Option<Outcome>, String> {
    let needs_no_grad = inputs().iter().filter_map(Arg::tensor).any(Tensor::is_requires_grad);
    let _guard = needs_no_grad.then(NoGradGuard::new);
    let (eager_in, comp_in) = (inputs(), inputs());
    let (eager_out, comp_out) = match (f(&eager_in), compiled.call_args(&comp_in)) {
        (Ok(e), Ok(c)) => (e, c),
        (Err(e), Err(c)) => {
            rejects_like_eager(&e, &c)?;
            return Ok(Some(Outcome::BothFailed { eager: e.to_string(), compiled: c.to_string() }));
        }
        (Err(e), Ok(_)) => return Err(format!("eager fails ({e}) but the compiled function succeeds")),
        (Ok(_), Err(e)) => {
            let graph = compiled.functionalized().last().map(describe).unwrap_or_default();
            return Err(format!("compiled function fails: {e}\n{graph}"));
        }
    };
    compare_worlds("", &same_state, &eager_in, &eager_out, &comp_in, &comp_out)?;
    if mutate {
        mutate_outputs(&eager_in, &eager_out, &comp_in, &comp_out)?;
    }
    Ok(None)
}

/// When both worlds reject a call, the compiled function must reject it as a user
/// error, not a failed internal invariant, and name the op eager names.
pub fn rejects_like_eager(eager: &aotgrad::Error, compiled: &aotgrad::Error) -> Result<(), String> {
    let text = compiled.to_string();
    if matches!(compiled, aotgrad::Error::Internal(_)) || text.contains("internal error") {
        return Err(format!("eager rejects the call ({eager}), and the compiled function fails with a bug: {text}"));
    }
    if let Some(op) = match eager {
        aotgrad::Error::Trace(t) => t.op(),
        _ => None,
    } {
        if !text.contains(op) {
            return Err(format!("eager rejects the call in `{op}` ({eager}), the compiled function elsewhere: {text}"));
        }
    }
    Ok(())
}

/// The observable state of one tensor.
#[derive(Debug)]
struct State {
    meta: TensorMeta,
    values: Vec<f64>,
    storage: Vec<f64>,
    requires_grad: bool,
}

fn state(t: &Tensor) -> Result<State, String> {
    let cpu = t.to_cpu().map_err(|e| e.to_string())?;
    let len = cpu.storage.len();
    let whole =
        aotgrad::cpu::CpuTensor { storage: cpu.storage.clone(), meta: TensorMeta::from_sizes(&[len], cpu.meta.dtype) };
    Ok(State {
        meta: cpu.meta.clone(),
        values: cpu.try_to_vec_f64().map_err(|e| e.to_string())?,
        storage: whole.try_to_vec_f64().map_err(|e| e.to_string())?,
        requires_grad: t.is_requires_grad(),
    })
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1.0))
}

fn same_state(what: &str, e: &Tensor, c: &Tensor) -> Result<(), String> {
    let (se, sc) = (state(e)?, state(c)?);
    if se.meta != sc.meta {
        return Err(format!("{what}: metadata {} (compiled) != {} (eager)", sc.meta, se.meta));
    }
    if !close(&se.values, &sc.values) {
        return Err(format!("{what}: values {:?} (compiled) != {:?} (eager)", sc.values, se.values));
    }
    if !close(&se.storage, &sc.storage) {
        return Err(format!("{what}: storage {:?} (compiled) != {:?} (eager)", sc.storage, se.storage));
    }
    if se.requires_grad != sc.requires_grad {
        return Err(format!("{what}: requires_grad {} (compiled) != {} (eager)", sc.requires_grad, se.requires_grad));
    }
    Ok(())
}

/// (d): add 1 to each float output in turn, cumulatively, in both worlds.
fn mutate_outputs(eager_in: &[Arg], eager_out: &[Tensor], comp_in: &[Arg], comp_out: &[Tensor]) -> Result<(), String> {
    let _g = NoGradGuard::new();
    for j in 0..eager_out.len() {
        if !eager_out[j].dtype().is_float() {
            continue;
        }
        let (re, rc) = (eager_out[j].add_(1.0), comp_out[j].add_(1.0));
        match (re, rc) {
            (Ok(_), Ok(_)) => {}
            (Err(_), Err(_)) => continue,
            (Ok(_), Err(e)) => return Err(format!("output {j}.add_(1) fails only when compiled: {e}")),
            (Err(e), Ok(_)) => return Err(format!("output {j}.add_(1) fails only in eager: {e}")),
        }
        compare_worlds(&format!("after output {j}.add_(1): "), &same_state, eager_in, eager_out, comp_in, comp_out)?;
    }
    Ok(())
}

/// (e): the functional graph verifies and round-trips through the text format.
fn check_graph(fz: &Functionalized, keep: bool) -> Result<(), String> {
    let g = &fz.graph;
    let concrete = g.inputs.iter().all(|i| i.meta.is_concrete());
    if concrete {
        verify_functional(g, keep, &mut StaticOracle).map_err(|e| format!("functional graph fails to verify: {e}"))?;
    }
    // (Symbolic graphs are verified under the trace's shape environment by `functionalize` itself.)
    if !keep && g.nodes.iter().any(|n| n.op.is_mutation()) {
        return Err("mutation in the functional graph".into());
    }
    let text = print_graph(g);
    let back = parse_graph(&text).map_err(|e| format!("functional graph does not parse back: {e}"))?;
    if &back != g {
        return Err("functional graph does not round-trip through the text format".into());
    }
    Ok(())
}

/// The traced graph of the (last) compiled entry, without source locations.
pub fn traced_text(c: &Checked) -> String {
    let mut g = c.compiled.traced_graphs().pop().unwrap_or_default();
    for n in &mut g.nodes {
        n.loc = None;
    }
    print_graph(&g)
}

/// The functional graph (without source locations, so goldens do not move with the
/// test files' line numbers), then one line per input, output and calling-convention
/// slot.
pub fn describe(fz: &Functionalized) -> String {
    let mut g = fz.graph.clone();
    for n in &mut g.nodes {
        n.loc = None;
    }
    let mut s = print_graph(&g);
    let m = &fz.meta;
    for (i, info) in m.inputs.iter().enumerate() {
        let mut flags = Vec::new();
        if info.mutates_data {
            flags.push("mutates_data".to_string());
        }
        if info.mutates_metadata {
            flags.push("mutates_metadata".to_string());
        }
        if info.mutations_hidden_from_autograd {
            flags.push("hidden_from_autograd".to_string());
        }
        if info.requires_grad {
            flags.push("requires_grad".to_string());
        }
        if let Some(fm) = &info.final_meta {
            flags.push(format!("final_meta={fm}"));
        }
        let _ = writeln!(s, "input {i}: {}", if flags.is_empty() { "-".into() } else { flags.join(", ") });
    }
    for (j, o) in m.outputs.iter().enumerate() {
        let kind = match &o.kind {
            OutputKind::NonAlias => "non_alias".to_string(),
            OutputKind::IsInput(k) => format!("is_input {k}"),
            OutputKind::AliasOfInput(k) => format!("alias_of_input {k}"),
            OutputKind::AliasOfIntermediate(b) => format!("alias_of_intermediate {b}"),
            OutputKind::AliasOfOutput(k) => format!("alias_of_output {k}"),
            OutputKind::SameAs(k) => format!("same_as {k}"),
        };
        let _ = writeln!(s, "output {j}: {kind} {}", o.meta);
    }
    if !m.mutated_inputs.is_empty() {
        let _ = writeln!(s, "mutated graph inputs: {:?}", m.mutated_inputs);
    }
    if m.num_intermediate_bases > 0 {
        let _ = writeln!(s, "intermediate bases: {}", m.num_intermediate_bases);
    }
    let c = &fz.convention;
    let slots: Vec<String> = c
        .args
        .iter()
        .map(|a| match a {
            ArgSlot::Input(g) => format!("input {g}"),
            ArgSlot::ViewOfBase { base } => format!("view of base {base}"),
        })
        .collect();
    let _ = writeln!(s, "convention: [{}]", slots.join(", "));
    for b in &c.bases {
        let _ = writeln!(
            s,
            "synthetic base: graph input {} = storage[{}..{}] for traced inputs {:?}",
            b.input,
            b.offset,
            b.offset + b.len,
            b.members
        );
    }
    s
}

//! The training contract checker: runs a user function eagerly (grad mode on) and
//! through `aot_function_args`' training path (`forward_args` + `backward_with`) on
//! identical, freshly built inputs, and checks what DESIGN.md's "Semantics contract"
//! promises:
//!
//! (a) outputs equal eager's: values, metadata, whole storage, `requires_grad`, leaf-ness;
//! (b) every input afterwards holds what eager left (values, metadata, whole storage);
//! (c) aliasing: `shares_storage_with` / `same_object` agree with eager for every
//!     (output, input) and (output, output) pair;
//! (d) adding 1 in place to each float output in turn (grad mode on) is accepted or
//!     rejected as in eager, and leaves identical states in both worlds;
//! (e) gradients: with random output gradients `g_j` and random gradients `h_i` for the
//!     new value of every input the call changed, the gradient returned for each
//!     argument that requires grad equals the central finite difference (f64, eps 1e-6)
//!     of `L = sum_j <out_j, g_j> + sum_i <x_i_after, h_i>` (outputs that do not require
//!     grad in eager contribute nothing), computed by re-running the function eagerly
//!     under `no_grad` on perturbed copies of the inputs with their aliasing rebuilt.
//!     Perturbing an argument's element perturbs the storage element it views, so an
//!     argument passed twice, or aliasing another argument, gets the total gradient of
//!     that storage element.
//!
//! The compiled function is called twice on fresh inputs (compile, then the cached
//! entry); both calls are checked.
//!
//! With `AOTGRAD_BACKEND=wgpu` (CI's second run, on lavapipe) values are f32, since
//! WGSL has no f64: see [`on_wgpu`].

use crate::worlds::compare_worlds;
use aotgrad::cpu::CpuTensor;
use aotgrad::ir::text::print_graph;
use aotgrad::ir::{Graph, TensorMeta};
use aotgrad::runtime::PendingBackward;
use aotgrad::trace::autograd::Edge;
use aotgrad::trace::{DType, NoGradGuard, Tensor};
use aotgrad::{aot_function_args, AotConfig, AotFunction, Arg};
use std::sync::Arc;

/// A user function over [`Arg`]s.
pub type UserFn = Arc<dyn Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync>;

/// Finite-difference step.
const EPS: f64 = 1e-6;
/// Gradient tolerance: `|got - fd| <= TOL * max(1, |fd|)`.
const TOL: f64 = 1e-6;

/// Whether the default backend is wgpu (`AOTGRAD_BACKEND=wgpu`, how CI runs this suite
/// on lavapipe). It has no f64 (WGSL has none), so the checker then makes f32 values,
/// compares values within f32 rounding (the device's transcendental functions and
/// summation orders are not the host's), and checks gradients against eager autograd
/// alone (f32 finite differences measure nothing at these tolerances).
pub fn on_wgpu() -> bool {
    static WGPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WGPU.get_or_init(|| aotgrad::default_backend().0.name() == "wgpu")
}

/// The float dtype of the checker's values: f64, or f32 [`on_wgpu`].
pub fn float_dtype() -> DType {
    if on_wgpu() {
        DType::F32
    } else {
        DType::F64
    }
}

/// A golden graph text: compared, except [`on_wgpu`] (f32 values print other dtypes,
/// and the partitioner weighs f32 bytes differently; the CPU run checks the goldens).
pub fn golden(expected: expect_test::Expect, text: &str) {
    if !on_wgpu() {
        expected.assert_eq(text);
    }
}

/// A test's own tolerance `t` for f64 values, or f32's [`on_wgpu`].
pub fn tol_of(t: f64) -> f64 {
    if on_wgpu() {
        1e-4
    } else {
        t
    }
}

/// Relative tolerance of value comparisons.
fn value_tol() -> f64 {
    if on_wgpu() {
        2e-5
    } else {
        1e-12
    }
}

/// Relative tolerance of gradient comparisons.
fn grad_tol() -> f64 {
    if on_wgpu() {
        1e-4
    } else {
        TOL
    }
}

/// The tensor of an argument (tests pass tensors where they say so).
pub fn tensor(a: &Arg) -> aotgrad::Result<&Tensor> {
    a.tensor().ok_or_else(|| aotgrad::Error::Internal("argument is not a tensor".into()))
}

/// `n` deterministic pseudo-random values in `[-1, 1)` (splitmix64), kept away from 0
/// so that kinks (relu, abs) are not within a finite-difference step.
pub fn rand_vals(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0x1234_5678);
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let v = 2.0 * u - 1.0;
            if v.abs() < 0.05 {
                v + 0.1f64.copysign(v)
            } else {
                v
            }
        })
        .collect()
}

/// A tensor of random values (a leaf that does not require grad): f64, or f32
/// [`on_wgpu`].
pub fn data(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f64(&rand_vals(n, seed), shape, float_dtype()).expect("valid data")
}

/// A random f64 leaf that requires grad.
pub fn leaf(shape: &[usize], seed: u64) -> Tensor {
    data(shape, seed).requires_grad(true).expect("float leaf")
}

/// A random f64 non-leaf that requires grad (`leaf * 1`), so it may be mutated in place.
pub fn nonleaf(shape: &[usize], seed: u64) -> Tensor {
    leaf(shape, seed).mul(1.0).expect("mul")
}

/// How [`check_with`] checks gradients.
pub enum Grads {
    /// Against central finite differences.
    FiniteDifferences,
    /// Against eager autograd only: for programs whose gradients are not the
    /// function's derivative (values made under no_grad or detached feed the result).
    EagerAutograd,
    /// Not here: the test checks [`Trained::grads`] itself (e.g. hidden mutations,
    /// where autograd's view differs from the function's mathematics).
    ByTheTest,
}

/// What a successful check returns (about its last call).
pub struct Trained {
    /// Forward graph, backward graph and partition report, without source locations.
    pub text: String,
    /// The compiled function.
    pub compiled: AotFunction,
    /// The inputs of the last compiled call (after the call).
    pub inputs: Vec<Arg>,
    /// The output gradients passed to the last backward.
    pub out_grads: Vec<Tensor>,
    /// The gradients of updated inputs passed to the last backward.
    pub updated_grads: Vec<(usize, Tensor)>,
    /// What the last backward returned.
    pub grads: Vec<Option<Tensor>>,
}

/// Check the whole contract against finite differences; panics on the first violation.
pub fn check<F, I>(f: F, inputs: I, config: AotConfig) -> Trained
where
    F: Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static,
    I: Fn() -> Vec<Arg>,
{
    check_with(f, inputs, config, Grads::FiniteDifferences)
}

/// [`check`] with a choice of gradient check.
pub fn check_with<F, I>(f: F, inputs: I, config: AotConfig, grads: Grads) -> Trained
where
    F: Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static,
    I: Fn() -> Vec<Arg>,
{
    let f: UserFn = Arc::new(f);
    let ff = f.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config.cache(Arc::new(aotgrad::Cache::disk(dir.path())));
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), config.clone()).expect("aot_function_args");
    let mut last = None;
    for call in 0..2u64 {
        match one_call(&compiled, &f, &inputs, &grads, 100 * call + 7) {
            Ok(r) => last = Some(r),
            Err(e) => panic!("call {call}: contract violated: {e}\n{}", graphs_text(&compiled)),
        }
        assert_eq!(compiled.num_compiled(), 1, "call {call}: one compiled entry for one input pattern");
    }
    // The cache round trip: a new function loads the stored result, compiles nothing,
    // and satisfies the same contract (forward, backward, finite differences).
    let ff = f.clone();
    let loaded = aot_function_args(move |a: &[Arg]| ff(a), config).expect("aot_function_args");
    if let Err(e) = one_call(&loaded, &f, &inputs, &grads, 307) {
        panic!("loaded from the cache: contract violated: {e}\n{}", graphs_text(&loaded));
    }
    let (stats, reports) = (loaded.cache_stats(), loaded.compile_reports());
    assert!(
        stats.hits == 1
            && stats.misses + stats.guard_misses + stats.rejected == 0
            && reports.len() == 1
            && reports[0].source == aotgrad::runtime::EntrySource::Cache,
        "expected one cache hit and no compilation, got {stats:?} and {reports:?}"
    );
    assert_eq!(graphs_text(&loaded), graphs_text(&compiled), "loaded graphs differ from the compiled ones");
    let (inputs, out_grads, updated_grads, grads) = last.expect("two calls ran");
    Trained { text: graphs_text(&compiled), compiled, inputs, out_grads, updated_grads, grads }
}

type CallResult = (Vec<Arg>, Vec<Tensor>, Vec<(usize, Tensor)>, Vec<Option<Tensor>>);

fn one_call(
    compiled: &AotFunction,
    f: &UserFn,
    inputs: &dyn Fn() -> Vec<Arg>,
    grads: &Grads,
    seed: u64,
) -> Result<CallResult, String> {
    let (eager_in, comp_in, before) = (inputs(), inputs(), inputs());
    let before_states: Vec<Option<State>> =
        before.iter().map(|a| a.tensor().map(state).transpose()).collect::<Result<_, _>>()?;
    let requires_grad: Vec<bool> = before.iter().map(|a| a.tensor().is_some_and(Tensor::is_requires_grad)).collect();
    let eager_out = f(&eager_in).map_err(|e| format!("eager fails: {e}"))?;
    // Where each argument's gradient continues in eager autograd, taken before the
    // call may change the arguments.
    let comp_edges: Vec<Edge> = comp_in
        .iter()
        .map(|a| a.tensor().map_or(Ok(Edge::None), |t| t.grad_edge()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let (comp_out, pending) = compiled.forward_args(&comp_in).map_err(|e| format!("compiled forward fails: {e}"))?;
    compare_worlds("", &same_state, &eager_in, &eager_out, &comp_in, &comp_out)?;
    // Outputs autograd refuses to use (a no-grad or multi-output view whose storage
    // changed since it was made): the same in both worlds, and left out of `L`.
    let usable = same_usability("", &eager_out, &comp_out)?;
    // Gradients: random for every output (ignored for those that do not require grad).
    let out_grads: Vec<Tensor> = eager_out
        .iter()
        .enumerate()
        .map(|(j, o)| {
            let m = o.meta();
            let shape = m.concrete_shape().unwrap_or_default();
            let n: usize = shape.iter().product();
            let vals = if m.dtype.is_float() && usable[j] { rand_vals(n, seed + 13 * j as u64) } else { vec![0.0; n] };
            Tensor::from_f64(&vals, &shape, m.dtype).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let weights: Vec<Option<Vec<f64>>> = eager_out
        .iter()
        .zip(&out_grads)
        .zip(&usable)
        .map(|((o, g), u)| (o.is_requires_grad() && *u).then(|| g.to_vec_f64()).transpose())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    // ... and for the new value of every argument the call changed that requires grad
    // afterwards (in eager).
    let mut updated_grads: Vec<(usize, Tensor)> = Vec::new();
    for (k, a) in eager_in.iter().enumerate() {
        let (Some(t), Some(b)) = (a.tensor(), &before_states[k]) else { continue };
        let first = eager_in.iter().position(|x| x.tensor().is_some_and(|u| u.same_object(t))) == Some(k);
        let after = state(t)?;
        if after.requires_grad && first && (after.meta != b.meta || after.values != b.values) {
            let shape = after.meta.concrete_shape().unwrap_or_default();
            let n: usize = shape.iter().product();
            let h = Tensor::from_f64(&rand_vals(n, seed + 1000 + 17 * k as u64), &shape, after.meta.dtype)
                .map_err(|e| e.to_string())?;
            updated_grads.push((k, h));
        }
    }
    let got = match backward(&pending, &out_grads, &usable, &updated_grads) {
        Ok(got) => got,
        // PyTorch's backward checks (saved values, gradient shapes): eager's backward
        // must refuse too.
        Err(e) if EAGER_BACKWARD_ERRORS.iter().any(|m| e.contains(m)) => {
            return Err(match eager_backward(f, inputs, &out_grads, &updated_grads) {
                // (Eager may meet another of its backward errors first.)
                Err(ee) if EAGER_BACKWARD_ERRORS.iter().any(|m| ee.contains(m)) => format!("{BOTH_BACKWARD}: {e}"),
                Err(ee) => format!("the compiled backward refuses ({e}), eager's fails otherwise: {ee}"),
                Ok(_) => format!("the compiled backward refuses ({e}), eager's runs"),
            });
        }
        Err(e) => return Err(e),
    };
    if got.len() != before.len() {
        return Err(format!("backward returned {} gradients for {} arguments", got.len(), before.len()));
    }
    // An argument the function made require grad (`requires_grad_()`: a leaf requiring
    // grad after the call) has a gradient.
    let requires_grad: Vec<bool> = requires_grad
        .iter()
        .zip(&comp_in)
        .map(|(before, a)| *before || a.tensor().is_some_and(|t| t.is_requires_grad() && t.is_leaf()))
        .collect();
    for (k, g) in got.iter().enumerate() {
        match (g, requires_grad[k]) {
            (Some(g), true) => {
                let want = before[k].tensor().map(|t| t.meta().shape).unwrap_or_default();
                if g.shape()[..] != want[..] {
                    return Err(format!("gradient {k} has shape {:?}, argument {k} has {:?}", g.shape(), want));
                }
            }
            (None, false) => {}
            (Some(_), false) => return Err(format!("a gradient for argument {k}, which does not require grad")),
            (None, true) => return Err(format!("no gradient for argument {k}, which requires grad")),
        }
    }
    if let (Grads::FiniteDifferences, false) = (grads, on_wgpu()) {
        let h: Vec<(usize, Vec<f64>)> = updated_grads
            .iter()
            .map(|(k, t)| t.to_vec_f64().map(|v| (*k, v)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let loss = |args: &[Arg]| loss_of(f, args, &weights, &h);
        for (k, g) in got.iter().enumerate() {
            if g.is_none() {
                continue;
            }
            let fd = finite_differences(&before, k, &loss)?;
            // Gradients follow tensors: an argument naming a storage element several
            // times (an `expand`) gets a gradient per element, and arguments sharing
            // a storage each get their own contributions; perturbing a storage element
            // measures the sum over every argument element naming it.
            let g = summed_over_aliases(&before, &got, k)?;
            for (e, (a, b)) in g.iter().zip(&fd).enumerate() {
                if (a - b).abs() > TOL * b.abs().max(1.0) {
                    return Err(format!(
                        "d L / d arg{k}[{e}] = {a} (compiled) != {b} (finite differences)\n  compiled: {g:?}\n  \
                         finite differences: {fd:?}"
                    ));
                }
            }
        }
    }
    if let Grads::FiniteDifferences | Grads::EagerAutograd = grads {
        eager_gradients_agree(f, inputs, &out_grads, &updated_grads, &got, &comp_edges)?;
    }
    mutate_outputs(&eager_in, &eager_out, &comp_in, &comp_out)?;
    Ok((comp_in, out_grads, updated_grads, got))
}

/// The second oracle: eager autograd. `L` is differentiated by `backward()` on a fresh
/// eager run in grad mode, down to the leaves the arguments were made from; the
/// compiled gradients of the arguments continue through the arguments' own eager
/// history (recorded before the call) to the same leaves, as they would in PyTorch,
/// and the leaves' gradients must agree. Arguments sharing a storage each carry their
/// own contributions (or, merged into a synthetic base, each storage element's once),
/// so the chain counts every contribution once; the same tensor object passed twice
/// is one root.
fn eager_gradients_agree(
    f: &UserFn,
    inputs: &dyn Fn() -> Vec<Arg>,
    out_grads: &[Tensor],
    updated: &[(usize, Tensor)],
    got: &[Option<Tensor>],
    comp_edges: &[Edge],
) -> Result<(), String> {
    let eager_leaves = eager_backward(f, inputs, out_grads, updated)?;
    eager_leaves_agree(&eager_leaves, got, comp_edges)
}

/// `L` differentiated by eager autograd on a fresh eager run; returns the leaves
/// behind the arguments (their gradients filled).
fn eager_backward(
    f: &UserFn,
    inputs: &dyn Fn() -> Vec<Arg>,
    out_grads: &[Tensor],
    updated: &[(usize, Tensor)],
) -> Result<Vec<Tensor>, String> {
    use aotgrad::Backward;
    let args = inputs();
    let tensors: Vec<Option<&Tensor>> = args.iter().map(Arg::tensor).collect();
    let edges: Vec<Edge> = tensors
        .iter()
        .map(|t| t.map_or(Ok(Edge::None), |t| t.grad_edge()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let eager_leaves = leaves_of(&edges);
    let outs = f(&args).map_err(|e| format!("eager run for eager gradients fails: {e}"))?;
    let mut total: Option<Tensor> = None;
    let mut add = |term: Tensor| -> Result<(), String> {
        total = Some(match total.take() {
            Some(t) => t.add(&term).map_err(|e| e.to_string())?,
            None => term,
        });
        Ok(())
    };
    for (o, g) in outs.iter().zip(out_grads) {
        if o.is_requires_grad() && usable_in_grad_mode(o) {
            add(o.mul(g).and_then(|p| p.sum_all()).map_err(|e| e.to_string())?)?;
        }
    }
    for (k, h) in updated {
        let t = tensor(&args[*k]).map_err(|e| e.to_string())?;
        if t.is_requires_grad() {
            add(t.mul(h).and_then(|p| p.sum_all()).map_err(|e| e.to_string())?)?;
        }
    }
    if let Some(l) = total.filter(Tensor::is_requires_grad) {
        l.backward().map_err(|e| format!("eager backward fails: {e}"))?;
    }
    Ok(eager_leaves)
}

/// The compiled gradients `got`, continued through the arguments' history from
/// `comp_edges`, must give the leaves eager autograd's gradients.
fn eager_leaves_agree(eager_leaves: &[Tensor], got: &[Option<Tensor>], comp_edges: &[Edge]) -> Result<(), String> {
    let comp_leaves = leaves_of(comp_edges);
    // A leaf argument whose metadata the call changed in place (`t_()` under no_grad)
    // has its gradient in its new layout in eager, and in its layout at the call in
    // the compiled backward: such leaves are left to the finite differences.
    let mut reshaped: Vec<Tensor> = Vec::new();
    let same_edge = |a: &Edge, b: &Edge| match (a, b) {
        (Edge::Leaf(x), Edge::Leaf(y)) => x.same_object(y),
        (Edge::Node(x), Edge::Node(y)) => Arc::ptr_eq(x, y),
        _ => false,
    };
    let roots: Vec<(Edge, Tensor)> = comp_edges
        .iter()
        .enumerate()
        .zip(got)
        .filter_map(|((k, e), g)| {
            let g = g.as_ref()?;
            if comp_edges[..k].iter().any(|d| same_edge(d, e)) {
                return None;
            }
            if let Edge::Leaf(t) = e {
                if t.shape() != g.shape() {
                    reshaped.push(t.clone());
                    return None;
                }
            }
            Some((e.clone(), g.clone()))
        })
        .collect();
    aotgrad::autograd::backward_from_edges(&roots, false)
        .map_err(|e| format!("compiled gradients through the arguments' history fail: {e}"))?;
    if comp_leaves.len() != eager_leaves.len() {
        return Err(format!(
            "{} leaves behind the compiled arguments, {} behind eager's",
            comp_leaves.len(),
            eager_leaves.len()
        ));
    }
    for (i, (c, e)) in comp_leaves.iter().zip(eager_leaves).enumerate() {
        if reshaped.iter().any(|r| r.same_object(c)) {
            continue;
        }
        let n = c.to_vec_f64().map_err(|e| e.to_string())?.len();
        let vals = |t: &Tensor| -> Result<Vec<f64>, String> {
            match t.grad() {
                Some(g) => g.to_vec_f64().map_err(|e| e.to_string()),
                None => Ok(vec![0.0; n]),
            }
        };
        let (comp, eager) = (vals(c)?, vals(e)?);
        for (k, (a, b)) in comp.iter().zip(&eager).enumerate() {
            if (a - b).abs() > grad_tol() * b.abs().max(1.0) {
                return Err(format!(
                    "d L / d leaf{i}[{k}] = {a} (compiled, through the arguments' history) != {b} (eager autograd)\n  \
                     compiled: {comp:?}\n  eager: {eager:?}"
                ));
            }
        }
    }
    Ok(())
}

/// The distinct leaves behind `edges`, in depth-first order (the same order in two
/// worlds built alike).
fn leaves_of(edges: &[Edge]) -> Vec<Tensor> {
    let mut seen = std::collections::HashSet::new();
    let mut leaves: Vec<Tensor> = Vec::new();
    let mut stack: Vec<Edge> = edges.iter().rev().cloned().collect();
    while let Some(e) = stack.pop() {
        match e {
            Edge::Leaf(t) => {
                if !leaves.iter().any(|l| l.same_object(&t)) {
                    leaves.push(t);
                }
            }
            Edge::Node(n) => {
                if seen.insert(Arc::as_ptr(&n) as usize) {
                    stack.extend(n.edges().iter().rev().cloned());
                }
            }
            Edge::None | Edge::Unrecorded => {}
        }
    }
    leaves
}

/// The compiled backward with `out_grads` for the outputs autograd can use (`usable`).
fn backward(
    pending: &PendingBackward,
    out_grads: &[Tensor],
    usable: &[bool],
    updated: &[(usize, Tensor)],
) -> Result<Vec<Option<Tensor>>, String> {
    let opt: Vec<Option<Tensor>> = out_grads.iter().zip(usable).map(|(g, u)| u.then(|| g.clone())).collect();
    pending.backward_with(&opt, updated).map_err(|e| format!("backward fails: {e}"))
}

/// `L` of one eager run (under no-grad) on `args`.
fn loss_of(f: &UserFn, args: &[Arg], weights: &[Option<Vec<f64>>], h: &[(usize, Vec<f64>)]) -> Result<f64, String> {
    let _g = NoGradGuard::new();
    let outs = f(args).map_err(|e| format!("eager run on perturbed inputs fails: {e}"))?;
    let mut l = 0.0;
    for (o, w) in outs.iter().zip(weights) {
        if let Some(w) = w {
            l += dot(&o.to_vec_f64().map_err(|e| e.to_string())?, w);
        }
    }
    for (k, hk) in h {
        l += dot(&tensor(&args[*k]).map_err(|e| e.to_string())?.to_vec_f64().map_err(|e| e.to_string())?, hk);
    }
    Ok(l)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The whole storage under `t`, as f64.
fn storage_of(t: &Tensor) -> Result<(CpuTensor, Vec<f64>), String> {
    let cpu = t.to_cpu().map_err(|e| e.to_string())?;
    let whole =
        CpuTensor { storage: cpu.storage.clone(), meta: TensorMeta::from_sizes(&[cpu.storage.len()], cpu.meta.dtype) };
    let v = whole.try_to_vec_f64().map_err(|e| e.to_string())?;
    Ok((cpu, v))
}

/// Copies of `args` with fresh storages (aliasing between arguments rebuilt), the
/// storage element `pos` of argument `k`'s storage moved by `delta`.
fn perturbed(args: &[Arg], k: usize, pos: usize, delta: f64) -> Result<Vec<Arg>, String> {
    let _g = NoGradGuard::new();
    let target = tensor(&args[k]).map_err(|e| e.to_string())?;
    // One fresh flat tensor per storage class, one new object per tensor object.
    let mut flats: Vec<(Tensor, Tensor)> = Vec::new(); // (representative, flat copy)
    let mut objects: Vec<(Tensor, Tensor)> = Vec::new(); // (original, copy)
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        let Some(t) = a.tensor() else {
            out.push(a.clone());
            continue;
        };
        if let Some((_, c)) = objects.iter().find(|(o, _)| o.same_object(t)) {
            out.push(Arg::Tensor(c.clone()));
            continue;
        }
        let flat = match flats.iter().find(|(r, _)| r.shares_storage_with(t)) {
            Some((_, fl)) => fl.clone(),
            None => {
                let (cpu, mut v) = storage_of(t)?;
                if t.shares_storage_with(target) {
                    v[pos] += delta;
                }
                let fl = Tensor::from_f64(&v, &[v.len()], cpu.meta.dtype).map_err(|e| e.to_string())?;
                flats.push((t.clone(), fl.clone()));
                fl
            }
        };
        let m = t.meta();
        let c = flat
            .as_strided(
                &m.concrete_shape().unwrap_or_default(),
                &m.concrete_strides().unwrap_or_default(),
                m.concrete_offset().unwrap_or(0),
            )
            .map_err(|e| e.to_string())?;
        objects.push((t.clone(), c.clone()));
        out.push(Arg::Tensor(c));
    }
    Ok(out)
}

/// Central differences of `loss` w.r.t. each element (row-major) of argument `k`.
fn finite_differences(
    args: &[Arg],
    k: usize,
    loss: &dyn Fn(&[Arg]) -> Result<f64, String>,
) -> Result<Vec<f64>, String> {
    let m = tensor(&args[k]).map_err(|e| e.to_string())?.meta();
    let shape = m.concrete_shape().unwrap_or_default();
    let strides = m.concrete_strides().unwrap_or_default();
    let offset = m.concrete_offset().unwrap_or(0);
    let n: usize = shape.iter().product();
    let mut fd = Vec::with_capacity(n);
    for e in 0..n {
        let (mut rest, mut pos) = (e, offset);
        for d in (0..shape.len()).rev() {
            pos += (rest % shape[d]) * strides[d];
            rest /= shape[d];
        }
        // f32 values on wgpu: a step f32 resolves.
        let eps = if on_wgpu() { 1e-3 } else { EPS };
        let up = loss(&perturbed(args, k, pos, eps)?)?;
        let down = loss(&perturbed(args, k, pos, -eps)?)?;
        fd.push((up - down) / (2.0 * eps));
    }
    Ok(fd)
}

/// `g`, a gradient per element of `t`, with each element's entry replaced by the sum
/// over the elements of `t` at the same storage position (unchanged when `t` names
/// every element once).
/// Argument `k`'s gradient as finite differences over its storage see it: for each
/// of its elements, the sum of the gradients of every element of every argument (each
/// tensor object once) that names the same storage element.
fn summed_over_aliases(args: &[Arg], got: &[Option<Tensor>], k: usize) -> Result<Vec<f64>, String> {
    let t = tensor(&args[k]).map_err(|e| e.to_string())?;
    let mut image: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
    let mut seen: Vec<Tensor> = Vec::new();
    for (j, g) in got.iter().enumerate() {
        let (Some(g), Some(u)) = (g, args[j].tensor()) else { continue };
        if !u.shares_storage_with(t) || seen.iter().any(|s| s.same_object(u)) {
            continue;
        }
        seen.push(u.clone());
        for (p, v) in element_positions(u).into_iter().zip(g.to_vec_f64().map_err(|e| e.to_string())?) {
            *image.entry(p).or_insert(0.0) += v;
        }
    }
    Ok(element_positions(t).iter().map(|p| image.get(p).copied().unwrap_or(0.0)).collect())
}

/// The storage position of each element of `t`, row-major.
fn element_positions(t: &Tensor) -> Vec<usize> {
    let m = t.meta();
    let (shape, strides) = (m.concrete_shape().unwrap_or_default(), m.concrete_strides().unwrap_or_default());
    let offset = m.concrete_offset().unwrap_or(0);
    let n: usize = shape.iter().product();
    (0..n)
        .map(|e| {
            let (mut rest, mut p) = (e, offset);
            for d in (0..shape.len()).rev() {
                p += (rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            p
        })
        .collect()
}

/// The observable state of one tensor.
#[derive(Debug, PartialEq)]
struct State {
    meta: TensorMeta,
    values: Vec<f64>,
    storage: Vec<f64>,
    requires_grad: bool,
    is_leaf: bool,
}

fn state(t: &Tensor) -> Result<State, String> {
    let (cpu, storage) = storage_of(t)?;
    Ok(State {
        meta: cpu.meta.clone(),
        values: cpu.try_to_vec_f64().map_err(|e| e.to_string())?,
        storage,
        requires_grad: t.is_requires_grad(),
        is_leaf: t.is_leaf(),
    })
}

fn close(a: &[f64], b: &[f64]) -> bool {
    let tol = value_tol();
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0))
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
    if (se.requires_grad, se.is_leaf) != (sc.requires_grad, sc.is_leaf) {
        return Err(format!(
            "{what}: (requires_grad, is_leaf) {:?} (compiled) != {:?} (eager)",
            (sc.requires_grad, sc.is_leaf),
            (se.requires_grad, se.is_leaf)
        ));
    }
    Ok(())
}

/// Whether autograd lets `t` take part in an op in grad mode (it refuses a no-grad or
/// multi-output view whose storage was modified in place since it was made).
fn usable_in_grad_mode(t: &Tensor) -> bool {
    t.mul(1.0).is_ok()
}

/// Each output is usable in grad mode in both worlds or in neither; returns which are.
fn same_usability(ctx: &str, eager_out: &[Tensor], comp_out: &[Tensor]) -> Result<Vec<bool>, String> {
    let mut usable = Vec::with_capacity(eager_out.len());
    for (j, (e, c)) in eager_out.iter().zip(comp_out).enumerate() {
        let (ue, uc) = (usable_in_grad_mode(e), usable_in_grad_mode(c));
        if ue != uc {
            return Err(format!("{ctx}output {j} usable in grad mode: {uc} (compiled) != {ue} (eager)"));
        }
        usable.push(ue);
    }
    Ok(usable)
}

/// An in-place op the checker applies to outputs after a call.
type InPlaceOp = fn(&Tensor) -> aotgrad::trace::Result<Tensor>;

/// (d): in grad mode, add 1 in place to each float output in turn, cumulatively; then
/// multiply each in place by a leaf requiring grad (refused on a view made under
/// no-grad, even of a tensor that does not require grad). Each world fails or runs
/// each op alike, and agrees after it.
fn mutate_outputs(eager_in: &[Arg], eager_out: &[Tensor], comp_in: &[Arg], comp_out: &[Tensor]) -> Result<(), String> {
    let ops: [(&str, InPlaceOp); 2] = [
        ("add_(1)", |t| t.add_(1.0)),
        ("mul_(leaf)", |t| t.mul_(&Tensor::from_f64(&[1.0], &[], t.dtype())?.requires_grad(true)?)),
    ];
    for (what, op) in ops {
        for j in 0..eager_out.len() {
            if !eager_out[j].dtype().is_float() {
                continue;
            }
            match (op(&eager_out[j]), op(&comp_out[j])) {
                (Ok(_), Ok(_)) => {}
                (Err(_), Err(_)) => continue,
                (Ok(_), Err(e)) => return Err(format!("output {j}.{what} fails only when compiled: {e}")),
                (Err(e), Ok(_)) => return Err(format!("output {j}.{what} fails only in eager: {e}")),
            }
            let ctx = format!("after output {j}.{what}: ");
            compare_worlds(&ctx, &same_state, eager_in, eager_out, comp_in, comp_out)?;
            same_usability(&ctx, eager_out, comp_out)?;
        }
    }
    Ok(())
}

fn strip(g: &Graph) -> String {
    let mut g = g.clone();
    for n in &mut g.nodes {
        n.loc = None;
    }
    print_graph(&g)
}

/// Forward and backward graphs of the (last) training entry and its partition
/// report, without source locations.
pub fn graphs_text(compiled: &AotFunction) -> String {
    match compiled.training_graphs().pop() {
        Some((fw, bw, report)) => format!("forward:\n{}backward:\n{}{report}", strip(&fw), strip(&bw)),
        None => "(no training entry)\n".into(),
    }
}

/// `s` with every `.rs:LINE:COL` replaced by `.rs:<line>:<col>`, so golden error texts
/// do not move with the test files' line numbers.
pub fn without_lines(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(".rs:") {
        out.push_str(&rest[..i + 4]);
        rest = &rest[i + 4..];
        let digits = |r: &str| r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        let l = digits(rest);
        if l > 0 && rest[l..].starts_with(':') && digits(&rest[l + 1..]) > 0 {
            let c = digits(&rest[l + 1..]);
            out.push_str("<line>:<col>");
            rest = &rest[l + 1 + c..];
        }
    }
    out.push_str(rest);
    out
}

/// Eager and compiled both reject the call (grad mode on) with the same message (the
/// user's source line included); returns it without line numbers.
pub fn both_reject<F>(f: F, inputs: &dyn Fn() -> Vec<Arg>) -> String
where
    F: Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static,
{
    let f: UserFn = Arc::new(f);
    let ff = f.clone();
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), AotConfig::default()).expect("aot_function_args");
    let eager = f(&inputs()).err().map(|e| e.to_string()).expect("eager rejects the call");
    let comp = compiled.forward_args(&inputs()).err().map(|e| e.to_string()).expect("compiled rejects the call");
    assert_eq!(eager, comp, "eager and compiled reject the call differently");
    without_lines(&comp)
}

/// Central finite differences of `f`'s first output (a scalar), run eagerly under
/// no-grad, w.r.t. each element of argument `k` of `args`.
pub fn scalar_fd(f: UserFn, args: &[Arg], k: usize) -> Vec<f64> {
    let loss = |a: &[Arg]| loss_of(&f, a, &[Some(vec![1.0])], &[]);
    finite_differences(args, k, &loss).expect("finite differences")
}

/// What [`try_check`] found when the contract held.
/// How [`one_call`] reports that both backward passes refused (saved values changed).
const BOTH_BACKWARD: &str = "both backward passes refuse";

/// The errors of eager autograd's backward that PyTorch's backward raises too.
pub const EAGER_BACKWARD_ERRORS: [&str; 3] =
    ["modified by an inplace operation", "invalid gradient", "does not broadcast"];

pub enum Outcome {
    /// Both worlds ran; everything agreed, gradients included.
    Agree,
    /// Eager refused the call, and so did the compiled function (a user error naming
    /// the op eager names).
    BothRefuse,
    /// Everything agreed, but eager autograd refuses the backward where the compiled
    /// backward computes (the message says why). The compiled backward decides
    /// PyTorch's backward checks when it compiles, so the random test fails such a
    /// program; other callers may count it.
    EagerBackwardRefuses(String),
    /// Everything agreed up to the backward, which both refuse as PyTorch does: a
    /// value a recorded node saved was changed in place.
    BothBackwardRefuse,
}

/// [`check`] without panicking and without the cache round trip, for generated
/// programs: a call eager refuses must be refused by the compiled function too.
pub fn try_check(f: UserFn, inputs: &dyn Fn() -> Vec<Arg>, config: AotConfig, grads: Grads) -> Result<Outcome, String> {
    let ff = f.clone();
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), config).map_err(|e| e.to_string())?;
    if let Err(eager) = f(&inputs()) {
        return match compiled.forward_args(&inputs()) {
            Ok(_) => Err(format!("eager refuses the call ({eager}), the compiled function runs it")),
            Err(comp) => {
                let text = comp.to_string();
                if matches!(comp, aotgrad::Error::Internal(_)) || text.contains("internal error") {
                    return Err(format!(
                        "eager refuses the call ({eager}), the compiled function fails with a bug: {text}"
                    ));
                }
                if let Some(op) = match &eager {
                    aotgrad::Error::Trace(t) => t.op(),
                    _ => None,
                } {
                    if !text.contains(op) {
                        return Err(format!(
                            "eager refuses the call in `{op}` ({eager}), the compiled function elsewhere: {text}"
                        ));
                    }
                }
                Ok(Outcome::BothRefuse)
            }
        };
    }
    let mut outcome = Outcome::Agree;
    for call in 0..2u64 {
        match one_call(&compiled, &f, inputs, &grads, 100 * call + 7) {
            Ok(_) => {}
            Err(e) if e.starts_with(BOTH_BACKWARD) => outcome = Outcome::BothBackwardRefuse,
            Err(e) if e.starts_with("eager backward fails") && EAGER_BACKWARD_ERRORS.iter().any(|m| e.contains(m)) => {
                outcome = Outcome::EagerBackwardRefuses(e);
            }
            Err(e) => return Err(format!("call {call}: {e}\n{}", graphs_text(&compiled))),
        }
    }
    Ok(outcome)
}

/// [`try_check`] for a call made under no_grad (no backward): twice, eager and compiled
/// each run under no_grad; values, metadata, storage, flags (a view of an argument
/// requiring grad requires grad), versions and aliasing must agree, and so must which
/// outputs autograd can use and the in-place ops on the outputs afterwards, in grad
/// mode. A call eager refuses must be refused by the compiled function too.
pub fn try_check_no_grad_call(f: UserFn, inputs: &dyn Fn() -> Vec<Arg>, config: AotConfig) -> Result<Outcome, String> {
    let ff = f.clone();
    let compiled = aot_function_args(move |a: &[Arg]| ff(a), config).map_err(|e| e.to_string())?;
    for call in 0..2 {
        let (eager_in, comp_in) = (inputs(), inputs());
        let (eager, comp) = {
            let _g = NoGradGuard::new();
            (f(&eager_in), compiled.call_args(&comp_in))
        };
        match (eager, comp) {
            (Err(_), Err(c)) => {
                let text = c.to_string();
                if matches!(c, aotgrad::Error::Internal(_)) || text.contains("internal error") {
                    return Err(format!(
                        "under no_grad, eager refuses the call, the compiled function fails with a bug: {text}"
                    ));
                }
                return Ok(Outcome::BothRefuse);
            }
            (Err(e), Ok(_)) => {
                return Err(format!("under no_grad, eager refuses the call ({e}), the compiled function runs it"))
            }
            (Ok(_), Err(c)) => return Err(format!("under no_grad, the compiled call fails ({c}), eager runs it")),
            (Ok(eager_out), Ok(comp_out)) => {
                let ctx = format!("call {call} under no_grad: ");
                compare_worlds(&ctx, &same_state, &eager_in, &eager_out, &comp_in, &comp_out)?;
                same_usability(&ctx, &eager_out, &comp_out)?;
                mutate_outputs(&eager_in, &eager_out, &comp_in, &comp_out).map_err(|e| format!("{ctx}{e}"))?;
            }
        }
    }
    Ok(Outcome::Agree)
}

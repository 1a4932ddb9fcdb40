//! The runtime wrapper: `aot_function` and the compiled callable.
//!
//! A call (1) computes the call signature and looks for a compiled entry whose
//! signature matches and whose traced metadata binds to the arguments' metadata with
//! every guard holding, else makes one: trace over fake tensors (the same tensor
//! object passed twice is traced once: *dedupe*); with a cache, the trace yields the
//! cache key and a stored result whose guards hold is loaded; otherwise functionalize
//! (merging aliased, mutated inputs into *synthetic bases*) and compile with the
//! backend, producing an [`AotResult`] (stored when there is a cache); (2) builds the
//! graph inputs from the caller's tensors; (3) runs the compiled graph; (4) runs the
//! epilogue (the private `epilogue` module).
//!
//! Every entry is instantiated from an [`AotResult`] by one function
//! (`Entry::instantiate`), whether the result was just compiled, loaded from the
//! cache, or read from a precompiled file (module `cached`).

mod args;
mod cached;
mod epilogue;
mod saved_versions;
mod training;

pub use cached::{CacheStats, EntrySource};

pub use args::{Arg, Output};
pub use training::{Partitioner, PendingBackward};

use crate::config::AotConfig;
use crate::error::{Error, Result};
use aotgrad_cache::{AotResult, Artifact, GraphDumps, GraphKind, OutputSlot, ResultMeta, RngSlots, TrainingMeta};
pub(crate) use aotgrad_cache::{ArgSig, CallSig};
use aotgrad_cpu::CpuTensor;
use aotgrad_functionalize::{functionalize, AutogradFacts, Functionalized, Options, TraceFacts};
use aotgrad_ir::{CompiledGraph, Dim, Graph, SymId, TensorMeta, ValueId};
use aotgrad_meta::ArgSlot;
use aotgrad_trace::{trace, ShapeEnv, Tensor, TraceConfig, Traced};
use args::bind;
pub(crate) use args::{alias_classes, call_sig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type UserFn = dyn Fn(&[Arg]) -> crate::Result<Vec<Output>> + Send + Sync;

/// A function compiled ahead of time; call it like the original.
pub struct AotFunction {
    /// The user's function (`None` for a function loaded from a precompiled file).
    f: Option<Arc<UserFn>>,
    config: AotConfig,
    /// The result cache (from [`AotConfig::cache`]), and what it did.
    cache: cached::CacheState,
    entries: Mutex<Vec<Arc<Entry>>>,
    arity: Mutex<Option<usize>>,
    /// Held while compiling, so concurrent first calls compile each signature once
    /// (the others wait, then find the new entry).
    compile_lock: Mutex<()>,
    /// The thread holding `compile_lock` (a function that calls itself while being
    /// traced compiles the inner call without waiting for itself).
    compiling_thread: Mutex<Option<std::thread::ThreadId>>,
    /// How many leading arguments are not the user's (a module's lifted parameters and
    /// buffers): an argument without a name in [`AotConfig::arg_names`] is called
    /// `arg{i}` with `i` counting the user's arguments only.
    pub(crate) lifted_args: usize,
}

/// Clears [`AotFunction::compiling_thread`] when a compile ends, however it ends.
struct CompilingGuard<'a>(&'a Mutex<Option<std::thread::ThreadId>>);

impl Drop for CompilingGuard<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One compiled specialization of the function: an [`AotResult`] and its runnable
/// graphs.
pub(crate) struct Entry {
    result: Arc<AotResult<CpuTensor>>,
    /// The inference graph (inference entries).
    compiled: Option<Arc<dyn CompiledGraph<CpuTensor>>>,
    /// The compiled forward and backward (training entries).
    training: Option<training::TrainingParts>,
    /// Where the result came from.
    source: EntrySource,
}

impl Entry {
    /// Make the runnable entry of `result`: the one path for fresh, cached and
    /// precompiled results. Loaded artifacts must come from a backend with the same
    /// cache identity as `backend`.
    pub(crate) fn instantiate(
        result: Arc<AotResult<CpuTensor>>,
        backend: &dyn aotgrad_ir::Backend<CpuTensor>,
        source: EntrySource,
    ) -> Result<Entry> {
        let m = &result.meta;
        if source != EntrySource::Compiled {
            // A backend without an identity promises nothing about stored artifacts:
            // none is loaded into it, and none it wrote is trusted.
            let Some(here) = backend.cache_identity() else {
                return Err(Error::Cache(format!(
                    "backend `{}` declares no cache identity: it cannot load stored results",
                    backend.name()
                )));
            };
            if m.backend_identity.is_empty() {
                return Err(Error::Cache(format!(
                    "the result was compiled by `{}`, which declares no cache identity",
                    m.backend
                )));
            }
            if m.backend_identity != here {
                return Err(Error::Cache(format!(
                    "the result was compiled by `{}` and this function uses `{here}`",
                    m.backend_identity
                )));
            }
        }
        let fw = result.forward.load(backend)?;
        let (compiled, training) = match (&m.training, &result.backward) {
            (Some(_), Some(bw)) => (None, Some(training::TrainingParts { fw, bw: bw.load(backend)? })),
            (None, None) => (Some(fw), None),
            _ => return Err(Error::Cache("a training result needs exactly one backward artifact".into())),
        };
        Ok(Entry { result, compiled, training, source })
    }

    /// The result's runtime metadata.
    pub(crate) fn m(&self) -> &ResultMeta {
        &self.result.meta
    }

    /// The training metadata of a training entry.
    pub(crate) fn tm(&self) -> Result<&TrainingMeta> {
        self.m().training.as_ref().ok_or_else(|| Error::Internal("not a training entry".into()))
    }

    /// Metadata of functional-graph output `go`.
    pub(crate) fn graph_output_meta(&self, go: usize) -> Result<&TensorMeta> {
        self.m().graph_output_metas.get(go).ok_or_else(|| Error::Internal(format!("no graph output {go}")))
    }

    fn report(&self) -> CompileReport {
        let m = self.m();
        CompileReport {
            training: m.training.is_some(),
            backend: m.backend.clone(),
            stages: m.stages.clone(),
            source: self.source,
        }
    }
}

/// How one specialization was compiled: the path and each stage's wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileReport {
    /// The training path (joint graph, partition, forward and backward graphs), or
    /// the inference path (one graph).
    pub training: bool,
    /// The backend that compiled the graphs ([`aotgrad_ir::Backend::name`]).
    pub backend: String,
    /// `(stage, seconds)` in order: `trace`, `functionalize`, then `joint`,
    /// `simplify`, `partition`, `backend forward`, `backend backward` (training) or
    /// `backend` (inference). For a loaded result: the times of the compile that made
    /// it.
    pub stages: Vec<(String, f64)>,
    /// Whether this process compiled it or loaded it.
    pub source: EntrySource,
}

impl CompileReport {
    /// The whole compile time in seconds.
    pub fn total_seconds(&self) -> f64 {
        self.stages.iter().map(|(_, s)| s).sum()
    }
}

/// Times consecutive stages.
pub(crate) struct StageTimer {
    last: std::time::Instant,
    stages: Vec<(&'static str, f64)>,
}

impl StageTimer {
    fn new() -> StageTimer {
        StageTimer { last: std::time::Instant::now(), stages: Vec::new() }
    }
    /// Close the stage `name` that ran since the previous call.
    pub(crate) fn stage(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.stages.push((name, (now - self.last).as_secs_f64()));
        self.last = now;
    }
    fn into_stages(self) -> Vec<(String, f64)> {
        self.stages.into_iter().map(|(s, t)| (s.to_string(), t)).collect()
    }
}

/// Compile a function of tensors. Tracing happens at the first call (and again when
/// a call's metadata or aliasing pattern differs from every compiled one).
///
/// The function returns [`crate::Result`]: `?` works on tensor ops and on any other
/// aotgrad error. [`AotFunction::call`] runs it (the inference graph under
/// [`no_grad`](aotgrad_trace::no_grad)); [`AotFunction::forward`] runs the training
/// forward and returns a [`PendingBackward`] for the gradients of every argument that
/// requires grad.
///
/// ```
/// use aotgrad::prelude::*;
///
/// // loss = sum(relu(x @ w)); the compiled backward gives d loss / d w.
/// let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].matmul(&a[1])?.relu()?.sum_all()?]), AotConfig::default())?;
/// let x = Tensor::from_f64(&[1.0, -2.0, 3.0, 4.0], &[2, 2], DType::F64)?;
/// let w = Tensor::from_f64(&[1.0, 0.5, -1.0, 2.0], &[2, 2], DType::F64)?.requires_grad(true)?;
/// let (out, pending) = f.forward(&[x.clone(), w.clone()])?;
/// assert_eq!(out[0].item()?, 3.0 + 9.5); // x @ w = [[3, -3.5], [-1, 9.5]]
/// let grads = pending.backward(&[out[0].ones_like()?])?;
/// assert!(grads[0].is_none()); // x does not require grad
/// // d/dw = x^T · 1[x @ w > 0]
/// assert_eq!(grads[1].as_ref().unwrap().to_vec_f64()?, vec![1.0, 3.0, -2.0, 4.0]);
/// // Without grad the inference graph runs; a second call with the same metadata
/// // reuses the compiled entry.
/// let y = no_grad(|| f.call(&[x.clone(), w.clone()]))?;
/// assert_eq!(y[0].item()?, 12.5);
/// assert_eq!(f.num_compiled(), 2); // one training and one inference entry
/// # Ok::<(), aotgrad::Error>(())
/// ```
pub fn aot_function<F>(f: F, config: AotConfig) -> Result<AotFunction>
where
    F: Fn(&[Tensor]) -> crate::Result<Vec<Tensor>> + Send + Sync + 'static,
{
    aot_function_args(
        move |args: &[Arg]| {
            let tensors: Vec<Tensor> = args.iter().filter_map(|a| a.tensor().cloned()).collect();
            f(&tensors)
        },
        config,
    )
}

/// Compile a function whose arguments may also be plain values ([`Arg`]). A plain
/// value is a constant of the trace: a call with another value compiles another
/// entry, as PyTorch specializes on Python scalars.
///
/// ```
/// use aotgrad::prelude::*;
///
/// let scale = aot_function_args(
///     |a: &[Arg]| {
///         let (Some(x), Arg::Float(k)) = (a[0].tensor(), &a[1]) else {
///             return Err(aotgrad::Error::Internal("expected (tensor, float)".into()));
///         };
///         Ok(vec![x.mul(*k)?])
///     },
///     AotConfig::default(),
/// )?;
/// let x = Tensor::from_f64(&[1.0, 2.0], &[2], DType::F32)?;
/// let y = scale.call_args(&[Arg::Tensor(x.clone()), Arg::Float(0.5)])?;
/// assert_eq!(y[0].to_vec_f64()?, vec![0.5, 1.0]);
/// # Ok::<(), aotgrad::Error>(())
/// ```
pub fn aot_function_args<F>(f: F, config: AotConfig) -> Result<AotFunction>
where
    F: Fn(&[Arg]) -> crate::Result<Vec<Tensor>> + Send + Sync + 'static,
{
    aot_function_outs(move |a: &[Arg]| Ok(f(a)?.into_iter().map(Output::Tensor).collect()), config)
}

/// Compile a function that may also return plain values ([`Output`]): integers
/// (sizes of its tensors included, which follow each call's shapes under dynamic
/// dims) and `None`, as PyTorch's `aot_function` does. Call it with
/// [`AotFunction::call_outs`] or [`AotFunction::forward_outs`] (the other call methods
/// return its tensor outputs only).
///
/// ```
/// use aotgrad::prelude::*;
///
/// let f = aot_function_outs(
///     |a: &[Arg]| {
///         let x = a[0].tensor().expect("a tensor");
///         Ok(vec![Output::Tensor(x.mul(2.0)?), Output::Int(x.shape()[0].clone()), Output::None])
///     },
///     AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() },
/// )?;
/// let out = f.call_outs(&[Arg::Tensor(Tensor::ones(&[5, 2], DType::F32)?)])?;
/// assert_eq!(out[1].int(), Some(5));
/// assert!(out[2].is_none());
/// # Ok::<(), aotgrad::Error>(())
/// ```
pub fn aot_function_outs<F>(f: F, config: AotConfig) -> Result<AotFunction>
where
    F: Fn(&[Arg]) -> crate::Result<Vec<Output>> + Send + Sync + 'static,
{
    let cache = cached::CacheState::new(config.cache.clone());
    Ok(AotFunction {
        f: Some(Arc::new(f)),
        config,
        cache,
        entries: Mutex::new(Vec::new()),
        arity: Mutex::new(None),
        compile_lock: Mutex::new(()),
        compiling_thread: Mutex::new(None),
        lifted_args: 0,
    })
}

/// The backend's options for a functional graph: its mutated inputs, whose new
/// values (the first graph outputs) the backend may store in place. Every mutated
/// graph input overlaps no other graph input (aliased inputs a mutation reaches are
/// merged into a synthetic base, and an entry only runs on calls with its aliasing
/// pattern), and the epilogue skips the copy of a value already in place.
pub(crate) fn input_updates(fz: &Functionalized) -> aotgrad_ir::CompileOptions {
    aotgrad_ir::CompileOptions { input_updates: fz.meta.mutated_inputs.iter().copied().enumerate().collect() }
}

/// Symbol values of one call.
pub(crate) type Bindings = HashMap<SymId, i64>;

/// A call's symbol values, as the backends take them: every compiled graph of an
/// entry runs with the values its call bound, so a graph whose inputs do not carry a
/// symbol (a backward graph's sizes that only the forward's inputs determined, a size
/// such as `s0 + s1` that binds neither) still knows it.
pub(crate) fn given_symbols(env: &Bindings) -> Vec<(SymId, i64)> {
    let mut v: Vec<(SymId, i64)> = env.iter().map(|(s, x)| (*s, *x)).collect();
    v.sort_unstable();
    v
}

impl AotFunction {
    /// Call with tensor arguments.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let args: Vec<Arg> = args.iter().map(|t| Arg::Tensor(t.clone())).collect();
        self.call_args(&args)
    }

    /// Call with arguments that may be plain values. When grad mode is on and an
    /// argument requires grad, this runs the compiled forward (outputs require grad)
    /// and drops what the backward would need; use [`AotFunction::forward_args`] to
    /// keep it.
    pub fn call_args(&self, args: &[Arg]) -> Result<Vec<Tensor>> {
        let (entry, env) = self.entry_for(args)?;
        if entry.training.is_some() {
            return Ok(self.run_training(&entry, args, env)?.0);
        }
        epilogue::run(&self.config.name, &entry, args, &env)
    }

    /// Call a function compiled with [`aot_function_outs`]: its tensor and plain
    /// outputs in order (sizes evaluated for this call).
    pub fn call_outs(&self, args: &[Arg]) -> Result<Vec<Output>> {
        let (entry, env) = self.entry_for(args)?;
        let tensors = if entry.training.is_some() {
            self.run_training(&entry, args, env.clone())?.0
        } else {
            epilogue::run(&self.config.name, &entry, args, &env)?
        };
        self.assemble(&entry, &env, tensors)
    }

    /// [`AotFunction::forward_args`] for a function compiled with [`aot_function_outs`]:
    /// the outputs in order; the backward takes one gradient per *tensor* output.
    pub fn forward_outs(&self, args: &[Arg]) -> Result<(Vec<Output>, PendingBackward)> {
        let (entry, env) = self.entry_for(args)?;
        if entry.training.is_none() {
            return Err(self.call_error(
                "forward needs grad mode on and at least one argument that requires grad; use `call_outs`".into(),
            ));
        }
        let (tensors, pending) = self.run_training(&entry, args, env.clone())?;
        Ok((self.assemble(&entry, &env, tensors)?, pending))
    }

    /// The user's outputs in order: the call's tensors where the layout has them,
    /// integers evaluated with the call's bindings.
    fn assemble(&self, entry: &Entry, env: &Bindings, tensors: Vec<Tensor>) -> Result<Vec<Output>> {
        let mut tensors = tensors.into_iter();
        let lookup = |s: SymId| env.get(&s).copied();
        entry
            .m()
            .output_layout
            .iter()
            .map(|slot| match slot {
                OutputSlot::Tensor => tensors
                    .next()
                    .map(Output::Tensor)
                    .ok_or_else(|| Error::Internal("fewer tensor outputs than the output layout names".into())),
                OutputSlot::Int(d) => d
                    .eval(&lookup)
                    .map(|v| Output::Int(Dim::Const(v)))
                    .ok_or_else(|| Error::Internal(format!("output size {d} has unbound symbols"))),
                OutputSlot::None => Ok(Output::None),
            })
            .collect()
    }

    /// Run the compiled forward of the training path; the returned
    /// [`PendingBackward`] computes gradients for the arguments that require grad.
    pub fn forward(&self, args: &[Tensor]) -> Result<(Vec<Tensor>, PendingBackward)> {
        let args: Vec<Arg> = args.iter().map(|t| Arg::Tensor(t.clone())).collect();
        self.forward_args(&args)
    }

    /// [`AotFunction::forward`] with arguments that may be plain values.
    pub fn forward_args(&self, args: &[Arg]) -> Result<(Vec<Tensor>, PendingBackward)> {
        let (entry, env) = self.entry_for(args)?;
        if entry.training.is_none() {
            return Err(self.call_error(
                "forward needs grad mode on and at least one argument that requires grad; use `call`".into(),
            ));
        }
        self.run_training(&entry, args, env)
    }

    /// Compile (trace, functionalize, differentiate, partition, compile) for calls
    /// like `args` without running anything; a no-op when such an entry exists.
    pub fn compile_for(&self, args: &[Arg]) -> Result<()> {
        self.entry_for(args).map(drop)
    }

    fn entry_for(&self, args: &[Arg]) -> Result<(Arc<Entry>, Bindings)> {
        let _span = tracing::trace_span!("aot_call", name = %self.config.name).entered();
        self.check_arity(args)?;
        for (i, a) in args.iter().enumerate() {
            if a.tensor().is_some_and(Tensor::is_fake) {
                return Err(self.call_error(format!("argument {i} is a fake tensor; call with real tensors")));
            }
        }
        let sig = call_sig(args);
        if let Some(found) = self.lookup(&sig, args) {
            return Ok(found);
        }
        let me = std::thread::current().id();
        let nested = *self.compiling_thread.lock().unwrap_or_else(|e| e.into_inner()) == Some(me);
        let _lock = if nested { None } else { Some(self.compile_lock.lock().unwrap_or_else(|e| e.into_inner())) };
        let _holder = if nested {
            None
        } else {
            *self.compiling_thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
            Some(CompilingGuard(&self.compiling_thread))
        };
        // Another thread may have compiled this signature while we waited.
        if let Some(found) = self.lookup(&sig, args) {
            return Ok(found);
        }
        let entry = Arc::new(self.make_entry(sig, args)?);
        if entry.source == EntrySource::Compiled {
            let r = entry.report();
            let stages: Vec<String> = r.stages.iter().map(|(s, t)| format!("{s} {:.2} ms", t * 1e3)).collect();
            tracing::info!(
                target: "aotgrad::compile",
                "compiled `{}` ({}, {} traced nodes) in {:.2} ms on {}: {}",
                self.config.name,
                if r.training { "training" } else { "inference" },
                entry.m().traced_nodes,
                r.total_seconds() * 1e3,
                r.backend,
                stages.join(", ")
            );
        }
        let env = entry_bindings(&entry, args).ok_or_else(|| {
            Error::Internal("a freshly compiled entry does not accept the call that traced it".into())
        })?;
        self.lock_entries().push(entry.clone());
        Ok((entry, env))
    }

    fn run_training(&self, entry: &Arc<Entry>, args: &[Arg], env: Bindings) -> Result<(Vec<Tensor>, PendingBackward)> {
        training::run_forward(&self.config.name, entry, args, env)
    }

    /// How many specializations have been compiled.
    pub fn num_compiled(&self) -> usize {
        self.lock_entries().len()
    }

    /// The functional graphs compiled so far (one per specialization).
    pub fn compiled_graphs(&self) -> Vec<Graph> {
        self.graphs_of(GraphKind::Functional)
    }

    /// The functionalization results (graph, view/mutation metadata, calling
    /// convention) compiled so far, one per specialization.
    pub fn functionalized(&self) -> Vec<Functionalized> {
        self.lock_entries()
            .iter()
            .filter_map(|e| {
                let m = e.m();
                Some(Functionalized {
                    graph: e.result.graphs.graph(GraphKind::Functional)?.as_ref().clone(),
                    meta: m.meta.clone(),
                    convention: m.convention.clone(),
                    autograd: AutogradFacts {
                        detached: m.detached.clone(),
                        straight_through: m.straight_through.clone(),
                    },
                })
            })
            .collect()
    }

    /// For training entries: the forward and backward graphs and the partition report.
    pub fn training_graphs(&self) -> Vec<(Graph, Graph, aotgrad_partition::PartitionReport)> {
        self.lock_entries()
            .iter()
            .filter_map(|e| {
                let t = e.m().training.as_ref()?;
                let g = &e.result.graphs;
                let fw = g.graph(GraphKind::Forward)?;
                let bw = g.graph(GraphKind::Backward)?;
                Some((fw.as_ref().clone(), bw.as_ref().clone(), t.partition.clone()))
            })
            .collect()
    }

    /// For training entries: the joint graphs (after simplification).
    pub fn joint_graphs(&self) -> Vec<aotgrad_autodiff::JointGraph> {
        self.lock_entries()
            .iter()
            .filter_map(|e| {
                let t = e.m().training.as_ref()?;
                let graph = e.result.graphs.graph(GraphKind::Joint)?.as_ref().clone();
                Some(aotgrad_autodiff::JointGraph {
                    graph,
                    num_primals: t.num_primals,
                    num_tangents: t.num_tangents,
                    num_fw_outputs: t.num_fw_outputs,
                    tangent_outputs: t.tangent_outputs.clone(),
                    grad_primals: t.grad_primals.clone(),
                })
            })
            .collect()
    }

    /// How each specialization compiled so far was compiled (path, backend, stage
    /// times) and whether it was loaded.
    pub fn compile_reports(&self) -> Vec<CompileReport> {
        self.lock_entries().iter().map(|e| e.report()).collect()
    }

    /// The traced (pre-functionalization) graphs compiled so far.
    pub fn traced_graphs(&self) -> Vec<Graph> {
        self.graphs_of(GraphKind::Traced)
    }

    /// The compiled results, one per specialization (what the cache stores).
    pub fn results(&self) -> Vec<Arc<AotResult<CpuTensor>>> {
        self.lock_entries().iter().map(|e| e.result.clone()).collect()
    }

    fn graphs_of(&self, which: GraphKind) -> Vec<Graph> {
        self.lock_entries().iter().filter_map(|e| e.result.graphs.graph(which).map(|g| g.as_ref().clone())).collect()
    }

    fn lock_entries(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn call_error(&self, msg: String) -> Error {
        Error::Call { name: self.config.name.clone(), msg }
    }

    fn check_arity(&self, args: &[Arg]) -> Result<()> {
        let mut arity = self.arity.lock().unwrap_or_else(|e| e.into_inner());
        match *arity {
            Some(n) if n != args.len() => {
                Err(self.call_error(format!("expected {n} argument(s) (as in its first call), got {}", args.len())))
            }
            Some(_) => Ok(()),
            None => {
                *arity = Some(args.len());
                Ok(())
            }
        }
    }

    fn lookup(&self, sig: &CallSig, args: &[Arg]) -> Option<(Arc<Entry>, Bindings)> {
        let entries = self.lock_entries();
        entries.iter().filter(|e| e.m().sig == *sig).find_map(|e| entry_bindings(e, args).map(|env| (e.clone(), env)))
    }

    /// Trace the call, then load its result from the cache or compile it.
    fn make_entry(&self, sig: CallSig, args: &[Arg]) -> Result<Entry> {
        let Some(f) = self.f.clone() else {
            return Err(self.call_error(format!(
                "this function was loaded from a precompiled file and none of its {} specialization(s) accepts \
                 this call ({}); precompile it for calls like this one",
                self.num_compiled(),
                cached::describe_call(args)
            )));
        };
        let mut timer = StageTimer::new();
        let call = self.trace_call(&f, &sig, args)?;
        timer.stage("trace");
        let key = self.cache.key_for(&self.config, &sig, &call.traced, &call.layout);
        if let Some(key) = &key {
            if let Some(entry) = self.cache.load(&self.config, key, args)? {
                return Ok(entry);
            }
        }
        let result = Arc::new(self.compile_traced(sig, call, timer)?);
        if let Some(key) = &key {
            self.cache.store(key, &result);
        }
        Entry::instantiate(result, self.config.backend.as_ref(), EntrySource::Compiled)
    }

    fn trace_call(&self, f: &Arc<UserFn>, sig: &CallSig, args: &[Arg]) -> Result<TracedCall> {
        let _span = tracing::debug_span!("aot_trace", name = %self.config.name).entered();
        // Dedupe: one traced input per distinct tensor object (the signature names,
        // for each argument, the first argument that is the same object).
        let mut traced_args: Vec<usize> = Vec::new();
        let mut slot_of_arg: Vec<Option<usize>> = Vec::with_capacity(args.len());
        for (i, a) in sig.args.iter().enumerate() {
            slot_of_arg.push(match *a {
                ArgSig::Tensor { same_object_as, .. } if same_object_as == i => {
                    traced_args.push(i);
                    Some(traced_args.len() - 1)
                }
                ArgSig::Tensor { same_object_as, .. } => slot_of_arg.get(same_object_as).copied().flatten(),
                _ => None,
            });
        }
        let examples: Vec<Tensor> = traced_args.iter().filter_map(|&i| args[i].tensor().cloned()).collect();
        let mut dynamic = Vec::new();
        for &(arg, dim) in &self.config.dynamic {
            match slot_of_arg.get(arg).copied().flatten() {
                Some(k) if traced_args[k] == arg => dynamic.push((k, dim)),
                Some(_) => {}
                None => {
                    return Err(self.call_error(format!("dynamic dim given for argument {arg}, which is not a tensor")))
                }
            }
        }
        let tc = TraceConfig {
            dynamic,
            duck_shape: self.config.duck_shape,
            decomps: self.config.decomps.clone(),
            input_names: Some(
                traced_args
                    .iter()
                    .map(|&i| {
                        self.config
                            .arg_names
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| format!("arg{}", i.saturating_sub(self.lifted_args)))
                    })
                    .collect(),
            ),
        };
        let f = f.clone();
        let consts: Vec<Arg> = args.to_vec();
        let slots = slot_of_arg.clone();
        let layout_cell: Arc<Mutex<Vec<OutputSlot>>> = Arc::new(Mutex::new(Vec::new()));
        let layout_out = layout_cell.clone();
        let traced = trace(
            move |fakes: &[Tensor]| {
                let call: Vec<Arg> = consts
                    .iter()
                    .zip(&slots)
                    .map(|(a, slot)| match slot {
                        Some(k) => Arg::Tensor(fakes[*k].clone()),
                        None => a.clone(),
                    })
                    .collect();
                let outs = f(&call).map_err(aotgrad_trace::Error::from)?;
                let mut layout = layout_out.lock().unwrap_or_else(|e| e.into_inner());
                layout.clear();
                let mut tensors = Vec::with_capacity(outs.len());
                for o in outs {
                    match o {
                        Output::Tensor(t) => {
                            layout.push(OutputSlot::Tensor);
                            tensors.push(t);
                        }
                        Output::Int(d) => layout.push(OutputSlot::Int(d)),
                        Output::None => layout.push(OutputSlot::None),
                    }
                }
                Ok(tensors)
            },
            &examples,
            &tc,
        )?;
        let layout = std::mem::take(&mut *layout_cell.lock().unwrap_or_else(|e| e.into_inner()));
        tracing::debug!(target: "aotgrad::trace", "traced graph:\n{}", aotgrad_ir::text::print_graph(&traced.graph));
        Ok(TracedCall { traced, traced_args, slot_of_arg, layout })
    }

    /// Functionalize and compile a traced call into a fresh [`AotResult`].
    fn compile_traced(&self, sig: CallSig, call: TracedCall, mut timer: StageTimer) -> Result<AotResult<CpuTensor>> {
        let _span = tracing::debug_span!("aot_compile", name = %self.config.name).entered();
        let TracedCall { traced, traced_args, slot_of_arg, layout } = call;
        let value_rg = traced.value_requires_grad.clone();
        // Autograd sees nothing of a trace run under no-grad (inputs included).
        let grad_on = sig.grad_enabled;
        let hidden = move |v: ValueId| !grad_on || !value_rg.get(v.0 as usize).copied().unwrap_or(false);
        let facts = TraceFacts {
            input_requires_grad: &traced.input_requires_grad,
            output_requires_grad: &traced.output_requires_grad,
            output_no_grad_view: &traced.output_no_grad_view,
            detach_values: &traced.detach_values,
            input_tracked_from: &traced.input_tracked_from,
            hidden_mutation: &hidden,
        };
        // The training path returns every new input value (it gets a gradient): keeping
        // mutations inside the graph is for inference graphs only.
        let training_path = sig.grad_enabled && traced.input_requires_grad.iter().any(|&r| r);
        let options = Options { keep_input_mutations: self.config.keep_inference_input_mutations && !training_path };
        let mut env: ShapeEnv = traced.shape_env.clone();
        let fz = functionalize(&traced.graph, &facts, &options, &mut env)?;
        timer.stage("functionalize");
        let backend = self.config.backend.as_ref();
        let (forward, backward, training, joint_graphs) = if training_path {
            let c = training::compile_training(
                &fz,
                &mut env,
                &self.config.partitioner,
                self.config.simplify,
                backend,
                &mut timer,
            )?;
            (c.fw, Some(c.bw), Some(c.meta), Some(c.graphs))
        } else {
            let compiled = backend.compile_with(&fz.graph, &input_updates(&fz))?;
            timer.stage("backend");
            (Arc::from(compiled), None, None, None)
        };
        let graph_output_metas = fz
            .graph
            .outputs
            .iter()
            .map(|&v| {
                fz.graph.meta_of(v).cloned().ok_or_else(|| Error::Internal(format!("graph output {v} has no meta")))
            })
            .collect::<Result<Vec<_>>>()?;
        let (joint, fw_graph, bw_graph) = match joint_graphs {
            Some([j, f, b]) => (Some(j), Some(f), Some(b)),
            None => (None, None, None),
        };
        let backward_errors = if training_path {
            // Leaf arguments (not views): their gradient accumulates into `.grad`.
            let is_leaf: Vec<bool> = (0..traced.graph.inputs.len())
                .map(|k| {
                    let arg = traced_args.get(k).and_then(|&i| sig.args.get(i));
                    matches!(arg, Some(ArgSig::Tensor { leafness: Some(l), .. }) if l.is_leaf && l.base.is_none())
                })
                .collect();
            let is_view: Vec<bool> = (0..traced.graph.inputs.len())
                .map(|k| {
                    let arg = traced_args.get(k).and_then(|&i| sig.args.get(i));
                    !matches!(arg, Some(ArgSig::Tensor { leafness: Some(l), .. }) if l.base.is_none())
                })
                .collect();
            saved_versions::saved_version_errors(&traced, &is_leaf, &is_view)
        } else {
            Vec::new()
        };
        let meta = ResultMeta {
            name: self.config.name.clone(),
            sig,
            input_metas: traced.graph.inputs.iter().map(|i| i.meta.clone()).collect(),
            traced_args,
            slot_of_arg,
            guards: traced.shape_env.guards().to_vec(),
            rng: traced.rng.map(|r| RngSlots { seed_input: r.seed_input, base_input: r.base_input, ops: r.ops }),
            meta: fz.meta.clone(),
            convention: fz.convention.clone(),
            graph_inputs: fz.graph.inputs.len(),
            graph_output_metas,
            detached: fz.autograd.detached.clone(),
            straight_through: fz.autograd.straight_through.clone(),
            backward_errors,
            output_layout: layout,
            made_requires_grad: (0..traced.input_made_requires_grad.len())
                .filter(|&k| traced.input_made_requires_grad[k])
                .collect(),
            version_bumps: version_bumps(&traced.graph, traced.rng.as_ref()),
            training,
            backend: backend.name().to_string(),
            backend_identity: backend.cache_identity().unwrap_or_default(),
            traced_nodes: traced.graph.nodes.len(),
            stages: timer.into_stages(),
        };
        Ok(AotResult {
            meta,
            forward: Artifact::live(forward),
            backward: backward.map(Artifact::live),
            graphs: GraphDumps::live(traced.graph, fz.graph, joint, fw_graph, bw_graph),
        })
    }
}

/// A traced call: the trace and how the call's arguments map to its inputs.
pub(crate) struct TracedCall {
    traced: Traced,
    /// Traced input `k` is user argument `traced_args[k]`.
    traced_args: Vec<usize>,
    /// The traced input of each user argument (`None` for non-tensors; an argument
    /// passed twice maps to one traced input).
    slot_of_arg: Vec<Option<usize>>,
    /// The user's outputs in order (tensors and plain values).
    layout: Vec<OutputSlot>,
}

/// Bind the entry's symbols from the call's tensors and check its guards.
fn entry_bindings(entry: &Entry, args: &[Arg]) -> Option<Bindings> {
    result_bindings(entry.m(), args)
}

/// Bind a result's symbols from the call's tensors and check its guards.
pub(crate) fn result_bindings(m: &ResultMeta, args: &[Arg]) -> Option<Bindings> {
    if m.slot_of_arg.len() != args.len() {
        return None;
    }
    let mut env = Bindings::new();
    for (k, &i) in m.traced_args.iter().enumerate() {
        let t = args.get(i)?.tensor()?;
        if !bind(m.input_metas.get(k)?, &t.meta(), &mut env) {
            return None;
        }
    }
    let lookup = |s: SymId| env.get(&s).copied();
    m.guards.iter().all(|g| g.check(&lookup)).then_some(env)
}

/// Evaluate traced metadata under a call's bindings.
pub(crate) fn concrete(meta: &TensorMeta, env: &Bindings) -> Result<TensorMeta> {
    let m = meta.subst(&|s| env.get(&s).copied());
    if m.is_concrete() {
        Ok(m)
    } else {
        Err(Error::Internal(format!("metadata {m} has unbound symbols")))
    }
}

/// The caller's tensor for traced input `k`.
/// Per traced input (the random generator's excepted): how many in-place ops of the
/// traced graph ran on its storage, where that is not zero (see
/// `ResultMeta::version_bumps`).
fn version_bumps(g: &aotgrad_ir::Graph, rng: Option<&aotgrad_trace::RngInputs>) -> Vec<(usize, u64)> {
    let mut per_storage: HashMap<aotgrad_ir::StorageId, u64> = HashMap::new();
    for n in g.nodes.iter().filter(|n| n.op.is_mutation()) {
        *per_storage.entry(n.storage).or_default() += 1;
    }
    g.inputs
        .iter()
        .enumerate()
        .filter(|(k, _)| rng.is_none_or(|r| *k != r.seed_input && *k != r.base_input))
        .filter_map(|(k, inp)| per_storage.get(&inp.storage).map(|&n| (k, n)))
        .collect()
}

pub(crate) fn traced_input<'a>(entry: &Entry, args: &'a [Arg], k: usize) -> Result<&'a Tensor> {
    entry
        .m()
        .traced_args
        .get(k)
        .and_then(|&i| args.get(i))
        .and_then(Arg::tensor)
        .ok_or_else(|| Error::Internal(format!("traced input {k} has no tensor argument")))
}

/// Every synthetic base covers storage elements the traced call reached: this call's
/// storages must hold them too (eager would fail reading them). Checked before
/// anything is drawn from the random generator or run.
fn check_bases_fit(name: &str, entry: &Entry, args: &[Arg]) -> Result<()> {
    for b in &entry.m().convention.bases {
        let Some(&k) = b.members.first() else { continue };
        let storage_len = traced_input(entry, args, k)?.to_cpu()?.storage.len();
        if b.offset.checked_add(b.len).is_none_or(|end| end > storage_len) {
            let arg =
                entry.m().traced_args.get(k).map_or_else(|| format!("traced input {k}"), |i| format!("argument {i}"));
            return Err(Error::Call {
                name: name.to_string(),
                msg: format!(
                    "{arg}: the compiled function reads storage elements {}..{} of its storage (it views them with \
                     as_strided, or through an argument aliasing it), but this call's storage has only {storage_len} \
                     elements",
                    b.offset,
                    b.offset.saturating_add(b.len)
                ),
            });
        }
    }
    Ok(())
}

/// Build the graph inputs from the caller's tensors (synthetic bases as 1-D views).
pub(crate) fn graph_inputs(name: &str, entry: &Entry, args: &[Arg]) -> Result<Vec<CpuTensor>> {
    check_bases_fit(name, entry, args)?;
    let conv = &entry.m().convention;
    let mut inputs: Vec<Option<CpuTensor>> = vec![None; conv.num_graph_inputs];
    // The generator state for this call (the graph draws from it; see `aotgrad_trace::rng`).
    let rng = entry.m().rng.map(|r| {
        let (seed, base) = aotgrad_trace::rng::take_rng(r.ops);
        (r, seed as i64, base as i64)
    });
    for (k, slot) in conv.args.iter().enumerate() {
        let t = match rng {
            Some((r, seed, _)) if k == r.seed_input => CpuTensor::from_i64(&[seed], &[], aotgrad_ir::DType::I64)?,
            Some((r, _, base)) if k == r.base_input => CpuTensor::from_i64(&[base], &[], aotgrad_ir::DType::I64)?,
            _ => traced_input(entry, args, k)?.to_cpu()?,
        };
        match slot {
            ArgSlot::Input(g) => inputs[*g] = Some(t),
            ArgSlot::ViewOfBase { base } => {
                let b = &conv.bases[*base];
                if inputs[b.input].is_none() {
                    inputs[b.input] = Some(CpuTensor { storage: t.storage.clone(), meta: b.meta(t.meta.dtype) });
                }
            }
        }
    }
    inputs
        .into_iter()
        .enumerate()
        .map(|(g, t)| t.ok_or_else(|| Error::Internal(format!("graph input {g} unset"))))
        .collect()
}

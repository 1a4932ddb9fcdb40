//! The compiled callable, [`AotFunction`], and the functions that make one
//! ([`aot_function`], [`aot_function_args`], [`aot_function_outs`]).
//!
//! An `AotFunction` drives each call through the stages of the crate (see the crate
//! docs) in one direction: signature → entry (lookup and guards; on a miss the cache,
//! else the compiler) → bind → run → epilogue → outputs or pending backward. The
//! stages never call back into it.

use crate::backward::PendingBackward;
use crate::cache::{describe_call, CacheState, CacheStats};
use crate::compile::{compile_traced, trace_call, StageTimer, UserFn};
use crate::config::AotConfig;
use crate::entry::{entry_bindings, CompileReport, Entry, EntrySource};
use crate::error::{Error, Result};
use crate::run::{run_forward, run_inference};
use crate::signature::{call_sig, Arg, Bindings, Output};
use aotgrad_cache::{AotResult, CallSig, GraphKind, OutputSlot};
use aotgrad_cpu::CpuTensor;
use aotgrad_functionalize::{AutogradFacts, Functionalized};
use aotgrad_ir::{Dim, Graph, SymId};
use aotgrad_trace::Tensor;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A function compiled ahead of time; call it like the original.
pub struct AotFunction {
    /// The user's function (`None` for a function loaded from a precompiled file).
    f: Option<Arc<UserFn>>,
    config: AotConfig,
    /// The result cache (from [`AotConfig::cache`]), and what it did.
    cache: CacheState,
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
    let cache = CacheState::new(config.cache.clone());
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
        run_inference(&self.config.name, &entry, args, &env)
    }

    /// Call a function compiled with [`aot_function_outs`]: its tensor and plain
    /// outputs in order (sizes evaluated for this call).
    pub fn call_outs(&self, args: &[Arg]) -> Result<Vec<Output>> {
        let (entry, env) = self.entry_for(args)?;
        let tensors = if entry.training.is_some() {
            self.run_training(&entry, args, env.clone())?.0
        } else {
            run_inference(&self.config.name, &entry, args, &env)?
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
        run_forward(&self.config.name, entry, args, env)
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
                describe_call(args)
            )));
        };
        let mut timer = StageTimer::new();
        let call = trace_call(&self.config, self.lifted_args, &f, &sig, args)?;
        timer.stage("trace");
        let key = self.cache.key_for(&self.config, &sig, &call.traced, &call.layout);
        if let Some(key) = &key {
            if let Some(entry) = self.cache.load(&self.config, key, args)? {
                return Ok(entry);
            }
        }
        let result = Arc::new(compile_traced(&self.config, sig, call, timer)?);
        if let Some(key) = &key {
            self.cache.store(key, &result);
        }
        Entry::instantiate(result, self.config.backend.as_ref(), EntrySource::Compiled)
    }
}

/// The result cache's counters and precompiled files (stage 1a's other side).
impl AotFunction {
    /// What the result cache did for this function: hits, misses, guard misses,
    /// bypasses, rejected entries, and why.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Save every specialization compiled so far as one bundled, checksummed file that
    /// [`AotFunction::load_precompiled`] turns back into a callable in another
    /// process, without the user's function (deployment). With a cache key in the
    /// environment (`AOTGRAD_CACHE_KEY` or `AOTGRAD_CACHE_KEY_FILE`, as for the cache)
    /// the file is signed with it, and only a process holding the key loads it.
    pub fn save_precompiled(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let entries = self.lock_entries();
        if entries.is_empty() {
            return Err(self.call_error("nothing to save: call or `compile_for` the function first".into()));
        }
        let results: Vec<&AotResult<CpuTensor>> = entries.iter().map(|e| e.result.as_ref()).collect();
        if let Some(r) = results.iter().find(|r| r.meta.backend_identity.is_empty()) {
            return Err(Error::Cache(format!(
                "backend `{}` declares no cache identity: its compiled artifacts cannot be saved (another process \
                 could not tell whether it can run them)",
                r.meta.backend
            )));
        }
        let key = aotgrad_cache::mac_key_from_env().map_err(Error::Cache)?;
        let bytes = aotgrad_cache::encode_precompiled(&results, key.as_ref()).map_err(Error::Cache)?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, &bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| Error::Cache(format!("cannot write {}: {e}", path.display())))
    }

    /// Load a function saved with [`AotFunction::save_precompiled`]: a callable that
    /// runs the saved specializations with `config`'s backend, which must match the
    /// one that compiled them (name, artifact format, target features, version). A
    /// call that no saved specialization accepts is an error (there is nothing to
    /// trace). With a cache key in the environment the file must be signed with it;
    /// without one, a signed file is refused (it cannot be checked). Every result is
    /// checked for consistency, and its artifacts against it, before it is used.
    pub fn load_precompiled(path: impl AsRef<Path>, config: AotConfig) -> Result<AotFunction> {
        let path = path.as_ref();
        let bytes = aotgrad_cache::read_regular_file(path, aotgrad_cache::MAX_BLOB_BYTES)
            .map_err(|e| Error::Cache(format!("cannot read {}: {e}", path.display())))?;
        let key = aotgrad_cache::mac_key_from_env().map_err(Error::Cache)?;
        let stored = aotgrad_cache::decode_precompiled(&bytes, key.as_ref())
            .map_err(|e| Error::Cache(format!("{} is not a usable precompiled function: {e}", path.display())))?;
        let mut entries = Vec::with_capacity(stored.len());
        let mut arity = None;
        for s in stored {
            arity = Some(s.meta.slot_of_arg.len());
            let result = AotResult::from_stored(s, |h, _| {
                Err(format!("artifact {h} is referenced, but a precompiled file bundles its artifacts"))
            })
            .map_err(Error::Cache)?;
            let entry = Entry::instantiate(Arc::new(result), config.backend.as_ref(), EntrySource::Precompiled)
                .map_err(|e| Error::Cache(format!("{}: {e}", path.display())))?;
            entries.push(Arc::new(entry));
        }
        let cache = CacheState::new(None);
        Ok(AotFunction {
            f: None,
            config,
            cache,
            entries: Mutex::new(entries),
            arity: Mutex::new(arity),
            compile_lock: Mutex::new(()),
            compiling_thread: Mutex::new(None),
            lifted_args: 0,
        })
    }
}

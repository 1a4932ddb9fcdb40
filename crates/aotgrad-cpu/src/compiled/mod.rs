//! The compiled CPU backend: executes the [`aotgrad_fusion`] kernel plan of a graph.
//!
//! Compiling plans the graph once (fusion groups, views as index arithmetic, liveness
//! slots) and, when its shapes are static, lowers it to concrete kernels right away; a
//! dynamic graph is lowered once per binding of its symbols and cached. A call binds
//! and checks its inputs exactly as the reference interpreter does, takes an arena of
//! slots from the graph's pool (allocated on the first call, then reused), allocates
//! only its outputs, and runs every kernel on the backend's threads. Graphs the planner
//! does not cover (mutations, composite ops) run on the reference interpreter.
//!
//! Threads: [`CpuBackend::new`] takes a thread count (`1` is deterministic and never
//! touches a thread pool; more use a rayon pool of that size, shared by every graph
//! with the same count). Reductions partition only over outputs, so their results do
//! not depend on the thread count.

mod check;
mod code;
mod exec;
#[cfg_attr(not(target_arch = "x86_64"), path = "jit_stub.rs")]
mod jit;
mod kernels;
mod lower;
pub(crate) mod math;
pub(crate) mod pool;
mod run;
pub(crate) mod target;

use crate::interp::bind_inputs;
use crate::storage::CpuTensor;
use crate::{interpret_with_symbols, CpuError};
use aotgrad_fusion::{plan_graph_with, print_plan, KernelPlan, PlanError, PlanOptions};
use aotgrad_ir::{Backend, BackendError, CompileOptions, CompiledGraph, Dim, Graph, SymId};
use kernels::{CKernel, Loc, Lowered};
pub use run::AllocStats;
use run::{Binding, Instance};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const NAME: &str = "cpu";

fn err(msg: impl ToString) -> BackendError {
    BackendError { backend: NAME.into(), msg: msg.to_string() }
}

/// The compiled CPU backend (see the module docs).
#[derive(Clone, Debug)]
pub struct CpuBackend {
    threads: usize,
    jit: bool,
}

impl Default for CpuBackend {
    /// All cores.
    fn default() -> Self {
        CpuBackend::new(0)
    }
}

impl CpuBackend {
    /// A backend running on `threads` threads (`0`: one per available core).
    pub fn new(threads: usize) -> CpuBackend {
        let threads =
            if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        CpuBackend { threads, jit: true }
    }
    /// Whether fused pointwise bodies run as machine code (on x86-64 with AVX-512,
    /// unless `AOTGRAD_JIT=0`; the default) or all on the block interpreter. Results
    /// are the same either way (the differential suite runs both).
    pub fn jit(mut self, on: bool) -> CpuBackend {
        self.jit = on;
        self
    }
    /// Whether this backend's graphs run compiled pointwise kernels on this machine.
    pub fn jit_active(&self) -> bool {
        self.jit && jit::available()
    }
    /// The instruction set this backend's compiled kernels use (`"avx512"` or
    /// `"avx2"`; `None`: everything runs on the block interpreter). AVX2 code covers
    /// bodies of up to 7 live values and, among reductions, sums and means.
    pub fn jit_isa(&self) -> Option<&'static str> {
        if !self.jit_active() {
            return None;
        }
        jit::isa_name()
    }
    /// Threads a compiled graph runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// Compile to the concrete type (for inspecting the plan).
    pub fn compile_graph(&self, graph: &Graph) -> Result<CpuCompiledGraph, BackendError> {
        self.compile_graph_with(graph, &CompileOptions::default())
    }
    /// [`CpuBackend::compile_graph`] with [`CompileOptions`] (mutated inputs the plan
    /// may update in place).
    pub fn compile_graph_with(&self, graph: &Graph, opts: &CompileOptions) -> Result<CpuCompiledGraph, BackendError> {
        CpuCompiledGraph::new(graph.clone(), self.threads, self.jit, opts.input_updates.clone())
    }
}

/// Wait up to `timeout` until the JIT has compiled every pointwise kernel handed to it
/// so far (compilation is tiered: a graph's first calls may run its kernels on the
/// interpreter while the `aotgrad-jit` thread compiles them); whether it has. For
/// benchmarks that time steady-state calls.
pub fn wait_for_jit_idle(timeout: std::time::Duration) -> bool {
    jit::wait_idle(timeout)
}

fn pool_for(threads: usize) -> Result<Option<Arc<pool::Pool>>, BackendError> {
    if threads <= 1 {
        return Ok(None);
    }
    pool::Pool::shared(threads).map(Some).map_err(|e| err(format!("could not start {threads} worker threads: {e}")))
}

/// A kernel plan, decoded when first needed (a loaded graph with a static plan runs
/// its lowered form and needs the plan only to print or save it) and its encoding
/// kept for saving.
struct LazyPlan {
    plan: OnceLock<KernelPlan>,
    encoded: OnceLock<Vec<u8>>,
    /// Read from an artifact (not planned in this process): what lowering it finds
    /// wrong is the artifact's fault, not a bug.
    stored: bool,
}

impl LazyPlan {
    fn new(plan: KernelPlan) -> LazyPlan {
        let cell = OnceLock::new();
        let _ = cell.set(plan);
        LazyPlan { plan: cell, encoded: OnceLock::new(), stored: false }
    }
    fn encoded_only(bytes: Vec<u8>) -> LazyPlan {
        let encoded = OnceLock::new();
        let _ = encoded.set(bytes);
        LazyPlan { plan: OnceLock::new(), encoded, stored: true }
    }
    /// The plan (decoded from its encoding on first use).
    fn get(&self) -> Result<&KernelPlan, CpuError> {
        if let Some(p) = self.plan.get() {
            return Ok(p);
        }
        let bytes = self.encoded.get().map(Vec::as_slice).unwrap_or_default();
        let p: KernelPlan = aotgrad_ir::codec::decode("cpu artifact plan", bytes)
            .map_err(|e| CpuError::kernel("artifact", format!("its kernel plan does not decode: {e}")))?;
        // Indices in a stored plan are checked before anything indexes with them.
        p.validate().map_err(|e| CpuError::kernel("artifact", format!("its kernel plan is invalid: {e}")))?;
        Ok(self.plan.get_or_init(|| p))
    }
    /// The plan, or `None` (logged) when a stored one does not decode.
    fn get_logged(&self) -> Option<&KernelPlan> {
        self.get().map_err(|e| tracing::warn!(target: "aotgrad::cpu", "{e}")).ok()
    }
    fn encoded(&self) -> &[u8] {
        self.encoded.get_or_init(|| match self.plan.get() {
            Some(p) => aotgrad_ir::codec::encode("cpu artifact plan", p).unwrap_or_default(),
            None => Vec::new(),
        })
    }
}

/// A graph compiled by [`CpuBackend`].
pub struct CpuCompiledGraph {
    graph: LazyGraph,
    plan: Option<LazyPlan>,
    /// The mutated inputs the plan was asked to update in place ([`CompileOptions`]).
    input_updates: Vec<(usize, usize)>,
    fallback: Option<PlanError>,
    threads: usize,
    /// Whether lowered plans get machine code for their pointwise kernels.
    jit: bool,
    pool: Option<Arc<pool::Pool>>,
    fixed: Option<Arc<Instance>>,
    by_binding: Mutex<HashMap<Binding, Arc<Instance>>>,
    stats: Mutex<AllocStats>,
    /// Per kernel: (seconds, calls) when `AOTGRAD_CPU_PROFILE` is set.
    profile: Option<Mutex<Vec<(f64, usize)>>>,
}

fn profiling() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("AOTGRAD_CPU_PROFILE").is_some_and(|v| !v.is_empty() && v != "0"))
}

impl Drop for CpuCompiledGraph {
    /// With `AOTGRAD_CPU_PROFILE=1`, print where this graph's calls spent their time.
    fn drop(&mut self) {
        let (Some(prof), Some(plan)) = (&self.profile, self.plan.as_ref().and_then(LazyPlan::get_logged)) else {
            return;
        };
        let prof = prof.lock().unwrap_or_else(|e| e.into_inner());
        let total: f64 = prof.iter().map(|p| p.0).sum();
        if total == 0.0 {
            return;
        }
        // `AOTGRAD_CPU_PROFILE=all` lists every kernel in plan order, else the slowest 12.
        let all = std::env::var("AOTGRAD_CPU_PROFILE").is_ok_and(|v| v == "all");
        let mut order: Vec<usize> = (0..prof.len()).collect();
        if !all {
            order.sort_by(|a, b| prof[*b].0.total_cmp(&prof[*a].0));
            order.truncate(12);
        }
        eprintln!(
            "aotgrad-cpu profile: {} nodes, {} kernels, {:.3} ms in kernels",
            plan.graph_nodes,
            plan.kernels.len(),
            total * 1e3
        );
        let dims = |d: &[aotgrad_ir::Dim]| {
            let v: Vec<String> = d.iter().map(|d| d.to_string()).collect();
            format!("[{}]", v.join(", "))
        };
        for &k in &order {
            let kern = &plan.kernels[k];
            let what = match kern {
                aotgrad_fusion::Kernel::Pointwise(p) => format!("{} nodes over {}", p.nodes, dims(&p.shape)),
                aotgrad_fusion::Kernel::Reduce(r) => {
                    format!("{} {} nodes over {}", r.op.name(), r.nodes, dims(&r.shape))
                }
                aotgrad_fusion::Kernel::Matmul(m) => format!(
                    "{}x{}{}",
                    dims(&m.a.shape),
                    dims(&m.b.shape),
                    if m.epilogue.is_some() { " + epilogue" } else { "" }
                ),
                aotgrad_fusion::Kernel::Extern(e) => e.op.name(),
                aotgrad_fusion::Kernel::Rows(r) => {
                    let kinds: Vec<&str> = r.stages.iter().map(|s| s.kind_name()).collect();
                    format!("{} nodes over {} ({})", kern.nodes(), dims(&r.shape), kinds.join(" "))
                }
            };
            eprintln!(
                "  k{k:<4} {:>5.1}% {:>9.3} ms/call  {} {what}",
                100.0 * prof[k].0 / total,
                prof[k].0 * 1e3 / prof[k].1.max(1) as f64,
                kern.kind_name()
            );
        }
    }
}

impl std::fmt::Debug for CpuCompiledGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCompiledGraph")
            .field("threads", &self.threads)
            .field("planned", &self.plan.is_some())
            .finish()
    }
}

impl CpuCompiledGraph {
    fn new(
        graph: Graph,
        threads: usize,
        jit: bool,
        input_updates: Vec<(usize, usize)>,
    ) -> Result<CpuCompiledGraph, BackendError> {
        let _span = tracing::debug_span!("cpu_compile", nodes = graph.nodes.len()).entered();
        let (plan, fallback) = match plan_graph_with(&graph, &PlanOptions { input_updates: input_updates.clone() }) {
            Ok(p) => (Some(p), None),
            Err(e @ (PlanError::Unsupported { .. } | PlanError::SymbolicBroadcast(_))) => {
                tracing::debug!(reason = %e, "graph runs on the reference interpreter");
                (None, Some(e))
            }
            Err(e) => return Err(err(e)),
        };
        let fixed = match &plan {
            Some(p) if p.is_static() => Some(Arc::new(Instance::lower(p, jit).map_err(err)?)),
            _ => None,
        };
        if let (Some(p), Some(i)) = (&plan, &fixed) {
            tracing::debug!(plan = %print_plan(p, Some(&i.lowered.slots)), "kernel plan");
        }
        Self::assemble(graph, plan.map(LazyPlan::new), input_updates, fixed, fallback, threads, jit)
    }

    /// A graph with a plan made earlier for it (a verified artifact): its lowered
    /// form, when the plan is static, runs as it was stored (checked, not lowered
    /// again); a plan with symbolic sizes is decoded and lowered per binding.
    fn from_artifact(a: &mut CpuArtifact, threads: usize, jit: bool) -> Result<CpuCompiledGraph, BackendError> {
        let fixed = if a.lowered.is_empty() {
            None
        } else {
            let low: Lowered = aotgrad_ir::codec::decode("cpu artifact lowered plan", &a.lowered)
                .map_err(|e| err(format!("the artifact's lowered plan does not decode: {e}")))?;
            let inputs: Vec<aotgrad_ir::DType> = a.inputs.iter().map(|i| i.meta.dtype).collect();
            // Inconsistent here is a damaged or forged artifact, not a bug.
            low.check(&inputs).map_err(|e| match e {
                CpuError::Internal(msg) => err(format!("the artifact's {msg}")),
                e => err(e),
            })?;
            // Only the inputs the caller let it update may be written.
            let allowed = |i: usize| a.input_updates.iter().any(|&(o, j)| j == i && o < low.outputs.len());
            if low.loc.iter().any(|l| matches!(*l, Loc::Updated(i) if !allowed(i))) {
                return Err(err("the artifact's lowered plan writes an input it was not compiled to update"));
            }
            Some(Arc::new(Instance::loaded(low, jit)))
        };
        let plan = LazyPlan::encoded_only(std::mem::take(&mut a.plan));
        if fixed.is_none() {
            // A symbolic plan is lowered per binding of its symbols: decoded and
            // checked now, so a bad one is refused at load, not at a call.
            let p = plan.get().map_err(err)?;
            if p.inputs.len() != a.inputs.len() || p.inputs.iter().zip(&a.inputs).any(|(m, i)| *m != i.meta) {
                return Err(err("the artifact's kernel plan does not take its graph's inputs"));
            }
        }
        let updates = std::mem::take(&mut a.input_updates);
        Self::assemble(LazyGraph::from_artifact(a), Some(plan), updates, fixed, None, threads, jit)
    }

    fn assemble(
        graph: impl Into<LazyGraph>,
        plan: Option<LazyPlan>,
        input_updates: Vec<(usize, usize)>,
        fixed: Option<Arc<Instance>>,
        fallback: Option<PlanError>,
        threads: usize,
        jit: bool,
    ) -> Result<CpuCompiledGraph, BackendError> {
        let graph: LazyGraph = graph.into();
        // With a plan the graph itself is only needed to save the artifact.
        let graph = if plan.is_some() { graph.packed_if_large() } else { graph };
        Ok(CpuCompiledGraph {
            graph,
            plan,
            input_updates,
            fallback,
            threads,
            jit,
            pool: pool_for(threads)?,
            fixed,
            by_binding: Mutex::new(HashMap::new()),
            stats: Mutex::new(AllocStats::default()),
            profile: profiling().then(|| Mutex::new(Vec::new())),
        })
    }

    /// The kernel plan (`None` when the graph runs on the reference interpreter).
    pub fn plan(&self) -> Option<&KernelPlan> {
        self.plan.as_ref()?.get_logged()
    }

    /// Why the graph is not planned, when it is not.
    pub fn fallback_reason(&self) -> Option<&PlanError> {
        self.fallback.as_ref()
    }

    /// The plan as text with its buffer plan (static graphs), for tests and logs.
    pub fn plan_text(&self) -> Option<String> {
        let p = self.plan()?;
        Some(print_plan(p, self.fixed.as_ref().map(|i| &i.lowered.slots)))
    }

    /// One line per kernel saying what it fuses ([`aotgrad_fusion::plan_summary`]).
    pub fn plan_summary(&self) -> Option<String> {
        self.plan().map(aotgrad_fusion::plan_summary)
    }

    /// Peak bytes one call allocates (arena plus outputs) for a static graph.
    pub fn peak_bytes(&self) -> Option<usize> {
        self.fixed.as_ref().map(|i| i.lowered.slots.peak_bytes() + i.lowered.scratch * 8)
    }

    /// `(arena bytes incl. reduction scratch, output bytes)` of one call, for a static graph.
    pub fn plan_bytes(&self) -> Option<(usize, usize)> {
        self.fixed.as_ref().map(|i| (i.lowered.slots.arena_bytes + i.lowered.scratch * 8, i.lowered.slots.output_bytes))
    }

    /// Runs `start..end` of the static plan's kernels that run as one dispatch:
    /// consecutive pointwise kernels that touch nothing another of them writes (a
    /// multi-tensor kernel, such as an optimizer's update of every parameter). `None`
    /// for a dynamic or unplanned graph.
    pub fn dispatch_groups(&self) -> Option<Vec<(usize, usize)>> {
        self.fixed.as_ref().map(|i| i.lowered.groups.clone())
    }

    /// The JIT slots of the static plan's kernels with a body (pointwise kernels,
    /// epilogues, reductions, row-group stages), in plan order.
    fn jit_slots(&self) -> Option<Vec<Option<&code::JitSlot>>> {
        let i = self.fixed.as_ref()?;
        let mut v = Vec::new();
        for k in &i.lowered.kernels {
            match k {
                CKernel::Pointwise(p) => v.push(p.jit.as_ref()),
                CKernel::Matmul(m) => v.extend(m.epilogue.iter().map(|e| e.jit.as_ref())),
                CKernel::Reduce(r) => v.push(r.jit.as_ref()),
                CKernel::Rows(g) => {
                    for st in &g.stages {
                        v.push(match st {
                            kernels::CStage::Elem(p) | kernels::CStage::Row(p) => p.jit.as_ref(),
                            kernels::CStage::Reduce { k, .. } => k.jit.as_ref(),
                        });
                    }
                }
                CKernel::Extern(_) => {}
            }
        }
        Some(v)
    }

    /// How many of the static plan's kernels with a body (pointwise kernels,
    /// epilogues, reductions, row-group stages) run as compiled machine code, of how
    /// many (`None` for a dynamic or unplanned graph).
    pub fn jit_kernels(&self) -> Option<(usize, usize)> {
        let slots = self.jit_slots()?;
        let compiled = slots.iter().filter(|s| s.is_some_and(|s| s.get().is_some())).count();
        Some((compiled, slots.len()))
    }

    /// Wait up to `timeout` for the JIT worker to compile this graph's covered
    /// kernels (compilation is tiered: until then they run on the interpreter);
    /// whether they all have code now.
    pub fn wait_for_jit(&self, timeout: std::time::Duration) -> bool {
        let Some(slots) = self.jit_slots() else { return true };
        let start = std::time::Instant::now();
        loop {
            let ready = slots.iter().all(|s| s.is_none_or(|s| s.get().is_some()));
            if ready || start.elapsed() >= timeout {
                return ready;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// What the calls so far allocated.
    pub fn alloc_stats(&self) -> AllocStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn instance_for(&self, env: &HashMap<SymId, i64>) -> Result<Arc<Instance>, CpuError> {
        if let Some(i) = &self.fixed {
            return Ok(i.clone());
        }
        let lazy = self.plan.as_ref().ok_or_else(|| CpuError::Internal("no plan to lower".into()))?;
        let plan = lazy.get()?;
        let mut key: Binding = env.iter().map(|(k, v)| (*k, *v)).collect();
        key.sort();
        let mut cache = self.by_binding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.get(&key) {
            return Ok(i.clone());
        }
        let bound = plan
            .map_dims(&|d: &Dim| d.checked_subst(&|s| env.get(&s).copied()))
            .ok_or_else(|| CpuError::kernel("plan", "a size overflows i64 for the symbol values of these inputs"))?;
        if lazy.stored {
            // Sizes only this binding shows: checked before lowering multiplies them.
            bound
                .validate_sizes()
                .map_err(|e| CpuError::kernel("artifact", format!("its kernel plan does not fit these sizes: {e}")))?;
        }
        let inst = Arc::new(Instance::lower(&bound, self.jit).map_err(|e| match e {
            // A stored symbolic plan is checked structurally at load; what only these
            // sizes show (an access past a buffer, a size that is no size) is the
            // artifact's fault.
            CpuError::Internal(msg) if lazy.stored => {
                CpuError::kernel("artifact", format!("its kernel plan does not lower for these sizes: {msg}"))
            }
            e => e,
        })?);
        cache.insert(key, inst.clone());
        Ok(inst)
    }

    /// Bind a call and run it: on the thread pool when some kernel of its lowered
    /// plan has enough work to split, else right here (handing a call to the pool and
    /// back costs tens of microseconds, more than a small graph's whole run).
    fn run_planned(
        &self,
        inputs: &[CpuTensor],
        symbols: &[(SymId, i64)],
        ready: Option<&mut dyn FnMut(aotgrad_ir::ReadyOutput<'_>)>,
    ) -> Result<Vec<CpuTensor>, CpuError> {
        let env = bind_inputs(&self.graph.inputs, inputs, symbols)?;
        let inst = self.instance_for(&env)?;
        match &self.pool {
            Some(p) if inst.lowered.parallel => {
                p.enter(|| inst.run(inputs, self.threads, &self.stats, self.profile.as_ref(), ready))
            }
            _ => inst.run(inputs, self.threads, &self.stats, self.profile.as_ref(), ready),
        }
    }
}

impl CompiledGraph<CpuTensor> for CpuCompiledGraph {
    fn signature(&self) -> Option<(Vec<aotgrad_ir::TensorMeta>, usize)> {
        let outputs = match (&self.fixed, &self.plan) {
            (Some(f), _) => f.lowered.outputs.len(),
            (None, Some(p)) => p.get().ok()?.outputs.len(),
            (None, None) => self.graph.full().ok()?.outputs.len(),
        };
        Some((self.graph.inputs.inputs.iter().map(|i| i.meta.clone()).collect(), outputs))
    }
    fn run_with_symbols(&self, inputs: &[CpuTensor], symbols: &[(SymId, i64)]) -> Result<Vec<CpuTensor>, BackendError> {
        let _span = tracing::trace_span!("cpu_run", nodes = self.graph.nodes).entered();
        if self.plan.is_none() {
            return interpret_with_symbols(self.graph.full()?, inputs, symbols).map_err(err);
        }
        // Inputs whose elements are on a device come back first.
        for t in inputs {
            t.storage.sync_host().map_err(|e| err(CpuError::Device(e)))?;
        }
        self.run_planned(inputs, symbols, None).map_err(err)
    }
    /// Outputs the plan stores into its own output buffers (f32 and f64) come out
    /// right after the kernel that writes them last (the one dispatch group it is in);
    /// the interpreter (no plan) hands out none early.
    fn run_streaming(
        &self,
        inputs: &[CpuTensor],
        symbols: &[(SymId, i64)],
        ready: &mut dyn FnMut(aotgrad_ir::ReadyOutput<'_>),
    ) -> Result<Vec<CpuTensor>, BackendError> {
        if self.plan.is_none() {
            return self.run_with_symbols(inputs, symbols);
        }
        let _span = tracing::trace_span!("cpu_run", nodes = self.graph.nodes).entered();
        for t in inputs {
            t.storage.sync_host().map_err(|e| err(CpuError::Device(e)))?;
        }
        self.run_planned(inputs, symbols, Some(ready)).map_err(err)
    }
    fn serialize(&self) -> Vec<u8> {
        let lowered = match &self.fixed {
            Some(i) => aotgrad_ir::codec::encode("cpu artifact lowered plan", &i.lowered).unwrap_or_default(),
            None => Vec::new(),
        };
        let artifact = CpuArtifact {
            format: ARTIFACT_FORMAT.to_string(),
            threads: self.threads,
            inputs: self.graph.inputs.inputs.clone(),
            nodes: self.graph.nodes,
            graph: self.graph.encoded().to_vec(),
            plan: self.plan.as_ref().map(|p| p.encoded().to_vec()).unwrap_or_default(),
            lowered,
            input_updates: self.input_updates.clone(),
        };
        // Encoding plain data cannot fail; an empty artifact would be rejected on load.
        aotgrad_ir::codec::encode("cpu artifact", &artifact).unwrap_or_default()
    }
}

fn decode_artifact(bytes: &[u8]) -> Result<CpuArtifact, BackendError> {
    let a: CpuArtifact = aotgrad_ir::codec::decode("cpu artifact", bytes)
        .map_err(|e| err(format!("artifact is not a cpu artifact: {e}")))?;
    if a.format != ARTIFACT_FORMAT {
        return Err(err(format!("artifact has format {:?}; this build reads {ARTIFACT_FORMAT:?}", a.format)));
    }
    Ok(a)
}

/// The format tag of [`CpuArtifact`]s.
pub const ARTIFACT_FORMAT: &str = "aotgrad-cpu/8";

/// The compiled CPU backend's artifact: the graph, its kernel plan and (static plans)
/// the plan lowered, encoded with [`aotgrad_ir::codec`]. [`Backend::deserialize`]
/// checks the graph ([`Graph::verify`]), plans and lowers it again: an artifact whose
/// plan or lowered plan differs from the graph's is rejected, so neither is ever
/// trusted on its own. [`Backend::load_verified`] (bytes from a checked cache entry)
/// runs the lowered plan after checking that every access and register in it is in
/// bounds (the checks lowering makes), decodes the kernel plan only when something
/// asks for it (printing, saving, a binding of its symbols) and the graph's nodes only
/// if they are needed (the interpreter, or saving it again).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuArtifact {
    /// [`ARTIFACT_FORMAT`].
    pub format: String,
    /// Threads it was compiled for (informative: the loading backend's count is used).
    pub threads: usize,
    /// The graph's inputs (what a call is checked and bound against).
    pub inputs: Vec<aotgrad_ir::Input>,
    /// Nodes in the graph.
    pub nodes: usize,
    /// The functional graph, packed with [`aotgrad_ir::codec::pack`] (compressed: it
    /// is read only by the interpreter, by [`Backend::deserialize`]'s check, or to
    /// save the artifact again).
    #[serde(with = "aotgrad_ir::codec::bytes")]
    pub graph: Vec<u8>,
    /// Its kernel plan, encoded with [`aotgrad_ir::codec`] (empty: the graph runs on
    /// the interpreter); see [`CpuArtifact::decode_plan`].
    #[serde(with = "aotgrad_ir::codec::bytes")]
    pub plan: Vec<u8>,
    /// The plan lowered to concrete kernels, encoded (empty: no plan, or one with
    /// symbolic sizes, lowered per binding of its symbols). Its form is private to
    /// this build (the format tag changes with it).
    #[serde(with = "aotgrad_ir::codec::bytes")]
    pub lowered: Vec<u8>,
    /// The mutated inputs it was compiled to update in place
    /// ([`CompileOptions::input_updates`]); planning again uses them too.
    pub input_updates: Vec<(usize, usize)>,
}

impl CpuArtifact {
    /// Decode the kernel plan (`None`: the graph runs on the interpreter).
    pub fn decode_plan(&self) -> Result<Option<KernelPlan>, BackendError> {
        if self.plan.is_empty() {
            return Ok(None);
        }
        aotgrad_ir::codec::decode("cpu artifact plan", &self.plan).map(Some).map_err(err)
    }

    /// Decode the graph.
    pub fn decode_graph(&self) -> Result<Graph, BackendError> {
        aotgrad_ir::codec::unpack("cpu artifact graph", &self.graph).map_err(err)
    }
}

/// A compiled graph's graph: its inputs at hand (every call binds them), the whole
/// graph decoded when first needed, and its encoding kept for saving.
struct LazyGraph {
    /// A graph holding only the inputs.
    inputs: Graph,
    nodes: usize,
    full: OnceLock<Graph>,
    encoded: OnceLock<Vec<u8>>,
}

impl From<Graph> for LazyGraph {
    fn from(g: Graph) -> LazyGraph {
        let inputs = Graph { inputs: g.inputs.clone(), nodes: Vec::new(), outputs: Vec::new() };
        let full = OnceLock::new();
        let nodes = g.nodes.len();
        let _ = full.set(g);
        LazyGraph { inputs, nodes, full, encoded: OnceLock::new() }
    }
}

impl LazyGraph {
    fn from_artifact(a: &mut CpuArtifact) -> LazyGraph {
        let inputs = Graph { inputs: std::mem::take(&mut a.inputs), nodes: Vec::new(), outputs: Vec::new() };
        let encoded = OnceLock::new();
        let _ = encoded.set(std::mem::take(&mut a.graph));
        LazyGraph { inputs, nodes: a.nodes, full: OnceLock::new(), encoded }
    }
    fn full(&self) -> Result<&Graph, BackendError> {
        if let Some(g) = self.full.get() {
            return Ok(g);
        }
        let bytes = self.encoded.get().map(Vec::as_slice).unwrap_or_default();
        let g: Graph = aotgrad_ir::codec::unpack("cpu artifact graph", bytes).map_err(err)?;
        Ok(self.full.get_or_init(|| g))
    }
    /// A large graph kept only packed (a small fraction of its size), decoded if ever
    /// needed again.
    fn packed_if_large(mut self) -> LazyGraph {
        const PACK_ABOVE_NODES: usize = 20_000;
        if self.nodes > PACK_ABOVE_NODES && self.full.get().is_some() {
            if self.encoded.get().is_none() {
                let bytes = self.encoded();
                if bytes.is_empty() {
                    return self;
                }
            }
            self.full.take();
        }
        self
    }
    fn encoded(&self) -> &[u8] {
        self.encoded.get_or_init(|| match self.full.get() {
            Some(g) => aotgrad_ir::codec::pack("cpu artifact graph", g).unwrap_or_default(),
            None => Vec::new(),
        })
    }
}

/// The CPU features the compiled kernels may use, as a stable string (part of the
/// cache identity: an artifact is only loaded where it was compiled for).
pub fn cpu_target() -> String {
    let mut feats: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        for (name, on) in [
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ] {
            if on {
                feats.push(name);
            }
        }
    }
    format!("{}-{}[{}]", std::env::consts::ARCH, std::env::consts::OS, feats.join(","))
}

impl Backend<CpuTensor> for CpuBackend {
    fn name(&self) -> &str {
        NAME
    }
    fn cache_identity(&self) -> Option<String> {
        Some(format!("{NAME} {} format {ARTIFACT_FORMAT} target {}", env!("CARGO_PKG_VERSION"), cpu_target()))
    }
    fn compile(&self, graph: &Graph) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        Ok(Box::new(self.compile_graph(graph)?))
    }
    fn compile_with(
        &self,
        graph: &Graph,
        options: &CompileOptions,
    ) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        Ok(Box::new(self.compile_graph_with(graph, options)?))
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        let a = decode_artifact(bytes)?;
        let graph = a.decode_graph()?;
        if graph.inputs != a.inputs || graph.nodes.len() != a.nodes {
            return Err(err("artifact inputs do not match its graph (corrupt or from another aotgrad version)"));
        }
        graph.verify().map_err(|e| {
            let at = e.node.map(|n| format!(" at node {n}")).unwrap_or_default();
            err(format!("artifact graph is invalid{at}: {}", e.msg))
        })?;
        let updates = a.input_updates.clone();
        if updates.iter().any(|&(o, i)| o >= graph.outputs.len() || i >= graph.inputs.len()) {
            return Err(err("artifact names an input update outside its graph"));
        }
        let compiled = CpuCompiledGraph::new(graph, self.threads, self.jit, updates)?;
        if compiled.plan() != a.decode_plan()?.as_ref() {
            return Err(err("artifact plan does not match its graph (corrupt or from another aotgrad version)"));
        }
        let lowered = match &compiled.fixed {
            Some(i) => aotgrad_ir::codec::encode("cpu artifact lowered plan", &i.lowered).map_err(err)?,
            None => Vec::new(),
        };
        if lowered != a.lowered {
            return Err(err(
                "artifact lowered plan does not match its graph (corrupt or from another aotgrad version)",
            ));
        }
        Ok(Box::new(compiled))
    }
    fn load_verified(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        let mut a = decode_artifact(bytes)?;
        Ok(Box::new(if a.plan.is_empty() {
            // The interpreter's graphs: planning again finds the reason it has none.
            CpuCompiledGraph::new(a.decode_graph()?, self.threads, self.jit, Vec::new())?
        } else {
            CpuCompiledGraph::from_artifact(&mut a, self.threads, self.jit)?
        }))
    }
}

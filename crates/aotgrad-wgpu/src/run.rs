//! Compiled graphs: the entry points of a call and what drives it.
//!
//! A [`WgpuCompiledGraph`] holds the plan, the instance of a static graph (lowered at
//! compile) or the instances of a dynamic one (per binding of its symbols), and its
//! artifact. A call binds the inputs, picks the instance, takes the call's buffers,
//! and walks the steps in order: a GPU step binds its buffers (a resident input as it
//! is, a host value uploaded) and is recorded into the open command buffer; a host
//! step first reads its device operands back (submitting what was recorded) and runs
//! the reference kernel. The outputs stay on the device; the last command buffer is
//! submitted without waiting. Buffers and transfers are in `resident`, pipelines,
//! bind groups and passes in `launch`.

use crate::device::{gpu, Gpu};
use crate::launch::{bind_group, dispatch, time_kernels, Instance, Loc};
use crate::resident::{bytes_of, create_buffer, read_back, resident_buffer, upload, Arena, GpuBuffer, STORAGE};
use crate::wgsl::Step;
use crate::{backend_err, WgpuError};
use aotgrad_cpu::{CpuTensor, Storage};
use aotgrad_fusion::{extent, plan_graph, print_plan, KernelPlan, PlanError, SlotPlan};
use aotgrad_ir::{BackendError, CompiledGraph, DType, Dim, Graph, SymId, TensorMeta};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn meta_of(a: &aotgrad_fusion::Access) -> TensorMeta {
    TensorMeta { shape: a.shape.clone(), strides: a.strides.clone(), offset: a.offset.clone(), dtype: a.dtype }
}

/// The format tag of [`WgpuArtifact`]s.
pub const ARTIFACT_FORMAT: &str = "aotgrad-wgpu/4";

/// The wgpu backend's artifact, plain data encoded with [`aotgrad_ir::codec`]: the
/// graph's text, the adapter features its kernels need, and for a static planned
/// graph its kernel plan, the WGSL sources with their launch plan (steps in order:
/// entry point, bindings, workgroups; host steps), and the buffer plan.
/// Loading it ([`aotgrad_ir::Backend::deserialize`], and `load_verified` too: a checked
/// cache entry is no exception) plans the graph again and rejects an artifact whose
/// stored plan and shaders differ: WGSL goes to the GPU driver, so stored shader text
/// is never trusted, and a checksum only says that nobody changed the bytes by
/// accident (an unsigned cache's writer can recompute it). Planning is a small part
/// of a load next to creating the pipelines.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WgpuArtifact {
    /// [`ARTIFACT_FORMAT`].
    pub format: String,
    /// The functional graph in the text format.
    pub graph: String,
    /// Adapter features the kernels need (`shader-f16`).
    pub features: Vec<String>,
    /// The static graph's lowered kernels (`None`: dynamic shapes or the interpreter).
    kernels: Option<StoredKernels>,
}

/// A static graph's kernels as [`WgpuArtifact`] stores them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct StoredKernels {
    plan: KernelPlan,
    steps: Vec<Step>,
    slots: SlotPlan,
}

/// The symbol values of a call, sorted: the key of a lowered plan.
type Binding = Vec<(SymId, i64)>;

/// A graph compiled by [`crate::WgpuBackend`].
pub struct WgpuCompiledGraph {
    graph: Graph,
    plan: Option<KernelPlan>,
    fallback: Option<PlanError>,
    fixed: Option<Arc<Instance>>,
    by_binding: Mutex<HashMap<Binding, Arc<Instance>>>,
}

impl std::fmt::Debug for WgpuCompiledGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuCompiledGraph").field("planned", &self.plan.is_some()).finish()
    }
}

impl WgpuCompiledGraph {
    pub(crate) fn new(graph: Graph) -> Result<WgpuCompiledGraph, WgpuError> {
        let _span = tracing::debug_span!("wgpu_compile", nodes = graph.nodes.len()).entered();
        let (plan, fallback) = match plan_graph(&graph) {
            Ok(p) => (Some(p), None),
            Err(e @ (PlanError::Unsupported { .. } | PlanError::SymbolicBroadcast(_))) => {
                tracing::debug!(reason = %e, "graph runs on the reference interpreter");
                (None, Some(e))
            }
            Err(e) => return Err(WgpuError::Internal(e.to_string())),
        };
        let fixed = match &plan {
            Some(p) if p.is_static() => {
                let g = gpu()?;
                Some(Arc::new(Instance::new(g, p.clone())?))
            }
            Some(_) => {
                gpu()?;
                None
            }
            None => None,
        };
        if let Some(p) = &plan {
            tracing::debug!(plan = %print_plan(p, fixed.as_ref().map(|i| &i.slots)), "kernel plan");
        }
        Ok(WgpuCompiledGraph { graph, plan, fallback, fixed, by_binding: Mutex::new(HashMap::new()) })
    }

    /// The artifact of this compiled graph (see [`WgpuArtifact`]).
    pub fn artifact(&self) -> WgpuArtifact {
        let kernels = self.fixed.as_ref().map(|i| StoredKernels {
            plan: i.plan.clone(),
            steps: i.steps.clone(),
            slots: i.slots.clone(),
        });
        let f16 = kernels
            .as_ref()
            .is_some_and(|k| k.steps.iter().any(|s| matches!(s, Step::Gpu(g) if g.wgsl.starts_with("enable f16;"))));
        WgpuArtifact {
            format: ARTIFACT_FORMAT.into(),
            graph: aotgrad_ir::text::print_graph(&self.graph),
            features: if f16 { vec!["shader-f16".into()] } else { Vec::new() },
            kernels,
        }
    }

    /// Decode an artifact's bytes (format checked).
    pub(crate) fn decode_artifact(bytes: &[u8]) -> Result<WgpuArtifact, WgpuError> {
        let a: WgpuArtifact = aotgrad_ir::codec::decode("wgpu artifact", bytes).map_err(|e| {
            WgpuError::Unsupported { what: "artifact".into(), reason: format!("not a wgpu artifact: {e}") }
        })?;
        if a.format != ARTIFACT_FORMAT {
            return Err(WgpuError::Unsupported {
                what: "artifact".into(),
                reason: format!("format {:?}; this build reads {ARTIFACT_FORMAT:?}", a.format),
            });
        }
        Ok(a)
    }

    /// Rebuild from bytes nobody vouched for: the graph is parsed and planned again,
    /// and stored kernels must equal what planning makes now.
    pub(crate) fn from_untrusted(bytes: &[u8]) -> Result<WgpuCompiledGraph, WgpuError> {
        let a = Self::decode_artifact(bytes)?;
        let graph = aotgrad_ir::text::parse_graph(&a.graph).map_err(|e| WgpuError::Unsupported {
            what: "artifact".into(),
            reason: format!("its graph does not parse: {e}"),
        })?;
        let fresh = WgpuCompiledGraph::new(graph)?;
        if a.kernels.is_some() && fresh.artifact().kernels != a.kernels {
            return Err(WgpuError::Unsupported {
                what: "artifact".into(),
                reason: "its stored kernels differ from what its graph plans to here".into(),
            });
        }
        Ok(fresh)
    }

    /// Why the graph runs on the reference interpreter, when it does.
    pub fn fallback_reason(&self) -> Option<&PlanError> {
        self.fallback.as_ref()
    }

    /// The kernel plan (`None` when the graph runs on the reference interpreter).
    pub fn plan(&self) -> Option<&KernelPlan> {
        self.plan.as_ref()
    }

    /// The kernels of a static graph in launch order, one line each: the WGSL entry
    /// point and what it fuses (host-run ops as `host <op>`).
    pub fn kernel_list(&self) -> Option<String> {
        let inst = self.fixed.as_ref()?;
        Some(kernel_list(inst))
    }

    /// The WGSL sources of a static graph's kernels, in launch order.
    pub fn wgsl_sources(&self) -> Option<Vec<String>> {
        let inst = self.fixed.as_ref()?;
        Some(
            inst.steps
                .iter()
                .filter_map(|s| match s {
                    Step::Gpu(k) => Some(k.wgsl.clone()),
                    Step::Host(_) => None,
                })
                .collect(),
        )
    }

    /// Device bytes one call of a static graph uses: (reused slots, outputs).
    pub fn device_bytes(&self) -> Option<(u64, u64)> {
        let i = self.fixed.as_ref()?;
        let outs: u64 = i.out_bufs.iter().map(|(_, d, n)| bytes_of(*d, *n)).sum();
        let slots: u64 = i.slots.slots.iter().map(|s| bytes_of(s.dtype, s.elems as u64)).sum();
        Some((slots, outs))
    }

    fn instance_for(&self, gpu: &Gpu, env: &HashMap<SymId, i64>) -> Result<Arc<Instance>, WgpuError> {
        if let Some(i) = &self.fixed {
            return Ok(i.clone());
        }
        let plan = self.plan.as_ref().ok_or_else(|| WgpuError::Internal("no plan to lower".into()))?;
        let mut key: Binding = env.iter().map(|(k, v)| (*k, *v)).collect();
        key.sort();
        let mut cache = self.by_binding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.get(&key) {
            return Ok(i.clone());
        }
        let bound = plan.map_dims(&|d: &Dim| d.checked_subst(&|s| env.get(&s).copied())).ok_or_else(|| {
            WgpuError::Unsupported {
                what: "plan".into(),
                reason: "a size overflows i64 for the symbol values of these inputs".into(),
            }
        })?;
        let inst = Arc::new(Instance::new(gpu, bound)?);
        cache.insert(key, inst.clone());
        Ok(inst)
    }

    fn run_planned(&self, inputs: &[CpuTensor], symbols: &[(SymId, i64)]) -> Result<Vec<CpuTensor>, WgpuError> {
        let env = aotgrad_cpu::bind_inputs(&self.graph, inputs, symbols)?;
        let gpu = gpu()?;
        gpu.check_health()?;
        let inst = self.instance_for(gpu, &env)?;
        for (i, (t, need)) in inputs.iter().zip(&inst.input_need).enumerate() {
            let len = t.storage.len() as u64;
            if len < *need {
                return Err(aotgrad_cpu::CpuError::Input {
                    index: i,
                    msg: format!("its storage holds {len} elements, but the graph reads {need}"),
                }
                .into());
            }
        }
        let arena = inst.arena(gpu)?;
        let result = run_steps(gpu, &inst, &arena, inputs);
        arena.recycle(&inst.pool);
        result
    }
}

impl WgpuCompiledGraph {
    /// Device time of one run of this graph's kernels, host↔device transfers
    /// excluded (what `cargo xtask bench --backend wgpu` reports as GB/s and
    /// GFLOP/s): the inputs are uploaded once and the bind groups made once, one run
    /// warms up, then `reps` runs are recorded into one command buffer, submitted, and
    /// waited for; the wall time of that submission divided by `reps`. Graphs with
    /// host-run steps or on the interpreter are refused (their time is not the
    /// device's).
    pub fn device_seconds(&self, inputs: &[CpuTensor], reps: usize) -> Result<f64, BackendError> {
        self.device_seconds_inner(inputs, reps.max(1)).map_err(backend_err)
    }

    fn device_seconds_inner(&self, inputs: &[CpuTensor], reps: usize) -> Result<f64, WgpuError> {
        let unsupported = |reason: &str| WgpuError::Unsupported { what: "device timing".into(), reason: reason.into() };
        if self.plan.is_none() {
            return Err(unsupported("the graph runs on the reference interpreter"));
        }
        let env = aotgrad_cpu::bind_inputs(&self.graph, inputs, &[])?;
        let gpu = gpu()?;
        gpu.check_health()?;
        let inst = self.instance_for(gpu, &env)?;
        if inst.steps.iter().any(|s| matches!(s, Step::Host(_))) {
            return Err(unsupported("the graph has host-run steps"));
        }
        time_kernels(gpu, &inst, inputs, reps)
    }
}

fn kernel_list(inst: &Instance) -> String {
    let mut s = String::new();
    for step in &inst.steps {
        match step {
            Step::Gpu(k) => s.push_str(&format!("{}: {}\n", k.entry, k.what)),
            Step::Host(e) => s.push_str(&format!("host {} ({})\n", e.op.name(), e.value)),
        }
    }
    s
}

/// One call: upload what the kernels read, dispatch in order, read back the outputs.
fn run_steps(gpu: &Gpu, inst: &Instance, arena: &Arena, inputs: &[CpuTensor]) -> Result<Vec<CpuTensor>, WgpuError> {
    let n = inst.loc.len();
    // Device buffers of inputs and host results, uploaded when a kernel reads them.
    let mut uploaded: Vec<Option<wgpu::Buffer>> = vec![None; n];
    // Host values: inputs, host-op results, device buffers read back for host ops.
    let mut host: HashMap<usize, Arc<Storage>> = HashMap::new();
    let new_encoder = || gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("aotgrad") });
    let mut encoder = new_encoder();
    let mut recorded = false;
    let device_buf = |b: usize, uploaded: &[Option<wgpu::Buffer>]| -> Option<wgpu::Buffer> {
        match inst.loc[b] {
            Loc::Slot(s) => Some(arena.slots[s].clone()),
            Loc::Output(o) => Some(arena.outs[o].clone()),
            Loc::Input(_) | Loc::Extern => uploaded[b].clone(),
        }
    };
    for (si, step) in inst.steps.iter().enumerate() {
        match step {
            Step::Gpu(k) => {
                if let Some(msg) = &k.needs_elements {
                    return Err(WgpuError::Cpu(aotgrad_cpu::CpuError::kernel("reduce", msg.clone())));
                }
                let mut entries = Vec::with_capacity(k.bindings.len());
                for (b, _) in &k.bindings {
                    if device_buf(*b, &uploaded).is_none() {
                        if let Loc::Input(i) = inst.loc[*b] {
                            // A tensor already on the device is bound as it is.
                            if let Some(d) = resident_buffer(&inputs[i], inst.input_need[i]) {
                                uploaded[*b] = Some(d);
                            }
                        }
                    }
                    if device_buf(*b, &uploaded).is_none() {
                        let storage = match inst.loc[*b] {
                            Loc::Input(i) => inputs[i].storage.clone(),
                            _ => host
                                .get(b)
                                .cloned()
                                .ok_or_else(|| WgpuError::Internal(format!("buffer b{b} read before it exists")))?,
                        };
                        storage.sync_host().map_err(aotgrad_cpu::CpuError::Device)?;
                        let guard = storage.read();
                        let elems = match inst.loc[*b] {
                            Loc::Input(i) => inst.input_need[i] as usize,
                            _ => guard.len(),
                        };
                        let buf = upload(gpu, *b, &guard, elems, &k.what)?;
                        // A whole input uploaded stays with its storage: the next
                        // call binds it until the host writes the storage.
                        if matches!(inst.loc[*b], Loc::Input(_)) && elems == guard.len() {
                            let copy = GpuBuffer::new(buf.clone(), guard.dtype(), elems);
                            storage.attach_device_copy(Arc::new(copy));
                        }
                        drop(guard);
                        uploaded[*b] = Some(buf);
                    }
                    entries
                        .push(device_buf(*b, &uploaded).ok_or_else(|| WgpuError::Internal("no device buffer".into()))?);
                }
                if k.groups.contains(&0) {
                    continue;
                }
                let pipe = inst.pipelines[si].as_ref().ok_or_else(|| WgpuError::Internal("no pipeline".into()))?;
                let group = bind_group(gpu, &k.entry, pipe, &entries);
                dispatch(&mut encoder, Some(&k.entry), pipe, &group, k.groups);
                recorded = true;
            }
            Step::Host(e) => {
                // Device operands come back first (one submission for all of them).
                let mut need: Vec<usize> = Vec::new();
                for a in &e.args {
                    if !host.contains_key(&a.buf) && !matches!(inst.loc[a.buf], Loc::Input(_)) && !need.contains(&a.buf)
                    {
                        need.push(a.buf);
                    }
                }
                if !need.is_empty() {
                    let bufs: Vec<(wgpu::Buffer, DType, u64)> = need
                        .iter()
                        .map(|b| {
                            let layout = &inst.plan.buffers[*b].layout;
                            let elems = extent(layout).unwrap_or(0) as u64;
                            device_buf(*b, &uploaded)
                                .map(|d| (d, layout.dtype, elems))
                                .ok_or_else(|| WgpuError::Internal(format!("host op reads b{b} before it exists")))
                        })
                        .collect::<Result<_, _>>()?;
                    let refs: Vec<(&wgpu::Buffer, DType, u64)> = bufs.iter().map(|(b, d, n)| (b, *d, *n)).collect();
                    let vals = read_back(gpu, std::mem::replace(&mut encoder, new_encoder()), &refs)?;
                    recorded = false;
                    for (b, v) in need.iter().zip(vals) {
                        host.insert(*b, Storage::new(v));
                    }
                }
                let args: Vec<CpuTensor> = e
                    .args
                    .iter()
                    .map(|a| {
                        let storage = match inst.loc[a.buf] {
                            Loc::Input(i) => inputs[i].storage.clone(),
                            _ => host[&a.buf].clone(),
                        };
                        CpuTensor { storage, meta: meta_of(a) }
                    })
                    .collect();
                let refs: Vec<&CpuTensor> = args.iter().collect();
                let res = aotgrad_cpu::execute(&e.op, &refs, &e.meta).map_err(|err| aotgrad_cpu::CpuError::Node {
                    value: e.value,
                    op: e.op.name(),
                    loc: e.loc.clone(),
                    source: Box::new(err),
                })?;
                host.insert(e.out, res.storage);
            }
        }
    }
    // Outputs stay on the device: each output buffer of this call becomes a result's
    // storage (a slot holding an output is copied into a buffer of its own first),
    // read back only when the host needs it. The recorded kernels are submitted
    // without waiting; a readback waits for them.
    let mut results: HashMap<usize, Arc<Storage>> = HashMap::new();
    for o in &inst.plan.outputs {
        if results.contains_key(&o.buf) || matches!(inst.loc[o.buf], Loc::Input(_)) {
            continue;
        }
        if let Some(h) = host.get(&o.buf) {
            results.insert(o.buf, h.clone());
            continue;
        }
        let layout = &inst.plan.buffers[o.buf].layout;
        let elems = extent(layout).unwrap_or(0) as u64;
        let buf = match inst.loc[o.buf] {
            Loc::Output(i) => arena.outs[i].clone(),
            Loc::Slot(sl) => {
                let own = create_buffer(gpu, &format!("output b{}", o.buf), bytes_of(layout.dtype, elems), STORAGE)?;
                if elems > 0 {
                    encoder.copy_buffer_to_buffer(&arena.slots[sl], 0, &own, 0, bytes_of(layout.dtype, elems));
                    recorded = true;
                }
                own
            }
            Loc::Input(_) | Loc::Extern => {
                return Err(WgpuError::Internal(format!("output b{} was never computed", o.buf)));
            }
        };
        let dev = GpuBuffer::new(buf, layout.dtype, elems as usize);
        results.insert(o.buf, Storage::on_device(Arc::new(dev)));
    }
    if recorded {
        gpu.queue.submit([encoder.finish()]);
        gpu.counters.submit();
    }
    inst.plan
        .outputs
        .iter()
        .map(|o| {
            let storage = match inst.loc[o.buf] {
                Loc::Input(i) => inputs[i].storage.clone(),
                _ => results
                    .get(&o.buf)
                    .cloned()
                    .ok_or_else(|| WgpuError::Internal(format!("output b{} was never computed", o.buf)))?,
            };
            Ok(CpuTensor { storage, meta: o.meta.clone() })
        })
        .collect()
}

impl CompiledGraph<CpuTensor> for WgpuCompiledGraph {
    fn signature(&self) -> Option<(Vec<aotgrad_ir::TensorMeta>, usize)> {
        Some((self.graph.inputs.iter().map(|i| i.meta.clone()).collect(), self.graph.outputs.len()))
    }
    fn run_with_symbols(&self, inputs: &[CpuTensor], symbols: &[(SymId, i64)]) -> Result<Vec<CpuTensor>, BackendError> {
        if self.plan.is_none() {
            return aotgrad_cpu::interpret_with_symbols(&self.graph, inputs, symbols).map_err(backend_err);
        }
        self.run_planned(inputs, symbols).map_err(backend_err)
    }
    fn serialize(&self) -> Vec<u8> {
        // Encoding plain data cannot fail; an empty artifact would be rejected on load.
        aotgrad_ir::codec::encode("wgpu artifact", &self.artifact()).unwrap_or_default()
    }
}

//! Compiled graphs: pipelines per lowered plan, reused device buffers, one command
//! buffer per call between host-run ops.

use crate::device::{gpu, Gpu};
use crate::wgsl::{access_extent, elem_type, lower_plan, Step};
use crate::{backend_err, WgpuError};
use aotgrad_cpu::{Buffer as HostBuffer, CpuTensor, Storage};
use aotgrad_fusion::{extent, plan_graph, plan_slots, print_plan, BufferKind, KernelPlan, PlanError, SlotPlan};
use aotgrad_ir::{BackendError, CompiledGraph, DType, Dim, Graph, SymId, TensorMeta};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a buffer of the plan lives during a call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loc {
    Input(usize),
    Slot(usize),
    Output(usize),
    Extern,
}

/// Device buffers one call uses: the slots (kept for the next call of the same
/// instance) and the outputs (new every call: they become the results' storages).
struct Arena {
    slots: Vec<wgpu::Buffer>,
    outs: Vec<wgpu::Buffer>,
}

/// A result's elements in a device buffer: the storage of a tensor the backend
/// returns, read back only when the host needs it, and bound directly when a later
/// call reads it.
#[derive(Debug)]
pub(crate) struct GpuBuffer {
    buf: wgpu::Buffer,
    dtype: DType,
    len: usize,
}

impl aotgrad_cpu::DeviceBuffer for GpuBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn read_back(&self) -> Result<HostBuffer, String> {
        let gpu = gpu().map_err(|e| e.to_string())?;
        gpu.check_health().map_err(|e| e.to_string())?;
        let encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        let mut v = read_back(gpu, encoder, &[(&self.buf, self.dtype, self.len as u64)]).map_err(|e| e.to_string())?;
        v.pop().ok_or_else(|| "no buffer came back".to_string())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The device buffer holding `t`'s storage, when it is one of ours of the right
/// dtype and at least `need` elements.
fn resident(t: &CpuTensor, need: u64) -> Option<wgpu::Buffer> {
    let dev = t.storage.device_copy()?;
    let g = dev.as_any().downcast_ref::<GpuBuffer>()?;
    (g.dtype == t.meta.dtype && g.len as u64 >= need).then(|| g.buf.clone())
}

/// A plan lowered for one binding of its symbols.
struct Instance {
    plan: KernelPlan,
    steps: Vec<Step>,
    pipelines: Vec<Option<wgpu::ComputePipeline>>,
    slots: SlotPlan,
    loc: Vec<Loc>,
    /// Per output buffer: (plan buffer, dtype, elements).
    out_bufs: Vec<(usize, DType, u64)>,
    /// Per graph input: elements the kernels read.
    input_need: Vec<u64>,
    /// Slot buffers of earlier calls, for reuse.
    pool: Mutex<Vec<Vec<wgpu::Buffer>>>,
}

/// Bytes of a device element: f16 is 2, every other device type 4 (bool as u32).
fn elem_bytes(dtype: DType) -> u64 {
    if dtype == DType::F16 {
        2
    } else {
        4
    }
}

/// Bytes of a device buffer of `elems` elements: a multiple of 4 (what copies and
/// writes need), never empty (bindings must not be).
fn bytes_of(dtype: DType, elems: u64) -> u64 {
    (elems * elem_bytes(dtype)).next_multiple_of(4).max(4)
}

fn create_buffer(gpu: &Gpu, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, WgpuError> {
    let s = &gpu.summary;
    if bytes > s.max_buffer_bytes || (usage.contains(wgpu::BufferUsages::STORAGE) && bytes > s.max_binding_bytes) {
        return Err(WgpuError::Limit {
            what: label.to_string(),
            reason: format!(
                "a buffer of {bytes} bytes exceeds the adapter's largest buffer ({} bytes) or storage binding ({} bytes)",
                s.max_buffer_bytes, s.max_binding_bytes
            ),
        });
    }
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage,
        mapped_at_creation: false,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(WgpuError::Device(format!("out of device memory allocating {bytes} bytes for {label}: {e}")));
    }
    Ok(buf)
}

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

impl Instance {
    fn new(gpu: &Gpu, plan: KernelPlan) -> Result<Instance, WgpuError> {
        let steps = lower_plan(&plan)?;
        Instance::from_lowered(gpu, plan, steps, None)
    }

    /// An instance of a plan lowered already (`steps`), with its slot plan when one
    /// is given (checked: every intermediate fits its slot), else planned here.
    fn from_lowered(
        gpu: &Gpu,
        plan: KernelPlan,
        steps: Vec<Step>,
        slots: Option<SlotPlan>,
    ) -> Result<Instance, WgpuError> {
        let mut extents = Vec::with_capacity(plan.buffers.len());
        for (b, buf) in plan.buffers.iter().enumerate() {
            extents.push(
                extent(&buf.layout).ok_or_else(|| WgpuError::Internal(format!("buffer b{b} has no concrete size")))?,
            );
        }
        // Every access stays inside its buffer (inputs are checked per call).
        let mut touched: Vec<&aotgrad_fusion::Access> = Vec::new();
        for k in &plan.kernels {
            touched.extend(k.reads());
            touched.extend(stores_of(k));
        }
        for a in touched {
            if !matches!(plan.buffers[a.buf].kind, BufferKind::Input(_)) && access_extent(a)? > extents[a.buf] as u64 {
                return Err(WgpuError::Internal(format!("an access reads past the end of buffer b{}", a.buf)));
            }
        }
        let slots = match slots {
            Some(s) => {
                let fits = s.slot_of.len() == plan.buffers.len()
                    && s.slot_of.iter().enumerate().all(|(b, slot)| {
                        slot.is_none_or(|i| {
                            s.slots.get(i).is_some_and(|sl| {
                                sl.dtype == plan.buffers[b].layout.dtype
                                    && sl.elems >= extents[b]
                                    && plan.buffers[b].kind == BufferKind::Intermediate
                            })
                        })
                    });
                if !fits {
                    return Err(WgpuError::Internal("a stored buffer plan does not fit its kernel plan".into()));
                }
                s
            }
            None => plan_slots(&plan, &extents),
        };
        // Every buffer a step names exists (stored steps are checked like fresh ones).
        let n = plan.buffers.len();
        let in_range = steps.iter().all(|st| match st {
            Step::Gpu(k) => k.bindings.iter().all(|(b, _)| *b < n),
            Step::Host(e) => e.out < n && e.args.iter().all(|a| a.buf < n),
        });
        if !in_range || plan.outputs.iter().any(|o| o.buf >= n) {
            return Err(WgpuError::Internal("a step names a buffer its kernel plan does not have".into()));
        }
        let mut loc = Vec::with_capacity(plan.buffers.len());
        let mut out_bufs = Vec::new();
        for (b, buf) in plan.buffers.iter().enumerate() {
            loc.push(match buf.kind {
                BufferKind::Input(i) => Loc::Input(i),
                // This backend plans without input updates (its inputs are uploads).
                BufferKind::Updated(_) => {
                    return Err(WgpuError::Internal("a kernel plan that updates an input in place".into()))
                }
                // An intermediate no kernel writes has no slot (and no reader).
                BufferKind::Intermediate => slots.slot_of[b].map_or(Loc::Extern, Loc::Slot),
                BufferKind::Output => {
                    let n = extent(&buf.layout).ok_or_else(|| WgpuError::Internal("a symbolic output".into()))?;
                    out_bufs.push((b, buf.layout.dtype, n as u64));
                    Loc::Output(out_bufs.len() - 1)
                }
                BufferKind::Extern => Loc::Extern,
            });
        }
        let mut input_need = vec![0u64; plan.inputs.len()];
        for k in &plan.kernels {
            for a in k.reads() {
                if let Loc::Input(i) = loc[a.buf] {
                    input_need[i] = input_need[i].max(access_extent(a)?);
                }
            }
        }
        for o in &plan.outputs {
            if let Loc::Input(i) = loc[o.buf] {
                input_need[i] = input_need[i].max(extent(&o.meta).unwrap_or(0) as u64);
            }
        }
        let mut pipelines = Vec::with_capacity(steps.len());
        for s in &steps {
            pipelines.push(match s {
                Step::Gpu(k) => {
                    if k.bindings.len() as u64 > gpu.summary.max_storage_buffers as u64 {
                        return Err(WgpuError::Limit {
                            what: k.what.clone(),
                            reason: format!(
                                "the kernel binds {} buffers; the adapter allows {} per kernel",
                                k.bindings.len(),
                                gpu.summary.max_storage_buffers
                            ),
                        });
                    }
                    Some(pipeline(gpu, &k.entry, &k.wgsl)?)
                }
                Step::Host(_) => None,
            });
        }
        Ok(Instance { plan, steps, pipelines, slots, loc, out_bufs, input_need, pool: Mutex::new(Vec::new()) })
    }

    fn arena(&self, gpu: &Gpu) -> Result<Arena, WgpuError> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let slots = match pooled {
            Some(s) => s,
            None => self
                .slots
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| create_buffer(gpu, &format!("slot {i}"), bytes_of(s.dtype, s.elems as u64), STORAGE))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let outs = self
            .out_bufs
            .iter()
            .map(|(b, d, n)| create_buffer(gpu, &format!("output b{b}"), bytes_of(*d, *n), STORAGE))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arena { slots, outs })
    }
}

/// The accesses a kernel writes through.
fn stores_of(k: &aotgrad_fusion::Kernel) -> Vec<&aotgrad_fusion::Access> {
    use aotgrad_fusion::Kernel;
    match k {
        Kernel::Pointwise(p) => p.stores.iter().map(|s| &s.dst).collect(),
        Kernel::Reduce(r) => vec![&r.dst],
        Kernel::Matmul(m) => {
            let mut v = vec![&m.out];
            if let Some(e) = &m.epilogue {
                v.extend(e.stores.iter().map(|s| &s.dst));
            }
            v
        }
        Kernel::Extern(_) => Vec::new(),
        Kernel::Rows(r) => r.stages.iter().flat_map(stores_of).collect(),
    }
}

fn pipeline(gpu: &Gpu, entry: &str, wgsl: &str) -> Result<wgpu::ComputePipeline, WgpuError> {
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(entry),
        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
    });
    let p = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: None,
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(WgpuError::Internal(format!("the shader of {entry} did not compile: {e}\n{wgsl}")));
    }
    Ok(p)
}

/// Host buffer → device bytes (4 per element, 2 for f16; padded to a multiple of 4).
fn to_device_bytes(buf: &HostBuffer, elems: usize, what: &str) -> Result<Vec<u8>, WgpuError> {
    elem_type(buf.dtype(), what)?;
    let mut out = Vec::with_capacity(bytes_of(buf.dtype(), elems as u64) as usize);
    match buf {
        HostBuffer::F16(v) => {
            v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes()));
            out.resize(out.len().next_multiple_of(4), 0);
        }
        HostBuffer::F32(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        HostBuffer::Bool(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&(*x as u32).to_le_bytes())),
        HostBuffer::I32(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        // i64 lives on the device as i32: every value must fit.
        HostBuffer::I64(v) => {
            for (k, x) in v[..elems].iter().enumerate() {
                let w = i32::try_from(*x).map_err(|_| WgpuError::Unsupported {
                    what: what.to_string(),
                    reason: format!(
                        "the i64 value {x} (element {k} of an operand) is beyond i32: the wgpu backend holds i64 \
                         values as i32 on the device (use the CPU backend for larger integers)"
                    ),
                })?;
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        other => return Err(WgpuError::Internal(format!("upload of {}", other.dtype()))),
    }
    Ok(out)
}

fn from_device_bytes(dtype: DType, bytes: &[u8], elems: usize) -> Result<HostBuffer, WgpuError> {
    if dtype == DType::F16 {
        let halves = bytes.chunks_exact(2).take(elems).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])));
        return Ok(HostBuffer::F16(halves.collect()));
    }
    let words = bytes.chunks_exact(4).take(elems).map(|c| [c[0], c[1], c[2], c[3]]);
    Ok(match dtype {
        DType::F32 => HostBuffer::F32(words.map(f32::from_le_bytes).collect()),
        DType::Bool => HostBuffer::Bool(words.map(|w| u32::from_le_bytes(w) != 0).collect()),
        DType::I32 => HostBuffer::I32(words.map(i32::from_le_bytes).collect()),
        DType::I64 => HostBuffer::I64(words.map(|w| i32::from_le_bytes(w) as i64).collect()),
        d => return Err(WgpuError::Internal(format!("readback of {d}"))),
    })
}

/// Read device buffers back (one submission for all of them): the encoder so far,
/// copies into staging buffers, then one wait.
fn read_back(
    gpu: &Gpu,
    mut encoder: wgpu::CommandEncoder,
    bufs: &[(&wgpu::Buffer, DType, u64)],
) -> Result<Vec<HostBuffer>, WgpuError> {
    let mut staging = Vec::with_capacity(bufs.len());
    for (i, (b, dtype, n)) in bufs.iter().enumerate() {
        if *n == 0 {
            staging.push(None);
            continue;
        }
        let bytes = bytes_of(*dtype, *n);
        let s = create_buffer(
            gpu,
            &format!("readback {i}"),
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        encoder.copy_buffer_to_buffer(b, 0, &s, 0, bytes);
        staging.push(Some(s));
    }
    gpu.queue.submit([encoder.finish()]);
    gpu.counters.submit();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, s) in staging.iter().enumerate() {
        if let Some(s) = s {
            let tx = tx.clone();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((i, r));
            });
        }
    }
    drop(tx);
    gpu.wait()?;
    for (i, r) in rx.try_iter() {
        r.map_err(|e| WgpuError::Device(format!("reading back buffer {i} failed: {e}")))?;
    }
    let mut out = Vec::with_capacity(bufs.len());
    for ((_, dtype, n), s) in bufs.iter().zip(&staging) {
        match s {
            None => out.push(from_device_bytes(*dtype, &[], 0)?),
            Some(s) => {
                let view = s
                    .get_mapped_range(..)
                    .map_err(|e| WgpuError::Device(format!("a readback buffer did not map: {e}")))?;
                out.push(from_device_bytes(*dtype, &view, *n as usize)?);
                drop(view);
                s.unmap();
                gpu.counters.readback(n * elem_bytes(*dtype));
            }
        }
    }
    Ok(out)
}

fn meta_of(a: &aotgrad_fusion::Access) -> TensorMeta {
    TensorMeta { shape: a.shape.clone(), strides: a.strides.clone(), offset: a.offset.clone(), dtype: a.dtype }
}

/// The format tag of [`WgpuArtifact`]s.
pub const ARTIFACT_FORMAT: &str = "aotgrad-wgpu/4";

/// The wgpu backend's artifact, plain data encoded with [`aotgrad_ir::codec`]: the
/// graph's text, the adapter features its kernels need, and for a static planned
/// graph its kernel plan, the WGSL sources with their launch plan (steps in order:
/// entry point, bindings, workgroups; host steps), and the buffer plan.
/// [`aotgrad_ir::Backend::deserialize`] plans the graph again and rejects an artifact
/// whose stored plan differs; [`aotgrad_ir::Backend::load_verified`] (a checked cache
/// entry) creates the pipelines from the stored sources without planning or lowering.
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

    /// Rebuild from a checked cache entry: a static graph's pipelines come from the
    /// stored WGSL, with no planning or lowering (the features they need are checked
    /// against the adapter).
    pub(crate) fn from_trusted(bytes: &[u8]) -> Result<WgpuCompiledGraph, WgpuError> {
        let a = Self::decode_artifact(bytes)?;
        let graph = aotgrad_ir::text::parse_graph(&a.graph).map_err(|e| WgpuError::Unsupported {
            what: "artifact".into(),
            reason: format!("its graph does not parse: {e}"),
        })?;
        let Some(k) = a.kernels else {
            return WgpuCompiledGraph::new(graph);
        };
        let g = gpu()?;
        for f in &a.features {
            let has = match f.as_str() {
                "shader-f16" => g.summary.shader_f16,
                _ => false,
            };
            if !has {
                return Err(WgpuError::Unsupported {
                    what: "artifact".into(),
                    reason: format!("its kernels need the adapter feature {f}, which {} lacks", g.summary.name),
                });
            }
        }
        let inst = Instance::from_lowered(g, k.plan.clone(), k.steps, Some(k.slots))?;
        Ok(WgpuCompiledGraph {
            graph,
            plan: Some(k.plan),
            fallback: None,
            fixed: Some(Arc::new(inst)),
            by_binding: Mutex::new(HashMap::new()),
        })
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
        inst.pool.lock().unwrap_or_else(|e| e.into_inner()).push(arena.slots);
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
        let arena = inst.arena(gpu)?;
        let mut uploaded: Vec<Option<wgpu::Buffer>> = vec![None; inst.loc.len()];
        let mut passes = Vec::new();
        for (si, step) in inst.steps.iter().enumerate() {
            let Step::Gpu(k) = step else { continue };
            let mut entries = Vec::with_capacity(k.bindings.len());
            for (b, _) in &k.bindings {
                let buf = match inst.loc[*b] {
                    Loc::Slot(s) => arena.slots[s].clone(),
                    Loc::Output(o) => arena.outs[o].clone(),
                    Loc::Input(i) => match uploaded[*b].clone().or_else(|| resident(&inputs[i], inst.input_need[i])) {
                        Some(u) => {
                            uploaded[*b] = Some(u.clone());
                            u
                        }
                        None => {
                            inputs[i].storage.sync_host().map_err(aotgrad_cpu::CpuError::Device)?;
                            let guard = inputs[i].storage.read();
                            let bytes = to_device_bytes(&guard, inst.input_need[i] as usize, &k.what)?;
                            let u = create_buffer(gpu, &format!("upload b{b}"), (bytes.len() as u64).max(4), STORAGE)?;
                            gpu.queue.write_buffer(&u, 0, &bytes);
                            gpu.counters.upload(bytes.len() as u64);
                            uploaded[*b] = Some(u.clone());
                            u
                        }
                    },
                    Loc::Extern => {
                        return Err(WgpuError::Internal(format!("kernel {} reads an extern buffer", k.entry)))
                    }
                };
                entries.push(buf);
            }
            if k.groups.contains(&0) {
                continue;
            }
            let pipe = inst.pipelines[si].as_ref().ok_or_else(|| WgpuError::Internal("no pipeline".into()))?;
            let bind: Vec<wgpu::BindGroupEntry> = entries
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                .collect();
            let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&k.entry),
                layout: &pipe.get_bind_group_layout(0),
                entries: &bind,
            });
            passes.push((pipe, group, k.groups));
        }
        let run = |n: usize| -> Result<f64, WgpuError> {
            let mut encoder =
                gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("aotgrad timing") });
            for _ in 0..n {
                for (pipe, group, groups) in &passes {
                    let mut pass = encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
                    pass.set_pipeline(pipe);
                    pass.set_bind_group(0, group, &[]);
                    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                }
            }
            let t = std::time::Instant::now();
            gpu.queue.submit([encoder.finish()]);
            gpu.counters.submit();
            gpu.wait()?;
            Ok(t.elapsed().as_secs_f64())
        };
        let result = run(1).and_then(|_| run(reps)).map(|s| s / reps as f64);
        inst.pool.lock().unwrap_or_else(|e| e.into_inner()).push(arena.slots);
        result
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
                            if let Some(d) = resident(&inputs[i], inst.input_need[i]) {
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
                        let bytes = to_device_bytes(&guard, elems, &k.what)?;
                        let buf = create_buffer(gpu, &format!("upload b{b}"), (bytes.len() as u64).max(4), STORAGE)?;
                        gpu.queue.write_buffer(&buf, 0, &bytes);
                        gpu.counters.upload(bytes.len() as u64);
                        // A whole input uploaded stays with its storage: the next
                        // call binds it until the host writes the storage.
                        if matches!(inst.loc[*b], Loc::Input(_)) && elems == guard.len() {
                            let copy = GpuBuffer { buf: buf.clone(), dtype: guard.dtype(), len: elems };
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
                let layout = pipe.get_bind_group_layout(0);
                let bind: Vec<wgpu::BindGroupEntry> = entries
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                    .collect();
                let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&k.entry),
                    layout: &layout,
                    entries: &bind,
                });
                {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(&k.entry),
                        timestamp_writes: None,
                    });
                    pass.set_pipeline(pipe);
                    pass.set_bind_group(0, &group, &[]);
                    pass.dispatch_workgroups(k.groups[0], k.groups[1], k.groups[2]);
                }
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
        let dev = GpuBuffer { buf, dtype: layout.dtype, len: elems as usize };
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

//! Kernel launch: a lowered plan turned into what a call dispatches, and the
//! dispatching itself.
//!
//! An [`Instance`] is a plan lowered for one binding of its symbols: its steps, one
//! compute pipeline per GPU step (created once, checked against the adapter's binding
//! limit), where each plan buffer lives during a call ([`Loc`]) and how much of each
//! input the kernels read. Launching a kernel is one bind group over its buffers, in
//! binding order, and one compute pass with the step's workgroup counts; a kernel
//! with an empty grid is skipped. The device timing of a static graph records many
//! runs of all its passes into one command buffer.

use crate::device::Gpu;
use crate::resident::{resident_buffer, upload, Arena, SlotPool};
use crate::wgsl::{access_extent, lower_plan, Step};
use crate::WgpuError;
use aotgrad_cpu::CpuTensor;
use aotgrad_fusion::{extent, plan_slots, BufferKind, KernelPlan, SlotPlan};
use aotgrad_ir::DType;

/// Where a buffer of the plan lives during a call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Loc {
    Input(usize),
    Slot(usize),
    Output(usize),
    Extern,
}

/// A plan lowered for one binding of its symbols.
pub(crate) struct Instance {
    pub(crate) plan: KernelPlan,
    pub(crate) steps: Vec<Step>,
    pub(crate) pipelines: Vec<Option<wgpu::ComputePipeline>>,
    pub(crate) slots: SlotPlan,
    pub(crate) loc: Vec<Loc>,
    /// Per output buffer: (plan buffer, dtype, elements).
    pub(crate) out_bufs: Vec<(usize, DType, u64)>,
    /// Per graph input: elements the kernels read.
    pub(crate) input_need: Vec<u64>,
    /// Slot buffers of earlier calls, for reuse.
    pub(crate) pool: SlotPool,
}

impl Instance {
    pub(crate) fn new(gpu: &Gpu, plan: KernelPlan) -> Result<Instance, WgpuError> {
        let steps = lower_plan(&plan)?;
        Instance::from_lowered(gpu, plan, steps, None)
    }

    /// An instance of a plan lowered already (`steps`), with its slot plan when one
    /// is given (checked: every intermediate fits its slot), else planned here.
    pub(crate) fn from_lowered(
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
        Ok(Instance { plan, steps, pipelines, slots, loc, out_bufs, input_need, pool: SlotPool::default() })
    }

    /// The device buffers of one call (see [`Arena::take`]).
    pub(crate) fn arena(&self, gpu: &Gpu) -> Result<Arena, WgpuError> {
        Arena::take(gpu, &self.pool, &self.slots, &self.out_bufs)
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

/// The bind group of a kernel: `buffers` bound at 0, 1, ... in the order of the
/// kernel's bindings.
pub(crate) fn bind_group(
    gpu: &Gpu,
    label: &str,
    pipe: &wgpu::ComputePipeline,
    buffers: &[wgpu::Buffer],
) -> wgpu::BindGroup {
    let layout = pipe.get_bind_group_layout(0);
    let bind: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
        .collect();
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &layout, entries: &bind })
}

/// Record one kernel: a compute pass dispatching `groups` workgroups.
pub(crate) fn dispatch(
    encoder: &mut wgpu::CommandEncoder,
    label: Option<&str>,
    pipe: &wgpu::ComputePipeline,
    group: &wgpu::BindGroup,
    groups: [u32; 3],
) {
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label, timestamp_writes: None });
    pass.set_pipeline(pipe);
    pass.set_bind_group(0, group, &[]);
    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
}

/// Device time of one run of a static instance without host steps (see
/// `WgpuCompiledGraph::device_seconds`): inputs uploaded and bind groups made once,
/// one warm-up run, then `reps` runs recorded into one command buffer and waited for.
pub(crate) fn time_kernels(gpu: &Gpu, inst: &Instance, inputs: &[CpuTensor], reps: usize) -> Result<f64, WgpuError> {
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
                Loc::Input(i) => match uploaded[*b].clone().or_else(|| resident_buffer(&inputs[i], inst.input_need[i]))
                {
                    Some(u) => {
                        uploaded[*b] = Some(u.clone());
                        u
                    }
                    None => {
                        inputs[i].storage.sync_host().map_err(aotgrad_cpu::CpuError::Device)?;
                        let guard = inputs[i].storage.read();
                        let u = upload(gpu, *b, &guard, inst.input_need[i] as usize, &k.what)?;
                        uploaded[*b] = Some(u.clone());
                        u
                    }
                },
                Loc::Extern => return Err(WgpuError::Internal(format!("kernel {} reads an extern buffer", k.entry))),
            };
            entries.push(buf);
        }
        if k.groups.contains(&0) {
            continue;
        }
        let pipe = inst.pipelines[si].as_ref().ok_or_else(|| WgpuError::Internal("no pipeline".into()))?;
        let group = bind_group(gpu, &k.entry, pipe, &entries);
        passes.push((pipe, group, k.groups));
    }
    let run = |n: usize| -> Result<f64, WgpuError> {
        let mut encoder =
            gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("aotgrad timing") });
        for _ in 0..n {
            for (pipe, group, groups) in &passes {
                dispatch(&mut encoder, None, pipe, group, *groups);
            }
        }
        let t = std::time::Instant::now();
        gpu.queue.submit([encoder.finish()]);
        gpu.counters.submit();
        gpu.wait()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let result = run(1).and_then(|_| run(reps)).map(|s| s / reps as f64);
    arena.recycle(&inst.pool);
    result
}

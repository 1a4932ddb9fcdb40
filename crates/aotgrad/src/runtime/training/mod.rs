//! The training path: joint graph, partition, compiled forward and backward.
//!
//! At compile time the functional graph (outputs: updated inputs, user outputs,
//! intermediate bases) is differentiated into a joint graph with AOTAutograd's
//! conventions — tangents only for outputs that require grad and are not aliases (an
//! alias's gradient reaches its base: an intermediate base output, another output, or
//! an input directly), plus updated inputs whose new value autograd tracks — and
//! partitioned into a forward graph (returning the saved values too) and a backward
//! graph. Differentiation honours what autograd did not see while tracing (no-grad
//! regions, `detach`, hidden mutations: [`aotgrad_functionalize::AutogradFacts`]).
//!
//! At run time [`run_forward`] runs the forward graph and the epilogue, sets the
//! autograd flags eager would have set, and keeps the saved values safe from the
//! epilogue's writes; [`PendingBackward::backward`] (module `backward`) turns the
//! gradients of the user's outputs into tangents, runs the backward graph, and maps
//! the gradients of graph inputs back to the caller's arguments.

mod backward;

pub use backward::PendingBackward;

use super::{epilogue, graph_inputs, traced_input, Arg, Bindings, Entry};
use crate::error::{Error, Result};
use aotgrad_autodiff::{build_joint_with_cuts, GradCuts, JointGraph};
use aotgrad_cache::TrainingMeta;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{CompiledGraph, Op, TensorMeta};
use aotgrad_meta::{ArgSlot, OutputKind};
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, Partitioned, SimplifyLimits,
};
use aotgrad_trace::{ShapeEnv, Tensor};
use std::sync::{Arc, Mutex};

/// Which partitioner splits the joint graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Partitioner {
    /// Save every forward value the backward needs.
    Default,
    /// Min-cut rematerialization with an activation memory budget in `[0, 1]`.
    MinCut {
        /// 1 = the min-cut optimum; 0 = save as little as possible.
        activation_memory_budget: f64,
    },
}

impl Default for Partitioner {
    fn default() -> Self {
        Partitioner::MinCut { activation_memory_budget: 1.0 }
    }
}

/// The runnable training graphs of one entry.
pub(crate) struct TrainingParts {
    pub fw: Arc<dyn CompiledGraph<CpuTensor>>,
    pub bw: Arc<dyn CompiledGraph<CpuTensor>>,
}

/// What compiling the training path produces.
pub(crate) struct CompiledTraining {
    pub fw: Arc<dyn CompiledGraph<CpuTensor>>,
    pub bw: Arc<dyn CompiledGraph<CpuTensor>>,
    pub meta: TrainingMeta,
    /// Joint (simplified), forward and backward graphs.
    pub graphs: [aotgrad_ir::Graph; 3],
}

/// The traced inputs that graph input `g` carries (one, or a synthetic base's members).
fn members_of(fz: &aotgrad_functionalize::Functionalized, g: usize) -> impl Iterator<Item = usize> + '_ {
    let conv = &fz.convention;
    conv.args.iter().enumerate().filter_map(move |(k, slot)| {
        let here = match slot {
            ArgSlot::Input(i) => *i == g,
            ArgSlot::ViewOfBase { base } => conv.bases[*base].input == g,
        };
        here.then_some(k)
    })
}

/// Whether graph input `g` requires grad (a synthetic base does if a member does).
fn graph_input_requires_grad(fz: &aotgrad_functionalize::Functionalized, g: usize) -> bool {
    members_of(fz, g).any(|k| fz.meta.inputs[k].requires_grad)
}

/// Differentiate, partition and compile.
pub(crate) fn compile_training(
    fz: &aotgrad_functionalize::Functionalized,
    env: &mut ShapeEnv,
    partitioner: &Partitioner,
    simplify: bool,
    backend: &dyn aotgrad_ir::Backend<CpuTensor>,
    timer: &mut super::StageTimer,
) -> Result<CompiledTraining> {
    let meta = &fz.meta;
    let n_in = fz.graph.inputs.len();
    let requires_grad: Vec<bool> = (0..n_in).map(|g| graph_input_requires_grad(fz, g)).collect();
    let float = |m: &TensorMeta| m.dtype.is_float();
    let mut has_tangent = Vec::with_capacity(meta.num_graph_outputs());
    for &g in &meta.mutated_inputs {
        // The new value of a mutated input gets a tangent when autograd tracks it: the
        // mutation was visible (its value requires grad), or it was hidden from
        // autograd but the input requires grad (the new value then passes its
        // gradient straight to the input).
        let hidden = members_of(fz, g).all(|k| meta.inputs[k].mutations_hidden_from_autograd);
        has_tangent.push((requires_grad[g] || !hidden) && float(&fz.graph.inputs[g].meta));
    }
    for o in &meta.outputs {
        has_tangent.push((o.kind == OutputKind::NonAlias || o.own_gradient) && o.requires_grad && float(&o.meta));
    }
    for b in 0..meta.num_intermediate_bases {
        let v = fz.graph.outputs[meta.intermediate_base_index(b)];
        let m = fz.graph.meta_of(v).ok_or_else(|| Error::Internal("intermediate base without meta".into()))?;
        has_tangent.push(float(m));
    }
    let joint = {
        let _span = tracing::debug_span!("joint").entered();
        let cuts = GradCuts { detached: &fz.autograd.detached, straight_through: &fz.autograd.straight_through };
        build_joint_with_cuts(&fz.graph, &requires_grad, &has_tangent, &cuts, env)?
    };
    timer.stage("joint");
    let joint = if simplify {
        let _span = tracing::debug_span!("simplify").entered();
        let simplified = simplify_joint(&joint, &SimplifyLimits::default())?;
        // The unsimplified joint graph is not needed again: free it before the
        // partitioner and the backend allocate theirs (a shadowed binding would live
        // to the end of the function).
        drop(joint);
        simplified
    } else {
        joint
    };
    timer.stage("simplify");
    let part = {
        let _span = tracing::debug_span!("partition").entered();
        match partitioner {
            Partitioner::Default => default_partition(&joint)?,
            Partitioner::MinCut { activation_memory_budget } => {
                min_cut_partition(&joint, &MinCutConfig { activation_memory_budget: *activation_memory_budget })?
            }
        }
    };
    timer.stage("partition");
    tracing::debug!(
        target: "aotgrad::partition",
        "forward graph:\n{}backward graph:\n{}{}",
        aotgrad_ir::text::print_graph(&part.forward),
        aotgrad_ir::text::print_graph(&part.backward),
        part.report
    );
    // The forward's first outputs are the mutated inputs' new values, as in the
    // functional graph (the joint graph keeps its outputs first).
    let fw = backend.compile_with(&part.forward, &super::input_updates(fz))?;
    timer.stage("backend forward");
    let bw = backend.compile(&part.backward)?;
    timer.stage("backend backward");
    let JointGraph { graph: joint_graph, num_primals, num_tangents, num_fw_outputs, tangent_outputs, grad_primals } =
        joint;
    let Partitioned { forward, backward, report, .. } = part;
    let meta =
        TrainingMeta { num_fw_outputs, tangent_outputs, grad_primals, num_primals, num_tangents, partition: report };
    Ok(CompiledTraining { fw: Arc::from(fw), bw: Arc::from(bw), meta, graphs: [joint_graph, forward, backward] })
}

/// Run the compiled forward of a training entry, the epilogue, and set the autograd
/// flags; the returned [`PendingBackward`] holds what the backward needs.
pub(crate) fn run_forward(
    name: &str,
    entry: &Arc<Entry>,
    args: &[Arg],
    env: Bindings,
) -> Result<(Vec<Tensor>, PendingBackward)> {
    let parts = entry.training.as_ref().ok_or_else(|| Error::Internal("not a training entry".into()))?;
    let inputs = graph_inputs(name, entry, args)?;
    let versions = epilogue::versions_before(entry, args)?;
    let input_metas =
        (0..entry.m().convention.args.len()).map(|k| traced_input_meta(entry, args, k)).collect::<Result<_>>()?;
    let outs = {
        let _span = tracing::trace_span!("run_forward").entered();
        parts.fw.run_with_symbols(&inputs, &super::given_symbols(&env))?
    };
    let n = entry.tm()?.num_fw_outputs;
    if outs.len() < n {
        return Err(Error::Internal(format!("forward returned {} values, expected at least {n}", outs.len())));
    }
    // The epilogue writes the new values of mutated inputs into the caller's storage:
    // a saved value viewing such an input (the old value, say) is copied first.
    let mutated: Vec<&CpuTensor> = entry.m().meta.mutated_inputs.iter().filter_map(|&g| inputs.get(g)).collect();
    let mut saved = Vec::with_capacity(outs.len() - n);
    for s in &outs[n..] {
        if mutated.iter().any(|m| m.same_storage(s)) {
            // Copy the whole storage and view the copy the same way: the backward
            // graph expects the saved value's exact layout.
            let whole = CpuTensor {
                storage: s.storage.clone(),
                meta: TensorMeta::from_sizes(&[s.storage.len()], s.meta.dtype),
            };
            let copy = aotgrad_cpu::execute(&Op::Clone, &[&whole], &whole.meta)?;
            saved.push(CpuTensor { storage: copy.storage, meta: s.meta.clone() });
        } else {
            saved.push(s.clone());
        }
    }
    let results = epilogue::apply(entry, args, &env, &inputs, &outs[..n], versions)?;
    mark_grad_flags(entry, args, &results)?;
    // No saved value may change before the backward (PyTorch's "modified by an inplace
    // operation" check): those viewing the caller's storage, or the storage of an
    // output (which the caller may write in place), are caught by their storage's
    // version; the others have private storage, whose version never moves.
    let versions = saved.iter().map(|s| s.storage.version()).collect();
    let pending = PendingBackward {
        name: name.to_string(),
        entry: entry.clone(),
        saved,
        versions,
        args: args.to_vec(),
        input_metas,
        outputs: results.clone(),
        env,
        used: Mutex::new(false),
    };
    Ok((results, pending))
}

/// Autograd flags after a compiled forward, as eager leaves them: every output that
/// requires grad is a non-leaf requiring grad (an output that *is* an input keeps the
/// input's flags; a view taken under no-grad is a leaf that requires grad, as in
/// PyTorch), and so is every input whose data the call changed with a value
/// that requires grad (a mutation autograd sees), and the base of such an input when
/// it is a view.
pub(crate) fn mark_grad_flags(entry: &Entry, args: &[Arg], results: &[Tensor]) -> Result<()> {
    let meta = &entry.m().meta;
    for (t, info) in results.iter().zip(&meta.outputs) {
        let fresh = !matches!(info.kind, OutputKind::IsInput(_) | OutputKind::SameAs(_));
        if info.own_gradient {
            // A `detach`ed alias with a history of its own: not a view for autograd.
            t.mark_detached_alias();
        }
        if info.requires_grad && fresh && info.meta.dtype.is_float() {
            if !info.no_grad_leaf {
                t.mark_differentiable_result()?;
            }
            if info.no_grad_view {
                // A view taken under no-grad is a leaf requiring grad; a grad-mode
                // view of one is a non-leaf; both refuse in-place ops in grad mode.
                t.mark_no_grad_view(info.no_grad_leaf);
            }
        }
    }
    for (k, info) in meta.inputs.iter().enumerate().take(entry.m().traced_args.len()) {
        let t = traced_input(entry, args, k)?;
        if !info.mutates_data || info.mutations_hidden_from_autograd || !t.dtype().is_float() {
            continue;
        }
        if !t.is_requires_grad() {
            t.mark_differentiable_result()?;
        }
        // As eager dispatch does: the base of a view written with a value that
        // requires grad requires grad too.
        if let Some(b) = t.base().filter(|b| b.dtype().is_float() && !b.is_requires_grad()) {
            b.mark_differentiable_result()?;
        }
    }
    Ok(())
}

/// The call-time metadata of traced input `k`.
pub(crate) fn traced_input_meta(entry: &Entry, args: &[Arg], k: usize) -> Result<TensorMeta> {
    if k >= entry.m().traced_args.len() {
        // Inputs the trace added itself (the RNG state): their traced metadata.
        let input = entry.m().input_metas.get(k).ok_or_else(|| Error::Internal(format!("no traced input {k}")))?;
        return Ok(input.clone());
    }
    Ok(traced_input(entry, args, k)?.meta())
}

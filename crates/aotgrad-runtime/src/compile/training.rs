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
//! At run time `crate::run::run_forward` runs the forward graph and the epilogue, and
//! [`crate::PendingBackward`] the backward graph.

use super::stages::{input_updates, StageTimer};
use crate::config::Partitioner;
use crate::error::{Error, Result};
use aotgrad_autodiff::{build_joint_with_cuts, GradCuts, JointGraph};
use aotgrad_cache::TrainingMeta;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{CompiledGraph, TensorMeta};
use aotgrad_meta::{ArgSlot, OutputKind};
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, Partitioned, SimplifyLimits,
};
use aotgrad_trace::ShapeEnv;
use std::sync::Arc;

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
    timer: &mut StageTimer,
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
    let fw = backend.compile_with(&part.forward, &input_updates(fz))?;
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

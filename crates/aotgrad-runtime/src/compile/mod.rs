//! Stage 1b of a call that no entry accepts: trace the user's function over fake
//! tensors, functionalize the trace and compile it (the inference graph, or the
//! training path of [`training`]) into a fresh [`AotResult`]. Nothing here runs a
//! compiled graph or knows the entries: the result goes back to the caller
//! ([`crate::function`]), which stores and instantiates it.

pub(crate) mod saved_versions;
pub(crate) mod stages;
pub(crate) mod training;

use crate::config::AotConfig;
use crate::error::{Error, Result};
use crate::signature::{Arg, Output};
use aotgrad_cache::{AotResult, ArgSig, Artifact, CallSig, GraphDumps, OutputSlot, ResultMeta, RngSlots};
use aotgrad_cpu::CpuTensor;
use aotgrad_functionalize::{functionalize, Options, TraceFacts};
use aotgrad_ir::ValueId;
use aotgrad_trace::{trace, ShapeEnv, Tensor, TraceConfig, Traced};
use stages::input_updates;
pub(crate) use stages::StageTimer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The user's function, over arguments and outputs that may be plain values.
pub(crate) type UserFn = dyn Fn(&[Arg]) -> crate::Result<Vec<Output>> + Send + Sync;

/// A traced call: the trace and how the call's arguments map to its inputs.
pub(crate) struct TracedCall {
    pub(crate) traced: Traced,
    /// Traced input `k` is user argument `traced_args[k]`.
    pub(crate) traced_args: Vec<usize>,
    /// The traced input of each user argument (`None` for non-tensors; an argument
    /// passed twice maps to one traced input).
    pub(crate) slot_of_arg: Vec<Option<usize>>,
    /// The user's outputs in order (tensors and plain values).
    pub(crate) layout: Vec<OutputSlot>,
}

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

/// Trace the user's function for a call with signature `sig`; `lifted_args` leading
/// arguments are not the user's (a module's parameters and buffers: see
/// [`crate::AotFunction`]).
pub(crate) fn trace_call(
    config: &AotConfig,
    lifted_args: usize,
    f: &Arc<UserFn>,
    sig: &CallSig,
    args: &[Arg],
) -> Result<TracedCall> {
    let _span = tracing::debug_span!("aot_trace", name = %config.name).entered();
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
    for &(arg, dim) in &config.dynamic {
        match slot_of_arg.get(arg).copied().flatten() {
            Some(k) if traced_args[k] == arg => dynamic.push((k, dim)),
            Some(_) => {}
            None => {
                return Err(call_error(config, format!("dynamic dim given for argument {arg}, which is not a tensor")))
            }
        }
    }
    let tc = TraceConfig {
        dynamic,
        duck_shape: config.duck_shape,
        decomps: config.decomps.clone(),
        input_names: Some(
            traced_args
                .iter()
                .map(|&i| {
                    config.arg_names.get(i).cloned().unwrap_or_else(|| format!("arg{}", i.saturating_sub(lifted_args)))
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

/// Functionalize a trace with what it recorded for autograd: the inputs' and outputs'
/// requires-grad flags, no-grad views, detached values, and which mutations autograd
/// does not see (all of them when the trace ran with `grad_on` false, inputs included).
/// The one set-up of [`TraceFacts`] for compiling and exporting.
pub(crate) fn functionalize_traced(
    traced: &Traced,
    grad_on: bool,
    options: &Options,
    env: &mut ShapeEnv,
) -> Result<aotgrad_functionalize::Functionalized> {
    let value_rg = &traced.value_requires_grad;
    let hidden = move |v: ValueId| !grad_on || !value_rg.get(v.0 as usize).copied().unwrap_or(false);
    let facts = TraceFacts {
        input_requires_grad: &traced.input_requires_grad,
        output_requires_grad: &traced.output_requires_grad,
        output_no_grad_view: &traced.output_no_grad_view,
        output_creation: &traced.output_creation,
        hidden_meta: &traced.hidden_meta,
        detach_values: &traced.detach_values,
        input_tracked_from: &traced.input_tracked_from,
        hidden_mutation: &hidden,
    };
    Ok(functionalize(&traced.graph, &facts, options, env)?)
}

/// Functionalize and compile a traced call into a fresh [`AotResult`].
pub(crate) fn compile_traced(
    config: &AotConfig,
    sig: CallSig,
    call: TracedCall,
    mut timer: StageTimer,
) -> Result<AotResult<CpuTensor>> {
    let _span = tracing::debug_span!("aot_compile", name = %config.name).entered();
    let TracedCall { traced, traced_args, slot_of_arg, layout } = call;
    // The training path returns every new input value (it gets a gradient): keeping
    // mutations inside the graph is for inference graphs only.
    let training_path = sig.grad_enabled && traced.input_requires_grad.iter().any(|&r| r);
    let options = Options { keep_input_mutations: config.keep_inference_input_mutations && !training_path };
    let mut env: ShapeEnv = traced.shape_env.clone();
    let fz = functionalize_traced(&traced, sig.grad_enabled, &options, &mut env)?;
    timer.stage("functionalize");
    let backend = config.backend.as_ref();
    let (forward, backward, training, joint_graphs) = if training_path {
        let c = training::compile_training(&fz, &mut env, &config.partitioner, config.simplify, backend, &mut timer)?;
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
        .map(|&v| fz.graph.meta_of(v).cloned().ok_or_else(|| Error::Internal(format!("graph output {v} has no meta"))))
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
        name: config.name.clone(),
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

fn call_error(config: &AotConfig, msg: String) -> Error {
    Error::Call { name: config.name.clone(), msg }
}

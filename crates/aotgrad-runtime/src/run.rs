//! Stage 4 of a call: run an entry's compiled graph on the bound graph inputs, then
//! the epilogue ([`crate::epilogue`]). Inference entries run their one graph
//! ([`run_inference`]); training entries run the compiled forward, set the autograd
//! flags eager would have set, keep the saved values safe from the epilogue's writes
//! and hand back a [`PendingBackward`] ([`run_forward`]).

use crate::backward::PendingBackward;
use crate::bind::{graph_inputs, traced_input, traced_input_meta};
use crate::entry::Entry;
use crate::epilogue;
use crate::error::{Error, Result};
use crate::signature::{given_symbols, Arg, Bindings};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{Op, TensorMeta};
use aotgrad_meta::OutputKind;
use aotgrad_trace::Tensor;
use std::sync::{Arc, Mutex};

/// Run the inference graph of `entry` on the call's arguments, then the epilogue.
pub(crate) fn run_inference(name: &str, entry: &Entry, args: &[Arg], env: &Bindings) -> Result<Vec<Tensor>> {
    let inputs = graph_inputs(name, entry, args)?;
    let versions = epilogue::versions_before(entry, args)?;
    let outs = {
        let _span = tracing::trace_span!("run_graph").entered();
        let compiled =
            entry.compiled.as_ref().ok_or_else(|| Error::Internal("entry has no inference artifact".into()))?;
        compiled.run_with_symbols(&inputs, &given_symbols(env))?
    };
    let results = epilogue::apply(entry, args, env, &inputs, &outs, versions)?;
    mark_output_flags(entry, &results)?;
    Ok(results)
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
        parts.fw.run_with_symbols(&inputs, &given_symbols(&env))?
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

/// The outputs' autograd flags as eager leaves them, for a call of either path
/// (inference calls included: a view taken under no-grad of an argument requiring
/// grad requires grad): every output that requires grad is a non-leaf requiring grad
/// (an output that *is* an input keeps the input's flags; a view taken under no-grad
/// and a view made to require grad with `requires_grad_()` are leaves that require
/// grad, as in PyTorch), and a regenerated view keeps the rules of its creation
/// (made under no-grad, output of a function returning several views).
pub(crate) fn mark_output_flags(entry: &Entry, results: &[Tensor]) -> Result<()> {
    let meta = &entry.m().meta;
    for (t, info) in results.iter().zip(&meta.outputs) {
        // (A `detach`ed alias, with a history of its own or not, is made no view for
        // autograd by the epilogue.)
        let fresh = !matches!(info.kind, OutputKind::IsInput(_) | OutputKind::SameAs(_));
        if !fresh {
            continue;
        }
        if info.requires_grad && info.meta.dtype.is_float() {
            if info.no_grad_view {
                if !info.creation.leaf {
                    t.mark_differentiable_result()?;
                }
                // A view taken under no-grad is a leaf requiring grad; a grad-mode
                // view of one is a non-leaf; both refuse in-place ops in grad mode.
                t.mark_no_grad_view(info.creation.leaf);
            } else if info.creation.leaf {
                t.set_requires_grad(true)?;
            } else {
                t.mark_differentiable_result()?;
            }
        }
        t.set_view_creation(&info.creation);
    }
    Ok(())
}

/// Autograd flags after a compiled forward, as eager leaves them: the outputs'
/// ([`mark_output_flags`]), and every input whose data the call changed with a value
/// that requires grad (a mutation autograd sees) requires grad, and so does the base
/// of such an input when it is a view.
pub(crate) fn mark_grad_flags(entry: &Entry, args: &[Arg], results: &[Tensor]) -> Result<()> {
    let meta = &entry.m().meta;
    mark_output_flags(entry, results)?;
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

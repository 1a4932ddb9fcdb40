//! Stage 5 of a call: the epilogue, which replays a compiled graph's side effects so
//! the call is indistinguishable from eager execution:
//! 1. data mutations of inputs are copied back into the caller's storage, through the
//!    graph input's own strides (a synthetic base covers every aliased input at once);
//! 2. metadata mutations restride the caller's tensor object (`as_strided_`);
//! 3. outputs that alias an input, an intermediate or another output are regenerated
//!    as real views (`as_strided` with the traced metadata, which is storage-absolute),
//!    an output that *is* an input is returned as that very object, and an output
//!    returned twice is the same object twice.

use crate::bind::traced_input;
use crate::entry::Entry;
use crate::error::{Error, Result};
use crate::signature::{concrete, Arg, Bindings};
use aotgrad_cpu::{CpuTensor, Storage};
use aotgrad_ir::{Op, TensorMeta};
use aotgrad_meta::{OutputKind, OutputSource};
use aotgrad_trace::{NoGradGuard, Tensor};
use std::sync::Arc;

/// An aliased output regenerated as a view of `base` (under no-grad; its autograd
/// flags are set afterwards from the traced outputs').
fn view_of(base: &Tensor, meta: &TensorMeta) -> Result<Tensor> {
    let v = base.as_strided_dims(&meta.shape, &meta.strides, meta.offset.clone())?;
    v.clear_no_grad_view();
    Ok(v)
}

/// The `detach`ed aliases made as bases of regenerated views, by base group.
type DetachedBases = std::collections::HashMap<usize, Tensor>;

/// A `detach`ed alias of `t`, made the base of a regenerated view (once for all the
/// outputs viewing the same base): it requires grad as a leaf where the traced view's
/// base did.
fn detached_base(bases: &mut DetachedBases, t: &Tensor, info: &aotgrad_meta::OutputInfo) -> Result<Tensor> {
    if let Some(d) = info.creation.base_group.and_then(|g| bases.get(&g)) {
        return Ok(d.clone());
    }
    let d = t.detach()?;
    if info.creation.base_leaf && d.dtype().is_float() {
        d.set_requires_grad(true)?;
    }
    if let Some(g) = info.creation.base_group {
        bases.insert(g, d.clone());
    }
    Ok(d)
}

/// A regenerated alias that is no view for autograd (a `detach`ed alias, or the
/// original a `detach`ed alias returned before it was regenerated from) has no base;
/// made so before any view of it is.
fn detached_if_no_view(t: Tensor, info: &aotgrad_meta::OutputInfo) -> Tensor {
    let alias = matches!(
        info.kind,
        OutputKind::AliasOfInput(_) | OutputKind::AliasOfOutput(_) | OutputKind::AliasOfIntermediate(_)
    );
    if alias && !info.creation.view {
        t.mark_detached_alias();
    }
    t
}

/// Whether `t` covers its whole storage in row-major order.
fn covers_storage(t: &CpuTensor) -> bool {
    t.meta.is_contiguous()
        && t.meta.concrete_offset() == Some(0)
        && t.meta.numel().as_const() == Some(t.storage.len() as i64)
}

/// Copy a mutated input's new value `src` into the caller's storage `dst`. A value
/// the backend already stored there (an input updated in place: the same storage,
/// laid out as the input) is only counted, as a copy would be; a value a device
/// backend left on its device replaces a storage it covers whole without coming back
/// to the host (device copies are never written after they are made, so the two
/// storages may share one); anything else is an element copy.
fn write_back(dst: &CpuTensor, src: &CpuTensor) -> Result<()> {
    if dst.same_storage(src) && dst.meta == src.meta {
        dst.storage.bump_version();
        return Ok(());
    }
    if let Some(dev) = src.storage.device_copy() {
        if !src.storage.on_host()
            && dst.meta.dtype == src.meta.dtype
            && dst.meta.shape == src.meta.shape
            && covers_storage(dst)
            && covers_storage(src)
        {
            return dst.storage.set_device(dev).map_err(Error::Internal);
        }
    }
    aotgrad_cpu::execute(&Op::InPlace(Box::new(Op::Copy)), &[dst, src], &dst.meta)?;
    Ok(())
}

/// The version each storage the call changes in place must reach by the end of the
/// epilogue: its version before the graph runs (a graph that keeps a mutation counts
/// it itself) plus the traced in-place ops on it.
pub(crate) struct Versions(Vec<(u64, Arc<Storage>)>);

/// [`Versions`] for this call, taken before its graph runs.
pub(crate) fn versions_before(entry: &Entry, args: &[Arg]) -> Result<Versions> {
    let m = entry.m();
    let mut v = Vec::with_capacity(m.version_bumps.len());
    for &(k, n) in &m.version_bumps {
        let storage = traced_input(entry, args, k)?.to_cpu()?.storage;
        // Never more than the traced graph had nodes (a stored count is not trusted).
        v.push((storage.version() + n.min(m.traced_nodes as u64), storage));
    }
    Ok(Versions(v))
}

/// The epilogue proper: `inputs` are the graph inputs the graph ran on, `outs` the
/// graph's outputs as the functional metadata lays them out (extra outputs, such as
/// values saved for backward, may follow and are ignored).
pub(crate) fn apply(
    entry: &Entry,
    args: &[Arg],
    env: &Bindings,
    inputs: &[CpuTensor],
    outs: &[CpuTensor],
    versions: Versions,
) -> Result<Vec<Tensor>> {
    let meta = &entry.m().meta;
    if outs.len() < meta.num_graph_outputs() {
        return Err(Error::Internal(format!(
            "graph returned {} values, expected {}",
            outs.len(),
            meta.num_graph_outputs()
        )));
    }
    let _no_grad = NoGradGuard::new();
    // 1. data mutations
    for (k, &g) in meta.mutated_inputs.iter().enumerate() {
        write_back(&inputs[g], &outs[k])?;
    }
    // 2. metadata mutations
    for (k, info) in meta.inputs.iter().enumerate() {
        if let Some(m) = &info.final_meta {
            let m = concrete(m, env)?;
            let t = traced_input(entry, args, k)?;
            let (size, stride, offset) = (
                m.concrete_shape().unwrap_or_default(),
                m.concrete_strides().unwrap_or_default(),
                m.concrete_offset().unwrap_or(0),
            );
            t.as_strided_(&size, &stride, offset)?;
        }
    }
    // 2b. `requires_grad_()` inside the function reaches the caller's tensor
    for &k in &entry.m().made_requires_grad {
        traced_input(entry, args, k)?.set_requires_grad(true)?;
    }
    // 2c. one version per in-place op, as eager counts them: the write-back and the
    //     restride above count once each, whatever ran in the function (storages
    //     that inputs share are counted once: the first of them reaches the target).
    for (target, storage) in versions.0 {
        while storage.version() < target {
            storage.bump_version();
        }
    }
    // 3. outputs: those made from another output come second (`output_source`),
    //    since the output they view may come later in the list.
    let mut results: Vec<Option<Tensor>> = vec![None; meta.outputs.len()];
    // One tensor per intermediate base, which its views share (as eager's do: writing
    // one through autograd moves the others' flags along).
    let mut bases: Vec<Option<Tensor>> = vec![None; meta.num_intermediate_bases];
    let mut detached = DetachedBases::new();
    // A view whose autograd base is a `detach`ed alias made in the function (not
    // an argument, not another output): its base is such an alias.
    let through_detach = |info: &aotgrad_meta::OutputInfo| info.creation.detached && info.creation.view;
    let mut pending: Vec<(usize, OutputSource)> = Vec::new();
    for (j, info) in meta.outputs.iter().enumerate() {
        if let Some(src) = meta.output_source(j) {
            pending.push((j, src));
            continue;
        }
        let m = concrete(&info.meta, env)?;
        let made = match &info.kind {
            OutputKind::NonAlias => Some(Tensor::from_cpu(outs[meta.user_output_index(j)].clone())),
            OutputKind::IsInput(k) => Some(traced_input(entry, args, *k)?.clone()),
            OutputKind::AliasOfInput(k) => {
                let input = traced_input(entry, args, *k)?;
                Some(if through_detach(info) {
                    view_of(&detached_base(&mut detached, input, info)?, &m)?
                } else {
                    view_of(input, &m)?
                })
            }
            OutputKind::AliasOfIntermediate(b) => {
                let slot = bases.get_mut(*b).ok_or_else(|| Error::Internal(format!("no intermediate base {b}")))?;
                let base = match slot {
                    Some(base) => base,
                    None => {
                        let base = Tensor::from_cpu(outs[meta.intermediate_base_index(*b)].clone());
                        // A base made a leaf requiring grad (`requires_grad_()` on it in
                        // the function): its views refuse in-place ops, as eagerly.
                        if info.creation.base_leaf && !info.own_gradient && base.dtype().is_float() {
                            base.set_requires_grad(true)?;
                        }
                        slot.insert(base)
                    }
                };
                // A view of a `detach`ed alias written with a value requiring grad (its
                // own history): its base is that alias, not the others' base.
                let own = info.own_gradient && info.creation.view;
                Some(if own { view_of(&detached_base(&mut detached, base, info)?, &m)? } else { view_of(base, &m)? })
            }
            OutputKind::AliasOfOutput(_) | OutputKind::SameAs(_) => None,
        };
        results[j] = made.map(|t| detached_if_no_view(t, info));
    }
    // (In rounds: an output may be made from one that is made from another.)
    while !pending.is_empty() {
        let before = pending.len();
        let mut waiting = Vec::new();
        for (j, src) in pending {
            let Some(earlier) = results.get(src.output()).cloned().flatten() else {
                waiting.push((j, src));
                continue;
            };
            let info = &meta.outputs[j];
            results[j] = Some(match (src, &info.kind) {
                (OutputSource::Kind(_), OutputKind::SameAs(_)) => earlier,
                (OutputSource::Kind(_), _) if through_detach(info) => {
                    let base = detached_base(&mut detached, &earlier, info)?;
                    detached_if_no_view(view_of(&base, &concrete(&info.meta, env)?)?, info)
                }
                _ => detached_if_no_view(view_of(&earlier, &concrete(&info.meta, env)?)?, info),
            });
        }
        if waiting.len() == before {
            let (j, src) = waiting[0];
            return Err(Error::Internal(format!(
                "output {j} is made from output {}, which is never made",
                src.output()
            )));
        }
        pending = waiting;
    }
    let results: Vec<Tensor> = results.into_iter().flatten().collect();
    Ok(results)
}

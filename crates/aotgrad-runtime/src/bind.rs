//! Stage 3 of a call: the graph inputs an entry runs on, built from the caller's
//! tensors (synthetic bases as 1-D views of their storage, the random generator's
//! state drawn for the call) after checking that the call's storages hold what the
//! entry reads.

use crate::entry::Entry;
use crate::error::{Error, Result};
use crate::signature::Arg;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::TensorMeta;
use aotgrad_meta::ArgSlot;
use aotgrad_trace::Tensor;

/// The caller's tensor for traced input `k`.
pub(crate) fn traced_input<'a>(entry: &Entry, args: &'a [Arg], k: usize) -> Result<&'a Tensor> {
    entry
        .m()
        .traced_args
        .get(k)
        .and_then(|&i| args.get(i))
        .and_then(Arg::tensor)
        .ok_or_else(|| Error::Internal(format!("traced input {k} has no tensor argument")))
}

/// Every synthetic base covers storage elements the traced call reached: this call's
/// storages must hold them too (eager would fail reading them). Checked before
/// anything is drawn from the random generator or run.
fn check_bases_fit(name: &str, entry: &Entry, args: &[Arg]) -> Result<()> {
    for b in &entry.m().convention.bases {
        let Some(&k) = b.members.first() else { continue };
        let storage_len = traced_input(entry, args, k)?.to_cpu()?.storage.len();
        if b.offset.checked_add(b.len).is_none_or(|end| end > storage_len) {
            let arg =
                entry.m().traced_args.get(k).map_or_else(|| format!("traced input {k}"), |i| format!("argument {i}"));
            return Err(Error::Call {
                name: name.to_string(),
                msg: format!(
                    "{arg}: the compiled function reads storage elements {}..{} of its storage (it views them with \
                     as_strided, or through an argument aliasing it), but this call's storage has only {storage_len} \
                     elements",
                    b.offset,
                    b.offset.saturating_add(b.len)
                ),
            });
        }
    }
    Ok(())
}

/// Build the graph inputs from the caller's tensors (synthetic bases as 1-D views).
pub(crate) fn graph_inputs(name: &str, entry: &Entry, args: &[Arg]) -> Result<Vec<CpuTensor>> {
    check_bases_fit(name, entry, args)?;
    let conv = &entry.m().convention;
    let mut inputs: Vec<Option<CpuTensor>> = vec![None; conv.num_graph_inputs];
    // The generator state for this call (the graph draws from it; see `aotgrad_trace::rng`).
    let rng = entry.m().rng.map(|r| {
        let (seed, base) = aotgrad_trace::rng::take_rng(r.ops);
        (r, seed as i64, base as i64)
    });
    for (k, slot) in conv.args.iter().enumerate() {
        let t = match rng {
            Some((r, seed, _)) if k == r.seed_input => CpuTensor::from_i64(&[seed], &[], aotgrad_ir::DType::I64)?,
            Some((r, _, base)) if k == r.base_input => CpuTensor::from_i64(&[base], &[], aotgrad_ir::DType::I64)?,
            _ => traced_input(entry, args, k)?.to_cpu()?,
        };
        match slot {
            ArgSlot::Input(g) => inputs[*g] = Some(t),
            ArgSlot::ViewOfBase { base } => {
                let b = &conv.bases[*base];
                if inputs[b.input].is_none() {
                    inputs[b.input] = Some(CpuTensor { storage: t.storage.clone(), meta: b.meta(t.meta.dtype) });
                }
            }
        }
    }
    inputs
        .into_iter()
        .enumerate()
        .map(|(g, t)| t.ok_or_else(|| Error::Internal(format!("graph input {g} unset"))))
        .collect()
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

//! The restrictions of the export path, each a clear error.
//!
//! An exported graph has no runtime wrapper to replay side effects, so export accepts
//! only programs whose calling convention the graph itself can express: no metadata
//! mutation of any input, no data mutation of an input that requires grad (parameters
//! in particular), no mutated input that aliases another (that needs a synthetic
//! base), no tensor passed twice, no mutation of a user input (buffers only), and for
//! a joint graph a scalar loss that requires grad as the only output requiring grad.

use crate::error::{Error, Result};
use aotgrad_functionalize::Functionalized;
use aotgrad_ir::{DimList, Graph};
use aotgrad_meta::ArgSlot;
use aotgrad_trace::Tensor;

/// Builds an export error for `api`.
pub(super) fn err(api: &str, msg: impl Into<String>) -> Error {
    Error::Export { api: api.into(), msg: msg.into() }
}

/// How graph inputs are described in messages.
pub(super) struct Roles<'a> {
    pub names: &'a [String],
    pub num_params: usize,
    pub num_lifted: usize,
}

impl Roles<'_> {
    pub fn describe(&self, i: usize) -> String {
        if i < self.num_params {
            format!("parameter `{}`", self.names[i])
        } else if i < self.num_lifted {
            format!("buffer `{}`", self.names[i])
        } else {
            format!("user input {}", i - self.num_lifted)
        }
    }
}

/// No tensor object may be passed twice (that would need deduplication).
pub(super) fn no_duplicates(api: &str, inputs: &[Tensor], roles: &Roles<'_>) -> Result<()> {
    for (j, t) in inputs.iter().enumerate() {
        if let Some(i) = inputs[..j].iter().position(|u| u.same_object(t)) {
            return Err(err(
                api,
                format!(
                    "{} and {} are the same tensor (duplicated inputs); export needs every graph input to be a \
                     distinct tensor (parameters must not be duplicated)",
                    roles.describe(i),
                    roles.describe(j)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks on the outputs of a joint export with a loss.
pub(super) fn loss_output(api: &str, graph: &Graph, output_requires_grad: &[bool], loss: usize) -> Result<()> {
    let n = output_requires_grad.len();
    if loss >= n {
        return Err(err(api, format!("output_loss_index is {loss}, but the forward returns {n} output(s)")));
    }
    if let Some(j) = (0..n).find(|&j| j != loss && output_requires_grad[j]) {
        return Err(err(
            api,
            format!(
                "output {j} requires grad but is not the loss (output {loss}); with trace_joint every output other \
                 than the scalar loss must not require grad, because only the loss is differentiated: call \
                 .detach() on the other outputs"
            ),
        ));
    }
    if !output_requires_grad[loss] {
        return Err(err(api, format!("output {loss} is marked as the loss, but it does not require grad")));
    }
    let meta = graph
        .outputs
        .get(loss)
        .and_then(|v| graph.meta_of(*v))
        .ok_or_else(|| Error::Internal(format!("traced output {loss} has no metadata")))?;
    if meta.numel().as_const() != Some(1) {
        return Err(err(
            api,
            format!(
                "the loss (output {loss}) must be a scalar (one element), but it has shape {}",
                DimList(&meta.shape)
            ),
        ));
    }
    Ok(())
}

/// The mutation restrictions shared by both export APIs. `allow_buffer_mutation` is
/// false for `aot_export_joint_simple`, which accepts no input mutation at all.
pub(super) fn mutations(api: &str, fz: &Functionalized, roles: &Roles<'_>, allow_buffer_mutation: bool) -> Result<()> {
    let inputs = &fz.meta.inputs;
    for (i, info) in inputs.iter().enumerate().take(roles.num_params) {
        if info.mutates_data || info.mutates_metadata {
            return Err(err(
                api,
                format!(
                    "{} is mutated; export does not support mutating parameters (update them outside the exported \
                     graph, e.g. in an optimizer step)",
                    roles.describe(i)
                ),
            ));
        }
    }
    if let Some(i) = inputs.iter().position(|x| x.mutates_metadata) {
        return Err(err(
            api,
            format!(
                "{} receives a metadata mutation (e.g. `t_`, `transpose_`, `unsqueeze_`, `as_strided_`); export \
                 does not support metadata mutations of inputs",
                roles.describe(i)
            ),
        ));
    }
    if let Some(i) = inputs.iter().position(|x| x.mutates_data && x.requires_grad) {
        return Err(err(
            api,
            format!(
                "{} requires grad and its data is mutated; export does not support data mutations of inputs that \
                 require grad",
                roles.describe(i)
            ),
        ));
    }
    if let Some(b) = fz.convention.bases.first() {
        let members: Vec<String> = b.members.iter().map(|&m| roles.describe(m)).collect();
        return Err(err(
            api,
            format!(
                "{} alias one storage and are mutated or viewed with as_strided, which needs a synthetic base; \
                 export does not support mutated inputs that alias other inputs",
                members.join(" and ")
            ),
        ));
    }
    for (i, info) in inputs.iter().enumerate() {
        let buffer = i >= roles.num_params && i < roles.num_lifted;
        if info.mutates_data && !(buffer && allow_buffer_mutation) {
            let what = if allow_buffer_mutation { "only buffers may be mutated" } else { "no input may be mutated" };
            return Err(err(api, format!("{} is mutated; export does not support this ({what})", roles.describe(i))));
        }
    }
    if fz.convention.args.iter().enumerate().any(|(k, s)| *s != ArgSlot::Input(k)) {
        return Err(Error::Internal("export: graph inputs do not map one to one to traced inputs".into()));
    }
    Ok(())
}

//! `ViewAndMutationMeta`: the side effects and aliasing a compiled graph must replay.
//!
//! Inputs are described per *traced input* (the user's tensor arguments after the
//! runtime's dedupe, plus any input the trace adds itself, such as the RNG state), not
//! per graph input: several traced inputs can share one graph input (a synthetic base,
//! see [`crate::CallingConvention`]), and graph-input positions appear only where
//! named so ([`ViewAndMutationMeta::mutated_inputs`]).

use aotgrad_ir::TensorMeta;
use serde::{Deserialize, Serialize};

/// What happened to one traced input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputInfo {
    /// Its elements were written (through it or any alias of its storage).
    pub mutates_data: bool,
    /// Its own metadata (shape, strides, offset) was changed (`t_`, `transpose_`, ...).
    pub mutates_metadata: bool,
    /// Every data mutation happened under no-grad or through a detached alias, so
    /// autograd must not see it.
    pub mutations_hidden_from_autograd: bool,
    /// The input requires grad.
    pub requires_grad: bool,
    /// After the call the caller's handle must carry this metadata (set when
    /// `mutates_metadata`).
    pub final_meta: Option<TensorMeta>,
}

/// How a user output relates to the graph's inputs and other outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputKind {
    /// Fresh memory: returned as computed by the graph.
    NonAlias,
    /// The caller's handle of traced input `0` itself (after any mutation), returned as
    /// the same object.
    IsInput(usize),
    /// A view of traced input `0`'s storage; regenerated as a real view of the caller's
    /// tensor for that traced input, with the output's (storage-absolute) metadata.
    AliasOfInput(usize),
    /// A view of an intermediate: the graph also returns the intermediate's storage base
    /// as intermediate output `base`, and the output is regenerated as a view of it.
    AliasOfIntermediate(usize),
    /// A view of the storage of user output `output` (which is a `NonAlias` output).
    AliasOfOutput(usize),
    /// The same tensor object as user output `output` (returned twice).
    SameAs(usize),
}

/// One user output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputInfo {
    /// How to produce it.
    pub kind: OutputKind,
    /// Its traced metadata (for aliases: the exact view to regenerate).
    pub meta: TensorMeta,
    /// It requires grad.
    pub requires_grad: bool,
    /// A view autograd does not see through (taken under no-grad, or through a
    /// `detach`ed alias): it may require grad, as in PyTorch, but its gradient reaches
    /// none of the values it views.
    pub grad_cut: bool,
    /// A view taken under no-grad of a tensor autograd tracks, or a view of one: it
    /// refuses in-place ops in grad mode, as in PyTorch (taken under no-grad itself,
    /// not a grad-mode view of one, it is a leaf that requires grad: `creation.leaf`).
    pub no_grad_view: bool,
    /// An alias with a history of its own: a `detach`ed alias later written in place
    /// with a value autograd sees. Its gradient flows through its own graph output (it
    /// gets a tangent), not through the storage it views.
    pub own_gradient: bool,
    /// How autograd saw the traced output as a view: its creation rules (no-grad,
    /// multi-output) and whether it was a leaf; the epilogue gives the regenerated
    /// output the same.
    pub creation: aotgrad_ir::ViewCreation,
}

/// Everything the runtime wrapper needs to reproduce eager side effects and aliasing.
///
/// The functional graph returns, in order: the updated value of every graph input listed
/// in `mutated_inputs` (data mutations, unless kept in the graph), then one value per user
/// output (aliases included, so backends see the view ops), then the intermediate bases.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewAndMutationMeta {
    /// One entry per traced input.
    pub inputs: Vec<InputInfo>,
    /// One entry per user output.
    pub outputs: Vec<OutputInfo>,
    /// Graph inputs whose updated data the graph returns first, in this order.
    pub mutated_inputs: Vec<usize>,
    /// Number of intermediate bases returned last.
    pub num_intermediate_bases: usize,
    /// Data mutations are written back inside the graph (a final `copy_`) instead of
    /// being returned.
    pub keep_input_mutations: bool,
}

/// Where the epilogue makes a user output from another one (see
/// [`ViewAndMutationMeta::output_source`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputSource {
    /// The same object (`SameAs`) or a view of that output's storage (`AliasOfOutput`).
    Kind(usize),
    /// A view of that output, its autograd base (`ViewCreation::base_output`: a
    /// `detach`ed alias returned beside views of it).
    Base(usize),
}

impl OutputSource {
    /// The output it is made from.
    pub fn output(self) -> usize {
        match self {
            OutputSource::Kind(o) | OutputSource::Base(o) => o,
        }
    }
}

impl ViewAndMutationMeta {
    /// The output user output `j` is made from, after it, by the epilogue: its
    /// autograd base when that is another output that is no view itself (for an
    /// output regenerated as a view), else the output its kind names (`SameAs`,
    /// `AliasOfOutput`); `None` for one made from the graph's outputs or the
    /// arguments. (A stored result is checked to have no cycle of these.)
    pub fn output_source(&self, j: usize) -> Option<OutputSource> {
        let info = self.outputs.get(j)?;
        let regenerated = matches!(
            info.kind,
            OutputKind::AliasOfInput(_) | OutputKind::AliasOfIntermediate(_) | OutputKind::AliasOfOutput(_)
        );
        let base = info
            .creation
            .base_output
            .filter(|&o| regenerated && o != j && self.outputs.get(o).is_some_and(|b| !b.creation.view));
        match (base, &info.kind) {
            (Some(o), _) => Some(OutputSource::Base(o)),
            (None, OutputKind::AliasOfOutput(o) | OutputKind::SameAs(o)) => Some(OutputSource::Kind(*o)),
            _ => None,
        }
    }
    /// Number of graph outputs.
    pub fn num_graph_outputs(&self) -> usize {
        self.mutated_inputs.len() + self.outputs.len() + self.num_intermediate_bases
    }
    /// Index of user output `i` among the graph outputs.
    pub fn user_output_index(&self, i: usize) -> usize {
        self.mutated_inputs.len() + i
    }
    /// Index of intermediate base `i` among the graph outputs.
    pub fn intermediate_base_index(&self, i: usize) -> usize {
        self.mutated_inputs.len() + self.outputs.len() + i
    }
}

//! `aotgrad-functionalize`: turns a traced program — in-place ops and views exactly as
//! the user wrote them — into a purely functional graph, and collects the
//! [`ViewAndMutationMeta`] the runtime needs to replay the side effects.
//!
//! The pass tracks every storage. Each storage has a *root* (a graph input, a
//! synthetic base, or the node that allocated it) whose current functional value is
//! known; every traced value is its root plus the chain of view ops that reaches it.
//! An in-place op becomes its out-of-place form, and the new data is scattered back
//! through the inverse of the chain into a new root value (`slice_scatter`,
//! `select_scatter`, inverse permutes and reshapes; one `as_strided_scatter` with the
//! target's storage layout when the chain holds an `expand` or an `as_strided`, whose
//! intermediate views may repeat elements). A written root's value is kept dense and
//! row-major, so element `i` is storage element `root offset + i`. A later read of any
//! alias of that storage replays its chain from the new root. Metadata mutations
//! (`t_`, `transpose_`, ...) just extend the handle's chain.
//!
//! Module map: `plan` groups the traced inputs by storage and decides which groups
//! become a synthetic base; `pass` runs the nodes; `chain` emits nodes, replays and
//! inverts views; `outputs` classifies the outputs and lays out the graph's returns;
//! [`verify`] checks the result.
//!
//! See `docs/ARCHITECTURE.md` for a worked example.
#![warn(missing_docs)]

mod chain;
mod outputs;
mod pass;
mod plan;
pub mod verify;

use aotgrad_ir::{DimOracle, Graph, ShapeError, SourceLoc, ValueId};
use aotgrad_meta::{CallingConvention, ViewAndMutationMeta};
use std::collections::{HashMap, HashSet};
use thiserror::Error;

pub use verify::verify_functional;

/// Errors of functionalization.
#[derive(Debug, Error)]
pub enum FunctionalizeError {
    /// A pattern of views and mutations this pass does not support.
    #[error("{}{op}: {msg}", loc.as_ref().map(|l| format!("{l}: ")).unwrap_or_default())]
    Unsupported {
        /// Op name.
        op: String,
        /// Where the user called it.
        loc: Option<SourceLoc>,
        /// Why it is unsupported.
        msg: String,
    },
    /// Shape inference rejected a node the pass built: a bug.
    #[error(
        "internal error (a bug in aotgrad, please report it): shape inference failed on a functionalized node: {0}"
    )]
    Shape(Box<ShapeError>),
    /// A failed internal invariant: a bug.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

impl From<aotgrad_ir::BuildError> for FunctionalizeError {
    fn from(e: aotgrad_ir::BuildError) -> Self {
        match e {
            aotgrad_ir::BuildError::Shape(s) => FunctionalizeError::Shape(s),
            aotgrad_ir::BuildError::Internal(m) => FunctionalizeError::Internal(m),
        }
    }
}

impl From<ShapeError> for FunctionalizeError {
    fn from(e: ShapeError) -> Self {
        FunctionalizeError::Shape(Box::new(e))
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, FunctionalizeError>;

/// Options of the pass.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Write data mutations of inputs back inside the graph with a final `copy_`
    /// instead of returning the updated values.
    pub keep_input_mutations: bool,
}

/// Facts about the traced program that the graph itself does not carry.
pub struct TraceFacts<'a> {
    /// Per traced input: it requires grad.
    pub input_requires_grad: &'a [bool],
    /// Per traced output: it requires grad.
    pub output_requires_grad: &'a [bool],
    /// Per traced output: it is a view taken under no-grad of a tensor autograd tracks
    /// (PyTorch: a leaf that requires grad); empty means none is.
    pub output_no_grad_view: &'a [bool],
    /// Per traced output: how autograd saw it as a view (see
    /// [`aotgrad_ir::ViewCreation`]); empty means as a fresh non-leaf.
    pub output_creation: &'a [aotgrad_ir::ViewCreation],
    /// Traced in-place metadata ops (`t_`, `unsqueeze_`) run under no-grad: autograd's
    /// history of the tensor keeps its old layout, so a gradient for the new one
    /// reaches the old value element by element (as PyTorch's does, where the shapes
    /// agree).
    pub hidden_meta: &'a [ValueId],
    /// Traced values made by `detach` (`alias` nodes autograd never sees through, even
    /// of a storage it does not track yet).
    pub detach_values: &'a [ValueId],
    /// Per traced input that the function made require grad (`requires_grad_()`):
    /// how many traced nodes came before; those saw it as a constant. Empty: none.
    pub input_tracked_from: &'a [Option<usize>],
    /// Per traced node (by the value it defines): autograd does not see it. For a
    /// data mutation: it ran under no-grad, or on a detached alias (a *hidden*
    /// mutation). For any other node: its value does not require grad (computed under
    /// no-grad, a `detach`, or from values that do not require grad). For an input:
    /// autograd does not track it in this trace (it does not require grad, or the
    /// whole trace ran under no-grad). The tracer's `!value_requires_grad[v]` is this
    /// for nodes, and for inputs when grad mode was on.
    pub hidden_mutation: &'a dyn Fn(ValueId) -> bool,
}

/// Where autograd's view of the program differs from the functional graph's values
/// (ids of [`Functionalized::graph`]); empty unless some input requires grad and the
/// program uses no-grad, `detach` or hidden mutations on values autograd tracks.
/// Differentiation must honour it (`aotgrad_autodiff::build_joint_with_cuts`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutogradFacts {
    /// Values that are constants to autograd: no gradient flows from them into the
    /// values they are computed from (results under no-grad, detached views).
    pub detached: Vec<ValueId>,
    /// `(new, previous)`: the storage value after a hidden mutation, and its value
    /// before. To autograd the storage was never written: the gradient of `new` flows
    /// unchanged (same shape) to `previous`, and none to what the mutation wrote.
    pub straight_through: Vec<(ValueId, ValueId)>,
}

/// The result of functionalization.
#[derive(Clone, Debug)]
pub struct Functionalized {
    /// The functional graph: no in-place op (but the trailing `copy_`s into inputs in
    /// `keep_input_mutations` mode) and no aliasing but explicit view ops.
    pub graph: Graph,
    /// Side effects and aliasing to replay at run time (per traced input / output).
    pub meta: ViewAndMutationMeta,
    /// How traced inputs map to graph inputs (synthetic bases merge several).
    pub convention: CallingConvention,
    /// What differentiation must know beyond the graph (no-grad regions, detached
    /// views, hidden mutations).
    pub autograd: AutogradFacts,
}

/// Functionalize a traced graph. `oracle` answers shape questions about symbolic dims
/// the way tracing did (pass the trace's shape environment).
pub fn functionalize(
    traced: &Graph,
    facts: &TraceFacts<'_>,
    options: &Options,
    oracle: &mut dyn DimOracle,
) -> Result<Functionalized> {
    let _span = tracing::debug_span!("functionalize", nodes = traced.nodes.len()).entered();
    let out = pass::run(traced, facts, options, oracle)?;
    verify_functional(&out.graph, options.keep_input_mutations, oracle)
        .map_err(|e| FunctionalizeError::Internal(format!("functional graph failed verification: {e}")))?;
    tracing::debug!(target: "aotgrad::functionalize", "functional graph:\n{}", aotgrad_ir::text::print_graph(&out.graph));
    Ok(out)
}

/// Drop the nodes whose values no output needs, directly or through other nodes. Nodes
/// that mutate (the trailing `copy_`s into inputs of a functional graph kept in
/// `keep_input_mutations` mode) are kept, with what they read. Inputs and the outputs
/// are unchanged; the kept nodes keep their order.
pub fn eliminate_dead_code(g: Graph) -> Graph {
    eliminate_dead_code_with(g, &HashMap::new())
}

/// [`eliminate_dead_code`], where a live key of `also` keeps its value live too (a
/// hidden mutation's new value keeps the old value its gradient passes straight to).
pub(crate) fn eliminate_dead_code_with(mut g: Graph, also: &HashMap<ValueId, ValueId>) -> Graph {
    let mut live: HashSet<ValueId> = g.outputs.iter().copied().collect();
    let mut keep = vec![false; g.nodes.len()];
    for (k, n) in g.nodes.iter().enumerate().rev() {
        if live.contains(&n.out) || n.op.is_mutation() {
            keep[k] = true;
            live.extend(n.args.iter().copied());
            if let Some(o) = also.get(&n.out) {
                live.insert(*o);
            }
        }
    }
    let mut keep = keep.into_iter();
    g.nodes.retain(|_| keep.next().unwrap_or(true));
    g
}

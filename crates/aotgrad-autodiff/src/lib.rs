//! `aotgrad-autodiff`: a derivative rule for every core op, and the joint
//! forward+backward graph built from a functional graph.
//!
//! [`build_joint`] (or [`build_joint_with_oracle`] for graphs with symbolic shapes)
//! turns a functional graph `primals -> outputs` into a [`JointGraph`]
//! `(primals, tangents) -> (outputs, gradients)`, the input of the partitioner;
//! [`build_joint_with_cuts`] also honours [`GradCuts`]: values autograd did not see
//! (no-grad regions, `detach`, hidden mutations).
//!
//! Module map:
//! - `builder`: the graph under construction (metadata from `aotgrad_ir::infer`,
//!   storage identity, source locations) and the small op vocabulary rules use;
//! - `rules`: one vector-Jacobian product per core op, grouped by family
//!   (`pointwise`, `reduce`, `views`, `indexing`, `linalg`);
//! - `joint`: which nodes to differentiate, reverse accumulation, the outputs.
//!
//! Every backward node carries the source location of the forward node it
//! differentiates, so errors and profiles point at the user's line. Composite ops kept
//! whole and in-place ops have no rule ([`AutodiffError::NotDifferentiable`]).
#![warn(missing_docs)]
// `AutodiffError::Shape` carries the IR's `ShapeError` (several `String`s) by value, as
// the IR crate does; errors are the cold path, so it stays unboxed.
#![allow(clippy::result_large_err)]

mod builder;
mod joint;
mod rules;

use aotgrad_ir::{DimOracle, Graph, ShapeError, StaticOracle, ValueId};
use thiserror::Error;

/// Errors of autodiff.
#[derive(Debug, Error)]
pub enum AutodiffError {
    /// An op has no derivative rule for this case.
    #[error("{op}: no derivative: {msg}")]
    NotDifferentiable {
        /// Op name.
        op: String,
        /// Why.
        msg: String,
    },
    /// Shape inference failed on a node autodiff built: a bug.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Shape(#[from] ShapeError),
    /// A failed internal invariant: a bug.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, AutodiffError>;

impl From<aotgrad_ir::BuildError> for AutodiffError {
    fn from(e: aotgrad_ir::BuildError) -> Self {
        match e {
            aotgrad_ir::BuildError::Shape(s) => AutodiffError::Shape(*s),
            aotgrad_ir::BuildError::Internal(m) => AutodiffError::Internal(m),
        }
    }
}

/// A joint forward+backward graph.
///
/// Inputs: the `num_primals` primals (the forward graph's inputs, same order), then the
/// `num_tangents` tangents (one per forward output that gets a gradient, in output
/// order, each with that output's shape and dtype, contiguous). Outputs: the
/// `num_fw_outputs` forward outputs (same order as the forward graph), then one gradient
/// per primal listed in `grad_primals` (same order), each with the primal's shape and
/// dtype, contiguous. A node is *forward* if it does not depend on any tangent.
#[derive(Clone, Debug, PartialEq)]
pub struct JointGraph {
    /// The graph.
    pub graph: Graph,
    /// Number of primal inputs.
    pub num_primals: usize,
    /// Number of tangent inputs.
    pub num_tangents: usize,
    /// Number of forward outputs.
    pub num_fw_outputs: usize,
    /// Forward outputs (indices into the forward outputs) that have a tangent input.
    pub tangent_outputs: Vec<usize>,
    /// Primals (indices) that have a gradient output.
    pub grad_primals: Vec<usize>,
}

/// Build the joint graph of functional graph `fw`: primals `requires_grad[i]` get a
/// gradient; forward outputs with `output_has_tangent[j]` get a tangent input.
///
/// Only floating values carry gradients: a flagged integer/bool primal gets no
/// gradient output and a flagged integer/bool output gets no tangent (see
/// [`JointGraph::grad_primals`] and [`JointGraph::tangent_outputs`]). Tangents are
/// named `tangent0`, `tangent1`, ... The forward part keeps `fw`'s value and storage
/// ids. Shape decisions on symbolic dims use [`StaticOracle`]; see
/// [`build_joint_with_oracle`].
pub fn build_joint(fw: &Graph, requires_grad: &[bool], output_has_tangent: &[bool]) -> Result<JointGraph> {
    build_joint_with_oracle(fw, requires_grad, output_has_tangent, &mut StaticOracle)
}

/// [`build_joint`] deciding comparisons of symbolic dims (while inferring the metadata
/// of the backward nodes) through `oracle`, e.g. the tracer's shape environment.
pub fn build_joint_with_oracle(
    fw: &Graph,
    requires_grad: &[bool],
    output_has_tangent: &[bool],
    oracle: &mut dyn DimOracle,
) -> Result<JointGraph> {
    let _span = tracing::debug_span!("autodiff", nodes = fw.nodes.len()).entered();
    joint::build(fw, requires_grad, output_has_tangent, &GradCuts::default(), oracle)
}

/// Where gradients must not follow the forward graph's data flow: what autograd did
/// not see while the program ran (no-grad regions, `detach`, hidden mutations).
/// Value ids are the forward graph's.
#[derive(Clone, Copy, Debug, Default)]
pub struct GradCuts<'a> {
    /// Constants to autograd: no gradient flows from these values into their arguments.
    pub detached: &'a [ValueId],
    /// `(new, previous)`, both of one shape: the gradient of `new` flows unchanged to
    /// `previous` (which `new` depends on), and none into `new`'s own arguments.
    pub straight_through: &'a [(ValueId, ValueId)],
}

/// [`build_joint_with_oracle`] honouring `cuts`.
pub fn build_joint_with_cuts(
    fw: &Graph,
    requires_grad: &[bool],
    output_has_tangent: &[bool],
    cuts: &GradCuts<'_>,
    oracle: &mut dyn DimOracle,
) -> Result<JointGraph> {
    let _span = tracing::debug_span!("autodiff", nodes = fw.nodes.len()).entered();
    joint::build(fw, requires_grad, output_has_tangent, cuts, oracle)
}

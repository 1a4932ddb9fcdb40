//! `aotgrad-autodiff`: a derivative rule for every core op, and the joint
//! forward+backward graph built from a functional graph.
//!
//! IMPLEMENTATION IN PROGRESS (helper F) — `JointGraph` and `build_joint` are fixed.
#![warn(missing_docs)]

use aotgrad_ir::{Graph, ShapeError};
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
pub fn build_joint(fw: &Graph, requires_grad: &[bool], output_has_tangent: &[bool]) -> Result<JointGraph> {
    let _ = (fw, requires_grad, output_has_tangent);
    Err(AutodiffError::Internal("autodiff not written yet".into()))
}

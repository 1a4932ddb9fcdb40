//! `aotgrad-fusion`: the backend-neutral kernel plan.
//!
//! [`plan_graph`] turns a functional [`aotgrad_ir::Graph`] into a [`KernelPlan`]: fused
//! kernels in execution order (pointwise chains computed in one pass with no
//! intermediate buffers, reductions with their pointwise prologue, matmuls with a
//! pointwise epilogue, extern ops for the rest), every operand an [`Access`] (views are
//! index arithmetic over their base buffer, never copies), and — through
//! [`plan_slots`] — a buffer plan that assigns every intermediate to a reusable arena
//! slot by liveness and reports the plan's peak bytes. The plan is plain serializable
//! data: the CPU backend executes it, and a GPU backend lowers the same plan.
//!
//! Module map: `plan` (the data types), `build` (the planner's entry points and
//! driver), `classify` (what each node is: liveness, readers, pointwise / reduction /
//! matmul classes and compute types), `group` (which nodes fuse into one kernel,
//! matmul epilogues, row groups), `body` (fused kernel bodies and operand accesses),
//! `buffers` (buffer liveness, in-place input updates and liveness slot assignment),
//! `print` (the text form used by golden tests and `RUST_LOG` dumps), `wire` (the
//! plan's flat binary form).
#![warn(missing_docs)]

mod body;
mod buffers;
mod build;
mod classify;
mod group;
mod plan;
mod print;
mod validate;
mod wire;

pub use buffers::{extent, plan_slots, Slot, SlotPlan};
pub use build::{plan_graph, plan_graph_with, PlanOptions};
pub use plan::*;
pub use print::{plan_summary, print_plan};

use aotgrad_ir::ValueId;
use thiserror::Error;

/// Errors of the planner.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum PlanError {
    /// The graph is not a functional graph of core ops (it mutates, or keeps a
    /// composite op whole): backends run such graphs another way.
    #[error("cannot plan `{op}` ({value}): kernel plans are for functional graphs of core ops")]
    Unsupported {
        /// Op name.
        op: String,
        /// The value it defines.
        value: ValueId,
    },
    /// A broadcast the planner cannot resolve from the symbolic sizes alone (sizes
    /// that are equal only by a guard): backends run such graphs another way.
    #[error("cannot plan a broadcast of {0}: its sizes are equal only by a guard")]
    SymbolicBroadcast(String),
    /// A failed internal invariant: a bug in aotgrad.
    #[error("internal error in the kernel planner (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

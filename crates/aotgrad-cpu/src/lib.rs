//! `aotgrad-cpu`: CPU storage shared by views, a kernel for every core op, and the
//! reference interpreter that runs any [`aotgrad_ir::Graph`] node by node.
//!
//! IMPLEMENTATION IN PROGRESS (helper C) — the public types below are fixed.
#![warn(missing_docs)]

pub mod storage;

pub use storage::{Buffer, CpuTensor, Storage};

use aotgrad_ir::{Graph, Op, ShapeError, TensorMeta, ValueId};
use thiserror::Error;

/// Errors of the CPU backend.
#[derive(Debug, Error)]
pub enum CpuError {
    /// Shape inference rejected an op while interpreting a graph.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A kernel rejected its inputs (e.g. an index out of range at run time).
    #[error("{op}: {msg}")]
    Kernel {
        /// Op name.
        op: String,
        /// What went wrong.
        msg: String,
    },
    /// Inputs given to the interpreter do not fit the graph.
    #[error("graph input {index}: {msg}")]
    Input {
        /// Input position.
        index: usize,
        /// What went wrong.
        msg: String,
    },
    /// A failed internal invariant: a bug in aotgrad.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, CpuError>;

/// Run one op on concrete tensors. `out` is the inferred result metadata (concrete).
/// Views share `args[0]`'s storage; `InPlace` writes into `args[0]`'s storage through
/// its strides and returns a handle to it; `MetaInPlace` returns `args[0]`'s storage
/// with the new metadata.
pub fn execute(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> Result<CpuTensor> {
    let _ = (args, out);
    Err(CpuError::Kernel { op: op.name(), msg: "kernel not written yet".into() })
}

/// Run a graph on concrete inputs, node by node; returns the output values.
pub fn interpret(g: &Graph, inputs: &[CpuTensor]) -> Result<Vec<CpuTensor>> {
    let _: Option<ValueId> = None;
    let _ = (g, inputs);
    Err(CpuError::Internal("interpreter not written yet".into()))
}

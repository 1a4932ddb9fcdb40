//! `aotgrad-cpu`: CPU storage shared by views, a kernel for every core op, and the
//! reference interpreter that runs any [`aotgrad_ir::Graph`] node by node.
//!
//! Module map:
//! - [`storage`]: [`Buffer`], [`Storage`] (with a version counter) and [`CpuTensor`];
//!   `tensor` adds constructors/accessors on [`CpuTensor`];
//! - `iter`: concrete strided layouts and the odometer that walks them;
//! - `convert`: element conversions and gathering/scattering through strides;
//! - `pointwise`, `reduce`, `matmul`, `indexing`, `random`: the kernels;
//! - `exec`: [`execute`], the per-op dispatcher; `interp`: [`interpret`].
//!
//! Compute types: f16/bf16/f32 compute in f32, f64 in f64, integers in wrapping i64
//! (truncated back to i32 for i32 results), bool as bool. Sums of floating tensors
//! accumulate in f64 with pairwise summation.
#![warn(missing_docs)]
// `CpuError::Shape` carries the IR's `ShapeError` (several pre-formatted `String`s) by
// value, as the IR crate does; errors are the cold path, so it stays unboxed.
#![allow(clippy::result_large_err)]

pub mod backend;
pub mod compiled;
mod conv;
mod convert;
mod exec;
mod indexing;
mod interp;
mod iter;
mod matmul;
mod pointwise;
pub mod random;
mod reduce;
pub mod storage;
mod tensor;

pub use backend::{InterpretedGraph, ReferenceBackend};
pub use compiled::{cpu_target, wait_for_jit_idle, AllocStats, CpuBackend, CpuCompiledGraph};
pub use storage::{release_recycled, take_recycled, Buffer, CpuTensor, DeviceBuffer, Storage};

use aotgrad_ir::{Graph, Op, ShapeError, SourceLoc, TensorMeta, ValueId};
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
    /// A graph node failed while the interpreter ran it: the node, its op and the
    /// user's source line, around the error of the op (shape inference or kernel).
    /// Prints like `src/model.rs:12:5: index_select (%3): index_select: index 7 is out of range ...`.
    #[error("{}{op} ({value}): {source}", loc_prefix(.loc))]
    Node {
        /// The value the node defines.
        value: ValueId,
        /// The node's op name.
        op: String,
        /// Where the user called the op, when the graph recorded it.
        loc: Option<SourceLoc>,
        /// What went wrong in the op.
        #[source]
        source: Box<CpuError>,
    },
    /// A tensor's elements live on a device, and reading them back failed.
    #[error("reading a device tensor back to the host failed: {0}")]
    Device(String),
    /// Memory for a result could not be allocated.
    #[error("out of memory: cannot allocate {bytes} bytes ({}) for {what}", human_bytes(*.bytes))]
    OutOfMemory {
        /// What the memory was for (`the result`, `the compiled graph's outputs`).
        what: String,
        /// The bytes asked for.
        bytes: u128,
    },
    /// A failed internal invariant: a bug in aotgrad.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

fn human_bytes(b: u128) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

fn loc_prefix(loc: &Option<SourceLoc>) -> String {
    loc.as_ref().map_or_else(String::new, |l| format!("{l}: "))
}

impl CpuError {
    /// A kernel error of `op`.
    pub fn kernel(op: impl Into<String>, msg: impl Into<String>) -> CpuError {
        CpuError::Kernel { op: op.into(), msg: msg.into() }
    }
    /// The error itself, with any [`CpuError::Node`] context peeled off.
    pub fn root(&self) -> &CpuError {
        match self {
            CpuError::Node { source, .. } => source.root(),
            other => other,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, CpuError>;

/// Run one op on concrete tensors. `out` is the inferred result metadata (concrete).
/// Views share `args[0]`'s storage; `InPlace` writes into `args[0]`'s storage through
/// its strides and returns a handle to it; `MetaInPlace` returns `args[0]`'s storage
/// with the new metadata; every other op returns a fresh tensor laid out as `out`.
/// Composite ops are rejected (the reference backend runs only core ops).
pub fn execute(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> Result<CpuTensor> {
    exec::execute(op, args, out)
}

/// Check `inputs` against `g`'s inputs (count, rank, dtype, sizes, strides, storage)
/// and bind its shape symbols, with `given` values for symbols no input carries.
/// Every backend running graphs on [`CpuTensor`] inputs checks them this way.
pub fn bind_inputs(
    g: &Graph,
    inputs: &[CpuTensor],
    given: &[(aotgrad_ir::SymId, i64)],
) -> Result<std::collections::HashMap<aotgrad_ir::SymId, i64>> {
    interp::bind_inputs(g, inputs, given)
}

/// Run a graph on concrete inputs, node by node; returns the output values.
/// Symbols are bound from the inputs' metadata, every node's metadata is re-inferred
/// and checked, and inputs that share storage stay aliased (see `interp`).
pub fn interpret(g: &Graph, inputs: &[CpuTensor]) -> Result<Vec<CpuTensor>> {
    interp::interpret(g, inputs)
}

/// [`interpret`] with the values of some shape symbols given by the caller (a
/// backward graph's sizes that only the forward's inputs carried); an input dim
/// must agree with a given value.
pub fn interpret_with_symbols(
    g: &Graph,
    inputs: &[CpuTensor],
    symbols: &[(aotgrad_ir::SymId, i64)],
) -> Result<Vec<CpuTensor>> {
    interp::interpret_with_symbols(g, inputs, symbols)
}

/// Fails as [`execute`] does for a view whose concrete layout `meta` reaches past a
/// storage of `storage_len` elements (the check a fake tensor's view op repeats while
/// tracing, so compiled and eager refuse the same views).
pub fn check_view_fits(op: &str, meta: &TensorMeta, storage_len: usize) -> Result<()> {
    iter::Layout::from_meta(meta)?.check_fits(op, storage_len)
}

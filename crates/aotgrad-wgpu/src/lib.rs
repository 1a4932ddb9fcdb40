//! `aotgrad-wgpu`: the wgpu backend — the backend-neutral kernel plan of
//! [`aotgrad_fusion`] lowered to fused WGSL compute shaders.
//!
//! Compiling a graph plans it once (the same planner the compiled CPU backend uses:
//! fusion groups, views as index arithmetic, liveness slots) and, for static shapes,
//! lowers every kernel to a WGSL entry point and creates its pipeline right away; a
//! dynamic graph is lowered once per binding of its symbols and cached. A call
//! uploads the host inputs the kernels read, records every kernel of the graph into
//! one command buffer (split only around host-run ops), submits it and returns
//! without waiting. The buffer plan's slots become GPU buffers allocated on the first
//! call and reused.
//!
//! What runs where (see `wgsl` for the lowering):
//! - pointwise chains, reductions with their prologue, and matmul / bmm with their
//!   epilogue run on the device;
//! - ops no fused kernel covers (gather / scatter, sorting, random, integer ops, ...)
//!   run on the host through the reference kernels: their device operands are read
//!   back and their results uploaded when a device kernel reads them;
//! - graphs the planner does not cover (mutations, composite ops kept whole) run on
//!   the reference interpreter, as on the compiled CPU backend.
//!
//! Tensors are [`aotgrad_cpu::CpuTensor`]s at the graph boundary, and they stay on
//! the device: a call's outputs are storages holding only a device buffer
//! ([`aotgrad_cpu::Storage::on_device`]), read back when the host needs their
//! elements (`to_vec_f64`, printing, an eager op); an input already on the device is
//! bound as it is, and a host input uploaded whole keeps its upload until the host
//! writes it. [`transfers`] counts what crossed.
//!
//! Adapter choice: a hardware adapter when there is one, else the software Vulkan
//! driver (lavapipe, Debian's `mesa-vulkan-drivers`); [`ADAPTER_ENV`] picks one by
//! name. [`adapter`] says which was chosen and why.
#![warn(missing_docs)]
#![allow(clippy::result_large_err)]

mod device;
mod launch;
mod resident;
mod run;
mod wgsl;

pub use device::{adapter, lose_device_for_tests, transfers, AdapterSummary, Transfers, ADAPTER_ENV, NO_F16_ENV};
pub use run::{WgpuArtifact, WgpuCompiledGraph, ARTIFACT_FORMAT};

use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{Backend, BackendError, CompiledGraph, Graph};
use thiserror::Error;

/// Environment variable that lets GPU tests pass without an adapter (`1`): they print
/// that they were skipped. Without it a GPU test fails when no adapter exists.
pub const SKIP_GPU_TESTS_ENV: &str = "AOTGRAD_SKIP_GPU_TESTS";

pub(crate) const NAME: &str = "wgpu";

/// Errors of the wgpu backend.
#[derive(Debug, Error)]
pub enum WgpuError {
    /// No adapter could be opened.
    #[error("no wgpu adapter: {0}")]
    NoAdapter(String),
    /// A kernel needs something this backend or adapter does not provide.
    #[error("{what}: not supported on the wgpu backend: {reason}")]
    Unsupported {
        /// The kernel or op.
        what: String,
        /// Why.
        reason: String,
    },
    /// A size beyond the adapter's limits.
    #[error("{what}: beyond the adapter's limits: {reason}")]
    Limit {
        /// The kernel or buffer.
        what: String,
        /// Which limit.
        reason: String,
    },
    /// The device failed (lost, timed out, out of memory, an error it reported).
    #[error("wgpu device error: {0}")]
    Device(String),
    /// A host-run op or the input check failed.
    #[error(transparent)]
    Cpu(#[from] aotgrad_cpu::CpuError),
    /// A failed internal invariant: a bug in aotgrad.
    #[error("internal error in the wgpu backend (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

pub(crate) fn backend_err(e: impl ToString) -> BackendError {
    BackendError { backend: NAME.into(), msg: e.to_string() }
}

/// The wgpu backend (see the crate docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct WgpuBackend;

impl WgpuBackend {
    /// The backend; the adapter is opened by the first compile.
    pub fn new() -> WgpuBackend {
        WgpuBackend
    }
    /// Compile to the concrete type (for kernel lists and transfer statistics).
    pub fn compile_graph(&self, graph: &Graph) -> Result<WgpuCompiledGraph, BackendError> {
        WgpuCompiledGraph::new(graph.clone()).map_err(backend_err)
    }
}

impl Backend<CpuTensor> for WgpuBackend {
    fn name(&self) -> &str {
        NAME
    }
    fn compile(&self, graph: &Graph) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        Ok(Box::new(self.compile_graph(graph)?))
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        Ok(Box::new(WgpuCompiledGraph::from_untrusted(bytes).map_err(backend_err)?))
    }
    fn cache_identity(&self) -> Option<String> {
        // The artifact's shaders were generated for this adapter (and its features): a
        // different adapter compiles afresh.
        let a = adapter().ok()?;
        let f16 = if a.shader_f16 { ", shader-f16" } else { "" };
        Some(format!(
            "{NAME} {} {ARTIFACT_FORMAT} adapter {} ({}, {}{f16})",
            env!("CARGO_PKG_VERSION"),
            a.name,
            a.backend,
            a.driver
        ))
    }
}

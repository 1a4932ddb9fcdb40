//! The backend interface: compile a graph, run it, serialize the artifact.
//!
//! A backend is generic over the runtime tensor type `T` it exchanges with the caller
//! (the CPU backends use `aotgrad_cpu::CpuTensor`), so this crate stays free of data.
//! Inputs are passed with their real metadata; a compiled graph must honour the input
//! strides and offsets it is given and return results whose metadata equals the
//! graph's output metadata (with symbols bound from the inputs).

use crate::graph::Graph;
use crate::meta::TensorMeta;
use crate::sym::SymId;
use thiserror::Error;

/// A backend failed to compile or run a graph.
#[derive(Debug, Clone, Error)]
#[error("backend `{backend}`: {msg}")]
pub struct BackendError {
    /// Backend name.
    pub backend: String,
    /// What went wrong.
    pub msg: String,
}

/// What the caller tells a backend about a graph beyond the graph itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// `(output, input)` pairs: graph output `output` is the new value of graph input
    /// `input`, which the caller writes into that input's memory after the call (a
    /// mutated input). A backend may store the value into the input's memory itself,
    /// when nothing it still reads is overwritten; it then returns that output as a
    /// tensor sharing the input's storage with the input's metadata, and the caller
    /// skips the copy. The caller promises that such an input overlaps no other graph
    /// input, and that nothing but the graph reads it during the call.
    pub input_updates: Vec<(usize, usize)>,
}

/// A compiler from graphs to runnable artifacts.
pub trait Backend<T>: Send + Sync {
    /// Short name (`cpu-reference`, `cpu`, `wgpu`).
    fn name(&self) -> &str;
    /// Compile a functional graph.
    fn compile(&self, graph: &Graph) -> Result<Box<dyn CompiledGraph<T>>, BackendError>;
    /// Compile a functional graph with what the caller knows of it
    /// ([`CompileOptions`]); the default ignores the options.
    fn compile_with(&self, graph: &Graph, options: &CompileOptions) -> Result<Box<dyn CompiledGraph<T>>, BackendError> {
        let _ = options;
        self.compile(graph)
    }
    /// Rebuild an artifact from [`CompiledGraph::serialize`]'s bytes, trusting nothing
    /// in them: a backend re-checks and re-derives what it can (a file from anywhere).
    fn deserialize(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<T>>, BackendError>;
    /// Rebuild an artifact from bytes whose integrity the caller has established: a
    /// cache entry or precompiled file whose checksum (or keyed MAC) held and whose
    /// producer had this backend's [`Backend::cache_identity`]. A backend may skip
    /// re-deriving what the bytes record (the CPU backend uses the stored kernel plan
    /// instead of planning again); it must still reject bytes it cannot decode. The
    /// default is [`Backend::deserialize`].
    fn load_verified(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<T>>, BackendError> {
        self.deserialize(bytes)
    }
    /// What an artifact depends on beyond the graph: the backend's name, its artifact
    /// format version and the target it compiled for (CPU features, an adapter). Cache
    /// keys include it, and a loaded artifact must match it. `None` (the default) says
    /// the backend's artifacts must not be cached: the cache is bypassed.
    fn cache_identity(&self) -> Option<String> {
        None
    }
}

/// The elements of a graph output's storage on the host.
#[derive(Clone, Copy, Debug)]
pub enum HostData<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f64 elements.
    F64(&'a [f64]),
}

/// A graph output whose value is final while its call still runs, handed to
/// [`CompiledGraph::run_streaming`]'s callback.
#[derive(Clone, Copy, Debug)]
pub struct ReadyOutput<'a> {
    /// The output's index among the graph's outputs.
    pub index: usize,
    /// Its concrete layout in `data`.
    pub meta: &'a TensorMeta,
    /// Its storage's elements (valid for the callback's duration only).
    pub data: HostData<'a>,
}

/// A compiled graph, ready to run.
pub trait CompiledGraph<T>: Send + Sync {
    /// Run on concrete inputs (in graph-input order); returns the graph outputs.
    /// Every shape symbol must be bound by an input dim.
    fn run(&self, inputs: &[T]) -> Result<Vec<T>, BackendError> {
        self.run_with_symbols(inputs, &[])
    }
    /// [`CompiledGraph::run`] with the values of some shape symbols given by the
    /// caller: those no input carries whole, such as a backward graph's sizes that
    /// only the forward's inputs determined (PyTorch passes them as saved sym-ints).
    /// The others are bound from the inputs; an input dim must agree with a given
    /// value.
    fn run_with_symbols(&self, inputs: &[T], symbols: &[(SymId, i64)]) -> Result<Vec<T>, BackendError>;
    /// [`CompiledGraph::run_with_symbols`] that also hands outputs to `ready`, on the
    /// calling thread, as soon as the call has finished writing them and before the
    /// kernels after that run: the caller can use an output while the rest of the
    /// graph still runs (data-parallel training sends a finished gradient while the
    /// backward goes on). Which outputs come early is the backend's choice (the
    /// default: none); every output is in the returned vector as usual.
    fn run_streaming(
        &self,
        inputs: &[T],
        symbols: &[(SymId, i64)],
        ready: &mut dyn FnMut(ReadyOutput<'_>),
    ) -> Result<Vec<T>, BackendError> {
        let _ = ready;
        self.run_with_symbols(inputs, symbols)
    }
    /// The artifact as bytes, for an on-disk cache.
    fn serialize(&self) -> Vec<u8>;
    /// The metadata of the inputs the graph takes and the number of outputs it
    /// returns, when the backend can say (every aotgrad backend can; the default says
    /// nothing). A stored result's artifacts are checked against the metadata that
    /// calls them before they are used: an artifact that takes other inputs or
    /// returns another count is rejected at load, not met as an error in the middle of
    /// a call.
    fn signature(&self) -> Option<(Vec<TensorMeta>, usize)> {
        None
    }
}

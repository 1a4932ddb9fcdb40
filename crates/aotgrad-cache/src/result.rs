//! [`AotResult`]: everything needed to rebuild a compiled callable without tracing or
//! compiling again, as plain data.
//!
//! A fresh compile produces an `AotResult` whose artifacts and graphs are *live* (the
//! objects the compiler just made; nothing is serialized until the result is stored);
//! a loaded one has their bytes and text. The runtime instantiates both the same way:
//! [`Artifact::load`] hands back the live object or asks the backend to rebuild it.

use crate::sig::CallSig;
use aotgrad_ir::{Backend, CompiledGraph, Graph, Guard, TensorMeta, ValueId};
use aotgrad_meta::{CallingConvention, ViewAndMutationMeta};
use aotgrad_partition::PartitionReport;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};

/// The graph inputs that carry the global random generator's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngSlots {
    /// Traced input index of the seed (0-d i64).
    pub seed_input: usize,
    /// Traced input index of the generator offset at call time (0-d i64).
    pub base_input: usize,
    /// Random ops in the graph (a call advances the generator by this many draws).
    pub ops: u64,
}

/// What the backward half of a training result needs beyond its artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingMeta {
    /// Forward outputs before the saved values.
    pub num_fw_outputs: usize,
    /// Forward outputs (indices) that have a tangent input, in the backward's order.
    pub tangent_outputs: Vec<usize>,
    /// Graph inputs (indices) that get a gradient, in the backward's output order.
    pub grad_primals: Vec<usize>,
    /// Primal and tangent counts of the joint graph.
    pub num_primals: usize,
    /// Tangent inputs of the joint graph.
    pub num_tangents: usize,
    /// What the partition saved (number, kind, metadata and bytes of each saved value)
    /// and recomputed.
    pub partition: PartitionReport,
}

/// The plain runtime metadata of a result: how to call the compiled graphs and replay
/// their side effects (no closures, nothing that needs the user's function).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultMeta {
    /// The function's name (for messages).
    pub name: String,
    /// The call signature this result was compiled for.
    pub sig: CallSig,
    /// Traced input `k` is user argument `traced_args[k]` (dedupe: one traced input
    /// per distinct tensor object).
    pub traced_args: Vec<usize>,
    /// The traced input of each user argument (`None` for plain values).
    pub slot_of_arg: Vec<Option<usize>>,
    /// The traced inputs' metadata (possibly symbolic); a call binds its symbols.
    pub input_metas: Vec<TensorMeta>,
    /// The guards over shape symbols the trace relied on.
    pub guards: Vec<Guard>,
    /// The random generator's inputs, when the function draws from it.
    pub rng: Option<RngSlots>,
    /// Input mutations and output aliasing to replay ([`ViewAndMutationMeta`]).
    pub meta: ViewAndMutationMeta,
    /// Traced inputs to graph inputs (dedupe, synthetic bases).
    pub convention: CallingConvention,
    /// Number of inputs of the functional graph.
    pub graph_inputs: usize,
    /// Metadata of each output of the functional graph.
    pub graph_output_metas: Vec<TensorMeta>,
    /// Values autograd treats as constants (no-grad regions, detached views).
    pub detached: Vec<ValueId>,
    /// `(new, previous)` storage values around mutations hidden from autograd.
    pub straight_through: Vec<(ValueId, ValueId)>,
    /// The training path's metadata (`None`: an inference result).
    pub training: Option<TrainingMeta>,
    /// The backend that compiled the artifacts ([`Backend::name`]).
    pub backend: String,
    /// The backend's cache identity ([`Backend::cache_identity`]): version and target.
    pub backend_identity: String,
    /// Nodes in the traced graph.
    pub traced_nodes: usize,
    /// `(stage, seconds)` of the compile that produced this result.
    pub stages: Vec<(String, f64)>,
}

impl ResultMeta {
    /// The guards as one readable expression (`true` when there are none).
    pub fn guard_expr(&self) -> String {
        if self.guards.is_empty() {
            return "true".into();
        }
        self.guards.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(" && ")
    }
}

/// A compiled graph: the live object of a fresh compile, or the backend's bytes.
pub struct Artifact<T> {
    live: OnceLock<Arc<dyn CompiledGraph<T>>>,
    bytes: OnceLock<Arc<Vec<u8>>>,
}

impl<T> Artifact<T> {
    /// A freshly compiled artifact (bytes are made when first asked for).
    pub fn live(compiled: Arc<dyn CompiledGraph<T>>) -> Artifact<T> {
        let live = OnceLock::new();
        let _ = live.set(compiled);
        Artifact { live, bytes: OnceLock::new() }
    }
    /// A serialized artifact ([`CompiledGraph::serialize`]'s bytes).
    pub fn from_bytes(bytes: Vec<u8>) -> Artifact<T> {
        let b = OnceLock::new();
        let _ = b.set(Arc::new(bytes));
        Artifact { live: OnceLock::new(), bytes: b }
    }
    /// The serialized artifact.
    pub fn bytes(&self) -> Arc<Vec<u8>> {
        self.bytes.get_or_init(|| Arc::new(self.live.get().map(|l| l.serialize()).unwrap_or_default())).clone()
    }
    /// The runnable graph: the live one, or the backend's rebuild of the bytes (kept).
    pub fn load(&self, backend: &dyn Backend<T>) -> Result<Arc<dyn CompiledGraph<T>>, aotgrad_ir::BackendError> {
        if let Some(l) = self.live.get() {
            return Ok(l.clone());
        }
        let bytes = self.bytes();
        let rebuilt: Arc<dyn CompiledGraph<T>> = Arc::from(backend.deserialize(&bytes)?);
        Ok(self.live.get_or_init(|| rebuilt).clone())
    }
    /// Whether this artifact has been rebuilt or was compiled in this process.
    pub fn is_loaded(&self) -> bool {
        self.live.get().is_some()
    }
}

/// A graph kept for logs and introspection: the live graph of a fresh compile, or
/// its text ([`aotgrad_ir::text`]) when loaded.
#[derive(Clone, Debug)]
pub enum GraphText {
    /// The graph itself.
    Live(Arc<Graph>),
    /// Its printed form.
    Text(Arc<str>),
}

impl GraphText {
    /// The printed graph.
    pub fn text(&self) -> Arc<str> {
        match self {
            GraphText::Live(g) => Arc::from(aotgrad_ir::text::print_graph(g)),
            GraphText::Text(t) => t.clone(),
        }
    }
    /// The graph (parsed from the text when loaded).
    pub fn graph(&self) -> Result<Arc<Graph>, aotgrad_ir::ParseError> {
        match self {
            GraphText::Live(g) => Ok(g.clone()),
            GraphText::Text(t) => aotgrad_ir::text::parse_graph_unchecked(t).map(Arc::new),
        }
    }
}

/// The graphs of one compile, for logs: traced, functional, and on the training path
/// joint, forward and backward.
#[derive(Clone, Debug)]
pub struct GraphDumps {
    /// The traced graph (views and mutations as written).
    pub traced: GraphText,
    /// The functional graph.
    pub functional: GraphText,
    /// The joint graph after simplification (training).
    pub joint: Option<GraphText>,
    /// The forward graph (training).
    pub forward: Option<GraphText>,
    /// The backward graph (training).
    pub backward: Option<GraphText>,
}

/// Everything needed to rebuild a compiled callable without tracing or compiling.
pub struct AotResult<T> {
    /// Runtime metadata, guards, compile times.
    pub meta: ResultMeta,
    /// The inference graph's artifact, or the training forward's.
    pub forward: Artifact<T>,
    /// The training backward's artifact.
    pub backward: Option<Artifact<T>>,
    /// The graphs, for logs and introspection.
    pub graphs: GraphDumps,
}

/// An artifact as stored: inside the entry, or by content hash in an artifact store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredArtifact {
    /// The bytes themselves (a bundled entry: one file to ship).
    Bundled(Vec<u8>),
    /// A blake3 hash (hex) and length of bytes kept in the artifact store.
    Referenced {
        /// Hex blake3 of the bytes.
        hash: String,
        /// Their length.
        len: u64,
    },
}

/// The serialized form of an [`AotResult`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    /// Runtime metadata.
    pub meta: ResultMeta,
    /// Forward (or inference) artifact.
    pub forward: StoredArtifact,
    /// Backward artifact (training).
    pub backward: Option<StoredArtifact>,
    /// Printed traced, functional, joint, forward, backward graphs (the last three on
    /// the training path only).
    pub graphs: [Option<String>; 5],
}

impl<T> AotResult<T> {
    /// The stored form; `reference` decides per artifact whether it is bundled
    /// (`None`) or referenced (it returns the reference after saving the bytes).
    pub fn to_stored(&self, mut reference: impl FnMut(&[u8]) -> Option<StoredArtifact>) -> StoredResult {
        let mut store = |a: &Artifact<T>| {
            let bytes = a.bytes();
            reference(&bytes).unwrap_or_else(|| StoredArtifact::Bundled(bytes.to_vec()))
        };
        let g = &self.graphs;
        let text = |t: &Option<GraphText>| t.as_ref().map(|t| t.text().to_string());
        StoredResult {
            meta: self.meta.clone(),
            forward: store(&self.forward),
            backward: self.backward.as_ref().map(&mut store),
            graphs: [
                Some(g.traced.text().to_string()),
                Some(g.functional.text().to_string()),
                text(&g.joint),
                text(&g.forward),
                text(&g.backward),
            ],
        }
    }

    /// Rebuild from the stored form; `fetch` resolves referenced artifacts.
    pub fn from_stored(
        stored: StoredResult,
        mut fetch: impl FnMut(&str, u64) -> Result<Vec<u8>, String>,
    ) -> Result<AotResult<T>, String> {
        let mut artifact = |s: StoredArtifact| -> Result<Artifact<T>, String> {
            Ok(Artifact::from_bytes(match s {
                StoredArtifact::Bundled(b) => b,
                StoredArtifact::Referenced { hash, len } => fetch(&hash, len)?,
            }))
        };
        let forward = artifact(stored.forward)?;
        let backward = stored.backward.map(&mut artifact).transpose()?;
        let [traced, functional, joint, fw, bw] = stored.graphs;
        let text = |t: Option<String>| t.map(|t| GraphText::Text(Arc::from(t)));
        let graphs = GraphDumps {
            traced: text(traced).ok_or("the entry has no traced graph")?,
            functional: text(functional).ok_or("the entry has no functional graph")?,
            joint: text(joint),
            forward: text(fw),
            backward: text(bw),
        };
        if stored.meta.training.is_some() != backward.is_some() {
            return Err("a training entry needs a backward artifact and an inference entry has none".into());
        }
        Ok(AotResult { meta: stored.meta, forward, backward, graphs })
    }
}

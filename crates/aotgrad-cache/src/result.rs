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

/// A backward error decided when the function compiled (PyTorch's saved-tensor
/// check): raised when a gradient given to the backward reaches the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackwardError {
    /// The message (PyTorch's wording).
    pub msg: String,
    /// The user's line of the node.
    pub loc: Option<aotgrad_ir::SourceLoc>,
    /// The user outputs whose gradients reach the node.
    pub outputs: Vec<usize>,
    /// The traced inputs whose new values' gradients reach it.
    pub inputs: Vec<usize>,
}

/// One output of a compiled function, in the order the user's function returns them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputSlot {
    /// The next tensor output (of those the graphs and the epilogue produce).
    Tensor,
    /// An integer: a constant, or a size over the trace's shape symbols (evaluated with
    /// each call's bindings).
    Int(aotgrad_ir::Dim),
    /// Nothing (`None` in Python).
    None,
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
    /// The errors the backward raises, as PyTorch's would: a value a recorded node
    /// saved was changed in place during the call (in the order eager's backward
    /// meets them).
    pub backward_errors: Vec<BackwardError>,
    /// The user's outputs in order: tensors and plain values (ints, `None`).
    pub output_layout: Vec<OutputSlot>,
    /// Traced inputs the function made require grad (`requires_grad_()`): after each
    /// call the caller's tensor requires grad, as in eager.
    pub made_requires_grad: Vec<usize>,
    /// `(traced input, count)` for each input whose storage the function changed in
    /// place: how many in-place ops (data or metadata, through the input or any view or
    /// alias of its storage) ran on it. After each call the caller's version counter
    /// has moved on by as many, as in eager (PyTorch's `_version`); the epilogue's own
    /// write-back and restride count towards it.
    pub version_bumps: Vec<(usize, u64)>,
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
    /// The bytes passed an integrity check ([`Backend::load_verified`] may be used).
    verified: bool,
}

impl<T> Artifact<T> {
    /// A freshly compiled artifact (bytes are made when first asked for).
    pub fn live(compiled: Arc<dyn CompiledGraph<T>>) -> Artifact<T> {
        let live = OnceLock::new();
        let _ = live.set(compiled);
        Artifact { live, bytes: OnceLock::new(), verified: true }
    }
    /// A serialized artifact ([`CompiledGraph::serialize`]'s bytes) from anywhere: it
    /// is rebuilt with [`Backend::deserialize`], which trusts nothing in it.
    pub fn from_bytes(bytes: Vec<u8>) -> Artifact<T> {
        let b = OnceLock::new();
        let _ = b.set(Arc::new(bytes));
        Artifact { live: OnceLock::new(), bytes: b, verified: false }
    }
    /// A serialized artifact whose integrity was checked (it came out of a sealed
    /// cache entry or precompiled file): rebuilt with [`Backend::load_verified`].
    pub fn from_verified_bytes(bytes: Vec<u8>) -> Artifact<T> {
        Artifact { verified: true, ..Artifact::from_bytes(bytes) }
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
        let rebuilt: Arc<dyn CompiledGraph<T>> =
            Arc::from(if self.verified { backend.load_verified(&bytes)? } else { backend.deserialize(&bytes)? });
        Ok(self.live.get_or_init(|| rebuilt).clone())
    }
    /// Whether this artifact has been rebuilt or was compiled in this process.
    pub fn is_loaded(&self) -> bool {
        self.live.get().is_some()
    }
}

/// Which graph of a compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    /// The traced graph (views and mutations as written).
    Traced = 0,
    /// The functional graph.
    Functional = 1,
    /// The joint graph after simplification (training).
    Joint = 2,
    /// The forward graph (training).
    Forward = 3,
    /// The backward graph (training).
    Backward = 4,
}

impl GraphKind {
    /// Every kind, in the order a result stores them.
    pub const ALL: [GraphKind; 5] =
        [GraphKind::Traced, GraphKind::Functional, GraphKind::Joint, GraphKind::Forward, GraphKind::Backward];

    /// Lower-case name (`"traced"`, `"functional"`, `"joint"`, `"forward"`, `"backward"`).
    pub fn name(self) -> &'static str {
        match self {
            GraphKind::Traced => "traced",
            GraphKind::Functional => "functional",
            GraphKind::Joint => "joint",
            GraphKind::Forward => "forward",
            GraphKind::Backward => "backward",
        }
    }
}

/// The graphs of one compile, kept for logs and introspection: the live graphs of a
/// fresh compile (packed when they are large), or, for a loaded result, their packed
/// encodings ([`aotgrad_ir::codec::pack`]), decoded only when asked for (a warm start
/// never pays for them). A graph is printed only when its text is asked for.
#[derive(Clone, Debug)]
pub struct GraphDumps {
    kept: Arc<[Option<Kept>; 5]>,
}

/// Above this many nodes in all, a fresh compile's graphs are kept packed (a small
/// fraction of their size in memory) and decoded when asked for: a long program's
/// compiled function does not hold its five graphs for its whole life.
const PACK_ABOVE_NODES: usize = 20_000;

/// One graph: live, packed, or both (a live graph is packed when first stored).
#[derive(Debug)]
struct Kept {
    live: Option<Arc<Graph>>,
    packed: OnceLock<Vec<u8>>,
}

impl Kept {
    fn graph(&self) -> Option<Arc<Graph>> {
        if let Some(g) = &self.live {
            return Some(g.clone());
        }
        let bytes = self.packed.get()?;
        match aotgrad_ir::codec::unpack::<Graph>("kept graph", bytes) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!(target: "aotgrad::cache", "a stored graph is unreadable: {e}");
                None
            }
        }
    }
    fn packed(&self) -> Vec<u8> {
        self.packed
            .get_or_init(|| match &self.live {
                // Encoding plain data cannot fail; an empty graph is an unreadable one.
                Some(g) => aotgrad_ir::codec::pack("kept graph", g.as_ref()).unwrap_or_default(),
                None => Vec::new(),
            })
            .clone()
    }
}

impl GraphDumps {
    /// The graphs of a fresh compile.
    pub fn live(traced: Graph, functional: Graph, joint: Option<Graph>, fw: Option<Graph>, bw: Option<Graph>) -> Self {
        let graphs = [Some(traced), Some(functional), joint, fw, bw];
        let total: usize = graphs.iter().flatten().map(|g| g.nodes.len()).sum();
        let keep = |g: Option<Graph>| {
            g.map(|g| {
                let packed = OnceLock::new();
                if total > PACK_ABOVE_NODES {
                    if let Ok(bytes) = aotgrad_ir::codec::pack("kept graph", &g) {
                        let _ = packed.set(bytes);
                        return Kept { live: None, packed };
                    }
                }
                Kept { live: Some(Arc::new(g)), packed }
            })
        };
        GraphDumps { kept: Arc::new(graphs.map(keep)) }
    }

    /// Graphs stored as [`GraphDumps::packed`] gives them (`None`: the compile has no
    /// such graph).
    pub fn from_packed(packed: [Option<Vec<u8>>; 5]) -> Self {
        let kept = packed.map(|p| {
            p.map(|bytes| {
                let packed = OnceLock::new();
                let _ = packed.set(bytes);
                Kept { live: None, packed }
            })
        });
        GraphDumps { kept: Arc::new(kept) }
    }

    /// The packed graphs (what an entry stores).
    pub fn packed(&self) -> [Option<Vec<u8>>; 5] {
        std::array::from_fn(|i| self.kept[i].as_ref().map(Kept::packed))
    }

    /// The printed graph `which` (`None`: this compile has none, or the stored graph
    /// is unreadable).
    pub fn text(&self, which: GraphKind) -> Option<String> {
        self.graph(which).map(|g| aotgrad_ir::text::print_graph(&g))
    }

    /// The graph `which`.
    pub fn graph(&self, which: GraphKind) -> Option<Arc<Graph>> {
        self.kept[which as usize].as_ref().and_then(Kept::graph)
    }
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
    Bundled(#[serde(with = "aotgrad_ir::codec::bytes")] Vec<u8>),
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
    /// The traced, functional, joint, forward and backward graphs (the last three on
    /// the training path only), each packed ([`GraphDumps::packed`]).
    pub graphs: [Option<aotgrad_ir::codec::Bytes>; 5],
}

impl<T> AotResult<T> {
    /// The stored form; `reference` decides per artifact whether it is bundled
    /// (`None`) or referenced (it returns the reference after saving the bytes).
    pub fn to_stored(&self, mut reference: impl FnMut(&[u8]) -> Option<StoredArtifact>) -> StoredResult {
        let mut store = |a: &Artifact<T>| {
            let bytes = a.bytes();
            reference(&bytes).unwrap_or_else(|| StoredArtifact::Bundled(bytes.to_vec()))
        };
        StoredResult {
            meta: self.meta.clone(),
            forward: store(&self.forward),
            backward: self.backward.as_ref().map(&mut store),
            graphs: self.graphs.packed().map(|g| g.map(aotgrad_ir::codec::Bytes)),
        }
    }

    /// Rebuild from the stored form of a sealed entry whose envelope check and
    /// [`StoredResult::validate`] passed (artifacts load with
    /// [`Backend::load_verified`]); `fetch` resolves referenced artifacts (and checks
    /// them against their hashes).
    pub fn from_stored(
        stored: StoredResult,
        mut fetch: impl FnMut(&str, u64) -> Result<Vec<u8>, String>,
    ) -> Result<AotResult<T>, String> {
        let mut artifact = |s: StoredArtifact| -> Result<Artifact<T>, String> {
            Ok(Artifact::from_verified_bytes(match s {
                StoredArtifact::Bundled(b) => b,
                StoredArtifact::Referenced { hash, len } => fetch(&hash, len)?,
            }))
        };
        let forward = artifact(stored.forward)?;
        let backward = stored.backward.map(&mut artifact).transpose()?;
        let graphs = GraphDumps::from_packed(stored.graphs.map(|g| g.map(|b| b.0)));
        Ok(AotResult { meta: stored.meta, forward, backward, graphs })
    }
}

/// The largest rank a stored tensor's metadata may have (far above any real tensor;
/// the bound keeps a forged one from making loops and allocations over its dims huge).
const MAX_STORED_RANK: usize = 64;

/// Why a decoded result is not self-consistent.
fn bad(msg: impl Into<String>) -> String {
    msg.into()
}

fn check_meta(what: &str, m: &TensorMeta) -> Result<(), String> {
    if m.shape.len() != m.strides.len() {
        return Err(bad(format!("{what}: {} sizes but {} strides", m.shape.len(), m.strides.len())));
    }
    if m.shape.len() > MAX_STORED_RANK {
        return Err(bad(format!("{what}: rank {} (at most {MAX_STORED_RANK})", m.shape.len())));
    }
    if let Some(d) = m.shape.iter().find(|d| matches!(d, aotgrad_ir::Dim::Const(v) if *v < 0)) {
        return Err(bad(format!("{what}: negative size {d}")));
    }
    if matches!(m.offset, aotgrad_ir::Dim::Const(v) if v < 0) {
        return Err(bad(format!("{what}: negative storage offset {}", m.offset)));
    }
    // The runtime makes contiguous layouts of these (tangents, gradients).
    if aotgrad_ir::meta::checked_contiguous_strides(&m.shape).is_none() {
        return Err(bad(format!("{what}: the sizes {} have no strides that fit", aotgrad_ir::DimList(&m.shape))));
    }
    Ok(())
}

fn check_index(what: &str, i: usize, len: usize) -> Result<(), String> {
    if i >= len {
        return Err(bad(format!("{what} {i} is out of range (there are {len})")));
    }
    Ok(())
}

impl ResultMeta {
    /// Check that the metadata is self-consistent: every index in range, every count
    /// in agreement with what it counts, every reference acyclic. The runtime indexes
    /// with these fields without checking again, so a result read from anywhere (a
    /// cache entry, a precompiled file) passes this before anything uses it; a fresh
    /// compile's metadata always does.
    pub fn validate(&self) -> Result<(), String> {
        use aotgrad_meta::{ArgSlot, OutputKind};
        let n_args = self.sig.args.len();
        let n_traced = self.convention.args.len();
        let n_user = self.traced_args.len();
        let n_graph = self.graph_inputs;
        let n_out = self.meta.outputs.len();
        // (Counted with care: the counts are the bytes' word.)
        let n_graph_out = self
            .meta
            .mutated_inputs
            .len()
            .checked_add(n_out)
            .and_then(|n| n.checked_add(self.meta.num_intermediate_bases))
            .ok_or_else(|| bad("the graph output counts overflow"))?;
        // Arguments to traced inputs.
        if self.slot_of_arg.len() != n_args {
            return Err(bad(format!("{} argument slots for {n_args} arguments", self.slot_of_arg.len())));
        }
        if n_user > n_traced {
            return Err(bad(format!("{n_user} tensor arguments but {n_traced} traced inputs")));
        }
        for (k, &i) in self.traced_args.iter().enumerate() {
            check_index("traced input's argument", i, n_args)?;
            if !matches!(self.sig.args[i], crate::sig::ArgSig::Tensor { .. }) {
                return Err(bad(format!("traced input {k} is argument {i}, which is not a tensor")));
            }
            if self.slot_of_arg[i] != Some(k) {
                return Err(bad(format!(
                    "argument {i} is traced input {k}, but its slot says {:?}",
                    self.slot_of_arg[i]
                )));
            }
        }
        for (i, s) in self.slot_of_arg.iter().enumerate() {
            if let Some(k) = *s {
                check_index(&format!("argument {i}'s traced input"), k, n_user)?;
            }
        }
        if self.input_metas.len() != n_traced || self.meta.inputs.len() != n_traced {
            return Err(bad(format!(
                "{n_traced} traced inputs, but {} input metadata and {} input infos",
                self.input_metas.len(),
                self.meta.inputs.len()
            )));
        }
        for (k, m) in self.input_metas.iter().enumerate() {
            check_meta(&format!("traced input {k}"), m)?;
        }
        if let Some(r) = &self.rng {
            for (what, k) in [("seed", r.seed_input), ("generator offset", r.base_input)] {
                if k < n_user || k >= n_traced {
                    return Err(bad(format!("the random generator's {what} input {k} is not an added traced input")));
                }
            }
            if r.seed_input == r.base_input {
                return Err(bad("the random generator's seed and offset share an input"));
            }
        }
        // Traced inputs to graph inputs: each graph input set exactly once.
        let conv = &self.convention;
        if conv.num_graph_inputs != n_graph || n_graph > n_traced {
            return Err(bad(format!(
                "{n_graph} graph inputs (the convention says {}) for {n_traced} traced inputs",
                conv.num_graph_inputs
            )));
        }
        let mut set = vec![false; n_graph];
        let mut claim = |g: usize, what: String| -> Result<(), String> {
            check_index(&what, g, n_graph)?;
            if std::mem::replace(&mut set[g], true) {
                return Err(bad(format!("{what}: graph input {g} is given twice")));
            }
            Ok(())
        };
        for (k, slot) in conv.args.iter().enumerate() {
            match slot {
                ArgSlot::Input(g) => claim(*g, format!("traced input {k}'s graph input"))?,
                ArgSlot::ViewOfBase { base } => {
                    check_index(&format!("traced input {k}'s synthetic base"), *base, conv.bases.len())?;
                    if !conv.bases[*base].members.contains(&k) {
                        return Err(bad(format!("traced input {k} views base {base}, which does not list it")));
                    }
                }
            }
        }
        for (b, base) in conv.bases.iter().enumerate() {
            claim(base.input, format!("synthetic base {b}'s graph input"))?;
            if base.members.is_empty() {
                return Err(bad(format!("synthetic base {b} has no members")));
            }
            for &k in &base.members {
                check_index(&format!("synthetic base {b}'s member"), k, n_traced)?;
                if conv.args[k] != (ArgSlot::ViewOfBase { base: b }) {
                    return Err(bad(format!("synthetic base {b} lists traced input {k}, which is not its view")));
                }
            }
            if base.offset.checked_add(base.len).is_none_or(|end| i64::try_from(end).is_err()) {
                return Err(bad(format!("synthetic base {b}'s storage range overflows")));
            }
        }
        if let Some(g) = set.iter().position(|s| !s) {
            return Err(bad(format!("graph input {g} is given by no traced input")));
        }
        // Side effects and outputs.
        let vm = &self.meta;
        for (k, info) in vm.inputs.iter().enumerate() {
            if info.final_meta.is_some() != info.mutates_metadata {
                return Err(bad(format!("traced input {k}: a final metadata exactly when its metadata changes")));
            }
            if let Some(m) = &info.final_meta {
                check_index("a traced input with new metadata", k, n_user)?;
                check_meta(&format!("traced input {k}'s new metadata"), m)?;
            }
        }
        for &g in &vm.mutated_inputs {
            check_index("mutated graph input", g, n_graph)?;
        }
        for (j, o) in vm.outputs.iter().enumerate() {
            check_meta(&format!("output {j}"), &o.meta)?;
            match o.kind {
                OutputKind::NonAlias => {}
                OutputKind::IsInput(k) | OutputKind::AliasOfInput(k) => {
                    check_index(&format!("output {j}'s input"), k, n_user)?
                }
                OutputKind::AliasOfIntermediate(b) => {
                    check_index(&format!("output {j}'s intermediate base"), b, vm.num_intermediate_bases)?
                }
                OutputKind::AliasOfOutput(o2) | OutputKind::SameAs(o2) => {
                    check_index(&format!("output {j}'s output"), o2, n_out)?
                }
            }
            if let Some(b) = o.creation.base_output {
                check_index(&format!("output {j}'s base output"), b, n_out)?;
            }
        }
        // The epilogue makes an output from another one after it (`output_source`):
        // those references never form a cycle.
        let mut state = vec![0u8; n_out]; // 0 unseen, 1 on the current path, 2 done
        for start in 0..n_out {
            let mut path = Vec::new();
            let mut j = start;
            loop {
                match state[j] {
                    2 => break,
                    1 => return Err(bad(format!("output {j} is made from an output made from it (a cycle)"))),
                    _ => {}
                }
                state[j] = 1;
                path.push(j);
                match vm.output_source(j) {
                    Some(src) => j = src.output(),
                    None => break,
                }
            }
            for p in path {
                state[p] = 2;
            }
        }
        if self.graph_output_metas.len() != n_graph_out {
            return Err(bad(format!(
                "{} graph output metadata for {n_graph_out} graph outputs",
                self.graph_output_metas.len()
            )));
        }
        for (go, m) in self.graph_output_metas.iter().enumerate() {
            check_meta(&format!("graph output {go}"), m)?;
        }
        // Each user output is also a graph output (aliases too, so that backends see
        // the view ops): the tensor the epilogue returns has that output's shape.
        for (j, o) in vm.outputs.iter().enumerate() {
            let g = &self.graph_output_metas[vm.user_output_index(j)];
            if g.shape != o.meta.shape || g.dtype != o.meta.dtype {
                return Err(bad(format!("output {j} is {}, but its graph output is {g}", o.meta)));
            }
        }
        let tensors = self.output_layout.iter().filter(|s| matches!(s, OutputSlot::Tensor)).count();
        if tensors != n_out {
            return Err(bad(format!("the output layout has {tensors} tensors for {n_out} outputs")));
        }
        for &k in &self.made_requires_grad {
            check_index("input made to require grad", k, n_user)?;
        }
        for &(k, _) in &self.version_bumps {
            check_index("input with a version bump", k, n_user)?;
        }
        for e in &self.backward_errors {
            for &o in &e.outputs {
                check_index("backward error's output", o, n_out)?;
            }
            for &k in &e.inputs {
                check_index("backward error's input", k, n_traced)?;
            }
        }
        if let Some(t) = &self.training {
            if t.num_fw_outputs != n_graph_out {
                return Err(bad(format!("{} forward outputs for {n_graph_out} graph outputs", t.num_fw_outputs)));
            }
            if t.num_primals != n_graph || t.num_tangents != t.tangent_outputs.len() {
                return Err(bad(format!(
                    "the joint graph's {} primals and {} tangents do not match {n_graph} graph inputs and {} \
                     tangent outputs",
                    t.num_primals,
                    t.num_tangents,
                    t.tangent_outputs.len()
                )));
            }
            for &go in &t.tangent_outputs {
                check_index("tangent output", go, n_graph_out)?;
            }
            for &g in &t.grad_primals {
                check_index("graph input with a gradient", g, n_graph)?;
            }
        }
        Ok(())
    }
}

impl StoredResult {
    /// Check a decoded result before anything uses it: its metadata
    /// ([`ResultMeta::validate`]) and its shape (a training result has a backward
    /// artifact, an inference result none). The artifacts are checked against the
    /// metadata when the backend loads them (see the runtime's `Entry::instantiate`).
    pub fn validate(&self) -> Result<(), String> {
        if self.meta.training.is_some() != self.backward.is_some() {
            return Err(bad("a training result needs a backward artifact and an inference result has none"));
        }
        self.meta.validate()
    }
}

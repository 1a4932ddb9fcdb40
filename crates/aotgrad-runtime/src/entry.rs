//! Stage 2 of a call: the compiled entries. An `Entry` is one specialization of a
//! function — an [`AotResult`] and its runnable graphs — made by one function
//! (`Entry::instantiate`) whether the result was just compiled, loaded from the
//! cache or read from a precompiled file; `result_bindings` checks that a call fits
//! an entry (its symbols bind and its guards hold).

use crate::error::{Error, Result};
use crate::signature::{bind, Arg, Bindings};
use aotgrad_cache::{AotResult, ResultMeta, TrainingMeta};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{CompiledGraph, SymId, TensorMeta};
use std::sync::Arc;

/// Where a compiled entry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntrySource {
    /// Compiled in this process.
    Compiled,
    /// Loaded from the result cache.
    Cache,
    /// Loaded from a precompiled file ([`crate::AotFunction::load_precompiled`]).
    Precompiled,
}

/// One compiled specialization of the function: an [`AotResult`] and its runnable
/// graphs.
pub(crate) struct Entry {
    pub(crate) result: Arc<AotResult<CpuTensor>>,
    /// The inference graph (inference entries).
    pub(crate) compiled: Option<Arc<dyn CompiledGraph<CpuTensor>>>,
    /// The compiled forward and backward (training entries).
    pub(crate) training: Option<TrainingParts>,
    /// Where the result came from.
    pub(crate) source: EntrySource,
}

impl Entry {
    /// Make the runnable entry of `result`: the one path for fresh, cached and
    /// precompiled results. Loaded artifacts must come from a backend with the same
    /// cache identity as `backend`.
    pub(crate) fn instantiate(
        result: Arc<AotResult<CpuTensor>>,
        backend: &dyn aotgrad_ir::Backend<CpuTensor>,
        source: EntrySource,
    ) -> Result<Entry> {
        let m = &result.meta;
        if source != EntrySource::Compiled {
            // A backend without an identity promises nothing about stored artifacts:
            // none is loaded into it, and none it wrote is trusted.
            let Some(here) = backend.cache_identity() else {
                return Err(Error::Cache(format!(
                    "backend `{}` declares no cache identity: it cannot load stored results",
                    backend.name()
                )));
            };
            if m.backend_identity.is_empty() {
                return Err(Error::Cache(format!(
                    "the result was compiled by `{}`, which declares no cache identity",
                    m.backend
                )));
            }
            if m.backend_identity != here {
                return Err(Error::Cache(format!(
                    "the result was compiled by `{}` and this function uses `{here}`",
                    m.backend_identity
                )));
            }
        }
        // A stored result's metadata was checked when it was decoded (the cache's
        // lookup, `decode_precompiled`); a fresh one is checked too in debug builds, so
        // that the test suite holds every result the compiler makes to the rules a
        // stored one must pass. The artifacts are checked here, once loaded.
        if source == EntrySource::Compiled && cfg!(debug_assertions) {
            m.validate().map_err(|e| Error::Internal(format!("a fresh result fails the stored-result check: {e}")))?;
        }
        let check = source != EntrySource::Compiled || cfg!(debug_assertions);
        let fw = result.forward.load(backend)?;
        let (compiled, training) = match (&m.training, &result.backward) {
            (Some(_), Some(bw)) => (None, Some(TrainingParts { fw, bw: bw.load(backend)? })),
            (None, None) => (Some(fw), None),
            _ => return Err(Error::Cache("a training result needs exactly one backward artifact".into())),
        };
        if check {
            check_artifacts(m, compiled.as_ref(), training.as_ref()).map_err(|e| match (source, e) {
                (EntrySource::Compiled, e) => {
                    Error::Internal(format!("a fresh result fails the stored-result check: {e}"))
                }
                (_, e) => e,
            })?;
        }
        Ok(Entry { result, compiled, training, source })
    }

    /// The result's runtime metadata.
    pub(crate) fn m(&self) -> &ResultMeta {
        &self.result.meta
    }

    /// The training metadata of a training entry.
    pub(crate) fn tm(&self) -> Result<&TrainingMeta> {
        self.m().training.as_ref().ok_or_else(|| Error::Internal("not a training entry".into()))
    }

    /// Metadata of functional-graph output `go`.
    pub(crate) fn graph_output_meta(&self, go: usize) -> Result<&TensorMeta> {
        self.m().graph_output_metas.get(go).ok_or_else(|| Error::Internal(format!("no graph output {go}")))
    }

    pub(crate) fn report(&self) -> CompileReport {
        let m = self.m();
        CompileReport {
            training: m.training.is_some(),
            backend: m.backend.clone(),
            stages: m.stages.clone(),
            source: self.source,
        }
    }
}

/// How one specialization was compiled: the path and each stage's wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileReport {
    /// The training path (joint graph, partition, forward and backward graphs), or
    /// the inference path (one graph).
    pub training: bool,
    /// The backend that compiled the graphs ([`aotgrad_ir::Backend::name`]).
    pub backend: String,
    /// `(stage, seconds)` in order: `trace`, `functionalize`, then `joint`,
    /// `simplify`, `partition`, `backend forward`, `backend backward` (training) or
    /// `backend` (inference). For a loaded result: the times of the compile that made
    /// it.
    pub stages: Vec<(String, f64)>,
    /// Whether this process compiled it or loaded it.
    pub source: EntrySource,
}

impl CompileReport {
    /// The whole compile time in seconds.
    pub fn total_seconds(&self) -> f64 {
        self.stages.iter().map(|(_, s)| s).sum()
    }
}

/// Check a loaded result's artifacts against the metadata that calls them: each takes
/// the inputs the runtime will give it (metadata equal to what the calling convention
/// and the partition record) and returns as many outputs as the runtime reads.
fn check_artifacts(
    m: &ResultMeta,
    compiled: Option<&Arc<dyn CompiledGraph<CpuTensor>>>,
    training: Option<&TrainingParts>,
) -> Result<()> {
    let check = |what: &str, g: &Arc<dyn CompiledGraph<CpuTensor>>, inputs: &[TensorMeta], outputs: usize| {
        let Some((have, n)) = g.signature() else { return Ok(()) };
        let why = if have.len() != inputs.len() {
            format!("takes {} inputs, and its metadata gives it {}", have.len(), inputs.len())
        } else if let Some(i) = (0..have.len()).find(|&i| have[i] != inputs[i]) {
            format!("takes input {i} as {}, and its metadata gives it {}", have[i], inputs[i])
        } else if n != outputs {
            format!("returns {n} outputs, and its metadata reads {outputs}")
        } else {
            return Ok(());
        };
        Err(Error::Cache(format!("inconsistent result: the {what} artifact {why}")))
    };
    // The graph inputs, as the runtime makes them (see `bind::graph_inputs`).
    let conv = &m.convention;
    let mut graph_inputs: Vec<Option<TensorMeta>> = vec![None; m.graph_inputs];
    for (k, slot) in conv.args.iter().enumerate() {
        if let (aotgrad_meta::ArgSlot::Input(g), Some(meta)) = (slot, m.input_metas.get(k)) {
            if let Some(s) = graph_inputs.get_mut(*g) {
                *s = Some(meta.clone());
            }
        }
    }
    for b in &conv.bases {
        let dtype = b.members.first().and_then(|&k| m.input_metas.get(k)).map(|t| t.dtype);
        if let (Some(s), Some(dtype)) = (graph_inputs.get_mut(b.input), dtype) {
            *s = Some(b.meta(dtype));
        }
    }
    let graph_inputs: Vec<TensorMeta> = graph_inputs
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Cache("inconsistent result: a graph input is given by no traced input".into()))?;
    let graph_outputs = m.meta.num_graph_outputs();
    if let Some(c) = compiled {
        check("inference", c, &graph_inputs, graph_outputs)?;
    }
    if let (Some(t), Some(tm)) = (training, &m.training) {
        let saved: Vec<TensorMeta> = tm.partition.saved.iter().map(|(_, meta, _)| meta.clone()).collect();
        check("forward", &t.fw, &graph_inputs, tm.num_fw_outputs + saved.len())?;
        let mut bw_inputs = saved;
        for &go in &tm.tangent_outputs {
            bw_inputs.extend(m.graph_output_metas.get(go).map(TensorMeta::to_contiguous));
        }
        check("backward", &t.bw, &bw_inputs, tm.grad_primals.len())?;
    }
    Ok(())
}

/// The runnable training graphs of one entry.
pub(crate) struct TrainingParts {
    pub fw: Arc<dyn CompiledGraph<CpuTensor>>,
    pub bw: Arc<dyn CompiledGraph<CpuTensor>>,
}

/// Bind the entry's symbols from the call's tensors and check its guards.
pub(crate) fn entry_bindings(entry: &Entry, args: &[Arg]) -> Option<Bindings> {
    result_bindings(entry.m(), args)
}

/// Bind a result's symbols from the call's tensors and check its guards.
pub(crate) fn result_bindings(m: &ResultMeta, args: &[Arg]) -> Option<Bindings> {
    if m.slot_of_arg.len() != args.len() {
        return None;
    }
    let mut env = Bindings::new();
    for (k, &i) in m.traced_args.iter().enumerate() {
        let t = args.get(i)?.tensor()?;
        if !bind(m.input_metas.get(k)?, &t.meta(), &mut env) {
            return None;
        }
    }
    let lookup = |s: SymId| env.get(&s).copied();
    m.guards.iter().all(|g| g.check(&lookup)).then_some(env)
}

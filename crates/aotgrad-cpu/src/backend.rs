//! The reference backend: "compiling" a graph keeps it, running it interprets it node
//! by node. Every other backend is tested against this one.

use crate::{interpret_with_symbols, CpuTensor};
use aotgrad_ir::text::{parse_graph, print_graph};
use aotgrad_ir::{Backend, BackendError, CompiledGraph, Graph, SymId};

/// The reference interpreter as a [`Backend`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

/// A graph kept for interpretation.
#[derive(Clone, Debug)]
pub struct InterpretedGraph {
    graph: Graph,
}

const NAME: &str = "cpu-reference";

fn err(msg: impl ToString) -> BackendError {
    BackendError { backend: NAME.into(), msg: msg.to_string() }
}

impl Backend<CpuTensor> for ReferenceBackend {
    fn name(&self) -> &str {
        NAME
    }
    fn cache_identity(&self) -> Option<String> {
        // The artifact is the graph's text: it runs anywhere this version runs.
        Some(format!("{NAME} {} format text", env!("CARGO_PKG_VERSION")))
    }
    fn compile(&self, graph: &Graph) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        Ok(Box::new(InterpretedGraph { graph: graph.clone() }))
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<Box<dyn CompiledGraph<CpuTensor>>, BackendError> {
        let text = std::str::from_utf8(bytes).map_err(|e| err(format!("artifact is not UTF-8: {e}")))?;
        let graph = parse_graph(text).map_err(err)?;
        Ok(Box::new(InterpretedGraph { graph }))
    }
}

impl CompiledGraph<CpuTensor> for InterpretedGraph {
    fn run_with_symbols(&self, inputs: &[CpuTensor], symbols: &[(SymId, i64)]) -> Result<Vec<CpuTensor>, BackendError> {
        interpret_with_symbols(&self.graph, inputs, symbols).map_err(err)
    }
    fn serialize(&self) -> Vec<u8> {
        print_graph(&self.graph).into_bytes()
    }
    fn signature(&self) -> Option<(Vec<aotgrad_ir::TensorMeta>, usize)> {
        Some((self.graph.inputs.iter().map(|i| i.meta.clone()).collect(), self.graph.outputs.len()))
    }
}

//! The derivative of a recorded node's graph: `aotgrad-autodiff`'s joint graph for the
//! inputs that get a gradient, pruned to what computes the gradients, and which
//! inputs it reads. One function for eager autograd's backward pass and the runtime's
//! saved-version check; it needs nothing of the tracer.

use aotgrad_autodiff::build_joint;
use aotgrad_ir::{Graph, ValueId};
use std::collections::HashSet;

/// What a node's backward runs, derived once per node (see [`derivative`]).
pub struct Prepared {
    /// The differentiated graph, kept to what computes the gradients: inputs are the
    /// node's inputs then the output gradient; outputs the gradients of `grad_inputs`.
    pub(crate) graph: Graph,
    /// Which node inputs get a gradient, in output order.
    pub(crate) grad_inputs: Vec<usize>,
    /// Which node inputs the gradient reads (only those must be unmodified).
    pub reads: Vec<bool>,
}

/// The derivative of a node's graph `g` for the inputs that `requires` marks: the
/// pruned backward graph, and which of `g`'s inputs it reads (those it saves).
pub fn derivative(g: &Graph, requires: &[bool]) -> std::result::Result<Prepared, String> {
    let outputs = vec![true; g.outputs.len()];
    let joint = build_joint(g, requires, &outputs).map_err(|e| e.to_string())?;
    let mut graph = joint.graph.clone();
    graph.outputs = graph.outputs[joint.num_fw_outputs..].to_vec();
    prune(&mut graph);
    let used = used_inputs(&graph);
    let reads = (0..g.inputs.len()).map(|i| used.contains(&graph.inputs[i].id)).collect();
    Ok(Prepared { graph, grad_inputs: joint.grad_primals.clone(), reads })
}

/// Drop the nodes no output needs.
fn prune(g: &mut Graph) {
    let mut live: HashSet<ValueId> = g.outputs.iter().copied().collect();
    let mut keep = vec![false; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate().rev() {
        if live.contains(&n.out) {
            keep[i] = true;
            live.extend(n.args.iter().copied());
        }
    }
    let mut i = 0;
    g.nodes.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// The inputs some node or output of `g` reads.
fn used_inputs(g: &Graph) -> HashSet<ValueId> {
    let mut used: HashSet<ValueId> = g.outputs.iter().copied().collect();
    for n in &g.nodes {
        used.extend(n.args.iter().copied());
    }
    used
}

//! Facts about a joint graph the partitioners share: which values are forward, which
//! are live, which forward values the backward uses.
//!
//! Values are numbered by *slot*: the inputs first (primals, then tangents), then the
//! nodes, in graph order (a topological order).

use crate::error::{PartitionError, Result};
use aotgrad_autodiff::JointGraph;
use aotgrad_ir::{Graph, Op, TensorMeta, ValueId};
use std::collections::HashMap;

/// The analysis of one joint graph.
pub(crate) struct JointInfo<'a> {
    /// The joint graph.
    pub(crate) j: &'a JointGraph,
    /// Slot of every value.
    pub(crate) slot: HashMap<ValueId, usize>,
    /// Argument slots per slot (empty for inputs).
    pub(crate) args: Vec<Vec<usize>>,
    /// True for values that do not depend on a tangent.
    pub(crate) forward: Vec<bool>,
    /// True for values some output needs.
    pub(crate) live: Vec<bool>,
    /// Forward values the backward uses directly (an argument of a live backward node,
    /// or a gradient output), by slot, ascending.
    pub(crate) bw_uses: Vec<usize>,
}

impl<'a> JointInfo<'a> {
    /// Analyze `j`, checking its convention.
    pub(crate) fn new(j: &'a JointGraph) -> Result<JointInfo<'a>> {
        let g = &j.graph;
        let bad = |m: String| Err(PartitionError::InvalidJoint(m));
        if g.inputs.len() != j.num_primals + j.num_tangents {
            return bad(format!(
                "{} inputs, but {} primals and {} tangents",
                g.inputs.len(),
                j.num_primals,
                j.num_tangents
            ));
        }
        if g.outputs.len() != j.num_fw_outputs + j.grad_primals.len() {
            return bad(format!(
                "{} outputs, but {} forward outputs and {} gradients",
                g.outputs.len(),
                j.num_fw_outputs,
                j.grad_primals.len()
            ));
        }
        let n_in = g.inputs.len();
        let total = n_in + g.nodes.len();
        let mut slot = HashMap::with_capacity(total);
        let mut args = vec![Vec::new(); total];
        let mut forward = vec![true; total];
        for (i, inp) in g.inputs.iter().enumerate() {
            if slot.insert(inp.id, i).is_some() {
                return bad(format!("input {} is defined twice", inp.id));
            }
            forward[i] = i < j.num_primals;
        }
        for (k, n) in g.nodes.iter().enumerate() {
            let s = n_in + k;
            if n.op.is_mutation() {
                return bad(format!(
                    "node {} is the mutation {}; the joint graph must be functional",
                    n.out,
                    n.op.name()
                ));
            }
            for a in &n.args {
                match slot.get(a) {
                    Some(&sa) => {
                        args[s].push(sa);
                        forward[s] &= forward[sa];
                    }
                    None => return bad(format!("node {} uses {a} before it is defined", n.out)),
                }
            }
            if slot.insert(n.out, s).is_some() {
                return bad(format!("value {} is defined twice", n.out));
            }
        }
        let outs = g
            .outputs
            .iter()
            .map(|o| {
                slot.get(o).copied().ok_or_else(|| PartitionError::InvalidJoint(format!("output {o} is undefined")))
            })
            .collect::<Result<Vec<usize>>>()?;
        if let Some((k, _)) = outs.iter().enumerate().take(j.num_fw_outputs).find(|(_, s)| !forward[**s]) {
            return bad(format!("forward output {k} ({}) depends on a tangent", g.outputs[k]));
        }
        let live = reach(&args, outs.iter().copied(), |_| true);
        let mut used = vec![false; total];
        for s in n_in..total {
            if live[s] && !forward[s] {
                for &a in &args[s] {
                    used[a] |= forward[a];
                }
            }
        }
        for &s in &outs[j.num_fw_outputs..] {
            used[s] |= forward[s];
        }
        let bw_uses = (0..total).filter(|&s| used[s]).collect();
        Ok(JointInfo { j, slot, args, forward, live, bw_uses })
    }

    /// The graph.
    pub(crate) fn graph(&self) -> &Graph {
        &self.j.graph
    }
    /// Number of inputs.
    pub(crate) fn n_inputs(&self) -> usize {
        self.j.graph.inputs.len()
    }
    /// True for primal inputs.
    pub(crate) fn is_primal(&self, s: usize) -> bool {
        s < self.j.num_primals
    }
    /// The op of a node slot (`None` for inputs).
    pub(crate) fn op(&self, s: usize) -> Option<&Op> {
        s.checked_sub(self.n_inputs()).map(|k| &self.j.graph.nodes[k].op)
    }
    /// The value id of a slot.
    pub(crate) fn value(&self, s: usize) -> ValueId {
        let n = self.n_inputs();
        if s < n {
            self.j.graph.inputs[s].id
        } else {
            self.j.graph.nodes[s - n].out
        }
    }
    /// The metadata of a slot.
    pub(crate) fn meta(&self, s: usize) -> &TensorMeta {
        let n = self.n_inputs();
        if s < n {
            &self.j.graph.inputs[s].meta
        } else {
            &self.j.graph.nodes[s - n].meta
        }
    }
    /// True for forward nodes that must not be recomputed in the backward (banned ops).
    pub(crate) fn is_banned(&self, s: usize) -> bool {
        self.op(s).is_some_and(is_banned)
    }
    /// Estimated FLOPs of a node slot (0 for inputs).
    pub(crate) fn flops(&self, s: usize) -> u64 {
        match self.op(s) {
            None => 0,
            Some(op) => {
                let metas: Vec<&TensorMeta> = self.args[s].iter().map(|&a| self.meta(a)).collect();
                crate::cost::flops_of(op, &metas, self.meta(s))
            }
        }
    }
    /// A readable name: the input's name for inputs, `%N (op)` for nodes.
    pub(crate) fn describe(&self, s: usize) -> String {
        match self.op(s) {
            None => format!("{} \"{}\"", self.value(s), self.j.graph.inputs[s].name),
            Some(op) => format!("{} ({})", self.value(s), op.name()),
        }
    }
}

/// Ops whose results the backward never recomputes: matrix products and
/// convolutions (expensive), pooling (a pass over its input that no kernel fuses, as
/// PyTorch keeps max pooling's results), random ops (their values must be the
/// forward's) and composites (opaque).
pub fn is_banned(op: &Op) -> bool {
    matches!(
        op,
        Op::Mm
            | Op::Bmm
            | Op::Conv2d(_)
            | Op::Conv2dInputGrad { .. }
            | Op::Conv2dWeightGrad { .. }
            | Op::MaxPool2d(_)
            | Op::MaxPool2dGrad(_)
            | Op::Composite(_)
    ) || op.is_random()
}

/// Slots reachable backwards (through arguments) from `roots`, descending only into
/// slots for which `descend` holds (the roots are always included).
pub(crate) fn reach(
    args: &[Vec<usize>],
    roots: impl IntoIterator<Item = usize>,
    descend: impl Fn(usize) -> bool,
) -> Vec<bool> {
    let mut seen = vec![false; args.len()];
    let mut stack: Vec<usize> = Vec::new();
    for r in roots {
        if !seen[r] {
            seen[r] = true;
            stack.push(r);
        }
    }
    while let Some(s) = stack.pop() {
        if !descend(s) {
            continue;
        }
        for &a in &args[s] {
            if !seen[a] {
                seen[a] = true;
                stack.push(a);
            }
        }
    }
    seen
}

//! The joint pass: copy the forward graph, add tangent inputs, and run reverse-mode
//! accumulation over the nodes that lie between a primal requiring a gradient and an
//! output with a tangent.
//!
//! 1. The forward inputs and nodes are copied with their value and storage ids; new
//!    values and storages are numbered after the largest forward ones.
//! 2. Only floating values carry gradients: primals flagged `requires_grad` with an
//!    integer or bool dtype, and outputs flagged `output_has_tangent` that are not
//!    floating, are left out of [`JointGraph::grad_primals`] and
//!    [`JointGraph::tangent_outputs`].
//! 3. A value is *active* when a gradient-carrying edge leads to it from a primal
//!    requiring grad, and from it to an output with a tangent (edges: the argument
//!    positions [`crate::rules::grad_flows`] accepts, between floating values). Only
//!    active nodes are differentiated; contributions are reduced to the argument's
//!    shape, cast to its dtype and summed with `add`.
//! 4. `as_strided` addresses storage, not its input's elements: a view reached through
//!    other views (`x[:, ::2].as_strided(..)`) may read elements of the storage root
//!    `x` its input does not hold. It is differentiated with respect to that root (the
//!    first value up its chain of views), so those elements get their gradient too.
//!    The walk up the chain stops at a cut value (see 5.): a detached view is the root
//!    of the views taken from it.
//! 5. Cuts ([`crate::GradCuts`]): a detached value passes no gradient to its
//!    arguments; a straight-through value passes none to its arguments either, and
//!    its whole gradient to its `previous` value (an extra gradient-carrying edge).
//! 6. Outputs: the forward outputs, then one contiguous gradient per primal in
//!    `grad_primals` (zeros, via `full`, for a primal no tangent reaches).

use crate::builder::Builder;
use crate::rules::{self, grad_flows, not_functional};
use crate::{AutodiffError, GradCuts, JointGraph, Result};
use aotgrad_ir::{DimOracle, Graph, Node, Op, ValueId};
use std::collections::{HashMap, HashSet};

/// See [`crate::build_joint_with_oracle`].
pub(crate) fn build(
    fw: &Graph,
    requires_grad: &[bool],
    output_has_tangent: &[bool],
    cuts: &GradCuts<'_>,
    oracle: &mut dyn DimOracle,
) -> Result<JointGraph> {
    if requires_grad.len() != fw.inputs.len() {
        return Err(AutodiffError::Internal(format!(
            "build_joint: {} requires_grad flags for {} forward inputs",
            requires_grad.len(),
            fw.inputs.len()
        )));
    }
    if output_has_tangent.len() != fw.outputs.len() {
        return Err(AutodiffError::Internal(format!(
            "build_joint: {} output_has_tangent flags for {} forward outputs",
            output_has_tangent.len(),
            fw.outputs.len()
        )));
    }
    if let Some(n) = fw.nodes.iter().find(|n| n.op.is_mutation()) {
        return Err(not_functional(&n.op));
    }
    let mut b = Builder::from_forward(fw, oracle)?;

    let grad_primals: Vec<usize> =
        (0..fw.inputs.len()).filter(|&i| requires_grad[i] && fw.inputs[i].meta.dtype.is_float()).collect();
    let mut tangent_outputs = Vec::new();
    for (j, &o) in fw.outputs.iter().enumerate() {
        if output_has_tangent[j] && b.meta(o)?.dtype.is_float() {
            tangent_outputs.push(j);
        }
    }
    let mut tangents = Vec::with_capacity(tangent_outputs.len());
    for (k, &j) in tangent_outputs.iter().enumerate() {
        let meta = b.meta(fw.outputs[j])?.to_contiguous();
        tangents.push(b.add_input(format!("tangent{k}"), meta)?);
    }

    let cut: HashSet<ValueId> =
        cuts.detached.iter().copied().chain(cuts.straight_through.iter().map(|(n, _)| *n)).collect();

    // Nodes as differentiated: `as_strided` of a view reads its storage root. A cut
    // value is a root of its own: the walk must not carry a gradient past it.
    let mut roots: HashMap<ValueId, ValueId> = HashMap::new();
    let mut rerouted: HashMap<usize, Node> = HashMap::new();
    for (k, n) in fw.nodes.iter().enumerate() {
        if let (true, Some(&a)) = (n.op.is_view(), n.args.first()) {
            let root = roots.get(&a).copied().unwrap_or(a);
            if !cut.contains(&n.out) {
                roots.insert(n.out, root);
            }
            if matches!(n.op, Op::AsStrided { .. }) && root != a {
                rerouted.insert(k, Node { args: vec![root], ..n.clone() });
            }
        }
    }
    let nodes: Vec<&Node> = fw.nodes.iter().enumerate().map(|(k, n)| rerouted.get(&k).unwrap_or(n)).collect();

    let straight: HashMap<ValueId, ValueId> = cuts.straight_through.iter().copied().collect();
    let flows = |b: &Builder, n: &Node, i: usize| -> Result<bool> {
        Ok(!cut.contains(&n.out)
            && grad_flows(&n.op, i)
            && n.meta.dtype.is_float()
            && b.meta(n.args[i])?.dtype.is_float())
    };
    // Values a gradient-carrying edge reaches from a primal requiring grad.
    let mut from_primal: HashSet<ValueId> = grad_primals.iter().map(|&i| fw.inputs[i].id).collect();
    for n in &nodes {
        if straight.get(&n.out).is_some_and(|p| from_primal.contains(p)) && n.meta.dtype.is_float() {
            from_primal.insert(n.out);
        }
        for (i, a) in n.args.iter().enumerate() {
            if from_primal.contains(a) && flows(&b, n, i)? {
                from_primal.insert(n.out);
                break;
            }
        }
    }
    // Values from which such an edge leads to an output with a tangent.
    let mut to_output: HashSet<ValueId> =
        tangent_outputs.iter().map(|&j| fw.outputs[j]).filter(|o| from_primal.contains(o)).collect();
    for n in nodes.iter().rev() {
        if to_output.contains(&n.out) {
            if let Some(p) = straight.get(&n.out).filter(|p| from_primal.contains(p)) {
                to_output.insert(*p);
            }
            for (i, a) in n.args.iter().enumerate() {
                if from_primal.contains(a) && flows(&b, n, i)? {
                    to_output.insert(*a);
                }
            }
        }
    }
    // `to_output` only holds values that are also in `from_primal`: the active ones.
    let active = to_output;

    let mut grads: HashMap<ValueId, ValueId> = HashMap::with_capacity(active.len());
    for (&j, &t) in tangent_outputs.iter().zip(&tangents) {
        let o = fw.outputs[j];
        if active.contains(&o) {
            accumulate(&mut b, &mut grads, o, t)?;
        }
    }
    for n in nodes.iter().rev() {
        if !active.contains(&n.out) {
            continue;
        }
        let Some(&g) = grads.get(&n.out) else { continue };
        if let Some(&p) = straight.get(&n.out).filter(|p| active.contains(p)) {
            let pm = b.meta(p)?.clone();
            let c = b.fit_to(g, &pm)?;
            accumulate(&mut b, &mut grads, p, c)?;
        }
        let mut needs = Vec::with_capacity(n.args.len());
        for (i, a) in n.args.iter().enumerate() {
            needs.push(active.contains(a) && flows(&b, n, i)?);
        }
        if !needs.contains(&true) {
            continue;
        }
        b.loc = n.loc.clone();
        let contribs = rules::vjp(&mut b, n, g, &needs)?;
        for ((&a, c), &need) in n.args.iter().zip(contribs).zip(&needs) {
            if let (Some(c), true) = (c, need) {
                let am = b.meta(a)?.clone();
                let c = b.fit_to(c, &am)?;
                accumulate(&mut b, &mut grads, a, c)?;
            }
        }
    }
    b.loc = None;

    let mut outputs = fw.outputs.clone();
    for &i in &grad_primals {
        let p = &fw.inputs[i];
        let g = match grads.get(&p.id) {
            Some(&g) => {
                let g = b.fit_to(g, &p.meta)?;
                b.contiguous(g)?
            }
            None => b.zeros(p.meta.shape.clone(), p.meta.dtype)?,
        };
        outputs.push(g);
    }
    b.graph.outputs = outputs;
    tracing::debug!(
        primals = fw.inputs.len(),
        tangents = tangents.len(),
        grads = grad_primals.len(),
        fw_nodes = fw.nodes.len(),
        joint_nodes = b.graph.nodes.len(),
        "joint graph built"
    );
    Ok(JointGraph {
        graph: b.into_graph(),
        num_primals: fw.inputs.len(),
        num_tangents: tangents.len(),
        num_fw_outputs: fw.outputs.len(),
        tangent_outputs,
        grad_primals,
    })
}

/// Add contribution `c` to the gradient of `v`.
fn accumulate(b: &mut Builder, grads: &mut HashMap<ValueId, ValueId>, v: ValueId, c: ValueId) -> Result<()> {
    let total = match grads.get(&v) {
        Some(&prev) => b.binary(aotgrad_ir::BinaryOp::Add, prev, c)?,
        None => c,
    };
    grads.insert(v, total);
    Ok(())
}

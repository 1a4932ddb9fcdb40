//! Finishing the functional graph: classify each user output (fresh, an input, a
//! view of an input, of an intermediate or of another output), lay out the graph
//! outputs (updated inputs, user outputs, intermediate bases), write kept input
//! mutations back with trailing `copy_`s, collect per-input facts, drop dead nodes
//! and renumber.

use crate::pass::Pass;
use crate::{eliminate_dead_code_with, AutogradFacts, FunctionalizeError, Functionalized, Options, Result};
use aotgrad_ir::{Aliasing, Graph, Op, StorageId, ValueId};
use aotgrad_meta::{CallingConvention, InputInfo, OutputInfo, OutputKind, ViewAndMutationMeta};
use std::collections::HashMap;

/// Classify the user outputs; returns them and the roots whose values the graph
/// returns as intermediate bases.
fn classify(p: &Pass<'_, '_>) -> Result<(Vec<OutputInfo>, Vec<usize>)> {
    let traced = p.traced;
    let mut outputs: Vec<OutputInfo> = Vec::new();
    let mut first_seen: HashMap<ValueId, usize> = HashMap::new();
    let mut nonalias_of_root: HashMap<usize, usize> = HashMap::new();
    let mut pending: Vec<usize> = Vec::new();
    // What each aliasing node's result aliases (its first operand), and the inputs.
    let alias_of: HashMap<ValueId, ValueId> = traced
        .nodes
        .iter()
        .filter(|n| !matches!(n.op.aliasing(), Aliasing::Fresh) && !n.args.is_empty())
        .map(|n| (n.out, n.args[0]))
        .collect();
    let input_index: HashMap<ValueId, usize> = traced.inputs.iter().enumerate().map(|(i, inp)| (inp.id, i)).collect();
    for (j, v) in traced.outputs.iter().enumerate() {
        let t = p.tval(*v)?;
        let meta = traced
            .meta_of(*v)
            .cloned()
            .ok_or_else(|| FunctionalizeError::Internal(format!("output {v} has no metadata")))?;
        let requires_grad = p.facts.output_requires_grad.get(j).copied().unwrap_or(false);
        let kind = if let Some(&k) = first_seen.get(v) {
            OutputKind::SameAs(k)
        } else if let Some(i) = t.handle {
            OutputKind::IsInput(i)
        } else if p.roots[t.root].graph_input.is_some() {
            // The input it was viewed from (several inputs may share the root): the
            // runtime regenerates it from that one, so its gradient reaches that one.
            let members = &p.roots[t.root].members;
            let from = origin(*v, &alias_of, &input_index).filter(|i| members.contains(i));
            OutputKind::AliasOfInput(from.unwrap_or(members[0]))
        } else if t.chain.is_empty() {
            nonalias_of_root.entry(t.root).or_insert(j);
            OutputKind::NonAlias
        } else {
            pending.push(j);
            OutputKind::NonAlias // fixed below
        };
        first_seen.entry(*v).or_insert(j);
        let no_grad_view = p.facts.output_no_grad_view.get(j).copied().unwrap_or(false);
        // A `detach`ed alias's family passes its own gradient once written with one.
        let (grad_cut, own_gradient) = match t.family {
            Some(k) => {
                let cut = t.cut || !p.families[k].grad;
                (cut, !cut)
            }
            None => (t.cut, p.straight_meta.contains(v)),
        };
        // (Without the fact: an alias is a view for autograd, a result a non-leaf.)
        let creation = p
            .facts
            .output_creation
            .get(j)
            .cloned()
            .unwrap_or(aotgrad_ir::ViewCreation { view: true, ..Default::default() });
        outputs.push(OutputInfo { kind, meta, requires_grad, grad_cut, no_grad_view, own_gradient, creation });
    }
    let mut base_roots: Vec<usize> = Vec::new();
    let mut base_of_root: HashMap<usize, usize> = HashMap::new();
    for j in pending {
        let r = p.tval(traced.outputs[j])?.root;
        outputs[j].kind = match nonalias_of_root.get(&r) {
            Some(&k) => OutputKind::AliasOfOutput(k),
            None => {
                let b = *base_of_root.entry(r).or_insert_with(|| {
                    base_roots.push(r);
                    base_roots.len() - 1
                });
                OutputKind::AliasOfIntermediate(b)
            }
        };
    }
    // A view autograd does not see through passes no gradient to what it views (a
    // fresh result of it, by contrast, is computed from the cut alias).
    for o in &mut outputs {
        o.grad_cut &= !matches!(o.kind, OutputKind::NonAlias);
        o.no_grad_view &= !matches!(o.kind, OutputKind::NonAlias);
        o.own_gradient &= !matches!(o.kind, OutputKind::NonAlias | OutputKind::SameAs(_));
        if matches!(o.kind, OutputKind::NonAlias) {
            // A fresh result is no view: only whether it is a leaf remains.
            o.creation = aotgrad_ir::ViewCreation { leaf: o.creation.leaf, ..Default::default() };
        }
    }
    Ok((outputs, base_roots))
}

/// The traced input that value `v` aliases through a chain of views and in-place ops.
fn origin(mut v: ValueId, alias_of: &HashMap<ValueId, ValueId>, inputs: &HashMap<ValueId, usize>) -> Option<usize> {
    loop {
        if let Some(&i) = inputs.get(&v) {
            return Some(i);
        }
        v = *alias_of.get(&v)?;
    }
}

pub(crate) fn finish(mut p: Pass<'_, '_>, options: &Options, convention: CallingConvention) -> Result<Functionalized> {
    let traced = p.traced;
    let (outputs, base_roots) = classify(&p)?;
    let mut graph_outputs = Vec::new();
    let mut mutated_inputs = Vec::new();
    let mut keep_copies = Vec::new();
    let mut input_roots: Vec<usize> = (0..p.roots.len()).filter(|&r| p.roots[r].graph_input.is_some()).collect();
    input_roots.sort_by_key(|&r| p.roots[r].graph_input);
    for &r in &input_roots {
        let root = &p.roots[r];
        let (Some(g), true) = (root.graph_input, root.mutated) else { continue };
        if options.keep_input_mutations {
            keep_copies.push((p.b.graph.inputs[g].id, root.cur));
        } else {
            graph_outputs.push(root.cur);
            mutated_inputs.push(g);
        }
    }
    for v in &traced.outputs {
        let f = p.fresh(*v, &None)?;
        graph_outputs.push(f);
    }
    for &r in &base_roots {
        graph_outputs.push(p.roots[r].cur);
    }
    for (dst, src) in keep_copies {
        p.b.emit(Op::InPlace(Box::new(Op::Copy)), vec![dst, src], &None)?;
    }

    let mut inputs = Vec::new();
    for (i, inp) in traced.inputs.iter().enumerate() {
        let root = &p.roots[p.tval(inp.id)?.root];
        let final_meta = traced.meta_of(p.handle_final[i]).cloned().unwrap_or_else(|| inp.meta.clone());
        let mutates_metadata = final_meta != inp.meta;
        inputs.push(InputInfo {
            mutates_data: root.mutated,
            mutates_metadata,
            mutations_hidden_from_autograd: root.mutated && root.all_hidden,
            requires_grad: p.facts.input_requires_grad.get(i).copied().unwrap_or(false),
            final_meta: mutates_metadata.then_some(final_meta),
        });
    }

    let mut graph = p.b.into_graph();
    graph.outputs = graph_outputs;
    let straight: HashMap<ValueId, ValueId> = p.autograd.straight_through.iter().copied().collect();
    let (graph, vmap) = compact(eliminate_dead_code_with(graph, &straight));
    // Renumber the autograd facts; drop those about dead values.
    let autograd = AutogradFacts {
        detached: p.autograd.detached.iter().filter_map(|v| vmap.get(v).copied()).collect(),
        straight_through: p
            .autograd
            .straight_through
            .iter()
            .filter_map(|(n, o)| Some((*vmap.get(n)?, *vmap.get(o)?)))
            .collect(),
    };
    let meta = ViewAndMutationMeta {
        inputs,
        outputs,
        mutated_inputs,
        num_intermediate_bases: base_roots.len(),
        keep_input_mutations: options.keep_input_mutations,
    };
    Ok(Functionalized { graph, meta, convention, autograd })
}

/// Renumber values and storages densely, in definition order; returns the value map.
fn compact(mut g: Graph) -> (Graph, HashMap<ValueId, ValueId>) {
    let mut vmap: HashMap<ValueId, ValueId> = HashMap::new();
    let mut smap: HashMap<StorageId, StorageId> = HashMap::new();
    let sid = |s: StorageId, smap: &mut HashMap<StorageId, StorageId>| {
        let n = smap.len() as u32;
        *smap.entry(s).or_insert(StorageId(n))
    };
    for inp in &mut g.inputs {
        let n = ValueId(vmap.len() as u32);
        vmap.insert(inp.id, n);
        inp.id = n;
        inp.storage = sid(inp.storage, &mut smap);
    }
    for node in &mut g.nodes {
        let n = ValueId(vmap.len() as u32);
        vmap.insert(node.out, n);
        node.out = n;
        node.storage = sid(node.storage, &mut smap);
        for a in &mut node.args {
            *a = vmap.get(a).copied().unwrap_or(*a);
        }
    }
    for o in &mut g.outputs {
        *o = vmap.get(o).copied().unwrap_or(*o);
    }
    (g, vmap)
}

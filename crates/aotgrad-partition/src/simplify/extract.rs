//! Extraction: pick one e-node per e-class and rebuild a [`Graph`].
//!
//! Cost of an e-node (see [`crate::cost`]): 0 for a graph input, 1 for a view (it only
//! computes metadata), `1 + FLOPs + bytes written` for anything else. The cost of an
//! e-class is the least tree cost `own + Σ children` over its e-nodes, computed with
//! Knuth's generalization of Dijkstra's algorithm (every e-node costs at least as much
//! as each of its children), in exact `u128` arithmetic that saturates; ties go to the
//! e-node found first. The chosen e-nodes reachable from the outputs become the new
//! graph, emitted in a topological order that follows the input graph's node order
//! (an e-class is placed where its first original node was; a class that only
//! rewrites created goes just before its first user).
//!
//! Tree costs do not see sharing: a rewrite can be cheaper for its own class yet add
//! nodes to the graph (`sum(expand(x))` to `sum(x) * k` while the expand stays alive
//! for another user). When the extracted graph has more nodes or a higher total cost
//! than the input, [`revert_until_no_worse`] puts classes back to their first original
//! e-node, one at a time, keeping each revert that lowers the node count (or keeps it
//! and lowers the cost).

use crate::cost::{bytes_of, flops_of};
use crate::error::{PartitionError, Result};
use crate::simplify::lang::{ENode, EG};
use aotgrad_ir::{Aliasing, Graph, Node, SourceLoc, StorageId, TensorMeta, ValueId};
use egg::Id;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Own cost of an e-node in class `class`.
pub(crate) fn node_cost(eg: &EG, class: Id, node: &ENode) -> u128 {
    match node {
        ENode::Input(_) => 0,
        ENode::Op(k, args) => {
            if k.op().is_view() {
                return 1;
            }
            let out: &TensorMeta = &eg[class].data;
            let metas: Vec<&TensorMeta> = args.iter().map(|a| &*eg[*a].data).collect();
            1 + flops_of(k.op(), &metas, out) as u128 + bytes_of(out) as u128
        }
    }
}

/// Total cost of a graph: the sum of its nodes' own costs (the model of [`node_cost`]).
pub(crate) fn graph_cost(g: &Graph) -> u128 {
    let mut metas: HashMap<ValueId, &TensorMeta> = g.inputs.iter().map(|i| (i.id, &i.meta)).collect();
    let mut total = 0u128;
    for n in &g.nodes {
        let own = if n.op.is_view() {
            1
        } else {
            let args: Vec<&TensorMeta> = n.args.iter().filter_map(|a| metas.get(a).copied()).collect();
            1 + flops_of(&n.op, &args, &n.meta) as u128 + bytes_of(&n.meta) as u128
        };
        total = total.saturating_add(own);
        metas.insert(n.out, &n.meta);
    }
    total
}

/// The best e-node of every e-class that has an acyclic one: `class -> node`.
pub(crate) fn best_nodes(eg: &EG) -> HashMap<Id, ENode> {
    // Parents: child class -> (parent class, parent node) per occurrence.
    let mut nodes: Vec<(Id, &ENode, u128)> = Vec::new();
    for class in eg.classes() {
        for n in &class.nodes {
            nodes.push((class.id, n, node_cost(eg, class.id, n)));
        }
    }
    let mut parents: HashMap<Id, Vec<usize>> = HashMap::new();
    let mut remaining: Vec<usize> = Vec::with_capacity(nodes.len());
    let mut heap = BinaryHeap::new();
    for (i, (_, n, own)) in nodes.iter().enumerate() {
        for c in n.args() {
            parents.entry(eg.find(*c)).or_default().push(i);
        }
        remaining.push(n.args().len());
        if n.args().is_empty() {
            heap.push(Reverse((*own, i)));
        }
    }
    let mut best: HashMap<Id, (u128, usize)> = HashMap::new();
    while let Some(Reverse((cost, i))) = heap.pop() {
        let class = nodes[i].0;
        if best.contains_key(&class) {
            continue;
        }
        best.insert(class, (cost, i));
        for &p in parents.get(&class).map_or(&[][..], |v| v.as_slice()) {
            remaining[p] -= 1;
            if remaining[p] == 0 && !best.contains_key(&nodes[p].0) {
                let (_, n, own) = nodes[p];
                let total = n
                    .args()
                    .iter()
                    .fold(own, |acc, c| acc.saturating_add(best.get(&eg.find(*c)).map_or(u128::MAX, |b| b.0)));
                heap.push(Reverse((total, p)));
            }
        }
    }
    best.into_iter().map(|(c, (_, i))| (c, nodes[i].1.clone())).collect()
}

/// Number of op nodes and total own cost of the graph the selection `sel` extracts for
/// `roots`; `None` if the selection is cyclic or incomplete.
pub(crate) fn dag_stats(eg: &EG, roots: &[Id], sel: &HashMap<Id, ENode>) -> Option<(usize, u128)> {
    let post = post_order(eg, roots, |c| sel.get(&c)).ok()?;
    let (mut count, mut cost) = (0usize, 0u128);
    for c in post {
        let node = sel.get(&c)?;
        if let ENode::Op(..) = node {
            count += 1;
            cost = cost.saturating_add(node_cost(eg, c, node));
        }
    }
    Some((count, cost))
}

/// Why a selection has no post order.
enum Unordered {
    /// An e-class the walk reached has no selected e-node.
    Missing(Id),
    /// The selection is cyclic through this e-class.
    Cycle(Id),
}

/// The e-classes the selection `sel` reaches from `roots`, each once, arguments before
/// their users (an iterative DFS: graphs can be deep).
fn post_order<'n>(
    eg: &EG,
    roots: &[Id],
    sel: impl Fn(Id) -> Option<&'n ENode>,
) -> std::result::Result<Vec<Id>, Unordered> {
    let mut post: Vec<Id> = Vec::new();
    let mut state: HashMap<Id, bool> = HashMap::new(); // false = open, true = done
    for &r in roots {
        let r = eg.find(r);
        if state.contains_key(&r) {
            continue;
        }
        state.insert(r, false);
        let mut stack = vec![(r, 0usize)];
        while let Some((c, k)) = stack.pop() {
            let args = sel(c).ok_or(Unordered::Missing(c))?.args();
            if k < args.len() {
                stack.push((c, k + 1));
                let a = eg.find(args[k]);
                match state.get(&a) {
                    None => {
                        state.insert(a, false);
                        stack.push((a, 0));
                    }
                    Some(false) => return Err(Unordered::Cycle(a)),
                    Some(true) => {}
                }
            } else {
                state.insert(c, true);
                post.push(c);
            }
        }
    }
    Ok(post)
}

/// Revert classes of `sel` to their `original` e-node until the extracted graph has at
/// most `max_nodes` nodes and costs at most `max_cost` (see the module docs). Returns
/// `None` if that is not reached.
pub(crate) fn revert_until_no_worse(
    eg: &EG,
    roots: &[Id],
    mut sel: HashMap<Id, ENode>,
    original: &HashMap<Id, (usize, ENode)>,
    max_nodes: usize,
    max_cost: u128,
) -> Option<HashMap<Id, ENode>> {
    let (mut count, mut cost) = dag_stats(eg, roots, &sel)?;
    if count <= max_nodes && cost <= max_cost {
        return Some(sel);
    }
    // Latest original position first: reverting near the outputs tends to free the most.
    let mut candidates: Vec<(usize, Id)> =
        original.iter().filter(|(c, (_, n))| sel.get(c) != Some(n)).map(|(c, (p, _))| (*p, *c)).collect();
    candidates.sort_by(|a, b| b.cmp(a));
    for (_, c) in candidates {
        let Some((_, orig)) = original.get(&c) else { continue };
        let Some(prev) = sel.insert(c, orig.clone()) else { continue };
        match dag_stats(eg, roots, &sel) {
            Some((n, k)) if n < count || (n == count && k < cost) => (count, cost) = (n, k),
            _ => {
                sel.insert(c, prev);
            }
        }
        if count <= max_nodes && cost <= max_cost {
            return Some(sel);
        }
    }
    None
}

/// Rebuild a graph from the chosen e-nodes: inputs as in `g`, outputs the classes `roots`.
/// `order` gives the position of the first original node of a class (its priority),
/// `locs` a representative source location.
pub(crate) fn rebuild(
    eg: &EG,
    g: &Graph,
    roots: &[Id],
    best: &HashMap<Id, ENode>,
    order: &HashMap<Id, usize>,
    locs: &HashMap<Id, SourceLoc>,
) -> Result<Graph> {
    let choice = |c: Id| {
        best.get(&c).ok_or_else(|| PartitionError::Internal(format!("e-class {c} has no acyclic e-node to extract")))
    };
    // Post order over the chosen e-nodes.
    let post = post_order(eg, roots, |c| best.get(&c)).map_err(|e| match e {
        Unordered::Missing(c) => PartitionError::Internal(format!("e-class {c} has no acyclic e-node to extract")),
        Unordered::Cycle(a) => PartitionError::Internal(format!("extraction found a cycle through e-class {a}")),
    })?;
    // Priorities: original position, or (for rewrite-made classes) that of the first user.
    let mut prio: HashMap<Id, usize> = HashMap::new();
    let mut users: HashMap<Id, Vec<Id>> = HashMap::new();
    for &c in &post {
        for a in choice(c)?.args() {
            users.entry(eg.find(*a)).or_default().push(c);
        }
    }
    for &c in post.iter().rev() {
        let p = match order.get(&c) {
            Some(&p) => p,
            None => {
                users.get(&c).into_iter().flatten().filter_map(|u| prio.get(u)).min().copied().unwrap_or(usize::MAX)
            }
        };
        prio.insert(c, p);
    }
    // Kahn's algorithm by (priority, post-order index).
    let post_index: HashMap<Id, usize> = post.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let key =
        |c: Id| (prio.get(&c).copied().unwrap_or(usize::MAX), post_index.get(&c).copied().unwrap_or(usize::MAX), c);
    let mut indeg: HashMap<Id, usize> = HashMap::new();
    let mut heap = BinaryHeap::new();
    for &c in &post {
        let n = choice(c)?.args().len();
        indeg.insert(c, n);
        if n == 0 {
            heap.push(Reverse(key(c)));
        }
    }
    let mut out = Graph { inputs: g.inputs.clone(), nodes: Vec::new(), outputs: Vec::new() };
    let mut next_value = g.inputs.iter().map(|i| i.id.0 + 1).max().unwrap_or(0);
    let mut next_storage = g.inputs.iter().map(|i| i.storage.0 + 1).max().unwrap_or(0);
    let mut value_of: HashMap<Id, (ValueId, StorageId)> = HashMap::new();
    while let Some(Reverse((_, _, c))) = heap.pop() {
        let def = match choice(c)? {
            ENode::Input(i) => {
                let inp = g.inputs.get(*i as usize).ok_or_else(|| PartitionError::Internal(format!("no input {i}")))?;
                (inp.id, inp.storage)
            }
            ENode::Op(k, args) => {
                let arg_vals = args
                    .iter()
                    .map(|a| value_of.get(&eg.find(*a)).copied())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| PartitionError::Internal(format!("e-class {c} emitted before its arguments")))?;
                let storage = match k.op().aliasing() {
                    Aliasing::Fresh => {
                        next_storage += 1;
                        StorageId(next_storage - 1)
                    }
                    _ => arg_vals.first().map(|v| v.1).ok_or_else(|| {
                        PartitionError::Internal(format!("view op {} without an argument", k.op().name()))
                    })?,
                };
                let id = ValueId(next_value);
                next_value += 1;
                out.nodes.push(Node {
                    out: id,
                    op: k.op().clone(),
                    args: arg_vals.iter().map(|v| v.0).collect(),
                    meta: (*eg[c].data).clone(),
                    storage,
                    loc: locs.get(&c).cloned(),
                });
                (id, storage)
            }
        };
        value_of.insert(c, def);
        for u in users.get(&c).into_iter().flatten() {
            if let Some(d) = indeg.get_mut(u) {
                *d -= 1;
                if *d == 0 {
                    heap.push(Reverse(key(*u)));
                }
            }
        }
    }
    for &r in roots {
        let v = value_of
            .get(&eg.find(r))
            .ok_or_else(|| PartitionError::Internal(format!("output e-class {r} was not emitted")))?;
        out.outputs.push(v.0);
    }
    Ok(out)
}

/// For each output: the input positions it shares storage with, and the earlier outputs
/// it shares storage with.
type Relation = Vec<(Vec<usize>, Vec<usize>)>;

fn storages(g: &Graph) -> HashMap<ValueId, StorageId> {
    g.inputs.iter().map(|i| (i.id, i.storage)).chain(g.nodes.iter().map(|n| (n.out, n.storage))).collect()
}

/// Input positions per storage.
fn inputs_by_storage(g: &Graph) -> HashMap<StorageId, Vec<usize>> {
    let mut ins: HashMap<StorageId, Vec<usize>> = HashMap::new();
    for (p, i) in g.inputs.iter().enumerate() {
        ins.entry(i.storage).or_default().push(p);
    }
    ins
}

fn relation(g: &Graph, st: &HashMap<ValueId, StorageId>) -> Option<Relation> {
    let ins = inputs_by_storage(g);
    let mut outs: HashMap<StorageId, Vec<usize>> = HashMap::new();
    let mut rel = Vec::with_capacity(g.outputs.len());
    for (k, o) in g.outputs.iter().enumerate() {
        let s = *st.get(o)?;
        let earlier = outs.get(&s).cloned().unwrap_or_default();
        rel.push((ins.get(&s).cloned().unwrap_or_default(), earlier));
        outs.entry(s).or_default().push(k);
    }
    Some(rel)
}

/// The results of `g`'s nodes making fresh storage (not inputs, not views).
fn fresh_values(g: &Graph) -> std::collections::HashSet<ValueId> {
    g.nodes.iter().filter(|n| n.op.aliasing() == aotgrad_ir::Aliasing::Fresh).map(|n| n.out).collect()
}

/// Make `new` (rebuilt from `orig`) share storage between outputs and inputs exactly as
/// `orig` does, by giving an output a fresh contiguous copy where the simplification
/// made it share storage it did not share before, or made a fresh output a view (of a
/// larger buffer: `clone(x[0:1])` is `x[0:1]` to the e-graph, but the caller sees its
/// storage). Returns `None` when that cannot fix it.
pub(crate) fn preserve_aliasing(orig: &Graph, mut new: Graph) -> Option<Graph> {
    let want = relation(orig, &storages(orig))?;
    let mut st = storages(&new);
    let (fresh_orig, fresh_new) = (fresh_values(orig), fresh_values(&new));
    let became_view: Vec<bool> =
        orig.outputs.iter().zip(&new.outputs).map(|(o, v)| fresh_orig.contains(o) && !fresh_new.contains(v)).collect();
    if relation(&new, &st)? == want && !became_view.contains(&true) {
        return Some(new);
    }
    let mut copies: HashMap<ValueId, ValueId> = HashMap::new(); // original output value -> its copy
    let mut next_storage = new.next_storage().0;
    let mut next_value = new.next_value().0;
    let metas: HashMap<ValueId, TensorMeta> = new
        .inputs
        .iter()
        .map(|i| (i.id, i.meta.clone()))
        .chain(new.nodes.iter().map(|n| (n.out, n.meta.clone())))
        .collect();
    let ins_of = inputs_by_storage(&new);
    // Earlier outputs of `new` (as fixed so far) per storage: output `k`'s row of the
    // relation only depends on outputs before it.
    let mut outs_of: HashMap<StorageId, Vec<usize>> = HashMap::new();
    let empty: &[usize] = &[];
    for (k, (ins, earlier)) in want.iter().enumerate() {
        let o = orig.outputs[k];
        // Only an output that owns its storage (no input, no other output value) can be copied.
        let owns = ins.is_empty() && earlier.iter().all(|&l| orig.outputs[l] == o);
        let s = *st.get(&new.outputs[k])?;
        let row_ok = ins_of.get(&s).map_or(empty, Vec::as_slice) == ins.as_slice()
            && outs_of.get(&s).map_or(empty, Vec::as_slice) == earlier.as_slice();
        if became_view[k] && !owns {
            // A fresh value other outputs view (an intermediate base) that became a
            // view of a larger buffer: a copy would part it from its views, and the
            // runtime regenerates them from it by storage position. Keep the graph.
            return None;
        }
        if owns && (!row_ok || became_view[k]) {
            if let Some(c) = copies.get(&o) {
                new.outputs[k] = *c;
            } else {
                let v = new.outputs[k];
                let meta = metas.get(&v)?.clone();
                if meta.to_contiguous() != meta {
                    return None;
                }
                let id = ValueId(next_value);
                next_value += 1;
                let storage = StorageId(next_storage);
                next_storage += 1;
                new.nodes.push(Node { out: id, op: aotgrad_ir::Op::Clone, args: vec![v], meta, storage, loc: None });
                st.insert(id, storage);
                copies.insert(o, id);
                new.outputs[k] = id;
            }
        }
        let s = *st.get(&new.outputs[k])?;
        outs_of.entry(s).or_default().push(k);
    }
    (relation(&new, &st)? == want).then_some(new)
}

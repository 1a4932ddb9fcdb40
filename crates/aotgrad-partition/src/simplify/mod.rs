//! E-graph simplification of functional graphs with `egg`.
//!
//! [`simplify`] loads a graph into an e-graph (one e-class per distinct value, so common
//! subexpressions merge on load), runs the rewrite rules (module `rules`) with egg's
//! [`Runner`] under [`SimplifyLimits`], and extracts the cheapest graph (see
//! `extract`). Guarantees:
//! - inputs are kept as they are (ids, names, metadata, storage) and outputs keep their
//!   order and metadata;
//! - every e-class has one metadata, so every node of the result has exactly the
//!   metadata of the value it replaces;
//! - the result never has more nodes, nor a higher total cost, than the input; when the
//!   rewritten extraction would, the CSE-only extraction (the e-graph as loaded, no
//!   rules) is used, and when even that would, the input itself;
//! - outputs share storage with inputs and with each other exactly as in the input
//!   (an output that became one of the inputs, or another output's value, gets a
//!   contiguous copy; if that is not possible the next fallback above is used);
//! - each node carries the source location of the first input-graph node of its e-class.
//!
//! Graphs with mutations (`InPlace`, `MetaInPlace`) are rejected: simplification runs
//! after functionalization.

pub(crate) mod extract;
pub(crate) mod lang;

use crate::error::{PartitionError, Result};
use crate::rules::all_rules;
use crate::verify::verify_graph;
use aotgrad_autodiff::JointGraph;
use aotgrad_ir::{Graph, SourceLoc, ValueId};
use egg::{Id, Runner};
use lang::{ENode, MetaAnalysis, OpKey, EG};
use std::collections::HashMap;
use std::time::Duration;

/// Limits on the equality-saturation run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimplifyLimits {
    /// Stop once the e-graph has this many e-nodes.
    pub node_limit: usize,
    /// Stop after this many rule iterations.
    pub iter_limit: usize,
    /// Stop after this much time.
    pub time_limit: Duration,
}

impl Default for SimplifyLimits {
    /// 100,000 e-nodes, 8 iterations, 1 second: the rules rarely need more than a few
    /// iterations to saturate, and each adds at most a few e-nodes per match.
    fn default() -> Self {
        SimplifyLimits { node_limit: 100_000, iter_limit: 8, time_limit: Duration::from_secs(1) }
    }
}

/// Which graph [`simplify_with_stats`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimplifyOutcome {
    /// The extraction after the rewrite rules ran.
    Rewritten,
    /// The extraction of the e-graph as loaded (CSE and dead-code removal only).
    CseOnly,
    /// The input graph, unchanged.
    Unchanged,
}

/// What a simplification did.
#[derive(Clone, Debug, PartialEq)]
pub struct SimplifyStats {
    /// Nodes of the input graph.
    pub nodes_before: usize,
    /// Nodes of the result.
    pub nodes_after: usize,
    /// E-nodes in the e-graph when the runner stopped.
    pub egraph_nodes: usize,
    /// E-classes in the e-graph when the runner stopped.
    pub egraph_classes: usize,
    /// Rule iterations run.
    pub iterations: usize,
    /// Why the runner stopped (egg's `StopReason`, printed).
    pub stop_reason: String,
    /// Which graph was returned.
    pub outcome: SimplifyOutcome,
}

/// Simplify a functional graph (see the module docs).
pub fn simplify(g: &Graph, limits: &SimplifyLimits) -> Result<Graph> {
    simplify_with_stats(g, limits).map(|(g, _)| g)
}

/// Simplify a joint graph: the same inputs (primals, then tangents), the same outputs
/// (forward outputs, then gradients) and the same counts.
pub fn simplify_joint(j: &JointGraph, limits: &SimplifyLimits) -> Result<JointGraph> {
    let graph = simplify(&j.graph, limits)?;
    Ok(JointGraph { graph, ..j.clone() })
}

/// [`simplify`], also returning what it did.
pub fn simplify_with_stats(g: &Graph, limits: &SimplifyLimits) -> Result<(Graph, SimplifyStats)> {
    let _span = tracing::debug_span!("simplify", nodes = g.nodes.len()).entered();
    if let Some(n) = g.nodes.iter().find(|n| n.op.is_mutation()) {
        return Err(PartitionError::Unsupported(format!(
            "simplify needs a functional graph, but node {} is the mutation {}",
            n.out,
            n.op.name()
        )));
    }
    let collapsed = collapse_view_chains(g);
    let g = collapsed.as_ref().unwrap_or(g);
    if g.nodes.len() > 2 * WINDOW {
        return simplify_windowed(g, limits);
    }
    simplify_whole(g, limits)
}

/// Graphs longer than twice this many nodes are simplified window by window: each
/// window of consecutive nodes is one e-graph (values from earlier windows are its
/// inputs, values used later its outputs), so the cost grows linearly with the graph
/// and every window gets the full limits, instead of one e-graph hitting its node
/// limit and leaving a long program unsimplified. Rewrites across a window boundary
/// are missed; CSE across windows too (both rare in the long programs this is for).
const WINDOW: usize = 2048;

fn simplify_windowed(g: &Graph, limits: &SimplifyLimits) -> Result<(Graph, SimplifyStats)> {
    use aotgrad_ir::{Input, StorageId, TensorMeta, ValueMap};
    let n = g.nodes.len();
    let mut last_use: ValueMap<usize> = ValueMap::for_graph(g);
    for (k, node) in g.nodes.iter().enumerate() {
        for a in &node.args {
            last_use.insert(*a, k);
        }
    }
    for o in &g.outputs {
        last_use.insert(*o, n);
    }
    let mut meta_of: ValueMap<(&TensorMeta, StorageId)> = ValueMap::for_graph(g);
    for i in &g.inputs {
        meta_of.insert(i.id, (&i.meta, i.storage));
    }
    for node in &g.nodes {
        meta_of.insert(node.out, (&node.meta, node.storage));
    }
    let mut out = Graph { inputs: g.inputs.clone(), nodes: Vec::with_capacity(n), outputs: Vec::new() };
    // Original value -> (value in `out`, its storage in `out`).
    let mut map: ValueMap<(ValueId, StorageId)> = ValueMap::for_graph(g);
    for i in &g.inputs {
        map.insert(i.id, (i.id, i.storage));
    }
    let (mut next_v, mut next_s) = (g.next_value().0, g.next_storage().0);
    let mut stats = SimplifyStats {
        nodes_before: n,
        nodes_after: 0,
        egraph_nodes: 0,
        egraph_classes: 0,
        iterations: 0,
        stop_reason: String::new(),
        outcome: SimplifyOutcome::Unchanged,
    };
    let missing = |v: &ValueId| PartitionError::Internal(format!("simplify: window input {v} has no value"));
    for (w, chunk) in g.nodes.chunks(WINDOW).enumerate() {
        let end = w * WINDOW + chunk.len();
        let defined: std::collections::HashSet<ValueId> = chunk.iter().map(|c| c.out).collect();
        let mut sub = Graph::new();
        let mut seen = std::collections::HashSet::new();
        for node in chunk {
            for a in &node.args {
                if !defined.contains(a) && seen.insert(*a) {
                    let (meta, storage) = meta_of.get(a).ok_or_else(|| missing(a))?;
                    sub.inputs.push(Input {
                        id: *a,
                        name: format!("v{}", a.0),
                        meta: (*meta).clone(),
                        storage: *storage,
                    });
                }
            }
        }
        sub.nodes = chunk.to_vec();
        sub.outputs = chunk.iter().map(|c| c.out).filter(|v| last_use.get(v).is_some_and(|&u| u >= end)).collect();
        let (s, st) = simplify_whole(&sub, limits)?;
        stats.egraph_nodes += st.egraph_nodes;
        stats.egraph_classes += st.egraph_classes;
        stats.iterations = stats.iterations.max(st.iterations);
        stats.stop_reason = st.stop_reason;
        if st.outcome != SimplifyOutcome::Unchanged {
            stats.outcome = SimplifyOutcome::Rewritten;
        }
        if s.inputs.len() != sub.inputs.len() || s.outputs.len() != sub.outputs.len() {
            return Err(PartitionError::Internal("simplify: a window changed its inputs or outputs".into()));
        }
        let mut vmap: HashMap<ValueId, (ValueId, StorageId)> = HashMap::new();
        let mut smap: HashMap<StorageId, StorageId> = HashMap::new();
        for (si, orig) in s.inputs.iter().zip(&sub.inputs) {
            let m = *map.get(&orig.id).ok_or_else(|| missing(&orig.id))?;
            vmap.insert(si.id, m);
            smap.insert(si.storage, m.1);
        }
        for mut node in s.nodes {
            for a in &mut node.args {
                *a = vmap.get(a).ok_or_else(|| missing(a))?.0;
            }
            let storage = *smap.entry(node.storage).or_insert_with(|| {
                next_s += 1;
                StorageId(next_s - 1)
            });
            let id = ValueId(next_v);
            next_v += 1;
            vmap.insert(node.out, (id, storage));
            node.out = id;
            node.storage = storage;
            out.nodes.push(node);
        }
        for (so, orig) in s.outputs.iter().zip(&sub.outputs) {
            map.insert(*orig, *vmap.get(so).ok_or_else(|| missing(so))?);
        }
    }
    out.outputs = g.outputs.iter().map(|o| map.get(o).map(|m| m.0).ok_or_else(|| missing(o))).collect::<Result<_>>()?;
    verify_graph(&out)?;
    stats.nodes_after = out.nodes.len();
    tracing::debug!(?stats, "simplified by windows");
    Ok((out, stats))
}

/// Equality saturation over the whole graph `g` (no view-chain pre-pass).
fn simplify_whole(g: &Graph, limits: &SimplifyLimits) -> Result<(Graph, SimplifyStats)> {
    let (egraph, loaded) = load(g)?;
    let rules = all_rules().map_err(PartitionError::Internal)?;
    let runner = Runner::<ENode, MetaAnalysis, ()>::new(MetaAnalysis::default())
        .with_egraph(egraph)
        .with_node_limit(limits.node_limit)
        .with_iter_limit(limits.iter_limit)
        .with_time_limit(limits.time_limit)
        .run(&rules);
    let eg = &runner.egraph;
    if let Some(e) = eg.analysis.errors.first() {
        return Err(PartitionError::Internal(format!("simplify: {e}")));
    }
    let mut stats = SimplifyStats {
        nodes_before: g.nodes.len(),
        nodes_after: g.nodes.len(),
        egraph_nodes: eg.total_number_of_nodes(),
        egraph_classes: eg.number_of_classes(),
        iterations: runner.iterations.len(),
        stop_reason: runner.stop_reason.as_ref().map(|r| format!("{r:?}")).unwrap_or_default(),
        outcome: SimplifyOutcome::Unchanged,
    };
    let (max_nodes, max_cost) = (g.nodes.len(), extract::graph_cost(g));
    let best = extract::best_nodes(eg);
    let rewritten = extract_from(eg, g, &loaded, best, max_nodes, max_cost)?;
    let result = match rewritten {
        Some(r) => Some((r, SimplifyOutcome::Rewritten)),
        None => {
            let (again, tables) = load(g)?;
            let sel = tables.original.iter().map(|(c, (_, n))| (*c, n.clone())).collect();
            let cse = extract_from(&again, g, &tables, sel, max_nodes, max_cost)?;
            cse.map(|r| (r, SimplifyOutcome::CseOnly))
        }
    };
    let (out, outcome) = match result {
        Some((out, outcome)) => {
            verify_graph(&out)?;
            (out, outcome)
        }
        None => (g.clone(), SimplifyOutcome::Unchanged),
    };
    stats.nodes_after = out.nodes.len();
    stats.outcome = outcome;
    tracing::debug!(?stats, "simplified");
    Ok((out, stats))
}

/// Side tables of a graph loaded into an e-graph.
struct Loaded {
    /// E-class of each output.
    roots: Vec<Id>,
    /// The first e-node of each e-class in the input graph and its position (inputs
    /// come first), keyed by the e-class id at load time.
    original: HashMap<Id, (usize, ENode)>,
    /// Source location of the first located node of each e-class.
    locs: HashMap<Id, SourceLoc>,
}

fn load(g: &Graph) -> Result<(EG, Loaded)> {
    let analysis = MetaAnalysis { inputs: g.inputs.iter().map(|i| i.meta.clone()).collect(), ..Default::default() };
    let mut eg = EG::new(analysis);
    let mut class_of: HashMap<ValueId, Id> = HashMap::new();
    let mut original: HashMap<Id, (usize, ENode)> = HashMap::new();
    let mut locs: HashMap<Id, SourceLoc> = HashMap::new();
    for (i, inp) in g.inputs.iter().enumerate() {
        eg.analysis.pending = Some(inp.meta.clone());
        let node = ENode::Input(i as u32);
        let id = eg.add(node.clone());
        eg.analysis.pending = None;
        original.entry(id).or_insert((i, node));
        class_of.insert(inp.id, id);
    }
    for (pos, n) in g.nodes.iter().enumerate() {
        let args = n
            .args
            .iter()
            .map(|a| class_of.get(a).copied())
            .collect::<Option<Vec<Id>>>()
            .ok_or_else(|| PartitionError::Unsupported(format!("node {} uses a value defined after it", n.out)))?;
        eg.analysis.pending = Some(n.meta.clone());
        let node = ENode::Op(OpKey::new(n.op.clone()), args);
        let id = eg.add(node.clone());
        eg.analysis.pending = None;
        if *eg[id].data != n.meta {
            return Err(PartitionError::Unsupported(format!(
                "node {} ({}) repeats an earlier computation but records different metadata {}",
                n.out,
                n.op.name(),
                n.meta
            )));
        }
        original.entry(id).or_insert((g.inputs.len() + pos, node));
        if let Some(l) = &n.loc {
            locs.entry(id).or_insert_with(|| l.clone());
        }
        class_of.insert(n.out, id);
    }
    let roots = g
        .outputs
        .iter()
        .map(|o| class_of.get(o).copied())
        .collect::<Option<Vec<Id>>>()
        .ok_or_else(|| PartitionError::Unsupported("an output is never defined".into()))?;
    eg.rebuild();
    Ok((eg, Loaded { roots, original, locs }))
}

/// Extract the graph of selection `sel` (reverted toward the original as needed to have
/// at most `max_nodes` nodes and cost `max_cost`); `None` if that fails or output
/// aliasing cannot be preserved.
fn extract_from(
    eg: &EG,
    g: &Graph,
    loaded: &Loaded,
    sel: HashMap<Id, ENode>,
    max_nodes: usize,
    max_cost: u128,
) -> Result<Option<Graph>> {
    // Side tables were keyed at load time; classes may have merged since.
    let canon = |n: &ENode| match n {
        ENode::Input(i) => ENode::Input(*i),
        ENode::Op(k, a) => ENode::Op(k.clone(), a.iter().map(|c| eg.find(*c)).collect()),
    };
    let mut original: HashMap<Id, (usize, ENode)> = HashMap::new();
    for (id, (p, n)) in &loaded.original {
        let c = eg.find(*id);
        if original.get(&c).is_none_or(|(q, _)| p < q) {
            original.insert(c, (*p, canon(n)));
        }
    }
    let mut locs: HashMap<Id, (usize, SourceLoc)> = HashMap::new();
    for (id, l) in &loaded.locs {
        let p = loaded.original.get(id).map_or(usize::MAX, |(p, _)| *p);
        let c = eg.find(*id);
        if locs.get(&c).is_none_or(|(q, _)| p < *q) {
            locs.insert(c, (p, l.clone()));
        }
    }
    let locs: HashMap<Id, SourceLoc> = locs.into_iter().map(|(k, (_, l))| (k, l)).collect();
    let order: HashMap<Id, usize> = original.iter().map(|(c, (p, _))| (*c, *p)).collect();
    let sel: HashMap<Id, ENode> = sel.into_iter().map(|(c, n)| (eg.find(c), canon(&n))).collect();
    let roots = &loaded.roots;
    let Some(sel) = extract::revert_until_no_worse(eg, roots, sel, &original, max_nodes, max_cost) else {
        return Ok(None);
    };
    let out = extract::rebuild(eg, g, roots, &sel, &order, &locs)?;
    Ok(extract::preserve_aliasing(g, out).filter(|r| r.nodes.len() <= max_nodes))
}

/// Views chained deeper than this are collapsed before equality saturation.
const MAX_VIEW_CHAIN: usize = 8;

/// Collapse long chains of views, in one linear pass, before the e-graph sees them:
/// a view whose metadata equals its chain's source is that source, and a view
/// `MAX_VIEW_CHAIN` links deep becomes one `as_strided` of the source (views are
/// storage positions, so the composition is exactly the last view's own metadata).
/// The e-graph's view-chain rules are quadratic on such chains; short chains, which
/// are what models produce, are left to them. `None` when nothing changes.
fn collapse_view_chains(g: &Graph) -> Option<Graph> {
    // (source, depth) of each view value.
    let mut chain: HashMap<ValueId, (ValueId, usize)> = HashMap::new();
    let mut subst: HashMap<ValueId, ValueId> = HashMap::new();
    let metas: HashMap<ValueId, &aotgrad_ir::TensorMeta> =
        g.inputs.iter().map(|i| (i.id, &i.meta)).chain(g.nodes.iter().map(|n| (n.out, &n.meta))).collect();
    let mut out = g.clone();
    let mut changed = false;
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let mut n = n.clone();
        for a in &mut n.args {
            if let Some(s) = subst.get(a) {
                *a = *s;
            }
        }
        if n.op.is_view() && n.args.len() == 1 {
            let a = n.args[0];
            let (src, depth) = chain.get(&a).copied().unwrap_or((a, 0));
            if depth >= 1 && metas.get(&src) == Some(&&n.meta) {
                // The chain came back to its source's own layout: it is the source.
                subst.insert(n.out, src);
                changed = true;
                continue;
            }
            if depth + 1 >= MAX_VIEW_CHAIN && n.meta.is_concrete() {
                n.op = aotgrad_ir::Op::AsStrided {
                    size: n.meta.shape.to_vec(),
                    stride: n.meta.strides.to_vec(),
                    offset: n.meta.offset.clone(),
                };
                n.args = vec![src];
                chain.insert(n.out, (src, 1));
                changed = true;
            } else {
                chain.insert(n.out, (src, depth + 1));
            }
        }
        nodes.push(n);
    }
    if !changed {
        return None;
    }
    out.nodes = nodes;
    for o in &mut out.outputs {
        if let Some(s) = subst.get(o) {
            *o = *s;
        }
    }
    Some(out)
}

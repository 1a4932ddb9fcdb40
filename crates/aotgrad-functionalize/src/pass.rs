//! The functionalization pass proper: roots, view chains, scatter-back, outputs.

use crate::chain::Builder;
use crate::{FunctionalizeError, Functionalized, Options, Result, TraceFacts};
use aotgrad_ir::{Aliasing, Dim, DimOracle, Graph, Op, StorageId, TensorMeta, ValueId};
use aotgrad_meta::convention::{covering_range, needs_synthetic_base};
use aotgrad_meta::{
    ArgSlot, CallingConvention, InputInfo, Layout, OutputInfo, OutputKind, SyntheticBase, ViewAndMutationMeta,
};
use std::collections::{HashMap, HashSet};

/// A storage's root: the value that covers everything reachable in the storage.
struct Root {
    /// Current functional value of the root's contents.
    cur: ValueId,
    /// Bumped on every write, so stale aliases know to replay their chain.
    gen: u32,
    /// The traced storage offset of the root's first element (for `as_strided`).
    offset: Dim,
    /// The root's traced layout is row-major, so `as_strided` offsets are logical.
    contiguous: bool,
    /// Graph input index, when the root is an input or a synthetic base.
    graph_input: Option<usize>,
    /// Traced inputs living in this root.
    members: Vec<usize>,
    /// Some data mutation wrote into the root.
    mutated: bool,
    /// Every such mutation is hidden from autograd.
    all_hidden: bool,
}

/// A traced value: its root, the views from the root to it, and a cached functional value.
#[derive(Clone)]
struct TVal {
    root: usize,
    chain: Vec<Op>,
    fv: ValueId,
    gen: u32,
    /// The traced input whose handle this value is (after its own mutations).
    handle: Option<usize>,
}

fn as_strided_of(op: &Op) -> Option<&Op> {
    match op {
        Op::AsStrided { .. } => Some(op),
        Op::MetaInPlace(inner) if matches!(**inner, Op::AsStrided { .. }) => Some(inner),
        _ => None,
    }
}

fn layout(meta: &TensorMeta) -> Option<Layout> {
    Some(Layout::new(meta.concrete_shape()?, meta.concrete_strides()?, meta.concrete_offset()?))
}

struct Pass<'a, 'o> {
    b: Builder<'o>,
    roots: Vec<Root>,
    vals: HashMap<ValueId, TVal>,
    facts: &'a TraceFacts<'a>,
}

impl Pass<'_, '_> {
    fn tval(&self, v: ValueId) -> Result<TVal> {
        self.vals.get(&v).cloned().ok_or_else(|| FunctionalizeError::Internal(format!("{v} used before definition")))
    }

    /// The functional value of traced value `v` as of now, replaying its view chain from
    /// the root's current value when the root was written since it was last computed.
    fn fresh(&mut self, v: ValueId, loc: &Option<aotgrad_ir::SourceLoc>) -> Result<ValueId> {
        let t = self.tval(v)?;
        let root = &self.roots[t.root];
        if t.gen == root.gen {
            return Ok(t.fv);
        }
        let (mut x, gen) = (root.cur, root.gen);
        for op in &t.chain {
            x = self.b.apply_view(op, x, loc)?;
        }
        let e = self.vals.get_mut(&v).ok_or_else(|| FunctionalizeError::Internal(format!("{v} vanished")))?;
        e.fv = x;
        e.gen = gen;
        Ok(x)
    }

    fn new_root(&mut self, cur: ValueId, meta: &TensorMeta, graph_input: Option<usize>, members: Vec<usize>) -> usize {
        self.roots.push(Root {
            cur,
            gen: 0,
            offset: meta.offset.clone(),
            contiguous: meta.is_contiguous(),
            graph_input,
            members,
            mutated: false,
            all_hidden: true,
        });
        self.roots.len() - 1
    }
}

pub(crate) fn run(
    traced: &Graph,
    facts: &TraceFacts<'_>,
    options: &Options,
    oracle: &mut dyn DimOracle,
) -> Result<Functionalized> {
    // ---- which input storages need a synthetic base -------------------------------
    let mut mutated_storages: HashSet<StorageId> = HashSet::new();
    let mut strided_storages: HashSet<StorageId> = HashSet::new();
    for n in &traced.nodes {
        if n.op.aliasing() == Aliasing::MutatesData {
            mutated_storages.insert(n.storage);
        }
        if as_strided_of(&n.op).is_some() {
            strided_storages.insert(n.storage);
        }
    }
    let mut groups: Vec<(StorageId, Vec<usize>)> = Vec::new();
    for (i, inp) in traced.inputs.iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == inp.storage) {
            Some(g) => g.1.push(i),
            None => groups.push((inp.storage, vec![i])),
        }
    }
    let mut base_of_input: HashMap<usize, usize> = HashMap::new(); // traced input -> group index
    let mut needs_base: Vec<bool> = Vec::new();
    for (gi, (storage, members)) in groups.iter().enumerate() {
        let metas: Vec<&TensorMeta> = members.iter().map(|&i| &traced.inputs[i].meta).collect();
        let layouts: Option<Vec<Layout>> = metas.iter().map(|m| layout(m)).collect();
        let need = if members.len() > 1 {
            let overlapping_write = mutated_storages.contains(storage)
                && match &layouts {
                    Some(ls) => needs_synthetic_base(ls, &vec![true; ls.len()]),
                    None => true,
                };
            overlapping_write || strided_storages.contains(storage)
        } else {
            strided_storages.contains(storage) && !metas[0].is_contiguous()
        };
        if need {
            for &m in members {
                base_of_input.insert(m, gi);
            }
        }
        needs_base.push(need);
    }

    // ---- graph inputs ---------------------------------------------------------------
    let mut p = Pass { b: Builder::new(oracle), roots: Vec::new(), vals: HashMap::new(), facts };
    let mut convention = CallingConvention::default();
    let mut group_root: HashMap<usize, usize> = HashMap::new();
    let mut handle_final: Vec<ValueId> = traced.inputs.iter().map(|i| i.id).collect();
    for (i, inp) in traced.inputs.iter().enumerate() {
        match base_of_input.get(&i) {
            None => {
                let g = p.b.graph.inputs.len();
                let v = p.b.add_input(inp.name.clone(), inp.meta.clone());
                let r = p.new_root(v, &inp.meta, Some(g), vec![i]);
                p.vals.insert(inp.id, TVal { root: r, chain: vec![], fv: v, gen: 0, handle: Some(i) });
                convention.args.push(ArgSlot::Input(g));
            }
            Some(&gi) => {
                let r = match group_root.get(&gi) {
                    Some(&r) => r,
                    None => {
                        let members = groups[gi].1.clone();
                        let layouts: Vec<Layout> =
                            members.iter().filter_map(|&m| layout(&traced.inputs[m].meta)).collect();
                        if layouts.len() != members.len() {
                            return Err(FunctionalizeError::Unsupported {
                                op: "input".into(),
                                loc: None,
                                msg: format!(
                                    "inputs {members:?} alias one storage and one is mutated or viewed with as_strided, \
                                     but their shapes are symbolic; a synthetic base needs concrete layouts \
                                     (mark fewer dims dynamic)"
                                ),
                            });
                        }
                        let (offset, len) = covering_range(&layouts);
                        let meta = TensorMeta {
                            shape: vec![Dim::from(len)],
                            strides: vec![Dim::Const(1)],
                            offset: Dim::from(offset),
                            dtype: inp.meta.dtype,
                        };
                        let g = p.b.graph.inputs.len();
                        let v = p.b.add_input(format!("base{}", convention.bases.len()), meta.clone());
                        let r = p.new_root(v, &meta, Some(g), members.clone());
                        convention.bases.push(SyntheticBase { input: g, members, offset, len });
                        group_root.insert(gi, r);
                        r
                    }
                };
                let base_idx = convention.bases.iter().position(|b| b.members.contains(&i)).unwrap_or(0);
                let rel = inp.meta.offset.sub(&p.roots[r].offset);
                let op = Op::AsStrided { size: inp.meta.shape.clone(), stride: inp.meta.strides.clone(), offset: rel };
                let cur = p.roots[r].cur;
                let fv = p.b.apply_view(&op, cur, &None)?;
                p.vals.insert(inp.id, TVal { root: r, chain: vec![op], fv, gen: 0, handle: Some(i) });
                convention.args.push(ArgSlot::ViewOfBase { base: base_idx });
            }
        }
    }
    convention.num_graph_inputs = p.b.graph.inputs.len();

    // ---- nodes ------------------------------------------------------------------------
    for node in &traced.nodes {
        let loc = &node.loc;
        match node.op.aliasing() {
            Aliasing::Fresh => {
                let args = node.args.iter().map(|a| p.fresh(*a, loc)).collect::<Result<Vec<_>>>()?;
                let v = p.b.emit(node.op.clone(), args, loc)?;
                let r = p.new_root(v, &node.meta, None, vec![]);
                p.vals.insert(node.out, TVal { root: r, chain: vec![], fv: v, gen: 0, handle: None });
            }
            Aliasing::View | Aliasing::MutatesMeta => {
                let inner = match &node.op {
                    Op::MetaInPlace(inner) => (**inner).clone(),
                    op => op.clone(),
                };
                let t0 = p.tval(node.args[0])?;
                let (chain, fv) = if let Op::AsStrided { size, stride, offset } = &inner {
                    let root = &p.roots[t0.root];
                    if !root.contiguous {
                        return Err(FunctionalizeError::Unsupported {
                            op: node.op.name(),
                            loc: loc.clone(),
                            msg: "as_strided of a view of a non-contiguous intermediate".into(),
                        });
                    }
                    let rel = offset.sub(&root.offset);
                    let op = Op::AsStrided { size: size.clone(), stride: stride.clone(), offset: rel };
                    // as_strided reads the storage as of now: the root's current value.
                    let cur = root.cur;
                    let fv = p.b.apply_view(&op, cur, loc)?;
                    (vec![op], fv)
                } else {
                    let x = p.fresh(node.args[0], loc)?;
                    let fv = p.b.apply_view(&inner, x, loc)?;
                    let mut chain = t0.chain.clone();
                    chain.push(inner);
                    (chain, fv)
                };
                let handle = if node.op.aliasing() == Aliasing::MutatesMeta { t0.handle } else { None };
                if let Some(i) = handle {
                    handle_final[i] = node.out;
                }
                let gen = p.roots[t0.root].gen;
                p.vals.insert(node.out, TVal { root: t0.root, chain, fv, gen, handle });
            }
            Aliasing::MutatesData => {
                let Op::InPlace(inner) = &node.op else {
                    return Err(FunctionalizeError::Internal(format!(
                        "{} mutates data but is not InPlace",
                        node.op.name()
                    )));
                };
                let args = node.args.iter().map(|a| p.fresh(*a, loc)).collect::<Result<Vec<_>>>()?;
                let mut new = p.b.emit((**inner).clone(), args, loc)?;
                if p.b.meta(new)?.dtype != node.meta.dtype {
                    new = p.b.emit(Op::Cast(node.meta.dtype), vec![new], loc)?;
                }
                let t0 = p.tval(node.args[0])?;
                // Values along the chain, from the root's current value.
                let mut xs = vec![p.roots[t0.root].cur];
                for op in t0.chain.iter().take(t0.chain.len().saturating_sub(1)) {
                    let last = *xs.last().unwrap_or(&new);
                    xs.push(p.b.apply_view(op, last, loc)?);
                }
                let mut y = new;
                for k in (0..t0.chain.len()).rev() {
                    y = p.b.scatter_back(&t0.chain[k], xs[k], y, loc)?;
                }
                let hidden = (p.facts.hidden_mutation)(node.out);
                let root = &mut p.roots[t0.root];
                root.cur = y;
                root.gen += 1;
                root.mutated = true;
                root.all_hidden &= hidden;
                let gen = root.gen;
                if let Some(i) = t0.handle {
                    handle_final[i] = node.out;
                }
                p.vals.insert(node.out, TVal { root: t0.root, chain: t0.chain, fv: new, gen, handle: t0.handle });
            }
        }
    }

    // ---- outputs ----------------------------------------------------------------------
    let mut outputs: Vec<OutputInfo> = Vec::new();
    let mut first_seen: HashMap<ValueId, usize> = HashMap::new();
    let mut nonalias_of_root: HashMap<usize, usize> = HashMap::new();
    let mut pending: Vec<usize> = Vec::new();
    for (j, v) in traced.outputs.iter().enumerate() {
        let t = p.tval(*v)?;
        let meta = traced
            .meta_of(*v)
            .cloned()
            .ok_or_else(|| FunctionalizeError::Internal(format!("output {v} has no metadata")))?;
        let requires_grad = facts.output_requires_grad.get(j).copied().unwrap_or(false);
        let kind = if let Some(&k) = first_seen.get(v) {
            OutputKind::SameAs(k)
        } else if let Some(i) = t.handle {
            OutputKind::IsInput(i)
        } else if p.roots[t.root].graph_input.is_some() {
            OutputKind::AliasOfInput(p.roots[t.root].members[0])
        } else if t.chain.is_empty() {
            nonalias_of_root.entry(t.root).or_insert(j);
            OutputKind::NonAlias
        } else {
            pending.push(j);
            OutputKind::NonAlias // fixed below
        };
        first_seen.entry(*v).or_insert(j);
        outputs.push(OutputInfo { kind, meta, requires_grad });
    }
    let mut base_roots: Vec<usize> = Vec::new();
    for j in pending {
        let r = p.tval(traced.outputs[j])?.root;
        outputs[j].kind = match nonalias_of_root.get(&r) {
            Some(&k) => OutputKind::AliasOfOutput(k),
            None => {
                let b = match base_roots.iter().position(|&x| x == r) {
                    Some(b) => b,
                    None => {
                        base_roots.push(r);
                        base_roots.len() - 1
                    }
                };
                OutputKind::AliasOfIntermediate(b)
            }
        };
    }

    let mut graph_outputs = Vec::new();
    let mut mutated_inputs = Vec::new();
    let mut keep_copies = Vec::new();
    let mut input_roots: Vec<usize> = (0..p.roots.len()).filter(|&r| p.roots[r].graph_input.is_some()).collect();
    input_roots.sort_by_key(|&r| p.roots[r].graph_input);
    for &r in &input_roots {
        let (g, mutated, cur) = (p.roots[r].graph_input.unwrap_or(0), p.roots[r].mutated, p.roots[r].cur);
        if !mutated {
            continue;
        }
        if options.keep_input_mutations {
            keep_copies.push((p.b.graph.inputs[g].id, cur));
        } else {
            graph_outputs.push(cur);
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

    // ---- per-input facts --------------------------------------------------------------
    let mut inputs = Vec::new();
    for (i, inp) in traced.inputs.iter().enumerate() {
        let root = &p.roots[p.tval(inp.id)?.root];
        let final_meta = traced.meta_of(handle_final[i]).cloned().unwrap_or_else(|| inp.meta.clone());
        let mutates_metadata = final_meta != inp.meta;
        inputs.push(InputInfo {
            mutates_data: root.mutated,
            mutates_metadata,
            mutations_hidden_from_autograd: root.mutated && root.all_hidden,
            requires_grad: facts.input_requires_grad.get(i).copied().unwrap_or(false),
            final_meta: mutates_metadata.then_some(final_meta),
        });
    }

    let mut graph = p.b.graph;
    graph.outputs = graph_outputs;
    let graph = compact(eliminate_dead_code(graph));
    let meta = ViewAndMutationMeta {
        inputs,
        outputs,
        mutated_inputs,
        num_intermediate_bases: base_roots.len(),
        keep_input_mutations: options.keep_input_mutations,
    };
    Ok(Functionalized { graph, meta, convention })
}

/// Drop nodes whose values nothing uses (every node of a functional graph is pure,
/// except trailing `copy_`s into inputs, which are kept).
pub fn eliminate_dead_code(mut g: Graph) -> Graph {
    let mut live: HashSet<ValueId> = g.outputs.iter().copied().collect();
    let mut keep = vec![false; g.nodes.len()];
    for (k, n) in g.nodes.iter().enumerate().rev() {
        if live.contains(&n.out) || n.op.is_mutation() {
            keep[k] = true;
            live.extend(n.args.iter().copied());
        }
    }
    let mut it = keep.into_iter();
    g.nodes.retain(|_| it.next().unwrap_or(true));
    g
}

/// Renumber values and storages densely, in definition order.
pub fn compact(mut g: Graph) -> Graph {
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
    g
}

//! The functionalization pass proper: graph inputs (with synthetic bases), then one
//! step per traced node — fresh ops are re-emitted on up-to-date arguments, views
//! extend their handle's chain, writes are scattered back into the root.
//!
//! Invariant: a root's current value is either its graph input (never written) or a
//! dense row-major value with offset 0. So element `i` of a row-major root's value is
//! storage element `root.offset + i`, which is what `as_strided` views (storage
//! absolute in the trace, root relative in chains) and intermediate-base outputs
//! (regenerated at run time with the traced metadata) rely on.

use crate::chain::Builder;
use crate::plan::{plan, Group};
use crate::{outputs, AutogradFacts, FunctionalizeError, Functionalized, Options, Result, TraceFacts};
use aotgrad_ir::infer::non_overlapping_and_dense;
use aotgrad_ir::{Aliasing, Dim, DimOracle, Graph, Node, Op, SourceLoc, StaticOracle, TensorMeta, ValueId};
use aotgrad_meta::{ArgSlot, CallingConvention, SyntheticBase};
use std::collections::HashMap;

/// A storage's root: the value that covers everything reachable in the storage.
pub(crate) struct Root {
    /// Current functional value of the root's contents.
    pub cur: ValueId,
    /// Bumped on every write, so stale aliases know to replay their chain.
    pub gen: u32,
    /// The traced storage offset of the root's first element (for `as_strided`).
    pub offset: Dim,
    /// The root's traced layout is dense (row-major or another dim order), and its
    /// current value always keeps that layout, so `as_strided` positions relative to
    /// `offset` name the same elements in it.
    pub contiguous: bool,
    /// Graph input index, when the root is an input or a synthetic base.
    pub graph_input: Option<usize>,
    /// Traced inputs living in this root.
    pub members: Vec<usize>,
    /// Some data mutation wrote into the root.
    pub mutated: bool,
    /// Every such mutation is hidden from autograd.
    pub all_hidden: bool,
    /// Autograd tracks the root's current value (it requires grad).
    pub grad: bool,
}

/// The view ops from a root to a value, shared by prefix: a view extends its base's
/// chain by one link instead of copying it, so a program of `n` chained views costs
/// `O(n)`, not `O(n^2)`.
#[derive(Clone, Default)]
pub(crate) struct Chain(Option<std::sync::Arc<Link>>);

struct Link {
    op: Op,
    parent: Chain,
    len: usize,
}

impl Drop for Chain {
    /// Unlink iteratively: a chain of 100k views must not recurse 100k deep.
    fn drop(&mut self) {
        let mut cur = self.0.take();
        while let Some(link) = cur {
            match std::sync::Arc::try_unwrap(link) {
                Ok(mut l) => cur = l.parent.0.take(),
                Err(_) => break,
            }
        }
    }
}

impl Chain {
    /// `self` followed by `op`.
    pub fn push(&self, op: Op) -> Chain {
        Chain(Some(std::sync::Arc::new(Link { op, parent: self.clone(), len: self.len() + 1 })))
    }
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |l| l.len)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
    pub fn last(&self) -> Option<&Op> {
        self.0.as_ref().map(|l| &l.op)
    }
    /// The ops from the root on.
    pub fn ops(&self) -> Vec<&Op> {
        let mut v = Vec::with_capacity(self.len());
        let mut c = self;
        while let Some(l) = &c.0 {
            v.push(&l.op);
            c = &l.parent;
        }
        v.reverse();
        v
    }
}

/// A traced value: its root, the views from the root to it, and a cached functional value.
#[derive(Clone)]
pub(crate) struct TVal {
    pub root: usize,
    pub chain: Chain,
    pub fv: ValueId,
    pub gen: u32,
    /// The traced input whose handle this value is (after its own mutations).
    pub handle: Option<usize>,
    /// A view autograd does not see through (detached, or taken under no-grad): every
    /// functional value of it is a fresh `alias` listed in [`crate::AutogradFacts::detached`].
    pub detached: bool,
    /// This value or a view it was taken from is `detached`: autograd reaches nothing
    /// through it. (In a [`Family`], both describe views under no-grad inside it.)
    pub cut: bool,
    /// The `detach`ed alias this value is (or views): see [`Family`]. `None`: the
    /// storage's own autograd identity.
    pub family: Option<usize>,
}

/// The tensors made from one `detach` (the detached alias and its views): to autograd
/// a new tensor sharing the storage, as in PyTorch. A write through one of them is
/// hidden from the storage's other tensors and changes this family's history alone; a
/// write through another alias changes the family's data but not its history (the new
/// data passes its gradient straight to the family's previous value).
pub(crate) struct Family {
    /// The root whose storage the family shares.
    pub root: usize,
    /// The storage as this family sees it (the root's shape and layout): the root's
    /// data, with this family's history.
    pub cur: ValueId,
    /// The root's `gen` when `cur` was last brought up to date.
    pub gen: u32,
    /// A write autograd sees went through the family: its tensors require grad.
    pub grad: bool,
}

pub(crate) struct Pass<'a, 'o> {
    pub b: Builder<'o>,
    pub roots: Vec<Root>,
    pub vals: HashMap<ValueId, TVal>,
    /// The `detach`ed aliases (indexed by [`TVal::family`]).
    pub families: Vec<Family>,
    pub facts: &'a TraceFacts<'a>,
    pub traced: &'a Graph,
    /// Per traced input: the traced value its handle ends at (metadata mutations move it).
    pub handle_final: Vec<ValueId>,
    /// Where autograd's view differs from the functional graph's (pre-renumbering ids).
    pub autograd: AutogradFacts,
    /// Autograd sees some node or tracks some input of the trace (else no view needs
    /// detaching: nothing carries a gradient).
    pub autograd_active: bool,
    /// Traced values of hidden metadata mutations that pass their gradient straight to
    /// the value before them: returned as they are, such a tensor's gradient goes
    /// through its own graph output, not through storage positions.
    pub straight_meta: std::collections::HashSet<ValueId>,
}

impl Pass<'_, '_> {
    pub fn tval(&self, v: ValueId) -> Result<TVal> {
        self.vals.get(&v).cloned().ok_or_else(|| FunctionalizeError::Internal(format!("{v} used before definition")))
    }

    /// The functional value of traced value `v` as of now, replaying its view chain from
    /// the root's current value when the root was written since it was last computed.
    pub fn fresh(&mut self, v: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let t = self.tval(v)?;
        let root = &self.roots[t.root];
        if t.gen == root.gen {
            return Ok(t.fv);
        }
        if let Some(k) = t.family {
            // A member of a `detach`ed alias's family replays from the family's view of
            // the storage (a view taken under no-grad inside it stays cut).
            let mut x = self.family_fresh(k, loc)?;
            for op in t.chain.ops() {
                x = self.b.apply_view(op, x, loc)?;
            }
            if t.cut {
                x = self.b.detached_alias(x, loc)?;
                self.autograd.detached.push(x);
            }
            let gen = self.roots[t.root].gen;
            let e = self.vals.get_mut(&v).ok_or_else(|| FunctionalizeError::Internal(format!("{v} vanished")))?;
            e.fv = x;
            e.gen = gen;
            return Ok(x);
        }
        let (mut x, gen) = (root.cur, root.gen);
        // A detached value ends in a fresh `alias`: its own last op when that is one.
        let own_alias = t.detached && matches!(t.chain.last(), Some(Op::Alias));
        let ops = t.chain.ops();
        for op in &ops[..ops.len() - usize::from(own_alias)] {
            x = self.b.apply_view(op, x, loc)?;
        }
        // A value cut from autograd (detached, or a view of one: its chain from the
        // root does not say so) stays cut when replayed.
        if t.cut {
            x = self.b.detached_alias(x, loc)?;
            self.autograd.detached.push(x);
        }
        let e = self.vals.get_mut(&v).ok_or_else(|| FunctionalizeError::Internal(format!("{v} vanished")))?;
        e.fv = x;
        e.gen = gen;
        Ok(x)
    }

    /// Family `k`'s view of its storage as of now: after a write through another alias,
    /// the root's new data, passing its gradient to the family's previous value (or
    /// none, while the family has no history).
    fn family_fresh(&mut self, k: usize, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let (r, gen, cur, grad) = {
            let f = &self.families[k];
            (f.root, f.gen, f.cur, f.grad)
        };
        let root = &self.roots[r];
        if gen == root.gen {
            return Ok(cur);
        }
        let (root_cur, root_gen) = (root.cur, root.gen);
        let x = self.b.distinct_alias(root_cur, loc)?;
        if grad {
            self.autograd.straight_through.push((x, cur));
        } else {
            self.autograd.detached.push(x);
        }
        let f = &mut self.families[k];
        f.cur = x;
        f.gen = root_gen;
        Ok(x)
    }

    /// Autograd does not see traced node value `v` (see [`TraceFacts::hidden_mutation`]).
    fn unseen(&self, v: ValueId) -> bool {
        (self.facts.hidden_mutation)(v)
    }

    /// Autograd tracks traced input `i` (it requires grad, and autograd sees it: not
    /// so in a trace run under no-grad).
    fn input_grad(&self, i: usize) -> bool {
        self.facts.input_requires_grad.get(i).copied().unwrap_or(false)
            && self.traced.inputs.get(i).is_some_and(|inp| !self.unseen(inp.id))
    }

    fn new_root(
        &mut self,
        cur: ValueId,
        meta: &TensorMeta,
        graph_input: Option<usize>,
        members: Vec<usize>,
        grad: bool,
    ) -> usize {
        self.roots.push(Root {
            cur,
            gen: 0,
            offset: meta.offset.clone(),
            contiguous: meta.is_contiguous() || non_overlapping_and_dense(meta, &mut StaticOracle),
            graph_input,
            members,
            mutated: false,
            all_hidden: true,
            grad,
        });
        self.roots.len() - 1
    }

    /// Create the graph inputs: one per traced input, or one synthetic base per group
    /// that needs it (its members become `as_strided` views of it).
    fn inputs(&mut self, groups: &[Group]) -> Result<CallingConvention> {
        let traced = self.traced;
        let mut convention = CallingConvention { args: Vec::with_capacity(traced.inputs.len()), ..Default::default() };
        let mut group_of: HashMap<usize, usize> = HashMap::new();
        for (gi, g) in groups.iter().enumerate() {
            for &m in &g.members {
                group_of.insert(m, gi);
            }
        }
        let mut group_root: HashMap<usize, (usize, usize)> = HashMap::new(); // group -> (root, base index)
        for (i, inp) in traced.inputs.iter().enumerate() {
            let g = group_of.get(&i).and_then(|&gi| groups[gi].base.map(|b| (gi, b)));
            let Some((gi, (offset, len))) = g else {
                let gidx = self.b.graph.inputs.len();
                let v = self.b.add_input(inp.name.clone(), inp.meta.clone())?;
                let grad = self.input_grad(i);
                let r = self.new_root(v, &inp.meta, Some(gidx), vec![i], grad);
                self.vals.insert(
                    inp.id,
                    TVal {
                        root: r,
                        chain: Chain::default(),
                        fv: v,
                        gen: 0,
                        handle: Some(i),
                        detached: false,
                        cut: false,
                        family: None,
                    },
                );
                convention.args.push(ArgSlot::Input(gidx));
                continue;
            };
            let (r, base_idx) = match group_root.get(&gi) {
                Some(&x) => x,
                None => {
                    let gidx = self.b.graph.inputs.len();
                    let members = groups[gi].members.clone();
                    let base = SyntheticBase { input: gidx, members: members.clone(), offset, len };
                    let meta = base.meta(inp.meta.dtype);
                    let v = self.b.add_input(format!("base{}", convention.bases.len()), meta.clone())?;
                    let grad = members.iter().any(|&m| self.input_grad(m));
                    let r = self.new_root(v, &meta, Some(gidx), members, grad);
                    convention.bases.push(base);
                    group_root.insert(gi, (r, convention.bases.len() - 1));
                    (r, convention.bases.len() - 1)
                }
            };
            let rel = inp.meta.offset.sub(&self.roots[r].offset);
            let op = Op::AsStrided { size: inp.meta.shape.to_vec(), stride: inp.meta.strides.to_vec(), offset: rel };
            let cur = self.roots[r].cur;
            let fv = self.b.apply_view(&op, cur, &None)?;
            self.vals.insert(
                inp.id,
                TVal {
                    root: r,
                    chain: Chain::default().push(op),
                    fv,
                    gen: 0,
                    handle: Some(i),
                    detached: false,
                    cut: false,
                    family: None,
                },
            );
            convention.args.push(ArgSlot::ViewOfBase { base: base_idx });
        }
        convention.num_graph_inputs = self.b.graph.inputs.len();
        Ok(convention)
    }

    fn node(&mut self, node: &Node) -> Result<()> {
        let loc = &node.loc;
        match node.op.aliasing() {
            Aliasing::Fresh => {
                let args = node.args.iter().map(|a| self.fresh(*a, loc)).collect::<Result<Vec<_>>>()?;
                let grad_args = node.args.iter().any(|a| self.vals.get(a).is_some_and(|t| self.roots[t.root].grad));
                let v = self.b.emit(node.op.clone(), args, loc)?;
                let grad = !self.unseen(node.out);
                if !grad && grad_args {
                    // Computed under no-grad from values autograd tracks: a constant to it.
                    self.autograd.detached.push(v);
                }
                let r = self.new_root(v, &node.meta, None, vec![], grad);
                self.vals.insert(
                    node.out,
                    TVal {
                        root: r,
                        chain: Chain::default(),
                        fv: v,
                        gen: 0,
                        handle: None,
                        detached: false,
                        cut: false,
                        family: None,
                    },
                );
                Ok(())
            }
            Aliasing::View | Aliasing::MutatesMeta => self.view(node),
            Aliasing::MutatesData => self.write(node),
        }
    }

    /// A view or a metadata mutation: extend the chain (`as_strided` restarts it from
    /// the root, with a root-relative offset).
    fn view(&mut self, node: &Node) -> Result<()> {
        let loc = &node.loc;
        let inner = match &node.op {
            Op::MetaInPlace(inner) => (**inner).clone(),
            op => op.clone(),
        };
        let t0 = self.tval(node.args[0])?;
        let meta_mutation = node.op.aliasing() == Aliasing::MutatesMeta;
        let handle = if meta_mutation { t0.handle } else { None };
        if let Some(i) = handle {
            self.handle_final[i] = node.out;
        }
        // A view autograd does not see through: detached, or taken under no-grad of a
        // storage autograd tracks (a metadata mutation keeps its handle's status).
        let detached = if meta_mutation {
            t0.detached
        } else {
            let tracked = match t0.family {
                Some(k) => self.families[k].grad,
                None => self.roots[t0.root].grad,
            };
            (self.autograd_active && tracked && self.unseen(node.out)) || self.facts.detach_values.contains(&node.out)
        };
        let (chain, fv) = if let Op::AsStrided { size, stride, offset } = &inner {
            let root = &self.roots[t0.root];
            if !root.contiguous {
                return Err(FunctionalizeError::Internal(format!(
                    "{}: as_strided of a storage whose root is not row-major (the plan gives those a synthetic base)",
                    node.op.name()
                )));
            }
            let rel = offset.sub(&root.offset);
            let op = Op::AsStrided { size: size.clone(), stride: stride.clone(), offset: rel };
            // as_strided reads the storage as of now: the root's current value (as the
            // view's family sees it).
            let cur = root.cur;
            let cur = match t0.family {
                Some(k) => self.family_fresh(k, loc)?,
                None => cur,
            };
            let mut fv = self.b.apply_view(&op, cur, loc)?;
            if t0.cut {
                // It restarts from the root, but views what a cut value views: cut too.
                fv = self.b.detached_alias(fv, loc)?;
                self.autograd.detached.push(fv);
            }
            (Chain::default().push(op), fv)
        } else {
            let x = self.fresh(node.args[0], loc)?;
            // A detached alias (`detach`) is itself the fresh `alias` a detached value
            // needs; any other view gets one on top.
            let fv = if detached && matches!(inner, Op::Alias) {
                let d = self.b.detached_alias(x, loc)?;
                self.autograd.detached.push(d);
                d
            } else {
                self.b.apply_view(&inner, x, loc)?
            };
            // A metadata mutation under no-grad of a value autograd tracks (not an
            // argument: the runtime restrides those): autograd's history keeps the old
            // layout, so the new value passes its gradient to the old one element by
            // element, where the shapes agree (they differ: the backward refuses).
            let tracked = match t0.family {
                Some(k) => self.families[k].grad,
                None => self.roots[t0.root].grad,
            };
            if meta_mutation
                && t0.handle.is_none()
                && tracked
                && !t0.cut
                && self.facts.hidden_meta.contains(&node.out)
                && self.b.meta(fv)?.shape == self.b.meta(x)?.shape
            {
                self.autograd.straight_through.push((fv, x));
                self.straight_meta.insert(node.out);
            }
            (t0.chain.push(inner.clone()), fv)
        };
        let fv = if detached && !meta_mutation && !matches!(inner, Op::Alias) {
            let d = self.b.detached_alias(fv, loc)?;
            self.autograd.detached.push(d);
            d
        } else {
            fv
        };
        let gen = self.roots[t0.root].gen;
        // A metadata mutation keeps its handle's history (cut or not); a detached view
        // starts a cut one.
        let mut cut = if meta_mutation { t0.cut } else { t0.cut || detached };
        let mut detached = detached;
        // A `detach` starts a family, seeing the storage as its tensor's family did; in
        // it, `detached` and `cut` describe views taken under no-grad inside the family
        // (the family as a whole passes a gradient once written with one).
        let family = if !meta_mutation && self.facts.detach_values.contains(&node.out) {
            detached = false;
            cut = false;
            let origin = match t0.family {
                Some(k) => self.family_fresh(k, loc)?,
                None => self.roots[t0.root].cur,
            };
            let cur = self.b.distinct_alias(origin, loc)?;
            self.autograd.detached.push(cur);
            self.families.push(Family { root: t0.root, cur, gen, grad: false });
            Some(self.families.len() - 1)
        } else {
            t0.family
        };
        self.vals.insert(node.out, TVal { root: t0.root, chain, fv, gen, handle, detached, cut, family });
        Ok(())
    }

    /// The storage value `into` (the root's shape and layout) with the target `t0`
    /// replaced by `new`: scattered back through the inverse of its chain.
    fn scatter_into(&mut self, node: &Node, t0: &TVal, into: ValueId, new: ValueId) -> Result<ValueId> {
        let loc = &node.loc;
        let chain_ops = t0.chain.ops();
        let y = if chain_ops.iter().any(|op| matches!(op, Op::Expand(_) | Op::AsStrided { .. })) {
            // `expand` has no structured inverse, and either op can repeat elements in
            // the middle of a chain (scattering back through such a view would let a
            // stale copy win). Eager only accepts the write when the target itself
            // repeats no element, so its storage layout names each element once:
            // scatter it into the (row-major) root in one step.
            let root = &self.roots[t0.root];
            if !root.contiguous {
                return Err(FunctionalizeError::Internal(format!(
                    "{}: write through an expanded or as_strided view of a root that is not row-major (the plan \
                     gives those a synthetic base)",
                    node.op.name()
                )));
            }
            let target = self
                .traced
                .meta_of(node.args[0])
                .cloned()
                .ok_or_else(|| FunctionalizeError::Internal(format!("{} has no traced metadata", node.args[0])))?;
            let op = Op::AsStridedScatter {
                size: target.shape.to_vec(),
                stride: target.strides.to_vec(),
                offset: target.offset.sub(&root.offset),
            };
            self.b.emit(op, vec![into, new], loc)?
        } else {
            // Values along the chain, from the storage value.
            let mut xs = vec![into];
            for op in chain_ops.iter().take(chain_ops.len().saturating_sub(1)) {
                let last = xs[xs.len() - 1];
                xs.push(self.b.apply_view(op, last, loc)?);
            }
            let mut y = new;
            for k in (0..chain_ops.len()).rev() {
                y = self.b.scatter_back(chain_ops[k], xs[k], y, loc)?;
            }
            y
        };
        self.b.dense_like(y, into, loc)
    }

    /// A data mutation: compute the new value out of place, scatter it back into the
    /// root through the inverse of the target's chain, make the result the root's value.
    fn write(&mut self, node: &Node) -> Result<()> {
        let loc = &node.loc;
        let Op::InPlace(inner) = &node.op else {
            return Err(FunctionalizeError::Internal(format!("{} mutates data but is not InPlace", node.op.name())));
        };
        let args = node.args.iter().map(|a| self.fresh(*a, loc)).collect::<Result<Vec<_>>>()?;
        let mut new = self.b.emit((**inner).clone(), args, loc)?;
        if self.b.meta(new)?.dtype != node.meta.dtype {
            new = self.b.emit(Op::Cast(node.meta.dtype), vec![new], loc)?;
        }
        let t0 = self.tval(node.args[0])?;
        let root_cur = self.roots[t0.root].cur;
        // Through a `detach`ed alias's family the write changes that family's history
        // (computed here from the family's view of the storage).
        let family_new = match t0.family {
            Some(k) => {
                let fc = self.family_fresh(k, loc)?;
                let mut fy = self.scatter_into(node, &t0, fc, new)?;
                // A mutation autograd does not see, of a family with a history: the
                // family's new value passes its gradient straight to its previous one
                // (and none to the values written), as the storage's does below.
                if self.unseen(node.out) && self.families[k].grad {
                    fy = self.b.distinct_alias(fy, loc)?;
                    self.autograd.straight_through.push((fy, fc));
                }
                Some((k, fy))
            }
            None => None,
        };
        let mut y = self.scatter_into(node, &t0, root_cur, new)?;
        // Through a `detach`ed alias, or a view under no-grad, the mutation is hidden
        // from the storage's other tensors even when the values written require grad
        // (the family then requires grad, as in PyTorch, and keeps their gradient).
        let hidden = self.unseen(node.out) || t0.detached || t0.family.is_some();
        if hidden && (t0.detached || t0.family.is_some()) {
            // The storage's new value must be a value of its own: the family's (or a
            // fresh result of the alias) may carry a gradient the storage's does not.
            y = self.b.distinct_alias(y, loc)?;
        }
        let root = &mut self.roots[t0.root];
        // A mutation autograd does not see, of a storage it tracks: to autograd the
        // storage keeps its identity, so the new value passes its gradient straight
        // to the previous one (and none to the values written). Reads of the target
        // replay from the new root value so that they, too, reach the previous one.
        let straight = hidden && root.grad;
        if straight {
            self.autograd.straight_through.push((y, root_cur));
        }
        root.grad |= !hidden;
        root.cur = y;
        root.gen += 1;
        root.mutated = true;
        root.all_hidden &= hidden;
        let gen = root.gen;
        if let Some((k, fy)) = family_new {
            let seen = !self.unseen(node.out);
            let f = &mut self.families[k];
            f.cur = fy;
            f.gen = gen;
            f.grad |= seen;
        }
        if let Some(i) = t0.handle {
            self.handle_final[i] = node.out;
        }
        // The written tensor keeps its own layout in eager; when the out-of-place
        // value is laid out otherwise, its next read replays its chain from the new
        // root value (which has the root's layout), so the strides match eager's. A
        // family member's value is the one written (it carries the family's history).
        let relaid = self.b.meta(new)?.strides != node.meta.strides;
        let tv_gen = if family_new.is_some() {
            if relaid {
                gen.wrapping_sub(1)
            } else {
                gen
            }
        } else if (straight && !t0.detached) || relaid {
            gen.wrapping_sub(1)
        } else {
            gen
        };
        self.vals.insert(
            node.out,
            TVal {
                root: t0.root,
                chain: t0.chain,
                fv: new,
                gen: tv_gen,
                handle: t0.handle,
                detached: t0.detached,
                cut: t0.cut,
                family: t0.family,
            },
        );
        Ok(())
    }
}

pub(crate) fn run(
    traced: &Graph,
    facts: &TraceFacts<'_>,
    options: &Options,
    oracle: &mut dyn DimOracle,
) -> Result<Functionalized> {
    let groups = plan(traced)?;
    let mut p = Pass {
        b: Builder::new(oracle),
        roots: Vec::new(),
        vals: HashMap::new(),
        families: Vec::new(),
        facts,
        traced,
        handle_final: traced.inputs.iter().map(|i| i.id).collect(),
        autograd: AutogradFacts::default(),
        straight_meta: Default::default(),
        // Autograd is on in this trace when it sees some node, or tracks some input (a
        // trace in grad mode whose only nodes are no-grad views still returns views
        // that pass no gradient).
        autograd_active: traced.nodes.iter().any(|n| !(facts.hidden_mutation)(n.out))
            || traced.inputs.iter().enumerate().any(|(i, inp)| {
                facts.input_requires_grad.get(i).copied().unwrap_or(false) && !(facts.hidden_mutation)(inp.id)
            }),
    };
    let convention = p.inputs(&groups)?;
    // Inputs the function makes require grad part way: constant to autograd until then.
    let mut switches: Vec<(usize, usize, ValueId)> = Vec::new();
    for (i, from) in facts.input_tracked_from.iter().enumerate() {
        let (Some(n), Some(inp)) = (from, traced.inputs.get(i)) else { continue };
        let r = p.tval(inp.id)?.root;
        if switches.iter().any(|s| s.1 == r) {
            continue;
        }
        let orig = p.roots[r].cur;
        let d = p.b.detached_alias(orig, &None)?;
        p.autograd.detached.push(d);
        let root = &mut p.roots[r];
        root.cur = d;
        root.gen += 1;
        root.grad = false;
        switches.push((*n, r, orig));
    }
    let track = |p: &mut Pass<'_, '_>, r: usize, orig: ValueId| -> Result<()> {
        // From here autograd sees the input: its current value passes its gradient to
        // the graph input.
        let x = p.b.distinct_alias(p.roots[r].cur, &None)?;
        p.autograd.straight_through.push((x, orig));
        let root = &mut p.roots[r];
        root.cur = x;
        root.gen += 1;
        root.grad = true;
        Ok(())
    };
    for (k, node) in traced.nodes.iter().enumerate() {
        for &(n, r, orig) in &switches {
            if n == k {
                track(&mut p, r, orig)?;
            }
        }
        p.node(node)?;
    }
    for &(n, r, orig) in &switches {
        if n >= traced.nodes.len() {
            track(&mut p, r, orig)?;
        }
    }
    outputs::finish(p, options, convention)
}

//! Grouping into fused kernels: which nodes share a kernel, and which kernels merge.
//!
//! [`decide_inlining`] is step 3 of the planner: a fusible pointwise node is computed
//! inside its readers' kernel (recomputed by each of a few when it is cheap) or, when
//! it must be stored, by its first reader's kernel alongside that kernel's own value.
//! The passes over the kernel list come after the kernels exist: [`attach_epilogues`]
//! (step 5) moves a matmul's only pointwise reader into the matmul, and [`group_rows`]
//! (step 6) merges reductions over trailing dims and the kernels around them into
//! row groups.

use crate::buffers::recompute_liveness;
use crate::classify::{is_full_contiguous, Classes, Ctx};
use crate::plan::*;
use crate::PlanError;
use aotgrad_ir::{contiguous_strides, Dim, Op, TensorMeta, UnaryOp};
use std::collections::HashMap;

/// Step 3, per node of the graph: the kernels (named by the node that owns each)
/// whose bodies compute an inlined node, the kernel that computes and stores a
/// materialized node besides its own value, and per kernel the nodes it computes
/// besides its own.
pub(crate) struct Inlining {
    /// `homes[j]`: the kernels computing inlined node `j`.
    pub(crate) homes: Vec<Vec<usize>>,
    /// `host[j]`: the kernel computing and storing materialized node `j` with its own.
    pub(crate) host: Vec<Option<usize>>,
    /// Per kernel, the nodes it computes besides its own, in node order.
    pub(crate) members: HashMap<usize, Vec<usize>>,
}

/// Step 3: the inlining decisions, last node first (`alias_copy[j]`: node `j` is a
/// copy that reuses its argument's buffer).
pub(crate) fn decide_inlining(ctx: &Ctx, classes: &Classes, alias_copy: &[bool]) -> Result<Inlining, PlanError> {
    let g = ctx.g;
    let n = g.nodes.len();
    let Classes { live, is_output, users, pw, red } = classes;
    // `homes[j]` lists the kernels (named by the node that owns each) whose bodies
    // compute an inlined node `j`; `host[j]` names the kernel that computes a
    // materialized node `j` together with its own result and stores both.
    let mut homes: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut host: Vec<Option<usize>> = vec![None; n];
    for j in (0..n).rev() {
        let Some(t) = pw[j] else { continue };
        if !live[j] || alias_copy[j] || users[j].is_empty() {
            continue;
        }
        let shape = &g.nodes[j].meta.shape;
        // Every reader computes in the same kernel family: a pointwise node over the
        // same space, or a reduction reading it as its prologue.
        let direct = users[j].iter().all(|&u| {
            let un = &g.nodes[u];
            (pw[u] == Some(t) && &un.meta.shape == shape && !alias_copy[u]) || red[u] == Some(t)
        });
        if !direct {
            continue;
        }
        // The kernels the readers end up in.
        let mut kernels: Vec<usize> = Vec::new();
        for &u in &users[j] {
            let ks = if !homes[u].is_empty() { homes[u].clone() } else { vec![host[u].unwrap_or(u)] };
            for k in ks {
                if !kernels.contains(&k) {
                    kernels.push(k);
                }
            }
        }
        kernels.sort_unstable();
        let recompute = kernels.len() <= MAX_RECOMPUTE && cheap(&g.nodes[j].op) && {
            // Recomputing reads the operands in every kernel: worth it for at most one
            // operand as large as the value (the rest broadcast), as `x * c` or
            // `x - mean`; a residual sum `a + b` is stored once instead.
            let args = ctx.arg_metas(j)?;
            args.iter().filter(|a| a.shape == *shape && a.numel() != Dim::Const(1)).count() <= 1
        };
        if !is_output[j] && (kernels.len() == 1 || recompute) {
            // Computed inside every reader's kernel (recomputed by each when several).
            homes[j] = kernels;
            continue;
        }
        // Materialized: computed in the first reader's kernel when that is a pointwise
        // kernel over the same space (every other reader comes after it), which stores
        // this value as well as its own.
        let first = kernels[0];
        if pw[first] == Some(t) && g.nodes[first].meta.shape == *shape && !alias_copy[first] {
            host[j] = Some(first);
        }
    }
    let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
    for j in 0..n {
        for &k in &homes[j] {
            members.entry(k).or_default().push(j);
        }
        if let Some(k) = host[j] {
            members.entry(k).or_default().push(j);
        }
    }
    Ok(Inlining { homes, host, members })
}

/// Most kernels one cheap pointwise value is recomputed in rather than stored.
const MAX_RECOMPUTE: usize = 4;

/// Whether recomputing `op` in each of a few kernels costs less than storing its
/// value once and loading it in each: a few vector instructions, no transcendental
/// function and no division (those are stored once and loaded).
fn cheap(op: &Op) -> bool {
    use aotgrad_ir::BinaryOp;
    match op {
        Op::Unary(u) => matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::LogicalNot),
        Op::Binary(b) | Op::BinaryScalar(b, _) => {
            matches!(b, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Maximum | BinaryOp::Minimum)
        }
        Op::Compare(_)
        | Op::CompareScalar(..)
        | Op::Where
        | Op::Clamp { .. }
        | Op::Cast(_)
        | Op::Copy
        | Op::Clone
        | Op::FullLike { .. }
        | Op::Full { .. } => true,
        _ => false,
    }
}

/// Step 5: move a matmul's only pointwise reader into the matmul as its epilogue.
pub(crate) fn attach_epilogues(plan: &mut KernelPlan) {
    recompute_liveness(plan);
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); plan.buffers.len()];
    let mut writers: Vec<usize> = vec![0; plan.buffers.len()];
    let mut last_write: Vec<Option<usize>> = vec![None; plan.buffers.len()];
    for (i, k) in plan.kernels.iter().enumerate() {
        for w in k.writes() {
            writers[w] += 1;
            last_write[w] = Some(i);
        }
        for a in k.reads() {
            // Kernels are visited in order, so a repeated read is the list's last entry.
            if readers[a.buf].last() != Some(&i) {
                readers[a.buf].push(i);
            }
        }
    }
    // What the checks below need of a pointwise reader, gathered once per reader: one
    // kernel can be the only reader of many matmuls (the sum of every step's product
    // that forms a weight's gradient), and scanning its loads again for each of them
    // made this step quadratic in the depth of the chain.
    let mut facts: Vec<Option<ReaderFacts>> = (0..plan.kernels.len()).map(|_| None).collect();
    let mut moved: Vec<Option<usize>> = vec![None; plan.kernels.len()];
    for m in 0..plan.kernels.len() {
        let Kernel::Matmul(mk) = &plan.kernels[m] else { continue };
        let b = mk.out.buf;
        let [k] = readers[b][..] else { continue };
        if writers[b] != 1 {
            continue;
        }
        let Kernel::Pointwise(pk) = &plan.kernels[k] else { continue };
        if moved[k].is_some() || !is_full_contiguous(&plan.buffers[b].layout) {
            continue;
        }
        let f: &ReaderFacts = facts[k].get_or_insert_with(|| ReaderFacts::new(pk, &writers, &last_write));
        // The reader must be the only writer of its results (a scatter into a buffer
        // another kernel fills first cannot move ahead of it).
        if !f.sole_writer {
            continue;
        }
        // The reader only copies the product into another layout (a transpose made
        // contiguous): the matmul writes that layout directly — unless the product's
        // own buffer is needed too (an output, or viewed by one: `m[:, 0:1]` returned
        // beside `m.clone()`), which only an intermediate is not.
        let folded = (plan.buffers[b].kind == BufferKind::Intermediate)
            .then(|| fold_layout_copy(pk, &plan.buffers[b].layout))
            .flatten();
        if let Some(out) = folded {
            if let Kernel::Matmul(mk) = &mut plan.kernels[m] {
                mk.out = out;
            }
            moved[k] = Some(usize::MAX);
            continue;
        }
        let want = contiguous_strides(&pk.shape);
        let order_ok = f.loads_of.get(&b).map_or(&[][..], Vec::as_slice).iter().map(|&i| &pk.body.loads[i]).all(|l| {
            l.offset == Dim::Const(0)
                && Dim::product(&pk.shape) == plan.buffers[b].layout.numel()
                && l.shape.iter().zip(l.strides.iter().zip(&want)).all(|(s, (a, w))| *s == Dim::Const(1) || a == w)
        });
        // Every other buffer the reader loads is written before the matmul runs.
        let ready = f.last_write_besides(b).is_none_or(|d| d < m);
        if order_ok && ready {
            moved[k] = Some(m);
        }
    }
    let mut kernels = std::mem::take(&mut plan.kernels);
    for (k, m) in moved.iter().enumerate() {
        if let Some(m) = m.filter(|m| *m != usize::MAX) {
            let Kernel::Pointwise(pk) = kernels[k].clone() else { continue };
            if let Kernel::Matmul(mk) = &mut kernels[m] {
                mk.epilogue = Some(pk);
            }
        }
    }
    plan.kernels = kernels.into_iter().enumerate().filter(|(k, _)| moved[*k].is_none()).map(|(_, k)| k).collect();
}

/// A pointwise kernel's loads and stores as [`attach_epilogues`] checks them against
/// each matmul it reads.
struct ReaderFacts {
    /// It is the only writer of every buffer it stores to.
    sole_writer: bool,
    /// Indices of its loads, by buffer.
    loads_of: HashMap<BufId, Vec<usize>>,
    /// The buffer it loads that is written last, with that kernel's index (`None`
    /// when no kernel writes it).
    latest: (Option<BufId>, Option<usize>),
    /// The last write among the other buffers it loads.
    second: Option<usize>,
}

impl ReaderFacts {
    fn new(pk: &PointwiseKernel, writers: &[usize], last_write: &[Option<usize>]) -> ReaderFacts {
        let mut loads_of: HashMap<BufId, Vec<usize>> = HashMap::new();
        for (i, l) in pk.body.loads.iter().enumerate() {
            loads_of.entry(l.buf).or_default().push(i);
        }
        let (mut latest, mut second) = ((None, None), None);
        for &buf in loads_of.keys() {
            let w = last_write[buf];
            if latest.0.is_none() || w > latest.1 {
                second = second.max(latest.1);
                latest = (Some(buf), w);
            } else {
                second = second.max(w);
            }
        }
        let sole_writer = pk.stores.iter().all(|st| writers[st.dst.buf] == 1);
        ReaderFacts { sole_writer, loads_of, latest, second }
    }

    /// The last write among the buffers it loads other than `b` (`None`: none is
    /// written by a kernel).
    fn last_write_besides(&self, b: BufId) -> Option<usize> {
        if self.latest.0 == Some(b) {
            self.second
        } else {
            self.latest.1
        }
    }
}

/// When `pk` is a plain copy of the buffer laid out as `layout` (one load of it,
/// stored unchanged) reading it as a permutation of its dims, the access a producer
/// of `layout` would use to write the copy's destination directly.
fn fold_layout_copy(pk: &PointwiseKernel, layout: &TensorMeta) -> Option<Access> {
    let [Instr::Load(0)] = pk.body.instrs[..] else { return None };
    let [store] = &pk.stores[..] else { return None };
    let load = pk.body.loads.first()?;
    if store.reg != 0 || store.dst.dtype != load.dtype || load.offset != Dim::Const(0) {
        return None;
    }
    let mut used = vec![false; pk.shape.len()];
    let mut strides = Vec::with_capacity(layout.rank());
    for (size, st) in layout.shape.iter().zip(&layout.strides) {
        if *size == Dim::Const(1) {
            strides.push(Dim::Const(0));
            continue;
        }
        let p = (0..pk.shape.len()).find(|&p| !used[p] && &pk.shape[p] == size && &load.strides[p] == st)?;
        used[p] = true;
        strides.push(store.dst.strides[p].clone());
    }
    if (0..pk.shape.len()).any(|p| !used[p] && pk.shape[p] != Dim::Const(1)) {
        return None;
    }
    Some(Access {
        buf: store.dst.buf,
        shape: layout.shape.clone(),
        strides: strides.into(),
        offset: store.dst.offset.clone(),
        dtype: store.dst.dtype,
    })
}

/// Most element-wise kernels just before a reduction that join its row group.
const MAX_LEADING: usize = 4;
/// Most stages of one row group (a layer norm's forward has six).
const MAX_STAGES: usize = 8;
/// Most element-sized buffers one row group writes: all of them stay live until the
/// group ends, so longer groups would grow the arena (a softmax writes two, a layer
/// norm's forward three).
const MAX_ELEMENT_WRITES: usize = 4;

/// Step 6: a reduction over trailing dims, the reductions over the same dims after it
/// and the pointwise kernels around them, reading each other's results row by row,
/// become one [`RowsKernel`] (a softmax, a layer norm and their backward).
pub(crate) fn group_rows(plan: &mut KernelPlan) {
    // Kernels are moved, never cloned: `pending[i..]` are the ones not placed yet.
    let mut pending: Vec<Option<Kernel>> = std::mem::take(&mut plan.kernels).into_iter().map(Some).collect();
    let len = pending.len();
    let mut out: Vec<Kernel> = Vec::with_capacity(len);
    let mut i = 0;
    while i < len {
        let split = match &pending[i] {
            Some(Kernel::Reduce(r)) => trailing_split(&r.shape, &r.reduced)
                .filter(|&o| o > 0 && o < r.shape.len())
                .map(|o| (r.shape.clone(), o)),
            _ => None,
        };
        let Some((shape, outer)) = split else {
            out.extend(pending[i].take());
            i += 1;
            continue;
        };
        let ahead = || pending[i..].iter().flatten();
        // Element-wise kernels over the same space just before it may lead the group.
        let mut lead = 0;
        while lead < MAX_LEADING
            && lead < out.len()
            && matches!(&out[out.len() - 1 - lead], Kernel::Pointwise(p) if p.shape == shape)
        {
            lead += 1;
        }
        let mut n = accepted(out[out.len() - lead..].iter().chain(ahead()), &shape, outer);
        if n <= lead {
            lead = 0;
            n = accepted(ahead(), &shape, outer);
        } else {
            n -= lead;
        }
        if lead + n < 2 {
            out.extend(pending[i].take());
            i += 1;
            continue;
        }
        let mut stages: Vec<Kernel> = out.drain(out.len() - lead..).collect();
        stages.extend(pending[i..i + n].iter_mut().filter_map(Option::take));
        out.push(Kernel::Rows(RowsKernel { shape, outer, stages }));
        i += n;
    }
    plan.kernels = out;
}

/// Where `shape` splits into kept leading dims and reduced trailing dims for a
/// reduction reducing `reduced` (size-1 dims may sit on either side): the number of
/// leading dims, or `None` when a reduced dim comes before a kept one.
fn trailing_split(shape: &[Dim], reduced: &[bool]) -> Option<usize> {
    let one = |d: usize| shape[d] == Dim::Const(1);
    let outer = (0..shape.len()).rev().find(|&d| !reduced[d] && !one(d)).map_or(0, |d| d + 1);
    let ok = (0..shape.len()).all(|d| one(d) || (d < outer) != reduced[d]);
    ok.then_some(outer)
}

/// An access of a per-row stage (indexed by the rows: `shape[..outer]`, with or
/// without the trailing dims as 1s) indexed by the whole space instead.
fn lift_row_access(a: &Access, shape: &[Dim], outer: usize) -> Access {
    let strides = (0..shape.len()).map(|d| if d < outer { a.strides[d].clone() } else { Dim::Const(0) }).collect();
    Access { buf: a.buf, shape: shape.into(), strides, offset: a.offset.clone(), dtype: a.dtype }
}

/// A stage's reads and writes indexed by the group's space, when `k` can be a stage of
/// a row group over `shape` split at `outer`.
fn stage_accesses(k: &Kernel, shape: &[Dim], outer: usize) -> Option<(Vec<Access>, Vec<Access>)> {
    match k {
        Kernel::Pointwise(p) if *p.shape == *shape => {
            Some((p.body.loads.clone(), p.stores.iter().map(|s| s.dst.clone()).collect()))
        }
        Kernel::Pointwise(p) => {
            let kept = &shape[..outer];
            let per_row = *p.shape == *kept
                || (p.shape.len() == shape.len()
                    && p.shape[..outer] == *kept
                    && p.shape[outer..].iter().all(|d| *d == Dim::Const(1)));
            per_row.then(|| {
                let lift = |a: &Access| lift_row_access(a, shape, outer);
                (p.body.loads.iter().map(lift).collect(), p.stores.iter().map(|s| lift(&s.dst)).collect())
            })
        }
        Kernel::Reduce(r) if *r.shape == *shape && trailing_split(&r.shape, &r.reduced) == Some(outer) => {
            Some((r.body.loads.clone(), vec![r.dst.clone()]))
        }
        _ => None,
    }
}

/// How many kernels of `seq`, from its start, can be stages of one row group over
/// `shape` split at `outer`.
fn accepted<'k>(seq: impl Iterator<Item = &'k Kernel>, shape: &[Dim], outer: usize) -> usize {
    let mut written: HashMap<BufId, Access> = HashMap::new();
    let mut read: std::collections::HashSet<BufId> = std::collections::HashSet::new();
    let mut n = 0;
    let mut element_writes = 0;
    for k in seq {
        if n == MAX_STAGES {
            break;
        }
        let Some((reads, writes)) = stage_accesses(k, shape, outer) else { break };
        // Every buffer a group writes stays live until the group ends: a few per group.
        let elem = matches!(k, Kernel::Pointwise(p) if *p.shape == *shape);
        if elem && element_writes + writes.len() > MAX_ELEMENT_WRITES {
            break;
        }
        // Reads of the group's own results only at the index they were written.
        let reads_ok =
            reads.iter().all(|r| written.get(&r.buf).is_none_or(|w| w.strides == r.strides && w.offset == r.offset));
        // One writer per buffer, and never a buffer this or an earlier stage reads.
        let writes_ok = writes
            .iter()
            .all(|w| !written.contains_key(&w.buf) && !read.contains(&w.buf) && !reads.iter().any(|r| r.buf == w.buf));
        if !reads_ok || !writes_ok {
            break;
        }
        read.extend(reads.iter().map(|r| r.buf));
        if elem {
            element_writes += writes.len();
        }
        for w in writes {
            written.insert(w.buf, w);
        }
        n += 1;
    }
    n
}

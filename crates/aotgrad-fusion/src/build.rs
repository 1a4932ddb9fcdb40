//! The planner: a functional [`Graph`] to a [`KernelPlan`].
//!
//! 1. Dead nodes (not reaching an output) are dropped.
//! 2. Every value gets a *root*: the value whose buffer holds its elements. Views are
//!    index arithmetic over their argument's buffer; a `clone` / `_unsafe_view` of a
//!    freshly computed, contiguous intermediate that nothing else reads reuses its
//!    buffer (the copy would be the identity).
//! 3. Inlining, from the last node back: a fusible pointwise node is computed inside
//!    its consumers' kernel (never materialized) when it is not a graph output and
//!    every consumer is a fusible pointwise node of the same shape and compute type
//!    (or a reduction reading it as its prologue) that ends up in one kernel. A value
//!    used by two kernels, a saved value (a forward output) and every graph output
//!    are materialized.
//! 4. Kernels in node order: each materialized pointwise node with the nodes inlined
//!    into it; reductions with their prologue; matmuls; a concatenation as one copy
//!    kernel per part into its window of the result; the rest as extern ops.
//! 5. A matmul whose result only one pointwise kernel reads (in the matmul's own
//!    element order, with its other inputs ready) takes that kernel as its epilogue.
//! 6. Consecutive reductions over the same trailing dims of one space, with the
//!    pointwise kernels over that space (or over its rows) around them, become one
//!    row group when each reads the others' results only at the index they were
//!    written: a backend runs all of them on a block of rows before the next block.

use crate::plan::*;
use crate::PlanError;
use aotgrad_ir::{
    contiguous_strides, result_type, Aliasing, CmpOp, DType, Dim, Graph, Op, Operand, ReduceOp, Scalar, TensorMeta,
    UnaryOp, ValueId, ValueMap,
};
use std::collections::HashMap;

/// Compute type of a float result dtype.
fn float_kind(d: DType) -> Option<Compute> {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => Some(Compute::F32),
        DType::F64 => Some(Compute::F64),
        _ => None,
    }
}

/// Compute type that represents values of `d` exactly enough for comparisons.
fn value_kind(d: DType) -> Option<Compute> {
    match d {
        DType::Bool => Some(Compute::F32),
        d => float_kind(d),
    }
}

/// The compute type of a pointwise node when it can be fused, else `None`.
pub(crate) fn pointwise_compute(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> Option<Compute> {
    match op {
        Op::Unary(UnaryOp::LogicalNot) => value_kind(args.first()?.dtype),
        Op::Unary(_) | Op::Binary(_) | Op::BinaryScalar(..) | Op::Where | Op::Clamp { .. } => float_kind(out.dtype),
        Op::Compare(_) => {
            value_kind(result_type(&[Operand::of(args.first()?), Operand::of(args.get(1)?)])).filter(|_| {
                // Integer comparisons need exact i64 arithmetic: not fused.
                args.iter().all(|a| value_kind(a.dtype).is_some())
            })
        }
        Op::CompareScalar(_, s) => {
            let a = args.first()?;
            value_kind(a.dtype)?;
            value_kind(result_type(&[Operand::of(a), Operand::Scalar(*s)]))
        }
        Op::Cast(_) | Op::Copy => {
            let src = if matches!(op, Op::Copy) { args.get(1)? } else { args.first()? };
            match out.dtype {
                DType::Bool => value_kind(src.dtype),
                d => float_kind(d),
            }
        }
        Op::Clone => value_kind(out.dtype),
        Op::FullLike { .. } | Op::Full { .. } => value_kind(out.dtype),
        _ => None,
    }
}

/// The prologue compute type of a reduction when it can be planned.
fn reduce_compute(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> Option<Compute> {
    match op {
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Amax | ReduceOp::Amin, .. } => {
            float_kind(out.dtype)?;
            float_kind(args.first()?.dtype)
        }
        _ => None,
    }
}

/// For `select_scatter` / `slice_scatter` with result layout `meta`: the view of the
/// result that the source replaces.
fn scatter_view(op: &Op, meta: &TensorMeta) -> Option<TensorMeta> {
    let view = match op {
        Op::SelectScatter { dim, index } => Op::Select { dim: *dim, index: index.clone() },
        Op::SliceScatter { dim, start, end, step } => {
            Op::Slice { dim: *dim, start: start.clone(), end: end.clone(), step: *step }
        }
        _ => return None,
    };
    aotgrad_ir::infer::infer(&view, &[meta], &mut aotgrad_ir::StaticOracle).ok()
}

/// A kernel copying `src` to `dst` over `shape` (both indexed by it).
fn copy_kernel(compute: Compute, src: Access, dst: Access, shape: &[Dim]) -> Kernel {
    Kernel::Pointwise(PointwiseKernel {
        shape: shape.into(),
        body: Body { compute, loads: vec![src], instrs: vec![Instr::Load(0)] },
        stores: vec![Store { reg: 0, dst }],
        nodes: 1,
    })
}

/// Whether a fused body reads argument `pos` of `op` (not only its shape).
fn reads_arg(op: &Op, pos: usize) -> bool {
    !matches!((op, pos), (Op::Copy, 0) | (Op::FullLike { .. }, _))
}

fn is_matmul(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> bool {
    matches!(op, Op::Mm | Op::Bmm)
        && matches!(out.dtype, DType::F32 | DType::F64)
        && args.len() == 2
        && args.iter().all(|a| a.dtype == out.dtype)
}

/// `meta`'s strides broadcast (numpy rules, right-aligned) to the iteration `shape`.
fn broadcast_access(buf: BufId, meta: &TensorMeta, shape: &[Dim]) -> Result<Access, PlanError> {
    let rank = shape.len();
    if meta.rank() > rank {
        return Err(PlanError::Internal(format!("cannot index a {} by the smaller space {shape:?}", meta)));
    }
    let lead = rank - meta.rank();
    let mut strides = vec![Dim::Const(0); rank];
    for (i, (s, st)) in meta.shape.iter().zip(&meta.strides).enumerate() {
        let target = &shape[lead + i];
        if s == target {
            strides[lead + i] = if *s == Dim::Const(1) { Dim::Const(0) } else { st.clone() };
        } else if *s == Dim::Const(1) {
            strides[lead + i] = Dim::Const(0);
        } else {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            return Err(PlanError::SymbolicBroadcast(format!("{meta} to [{}]", dims.join(", "))));
        }
    }
    Ok(Access { buf, shape: shape.into(), strides: strides.into(), offset: meta.offset.clone(), dtype: meta.dtype })
}

fn access(buf: BufId, meta: &TensorMeta) -> Access {
    Access {
        buf,
        shape: meta.shape.clone(),
        strides: meta.strides.clone(),
        offset: meta.offset.clone(),
        dtype: meta.dtype,
    }
}

/// Element offsets of a dense row-major full view of its buffer.
fn is_full_contiguous(meta: &TensorMeta) -> bool {
    meta.is_contiguous() && meta.offset == Dim::Const(0)
}

#[derive(Clone, Copy)]
enum Def {
    Input(usize),
    Node(usize),
}

struct Ctx<'g> {
    g: &'g Graph,
    def: ValueMap<Def>,
}

impl<'g> Ctx<'g> {
    fn meta(&self, v: ValueId) -> Result<&'g TensorMeta, PlanError> {
        match self.def.get(&v) {
            Some(Def::Input(i)) => Ok(&self.g.inputs[*i].meta),
            Some(Def::Node(j)) => Ok(&self.g.nodes[*j].meta),
            None => Err(PlanError::Internal(format!("{v} is used but never defined"))),
        }
    }
    fn node_of(&self, v: ValueId) -> Option<usize> {
        match self.def.get(&v) {
            Some(Def::Node(j)) => Some(*j),
            _ => None,
        }
    }
    fn arg_metas(&self, j: usize) -> Result<Vec<&'g TensorMeta>, PlanError> {
        self.g.nodes[j].args.iter().map(|a| self.meta(*a)).collect()
    }
}

/// What a backend knows of a graph beyond the graph itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// `(output, input)`: graph output `output` is the new value of graph input
    /// `input` (a mutated input, written back by the caller). Where it is safe, the
    /// plan stores the value into the input's own buffer ([`BufferKind::Updated`])
    /// instead of a fresh output: the input is not a graph output itself, the value
    /// is one pointwise kernel's store in the input's exact layout and no other
    /// output's buffer, and no kernel after that one reads the old value (which it
    /// reads only at the index it writes). The caller must make sure the input
    /// overlaps no other graph input.
    pub input_updates: Vec<(usize, usize)>,
}

/// Plan `g`. Graphs with mutations or composite ops are rejected
/// ([`PlanError::Unsupported`]): the plan is for functional graphs of core ops.
pub fn plan_graph(g: &Graph) -> Result<KernelPlan, PlanError> {
    plan_graph_with(g, &PlanOptions::default())
}

/// [`plan_graph`] with [`PlanOptions`].
pub fn plan_graph_with(g: &Graph, opts: &PlanOptions) -> Result<KernelPlan, PlanError> {
    let mut plan = plan_kernels(g)?;
    if !opts.input_updates.is_empty() {
        update_inputs_in_place(&mut plan, &opts.input_updates);
    }
    Ok(plan)
}

/// Store each mutated input's new value into the input's own buffer where that is
/// safe (see [`PlanOptions::input_updates`]); the fresh output buffers that held
/// them are dropped.
fn update_inputs_in_place(plan: &mut KernelPlan, updates: &[(usize, usize)]) {
    let mut dropped = vec![false; plan.buffers.len()];
    for &(o, i) in updates {
        let (Some(out), Some(input)) = (plan.outputs.get(o), plan.inputs.get(i)) else { continue };
        let b = out.buf;
        let buf = &plan.buffers[b];
        if buf.kind != BufferKind::Output
            || plan.buffers.get(i).map(|x| &x.kind) != Some(&BufferKind::Input(i))
            || buf.layout != *input
            || out.meta != *input
            || plan.outputs.iter().enumerate().any(|(k, x)| (k != o && x.buf == b) || x.buf == i)
        {
            continue;
        }
        let Some(def) = buf.def else { continue };
        if plan.kernels.iter().filter(|k| k.writes().contains(&b)).count() != 1 {
            continue;
        }
        let Some(Kernel::Pointwise(pk)) = plan.kernels.get(def) else { continue };
        let [store] = pk.stores.iter().filter(|s| s.dst.buf == b).collect::<Vec<_>>()[..] else { continue };
        let same_index =
            |a: &Access| a.shape == store.dst.shape && a.strides == store.dst.strides && a.offset == store.dst.offset;
        let safe = plan.kernels.iter().enumerate().all(|(k, kern)| match k.cmp(&def) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => pk.body.loads.iter().filter(|l| l.buf == i).all(same_index),
            std::cmp::Ordering::Greater => kern.reads().iter().all(|a| a.buf != i),
        });
        if !safe {
            continue;
        }
        for k in &mut plan.kernels {
            k.for_each_buf_mut(&mut |x| {
                if *x == b {
                    *x = i;
                }
            });
        }
        plan.outputs[o].buf = i;
        plan.buffers[i].kind = BufferKind::Updated(i);
        dropped[b] = true;
    }
    if !dropped.contains(&true) {
        return;
    }
    // Renumber the buffers that stay.
    let mut new_id = vec![usize::MAX; plan.buffers.len()];
    let mut next = 0;
    for (b, d) in dropped.iter().enumerate() {
        if !d {
            new_id[b] = next;
            next += 1;
        }
    }
    let mut b = 0;
    plan.buffers.retain(|_| {
        b += 1;
        !dropped[b - 1]
    });
    for k in &mut plan.kernels {
        k.for_each_buf_mut(&mut |x| *x = new_id[*x]);
    }
    for o in &mut plan.outputs {
        o.buf = new_id[o.buf];
    }
    recompute_liveness(plan);
}

/// The kernels of `g` (steps 1 to 6).
fn plan_kernels(g: &Graph) -> Result<KernelPlan, PlanError> {
    let n = g.nodes.len();
    let mut ctx = Ctx { g, def: ValueMap::for_graph(g) };
    for (i, inp) in g.inputs.iter().enumerate() {
        ctx.def.insert(inp.id, Def::Input(i));
    }
    for (j, node) in g.nodes.iter().enumerate() {
        if node.op.is_mutation() || matches!(node.op, Op::Composite(_)) {
            return Err(PlanError::Unsupported { op: node.op.name(), value: node.out });
        }
        ctx.def.insert(node.out, Def::Node(j));
    }
    // 1. liveness of nodes.
    let mut live = vec![false; n];
    let mut is_output = vec![false; n];
    for o in &g.outputs {
        ctx.meta(*o)?;
        if let Some(j) = ctx.node_of(*o) {
            live[j] = true;
            is_output[j] = true;
        }
    }
    for j in (0..n).rev() {
        if live[j] {
            for a in &g.nodes[j].args {
                if let Some(k) = ctx.node_of(*a) {
                    live[k] = true;
                }
            }
        }
    }
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for j in (0..n).filter(|&j| live[j]) {
        let mut seen: Vec<usize> = Vec::new();
        for a in &g.nodes[j].args {
            if let Some(k) = ctx.node_of(*a) {
                if !seen.contains(&k) {
                    seen.push(k);
                    users[k].push(j);
                }
            }
        }
    }
    // Classes.
    let mut pw: Vec<Option<Compute>> = vec![None; n];
    let mut red: Vec<Option<Compute>> = vec![None; n];
    for j in (0..n).filter(|&j| live[j]) {
        let node = &g.nodes[j];
        let args = ctx.arg_metas(j)?;
        pw[j] = pointwise_compute(&node.op, &args, &node.meta);
        red[j] = reduce_compute(&node.op, &args, &node.meta);
    }
    // 2. roots: the node (or input) whose buffer holds each value.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Root {
        Input(usize),
        Node(usize),
    }
    let mut root: Vec<Root> = (0..n).map(Root::Node).collect();
    let root_of = |root: &Vec<Root>, ctx: &Ctx, v: ValueId| -> Root {
        match ctx.def.get(&v) {
            Some(Def::Input(i)) => Root::Input(*i),
            Some(Def::Node(j)) => root[*j],
            None => Root::Input(usize::MAX),
        }
    };
    let mut alias_copy = vec![false; n];
    let mut scatter_in_place = vec![false; n];
    for j in (0..n).filter(|&j| live[j]) {
        let node = &g.nodes[j];
        if node.op.aliasing() == Aliasing::View {
            root[j] = root_of(&root, &ctx, node.args[0]);
        } else if matches!(node.op, Op::Clone | Op::UnsafeView(_)) {
            if let Some(k) = ctx.node_of(node.args[0]) {
                let src = &g.nodes[k].meta;
                if root[k] == Root::Node(k)
                    && users[k].len() == 1
                    && !is_output[k]
                    && src.dtype == node.meta.dtype
                    && is_full_contiguous(src)
                    && is_full_contiguous(&node.meta)
                {
                    root[j] = Root::Node(k);
                    alias_copy[j] = true;
                }
            }
        } else if scatter_view(&node.op, &node.meta).is_some() {
            // A scatter whose base nothing else reads writes into the base's buffer
            // (a chain of scatters, as a gradient of `unbind`, into one buffer).
            if let Some(k) = ctx.node_of(node.args[0]) {
                let kargs = ctx.arg_metas(k)?;
                let scatter_base = scatter_view(&g.nodes[k].op, &g.nodes[k].meta).is_some();
                let computed_here = pw[k].is_some()
                    || red[k].is_some()
                    || is_matmul(&g.nodes[k].op, &kargs, &g.nodes[k].meta)
                    || scatter_base;
                let owns = root[k] == Root::Node(k) || (scatter_base && scatter_in_place[k]);
                if owns
                    && computed_here
                    && users[k].len() == 1
                    && !is_output[k]
                    && g.nodes[k].meta == node.meta
                    && is_full_contiguous(&node.meta)
                {
                    root[j] = root[k];
                    scatter_in_place[j] = true;
                }
            }
        }
    }
    // 3. inlining decisions, last node first. `homes[j]` lists the kernels (named by
    // the node that owns each) whose bodies compute an inlined node `j`; `host[j]`
    // names the kernel that computes a materialized node `j` together with its own
    // result and stores both.
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
    // 4. buffers and kernels.
    let mut plan = KernelPlan {
        inputs: g.inputs.iter().map(|i| i.meta.clone()).collect(),
        buffers: vec![],
        kernels: vec![],
        outputs: vec![],
        graph_nodes: n,
    };
    for inp in &g.inputs {
        plan.buffers.push(Buffer {
            kind: BufferKind::Input(plan.buffers.len()),
            layout: inp.meta.clone(),
            def: None,
            last_use: None,
        });
    }
    let mut node_buf: Vec<Option<BufId>> = vec![None; n];
    let buf_of = |node_buf: &Vec<Option<BufId>>, root: &Vec<Root>, ctx: &Ctx, v: ValueId| -> Result<BufId, PlanError> {
        match root_of(root, ctx, v) {
            Root::Input(i) if i < ctx.g.inputs.len() => Ok(i),
            Root::Node(k) => {
                node_buf[k].ok_or_else(|| PlanError::Internal(format!("{v} is read before its buffer exists")))
            }
            Root::Input(_) => Err(PlanError::Internal(format!("{v} is never defined"))),
        }
    };
    for j in (0..n).filter(|&j| live[j]) {
        let node = &g.nodes[j];
        if (root[j] != Root::Node(j) && !scatter_in_place[j]) || !homes[j].is_empty() || host[j].is_some() {
            continue;
        }
        if let (Some(view), Some(t)) = (scatter_view(&node.op, &node.meta), value_kind(node.meta.dtype)) {
            let src_meta = ctx.meta(node.args[1])?;
            if src_meta.dtype == node.meta.dtype && src_meta.shape == view.shape {
                // Into the base's buffer, or a copy of the base first.
                let out = if scatter_in_place[j] {
                    buf_of(&node_buf, &root, &ctx, node.args[0])?
                } else {
                    let kidx = plan.kernels.len();
                    plan.buffers.push(Buffer {
                        kind: BufferKind::Intermediate,
                        layout: node.meta.clone(),
                        def: Some(kidx),
                        last_use: None,
                    });
                    let out = plan.buffers.len() - 1;
                    let base = buf_of(&node_buf, &root, &ctx, node.args[0])?;
                    plan.kernels.push(copy_kernel(
                        t,
                        broadcast_access(base, ctx.meta(node.args[0])?, &node.meta.shape)?,
                        access(out, &node.meta),
                        &node.meta.shape,
                    ));
                    out
                };
                let src = buf_of(&node_buf, &root, &ctx, node.args[1])?;
                let mut dst = access(out, &view);
                dst.dtype = node.meta.dtype;
                plan.kernels.push(copy_kernel(t, access(src, src_meta), dst, &view.shape));
                node_buf[j] = Some(out);
                continue;
            }
        }
        if scatter_in_place[j] {
            return Err(PlanError::Internal(format!(
                "{} ({}) was planned in place but cannot be",
                node.op.name(),
                node.out
            )));
        }
        let kidx = plan.kernels.len();
        let new_buf = |plan: &mut KernelPlan, kind: BufferKind| -> BufId {
            plan.buffers.push(Buffer { kind, layout: node.meta.clone(), def: Some(kidx), last_use: None });
            plan.buffers.len() - 1
        };
        let args = ctx.arg_metas(j)?;
        if let (Op::Cat(dim), Some(t)) = (&node.op, value_kind(node.meta.dtype)) {
            // A concatenation: one copy kernel per part into its window of the result.
            let plain = is_full_contiguous(&node.meta)
                && args.iter().all(|a| a.dtype == node.meta.dtype && a.rank() == node.meta.rank());
            if plain && *dim < node.meta.rank() {
                let out = new_buf(&mut plan, BufferKind::Intermediate);
                let mut start = Dim::Const(0);
                for (a, am) in node.args.iter().zip(&args) {
                    let src = access(buf_of(&node_buf, &root, &ctx, *a)?, am);
                    let dst = Access {
                        buf: out,
                        shape: am.shape.clone(),
                        strides: node.meta.strides.clone(),
                        offset: start.mul(&node.meta.strides[*dim]),
                        dtype: node.meta.dtype,
                    };
                    plan.kernels.push(copy_kernel(t, src, dst, &am.shape));
                    start = start.add(&am.shape[*dim]);
                }
                node_buf[j] = Some(out);
                continue;
            }
        }
        let kernel = if let Some(t) = pw[j] {
            let shape = node.meta.shape.clone();
            let mut order = members.remove(&j).unwrap_or_default();
            order.push(j);
            let mut body = BodyBuilder::new(t);
            {
                let load_buf = |v: ValueId| buf_of(&node_buf, &root, &ctx, v);
                body.emit(&order, &shape, &ctx, &load_buf)?;
            }
            // Materialized values this kernel computes besides its own get their
            // buffers here (before its own: the last buffer pushed is the node's).
            let mut stores = Vec::new();
            for &m in order.iter().filter(|&&m| host[m] == Some(j)) {
                let meta = &g.nodes[m].meta;
                plan.buffers.push(Buffer {
                    kind: BufferKind::Intermediate,
                    layout: meta.clone(),
                    def: Some(kidx),
                    last_use: None,
                });
                let b = plan.buffers.len() - 1;
                node_buf[m] = Some(b);
                stores.push(Store { reg: body.reg_of[&m], dst: broadcast_access(b, meta, &shape)? });
            }
            let out = new_buf(&mut plan, BufferKind::Intermediate);
            let reg = body.reg_of[&j];
            stores.push(Store { reg, dst: broadcast_access(out, &node.meta, &shape)? });
            Kernel::Pointwise(PointwiseKernel { shape, body: body.finish(), stores, nodes: order.len() })
        } else if let (Some(t), Op::Reduce { op, dims, .. }) = (red[j], &node.op) {
            let out = new_buf(&mut plan, BufferKind::Intermediate);
            let x = node.args[0];
            let in_meta = ctx.meta(x)?;
            let shape = in_meta.shape.clone();
            let rank = shape.len();
            let reduced: Vec<bool> = (0..rank).map(|d| dims.is_empty() || dims.contains(&d)).collect();
            let mut b = BodyBuilder::new(t);
            let order = members.remove(&j).unwrap_or_default();
            let count = order.len() + 1;
            if order.is_empty() {
                let buf = buf_of(&node_buf, &root, &ctx, x)?;
                b.load(x, access(buf, in_meta));
            } else {
                let load_buf = |v: ValueId| buf_of(&node_buf, &root, &ctx, v);
                b.emit(&order, &shape, &ctx, &load_buf)?;
                // The reduced value must be the last register.
                let xk = ctx
                    .node_of(x)
                    .ok_or_else(|| PlanError::Internal("inlined reduction input is not a node".into()))?;
                if b.reg_of.get(&xk).copied() != Some(b.instrs.len() - 1) {
                    return Err(PlanError::Internal("reduction prologue does not end in its input".into()));
                }
            }
            // Result indexed by the input space: kept dims map to the output's dims.
            let mut strides = Vec::with_capacity(rank);
            let keepdim = node.meta.rank() == rank;
            let mut od = 0;
            for &red_d in &reduced {
                if red_d {
                    strides.push(Dim::Const(0));
                    if keepdim {
                        od += 1;
                    }
                } else {
                    strides.push(node.meta.strides.get(od).cloned().unwrap_or(Dim::Const(0)));
                    od += 1;
                }
            }
            let dst = Access {
                buf: out,
                shape: shape.clone(),
                strides: strides.into(),
                offset: node.meta.offset.clone(),
                dtype: node.meta.dtype,
            };
            Kernel::Reduce(Box::new(ReduceKernel {
                op: *op,
                shape,
                reduced,
                body: b.finish(),
                dst,
                nodes: count,
                value: node.out,
                loc: node.loc.clone(),
            }))
        } else if is_matmul(&node.op, &args, &node.meta) {
            let out = new_buf(&mut plan, BufferKind::Intermediate);
            let a = access(buf_of(&node_buf, &root, &ctx, node.args[0])?, args[0]);
            let b = access(buf_of(&node_buf, &root, &ctx, node.args[1])?, args[1]);
            Kernel::Matmul(Box::new(MatmulKernel { a, b, out: access(out, &node.meta), epilogue: None }))
        } else {
            let out = new_buf(&mut plan, BufferKind::Extern);
            let mut accs = Vec::with_capacity(node.args.len());
            for a in &node.args {
                accs.push(access(buf_of(&node_buf, &root, &ctx, *a)?, ctx.meta(*a)?));
            }
            Kernel::Extern(Box::new(ExternKernel {
                op: node.op.clone(),
                args: accs,
                out,
                meta: node.meta.clone(),
                value: node.out,
                loc: node.loc.clone(),
            }))
        };
        node_buf[j] = Some(plan.buffers.len() - 1);
        plan.kernels.push(kernel);
    }
    // Outputs.
    for o in &g.outputs {
        let buf = buf_of(&node_buf, &root, &ctx, *o)?;
        if plan.buffers[buf].kind == BufferKind::Intermediate {
            plan.buffers[buf].kind = BufferKind::Output;
        }
        plan.outputs.push(Output { buf, meta: ctx.meta(*o)?.clone() });
    }
    attach_epilogues(&mut plan);
    group_rows(&mut plan);
    recompute_liveness(&mut plan);
    Ok(plan)
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
fn group_rows(plan: &mut KernelPlan) {
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

/// Step 5: move a matmul's only pointwise reader into the matmul as its epilogue.
fn attach_epilogues(plan: &mut KernelPlan) {
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
            if !readers[a.buf].contains(&i) {
                readers[a.buf].push(i);
            }
        }
    }
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
        // The reader must be the only writer of its results (a scatter into a buffer
        // another kernel fills first cannot move ahead of it).
        if pk.stores.iter().any(|st| writers[st.dst.buf] != 1) {
            continue;
        }
        if let Some(out) = fold_layout_copy(pk, &plan.buffers[b].layout) {
            // The reader only copies the product into another layout (a transpose made
            // contiguous): the matmul writes that layout directly.
            if let Kernel::Matmul(mk) = &mut plan.kernels[m] {
                mk.out = out;
            }
            moved[k] = Some(usize::MAX);
            continue;
        }
        let want = contiguous_strides(&pk.shape);
        let order_ok = pk.body.loads.iter().filter(|l| l.buf == b).all(|l| {
            l.offset == Dim::Const(0)
                && Dim::product(&pk.shape) == plan.buffers[b].layout.numel()
                && l.shape.iter().zip(l.strides.iter().zip(&want)).all(|(s, (a, w))| *s == Dim::Const(1) || a == w)
        });
        let ready = pk.body.loads.iter().all(|l| l.buf == b || last_write[l.buf].is_none_or(|d| d < m));
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

/// Set every buffer's `def` and `last_use` from the kernel list.
fn recompute_liveness(plan: &mut KernelPlan) {
    for b in &mut plan.buffers {
        if !matches!(b.kind, BufferKind::Input(_)) {
            b.def = None;
        }
        b.last_use = None;
    }
    for (i, k) in plan.kernels.iter().enumerate() {
        for a in k.reads() {
            plan.buffers[a.buf].last_use = Some(i);
        }
        for w in k.writes() {
            let b = &mut plan.buffers[w];
            // A later write (a scatter into the buffer) keeps it alive too.
            if b.def.is_some() {
                b.last_use = Some(i);
            }
            b.def.get_or_insert(i);
        }
    }
}

/// Builds one [`Body`]: loads are deduplicated per value.
struct BodyBuilder {
    compute: Compute,
    loads: Vec<Access>,
    instrs: Vec<Instr>,
    load_of: HashMap<ValueId, usize>,
    reg_of: HashMap<usize, usize>,
}

impl BodyBuilder {
    fn new(compute: Compute) -> Self {
        BodyBuilder { compute, loads: vec![], instrs: vec![], load_of: HashMap::new(), reg_of: HashMap::new() }
    }
    fn push(&mut self, i: Instr) -> usize {
        self.instrs.push(i);
        self.instrs.len() - 1
    }
    fn load(&mut self, v: ValueId, acc: Access) -> usize {
        if let Some(&r) = self.load_of.get(&v) {
            return r;
        }
        self.loads.push(acc);
        let r = self.push(Instr::Load(self.loads.len() - 1));
        self.load_of.insert(v, r);
        r
    }
    /// Instructions of the nodes `order` (in node order) over the iteration `shape`;
    /// arguments computed by an earlier node of `order` are registers, others loads.
    fn emit(
        &mut self,
        order: &[usize],
        shape: &[Dim],
        ctx: &Ctx,
        load_buf: &dyn Fn(ValueId) -> Result<BufId, PlanError>,
    ) -> Result<(), PlanError> {
        for &m in order {
            let mn = &ctx.g.nodes[m];
            let mut regs = Vec::with_capacity(mn.args.len());
            for (pos, a) in mn.args.iter().enumerate() {
                if !reads_arg(&mn.op, pos) {
                    regs.push(None);
                    continue;
                }
                let r = match ctx.node_of(*a).and_then(|k| self.reg_of.get(&k).copied()) {
                    Some(r) => r,
                    None => self.load(*a, broadcast_access(load_buf(*a)?, ctx.meta(*a)?, shape)?),
                };
                regs.push(Some(r));
            }
            let r = self.op(&mn.op, &regs, &mn.meta)?;
            self.reg_of.insert(m, r);
        }
        Ok(())
    }
    fn scalar(&mut self, s: Scalar) -> usize {
        self.push(Instr::Const(s.to_f64()))
    }
    /// Instructions of one node; returns the register of its value.
    fn op(&mut self, op: &Op, r: &[Option<usize>], out: &TensorMeta) -> Result<usize, PlanError> {
        let arg = |i: usize| {
            r.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| PlanError::Internal(format!("{} is missing argument {i}", op.name())))
        };
        let v = match op {
            Op::Unary(UnaryOp::LogicalNot) => {
                let z = self.push(Instr::Const(0.0));
                self.push(Instr::Compare(CmpOp::Eq, arg(0)?, z))
            }
            Op::Unary(u) => self.push(Instr::Unary(*u, arg(0)?)),
            Op::Binary(b) => self.push(Instr::Binary(*b, arg(0)?, arg(1)?)),
            Op::BinaryScalar(b, s) => {
                let c = self.scalar(*s);
                self.push(Instr::Binary(*b, arg(0)?, c))
            }
            Op::Compare(c) => self.push(Instr::Compare(*c, arg(0)?, arg(1)?)),
            Op::CompareScalar(c, s) => {
                let k = self.scalar(*s);
                self.push(Instr::Compare(*c, arg(0)?, k))
            }
            Op::Where => self.push(Instr::Where(arg(0)?, arg(1)?, arg(2)?)),
            Op::Clamp { min, max } => {
                self.push(Instr::Clamp { x: arg(0)?, min: min.map(Scalar::to_f64), max: max.map(Scalar::to_f64) })
            }
            Op::Cast(_) => arg(0)?,
            Op::Copy => arg(1)?,
            Op::Clone => arg(0)?,
            Op::FullLike { value, .. } | Op::Full { value, .. } => self.scalar(*value),
            other => return Err(PlanError::Internal(format!("{} is not a fusible pointwise op", other.name()))),
        };
        // Values of narrower dtypes are rounded where the graph would have stored them.
        let needs_round = match out.dtype {
            DType::F16 | DType::BF16 => true,
            DType::F32 => self.compute == Compute::F64,
            DType::Bool => !matches!(op, Op::Compare(_) | Op::CompareScalar(..) | Op::Unary(UnaryOp::LogicalNot)),
            _ => false,
        };
        Ok(if needs_round { self.push(Instr::Round(out.dtype, v)) } else { v })
    }
    fn finish(self) -> Body {
        Body { compute: self.compute, loads: self.loads, instrs: self.instrs }
    }
}

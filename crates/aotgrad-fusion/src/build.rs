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
//!
//! This file is the driver (steps 2 and 4, and the entry points); step 1 and the node
//! classes are in `classify`, the kernel bodies in `body`, steps 3, 5 and 6 in
//! `group`, and buffer liveness and step 7 (in-place input updates) in `buffers`.

use crate::body::{access, broadcast_access, copy_kernel, BodyBuilder};
use crate::buffers::{recompute_liveness, update_inputs_in_place};
use crate::classify::{classify, is_full_contiguous, is_matmul, scatter_view, value_kind, Classes, Ctx, Def};
use crate::group::{attach_epilogues, decide_inlining, group_rows, Inlining};
use crate::plan::*;
use crate::PlanError;
use aotgrad_ir::{Aliasing, Dim, Graph, Op, ValueId};

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

/// The kernels of `g` (steps 1 to 6).
fn plan_kernels(g: &Graph) -> Result<KernelPlan, PlanError> {
    let n = g.nodes.len();
    let ctx = Ctx::new(g)?;
    // 1. liveness of nodes, and their classes.
    let classes = classify(&ctx)?;
    let Classes { live, is_output, users, pw, red } = &classes;
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
    // 3. inlining decisions.
    let Inlining { homes, host, mut members } = decide_inlining(&ctx, &classes, &alias_copy)?;
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
            let live: Vec<usize> = stores.iter().map(|s| s.reg).collect();
            let (body, reg) = body.finish_live(&live);
            for s in &mut stores {
                s.reg = reg[s.reg].ok_or_else(|| PlanError::Internal("a stored register was dropped".into()))?;
            }
            Kernel::Pointwise(PointwiseKernel { shape, body, stores, nodes: order.len() })
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
            let value = if order.is_empty() {
                let buf = buf_of(&node_buf, &root, &ctx, x)?;
                b.load(x, access(buf, in_meta))
            } else {
                let load_buf = |v: ValueId| buf_of(&node_buf, &root, &ctx, v);
                b.emit(&order, &shape, &ctx, &load_buf)?;
                let xk = ctx
                    .node_of(x)
                    .ok_or_else(|| PlanError::Internal("inlined reduction input is not a node".into()))?;
                b.reg_of
                    .get(&xk)
                    .copied()
                    .ok_or_else(|| PlanError::Internal("inlined reduction input has no register".into()))?
            };
            // The reduced value is the body's last register: what it does not need is
            // dropped, and everything it needs comes before it.
            let (body, _) = b.finish_live(&[value]);
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
                body,
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

//! The record: [`GradNode`]s attached to eager results, [`Edge`]s to where each
//! input's gradient goes, saved inputs with their versions, and the gradient fields
//! of leaf tensors (`grad`, `retain_grad`).

use crate::dispatch::{version_of, Record, Recorded};
use crate::error::{Error, Result};
use crate::tensor::history::{Edge, GradNode, Saved};
use crate::tensor::{Repr, TState, Tensor};
use aotgrad_cpu::{CpuTensor, Storage};
use aotgrad_ir::{Aliasing, Dim, Graph, Op, Scalar, SourceLoc, StaticOracle, StorageId, TensorMeta, ValueId};
use std::sync::{Arc, Mutex, OnceLock};

/// PyTorch's backward-node name for an op (`mul` -> `MulBackward0`).
pub fn node_name(op: &Op) -> String {
    let base = match op {
        Op::InPlace(inner) | Op::MetaInPlace(inner) => inner.name(),
        other => other.name(),
    };
    let camel: String = base.split('_').filter(|w| !w.is_empty()).map(|w| w[..1].to_uppercase() + &w[1..]).collect();
    format!("{camel}Backward0")
}

/// A node computing `op` over inputs with metadata `ins`, with result `out`: the
/// graph a recorded node stands for.
pub fn single_op_graph(op: Op, ins: &[&TensorMeta], out: &TensorMeta) -> Graph {
    let mut g = Graph::new();
    let args: Vec<ValueId> =
        ins.iter().enumerate().map(|(i, m)| g.add_input(format!("in{i}"), (*m).clone(), StorageId(i as u32))).collect();
    let storage = StorageId(ins.len() as u32);
    let v = g.add_node(op, args, out.clone(), storage, None);
    g.outputs = vec![v];
    g
}

/// Where the gradient of tensor state `s` (the tensor `t`) goes: its node, or itself
/// as a leaf, or nowhere. A view's history follows its base's: when the base was
/// modified in place after the view was taken (its history moved on), the view's is
/// made again as an `as_strided` of the base's new history.
pub(crate) fn edge_of(t: &Tensor, s: &TState) -> Result<Edge> {
    if !s.requires_grad() {
        return Ok(Edge::None);
    }
    crate::dispatch::check_view_not_stale("grad_fn", s, &s.view_loc)?;
    if s.grad_view {
        if let Some(base) = &s.base {
            let b = base.snapshot();
            let moved = match (&b.grad_fn, &s.grad_fn_base) {
                (Some(now), Some(then)) => !Arc::ptr_eq(now, then),
                (Some(_), None) => true,
                _ => false,
            };
            let version = version_of(&s.repr);
            let stale = s.grad_fn.is_some() && version != s.grad_fn_version;
            if moved || stale || (s.grad_fn.is_none() && !s.is_leaf()) {
                let node = view_of_base(base, &b, s)?;
                let mut st = t.lock();
                st.grad_fn = Some(node.clone());
                st.grad_fn_base = b.grad_fn.clone();
                st.grad_fn_version = version;
                return Ok(Edge::Node(node));
            }
        }
    }
    Ok(match &s.grad_fn {
        Some(n) => Edge::Node(n.clone()),
        None if s.is_leaf() => Edge::Leaf(t.clone()),
        None => Edge::Unrecorded,
    })
}

/// A node taking view `v` of `base` (state `b`) as an `as_strided` of the base.
fn view_of_base(base: &Tensor, b: &TState, v: &TState) -> Result<Arc<GradNode>> {
    let (Repr::Eager(bt), Repr::Eager(_)) = (&b.repr, &v.repr) else {
        return Err(Error::Internal("eager autograd over a fake tensor".into()));
    };
    let vm = v.meta().clone();
    let op = Op::AsStrided { size: vm.shape.to_vec(), stride: vm.strides.to_vec(), offset: vm.offset.clone() };
    let graph = single_op_graph(op, &[&bt.meta], &vm);
    let edge = match &b.grad_fn {
        Some(n) => Edge::Node(n.clone()),
        None if b.requires_grad() && b.is_leaf() => Edge::Leaf(base.clone()),
        None if b.requires_grad() => Edge::Unrecorded,
        None => Edge::None,
    };
    let saved = vec![Saved { value: bt.clone(), version: bt.storage.version() }];
    Ok(Arc::new(GradNode {
        name: "AsStridedBackward0".into(),
        graph,
        edges: vec![edge],
        saved: Mutex::new(Some(saved)),
        result: None,
        loc: v.view_loc.clone(),
        retained: Mutex::new(Vec::new()),
        prepared: OnceLock::new(),
    }))
}

/// Ops whose derivative PyTorch computes from their result (so it saves the result).
pub fn saves_result(op: &Op) -> bool {
    use aotgrad_ir::{CompositeOp, UnaryOp};
    match op {
        Op::Unary(u) => {
            matches!(
                u,
                UnaryOp::Exp
                    | UnaryOp::Sqrt
                    | UnaryOp::Rsqrt
                    | UnaryOp::Tanh
                    | UnaryOp::Sigmoid
                    | UnaryOp::Relu
                    | UnaryOp::Reciprocal
            )
        }
        Op::Composite(c) => matches!(c, CompositeOp::Softmax { .. } | CompositeOp::LogSoftmax { .. }),
        _ => false,
    }
}

/// A deep copy of an eager tensor's whole storage, with the same metadata (the value
/// an in-place op is about to overwrite).
fn copy_storage(t: &CpuTensor) -> CpuTensor {
    let buf = t.storage.read().clone();
    CpuTensor { storage: Storage::new(buf), meta: t.meta.clone() }
}

/// What an in-place op must keep before its kernel runs, when autograd records it.
pub(crate) struct Before {
    /// The target's edge before the op (its old history).
    target: Edge,
    /// The base's edge, state and a copy of its storage when the target is a view.
    base: Option<(Tensor, Edge, CpuTensor)>,
    /// A copy of the target's value (not a view).
    old: Option<CpuTensor>,
    /// Each argument's storage version before the op: an operand saved for the
    /// backward is saved at this version, so one that shares the target's storage
    /// (`b.mul_(b)`) is caught as modified, as in PyTorch.
    versions: Vec<u64>,
}

/// The eager value of an argument's state (eager autograd never sees a fake tensor).
fn eager_value(st: &TState) -> Result<CpuTensor> {
    match &st.repr {
        Repr::Eager(c) => Ok(c.clone()),
        Repr::Fake(_) => Err(Error::Internal("eager autograd over a fake tensor".into())),
    }
}

/// **Eager autograd**: gradients of leaves, retained gradients, and the recorded
/// history (`grad_fn`). The backward pass is `aotgrad::Backward::backward` (the facade
/// holds it: it differentiates with the rules compiled functions use).
impl Tensor {
    /// The gradient accumulated into this tensor by backward passes (leaves that
    /// require grad, and tensors that [`retain_grad`](Tensor::retain_grad)).
    pub fn grad(&self) -> Option<Tensor> {
        self.lock().grad.clone()
    }
    /// Replace (or clear, with `None`) this tensor's gradient (PyTorch's
    /// `x.grad = None`, what optimizers' `zero_grad` does).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        self.lock().grad = grad;
    }
    /// Add `g` to this tensor's gradient (a backward pass's accumulation).
    #[track_caller]
    pub fn accumulate_grad(&self, g: &Tensor) -> Result<()> {
        let loc = SourceLoc::caller();
        let current = self.grad();
        let (have, want) = (g.meta(), self.meta());
        if have.shape != want.shape {
            // A leaf whose shape changed under no_grad after its uses were recorded
            // (`x.unsqueeze_(0)`): as in PyTorch the gradient is broadcast to the
            // leaf's shape, or refused when it does not broadcast.
            let widened = crate::grad_mode::no_grad(|| g.expand_dims(&want.shape)).map_err(|_| {
                Error::autograd(
                    "backward",
                    &loc,
                    format!("gradient of shape {have} does not broadcast to its tensor {want}"),
                )
            })?;
            return self.add_to_grad(current, &widened);
        }
        self.add_to_grad(current, g)
    }
    /// Add `g` to the retained gradient of this non-leaf tensor (the backward engine's
    /// path for [`Tensor::retain_grad`]). The gradient is that of the value the tensor
    /// had when it asked to retain it, so its shape is checked against an earlier
    /// retained gradient, not against the tensor's current (possibly `t_`-changed)
    /// shape.
    #[track_caller]
    pub fn accumulate_retained_grad(&self, g: &Tensor) -> Result<()> {
        let loc = SourceLoc::caller();
        let current = self.grad();
        if let Some(c) = &current {
            let (have, want) = (g.meta(), c.meta());
            if have.shape != want.shape {
                return Err(Error::autograd(
                    "backward",
                    &loc,
                    format!("gradient of shape {have} does not match the retained gradient {want}"),
                ));
            }
        }
        self.add_to_grad(current, g)
    }
    fn add_to_grad(&self, current: Option<Tensor>, g: &Tensor) -> Result<()> {
        let new = crate::grad_mode::no_grad(|| match current {
            Some(c) => c.add(g),
            None => g.clone_tensor(),
        })?;
        self.set_grad(Some(new));
        Ok(())
    }
    /// Keep the gradient of this non-leaf tensor in [`Tensor::grad`] after a backward
    /// pass (PyTorch's `retain_grad`); a no-op on leaves, which always keep theirs.
    #[track_caller]
    pub fn retain_grad(&self) -> Result<()> {
        let loc = SourceLoc::caller();
        let s = self.snapshot();
        if !s.requires_grad() {
            return Err(Error::autograd(
                "retain_grad",
                &loc,
                "can't retain_grad on Tensor that has requires_grad=False",
            ));
        }
        if s.is_leaf() {
            return Ok(());
        }
        match edge_of(self, &s)? {
            Edge::Node(n) => {
                n.retain(self);
                self.lock().retains_grad = true;
                Ok(())
            }
            _ => Err(Error::autograd(
                "retain_grad",
                &loc,
                "this tensor has no recorded history (it did not come from eager ops in grad mode)",
            )),
        }
    }
    /// Whether this tensor retains its gradient ([`Tensor::retain_grad`], or a leaf
    /// that requires grad).
    pub fn retains_grad(&self) -> bool {
        let s = self.snapshot();
        s.retains_grad || (s.is_leaf() && s.requires_grad())
    }
    /// The node that computed this tensor while autograd recorded (PyTorch's
    /// `grad_fn`): `None` for leaves and for tensors that do not require grad.
    pub fn grad_fn(&self) -> Result<Option<Arc<GradNode>>> {
        let s = self.snapshot();
        Ok(match edge_of(self, &s)? {
            Edge::Node(n) => Some(n),
            _ => None,
        })
    }
    /// Where this tensor's gradient goes (for a backward pass).
    pub fn grad_edge(&self) -> Result<Edge> {
        let s = self.snapshot();
        edge_of(self, &s)
    }
}

/// Eager autograd's side of the dispatch (see [`Record`]).
pub(crate) struct EagerRecord;

impl Record for EagerRecord {
    type Before = Before;

    /// Before an in-place op on `args[0]` that autograd records: the history it replaces
    /// and a copy of the data it overwrites.
    fn before_inplace(args: &[&Tensor], states: &[TState]) -> Result<Before> {
        let (t, s) = (args[0], &states[0]);
        let target = edge_of(t, s)?;
        let versions =
            states.iter().map(|st| eager_value(st).map(|c| c.storage.version())).collect::<Result<Vec<u64>>>()?;
        match &s.base {
            Some(base) => {
                let bs = base.snapshot();
                let bedge = edge_of(base, &bs)?;
                Ok(Before {
                    target,
                    base: Some((base.clone(), bedge, copy_storage(&eager_value(&bs)?))),
                    old: None,
                    versions,
                })
            }
            None => Ok(Before { target, base: None, old: Some(copy_storage(&eager_value(s)?)), versions }),
        }
    }

    /// Record an op's result: the node of `op` over `args` (states `states`, eager),
    /// whose result has metadata `out`. For an in-place op `before` holds what the op
    /// replaced. Returns the node, and for an in-place op on a view the base and its new
    /// node (the view's own history is derived from it on use).
    fn record(
        op: &Op,
        args: &[&Tensor],
        states: &[TState],
        out: &TensorMeta,
        result: Option<&CpuTensor>,
        before: Option<Before>,
        loc: &SourceLoc,
    ) -> Result<Recorded> {
        let saved_of = |c: CpuTensor| Saved { version: c.storage.version(), value: c };
        let inner = match op {
            Op::InPlace(inner) | Op::MetaInPlace(inner) => (**inner).clone(),
            other => other.clone(),
        };
        let mut edges = Vec::with_capacity(args.len());
        let mut saved = Vec::with_capacity(args.len());
        let mut ins: Vec<TensorMeta> = Vec::with_capacity(args.len());
        let data_inplace = op.aliasing() == Aliasing::MutatesData;
        for (i, (t, s)) in args.iter().zip(states).enumerate() {
            if i == 0 && data_inplace {
                continue;
            }
            let c = eager_value(s)?;
            ins.push(c.meta.clone());
            edges.push(edge_of(t, s)?);
            match before.as_ref().and_then(|b| b.versions.get(i)) {
                Some(&version) => saved.push(Saved { version, value: c }),
                // PyTorch saves the result of these ops, not the input, so changing the
                // input in place later is no error: this node keeps a private copy of the
                // input (its derivative reads it), and checks the result's version.
                None if !data_inplace && saves_result(&inner) => saved.push(saved_of(copy_storage(&c))),
                None => saved.push(saved_of(c)),
            }
        }
        let result = result.filter(|_| saves_result(&inner)).map(|c| saved_of(c.clone()));
        let node = |name: String, graph: Graph, edges: Vec<Edge>, saved: Vec<Saved>| {
            Arc::new(GradNode {
                name,
                graph,
                edges,
                saved: Mutex::new(Some(saved)),
                result: result.clone(),
                loc: loc.clone(),
                retained: Mutex::new(Vec::new()),
                prepared: OnceLock::new(),
            })
        };
        if !data_inplace {
            // Out-of-place ops, views and in-place metadata ops (a view of the old value).
            let refs: Vec<&TensorMeta> = ins.iter().collect();
            let graph = single_op_graph(inner, &refs, out);
            return Ok((node(node_name(op), graph, edges, saved), None));
        }
        let before = before.ok_or_else(|| Error::Internal("an in-place op recorded without its old value".into()))?;
        let others: Vec<TensorMeta> = ins;
        match before.base {
            None => {
                // `t_new = op(t_old, others)`.
                let old = before.old.ok_or_else(|| Error::Internal("in-place op without a copy".into()))?;
                let mut metas = vec![old.meta.clone()];
                metas.extend(others);
                let refs: Vec<&TensorMeta> = metas.iter().collect();
                let graph = single_op_graph(inner, &refs, out);
                let mut all_edges = vec![before.target];
                all_edges.extend(edges);
                let mut all_saved = vec![saved_of(old)];
                all_saved.extend(saved);
                Ok((node(node_name(op), graph, all_edges, all_saved), None))
            }
            Some((base, bedge, bold)) => {
                // PyTorch's `CopySlices`: the base's new value is its old one with the view
                // replaced by `op(view_old, others)`.
                let vm = states[0].meta().clone();
                let size = vm.shape.clone();
                let stride = vm.strides.clone();
                let offset = vm.offset.clone();
                let mut g = Graph::new();
                let b0 = g.add_input("base", bold.meta.clone(), StorageId(0));
                let rest: Vec<ValueId> = others
                    .iter()
                    .enumerate()
                    .map(|(i, m)| g.add_input(format!("in{}", i + 1), m.clone(), StorageId(i as u32 + 1)))
                    .collect();
                let mut next = others.len() as u32 + 1;
                let mut add = |g: &mut Graph, op: Op, args: Vec<ValueId>| -> Result<ValueId> {
                    let metas: Vec<TensorMeta> = args
                        .iter()
                        .map(|a| {
                            g.meta_of(*a)
                                .cloned()
                                .ok_or_else(|| Error::Internal("eager autograd: a value without metadata".into()))
                        })
                        .collect::<Result<_>>()?;
                    let refs: Vec<&TensorMeta> = metas.iter().collect();
                    let m = aotgrad_ir::infer::infer(&op, &refs, &mut StaticOracle)
                        .map_err(|e| Error::Internal(format!("eager autograd: {e}")))?;
                    next += 1;
                    Ok(g.add_node(op, args, m, StorageId(next), None))
                };
                // The view's geometry is in storage coordinates. A base laid out row-major
                // from offset 0 is its storage's frame; any other base (a `detach`ed
                // strided view) is first placed in a flat buffer of its storage's extent
                // (PyTorch's `empty_strided` of the base), so that gradients, which are
                // dense, index it the same way.
                let bm = &bold.meta;
                let framed = !(bm.is_contiguous() && bm.offset == Dim::Const(0));
                let (frame, offset) = if framed {
                    let base_off = bm.offset.clone();
                    let rel = offset.sub(&base_off);
                    let ext = |m: &TensorMeta, off: &Dim| {
                        let m = TensorMeta { offset: off.clone(), ..m.clone() };
                        m.storage_extent()
                    };
                    let len = match (ext(bm, &Dim::Const(0)), ext(&vm, &rel), rel.as_const()) {
                        (Some(a), Some(b), Some(r)) if r >= 0 => a.max(b),
                        _ => {
                            return Err(Error::autograd(
                                node_name(op).as_str(),
                                loc,
                                format!(
                                    "an in-place op on a view ({vm}) reaching outside its base ({bm}) is not supported"
                                ),
                            ))
                        }
                    };
                    let z = add(
                        &mut g,
                        Op::Full {
                            shape: aotgrad_ir::dims![Dim::Const(len as i64)],
                            value: Scalar::Float(0.0),
                            dtype: bm.dtype,
                        },
                        vec![],
                    )?;
                    let put = Op::AsStridedScatter {
                        size: bm.shape.to_vec(),
                        stride: bm.strides.to_vec(),
                        offset: Dim::Const(0),
                    };
                    (add(&mut g, put, vec![z, b0])?, rel)
                } else {
                    (b0, offset)
                };
                let v_old = add(
                    &mut g,
                    Op::AsStrided { size: size.to_vec(), stride: stride.to_vec(), offset: offset.clone() },
                    vec![frame],
                )?;
                let mut op_args = vec![v_old];
                op_args.extend(rest);
                let v_new = add(&mut g, inner, op_args)?;
                let mut b_new = add(
                    &mut g,
                    Op::AsStridedScatter { size: size.to_vec(), stride: stride.to_vec(), offset },
                    vec![frame, v_new],
                )?;
                if framed {
                    let take =
                        Op::AsStrided { size: bm.shape.to_vec(), stride: bm.strides.to_vec(), offset: Dim::Const(0) };
                    b_new = add(&mut g, take, vec![b_new])?;
                }
                g.outputs = vec![b_new];
                let mut all_edges = vec![bedge];
                all_edges.extend(edges);
                let mut all_saved = vec![saved_of(bold)];
                all_saved.extend(saved);
                let n = node("CopySlices".into(), g, all_edges, all_saved);
                Ok((n.clone(), Some((base, n))))
            }
        }
    }
}

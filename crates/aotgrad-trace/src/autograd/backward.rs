//! The backward pass: [`Backward::backward`] and [`backward_from_edges`] walk the
//! recorded nodes from the roots in reverse topological order, differentiate each
//! node's graph with `aotgrad-autodiff` ([`derivative`]) and run it on the reference
//! kernels.

use super::derivative::{derivative, Prepared};
use crate::error::{Error, Result};
use crate::tensor::history::{Edge, GradNode};
use crate::Tensor;
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{BinaryOp, Op, SourceLoc, StaticOracle, TensorMeta};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The backward pass on eager tensors (see the [module docs](crate::autograd)).
pub trait Backward {
    /// PyTorch's `t.backward()`: `t` must hold one element; its gradient is 1.
    fn backward(&self) -> Result<()>;
    /// PyTorch's `t.backward(gradient, retain_graph)`: `grad` (of `t`'s shape; `None`
    /// for 1 when `t` holds one element) flows back into the leaves; with
    /// `retain_graph` the saved values stay for another backward pass.
    fn backward_with(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()>;
}

impl Backward for Tensor {
    #[track_caller]
    fn backward(&self) -> Result<()> {
        backward_at(self, None, false, &SourceLoc::caller())
    }
    #[track_caller]
    fn backward_with(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        backward_at(self, grad, retain_graph, &SourceLoc::caller())
    }
}

fn autograd_err(loc: &SourceLoc, msg: impl Into<String>) -> Error {
    Error::Autograd { op: "backward".into(), loc: loc.clone(), msg: msg.into() }
}

const UNRECORDED: &str = "the gradient reaches a tensor that requires grad but has no recorded history (a \
     compiled function's output: its gradients come from the backward its `forward` returned; eager autograd does \
     not pass through compiled calls)";

fn backward_at(root: &Tensor, grad: Option<&Tensor>, retain_graph: bool, loc: &SourceLoc) -> Result<()> {
    if root.is_fake() {
        return Err(autograd_err(
            loc,
            "backward on a traced (fake) tensor: gradients of a traced function come from its compiled \
             backward (`AotFunction::forward` returns it)",
        ));
    }
    let edge = root.grad_edge()?;
    let meta = root.meta();
    let g0 = match grad {
        Some(g) => {
            let g = g.to_cpu()?;
            if g.meta.shape != meta.shape {
                return Err(autograd_err(
                    loc,
                    format!(
                        "Mismatch in shape: grad_output has a shape of {} and output has a shape of {}",
                        g.meta, meta
                    ),
                ));
            }
            g
        }
        None => {
            if meta.numel().as_const() != Some(1) {
                return Err(autograd_err(loc, "grad can be implicitly created only for scalar outputs"));
            }
            root.ones_like()?.to_cpu()?
        }
    };
    match edge {
        Edge::None => Err(autograd_err(loc, "element 0 of tensors does not require grad and does not have a grad_fn")),
        Edge::Unrecorded => Err(autograd_err(loc, UNRECORDED)),
        edge => run(vec![(edge, g0)], retain_graph),
    }
}

/// PyTorch's `torch.autograd.backward(tensors, grad_tensors)` from recorded edges: one
/// backward pass that sends each gradient into its [`Edge`] (what
/// [`Tensor::grad_edge`](crate::Tensor::grad_edge) returned, possibly before
/// the tensor was modified in place) and on to the leaves, summing where paths meet.
/// Edges to nowhere take nothing; a gradient must have its edge's tensor's shape.
///
/// This is how gradients computed elsewhere (a compiled function's backward, for its
/// arguments) continue through the eager history that made their tensors.
#[track_caller]
pub fn backward_from_edges(roots: &[(Edge, Tensor)], retain_graph: bool) -> Result<()> {
    let mut start = Vec::new();
    for (edge, g) in roots {
        match edge {
            Edge::None => {}
            Edge::Unrecorded => return Err(autograd_err(&SourceLoc::caller(), UNRECORDED)),
            Edge::Node(n) => {
                let g = g.to_cpu()?;
                let graph = n.graph();
                let want = graph.outputs.first().and_then(|&o| graph.meta_of(o));
                if let Some(want) = want.filter(|w| w.shape != g.meta.shape) {
                    return Err(autograd_err(
                        &SourceLoc::caller(),
                        format!(
                            "Mismatch in shape: grad_output has a shape of {} and output has a shape of {want}",
                            g.meta
                        ),
                    ));
                }
                start.push((edge.clone(), g));
            }
            Edge::Leaf(_) => start.push((edge.clone(), g.to_cpu()?)),
        }
    }
    run(start, retain_graph)
}

/// The nodes reachable from `roots`, each before every node it reads (reverse
/// postorder of a depth-first walk, without recursion: histories can be long).
fn topo_order(roots: &[Arc<GradNode>]) -> Vec<Arc<GradNode>> {
    let key = |n: &Arc<GradNode>| Arc::as_ptr(n) as usize;
    let mut seen: HashSet<usize> = HashSet::new();
    let mut post: Vec<Arc<GradNode>> = Vec::new();
    for root in roots {
        if !seen.insert(key(root)) {
            continue;
        }
        let mut stack: Vec<(Arc<GradNode>, usize)> = vec![(root.clone(), 0)];
        while let Some((n, i)) = stack.pop() {
            let next = n.edges()[i..].iter().enumerate().find_map(|(k, e)| match e {
                Edge::Node(m) if !seen.contains(&key(m)) => Some((i + k, m.clone())),
                _ => None,
            });
            match next {
                Some((k, m)) => {
                    stack.push((n, k + 1));
                    seen.insert(key(&m));
                    stack.push((m, 0));
                }
                None => post.push(n),
            }
        }
    }
    post.reverse();
    post
}

/// One backward pass from gradients entering at `start` (leaf or node edges).
fn run(start: Vec<(Edge, CpuTensor)>, retain_graph: bool) -> Result<()> {
    let roots: Vec<Arc<GradNode>> = start
        .iter()
        .filter_map(|(e, _)| match e {
            Edge::Node(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    let order = topo_order(&roots);
    // Refuse before any leaf accumulates: a float input with no recorded history.
    for node in &order {
        let g = node.graph();
        if node.edges().iter().zip(&g.inputs).any(|(e, i)| matches!(e, Edge::Unrecorded) && i.meta.dtype.is_float()) {
            return Err(autograd_err(node.loc(), UNRECORDED));
        }
    }
    let key = |n: &Arc<GradNode>| Arc::as_ptr(n) as usize;
    let mut grads: HashMap<usize, CpuTensor> = HashMap::new();
    for (edge, g) in start {
        match edge {
            Edge::Leaf(t) => t.accumulate_grad(&Tensor::from_cpu(g))?,
            Edge::Node(n) => {
                let sum = match grads.remove(&key(&n)) {
                    Some(prev) => add(&prev, &g, n.loc())?,
                    None => g,
                };
                grads.insert(key(&n), sum);
            }
            Edge::None | Edge::Unrecorded => {}
        }
    }
    for node in &order {
        let Some(g) = grads.remove(&key(node)) else { continue };
        for t in node.retained() {
            t.accumulate_retained_grad(&Tensor::from_cpu(g.clone()))?;
        }
        let input_grads = vjp(node, &g)?;
        for (i, (edge, gi)) in node.edges().iter().zip(input_grads).enumerate() {
            let Some(gi) = gi else { continue };
            match edge {
                Edge::None => {}
                Edge::Unrecorded => return Err(autograd_err(node.loc(), UNRECORDED)),
                Edge::Leaf(t) => t.accumulate_grad(&Tensor::from_cpu(gi))?,
                Edge::Node(m) => {
                    let gi = fit_to_node(node, i, gi, m)?;
                    let k = key(m);
                    let sum = match grads.remove(&k) {
                        Some(prev) => add(&prev, &gi, node.loc())?,
                        None => gi,
                    };
                    grads.insert(k, sum);
                }
            }
        }
    }
    if !retain_graph {
        for node in &order {
            node.free_saved();
        }
    }
    Ok(())
}

/// PyTorch's check of a gradient a node returns (`validate_outputs`): gradient `g`
/// for input `i` of `node` must have the shape of what node `m` made, or one that
/// shape broadcasts to (then summed down to it); any other shape is an invalid
/// gradient (a tensor whose shape a metadata op changed under no-grad).
fn fit_to_node(node: &GradNode, i: usize, g: CpuTensor, m: &GradNode) -> Result<CpuTensor> {
    let graph = m.graph();
    let Some(want) = graph.outputs.first().and_then(|&o| graph.meta_of(o)) else { return Ok(g) };
    if want.shape == g.meta.shape {
        return Ok(g);
    }
    let shape = |d: &[aotgrad_ir::Dim]| format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "));
    match sum_to(&g, want) {
        Some(summed) => summed,
        None => Err(autograd_err(
            node.loc(),
            format!(
                "Function {} returned an invalid gradient at index {i} - got {} but expected shape compatible with {}",
                node.name(),
                shape(&g.meta.shape),
                shape(&want.shape)
            ),
        )),
    }
}

/// `a + b` on the reference kernels.
fn add(a: &CpuTensor, b: &CpuTensor, loc: &SourceLoc) -> Result<CpuTensor> {
    let op = Op::Binary(BinaryOp::Add);
    let out = infer(&op, &[&a.meta, &b.meta], &mut StaticOracle)
        .map_err(|e| autograd_err(loc, format!("summing gradients: {e}")))?;
    aotgrad_cpu::execute(&op, &[a, b], &out).map_err(|e| autograd_err(loc, format!("summing gradients: {e}")))
}

fn prepare(node: &GradNode) -> Result<Prepared> {
    let g = node.graph();
    let requires: Vec<bool> =
        node.edges().iter().zip(&g.inputs).map(|(e, i)| !matches!(e, Edge::None) && i.meta.dtype.is_float()).collect();
    derivative(g, &requires).map_err(|e| autograd_err(node.loc(), format!("{}: no gradient: {e}", node.name())))
}

/// `t` laid out as `want` (same shape and dtype): the graph's inputs are checked
/// against their recorded layouts.
///
/// A gradient of another shape that `want`'s shape broadcasts to (the tensor was
/// `unsqueeze_`d under no_grad after the node made it) is summed down to `want`'s
/// shape first, as PyTorch's engine does; any other shape is an invalid gradient.
fn relayout(t: &CpuTensor, want: &TensorMeta, loc: &SourceLoc) -> Result<CpuTensor> {
    if t.meta == *want {
        return Ok(t.clone());
    }
    let err = |e: String| autograd_err(loc, format!("laying out a gradient: {e}"));
    let summed;
    let t = if t.meta.shape != want.shape {
        summed = sum_to(t, want).ok_or_else(|| {
            autograd_err(loc, format!("invalid gradient: got {} but expected shape compatible with {want}", t.meta))
        })??;
        &summed
    } else {
        t
    };
    let extent = want.storage_extent().ok_or_else(|| err(format!("layout {want} is not concrete")))?;
    let dst = CpuTensor {
        storage: aotgrad_cpu::Storage::new(aotgrad_cpu::Buffer::zeros(want.dtype, extent)),
        meta: want.clone(),
    };
    aotgrad_cpu::execute(&Op::Copy, &[&dst, t], want).map_err(|e| err(e.to_string()))
}

/// `t` summed down to `want`'s shape when that shape broadcasts to `t`'s (`None`
/// when it does not).
fn sum_to(t: &CpuTensor, want: &TensorMeta) -> Option<Result<CpuTensor>> {
    let (have, goal) = (t.meta.concrete_shape()?, want.concrete_shape()?);
    let lead = have.len().checked_sub(goal.len())?;
    if have[lead..].iter().zip(&goal).any(|(h, g)| h != g && *g != 1) {
        return None;
    }
    let run = |x: &CpuTensor, dims: Vec<usize>, keepdim: bool| -> Result<CpuTensor> {
        let op = Op::Reduce { op: aotgrad_ir::ReduceOp::Sum, dims, keepdim };
        let out = infer(&op, &[&x.meta], &mut StaticOracle).map_err(|e| Error::Internal(e.to_string()))?;
        aotgrad_cpu::execute(&op, &[x], &out).map_err(|e| Error::Internal(format!("summing a gradient down: {e}")))
    };
    Some((|| {
        let mut x = t.clone();
        if lead > 0 {
            x = run(&x, (0..lead).collect(), false)?;
        }
        let ones: Vec<usize> = (0..goal.len()).filter(|&d| goal[d] == 1 && have[lead + d] != 1).collect();
        if !ones.is_empty() {
            x = run(&x, ones, true)?;
        }
        Ok(x)
    })())
}

/// The gradients of a node's inputs (one per edge; `None` where none flows), given
/// its output's gradient `g`.
fn vjp(node: &GradNode, g: &CpuTensor) -> Result<Vec<Option<CpuTensor>>> {
    let saved = node.saved()?;
    if node.prepared.get().is_none() {
        let p = prepare(node)?;
        let _ = node.prepared.set(p);
    }
    let prep = node
        .prepared
        .get()
        .ok_or_else(|| Error::Internal("eager autograd: a node's prepared backward is missing".into()))?;
    for (i, s) in saved.iter().enumerate() {
        let now = s.value.storage.version();
        if prep.reads[i] && now != s.version {
            return Err(autograd_err(
                node.loc(),
                format!(
                    "one of the variables needed for gradient computation has been modified by an inplace \
                     operation: [{}], input {i} of {}, is at version {now}; expected version {} instead",
                    s.value.meta,
                    node.name(),
                    s.version
                ),
            ));
        }
    }
    if let Some(r) = node.saved_result() {
        let now = r.value.storage.version();
        if now != r.version {
            return Err(autograd_err(
                node.loc(),
                format!(
                    "one of the variables needed for gradient computation has been modified by an inplace \
                     operation: [{}], which is output 0 of {}, is at version {now}; expected version {} instead",
                    r.value.meta,
                    node.name().strip_suffix("Backward0").unwrap_or(node.name()),
                    r.version
                ),
            ));
        }
    }
    let n_in = saved.len();
    let mut inputs: Vec<CpuTensor> = saved.into_iter().map(|s| s.value).collect();
    let tangent = &prep.graph.inputs[n_in].meta;
    inputs.push(relayout(g, tangent, node.loc())?);
    let outs = aotgrad_cpu::interpret(&prep.graph, &inputs)
        .map_err(|e| autograd_err(node.loc(), format!("{}: {e}", node.name())))?;
    let mut grads: Vec<Option<CpuTensor>> = vec![None; node.edges().len()];
    for (k, i) in prep.grad_inputs.iter().enumerate() {
        grads[*i] = outs.get(k).cloned();
    }
    Ok(grads)
}

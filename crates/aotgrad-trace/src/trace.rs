//! Tracing: run a tensor function once over fake tensors and record every op it
//! applies (views and in-place ops included) into a [`Graph`].
//!
//! The active trace is thread-local: while [`trace`] runs the user's function, ops on
//! its fake inputs record nodes, and creation ops (`zeros`, `randn`, ...) produce fake
//! tensors. The previous active trace is restored when the function returns, also on
//! error or panic.

use crate::decomp::table::DecompTable;
use crate::error::{Error, Result};
use crate::shape_env::ShapeEnv;
use crate::tensor::fake::{ActiveGuard, TraceCtx, TraceState};
use crate::tensor::{Fake, Repr, TState, Tensor};
use aotgrad_cpu::Storage;
use aotgrad_ir::{contiguous_strides, Graph, SourceLoc, StorageId, TensorMeta, ValueId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::tensor::fake::is_tracing;

/// How to trace.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// `(input index, dim)` pairs whose sizes become symbols.
    pub dynamic: Vec<(usize, usize)>,
    /// Duck sizing: dynamic dims with equal example sizes share one symbol.
    pub duck_shape: bool,
    /// What to record for composite ops (default: decompose everything into core ops).
    pub decomps: DecompTable,
    /// Names for the graph inputs (default `arg0`, `arg1`, ...).
    pub input_names: Option<Vec<String>>,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig { dynamic: Vec::new(), duck_shape: true, decomps: DecompTable::default(), input_names: None }
    }
}

/// The result of tracing.
#[derive(Clone, Debug)]
pub struct Traced {
    /// The recorded program: inputs, nodes (as written, with views and mutations), outputs.
    pub graph: Graph,
    /// Symbols of the dynamic dims and the guards tracing relied on.
    pub shape_env: ShapeEnv,
    /// Whether each input required grad.
    pub input_requires_grad: Vec<bool>,
    /// Per traced input: the function made it require grad (`requires_grad_()` on an
    /// argument that did not): it counts in `input_requires_grad`, and after the call
    /// the caller's tensor must require grad too, as in eager.
    pub input_made_requires_grad: Vec<bool>,
    /// Per traced input made to require grad: how many traced nodes came before
    /// (those saw it as a constant, as eager autograd did).
    pub input_tracked_from: Vec<Option<usize>>,
    /// Values of views taken under no-grad of tensors requiring grad (and views of
    /// them): they require grad without a history autograd records.
    pub no_grad_views: Vec<ValueId>,
    /// Values of in-place metadata ops run under no-grad: autograd's history of the
    /// tensor keeps its old shape.
    pub hidden_meta: Vec<ValueId>,
    /// Whether each output required grad.
    pub output_requires_grad: Vec<bool>,
    /// Whether each output is a view taken under no-grad of a tensor autograd tracks
    /// (PyTorch: a leaf that requires grad, refusing in-place ops in grad mode).
    pub output_no_grad_view: Vec<bool>,
    /// How autograd sees each output as a view (its creation rules and whether it is
    /// a leaf), for regenerating it as eager's view.
    pub output_creation: Vec<aotgrad_ir::ViewCreation>,
    /// The values `detach` made (`alias` nodes that are not views for autograd: a
    /// write through one with a value requiring grad leaves its storage's other
    /// tensors alone, as in PyTorch).
    pub detach_values: Vec<ValueId>,
    /// Whether each value (indexed by `ValueId.0`) required grad when it was produced,
    /// i.e. autograd saw it (a data mutation under no-grad does not count, even of a
    /// tensor that keeps requiring grad).
    pub value_requires_grad: Vec<bool>,
    /// The RNG-state inputs, when the function drew from the global generator.
    pub rng: Option<RngInputs>,
}

/// The graph inputs that carry the global generator's state (see [`crate::rng`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngInputs {
    /// Index of the `rng_seed` input (0-d i64) among the graph inputs.
    pub seed_input: usize,
    /// Index of the `rng_base` input (0-d i64): the generator offset at call time.
    pub base_input: usize,
    /// Number of random ops drawing from it; a call advances the generator by
    /// `ops * rng::OP_STRIDE`.
    pub ops: u64,
}

impl TraceCtx {
    fn new(config: &TraceConfig) -> TraceCtx {
        TraceCtx {
            state: Mutex::new(TraceState {
                graph: Graph::new(),
                shape_env: ShapeEnv::new(config.duck_shape),
                decomps: config.decomps.clone(),
                next_value: 0,
                next_storage: 0,
                value_requires_grad: Vec::new(),
                storage_len: HashMap::new(),
                storage_version: HashMap::new(),
                input_handles: Vec::new(),
                detach_values: Vec::new(),
                tracked_from: Vec::new(),
                no_grad_views: Vec::new(),
                hidden_meta: Vec::new(),
                rng: None,
                rng_ops: 0,
            }),
        }
    }
}

impl TraceCtx {
    /// Fake handles for the trace's RNG-state inputs (created at first use) and the
    /// stream offset of the next random op relative to `rng_base`.
    pub(crate) fn next_rng(self: &Arc<Self>) -> (Tensor, Tensor, u64) {
        let meta = TensorMeta::contiguous(Vec::new(), aotgrad_ir::DType::I64);
        let mut st = self.lock();
        let pair = match st.rng {
            Some(p) => p,
            None => {
                let mut make = |name: &str| {
                    let storage = st.fresh_storage();
                    (st.add_input(name.into(), meta.clone(), storage, false), storage)
                };
                let p = [make("rng_seed"), make("rng_base")];
                st.rng = Some(p);
                p
            }
        };
        let rel = st.rng_ops.wrapping_mul(crate::rng::OP_STRIDE);
        st.rng_ops += 1;
        drop(st);
        let handle = |(value, storage): (ValueId, StorageId)| {
            Tensor::from_state(TState::new(
                Repr::Fake(Fake { meta: meta.clone(), storage, value, ctx: self.clone() }),
                false,
                true,
            ))
        };
        (handle(pair[0]), handle(pair[1]), rel)
    }
}

fn fake_input(
    i: usize,
    s: &TState,
    config: &TraceConfig,
    st: &mut TraceState,
    storages: &mut Vec<(Arc<Storage>, StorageId)>,
    loc: &SourceLoc,
) -> Result<(TensorMeta, StorageId, bool, bool)> {
    let cpu = match &s.repr {
        Repr::Eager(t) => t,
        Repr::Fake(_) => return Err(Error::mode("trace", loc, format!("example input {i} is a fake tensor"))),
    };
    let mut meta = cpu.meta.clone();
    let dims: Vec<usize> = config.dynamic.iter().filter(|(k, _)| *k == i).map(|(_, d)| *d).collect();
    if !dims.is_empty() {
        if !meta.is_contiguous() {
            return Err(Error::invalid(
                "trace",
                loc,
                format!("input {i} ({meta}) is not contiguous: only contiguous inputs can have dynamic dims"),
            ));
        }
        let sizes = cpu.meta.concrete_shape().unwrap_or_default();
        for &d in &dims {
            let size = sizes.get(d).copied().ok_or_else(|| {
                Error::invalid("trace", loc, format!("dynamic dim {d} is out of range for input {i} ({meta})"))
            })?;
            meta.shape[d] = st.shape_env.create_symbol(size);
        }
        meta.strides = contiguous_strides(&meta.shape);
    }
    let storage = match storages.iter().find(|(s, _)| Arc::ptr_eq(s, &cpu.storage)) {
        Some((_, id)) => *id,
        None => {
            let id = st.fresh_storage();
            storages.push((cpu.storage.clone(), id));
            if meta.shape.iter().all(|d| d.as_const().is_some()) {
                st.storage_len.insert(id, cpu.storage.len());
            }
            id
        }
    };
    Ok((meta, storage, s.own_requires_grad, s.own_is_leaf))
}

/// What a fake input that is a view keeps of its example's base: a stand-in with the
/// base's autograd flags (a new object, so nothing reaches the caller's tensor), so
/// the in-place checks on views of leaves requiring grad hold while tracing too.
fn autograd_base(base: &Tensor) -> Tensor {
    let b = base.snapshot();
    Tensor::from_state(TState::new(b.repr, b.own_requires_grad, b.own_is_leaf))
}

/// Trace `f` over fake tensors shaped like `example_inputs` (which must be eager).
///
/// Example inputs that share an eager storage become fake inputs sharing one
/// [`StorageId`]. Each returned tensor's current value becomes a graph output.
#[track_caller]
pub fn trace<F>(f: F, example_inputs: &[Tensor], config: &TraceConfig) -> Result<Traced>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let loc = SourceLoc::caller();
    let _span = tracing::debug_span!("trace", inputs = example_inputs.len()).entered();
    if let Some(&(i, _)) = config.dynamic.iter().find(|(i, _)| *i >= example_inputs.len()) {
        return Err(Error::invalid(
            "trace",
            &loc,
            format!("dynamic dim given for input {i}, but there are {} inputs", example_inputs.len()),
        ));
    }
    if let Some(names) = &config.input_names {
        if names.len() != example_inputs.len() {
            return Err(Error::invalid(
                "trace",
                &loc,
                format!("{} input names given for {} inputs", names.len(), example_inputs.len()),
            ));
        }
    }
    let ctx = Arc::new(TraceCtx::new(config));
    let mut fakes = Vec::with_capacity(example_inputs.len());
    let mut input_requires_grad = Vec::with_capacity(example_inputs.len());
    {
        // Snapshot the examples before locking the trace (locks go tensor, then trace).
        let examples: Vec<TState> = example_inputs.iter().map(Tensor::snapshot).collect();
        // What autograd sees of each (a differentiable view's flag includes its base's).
        let effective: Vec<bool> = examples.iter().map(TState::requires_grad).collect();
        let mut st = ctx.lock();
        let mut storages = Vec::new();
        for (i, x) in examples.iter().enumerate() {
            let (meta, storage, own_requires_grad, own_is_leaf) =
                fake_input(i, x, config, &mut st, &mut storages, &loc)?;
            let name = config.input_names.as_ref().map_or_else(|| format!("arg{i}"), |n| n[i].clone());
            let requires_grad = effective[i];
            let value = st.add_input(name, meta.clone(), storage, requires_grad);
            input_requires_grad.push(requires_grad);
            fakes.push(Tensor::from_state(TState {
                repr: Repr::Fake(Fake { meta, storage, value, ctx: ctx.clone() }),
                own_requires_grad,
                own_is_leaf,
                base: x.base.as_ref().map(autograd_base),
                grad_view: x.grad_view,
                no_grad_view: x.no_grad_view,
                created_no_grad: x.created_no_grad,
                multi_output_view: x.multi_output_view.clone(),
                view_node: x.view_node.clone(),
                grad_fn: None,
                grad_fn_base: None,
                grad_fn_version: 0,
                view_loc: loc.clone(),
                grad: None,
                retains_grad: false,
            }));
        }
    }
    ctx.lock().input_handles = fakes.iter().map(Tensor::address).collect();
    let outs = {
        let _active = ActiveGuard::enter(ctx.clone());
        f(&fakes)?
    };
    // `requires_grad_()` on an argument inside the function: from then on autograd
    // tracks it (what ran before stays constant to it, as in eager).
    let mut input_made_requires_grad = vec![false; fakes.len()];
    let tracked: Vec<ValueId> = ctx.lock().tracked_from.iter().map(|(v, _)| *v).collect();
    for (i, x) in fakes.iter().enumerate() {
        let now = x.snapshot().requires_grad();
        let id = match &x.snapshot().repr {
            Repr::Fake(f) => ctx.lock().graph.inputs.get(i).map(|inp| inp.id).unwrap_or(f.value),
            Repr::Eager(_) => continue,
        };
        if now && !input_requires_grad[i] && tracked.contains(&id) {
            input_made_requires_grad[i] = true;
            input_requires_grad[i] = true;
        } else if !now && input_requires_grad[i] {
            return Err(Error::invalid(
                "requires_grad_",
                &loc,
                format!(
                    "argument {i} requires grad and the function turned that off (requires_grad_(false) or \
                     detach_()); a compiled function cannot stop tracking an argument part way: do it before \
                     the call, or use detach() inside"
                ),
            ));
        }
    }
    let mut outputs = Vec::with_capacity(outs.len());
    let mut output_requires_grad = Vec::with_capacity(outs.len());
    let mut output_no_grad_view = Vec::with_capacity(outs.len());
    let mut output_creation = Vec::with_capacity(outs.len());
    let mut output_bases: Vec<Tensor> = Vec::new();
    for (k, t) in outs.iter().enumerate() {
        let s = t.snapshot();
        match &s.repr {
            Repr::Fake(x) if Arc::ptr_eq(&x.ctx, &ctx) => outputs.push(x.value),
            _ => {
                return Err(Error::mode(
                    "trace",
                    &loc,
                    format!("output {k} was not computed from the traced inputs (an eager or foreign tensor)"),
                ))
            }
        }
        output_requires_grad.push(s.requires_grad());
        output_no_grad_view.push(s.no_grad_view);
        output_creation.push(aotgrad_ir::ViewCreation {
            created_no_grad: s.created_no_grad,
            multi_output: s.multi_output_view.clone(),
            node: s.view_node.clone(),
            leaf: s.is_leaf(),
            stale: crate::dispatch::is_stale_view(&s),
            view: s.base.is_some(),
            base_group: s.base.as_ref().map(|b| match output_bases.iter().position(|o| o.same_object(b)) {
                Some(i) => i,
                None => {
                    output_bases.push(b.clone());
                    output_bases.len() - 1
                }
            }),
            base_leaf: s.base.as_ref().is_some_and(|b| {
                let b = b.snapshot();
                b.requires_grad() && b.is_leaf()
            }),
            base_output: s.base.as_ref().and_then(|b| outs.iter().position(|o| o.same_object(b))),
            grad_view: s.grad_view,
            detached: s.base.as_ref().is_some_and(|b| {
                !matches!(b.snapshot().repr, Repr::Eager(_)) && !fakes.iter().any(|f| f.same_object(b))
            }),
        });
    }
    let mut st = ctx.lock();
    st.graph.outputs = outputs;
    let graph = std::mem::take(&mut st.graph);
    let shape_env = std::mem::take(&mut st.shape_env);
    let value_requires_grad = std::mem::take(&mut st.value_requires_grad);
    let detach_values = std::mem::take(&mut st.detach_values);
    let no_grad_views = std::mem::take(&mut st.no_grad_views);
    let hidden_meta = std::mem::take(&mut st.hidden_meta);
    let input_tracked_from: Vec<Option<usize>> = (0..graph.inputs.len())
        .map(|i| {
            let id = graph.inputs[i].id;
            let made = input_made_requires_grad.get(i).copied().unwrap_or(false);
            made.then(|| st.tracked_from.iter().find(|(v, _)| *v == id).map_or(0, |(_, n)| *n))
        })
        .collect();
    let index_of = |v: ValueId| graph.inputs.iter().position(|i| i.id == v).unwrap_or(usize::MAX);
    let rng =
        st.rng.map(|[(s, _), (b, _)]| RngInputs { seed_input: index_of(s), base_input: index_of(b), ops: st.rng_ops });
    if rng.is_some() {
        input_requires_grad.extend([false, false]);
        input_made_requires_grad.extend([false, false]);
    }
    tracing::debug!(nodes = graph.nodes.len(), guards = shape_env.guards().len(), "traced");
    Ok(Traced {
        graph,
        shape_env,
        input_requires_grad,
        input_made_requires_grad,
        input_tracked_from,
        no_grad_views,
        hidden_meta,
        output_requires_grad,
        output_no_grad_view,
        output_creation,
        detach_values,
        value_requires_grad,
        rng,
    })
}

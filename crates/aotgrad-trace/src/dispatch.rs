//! The one dispatch function every tensor op goes through: pick the mode (eager or
//! fake) from the arguments and the active trace, infer the result metadata with the
//! shared inference (`StaticOracle` eagerly, the trace's `ShapeEnv` when fake), check
//! the autograd rules, then run the CPU kernel or record a graph node.
//!
//! The dispatch sits above the tensor's state and below the modes: it builds fake
//! results in the trace's state (`tensor::fake`) directly, and lets eager autograd
//! record through the [`Record`] trait, which the autograd record implements one
//! floor up (`crate::ops::dispatch` composes the two for every op).

use crate::error::{Error, Result};
use crate::grad_mode::is_grad_enabled;
use crate::tensor::fake::{active_trace, TraceCtx};
use crate::tensor::history::GradNode;
use crate::tensor::{Fake, Repr, TState, Tensor};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{Aliasing, DimOracle, Op, SourceLoc, StaticOracle, TensorMeta};
use std::sync::Arc;

/// Where an op runs.
pub(crate) enum Mode {
    /// Real kernels.
    Eager,
    /// Recorded into the given trace.
    Fake(Arc<TraceCtx>),
}

const EAGER_WHILE_TRACING: &str = "eager tensor used while tracing: pass it as an input";

/// The mode of an op over tensors in these states, given the active trace.
pub(crate) fn mode_of(op: &str, args: &[&TState], loc: &SourceLoc) -> Result<Mode> {
    let active = active_trace();
    let mut any_eager = false;
    for a in args {
        match &a.repr {
            Repr::Eager(_) => any_eager = true,
            Repr::Fake(f) => match &active {
                Some(ctx) if Arc::ptr_eq(ctx, &f.ctx) => {}
                _ => {
                    return Err(Error::mode(
                        op,
                        loc,
                        "fake tensor used outside of the trace that created it (fake tensors only exist while \
                         their function is traced)",
                    ))
                }
            },
        }
    }
    match active {
        Some(_) if any_eager => Err(Error::mode(op, loc, EAGER_WHILE_TRACING)),
        Some(ctx) => Ok(Mode::Fake(ctx)),
        None => Ok(Mode::Eager),
    }
}

impl Tensor {
    /// The mode ops on this tensor run in (an error if it cannot be used here).
    pub(crate) fn mode(&self, op: &str, loc: &SourceLoc) -> Result<Mode> {
        mode_of(op, &[&self.snapshot()], loc)
    }
    /// Run `f` with the oracle of this tensor's mode (shape questions about symbolic
    /// dims record guards in the trace's `ShapeEnv`).
    pub(crate) fn with_oracle<R>(
        &self,
        op: &str,
        loc: &SourceLoc,
        f: impl FnOnce(&mut dyn DimOracle) -> std::result::Result<R, aotgrad_ir::ShapeError>,
    ) -> Result<R> {
        let r = match self.mode(op, loc)? {
            Mode::Eager => f(&mut StaticOracle),
            Mode::Fake(ctx) => f(&mut ctx.lock().shape_env),
        };
        r.map_err(|e| Error::shape(op, loc, e))
    }
}

/// Ops whose result never requires grad (creation and randomness: no derivative flows).
fn differentiable(op: &Op) -> bool {
    match op {
        Op::Full { .. } | Op::FullLike { .. } | Op::Arange { .. } | Op::Rand { .. } | Op::Randn { .. } => false,
        Op::Bernoulli { .. } => false,
        Op::InPlace(inner) | Op::MetaInPlace(inner) => differentiable(inner),
        _ => true,
    }
}

/// An op's name as PyTorch names its backward node, less `Backward0` (`as_strided` ->
/// `AsStrided`, `t` -> `T`).
fn backward_name(op: &str) -> String {
    op.split('_').filter(|w| !w.is_empty()).map(|w| w[..1].to_uppercase() + &w[1..]).collect()
}

/// PyTorch's check before an in-place op while grad mode is on (the view rule first,
/// as in PyTorch's `check_inplace`).
fn check_inplace(op: &str, s0: &TState, any_requires_grad: bool, loc: &SourceLoc) -> Result<()> {
    if let Some((backward, i)) = s0.multi_output_view.as_ref().filter(|_| any_requires_grad) {
        // PyTorch names the view's `grad_fn`; without one (its base does not require
        // grad) it words the error as for a no-grad view.
        let what = if s0.requires_grad() {
            format!("Output {i} of {backward} is a view and is being modified inplace.")
        } else {
            "A view was created in no_grad mode and is being modified inplace with grad mode enabled.".to_string()
        };
        return Err(Error::autograd(
            op,
            loc,
            format!(
                "{what} This view is the output of a function that returns multiple views. Such functions do not \
                 allow the output views to be modified inplace. You should replace the inplace operation by an \
                 out-of-place one."
            ),
        ));
    }
    if s0.no_grad_view || (s0.created_no_grad && any_requires_grad) {
        return Err(Error::autograd(
            op,
            loc,
            "A view was created in no_grad mode and is being modified inplace with grad mode enabled. Given that \
             this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by moving both \
             the view and the inplace either both inside the no_grad block (if you don't want the inplace to be \
             tracked) or both outside (if you want the inplace to be tracked).",
        ));
    }
    if let Some(base) = &s0.base {
        let b = base.snapshot();
        if s0.requires_grad() && b.is_leaf() && b.requires_grad() {
            return Err(Error::autograd(
                op,
                loc,
                "a view of a leaf Variable that requires grad is being used in an in-place operation.",
            ));
        }
    }
    if s0.is_leaf() && s0.requires_grad() {
        return Err(Error::autograd(
            op,
            loc,
            "a leaf Variable that requires grad is being used in an in-place operation.",
        ));
    }
    Ok(())
}

/// The storage range `[offset, offset + numel)` of a concrete layout that is
/// non-overlapping and dense (its strides are a permutation of row-major ones), the
/// only layouts whose overlap PyTorch decides exactly.
fn dense_range(m: &TensorMeta) -> Option<(usize, usize)> {
    let shape = m.concrete_shape()?;
    let strides = m.concrete_strides()?;
    let offset = m.concrete_offset()?;
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return None;
    }
    let mut dims: Vec<(usize, usize)> =
        shape.iter().zip(&strides).filter(|(s, _)| **s > 1).map(|(a, b)| (*b, *a)).collect();
    dims.sort_unstable();
    let mut expected = 1usize;
    for (stride, size) in dims {
        if stride != expected {
            return None;
        }
        expected = expected.checked_mul(size)?;
    }
    Some((offset, offset.checked_add(numel)?))
}

/// PyTorch's `assert_no_partial_overlap` for in-place ops: the written tensor may be
/// read whole with its own strides (`x.add_(x)`), but not another window of the same
/// memory (`x.add_(x[1])`, `x.add_(x.t())`).
fn check_no_partial_overlap(op: &str, args: &[&Tensor], loc: &SourceLoc) -> Result<()> {
    let Some((target, rest)) = args.split_first() else { return Ok(()) };
    let tm = target.meta();
    let Some(a) = dense_range(&tm) else { return Ok(()) };
    for other in rest {
        if !target.shares_storage_with(other) {
            continue;
        }
        let om = other.meta();
        let Some(b) = dense_range(&om) else { continue };
        let full = a == b && tm.strides == om.strides;
        if !full && a.0 < b.1 && b.0 < a.1 {
            return Err(Error::invalid(
                op,
                loc,
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a \
                 single memory location. Please clone() the tensor before performing the operation.",
            ));
        }
    }
    Ok(())
}

/// A recorded op's node, and for an in-place op on a view, the base and its new node.
pub(crate) type Recorded = (Arc<GradNode>, Option<(Tensor, Arc<GradNode>)>);

/// What eager autograd does around an op the dispatch runs, implemented above the
/// dispatch by the autograd record (`crate::autograd::EagerRecord`).
pub(crate) trait Record {
    /// What an in-place op must keep before its kernel runs.
    type Before;
    /// Before an in-place op on `args[0]` (states `states`) that autograd records.
    fn before_inplace(args: &[&Tensor], states: &[TState]) -> Result<Self::Before>;
    /// Record an eager op's result: the node of `op` over `args`, whose result has
    /// metadata `out` (`result`: the fresh result's data, for ops that save it).
    fn record(
        op: &Op,
        args: &[&Tensor],
        states: &[TState],
        out: &TensorMeta,
        result: Option<&CpuTensor>,
        before: Option<Self::Before>,
        loc: &SourceLoc,
    ) -> Result<Recorded>;
}

/// Apply `op` to `args` in the mode they (and the active trace) select, eager autograd
/// recording through `R`.
pub(crate) fn dispatch_with<R: Record>(op: Op, args: &[&Tensor], loc: &SourceLoc) -> Result<Tensor> {
    let name = op.name();
    let states: Vec<TState> = args.iter().map(|t| t.snapshot()).collect();
    let refs: Vec<&TState> = states.iter().collect();
    let mode = mode_of(&name, &refs, loc)?;
    let aliasing = op.aliasing();
    let grad = is_grad_enabled();
    let first = || states.first().ok_or_else(|| Error::Internal(format!("{name}: op without a self argument")));
    if aliasing == Aliasing::MutatesData {
        check_no_partial_overlap(&name, args, loc)?;
    }
    if matches!(aliasing, Aliasing::MutatesData | Aliasing::MutatesMeta) && grad {
        check_inplace(&name, first()?, states.iter().any(TState::requires_grad), loc)?;
    }
    // Does the result take part in autograd? (dtype checked once the meta is known)
    let grad_inputs = grad && differentiable(&op) && states.iter().any(TState::requires_grad);
    if grad_inputs {
        for s in &states {
            check_view_not_stale(&name, s, loc)?;
        }
    }
    // Eager autograd records an op whose inputs require grad; an in-place op also when
    // only its target does (its history moves on even through a constant fill).
    let record_eager = matches!(mode, Mode::Eager)
        && grad
        && states.iter().any(TState::requires_grad)
        && (differentiable(&op) || aliasing == Aliasing::MutatesData);
    let before = match (record_eager, aliasing) {
        (true, Aliasing::MutatesData) => Some(R::before_inplace(args, &states)?),
        _ => None,
    };
    let metas: Vec<&TensorMeta> = states.iter().map(TState::meta).collect();
    let recorded_op = record_eager.then(|| op.clone());
    let (repr, out_float) = match mode {
        Mode::Eager => {
            let out = infer(&op, &metas, &mut StaticOracle).map_err(|e| Error::shape(&name, loc, e))?;
            let cpu: Vec<&CpuTensor> = states
                .iter()
                .map(|s| match &s.repr {
                    Repr::Eager(t) => Ok(t),
                    Repr::Fake(_) => Err(Error::Internal(format!("{name}: fake tensor in eager mode"))),
                })
                .collect::<Result<_>>()?;
            let res = aotgrad_cpu::execute(&op, &cpu, &out).map_err(|e| Error::kernel(&name, loc, e))?;
            let float = out.dtype.is_float();
            (Repr::Eager(res), float)
        }
        Mode::Fake(ctx) => {
            let mut st = ctx.lock();
            let out = infer(&op, &metas, &mut st.shape_env).map_err(|e| Error::shape(&name, loc, e))?;
            let mut values = Vec::with_capacity(states.len());
            for s in &states {
                match &s.repr {
                    Repr::Fake(f) => values.push(f.value),
                    Repr::Eager(_) => return Err(Error::Internal(format!("{name}: eager tensor in fake mode"))),
                }
            }
            let storage = match aliasing {
                Aliasing::Fresh => {
                    let s = st.fresh_storage();
                    if let Some(n) = out.storage_extent() {
                        st.storage_len.insert(s, n);
                    }
                    s
                }
                _ => match &first()?.repr {
                    Repr::Fake(f) => f.storage,
                    Repr::Eager(_) => return Err(Error::Internal(format!("{name}: eager self in fake mode"))),
                },
            };
            // A view must fit its storage, as the eager kernel checks (where both are
            // concrete).
            if matches!(aliasing, Aliasing::View | Aliasing::MutatesMeta) {
                if let (Some(&len), true) = (st.storage_len.get(&storage), out.storage_extent().is_some()) {
                    aotgrad_cpu::check_view_fits(&op.name(), &out, len).map_err(|e| Error::kernel(&name, loc, e))?;
                }
            }
            let float = out.dtype.is_float();
            if matches!(aliasing, Aliasing::MutatesData | Aliasing::MutatesMeta) {
                *st.storage_version.entry(storage).or_insert(0) += 1;
            }
            // Whether autograd sees the value (`Traced::value_requires_grad`): a data
            // mutation under no-grad is hidden from it even when the tensor keeps
            // requiring grad.
            let rg = match aliasing {
                Aliasing::MutatesData => grad && (first()?.requires_grad() || (grad_inputs && float)),
                Aliasing::MutatesMeta => first()?.requires_grad() || (grad_inputs && float),
                _ => grad_inputs && float,
            };
            let value = st.add_node(op, values, out.clone(), storage, loc.clone(), rg);
            if aliasing == Aliasing::MutatesMeta && !grad {
                st.hidden_meta.push(value);
            }
            drop(st);
            (Repr::Fake(Fake { meta: out, storage, value, ctx }), float)
        }
    };
    let rg = grad_inputs && out_float;
    // The eager node of this op (and, for an in-place op on a view, its base's).
    let (node, base_node) = match recorded_op.filter(|_| out_float) {
        Some(op) => {
            let out_meta = match &repr {
                Repr::Eager(t) => t.meta.clone(),
                Repr::Fake(f) => f.meta.clone(),
            };
            let result = match (&repr, aliasing) {
                (Repr::Eager(c), Aliasing::Fresh) => Some(c),
                _ => None,
            };
            let (n, b) = R::record(&op, args, &states, &out_meta, result, before, loc)?;
            (Some(n), b)
        }
        None => (None, None),
    };
    match aliasing {
        Aliasing::Fresh => {
            let mut st = TState::new(repr, rg, !rg);
            st.grad_fn = node.filter(|_| rg);
            Ok(Tensor::from_state(st))
        }
        Aliasing::View => {
            let s0 = first()?;
            let base = s0.base.clone().or_else(|| args.first().map(|t| (*t).clone()));
            // Under no-grad, a view of a tensor requiring grad still requires grad (a
            // view of such a view in grad mode inherits it), as in PyTorch.
            let no_grad_view = s0.no_grad_view || (!grad && s0.requires_grad());
            let grad_fn_base = base.as_ref().and_then(|b| b.snapshot().grad_fn);
            let grad_fn_version = version_of(&repr);
            if let (true, Repr::Fake(f)) = (no_grad_view, &repr) {
                f.ctx.lock().no_grad_views.push(f.value);
            }
            Ok(Tensor::from_state(TState {
                repr,
                own_requires_grad: rg,
                own_is_leaf: !rg,
                base,
                grad_view: grad && !no_grad_view,
                no_grad_view,
                created_no_grad: !grad || s0.created_no_grad,
                // A view of a multi-output view is output 0 of its own op.
                multi_output_view: s0.multi_output_view.as_ref().map(|_| (backward_name(&name), 0)),
                view_node: backward_name(&name),
                grad_fn: node.filter(|_| rg),
                grad_fn_base,
                grad_fn_version,
                view_loc: loc.clone(),
                grad: None,
                retains_grad: false,
            }))
        }
        Aliasing::MutatesData | Aliasing::MutatesMeta => {
            let target = args.first().ok_or_else(|| Error::Internal(format!("{name}: no self argument")))?;
            // In-place metadata ops change no data but count as a modification of the
            // storage every view shares, as PyTorch's `_version` does.
            if let (Aliasing::MutatesMeta, Repr::Eager(t)) = (aliasing, &repr) {
                t.storage.bump_version();
            }
            let base = {
                let mut st = target.lock();
                st.repr = repr;
                if rg {
                    st.own_requires_grad = true;
                    st.own_is_leaf = false;
                }
                if let Some(n) = &node {
                    if base_node.is_some() {
                        // A view written in place: its history is made again from its
                        // base's new one when next used.
                        st.grad_fn = None;
                        st.grad_fn_base = None;
                    } else {
                        st.grad_fn = Some(n.clone());
                        st.grad_fn_version = version_of(&st.repr);
                        if let Some(b) = &st.base {
                            st.grad_fn_base = b.snapshot().grad_fn;
                        }
                    }
                }
                st.base.clone()
            };
            if let Some((b, n)) = base_node {
                b.lock().grad_fn = Some(n);
            }
            // The base of a view mutated with a grad-requiring value now requires grad too.
            if rg {
                if let Some(b) = base {
                    let mut bs = b.lock();
                    bs.own_requires_grad = true;
                    bs.own_is_leaf = false;
                }
            }
            Ok((*target).clone())
        }
    }
}

/// The storage version of a tensor: an eager storage's counter, or the in-place ops
/// traced on a fake storage so far (takes the trace's lock: never call it holding
/// that).
pub(crate) fn version_of(repr: &Repr) -> u64 {
    match repr {
        Repr::Eager(t) => t.storage.version(),
        Repr::Fake(f) => f.ctx.lock().storage_version.get(&f.storage).copied().unwrap_or(0),
    }
}

/// A view whose creation forbids rebasing its history (see [`check_view_not_stale`])
/// whose storage changed since it was made.
pub(crate) fn is_stale_view(s: &TState) -> bool {
    s.base.is_some()
        && s.requires_grad()
        && (s.no_grad_view || s.multi_output_view.is_some())
        && version_of(&s.repr) != s.grad_fn_version
}

/// PyTorch's check when autograd needs a view's history (an op in grad mode taking
/// it, `grad_fn`, `retain_grad`): a view whose creation forbids rebasing its history
/// (made under no-grad of a tensor requiring grad, or output of a function returning
/// several views, or a view of either) may not be used once its storage was modified
/// in place after it was made (by it, its base or another view, in any mode).
pub(crate) fn check_view_not_stale(op: &str, s: &TState, loc: &SourceLoc) -> Result<()> {
    if !is_stale_view(s) {
        return Ok(());
    }
    let msg = match &s.multi_output_view {
        Some((node, i)) => format!(
            "Output {i} of {node} is a view and its base or another view of its base has been modified inplace. \
             This view is the output of a function that returns multiple views. Such functions do not allow the \
             output views to be modified inplace. You should replace the inplace operation by an out-of-place one."
        ),
        None => {
            let what = if s.is_leaf() {
                "A view was created in no_grad mode".to_string()
            } else {
                format!("Output 0 of {} is a view of a view which was created in no_grad mode", s.view_node)
            };
            format!(
                "{what} and its base or another view of its base has been modified inplace with grad mode enabled. \
                 Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by \
                 moving both the view and the inplace either both inside the no_grad block (if you don't want the \
                 inplace to be tracked) or both outside (if you want the inplace to be tracked)."
            )
        }
    };
    Err(Error::autograd(op, loc, msg))
}

//! [`Tensor`]: a cheap, shareable handle to a tensor object that is either eager
//! (holds real CPU data) or fake (holds only metadata and its place in a trace).
//!
//! Cloning a `Tensor` clones the *handle* (like another Python reference to the same
//! tensor object): in-place ops and metadata mutations (`t_()`) are seen through every
//! clone. The data copy op is [`Tensor::clone_tensor`].

mod data;
mod display;
pub(crate) mod fake;
pub(crate) mod history;

pub(crate) use data::dims_at;

use crate::error::{Error, Result};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{DType, Dim, DimList, SourceLoc, StorageId, TensorMeta, ValueId};
use fake::TraceCtx;
use history::GradNode;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

pub use data::Element;

/// A tensor handle. See the [module docs](self).
///
/// Its methods come in groups, each an `impl` block below with its own example:
/// **data** (`from_vec`, `from_f64`, `to_vec_f64`, `item`, printing with `Display`),
/// **metadata and autograd flags** (`sizes`, `strides`, `dtype`, `requires_grad`,
/// `is_leaf`, `detach`), **creation**, **pointwise**, **reductions** and matrix
/// products, **views**, **in-place**, **indexing**, **composed** ops, normalization and
/// convolution. Every op returns a [`Result`]: a shape or dtype error
/// names the op, the shapes and the caller's source line, never panics.
///
/// Gradients come from compiling the function that computes them
/// (`aotgrad::aot_function`, whose `forward` returns a pending backward).
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

pub(crate) struct Inner {
    state: Mutex<TState>,
}

/// The mutable state of one tensor object.
#[derive(Clone)]
pub(crate) struct TState {
    pub(crate) repr: Repr,
    /// This object's own flag; see [`TState::requires_grad`] for what autograd sees.
    pub(crate) own_requires_grad: bool,
    /// This object's own flag; see [`TState::is_leaf`] for what autograd sees.
    pub(crate) own_is_leaf: bool,
    /// For views: the tensor (itself not a view) whose storage this one views.
    pub(crate) base: Option<Tensor>,
    /// A view created while grad mode was on (PyTorch's differentiable view): its
    /// `requires_grad` follows its base's (see [`TState::requires_grad`]).
    pub(crate) grad_view: bool,
    /// A view created under no-grad of a tensor that required grad, or a view of
    /// such a view (PyTorch's `CreationMeta::NO_GRAD_MODE`): it requires grad, has
    /// no history autograd follows, and may not be modified in place in grad mode.
    pub(crate) no_grad_view: bool,
    /// A view created under no-grad (of any tensor), or a view of one (PyTorch's
    /// `CreationMeta::NO_GRAD_MODE` even where the base does not require grad): an
    /// in-place op on it with an operand requiring grad, in grad mode, is refused.
    pub(crate) created_no_grad: bool,
    /// Output `i` of a function returning several views (`split`, `chunk`,
    /// `unbind`) made in grad mode, or a view of one (PyTorch's
    /// `CreationMeta::MULTI_OUTPUT_NODE`): `(the creating op as PyTorch names its
    /// backward, without `Backward0`, output index)`; a view of one is output 0 of its
    /// own op. Such a view may not be modified in place while autograd tracks it.
    pub(crate) multi_output_view: Option<(String, usize)>,
    /// For a view: the op that made it, as PyTorch names its backward node less
    /// `Backward0` (`View`, `T`), for PyTorch's errors about it.
    pub(crate) view_node: String,
    /// Eager autograd: the node that computed this tensor (PyTorch's `grad_fn`).
    pub(crate) grad_fn: Option<Arc<GradNode>>,
    /// For a view: its base's node when this view's node was made (a base whose
    /// history moved on since gives the view a new one).
    pub(crate) grad_fn_base: Option<Arc<GradNode>>,
    /// The storage version when `grad_fn` was set: a view whose storage changed since
    /// (an in-place op on it or on what it views, even under no-grad or on metadata
    /// only) makes its history again from its base's, as PyTorch does.
    pub(crate) grad_fn_version: u64,
    /// For a view: where it was taken (the line its remade node reports).
    pub(crate) view_loc: SourceLoc,
    /// The accumulated gradient (leaves, and tensors that retain theirs).
    pub(crate) grad: Option<Tensor>,
    /// Whether this non-leaf keeps its gradient ([`Tensor::retain_grad`]).
    pub(crate) retains_grad: bool,
}

/// Eager data or fake metadata.
#[derive(Clone)]
pub(crate) enum Repr {
    Eager(CpuTensor),
    Fake(Fake),
}

/// A fake tensor: metadata, storage identity, current value in the trace.
#[derive(Clone)]
pub(crate) struct Fake {
    pub(crate) meta: TensorMeta,
    pub(crate) storage: StorageId,
    pub(crate) value: ValueId,
    pub(crate) ctx: Arc<TraceCtx>,
}

impl TState {
    /// A tensor that is not a view.
    pub(crate) fn new(repr: Repr, requires_grad: bool, is_leaf: bool) -> TState {
        TState {
            repr,
            own_requires_grad: requires_grad,
            own_is_leaf: is_leaf,
            base: None,
            grad_view: false,
            no_grad_view: false,
            created_no_grad: false,
            multi_output_view: None,
            view_node: String::new(),
            grad_fn: None,
            grad_fn_base: None,
            grad_fn_version: 0,
            view_loc: SourceLoc { file: "".into(), line: 0, col: 0 },
            grad: None,
            retains_grad: false,
        }
    }
    /// The base's flags `(requires_grad, is_leaf)` when this is a differentiable view.
    fn grad_base(&self) -> Option<(bool, bool)> {
        let base = self.base.as_ref().filter(|_| self.grad_view)?;
        let b = base.lock();
        Some((b.own_requires_grad, b.own_is_leaf))
    }
    /// Whether autograd tracks this tensor: its own flag, or, for a view created in
    /// grad mode, its base's (PyTorch's `DifferentiableViewMeta::requires_grad`), so a
    /// view taken before its base was mutated in place with a value requiring grad
    /// requires grad too.
    pub(crate) fn requires_grad(&self) -> bool {
        self.own_requires_grad || self.no_grad_view || self.grad_base().is_some_and(|(rg, _)| rg)
    }
    /// Whether this is an autograd leaf: not when it is a differentiable view whose
    /// base is a non-leaf requiring grad (PyTorch regenerates the view's `grad_fn`
    /// after its base is mutated in place).
    pub(crate) fn is_leaf(&self) -> bool {
        self.own_is_leaf && !self.grad_base().is_some_and(|(rg, leaf)| rg && !leaf)
    }
    pub(crate) fn meta(&self) -> &TensorMeta {
        match &self.repr {
            Repr::Eager(t) => &t.meta,
            Repr::Fake(f) => &f.meta,
        }
    }
}

/// **Metadata and autograd flags**: sizes, strides, dtype, storage sharing and
/// versions; `requires_grad`, `is_leaf`, `is_view`. Results of ops on tensors that
/// require grad require grad themselves (outside [`no_grad`](crate::no_grad)).
///
/// ```
/// # use aotgrad_trace::{no_grad, DType, Tensor};
/// let w = Tensor::ones(&[2, 2], DType::F32)?.requires_grad(true)?;
/// assert!(w.is_leaf() && w.is_requires_grad());
/// let y = w.mul(3.0)?;
/// assert!(y.is_requires_grad() && !y.is_leaf());
/// assert!(!y.detach()?.is_requires_grad());
/// let z = no_grad(|| w.mul(3.0))?;
/// assert!(!z.is_requires_grad());
/// assert_eq!((y.dtype(), y.sizes()?), (DType::F32, vec![2, 2]));
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    pub(crate) fn from_state(state: TState) -> Tensor {
        Tensor(Arc::new(Inner { state: Mutex::new(state) }))
    }
    /// This tensor object's address (stable while any handle to it lives).
    pub(crate) fn address(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Tensor {
        Tensor(inner)
    }
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.0
    }
    pub(crate) fn lock(&self) -> MutexGuard<'_, TState> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// A copy of the current state (cheap: shared storage, cloned metadata).
    pub(crate) fn snapshot(&self) -> TState {
        self.lock().clone()
    }
    /// True when both handles refer to the same tensor object.
    pub fn same_object(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Wrap a concrete CPU tensor as an eager leaf that does not require grad.
    pub fn from_cpu(t: CpuTensor) -> Tensor {
        Tensor::from_state(TState::new(Repr::Eager(t), false, true))
    }
    /// The concrete CPU tensor behind an eager tensor (sharing its storage).
    #[track_caller]
    pub fn to_cpu(&self) -> Result<CpuTensor> {
        match &self.lock().repr {
            Repr::Eager(t) => Ok(t.clone()),
            Repr::Fake(_) => Err(Error::mode("to_cpu", &SourceLoc::caller(), "a fake tensor has no data")),
        }
    }

    // ---- metadata ----------------------------------------------------------------

    /// Shape, strides, storage offset and dtype.
    pub fn meta(&self) -> TensorMeta {
        self.lock().meta().clone()
    }
    /// The size of each dim (symbolic while tracing with dynamic dims).
    pub fn shape(&self) -> Vec<Dim> {
        self.lock().meta().shape.to_vec()
    }
    /// Concrete sizes; an error if a dim is symbolic.
    #[track_caller]
    pub fn sizes(&self) -> Result<Vec<usize>> {
        let m = self.meta();
        m.concrete_shape().ok_or_else(|| {
            Error::invalid("sizes", &SourceLoc::caller(), format!("shape {} is symbolic", DimList(&m.shape)))
        })
    }
    /// The size of dim `d` (negative counts from the end).
    #[track_caller]
    pub fn size(&self, d: i64) -> Result<Dim> {
        let loc = SourceLoc::caller();
        let m = self.meta();
        let i = aotgrad_ir::infer::wrap_dim("size", d, m.rank()).map_err(|e| Error::shape("size", &loc, e))?;
        m.shape.get(i).cloned().ok_or_else(|| {
            Error::shape("size", &loc, aotgrad_ir::ShapeError::DimOutOfRange { op: "size".into(), dim: d, rank: 0 })
        })
    }
    /// Number of dims.
    pub fn dim(&self) -> usize {
        self.lock().meta().rank()
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.lock().meta().dtype
    }
    /// Strides in elements.
    pub fn strides(&self) -> Vec<Dim> {
        self.lock().meta().strides.to_vec()
    }
    /// Storage offset in elements.
    pub fn storage_offset(&self) -> Dim {
        self.lock().meta().offset.clone()
    }
    /// Number of elements.
    pub fn numel(&self) -> Dim {
        self.lock().meta().numel()
    }
    /// Whether the strides are row-major for the shape.
    pub fn is_contiguous(&self) -> bool {
        self.lock().meta().is_contiguous()
    }
    /// True for a fake (metadata-only, traced) tensor.
    pub fn is_fake(&self) -> bool {
        matches!(self.lock().repr, Repr::Fake(_))
    }
    /// True when both tensors view the same storage (in the same mode).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        if self.same_object(other) {
            return true;
        }
        let (a, b) = (self.snapshot(), other.snapshot());
        match (&a.repr, &b.repr) {
            (Repr::Eager(x), Repr::Eager(y)) => x.same_storage(y),
            (Repr::Fake(x), Repr::Fake(y)) => x.storage == y.storage && Arc::ptr_eq(&x.ctx, &y.ctx),
            _ => false,
        }
    }
    /// PyTorch's `_version`: the version counter shared by every view of an eager
    /// tensor's storage, bumped by every in-place op (data or metadata: `add_`, `t_`,
    /// `as_strided_`, ...).
    #[track_caller]
    pub fn version(&self) -> Result<u64> {
        match &self.lock().repr {
            Repr::Eager(t) => Ok(t.storage.version()),
            Repr::Fake(_) => Err(Error::mode("version", &SourceLoc::caller(), "a fake tensor has no storage")),
        }
    }
    /// How many times the storage of an eager tensor has been modified (see
    /// [`Tensor::version`]).
    #[track_caller]
    pub fn storage_version(&self) -> Result<u64> {
        match &self.lock().repr {
            Repr::Eager(t) => Ok(t.storage.version()),
            Repr::Fake(_) => Err(Error::mode("storage_version", &SourceLoc::caller(), "a fake tensor has no storage")),
        }
    }
    /// The storage identity of a fake tensor in its trace.
    pub fn fake_storage(&self) -> Option<StorageId> {
        match &self.lock().repr {
            Repr::Fake(f) => Some(f.storage),
            Repr::Eager(_) => None,
        }
    }
    /// The graph value a fake tensor currently stands for (moves on in-place ops).
    pub fn fake_value(&self) -> Option<ValueId> {
        match &self.lock().repr {
            Repr::Fake(f) => Some(f.value),
            Repr::Eager(_) => None,
        }
    }

    // ---- autograd flags ------------------------------------------------------------

    /// PyTorch's `requires_grad_`: [`Tensor::set_requires_grad`], returning this handle.
    #[track_caller]
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<Tensor> {
        self.set_requires_grad_at(requires_grad, &SourceLoc::caller())?;
        Ok(self.clone())
    }
    /// PyTorch's `detach_`: this tensor object leaves autograd in place (stops
    /// requiring grad, becomes a leaf). A view cannot be detached in place (PyTorch's
    /// error); use [`Tensor::detach`].
    #[track_caller]
    pub fn detach_(&self) -> Result<Tensor> {
        let mut st = self.lock();
        if st.base.is_some() {
            return Err(Error::autograd(
                "detach_",
                &SourceLoc::caller(),
                "Can't detach views in-place. Use detach() instead.",
            ));
        }
        st.own_requires_grad = false;
        st.own_is_leaf = true;
        st.multi_output_view = None;
        if let Repr::Fake(f) = &st.repr {
            f.ctx.set_value_requires_grad(f.value, false);
        }
        drop(st);
        Ok(self.clone())
    }
    /// Builder form of [`Tensor::set_requires_grad`]: returns this handle.
    #[track_caller]
    pub fn requires_grad(&self, requires_grad: bool) -> Result<Tensor> {
        self.set_requires_grad_at(requires_grad, &SourceLoc::caller())?;
        Ok(self.clone())
    }
    /// Mark (or unmark) a leaf as requiring grad. Only floating dtypes can require grad,
    /// and only leaves can stop requiring it.
    #[track_caller]
    pub fn set_requires_grad(&self, requires_grad: bool) -> Result<()> {
        self.set_requires_grad_at(requires_grad, &SourceLoc::caller())
    }
    fn set_requires_grad_at(&self, requires_grad: bool, loc: &SourceLoc) -> Result<()> {
        let mut st = self.lock();
        let dtype = st.meta().dtype;
        if requires_grad && !dtype.is_float() {
            return Err(Error::autograd(
                "requires_grad",
                loc,
                format!("only tensors of floating point dtype can require gradients, got {dtype}"),
            ));
        }
        if !st.is_leaf() && !requires_grad {
            return Err(Error::autograd(
                "requires_grad",
                loc,
                "you can only change requires_grad flags of leaf variables; use detach() for a tensor \
                 outside of autograd",
            ));
        }
        let was = st.requires_grad();
        st.own_requires_grad = requires_grad;
        if let Repr::Fake(f) = &st.repr {
            // Made to require grad, an argument is tracked from here on (the trace
            // notes where); any other tensor is a new leaf: autograd sees what is
            // computed from it, not what it was computed from. Either way the nodes
            // that ran stay as autograd saw them (an in-place op on the argument
            // before, or the op that made the tensor, was not recorded). Unchanged,
            // the value stays as it was too (a hidden mutation stays hidden).
            if requires_grad && !was {
                let input = f.ctx.lock().input_handles.contains(&self.address());
                if input {
                    f.ctx.note_tracked_from(f.value, f.storage);
                }
            } else if was != st.requires_grad() {
                f.ctx.set_value_requires_grad(f.value, st.requires_grad());
            }
        }
        Ok(())
    }
    /// Forget that this view was taken under no-grad: for a runtime that regenerates a
    /// call's aliased outputs as views under no-grad and then gives them the autograd
    /// flags the traced function's outputs had (see [`Tensor::mark_differentiable_result`]).
    pub fn clear_no_grad_view(&self) {
        let mut st = self.lock();
        st.no_grad_view = false;
        st.created_no_grad = false;
    }
    /// Make this tensor a `detach`ed alias: it keeps sharing storage but is not a view
    /// for autograd (no base): for a runtime regenerating a traced output that was one.
    pub fn mark_detached_alias(&self) {
        let mut st = self.lock();
        st.base = None;
        st.grad_view = false;
        st.no_grad_view = false;
        st.created_no_grad = false;
        st.multi_output_view = None;
    }
    /// Make this view one taken under no-grad, or (`leaf` false) a grad-mode view of
    /// one: it requires grad, refuses in-place ops in grad mode, and when taken under
    /// no-grad itself is a leaf passing no gradient, as in PyTorch. For a runtime
    /// regenerating a traced output that was such a view.
    pub fn mark_no_grad_view(&self, leaf: bool) {
        let mut st = self.lock();
        if st.base.is_some() {
            st.no_grad_view = true;
            if leaf {
                st.grad_view = false;
            }
        }
    }

    /// Give this view the creation rules of a traced output it regenerates (see
    /// [`aotgrad_ir::ViewCreation`]): made under no-grad, output of a function
    /// returning several views, the op that made it; a grad-mode view that does not
    /// require grad follows its base's flag from now on. A no-op on a tensor that is
    /// not a view.
    pub fn set_view_creation(&self, creation: &aotgrad_ir::ViewCreation) {
        let mut st = self.lock();
        if st.base.is_some() {
            if creation.grad_view && (creation.leaf || !st.requires_grad()) {
                st.grad_view = true;
            }
            st.created_no_grad = creation.created_no_grad;
            st.multi_output_view = creation.multi_output.clone();
            st.view_node = creation.node.clone();
            if creation.stale {
                // No version matches: using it in grad mode is refused.
                st.grad_fn_version = u64::MAX;
            }
        }
    }

    /// Mark this tensor as the result of a differentiable computation: it requires grad
    /// and is not a leaf (what the outputs of a compiled forward are, like those of a
    /// PyTorch `autograd.Function`). Only floating dtypes can require gradients.
    #[track_caller]
    pub fn mark_differentiable_result(&self) -> Result<()> {
        let mut st = self.lock();
        let dtype = st.meta().dtype;
        if !dtype.is_float() {
            return Err(Error::autograd(
                "mark_differentiable_result",
                &SourceLoc::caller(),
                format!("only tensors of floating point dtype can require gradients, got {dtype}"),
            ));
        }
        st.own_requires_grad = true;
        st.own_is_leaf = false;
        if let Repr::Fake(f) = &st.repr {
            f.ctx.set_value_requires_grad(f.value, true);
        }
        Ok(())
    }
    /// Whether gradients are tracked for this tensor.
    /// For a view created in grad mode this includes its base's flag (like PyTorch),
    /// so a view taken before its base was mutated in place with a value requiring
    /// grad requires grad too.
    pub fn is_requires_grad(&self) -> bool {
        self.snapshot().requires_grad()
    }
    /// Whether this is a leaf of autograd (created by the user, or not requiring grad).
    pub fn is_leaf(&self) -> bool {
        self.snapshot().is_leaf()
    }
    /// Whether this tensor is a view of another tensor (its `_base` in PyTorch).
    pub fn is_view(&self) -> bool {
        self.lock().base.is_some()
    }
    /// The tensor this one is a view of, if any.
    pub fn base(&self) -> Option<Tensor> {
        self.lock().base.clone()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.snapshot();
        match &st.repr {
            Repr::Eager(t) => write!(f, "Tensor(eager {}", t.meta)?,
            Repr::Fake(x) => write!(f, "Tensor(fake {} {} {}", x.value, x.storage, x.meta)?,
        }
        if st.requires_grad() {
            f.write_str(", requires_grad")?;
        }
        if !st.is_leaf() {
            f.write_str(", non-leaf")?;
        }
        f.write_str(")")
    }
}

//! View ops (results share storage with `self`), copies (`clone_tensor`,
//! `contiguous`), `detach`, and metadata in-place ops (`t_`, `transpose_`, ...), which
//! change this tensor object's shape/strides in place.

use super::wrap;
use crate::error::{Error, Result};
use crate::grad_mode::NoGradGuard;
use crate::ops::dispatch;
use crate::tensor::{Repr, Tensor};
use aotgrad_ir::infer::{normalize_slice, resolve_expand_shape, resolve_view_shape, squeeze_dims, view_strides};
use aotgrad_ir::Dims;
use aotgrad_ir::{contiguous_strides, Dim, Op, Scalar, ShapeError, SourceLoc};

/// `-1` stands for "infer"/"keep" in view and expand sizes.
fn spec_i64(shape: &[i64]) -> Vec<Option<Dim>> {
    shape.iter().map(|&d| if d == -1 { None } else { Some(Dim::Const(d)) }).collect()
}
fn spec_dims(shape: &[Dim]) -> Vec<Option<Dim>> {
    shape.iter().map(|d| if *d == Dim::Const(-1) { None } else { Some(d.clone()) }).collect()
}

/// **Views**: results share storage with `self` (`view`, `reshape` when it can,
/// `permute`, `transpose`, `t`, `expand`, `squeeze`/`unsqueeze`, `slice`, `narrow`,
/// `select`, `as_strided`, `alias`, `detach`); writes through a view are seen by every
/// other view of the storage. Also copies (`clone_tensor`, `contiguous`) and the
/// metadata in-place ops (`t_`, `transpose_`, `unsqueeze_`, …), which change this
/// handle's shape and strides.
///
/// ```
/// # use aotgrad_trace::{DType, Dim, Tensor};
/// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F64)?.view(&[2, 3])?;
/// let t = x.t()?;
/// assert_eq!(t.sizes()?, vec![3, 2]);
/// assert_eq!(t.strides(), vec![Dim::from(1usize), Dim::from(3usize)]);
/// assert!(t.shares_storage_with(&x));
/// x.select(0, 1)?.fill_(9.0)?; // writes through the view
/// assert_eq!(t.to_vec_f64()?, vec![0.0, 9.0, 1.0, 9.0, 2.0, 9.0]);
/// assert!(t.contiguous()?.is_contiguous());
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    // ---- op builders shared by the view and metadata in-place forms -------------

    fn view_op(&self, op: &str, spec: &[Option<Dim>], loc: &SourceLoc) -> Result<Op> {
        let from = self.shape();
        Ok(Op::View(self.with_oracle(op, loc, |o| resolve_view_shape(op, &from, spec, o))?))
    }
    fn expand_op(&self, op: &str, spec: &[Option<Dim>], loc: &SourceLoc) -> Result<Op> {
        let from = self.shape();
        Ok(Op::Expand(self.with_oracle(op, loc, |o| resolve_expand_shape(op, &from, spec, o))?))
    }
    fn transpose_op(&self, op: &str, d0: i64, d1: i64, loc: &SourceLoc) -> Result<Op> {
        let r = self.dim();
        Ok(Op::Transpose(wrap(op, d0, r, loc)?, wrap(op, d1, r, loc)?))
    }
    fn squeeze_op(&self, op: &str, dim: Option<i64>, loc: &SourceLoc) -> Result<Op> {
        let shape = self.shape();
        Ok(Op::Squeeze(self.with_oracle(op, loc, |o| squeeze_dims(op, &shape, dim, o))?))
    }
    fn unsqueeze_op(&self, op: &str, dim: i64, loc: &SourceLoc) -> Result<Op> {
        Ok(Op::Unsqueeze(wrap(op, dim, self.dim() + 1, loc)?))
    }
    /// The size of dim `d` (already wrapped), or the 0-d error of `op`.
    fn size_of(&self, op: &str, d: usize, loc: &SourceLoc) -> Result<Dim> {
        self.shape().get(d).cloned().ok_or_else(|| {
            Error::shape(
                op,
                loc,
                ShapeError::Invalid { op: op.into(), msg: format!("{op}() cannot be applied to a 0-dim tensor") },
            )
        })
    }

    // ---- views ----------------------------------------------------------------------

    /// View with a new shape (one `-1` is inferred); must be expressible with strides.
    #[track_caller]
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.view_op("view", &spec_i64(shape), &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// [`Tensor::view`] with possibly symbolic sizes (`Dim::Const(-1)` is inferred).
    #[track_caller]
    pub fn view_dims(&self, shape: &[Dim]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.view_op("view", &spec_dims(shape), &loc)?;
        dispatch(op, &[self], &loc)
    }
    fn reshape_at(&self, spec: &[Option<Dim>], loc: &SourceLoc) -> Result<Tensor> {
        let from = self.shape();
        let shape = self.with_oracle("reshape", loc, |o| resolve_view_shape("reshape", &from, spec, o))?;
        self.reshape_to("reshape", shape, loc)
    }
    /// PyTorch's `reshape` to resolved sizes (the numel already checked): a view when
    /// the strides allow it, else `_unsafe_view` of a contiguous copy, a fresh tensor
    /// that is not a view of anything. `op` names the oracle's questions and errors.
    pub(crate) fn reshape_to(&self, op: &str, shape: Dims, loc: &SourceLoc) -> Result<Tensor> {
        let (from, strides) = (self.shape(), self.strides());
        let viewable = self.with_oracle(op, loc, |o| Ok(view_strides(&from, &strides, &shape, o).is_some()))?;
        if viewable {
            dispatch(Op::View(shape), &[self], loc)
        } else {
            let c = dispatch(Op::Clone, &[self], loc)?;
            dispatch(Op::UnsafeView(shape), &[&c], loc)
        }
    }
    /// A view with a new shape when strides allow it, else a fresh contiguous copy
    /// with that shape (not a view; PyTorch's `_unsafe_view` of a clone).
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        self.reshape_at(&spec_i64(shape), &SourceLoc::caller())
    }
    /// [`Tensor::reshape`] with possibly symbolic sizes.
    #[track_caller]
    pub fn reshape_dims(&self, shape: &[Dim]) -> Result<Tensor> {
        self.reshape_at(&spec_dims(shape), &SourceLoc::caller())
    }
    /// `self.reshape(-1)` (a view when the strides allow it, else a fresh copy).
    #[track_caller]
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape_at(&[None], &SourceLoc::caller())
    }
    /// Reorder dims.
    #[track_caller]
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let r = self.dim();
        let perm = dims.iter().map(|&d| wrap("permute", d, r, &loc)).collect::<Result<Vec<_>>>()?;
        dispatch(Op::Permute(perm), &[self], &loc)
    }
    /// Swap two dims.
    #[track_caller]
    pub fn transpose(&self, d0: i64, d1: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.transpose_op("transpose", d0, d1, &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// Transpose of a tensor with at most 2 dims.
    #[track_caller]
    pub fn t(&self) -> Result<Tensor> {
        dispatch(Op::T, &[self], &SourceLoc::caller())
    }
    /// Broadcast size-1 dims to `shape` (stride 0); `-1` keeps a size; new leading dims allowed.
    #[track_caller]
    pub fn expand(&self, shape: &[i64]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.expand_op("expand", &spec_i64(shape), &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// [`Tensor::expand`] with possibly symbolic sizes (`Dim::Const(-1)` keeps a size).
    #[track_caller]
    pub fn expand_dims(&self, shape: &[Dim]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.expand_op("expand", &spec_dims(shape), &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// Expand to `other`'s shape.
    #[track_caller]
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let spec: Vec<Option<Dim>> = other.shape().into_iter().map(Some).collect();
        let op = self.expand_op("expand_as", &spec, &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// Drop every size-1 dim.
    #[track_caller]
    pub fn squeeze(&self) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.squeeze_op("squeeze", None, &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// Drop dim `dim` if its size is 1 (else a view of the same shape).
    #[track_caller]
    pub fn squeeze_dim(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.squeeze_op("squeeze", Some(dim), &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// Insert a size-1 dim at position `dim` of the result.
    #[track_caller]
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.unsqueeze_op("unsqueeze", dim, &loc)?;
        dispatch(op, &[self], &loc)
    }
    /// `self[start:end:step]` along `dim`, with Python bounds (negative counts from the
    /// end, out-of-range bounds clamp; `None` means the whole extent).
    #[track_caller]
    pub fn slice(&self, dim: i64, start: Option<i64>, end: Option<i64>, step: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.slice_op("slice", dim, start, end, step, &loc)?;
        dispatch(op, &[self], &loc)
    }
    pub(crate) fn slice_bounds(
        &self,
        op: &str,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        loc: &SourceLoc,
    ) -> Result<(usize, Dim, Dim)> {
        let d = wrap(op, dim, self.dim(), loc)?;
        let size = self.size_of(op, d, loc)?;
        let (s, e) = self.with_oracle(op, loc, |o| normalize_slice(op, &size, start, end, step, o))?;
        Ok((d, s, e))
    }
    fn slice_op(
        &self,
        op: &str,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        loc: &SourceLoc,
    ) -> Result<Op> {
        let (dim, start, end) = self.slice_bounds(op, dim, start, end, step, loc)?;
        Ok(Op::Slice { dim, start, end, step })
    }
    /// `length` elements of `dim` from `start` (negative `start` counts from the end);
    /// the range must lie within the dim.
    #[track_caller]
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let d = wrap("narrow", dim, self.dim(), &loc)?;
        let size = self.size_of("narrow", d, &loc)?;
        // `None` when `start + length` overflows i64 (so it exceeds any size).
        let start_d = if start < 0 { size.checked_add(&Dim::Const(start)) } else { Some(Dim::Const(start)) };
        let bounds = start_d.and_then(|s| Some((s.checked_add(&Dim::Const(length))?, s)));
        let ok = match &bounds {
            Some((end_d, start_d)) => self.with_oracle("narrow", &loc, |o| {
                Ok(length >= 0
                    && o.decide(&Dim::Const(0), aotgrad_ir::Rel::Le, start_d)
                    && o.decide(end_d, aotgrad_ir::Rel::Le, &size))
            })?,
            None => false,
        };
        let Some((end_d, start_d)) = bounds.filter(|_| ok) else {
            return Err(Error::shape(
                "narrow",
                &loc,
                ShapeError::Invalid {
                    op: "narrow".into(),
                    msg: format!("start ({start}) + length ({length}) exceeds dimension size ({size}) of dim {d}"),
                },
            ));
        };
        dispatch(Op::Slice { dim: d, start: start_d, end: end_d, step: 1 }, &[self], &loc)
    }
    pub(crate) fn select_index(&self, op: &str, dim: i64, index: i64, loc: &SourceLoc) -> Result<(usize, Dim)> {
        let d = wrap(op, dim, self.dim(), loc)?;
        let size = self.size_of(op, d, loc)?;
        if index >= 0 {
            return Ok((d, Dim::Const(index)));
        }
        let wrapped = size.checked_add(&Dim::Const(index));
        let ok = match &wrapped {
            Some(w) => self.with_oracle(op, loc, |o| Ok(o.decide(&Dim::Const(0), aotgrad_ir::Rel::Le, w)))?,
            None => false,
        };
        let Some(wrapped) = wrapped.filter(|_| ok) else {
            return Err(Error::shape(
                op,
                loc,
                ShapeError::IndexOutOfRange { op: op.into(), index: index.to_string(), dim: d, size: size.to_string() },
            ));
        };
        Ok((d, wrapped))
    }
    /// `self[..., index, ...]` at `dim`, dropping the dim (negative index counts from the end).
    #[track_caller]
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let (dim, index) = self.select_index("select", dim, index, &loc)?;
        dispatch(Op::Select { dim, index }, &[self], &loc)
    }
    /// An arbitrary view of this tensor's storage (`offset` in elements from the storage start).
    #[track_caller]
    pub fn as_strided(&self, size: &[usize], stride: &[usize], offset: usize) -> Result<Tensor> {
        let op = Op::AsStrided {
            size: size.iter().map(|&s| Dim::from(s)).collect(),
            stride: stride.iter().map(|&s| Dim::from(s)).collect(),
            offset: Dim::from(offset),
        };
        dispatch(op, &[self], &SourceLoc::caller())
    }
    /// [`Tensor::as_strided`] with possibly symbolic sizes.
    #[track_caller]
    pub fn as_strided_dims(&self, size: &[Dim], stride: &[Dim], offset: Dim) -> Result<Tensor> {
        let op = Op::AsStrided { size: size.into(), stride: stride.into(), offset };
        dispatch(op, &[self], &SourceLoc::caller())
    }
    /// A new tensor object with the same metadata, sharing storage.
    #[track_caller]
    pub fn alias(&self) -> Result<Tensor> {
        dispatch(Op::Alias, &[self], &SourceLoc::caller())
    }
    /// A new tensor object sharing storage that does not take part in autograd
    /// (never requires grad, is a leaf, and is not a view for autograd purposes).
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        self.detach_at(&SourceLoc::caller())
    }

    /// [`Tensor::detach`] recorded at `loc` (decompositions attribute it to the user).
    pub(crate) fn detach_at(&self, loc: &SourceLoc) -> Result<Tensor> {
        let t = {
            let _no_grad = NoGradGuard::new();
            dispatch(Op::Alias, &[self], loc)?
        };
        {
            let mut st = t.lock();
            if let Repr::Fake(f) = &st.repr {
                f.ctx.lock().detach_values.push(f.value);
            }
            st.base = None;
            st.grad_view = false;
            st.no_grad_view = false;
            st.created_no_grad = false;
            st.multi_output_view = None;
            st.own_requires_grad = false;
            st.own_is_leaf = true;
        }
        Ok(t)
    }

    // ---- copies -----------------------------------------------------------------------

    /// A copy with fresh storage (PyTorch's `clone`, preserving the memory format): a
    /// dense tensor keeps its strides (`x.t().clone_tensor()` is laid out like
    /// `x.t()`), another one is dense in its dim order; use
    /// [`Tensor::contiguous`] for a row-major copy.
    #[track_caller]
    pub fn clone_tensor(&self) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let m = self.meta();
        if m.strides == contiguous_strides(&m.shape) {
            return dispatch(Op::Clone, &[self], &loc);
        }
        // Fresh storage laid out like `self` (`zeros_like`'s layout), then filled.
        let like = dispatch(Op::FullLike { dtype: None, value: Scalar::Int(0) }, &[self], &loc)?;
        dispatch(Op::Copy, &[&like, self], &loc)
    }
    /// This very tensor when already contiguous (like PyTorch), else a contiguous copy.
    #[track_caller]
    pub fn contiguous(&self) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        self.mode("contiguous", &loc)?;
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        dispatch(Op::Clone, &[self], &loc)
    }

    // ---- metadata in-place ------------------------------------------------------------

    /// In-place [`Tensor::t`]: this tensor object gets the transposed metadata.
    #[track_caller]
    pub fn t_(&self) -> Result<Tensor> {
        dispatch(Op::MetaInPlace(Box::new(Op::T)), &[self], &SourceLoc::caller())
    }
    /// In-place [`Tensor::transpose`].
    #[track_caller]
    pub fn transpose_(&self, d0: i64, d1: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.transpose_op("transpose_", d0, d1, &loc)?;
        dispatch(Op::MetaInPlace(Box::new(op)), &[self], &loc)
    }
    /// In-place [`Tensor::unsqueeze`].
    #[track_caller]
    pub fn unsqueeze_(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.unsqueeze_op("unsqueeze_", dim, &loc)?;
        dispatch(Op::MetaInPlace(Box::new(op)), &[self], &loc)
    }
    /// In-place [`Tensor::squeeze`].
    #[track_caller]
    pub fn squeeze_(&self) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.squeeze_op("squeeze_", None, &loc)?;
        dispatch(Op::MetaInPlace(Box::new(op)), &[self], &loc)
    }
    /// In-place [`Tensor::squeeze_dim`].
    #[track_caller]
    pub fn squeeze_dim_(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let op = self.squeeze_op("squeeze_", Some(dim), &loc)?;
        dispatch(Op::MetaInPlace(Box::new(op)), &[self], &loc)
    }
    /// In-place [`Tensor::as_strided`].
    #[track_caller]
    pub fn as_strided_(&self, size: &[usize], stride: &[usize], offset: usize) -> Result<Tensor> {
        let op = Op::AsStrided {
            size: size.iter().map(|&s| Dim::from(s)).collect(),
            stride: stride.iter().map(|&s| Dim::from(s)).collect(),
            offset: Dim::from(offset),
        };
        dispatch(Op::MetaInPlace(Box::new(op)), &[self], &SourceLoc::caller())
    }
}

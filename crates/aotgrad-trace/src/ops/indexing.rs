//! Indexing: `index_select`, `gather`, `scatter_add`, `cat`, and the out-of-place
//! scatters that write a view's worth of values into a copy of a base tensor.

use super::wrap;
use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::{Dim, Op, SourceLoc};

/// **Indexing**: `index_select`, `gather`, `scatter_add`, `cat`, and the out-of-place
/// scatters (`slice_scatter`, `select_scatter`, `as_strided_scatter`) that write a view's
/// worth of values into a copy of `self`. Indices are i64 tensors, checked against the
/// sizes (an out-of-range index is an error naming the op).
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], DType::F64)?;
/// let idx = Tensor::from_vec(vec![2i64, 0], &[2])?;
/// assert_eq!(x.index_select(0, &idx)?.to_vec_f64()?, vec![5.0, 6.0, 1.0, 2.0]);
/// let both = Tensor::cat(&[&x, &x], 1)?;
/// assert_eq!(both.sizes()?, vec![3, 4]);
/// assert!(x.index_select(0, &Tensor::from_vec(vec![3i64], &[1])?).is_err());
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    /// Entries along `dim` picked by a 1-D integer `index`.
    #[track_caller]
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("index_select", dim, self.dim(), &loc)?;
        dispatch(Op::IndexSelect(dim), &[self, index], &loc)
    }
    /// `out[i][j] = self[index[i][j]][j]` (for `dim = 0`; likewise for other dims).
    #[track_caller]
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("gather", dim, self.dim(), &loc)?;
        dispatch(Op::Gather(dim), &[self, index], &loc)
    }
    /// A copy of `self` with `src` added at `index` along `dim`.
    #[track_caller]
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("scatter_add", dim, self.dim(), &loc)?;
        dispatch(Op::ScatterAdd(dim), &[self, index, src], &loc)
    }
    /// Concatenate along `dim` (negative counts from the end of the first tensor's dims).
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let first =
            tensors.first().ok_or_else(|| Error::invalid("cat", &loc, "expected a non-empty list of tensors"))?;
        let dim = wrap("cat", dim, first.dim(), &loc)?;
        dispatch(Op::Cat(dim), tensors, &loc)
    }
    /// A copy of `self` with `self[start:end:step]` along `dim` replaced by `src`
    /// (bounds as in [`Tensor::slice`]).
    #[track_caller]
    pub fn slice_scatter(
        &self,
        src: &Tensor,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let (dim, start, end) = self.slice_bounds("slice_scatter", dim, start, end, step, &loc)?;
        dispatch(Op::SliceScatter { dim, start, end, step }, &[self, src], &loc)
    }
    /// A copy of `self` with `self.select(dim, index)` replaced by `src`.
    #[track_caller]
    pub fn select_scatter(&self, src: &Tensor, dim: i64, index: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let (dim, index) = self.select_index("select_scatter", dim, index, &loc)?;
        dispatch(Op::SelectScatter { dim, index }, &[self, src], &loc)
    }
    /// A contiguous copy of `self` with `as_strided(size, stride, offset)` replaced by `src`.
    #[track_caller]
    pub fn as_strided_scatter(&self, src: &Tensor, size: &[usize], stride: &[usize], offset: usize) -> Result<Tensor> {
        let op = Op::AsStridedScatter {
            size: size.iter().map(|&s| Dim::from(s)).collect(),
            stride: stride.iter().map(|&s| Dim::from(s)).collect(),
            offset: Dim::from(offset),
        };
        dispatch(op, &[self, src], &SourceLoc::caller())
    }
}

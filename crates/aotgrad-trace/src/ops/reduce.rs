//! Reductions (`sum`, `mean`, `amax`, `amin`, `argmax`, `argmin`) and matrix products.

use super::wrap;
use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::{Op, ReduceOp, ShapeError, SourceLoc};

/// **Reductions and matrix products**: `sum`, `mean`, `amax`, `amin` over dims (with
/// `keepdim`) or everything (`*_all`), `argmax`/`argmin`, `cumsum`, `argsort`, `matmul`
/// (in [`Tensor::matmul`]'s broadcasting batched form), `mm`, `bmm`.
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)?;
/// assert_eq!(x.sum(&[1], false)?.to_vec_f64()?, vec![6.0, 15.0]);
/// assert_eq!(x.mean_all()?.to_vec_f64()?, vec![3.5]);
/// assert_eq!(x.argmax(1, false)?.to_vec_f64()?, vec![2.0, 2.0]);
/// assert_eq!(x.matmul(&x.t()?)?.to_vec_f64()?, vec![14.0, 32.0, 32.0, 77.0]);
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    /// Wrap, sort and check a list of reduced dims (empty: all dims).
    fn reduce_dims(&self, op: &str, dims: &[i64], loc: &SourceLoc) -> Result<Vec<usize>> {
        let rank = self.dim();
        let mut out = Vec::with_capacity(dims.len());
        for &d in dims {
            let w = wrap(op, d, rank, loc)?;
            if out.contains(&w) {
                return Err(Error::shape(
                    op,
                    loc,
                    ShapeError::Invalid {
                        op: op.into(),
                        msg: format!("dim {w} appears multiple times in the list of dims"),
                    },
                ));
            }
            out.push(w);
        }
        if rank == 0 {
            // A 0-d tensor accepts dim 0 / -1; reducing it over "all dims" is the same.
            out.clear();
        }
        out.sort_unstable();
        Ok(out)
    }
    fn reduce_at(&self, op: ReduceOp, dims: &[i64], keepdim: bool, loc: &SourceLoc) -> Result<Tensor> {
        let dims = self.reduce_dims(op.name(), dims, loc)?;
        dispatch(Op::Reduce { op, dims, keepdim }, &[self], loc)
    }
    /// Sum over `dims` (negative dims count from the end; empty: all dims).
    #[track_caller]
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Sum, dims, keepdim, &SourceLoc::caller())
    }
    /// Sum of all elements (a 0-d tensor).
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Sum, &[], false, &SourceLoc::caller())
    }
    /// Mean over `dims` (floating dtypes only).
    #[track_caller]
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Mean, dims, keepdim, &SourceLoc::caller())
    }
    /// Mean of all elements.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Mean, &[], false, &SourceLoc::caller())
    }
    /// Maximum over `dims`.
    #[track_caller]
    pub fn amax(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Amax, dims, keepdim, &SourceLoc::caller())
    }
    /// Minimum over `dims`.
    #[track_caller]
    pub fn amin(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce_at(ReduceOp::Amin, dims, keepdim, &SourceLoc::caller())
    }
    /// Index of the maximum along `dim` (i64; the first on ties).
    #[track_caller]
    pub fn argmax(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("argmax", dim, self.dim(), &loc)?;
        dispatch(Op::ArgMax { dim, keepdim }, &[self], &loc)
    }
    /// Index of the minimum along `dim`.
    #[track_caller]
    pub fn argmin(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("argmin", dim, self.dim(), &loc)?;
        dispatch(Op::ArgMin { dim, keepdim }, &[self], &loc)
    }
    /// Cumulative sum along `dim` (PyTorch's `cumsum`; integer and bool inputs give
    /// i64).
    #[track_caller]
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("cumsum", dim, self.dim(), &loc)?;
        dispatch(Op::Cumsum(dim), &[self], &loc)
    }
    /// The i64 indices that sort `self` along `dim` (ascending, or `descending`), as
    /// PyTorch's `argsort(stable=True)`: equal values keep their order, NaN sorts
    /// above every number.
    #[track_caller]
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let dim = wrap("argsort", dim, self.dim(), &loc)?;
        dispatch(Op::Argsort { dim, descending }, &[self], &loc)
    }
    /// Matrix product of `(n, k)` and `(k, m)`.
    #[track_caller]
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        dispatch(Op::Mm, &[self, other], &SourceLoc::caller())
    }
    /// Batched matrix product of `(b, n, k)` and `(b, k, m)`.
    #[track_caller]
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        dispatch(Op::Bmm, &[self, other], &SourceLoc::caller())
    }
}

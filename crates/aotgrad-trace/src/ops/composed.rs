//! Ops written in terms of core ops, as PyTorch's own decompositions write them:
//! `masked_fill`/`masked_fill_` (a `where`), `tril`/`triu` (a `where` with an index
//! mask from `arange`), `stack` (unsqueezes and a `cat`), `split`/`chunk` (narrowed
//! views), `var`/`std` (with a correction) and `argmax_all`/`argmin_all` (over the
//! flattened tensor). They trace, compile and differentiate through the core ops they emit, so
//! eager, fake and compiled modes agree by construction.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use aotgrad_ir::{DType, Dim, Scalar, SourceLoc};

fn concrete_size(t: &Tensor, op: &str, d: usize, loc: &SourceLoc) -> Result<i64> {
    match t.shape().get(d) {
        Some(Dim::Const(n)) => Ok(*n),
        Some(other) => {
            Err(Error::invalid(op, loc, format!("needs a concrete size for dim {d}, got the symbol {other}")))
        }
        None => Err(Error::invalid(op, loc, format!("dim {d} out of range for a tensor of rank {}", t.dim()))),
    }
}

fn wrap_dim(op: &str, dim: i64, rank: usize, loc: &SourceLoc) -> Result<usize> {
    super::wrap(op, dim, rank, loc)
}

impl Tensor {
    /// `value` where `mask` (bool, broadcast against `self`) is true, `self` elsewhere.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if mask.dtype() != DType::Bool {
            return Err(Error::invalid(
                "masked_fill",
                &loc,
                format!("only supports boolean masks, but got mask with dtype {}", mask.dtype()),
            ));
        }
        Tensor::where_(mask, &self.full_like(value)?, self)
    }

    /// In-place [`Tensor::masked_fill`]: `mask` must broadcast to `self`'s shape.
    #[track_caller]
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let filled = self.masked_fill(mask, value)?;
        self.copy_(&filled)
    }

    fn triangle(&self, op: &str, k: i64, lower: bool, loc: &SourceLoc) -> Result<Tensor> {
        let r = self.dim();
        if r < 2 {
            return Err(Error::invalid(op, loc, format!("input tensor must have at least 2 dimensions, got {r}")));
        }
        let (n, m) = (concrete_size(self, op, r - 2, loc)?, concrete_size(self, op, r - 1, loc)?);
        let rows = Tensor::arange(0, n, 1, DType::I64)?.unsqueeze(1)?;
        let cols = Tensor::arange(0, m, 1, DType::I64)?.unsqueeze(0)?;
        // Element (i, j) is kept when j - i <= k (tril) or j - i >= k (triu).
        let diff = cols.sub(&rows)?;
        let keep = if lower { diff.le(k)? } else { diff.ge(k)? };
        Tensor::where_(&keep, self, &self.full_like(0)?)
    }

    /// The lower triangle of the last two dims: elements with `col - row <= k` kept,
    /// the rest zero.
    #[track_caller]
    pub fn tril(&self, k: i64) -> Result<Tensor> {
        self.triangle("tril", k, true, &SourceLoc::caller())
    }

    /// The upper triangle of the last two dims: elements with `col - row >= k` kept.
    #[track_caller]
    pub fn triu(&self, k: i64) -> Result<Tensor> {
        self.triangle("triu", k, false, &SourceLoc::caller())
    }

    /// Join tensors of one shape along a new dim `dim`.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let Some(first) = tensors.first() else {
            return Err(Error::invalid("stack", &loc, "expects a non-empty list of tensors"));
        };
        let shape = first.shape();
        for (i, t) in tensors.iter().enumerate().skip(1) {
            if t.shape() != shape {
                return Err(Error::invalid(
                    "stack",
                    &loc,
                    format!(
                        "expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {i}",
                        shape.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        t.shape().iter().map(ToString::to_string).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        let d = wrap_dim("stack", dim, first.dim() + 1, &loc)? as i64;
        let parts: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, d)
    }

    /// Views of consecutive pieces of `split_size` along `dim` (the last may be smaller).
    #[track_caller]
    pub fn split(&self, split_size: i64, dim: i64) -> Result<Vec<Tensor>> {
        let loc = SourceLoc::caller();
        let d = wrap_dim("split", dim, self.dim(), &loc)?;
        let size = concrete_size(self, "split", d, &loc)?;
        if split_size <= 0 && size > 0 {
            return Err(Error::invalid("split", &loc, format!("split_size must be positive, got {split_size}")));
        }
        let mut out = Vec::new();
        let mut start = 0;
        while start < size {
            let len = split_size.min(size - start);
            out.push(self.narrow(d as i64, start, len)?);
            start += len;
        }
        if out.is_empty() {
            out.push(self.narrow(d as i64, 0, 0)?);
        }
        Ok(out)
    }

    /// At most `chunks` views along `dim`, each of `ceil(size / chunks)` elements (the
    /// last may be smaller), as PyTorch's `chunk`.
    #[track_caller]
    pub fn chunk(&self, chunks: i64, dim: i64) -> Result<Vec<Tensor>> {
        let loc = SourceLoc::caller();
        if chunks <= 0 {
            return Err(Error::invalid(
                "chunk",
                &loc,
                format!("chunk expects `chunks` to be greater than 0, got {chunks}"),
            ));
        }
        let d = wrap_dim("chunk", dim, self.dim(), &loc)?;
        let size = concrete_size(self, "chunk", d, &loc)?;
        let each = ((size + chunks - 1) / chunks).max(1);
        self.split(each, dim)
    }

    /// Variance over `dims` (all dims when empty) with Bessel's `correction`
    /// (PyTorch's default 1: divide by `N - 1`): `sum((x - mean)^2) / (N - correction)`.
    #[track_caller]
    pub fn var(&self, dims: &[i64], correction: i64, keepdim: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if !self.dtype().is_float() {
            return Err(Error::invalid("var", &loc, format!("needs a floating input, got {}", self.dtype())));
        }
        let rank = self.dim();
        let reduced: Vec<usize> = if dims.is_empty() {
            (0..rank).collect()
        } else {
            dims.iter().map(|&d| wrap_dim("var", d, rank, &loc)).collect::<Result<_>>()?
        };
        let mut n: i64 = 1;
        for &d in &reduced {
            n *= concrete_size(self, "var", d, &loc)?;
        }
        let all: Vec<i64> = reduced.iter().map(|&d| d as i64).collect();
        let centered = self.sub(&self.mean(&all, true)?)?;
        let ss = centered.mul(&centered)?.sum(&all, keepdim)?;
        // PyTorch divides by max(0, N - correction) (giving inf or NaN when it is 0).
        ss.div((n - correction).max(0) as f64)
    }

    /// Standard deviation: `sqrt(var(dims, correction))`.
    #[track_caller]
    pub fn std(&self, dims: &[i64], correction: i64, keepdim: bool) -> Result<Tensor> {
        self.var(dims, correction, keepdim)?.sqrt()
    }

    /// Index of the first maximum of all elements (of the flattened tensor), as
    /// PyTorch's `argmax()` without a dim.
    #[track_caller]
    pub fn argmax_all(&self) -> Result<Tensor> {
        self.flatten()?.argmax(0, false)
    }

    /// Index of the first minimum of all elements (of the flattened tensor).
    #[track_caller]
    pub fn argmin_all(&self) -> Result<Tensor> {
        self.flatten()?.argmin(0, false)
    }
}

//! Ops written in terms of core ops, as PyTorch's own decompositions write them:
//! `masked_fill`/`masked_fill_` (a `where`), `tril`/`triu` (a `where` with an index
//! mask from `arange`), `stack` (unsqueezes and a `cat`), `split`/`chunk` (narrowed
//! views), `var`/`std` (with a correction), `argmax_all`/`argmin_all` (over the
//! flattened tensor), `rsub`/`rdiv` (scalar on the left), `any`/`all` (counts of
//! non-zeros), `max_dim`/`min_dim` (values gathered at `argmax`/`argmin`),
//! `clamp_tensor` (`where`s), `one_hot` (a comparison with `arange`) and
//! `diagonal` (an `as_strided` view). They trace, compile and differentiate through the core ops they emit, so
//! eager, fake and compiled modes agree by construction.

use crate::decomp::apply_composite;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::RngSeed;
use aotgrad_ir::Dims;
use aotgrad_ir::{CompositeOp, DType, Dim, Scalar, SourceLoc};

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

/// **Composed ops**: decompositions into core ops (masking, triangles, stacking and
/// splitting, variance, ordering, `multinomial`, `one_hot`, `diagonal`, …). They trace,
/// differentiate and compile through the core ops they emit.
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let x = Tensor::from_f64(&[3.0, 1.0, 2.0, 5.0], &[2, 2], DType::F64)?;
/// assert_eq!(x.tril(0)?.to_vec_f64()?, vec![3.0, 0.0, 2.0, 5.0]);
/// let (values, indices) = x.max_dim(1, false)?;
/// assert_eq!((values.to_vec_f64()?, indices.to_vec_f64()?), (vec![3.0, 5.0], vec![0.0, 1.0]));
/// assert_eq!(x.var(&[1], 1, false)?.to_vec_f64()?, vec![2.0, 4.5]);
/// assert_eq!(Tensor::stack(&[&x, &x], 0)?.sizes()?, vec![2, 2, 2]);
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    /// `value` where `mask` (bool, broadcast against `self`) is true, `self` elsewhere.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let value = value.into();
        apply_composite(CompositeOp::MaskedFill { value }, &[self, mask], &SourceLoc::caller())
    }

    /// In-place [`Tensor::masked_fill`]: `mask` must broadcast to `self`'s shape.
    #[track_caller]
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let filled = self.masked_fill(mask, value)?;
        self.copy_(&filled)
    }

    /// The lower triangle of the last two dims: elements with `col - row <= k` kept,
    /// the rest zero.
    #[track_caller]
    pub fn tril(&self, k: i64) -> Result<Tensor> {
        apply_composite(CompositeOp::Tril { diagonal: k }, &[self], &SourceLoc::caller())
    }

    /// The upper triangle of the last two dims: elements with `col - row >= k` kept.
    #[track_caller]
    pub fn triu(&self, k: i64) -> Result<Tensor> {
        apply_composite(CompositeOp::Triu { diagonal: k }, &[self], &SourceLoc::caller())
    }

    /// Join tensors of one shape along a new dim `dim`.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
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
        let _site = super::user_site(&loc);
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
        Ok(multi_output_views(out, "Split"))
    }

    /// The views `self.select(dim, i)` for every `i`, as PyTorch's `unbind`.
    #[track_caller]
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let d = wrap_dim("unbind", dim, self.dim(), &loc)?;
        let size = concrete_size(self, "unbind", d, &loc)?;
        let out = (0..size).map(|i| self.select(d as i64, i)).collect::<Result<Vec<_>>>()?;
        Ok(multi_output_views(out, "Unbind"))
    }

    /// At most `chunks` views along `dim`, each of `ceil(size / chunks)` elements (the
    /// last may be smaller), as PyTorch's `chunk`.
    #[track_caller]
    pub fn chunk(&self, chunks: i64, dim: i64) -> Result<Vec<Tensor>> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
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
        let _site = super::user_site(&loc);
        if !self.dtype().is_float() {
            return Err(Error::invalid("var", &loc, format!("needs a floating input, got {}", self.dtype())));
        }
        let rank = self.dim();
        let reduced: Vec<usize> = if dims.is_empty() {
            (0..rank).collect()
        } else {
            dims.iter().map(|&d| wrap_dim("var", d, rank, &loc)).collect::<Result<_>>()?
        };
        let mut reduced = reduced;
        reduced.sort_unstable();
        reduced.dedup();
        apply_composite(CompositeOp::Var { dims: reduced, correction, keepdim }, &[self], &loc)
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

    /// The maximum over `dim` and the index of its first occurrence, as PyTorch's
    /// `max(dim, keepdim)`: the values are gathered at the indices, so the gradient
    /// goes to that one element (not split between ties).
    #[track_caller]
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.argmax(dim, true)?;
        self.select_at(dim, idx, keepdim)
    }

    /// The minimum over `dim` and the index of its first occurrence (PyTorch's
    /// `min(dim, keepdim)`).
    #[track_caller]
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.argmin(dim, true)?;
        self.select_at(dim, idx, keepdim)
    }

    #[track_caller]
    fn select_at(&self, dim: i64, idx: Tensor, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let values = self.gather(dim, &idx)?;
        if keepdim {
            Ok((values, idx))
        } else {
            Ok((values.squeeze_dim(dim)?, idx.squeeze_dim(dim)?))
        }
    }

    /// The values sorted along `dim` and the indices they came from, as PyTorch's
    /// `sort(dim, descending, stable=True)`. The values are gathered at the indices,
    /// so each gradient goes back to the element it came from.
    #[track_caller]
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.argsort(dim, descending)?;
        Ok((self.gather(dim, &idx)?, idx))
    }

    /// The `k` largest (or, with `largest = false`, smallest) values along `dim`, in
    /// order, and their indices, as PyTorch's `topk(k, dim, largest, sorted=True)`;
    /// among equal values the first comes first.
    #[track_caller]
    pub fn topk(&self, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let d = wrap_dim("topk", dim, self.dim(), &loc)?;
        let size = if self.dim() == 0 { Dim::Const(1) } else { self.size(d as i64)? };
        // A symbolic size is decided under a guard (`k <= s0`), so the result has `k`
        // elements along `dim` for every size the entry accepts.
        let fits =
            self.with_oracle("topk", &loc, |o| Ok(o.decide(&Dim::Const(k as i64), aotgrad_ir::Rel::Le, &size)))?;
        if !fits {
            let shape: Vec<String> = self.shape().iter().map(|s| s.to_string()).collect();
            return Err(Error::invalid(
                "topk",
                &loc,
                format!("k ({k}) is larger than the size {size} of dimension {dim} (shape [{}])", shape.join(", ")),
            ));
        }
        let order = self.argsort(dim, largest)?;
        let idx = if self.dim() == 0 { order } else { order.slice(dim, Some(0), Some(k as i64), 1)?.contiguous()? };
        Ok((self.gather(dim, &idx)?, idx))
    }

    /// Draws `num_samples` category indices (i64) from each row of `self`, a 1-D `[n]`
    /// or 2-D `[b, n]` tensor of non-negative weights (they need not sum to 1), as
    /// PyTorch's `multinomial`:
    /// - with `replacement`, independent draws by the inverse CDF: the first category
    ///   whose cumulative weight exceeds `u * total`, `u` uniform;
    /// - without, distinct categories by the exponential race PyTorch uses: the
    ///   `num_samples` largest `p / E` with `E ~ Exp(1)`.
    ///
    /// The uniform values come from `seed` like every random op (a fixed stream, the
    /// thread's generator, or the trace's RNG inputs), so a compiled function draws
    /// what eager draws from the same stream. Eagerly, weights that are negative,
    /// infinite or NaN, a row summing to 0, and (without replacement) fewer positive
    /// weights than samples are errors; while tracing the values are unknown.
    #[track_caller]
    pub fn multinomial(&self, num_samples: usize, replacement: bool, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let bad = |msg: String| Error::invalid("multinomial", &loc, msg);
        if !matches!(self.dim(), 1 | 2) {
            return Err(bad(format!("prob_dist must be 1 or 2 dim, got {} dims", self.dim())));
        }
        if !self.dtype().is_float() {
            return Err(bad(format!("expected a floating point weight tensor, got {}", self.dtype())));
        }
        if num_samples == 0 {
            return Err(bad("cannot sample num_samples = 0 samples".into()));
        }
        let n = self.size(-1)?;
        if let Some(n) = n.as_const() {
            if n == 0 {
                return Err(bad("the weights have no categories (their last dim has size 0)".into()));
            }
            if !replacement && num_samples as i64 > n {
                return Err(bad(format!(
                    "cannot sample n_sample ({num_samples}) > prob_dist.size(-1) ({n}) samples without replacement"
                )));
            }
        }
        if !crate::trace::is_tracing() {
            let vals = self.to_vec_f64()?;
            let len = n.as_const().unwrap_or(1).max(1) as usize;
            for row in vals.chunks(len) {
                if row.iter().any(|p| !p.is_finite() || *p < 0.0) {
                    return Err(bad("probability tensor contains either inf, nan or element < 0".into()));
                }
                let positive = row.iter().filter(|p| **p > 0.0).count();
                if positive == 0 {
                    return Err(bad("invalid multinomial distribution (sum of probabilities <= 0)".into()));
                }
                if !replacement && positive < num_samples {
                    return Err(bad(format!(
                        "invalid multinomial distribution (with replacement=False, not enough non-negative \
                         categories to sample: {positive} for {num_samples} samples)"
                    )));
                }
            }
        }
        let p = self.to(DType::F64)?;
        let mut lead: Dims = self.shape().into();
        lead.pop();
        if replacement {
            // idx = #{j : cdf[j] <= u * total}, clamped to the last category (a u
            // within rounding of 1).
            let cdf = p.cumsum(-1)?;
            let total = p.sum(&[-1], true)?;
            let mut ushape = lead.clone();
            ushape.push(Dim::Const(num_samples as i64));
            let u = Tensor::rand_dims(&ushape, DType::F64, seed)?;
            let target = u.mul(&total)?.unsqueeze(-1)?;
            let below = cdf.unsqueeze(-2)?.le(&target)?;
            let last = n.as_const().map_or(i64::MAX, |n| n - 1);
            let idx = below.sum(&[-1], false)?;
            if last == i64::MAX {
                return Ok(idx);
            }
            idx.clamp_max(last)
        } else {
            let mut ushape = lead;
            ushape.push(n);
            let u = Tensor::rand_dims(&ushape, DType::F64, seed)?;
            // E = -log(1 - u) ~ Exp(1); keys p / E (a zero weight is never drawn).
            let e = u.rsub(1.0)?.log()?.neg()?;
            let keys = p.div(&e)?;
            Ok(keys.topk(num_samples, -1, true)?.1)
        }
    }

    /// `value - self` (PyTorch's `rsub`, what `2.0 - x` computes).
    #[track_caller]
    pub fn rsub(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        self.neg()?.add(value.into())
    }

    /// `value / self` (what `2.0 / x` computes; integers divide as floats).
    #[track_caller]
    pub fn rdiv(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        self.full_like(value)?.to(promoted_float(self.dtype()))?.div(self)
    }

    /// Whether any element over `dims` (all dims when empty) is non-zero (bool).
    #[track_caller]
    pub fn any(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.ne(0)?.to(DType::I64)?.sum(dims, keepdim)?.gt(0)
    }

    /// Whether every element over `dims` (all dims when empty) is non-zero (bool).
    #[track_caller]
    pub fn all(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.eq(0)?.to(DType::I64)?.sum(dims, keepdim)?.eq(0)
    }

    /// `self` clamped elementwise between tensors `min` and `max` (each optional,
    /// broadcast): `min(max(x, lo), hi)` as PyTorch's `clamp(min=t, max=t)`. The
    /// gradient goes to `self` where it lies within the bounds (inclusive), to a bound
    /// where it replaced `self`.
    #[track_caller]
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        let mut out = self.clone();
        if let Some(lo) = min {
            out = Tensor::where_(&out.lt(lo)?, lo, &out)?;
        }
        if let Some(hi) = max {
            out = Tensor::where_(&out.gt(hi)?, hi, &out)?;
        }
        Ok(out)
    }

    /// One-hot encoding of an integer tensor: a new last dim of `num_classes` with a 1
    /// at each value (i64 result). A value outside `0..num_classes` is an error for
    /// real tensors, as in PyTorch (a traced one cannot be checked: it gives a row of
    /// zeros).
    #[track_caller]
    pub fn one_hot(&self, num_classes: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        if self.dtype() != DType::I64 {
            return Err(Error::invalid("one_hot", &loc, format!("needs an i64 tensor, got {}", self.dtype())));
        }
        if num_classes < 1 {
            return Err(Error::invalid("one_hot", &loc, format!("num_classes must be positive, got {num_classes}")));
        }
        if !self.is_fake() {
            if let Some(v) = self.to_vec_i64()?.into_iter().find(|v| !(0..num_classes).contains(v)) {
                return Err(Error::invalid(
                    "one_hot",
                    &loc,
                    format!("class values must be in 0..{num_classes}, got {v}"),
                ));
            }
        }
        apply_composite(CompositeOp::OneHot { num_classes: num_classes as usize }, &[self], &loc)
    }

    /// The diagonal of dims `dim1` and `dim2` shifted by `offset` (above the main
    /// diagonal when positive), as a view in a new last dim — PyTorch's `diagonal`.
    #[track_caller]
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let rank = self.dim();
        let (d1, d2) = (wrap_dim("diagonal", dim1, rank, &loc)?, wrap_dim("diagonal", dim2, rank, &loc)?);
        if d1 == d2 {
            return Err(Error::invalid("diagonal", &loc, format!("dim1 and dim2 cannot be the same dim ({d1})")));
        }
        let (n1, n2) = (concrete_size(self, "diagonal", d1, &loc)?, concrete_size(self, "diagonal", d2, &loc)?);
        let len = if offset >= 0 { n1.min(n2 - offset) } else { (n1 + offset).min(n2) }.max(0);
        let m = self.meta();
        let (s1, s2) = (m.strides[d1].clone(), m.strides[d2].clone());
        let mut size: Dims = (Vec::with_capacity(rank - 1)).into();
        let mut stride: Dims = (Vec::with_capacity(rank - 1)).into();
        for d in (0..rank).filter(|&d| d != d1 && d != d2) {
            size.push(m.shape[d].clone());
            stride.push(m.strides[d].clone());
        }
        size.push(Dim::Const(len));
        stride.push(s1.add(&s2));
        let start = if len == 0 {
            Dim::Const(0)
        } else if offset >= 0 {
            s2.mul(&Dim::Const(offset))
        } else {
            s1.mul(&Dim::Const(-offset))
        };
        self.as_strided_dims(&size, &stride, m.offset.add(&start))
    }
}

/// The float dtype a division by a tensor of `dtype` computes in.
fn promoted_float(dtype: DType) -> DType {
    if dtype.is_float() {
        dtype
    } else {
        DType::DEFAULT_FLOAT
    }
}

// ---- default decompositions of the composites above (`decomp::rules` calls them) ----

/// `where(mask, full_like(x, value), x)`.
pub(crate) fn masked_fill_rule(x: &Tensor, mask: &Tensor, value: Scalar) -> Result<Tensor> {
    Tensor::where_(mask, &x.full_like(value)?, x)
}

/// Keeps element `(i, j)` of the last two dims when `j - i <= k` (lower) or
/// `j - i >= k` (upper), from an `arange` index mask.
pub(crate) fn triangle_rule(x: &Tensor, k: i64, lower: bool) -> Result<Tensor> {
    let shape = x.shape();
    let r = shape.len();
    let rows = Tensor::arange_dim(&shape[r - 2])?.unsqueeze(1)?;
    let cols = Tensor::arange_dim(&shape[r - 1])?.unsqueeze(0)?;
    let diff = cols.sub(&rows)?;
    let keep = if lower { diff.le(k)? } else { diff.ge(k)? };
    Tensor::where_(&keep, x, &x.full_like(0)?)
}

/// `sum((x - mean)^2) / max(0, N - correction)` over `dims` (PyTorch gives inf or NaN
/// when the divisor is 0).
pub(crate) fn var_rule(x: &Tensor, dims: &[usize], correction: i64, keepdim: bool, loc: &SourceLoc) -> Result<Tensor> {
    let mut n: i64 = 1;
    for &d in dims {
        n *= concrete_size(x, "var", d, loc)?;
    }
    let all: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let centered = x.sub(&x.mean(&all, true)?)?;
    let ss = centered.mul(&centered)?.sum(&all, keepdim)?;
    ss.div((n - correction).max(0) as f64)
}

/// `(x.unsqueeze(-1) == arange(num_classes)).to(i64)`.
pub(crate) fn one_hot_rule(x: &Tensor, num_classes: usize) -> Result<Tensor> {
    let classes = Tensor::arange(0, num_classes as i64, 1, DType::I64)?;
    x.unsqueeze(-1)?.eq(&classes)?.to(DType::I64)
}

/// Marks the outputs of a function returning several views (PyTorch's
/// `MULTI_OUTPUT_NODE` creation meta) when they are differentiable views, i.e. made in
/// grad mode: autograd then refuses in-place ops on them.
fn multi_output_views(out: Vec<Tensor>, backward: &'static str) -> Vec<Tensor> {
    if crate::is_grad_enabled() {
        for (i, t) in out.iter().enumerate() {
            let mut st = t.lock();
            if st.grad_view {
                st.multi_output_view = Some((backward.to_string(), i));
            }
        }
    }
    out
}

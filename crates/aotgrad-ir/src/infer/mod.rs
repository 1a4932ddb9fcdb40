//! Shape, stride and dtype inference for every core op: read-only, typed errors.
//!
//! [`infer`] computes the [`TensorMeta`] an op produces from the metas of its
//! arguments, following PyTorch's rules for sizes, strides, storage offset and dtype,
//! and rejects what PyTorch rejects with a [`ShapeError`] naming the op and shapes.
//!
//! Two conventions hold throughout:
//! - every decision on a possibly symbolic dim goes through the [`DimOracle`]
//!   (`oracle.decide(a, rel, b)`), so a symbolic tracer can record the guards it relied
//!   on. Comparisons whose answer does not depend on any symbol (both sides constant,
//!   or a constant difference such as `s0 + 1` vs `s0`) are decided directly and
//!   record nothing;
//! - views keep the storage of their input and compute PyTorch's strides and offset,
//!   while every other op produces a fresh, dense, row-major (C-contiguous) result at
//!   offset 0. (PyTorch's TensorIterator and `clone` may instead keep an input's
//!   dense permuted layout; we always produce row-major results.)
//!
//! The families live in submodules: [`pointwise`], [`reduce`], [`views`],
//! [`indexing`], [`creation`], [`linalg`], [`conv`] and [`composite`]; [`shapes`] holds the
//! size and stride arithmetic shared with the tracer (view/expand/slice resolution).

// `ShapeError` carries pre-formatted shapes (several `String`s); errors are the cold
// path and the error type is shared crate-wide, so returning it unboxed is deliberate.
#![allow(clippy::result_large_err)]

pub mod composite;
pub mod conv;
pub mod creation;
pub mod indexing;
pub mod linalg;
pub mod pointwise;
pub mod reduce;
pub mod shapes;
pub mod views;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests_indexing;
#[cfg(test)]
mod tests_ops;
#[cfg(test)]
mod tests_views;

use crate::dtype::{DType, Scalar};
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::{DimList, TensorMeta};
use crate::op::Op;
use crate::sym::{Dim, DimOracle, Rel};

pub use creation::arange_len;
pub use pointwise::{like_layout, non_overlapping_and_dense};
pub use shapes::{
    expand_geometry, has_internal_overlap, normalize_slice, resolve_expand_shape, resolve_view_shape, slice_len,
    squeeze_dims, view_strides,
};

/// Result type of inference.
pub type Result<T> = std::result::Result<T, ShapeError>;

/// Infer the result metadata of `op` applied to `args`.
pub fn infer(op: &Op, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    let name = op.name();
    if let Some((i, m)) = args.iter().enumerate().find(|(_, m)| m.shape.len() != m.strides.len()) {
        return Err(ShapeError::Invalid {
            op: name,
            msg: format!(
                "internal error: argument {i} has {} sizes but {} strides ({})",
                m.shape.len(),
                m.strides.len(),
                shape_str(&m.shape)
            ),
        });
    }
    infer_named(op, &name, args, oracle)
}

/// [`infer`] with the op name used in error messages given explicitly (an in-place op
/// reports its own name, `mul_`, for errors found while inferring its inner `mul`).
pub(crate) fn infer_named(op: &Op, name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::BinaryScalar(..)
        | Op::Compare(_)
        | Op::CompareScalar(..)
        | Op::Where
        | Op::Clamp { .. }
        | Op::Cast(_)
        | Op::Copy
        | Op::FullLike { .. }
        | Op::Bernoulli { .. } => pointwise::infer_pointwise(op, name, args, oracle),
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::ArgMin { .. } => reduce::infer_reduce(op, name, args, oracle),
        Op::Cumsum(_) | Op::Argsort { .. } => reduce::infer_scan(op, name, args),
        Op::Mm | Op::Bmm => linalg::infer_linalg(op, name, args, oracle),
        Op::View(_)
        | Op::Permute(_)
        | Op::Transpose(..)
        | Op::T
        | Op::Expand(_)
        | Op::Squeeze(_)
        | Op::Unsqueeze(_)
        | Op::Slice { .. }
        | Op::Select { .. }
        | Op::AsStrided { .. }
        | Op::Alias => views::infer_view(op, name, args, oracle),
        Op::Clone => {
            arity(name, args, 1)?;
            Ok(args[0].to_contiguous())
        }
        Op::UnsafeView(shape) => {
            arity(name, args, 1)?;
            views::unsafe_view(name, args[0], shape, oracle)
        }
        Op::InPlace(inner) => infer_inplace(inner, name, args, oracle),
        Op::MetaInPlace(inner) => match inner.as_ref() {
            Op::T | Op::Transpose(..) | Op::Unsqueeze(_) | Op::Squeeze(_) | Op::AsStrided { .. } => {
                views::infer_view(inner, name, args, oracle)
            }
            other => Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!(
                    "in-place metadata change must wrap t, transpose, unsqueeze, squeeze or as_strided, not {}",
                    other.name()
                ),
            }),
        },
        Op::Full { .. } | Op::Arange { .. } | Op::Rand { .. } | Op::Randn { .. } => {
            creation::infer_creation(op, name, args)
        }
        Op::IndexSelect(_)
        | Op::Gather(_)
        | Op::ScatterAdd(_)
        | Op::Cat(_)
        | Op::SliceScatter { .. }
        | Op::SelectScatter { .. }
        | Op::AsStridedScatter { .. } => indexing::infer_indexing(op, name, args, oracle),
        Op::Conv2d(_)
        | Op::Conv2dInputGrad { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::MaxPool2d(_)
        | Op::MaxPool2dGrad(_) => conv::infer_conv(op, name, args, oracle),
        Op::Composite(c) => composite::infer_composite(c, name, args, oracle),
    }
}

/// `InPlace(inner)`: the inner pointwise op's result must fit `args[0]` exactly
/// (shape after broadcasting, dtype castable without losing category), and `args[0]`
/// must not write one memory location twice. The result is `args[0]`'s meta.
fn infer_inplace(inner: &Op, name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if !inner.is_pointwise() {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("in-place form exists only for pointwise ops, not {}", inner.name()),
        });
    }
    let result = infer_named(inner, name, args, oracle)?;
    let target = args.first().ok_or_else(|| arity_error(name, "at least 1", 0))?;
    let inplace_err = || ShapeError::InPlace {
        op: name.into(),
        result: shape_str(&result.shape),
        result_dtype: result.dtype.to_string(),
        target: shape_str(&target.shape),
        target_dtype: target.dtype.to_string(),
    };
    if overlaps_internally(target, oracle) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "unsupported operation: more than one element of the written-to tensor refers to a single memory \
                 location (shape {}, strides {}); clone it before writing",
                shape_str(&target.shape),
                shape_str(&target.strides)
            ),
        });
    }
    if result.rank() != target.rank() || !result.shape.iter().zip(&target.shape).all(|(r, t)| dim_eq(oracle, r, t)) {
        return Err(inplace_err());
    }
    if !target.dtype.can_hold(result.dtype) {
        return Err(inplace_err());
    }
    Ok((*target).clone())
}

/// [`has_internal_overlap`] deciding `size > 1` of symbolic dims through the oracle.
pub(crate) fn overlaps_internally(meta: &TensorMeta, oracle: &mut dyn DimOracle) -> bool {
    shapes::overlap_where(meta, |size| dim_lt(oracle, &Dim::Const(1), size))
}

/// Broadcast two shapes (right-aligned; size-1 dims stretch).
///
/// Structurally equal dims (`s0` and `s0`) broadcast to themselves without asking the
/// oracle; otherwise it is asked `a == 1`, then `b == 1`, then `a == b`, like PyTorch's
/// `infer_size`. The error names both shapes and the offending dim of the result.
pub fn broadcast_shapes(op: &str, a: &[Dim], b: &[Dim], oracle: &mut dyn DimOracle) -> Result<Dims> {
    let n = a.len().max(b.len());
    let one = Dim::Const(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = (i + a.len()).checked_sub(n).map_or(&one, |j| &a[j]);
        let db = (i + b.len()).checked_sub(n).map_or(&one, |j| &b[j]);
        let d = if da == db || dim_eq(oracle, db, &one) {
            da.clone()
        } else if dim_eq(oracle, da, &one) {
            db.clone()
        } else if dim_eq(oracle, da, db) {
            da.clone()
        } else {
            return Err(ShapeError::Broadcast {
                op: op.into(),
                lhs: shape_str(a),
                rhs: shape_str(b),
                dim: i,
                lhs_size: da.to_string(),
                rhs_size: db.to_string(),
            });
        };
        out.push(d);
    }
    Ok(out.into())
}

/// Wrap a possibly negative dim index into `0..rank` (rank 0 accepts 0 and -1).
pub fn wrap_dim(op: &str, dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        return Err(ShapeError::DimOutOfRange { op: op.into(), dim, rank });
    }
    Ok(if dim < 0 { (dim + r) as usize } else { dim as usize })
}

// ---- shared helpers ------------------------------------------------------------------

/// `[a, b, c]` text of a shape.
pub(crate) fn shape_str(shape: &[Dim]) -> String {
    DimList(shape).to_string()
}

/// `a rel b`, decided directly when both are constants or `b - a` is a constant, else
/// by the oracle (also when the difference overflows i64).
pub(crate) fn decide(oracle: &mut dyn DimOracle, a: &Dim, rel: Rel, b: &Dim) -> bool {
    if let (Dim::Const(x), Dim::Const(y)) = (a, b) {
        return rel.holds(*x, *y);
    }
    match b.checked_sub(a) {
        Some(Dim::Const(d)) => rel.holds(0, d),
        Some(Dim::Sym(_)) | None => oracle.decide(a, rel, b),
    }
}

/// The error for size/stride/offset arithmetic that does not fit in i64.
pub(crate) fn overflow(op: &str, what: &str, expr: String) -> ShapeError {
    ShapeError::Invalid { op: op.into(), msg: format!("{what} overflows i64: {expr}") }
}

/// `a + b`, or an `Invalid` error saying `what` overflows.
pub(crate) fn add_dims(op: &str, what: &str, a: &Dim, b: &Dim) -> Result<Dim> {
    a.checked_add(b).ok_or_else(|| overflow(op, what, format!("{a} + {b}")))
}

/// `a - b`, or an `Invalid` error saying `what` overflows.
pub(crate) fn sub_dims(op: &str, what: &str, a: &Dim, b: &Dim) -> Result<Dim> {
    a.checked_sub(b).ok_or_else(|| overflow(op, what, format!("{a} - ({b})")))
}

/// `a * b`, or an `Invalid` error saying `what` overflows.
pub(crate) fn mul_dims(op: &str, what: &str, a: &Dim, b: &Dim) -> Result<Dim> {
    a.checked_mul(b).ok_or_else(|| overflow(op, what, format!("({a}) * ({b})")))
}

/// The product of `dims`, or an `Invalid` error saying `what` overflows.
pub(crate) fn product_dims(op: &str, what: &str, dims: &[Dim]) -> Result<Dim> {
    Dim::checked_product(dims).ok_or_else(|| overflow(op, what, format!("product of {}", shape_str(dims))))
}

/// `a == b` (see [`decide`]).
pub(crate) fn dim_eq(oracle: &mut dyn DimOracle, a: &Dim, b: &Dim) -> bool {
    decide(oracle, a, Rel::Eq, b)
}

/// `a < b` (see [`decide`]).
pub(crate) fn dim_lt(oracle: &mut dyn DimOracle, a: &Dim, b: &Dim) -> bool {
    decide(oracle, a, Rel::Lt, b)
}

/// `a <= b` (see [`decide`]).
pub(crate) fn dim_le(oracle: &mut dyn DimOracle, a: &Dim, b: &Dim) -> bool {
    decide(oracle, a, Rel::Le, b)
}

/// An arity error.
pub(crate) fn arity_error(op: &str, expected: &str, got: usize) -> ShapeError {
    ShapeError::Arity { op: op.into(), expected: expected.into(), got }
}

/// Require exactly `n` tensor arguments.
pub(crate) fn arity(op: &str, args: &[&TensorMeta], n: usize) -> Result<()> {
    if args.len() != n {
        return Err(arity_error(op, &n.to_string(), args.len()));
    }
    Ok(())
}

/// Arguments of a random op: `n` regular ones, optionally followed by the RNG state
/// (two 0-d `i64` tensors: the seed and the base counter offset; see [`Op::Rand`]).
pub(crate) fn rng_arity(op: &str, args: &[&TensorMeta], n: usize) -> Result<()> {
    if args.len() == n {
        return Ok(());
    }
    if args.len() != n + 2 {
        return Err(arity_error(op, &format!("{n} (or {} with the RNG state)", n + 2), args.len()));
    }
    for (what, m) in ["seed", "offset"].iter().zip(&args[n..]) {
        if m.dtype != DType::I64 || m.rank() != 0 {
            return Err(ShapeError::DType {
                op: op.into(),
                dtype: format!("{m}"),
                what: format!("RNG {what} (must be a 0-d i64 tensor)"),
            });
        }
    }
    Ok(())
}

/// Reject a scalar that `dtype` cannot hold, as PyTorch does ("value cannot be
/// converted to type int32 without overflow"): integers outside an integer dtype's
/// range, finite floats beyond a floating dtype's largest value, or a float too large
/// for an integer dtype. NaN and infinities are fine for floating dtypes.
pub fn check_scalar_fits(op: &str, value: Scalar, dtype: DType) -> Result<()> {
    let (lo, hi): (f64, f64) = match dtype {
        DType::Bool => return Ok(()),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::F16 => (-65504.0, 65504.0),
        DType::BF16 => (-3.389_531_4e38, 3.389_531_4e38),
        DType::F32 => (f32::MIN as f64, f32::MAX as f64),
        DType::F64 => return Ok(()),
    };
    let fits = match value {
        Scalar::Bool(_) => true,
        Scalar::Int(v) => match dtype {
            DType::I32 => i32::try_from(v).is_ok(),
            _ => true,
        },
        Scalar::Float(v) if dtype.is_float() => !v.is_finite() || (lo..=hi).contains(&v),
        // A float into an integer dtype truncates toward zero (NaN and infinities never fit).
        Scalar::Float(v) => v.is_finite() && v.trunc() >= lo && v.trunc() <= hi,
    };
    if fits {
        Ok(())
    } else {
        Err(ShapeError::Invalid {
            op: op.into(),
            msg: format!("value {value} cannot be converted to type {dtype} without overflow"),
        })
    }
}

/// Reject a constant negative size (symbolic sizes are non-negative by construction),
/// and shapes whose element count (each size counted as at least 1, as contiguous
/// strides do) overflows `i64`.
pub(crate) fn check_sizes_non_negative(op: &str, shape: &[Dim]) -> Result<()> {
    if let Some(d) = shape.iter().find(|d| d.as_const().is_some_and(|c| c < 0)) {
        return Err(ShapeError::Invalid {
            op: op.into(),
            msg: format!("negative dimension {d} in shape {}", shape_str(shape)),
        });
    }
    let fits = shape.iter().filter_map(Dim::as_const).try_fold(1i64, |acc, c| acc.checked_mul(c.max(1))).is_some();
    if !fits {
        return Err(ShapeError::Invalid {
            op: op.into(),
            msg: format!("shape {} has more elements than fit in i64", shape_str(shape)),
        });
    }
    Ok(())
}

/// A fresh dense row-major result at offset 0 (after [`check_sizes_non_negative`]).
pub(crate) fn dense(op: &str, shape: Dims, dtype: DType) -> Result<TensorMeta> {
    check_sizes_non_negative(op, &shape)?;
    // Row-major strides with checked arithmetic: symbolic sizes (from parsed text, say)
    // can have coefficients whose products overflow.
    let mut strides = vec![Dim::Const(1); shape.len()];
    let mut acc = Dim::Const(1);
    for i in (0..shape.len()).rev() {
        strides[i] = acc.clone();
        let s = match &shape[i] {
            Dim::Const(c) => Dim::Const((*c).max(1)),
            d => d.clone(),
        };
        acc = acc.checked_mul(&s).ok_or_else(|| ShapeError::Invalid {
            op: op.into(),
            msg: format!("the strides of shape {} overflow i64", shape_str(&shape)),
        })?;
    }
    Ok(TensorMeta { shape, strides: strides.into(), offset: Dim::Const(0), dtype })
}

/// Require `dim < rank` for a dim already given as non-negative (rank 0 accepts dim 0
/// when `scalar_ok`, like PyTorch's `wrap_dim`).
pub(crate) fn check_dim(op: &str, dim: usize, rank: usize, scalar_ok: bool) -> Result<()> {
    let limit = if scalar_ok { rank.max(1) } else { rank };
    if dim >= limit {
        return Err(ShapeError::DimOutOfRange { op: op.into(), dim: dim as i64, rank });
    }
    Ok(())
}

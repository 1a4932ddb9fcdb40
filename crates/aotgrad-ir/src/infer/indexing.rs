//! Indexing ops: `index_select`, `gather`, `scatter_add`, `cat`, and the scatter forms
//! of the views (`slice_scatter`, `select_scatter`, `as_strided_scatter`).

use super::views::infer_view;
use super::{arity, arity_error, check_dim, dense, dim_eq, dim_le, shape_str, Result};
use crate::dtype::{result_type, DType, Operand};
use crate::error::ShapeError;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::{Dim, DimOracle};

/// Infer an indexing op.
pub(crate) fn infer_indexing(
    op: &Op,
    name: &str,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    match op {
        Op::IndexSelect(dim) => index_select(name, args, *dim, oracle),
        Op::Gather(dim) => gather(name, args, *dim, oracle),
        Op::ScatterAdd(dim) => scatter_add(name, args, *dim, oracle),
        Op::Cat(dim) => cat(name, args, *dim, oracle),
        Op::SliceScatter { dim, start, end, step } => {
            let view = Op::Slice { dim: *dim, start: start.clone(), end: end.clone(), step: *step };
            scatter_view(name, "slice", &view, args, oracle)
        }
        Op::SelectScatter { dim, index } => {
            scatter_view(name, "select", &Op::Select { dim: *dim, index: index.clone() }, args, oracle)
        }
        Op::AsStridedScatter { size, stride, offset } => {
            let view = Op::AsStrided { size: size.clone(), stride: stride.clone(), offset: offset.clone() };
            scatter_view(name, "as_strided view", &view, args, oracle)
        }
        other => Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not an indexing op", other.name()) }),
    }
}

/// Require an integer index dtype (`allowed` lists the accepted ones).
fn check_index_dtype(name: &str, what: &str, dtype: DType, allowed: &[DType]) -> Result<()> {
    if !allowed.contains(&dtype) {
        let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: format!("{what} (expected {})", names.join(" or ")),
        });
    }
    Ok(())
}

/// `index_select(x, dim, index)`: `index` is 0-d or 1-D and integral; the result is
/// `x`'s shape with `dim` replaced by the number of indices.
fn index_select(name: &str, args: &[&TensorMeta], dim: usize, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    arity(name, args, 2)?;
    let (x, index) = (args[0], args[1]);
    check_dim(name, dim, x.rank(), true)?;
    if index.rank() > 1 {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("index must be 0-D or 1-D, got shape {}", shape_str(&index.shape)),
        });
    }
    check_index_dtype(name, "index", index.dtype, &[DType::I32, DType::I64])?;
    let count = index.numel();
    if x.rank() == 0 {
        if !dim_eq(oracle, &count, &Dim::Const(1)) {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!("index to a 0-d tensor can have only 1 value, got shape {}", shape_str(&index.shape)),
            });
        }
        return Ok(x.to_contiguous());
    }
    let mut shape = x.shape.clone();
    shape[dim] = count;
    dense(name, shape, x.dtype)
}

/// `index.size(d) <= limit.size(d)` for every `d` (except `skip`).
fn sizes_within(
    index: &TensorMeta,
    limit: &TensorMeta,
    skip: Option<usize>,
    oracle: &mut dyn DimOracle,
) -> Option<usize> {
    (0..index.rank()).find(|&d| Some(d) != skip && !dim_le(oracle, &index.shape[d], &limit.shape[d]))
}

/// `gather(x, dim, index)`: i64 index of `x`'s rank with `index.size(d) <= x.size(d)`
/// for `d != dim`; the result has the index's shape and `x`'s dtype.
fn gather(name: &str, args: &[&TensorMeta], dim: usize, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    arity(name, args, 2)?;
    let (x, index) = (args[0], args[1]);
    check_dim(name, dim, x.rank(), true)?;
    check_index_dtype(name, "index", index.dtype, &[DType::I64])?;
    if index.rank() != x.rank() {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "index {} must have the same number of dimensions as input {}",
                shape_str(&index.shape),
                shape_str(&x.shape)
            ),
        });
    }
    if let Some(d) = sizes_within(index, x, Some(dim), oracle) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "size does not match at dimension {d}: expected index {} to be no larger than self {} apart from \
                 dimension {dim}",
                shape_str(&index.shape),
                shape_str(&x.shape)
            ),
        });
    }
    dense(name, index.shape.clone(), x.dtype)
}

/// `scatter_add(x, dim, index, src)`: i64 index, all three of one rank,
/// `index.size(d) <= src.size(d)` everywhere and `<= x.size(d)` for `d != dim`;
/// `src` has `x`'s dtype. The result is a fresh tensor like `x`.
fn scatter_add(name: &str, args: &[&TensorMeta], dim: usize, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    arity(name, args, 3)?;
    let (x, index, src) = (args[0], args[1], args[2]);
    check_dim(name, dim, x.rank(), true)?;
    check_index_dtype(name, "index", index.dtype, &[DType::I64])?;
    if src.dtype != x.dtype {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: src.dtype.to_string(),
            what: format!("src (expected self's dtype {})", x.dtype),
        });
    }
    let shapes =
        || format!("self {}, index {}, src {}", shape_str(&x.shape), shape_str(&index.shape), shape_str(&src.shape));
    if index.rank() != x.rank() || src.rank() != x.rank() {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("index and src must have the same number of dimensions as self: {}", shapes()),
        });
    }
    let bad = sizes_within(index, x, Some(dim), oracle).or_else(|| sizes_within(index, src, None, oracle));
    if let Some(d) = bad {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "index is larger than self apart from dimension {dim}, or larger than src, at dimension {d}: {}",
                shapes()
            ),
        });
    }
    Ok(x.to_contiguous())
}

/// `cat(tensors, dim)`: tensors of one rank with equal sizes except along `dim`;
/// dtype promoted across all of them. As in PyTorch, 1-D tensors of size 0 are
/// skipped when checking shapes (legacy behaviour).
fn cat(name: &str, args: &[&TensorMeta], dim: usize, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if args.is_empty() {
        return Err(arity_error(name, "at least 1", 0));
    }
    let dtype = result_type(&args.iter().map(|m| Operand::of(m)).collect::<Vec<_>>());
    let skip = |m: &TensorMeta| m.rank() == 1 && m.shape[0] == Dim::Const(0);
    let kept: Vec<(usize, &TensorMeta)> = args.iter().copied().enumerate().filter(|(_, m)| !skip(m)).collect();
    if let Some((i, _)) = args.iter().enumerate().find(|(_, m)| m.rank() == 0) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("zero-dimensional tensor (at position {i}) cannot be concatenated"),
        });
    }
    let Some(&(_, first)) = kept.first() else {
        return dense(name, crate::dims![Dim::Const(0)], dtype);
    };
    check_dim(name, dim, first.rank(), false)?;
    let mut shape = first.shape.clone();
    for &(i, m) in &kept[1..] {
        let mismatch = m.rank() != first.rank()
            || (0..m.rank()).any(|d| d != dim && !dim_eq(oracle, &m.shape[d], &first.shape[d]));
        if mismatch {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!(
                    "sizes of tensors must match except in dimension {dim}: tensor 0 has shape {}, tensor {i} has \
                     shape {}",
                    shape_str(&first.shape),
                    shape_str(&m.shape)
                ),
            });
        }
        shape[dim] = super::add_dims(name, "concatenated size", &shape[dim], &m.shape[dim])?;
    }
    dense(name, shape, dtype)
}

/// `[base, src]`: `src` must have the shape of `view(base)`; the result is a fresh
/// tensor like `base`.
fn scatter_view(
    name: &str,
    what: &str,
    view: &Op,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    arity(name, args, 2)?;
    let (base, src) = (args[0], args[1]);
    let v = infer_view(view, name, &[base], oracle)?;
    let same = v.rank() == src.rank() && v.shape.iter().zip(&src.shape).all(|(a, b)| dim_eq(oracle, a, b));
    if !same {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "expected src to have a size equal to the {what} of self: src size {}, {what} size {} (self {})",
                shape_str(&src.shape),
                shape_str(&v.shape),
                shape_str(&base.shape)
            ),
        });
    }
    // A clone of `base` with the view written (PyTorch's scatters clone with the
    // preserved memory format).
    super::like_layout(name, base, base.dtype, oracle)
}

//! View ops: the result shares `args[0]`'s storage; sizes, strides and storage offset
//! are computed exactly as PyTorch does, dtype is kept.

use super::shapes::{expand_geometry, slice_len, view_strides};
use super::{
    add_dims, arity, check_dim, check_sizes_non_negative, dim_eq, dim_le, dim_lt, mul_dims, overflow, product_dims,
    shape_str, Result,
};
use crate::error::ShapeError;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::{Dim, DimOracle};

/// Infer a view op (`View`, `Permute`, `Transpose`, `T`, `Expand`, `Squeeze`,
/// `Unsqueeze`, `Slice`, `Select`, `AsStrided`, `Alias`).
pub(crate) fn infer_view(op: &Op, name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    arity(name, args, 1)?;
    let x = args[0];
    match op {
        Op::View(shape) => view(name, x, shape, oracle),
        Op::Permute(perm) => permute(name, x, perm),
        Op::Transpose(a, b) => transpose(name, x, *a, *b),
        Op::T => {
            if x.rank() > 2 {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!("t() expects a tensor with <= 2 dimensions, but got shape {}", shape_str(&x.shape)),
                });
            }
            if x.rank() == 2 {
                transpose(name, x, 0, 1)
            } else {
                Ok(x.clone())
            }
        }
        Op::Expand(shape) => {
            let target: Vec<Option<Dim>> = shape.iter().cloned().map(Some).collect();
            let (shape, strides) = expand_geometry(name, &x.shape, &x.strides, &target, oracle)?;
            Ok(TensorMeta { shape, strides, offset: x.offset.clone(), dtype: x.dtype })
        }
        Op::Squeeze(dims) => squeeze(name, x, dims, oracle),
        Op::Unsqueeze(dim) => {
            let dim = *dim;
            if dim > x.rank() {
                return Err(ShapeError::DimOutOfRange { op: name.into(), dim: dim as i64, rank: x.rank() });
            }
            let stride = if dim < x.rank() {
                mul_dims(name, "unsqueezed stride", &x.shape[dim], &x.strides[dim])?
            } else {
                Dim::Const(1)
            };
            let mut m = x.clone();
            m.shape.insert(dim, Dim::Const(1));
            m.strides.insert(dim, stride);
            Ok(m)
        }
        Op::Slice { dim, start, end, step } => slice(name, x, *dim, start, end, *step, oracle),
        Op::Select { dim, index } => select(name, x, *dim, index, oracle),
        Op::AsStrided { size, stride, offset } => as_strided(name, x, size, stride, offset),
        Op::Alias => Ok(x.clone()),
        other => Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not a view op", other.name()) }),
    }
}

/// `view(shape)`: same numel, strides from PyTorch's `computeStride`.
fn view(name: &str, x: &TensorMeta, shape: &[Dim], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    check_view_numel(name, x, shape, oracle)?;
    let err = |why: String| ShapeError::View { op: name.into(), from: shape_str(&x.shape), to: shape_str(shape), why };
    let Some(strides) = view_strides(&x.shape, &x.strides, shape, oracle) else {
        return Err(err(format!(
            "size is not compatible with the input's size and stride (strides {}); use reshape",
            shape_str(&x.strides)
        )));
    };
    Ok(TensorMeta { shape: shape.into(), strides, offset: x.offset.clone(), dtype: x.dtype })
}

/// The sizes of a `view`/`_unsafe_view` of `x`: non-negative, with `x`'s numel.
fn check_view_numel(name: &str, x: &TensorMeta, shape: &[Dim], oracle: &mut dyn DimOracle) -> Result<()> {
    check_sizes_non_negative(name, shape)?;
    let numel = product_dims(name, "number of elements", &x.shape)?;
    if !dim_eq(oracle, &numel, &product_dims(name, "number of elements", shape)?) {
        return Err(ShapeError::View {
            op: name.into(),
            from: shape_str(&x.shape),
            to: shape_str(shape),
            why: format!("shape '{}' is invalid for input of size {numel}", shape_str(shape)),
        });
    }
    Ok(())
}

/// `_unsafe_view(shape)`: `view`'s size rules; any layout works since the result is a
/// fresh contiguous tensor (the elements in row-major order).
pub(crate) fn unsafe_view(name: &str, x: &TensorMeta, shape: &[Dim], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    check_view_numel(name, x, shape, oracle)?;
    Ok(TensorMeta::contiguous(shape.to_vec(), x.dtype))
}

/// `permute(perm)`: `perm` must be a permutation of `0..rank`.
fn permute(name: &str, x: &TensorMeta, perm: &[usize]) -> Result<TensorMeta> {
    let r = x.rank();
    if perm.len() != r {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "number of dims in permutation {perm:?} ({}) does not match the rank of the input {} ({r})",
                perm.len(),
                shape_str(&x.shape)
            ),
        });
    }
    let mut seen = vec![false; r];
    for &p in perm {
        check_dim(name, p, r, false)?;
        if std::mem::replace(&mut seen[p], true) {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!("repeated dim {p} in permutation {perm:?}"),
            });
        }
    }
    Ok(TensorMeta {
        shape: perm.iter().map(|&p| x.shape[p].clone()).collect(),
        strides: perm.iter().map(|&p| x.strides[p].clone()).collect(),
        offset: x.offset.clone(),
        dtype: x.dtype,
    })
}

/// `transpose(a, b)`: swap two dims (a 0-d tensor accepts dims 0, 0).
fn transpose(name: &str, x: &TensorMeta, a: usize, b: usize) -> Result<TensorMeta> {
    check_dim(name, a, x.rank(), true)?;
    check_dim(name, b, x.rank(), true)?;
    let mut m = x.clone();
    if x.rank() > 0 {
        m.shape.swap(a, b);
        m.strides.swap(a, b);
    }
    Ok(m)
}

/// `squeeze(dims)`: every listed dim (sorted, distinct) must have size 1.
fn squeeze(name: &str, x: &TensorMeta, dims: &[usize], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if !dims.windows(2).all(|w| w[0] < w[1]) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("squeeze dims {dims:?} must be sorted and distinct"),
        });
    }
    if x.rank() == 0 {
        // PyTorch accepts dim 0 / -1 on a 0-d tensor and returns it unchanged.
        if let Some(&d) = dims.iter().find(|&&d| d > 0) {
            return Err(ShapeError::DimOutOfRange { op: name.into(), dim: d as i64, rank: 0 });
        }
        return Ok(x.clone());
    }
    for &d in dims {
        check_dim(name, d, x.rank(), false)?;
        if !dim_eq(oracle, &x.shape[d], &Dim::Const(1)) {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!("cannot squeeze dim {d} of size {} in shape {}", x.shape[d], shape_str(&x.shape)),
            });
        }
    }
    let keep = |i: &usize| !dims.contains(i);
    Ok(TensorMeta {
        shape: (0..x.rank()).filter(keep).map(|i| x.shape[i].clone()).collect(),
        strides: (0..x.rank()).filter(keep).map(|i| x.strides[i].clone()).collect(),
        offset: x.offset.clone(),
        dtype: x.dtype,
    })
}

/// `x[start:end:step]` along `dim`: bounds must already be clamped
/// (`0 <= start <= end <= size`).
fn slice(
    name: &str,
    x: &TensorMeta,
    dim: usize,
    start: &Dim,
    end: &Dim,
    step: i64,
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    if x.rank() == 0 {
        return Err(ShapeError::Invalid { op: name.into(), msg: "slice() cannot be applied to a 0-dim tensor".into() });
    }
    check_dim(name, dim, x.rank(), false)?;
    if step < 1 {
        return Err(ShapeError::Invalid { op: name.into(), msg: format!("slice step must be positive, got {step}") });
    }
    let size = &x.shape[dim];
    let zero = Dim::Const(0);
    if !(dim_le(oracle, &zero, start) && dim_le(oracle, start, end) && dim_le(oracle, end, size)) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "slice bounds [{start}, {end}) are not within 0..={size} of dim {dim} of shape {}",
                shape_str(&x.shape)
            ),
        });
    }
    let len = slice_len(name, start, end, step)?;
    let mut m = x.clone();
    m.offset = add_dims(name, "storage offset", &x.offset, &mul_dims(name, "storage offset", start, &x.strides[dim])?)?;
    m.shape[dim] = len;
    m.strides[dim] = mul_dims(name, "slice stride", &x.strides[dim], &Dim::Const(step))?;
    Ok(m)
}

/// `x.select(dim, index)`: `0 <= index < size`; the dim is dropped.
fn select(name: &str, x: &TensorMeta, dim: usize, index: &Dim, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if x.rank() == 0 {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: "select() cannot be applied to a 0-dim tensor".into(),
        });
    }
    check_dim(name, dim, x.rank(), false)?;
    let size = &x.shape[dim];
    if !(dim_le(oracle, &Dim::Const(0), index) && dim_lt(oracle, index, size)) {
        return Err(ShapeError::IndexOutOfRange {
            op: name.into(),
            index: index.to_string(),
            dim,
            size: size.to_string(),
        });
    }
    let mut m = x.clone();
    m.offset = add_dims(name, "storage offset", &x.offset, &mul_dims(name, "storage offset", index, &x.strides[dim])?)?;
    m.shape.remove(dim);
    m.strides.remove(dim);
    Ok(m)
}

/// `as_strided(size, stride, offset)`: taken as given (sizes, strides and offset must
/// be non-negative and the lists of equal length), provided the last element it
/// reaches, `offset + sum((size - 1) * stride)`, fits in i64.
fn as_strided(name: &str, x: &TensorMeta, size: &[Dim], stride: &[Dim], offset: &Dim) -> Result<TensorMeta> {
    if size.len() != stride.len() {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("mismatch in length of strides {} and shape {}", shape_str(stride), shape_str(size)),
        });
    }
    check_sizes_non_negative(name, size)?;
    if let Some(s) = stride.iter().find(|d| d.as_const().is_some_and(|c| c < 0)) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("negative stride {s} in strides {} is not supported", shape_str(stride)),
        });
    }
    if offset.as_const().is_some_and(|c| c < 0) {
        return Err(ShapeError::Invalid { op: name.into(), msg: format!("negative storage offset {offset}") });
    }
    // An empty view reaches nothing; otherwise its extent must be representable.
    if !size.contains(&Dim::Const(0)) {
        let mut reach = offset.clone();
        for (s, st) in size.iter().zip(stride) {
            let last = s.checked_sub(&Dim::Const(1)).and_then(|l| l.checked_mul(st));
            reach = last.and_then(|l| reach.checked_add(&l)).ok_or_else(|| {
                overflow(
                    name,
                    "the last element reached",
                    format!(
                        "offset {offset} + sum((size - 1) * stride) of sizes {} and strides {}",
                        shape_str(size),
                        shape_str(stride)
                    ),
                )
            })?;
        }
    }
    Ok(TensorMeta { shape: size.into(), strides: stride.into(), offset: offset.clone(), dtype: x.dtype })
}

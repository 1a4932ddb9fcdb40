//! Size and stride arithmetic shared by view inference and the tracer: resolving `-1`
//! in `view`/`expand` sizes, Python slice bounds, `squeeze` dims, PyTorch's
//! `computeStride` for views of strided tensors, and the internal-overlap test.

use super::{
    add_dims, check_sizes_non_negative, dim_eq, dim_le, dim_lt, mul_dims, product_dims, shape_str, sub_dims, wrap_dim,
    Result,
};
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::sym::{Dim, DimOracle};

/// A size list where `None` (`-1`) is written back as `-1`, for messages.
fn sizes_str(shape: &[Option<Dim>]) -> String {
    let v: Dims = shape.iter().map(|d| d.clone().unwrap_or(Dim::Const(-1))).collect();
    shape_str(&v)
}

/// Resolve a view/reshape size list where `None` stands for `-1`.
///
/// At most one `-1` (else `Invalid`); it becomes `numel / product(known sizes)`, which
/// must divide exactly (polynomially for symbolic dims; where no polynomial is the
/// quotient, [`DimOracle::specialize`] may fix the sizes to their values). A `-1` next to a zero-size
/// known product is ambiguous and rejected, and a numel mismatch is a `View` error,
/// both like PyTorch's `infer_size`.
pub fn resolve_view_shape(op: &str, from: &[Dim], shape: &[Option<Dim>], oracle: &mut dyn DimOracle) -> Result<Dims> {
    let to = sizes_str(shape);
    let inferred = shape.iter().filter(|d| d.is_none()).count();
    if inferred > 1 {
        return Err(ShapeError::Invalid { op: op.into(), msg: format!("only one dimension can be inferred in {to}") });
    }
    if let Some(d) = shape.iter().flatten().find(|d| d.as_const().is_some_and(|c| c < 0)) {
        return Err(ShapeError::Invalid { op: op.into(), msg: format!("invalid shape dimension {d} in {to}") });
    }
    check_sizes_non_negative(op, &shape.iter().flatten().cloned().collect::<Vec<_>>())?;
    let numel = product_dims(op, "number of elements", from)?;
    let known = product_dims(op, "number of elements", &shape.iter().flatten().cloned().collect::<Vec<_>>())?;
    let view_err = |why: String| ShapeError::View { op: op.into(), from: shape_str(from), to: to.clone(), why };
    let invalid = || format!("shape '{to}' is invalid for input of size {numel}");
    if inferred == 0 {
        if !dim_eq(oracle, &numel, &known) {
            return Err(view_err(invalid()));
        }
        return Ok(shape.iter().flatten().cloned().collect());
    }
    if dim_eq(oracle, &known, &Dim::Const(0)) {
        if dim_eq(oracle, &numel, &Dim::Const(0)) {
            return Err(view_err(format!(
                "cannot reshape a tensor of 0 elements into shape {to} because the unspecified dimension size -1 \
                 can be any value and is ambiguous"
            )));
        }
        return Err(view_err(invalid()));
    }
    let missing = match numel.exact_div(&known) {
        Some(m) => m,
        // No polynomial is `numel / known` (`s0 / 2`): fix the sizes to their values
        // where the oracle can (a trace, under a guard), as PyTorch does.
        None if !numel.is_const() || !known.is_const() => {
            match (oracle.specialize(&numel), oracle.specialize(&known)) {
                (Some(n), Some(k)) if k != 0 && n % k == 0 => Dim::Const(n / k),
                // Name the sizes as eager would see them.
                (Some(n), Some(_)) => {
                    return Err(view_err(format!("shape '{to}' is invalid for input of size {n}")));
                }
                _ => return Err(view_err(invalid())),
            }
        }
        None => return Err(view_err(invalid())),
    };
    Ok(shape.iter().map(|d| d.clone().unwrap_or_else(|| missing.clone())).collect())
}

/// Normalize Python-style slice bounds against `size` (negative values count from
/// the end, then clamp into `[0, size]`, and `end >= start`). Returns `(start, end)`.
///
/// `None` start is 0 and `None` end is `size`. `step` must be at least 1. With a
/// symbolic `size`, clamping a concrete bound `b` asks the oracle `b <= size` (or
/// `size + b < 0` for a negative one).
pub fn normalize_slice(
    op: &str,
    size: &Dim,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
    oracle: &mut dyn DimOracle,
) -> Result<(Dim, Dim)> {
    if step < 1 {
        return Err(ShapeError::Invalid { op: op.into(), msg: format!("slice step must be positive, got {step}") });
    }
    let start = clamp_bound(op, start.unwrap_or(0), size, oracle)?;
    let end = match end {
        None => size.clone(),
        Some(e) => clamp_bound(op, e, size, oracle)?,
    };
    let end = if dim_lt(oracle, &end, &start) { start.clone() } else { end };
    Ok((start, end))
}

/// One Python slice bound clamped into `[0, size]`.
fn clamp_bound(op: &str, b: i64, size: &Dim, oracle: &mut dyn DimOracle) -> Result<Dim> {
    let zero = Dim::Const(0);
    if let Some(n) = size.as_const() {
        return Ok(Dim::Const(if b < 0 { b.saturating_add(n).max(0) } else { b.min(n) }));
    }
    Ok(if b < 0 {
        // Bounded so that `size + b` only overflows for absurd polynomial sizes.
        let v = add_dims(op, "slice bound", size, &Dim::Const(b.max(-(1 << 62))))?;
        if dim_lt(oracle, &v, &zero) {
            zero
        } else {
            v
        }
    } else if b == 0 {
        zero
    } else {
        let bd = Dim::Const(b);
        if dim_le(oracle, &bd, size) {
            bd
        } else {
            size.clone()
        }
    })
}

/// Number of elements of `x[start:end:step]` along one dim: `ceil((end - start) / step)`
/// for `end >= start`.
///
/// With a symbolic length and `step > 1`, the result must be a polynomial: the
/// non-constant part of `end - start` must be divisible by `step` (else `Invalid`,
/// "symbolic slice length not divisible by step"). Any `step` up to `i64::MAX` is
/// accepted (no intermediate overflows); only `end - start` itself may overflow
/// (`Invalid`).
pub fn slice_len(op: &str, start: &Dim, end: &Dim, step: i64) -> Result<Dim> {
    if step < 1 {
        return Err(ShapeError::Invalid { op: op.into(), msg: format!("slice step must be positive, got {step}") });
    }
    let len = sub_dims(op, "slice length", end, start)?;
    if step == 1 {
        return Ok(len);
    }
    if let Some(l) = len.as_const() {
        // ceil(l / step) without forming `l + step - 1`.
        return Ok(Dim::Const(if l <= 0 { 0 } else { (l - 1) / step + 1 }));
    }
    // len = rest + c with `rest` divisible by `step`: ceil(len / step) is
    // rest / step + floor((c + step - 1) / step), the latter computed in i128.
    let c = const_term(&len);
    let rest = sub_dims(op, "slice length", &len, &Dim::Const(c))?;
    let Some(q) = rest.exact_div(&Dim::Const(step)) else {
        return Err(ShapeError::Invalid {
            op: op.into(),
            msg: format!("symbolic slice length not divisible by step: ({len}) / {step}"),
        });
    };
    let (c, st) = (i128::from(c), i128::from(step));
    let tail = i64::try_from((c + st - 1).div_euclid(st))
        .map_err(|_| super::overflow(op, "slice length", format!("ceil(({len}) / {step})")))?;
    add_dims(op, "slice length", &q, &Dim::Const(tail))
}

/// The constant term of a dim.
fn const_term(d: &Dim) -> i64 {
    match d {
        Dim::Const(c) => *c,
        Dim::Sym(p) => p.terms().iter().find(|(k, _)| k.is_empty()).map_or(0, |t| t.1),
    }
}

/// Resolve an `expand` size list (`None` = `-1` = keep the existing size); see
/// [`expand_geometry`] for the rules. Returns the expanded shape.
pub fn resolve_expand_shape(op: &str, from: &[Dim], shape: &[Option<Dim>], oracle: &mut dyn DimOracle) -> Result<Dims> {
    // Strides do not influence the resulting sizes; use the contiguous ones.
    let strides = crate::meta::contiguous_strides(from);
    Ok(expand_geometry(op, from, &strides, shape, oracle)?.0)
}

/// PyTorch's `inferExpandGeometry`: the sizes and strides of `expand(shape)` of a
/// tensor with `sizes`/`strides`. Sizes align from the right; new leading dims may not
/// be `-1`; an existing dim either keeps its size (`-1` or equal), or has size 1 and
/// is stretched with stride 0. A new leading dim of size 1 gets the stride a
/// contiguous layout would give it; larger ones stride 0. A 0-d tensor expands to
/// all-zero strides.
pub fn expand_geometry(
    op: &str,
    sizes: &[Dim],
    strides: &[Dim],
    shape: &[Option<Dim>],
    oracle: &mut dyn DimOracle,
) -> Result<(Dims, Dims)> {
    let (n, r) = (shape.len(), sizes.len());
    let target = sizes_str(shape);
    if n < r {
        return Err(ShapeError::Invalid {
            op: op.into(),
            msg: format!(
                "the number of sizes provided ({n}) must be greater or equal to the number of dimensions in the \
                 tensor ({r}); target sizes {target}, tensor sizes {}",
                shape_str(sizes)
            ),
        });
    }
    if strides.len() != r {
        return Err(ShapeError::Invalid { op: op.into(), msg: format!("{} sizes but {} strides", r, strides.len()) });
    }
    let given: Dims = shape.iter().flatten().cloned().collect();
    check_sizes_non_negative(op, &given)?;
    let mut out_sizes = vec![Dim::Const(0); n];
    let mut out_strides = vec![Dim::Const(0); n];
    for i in (0..n).rev() {
        let existing = (i + r).checked_sub(n);
        let (size, stride) = match existing {
            Some(d) => (sizes[d].clone(), strides[d].clone()),
            None if r == 0 => (Dim::Const(1), Dim::Const(0)),
            None => (Dim::Const(1), mul_dims(op, "expanded stride", &out_sizes[i + 1], &out_strides[i + 1])?),
        };
        let t = match (&shape[i], existing) {
            (Some(t), _) => t.clone(),
            (None, Some(_)) => size.clone(),
            (None, None) => {
                return Err(ShapeError::Invalid {
                    op: op.into(),
                    msg: format!(
                        "the expanded size -1 is not allowed in a leading, non-existing dimension {i}; target sizes \
                         {target}"
                    ),
                })
            }
        };
        if dim_eq(oracle, &size, &t) {
            out_sizes[i] = size;
            out_strides[i] = stride;
        } else if size == Dim::Const(1) {
            out_sizes[i] = t;
            out_strides[i] = Dim::Const(0);
        } else {
            return Err(ShapeError::Broadcast {
                op: op.into(),
                lhs: shape_str(sizes),
                rhs: target,
                dim: i,
                lhs_size: size.to_string(),
                rhs_size: t.to_string(),
            });
        }
    }
    Ok((out_sizes.into(), out_strides.into()))
}

/// The dims `squeeze` drops, like PyTorch: `None` drops every size-1 dim; `Some(d)`
/// drops dim `d` (negative counts from the end) only if its size is 1 (otherwise
/// squeezing is a no-op and the list is empty). A 0-d tensor accepts dims 0 and -1
/// and drops nothing.
pub fn squeeze_dims(op: &str, shape: &[Dim], dim: Option<i64>, oracle: &mut dyn DimOracle) -> Result<Vec<usize>> {
    let one = Dim::Const(1);
    match dim {
        None => Ok((0..shape.len()).filter(|&i| dim_eq(oracle, &shape[i], &one)).collect()),
        Some(d) => {
            let d = wrap_dim(op, d, shape.len())?;
            if shape.is_empty() || !dim_eq(oracle, &shape[d], &one) {
                Ok(Vec::new())
            } else {
                Ok(vec![d])
            }
        }
    }
}

/// True when two different indices of the tensor reach the same storage element
/// through a stride-0 dim of size > 1 (what PyTorch's `has_internal_overlap` reports
/// as `YES`; layouts it calls "too hard" count as not overlapping here too).
/// Symbolic sizes are taken to be at least 2 (the shape environment specializes 0
/// and 1); [`super::infer`] decides them through its oracle instead.
pub fn has_internal_overlap(meta: &TensorMeta) -> bool {
    overlap_where(meta, |size| match size {
        Dim::Const(c) => *c > 1,
        Dim::Sym(_) => true,
    })
}

/// The one internal-overlap test: a stride-0 dim whose size `more_than_one` says
/// exceeds 1 (the callers differ only in how they decide that for symbolic sizes).
pub(crate) fn overlap_where(meta: &TensorMeta, mut more_than_one: impl FnMut(&Dim) -> bool) -> bool {
    meta.shape.iter().zip(&meta.strides).any(|(size, stride)| *stride == Dim::Const(0) && more_than_one(size))
}

/// PyTorch's `computeStride`: the strides that let a tensor of `old_shape` /
/// `old_strides` be viewed as `new_shape` (same number of elements, checked by the
/// caller) without copying, or `None` when no such strides exist.
///
/// Old dims are split into chunks that are contiguous among themselves; each chunk
/// must be covered exactly by a run of new dims, which then get strides that walk the
/// chunk row-major. Size comparisons go through the oracle. Arithmetic that would
/// overflow i64 means no such strides (`None`): a stride product that does not fit
/// cannot equal an existing stride.
pub fn view_strides(
    old_shape: &[Dim],
    old_strides: &[Dim],
    new_shape: &[Dim],
    oracle: &mut dyn DimOracle,
) -> Option<Dims> {
    let one = Dim::Const(1);
    let zero = Dim::Const(0);
    if old_shape.len() != old_strides.len() {
        return None;
    }
    let mut new_strides = vec![one.clone(); new_shape.len()];
    if old_shape.is_empty() {
        return Some(new_strides.into());
    }
    let numel = Dim::checked_product(old_shape)?;
    if old_shape.contains(&zero) || dim_eq(oracle, &numel, &zero) {
        if old_shape == new_shape {
            return Some(old_strides.into());
        }
        // Any strides work for an empty tensor: use the contiguous ones.
        for d in (0..new_shape.len().saturating_sub(1)).rev() {
            let next = match &new_shape[d + 1] {
                Dim::Const(c) => Dim::Const((*c).max(1)),
                s => s.clone(),
            };
            new_strides[d] = next.checked_mul(&new_strides[d + 1])?;
        }
        return Some(new_strides.into());
    }
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base_stride = old_strides[old_strides.len() - 1].clone();
    let mut tensor_numel = one.clone();
    let mut view_numel = one.clone();
    for tensor_d in (0..old_shape.len()).rev() {
        tensor_numel = tensor_numel.checked_mul(&old_shape[tensor_d])?;
        // A chunk ends at dim 0, or where the next-outer dim is not laid out right
        // after this chunk (size-1 dims never end a chunk).
        let chunk_ends = tensor_d == 0 || {
            let outer_stride = &old_strides[tensor_d - 1];
            // A product that overflows is larger than any stride: the chunk ends.
            let contiguous =
                tensor_numel.checked_mul(&chunk_base_stride).is_some_and(|want| dim_eq(oracle, outer_stride, &want));
            !contiguous && !dim_eq(oracle, &old_shape[tensor_d - 1], &one)
        };
        if !chunk_ends {
            continue;
        }
        while view_d >= 0 {
            let nd = &new_shape[view_d as usize];
            if !(dim_lt(oracle, &view_numel, &tensor_numel) || dim_eq(oracle, nd, &one)) {
                break;
            }
            new_strides[view_d as usize] = view_numel.checked_mul(&chunk_base_stride)?;
            view_numel = view_numel.checked_mul(nd)?;
            view_d -= 1;
        }
        if !dim_eq(oracle, &view_numel, &tensor_numel) {
            return None;
        }
        if tensor_d > 0 {
            chunk_base_stride = old_strides[tensor_d - 1].clone();
            tensor_numel = one.clone();
            view_numel = one.clone();
        }
    }
    (view_d == -1).then_some(new_strides.into())
}

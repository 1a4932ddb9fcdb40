//! Reductions (`sum`, `mean`, `amax`, `amin`) over a set of dims, and `argmax`/`argmin`.
//!
//! The input is gathered with its kept dims first and its reduced dims last, so every
//! output element reduces one contiguous chunk. Floating inputs are read exactly as
//! f64 and **summed in f64 with pairwise summation** (chunks of 8 summed sequentially),
//! then rounded once to the output dtype; integer and bool inputs are summed in
//! wrapping i64. `amax`/`amin`/`argmax`/`argmin` propagate NaN (a NaN is the extreme,
//! and the first NaN wins for the arg variants, as in PyTorch).

use crate::convert::{gather_buffer, Kind, Vals};
use crate::iter::Layout;
use crate::pointwise::out_shape;
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{ReduceOp, TensorMeta};

/// Gather `x` with the dims in `reduced` moved last; returns the values (f64 for
/// floating inputs, i64 otherwise) and the chunk length (product of reduced sizes).
/// Reduced dims in `broadcast` (stride 0: every index reads the same elements) are
/// gathered once, as if of size 1; the caller accounts for their copies.
fn gather_grouped(op: &str, x: &CpuTensor, reduced: &[usize], broadcast: &[usize]) -> Result<(Vals, usize)> {
    let layout = Layout::from_meta(&x.meta)?;
    let rank = layout.shape.len();
    if let Some(&d) = reduced.iter().find(|&&d| d >= rank) {
        return Err(CpuError::kernel(op, format!("dimension {d} out of range for a tensor of rank {rank}")));
    }
    let mut order: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    order.extend(reduced.iter().copied());
    let size = |d: usize| if broadcast.contains(&d) { 1 } else { layout.shape[d] };
    let permuted = Layout {
        shape: order.iter().map(|&d| size(d)).collect(),
        strides: order.iter().map(|&d| layout.strides[d]).collect(),
        offset: layout.offset,
    };
    let group: usize = reduced.iter().map(|&d| size(d)).product();
    let kind = if x.meta.dtype.is_float() { Kind::F64 } else { Kind::I64 };
    let guard = x.storage.read();
    Ok((gather_buffer(op, &guard, &permuted, kind)?, group))
}

/// Pairwise (cascade) summation: error grows like O(log n) instead of O(n).
pub(crate) fn pairwise_sum(v: &[f64]) -> f64 {
    if v.len() <= 8 {
        return v.iter().sum();
    }
    let mid = v.len() / 2;
    pairwise_sum(&v[..mid]) + pairwise_sum(&v[mid..])
}

fn chunks<T>(v: &[T], group: usize, n_out: usize) -> impl Iterator<Item = &[T]> {
    (0..n_out).map(move |i| &v[i * group..(i + 1) * group])
}

fn float_extreme(c: &[f64], max: bool) -> f64 {
    let mut best = c[0];
    for &x in c {
        if x.is_nan() {
            return x;
        }
        if (max && x > best) || (!max && x < best) {
            best = x;
        }
    }
    best
}

/// `op` over `dims` (all dims when empty); the output shape and dtype are `out`'s.
pub(crate) fn reduce(op: ReduceOp, x: &CpuTensor, dims: &[usize], out: &TensorMeta) -> Result<Buffer> {
    let name = op.name();
    // Empty dims mean every dim; a 0-d tensor (which accepts dim 0) reduces its one element.
    let rank = x.meta.rank();
    let reduced: Vec<usize> = if dims.is_empty() || rank == 0 { (0..rank).collect() } else { dims.to_vec() };
    // Reduced dims that broadcast (an `expand`ed view: stride 0, size > 1) hold copies
    // of the same elements: reduce one copy and scale (sum) or keep (mean, amax,
    // amin), instead of materializing every copy. Not when another dim is empty (the
    // result is then the empty reduction).
    let sizes = x.meta.concrete_shape().unwrap_or_default();
    let strides = x.meta.concrete_strides().unwrap_or_default();
    let broadcast: Vec<usize> = if sizes.contains(&0) {
        Vec::new()
    } else {
        reduced.iter().copied().filter(|&d| d < rank && sizes[d] > 1 && strides[d] == 0).collect()
    };
    let copies: u128 = broadcast.iter().map(|&d| sizes[d] as u128).product();
    let (vals, group) = gather_grouped(name, x, &reduced, &broadcast)?;
    let n_out: usize = out_shape(out)?.iter().product();
    if vals.len() != n_out * group {
        return Err(CpuError::Internal(format!(
            "{name}: output of {n_out} elements does not match input of {} elements reduced by {group}",
            vals.len()
        )));
    }
    if group == 0 && matches!(op, ReduceOp::Amax | ReduceOp::Amin) && n_out > 0 {
        return Err(CpuError::kernel(name, "cannot reduce over a dimension of size 0 (the operation has no identity)"));
    }
    let res = match vals {
        Vals::F64(v) => Vals::F64(
            chunks(&v, group, n_out)
                .map(|c| match op {
                    ReduceOp::Sum => pairwise_sum(c) * copies as f64,
                    ReduceOp::Mean => pairwise_sum(c) / group as f64,
                    ReduceOp::Amax => float_extreme(c, true),
                    ReduceOp::Amin => float_extreme(c, false),
                })
                .collect(),
        ),
        Vals::I64(v) => {
            if op == ReduceOp::Mean {
                return Err(CpuError::kernel(name, format!("mean needs a floating input, got {}", x.meta.dtype)));
            }
            Vals::I64(
                chunks(&v, group, n_out)
                    .map(|c| match op {
                        ReduceOp::Amax => c.iter().copied().max().unwrap_or(0),
                        ReduceOp::Amin => c.iter().copied().min().unwrap_or(0),
                        _ => c.iter().fold(0i64, |a, &b| a.wrapping_add(b)).wrapping_mul(copies as i64),
                    })
                    .collect(),
            )
        }
        _ => return Err(CpuError::Internal(format!("{name}: input gathered into an unexpected kind"))),
    };
    Ok(res.into_buffer(out.dtype))
}

/// Index of the first maximum (`max`) or minimum along `dim`; NaN is the extreme.
pub(crate) fn arg_extreme(max: bool, x: &CpuTensor, dim: usize, out: &TensorMeta) -> Result<Buffer> {
    let name = if max { "argmax" } else { "argmin" };
    let n_out: usize = out_shape(out)?.iter().product();
    if x.meta.rank() == 0 {
        if dim > 0 {
            return Err(CpuError::kernel(name, format!("dimension {dim} out of range for a tensor of rank 0")));
        }
        return Ok(Vals::I64(vec![0; n_out]).into_buffer(out.dtype));
    }
    let (vals, group) = gather_grouped(name, x, &[dim], &[])?;
    if vals.len() != n_out * group {
        return Err(CpuError::Internal(format!("{name}: output size does not match the input")));
    }
    if group == 0 && n_out > 0 {
        return Err(CpuError::kernel(name, format!("cannot take {name} over dimension {dim} of size 0")));
    }
    let better_f = |x: f64, best: f64| if max { x > best } else { x < best };
    let idx: Vec<i64> = match vals {
        Vals::F64(v) => chunks(&v, group, n_out)
            .map(|c| {
                let mut bi = 0;
                for (i, &x) in c.iter().enumerate() {
                    if x.is_nan() {
                        return i as i64;
                    }
                    if better_f(x, c[bi]) {
                        bi = i;
                    }
                }
                bi as i64
            })
            .collect(),
        Vals::I64(v) => chunks(&v, group, n_out)
            .map(|c| {
                let mut bi = 0;
                for (i, &x) in c.iter().enumerate() {
                    if (max && x > c[bi]) || (!max && x < c[bi]) {
                        bi = i;
                    }
                }
                bi as i64
            })
            .collect(),
        _ => return Err(CpuError::Internal(format!("{name}: input gathered into an unexpected kind"))),
    };
    Ok(Vals::I64(idx).into_buffer(out.dtype))
}

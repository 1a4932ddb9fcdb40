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

// ---- scans along one dim: cumsum, sort, argsort ----------------------------------------

/// For the input gathered with `dim` last (`outer` lines of `len`), the offset of each
/// line's first element in the row-major output and the output stride along `dim`.
fn line_offsets(shape: &[usize], dim: usize) -> (Vec<usize>, usize) {
    let stride: usize = shape[dim + 1..].iter().product();
    let others: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
    let out_strides: Vec<usize> = others.iter().map(|&d| shape[d + 1..].iter().product()).collect();
    let outer: usize = others.iter().map(|&d| shape[d]).product();
    let offs = (0..outer)
        .map(|mut o| {
            let mut off = 0;
            for (k, &d) in others.iter().enumerate().rev() {
                off += (o % shape[d]) * out_strides[k];
                o /= shape[d];
            }
            off
        })
        .collect();
    (offs, stride)
}

/// The lines of `x` along `dim` (its values gathered with `dim` last), their length,
/// and where each goes in a row-major result of `x`'s shape.
fn lines(op: &str, x: &CpuTensor, dim: usize) -> Result<(Vals, usize, Vec<usize>, usize)> {
    if x.meta.rank() == 0 {
        if dim > 0 {
            return Err(CpuError::kernel(op, format!("dimension {dim} out of range for a tensor of rank 0")));
        }
        let (vals, _) = gather_grouped(op, x, &[], &[])?;
        return Ok((vals, 1, vec![0], 1));
    }
    let (vals, len) = gather_grouped(op, x, &[dim], &[])?;
    let shape = x.meta.concrete_shape().ok_or_else(|| CpuError::Internal(format!("{op}: symbolic input")))?;
    let (offs, stride) = line_offsets(&shape, dim);
    Ok((vals, len, offs, stride))
}

/// Write each line of `v` (lines of `len`) to `offs[line] + i * stride`.
fn scatter_lines<T: Copy + Default>(v: &[T], len: usize, offs: &[usize], stride: usize) -> Vec<T> {
    let mut out = vec![T::default(); v.len()];
    for (line, &o) in offs.iter().enumerate() {
        for i in 0..len {
            out[o + i * stride] = v[line * len + i];
        }
    }
    out
}

/// `cumsum` along `dim`: floats summed in f64 in order and rounded once per element;
/// integers and bools in wrapping i64 (PyTorch's i64 result).
pub(crate) fn cumsum(x: &CpuTensor, dim: usize, out: &TensorMeta) -> Result<Buffer> {
    let (vals, len, offs, stride) = lines("cumsum", x, dim)?;
    let scan = |v: Vals| -> Result<Vals> {
        Ok(match v {
            Vals::F64(mut v) => {
                for line in v.chunks_mut(len.max(1)) {
                    let mut acc = 0.0;
                    for e in line {
                        acc += *e;
                        *e = acc;
                    }
                }
                Vals::F64(scatter_lines(&v, len, &offs, stride))
            }
            Vals::I64(mut v) => {
                for line in v.chunks_mut(len.max(1)) {
                    let mut acc = 0i64;
                    for e in line {
                        acc = acc.wrapping_add(*e);
                        *e = acc;
                    }
                }
                Vals::I64(scatter_lines(&v, len, &offs, stride))
            }
            _ => return Err(CpuError::Internal("cumsum: input gathered into an unexpected kind".into())),
        })
    };
    Ok(scan(vals)?.into_buffer(out.dtype))
}

/// The stable order of `line` (ascending or descending); NaN sorts above every number,
/// as in PyTorch (last ascending, first descending).
fn float_order(line: &[f64], descending: bool) -> Vec<usize> {
    let key = |x: f64| (x.is_nan(), if x.is_nan() { 0.0 } else { x });
    let mut idx: Vec<usize> = (0..line.len()).collect();
    idx.sort_by(|&a, &b| {
        let (ka, kb) = (key(line[a]), key(line[b]));
        let o = ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1));
        if descending {
            o.reverse()
        } else {
            o
        }
    });
    idx
}

fn int_order(line: &[i64], descending: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..line.len()).collect();
    idx.sort_by(|&a, &b| if descending { line[b].cmp(&line[a]) } else { line[a].cmp(&line[b]) });
    idx
}

/// `argsort` along `dim`: the i64 indices of a stable sort (equal values keep their
/// order; `-0.0` and `0.0` are equal).
pub(crate) fn argsort(x: &CpuTensor, dim: usize, descending: bool, out: &TensorMeta) -> Result<Buffer> {
    let (vals, len, offs, stride) = lines("argsort", x, dim)?;
    let orders: Vec<Vec<usize>> = match &vals {
        Vals::F64(v) => v
            .chunks(len.max(1))
            .map(|l| float_order(&l.iter().map(|x| x + 0.0).collect::<Vec<_>>(), descending))
            .collect(),
        Vals::I64(v) => v.chunks(len.max(1)).map(|l| int_order(l, descending)).collect(),
        _ => return Err(CpuError::Internal("argsort: input gathered into an unexpected kind".into())),
    };
    let mut flat = Vec::with_capacity(orders.len() * len);
    if len > 0 {
        for o in &orders {
            flat.extend(o.iter().map(|&i| i as i64));
        }
    }
    Ok(Vals::I64(scatter_lines(&flat, len, &offs, stride)).into_buffer(out.dtype))
}

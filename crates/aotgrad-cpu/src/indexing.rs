//! Indexing kernels: `index_select`, `gather`, `scatter_add`, `cat`, and the scatter
//! forms of views (`slice_scatter`, `select_scatter`, `as_strided_scatter`).
//!
//! Index values are checked before any element moves: an index outside its dim is a
//! [`CpuError::Kernel`] naming the op, the index and the size, never a panic.

use crate::convert::{cast_buffer, contiguous_copy, gather_index, gather_own, scatter_into, Kind, Vals};
use crate::iter::{for_each_index, Layout};
use crate::pointwise::out_shape;
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{Dim, TensorMeta};

fn index_err(op: &str, index: i64, dim: usize, size: usize) -> CpuError {
    CpuError::kernel(op, format!("index {index} is out of range for dimension {dim} with size {size}"))
}

/// The elements of `buf` at `offsets` (all in bounds), in that order.
fn take(buf: &Buffer, offsets: &[usize]) -> Buffer {
    fn go<T: Copy>(v: &[T], offsets: &[usize]) -> Vec<T> {
        offsets.iter().map(|&o| v[o]).collect()
    }
    match buf {
        Buffer::Bool(v) => Buffer::Bool(go(v, offsets)),
        Buffer::I32(v) => Buffer::I32(go(v, offsets)),
        Buffer::I64(v) => Buffer::I64(go(v, offsets)),
        Buffer::F16(v) => Buffer::F16(go(v, offsets)),
        Buffer::BF16(v) => Buffer::BF16(go(v, offsets)),
        Buffer::F32(v) => Buffer::F32(go(v, offsets)),
        Buffer::F64(v) => Buffer::F64(go(v, offsets)),
    }
}

/// Read the elements of `x` at `offsets` (checked against `x`'s layout first).
fn take_from(op: &str, x: &CpuTensor, lx: &Layout, offsets: &[usize], out: &TensorMeta) -> Result<Buffer> {
    let guard = x.storage.read();
    lx.check_fits(op, guard.len())?;
    if offsets.iter().any(|&o| o >= guard.len()) {
        return Err(CpuError::Internal(format!("{op}: computed an offset outside the storage")));
    }
    Ok(cast_buffer(take(&guard, offsets), out.dtype))
}

/// Storage offsets of every combination of per-dim contributions, row-major.
fn product_offsets(base: usize, contribs: &[Vec<usize>]) -> Vec<usize> {
    fn rec(acc: usize, contribs: &[Vec<usize>], out: &mut Vec<usize>) {
        match contribs.split_first() {
            None => out.push(acc),
            Some((first, rest)) => {
                for &c in first {
                    rec(acc + c, rest, out);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(contribs.iter().map(Vec::len).product());
    rec(base, contribs, &mut out);
    out
}

/// `x.index_select(dim, index)` for a 1-D (or 0-d) integer index.
pub(crate) fn index_select(dim: usize, x: &CpuTensor, index: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let op = "index_select";
    let lx = Layout::from_meta(&x.meta)?;
    let idx = gather_index(op, index)?;
    if index.meta.rank() > 1 {
        return Err(CpuError::kernel(op, format!("index must be 1-D, got rank {}", index.meta.rank())));
    }
    // A 0-d tensor behaves as a 1-element 1-D one.
    let (shape, strides) =
        if lx.shape.is_empty() { (vec![1], vec![0]) } else { (lx.shape.clone(), lx.strides.clone()) };
    if dim >= shape.len() {
        return Err(CpuError::kernel(
            op,
            format!("dimension {dim} out of range for a tensor of rank {}", lx.shape.len()),
        ));
    }
    if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i as usize >= shape[dim]) {
        return Err(index_err(op, bad, dim, shape[dim]));
    }
    let contribs: Vec<Vec<usize>> = (0..shape.len())
        .map(|d| {
            if d == dim {
                idx.iter().map(|&i| i as usize * strides[d]).collect()
            } else {
                (0..shape[d]).map(|j| j * strides[d]).collect()
            }
        })
        .collect();
    let offsets = product_offsets(lx.offset, &contribs);
    if offsets.len() != out_shape(out)?.iter().product::<usize>() {
        return Err(CpuError::Internal(format!("{op}: output size does not match the index")));
    }
    take_from(op, x, &lx, &offsets, out)
}

/// A layout with 0-d tensors seen as 1-element 1-D ones (as PyTorch's gather/scatter do).
fn at_least_1d(mut l: Layout) -> Layout {
    if l.shape.is_empty() {
        l.shape.push(1);
        l.strides.push(0);
    }
    l
}

/// Checks that `index` has the rank of `x` and fits `x` outside `dim` (and `src` everywhere).
fn check_index_shape(op: &str, dim: usize, index: &[usize], x: &[usize], src: Option<&[usize]>) -> Result<()> {
    if index.len() != x.len() || src.is_some_and(|s| s.len() != x.len()) {
        return Err(CpuError::kernel(
            op,
            format!("index of shape {index:?} must have the same rank as the input {x:?}"),
        ));
    }
    if dim >= x.len() {
        return Err(CpuError::kernel(op, format!("dimension {dim} out of range for a tensor of rank {}", x.len())));
    }
    for (d, &s) in index.iter().enumerate() {
        if d != dim && s > x[d] {
            return Err(CpuError::kernel(
                op,
                format!("index of shape {index:?} is larger than the input {x:?} at dimension {d}"),
            ));
        }
        if let Some(src) = src {
            if s > src[d] {
                return Err(CpuError::kernel(
                    op,
                    format!("index of shape {index:?} is larger than src {src:?} at dimension {d}"),
                ));
            }
        }
    }
    Ok(())
}

/// For every position `c` of `index` (row-major): the position `c` with `c[dim]`
/// replaced by `index[c]`, as an offset through `strides` (after range checks).
fn scattered_offsets(
    op: &str,
    dim: usize,
    index_shape: &[usize],
    idx: &[i64],
    size: usize,
    strides: &[usize],
) -> Result<Vec<usize>> {
    let mut offsets = Vec::with_capacity(idx.len());
    let mut bad = None;
    let mut k = 0;
    for_each_index(index_shape, |c| {
        let i = idx[k];
        k += 1;
        if i < 0 || i as usize >= size {
            bad.get_or_insert(i);
            return;
        }
        offsets.push(c.iter().enumerate().map(|(d, &cd)| if d == dim { i as usize } else { cd } * strides[d]).sum());
    });
    match bad {
        Some(i) => Err(index_err(op, i, dim, size)),
        None => Ok(offsets),
    }
}

/// `out[c] = x[c with c[dim] = index[c]]`, over every position `c` of `index`.
pub(crate) fn gather(dim: usize, x: &CpuTensor, index: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let op = "gather";
    let lx = at_least_1d(Layout::from_meta(&x.meta)?);
    let li = at_least_1d(Layout::from_meta(&index.meta)?);
    check_index_shape(op, dim, &li.shape, &lx.shape, None)?;
    let idx = gather_index(op, index)?;
    let mut offsets = scattered_offsets(op, dim, &li.shape, &idx, lx.shape[dim], &lx.strides)?;
    offsets.iter_mut().for_each(|o| *o += lx.offset);
    take_from(op, x, &lx, &offsets, out)
}

/// Out-of-place `scatter_add`: a copy of `x` with `src[c]` added at `c with c[dim] = index[c]`.
pub(crate) fn scatter_add(
    dim: usize,
    x: &CpuTensor,
    index: &CpuTensor,
    src: &CpuTensor,
    out: &TensorMeta,
) -> Result<Buffer> {
    let op = "scatter_add";
    let xs = at_least_1d(Layout::from_meta(&x.meta)?).shape;
    let is = at_least_1d(Layout::from_meta(&index.meta)?).shape;
    let ss = at_least_1d(Layout::from_meta(&src.meta)?).shape;
    check_index_shape(op, dim, &is, &xs, Some(&ss))?;
    let idx = gather_index(op, index)?;
    let kind = Kind::compute(out.dtype);
    let mut acc = gather_own(op, x, kind)?;
    let vs = gather_own(op, src, kind)?;
    let targets = scattered_offsets(op, dim, &is, &idx, xs[dim], &Layout::contiguous(&xs).strides)?;
    let sst = Layout::contiguous(&ss).strides;
    let mut sources = Vec::with_capacity(targets.len());
    for_each_index(&is, |c| sources.push(c.iter().zip(&sst).map(|(&cd, &st)| cd * st).sum::<usize>()));
    let pairs = targets.into_iter().zip(sources);
    match (&mut acc, &vs) {
        (Vals::F32(a), Vals::F32(v)) => pairs.for_each(|(t, s)| a[t] += v[s]),
        (Vals::F64(a), Vals::F64(v)) => pairs.for_each(|(t, s)| a[t] += v[s]),
        (Vals::I64(a), Vals::I64(v)) => pairs.for_each(|(t, s)| a[t] = a[t].wrapping_add(v[s])),
        (Vals::Bool(a), Vals::Bool(v)) => pairs.for_each(|(t, s)| a[t] |= v[s]),
        _ => return Err(CpuError::Internal(format!("{op}: operands gathered into different kinds"))),
    }
    Ok(acc.into_buffer(out.dtype))
}

/// Concatenation along `dim` (inputs cast to the output dtype; 1-D empty inputs skipped).
pub(crate) fn cat(dim: usize, xs: &[&CpuTensor], out: &TensorMeta) -> Result<Buffer> {
    let op = "cat";
    let shape = out_shape(out)?;
    let lo = Layout::contiguous(&shape);
    let mut buf = Buffer::zeros(out.dtype, lo.numel());
    if dim >= shape.len() {
        return Err(CpuError::kernel(op, format!("dimension {dim} out of range for a result of rank {}", shape.len())));
    }
    let mut pos = 0usize;
    for (n, x) in xs.iter().enumerate() {
        let xs = out_shape(&x.meta)?;
        if xs == [0] && shape.len() != 1 {
            continue;
        }
        let fits = xs.len() == shape.len() && xs.iter().zip(&shape).enumerate().all(|(d, (a, b))| d == dim || a == b);
        if !fits || pos + xs[dim] > shape[dim] {
            return Err(CpuError::kernel(
                op,
                format!("input {n} of shape {xs:?} does not fit the result of shape {shape:?}"),
            ));
        }
        let region = Layout { shape: xs.clone(), strides: lo.strides.clone(), offset: pos * lo.strides[dim] };
        scatter_into(op, &mut buf, &region, contiguous_copy(op, x)?)?;
        pos += xs[dim];
    }
    if pos != shape[dim] {
        return Err(CpuError::kernel(op, format!("inputs fill {pos} of {} entries along dimension {dim}", shape[dim])));
    }
    Ok(buf)
}

fn concrete(op: &str, d: &Dim) -> Result<usize> {
    match d.as_const() {
        Some(v) if v >= 0 => Ok(v as usize),
        _ => Err(CpuError::Internal(format!("{op}: parameter {d} is not a concrete non-negative integer"))),
    }
}

/// A contiguous copy of `base` (in `out.dtype`) with the view `region` of it replaced by `src`.
fn scatter_view(op: &str, base: &CpuTensor, src: &CpuTensor, region: Layout, out: &TensorMeta) -> Result<Buffer> {
    let mut buf = cast_buffer(contiguous_copy(op, base)?, out.dtype);
    region.check_fits(op, buf.len())?;
    let ss = out_shape(&src.meta)?;
    if ss != region.shape {
        return Err(CpuError::kernel(
            op,
            format!("src of shape {ss:?} does not match the view of shape {:?}", region.shape),
        ));
    }
    scatter_into(op, &mut buf, &region, contiguous_copy(op, src)?)?;
    Ok(buf)
}

/// `base` with `base[start:end:step]` along `dim` replaced by `src`.
pub(crate) fn slice_scatter(
    (dim, start, end, step): (usize, &Dim, &Dim, i64),
    base: &CpuTensor,
    src: &CpuTensor,
    out: &TensorMeta,
) -> Result<Buffer> {
    let op = "slice_scatter";
    let mut region = Layout::contiguous(&out_shape(&base.meta)?);
    let (start, end) = (concrete(op, start)?, concrete(op, end)?);
    if dim >= region.shape.len() || step < 1 || end > region.shape[dim] {
        return Err(CpuError::kernel(
            op,
            format!("invalid slice {start}:{end}:{step} of dimension {dim} of a tensor of shape {:?}", region.shape),
        ));
    }
    let step = step as usize;
    region.offset = start * region.strides[dim];
    region.shape[dim] = if end > start { (end - start).div_ceil(step) } else { 0 };
    region.strides[dim] *= step;
    scatter_view(op, base, src, region, out)
}

/// `base` with `base.select(dim, index)` replaced by `src`.
pub(crate) fn select_scatter(
    dim: usize,
    index: &Dim,
    base: &CpuTensor,
    src: &CpuTensor,
    out: &TensorMeta,
) -> Result<Buffer> {
    let op = "select_scatter";
    let mut region = Layout::contiguous(&out_shape(&base.meta)?);
    let index = concrete(op, index)?;
    if dim >= region.shape.len() {
        return Err(CpuError::kernel(
            op,
            format!("dimension {dim} out of range for a tensor of rank {}", region.shape.len()),
        ));
    }
    if index >= region.shape[dim] {
        return Err(index_err(op, index as i64, dim, region.shape[dim]));
    }
    region.offset = index * region.strides[dim];
    region.shape.remove(dim);
    region.strides.remove(dim);
    scatter_view(op, base, src, region, out)
}

/// A contiguous copy of `base` whose `as_strided(size, stride, offset)` view is replaced by `src`.
pub(crate) fn as_strided_scatter(
    (size, stride, offset): (&[Dim], &[Dim], &Dim),
    base: &CpuTensor,
    src: &CpuTensor,
    out: &TensorMeta,
) -> Result<Buffer> {
    let op = "as_strided_scatter";
    let region = Layout {
        shape: size.iter().map(|d| concrete(op, d)).collect::<Result<_>>()?,
        strides: stride.iter().map(|d| concrete(op, d)).collect::<Result<_>>()?,
        offset: concrete(op, offset)?,
    };
    if region.shape.len() != region.strides.len() {
        return Err(CpuError::kernel(op, "size and stride must have the same length"));
    }
    let layout = Layout::from_meta(out)?;
    if layout == Layout::contiguous(&layout.shape) {
        return scatter_view(op, base, src, region, out);
    }
    // The region names positions in the result's storage, which is laid out like
    // the base (a clone with the preserved memory format): write there, then read
    // the values back in row-major order.
    let ss = out_shape(&src.meta)?;
    if ss != region.shape {
        return Err(CpuError::kernel(
            op,
            format!("src of shape {ss:?} does not match the view of shape {:?}", region.shape),
        ));
    }
    let mut storage = Buffer::zeros(out.dtype, layout.extent());
    scatter_into(op, &mut storage, &layout, cast_buffer(contiguous_copy(op, base)?, out.dtype))?;
    region.check_fits(op, storage.len())?;
    scatter_into(op, &mut storage, &region, cast_buffer(contiguous_copy(op, src)?, out.dtype))?;
    let result = CpuTensor { storage: crate::storage::Storage::new(storage), meta: out.clone() };
    contiguous_copy(op, &result)
}

//! Rules of view ops. The gradient of a view is the gradient of its result mapped back
//! to the input's shape:
//! - `view`/`squeeze`: viewed (or reshaped) back; `unsqueeze`: squeezed; `alias`: as is;
//! - `permute`: the inverse permutation; `transpose`/`t`: the same swap;
//! - `expand`: summed over the expanded dims;
//! - `slice`/`select`: scattered into zeros of the input's shape (`slice_scatter`,
//!   `select_scatter`);
//! - `as_strided`: scattered into zeros laid out like the input's storage. When the
//!   input is contiguous (row-major strides, any offset) that is one
//!   `as_strided_scatter` into zeros of the input's shape, with the offset taken
//!   relative to the input's first element. Otherwise the gradient is scattered into a
//!   flat zero buffer covering the storage the input and the view touch (for symbolic
//!   layouts, the sum of both extents), and the input's own `as_strided` view of that
//!   buffer is read back. (The joint pass hands this rule the storage root of an
//!   `as_strided` whose input is itself a view, since the view may reach elements of
//!   the root its input does not hold.)
//!   Views whose elements overlap (detectably: a stride-0 dim, or concrete strides
//!   that repeat an address, by `aotgrad_meta::Layout::may_repeat`) are rejected, as
//!   is an input that overlaps itself: a scatter would drop the repeated
//!   contributions.

use super::arg;
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::infer::has_internal_overlap;
use aotgrad_ir::Dims;
use aotgrad_ir::{contiguous_strides, Dim, Node, Op, TensorMeta, ValueId};
use aotgrad_meta::Layout;

/// The rule of a view node (see the module docs).
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    if !needs[0] {
        return Ok(vec![None]);
    }
    let x = arg(node, 0)?;
    let xm = b.meta(x)?.clone();
    let v = match &node.op {
        Op::View(_) | Op::Squeeze(_) => b.reshape(g, xm.shape.clone())?,
        Op::Unsqueeze(d) => b.emit(Op::Squeeze(vec![*d]), vec![g])?,
        Op::Alias => g,
        Op::Permute(p) => {
            let mut inv = vec![0usize; p.len()];
            for (i, &d) in p.iter().enumerate() {
                let slot = inv.get_mut(d).ok_or_else(|| AutodiffError::Internal(format!("bad permutation {p:?}")))?;
                *slot = i;
            }
            b.emit(Op::Permute(inv), vec![g])?
        }
        Op::Transpose(i, j) => b.emit(Op::Transpose(*i, *j), vec![g])?,
        Op::T => b.emit(Op::T, vec![g])?,
        Op::Expand(_) => b.sum_to(g, &xm.shape)?,
        Op::Slice { dim, start, end, step } => {
            let z = b.zeros(xm.shape.clone(), b.meta(g)?.dtype)?;
            let op = Op::SliceScatter { dim: *dim, start: start.clone(), end: end.clone(), step: *step };
            b.emit(op, vec![z, g])?
        }
        Op::Select { dim, index } => {
            let z = b.zeros(xm.shape.clone(), b.meta(g)?.dtype)?;
            b.emit(Op::SelectScatter { dim: *dim, index: index.clone() }, vec![z, g])?
        }
        Op::AsStrided { size, stride, offset } => as_strided(b, &xm, size, stride, offset, g)?,
        other => return Err(AutodiffError::Internal(format!("{} is not a view op", other.name()))),
    };
    Ok(vec![Some(v)])
}

fn not_diff(msg: String) -> AutodiffError {
    AutodiffError::NotDifferentiable { op: "as_strided".into(), msg }
}

/// `offset + sum((size - 1) * stride) + 1`: one past the last element a layout
/// touches (concrete layouts; `offset` when empty).
fn extent(size: &[Dim], stride: &[Dim], offset: &Dim) -> Option<i64> {
    let off = offset.as_const()?;
    let mut reach = 0i64;
    for (s, st) in size.iter().zip(stride) {
        let (s, st) = (s.as_const()?, st.as_const()?);
        if s == 0 {
            return Some(off);
        }
        reach = reach.checked_add((s - 1).checked_mul(st)?)?;
    }
    off.checked_add(reach)?.checked_add(1)
}

/// [`extent`] as a dim (symbolic sizes are at least 2: the shape environment
/// specializes 0 and 1).
fn extent_dim(size: &[Dim], stride: &[Dim], offset: &Dim) -> Dim {
    if size.contains(&Dim::Const(0)) {
        return offset.clone();
    }
    let reach = size.iter().zip(stride).fold(Dim::Const(0), |acc, (s, st)| acc.add(&s.sub(&Dim::Const(1)).mul(st)));
    offset.add(&reach).add(&Dim::Const(1))
}

/// False when two elements of the layout provably or possibly share a storage
/// element: a stride-0 dim of size > 1 (symbolic sizes included), or concrete dims
/// that repeat an address ([`Layout::may_repeat`]: exact within its enumeration
/// budget, conservative past it or on address overflow). Other symbolic layouts count
/// as disjoint.
pub(crate) fn disjoint(size: &[Dim], stride: &[Dim]) -> bool {
    let probe =
        TensorMeta { shape: size.into(), strides: stride.into(), offset: Dim::Const(0), dtype: aotgrad_ir::DType::F64 };
    if has_internal_overlap(&probe) {
        return false;
    }
    if !probe.is_concrete() {
        // Symbolic: only stride-0 overlap is detected.
        return true;
    }
    // Concrete: negative dims (no layout) count as overlapping.
    Layout::of(&probe).is_some_and(|l| !l.may_repeat())
}

/// The storage position of every element of the concrete layout `(size, stride,
/// offset)`, row-major, as a flat `i64` tensor: `offset + sum_d i_d * stride_d`, built
/// from one `arange` per dim broadcast over the shape.
fn positions(b: &mut Builder, size: &[i64], stride: &[i64], offset: i64) -> Result<ValueId> {
    let (i64t, r) = (aotgrad_ir::DType::I64, size.len());
    let n: i64 = size.iter().product();
    let mut idx =
        b.emit(Op::Full { shape: Dims::new(), value: aotgrad_ir::Scalar::Int(offset), dtype: i64t }, vec![])?;
    for d in 0..r {
        let ar = Op::Arange {
            start: aotgrad_ir::Scalar::Int(0),
            end: aotgrad_ir::Scalar::Int(size[d]),
            step: aotgrad_ir::Scalar::Int(1),
            dtype: i64t,
        };
        let a = b.emit(ar, vec![])?;
        let shape: Dims = (0..r).map(|k| Dim::Const(if k == d { size[d] } else { 1 })).collect();
        let a = b.emit(Op::View(shape), vec![a])?;
        let a = b.emit(Op::BinaryScalar(aotgrad_ir::BinaryOp::Mul, aotgrad_ir::Scalar::Int(stride[d])), vec![a])?;
        idx = b.emit(Op::Binary(aotgrad_ir::BinaryOp::Add), vec![idx, a])?;
    }
    let idx = b.contiguous(idx)?;
    b.emit(Op::View(aotgrad_ir::dims![Dim::Const(n)]), vec![idx])
}

/// The gradient of an `as_strided` view where the view or its input names some
/// storage elements several times (PyTorch's `as_strided_backward`): `g` added into a
/// flat buffer at each view element's storage position (`scatter_add` over the
/// positions, which are constants); where the input repeats elements, each storage
/// element's sum divided by how many input elements name it (an equal share per
/// repeat, so an `expand`'s backward summing over the repeats gets it once); then
/// read back in the input's layout. Needs concrete sizes, strides and offsets.
fn overlapping_as_strided(
    b: &mut Builder,
    xm: &TensorMeta,
    size: &[Dim],
    stride: &[Dim],
    offset: &Dim,
    g: ValueId,
    dtype: aotgrad_ir::DType,
) -> Result<ValueId> {
    let consts = |ds: &[Dim]| ds.iter().map(Dim::as_const).collect::<Option<Vec<i64>>>();
    let (Some(sz), Some(st), Some(off), Some(xsz), Some(xst), Some(xoff), Some(len)) = (
        consts(size),
        consts(stride),
        offset.as_const(),
        consts(&xm.shape),
        consts(&xm.strides),
        xm.offset.as_const(),
        extent(&xm.shape, &xm.strides, &xm.offset).zip(extent(size, stride, offset)).map(|(a, v)| a.max(v)),
    ) else {
        return Err(not_diff(format!(
            "the view (size {size:?}, stride {stride:?}) or its input {xm} repeats elements and has symbolic \
             geometry; its gradient needs concrete positions to accumulate"
        )));
    };
    let n: i64 = sz.iter().product();
    let idx = positions(b, &sz, &st, off)?;
    let flat_g = b.contiguous(g)?;
    let flat_g = b.emit(Op::View(aotgrad_ir::dims![Dim::Const(n)]), vec![flat_g])?;
    let flat = b.zeros(aotgrad_ir::dims![Dim::Const(len)], dtype)?;
    let mut acc = b.emit(Op::ScatterAdd(0), vec![flat, idx, flat_g])?;
    if !disjoint(&xm.shape, &xm.strides) {
        let xn: i64 = xsz.iter().product();
        let xidx = positions(b, &xsz, &xst, xoff)?;
        let ones = b.emit(
            Op::Full { shape: aotgrad_ir::dims![Dim::Const(xn)], value: aotgrad_ir::Scalar::Float(1.0), dtype },
            vec![],
        )?;
        let zeros = b.zeros(aotgrad_ir::dims![Dim::Const(len)], dtype)?;
        let count = b.emit(Op::ScatterAdd(0), vec![zeros, xidx, ones])?;
        // Positions the input does not name divide 0 by 0; the input never reads them.
        acc = b.emit(Op::Binary(aotgrad_ir::BinaryOp::Div), vec![acc, count])?;
    }
    let back = Op::AsStrided { size: xm.shape.to_vec(), stride: xm.strides.to_vec(), offset: xm.offset.clone() };
    b.emit(back, vec![acc])
}

/// The gradient of `as_strided(size, stride, offset)` of an input with meta `xm`.
fn as_strided(
    b: &mut Builder,
    xm: &TensorMeta,
    size: &[Dim],
    stride: &[Dim],
    offset: &Dim,
    g: ValueId,
) -> Result<ValueId> {
    let dtype = b.meta(g)?.dtype;
    if !disjoint(size, stride) || !disjoint(&xm.shape, &xm.strides) {
        // Elements the view repeats: their gradients add up at their storage
        // position (PyTorch's `as_strided_backward` accumulates too); elements the
        // input repeats share it out.
        return overlapping_as_strided(b, xm, size, stride, offset, g, dtype);
    }
    let rel = offset.sub(&xm.offset);
    let rel_fits = match (rel.as_const(), extent(size, stride, &rel), xm.numel().as_const()) {
        (Some(r), Some(e), Some(n)) => r >= 0 && e <= n,
        // Symbolic: taken to lie within the input, as `as_strided` views of a
        // contiguous input made by functionalization do.
        (r, _, _) => r.is_none_or(|r| r >= 0),
    };
    if xm.strides == contiguous_strides(&xm.shape) && rel_fits {
        let z = b.zeros(xm.shape.clone(), dtype)?;
        let op = Op::AsStridedScatter { size: size.into(), stride: stride.into(), offset: rel };
        return b.emit(op, vec![z, g]);
    }
    // General case: a flat buffer covering both the input and the view.
    let len = match (extent(&xm.shape, &xm.strides, &xm.offset), extent(size, stride, offset)) {
        (Some(ex), Some(ev)) => Dim::Const(ex.max(ev)),
        // Symbolic: the sum of both extents bounds the larger one without a guard.
        _ => extent_dim(&xm.shape, &xm.strides, &xm.offset).add(&extent_dim(size, stride, offset)),
    };
    let flat = b.zeros(aotgrad_ir::dims![len], dtype)?;
    let op = Op::AsStridedScatter { size: size.into(), stride: stride.into(), offset: offset.clone() };
    let s = b.emit(op, vec![flat, g])?;
    let back = Op::AsStrided { size: xm.shape.to_vec(), stride: xm.strides.to_vec(), offset: xm.offset.clone() };
    b.emit(back, vec![s])
}

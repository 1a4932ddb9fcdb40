//! Rules of indexing ops:
//! - `index_select(x, dim, index)`: `index_add` into zeros, written as `scatter_add`
//!   with the index viewed along `dim` and expanded to the gradient's shape;
//! - `gather(x, dim, index)`: `scatter_add` of the gradient into zeros;
//! - `scatter_add(x, dim, index, src)`: `x` gets the gradient as is, `src` gets
//!   `gather(g, dim, index)` (placed into zeros of `src`'s shape when the index is
//!   smaller than `src`);
//! - `cat`: each input gets its slice of the gradient;
//! - `slice_scatter`/`select_scatter`/`as_strided_scatter(base, src)`: `base` gets the
//!   gradient with zeros scattered into the replaced region, `src` gets that region of
//!   the gradient. The `as_strided` region is read from a contiguous copy of the
//!   gradient (the scatter works on a contiguous copy of `base`); overlapping regions
//!   are rejected.
//!
//! Index arguments are integers and never get gradients.

use super::{arg, views::disjoint};
use crate::builder::Builder;
use crate::{AutodiffError, Result};
use aotgrad_ir::{contiguous_strides, DType, Dim, DimOracle, Node, Op, Rel, StaticOracle, TensorMeta, ValueId};

/// The rule of an indexing node (see the module docs).
pub(crate) fn vjp(b: &mut Builder, node: &Node, g: ValueId, needs: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let gdt = b.meta(g)?.dtype;
    Ok(match &node.op {
        Op::IndexSelect(dim) => {
            if !needs[0] {
                return Ok(vec![None, None]);
            }
            let (x, index) = (arg(node, 0)?, arg(node, 1)?);
            let xm = b.meta(x)?.clone();
            if xm.rank() == 0 {
                return Ok(vec![Some(g), None]);
            }
            let idx = b.cast(index, DType::I64)?;
            let mut along = vec![Dim::Const(1); xm.rank()];
            along[*dim] = b.meta(idx)?.numel();
            let idx = b.reshape(idx, along.into())?;
            let gshape = b.meta(g)?.shape.clone();
            let idx = b.emit(Op::Expand(gshape), vec![idx])?;
            let z = b.zeros(xm.shape.clone(), gdt)?;
            vec![Some(b.emit(Op::ScatterAdd(*dim), vec![z, idx, g])?), None]
        }
        Op::Gather(dim) => {
            if !needs[0] {
                return Ok(vec![None, None]);
            }
            let (x, index) = (arg(node, 0)?, arg(node, 1)?);
            let z = b.zeros(b.meta(x)?.shape.clone(), gdt)?;
            vec![Some(b.emit(Op::ScatterAdd(*dim), vec![z, index, g])?), None]
        }
        Op::ScatterAdd(dim) => {
            let (index, src) = (arg(node, 1)?, arg(node, 2)?);
            let gsrc = if needs[2] {
                let gathered = b.emit(Op::Gather(*dim), vec![g, index])?;
                let (ishape, sshape) = (b.meta(index)?.shape.clone(), b.meta(src)?.shape.clone());
                if ishape == sshape {
                    Some(gathered)
                } else {
                    let z = b.zeros(sshape.clone(), gdt)?;
                    let op = Op::AsStridedScatter {
                        size: ishape.to_vec(),
                        stride: contiguous_strides(&sshape).to_vec(),
                        offset: Dim::Const(0),
                    };
                    Some(b.emit(op, vec![z, gathered])?)
                }
            } else {
                None
            };
            vec![if needs[0] { Some(g) } else { None }, None, gsrc]
        }
        Op::Cat(dim) => {
            let mut out = Vec::with_capacity(node.args.len());
            let mut start = Dim::Const(0);
            for (i, &a) in node.args.iter().enumerate() {
                let am = b.meta(a)?;
                // Legacy: 1-D empty tensors are skipped by cat.
                if am.rank() == 1 && am.shape[0] == Dim::Const(0) {
                    out.push(None);
                    continue;
                }
                let len = am
                    .shape
                    .get(*dim)
                    .cloned()
                    .ok_or_else(|| AutodiffError::Internal(format!("cat input {i} has no dim {dim}")))?;
                let end = start.add(&len);
                if needs[i] {
                    let op = Op::Slice { dim: *dim, start: start.clone(), end: end.clone(), step: 1 };
                    out.push(Some(b.emit(op, vec![g])?));
                } else {
                    out.push(None);
                }
                start = end;
            }
            out
        }
        Op::SliceScatter { dim, start, end, step } => {
            let view = Op::Slice { dim: *dim, start: start.clone(), end: end.clone(), step: *step };
            scatter_pair(b, node, view, node.op.clone(), g, needs)?
        }
        Op::SelectScatter { dim, index } => {
            let view = Op::Select { dim: *dim, index: index.clone() };
            scatter_pair(b, node, view, node.op.clone(), g, needs)?
        }
        Op::AsStridedScatter { size, stride, offset } => {
            if !disjoint(size, stride) {
                return Err(AutodiffError::NotDifferentiable {
                    op: node.op.name(),
                    msg: format!("the replaced region (size {size:?}, stride {stride:?}) has overlapping elements"),
                });
            }
            let view = Op::AsStrided { size: size.clone(), stride: stride.clone(), offset: offset.clone() };
            scatter_pair(b, node, view, node.op.clone(), g, needs)?
        }
        other => return Err(AutodiffError::Internal(format!("{} is not an indexing op", other.name()))),
    })
}

/// `[base, src]` of a view scatter: `base` gets `scatter(g, zeros)`, `src` gets `view(g)`.
fn scatter_pair(
    b: &mut Builder,
    node: &Node,
    view: Op,
    scatter: Op,
    g: ValueId,
    needs: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let src = arg(node, 1)?;
    let gdt = b.meta(g)?.dtype;
    // `as_strided` addresses storage: the result's storage is laid out like the
    // forward result (a clone of the base), so read and write `g` in that layout.
    let g = if matches!(view, Op::AsStrided { .. }) { relayout(b, g, &node.meta)? } else { g };
    let gbase = if needs[0] {
        let z = b.zeros(b.meta(src)?.shape.clone(), gdt)?;
        Some(b.emit(scatter, vec![g, z])?)
    } else {
        None
    };
    let gsrc = if needs[1] { Some(b.emit(view, vec![g])?) } else { None };
    Ok(vec![gbase, gsrc])
}

/// A fresh copy of `g` at offset 0, dense in the dim order of `like` (outermost =
/// largest stride), so storage positions in it are those of a dense tensor laid out
/// like `like`.
fn relayout(b: &mut Builder, g: ValueId, like: &TensorMeta) -> Result<ValueId> {
    let n = like.rank();
    let mut perm: Vec<usize> = (0..n).collect();
    // A stable insertion sort, largest stride first (ties keep the natural order).
    for i in 1..n {
        let mut j = i;
        while j > 0 && StaticOracle.decide(&like.strides[perm[j - 1]], Rel::Lt, &like.strides[perm[j]]) {
            perm.swap(j - 1, j);
            j -= 1;
        }
    }
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return b.contiguous(g);
    }
    let mut inv = vec![0usize; n];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let p = b.emit(Op::Permute(perm), vec![g])?;
    let c = b.emit(Op::Clone, vec![p])?;
    b.emit(Op::Permute(inv), vec![c])
}

//! [`execute`]: run one core op on concrete tensors, dispatching to the kernel modules.
//!
//! - views share `args[0]`'s storage and only get the new metadata (checked to fit);
//! - other ops compute a fresh buffer laid out as `out` says (normally contiguous);
//! - `InPlace(inner)` computes `inner` into a temporary first (so sources overlapping the
//!   destination are safe), then writes it through `args[0]`'s strides, cast to its dtype;
//! - `MetaInPlace(inner)` returns `args[0]`'s storage with the new metadata.

use crate::convert::{cast_buffer, contiguous_copy, filled, scatter_into, Vals};
use crate::iter::Layout;
use crate::pointwise::{self, out_shape};
use crate::storage::{Buffer, CpuTensor, Storage};
use crate::{indexing, matmul, random, reduce, CpuError, Result};
use aotgrad_ir::infer::{has_internal_overlap, infer};
use aotgrad_ir::{Aliasing, DType, Op, Scalar, StaticOracle, TensorMeta};

/// `args[i]`, or a kernel error naming the op.
fn arg<'a>(op: &Op, args: &[&'a CpuTensor], i: usize) -> Result<&'a CpuTensor> {
    args.get(i).copied().ok_or_else(|| {
        CpuError::kernel(op.name(), format!("expected at least {} tensor argument(s), got {}", i + 1, args.len()))
    })
}

/// Run one op. See the crate docs of [`crate::execute`].
pub fn execute(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> Result<CpuTensor> {
    // Elements on a device come back first (a view needs none of them).
    if !matches!(op.aliasing(), Aliasing::View | Aliasing::MutatesMeta) {
        for a in args {
            a.storage.sync_host().map_err(CpuError::Device)?;
        }
    }
    match op.aliasing() {
        Aliasing::View | Aliasing::MutatesMeta => {
            let x = arg(op, args, 0)?;
            let layout = Layout::from_meta(out)?;
            layout.check_fits(&op.name(), x.storage.len())?;
            if out.dtype != x.storage.dtype() {
                return Err(CpuError::Internal(format!(
                    "{}: a view of dtype {} over a {} storage",
                    op.name(),
                    out.dtype,
                    x.storage.dtype()
                )));
            }
            Ok(CpuTensor { storage: x.storage.clone(), meta: out.clone() })
        }
        Aliasing::MutatesData => match op {
            Op::InPlace(inner) => in_place(op, inner, args),
            _ => Err(CpuError::Internal(format!("{}: mutating op without an inner op", op.name()))),
        },
        Aliasing::Fresh => {
            let elems: u128 = out.shape.iter().map(|d| d.as_const().unwrap_or(0).max(0) as u128).product();
            // Kernels compute in 8-byte lanes (f64/i64) before casting: check that much.
            let bytes = elems.saturating_mul(out.dtype.size_bytes() as u128);
            crate::storage::check_alloc_probe("the result", bytes, elems.saturating_mul(8))?;
            let buf = compute(op, args, out)?;
            materialize(&op.name(), buf, out)
        }
    }
}

/// A fresh tensor with metadata `out` holding the row-major values `buf`.
fn materialize(op: &str, buf: Buffer, out: &TensorMeta) -> Result<CpuTensor> {
    let layout = Layout::from_meta(out)?;
    if buf.len() != layout.numel() {
        return Err(CpuError::Internal(format!(
            "{op}: kernel produced {} elements for a result of shape {:?}",
            buf.len(),
            layout.shape
        )));
    }
    let buf = cast_buffer(buf, out.dtype);
    if layout == Layout::contiguous(&layout.shape) {
        return Ok(CpuTensor { storage: Storage::new(buf), meta: out.clone() });
    }
    // A non-contiguous fresh result (e.g. a layout-preserving clone): lay it out as asked.
    // (No elements never overlap: a zero-size result may have zero strides, as
    // PyTorch gives `[0, 3]` results laid out in another dim order.)
    if layout.numel() > 0 && has_internal_overlap(out) {
        return Err(CpuError::Internal(format!("{op}: fresh result metadata {out} has overlapping elements")));
    }
    let mut storage = Buffer::zeros(out.dtype, layout.extent());
    scatter_into(op, &mut storage, &layout, buf)?;
    Ok(CpuTensor { storage: Storage::new(storage), meta: out.clone() })
}

/// `InPlace(inner)`: the IR's rules decide what may be written (the result must fit
/// the target's shape, its dtype must be castable to the target's, and the target must
/// not overlap itself) and in which dtype `inner` computes, exactly as inference does
/// for the tracer.
fn in_place(op: &Op, inner: &Op, args: &[&CpuTensor]) -> Result<CpuTensor> {
    let name = op.name();
    let target = arg(op, args, 0)?;
    let metas: Vec<&TensorMeta> = args.iter().map(|t| &t.meta).collect();
    infer(op, &metas, &mut StaticOracle)?;
    let result_dtype = infer(inner, &metas, &mut StaticOracle)?.dtype;
    let layout = Layout::from_meta(&target.meta)?;
    let inner_out = TensorMeta::contiguous(target.meta.shape.clone(), result_dtype);
    // Compute into a temporary first: sources may overlap the destination.
    let value = compute(inner, args, &inner_out)?;
    let mut guard = target.storage.write();
    scatter_into(&name, &mut guard, &layout, value)?;
    drop(guard);
    Ok(CpuTensor { storage: target.storage.clone(), meta: target.meta.clone() })
}

fn numel(out: &TensorMeta) -> Result<usize> {
    Ok(out_shape(out)?.iter().product())
}

/// `start + i * step` for `i < numel(out)`: integral dtypes truncate `start`/`step` to
/// integers and use (wrapping) i64 arithmetic, like PyTorch; floating dtypes compute
/// in f64 and round once.
fn arange(start: Scalar, step: Scalar, out: &TensorMeta) -> Result<Buffer> {
    let n = numel(out)?;
    let vals = if out.dtype.is_float() {
        let (a, s) = (start.to_f64(), step.to_f64());
        Vals::F64((0..n).map(|i| a + i as f64 * s).collect())
    } else {
        let (a, s) = (start.to_i64(), step.to_i64());
        Vals::I64((0..n as i64).map(|i| a.wrapping_add(i.wrapping_mul(s))).collect())
    };
    Ok(vals.into_buffer(out.dtype))
}

fn need_float(op: &Op, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(CpuError::kernel(op.name(), format!("needs a floating dtype, got {dtype}")))
    }
}

/// Compute a non-view op into a contiguous buffer of `out`'s shape.
pub(crate) fn compute(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> Result<Buffer> {
    let a = |i: usize| arg(op, args, i);
    match op {
        Op::Unary(u) => pointwise::unary(*u, a(0)?, out),
        Op::Binary(b) => pointwise::binary(*b, a(0)?, a(1)?, out),
        Op::BinaryScalar(b, s) => pointwise::binary_scalar(*b, a(0)?, *s, out),
        Op::Compare(c) => pointwise::compare(*c, a(0)?, a(1)?, out),
        Op::CompareScalar(c, s) => pointwise::compare_scalar(*c, a(0)?, *s, out),
        Op::Where => pointwise::where_(a(0)?, a(1)?, a(2)?, out),
        Op::Clamp { min, max } => pointwise::clamp(a(0)?, *min, *max, out),
        Op::Cast(_) => pointwise::convert("to", a(0)?, out),
        Op::Copy => {
            a(0)?;
            pointwise::convert("copy", a(1)?, out)
        }
        Op::Clone => Ok(cast_buffer(contiguous_copy("clone", a(0)?)?, out.dtype)),
        // The elements in row-major order are those of the new shape: a contiguous copy.
        Op::UnsafeView(_) => Ok(cast_buffer(contiguous_copy("_unsafe_view", a(0)?)?, out.dtype)),
        Op::Reduce { op: r, dims, .. } => reduce::reduce(*r, a(0)?, dims, out),
        Op::ArgMax { dim, .. } => reduce::arg_extreme(true, a(0)?, *dim, out),
        Op::ArgMin { dim, .. } => reduce::arg_extreme(false, a(0)?, *dim, out),
        Op::Cumsum(dim) => reduce::cumsum(a(0)?, *dim, out),
        Op::Argsort { dim, descending } => reduce::argsort(a(0)?, *dim, *descending, out),
        Op::Conv2d(_)
        | Op::Conv2dInputGrad { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::MaxPool2d(_)
        | Op::MaxPool2dGrad(_) => crate::conv::compute(op, args, out),
        Op::Mm => matmul::matmul(a(0)?, a(1)?, out, false),
        Op::Bmm => matmul::matmul(a(0)?, a(1)?, out, true),
        Op::Full { value, .. } | Op::FullLike { value, .. } => {
            if matches!(op, Op::FullLike { .. }) {
                a(0)?;
            }
            Ok(filled(*value, out.dtype, numel(out)?))
        }
        Op::Arange { start, step, .. } => arange(*start, *step, out),
        Op::Rand { seed, offset, .. } => {
            need_float(op, out.dtype)?;
            let (seed, offset) = rng_state(op, args, 0, *seed, *offset)?;
            Ok(random::uniform(seed, offset, numel(out)?, out.dtype).into_buffer(out.dtype))
        }
        Op::Randn { seed, offset, .. } => {
            need_float(op, out.dtype)?;
            let (seed, offset) = rng_state(op, args, 0, *seed, *offset)?;
            Ok(random::normal(seed, offset, numel(out)?).into_buffer(out.dtype))
        }
        Op::Bernoulli { p, seed, offset } => {
            a(0)?;
            if !(0.0..=1.0).contains(p) {
                return Err(CpuError::kernel("bernoulli", format!("p must be in [0, 1], got {p}")));
            }
            let (seed, offset) = rng_state(op, args, 1, *seed, *offset)?;
            Ok(random::bernoulli(*p, seed, offset, numel(out)?).into_buffer(out.dtype))
        }
        Op::IndexSelect(d) => indexing::index_select(*d, a(0)?, a(1)?, out),
        Op::Gather(d) => indexing::gather(*d, a(0)?, a(1)?, out),
        Op::ScatterAdd(d) => indexing::scatter_add(*d, a(0)?, a(1)?, a(2)?, out),
        Op::Cat(d) => {
            if args.is_empty() {
                return Err(CpuError::kernel("cat", "expected at least one tensor"));
            }
            indexing::cat(*d, args, out)
        }
        Op::SliceScatter { dim, start, end, step } => {
            indexing::slice_scatter((*dim, start, end, *step), a(0)?, a(1)?, out)
        }
        Op::SelectScatter { dim, index } => indexing::select_scatter(*dim, index, a(0)?, a(1)?, out),
        Op::AsStridedScatter { size, stride, offset } => {
            indexing::as_strided_scatter((size, stride, offset), a(0)?, a(1)?, out)
        }
        Op::Composite(c) => Err(CpuError::kernel(
            c.name(),
            format!(
                "composite op `{}` was kept whole; the reference CPU backend runs only core ops (decompose it)",
                c.name()
            ),
        )),
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
        | Op::Alias
        | Op::InPlace(_)
        | Op::MetaInPlace(_) => Err(CpuError::kernel(
            op.name(),
            "a view or mutation cannot be computed into a fresh buffer (nested in an in-place op?)",
        )),
    }
}

/// The counter stream of a random op: its parameters, or — when the op takes the RNG
/// state as two trailing 0-d i64 tensors after its `n` regular arguments — the seed
/// tensor and the base tensor plus the op's offset.
fn rng_state(op: &Op, args: &[&CpuTensor], n: usize, seed: u64, offset: u64) -> Result<(u64, u64)> {
    if args.len() != n + 2 {
        return Ok((seed, offset));
    }
    let scalar = |t: &CpuTensor| -> Result<u64> {
        match t.try_to_vec_i64()?.as_slice() {
            [v] => Ok(*v as u64),
            other => Err(CpuError::kernel(op.name(), format!("RNG state must be 0-d, got {} values", other.len()))),
        }
    };
    Ok((scalar(args[n])?, scalar(args[n + 1])?.wrapping_add(offset)))
}

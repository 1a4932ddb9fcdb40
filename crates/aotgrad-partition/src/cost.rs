//! Size and work estimates shared by the simplifier's extraction cost and the
//! partitioners: bytes of a value, FLOPs of an op.
//!
//! Sizes are concrete when the metadata is; a symbolic dim is evaluated with every
//! symbol set to [`SYMBOL_HINT`] (64), so symbolic graphs get sizes of the right order
//! for typical shapes (and symbols only ever appear as sizes, never as a reason to
//! fail). Arithmetic saturates at `u64::MAX`; a dim that evaluates negative counts as 0.
//!
//! FLOP counts are estimates of the work, not exact instruction counts:
//! - pointwise ops, casts, copies and indexing ops: one per result element;
//! - creation ops (`full`, `full_like`, `arange`): 0 (they only write);
//! - reductions and arg-reductions: one per input element;
//! - `mm` `(n,k)@(k,m)`: `2nkm`; `bmm`: `2bnkm`;
//! - views: 0 (they only compute metadata);
//! - composites: `linear`/`matmul` from their shapes like `mm`, others 8 per element.

use aotgrad_ir::{CompositeOp, Dim, Op, TensorMeta};

/// The value every shape symbol takes in size estimates.
pub const SYMBOL_HINT: i64 = 64;

/// A dim evaluated with every symbol set to [`SYMBOL_HINT`] (0 if negative).
pub fn dim_estimate(d: &Dim) -> u64 {
    match d.eval(&|_| Some(SYMBOL_HINT)) {
        Some(v) if v > 0 => v as u64,
        Some(_) => 0,
        None => u64::MAX,
    }
}

/// Number of elements of a tensor (symbols at [`SYMBOL_HINT`]).
pub fn numel_estimate(meta: &TensorMeta) -> u64 {
    meta.shape.iter().fold(1u64, |acc, d| acc.saturating_mul(dim_estimate(d)))
}

/// Bytes of a tensor: `numel × dtype size` (symbols at [`SYMBOL_HINT`]).
pub fn bytes_of(meta: &TensorMeta) -> u64 {
    numel_estimate(meta).saturating_mul(meta.dtype.size_bytes() as u64)
}

/// Estimated FLOPs of `op` applied to arguments with metadata `args`, producing `out`
/// (see the module docs for the model).
pub fn flops_of(op: &Op, args: &[&TensorMeta], out: &TensorMeta) -> u64 {
    let out_n = numel_estimate(out);
    let in_n = args.first().map_or(0, |a| numel_estimate(a));
    match op {
        _ if op.is_view() => 0,
        Op::Full { .. } | Op::FullLike { .. } | Op::Arange { .. } => 0,
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::ArgMin { .. } => in_n,
        Op::Mm | Op::Bmm | Op::Composite(CompositeOp::Linear | CompositeOp::Matmul) => {
            // The inner dim is the last dim of the first argument.
            let k = args.first().and_then(|a| a.shape.last()).map_or(1, dim_estimate);
            out_n.saturating_mul(k).saturating_mul(2)
        }
        Op::Conv2d(_) | Op::Conv2dInputGrad { .. } | Op::Conv2dWeightGrad { .. } => {
            // Multiply-adds: every product element of the one GEMM-shaped side (the
            // output for conv2d, the gradient for the others) times the weight's
            // elements per output channel.
            let w = match op {
                Op::Conv2dWeightGrad { .. } => out,
                _ => args.get(1).copied().unwrap_or(out),
            };
            let per_channel = numel_estimate(w) / w.shape.first().map_or(1, dim_estimate).max(1);
            let side = if matches!(op, Op::Conv2d(_)) { out_n } else { in_n };
            side.saturating_mul(per_channel).saturating_mul(2)
        }
        Op::MaxPool2d(p) | Op::MaxPool2dGrad(p) => {
            let taps = (p.kernel[0] * p.kernel[1]) as u64;
            if matches!(op, Op::MaxPool2d(_)) { out_n } else { in_n }.saturating_mul(taps)
        }
        Op::Composite(_) => out_n.saturating_mul(8).max(in_n),
        _ => out_n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aotgrad_ir::{DType, SymId};

    #[test]
    fn bytes_and_flops() {
        let a = TensorMeta::from_sizes(&[4, 3], DType::F32);
        let b = TensorMeta::from_sizes(&[3, 5], DType::F32);
        let c = TensorMeta::from_sizes(&[4, 5], DType::F32);
        assert_eq!(bytes_of(&a), 48);
        assert_eq!(flops_of(&Op::Mm, &[&a, &b], &c), 2 * 4 * 3 * 5);
        assert_eq!(flops_of(&Op::T, &[&a], &TensorMeta::from_sizes(&[3, 4], DType::F32)), 0);
        let s = TensorMeta::contiguous(vec![Dim::sym(SymId(0)), Dim::Const(2)], DType::F64);
        assert_eq!(bytes_of(&s), 64 * 2 * 8);
        assert_eq!(bytes_of(&TensorMeta::from_sizes(&[], DType::Bool)), 1);
    }
}

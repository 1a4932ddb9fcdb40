//! Pointwise ops: broadcasting of the tensor operands, PyTorch's type promotion, and
//! PyTorch's layout of a fresh elementwise result (`iter_layout`): it follows
//! the memory order of the operands, so `x.t().mul(2)` has `x.t()`'s strides.

use super::shapes::expand_geometry;
use super::{arity, broadcast_shapes, check_sizes_non_negative, decide, dense, rng_arity, Result};
use crate::dtype::{result_type, DType, Operand, Scalar};
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::sym::{Dim, DimOracle, Rel};

/// Infer a pointwise op (`Unary`, `Binary`, `BinaryScalar`, `Compare`, `CompareScalar`,
/// `Where`, `Clamp`, `Cast`, `Copy`, `FullLike`, `Bernoulli`).
pub(crate) fn infer_pointwise(
    op: &Op,
    name: &str,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    match op {
        Op::Unary(u) => {
            arity(name, args, 1)?;
            let x = args[0];
            iter_layout(name, x.shape.clone(), unary_dtype(name, *u, x.dtype)?, &[x], oracle)
        }
        Op::Binary(b) => {
            arity(name, args, 2)?;
            let shape = broadcast_shapes(name, &args[0].shape, &args[1].shape, oracle)?;
            let dtype = binary_dtype(name, *b, &[Operand::of(args[0]), Operand::of(args[1])])?;
            iter_layout(name, shape, dtype, &[args[0], args[1]], oracle)
        }
        Op::BinaryScalar(b, s) => {
            arity(name, args, 1)?;
            let dtype = binary_dtype(name, *b, &[Operand::of(args[0]), Operand::Scalar(*s)])?;
            // An integer scalar computed in an integer dtype must fit it (a float result
            // computes in floating point, where any integer does).
            if matches!(s, Scalar::Int(_)) && !dtype.is_float() {
                super::check_scalar_fits(name, *s, dtype)?;
            }
            scalar_layout(name, args[0], dtype, *b != BinaryOp::Pow, oracle)
        }
        Op::Compare(_) => {
            arity(name, args, 2)?;
            let shape = broadcast_shapes(name, &args[0].shape, &args[1].shape, oracle)?;
            iter_layout(name, shape, DType::Bool, &[args[0], args[1]], oracle)
        }
        Op::CompareScalar(..) => {
            arity(name, args, 1)?;
            scalar_layout(name, args[0], DType::Bool, true, oracle)
        }
        Op::Where => {
            arity(name, args, 3)?;
            let (cond, a, b) = (args[0], args[1], args[2]);
            if cond.dtype != DType::Bool {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: cond.dtype.to_string(),
                    what: "condition (must be bool)".into(),
                });
            }
            let ab = broadcast_shapes(name, &a.shape, &b.shape, oracle)?;
            let shape = broadcast_shapes(name, &cond.shape, &ab, oracle)?;
            iter_layout(name, shape, result_type(&[Operand::of(a), Operand::of(b)]), &[cond, a, b], oracle)
        }
        Op::Clamp { min, max } => {
            arity(name, args, 1)?;
            let x = args[0];
            if min.is_none() && max.is_none() {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: "at least one of 'min' or 'max' must not be None".into(),
                });
            }
            let mut ops = vec![Operand::of(x)];
            ops.extend(min.iter().chain(max.iter()).map(|s| Operand::Scalar(*s)));
            // Bool inputs are promoted by integer/float bounds; a bool result has no kernel.
            let dtype = result_type(&ops);
            if dtype == DType::Bool {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: dtype.to_string(),
                    what: "input (clamp is not supported for boolean tensors)".into(),
                });
            }
            iter_layout(name, x.shape.clone(), dtype, &[x], oracle)
        }
        Op::Cast(dtype) => {
            arity(name, args, 1)?;
            like_layout(name, args[0], *dtype, oracle)
        }
        Op::Copy => {
            arity(name, args, 2)?;
            let (dst, src) = (args[0], args[1]);
            let target: Vec<Option<Dim>> = dst.shape.iter().cloned().map(Some).collect();
            // src must expand to dst's shape exactly (PyTorch's copy_ expands src).
            expand_geometry(name, &src.shape, &src.strides, &target, oracle)?;
            // The new value of `dst`, laid out as its storage keeps it: `dst`'s own
            // strides (gaps included) at offset 0, or dense in its order when it
            // repeats elements (eager refuses writes to those).
            if super::overlaps_internally(dst, oracle) {
                like_layout(name, dst, dst.dtype, oracle)
            } else {
                Ok(TensorMeta {
                    shape: dst.shape.clone(),
                    strides: dst.strides.clone(),
                    offset: Dim::Const(0),
                    dtype: dst.dtype,
                })
            }
        }
        Op::FullLike { dtype, value } => {
            arity(name, args, 1)?;
            let dtype = dtype.unwrap_or(args[0].dtype);
            super::check_scalar_fits(name, *value, dtype)?;
            like_layout(name, args[0], dtype, oracle)
        }
        Op::Bernoulli { p, .. } => {
            rng_arity(name, args, 1)?;
            let x = args[0];
            if !x.dtype.is_float() {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: x.dtype.to_string(),
                    what: "input (bernoulli needs a floating tensor)".into(),
                });
            }
            check_probability(name, "bernoulli", *p)?;
            Ok(x.to_contiguous())
        }
        other => Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not pointwise", other.name()) }),
    }
}

/// The layout of a fresh elementwise result of `shape` over the tensor operands
/// `ins`, as PyTorch's `TensorIterator` allocates it:
/// - operands all of the result's shape and all contiguous: row-major;
/// - all of the result's shape, non-overlapping and dense, with equal strides: those
///   strides;
/// - otherwise the dims are ordered by the operands' strides (the first operand
///   whose strides differ on a pair of dims decides; broadcast dims do not take
///   part; equal strides put the smaller dim first), and the result is dense in that
///   order (row-major when the order is the natural one).
///
/// Symbolic strides and sizes are compared through the oracle.
pub(crate) fn iter_layout(
    name: &str,
    shape: Dims,
    dtype: DType,
    ins: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    check_sizes_non_negative(name, &shape)?;
    let same_shape = |m: &TensorMeta, oracle: &mut dyn DimOracle| {
        m.rank() == shape.len() && m.shape.iter().zip(&shape).all(|(a, b)| a == b || decide(oracle, a, Rel::Eq, b))
    };
    if !ins.is_empty() && ins.iter().all(|m| same_shape(m, oracle)) {
        if ins.iter().all(|m| m.is_contiguous()) {
            return dense(name, shape, dtype);
        }
        let first = &ins[0].strides;
        if ins.iter().all(|m| &m.strides == first && non_overlapping_and_dense(m, oracle)) {
            return Ok(TensorMeta { shape, strides: first.clone(), offset: Dim::Const(0), dtype });
        }
    }
    let n = shape.len();
    let one = Dim::Const(1);
    // Each operand's strides over the result's dims (0 where it broadcasts).
    let strides: Vec<Dims> = ins
        .iter()
        .map(|m| {
            let lead = n.saturating_sub(m.rank());
            let mut st: Dims = crate::dims![Dim::Const(0); n];
            for (i, (sz, sd)) in m.shape.iter().zip(&m.strides).enumerate() {
                if !(*sz == one && shape[lead + i] != one) {
                    st[lead + i] = sd.clone();
                }
            }
            st
        })
        .collect();
    let order = dim_order(&shape, &strides, oracle);
    if order.iter().copied().eq((0..n).rev()) {
        return dense(name, shape, dtype);
    }
    let mut out = vec![Dim::Const(0); n];
    let mut next = Dim::Const(1);
    for &d in &order {
        out[d] = next.clone();
        next = super::mul_dims(name, "strides", &next, &shape[d])?;
    }
    Ok(TensorMeta { shape, strides: out.into(), offset: Dim::Const(0), dtype })
}

/// A one-tensor op with a scalar operand: PyTorch wraps the scalar as a 0-d tensor
/// (`x * 2`, `x > 0`: the result never takes the one-operand fast path), except for
/// `pow` with a scalar exponent, which is a unary op.
fn scalar_layout(
    name: &str,
    x: &TensorMeta,
    dtype: DType,
    wrapped: bool,
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    if wrapped {
        let zero_d = TensorMeta::contiguous(Vec::new(), x.dtype);
        iter_layout(name, x.shape.clone(), dtype, &[x, &zero_d], oracle)
    } else {
        iter_layout(name, x.shape.clone(), dtype, &[x], oracle)
    }
}

/// PyTorch's `empty_like` with the preserved memory format (`zeros_like`, `to`,
/// `clone`): a non-overlapping dense input's exact strides, else dense strides in
/// the input's memory order.
pub fn like_layout(name: &str, x: &TensorMeta, dtype: DType, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    check_sizes_non_negative(name, &x.shape)?;
    if non_overlapping_and_dense(x, oracle) {
        return Ok(TensorMeta { shape: x.shape.clone(), strides: x.strides.clone(), offset: Dim::Const(0), dtype });
    }
    let n = x.rank();
    let order = dim_order(&x.shape, std::slice::from_ref(&x.strides), oracle);
    let mut out = vec![Dim::Const(0); n];
    let mut next = Dim::Const(1);
    for &d in &order {
        out[d] = next.clone();
        // Sizes 0 and 1 do not advance the stride.
        if small(&x.shape[d]) {
            continue;
        }
        next = super::mul_dims(name, "strides", &next, &x.shape[d])?;
    }
    Ok(TensorMeta { shape: x.shape.clone(), strides: out.into(), offset: Dim::Const(0), dtype })
}

/// The dims from fastest to slowest by the operands' strides: an insertion sort
/// from the natural order (last dim fastest) where, for a pair of dims, the first
/// operand with nonzero, different strides decides, and equal strides put the
/// smaller dim first (PyTorch's `reorder_dimensions`).
fn dim_order(shape: &[Dim], strides: &[Dims], oracle: &mut dyn DimOracle) -> Vec<usize> {
    let zero = Dim::Const(0);
    let mut should_swap = |d0: usize, d1: usize| -> i32 {
        for st in strides {
            let (a, b) = (&st[d0], &st[d1]);
            if *a == zero || *b == zero {
                continue;
            }
            if decide(oracle, a, Rel::Lt, b) {
                return -1;
            }
            if decide(oracle, b, Rel::Lt, a) {
                return 1;
            }
            if decide(oracle, &shape[d1], Rel::Lt, &shape[d0]) {
                return 1;
            }
        }
        0
    };
    let n = shape.len();
    let mut perm: Vec<usize> = (0..n).rev().collect();
    for i in 1..n {
        let mut d1 = i;
        for d0 in (0..i).rev() {
            match should_swap(perm[d0], perm[d1]) {
                c if c > 0 => {
                    perm.swap(d0, d1);
                    d1 = d0;
                }
                c if c < 0 => break,
                _ => {}
            }
        }
    }
    perm
}

/// A size of 0 or 1, size-obliviously (as PyTorch's layout checks ask it): a
/// symbolic size counts as at least 2, so no guard specializes it.
fn small(d: &Dim) -> bool {
    d.as_const().is_some_and(|c| c < 2)
}

/// PyTorch's `is_non_overlapping_and_dense`: the elements fill a block of memory
/// exactly once in some order of the dims (dims of size 0 or 1 aside).
pub fn non_overlapping_and_dense(m: &TensorMeta, oracle: &mut dyn DimOracle) -> bool {
    let n = m.rank();
    if n == 1 {
        return small(&m.shape[0]) || m.strides[0] == Dim::Const(1);
    }
    let mut perm: Vec<usize> = (0..n).filter(|&d| !small(&m.shape[d])).collect();
    // A stable sort by stride (dims of size 0 or 1 last, where they do not matter).
    for i in 1..perm.len() {
        let mut j = i;
        while j > 0 && decide(oracle, &m.strides[perm[j]], Rel::Lt, &m.strides[perm[j - 1]]) {
            perm.swap(j, j - 1);
            j -= 1;
        }
    }
    let mut require = Dim::Const(1);
    for &d in &perm {
        if m.strides[d] != require {
            return false;
        }
        match require.checked_mul(&m.shape[d]) {
            Some(r) => require = r,
            None => return false,
        }
    }
    true
}

/// `p` must lie in `[0, 1]` (NaN rejected).
pub(crate) fn check_probability(name: &str, what: &str, p: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("{what} probability has to be between 0 and 1, but got {p}"),
        });
    }
    Ok(())
}

/// Result dtype of a unary op.
pub(crate) fn unary_dtype(name: &str, u: UnaryOp, dtype: DType) -> Result<DType> {
    match u {
        UnaryOp::LogicalNot => Ok(DType::Bool),
        UnaryOp::Neg if dtype == DType::Bool => Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: "negation of a bool tensor (use logical_not)".into(),
        }),
        UnaryOp::Relu if dtype == DType::Bool => Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: "input (boolean inputs not supported for relu)".into(),
        }),
        _ if u.is_rounding() && dtype == DType::Bool => Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: format!("input (\"{name}\" is not implemented for bool tensors)"),
        }),
        _ if u.promotes_int_to_float() && !dtype.is_float() => Ok(DType::DEFAULT_FLOAT),
        _ => Ok(dtype),
    }
}

/// Result dtype of a binary op over its promotion participants.
pub(crate) fn binary_dtype(name: &str, b: BinaryOp, ops: &[Operand]) -> Result<DType> {
    let is_bool = |o: &Operand| match o {
        Operand::Tensor(d) | Operand::ZeroDim(d) => *d == DType::Bool,
        Operand::Scalar(s) => matches!(s, Scalar::Bool(_)),
    };
    if b == BinaryOp::Sub && ops.iter().any(is_bool) {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: DType::Bool.to_string(),
            what: "subtraction with a bool operand (use logical_xor or logical_not)".into(),
        });
    }
    let dt = result_type(ops);
    if b == BinaryOp::Pow && dt == DType::Bool {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: DType::Bool.to_string(),
            what: "pow with a bool result (PyTorch has no bool pow)".into(),
        });
    }
    Ok(if b == BinaryOp::Div && !dt.is_float() { DType::DEFAULT_FLOAT } else { dt })
}

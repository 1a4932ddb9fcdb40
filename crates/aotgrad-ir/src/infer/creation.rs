//! Creation ops without tensor arguments: `full`, `arange`, `rand`, `randn`.

use super::{arity, dense, rng_arity, Result};
use crate::dtype::{DType, Scalar};
use crate::error::ShapeError;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::Dim;

/// Infer `Full`, `Arange`, `Rand` or `Randn`.
pub(crate) fn infer_creation(op: &Op, name: &str, args: &[&TensorMeta]) -> Result<TensorMeta> {
    match op {
        Op::Rand { .. } | Op::Randn { .. } => rng_arity(name, args, 0)?,
        _ => arity(name, args, 0)?,
    }
    match op {
        Op::Full { shape, dtype, value } => {
            super::check_scalar_fits(name, *value, *dtype)?;
            dense(name, shape.clone(), *dtype)
        }
        Op::Rand { shape, dtype, .. } | Op::Randn { shape, dtype, .. } => {
            if !dtype.is_float() {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: dtype.to_string(),
                    what: "result (random values need a floating dtype)".into(),
                });
            }
            dense(name, shape.clone(), *dtype)
        }
        Op::Arange { start, end, step, dtype } => {
            for v in [start, end, step] {
                super::check_scalar_fits(name, *v, *dtype)?;
            }
            let n = arange_len(name, *start, *end, *step, *dtype)?;
            dense(name, crate::dims![Dim::Const(n)], *dtype)
        }
        other => Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not a creation op", other.name()) }),
    }
}

/// Number of elements of `arange(start, end, step)` with result type `dtype`, like
/// PyTorch: integral dtypes truncate the bounds to integers and use integer
/// arithmetic, floating dtypes compute `ceil((end - start) / step)` in f64. The step
/// must be non-zero and point from `start` towards `end`.
pub fn arange_len(name: &str, start: Scalar, end: Scalar, step: Scalar, dtype: DType) -> Result<i64> {
    let invalid = |msg: String| ShapeError::Invalid { op: name.into(), msg };
    if dtype == DType::Bool {
        return Err(ShapeError::DType { op: name.into(), dtype: dtype.to_string(), what: "arange result".into() });
    }
    let (fs, fe, fst) = (start.to_f64(), end.to_f64(), step.to_f64());
    if !(fs.is_finite() && fe.is_finite()) {
        return Err(invalid(format!("unsupported range: {start} -> {end}")));
    }
    let size = if dtype.is_float() {
        if fst == 0.0 || !fst.is_finite() {
            return Err(invalid(format!("step must be nonzero and finite, got {step}")));
        }
        check_direction(name, fs, fe, fst)?;
        ((fe - fs) / fst).ceil()
    } else {
        let (s, e, st) = (start.to_i64(), end.to_i64(), step.to_i64());
        if st == 0 {
            return Err(invalid(format!("step must be nonzero, got {step}")));
        }
        check_direction(name, s as f64, e as f64, st as f64)?;
        // ceil((e - s) / st) in exact integer arithmetic (i128: no overflow).
        let (mut num, mut den) = (e as i128 - s as i128, st as i128);
        if den < 0 {
            (num, den) = (-num, -den);
        }
        let q = num.div_euclid(den);
        (if num.rem_euclid(den) != 0 { q + 1 } else { q }) as f64
    };
    if !(0.0..9.223_372_036_854_775e18).contains(&size) {
        return Err(invalid(format!("invalid size {size} for range {start} -> {end} step {step}")));
    }
    Ok(size as i64)
}

/// The step must point from `start` towards `end` (or the range be empty).
fn check_direction(name: &str, s: f64, e: f64, st: f64) -> Result<()> {
    if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!("upper bound and larger bound inconsistent with step sign: {s} -> {e} step {st}"),
        });
    }
    Ok(())
}

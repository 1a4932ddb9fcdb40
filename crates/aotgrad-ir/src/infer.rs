//! Shape, stride and dtype inference for every core op: read-only, typed errors.
//!
//! IMPLEMENTATION IN PROGRESS (helper A) — signatures are fixed.

use crate::error::ShapeError;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::{Dim, DimOracle};

/// Infer the result metadata of `op` applied to `args`.
pub fn infer(op: &Op, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta, ShapeError> {
    let _ = (args, oracle);
    Err(ShapeError::Invalid { op: op.name(), msg: "inference not written yet".into() })
}

/// Broadcast two shapes (right-aligned; size-1 dims stretch).
pub fn broadcast_shapes(op: &str, a: &[Dim], b: &[Dim], oracle: &mut dyn DimOracle) -> Result<Vec<Dim>, ShapeError> {
    let _ = (a, b, oracle);
    Err(ShapeError::Invalid { op: op.into(), msg: "not written yet".into() })
}

/// Wrap a possibly negative dim index into `0..rank` (rank 0 accepts 0 and -1).
pub fn wrap_dim(op: &str, dim: i64, rank: usize) -> Result<usize, ShapeError> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        return Err(ShapeError::DimOutOfRange { op: op.into(), dim, rank });
    }
    Ok(if dim < 0 { (dim + r) as usize } else { dim as usize })
}

/// Resolve a view/reshape size list where `None` stands for `-1`.
pub fn resolve_view_shape(
    op: &str,
    from: &[Dim],
    shape: &[Option<Dim>],
    oracle: &mut dyn DimOracle,
) -> Result<Vec<Dim>, ShapeError> {
    let _ = (from, shape, oracle);
    Err(ShapeError::Invalid { op: op.into(), msg: "not written yet".into() })
}

/// Normalize Python-style slice bounds against `size` (negative values count from
/// the end, then clamp into `[0, size]`, and `end >= start`). Returns `(start, end)`.
pub fn normalize_slice(
    op: &str,
    size: &Dim,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
    oracle: &mut dyn DimOracle,
) -> Result<(Dim, Dim), ShapeError> {
    let _ = (size, start, end, step, oracle);
    Err(ShapeError::Invalid { op: op.into(), msg: "not written yet".into() })
}

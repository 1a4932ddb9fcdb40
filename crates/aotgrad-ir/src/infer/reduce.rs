//! Reductions (`sum`, `mean`, `amax`, `amin`), `argmax`/`argmin`, and the scans along
//! one dim (`cumsum`, `argsort`).

use super::{arity, check_dim, dense, dim_eq, shape_str, Result};
use crate::dtype::DType;
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::{Op, ReduceOp};
use crate::sym::{Dim, DimOracle};

/// Infer `Reduce`, `ArgMax` or `ArgMin`.
pub(crate) fn infer_reduce(
    op: &Op,
    name: &str,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    arity(name, args, 1)?;
    let x = args[0];
    match op {
        Op::Reduce { op: r, dims, keepdim } => {
            if !dims.windows(2).all(|w| w[0] < w[1]) {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!("reduced dims {dims:?} must be sorted and distinct"),
                });
            }
            for &d in dims {
                check_dim(name, d, x.rank(), true)?;
            }
            let all: Vec<usize> = (0..x.rank()).collect();
            let reduced: &[usize] = if dims.is_empty() { &all } else { dims };
            let dtype = match r {
                ReduceOp::Sum if !x.dtype.is_float() => DType::I64,
                ReduceOp::Mean if !x.dtype.is_float() => {
                    return Err(ShapeError::DType {
                        op: name.into(),
                        dtype: x.dtype.to_string(),
                        what: "input (mean needs a floating point input)".into(),
                    })
                }
                _ => x.dtype,
            };
            if matches!(r, ReduceOp::Amax | ReduceOp::Amin) {
                if x.rank() == 0 {
                    // A 0-d tensor has one element: nothing empty to reduce.
                } else if let Some(&d) = reduced.iter().find(|&&d| dim_eq(oracle, &x.shape[d], &Dim::Const(0))) {
                    return Err(ShapeError::Invalid {
                        op: name.into(),
                        msg: format!(
                            "expected reduction dim {d} to have non-zero size (input shape {})",
                            shape_str(&x.shape)
                        ),
                    });
                }
            }
            dense(name, reduced_shape(&x.shape, reduced, *keepdim), dtype)
        }
        Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => {
            check_dim(name, *dim, x.rank(), true)?;
            if x.rank() == 0 {
                return dense(name, Dims::new(), DType::I64);
            }
            if dim_eq(oracle, &x.shape[*dim], &Dim::Const(0)) {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!(
                        "expected reduction dim {dim} to have non-zero size (input shape {})",
                        shape_str(&x.shape)
                    ),
                });
            }
            dense(name, reduced_shape(&x.shape, &[*dim], *keepdim), DType::I64)
        }
        other => Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not a reduction", other.name()) }),
    }
}

/// Infer `Cumsum` or `Argsort`: the input's shape, contiguous; `cumsum` of integers
/// or bools and `argsort` give i64.
pub(crate) fn infer_scan(op: &Op, name: &str, args: &[&TensorMeta]) -> Result<TensorMeta> {
    arity(name, args, 1)?;
    let x = args[0];
    let (dim, dtype) = match op {
        Op::Cumsum(dim) => (*dim, if x.dtype.is_float() { x.dtype } else { DType::I64 }),
        Op::Argsort { dim, .. } => (*dim, DType::I64),
        other => return Err(ShapeError::Invalid { op: name.into(), msg: format!("{} is not a scan", other.name()) }),
    };
    check_dim(name, dim, x.rank(), true)?;
    dense(name, x.shape.clone(), dtype)
}

/// The shape left after reducing `dims` (kept as size 1 with `keepdim`).
pub(crate) fn reduced_shape(shape: &[Dim], dims: &[usize], keepdim: bool) -> Dims {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (dims.contains(&i), keepdim) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Const(1)),
            (true, false) => None,
        })
        .collect()
}

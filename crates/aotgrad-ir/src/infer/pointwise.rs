//! Pointwise ops: broadcasting of the tensor operands and PyTorch's type promotion.
//! Results are dense row-major at offset 0.

use super::shapes::expand_geometry;
use super::{arity, broadcast_shapes, dense, rng_arity, Result};
use crate::dtype::{result_type, DType, Operand, Scalar};
use crate::error::ShapeError;
use crate::meta::TensorMeta;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::sym::{Dim, DimOracle};

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
            dense(name, x.shape.clone(), unary_dtype(name, *u, x.dtype)?)
        }
        Op::Binary(b) => {
            arity(name, args, 2)?;
            let shape = broadcast_shapes(name, &args[0].shape, &args[1].shape, oracle)?;
            let dtype = binary_dtype(name, *b, &[Operand::of(args[0]), Operand::of(args[1])])?;
            dense(name, shape, dtype)
        }
        Op::BinaryScalar(b, s) => {
            arity(name, args, 1)?;
            let dtype = binary_dtype(name, *b, &[Operand::of(args[0]), Operand::Scalar(*s)])?;
            // An integer scalar computed in an integer dtype must fit it (a float result
            // computes in floating point, where any integer does).
            if matches!(s, Scalar::Int(_)) && !dtype.is_float() {
                super::check_scalar_fits(name, *s, dtype)?;
            }
            dense(name, args[0].shape.clone(), dtype)
        }
        Op::Compare(_) => {
            arity(name, args, 2)?;
            let shape = broadcast_shapes(name, &args[0].shape, &args[1].shape, oracle)?;
            dense(name, shape, DType::Bool)
        }
        Op::CompareScalar(..) => {
            arity(name, args, 1)?;
            dense(name, args[0].shape.clone(), DType::Bool)
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
            dense(name, shape, result_type(&[Operand::of(a), Operand::of(b)]))
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
            dense(name, x.shape.clone(), dtype)
        }
        Op::Cast(dtype) => {
            arity(name, args, 1)?;
            dense(name, args[0].shape.clone(), *dtype)
        }
        Op::Copy => {
            arity(name, args, 2)?;
            let (dst, src) = (args[0], args[1]);
            let target: Vec<Option<Dim>> = dst.shape.iter().cloned().map(Some).collect();
            // src must expand to dst's shape exactly (PyTorch's copy_ expands src).
            expand_geometry(name, &src.shape, &src.strides, &target, oracle)?;
            Ok(dst.to_contiguous())
        }
        Op::FullLike { dtype, value } => {
            arity(name, args, 1)?;
            let dtype = dtype.unwrap_or(args[0].dtype);
            super::check_scalar_fits(name, *value, dtype)?;
            dense(name, args[0].shape.clone(), dtype)
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

//! Composite ops kept whole in a graph (see [`CompositeOp`]): their shape and dtype
//! rules, matching the PyTorch functions they stand for.

use super::linalg::{linear, matmul_shape, same_dtype};
use super::pointwise::check_probability;
use super::{arity, arity_error, broadcast_shapes, check_dim, dense, dim_eq, shape_str, Result};
use crate::dtype::{result_type, DType, Operand};
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::CompositeOp;
use crate::sym::{Dim, DimOracle};

/// Infer a composite op.
pub(crate) fn infer_composite(
    c: &CompositeOp,
    name: &str,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    match c {
        CompositeOp::Linear => linear(name, args, oracle),
        CompositeOp::Matmul => {
            arity(name, args, 2)?;
            let (a, b) = (args[0], args[1]);
            same_dtype(name, a.dtype, b.dtype)?;
            dense(name, matmul_shape(name, &a.shape, &b.shape, oracle)?, a.dtype)
        }
        CompositeOp::Gelu { .. } | CompositeOp::Silu => {
            arity(name, args, 1)?;
            float_input(name, "input", args[0].dtype)?;
            Ok(args[0].to_contiguous())
        }
        CompositeOp::Softmax { dim } | CompositeOp::LogSoftmax { dim } => {
            arity(name, args, 1)?;
            check_dim(name, *dim, args[0].rank(), true)?;
            float_input(name, "input", args[0].dtype)?;
            Ok(args[0].to_contiguous())
        }
        CompositeOp::Dropout { p, .. } => {
            super::rng_arity(name, args, 1)?;
            float_input(name, "input", args[0].dtype)?;
            check_probability(name, "dropout", *p)?;
            Ok(args[0].to_contiguous())
        }
        CompositeOp::LayerNorm { normalized_rank, .. } => layer_norm(name, args, *normalized_rank, oracle),
        CompositeOp::Embedding => {
            arity(name, args, 2)?;
            let (weight, indices) = (args[0], args[1]);
            if weight.rank() != 2 {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!("'weight' must be 2-D, got shape {}", shape_str(&weight.shape)),
                });
            }
            if !indices.dtype.is_int() {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: indices.dtype.to_string(),
                    what: "indices (expected i64 or i32)".into(),
                });
            }
            let mut shape = indices.shape.clone();
            shape.push(weight.shape[1].clone());
            dense(name, shape, weight.dtype)
        }
        CompositeOp::MseLoss => {
            arity(name, args, 2)?;
            broadcast_shapes(name, &args[0].shape, &args[1].shape, oracle)?;
            let dtype = result_type(&[Operand::of(args[0]), Operand::of(args[1])]);
            float_input(name, "input and target", dtype)?;
            dense(name, Dims::new(), dtype)
        }
        CompositeOp::CrossEntropy => cross_entropy(name, args, oracle),
        CompositeOp::MaskedFill { .. } => {
            arity(name, args, 2)?;
            let (x, mask) = (args[0], args[1]);
            if mask.dtype != DType::Bool {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!("only supports boolean masks, but got mask with dtype {}", mask.dtype),
                });
            }
            dense(name, broadcast_shapes(name, &x.shape, &mask.shape, oracle)?, x.dtype)
        }
        CompositeOp::Tril { .. } | CompositeOp::Triu { .. } => {
            arity(name, args, 1)?;
            if args[0].rank() < 2 {
                return Err(ShapeError::Invalid {
                    op: name.into(),
                    msg: format!("input tensor must have at least 2 dimensions, got {}", args[0].rank()),
                });
            }
            Ok(args[0].to_contiguous())
        }
        CompositeOp::Var { dims, keepdim, .. } => {
            arity(name, args, 1)?;
            let x = args[0];
            float_input(name, "input", x.dtype)?;
            for &d in dims {
                check_dim(name, d, x.rank(), false)?;
            }
            dense(name, super::reduce::reduced_shape(&x.shape, dims, *keepdim), x.dtype)
        }
        CompositeOp::OneHot { num_classes } => {
            arity(name, args, 1)?;
            let x = args[0];
            if x.dtype != DType::I64 {
                return Err(ShapeError::DType {
                    op: name.into(),
                    dtype: x.dtype.to_string(),
                    what: "indices (expected i64)".into(),
                });
            }
            let mut shape = x.shape.clone();
            shape.push(Dim::from(*num_classes));
            dense(name, shape, DType::I64)
        }
    }
}

/// Require a floating dtype.
fn float_input(name: &str, what: &str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: format!("{what} (expected a floating point dtype)"),
        });
    }
    Ok(())
}

/// `layer_norm(x, normalized_shape, w?, b?)`: normalizes the trailing
/// `normalized_rank >= 1` dims; `w` and `b` must have exactly those sizes.
fn layer_norm(name: &str, args: &[&TensorMeta], nr: usize, oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if !(1..=3).contains(&args.len()) {
        return Err(arity_error(name, "1 to 3", args.len()));
    }
    let x = args[0];
    if nr == 0 || nr > x.rank() {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "expected an input with at least {} trailing normalized dims (normalized rank {nr}), got shape {}",
                nr.max(1),
                shape_str(&x.shape)
            ),
        });
    }
    float_input(name, "input", x.dtype)?;
    let normalized = &x.shape[x.rank() - nr..];
    for (p, which) in args[1..].iter().zip(["weight", "bias"]) {
        let same = p.rank() == nr && p.shape.iter().zip(normalized).all(|(a, b)| dim_eq(oracle, a, b));
        if !same {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!(
                    "expected {which} of shape {} (the normalized dims of input {}), got {}",
                    shape_str(normalized),
                    shape_str(&x.shape),
                    shape_str(&p.shape)
                ),
            });
        }
    }
    Ok(x.to_contiguous())
}

/// `cross_entropy(logits, target)` with class indices, mean-reduced to a 0-d tensor:
/// logits `(C)` with a 0-d target, or `(N, C, d1, ...)` with target `(N, d1, ...)`
/// of dtype i64.
fn cross_entropy(name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    arity(name, args, 2)?;
    let (logits, target) = (args[0], args[1]);
    float_input(name, "logits", logits.dtype)?;
    if target.dtype != DType::I64 {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: target.dtype.to_string(),
            what: "target (expected i64 class indices)".into(),
        });
    }
    if logits.rank() == 0 {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: "logits must have at least 1 dimension, got 0-d".into(),
        });
    }
    let expected: Dims = logits
        .shape
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != logits.rank().min(2) - 1)
        .map(|(_, d)| d.clone())
        .collect();
    let same = target.rank() == expected.len() && target.shape.iter().zip(&expected).all(|(a, b)| dim_eq(oracle, a, b));
    if !same {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "expected target of shape {} for logits of shape {}, got {}",
                shape_str(&expected),
                shape_str(&logits.shape),
                shape_str(&target.shape)
            ),
        });
    }
    dense(name, Dims::new(), logits.dtype)
}

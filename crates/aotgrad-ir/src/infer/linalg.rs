//! Matrix products: `mm`, `bmm`, and the shape rules of the composite `matmul` and
//! `linear`.

use super::{arity, broadcast_shapes, dense, dim_eq, shape_str, Result};
use crate::dtype::DType;
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::{Dim, DimOracle};

/// Infer `Mm` or `Bmm`.
pub(crate) fn infer_linalg(
    op: &Op,
    name: &str,
    args: &[&TensorMeta],
    oracle: &mut dyn DimOracle,
) -> Result<TensorMeta> {
    arity(name, args, 2)?;
    let (a, b) = (args[0], args[1]);
    let rank = if matches!(op, Op::Bmm) { 3 } else { 2 };
    for (m, which) in [(a, "self"), (b, "mat2")] {
        if m.rank() != rank {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!("{which} must be a {rank}-D tensor, got shape {}", shape_str(&m.shape)),
            });
        }
    }
    same_dtype(name, a.dtype, b.dtype)?;
    if rank == 3 && !dim_eq(oracle, &a.shape[0], &b.shape[0]) {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "batch sizes differ: {} and {} must have the same number of batches",
                shape_str(&a.shape),
                shape_str(&b.shape)
            ),
        });
    }
    inner_match(name, &a.shape, &b.shape, &a.shape[rank - 1], &b.shape[rank - 2], oracle)?;
    let mut shape: Dims = (a.shape[..rank - 1].to_vec()).into();
    shape.push(b.shape[rank - 1].clone());
    dense(name, shape, a.dtype)
}

/// Both operands of a product must have one dtype, and not bool.
pub(crate) fn same_dtype(name: &str, a: DType, b: DType) -> Result<()> {
    if a != b {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: format!("{a} and {b}"),
            what: "operands (expected both to have the same dtype)".into(),
        });
    }
    if a == DType::Bool {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: a.to_string(),
            what: "matrix product operands".into(),
        });
    }
    Ok(())
}

/// The contracted sizes `k1` (of `a`) and `k2` (of `b`) must be equal.
fn inner_match(name: &str, a: &[Dim], b: &[Dim], k1: &Dim, k2: &Dim, oracle: &mut dyn DimOracle) -> Result<()> {
    if !dim_eq(oracle, k1, k2) {
        return Err(ShapeError::MatmulMismatch { op: name.into(), lhs: shape_str(a), rhs: shape_str(b) });
    }
    Ok(())
}

/// `torch.matmul` shape rules: 1-D @ 1-D is a dot product (0-d), a 1-D left operand
/// gets a leading 1 and a 1-D right operand a trailing 1 (both removed from the
/// result), and leading batch dims broadcast.
pub(crate) fn matmul_shape(name: &str, a: &[Dim], b: &[Dim], oracle: &mut dyn DimOracle) -> Result<Dims> {
    let (ra, rb) = (a.len(), b.len());
    if ra == 0 || rb == 0 {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "both arguments to matmul need to be at least 1D, but they are {ra}D and {rb}D ({} and {})",
                shape_str(a),
                shape_str(b)
            ),
        });
    }
    // Contracted sizes: a's last dim against b's first (1-D) or second-to-last dim.
    let k2 = if rb == 1 { &b[0] } else { &b[rb - 2] };
    inner_match(name, a, b, &a[ra - 1], k2, oracle)?;
    let batch_a = if ra > 2 { &a[..ra - 2] } else { &[][..] };
    let batch_b = if rb > 2 { &b[..rb - 2] } else { &[][..] };
    let mut out = broadcast_shapes(name, batch_a, batch_b, oracle)?;
    if ra >= 2 {
        out.push(a[ra - 2].clone());
    }
    if rb >= 2 {
        out.push(b[rb - 1].clone());
    }
    Ok(out)
}

/// `linear(x, w, b?)`: `x (.., in)`, `w (out, in)`, `b` broadcastable to `(.., out)`.
pub(crate) fn linear(name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    if !(2..=3).contains(&args.len()) {
        return Err(super::arity_error(name, "2 or 3", args.len()));
    }
    let (x, w) = (args[0], args[1]);
    if x.rank() == 0 || w.rank() != 2 {
        return Err(ShapeError::Invalid {
            op: name.into(),
            msg: format!(
                "expected input of rank >= 1 and a 2-D weight, got {} and {}",
                shape_str(&x.shape),
                shape_str(&w.shape)
            ),
        });
    }
    same_dtype(name, x.dtype, w.dtype)?;
    inner_match(name, &x.shape, &w.shape, &x.shape[x.rank() - 1], &w.shape[1], oracle)?;
    let mut shape = x.shape[..x.rank() - 1].to_vec();
    shape.push(w.shape[0].clone());
    if let Some(bias) = args.get(2) {
        same_dtype(name, x.dtype, bias.dtype)?;
        let b = broadcast_shapes(name, &shape, &bias.shape, oracle)?;
        if b.len() != shape.len() || !b.iter().zip(&shape).all(|(p, q)| dim_eq(oracle, p, q)) {
            return Err(ShapeError::Invalid {
                op: name.into(),
                msg: format!(
                    "bias of shape {} does not broadcast to output {}",
                    shape_str(&bias.shape),
                    shape_str(&shape)
                ),
            });
        }
    }
    dense(name, shape.into(), x.dtype)
}

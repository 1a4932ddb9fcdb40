//! Convolution and pooling over `(N, C, H, W)` images: `conv2d`, its two gradients,
//! `max_pool2d` and its gradient. Batch and channel counts may be symbolic; spatial
//! sizes and kernels are concrete (the window arithmetic is not symbolic).

use super::{arity, dense, dim_eq, shape_str, Result};
use crate::dtype::DType;
use crate::error::ShapeError;
use crate::meta::{Dims, TensorMeta};
use crate::op::{window_out, Conv2dParams, Op, Pool2dParams};
use crate::sym::{Dim, DimOracle};

fn bad(name: &str, msg: String) -> ShapeError {
    ShapeError::Invalid { op: name.into(), msg }
}

/// A 4-D float tensor's spatial sizes, concrete.
fn image(name: &str, what: &str, m: &TensorMeta) -> Result<[usize; 2]> {
    if m.rank() != 4 {
        return Err(bad(name, format!("{what} must be 4-D (N, C, H, W), got shape {}", shape_str(&m.shape))));
    }
    float(name, what, m.dtype)?;
    match (m.shape[2].as_const(), m.shape[3].as_const()) {
        (Some(h), Some(w)) if h >= 0 && w >= 0 => Ok([h as usize, w as usize]),
        _ => Err(bad(name, format!("{what} needs concrete spatial sizes, got shape {}", shape_str(&m.shape)))),
    }
}

fn float(name: &str, what: &str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: dtype.to_string(),
            what: format!("{what} (float only)"),
        });
    }
    Ok(())
}

fn concrete(name: &str, what: &str, d: &Dim) -> Result<usize> {
    match d.as_const() {
        Some(v) if v >= 0 => Ok(v as usize),
        _ => Err(bad(name, format!("{what} must be a concrete size, got {d}"))),
    }
}

/// The output size of each spatial dim, or an error naming the sizes.
fn out_size(
    name: &str,
    size: [usize; 2],
    kernel: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
) -> Result<[usize; 2]> {
    let mut out = [0; 2];
    for a in 0..2 {
        out[a] = window_out(size[a], kernel[a], s[a], p[a], d[a]).ok_or_else(|| {
            bad(
                name,
                format!(
                    "no {}x{} window (stride {:?}, padding {:?}, dilation {:?}) fits an input of spatial size {}x{}",
                    kernel[0], kernel[1], s, p, d, size[0], size[1]
                ),
            )
        })?;
    }
    Ok(out)
}

/// The weight's `(OC, C / groups, KH, KW)` sizes, with `OC` divisible by the groups.
fn weight(name: &str, w: &TensorMeta, c: &Conv2dParams) -> Result<(Dim, Dim, [usize; 2])> {
    if w.rank() != 4 {
        return Err(bad(name, format!("weight must be 4-D (OC, C/groups, KH, KW), got shape {}", shape_str(&w.shape))));
    }
    float(name, "weight", w.dtype)?;
    let kernel = [concrete(name, "the kernel height", &w.shape[2])?, concrete(name, "the kernel width", &w.shape[3])?];
    if c.groups == 0 {
        return Err(bad(name, "groups must be positive".into()));
    }
    let oc = concrete(name, "the weight's output channels", &w.shape[0])?;
    if oc % c.groups != 0 {
        return Err(bad(name, format!("{oc} output channels do not divide into {} groups", c.groups)));
    }
    Ok((w.shape[0].clone(), w.shape[1].clone(), kernel))
}

fn same_dtype(name: &str, a: &TensorMeta, b: &TensorMeta) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(ShapeError::DType {
            op: name.into(),
            dtype: format!("{} and {}", a.dtype, b.dtype),
            what: "operands (expected one dtype)".into(),
        });
    }
    Ok(())
}

/// Input channels of an input with `c_in` channels against a weight of `cg` per group.
fn channels(
    name: &str,
    oracle: &mut dyn DimOracle,
    c_in: &Dim,
    cg: &Dim,
    groups: usize,
    x: &TensorMeta,
    w: &TensorMeta,
) -> Result<()> {
    let want = cg.checked_mul(&Dim::Const(groups as i64)).ok_or_else(|| bad(name, "channel count overflows".into()))?;
    if !dim_eq(oracle, c_in, &want) {
        return Err(bad(
            name,
            format!(
                "input {} has {c_in} channels, but weight {} with groups={groups} expects {want}",
                shape_str(&x.shape),
                shape_str(&w.shape)
            ),
        ));
    }
    Ok(())
}

/// Infer the convolution and pooling ops.
pub(crate) fn infer_conv(op: &Op, name: &str, args: &[&TensorMeta], oracle: &mut dyn DimOracle) -> Result<TensorMeta> {
    match op {
        Op::Conv2d(c) => {
            arity(name, args, 2)?;
            let (x, w) = (args[0], args[1]);
            let hw = image(name, "input", x)?;
            let (oc, cg, kernel) = weight(name, w, c)?;
            same_dtype(name, x, w)?;
            channels(name, oracle, &x.shape[1], &cg, c.groups, x, w)?;
            let o = out_size(name, hw, kernel, c.stride, c.padding, c.dilation)?;
            let shape: Dims = vec![x.shape[0].clone(), oc, Dim::from(o[0]), Dim::from(o[1])].into();
            dense(name, shape, x.dtype)
        }
        Op::Conv2dInputGrad { conv: c, input } => {
            arity(name, args, 2)?;
            let (gy, w) = (args[0], args[1]);
            let ohw = image(name, "gradient", gy)?;
            let (oc, cg, kernel) = weight(name, w, c)?;
            same_dtype(name, gy, w)?;
            if !dim_eq(oracle, &gy.shape[1], &oc) {
                return Err(bad(
                    name,
                    format!(
                        "gradient {} and weight {} disagree on output channels",
                        shape_str(&gy.shape),
                        shape_str(&w.shape)
                    ),
                ));
            }
            let o = out_size(name, *input, kernel, c.stride, c.padding, c.dilation)?;
            if o != ohw {
                return Err(bad(
                    name,
                    format!("an input of spatial size {input:?} gives outputs of {o:?}, but the gradient is {ohw:?}"),
                ));
            }
            let cin = cg
                .checked_mul(&Dim::Const(c.groups as i64))
                .ok_or_else(|| bad(name, "channel count overflows".into()))?;
            let shape: Dims = vec![gy.shape[0].clone(), cin, Dim::from(input[0]), Dim::from(input[1])].into();
            dense(name, shape, gy.dtype)
        }
        Op::Conv2dWeightGrad { conv: c, kernel } => {
            arity(name, args, 2)?;
            let (gy, x) = (args[0], args[1]);
            let ohw = image(name, "gradient", gy)?;
            let hw = image(name, "input", x)?;
            same_dtype(name, gy, x)?;
            if c.groups == 0 {
                return Err(bad(name, "groups must be positive".into()));
            }
            if !dim_eq(oracle, &gy.shape[0], &x.shape[0]) {
                return Err(bad(
                    name,
                    format!(
                        "gradient {} and input {} disagree on the batch",
                        shape_str(&gy.shape),
                        shape_str(&x.shape)
                    ),
                ));
            }
            let oc = concrete(name, "the output channels", &gy.shape[1])?;
            let cin = concrete(name, "the input channels", &x.shape[1])?;
            if oc % c.groups != 0 || cin % c.groups != 0 {
                return Err(bad(
                    name,
                    format!("{cin} input and {oc} output channels do not divide into {} groups", c.groups),
                ));
            }
            let o = out_size(name, hw, *kernel, c.stride, c.padding, c.dilation)?;
            if o != ohw {
                return Err(bad(
                    name,
                    format!("an input of spatial size {hw:?} gives outputs of {o:?}, but the gradient is {ohw:?}"),
                ));
            }
            let shape: Dims =
                vec![Dim::from(oc), Dim::from(cin / c.groups), Dim::from(kernel[0]), Dim::from(kernel[1])].into();
            dense(name, shape, x.dtype)
        }
        Op::MaxPool2d(p) => {
            arity(name, args, 1)?;
            let x = args[0];
            let hw = image(name, "input", x)?;
            pool_padding(name, p)?;
            let o = out_size(name, hw, p.kernel, p.stride, p.padding, p.dilation)?;
            let shape: Dims = vec![x.shape[0].clone(), x.shape[1].clone(), Dim::from(o[0]), Dim::from(o[1])].into();
            dense(name, shape, x.dtype)
        }
        Op::MaxPool2dGrad(p) => {
            arity(name, args, 2)?;
            let (gy, x) = (args[0], args[1]);
            let ohw = image(name, "gradient", gy)?;
            let hw = image(name, "input", x)?;
            same_dtype(name, gy, x)?;
            pool_padding(name, p)?;
            let o = out_size(name, hw, p.kernel, p.stride, p.padding, p.dilation)?;
            if o != ohw || !dim_eq(oracle, &gy.shape[0], &x.shape[0]) || !dim_eq(oracle, &gy.shape[1], &x.shape[1]) {
                return Err(bad(
                    name,
                    format!(
                        "gradient {} does not match the pooling of input {}",
                        shape_str(&gy.shape),
                        shape_str(&x.shape)
                    ),
                ));
            }
            dense(name, x.shape.clone(), x.dtype)
        }
        other => Err(bad(name, format!("{} is not a convolution or pooling op", other.name()))),
    }
}

/// PyTorch's rule: padding at most half the kernel.
fn pool_padding(name: &str, p: &Pool2dParams) -> Result<()> {
    if p.padding.iter().zip(p.kernel).any(|(pad, k)| 2 * pad > k) {
        return Err(bad(
            name,
            format!("pad should be at most half of kernel size, got padding {:?} for kernel {:?}", p.padding, p.kernel),
        ));
    }
    Ok(())
}

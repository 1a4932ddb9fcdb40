//! Pointwise kernels: unary, binary (tensor or scalar right operand), comparisons,
//! `where`, `clamp`, casts and copies.
//!
//! Every input is gathered through its own strides, broadcast to the output shape,
//! into a contiguous vector of the compute kind of the op (see [`crate::convert`]):
//! arithmetic runs in the compute kind of the *output* dtype (f16/bf16 in f32, ints
//! in wrapping i64, which truncated to i32 equals i32 wrapping arithmetic);
//! comparisons run in the compute kind of the promoted input dtypes.

use crate::convert::{gather, Elem, Kind, Vals};
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{result_type, BinaryOp, CmpOp, Operand, Scalar, TensorMeta, UnaryOp};
use num_traits::Float;

/// Floats with an error function.
pub(crate) trait Real: Float + Elem {
    fn erf(self) -> Self;
    /// Round half to even (PyTorch's `round`).
    fn round_even(self) -> Self;
}
impl Real for f32 {
    fn erf(self) -> f32 {
        libm::erff(self)
    }
    fn round_even(self) -> f32 {
        self.round_ties_even()
    }
}
impl Real for f64 {
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    fn round_even(self) -> f64 {
        self.round_ties_even()
    }
}

/// The right operand of a binary op: a vector of the same length, or a scalar.
#[derive(Clone, Copy)]
enum Rhs<'a, T> {
    Vec(&'a [T]),
    Scalar(T),
}

impl<'a, T: Copy> Rhs<'a, T> {
    /// `b` as an operand: its one element when it holds a scalar operand.
    fn of(b: &'a [T], scalar: bool) -> Self {
        if scalar {
            Rhs::Scalar(b[0])
        } else {
            Rhs::Vec(b)
        }
    }
}

#[inline]
fn zip_map<T: Copy, U>(a: &[T], b: Rhs<'_, T>, f: impl Fn(T, T) -> U) -> Vec<U> {
    match b {
        Rhs::Vec(b) => a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect(),
        Rhs::Scalar(y) => a.iter().map(|&x| f(x, y)).collect(),
    }
}

/// The concrete shape of a meta, checking that its element count fits in `usize`.
pub(crate) fn out_shape(out: &TensorMeta) -> Result<Vec<usize>> {
    let shape = out.concrete_shape().ok_or_else(|| CpuError::Internal(format!("metadata {out} is not concrete")))?;
    if shape.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s)).is_none() {
        return Err(CpuError::kernel("alloc", format!("a tensor of shape {shape:?} has too many elements")));
    }
    Ok(shape)
}

fn scalar_vals(s: Scalar, kind: Kind) -> Vals {
    match kind {
        Kind::F32 => Vals::F32(vec![s.to_f64() as f32]),
        Kind::F64 => Vals::F64(vec![s.to_f64()]),
        Kind::I64 => Vals::I64(vec![s.to_i64()]),
        Kind::Bool => Vals::Bool(vec![s.to_bool()]),
    }
}

// ---- unary -------------------------------------------------------------------------

#[inline]
fn map<T: Copy>(v: &[T], f: impl Fn(T) -> T) -> Vec<T> {
    v.iter().map(|&x| f(x)).collect()
}

fn unary_real<T: Real>(op: UnaryOp, v: Vec<T>) -> Vec<T> {
    let zero = T::zero();
    let one = T::one();
    match op {
        UnaryOp::Neg => map(&v, |x| -x),
        UnaryOp::Abs => map(&v, |x| x.abs()),
        UnaryOp::Exp => map(&v, |x| x.exp()),
        UnaryOp::Log => map(&v, |x| x.ln()),
        UnaryOp::Sqrt => map(&v, |x| x.sqrt()),
        UnaryOp::Rsqrt => map(&v, |x| T::one() / x.sqrt()),
        UnaryOp::Sin => map(&v, |x| x.sin()),
        UnaryOp::Cos => map(&v, |x| x.cos()),
        UnaryOp::Tanh => map(&v, |x| x.tanh()),
        UnaryOp::Sigmoid => map(&v, |x| T::one() / (T::one() + (-x).exp())),
        // relu(NaN) = NaN, as PyTorch's clamp_min(0).
        UnaryOp::Relu => v.iter().map(|&x| if x.is_nan() || x > zero { x } else { zero }).collect(),
        UnaryOp::Erf => map(&v, Real::erf),
        UnaryOp::Reciprocal => map(&v, |x| T::one() / x),
        // PyTorch computes `(0 < x) - (x < 0)`: sign(0) = 0 and sign(NaN) = 0.
        UnaryOp::Sign => v
            .iter()
            .map(|&x| {
                if x > zero {
                    one
                } else if x < zero {
                    -one
                } else {
                    zero
                }
            })
            .collect(),
        UnaryOp::LogicalNot => v.iter().map(|&x| if x == zero { one } else { zero }).collect(),
        UnaryOp::Floor => map(&v, |x| x.floor()),
        UnaryOp::Ceil => map(&v, |x| x.ceil()),
        UnaryOp::Round => map(&v, Real::round_even),
        UnaryOp::Trunc => map(&v, |x| x.trunc()),
        UnaryOp::Log1p => map(&v, |x| x.ln_1p()),
        UnaryOp::Expm1 => map(&v, |x| x.exp_m1()),
    }
}

/// `op(x)` with the result dtype and shape of `out`.
pub(crate) fn unary(op: UnaryOp, x: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let name = op.name();
    let shape = out_shape(out)?;
    if op == UnaryOp::LogicalNot {
        let v = match gather(name, x, &shape, Kind::Bool)? {
            Vals::Bool(v) => v,
            _ => return Err(CpuError::Internal("gather to bool returned another kind".into())),
        };
        return Ok(Vals::Bool(v.into_iter().map(|b| !b).collect()).into_buffer(out.dtype));
    }
    let vals = gather(name, x, &shape, Kind::compute(out.dtype))?;
    let res = match vals {
        Vals::F32(v) => Vals::F32(unary_real(op, v)),
        Vals::F64(v) => Vals::F64(unary_real(op, v)),
        Vals::I64(v) => Vals::I64(match op {
            UnaryOp::Neg => v.iter().map(|x| x.wrapping_neg()).collect(),
            UnaryOp::Abs => v.iter().map(|x| x.wrapping_abs()).collect(),
            UnaryOp::Relu => v.iter().map(|&x| x.max(0)).collect(),
            UnaryOp::Sign => v.iter().map(|x| x.signum()).collect(),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => v,
            _ => return Err(CpuError::kernel(name, format!("not defined for integer result dtype {}", out.dtype))),
        }),
        Vals::Bool(v) => Vals::Bool(match op {
            UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sign => v,
            _ => return Err(CpuError::kernel(name, "not defined for bool tensors")),
        }),
    };
    Ok(res.into_buffer(out.dtype))
}

// ---- binary ------------------------------------------------------------------------

fn binary_real<T: Real>(op: BinaryOp, a: &[T], b: Rhs<'_, T>) -> Vec<T> {
    match op {
        BinaryOp::Add => zip_map(a, b, |x, y| x + y),
        BinaryOp::Sub => zip_map(a, b, |x, y| x - y),
        BinaryOp::Mul => zip_map(a, b, |x, y| x * y),
        BinaryOp::Div => zip_map(a, b, |x, y| x / y),
        BinaryOp::Pow => zip_map(a, b, |x, y| x.powf(y)),
        BinaryOp::Maximum => zip_map(a, b, |x, y| if x.is_nan() || y.is_nan() { T::nan() } else { x.max(y) }),
        BinaryOp::Minimum => zip_map(a, b, |x, y| if x.is_nan() || y.is_nan() { T::nan() } else { x.min(y) }),
    }
}

/// `base^exp` for integers with wrapping multiplication (exponent must be >= 0).
pub(crate) fn int_pow(mut base: i64, mut exp: i64) -> i64 {
    let mut acc: i64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

fn binary_int(op: BinaryOp, a: &[i64], b: Rhs<'_, i64>) -> Result<Vec<i64>> {
    Ok(match op {
        BinaryOp::Add => zip_map(a, b, i64::wrapping_add),
        BinaryOp::Sub => zip_map(a, b, i64::wrapping_sub),
        BinaryOp::Mul => zip_map(a, b, i64::wrapping_mul),
        BinaryOp::Maximum => zip_map(a, b, i64::max),
        BinaryOp::Minimum => zip_map(a, b, i64::min),
        BinaryOp::Pow => {
            let negative = match b {
                Rhs::Vec(v) => v.iter().any(|&e| e < 0),
                Rhs::Scalar(e) => e < 0,
            };
            if negative {
                return Err(CpuError::kernel("pow", "Integers to negative integer powers are not allowed"));
            }
            zip_map(a, b, int_pow)
        }
        BinaryOp::Div => return Err(CpuError::kernel("div", "true division needs a floating result dtype")),
    })
}

fn binary_bool(op: BinaryOp, a: &[bool], b: Rhs<'_, bool>) -> Result<Vec<bool>> {
    Ok(match op {
        BinaryOp::Add | BinaryOp::Maximum => zip_map(a, b, |x, y| x | y),
        BinaryOp::Mul | BinaryOp::Minimum => zip_map(a, b, |x, y| x & y),
        BinaryOp::Sub => {
            return Err(CpuError::kernel(
                "sub",
                "subtraction with two bool tensors is not supported; use logical_xor or logical_not",
            ))
        }
        BinaryOp::Div | BinaryOp::Pow => {
            return Err(CpuError::kernel(op.name(), "needs a numeric result dtype, got bool"));
        }
    })
}

fn binary_vals(op: BinaryOp, a: Vals, b: Vals, b_scalar: bool) -> Result<Vals> {
    Ok(match (a, b) {
        (Vals::F32(a), Vals::F32(b)) => Vals::F32(binary_real(op, &a, Rhs::of(&b, b_scalar))),
        (Vals::F64(a), Vals::F64(b)) => Vals::F64(binary_real(op, &a, Rhs::of(&b, b_scalar))),
        (Vals::I64(a), Vals::I64(b)) => Vals::I64(binary_int(op, &a, Rhs::of(&b, b_scalar))?),
        (Vals::Bool(a), Vals::Bool(b)) => Vals::Bool(binary_bool(op, &a, Rhs::of(&b, b_scalar))?),
        _ => return Err(CpuError::Internal(format!("{}: operands gathered into different kinds", op.name()))),
    })
}

/// `a op b` with broadcasting, computed in the compute kind of `out.dtype`.
pub(crate) fn binary(op: BinaryOp, a: &CpuTensor, b: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(out.dtype);
    let va = gather(op.name(), a, &shape, kind)?;
    let vb = gather(op.name(), b, &shape, kind)?;
    Ok(binary_vals(op, va, vb, false)?.into_buffer(out.dtype))
}

/// `a op s` for a scalar `s`, computed in the compute kind of `out.dtype`.
pub(crate) fn binary_scalar(op: BinaryOp, a: &CpuTensor, s: Scalar, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(out.dtype);
    let va = gather(op.name(), a, &shape, kind)?;
    Ok(binary_vals(op, va, scalar_vals(s, kind), true)?.into_buffer(out.dtype))
}

// ---- comparisons -------------------------------------------------------------------

fn cmp_typed<T: PartialOrd + Copy>(op: CmpOp, a: &[T], b: Rhs<'_, T>) -> Vec<bool> {
    match op {
        CmpOp::Eq => zip_map(a, b, |x, y| x == y),
        CmpOp::Ne => zip_map(a, b, |x, y| x != y),
        CmpOp::Lt => zip_map(a, b, |x, y| x < y),
        CmpOp::Le => zip_map(a, b, |x, y| x <= y),
        CmpOp::Gt => zip_map(a, b, |x, y| x > y),
        CmpOp::Ge => zip_map(a, b, |x, y| x >= y),
    }
}

fn cmp_vals(op: CmpOp, a: Vals, b: Vals, b_scalar: bool) -> Result<Vec<bool>> {
    Ok(match (a, b) {
        (Vals::F32(a), Vals::F32(b)) => cmp_typed(op, &a, Rhs::of(&b, b_scalar)),
        (Vals::F64(a), Vals::F64(b)) => cmp_typed(op, &a, Rhs::of(&b, b_scalar)),
        (Vals::I64(a), Vals::I64(b)) => cmp_typed(op, &a, Rhs::of(&b, b_scalar)),
        (Vals::Bool(a), Vals::Bool(b)) => cmp_typed(op, &a, Rhs::of(&b, b_scalar)),
        _ => return Err(CpuError::Internal(format!("{}: operands gathered into different kinds", op.name()))),
    })
}

/// `a cmp b` with broadcasting, compared in the promoted dtype of the inputs.
pub(crate) fn compare(op: CmpOp, a: &CpuTensor, b: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(result_type(&[Operand::of(&a.meta), Operand::of(&b.meta)]));
    let va = gather(op.name(), a, &shape, kind)?;
    let vb = gather(op.name(), b, &shape, kind)?;
    Ok(Vals::Bool(cmp_vals(op, va, vb, false)?).into_buffer(out.dtype))
}

/// `a cmp s`, compared in the promoted dtype of `a` and the (weak) scalar.
pub(crate) fn compare_scalar(op: CmpOp, a: &CpuTensor, s: Scalar, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(result_type(&[Operand::of(&a.meta), Operand::Scalar(s)]));
    let va = gather(op.name(), a, &shape, kind)?;
    Ok(Vals::Bool(cmp_vals(op, va, scalar_vals(s, kind), true)?).into_buffer(out.dtype))
}

// ---- where, clamp, cast, copy ------------------------------------------------------

/// `cond ? a : b` with broadcasting.
pub(crate) fn where_(cond: &CpuTensor, a: &CpuTensor, b: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(out.dtype);
    let c = match gather("where", cond, &shape, Kind::Bool)? {
        Vals::Bool(c) => c,
        _ => return Err(CpuError::Internal("gather to bool returned another kind".into())),
    };
    fn pick<T: Copy>(c: &[bool], a: Vec<T>, b: Vec<T>) -> Vec<T> {
        c.iter().zip(a.into_iter().zip(b)).map(|(&c, (x, y))| if c { x } else { y }).collect()
    }
    let res = match (gather("where", a, &shape, kind)?, gather("where", b, &shape, kind)?) {
        (Vals::F32(a), Vals::F32(b)) => Vals::F32(pick(&c, a, b)),
        (Vals::F64(a), Vals::F64(b)) => Vals::F64(pick(&c, a, b)),
        (Vals::I64(a), Vals::I64(b)) => Vals::I64(pick(&c, a, b)),
        (Vals::Bool(a), Vals::Bool(b)) => Vals::Bool(pick(&c, a, b)),
        _ => return Err(CpuError::Internal("where: operands gathered into different kinds".into())),
    };
    Ok(res.into_buffer(out.dtype))
}

/// `min(max(x, lo), hi)`; NaN inputs stay NaN; when `lo > hi` every value becomes `hi`.
pub(crate) fn clamp(x: &CpuTensor, lo: Option<Scalar>, hi: Option<Scalar>, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    let kind = Kind::compute(out.dtype);
    fn go<T: PartialOrd + Copy>(v: Vec<T>, lo: Option<T>, hi: Option<T>) -> Vec<T> {
        v.into_iter()
            .map(|x| {
                #[allow(clippy::eq_op)]
                let is_nan = x != x;
                if is_nan {
                    return x;
                }
                let y = match lo {
                    Some(l) if x < l => l,
                    _ => x,
                };
                match hi {
                    Some(h) if y > h => h,
                    _ => y,
                }
            })
            .collect()
    }
    let res = match gather("clamp", x, &shape, kind)? {
        Vals::F32(v) => Vals::F32(go(v, lo.map(|s| s.to_f64() as f32), hi.map(|s| s.to_f64() as f32))),
        Vals::F64(v) => Vals::F64(go(v, lo.map(Scalar::to_f64), hi.map(Scalar::to_f64))),
        Vals::I64(v) => Vals::I64(go(v, lo.map(Scalar::to_i64), hi.map(Scalar::to_i64))),
        Vals::Bool(v) => Vals::Bool(go(v, lo.map(Scalar::to_bool), hi.map(Scalar::to_bool))),
    };
    Ok(res.into_buffer(out.dtype))
}

/// `src` broadcast to `out`'s shape and converted to `out.dtype` (one rounding).
pub(crate) fn convert(name: &str, src: &CpuTensor, out: &TensorMeta) -> Result<Buffer> {
    let shape = out_shape(out)?;
    Ok(gather(name, src, &shape, Kind::compute(src.meta.dtype))?.into_buffer(out.dtype))
}

//! Data in-place ops: compute a pointwise result and write it into `self`'s storage
//! through its strides. They return this very tensor handle; other views of the same
//! storage see the new data.

use super::{IntoRhs, Rhs};
use crate::error::Result;
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::{BinaryOp, Op, Scalar, SourceLoc, UnaryOp};

macro_rules! binary_inplace {
    ($($name:ident => $op:ident),* $(,)?) => {
        /// **In-place arithmetic** with a tensor (broadcast to `self`) or a scalar.
        impl Tensor {
            $(
                #[doc = concat!("In-place `", stringify!($op), "` with a tensor (broadcast to `self`) or a scalar.")]
                #[track_caller]
                pub fn $name<'a>(&self, other: impl IntoRhs<'a>) -> Result<Tensor> {
                    self.binary_inplace_at(BinaryOp::$op, other.into_rhs(), &SourceLoc::caller())
                }
            )*
        }
    };
}

binary_inplace!(add_ => Add, sub_ => Sub, mul_ => Mul, div_ => Div, pow_ => Pow);

fn inplace(op: Op) -> Op {
    Op::InPlace(Box::new(op))
}

impl Tensor {
    fn binary_inplace_at(&self, op: BinaryOp, rhs: Rhs<'_>, loc: &SourceLoc) -> Result<Tensor> {
        match rhs {
            Rhs::Tensor(t) => dispatch(inplace(Op::Binary(op)), &[self, t], loc),
            Rhs::Scalar(s) => dispatch(inplace(Op::BinaryScalar(op, s)), &[self], loc),
        }
    }
    /// Fill with zeros.
    #[track_caller]
    pub fn zero_(&self) -> Result<Tensor> {
        dispatch(inplace(Op::FullLike { value: Scalar::Int(0), dtype: None }), &[self], &SourceLoc::caller())
    }
    /// Fill with `value`.
    #[track_caller]
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        dispatch(inplace(Op::FullLike { value: value.into(), dtype: None }), &[self], &SourceLoc::caller())
    }
}

macro_rules! unary_inplace {
    ($($name:ident => $op:ident),* $(,)?) => {
        /// **In-place**: `*_` forms of the unary functions (`exp_`, `abs_`, …) and of
        /// arithmetic (`add_`, `mul_`, …), `zero_`, `fill_`, `clamp_`, `copy_`. They write
        /// through `self`'s strides into its storage and return this same handle; the storage's
        /// version counter moves, which is what makes a backward refuse values changed after the
        /// forward saved them.
        ///
        /// ```
        /// # use aotgrad_trace::{DType, Tensor};
        /// let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)?;
        /// let row = x.select(0, 0)?;
        /// row.mul_(10.0)?;
        /// assert_eq!(x.to_vec_f64()?, vec![10.0, 20.0, 3.0, 4.0]);
        /// x.t()?.copy_(&Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)?)?;
        /// assert_eq!(x.to_vec_f64()?, vec![1.0, 3.0, 2.0, 4.0]);
        /// # Ok::<(), aotgrad_trace::Error>(())
        /// ```
        impl Tensor {
            $(
                #[doc = concat!("In-place `", stringify!($op), "` (the result is cast to `self`'s dtype, as PyTorch's `", stringify!($name), "`).")]
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    dispatch(inplace(Op::Unary(UnaryOp::$op)), &[self], &SourceLoc::caller())
                }
            )*
        }
    };
}

unary_inplace!(
    neg_ => Neg,
    abs_ => Abs,
    exp_ => Exp,
    log_ => Log,
    sqrt_ => Sqrt,
    rsqrt_ => Rsqrt,
    sin_ => Sin,
    cos_ => Cos,
    tanh_ => Tanh,
    sigmoid_ => Sigmoid,
    relu_ => Relu,
    erf_ => Erf,
    reciprocal_ => Reciprocal,
    sign_ => Sign,
    logical_not_ => LogicalNot,
    floor_ => Floor,
    ceil_ => Ceil,
    round_ => Round,
    trunc_ => Trunc,
    log1p_ => Log1p,
    expm1_ => Expm1,
);

impl Tensor {
    /// In-place `clamp` (see [`Tensor::clamp`]).
    #[track_caller]
    pub fn clamp_<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        let op = Op::Clamp { min: min.map(Into::into), max: max.map(Into::into) };
        dispatch(inplace(op), &[self], &SourceLoc::caller())
    }
    /// Copy `src` (broadcast to `self`'s shape, cast to its dtype) into `self`.
    #[track_caller]
    pub fn copy_(&self, src: &Tensor) -> Result<Tensor> {
        dispatch(inplace(Op::Copy), &[self, src], &SourceLoc::caller())
    }
}

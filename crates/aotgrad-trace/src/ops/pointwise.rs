//! Pointwise ops: unary functions, binary arithmetic and comparisons (tensor or scalar
//! operand, broadcasting, PyTorch type promotion), `where_`, `clamp`, `to`.

use super::{IntoRhs, Rhs};
use crate::error::Result;
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::{BinaryOp, CmpOp, DType, Op, Scalar, SourceLoc, UnaryOp};

macro_rules! unary_ops {
    ($($name:ident => $op:ident),* $(,)?) => {
        /// **Unary pointwise** functions (`exp`, `log`, `sin`, `relu`, `sigmoid`, `gelu`, …):
        /// one result element per element, keeping a dense input's memory order.
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "`.")]
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    dispatch(Op::Unary(UnaryOp::$op), &[self], &SourceLoc::caller())
                }
            )*
        }
    };
}

unary_ops!(
    neg => Neg,
    abs => Abs,
    exp => Exp,
    log => Log,
    sqrt => Sqrt,
    rsqrt => Rsqrt,
    sin => Sin,
    cos => Cos,
    tanh => Tanh,
    sigmoid => Sigmoid,
    relu => Relu,
    erf => Erf,
    reciprocal => Reciprocal,
    sign => Sign,
    logical_not => LogicalNot,
    floor => Floor,
    ceil => Ceil,
    round => Round,
    trunc => Trunc,
    log1p => Log1p,
    expm1 => Expm1,
);

macro_rules! binary_ops {
    ($($name:ident => $op:ident),* $(,)?) => {
        /// **Binary arithmetic** with a tensor (broadcasting, PyTorch type promotion) or a
        /// scalar; `std::ops` operators on `&Tensor` do the same and return `Result`.
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` with a tensor (broadcasting) or a scalar.")]
                #[track_caller]
                pub fn $name<'a>(&self, other: impl IntoRhs<'a>) -> Result<Tensor> {
                    self.binary_at(BinaryOp::$op, other.into_rhs(), &SourceLoc::caller())
                }
            )*
        }
    };
}

binary_ops!(
    add => Add,
    sub => Sub,
    mul => Mul,
    div => Div,
    pow => Pow,
    maximum => Maximum,
    minimum => Minimum,
);

macro_rules! compare_ops {
    ($($name:ident => $op:ident),* $(,)?) => {
        /// **Comparisons** (bool results, broadcasting).
        impl Tensor {
            $(
                #[doc = concat!("Elementwise comparison `", stringify!($name), "` (bool result).")]
                #[track_caller]
                pub fn $name<'a>(&self, other: impl IntoRhs<'a>) -> Result<Tensor> {
                    self.compare_at(CmpOp::$op, other.into_rhs(), &SourceLoc::caller())
                }
            )*
        }
    };
}

compare_ops!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

/// **Pointwise**: unary functions, arithmetic and comparisons (the blocks above),
/// `where_`, `clamp`, and dtype conversion `to`. Results broadcast like PyTorch and take
/// the memory order of dense inputs (a transposed input gives a transposed result).
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let x = Tensor::from_f64(&[-1.0, 0.5, 2.0], &[3], DType::F64)?;
/// assert_eq!(x.relu()?.to_vec_f64()?, vec![0.0, 0.5, 2.0]);
/// let y = x.mul(2.0)?.add(&Tensor::ones(&[2, 1], DType::F64)?)?; // broadcasts to [2, 3]
/// assert_eq!(y.sizes()?, vec![2, 3]);
/// assert_eq!((&x * 3.0)?.to_vec_f64()?, vec![-3.0, 1.5, 6.0]);
/// let picked = Tensor::where_(&x.gt(0.0)?, &x, &x.zeros_like()?)?;
/// assert_eq!(picked.to_vec_f64()?, vec![0.0, 0.5, 2.0]);
/// assert_eq!(x.clamp(Some(0.0), Some(1.0))?.to_vec_f64()?, vec![0.0, 0.5, 1.0]);
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    pub(crate) fn binary_at(&self, op: BinaryOp, rhs: Rhs<'_>, loc: &SourceLoc) -> Result<Tensor> {
        match rhs {
            Rhs::Tensor(t) => dispatch(Op::Binary(op), &[self, t], loc),
            Rhs::Scalar(s) => dispatch(Op::BinaryScalar(op, s), &[self], loc),
        }
    }
    pub(crate) fn compare_at(&self, op: CmpOp, rhs: Rhs<'_>, loc: &SourceLoc) -> Result<Tensor> {
        match rhs {
            Rhs::Tensor(t) => dispatch(Op::Compare(op), &[self, t], loc),
            Rhs::Scalar(s) => dispatch(Op::CompareScalar(op, s), &[self], loc),
        }
    }
    /// `cond ? a : b` elementwise (broadcasting; `cond` must be bool).
    #[track_caller]
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        dispatch(Op::Where, &[cond, a, b], &SourceLoc::caller())
    }
    /// Clamp into `[min, max]` (either bound optional; write `None::<f64>` for "neither").
    #[track_caller]
    pub fn clamp<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        dispatch(Op::Clamp { min: min.map(Into::into), max: max.map(Into::into) }, &[self], &SourceLoc::caller())
    }
    /// `clamp(min, None)`.
    #[track_caller]
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        dispatch(Op::Clamp { min: Some(min.into()), max: None }, &[self], &SourceLoc::caller())
    }
    /// `clamp(None, max)`.
    #[track_caller]
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        dispatch(Op::Clamp { min: None, max: Some(max.into()) }, &[self], &SourceLoc::caller())
    }
    /// Convert to `dtype`. Like PyTorch, returns this very tensor when it already has
    /// that dtype (check with [`Tensor::same_object`]).
    #[track_caller]
    pub fn to(&self, dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        self.mode("to", &loc)?;
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        dispatch(Op::Cast(dtype), &[self], &loc)
    }
}

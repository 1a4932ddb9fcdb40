//! `std::ops` operators on tensors, as the Rust tensor crates offer them: `&a + &b`,
//! `&x * 2.0`, `2.0 - &x`, `-&x`. Every operator returns a [`Result`] (shapes may not
//! broadcast, dtypes may not mix), so chains read `((&a + &b)? * 2.0)?`. Each one is
//! the named method (`add`, `sub`, `mul`, `div`, `rsub`, `rdiv`, `neg`) and records
//! the line of the operator in the user's code.

use crate::error::Result;
use crate::tensor::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! tensor_ops {
    ($($tr:ident $m:ident),*) => {
        $(
            impl<'a> $tr<&'a Tensor> for &'a Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: &'a Tensor) -> Result<Tensor> {
                    Tensor::$m(self, rhs)
                }
            }
            impl $tr<f64> for &Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: f64) -> Result<Tensor> {
                    Tensor::$m(self, rhs)
                }
            }
            impl $tr<i64> for &Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: i64) -> Result<Tensor> {
                    Tensor::$m(self, rhs)
                }
            }
        )*
    };
}

tensor_ops!(Add add, Sub sub, Mul mul, Div div);

// Owned operands (the result of an earlier operator): by reference underneath.
macro_rules! owned_ops {
    ($($tr:ident $m:ident),*) => {
        $(
            impl $tr<Tensor> for Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: Tensor) -> Result<Tensor> {
                    Tensor::$m(&self, &rhs)
                }
            }
            impl $tr<&Tensor> for Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: &Tensor) -> Result<Tensor> {
                    Tensor::$m(&self, rhs)
                }
            }
            impl $tr<Tensor> for &Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: Tensor) -> Result<Tensor> {
                    Tensor::$m(self, &rhs)
                }
            }
            impl $tr<f64> for Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: f64) -> Result<Tensor> {
                    Tensor::$m(&self, rhs)
                }
            }
            impl $tr<i64> for Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $m(self, rhs: i64) -> Result<Tensor> {
                    Tensor::$m(&self, rhs)
                }
            }
        )*
    };
}

owned_ops!(Add add, Sub sub, Mul mul, Div div);

macro_rules! scalar_lhs {
    ($($t:ty),*) => {
        $(
            impl Add<&Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn add(self, rhs: &Tensor) -> Result<Tensor> {
                    rhs.add(self)
                }
            }
            impl Mul<&Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn mul(self, rhs: &Tensor) -> Result<Tensor> {
                    rhs.mul(self)
                }
            }
            impl Sub<&Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn sub(self, rhs: &Tensor) -> Result<Tensor> {
                    rhs.rsub(self)
                }
            }
            impl Div<&Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn div(self, rhs: &Tensor) -> Result<Tensor> {
                    rhs.rdiv(self)
                }
            }
        )*
    };
}

scalar_lhs!(f64, i64);

macro_rules! scalar_lhs_owned {
    ($($t:ty),*) => {
        $(
            impl Add<Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn add(self, rhs: Tensor) -> Result<Tensor> {
                    rhs.add(self)
                }
            }
            impl Mul<Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn mul(self, rhs: Tensor) -> Result<Tensor> {
                    rhs.mul(self)
                }
            }
            impl Sub<Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn sub(self, rhs: Tensor) -> Result<Tensor> {
                    rhs.rsub(self)
                }
            }
            impl Div<Tensor> for $t {
                type Output = Result<Tensor>;
                #[track_caller]
                fn div(self, rhs: Tensor) -> Result<Tensor> {
                    rhs.rdiv(self)
                }
            }
        )*
    };
}

scalar_lhs_owned!(f64, i64);

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

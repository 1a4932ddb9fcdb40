//! Tensor op methods with PyTorch names. Every method is `#[track_caller]`, returns a
//! [`Result`] and goes through the one dispatch function, so eager and
//! fake mode share inference, checks and error messages.
//!
//! - [`pointwise`]: unary and binary pointwise ops, comparisons, `where_`, `clamp`, `to`;
//! - [`reduce`]: reductions, `argmax`/`argmin`, `mm`/`bmm`;
//! - [`views`]: view ops, `clone_tensor`/`contiguous`, `detach`, metadata in-place ops;
//! - [`inplace`]: data in-place ops (`add_`, `mul_`, `copy_`, `fill_`, ...);
//! - [`creation`]: constructors and random tensors;
//! - [`indexing`]: gathers, scatters and `cat`.

pub mod composed;
pub mod conv;
pub mod creation;
pub mod indexing;
pub mod inplace;
pub mod norm;
pub mod operators;
pub mod pointwise;
pub mod reduce;
pub mod views;

use crate::autograd::EagerRecord;
use crate::dispatch::dispatch_with;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use aotgrad_ir::infer::wrap_dim;
use aotgrad_ir::{Op, Scalar, SourceLoc};

/// Apply `op` to `args` in the mode they (and the active trace) select, with eager
/// autograd recording: the dispatch and the autograd record composed, the one path
/// every op method takes.
pub(crate) fn dispatch(op: Op, args: &[&Tensor], loc: &SourceLoc) -> Result<Tensor> {
    dispatch_with::<EagerRecord>(op, args, loc)
}

impl Tensor {
    /// Apply any core op to tensors (eagerly, or recorded while tracing), with the same
    /// checks as the named methods. `args[0]` is `self` for views and in-place ops.
    #[track_caller]
    pub fn apply(op: Op, args: &[&Tensor]) -> Result<Tensor> {
        dispatch(op, args, &SourceLoc::caller())
    }
}

/// The second operand of a binary op: a tensor, or a scalar (a weakly typed
/// "wrapped number", as in PyTorch's `x * 2`).
#[derive(Clone, Copy, Debug)]
pub enum Rhs<'a> {
    /// A tensor (broadcast against `self`).
    Tensor(&'a Tensor),
    /// A scalar.
    Scalar(Scalar),
}

/// Things usable as the second operand of a binary op: `&Tensor`, `f64`, `f32`, `i64`,
/// `i32`, `bool`, [`Scalar`].
pub trait IntoRhs<'a> {
    /// Convert.
    fn into_rhs(self) -> Rhs<'a>;
}

impl<'a> IntoRhs<'a> for &'a Tensor {
    fn into_rhs(self) -> Rhs<'a> {
        Rhs::Tensor(self)
    }
}
impl<'a> IntoRhs<'a> for Rhs<'a> {
    fn into_rhs(self) -> Rhs<'a> {
        self
    }
}
macro_rules! scalar_rhs {
    ($($t:ty),*) => {$(
        impl<'a> IntoRhs<'a> for $t {
            fn into_rhs(self) -> Rhs<'a> {
                Rhs::Scalar(Scalar::from(self))
            }
        }
    )*};
}
scalar_rhs!(f64, f32, i64, i32, bool, Scalar);

/// While the guard lives, core ops called from this crate's op files (helpers and
/// closures of a composed op, which no `#[track_caller]` chain reaches) are recorded at
/// `loc`, the user's call of the composed op.
pub(crate) fn user_site(loc: &SourceLoc) -> aotgrad_ir::AttributeCalls {
    aotgrad_ir::AttributeCalls::to(file!(), loc.clone())
}

/// Wrap a possibly negative dim against `rank`, as a located error.
pub(crate) fn wrap(op: &str, dim: i64, rank: usize, loc: &SourceLoc) -> Result<usize> {
    wrap_dim(op, dim, rank).map_err(|e| Error::shape(op, loc, e))
}

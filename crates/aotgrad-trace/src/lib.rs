//! `aotgrad-trace`: the user-facing [`Tensor`] and its ops, in two modes with the same
//! semantics: eager (real CPU kernels from `aotgrad-cpu`) and fake (metadata only,
//! recorded into an [`aotgrad_ir::Graph`] by [`trace()`]).
//!
//! - [`tensor`]: the [`Tensor`] handle, metadata accessors, autograd flags, data access;
//! - [`ops`]: op methods with PyTorch names (pointwise, reductions, views, in-place,
//!   creation, indexing), all `#[track_caller]` so errors name the user's line;
//! - [`trace`](mod@trace): the tracing entry point and its configuration;
//! - [`shape_env`]: shape symbols, duck sizing and guards;
//! - [`grad_mode`]: `no_grad` scopes;
//! - [`autograd`]: eager autograd: its record (`grad_fn`, `grad`, `retain_grad`) and
//!   its backward pass ([`Backward`]), on the derivative rules of `aotgrad-autodiff`;
//! - [`decomp`]: composite ops (linear, softmax, ...) and their decompositions;
//! - [`error`]: the crate's [`Error`].
#![warn(missing_docs)]
// `aotgrad_ir::ShapeError` is larger than clippy's threshold; closures that run shape
// inference under an oracle return it on a cold path. `Error` itself boxes it.
#![allow(clippy::result_large_err)]

pub mod autograd;
pub mod decomp;
mod dispatch;
pub mod error;
pub mod grad_mode;
pub mod ops;
pub mod rng;
pub mod shape_env;
pub mod tensor;
pub mod trace;

pub use autograd::{backward_from_edges, Backward};
pub use decomp::{CompositeKind, DecompPolicy, DecompTable};
pub use error::{Error, Result};
pub use grad_mode::{is_grad_enabled, no_grad, set_grad_enabled, NoGradGuard};
pub use ops::conv::Conv2dOpts;
pub use ops::{IntoRhs, Rhs};
pub use rng::{manual_seed, rng_state, set_rng_state, RngSeed};
pub use shape_env::{GuardFailure, ShapeEnv};
pub use tensor::{Element, Tensor};
pub use trace::{is_tracing, trace, RngInputs, TraceConfig, Traced};

pub use aotgrad_ir::{DType, Dim, Scalar, SourceLoc, SymId, TensorMeta};

//! `aotgrad`: an ahead-of-time autograd compiler for Rust.
//!
//! Write a tensor function with ordinary PyTorch semantics — views, in-place ops,
//! inputs that alias each other — and [`aot_function`] traces it once over fake
//! tensors, makes it functional, compiles it with a backend, and returns a callable
//! that behaves exactly like the eager function: same outputs, same mutations visible
//! on the inputs, same aliasing between outputs and inputs.
//!
//! ```
//! use aotgrad::prelude::*;
//!
//! let f = aot_function(
//!     |a: &[Tensor]| {
//!         a[0].mul_(2.0)?; // in-place on an input: the caller sees it
//!         Ok(vec![a[0].mul(3.0)?])
//!     },
//!     AotConfig::default(),
//! )?;
//! let x = Tensor::from_f64(&[1.0, 2.0], &[2], DType::F32)?;
//! let out = f.call(&[x.clone()])?;
//! assert_eq!(x.to_vec_f64()?, vec![2.0, 4.0]);
//! assert_eq!(out[0].to_vec_f64()?, vec![6.0, 12.0]);
//! # Ok::<(), aotgrad::Error>(())
//! ```
//!
//! This crate is the facade: it composes the pipeline's crates and re-exports what a
//! user writes — [`trace`] (tensors, eager mode and its autograd, tracing),
//! [`functionalize`], [`meta`], [`autodiff`], the partitioner, [`cpu`] (and `wgpu`
//! with the `wgpu` feature), `dist` (data-parallel training on MPI, with the `mpi`
//! feature), [`cache`], [`runtime`] (compiled functions and modules,
//! [`AotConfig`], export) and [`nn`] (layers, optimizers, checkpoints) — plus the
//! [`prelude`] and the logging set-up ([`init_logging`]).
#![warn(missing_docs)]

mod logging;

/// Data-parallel training on MPI (with the `mpi` feature).
#[cfg(feature = "mpi")]
pub use aotgrad_dist as dist;
pub use aotgrad_trace::autograd;
/// The wgpu backend (with the `wgpu` feature).
#[cfg(feature = "wgpu")]
pub use aotgrad_wgpu as wgpu;
pub use autograd::{backward_from_edges, Backward};
pub use logging::init_logging;
pub use runtime::{
    aot_export_joint_simple, aot_export_module, aot_function, aot_function_args, aot_function_outs, aot_module,
    aot_module_simplified, default_backend, AotConfig, AotFunction, AotModule, Arg, Cache, CacheStats, CompileReport,
    EntrySource, Error, ModuleBackward, ModuleGrads, Output, Result, BACKEND_ENV,
};
pub use runtime::{config, error, export, module};

pub use aotgrad_autodiff as autodiff;
pub use aotgrad_cache as cache;
pub use aotgrad_cpu as cpu;
pub use aotgrad_functionalize as functionalize;
pub use aotgrad_import as import;
pub use aotgrad_ir as ir;
pub use aotgrad_meta as meta;
pub use aotgrad_nn as nn;
pub use aotgrad_partition as partition;
pub use aotgrad_runtime as runtime;
pub use aotgrad_trace as trace;

/// Everything a typical user needs.
pub mod prelude {
    pub use crate::nn::{Module, ParamStore, Params};
    pub use crate::{
        aot_function, aot_function_args, aot_function_outs, AotConfig, AotFunction, Arg, Backward, Output,
    };
    pub use crate::{aot_module, aot_module_simplified, AotModule};
    pub use aotgrad_ir::{DType, Dim, Scalar};
    pub use aotgrad_trace::{
        is_grad_enabled, no_grad, trace, CompositeKind, Conv2dOpts, DecompTable, NoGradGuard, Tensor, TraceConfig,
    };
}

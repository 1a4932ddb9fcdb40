//! `aotgrad-runtime`: the runtime of compiled functions — [`aot_function`] and the
//! callable it returns, [`aot_module`], and the export APIs.
//!
//! A call flows one way through the stages below; each stage is a module that uses
//! the ones before it and never calls back into them:
//!
//! 1. [`signature`]: the call's signature (argument kinds, dtypes, grad flags,
//!    aliasing) and the binding of traced, possibly symbolic, metadata to the call's;
//! 2. [`entry`] (guards): the compiled entry the signature selects, whose symbols bind
//!    and whose guards hold — or, when none does, `cache` (1a: the key of the trace
//!    and a stored result) and `compile` (1b: trace, functionalize, compile, or the
//!    training path: joint graph, partition, forward and backward), whose result
//!    becomes an entry through the one `Entry::instantiate`;
//! 3. `bind`: the graph inputs built from the caller's tensors;
//! 4. `run`: the compiled graph (inference) or compiled forward (training);
//! 5. `epilogue`: mutations written back, metadata mutations replayed, aliased
//!    outputs regenerated as views;
//! 6. the outputs, and for training a [`PendingBackward`] (`backward`).
//!
//! [`function`] holds [`AotFunction`], which drives the stages for each call;
//! [`module`] compiles a [`Module`] (its [`params`] lifted as graph inputs) on top of
//! it, and [`export`] produces graphs without a callable.
#![warn(missing_docs)]

mod backward;
mod bind;
mod cache;
mod compile;
pub mod config;
pub mod entry;
mod epilogue;
pub mod error;
pub mod export;
pub mod function;
pub mod module;
pub mod params;
mod run;
pub mod signature;

pub use backward::PendingBackward;
pub use cache::CacheStats;
pub use config::{default_backend, AotConfig, Cache, Partitioner, BACKEND_ENV};
pub use entry::{CompileReport, EntrySource};
pub use error::{Error, Result};
pub use export::{aot_export_joint_simple, aot_export_module};
pub use function::{aot_function, aot_function_args, aot_function_outs, AotFunction};
pub use module::{aot_module, aot_module_simplified, AotModule, ModuleBackward, ModuleGrads};
pub use params::{Module, ParamStore, Params};
pub use signature::{Arg, Output};

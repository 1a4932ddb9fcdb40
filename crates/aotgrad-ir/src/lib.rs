//! `aotgrad-ir`: the intermediate representation every aotgrad stage speaks.
//!
//! - [`dtype`]: element types, scalars, type promotion;
//! - [`sym`]: dims that are constants or polynomials over shape symbols, and guards;
//! - [`meta`]: [`TensorMeta`] (shape, strides, offset, dtype);
//! - [`op`]: the closed [`Op`] enum, grouped into families;
//! - [`infer`]: read-only shape/stride/dtype inference per op, with typed errors;
//! - [`graph`]: [`Graph`], its inputs and nodes, storage identity, source locations;
//! - [`text`]: a printer and a parser for graphs that round-trip exactly;
//! - [`builder`]: [`GraphBuilder`], the graph-under-construction passes build with;
//! - [`backend`]: the interface every backend implements (compile, run, serialize);
//! - [`codec`]: the one binary encoding of artifacts and cache entries.
#![warn(missing_docs)]

pub mod backend;
pub mod builder;
pub mod codec;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod infer;
pub mod meta;
pub mod op;
pub mod sym;
pub mod text;

pub use backend::{Backend, BackendError, CompileOptions, CompiledGraph, HostData, ReadyOutput};
pub use builder::{BuildError, BuildResult, GraphBuilder};
pub use dtype::{result_type, Category, DType, Operand, Scalar};
pub use error::{ParseError, ShapeError};
pub use graph::{
    AttributeCalls, Def, Graph, GraphAppender, GraphIndex, Input, InvalidGraph, Node, SourceLoc, StorageId, ValueId,
    ValueMap,
};
pub use meta::{contiguous_strides, DimList, Dims, TensorMeta, ViewCreation};
#[doc(hidden)]
pub use smallvec as __smallvec;

/// A [`Dims`] list, written as `vec!` would be: `dims![a, b]` or `dims![d; n]`.
#[macro_export]
macro_rules! dims {
    ($($t:tt)*) => {{
        let d: $crate::Dims = $crate::__smallvec::smallvec![$($t)*];
        d
    }};
}
pub use op::{window_out, Aliasing, BinaryOp, CmpOp, CompositeOp, Conv2dParams, Op, Pool2dParams, ReduceOp, UnaryOp};
pub use sym::{Dim, DimOracle, Guard, Poly, Rel, StaticOracle, SymId};

//! `aotgrad-meta`: what a compiled function must do besides running its graph.
//!
//! - [`ViewAndMutationMeta`]: per traced input, whether its data or metadata was
//!   mutated, whether the mutation is hidden from autograd, whether it requires grad;
//!   per user output, whether it is fresh, an input itself, a view of an input, a view
//!   of an intermediate (whose base the graph also returns) or a view of another output;
//! - [`CallingConvention`]: how the traced inputs map to graph inputs (aliased, mutated
//!   inputs merged into a synthetic base); the runtime folds duplicate user arguments
//!   and non-tensor arguments away before tracing;
//! - [`overlap()`]: the exact overlap test for two strided layouts of one storage, and
//!   [`Layout::may_repeat`], whether one layout names a storage element twice;
//! - [`GraphSignature`]: the exported description of a graph's inputs and outputs.
#![warn(missing_docs)]

pub mod convention;
pub mod overlap;
pub mod signature;
pub mod view_meta;

pub use convention::{ArgSlot, CallingConvention, SyntheticBase};
pub use overlap::{overlap, AddressOverflow, Layout, Overlap};
pub use signature::{GraphSignature, InputSpec, InputSpecKind, OutputSpec, OutputSpecKind};
pub use view_meta::{InputInfo, OutputInfo, OutputKind, OutputSource, ViewAndMutationMeta};

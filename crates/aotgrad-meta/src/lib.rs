//! `aotgrad-meta`: what a compiled function must do besides running its graph.
//!
//! - [`ViewAndMutationMeta`]: per graph input, whether its data or metadata was
//!   mutated, whether the mutation is hidden from autograd, whether it requires grad;
//!   per user output, whether it is fresh, an input itself, a view of an input, a view
//!   of an intermediate (whose base the graph also returns) or a view of another output;
//! - [`CallingConvention`]: how the user's arguments map to graph inputs (duplicates
//!   folded into one input, aliased mutated inputs merged into a synthetic base,
//!   non-tensor arguments passed through);
//! - [`overlap`]: the exact overlap test for two strided layouts of one storage;
//! - [`GraphSignature`]: the exported description of a graph's inputs and outputs.
#![warn(missing_docs)]

pub mod convention;
pub mod overlap;
pub mod signature;
pub mod view_meta;

pub use convention::{ArgSlot, CallingConvention, SyntheticBase};
pub use overlap::{overlap, Layout, Overlap};
pub use signature::{GraphSignature, InputSpec, InputSpecKind, OutputSpec, OutputSpecKind};
pub use view_meta::{InputInfo, OutputInfo, OutputKind, ViewAndMutationMeta};

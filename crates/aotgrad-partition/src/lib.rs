//! `aotgrad-partition`: e-graph simplification of joint graphs and forward/backward
//! partitioning with rematerialization.
//!
//! - [`simplify()`]: load a functional graph into an `egg` e-graph, run the rewrite
//!   rules (CSE, algebra, views; `rules`), extract the cheapest equivalent graph;
//! - [`partition`]: split a [`JointGraph`](aotgrad_autodiff::JointGraph) into a forward
//!   and a backward graph, either saving everything the backward uses
//!   ([`default_partition`]) or choosing what to save by a minimum cut and recomputing
//!   the rest ([`min_cut_partition`]);
//! - [`cost`]: the byte and FLOP estimates both use;
//! - [`verify_graph`]: the well-formedness check every produced graph passes.
#![warn(missing_docs)]

pub mod cost;
mod error;
pub mod partition;
mod rules;
pub mod simplify;
mod verify;

pub use error::{PartitionError, Result};
pub use partition::{default_partition, min_cut_partition, MinCutConfig, PartitionReport, Partitioned, SavedValue};
pub use simplify::{simplify, simplify_joint, simplify_with_stats, SimplifyLimits, SimplifyOutcome, SimplifyStats};
pub use verify::verify_graph;

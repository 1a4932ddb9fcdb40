//! The crate's error type.

use thiserror::Error;

/// Errors of simplification and partitioning.
#[derive(Debug, Error)]
pub enum PartitionError {
    /// The joint graph breaks its documented convention (see
    /// [`aotgrad_autodiff::JointGraph`]).
    #[error("invalid joint graph: {0}")]
    InvalidJoint(String),
    /// A graph this pass does not handle (e.g. one that still mutates tensors).
    #[error("unsupported graph: {0}")]
    Unsupported(String),
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A failed internal invariant: a bug.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, PartitionError>;

//! The facade's error type: every stage's error, plus calling-convention errors.

use thiserror::Error;

/// Errors of `aotgrad`.
#[derive(Debug, Error)]
pub enum Error {
    /// Tracing (or an eager op) failed: shape errors, mode errors, ...
    #[error(transparent)]
    Trace(aotgrad_trace::Error),
    /// Functionalization failed.
    #[error(transparent)]
    Functionalize(#[from] aotgrad_functionalize::FunctionalizeError),
    /// Differentiation failed.
    #[error(transparent)]
    Autodiff(Box<aotgrad_autodiff::AutodiffError>),
    /// Simplification or partitioning failed.
    #[error(transparent)]
    Partition(#[from] aotgrad_partition::PartitionError),
    /// A backend failed to compile or run a graph.
    #[error(transparent)]
    Backend(#[from] aotgrad_ir::BackendError),
    /// A CPU kernel failed in the runtime epilogue.
    #[error(transparent)]
    Cpu(Box<aotgrad_cpu::CpuError>),
    /// The compiled function was called wrongly (argument count or kinds).
    #[error("compiled function `{name}`: {msg}")]
    Call {
        /// The compiled function's name.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// A program that the export APIs (`aot_export_module`, `aot_export_joint_simple`)
    /// do not accept.
    #[error("{api}: {msg}")]
    Export {
        /// The export API.
        api: String,
        /// What is not supported, and how to fix it.
        msg: String,
    },
    /// A cache or precompiled-function file that cannot be used (a miss is never an
    /// error: this is for explicit loads and cache configuration).
    #[error("cache: {0}")]
    Cache(String),
    /// A failed internal invariant: a bug.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
}

impl From<aotgrad_trace::Error> for Error {
    /// A tracing error; an `aotgrad` error that crossed a user function as
    /// `trace::Error::External` is itself again.
    fn from(e: aotgrad_trace::Error) -> Self {
        match e {
            aotgrad_trace::Error::External(inner) => match inner.downcast::<Error>() {
                Ok(own) => *own,
                Err(other) => Error::Trace(aotgrad_trace::Error::External(other)),
            },
            t => Error::Trace(t),
        }
    }
}

/// Result of `aotgrad`.
pub type Result<T> = std::result::Result<T, Error>;

/// An `aotgrad` error crossing code that returns `trace::Result` (a helper of tensor
/// ops, the tracer between a compiled call and the user's function): a tracing error
/// comes back as itself, any other is carried whole (`trace::Error::External`) and
/// turns back into this error when it reaches an `aotgrad::Result`.
impl From<Error> for aotgrad_trace::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Trace(t) => t,
            other => aotgrad_trace::Error::External(Box::new(other)),
        }
    }
}

impl From<aotgrad_autodiff::AutodiffError> for Error {
    fn from(e: aotgrad_autodiff::AutodiffError) -> Self {
        Error::Autodiff(Box::new(e))
    }
}

impl From<aotgrad_cpu::CpuError> for Error {
    fn from(e: aotgrad_cpu::CpuError) -> Self {
        Error::Cpu(Box::new(e))
    }
}

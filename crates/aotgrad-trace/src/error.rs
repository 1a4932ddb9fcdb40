//! The error type of `aotgrad-trace`: every failure is a value naming the op and the
//! user's source line, never a panic.

use crate::shape_env::GuardFailure;
use aotgrad_cpu::CpuError;
use aotgrad_ir::{ShapeError, SourceLoc};
use thiserror::Error;

/// Everything that can go wrong while running or tracing tensor code.
#[derive(Debug, Error)]
pub enum Error {
    /// Shape, stride or dtype inference rejected an op (the same rejection in eager
    /// and fake mode). Prints like `src/main.rs:12:5: mm: inner dimensions do not match: [4, 3] @ [4, 3]`.
    #[error("{loc}: {source}")]
    Shape {
        /// The op the user called.
        op: String,
        /// Where the user called it.
        loc: SourceLoc,
        /// Why inference rejected it.
        #[source]
        source: Box<ShapeError>,
    },
    /// A CPU kernel rejected its inputs at run time (eager mode).
    #[error("{loc}: {}", kernel_text(.op, .source))]
    Kernel {
        /// The op the user called.
        op: String,
        /// Where the user called it.
        loc: SourceLoc,
        /// The kernel's error.
        #[source]
        source: Box<CpuError>,
    },
    /// Tensors of different modes mixed (an eager tensor inside a trace, a fake tensor
    /// outside its trace), or data asked of a fake tensor.
    #[error("{loc}: {op}: {msg}")]
    Mode {
        /// The op the user called.
        op: String,
        /// Where the user called it.
        loc: SourceLoc,
        /// What was mixed up.
        msg: String,
    },
    /// An autograd rule was broken (in-place on a leaf that requires grad, ...).
    #[error("{loc}: {op}: {msg}")]
    Autograd {
        /// The op the user called.
        op: String,
        /// Where the user called it.
        loc: SourceLoc,
        /// The rule.
        msg: String,
    },
    /// An invalid argument that is not about shapes (e.g. `item()` of a tensor with
    /// several elements, concrete sizes asked of a symbolic shape).
    #[error("{loc}: {op}: {msg}")]
    Invalid {
        /// The op the user called.
        op: String,
        /// Where the user called it.
        loc: SourceLoc,
        /// What is wrong.
        msg: String,
    },
    /// Concrete inputs do not satisfy the guards a trace relied on.
    #[error(transparent)]
    Guard(#[from] GuardFailure),
    /// A failed internal invariant: a bug in aotgrad.
    #[error("internal error (a bug in aotgrad, please report it): {0}")]
    Internal(String),
    /// An error of a layer above tracing (the facade's `aotgrad::Error`: building a
    /// layer, calling a compiled function) raised inside a traced or eager function,
    /// so that such functions can use `?` on it.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync + 'static>),
}

fn kernel_text(op: &str, e: &CpuError) -> String {
    match e {
        CpuError::Kernel { .. } | CpuError::Shape(_) => e.to_string(),
        _ => format!("{op}: {e}"),
    }
}

impl Error {
    /// The op this error is about, when it is about one.
    pub fn op(&self) -> Option<&str> {
        match self {
            Error::Shape { op, .. }
            | Error::Kernel { op, .. }
            | Error::Mode { op, .. }
            | Error::Autograd { op, .. }
            | Error::Invalid { op, .. } => Some(op),
            Error::Guard(_) | Error::Internal(_) | Error::External(_) => None,
        }
    }
    /// The user's source location, when known.
    pub fn loc(&self) -> Option<&SourceLoc> {
        match self {
            Error::Shape { loc, .. }
            | Error::Kernel { loc, .. }
            | Error::Mode { loc, .. }
            | Error::Autograd { loc, .. }
            | Error::Invalid { loc, .. } => Some(loc),
            Error::Guard(_) | Error::Internal(_) | Error::External(_) => None,
        }
    }
    /// The inference error, for [`Error::Shape`].
    pub fn shape_error(&self) -> Option<&ShapeError> {
        match self {
            Error::Shape { source, .. } => Some(&**source),
            _ => None,
        }
    }
    pub(crate) fn shape(op: &str, loc: &SourceLoc, source: ShapeError) -> Error {
        Error::Shape { op: op.to_string(), loc: loc.clone(), source: Box::new(source) }
    }
    pub(crate) fn kernel(op: &str, loc: &SourceLoc, source: CpuError) -> Error {
        Error::Kernel { op: op.to_string(), loc: loc.clone(), source: Box::new(source) }
    }
    pub(crate) fn mode(op: &str, loc: &SourceLoc, msg: impl Into<String>) -> Error {
        Error::Mode { op: op.to_string(), loc: loc.clone(), msg: msg.into() }
    }
    pub(crate) fn invalid(op: &str, loc: &SourceLoc, msg: impl Into<String>) -> Error {
        Error::Invalid { op: op.to_string(), loc: loc.clone(), msg: msg.into() }
    }
    pub(crate) fn autograd(op: &str, loc: &SourceLoc, msg: impl Into<String>) -> Error {
        Error::Autograd { op: op.to_string(), loc: loc.clone(), msg: msg.into() }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

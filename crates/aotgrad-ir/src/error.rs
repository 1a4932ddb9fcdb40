//! Errors of the IR crate: shape/dtype inference and the text format.

use thiserror::Error;

/// Why shape, stride or dtype inference rejected an op. Every variant names the op;
/// shapes are pre-formatted (`[4, 3]`) so messages read like PyTorch's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    /// Wrong number of tensor arguments.
    #[error("{op}: expected {expected} tensor argument(s), got {got}")]
    Arity {
        /// Op name.
        op: String,
        /// Expected count (text, e.g. "2" or "at least 1").
        expected: String,
        /// Actual count.
        got: usize,
    },
    /// Shapes that do not broadcast.
    #[error("{op}: shapes {lhs} and {rhs} cannot be broadcast together (dim {dim}: {lhs_size} vs {rhs_size})")]
    Broadcast {
        /// Op name.
        op: String,
        /// First shape.
        lhs: String,
        /// Second shape.
        rhs: String,
        /// Offending dim (counted from the right-aligned result).
        dim: usize,
        /// Size in the first shape.
        lhs_size: String,
        /// Size in the second shape.
        rhs_size: String,
    },
    /// Matrix-multiply operands whose inner dims differ.
    #[error("{op}: inner dimensions do not match: {lhs} @ {rhs}")]
    MatmulMismatch {
        /// Op name.
        op: String,
        /// Left shape.
        lhs: String,
        /// Right shape.
        rhs: String,
    },
    /// A view to a size with a different number of elements, or not expressible with strides.
    #[error("{op}: cannot view a tensor of shape {from} as {to}: {why}")]
    View {
        /// Op name.
        op: String,
        /// Input shape.
        from: String,
        /// Requested shape.
        to: String,
        /// Reason.
        why: String,
    },
    /// An in-place op whose result would not fit the tensor it writes into.
    #[error("{op}: in-place result of shape {result} {result_dtype} cannot be written into a tensor of shape {target} {target_dtype}")]
    InPlace {
        /// Op name.
        op: String,
        /// Shape of the computed result.
        result: String,
        /// Dtype of the computed result.
        result_dtype: String,
        /// Shape of the mutated tensor.
        target: String,
        /// Dtype of the mutated tensor.
        target_dtype: String,
    },
    /// A dtype the op does not accept.
    #[error("{op}: unsupported dtype {dtype} for {what}")]
    DType {
        /// Op name.
        op: String,
        /// The dtype given.
        dtype: String,
        /// Which operand / why.
        what: String,
    },
    /// A dim index outside the tensor's rank.
    #[error("{op}: dimension {dim} out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        /// Op name.
        op: String,
        /// Dim given (as the user wrote it).
        dim: i64,
        /// Rank.
        rank: usize,
    },
    /// An index outside a dim's size.
    #[error("{op}: index {index} out of range for dimension {dim} of size {size}")]
    IndexOutOfRange {
        /// Op name.
        op: String,
        /// Index.
        index: String,
        /// Dim.
        dim: usize,
        /// Size.
        size: String,
    },
    /// Any other invalid argument.
    #[error("{op}: {msg}")]
    Invalid {
        /// Op name.
        op: String,
        /// What is wrong, with the shapes involved.
        msg: String,
    },
}

impl ShapeError {
    /// A short name for the kind of error (used to compare fake and eager rejections).
    pub fn kind(&self) -> &'static str {
        match self {
            ShapeError::Arity { .. } => "arity",
            ShapeError::Broadcast { .. } => "broadcast",
            ShapeError::MatmulMismatch { .. } => "matmul",
            ShapeError::View { .. } => "view",
            ShapeError::InPlace { .. } => "inplace",
            ShapeError::DType { .. } => "dtype",
            ShapeError::DimOutOfRange { .. } => "dim",
            ShapeError::IndexOutOfRange { .. } => "index",
            ShapeError::Invalid { .. } => "invalid",
        }
    }
}

/// A text-format parse failure, with the 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("graph text, line {line}, column {col}: {msg}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What was expected.
    pub msg: String,
}

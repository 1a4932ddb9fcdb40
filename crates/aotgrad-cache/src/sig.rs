//! The call signature that selects a compiled entry: what a call's arguments look
//! like, minus the metadata that shape symbols may absorb (that part is matched
//! against [`crate::ResultMeta::input_metas`] and the guards).

use aotgrad_ir::DType;
use serde::{Deserialize, Serialize};

/// One argument of a call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ArgSig {
    /// A tensor.
    Tensor {
        /// Its element type.
        dtype: DType,
        /// Its rank.
        rank: usize,
        /// Whether it requires grad.
        requires_grad: bool,
        /// With grad mode on: the autograd state tracing depends on (`None` under no-grad).
        leafness: Option<Leafness>,
        /// The first argument that is the same tensor object (itself if none).
        same_object_as: usize,
        /// The first argument sharing its storage (itself if none).
        storage_class: usize,
    },
    /// An integer (specialized into the trace).
    Int(i64),
    /// A float, by its bits (specialized into the trace).
    Float(u64),
    /// A bool (specialized into the trace).
    Bool(bool),
    /// Nothing.
    None,
}

/// The autograd state of a tensor argument that a trace under grad mode depends on:
/// eager refuses an in-place op on a leaf that requires grad, or on a view of one, so
/// two calls that differ here may not share a compiled entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Leafness {
    /// Whether the tensor is a leaf.
    pub is_leaf: bool,
    /// For a view: its base's `(is_leaf, requires_grad)`.
    pub base: Option<(bool, bool)>,
}

/// The signature of one call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallSig {
    /// Per argument.
    pub args: Vec<ArgSig>,
    /// Whether grad mode was on.
    pub grad_enabled: bool,
}

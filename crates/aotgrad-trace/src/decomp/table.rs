//! The decomposition table: which composite ops there are ([`CompositeKind`]) and,
//! per kind, what tracing does with it ([`DecompPolicy`]). Plain configuration, on the
//! tensor's floor so that a trace's state can hold its table; applying a composite is
//! the parent module's.

use crate::error::Result;
use crate::tensor::Tensor;
use aotgrad_ir::CompositeOp;
use std::fmt;
use std::sync::Arc;

/// Which composite op, without its parameters (the key of a [`DecompTable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CompositeKind {
    /// [`CompositeOp::Linear`].
    Linear,
    /// [`CompositeOp::Matmul`].
    Matmul,
    /// [`CompositeOp::Gelu`] (exact and tanh-approximated).
    Gelu,
    /// [`CompositeOp::Silu`].
    Silu,
    /// [`CompositeOp::Softmax`].
    Softmax,
    /// [`CompositeOp::LogSoftmax`].
    LogSoftmax,
    /// [`CompositeOp::LayerNorm`].
    LayerNorm,
    /// [`CompositeOp::Dropout`].
    Dropout,
    /// [`CompositeOp::Embedding`].
    Embedding,
    /// [`CompositeOp::MseLoss`].
    MseLoss,
    /// [`CompositeOp::CrossEntropy`].
    CrossEntropy,
    /// [`CompositeOp::MaskedFill`] (`masked_fill`; `masked_fill_` copies its result in).
    MaskedFill,
    /// [`CompositeOp::Tril`].
    Tril,
    /// [`CompositeOp::Triu`].
    Triu,
    /// [`CompositeOp::Var`] (`var`; `std` is its square root).
    Var,
    /// [`CompositeOp::OneHot`].
    OneHot,
}

impl CompositeKind {
    /// Every composite kind.
    pub const ALL: [CompositeKind; 16] = [
        CompositeKind::Linear,
        CompositeKind::Matmul,
        CompositeKind::Gelu,
        CompositeKind::Silu,
        CompositeKind::Softmax,
        CompositeKind::LogSoftmax,
        CompositeKind::LayerNorm,
        CompositeKind::Dropout,
        CompositeKind::Embedding,
        CompositeKind::MseLoss,
        CompositeKind::CrossEntropy,
        CompositeKind::MaskedFill,
        CompositeKind::Tril,
        CompositeKind::Triu,
        CompositeKind::Var,
        CompositeKind::OneHot,
    ];

    /// The kind of a composite op.
    pub fn of(op: &CompositeOp) -> CompositeKind {
        match op {
            CompositeOp::Linear => CompositeKind::Linear,
            CompositeOp::Matmul => CompositeKind::Matmul,
            CompositeOp::Gelu { .. } => CompositeKind::Gelu,
            CompositeOp::Silu => CompositeKind::Silu,
            CompositeOp::Softmax { .. } => CompositeKind::Softmax,
            CompositeOp::LogSoftmax { .. } => CompositeKind::LogSoftmax,
            CompositeOp::LayerNorm { .. } => CompositeKind::LayerNorm,
            CompositeOp::Dropout { .. } => CompositeKind::Dropout,
            CompositeOp::Embedding => CompositeKind::Embedding,
            CompositeOp::MseLoss => CompositeKind::MseLoss,
            CompositeOp::CrossEntropy => CompositeKind::CrossEntropy,
            CompositeOp::MaskedFill { .. } => CompositeKind::MaskedFill,
            CompositeOp::Tril { .. } => CompositeKind::Tril,
            CompositeOp::Triu { .. } => CompositeKind::Triu,
            CompositeOp::Var { .. } => CompositeKind::Var,
            CompositeOp::OneHot { .. } => CompositeKind::OneHot,
        }
    }

    /// The PyTorch-style name (the same as [`CompositeOp::name`]).
    pub fn name(self) -> &'static str {
        match self {
            CompositeKind::Linear => "linear",
            CompositeKind::Matmul => "matmul",
            CompositeKind::Gelu => "gelu",
            CompositeKind::Silu => "silu",
            CompositeKind::Softmax => "softmax",
            CompositeKind::LogSoftmax => "log_softmax",
            CompositeKind::LayerNorm => "layer_norm",
            CompositeKind::Dropout => "dropout",
            CompositeKind::Embedding => "embedding",
            CompositeKind::MseLoss => "mse_loss",
            CompositeKind::CrossEntropy => "cross_entropy",
            CompositeKind::MaskedFill => "masked_fill",
            CompositeKind::Tril => "tril",
            CompositeKind::Triu => "triu",
            CompositeKind::Var => "var",
            CompositeKind::OneHot => "one_hot",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl From<&CompositeOp> for CompositeKind {
    fn from(op: &CompositeOp) -> Self {
        CompositeKind::of(op)
    }
}

impl fmt::Display for CompositeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A user-supplied decomposition: called with the composite's tensor arguments (in
/// [`CompositeOp`]'s argument order) and the op with its parameters; it must return a
/// tensor of the shape and dtype the composite produces.
pub type DecompFn = Arc<dyn Fn(&[Tensor], &CompositeOp) -> Result<Tensor> + Send + Sync>;

/// What tracing does with one composite kind.
#[derive(Clone, Default)]
pub enum DecompPolicy {
    /// Record the default decomposition into core ops.
    #[default]
    Decompose,
    /// Record one `Op::Composite` node (eager mode still runs the decomposition).
    Keep,
    /// Call this function instead of the default decomposition.
    Override(DecompFn),
}

impl fmt::Debug for DecompPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecompPolicy::Decompose => "Decompose",
            DecompPolicy::Keep => "Keep",
            DecompPolicy::Override(_) => "Override(..)",
        })
    }
}

/// Per composite kind, what tracing records (see the [module docs](super)). The default
/// table decomposes everything.
#[derive(Clone, Default)]
pub struct DecompTable {
    policies: [DecompPolicy; CompositeKind::ALL.len()],
}

impl DecompTable {
    /// A table that decomposes everything (the same as `DecompTable::default()`).
    pub fn new() -> DecompTable {
        DecompTable::default()
    }
    /// A table that keeps every composite whole.
    pub fn keep_all() -> DecompTable {
        let mut t = DecompTable::default();
        for k in CompositeKind::ALL {
            t.keep(k);
        }
        t
    }
    /// Keep `kind` whole: record it as a single `Op::Composite` node.
    pub fn keep(&mut self, kind: CompositeKind) -> &mut DecompTable {
        self.policies[kind.index()] = DecompPolicy::Keep;
        self
    }
    /// Decompose `kind` with `f` instead of the default decomposition.
    pub fn set_override<F>(&mut self, kind: CompositeKind, f: F) -> &mut DecompTable
    where
        F: Fn(&[Tensor], &CompositeOp) -> Result<Tensor> + Send + Sync + 'static,
    {
        self.policies[kind.index()] = DecompPolicy::Override(Arc::new(f));
        self
    }
    /// Back to the default decomposition for `kind`.
    pub fn reset(&mut self, kind: CompositeKind) -> &mut DecompTable {
        self.policies[kind.index()] = DecompPolicy::Decompose;
        self
    }
    /// What is done with `kind`.
    pub fn policy(&self, kind: CompositeKind) -> &DecompPolicy {
        &self.policies[kind.index()]
    }
    /// True when `kind` is recorded as a single node.
    pub fn is_kept(&self, kind: CompositeKind) -> bool {
        matches!(self.policy(kind), DecompPolicy::Keep)
    }
}

impl fmt::Debug for DecompTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for k in CompositeKind::ALL {
            if !matches!(self.policy(k), DecompPolicy::Decompose) {
                m.entry(&k.name(), self.policy(k));
            }
        }
        m.finish()
    }
}

//! Composite ops (`linear`, `matmul`, `gelu`, `silu`, `softmax`, `log_softmax`,
//! `layer_norm`, `dropout`, `embedding`, `mse_loss`, `cross_entropy`, `masked_fill`,
//! `tril`, `triu`, `var`, `one_hot`) and their decompositions into core ops.
//!
//! Calling a composite method on a [`Tensor`]:
//! 1. checks the arguments with the composite's own inference rule, so a rejection
//!    names the composite (`linear: inner dimensions do not match ...`) and the user's
//!    line, in eager and fake mode alike;
//! 2. does what the [`DecompTable`] of the active trace says for its [`CompositeKind`]
//!    (eager mode always decomposes):
//!    - [`DecompPolicy::Decompose`] (the default): run or record the core ops of the
//!      default decomposition, every one stamped with the user's call site;
//!    - [`DecompPolicy::Keep`]: record one `Op::Composite` node (tracing only; eagerly
//!      the decomposition runs, so values never depend on the policy);
//!    - [`DecompPolicy::Override`]: call the user's function with the argument tensors
//!      (its ops carry the override's own source lines);
//! 3. checks that the result has the shape and dtype the inference rule promised.
//!
//! The decompositions follow PyTorch's kernels: stable softmax (subtract the max),
//! f32 computation for f16/bf16 inputs of gelu/silu/softmax/log_softmax/layer_norm/
//! cross_entropy, `matmul`'s 1-D/2-D/batched rules, dropout's `bernoulli(1-p)/(1-p)`
//! mask. See `decomp/rules.rs`.

mod methods;
mod prim;
mod rules;

use crate::dispatch::{dispatch, mode_of, Mode};
use crate::error::{Error, Result};
use crate::tensor::{TState, Tensor};
use aotgrad_cpu::CpuError;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{CompositeOp, DimList, Op, SourceLoc, StaticOracle, TensorMeta};
use prim::Emit;
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

/// Per composite kind, what tracing records (see the [module docs](self)). The default
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

impl Tensor {
    /// Apply a composite op to `args` (in [`CompositeOp`]'s argument order) as the
    /// named methods do: checked, then decomposed, kept whole or overridden according
    /// to the active trace's [`DecompTable`].
    #[track_caller]
    pub fn apply_composite(op: CompositeOp, args: &[&Tensor]) -> Result<Tensor> {
        apply_composite(op, args, &SourceLoc::caller())
    }

    /// Apply any IR op to `args` (in the op's argument order), eagerly or while
    /// tracing, exactly as the method that records it would: in-place and view ops
    /// included, composites through [`Tensor::apply_composite`]. `loc` is the source
    /// location errors and the traced node carry. This is how a graph read from text
    /// is replayed as a function.
    pub fn apply_op(op: &Op, args: &[&Tensor], loc: &SourceLoc) -> Result<Tensor> {
        match op {
            Op::Composite(c) => apply_composite(c.clone(), args, loc),
            _ => crate::dispatch::dispatch(op.clone(), args, loc),
        }
    }
}

/// The one entry point of every composite op (see the [module docs](self)).
pub(crate) fn apply_composite(op: CompositeOp, args: &[&Tensor], loc: &SourceLoc) -> Result<Tensor> {
    let name = op.name();
    let kind = CompositeKind::of(&op);
    let whole = Op::Composite(op.clone());
    let states: Vec<TState> = args.iter().map(|t| t.snapshot()).collect();
    let refs: Vec<&TState> = states.iter().collect();
    let metas: Vec<&TensorMeta> = states.iter().map(TState::meta).collect();
    let mode = mode_of(name, &refs, loc)?;
    let (expected, policy) = match &mode {
        Mode::Eager => (infer(&whole, &metas, &mut StaticOracle), DecompPolicy::Decompose),
        Mode::Fake(ctx) => {
            let mut st = ctx.lock();
            let expected = infer(&whole, &metas, &mut st.shape_env);
            (expected, st.decomps.policy(kind).clone())
        }
    };
    let expected = expected.map_err(|e| Error::shape(name, loc, e))?;
    drop(states);
    let out = match &policy {
        DecompPolicy::Keep => return dispatch(whole, args, loc),
        DecompPolicy::Decompose => {
            // Decompositions written with tensor methods (in the op files) record
            // their core ops at the user's call too.
            let _site = crate::ops::user_site(loc);
            rules::decompose(&Emit { name, loc }, &op, args, expected.dtype).map_err(|e| blame_composite(name, e))?
        }
        DecompPolicy::Override(f) => {
            let owned: Vec<Tensor> = args.iter().map(|t| (*t).clone()).collect();
            f(&owned, &op)?
        }
    };
    check_result(name, &policy, &out, &expected, loc)?;
    Ok(out)
}

/// A kernel of the default decomposition rejected its inputs at run time (e.g. a
/// class index out of range in `cross_entropy`'s gather): report it as the
/// composite's error, keeping the core op's message (`cross_entropy: gather: ...`).
fn blame_composite(name: &str, e: Error) -> Error {
    match e {
        Error::Kernel { op, loc, source } if op != name => match *source {
            CpuError::Kernel { op: inner, msg } => Error::Kernel {
                op: name.to_string(),
                loc,
                source: Box::new(CpuError::Kernel { op: name.to_string(), msg: format!("{inner}: {msg}") }),
            },
            other => Error::Kernel { op, loc, source: Box::new(other) },
        },
        other => other,
    }
}

/// The result must have the promised shape and dtype: a user error for an override,
/// an internal one for the default decomposition.
fn check_result(name: &str, policy: &DecompPolicy, out: &Tensor, expected: &TensorMeta, loc: &SourceLoc) -> Result<()> {
    let got = out.meta();
    if got.shape == expected.shape && got.dtype == expected.dtype {
        return Ok(());
    }
    let msg = format!(
        "decomposition produced {}{} but {name} produces {}{}",
        got.dtype,
        DimList(&got.shape),
        expected.dtype,
        DimList(&expected.shape)
    );
    match policy {
        DecompPolicy::Override(_) => Err(Error::invalid(name, loc, format!("user-supplied {msg}"))),
        _ => Err(Error::Internal(format!("{loc}: {msg}"))),
    }
}

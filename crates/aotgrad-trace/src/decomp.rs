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
pub(crate) mod table;

pub use table::{CompositeKind, DecompFn, DecompPolicy, DecompTable};

use crate::dispatch::{mode_of, Mode};
use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::tensor::{TState, Tensor};
use aotgrad_cpu::CpuError;
use aotgrad_ir::infer::infer;
use aotgrad_ir::{CompositeOp, DimList, Op, SourceLoc, StaticOracle, TensorMeta};
use prim::Emit;

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
            _ => dispatch(op.clone(), args, loc),
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

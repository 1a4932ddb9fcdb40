//! Arguments of a compiled function, and the call signature that selects a compiled
//! entry: argument kinds, dtypes, requires-grad flags, the aliasing pattern between
//! tensor arguments, and their metadata (matched against the traced, possibly
//! symbolic, metadata, binding the symbols).

use aotgrad_ir::{DType, Dim, SymId, TensorMeta};
use aotgrad_trace::Tensor;
use std::collections::HashMap;

/// One argument of a compiled function: a tensor or a plain value (specialized into
/// the trace: a different value recompiles).
#[derive(Clone, Debug)]
pub enum Arg {
    /// A tensor.
    Tensor(Tensor),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// Nothing (`None` in Python).
    None,
}

impl Arg {
    /// The tensor, if this argument is one.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Arg::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl From<Tensor> for Arg {
    fn from(t: Tensor) -> Self {
        Arg::Tensor(t)
    }
}
impl From<&Tensor> for Arg {
    fn from(t: &Tensor) -> Self {
        Arg::Tensor(t.clone())
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::Float(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

/// What a call's arguments look like, minus the metadata that symbols may absorb.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ArgSig {
    Tensor {
        dtype: DType,
        rank: usize,
        requires_grad: bool,
        /// The first argument that is the same tensor object (itself if none).
        same_object_as: usize,
        /// The first argument sharing its storage (itself if none).
        storage_class: usize,
    },
    Int(i64),
    Float(u64),
    Bool(bool),
    None,
}

/// The signature of one call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CallSig {
    pub args: Vec<ArgSig>,
    pub grad_enabled: bool,
}

impl CallSig {
    pub fn of(args: &[Arg]) -> CallSig {
        let mut sigs = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            sigs.push(match a {
                Arg::Tensor(t) => {
                    let earlier = |pred: &dyn Fn(&Tensor) -> bool| {
                        args[..i].iter().position(|b| b.tensor().is_some_and(pred)).unwrap_or(i)
                    };
                    ArgSig::Tensor {
                        dtype: t.dtype(),
                        rank: t.dim(),
                        requires_grad: t.is_requires_grad(),
                        same_object_as: earlier(&|b| b.same_object(t)),
                        storage_class: earlier(&|b| b.shares_storage_with(t)),
                    }
                }
                Arg::Int(v) => ArgSig::Int(*v),
                Arg::Float(v) => ArgSig::Float(v.to_bits()),
                Arg::Bool(v) => ArgSig::Bool(*v),
                Arg::None => ArgSig::None,
            });
        }
        CallSig { args: sigs, grad_enabled: aotgrad_trace::is_grad_enabled() }
    }
}

/// Bind the symbols of traced metadata `traced` from concrete metadata `real`; `false`
/// when a constant differs or a symbol would get two values.
pub(crate) fn bind(traced: &TensorMeta, real: &TensorMeta, env: &mut HashMap<SymId, i64>) -> bool {
    if traced.dtype != real.dtype || traced.rank() != real.rank() {
        return false;
    }
    // Sizes first: single symbols bind, everything else is checked after binding.
    for (t, r) in traced.shape.iter().zip(&real.shape) {
        let Some(r) = r.as_const() else { return false };
        if let Some(s) = t.as_single_sym() {
            match env.get(&s) {
                Some(&v) if v != r => return false,
                _ => {
                    env.insert(s, r);
                }
            }
        }
    }
    let eval = |d: &Dim, env: &HashMap<SymId, i64>| d.eval(&|s| env.get(&s).copied());
    let pairs = traced.shape.iter().zip(&real.shape).chain(traced.strides.iter().zip(&real.strides));
    for (t, r) in pairs.chain(std::iter::once((&traced.offset, &real.offset))) {
        match (eval(t, env), r.as_const()) {
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
    true
}

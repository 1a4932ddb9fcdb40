//! Stage 1 of a call: the arguments of a compiled function, and the call signature that selects a compiled
//! entry: argument kinds, dtypes, requires-grad flags (with grad mode on, also
//! leafness and a view's base's flags), the aliasing pattern between tensor arguments
//! (`alias_classes`), and their metadata (matched against the traced, possibly
//! symbolic, metadata, binding the symbols).

use crate::error::{Error, Result};
use aotgrad_cache::{ArgSig, CallSig, Leafness};
use aotgrad_ir::{Dim, SymId, TensorMeta};
use aotgrad_trace::Tensor;
use std::collections::HashMap;
use std::sync::Arc;

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

/// One output of a function compiled with [`crate::aot_function_outs`]: a tensor or a
/// plain value, as PyTorch's `aot_function` returns ints (sizes included) and `None`.
#[derive(Clone, Debug)]
pub enum Output {
    /// A tensor.
    Tensor(Tensor),
    /// An integer. Inside a traced function a size may be symbolic (`x.shape()[0]`
    /// with a dynamic dim): the compiled function returns its value for each call.
    Int(Dim),
    /// Nothing (`None` in Python).
    None,
}

impl Output {
    /// The tensor, if this output is one.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Output::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// The integer, if this output is one with a known value (always, for the outputs
    /// of a compiled call).
    pub fn int(&self) -> Option<i64> {
        match self {
            Output::Int(d) => d.as_const(),
            _ => None,
        }
    }
    /// Whether this output is `None`.
    pub fn is_none(&self) -> bool {
        matches!(self, Output::None)
    }
}

impl From<Tensor> for Output {
    fn from(t: Tensor) -> Self {
        Output::Tensor(t)
    }
}
impl From<&Tensor> for Output {
    fn from(t: &Tensor) -> Self {
        Output::Tensor(t.clone())
    }
}
impl From<i64> for Output {
    fn from(v: i64) -> Self {
        Output::Int(Dim::Const(v))
    }
}
impl From<Dim> for Output {
    fn from(d: Dim) -> Self {
        Output::Int(d)
    }
}

/// The autograd state of a tensor argument that a trace under grad mode depends on
/// (see [`Leafness`]).
fn leafness_of(t: &Tensor) -> Leafness {
    Leafness { is_leaf: t.is_leaf(), base: t.base().map(|b| (b.is_leaf(), b.is_requires_grad())) }
}

/// The signature of one call: argument kinds, dtypes, ranks, requires-grad flags,
/// leafness (with grad mode on), aliasing pattern, plain values.
pub(crate) fn call_sig(args: &[Arg]) -> CallSig {
    let grad_enabled = aotgrad_trace::is_grad_enabled();
    let tensors: Vec<Option<&Tensor>> = args.iter().map(Arg::tensor).collect();
    let classes = alias_classes(&tensors);
    let sigs = args
        .iter()
        .zip(classes)
        .map(|(a, (same_object_as, storage_class))| match a {
            Arg::Tensor(t) => ArgSig::Tensor {
                dtype: t.dtype(),
                rank: t.dim(),
                requires_grad: t.is_requires_grad(),
                leafness: grad_enabled.then(|| leafness_of(t)),
                same_object_as,
                storage_class,
            },
            Arg::Int(v) => ArgSig::Int(*v),
            Arg::Float(v) => ArgSig::Float(v.to_bits()),
            Arg::Bool(v) => ArgSig::Bool(*v),
            Arg::None => ArgSig::None,
        })
        .collect();
    CallSig { args: sigs, grad_enabled }
}

/// For each position of `tensors`: the first position holding the same tensor object,
/// and the first whose tensor shares its storage (the position itself when none;
/// also for `None`). Eager tensors are grouped by storage pointer in one pass (a tensor
/// object is only compared with the tensors of its own storage); fake tensors, which
/// have no storage of their own, are compared pairwise.
pub(crate) fn alias_classes(tensors: &[Option<&Tensor>]) -> Vec<(usize, usize)> {
    let mut by_storage: HashMap<*const aotgrad_cpu::Storage, Vec<usize>> = HashMap::new();
    let mut fakes: Vec<usize> = Vec::new();
    let mut out = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let Some(t) = t else {
            out.push((i, i));
            continue;
        };
        let members = match t.to_cpu() {
            Ok(cpu) => by_storage.entry(Arc::as_ptr(&cpu.storage)).or_default(),
            Err(_) => {
                let same = fakes.iter().copied().filter(|&j| tensors[j].is_some_and(|u| u.shares_storage_with(t)));
                let first = same.clone().next().unwrap_or(i);
                let object = same.clone().find(|&j| tensors[j].is_some_and(|u| u.same_object(t))).unwrap_or(i);
                fakes.push(i);
                out.push((object, first));
                continue;
            }
        };
        let first = members.first().copied().unwrap_or(i);
        let object = members.iter().copied().find(|&j| tensors[j].is_some_and(|u| u.same_object(t))).unwrap_or(i);
        members.push(i);
        out.push((object, first));
    }
    out
}

/// Bind the symbols of traced metadata `traced` from concrete metadata `real`; `false`
/// when a constant differs, a symbol would get two values, or a symbol would be 0 or
/// 1: a symbol stands for sizes of at least 2 (what the trace assumed where it
/// decided without a guard: contiguity, broadcasting), so sizes 0 and 1 get an entry
/// specialized to them, as in PyTorch.
pub(crate) fn bind(traced: &TensorMeta, real: &TensorMeta, env: &mut HashMap<SymId, i64>) -> bool {
    if traced.dtype != real.dtype || traced.rank() != real.rank() {
        return false;
    }
    // Sizes first: single symbols bind, everything else is checked after binding.
    for (t, r) in traced.shape.iter().zip(&real.shape) {
        let Some(r) = r.as_const() else { return false };
        if let Some(s) = t.as_single_sym() {
            match env.get(&s) {
                _ if r < 2 => return false,
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

/// Symbol values of one call.
pub(crate) type Bindings = HashMap<SymId, i64>;

/// A call's symbol values, as the backends take them: every compiled graph of an
/// entry runs with the values its call bound, so a graph whose inputs do not carry a
/// symbol (a backward graph's sizes that only the forward's inputs determined, a size
/// such as `s0 + s1` that binds neither) still knows it.
pub(crate) fn given_symbols(env: &Bindings) -> Vec<(SymId, i64)> {
    let mut v: Vec<(SymId, i64)> = env.iter().map(|(s, x)| (*s, *x)).collect();
    v.sort_unstable();
    v
}

/// Evaluate traced metadata under a call's bindings.
pub(crate) fn concrete(meta: &TensorMeta, env: &Bindings) -> Result<TensorMeta> {
    let m = meta.subst(&|s| env.get(&s).copied());
    if m.is_concrete() {
        Ok(m)
    } else {
        Err(Error::Internal(format!("metadata {m} has unbound symbols")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aotgrad_ir::DType;

    #[test]
    fn alias_classes_group_objects_and_storages() {
        let a = Tensor::zeros(&[4], DType::F32).expect("zeros");
        let a_view = a.view(&[2, 2]).expect("view");
        let b = Tensor::zeros(&[4], DType::F32).expect("zeros");
        let tensors = [Some(&a), None, Some(&b), Some(&a_view), Some(&a), Some(&b)];
        // (same object as, storage class): `None` and first occurrences are themselves.
        assert_eq!(alias_classes(&tensors), vec![(0, 0), (1, 1), (2, 2), (3, 0), (0, 0), (2, 2)]);
    }

    #[test]
    fn call_sig_records_leafness_only_with_grad_on() {
        let leaf = Tensor::zeros(&[3], DType::F32).expect("zeros").requires_grad(true).expect("float");
        let view = leaf.view(&[3]).expect("view");
        let sig = call_sig(&[Arg::from(&view)]);
        let want = Leafness { is_leaf: false, base: Some((true, true)) };
        assert!(matches!(sig.args[0], ArgSig::Tensor { leafness: Some(l), .. } if l == want), "{sig:?}");
        let sig = aotgrad_trace::no_grad(|| call_sig(&[Arg::from(&view)]));
        assert!(matches!(sig.args[0], ArgSig::Tensor { leafness: None, .. }), "{sig:?}");
    }
}

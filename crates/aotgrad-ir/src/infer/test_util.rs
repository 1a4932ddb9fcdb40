//! Helpers for the inference unit tests: metas from literals, a recording oracle.

use crate::dtype::DType;
use crate::error::ShapeError;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::Op;
use crate::sym::{Dim, DimOracle, Guard, Rel, StaticOracle, SymId};

/// Constant dims.
pub(super) fn dims(v: &[i64]) -> Dims {
    v.iter().map(|&c| Dim::Const(c)).collect()
}

/// The symbol `s{i}` as a dim.
pub(super) fn s(i: u32) -> Dim {
    Dim::sym(SymId(i))
}

/// A contiguous meta.
pub(super) fn c(sizes: &[i64], dtype: DType) -> TensorMeta {
    TensorMeta::contiguous(dims(sizes), dtype)
}

/// A contiguous f32 meta.
pub(super) fn f(sizes: &[i64]) -> TensorMeta {
    c(sizes, DType::F32)
}

/// A strided meta.
pub(super) fn strided(sizes: &[i64], strides: &[i64], offset: i64, dtype: DType) -> TensorMeta {
    TensorMeta { shape: dims(sizes), strides: dims(strides), offset: Dim::Const(offset), dtype }
}

/// Infer with the static oracle.
pub(super) fn run(op: &Op, args: &[&TensorMeta]) -> Result<TensorMeta, ShapeError> {
    super::infer(op, args, &mut StaticOracle)
}

/// Infer, expecting success.
#[track_caller]
pub(super) fn ok(op: &Op, args: &[&TensorMeta]) -> TensorMeta {
    match run(op, args) {
        Ok(m) => m,
        Err(e) => panic!("{} failed: {e}", op.name()),
    }
}

/// Infer, expecting an error of `kind` whose message mentions every piece of `needles`.
#[track_caller]
pub(super) fn err(op: &Op, args: &[&TensorMeta], kind: &str, needles: &[&str]) -> ShapeError {
    match run(op, args) {
        Ok(m) => panic!("{} unexpectedly gave {m}", op.name()),
        Err(e) => {
            check_err(&e, kind, needles);
            e
        }
    }
}

/// Check an error's kind and that its message names every piece of `needles`.
#[track_caller]
pub(super) fn check_err(e: &ShapeError, kind: &str, needles: &[&str]) {
    assert_eq!(e.kind(), kind, "wrong kind for error: {e}");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
}

/// An oracle that answers from example values of the symbols and records a guard
/// for every decision it was asked.
pub(super) struct RecOracle {
    /// Example values.
    pub env: Vec<(SymId, i64)>,
    /// Guards, in the order the decisions were made.
    pub guards: Vec<Guard>,
}

impl RecOracle {
    /// An oracle with `s{i} = values[i]`.
    pub(super) fn new(values: &[i64]) -> RecOracle {
        RecOracle { env: values.iter().enumerate().map(|(i, &v)| (SymId(i as u32), v)).collect(), guards: Vec::new() }
    }
    /// The recorded guards as text.
    pub(super) fn guard_text(&self) -> Vec<String> {
        self.guards.iter().map(|g| g.to_string()).collect()
    }
}

impl DimOracle for RecOracle {
    fn decide(&mut self, lhs: &Dim, rel: Rel, rhs: &Dim) -> bool {
        let env = |s: SymId| self.env.iter().find(|(k, _)| *k == s).map(|(_, v)| *v);
        let holds = match (lhs.eval(&env), rhs.eval(&env)) {
            (Some(a), Some(b)) => rel.holds(a, b),
            _ => panic!("unbound symbol in {lhs} {} {rhs}", rel.as_str()),
        };
        self.guards.push(Guard::new(lhs.clone(), rel, rhs.clone(), holds));
        holds
    }
}

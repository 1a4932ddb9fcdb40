//! `ShapeEnv`: the shape symbols of one trace, their example values ("hints"), and the
//! guards recorded whenever tracing relied on a fact about them.
//!
//! Symbols stand for sizes of at least 2: sizes 0 and 1 are always specialized (they
//! change broadcasting and contiguity), exactly as PyTorch does. With duck sizing
//! (the default) dims whose example sizes are equal share one symbol.
//!
//! As a [`DimOracle`], the env answers every comparison. What holds for all symbol
//! values `>= 2` is answered without a guard; anything else is answered from the
//! hints and recorded as a [`Guard`] that a later call must satisfy.

use aotgrad_ir::{Dim, DimOracle, Guard, Rel, StaticOracle, SymId, TensorMeta};
use std::collections::{HashMap, HashSet};
use thiserror::Error;

/// Concrete inputs that do not satisfy what a trace assumed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GuardFailure {
    /// A recorded guard does not hold for the bound symbol values.
    #[error("guard `{guard}` failed: {values}")]
    Guard {
        /// The guard.
        guard: Guard,
        /// The values of the symbols it mentions (`s0 = 3, s1 = 4`).
        values: String,
    },
    /// A concrete input does not fit its traced metadata (rank, a specialized size, a
    /// symbol bound to two different sizes, or to 0 or 1).
    #[error("input {input}: {msg}")]
    Input {
        /// Input position.
        input: usize,
        /// What does not fit.
        msg: String,
    },
}

/// Symbols, hints and guards of one trace.
#[derive(Debug, Clone)]
pub struct ShapeEnv {
    hints: Vec<i64>,
    duck: bool,
    by_hint: HashMap<i64, SymId>,
    guards: Vec<Guard>,
    seen: HashSet<Guard>,
}

impl Default for ShapeEnv {
    fn default() -> Self {
        ShapeEnv::new(true)
    }
}

/// Lower and upper bound of a dim over all symbol values `>= 2` (`None`: unbounded or
/// unknown). Each symbol `s` is rewritten as `2 + t` with `t >= 0`; when every
/// non-constant coefficient of the result has one sign, the constant term is a bound.
/// (A rewrite whose coefficients overflow i64 gives no bound.)
fn bounds(d: &Dim) -> (Option<i64>, Option<i64>) {
    let Dim::Sym(p) = d else {
        let c = d.as_const();
        return (c, c);
    };
    let shift = || -> Option<Dim> {
        let mut shifted = Dim::Const(0);
        for (mono, c) in p.terms() {
            let mut t = Dim::Const(*c);
            for s in mono {
                t = t.checked_mul(&Dim::sym(*s).checked_add(&Dim::Const(2))?)?;
            }
            shifted = shifted.checked_add(&t)?;
        }
        Some(shifted)
    };
    let Some(shifted) = shift() else {
        return (None, None);
    };
    let q = match &shifted {
        Dim::Const(c) => return (Some(*c), Some(*c)),
        Dim::Sym(q) => q,
    };
    let mut constant = 0;
    let (mut nonneg, mut nonpos) = (true, true);
    for (mono, c) in q.terms() {
        if mono.is_empty() {
            constant = *c;
        } else {
            nonneg &= *c >= 0;
            nonpos &= *c <= 0;
        }
    }
    match (nonneg, nonpos) {
        (true, _) => (Some(constant), None),
        (_, true) => (None, Some(constant)),
        _ => (None, None),
    }
}

/// Decide `lhs rel rhs` if it holds (or fails) for every value of the symbols `>= 2`.
pub fn statically_known(lhs: &Dim, rel: Rel, rhs: &Dim) -> Option<bool> {
    if let (Dim::Const(a), Dim::Const(b)) = (lhs, rhs) {
        return Some(rel.holds(*a, *b));
    }
    // diff = rhs - lhs; the relation is about diff compared with 0 (unknown when the
    // difference overflows i64).
    let diff = rhs.checked_sub(lhs)?;
    let (lo, hi) = bounds(&diff);
    let gt0 = |v: Option<i64>| v.is_some_and(|v| v > 0);
    let ge0 = |v: Option<i64>| v.is_some_and(|v| v >= 0);
    let lt0 = |v: Option<i64>| v.is_some_and(|v| v < 0);
    let le0 = |v: Option<i64>| v.is_some_and(|v| v <= 0);
    let eq = if gt0(lo) || lt0(hi) {
        Some(false)
    } else if lo == Some(0) && hi == Some(0) {
        Some(true)
    } else {
        None
    };
    match rel {
        Rel::Eq => eq,
        Rel::Ne => eq.map(|b| !b),
        Rel::Lt => {
            if gt0(lo) {
                Some(true)
            } else if le0(hi) {
                Some(false)
            } else {
                None
            }
        }
        Rel::Le => {
            if ge0(lo) {
                Some(true)
            } else if lt0(hi) {
                Some(false)
            } else {
                None
            }
        }
    }
}

impl ShapeEnv {
    /// An empty env; `duck_shape` turns duck sizing on.
    pub fn new(duck_shape: bool) -> ShapeEnv {
        ShapeEnv {
            hints: Vec::new(),
            duck: duck_shape,
            by_hint: HashMap::new(),
            guards: Vec::new(),
            seen: HashSet::new(),
        }
    }
    /// Whether equal example sizes share one symbol.
    pub fn duck_shape(&self) -> bool {
        self.duck
    }
    /// A dim for a size whose example value is `hint`: the constant itself for 0 and 1
    /// (specialized), else a symbol (with duck sizing, the existing symbol of that hint).
    pub fn create_symbol(&mut self, hint: usize) -> Dim {
        let hint = hint as i64;
        if hint <= 1 {
            return Dim::Const(hint);
        }
        if self.duck {
            if let Some(s) = self.by_hint.get(&hint) {
                return Dim::sym(*s);
            }
        }
        let s = SymId(self.hints.len() as u32);
        self.hints.push(hint);
        self.by_hint.entry(hint).or_insert(s);
        Dim::sym(s)
    }
    /// Number of symbols created.
    pub fn num_symbols(&self) -> usize {
        self.hints.len()
    }
    /// The example value of a symbol.
    pub fn hint(&self, s: SymId) -> Option<i64> {
        self.hints.get(s.0 as usize).copied()
    }
    /// Every symbol with its example value.
    pub fn hints(&self) -> HashMap<SymId, i64> {
        self.hints.iter().enumerate().map(|(i, h)| (SymId(i as u32), *h)).collect()
    }
    /// A dim's value under the hints.
    pub fn evaluate(&self, d: &Dim) -> Option<i64> {
        d.eval(&|s| self.hint(s))
    }
    /// The guards recorded so far, in recording order, without duplicates.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }
    fn record(&mut self, g: Guard) {
        // Symmetric relations are stored with sorted sides, so `s1 == s0` dedupes with `s0 == s1`.
        let g = match g.rel {
            Rel::Eq | Rel::Ne if g.rhs < g.lhs => Guard { lhs: g.rhs, rel: g.rel, rhs: g.lhs },
            _ => g,
        };
        if self.seen.insert(g.clone()) {
            tracing::debug!(guard = %g, "recorded guard");
            self.guards.push(g);
        }
    }
    /// Check every guard under `bindings` (a value for each symbol).
    pub fn check(&self, bindings: &HashMap<SymId, i64>) -> Result<(), GuardFailure> {
        let env = |s: SymId| bindings.get(&s).copied();
        for g in &self.guards {
            if !g.check(&env) {
                let mut syms = g.lhs.symbols();
                syms.extend(g.rhs.symbols());
                syms.sort();
                syms.dedup();
                let values = syms
                    .iter()
                    .map(|s| match bindings.get(s) {
                        Some(v) => format!("{s} = {v}"),
                        None => format!("{s} unbound"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(GuardFailure::Guard { guard: g.clone(), values });
            }
        }
        Ok(())
    }
    /// Bind the symbols of the graph inputs' shapes to concrete sizes. Fails when a
    /// rank or specialized size differs, a symbol would take two values, or a symbol
    /// would be 0 or 1.
    pub fn bind_inputs(
        &self,
        input_metas: &[TensorMeta],
        concrete_shapes: &[Vec<usize>],
    ) -> Result<HashMap<SymId, i64>, GuardFailure> {
        if input_metas.len() != concrete_shapes.len() {
            return Err(GuardFailure::Input {
                input: input_metas.len().min(concrete_shapes.len()),
                msg: format!("expected {} inputs, got {}", input_metas.len(), concrete_shapes.len()),
            });
        }
        let mut b: HashMap<SymId, i64> = HashMap::new();
        for (i, (m, shape)) in input_metas.iter().zip(concrete_shapes).enumerate() {
            let fail = |msg: String| GuardFailure::Input { input: i, msg };
            if m.rank() != shape.len() {
                return Err(fail(format!("expected rank {}, got shape {shape:?}", m.rank())));
            }
            for (d, (dim, &size)) in m.shape.iter().zip(shape).enumerate() {
                let size = size as i64;
                match dim {
                    Dim::Const(c) if *c != size => {
                        return Err(fail(format!("dim {d} is {size}, but the trace specialized it to {c}")));
                    }
                    Dim::Const(_) => {}
                    _ => {
                        if let Some(s) = dim.as_single_sym() {
                            if size < 2 {
                                return Err(fail(format!(
                                    "dim {d} is {size}, but {s} stands for sizes >= 2 (0 and 1 are specialized)"
                                )));
                            }
                            match b.get(&s) {
                                Some(&v) if v != size => {
                                    return Err(fail(format!(
                                        "dim {d} is {size}, but {s} is already bound to {v} by an earlier dim"
                                    )));
                                }
                                _ => {
                                    b.insert(s, size);
                                }
                            }
                        }
                    }
                }
            }
        }
        // Dims that are expressions of the symbols must agree with the bound values.
        for (i, (m, shape)) in input_metas.iter().zip(concrete_shapes).enumerate() {
            for (d, (dim, &size)) in m.shape.iter().zip(shape).enumerate() {
                if dim.is_const() || dim.as_single_sym().is_some() {
                    continue;
                }
                match dim.eval(&|s| b.get(&s).copied()) {
                    Some(v) if v == size as i64 => {}
                    Some(v) => {
                        return Err(GuardFailure::Input {
                            input: i,
                            msg: format!("dim {d} is {size}, but the trace expects {dim} = {v}"),
                        })
                    }
                    None => {
                        return Err(GuardFailure::Input {
                            input: i,
                            msg: format!("dim {d} ({dim}) mentions a symbol no input dim binds"),
                        })
                    }
                }
            }
        }
        Ok(b)
    }
    /// [`ShapeEnv::bind_inputs`] followed by [`ShapeEnv::check`]; returns the bindings.
    pub fn check_inputs(
        &self,
        input_metas: &[TensorMeta],
        concrete_shapes: &[Vec<usize>],
    ) -> Result<HashMap<SymId, i64>, GuardFailure> {
        let b = self.bind_inputs(input_metas, concrete_shapes)?;
        self.check(&b)?;
        Ok(b)
    }
}

impl DimOracle for ShapeEnv {
    fn decide(&mut self, lhs: &Dim, rel: Rel, rhs: &Dim) -> bool {
        if let Some(b) = statically_known(lhs, rel, rhs) {
            return b;
        }
        match (self.evaluate(lhs), self.evaluate(rhs)) {
            (Some(a), Some(b)) => {
                let answer = rel.holds(a, b);
                self.record(Guard::new(lhs.clone(), rel, rhs.clone(), answer));
                answer
            }
            // A symbol this env does not know: only what holds for all values.
            _ => StaticOracle.decide(lhs, rel, rhs),
        }
    }
    fn specialize(&mut self, d: &Dim) -> Option<i64> {
        if let Some(c) = d.as_const() {
            return Some(c);
        }
        let v = self.evaluate(d)?;
        self.record(Guard::new(d.clone(), Rel::Eq, Dim::Const(v), true));
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aotgrad_ir::DType;

    #[test]
    fn duck_sizing_and_specialization() {
        let mut env = ShapeEnv::new(true);
        assert_eq!(env.create_symbol(0), Dim::Const(0));
        assert_eq!(env.create_symbol(1), Dim::Const(1));
        let a = env.create_symbol(4);
        let b = env.create_symbol(4);
        let c = env.create_symbol(5);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(env.num_symbols(), 2);
        let mut env = ShapeEnv::new(false);
        assert_ne!(env.create_symbol(4), env.create_symbol(4));
    }

    #[test]
    fn range_facts_record_no_guard() {
        let mut env = ShapeEnv::new(false);
        let s0 = env.create_symbol(4);
        let s1 = env.create_symbol(4);
        assert!(!env.decide(&s0, Rel::Eq, &Dim::Const(1)));
        assert!(env.decide(&Dim::Const(1), Rel::Lt, &s0));
        assert!(env.decide(&s0, Rel::Lt, &s0.mul(&s1)));
        assert!(env.guards().is_empty());
        assert!(env.decide(&s0, Rel::Eq, &s1));
        assert!(env.decide(&s1, Rel::Eq, &s0));
        assert!(!env.decide(&s0, Rel::Lt, &s1));
        let texts: Vec<String> = env.guards().iter().map(|g| g.to_string()).collect();
        assert_eq!(texts, vec!["s0 == s1", "s1 <= s0"]);
    }

    #[test]
    fn bind_and_check() {
        let mut env = ShapeEnv::new(false);
        let s0 = env.create_symbol(4);
        let s1 = env.create_symbol(4);
        env.decide(&s0, Rel::Eq, &s1);
        let metas = vec![
            TensorMeta::contiguous(vec![s0.clone(), Dim::Const(3)], DType::F32),
            TensorMeta::contiguous(vec![s1.clone()], DType::F32),
        ];
        let b = env.check_inputs(&metas, &[vec![7, 3], vec![7]]).unwrap();
        assert_eq!(b[&SymId(0)], 7);
        let err = env.check_inputs(&metas, &[vec![7, 3], vec![6]]).unwrap_err();
        assert_eq!(err.to_string(), "guard `s0 == s1` failed: s0 = 7, s1 = 6");
        let err = env.check_inputs(&metas, &[vec![7, 2], vec![7]]).unwrap_err();
        assert_eq!(err.to_string(), "input 0: dim 1 is 2, but the trace specialized it to 3");
        let err = env.check_inputs(&metas, &[vec![1, 3], vec![7]]).unwrap_err();
        assert!(err.to_string().contains("0 and 1 are specialized"), "{err}");
    }
}

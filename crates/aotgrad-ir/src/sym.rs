//! Dimensions that are concrete integers or polynomials over shape symbols, and guards.
//!
//! A symbolic dim is kept in a canonical sum-of-products form (integer coefficients,
//! monomials as sorted symbol lists), so structural equality is algebraic equality for
//! everything shape arithmetic produces (sums, products, exact quotients).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A shape symbol, printed `s0`, `s1`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SymId(pub u32);

impl fmt::Display for SymId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// A monomial: a sorted list of symbols (with repetition for powers).
pub type Monomial = Vec<SymId>;

#[cold]
fn overflow(what: &str, a: &Dim, b: &Dim) -> ! {
    panic!("Dim::{what}({a}, {b}) overflows i64 (a bug: values from user input use the checked_* forms)")
}

/// A polynomial with at least one non-constant term; terms sorted by monomial, no zero
/// coefficients. The constant term, if any, has the empty monomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Poly {
    terms: Vec<(Monomial, i64)>,
}

impl Poly {
    /// The `(monomial, coefficient)` terms in canonical order.
    pub fn terms(&self) -> &[(Monomial, i64)] {
        &self.terms
    }
}

/// One dimension (size, stride or offset): a constant or a symbolic polynomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dim {
    /// A known integer.
    Const(i64),
    /// A polynomial over shape symbols (never a constant).
    Sym(Arc<Poly>),
}

impl Default for Dim {
    fn default() -> Self {
        Dim::Const(0)
    }
}

impl From<i64> for Dim {
    fn from(v: i64) -> Self {
        Dim::Const(v)
    }
}
impl From<usize> for Dim {
    fn from(v: usize) -> Self {
        Dim::Const(v as i64)
    }
}
impl From<i32> for Dim {
    fn from(v: i32) -> Self {
        Dim::Const(v as i64)
    }
}
impl From<SymId> for Dim {
    fn from(s: SymId) -> Self {
        Dim::sym(s)
    }
}

fn to_map(d: &Dim) -> BTreeMap<Monomial, i64> {
    let mut m = BTreeMap::new();
    match d {
        Dim::Const(c) => {
            if *c != 0 {
                m.insert(Vec::new(), *c);
            }
        }
        Dim::Sym(p) => {
            for (k, v) in &p.terms {
                m.insert(k.clone(), *v);
            }
        }
    }
    m
}

fn from_map(m: BTreeMap<Monomial, i64>) -> Dim {
    let terms: Vec<(Monomial, i64)> = m.into_iter().filter(|(_, c)| *c != 0).collect();
    match terms.as_slice() {
        [] => Dim::Const(0),
        [(k, c)] if k.is_empty() => Dim::Const(*c),
        _ => Dim::Sym(Arc::new(Poly { terms })),
    }
}

impl Dim {
    /// The dim that is exactly one symbol.
    pub fn sym(s: SymId) -> Dim {
        Dim::Sym(Arc::new(Poly { terms: vec![(vec![s], 1)] }))
    }
    /// The constant value, if this dim is concrete.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(_) => None,
        }
    }
    /// True when the dim depends on no symbol.
    pub fn is_const(&self) -> bool {
        matches!(self, Dim::Const(_))
    }
    /// If the dim is exactly one symbol, that symbol.
    pub fn as_single_sym(&self) -> Option<SymId> {
        match self {
            Dim::Sym(p) => match p.terms.as_slice() {
                [(k, 1)] if k.len() == 1 => Some(k[0]),
                _ => None,
            },
            Dim::Const(_) => None,
        }
    }
    /// Every symbol the dim mentions.
    pub fn symbols(&self) -> Vec<SymId> {
        let mut v: Vec<SymId> = match self {
            Dim::Const(_) => vec![],
            Dim::Sym(p) => p.terms.iter().flat_map(|(k, _)| k.iter().copied()).collect(),
        };
        v.sort();
        v.dedup();
        v
    }
    /// `self + other`.
    ///
    /// Coefficients are `i64`s; an overflow is a bug in the caller and panics (in
    /// every build: never a silently wrapped size). Arithmetic on values that come from
    /// user input goes through the `checked_*` forms instead ([`Dim::checked_add`],
    /// [`Dim::checked_sub`], [`Dim::checked_mul`], [`Dim::checked_scale`]).
    pub fn add(&self, other: &Dim) -> Dim {
        self.checked_add(other).unwrap_or_else(|| overflow("add", self, other))
    }
    /// `self - other` (overflow as in [`Dim::add`]).
    pub fn sub(&self, other: &Dim) -> Dim {
        self.checked_sub(other).unwrap_or_else(|| overflow("sub", self, other))
    }
    /// `self * c` for an integer constant (overflow as in [`Dim::add`]).
    pub fn scale(&self, c: i64) -> Dim {
        self.checked_scale(c).unwrap_or_else(|| overflow("scale", self, &Dim::Const(c)))
    }
    /// `self * other` (overflow as in [`Dim::add`]).
    pub fn mul(&self, other: &Dim) -> Dim {
        self.checked_mul(other).unwrap_or_else(|| overflow("mul", self, other))
    }
    /// [`Dim::add`], or `None` when a coefficient overflows i64.
    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        if let (Dim::Const(a), Dim::Const(b)) = (self, other) {
            return a.checked_add(*b).map(Dim::Const);
        }
        let mut m = to_map(self);
        for (k, v) in to_map(other) {
            let e = m.entry(k).or_insert(0);
            *e = e.checked_add(v)?;
        }
        Some(from_map(m))
    }
    /// [`Dim::sub`], or `None` when a coefficient overflows i64.
    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        if let (Dim::Const(a), Dim::Const(b)) = (self, other) {
            return a.checked_sub(*b).map(Dim::Const);
        }
        self.checked_add(&other.checked_scale(-1)?)
    }
    /// [`Dim::scale`], or `None` when a coefficient overflows i64.
    pub fn checked_scale(&self, c: i64) -> Option<Dim> {
        match self {
            Dim::Const(a) => a.checked_mul(c).map(Dim::Const),
            Dim::Sym(_) => {
                let m = to_map(self).into_iter().map(|(k, v)| Some((k, v.checked_mul(c)?))).collect::<Option<_>>()?;
                Some(from_map(m))
            }
        }
    }
    /// [`Dim::product`], or `None` when a coefficient overflows i64.
    pub fn checked_product<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Option<Dim> {
        dims.into_iter().try_fold(Dim::Const(1), |acc, d| acc.checked_mul(d))
    }
    /// [`Dim::mul`], or `None` when a coefficient overflows i64.
    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        if let (Dim::Const(a), Dim::Const(b)) = (self, other) {
            return a.checked_mul(*b).map(Dim::Const);
        }
        let mut m: BTreeMap<Monomial, i64> = BTreeMap::new();
        for (ka, va) in to_map(self) {
            for (kb, vb) in to_map(other) {
                let mut k = ka.clone();
                k.extend(kb.iter().copied());
                k.sort();
                let e = m.entry(k).or_insert(0);
                *e = e.checked_add(va.checked_mul(vb)?)?;
            }
        }
        Some(from_map(m))
    }
    /// Exact quotient `self / other`, when `other` divides `self` as a polynomial
    /// (other being a constant or a single term); `None` otherwise (also when the
    /// quotient overflows i64: `i64::MIN / -1`).
    pub fn exact_div(&self, other: &Dim) -> Option<Dim> {
        match (self, other) {
            (_, Dim::Const(0)) => None,
            (Dim::Const(a), Dim::Const(b)) => {
                (a.checked_rem(*b)? == 0).then(|| a.checked_div(*b)).flatten().map(Dim::Const)
            }
            (_, _) => {
                let den = to_map(other);
                if den.len() != 1 {
                    return if self == other { Some(Dim::Const(1)) } else { None };
                }
                let (dk, dv) = den.into_iter().next()?;
                let mut out = BTreeMap::new();
                for (k, v) in to_map(self) {
                    if v.checked_rem(dv)? != 0 {
                        return None;
                    }
                    let mut rest = k.clone();
                    for s in &dk {
                        let pos = rest.iter().position(|x| x == s)?;
                        rest.remove(pos);
                    }
                    out.insert(rest, v.checked_div(dv)?);
                }
                Some(from_map(out))
            }
        }
    }
    /// Product of a list of dims (1 for an empty list).
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Dim {
        dims.into_iter().fold(Dim::Const(1), |acc, d| acc.mul(d))
    }
    /// Evaluate under a binding of symbols; `None` if a symbol is unbound.
    pub fn eval(&self, env: &dyn Fn(SymId) -> Option<i64>) -> Option<i64> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(p) => {
                let mut total = 0i64;
                for (k, c) in &p.terms {
                    let mut t = *c;
                    for s in k {
                        t = t.checked_mul(env(*s)?)?;
                    }
                    total = total.checked_add(t)?;
                }
                Some(total)
            }
        }
    }
    /// Replace bound symbols by their values, leaving unbound ones symbolic.
    ///
    /// When the substituted polynomial would overflow i64, the dim is returned
    /// unchanged (still symbolic), so callers that need a concrete result see a
    /// non-concrete one; see [`Dim::checked_subst`] to tell the two apart.
    pub fn subst(&self, env: &dyn Fn(SymId) -> Option<i64>) -> Dim {
        self.checked_subst(env).unwrap_or_else(|| self.clone())
    }
    /// [`Dim::subst`], or `None` when the result overflows i64.
    pub fn checked_subst(&self, env: &dyn Fn(SymId) -> Option<i64>) -> Option<Dim> {
        match self {
            Dim::Const(_) => Some(self.clone()),
            Dim::Sym(p) => {
                let mut acc = Dim::Const(0);
                for (k, c) in &p.terms {
                    let mut t = Dim::Const(*c);
                    for s in k {
                        let f = match env(*s) {
                            Some(v) => Dim::Const(v),
                            None => Dim::sym(*s),
                        };
                        t = t.checked_mul(&f)?;
                    }
                    acc = acc.checked_add(&t)?;
                }
                Some(acc)
            }
        }
    }
}

impl fmt::Display for Dim {
    /// Prints `3`, `s0`, `2*s0*s1 + s2 - 1`: terms in canonical order, constant last.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(c) => write!(f, "{c}"),
            Dim::Sym(p) => {
                // Constant term (empty monomial) sorts first in the map; print it last.
                let mut terms: Vec<&(Monomial, i64)> = p.terms.iter().filter(|t| !t.0.is_empty()).collect();
                terms.extend(p.terms.iter().filter(|t| t.0.is_empty()));
                for (i, (k, c)) in terms.iter().enumerate() {
                    let (neg, mag) = (*c < 0, c.unsigned_abs());
                    if i == 0 {
                        if neg {
                            f.write_str("-")?;
                        }
                    } else {
                        f.write_str(if neg { " - " } else { " + " })?;
                    }
                    if k.is_empty() {
                        write!(f, "{mag}")?;
                        continue;
                    }
                    if mag != 1 {
                        write!(f, "{mag}*")?;
                    }
                    for (j, s) in k.iter().enumerate() {
                        if j > 0 {
                            f.write_str("*")?;
                        }
                        write!(f, "{s}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// A comparison between two dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rel {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Rel {
    /// The operator as text.
    pub fn as_str(self) -> &'static str {
        match self {
            Rel::Eq => "==",
            Rel::Ne => "!=",
            Rel::Lt => "<",
            Rel::Le => "<=",
        }
    }
    /// Apply to two integers.
    pub fn holds(self, a: i64, b: i64) -> bool {
        match self {
            Rel::Eq => a == b,
            Rel::Ne => a != b,
            Rel::Lt => a < b,
            Rel::Le => a <= b,
        }
    }
    /// The relation that holds when this one does not.
    pub fn negate(self) -> (Rel, bool) {
        // returns (rel, swap operands)
        match self {
            Rel::Eq => (Rel::Ne, false),
            Rel::Ne => (Rel::Eq, false),
            Rel::Lt => (Rel::Le, true),
            Rel::Le => (Rel::Lt, true),
        }
    }
}

/// A fact about symbols that tracing relied on: `lhs rel rhs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Guard {
    /// Left side.
    pub lhs: Dim,
    /// The relation.
    pub rel: Rel,
    /// Right side.
    pub rhs: Dim,
}

impl Guard {
    /// Build `lhs rel rhs`, or its negation when `holds` is false.
    pub fn new(lhs: Dim, rel: Rel, rhs: Dim, holds: bool) -> Guard {
        if holds {
            Guard { lhs, rel, rhs }
        } else {
            let (r, swap) = rel.negate();
            if swap {
                Guard { lhs: rhs, rel: r, rhs: lhs }
            } else {
                Guard { lhs, rel: r, rhs }
            }
        }
    }
    /// Check the guard under concrete symbol values; an unbound symbol fails the guard.
    pub fn check(&self, env: &dyn Fn(SymId) -> Option<i64>) -> bool {
        match (self.lhs.eval(env), self.rhs.eval(env)) {
            (Some(a), Some(b)) => self.rel.holds(a, b),
            _ => false,
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.lhs, self.rel.as_str(), self.rhs)
    }
}

/// Decides comparisons between dims during shape inference. Implementations that know
/// example values for symbols answer from them and record a guard; see
/// [`StaticOracle`] for the symbol-free default.
pub trait DimOracle {
    /// Decide `lhs rel rhs`.
    fn decide(&mut self, lhs: &Dim, rel: Rel, rhs: &Dim) -> bool;
    /// The value of `d`, when the oracle can fix it (a trace knows its example sizes):
    /// the result then holds only under the guard `d == value`, which the oracle
    /// records. Inference asks for it only where a symbolic answer cannot be
    /// expressed (a `-1` in a view that a polynomial does not divide, such as
    /// `[s0] -> [-1, 2]`), as PyTorch specializes a size it cannot reason about.
    /// The default fixes nothing.
    fn specialize(&mut self, d: &Dim) -> Option<i64> {
        d.as_const()
    }
}

/// An oracle that decides only what holds for every value of the symbols: constant
/// differences, and structural equality. Anything else is answered `false`
/// for `Eq`/`Lt`/`Le` and `true` for `Ne` (the conservative "not provably equal").
#[derive(Default, Debug, Clone, Copy)]
pub struct StaticOracle;

impl DimOracle for StaticOracle {
    fn decide(&mut self, lhs: &Dim, rel: Rel, rhs: &Dim) -> bool {
        if let (Dim::Const(a), Dim::Const(b)) = (lhs, rhs) {
            return rel.holds(*a, *b);
        }
        match rhs.checked_sub(lhs) {
            // rhs - lhs = d
            Some(Dim::Const(d)) => rel.holds(0, d),
            // Symbolic, or a difference whose coefficients overflow: not provable.
            Some(Dim::Sym(_)) | None => rel == Rel::Ne,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomial_arithmetic_is_canonical() {
        let s0 = Dim::sym(SymId(0));
        let s1 = Dim::sym(SymId(1));
        let a = s0.mul(&s1).add(&s0.scale(3)).add(&Dim::Const(2));
        let b = Dim::Const(2).add(&s0.scale(3)).add(&s1.mul(&s0));
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "3*s0 + s0*s1 + 2");
        assert_eq!(a.sub(&a), Dim::Const(0));
        assert_eq!(s0.mul(&s1).scale(4).exact_div(&s1.scale(2)), Some(s0.scale(2)));
        assert_eq!(s0.add(&Dim::Const(1)).exact_div(&s0), None);
        let env = |s: SymId| Some(if s.0 == 0 { 5 } else { 7 });
        assert_eq!(a.eval(&env), Some(15 + 35 + 2));
        assert_eq!(s0.sub(&Dim::Const(1)).scale(-1).to_string(), "-s0 + 1");
    }

    #[test]
    fn checked_arithmetic_reports_overflow() {
        let s0 = Dim::sym(SymId(0));
        let max = Dim::Const(i64::MAX);
        assert_eq!(max.checked_sub(&Dim::Const(-1)), None);
        assert_eq!(Dim::Const(i64::MIN).checked_scale(-1), None);
        assert_eq!(s0.scale(i64::MAX).checked_scale(2), None);
        assert_eq!(s0.checked_scale(-3), Some(s0.scale(-3)));
        assert_eq!(s0.checked_sub(&s0.scale(i64::MIN)), None);
        assert_eq!(s0.checked_sub(&Dim::Const(1)), Some(s0.sub(&Dim::Const(1))));
        assert_eq!(Dim::checked_product(&[max.clone(), Dim::Const(2)]), None);
        assert_eq!(Dim::checked_product(&[s0.clone(), Dim::Const(2)]), Some(s0.scale(2)));
        // i64::MIN / -1 does not exist.
        assert_eq!(Dim::Const(i64::MIN).exact_div(&Dim::Const(-1)), None);
        assert_eq!(s0.scale(i64::MIN).exact_div(&Dim::Const(-1)), None);
        // Substituting a value that overflows leaves the dim symbolic.
        let sq = s0.mul(&s0);
        let big = |_| Some(1i64 << 40);
        assert_eq!(sq.checked_subst(&big), None);
        assert_eq!(sq.subst(&big), sq);
        assert_eq!(sq.subst(&|_| Some(3)), Dim::Const(9));
        // The static oracle compares constants directly and gives up on overflowing
        // differences ("not provably equal").
        let mut o = StaticOracle;
        assert!(o.decide(&Dim::Const(i64::MIN), Rel::Lt, &max));
        assert!(!o.decide(&s0.scale(i64::MIN), Rel::Eq, &s0.scale(i64::MAX)));
        assert!(o.decide(&s0.scale(i64::MIN), Rel::Ne, &s0.scale(i64::MAX)));
    }

    #[test]
    fn guards_check_and_negate() {
        let s0 = Dim::sym(SymId(0));
        let g = Guard::new(s0.clone(), Rel::Lt, Dim::Const(4), false);
        assert_eq!(g.to_string(), "4 <= s0");
        assert!(g.check(&|_| Some(4)));
        assert!(!g.check(&|_| Some(3)));
        assert!(!g.check(&|_| None));
    }
}

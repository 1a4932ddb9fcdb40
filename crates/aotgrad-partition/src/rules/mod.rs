//! Rewrite rules of the simplifier, grouped by theme.
//!
//! - [`cse`]: common-subexpression elimination (free from hash-consing) and removal of
//!   redundant copies (`clone`, `copy`);
//! - [`algebra`]: identities (`x*1`, `x+0`, `x-0`, `x/1`, `neg(neg x)`, `log(exp x)`,
//!   `exp(log x)` for non-negative `x`, integer `x*0`, casts that round-trip) and the
//!   sum/mean of an expand;
//! - [`views`]: identity views (alias elimination), and chains of two views collapsed
//!   into one (view of view, transpose/permute of a permute, expand of an expand).
//!
//! A rule is a match function over one e-node: it proposes [`Candidate`]s, each a list
//! of alternative right-hand sides in order of preference. The applier takes the first
//! alternative whose metadata, derived with shape inference from the metadata of the
//! e-classes it uses, equals the matched e-class's metadata exactly (shape, strides,
//! offset and dtype); a candidate with no such alternative does not fire. Every
//! right-hand side is at most as expensive as what it replaces under the extraction
//! cost ([`crate::cost`]), so rules never make the extracted graph more expensive.
//!
//! Rules never touch random ops or composites (those are only ever merged by
//! hash-consing, i.e. when identical, seed and offset included).

pub(crate) mod algebra;
pub(crate) mod cse;
pub(crate) mod views;

use crate::simplify::lang::{ENode, MetaAnalysis, OpKey, EG};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{DType, Op, StaticOracle, TensorMeta};
use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};

/// A right-hand side: an existing e-class, or an op over right-hand sides.
#[derive(Clone, Debug)]
pub(crate) enum Rhs {
    /// An existing e-class.
    Class(Id),
    /// A new op application.
    Node(Op, Vec<Rhs>),
}

impl Rhs {
    /// `op(args...)` over existing classes.
    pub(crate) fn op(op: Op, args: &[Id]) -> Rhs {
        Rhs::Node(op, args.iter().map(|a| Rhs::Class(*a)).collect())
    }
}

/// Alternative right-hand sides for one match, most preferred first.
pub(crate) type Candidate = Vec<Rhs>;

/// A match function: given the e-graph, the matched e-class and one of its e-nodes,
/// push the candidates this rule proposes.
pub(crate) type MatchFn = fn(&EG, Id, &ENode, &mut Vec<Candidate>);

/// A named rule.
pub(crate) struct Rule {
    name: &'static str,
    find: MatchFn,
}

impl Rule {
    pub(crate) const fn new(name: &'static str, find: MatchFn) -> Rule {
        Rule { name, find }
    }
    fn candidates(&self, eg: &EG, class: Id) -> Vec<Candidate> {
        let mut out = Vec::new();
        for node in &eg[class].nodes {
            (self.find)(eg, class, node, &mut out);
        }
        out
    }
}

impl Searcher<ENode, MetaAnalysis> for Rule {
    fn search_eclass_with_limit(&self, eg: &EG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, ENode>> {
        if limit == 0 || self.candidates(eg, eclass).is_empty() {
            return None;
        }
        Some(SearchMatches { eclass, substs: vec![Subst::default()], ast: None })
    }
    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl Applier<ENode, MetaAnalysis> for Rule {
    fn apply_one(
        &self,
        eg: &mut EG,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<ENode>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let class = eg.find(eclass);
        let mut changed = Vec::new();
        for alts in self.candidates(eg, class) {
            for rhs in alts {
                let Some(meta) = rhs_meta(eg, &rhs) else { continue };
                let class = eg.find(class);
                if meta != *eg[class].data {
                    continue;
                }
                let id = add_rhs(eg, &rhs);
                if eg.union(class, id) {
                    changed.push(class);
                }
                break;
            }
        }
        changed
    }
}

/// The metadata `rhs` would have, or `None` if shape inference rejects it.
fn rhs_meta(eg: &EG, rhs: &Rhs) -> Option<TensorMeta> {
    match rhs {
        Rhs::Class(id) => Some((*eg[*id].data).clone()),
        Rhs::Node(op, args) => {
            let metas = args.iter().map(|a| rhs_meta(eg, a)).collect::<Option<Vec<_>>>()?;
            let refs: Vec<&TensorMeta> = metas.iter().collect();
            infer(op, &refs, &mut StaticOracle).ok()
        }
    }
}

/// Add `rhs` (already checked by [`rhs_meta`]) to the e-graph; returns its class.
fn add_rhs(eg: &mut EG, rhs: &Rhs) -> Id {
    match rhs {
        Rhs::Class(id) => *id,
        Rhs::Node(op, args) => {
            let ids: Vec<Id> = args.iter().map(|a| add_rhs(eg, a)).collect();
            let meta = rhs_meta(eg, &Rhs::op(op.clone(), &ids));
            eg.analysis.pending = meta;
            let id = eg.add(ENode::Op(OpKey::new(op.clone()), ids));
            eg.analysis.pending = None;
            id
        }
    }
}

/// The metadata of an e-class.
pub(crate) fn meta(eg: &EG, id: Id) -> &TensorMeta {
    &eg[id].data
}

/// The op e-nodes of a class, as `(op, args)`.
pub(crate) fn ops_of(eg: &EG, id: Id) -> impl Iterator<Item = (&Op, &[Id])> {
    eg[id].nodes.iter().filter_map(|n| n.op().map(|op| (op, n.args())))
}

/// Ways to produce "the value of `x`" for a class of dtype `dtype`: `x` itself, a
/// contiguous copy of it, or it converted to `dtype` (the applier keeps the first whose
/// metadata is the class's).
pub(crate) fn same_value(x: Id, dtype: DType) -> Candidate {
    vec![Rhs::Class(x), Rhs::op(Op::Clone, &[x]), Rhs::op(Op::Cast(dtype), &[x])]
}

/// Every rule, as egg rewrites (egg rejects a rule only for unbound pattern variables,
/// which these rules do not have: an error here is a bug).
pub(crate) fn all_rules() -> Result<Vec<Rewrite<ENode, MetaAnalysis>>, String> {
    let rules = cse::RULES.iter().chain(algebra::RULES).chain(views::RULES);
    rules.map(|r| Rewrite::new(r.name, Rule::new(r.name, r.find), Rule::new(r.name, r.find))).collect()
}

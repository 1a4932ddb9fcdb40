//! Common-subexpression elimination and redundant copies.
//!
//! CSE itself needs no rule: the e-graph hash-conses e-nodes, so two nodes with the same
//! op (parameters included) over the same argument classes are one e-node from the
//! start, and congruence closure extends this to everything the other rules prove
//! equal. Random ops are only merged when identical (same seed and offset give the
//! same values, so that is sound).
//!
//! The rules here remove copies the functional graph does not need:
//! - `clone(x) -> x` when the clone's metadata is `x`'s (in a functional graph nobody
//!   writes to either, so the copy is unobservable);
//! - `copy(dst, src) -> src` (or a contiguous copy or a cast of `src`) when that has the
//!   result's metadata: the result does not depend on `dst`'s values.

use super::{meta, same_value, Candidate, Rhs, Rule};
use crate::simplify::lang::{ENode, EG};
use aotgrad_ir::Op;
use egg::Id;

/// The rules of this theme.
pub(crate) static RULES: &[Rule] = &[Rule::new("clone-elim", clone_elim), Rule::new("copy-elim", copy_elim)];

fn clone_elim(_eg: &EG, _class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    if let (Some(Op::Clone), [x]) = (node.op(), node.args()) {
        out.push(vec![Rhs::Class(*x)]);
    }
}

fn copy_elim(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    if let (Some(Op::Copy), [_dst, src]) = (node.op(), node.args()) {
        out.push(same_value(*src, meta(eg, class).dtype));
    }
}

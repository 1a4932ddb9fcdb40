//! View rewrites.
//!
//! Two views with the same base value and the same metadata (shape, strides, storage
//! offset) read the same elements, so a view can be replaced by any other view of the
//! same base whose inferred metadata is identical; the applier's metadata check is the
//! whole soundness argument. Rules:
//! - `view-identity`: a view whose metadata equals its argument's is the argument
//!   (alias elimination, identity `permute`/`view`/`expand`/full `slice`);
//! - `view-chain`: two stacked views `v2(v1(x))` become `x`, or one view of `x`:
//!   composed `permute` (for any mix of `permute`, `transpose`, `t`), `expand(x, shape)`
//!   for an expand of an expand, or `view(x, shape)` (view of view, squeeze of
//!   unsqueeze, ...).
//!
//! "Expand then sum" (the sum of an expand) lives with the algebra rules
//! ([`super::algebra`]), since it scales the sum.

use super::{meta, ops_of, Candidate, Rhs, Rule};
use crate::simplify::lang::{ENode, EG};
use aotgrad_ir::Op;
use egg::Id;

/// The rules of this theme.
pub(crate) static RULES: &[Rule] = &[Rule::new("view-identity", view_identity), Rule::new("view-chain", view_chain)];

fn view_identity(_eg: &EG, _class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    if let (Some(op), [x]) = (node.op(), node.args()) {
        if op.is_view() {
            out.push(vec![Rhs::Class(*x)]);
        }
    }
}

/// The dim permutation a view op applies to a tensor of rank `rank`, if it is one.
fn as_permutation(op: &Op, rank: usize) -> Option<Vec<usize>> {
    match op {
        Op::Permute(p) => Some(p.clone()),
        Op::Transpose(a, b) if *a < rank && *b < rank => {
            let mut p: Vec<usize> = (0..rank).collect();
            p.swap(*a, *b);
            Some(p)
        }
        Op::T if rank == 2 => Some(vec![1, 0]),
        Op::T if rank < 2 => Some((0..rank).collect()),
        _ => None,
    }
}

fn view_chain(eg: &EG, class: Id, node: &ENode, out: &mut Vec<Candidate>) {
    let (Some(outer), [y]) = (node.op(), node.args()) else { return };
    if !outer.is_view() {
        return;
    }
    let m = meta(eg, class);
    for (inner, args) in ops_of(eg, *y) {
        let [x] = args else { continue };
        if !inner.is_view() {
            continue;
        }
        let mut alts = vec![Rhs::Class(*x)];
        let p1 = as_permutation(inner, meta(eg, *x).rank());
        let p2 = as_permutation(outer, meta(eg, *y).rank());
        if let (Some(p1), Some(p2)) = (p1, p2) {
            if p2.iter().all(|&j| j < p1.len()) {
                alts.push(Rhs::op(Op::Permute(p2.iter().map(|&j| p1[j]).collect()), &[*x]));
            }
        }
        if let (Op::Expand(_), Op::Expand(shape)) = (inner, outer) {
            alts.push(Rhs::op(Op::Expand(shape.clone()), &[*x]));
        }
        alts.push(Rhs::op(Op::View(m.shape.clone()), &[*x]));
        out.push(alts);
    }
}

//! Planning the graph inputs before the pass runs: which traced inputs share a
//! storage, and which of those groups must become one *synthetic base* input.
//!
//! A group of inputs over one storage gets a synthetic base (one 1-D, contiguous
//! graph input covering every element the program can reach in that storage, of
//! which each member is regenerated as an `as_strided` view) when
//! - two members overlap and the storage is written (a write through one must be
//!   seen by the other: the exact overlap test of `aotgrad-meta` decides);
//! - several members share the storage and one is viewed with `as_strided`
//!   (storage-absolute, it may read any member's elements);
//! - `as_strided` views reach elements outside the single member, or the member is
//!   not row-major (`as_strided` offsets are only meaningful on a row-major root);
//! - a write goes through an `expand` view of a member that is not row-major (such
//!   writes are scattered back with `as_strided_scatter`, which needs a row-major
//!   root);
//! - the storage is written and a member repeats elements (an expanded input: a
//!   write through a view of it must reach every repetition).

use crate::{FunctionalizeError, Result};
use aotgrad_ir::{Aliasing, Graph, Op, SourceLoc, StorageId, TensorMeta, ValueId};
use aotgrad_meta::convention::{covering_range, needs_synthetic_base};
use aotgrad_meta::Layout;
use std::collections::{HashMap, HashSet};

/// The `as_strided` op of a view or `as_strided_` node.
pub(crate) fn as_strided_of(op: &Op) -> Option<&Op> {
    match op {
        Op::AsStrided { .. } => Some(op),
        Op::MetaInPlace(inner) if matches!(**inner, Op::AsStrided { .. }) => Some(inner),
        _ => None,
    }
}

/// One storage shared by traced inputs.
pub(crate) struct Group {
    /// Traced inputs in this storage, in order.
    pub members: Vec<usize>,
    /// `Some((offset, len))`: merge the members into a synthetic base covering
    /// storage elements `offset..offset+len`.
    pub base: Option<(usize, usize)>,
}

/// What the program does to each traced storage.
#[derive(Default)]
struct Usage {
    written: HashSet<StorageId>,
    /// Layouts of `as_strided` views per storage (`None`: symbolic).
    strided: HashMap<StorageId, Vec<Option<Layout>>>,
    /// Where the first `as_strided` view of each storage was taken.
    strided_loc: HashMap<StorageId, Option<SourceLoc>>,
    /// Storages written through an `expand` view.
    expand_writes: HashSet<StorageId>,
}

fn usage(traced: &Graph) -> Usage {
    let mut u = Usage::default();
    let mut through_expand: HashSet<ValueId> = HashSet::new();
    for n in &traced.nodes {
        let from_expand = n.args.first().is_some_and(|a| through_expand.contains(a));
        match n.op.aliasing() {
            Aliasing::View | Aliasing::MutatesMeta => {
                let fresh_view = as_strided_of(&n.op).is_some();
                if matches!(n.op, Op::Expand(_)) || (from_expand && !fresh_view) {
                    through_expand.insert(n.out);
                }
            }
            Aliasing::MutatesData => {
                u.written.insert(n.storage);
                if from_expand {
                    u.expand_writes.insert(n.storage);
                    through_expand.insert(n.out);
                }
            }
            Aliasing::Fresh => {}
        }
        if as_strided_of(&n.op).is_some() {
            u.strided.entry(n.storage).or_default().push(Layout::of(&n.meta));
            u.strided_loc.entry(n.storage).or_insert_with(|| n.loc.clone());
        }
    }
    u
}

/// Group the traced inputs by storage and decide which groups need a synthetic base.
pub(crate) fn plan(traced: &Graph) -> Result<Vec<Group>> {
    let u = usage(traced);
    // Storages in order of first appearance.
    let mut by_storage: Vec<(StorageId, Vec<usize>)> = Vec::new();
    let mut slot_of: HashMap<StorageId, usize> = HashMap::new();
    for (i, inp) in traced.inputs.iter().enumerate() {
        let slot = *slot_of.entry(inp.storage).or_insert_with(|| {
            by_storage.push((inp.storage, Vec::new()));
            by_storage.len() - 1
        });
        by_storage[slot].1.push(i);
    }
    let mut groups = Vec::with_capacity(by_storage.len());
    for (storage, members) in by_storage {
        let metas: Vec<&TensorMeta> = members.iter().map(|&i| &traced.inputs[i].meta).collect();
        let layouts: Option<Vec<Layout>> = metas.iter().map(|m| Layout::of(m)).collect();
        let strided: &[Option<Layout>] = u.strided.get(&storage).map_or(&[], Vec::as_slice);
        let all_row_major = metas.iter().all(|m| m.is_contiguous());
        let self_overlapping = u.written.contains(&storage)
            && match &layouts {
                Some(ls) => ls.iter().any(Layout::may_repeat),
                None => !all_row_major,
            };
        let need = if members.len() > 1 {
            let overlapping_write = u.written.contains(&storage)
                && match &layouts {
                    Some(ls) => needs_synthetic_base(ls, &vec![true; ls.len()]),
                    None => true,
                };
            overlapping_write
                || self_overlapping
                || !strided.is_empty()
                || (u.expand_writes.contains(&storage) && !all_row_major)
        } else {
            // An address overflow counts as reaching outside (the base then reports it).
            let outside = match (layouts.as_ref().map(|l| l[0].range()), strided.is_empty()) {
                (_, true) => false,
                (Some(Ok(Some((lo, hi)))), false) => strided
                    .iter()
                    .flatten()
                    .any(|s| s.range().map_or(true, |r| r.is_some_and(|(a, b)| a < lo || b > hi))),
                (Some(Err(_)), false) => true,
                (Some(Ok(None)) | None, false) => false,
            };
            self_overlapping
                || (!strided.is_empty() && (!all_row_major || outside))
                || (u.expand_writes.contains(&storage) && !all_row_major)
        };
        let base = if need {
            let Some(mut ls) = layouts else {
                return Err(FunctionalizeError::Unsupported {
                    op: "input".into(),
                    loc: None,
                    msg: format!(
                        "inputs {members:?} need a synthetic base (they alias one storage and are written, or are \
                         viewed with as_strided), but their shapes are symbolic; a synthetic base needs concrete \
                         layouts (mark fewer dims dynamic)"
                    ),
                });
            };
            ls.extend(strided.iter().flatten().cloned());
            let range = covering_range(&ls).map_err(|e| FunctionalizeError::Unsupported {
                op: "as_strided".into(),
                loc: u.strided_loc.get(&storage).cloned().flatten(),
                msg: format!(
                    "inputs {members:?} need a synthetic base covering every storage element the program reaches, \
                     but {e}"
                ),
            })?;
            Some(range)
        } else {
            None
        };
        groups.push(Group { members, base });
    }
    Ok(groups)
}

//! The calling convention: how the user's arguments become graph inputs.
//!
//! Three rewrites happen between what the user passes and what the graph takes:
//! - **dedupe**: the same tensor object passed twice is traced as one input;
//! - **synthetic base**: tensors that share a storage, overlap, and of which one is
//!   mutated are merged into one input — a 1-D view of the storage range they cover —
//!   and each is regenerated inside the graph as a view of it, so a write through one
//!   is seen by the others exactly as in eager mode;
//! - non-tensor arguments are specialized into the trace (they are part of the
//!   compiled function's cache key) and take no graph input.

use crate::overlap::{overlap, Layout, Overlap};
use serde::{Deserialize, Serialize};

/// Where one user argument goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArgSlot {
    /// Graph input `0`.
    Input(usize),
    /// The same tensor object as user argument `0`; no graph input of its own.
    Duplicate(usize),
    /// Merged into synthetic base `base` (an index into [`CallingConvention::bases`]).
    ViewOfBase {
        /// The synthetic base.
        base: usize,
    },
    /// A non-tensor argument, specialized into the graph.
    Constant,
}

/// A graph input that stands for a storage range shared by several user arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyntheticBase {
    /// Its graph input index.
    pub input: usize,
    /// The user arguments it replaces.
    pub members: Vec<usize>,
    /// First storage element covered.
    pub offset: usize,
    /// Number of storage elements covered (the base is 1-D and contiguous).
    pub len: usize,
}

/// The mapping from user arguments to graph inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallingConvention {
    /// One slot per user argument.
    pub args: Vec<ArgSlot>,
    /// The synthetic bases.
    pub bases: Vec<SyntheticBase>,
    /// Number of graph inputs.
    pub num_graph_inputs: usize,
}

/// Decide whether a group of layouts over one storage needs a synthetic base: some
/// member is mutated and overlaps another member. `Unknown` counts as overlapping.
pub fn needs_synthetic_base(layouts: &[Layout], mutated: &[bool]) -> bool {
    for i in 0..layouts.len() {
        for j in (i + 1)..layouts.len() {
            if (mutated[i] || mutated[j]) && overlap(&layouts[i], &layouts[j]) != Overlap::No {
                return true;
            }
        }
    }
    false
}

/// The storage range `(offset, len)` covered by a set of layouts (empty layouts ignored;
/// `(0, 0)` if all are empty).
pub fn covering_range(layouts: &[Layout]) -> (usize, usize) {
    let ranges: Vec<(usize, usize)> = layouts.iter().filter_map(Layout::range).collect();
    match (ranges.iter().map(|r| r.0).min(), ranges.iter().map(|r| r.1).max()) {
        (Some(lo), Some(hi)) => (lo, hi - lo + 1),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_base_only_for_mutated_overlap() {
        let x = Layout::new(vec![2, 3], vec![3, 1], 0);
        let flat = Layout::new(vec![6], vec![1], 0);
        assert!(needs_synthetic_base(&[x.clone(), flat.clone()], &[true, false]));
        assert!(!needs_synthetic_base(&[x.clone(), flat], &[false, false]));
        let even = Layout::new(vec![3], vec![2], 0);
        let odd = Layout::new(vec![3], vec![2], 1);
        assert!(!needs_synthetic_base(&[even.clone(), odd.clone()], &[true, true]));
        assert_eq!(covering_range(&[even, odd]), (0, 6));
    }
}

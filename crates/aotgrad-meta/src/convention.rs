//! The calling convention: how the traced inputs become graph inputs.
//!
//! [`CallingConvention::args`] is indexed by *traced input*, not by user argument: the
//! runtime (`aotgrad`'s `runtime` module) folds the user's arguments into traced inputs
//! before tracing — the same tensor object passed twice is traced once (*dedupe*),
//! and non-tensor arguments are specialized into the trace (part of the compiled
//! entry's key) with no traced input — and keeps that map itself. What this crate
//! describes is the one rewrite functionalization makes between traced inputs and graph
//! inputs:
//! - **synthetic base**: traced inputs that share a storage, overlap, and of which one
//!   is mutated (or that `as_strided` views address storage-absolutely, or that repeat
//!   elements and are written) are merged into one graph input — a 1-D view of the
//!   storage range they cover — and each is regenerated inside the graph as a view of
//!   it, so a write through one is seen by the others exactly as in eager mode. A
//!   single traced input can get a synthetic base of its own, too (an `as_strided`
//!   view reaching outside it, or of it when it is not row-major).

use crate::overlap::{overlap, AddressOverflow, Layout, Overlap};
use aotgrad_ir::{DType, Dim, TensorMeta};
use serde::{Deserialize, Serialize};

/// Where one traced input goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArgSlot {
    /// Graph input `0`.
    Input(usize),
    /// Merged into synthetic base `base` (an index into [`CallingConvention::bases`]).
    ViewOfBase {
        /// The synthetic base.
        base: usize,
    },
}

/// A graph input that stands for a storage range shared by one or more traced inputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyntheticBase {
    /// Its graph input index.
    pub input: usize,
    /// The traced inputs it replaces.
    pub members: Vec<usize>,
    /// First storage element covered.
    pub offset: usize,
    /// Number of storage elements covered (the base is 1-D and contiguous).
    pub len: usize,
}

impl SyntheticBase {
    /// The base's metadata: `[len]`, stride 1, at storage offset `offset`.
    pub fn meta(&self, dtype: DType) -> TensorMeta {
        TensorMeta {
            shape: aotgrad_ir::dims![Dim::from(self.len)],
            strides: aotgrad_ir::dims![Dim::Const(1)],
            offset: Dim::from(self.offset),
            dtype,
        }
    }
}

/// The mapping from traced inputs to graph inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallingConvention {
    /// One slot per traced input.
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
/// `(0, 0)` if all are empty); an error when an address, or the length, overflows
/// `usize`.
pub fn covering_range(layouts: &[Layout]) -> Result<(usize, usize), AddressOverflow> {
    let mut cover: Option<(usize, usize)> = None;
    for l in layouts {
        if let Some((a, b)) = l.range()? {
            cover = Some(match cover {
                None => (a, b),
                Some((lo, hi)) => (lo.min(a), hi.max(b)),
            });
        }
    }
    match cover {
        Some((lo, hi)) => Ok((lo, (hi - lo).checked_add(1).ok_or(AddressOverflow)?)),
        None => Ok((0, 0)),
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
        assert_eq!(covering_range(&[even, odd]), Ok((0, 6)));
        assert_eq!(covering_range(&[Layout::new(vec![0], vec![1], 3)]), Ok((0, 0)));
    }

    #[test]
    fn covering_range_overflow_is_an_error() {
        let huge = Layout::new(vec![2], vec![usize::MAX], 1);
        assert_eq!(covering_range(&[huge]), Err(AddressOverflow));
        // The addresses fit, their count does not.
        let all = Layout::new(vec![2], vec![usize::MAX], 0);
        assert_eq!(covering_range(&[all]), Err(AddressOverflow));
    }

    #[test]
    fn synthetic_base_meta_is_a_flat_window() {
        let b = SyntheticBase { input: 0, members: vec![0, 1], offset: 2, len: 5 };
        let m = b.meta(DType::F32);
        assert_eq!(m.shape, aotgrad_ir::dims![Dim::Const(5)]);
        assert_eq!(m.strides, aotgrad_ir::dims![Dim::Const(1)]);
        assert_eq!(m.offset, Dim::Const(2));
        assert_eq!(m.dtype, DType::F32);
    }
}

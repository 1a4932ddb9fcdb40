//! Exact overlap test for two strided layouts over one storage.
//!
//! A layout is `offset + sum(i_k * stride_k)` for `0 <= i_k < size_k`. Two layouts
//! overlap when some storage index is reachable from both. The answer must never be a
//! false "disjoint" (that would corrupt data); a false "overlap" only costs a synthetic
//! base, so past the enumeration budget (or when a layout's addresses overflow
//! `usize`, as a user `as_strided` with huge strides can make them) the test answers
//! [`Overlap::Unknown`], which callers treat as overlapping. Every address computation
//! is checked: [`Layout::range`] reports an overflow as [`AddressOverflow`].
//!
//! The test, cheapest first: empty layouts; disjoint index ranges; a residue argument
//! (every index of a layout is `offset` modulo the gcd of its strides); then exact
//! membership: a layout whose dims nest (sorted by stride, each stride exceeds the
//! span of all smaller ones) decides membership of one index greedily in
//! `O(rank)`, so the smaller layout is enumerated against it; when neither nests, both
//! are enumerated, sorted and merged. [`Layout::may_repeat`] asks the same of one
//! layout: whether two of its indices name one storage element.

use aotgrad_ir::{Dim, TensorMeta};
use thiserror::Error;

/// A concrete strided layout: sizes, strides and offset in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Size of each dim.
    pub sizes: Vec<usize>,
    /// Stride of each dim.
    pub strides: Vec<usize>,
    /// Storage offset.
    pub offset: usize,
}

/// Result of the overlap test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// Some storage index is shared.
    Yes,
    /// No storage index is shared (proved).
    No,
    /// Too large to decide exactly within the budget (or the addresses overflow
    /// `usize`); treat as [`Overlap::Yes`].
    Unknown,
}

/// The storage addresses of a layout do not fit in `usize` (a user `as_strided` with
/// huge strides or offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("storage addresses overflow the address range (huge sizes, strides or offset)")]
pub struct AddressOverflow;

/// How many element addresses the exact test may enumerate.
pub const ENUMERATION_BUDGET: usize = 1 << 22;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn concrete(dims: &[Dim]) -> Option<Vec<usize>> {
    dims.iter().map(|d| d.as_const().and_then(|v| usize::try_from(v).ok())).collect()
}

impl Layout {
    /// Build a layout (sizes and strides must have equal length).
    pub fn new(sizes: Vec<usize>, strides: Vec<usize>, offset: usize) -> Layout {
        Layout { sizes, strides, offset }
    }
    /// The layout of concrete metadata (`None` when a dim is symbolic or negative).
    pub fn of(meta: &TensorMeta) -> Option<Layout> {
        let offset = meta.offset.as_const().and_then(|v| usize::try_from(v).ok())?;
        Some(Layout::new(concrete(&meta.shape)?, concrete(&meta.strides)?, offset))
    }
    /// Number of elements (`None` when it overflows `usize`).
    pub fn numel(&self) -> Option<usize> {
        self.sizes.iter().try_fold(1usize, |n, &s| n.checked_mul(s))
    }
    /// Dims that matter: size > 1 and stride > 0 (size-1 dims add nothing, stride-0
    /// dims repeat addresses).
    fn live_dims(&self) -> Vec<(usize, usize)> {
        let mut d: Vec<(usize, usize)> = self
            .sizes
            .iter()
            .zip(&self.strides)
            .filter(|(s, st)| **s > 1 && **st > 0)
            .map(|(s, st)| (*s, *st))
            .collect();
        d.sort_by_key(|&(_, st)| st);
        d
    }
    /// Smallest and largest index touched (`Ok(None)` when empty); an error when the
    /// largest does not fit in `usize`.
    pub fn range(&self) -> Result<Option<(usize, usize)>, AddressOverflow> {
        if self.sizes.contains(&0) {
            return Ok(None);
        }
        let mut hi = self.offset;
        for (s, st) in self.sizes.iter().zip(&self.strides) {
            hi = (s - 1).checked_mul(*st).and_then(|d| hi.checked_add(d)).ok_or(AddressOverflow)?;
        }
        Ok(Some((self.offset, hi)))
    }
    /// True when, sorted by stride, every stride is larger than the span of the smaller
    /// dims: then each index has at most one coordinate and membership is greedy.
    /// (False when the span overflows `usize`.)
    fn nests(&self) -> bool {
        let mut span = 0usize;
        for (s, st) in self.live_dims() {
            if st <= span {
                return false;
            }
            match (s - 1).checked_mul(st).and_then(|d| span.checked_add(d)) {
                Some(next) => span = next,
                None => return false,
            }
        }
        true
    }
    /// Whether two different indices of the layout may name one storage element: a
    /// stride-0 dim of size > 1, or dims that do not nest and, enumerated, do repeat an
    /// address. Exact up to [`ENUMERATION_BUDGET`] elements; past it, or when the
    /// addresses overflow `usize`, the answer is a conservative `true`. An empty layout
    /// repeats nothing.
    pub fn may_repeat(&self) -> bool {
        if self.sizes.contains(&0) {
            return false;
        }
        if self.sizes.iter().zip(&self.strides).any(|(&s, &st)| s > 1 && st == 0) {
            return true;
        }
        if self.range().is_err() {
            return true;
        }
        if self.nests() {
            return false;
        }
        if self.live_numel() > ENUMERATION_BUDGET {
            return true;
        }
        let mut a = self.addresses();
        a.sort_unstable();
        a.windows(2).any(|w| w[0] == w[1])
    }
    /// Exact membership for a nesting layout.
    fn contains_nested(&self, x: usize) -> bool {
        if x < self.offset {
            return false;
        }
        let mut rem = x - self.offset;
        for (s, st) in self.live_dims().into_iter().rev() {
            let i = (rem / st).min(s - 1);
            rem -= i * st;
        }
        rem == 0
    }
    /// Every index, in iteration order (duplicates possible for non-nesting dims).
    /// Callers check [`Layout::range`] first, so no address overflows.
    fn addresses(&self) -> Vec<usize> {
        let dims = self.live_dims();
        let mut out = vec![self.offset];
        for (s, st) in dims {
            let mut next = Vec::with_capacity(out.len() * s);
            for i in 0..s {
                next.extend(out.iter().map(|a| a + i * st));
            }
            out = next;
        }
        out
    }
    /// Number of elements over the live dims (saturating).
    fn live_numel(&self) -> usize {
        self.live_dims().iter().fold(1usize, |n, (s, _)| n.saturating_mul(*s))
    }
}

/// Decide whether two layouts over one storage share an element.
pub fn overlap(a: &Layout, b: &Layout) -> Overlap {
    let ((a0, a1), (b0, b1)) = match (a.range(), b.range()) {
        (Ok(None), _) | (_, Ok(None)) => return Overlap::No,
        (Ok(Some(ra)), Ok(Some(rb))) => (ra, rb),
        // Addresses past `usize`: no exact answer (and no enumeration).
        _ => return Overlap::Unknown,
    };
    if a1 < b0 || b1 < a0 {
        return Overlap::No;
    }
    let ga = a.live_dims().iter().fold(0, |g, &(_, st)| gcd(g, st));
    let gb = b.live_dims().iter().fold(0, |g, &(_, st)| gcd(g, st));
    let g = gcd(ga, gb);
    if g > 1 && !a.offset.abs_diff(b.offset).is_multiple_of(g) {
        return Overlap::No;
    }
    let (na, nb) = (a.live_numel(), b.live_numel());
    // Enumerate the smaller side against a nesting other side.
    let order = if na <= nb { [(a, b), (b, a)] } else { [(b, a), (a, b)] };
    for (small, big) in order {
        if big.nests() && small.live_numel() <= ENUMERATION_BUDGET {
            let hit = small.addresses().into_iter().any(|x| big.contains_nested(x));
            return if hit { Overlap::Yes } else { Overlap::No };
        }
    }
    if na.saturating_add(nb) > ENUMERATION_BUDGET {
        return Overlap::Unknown;
    }
    let mut xa = a.addresses();
    let mut xb = b.addresses();
    xa.sort_unstable();
    xb.sort_unstable();
    let (mut i, mut j) = (0, 0);
    while i < xa.len() && j < xb.len() {
        match xa[i].cmp(&xb[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return Overlap::Yes,
        }
    }
    Overlap::No
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute(a: &Layout, b: &Layout) -> bool {
        let xa: std::collections::HashSet<usize> = a.addresses().into_iter().collect();
        if a.sizes.contains(&0) || b.sizes.contains(&0) {
            return false;
        }
        b.addresses().into_iter().any(|x| xa.contains(&x))
    }

    #[test]
    fn hand_checked_cases() {
        // even and odd elements of a 1-D storage: disjoint
        let even = Layout::new(vec![4], vec![2], 0);
        let odd = Layout::new(vec![4], vec![2], 1);
        assert_eq!(overlap(&even, &odd), Overlap::No);
        // rows 0..2 and rows 2..4 of a 4x4
        let top = Layout::new(vec![2, 4], vec![4, 1], 0);
        let bottom = Layout::new(vec![2, 4], vec![4, 1], 8);
        assert_eq!(overlap(&top, &bottom), Overlap::No);
        // a column and a row of a 4x4 share one element
        let col = Layout::new(vec![4], vec![4], 1);
        let row = Layout::new(vec![4], vec![1], 4);
        assert_eq!(overlap(&col, &row), Overlap::Yes);
        // column 0 and column 1: interleaved ranges, disjoint
        let c0 = Layout::new(vec![4], vec![4], 0);
        let c1 = Layout::new(vec![4], vec![4], 1);
        assert_eq!(overlap(&c0, &c1), Overlap::No);
        // a non-nesting layout (strides 3 and 2 over sizes 3, 3) vs a point it reaches
        let weird = Layout::new(vec![3, 3], vec![3, 2], 0); // reaches 0,2,3,4,5,6,7,8,10
        assert_eq!(overlap(&weird, &Layout::new(vec![1], vec![1], 1)), Overlap::No);
        assert_eq!(overlap(&weird, &Layout::new(vec![1], vec![1], 7)), Overlap::Yes);
        // empty never overlaps
        assert_eq!(overlap(&Layout::new(vec![0, 3], vec![3, 1], 0), &row), Overlap::No);
    }

    /// Huge user strides: every address computation is checked, and the answers are
    /// conservative instead of a panic (or, in release builds, a wrapped address).
    #[test]
    fn address_overflow_is_unknown_not_a_panic() {
        let huge = Layout::new(vec![3, 3], vec![usize::MAX / 2 + 1, 1], 5);
        assert_eq!(huge.range(), Err(AddressOverflow));
        let small = Layout::new(vec![4], vec![1], 0);
        assert_eq!(overlap(&huge, &small), Overlap::Unknown);
        assert_eq!(overlap(&small, &huge), Overlap::Unknown);
        assert!(huge.may_repeat());
        // An empty layout stays empty, whatever its strides.
        let empty = Layout::new(vec![0, 2], vec![1, usize::MAX], usize::MAX);
        assert_eq!(empty.range(), Ok(None));
        assert_eq!(overlap(&empty, &huge), Overlap::No);
        assert!(!empty.may_repeat());
        // Large but representable: exact answers.
        let wide = Layout::new(vec![2], vec![usize::MAX - 1], 0);
        assert_eq!(wide.range(), Ok(Some((0, usize::MAX - 1))));
        assert_eq!(overlap(&wide, &Layout::new(vec![1], vec![1], usize::MAX - 1)), Overlap::Yes);
        assert_eq!(overlap(&wide, &Layout::new(vec![2], vec![1], 1)), Overlap::No);
        assert!(!wide.may_repeat());
        assert_eq!(Layout::new(vec![usize::MAX, 3], vec![1, 1], 0).numel(), None);
    }

    #[test]
    fn repeats_hand_checked() {
        // expanded: stride 0
        assert!(Layout::new(vec![3, 2], vec![0, 1], 0).may_repeat());
        // size-1 dim with stride 0 repeats nothing
        assert!(!Layout::new(vec![1, 2], vec![0, 1], 0).may_repeat());
        // transposed: nests
        assert!(!Layout::new(vec![3, 2], vec![1, 3], 0).may_repeat());
        // overlapping windows: strides 1 and 2 over sizes 3, 2 name 2 twice
        assert!(Layout::new(vec![3, 2], vec![1, 2], 0).may_repeat());
        // does not nest, yet names nine distinct elements
        assert!(!Layout::new(vec![3, 3], vec![3, 2], 0).may_repeat());
    }

    /// Every storage index of a layout, stride-0 dims included.
    fn all_addresses(l: &Layout) -> Vec<usize> {
        let mut out = vec![l.offset];
        for (&s, &st) in l.sizes.iter().zip(&l.strides) {
            out = (0..s).flat_map(|i| out.iter().map(move |a| a + i * st)).collect();
        }
        out
    }

    fn layout() -> impl Strategy<Value = Layout> {
        (1usize..4).prop_flat_map(|rank| {
            (proptest::collection::vec(0usize..5, rank), proptest::collection::vec(0usize..7, rank), 0usize..12)
                .prop_map(|(s, st, o)| Layout::new(s, st, o))
        })
    }

    proptest! {
        #[test]
        fn agrees_with_brute_force(a in layout(), b in layout()) {
            let want = brute(&a, &b);
            let got = overlap(&a, &b);
            prop_assert_eq!(got, if want { Overlap::Yes } else { Overlap::No }, "a={:?} b={:?}", a, b);
        }

        #[test]
        fn repeats_agree_with_brute_force(a in layout()) {
            let mut xs = all_addresses(&a);
            let n = xs.len();
            xs.sort_unstable();
            xs.dedup();
            prop_assert_eq!(a.may_repeat(), xs.len() != n, "a={:?}", a);
        }
    }
}

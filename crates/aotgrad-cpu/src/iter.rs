//! Strided iteration: concrete layouts (shape, strides, offset) and a fast odometer
//! that visits storage offsets in row-major logical order.
//!
//! The odometer first drops size-1 dims and merges neighbouring dims that are
//! contiguous with each other, so a contiguous tensor becomes a single flat loop and
//! most strided tensors become a short outer odometer around a tight inner loop; no
//! per-element division or modulo is ever done.

use crate::{CpuError, Result};
use aotgrad_ir::TensorMeta;

/// A concrete strided layout, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Size of each dim.
    pub shape: Vec<usize>,
    /// Stride of each dim (0 for broadcast dims).
    pub strides: Vec<usize>,
    /// Storage offset of element `[0, 0, ...]`.
    pub offset: usize,
}

impl Layout {
    /// The layout of a concrete meta; symbolic or negative entries are internal errors
    /// (a `CpuTensor` always carries concrete, non-negative metadata).
    pub fn from_meta(meta: &TensorMeta) -> Result<Layout> {
        let conv = |d: &aotgrad_ir::Dim, what: &str| -> Result<usize> {
            match d.as_const() {
                Some(v) if v >= 0 => Ok(v as usize),
                _ => {
                    Err(CpuError::Internal(format!("tensor metadata {meta} has a non-concrete or negative {what} {d}")))
                }
            }
        };
        let shape = meta.shape.iter().map(|d| conv(d, "size")).collect::<Result<Vec<_>>>()?;
        let strides = meta.strides.iter().map(|d| conv(d, "stride")).collect::<Result<Vec<_>>>()?;
        if shape.len() != strides.len() {
            return Err(CpuError::Internal(format!(
                "tensor metadata {meta} has {} sizes but {} strides",
                shape.len(),
                strides.len()
            )));
        }
        Ok(Layout { shape, strides, offset: conv(&meta.offset, "offset")? })
    }

    /// A contiguous row-major layout at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        let mut strides = vec![1; shape.len()];
        let mut acc = 1usize;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i].max(1);
        }
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// Number of elements (saturating, so absurd layouts fail their checks instead).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |acc, &s| acc.saturating_mul(s))
    }

    /// One past the largest storage index touched (`offset` when empty).
    pub fn extent(&self) -> usize {
        if self.shape.contains(&0) {
            return self.offset;
        }
        // Saturating: an absurd user-given layout must fail `check_fits`, not overflow.
        let last = self
            .shape
            .iter()
            .zip(&self.strides)
            .fold(0usize, |acc, (s, st)| acc.saturating_add((s - 1).saturating_mul(*st)));
        self.offset.saturating_add(last).saturating_add(1)
    }

    /// Fails with a kernel error when the layout reaches past a storage of `len` elements.
    pub fn check_fits(&self, op: &str, len: usize) -> Result<()> {
        if self.numel() > 0 && self.extent() > len {
            return Err(CpuError::kernel(
                op,
                format!(
                    "a view with sizes {:?}, strides {:?} and offset {} needs {} storage elements, but the storage has {len}",
                    self.shape,
                    self.strides,
                    self.offset,
                    self.extent()
                ),
            ));
        }
        Ok(())
    }

    /// The same elements seen with shape `shape` (right-aligned broadcasting: missing
    /// leading dims and size-1 dims get stride 0).
    pub fn broadcast_to(&self, op: &str, shape: &[usize]) -> Result<Layout> {
        if self.shape.len() > shape.len() {
            return Err(broadcast_error(op, &self.shape, shape));
        }
        let lead = shape.len() - self.shape.len();
        let mut strides = vec![0; shape.len()];
        for (i, &want) in shape.iter().enumerate().skip(lead) {
            let (have, st) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if have == want {
                st
            } else if have == 1 {
                0
            } else {
                return Err(broadcast_error(op, &self.shape, shape));
            };
        }
        Ok(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }

    /// Shape and strides with size-1 dims dropped and mergeable neighbours merged.
    fn collapsed(&self) -> (Vec<usize>, Vec<usize>) {
        let mut shape: Vec<usize> = Vec::with_capacity(self.shape.len());
        let mut strides: Vec<usize> = Vec::with_capacity(self.shape.len());
        for (&s, &st) in self.shape.iter().zip(&self.strides) {
            if s == 1 {
                continue;
            }
            if let (Some(ls), Some(lst)) = (shape.last_mut(), strides.last_mut()) {
                if st.checked_mul(s) == Some(*lst) {
                    *ls *= s;
                    *lst = st;
                    continue;
                }
            }
            shape.push(s);
            strides.push(st);
        }
        (shape, strides)
    }

    /// Call `f` with the storage offset of every element, in row-major logical order.
    #[inline]
    pub fn for_each_offset(&self, mut f: impl FnMut(usize)) {
        if self.shape.contains(&0) {
            return;
        }
        let (shape, strides) = self.collapsed();
        let nd = shape.len();
        if nd == 0 {
            f(self.offset);
            return;
        }
        let (n, s) = (shape[nd - 1], strides[nd - 1]);
        if nd == 1 {
            if s == 1 {
                (self.offset..self.offset + n).for_each(f);
            } else {
                let mut o = self.offset;
                for _ in 0..n {
                    f(o);
                    o += s;
                }
            }
            return;
        }
        let outer = nd - 1;
        let mut idx = vec![0usize; outer];
        let mut base = self.offset;
        loop {
            let mut o = base;
            for _ in 0..n {
                f(o);
                o += s;
            }
            // Advance the outer odometer.
            let mut d = outer;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                base += strides[d];
                if idx[d] < shape[d] {
                    break;
                }
                base -= strides[d] * shape[d];
                idx[d] = 0;
            }
        }
    }

    /// Call `f(start, len, stride)` for every innermost run of elements, in row-major
    /// logical order: the run's elements are at `start + i * stride` for `i < len`.
    /// Kernels copy a run with stride 1 as a slice (vectorized), not element by element.
    #[inline]
    pub fn for_each_run(&self, mut f: impl FnMut(usize, usize, usize)) {
        if self.shape.contains(&0) {
            return;
        }
        let (shape, strides) = self.collapsed();
        let nd = shape.len();
        if nd == 0 {
            f(self.offset, 1, 1);
            return;
        }
        let (n, s) = (shape[nd - 1], strides[nd - 1]);
        let outer = nd - 1;
        let mut idx = vec![0usize; outer];
        let mut base = self.offset;
        loop {
            f(base, n, s);
            let mut d = outer;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                base += strides[d];
                if idx[d] < shape[d] {
                    break;
                }
                base -= strides[d] * shape[d];
                idx[d] = 0;
            }
        }
    }

    /// All storage offsets, in row-major logical order.
    #[cfg(test)]
    pub fn offsets(&self) -> Vec<usize> {
        let mut v = Vec::with_capacity(self.numel());
        self.for_each_offset(|o| v.push(o));
        v
    }
}

/// Call `f` with every multi-index of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn broadcast_error(op: &str, from: &[usize], to: &[usize]) -> CpuError {
    CpuError::kernel(op, format!("cannot broadcast a tensor of shape {from:?} to shape {to:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(l: &Layout) -> Vec<usize> {
        let mut v = Vec::new();
        for_each_index(&l.shape, |ix| {
            v.push(l.offset + ix.iter().zip(&l.strides).map(|(i, s)| i * s).sum::<usize>());
        });
        v
    }

    #[test]
    fn odometer_matches_naive_indexing() {
        let cases = [
            Layout { shape: vec![2, 3, 4], strides: vec![12, 4, 1], offset: 0 },
            Layout { shape: vec![3, 2], strides: vec![1, 3], offset: 5 },
            Layout { shape: vec![2, 1, 3], strides: vec![0, 7, 2], offset: 1 },
            Layout { shape: vec![4, 2, 2], strides: vec![8, 2, 1], offset: 3 },
            Layout { shape: vec![], strides: vec![], offset: 9 },
            Layout { shape: vec![2, 0, 3], strides: vec![3, 3, 1], offset: 0 },
            Layout { shape: vec![2, 2, 2, 2], strides: vec![1, 2, 4, 8], offset: 0 },
        ];
        for l in cases {
            assert_eq!(l.offsets(), naive(&l), "{l:?}");
            let mut runs = Vec::new();
            l.for_each_run(|o, n, s| runs.extend((0..n).map(|i| o + i * s)));
            assert_eq!(runs, naive(&l), "runs of {l:?}");
        }
    }

    #[test]
    fn broadcast_and_extent() {
        let l = Layout { shape: vec![3, 1], strides: vec![1, 1], offset: 2 };
        let b = l.broadcast_to("add", &[2, 3, 4]).unwrap();
        assert_eq!(b.strides, vec![0, 1, 0]);
        assert!(l.broadcast_to("add", &[3, 2]).is_ok());
        assert!(l.broadcast_to("add", &[2, 2]).is_err());
        assert_eq!(l.extent(), 5);
        assert!(l.check_fits("view", 4).is_err());
        assert_eq!(Layout::contiguous(&[2, 0, 3]).strides, vec![3, 3, 1]);
    }
}

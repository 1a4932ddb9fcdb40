//! `TensorMeta`: everything about a tensor except its data.

use crate::dtype::DType;
use crate::sym::{Dim, SymId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A list of sizes or strides: up to four dims inline (no heap allocation), more on
/// the heap. Every [`TensorMeta`] holds two, so keeping them inline saves two
/// allocations per value in every stage of the compiler and in every decoded artifact.
/// It dereferences to `[Dim]`; serialized, it is a sequence (as a `Vec` would be), or
/// with [`compact_dims`](crate::codec::compact_dims) a compact byte string in the binary
/// codec.
pub type Dims = smallvec::SmallVec<[Dim; 4]>;

/// Shape, strides (in elements), storage offset (in elements) and dtype of a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorMeta {
    /// Size of each dimension.
    #[serde(with = "crate::codec::compact_dims")]
    pub shape: Dims,
    /// Step in elements between neighbours along each dimension.
    #[serde(with = "crate::codec::compact_dims")]
    pub strides: Dims,
    /// Position of element `[0, 0, ...]` in the storage, in elements.
    pub offset: Dim,
    /// Element type.
    pub dtype: DType,
}

/// Row-major (C-contiguous) strides for a shape; size-0/1 dims follow PyTorch
/// (the stride of a dim is the product of the later sizes, each at least 1).
///
/// For shapes a trace made (whose strides fit, as its tensors exist); a shape read from
/// anywhere else goes through [`checked_contiguous_strides`].
pub fn contiguous_strides(shape: &[Dim]) -> Dims {
    checked_contiguous_strides(shape).unwrap_or_else(|| {
        panic!(
            "the contiguous strides of {} overflow i64 (a bug: shapes from input use the checked form)",
            DimList(shape)
        )
    })
}

/// [`contiguous_strides`], or `None` when a stride overflows i64 (a shape with a size
/// near `i64::MAX`, or with a zero size beside huge ones: its strides are products of
/// the later sizes, each taken as at least 1).
pub fn checked_contiguous_strides(shape: &[Dim]) -> Option<Dims> {
    let mut strides: Dims = smallvec::smallvec![Dim::Const(1); shape.len()];
    let mut acc = Dim::Const(1);
    for i in (0..shape.len()).rev() {
        strides[i] = acc.clone();
        if i == 0 {
            break;
        }
        acc = match &shape[i] {
            Dim::Const(c) => acc.checked_mul(&Dim::Const((*c).max(1)))?,
            d => acc.checked_mul(d)?,
        };
    }
    Some(strides)
}

impl TensorMeta {
    /// A contiguous tensor at offset 0.
    pub fn contiguous(shape: impl Into<Dims>, dtype: DType) -> TensorMeta {
        let shape: Dims = shape.into();
        let strides = contiguous_strides(&shape);
        TensorMeta { shape, strides, offset: Dim::Const(0), dtype }
    }
    /// A contiguous tensor with a concrete shape.
    pub fn from_sizes(sizes: &[usize], dtype: DType) -> TensorMeta {
        TensorMeta::contiguous(sizes.iter().map(|&s| Dim::from(s)).collect::<Dims>(), dtype)
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> Dim {
        Dim::product(&self.shape)
    }
    /// True when the strides are the row-major ones for the shape (dims of size 1 may
    /// have any stride, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        let Some(want) = checked_contiguous_strides(&self.shape) else {
            // Strides that overflow describe no tensor but an empty one.
            return self.shape.contains(&Dim::Const(0));
        };
        self.shape.iter().zip(self.strides.iter().zip(&want)).all(|(s, (a, b))| *s == Dim::Const(1) || a == b)
            || self.shape.contains(&Dim::Const(0))
    }
    /// Concrete sizes, if no dim is symbolic (negative sizes never occur).
    pub fn concrete_shape(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(|d| d.as_const().map(|v| v as usize)).collect()
    }
    /// Concrete strides, if none is symbolic.
    pub fn concrete_strides(&self) -> Option<Vec<usize>> {
        self.strides.iter().map(|d| d.as_const().map(|v| v as usize)).collect()
    }
    /// Concrete offset, if not symbolic.
    pub fn concrete_offset(&self) -> Option<usize> {
        self.offset.as_const().map(|v| v as usize)
    }
    /// True if no size, stride or offset is symbolic.
    pub fn is_concrete(&self) -> bool {
        self.shape.iter().chain(&self.strides).all(Dim::is_const) && self.offset.is_const()
    }
    /// Every symbol mentioned.
    pub fn symbols(&self) -> Vec<SymId> {
        let mut v: Vec<SymId> = self
            .shape
            .iter()
            .chain(&self.strides)
            .chain(std::iter::once(&self.offset))
            .flat_map(|d| d.symbols())
            .collect();
        v.sort();
        v.dedup();
        v
    }
    /// Substitute symbol values (see [`Dim::subst`]).
    pub fn subst(&self, env: &dyn Fn(SymId) -> Option<i64>) -> TensorMeta {
        TensorMeta {
            shape: self.shape.iter().map(|d| d.subst(env)).collect(),
            strides: self.strides.iter().map(|d| d.subst(env)).collect(),
            offset: self.offset.subst(env),
            dtype: self.dtype,
        }
    }
    /// The same tensor made contiguous (what `clone` produces).
    pub fn to_contiguous(&self) -> TensorMeta {
        TensorMeta::contiguous(self.shape.clone(), self.dtype)
    }
    /// Index one past the last storage element this tensor can touch (concrete only):
    /// `offset + sum((size-1)*stride) + 1`, or `offset` for an empty tensor. `None`
    /// when a dim is symbolic or negative, or the extent overflows `usize`.
    pub fn storage_extent(&self) -> Option<usize> {
        let conc = |d: &Dim| d.as_const().and_then(|v| usize::try_from(v).ok());
        let shape: Vec<usize> = self.shape.iter().map(conc).collect::<Option<_>>()?;
        let strides: Vec<usize> = self.strides.iter().map(conc).collect::<Option<_>>()?;
        let off = conc(&self.offset)?;
        if shape.len() != strides.len() {
            return None;
        }
        if shape.contains(&0) {
            return Some(off);
        }
        let reach =
            shape.iter().zip(&strides).try_fold(0usize, |acc, (s, st)| acc.checked_add((s - 1).checked_mul(*st)?))?;
        off.checked_add(reach)?.checked_add(1)
    }
}

/// Prints a list of dims as `[a, b, c]`.
pub struct DimList<'a>(pub &'a [Dim]);

impl fmt::Display for DimList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for TensorMeta {
    /// `f32[4, 3]` for contiguous tensors at offset 0, else
    /// `f32[4, 3] strides=[1, 4] offset=2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, DimList(&self.shape))?;
        // (A forged or parsed shape may have no contiguous strides that fit: then the
        // strides are printed.)
        if checked_contiguous_strides(&self.shape).is_none_or(|c| self.strides != c) {
            write!(f, " strides={}", DimList(&self.strides))?;
        }
        if self.offset != Dim::Const(0) {
            write!(f, " offset={}", self.offset)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_whose_strides_overflow_print_and_compare_without_panicking() {
        // Sizes near i64::MAX come from parsed programs and forged files; their
        // contiguous strides do not fit, and printing them is what an error does.
        for (shape, fits) in
            [(vec![i64::MAX, 3], true), (vec![3, i64::MAX, 2], false), (vec![0, i64::MAX / 2, 4], false)]
        {
            let shape: Dims = shape.into_iter().map(Dim::Const).collect();
            let m =
                TensorMeta { strides: shape.clone(), shape: shape.clone(), offset: Dim::Const(0), dtype: DType::F32 };
            assert_eq!(checked_contiguous_strides(&shape).is_some(), fits);
            assert!(m.to_string().contains("strides="), "{m}");
            assert_eq!(m.is_contiguous(), m.shape.contains(&Dim::Const(0)));
        }
        // The first size never enters a stride.
        let strides = checked_contiguous_strides(&[Dim::Const(i64::MAX), Dim::Const(3)]).unwrap();
        assert_eq!(strides.as_slice(), &[Dim::Const(3), Dim::Const(1)]);
    }

    #[test]
    fn contiguous_strides_and_display() {
        let m = TensorMeta::from_sizes(&[2, 3, 4], DType::F32);
        assert_eq!(m.concrete_strides().unwrap(), vec![12, 4, 1]);
        assert!(m.is_contiguous());
        assert_eq!(m.to_string(), "f32[2, 3, 4]");
        let t = TensorMeta {
            shape: crate::dims![3.into(), 2.into()],
            strides: crate::dims![1.into(), 3.into()],
            offset: 1.into(),
            dtype: DType::I64,
        };
        assert!(!t.is_contiguous());
        assert_eq!(t.to_string(), "i64[3, 2] strides=[1, 3] offset=1");
        assert_eq!(t.storage_extent(), Some(1 + 2 + 3 + 1));
    }

    #[test]
    fn storage_extent_is_none_on_overflow_or_negative_dims() {
        let m = |shape: &[i64], strides: &[i64], offset: i64| TensorMeta {
            shape: shape.iter().map(|&d| Dim::Const(d)).collect(),
            strides: strides.iter().map(|&d| Dim::Const(d)).collect(),
            offset: Dim::Const(offset),
            dtype: DType::F32,
        };
        // 2 * (2^63 - 1) + (2^63 - 1) + 1 > usize::MAX (on any target).
        assert_eq!(m(&[3], &[i64::MAX], i64::MAX).storage_extent(), None);
        assert_eq!(m(&[1], &[i64::MAX], 5).storage_extent(), Some(6));
        assert_eq!(m(&[0, 4], &[i64::MAX, 1], 5).storage_extent(), Some(5));
        assert_eq!(m(&[2], &[-1], 5).storage_extent(), None);
        assert_eq!(m(&[2], &[1], -1).storage_extent(), None);
    }
}

/// How autograd sees a tensor made by a view op, beyond its `requires_grad` flag:
/// what PyTorch keeps as a view's `CreationMeta`, recorded for a traced output so a
/// runtime that regenerates it as a view gives it the rules eager's view has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ViewCreation {
    /// Made under no-grad (of any tensor), or a view of such a view: an in-place op
    /// on it with an operand requiring grad, in grad mode, is refused.
    pub created_no_grad: bool,
    /// Output `i` of a function returning several views (`split`, `chunk`,
    /// `unbind`) made in grad mode, or a view of one: (the creating op as PyTorch
    /// names its backward node, less `Backward0`; `i`).
    pub multi_output: Option<(String, usize)>,
    /// The op that made the view, as PyTorch names its backward node less
    /// `Backward0` (`View`, `T`): the name PyTorch's errors about it give.
    pub node: String,
    /// An autograd leaf (`requires_grad_()` on a view of a tensor that does not
    /// require grad, a view taken under no-grad).
    pub leaf: bool,
    /// Such a view (no-grad or multi-output) whose storage was modified in place
    /// after it was made: autograd refuses to use it in grad mode.
    pub stale: bool,
    /// A view for autograd (it has a base).
    pub view: bool,
    /// Which of the call's outputs share its autograd base: the same number for
    /// outputs viewing one base object (a regenerated `detach`ed base is made once
    /// for them all, so writing one moves the others' flags as in eager).
    pub base_group: Option<usize>,
    /// Its base requires grad as a leaf (`requires_grad_()` on a `detach`ed alias
    /// made in the function): in-place ops on the view are refused, as on any view
    /// of a leaf requiring grad.
    pub base_leaf: bool,
    /// Its autograd base is output `k` of the same call (a `detach`ed alias returned
    /// beside views of it): it is regenerated as a view of that output.
    pub base_output: Option<usize>,
    /// A view made in grad mode (PyTorch's differentiable view): its `requires_grad`
    /// follows its base's, so it requires grad once its base is written in place with
    /// a value that does.
    pub grad_view: bool,
    /// A view whose autograd base is not an argument (nor an argument's base): a
    /// `detach`ed alias made in the function. Such a view of an argument leaves the
    /// argument alone when written in place with a value requiring grad.
    pub detached: bool,
}

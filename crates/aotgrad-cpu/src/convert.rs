//! Element conversion, and moving elements between storages and contiguous vectors.
//!
//! Kernels compute in one of four *compute kinds* ([`Kind`]): `f32` (for f16, bf16 and
//! f32), `f64`, `i64` (for i32 and i64) and `bool`. A kernel gathers each input through
//! its strides (with broadcasting) into a contiguous [`Vals`] of the compute kind,
//! computes, and converts the result into a [`Buffer`] of the output dtype. Keeping the
//! per-dtype code to these conversions avoids a monomorphization explosion.
//!
//! Conversion rules (PyTorch's): float to int truncates toward zero (saturating, NaN
//! gives 0); anything to bool is `!= 0` (NaN is true); bool to a number is 0 or 1;
//! i64 to i32 wraps (keeps the low 32 bits); floats round to nearest-even.

use crate::iter::Layout;
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{DType, Scalar};
use half::{bf16, f16};

/// A storage element type, with conversions to and from the compute kinds.
pub(crate) trait Elem: Copy {
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> bool;
    fn from_f32(x: f32) -> Self;
    fn from_f64(x: f64) -> Self;
    fn from_i64(x: i64) -> Self;
    fn from_bool(x: bool) -> Self;
}

macro_rules! float_elem {
    ($t:ty, $to32:expr, $to64:expr, $from32:expr, $from64:expr) => {
        impl Elem for $t {
            #[inline]
            fn to_f32(self) -> f32 {
                $to32(self)
            }
            #[inline]
            fn to_f64(self) -> f64 {
                $to64(self)
            }
            #[inline]
            fn to_i64(self) -> i64 {
                $to64(self) as i64
            }
            #[inline]
            fn to_bool(self) -> bool {
                $to64(self) != 0.0
            }
            #[inline]
            fn from_f32(x: f32) -> Self {
                $from32(x)
            }
            #[inline]
            fn from_f64(x: f64) -> Self {
                $from64(x)
            }
            #[inline]
            fn from_i64(x: i64) -> Self {
                $from64(x as f64)
            }
            #[inline]
            fn from_bool(x: bool) -> Self {
                $from32(x as u8 as f32)
            }
        }
    };
}

float_elem!(f32, |x: f32| x, |x: f32| x as f64, |x: f32| x, |x: f64| x as f32);
float_elem!(f64, |x: f64| x as f32, |x: f64| x, |x: f32| x as f64, |x: f64| x);
float_elem!(f16, |x: f16| x.to_f32(), |x: f16| x.to_f64(), f16::from_f32, f16::from_f64);
float_elem!(bf16, |x: bf16| x.to_f32(), |x: bf16| x.to_f64(), bf16::from_f32, bf16::from_f64);

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline]
            fn to_bool(self) -> bool {
                self != 0
            }
            #[inline]
            fn from_f32(x: f32) -> Self {
                x as $t
            }
            #[inline]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            #[inline]
            fn from_bool(x: bool) -> Self {
                x as $t
            }
        }
    };
}

int_elem!(i32);
int_elem!(i64);

impl Elem for bool {
    #[inline]
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn to_bool(self) -> bool {
        self
    }
    #[inline]
    fn from_f32(x: f32) -> Self {
        x != 0.0
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    #[inline]
    fn from_i64(x: i64) -> Self {
        x != 0
    }
    #[inline]
    fn from_bool(x: bool) -> Self {
        x
    }
}

/// The four types kernels compute in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    F64,
    I64,
    Bool,
}

impl Kind {
    /// The type arithmetic on `dtype` is carried out in. It holds every value of
    /// `dtype` exactly, so converting from it to any dtype rounds once (what casts and
    /// copies rely on).
    pub fn compute(dtype: DType) -> Kind {
        match dtype {
            DType::F16 | DType::BF16 | DType::F32 => Kind::F32,
            DType::F64 => Kind::F64,
            DType::I32 | DType::I64 => Kind::I64,
            DType::Bool => Kind::Bool,
        }
    }
}

/// A contiguous vector of values of one compute kind.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Vals {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

fn convert_vec<S: Elem, T: Elem>(v: &[S], f: impl Fn(S) -> T) -> Vec<T> {
    v.iter().map(|&x| f(x)).collect()
}

impl Vals {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Vals::F32(v) => v.len(),
            Vals::F64(v) => v.len(),
            Vals::I64(v) => v.len(),
            Vals::Bool(v) => v.len(),
        }
    }
    /// Convert into a buffer of `dtype`.
    pub fn into_buffer(self, dtype: DType) -> Buffer {
        macro_rules! to {
            ($v:expr, $to:ident) => {
                match dtype {
                    DType::Bool => Buffer::Bool(convert_vec(&$v, bool::$to)),
                    DType::I32 => Buffer::I32(convert_vec(&$v, i32::$to)),
                    DType::I64 => Buffer::I64(convert_vec(&$v, i64::$to)),
                    DType::F16 => Buffer::F16(convert_vec(&$v, f16::$to)),
                    DType::BF16 => Buffer::BF16(convert_vec(&$v, bf16::$to)),
                    DType::F32 => Buffer::F32(convert_vec(&$v, f32::$to)),
                    DType::F64 => Buffer::F64(convert_vec(&$v, f64::$to)),
                }
            };
        }
        match self {
            Vals::F32(v) if dtype == DType::F32 => Buffer::F32(v),
            Vals::F64(v) if dtype == DType::F64 => Buffer::F64(v),
            Vals::I64(v) if dtype == DType::I64 => Buffer::I64(v),
            Vals::Bool(v) if dtype == DType::Bool => Buffer::Bool(v),
            Vals::F32(v) => to!(v, from_f32),
            Vals::F64(v) => to!(v, from_f64),
            Vals::I64(v) => to!(v, from_i64),
            Vals::Bool(v) => to!(v, from_bool),
        }
    }
}

fn gather_elems<S: Elem>(src: &[S], layout: &Layout, kind: Kind) -> Vals {
    fn go<S: Copy, T: Copy>(src: &[S], layout: &Layout, f: impl Fn(S) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(layout.numel());
        layout.for_each_run(|o, n, s| match s {
            1 => out.extend(src[o..o + n].iter().map(|&x| f(x))),
            0 => out.extend(std::iter::repeat_n(f(src[o]), n)),
            _ => out.extend((0..n).map(|i| f(src[o + i * s]))),
        });
        out
    }
    match kind {
        Kind::F32 => Vals::F32(go(src, layout, S::to_f32)),
        Kind::F64 => Vals::F64(go(src, layout, S::to_f64)),
        Kind::I64 => Vals::I64(go(src, layout, S::to_i64)),
        Kind::Bool => Vals::Bool(go(src, layout, S::to_bool)),
    }
}

/// Read the elements of `buf` at `layout` (which must fit), converted to `kind`.
pub(crate) fn gather_buffer(op: &str, buf: &Buffer, layout: &Layout, kind: Kind) -> Result<Vals> {
    layout.check_fits(op, buf.len())?;
    // A broadcast view can name far more elements than its storage holds.
    crate::storage::check_alloc_bytes(&format!("{op}'s elements"), layout.numel() as u128 * 8)?;
    Ok(gather_unchecked(buf, layout, kind))
}

/// [`gather_buffer`] for a layout already known to fit.
fn gather_unchecked(buf: &Buffer, layout: &Layout, kind: Kind) -> Vals {
    match buf {
        Buffer::Bool(v) => gather_elems(v, layout, kind),
        Buffer::I32(v) => gather_elems(v, layout, kind),
        Buffer::I64(v) => gather_elems(v, layout, kind),
        Buffer::F16(v) => gather_elems(v, layout, kind),
        Buffer::BF16(v) => gather_elems(v, layout, kind),
        Buffer::F32(v) => gather_elems(v, layout, kind),
        Buffer::F64(v) => gather_elems(v, layout, kind),
    }
}

/// The elements of `t` broadcast to `shape`, in row-major order, converted to `kind`.
pub(crate) fn gather(op: &str, t: &CpuTensor, shape: &[usize], kind: Kind) -> Result<Vals> {
    let layout = Layout::from_meta(&t.meta)?.broadcast_to(op, shape)?;
    let guard = t.storage.read();
    gather_buffer(op, &guard, &layout, kind)
}

/// The elements of `t` in its own shape, converted to `kind`.
pub(crate) fn gather_own(op: &str, t: &CpuTensor, kind: Kind) -> Result<Vals> {
    let layout = Layout::from_meta(&t.meta)?;
    let guard = t.storage.read();
    gather_buffer(op, &guard, &layout, kind)
}

/// The elements of `t` (own shape) as i64, for index tensors (which must be integral).
pub(crate) fn gather_index(op: &str, t: &CpuTensor) -> Result<Vec<i64>> {
    if !t.meta.dtype.is_int() {
        return Err(CpuError::kernel(op, format!("index tensors must have an integer dtype, got {}", t.meta.dtype)));
    }
    match gather_own(op, t, Kind::I64)? {
        Vals::I64(v) => Ok(v),
        _ => Err(CpuError::Internal("gather to i64 returned another kind".into())),
    }
}

/// A contiguous copy (same dtype) of the elements of `buf` at `layout`.
pub(crate) fn copy_strided(op: &str, buf: &Buffer, layout: &Layout) -> Result<Buffer> {
    layout.check_fits(op, buf.len())?;
    crate::storage::check_alloc(&format!("{op}'s elements"), buf.dtype(), layout.numel() as u128)?;
    fn go<T: Copy>(src: &[T], layout: &Layout) -> Vec<T> {
        let mut out = Vec::with_capacity(layout.numel());
        layout.for_each_run(|o, n, s| match s {
            1 => out.extend_from_slice(&src[o..o + n]),
            0 => out.extend(std::iter::repeat_n(src[o], n)),
            _ => out.extend((0..n).map(|i| src[o + i * s])),
        });
        out
    }
    Ok(match buf {
        Buffer::Bool(v) => Buffer::Bool(go(v, layout)),
        Buffer::I32(v) => Buffer::I32(go(v, layout)),
        Buffer::I64(v) => Buffer::I64(go(v, layout)),
        Buffer::F16(v) => Buffer::F16(go(v, layout)),
        Buffer::BF16(v) => Buffer::BF16(go(v, layout)),
        Buffer::F32(v) => Buffer::F32(go(v, layout)),
        Buffer::F64(v) => Buffer::F64(go(v, layout)),
    })
}

/// A contiguous copy of `t`'s elements in its own dtype.
pub(crate) fn contiguous_copy(op: &str, t: &CpuTensor) -> Result<Buffer> {
    let layout = Layout::from_meta(&t.meta)?;
    let guard = t.storage.read();
    copy_strided(op, &guard, &layout)
}

/// `buf` converted to `dtype` (one rounding per element).
pub(crate) fn cast_buffer(buf: Buffer, dtype: DType) -> Buffer {
    if buf.dtype() == dtype {
        return buf;
    }
    // A contiguous layout over the whole buffer always fits.
    let layout = Layout::contiguous(&[buf.len()]);
    gather_unchecked(&buf, &layout, Kind::compute(buf.dtype())).into_buffer(dtype)
}

/// Write the contiguous `src` (converted to `dst`'s dtype) into `dst` at `layout`, in
/// row-major order. The layout must fit and hold exactly `src.len()` elements.
pub(crate) fn scatter_into(op: &str, dst: &mut Buffer, layout: &Layout, src: Buffer) -> Result<()> {
    layout.check_fits(op, dst.len())?;
    if layout.numel() != src.len() {
        return Err(CpuError::Internal(format!(
            "{op}: writing {} elements through a view of {} elements",
            src.len(),
            layout.numel()
        )));
    }
    let src = cast_buffer(src, dst.dtype());
    fn go<T: Copy>(dst: &mut [T], layout: &Layout, src: &[T]) {
        let mut it = src.iter();
        layout.for_each_offset(|o| {
            if let Some(&x) = it.next() {
                dst[o] = x;
            }
        });
    }
    match (dst, &src) {
        (Buffer::Bool(d), Buffer::Bool(s)) => go(d, layout, s),
        (Buffer::I32(d), Buffer::I32(s)) => go(d, layout, s),
        (Buffer::I64(d), Buffer::I64(s)) => go(d, layout, s),
        (Buffer::F16(d), Buffer::F16(s)) => go(d, layout, s),
        (Buffer::BF16(d), Buffer::BF16(s)) => go(d, layout, s),
        (Buffer::F32(d), Buffer::F32(s)) => go(d, layout, s),
        (Buffer::F64(d), Buffer::F64(s)) => go(d, layout, s),
        _ => return Err(CpuError::Internal(format!("{op}: cast produced a buffer of the wrong dtype"))),
    }
    Ok(())
}

/// A buffer of `len` copies of `value` converted to `dtype`.
pub(crate) fn filled(value: Scalar, dtype: DType, len: usize) -> Buffer {
    let one = match value {
        Scalar::Bool(b) => Vals::Bool(vec![b]),
        Scalar::Int(i) => Vals::I64(vec![i]),
        Scalar::Float(x) => Vals::F64(vec![x]),
    }
    .into_buffer(dtype);
    match one {
        Buffer::Bool(v) => Buffer::Bool(vec![v[0]; len]),
        Buffer::I32(v) => Buffer::I32(vec![v[0]; len]),
        Buffer::I64(v) => Buffer::I64(vec![v[0]; len]),
        Buffer::F16(v) => Buffer::F16(vec![v[0]; len]),
        Buffer::BF16(v) => Buffer::BF16(vec![v[0]; len]),
        Buffer::F32(v) => Buffer::F32(vec![v[0]; len]),
        Buffer::F64(v) => Buffer::F64(vec![v[0]; len]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_follow_pytorch() {
        let v = Vals::F64(vec![-2.7, 2.7, f64::NAN, 0.0, 3e9]);
        assert_eq!(v.clone().into_buffer(DType::I64), Buffer::I64(vec![-2, 2, 0, 0, 3_000_000_000]));
        assert_eq!(v.into_buffer(DType::Bool), Buffer::Bool(vec![true, true, true, false, true]));
        let big = Vals::I64(vec![(1 << 32) + 5, -1, i64::from(i32::MAX) + 1]);
        assert_eq!(big.into_buffer(DType::I32), Buffer::I32(vec![5, -1, i32::MIN]));
        assert_eq!(Vals::Bool(vec![true, false]).into_buffer(DType::F16), Buffer::F16(vec![f16::ONE, f16::ZERO]));
        // f64 -> f16 rounds once (0.1 is not representable; the nearest f16 is 0.0999755859375).
        assert_eq!(cast_buffer(Buffer::F64(vec![0.1]), DType::F16), Buffer::F16(vec![f16::from_f64(0.1)]));
        assert_eq!(f16::from_f64(0.1).to_f64(), 0.0999755859375);
    }

    #[test]
    fn scatter_and_fill() {
        let mut dst = Buffer::F32(vec![0.0; 6]);
        let l = Layout { shape: vec![3], strides: vec![2], offset: 1 };
        scatter_into("copy", &mut dst, &l, Buffer::I64(vec![1, 2, 3])).unwrap();
        assert_eq!(dst, Buffer::F32(vec![0.0, 1.0, 0.0, 2.0, 0.0, 3.0]));
        assert_eq!(filled(Scalar::Float(2.9), DType::I32, 2), Buffer::I32(vec![2, 2]));
    }
}

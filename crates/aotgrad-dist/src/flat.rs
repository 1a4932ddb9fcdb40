//! Gradients laid end to end in flat buffers (one per bucket), and back.

use crate::error::{Error, Result};
use aotgrad_cpu::Buffer;
use aotgrad_ir::DType;
use aotgrad_trace::Tensor;
use mpi::datatype::Equivalence;

/// An element type gradients can be averaged in.
pub(crate) trait Elem: Equivalence + Copy + Default + std::ops::AddAssign + 'static {
    const DTYPE: DType;
    fn div(self, n: usize) -> Self;
    /// The elements of `buf`, when it holds this type.
    fn slice(buf: &Buffer) -> Option<&[Self]>;
    fn from_f64(x: f64) -> Self;
    fn tensor(v: Vec<Self>, shape: &[usize]) -> Result<Tensor>;
}

/// The [`Elem`] impl of a float type whose `DType` and `Buffer` variant are `$d`.
macro_rules! elem {
    ($t:ty, $d:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$d;
            fn div(self, n: usize) -> $t {
                self / n as $t
            }
            fn slice(buf: &Buffer) -> Option<&[$t]> {
                match buf {
                    Buffer::$d(v) => Some(v),
                    _ => None,
                }
            }
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            fn tensor(v: Vec<$t>, shape: &[usize]) -> Result<Tensor> {
                Ok(Tensor::from_vec(v, shape)?)
            }
        }
    };
}

elem!(f32, F32);
elem!(f64, F64);

/// Add `t`'s elements (row-major) to `dst`: a straight copy out of the storage when
/// `t` is contiguous and of type `T`, element by element otherwise.
pub(crate) fn add_into<T: Elem>(t: &Tensor, dst: &mut [T], name: &str) -> Result<()> {
    if t.dtype() != T::DTYPE {
        return Err(Error::Invalid(format!("gradient of {name} is {:?}, its bucket holds {:?}", t.dtype(), T::DTYPE)));
    }
    let cpu = t.to_cpu()?;
    let numel = cpu.meta.concrete_shape().map(|s| s.iter().product::<usize>());
    if numel != Some(dst.len()) {
        return Err(Error::Invalid(format!("gradient of {name} has {numel:?} elements, its slot {}", dst.len())));
    }
    if cpu.meta.is_contiguous() {
        if let Some(off) = cpu.meta.concrete_offset() {
            let buf = cpu.storage.read();
            if let Some(src) = T::slice(&buf).and_then(|s| s.get(off..off + dst.len())) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += *s;
                }
                return Ok(());
            }
        }
    }
    let values = t.to_vec_f64()?;
    if values.len() != dst.len() {
        return Err(Error::Invalid(format!(
            "gradient of {name} has {} elements, expected {}",
            values.len(),
            dst.len()
        )));
    }
    for (d, s) in dst.iter_mut().zip(values) {
        *d += T::from_f64(s);
    }
    Ok(())
}

/// Copy elements `start..start + dst.len()` of `t` (row-major) into `dst`: straight
/// out of the storage when `t` is a contiguous f32 tensor.
pub(crate) fn copy_range_f32(t: &Tensor, start: usize, dst: &mut [f32]) -> Result<()> {
    let cpu = t.to_cpu()?;
    if cpu.meta.is_contiguous() && t.dtype() == DType::F32 {
        if let Some(off) = cpu.meta.concrete_offset() {
            let buf = cpu.storage.read();
            if let Some(src) = f32::slice(&buf).and_then(|s| s.get(off + start..off + start + dst.len())) {
                dst.copy_from_slice(src);
                return Ok(());
            }
        }
    }
    let values = t.to_vec_f64()?;
    let src = values
        .get(start..start + dst.len())
        .ok_or_else(|| Error::Invalid(format!("elements {start}.. of a tensor of {}", values.len())))?;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s as f32;
    }
    Ok(())
}

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

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn div(self, n: usize) -> f32 {
        self / n as f32
    }
    fn slice(buf: &Buffer) -> Option<&[f32]> {
        match buf {
            Buffer::F32(v) => Some(v),
            _ => None,
        }
    }
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn tensor(v: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape)?)
    }
}

impl Elem for f64 {
    const DTYPE: DType = DType::F64;
    fn div(self, n: usize) -> f64 {
        self / n as f64
    }
    fn slice(buf: &Buffer) -> Option<&[f64]> {
        match buf {
            Buffer::F64(v) => Some(v),
            _ => None,
        }
    }
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn tensor(v: Vec<f64>, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape)?)
    }
}

/// Add `t`'s elements (row-major) to `dst`: a straight copy out of the storage when
/// `t` is contiguous and of type `T`, element by element otherwise.
pub(crate) fn add_into<T: Elem>(t: &Tensor, dst: &mut [T], name: &str) -> Result<()> {
    if t.dtype() != T::DTYPE {
        return Err(Error::Invalid(format!("gradient of {name} is {:?}, its bucket holds {:?}", t.dtype(), T::DTYPE)));
    }
    let cpu = t.to_cpu()?;
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

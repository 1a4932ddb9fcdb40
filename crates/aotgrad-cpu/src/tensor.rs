//! Convenience constructors and accessors on [`CpuTensor`], used by the tracing crate's
//! eager mode and by tests.

use crate::convert::{copy_strided, gather_buffer, Kind, Vals};
use crate::iter::Layout;
use crate::storage::{Buffer, CpuTensor, Storage};
use crate::{CpuError, Result};
use aotgrad_ir::{DType, TensorMeta};

impl CpuTensor {
    /// A contiguous tensor of `shape` over `buf` (its dtype is the buffer's).
    /// Fails when `buf` does not hold exactly `shape.iter().product()` elements.
    pub fn new(buf: Buffer, shape: &[usize]) -> Result<CpuTensor> {
        let n: usize = shape.iter().product();
        if buf.len() != n {
            return Err(CpuError::kernel(
                "CpuTensor::new",
                format!("a buffer of {} elements cannot hold a tensor of shape {shape:?} ({n} elements)", buf.len()),
            ));
        }
        let meta = TensorMeta::from_sizes(shape, buf.dtype());
        Ok(CpuTensor { storage: Storage::new(buf), meta })
    }

    /// A contiguous tensor of `dtype` from row-major f64 values, each converted to
    /// `dtype` (floats round to nearest, ints truncate toward zero, bool is `!= 0`).
    pub fn from_f64(data: &[f64], shape: &[usize], dtype: DType) -> Result<CpuTensor> {
        CpuTensor::new(Vals::F64(data.to_vec()).into_buffer(dtype), shape)
    }

    /// A contiguous tensor of `dtype` from row-major i64 values, each converted to `dtype`
    /// (i32 keeps the low 32 bits, bool is `!= 0`).
    pub fn from_i64(data: &[i64], shape: &[usize], dtype: DType) -> Result<CpuTensor> {
        CpuTensor::new(Vals::I64(data.to_vec()).into_buffer(dtype), shape)
    }

    /// A contiguous bool tensor from row-major values.
    pub fn from_bool(data: &[bool], shape: &[usize]) -> Result<CpuTensor> {
        CpuTensor::new(Buffer::Bool(data.to_vec()), shape)
    }

    /// A contiguous zero-filled tensor.
    pub fn zeros(shape: &[usize], dtype: DType) -> CpuTensor {
        let n: usize = shape.iter().product();
        CpuTensor { storage: Storage::new(Buffer::zeros(dtype, n)), meta: TensorMeta::from_sizes(shape, dtype) }
    }

    fn gather_kind(&self, kind: Kind) -> Result<Vals> {
        self.storage.sync_host().map_err(CpuError::Device)?;
        let layout = Layout::from_meta(&self.meta)?;
        let guard = self.storage.read();
        gather_buffer("to_vec", &guard, &layout, kind)
    }

    /// The elements in logical row-major order (read through the strides) as f64, or
    /// an error if the metadata does not fit the storage.
    pub fn try_to_vec_f64(&self) -> Result<Vec<f64>> {
        match self.gather_kind(Kind::F64)? {
            Vals::F64(v) => Ok(v),
            _ => Err(CpuError::Internal("gather to f64 returned another kind".into())),
        }
    }

    /// The elements in logical row-major order as f64 (bool is 0/1).
    ///
    /// **An invalid layout yields an empty vector**: metadata that does not fit the
    /// storage (possible only by setting the public fields by hand) is not reported.
    /// Use [`CpuTensor::try_to_vec_f64`] where that must be told apart from an empty
    /// tensor, and compare lengths (not just `iter().all(..)`) in tests.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.try_to_vec_f64().unwrap_or_default()
    }

    /// The elements in logical row-major order as i64, or an error if the metadata does
    /// not fit the storage.
    pub fn try_to_vec_i64(&self) -> Result<Vec<i64>> {
        match self.gather_kind(Kind::I64)? {
            Vals::I64(v) => Ok(v),
            _ => Err(CpuError::Internal("gather to i64 returned another kind".into())),
        }
    }

    /// The elements in logical row-major order as i64 (floats truncate toward zero).
    ///
    /// **An invalid layout yields an empty vector** (hand-built metadata that does not
    /// fit the storage); [`CpuTensor::try_to_vec_i64`] reports it instead.
    pub fn to_vec_i64(&self) -> Vec<i64> {
        self.try_to_vec_i64().unwrap_or_default()
    }

    /// The elements in logical row-major order as bool (`!= 0`), or an error if the
    /// metadata does not fit the storage.
    pub fn try_to_vec_bool(&self) -> Result<Vec<bool>> {
        match self.gather_kind(Kind::Bool)? {
            Vals::Bool(v) => Ok(v),
            _ => Err(CpuError::Internal("gather to bool returned another kind".into())),
        }
    }

    /// The elements in logical row-major order as bool (`!= 0`).
    ///
    /// **An invalid layout yields an empty vector** (hand-built metadata that does not
    /// fit the storage); [`CpuTensor::try_to_vec_bool`] reports it instead.
    pub fn to_vec_bool(&self) -> Vec<bool> {
        self.try_to_vec_bool().unwrap_or_default()
    }

    /// A contiguous copy of the elements in their own dtype, or an error if the
    /// metadata does not fit the storage.
    pub fn try_contiguous_buffer(&self) -> Result<Buffer> {
        self.storage.sync_host().map_err(CpuError::Device)?;
        let layout = Layout::from_meta(&self.meta)?;
        let guard = self.storage.read();
        copy_strided("contiguous", &guard, &layout)
    }

    /// A contiguous copy of the elements in their own dtype (logical row-major order).
    ///
    /// **An invalid layout yields an empty buffer** (hand-built metadata that does not
    /// fit the storage); [`CpuTensor::try_contiguous_buffer`] reports it instead.
    pub fn contiguous_buffer(&self) -> Buffer {
        self.try_contiguous_buffer().unwrap_or_else(|_| Buffer::zeros(self.meta.dtype, 0))
    }

    /// Concrete sizes (a symbolic size, which a `CpuTensor` never has, reads as 0).
    pub fn shape(&self) -> Vec<usize> {
        self.meta.shape.iter().map(|d| d.as_const().unwrap_or(0).max(0) as usize).collect()
    }

    /// Concrete strides, in elements (a symbolic stride reads as 0).
    pub fn strides(&self) -> Vec<usize> {
        self.meta.strides.iter().map(|d| d.as_const().unwrap_or(0).max(0) as usize).collect()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// True when the strides are row-major for the shape (see [`TensorMeta::is_contiguous`]).
    pub fn is_contiguous(&self) -> bool {
        self.meta.is_contiguous()
    }
}

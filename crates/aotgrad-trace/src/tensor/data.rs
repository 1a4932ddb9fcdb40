//! Eager tensors from Rust data, and their elements back as Rust vectors.

use super::{Repr, Tensor};
use crate::error::{Error, Result};
use aotgrad_cpu::{Buffer, CpuTensor};
use aotgrad_ir::{DType, Dim, Dims, SourceLoc};
use half::{bf16, f16};

/// A Rust element type a tensor can be built from.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype of a tensor holding `Self`.
    const DTYPE: DType;
    /// Wrap a vector as a typed buffer.
    fn into_buffer(v: Vec<Self>) -> Buffer;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_buffer(v: Vec<Self>) -> Buffer {
                Buffer::$d(v)
            }
        }
    };
}
element!(bool, Bool);
element!(i32, I32);
element!(i64, I64);
element!(f16, F16);
element!(bf16, BF16);
element!(f32, F32);
element!(f64, F64);

/// **Data**: tensors from Rust values and back. `Display` prints values as PyTorch
/// does.
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(x.to_vec_f64()?, vec![1.0, 2.0, 3.0, 4.0]);
/// assert_eq!(x.sum_all()?.item()?, 10.0);
/// assert_eq!(x.to_string(), "tensor([[1., 2.],\n        [3., 4.]], dtype=f32)");
/// assert!(Tensor::from_vec(vec![1.0f32, 2.0], &[3]).is_err()); // 2 values for 3 elements
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
/// The sizes of a `&[usize]` shape as dims, or an error naming a size too large for a
/// tensor dimension (at most `i64::MAX`, as in PyTorch).
pub(crate) fn dims_at(op: &str, shape: &[usize], loc: &SourceLoc) -> Result<Dims> {
    match shape.iter().find(|&&s| s > i64::MAX as usize) {
        Some(s) => Err(Error::invalid(
            op,
            loc,
            format!("size {s} in shape {shape:?} is larger than the largest tensor dimension ({})", i64::MAX),
        )),
        None => Ok(shape.iter().map(|&s| Dim::from(s)).collect()),
    }
}

impl Tensor {
    fn from_data_at(data: usize, shape: &[usize], op: &str, loc: &SourceLoc) -> Result<()> {
        dims_at(op, shape, loc)?;
        // Sizes count as at least 1 here, as contiguous strides do (an empty tensor's
        // strides must fit too).
        let fits = shape.iter().try_fold(1i64, |a, &s| a.checked_mul((s as i64).max(1))).is_some();
        if !fits {
            return Err(Error::invalid(op, loc, format!("shape {shape:?} has more elements than fit in i64")));
        }
        let n: usize = shape.iter().product();
        if n != data {
            return Err(Error::invalid(op, loc, format!("{data} elements given for shape {shape:?} ({n} elements)")));
        }
        Ok(())
    }
    fn from_cpu_result(t: aotgrad_cpu::Result<CpuTensor>, op: &str, loc: &SourceLoc) -> Result<Tensor> {
        t.map(Tensor::from_cpu).map_err(|e| Error::kernel(op, loc, e))
    }
    /// An eager, contiguous tensor holding `data` (row-major) with the given shape.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        Tensor::from_data_at(data.len(), shape, "from_vec", &loc)?;
        Tensor::from_cpu_result(CpuTensor::new(T::into_buffer(data), shape), "from_vec", &loc)
    }
    /// An eager tensor of `dtype` from f64 values (converted as `as` casts do).
    #[track_caller]
    pub fn from_f64(data: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        Tensor::from_data_at(data.len(), shape, "from_f64", &loc)?;
        Tensor::from_cpu_result(CpuTensor::from_f64(data, shape, dtype), "from_f64", &loc)
    }
    /// An eager i64 tensor.
    #[track_caller]
    pub fn from_i64(data: &[i64], shape: &[usize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        Tensor::from_data_at(data.len(), shape, "from_i64", &loc)?;
        Tensor::from_cpu_result(CpuTensor::from_i64(data, shape, DType::I64), "from_i64", &loc)
    }
    /// An eager bool tensor.
    #[track_caller]
    pub fn from_bool(data: &[bool], shape: &[usize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        Tensor::from_data_at(data.len(), shape, "from_bool", &loc)?;
        Tensor::from_cpu_result(CpuTensor::from_bool(data, shape), "from_bool", &loc)
    }

    fn read_elems<T>(
        &self,
        op: &str,
        loc: &SourceLoc,
        read: fn(&CpuTensor) -> aotgrad_cpu::Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let t = match &self.lock().repr {
            Repr::Eager(t) => t.clone(),
            Repr::Fake(_) => {
                return Err(Error::mode(op, loc, "a fake tensor has no data (it exists only while tracing)"))
            }
        };
        read(&t).map_err(|e| Error::kernel(op, loc, e))
    }
    /// The elements in row-major order, as f64.
    #[track_caller]
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        self.read_elems("to_vec_f64", &SourceLoc::caller(), CpuTensor::try_to_vec_f64)
    }
    /// The elements in row-major order, as i64 (floats truncate toward zero).
    #[track_caller]
    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        self.read_elems("to_vec_i64", &SourceLoc::caller(), CpuTensor::try_to_vec_i64)
    }
    /// The elements in row-major order, as bool (non-zero is true).
    #[track_caller]
    pub fn to_vec_bool(&self) -> Result<Vec<bool>> {
        self.read_elems("to_vec_bool", &SourceLoc::caller(), CpuTensor::try_to_vec_bool)
    }
    /// The single element of a one-element tensor, as f64.
    #[track_caller]
    pub fn item(&self) -> Result<f64> {
        let loc = SourceLoc::caller();
        let v = self.read_elems("item", &loc, CpuTensor::try_to_vec_f64)?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::invalid(
                "item",
                &loc,
                format!("a tensor with {} elements cannot be converted to a scalar", v.len()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_dtypes() {
        let t = Tensor::from_f64(&[1.5, -2.0, 3.25], &[3], DType::F16).unwrap();
        assert_eq!(t.to_vec_f64().unwrap(), vec![1.5, -2.0, 3.25]);
        let t = Tensor::from_f64(&[1.7, -2.2], &[2], DType::I64).unwrap();
        assert_eq!(t.to_vec_i64().unwrap(), vec![1, -2]);
        assert!(Tensor::from_vec(vec![1.0f32, 2.0], &[3]).is_err());
        let t = Tensor::from_vec(vec![true, false], &[2, 1]).unwrap();
        assert_eq!(t.to_vec_bool().unwrap(), vec![true, false]);
        assert_eq!(t.dtype(), DType::Bool);
        assert!(t.item().is_err());
    }
}

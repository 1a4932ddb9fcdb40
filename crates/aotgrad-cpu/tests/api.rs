//! The convenience API of `CpuTensor`, in-place type promotion, and a property test of
//! strided reads over random layouts.

mod common;

use aotgrad_cpu::{Buffer, CpuError, CpuTensor};
use aotgrad_ir::{BinaryOp, DType, Op};
use common::*;
use half::f16;
use proptest::prelude::*;

#[test]
fn constructors_and_accessors() {
    let t = CpuTensor::new(Buffer::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), &[2, 3]).unwrap();
    assert_eq!(
        (t.shape(), t.strides(), t.dtype(), t.numel(), t.is_contiguous()),
        (vec![2, 3], vec![3, 1], DType::F32, 6, true)
    );
    let err = CpuTensor::new(Buffer::F32(vec![1.0; 5]), &[2, 3]).unwrap_err();
    assert!(matches!(err, CpuError::Kernel { .. }) && err.to_string().contains("5 elements"), "{err}");
    let h = CpuTensor::from_f64(&[0.1, -2.0], &[2], DType::F16).unwrap();
    assert_eq!(h.contiguous_buffer(), Buffer::F16(vec![f16::from_f64(0.1), f16::from_f64(-2.0)]));
    let i = CpuTensor::from_i64(&[(1 << 32) + 3, -1], &[2], DType::I32).unwrap();
    assert_eq!(i.contiguous_buffer(), Buffer::I32(vec![3, -1]));
    let f = CpuTensor::from_f64(&[-1.9, 0.0, 2.5], &[3], DType::I64).unwrap();
    assert_eq!(f.to_vec_i64(), vec![-1, 0, 2]);
    let b = CpuTensor::from_bool(&[true, false], &[2]).unwrap();
    assert_eq!((b.to_vec_f64(), b.to_vec_i64()), (vec![1.0, 0.0], vec![1, 0]));
    let z = CpuTensor::zeros(&[2, 0, 3], DType::BF16);
    assert_eq!((z.numel(), z.to_vec_f64()), (0, vec![]));
    let s = CpuTensor::from_f64(&[4.0], &[], DType::F64).unwrap();
    assert_eq!((s.shape(), s.numel(), s.to_vec_f64()), (vec![], 1, vec![4.0]));
    // Reads through a view follow the strides; the buffer copy is contiguous.
    let v = strided(&t, &[3, 2], &[1, 3], 0);
    assert!(!v.is_contiguous());
    assert_eq!(v.to_vec_f64(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(v.to_vec_bool(), vec![true; 6]);
    assert_eq!(v.contiguous_buffer(), Buffer::F32(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
    // Hand-made metadata reaching past the storage is reported, not a panic.
    let bad = CpuTensor { storage: t.storage.clone(), meta: meta(&[4], &[2], 0, DType::F32) };
    assert!(matches!(bad.try_to_vec_f64(), Err(CpuError::Kernel { .. })));
    assert!(bad.try_to_vec_i64().is_err() && bad.try_to_vec_bool().is_err());
    assert!(bad.try_contiguous_buffer().is_err());
    // The non-`try_` accessors document an empty result for such a layout.
    assert!(bad.to_vec_f64().is_empty() && bad.to_vec_i64().is_empty() && bad.to_vec_bool().is_empty());
    assert_eq!(bad.contiguous_buffer(), Buffer::F32(vec![]));
}

#[test]
fn in_place_computes_in_the_promoted_dtype_before_casting() {
    // f32 target += f64 value: PyTorch computes in f64 then rounds once. With
    // b = 2^-24 + 2^-40, 1 + b rounds up to 1 + 2^-23 in f32; rounding b to f32 first
    // (2^-24) would give a tie that rounds to 1.
    let a = tf(&[1.0], &[1], DType::F32);
    let b = tf(&[2f64.powi(-24) + 2f64.powi(-40)], &[1], DType::F64);
    exec(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))), &[&a, &b], &a.meta);
    assert_eq!(a.to_vec_f64(), vec![1.0 + 2f64.powi(-23)]);
}

proptest! {
    /// Clone of a random strided view (permuted dims, steps, offset, size-0/1 dims,
    /// broadcast dims) reads exactly the elements naive indexing gives.
    #[test]
    fn strided_reads_match_naive_indexing(
        shape in prop::collection::vec(0usize..4, 0..5),
        steps in prop::collection::vec(1usize..3, 5),
        broadcast_mask in prop::collection::vec(any::<bool>(), 5),
        rot in 0usize..5,
        offset in 0usize..3,
    ) {
        let rank = shape.len();
        // Base big enough for every step: contiguous strides of the stepped shape, then
        // rotate the dim order so the view is permuted, and zero some strides.
        let big: Vec<usize> = shape.iter().zip(&steps).map(|(s, st)| s * st + 1).collect();
        let mut strides = vec![0; rank];
        let mut acc = 1;
        for d in (0..rank).rev() {
            strides[d] = acc * steps[d];
            acc *= big[d];
        }
        if rank > 0 {
            strides.rotate_left(rot % rank);
        }
        for d in 0..rank {
            if broadcast_mask[d] {
                strides[d] = 0;
            }
        }
        let n = acc + offset + 1;
        let base_data: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let base = tf(&base_data, &[n], DType::F64);
        let extent = offset + shape.iter().zip(&strides).map(|(s, st)| s.saturating_sub(1) * st).sum::<usize>() + 1;
        prop_assume!(extent <= n);
        let v = strided(&base, &shape, &strides, offset);
        let c = exec(&Op::Clone, &[&v], &out(&shape, DType::F64));
        prop_assert_eq!(c.to_vec_f64(), logical(&base_data, &shape, &strides, offset));
        let s = exec(&Op::Binary(BinaryOp::Add), &[&v, &v], &out(&shape, DType::F64));
        let want: Vec<f64> = logical(&base_data, &shape, &strides, offset).iter().map(|x| 2.0 * x).collect();
        prop_assert_eq!(s.to_vec_f64(), want);
    }
}

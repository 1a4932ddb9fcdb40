//! Views share storage; in-place ops write through strides and are seen by every view.

mod common;

use aotgrad_cpu::{execute, CpuError, CpuTensor};
use aotgrad_ir::{BinaryOp, DType, Dim, Op, Scalar, UnaryOp};
use common::*;

fn iota(n: usize, shape: &[usize], dtype: DType) -> CpuTensor {
    tf(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), shape, dtype)
}

#[test]
fn unsafe_view_copies_the_logical_elements_into_a_fresh_tensor() {
    // x.t() is [[0, 3], [1, 4], [2, 5]]; as [2, 3] row-major: [[0, 3, 1], [4, 2, 5]].
    let x = iota(6, &[2, 3], DType::F64);
    let xt = exec(&Op::T, &[&x], &meta(&[3, 2], &[1, 3], 0, DType::F64));
    let op = Op::UnsafeView(aotgrad_ir::dims![Dim::from(2usize), Dim::from(3usize)]);
    let u = exec(&op, &[&xt], &meta(&[2, 3], &[3, 1], 0, DType::F64));
    assert!(!u.same_storage(&x));
    assert_eq!(u.storage.len(), 6);
    assert_eq!(u.to_vec_f64(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(u.shape(), vec![2, 3]);
}

#[test]
fn view_ops_share_storage_and_read_through_their_metadata() {
    let x = iota(6, &[2, 3], DType::F32);
    let cases: Vec<(Op, aotgrad_ir::TensorMeta, Vec<f64>)> = vec![
        (Op::T, meta(&[3, 2], &[1, 3], 0, DType::F32), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]),
        (Op::Transpose(0, 1), meta(&[3, 2], &[1, 3], 0, DType::F32), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]),
        (Op::Permute(vec![1, 0]), meta(&[3, 2], &[1, 3], 0, DType::F32), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]),
        (
            Op::View(aotgrad_ir::dims![Dim::from(6usize)]),
            meta(&[6], &[1], 0, DType::F32),
            (0..6).map(|i| i as f64).collect(),
        ),
        (Op::Select { dim: 1, index: Dim::from(2usize) }, meta(&[2], &[3], 2, DType::F32), vec![2.0, 5.0]),
        (
            Op::Slice { dim: 1, start: Dim::from(0usize), end: Dim::from(3usize), step: 2 },
            meta(&[2, 2], &[3, 2], 0, DType::F32),
            vec![0.0, 2.0, 3.0, 5.0],
        ),
        (Op::Unsqueeze(0), meta(&[1, 2, 3], &[6, 3, 1], 0, DType::F32), (0..6).map(|i| i as f64).collect()),
        (Op::Alias, meta(&[2, 3], &[3, 1], 0, DType::F32), (0..6).map(|i| i as f64).collect()),
    ];
    for (op, m, want) in cases {
        let v = exec(&op, &[&x], &m);
        assert!(v.same_storage(&x), "{}", op.name());
        assert_eq!(v.meta, m);
        assert_eq!(v.to_vec_f64(), want, "{}", op.name());
    }
    let row = iota(3, &[1, 3], DType::F32);
    let e = exec(
        &Op::Expand(aotgrad_ir::dims![Dim::from(2usize), Dim::from(3usize)]),
        &[&row],
        &meta(&[2, 3], &[0, 1], 0, DType::F32),
    );
    assert_eq!(e.to_vec_f64(), vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    let sq = exec(&Op::Squeeze(vec![0]), &[&row], &meta(&[3], &[1], 0, DType::F32));
    assert_eq!(sq.to_vec_f64(), vec![0.0, 1.0, 2.0]);
}

#[test]
fn as_strided_past_the_storage_is_a_kernel_error() {
    let x = iota(6, &[6], DType::F32);
    let op = Op::AsStrided {
        size: (aotgrad_ir::dims![Dim::from(3usize)]).to_vec(),
        stride: (aotgrad_ir::dims![Dim::from(2usize)]).to_vec(),
        offset: Dim::from(2usize),
    };
    let err = execute(&op, &[&x], &meta(&[3], &[2], 2, DType::F32)).unwrap_err();
    assert!(matches!(&err, CpuError::Kernel { op, .. } if op == "as_strided"), "{err}");
    assert!(err.to_string().contains("needs 7 storage elements"), "{err}");
}

#[test]
fn in_place_through_a_strided_slice_changes_the_base_and_other_views() {
    let base = iota(16, &[4, 4], DType::F32);
    // v = base[:, 0:4:2], w = base[1] (another view of the same storage).
    let v = exec(
        &Op::Slice { dim: 1, start: Dim::from(0usize), end: Dim::from(4usize), step: 2 },
        &[&base],
        &meta(&[4, 2], &[4, 2], 0, DType::F32),
    );
    let w = exec(&Op::Select { dim: 0, index: Dim::from(1usize) }, &[&base], &meta(&[4], &[1], 4, DType::F32));
    let version = base.storage.version();
    let r = exec(&Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(10.0)))), &[&v], &v.meta);
    assert!(r.same_storage(&base));
    assert_eq!(r.meta, v.meta);
    assert!(base.storage.version() > version, "a write bumps the version");
    let want: Vec<f64> = (0..16).map(|i| if (i % 4) % 2 == 0 { i as f64 * 10.0 } else { i as f64 }).collect();
    assert_eq!(base.to_vec_f64(), want);
    assert_eq!(w.to_vec_f64(), vec![40.0, 5.0, 60.0, 7.0]);
    assert_eq!(v.to_vec_f64(), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0, 140.0]);
}

#[test]
fn in_place_add_of_own_transpose_is_overlap_safe() {
    for dtype in [DType::F32, DType::F64, DType::I64] {
        let n = 4;
        let x = iota(n * n, &[n, n], dtype);
        let xt = exec(&Op::T, &[&x], &meta(&[n, n], &[1, n], 0, dtype));
        exec(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))), &[&x, &xt], &x.meta);
        let want: Vec<f64> = indices(&[n, n]).iter().map(|ix| (ix[0] * n + ix[1] + ix[1] * n + ix[0]) as f64).collect();
        assert_eq!(x.to_vec_f64(), want, "{dtype}");
        // The transposed view sees the (symmetric) result too.
        assert_eq!(xt.to_vec_f64(), want);
    }
}

#[test]
fn in_place_into_a_transposed_target_and_with_broadcast_source() {
    let x = iota(6, &[2, 3], DType::F64);
    let xt = exec(&Op::T, &[&x], &meta(&[3, 2], &[1, 3], 0, DType::F64));
    // xt (3, 2) += [100, 200] broadcast along rows.
    let b = tf(&[100.0, 200.0], &[2], DType::F64);
    exec(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))), &[&xt, &b], &xt.meta);
    assert_eq!(x.to_vec_f64(), vec![100.0, 101.0, 102.0, 203.0, 204.0, 205.0]);
}

#[test]
fn in_place_casts_the_result_into_the_target_dtype() {
    // f16 target += f32 tensor: computed in f32, stored rounded to f16.
    let h = tf(&[1.0, 2.0], &[2], DType::F16);
    let f = tf(&[0.1, 1e-4], &[2], DType::F32);
    exec(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))), &[&h, &f], &h.meta);
    assert_eq!(h.dtype(), DType::F16);
    let want = [round_to(1.0 + 0.1f32 as f64, DType::F16), round_to(2.0 + 1e-4f32 as f64, DType::F16)];
    assert_eq!(h.to_vec_f64(), want);
    // An integer target cannot hold a float result.
    let i = ti(&[1, 2], &[2], DType::I32);
    // The in-place rules are the IR's (the same error as inference gives the tracer).
    let err = execute(&Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.5)))), &[&i], &i.meta);
    assert!(
        matches!(&err, Err(CpuError::Shape(e)) if e.kind() == "inplace" && e.to_string().contains("f32")),
        "{err:?}"
    );
    let err = execute(&Op::InPlace(Box::new(Op::Unary(UnaryOp::Sqrt))), &[&i], &i.meta);
    assert!(matches!(&err, Err(CpuError::Shape(e)) if e.kind() == "inplace"), "{err:?}");
    // Subtracting a bool tensor is rejected for any target dtype, as PyTorch does.
    let l = ti(&[5, 6], &[2], DType::I64);
    let flags = CpuTensor::from_bool(&[true, false], &[2]).unwrap();
    let err = execute(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Sub))), &[&l, &flags], &l.meta);
    assert!(
        matches!(&err, Err(CpuError::Shape(e)) if e.kind() == "dtype" && e.to_string().contains("sub_")),
        "{err:?}"
    );
    assert_eq!(l.to_vec_i64(), vec![5, 6]);
    assert_eq!(i.to_vec_i64(), vec![1, 2], "a rejected in-place op leaves the target untouched");
    // i64 target += i32 tensor is fine; lt_ writes 0/1 in the target's dtype.
    let l = ti(&[5, 6], &[2], DType::I64);
    exec(&Op::InPlace(Box::new(Op::Binary(BinaryOp::Add))), &[&l, &ti(&[1, -1], &[2], DType::I32)], &l.meta);
    assert_eq!(l.to_vec_i64(), vec![6, 5]);
    let c = tf(&[0.5, 3.0], &[2], DType::F32);
    exec(&Op::InPlace(Box::new(Op::CompareScalar(aotgrad_ir::CmpOp::Lt, Scalar::Float(1.0)))), &[&c], &c.meta);
    assert_eq!(c.to_vec_f64(), vec![1.0, 0.0]);
}

#[test]
fn copy_and_fill_in_place_through_views() {
    let base = CpuTensor::zeros(&[3, 4], DType::I32);
    // base[1:3, 1:3] (shape (2, 2), offset 5) copy_ from a broadcast f64 row (truncated).
    let v = strided(&base, &[2, 2], &[4, 1], 5);
    let src = tf(&[7.9, -8.9], &[2], DType::F64);
    exec(&Op::InPlace(Box::new(Op::Copy)), &[&v, &src], &v.meta);
    assert_eq!(base.to_vec_i64(), vec![0, 0, 0, 0, 0, 7, -8, 0, 0, 7, -8, 0]);
    // fill_ the last column.
    let col = strided(&base, &[3], &[4], 3);
    exec(&Op::InPlace(Box::new(Op::FullLike { value: Scalar::Int(9), dtype: None })), &[&col], &col.meta);
    assert_eq!(base.to_vec_i64(), vec![0, 0, 0, 9, 0, 7, -8, 9, 0, 7, -8, 9]);
}

#[test]
fn writing_into_an_expanded_tensor_is_rejected() {
    let row = iota(3, &[1, 3], DType::F32);
    let e = strided(&row, &[2, 3], &[0, 1], 0);
    let err = execute(&Op::InPlace(Box::new(Op::Unary(UnaryOp::Neg))), &[&e], &e.meta).unwrap_err();
    assert!(err.to_string().contains("more than one element"), "{err}");
    assert_eq!(row.to_vec_f64(), vec![0.0, 1.0, 2.0]);
}

#[test]
fn meta_in_place_keeps_storage_and_takes_new_metadata() {
    let x = iota(6, &[2, 3], DType::F32);
    let m = meta(&[3, 2], &[1, 3], 0, DType::F32);
    let y = exec(&Op::MetaInPlace(Box::new(Op::T)), &[&x], &m);
    assert!(y.same_storage(&x));
    assert_eq!(y.meta, m);
    assert_eq!(y.to_vec_f64(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

#[test]
fn clone_is_a_fresh_contiguous_copy() {
    let x = iota(6, &[2, 3], DType::BF16);
    let xt = strided(&x, &[3, 2], &[1, 3], 0);
    let c = exec(&Op::Clone, &[&xt], &out(&[3, 2], DType::BF16));
    assert!(!c.same_storage(&x));
    assert!(c.is_contiguous());
    assert_eq!(c.to_vec_f64(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    exec(&Op::InPlace(Box::new(Op::FullLike { value: Scalar::Float(0.0), dtype: None })), &[&x], &x.meta);
    assert_eq!(c.to_vec_f64(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // A non-contiguous result meta for a fresh op is honoured (layout-preserving clone).
    let cm = meta(&[3, 2], &[1, 3], 0, DType::F32);
    let y = iota(6, &[3, 2], DType::F32);
    let c2 = exec(&Op::Clone, &[&y], &cm);
    assert_eq!(c2.meta, cm);
    assert_eq!(c2.to_vec_f64(), (0..6).map(|i| i as f64).collect::<Vec<_>>());
}

#[test]
fn composite_ops_are_rejected_with_a_clear_message() {
    let x = iota(4, &[4], DType::F32);
    let err = execute(&Op::Composite(aotgrad_ir::CompositeOp::Silu), &[&x], &out(&[4], DType::F32)).unwrap_err();
    assert!(matches!(&err, CpuError::Kernel { op, .. } if op == "silu"));
    assert!(err.to_string().contains("composite op `silu` was kept whole"), "{err}");
}

#[test]
fn absurd_as_strided_layouts_are_errors_not_overflows() {
    let x = iota(4, &[4], DType::F32);
    let big = 1usize << 62;
    let op = Op::AsStrided {
        size: (aotgrad_ir::dims![Dim::from(big), Dim::from(big)]).to_vec(),
        stride: (aotgrad_ir::dims![Dim::from(big), Dim::from(1usize)]).to_vec(),
        offset: Dim::from(0usize),
    };
    let err = execute(&op, &[&x], &meta(&[big, big], &[big, 1], 0, DType::F32)).unwrap_err();
    assert!(matches!(err, CpuError::Kernel { .. }), "{err}");
}

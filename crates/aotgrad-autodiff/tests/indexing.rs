//! Gradient checks of the indexing rules.

mod common;

use aotgrad_autodiff::{build_joint, AutodiffError};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{BinaryOp, DType, Dim, Op, TensorMeta};
use common::*;

const F: DType = DType::F64;

fn idx(values: &[i64], shape: &[usize], dtype: DType) -> CpuTensor {
    CpuTensor::from_i64(values, shape, dtype).unwrap()
}

/// `y = op(x, index) * w`, checked with x (layout `xm`) requiring grad.
fn check_indexed(op: Op, xm: TensorMeta, index: CpuTensor) -> Checked {
    let mut g = GB::new();
    let x = g.input("x", xm.clone());
    let i = g.input("index", index.meta.clone());
    let v = g.op(op, &[x, i]);
    let vm = g.meta(v).clone();
    let w = g.input("w", vm.to_contiguous());
    let y = g.op(Op::Binary(BinaryOp::Mul), &[v, w]);
    let fw = g.outputs(&[y]);
    let n = xm.concrete_shape().unwrap().iter().product();
    let vs = vm.concrete_shape().unwrap();
    let mut rng = Rng(n as u64);
    let ins = [strided(&rng.vec(n, -1.0, 1.0), &xm), index, t64(&rng.vec(vs.iter().product(), -1.0, 1.0), &vs)];
    let c = gradcheck(&fw, &ins, &[true, true, true], &[true]);
    assert_eq!(c.joint.grad_primals, vec![0, 2], "the index never gets a gradient");
    c
}

fn transposed(rows: i64, cols: i64) -> TensorMeta {
    TensorMeta { shape: (dims(&[rows, cols])), strides: (dims(&[1, rows])), offset: Dim::Const(0), dtype: F }
}

#[test]
fn index_select_accumulates_repeated_indices() {
    for xm in [TensorMeta::from_sizes(&[4, 3], F), transposed(4, 3)] {
        let c = check_indexed(Op::IndexSelect(0), xm.clone(), idx(&[2, 0, 2, 2], &[4], DType::I64));
        assert_eq!(c.grads[0][3..6], [0.0; 3], "row 1 is never selected");
        check_indexed(Op::IndexSelect(1), xm.clone(), idx(&[1, 1], &[2], DType::I32));
        check_indexed(Op::IndexSelect(1), xm, idx(&[2], &[], DType::I64));
    }
    // A 0-d input.
    check_indexed(Op::IndexSelect(0), TensorMeta::from_sizes(&[], F), idx(&[0], &[1], DType::I64));
}

#[test]
fn gather_scatters_back_with_accumulation() {
    let index = idx(&[0, 0, 1, 2, 2, 2], &[2, 3], DType::I64);
    check_indexed(Op::Gather(1), TensorMeta::from_sizes(&[2, 4], F), index.clone());
    check_indexed(Op::Gather(0), TensorMeta::from_sizes(&[3, 3], F), idx(&[0, 2, 2, 1, 1, 0], &[2, 3], DType::I64));
    check_indexed(Op::Gather(1), transposed(2, 4), index);
}

#[test]
fn scatter_add_passes_to_self_and_gathers_for_src() {
    // src larger than the index: only the indexed part of src gets a gradient.
    let mut g = GB::new();
    let x = g.inp("x", &[3, 4], F);
    let i = g.inp("index", &[2, 2], DType::I64);
    let s = g.inp("src", &[2, 3], F);
    let y = g.op(Op::ScatterAdd(1), &[x, i, s]);
    let w = g.inp("w", &[3, 4], F);
    let z = g.op(Op::Binary(BinaryOp::Mul), &[y, w]);
    let fw = g.outputs(&[z]);
    let mut rng = Rng(5);
    let ins = [
        t64(&rng.vec(12, -1.0, 1.0), &[3, 4]),
        idx(&[3, 3, 0, 2], &[2, 2], DType::I64),
        t64(&rng.vec(6, -1.0, 1.0), &[2, 3]),
        t64(&rng.vec(12, -1.0, 1.0), &[3, 4]),
    ];
    let c = gradcheck(&fw, &ins, &[true, false, true, true], &[true]);
    assert_eq!(c.joint.grad_primals, vec![0, 2, 3]);
    assert_eq!(c.grads[1][2], 0.0);
    assert_eq!(c.grads[1][5], 0.0);
    // Same-shape index and src.
    let mut g = GB::new();
    let x = g.inp("x", &[2, 3], F);
    let i = g.inp("index", &[2, 3], DType::I64);
    let s = g.inp("src", &[2, 3], F);
    let y = g.op(Op::ScatterAdd(0), &[x, i, s]);
    let fw = g.outputs(&[y]);
    let ins = [
        t64(&rng.vec(6, -1.0, 1.0), &[2, 3]),
        idx(&[1, 0, 1, 1, 1, 0], &[2, 3], DType::I64),
        t64(&rng.vec(6, -1.0, 1.0), &[2, 3]),
    ];
    gradcheck(&fw, &ins, &[true, false, true], &[true]);
}

#[test]
fn cat_slices_the_gradient() {
    for dim in [0usize, 1] {
        let mut g = GB::new();
        let shapes: [&[usize]; 3] = if dim == 0 { [&[1, 3], &[2, 3], &[3, 3]] } else { [&[2, 1], &[2, 4], &[2, 2]] };
        let xs: Vec<_> = shapes.iter().enumerate().map(|(k, s)| g.inp(&format!("x{k}"), s, F)).collect();
        let legacy = g.inp("empty", &[0], F);
        let mut args = xs.clone();
        args.insert(1, legacy);
        let y = g.op(Op::Cat(dim), &args);
        let fw = g.outputs(&[y]);
        let mut rng = Rng(dim as u64);
        let mut ins: Vec<CpuTensor> = shapes.iter().map(|s| t64(&rng.vec(s.iter().product(), -1.0, 1.0), s)).collect();
        ins.push(t64(&[], &[0]));
        let c = gradcheck_all(&fw, &ins);
        assert_eq!(c.grads[3].len(), 0);
    }
}

#[test]
fn scatter_views_split_the_gradient_between_base_and_src() {
    let ops = [
        (Op::SliceScatter { dim: 1, start: Dim::Const(1), end: Dim::Const(4), step: 2 }, vec![3usize, 2]),
        (Op::SelectScatter { dim: 0, index: Dim::Const(1) }, vec![4]),
        (
            Op::AsStridedScatter {
                size: (dims(&[2, 2])).to_vec(),
                stride: (dims(&[1, 4])).to_vec(),
                offset: Dim::Const(5),
            },
            vec![2, 2],
        ),
    ];
    for (op, src_shape) in ops {
        for base in [TensorMeta::from_sizes(&[3, 4], F), transposed(3, 4)] {
            let mut g = GB::new();
            let b = g.input("base", base.clone());
            let s = g.inp("src", &src_shape, F);
            let y = g.op(op.clone(), &[b, s]);
            let w = g.inp("w", &[3, 4], F);
            let z = g.op(Op::Binary(BinaryOp::Mul), &[y, w]);
            let fw = g.outputs(&[z]);
            let mut rng = Rng(3);
            let ins = [
                strided(&rng.vec(12, -1.0, 1.0), &base),
                t64(&rng.vec(src_shape.iter().product(), -1.0, 1.0), &src_shape),
                t64(&rng.vec(12, -1.0, 1.0), &[3, 4]),
            ];
            let c = gradcheck_all(&fw, &ins);
            // The replaced region of base gets exactly zero.
            assert_eq!(c.grads[0].iter().filter(|v| **v == 0.0).count(), src_shape.iter().product::<usize>());
        }
    }
}

#[test]
fn overlapping_as_strided_scatter_is_rejected() {
    let mut g = GB::new();
    let b = g.inp("base", &[4], F);
    let s = g.inp("src", &[2, 2], F);
    let y = g.op(
        Op::AsStridedScatter {
            size: (dims(&[2, 2])).to_vec(),
            stride: (dims(&[1, 1])).to_vec(),
            offset: Dim::Const(0),
        },
        &[b, s],
    );
    let fw = g.outputs(&[y]);
    assert!(matches!(
        build_joint(&fw, &[true, true], &[true]),
        Err(AutodiffError::NotDifferentiable { ref op, .. }) if op == "as_strided_scatter"
    ));
}

//! Indexing kernels against loops over logical indices, and index errors.

mod common;

use aotgrad_cpu::{execute, CpuError, CpuTensor};
use aotgrad_ir::{DType, Dim, Op};
use common::*;

fn expect_index_error(r: aotgrad_cpu::Result<CpuTensor>, op_name: &str, index: &str, size: &str) {
    match r {
        Err(CpuError::Kernel { op, msg }) => {
            assert_eq!(op, op_name);
            assert!(msg.contains(&format!("index {index}")) && msg.contains(&format!("size {size}")), "{msg}");
        }
        other => panic!("expected a kernel error, got {other:?}"),
    }
}

#[test]
fn index_select_on_a_transposed_input() {
    // x = transpose of a contiguous (4, 3) base -> (3, 4).
    let base = tf(&vals(12, 0.5), &[4, 3], DType::F32);
    let x = strided(&base, &[3, 4], &[1, 3], 0);
    let xv = logical(&base.to_vec_f64(), &[3, 4], &[1, 3], 0);
    let idx = ti(&[3, 0, 3], &[3], DType::I64);
    let got = exec(&Op::IndexSelect(1), &[&x, &idx], &out(&[3, 3], DType::F32));
    let want: Vec<f64> = indices(&[3, 3]).iter().map(|ix| xv[ix[0] * 4 + [3, 0, 3][ix[1]]]).collect();
    assert_eq!(got.to_vec_f64(), want);
    let idx32 = ti(&[2, 1], &[2], DType::I32);
    let rows = exec(&Op::IndexSelect(0), &[&x, &idx32], &out(&[2, 4], DType::F32));
    assert_eq!(rows.to_vec_f64(), [&xv[8..12], &xv[4..8]].concat());
    expect_index_error(
        execute(&Op::IndexSelect(0), &[&x, &ti(&[1, 3], &[2], DType::I64)], &out(&[2, 4], DType::F32)),
        "index_select",
        "3",
        "3",
    );
    expect_index_error(
        execute(&Op::IndexSelect(1), &[&x, &ti(&[-1], &[1], DType::I64)], &out(&[3, 1], DType::F32)),
        "index_select",
        "-1",
        "4",
    );
    let fidx = tf(&[0.0], &[1], DType::F32);
    assert!(matches!(
        execute(&Op::IndexSelect(0), &[&x, &fidx], &out(&[1, 4], DType::F32)),
        Err(CpuError::Kernel { .. })
    ));
}

#[test]
fn gather_along_each_dim() {
    let x = tf(&vals(12, 0.9), &[3, 4], DType::F64);
    let xv = x.to_vec_f64();
    // dim 1: out[i][j] = x[i][idx[i][j]], index shape (3, 2).
    let idx = [[3, 0], [1, 1], [2, 3]];
    let it = ti(&idx.concat().iter().map(|&v| v as i64).collect::<Vec<_>>(), &[3, 2], DType::I64);
    let got = exec(&Op::Gather(1), &[&x, &it], &out(&[3, 2], DType::F64));
    let want: Vec<f64> = indices(&[3, 2]).iter().map(|ix| xv[ix[0] * 4 + idx[ix[0]][ix[1]]]).collect();
    assert_eq!(got.to_vec_f64(), want);
    // dim 0 with a smaller index (2, 3): out[i][j] = x[idx[i][j]][j].
    let idx0 = [[2, 0, 1], [0, 2, 2]];
    let it0 = ti(&idx0.concat().iter().map(|&v| v as i64).collect::<Vec<_>>(), &[2, 3], DType::I64);
    let got = exec(&Op::Gather(0), &[&x, &it0], &out(&[2, 3], DType::F64));
    let want: Vec<f64> = indices(&[2, 3]).iter().map(|ix| xv[idx0[ix[0]][ix[1]] * 4 + ix[1]]).collect();
    assert_eq!(got.to_vec_f64(), want);
    expect_index_error(
        execute(&Op::Gather(1), &[&x, &ti(&[4], &[1, 1], DType::I64)], &out(&[1, 1], DType::F64)),
        "gather",
        "4",
        "4",
    );
}

#[test]
fn scatter_add_accumulates_duplicates_out_of_place() {
    let x = tf(&[1.0; 6], &[2, 3], DType::F32);
    let idx = ti(&[0, 0, 2, 1], &[2, 2], DType::I64);
    let src = tf(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0], &[2, 3], DType::F32);
    // dim 1: out[i][idx[i][j]] += src[i][j] for the (2, 2) index positions.
    let got = exec(&Op::ScatterAdd(1), &[&x, &idx, &src], &out(&[2, 3], DType::F32));
    assert_eq!(got.to_vec_f64(), vec![31.0, 1.0, 1.0, 1.0, 51.0, 41.0]);
    assert_eq!(x.to_vec_f64(), vec![1.0; 6], "x is unchanged");
    let xi = ti(&[0, 0, 0], &[3], DType::I64);
    let got = exec(
        &Op::ScatterAdd(0),
        &[&xi, &ti(&[2, 2, 0], &[3], DType::I64), &ti(&[5, 6, 7], &[3], DType::I64)],
        &out(&[3], DType::I64),
    );
    assert_eq!(got.to_vec_i64(), vec![7, 0, 11]);
    expect_index_error(
        execute(
            &Op::ScatterAdd(0),
            &[&xi, &ti(&[3], &[1], DType::I64), &ti(&[1], &[1], DType::I64)],
            &out(&[3], DType::I64),
        ),
        "scatter_add",
        "3",
        "3",
    );
}

#[test]
fn cat_of_strided_inputs_with_promotion() {
    let a = tf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32);
    let at = strided(&a, &[2, 2], &[1, 2], 0); // [[1, 3], [2, 4]]
    let b = ti(&[5, 6], &[2, 1], DType::I64);
    let got = exec(&Op::Cat(1), &[&at, &b], &out(&[2, 3], DType::F32));
    assert_eq!(got.to_vec_f64(), vec![1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    let got = exec(&Op::Cat(0), &[&at, &a, &CpuTensor::zeros(&[0], DType::F32)], &out(&[4, 2], DType::F32));
    assert_eq!(got.to_vec_f64(), vec![1.0, 3.0, 2.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    let bad = execute(&Op::Cat(0), &[&a, &CpuTensor::zeros(&[1, 3], DType::F32)], &out(&[3, 2], DType::F32));
    assert!(matches!(bad, Err(CpuError::Kernel { .. })));
}

#[test]
fn slice_select_and_as_strided_scatter() {
    let base = tf(&(0..12).map(|i| i as f64).collect::<Vec<_>>(), &[3, 4], DType::F64);
    let bt = strided(&base, &[4, 3], &[1, 4], 0); // transposed base: [[0,4,8],[1,5,9],...]
    let src = tf(&[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0], &[2, 3], DType::F64);
    // slice_scatter(bt, src, dim 0, 1:4:2): rows 1 and 3 replaced.
    let op = Op::SliceScatter { dim: 0, start: Dim::from(1usize), end: Dim::from(4usize), step: 2 };
    let got = exec(&op, &[&bt, &src], &out(&[4, 3], DType::F64));
    assert_eq!(got.to_vec_f64(), vec![0.0, 4.0, 8.0, -1.0, -2.0, -3.0, 2.0, 6.0, 10.0, -4.0, -5.0, -6.0]);
    assert_eq!(base.to_vec_f64()[1], 1.0, "base is unchanged");
    // select_scatter(base, [7, 7, 7], dim 1, index 2).
    let op = Op::SelectScatter { dim: 1, index: Dim::from(2usize) };
    let got = exec(&op, &[&base, &tf(&[7.0; 3], &[3], DType::F64)], &out(&[3, 4], DType::F64));
    let want: Vec<f64> = (0..12).map(|i| if i % 4 == 2 { 7.0 } else { i as f64 }).collect();
    assert_eq!(got.to_vec_f64(), want);
    let bad = execute(
        &Op::SelectScatter { dim: 1, index: Dim::from(4usize) },
        &[&base, &tf(&[7.0; 3], &[3], DType::F64)],
        &out(&[3, 4], DType::F64),
    );
    expect_index_error(bad, "select_scatter", "4", "4");
    // as_strided_scatter on the transposed base: the result is the contiguous copy of bt
    // with elements (offset 1, size [2, 2], stride [3, 1]) -> {1, 2, 4, 5} overwritten.
    let op = Op::AsStridedScatter {
        size: (aotgrad_ir::dims![Dim::from(2usize), Dim::from(2usize)]).to_vec(),
        stride: (aotgrad_ir::dims![Dim::from(3usize), Dim::from(1usize)]).to_vec(),
        offset: Dim::from(1usize),
    };
    let s = tf(&[-1.0, -2.0, -3.0, -4.0], &[2, 2], DType::F64);
    let got = exec(&op, &[&bt, &s], &out(&[4, 3], DType::F64));
    let mut want = logical(&base.to_vec_f64(), &[4, 3], &[1, 4], 0);
    for (pos, v) in [(1, -1.0), (2, -2.0), (4, -3.0), (5, -4.0)] {
        want[pos] = v;
    }
    assert_eq!(got.to_vec_f64(), want);
    let op = Op::AsStridedScatter {
        size: (aotgrad_ir::dims![Dim::from(2usize)]).to_vec(),
        stride: (aotgrad_ir::dims![Dim::from(11usize)]).to_vec(),
        offset: Dim::from(1usize),
    };
    assert!(matches!(
        execute(&op, &[&bt, &tf(&[0.0, 0.0], &[2], DType::F64)], &out(&[4, 3], DType::F64)),
        Err(CpuError::Kernel { .. })
    ));
}

//! Unit tests: indexing ops, scatters of views, and composite ops (hand-derived
//! PyTorch shapes and dtypes, error kinds, symbolic sizes).

use super::test_util::*;
use super::*;
use crate::dtype::DType;
use crate::op::CompositeOp;

use DType::{Bool, F16, F32, F64, I32, I64};

fn comp(c: CompositeOp) -> Op {
    Op::Composite(c)
}

#[test]
fn index_select_and_gather() {
    let x = f(&[5, 3]);
    assert_eq!(ok(&Op::IndexSelect(0), &[&x, &c(&[4], I64)]), f(&[4, 3]));
    assert_eq!(ok(&Op::IndexSelect(1), &[&x, &c(&[7], I32)]), f(&[5, 7]));
    assert_eq!(ok(&Op::IndexSelect(1), &[&x, &c(&[], I64)]), f(&[5, 1]));
    assert_eq!(ok(&Op::IndexSelect(0), &[&f(&[]), &c(&[1], I64)]), f(&[]));
    err(&Op::IndexSelect(0), &[&x, &c(&[4], F32)], "dtype", &["index_select", "index", "f32"]);
    err(&Op::IndexSelect(0), &[&x, &c(&[2, 2], I64)], "invalid", &["index_select", "[2, 2]"]);
    err(&Op::IndexSelect(2), &[&x, &c(&[4], I64)], "dim", &["index_select", "2"]);
    err(&Op::IndexSelect(0), &[&x], "arity", &["index_select"]);

    let x = c(&[4, 5], F64);
    assert_eq!(ok(&Op::Gather(1), &[&x, &c(&[4, 2], I64)]), c(&[4, 2], F64));
    // Along the gathered dim the index may be longer than the input.
    assert_eq!(ok(&Op::Gather(1), &[&x, &c(&[2, 7], I64)]), c(&[2, 7], F64));
    err(&Op::Gather(1), &[&x, &c(&[5, 2], I64)], "invalid", &["gather", "[5, 2]", "[4, 5]"]);
    err(&Op::Gather(1), &[&x, &c(&[4, 2], I32)], "dtype", &["gather", "index", "i32"]);
    err(&Op::Gather(0), &[&x, &c(&[4], I64)], "invalid", &["gather", "[4]", "[4, 5]"]);
}

#[test]
fn scatter_add_and_cat() {
    let x = strided(&[4, 5], &[1, 4], 3, F32);
    assert_eq!(ok(&Op::ScatterAdd(0), &[&x, &c(&[2, 3], I64), &f(&[2, 3])]), f(&[4, 5]));
    assert_eq!(ok(&Op::ScatterAdd(0), &[&x, &c(&[6, 3], I64), &f(&[6, 4])]), f(&[4, 5]));
    err(&Op::ScatterAdd(0), &[&x, &c(&[2, 3], I64), &f(&[2, 2])], "invalid", &["scatter_add", "[2, 3]", "[2, 2]"]);
    err(&Op::ScatterAdd(0), &[&x, &c(&[2, 6], I64), &f(&[2, 6])], "invalid", &["scatter_add", "[2, 6]"]);
    err(&Op::ScatterAdd(0), &[&x, &c(&[2, 3], I64), &c(&[2, 3], F64)], "dtype", &["scatter_add", "f64"]);
    err(&Op::ScatterAdd(0), &[&x, &c(&[2, 3], I32), &f(&[2, 3])], "dtype", &["scatter_add", "index"]);
    err(&Op::ScatterAdd(0), &[&x, &c(&[2], I64), &f(&[2])], "invalid", &["scatter_add", "[4, 5]"]);

    assert_eq!(ok(&Op::Cat(0), &[&c(&[2, 3], I32), &f(&[4, 3])]), f(&[6, 3]));
    assert_eq!(ok(&Op::Cat(1), &[&c(&[2, 3], I32), &c(&[2, 1], I64), &c(&[2, 0], I32)]), c(&[2, 4], I64));
    // Legacy: 1-D empty tensors are skipped but still take part in type promotion.
    assert_eq!(ok(&Op::Cat(1), &[&c(&[0], F16), &c(&[2, 3], F16)]), c(&[2, 3], F16));
    assert_eq!(ok(&Op::Cat(0), &[&c(&[0], I32), &c(&[0], F64)]), c(&[0], F64));
    err(&Op::Cat(0), &[&f(&[2, 3]), &f(&[2, 4])], "invalid", &["cat", "[2, 3]", "[2, 4]"]);
    err(&Op::Cat(0), &[&f(&[2, 3]), &f(&[3])], "invalid", &["cat", "[2, 3]", "[3]"]);
    err(&Op::Cat(0), &[&f(&[2]), &f(&[])], "invalid", &["cat", "zero-dimensional"]);
    err(&Op::Cat(2), &[&f(&[2, 3])], "dim", &["cat", "2"]);
    err(&Op::Cat(0), &[], "arity", &["cat", "at least 1"]);
    let a = TensorMeta::contiguous(vec![s(0), 3.into()], F32);
    let b = TensorMeta::contiguous(vec![s(1), 3.into()], F32);
    let m = infer(&Op::Cat(0), &[&a, &b], &mut RecOracle::new(&[2, 5])).unwrap();
    assert_eq!(m.shape, crate::dims![s(0).add(&s(1)), 3.into()]);
}

#[test]
fn scatters_of_views() {
    let base = strided(&[4, 6], &[1, 4], 0, F32);
    let ss =
        |step, src: &TensorMeta| run(&Op::SliceScatter { dim: 1, start: 0.into(), end: 6.into(), step }, &[&base, src]);
    // A clone of the base with the view written: the base's layout.
    assert_eq!(ss(3, &f(&[4, 2])).unwrap(), base);
    check_err(&ss(3, &f(&[4, 3])).unwrap_err(), "invalid", &["slice_scatter", "[4, 3]", "[4, 2]"]);
    check_err(&ss(0, &f(&[4, 3])).unwrap_err(), "invalid", &["slice_scatter", "step"]);
    let sel = |index: i64, src: &TensorMeta| run(&Op::SelectScatter { dim: 0, index: index.into() }, &[&base, src]);
    assert_eq!(sel(1, &c(&[6], F64)).unwrap(), base);
    check_err(&sel(1, &f(&[4])).unwrap_err(), "invalid", &["select_scatter", "[4]", "[6]"]);
    check_err(&sel(9, &f(&[6])).unwrap_err(), "index", &["select_scatter", "9"]);
    let ass = |size: &[i64], src: &TensorMeta| {
        let op = Op::AsStridedScatter { size: dims(size).to_vec(), stride: (dims(&[1, 2])).to_vec(), offset: 1.into() };
        run(&op, &[&f(&[6]), src])
    };
    assert_eq!(ass(&[2, 2], &f(&[2, 2])).unwrap(), f(&[6]));
    check_err(&ass(&[2, 2], &f(&[4])).unwrap_err(), "invalid", &["as_strided_scatter", "[4]", "[2, 2]"]);
}

#[test]
fn linear_and_matmul() {
    let x = f(&[8, 5, 3]);
    let w = f(&[4, 3]);
    assert_eq!(ok(&comp(CompositeOp::Linear), &[&x, &w, &f(&[4])]), f(&[8, 5, 4]));
    assert_eq!(ok(&comp(CompositeOp::Linear), &[&f(&[3]), &w]), f(&[4]));
    err(&comp(CompositeOp::Linear), &[&x, &f(&[4, 2])], "matmul", &["linear", "[8, 5, 3]", "[4, 2]"]);
    err(&comp(CompositeOp::Linear), &[&x, &w, &f(&[5])], "broadcast", &["linear", "[8, 5, 4]", "[5]"]);
    err(&comp(CompositeOp::Linear), &[&x, &w, &f(&[2, 1, 1, 4])], "invalid", &["linear", "[2, 1, 1, 4]"]);
    err(&comp(CompositeOp::Linear), &[&x, &c(&[4, 3], F64)], "dtype", &["linear", "f32", "f64"]);
    err(&comp(CompositeOp::Linear), &[&x], "arity", &["linear", "2 or 3"]);
    let mm = |a: &[i64], b: &[i64]| run(&comp(CompositeOp::Matmul), &[&f(a), &f(b)]);
    assert_eq!(mm(&[3], &[3]).unwrap(), f(&[]));
    assert_eq!(mm(&[2, 3], &[3]).unwrap(), f(&[2]));
    assert_eq!(mm(&[3], &[3, 4]).unwrap(), f(&[4]));
    assert_eq!(mm(&[3], &[7, 3, 4]).unwrap(), f(&[7, 4]));
    assert_eq!(mm(&[7, 2, 3], &[3]).unwrap(), f(&[7, 2]));
    assert_eq!(mm(&[5, 1, 2, 3], &[4, 3, 6]).unwrap(), f(&[5, 4, 2, 6]));
    check_err(&mm(&[2, 3], &[4]).unwrap_err(), "matmul", &["matmul", "[2, 3]", "[4]"]);
    check_err(&mm(&[3], &[4]).unwrap_err(), "matmul", &["matmul", "[3]", "[4]"]);
    check_err(&mm(&[7, 2, 3], &[5, 3, 4]).unwrap_err(), "broadcast", &["matmul", "[7]", "[5]"]);
    check_err(&mm(&[], &[3]).unwrap_err(), "invalid", &["matmul", "0D"]);
    let e = run(&comp(CompositeOp::Matmul), &[&c(&[2, 3], I64), &f(&[3, 2])]).unwrap_err();
    check_err(&e, "dtype", &["matmul", "i64", "f32"]);
}

#[test]
fn activations_and_norms() {
    let xs = strided(&[3, 2], &[1, 3], 1, F16);
    for op in [CompositeOp::Gelu { tanh: false }, CompositeOp::Silu, CompositeOp::Softmax { dim: 1 }] {
        assert_eq!(ok(&comp(op.clone()), &[&xs]), c(&[3, 2], F16));
        err(&comp(op.clone()), &[&c(&[3, 2], I64)], "dtype", &[op.name(), "i64"]);
    }
    err(&comp(CompositeOp::LogSoftmax { dim: 2 }), &[&f(&[3, 2])], "dim", &["log_softmax", "2"]);
    assert_eq!(ok(&comp(CompositeOp::LogSoftmax { dim: 0 }), &[&f(&[])]), f(&[]));
    let drop = |p| comp(CompositeOp::Dropout { p, seed: 1, offset: 0 });
    assert_eq!(ok(&drop(0.5), &[&f(&[4])]), f(&[4]));
    err(&drop(1.5), &[&f(&[4])], "invalid", &["dropout", "1.5"]);
    err(&drop(0.5), &[&c(&[4], Bool)], "dtype", &["dropout", "bool"]);
    let ln = |nr| comp(CompositeOp::LayerNorm { normalized_rank: nr, eps: 1e-5 });
    let x = f(&[2, 3, 4]);
    assert_eq!(ok(&ln(1), &[&x, &f(&[4]), &f(&[4])]), x);
    assert_eq!(ok(&ln(2), &[&x, &f(&[3, 4])]), x);
    assert_eq!(ok(&ln(3), &[&x]), x);
    err(&ln(1), &[&x, &f(&[3])], "invalid", &["layer_norm", "weight", "[4]", "[3]"]);
    err(&ln(1), &[&x, &f(&[4]), &f(&[1, 4])], "invalid", &["layer_norm", "bias", "[1, 4]"]);
    err(&ln(4), &[&x], "invalid", &["layer_norm", "[2, 3, 4]"]);
    err(&ln(0), &[&x], "invalid", &["layer_norm"]);
    err(&ln(1), &[&c(&[2, 4], I32)], "dtype", &["layer_norm", "i32"]);
    err(&ln(1), &[&x, &f(&[4]), &f(&[4]), &f(&[4])], "arity", &["layer_norm"]);
}

#[test]
fn embedding_and_losses() {
    let emb = comp(CompositeOp::Embedding);
    assert_eq!(ok(&emb, &[&c(&[10, 4], F64), &c(&[2, 3], I64)]), c(&[2, 3, 4], F64));
    assert_eq!(ok(&emb, &[&f(&[10, 4]), &c(&[], I32)]), f(&[4]));
    err(&emb, &[&f(&[10, 4]), &f(&[2])], "dtype", &["embedding", "indices", "f32"]);
    err(&emb, &[&f(&[10]), &c(&[2], I64)], "invalid", &["embedding", "weight", "[10]"]);
    let mse = comp(CompositeOp::MseLoss);
    assert_eq!(ok(&mse, &[&f(&[2, 3]), &f(&[3])]), f(&[]));
    assert_eq!(ok(&mse, &[&c(&[2, 3], F64), &c(&[2, 3], I64)]), c(&[], F64));
    err(&mse, &[&c(&[2], I64), &c(&[2], I64)], "dtype", &["mse_loss", "i64"]);
    err(&mse, &[&f(&[2, 3]), &f(&[4])], "broadcast", &["mse_loss", "[2, 3]", "[4]"]);
    let ce = comp(CompositeOp::CrossEntropy);
    assert_eq!(ok(&ce, &[&f(&[8, 5]), &c(&[8], I64)]), f(&[]));
    assert_eq!(ok(&ce, &[&c(&[8, 5, 3], F64), &c(&[8, 3], I64)]), c(&[], F64));
    assert_eq!(ok(&ce, &[&f(&[5]), &c(&[], I64)]), f(&[]));
    err(&ce, &[&f(&[8, 5]), &c(&[8], I32)], "dtype", &["cross_entropy", "target", "i32"]);
    err(&ce, &[&f(&[8, 5]), &c(&[7], I64)], "invalid", &["cross_entropy", "[8, 5]", "[7]", "[8]"]);
    err(&ce, &[&c(&[8, 5], I64), &c(&[8], I64)], "dtype", &["cross_entropy", "logits"]);
    err(&ce, &[&f(&[]), &c(&[], I64)], "invalid", &["cross_entropy"]);
}

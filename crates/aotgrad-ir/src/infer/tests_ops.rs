//! Unit tests: pointwise, reductions, matrix products, creation and in-place ops,
//! with hand-derived shapes and dtypes (PyTorch's results), error kinds and
//! symbolic broadcasting.

use super::test_util::*;
use super::*;
use crate::dtype::{DType, Scalar};
use crate::op::{BinaryOp, CmpOp, ReduceOp, UnaryOp};

use DType::{Bool, BF16, F16, F32, F64, I32, I64};

fn bin(b: BinaryOp) -> Op {
    Op::Binary(b)
}

fn dtype_of(op: &Op, args: &[&TensorMeta]) -> DType {
    ok(op, args).dtype
}

#[test]
fn unary_dtypes() {
    let u = |op: UnaryOp, d: DType| dtype_of(&Op::Unary(op), &[&c(&[2], d)]);
    assert_eq!(u(UnaryOp::Exp, I64), F32);
    assert_eq!(u(UnaryOp::Sqrt, Bool), F32);
    assert_eq!(u(UnaryOp::Exp, F16), F16);
    assert_eq!(u(UnaryOp::Tanh, BF16), BF16);
    assert_eq!(u(UnaryOp::Neg, I32), I32);
    assert_eq!(u(UnaryOp::Abs, I64), I64);
    assert_eq!(u(UnaryOp::Sign, I32), I32);
    assert_eq!(u(UnaryOp::LogicalNot, F32), Bool);
    err(&Op::Unary(UnaryOp::Neg), &[&c(&[2, 3], Bool)], "dtype", &["neg", "bool"]);
    err(&Op::Unary(UnaryOp::Relu), &[&c(&[2], Bool)], "dtype", &["relu", "bool"]);
    assert_eq!(u(UnaryOp::Relu, I32), I32);
    assert_eq!(u(UnaryOp::Sign, Bool), Bool);
    // A fresh elementwise result follows its operands' memory order, at offset 0
    // (values checked in PyTorch 2.15).
    let t = strided(&[3, 2], &[1, 3], 4, F64);
    assert_eq!(ok(&Op::Unary(UnaryOp::Exp), &[&t]), strided(&[3, 2], &[1, 3], 0, F64));
    // A non-dense operand (`z[:, ::2].t()` of a [4, 6] z): dense in its dim order.
    let nd = strided(&[3, 4], &[2, 6], 0, F64);
    assert_eq!(ok(&Op::Unary(UnaryOp::Sin), &[&nd]), strided(&[3, 4], &[1, 3], 0, F64));
    // Binary ops: the first operand whose strides differ decides.
    let tc = strided(&[3, 2], &[1, 3], 0, F64);
    let add = |a: &TensorMeta, b: &TensorMeta| ok(&Op::Binary(BinaryOp::Add), &[a, b]).strides;
    assert_eq!(add(&tc, &c(&[3, 2], F64)), strided(&[3, 2], &[1, 3], 0, F64).strides);
    assert_eq!(add(&c(&[3, 2], F64), &tc), c(&[3, 2], F64).strides);
    // A broadcast operand takes no part: `x.t() + y` for `y` of shape [2].
    assert_eq!(add(&tc, &c(&[2], F64)), tc.strides);
    // A scalar is a 0-d operand, so `k.t() * 2` (k [1, 4]) keeps the general order,
    // while `k.t().neg()` takes the contiguous fast path.
    let kt = strided(&[4, 1], &[1, 4], 0, F64);
    assert_eq!(ok(&Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(2)), &[&kt]).strides, kt.strides);
    assert_eq!(ok(&Op::Unary(UnaryOp::Neg), &[&kt]).strides, c(&[4, 1], F64).strides);
}

#[test]
fn binary_broadcast_and_promotion() {
    let m = ok(&bin(BinaryOp::Add), &[&c(&[2, 1], I32), &c(&[3], F16)]);
    assert_eq!(m, c(&[2, 3], F16));
    // A 0-d operand of a higher category wins its own type, otherwise it is weaker.
    assert_eq!(dtype_of(&bin(BinaryOp::Add), &[&c(&[2], I32), &c(&[], F64)]), F64);
    assert_eq!(dtype_of(&bin(BinaryOp::Add), &[&c(&[2], F16), &c(&[], F64)]), F16);
    assert_eq!(dtype_of(&bin(BinaryOp::Mul), &[&c(&[], I32), &c(&[], I64)]), I64);
    assert_eq!(dtype_of(&bin(BinaryOp::Div), &[&c(&[2], I64), &c(&[2], I64)]), F32);
    assert_eq!(dtype_of(&bin(BinaryOp::Div), &[&c(&[2], Bool), &c(&[2], Bool)]), F32);
    assert_eq!(dtype_of(&bin(BinaryOp::Mul), &[&c(&[2], Bool), &c(&[2], Bool)]), Bool);
    err(&bin(BinaryOp::Sub), &[&c(&[2], Bool), &c(&[2], I32)], "dtype", &["sub", "bool"]);
    let e = err(&bin(BinaryOp::Add), &[&f(&[2, 3]), &f(&[4])], "broadcast", &["add", "[2, 3]", "[4]"]);
    let want = ShapeError::Broadcast {
        op: "add".into(),
        lhs: "[2, 3]".into(),
        rhs: "[4]".into(),
        dim: 1,
        lhs_size: "3".into(),
        rhs_size: "4".into(),
    };
    assert_eq!(e, want);
    assert_eq!(ok(&bin(BinaryOp::Pow), &[&f(&[0, 1]), &f(&[3, 1, 5])]).shape, dims(&[3, 0, 5]));
    err(&bin(BinaryOp::Add), &[&f(&[2])], "arity", &["add", "2", "1"]);
}

#[test]
fn scalar_operands_are_weak() {
    let bs = |d: DType, b: BinaryOp, s: Scalar| dtype_of(&Op::BinaryScalar(b, s), &[&c(&[2], d)]);
    assert_eq!(bs(I32, BinaryOp::Mul, Scalar::Float(2.5)), F32);
    assert_eq!(bs(F16, BinaryOp::Mul, Scalar::Float(2.5)), F16);
    assert_eq!(bs(I32, BinaryOp::Add, Scalar::Int(2)), I32);
    assert_eq!(bs(Bool, BinaryOp::Add, Scalar::Int(1)), I64);
    assert_eq!(bs(I32, BinaryOp::Div, Scalar::Int(2)), F32);
    assert_eq!(dtype_of(&Op::BinaryScalar(BinaryOp::Add, Scalar::Float(1.0)), &[&c(&[], I64)]), F32);
    let e = run(&Op::BinaryScalar(BinaryOp::Sub, Scalar::Bool(true)), &[&c(&[2], I32)]).unwrap_err();
    check_err(&e, "dtype", &["sub"]);
}

#[test]
fn compare_where_clamp() {
    assert_eq!(ok(&Op::Compare(CmpOp::Lt), &[&c(&[3, 1], I32), &f(&[4])]), c(&[3, 4], Bool));
    assert_eq!(ok(&Op::CompareScalar(CmpOp::Ge, Scalar::Float(0.5)), &[&c(&[2], I64)]), c(&[2], Bool));
    let w = ok(&Op::Where, &[&c(&[3, 1], Bool), &c(&[4], I32), &c(&[], F32)]);
    assert_eq!(w, c(&[3, 4], F32));
    assert_eq!(ok(&Op::Where, &[&c(&[2], Bool), &c(&[2], F16), &c(&[], F64)]).dtype, F16);
    err(&Op::Where, &[&c(&[2], F32), &f(&[2]), &f(&[2])], "dtype", &["where", "condition", "f32"]);
    err(&Op::Where, &[&c(&[2], Bool), &f(&[3]), &f(&[3])], "broadcast", &["where", "[2]", "[3]"]);
    err(&Op::Where, &[&c(&[2], Bool), &f(&[2])], "arity", &["where", "3"]);
    let clamp = |min: Option<Scalar>, max: Option<Scalar>, d: DType| run(&Op::Clamp { min, max }, &[&c(&[2], d)]);
    assert_eq!(clamp(Some(Scalar::Float(0.5)), None, I64).unwrap().dtype, F32);
    assert_eq!(clamp(None, Some(Scalar::Float(0.5)), F16).unwrap().dtype, F16);
    assert_eq!(clamp(Some(Scalar::Int(0)), Some(Scalar::Int(5)), I32).unwrap().dtype, I32);
    check_err(&clamp(None, None, F32).unwrap_err(), "invalid", &["clamp", "min", "max"]);
    assert_eq!(clamp(Some(Scalar::Int(0)), None, Bool).unwrap().dtype, I64);
    check_err(&clamp(Some(Scalar::Bool(true)), None, Bool).unwrap_err(), "dtype", &["clamp", "bool"]);
}

#[test]
fn cast_copy_fill_bernoulli() {
    // `to` and `copy_` keep a dense layout (PyTorch's preserved memory format).
    assert_eq!(ok(&Op::Cast(I32), &[&strided(&[3, 2], &[1, 3], 1, F32)]), strided(&[3, 2], &[1, 3], 0, I32));
    let dst = strided(&[3, 2], &[1, 3], 0, I64);
    assert_eq!(ok(&Op::Copy, &[&dst, &f(&[2])]), dst);
    err(&Op::Copy, &[&f(&[3]), &f(&[2, 3])], "invalid", &["copy", "[3]", "[2, 3]"]);
    err(&Op::Copy, &[&f(&[2, 3]), &f(&[4])], "broadcast", &["copy", "[4]", "[2, 3]"]);
    let fl = |dtype| ok(&Op::FullLike { value: Scalar::Int(0), dtype }, &[&strided(&[2, 2], &[0, 1], 0, F16)]);
    assert_eq!(fl(None), c(&[2, 2], F16));
    assert_eq!(fl(Some(Bool)), c(&[2, 2], Bool));
    let bern = |p: f64, d: DType| run(&Op::Bernoulli { p, seed: 0, offset: 0 }, &[&c(&[4], d)]);
    assert_eq!(bern(0.3, F64).unwrap(), c(&[4], F64));
    check_err(&bern(0.3, I64).unwrap_err(), "dtype", &["bernoulli", "i64"]);
    check_err(&bern(1.5, F32).unwrap_err(), "invalid", &["bernoulli", "1.5"]);
    check_err(&bern(f64::NAN, F32).unwrap_err(), "invalid", &["bernoulli"]);
}

#[test]
fn reductions() {
    let red =
        |op: ReduceOp, dims: Vec<usize>, keepdim: bool, x: &TensorMeta| run(&Op::Reduce { op, dims, keepdim }, &[x]);
    let x = c(&[2, 3, 4], I32);
    assert_eq!(red(ReduceOp::Sum, vec![1], false, &x).unwrap(), c(&[2, 4], I64));
    assert_eq!(red(ReduceOp::Sum, vec![1], true, &x).unwrap(), c(&[2, 1, 4], I64));
    assert_eq!(red(ReduceOp::Sum, vec![], false, &x).unwrap(), c(&[], I64));
    assert_eq!(red(ReduceOp::Sum, vec![], true, &x).unwrap(), c(&[1, 1, 1], I64));
    assert_eq!(red(ReduceOp::Sum, vec![0, 2], false, &c(&[2, 3, 4], F16)).unwrap(), c(&[3], F16));
    assert_eq!(red(ReduceOp::Amax, vec![2], false, &x).unwrap(), c(&[2, 3], I32));
    assert_eq!(red(ReduceOp::Mean, vec![0], false, &c(&[2, 3], BF16)).unwrap(), c(&[3], BF16));
    check_err(&red(ReduceOp::Mean, vec![0], false, &x).unwrap_err(), "dtype", &["mean", "i32"]);
    let empty = f(&[2, 0]);
    check_err(&red(ReduceOp::Amax, vec![1], false, &empty).unwrap_err(), "invalid", &["amax", "[2, 0]"]);
    check_err(&red(ReduceOp::Amin, vec![], false, &empty).unwrap_err(), "invalid", &["amin"]);
    assert_eq!(red(ReduceOp::Amax, vec![0], false, &empty).unwrap(), f(&[0]));
    assert_eq!(red(ReduceOp::Sum, vec![1], false, &empty).unwrap(), f(&[2]));
    check_err(&red(ReduceOp::Sum, vec![2, 1], false, &x).unwrap_err(), "invalid", &["sum"]);
    check_err(&red(ReduceOp::Sum, vec![3], false, &x).unwrap_err(), "dim", &["sum", "3"]);
    assert_eq!(red(ReduceOp::Sum, vec![0], false, &f(&[])).unwrap(), f(&[]));
    check_err(&red(ReduceOp::Sum, vec![1], false, &f(&[])).unwrap_err(), "dim", &["sum"]);
    let am = |dim, keepdim, x: &TensorMeta| run(&Op::ArgMax { dim, keepdim }, &[x]);
    assert_eq!(am(1, false, &f(&[2, 3])).unwrap(), c(&[2], I64));
    assert_eq!(am(1, true, &f(&[2, 3])).unwrap(), c(&[2, 1], I64));
    assert_eq!(ok(&Op::ArgMin { dim: 0, keepdim: false }, &[&f(&[])]), c(&[], I64));
    check_err(&am(1, false, &empty).unwrap_err(), "invalid", &["argmax", "[2, 0]"]);
    check_err(&am(2, false, &f(&[2, 3])).unwrap_err(), "dim", &["argmax"]);
}

#[test]
fn scans_keep_the_shape_contiguous() {
    let t = strided(&[3, 2], &[1, 3], 0, F32);
    assert_eq!(ok(&Op::Cumsum(0), &[&t]), f(&[3, 2]));
    assert_eq!(ok(&Op::Cumsum(0), &[&c(&[4], Bool)]), c(&[4], I64));
    assert_eq!(ok(&Op::Cumsum(0), &[&c(&[4], I32)]), c(&[4], I64));
    assert_eq!(ok(&Op::Cumsum(0), &[&f(&[])]), f(&[]));
    assert_eq!(ok(&Op::Argsort { dim: 1, descending: true }, &[&t]), c(&[3, 2], I64));
    err(&Op::Cumsum(2), &[&t], "dim", &["cumsum"]);
    err(&Op::Argsort { dim: 1, descending: false }, &[&f(&[])], "dim", &["argsort"]);
}

#[test]
fn matrix_products() {
    assert_eq!(ok(&Op::Mm, &[&f(&[2, 3]), &strided(&[3, 4], &[1, 3], 0, F32)]), f(&[2, 4]));
    err(&Op::Mm, &[&f(&[2, 3]), &f(&[4, 5])], "matmul", &["mm", "[2, 3]", "[4, 5]"]);
    err(&Op::Mm, &[&f(&[2, 3]), &c(&[3, 4], F64)], "dtype", &["mm", "f32", "f64"]);
    err(&Op::Mm, &[&c(&[2, 3], Bool), &c(&[3, 4], Bool)], "dtype", &["mm", "bool"]);
    err(&Op::Mm, &[&f(&[1, 2, 3]), &f(&[3, 4])], "invalid", &["mm", "[1, 2, 3]"]);
    assert_eq!(ok(&Op::Bmm, &[&f(&[5, 2, 3]), &f(&[5, 3, 4])]), f(&[5, 2, 4]));
    err(&Op::Bmm, &[&f(&[5, 2, 3]), &f(&[4, 3, 4])], "invalid", &["bmm", "[5, 2, 3]", "[4, 3, 4]"]);
    err(&Op::Bmm, &[&f(&[5, 2, 3]), &f(&[5, 2, 4])], "matmul", &["bmm", "[5, 2, 3]", "[5, 2, 4]"]);
    err(&Op::Bmm, &[&f(&[2, 3]), &f(&[3, 4])], "invalid", &["bmm"]);
}

#[test]
fn creation_ops() {
    let full = Op::Full { shape: dims(&[2, 3]), value: Scalar::Int(1), dtype: I64 };
    assert_eq!(ok(&full, &[]), c(&[2, 3], I64));
    err(&full, &[&f(&[1])], "arity", &["full", "0"]);
    let neg = Op::Full { shape: dims(&[2, -3]), value: Scalar::Int(1), dtype: I64 };
    err(&neg, &[], "invalid", &["full", "-3"]);
    let rand = |dtype| Op::Rand { shape: dims(&[4]), dtype, seed: 0, offset: 0 };
    assert_eq!(ok(&rand(F16), &[]), c(&[4], F16));
    err(&rand(I64), &[], "dtype", &["rand", "i64"]);
    let huge = Op::Full { shape: dims(&[1 << 40, 1 << 40]), value: Scalar::Int(0), dtype: F32 };
    err(&huge, &[], "invalid", &["full", "[1099511627776, 1099511627776]"]);
    // Broadcasting two valid shapes can still overflow the element count.
    let (a, b) = (f(&[1 << 40, 1]), strided(&[1, 1 << 40], &[0, 1], 0, F32));
    err(&bin(BinaryOp::Add), &[&a, &b], "invalid", &["add", "more elements"]);
    let randn = Op::Randn { shape: dims(&[-1]), dtype: F32, seed: 0, offset: 0 };
    err(&randn, &[], "invalid", &["randn"]);
    let ar = |start: Scalar, end: Scalar, step: Scalar, dtype| run(&Op::Arange { start, end, step, dtype }, &[]);
    let len = |start, end, step, dtype| ar(start, end, step, dtype).unwrap().shape;
    use Scalar::{Float as Fl, Int};
    assert_eq!(len(Int(0), Int(10), Int(3), I64), dims(&[4]));
    assert_eq!(len(Int(10), Int(0), Int(-3), I64), dims(&[4]));
    assert_eq!(len(Int(3), Int(3), Int(1), I32), dims(&[0]));
    assert_eq!(len(Fl(0.0), Fl(1.0), Fl(0.1), F32), dims(&[10]));
    assert_eq!(len(Fl(0.0), Fl(1.0), Fl(0.3), F64), dims(&[4]));
    // Integral results truncate the bounds first: arange(0.5, 3.7, 1.2) as i64 is 0..3 step 1.
    assert_eq!(len(Fl(0.5), Fl(3.7), Fl(1.2), I64), dims(&[3]));
    check_err(&ar(Int(5), Int(0), Int(1), I64).unwrap_err(), "invalid", &["arange", "step sign"]);
    check_err(&ar(Int(0), Int(5), Int(0), I64).unwrap_err(), "invalid", &["arange", "nonzero"]);
    check_err(&ar(Fl(0.0), Fl(5.0), Fl(0.4), I64).unwrap_err(), "invalid", &["arange", "nonzero"]);
    check_err(&ar(Fl(0.0), Fl(f64::INFINITY), Fl(1.0), F32).unwrap_err(), "invalid", &["arange"]);
    check_err(&ar(Int(0), Int(5), Int(1), Bool).unwrap_err(), "dtype", &["arange", "bool"]);
}

#[test]
fn inplace_ops() {
    let mul_ = Op::InPlace(Box::new(bin(BinaryOp::Mul)));
    let target = strided(&[3, 2], &[1, 3], 2, F32);
    assert_eq!(ok(&mul_, &[&target, &c(&[2], I64)]), target);
    let add_ = Op::InPlace(Box::new(bin(BinaryOp::Add)));
    let e = err(&add_, &[&f(&[3]), &f(&[2, 3])], "inplace", &["add_", "[2, 3]", "[3]"]);
    assert_eq!(
        e,
        ShapeError::InPlace {
            op: "add_".into(),
            result: "[2, 3]".into(),
            result_dtype: "f32".into(),
            target: "[3]".into(),
            target_dtype: "f32".into(),
        }
    );
    err(&add_, &[&c(&[3], I64), &f(&[3])], "inplace", &["add_", "f32", "i64"]);
    let add_scalar_ = Op::InPlace(Box::new(Op::BinaryScalar(BinaryOp::Add, Scalar::Float(2.5))));
    err(&add_scalar_, &[&c(&[3], I64)], "inplace", &["add_", "f32", "i64"]);
    assert_eq!(ok(&add_, &[&f(&[3]), &c(&[3], I64)]), f(&[3]));
    // Errors of the inner op carry the in-place name.
    err(&add_, &[&f(&[2, 3]), &f(&[4])], "broadcast", &["add_", "[2, 3]", "[4]"]);
    let expanded = strided(&[2, 3], &[0, 1], 0, F32);
    err(&mul_, &[&expanded, &f(&[3])], "invalid", &["mul_", "more than one element"]);
    let one_row = strided(&[1, 3], &[0, 1], 0, F32);
    assert_eq!(ok(&mul_, &[&one_row, &f(&[3])]), one_row);
    err(&Op::InPlace(Box::new(Op::Mm)), &[&f(&[2, 2]), &f(&[2, 2])], "invalid", &["mm_"]);
    let lt_ = Op::InPlace(Box::new(Op::Compare(CmpOp::Lt)));
    assert_eq!(ok(&lt_, &[&f(&[2]), &f(&[2])]), f(&[2]));
    let copy_ = Op::InPlace(Box::new(Op::Copy));
    assert_eq!(ok(&copy_, &[&c(&[2, 3], I32), &c(&[3], F64)]), c(&[2, 3], I32));
    let fill_ = Op::InPlace(Box::new(Op::FullLike { value: Scalar::Float(1.5), dtype: None }));
    assert_eq!(ok(&fill_, &[&target]), target);
    err(&Op::InPlace(Box::new(Op::Unary(UnaryOp::Exp))), &[&c(&[2], I64)], "inplace", &["exp_", "f32", "i64"]);
}

#[test]
fn symbolic_broadcasting_records_guards() {
    let mut o = RecOracle::new(&[4, 4]);
    assert_eq!(broadcast_shapes("add", &[s(0)], &[s(0)], &mut o).unwrap(), crate::dims![s(0)]);
    assert_eq!(broadcast_shapes("add", &[s(0), 3.into()], &[3.into()], &mut o).unwrap(), crate::dims![s(0), 3.into()]);
    assert!(o.guards.is_empty(), "{:?}", o.guard_text());
    assert_eq!(broadcast_shapes("add", &[s(0)], &[s(1)], &mut o).unwrap(), crate::dims![s(0)]);
    assert_eq!(o.guard_text(), vec!["s1 != 1", "s0 != 1", "s0 == s1"]);
    let mut o = RecOracle::new(&[1, 5]);
    assert_eq!(broadcast_shapes("add", &[s(0)], &[s(1)], &mut o).unwrap(), crate::dims![s(1)]);
    assert_eq!(o.guard_text(), vec!["s1 != 1", "s0 == 1"]);
    let mut o = RecOracle::new(&[3, 4]);
    let e = broadcast_shapes("mul", &[s(0), 2.into()], &[s(1), 2.into()], &mut o).unwrap_err();
    check_err(&e, "broadcast", &["mul", "[s0, 2]", "[s1, 2]", "s0 vs s1"]);
    // Through infer, with a symbolic matmul inner dim.
    let a = TensorMeta::contiguous(vec![2.into(), s(0)], F32);
    let b = TensorMeta::contiguous(vec![s(1), 3.into()], F32);
    assert_eq!(infer(&Op::Mm, &[&a, &b], &mut RecOracle::new(&[4, 4])).unwrap(), f(&[2, 3]));
    let e = infer(&Op::Mm, &[&a, &b], &mut RecOracle::new(&[4, 5])).unwrap_err();
    check_err(&e, "matmul", &["mm", "[2, s0]", "[s1, 3]"]);
}

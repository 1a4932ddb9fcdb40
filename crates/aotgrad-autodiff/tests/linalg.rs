//! Gradient checks of `mm` and `bmm`.

mod common;

use aotgrad_ir::{DType, Dim, Op, TensorMeta};
use common::*;

const F: DType = DType::F64;

fn check(op: Op, a: TensorMeta, b: TensorMeta, rg: [bool; 2]) -> Checked {
    let mut g = GB::new();
    let x = g.input("a", a.clone());
    let y = g.input("b", b.clone());
    let z = g.op(op, &[x, y]);
    let fw = g.outputs(&[z]);
    let mut rng = Rng(11);
    let n = |m: &TensorMeta| m.concrete_shape().unwrap().iter().product();
    let ins = [strided(&rng.vec(n(&a), -1.0, 1.0), &a), strided(&rng.vec(n(&b), -1.0, 1.0), &b)];
    gradcheck(&fw, &ins, &rg, &[true])
}

#[test]
fn mm_on_contiguous_and_transposed_operands() {
    let a = TensorMeta::from_sizes(&[3, 4], F);
    let b = TensorMeta::from_sizes(&[4, 2], F);
    let bt = TensorMeta { shape: dims(&[4, 2]), strides: dims(&[1, 4]), offset: Dim::Const(0), dtype: F };
    check(Op::Mm, a.clone(), b.clone(), [true, true]);
    check(Op::Mm, a.clone(), bt, [true, true]);
    let c = check(Op::Mm, a, b, [false, true]);
    assert_eq!(c.joint.grad_primals, vec![1]);
    // Only b's gradient is built: a single mm in the backward.
    assert_eq!(c.joint.graph.nodes.iter().filter(|n| n.op == Op::Mm).count(), 2);
}

#[test]
fn bmm_on_contiguous_and_permuted_operands() {
    let a = TensorMeta::from_sizes(&[2, 3, 4], F);
    let b = TensorMeta::from_sizes(&[2, 4, 5], F);
    let ap = TensorMeta { shape: dims(&[2, 3, 4]), strides: dims(&[1, 2, 6]), offset: Dim::Const(0), dtype: F };
    check(Op::Bmm, a, b.clone(), [true, true]);
    check(Op::Bmm, ap, b, [true, true]);
}

//! Gradient check of `_unsafe_view` (a reshaped fresh copy, what the tracer's
//! `matmul`/`linear`/`embedding` decompositions and `reshape`'s copy branch end in):
//! its gradient is the incoming one reshaped back to the input's shape.

mod common;

use aotgrad_ir::{BinaryOp, DType, Dim, Op, TensorMeta};
use common::*;

#[test]
fn unsafe_view_gradient_is_the_gradient_reshaped_back() {
    // x: a transposed (column-major) 3 x 4 input, so the result's elements are x's in
    // logical row-major order, not its storage order.
    let xm = TensorMeta { shape: (dims(&[3, 4])), strides: (dims(&[1, 3])), offset: Dim::Const(0), dtype: DType::F64 };
    for shape in [vec![12], vec![2, 6], vec![2, 3, 2]] {
        let mut g = GB::new();
        let x = g.input("x", xm.clone());
        let u = g.op(Op::UnsafeView(dims(&shape)), &[x]);
        let um = g.meta(u).clone();
        assert!(um == um.to_contiguous(), "{um}");
        let w = g.input("w", um.clone());
        let y = g.op(Op::Binary(BinaryOp::Mul), &[u, w]);
        let fw = g.outputs(&[y]);
        let mut rng = Rng(shape.len() as u64 + 41);
        let ins = [strided(&rng.vec(12, -1.0, 1.0), &xm), t64(&rng.vec(12, -1.0, 1.0), &um.concrete_shape().unwrap())];
        let c = gradcheck_all(&fw, &ins);
        // d(sum(u * w * t))/dx[i][j] = (w * t) at the row-major position i * 4 + j.
        let (xv, wv) = (ins[0].to_vec_f64(), ins[1].to_vec_f64());
        let want_x: Vec<f64> = (0..12).map(|k| wv[k] * c.tangents[0][k]).collect();
        assert_close(&c.grads[0], &want_x, 1e-12);
        let want_w: Vec<f64> = (0..12).map(|k| xv[k] * c.tangents[0][k]).collect();
        assert_close(&c.grads[1], &want_w, 1e-12);
    }
}

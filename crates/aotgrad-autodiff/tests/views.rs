//! Gradient checks of the view rules, on contiguous and non-contiguous inputs.

mod common;

use aotgrad_ir::{BinaryOp, DType, Dim, Op, TensorMeta};
use common::*;

const F: DType = DType::F64;

/// `y = view_op(x) * w` (so the gradient reaching the view is not just the tangent),
/// for an input `x` with layout `xm`.
fn check_view(view: Op, xm: TensorMeta) -> Checked {
    let mut g = GB::new();
    let x = g.input("x", xm.clone());
    let v = g.op(view, &[x]);
    let vm = g.meta(v).clone();
    let w = g.input("w", vm.to_contiguous());
    let y = g.op(Op::Binary(BinaryOp::Mul), &[v, w]);
    let fw = g.outputs(&[y]);
    let n = xm.concrete_shape().unwrap().iter().product();
    let m: usize = vm.concrete_shape().unwrap().iter().product();
    let mut rng = Rng(n as u64 * 13 + m as u64);
    let ins = [strided(&rng.vec(n, -1.0, 1.0), &xm), t64(&rng.vec(m, -1.0, 1.0), &vm.concrete_shape().unwrap())];
    gradcheck_all(&fw, &ins)
}

fn contiguous(shape: &[usize]) -> TensorMeta {
    TensorMeta::from_sizes(shape, F)
}

/// A transposed (column-major) `rows x cols` layout.
fn transposed(rows: usize, cols: usize) -> TensorMeta {
    TensorMeta {
        shape: (dims(&[rows as i64, cols as i64])),
        strides: (dims(&[1, rows as i64])),
        offset: Dim::Const(0),
        dtype: F,
    }
}

/// Every other row of a `2*rows x cols` buffer, starting at row 1.
fn step_sliced(rows: usize, cols: usize) -> TensorMeta {
    let c = cols as i64;
    TensorMeta { shape: (dims(&[rows as i64, c])), strides: (dims(&[2 * c, 1])), offset: Dim::Const(c), dtype: F }
}

fn layouts() -> Vec<TensorMeta> {
    vec![contiguous(&[3, 4]), transposed(3, 4), step_sliced(3, 4)]
}

#[test]
fn non_contiguous_inputs_match_views_made_by_the_kernels() {
    // The test helper lays out inputs exactly as `execute` of a view op does.
    let base = t64(&(0..12).map(f64::from).collect::<Vec<_>>(), &[4, 3]);
    let tv = run_op(&Op::T, &[&base]);
    assert_eq!(tv.meta, transposed(3, 4));
    assert_eq!(strided(&tv.to_vec_f64(), &tv.meta).to_vec_f64(), tv.to_vec_f64());
    let base = t64(&(0..24).map(f64::from).collect::<Vec<_>>(), &[6, 4]);
    let sv = run_op(&Op::Slice { dim: 0, start: Dim::Const(1), end: Dim::Const(6), step: 2 }, &[&base]);
    assert_eq!(sv.meta, step_sliced(3, 4));
    // A gradient check with the kernel-made transposed input itself.
    let mut g = GB::new();
    let x = g.input("x", tv.meta.clone());
    let y = g.op(Op::Unary(aotgrad_ir::UnaryOp::Sin), &[x]);
    let fw = g.outputs(&[y]);
    gradcheck_all(&fw, &[tv]);
}

#[test]
fn view_squeeze_unsqueeze_alias() {
    for xm in layouts() {
        // view needs compatible strides: flatten only the contiguous one, split dim 1 always.
        if xm.is_contiguous() {
            check_view(Op::View(dims(&[12])), xm.clone());
            check_view(Op::View(dims(&[2, 6])), xm.clone());
        }
        check_view(Op::View(dims(&[3, 2, 2])), xm.clone());
        check_view(Op::Unsqueeze(1), xm.clone());
        check_view(Op::Unsqueeze(2), xm.clone());
        check_view(Op::Alias, xm.clone());
    }
    let mut xm = contiguous(&[3, 1, 4]);
    check_view(Op::Squeeze(vec![1]), xm.clone());
    xm.strides = dims(&[1, 7, 3]);
    check_view(Op::Squeeze(vec![1]), xm);
}

#[test]
fn permute_transpose_t() {
    let xm = TensorMeta { shape: (dims(&[2, 3, 4])), strides: (dims(&[1, 8, 2])), offset: Dim::Const(1), dtype: F };
    for x in [contiguous(&[2, 3, 4]), xm] {
        check_view(Op::Permute(vec![2, 0, 1]), x.clone());
        check_view(Op::Permute(vec![1, 2, 0]), x.clone());
        check_view(Op::Transpose(0, 2), x.clone());
    }
    for xm in layouts() {
        check_view(Op::T, xm);
    }
    check_view(Op::T, contiguous(&[5]));
}

#[test]
fn expand_sums_over_expanded_dims() {
    check_view(Op::Expand(dims(&[2, 3, 4])), contiguous(&[3, 1]));
    check_view(Op::Expand(dims(&[2, 3, 4])), contiguous(&[4]));
    check_view(Op::Expand(dims(&[5, 3, 4])), step_sliced(3, 4));
    check_view(Op::Expand(dims(&[2, 2])), contiguous(&[]));
    let c = check_view(Op::Expand(dims(&[3, 2])), contiguous(&[1, 2]));
    assert_eq!(c.grads[0].len(), 2);
}

#[test]
fn slice_and_select_scatter_into_zeros() {
    for xm in layouts() {
        check_view(Op::Slice { dim: 0, start: Dim::Const(1), end: Dim::Const(3), step: 1 }, xm.clone());
        check_view(Op::Slice { dim: 1, start: Dim::Const(0), end: Dim::Const(4), step: 2 }, xm.clone());
        check_view(Op::Slice { dim: 1, start: Dim::Const(1), end: Dim::Const(1), step: 1 }, xm.clone());
        check_view(Op::Select { dim: 0, index: Dim::Const(2) }, xm.clone());
        check_view(Op::Select { dim: 1, index: Dim::Const(1) }, xm);
    }
}

#[test]
fn as_strided_on_contiguous_and_other_layouts() {
    let v = |size: &[i64], stride: &[i64], offset: i64| Op::AsStrided {
        size: dims(size).to_vec(),
        stride: dims(stride).to_vec(),
        offset: Dim::Const(offset),
    };
    // Contiguous input: one as_strided_scatter into zeros.
    let c = check_view(v(&[2, 2], &[4, 1], 1), contiguous(&[3, 4]));
    assert!(c.joint.graph.nodes.iter().any(|n| matches!(n.op, Op::AsStridedScatter { .. })));
    check_view(v(&[3, 2], &[1, 6], 0), contiguous(&[3, 4]));
    // Contiguous input at an offset: offsets are relative to its first element.
    let mut off = contiguous(&[2, 3]);
    off.offset = Dim::Const(5);
    check_view(v(&[3], &[2], 6), off);
    // Transposed and step-sliced inputs: the general path.
    for (op, xm) in [(v(&[2, 2], &[1, 3], 1), transposed(3, 4)), (v(&[2, 3], &[8, 2], 4), step_sliced(3, 4))] {
        let c = check_view(op, xm);
        let reads = c.joint.graph.nodes.iter().filter(|n| matches!(n.op, Op::AsStrided { .. })).count();
        assert_eq!(reads, 2, "the forward view and the backward read-back of the input's layout");
    }
}

#[test]
fn as_strided_of_a_symbolic_non_contiguous_view() {
    // x: [s0, 4]; v = x[:, ::2] (strides [4, 2]); y = v.as_strided([2, 2], [4, 2], 1) * w.
    let s0 = Dim::sym(aotgrad_ir::SymId(0));
    let mut g = GB::new();
    let x = g.input("x", TensorMeta::contiguous(vec![s0, Dim::Const(4)], F));
    let v = g.op(Op::Slice { dim: 1, start: Dim::Const(0), end: Dim::Const(4), step: 2 }, &[x]);
    let a = g.op(
        Op::AsStrided { size: (dims(&[2, 2])).to_vec(), stride: (dims(&[4, 2])).to_vec(), offset: Dim::Const(1) },
        &[v],
    );
    let w = g.inp("w", &[2, 2], F);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[a, w]);
    let fw = g.outputs(&[y]);
    for rows in [2usize, 4] {
        let mut rng = Rng(rows as u64);
        gradcheck_all(&fw, &[t64(&rng.vec(rows * 4, -1.0, 1.0), &[rows, 4]), t64(&rng.vec(4, -1.0, 1.0), &[2, 2])]);
    }
}

#[test]
fn as_strided_of_a_symbolic_column_major_input() {
    // x: [s0, 3] with strides [1, s0]: the general path with a symbolic buffer length.
    let s0 = Dim::sym(aotgrad_ir::SymId(0));
    let xm = TensorMeta {
        shape: aotgrad_ir::dims![s0.clone(), Dim::Const(3)],
        strides: aotgrad_ir::dims![Dim::Const(1), s0],
        offset: Dim::Const(0),
        dtype: F,
    };
    let mut g = GB::new();
    let x = g.input("x", xm);
    let a = g.op(
        Op::AsStrided { size: (dims(&[2, 2])).to_vec(), stride: (dims(&[2, 1])).to_vec(), offset: Dim::Const(1) },
        &[x],
    );
    let fw = g.outputs(&[a]);
    for rows in [2usize, 3] {
        let m = TensorMeta {
            shape: (dims(&[rows as i64, 3])),
            strides: (dims(&[1, rows as i64])),
            offset: Dim::Const(0),
            dtype: F,
        };
        let c = gradcheck_all(&fw, &[strided(&Rng(7).vec(rows * 3, -1.0, 1.0), &m)]);
        assert_eq!(c.grads[0].iter().filter(|v| **v != 0.0).count(), 4);
    }
}

/// A view naming elements several times (`[3, 2]` with strides `[1, 1]` over 4
/// elements): the gradients of the repeats add up at their storage position, checked
/// against finite differences (PyTorch's `as_strided_backward` accumulates too).
#[test]
fn overlapping_as_strided_accumulates() {
    let mut g = GB::new();
    let x = g.inp("x", &[4], F);
    let v = g.op(
        Op::AsStrided { size: (dims(&[3, 2])).to_vec(), stride: (dims(&[1, 1])).to_vec(), offset: Dim::Const(0) },
        &[x],
    );
    let y = g.op(Op::Unary(aotgrad_ir::UnaryOp::Sin), &[v]);
    let fw = g.outputs(&[y]);
    let c = gradcheck_all(&fw, &[t64(&[0.1, 0.2, 0.3, 0.4], &[4])]);
    // Elements 1 and 2 are read twice, 0 and 3 once: every one gets a gradient.
    assert!(c.grads[0].iter().all(|v| *v != 0.0), "{:?}", c.grads[0]);
}

/// A view whose dims do not nest (strides 3 and 2 over sizes 3 and 3) yet names nine
/// distinct elements (0, 2, 3, 4, 5, 6, 7, 8, 10): the exact repeat test of
/// `aotgrad_meta::Layout` accepts it (the old nesting test refused it), and the
/// gradient scatters each element back once.
#[test]
fn non_nesting_but_distinct_as_strided_is_differentiated() {
    let op = Op::AsStrided { size: (dims(&[3, 3])).to_vec(), stride: (dims(&[3, 2])).to_vec(), offset: Dim::Const(0) };
    let c = check_view(op, contiguous(&[11]));
    // Elements 1 and 9 are not read: their gradient is zero.
    assert_eq!(c.grads[0][1], 0.0);
    assert_eq!(c.grads[0][9], 0.0);
    assert_eq!(c.grads[0].iter().filter(|v| **v != 0.0).count(), 9);
}

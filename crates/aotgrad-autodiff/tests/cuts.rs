//! [`GradCuts`]: a detached value passes no gradient to its arguments; a
//! straight-through value passes its whole gradient to its `previous` value and none
//! to its arguments. Golden joint graphs and hand-derived gradients.

mod common;

use aotgrad_autodiff::{build_joint_with_cuts, GradCuts};
use aotgrad_cpu::{interpret, CpuTensor};
use aotgrad_ir::text::print_graph;
use aotgrad_ir::{BinaryOp, DType, Dim, Op, Scalar, StaticOracle};
use common::*;
use expect_test::expect;

const F: DType = DType::F64;

/// `x * alias(x)` with the alias detached: `grad x = x * g`.
#[test]
fn detached_value_passes_no_gradient() {
    let mut g = GB::new();
    let x = g.inp("x", &[3], F);
    let a = g.op(Op::Alias, &[x]);
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, a]);
    let fw = g.outputs(&[y]);
    let cuts = GradCuts { detached: &[a], straight_through: &[] };
    let jg = build_joint_with_cuts(&fw, &[true], &[true], &cuts, &mut StaticOracle).expect("joint");
    expect![[r#"
        graph(%0: f64[3] #0 "x", %3: f64[3] #2 "tangent0") {
          %1: f64[3] #0 = alias(%0)
          %2: f64[3] #1 = mul(%0, %1)
          %4: f64[3] #3 = mul(%3, %1)
          return (%2, %4)
        }
    "#]]
    .assert_eq(&print_graph(&jg.graph));
    let (xv, gv) = ([0.5, -2.0, 3.0], [1.0, 2.0, -1.0]);
    let outs = interpret(&jg.graph, &[t64(&xv, &[3]), t64(&gv, &[3])]).expect("run");
    assert_close(&outs[1].to_vec_f64(), &[0.5, -4.0, -3.0], 1e-15);
}

/// `n = x * 2` straight through to `x`, then `n * 3`: `grad x = 3 g` (not `6 g`), plus
/// the tangent of `n` itself, unchanged.
#[test]
fn straight_through_value_passes_its_gradient_unchanged() {
    let mut g = GB::new();
    let x = g.inp("x", &[2], F);
    let w = g.inp("w", &[2], F);
    let n = g.op(Op::Binary(BinaryOp::Mul), &[x, w]);
    let y = g.op(Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(3)), &[n]);
    let fw = g.outputs(&[n, y]);
    let cuts = GradCuts { detached: &[], straight_through: &[(n, x)] };
    let jg = build_joint_with_cuts(&fw, &[true, true], &[true, true], &cuts, &mut StaticOracle).expect("joint");
    expect![[r#"
        graph(%0: f64[2] #0 "x", %1: f64[2] #1 "w", %4: f64[2] #4 "tangent0", %5: f64[2] #5 "tangent1") {
          %2: f64[2] #2 = mul(%0, %1)
          %3: f64[2] #3 = mul(%2, 3)
          %6: f64[2] #6 = mul(%5, 3)
          %7: f64[2] #7 = add(%4, %6)
          %8: f64[2] #8 = full(shape=[2], value=0.0, dtype=f64)
          return (%2, %3, %7, %8)
        }
    "#]]
    .assert_eq(&print_graph(&jg.graph));
    let ins: Vec<CpuTensor> =
        vec![t64(&[1.0, 2.0], &[2]), t64(&[5.0, 7.0], &[2]), t64(&[0.5, 0.25], &[2]), t64(&[1.0, -1.0], &[2])];
    let outs = interpret(&jg.graph, &ins).expect("run");
    // grad x = t_n + 3 t_y; w gets nothing (the mutation wrote it, unseen).
    assert_close(&outs[2].to_vec_f64(), &[3.5, -2.75], 1e-15);
    assert_close(&outs[3].to_vec_f64(), &[0.0, 0.0], 1e-15);
}

/// `as_strided` of a *detached* view of `x`: the walk to the storage root (which lets
/// `as_strided` of a view reach the root's other elements) stops at the cut, so `x`
/// gets only the gradient of the other, visible use: `y = v * x` with `v` detached
/// gives `grad x = v * g`. (The walk used to pass the detached alias and send
/// `x * g` through the `as_strided` to `x` as well.)
#[test]
fn as_strided_root_walk_stops_at_a_detached_view() {
    let mut g = GB::new();
    let x = g.inp("x", &[4], F);
    let s = g.op(Op::Slice { dim: 0, start: Dim::Const(1), end: Dim::Const(3), step: 1 }, &[x]);
    let a = g.op(Op::Alias, &[s]);
    let v = g.op(
        Op::AsStrided {
            size: (aotgrad_ir::dims![Dim::Const(4)]).to_vec(),
            stride: (aotgrad_ir::dims![Dim::Const(1)]).to_vec(),
            offset: Dim::Const(0),
        },
        &[a],
    );
    let y = g.op(Op::Binary(BinaryOp::Mul), &[v, x]);
    let fw = g.outputs(&[y]);
    let cuts = GradCuts { detached: &[a], straight_through: &[] };
    let jg = build_joint_with_cuts(&fw, &[true], &[true], &cuts, &mut StaticOracle).expect("joint");
    let (xv, gv) = ([0.5, -2.0, 3.0, 4.0], [1.0, 2.0, -1.0, 0.5]);
    let outs = interpret(&jg.graph, &[t64(&xv, &[4]), t64(&gv, &[4])]).expect("run");
    // y = x * x elementwise in value, but one factor is detached: grad x = x * g.
    assert_close(&outs[1].to_vec_f64(), &[0.5, -4.0, -3.0, 2.0], 1e-15);
}

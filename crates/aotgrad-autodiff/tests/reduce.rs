//! Gradient checks of the reduction rules.

mod common;

use aotgrad_ir::{DType, Op, ReduceOp};
use common::*;
use proptest::prelude::*;

const F: DType = DType::F64;
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Amin];

fn reduce_graph(op: ReduceOp, shape: &[usize], dims: Vec<usize>, keepdim: bool) -> aotgrad_ir::Graph {
    let mut g = GB::new();
    let x = g.inp("x", shape, F);
    let y = g.op(Op::Reduce { op, dims, keepdim }, &[x]);
    g.outputs(&[y])
}

#[test]
fn every_reduction_over_dim_sets() {
    let cases: [(&[usize], Vec<usize>); 6] = [
        (&[2, 3, 4], vec![1]),
        (&[2, 3, 4], vec![0, 2]),
        (&[2, 3, 4], vec![]),
        (&[5], vec![0]),
        (&[], vec![]),
        (&[3, 1], vec![1]),
    ];
    for op in OPS {
        for (k, (shape, dims)) in cases.iter().enumerate() {
            for keepdim in [false, true] {
                let fw = reduce_graph(op, shape, dims.clone(), keepdim);
                let n = shape.iter().product();
                // Distinct values: amax/amin have a unique winner away from ties.
                let vals = Rng(k as u64 * 7 + op as u64).vec(n, -2.0, 2.0);
                gradcheck_all(&fw, &[t64(&vals, shape)]);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn reductions_on_random_shapes(
        shape in prop::collection::vec(1usize..4, 0..4),
        mask in any::<u8>(),
        op in 0usize..4,
        keepdim in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dims: Vec<usize> = (0..shape.len()).filter(|d| mask & (1 << d) != 0).collect();
        let fw = reduce_graph(OPS[op], &shape, dims, keepdim);
        let n = shape.iter().product();
        gradcheck_all(&fw, &[t64(&Rng(seed).vec(n, -2.0, 2.0), &shape)]);
    }
}

#[test]
fn amax_and_amin_split_the_gradient_among_ties() {
    for op in [ReduceOp::Amax, ReduceOp::Amin] {
        let fw = reduce_graph(op, &[2, 3], vec![1], false);
        let vals =
            if op == ReduceOp::Amax { [1.0, 3.0, 3.0, 2.0, 2.0, 0.0] } else { [-1.0, -3.0, -3.0, -2.0, -2.0, 0.0] };
        let c = run_joint(&fw, &[t64(&vals, &[2, 3])], &[true], &[true]);
        let t = &c.tangents[0];
        assert_close(&c.grads[0], &[0.0, t[0] / 2.0, t[0] / 2.0, t[1] / 2.0, t[1] / 2.0, 0.0], 1e-15);
    }
    // Over all dims with three ties.
    let fw = reduce_graph(ReduceOp::Amax, &[4], vec![], false);
    let c = run_joint(&fw, &[t64(&[5.0, 5.0, 1.0, 5.0], &[4])], &[true], &[true]);
    let t = c.tangents[0][0];
    assert_close(&c.grads[0], &[t / 3.0, t / 3.0, 0.0, t / 3.0], 1e-15);
}

#[test]
fn mean_divides_by_the_reduced_count() {
    let fw = reduce_graph(ReduceOp::Mean, &[2, 3], vec![0], true);
    let c = run_joint(&fw, &[t64(&[0.0; 6], &[2, 3])], &[true], &[true]);
    let t = &c.tangents[0];
    assert_close(&c.grads[0], &[t[0] / 2.0, t[1] / 2.0, t[2] / 2.0, t[0] / 2.0, t[1] / 2.0, t[2] / 2.0], 1e-15);
}

#[test]
fn argmax_and_integer_sums_pass_no_gradient() {
    let mut g = GB::new();
    let x = g.inp("x", &[2, 3], F);
    let a = g.op(Op::ArgMax { dim: 1, keepdim: false }, &[x]);
    let b = g.op(Op::ArgMin { dim: 0, keepdim: true }, &[x]);
    let k = g.inp("k", &[4], DType::I32);
    let s = g.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[k]);
    let fw = g.outputs(&[a, b, s]);
    let jg = aotgrad_autodiff::build_joint(&fw, &[true, true], &[true, true, true]).unwrap();
    assert!(jg.tangent_outputs.is_empty(), "integer outputs get no tangents");
    assert_eq!(jg.grad_primals, vec![0], "the integer input gets no gradient");
    // x's gradient is zeros.
    let ins = [
        t64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]),
        aotgrad_cpu::CpuTensor::from_i64(&[1, 2, 3, 4], &[4], DType::I32).unwrap(),
    ];
    let outs = aotgrad_cpu::interpret(&jg.graph, &ins).unwrap();
    assert_eq!(outs[3].to_vec_f64(), vec![0.0; 6]);
    assert_eq!(outs[3].shape(), vec![2, 3]);
}

#[test]
fn cumsum_and_sort_by_argsort_pass_finite_differences() {
    let cases: [(&[usize], usize); 5] = [(&[2, 3, 4], 0), (&[2, 3, 4], 1), (&[2, 3, 4], 2), (&[5], 0), (&[], 0)];
    for (k, (shape, dim)) in cases.iter().enumerate() {
        let n = shape.iter().product();
        let vals = Rng(40 + k as u64).vec(n, -2.0, 2.0);
        let mut g = GB::new();
        let x = g.inp("x", shape, F);
        let y = g.op(Op::Cumsum(*dim), &[x]);
        gradcheck_all(&g.outputs(&[y]), &[t64(&vals, shape)]);
        // sort(x) = gather(x, dim, argsort(x)), both directions (distinct values: no ties).
        for descending in [false, true] {
            let mut g = GB::new();
            let x = g.inp("x", shape, F);
            let idx = g.op(Op::Argsort { dim: *dim, descending }, &[x]);
            let y = if shape.is_empty() { x } else { g.op(Op::Gather(*dim), &[x, idx]) };
            let z = g.op(Op::Unary(aotgrad_ir::UnaryOp::Sin), &[y]);
            gradcheck_all(&g.outputs(&[z]), &[t64(&vals, shape)]);
        }
    }
}

//! Differential property test of `simplify`: random functional programs (built with
//! shape inference from a small op set chosen to exercise every rewrite rule) are run
//! with the reference interpreter before and after simplification on the same random
//! inputs. Results must agree (within a tolerance for float reassociation), with the
//! same metadata and the same storage sharing between outputs and inputs; the node
//! count never grows.

mod common;

use aotgrad_ir::{BinaryOp, DType, Dim, Graph, Op, ReduceOp, Scalar, UnaryOp, ValueId};
use aotgrad_partition::{simplify_with_stats, SimplifyLimits};
use common::{random_inputs, run, vals, B};
use proptest::prelude::*;

const SHAPES: [&[usize]; 5] = [&[2, 3], &[3], &[1, 3], &[2, 1, 3], &[]];
const DTYPES: [DType; 4] = [DType::F64, DType::F64, DType::F32, DType::I64];

/// One program step: an op kind and raw choices, interpreted against the values so far.
type Step = (u8, u16, u16, u8);

fn scalar(p: u8) -> Scalar {
    [Scalar::Float(1.0), Scalar::Int(1), Scalar::Float(0.0), Scalar::Int(0), Scalar::Float(-0.0), Scalar::Float(2.0)]
        [p as usize % 6]
}

/// Apply one step; `None` when shape inference rejects it (the step is skipped).
fn step(b: &mut B, vals: &[ValueId], (kind, a, c, p): Step) -> Option<ValueId> {
    let x = vals[a as usize % vals.len()];
    let y = vals[c as usize % vals.len()];
    let m = b.meta(x);
    let rank = m.rank();
    let un = |b: &mut B, u: UnaryOp, v: ValueId| b.try_op(Op::Unary(u), &[v]);
    let float = m.dtype.is_float();
    match kind % 28 {
        0 => un(b, UnaryOp::Neg, x),
        1 => un(b, UnaryOp::Abs, x),
        2 => un(b, UnaryOp::Tanh, x),
        3 => {
            let c = b.try_op(Op::Clamp { min: Some(Scalar::Float(-20.0)), max: Some(Scalar::Float(20.0)) }, &[x])?;
            let e = un(b, UnaryOp::Exp, c)?;
            un(b, UnaryOp::Log, e)
        }
        4 => {
            let ab = un(b, UnaryOp::Abs, x)?;
            let l = un(b, UnaryOp::Log, ab)?;
            un(b, UnaryOp::Exp, l)
        }
        5 => {
            let n = un(b, UnaryOp::Neg, x)?;
            un(b, UnaryOp::Neg, n)
        }
        6 => b.try_op(Op::Binary(BinaryOp::Add), &[x, y]),
        7 => b.try_op(Op::Binary(BinaryOp::Mul), &[x, y]),
        8 => b.try_op(Op::Binary(BinaryOp::Sub), &[x, y]),
        9 => b.try_op(Op::BinaryScalar(BinaryOp::Mul, scalar(p)), &[x]),
        10 => b.try_op(Op::BinaryScalar(BinaryOp::Add, scalar(p)), &[x]),
        11 => b.try_op(Op::BinaryScalar(BinaryOp::Div, scalar(p % 2)), &[x]),
        12 => b.try_op(Op::T, &[x]),
        13 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            if rank > 0 {
                perm.rotate_left(p as usize % rank);
            }
            b.try_op(Op::Permute(perm), &[x])
        }
        14 => b.try_op(Op::Transpose(0, rank.saturating_sub(1)), &[x]),
        15 => b.try_op(Op::View(aotgrad_ir::dims![m.numel()]), &[x]),
        16 => b.try_op(Op::Unsqueeze(p as usize % (rank + 1)), &[x]),
        17 => {
            let dims: Vec<usize> = (0..rank).filter(|&i| m.shape[i] == Dim::Const(1)).collect();
            b.try_op(Op::Squeeze(dims), &[x])
        }
        18 | 25 => {
            let mut shape: aotgrad_ir::Dims = aotgrad_ir::dims![Dim::Const(p as i64 % 3 + 1)];
            shape.extend(m.shape.iter().map(|d| if *d == Dim::Const(1) { Dim::Const(3) } else { d.clone() }));
            let e = b.try_op(Op::Expand(shape.clone()), &[x])?;
            if kind % 28 == 18 {
                return Some(e);
            }
            // Sum (or mean) over the new dim and every broadcast dim, maybe more.
            let mut dims: Vec<usize> = (0..shape.len()).filter(|&i| i == 0 || m.shape[i - 1] != shape[i]).collect();
            if p & 8 != 0 {
                dims = Vec::new();
            }
            let op = if float && p & 16 != 0 { ReduceOp::Mean } else { ReduceOp::Sum };
            b.try_op(Op::Reduce { op, dims, keepdim: false }, &[e])
        }
        19 | 20 => {
            let dims: Vec<usize> = (0..rank).filter(|i| p & (1 << i) != 0).collect();
            let op = if kind % 28 == 19 { ReduceOp::Sum } else { ReduceOp::Mean };
            b.try_op(Op::Reduce { op, dims, keepdim: p & 64 != 0 }, &[x])
        }
        21 => b.try_op(Op::Clone, &[x]),
        22 => b.try_op(Op::Alias, &[x]),
        // No float -> int casts: truncation would turn documented last-ulp differences
        // (`log(exp x) -> x`, reassociated sums) into differences of 1.
        23 => {
            let n = if float { 2 } else { 3 };
            b.try_op(Op::Cast([DType::F32, DType::F64, DType::I64][p as usize % n]), &[x])
        }
        24 => {
            let c = b.try_op(Op::Cast(DType::F64), &[x])?;
            b.try_op(Op::Cast(m.dtype), &[c])
        }
        26 | 27 => {
            let v = if kind % 28 == 26 { Scalar::Int(1) } else { Scalar::Int(0) };
            let f = b.try_op(Op::FullLike { value: v, dtype: None }, &[y])?;
            let op = if kind % 28 == 26 { BinaryOp::Mul } else { BinaryOp::Add };
            b.try_op(Op::Binary(op), &[x, f])
        }
        _ => None,
    }
}

fn program(inputs: &[(u8, u8)], steps: &[Step], outs: &[u16]) -> Graph {
    let mut b = B::new();
    let mut vals: Vec<ValueId> = inputs
        .iter()
        .enumerate()
        .map(|(i, (s, d))| b.input(&format!("in{i}"), SHAPES[*s as usize % SHAPES.len()], DTYPES[*d as usize % 4]))
        .collect();
    for s in steps {
        if let Some(v) = step(&mut b, &vals, *s) {
            vals.push(v);
        }
    }
    let mut outputs = vec![*vals.last().unwrap_or(&vals[0])];
    outputs.extend(outs.iter().map(|o| vals[*o as usize % vals.len()]));
    b.g.outputs = outputs;
    b.g
}

fn same_within(a: f64, b: f64) -> bool {
    common::close(a, b, 1e-4, 1e-6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn simplify_preserves_results_and_never_grows(
        inputs in prop::collection::vec((0u8..5, 0u8..4), 1..4),
        steps in prop::collection::vec((0u8..28, any::<u16>(), any::<u16>(), any::<u8>()), 1..14),
        outs in prop::collection::vec(any::<u16>(), 0..3),
        seed in any::<u64>(),
    ) {
        let g = program(&inputs, &steps, &outs);
        let (s, stats) = simplify_with_stats(&g, &SimplifyLimits::default())
            .map_err(|e| TestCaseError::fail(format!("{e}\n{g}")))?;
        prop_assert!(s.nodes.len() <= g.nodes.len(), "grew:\n{g}\n{s}");
        prop_assert_eq!(stats.nodes_after, s.nodes.len());
        let xs = random_inputs(&g, seed);
        let before = run(&g, &xs);
        let after = run(&s, &xs);
        prop_assert_eq!(before.len(), after.len(), "number of outputs\n{}\n{}", g, s);
        for (k, (p, q)) in before.iter().zip(&after).enumerate() {
            prop_assert_eq!(&p.meta, &q.meta, "output {} metadata\n{}\n{}", k, g, s);
            let (vp, vq) = (vals(p), vals(q));
            for (i, (u, v)) in vp.iter().zip(&vq).enumerate() {
                prop_assert!(same_within(*u, *v), "output {} element {}: {} vs {}\n{}\n{}", k, i, u, v, g, s);
            }
            for (l, (p2, q2)) in before.iter().zip(&after).enumerate() {
                prop_assert_eq!(p.same_storage(p2), q.same_storage(q2), "outputs {} and {} aliasing\n{}\n{}", k, l, g, s);
            }
            for (i, x) in xs.iter().enumerate() {
                prop_assert_eq!(p.same_storage(x), q.same_storage(x), "output {} and input {} aliasing\n{}\n{}", k, i, g, s);
            }
        }
    }
}

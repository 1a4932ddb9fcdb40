//! The JIT for fused pointwise bodies against the block interpreter: every op it
//! compiles, over values chosen to hit every branch of its sequences (NaN, ±inf, ±0,
//! subnormals, the thresholds of `exp`, `erf` and `tanh`, halfway cases of rounding),
//! on contiguous, broadcast (stride 0) and transposed (gathered) operands, with runs
//! of full vectors plus a masked tail and several rows per tile. The two must agree
//! bit for bit (NaNs only as NaNs): the JIT emits the interpreter's IEEE operations
//! in the same order. `AOTGRAD_CPU_ISA=avx2` runs them on the AVX2 code (CI does both);
//! on a machine without AVX2 the JIT covers nothing and the comparison is of the
//! interpreter with itself, which the tests say.

mod common;
mod differential;

use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::{BinaryOp, CmpOp, CompiledGraph, DType, Graph, Op, Scalar, TensorMeta, UnaryOp};
use differential::{input, node};

fn jit_machine() -> bool {
    let on = CpuBackend::new(1).jit_active();
    if !on {
        eprintln!("note: this machine has no AVX2 (or AOTGRAD_JIT=0): the JIT is off, nothing to compare");
    }
    on
}

/// Values hitting the special cases, then varied ones.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        1e-40,
        -1e-40,
        3.0e38,
        -3.0e38,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        88.7,
        88.73,
        -87.32,
        -87.34,
        -100.0,
        100.0,
        3.91,
        3.93,
        -3.93,
        0.124,
        0.126,
        -0.124,
        19.9,
        20.1,
        -20.1,
        1e-8,
        0.49999997,
        8_388_609.0,
        -7.25,
        12.0,
    ];
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            if i % 3 == 0 && i / 3 < special.len() {
                special[(i / 3 + seed as usize) % special.len()]
            } else {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 24.0
            }
        })
        .collect()
}

fn tensor(meta: &TensorMeta, seed: u64) -> CpuTensor {
    let shape = meta.concrete_shape().unwrap();
    let strides = meta.concrete_strides().unwrap();
    let len = shape.iter().zip(&strides).map(|(s, st)| (s - 1) * st).sum::<usize>() + 1;
    let base = CpuTensor::from_f64(&values(len, seed), &[len], DType::F32).unwrap();
    common::strided(&base, &shape, &strides, 0)
}

/// Compile `g` with and without the JIT; the JIT must cover every pointwise kernel
/// (on a JIT machine) and both must return the same bits.
fn same(g: &Graph, inputs: &[CpuTensor], what: &str) {
    same_covered(g, inputs, what, true)
}

/// [`same`], with the JIT required to cover every kernel only when `covered`.
fn same_covered(g: &Graph, inputs: &[CpuTensor], what: &str, covered: bool) {
    let jit = CpuBackend::new(1).compile_graph(g).unwrap();
    let interp = CpuBackend::new(1).jit(false).compile_graph(g).unwrap();
    if jit_machine() && covered {
        assert!(jit.wait_for_jit(std::time::Duration::from_secs(20)), "{what}: the JIT worker did not finish");
        let (compiled, total) = jit.jit_kernels().expect("a static plan");
        assert_eq!(compiled, total, "{what}: {compiled} of {total} pointwise kernels compiled");
        assert!(total > 0, "{what}: no pointwise kernel");
    }
    let a = jit.run(inputs).unwrap();
    let b = interp.run(inputs).unwrap();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.meta, y.meta);
        for (k, (p, q)) in x.to_vec_f64().iter().zip(y.to_vec_f64()).enumerate() {
            let equal = (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits();
            assert!(equal, "{what}: output {i} element {k}: jit {p:e}, interpreter {q:e}");
        }
    }
}

/// Layouts of a [3, 37] operand: contiguous, transposed (a gather of stride 3), a
/// row broadcast along dim 0 and a column broadcast along dim 1.
fn layouts() -> Vec<(&'static str, TensorMeta)> {
    vec![
        ("contiguous", common::meta(&[3, 37], &[37, 1], 0, DType::F32)),
        ("transposed", common::meta(&[3, 37], &[1, 3], 0, DType::F32)),
        ("row broadcast", common::meta(&[3, 37], &[0, 1], 0, DType::F32)),
        ("column broadcast", common::meta(&[3, 37], &[1, 0], 0, DType::F32)),
    ]
}

fn unary_graph(op: Op, m: &TensorMeta) -> Graph {
    let mut g = Graph::new();
    let x = input(&mut g, "x", m.clone());
    // `+ 0.0` keeps the result a fresh buffer even for ops that would be copies.
    let y = node(&mut g, op, &[x]);
    let z = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.0)), &[y]);
    g.outputs = vec![z];
    g
}

#[test]
fn unary_ops_match_the_interpreter_bit_for_bit() {
    let ops = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Reciprocal,
        UnaryOp::Sign,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
    ];
    for (lname, m) in layouts() {
        for (s, op) in ops.iter().enumerate() {
            let g = unary_graph(Op::Unary(*op), &m);
            same(&g, &[tensor(&m, s as u64)], &format!("{op:?} over a {lname} operand"));
        }
    }
}

#[test]
fn binary_scalar_compare_where_clamp_and_rounding_match_bit_for_bit() {
    let m = &layouts()[0].1;
    let mut cases: Vec<(String, Op)> = Vec::new();
    for b in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum] {
        for c in [0.0, -2.5, 3.0, f64::NAN] {
            cases.push((format!("{b:?} {c}"), Op::BinaryScalar(b, Scalar::Float(c))));
        }
    }
    for c in [1.0, 2.0, -1.0] {
        cases.push((format!("pow {c}"), Op::BinaryScalar(BinaryOp::Pow, Scalar::Float(c))));
    }
    for c in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
        cases.push((format!("{c:?} 0.5"), Op::CompareScalar(c, Scalar::Float(0.5))));
    }
    for (lo, hi) in [(Some(-1.0), Some(2.0)), (Some(0.0), None), (None, Some(0.25))] {
        cases.push((
            format!("clamp {lo:?} {hi:?}"),
            Op::Clamp { min: lo.map(Scalar::Float), max: hi.map(Scalar::Float) },
        ));
    }
    for (name, op) in cases {
        let mut g = Graph::new();
        let x = input(&mut g, "x", m.clone());
        let y = node(&mut g, op, &[x]);
        let y = if g.meta_of(y).unwrap().dtype == DType::Bool { node(&mut g, Op::Cast(DType::F32), &[y]) } else { y };
        let z = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.0)), &[y]);
        g.outputs = vec![z];
        same(&g, &[tensor(m, 7)], &name);
    }
    // Through f16 and back (a rounding inside the f32 body).
    let mut g = Graph::new();
    let x = input(&mut g, "x", m.clone());
    let h = node(&mut g, Op::Cast(DType::F16), &[x]);
    let f = node(&mut g, Op::Cast(DType::F32), &[h]);
    let z = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)), &[f]);
    g.outputs = vec![z];
    same(&g, &[tensor(m, 3)], "f16 rounding");
}

#[test]
fn two_operand_ops_over_every_pair_of_layouts() {
    for (an, am) in layouts() {
        for (bn, bm) in layouts() {
            let ops: Vec<Op> = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum]
                .into_iter()
                .map(Op::Binary)
                .chain([Op::Compare(CmpOp::Lt), Op::Compare(CmpOp::Ne)])
                .collect();
            for op in ops {
                let mut g = Graph::new();
                let x = input(&mut g, "x", am.clone());
                let y = input(&mut g, "y", bm.clone());
                let r = node(&mut g, op.clone(), &[x, y]);
                let r = if g.meta_of(r).unwrap().dtype == DType::Bool {
                    // where(x < y, x, y) exercises the select too.
                    node(&mut g, Op::Where, &[r, x, y])
                } else {
                    r
                };
                let z = node(&mut g, Op::Unary(UnaryOp::Neg), &[r]);
                g.outputs = vec![z];
                same(&g, &[tensor(&am, 1), tensor(&bm, 2)], &format!("{} of {an} and {bn}", op.name()));
            }
        }
    }
}

#[test]
fn constants_on_the_left_and_multi_output_bodies() {
    // `2 - x` (a constant first operand), `max(full, x)`, and two stores of one body.
    let m = &layouts()[1].1;
    let mut g = Graph::new();
    let x = input(&mut g, "x", m.clone());
    let two = node(&mut g, Op::FullLike { value: Scalar::Float(2.0), dtype: None }, &[x]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[two, x]);
    let e = node(&mut g, Op::Binary(BinaryOp::Maximum), &[two, d]);
    let f = node(&mut g, Op::Unary(UnaryOp::Exp), &[e]);
    g.outputs = vec![e, f];
    same(&g, &[tensor(m, 11)], "constants on the left, two outputs");
}

#[test]
fn long_runs_many_rows_and_many_operands() {
    // A [7, 1000] space (62 full vectors and a tail per row, several rows per tile)
    // summing 12 operands: more addresses than the JIT keeps in registers.
    let m = common::meta(&[7, 1000], &[1000, 1], 0, DType::F32);
    let mut g = Graph::new();
    let xs: Vec<_> = (0..12).map(|i| input(&mut g, &format!("x{i}"), m.clone())).collect();
    let mut acc = xs[0];
    for x in &xs[1..] {
        acc = node(&mut g, Op::Binary(BinaryOp::Add), &[acc, *x]);
    }
    let out = node(&mut g, Op::Unary(UnaryOp::Tanh), &[acc]);
    g.outputs = vec![out, acc];
    let ins: Vec<CpuTensor> = (0..12).map(|i| tensor(&m, 20 + i)).collect();
    same(&g, &ins, "12 operands over [7, 1000]");
}

/// `op` over `dims` of `x` after a prologue (`x * 2 + 1`, or `exp(x)`), as a graph.
fn reduce_graph(m: &TensorMeta, op: aotgrad_ir::ReduceOp, dims: &[usize], exp: bool) -> Graph {
    let mut g = Graph::new();
    let x = input(&mut g, "x", m.clone());
    let p = if exp {
        node(&mut g, Op::Unary(UnaryOp::Exp), &[x])
    } else {
        let t = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(2.0)), &[x]);
        node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(1.0)), &[t])
    };
    let r = node(&mut g, Op::Reduce { op, dims: dims.to_vec(), keepdim: false }, &[p]);
    g.outputs = vec![r];
    g
}

#[test]
fn reductions_match_the_interpreter_bit_for_bit() {
    use aotgrad_ir::ReduceOp;
    // Rows shorter than a vector, of a vector and a tail, longer than a tile (512)
    // and not a multiple of 16; sums, means and extremes over the inner dim (row
    // reductions) and over the outer dim (one accumulator per column); values with
    // NaNs, infinities and zeros of both signs.
    for (rows, len) in [(6, 5), (3, 16), (4, 37), (2, 600), (3, 1000)] {
        let m = common::meta(&[rows, len], &[len, 1], 0, DType::F32);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Amin] {
            for (dims, what) in [(vec![1], "rows"), (vec![0], "columns")] {
                for exp in [false, true] {
                    let g = reduce_graph(&m, op, &dims, exp);
                    let name = format!("{} over {what} of [{rows}, {len}] (exp prologue: {exp})", op.name());
                    same_covered(&g, &[tensor(&m, rows as u64 * 31 + len as u64)], &name, covers(op));
                }
            }
        }
    }
    // Without NaNs, so that extremes and sums are numbers whose every bit is compared.
    let m = common::meta(&[5, 77], &[77, 1], 0, DType::F32);
    let clean: Vec<f64> = (0..5 * 77).map(|i| ((i as f64) * 0.37).sin() * 10.0).collect();
    let x = CpuTensor::from_f64(&clean, &[5, 77], DType::F32).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Amax, ReduceOp::Amin] {
        for dims in [vec![1], vec![0]] {
            let g = reduce_graph(&m, op, &dims, false);
            same_covered(&g, std::slice::from_ref(&x), &format!("{} clean", op.name()), covers(op));
        }
    }
}

/// Whether this machine's JIT compiles reductions `op` (AVX2 code does sums and means:
/// the interpreter's AVX2 extremes keep the first of equal signed zeros element by
/// element, which lane-wise code does not reproduce).
fn covers(op: aotgrad_ir::ReduceOp) -> bool {
    use aotgrad_ir::ReduceOp;
    CpuBackend::new(1).jit_isa() != Some("avx2") || matches!(op, ReduceOp::Sum | ReduceOp::Mean)
}

#[test]
fn softmax_and_layer_norm_row_groups_compile_every_stage() {
    // A row group's reductions and element stages all get code (but a softmax's
    // maximum on AVX2, see `covers`).
    let g = differential::softmax_graph(37, 100, DType::F32);
    let covered = covers(aotgrad_ir::ReduceOp::Amax);
    same_covered(&g, &[tensor(&g.inputs[0].meta, 5)], "softmax over 37 rows of 100", covered);
    let g = differential::layer_norm_graph(3, 9, 70);
    let ins: Vec<CpuTensor> = g.inputs.iter().enumerate().map(|(i, x)| tensor(&x.meta, 40 + i as u64)).collect();
    same(&g, &ins, "layer norm over 27 rows of 70");
}

/// `AOTGRAD_CPU_ISA=avx2` runs the AVX2 code on a machine that has AVX-512 (how CI
/// tests both paths on one machine).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_instruction_set_asked_for_is_the_one_compiled() {
    let isa = CpuBackend::new(1).jit_isa();
    eprintln!("compiled kernels: {isa:?}");
    let forced = std::env::var("AOTGRAD_CPU_ISA").is_ok_and(|v| v == "avx2");
    if forced && std::arch::is_x86_feature_detected!("avx2") && std::env::var("AOTGRAD_JIT").as_deref() != Ok("0") {
        assert_eq!(isa, Some("avx2"));
    }
    if !forced && std::arch::is_x86_feature_detected!("avx512bw") && std::env::var("AOTGRAD_JIT").as_deref() != Ok("0")
    {
        assert_eq!(isa, Some("avx512"));
    }
}

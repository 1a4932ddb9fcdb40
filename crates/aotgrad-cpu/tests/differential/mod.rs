//! The backend differential suite, shared by every backend's tests: each case builds
//! graphs of one op family over random shapes — contiguous, transposed, strided,
//! expanded (stride 0), zero-size and 0-d inputs — runs them on the reference
//! interpreter and on every backend of a [`Suite`], and requires equal metadata and
//! values within the case's explicit tolerance (scaled by the suite's `tol_scale`).
//! The compiled CPU backend's tests (`compiled.rs`) and the wgpu backend's tests
//! include this module.
#![allow(dead_code)]

use crate::common::*;
use aotgrad_cpu::{CpuTensor, ReferenceBackend, Storage};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    Backend, BinaryOp, CmpOp, CompiledGraph, DType, Dim, Graph, Op, ReduceOp, Scalar, StaticOracle, StorageId, SymId,
    TensorMeta, UnaryOp, ValueId,
};

/// The backends a suite runs, and what they support.
pub struct Suite {
    /// Backends compared with the reference interpreter, with a name for messages.
    pub backends: Vec<(String, Box<dyn Backend<CpuTensor>>)>,
    /// Whether the backends compute in f64 (cases use f32 where they do not).
    pub f64: bool,
    /// Multiplies every case's tolerance (1 for the CPU backends).
    pub tol_scale: f64,
}

impl Suite {
    /// The float dtype cases use for what they would run in f64.
    pub fn wide(&self) -> DType {
        if self.f64 {
            DType::F64
        } else {
            DType::F32
        }
    }
    /// Run `g` on the reference interpreter and on every backend; metadata must be
    /// equal and values within `tol` (relative to 1 + |reference|).
    pub fn check(&self, g: &Graph, inputs: &[CpuTensor], tol: f64) {
        let want = ReferenceBackend.compile(g).unwrap().run(inputs).expect("reference run");
        let tol = tol * self.tol_scale;
        for (name, b) in &self.backends {
            let c = b.compile(g).unwrap_or_else(|e| panic!("compile ({name}): {e}"));
            let got = c.run(inputs).unwrap_or_else(|e| panic!("run ({name}): {e}"));
            assert_eq!(got.len(), want.len());
            for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.meta, o.meta, "output {i} metadata ({name})");
                let (w, o) = (w.to_vec_f64(), o.to_vec_f64());
                assert_eq!(w.len(), o.len(), "output {i} length ({name})");
                for (k, (a, b)) in w.iter().zip(&o).enumerate() {
                    let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + a.abs());
                    assert!(ok, "output {i} element {k}: reference {a}, {name} {b}");
                }
            }
        }
    }
    /// Compile `g` on the first backend.
    pub fn compile(&self, g: &Graph) -> Box<dyn CompiledGraph<CpuTensor>> {
        self.backends[0].1.compile(g).expect("compile")
    }
}

pub fn node(g: &mut Graph, op: Op, args: &[ValueId]) -> ValueId {
    let metas: Vec<TensorMeta> = args.iter().map(|a| g.meta_of(*a).unwrap().clone()).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let meta = infer(&op, &refs, &mut StaticOracle).unwrap_or_else(|e| panic!("infer {}: {e}", op.name()));
    let fresh = g.next_storage();
    g.add_node(op, args.to_vec(), meta, fresh, None)
}

pub fn input(g: &mut Graph, name: &str, meta: TensorMeta) -> ValueId {
    let s = StorageId(g.inputs.len() as u32);
    g.add_input(name, meta, s)
}

/// A tensor with metadata `m` over a fresh storage of varied values (`lo..hi`).
pub fn tensor_for(m: &TensorMeta, seed: f64, positive: bool) -> CpuTensor {
    let shape = m.concrete_shape().unwrap();
    let strides = m.concrete_strides().unwrap();
    let off = m.concrete_offset().unwrap();
    let n = off + 1 + shape.iter().zip(&strides).map(|(s, st)| s.saturating_sub(1) * st).sum::<usize>();
    let mut v = vals(n, seed);
    if positive {
        v.iter_mut().for_each(|x| *x = x.abs() + 0.1);
    }
    let t = tf(&v, &[n], m.dtype);
    CpuTensor { storage: t.storage, meta: m.clone() }
}

pub fn m(shape: &[usize], dtype: DType) -> TensorMeta {
    TensorMeta::from_sizes(shape, dtype)
}

/// Small deterministic pseudo-random generator for shapes.
pub struct Lcg(u64);
impl Lcg {
    pub fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
    pub fn shape(&mut self) -> Vec<usize> {
        let rank = 1 + self.next(3);
        (0..rank).map(|_| 1 + self.next(7)).collect()
    }
}

/// The layouts every op family is tried on: contiguous, transposed, strided slice,
/// expanded (stride 0), zero-size and 0-d.
pub fn layouts(rng: &mut Lcg, dtype: DType) -> Vec<TensorMeta> {
    let s = rng.shape();
    let mut v = vec![m(&s, dtype)];
    if s.len() >= 2 {
        let r = s.len();
        let mut t = m(&s, dtype);
        t.shape.swap(r - 2, r - 1);
        t.strides.swap(r - 2, r - 1);
        v.push(t);
    }
    // Every other element of a longer buffer, at an offset.
    let mut sl = m(&s, dtype);
    let n = s.len();
    sl.strides = sl.strides.iter().map(|d| Dim::from(d.as_const().unwrap() as usize * 2)).collect();
    sl.offset = Dim::from(3usize);
    v.push(sl);
    let mut ex = m(&s, dtype);
    ex.strides[0] = Dim::from(0usize);
    v.push(ex);
    let _ = n;
    v.push(m(&[0, 3], dtype));
    v.push(m(&[], dtype));
    v
}

/// A softmax over the last dim of `[rows, len]`.
pub fn softmax_graph(rows: usize, len: usize, dtype: DType) -> Graph {
    let mut g = Graph::new();
    let xm = m(&[rows, len], dtype);
    let x = input(&mut g, "x", xm);
    let mx = node(&mut g, Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: true }, &[x]);
    let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, mx]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[e]);
    let p = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
    g.outputs = vec![p];
    g
}

/// A layer norm over the last dim of `[b, rows, len]` returning what training saves:
/// the result, the mean (without keepdim, viewed back) and the reciprocal deviation.
pub fn layer_norm_graph(b: usize, rows: usize, len: usize) -> Graph {
    let mut g = Graph::new();
    let xm = m(&[b, rows, len], DType::F32);
    let x0 = input(&mut g, "x", xm);
    let w = input(&mut g, "w", m(&[len], DType::F32));
    let bias = input(&mut g, "b", m(&[len], DType::F32));
    let x = node(&mut g, Op::Unary(UnaryOp::Tanh), &[x0]);
    let mean = node(&mut g, Op::Reduce { op: ReduceOp::Mean, dims: vec![2], keepdim: false }, &[x]);
    let mean_k = node(&mut g, Op::Unsqueeze(2), &[mean]);
    let xc = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, mean_k]);
    let sq = node(&mut g, Op::Binary(BinaryOp::Mul), &[xc, xc]);
    let var = node(&mut g, Op::Reduce { op: ReduceOp::Mean, dims: vec![2], keepdim: true }, &[sq]);
    let ve = node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(1e-5)), &[var]);
    let rs = node(&mut g, Op::Unary(UnaryOp::Rsqrt), &[ve]);
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[xc, rs]);
    let yw = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, w]);
    let out = node(&mut g, Op::Binary(BinaryOp::Add), &[yw, bias]);
    g.outputs = vec![out, mean, rs];
    g
}

pub fn pointwise_graph() -> Graph {
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[4, 8], DType::F32));
    let y = input(&mut g, "y", m(&[8], DType::F32));
    let a = node(&mut g, Op::Unary(UnaryOp::Sin), &[x]);
    let b = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Int(2)), &[a]);
    let c = node(&mut g, Op::Binary(BinaryOp::Add), &[b, y]);
    let d = node(&mut g, Op::Unary(UnaryOp::Relu), &[c]);
    g.outputs = vec![d];
    g
}

pub fn unary_ops_on_every_layout(suite: &Suite) {
    let mut rng = Lcg(1);
    for op in UnaryOp::ALL {
        for l in layouts(&mut rng, DType::F32) {
            let mut g = Graph::new();
            let x = input(&mut g, "x", l.clone());
            let y = node(&mut g, Op::Unary(op), &[x]);
            let z = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.5)), &[y]);
            g.outputs = vec![z];
            let positive = matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal);
            suite.check(&g, &[tensor_for(&l, 0.3, positive)], 2e-6);
        }
    }
}

pub fn binary_compare_where_with_broadcasting(suite: &Suite) {
    let mut rng = Lcg(2);
    for op in BinaryOp::ALL {
        for l in layouts(&mut rng, DType::F32) {
            // The second operand broadcasts along the leading dim.
            let mut b = l.clone();
            if b.rank() > 0 {
                b.shape[0] = Dim::from(1usize);
            }
            let b = TensorMeta::contiguous(b.shape.clone(), DType::F32);
            let mut g = Graph::new();
            let x = input(&mut g, "x", l.clone());
            let y = input(&mut g, "y", b.clone());
            let s = node(&mut g, Op::Binary(op), &[x, y]);
            let c = node(&mut g, Op::Compare(CmpOp::Gt), &[s, y]);
            let k = node(&mut g, Op::CompareScalar(CmpOp::Le, Scalar::Float(0.5)), &[x]);
            let w = node(&mut g, Op::Where, &[c, s, x]);
            let n = node(&mut g, Op::Unary(UnaryOp::LogicalNot), &[k]);
            let cl = node(&mut g, Op::Clamp { min: Some(Scalar::Float(-1.0)), max: Some(Scalar::Float(2.0)) }, &[w]);
            g.outputs = vec![cl, n, c];
            let pos = op == BinaryOp::Pow;
            suite.check(&g, &[tensor_for(&l, 0.1, pos), tensor_for(&b, 0.7, false)], 2e-6);
        }
    }
}

pub fn reductions_with_prologues(suite: &Suite) {
    let mut rng = Lcg(3);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Amin] {
        for l in layouts(&mut rng, DType::F32) {
            let rank = l.rank();
            let mut dim_sets: Vec<Vec<usize>> = vec![vec![]];
            if rank >= 1 {
                dim_sets.push(vec![0]);
                dim_sets.push(vec![rank - 1]);
            }
            if rank >= 3 {
                dim_sets.push(vec![0, 2]);
            }
            for dims in dim_sets {
                for keepdim in [false, true] {
                    let empty = l.concrete_shape().unwrap().contains(&0);
                    if empty && matches!(op, ReduceOp::Amax | ReduceOp::Amin) {
                        continue;
                    }
                    let mut g = Graph::new();
                    let x = input(&mut g, "x", l.clone());
                    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
                    let r = node(&mut g, Op::Reduce { op, dims: dims.clone(), keepdim }, &[e]);
                    g.outputs = vec![r];
                    suite.check(&g, &[tensor_for(&l, 0.2, false)], 1e-5);
                }
            }
        }
    }
    // Column reductions large enough that tasks split the columns (a bias gradient),
    // contiguous and transposed.
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax] {
        for shape in [vec![600, 130], vec![4, 150, 131]] {
            let rank = shape.len();
            for l in [m(&shape, DType::F32), {
                let mut t = m(&shape, DType::F32);
                t.strides.swap(rank - 2, rank - 1);
                t.strides[rank - 1] = Dim::from(shape[rank - 2]);
                t.strides[rank - 2] = Dim::from(1usize);
                if rank == 3 {
                    t.strides[0] = Dim::from(shape[1] * shape[2]);
                }
                t
            }] {
                let mut g = Graph::new();
                let x = input(&mut g, "x", l.clone());
                let e = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.5)), &[x]);
                let dims: Vec<usize> = (0..rank - 1).collect();
                let r = node(&mut g, Op::Reduce { op, dims, keepdim: false }, &[e]);
                g.outputs = vec![r];
                suite.check(&g, &[tensor_for(&l, 0.7, false)], 1e-5);
            }
        }
    }
}

pub fn softmax_like_row_and_column_chains(suite: &Suite) {
    for (shape, dim) in [(vec![4, 9], 1usize), (vec![9, 4], 0), (vec![2, 3, 5], 1)] {
        let mut g = Graph::new();
        let xm = m(&shape, DType::F32);
        let x = input(&mut g, "x", xm.clone());
        let mx = node(&mut g, Op::Reduce { op: ReduceOp::Amax, dims: vec![dim], keepdim: true }, &[x]);
        let d = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, mx]);
        let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[d]);
        let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![dim], keepdim: true }, &[e]);
        let p = node(&mut g, Op::Binary(BinaryOp::Div), &[e, s]);
        g.outputs = vec![p];
        suite.check(&g, &[tensor_for(&xm, 0.4, false)], 1e-6);
    }
}

/// Independent pointwise chains over spaces of different sizes and dtypes (an
/// optimizer's update of several parameters), some large enough to split across
/// threads, with one chain that reads another's result (which must run after it);
/// `wide` is the dtype of one of them (f64 where the backend has it).
pub fn independent_chains_of_several_tensors(wide: DType) -> Graph {
    let mut g = Graph::new();
    let mut outs = Vec::new();
    let mut first = None;
    for (i, (shape, dtype)) in [
        (vec![37usize, 5], DType::F32),
        (vec![300, 129], DType::F32),
        (vec![3], wide),
        (vec![2, 3, 4], DType::F32),
        (vec![64, 1024], DType::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let x = input(&mut g, &format!("x{i}"), m(&shape, dtype));
        let y = input(&mut g, &format!("y{i}"), m(&shape, dtype));
        let a = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.9)), &[x]);
        let b = node(&mut g, Op::Binary(BinaryOp::Mul), &[y, y]);
        let c = node(&mut g, Op::Unary(UnaryOp::Sqrt), &[b]);
        let d = node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(1e-3)), &[c]);
        let e = node(&mut g, Op::Binary(BinaryOp::Div), &[a, d]);
        let f = node(&mut g, Op::Binary(BinaryOp::Sub), &[x, e]);
        first.get_or_insert(f);
        outs.push(f);
    }
    // Reads the first chain's result over a larger space: a kernel of its own, which
    // must run after that chain.
    let first = first.expect("chains");
    let z = input(&mut g, "z", m(&[4, 37, 5], DType::F32));
    let last = node(&mut g, Op::Binary(BinaryOp::Add), &[z, first]);
    outs.push(last);
    g.outputs = outs;
    g
}

pub fn independent_chains_of_several_tensors_match(suite: &Suite) {
    let g = independent_chains_of_several_tensors(suite.wide());
    let ins: Vec<CpuTensor> =
        g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64 * 0.3, i % 2 == 1)).collect();
    suite.check(&g, &ins, 1e-6);
}

pub fn matmuls_with_transposed_operands_and_epilogues(suite: &Suite) {
    // (16, 64, 40): fewer rows than the inner dim, computed column-major and copied.
    for (n, k, mm) in [(5usize, 7usize, 3usize), (64, 33, 70), (1, 4, 1), (3, 0, 2), (16, 64, 40), (9, 100, 33)] {
        let mut g = Graph::new();
        let a = input(&mut g, "a", m(&[n, k], DType::F32));
        let bt = input(&mut g, "bt", m(&[mm, k], DType::F32));
        let bias = input(&mut g, "bias", m(&[mm], DType::F32));
        let b = node(&mut g, Op::T, &[bt]);
        let p = node(&mut g, Op::Mm, &[a, b]);
        let q = node(&mut g, Op::Binary(BinaryOp::Add), &[p, bias]);
        let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[q]);
        let pt = node(&mut g, Op::T, &[p]);
        let _ = pt;
        let p2 = node(&mut g, Op::Mm, &[a, b]);
        let p2t = node(&mut g, Op::T, &[p2]);
        let c = node(&mut g, Op::Clone, &[p2t]);
        g.outputs = vec![r, c];
        let ins: Vec<CpuTensor> =
            g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
        suite.check(&g, &ins, 1e-5);
    }
    // Operands with equal rows or columns (stride 0, as the expanded gradient of a
    // `sum`): the product's rows or columns are computed once and copied, in place of
    // the whole product; with an epilogue, a column-major output, batches, and sizes
    // where the copy splits across threads.
    for (n, k, mm, batch) in [(6usize, 5usize, 9usize, 1usize), (300, 40, 260, 1), (7, 3, 150, 2)] {
        for (rows_same, cols_same) in [(true, false), (false, true), (true, true)] {
            let mut g = Graph::new();
            let a0 = input(&mut g, "a", m(&[batch, 1, k], DType::F32));
            let b0 = input(&mut g, "b", m(&[batch, k, 1], DType::F32));
            let af = input(&mut g, "af", m(&[batch, n, k], DType::F32));
            let bf = input(&mut g, "bf", m(&[batch, k, mm], DType::F32));
            let a = if rows_same {
                node(&mut g, Op::Expand(aotgrad_ir::dims![batch.into(), n.into(), k.into()]), &[a0])
            } else {
                af
            };
            let b = if cols_same {
                node(&mut g, Op::Expand(aotgrad_ir::dims![batch.into(), k.into(), mm.into()]), &[b0])
            } else {
                bf
            };
            let (a, b) = if batch == 1 {
                (
                    node(&mut g, Op::Select { dim: 0, index: 0.into() }, &[a]),
                    node(&mut g, Op::Select { dim: 0, index: 0.into() }, &[b]),
                )
            } else {
                (a, b)
            };
            let p = node(&mut g, if batch == 1 { Op::Mm } else { Op::Bmm }, &[a, b]);
            let q = node(&mut g, Op::Unary(UnaryOp::Tanh), &[p]);
            g.outputs = vec![q];
            if batch == 1 {
                // The same product written transposed (its reader only relays it out).
                let p2 = node(&mut g, Op::Mm, &[a, b]);
                let p2t = node(&mut g, Op::T, &[p2]);
                let c = node(&mut g, Op::Clone, &[p2t]);
                g.outputs.push(c);
            }
            let ins: Vec<CpuTensor> =
                g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64 * 0.3, false)).collect();
            suite.check(&g, &ins, 1e-5);
        }
    }
    // bmm on a permuted operand.
    let mut g = Graph::new();
    let a = input(&mut g, "a", m(&[4, 6, 5], suite.wide()));
    let bb = input(&mut g, "b", m(&[4, 3, 5], suite.wide()));
    let bt = node(&mut g, Op::Transpose(1, 2), &[bb]);
    let p = node(&mut g, Op::Bmm, &[a, bt]);
    let q = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.5)), &[p]);
    g.outputs = vec![q];
    let ins: Vec<CpuTensor> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    suite.check(&g, &ins, if suite.f64 { 1e-12 } else { 1e-5 });
}

pub fn extern_ops_views_and_aliasing_outputs(suite: &Suite) {
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[4, 3], DType::F32));
    let idx = input(&mut g, "i", m(&[2], DType::I64));
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let sel = node(&mut g, Op::IndexSelect(0), &[e, idx]);
    let cat = node(&mut g, Op::Cat(0), &[sel, x]);
    let v = node(&mut g, Op::View(aotgrad_ir::dims![Dim::from(18usize)]), &[cat]);
    let xt = node(&mut g, Op::T, &[x]);
    // f64 where the backend has it, else a cast to bool (a fused bool store).
    let casted = node(&mut g, Op::Cast(if suite.f64 { DType::F64 } else { DType::Bool }), &[sel]);
    g.outputs = vec![cat, v, xt, casted];
    let xs = tensor_for(&m(&[4, 3], DType::F32), 0.5, false);
    let is = ti(&[3, 1], &[2], DType::I64);
    suite.check(&g, &[xs.clone(), is.clone()], 1e-6);
    // Outputs that are views share storage exactly as the interpreter's do.
    let outs = suite.compile(&g).run(&[xs.clone(), is]).unwrap();
    assert!(outs[0].same_storage(&outs[1]), "a view of an output shares its storage");
    assert!(outs[2].same_storage(&xs), "a view of an input is the input's storage");
    // A bad index is an error naming the op, not a panic.
    let bad = ti(&[9, 0], &[2], DType::I64);
    let err = suite.compile(&g).run(&[xs, bad]).expect_err("index out of range");
    assert!(err.to_string().contains("index_select"), "{err}");
}

/// Reductions over a copy of a pointwise value over a transposed input (the copy
/// and the value inlined into the reduction's prologue), the sum then squared:
/// `a.transpose_(2, 0); s = (a + a).clone().sum(); s * s`.
pub fn reductions_over_copies_of_transposed_values(suite: &Suite) {
    for (dims, keepdim) in [(vec![], false), (vec![0usize], false), (vec![2], true), (vec![0, 1], false)] {
        let mut g = Graph::new();
        let a = input(&mut g, "a", m(&[2, 3, 4], DType::F32));
        let t = node(&mut g, Op::Transpose(2, 0), &[a]);
        let s2 = node(&mut g, Op::Binary(BinaryOp::Add), &[t, t]);
        let c = node(&mut g, Op::Clone, &[s2]);
        let r = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: dims.clone(), keepdim }, &[c]);
        let sq = node(&mut g, Op::Binary(BinaryOp::Mul), &[r, r]);
        g.outputs = vec![sq];
        let xs = tensor_for(&m(&[2, 3, 4], DType::F32), 0.5, false);
        suite.check(&g, &[xs], 1e-5);
    }
}

/// Views of a computed value returned beside a copy of it (`m[:, 0:1]` and
/// `m.clone()`): the value must be materialized where its views read it, whether it
/// comes from a matmul (whose epilogue the copy could become), a pointwise kernel or
/// a reduction, and whichever view (`slice`, `select`, `t`, `expand`) is returned.
pub fn views_of_a_value_beside_its_copy(suite: &Suite) {
    let views: [fn(&mut Graph, ValueId) -> ValueId; 3] = [
        |g, v| node(g, Op::Slice { dim: 1, start: Dim::from(0usize), end: Dim::from(1usize), step: 1 }, &[v]),
        |g, v| node(g, Op::Select { dim: 0, index: Dim::from(1usize) }, &[v]),
        |g, v| node(g, Op::T, &[v]),
    ];
    for view in views {
        for source in ["matmul", "pointwise", "matmul+relu", "sum"] {
            let mut g = Graph::new();
            let x = input(&mut g, "x", m(&[2, 3], DType::F32));
            let w = node(&mut g, Op::View(aotgrad_ir::dims![Dim::from(3usize), Dim::from(2usize)]), &[x]);
            let v = match source {
                "matmul" => node(&mut g, Op::Mm, &[x, w]),
                "pointwise" => node(&mut g, Op::Unary(UnaryOp::Exp), &[x]),
                "matmul+relu" => {
                    let p = node(&mut g, Op::Mm, &[x, w]);
                    node(&mut g, Op::Unary(UnaryOp::Relu), &[p])
                }
                _ => {
                    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
                    let x3 =
                        node(&mut g, Op::Expand(aotgrad_ir::dims![4usize.into(), 2usize.into(), 3usize.into()]), &[e]);
                    node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x3])
                }
            };
            let out_view = view(&mut g, v);
            let copy = node(&mut g, Op::Clone, &[v]);
            g.outputs = vec![out_view, copy];
            let xs = tensor_for(&m(&[2, 3], DType::F32), 0.25, false);
            suite.check(&g, &[xs], 1e-5);
        }
    }
    // PyTorch's values for the matmul case: x = [[.1, .2, .3], [.4, .5, .6]], w = x
    // viewed [3, 2]: m = [[.22, .28], [.49, .64]], m[:, 0:1] = [[.22], [.49]].
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[2, 3], DType::F32));
    let w = node(&mut g, Op::View(aotgrad_ir::dims![Dim::from(3usize), Dim::from(2usize)]), &[x]);
    let p = node(&mut g, Op::Mm, &[x, w]);
    let s = node(&mut g, Op::Slice { dim: 1, start: Dim::from(0usize), end: Dim::from(1usize), step: 1 }, &[p]);
    let c = node(&mut g, Op::Clone, &[p]);
    g.outputs = vec![s, c];
    let xs = tf(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3], DType::F32);
    let outs = suite.compile(&g).run(&[xs]).unwrap();
    let got: Vec<f64> = outs[0].to_vec_f64();
    for (g, want) in got.iter().zip([0.22, 0.49]) {
        assert!((g - want).abs() < 1e-6, "m[:, 0:1] = {got:?}, PyTorch: [0.22, 0.49]");
    }
}

pub fn scatters_in_place_and_copying(suite: &Suite) {
    // zeros -> select_scatter x3 (in place into one buffer), and a scatter whose base
    // is still read afterwards (copied first), and one into a graph input (copied).
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[3, 4, 5], DType::F32));
    let s = input(&mut g, "s", m(&[4, 5], DType::F32));
    let z = node(&mut g, Op::FullLike { value: Scalar::Float(0.0), dtype: None }, &[x]);
    let z1 = node(&mut g, Op::Unary(UnaryOp::Exp), &[z]);
    let mut acc = z1;
    for i in 0..3usize {
        let e = node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(i as f64 + 1.0)), &[s]);
        acc = node(&mut g, Op::SelectScatter { dim: 0, index: Dim::from(i) }, &[acc, e]);
    }
    let xe = node(&mut g, Op::Unary(UnaryOp::Neg), &[x]);
    let sl = node(&mut g, Op::Slice { dim: 2, start: Dim::from(1usize), end: Dim::from(5usize), step: 2 }, &[xe]);
    let slc = node(&mut g, Op::Clone, &[sl]);
    let ss = node(
        &mut g,
        Op::SliceScatter { dim: 2, start: Dim::from(0usize), end: Dim::from(4usize), step: 2 },
        &[xe, slc],
    );
    let keep = node(&mut g, Op::Binary(BinaryOp::Add), &[xe, ss]);
    let s2 = input(&mut g, "s2", m(&[3, 5], DType::F32));
    let into_input = node(&mut g, Op::SelectScatter { dim: 1, index: Dim::from(2usize) }, &[x, s2]);
    // A matmul result scattered into a copy of a shared base: the scatter must not
    // move ahead of the copy (as a matmul epilogue would).
    let a = input(&mut g, "a", m(&[4, 6], DType::F32));
    let b = input(&mut g, "b", m(&[6, 5], DType::F32));
    let p = node(&mut g, Op::Mm, &[a, b]);
    let shared = node(&mut g, Op::BinaryScalar(BinaryOp::Add, Scalar::Float(2.0)), &[z]);
    let sc = node(&mut g, Op::SelectScatter { dim: 0, index: Dim::from(1usize) }, &[shared, p]);
    let sum = node(&mut g, Op::Binary(BinaryOp::Add), &[sc, shared]);
    g.outputs = vec![acc, keep, into_input, sum];
    let ins: Vec<CpuTensor> = g.inputs.iter().enumerate().map(|(i, x)| tensor_for(&x.meta, i as f64, false)).collect();
    let before = ins[0].to_vec_f64();
    suite.check(&g, &ins, 1e-6);
    assert_eq!(ins[0].to_vec_f64(), before, "a scatter never writes its base input");
}

pub fn dynamic_shapes_lower_per_binding(suite: &Suite) {
    let s0 = Dim::sym(SymId(0));
    let mut g = Graph::new();
    let x = input(&mut g, "x", TensorMeta::contiguous(vec![s0.clone(), Dim::from(3usize)], suite.wide()));
    let y = input(&mut g, "y", m(&[3], suite.wide()));
    let xy = node(&mut g, Op::Binary(BinaryOp::Mul), &[x, y]);
    let s = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[xy]);
    let xt = node(&mut g, Op::T, &[x]);
    let gram = node(&mut g, Op::Mm, &[xt, x]);
    g.outputs = vec![s, gram];
    for n in [1usize, 4, 7, 4] {
        let xs = tensor_for(&m(&[n, 3], suite.wide()), n as f64, false);
        let ys = tensor_for(&m(&[3], suite.wide()), 0.1, false);
        suite.check(&g, &[xs, ys], if suite.f64 { 1e-12 } else { 1e-5 });
    }
}

pub fn input_checks_match_the_interpreter(suite: &Suite) {
    let mut g = Graph::new();
    let x = input(&mut g, "x", m(&[2, 3], DType::F32));
    let y = node(&mut g, Op::Unary(UnaryOp::Neg), &[x]);
    g.outputs = vec![y];
    let c = suite.compile(&g);
    let wrong = tf(&[1.0; 6], &[3, 2], DType::F32);
    let err = c.run(&[wrong]).expect_err("wrong shape");
    assert!(err.to_string().contains("graph input 0"), "{err}");
    // A storage too short for the metadata is rejected before any kernel runs.
    let short =
        CpuTensor { storage: Storage::new(aotgrad_cpu::Buffer::F32(vec![0.0; 4])), meta: m(&[2, 3], DType::F32) };
    assert!(c.run(&[short]).is_err());
}

pub fn tiles_of_short_rows_cross_dims_and_thread_chunks(suite: &Suite) {
    // Inner dims shorter than a block are evaluated several rows at a time; these
    // shapes make tiles stop at the end of the second-innermost dim, and (at 2
    // threads, over 16K elements) start chunks in the middle of a row.
    for shape in [vec![5usize, 301, 23], vec![3, 7, 40], vec![2, 9000, 2]] {
        let (a, b, c) = (shape[0], shape[1], shape[2]);
        // A permuted input: (a, c, b) contiguous, viewed as (a, b, c).
        let mut xm = m(&[a, c, b], DType::F32);
        xm.shape.swap(1, 2);
        xm.strides.swap(1, 2);
        let bias = m(&[b, 1], DType::F32);
        let mut g = Graph::new();
        let x = input(&mut g, "x", xm.clone());
        let y = input(&mut g, "bias", bias.clone());
        let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
        let s = node(&mut g, Op::Binary(BinaryOp::Add), &[e, y]);
        let rows = node(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![2], keepdim: true }, &[s]);
        let cols = node(&mut g, Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: false }, &[s]);
        let p = node(&mut g, Op::Binary(BinaryOp::Div), &[s, rows]);
        g.outputs = vec![p, cols];
        suite.check(&g, &[tensor_for(&xm, 0.3, false), tensor_for(&bias, 0.7, true)], 1e-5);
    }
}

pub fn scans_on_every_layout(suite: &Suite) {
    let mut rng = Lcg(11);
    for dtype in [DType::F32, DType::I64] {
        for l in layouts(&mut rng, dtype) {
            for dim in 0..l.rank().max(1) {
                for op in [Op::Cumsum(dim), Op::Argsort { dim, descending: dim % 2 == 0 }] {
                    let mut g = Graph::new();
                    let x = input(&mut g, "x", l.clone());
                    let y = node(&mut g, op, &[x]);
                    g.outputs = vec![y];
                    suite.check(&g, &[tensor_for(&l, 0.7, false)], 1e-5);
                }
            }
        }
    }
}

//! Shared test helpers: a graph builder that infers metadata op by op, deterministic
//! random data, strided input tensors, and a finite-difference gradient check.
#![allow(dead_code, clippy::result_large_err)]

use aotgrad_autodiff::{build_joint, JointGraph};
use aotgrad_cpu::{execute, interpret, Buffer, CpuTensor, Storage};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    Aliasing, DType, Dim, Graph, Input, Node, Op, SourceLoc, StaticOracle, StorageId, TensorMeta, ValueId,
};
use std::collections::HashMap;

/// Builds a functional graph op by op, inferring each node's metadata.
#[derive(Default)]
pub struct GB {
    pub graph: Graph,
    metas: HashMap<ValueId, (TensorMeta, StorageId)>,
    next_v: u32,
    next_s: u32,
    pub loc: Option<SourceLoc>,
}

impl GB {
    pub fn new() -> GB {
        GB::default()
    }
    pub fn input(&mut self, name: &str, meta: TensorMeta) -> ValueId {
        let id = ValueId(self.next_v);
        self.next_v += 1;
        let storage = StorageId(self.next_s);
        self.next_s += 1;
        self.metas.insert(id, (meta.clone(), storage));
        self.graph.inputs.push(Input { id, name: name.into(), meta, storage });
        id
    }
    /// A contiguous concrete input.
    pub fn inp(&mut self, name: &str, shape: &[usize], dtype: DType) -> ValueId {
        self.input(name, TensorMeta::from_sizes(shape, dtype))
    }
    pub fn try_op(&mut self, op: Op, args: &[ValueId]) -> Result<ValueId, aotgrad_ir::ShapeError> {
        let refs: Vec<&TensorMeta> = args.iter().map(|a| &self.metas[a].0).collect();
        let meta = infer(&op, &refs, &mut StaticOracle)?;
        let storage = match op.aliasing() {
            Aliasing::Fresh => {
                self.next_s += 1;
                StorageId(self.next_s - 1)
            }
            _ => self.metas[&args[0]].1,
        };
        let out = ValueId(self.next_v);
        self.next_v += 1;
        self.metas.insert(out, (meta.clone(), storage));
        self.graph.nodes.push(Node { out, op, args: args.to_vec(), meta, storage, loc: self.loc.clone() });
        Ok(out)
    }
    pub fn op(&mut self, op: Op, args: &[ValueId]) -> ValueId {
        let name = op.name();
        self.try_op(op, args).unwrap_or_else(|e| panic!("building test graph: {name}: {e}"))
    }
    pub fn meta(&self, v: ValueId) -> &TensorMeta {
        &self.metas[&v].0
    }
    pub fn outputs(mut self, outs: &[ValueId]) -> Graph {
        self.graph.outputs = outs.to_vec();
        self.graph
    }
}

/// SplitMix64: deterministic pseudo-random numbers.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    /// Uniform in `±[lo, hi)` (away from zero).
    pub fn vec_away(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let v = self.uniform(lo, hi);
                if self.next_u64() & 1 == 0 {
                    v
                } else {
                    -v
                }
            })
            .collect()
    }
}

/// A tensor with the concrete (possibly non-contiguous) layout `meta` whose logical
/// row-major elements are `values`; storage elements outside the layout hold 0.25.
pub fn strided(values: &[f64], meta: &TensorMeta) -> CpuTensor {
    let shape = meta.concrete_shape().expect("concrete shape");
    let strides = meta.concrete_strides().expect("concrete strides");
    let off = meta.concrete_offset().expect("concrete offset");
    let n: usize = shape.iter().product();
    assert_eq!(n, values.len(), "value count for {meta}");
    let extent = meta.storage_extent().expect("extent");
    let mut buf = vec![0.25f64; extent.max(1)];
    for (k, &v) in values.iter().enumerate() {
        let mut rem = k;
        let mut pos = off;
        for d in (0..shape.len()).rev() {
            pos += (rem % shape[d]) * strides[d];
            rem /= shape[d];
        }
        buf[pos] = v;
    }
    let data = match meta.dtype {
        DType::F64 => Buffer::F64(buf),
        DType::F32 => Buffer::F32(buf.iter().map(|&x| x as f32).collect()),
        DType::I64 => Buffer::I64(buf.iter().map(|&x| x as i64).collect()),
        DType::I32 => Buffer::I32(buf.iter().map(|&x| x as i32).collect()),
        DType::Bool => Buffer::Bool(buf.iter().map(|&x| x != 0.0).collect()),
        other => panic!("strided: unsupported dtype {other}"),
    };
    CpuTensor { storage: Storage::new(data), meta: meta.clone() }
}

/// A contiguous f64 tensor.
pub fn t64(values: &[f64], shape: &[usize]) -> CpuTensor {
    CpuTensor::from_f64(values, shape, DType::F64).expect("tensor")
}

/// `op(x)` run with the CPU kernels (e.g. a view making a non-contiguous input).
pub fn run_op(op: &Op, args: &[&CpuTensor]) -> CpuTensor {
    let metas: Vec<&TensorMeta> = args.iter().map(|t| &t.meta).collect();
    let out = infer(op, &metas, &mut StaticOracle).expect("infer");
    execute(op, args, &out).expect("execute")
}

/// `sum_j sum(out_j * tangent_j)` over the outputs with tangents.
fn objective(fw: &Graph, inputs: &[CpuTensor], jg: &JointGraph, tangents: &[Vec<f64>]) -> f64 {
    let outs = interpret(fw, inputs).expect("forward run");
    jg.tangent_outputs
        .iter()
        .zip(tangents)
        .map(|(&j, t)| outs[j].to_vec_f64().iter().zip(t).map(|(a, b)| a * b).sum::<f64>())
        .sum()
}

/// The result of a gradient check.
pub struct Checked {
    pub joint: JointGraph,
    /// Gradients of `joint.grad_primals`, as f64 values.
    pub grads: Vec<Vec<f64>>,
    /// The tangents used (one per `joint.tangent_outputs`).
    pub tangents: Vec<Vec<f64>>,
    /// The joint graph's raw outputs.
    pub outs: Vec<CpuTensor>,
}

/// Build the joint graph and run it on `inputs` and random tangents (f64 values
/// converted to each output's dtype); checks the forward outputs against the forward
/// graph and the gradients' shape, dtype and layout.
pub fn run_joint(fw: &Graph, inputs: &[CpuTensor], requires_grad: &[bool], has_tangent: &[bool]) -> Checked {
    let jg = build_joint(fw, requires_grad, has_tangent).unwrap_or_else(|e| panic!("build_joint: {e}"));
    let fw_outs = interpret(fw, inputs).expect("forward run");
    let mut rng = Rng(0x5eed ^ fw.nodes.len() as u64);
    let tangents: Vec<Vec<f64>> = jg.tangent_outputs.iter().map(|&j| rng.vec(fw_outs[j].numel(), -1.0, 1.0)).collect();
    let mut all = inputs.to_vec();
    for (&j, t) in jg.tangent_outputs.iter().zip(&tangents) {
        all.push(CpuTensor::from_f64(t, &fw_outs[j].shape(), fw_outs[j].dtype()).expect("tangent"));
    }
    let outs = interpret(&jg.graph, &all)
        .unwrap_or_else(|e| panic!("joint run: {e}\n{}", aotgrad_ir::text::print_graph(&jg.graph)));
    assert_eq!(outs.len(), jg.num_fw_outputs + jg.grad_primals.len());
    for (a, b) in fw_outs.iter().zip(&outs) {
        assert_eq!(a.shape(), b.shape());
        assert_eq!(a.to_vec_f64(), b.to_vec_f64(), "forward outputs of the joint graph differ");
    }
    let mut grads = Vec::new();
    for (k, &i) in jg.grad_primals.iter().enumerate() {
        let g = &outs[jg.num_fw_outputs + k];
        let x = &inputs[i];
        assert_eq!(g.shape(), x.shape(), "gradient {k} shape");
        assert_eq!(g.dtype(), x.dtype(), "gradient {k} dtype");
        assert!(g.meta == g.meta.to_contiguous(), "gradient {k} is not contiguous: {}", g.meta);
        grads.push(g.to_vec_f64());
    }
    Checked { joint: jg, grads, tangents, outs }
}

/// [`run_joint`], then every gradient element against a central finite difference of
/// `sum(out * tangent)` (inputs in f64, eps 1e-6, tolerance 1e-6 relative).
pub fn gradcheck(fw: &Graph, inputs: &[CpuTensor], requires_grad: &[bool], has_tangent: &[bool]) -> Checked {
    let c = run_joint(fw, inputs, requires_grad, has_tangent);
    let eps = 1e-6;
    for (k, &i) in c.joint.grad_primals.iter().enumerate() {
        let x = &inputs[i];
        let gv = &c.grads[k];
        let xv = x.to_vec_f64();
        for e in 0..xv.len() {
            let at = |delta: f64| {
                let mut v = xv.clone();
                v[e] += delta;
                let mut ins = inputs.to_vec();
                ins[i] = strided(&v, &x.meta);
                objective(fw, &ins, &c.joint, &c.tangents)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            let tol = 1e-6 * (1.0 + fd.abs().max(gv[e].abs()));
            assert!(
                (fd - gv[e]).abs() <= tol,
                "input {i} element {e}: autodiff {} vs finite difference {fd}\n{}",
                gv[e],
                aotgrad_ir::text::print_graph(&c.joint.graph)
            );
        }
    }
    c
}

/// [`gradcheck`] with every input requiring grad and every output getting a tangent.
pub fn gradcheck_all(fw: &Graph, inputs: &[CpuTensor]) -> Checked {
    gradcheck(fw, inputs, &vec![true; fw.inputs.len()], &vec![true; fw.outputs.len()])
}

/// A concrete dim list.
pub fn dims(v: &[i64]) -> aotgrad_ir::Dims {
    v.iter().map(|&d| Dim::Const(d)).collect()
}

/// Assert two f64 slices agree to `tol` (relative to 1 + |b|).
pub fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

//! Shared test helpers: a graph builder that infers metadata, random inputs, and
//! comparisons of interpreter results.
#![allow(dead_code)]

use aotgrad_cpu::{interpret, CpuTensor};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{DType, Graph, Op, StaticOracle, TensorMeta, ValueId};

/// Builds a graph node by node, inferring each node's metadata.
#[derive(Default)]
pub struct B {
    pub g: Graph,
}

impl B {
    pub fn new() -> B {
        B::default()
    }
    /// A contiguous input with a fresh storage.
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> ValueId {
        let st = self.g.next_storage();
        self.g.add_input(name, TensorMeta::from_sizes(shape, dtype), st)
    }
    /// A node, or `None` when shape inference rejects it.
    pub fn try_op(&mut self, op: Op, args: &[ValueId]) -> Option<ValueId> {
        let metas: Vec<TensorMeta> = args.iter().map(|a| self.g.meta_of(*a).cloned()).collect::<Option<_>>()?;
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let meta = infer(&op, &refs, &mut StaticOracle).ok()?;
        let st = self.g.next_storage();
        Some(self.g.add_node(op, args.to_vec(), meta, st, None))
    }
    /// A node that must infer.
    pub fn op(&mut self, op: Op, args: &[ValueId]) -> ValueId {
        let name = op.name();
        self.try_op(op, args).unwrap_or_else(|| panic!("test graph: {name} rejected"))
    }
    pub fn meta(&self, v: ValueId) -> TensorMeta {
        self.g.meta_of(v).cloned().expect("defined value")
    }
}

/// A deterministic pseudo-random stream (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// A random contiguous tensor for `meta`: floats in [-2, 2), ints in [-5, 5], bools.
pub fn random_tensor(meta: &TensorMeta, rng: &mut Rng) -> CpuTensor {
    let shape = meta.concrete_shape().expect("concrete test shape");
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|_| match meta.dtype {
            d if d.is_float() => rng.uniform(-2.0, 2.0),
            DType::Bool => (rng.next_u64() % 2) as f64,
            _ => (rng.next_u64() % 11) as f64 - 5.0,
        })
        .collect();
    CpuTensor::from_f64(&data, &shape, meta.dtype).expect("tensor")
}

/// Random inputs for every input of `g`.
pub fn random_inputs(g: &Graph, seed: u64) -> Vec<CpuTensor> {
    let mut rng = Rng(seed);
    g.inputs.iter().map(|i| random_tensor(&i.meta, &mut rng)).collect()
}

/// Values of a tensor as f64, in logical order.
pub fn vals(t: &CpuTensor) -> Vec<f64> {
    t.try_to_vec_f64().expect("readable tensor")
}

/// Close within `rtol`/`atol`, NaN equal to NaN, infinities equal only to themselves.
pub fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= atol + rtol * a.abs().max(b.abs())
}

/// Assert two result lists are equal in shape and dtype and close in value.
pub fn assert_results_close(a: &[CpuTensor], b: &[CpuTensor], rtol: f64, atol: f64) {
    assert_eq!(a.len(), b.len(), "number of results");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.shape(), y.shape(), "result {k}: shape");
        assert_eq!(x.dtype(), y.dtype(), "result {k}: dtype");
        let (vx, vy) = (vals(x), vals(y));
        for (i, (p, q)) in vx.iter().zip(&vy).enumerate() {
            assert!(close(*p, *q, rtol, atol), "result {k}, element {i}: {p} vs {q}");
        }
    }
}

/// Run a graph with the reference interpreter.
pub fn run(g: &Graph, inputs: &[CpuTensor]) -> Vec<CpuTensor> {
    interpret(g, inputs).unwrap_or_else(|e| panic!("interpret failed: {e}\n{g}"))
}
pub mod joints;

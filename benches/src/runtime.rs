//! Run-time workloads for the report: the training step through `aot_function` on a
//! chosen backend, the eager forward, and micro-benchmarks of the compiled CPU
//! backend (GEMM, a fused elementwise chain) next to their baselines.

use crate::{example_inputs, Workload};
use anyhow::Result;
use aotgrad::nn::Params;
use aotgrad::{aot_function, AotConfig, AotFunction};
use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{Backend, BinaryOp, DType, Graph, Op, Scalar, StaticOracle, StorageId, TensorMeta, UnaryOp};
use aotgrad_trace::Tensor;
use std::time::Instant;

/// Median wall time of `f` in milliseconds over `runs` runs (after one warm-up run,
/// and after the JIT has compiled what the warm-up run handed it).
pub fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    aotgrad_cpu::wait_for_jit_idle(std::time::Duration::from_secs(10));
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// `sum(model(x))` compiled for training with `config`.
pub fn compiled_step(w: &Workload, config: AotConfig) -> Result<AotFunction> {
    let module = w.module.clone();
    let names: Vec<String> = module.store().params().iter().map(|(n, _)| n.clone()).collect();
    let n = names.len();
    Ok(aot_function(
        move |a: &[Tensor]| {
            let p = Params::new(names.iter().cloned().zip(a[..n].iter().cloned()));
            Ok(vec![module.forward(&p, &a[n..])?[0].sum_all()?])
        },
        config,
    )?)
}

/// One training step (forward, then backward with a unit tangent).
pub fn run_step(f: &AotFunction, inputs: &[Tensor]) -> Result<()> {
    let (outs, pending) = f.forward(inputs)?;
    pending.backward(&[outs[0].ones_like()?])?;
    Ok(())
}

/// The eager forward of `sum(model(x))` (eager mode has no autograd yet).
pub fn eager_forward(w: &Workload) -> Result<()> {
    let store = w.module.store();
    let p = Params::new(store.params().iter().map(|(n, t)| (n.clone(), t.clone())));
    let out = w.module.forward(&p, std::slice::from_ref(&w.input))?;
    out[0].sum_all()?;
    Ok(())
}

/// The example inputs of `w`.
pub fn step_inputs(w: &Workload) -> Vec<Tensor> {
    example_inputs(w)
}

/// Append `op(args)` to `g` (its metadata inferred).
pub fn node(g: &mut Graph, op: Op, args: &[aotgrad_ir::ValueId]) -> Result<aotgrad_ir::ValueId> {
    let metas: Vec<TensorMeta> =
        args.iter().map(|a| g.meta_of(*a).cloned().unwrap_or_else(|| unreachable!())).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let meta = infer(&op, &refs, &mut StaticOracle)?;
    let s = g.next_storage();
    Ok(g.add_node(op, args.to_vec(), meta, s, None))
}

/// The graph of one op over inputs laid out as `args` (each its own storage).
pub fn one_op_graph(op: Op, args: &[CpuTensor]) -> Result<Graph> {
    let mut g = Graph::new();
    let ins: Vec<_> = args
        .iter()
        .enumerate()
        .map(|(i, a)| g.add_input(format!("a{i}"), a.meta.clone(), StorageId(i as u32)))
        .collect();
    let out = node(&mut g, op, &ins)?;
    g.outputs = vec![out];
    Ok(g)
}

/// A contiguous f32 tensor of `shape` filled with `sin(0.37 i + seed)`.
pub fn filled(shape: &[usize], seed: f64) -> Result<CpuTensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i as f64) * 0.37 + seed).sin()).collect();
    Ok(CpuTensor::from_f64(&v, shape, DType::F32)?)
}

/// Median ms of the `gemm` crate called directly on row-major `a` (`m x k`) times `b`
/// (`k x n`), on a rayon pool of `threads` (the baseline the compiled kernels are
/// measured against).
fn direct_gemm_ms((m, k, n): (usize, usize, usize), a: &[f32], b: &[f32], threads: usize, runs: usize) -> Result<f64> {
    anyhow::ensure!(a.len() >= m * k && b.len() >= k * n, "operands smaller than {m}x{k} and {k}x{n}");
    let mut z = vec![0f32; m * n];
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build()?;
    median_ms(runs, || {
        pool.install(|| {
            // SAFETY: row-major m x k, k x n and m x n matrices (lengths checked above).
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    z.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        });
        Ok(())
    })
}

/// GFLOP/s of an `n x n x n` f32 matmul: through the compiled backend on `threads`
/// threads, and the `gemm` crate called directly with the same parallelism.
pub fn gemm_gflops(n: usize, threads: usize, runs: usize) -> Result<(f64, f64)> {
    let mut g = Graph::new();
    let a = g.add_input("a", TensorMeta::from_sizes(&[n, n], DType::F32), StorageId(0));
    let b = g.add_input("b", TensorMeta::from_sizes(&[n, n], DType::F32), StorageId(1));
    let c = node(&mut g, Op::Mm, &[a, b])?;
    g.outputs = vec![c];
    let compiled = CpuBackend::new(threads).compile(&g)?;
    let ins = [filled(&[n, n], 0.1)?, filled(&[n, n], 0.2)?];
    let ours = median_ms(runs, || compiled.run(&ins).map(drop).map_err(Into::into))?;
    let x = ins[0].to_vec_f64().iter().map(|v| *v as f32).collect::<Vec<f32>>();
    let y = ins[1].to_vec_f64().iter().map(|v| *v as f32).collect::<Vec<f32>>();
    let direct = direct_gemm_ms((n, n, n), &x, &y, threads, runs)?;
    let flop = 2.0 * (n as f64).powi(3);
    Ok((flop / (ours * 1e6), flop / (direct * 1e6)))
}

/// GB/s (bytes read + written) of a fused 8-op elementwise chain over `n` f32 values
/// on the compiled backend, and of a plain copy of the same bytes.
pub fn fused_chain_gbps(n: usize, threads: usize, runs: usize) -> Result<(f64, f64)> {
    let ops = vec![
        Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(1.5)),
        Op::BinaryScalar(BinaryOp::Add, Scalar::Float(0.25)),
        Op::Unary(UnaryOp::Relu),
        Op::BinaryScalar(BinaryOp::Sub, Scalar::Float(0.5)),
        Op::Unary(UnaryOp::Abs),
        Op::BinaryScalar(BinaryOp::Maximum, Scalar::Float(0.1)),
        Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.9)),
        Op::Unary(UnaryOp::Neg),
    ];
    chain_gbps(&ops, n, threads, runs)
}

/// GB/s of the chain `ops` (unary or scalar-operand ops) over `n` f32 values, and of a
/// plain copy of the same bytes.
pub fn chain_gbps(ops: &[Op], n: usize, threads: usize, runs: usize) -> Result<(f64, f64)> {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorMeta::from_sizes(&[n], DType::F32), StorageId(0));
    let mut v = x;
    for op in ops.iter().cloned() {
        v = node(&mut g, op, &[v])?;
    }
    g.outputs = vec![v];
    let compiled = CpuBackend::new(threads).compile(&g)?;
    let ins = [filled(&[n], 0.3)?];
    let ours = median_ms(runs, || compiled.run(&ins).map(drop).map_err(Into::into))?;
    // The baseline: a memcpy of the same bytes into a destination allocated once (a
    // fresh `clone` per run measured the allocator: 49 to 203 GB/s for the same size).
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let copy = median_ms(runs, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        Ok(())
    })?;
    let bytes = 2.0 * 4.0 * n as f64;
    Ok((bytes / (ours * 1e6), bytes / (copy * 1e6)))
}

/// The fixed cost of one compiled call: `sum(x * w)` over 16 elements, forward and
/// backward, at `threads` threads: `(forward µs, forward + backward µs)`, medians.
pub fn fixed_cost_us(threads: usize, calls: usize) -> Result<(f64, f64)> {
    let f = aot_function(
        |a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.sum_all()?]),
        AotConfig::default().threads(threads).no_cache(),
    )?;
    let x = Tensor::randn(&[16], DType::F32, 0)?.requires_grad(true)?;
    let w = Tensor::randn(&[16], DType::F32, 1)?.requires_grad(true)?;
    let one = Tensor::ones(&[], DType::F32)?;
    let (mut fw, mut all) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for i in 0..calls + 100 {
        let t = Instant::now();
        let (outs, back) = f.forward(&[x.clone(), w.clone()])?;
        let t1 = Instant::now();
        back.backward(std::slice::from_ref(&one))?;
        let t2 = Instant::now();
        drop(outs);
        if i >= 100 {
            fw.push((t1 - t).as_secs_f64() * 1e6);
            all.push((t2 - t).as_secs_f64() * 1e6);
        }
    }
    fw.sort_by(f64::total_cmp);
    all.sort_by(f64::total_cmp);
    Ok((fw[fw.len() / 2], all[all.len() / 2]))
}

/// One layer of the main job's CNN (its second convolution: 16 -> 32 channels, 3x3,
/// padding 1, over 14x14 images, batch 128) through the compiled backend: GFLOP/s of
/// the forward, the input gradient and the weight gradient, and of the `gemm` crate
/// on the equivalent single GEMM (`32 x 144` times `144 x 25088`), at `threads`.
pub fn conv_gflops(threads: usize, runs: usize) -> Result<([f64; 3], f64)> {
    use aotgrad_ir::Conv2dParams;
    let p = Conv2dParams { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
    let x = filled(&[128, 16, 14, 14], 0.3)?;
    let w = filled(&[32, 16, 3, 3], 0.7)?;
    let gy = filled(&[128, 32, 14, 14], 0.9)?;
    let flops = 2.0 * 128.0 * 196.0 * 32.0 * 144.0;
    let mut rates = [0.0; 3];
    let cases: [(Op, Vec<CpuTensor>); 3] = [
        (Op::Conv2d(p), vec![x.clone(), w.clone()]),
        (Op::Conv2dInputGrad { conv: p, input: [14, 14] }, vec![gy.clone(), w.clone()]),
        (Op::Conv2dWeightGrad { conv: p, kernel: [3, 3] }, vec![gy, x]),
    ];
    for (k, (op, args)) in cases.into_iter().enumerate() {
        let c = CpuBackend::new(threads).compile(&one_op_graph(op, &args)?)?;
        let t = median_ms(runs, || c.run(&args).map(drop).map_err(Into::into))?;
        rates[k] = flops / (t * 1e6);
    }
    let (m, kk, n) = (32usize, 144usize, 128 * 196);
    let a: Vec<f32> = (0..m * kk).map(|i| (i as f32).sin()).collect();
    let b: Vec<f32> = (0..kk * n).map(|i| (i as f32).cos()).collect();
    let t = direct_gemm_ms((m, kk, n), &a, &b, threads, runs)?;
    Ok((rates, flops / (t * 1e6)))
}

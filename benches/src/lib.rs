//! Workloads and pipeline stages shared by the criterion benches and the
//! `report` binary (`cargo xtask bench`).
//!
//! The two workloads are the design brief's anchors: the MLP = 4 × (Linear 512→512 +
//! GELU), batch 64; the transformer block = pre-LN, 8-head self-attention, 4× GELU
//! MLP, residuals, d_model 256, seq 128, batch 8. Both are compiled for training
//! with the loss `sum(model(x))`, parameters requiring grad.

pub mod runtime;

use anyhow::Result;
use aotgrad::nn::{Mlp, Module, Params, TransformerBlock};
use aotgrad_autodiff::{build_joint_with_cuts, GradCuts, JointGraph};
use aotgrad_functionalize::{functionalize, Functionalized, Options, TraceFacts};
use aotgrad_ir::{DType, ValueId};
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, Partitioned, SimplifyLimits,
};
use aotgrad_trace::{trace, Tensor, TraceConfig, Traced};
use std::sync::Arc;

/// A model plus an example input.
pub struct Workload {
    /// Short name.
    pub name: &'static str,
    /// The model.
    pub module: Arc<dyn Module>,
    /// Example input.
    pub input: Tensor,
    /// PyTorch's saved activation bytes with its min-cut partitioner (design brief).
    pub pytorch_saved_bytes: u64,
}

/// The benchmark MLP.
pub fn mlp() -> Result<Workload> {
    Ok(Workload {
        name: "mlp",
        module: Arc::new(Mlp::new(&[512; 5], DType::F32, 0)?),
        input: Tensor::randn(&[64, 512], DType::F32, 1)?,
        pytorch_saved_bytes: 917_504,
    })
}

/// The benchmark transformer block.
pub fn transformer() -> Result<Workload> {
    Ok(Workload {
        name: "transformer",
        module: Arc::new(TransformerBlock::new(256, 8, DType::F32, 0)?),
        input: Tensor::randn(&[8, 128, 256], DType::F32, 1)?,
        pytorch_saved_bytes: 20_987_904,
    })
}

/// A deep, narrow MLP (`layers` × (Linear 8→8 + GELU), batch 4): about 8 traced
/// nodes per layer, for measuring how compile time scales with graph size.
pub fn deep_mlp(layers: usize) -> Result<Workload> {
    Ok(Workload {
        name: "deep-mlp",
        module: Arc::new(Mlp::new(&vec![8; layers + 1], DType::F32, 0)?),
        input: Tensor::randn(&[4, 8], DType::F32, 1)?,
        pytorch_saved_bytes: 0,
    })
}

/// The graph inputs of a workload: parameters (requiring grad), then the input.
pub fn example_inputs(w: &Workload) -> Vec<Tensor> {
    let mut v: Vec<Tensor> = w.module.store().params().iter().map(|(_, t)| t.clone()).collect();
    v.push(w.input.clone());
    v
}

/// Stage 1: trace `sum(model(x))` over fake tensors.
pub fn trace_stage(w: &Workload) -> Result<Traced> {
    let names: Vec<String> = w.module.store().params().iter().map(|(n, _)| n.clone()).collect();
    let module = w.module.clone();
    let inputs = example_inputs(w);
    let n = names.len();
    let traced = trace(
        move |a: &[Tensor]| {
            let p = Params::new(names.iter().cloned().zip(a[..n].iter().cloned()));
            let out = module.forward(&p, &a[n..])?;
            Ok(vec![out[0].sum_all()?])
        },
        &inputs,
        &TraceConfig::default(),
    )?;
    Ok(traced)
}

/// Stage 2: functionalize.
pub fn functionalize_stage(t: &Traced) -> Result<Functionalized> {
    let rg = t.value_requires_grad.clone();
    let hidden = move |v: ValueId| !rg.get(v.0 as usize).copied().unwrap_or(false);
    let facts = TraceFacts {
        input_requires_grad: &t.input_requires_grad,
        output_requires_grad: &t.output_requires_grad,
        output_no_grad_view: &t.output_no_grad_view,
        output_creation: &t.output_creation,
        hidden_meta: &t.hidden_meta,
        detach_values: &t.detach_values,
        input_tracked_from: &t.input_tracked_from,
        hidden_mutation: &hidden,
    };
    let mut env = t.shape_env.clone();
    Ok(functionalize(&t.graph, &facts, &Options::default(), &mut env)?)
}

/// Stage 3: the joint graph (gradients for every parameter, a tangent for the loss),
/// honouring what autograd did not see while tracing, as the runtime does.
pub fn joint_stage(t: &Traced, f: &Functionalized) -> Result<JointGraph> {
    let rg: Vec<bool> = f.meta.inputs.iter().map(|i| i.requires_grad).collect();
    let tangents = vec![true; f.graph.outputs.len()];
    let mut env = t.shape_env.clone();
    let cuts = GradCuts { detached: &f.autograd.detached, straight_through: &f.autograd.straight_through };
    Ok(build_joint_with_cuts(&f.graph, &rg, &tangents, &cuts, &mut env)?)
}

/// Stage 4: e-graph simplification.
pub fn simplify_stage(j: &JointGraph) -> Result<JointGraph> {
    Ok(simplify_joint(j, &SimplifyLimits::default())?)
}

/// Stage 5a: the default partition.
pub fn default_stage(j: &JointGraph) -> Result<Partitioned> {
    Ok(default_partition(j)?)
}

/// Stage 5b: the min-cut partition.
pub fn mincut_stage(j: &JointGraph, budget: f64) -> Result<Partitioned> {
    Ok(min_cut_partition(j, &MinCutConfig { activation_memory_budget: budget })?)
}

/// The whole compile pipeline, trace to min-cut partition.
pub fn pipeline(w: &Workload, simplify: bool) -> Result<Partitioned> {
    let t = trace_stage(w)?;
    let f = functionalize_stage(&t)?;
    let j = joint_stage(&t, &f)?;
    let j = if simplify { simplify_stage(&j)? } else { j };
    mincut_stage(&j, 1.0)
}

/// Total FLOPs of a graph (the partitioner's cost model).
pub fn graph_flops(g: &aotgrad_ir::Graph) -> u64 {
    let mut metas = std::collections::HashMap::new();
    for i in &g.inputs {
        metas.insert(i.id, i.meta.clone());
    }
    let mut total = 0u64;
    for n in &g.nodes {
        let args: Vec<&aotgrad_ir::TensorMeta> = n.args.iter().filter_map(|a| metas.get(a)).collect();
        total = total.saturating_add(aotgrad_partition::cost::flops_of(&n.op, &args, &n.meta));
        metas.insert(n.out, n.meta.clone());
    }
    total
}

/// A pathological program shape for compile scaling: `view` (a chain of `n` views and
/// transposes), `chain` (`n` ops of matmul → softmax → relu), `mixed` (`n` ops of
/// matmul → transpose → add a weight → softmax → relu, with gradients for both
/// weights), `fanout` (one input feeding `n / 2` scaled copies summed up). Returns the
/// compiled function (on one thread) and its inputs; `train` makes the input (and for
/// `mixed` the weights) require grad (the training path).
pub fn pathological(kind: &str, n: usize, train: bool) -> Result<(aotgrad::AotFunction, Vec<Tensor>)> {
    pathological_with(kind, n, train, aotgrad::AotConfig::default().threads(1))
}

/// The program behind [`pathological`]: `kind` at about `n` user ops over the inputs of
/// [`pathological_inputs`] (`a[0]` the input, then the weights).
pub fn pathological_program(kind: &str, n: usize, a: &[Tensor]) -> aotgrad_trace::Result<Vec<Tensor>> {
    let mut x = a[0].clone();
    match kind {
        "view" => {
            for i in 0..n {
                x = if i % 2 == 0 { x.view(&[4, 4])? } else { x.transpose(0, 1)? };
            }
            Ok(vec![x.mul(2.0)?])
        }
        "chain" => {
            for _ in 0..n / 3 {
                x = x.matmul(&a[1])?.softmax(-1)?.relu()?;
            }
            Ok(vec![x.sum_all()?])
        }
        "mixed" => {
            // Square shapes keep the transpose valid; both weights take gradients, so the
            // backward reads the (transposed) activations of every step.
            for _ in 0..n / 5 {
                x = x.matmul(&a[1])?.transpose(0, 1)?.add(&a[2])?.softmax(-1)?.relu()?;
            }
            Ok(vec![x.sum_all()?])
        }
        _ => {
            let mut acc = x.mul(1.0)?;
            for i in 0..n / 2 {
                acc = acc.add(&x.mul(i as f64)?)?;
            }
            Ok(vec![acc.sum_all()?])
        }
    }
}

/// The inputs of [`pathological_program`]: a 4×4 input (requiring grad with `train`),
/// a 4×4 weight, and for `mixed` a 4×4 bias; `mixed` with `train` makes both weights
/// require grad as well.
pub fn pathological_inputs(kind: &str, train: bool) -> Result<Vec<Tensor>> {
    let x = Tensor::randn(&[4, 4], DType::F32, 0)?;
    let w = Tensor::randn(&[4, 4], DType::F32, 1)?;
    let mut v = vec![x, w];
    if kind == "mixed" {
        v.push(Tensor::randn(&[4, 4], DType::F32, 2)?);
    }
    if train {
        let weights = if kind == "mixed" { v.len() } else { 1 };
        for t in &v[..weights] {
            t.set_requires_grad(true)?;
        }
    }
    Ok(v)
}

/// [`pathological`] compiled with `config`.
pub fn pathological_with(
    kind: &str,
    n: usize,
    train: bool,
    config: aotgrad::AotConfig,
) -> Result<(aotgrad::AotFunction, Vec<Tensor>)> {
    let k = kind.to_string();
    let f = move |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(pathological_program(&k, n, a)?) };
    let inputs = pathological_inputs(kind, train)?;
    Ok((aotgrad::aot_function(f, config)?, inputs))
}

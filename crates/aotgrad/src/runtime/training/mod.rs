//! The training path: joint graph, partition, compiled forward and backward.
//!
//! At compile time the functional graph (outputs: updated inputs, user outputs,
//! intermediate bases) is differentiated into a joint graph with AOTAutograd's
//! conventions — tangents only for outputs that require grad and are not aliases (an
//! alias's gradient reaches its base: an intermediate base output, another output, or
//! an input directly), plus updated inputs that require grad — and partitioned into a
//! forward graph (returning the saved values too) and a backward graph.
//!
//! At run time [`PendingBackward::backward`] turns the gradients of the user's outputs
//! into tangents (scattering the gradient of every alias output into its base), runs
//! the backward graph, and maps the gradients of graph inputs back to the caller's
//! arguments (through synthetic bases and duplicates).

use super::{concrete, traced_input, Arg, Bindings, Entry};
use crate::error::{Error, Result};
use aotgrad_autodiff::{build_joint_with_oracle, JointGraph};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{CompiledGraph, TensorMeta};
use aotgrad_meta::{ArgSlot, OutputKind};
use aotgrad_partition::{
    default_partition, min_cut_partition, simplify_joint, MinCutConfig, Partitioned, SimplifyLimits,
};
use aotgrad_trace::{NoGradGuard, ShapeEnv, Tensor};
use std::sync::{Arc, Mutex};

/// Which partitioner splits the joint graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Partitioner {
    /// Save every forward value the backward needs.
    Default,
    /// Min-cut rematerialization with an activation memory budget in `[0, 1]`.
    MinCut {
        /// 1 = the min-cut optimum; 0 = save as little as possible.
        activation_memory_budget: f64,
    },
}

impl Default for Partitioner {
    fn default() -> Self {
        Partitioner::MinCut { activation_memory_budget: 1.0 }
    }
}

/// The compiled training artifacts of one entry.
pub(crate) struct TrainingParts {
    pub joint: JointGraph,
    pub part: Partitioned,
    pub fw: Box<dyn CompiledGraph<CpuTensor>>,
    pub bw: Box<dyn CompiledGraph<CpuTensor>>,
}

/// Whether graph input `g` requires grad (a synthetic base does if a member does).
fn graph_input_requires_grad(entry_fz: &aotgrad_functionalize::Functionalized, g: usize) -> bool {
    let conv = &entry_fz.convention;
    conv.args.iter().enumerate().any(|(k, slot)| {
        let here = match slot {
            ArgSlot::Input(i) => *i == g,
            ArgSlot::ViewOfBase { base } => conv.bases[*base].input == g,
            _ => false,
        };
        here && entry_fz.meta.inputs[k].requires_grad
    })
}

/// Differentiate, partition and compile.
pub(crate) fn compile_training(
    fz: &aotgrad_functionalize::Functionalized,
    env: &mut ShapeEnv,
    partitioner: &Partitioner,
    simplify: bool,
    backend: &dyn aotgrad_ir::Backend<CpuTensor>,
) -> Result<TrainingParts> {
    let meta = &fz.meta;
    let n_in = fz.graph.inputs.len();
    let requires_grad: Vec<bool> = (0..n_in).map(|g| graph_input_requires_grad(fz, g)).collect();
    let float = |m: &TensorMeta| m.dtype.is_float();
    let mut has_tangent = Vec::with_capacity(meta.num_graph_outputs());
    for &g in &meta.mutated_inputs {
        let hidden = meta.inputs.iter().enumerate().any(|(k, i)| {
            i.mutations_hidden_from_autograd && matches!(fz.convention.args[k], ArgSlot::Input(x) if x == g)
        });
        has_tangent.push(requires_grad[g] && !hidden && float(&fz.graph.inputs[g].meta));
    }
    for o in &meta.outputs {
        has_tangent.push(o.kind == OutputKind::NonAlias && o.requires_grad && float(&o.meta));
    }
    for b in 0..meta.num_intermediate_bases {
        let v = fz.graph.outputs[meta.intermediate_base_index(b)];
        let m = fz.graph.meta_of(v).ok_or_else(|| Error::Internal("intermediate base without meta".into()))?;
        has_tangent.push(float(m));
    }
    let joint = {
        let _span = tracing::debug_span!("joint").entered();
        build_joint_with_oracle(&fz.graph, &requires_grad, &has_tangent, env)?
    };
    let joint = if simplify {
        let _span = tracing::debug_span!("simplify").entered();
        simplify_joint(&joint, &SimplifyLimits::default())?
    } else {
        joint
    };
    let part = {
        let _span = tracing::debug_span!("partition").entered();
        match partitioner {
            Partitioner::Default => default_partition(&joint)?,
            Partitioner::MinCut { activation_memory_budget } => {
                min_cut_partition(&joint, &MinCutConfig { activation_memory_budget: *activation_memory_budget })?
            }
        }
    };
    tracing::debug!(target: "aotgrad::partition", "{}", part.report);
    let fw = backend.compile(&part.forward)?;
    let bw = backend.compile(&part.backward)?;
    Ok(TrainingParts { joint, part, fw, bw })
}

/// What the backward of one forward call needs.
pub struct PendingBackward {
    pub(crate) entry: Arc<Entry>,
    pub(crate) saved: Vec<CpuTensor>,
    pub(crate) args: Vec<Arg>,
    /// Caller input metadata at call time (before metadata mutations), per traced input.
    pub(crate) input_metas: Vec<TensorMeta>,
    pub(crate) outputs: Vec<Tensor>,
    pub(crate) env: Bindings,
    pub(crate) used: Mutex<bool>,
}

fn add(acc: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *acc = Some(match acc.take() {
        None => g,
        Some(a) => a.add(&g)?,
    });
    Ok(())
}

fn concrete_dims(m: &TensorMeta) -> (Vec<usize>, Vec<usize>, usize) {
    (m.concrete_shape().unwrap_or_default(), m.concrete_strides().unwrap_or_default(), m.concrete_offset().unwrap_or(0))
}

/// Scatter `g` (laid out as view `view` of a storage) into a fresh tensor laid out as
/// `target` over the same storage: elements of `target` not covered by `view` get 0.
fn storage_scatter(g: &Tensor, view: &TensorMeta, target: &TensorMeta) -> Result<Tensor> {
    let (vs, vst, vo) = concrete_dims(view);
    let (ts, tst, to) = concrete_dims(target);
    let ext = |s: &[usize], st: &[usize], o: usize| {
        if s.contains(&0) {
            o
        } else {
            o + s.iter().zip(st).map(|(a, b)| (a - 1) * b).sum::<usize>() + 1
        }
    };
    let lo = vo.min(to);
    let hi = ext(&vs, &vst, vo).max(ext(&ts, &tst, to)).max(lo);
    let image = Tensor::zeros(&[hi - lo], g.dtype())?;
    let image = image.as_strided_scatter(&g.contiguous()?, &vs, &vst, vo - lo)?;
    Ok(image.as_strided(&ts, &tst, to - lo)?.clone_tensor()?)
}

impl PendingBackward {
    /// Run the backward for gradients of the user outputs (one per output, in order;
    /// outputs that do not require grad take any tensor of their shape, ignored).
    /// Returns one entry per argument of the call: the gradient for each tensor
    /// argument that requires grad (a tensor passed twice gets its total gradient at
    /// both positions), `None` otherwise.
    pub fn backward(&self, output_grads: &[Tensor]) -> Result<Vec<Option<Tensor>>> {
        let opt: Vec<Option<Tensor>> = output_grads.iter().cloned().map(Some).collect();
        self.backward_with(&opt, &[])
    }

    /// [`PendingBackward::backward`] with optional output gradients (`None` = zero) and
    /// gradients of mutated inputs' new values, as `(argument index, gradient)`.
    pub fn backward_with(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
    ) -> Result<Vec<Option<Tensor>>> {
        {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            if *used {
                return Err(Error::Call {
                    name: "backward".into(),
                    msg: "backward was already run for this forward call (saved values are freed)".into(),
                });
            }
            *used = true;
        }
        let entry = &self.entry;
        let meta = &entry.fz.meta;
        let parts = entry.training.as_ref().ok_or_else(|| Error::Internal("no training parts".into()))?;
        if output_grads.len() != meta.outputs.len() {
            return Err(Error::Call {
                name: "backward".into(),
                msg: format!("expected {} output gradient(s), got {}", meta.outputs.len(), output_grads.len()),
            });
        }
        let _no_grad = NoGradGuard::new();
        let n_mut = meta.mutated_inputs.len();
        let mut acc_out: Vec<Option<Tensor>> = vec![None; meta.outputs.len()];
        let mut acc_base: Vec<Option<Tensor>> = vec![None; meta.num_intermediate_bases];
        let mut acc_input: Vec<Option<Tensor>> = vec![None; entry.fz.convention.args.len()];
        let mut acc_mut: Vec<Option<Tensor>> = vec![None; n_mut];
        for (j, g) in output_grads.iter().enumerate() {
            let Some(g) = g else { continue };
            let out_meta = concrete(&meta.outputs[j].meta, &self.env)?;
            if g.sizes()? != out_meta.concrete_shape().unwrap_or_default() {
                return Err(Error::Call {
                    name: "backward".into(),
                    msg: format!("gradient {j} has shape {:?}, output has {}", g.sizes()?, out_meta),
                });
            }
            let g = g.to(out_meta.dtype)?;
            // Follow SameAs to the output that owns the gradient.
            let mut o = j;
            while let OutputKind::SameAs(k) = meta.outputs[o].kind {
                o = k;
            }
            match &meta.outputs[o].kind {
                OutputKind::NonAlias => add(&mut acc_out[o], g)?,
                OutputKind::AliasOfOutput(k) => {
                    let base_meta = concrete(&meta.outputs[*k].meta, &self.env)?;
                    add(&mut acc_out[*k], storage_scatter(&g, &out_meta, &base_meta)?)?
                }
                OutputKind::AliasOfIntermediate(b) => {
                    let v = entry.fz.graph.outputs[meta.intermediate_base_index(*b)];
                    let bm = entry.fz.graph.meta_of(v).ok_or_else(|| Error::Internal("base meta".into()))?;
                    let base_meta = concrete(bm, &self.env)?;
                    add(&mut acc_base[*b], storage_scatter(&g, &out_meta, &base_meta)?)?
                }
                OutputKind::IsInput(k) | OutputKind::AliasOfInput(k) => {
                    let g = storage_scatter(&g, &out_meta, &self.input_metas[*k])?;
                    add(&mut acc_input[*k], g)?
                }
                OutputKind::SameAs(_) => unreachable_same_as()?,
            }
        }
        for (arg, g) in updated_input_grads {
            let k = entry.traced_args.iter().position(|a| a == arg).ok_or_else(|| Error::Call {
                name: "backward".into(),
                msg: format!("argument {arg} is not a tensor argument"),
            })?;
            let graph_input = match entry.fz.convention.args[k] {
                ArgSlot::Input(gi) => gi,
                ArgSlot::ViewOfBase { base } => entry.fz.convention.bases[base].input,
                _ => usize::MAX,
            };
            match meta.mutated_inputs.iter().position(|&m| m == graph_input) {
                Some(p) => add(&mut acc_mut[p], g.clone())?,
                None => {
                    return Err(Error::Call {
                        name: "backward".into(),
                        msg: format!("argument {arg} was not mutated by the function"),
                    })
                }
            }
        }
        // Tangents, in joint order.
        let fw_meta_of = |go: usize| -> Result<TensorMeta> {
            let v = entry.fz.graph.outputs[go];
            let m = entry.fz.graph.meta_of(v).ok_or_else(|| Error::Internal("output meta".into()))?;
            concrete(&m.to_contiguous(), &self.env)
        };
        let mut tangents: Vec<CpuTensor> = Vec::with_capacity(parts.joint.tangent_outputs.len());
        for &go in &parts.joint.tangent_outputs {
            let slot = if go < n_mut {
                acc_mut[go].take()
            } else if go < n_mut + meta.outputs.len() {
                acc_out[go - n_mut].take()
            } else {
                acc_base[go - n_mut - meta.outputs.len()].take()
            };
            let m = fw_meta_of(go)?;
            let t = match slot {
                Some(t) => t.to(m.dtype)?.contiguous()?.clone_tensor()?,
                None => Tensor::zeros(&m.concrete_shape().unwrap_or_default(), m.dtype)?,
            };
            tangents.push(t.to_cpu()?);
        }
        let mut bw_inputs = self.saved.clone();
        bw_inputs.extend(tangents);
        let grads = {
            let _span = tracing::debug_span!("run_backward").entered();
            parts.bw.run(&bw_inputs)?
        };
        // Graph-input gradients back to traced inputs.
        let mut by_graph_input: Vec<Option<Tensor>> = vec![None; entry.fz.graph.inputs.len()];
        for (p, &g) in parts.joint.grad_primals.iter().enumerate() {
            by_graph_input[g] = grads.get(p).cloned().map(Tensor::from_cpu);
        }
        let conv = &entry.fz.convention;
        let mut traced_grads: Vec<Option<Tensor>> = Vec::with_capacity(entry.traced_args.len());
        for (k, slot) in conv.args.iter().enumerate() {
            let from_graph = match slot {
                ArgSlot::Input(g) => by_graph_input[*g].clone(),
                ArgSlot::ViewOfBase { base } => {
                    let b = &conv.bases[*base];
                    match &by_graph_input[b.input] {
                        Some(bg) => {
                            let m = &self.input_metas[k];
                            let (s, st, o) = concrete_dims(m);
                            Some(bg.as_strided(&s, &st, o - b.offset)?.clone_tensor()?)
                        }
                        None => None,
                    }
                }
                _ => None,
            };
            let mut g = from_graph;
            if let Some(extra) = acc_input[k].take() {
                add(&mut g, extra)?;
            }
            if !meta.inputs[k].requires_grad {
                g = None;
            } else if g.is_none() {
                let m = &self.input_metas[k];
                g = Some(Tensor::zeros(&m.concrete_shape().unwrap_or_default(), m.dtype)?);
            }
            traced_grads.push(g);
        }
        // Traced inputs back to the caller's arguments (duplicates share one gradient).
        let mut out = Vec::with_capacity(self.args.len());
        for a in &self.args {
            out.push(match a {
                Arg::Tensor(t) => entry
                    .traced_args
                    .iter()
                    .position(|&i| self.args[i].tensor().is_some_and(|u| u.same_object(t)))
                    .and_then(|k| traced_grads[k].clone()),
                _ => None,
            });
        }
        Ok(out)
    }

    /// The forward outputs this backward belongs to.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }
}

fn unreachable_same_as() -> Result<()> {
    Err(Error::Internal("SameAs chain did not end at an owning output".into()))
}

pub(crate) fn traced_input_meta(entry: &Entry, args: &[Arg], k: usize) -> Result<TensorMeta> {
    if k >= entry.traced_args.len() {
        // Inputs the trace added itself (the RNG state): their traced metadata.
        let input = entry.traced.graph.inputs.get(k).ok_or_else(|| Error::Internal(format!("no traced input {k}")))?;
        return Ok(input.meta.clone());
    }
    Ok(traced_input(entry, args, k)?.meta())
}

/// Autograd flags after a compiled forward, as eager leaves them: every output that
/// requires grad is a non-leaf requiring grad (an output that *is* an input keeps the
/// input's flags), and so is every input whose data the call changed with a value
/// that requires grad (a mutation autograd sees).
pub(crate) fn mark_grad_flags(entry: &Entry, args: &[Arg], results: &[Tensor]) -> Result<()> {
    let meta = &entry.fz.meta;
    for (t, info) in results.iter().zip(&meta.outputs) {
        let fresh = !matches!(info.kind, OutputKind::IsInput(_) | OutputKind::SameAs(_));
        if info.requires_grad && fresh && info.meta.dtype.is_float() {
            t.mark_differentiable_result()?;
        }
    }
    for (k, info) in meta.inputs.iter().enumerate() {
        let t = traced_input(entry, args, k)?;
        if info.mutates_data && !info.mutations_hidden_from_autograd && t.dtype().is_float() && !t.is_requires_grad() {
            t.mark_differentiable_result()?;
        }
    }
    Ok(())
}

//! Stage 6 of a training call: the pending backward of one compiled forward call: gradients of the user's outputs (and of
//! the new values of mutated inputs) become the backward graph's tangents; its
//! gradients of graph inputs are mapped back to the caller's arguments.
//!
//! Where a gradient is given for a view of some storage (an output aliasing an input,
//! an intermediate or another output; an input after a metadata mutation) and is
//! needed for another layout of the same storage, it is moved element by element
//! through storage positions, summing where the view names an element twice
//! ([`storage_scatter`]); where the target layout names a storage element several
//! times (an expanded argument), each of its elements gets an equal share, as
//! PyTorch's `as_strided` backward divides by that count, so the caller's autograd,
//! summing over the repeats (an `expand`'s backward), gets the element's gradient
//! once.

use crate::entry::Entry;
use crate::error::{Error, Result};
use crate::signature::{alias_classes, concrete, Arg, Bindings};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::TensorMeta;
use aotgrad_meta::{ArgSlot, Layout, OutputKind};
use aotgrad_trace::{NoGradGuard, Tensor};
use std::sync::{Arc, Mutex};

/// The callback of [`PendingBackward::backward_streaming`]: argument index, gradient.
type ReadyArg<'r> = &'r mut dyn FnMut(usize, aotgrad_ir::ReadyOutput<'_>);

/// What the backward of one forward call needs.
pub struct PendingBackward {
    /// The compiled function's name (for messages).
    pub(crate) name: String,
    pub(crate) entry: Arc<Entry>,
    pub(crate) saved: Vec<CpuTensor>,
    /// The storage version of each saved value at the end of the forward call: it
    /// must be unchanged when the backward runs.
    pub(crate) versions: Vec<u64>,
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

/// The storage position of every element of a concrete layout, in row-major order
/// (an error when a position overflows: a layout no tensor has, read from a damaged
/// or forged result).
fn positions(m: &TensorMeta) -> Result<Vec<usize>> {
    let (shape, strides, offset) = concrete_dims(m);
    let overflow = || Error::Cache(format!("the layout {m} addresses elements past any storage"));
    let n = shape.iter().try_fold(1usize, |n, &s| n.checked_mul(s)).ok_or_else(overflow)?;
    let mut out = Vec::with_capacity(n);
    for e in 0..n {
        let (mut rest, mut pos) = (e, offset);
        for d in (0..shape.len()).rev() {
            pos = (rest % shape[d]).checked_mul(strides[d]).and_then(|x| pos.checked_add(x)).ok_or_else(overflow)?;
            rest /= shape[d];
        }
        out.push(pos);
    }
    Ok(out)
}

/// Move gradient `g`, laid out as view `view` of a storage, to layout `target` of the
/// same storage: element `e` of the result is the sum of `g` over the elements of
/// `view` at `target[e]`'s storage position (0 where `view` does not reach), divided
/// by the number of `target`'s elements at that position ([`shares`]). This is
/// PyTorch's `as_strided` backward: the transpose of reading `view` off a storage
/// laid out as `target` where `target` names every element once, and an equal share
/// per repeat where it does not. Positions are summed in a dense image of the range
/// both cover, or by position where that range is sparse (views far apart in a large
/// storage).
fn storage_scatter(g: &Tensor, view: &TensorMeta, target: &TensorMeta) -> Result<Tensor> {
    let values = g.to_vec_f64()?;
    let numel = view.concrete_shape().and_then(|s| s.iter().try_fold(1usize, |n, &d| n.checked_mul(d)));
    if numel != Some(values.len()) {
        return Err(Error::Internal(format!("gradient of {} values for view {view}", values.len())));
    }
    let (vp, tp) = (positions(view)?, positions(target)?);
    let lo = vp.iter().chain(&tp).copied().min().unwrap_or(0);
    let hi = vp.iter().chain(&tp).copied().max().map_or(0, |m| m + 1);
    let out: Vec<f64> = if hi - lo <= 4 * (vp.len() + tp.len()) + 64 {
        let mut image = vec![0.0; hi - lo];
        for (p, x) in vp.iter().zip(&values) {
            image[p - lo] += x;
        }
        tp.iter().map(|p| image[p - lo]).collect()
    } else {
        let mut image: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
        for (p, x) in vp.iter().zip(&values) {
            *image.entry(*p).or_insert(0.0) += x;
        }
        tp.iter().map(|p| image.get(p).copied().unwrap_or(0.0)).collect()
    };
    let out = shares(target, &tp, out);
    Ok(Tensor::from_f64(&out, &target.concrete_shape().unwrap_or_default(), g.dtype())?)
}

/// `vals`, one per element of layout `m` whose storage positions are `pos`, each
/// divided by how many of the layout's elements share its position (unchanged, and
/// nothing counted, for a layout naming every element once): the equal share of each
/// repeat.
fn shares(m: &TensorMeta, pos: &[usize], mut vals: Vec<f64>) -> Vec<f64> {
    if Layout::of(m).is_some_and(|l| !l.may_repeat()) {
        return vals;
    }
    let mut count: std::collections::HashMap<usize, u32> = std::collections::HashMap::new();
    for p in pos {
        *count.entry(*p).or_insert(0) += 1;
    }
    if count.len() == pos.len() {
        return vals;
    }
    for (v, p) in vals.iter_mut().zip(pos) {
        *v /= f64::from(count[p]);
    }
    vals
}

impl PendingBackward {
    /// Run the backward for gradients of the user outputs (one per output, in order;
    /// outputs that do not require grad take any tensor of their shape, ignored).
    /// Returns one entry per argument of the call: the gradient for each tensor
    /// argument that requires grad: the contributions that went through that argument
    /// (arguments viewing one another each get their own; a tensor passed twice gets
    /// one gradient in both places; arguments merged into a synthetic base share each
    /// storage element's gradient out, to the first of them that views it), `None`
    /// otherwise.
    /// A second call is an error (what it needs is freed), and so is a call after a
    /// value the backward needs was modified in place.
    pub fn backward(&self, output_grads: &[Tensor]) -> Result<Vec<Option<Tensor>>> {
        let opt: Vec<Option<Tensor>> = output_grads.iter().cloned().map(Some).collect();
        self.backward_with(&opt, &[])
    }

    /// [`PendingBackward::backward`] with optional output gradients (`None` = zero) and
    /// gradients of the new values of arguments the call changed, as `(argument index,
    /// gradient)`, each shaped like the argument after the call: data mutations and
    /// metadata mutations (`t_`) alike. A mutation hidden from autograd (under no-grad,
    /// through a detached alias) leaves the argument the same tensor to autograd: its
    /// new value's gradient adds to the argument's own.
    pub fn backward_with(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
    ) -> Result<Vec<Option<Tensor>>> {
        self.backward_inner(output_grads, updated_input_grads, None)
    }

    /// [`PendingBackward::backward_with`] that also hands argument gradients to
    /// `ready(argument index, gradient)` while the backward graph still runs, as soon
    /// as the backend has finished each ([`aotgrad_ir::CompiledGraph::run_streaming`]):
    /// those of arguments whose gradient is a backward graph output as it is (an
    /// argument that is its own graph input, passed once, repeating no element, with
    /// no other contribution to its gradient, such as a module's parameters). The
    /// returned gradients are `backward_with`'s, whether or not they came early;
    /// `ready` sees each at most once, in the backend's layout.
    pub fn backward_streaming(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
        ready: &mut dyn FnMut(usize, aotgrad_ir::ReadyOutput<'_>),
    ) -> Result<Vec<Option<Tensor>>> {
        self.backward_inner(output_grads, updated_input_grads, Some(ready))
    }

    /// Backward graph outputs that are some argument's whole gradient: by output,
    /// the argument (see [`PendingBackward::backward_streaming`]).
    fn direct_grads(&self, extra: &[Option<Tensor>], scattered: &[bool]) -> Result<Vec<Option<usize>>> {
        let m = self.entry.m();
        let tm = self.entry.tm()?;
        let mut direct = vec![None; tm.grad_primals.len()];
        for (p, &g) in tm.grad_primals.iter().enumerate() {
            let Some(k) = m.convention.args.iter().position(|a| matches!(a, ArgSlot::Input(x) if *x == g)) else {
                continue;
            };
            let own = m.meta.inputs.get(k).is_some_and(|i| i.requires_grad)
                && extra.get(k).is_some_and(Option::is_none)
                && scattered.get(k).is_some_and(|s| !s);
            if !own {
                continue;
            }
            let mut args = (0..self.args.len()).filter(|&i| self.traced_index(i) == Some(k));
            if let (Some(i), None) = (args.next(), args.next()) {
                direct[p] = Some(i);
            }
        }
        Ok(direct)
    }

    fn backward_inner(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
        ready: Option<ReadyArg<'_>>,
    ) -> Result<Vec<Option<Tensor>>> {
        // PyTorch's saved-tensor check, decided when the function compiled: the first
        // failing node a given gradient reaches.
        let given_input = |k: usize| updated_input_grads.iter().any(|(a, _)| self.traced_index(*a) == Some(k));
        let given_output = |j: usize| output_grads.get(j).is_some_and(Option::is_some);
        if let Some(e) = self
            .entry
            .m()
            .backward_errors
            .iter()
            .find(|e| e.outputs.iter().any(|&j| given_output(j)) || e.inputs.iter().any(|&k| given_input(k)))
        {
            let loc = e.loc.clone().unwrap_or(aotgrad_ir::SourceLoc { file: "".into(), line: 0, col: 0 });
            return Err(crate::Error::Trace(aotgrad_trace::Error::Autograd {
                op: "backward".into(),
                loc,
                msg: e.msg.clone(),
            }));
        }
        // Held to the end: a failed check leaves the backward available for a retry.
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if *used {
            return Err(
                self.call_error("backward was already run for this forward call (saved values are freed)".into())
            );
        }
        for (s, &v) in self.saved.iter().zip(&self.versions) {
            if s.storage.version() != v {
                return Err(self.call_error(format!(
                    "backward: one of the values saved for it ({}) has been modified by an inplace operation after \
                     the forward (an argument or an output sharing its storage was written)",
                    s.meta
                )));
            }
        }
        let entry = &self.entry;
        let meta = &entry.m().meta;
        let parts = entry.training.as_ref().ok_or_else(|| Error::Internal("no training parts".into()))?;
        let tm = entry.tm()?;
        if output_grads.len() != meta.outputs.len() {
            return Err(self.call_error(format!(
                "backward expects {} output gradient(s), one per output, got {}",
                meta.outputs.len(),
                output_grads.len()
            )));
        }
        let _no_grad = NoGradGuard::new();
        let n_mut = meta.mutated_inputs.len();
        let mut acc_out: Vec<Option<Tensor>> = vec![None; meta.outputs.len()];
        let mut acc_base: Vec<Option<Tensor>> = vec![None; meta.num_intermediate_bases];
        let mut acc_input: Vec<Option<Tensor>> = vec![None; meta.inputs.len()];
        // Inputs whose gradient got a contribution through storage positions.
        let mut scattered: Vec<bool> = vec![false; meta.inputs.len()];
        let mut acc_mut: Vec<Option<Tensor>> = vec![None; n_mut];
        for (j, g) in output_grads.iter().enumerate() {
            let Some(g) = g else { continue };
            let out_meta = concrete(&meta.outputs[j].meta, &self.env)?;
            let want = out_meta.concrete_shape().unwrap_or_default();
            if g.sizes()? != want {
                return Err(self.call_error(format!(
                    "backward: gradient {j} has shape {:?}, but output {j} has shape {want:?}",
                    g.sizes()?
                )));
            }
            if !meta.outputs[j].requires_grad || meta.outputs[j].grad_cut || !out_meta.dtype.is_float() {
                continue;
            }
            let g = g.to(out_meta.dtype)?;
            // Follow SameAs to the output that owns the gradient.
            let mut o = j;
            while let OutputKind::SameAs(k) = meta.outputs[o].kind {
                o = k;
            }
            if meta.outputs[o].own_gradient {
                // An alias with its own history: through its own graph output.
                add(&mut acc_out[o], g)?;
                continue;
            }
            match &meta.outputs[o].kind {
                OutputKind::NonAlias => add(&mut acc_out[o], g)?,
                OutputKind::AliasOfOutput(k) => {
                    let base_meta = concrete(&meta.outputs[*k].meta, &self.env)?;
                    add(&mut acc_out[*k], storage_scatter(&g, &out_meta, &base_meta)?)?
                }
                OutputKind::AliasOfIntermediate(b) => {
                    let bm = entry.graph_output_meta(meta.intermediate_base_index(*b))?;
                    let base_meta = concrete(bm, &self.env)?;
                    add(&mut acc_base[*b], storage_scatter(&g, &out_meta, &base_meta)?)?
                }
                // The input itself, unchanged: its gradient is this one (gradients
                // follow tensors; an expanded input gets 1 per element, not the sum
                // over the elements sharing its storage).
                OutputKind::IsInput(k) if self.unchanged_own_input(*k) => add(&mut acc_input[*k], g)?,
                OutputKind::IsInput(k) | OutputKind::AliasOfInput(k) => {
                    self.storage_grad(*k, &g, &out_meta, &mut acc_mut, &mut acc_input)?;
                    scattered[*k] = true;
                }
                OutputKind::SameAs(_) => {
                    return Err(Error::Internal("SameAs chain did not end at an owning output".into()))
                }
            }
        }
        for (arg, h) in updated_input_grads {
            self.updated_input_grad(*arg, h, &mut acc_mut, &mut acc_input)?;
            if let Some(k) = self.traced_index(*arg) {
                scattered[k] = true;
            }
        }
        *used = true;
        // Tangents, in joint order.
        let fw_meta_of = |go: usize| -> Result<TensorMeta> {
            let m = entry.graph_output_meta(go)?;
            concrete(&m.to_contiguous(), &self.env)
        };
        let mut tangents: Vec<CpuTensor> = Vec::with_capacity(tm.tangent_outputs.len());
        for &go in &tm.tangent_outputs {
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
            let _span = tracing::trace_span!("run_backward").entered();
            let symbols = crate::signature::given_symbols(&self.env);
            match ready {
                Some(ready) => {
                    let direct = self.direct_grads(&acc_input, &scattered)?;
                    parts.bw.run_streaming(&bw_inputs, &symbols, &mut |o: aotgrad_ir::ReadyOutput<'_>| {
                        if let Some(&Some(arg)) = direct.get(o.index) {
                            ready(arg, o);
                        }
                    })?
                }
                None => parts.bw.run_with_symbols(&bw_inputs, &symbols)?,
            }
        };
        // Graph-input gradients back to traced inputs.
        let mut by_graph_input: Vec<Option<Tensor>> = vec![None; entry.m().graph_inputs];
        for (p, &g) in tm.grad_primals.iter().enumerate() {
            by_graph_input[g] = grads.get(p).cloned().map(Tensor::from_cpu);
        }
        let traced_grads = self.input_grads(&by_graph_input, acc_input, &scattered)?;
        // Traced inputs back to the caller's arguments (duplicates share one gradient).
        Ok((0..self.args.len()).map(|i| self.traced_index(i).and_then(|k| traced_grads[k].clone())).collect())
    }

    /// The gradient of each traced input that requires grad. An input that is its own
    /// graph input (repeating no element) gets that graph input's gradient plus
    /// `extra[k]` (gradients of outputs aliasing it and of its new value after a
    /// metadata mutation): the contributions through it alone, even when other
    /// arguments share its storage (PyTorch's gradients follow tensors). Inputs
    /// repeating elements or merged into a synthetic base (even alone) go through
    /// storage positions: every contribution to a storage element is summed and goes
    /// to the first of them that views it (so the caller's autograd, which sums the
    /// arguments' gradients where they share a base, counts it once).
    fn input_grads(
        &self,
        by_graph_input: &[Option<Tensor>],
        mut extra: Vec<Option<Tensor>>,
        scattered: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        let entry = &self.entry;
        let meta = &entry.m().meta;
        let conv = &entry.m().convention;
        let n = conv.args.len();
        let caller: Vec<Option<&Tensor>> = (0..n)
            .map(|k| entry.m().traced_args.get(k).and_then(|&i| self.args.get(i)).and_then(Arg::tensor))
            .collect();
        // Storage classes (the first member stands for its class).
        let mut classes: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, (_, class)) in alias_classes(&caller).into_iter().enumerate() {
            classes[class].push(k);
        }
        let mut out: Vec<Option<Tensor>> = vec![None; n];
        for members in &classes {
            if members.is_empty() || !members.iter().any(|&k| meta.inputs[k].requires_grad) {
                continue;
            }
            // An input that is its own graph input (not a member of a synthetic base)
            // and names no element twice gets the contributions that went through it
            // alone, even when other arguments view its storage: each argument is a
            // variable of its own, as an autograd function's inputs are, and the
            // caller's autograd sums them where they share a base.
            let mut rest: Vec<usize> = Vec::new();
            for &k in members {
                let own_input = match conv.args[k] {
                    ArgSlot::Input(g) => Some(g),
                    ArgSlot::ViewOfBase { .. } => None,
                };
                // Repeated elements (an expanded input) matter only to contributions
                // that went through storage positions.
                let distinct = !scattered[k] || Layout::of(&self.input_metas[k]).is_some_and(|l| !l.may_repeat());
                let (Some(g), true) = (own_input, distinct) else {
                    rest.push(k);
                    continue;
                };
                if !meta.inputs[k].requires_grad {
                    continue;
                }
                let mut g = by_graph_input[g].clone();
                if let Some(e) = extra[k].take() {
                    add(&mut g, e)?;
                }
                let m = &self.input_metas[k];
                out[k] = Some(match g {
                    Some(g) => g,
                    None => Tensor::zeros(&m.concrete_shape().unwrap_or_default(), m.dtype)?,
                });
            }
            let members = &rest;
            if members.is_empty() {
                continue;
            }
            // Through storage positions: every contribution into one image, then each
            // member reads its elements back.
            let mut image: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
            let mut scatter = |g: &Tensor, m: &TensorMeta| -> Result<()> {
                for (p, v) in positions(m)?.into_iter().zip(g.to_vec_f64()?) {
                    *image.entry(p).or_insert(0.0) += v;
                }
                Ok(())
            };
            let mut bases_seen: Vec<usize> = Vec::new();
            for &k in members {
                match conv.args[k] {
                    ArgSlot::Input(g) => {
                        if let Some(gr) = &by_graph_input[g] {
                            scatter(gr, &self.input_metas[k])?;
                        }
                    }
                    ArgSlot::ViewOfBase { base } if !bases_seen.contains(&base) => {
                        bases_seen.push(base);
                        let b = &conv.bases[base];
                        if let Some(gr) = &by_graph_input[b.input] {
                            scatter(gr, &b.meta(gr.dtype()))?;
                        }
                    }
                    ArgSlot::ViewOfBase { .. } => {}
                }
                if let Some(e) = extra[k].take() {
                    scatter(&e, &self.input_metas[k])?;
                }
            }
            // Each storage element's gradient goes to one of them (the first that views
            // it), so that the caller's autograd, summing the arguments' gradients where
            // they share a base, counts it once.
            let mut owned: std::collections::HashSet<usize> = std::collections::HashSet::new();
            for &k in members {
                if meta.inputs[k].requires_grad {
                    let m = &self.input_metas[k];
                    let pos = positions(m)?;
                    let mine: std::collections::HashSet<usize> =
                        pos.iter().copied().filter(|p| !owned.contains(p)).collect();
                    let vals: Vec<f64> = pos
                        .iter()
                        .map(|p| if mine.contains(p) { image.get(p).copied().unwrap_or(0.0) } else { 0.0 })
                        .collect();
                    let vals = shares(m, &pos, vals);
                    owned.extend(mine);
                    out[k] = Some(Tensor::from_f64(&vals, &m.concrete_shape().unwrap_or_default(), m.dtype)?);
                }
            }
        }
        Ok(out)
    }

    /// The traced input that argument `i` is (duplicates map to the first occurrence).
    fn traced_index(&self, i: usize) -> Option<usize> {
        self.entry.m().slot_of_arg.get(i).copied().flatten()
    }

    /// Route the gradient `h` of argument `arg`'s value after the call (see
    /// [`PendingBackward::storage_grad`]; after a metadata-only mutation the new value
    /// is a view of the old one).
    fn updated_input_grad(
        &self,
        arg: usize,
        h: &Tensor,
        acc_mut: &mut [Option<Tensor>],
        acc_input: &mut [Option<Tensor>],
    ) -> Result<()> {
        let entry = &self.entry;
        let meta = &entry.m().meta;
        let k = self
            .traced_index(arg)
            .ok_or_else(|| self.call_error(format!("backward: argument {arg} is not a tensor argument")))?;
        let info = &meta.inputs[k];
        let after = match &info.final_meta {
            Some(m) => concrete(m, &self.env)?,
            None => self.input_metas[k].clone(),
        };
        let want = after.concrete_shape().unwrap_or_default();
        if h.sizes()? != want {
            return Err(self.call_error(format!(
                "backward: the gradient for argument {arg}'s new value has shape {:?}, but the argument has shape {want:?} \
                 after the call",
                h.sizes()?
            )));
        }
        if !after.dtype.is_float() {
            return Ok(());
        }
        let h = h.to(after.dtype)?;
        let conv = &entry.m().convention;
        let data_mutated = match conv.args[k] {
            ArgSlot::Input(g) => meta.mutated_inputs.contains(&g),
            ArgSlot::ViewOfBase { base } => meta.mutated_inputs.contains(&conv.bases[base].input),
        };
        if !data_mutated && !info.mutates_metadata {
            return Err(self.call_error(format!(
                "backward: argument {arg} was not changed by the call, so its new value has no gradient"
            )));
        }
        self.storage_grad(k, &h, &after, acc_mut, acc_input)
    }

    /// Route gradient `g` of a view `view` (storage-absolute metadata, as of after the
    /// call) of traced input `k`'s storage: when the call wrote that storage, to the
    /// tangent of its graph input's new value; else to `k`'s own gradient.
    fn storage_grad(
        &self,
        k: usize,
        g: &Tensor,
        view: &TensorMeta,
        acc_mut: &mut [Option<Tensor>],
        acc_input: &mut [Option<Tensor>],
    ) -> Result<()> {
        let entry = &self.entry;
        let meta = &entry.m().meta;
        let conv = &entry.m().convention;
        let (graph_input, target) = match conv.args[k] {
            ArgSlot::Input(g) => (g, self.input_metas[k].clone()),
            ArgSlot::ViewOfBase { base } => {
                let b = &conv.bases[base];
                (b.input, b.meta(view.dtype))
            }
        };
        match meta.mutated_inputs.iter().position(|&m| m == graph_input) {
            Some(p) => add(&mut acc_mut[p], storage_scatter(g, view, &target)?),
            None => add(&mut acc_input[k], storage_scatter(g, view, &self.input_metas[k])?),
        }
    }

    /// Traced input `k` is its own graph input, and the call changed neither its data
    /// nor its metadata.
    fn unchanged_own_input(&self, k: usize) -> bool {
        let m = &self.entry.m();
        let info = &m.meta.inputs[k];
        matches!(m.convention.args[k], ArgSlot::Input(_)) && !info.mutates_data && !info.mutates_metadata
    }

    fn call_error(&self, msg: String) -> Error {
        Error::Call { name: self.name.clone(), msg }
    }

    /// The forward outputs this backward belongs to.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }
}

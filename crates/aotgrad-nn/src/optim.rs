//! Optimizers ([`Sgd`], [`AdamW`]) behind one interface ([`Optimizer`]), and the
//! learning-rate schedule [`WarmupCosine`].
//!
//! Every optimizer updates the parameters of a [`ParamStore`] *in place* (the handles
//! stay the same objects, so a compiled module keeps using them) from the
//! `(name, gradient)` pairs a compiled backward returns ([`aotgrad_runtime::ModuleGrads::params`]).
//! Its state (moments, step count) is plain named tensors and numbers
//! ([`OptimizerState`]), which is what a checkpoint stores
//! ([`crate::checkpoint`]).
//!
//! [`AdamW`]'s update is itself compiled: one `aot_function` over the parameters,
//! gradients and moments, whose in-place updates become one fused kernel per
//! parameter (functionalized, then written back by the epilogue like any input
//! mutation), instead of a dozen eager passes over every tensor.

use crate::ParamStore;
use aotgrad_ir::DType;
use aotgrad_runtime::AotConfig;
use aotgrad_runtime::{aot_function, AotFunction};
use aotgrad_runtime::{Error, Result};
use aotgrad_trace::{NoGradGuard, Tensor};
use std::collections::HashMap;

/// The state of an optimizer, as a checkpoint stores it: named numbers and named
/// tensors (keys are the optimizer's own, e.g. `exp_avg.fc1.weight`).
#[derive(Clone, Debug, Default)]
pub struct OptimizerState {
    /// The optimizer's kind (`"sgd"`, `"adamw"`): loading into another kind is an error.
    pub kind: String,
    /// Scalars: hyperparameters and counters.
    pub scalars: Vec<(String, f64)>,
    /// Tensors: per-parameter state.
    pub tensors: Vec<(String, Tensor)>,
}

impl OptimizerState {
    /// The scalar named `key`.
    pub fn scalar(&self, key: &str) -> Option<f64> {
        self.scalars.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
    /// The tensor named `key`.
    pub fn tensor(&self, key: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(k, _)| k == key).map(|(_, t)| t)
    }
}

/// What every optimizer does: one update from gradients, a learning rate a schedule
/// can set, and a state that round-trips through a checkpoint.
pub trait Optimizer {
    /// Update the parameters of `store` in place from `(parameter name, gradient)`
    /// pairs (parameters without a gradient are left alone).
    fn step(&mut self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()>;
    /// The current learning rate.
    fn lr(&self) -> f64;
    /// Set the learning rate (for a schedule).
    fn set_lr(&mut self, lr: f64);
    /// The state to checkpoint.
    fn state(&self) -> OptimizerState;
    /// Restore a state saved by [`Optimizer::state`] for the parameters of `store`.
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()>;
}

fn optim_error(name: &str, msg: impl Into<String>) -> Error {
    Error::Call { name: name.into(), msg: msg.into() }
}

/// The parameter named `name` of `store`, and a check that `g` has its shape.
fn param_for<'s>(opt: &str, store: &'s ParamStore, name: &str, g: &Tensor) -> Result<&'s Tensor> {
    let p = store
        .params()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| optim_error(opt, format!("no parameter named `{name}`")))?;
    if g.sizes()? != p.sizes()? {
        return Err(optim_error(
            opt,
            format!("gradient of `{name}` has shape {:?}, parameter has {:?}", g.sizes()?, p.sizes()?),
        ));
    }
    Ok(p)
}

/// Stochastic gradient descent (PyTorch's `torch.optim.SGD`, dampening 0): for every
/// parameter `p` with gradient `g`,
///
/// ```text
/// d = g + weight_decay * p
/// b = d (first step), else momentum * b + d      (when momentum > 0)
/// d = d + momentum * b (nesterov), else b        (when momentum > 0)
/// p -= lr * d
/// ```
///
/// The momentum buffers are kept per parameter name (behind a lock, so `step` takes
/// `&self`).
#[derive(Debug, Default)]
pub struct Sgd {
    /// The learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    buffers: std::sync::Mutex<HashMap<String, Tensor>>,
}

impl Clone for Sgd {
    fn clone(&self) -> Sgd {
        let buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Sgd { buffers: std::sync::Mutex::new(buffers), ..*self }
    }
}

impl Sgd {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Sgd {
        Sgd { lr, ..Sgd::default() }
    }

    /// SGD with momentum, weight decay and optionally Nesterov momentum; errors for
    /// values PyTorch rejects (negative ones; Nesterov without momentum).
    pub fn with(lr: f64, momentum: f64, weight_decay: f64, nesterov: bool) -> Result<Sgd> {
        for (what, v) in [("learning rate", lr), ("momentum", momentum), ("weight decay", weight_decay)] {
            if v.is_nan() || v < 0.0 || v.is_infinite() {
                return Err(optim_error("Sgd", format!("invalid {what}: {v}")));
            }
        }
        if nesterov && momentum == 0.0 {
            return Err(optim_error("Sgd", "Nesterov momentum requires a momentum"));
        }
        Ok(Sgd { lr, momentum, weight_decay, nesterov, buffers: Default::default() })
    }

    /// Update the parameters of `store` in place (under no-grad, so autograd does not
    /// see it) from `(parameter name, gradient)` pairs, e.g. `ModuleGrads::params`.
    /// The parameter handles stay the same objects, so compiled modules keep using them.
    pub fn step(&self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        let _no_grad = NoGradGuard::new();
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        for (name, g) in grads {
            let p = param_for("Sgd", store, name, g)?;
            let mut d = if self.weight_decay != 0.0 { g.add(&p.mul(self.weight_decay)?)? } else { g.clone() };
            if self.momentum != 0.0 {
                let b = match buffers.get(name) {
                    Some(b) => b.mul_(self.momentum)?.add_(&d)?,
                    None => {
                        let b = d.detach()?.clone_tensor()?;
                        buffers.insert(name.clone(), b.clone());
                        b
                    }
                };
                d = if self.nesterov { d.add(&b.mul(self.momentum)?)? } else { b };
            }
            p.sub_(&d.mul(self.lr)?)?;
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        Sgd::step(self, store, grads)
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state(&self) -> OptimizerState {
        let buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = buffers.keys().collect();
        names.sort();
        OptimizerState {
            kind: "sgd".into(),
            scalars: vec![
                ("lr".into(), self.lr),
                ("momentum".into(), self.momentum),
                ("weight_decay".into(), self.weight_decay),
                ("nesterov".into(), f64::from(u8::from(self.nesterov))),
            ],
            tensors: names.into_iter().map(|n| (format!("momentum_buffer.{n}"), buffers[n].clone())).collect(),
        }
    }
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()> {
        if state.kind != "sgd" {
            return Err(optim_error("Sgd", format!("cannot load the state of a `{}` optimizer", state.kind)));
        }
        let mut buffers = HashMap::new();
        for (name, p) in store.params() {
            if let Some(b) = state.tensor(&format!("momentum_buffer.{name}")) {
                if b.sizes()? != p.sizes()? {
                    return Err(optim_error(
                        "Sgd",
                        format!("the momentum buffer of `{name}` does not match its shape"),
                    ));
                }
                buffers.insert(name.clone(), b.clone());
            }
        }
        self.lr = state.scalar("lr").unwrap_or(self.lr);
        self.momentum = state.scalar("momentum").unwrap_or(self.momentum);
        self.weight_decay = state.scalar("weight_decay").unwrap_or(self.weight_decay);
        self.nesterov = state.scalar("nesterov").is_some_and(|v| v != 0.0);
        *self.buffers.lock().unwrap_or_else(|e| e.into_inner()) = buffers;
        Ok(())
    }
}

/// AdamW (Loshchilov & Hutter; PyTorch's `torch.optim.AdamW`): Adam with decoupled
/// weight decay. For every parameter `p` with gradient `g`, at step `t` (from 1):
///
/// ```text
/// p ← p · (1 − lr · weight_decay)
/// m ← β₁ m + (1 − β₁) g          v ← β₂ v + (1 − β₂) g²
/// p ← p − lr · (m / (1 − β₁ᵗ)) / (sqrt(v / (1 − β₂ᵗ)) + eps)
/// ```
///
/// The moments start at zero and are kept per parameter name (f32 for f32
/// parameters). The update runs as one compiled function over all parameters that
/// have gradients (recompiled only when that set changes).
pub struct AdamW {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    /// Weight decay decoupled from the gradient (AdamW) or added to it (Adam's L2).
    decoupled: bool,
    steps: u64,
    /// `(exp_avg, exp_avg_sq)` by parameter name.
    moments: HashMap<String, (Tensor, Tensor)>,
    /// The compiled update, keyed by the names it updates (in order).
    update: Option<(Vec<String>, AotFunction)>,
    /// The result cache of the compiled update (the environment's by default).
    cache: Option<std::sync::Arc<aotgrad_runtime::Cache>>,
    /// The backend the update compiles for (`AotConfig::default`'s unless set).
    backend: Option<std::sync::Arc<dyn aotgrad_ir::Backend<aotgrad_cpu::CpuTensor>>>,
}

impl std::fmt::Debug for AdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("lr", &self.lr)
            .field("betas", &self.betas)
            .field("eps", &self.eps)
            .field("weight_decay", &self.weight_decay)
            .field("steps", &self.steps)
            .finish()
    }
}

impl AdamW {
    /// AdamW with PyTorch's defaults besides the learning rate: betas `(0.9, 0.999)`,
    /// eps `1e-8`, weight decay `0.01`.
    pub fn new(lr: f64) -> AdamW {
        AdamW::with(lr, (0.9, 0.999), 1e-8, 0.01).expect("the defaults are valid")
    }

    /// AdamW with every hyperparameter given; errors for values PyTorch rejects
    /// (negative learning rate, eps or weight decay; betas outside `[0, 1)`).
    pub fn with(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<AdamW> {
        let bad = |what: &str, v: String| Err(optim_error("AdamW", format!("invalid {what}: {v}")));
        if !(lr >= 0.0 && lr.is_finite()) {
            return bad("learning rate", lr.to_string());
        }
        if !(0.0..1.0).contains(&betas.0) || !(0.0..1.0).contains(&betas.1) {
            return bad("betas (each must be in [0, 1))", format!("{betas:?}"));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return bad("eps", eps.to_string());
        }
        if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
            return bad("weight decay", weight_decay.to_string());
        }
        Ok(AdamW {
            lr,
            betas,
            eps,
            weight_decay,
            decoupled: true,
            steps: 0,
            moments: HashMap::new(),
            update: None,
            cache: AotConfig::default().cache,
            backend: None,
        })
    }

    /// Adam (PyTorch's `torch.optim.Adam`): the same update, but `weight_decay` is an
    /// L2 penalty added to the gradient (`g + weight_decay * p`) before the moments,
    /// not a decoupled decay of the parameters.
    pub fn adam(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<AdamW> {
        let mut a = AdamW::with(lr, betas, eps, weight_decay)?;
        a.decoupled = false;
        Ok(a)
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Keep the compiled update's result in `cache` (`None`: no cache); by default the
    /// environment decides, as for [`AotConfig::default`].
    pub fn with_cache(mut self, cache: Option<std::sync::Arc<aotgrad_runtime::Cache>>) -> AdamW {
        self.cache = cache;
        self.update = None;
        self
    }

    /// Compile the update for `backend` (e.g. the wgpu backend, so that parameters
    /// and moments a device holds stay there); by default `AotConfig::default`'s.
    pub fn with_backend(mut self, backend: std::sync::Arc<dyn aotgrad_ir::Backend<aotgrad_cpu::CpuTensor>>) -> AdamW {
        self.backend = Some(backend);
        self.update = None;
        self
    }

    /// The compiled update function, once a step has made it (its cache statistics and
    /// compile reports).
    pub fn update_function(&self) -> Option<&AotFunction> {
        self.update.as_ref().map(|(_, f)| f)
    }

    /// The first and second moment of parameter `name` (after its first step).
    pub fn moments(&self, name: &str) -> Option<(&Tensor, &Tensor)> {
        self.moments.get(name).map(|(m, v)| (m, v))
    }

    /// The compiled update for `names` (parameters, gradients, first moments, second
    /// moments, then the 0-d `lr`, `1/(1-β₁ᵗ)`, `1/(1-β₂ᵗ)`): in-place updates of the
    /// parameters and moments.
    fn compiled_update(&mut self, names: &[String]) -> Result<&AotFunction> {
        let stale = self.update.as_ref().is_none_or(|(n, _)| n != names);
        if stale {
            let n = names.len();
            let (b1, b2, eps, wd, decoupled) =
                (self.betas.0, self.betas.1, self.eps, self.weight_decay, self.decoupled);
            let f = aot_function(
                move |a: &[Tensor]| {
                    let (lr, c1, c2) = (&a[4 * n], &a[4 * n + 1], &a[4 * n + 2]);
                    let decay = lr.mul(-wd)?.add(1.0)?;
                    for i in 0..n {
                        let (p, m, v) = (&a[i], &a[2 * n + i], &a[3 * n + i]);
                        // Adam's L2 penalty joins the gradient; AdamW's decay scales p.
                        let g = if decoupled || wd == 0.0 { a[n + i].clone() } else { a[n + i].add(&p.mul(wd)?)? };
                        m.mul_(b1)?.add_(&g.mul(1.0 - b1)?)?;
                        v.mul_(b2)?.add_(&g.mul(&g)?.mul(1.0 - b2)?)?;
                        let denom = v.mul(c2)?.sqrt()?.add(eps)?;
                        if decoupled {
                            p.mul_(&decay)?;
                        }
                        p.sub_(&m.mul(c1)?.div(&denom)?.mul(lr)?)?;
                    }
                    Ok(Vec::new())
                },
                {
                    let base = AotConfig::default();
                    AotConfig {
                        name: if decoupled { "adamw_update" } else { "adam_update" }.into(),
                        cache: self.cache.clone(),
                        backend: self.backend.clone().unwrap_or(base.backend.clone()),
                        ..base
                    }
                },
            )?;
            self.update = Some((names.to_vec(), f));
        }
        Ok(&self.update.as_ref().expect("just set").1)
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        let _no_grad = NoGradGuard::new();
        let mut params = Vec::with_capacity(grads.len());
        for (name, g) in grads {
            let p = param_for("AdamW", store, name, g)?;
            if !matches!(p.dtype(), DType::F32 | DType::F64) {
                return Err(optim_error("AdamW", format!("parameter `{name}` is {:?}, not f32 or f64", p.dtype())));
            }
            if !self.moments.contains_key(name) {
                self.moments.insert(name.clone(), (p.zeros_like()?.detach()?, p.zeros_like()?.detach()?));
            }
            params.push(p.clone());
        }
        if params.is_empty() {
            return Ok(());
        }
        self.steps += 1;
        let t = self.steps as f64;
        let dtype = params[0].dtype();
        let scalars = [self.lr, 1.0 / (1.0 - self.betas.0.powf(t)), 1.0 / (1.0 - self.betas.1.powf(t))];
        let names: Vec<String> = grads.iter().map(|(n, _)| n.clone()).collect();
        let mut args: Vec<Tensor> = params;
        args.extend(grads.iter().map(|(_, g)| g.clone()));
        args.extend(names.iter().map(|n| self.moments[n].0.clone()));
        args.extend(names.iter().map(|n| self.moments[n].1.clone()));
        for s in scalars {
            args.push(Tensor::from_f64(&[s], &[], dtype)?);
        }
        self.compiled_update(&names)?.call(&args)?;
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state(&self) -> OptimizerState {
        let mut names: Vec<&String> = self.moments.keys().collect();
        names.sort();
        let mut tensors = Vec::with_capacity(2 * names.len());
        for n in names {
            let (m, v) = &self.moments[n];
            tensors.push((format!("exp_avg.{n}"), m.clone()));
            tensors.push((format!("exp_avg_sq.{n}"), v.clone()));
        }
        OptimizerState {
            kind: if self.decoupled { "adamw" } else { "adam" }.into(),
            scalars: vec![
                ("lr".into(), self.lr),
                ("beta1".into(), self.betas.0),
                ("beta2".into(), self.betas.1),
                ("eps".into(), self.eps),
                ("weight_decay".into(), self.weight_decay),
                ("steps".into(), self.steps as f64),
            ],
            tensors,
        }
    }
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> Result<()> {
        let want = if self.decoupled { "adamw" } else { "adam" };
        if state.kind != want {
            return Err(optim_error(
                if self.decoupled { "AdamW" } else { "Adam" },
                format!("cannot load the state of a `{}` optimizer", state.kind),
            ));
        }
        let get = |k: &str| state.scalar(k).ok_or_else(|| optim_error("AdamW", format!("the state has no `{k}`")));
        let mut loaded = AdamW::with(get("lr")?, (get("beta1")?, get("beta2")?), get("eps")?, get("weight_decay")?)?;
        loaded.steps = get("steps")? as u64;
        loaded.decoupled = self.decoupled;
        for (name, p) in store.params() {
            let (m, v) = (state.tensor(&format!("exp_avg.{name}")), state.tensor(&format!("exp_avg_sq.{name}")));
            match (m, v) {
                (Some(m), Some(v)) => {
                    for (what, t) in [("exp_avg", m), ("exp_avg_sq", v)] {
                        if t.sizes()? != p.sizes()? || t.dtype() != p.dtype() {
                            return Err(optim_error(
                                "AdamW",
                                format!(
                                    "{what} of `{name}` is {:?} {:?}, the parameter is {:?} {:?}",
                                    t.dtype(),
                                    t.sizes()?,
                                    p.dtype(),
                                    p.sizes()?
                                ),
                            ));
                        }
                    }
                    loaded.moments.insert(name.clone(), (m.clone(), v.clone()));
                }
                (None, None) => {}
                _ => return Err(optim_error("AdamW", format!("the state has only one moment of `{name}`"))),
            }
        }
        *self = loaded;
        Ok(())
    }
}

/// Linear warmup then cosine decay, by optimizer step: the learning rate rises from
/// `peak_lr / warmup_steps` to `peak_lr` over the first `warmup_steps` steps, then
/// follows half a cosine down to `final_lr` at `total_steps` (and stays there).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The learning rate at the end of the warmup.
    pub peak_lr: f64,
    /// The learning rate from `total_steps` on.
    pub final_lr: f64,
    /// Steps of linear warmup.
    pub warmup_steps: u64,
    /// Steps of the whole schedule (warmup included).
    pub total_steps: u64,
}

impl WarmupCosine {
    /// The learning rate for step `step` (0-based: the `step + 1`-th update).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps);
        if decay_steps == 0 || step >= self.total_steps {
            return self.final_lr;
        }
        let progress = (step - self.warmup_steps) as f64 / decay_steps as f64;
        self.final_lr + 0.5 * (self.peak_lr - self.final_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Scale the gradients in place so that their total L2 norm is at most `max_norm`
/// (PyTorch's `clip_grad_norm_`: the factor is `max_norm / (norm + 1e-6)`, applied
/// only when below 1). Returns the total norm before clipping.
pub fn clip_grad_norm(grads: &[(String, Tensor)], max_norm: f64) -> Result<f64> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(optim_error("clip_grad_norm", format!("max_norm must be non-negative, got {max_norm}")));
    }
    let _no_grad = NoGradGuard::new();
    let mut sq = 0.0;
    for (_, g) in grads {
        sq += g.mul(g)?.sum_all()?.item()?;
    }
    let norm = sq.sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for (_, g) in grads {
            g.mul_(coef)?;
        }
    }
    Ok(norm)
}

//! Compiling a [`Module`]: [`aot_module`] and [`aot_module_simplified`].
//!
//! The module's parameters and buffers are *lifted* as graph inputs: the compiled
//! function takes `(parameters..., buffers..., user inputs...)` and runs the module's
//! forward with a [`Params`] view over the first ones. Parameters are not constants in
//! the graph, so an optimizer updating them in place (same tensor objects) does not
//! invalidate the compiled code, and the training path returns their gradients.
//!
//! The two entry points differ in *when* they compile:
//! - [`aot_module`] compiles lazily at the first call, and again (a new
//!   specialization, like `aot_function`) whenever a call's input metadata, aliasing
//!   or grad mode differs from every compiled one;
//! - [`aot_module_simplified`] compiles once, at construction, for the example inputs
//!   under the grad mode current at that time; a later call whose inputs differ in
//!   metadata (shape, strides, offset, dtype), requires-grad flags or aliasing, or that
//!   runs under another grad mode, is an error instead of a recompilation.

use crate::backward::PendingBackward;
use crate::config::AotConfig;
use crate::error::{Error, Result};
use crate::function::{aot_function_args, AotFunction};
use crate::params::{Module, Params};
use crate::signature::{call_sig, Arg};
use aotgrad_cache::{ArgSig, CallSig, Leafness};
use aotgrad_ir::TensorMeta;
use aotgrad_trace::Tensor;
use std::sync::Arc;

/// A module compiled ahead of time; see the [module docs](self).
pub struct AotModule {
    module: Arc<dyn Module>,
    f: AotFunction,
    names: Arc<[String]>,
    num_params: usize,
    name: String,
    /// Set by `aot_module_simplified`: the only call signature accepted.
    frozen: Option<Frozen>,
}

/// Gradients of one backward, by parameter name and by user input.
#[derive(Clone, Debug, Default)]
pub struct ModuleGrads {
    /// `(name, gradient)` for every parameter that requires grad, in parameter order.
    pub params: Vec<(String, Tensor)>,
    /// One entry per user input: its gradient when it requires grad.
    pub inputs: Vec<Option<Tensor>>,
}

impl ModuleGrads {
    /// The gradient of parameter `name`.
    pub fn param(&self, name: &str) -> Option<&Tensor> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// What the backward of one [`AotModule::forward`] call needs.
pub struct ModuleBackward {
    pending: PendingBackward,
    names: Arc<[String]>,
    num_params: usize,
    num_lifted: usize,
}

impl ModuleBackward {
    /// Run the backward for the gradients of the outputs (one per output, in order) and
    /// return the gradients of the parameters and of the user inputs. Runs once.
    pub fn backward(&self, output_grads: &[Tensor]) -> Result<ModuleGrads> {
        self.split(self.pending.backward(output_grads)?)
    }

    /// [`ModuleBackward::backward`] with optional output gradients (`None` = zero) and
    /// gradients of the new values of user inputs the forward changed in place, as
    /// `(input index, gradient)`: the same arguments as
    /// [`PendingBackward::backward_with`], with indices counting the user's inputs
    /// (as [`AotConfig::dynamic`] does), not the lifted parameters and buffers.
    pub fn backward_with(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
    ) -> Result<ModuleGrads> {
        let updated: Vec<(usize, Tensor)> =
            updated_input_grads.iter().map(|(i, g)| (i + self.num_lifted, g.clone())).collect();
        self.split(self.pending.backward_with(output_grads, &updated)?)
    }

    /// [`ModuleBackward::backward_with`] that also hands each parameter's gradient to
    /// `ready(parameter index, gradient)` while the backward still runs, as soon as the
    /// backend has finished it ([`PendingBackward::backward_streaming`]; parameters in
    /// the order of the module's store). The returned gradients are the same.
    pub fn backward_streaming(
        &self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
        ready: &mut dyn FnMut(usize, aotgrad_ir::ReadyOutput<'_>),
    ) -> Result<ModuleGrads> {
        let updated: Vec<(usize, Tensor)> =
            updated_input_grads.iter().map(|(i, g)| (i + self.num_lifted, g.clone())).collect();
        let num_params = self.num_params;
        let grads = self.pending.backward_streaming(output_grads, &updated, &mut |arg, o| {
            if arg < num_params {
                ready(arg, o);
            }
        })?;
        self.split(grads)
    }

    /// The forward outputs this backward belongs to.
    pub fn outputs(&self) -> &[Tensor] {
        self.pending.outputs()
    }

    /// The underlying per-argument backward (arguments: parameters, buffers, inputs).
    pub fn pending(&self) -> &PendingBackward {
        &self.pending
    }

    fn split(&self, grads: Vec<Option<Tensor>>) -> Result<ModuleGrads> {
        if grads.len() < self.num_lifted {
            return Err(Error::Internal(format!(
                "backward returned {} gradients for {} lifted parameters and buffers",
                grads.len(),
                self.num_lifted
            )));
        }
        let mut it = grads.into_iter();
        let params = self
            .names
            .iter()
            .take(self.num_params)
            .zip(it.by_ref())
            .filter_map(|(n, g)| g.map(|g| (n.clone(), g)))
            .collect();
        let inputs = it.skip(self.num_lifted - self.num_params).collect();
        Ok(ModuleGrads { params, inputs })
    }
}

/// Compile a module: parameters, then buffers, then the user inputs become the
/// compiled function's arguments. Compiles at the first call (see the
/// [module docs](self) for how this differs from [`aot_module_simplified`]).
///
/// ```
/// use aotgrad::nn::{Linear, Module, Optimizer, ParamStore, Params, Sgd};
/// use aotgrad::prelude::*;
/// use std::sync::Arc;
///
/// /// `mse(linear(x), target)`.
/// struct Regression {
///     store: ParamStore,
///     fc: Linear,
/// }
/// impl Module for Regression {
///     fn store(&self) -> &ParamStore {
///         &self.store
///     }
///     fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
///         let y = self.fc.apply(&p.scope("fc"), &inputs[0])?;
///         Ok(vec![y.mse_loss(&inputs[1])?])
///     }
/// }
///
/// let fc = Linear::new(3, 1, true, DType::F64, 0)?;
/// let mut store = ParamStore::new();
/// store.add_child("fc", fc.store())?;
/// let model = Arc::new(Regression { store, fc });
/// let compiled = aot_module(model.clone(), AotConfig::default())?;
/// let x = Tensor::randn(&[16, 3], DType::F64, 1)?;
/// let target = x.sum(&[1], true)?; // y = x1 + x2 + x3
/// let mut sgd = Sgd::new(0.1);
/// let mut losses = Vec::new();
/// for _ in 0..50 {
///     let (out, backward) = compiled.forward(&[x.clone(), target.clone()])?;
///     losses.push(out[0].item()?);
///     let grads = backward.backward(&[out[0].ones_like()?])?; // by parameter name
///     assert!(grads.param("fc.weight").is_some());
///     sgd.step(model.store(), &grads.params)?; // updates the module's own tensors
/// }
/// assert!(losses[49] < 0.01 * losses[0]);
/// # Ok::<(), aotgrad::Error>(())
/// ```
///
/// Graph inputs are named after the parameters and buffers (`body.0.weight`) and the
/// user inputs (`config.arg_names`, else `arg0`, `arg1`, …). Nodes traced inside the
/// built-in layers point at the line of the user's code that called the layer; when
/// the module itself is a built-in layer, at the line that called `aot_module`.
#[track_caller]
pub fn aot_module(module: Arc<dyn Module>, mut config: AotConfig) -> Result<AotModule> {
    let called_at = std::panic::Location::caller();
    let store = module.store();
    let names: Arc<[String]> = store.names().into();
    let num_params = store.params().len();
    let n = names.len();
    // `dynamic` names user inputs; the compiled function's arguments start with the
    // lifted parameters and buffers.
    for (arg, _) in &mut config.dynamic {
        *arg += n;
    }
    config.arg_names = names.iter().cloned().chain(config.arg_names.iter().cloned()).collect();
    let m = module.clone();
    let lifted = names.clone();
    let name = config.name.clone();
    let mut f = aot_function_args(
        move |args: &[Arg]| {
            let mut tensors = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                match a.tensor() {
                    Some(t) => tensors.push(t.clone()),
                    None => return Err(Error::Internal(format!("module argument {i} is not a tensor"))),
                }
            }
            if tensors.len() < n {
                return Err(Error::Internal("fewer arguments than lifted parameters".into()));
            }
            let (lifted_tensors, user) = tensors.split_at(n);
            let p = Params::new(lifted.iter().cloned().zip(lifted_tensors.iter().cloned()));
            let _user_line = aotgrad_ir::AttributeCalls::new(file!(), called_at);
            m.forward(&p, user)
        },
        config,
    )?;
    f.lifted_args = n;
    Ok(AotModule { module, f, names, num_params, name, frozen: None })
}

/// Compile a module ahead of time for `example_inputs`, under the current grad mode.
///
/// Unlike [`aot_module`], compilation happens here, not at the first call, and the
/// result never recompiles: a call whose inputs differ from the examples in metadata,
/// requires-grad flags or aliasing (or that runs under another grad mode) is an error.
/// Compiling only traces (over fake tensors): nothing the caller holds is read or
/// modified, and no random values are drawn.
#[track_caller]
pub fn aot_module_simplified(
    module: Arc<dyn Module>,
    example_inputs: &[Tensor],
    config: AotConfig,
) -> Result<AotModule> {
    let mut m = aot_module(module, config)?;
    let args = m.args(example_inputs);
    m.f.compile_for(&args)?;
    m.frozen = Some(Frozen::of(&args));
    Ok(m)
}

impl AotModule {
    /// Run the compiled training forward; the returned [`ModuleBackward`] gives the
    /// gradients of the parameters (by name) and of the user inputs. Needs grad mode on
    /// and a parameter or input that requires grad.
    pub fn forward(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, ModuleBackward)> {
        let args = self.checked_args(inputs)?;
        let before = self.f.num_compiled();
        let (outs, pending) = self.f.forward_args(&args)?;
        self.check_no_recompile(before)?;
        let back = ModuleBackward {
            pending,
            names: self.names.clone(),
            num_params: self.num_params,
            num_lifted: self.names.len(),
        };
        Ok((outs, back))
    }

    /// Call the compiled module (like [`AotFunction::call`]: with grad mode on and
    /// parameters requiring grad this runs the training forward and drops what the
    /// backward would need; wrap the call in `no_grad` for the inference graph).
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let args = self.checked_args(inputs)?;
        let before = self.f.num_compiled();
        let outs = self.f.call_args(&args)?;
        self.check_no_recompile(before)?;
        Ok(outs)
    }

    /// The module.
    pub fn module(&self) -> &Arc<dyn Module> {
        &self.module
    }

    /// The compiled function (arguments: parameters, buffers, user inputs), e.g. to
    /// inspect its graphs.
    pub fn function(&self) -> &AotFunction {
        &self.f
    }

    /// Whether this module was compiled by [`aot_module_simplified`] (no recompiles).
    pub fn is_simplified(&self) -> bool {
        self.frozen.is_some()
    }

    fn args(&self, inputs: &[Tensor]) -> Vec<Arg> {
        self.module.store().tensors().into_iter().chain(inputs.iter().cloned()).map(Arg::Tensor).collect()
    }

    fn checked_args(&self, inputs: &[Tensor]) -> Result<Vec<Arg>> {
        let args = self.args(inputs);
        if let Some(expected) = &self.frozen {
            if let Some(msg) = expected.mismatch(&Frozen::of(&args), self.names.len()) {
                return Err(Error::Call {
                    name: self.name.clone(),
                    msg: format!(
                        "{msg}; aot_module_simplified compiled for its example inputs and does not recompile \
                         (use aot_module for inputs whose metadata changes)"
                    ),
                });
            }
        }
        Ok(args)
    }

    fn check_no_recompile(&self, before: usize) -> Result<()> {
        if self.frozen.is_some() && self.f.num_compiled() != before {
            return Err(Error::Internal("aot_module_simplified recompiled for inputs matching its examples".into()));
        }
        Ok(())
    }
}

/// What the one entry of an `aot_module_simplified` module was compiled for: the call
/// signature `aot_function` keys its entries on (kinds, dtypes, autograd flags and
/// leafness, aliasing, grad mode) and the exact metadata of every argument.
struct Frozen {
    sig: CallSig,
    metas: Vec<Option<TensorMeta>>,
}

impl Frozen {
    fn of(args: &[Arg]) -> Frozen {
        Frozen { sig: call_sig(args), metas: args.iter().map(|a| a.tensor().map(Tensor::meta)).collect() }
    }

    /// What differs between this (the compiled-for call) and `got`, if anything.
    fn mismatch(&self, got: &Frozen, num_lifted: usize) -> Option<String> {
        let what = |i: usize| {
            if i < num_lifted {
                format!("parameter/buffer {i}")
            } else {
                format!("input {}", i - num_lifted)
            }
        };
        let (e, g) = (&self.sig, &got.sig);
        if e.args.len() != g.args.len() {
            return Some(format!(
                "expected {} input(s), got {}",
                e.args.len().saturating_sub(num_lifted),
                g.args.len().saturating_sub(num_lifted)
            ));
        }
        if e.grad_enabled != g.grad_enabled {
            return Some(format!(
                "compiled with grad mode {}, called with grad mode {}",
                e.grad_enabled, g.grad_enabled
            ));
        }
        for (i, ((ea, ga), (em, gm))) in e.args.iter().zip(&g.args).zip(self.metas.iter().zip(&got.metas)).enumerate() {
            if let (Some(em), Some(gm)) = (em, gm) {
                if em != gm {
                    return Some(format!("{} has metadata {gm}, compiled for {em}", what(i)));
                }
            }
            let (
                ArgSig::Tensor { requires_grad: er, leafness: el, same_object_as: eo, storage_class: es, .. },
                ArgSig::Tensor { requires_grad: gr, leafness: gl, same_object_as: go, storage_class: gs, .. },
            ) = (ea, ga)
            else {
                if ea != ga {
                    return Some(format!("{} differs in kind or value from the example", what(i)));
                }
                continue;
            };
            if er != gr {
                return Some(format!("{} has requires_grad={gr}, compiled for {er}", what(i)));
            }
            if el != gl {
                return Some(format!(
                    "{} differs in leafness (or in its base's autograd flags) from the example: {}, compiled for {}",
                    what(i),
                    describe_leafness(gl),
                    describe_leafness(el)
                ));
            }
            if eo != go || es != gs {
                return Some(format!("{} aliases other arguments differently than the example inputs", what(i)));
            }
        }
        None
    }
}

fn describe_leafness(l: &Option<Leafness>) -> String {
    match l {
        None => "-".into(),
        Some(l) => {
            let leaf = if l.is_leaf { "a leaf" } else { "a non-leaf" };
            match l.base {
                None => leaf.into(),
                Some((base_leaf, base_rg)) => format!(
                    "{leaf} view of a {}{}",
                    if base_leaf { "leaf" } else { "non-leaf" },
                    if base_rg { " that requires grad" } else { "" }
                ),
            }
        }
    }
}

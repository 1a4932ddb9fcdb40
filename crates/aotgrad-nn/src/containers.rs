//! Modules without parameters and the container that chains modules:
//! [`Dropout`] (train / eval), [`Activation`] (ReLU, GELU, tanh, sigmoid, SiLU),
//! [`MaxPool2d`], [`Flatten`] and [`Sequential`].

use crate::util::attribute_to_caller;
use crate::{expect_inputs, Module, ParamStore, Params};
use aotgrad_runtime::{Error, Result};
use aotgrad_trace::{RngSeed, Tensor};
use std::sync::Arc;

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`
/// while training; the identity in eval mode (PyTorch's `nn.Dropout`). The mask comes
/// from the thread's generator, which a compiled module takes as an input, so every
/// call draws a fresh mask exactly as eager mode does.
#[derive(Clone, Debug, Default)]
pub struct Dropout {
    store: ParamStore,
    /// Probability of zeroing an element.
    pub p: f64,
    /// Training mode (the default); `false` is eval mode.
    pub training: bool,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`, in training mode.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::Call {
                name: "Dropout".into(),
                msg: format!("dropout probability has to be between 0 and 1, but got {p}"),
            });
        }
        Ok(Dropout { store: ParamStore::new(), p, training: true })
    }

    /// The same layer in eval mode (the identity).
    pub fn eval(mut self) -> Dropout {
        self.training = false;
        self
    }

    /// The same layer in training mode.
    pub fn train(mut self) -> Dropout {
        self.training = true;
        self
    }

    /// Apply to `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.dropout(self.p, self.training, RngSeed::Global)?)
    }
}

impl Module for Dropout {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, _p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Dropout", inputs, 1)?;
        Ok(vec![self.apply(&x[0])?])
    }
}

/// Which activation an [`Activation`] module applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationKind {
    /// `max(x, 0)`.
    Relu,
    /// GELU with the exact (erf) form, PyTorch's default.
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `x * sigmoid(x)`.
    Silu,
}

/// An elementwise activation as a module (PyTorch's `nn.ReLU`, `nn.GELU`, ...), for
/// [`Sequential`].
#[derive(Clone, Debug)]
pub struct Activation {
    store: ParamStore,
    /// The function.
    pub kind: ActivationKind,
}

impl Activation {
    /// The activation `kind`.
    pub fn new(kind: ActivationKind) -> Activation {
        Activation { store: ParamStore::new(), kind }
    }

    /// Apply to `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.kind {
            ActivationKind::Relu => x.relu(),
            ActivationKind::Gelu => x.gelu(),
            ActivationKind::Tanh => x.tanh(),
            ActivationKind::Sigmoid => x.sigmoid(),
            ActivationKind::Silu => x.silu(),
        }?)
    }
}

impl Module for Activation {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, _p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Activation", inputs, 1)?;
        Ok(vec![self.apply(&x[0])?])
    }
}

/// 2-D max pooling (PyTorch's `nn.MaxPool2d`, stride defaulting to the kernel).
#[derive(Clone, Debug)]
pub struct MaxPool2d {
    store: ParamStore,
    /// Window.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// -inf added on each side.
    pub padding: [usize; 2],
}

impl MaxPool2d {
    /// Windows of `kernel`, stepping by the kernel, no padding.
    pub fn new(kernel: [usize; 2]) -> MaxPool2d {
        MaxPool2d { store: ParamStore::new(), kernel, stride: kernel, padding: [0, 0] }
    }
}

impl Module for MaxPool2d {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, _p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("MaxPool2d", inputs, 1)?;
        Ok(vec![x[0].max_pool2d(self.kernel, Some(self.stride), self.padding, [1, 1])?])
    }
}

/// Flattens every dim after the first (PyTorch's `nn.Flatten()`): `[N, ...]` to
/// `[N, prod(...)]`.
#[derive(Clone, Debug, Default)]
pub struct Flatten {
    store: ParamStore,
}

impl Flatten {
    /// The layer.
    pub fn new() -> Flatten {
        Flatten::default()
    }
}

impl Module for Flatten {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, _p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Flatten", inputs, 1)?;
        let mut shape = vec![x[0].size(0)?];
        let rest: Vec<aotgrad_ir::Dim> = x[0].shape().into_iter().skip(1).collect();
        shape.push(aotgrad_ir::Dim::product(&rest));
        Ok(vec![x[0].reshape_dims(&shape)?])
    }
}

/// Modules applied one after the other, each to the previous one's single output
/// (PyTorch's `nn.Sequential`); the `i`-th module's tensors are named `"{i}.{name}"`,
/// as in PyTorch's state dicts.
#[derive(Clone, Default)]
pub struct Sequential {
    store: ParamStore,
    modules: Vec<Arc<dyn Module>>,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("modules", &self.modules.len())
            .field("tensors", &self.store.names())
            .finish()
    }
}

impl Sequential {
    /// An empty sequence (the identity).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// The sequence with `m` appended.
    pub fn push(mut self, m: impl Module + 'static) -> Result<Sequential> {
        self.store.add_child(&self.modules.len().to_string(), m.store())?;
        self.modules.push(Arc::new(m));
        Ok(self)
    }

    /// How many modules it chains.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether it chains none.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Apply to `x`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        // The children run through `dyn Module`: what built-in layers trace points at
        // this call's caller, as a direct call of the layer would.
        let _caller = aotgrad_ir::AttributeCalls::new(file!(), std::panic::Location::caller());
        for (i, m) in self.modules.iter().enumerate() {
            let mut out = m.forward(&p.scope(&i.to_string()), std::slice::from_ref(&h))?;
            if out.len() != 1 {
                return Err(aotgrad_trace::Error::Invalid {
                    op: "Sequential".into(),
                    loc: aotgrad_ir::SourceLoc::caller(),
                    msg: format!("module {i} returned {} outputs; a sequence needs exactly one", out.len()),
                }
                .into());
            }
            h = out.remove(0);
        }
        Ok(h)
    }
}

impl Module for Sequential {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Sequential", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

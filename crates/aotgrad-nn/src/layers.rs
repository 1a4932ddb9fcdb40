//! Basic layers: [`Linear`], [`Conv2d`], [`LayerNorm`], [`Embedding`], and the two MLPs
//! ([`GeluMlp`]: Linear → GELU → Linear; [`Mlp`]: N × (Linear + GELU)).
//!
//! Each layer has an `apply` method taking the [`Params`] view of its own names, used
//! by parent modules (`self.fc1.apply(&p.scope("fc1"), &x)`), and implements
//! [`Module`] with one input and one output.

use crate::util::attribute_to_caller;
use crate::{child_seed, expect_inputs, Module, ParamStore, Params};
use aotgrad_ir::DType;
use aotgrad_runtime::{Error, Result};
use aotgrad_trace::Tensor;

/// Uniform values in `[-bound, bound)`.
pub(crate) fn uniform(shape: &[usize], bound: f64, dtype: DType, seed: u64) -> Result<Tensor> {
    Ok(Tensor::rand(shape, dtype, seed)?.mul(2.0 * bound)?.sub(bound)?)
}

fn config_error(module: &str, msg: impl Into<String>) -> Error {
    Error::Call { name: module.into(), msg: msg.into() }
}

/// How [`Linear::with_init`] initializes a weight `(out, in)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// PyTorch's `nn.Linear` default: weight and bias uniform in `±1/sqrt(in)`.
    PyTorchDefault,
    /// Kaiming (He) uniform for layers followed by a ReLU-like activation (GELU):
    /// weight uniform in `±sqrt(6/in)` (gain `sqrt(2)`, fan-in mode); bias zero.
    KaimingUniform,
    /// Xavier (Glorot) uniform for layers followed by no or a symmetric activation
    /// (projections, classifier heads): weight uniform in `±sqrt(6/(in + out))`;
    /// bias zero.
    XavierUniform,
}

/// `y = x W^T + b`, with `weight` of shape `(out, in)` and `bias` of shape `(out)`.
#[derive(Clone, Debug)]
pub struct Linear {
    store: ParamStore,
    has_bias: bool,
    /// Input features.
    pub in_features: usize,
    /// Output features.
    pub out_features: usize,
}

impl Linear {
    /// A linear layer with PyTorch's default initialization: weight and bias uniform
    /// in `±1/sqrt(in_features)`.
    pub fn new(in_features: usize, out_features: usize, bias: bool, dtype: DType, seed: u64) -> Result<Linear> {
        Linear::with_init(in_features, out_features, bias, Init::PyTorchDefault, dtype, seed)
    }

    /// A linear layer initialized by `init`.
    pub fn with_init(
        in_features: usize,
        out_features: usize,
        bias: bool,
        init: Init,
        dtype: DType,
        seed: u64,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(config_error("Linear", "in_features and out_features must be positive"));
        }
        let (fan_in, fan_out) = (in_features as f64, out_features as f64);
        let bound = match init {
            Init::PyTorchDefault => 1.0 / fan_in.sqrt(),
            Init::KaimingUniform => (6.0 / fan_in).sqrt(),
            Init::XavierUniform => (6.0 / (fan_in + fan_out)).sqrt(),
        };
        let mut store = ParamStore::new();
        store.add_param("weight", uniform(&[out_features, in_features], bound, dtype, child_seed(seed, 0))?)?;
        if bias {
            let b = match init {
                Init::PyTorchDefault => uniform(&[out_features], 1.0 / fan_in.sqrt(), dtype, child_seed(seed, 1))?,
                Init::KaimingUniform | Init::XavierUniform => Tensor::zeros(&[out_features], dtype)?,
            };
            store.add_param("bias", b)?;
        }
        Ok(Linear { store, has_bias: bias, in_features, out_features })
    }

    /// Apply to `x` of shape `(*, in_features)`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let w = p.get("weight")?;
        if self.has_bias {
            Ok(x.linear(w, Some(p.get("bias")?))?)
        } else {
            Ok(x.linear(w, None)?)
        }
    }
}

impl Module for Linear {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Linear", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// Layer normalization over the last dim, with a learned scale (`weight`, ones) and
/// shift (`bias`, zeros).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    store: ParamStore,
    /// The normalized (last) dim's size.
    pub dim: usize,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm over a last dim of size `dim` (PyTorch's default `eps` is `1e-5`).
    pub fn new(dim: usize, eps: f64, dtype: DType) -> Result<LayerNorm> {
        if dim == 0 {
            return Err(config_error("LayerNorm", "dim must be positive"));
        }
        let mut store = ParamStore::new();
        store.add_param("weight", Tensor::ones(&[dim], dtype)?)?;
        store.add_param("bias", Tensor::zeros(&[dim], dtype)?)?;
        Ok(LayerNorm { store, dim, eps })
    }

    /// Apply to `x` of shape `(*, dim)`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        Ok(x.layer_norm(&[self.dim as i64], Some(p.get("weight")?), Some(p.get("bias")?), self.eps)?)
    }
}

impl Module for LayerNorm {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("LayerNorm", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// A lookup table: integer indices `(*)` to rows of `weight` `(num, dim)`, giving `(*, dim)`.
#[derive(Clone, Debug)]
pub struct Embedding {
    store: ParamStore,
    /// Number of rows.
    pub num_embeddings: usize,
    /// Row size.
    pub embedding_dim: usize,
}

impl Embedding {
    /// An embedding table initialized with standard normal values (as in PyTorch).
    pub fn new(num_embeddings: usize, embedding_dim: usize, dtype: DType, seed: u64) -> Result<Embedding> {
        if num_embeddings == 0 || embedding_dim == 0 {
            return Err(config_error("Embedding", "num_embeddings and embedding_dim must be positive"));
        }
        let mut store = ParamStore::new();
        store.add_param("weight", Tensor::randn(&[num_embeddings, embedding_dim], dtype, child_seed(seed, 0))?)?;
        Ok(Embedding { store, num_embeddings, embedding_dim })
    }

    /// Look up `indices` (an integer tensor).
    #[track_caller]
    pub fn apply(&self, p: &Params, indices: &Tensor) -> Result<Tensor> {
        Ok(Tensor::embedding(indices, p.get("weight")?)?)
    }
}

impl Module for Embedding {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Embedding", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// Linear → GELU → Linear (`fc1`, `fc2`), the MLP of a transformer block.
#[derive(Clone, Debug)]
pub struct GeluMlp {
    store: ParamStore,
    /// First layer.
    pub fc1: Linear,
    /// Second layer.
    pub fc2: Linear,
}

impl GeluMlp {
    /// `d_in → d_hidden → d_out`, both layers with bias.
    pub fn new(d_in: usize, d_hidden: usize, d_out: usize, dtype: DType, seed: u64) -> Result<GeluMlp> {
        let fc1 = Linear::new(d_in, d_hidden, true, dtype, child_seed(seed, 0))?;
        let fc2 = Linear::new(d_hidden, d_out, true, dtype, child_seed(seed, 1))?;
        let mut store = ParamStore::new();
        store.add_child("fc1", fc1.store())?;
        store.add_child("fc2", fc2.store())?;
        Ok(GeluMlp { store, fc1, fc2 })
    }

    /// Apply to `x` of shape `(*, d_in)`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.apply(&p.scope("fc1"), x)?.gelu()?;
        self.fc2.apply(&p.scope("fc2"), &h)
    }
}

impl Module for GeluMlp {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("GeluMlp", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// N × (Linear + GELU), layers named `layers.0`, `layers.1`, ... The benchmark MLP
/// is `Mlp::new(&[512; 5], ..)`: four 512 → 512 layers, each followed by GELU.
#[derive(Clone, Debug)]
pub struct Mlp {
    store: ParamStore,
    /// The layers.
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Layers `sizes[i] → sizes[i + 1]` (at least two sizes), each with bias.
    pub fn new(sizes: &[usize], dtype: DType, seed: u64) -> Result<Mlp> {
        if sizes.len() < 2 {
            return Err(config_error("Mlp", format!("needs at least two sizes, got {sizes:?}")));
        }
        let mut store = ParamStore::new();
        let mut layers = Vec::with_capacity(sizes.len() - 1);
        for (i, w) in sizes.windows(2).enumerate() {
            let l = Linear::new(w[0], w[1], true, dtype, child_seed(seed, i as u64))?;
            store.add_child(&format!("layers.{i}"), l.store())?;
            layers.push(l);
        }
        Ok(Mlp { store, layers })
    }

    /// Apply to `x` of shape `(*, sizes[0])`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.apply(&p.scope(&format!("layers.{i}")), &h)?.gelu()?;
        }
        Ok(h)
    }
}

impl Module for Mlp {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Mlp", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// A 2-D convolution layer (PyTorch's `nn.Conv2d`): `weight` `[out, in / groups, kh,
/// kw]` and an optional `bias` `[out]`, both uniform in `±1/sqrt(fan_in)` with
/// `fan_in = in / groups * kh * kw` (PyTorch's default initialization).
#[derive(Clone, Debug)]
pub struct Conv2d {
    store: ParamStore,
    has_bias: bool,
    /// Stride, padding, dilation and groups.
    pub opts: aotgrad_trace::Conv2dOpts,
}

impl Conv2d {
    /// `in_channels → out_channels` with a `kernel` window.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: aotgrad_trace::Conv2dOpts,
        bias: bool,
        dtype: DType,
        seed: u64,
    ) -> Result<Conv2d> {
        let g = opts.groups;
        if in_channels == 0 || out_channels == 0 || kernel.contains(&0) {
            return Err(config_error("Conv2d", "channels and kernel sizes must be positive"));
        }
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(config_error(
                "Conv2d",
                format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({g})"
                ),
            ));
        }
        let fan_in = (in_channels / g * kernel[0] * kernel[1]) as f64;
        let bound = 1.0 / fan_in.sqrt();
        let mut store = ParamStore::new();
        let shape = [out_channels, in_channels / g, kernel[0], kernel[1]];
        store.add_param("weight", uniform(&shape, bound, dtype, child_seed(seed, 0))?)?;
        if bias {
            store.add_param("bias", uniform(&[out_channels], bound, dtype, child_seed(seed, 1))?)?;
        }
        Ok(Conv2d { store, has_bias: bias, opts })
    }

    /// Apply to `x` of shape `[N, in, H, W]` (or `[in, H, W]`).
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let bias = if self.has_bias { Some(p.get("bias")?) } else { None };
        Ok(x.conv2d(p.get("weight")?, bias, self.opts)?)
    }
}

impl Module for Conv2d {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("Conv2d", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// Batch normalization over the channels of `[N, C, H, W]` (PyTorch's
/// `nn.BatchNorm2d`): a learned scale (`weight`, ones) and shift (`bias`, zeros), and
/// the buffers `running_mean` (zeros), `running_var` (ones) and `num_batches_tracked`
/// (i64), which a training-mode call updates in place. Under `aot_module` that is a
/// buffer mutation: the compiled graph returns the new values and the epilogue writes
/// them into the module's buffers, as eager mode would.
#[derive(Clone, Debug)]
pub struct BatchNorm2d {
    store: ParamStore,
    /// Channels.
    pub channels: usize,
    /// Added to the variance.
    pub eps: f64,
    /// Weight of the batch statistics in the running ones.
    pub momentum: f64,
    /// Training mode (the default): batch statistics, running ones updated; else the
    /// running statistics normalize.
    pub training: bool,
}

impl BatchNorm2d {
    /// PyTorch's defaults: `eps = 1e-5`, `momentum = 0.1`, training mode.
    pub fn new(channels: usize, dtype: DType) -> Result<BatchNorm2d> {
        if channels == 0 {
            return Err(config_error("BatchNorm2d", "channels must be positive"));
        }
        let mut store = ParamStore::new();
        store.add_param("weight", Tensor::ones(&[channels], dtype)?)?;
        store.add_param("bias", Tensor::zeros(&[channels], dtype)?)?;
        store.add_buffer("running_mean", Tensor::zeros(&[channels], dtype)?)?;
        store.add_buffer("running_var", Tensor::ones(&[channels], dtype)?)?;
        store.add_buffer("num_batches_tracked", Tensor::zeros(&[], DType::I64)?)?;
        Ok(BatchNorm2d { store, channels, eps: 1e-5, momentum: 0.1, training: true })
    }

    /// The same layer in eval mode.
    pub fn eval(mut self) -> BatchNorm2d {
        self.training = false;
        self
    }

    /// Apply to `x` of shape `[N, channels, H, W]`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        if x.dim() != 4 {
            return Err(aotgrad_trace::Error::Invalid {
                op: "BatchNorm2d".into(),
                loc: aotgrad_ir::SourceLoc::caller(),
                msg: format!("expected a 4-D input [N, C, H, W], got {} dims", x.dim()),
            }
            .into());
        }
        if self.training {
            let _no_grad = aotgrad_trace::NoGradGuard::new();
            p.get("num_batches_tracked")?.add_(1)?;
        }
        Ok(x.batch_norm(
            Some(p.get("running_mean")?),
            Some(p.get("running_var")?),
            Some(p.get("weight")?),
            Some(p.get("bias")?),
            self.training,
            self.momentum,
            self.eps,
        )?)
    }
}

impl Module for BatchNorm2d {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("BatchNorm2d", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

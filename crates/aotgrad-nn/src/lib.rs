//! `aotgrad-nn`: small neural-network building blocks that compile ahead of time.
//!
//! A [`Module`] owns its tensors in a [`ParamStore`] but its `forward` reads them
//! through a [`Params`] view, so the same code runs eagerly (the view holds the real
//! tensors, [`Module::forward_eager`]) and under `aot_module` (the view holds the fake
//! graph inputs the parameters are lifted to).
//!
//! - [`layers`] holds [`Linear`], [`Conv2d`], [`BatchNorm2d`], [`LayerNorm`], [`Embedding`], [`GeluMlp`], [`Mlp`];
//! - [`containers`] holds [`Dropout`] (train / eval), [`Activation`], [`MaxPool2d`],
//!   [`Flatten`] and [`Sequential`];
//! - [`attention`] holds [`MultiHeadSelfAttention`], [`TransformerBlock`];
//! - [`optim`] holds the [`Optimizer`] interface, [`Sgd`], [`AdamW`] (and Adam, via
//!   [`AdamW::adam`]), [`clip_grad_norm`] and the
//!   [`WarmupCosine`] learning-rate schedule;
//! - [`checkpoint`] saves and loads modules and optimizer state as safetensors;
//! - [`params`] holds [`ParamStore`], [`Params`] and the [`Module`] trait (from
//!   `aotgrad-runtime`, which compiles modules).
//!
//! Initialization is deterministic (from a seed) and follows PyTorch's default scales:
//! linear weights and biases uniform in `±1/sqrt(fan_in)`, embeddings standard normal,
//! layer-norm weights one and biases zero.
//!
//! A [`Sequential`] of built-in layers, run eagerly and compiled:
//!
//! ```
//! use aotgrad::nn::{Activation, ActivationKind, Linear, Module, Sequential};
//! use aotgrad::prelude::*;
//! use std::sync::Arc;
//!
//! let net = Sequential::new()
//!     .push(Linear::new(4, 8, true, DType::F32, 0)?)?
//!     .push(Activation::new(ActivationKind::Gelu))?
//!     .push(Linear::new(8, 2, true, DType::F32, 1)?)?;
//! // Parameters are named by position: "0.weight", "0.bias", "2.weight", ...
//! assert_eq!(net.store().names()[..2], ["0.weight".to_string(), "0.bias".to_string()]);
//! let x = Tensor::randn(&[3, 4], DType::F32, 7)?;
//! let eager = net.forward_eager(std::slice::from_ref(&x))?;
//! let compiled = aot_module(Arc::new(net), AotConfig::default())?;
//! let out = no_grad(|| compiled.call(std::slice::from_ref(&x)))?;
//! assert_eq!(out[0].sizes()?, vec![3, 2]);
//! let (a, b) = (eager[0].to_vec_f64()?, out[0].to_vec_f64()?);
//! assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 1e-5));
//! # Ok::<(), aotgrad::Error>(())
//! ```

pub mod attention;
pub mod checkpoint;
pub mod containers;
pub mod layers;
pub mod optim;
mod util;

/// The module interface and its parameter store, defined by the runtime (which
/// lifts them as graph inputs when it compiles a module).
pub use aotgrad_runtime::params::{self, Module, ParamStore, Params};
pub use attention::{MultiHeadSelfAttention, TransformerBlock};
pub use containers::{Activation, ActivationKind, Dropout, Flatten, MaxPool2d, Sequential};
pub use layers::{BatchNorm2d, Conv2d, Embedding, GeluMlp, Init, LayerNorm, Linear, Mlp};
pub use optim::{clip_grad_norm, AdamW, Optimizer, OptimizerState, Sgd, WarmupCosine};
pub use util::{child_seed, expect_inputs};

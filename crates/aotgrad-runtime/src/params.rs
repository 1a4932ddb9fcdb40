//! Named parameters and buffers ([`ParamStore`]) and the view a module's forward
//! reads them through ([`Params`]).
//!
//! A module never reads its own tensors directly in `forward`: it asks a [`Params`] for
//! them by name. Eagerly that view holds the module's real tensors; while
//! `aot_module` traces it holds the fake graph inputs that stand for them, so the
//! parameters become graph inputs instead of constants baked into the graph.

use crate::error::{Error, Result};
use aotgrad_ir::SourceLoc;
use aotgrad_trace::Tensor;
use std::collections::HashMap;
use std::sync::Arc;

/// The ordered, named parameters and buffers of a module.
///
/// Parameters are trainable (they require grad); buffers are state that is not trained
/// but may be updated by the forward under no-grad (running statistics, counters).
/// Names are unique across both lists; nested modules use dotted names
/// (`attn.qkv.weight`).
#[derive(Clone, Debug, Default)]
pub struct ParamStore {
    params: Vec<(String, Tensor)>,
    buffers: Vec<(String, Tensor)>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> ParamStore {
        ParamStore::default()
    }

    fn check_new(&self, name: &str, t: &Tensor, what: &str) -> Result<()> {
        if name.is_empty() {
            return Err(Error::Call { name: "ParamStore".into(), msg: format!("a {what} needs a non-empty name") });
        }
        if self.get(name).is_some() {
            return Err(Error::Call {
                name: "ParamStore".into(),
                msg: format!("a tensor named `{name}` already exists"),
            });
        }
        if t.is_fake() {
            return Err(Error::Call {
                name: "ParamStore".into(),
                msg: format!("{what} `{name}` is a fake tensor; create modules outside of tracing"),
            });
        }
        Ok(())
    }

    /// Register a parameter: the tensor is marked as requiring grad (it must be a
    /// floating-point leaf). Returns the registered handle.
    pub fn add_param(&mut self, name: impl Into<String>, t: Tensor) -> Result<Tensor> {
        let name = name.into();
        self.check_new(&name, &t, "parameter")?;
        t.set_requires_grad(true)?;
        self.params.push((name, t.clone()));
        Ok(t)
    }

    /// Register a buffer (its requires-grad flag is left as it is). Returns the handle.
    pub fn add_buffer(&mut self, name: impl Into<String>, t: Tensor) -> Result<Tensor> {
        let name = name.into();
        self.check_new(&name, &t, "buffer")?;
        self.buffers.push((name, t.clone()));
        Ok(t)
    }

    /// Register every parameter and buffer of a child module under `prefix.`: the
    /// handles are shared, so the child and the parent see the same tensors.
    pub fn add_child(&mut self, prefix: &str, child: &ParamStore) -> Result<()> {
        for (n, t) in &child.params {
            let name = format!("{prefix}.{n}");
            self.check_new(&name, t, "parameter")?;
            self.params.push((name, t.clone()));
        }
        for (n, t) in &child.buffers {
            let name = format!("{prefix}.{n}");
            self.check_new(&name, t, "buffer")?;
            self.buffers.push((name, t.clone()));
        }
        Ok(())
    }

    /// The parameters, in registration order.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The buffers, in registration order.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// The parameter or buffer named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.params.iter().chain(&self.buffers).find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Parameter names then buffer names: the order in which `aot_module` lifts them
    /// as graph inputs.
    pub fn names(&self) -> Vec<String> {
        self.params.iter().chain(&self.buffers).map(|(n, _)| n.clone()).collect()
    }

    /// Parameter handles then buffer handles (the order of [`ParamStore::names`]).
    pub fn tensors(&self) -> Vec<Tensor> {
        self.params.iter().chain(&self.buffers).map(|(_, t)| t.clone()).collect()
    }

    /// Total number of parameter elements.
    pub fn num_param_elements(&self) -> usize {
        self.params.iter().map(|(_, t)| t.sizes().map(|s| s.iter().product::<usize>()).unwrap_or(0)).sum()
    }
}

/// The tensors a module's forward runs with, by name: the module's own tensors
/// eagerly, or the graph inputs standing for them while tracing.
///
/// Cheap to clone; [`Params::scope`] gives a child module the view under its prefix.
#[derive(Clone, Debug)]
pub struct Params {
    map: Arc<HashMap<String, Tensor>>,
    prefix: String,
}

impl Params {
    /// A view over `(name, tensor)` pairs.
    pub fn new(pairs: impl IntoIterator<Item = (String, Tensor)>) -> Params {
        Params { map: Arc::new(pairs.into_iter().collect()), prefix: String::new() }
    }

    /// A view over a store's own tensors (eager execution).
    pub fn from_store(store: &ParamStore) -> Params {
        Params::new(store.params.iter().chain(&store.buffers).cloned())
    }

    /// The tensor named `name` (under this view's prefix).
    #[track_caller]
    pub fn get(&self, name: &str) -> crate::Result<&Tensor> {
        let full = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        match self.map.get(&full) {
            Some(t) => Ok(t),
            None => Err(aotgrad_trace::Error::Invalid {
                op: "param".into(),
                loc: SourceLoc::caller(),
                msg: format!("the module has no parameter or buffer named `{full}`"),
            }
            .into()),
        }
    }

    /// The view of child module `child` (names under `child.`).
    pub fn scope(&self, child: &str) -> Params {
        let prefix = if self.prefix.is_empty() { child.to_string() } else { format!("{}.{child}", self.prefix) };
        Params { map: self.map.clone(), prefix }
    }
}

/// A module: named parameters and buffers plus a forward that reads them by name.
pub trait Module: Send + Sync {
    /// The module's parameters and buffers.
    fn store(&self) -> &ParamStore;

    /// Run the forward with the tensors of `p` standing for the parameters and buffers.
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> crate::Result<Vec<Tensor>>;

    /// Run the forward eagerly with the module's own tensors.
    #[track_caller]
    fn forward_eager(&self, inputs: &[Tensor]) -> crate::Result<Vec<Tensor>> {
        self.forward(&Params::from_store(self.store()), inputs)
    }
}

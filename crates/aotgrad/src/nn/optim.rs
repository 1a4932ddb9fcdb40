//! [`Sgd`]: plain stochastic gradient descent, updating parameters in place.

use super::ParamStore;
use crate::error::{Error, Result};
use aotgrad_trace::{NoGradGuard, Tensor};

/// Stochastic gradient descent: `p -= lr * grad` for every parameter with a gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// The learning rate.
    pub lr: f64,
}

impl Sgd {
    /// SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Sgd {
        Sgd { lr }
    }

    /// Update the parameters of `store` in place (under no-grad, so autograd does not
    /// see it) from `(parameter name, gradient)` pairs, e.g. `ModuleGrads::params`.
    /// The parameter handles stay the same objects, so compiled modules keep using them.
    pub fn step(&self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        let _no_grad = NoGradGuard::new();
        for (name, g) in grads {
            let p = store
                .params()
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::Call { name: "Sgd".into(), msg: format!("no parameter named `{name}`") })?;
            if g.sizes()? != p.sizes()? {
                return Err(Error::Call {
                    name: "Sgd".into(),
                    msg: format!("gradient of `{name}` has shape {:?}, parameter has {:?}", g.sizes()?, p.sizes()?),
                });
            }
            p.sub_(&g.mul(self.lr)?)?;
        }
        Ok(())
    }
}

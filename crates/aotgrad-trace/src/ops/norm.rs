//! Batch and group normalization as decompositions into core ops.
//!
//! `batch_norm` in training mode normalizes with the batch's statistics and updates
//! the running statistics **in place** (under no-grad, as PyTorch does): when they
//! are a module's buffers, that is an input mutation of the compiled graph, which
//! functionalization turns into a returned value and the epilogue copies back.

use crate::error::{Error, Result};
use crate::grad_mode::no_grad;
use crate::tensor::Tensor;
use aotgrad_ir::{Dim, SourceLoc};

fn shape_text(t: &Tensor) -> String {
    let s: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("[{}]", s.join(", "))
}

/// `[1, C, 1, ...]` for a per-channel vector over an input of rank `rank`.
fn per_channel(v: &Tensor, rank: usize) -> Result<Tensor> {
    let mut shape = vec![Dim::Const(1); rank];
    shape[1] = v.size(0)?;
    v.reshape_dims(&shape)
}

/// **Normalization**: `batch_norm` (training mode updates the running statistics in
/// place) and `group_norm`; `layer_norm` is with the composite ops.
impl Tensor {
    /// Batch normalization over dim 1 of `self` `[N, C, *]` (PyTorch's `batch_norm`).
    ///
    /// With `training`, the statistics are the batch's (the biased variance
    /// normalizes) and the running statistics, when given, are updated in place:
    /// `running = (1 - momentum) * running + momentum * batch`, with the unbiased
    /// variance. Without, the running statistics normalize (both are then required).
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let bad = |msg: String| Error::invalid("batch_norm", &loc, msg);
        let rank = self.dim();
        if rank < 2 {
            return Err(bad(format!("expected an input of at least 2 dims [N, C, *], got {}", shape_text(self))));
        }
        if !self.dtype().is_float() {
            return Err(bad(format!("needs a floating input, got {}", self.dtype())));
        }
        let c = self.size(1)?;
        for (name, t) in
            [("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)]
        {
            if let Some(t) = t {
                if t.dim() != 1 || (t.size(0)?.as_const().is_some() && c.as_const().is_some() && t.size(0)? != c) {
                    return Err(bad(format!("expected {name} of shape [{c}], got {}", shape_text(t))));
                }
            }
        }
        let dims: Vec<i64> = (0..rank as i64).filter(|&d| d != 1).collect();
        let (mean, var) = if training {
            let count: Option<i64> =
                dims.iter().map(|&d| self.size(d).ok().and_then(|s| s.as_const())).product::<Option<i64>>();
            if count == Some(1) {
                return Err(bad(format!(
                    "expected more than 1 value per channel when training, got input size {}",
                    shape_text(self)
                )));
            }
            let mean = self.mean(&dims, true)?;
            let var = self.sub(&mean)?.mul(&self.sub(&mean)?)?.mean(&dims, true)?;
            if let (Some(rm), Some(rv)) = (running_mean, running_var) {
                no_grad(|| -> Result<()> {
                    let n = count.ok_or_else(|| bad("needs concrete sizes to update the running statistics".into()))?;
                    let unbiased = var.mul(n as f64 / (n - 1) as f64)?;
                    rm.mul_(1.0 - momentum)?.add_(&mean.reshape_dims(std::slice::from_ref(&c))?.mul(momentum)?)?;
                    rv.mul_(1.0 - momentum)?.add_(&unbiased.reshape_dims(std::slice::from_ref(&c))?.mul(momentum)?)?;
                    Ok(())
                })?;
            } else if running_mean.is_some() != running_var.is_some() {
                return Err(bad("running_mean and running_var are given together or not at all".into()));
            }
            (mean, var)
        } else {
            let (Some(rm), Some(rv)) = (running_mean, running_var) else {
                return Err(bad("running_mean and running_var must be defined in evaluation mode".into()));
            };
            (per_channel(rm, rank)?, per_channel(rv, rank)?)
        };
        let mut y = self.sub(&mean)?.mul(&var.add(eps)?.rsqrt()?)?;
        if let Some(w) = weight {
            y = y.mul(&per_channel(w, rank)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&per_channel(b, rank)?)?;
        }
        Ok(y)
    }

    /// Group normalization (PyTorch's `group_norm`): the `C` channels of `self`
    /// `[N, C, *]` in `groups` groups, each normalized over its channels and the
    /// other dims with its own statistics, then scaled and shifted per channel.
    #[track_caller]
    pub fn group_norm(
        &self,
        groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let bad = |msg: String| Error::invalid("group_norm", &loc, msg);
        let rank = self.dim();
        if rank < 2 {
            return Err(bad(format!("expected an input of at least 2 dims [N, C, *], got {}", shape_text(self))));
        }
        let c = self.size(1)?;
        if groups == 0 || c.as_const().is_some_and(|c| c % groups as i64 != 0) {
            return Err(bad(format!("expected the number of channels {c} to be divisible by num_groups={groups}")));
        }
        // [N, G, C/G * rest...] -> statistics over the last dim.
        let shape = self.shape();
        let g = Dim::Const(groups as i64);
        let rest: Option<i64> = shape[1..].iter().map(Dim::as_const).product();
        let per_group = Dim::Const(
            rest.ok_or_else(|| bad(format!("needs concrete channel and spatial sizes, got {}", shape_text(self))))?
                / groups as i64,
        );
        let xg = self.reshape_dims(&[shape[0].clone(), g, per_group])?;
        let mean = xg.mean(&[2], true)?;
        let xc = xg.sub(&mean)?;
        let var = xc.mul(&xc)?.mean(&[2], true)?;
        let mut y = xc.mul(&var.add(eps)?.rsqrt()?)?.reshape_dims(&shape)?;
        if let Some(w) = weight {
            y = y.mul(&per_channel(w, rank)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&per_channel(b, rank)?)?;
        }
        Ok(y)
    }
}

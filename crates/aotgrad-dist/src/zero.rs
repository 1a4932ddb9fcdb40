//! ZeRO stage 1: AdamW with its state sharded across the ranks.
//!
//! The module's f32 parameters are laid end to end in module order (padded with zeros
//! to a multiple of the number of ranks) and cut into one contiguous shard per rank.
//! Each step
//! 1. lays this rank's own (unaveraged) gradients out the same way and
//!    **reduce-scatters** them: each rank receives the sum over ranks of its shard
//!    only, and divides it by the number of ranks;
//! 2. runs the **compiled AdamW update** ([`AdamW`], the same kernels as one process)
//!    on its shard: a 1-D copy of its part of the parameters and the moments of that
//!    part alone, so the optimizer's state per rank is 1/N of AdamW's (plus the
//!    shard's working copy of its parameters, half that again);
//! 3. **allgathers** the updated shards and copies them into every parameter.
//!
//! Every parameter value comes from exactly one rank's update, so every rank holds
//! bit-identical parameters after each step.
//!
//! A checkpoint needs the whole state: [`ZeroAdamW::gather`] (a collective: every
//! rank calls it) assembles the moments of every parameter under the names one
//! process's AdamW uses, and [`Optimizer::state`] then returns that; the checkpoint
//! loads into AdamW in one process or into `ZeroAdamW` on any number of ranks
//! ([`Optimizer::load_state`] takes its own shard out of the whole state).

use crate::error::{Error, Result};
use crate::world::World;
use aotgrad_ir::DType;
use aotgrad_nn::{AdamW, Optimizer, OptimizerState, ParamStore};
use aotgrad_trace::{NoGradGuard, Tensor};
use std::rc::Rc;

/// AdamW with ZeRO-1 sharding; see the [module docs](self).
pub struct ZeroAdamW {
    world: Rc<World>,
    inner: AdamW,
    /// One parameter, `shard`: this rank's part of the flat parameters.
    shard_store: ParamStore,
    shard: Tensor,
    /// `(name, shape, offset, elements)` of every parameter, in module order.
    layout: Vec<(String, Vec<usize>, usize, usize)>,
    /// Elements of a shard (the padded total is `shard_len * ranks`).
    shard_len: usize,
    /// The whole state from the last [`ZeroAdamW::gather`], with the step it was taken at.
    gathered: Option<(u64, OptimizerState)>,
    steps: u64,
}

fn zero_error(msg: impl Into<String>) -> aotgrad_runtime::Error {
    aotgrad_runtime::Error::Trace(aotgrad_trace::Error::External(msg.into().into()))
}

impl ZeroAdamW {
    /// Shard `inner`'s state for the parameters of `store` (all f32) across `world`'s
    /// ranks. Every rank must call this with the same parameters (wrap the module in
    /// [`crate::DistributedDataParallel`] first, which checks that and broadcasts
    /// rank 0's values).
    pub fn new(world: Rc<World>, store: &ParamStore, inner: AdamW) -> Result<ZeroAdamW> {
        let mut layout = Vec::new();
        let mut total = 0;
        for (name, t) in store.params() {
            if t.dtype() != DType::F32 {
                return Err(Error::Invalid(format!(
                    "ZeroAdamW shards f32 parameters; {name} is {:?} (use AdamW with DistributedDataParallel)",
                    t.dtype()
                )));
            }
            let shape = t.sizes()?;
            let n: usize = shape.iter().product();
            layout.push((name.clone(), shape, total, n));
            total += n;
        }
        let ranks = world.size();
        let shard_len = total.div_ceil(ranks).max(1);
        let mut shard_store = ParamStore::new();
        let shard = shard_store.add_param("shard", Tensor::zeros(&[shard_len], DType::F32)?)?;
        let z = ZeroAdamW { world, inner, shard_store, shard, layout, shard_len, gathered: None, steps: 0 };
        z.load_shard(store)?;
        Ok(z)
    }

    /// The wrapped AdamW (its step count, learning rate, compiled update).
    pub fn inner(&self) -> &AdamW {
        &self.inner
    }

    /// Elements of this rank's shard.
    pub fn shard_len(&self) -> usize {
        self.shard_len
    }

    /// Bytes of optimizer state this rank holds: the two moments of its shard,
    /// `2 × 4 × shard` (AdamW in one process holds `2 × 4 × parameters`).
    pub fn state_bytes(&self) -> usize {
        2 * 4 * self.shard_len
    }

    /// Bytes of the shard's working copy of its parameters (`4 × shard`), which the
    /// compiled update runs on.
    pub fn working_bytes(&self) -> usize {
        4 * self.shard_len
    }

    /// The flat, padded parameters (or gradients) in module order.
    fn flat(&self, get: impl Fn(&str) -> Option<Tensor>) -> Result<Vec<f32>> {
        let mut flat = vec![0.0f32; self.shard_len * self.world.size()];
        for (name, _, off, n) in &self.layout {
            if let Some(t) = get(name) {
                crate::flat::add_into(&t, &mut flat[*off..off + n], name)?;
            }
        }
        Ok(flat)
    }

    /// Copy this rank's part of `store`'s parameters into the shard (only the
    /// parameters that overlap it are read).
    fn load_shard(&self, store: &ParamStore) -> Result<()> {
        let r = self.world.rank();
        let (lo, hi) = (r * self.shard_len, (r + 1) * self.shard_len);
        let mut mine = vec![0.0f32; self.shard_len];
        for (name, _, off, len) in &self.layout {
            let (a, b) = ((*off).max(lo), (off + len).min(hi));
            if a >= b {
                continue;
            }
            if let Some(t) = store.get(name) {
                crate::flat::copy_range_f32(t, a - off, &mut mine[a - lo..b - lo])?;
            }
        }
        let _no_grad = NoGradGuard::new();
        self.shard.copy_(&Tensor::from_vec(mine, &[self.shard_len])?)?;
        Ok(())
    }

    /// Every rank's shard of `values` (`shard_len` each), end to end.
    fn all_gather(&self, mine: Vec<f32>, what: &'static str) -> Result<Vec<f32>> {
        let total = self.shard_len * self.world.size();
        self.world.run_checked(what, self.steps, move |c| {
            let mut all = vec![0.0f32; total];
            crate::coll::all_gather(c, &mine, &mut all)?;
            Ok(all)
        })
    }

    fn step_sharded(&mut self, store: &ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        // AdamW skips a parameter without a gradient; a shard cannot (its decay and
        // moments would move it), so every parameter must have one. Every rank has the
        // same gradients (one program), so every rank refuses alike, before any exchange.
        if let Some((name, ..)) = self.layout.iter().find(|(n, ..)| !grads.iter().any(|(g, _)| g == n)) {
            return Err(Error::Invalid(format!(
                "ZeroAdamW: parameter {name} has no gradient; every parameter it shards must have one (leave \
                 frozen parameters out of the store, or use AdamW)"
            )));
        }
        let grad_of = |n: &str| grads.iter().find(|(g, _)| g == n).map(|(_, t)| t.clone());
        let local = self.flat(grad_of)?;
        let shard_len = self.shard_len;
        let mut mine = self.world.run_checked("gradient reduce-scatter", self.steps, move |c| {
            let mut mine = vec![0.0f32; shard_len];
            crate::coll::reduce_scatter_sum(c, &local, &mut mine)?;
            Ok(mine)
        })?;
        let n = self.world.size() as f32;
        for g in &mut mine {
            *g /= n;
        }
        // The shard follows the store (a checkpoint loaded into it, say).
        self.load_shard(store)?;
        let g = Tensor::from_vec(mine, &[self.shard_len])?;
        self.inner.step(&self.shard_store, &[("shard".to_string(), g)])?;
        self.steps += 1;
        let updated = self.shard.to_vec_f64()?.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let full = self.all_gather(updated, "parameter allgather")?;
        let _no_grad = NoGradGuard::new();
        for (name, shape, off, len) in &self.layout {
            if let Some(p) = store.get(name) {
                p.copy_(&Tensor::from_vec(full[*off..off + len].to_vec(), shape)?)?;
            }
        }
        Ok(())
    }

    /// Assemble the whole optimizer state (every parameter's moments, named as
    /// AdamW names them) from every rank's shard; a collective: every rank calls it,
    /// then [`Optimizer::state`] returns it (until the next step).
    pub fn gather(&mut self) -> Result<()> {
        let st = self.inner.state();
        let (m, v) = match self.inner.moments("shard") {
            Some((m, v)) => (Some(m.to_vec_f64()?), Some(v.to_vec_f64()?)),
            None => (None, None),
        };
        let mut tensors = Vec::new();
        if let (Some(m), Some(v)) = (m, v) {
            let to32 = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
            let (m, v) = (self.all_gather(to32(m), "state allgather")?, self.all_gather(to32(v), "state allgather")?);
            for (name, shape, off, len) in &self.layout {
                tensors.push((format!("exp_avg.{name}"), Tensor::from_vec(m[*off..off + len].to_vec(), shape)?));
                tensors.push((format!("exp_avg_sq.{name}"), Tensor::from_vec(v[*off..off + len].to_vec(), shape)?));
            }
        }
        self.gathered = Some((self.steps, OptimizerState { kind: st.kind, scalars: st.scalars, tensors }));
        Ok(())
    }
}

impl Optimizer for ZeroAdamW {
    /// One step from this rank's own gradients (not averaged: the reduce-scatter
    /// averages them); a collective, every rank calls it.
    fn step(&mut self, store: &ParamStore, grads: &[(String, Tensor)]) -> aotgrad_runtime::Result<()> {
        self.step_sharded(store, grads).map_err(|e| match e {
            Error::Aot(e) => e,
            other => zero_error(other.to_string()),
        })
    }
    fn lr(&self) -> f64 {
        self.inner.lr()
    }
    fn set_lr(&mut self, lr: f64) {
        self.inner.set_lr(lr);
    }
    /// The whole state from [`ZeroAdamW::gather`] when no step came after it;
    /// otherwise this rank's shard alone, of kind `zero-shard`, which no optimizer
    /// loads (call `gather` on every rank before writing a checkpoint).
    fn state(&self) -> OptimizerState {
        match &self.gathered {
            Some((s, st)) if *s == self.steps => st.clone(),
            _ => {
                let mut st = self.inner.state();
                st.kind = "zero-shard".into();
                st
            }
        }
    }
    /// Load a whole AdamW state (from a one-process run or [`ZeroAdamW::gather`] on
    /// any number of ranks): this rank keeps its shard of it.
    fn load_state(&mut self, store: &ParamStore, state: &OptimizerState) -> aotgrad_runtime::Result<()> {
        let has_moments = state.tensors.iter().any(|(k, _)| k.starts_with("exp_avg."));
        let mut tensors = Vec::new();
        if has_moments {
            let pick = |prefix: &str| -> Result<Tensor> {
                let flat = self.flat(|n| state.tensor(&format!("{prefix}.{n}")).cloned())?;
                let r = self.world.rank();
                Ok(Tensor::from_vec(flat[r * self.shard_len..(r + 1) * self.shard_len].to_vec(), &[self.shard_len])?)
            };
            for prefix in ["exp_avg", "exp_avg_sq"] {
                let t = pick(prefix).map_err(|e| zero_error(e.to_string()))?;
                tensors.push((format!("{prefix}.shard"), t));
            }
        }
        let shard_state = OptimizerState { kind: state.kind.clone(), scalars: state.scalars.clone(), tensors };
        self.inner.load_state(&self.shard_store, &shard_state)?;
        self.steps = self.inner.steps();
        self.gathered = None;
        self.load_shard(store).map_err(|e| zero_error(e.to_string()))
    }
}

//! Gradient buckets exchanged while the backward still runs.
//!
//! The compiled backward hands out each parameter's gradient as soon as the kernel
//! that writes it last has run ([`aotgrad_runtime::module::ModuleBackward::backward_streaming`]);
//! it is added into its bucket at once, and a bucket whose every gradient has
//! arrived goes to the MPI thread for its allreduce, buckets strictly in plan order
//! (every rank submits the same collectives in the same order, as MPI requires). The
//! MPI thread runs them while this thread computes the rest of the backward.
//! Gradients that do not come early (a parameter whose gradient the runtime still
//! combines, one without a gradient) are added after the backward, and the remaining
//! buckets go then.

use crate::bucket::BucketPlan;
use crate::coll::MpiResult;
use crate::error::Result;
use crate::world::{Exchanged, Pending, World};
use aotgrad_ir::{HostData, ReadyOutput};
use std::time::Instant;

/// The exchanges of one synchronization.
pub(crate) struct Exchange<'a> {
    world: &'a World,
    plan: &'a BucketPlan,
    deterministic: bool,
    /// Each bucket's local sum, until it is submitted.
    sends: Vec<Option<Vec<f32>>>,
    pending: Vec<Option<Pending<MpiResult<Exchanged<f32>>>>>,
    /// Gradients added per bucket.
    filled: Vec<usize>,
    /// Per parameter: added already.
    delivered: Vec<bool>,
    /// The next bucket to submit.
    next: usize,
    /// A submission that failed (the MPI thread is gone).
    failed: Option<crate::error::Error>,
    /// Gradients that came while the backward ran.
    pub(crate) early: u64,
    step: u64,
}

/// Averaged buckets and when the MPI thread worked on them (first start, last end).
pub(crate) type Averaged = (Vec<Vec<f32>>, Option<Instant>, Option<Instant>);

impl<'a> Exchange<'a> {
    /// Exchanges for `plan`'s buckets, starting from `sends` (zeros, or what
    /// `no_sync` accumulated).
    pub(crate) fn new(
        world: &'a World,
        plan: &'a BucketPlan,
        deterministic: bool,
        sends: Vec<Vec<f32>>,
        step: u64,
    ) -> Exchange<'a> {
        let nb = plan.buckets.len();
        Exchange {
            world,
            plan,
            deterministic,
            sends: sends.into_iter().map(Some).collect(),
            pending: (0..nb).map(|_| None).collect(),
            filled: vec![0; nb],
            delivered: vec![false; plan.place.len()],
            next: 0,
            failed: None,
            early: 0,
            step,
        }
    }

    /// The gradient of `param` handed out by the backward: added to its bucket when
    /// it is a contiguous f32 layout (else it comes later, from the returned tensor).
    pub(crate) fn ready(&mut self, param: usize, o: ReadyOutput<'_>) {
        if self.delivered[param] {
            return;
        }
        let (k, s) = self.plan.place[param];
        let slot = &self.plan.buckets[k].slots[s];
        let numel = o.meta.concrete_shape().map(|s| s.iter().product::<usize>());
        let (HostData::F32(data), true, Some(off), Some(true)) =
            (o.data, o.meta.is_contiguous(), o.meta.concrete_offset(), numel.map(|n| n == slot.len))
        else {
            return;
        };
        let (Some(src), Some(Some(dst))) = (data.get(off..off + slot.len), self.sends.get_mut(k)) else {
            return;
        };
        for (d, x) in dst[slot.offset..slot.offset + slot.len].iter_mut().zip(src) {
            *d += *x;
        }
        self.early += 1;
        self.mark(param);
    }

    /// Add `param`'s gradient with `add` (after the backward), or nothing for a
    /// parameter without one; either way its slot counts as filled (a failed `add`
    /// too: every rank must still submit every bucket).
    pub(crate) fn fill_late(&mut self, param: usize, add: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
        if self.delivered[param] {
            return Ok(());
        }
        let (k, s) = self.plan.place[param];
        let slot = &self.plan.buckets[k].slots[s];
        let added = match self.sends.get_mut(k) {
            Some(Some(dst)) => add(&mut dst[slot.offset..slot.offset + slot.len]),
            _ => Ok(()),
        };
        self.mark(param);
        added
    }

    fn mark(&mut self, param: usize) {
        self.delivered[param] = true;
        self.filled[self.plan.place[param].0] += 1;
        while self.next < self.filled.len() && self.filled[self.next] == self.plan.buckets[self.next].slots.len() {
            let k = self.next;
            self.next += 1;
            let Some(values) = self.sends[k].take() else { continue };
            match self.world.submit_average(values, self.deterministic, self.step) {
                Ok(p) => self.pending[k] = Some(p),
                Err(e) => {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }

    /// Wait for every bucket (every slot must be filled by now): the averaged buckets.
    pub(crate) fn finish(mut self) -> Result<Averaged> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let (mut first, mut last) = (None::<Instant>, None::<Instant>);
        let mut out = Vec::with_capacity(self.pending.len());
        for p in self.pending.drain(..) {
            let p = p.ok_or_else(|| crate::error::Error::Invalid("a bucket was never filled".into()))?;
            let x = p.wait_checked(self.world)?;
            first = Some(first.map_or(x.start, |f| f.min(x.start)));
            last = Some(last.map_or(x.end, |l| l.max(x.end)));
            out.push(x.values);
        }
        Ok((out, first, last))
    }
}

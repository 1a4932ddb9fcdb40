//! Gradient buckets exchanged while the backward still runs.
//!
//! The compiled backward hands out each parameter's gradient as soon as the kernel
//! that writes it last has run ([`aotgrad_runtime::module::ModuleBackward::backward_streaming`]);
//! it is added into its bucket at once, and a bucket whose every gradient has
//! arrived starts its non-blocking exchange, buckets strictly in plan order (every
//! rank starts them in the same order, as MPI requires of collectives). Each later
//! hand-out also tests the exchanges in flight, which is what makes MPI progress
//! them while the backward computes. Gradients that do not come early (a parameter
//! whose gradient the runtime still combines, one without a gradient) are added
//! after the backward, and the remaining buckets start then.

use crate::bucket::BucketPlan;
use crate::error::Result;
use crate::world::World;
use aotgrad_ir::{HostData, ReadyOutput};
use mpi::collective::CommunicatorCollectives;
use mpi::request::{LocalScope, Request};
use std::time::Instant;

/// The exchanges of one synchronization, within one MPI request scope.
pub(crate) struct Exchange<'s, 'a> {
    world: &'a World,
    scope: &'s LocalScope<'a>,
    plan: &'a BucketPlan,
    deterministic: bool,
    sends: Vec<Option<&'a mut Vec<f32>>>,
    recvs: Vec<Option<&'a mut Vec<f32>>>,
    reqs: Vec<Option<Request<'a, [f32], &'s LocalScope<'a>>>>,
    /// Gradients added per bucket.
    filled: Vec<usize>,
    /// Per parameter: added already.
    delivered: Vec<bool>,
    /// The next bucket to start.
    next: usize,
    pub(crate) first_start: Option<Instant>,
    pub(crate) last_done: Option<Instant>,
    /// Gradients that came while the backward ran.
    pub(crate) early: u64,
    step: u64,
}

impl<'s, 'a> Exchange<'s, 'a> {
    pub(crate) fn new(
        world: &'a World,
        scope: &'s LocalScope<'a>,
        plan: &'a BucketPlan,
        deterministic: bool,
        sends: &'a mut [Vec<f32>],
        recvs: &'a mut [Vec<f32>],
        step: u64,
    ) -> Exchange<'s, 'a> {
        let nb = plan.buckets.len();
        Exchange {
            world,
            scope,
            plan,
            deterministic,
            sends: sends.iter_mut().map(Some).collect(),
            recvs: recvs.iter_mut().map(Some).collect(),
            reqs: (0..nb).map(|_| None).collect(),
            filled: vec![0; nb],
            delivered: vec![false; plan.place.len()],
            next: 0,
            first_start: None,
            last_done: None,
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
        let (HostData::F32(data), true, Some(off)) = (o.data, o.meta.is_contiguous(), o.meta.concrete_offset()) else {
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
        self.poll();
    }

    /// Add `param`'s gradient with `add` (after the backward), or nothing for a
    /// parameter without one; either way its slot counts as filled.
    pub(crate) fn fill_late(&mut self, param: usize, add: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
        if self.delivered[param] {
            return Ok(());
        }
        let (k, s) = self.plan.place[param];
        let slot = &self.plan.buckets[k].slots[s];
        if let Some(Some(dst)) = self.sends.get_mut(k) {
            add(&mut dst[slot.offset..slot.offset + slot.len])?;
        }
        self.mark(param);
        Ok(())
    }

    fn mark(&mut self, param: usize) {
        self.delivered[param] = true;
        self.filled[self.plan.place[param].0] += 1;
        while self.next < self.filled.len() && self.filled[self.next] == self.plan.buckets[self.next].slots.len() {
            self.start(self.next);
            self.next += 1;
        }
    }

    fn start(&mut self, k: usize) {
        let (Some(send), Some(recv)) = (self.sends[k].take(), self.recvs[k].take()) else { return };
        let send: &'a Vec<f32> = send;
        let comm = self.world.comm();
        let req = if self.deterministic {
            comm.immediate_all_gather_into(self.scope, &send[..], &mut recv[..])
        } else {
            comm.immediate_all_reduce_into(self.scope, &send[..], &mut recv[..], World::sum_op())
        };
        self.reqs[k] = Some(req);
        self.first_start.get_or_insert_with(Instant::now);
    }

    /// Test every exchange in flight (MPI progresses them here).
    fn poll(&mut self) {
        for slot in &mut self.reqs {
            if let Some(req) = slot.take() {
                match req.test() {
                    Ok(_) => self.last_done = Some(Instant::now()),
                    Err(req) => *slot = Some(req),
                }
            }
        }
    }

    /// Start what is left (every slot must be filled by now) and wait for all.
    pub(crate) fn finish(&mut self) -> Result<()> {
        debug_assert_eq!(self.next, self.filled.len(), "every bucket filled before finish");
        let deadline = self.world.deadline();
        let op = if self.deterministic { "gradient allgather" } else { "gradient allreduce" };
        let mut first_err = None;
        for slot in &mut self.reqs {
            if let Some(req) = slot.take() {
                match self.world.wait(req, op, self.step, deadline) {
                    Ok(()) => self.last_done = Some(Instant::now()),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

//! The buffer plan: every intermediate buffer gets an arena slot by liveness.
//!
//! Kernels run in plan order; a buffer is live from the kernel that writes it to the
//! last kernel that reads it (inclusive). Buffers written by kernel `i` take a free slot
//! of their dtype — the smallest that fits, else the largest grown to fit, else a new
//! one — and a slot is free again once its buffer's last reader has run. Inputs,
//! outputs (handed to the caller) and extern results (allocated by their op) take no
//! slot. The arena is the sum of the slots; a call allocates the arena (once, then
//! reused) plus its outputs.
//!
//! The planner's buffer bookkeeping lives here too: `recompute_liveness` sets every
//! buffer's first writer and last use from the kernel list, and
//! `update_inputs_in_place` stores a mutated input's new value into the input's own
//! buffer where that is safe, dropping the output buffer it replaces.

use crate::plan::{Access, BufferKind, Kernel, KernelPlan};
use aotgrad_ir::{DType, TensorMeta};
use serde::{Deserialize, Serialize};

/// One arena slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// Element type.
    pub dtype: DType,
    /// Capacity in elements.
    pub elems: usize,
}

/// Slot assignment for concrete buffer sizes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotPlan {
    /// Per buffer of the plan: its slot (intermediates only).
    pub slot_of: Vec<Option<usize>>,
    /// The slots.
    pub slots: Vec<Slot>,
    /// Bytes of all slots together.
    pub arena_bytes: usize,
    /// Bytes of the output buffers one call allocates.
    pub output_bytes: usize,
    /// Bytes the intermediates would take without reuse (each its own buffer).
    pub unshared_bytes: usize,
}

impl SlotPlan {
    /// Peak bytes one call allocates: arena plus outputs.
    pub fn peak_bytes(&self) -> usize {
        self.arena_bytes + self.output_bytes
    }
}

/// Elements a concrete layout spans in its buffer (`offset` + the farthest element + 1;
/// 0 for an empty tensor). `None` when the layout is symbolic or overflows.
pub fn extent(meta: &TensorMeta) -> Option<usize> {
    // A walk over the dims (no vectors: lowering asks this of every buffer).
    let size = |d: &aotgrad_ir::Dim| d.as_const().and_then(|v| usize::try_from(v).ok());
    let mut far = size(&meta.offset)?;
    let mut empty = false;
    for (s, st) in meta.shape.iter().zip(&meta.strides) {
        let (s, st) = (size(s)?, size(st)?);
        if s == 0 {
            empty = true;
        } else {
            far = far.checked_add((s - 1).checked_mul(st)?)?;
        }
    }
    if empty {
        return Some(0);
    }
    far.checked_add(1)
}

/// Assign slots given the concrete element count of every buffer (`extents[b]`).
pub fn plan_slots(plan: &KernelPlan, extents: &[usize]) -> SlotPlan {
    let nb = plan.buffers.len();
    let mut slot_of = vec![None; nb];
    let mut slots: Vec<Slot> = Vec::new();
    // Free slots by dtype (a few at most), ordered by (elements, slot): best fit in
    // O(log n).
    let mut free: Vec<(aotgrad_ir::DType, std::collections::BTreeSet<(usize, usize)>)> = Vec::new();
    fn pool(
        free: &mut Vec<(aotgrad_ir::DType, std::collections::BTreeSet<(usize, usize)>)>,
        dtype: aotgrad_ir::DType,
    ) -> &mut std::collections::BTreeSet<(usize, usize)> {
        let i = match free.iter().position(|(d, _)| *d == dtype) {
            Some(i) => i,
            None => {
                free.push((dtype, Default::default()));
                free.len() - 1
            }
        };
        &mut free[i].1
    }
    // (kernel, buffer) pairs: the buffers each kernel defines, and those whose last
    // use is the kernel before it; sorted by kernel, buffers in order within one.
    let mut defs: Vec<(usize, usize)> = Vec::with_capacity(nb);
    let mut ends: Vec<(usize, usize)> = Vec::with_capacity(nb);
    let mut unshared = 0usize;
    let mut output_bytes = 0usize;
    for (b, buf) in plan.buffers.iter().enumerate() {
        match buf.kind {
            BufferKind::Intermediate => {
                if let Some(d) = buf.def {
                    defs.push((d, b));
                    ends.push((buf.last_use.unwrap_or(d).max(d) + 1, b));
                    unshared = unshared.saturating_add(extents[b].saturating_mul(buf.layout.dtype.size_bytes()));
                }
            }
            BufferKind::Output => {
                output_bytes = output_bytes.saturating_add(extents[b].saturating_mul(buf.layout.dtype.size_bytes()))
            }
            _ => {}
        }
    }
    defs.sort_unstable();
    ends.sort_unstable();
    let (mut next_def, mut next_end) = (0, 0);
    for i in 0..plan.kernels.len() {
        while let Some(&(_, b)) = ends.get(next_end).filter(|(k, _)| *k <= i) {
            next_end += 1;
            if let Some(s) = slot_of[b] {
                let slot: &Slot = &slots[s];
                pool(&mut free, slot.dtype).insert((slot.elems, s));
            }
        }
        while let Some(&(_, b)) = defs.get(next_def).filter(|(k, _)| *k <= i) {
            next_def += 1;
            let dtype = plan.buffers[b].layout.dtype;
            let need = extents[b];
            let pool = pool(&mut free, dtype);
            // The smallest free slot that holds it, else the largest (grown to fit).
            let pick = pool.range((need, 0)..).next().copied().or_else(|| pool.iter().next_back().copied());
            let s = match pick {
                Some(key) => {
                    pool.remove(&key);
                    let s = key.1;
                    slots[s].elems = slots[s].elems.max(need);
                    s
                }
                None => {
                    slots.push(Slot { dtype, elems: need });
                    slots.len() - 1
                }
            };
            slot_of[b] = Some(s);
        }
    }
    let arena_bytes = slots.iter().fold(0usize, |t, s| t.saturating_add(s.elems.saturating_mul(s.dtype.size_bytes())));
    SlotPlan { slot_of, slots, arena_bytes, output_bytes, unshared_bytes: unshared }
}

/// Set every buffer's `def` and `last_use` from the kernel list.
pub(crate) fn recompute_liveness(plan: &mut KernelPlan) {
    for b in &mut plan.buffers {
        if !matches!(b.kind, BufferKind::Input(_)) {
            b.def = None;
        }
        b.last_use = None;
    }
    for (i, k) in plan.kernels.iter().enumerate() {
        for a in k.reads() {
            plan.buffers[a.buf].last_use = Some(i);
        }
        for w in k.writes() {
            let b = &mut plan.buffers[w];
            // A later write (a scatter into the buffer) keeps it alive too.
            if b.def.is_some() {
                b.last_use = Some(i);
            }
            b.def.get_or_insert(i);
        }
    }
}

/// Store each mutated input's new value into the input's own buffer where that is
/// safe (see [`crate::PlanOptions::input_updates`]); the fresh output buffers that
/// held them are dropped.
pub(crate) fn update_inputs_in_place(plan: &mut KernelPlan, updates: &[(usize, usize)]) {
    let mut dropped = vec![false; plan.buffers.len()];
    for &(o, i) in updates {
        let (Some(out), Some(input)) = (plan.outputs.get(o), plan.inputs.get(i)) else { continue };
        let b = out.buf;
        let buf = &plan.buffers[b];
        if buf.kind != BufferKind::Output
            || plan.buffers.get(i).map(|x| &x.kind) != Some(&BufferKind::Input(i))
            || buf.layout != *input
            || out.meta != *input
            || plan.outputs.iter().enumerate().any(|(k, x)| (k != o && x.buf == b) || x.buf == i)
        {
            continue;
        }
        let Some(def) = buf.def else { continue };
        if plan.kernels.iter().filter(|k| k.writes().contains(&b)).count() != 1 {
            continue;
        }
        let Some(Kernel::Pointwise(pk)) = plan.kernels.get(def) else { continue };
        let [store] = pk.stores.iter().filter(|s| s.dst.buf == b).collect::<Vec<_>>()[..] else { continue };
        let same_index =
            |a: &Access| a.shape == store.dst.shape && a.strides == store.dst.strides && a.offset == store.dst.offset;
        let safe = plan.kernels.iter().enumerate().all(|(k, kern)| match k.cmp(&def) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => pk.body.loads.iter().filter(|l| l.buf == i).all(same_index),
            std::cmp::Ordering::Greater => kern.reads().iter().all(|a| a.buf != i),
        });
        if !safe {
            continue;
        }
        for k in &mut plan.kernels {
            k.for_each_buf_mut(&mut |x| {
                if *x == b {
                    *x = i;
                }
            });
        }
        plan.outputs[o].buf = i;
        plan.buffers[i].kind = BufferKind::Updated(i);
        dropped[b] = true;
    }
    if !dropped.contains(&true) {
        return;
    }
    // Renumber the buffers that stay.
    let mut new_id = vec![usize::MAX; plan.buffers.len()];
    let mut next = 0;
    for (b, d) in dropped.iter().enumerate() {
        if !d {
            new_id[b] = next;
            next += 1;
        }
    }
    let mut b = 0;
    plan.buffers.retain(|_| {
        b += 1;
        !dropped[b - 1]
    });
    for k in &mut plan.kernels {
        k.for_each_buf_mut(&mut |x| *x = new_id[*x]);
    }
    for o in &mut plan.outputs {
        o.buf = new_id[o.buf];
    }
    recompute_liveness(plan);
}

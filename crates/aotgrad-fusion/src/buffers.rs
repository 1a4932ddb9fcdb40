//! The buffer plan: every intermediate buffer gets an arena slot by liveness.
//!
//! Kernels run in plan order; a buffer is live from the kernel that writes it to the
//! last kernel that reads it (inclusive). Buffers written by kernel `i` take a free slot
//! of their dtype — the smallest that fits, else the largest grown to fit, else a new
//! one — and a slot is free again once its buffer's last reader has run. Inputs,
//! outputs (handed to the caller) and extern results (allocated by their op) take no
//! slot. The arena is the sum of the slots; a call allocates the arena (once, then
//! reused) plus its outputs.

use crate::plan::{BufferKind, KernelPlan};
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
    let shape = meta.concrete_shape()?;
    let strides = meta.concrete_strides()?;
    let offset = meta.concrete_offset()?;
    if shape.contains(&0) {
        return Some(0);
    }
    let mut far = offset;
    for (s, st) in shape.iter().zip(&strides) {
        far = far.checked_add((s - 1).checked_mul(*st)?)?;
    }
    far.checked_add(1)
}

/// Assign slots given the concrete element count of every buffer (`extents[b]`).
pub fn plan_slots(plan: &KernelPlan, extents: &[usize]) -> SlotPlan {
    let nb = plan.buffers.len();
    let mut slot_of = vec![None; nb];
    let mut slots: Vec<Slot> = Vec::new();
    // Free slots by dtype, ordered by (elements, slot): best fit in O(log n).
    let mut free: std::collections::HashMap<aotgrad_ir::DType, std::collections::BTreeSet<(usize, usize)>> =
        std::collections::HashMap::new();
    // Buffers by defining kernel.
    let mut defs: Vec<Vec<usize>> = vec![Vec::new(); plan.kernels.len()];
    let mut ends: Vec<Vec<usize>> = vec![Vec::new(); plan.kernels.len() + 1];
    let mut unshared = 0usize;
    let mut output_bytes = 0usize;
    for (b, buf) in plan.buffers.iter().enumerate() {
        match buf.kind {
            BufferKind::Intermediate => {
                if let Some(d) = buf.def {
                    defs[d].push(b);
                    ends[buf.last_use.unwrap_or(d).max(d) + 1].push(b);
                    unshared += extents[b] * buf.layout.dtype.size_bytes();
                }
            }
            BufferKind::Output => output_bytes += extents[b] * buf.layout.dtype.size_bytes(),
            _ => {}
        }
    }
    for i in 0..plan.kernels.len() {
        for &b in &ends[i] {
            if let Some(s) = slot_of[b] {
                let slot: &Slot = &slots[s];
                free.entry(slot.dtype).or_default().insert((slot.elems, s));
            }
        }
        for &b in &defs[i] {
            let dtype = plan.buffers[b].layout.dtype;
            let need = extents[b];
            let pool = free.entry(dtype).or_default();
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
    let arena_bytes = slots.iter().map(|s| s.elems * s.dtype.size_bytes()).sum();
    SlotPlan { slot_of, slots, arena_bytes, output_bytes, unshared_bytes: unshared }
}

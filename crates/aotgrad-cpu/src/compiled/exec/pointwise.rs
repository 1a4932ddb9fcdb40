//! Pointwise kernels: a range of a kernel's elements on the block interpreter or its
//! JIT code, one kernel split over the threads, and dispatch groups (independent
//! kernels sharing one parallel region).

use super::body::*;
use super::tasks::*;
use crate::compiled::code::JitKernel;
use crate::compiled::kernels::{CAccess, CPointwise};
use crate::compiled::math::Num;
use crate::compiled::target::multiversion;
use aotgrad_fusion::Compute;

/// Run a pointwise kernel over elements `[e0, e1)` of its iteration space.
///
/// # Safety
/// `bufs` hold every buffer the kernel touches; no other task writes `[e0, e1)`.
#[inline(always)]
pub(super) unsafe fn pointwise_range_impl<T: Num>(k: &CPointwise, bufs: &[Raw], e0: usize, e1: usize) {
    let mut accs: Vec<&CAccess> = k.body.loads.iter().collect();
    accs.extend(k.stores.iter().map(|(_, a)| a));
    if let Some(j) = k.jit.as_ref().and_then(|s| s.get()) {
        // SAFETY: the caller's guarantees; the kernel was compiled for these accesses.
        unsafe { jit_range(k, j, &accs, bufs, e0, e1) };
        return;
    }
    let nl = k.body.loads.len();
    with_regs::<T, _>(
        k.body.nregs * RSTRIDE,
        #[inline(always)]
        |regs| {
            segments(
                &k.shape,
                &accs,
                e0,
                e1,
                #[inline(always)]
                |t| {
                    // SAFETY: the caller's guarantees.
                    unsafe {
                        eval_block(&k.body, bufs, t, regs);
                        let n = t.rows * t.len;
                        for (s, (reg, acc)) in k.stores.iter().enumerate() {
                            let raw = bufs[acc.buf];
                            let vals = &regs[reg * RSTRIDE..reg * RSTRIDE + n];
                            let (off, st, ost) = (t.offs[nl + s], t.inner[nl + s], t.outer[nl + s]);
                            for (r, row) in vals.chunks_exact(t.len).enumerate() {
                                by_dtype!(raw, store_typed, off + r * ost, st, row);
                            }
                        }
                    }
                },
            );
        },
    );
}

/// Run the compiled code of a pointwise kernel over elements `[e0, e1)`, tile by tile.
///
/// # Safety
/// As [`pointwise_range`]; `j` was compiled for `k` (f32 buffers, these inner strides).
pub(super) unsafe fn jit_range(k: &CPointwise, j: &JitKernel, accs: &[&CAccess], bufs: &[Raw], e0: usize, e1: usize) {
    // SAFETY: forwarded.
    unsafe { jit_tiles(crate::compiled::jit::BLOCK, &k.shape, j, accs, bufs, None, e0, e1) }
}

/// Call compiled code on every tile of `[e0, e1)` (tiles of up to `blk` elements). With
/// `acc`, the last access indexes these f64 accumulators instead of its buffer.
///
/// # Safety
/// As [`jit_range`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn jit_tiles(
    blk: usize,
    shape: &[usize],
    j: &JitKernel,
    accs: &[&CAccess],
    bufs: &[Raw],
    acc: Option<Raw>,
    e0: usize,
    e1: usize,
) {
    let n = accs.len();
    let mut ptrs = [std::ptr::null_mut::<u8>(); 16];
    let mut outer = [0isize; 16];
    segments_of(blk, shape, accs, e0, e1, |t| {
        for a in 0..n {
            let (base, size) = match acc {
                Some(r) if a == n - 1 => (r.ptr, 8),
                _ => (bufs[accs[a].buf].ptr, 4),
            };
            // SAFETY: the offset is inside the buffer (bounds checked at lowering).
            ptrs[a] = unsafe { base.add(t.offs[a] * size) };
            outer[a] = (t.outer[a] * size) as isize;
        }
        // SAFETY: the compiled code reads and writes exactly the tile's elements of
        // these accesses, as the interpreter would.
        unsafe { (j.entry)(ptrs.as_ptr(), outer.as_ptr(), t.rows, t.len) };
    });
}

/// Run elements `[lo, hi)` of a pointwise kernel in its compute type.
///
/// # Safety
/// As [`pointwise_range`].
#[inline]
pub(crate) unsafe fn pointwise_span(k: &CPointwise, bufs: &[Raw], lo: usize, hi: usize) {
    // SAFETY: forwarded.
    unsafe {
        match k.body.compute {
            Compute::F32 => pointwise_range::<f32>(k, bufs, lo, hi),
            Compute::F64 => pointwise_range::<f64>(k, bufs, lo, hi),
        }
    }
}

/// Run a pointwise kernel on `threads` tasks.
///
/// # Safety
/// As [`pointwise_range`] for the whole space.
pub(crate) unsafe fn pointwise(k: &CPointwise, bufs: &[Raw], threads: usize) {
    let compiled = k.jit.as_ref().is_some_and(|s| s.get().is_some());
    // SAFETY: chunks are disjoint ranges of the output.
    par_chunks(k.numel, threads, task_elements(k, compiled), |lo, hi| unsafe { pointwise_span(k, bufs, lo, hi) });
}

/// Run independent pointwise kernels as one dispatch: their elements laid end to end,
/// split into tasks at once (each task runs the parts of every kernel its range
/// covers), so small kernels share the threads with large ones.
///
/// # Safety
/// As [`pointwise_range`] for each part, and no part writes what another touches
/// (checked when the plan is lowered or loaded).
pub(crate) unsafe fn group(parts: &[&CPointwise], bufs: &[Raw], threads: usize) {
    let total: usize = parts.iter().map(|p| p.numel).sum();
    let compiled = |p: &CPointwise| p.jit.as_ref().is_some_and(|s| s.get().is_some());
    let min = parts.iter().map(|p| task_elements(p, compiled(p))).min().unwrap_or(POINTWISE_TASK);
    par_chunks(total, threads, min, |lo, hi| {
        let mut start = 0;
        for p in parts {
            let (a, b) = (lo.max(start), hi.min(start + p.numel));
            if a < b {
                // SAFETY: `[a, b)` lies in this part's elements; tasks own disjoint ranges.
                unsafe { pointwise_span(p, bufs, a - start, b - start) }
            }
            start += p.numel;
        }
    });
}

multiversion!(pub(super) unsafe fn pointwise_range<T: Num> = pointwise_range_impl(k: &CPointwise, bufs: &[Raw], e0: usize, e1: usize));

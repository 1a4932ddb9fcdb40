//! What every kernel's execution shares: buffers as one kernel sees them ([`Raw`]),
//! splitting a kernel's work into tasks on the backend's threads, and how many
//! elements a pointwise task covers.

use crate::compiled::kernels::CPointwise;
use aotgrad_ir::DType;

/// A buffer as one kernel sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw {
    pub ptr: *mut u8,
    pub dtype: DType,
}
// SAFETY: `Raw` is only handed to the tasks of one kernel, which read disjoint or
// read-only memory (see the module docs).
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Raw {
    pub(crate) const NONE: Raw = Raw { ptr: std::ptr::null_mut(), dtype: DType::F32 };

    /// The pointer as f64s (a method, so that closures capture the whole `Raw`,
    /// which is `Sync`, rather than its pointer field).
    pub(super) fn as_f64(self) -> *mut f64 {
        self.ptr as *mut f64
    }
}

/// Run `f` on `[lo, hi)` chunks of `0..total` on up to `threads` tasks (on the pool
/// this thread entered, see [`super::pool`]).
pub(crate) fn par_chunks(total: usize, threads: usize, min_chunk: usize, f: impl Fn(usize, usize) + Sync) {
    let tasks = if threads <= 1 { 1 } else { (total / min_chunk.max(1)).clamp(1, threads * 4) };
    par_tasks(tasks, |c| f(c * total / tasks, (c + 1) * total / tasks));
}

pub(crate) use crate::compiled::pool::par_tasks;

/// Fewest elements per task of a pointwise kernel: [`POINTWISE_TASK_COMPILED`] for a
/// light compiled body ([`POINTWISE_TASK`] interpreted: compiled bodies run several
/// times faster, so a task must cover more elements before handing it to another
/// thread pays), fewer for a heavier one, so that a task always carries about the
/// same work (an optimizer update of 15 operations and 3 stores splits at 32K
/// elements, where a copy does not).
pub(crate) fn task_elements(k: &CPointwise, compiled: bool) -> usize {
    let min = if compiled { POINTWISE_TASK_COMPILED } else { POINTWISE_TASK };
    let work = k.body.instrs.len() + k.body.loads.len() + k.stores.len();
    (min * 4 / work.max(4)).max(min / 8)
}

/// Fewest elements of an interpreted pointwise kernel per task.
pub(crate) const POINTWISE_TASK: usize = 8 * 1024;
/// Fewest elements of a compiled pointwise kernel per task.
pub(crate) const POINTWISE_TASK_COMPILED: usize = 32 * 1024;

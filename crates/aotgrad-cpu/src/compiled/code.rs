//! Handles to machine code made by the JIT: the entry point type of a compiled kernel,
//! the executable mapping its code lives in, and the slot a lowered kernel holds until
//! the JIT worker fills it. The lowered plan's types ([`super::kernels`]) hold slots,
//! the JIT ([`super::jit`]) fills them and the executor calls what they hold; this
//! module imports none of them. On targets without the JIT a slot is never filled.

use std::sync::{Arc, OnceLock};

/// The entry point of a compiled kernel: `fn(ptrs, outer, rows, len)` (the JIT's
/// module docs give the calling convention).
#[cfg(target_arch = "x86_64")]
pub(crate) type Entry = unsafe extern "sysv64" fn(*const *mut u8, *const isize, usize, usize);
/// The entry point of a compiled kernel (never made on this target).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type Entry = unsafe extern "C" fn(*const *mut u8, *const isize, usize, usize);

/// Executable code of the kernels compiled together; it stays mapped while any of
/// them is held.
pub(crate) struct Module {
    #[cfg(target_arch = "x86_64")]
    _map: memmap2::Mmap,
}

#[cfg(target_arch = "x86_64")]
impl Module {
    /// Code mapped executable.
    pub(crate) fn new(map: memmap2::Mmap) -> Module {
        Module { _map: map }
    }
}

/// A compiled kernel: its entry point, and the mapping that keeps it alive.
#[derive(Clone)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct JitKernel {
    _module: Arc<Module>,
    pub(crate) entry: Entry,
}

#[cfg(target_arch = "x86_64")]
impl JitKernel {
    /// The kernel at `entry` inside `module`.
    pub(crate) fn new(module: Arc<Module>, entry: Entry) -> JitKernel {
        JitKernel { _module: module, entry }
    }
}

impl std::fmt::Debug for JitKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JitKernel")
    }
}

/// Where a kernel's machine code appears once the JIT worker compiled it.
pub(crate) type JitSlot = Arc<OnceLock<JitKernel>>;

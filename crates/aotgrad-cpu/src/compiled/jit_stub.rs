//! The JIT on targets other than x86-64: it covers nothing, so every pointwise kernel
//! runs on the block interpreter.

use super::kernels::CKernel;
use aotgrad_ir::DType;

/// Elements per tile (unused here).
pub(crate) const BLOCK: usize = super::target::CPU_JIT_BLOCK;

/// No compiled kernels on this target.
pub(crate) fn available() -> bool {
    false
}

/// Nothing to compile on this target.
pub(crate) fn attach(_kernels: &mut [CKernel], _dtypes: &[DType]) {}

/// Nothing is ever compiled on this target.
pub(crate) fn wait_idle(_timeout: std::time::Duration) -> bool {
    true
}

/// No instruction set on this target.
pub(crate) fn isa_name() -> Option<&'static str> {
    None
}

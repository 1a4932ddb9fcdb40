//! Helpers for writing modules: checking a forward's inputs, seeding children.

use aotgrad_ir::{AttributeCalls, SourceLoc};
use aotgrad_trace::Tensor;

/// The `n` inputs of a module, or an error naming the module.
#[track_caller]
pub fn expect_inputs<'a>(module: &str, inputs: &'a [Tensor], n: usize) -> aotgrad_runtime::Result<&'a [Tensor]> {
    if inputs.len() == n {
        Ok(inputs)
    } else {
        Err(aotgrad_trace::Error::Invalid {
            op: module.into(),
            loc: SourceLoc::caller(),
            msg: format!("expected {n} input(s), got {}", inputs.len()),
        }
        .into())
    }
}

/// While the guard lives, ops called from this crate's files point where the code that
/// called into it on the user's behalf points (`aot_module`'s caller, for a built-in
/// module's `forward` reached through `dyn Module`), rather than into the library.
pub(crate) fn attribute_to_caller() -> Option<AttributeCalls> {
    AttributeCalls::inherit(file!())
}

/// A seed for child `k` of a module built from `seed` (splitmix64), so sibling
/// layers get independent initializations.
pub fn child_seed(seed: u64, k: u64) -> u64 {
    let mut z = seed ^ k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

//! The global random-number generator, and functional RNG while tracing.
//!
//! Random values are counter based (`aotgrad-cpu`'s `random` module): a stream is a
//! `(seed, offset)` pair. A random op either names its stream ([`RngSeed::Fixed`]:
//! the same seed always gives the same values) or draws from this thread's generator
//! ([`RngSeed::Global`], PyTorch's default): each such op takes the generator's
//! current `(seed, offset)` and advances the offset by [`OP_STRIDE`].
//!
//! While tracing, a global draw does not read the generator. Instead the graph gets
//! two extra inputs (`rng_seed`, `rng_base`: 0-d i64) and the k-th random op reads
//! stream `(rng_seed, rng_base + k * OP_STRIDE)`. A compiled function passes the
//! generator state at each call and advances it by `k_total * OP_STRIDE`, so a
//! compiled call draws exactly the values the eager call would have drawn, fresh
//! values on every call, and forward and backward see the same ones.

use std::cell::Cell;

/// Counter values reserved per random op (each element uses at most two counters).
pub const OP_STRIDE: u64 = 1 << 40;

/// Where a random op takes its values from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RngSeed {
    /// Stream `(seed, 0)`: reproducible, the same values at every call.
    Fixed(u64),
    /// The thread's generator (see [`manual_seed`]).
    Global,
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for RngSeed {
            fn from(s: $t) -> Self {
                RngSeed::Fixed(s as u64)
            }
        }
    )*};
}
from_int!(u64, u32, usize, i64, i32);

thread_local! {
    static GENERATOR: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Seed this thread's generator (and reset its offset), like `torch.manual_seed`.
pub fn manual_seed(seed: u64) {
    GENERATOR.with(|g| g.set((seed, 0)));
}

/// This thread's generator state `(seed, offset)`.
pub fn rng_state() -> (u64, u64) {
    GENERATOR.with(Cell::get)
}

/// Restore a generator state from [`rng_state`].
pub fn set_rng_state(seed: u64, offset: u64) {
    GENERATOR.with(|g| g.set((seed, offset)));
}

/// Take the state for `ops` random ops: returns the state before and advances the
/// offset by `ops * OP_STRIDE` (wrapping).
pub fn take_rng(ops: u64) -> (u64, u64) {
    GENERATOR.with(|g| {
        let (s, o) = g.get();
        g.set((s, o.wrapping_add(ops.wrapping_mul(OP_STRIDE))));
        (s, o)
    })
}

/// The stream one random op draws from, as [`RngSeed`] says.
pub(crate) struct Draw {
    /// Seed parameter of the op.
    pub(crate) seed: u64,
    /// Counter offset parameter of the op (relative to `rng_base` while tracing).
    pub(crate) offset: u64,
    /// While tracing a global draw: the trace's `(rng_seed, rng_base)` inputs, which
    /// the op takes as its two trailing arguments.
    pub(crate) state: Option<(crate::Tensor, crate::Tensor)>,
}

impl Draw {
    /// `args` followed by the RNG-state tensors, if any.
    pub(crate) fn args<'a>(&'a self, args: &[&'a crate::Tensor]) -> Vec<&'a crate::Tensor> {
        let mut all = args.to_vec();
        if let Some((s, b)) = &self.state {
            all.extend([s, b]);
        }
        all
    }
}

/// Draw the stream of one random op: a fixed seed's stream `(seed, 0)`; while tracing,
/// the next slot of the trace's RNG-state inputs; otherwise the thread's generator
/// (advanced by one op).
pub(crate) fn draw(seed: RngSeed) -> Draw {
    match seed {
        RngSeed::Fixed(seed) => Draw { seed, offset: 0, state: None },
        RngSeed::Global => match crate::tensor::fake::active_trace() {
            Some(ctx) => {
                let (seed_t, base_t, rel) = ctx.next_rng();
                Draw { seed: 0, offset: rel, state: Some((seed_t, base_t)) }
            }
            None => {
                let (seed, offset) = take_rng(1);
                Draw { seed, offset, state: None }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_advances_per_op() {
        manual_seed(7);
        assert_eq!(take_rng(1), (7, 0));
        assert_eq!(take_rng(2), (7, OP_STRIDE));
        assert_eq!(rng_state(), (7, 3 * OP_STRIDE));
        set_rng_state(1, 5);
        assert_eq!(rng_state(), (1, 5));
    }
}

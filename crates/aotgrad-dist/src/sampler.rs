//! The distributed sampler: each global batch of an epoch's order split into one
//! shard per rank, so that N processes train on exactly the batches one process
//! would (same global batch, same order), each rank on `global / N` of its examples.

use crate::error::{Error, Result};
use std::ops::Range;

/// Which examples of each step a rank trains on; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    global_batch: usize,
    rank: usize,
    ranks: usize,
}

impl DistributedSampler {
    /// A sampler over `len` examples for `global_batch`-sized steps, for `rank` of
    /// `ranks`. The global batch must divide evenly across the ranks (an error
    /// naming the sizes otherwise), and must fit the data.
    pub fn new(len: usize, global_batch: usize, rank: usize, ranks: usize) -> Result<DistributedSampler> {
        if ranks == 0 || rank >= ranks {
            return Err(Error::Invalid(format!("rank {rank} of {ranks} processes")));
        }
        if global_batch == 0 || !global_batch.is_multiple_of(ranks) {
            return Err(Error::Invalid(format!(
                "the global batch of {global_batch} does not split evenly across {ranks} processes: choose a \
                 batch size that is a multiple of {ranks}"
            )));
        }
        if global_batch > len {
            return Err(Error::Invalid(format!("the global batch of {global_batch} exceeds the {len} examples")));
        }
        Ok(DistributedSampler { len, global_batch, rank, ranks })
    }

    /// Each rank's share of a global batch.
    pub fn local_batch(&self) -> usize {
        self.global_batch / self.ranks
    }

    /// Steps in an epoch: the last partial global batch is dropped, as in one process.
    pub fn steps_per_epoch(&self) -> usize {
        self.len / self.global_batch
    }

    /// This rank's examples at `step` of an epoch whose order (a permutation of
    /// `0..len`, the same on every rank) is `order`: rank `r` takes the `r`-th
    /// `local_batch()` of the global batch.
    /// An error for a step past the epoch or an order shorter than the data.
    pub fn shard<'a>(&self, order: &'a [usize], step: usize) -> Result<&'a [usize]> {
        let b = self.local_batch();
        let start = step.checked_mul(self.global_batch).and_then(|s| s.checked_add(self.rank * b));
        start.and_then(|s| order.get(s..s + b)).filter(|_| step < self.steps_per_epoch()).ok_or_else(|| {
            Error::Invalid(format!(
                "step {step} of an epoch of {} steps over an order of {} examples",
                self.steps_per_epoch(),
                order.len()
            ))
        })
    }

    /// This rank's contiguous part of `0..n` (for evaluation): parts differ in size
    /// by at most one, and cover `0..n` once across the ranks.
    pub fn eval_range(n: usize, rank: usize, ranks: usize) -> Range<usize> {
        let ranks = ranks.max(1);
        let (base, extra) = (n / ranks, n % ranks);
        let start = rank * base + rank.min(extra);
        start..start + base + usize::from(rank < extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_each_global_batch_once() {
        let order: Vec<usize> = (0..100).rev().collect();
        let samplers: Vec<_> = (0..4).map(|r| DistributedSampler::new(100, 24, r, 4).unwrap()).collect();
        assert_eq!(samplers[0].steps_per_epoch(), 4);
        for step in 0..4 {
            let joined: Vec<usize> = samplers.iter().flat_map(|s| s.shard(&order, step).unwrap().to_vec()).collect();
            assert_eq!(joined, order[step * 24..(step + 1) * 24]);
        }
    }

    #[test]
    fn a_step_past_the_epoch_is_an_error() {
        let s = DistributedSampler::new(100, 24, 1, 2).unwrap();
        let order: Vec<usize> = (0..100).collect();
        assert!(s.shard(&order, 4).is_err());
        assert!(s.shard(&order[..50], 3).is_err());
    }

    #[test]
    fn uneven_global_batches_are_refused() {
        let e = DistributedSampler::new(100, 32, 0, 3).unwrap_err().to_string();
        assert!(e.contains("32") && e.contains("3 processes"), "{e}");
        assert!(DistributedSampler::new(10, 12, 0, 2).is_err());
        assert!(DistributedSampler::new(10, 4, 2, 2).is_err());
    }

    #[test]
    fn eval_ranges_split_evenly() {
        let parts: Vec<_> = (0..3).map(|r| DistributedSampler::eval_range(10, r, 3)).collect();
        assert_eq!(parts, vec![0..4, 4..7, 7..10]);
        assert_eq!(DistributedSampler::eval_range(1, 1, 2), 1..1);
    }
}

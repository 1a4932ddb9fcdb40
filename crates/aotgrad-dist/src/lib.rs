//! `aotgrad-dist`: data-parallel training of compiled modules across processes and
//! machines, on MPI (Open MPI through the `mpi` crate), never a home-made transport.
//!
//! - [`World`]: this process among the job's processes (`mpirun -np N program`); an
//!   error when the program was not started by an MPI launcher.
//! - [`DistributedDataParallel`]: an `AotModule` replicated on every rank, rank 0's
//!   parameters broadcast when wrapped, a check that every rank compiled the same
//!   program, gradients averaged in buckets with non-blocking allreduces, a
//!   deterministic mode with bit-identical ranks, and gradient accumulation
//!   (`no_sync`).
//! - [`ZeroAdamW`]: ZeRO stage 1, AdamW's state sharded across the ranks
//!   (gradients reduce-scattered, the compiled update on each rank's shard,
//!   parameters allgathered), checkpoints that load on any number of ranks.
//! - [`DistributedSampler`]: each global batch split into one shard per rank, so N
//!   processes train on the batches one process would.
//!
//! ```no_run
//! use aotgrad_dist::{DdpConfig, DistributedDataParallel, DistributedSampler, World};
//! use aotgrad_runtime::module::AotModule;
//! use aotgrad_trace::Tensor;
//!
//! /// One step of data-parallel training, in every process of `mpirun -np N`.
//! fn step(module: AotModule, x: Tensor, y: Tensor, one: Tensor) -> aotgrad_dist::Result<()> {
//!     let world = std::rc::Rc::new(World::init()?);
//!     let ddp = DistributedDataParallel::new(world.clone(), module, DdpConfig::default())?;
//!     let sampler = DistributedSampler::new(60_000, 128, world.rank(), world.size())?;
//!     assert_eq!(sampler.local_batch(), 128 / world.size());
//!     let (_outs, back) = ddp.forward(&[x, y])?; // this rank's shard of the batch
//!     let _grads = back.backward_with(&[Some(one), None], &[])?; // averaged across ranks
//!     Ok(())
//! }
//! ```

pub mod bucket;
mod coll;
pub mod ddp;
mod error;
mod flat;
mod overlap;
pub mod sampler;
pub mod world;
pub mod zero;

pub use bucket::{Bucket, BucketPlan, Slot};
pub use ddp::{DdpBackward, DdpConfig, DdpStats, DistributedDataParallel};
pub use error::{Error, Result};
pub use sampler::DistributedSampler;
pub use world::{launched, World, TERMINATED_EXIT, TIMEOUT_EXIT};
pub use zero::ZeroAdamW;

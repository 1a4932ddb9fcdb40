//! The MPI world: this process's rank among `size` processes, and the few collectives
//! the rest of the crate is built on (all on `MPI_COMM_WORLD`, called from the thread
//! that created the [`World`]).
//!
//! MPI is initialized with `MPI_THREAD_FUNNELED`: the compiled backend's worker
//! threads never call MPI, only the training loop's thread does. The world's error
//! handler is `MPI_ERRORS_RETURN`, so a failed call reaches this crate instead of
//! aborting the job silently; a rank that fails on its own (an error, a killed
//! process) is noticed by the others through the deadline every wait here has
//! ([`World::set_timeout`]).

use crate::error::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::time::{Duration, Instant};

/// The environment variables MPI launchers set in the processes they start: Open MPI's
/// `mpirun`, MPICH's Hydra (`PMI_SIZE`), PMIx-based launchers (`PMIX_RANK`, Slurm's `srun --mpi=pmix`).
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// The exit code of a job a rank ends after a collective missed its deadline.
pub const TIMEOUT_EXIT: i32 = 75;

/// Whether this process was started by an MPI launcher.
pub fn launched() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// The processes of one MPI job; see the [module docs](self). One per process:
/// create it once, early (before other threads start), and share it (`Rc<World>`).
/// Dropping it finalizes MPI.
pub struct World {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    // Declared last: finalizes MPI after everything above is dropped.
    _universe: Universe,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

/// The deadline of collectives when [`World::set_timeout`] was not called:
/// `AOTGRAD_DIST_TIMEOUT` (seconds) or 30 s.
fn default_timeout() -> Duration {
    std::env::var("AOTGRAD_DIST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(30), Duration::from_secs_f64)
}

impl World {
    /// Initialize MPI. An error when the process was not started by an MPI launcher
    /// (`mpirun -np N program`), or when MPI is initialized already.
    pub fn init() -> Result<World> {
        if !launched() {
            let program = std::env::args().next().unwrap_or_else(|| "PROGRAM".into());
            return Err(Error::NotLaunched(program));
        }
        let (universe, _level) =
            mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or(Error::AlreadyInitialized)?;
        let comm = universe.world();
        // SAFETY: MPI is initialized; the communicator and the predefined error
        // handler are valid handles.
        unsafe {
            mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN);
        }
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        tracing::debug!(rank, size, "MPI world initialized");
        Ok(World { comm, rank, size, timeout: default_timeout(), _universe: universe })
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is rank 0 (the one that prints and writes files).
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// How long a collective may wait for the other ranks before this rank reports
    /// [`Error::Timeout`] and ends the job (default: `AOTGRAD_DIST_TIMEOUT` seconds, or 30).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The deadline of collectives.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// The underlying rsmpi communicator (`MPI_COMM_WORLD`), for collectives this
    /// crate does not wrap (a bench's raw-MPI baseline, say).
    pub fn communicator(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Average `buffers` element-wise across the ranks, in place: one non-blocking
    /// exchange per buffer, all started before any is waited for, as
    /// [`crate::DistributedDataParallel`] exchanges its buckets (allreduce, or in
    /// `deterministic` mode an allgather summed in rank order). Returns the seconds
    /// spent waiting.
    pub fn average_f32(&self, buffers: &mut [Vec<f32>], deterministic: bool, step: u64) -> Result<f64> {
        let mut tagged: Vec<(usize, Vec<f32>)> = buffers.iter_mut().map(std::mem::take).enumerate().collect();
        let waited = crate::ddp::exchange(self, &mut tagged, deterministic, step);
        for (b, (_, v)) in buffers.iter_mut().zip(tagged) {
            *b = v;
        }
        waited
    }

    /// Wait for every rank (with the deadline; `step` names the point in messages).
    pub fn barrier(&self, step: u64) -> Result<()> {
        let deadline = self.deadline();
        let req = self.comm.immediate_barrier();
        self.wait(req, "barrier", step, deadline)
    }

    /// Sum `values` element-wise over every rank, in place (the same rank order on
    /// every rank: rank 0's values first), for metrics and counts.
    pub fn sum_f64(&self, values: &mut [f64], step: u64) -> Result<()> {
        let gathered = self.all_gather_f64(values, step)?;
        let n = values.len();
        for (i, v) in values.iter_mut().enumerate() {
            *v = (0..self.size).fold(0.0, |acc, r| acc + gathered[r * n + i]);
        }
        Ok(())
    }

    /// Every rank's `mine` (the same length on every rank), rank by rank.
    pub fn all_gather_f64(&self, mine: &[f64], step: u64) -> Result<Vec<f64>> {
        let mut all = vec![0.0f64; mine.len() * self.size];
        let deadline = self.deadline();
        mpi::request::scope(|scope| {
            let req = self.comm.immediate_all_gather_into(scope, mine, &mut all[..]);
            self.wait(req, "allgather", step, deadline)
        })?;
        Ok(all)
    }

    /// Rank `root`'s bytes on every rank (`bytes` is replaced on the others).
    pub fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>, step: u64) -> Result<()> {
        let mut len = [bytes.len() as u64];
        let deadline = self.deadline();
        let root_proc = self.comm.process_at_rank(root as i32);
        mpi::request::scope(|scope| {
            let req = root_proc.immediate_broadcast_into(scope, &mut len[..]);
            self.wait(req, "broadcast", step, deadline)
        })?;
        if self.rank != root {
            *bytes = vec![0u8; len[0] as usize];
        }
        mpi::request::scope(|scope| {
            let req = root_proc.immediate_broadcast_into(scope, &mut bytes[..]);
            self.wait(req, "broadcast", step, deadline)
        })
    }

    /// Every rank's bytes (any length), rank by rank.
    pub fn all_gather_bytes(&self, mine: &[u8], step: u64) -> Result<Vec<Vec<u8>>> {
        let lens = self.all_gather_f64(&[mine.len() as f64], step)?;
        let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
        let max = lens.iter().copied().max().unwrap_or(0);
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let mut all = vec![0u8; max * self.size];
        let deadline = self.deadline();
        mpi::request::scope(|scope| {
            let req = self.comm.immediate_all_gather_into(scope, &padded[..], &mut all[..]);
            self.wait(req, "allgather", step, deadline)
        })?;
        Ok(all.chunks(max.max(1)).zip(&lens).map(|(c, &l)| c[..l.min(c.len())].to_vec()).take(self.size).collect())
    }

    /// End every process of the job (`MPI_Abort`): what a rank does after an error
    /// that leaves the others waiting for it, once it has reported the error.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }

    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Complete `req` by `deadline`, polling (which also progresses MPI's
    /// non-blocking collectives). A request that misses its deadline cannot be taken
    /// back from MPI, which may still write the buffers it was given: the rank prints
    /// [`Error::Timeout`]'s message (naming itself, the collective and the step) and
    /// ends the job with `MPI_Abort`, so no rank waits for ever.
    pub(crate) fn wait<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
        &self,
        mut req: mpi::request::Request<'a, D, S>,
        op: &str,
        step: u64,
        deadline: Instant,
    ) -> Result<()> {
        let mut spins = 0u32;
        loop {
            match req.test() {
                Ok(_) => return Ok(()),
                Err(r) => req = r,
            }
            if Instant::now() >= deadline {
                let e =
                    Error::Timeout { rank: self.rank, op: op.to_string(), step, seconds: self.timeout.as_secs_f64() };
                eprintln!("error: {e}");
                self.abort(TIMEOUT_EXIT);
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
        }
    }

    /// Sum operation for reductions.
    pub(crate) fn sum_op() -> SystemOperation {
        SystemOperation::sum()
    }
}

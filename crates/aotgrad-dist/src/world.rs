//! The MPI world: this process's rank among `size` processes, and the MPI thread that
//! makes every MPI call of the process.
//!
//! MPI is initialized on a thread of its own, which makes every MPI call but an
//! emergency `MPI_Abort` (with `MPI_THREAD_MULTIPLE` where MPI provides it, so that
//! abort may come from the training thread; `MPI_THREAD_FUNNELED` at least). The
//! training thread hands it jobs — closures over the
//! communicator, run one at a time in the order they were submitted, so every rank
//! starts its collectives in the same order — and goes on computing: a bucket's
//! blocking allreduce runs there while the backward computes the next gradients, and
//! MPI's fast blocking algorithms progress on their own. The world's error handler is
//! `MPI_ERRORS_RETURN`, and every collective's return code is checked
//! ([`Error::Mpi`]).
//!
//! Every wait for a job has a deadline ([`World::set_timeout`]; `AOTGRAD_DIST_TIMEOUT`
//! seconds, 30 by default): a collective a dead or failed rank never joins cannot be
//! taken back from MPI, so the waiting rank prints which collective at which step timed
//! out and ends the job (`MPI_Abort`). When the launcher ends the job (SIGTERM, after
//! another rank died), a rank waiting on a collective says which one and at which step
//! before it exits.

use crate::coll::{self, MpiResult};
use crate::error::{Error, Result};
use crate::flat::Elem;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The environment variables MPI launchers set in the processes they start: Open MPI's
/// `mpirun`, MPICH's Hydra (`PMI_SIZE`), PMIx-based launchers (`PMIX_RANK`, Slurm's `srun --mpi=pmix`).
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// The exit code of a job a rank ends after a collective missed its deadline.
pub const TIMEOUT_EXIT: i32 = 75;

/// The exit code of a rank that the launcher ended (SIGTERM) while it waited on a
/// collective.
pub const TERMINATED_EXIT: i32 = 143;

/// Whether this process was started by an MPI launcher.
pub fn launched() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// The world communicator's handle, sent from the MPI thread for `MPI_Abort`.
struct RawComm(mpi::ffi::MPI_Comm);

// SAFETY: a communicator handle is a process-wide name of the communicator; it is only
// used for `MPI_Abort`, which any thread may call to end the job.
unsafe impl Send for RawComm {}

/// A job for the MPI thread.
type Job = Box<dyn FnOnce(&SimpleCommunicator) + Send>;

/// The processes of one MPI job; see the [module docs](self). One per process:
/// create it once and share it (`Rc<World>`). Dropping it ends the MPI thread, which
/// finalizes MPI.
pub struct World {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// The world communicator's handle, for `MPI_Abort` from this thread when the MPI
    /// thread is stuck in a collective that will never complete.
    raw_comm: RawComm,
    /// Set when the launcher asks this process to stop (SIGTERM).
    terminated: Arc<AtomicBool>,
    /// MPI provides `MPI_THREAD_MULTIPLE`: this thread may call `MPI_Abort`.
    multiple: bool,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

/// A job's result, once the MPI thread has run it.
pub struct Pending<R> {
    rx: Receiver<R>,
    op: &'static str,
    step: u64,
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

/// The MPI thread: initialize, report rank and size (and the raw communicator), run
/// jobs until the world is dropped, then finalize.
/// What the MPI thread reports once MPI is up: rank, size, the communicator's
/// handle, whether MPI provides `MPI_THREAD_MULTIPLE`.
type Started = std::result::Result<(usize, usize, RawComm, bool), Error>;

fn mpi_thread(ready: Sender<Started>, jobs: Receiver<Job>) {
    let Some((universe, level)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
        let _ = ready.send(Err(Error::AlreadyInitialized));
        return;
    };
    if level < mpi::Threading::Funneled {
        let _ = ready.send(Err(Error::Invalid(format!(
            "this MPI provides thread level {level:?}; aotgrad-dist needs MPI_THREAD_FUNNELED at least"
        ))));
        return;
    }
    let multiple = level == mpi::Threading::Multiple;
    let comm = universe.world();
    // SAFETY: MPI is initialized; the communicator and the predefined error handler
    // are valid handles.
    unsafe {
        mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN);
    }
    let raw = RawComm(comm.as_raw());
    if ready.send(Ok((comm.rank() as usize, comm.size() as usize, raw, multiple))).is_err() {
        return;
    }
    for job in jobs {
        job(&comm);
    }
    drop(comm);
    drop(universe);
}

impl World {
    /// Initialize MPI (on the MPI thread). An error when the process was not started
    /// by an MPI launcher (`mpirun -np N program`), or when MPI is initialized already.
    pub fn init() -> Result<World> {
        if !launched() {
            let program = std::env::args().next().unwrap_or_else(|| "PROGRAM".into());
            return Err(Error::NotLaunched(program));
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("aotgrad-mpi".into())
            .spawn(move || mpi_thread(ready_tx, jobs_rx))
            .map_err(|e| Error::Invalid(format!("could not start the MPI thread: {e}")))?;
        let (rank, size, raw, multiple) =
            ready_rx.recv().map_err(|_| Error::Invalid("the MPI thread ended while initializing MPI".into()))??;
        // mpirun ends the job with SIGTERM when a rank dies or aborts: a rank waiting
        // on a collective then says which one and at which step before it exits. A
        // second SIGTERM ends the process as usual (as does the launcher's SIGKILL).
        let terminated = Arc::new(AtomicBool::new(false));
        let term = signal_hook::consts::SIGTERM;
        let watched = signal_hook::flag::register_conditional_shutdown(term, TERMINATED_EXIT, terminated.clone())
            .and_then(|_| signal_hook::flag::register(term, terminated.clone()));
        if let Err(e) = watched {
            tracing::warn!("could not watch SIGTERM: {e}");
        }
        tracing::debug!(rank, size, "MPI world initialized");
        Ok(World {
            jobs: Some(jobs_tx),
            thread: Some(thread),
            raw_comm: raw,
            terminated,
            multiple,
            rank,
            size,
            timeout: default_timeout(),
        })
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

    /// Hand `job` to the MPI thread, which runs it after the jobs submitted before it;
    /// [`Pending::wait`] gives its result. `op` and `step` name it in messages.
    pub fn submit<R: Send + 'static>(
        &self,
        op: &'static str,
        step: u64,
        job: impl FnOnce(&SimpleCommunicator) -> R + Send + 'static,
    ) -> Result<Pending<R>> {
        let (tx, rx) = mpsc::channel();
        let boxed: Job = Box::new(move |comm| {
            let _ = tx.send(job(comm));
        });
        self.jobs
            .as_ref()
            .and_then(|j| j.send(boxed).ok())
            .ok_or_else(|| Error::Invalid(format!("the MPI thread has ended ({op} at step {step})")))?;
        Ok(Pending { rx, op, step })
    }

    /// Submit a job that reports MPI failures; its [`Pending::wait_checked`] turns one
    /// into [`Error::Mpi`].
    pub(crate) fn submit_checked<R: Send + 'static>(
        &self,
        op: &'static str,
        step: u64,
        job: impl FnOnce(&SimpleCommunicator) -> MpiResult<R> + Send + 'static,
    ) -> Result<Pending<MpiResult<R>>> {
        self.submit(op, step, job)
    }

    /// Run a job that reports MPI failures, and wait for it.
    pub(crate) fn run_checked<R: Send + 'static>(
        &self,
        op: &'static str,
        step: u64,
        job: impl FnOnce(&SimpleCommunicator) -> MpiResult<R> + Send + 'static,
    ) -> Result<R> {
        self.submit_checked(op, step, job)?.wait_checked(self)
    }

    /// [`World::submit`] and wait: run `job` with the communicator on the MPI thread
    /// (for collectives this crate does not wrap, such as a bench's raw-MPI baseline).
    pub fn run<R: Send + 'static>(
        &self,
        op: &'static str,
        step: u64,
        job: impl FnOnce(&SimpleCommunicator) -> R + Send + 'static,
    ) -> Result<R> {
        self.submit(op, step, job)?.wait(self)
    }

    /// Wait for every rank (with the deadline; `step` names the point in messages).
    pub fn barrier(&self, step: u64) -> Result<()> {
        self.run_checked("barrier", step, coll::barrier)
    }

    /// [`World::barrier`] with another deadline.
    pub fn barrier_for(&self, step: u64, timeout: Duration) -> Result<()> {
        self.submit_checked("barrier", step, coll::barrier)?.wait_checked_for(self, timeout)
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
        let mine = mine.to_vec();
        let size = self.size;
        self.run_checked("allgather", step, move |c| {
            let mut all = vec![0.0f64; mine.len() * size];
            coll::all_gather(c, &mine, &mut all)?;
            Ok(all)
        })
    }

    /// Rank `root`'s bytes on every rank (`bytes` is replaced on the others).
    pub fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>, step: u64) -> Result<()> {
        let mine = std::mem::take(bytes);
        let me = self.rank;
        *bytes = self.run_checked("broadcast", step, move |c| {
            let mut len = [mine.len() as u64];
            coll::broadcast(c, root, &mut len)?;
            let mut buf = if me == root { mine } else { vec![0u8; len[0] as usize] };
            coll::broadcast(c, root, &mut buf)?;
            Ok(buf)
        })?;
        Ok(())
    }

    /// Every rank's bytes (any length), rank by rank.
    pub fn all_gather_bytes(&self, mine: &[u8], step: u64) -> Result<Vec<Vec<u8>>> {
        self.all_gather_bytes_for(mine, step, self.timeout)
    }

    /// [`World::all_gather_bytes`] with another deadline.
    pub fn all_gather_bytes_for(&self, mine: &[u8], step: u64, timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let len = mine.len() as f64;
        let size = self.size;
        let lens = self
            .submit_checked("allgather", step, move |c| {
                let mut all = vec![0.0f64; size];
                coll::all_gather(c, &[len], &mut all)?;
                Ok(all)
            })?
            .wait_checked_for(self, timeout)?;
        let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
        let max = lens.iter().copied().max().unwrap_or(0).max(1);
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let size = self.size;
        let all = self
            .submit_checked("allgather", step, move |c| {
                let mut all = vec![0u8; max * size];
                coll::all_gather(c, &padded, &mut all)?;
                Ok(all)
            })?
            .wait_checked_for(self, timeout)?;
        Ok(all.chunks(max).zip(&lens).map(|(c, &l)| c[..l.min(c.len())].to_vec()).take(self.size).collect())
    }

    /// Average `buffers` element-wise across the ranks, in place, each buffer by one
    /// blocking allreduce (or, `deterministic`, an allgather summed in rank order) on
    /// the MPI thread, all submitted before any is waited for: the bucket exchange of
    /// [`crate::DistributedDataParallel`]. Returns the seconds spent waiting.
    pub fn average_f32(&self, buffers: &mut [Vec<f32>], deterministic: bool, step: u64) -> Result<f64> {
        let pending: Vec<Pending<MpiResult<Exchanged<f32>>>> = buffers
            .iter_mut()
            .map(|b| self.submit_average(std::mem::take(b), deterministic, step))
            .collect::<Result<_>>()?;
        let t = Instant::now();
        for (b, p) in buffers.iter_mut().zip(pending) {
            *b = p.wait_checked(self)?.values;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Submit the average of `values` across the ranks (see [`World::average_f32`]).
    pub(crate) fn submit_average<T: Elem + Send>(
        &self,
        values: Vec<T>,
        deterministic: bool,
        step: u64,
    ) -> Result<Pending<MpiResult<Exchanged<T>>>> {
        let n = self.size;
        let op = if deterministic { "gradient allgather" } else { "gradient allreduce" };
        self.submit_checked(op, step, move |c| {
            let start = Instant::now();
            let mut out = vec![T::default(); values.len()];
            if deterministic {
                let len = values.len();
                let mut all = vec![T::default(); len * n];
                coll::all_gather(c, &values, &mut all)?;
                for (i, x) in out.iter_mut().enumerate() {
                    let mut acc = all[i];
                    for r in 1..n {
                        acc += all[r * len + i];
                    }
                    *x = acc.div(n);
                }
            } else {
                coll::all_reduce_sum(c, &values, &mut out)?;
                for x in &mut out {
                    *x = x.div(n);
                }
            }
            Ok(Exchanged { values: out, start, end: Instant::now() })
        })
    }

    /// End every process of the job: what a rank does after an error that leaves the
    /// others waiting for it, once it has reported the error. With
    /// `MPI_THREAD_MULTIPLE` this is `MPI_Abort` from this thread (even while the MPI
    /// thread is stuck in a collective); otherwise the process exits with `code`, and
    /// the launcher (`mpirun`) ends the others on that non-zero exit.
    pub fn abort(&self, code: i32) -> ! {
        if self.multiple {
            // SAFETY: the communicator handle stays valid until MPI is finalized,
            // which only dropping this world does; MPI_THREAD_MULTIPLE lets any
            // thread call MPI.
            unsafe {
                mpi::ffi::MPI_Abort(self.raw_comm.0, code);
            }
        }
        std::process::exit(code)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Closing the job queue ends the MPI thread, which finalizes MPI.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One averaged bucket and when the MPI thread worked on it.
pub(crate) struct Exchanged<T> {
    pub(crate) values: Vec<T>,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

impl<R> Pending<R> {
    /// The job's result. A job not done by the world's deadline cannot be taken back
    /// from MPI: the rank prints [`Error::Timeout`]'s message (naming itself, the
    /// collective and the step) and ends the job with `MPI_Abort`, so no rank waits
    /// for ever; so does a rank the launcher is ending (SIGTERM) while it waits.
    pub fn wait(self, world: &World) -> Result<R> {
        self.wait_for(world, world.timeout)
    }

    /// [`Pending::wait`] with another deadline (a wait that covers another rank's
    /// compile, say).
    pub fn wait_for(self, world: &World, timeout: Duration) -> Result<R> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.rx.recv_timeout(Duration::from_millis(20)) {
                Ok(r) => return Ok(r),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Invalid(format!(
                        "the MPI thread ended during {} at step {}",
                        self.op, self.step
                    )))
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if world.terminated.load(Ordering::Relaxed) {
                eprintln!(
                    "error: rank {}: {} at step {} was interrupted: the job is ending (another rank died or failed)",
                    world.rank, self.op, self.step
                );
                std::process::exit(TERMINATED_EXIT);
            }
            if Instant::now() >= deadline {
                let e = Error::Timeout {
                    rank: world.rank,
                    op: self.op.to_string(),
                    step: self.step,
                    seconds: timeout.as_secs_f64(),
                };
                eprintln!("error: {e}");
                world.abort(TIMEOUT_EXIT);
            }
        }
    }
}

impl<R> Pending<MpiResult<R>> {
    /// [`Pending::wait`] for a job that reports MPI failures: one becomes [`Error::Mpi`].
    pub(crate) fn wait_checked(self, world: &World) -> Result<R> {
        let (op, step) = (self.op, self.step);
        self.wait(world)?.map_err(|msg| Error::Mpi { rank: world.rank, op: op.to_string(), step, msg })
    }

    /// [`Pending::wait_checked`] with another deadline.
    pub(crate) fn wait_checked_for(self, world: &World, timeout: Duration) -> Result<R> {
        let (op, step) = (self.op, self.step);
        self.wait_for(world, timeout)?.map_err(|msg| Error::Mpi { rank: world.rank, op: op.to_string(), step, msg })
    }
}

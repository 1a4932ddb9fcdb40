//! The crate's error type.

/// What can go wrong in data-parallel training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process was not started by an MPI launcher.
    #[error(
        "this process was not started by an MPI launcher (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in its \
         environment): start it with `mpirun -np N {0}`"
    )]
    NotLaunched(String),
    /// MPI was initialized already in this process (one `World` per process).
    #[error("MPI is already initialized in this process: create one World and share it (Rc<World>)")]
    AlreadyInitialized,
    /// The ranks do not hold the same thing where they must.
    #[error("rank {rank} differs from rank 0: {what}")]
    Mismatch {
        /// The first rank that differs.
        rank: usize,
        /// What differs.
        what: String,
    },
    /// A collective did not complete in time: a rank died, hangs, or stopped calling.
    #[error(
        "rank {rank}: {op} at step {step} did not complete within {seconds:.0} s (another rank died, hangs or \
         returned an error); this world cannot be used any more"
    )]
    Timeout {
        /// This process's rank.
        rank: usize,
        /// The collective.
        op: String,
        /// The training step (gradient synchronizations so far).
        step: u64,
        /// The deadline.
        seconds: f64,
    },
    /// An MPI call failed (the world returns errors instead of aborting).
    #[error("rank {rank}: {op} at step {step} failed: {msg}")]
    Mpi {
        /// This process's rank.
        rank: usize,
        /// The collective.
        op: String,
        /// The training step.
        step: u64,
        /// MPI's message.
        msg: String,
    },
    /// An argument or a configuration does not fit.
    #[error("{0}")]
    Invalid(String),
    /// The compiled module failed.
    #[error(transparent)]
    Aot(#[from] aotgrad_runtime::Error),
    /// A tensor operation failed.
    #[error(transparent)]
    Trace(#[from] aotgrad_trace::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

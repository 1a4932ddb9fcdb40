//! The collectives this crate issues, called through MPI's C interface with their
//! return codes checked: the world's error handler is `MPI_ERRORS_RETURN`, and a
//! failed collective must be an error, not a buffer left as it was (rsmpi's safe
//! wrappers drop the codes).

use mpi::datatype::Equivalence;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::os::raw::{c_int, c_void};

/// A collective's outcome: MPI's message on failure.
pub(crate) type MpiResult<T> = std::result::Result<T, String>;

/// MPI's message for error code `rc` (nothing for success).
fn check(rc: c_int) -> MpiResult<()> {
    if rc == 0 {
        return Ok(());
    }
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING (256) bytes.
    unsafe {
        mpi::ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut std::os::raw::c_char, &mut len);
    }
    buf.truncate(len.clamp(0, 512) as usize);
    Err(format!("MPI error {rc}: {}", String::from_utf8_lossy(&buf)))
}

fn count(n: usize) -> MpiResult<c_int> {
    c_int::try_from(n).map_err(|_| format!("{n} elements are more than one MPI call can move (2^31 - 1)"))
}

/// Element-wise sum of every rank's `send` into `recv` on every rank.
pub(crate) fn all_reduce_sum<T: Equivalence>(c: &SimpleCommunicator, send: &[T], recv: &mut [T]) -> MpiResult<()> {
    if send.len() != recv.len() {
        return Err(format!("allreduce of {} elements into {}", send.len(), recv.len()));
    }
    // SAFETY: both buffers hold `count` elements of the datatype, and live past the
    // (blocking) call.
    check(unsafe {
        mpi::ffi::MPI_Allreduce(
            send.as_ptr() as *const c_void,
            recv.as_mut_ptr() as *mut c_void,
            count(send.len())?,
            T::equivalent_datatype().as_raw(),
            mpi::collective::SystemOperation::sum().as_raw(),
            c.as_raw(),
        )
    })
}

/// Every rank's `send` (the same length on every rank), end to end in rank order.
pub(crate) fn all_gather<T: Equivalence>(c: &SimpleCommunicator, send: &[T], recv: &mut [T]) -> MpiResult<()> {
    if recv.len() != send.len() * c.size() as usize {
        return Err(format!("allgather of {} elements from {} ranks into {}", send.len(), c.size(), recv.len()));
    }
    let n = count(send.len())?;
    let dt = T::equivalent_datatype().as_raw();
    // SAFETY: `recv` holds `n` elements per rank; both outlive the blocking call.
    check(unsafe {
        mpi::ffi::MPI_Allgather(
            send.as_ptr() as *const c_void,
            n,
            dt,
            recv.as_mut_ptr() as *mut c_void,
            n,
            dt,
            c.as_raw(),
        )
    })
}

/// Rank `root`'s `buf` on every rank (the same length on every rank).
pub(crate) fn broadcast<T: Equivalence>(c: &SimpleCommunicator, root: usize, buf: &mut [T]) -> MpiResult<()> {
    let root = c_int::try_from(root).map_err(|_| format!("rank {root}"))?;
    // SAFETY: `buf` holds `count` elements and outlives the blocking call.
    check(unsafe {
        mpi::ffi::MPI_Bcast(
            buf.as_mut_ptr() as *mut c_void,
            count(buf.len())?,
            T::equivalent_datatype().as_raw(),
            root,
            c.as_raw(),
        )
    })
}

/// Every rank reaches this point.
pub(crate) fn barrier(c: &SimpleCommunicator) -> MpiResult<()> {
    // SAFETY: a valid communicator.
    check(unsafe { mpi::ffi::MPI_Barrier(c.as_raw()) })
}

/// The sum over ranks of `send`, cut into `size` blocks: block `rank` into `recv`.
pub(crate) fn reduce_scatter_sum<T: Equivalence>(c: &SimpleCommunicator, send: &[T], recv: &mut [T]) -> MpiResult<()> {
    if send.len() != recv.len() * c.size() as usize {
        return Err(format!("reduce-scatter of {} elements into blocks of {}", send.len(), recv.len()));
    }
    // SAFETY: `send` holds `size` blocks of `recv.len()` elements; both outlive the call.
    check(unsafe {
        mpi::ffi::MPI_Reduce_scatter_block(
            send.as_ptr() as *const c_void,
            recv.as_mut_ptr() as *mut c_void,
            count(recv.len())?,
            T::equivalent_datatype().as_raw(),
            mpi::collective::SystemOperation::sum().as_raw(),
            c.as_raw(),
        )
    })
}

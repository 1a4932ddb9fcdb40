//! CPU storage (typed buffers with a version counter) and `CpuTensor` handles.

use aotgrad_ir::{DType, TensorMeta};
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A typed, contiguous block of elements.
#[derive(Clone, Debug, PartialEq)]
pub enum Buffer {
    /// bool elements.
    Bool(Vec<bool>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
}

/// Results at least this large are checked for allocatability before a kernel runs.
const PREFLIGHT_BYTES: u128 = 64 << 20;

/// Check that `elems` elements of `dtype` can be allocated (for `what`): an error
/// naming the bytes instead of the process aborting inside a kernel.
/// Large sizes are tried for real (reserved, then released at once), so a size the
/// allocator refuses is reported before any kernel starts.
pub fn check_alloc(what: &str, dtype: DType, elems: u128) -> crate::Result<()> {
    check_alloc_bytes(what, elems.saturating_mul(dtype.size_bytes() as u128))
}

/// [`check_alloc`] for a byte count.
pub fn check_alloc_bytes(what: &str, bytes: u128) -> crate::Result<()> {
    check_alloc_probe(what, bytes, bytes)
}

/// Check that `probe` bytes can be allocated; the error reports `bytes` (what the
/// caller will keep, when its working memory is larger than its result).
pub fn check_alloc_probe(what: &str, bytes: u128, probe: u128) -> crate::Result<()> {
    let oom = || crate::CpuError::OutOfMemory { what: what.to_string(), bytes };
    if probe > isize::MAX as u128 {
        return Err(oom());
    }
    if probe >= PREFLIGHT_BYTES {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(probe as usize).map_err(|_| oom())?;
    }
    Ok(())
}

impl Buffer {
    /// A zero-filled buffer.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        match dtype {
            DType::Bool => Buffer::Bool(vec![false; len]),
            DType::I32 => Buffer::I32(vec![0; len]),
            DType::I64 => Buffer::I64(vec![0; len]),
            DType::F16 => Buffer::F16(vec![f16::ZERO; len]),
            DType::BF16 => Buffer::BF16(vec![bf16::ZERO; len]),
            DType::F32 => Buffer::F32(vec![0.0; len]),
            DType::F64 => Buffer::F64(vec![0.0; len]),
        }
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::Bool(_) => DType::Bool,
            Buffer::I32(_) => DType::I32,
            Buffer::I64(_) => DType::I64,
            Buffer::F16(_) => DType::F16,
            Buffer::BF16(_) => DType::BF16,
            Buffer::F32(_) => DType::F32,
            Buffer::F64(_) => DType::F64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::Bool(v) => v.len(),
            Buffer::I32(v) => v.len(),
            Buffer::I64(v) => v.len(),
            Buffer::F16(v) => v.len(),
            Buffer::BF16(v) => v.len(),
            Buffer::F32(v) => v.len(),
            Buffer::F64(v) => v.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Memory shared by every view of a tensor, with a version counter bumped on each write.
#[derive(Debug)]
pub struct Storage {
    buf: RwLock<Buffer>,
    version: AtomicU64,
}

impl Storage {
    /// Wrap a buffer.
    pub fn new(buf: Buffer) -> Arc<Storage> {
        Arc::new(Storage { buf: RwLock::new(buf), version: AtomicU64::new(0) })
    }
    /// The buffer, taking the storage apart.
    pub fn into_buffer(mut self) -> Buffer {
        let slot = self.buf.get_mut().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(slot, Buffer::Bool(Vec::new()))
    }
    /// Read access.
    pub fn read(&self) -> RwLockReadGuard<'_, Buffer> {
        self.buf.read().unwrap_or_else(|e| e.into_inner())
    }
    /// Write access; bumps the version counter.
    pub fn write(&self) -> RwLockWriteGuard<'_, Buffer> {
        self.version.fetch_add(1, Ordering::Relaxed);
        self.buf.write().unwrap_or_else(|e| e.into_inner())
    }
    /// Count a change made without writing the buffer: an in-place metadata op
    /// (`t_`, `transpose_`, `as_strided_`, ...), which PyTorch's version counter counts.
    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }
    /// How many times the storage was written.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.read().dtype()
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.read().len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Storage {
    /// Large buffers go back to the recycling pool (see [`take_recycled`]).
    fn drop(&mut self) {
        let slot = self.buf.get_mut().unwrap_or_else(|e| e.into_inner());
        let buf = std::mem::replace(slot, Buffer::Bool(Vec::new()));
        recycle(buf);
    }
}

/// Buffers at least this large are recycled.
const RECYCLE_MIN_BYTES: usize = 64 * 1024;
/// The pool holds at most this many bytes; beyond it, freed buffers are released.
const RECYCLE_MAX_BYTES: usize = 512 * 1024 * 1024;

/// A cache of freed buffers by (dtype, length), like PyTorch's caching allocator: a
/// training loop allocates the same sizes every step, and a recycled buffer costs no
/// page faults and no zeroing. Only the compiled backend draws from it, for outputs
/// its kernels overwrite completely.
struct Recycler {
    free: std::collections::HashMap<(DType, usize), Vec<Buffer>>,
    bytes: usize,
}

fn recycler() -> &'static std::sync::Mutex<Recycler> {
    static POOL: std::sync::OnceLock<std::sync::Mutex<Recycler>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| std::sync::Mutex::new(Recycler { free: Default::default(), bytes: 0 }))
}

fn recycle(buf: Buffer) {
    let bytes = buf.len() * buf.dtype().size_bytes();
    if bytes < RECYCLE_MIN_BYTES {
        return;
    }
    let mut pool = recycler().lock().unwrap_or_else(|e| e.into_inner());
    if pool.bytes + bytes > RECYCLE_MAX_BYTES {
        return;
    }
    pool.bytes += bytes;
    pool.free.entry((buf.dtype(), buf.len())).or_default().push(buf);
}

/// A buffer of `dtype` and `len` elements with **unspecified contents** — a recycled
/// one when the pool has it, else a fresh zeroed one. For results that are written
/// completely before anything reads them.
pub fn take_recycled(dtype: DType, len: usize) -> Buffer {
    let bytes = len * dtype.size_bytes();
    if bytes >= RECYCLE_MIN_BYTES {
        let mut pool = recycler().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = pool.free.get_mut(&(dtype, len)).and_then(Vec::pop) {
            pool.bytes -= bytes;
            return b;
        }
    }
    Buffer::zeros(dtype, len)
}

/// Release every recycled buffer (returns the bytes released).
pub fn release_recycled() -> usize {
    let mut pool = recycler().lock().unwrap_or_else(|e| e.into_inner());
    let bytes = pool.bytes;
    pool.free.clear();
    pool.bytes = 0;
    bytes
}

/// A concrete tensor: a storage handle plus concrete metadata.
#[derive(Clone, Debug)]
pub struct CpuTensor {
    /// Shared storage.
    pub storage: Arc<Storage>,
    /// Concrete metadata (no symbols).
    pub meta: TensorMeta,
}

impl CpuTensor {
    /// True when both handles use the same storage.
    pub fn same_storage(&self, other: &CpuTensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
}

//! CPU storage (typed buffers with a version counter) and `CpuTensor` handles.

use aotgrad_ir::{DType, TensorMeta};
use half::{bf16, f16};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

/// A copy of a storage's elements held by a device (a GPU buffer, see
/// `aotgrad-wgpu`), read back to the host only when the host needs the elements.
pub trait DeviceBuffer: Send + Sync + std::fmt::Debug {
    /// Element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements, copied to the host (an error: the device failed or was lost).
    fn read_back(&self) -> std::result::Result<Buffer, String>;
    /// For the backend that made it: its own buffer type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Memory shared by every view of a tensor, with a version counter bumped on each write.
///
/// The elements live on the host, on a device, or both. A storage a device backend
/// produced ([`Storage::on_device`]) holds only the device copy until the host needs
/// the elements: [`Storage::read`] and [`Storage::write`] read it back first
/// ([`Storage::sync_host`] does so with an error instead of a panic when the device
/// failed); a write drops the device copy, which would be stale. A device backend
/// binds [`Storage::device_copy`] directly, so a tensor already on its device is not
/// copied. Storages that never saw a device pay one relaxed atomic load per access.
pub struct Storage {
    buf: RwLock<Buffer>,
    version: AtomicU64,
    /// Whether `buf` holds the current elements (else only `device` does).
    host_current: AtomicBool,
    /// Whether `device` may hold a copy (lets host-only storages skip its lock).
    has_device: AtomicBool,
    /// A device copy of the current elements.
    device: Mutex<Option<Arc<dyn DeviceBuffer>>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Storage");
        if self.host_current.load(Ordering::Acquire) {
            d.field("buf", &*self.buf.read().unwrap_or_else(|e| e.into_inner()));
        }
        d.field("version", &self.version()).field("device", &self.device_copy()).finish()
    }
}

impl Storage {
    /// Wrap a buffer.
    pub fn new(buf: Buffer) -> Arc<Storage> {
        Arc::new(Storage {
            buf: RwLock::new(buf),
            version: AtomicU64::new(0),
            host_current: AtomicBool::new(true),
            has_device: AtomicBool::new(false),
            device: Mutex::new(None),
        })
    }
    /// A storage whose elements are only on a device, read back when the host needs
    /// them.
    pub fn on_device(device: Arc<dyn DeviceBuffer>) -> Arc<Storage> {
        Arc::new(Storage {
            buf: RwLock::new(Buffer::Bool(Vec::new())),
            version: AtomicU64::new(0),
            host_current: AtomicBool::new(false),
            has_device: AtomicBool::new(true),
            device: Mutex::new(Some(device)),
        })
    }
    /// The device copy of the current elements, if there is one.
    pub fn device_copy(&self) -> Option<Arc<dyn DeviceBuffer>> {
        if !self.has_device.load(Ordering::Acquire) {
            return None;
        }
        self.device.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Remember `device` as a copy of the current host elements (a device backend
    /// that uploaded them whole), so a later call on that device binds it instead of
    /// uploading again; a write drops it. The caller holds a [`Storage::read`] guard
    /// from before the upload until this returns, so no write slips in between.
    /// Refused (false) when the lengths or dtypes differ or the host is not current.
    pub fn attach_device_copy(&self, device: Arc<dyn DeviceBuffer>) -> bool {
        if !self.host_current.load(Ordering::Acquire) {
            return false;
        }
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        // The read guard the caller holds makes this read safe to take again.
        let (dtype, len) = match self.buf.try_read() {
            Ok(b) => (b.dtype(), b.len()),
            Err(_) => return false,
        };
        if device.dtype() != dtype || device.len() != len {
            return false;
        }
        *d = Some(device);
        self.has_device.store(true, Ordering::Release);
        true
    }
    /// Whether the host holds the current elements (false: only a device does).
    pub fn on_host(&self) -> bool {
        self.host_current.load(Ordering::Acquire)
    }
    /// Make the host hold the current elements, reading the device copy back if only
    /// the device has them; an error when that fails (the device was lost).
    pub fn sync_host(&self) -> std::result::Result<(), String> {
        if self.host_current.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut buf = self.buf.write().unwrap_or_else(|e| e.into_inner());
        if self.host_current.load(Ordering::Acquire) {
            return Ok(());
        }
        let dev = self.device.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let dev = dev.ok_or_else(|| "a device storage lost its device copy (a bug in aotgrad)".to_string())?;
        let host = dev.read_back()?;
        if host.len() != dev.len() || host.dtype() != dev.dtype() {
            return Err(format!(
                "a device buffer of {} {} elements read back as {} {} elements",
                dev.len(),
                dev.dtype(),
                host.len(),
                host.dtype()
            ));
        }
        *buf = host;
        self.host_current.store(true, Ordering::Release);
        Ok(())
    }
    /// Replace the elements with a device buffer's (same dtype and length), without
    /// reading it back: a device backend writing a whole storage. Bumps the version.
    pub fn set_device(&self, device: Arc<dyn DeviceBuffer>) -> std::result::Result<(), String> {
        let mut buf = self.buf.write().unwrap_or_else(|e| e.into_inner());
        let (dtype, len) = if self.host_current.load(Ordering::Acquire) {
            (buf.dtype(), buf.len())
        } else {
            let d = self.device.lock().unwrap_or_else(|e| e.into_inner());
            d.as_ref().map_or((buf.dtype(), buf.len()), |d| (d.dtype(), d.len()))
        };
        if device.dtype() != dtype || device.len() != len {
            return Err(format!(
                "a device buffer of {} {} elements cannot replace a storage of {len} {dtype} elements",
                device.len(),
                device.dtype()
            ));
        }
        self.version.fetch_add(1, Ordering::Relaxed);
        *self.device.lock().unwrap_or_else(|e| e.into_inner()) = Some(device);
        self.has_device.store(true, Ordering::Release);
        self.host_current.store(false, Ordering::Release);
        // The host copy is stale: free it (a read brings the elements back).
        *buf = Buffer::Bool(Vec::new());
        Ok(())
    }
    fn host_or_panic(&self) {
        if let Err(e) = self.sync_host() {
            panic!("reading a device tensor back to the host failed: {e}");
        }
    }
    /// The buffer, taking the storage apart.
    pub fn into_buffer(mut self) -> Buffer {
        self.host_or_panic();
        let slot = self.buf.get_mut().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(slot, Buffer::Bool(Vec::new()))
    }
    /// Read access (reading a device copy back first, if only a device holds the
    /// elements; that panics if the device fails — [`Storage::sync_host`] first to
    /// get an error instead).
    pub fn read(&self) -> RwLockReadGuard<'_, Buffer> {
        loop {
            self.host_or_panic();
            let guard = self.buf.read().unwrap_or_else(|e| e.into_inner());
            if self.host_current.load(Ordering::Acquire) {
                return guard;
            }
        }
    }
    /// Write access; bumps the version counter and drops a device copy (as
    /// [`Storage::read`], the elements come back from the device first).
    pub fn write(&self) -> RwLockWriteGuard<'_, Buffer> {
        let guard = self.write_unversioned();
        self.version.fetch_add(1, Ordering::Relaxed);
        guard
    }
    /// [`Storage::write`] without the version bump, for a write whose owner counts
    /// it: a compiled graph storing a mutated input's new value in place (the
    /// runtime's epilogue counts the mutation once, as for a value it copies back).
    pub fn write_unversioned(&self) -> RwLockWriteGuard<'_, Buffer> {
        let guard = loop {
            self.host_or_panic();
            let guard = self.buf.write().unwrap_or_else(|e| e.into_inner());
            // A device write between the two steps would leave the host stale again.
            if self.host_current.load(Ordering::Acquire) {
                break guard;
            }
        };
        if self.has_device.load(Ordering::Acquire) {
            *self.device.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.has_device.store(false, Ordering::Release);
        }
        guard
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
        match self.device_only() {
            Some(d) => d.dtype(),
            None => self.buf.read().unwrap_or_else(|e| e.into_inner()).dtype(),
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.device_only() {
            Some(d) => d.len(),
            None => self.buf.read().unwrap_or_else(|e| e.into_inner()).len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The device copy when only the device holds the elements.
    fn device_only(&self) -> Option<Arc<dyn DeviceBuffer>> {
        if self.host_current.load(Ordering::Acquire) {
            return None;
        }
        self.device_copy()
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

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
    pub fn into_buffer(self) -> Buffer {
        self.buf.into_inner().unwrap_or_else(|e| e.into_inner())
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

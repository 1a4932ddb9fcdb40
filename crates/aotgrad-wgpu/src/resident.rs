//! Residency: the device buffers a compiled graph keeps and hands out, and what
//! crosses between host and device.
//!
//! A call's slots come from the instance's pool (allocated on its first call, given
//! back after it) and its outputs are fresh buffers that become the results'
//! storages ([`GpuBuffer`], read back only when the host needs the elements). Host
//! buffers are uploaded in the device's element layout (4 bytes per element, 2 for
//! f16, padded to a multiple of 4; i64 held as i32) and read back through staging
//! buffers in one submission; every upload and readback is counted.

use crate::device::{gpu, Gpu};
use crate::wgsl::elem_type;
use crate::WgpuError;
use aotgrad_cpu::{Buffer as HostBuffer, CpuTensor};
use aotgrad_fusion::SlotPlan;
use aotgrad_ir::DType;
use std::sync::Mutex;

/// Device buffers one call uses: the slots (kept for the next call of the same
/// instance) and the outputs (new every call: they become the results' storages).
pub(crate) struct Arena {
    pub(crate) slots: Vec<wgpu::Buffer>,
    pub(crate) outs: Vec<wgpu::Buffer>,
}

/// Slot buffers of earlier calls of one instance, for reuse.
#[derive(Default)]
pub(crate) struct SlotPool(Mutex<Vec<Vec<wgpu::Buffer>>>);

impl Arena {
    /// The buffers of one call: slots from `pool` (new ones for `slots` when the pool
    /// is empty) and new output buffers, per output (plan buffer, dtype, elements).
    pub(crate) fn take(
        gpu: &Gpu,
        pool: &SlotPool,
        slots: &SlotPlan,
        out_bufs: &[(usize, DType, u64)],
    ) -> Result<Arena, WgpuError> {
        let pooled = pool.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let slots = match pooled {
            Some(s) => s,
            None => slots
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| create_buffer(gpu, &format!("slot {i}"), bytes_of(s.dtype, s.elems as u64), STORAGE))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let outs = out_bufs
            .iter()
            .map(|(b, d, n)| create_buffer(gpu, &format!("output b{b}"), bytes_of(*d, *n), STORAGE))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arena { slots, outs })
    }

    /// Give the slots back to `pool` for the next call (the outputs went to results).
    pub(crate) fn recycle(self, pool: &SlotPool) {
        pool.0.lock().unwrap_or_else(|e| e.into_inner()).push(self.slots);
    }
}

/// A result's elements in a device buffer: the storage of a tensor the backend
/// returns, read back only when the host needs it, and bound directly when a later
/// call reads it.
#[derive(Debug)]
pub(crate) struct GpuBuffer {
    buf: wgpu::Buffer,
    dtype: DType,
    len: usize,
}

impl GpuBuffer {
    /// `len` elements of `dtype` in `buf`.
    pub(crate) fn new(buf: wgpu::Buffer, dtype: DType, len: usize) -> GpuBuffer {
        GpuBuffer { buf, dtype, len }
    }
}

impl aotgrad_cpu::DeviceBuffer for GpuBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn read_back(&self) -> Result<HostBuffer, String> {
        let gpu = gpu().map_err(|e| e.to_string())?;
        gpu.check_health().map_err(|e| e.to_string())?;
        let encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        let mut v = read_back(gpu, encoder, &[(&self.buf, self.dtype, self.len as u64)]).map_err(|e| e.to_string())?;
        v.pop().ok_or_else(|| "no buffer came back".to_string())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The device buffer holding `t`'s storage, when it is one of ours of the right
/// dtype and at least `need` elements.
pub(crate) fn resident_buffer(t: &CpuTensor, need: u64) -> Option<wgpu::Buffer> {
    let dev = t.storage.device_copy()?;
    let g = dev.as_any().downcast_ref::<GpuBuffer>()?;
    (g.dtype == t.meta.dtype && g.len as u64 >= need).then(|| g.buf.clone())
}

/// Bytes of a device element: f16 is 2, every other device type 4 (bool as u32).
fn elem_bytes(dtype: DType) -> u64 {
    if dtype == DType::F16 {
        2
    } else {
        4
    }
}

/// Bytes of a device buffer of `elems` elements: a multiple of 4 (what copies and
/// writes need), never empty (bindings must not be).
pub(crate) fn bytes_of(dtype: DType, elems: u64) -> u64 {
    (elems * elem_bytes(dtype)).next_multiple_of(4).max(4)
}

/// A buffer of `bytes` bytes, refused when beyond the adapter's limits; running out
/// of device memory is an error, not a panic.
pub(crate) fn create_buffer(
    gpu: &Gpu,
    label: &str,
    bytes: u64,
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer, WgpuError> {
    let s = &gpu.summary;
    if bytes > s.max_buffer_bytes || (usage.contains(wgpu::BufferUsages::STORAGE) && bytes > s.max_binding_bytes) {
        return Err(WgpuError::Limit {
            what: label.to_string(),
            reason: format!(
                "a buffer of {bytes} bytes exceeds the adapter's largest buffer ({} bytes) or storage binding ({} bytes)",
                s.max_buffer_bytes, s.max_binding_bytes
            ),
        });
    }
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage,
        mapped_at_creation: false,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(WgpuError::Device(format!("out of device memory allocating {bytes} bytes for {label}: {e}")));
    }
    Ok(buf)
}

/// Usage of slot, output and upload buffers: bound as storage, copied both ways.
pub(crate) const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// Upload the first `elems` elements of `host` into a new device buffer (labelled
/// with the plan buffer `b`; `what` names the kernel in errors).
pub(crate) fn upload(
    gpu: &Gpu,
    b: usize,
    host: &HostBuffer,
    elems: usize,
    what: &str,
) -> Result<wgpu::Buffer, WgpuError> {
    let bytes = to_device_bytes(host, elems, what)?;
    let buf = create_buffer(gpu, &format!("upload b{b}"), (bytes.len() as u64).max(4), STORAGE)?;
    gpu.queue.write_buffer(&buf, 0, &bytes);
    gpu.counters.upload(bytes.len() as u64);
    Ok(buf)
}

/// Host buffer → device bytes (4 per element, 2 for f16; padded to a multiple of 4).
fn to_device_bytes(buf: &HostBuffer, elems: usize, what: &str) -> Result<Vec<u8>, WgpuError> {
    elem_type(buf.dtype(), what)?;
    let mut out = Vec::with_capacity(bytes_of(buf.dtype(), elems as u64) as usize);
    match buf {
        HostBuffer::F16(v) => {
            v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes()));
            out.resize(out.len().next_multiple_of(4), 0);
        }
        HostBuffer::F32(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        HostBuffer::Bool(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&(*x as u32).to_le_bytes())),
        HostBuffer::I32(v) => v[..elems].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        // i64 lives on the device as i32: every value must fit.
        HostBuffer::I64(v) => {
            for (k, x) in v[..elems].iter().enumerate() {
                let w = i32::try_from(*x).map_err(|_| WgpuError::Unsupported {
                    what: what.to_string(),
                    reason: format!(
                        "the i64 value {x} (element {k} of an operand) is beyond i32: the wgpu backend holds i64 \
                         values as i32 on the device (use the CPU backend for larger integers)"
                    ),
                })?;
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        other => return Err(WgpuError::Internal(format!("upload of {}", other.dtype()))),
    }
    Ok(out)
}

fn from_device_bytes(dtype: DType, bytes: &[u8], elems: usize) -> Result<HostBuffer, WgpuError> {
    if dtype == DType::F16 {
        let halves = bytes.chunks_exact(2).take(elems).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])));
        return Ok(HostBuffer::F16(halves.collect()));
    }
    let words = bytes.chunks_exact(4).take(elems).map(|c| [c[0], c[1], c[2], c[3]]);
    Ok(match dtype {
        DType::F32 => HostBuffer::F32(words.map(f32::from_le_bytes).collect()),
        DType::Bool => HostBuffer::Bool(words.map(|w| u32::from_le_bytes(w) != 0).collect()),
        DType::I32 => HostBuffer::I32(words.map(i32::from_le_bytes).collect()),
        DType::I64 => HostBuffer::I64(words.map(|w| i32::from_le_bytes(w) as i64).collect()),
        d => return Err(WgpuError::Internal(format!("readback of {d}"))),
    })
}

/// Read device buffers back (one submission for all of them): the encoder so far,
/// copies into staging buffers, then one wait.
pub(crate) fn read_back(
    gpu: &Gpu,
    mut encoder: wgpu::CommandEncoder,
    bufs: &[(&wgpu::Buffer, DType, u64)],
) -> Result<Vec<HostBuffer>, WgpuError> {
    let mut staging = Vec::with_capacity(bufs.len());
    for (i, (b, dtype, n)) in bufs.iter().enumerate() {
        if *n == 0 {
            staging.push(None);
            continue;
        }
        let bytes = bytes_of(*dtype, *n);
        let s = create_buffer(
            gpu,
            &format!("readback {i}"),
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        encoder.copy_buffer_to_buffer(b, 0, &s, 0, bytes);
        staging.push(Some(s));
    }
    gpu.queue.submit([encoder.finish()]);
    gpu.counters.submit();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, s) in staging.iter().enumerate() {
        if let Some(s) = s {
            let tx = tx.clone();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((i, r));
            });
        }
    }
    drop(tx);
    gpu.wait()?;
    for (i, r) in rx.try_iter() {
        r.map_err(|e| WgpuError::Device(format!("reading back buffer {i} failed: {e}")))?;
    }
    let mut out = Vec::with_capacity(bufs.len());
    for ((_, dtype, n), s) in bufs.iter().zip(&staging) {
        match s {
            None => out.push(from_device_bytes(*dtype, &[], 0)?),
            Some(s) => {
                let view = s
                    .get_mapped_range(..)
                    .map_err(|e| WgpuError::Device(format!("a readback buffer did not map: {e}")))?;
                out.push(from_device_bytes(*dtype, &view, *n as usize)?);
                drop(view);
                s.unmap();
                gpu.counters.readback(n * elem_bytes(*dtype));
            }
        }
    }
    Ok(out)
}

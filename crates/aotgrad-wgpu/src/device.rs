//! The adapter, device and queue every graph of the process shares, and the
//! transfer counters.

use crate::WgpuError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Environment variable naming the adapter to use (a case-insensitive substring of
/// its name, e.g. `llvmpipe` or `nvidia`).
pub const ADAPTER_ENV: &str = "AOTGRAD_WGPU_ADAPTER";

/// Environment variable that makes the backend treat the adapter as lacking
/// `SHADER_F16` (`1`): f16 kernels are then refused as on such an adapter (for tests
/// of that error, or to keep f16 graphs off the device).
pub const NO_F16_ENV: &str = "AOTGRAD_WGPU_NO_F16";

/// How the adapter was chosen, what it is, and what it can do.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H200`).
    pub name: String,
    /// Driver and its version.
    pub driver: String,
    /// Graphics API backend (`Vulkan`, `Metal`, `Dx12`).
    pub backend: String,
    /// True for a software rasterizer (lavapipe / llvmpipe, WARP, SwiftShader).
    pub software: bool,
    /// Why this adapter was picked.
    pub reason: String,
    /// Largest storage buffer a kernel may bind, in bytes.
    pub max_binding_bytes: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_bytes: u64,
    /// Storage buffers one kernel may bind.
    pub max_storage_buffers: u32,
    /// Whether kernels may hold f16 values (wgpu's `SHADER_F16`: f16 arithmetic and
    /// 16-bit storage); f16 graphs need it.
    pub shader_f16: bool,
}

/// Host↔device traffic of the process, for residency tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Buffers uploaded to the device.
    pub uploads: u64,
    /// Bytes uploaded.
    pub upload_bytes: u64,
    /// Buffers read back from the device.
    pub readbacks: u64,
    /// Bytes read back.
    pub readback_bytes: u64,
    /// Command submissions.
    pub submits: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    readbacks: AtomicU64,
    readback_bytes: AtomicU64,
    submits: AtomicU64,
}

impl Counters {
    pub(crate) fn upload(&self, bytes: u64) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.upload_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub(crate) fn readback(&self, bytes: u64) {
        self.readbacks.fetch_add(1, Ordering::Relaxed);
        self.readback_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub(crate) fn submit(&self) {
        self.submits.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> Transfers {
        Transfers {
            uploads: self.uploads.load(Ordering::Relaxed),
            upload_bytes: self.upload_bytes.load(Ordering::Relaxed),
            readbacks: self.readbacks.load(Ordering::Relaxed),
            readback_bytes: self.readback_bytes.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
        }
    }
}

/// The shared device.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    pub counters: Counters,
    /// Errors the device reported outside an error scope.
    pub uncaptured: Arc<Mutex<Vec<String>>>,
    /// Set when the device is lost.
    pub lost: Arc<Mutex<Option<String>>>,
    /// Longest a submission may take before the call fails.
    pub timeout: Duration,
}

impl Gpu {
    /// Fail when the device was lost or reported an error outside a scope.
    pub(crate) fn check_health(&self) -> Result<(), WgpuError> {
        if let Some(why) = self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(WgpuError::Device(format!("the device was lost: {why}")));
        }
        let mut errs = self.uncaptured.lock().unwrap_or_else(|e| e.into_inner());
        if !errs.is_empty() {
            let all = std::mem::take(&mut *errs).join("; ");
            return Err(WgpuError::Device(format!("the device reported: {all}")));
        }
        Ok(())
    }
    /// Block until submitted work is done (bounded by the timeout).
    pub(crate) fn wait(&self) -> Result<(), WgpuError> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(self.timeout) })
            .map_err(|e| WgpuError::Device(format!("waiting for the device failed: {e}")))?;
        self.check_health()
    }
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu || {
        let n = info.name.to_lowercase();
        n.contains("llvmpipe") || n.contains("lavapipe") || n.contains("swiftshader") || n.contains("warp")
    }
}

fn open() -> Result<Gpu, String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    if adapters.is_empty() {
        return Err("no GPU adapter was found (no Vulkan, Metal or DirectX 12 driver answered). On Debian, \
                    `apt-get install mesa-vulkan-drivers` provides lavapipe, a software Vulkan driver"
            .into());
    }
    let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(|a| a.get_info()).collect();
    let rank = |i: &wgpu::AdapterInfo| match i.device_type {
        _ if is_software(i) => 4,
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        _ => 3,
    };
    let wanted = std::env::var(ADAPTER_ENV).ok().filter(|s| !s.is_empty());
    let (index, reason) = match &wanted {
        Some(w) => {
            let w = w.to_lowercase();
            let i = infos.iter().position(|i| i.name.to_lowercase().contains(&w)).ok_or_else(|| {
                let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
                format!("{ADAPTER_ENV}={w:?} matches none of the adapters found: {names:?}")
            })?;
            (i, format!("{ADAPTER_ENV} asked for it"))
        }
        None => {
            let i = (0..infos.len()).min_by_key(|&i| rank(&infos[i])).unwrap_or(0);
            let reason = if is_software(&infos[i]) {
                "no hardware adapter was found; this is the software driver".to_string()
            } else {
                format!("the best hardware adapter of {} found", infos.len())
            };
            (i, reason)
        }
    };
    let adapter = &adapters[index];
    let info = &infos[index];
    let limits = adapter.limits();
    let f16_off = std::env::var(NO_F16_ENV).is_ok_and(|v| v == "1");
    let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16) && !f16_off;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("aotgrad"),
        required_features: if shader_f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() },
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| format!("the adapter {} refused a device: {e}", info.name))?;
    let uncaptured = Arc::new(Mutex::new(Vec::new()));
    let sink = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        sink.lock().unwrap_or_else(|p| p.into_inner()).push(e.to_string());
    }));
    let lost = Arc::new(Mutex::new(None));
    let lost_sink = lost.clone();
    device.set_device_lost_callback(move |reason, msg| {
        if reason != wgpu::DeviceLostReason::Destroyed {
            *lost_sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{reason:?}: {msg}"));
        }
    });
    let summary = AdapterSummary {
        name: info.name.clone(),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        backend: format!("{:?}", info.backend),
        software: is_software(info),
        reason,
        max_binding_bytes: limits.max_storage_buffer_binding_size as u64,
        max_buffer_bytes: limits.max_buffer_size,
        max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
        shader_f16,
    };
    tracing::info!(adapter = %summary.name, backend = %summary.backend, reason = %summary.reason, "wgpu adapter");
    let timeout = std::env::var("AOTGRAD_WGPU_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    Ok(Gpu { device, queue, summary, counters: Counters::default(), uncaptured, lost, timeout })
}

/// The shared device, opened on first use.
pub(crate) fn gpu() -> Result<&'static Gpu, WgpuError> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(open).as_ref().map_err(|e| WgpuError::NoAdapter(e.clone()))
}

/// The adapter this process uses (opening it on first use), or why there is none.
pub fn adapter() -> Result<AdapterSummary, WgpuError> {
    gpu().map(|g| g.summary.clone())
}

/// Lose the device on purpose (it is destroyed), as a driver reset or an unplugged
/// GPU would: for tests of what every later call and readback reports. The process
/// has no device afterwards.
#[doc(hidden)]
pub fn lose_device_for_tests() {
    if let Ok(g) = gpu() {
        *g.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some("destroyed by lose_device_for_tests".into());
        g.device.destroy();
    }
}

/// Host↔device traffic so far (every graph of the process).
pub fn transfers() -> Transfers {
    gpu().map(|g| g.counters.snapshot()).unwrap_or_default()
}

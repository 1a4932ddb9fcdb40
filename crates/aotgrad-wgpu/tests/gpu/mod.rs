//! The adapter check every GPU test starts with.
#![allow(dead_code)]

/// The adapter, or `None` when `AOTGRAD_SKIP_GPU_TESTS=1` asks to skip GPU tests
/// and there is none. Without that variable a missing adapter fails the test with
/// what to install.
pub fn adapter_or_skip() -> Option<aotgrad_wgpu::AdapterSummary> {
    match aotgrad_wgpu::adapter() {
        Ok(a) => Some(a),
        Err(e) => {
            let skip = std::env::var(aotgrad_wgpu::SKIP_GPU_TESTS_ENV).is_ok_and(|v| v == "1");
            if skip {
                eprintln!("skipping a GPU test ({}=1): {e}", aotgrad_wgpu::SKIP_GPU_TESTS_ENV);
                return None;
            }
            panic!(
                "{e}\nGPU tests need a wgpu adapter: install a Vulkan driver (Debian: `apt-get install \
                 mesa-vulkan-drivers` for lavapipe, the software driver), or set {}=1 to skip them",
                aotgrad_wgpu::SKIP_GPU_TESTS_ENV
            );
        }
    }
}

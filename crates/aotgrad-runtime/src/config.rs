//! Configuration of compiled functions.

pub use aotgrad_cache::Cache;
use aotgrad_cpu::{CpuBackend, CpuTensor};
use aotgrad_ir::Backend;
use aotgrad_trace::DecompTable;
use std::fmt;
use std::sync::Arc;

/// How `aot_function` traces and compiles. Start from `AotConfig::default()` and
/// change what you need, with the builder methods or the public fields.
///
/// ```
/// use aotgrad::prelude::*;
/// use aotgrad::runtime::Partitioner;
///
/// let config = AotConfig {
///     name: "mlp_step".into(),
///     dynamic: vec![(0, 0)], // argument 0's dim 0 (the batch) is a symbol
///     partitioner: Partitioner::MinCut { activation_memory_budget: 1.0 },
///     arg_names: vec!["x".into(), "w".into()],
///     ..AotConfig::default()
/// }
/// .threads(1)
/// .no_cache();
/// let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].matmul(&a[1])?.tanh()?]), config)?;
/// let w = Tensor::ones(&[4, 3], DType::F32)?;
/// for batch in [2, 5, 9] {
///     let x = Tensor::ones(&[batch, 4], DType::F32)?;
///     assert_eq!(f.call(&[x, w.clone()])?[0].sizes()?, vec![batch, 3]);
/// }
/// assert_eq!(f.num_compiled(), 1); // one entry serves every batch size of 2 or more
/// # Ok::<(), aotgrad::Error>(())
/// ```
#[derive(Clone)]
pub struct AotConfig {
    /// A name for messages and logs.
    pub name: String,
    /// Keep data mutations of inputs inside the inference graph as trailing `copy_`s
    /// (instead of returning the new values and copying them back in the epilogue).
    pub keep_inference_input_mutations: bool,
    /// `(argument index, dim)` pairs traced as symbols (dynamic shapes); everything
    /// else is specialized, and a call with other metadata recompiles. For
    /// [`crate::aot_module`] the index counts the module's inputs (what `forward` is
    /// called with), not the lifted parameters and buffers.
    pub dynamic: Vec<(usize, usize)>,
    /// Duck sizing: dynamic dims with equal sizes share one symbol.
    pub duck_shape: bool,
    /// Which composite ops to decompose.
    pub decomps: DecompTable,
    /// The compiler for the graphs: by default the compiled CPU backend on every
    /// core ([`aotgrad_cpu::CpuBackend`]) — or, when aotgrad is built with the `wgpu`
    /// feature and a hardware GPU adapter exists, the wgpu backend (see
    /// [`default_backend`]); [`aotgrad_cpu::ReferenceBackend`] runs graphs on the
    /// reference interpreter (the oracle). See [`AotConfig::threads`].
    pub backend: Arc<dyn Backend<CpuTensor>>,
    /// How the training path splits the joint graph.
    pub partitioner: Partitioner,
    /// Simplify the joint graph with the e-graph pass before partitioning.
    pub simplify: bool,
    /// Names of the arguments in printed graphs, by argument position (missing ones
    /// are `arg0`, `arg1`, ...). Only for reading graphs: it changes nothing else.
    pub arg_names: Vec<String>,
    /// The compiled-result cache. By default the environment decides
    /// ([`Cache::from_env`]: a disk cache when `AOTGRAD_CACHE_DIR` or
    /// `AOTGRAD_REDIS_URL` is set, with a Redis tier under it for the latter when
    /// `AOTGRAD_CACHE_KEY` signs it; none when `AOTGRAD_CACHE=0`); set it
    /// with [`AotConfig::cache`] or turn it off with [`AotConfig::no_cache`].
    pub cache: Option<Arc<Cache>>,
}

impl Default for AotConfig {
    fn default() -> Self {
        AotConfig {
            name: "aot_fn".into(),
            keep_inference_input_mutations: false,
            dynamic: Vec::new(),
            duck_shape: true,
            decomps: DecompTable::default(),
            backend: default_backend().0,
            partitioner: Partitioner::default(),
            simplify: true,
            arg_names: Vec::new(),
            cache: env_cache(),
        }
    }
}

/// The default backend and why it was chosen (decided once per process, and logged):
/// with the `wgpu` feature, the wgpu backend when a hardware adapter exists (a
/// software driver such as lavapipe does not count: it is slower than the CPU
/// backend); otherwise the compiled CPU backend on every core.
pub fn default_backend() -> (Arc<dyn Backend<CpuTensor>>, String) {
    static CHOICE: std::sync::OnceLock<(Arc<dyn Backend<CpuTensor>>, String)> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| {
            let (backend, why) = choose_backend();
            tracing::info!(target: "aotgrad", backend = backend.name(), "default backend: {why}");
            (backend, why)
        })
        .clone()
}

/// Environment variable that forces the default backend: `cpu` (the compiled CPU
/// backend) or `wgpu` (the wgpu backend on whatever adapter it opens, a software one
/// included: how the contract tests run on lavapipe). Anything else is ignored with a
/// warning.
pub const BACKEND_ENV: &str = "AOTGRAD_BACKEND";

fn choose_backend() -> (Arc<dyn Backend<CpuTensor>>, String) {
    match std::env::var(BACKEND_ENV).ok().as_deref().map(str::trim) {
        None | Some("") => choose_default_backend(),
        Some("cpu") => (Arc::new(CpuBackend::default()), format!("compiled CPU: {BACKEND_ENV}=cpu")),
        Some("wgpu") => forced_wgpu(),
        Some(other) => {
            let (b, why) = choose_default_backend();
            tracing::warn!(target: "aotgrad", "{BACKEND_ENV}={other:?} is neither `cpu` nor `wgpu`; ignored");
            (b, format!("{why} ({BACKEND_ENV}={other:?} ignored: not `cpu` or `wgpu`)"))
        }
    }
}

#[cfg(feature = "wgpu")]
fn forced_wgpu() -> (Arc<dyn Backend<CpuTensor>>, String) {
    match aotgrad_wgpu::adapter() {
        Ok(a) => (
            Arc::new(aotgrad_wgpu::WgpuBackend::new()),
            format!("wgpu on {} ({}): {BACKEND_ENV}=wgpu", a.name, a.backend),
        ),
        Err(e) => {
            tracing::warn!(target: "aotgrad", "{BACKEND_ENV}=wgpu, but {e}; using the compiled CPU backend");
            (Arc::new(CpuBackend::default()), format!("compiled CPU: {BACKEND_ENV}=wgpu, but {e}"))
        }
    }
}

#[cfg(not(feature = "wgpu"))]
fn forced_wgpu() -> (Arc<dyn Backend<CpuTensor>>, String) {
    tracing::warn!(target: "aotgrad", "{BACKEND_ENV}=wgpu, but aotgrad was built without the `wgpu` feature");
    (
        Arc::new(CpuBackend::default()),
        format!("compiled CPU: {BACKEND_ENV}=wgpu, but aotgrad was built without the `wgpu` feature"),
    )
}

#[cfg(feature = "wgpu")]
fn choose_default_backend() -> (Arc<dyn Backend<CpuTensor>>, String) {
    match aotgrad_wgpu::adapter() {
        Ok(a) if !a.software => {
            (Arc::new(aotgrad_wgpu::WgpuBackend::new()), format!("wgpu on {} ({}): {}", a.name, a.backend, a.reason))
        }
        Ok(a) => (
            Arc::new(CpuBackend::default()),
            format!("compiled CPU: the only GPU adapter, {}, is a software driver", a.name),
        ),
        Err(e) => (Arc::new(CpuBackend::default()), format!("compiled CPU: {e}")),
    }
}

#[cfg(not(feature = "wgpu"))]
fn choose_default_backend() -> (Arc<dyn Backend<CpuTensor>>, String) {
    (Arc::new(CpuBackend::default()), "compiled CPU: aotgrad was built without the `wgpu` feature".into())
}

/// The cache the environment configures, made once per process (an invalid setting
/// is reported once and leaves the cache off).
fn env_cache() -> Option<Arc<Cache>> {
    static CACHE: std::sync::OnceLock<Option<Arc<Cache>>> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(|| match Cache::from_env() {
            Ok(c) => c.map(Arc::new),
            Err(e) => {
                tracing::warn!(target: "aotgrad::cache", "result cache off: {e}");
                None
            }
        })
        .clone()
}

impl AotConfig {
    /// Use the compiled CPU backend on `threads` threads (`0`: every core; `1`: one
    /// thread, deterministic and free of any thread pool).
    pub fn threads(mut self, threads: usize) -> AotConfig {
        self.backend = Arc::new(CpuBackend::new(threads));
        self
    }
    /// Keep compiled results in `cache` (and look them up there).
    pub fn cache(mut self, cache: Arc<Cache>) -> AotConfig {
        self.cache = Some(cache);
        self
    }
    /// Compile without a result cache, whatever the environment says.
    pub fn no_cache(mut self) -> AotConfig {
        self.cache = None;
        self
    }
    /// Compile for the GPU with the wgpu backend ([`aotgrad_wgpu::WgpuBackend`]), on
    /// the adapter it picks (a hardware one, else the software driver; the
    /// `AOTGRAD_WGPU_ADAPTER` environment variable names one).
    #[cfg(feature = "wgpu")]
    pub fn wgpu(mut self) -> AotConfig {
        self.backend = Arc::new(aotgrad_wgpu::WgpuBackend::new());
        self
    }
    /// Run graphs on the reference interpreter instead of compiling them.
    pub fn reference_backend(mut self) -> AotConfig {
        self.backend = Arc::new(aotgrad_cpu::ReferenceBackend);
        self
    }
}

impl fmt::Debug for AotConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AotConfig")
            .field("name", &self.name)
            .field("keep_inference_input_mutations", &self.keep_inference_input_mutations)
            .field("dynamic", &self.dynamic)
            .field("duck_shape", &self.duck_shape)
            .field("backend", &self.backend.name())
            .field("partitioner", &self.partitioner)
            .field("simplify", &self.simplify)
            .field("cache", &self.cache)
            .finish()
    }
}

/// Which partitioner splits the joint graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Partitioner {
    /// Save every forward value the backward needs.
    Default,
    /// Min-cut rematerialization with an activation memory budget in `[0, 1]`.
    MinCut {
        /// 1 = the min-cut optimum; 0 = save as little as possible.
        activation_memory_budget: f64,
    },
}

impl Default for Partitioner {
    fn default() -> Self {
        Partitioner::MinCut { activation_memory_budget: 1.0 }
    }
}

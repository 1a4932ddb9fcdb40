//! The JIT's cache and worker: lowering gives each covered kernel a slot
//! ([`attach`]); a worker thread compiles the pending kernels in batches (one module
//! each) and fills the slots; compiled code is shared process-wide by [`Spec`] key.

use super::isa::available;
use super::kernel::assemble;
use super::spec::Spec;
use crate::compiled::code::{JitKernel, JitSlot};
use crate::compiled::kernels::{CKernel, CPointwise, CReduce, CStage};
use aotgrad_ir::DType;
use std::sync::{Arc, OnceLock};

/// Compile every pointwise kernel of `kernels` (standalone, matmul epilogues, row
/// group stages) the JIT covers, into one module; `dtypes[b]` is buffer `b`'s dtype.
/// Kernels it does not cover keep running on the interpreter. A failure to assemble
/// or map code is logged and leaves every kernel on the interpreter.
pub(crate) fn attach(kernels: &mut [CKernel], dtypes: &[DType]) {
    if !available() {
        return;
    }
    // Kernels with the same body, operand count and inner strides have the same code
    // (addresses and outer strides are arguments): each is compiled once per process.
    // A kernel already compiled gets its code now; the others get an empty slot the
    // JIT worker fills, running on the interpreter until then. A spec borrows its
    // kernel's body; only the ones compiled now are copied.
    let mut jobs: Vec<Job> = Vec::new();
    {
        let cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        // One key buffer for every lookup; only a miss keeps a copy.
        let mut key = Vec::new();
        let mut resolve = |spec: Result<Spec<'_>, &'static str>| -> Option<JitSlot> {
            let spec = spec.ok()?;
            spec.key_into(&mut key);
            if let Some(done) = cache.get(key.as_slice()) {
                return Some(done.clone());
            }
            let slot: JitSlot = Arc::new(OnceLock::new());
            jobs.push(Job { key: key.clone(), spec: spec.into_owned(), slot: slot.clone() });
            Some(slot)
        };
        type Resolve<'r> = dyn FnMut(Result<Spec<'_>, &'static str>) -> Option<JitSlot> + 'r;
        let pw = |resolve: &mut Resolve<'_>, p: &mut CPointwise| {
            if let Some(slot) = resolve(Spec::pointwise(p, dtypes)) {
                p.jit = Some(slot);
            }
        };
        let rd = |resolve: &mut Resolve<'_>, r: &mut CReduce| {
            if let Some(slot) = resolve(Spec::reduce(r, dtypes)) {
                r.jit = Some(slot);
            }
        };
        for k in kernels.iter_mut() {
            match k {
                CKernel::Pointwise(p) => pw(&mut resolve, p),
                CKernel::Matmul(m) => {
                    if let Some(e) = &mut m.epilogue {
                        pw(&mut resolve, e);
                    }
                }
                CKernel::Rows(g) => {
                    for st in &mut g.stages {
                        match st {
                            CStage::Elem(p) | CStage::Row(p) => pw(&mut resolve, p),
                            CStage::Reduce { k, .. } => rd(&mut resolve, k),
                        }
                    }
                }
                CKernel::Reduce(r) => rd(&mut resolve, r),
                CKernel::Extern(_) => {}
            }
        }
    }
    if !jobs.is_empty() {
        submit(jobs);
    }
}

/// A kernel to compile, and the slot its code goes to.
pub(super) struct Job {
    key: Vec<u64>,
    spec: Spec<'static>,
    slot: JitSlot,
}

/// Jobs submitted to the worker and not yet compiled.
pub(super) static PENDING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Wait up to `timeout` until the JIT worker has compiled every kernel submitted so
/// far; whether it has.
pub(crate) fn wait_idle(timeout: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while PENDING.load(std::sync::atomic::Ordering::Acquire) > 0 {
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    true
}

/// Hand `jobs` to the JIT worker thread (started on first use); without one, compile
/// them here.
pub(super) fn submit(jobs: Vec<Job>) {
    PENDING.fetch_add(jobs.len(), std::sync::atomic::Ordering::AcqRel);
    static WORKER: OnceLock<Option<std::sync::Mutex<std::sync::mpsc::Sender<Vec<Job>>>>> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Job>>();
        let spawned = std::thread::Builder::new().name("aotgrad-jit".into()).spawn(move || {
            while let Ok(mut batch) = rx.recv() {
                // Everything queued meanwhile goes into the same module.
                while let Ok(more) = rx.try_recv() {
                    batch.extend(more);
                }
                compile_jobs(batch);
            }
        });
        match spawned {
            Ok(_) => Some(std::sync::Mutex::new(tx)),
            Err(e) => {
                tracing::warn!(error = %e, "no JIT worker thread; kernels are compiled when planned");
                None
            }
        }
    });
    match worker {
        Some(tx) => {
            if let Err(e) = tx.lock().unwrap_or_else(|e| e.into_inner()).send(jobs) {
                compile_jobs(e.0);
            }
        }
        None => compile_jobs(jobs),
    }
}

/// Compile `jobs` (one code per distinct key, reusing the cache) and fill their slots.
pub(super) fn compile_jobs(jobs: Vec<Job>) {
    let n = jobs.len();
    compile_batch(jobs);
    PENDING.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
}

pub(super) fn compile_batch(jobs: Vec<Job>) {
    let t0 = std::time::Instant::now();
    let cache = || CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let mut fresh: Vec<usize> = Vec::new();
    {
        let cache = cache();
        for (i, j) in jobs.iter().enumerate() {
            if let Some(k) = cache.get(&j.key).and_then(|done| done.get()) {
                let _ = j.slot.set(k.clone());
            } else if !fresh.iter().any(|&f| jobs[f].key == j.key) {
                fresh.push(i);
            }
        }
    }
    if fresh.is_empty() {
        return;
    }
    // Assembled without holding the cache (plans being lowered look into it).
    let kernels: Vec<&Spec> = fresh.iter().map(|&i| &jobs[i].spec).collect();
    match assemble(&kernels) {
        Ok((module, entries)) => {
            let module = Arc::new(module);
            let mut cache = cache();
            for (&f, entry) in fresh.iter().zip(entries) {
                let k = JitKernel::new(module.clone(), entry);
                for j in jobs.iter().filter(|j| j.key == jobs[f].key) {
                    let _ = j.slot.set(k.clone());
                }
                if cache.len() < CACHE_CAP {
                    cache.insert(jobs[f].key.clone(), Arc::new(OnceLock::from(k)));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "JIT compilation failed; the kernels run on the interpreter"),
    }
    tracing::trace!(kernels = fresh.len(), ms = t0.elapsed().as_secs_f64() * 1e3, "jit compile");
}

/// Compiled kernels by [`Spec::key`], shared by every plan of the process: filled
/// slots, which kernels with the same key share. Keys are hashed with FxHash (short
/// integer vectors made by this process, looked up once per kernel when a plan is
/// lowered).
pub(super) static CACHE: OnceLock<std::sync::Mutex<rustc_hash::FxHashMap<Vec<u64>, JitSlot>>> = OnceLock::new();
/// Most kernels the process-wide cache keeps (their code stays mapped).
pub(super) const CACHE_CAP: usize = 4096;

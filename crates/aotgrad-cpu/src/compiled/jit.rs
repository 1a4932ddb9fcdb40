//! A JIT for fused pointwise bodies: each lowered [`CPointwise`] whose body it covers
//! becomes AVX-512 machine code (assembled with `iced-x86`, mapped executable with
//! `memmap2`) that keeps every value of the body in a vector register and touches
//! memory only for its loads and stores, 16 f32 lanes at a time.
//!
//! Why: the block interpreter ([`super::exec`]) loads and stores every instruction's
//! operands through L1, a few cycles per vector and instruction; on the bench machine
//! an 8-op chain ran at 19 GB/s interpreted and 72–77 GB/s compiled here, next to a
//! copy's 80–110 GB/s. Everything else (f64 bodies, loads or stores of other dtypes,
//! strided stores, `sin`/`cos`/`log`/general `pow`, machines without AVX-512) stays
//! on the interpreter, which is also the reference the tests hold this code to:
//! every instruction is emitted as the same IEEE operations in the same order as
//! [`super::math`] computes them (no fused multiply-adds), so the results are equal
//! bit for bit except for the payload of NaNs.
//!
//! A compiled kernel runs one *tile*: `rows` runs of `len` elements of the kernel's
//! innermost dim. Its signature (System V) is
//! `fn(ptrs: *const *mut u8, outer: *const isize, rows: usize, len: usize)`:
//! `ptrs[a]` is the address of access `a`'s first element (loads, then stores),
//! `outer[a]` the byte step from one run to the next. The inner strides (0, 1, or a
//! gather stride for loads) are constants of the code, as the lowering fixed them.
//!
//! Compilation is tiered: lowering a plan gives each covered kernel a slot that a
//! worker thread (`aotgrad-jit`) fills with its code, so compiling a graph does not
//! wait for code generation and its first calls run on the interpreter (whose results
//! are the same). Kernels with the same body and inner strides share one code
//! process-wide (a cache keyed by [`code_key`]); the kernels compiled together share
//! one executable mapping, which lives as long as any of them.

use super::exec::CPU_JIT_BLOCK;
use super::lower::{CAccess, CBody, CKernel, CPointwise, CReduce, CStage, LInstr, Src};
use aotgrad_fusion::Compute;
use aotgrad_ir::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use iced_x86::code_asm::*;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The entry point of a compiled kernel (see the module docs).
pub(crate) type Entry = unsafe extern "sysv64" fn(*const *mut u8, *const isize, usize, usize);

/// Executable code of one lowered plan's kernels.
struct Module {
    _map: memmap2::Mmap,
}

/// A compiled kernel.
#[derive(Clone)]
pub(crate) struct JitKernel {
    _module: Arc<Module>,
    pub(crate) entry: Entry,
}

impl std::fmt::Debug for JitKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JitKernel")
    }
}

/// Most accesses (loads plus stores) a compiled kernel takes; 9 live in registers.
const MAX_ACCESSES: usize = 16;
/// Vector registers the body may use; the rest are scratch for sequences.
const MAX_VALUES: usize = 24;

/// Whether this process runs compiled kernels: x86-64 with AVX-512 (F, VL, DQ, BW),
/// unless `AOTGRAD_JIT=0`.
pub(crate) fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let off = std::env::var("AOTGRAD_JIT").is_ok_and(|v| v == "0");
        !off && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("bmi2")
    })
}

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

/// What a kernel's code depends on (not its buffers, offsets or outer strides, which
/// are arguments): its body, the loads' inner strides, the stored registers, and for a
/// reduction the op, the reduced register and its accumulator's inner stride.
#[derive(Clone, Debug)]
pub(crate) struct Spec<'a> {
    inner_len: usize,
    body: std::borrow::Cow<'a, CBody>,
    load_inner: smallvec::SmallVec<[usize; 8]>,
    stores: smallvec::SmallVec<[usize; 4]>,
    reduce: Option<(ReduceOp, usize, usize)>,
}

impl<'a> Spec<'a> {
    fn into_owned(self) -> Spec<'static> {
        Spec { body: std::borrow::Cow::Owned(self.body.into_owned()), ..self }
    }

    fn pointwise(p: &'a CPointwise, dtypes: &[DType]) -> Result<Spec<'a>, &'static str> {
        let rank = p.shape.len();
        let inner = |a: &CAccess| a.strides[rank - 1];
        if p.stores.iter().any(|(_, a)| inner(a) != 1) {
            return Err("a strided store");
        }
        if p.stores.iter().any(|(_, a)| dtypes.get(a.buf) != Some(&DType::F32)) {
            return Err("a store of another dtype");
        }
        let spec = Spec {
            inner_len: p.shape[rank - 1],
            body: std::borrow::Cow::Borrowed(&p.body),
            load_inner: p.body.loads.iter().map(inner).collect(),
            stores: p.stores.iter().map(|(r, _)| *r).collect(),
            reduce: None,
        };
        spec.check(dtypes)?;
        Ok(spec)
    }

    fn reduce(r: &'a CReduce, dtypes: &[DType]) -> Result<Spec<'a>, &'static str> {
        let rank = r.shape.len();
        let dst_inner = r.dst.strides[rank - 1];
        let inner_reduced = r.reduced[rank - 1];
        if !((inner_reduced && dst_inner == 0) || (!inner_reduced && dst_inner == 1)) {
            return Err("a reduction whose accumulators are strided");
        }
        if r.body.nregs > MAX_VALUES - 4 {
            return Err("too many live values for a reduction");
        }
        let spec = Spec {
            inner_len: r.shape[rank - 1],
            body: std::borrow::Cow::Borrowed(&r.body),
            load_inner: r.body.loads.iter().map(|a| a.strides[rank - 1]).collect(),
            stores: smallvec::SmallVec::new(),
            reduce: Some((r.op, r.value, dst_inner)),
        };
        spec.check(dtypes)?;
        Ok(spec)
    }

    /// Accesses the code takes: loads, then stores or the accumulator.
    fn accesses(&self) -> usize {
        self.body.loads.len() + self.stores.len() + usize::from(self.reduce.is_some())
    }

    /// Everything the generated code depends on, as words.
    fn key_into(&self, k: &mut Vec<u64>) {
        let p = self;
        k.clear();
        k.reserve(6 + p.load_inner.len() + p.stores.len() + 5 * p.body.instrs.len());
        k.extend([p.body.loads.len() as u64, p.stores.len() as u64]);
        k.extend(p.load_inner.iter().map(|s| *s as u64));
        k.extend(p.stores.iter().map(|r| *r as u64));
        match p.reduce {
            Some((op, v, s)) => k.extend([1 + op as u64, v as u64, s as u64]),
            None => k.push(0),
        }
        let src = |s: &Src| match s {
            Src::Reg(r) => *r as u64,
            Src::Const(c) => (1 << 63) ^ c.to_bits().rotate_left(7),
        };
        for ins in &p.body.instrs {
            match ins {
                LInstr::Load { load, d } => k.extend([1, *load as u64, *d as u64]),
                LInstr::Fill { v, d } => k.extend([2, v.to_bits(), *d as u64]),
                LInstr::Unary { op, a, d } => k.extend([3, *op as u64, *a as u64, *d as u64]),
                LInstr::Binary { op, a, b, d } => k.extend([4, *op as u64, src(a), src(b), *d as u64]),
                LInstr::Compare { op, a, b, d } => k.extend([5, *op as u64, src(a), src(b), *d as u64]),
                LInstr::Where { c, a, b, d } => k.extend([6, *c as u64, *a as u64, *b as u64, *d as u64]),
                LInstr::Clamp { a, lo, hi, d } => {
                    k.extend([7, *a as u64, *d as u64]);
                    k.extend([lo.map_or(u64::MAX, f64::to_bits), hi.map_or(u64::MAX, f64::to_bits)]);
                }
                LInstr::Round { dtype, a, d } => k.extend([8, *dtype as u64, *a as u64, *d as u64]),
            }
        }
    }

    /// Why the JIT does not cover this body, if it does not.
    fn check(&self, dtypes: &[DType]) -> Result<(), &'static str> {
        let p = self;
        if p.body.compute != Compute::F32 {
            return Err("f64 body");
        }
        if p.body.nregs > MAX_VALUES {
            return Err("too many live values");
        }
        if p.accesses() > MAX_ACCESSES {
            return Err("too many accesses");
        }
        if p.body.loads.iter().any(|a| dtypes.get(a.buf) != Some(&DType::F32)) {
            return Err("a load of another dtype");
        }
        for &s in &p.load_inner {
            // A gathered load indexes with i32 element offsets.
            if s > 1 && (p.inner_len.saturating_add(16)).saturating_mul(s) >= (1usize << 31) {
                return Err("a gather offset beyond i32");
            }
        }
        for ins in &p.body.instrs {
            match ins {
                LInstr::Unary {
                    op: UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1,
                    ..
                } => return Err("a unary function the JIT does not emit"),
                LInstr::Binary { op: BinaryOp::Pow, b, .. } => match b {
                    Src::Const(c) if [1.0, 2.0, 3.0, -1.0].contains(c) => {}
                    _ => return Err("pow with an exponent other than 1, 2, 3, -1"),
                },
                LInstr::Round { dtype, .. } if !matches!(dtype, DType::F32 | DType::F16 | DType::Bool) => {
                    return Err("rounding to bf16 or an integer")
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Where a kernel's machine code appears once the JIT worker compiled it.
pub(crate) type JitSlot = Arc<OnceLock<JitKernel>>;

/// A kernel to compile, and the slot its code goes to.
struct Job {
    key: Vec<u64>,
    spec: Spec<'static>,
    slot: JitSlot,
}

/// Jobs submitted to the worker and not yet compiled.
static PENDING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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
fn submit(jobs: Vec<Job>) {
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
fn compile_jobs(jobs: Vec<Job>) {
    let n = jobs.len();
    compile_batch(jobs);
    PENDING.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
}

fn compile_batch(jobs: Vec<Job>) {
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
                let k = JitKernel { _module: module.clone(), entry };
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
static CACHE: OnceLock<std::sync::Mutex<rustc_hash::FxHashMap<Vec<u64>, JitSlot>>> = OnceLock::new();
/// Most kernels the process-wide cache keeps (their code stays mapped).
const CACHE_CAP: usize = 4096;

type R<T> = Result<T, IcedError>;

const ZMM: [AsmRegisterZmm; 32] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14, zmm15, zmm16, zmm17,
    zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27, zmm28, zmm29, zmm30, zmm31,
];
/// Scratch vector registers (above the body's values).
const T: [AsmRegisterZmm; 8] = [zmm24, zmm25, zmm26, zmm27, zmm28, zmm29, zmm30, zmm31];
/// Registers holding the accesses' current run addresses; the rest live on the stack.
const AREG: [AsmRegister64; 9] = [rbx, rbp, r8, r12, r13, r14, r15, rsi, rdi];
/// Stack frame: spilled access addresses, then the `outer` pointer (8-byte words).
const FRAME_OUTER: i32 = 8 * MAX_ACCESSES as i32;
const FRAME_BYTES: i32 = FRAME_OUTER + 8 + 8; // keeps rsp 16-byte aligned after 6 pushes

/// `cmpps` predicates (quiet, as Rust's comparisons).
mod pred {
    pub const EQ_OQ: i32 = 0x00;
    pub const UNORD_Q: i32 = 0x03;
    pub const NEQ_UQ: i32 = 0x04;
    pub const NLE_UQ: i32 = 0x16;
    pub const LT_OQ: i32 = 0x11;
    pub const LE_OQ: i32 = 0x12;
    pub const GE_OQ: i32 = 0x1D;
    pub const GT_OQ: i32 = 0x1E;
}

/// The constant pool: one label per distinct 32-bit pattern, and the lane indices.
struct Pool {
    labels: HashMap<u32, CodeLabel>,
    iota: Option<CodeLabel>,
}

impl Pool {
    fn bits(&mut self, a: &mut CodeAssembler, bits: u32) -> CodeLabel {
        *self.labels.entry(bits).or_insert_with(|| a.create_label())
    }
    fn f(&mut self, a: &mut CodeAssembler, v: f32) -> AsmMemoryOperand {
        let l = self.bits(a, v.to_bits());
        dword_bcst(l)
    }
    fn u(&mut self, a: &mut CodeAssembler, v: u32) -> AsmMemoryOperand {
        let l = self.bits(a, v);
        dword_bcst(l)
    }
    /// The same constant as a plain 4-byte operand (for `vbroadcastss`).
    fn scalar(&mut self, a: &mut CodeAssembler, v: f32) -> AsmMemoryOperand {
        let l = self.bits(a, v.to_bits());
        dword_ptr(l)
    }
    fn emit(self, a: &mut CodeAssembler) -> R<()> {
        if let Some(mut l) = self.iota {
            a.set_label(&mut l)?;
            let lanes: Vec<u32> = (0..16).collect();
            a.dd(&lanes)?;
        }
        let mut all: Vec<(u32, CodeLabel)> = self.labels.into_iter().collect();
        all.sort_by_key(|(b, _)| *b);
        for (bits, mut l) in all {
            a.set_label(&mut l)?;
            a.dd(&[bits])?;
        }
        Ok(())
    }
}

fn assemble(kernels: &[&Spec]) -> Result<(Module, Vec<Entry>), String> {
    let e = |e: IcedError| e.to_string();
    let mut a = CodeAssembler::new(64).map_err(e)?;
    // EVEX wherever an instruction has both encodings: the code uses xmm/ymm 16-31.
    a.set_prefer_vex(false);
    let mut pool = Pool { labels: HashMap::new(), iota: None };
    let mut labels = Vec::with_capacity(kernels.len());
    for k in kernels {
        let mut l = a.create_label();
        a.set_label(&mut l).map_err(e)?;
        kernel(&mut a, &mut pool, k).map_err(e)?;
        labels.push(l);
    }
    pool.emit(&mut a).map_err(e)?;
    // The code is position independent (branches and constants are RIP-relative):
    // assemble it at address 0 and copy it anywhere.
    let res = a.assemble_options(0, iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS).map_err(e)?;
    let code = &res.inner.code_buffer;
    let mut map = memmap2::MmapMut::map_anon(code.len().max(1)).map_err(|err| format!("mapping code: {err}"))?;
    map[..code.len()].copy_from_slice(code);
    let offsets: Vec<usize> =
        labels.iter().map(|l| res.label_ip(l).map(|o| o as usize)).collect::<Result<_, _>>().map_err(e)?;
    let map = map.make_exec().map_err(|err| format!("making code executable: {err}"))?;
    let base = map.as_ptr() as usize;
    perf_map(base, &offsets, code.len(), kernels);
    let entries = offsets
        .into_iter()
        .map(|off| {
            // SAFETY: `base + off` is a kernel entry in this executable mapping, which
            // follows the `Entry` calling convention (see `kernel`).
            unsafe { std::mem::transmute::<usize, Entry>(base + off) }
        })
        .collect();
    Ok((Module { _map: map }, entries))
}

/// With `AOTGRAD_JIT_PERF_MAP=1`, name the compiled kernels for `perf` in
/// `/tmp/perf-PID.map` (what each fuses, e.g. `aotgrad_jit_load_mul_erf_add_store`).
fn perf_map(base: usize, offsets: &[usize], end: usize, kernels: &[&Spec]) {
    if !std::env::var("AOTGRAD_JIT_PERF_MAP").is_ok_and(|v| v == "1") {
        return;
    }
    use std::io::Write;
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) else { return };
    for (i, (off, k)) in offsets.iter().zip(kernels).enumerate() {
        let next = offsets.get(i + 1).copied().unwrap_or(end);
        let ops: Vec<String> = k
            .body
            .instrs
            .iter()
            .map(|ins| match ins {
                LInstr::Load { .. } => "load".to_string(),
                LInstr::Fill { .. } => "fill".to_string(),
                LInstr::Unary { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Binary { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Compare { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Where { .. } => "where".to_string(),
                LInstr::Clamp { .. } => "clamp".to_string(),
                LInstr::Round { .. } => "round".to_string(),
            })
            .collect();
        let last = match k.reduce {
            Some((op, _, _)) => op.name(),
            None => "store",
        };
        let _ = writeln!(f, "{:x} {:x} aotgrad_jit_{}_{last}", base + off, next - off, ops.join("_"));
    }
}

/// Where access `a`'s current run address is.
#[derive(Clone, Copy)]
enum Base {
    Reg(AsmRegister64),
    Stack(i32),
}

fn base_of(a: usize) -> Base {
    if a < AREG.len() {
        Base::Reg(AREG[a])
    } else {
        Base::Stack(8 * (a - AREG.len()) as i32)
    }
}

/// The register holding access `a`'s address, loading a spilled one into `rax`.
fn addr(a: &mut CodeAssembler, acc: usize) -> R<AsmRegister64> {
    match base_of(acc) {
        Base::Reg(r) => Ok(r),
        Base::Stack(off) => {
            a.mov(rax, qword_ptr(rsp + off))?;
            Ok(rax)
        }
    }
}

/// One kernel's code (see the module docs for the calling convention).
fn kernel(a: &mut CodeAssembler, pool: &mut Pool, p: &Spec) -> R<()> {
    let n_acc = p.accesses();
    for r in [rbx, rbp, r12, r13, r14, r15] {
        a.push(r)?;
    }
    a.sub(rsp, FRAME_BYTES)?;
    a.mov(qword_ptr(rsp + FRAME_OUTER), rsi)?;
    // Access addresses: spilled ones and those not in rsi / rdi first (rdi is the
    // `ptrs` argument until the last of them is read).
    for i in (0..n_acc).rev() {
        match base_of(i) {
            Base::Stack(off) => {
                a.mov(rax, qword_ptr(rdi + 8 * i as i32))?;
                a.mov(qword_ptr(rsp + off), rax)?;
            }
            Base::Reg(r) if r != rdi => a.mov(r, qword_ptr(rdi + 8 * i as i32))?,
            Base::Reg(_) => {}
        }
    }
    if n_acc > 8 {
        a.mov(rdi, qword_ptr(rdi + 64))?;
    }
    let mut row = a.create_label();
    let mut vec_loop = a.create_label();
    let mut tail = a.create_label();
    let mut row_end = a.create_label();
    let mut done = a.create_label();
    a.test(rdx, rdx)?;
    a.jz(done)?;
    a.set_label(&mut row)?;
    a.xor(r10d, r10d)?;
    row_start(a, p)?;
    // Full vectors unmasked, then one masked tail (a body masked on every vector ran
    // about 35% slower on the bench machine, so long bodies are emitted twice too).
    a.mov(r11, rcx)?;
    a.sub(r11, 16)?;
    a.set_label(&mut vec_loop)?;
    a.cmp(r10, r11)?;
    a.jg(tail)?;
    body(a, pool, p, false)?;
    a.add(r10, 16)?;
    a.jmp(vec_loop)?;
    a.set_label(&mut tail)?;
    a.mov(rax, rcx)?;
    a.sub(rax, r10)?;
    a.jle(row_end)?;
    a.mov(r9d, -1)?;
    a.bzhi(r9d, r9d, eax)?;
    a.kmovw(k1, r9d)?;
    body(a, pool, p, true)?;
    a.set_label(&mut row_end)?;
    row_finish(a, pool, p)?;
    a.mov(r9, qword_ptr(rsp + FRAME_OUTER))?;
    for i in 0..n_acc {
        match base_of(i) {
            Base::Reg(r) => a.add(r, qword_ptr(r9 + 8 * i as i32))?,
            Base::Stack(off) => {
                a.mov(rax, qword_ptr(r9 + 8 * i as i32))?;
                a.add(qword_ptr(rsp + off), rax)?;
            }
        }
    }
    a.dec(rdx)?;
    a.jnz(row)?;
    a.set_label(&mut done)?;
    a.vzeroupper()?;
    a.add(rsp, FRAME_BYTES)?;
    for r in [r15, r14, r13, r12, rbp, rbx] {
        a.pop(r)?;
    }
    a.ret()
}

// A reduction's registers: a row's two f64 partial sums (or its running extreme in
// `RED_M`, with `k5` the lanes that saw a NaN), and scratch for combining them.
const RED_A0: AsmRegisterZmm = zmm20;
const RED_A1: AsmRegisterZmm = zmm21;
const RED_M: AsmRegisterZmm = zmm20;
const RED_T: AsmRegisterZmm = zmm22;
const RED_U: AsmRegisterZmm = zmm23;

/// A reduction over the run's row starts afresh (the accumulated row, for a reduced
/// inner dim, as [`super::exec`]'s `sum_f64` / `extreme` start).
fn row_start(a: &mut CodeAssembler, p: &Spec) -> R<()> {
    match p.reduce {
        Some((ReduceOp::Sum | ReduceOp::Mean, _, 0)) => {
            a.vxorpd(RED_A0, RED_A0, RED_A0)?;
            a.vxorpd(RED_A1, RED_A1, RED_A1)
        }
        Some((ReduceOp::Amax | ReduceOp::Amin, _, 0)) => a.kxorw(k5, k5, k5),
        _ => Ok(()),
    }
}

/// Accumulate one vector of the reduced value (the lanes of `k1` when `masked`).
fn accumulate(a: &mut CodeAssembler, pool: &mut Pool, p: &Spec, masked: bool) -> R<()> {
    let Some((op, value, dst_inner)) = p.reduce else { return Ok(()) };
    let v = ZMM[value];
    let acc = addr(a, p.body.loads.len())?;
    let max = op == ReduceOp::Amax;
    match (op, dst_inner) {
        (ReduceOp::Sum | ReduceOp::Mean, 0) => {
            // As `simd::sum_f32_f64`: lanes 0-7 into A0, 8-15 into A1; a tail adds
            // zeros for its missing lanes, and to A1 only when it has more than 8.
            if masked {
                a.vmovaps(v.k1().z(), v)?;
            }
            a.vcvtps2pd(RED_T, ymm_of(value))?;
            a.vaddpd(RED_A0, RED_A0, RED_T)?;
            let mut skip = a.create_label();
            if masked {
                a.mov(rax, rcx)?;
                a.sub(rax, r10)?;
                a.cmp(rax, 8)?;
                a.jle(skip)?;
            }
            a.vextractf32x8(ymm22, v, 1)?;
            a.vcvtps2pd(RED_T, ymm22)?;
            a.vaddpd(RED_A1, RED_A1, RED_T)?;
            if masked {
                a.set_label(&mut skip)?;
                a.nop()?;
            }
            Ok(())
        }
        (ReduceOp::Amax | ReduceOp::Amin, 0) => {
            // As `simd::extreme_f32`: the row's first value in every lane, then the
            // lane-wise extreme (a tail keeps the running value in its missing lanes).
            let mut not_first = a.create_label();
            a.test(r10, r10)?;
            a.jnz(not_first)?;
            a.vbroadcastss(RED_M, xmm_of(value))?;
            a.set_label(&mut not_first)?;
            let x = if masked {
                a.vblendmps(RED_U.k1(), RED_M, v)?;
                RED_U
            } else {
                v
            };
            if max {
                a.vmaxps(RED_M, RED_M, x)?;
            } else {
                a.vminps(RED_M, RED_M, x)?;
            }
            a.vcmpps(k4, x, x, pred::UNORD_Q)?;
            a.korw(k5, k5, k4)
        }
        (_, _) => {
            // A kept inner dim: one f64 accumulator per lane, `a + x` (or the extreme
            // as `combine_extreme`), in element order.
            a.kshiftrw(k4, k1, 8)?;
            for half in 0..2 {
                let src = if half == 0 {
                    ymm_of(value)
                } else {
                    a.vextractf32x8(ymm22, v, 1)?;
                    ymm22
                };
                a.vcvtps2pd(RED_T, src)?;
                let at = zmmword_ptr(acc + r10 * 8 + 64 * half);
                match (masked, half) {
                    (false, _) => a.vmovupd(RED_U, at)?,
                    (true, 0) => a.vmovupd(RED_U.k1().z(), at)?,
                    (true, _) => a.vmovupd(RED_U.k4().z(), at)?,
                }
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => a.vaddpd(RED_U, RED_U, RED_T)?,
                    _ => {
                        // x wins when x > a (x < a for a minimum) or x is NaN.
                        let pr = if max { pred::GT_OQ } else { pred::LT_OQ };
                        a.vcmppd(k6, RED_T, RED_U, pr)?;
                        a.vcmppd(k7, RED_T, RED_T, pred::UNORD_Q)?;
                        a.korw(k6, k6, k7)?;
                        a.vmovapd(RED_U.k6(), RED_T)?;
                    }
                }
                let at = zmmword_ptr(acc + r10 * 8 + 64 * half);
                match (masked, half) {
                    (false, _) => a.vmovupd(at, RED_U)?,
                    (true, 0) => a.vmovupd(at.k1(), RED_U)?,
                    (true, _) => a.vmovupd(at.k4(), RED_U)?,
                }
            }
            let _ = pool;
            Ok(())
        }
    }
}

/// Fold a reduced row into its accumulator, as [`super::exec`] does after `sum_f64`
/// or `extreme` (lanes combined in one fixed order, then `acc + s` or
/// `combine_extreme(acc, m)`).
fn row_finish(a: &mut CodeAssembler, pool: &mut Pool, p: &Spec) -> R<()> {
    let Some((op, _, 0)) = p.reduce else { return Ok(()) };
    let acc = addr(a, p.body.loads.len())?;
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            // v = A0 + A1; then lanes 0-3 + 4-7, 0-1 + 2-3, 0 + 1.
            a.vaddpd(RED_A0, RED_A0, RED_A1)?;
            a.vextractf64x4(ymm22, RED_A0, 1)?;
            a.vaddpd(ymm20, ymm20, ymm22)?;
            a.vextractf64x2(xmm22, ymm20, 1)?;
            a.vaddpd(xmm20, xmm20, xmm22)?;
            a.vunpckhpd(xmm22, xmm20, xmm20)?;
            a.vaddsd(xmm20, xmm20, xmm22)?;
            a.vmovsd(xmm22, qword_ptr(acc))?;
            a.vaddsd(xmm22, xmm22, xmm20)?;
            a.vmovsd(qword_ptr(acc), xmm22)
        }
        _ => {
            let max = op == ReduceOp::Amax;
            // Lanes 0-7 against 8-15, 0-3 against 4-7, 0-1 against 2-3, 0 against 1.
            a.vextractf32x8(ymm22, RED_M, 1)?;
            if max {
                a.vmaxps(ymm20, ymm20, ymm22)?;
            } else {
                a.vminps(ymm20, ymm20, ymm22)?;
            }
            a.vextractf32x4(xmm22, ymm20, 1)?;
            if max {
                a.vmaxps(xmm20, xmm20, xmm22)?;
            } else {
                a.vminps(xmm20, xmm20, xmm22)?;
            }
            a.vmovhlps(xmm22, xmm20, xmm20)?;
            if max {
                a.vmaxps(xmm20, xmm20, xmm22)?;
            } else {
                a.vminps(xmm20, xmm20, xmm22)?;
            }
            a.vshufps(xmm22, xmm20, xmm20, 1)?;
            if max {
                a.vmaxss(xmm20, xmm20, xmm22)?;
            } else {
                a.vminss(xmm20, xmm20, xmm22)?;
            }
            // A NaN seen in any lane makes the row NaN.
            let mut clean = a.create_label();
            a.kortestw(k5, k5)?;
            a.jz(clean)?;
            let nan = pool.scalar(a, f32::NAN);
            a.vmovss(xmm20, nan)?;
            a.set_label(&mut clean)?;
            a.vcvtss2sd(xmm20, xmm20, xmm20)?;
            // acc = x when x > acc (x < acc for a minimum) or x is NaN.
            a.vmovsd(xmm22, qword_ptr(acc))?;
            let pr = if max { pred::GT_OQ } else { pred::LT_OQ };
            a.vcmpsd(k6, xmm20, xmm22, pr)?;
            a.vcmpsd(k7, xmm20, xmm20, pred::UNORD_Q)?;
            a.korw(k6, k6, k7)?;
            a.vmovsd_3(xmm22.k6(), xmm22, xmm20)?;
            a.vmovsd(qword_ptr(acc), xmm22)
        }
    }
}

const YMM: [AsmRegisterYmm; 24] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15, ymm16, ymm17,
    ymm18, ymm19, ymm20, ymm21, ymm22, ymm23,
];
const XMM: [AsmRegisterXmm; 24] = [
    xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14, xmm15, xmm16, xmm17,
    xmm18, xmm19, xmm20, xmm21, xmm22, xmm23,
];

fn ymm_of(r: usize) -> AsmRegisterYmm {
    YMM[r]
}

fn xmm_of(r: usize) -> AsmRegisterXmm {
    XMM[r]
}

/// An operand of a binary instruction.
#[derive(Clone, Copy)]
enum Opnd {
    Reg(AsmRegisterZmm),
    Const(f32),
}

fn opnd(s: &Src) -> Opnd {
    match s {
        Src::Reg(r) => Opnd::Reg(ZMM[*r]),
        Src::Const(c) => Opnd::Const(*c as f32),
    }
}

/// The body over one vector of lanes (`masked`: the lanes of `k1`, the run's tail).
fn body(a: &mut CodeAssembler, pool: &mut Pool, p: &Spec, masked: bool) -> R<()> {
    let nl = p.body.loads.len();
    for ins in &p.body.instrs {
        match ins {
            LInstr::Load { load, d } => load_vec(a, pool, *load, p.load_inner[*load], ZMM[*d], masked)?,
            LInstr::Fill { v, d } => {
                let m0 = pool.scalar(a, *v as f32);
                a.vbroadcastss(ZMM[*d], m0)?;
            }
            LInstr::Unary { op, a: x, d } => unary(a, pool, *op, ZMM[*x], ZMM[*d])?,
            LInstr::Binary { op, a: x, b: y, d } => binary(a, pool, *op, opnd(x), opnd(y), ZMM[*d])?,
            LInstr::Compare { op, a: x, b: y, d } => {
                let x = reg_of(a, pool, opnd(x), T[0])?;
                let pr = match op {
                    CmpOp::Eq => pred::EQ_OQ,
                    CmpOp::Ne => pred::NEQ_UQ,
                    CmpOp::Lt => pred::LT_OQ,
                    CmpOp::Le => pred::LE_OQ,
                    CmpOp::Gt => pred::GT_OQ,
                    CmpOp::Ge => pred::GE_OQ,
                };
                match opnd(y) {
                    Opnd::Reg(y) => a.vcmpps(k2, x, y, pr)?,
                    Opnd::Const(c) => {
                        let m0 = pool.f(a, c);
                        a.vcmpps(k2, x, m0, pr)?;
                    }
                }
                let m0 = pool.scalar(a, 1.0);
                a.vbroadcastss(ZMM[*d].k2().z(), m0)?;
            }
            LInstr::Where { c, a: x, b: y, d } => {
                let m0 = pool.f(a, 0.0);
                a.vcmpps(k2, ZMM[*c], m0, pred::NEQ_UQ)?;
                a.vblendmps(ZMM[*d].k2(), ZMM[*y], ZMM[*x])?;
            }
            LInstr::Clamp { a: x, lo, hi, d } => {
                let d = ZMM[*d];
                a.vmovaps(d, ZMM[*x])?;
                // Lanes below `lo` (above `hi`) take the bound; NaN compares false.
                for (bound, pr) in [(lo, pred::LT_OQ), (hi, pred::GT_OQ)] {
                    if let Some(b) = bound {
                        let b = *b as f32;
                        let m0 = pool.f(a, b);
                        a.vcmpps(k2, d, m0, pr)?;
                        let m0 = pool.scalar(a, b);
                        a.vbroadcastss(d.k2(), m0)?;
                    }
                }
            }
            LInstr::Round { dtype, a: x, d } => match dtype {
                DType::F16 => {
                    a.vcvtps2ph(ymm24, ZMM[*x], 0)?;
                    a.vcvtph2ps(ZMM[*d], ymm24)?;
                }
                DType::Bool => {
                    let m0 = pool.f(a, 0.0);
                    a.vcmpps(k2, ZMM[*x], m0, pred::NEQ_UQ)?;
                    let m0 = pool.scalar(a, 1.0);
                    a.vbroadcastss(ZMM[*d].k2().z(), m0)?;
                }
                _ => a.vmovaps(ZMM[*d], ZMM[*x])?,
            },
        }
    }
    for (s, reg) in p.stores.iter().enumerate() {
        let base = addr(a, nl + s)?;
        let at = zmmword_ptr(base + r10 * 4);
        if masked {
            a.vmovups(at.k1(), ZMM[*reg])?;
        } else {
            a.vmovups(at, ZMM[*reg])?;
        }
    }
    accumulate(a, pool, p, masked)
}

fn load_vec(
    a: &mut CodeAssembler,
    pool: &mut Pool,
    acc: usize,
    stride: usize,
    d: AsmRegisterZmm,
    masked: bool,
) -> R<()> {
    let base = addr(a, acc)?;
    match stride {
        0 => a.vbroadcastss(d, dword_ptr(base)),
        1 => {
            let at = zmmword_ptr(base + r10 * 4);
            if masked {
                a.vmovups(d.k1().z(), at)
            } else {
                a.vmovups(d, at)
            }
        }
        s => {
            // Lane l reads element (i + l) * s.
            let iota = *pool.iota.get_or_insert_with(|| a.create_label());
            a.vpbroadcastd(T[7], r10d)?;
            a.vpaddd(T[7], T[7], zmmword_ptr(iota))?;
            let m0 = pool.u(a, s as u32);
            a.vpmulld(T[7], T[7], m0)?;
            if masked {
                a.kmovw(k3, k1)?;
            } else {
                a.kxnorw(k3, k3, k3)?;
            }
            a.vxorps(d, d, d)?;
            a.vgatherdps(d.k3(), zmmword_ptr(base + T[7] * 4))
        }
    }
}

/// `o` in a register (a constant is broadcast into `scratch`).
fn reg_of(a: &mut CodeAssembler, pool: &mut Pool, o: Opnd, scratch: AsmRegisterZmm) -> R<AsmRegisterZmm> {
    Ok(match o {
        Opnd::Reg(r) => r,
        Opnd::Const(c) => {
            let m0 = pool.scalar(a, c);
            a.vbroadcastss(scratch, m0)?;
            scratch
        }
    })
}

/// `d = x op y` for the arithmetic ops whose second source may be a broadcast constant.
fn arith(a: &mut CodeAssembler, pool: &mut Pool, op: BinaryOp, d: AsmRegisterZmm, x: AsmRegisterZmm, y: Opnd) -> R<()> {
    macro_rules! go {
        ($m:ident) => {
            match y {
                Opnd::Reg(y) => a.$m(d, x, y),
                Opnd::Const(c) => {
                    let m0 = pool.f(a, c);
                    a.$m(d, x, m0)
                }
            }
        };
    }
    match op {
        BinaryOp::Add => go!(vaddps),
        BinaryOp::Sub => go!(vsubps),
        BinaryOp::Mul => go!(vmulps),
        BinaryOp::Div => go!(vdivps),
        BinaryOp::Maximum => go!(vmaxps),
        BinaryOp::Minimum => go!(vminps),
        BinaryOp::Pow => unreachable!("pow is expanded by `binary`"),
    }
}

fn binary(a: &mut CodeAssembler, pool: &mut Pool, op: BinaryOp, x: Opnd, y: Opnd, d: AsmRegisterZmm) -> R<()> {
    match op {
        BinaryOp::Pow => {
            let x = reg_of(a, pool, x, T[0])?;
            let Opnd::Const(c) = y else { unreachable!("`covers` admits constant exponents only") };
            if c == 1.0 {
                a.vmovaps(d, x)
            } else if c == 2.0 {
                a.vmulps(d, x, x)
            } else if c == 3.0 {
                a.vmulps(d, x, x)?;
                a.vmulps(d, d, x)
            } else {
                let m0 = pool.scalar(a, 1.0);
                a.vbroadcastss(d, m0)?;
                a.vdivps(d, d, x)
            }
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // NaN on either side gives NaN: the instruction returns the second source
            // when either is NaN, so a NaN first source is put back after.
            let x = reg_of(a, pool, x, T[0])?;
            arith(a, pool, op, d, x, y)?;
            a.vcmpps(k2, x, x, pred::UNORD_Q)?;
            a.vmovaps(d.k2(), x)
        }
        _ => {
            let x = reg_of(a, pool, x, T[0])?;
            arith(a, pool, op, d, x, y)
        }
    }
}

fn unary(a: &mut CodeAssembler, pool: &mut Pool, op: UnaryOp, x: AsmRegisterZmm, d: AsmRegisterZmm) -> R<()> {
    match op {
        UnaryOp::Neg => {
            let m0 = pool.u(a, 0x8000_0000);
            a.vxorps(d, x, m0)
        }
        UnaryOp::Abs => {
            let m0 = pool.u(a, 0x7fff_ffff);
            a.vandps(d, x, m0)
        }
        UnaryOp::Sqrt => a.vsqrtps(d, x),
        UnaryOp::Rsqrt => {
            a.vsqrtps(T[0], x)?;
            let m0 = pool.scalar(a, 1.0);
            a.vbroadcastss(d, m0)?;
            a.vdivps(d, d, T[0])
        }
        UnaryOp::Reciprocal => {
            let m0 = pool.scalar(a, 1.0);
            a.vbroadcastss(d, m0)?;
            a.vdivps(d, d, x)
        }
        UnaryOp::Relu => {
            // x when x > 0 or NaN, else +0.
            let m0 = pool.f(a, 0.0);
            a.vcmpps(k2, x, m0, pred::NLE_UQ)?;
            a.vmovaps(d.k2().z(), x)
        }
        UnaryOp::Sign => {
            a.vxorps(d, d, d)?;
            let m0 = pool.f(a, 0.0);
            a.vcmpps(k2, x, m0, pred::GT_OQ)?;
            let m0 = pool.scalar(a, 1.0);
            a.vbroadcastss(d.k2(), m0)?;
            let m0 = pool.f(a, 0.0);
            a.vcmpps(k2, x, m0, pred::LT_OQ)?;
            let m0 = pool.scalar(a, -1.0);
            a.vbroadcastss(d.k2(), m0)
        }
        UnaryOp::LogicalNot => {
            let m0 = pool.f(a, 0.0);
            a.vcmpps(k2, x, m0, pred::EQ_OQ)?;
            let m0 = pool.scalar(a, 1.0);
            a.vbroadcastss(d.k2().z(), m0)
        }
        // Round to an integer, suppressing the precision exception (imm bit 3).
        UnaryOp::Floor => a.vrndscaleps(d, x, 0x09),
        UnaryOp::Ceil => a.vrndscaleps(d, x, 0x0A),
        UnaryOp::Trunc => a.vrndscaleps(d, x, 0x0B),
        UnaryOp::Round => a.vrndscaleps(d, x, 0x08),
        UnaryOp::Exp => exp(a, pool, x, d, [T[0], T[1], T[2], T[3], T[4]]),
        UnaryOp::Sigmoid => {
            // 1 / (1 + exp(-x))
            let m0 = pool.u(a, 0x8000_0000);
            a.vxorps(T[5], x, m0)?;
            exp(a, pool, T[5], T[6], [T[0], T[1], T[2], T[3], T[4]])?;
            let m0 = pool.f(a, 1.0);
            a.vaddps(T[6], T[6], m0)?;
            let m0 = pool.scalar(a, 1.0);
            a.vbroadcastss(d, m0)?;
            a.vdivps(d, d, T[6])
        }
        UnaryOp::Erf => erf(a, pool, x, d),
        UnaryOp::Tanh => tanh(a, pool, x, d),
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1 => {
            unreachable!("`covers` rejects {op:?}")
        }
    }
}

/// `d = x * c` then `d = d + c2` as separate roundings (Rust never fuses them).
fn horner_step(a: &mut CodeAssembler, pool: &mut Pool, d: AsmRegisterZmm, z: AsmRegisterZmm, add: f32) -> R<()> {
    a.vmulps(d, d, z)?;
    let m0 = pool.f(a, add);
    a.vaddps(d, d, m0)
}

/// `d = exp(x)` as [`super::math::exp_f32`]; `t` are scratch registers distinct from
/// `x` and `d`.
fn exp(a: &mut CodeAssembler, pool: &mut Pool, x: AsmRegisterZmm, d: AsmRegisterZmm, t: [AsmRegisterZmm; 5]) -> R<()> {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0;
    // xc = clamp(x, -87, 88) (a NaN lane is replaced at the end).
    let m0 = pool.f(a, -87.0);
    a.vmaxps(t[0], x, m0)?;
    let m0 = pool.f(a, 88.0);
    a.vminps(t[0], t[0], m0)?;
    // t = xc * log2e + magic; n = t - magic
    let m0 = pool.f(a, LOG2E);
    a.vmulps(t[1], t[0], m0)?;
    let m0 = pool.f(a, MAGIC);
    a.vaddps(t[1], t[1], m0)?;
    let m0 = pool.f(a, MAGIC);
    a.vsubps(t[2], t[1], m0)?;
    // 2^n from t's low mantissa bits.
    let m0 = pool.u(a, 0x4B40_0000);
    a.vpsubd(t[3], t[1], m0)?;
    let m0 = pool.u(a, 127);
    a.vpaddd(t[3], t[3], m0)?;
    a.vpslld(t[3], t[3], 23)?;
    // r = (xc - n * ln2_hi) - n * ln2_lo
    let m0 = pool.f(a, 0.693_145_75);
    a.vmulps(t[4], t[2], m0)?;
    a.vsubps(t[0], t[0], t[4])?;
    let m0 = pool.f(a, 1.428_606_8e-6);
    a.vmulps(t[4], t[2], m0)?;
    a.vsubps(t[0], t[0], t[4])?;
    // p = 1 + r * (1 + r * (0.5 + r * (...)))
    let m0 = pool.f(a, 0.000_198_412_7);
    a.vmulps(t[1], t[0], m0)?;
    let m0 = pool.f(a, 0.001_388_889);
    a.vaddps(t[1], t[1], m0)?;
    for c in [0.008_333_334, 0.041_666_668, 0.166_666_67, 0.5, 1.0, 1.0] {
        horner_step(a, pool, t[1], t[0], c)?;
    }
    a.vmulps(d, t[1], t[3])?;
    let m0 = pool.f(a, 88.72);
    a.vcmpps(k2, x, m0, pred::GT_OQ)?;
    let m0 = pool.scalar(a, f32::INFINITY);
    a.vbroadcastss(d.k2(), m0)?;
    let m0 = pool.f(a, -87.33);
    a.vcmpps(k2, x, m0, pred::LT_OQ)?;
    let m0 = pool.scalar(a, 0.0);
    a.vbroadcastss(d.k2(), m0)?;
    a.vcmpps(k2, x, x, pred::UNORD_Q)?;
    a.vmovaps(d.k2(), x)
}

/// `d = erf(x)` as [`super::math::erf_f32`].
fn erf(a: &mut CodeAssembler, pool: &mut Pool, x: AsmRegisterZmm, d: AsmRegisterZmm) -> R<()> {
    let (c, z, p, q) = (T[0], T[1], T[2], T[3]);
    let m0 = pool.f(a, -4.0);
    a.vmaxps(c, x, m0)?;
    let m0 = pool.f(a, 4.0);
    a.vminps(c, c, m0)?;
    a.vmulps(z, c, c)?;
    let m0 = pool.f(a, -2.726_142_3e-10);
    a.vmulps(p, z, m0)?;
    let m0 = pool.f(a, 2.770_681_4e-8);
    a.vaddps(p, p, m0)?;
    for k in [-2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_6e-3, -1.609_603_3e-2] {
        horner_step(a, pool, p, z, k)?;
    }
    a.vmulps(p, p, c)?;
    let m0 = pool.f(a, -1.456_607_2e-5);
    a.vmulps(q, z, m0)?;
    let m0 = pool.f(a, -2.133_740_6e-4);
    a.vaddps(q, q, m0)?;
    for k in [-1.682_827e-3, -7.373_329_2e-3, -1.426_474e-2] {
        horner_step(a, pool, q, z, k)?;
    }
    a.vdivps(d, p, q)?;
    // |c| > 3.92: ±1 with x's sign.
    let m0 = pool.u(a, 0x7fff_ffff);
    a.vandps(T[4], c, m0)?;
    let m0 = pool.f(a, 3.92);
    a.vcmpps(k2, T[4], m0, pred::GT_OQ)?;
    let m0 = pool.u(a, 0x8000_0000);
    a.vandps(T[5], x, m0)?;
    let m0 = pool.u(a, 1f32.to_bits());
    a.vorps(T[5], T[5], m0)?;
    a.vmovaps(d.k2(), T[5])?;
    a.vcmpps(k2, x, x, pred::UNORD_Q)?;
    a.vmovaps(d.k2(), x)
}

/// `d = tanh(x)` as [`super::math::tanh_f32`].
fn tanh(a: &mut CodeAssembler, pool: &mut Pool, x: AsmRegisterZmm, d: AsmRegisterZmm) -> R<()> {
    let (abs, e, z2) = (T[5], T[6], T[7]);
    // a = min(|x|, 20) (Rust's min: a NaN |x| gives 20; NaN lanes are replaced below).
    let m0 = pool.u(a, 0x7fff_ffff);
    a.vandps(abs, x, m0)?;
    let m0 = pool.f(a, 20.0);
    a.vminps(abs, abs, m0)?;
    a.vcmpps(k2, x, x, pred::UNORD_Q)?;
    let m0 = pool.scalar(a, 20.0);
    a.vbroadcastss(abs.k2(), m0)?;
    a.vaddps(z2, abs, abs)?;
    exp(a, pool, z2, e, [T[0], T[1], T[2], T[3], T[4]])?;
    // big = copysign(1 - 2 / (e + 1), x)
    let m0 = pool.f(a, 1.0);
    a.vaddps(e, e, m0)?;
    let m0 = pool.scalar(a, 2.0);
    a.vbroadcastss(d, m0)?;
    a.vdivps(d, d, e)?;
    let m0 = pool.scalar(a, 1.0);
    a.vbroadcastss(e, m0)?;
    a.vsubps(d, e, d)?;
    let m0 = pool.u(a, 0x7fff_ffff);
    a.vandps(d, d, m0)?;
    let m0 = pool.u(a, 0x8000_0000);
    a.vandps(e, x, m0)?;
    a.vorps(d, d, e)?;
    // small = x * (1 + z2 * (...)) for a < 0.125
    a.vmulps(z2, x, x)?;
    let m0 = pool.f(a, 0.021_869_488);
    a.vmulps(e, z2, m0)?;
    let m0 = pool.f(a, -0.053_968_254);
    a.vaddps(e, e, m0)?;
    for k in [0.133_333_34, -0.333_333_34, 1.0] {
        horner_step(a, pool, e, z2, k)?;
    }
    a.vmulps(e, e, x)?;
    let m0 = pool.f(a, 0.125);
    a.vcmpps(k2, abs, m0, pred::LT_OQ)?;
    a.vmovaps(d.k2(), e)?;
    a.vcmpps(k2, x, x, pred::UNORD_Q)?;
    a.vmovaps(d.k2(), x)
}

/// Elements per tile handed to a compiled kernel (see [`CPU_JIT_BLOCK`]).
pub(crate) const BLOCK: usize = CPU_JIT_BLOCK;

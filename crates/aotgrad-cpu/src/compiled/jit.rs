//! A JIT for fused pointwise bodies: each lowered [`CPointwise`] whose body it covers
//! becomes AVX-512 machine code, or AVX2 code on a machine without AVX-512
//! (assembled with `iced-x86`, mapped executable with `memmap2`) that keeps every
//! value of the body in a vector register and touches memory only for its loads and
//! stores, 16 (AVX2: 8) f32 lanes at a time. One emitter ([`Em`]) writes both: every
//! operation is the same IEEE operation on either set, only registers, masks (mask
//! registers or mask vectors) and constants' encodings differ. AVX2 has 16 vector
//! registers: bodies of up to 7 live values (5 for a reduction), and sums and means
//! among reductions; the rest runs on the interpreter.
//!
//! Why: the block interpreter ([`super::exec`]) loads and stores every instruction's
//! operands through L1, a few cycles per vector and instruction; on the bench machine
//! an 8-op chain ran at 19 GB/s interpreted and 72–77 GB/s compiled here, next to a
//! copy's 80–110 GB/s. Everything else (f64 bodies, loads or stores of other dtypes,
//! strided stores, `sin`/`cos`/`log`/general `pow`, machines without AVX2) stays
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

/// The instruction set this process compiles kernels for: AVX-512 (F, VL, DQ, BW, with
/// BMI2) where the hot loops use it, else AVX2 (with FMA, F16C, BMI2) where they use
/// that (`AOTGRAD_CPU_ISA=avx2` makes an AVX-512 machine use AVX2 for both, so the
/// two code paths can be tested on one machine), else none; `AOTGRAD_JIT=0`: none.
pub(crate) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        use super::exec::{isa as loops, Isa as Loops};
        use std::arch::is_x86_feature_detected as has;
        if std::env::var("AOTGRAD_JIT").is_ok_and(|v| v == "0") || !has!("bmi2") {
            return None;
        }
        match loops() {
            Loops::Avx512 if has!("avx512bw") => Some(Isa::Avx512),
            Loops::Avx2 if has!("f16c") => Some(Isa::Avx2),
            _ => None,
        }
    })
}

/// [`isa`]'s name.
pub(crate) fn isa_name() -> Option<&'static str> {
    isa().map(|i| match i {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2",
    })
}

/// Whether this process runs compiled kernels (see [`isa`]).
pub(crate) fn available() -> bool {
    isa().is_some()
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
        let isa = isa().ok_or("no JIT on this machine")?;
        if r.body.nregs > isa.reduce_values() {
            return Err("too many live values for a reduction");
        }
        if isa == Isa::Avx2 && !matches!(r.op, ReduceOp::Sum | ReduceOp::Mean) {
            // The interpreter's AVX2 maximum keeps the first of equal (signed) zeros
            // element by element, which lane-wise code would not reproduce.
            return Err("a maximum or minimum on AVX2");
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
        if p.body.nregs > isa().ok_or("no JIT on this machine")?.values() {
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

/// The instruction set a module is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 16 f32 lanes in `zmm` registers, `k` mask registers, masked tails.
    Avx512,
    /// 8 f32 lanes in `ymm` registers; masks are vectors, tails `vmaskmovps`.
    Avx2,
}

impl Isa {
    /// f32 lanes per vector.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
        }
    }
    /// Vector registers the body's values may use (the rest are scratch and masks).
    fn values(self) -> usize {
        match self {
            Isa::Avx512 => 24,
            Isa::Avx2 => 7,
        }
    }
    /// Values a reduction's body may use (its accumulators take the top ones).
    fn reduce_values(self) -> usize {
        match self {
            Isa::Avx512 => 20,
            Isa::Avx2 => 5,
        }
    }
    /// Scratch register `i` (0..8), above the values.
    fn t(self, i: usize) -> usize {
        self.values() + i
    }
}

/// A vector register by number (zmm or ymm, as the module's [`Isa`] says).
type V = usize;

/// A mask: AVX-512 mask register `k2` (compares), or on AVX2 the one vector register
/// kept for masks (`ymm15`).
const AVX2_MASK: V = 15;

/// Stack frame: spilled access addresses, the `outer` pointer, then (AVX2) the tail's
/// lane mask and a spill of the tail's reduced value (8-byte words).
const FRAME_OUTER: i32 = 8 * MAX_ACCESSES as i32;
const FRAME_TAIL_MASK: i32 = FRAME_OUTER + 16;
const FRAME_TAIL_VALUE: i32 = FRAME_TAIL_MASK + 32;
const FRAME_BYTES: i32 = FRAME_TAIL_VALUE + 32;

/// Registers holding the accesses' current run addresses; the rest live on the stack.
const AREG: [AsmRegister64; 9] = [rbx, rbp, r8, r12, r13, r14, r15, rsi, rdi];

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

const ZMM: [AsmRegisterZmm; 32] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14, zmm15, zmm16, zmm17,
    zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27, zmm28, zmm29, zmm30, zmm31,
];
const YMM: [AsmRegisterYmm; 32] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15, ymm16, ymm17,
    ymm18, ymm19, ymm20, ymm21, ymm22, ymm23, ymm24, ymm25, ymm26, ymm27, ymm28, ymm29, ymm30, ymm31,
];
const XMM: [AsmRegisterXmm; 32] = [
    xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14, xmm15, xmm16, xmm17,
    xmm18, xmm19, xmm20, xmm21, xmm22, xmm23, xmm24, xmm25, xmm26, xmm27, xmm28, xmm29, xmm30, xmm31,
];

/// The constant pool: one label per distinct 32-bit pattern (a broadcast dword on
/// AVX-512, a whole vector of it on AVX2), and the lane indices.
struct Pool {
    labels: HashMap<u32, CodeLabel>,
    iota: Option<CodeLabel>,
}

impl Pool {
    fn label(&mut self, a: &mut CodeAssembler, bits: u32) -> CodeLabel {
        *self.labels.entry(bits).or_insert_with(|| a.create_label())
    }
    fn emit(self, a: &mut CodeAssembler, isa: Isa) -> R<()> {
        let lanes = isa.lanes() as u32;
        if let Some(mut l) = self.iota {
            a.set_label(&mut l)?;
            let idx: Vec<u32> = (0..lanes).collect();
            a.dd(&idx)?;
        }
        let mut all: Vec<(u32, CodeLabel)> = self.labels.into_iter().collect();
        all.sort_by_key(|(b, _)| *b);
        for (bits, mut l) in all {
            a.set_label(&mut l)?;
            let n = if isa == Isa::Avx2 { lanes as usize } else { 1 };
            a.dd(&vec![bits; n])?;
        }
        Ok(())
    }
}

/// An operand of a binary instruction.
#[derive(Clone, Copy)]
enum Opnd {
    Reg(V),
    Const(f32),
    Bits(u32),
}

fn opnd(s: &Src) -> Opnd {
    match s {
        Src::Reg(r) => Opnd::Reg(*r),
        Src::Const(c) => Opnd::Const(*c as f32),
    }
}

/// The emitter of one module: the assembler, its constant pool and instruction set.
/// Every primitive is the same IEEE operation on either set; only registers, masks
/// and constants' encodings differ.
struct Em<'a> {
    a: &'a mut CodeAssembler,
    pool: Pool,
    isa: Isa,
}

/// Emit `$m(d, x, y)` for a second source that may be a pooled constant.
macro_rules! two {
    ($em:ident, $m:ident, $d:expr, $x:expr, $y:expr) => {{
        let (d, x) = ($d, $x);
        match ($em.isa, $y) {
            (Isa::Avx512, Opnd::Reg(y)) => $em.a.$m(ZMM[d], ZMM[x], ZMM[y]),
            (Isa::Avx2, Opnd::Reg(y)) => $em.a.$m(YMM[d], YMM[x], YMM[y]),
            (isa, c) => {
                let bits = match c {
                    Opnd::Const(v) => v.to_bits(),
                    Opnd::Bits(b) => b,
                    Opnd::Reg(_) => unreachable!("matched above"),
                };
                let l = $em.pool.label($em.a, bits);
                match isa {
                    Isa::Avx512 => $em.a.$m(ZMM[d], ZMM[x], dword_bcst(l)),
                    Isa::Avx2 => $em.a.$m(YMM[d], YMM[x], ymmword_ptr(l)),
                }
            }
        }
    }};
}

impl Em<'_> {
    fn bits_mem(&mut self, bits: u32) -> AsmMemoryOperand {
        let l = self.pool.label(self.a, bits);
        match self.isa {
            Isa::Avx512 => dword_bcst(l),
            Isa::Avx2 => ymmword_ptr(l),
        }
    }
    /// `d = broadcast(c)`.
    fn splat(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d], dword_ptr(l)),
            Isa::Avx2 => self.a.vbroadcastss(YMM[d], dword_ptr(l)),
        }
    }
    fn mov(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d], ZMM[x]),
            Isa::Avx2 => self.a.vmovaps(YMM[d], YMM[x]),
        }
    }
    fn zero(&mut self, d: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vxorps(ZMM[d], ZMM[d], ZMM[d]),
            Isa::Avx2 => self.a.vxorps(YMM[d], YMM[d], YMM[d]),
        }
    }
    fn add(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vaddps, d, x, y)
    }
    fn sub(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vsubps, d, x, y)
    }
    fn mul(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vmulps, d, x, y)
    }
    fn div(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vdivps, d, x, y)
    }
    fn max(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vmaxps, d, x, y)
    }
    fn min(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vminps, d, x, y)
    }
    fn and(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vandps, d, x, y)
    }
    fn or(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vorps, d, x, y)
    }
    fn xor(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vxorps, d, x, y)
    }
    fn isub(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vpsubd, d, x, y)
    }
    fn iadd(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vpaddd, d, x, y)
    }
    fn shl(&mut self, d: V, x: V, n: i32) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vpslld(ZMM[d], ZMM[x], n),
            Isa::Avx2 => self.a.vpslld(YMM[d], YMM[x], n),
        }
    }
    fn sqrt(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vsqrtps(ZMM[d], ZMM[x]),
            Isa::Avx2 => self.a.vsqrtps(YMM[d], YMM[x]),
        }
    }
    /// Round to an integer by `mode` (0x08 nearest even, 0x09 floor, 0x0A ceil, 0x0B
    /// truncate, the precision exception suppressed).
    fn round(&mut self, d: V, x: V, mode: i32) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vrndscaleps(ZMM[d], ZMM[x], mode),
            Isa::Avx2 => self.a.vroundps(YMM[d], YMM[x], mode),
        }
    }
    /// `d = x` rounded to f16 and back.
    fn round_f16(&mut self, d: V, x: V) -> R<()> {
        let t = self.isa.t(0);
        match self.isa {
            Isa::Avx512 => {
                self.a.vcvtps2ph(YMM[t], ZMM[x], 0)?;
                self.a.vcvtph2ps(ZMM[d], YMM[t])
            }
            Isa::Avx2 => {
                self.a.vcvtps2ph(XMM[t], YMM[x], 0)?;
                self.a.vcvtph2ps(YMM[d], XMM[t])
            }
        }
    }
    /// The mask `x pr y`.
    fn cmp(&mut self, x: V, y: Opnd, pr: i32) -> R<()> {
        match (self.isa, y) {
            (Isa::Avx512, Opnd::Reg(y)) => self.a.vcmpps(k2, ZMM[x], ZMM[y], pr),
            (Isa::Avx2, Opnd::Reg(y)) => self.a.vcmpps(YMM[AVX2_MASK], YMM[x], YMM[y], pr),
            (isa, c) => {
                let bits = match c {
                    Opnd::Const(v) => v.to_bits(),
                    Opnd::Bits(b) => b,
                    Opnd::Reg(_) => unreachable!("matched above"),
                };
                let m = self.bits_mem(bits);
                match isa {
                    Isa::Avx512 => self.a.vcmpps(k2, ZMM[x], m, pr),
                    Isa::Avx2 => self.a.vcmpps(YMM[AVX2_MASK], YMM[x], m, pr),
                }
            }
        }
    }
    /// `d = mask ? x : d`.
    fn mov_if(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d].k2(), ZMM[x]),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[d], YMM[x], YMM[AVX2_MASK]),
        }
    }
    /// `d = mask ? x : 0`.
    fn mov_if_z(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d].k2().z(), ZMM[x]),
            Isa::Avx2 => self.a.vandps(YMM[d], YMM[AVX2_MASK], YMM[x]),
        }
    }
    /// `d = mask ? c : d`.
    fn const_if(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d].k2(), dword_ptr(l)),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[d], ymmword_ptr(l), YMM[AVX2_MASK]),
        }
    }
    /// `d = mask ? c : 0`.
    fn const_if_z(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d].k2().z(), dword_ptr(l)),
            Isa::Avx2 => self.a.vandps(YMM[d], YMM[AVX2_MASK], ymmword_ptr(l)),
        }
    }
    /// `d = mask ? x : y`.
    fn blend(&mut self, d: V, x: V, y: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vblendmps(ZMM[d].k2(), ZMM[y], ZMM[x]),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[y], YMM[x], YMM[AVX2_MASK]),
        }
    }
    /// `o` in a register (a constant is broadcast into `scratch`).
    fn reg_of(&mut self, o: Opnd, scratch: V) -> R<V> {
        Ok(match o {
            Opnd::Reg(r) => r,
            Opnd::Const(c) => {
                self.splat(scratch, c)?;
                scratch
            }
            Opnd::Bits(b) => {
                self.splat(scratch, f32::from_bits(b))?;
                scratch
            }
        })
    }
    /// AVX2: the tail's lane mask (from the stack) into the mask register.
    fn tail_mask(&mut self) -> R<()> {
        self.a.vmovups(YMM[AVX2_MASK], ymmword_ptr(rsp + FRAME_TAIL_MASK))
    }
}

fn assemble(kernels: &[&Spec]) -> Result<(Module, Vec<Entry>), String> {
    let e = |e: IcedError| e.to_string();
    let isa = self::isa().ok_or("no JIT on this machine")?;
    let mut a = CodeAssembler::new(64).map_err(e)?;
    // AVX-512: EVEX wherever an instruction has both encodings (the code uses xmm/ymm
    // 16-31); AVX2: VEX only.
    a.set_prefer_vex(isa == Isa::Avx2);
    let mut em = Em { a: &mut a, pool: Pool { labels: HashMap::new(), iota: None }, isa };
    let mut labels = Vec::with_capacity(kernels.len());
    for k in kernels {
        let mut l = em.a.create_label();
        em.a.set_label(&mut l).map_err(e)?;
        kernel(&mut em, k).map_err(e)?;
        labels.push(l);
    }
    let pool = std::mem::replace(&mut em.pool, Pool { labels: HashMap::new(), iota: None });
    pool.emit(em.a, isa).map_err(e)?;
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
fn kernel(em: &mut Em, p: &Spec) -> R<()> {
    let n_acc = p.accesses();
    let lanes = em.isa.lanes() as i32;
    {
        let a = &mut *em.a;
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
    }
    let mut row = em.a.create_label();
    let mut vec_loop = em.a.create_label();
    let mut tail = em.a.create_label();
    let mut row_end = em.a.create_label();
    let mut done = em.a.create_label();
    em.a.test(rdx, rdx)?;
    em.a.jz(done)?;
    em.a.set_label(&mut row)?;
    em.a.xor(r10d, r10d)?;
    row_start(em, p)?;
    // Full vectors unmasked, then one masked tail (a body masked on every vector ran
    // about 35% slower on the bench machine, so long bodies are emitted twice too).
    em.a.mov(r11, rcx)?;
    em.a.sub(r11, lanes)?;
    em.a.set_label(&mut vec_loop)?;
    em.a.cmp(r10, r11)?;
    em.a.jg(tail)?;
    body(em, p, false)?;
    em.a.add(r10, lanes)?;
    em.a.jmp(vec_loop)?;
    em.a.set_label(&mut tail)?;
    em.a.mov(rax, rcx)?;
    em.a.sub(rax, r10)?;
    em.a.jle(row_end)?;
    match em.isa {
        Isa::Avx512 => {
            em.a.mov(r9d, -1)?;
            em.a.bzhi(r9d, r9d, eax)?;
            em.a.kmovw(k1, r9d)?;
        }
        Isa::Avx2 => {
            // Lanes below the count: iota < count, kept on the stack.
            let iota = *em.pool.iota.get_or_insert_with(|| em.a.create_label());
            let m = YMM[AVX2_MASK];
            em.a.vmovd(XMM[AVX2_MASK], eax)?;
            em.a.vpbroadcastd(m, XMM[AVX2_MASK])?;
            em.a.vpcmpgtd(m, m, ymmword_ptr(iota))?;
            em.a.vmovups(ymmword_ptr(rsp + FRAME_TAIL_MASK), m)?;
        }
    }
    body(em, p, true)?;
    em.a.set_label(&mut row_end)?;
    row_finish(em, p)?;
    let a = &mut *em.a;
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

// AVX-512 reduction registers: a row's two f64 partial sums (or its running extreme
// in `RED_M`, with `k5` the lanes that saw a NaN), and scratch for combining them.
const RED_A0: AsmRegisterZmm = zmm20;
const RED_A1: AsmRegisterZmm = zmm21;
const RED_M: AsmRegisterZmm = zmm20;
const RED_T: AsmRegisterZmm = zmm22;
const RED_U: AsmRegisterZmm = zmm23;
// AVX2 reduction registers: a row's partial sums of lanes 0-3 and 4-7 (f64), above
// the body's values.
const RED2_A0: AsmRegisterYmm = ymm5;
const RED2_A1: AsmRegisterYmm = ymm6;

/// A reduction over the run's row starts afresh (the accumulated row, for a reduced
/// inner dim, as [`super::exec`]'s `sum_f64` / `extreme` start).
fn row_start(em: &mut Em, p: &Spec) -> R<()> {
    let a = &mut *em.a;
    match (em.isa, p.reduce) {
        (Isa::Avx512, Some((ReduceOp::Sum | ReduceOp::Mean, _, 0))) => {
            a.vxorpd(RED_A0, RED_A0, RED_A0)?;
            a.vxorpd(RED_A1, RED_A1, RED_A1)
        }
        (Isa::Avx512, Some((ReduceOp::Amax | ReduceOp::Amin, _, 0))) => a.kxorw(k5, k5, k5),
        (Isa::Avx2, Some((ReduceOp::Sum | ReduceOp::Mean, _, 0))) => {
            a.vxorpd(RED2_A0, RED2_A0, RED2_A0)?;
            a.vxorpd(RED2_A1, RED2_A1, RED2_A1)
        }
        _ => Ok(()),
    }
}

/// Accumulate one vector of the reduced value (the tail's lanes when `masked`).
fn accumulate(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    match em.isa {
        Isa::Avx512 => accumulate_avx512(em.a, p, masked),
        Isa::Avx2 => accumulate_avx2(em, p, masked),
    }
}

fn accumulate_avx512(a: &mut CodeAssembler, p: &Spec, masked: bool) -> R<()> {
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
            a.vcvtps2pd(RED_T, YMM[value])?;
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
            a.vbroadcastss(RED_M, XMM[value])?;
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
                    YMM[value]
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
            Ok(())
        }
    }
}

/// AVX2 covers sums and means (`Spec::check`): over a reduced inner dim as the
/// interpreter's `sum_f64` without AVX-512 (lanes 0-3 and 4-7 of full vectors into two
/// f64 partial sums; the tail's values added one by one after the lanes combine, in
/// `row_finish`), over a kept inner dim one f64 accumulator per lane.
fn accumulate_avx2(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    let Some((_, value, dst_inner)) = p.reduce else { return Ok(()) };
    let (t0, t1) = (em.isa.t(0), em.isa.t(1));
    let acc = addr(em.a, p.body.loads.len())?;
    if dst_inner == 0 {
        if masked {
            // The tail's values, for `row_finish` to add one by one.
            return em.a.vmovups(ymmword_ptr(rsp + FRAME_TAIL_VALUE), YMM[value]);
        }
        let a = &mut *em.a;
        a.vcvtps2pd(YMM[t0], XMM[value])?;
        a.vaddpd(RED2_A0, RED2_A0, YMM[t0])?;
        a.vextractf128(XMM[t1], YMM[value], 1)?;
        a.vcvtps2pd(YMM[t0], XMM[t1])?;
        return a.vaddpd(RED2_A1, RED2_A1, YMM[t0]);
    }
    // Kept inner dim: lanes 0-3 then 4-7, each `acc[j] + x` in f64.
    let (t2, t3) = (em.isa.t(2), em.isa.t(3));
    if masked {
        em.tail_mask()?;
    }
    let a = &mut *em.a;
    for half in 0..2i32 {
        if half == 0 {
            a.vcvtps2pd(YMM[t0], XMM[value])?;
        } else {
            a.vextractf128(XMM[t1], YMM[value], 1)?;
            a.vcvtps2pd(YMM[t0], XMM[t1])?;
        }
        let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
        if masked {
            // The half's four 64-bit lane masks from the tail's 32-bit ones.
            if half == 0 {
                a.vpmovsxdq(YMM[t2], XMM[AVX2_MASK])?;
            } else {
                a.vextracti128(XMM[t3], YMM[AVX2_MASK], 1)?;
                a.vpmovsxdq(YMM[t2], XMM[t3])?;
            }
            a.vmaskmovpd(YMM[t3], YMM[t2], at)?;
            a.vaddpd(YMM[t3], YMM[t3], YMM[t0])?;
            let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
            a.vmaskmovpd(at, YMM[t2], YMM[t3])?;
        } else {
            a.vmovupd(YMM[t3], at)?;
            a.vaddpd(YMM[t3], YMM[t3], YMM[t0])?;
            let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
            a.vmovupd(at, YMM[t3])?;
        }
    }
    Ok(())
}

/// Fold a reduced row into its accumulator, as [`super::exec`] does after `sum_f64`
/// or `extreme` (lanes combined in one fixed order, then `acc + s` or
/// `combine_extreme(acc, m)`).
fn row_finish(em: &mut Em, p: &Spec) -> R<()> {
    let Some((op, _, 0)) = p.reduce else { return Ok(()) };
    if em.isa == Isa::Avx2 {
        return row_finish_avx2(em, p);
    }
    let acc = addr(em.a, p.body.loads.len())?;
    let a = &mut *em.a;
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
            let nan = em.pool.label(a, f32::NAN.to_bits());
            a.vmovss(xmm20, dword_ptr(nan))?;
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

/// `s = ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`, then the tail's values one
/// by one, then `acc + s`: the interpreter's `sum_f64` over the run.
fn row_finish_avx2(em: &mut Em, p: &Spec) -> R<()> {
    let (t0, t1) = (em.isa.t(0), em.isa.t(1));
    let acc = addr(em.a, p.body.loads.len())?;
    let a = &mut *em.a;
    a.vaddpd(RED2_A0, RED2_A0, RED2_A1)?; // [l0+l4, l1+l5, l2+l6, l3+l7]
    a.vextractf128(XMM[t0], RED2_A0, 1)?; // [l2+l6, l3+l7]
    a.vunpckhpd(XMM[t1], XMM[5], XMM[5])?; // l1+l5
    a.vaddsd(XMM[t1], XMM[5], XMM[t1])?; // (l0+l4) + (l1+l5)
    let hi = XMM[em.isa.t(2)];
    a.vunpckhpd(hi, XMM[t0], XMM[t0])?; // l3+l7
    a.vaddsd(XMM[t0], XMM[t0], hi)?; // (l2+l6) + (l3+l7)
    a.vaddsd(XMM[t1], XMM[t1], XMM[t0])?;
    // The tail's values (rax = count when the run had a tail: r10 stopped short).
    let mut no_tail = a.create_label();
    let mut next = a.create_label();
    a.mov(rax, rcx)?;
    a.sub(rax, r10)?;
    a.jle(no_tail)?;
    a.xor(r9d, r9d)?;
    a.set_label(&mut next)?;
    a.vmovss(XMM[t0], dword_ptr(rsp + r9 * 4 + FRAME_TAIL_VALUE))?;
    a.vcvtss2sd(XMM[t0], XMM[t0], XMM[t0])?;
    a.vaddsd(XMM[t1], XMM[t1], XMM[t0])?;
    a.inc(r9)?;
    a.cmp(r9, rax)?;
    a.jl(next)?;
    a.set_label(&mut no_tail)?;
    a.vmovsd(XMM[t0], qword_ptr(acc))?;
    a.vaddsd(XMM[t0], XMM[t0], XMM[t1])?;
    a.vmovsd(qword_ptr(acc), XMM[t0])
}

/// The body over one vector of lanes (`masked`: the run's tail lanes).
fn body(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    let nl = p.body.loads.len();
    let t0 = em.isa.t(0);
    for ins in &p.body.instrs {
        match ins {
            LInstr::Load { load, d } => load_vec(em, *load, p.load_inner[*load], *d, masked)?,
            LInstr::Fill { v, d } => em.splat(*d, *v as f32)?,
            LInstr::Unary { op, a: x, d } => unary(em, *op, *x, *d)?,
            LInstr::Binary { op, a: x, b: y, d } => binary(em, *op, opnd(x), opnd(y), *d)?,
            LInstr::Compare { op, a: x, b: y, d } => {
                let x = em.reg_of(opnd(x), t0)?;
                let pr = match op {
                    CmpOp::Eq => pred::EQ_OQ,
                    CmpOp::Ne => pred::NEQ_UQ,
                    CmpOp::Lt => pred::LT_OQ,
                    CmpOp::Le => pred::LE_OQ,
                    CmpOp::Gt => pred::GT_OQ,
                    CmpOp::Ge => pred::GE_OQ,
                };
                em.cmp(x, opnd(y), pr)?;
                em.const_if_z(*d, 1.0)?;
            }
            LInstr::Where { c, a: x, b: y, d } => {
                em.cmp(*c, Opnd::Const(0.0), pred::NEQ_UQ)?;
                em.blend(*d, *x, *y)?;
            }
            LInstr::Clamp { a: x, lo, hi, d } => {
                em.mov(*d, *x)?;
                // Lanes below `lo` (above `hi`) take the bound; NaN compares false.
                for (bound, pr) in [(lo, pred::LT_OQ), (hi, pred::GT_OQ)] {
                    if let Some(b) = bound {
                        em.cmp(*d, Opnd::Const(*b as f32), pr)?;
                        em.const_if(*d, *b as f32)?;
                    }
                }
            }
            LInstr::Round { dtype, a: x, d } => match dtype {
                DType::F16 => em.round_f16(*d, *x)?,
                DType::Bool => {
                    em.cmp(*x, Opnd::Const(0.0), pred::NEQ_UQ)?;
                    em.const_if_z(*d, 1.0)?;
                }
                _ => em.mov(*d, *x)?,
            },
        }
    }
    if masked && em.isa == Isa::Avx2 && !p.stores.is_empty() {
        em.tail_mask()?;
    }
    for (s, reg) in p.stores.iter().enumerate() {
        let base = addr(em.a, nl + s)?;
        match (em.isa, masked) {
            (Isa::Avx512, false) => em.a.vmovups(zmmword_ptr(base + r10 * 4), ZMM[*reg])?,
            (Isa::Avx512, true) => em.a.vmovups(zmmword_ptr(base + r10 * 4).k1(), ZMM[*reg])?,
            (Isa::Avx2, false) => em.a.vmovups(ymmword_ptr(base + r10 * 4), YMM[*reg])?,
            (Isa::Avx2, true) => em.a.vmaskmovps(ymmword_ptr(base + r10 * 4), YMM[AVX2_MASK], YMM[*reg])?,
        }
    }
    accumulate(em, p, masked)
}

fn load_vec(em: &mut Em, acc: usize, stride: usize, d: V, masked: bool) -> R<()> {
    let base = addr(em.a, acc)?;
    let isa = em.isa;
    match (isa, stride) {
        (Isa::Avx512, 0) => em.a.vbroadcastss(ZMM[d], dword_ptr(base)),
        (Isa::Avx2, 0) => em.a.vbroadcastss(YMM[d], dword_ptr(base)),
        (Isa::Avx512, 1) => {
            let at = zmmword_ptr(base + r10 * 4);
            if masked {
                em.a.vmovups(ZMM[d].k1().z(), at)
            } else {
                em.a.vmovups(ZMM[d], at)
            }
        }
        (Isa::Avx2, 1) => {
            let at = ymmword_ptr(base + r10 * 4);
            if masked {
                em.tail_mask()?;
                em.a.vmaskmovps(YMM[d], YMM[AVX2_MASK], at)
            } else {
                em.a.vmovups(YMM[d], at)
            }
        }
        (_, s) => {
            // Lane l reads element (i + l) * s (masked-off lanes: zero).
            let iota = *em.pool.iota.get_or_insert_with(|| em.a.create_label());
            let stride = em.bits_mem(s as u32);
            let (ix, gm) = (isa.t(7), isa.t(6));
            match isa {
                Isa::Avx512 => {
                    let a = &mut *em.a;
                    a.vpbroadcastd(ZMM[ix], r10d)?;
                    a.vpaddd(ZMM[ix], ZMM[ix], zmmword_ptr(iota))?;
                    a.vpmulld(ZMM[ix], ZMM[ix], stride)?;
                    if masked {
                        a.kmovw(k3, k1)?;
                    } else {
                        a.kxnorw(k3, k3, k3)?;
                    }
                    a.vxorps(ZMM[d], ZMM[d], ZMM[d])?;
                    a.vgatherdps(ZMM[d].k3(), zmmword_ptr(base + ZMM[ix] * 4))
                }
                Isa::Avx2 => {
                    if masked {
                        em.a.vmovups(YMM[gm], ymmword_ptr(rsp + FRAME_TAIL_MASK))?;
                    }
                    let a = &mut *em.a;
                    a.vmovd(XMM[ix], r10d)?;
                    a.vpbroadcastd(YMM[ix], XMM[ix])?;
                    a.vpaddd(YMM[ix], YMM[ix], ymmword_ptr(iota))?;
                    a.vpmulld(YMM[ix], YMM[ix], stride)?;
                    if !masked {
                        a.vpcmpeqd(YMM[gm], YMM[gm], YMM[gm])?;
                    }
                    a.vxorps(YMM[d], YMM[d], YMM[d])?;
                    a.vgatherdps_3(YMM[d], dword_ptr(base + YMM[ix] * 4), YMM[gm])
                }
            }
        }
    }
}

fn binary(em: &mut Em, op: BinaryOp, x: Opnd, y: Opnd, d: V) -> R<()> {
    let t0 = em.isa.t(0);
    let x = em.reg_of(x, t0)?;
    match op {
        BinaryOp::Pow => {
            let Opnd::Const(c) = y else { unreachable!("`covers` admits constant exponents only") };
            if c == 1.0 {
                em.mov(d, x)
            } else if c == 2.0 {
                em.mul(d, x, Opnd::Reg(x))
            } else if c == 3.0 {
                em.mul(d, x, Opnd::Reg(x))?;
                em.mul(d, d, Opnd::Reg(x))
            } else {
                em.splat(d, 1.0)?;
                em.div(d, d, Opnd::Reg(x))
            }
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // NaN on either side gives NaN: the instruction returns the second source
            // when either is NaN, so a NaN first source is put back after.
            if op == BinaryOp::Maximum {
                em.max(d, x, y)?;
            } else {
                em.min(d, x, y)?;
            }
            em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
            em.mov_if(d, x)
        }
        BinaryOp::Add => em.add(d, x, y),
        BinaryOp::Sub => em.sub(d, x, y),
        BinaryOp::Mul => em.mul(d, x, y),
        BinaryOp::Div => em.div(d, x, y),
    }
}

fn unary(em: &mut Em, op: UnaryOp, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (t0, t5, t6) = (t(0), t(5), t(6));
    match op {
        UnaryOp::Neg => em.xor(d, x, Opnd::Bits(0x8000_0000)),
        UnaryOp::Abs => em.and(d, x, Opnd::Bits(0x7fff_ffff)),
        UnaryOp::Sqrt => em.sqrt(d, x),
        UnaryOp::Rsqrt => {
            em.sqrt(t0, x)?;
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(t0))
        }
        UnaryOp::Reciprocal => {
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(x))
        }
        UnaryOp::Relu => {
            // x when x > 0 or NaN, else +0.
            em.cmp(x, Opnd::Const(0.0), pred::NLE_UQ)?;
            em.mov_if_z(d, x)
        }
        UnaryOp::Sign => {
            em.zero(d)?;
            em.cmp(x, Opnd::Const(0.0), pred::GT_OQ)?;
            em.const_if(d, 1.0)?;
            em.cmp(x, Opnd::Const(0.0), pred::LT_OQ)?;
            em.const_if(d, -1.0)
        }
        UnaryOp::LogicalNot => {
            em.cmp(x, Opnd::Const(0.0), pred::EQ_OQ)?;
            em.const_if_z(d, 1.0)
        }
        UnaryOp::Floor => em.round(d, x, 0x09),
        UnaryOp::Ceil => em.round(d, x, 0x0A),
        UnaryOp::Trunc => em.round(d, x, 0x0B),
        UnaryOp::Round => em.round(d, x, 0x08),
        UnaryOp::Exp => exp(em, x, d, [t(0), t(1), t(2), t(3), t(4)]),
        UnaryOp::Sigmoid => {
            // 1 / (1 + exp(-x))
            em.xor(t5, x, Opnd::Bits(0x8000_0000))?;
            exp(em, t5, t6, [t(0), t(1), t(2), t(3), t(4)])?;
            em.add(t6, t6, Opnd::Const(1.0))?;
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(t6))
        }
        UnaryOp::Erf => erf(em, x, d),
        UnaryOp::Tanh => tanh(em, x, d),
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1 => {
            unreachable!("`covers` rejects {op:?}")
        }
    }
}

/// `d = d * z` then `d = d + c` as separate roundings (Rust never fuses them).
fn horner_step(em: &mut Em, d: V, z: V, add: f32) -> R<()> {
    em.mul(d, d, Opnd::Reg(z))?;
    em.add(d, d, Opnd::Const(add))
}

/// `d = exp(x)` as [`super::math::exp_f32`]; `t` are scratch registers distinct from
/// `x` and `d`.
fn exp(em: &mut Em, x: V, d: V, t: [V; 5]) -> R<()> {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0;
    // xc = clamp(x, -87, 88) (a NaN lane is replaced at the end).
    em.max(t[0], x, Opnd::Const(-87.0))?;
    em.min(t[0], t[0], Opnd::Const(88.0))?;
    // t = xc * log2e + magic; n = t - magic
    em.mul(t[1], t[0], Opnd::Const(LOG2E))?;
    em.add(t[1], t[1], Opnd::Const(MAGIC))?;
    em.sub(t[2], t[1], Opnd::Const(MAGIC))?;
    // 2^n from t's low mantissa bits.
    em.isub(t[3], t[1], Opnd::Bits(0x4B40_0000))?;
    em.iadd(t[3], t[3], Opnd::Bits(127))?;
    em.shl(t[3], t[3], 23)?;
    // r = (xc - n * ln2_hi) - n * ln2_lo
    em.mul(t[4], t[2], Opnd::Const(0.693_145_75))?;
    em.sub(t[0], t[0], Opnd::Reg(t[4]))?;
    em.mul(t[4], t[2], Opnd::Const(1.428_606_8e-6))?;
    em.sub(t[0], t[0], Opnd::Reg(t[4]))?;
    // p = 1 + r * (1 + r * (0.5 + r * (...)))
    em.mul(t[1], t[0], Opnd::Const(0.000_198_412_7))?;
    em.add(t[1], t[1], Opnd::Const(0.001_388_889))?;
    for c in [0.008_333_334, 0.041_666_668, 0.166_666_67, 0.5, 1.0, 1.0] {
        horner_step(em, t[1], t[0], c)?;
    }
    em.mul(d, t[1], Opnd::Reg(t[3]))?;
    em.cmp(x, Opnd::Const(88.72), pred::GT_OQ)?;
    em.const_if(d, f32::INFINITY)?;
    em.cmp(x, Opnd::Const(-87.33), pred::LT_OQ)?;
    em.const_if(d, 0.0)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

/// `d = erf(x)` as [`super::math::erf_f32`].
fn erf(em: &mut Em, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (c, z, p, q, t4, t5) = (t(0), t(1), t(2), t(3), t(4), t(5));
    em.max(c, x, Opnd::Const(-4.0))?;
    em.min(c, c, Opnd::Const(4.0))?;
    em.mul(z, c, Opnd::Reg(c))?;
    em.mul(p, z, Opnd::Const(-2.726_142_3e-10))?;
    em.add(p, p, Opnd::Const(2.770_681_4e-8))?;
    for k in [-2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_6e-3, -1.609_603_3e-2] {
        horner_step(em, p, z, k)?;
    }
    em.mul(p, p, Opnd::Reg(c))?;
    em.mul(q, z, Opnd::Const(-1.456_607_2e-5))?;
    em.add(q, q, Opnd::Const(-2.133_740_6e-4))?;
    for k in [-1.682_827e-3, -7.373_329_2e-3, -1.426_474e-2] {
        horner_step(em, q, z, k)?;
    }
    em.div(d, p, Opnd::Reg(q))?;
    // |c| > 3.92: ±1 with x's sign.
    em.and(t4, c, Opnd::Bits(0x7fff_ffff))?;
    em.cmp(t4, Opnd::Const(3.92), pred::GT_OQ)?;
    em.and(t5, x, Opnd::Bits(0x8000_0000))?;
    em.or(t5, t5, Opnd::Bits(1f32.to_bits()))?;
    em.mov_if(d, t5)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

/// `d = tanh(x)` as [`super::math::tanh_f32`].
fn tanh(em: &mut Em, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (abs, e, z2) = (t(5), t(6), t(7));
    // a = min(|x|, 20) (Rust's min: a NaN |x| gives 20; NaN lanes are replaced below).
    em.and(abs, x, Opnd::Bits(0x7fff_ffff))?;
    em.min(abs, abs, Opnd::Const(20.0))?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.const_if(abs, 20.0)?;
    em.add(z2, abs, Opnd::Reg(abs))?;
    exp(em, z2, e, [t(0), t(1), t(2), t(3), t(4)])?;
    // big = copysign(1 - 2 / (e + 1), x)
    em.add(e, e, Opnd::Const(1.0))?;
    em.splat(d, 2.0)?;
    em.div(d, d, Opnd::Reg(e))?;
    em.splat(e, 1.0)?;
    em.sub(d, e, Opnd::Reg(d))?;
    em.and(d, d, Opnd::Bits(0x7fff_ffff))?;
    em.and(e, x, Opnd::Bits(0x8000_0000))?;
    em.or(d, d, Opnd::Reg(e))?;
    // small = x * (1 + z2 * (...)) for a < 0.125
    em.mul(z2, x, Opnd::Reg(x))?;
    em.mul(e, z2, Opnd::Const(0.021_869_488))?;
    em.add(e, e, Opnd::Const(-0.053_968_254))?;
    for k in [0.133_333_34, -0.333_333_34, 1.0] {
        horner_step(em, e, z2, k)?;
    }
    em.mul(e, e, Opnd::Reg(x))?;
    em.cmp(abs, Opnd::Const(0.125), pred::LT_OQ)?;
    em.mov_if(d, e)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

/// Elements per tile handed to a compiled kernel (see [`CPU_JIT_BLOCK`]).
pub(crate) const BLOCK: usize = CPU_JIT_BLOCK;

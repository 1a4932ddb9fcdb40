//! Executing lowered kernels: block-wise evaluation of fused bodies (each instruction a
//! tight loop over up to [`BLK`] elements of a contiguous run, which the compiler
//! vectorizes), reductions with f64 accumulators, matmuls through the `gemm` crate with
//! the epilogue applied per row panel while it is hot, and extern ops through the
//! reference kernels.
//!
//! Buffers are raw pointers for the duration of one kernel. Safety rests on the
//! lowering's checks: every access stays inside its buffer (`Lowered::input_need`,
//! extents), a kernel never writes a buffer it reads (liveness in the buffer plan;
//! an epilogue only reads the matmul result element by element where it writes), and
//! parallel tasks write disjoint ranges of the output.

use super::lower::{CAccess, CBody, CMatmul, CPointwise, CReduce, CRows, CStage, LInstr, Src};
use super::math::{Num, Storable};
use crate::{CpuError, Result};
use aotgrad_fusion::Compute;
use aotgrad_ir::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use half::{bf16, f16};

/// Elements per block of a fused body.
pub(crate) const BLK: usize = 512;
/// Elements per tile handed to a compiled (JIT) kernel: its values live in vector
/// registers, so a tile only bounds the work between two calls.
pub(crate) const CPU_JIT_BLOCK: usize = 16 * 1024;
/// Distance between registers in the register file: a block plus padding, so two
/// registers never sit a multiple of 4 KiB apart (4K aliasing stalls loads after stores).
const RSTRIDE: usize = BLK + 16;

/// A buffer as one kernel sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw {
    pub ptr: *mut u8,
    pub dtype: DType,
}
// SAFETY: `Raw` is only handed to the tasks of one kernel, which read disjoint or
// read-only memory (see the module docs).
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Raw {
    pub(crate) const NONE: Raw = Raw { ptr: std::ptr::null_mut(), dtype: DType::F32 };

    /// The pointer as f64s (a method, so that closures capture the whole `Raw`,
    /// which is `Sync`, rather than its pointer field).
    fn as_f64(self) -> *mut f64 {
        self.ptr as *mut f64
    }
}

/// Run `f` on `[lo, hi)` chunks of `0..total` on up to `threads` tasks (on the pool
/// this thread entered, see [`super::pool`]).
pub(crate) fn par_chunks(total: usize, threads: usize, min_chunk: usize, f: impl Fn(usize, usize) + Sync) {
    let tasks = if threads <= 1 { 1 } else { (total / min_chunk.max(1)).clamp(1, threads * 4) };
    par_tasks(tasks, |c| f(c * total / tasks, (c + 1) * total / tasks));
}

pub(crate) use super::pool::par_tasks;

// ---- register files -------------------------------------------------------------------

thread_local! {
    /// This thread's register file, reused by every kernel call it runs.
    static REGS: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` with a register file of `n` elements of `T`, reused across calls on this
/// thread (a row group calls its stages once per block: no allocation per call). Its
/// contents are stale: a body writes every register before it reads it.
#[inline(always)]
fn with_regs<T: Num, R>(n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let mut v = REGS.with(|c| c.take());
    let words = (n * std::mem::size_of::<T>()).div_ceil(8);
    if v.len() < words {
        v.resize(words, 0.0);
    }
    // SAFETY: `T` is f32 or f64 (the `Num` types): the f64 storage is aligned for it,
    // covers `n` elements, and every bit pattern is a valid value.
    let regs = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut T, n) };
    let r = f(regs);
    REGS.with(|c| c.set(v));
    r
}

// ---- loads and stores ---------------------------------------------------------------

/// # Safety
/// `p` points to a buffer of `S` holding `off + (n-1)*stride`.
#[inline(always)]
unsafe fn load_typed<S: Storable, T: Num>(p: *const S, off: usize, stride: usize, out: &mut [T]) {
    // SAFETY: the caller guarantees the range is inside the buffer.
    unsafe {
        if stride == 1 {
            let s = std::slice::from_raw_parts(p.add(off), out.len());
            for (o, v) in out.iter_mut().zip(s) {
                *o = v.load();
            }
        } else if stride == 0 {
            let v: T = (*p.add(off)).load();
            out.fill(v);
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = (*p.add(off + i * stride)).load();
            }
        }
    }
}

/// # Safety
/// As [`load_typed`], and no other task writes the same elements.
#[inline(always)]
unsafe fn store_typed<S: Storable, T: Num>(p: *mut S, off: usize, stride: usize, vals: &[T]) {
    // SAFETY: the caller guarantees the range is inside the buffer and owned.
    unsafe {
        if stride == 1 {
            let s = std::slice::from_raw_parts_mut(p.add(off), vals.len());
            for (o, v) in s.iter_mut().zip(vals) {
                *o = S::store(*v);
            }
        } else {
            for (i, v) in vals.iter().enumerate() {
                *p.add(off + i * stride) = S::store(*v);
            }
        }
    }
}

macro_rules! by_dtype {
    ($raw:expr, $f:ident, $($args:expr),*) => {
        match $raw.dtype {
            DType::F32 => $f($raw.ptr as *mut f32, $($args),*),
            DType::F64 => $f($raw.ptr as *mut f64, $($args),*),
            DType::F16 => $f($raw.ptr as *mut f16, $($args),*),
            DType::BF16 => $f($raw.ptr as *mut bf16, $($args),*),
            DType::Bool => $f($raw.ptr as *mut bool, $($args),*),
            DType::I64 => $f($raw.ptr as *mut i64, $($args),*),
            DType::I32 => $f($raw.ptr as *mut i32, $($args),*),
        }
    };
}

// ---- instructions -------------------------------------------------------------------

enum V<'a, T> {
    S(&'a [T]),
    C(T),
}

#[inline(always)]
fn map1<T: Num>(d: &mut [T], a: &[T], f: impl Fn(T) -> T) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = f(x);
    }
}

#[inline(always)]
fn map2<T: Num>(d: &mut [T], a: V<'_, T>, b: V<'_, T>, f: impl Fn(T, T) -> T) {
    match (a, b) {
        (V::S(a), V::S(b)) => {
            for ((o, &x), &y) in d.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (V::S(a), V::C(y)) => {
            for (o, &x) in d.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (V::C(x), V::S(b)) => {
            for (o, &y) in d.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (V::C(x), V::C(y)) => d.fill(f(x, y)),
    }
}

#[inline(always)]
fn b2n<T: Num>(b: bool) -> T {
    if b {
        T::ONE
    } else {
        T::ZERO
    }
}

#[inline(always)]
fn unary<T: Num>(op: UnaryOp, d: &mut [T], a: &[T]) {
    let z = T::ZERO;
    let one = T::ONE;
    match op {
        UnaryOp::Neg => map1(
            d,
            a,
            #[inline(always)]
            |x| x.neg(),
        ),
        UnaryOp::Abs => map1(
            d,
            a,
            #[inline(always)]
            |x| x.abs(),
        ),
        UnaryOp::Exp => map1(
            d,
            a,
            #[inline(always)]
            |x| x.exp(),
        ),
        UnaryOp::Log => map1(
            d,
            a,
            #[inline(always)]
            |x| x.ln(),
        ),
        UnaryOp::Sqrt => map1(
            d,
            a,
            #[inline(always)]
            |x| x.sqrt(),
        ),
        UnaryOp::Rsqrt => map1(
            d,
            a,
            #[inline(always)]
            |x| one.div(x.sqrt()),
        ),
        UnaryOp::Sin => map1(
            d,
            a,
            #[inline(always)]
            |x| x.sin(),
        ),
        UnaryOp::Cos => map1(
            d,
            a,
            #[inline(always)]
            |x| x.cos(),
        ),
        UnaryOp::Tanh => map1(
            d,
            a,
            #[inline(always)]
            |x| x.tanh(),
        ),
        UnaryOp::Sigmoid => map1(
            d,
            a,
            #[inline(always)]
            |x| one.div(one.add(x.neg().exp())),
        ),
        UnaryOp::Relu => map1(
            d,
            a,
            #[inline(always)]
            |x| if x.is_nan() || x > z { x } else { z },
        ),
        UnaryOp::Erf => map1(
            d,
            a,
            #[inline(always)]
            |x| x.erf(),
        ),
        UnaryOp::Reciprocal => map1(
            d,
            a,
            #[inline(always)]
            |x| one.div(x),
        ),
        UnaryOp::Sign => map1(
            d,
            a,
            #[inline(always)]
            |x| {
                if x > z {
                    one
                } else if x < z {
                    one.neg()
                } else {
                    z
                }
            },
        ),
        UnaryOp::LogicalNot => map1(
            d,
            a,
            #[inline(always)]
            |x| b2n(x == z),
        ),
        UnaryOp::Floor => map1(d, a, T::floor),
        UnaryOp::Ceil => map1(d, a, T::ceil),
        UnaryOp::Round => map1(d, a, T::round_even),
        UnaryOp::Trunc => map1(d, a, T::trunc),
        UnaryOp::Log1p => map1(d, a, T::ln_1p),
        UnaryOp::Expm1 => map1(d, a, T::exp_m1),
    }
}

#[inline(always)]
fn binary<T: Num>(op: BinaryOp, d: &mut [T], a: V<'_, T>, b: V<'_, T>) {
    match op {
        BinaryOp::Add => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| x.add(y),
        ),
        BinaryOp::Sub => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| x.sub(y),
        ),
        BinaryOp::Mul => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| x.mul(y),
        ),
        BinaryOp::Div => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| x.div(y),
        ),
        BinaryOp::Pow => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| x.powf(y),
        ),
        BinaryOp::Maximum => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| {
                if x.is_nan() || y.is_nan() {
                    T::nan()
                } else if x > y {
                    x
                } else {
                    y
                }
            },
        ),
        BinaryOp::Minimum => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| {
                if x.is_nan() || y.is_nan() {
                    T::nan()
                } else if x < y {
                    x
                } else {
                    y
                }
            },
        ),
    }
}

#[inline(always)]
fn compare<T: Num>(op: CmpOp, d: &mut [T], a: V<'_, T>, b: V<'_, T>) {
    match op {
        CmpOp::Eq => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x == y),
        ),
        CmpOp::Ne => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x != y),
        ),
        CmpOp::Lt => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x < y),
        ),
        CmpOp::Le => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x <= y),
        ),
        CmpOp::Gt => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x > y),
        ),
        CmpOp::Ge => map2(
            d,
            a,
            b,
            #[inline(always)]
            |x, y| b2n(x >= y),
        ),
    }
}

/// Split the register file into the destination and up to three operands.
///
/// # Safety
/// `d` differs from every operand (operands may coincide with each other) and all are
/// below `regs.len() / RSTRIDE`.
#[inline(always)]
unsafe fn regs_split<T>(regs: &mut [T], n: usize, d: usize, ops: [usize; 3]) -> (&mut [T], [&[T]; 3]) {
    let base = regs.as_mut_ptr();
    // SAFETY: disjoint register slots (d is not an operand), in bounds (caller).
    unsafe {
        let dst = std::slice::from_raw_parts_mut(base.add(d * RSTRIDE), n);
        let o = ops.map(|r| std::slice::from_raw_parts(base.add(r * RSTRIDE) as *const T, n));
        (dst, o)
    }
}

/// Evaluate `body` for `n` elements; `offs[l]` is the base offset of load `l` and its
/// inner stride is `strides[l]`.
///
/// # Safety
/// `bufs` cover every access for these offsets.
#[inline(always)]
unsafe fn eval_block<T: Num>(body: &CBody, bufs: &[Raw], t: &Tile<'_>, regs: &mut [T]) {
    let (offs, inner, n) = (t.offs, t.inner, t.rows * t.len);
    let src = |s: &Src| match s {
        Src::Reg(r) => (*r, None),
        Src::Const(c) => (0, Some(T::from_f64(*c))),
    };
    for ins in &body.instrs {
        match ins {
            LInstr::Load { load, d } => {
                let acc = &body.loads[*load];
                let raw = bufs[acc.buf];
                let dst = &mut regs[d * RSTRIDE..d * RSTRIDE + n];
                let (off, st, ost) = (offs[*load], inner[*load], t.outer[*load]);
                if t.rows == 1 || (st == 0 && ost == 0) {
                    // SAFETY: the access is in bounds (caller).
                    unsafe { by_dtype!(raw, load_typed, off, if t.rows == 1 { st } else { 0 }, dst) };
                } else {
                    for (r, row) in dst.chunks_exact_mut(t.len).enumerate() {
                        // SAFETY: as above, row by row.
                        unsafe { by_dtype!(raw, load_typed, off + r * ost, st, row) };
                    }
                }
            }
            LInstr::Fill { v, d } => regs[d * RSTRIDE..d * RSTRIDE + n].fill(T::from_f64(*v)),
            LInstr::Unary { op, a, d } => {
                // SAFETY: the register allocator never writes an operand.
                let (dst, [x, _, _]) = unsafe { regs_split(regs, n, *d, [*a, *a, *a]) };
                unary(*op, dst, x);
            }
            LInstr::Binary { op, a, b, d } => {
                let ((ra, ca), (rb, cb)) = (src(a), src(b));
                // SAFETY: as above.
                let (dst, [x, y, _]) = unsafe { regs_split(regs, n, *d, [ra, rb, ra]) };
                binary(*op, dst, ca.map_or(V::S(x), V::C), cb.map_or(V::S(y), V::C));
            }
            LInstr::Compare { op, a, b, d } => {
                let ((ra, ca), (rb, cb)) = (src(a), src(b));
                // SAFETY: as above.
                let (dst, [x, y, _]) = unsafe { regs_split(regs, n, *d, [ra, rb, ra]) };
                compare(*op, dst, ca.map_or(V::S(x), V::C), cb.map_or(V::S(y), V::C));
            }
            LInstr::Where { c, a, b, d } => {
                // SAFETY: as above.
                let (dst, [c, x, y]) = unsafe { regs_split(regs, n, *d, [*c, *a, *b]) };
                for (((o, &c), &x), &y) in dst.iter_mut().zip(c).zip(x).zip(y) {
                    *o = if c != T::ZERO { x } else { y };
                }
            }
            LInstr::Clamp { a, lo, hi, d } => {
                // SAFETY: as above.
                let (dst, [x, _, _]) = unsafe { regs_split(regs, n, *d, [*a, *a, *a]) };
                let lo = lo.map(T::from_f64);
                let hi = hi.map(T::from_f64);
                map1(
                    dst,
                    x,
                    #[inline(always)]
                    |v| {
                        if v.is_nan() {
                            return v;
                        }
                        let v = match lo {
                            Some(l) if v < l => l,
                            _ => v,
                        };
                        match hi {
                            Some(h) if v > h => h,
                            _ => v,
                        }
                    },
                );
            }
            LInstr::Round { dtype, a, d } => {
                // SAFETY: as above.
                let (dst, [x, _, _]) = unsafe { regs_split(regs, n, *d, [*a, *a, *a]) };
                match dtype {
                    DType::F32 => map1(
                        dst,
                        x,
                        #[inline(always)]
                        |v| T::from_f32(v.to_f32()),
                    ),
                    DType::F16 => map1(
                        dst,
                        x,
                        #[inline(always)]
                        |v| T::from_f32(f16::from_f64(v.to_f64()).to_f32()),
                    ),
                    DType::BF16 => map1(
                        dst,
                        x,
                        #[inline(always)]
                        |v| T::from_f32(bf16::from_f64(v.to_f64()).to_f32()),
                    ),
                    DType::Bool => map1(
                        dst,
                        x,
                        #[inline(always)]
                        |v| b2n(v != T::ZERO),
                    ),
                    _ => map1(
                        dst,
                        x,
                        #[inline(always)]
                        |v| v,
                    ),
                }
            }
        }
    }
}

/// A block of elements: `rows` runs of `len` consecutive elements of the inner dim
/// (consecutive indices of the dim before it when `rows > 1`). For each access `k`:
/// `offs[k]` is the first element's offset, `inner[k]` the stride along a run,
/// `outer[k]` the stride from one run to the next.
struct Tile<'a> {
    offs: &'a [usize],
    inner: &'a [usize],
    outer: &'a [usize],
    rows: usize,
    len: usize,
}

/// Walk `[e0, e1)` of a coalesced iteration space in tiles of at most [`BLK`]
/// elements: one inner run (or part of one), or several whole short runs, so that a
/// short inner dim (a head dim of 32, a softmax row of 128) does not pay the
/// per-block overhead for a handful of elements.
#[inline(always)]
fn segments(shape: &[usize], accs: &[&CAccess], e0: usize, e1: usize, f: impl FnMut(&Tile<'_>)) {
    segments_of(BLK, shape, accs, e0, e1, f)
}

/// [`segments`] with tiles of up to `blk` elements.
#[inline(always)]
fn segments_of(blk: usize, shape: &[usize], accs: &[&CAccess], e0: usize, e1: usize, mut f: impl FnMut(&Tile<'_>)) {
    let rank = shape.len();
    let inner = shape[rank - 1];
    if inner == 0 {
        return;
    }
    let inner_strides: Vec<usize> = accs.iter().map(|a| a.strides[rank - 1]).collect();
    let outer_strides: Vec<usize> = accs.iter().map(|a| if rank >= 2 { a.strides[rank - 2] } else { 0 }).collect();
    let mut offs = vec![0usize; accs.len()];
    let mut e = e0;
    while e < e1 {
        let outer = e / inner;
        let j = e % inner;
        let mut rows = 1;
        let mut len = (inner - j).min(e1 - e).min(blk);
        if j == 0 && rank >= 2 && 2 * inner <= blk {
            let left_in_dim = shape[rank - 2] - outer % shape[rank - 2];
            let r = (blk / inner).min(left_in_dim).min((e1 - e) / inner);
            if r >= 2 {
                rows = r;
                len = inner;
            }
        }
        let mut rem = outer;
        for (k, a) in accs.iter().enumerate() {
            offs[k] = a.offset + j * a.strides[rank - 1];
        }
        for d in (0..rank - 1).rev() {
            let i = rem % shape[d];
            rem /= shape[d];
            for (k, a) in accs.iter().enumerate() {
                offs[k] += i * a.strides[d];
            }
        }
        f(&Tile { offs: &offs, inner: &inner_strides, outer: &outer_strides, rows, len });
        e += rows * len;
    }
}

/// Run a pointwise kernel over elements `[e0, e1)` of its iteration space.
///
/// # Safety
/// `bufs` hold every buffer the kernel touches; no other task writes `[e0, e1)`.
#[inline(always)]
unsafe fn pointwise_range_impl<T: Num>(k: &CPointwise, bufs: &[Raw], e0: usize, e1: usize) {
    let mut accs: Vec<&CAccess> = k.body.loads.iter().collect();
    accs.extend(k.stores.iter().map(|(_, a)| a));
    if let Some(j) = k.jit.as_ref().and_then(|s| s.get()) {
        // SAFETY: the caller's guarantees; the kernel was compiled for these accesses.
        unsafe { jit_range(k, j, &accs, bufs, e0, e1) };
        return;
    }
    let nl = k.body.loads.len();
    with_regs::<T, _>(
        k.body.nregs * RSTRIDE,
        #[inline(always)]
        |regs| {
            segments(
                &k.shape,
                &accs,
                e0,
                e1,
                #[inline(always)]
                |t| {
                    // SAFETY: the caller's guarantees.
                    unsafe {
                        eval_block(&k.body, bufs, t, regs);
                        let n = t.rows * t.len;
                        for (s, (reg, acc)) in k.stores.iter().enumerate() {
                            let raw = bufs[acc.buf];
                            let vals = &regs[reg * RSTRIDE..reg * RSTRIDE + n];
                            let (off, st, ost) = (t.offs[nl + s], t.inner[nl + s], t.outer[nl + s]);
                            for (r, row) in vals.chunks_exact(t.len).enumerate() {
                                by_dtype!(raw, store_typed, off + r * ost, st, row);
                            }
                        }
                    }
                },
            );
        },
    );
}

/// Run the compiled code of a pointwise kernel over elements `[e0, e1)`, tile by tile.
///
/// # Safety
/// As [`pointwise_range`]; `j` was compiled for `k` (f32 buffers, these inner strides).
unsafe fn jit_range(k: &CPointwise, j: &super::jit::JitKernel, accs: &[&CAccess], bufs: &[Raw], e0: usize, e1: usize) {
    // SAFETY: forwarded.
    unsafe { jit_tiles(super::jit::BLOCK, &k.shape, j, accs, bufs, None, e0, e1) }
}

/// Call compiled code on every tile of `[e0, e1)` (tiles of up to `blk` elements). With
/// `acc`, the last access indexes these f64 accumulators instead of its buffer.
///
/// # Safety
/// As [`jit_range`].
#[allow(clippy::too_many_arguments)]
unsafe fn jit_tiles(
    blk: usize,
    shape: &[usize],
    j: &super::jit::JitKernel,
    accs: &[&CAccess],
    bufs: &[Raw],
    acc: Option<Raw>,
    e0: usize,
    e1: usize,
) {
    let n = accs.len();
    let mut ptrs = [std::ptr::null_mut::<u8>(); 16];
    let mut outer = [0isize; 16];
    segments_of(blk, shape, accs, e0, e1, |t| {
        for a in 0..n {
            let (base, size) = match acc {
                Some(r) if a == n - 1 => (r.ptr, 8),
                _ => (bufs[accs[a].buf].ptr, 4),
            };
            // SAFETY: the offset is inside the buffer (bounds checked at lowering).
            ptrs[a] = unsafe { base.add(t.offs[a] * size) };
            outer[a] = (t.outer[a] * size) as isize;
        }
        // SAFETY: the compiled code reads and writes exactly the tile's elements of
        // these accesses, as the interpreter would.
        unsafe { (j.entry)(ptrs.as_ptr(), outer.as_ptr(), t.rows, t.len) };
    });
}

/// Run elements `[lo, hi)` of a pointwise kernel in its compute type.
///
/// # Safety
/// As [`pointwise_range`].
#[inline]
pub(crate) unsafe fn pointwise_span(k: &CPointwise, bufs: &[Raw], lo: usize, hi: usize) {
    // SAFETY: forwarded.
    unsafe {
        match k.body.compute {
            Compute::F32 => pointwise_range::<f32>(k, bufs, lo, hi),
            Compute::F64 => pointwise_range::<f64>(k, bufs, lo, hi),
        }
    }
}

/// Run a pointwise kernel on `threads` tasks.
///
/// # Safety
/// As [`pointwise_range`] for the whole space.
pub(crate) unsafe fn pointwise(k: &CPointwise, bufs: &[Raw], threads: usize) {
    let compiled = k.jit.as_ref().is_some_and(|s| s.get().is_some());
    // SAFETY: chunks are disjoint ranges of the output.
    par_chunks(k.numel, threads, task_elements(k, compiled), |lo, hi| unsafe { pointwise_span(k, bufs, lo, hi) });
}

/// Run independent pointwise kernels as one dispatch: their elements laid end to end,
/// split into tasks at once (each task runs the parts of every kernel its range
/// covers), so small kernels share the threads with large ones.
///
/// # Safety
/// As [`pointwise_range`] for each part, and no part writes what another touches
/// (checked when the plan is lowered or loaded).
pub(crate) unsafe fn group(parts: &[&CPointwise], bufs: &[Raw], threads: usize) {
    let total: usize = parts.iter().map(|p| p.numel).sum();
    let compiled = |p: &CPointwise| p.jit.as_ref().is_some_and(|s| s.get().is_some());
    let min = parts.iter().map(|p| task_elements(p, compiled(p))).min().unwrap_or(POINTWISE_TASK);
    par_chunks(total, threads, min, |lo, hi| {
        let mut start = 0;
        for p in parts {
            let (a, b) = (lo.max(start), hi.min(start + p.numel));
            if a < b {
                // SAFETY: `[a, b)` lies in this part's elements; tasks own disjoint ranges.
                unsafe { pointwise_span(p, bufs, a - start, b - start) }
            }
            start += p.numel;
        }
    });
}

/// Fewest elements per task of a pointwise kernel: [`POINTWISE_TASK_COMPILED`] for a
/// light compiled body ([`POINTWISE_TASK`] interpreted: compiled bodies run several
/// times faster, so a task must cover more elements before handing it to another
/// thread pays), fewer for a heavier one, so that a task always carries about the
/// same work (an optimizer update of 15 operations and 3 stores splits at 32K
/// elements, where a copy does not).
pub(crate) fn task_elements(k: &CPointwise, compiled: bool) -> usize {
    let min = if compiled { POINTWISE_TASK_COMPILED } else { POINTWISE_TASK };
    let work = k.body.instrs.len() + k.body.loads.len() + k.stores.len();
    (min * 4 / work.max(4)).max(min / 8)
}

/// Fewest elements of an interpreted pointwise kernel per task.
pub(crate) const POINTWISE_TASK: usize = 8 * 1024;
/// Fewest elements of a compiled pointwise kernel per task.
pub(crate) const POINTWISE_TASK_COMPILED: usize = 32 * 1024;

/// Instruction sets the hot loops are compiled for; the best one present is picked
/// once at run time (the build itself targets the baseline CPU).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Isa {
    Base,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Environment variable capping the instruction set the hot loops and the JIT use:
/// `avx2` (an AVX-512 machine runs the AVX2 code, so both paths can be tested on one
/// machine), `base` (neither), anything else or unset: the best one present.
pub const CPU_ISA_ENV: &str = "AOTGRAD_CPU_ISA";

pub(crate) fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = std::env::var(CPU_ISA_ENV).unwrap_or_default().trim().to_ascii_lowercase();
        #[cfg(target_arch = "x86_64")]
        {
            if cap == "base" {
                return Isa::Base;
            }
            if cap != "avx2"
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        let _ = cap;
        Isa::Base
    })
}

/// Defines `$name`, which runs `$imp` compiled for the best instruction set present.
macro_rules! multiversion {
    ($name:ident, $imp:ident, ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        /// As the implementation's.
        pub(crate) unsafe fn $name<T: Num>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
                unsafe fn v4<T: Num>($($arg: $ty),*) {
                    // SAFETY: forwarded.
                    unsafe { $imp::<T>($($arg),*) }
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3<T: Num>($($arg: $ty),*) {
                    // SAFETY: forwarded.
                    unsafe { $imp::<T>($($arg),*) }
                }
                match isa() {
                    // SAFETY: the features were detected.
                    Isa::Avx512 => return unsafe { v4::<T>($($arg),*) },
                    // SAFETY: the features were detected.
                    Isa::Avx2 => return unsafe { v3::<T>($($arg),*) },
                    Isa::Base => {}
                }
            }
            // SAFETY: forwarded.
            unsafe { $imp::<T>($($arg),*) }
        }
    };
}

multiversion!(pointwise_range, pointwise_range_impl, (k: &CPointwise, bufs: &[Raw], e0: usize, e1: usize));
multiversion!(reduce_range, reduce_range_impl, (k: &CReduce, bufs: &[Raw], acc: Raw, e0: usize, e1: usize));

// ---- reductions ---------------------------------------------------------------------

/// Run a reduction. `acc` is f64 scratch of at least `k.dst_extent` elements.
///
/// # Safety
/// `bufs` hold every buffer the kernel touches.
pub(crate) unsafe fn reduce(k: &CReduce, bufs: &[Raw], acc: &mut [f64], threads: usize) -> Result<()> {
    let numel: usize = k.shape.iter().product();
    let n_out = k.dst_extent;
    if k.count == 0 && matches!(k.op, ReduceOp::Amax | ReduceOp::Amin) && n_out > 0 {
        return Err(CpuError::kernel(
            k.op.name(),
            "cannot reduce over a dimension of size 0 (the operation has no identity)",
        ));
    }
    let init = reduce_init(k.op);
    let acc = &mut acc[..n_out];
    acc.fill(init);
    let acc_raw = Raw { ptr: acc.as_mut_ptr() as *mut u8, dtype: DType::F64 };
    let rank = k.shape.len();
    // Tasks split the leading dim when it is kept: each owns its outputs.
    let rest: usize = k.shape[1..].iter().product();
    let split = !k.reduced[0] && rank > 1;
    let run = |lo: usize, hi: usize| match k.body.compute {
        // SAFETY: disjoint outputs per task (leading dim kept) or one task.
        Compute::F32 => unsafe { reduce_range::<f32>(k, bufs, acc_raw, lo * rest, hi * rest) },
        Compute::F64 => unsafe { reduce_range::<f64>(k, bufs, acc_raw, lo * rest, hi * rest) },
    };
    if split {
        par_chunks(k.shape[0], threads, (64 * 1024 / rest.max(1)).max(1), run);
    } else if numel > 0 {
        // One task over everything (`rest` divides numel exactly when rank > 1).
        let run1 = |lo: usize, hi: usize| match k.body.compute {
            // SAFETY: a single task.
            Compute::F32 => unsafe { reduce_range::<f32>(k, bufs, acc_raw, lo, hi) },
            Compute::F64 => unsafe { reduce_range::<f64>(k, bufs, acc_raw, lo, hi) },
        };
        run1(0, numel);
    }
    // A mean divides by the elements it iterated; a sum over skipped broadcast dims
    // multiplies by their copies.
    let post: Option<Box<dyn Fn(f64) -> f64>> = match k.op {
        ReduceOp::Mean => {
            let n = k.count as f64;
            Some(Box::new(move |v| v / n))
        }
        ReduceOp::Sum if k.copies != 1.0 => {
            let c = k.copies;
            Some(Box::new(move |v| v * c))
        }
        _ => None,
    };
    let dst = bufs[k.dst.buf];
    // SAFETY: the destination holds `dst_extent` elements.
    unsafe {
        let acc_ptr = acc_raw.ptr as *const f64;
        let vals = std::slice::from_raw_parts(acc_ptr, n_out);
        match post {
            Some(f) => {
                let tmp: Vec<f64> = vals.iter().map(|&v| f(v)).collect();
                by_dtype!(dst, store_typed, 0, 1, &tmp[..]);
            }
            None => by_dtype!(dst, store_typed, 0, 1, vals),
        }
    }
    Ok(())
}

/// Elements of one block of a row group: every stage runs on this many before the
/// next block (a few buffers of it stay in the L2 cache). Measured on a softmax over
/// 8192 rows of 128: 2K-element blocks gain little over separate kernels, 32K about
/// 10% (`examples`-style timing, minimum of 200 runs).
const ROW_BLOCK: usize = 32 * 1024;

/// The identity of a reduction's accumulator.
fn reduce_init(op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Amax => f64::NEG_INFINITY,
        ReduceOp::Amin => f64::INFINITY,
    }
}

/// The one stride between consecutive rows' results, when the row dims nest
/// row-major (each dim's stride is the next one's stride times its size).
fn linear_rows(rows: &[(usize, usize)]) -> Option<usize> {
    let (&(_, last), rest) = rows.split_last()?;
    let mut want = last;
    let mut size_after = rows.last().map_or(1, |r| r.0);
    for &(size, stride) in rest.iter().rev() {
        want *= size_after;
        if stride != want && size != 1 {
            return None;
        }
        size_after = size;
    }
    Some(last)
}

/// Offset of row `r`'s result: `rows` are (size, stride) of the row dims.
#[inline]
fn row_offset(mut r: usize, rows: &[(usize, usize)], offset: usize) -> usize {
    let mut o = offset;
    for &(size, stride) in rows.iter().rev() {
        o += (r % size) * stride;
        r /= size;
    }
    o
}

/// Run a row group: each task takes whole rows and runs every stage on a block of
/// them before the next block. `scratch` holds the reductions' f64 accumulators.
///
/// # Safety
/// `bufs` hold every buffer the stages touch (see the module docs).
pub(crate) unsafe fn rows(g: &CRows, bufs: &[Raw], scratch: &mut [f64], threads: usize) -> Result<()> {
    if !g.blocked {
        for st in &g.stages {
            // SAFETY: forwarded; each stage alone as its own kernel.
            unsafe {
                match st {
                    CStage::Elem(p) | CStage::Row(p) => pointwise(p, bufs, threads),
                    CStage::Reduce { k, acc, .. } => {
                        reduce(k, bufs, &mut scratch[*acc..], threads).map_err(|err| CpuError::Node {
                            value: k.at.0,
                            op: k.op.name().into(),
                            loc: k.at.1.clone(),
                            source: Box::new(err),
                        })?
                    }
                }
            }
        }
        return Ok(());
    }
    let acc = Raw { ptr: scratch.as_mut_ptr() as *mut u8, dtype: DType::F64 };
    let per_block = (ROW_BLOCK / g.row_len).max(1);
    let run = |r0: usize, r1: usize| {
        let mut b = r0;
        while b < r1 {
            let e = (b + per_block).min(r1);
            let (lo, hi) = (b * g.row_len, e * g.row_len);
            for st in &g.stages {
                // SAFETY: tasks own disjoint rows: every stage writes only elements and
                // results of its task's rows, and reads what earlier stages wrote there.
                unsafe {
                    match st {
                        CStage::Elem(p) => pointwise_span(p, bufs, lo, hi),
                        CStage::Row(p) => pointwise_span(p, bufs, b, e),
                        CStage::Reduce { k, acc: base, rows, offset } => {
                            let a = acc.as_f64().add(*base);
                            let init = reduce_init(k.op);
                            // Rows whose results lie at one stride (the common case)
                            // are addressed without dividing the row index per dim.
                            let linear = linear_rows(rows);
                            let at = |r: usize| match linear {
                                Some(st) => offset + r * st,
                                None => row_offset(r, rows, *offset),
                            };
                            for r in b..e {
                                *a.add(at(r)) = init;
                            }
                            let araw = Raw { ptr: a as *mut u8, dtype: DType::F64 };
                            match k.body.compute {
                                Compute::F32 => reduce_range::<f32>(k, bufs, araw, lo, hi),
                                Compute::F64 => reduce_range::<f64>(k, bufs, araw, lo, hi),
                            }
                            let dst = bufs[k.dst.buf];
                            let mean = k.op == ReduceOp::Mean;
                            let scale = if mean { k.count as f64 } else { 1.0 };
                            if dst.dtype == DType::F32 {
                                let d = dst.ptr as *mut f32;
                                for r in b..e {
                                    let o = at(r);
                                    let v = *a.add(o);
                                    *d.add(o) = (if mean { v / scale } else { v }) as f32;
                                }
                            } else {
                                for r in b..e {
                                    let o = at(r);
                                    let v = *a.add(o);
                                    let v = if mean { v / scale } else { v };
                                    by_dtype!(dst, store_typed, o, 1, &[v][..]);
                                }
                            }
                        }
                    }
                }
            }
            b = e;
        }
    };
    par_chunks(g.rows, threads, (2 * per_block).min(g.rows), run);
    Ok(())
}

/// # Safety
/// As [`reduce`]; no other task accumulates into the outputs of `[e0, e1)`.
#[inline(always)]
unsafe fn reduce_range_impl<T: Num>(k: &CReduce, bufs: &[Raw], acc: Raw, e0: usize, e1: usize) {
    let mut accs: Vec<&CAccess> = k.body.loads.iter().collect();
    accs.push(&k.dst);
    if let Some(j) = k.jit.as_ref().and_then(|s| s.get()) {
        // SAFETY: the caller's guarantees; the code was compiled for these accesses,
        // with the accumulators (f64) as its last one. Same tiles as below, so the
        // sums are added in the same order.
        unsafe { jit_tiles(BLK, &k.shape, j, &accs, bufs, Some(acc), e0, e1) };
        return;
    }
    let rank = k.shape.len();
    let nl = k.body.loads.len();
    let inner_reduced = k.reduced[rank - 1];
    let acc = acc.ptr as *mut f64;
    let op = k.op;
    let v = k.value;
    let combine = |a: f64, x: f64| match op {
        ReduceOp::Sum | ReduceOp::Mean => a + x,
        ReduceOp::Amax => {
            if x > a || x.is_nan() {
                x
            } else {
                a
            }
        }
        ReduceOp::Amin => {
            if x < a || x.is_nan() {
                x
            } else {
                a
            }
        }
    };
    with_regs::<T, _>(
        k.body.nregs * RSTRIDE,
        #[inline(always)]
        |regs| {
            segments(
                &k.shape,
                &accs,
                e0,
                e1,
                #[inline(always)]
                |t| {
                    // SAFETY: the caller's guarantees; the accumulator covers the dst extent.
                    unsafe {
                        eval_block(&k.body, bufs, t, regs);
                        let vals = &regs[v * RSTRIDE..v * RSTRIDE + t.rows * t.len];
                        let (o, s, os) = (t.offs[nl], t.inner[nl], t.outer[nl]);
                        for (r, row) in vals.chunks_exact(t.len).enumerate() {
                            let o = o + r * os;
                            if inner_reduced {
                                let a = &mut *acc.add(o);
                                *a = match op {
                                    ReduceOp::Sum | ReduceOp::Mean => *a + sum_f64(row),
                                    ReduceOp::Amax => combine_extreme(*a, extreme(row, true).to_f64(), true),
                                    ReduceOp::Amin => combine_extreme(*a, extreme(row, false).to_f64(), false),
                                };
                            } else if s == 1 {
                                // Kept inner dim: one accumulator per element of the run.
                                let a = std::slice::from_raw_parts_mut(acc.add(o), row.len());
                                match op {
                                    ReduceOp::Sum | ReduceOp::Mean => {
                                        for (a, &x) in a.iter_mut().zip(row) {
                                            *a += x.to_f64();
                                        }
                                    }
                                    ReduceOp::Amax => {
                                        for (a, &x) in a.iter_mut().zip(row) {
                                            *a = combine_extreme(*a, x.to_f64(), true);
                                        }
                                    }
                                    ReduceOp::Amin => {
                                        for (a, &x) in a.iter_mut().zip(row) {
                                            *a = combine_extreme(*a, x.to_f64(), false);
                                        }
                                    }
                                }
                            } else {
                                for (i, &x) in row.iter().enumerate() {
                                    let a = &mut *acc.add(o + i * s);
                                    *a = combine(*a, x.to_f64());
                                }
                            }
                        }
                    }
                },
            );
        },
    );
}

/// `max(a, x)` (or min) where a NaN on either side wins.
#[inline(always)]
fn combine_extreme(a: f64, x: f64, max: bool) -> f64 {
    if (max && x > a) || (!max && x < a) || x.is_nan() {
        x
    } else {
        a
    }
}

/// `v` as f32s when `T` is f32 and the AVX-512 paths may run.
#[inline(always)]
fn avx512_f32<T: Num>(v: &[T]) -> Option<&[f32]> {
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && isa() == Isa::Avx512 {
        // SAFETY: `T` is f32.
        return Some(unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) });
    }
    None
}

/// The maximum (or minimum) of `v`, NaN if any is NaN. `v` is non-empty.
#[inline(always)]
fn extreme<T: Num>(v: &[T], max: bool) -> T {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = avx512_f32(v) {
        // SAFETY: AVX-512 was detected (`avx512_f32`).
        let m = unsafe {
            if max {
                simd::extreme_f32::<true>(f)
            } else {
                simd::extreme_f32::<false>(f)
            }
        };
        return T::from_f32(m);
    }
    #[inline(always)]
    fn pick<T: Num>(m: T, x: T, max: bool) -> T {
        if (max && x > m) || (!max && x < m) || x.is_nan() {
            x
        } else {
            m
        }
    }
    let mut m = v[0];
    for &x in v {
        m = pick(m, x, max);
    }
    m
}

/// Sum in f64 with independent lanes (deterministic order).
#[inline(always)]
fn sum_f64<T: Num>(v: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = avx512_f32(v) {
        // SAFETY: AVX-512 was detected (`avx512_f32`).
        return unsafe { simd::sum_f32_f64(f) };
    }
    let mut lanes = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] += c[i].to_f64();
        }
    }
    let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for &x in tail {
        s += x.to_f64();
    }
    s
}

/// Row reductions written with AVX-512 intrinsics (the compiler does not vectorize
/// NaN-propagating maxima or f32-to-f64 sums well on its own).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F and AVX-512DQ are available; `v` is non-empty.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn extreme_f32<const MAX: bool>(v: &[f32]) -> f32 {
        let n = v.len();
        let p = v.as_ptr();
        let mut m = _mm512_set1_ps(v[0]);
        let mut nan: __mmask16 = 0;
        let mut i = 0;
        // SAFETY: every load is inside `v` (the tail load is masked).
        unsafe {
            while i + 16 <= n {
                let x = _mm512_loadu_ps(p.add(i));
                m = if MAX { _mm512_max_ps(m, x) } else { _mm512_min_ps(m, x) };
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
                i += 16;
            }
            if i < n {
                let k = ((1u32 << (n - i)) - 1) as __mmask16;
                let x = _mm512_mask_loadu_ps(m, k, p.add(i));
                m = if MAX { _mm512_max_ps(m, x) } else { _mm512_min_ps(m, x) };
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            }
        }
        if nan != 0 {
            return f32::NAN;
        }
        // Lanes 0-7 against 8-15, 0-3 against 4-7, 0-1 against 2-3, 0 against 1: one
        // fixed order (the JIT combines a row the same way, so equal zeros of either
        // sign come out the same).
        let (lo, hi) = (_mm512_castps512_ps256(m), _mm512_extractf32x8_ps::<1>(m));
        let h8 = if MAX { _mm256_max_ps(lo, hi) } else { _mm256_min_ps(lo, hi) };
        let (lo, hi) = (_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
        let h4 = if MAX { _mm_max_ps(lo, hi) } else { _mm_min_ps(lo, hi) };
        let hi = _mm_movehl_ps(h4, h4);
        let h2 = if MAX { _mm_max_ps(h4, hi) } else { _mm_min_ps(h4, hi) };
        let hi = _mm_shuffle_ps::<1>(h2, h2);
        _mm_cvtss_f32(if MAX { _mm_max_ss(h2, hi) } else { _mm_min_ss(h2, hi) })
    }

    /// Transpose an 8x8 f32 tile: `src` row `j` (8 contiguous values, rows `ld_src`
    /// apart) becomes column `j` of `dst` (rows `ld_dst` apart).
    ///
    /// # Safety
    /// AVX is available; both tiles are in bounds.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose8(src: *const f32, ld_src: isize, dst: *mut f32, ld_dst: usize) {
        // SAFETY: the caller's bounds.
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.offset(j as isize * ld_src)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, v) in out.iter().enumerate() {
                _mm256_storeu_ps(dst.add(i * ld_dst), *v);
            }
        }
    }

    /// # Safety
    /// AVX-512F and AVX-512VL are available.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn sum_f32_f64(v: &[f32]) -> f64 {
        let n = v.len();
        let p = v.as_ptr();
        let mut a0 = _mm512_setzero_pd();
        let mut a1 = _mm512_setzero_pd();
        let mut i = 0;
        // SAFETY: every load is inside `v` (tail loads are masked).
        unsafe {
            while i + 16 <= n {
                a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(p.add(i))));
                a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(p.add(i + 8))));
                i += 16;
            }
            if i < n {
                let r = n - i;
                let k0 = ((1u32 << r.min(8)) - 1) as __mmask8;
                a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k0, p.add(i))));
                if r > 8 {
                    let k1 = ((1u32 << (r - 8)) - 1) as __mmask8;
                    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k1, p.add(i + 8))));
                }
            }
        }
        // A0 + A1, then lanes 0-3 + 4-7, 0-1 + 2-3, 0 + 1 (the JIT's order too).
        let v = _mm512_add_pd(a0, a1);
        let h = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd::<1>(v));
        let q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd::<1>(h));
        _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)))
    }
}

// ---- matmul ---------------------------------------------------------------------------

/// A block of one product: rows `[r0, r1)` and columns `[c0, c1)` of product `batch`.
#[derive(Clone, Copy)]
struct Block {
    batch: usize,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// How a product's operands are rearranged before the `gemm` crate runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// As they are.
    Plain,
    /// The right operand's columns of the block copied row-major (see [`transpose_b`]).
    RowsOfB,
    /// The block computed column-major into the scratch, then copied row-major into
    /// the product (see [`transpose_c`]).
    ColsOfC,
}

/// Compute one block of a product with the `gemm` crate, through `scratch` as `stage`
/// says.
///
/// # Safety
/// The operand and result pointers cover the lowered strides; `scratch` holds
/// `k * (c1 - c0)` elements for [`Stage::RowsOfB`], `(r1 - r0) * (c1 - c0)` for
/// [`Stage::ColsOfC`] (whose block spans every column of a row-major product).
unsafe fn gemm_block<T: 'static + Copy + num_traits::Zero>(
    mm: &CMatmul,
    bufs: &[Raw],
    blk: Block,
    stage: Stage,
    scratch: *mut T,
) {
    let (ab, ast, aoff) = mm.a;
    let (bb, mut bst, boff) = mm.b;
    let (ob, ost, ooff) = mm.out;
    let (bi, r, c) = (blk.batch as isize, blk.r0 as isize, blk.c0 as isize);
    let (rows, cols) = (blk.r1 - blk.r0, blk.c1 - blk.c0);
    // SAFETY: offsets inside the buffers (lowering checked the extents).
    unsafe {
        let a = (bufs[ab].ptr as *const T).offset(aoff as isize + bi * ast[0] + r * ast[1]);
        let mut b = (bufs[bb].ptr as *const T).offset(boff as isize + bi * bst[0] + c * bst[2]);
        if stage == Stage::RowsOfB {
            transpose_to_rows(b, bst[1], bst[2], mm.k, cols, scratch);
            b = scratch;
            bst = [0, cols as isize, 1];
        }
        let out = (bufs[ob].ptr as *mut T).offset(ooff as isize + bi * ost[0] + r * ost[1] + c * ost[2]);
        // The block column-major in the scratch, copied into the product below.
        let (o, ost) = if stage == Stage::ColsOfC { (scratch, [0, 1, rows as isize]) } else { (out, ost) };
        if mm.k == 0 {
            for i in 0..rows as isize {
                for j in 0..cols as isize {
                    *o.offset(i * ost[1] + j * ost[2]) = T::zero();
                }
            }
            return;
        }
        gemm::gemm(
            rows,
            cols,
            mm.k,
            o,
            ost[2],
            ost[1],
            false,
            a,
            ast[2],
            ast[1],
            b,
            bst[2],
            bst[1],
            T::zero(),
            one::<T>(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
        if stage == Stage::ColsOfC {
            // Rows of the block are contiguous rows of the product (all its columns).
            transpose_to_rows(scratch as *const T, 1, rows as isize, rows, cols, out);
        }
    }
}

thread_local! {
    /// This thread's scratch for a right operand copied row-major.
    static SCRATCH: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` with this thread's scratch of at least `words` f64 words (stale contents).
fn with_scratch<R>(words: usize, f: impl FnOnce(&mut [f64]) -> R) -> R {
    let mut v = SCRATCH.with(|c| c.take());
    if v.len() < words {
        v.resize(words, 0.0);
    }
    let r = f(&mut v[..words]);
    SCRATCH.with(|c| c.set(v));
    r
}

/// Whether the right operand is copied row-major before the product: the `gemm`
/// crate runs a column-major right operand (a linear layer's `x @ w.t()`) at about
/// half speed when the left one has few rows (measured on this project's bench
/// machine: 64x512x512 at 105 against 202 GFLOP/s; from about 1,000 rows the packing
/// it does itself amortizes). The copy costs one pass over the operand.
fn transpose_b(mm: &CMatmul, m: usize) -> bool {
    let (_, st, _) = mm.b;
    st[1] == 1 && st[2].unsigned_abs() > 1 && mm.n <= 512 && mm.k >= 32 && m >= 32
}

/// Whether the product is computed column-major and copied row-major after (each
/// task its own rows): a row-major product with fewer rows than the inner dim and a
/// column-major right operand (a linear layer's `x @ w.t()` on a small batch), or, on
/// one thread, a row-major one (its backward's `g @ w`). The `gemm` crate runs the
/// first layout at full speed written column-major (64x512x512 on the bench machine:
/// 210 GFLOP/s, against 110 written row-major), and the product is smaller than the
/// right operand, which [`transpose_b`] would copy instead; written column-major, the
/// second one reads the weight where it lies instead of packing it on every call
/// (bench MLP step at 1 thread 2.57 -> 2.46 ms). Split across threads by rows, each
/// task would read the whole right operand: there the columns split instead.
fn transpose_c(mm: &CMatmul, n: usize, m: usize, threads: usize) -> bool {
    let (_, bst, _) = mm.b;
    let (_, ost, _) = mm.out;
    let b_cols = bst[1] == 1 && bst[2].unsigned_abs() > 1;
    let b_rows = bst[2] == 1 && bst[1].unsigned_abs() > 1 && threads <= 1;
    (b_cols || b_rows) && ost[2] == 1 && ost[1] == m as isize && n < mm.k && m >= 32 && n >= 8
}

/// Copy the `k x m` matrix at `src` (row stride `rs`, column stride `cs`) row-major
/// into `dst`, in 8x8 tiles (an AVX register transpose for f32 columns).
///
/// # Safety
/// `src` covers the matrix; `dst` holds `k * m` elements.
unsafe fn transpose_to_rows<T: Copy + 'static>(src: *const T, rs: isize, cs: isize, k: usize, m: usize, dst: *mut T) {
    const TILE: usize = 8;
    #[cfg(target_arch = "x86_64")]
    let simd = rs == 1 && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && isa() != Isa::Base;
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    // SAFETY: every index is inside the matrix and `dst`.
    unsafe {
        // Rows of tiles outermost: the columns' next 8 values (half of each column's
        // cache line) stay in L1 for the next row of tiles, and each row of `dst` is
        // written in one sweep.
        for i0 in (0..k).step_by(TILE) {
            for j0 in (0..m).step_by(TILE) {
                #[cfg(target_arch = "x86_64")]
                if simd && j0 + TILE <= m && i0 + TILE <= k {
                    simd::transpose8(
                        src.offset(j0 as isize * cs + i0 as isize) as *const f32,
                        cs,
                        dst.add(i0 * m + j0) as *mut f32,
                        m,
                    );
                    continue;
                }
                for j in j0..(j0 + TILE).min(m) {
                    let col = src.offset(j as isize * cs);
                    for i in i0..(i0 + TILE).min(k) {
                        *dst.add(i * m + j) = *col.offset(i as isize * rs);
                    }
                }
            }
        }
    }
}

/// Fill rows `[r0, r1)` of product `batch` from what was computed: with `same_cols`,
/// each row's first column holds the row's value and the other columns get it (when
/// `same_rows` only row 0 was computed, so only row 0, in `r0..r1`, is filled so);
/// with `same_rows`, rows from 1 copy row 0. Only the filled elements are written,
/// so tasks over disjoint rows never write what another reads.
///
/// # Safety
/// As [`gemm_block`]; with `same_rows`, row 0 is complete before any task copies it.
unsafe fn replicate<T: Copy>(
    mm: &CMatmul,
    bufs: &[Raw],
    batch: usize,
    r0: usize,
    r1: usize,
    same_rows: bool,
    same_cols: bool,
) {
    let (ob, ost, ooff) = mm.out;
    // SAFETY: offsets inside the output (lowering checked its extent).
    unsafe {
        let o = (bufs[ob].ptr as *mut T).offset(ooff as isize + batch as isize * ost[0]);
        let at = |i: usize, j: usize| i as isize * ost[1] + j as isize * ost[2];
        let col_major = ost[1].unsigned_abs() <= ost[2].unsigned_abs();
        if same_cols {
            let rows = if same_rows { 0..usize::from(r0 == 0 && r1 > 0) } else { r0..r1 };
            // Walk the output in its memory order.
            if col_major {
                for j in 1..mm.m {
                    for i in rows.clone() {
                        *o.offset(at(i, j)) = *o.offset(at(i, 0));
                    }
                }
            } else {
                for i in rows {
                    let v = *o.offset(at(i, 0));
                    for j in 1..mm.m {
                        *o.offset(at(i, j)) = v;
                    }
                }
            }
        }
        if same_rows {
            let from = r0.max(1);
            // Walk the output in its memory order.
            if col_major {
                for j in 0..mm.m {
                    let v = *o.offset(at(0, j));
                    for i in from..r1 {
                        *o.offset(at(i, j)) = v;
                    }
                }
            } else {
                for i in from..r1 {
                    for j in 0..mm.m {
                        *o.offset(at(i, j)) = *o.offset(at(0, j));
                    }
                }
            }
        }
    }
}

fn one<T: 'static + Copy>() -> T {
    let any: &dyn std::any::Any =
        if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() { &1f32 } else { &1f64 };
    *any.downcast_ref::<T>().unwrap_or_else(|| unreachable!("gemm is only called for f32 and f64"))
}

/// Run a matmul and its epilogue.
///
/// # Safety
/// `bufs` hold every buffer the kernel touches.
pub(crate) unsafe fn matmul(mm: &CMatmul, bufs: &[Raw], threads: usize) {
    if mm.n == 0 || mm.m == 0 || mm.batch == 0 {
        return;
    }
    let plane = mm.n * mm.m;
    // A left operand whose rows are all one row (row stride 0, e.g. the expanded
    // gradient of a `sum`) gives equal rows of the product: compute the first and copy
    // it down. Likewise equal columns of the right operand give equal columns.
    let same_rows = mm.a.1[1] == 0 && mm.n > 1;
    let same_cols = mm.b.1[2] == 0 && mm.m > 1;
    let m_eff = if same_cols { 1 } else { mm.m };
    let n_eff = if same_rows { 1 } else { mm.n };
    let cols_of_c = !same_rows && !same_cols && transpose_c(mm, n_eff, m_eff, threads);
    let transpose = !cols_of_c && transpose_b(mm, m_eff);
    let block = |blk: Block| {
        let (stage, elems) = if cols_of_c {
            (Stage::ColsOfC, (blk.r1 - blk.r0) * (blk.c1 - blk.c0))
        } else if transpose {
            (Stage::RowsOfB, mm.k * (blk.c1 - blk.c0))
        } else {
            (Stage::Plain, 0)
        };
        with_scratch((elems * mm.dtype.size_bytes()).div_ceil(8), |scratch| {
            // SAFETY: the caller's guarantees; tasks own disjoint blocks.
            unsafe {
                match mm.dtype {
                    DType::F64 => gemm_block::<f64>(mm, bufs, blk, stage, scratch.as_mut_ptr()),
                    _ => gemm_block::<f32>(mm, bufs, blk, stage, scratch.as_mut_ptr() as *mut f32),
                }
            }
        });
    };
    let fill = |b: usize| {
        let rep = |r0: usize, r1: usize| {
            // SAFETY: the computed row / column is complete (the blocks before it ran);
            // tasks write disjoint rows, and row 0 is complete before rows copy it.
            unsafe {
                match mm.dtype {
                    DType::F64 => replicate::<f64>(mm, bufs, b, r0, r1, same_rows, same_cols),
                    _ => replicate::<f32>(mm, bufs, b, r0, r1, same_rows, same_cols),
                }
            }
        };
        if same_rows || same_cols {
            if same_rows && same_cols {
                // Row 0 first (its columns from its first), then the rows copy it.
                rep(0, 1);
                let min_rows = (16 * 1024 / mm.m.max(1)).max(1);
                par_chunks(mm.n - 1, threads, min_rows, |r0, r1| rep(r0 + 1, r1 + 1));
            } else {
                let min_rows = (16 * 1024 / mm.m.max(1)).max(1);
                par_chunks(mm.n, threads, min_rows, rep);
            }
        }
    };
    let epilogue = |lo: usize, hi: usize| {
        if let Some(e) = &mm.epilogue {
            // SAFETY: the caller's guarantees; tasks own disjoint ranges.
            unsafe { pointwise_span(e, bufs, lo, hi) }
        }
    };
    let whole = |b: usize| Block { batch: b, r0: 0, r1: n_eff, c0: 0, c1: m_eff };
    // A product copied from column-major blocks splits by rows (each block has every
    // column); one copied from row-major right operand columns, by columns.
    let split = split_product(n_eff, m_eff, mm.k, threads, transpose, cols_of_c);
    if threads > 1 && mm.batch >= threads {
        // Whole products per task, its epilogue right after.
        par_chunks(mm.batch, threads, 1, |lo, hi| {
            for b in lo..hi {
                block(whole(b));
                fill(b);
                epilogue(b * plane, (b + 1) * plane);
            }
        });
        return;
    }
    for b in 0..mm.batch {
        match split {
            Split::Rows(tasks) => {
                // Row blocks per task, each with its rows of the epilogue while they are
                // hot (the epilogue reads the product in its element order).
                let rows_ok = !same_rows && !same_cols;
                par_tasks(tasks, |t| {
                    let (r0, r1) = (tile_edge(t, tasks, n_eff, 16), tile_edge(t + 1, tasks, n_eff, 16));
                    block(Block { r0, r1, ..whole(b) });
                    if rows_ok {
                        epilogue(b * plane + r0 * mm.m, b * plane + r1 * mm.m);
                    }
                });
                fill(b);
                if !rows_ok {
                    par_chunks(plane, threads, 16 * 1024, |lo, hi| epilogue(b * plane + lo, b * plane + hi));
                }
            }
            Split::Cols(tasks) => {
                // Column blocks per task (each copies its own columns of a transposed
                // right operand row-major), then the epilogue over the product.
                par_tasks(tasks, |t| {
                    let (c0, c1) = (tile_edge(t, tasks, m_eff, 16), tile_edge(t + 1, tasks, m_eff, 16));
                    block(Block { c0, c1, ..whole(b) });
                });
                fill(b);
                par_chunks(plane, threads, 16 * 1024, |lo, hi| epilogue(b * plane + lo, b * plane + hi));
            }
        }
    }
}

/// How a product's output is split across tasks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Split {
    /// Blocks of rows (`n`).
    Rows(usize),
    /// Blocks of columns (`m`).
    Cols(usize),
}

/// Work (multiply-adds) below which a product runs as one task: splitting it costs
/// more in packing its operands twice than the second core gains.
pub(crate) const SPLIT_MIN_WORK: usize = 32 * 32 * 64;

/// The split of an `n x k @ k x m` product for `threads` threads: one task per thread
/// over the output dim with more 16-wide tiles (columns when the right operand is
/// copied row-major per task, which each task then does for its own columns only),
/// at most as many tasks as that dim has tiles, and only as the `gemm` crate sums
/// every element in the same order for each block as for the whole product (so the
/// result does not depend on the split, see [`same_sums`]); else one task.
fn split_product(n: usize, m: usize, k: usize, threads: usize, transpose: bool, rows_only: bool) -> Split {
    if threads <= 1 || n.saturating_mul(m).saturating_mul(k) < SPLIT_MIN_WORK {
        return Split::Rows(1);
    }
    let (row_tiles, col_tiles) = (n.div_ceil(16), m.div_ceil(16));
    let rows = Split::Rows(threads.min(row_tiles).max(1));
    let cols = Split::Cols(threads.min(col_tiles).max(1));
    let order = if transpose || col_tiles > row_tiles { [cols, rows] } else { [rows, cols] };
    let fits = |s: Split| -> bool {
        let (tasks, len) = match s {
            Split::Rows(t) => (t, n),
            Split::Cols(t) => (t, m),
        };
        tasks > 1
            && (0..tasks).all(|t| {
                let b = tile_edge(t + 1, tasks, len, 16) - tile_edge(t, tasks, len, 16);
                match s {
                    Split::Rows(_) => same_sums((n, m, k), (b, m)),
                    Split::Cols(_) => same_sums((n, m, k), (n, b)),
                }
            })
    };
    // A transposed right operand is copied per column block: rows would copy it all;
    // a product computed column-major is copied per row block.
    let candidates: &[Split] = if rows_only {
        &[rows]
    } else if transpose {
        &order[..1]
    } else {
        &order[..]
    };
    candidates.iter().copied().find(|&s| fits(s)).unwrap_or(Split::Rows(1))
}

/// Whether the `gemm` crate computes a `rows x cols` block of an `n x m` product
/// (inner size `k`) with the same sums as the whole: it blocks `k` by 512 for
/// products of at most 64 x 64 and by a cache-derived size beyond (the same when `k`
/// is at most 512), and runs single rows or columns as matrix-vector products.
fn same_sums((n, m, k): (usize, usize, usize), (rows, cols): (usize, usize)) -> bool {
    let small = |r: usize, c: usize| r <= 64 && c <= 64;
    (rows >= 2 || n < 2) && (cols >= 2 || m < 2) && (k <= 512 || small(rows, cols) == small(n, m))
}

/// Boundary `t` of `tasks` near-equal blocks of `0..len`, on multiples of `tile`
/// (the last block takes the rest).
fn tile_edge(t: usize, tasks: usize, len: usize, tile: usize) -> usize {
    if t >= tasks {
        return len;
    }
    let tiles = len.div_ceil(tile);
    (t * tiles / tasks * tile).min(len)
}

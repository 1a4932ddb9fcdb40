//! The block interpreter of a fused body: each instruction a tight loop over up to
//! [`BLK`] elements of a contiguous run (which the compiler vectorizes), on a
//! per-thread register file; loads and stores of every dtype; the tiles (runs of the
//! innermost dim) a kernel's iteration space is cut into.

use super::tasks::Raw;
use crate::compiled::kernels::{CAccess, CBody, LInstr, Src};
use crate::compiled::math::{Num, Storable};
use aotgrad_ir::{BinaryOp, CmpOp, DType, UnaryOp};
use half::{bf16, f16};

/// Elements per block of a fused body.
pub(crate) const BLK: usize = 512;
/// Distance between registers in the register file: a block plus padding, so two
/// registers never sit a multiple of 4 KiB apart (4K aliasing stalls loads after stores).
pub(super) const RSTRIDE: usize = BLK + 16;

// ---- register files -------------------------------------------------------------------

thread_local! {
    /// This thread's register file, reused by every kernel call it runs.
    static REGS: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` with a register file of `n` elements of `T`, reused across calls on this
/// thread (a row group calls its stages once per block: no allocation per call). Its
/// contents are stale: a body writes every register before it reads it.
#[inline(always)]
pub(super) fn with_regs<T: Num, R>(n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
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
pub(super) unsafe fn load_typed<S: Storable, T: Num>(p: *const S, off: usize, stride: usize, out: &mut [T]) {
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
pub(super) unsafe fn store_typed<S: Storable, T: Num>(p: *mut S, off: usize, stride: usize, vals: &[T]) {
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

// ---- instructions -------------------------------------------------------------------

pub(super) enum V<'a, T> {
    S(&'a [T]),
    C(T),
}

#[inline(always)]
pub(super) fn map1<T: Num>(d: &mut [T], a: &[T], f: impl Fn(T) -> T) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = f(x);
    }
}

#[inline(always)]
pub(super) fn map2<T: Num>(d: &mut [T], a: V<'_, T>, b: V<'_, T>, f: impl Fn(T, T) -> T) {
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
pub(super) fn b2n<T: Num>(b: bool) -> T {
    if b {
        T::ONE
    } else {
        T::ZERO
    }
}

#[inline(always)]
pub(super) fn unary<T: Num>(op: UnaryOp, d: &mut [T], a: &[T]) {
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
pub(super) fn binary<T: Num>(op: BinaryOp, d: &mut [T], a: V<'_, T>, b: V<'_, T>) {
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
pub(super) fn compare<T: Num>(op: CmpOp, d: &mut [T], a: V<'_, T>, b: V<'_, T>) {
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
pub(super) unsafe fn regs_split<T>(regs: &mut [T], n: usize, d: usize, ops: [usize; 3]) -> (&mut [T], [&[T]; 3]) {
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
pub(super) unsafe fn eval_block<T: Num>(body: &CBody, bufs: &[Raw], t: &Tile<'_>, regs: &mut [T]) {
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
pub(super) struct Tile<'a> {
    pub(super) offs: &'a [usize],
    pub(super) inner: &'a [usize],
    pub(super) outer: &'a [usize],
    pub(super) rows: usize,
    pub(super) len: usize,
}

/// Walk `[e0, e1)` of a coalesced iteration space in tiles of at most [`BLK`]
/// elements: one inner run (or part of one), or several whole short runs, so that a
/// short inner dim (a head dim of 32, a softmax row of 128) does not pay the
/// per-block overhead for a handful of elements.
#[inline(always)]
pub(super) fn segments(shape: &[usize], accs: &[&CAccess], e0: usize, e1: usize, f: impl FnMut(&Tile<'_>)) {
    segments_of(BLK, shape, accs, e0, e1, f)
}

/// [`segments`] with tiles of up to `blk` elements.
#[inline(always)]
pub(super) fn segments_of(
    blk: usize,
    shape: &[usize],
    accs: &[&CAccess],
    e0: usize,
    e1: usize,
    mut f: impl FnMut(&Tile<'_>),
) {
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

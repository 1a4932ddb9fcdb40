//! Reductions with f64 accumulators (partitioned over outputs only, so results do not
//! depend on the thread count), their row kernels (sums and NaN-propagating extremes),
//! and row groups: stages of pointwise and reduce kernels run block by block over
//! each row.

use super::body::*;
use super::pointwise::*;
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::tasks::*;
use crate::compiled::kernels::{CAccess, CReduce, CRows, CStage};
use crate::compiled::math::Num;
use crate::compiled::target::multiversion;
use crate::compiled::target::{isa, Isa};
use crate::{CpuError, Result};
use aotgrad_fusion::Compute;
use aotgrad_ir::{DType, ReduceOp};

multiversion!(pub(super) unsafe fn reduce_range<T: Num> = reduce_range_impl(k: &CReduce, bufs: &[Raw], acc: Raw, e0: usize, e1: usize));

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
pub(super) const ROW_BLOCK: usize = 32 * 1024;

/// The identity of a reduction's accumulator.
pub(super) fn reduce_init(op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Amax => f64::NEG_INFINITY,
        ReduceOp::Amin => f64::INFINITY,
    }
}

/// The one stride between consecutive rows' results, when the row dims nest
/// row-major (each dim's stride is the next one's stride times its size).
pub(super) fn linear_rows(rows: &[(usize, usize)]) -> Option<usize> {
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
pub(super) fn row_offset(mut r: usize, rows: &[(usize, usize)], offset: usize) -> usize {
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
pub(super) unsafe fn reduce_range_impl<T: Num>(k: &CReduce, bufs: &[Raw], acc: Raw, e0: usize, e1: usize) {
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
pub(super) fn combine_extreme(a: f64, x: f64, max: bool) -> f64 {
    if (max && x > a) || (!max && x < a) || x.is_nan() {
        x
    } else {
        a
    }
}

/// `v` as f32s when `T` is f32 and the AVX-512 paths may run.
#[inline(always)]
pub(super) fn avx512_f32<T: Num>(v: &[T]) -> Option<&[f32]> {
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && isa() == Isa::Avx512 {
        // SAFETY: `T` is f32.
        return Some(unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) });
    }
    None
}

/// The maximum (or minimum) of `v`, NaN if any is NaN. `v` is non-empty.
#[inline(always)]
pub(super) fn extreme<T: Num>(v: &[T], max: bool) -> T {
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
pub(super) fn sum_f64<T: Num>(v: &[T]) -> f64 {
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

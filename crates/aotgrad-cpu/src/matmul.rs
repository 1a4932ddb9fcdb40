//! Matrix products (`mm`, `bmm`).
//!
//! f32 and f64 operands go straight to the `matrixmultiply` crate's `sgemm`/`dgemm`,
//! which take arbitrary row and column strides, so transposed, sliced or expanded
//! operands are read in place without a copy (`bmm` calls the GEMM once per batch).
//! f16/bf16 (and mixed-dtype) operands are gathered into contiguous f32 (or f64)
//! matrices first and the result is rounded to the output dtype. Integer and bool
//! products use a plain triple loop in wrapping i64: no GEMM crate covers integers.

use crate::convert::{gather_own, Kind, Vals};
use crate::iter::Layout;
use crate::pointwise::out_shape;
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{DType, TensorMeta};

/// A batch of matrices inside a storage: offset and (batch, row, col) strides.
#[derive(Clone, Copy, Debug)]
struct Mats {
    offset: usize,
    batch: usize,
    rs: usize,
    cs: usize,
}

/// The batched view of a rank-2 (batch 1) or rank-3 layout.
fn mats(layout: &Layout) -> Mats {
    let st = &layout.strides;
    let sh = &layout.shape;
    // Strides of size-1 dims are never followed; zero them so no pointer moves by them.
    let s = |i: usize| if sh[i] <= 1 { 0 } else { st[i] };
    match sh.len() {
        3 => Mats { offset: layout.offset, batch: s(0), rs: s(1), cs: s(2) },
        _ => Mats { offset: layout.offset, batch: 0, rs: s(0), cs: s(1) },
    }
}

/// Problem sizes: (batch, n, k, m).
fn sizes(op: &str, a: &Layout, b: &Layout, out: &[usize], batched: bool) -> Result<(usize, usize, usize, usize)> {
    let rank = if batched { 3 } else { 2 };
    let bad = || CpuError::kernel(op, format!("cannot multiply shapes {:?} and {:?} into {:?}", a.shape, b.shape, out));
    if a.shape.len() != rank || b.shape.len() != rank || out.len() != rank {
        return Err(bad());
    }
    let (bt, sa, sb) =
        if batched { (a.shape[0], &a.shape[1..], &b.shape[1..]) } else { (1, &a.shape[..], &b.shape[..]) };
    let so = if batched { &out[1..] } else { out };
    if (batched && (b.shape[0] != bt || out[0] != bt)) || sa[1] != sb[0] || so != [sa[0], sb[1]] {
        return Err(bad());
    }
    Ok((bt, sa[0], sa[1], sb[1]))
}

macro_rules! gemm_fn {
    ($name:ident, $t:ty, $gemm:path) => {
        /// `c[b] = a[b] @ b[b]` for every batch, with `c` contiguous (n, m) per batch.
        #[allow(clippy::too_many_arguments)]
        fn $name(dims: (usize, usize, usize, usize), a: &[$t], la: Mats, b: &[$t], lb: Mats, c: &mut [$t]) {
            let (bt, n, k, m) = dims;
            for i in 0..bt {
                let ao = la.offset + i * la.batch;
                let bo = lb.offset + i * lb.batch;
                let cb = &mut c[i * n * m..(i + 1) * n * m];
                // SAFETY: the caller checked that both layouts fit their slices, so every
                // element a[ao + r*rs + q*cs] (r < n, q < k) and b[bo + q*rs + j*cs]
                // (q < k, j < m) is in bounds; `cb` holds n*m elements written with row
                // stride m and column stride 1 (no aliasing), and the slices outlive the call.
                unsafe {
                    $gemm(
                        n,
                        k,
                        m,
                        1.0,
                        a.as_ptr().wrapping_add(ao),
                        la.rs as isize,
                        la.cs as isize,
                        b.as_ptr().wrapping_add(bo),
                        lb.rs as isize,
                        lb.cs as isize,
                        0.0,
                        cb.as_mut_ptr(),
                        m as isize,
                        1,
                    );
                }
            }
        }
    };
}

gemm_fn!(gemm_f32, f32, matrixmultiply::sgemm);
gemm_fn!(gemm_f64, f64, matrixmultiply::dgemm);

fn gemm_i64(dims: (usize, usize, usize, usize), a: &[i64], b: &[i64]) -> Vec<i64> {
    let (bt, n, k, m) = dims;
    let mut c = vec![0i64; bt * n * m];
    for bi in 0..bt {
        let (ab, bb, cb) = (&a[bi * n * k..], &b[bi * k * m..], &mut c[bi * n * m..]);
        for i in 0..n {
            for q in 0..k {
                let x = ab[i * k + q];
                for j in 0..m {
                    cb[i * m + j] = cb[i * m + j].wrapping_add(x.wrapping_mul(bb[q * m + j]));
                }
            }
        }
    }
    c
}

/// `a @ b` (`batched`: `bmm`), producing `out`'s dtype and shape.
pub(crate) fn matmul(a: &CpuTensor, b: &CpuTensor, out: &TensorMeta, batched: bool) -> Result<Buffer> {
    let op = if batched { "bmm" } else { "mm" };
    let (la, lb) = (Layout::from_meta(&a.meta)?, Layout::from_meta(&b.meta)?);
    let dims = sizes(op, &la, &lb, &out_shape(out)?, batched)?;
    let (bt, n, _, m) = dims;
    let total = bt * n * m;
    let same = |d: DType| a.meta.dtype == d && b.meta.dtype == d && out.dtype == d;
    if same(DType::F32) || same(DType::F64) {
        // Read both operands in place.
        let ga = a.storage.read();
        let gb_own;
        let gb: &Buffer = if a.same_storage(b) {
            &ga
        } else {
            gb_own = b.storage.read();
            &gb_own
        };
        la.check_fits(op, ga.len())?;
        lb.check_fits(op, gb.len())?;
        return Ok(match (&*ga, gb) {
            (Buffer::F32(av), Buffer::F32(bv)) => {
                let mut c = vec![0.0f32; total];
                gemm_f32(dims, av, mats(&la), bv, mats(&lb), &mut c);
                Buffer::F32(c)
            }
            (Buffer::F64(av), Buffer::F64(bv)) => {
                let mut c = vec![0.0f64; total];
                gemm_f64(dims, av, mats(&la), bv, mats(&lb), &mut c);
                Buffer::F64(c)
            }
            _ => return Err(CpuError::Internal(format!("{op}: storage dtype differs from tensor dtype"))),
        });
    }
    // Gather contiguous operands in the compute kind of the output.
    let kind = Kind::compute(out.dtype);
    let (va, vb) = (gather_own(op, a, kind)?, gather_own(op, b, kind)?);
    let ca = mats(&Layout::contiguous(&la.shape));
    let cb = mats(&Layout::contiguous(&lb.shape));
    let res = match (va, vb) {
        (Vals::F32(av), Vals::F32(bv)) => {
            let mut c = vec![0.0f32; total];
            gemm_f32(dims, &av, ca, &bv, cb, &mut c);
            Vals::F32(c)
        }
        (Vals::F64(av), Vals::F64(bv)) => {
            let mut c = vec![0.0f64; total];
            gemm_f64(dims, &av, ca, &bv, cb, &mut c);
            Vals::F64(c)
        }
        (Vals::I64(av), Vals::I64(bv)) => Vals::I64(gemm_i64(dims, &av, &bv)),
        (Vals::Bool(_), Vals::Bool(_)) => {
            let (av, bv) = (gather_own(op, a, Kind::I64)?, gather_own(op, b, Kind::I64)?);
            match (av, bv) {
                (Vals::I64(av), Vals::I64(bv)) => Vals::I64(gemm_i64(dims, &av, &bv)),
                _ => return Err(CpuError::Internal(format!("{op}: gather to i64 returned another kind"))),
            }
        }
        _ => return Err(CpuError::Internal(format!("{op}: operands gathered into different kinds"))),
    };
    Ok(res.into_buffer(out.dtype))
}

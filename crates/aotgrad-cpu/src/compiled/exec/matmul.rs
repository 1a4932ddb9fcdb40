//! Products through the `gemm` crate: a product split into blocks over the threads,
//! operands transposed or replicated where that pays, and the epilogue applied to each
//! row panel while it is hot.

use super::pointwise::*;
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::tasks::*;
use crate::compiled::kernels::CMatmul;
use crate::compiled::target::{isa, Isa};
use aotgrad_ir::DType;

// ---- matmul ---------------------------------------------------------------------------

/// A block of one product: rows `[r0, r1)` and columns `[c0, c1)` of product `batch`.
#[derive(Clone, Copy)]
pub(super) struct Block {
    batch: usize,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// How a product's operands are rearranged before the `gemm` crate runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Stage {
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
pub(super) unsafe fn gemm_block<T: 'static + Copy + num_traits::Zero>(
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
        // The depth order and fusion rule (docs/ARCHITECTURE.md, "Products"): gemm's
        // kernel for a depth of 1 or 2 adds the products unfused, and its "horizontal"
        // kernel sums the depth in interleaved parts; those blocks go to
        // matrixmultiply, whose kernel (the eager mode's) fuses each multiply-add in
        // depth order for every shape.
        // Not a single row or column of depth 3 or more: gemm's vector kernels sum
        // those in interleaved parts too, but at memory speed, which neither
        // matrixmultiply nor an in-order loop reaches (4-5x slower measured on a
        // batch-1 layer); see "Products" in docs/ARCHITECTURE.md.
        let vector = mm.k <= 2;
        // (and its "horizontal" kernel for small blocks of a row-major left and a
        // column-major right operand, which sums the depth in interleaved parts)
        let horizontal = ast[2] == 1 && bst[1] == 1 && rows * cols <= 256;
        if (vector || horizontal) && fused_in_order(rows, mm.k, cols, a, ast, b, bst, o, ost) {
            if stage == Stage::ColsOfC {
                transpose_to_rows(scratch as *const T, 1, rows as isize, rows, cols, out);
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

/// `o = a · b` (`rows x k` by `k x cols`, the strides' row and column entries) with
/// matrixmultiply, for f32 and f64; `false` (nothing written) for another type.
///
/// # Safety
/// As [`gemm_block`]: the pointers cover the strides.
#[allow(clippy::too_many_arguments)]
unsafe fn fused_in_order<T: 'static>(
    rows: usize,
    k: usize,
    cols: usize,
    a: *const T,
    ast: [isize; 3],
    b: *const T,
    bst: [isize; 3],
    o: *mut T,
    ost: [isize; 3],
) -> bool {
    use std::any::TypeId;
    // SAFETY: the caller's; `T` is the type the pointers are cast to.
    unsafe {
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            let (a, b, o) = (a as *const f32, b as *const f32, o as *mut f32);
            matrixmultiply::sgemm(rows, k, cols, 1.0, a, ast[1], ast[2], b, bst[1], bst[2], 0.0, o, ost[1], ost[2]);
            true
        } else if TypeId::of::<T>() == TypeId::of::<f64>() {
            let (a, b, o) = (a as *const f64, b as *const f64, o as *mut f64);
            matrixmultiply::dgemm(rows, k, cols, 1.0, a, ast[1], ast[2], b, bst[1], bst[2], 0.0, o, ost[1], ost[2]);
            true
        } else {
            false
        }
    }
}

thread_local! {
    /// This thread's scratch for a right operand copied row-major.
    static SCRATCH: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` with this thread's scratch of at least `words` f64 words (stale contents).
pub(super) fn with_scratch<R>(words: usize, f: impl FnOnce(&mut [f64]) -> R) -> R {
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
pub(super) fn transpose_b(mm: &CMatmul, m: usize) -> bool {
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
pub(super) fn transpose_c(mm: &CMatmul, n: usize, m: usize, threads: usize) -> bool {
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
pub(super) unsafe fn transpose_to_rows<T: Copy + 'static>(
    src: *const T,
    rs: isize,
    cs: isize,
    k: usize,
    m: usize,
    dst: *mut T,
) {
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
pub(super) unsafe fn replicate<T: Copy>(
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

pub(super) fn one<T: 'static + Copy>() -> T {
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
pub(super) enum Split {
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
pub(super) fn split_product(n: usize, m: usize, k: usize, threads: usize, transpose: bool, rows_only: bool) -> Split {
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
pub(super) fn same_sums((n, m, k): (usize, usize, usize), (rows, cols): (usize, usize)) -> bool {
    let small = |r: usize, c: usize| r <= 64 && c <= 64;
    (rows >= 2 || n < 2) && (cols >= 2 || m < 2) && (k <= 512 || small(rows, cols) == small(n, m))
}

/// Boundary `t` of `tasks` near-equal blocks of `0..len`, on multiples of `tile`
/// (the last block takes the rest).
pub(super) fn tile_edge(t: usize, tasks: usize, len: usize, tile: usize) -> usize {
    if t >= tasks {
        return len;
    }
    let tiles = len.div_ceil(tile);
    (t * tiles / tasks * tile).min(len)
}

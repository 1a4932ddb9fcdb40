//! Convolution and max pooling over `(N, C, H, W)` images, the kernels of
//! [`Op::Conv2d`], its two gradients, [`Op::MaxPool2d`] and its gradient.
//!
//! A convolution is a GEMM per image and group over the image's *columns*
//! (im2col): row `(c, kh, kw)` of the column matrix holds the input pixels tap
//! `(kh, kw)` of channel `c` sees at each output position (zero where the window
//! hangs over the padding). The columns of one image live in a per-thread scratch (an
//! image's columns fit in cache), never in memory as a whole:
//! - forward: `y[n] = W @ cols[n]` (`(OC/g) x (C/g KK)` times `(C/g KK) x L`);
//! - input gradient: `cols = W^T @ gy[n]`, then each column entry is added back at the
//!   pixel it came from (col2im), tap by tap in a fixed order;
//! - weight gradient: `dW[:, block] = sum over n of gy[n] @ cols[n]^T[:, block]`, one
//!   task per block of 32 columns of `dW`, summing the images in order (the gemm
//!   crate accumulates every element over `k` in the same order whatever the block),
//!   so the result never depends on the thread count.
//!
//! Images (and, for pooling, image planes) are independent tasks on the compiled
//! backend's pool when a compiled graph runs the kernel (serially otherwise). f16 and
//! bf16 compute in f32 and round once.

use crate::compiled::pool;
use crate::compiled::target::multiversion;
use crate::convert::{gather_own, Kind, Vals};
use crate::storage::{Buffer, CpuTensor};
use crate::{CpuError, Result};
use aotgrad_ir::{Conv2dParams, DType, Op, Pool2dParams, TensorMeta};
use std::sync::RwLockReadGuard;

/// The two element types kernels compute in.
trait Elt: num_traits::Float + Send + Sync + 'static {
    /// `a` where `mask` is all ones, `b` where it is zero.
    fn select(mask: usize, a: Self, b: Self) -> Self;
    /// [`Elt::select`] by a 32-bit mask (as wide as the indices beside it).
    fn select32(mask: u32, a: Self, b: Self) -> Self;
    fn slice(b: &Buffer) -> Option<&[Self]>;
    fn from_vals(v: Vals) -> Option<Vec<Self>>;
    fn vals(v: Vec<Self>) -> Vals;
    const KIND: Kind;
}

/// The buffer, value-list and kind conversions of an [`Elt`] impl: `$t` lives in the
/// `$v` variant of each.
macro_rules! buffer_conversions {
    ($t:ty, $v:ident) => {
        fn slice(b: &Buffer) -> Option<&[$t]> {
            match b {
                Buffer::$v(v) => Some(v),
                _ => None,
            }
        }
        fn from_vals(v: Vals) -> Option<Vec<$t>> {
            match v {
                Vals::$v(v) => Some(v),
                _ => None,
            }
        }
        fn vals(v: Vec<$t>) -> Vals {
            Vals::$v(v)
        }
        const KIND: Kind = Kind::$v;
    };
}

impl Elt for f32 {
    fn select(mask: usize, a: f32, b: f32) -> f32 {
        Self::select32(mask as u32, a, b)
    }
    fn select32(m: u32, a: f32, b: f32) -> f32 {
        f32::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
    }
    buffer_conversions!(f32, F32);
}

impl Elt for f64 {
    fn select(mask: usize, a: f64, b: f64) -> f64 {
        let m = mask as u64;
        f64::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
    }
    fn select32(m: u32, a: f64, b: f64) -> f64 {
        Self::select((m as i32 as i64) as usize, a, b)
    }
    buffer_conversions!(f64, F64);
}

/// A tensor's elements as a dense row-major slice: its own storage when it already is
/// one of that element type, else a converted copy.
enum Dense<'a, T> {
    Borrowed(RwLockReadGuard<'a, Buffer>, usize, usize),
    Owned(Vec<T>),
}

impl<T: Elt> Dense<'_, T> {
    fn get(&self) -> &[T] {
        match self {
            Dense::Borrowed(g, at, n) => T::slice(g).map_or(&[], |s| &s[*at..*at + *n]),
            Dense::Owned(v) => v,
        }
    }
}

fn dense<'a, T: Elt>(op: &str, t: &'a CpuTensor) -> Result<Dense<'a, T>> {
    let n = t.meta.concrete_shape().map(|s| s.iter().product::<usize>());
    if let (true, Some(at), Some(n)) = (t.meta.is_contiguous(), t.meta.concrete_offset(), n) {
        let g = t.storage.read();
        if T::slice(&g).is_some_and(|s| at.checked_add(n).is_some_and(|e| e <= s.len())) {
            return Ok(Dense::Borrowed(g, at, n));
        }
    }
    T::from_vals(gather_own(op, t, T::KIND)?)
        .map(Dense::Owned)
        .ok_or_else(|| CpuError::Internal(format!("{op}: a gather returned another element type")))
}

/// A pointer tasks write disjoint parts through.
#[derive(Clone, Copy)]
struct Out<T>(*mut T);
// SAFETY: every task writes only its own disjoint elements.
unsafe impl<T> Send for Out<T> {}
unsafe impl<T> Sync for Out<T> {}

impl<T> Out<T> {
    /// The pointer (a method, so that closures capture the whole `Out`).
    fn at(self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

thread_local! {
    /// Padded images for im2col (a second buffer, used inside `SCRATCH`'s).
    static PAD_SCRATCH: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `len` elements of `T` in `store` (grown as needed; stale contents).
fn pad_slice<T: Elt>(store: &mut Vec<u64>, len: usize) -> &mut [T] {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    if store.len() < words {
        store.resize(words, 0);
    }
    // SAFETY: `store` holds at least `len` elements of `T` (alignment 8 covers f32 and
    // f64); every bit pattern is a valid float.
    unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut T, len) }
}

/// Run `f` with this thread's scratch of `len` elements of `T` (stale contents).
fn with_scratch<T: Elt, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    let mut v = SCRATCH.with(|c| c.take());
    if v.len() < words {
        v.resize(words, 0);
    }
    // SAFETY: `v` holds at least `len` elements of `T` (alignment 8 covers f32 and f64);
    // every bit pattern is a valid float.
    let s = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut T, len) };
    let r = f(s);
    SCRATCH.with(|c| c.set(v));
    r
}

/// The geometry of one convolution call, concrete.
#[derive(Clone, Copy)]
struct Geo {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oc: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    g: usize,
    p: Conv2dParams,
}

impl Geo {
    fn cg(&self) -> usize {
        self.c / self.g
    }
    fn ocg(&self) -> usize {
        self.oc / self.g
    }
    fn taps(&self) -> usize {
        self.kh * self.kw
    }
    fn ckk(&self) -> usize {
        self.cg() * self.taps()
    }
    fn l(&self) -> usize {
        self.oh * self.ow
    }
    /// Input row of output row `o` at tap row `k` (`None` in the padding).
    fn ih(&self, o: usize, k: usize) -> Option<usize> {
        (o * self.p.stride[0] + k * self.p.dilation[0]).checked_sub(self.p.padding[0]).filter(|&i| i < self.h)
    }
    /// Padded sizes.
    fn hp(&self) -> usize {
        self.h + 2 * self.p.padding[0]
    }
    fn wp(&self) -> usize {
        self.w + 2 * self.p.padding[1]
    }
    /// Whether the extended grid applies (stride 1): output rows of `wp` positions
    /// (the padded width), the first `ow` of them real, so that a row of the column
    /// matrix is one contiguous run of the padded image.
    fn extended(&self) -> bool {
        self.p.stride == [1, 1]
    }
    /// Positions of the extended grid.
    fn le(&self) -> usize {
        self.oh * self.wp()
    }
    /// Elements of a padded channel group, with the slack an extended run reads past
    /// its last row (zeros).
    fn padded_len(&self) -> usize {
        self.cg() * self.hp() * self.wp() + self.kw * self.p.dilation[1] + self.wp()
    }
    /// Whether the columns are the image itself (a 1x1, stride-1, unpadded kernel).
    fn pointwise(&self) -> bool {
        self.taps() == 1 && self.p.stride == [1, 1] && self.p.padding == [0, 0]
    }
}

fn sizes4(op: &str, m: &TensorMeta) -> Result<[usize; 4]> {
    let s = m.concrete_shape().ok_or_else(|| CpuError::kernel(op, format!("needs concrete sizes, got {m}")))?;
    match s[..] {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(CpuError::kernel(op, format!("expected a 4-D tensor, got {m}"))),
    }
}

/// The geometry from the input's, the weight's and the output's sizes.
fn geo(op: &str, x: [usize; 4], w: [usize; 4], y: [usize; 4], p: &Conv2dParams) -> Result<Geo> {
    let geo = Geo {
        n: x[0],
        c: x[1],
        h: x[2],
        w: x[3],
        oc: w[0],
        kh: w[2],
        kw: w[3],
        oh: y[2],
        ow: y[3],
        g: p.groups,
        p: *p,
    };
    let want_out = [
        aotgrad_ir::window_out(geo.h, geo.kh, p.stride[0], p.padding[0], p.dilation[0]),
        aotgrad_ir::window_out(geo.w, geo.kw, p.stride[1], p.padding[1], p.dilation[1]),
    ];
    if p.groups == 0
        || !geo.c.is_multiple_of(p.groups)
        || !geo.oc.is_multiple_of(p.groups)
        || w[1] * p.groups != geo.c
        || y[0] != geo.n
        || y[1] != geo.oc
        || want_out != [Some(geo.oh), Some(geo.ow)]
    {
        return Err(CpuError::kernel(
            op,
            format!("inconsistent sizes: input {x:?}, weight {w:?}, output {y:?} with {p:?}"),
        ));
    }
    Ok(geo)
}

/// The output positions `lo..hi` (of `outs`) whose input index `o * stride + off`
/// lies in `0..size`.
fn valid(outs: usize, stride: usize, off: isize, size: usize) -> (usize, usize) {
    let (s, size) = (stride as isize, size as isize);
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let hi = if size - off <= 0 { 0 } else { (size - off + s - 1) / s };
    let hi = (hi.max(0) as usize).min(outs);
    ((lo.max(0) as usize).min(hi), hi)
}

// Fill `cols` (`(r1 - r0) x l`, rows `ld >= l` apart) with rows `r0..r1` of the column matrix of
// channel-group `gi` of image `img` (`c x h x w`): row `(c, kh, kw)` holds what tap
// `(kh, kw)` of channel `c` sees at each output position, zero in the padding.
multiversion!(fn im2col<T: Elt> = im2col_impl(geo: &Geo, img: &[T], gi: usize, r0: usize, r1: usize, cols: &mut [T], ld: usize));

#[inline(always)]
fn im2col_impl<T: Elt>(geo: &Geo, img: &[T], gi: usize, r0: usize, r1: usize, cols: &mut [T], ld: usize) {
    let l = geo.l();
    let p = &geo.p;
    // The channel group's image with its padding as zeros (one small copy), so every
    // tap row below is plain (strided) copies without edge tests.
    let (hp, wp) = (geo.hp(), geo.wp());
    let cg = geo.cg();
    // The scratch taken out of its thread-local cell and put back at the end (no
    // closure: its code must be compiled with this function's instruction set).
    let mut store = PAD_SCRATCH.with(|c| c.take());
    let words = (cg * hp * wp * std::mem::size_of::<T>()).div_ceil(8);
    if store.len() < words {
        store.resize(words, 0);
    }
    // SAFETY: `store` holds at least `cg * hp * wp` elements of `T` (alignment 8 covers
    // f32 and f64); every bit pattern is a valid float.
    let pad = unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut T, cg * hp * wp) };
    {
        pad_image_impl(geo, img, gi, pad);
        let (sh, sw) = (p.stride[0], p.stride[1]);
        for r in r0..r1 {
            let (c, tap) = (r / geo.taps(), r % geo.taps());
            let (ki, kj) = (tap / geo.kw, tap % geo.kw);
            let chan = &pad[c * hp * wp..][..hp * wp];
            let row_all = &mut cols[(r - r0) * ld..][..ld];
            // Columns past `l` (a row stride rounded up) are zeros.
            for v in &mut row_all[l..] {
                *v = T::zero();
            }
            for (o, d) in row_all[..l].chunks_exact_mut(geo.ow).enumerate() {
                let start = (o * sh + ki * p.dilation[0]) * wp + kj * p.dilation[1];
                let src = &chan[start..];
                if sw == 1 {
                    for (d, v) in d.iter_mut().zip(src) {
                        *d = *v;
                    }
                } else {
                    for (d, v) in d.iter_mut().zip(src.iter().step_by(sw)) {
                        *d = *v;
                    }
                }
            }
        }
    }
    PAD_SCRATCH.with(|c| c.set(store));
}

// Add the column matrix `cols` (`ckk x l`, channel-group `gi`) back into the image
// gradient `dx` (`c x h x w`): each entry at the pixel it was read from, row by row of
// the column matrix (a fixed order).
multiversion!(fn col2im<T: Elt> = col2im_impl(geo: &Geo, cols: &[T], gi: usize, dx: &mut [T]));

#[inline(always)]
fn col2im_impl<T: Elt>(geo: &Geo, cols: &[T], gi: usize, dx: &mut [T]) {
    let (l, hw) = (geo.l(), geo.h * geo.w);
    let p = &geo.p;
    for r in 0..geo.ckk() {
        let (c, tap) = (r / geo.taps(), r % geo.taps());
        let (ki, kj) = (tap / geo.kw, tap % geo.kw);
        let chan = &mut dx[(gi * geo.cg() + c) * hw..][..hw];
        let src = &cols[r * l..][..l];
        let off = (kj * p.dilation[1]) as isize - p.padding[1] as isize;
        let (q0, q1) = valid(geo.ow, p.stride[1], off, geo.w);
        if q0 >= q1 {
            continue;
        }
        let first = ((q0 * p.stride[1]) as isize + off) as usize;
        let st = p.stride[1];
        for o in 0..geo.oh {
            let Some(i) = geo.ih(o, ki) else { continue };
            let row = &mut chan[i * geo.w..][..geo.w];
            let s = &src[o * geo.ow + q0..o * geo.ow + q1];
            if st == 1 {
                for (d, v) in row[first..].iter_mut().zip(s) {
                    *d = *d + *v;
                }
            } else {
                for (d, v) in row[first..].iter_mut().step_by(st).zip(s) {
                    *d = *d + *v;
                }
            }
        }
    }
}

// The padded channel group `gi` of image `img` into `pad` (`geo.padded_len()`
// elements: zeros around the image and after it).
multiversion!(fn pad_image<T: Elt> = pad_image_impl(geo: &Geo, img: &[T], gi: usize, pad: &mut [T]));

#[inline(always)]
fn pad_image_impl<T: Elt>(geo: &Geo, img: &[T], gi: usize, pad: &mut [T]) {
    let (hw, hp, wp, cg) = (geo.h * geo.w, geo.hp(), geo.wp(), geo.cg());
    let p = &geo.p;
    if p.padding == [0, 0] {
        // No border: the image itself, then zeros after it.
        let (image, after) = pad.split_at_mut(cg * hw);
        image.copy_from_slice(&img[gi * cg * hw..][..cg * hw]);
        for v in after {
            *v = T::zero();
        }
        return;
    }
    for v in pad.iter_mut() {
        *v = T::zero();
    }
    for c in 0..cg {
        let src = &img[(gi * cg + c) * hw..][..hw];
        let dst = &mut pad[c * hp * wp..][..hp * wp];
        for (i, row) in src.chunks_exact(geo.w).enumerate() {
            let at = (i + p.padding[0]) * wp + p.padding[1];
            for (d, v) in dst[at..at + geo.w].iter_mut().zip(row) {
                *d = *v;
            }
        }
    }
}

/// Where row `r` of the extended column matrix starts in the padded channel group.
fn ext_start(geo: &Geo, r: usize) -> usize {
    let (c, tap) = (r / geo.taps(), r % geo.taps());
    let (ki, kj) = (tap / geo.kw, tap % geo.kw);
    c * geo.hp() * geo.wp() + ki * geo.p.dilation[0] * geo.wp() + kj * geo.p.dilation[1]
}

// The extended column matrix (`ckk x ld`, `ld >= le`) of a padded channel group: row
// `r` the padded image's run from `ext_start(r)`, zeros past `le`. The positions past a
// row's `ow` real ones hold whatever the run reads: only discarded outputs see them.
multiversion!(fn im2col_ext<T: Elt> = im2col_ext_impl(geo: &Geo, pad: &[T], cols: &mut [T], ld: usize));

#[inline(always)]
fn im2col_ext_impl<T: Elt>(geo: &Geo, pad: &[T], cols: &mut [T], ld: usize) {
    let le = geo.le();
    for r in 0..geo.ckk() {
        let row = &mut cols[r * ld..][..ld];
        let start = ext_start(geo, r);
        for (d, v) in row[..le].iter_mut().zip(&pad[start..start + le]) {
            *d = *v;
        }
        for v in &mut row[le..] {
            *v = T::zero();
        }
    }
}

// The extended column matrix `cols` (`ckk x ld`) added back into the padded channel
// group `pad` (run by run, in row order), whose interior then goes into channel group
// `gi` of the image gradient `dx` (`c x h x w`).
multiversion!(fn col2im_ext<T: Elt> = col2im_ext_impl(geo: &Geo, cols: &[T], ld: usize, gi: usize, pad: &mut [T], dx: &mut [T]));

#[inline(always)]
fn col2im_ext_impl<T: Elt>(geo: &Geo, cols: &[T], ld: usize, gi: usize, pad: &mut [T], dx: &mut [T]) {
    let (le, hp, wp, hw, cg) = (geo.le(), geo.hp(), geo.wp(), geo.h * geo.w, geo.cg());
    for v in pad.iter_mut() {
        *v = T::zero();
    }
    for r in 0..geo.ckk() {
        let start = ext_start(geo, r);
        for (d, v) in pad[start..start + le].iter_mut().zip(&cols[r * ld..][..le]) {
            *d = *d + *v;
        }
    }
    let p = &geo.p;
    for c in 0..cg {
        let src = &pad[c * hp * wp..][..hp * wp];
        let dst = &mut dx[(gi * cg + c) * hw..][..hw];
        for (i, row) in dst.chunks_exact_mut(geo.w).enumerate() {
            let at = (i + p.padding[0]) * wp + p.padding[1];
            for (d, v) in row.iter_mut().zip(&src[at..at + geo.w]) {
                *d = *v;
            }
        }
    }
}

/// `src` (`rows x l`, `l = oh * ow`, rows `ld_src` apart) onto the extended grid in
/// `dst` (`rows x ld`): each output row at `wp` positions, zeros elsewhere.
fn to_extended<T: Elt>(geo: &Geo, src: &[T], ld_src: usize, rows: usize, dst: &mut [T], ld: usize) {
    let (wp, ow, l) = (geo.wp(), geo.ow, geo.l());
    for r in 0..rows {
        let d = &mut dst[r * ld..][..ld];
        d.fill(T::zero());
        for (o, seg) in src[r * ld_src..][..l].chunks_exact(ow).enumerate() {
            d[o * wp..o * wp + ow].copy_from_slice(seg);
        }
    }
}

/// `dst (m x n) = [dst +] lhs (m x k) @ rhs (k x n)`, each matrix with its
/// (row, column) strides.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T: Elt>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    acc: bool,
    lhs: *const T,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const T,
    rhs_rs: usize,
    rhs_cs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            for i in 0..m {
                // SAFETY: the caller's `dst` holds `m` rows of `n` elements.
                unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n).fill(T::zero()) };
            }
        }
        return;
    }
    // SAFETY: the caller's pointers cover the matrices at these strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            acc,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// A fresh vector of `len` elements of `T` (contents unspecified when `dirty` is
/// allowed: from the recycling pool).
fn fresh<T: Elt>(len: usize, zeroed: bool) -> Vec<T> {
    if !zeroed && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        if let Buffer::F32(v) = crate::storage::take_recycled(DType::F32, len) {
            // SAFETY: T is f32 (checked above); the vector is reinterpreted unchanged.
            let mut v = std::mem::ManuallyDrop::new(v);
            return unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut T, v.len(), v.capacity()) };
        }
    }
    vec![T::zero(); len]
}

fn finish<T: Elt>(v: Vec<T>, dtype: DType) -> Buffer {
    T::vals(v).into_buffer(dtype)
}

fn conv2d_fwd<T: Elt>(op: &str, x: &CpuTensor, w: &CpuTensor, geo: Geo, dtype: DType) -> Result<Buffer> {
    let (xs, ws) = (dense::<T>(op, x)?, dense::<T>(op, w)?);
    let (xs, ws) = (xs.get(), ws.get());
    let (l, ckk, ocg) = (geo.l(), geo.ckk(), geo.ocg());
    let chw = geo.c * geo.h * geo.w;
    let mut y = fresh::<T>(geo.n * geo.oc * l, false);
    let out = Out(y.as_mut_ptr());
    pool::par_tasks(geo.n, |img| {
        let xi = &xs[img * chw..][..chw];
        for gi in 0..geo.g {
            let wg = ws[gi * ocg * ckk..].as_ptr();
            // Task `img` writes only image `img` of `y`.
            let dst = out.at((img * geo.oc + gi * ocg) * l);
            if geo.pointwise() {
                let cols = xi[gi * geo.cg() * l..].as_ptr();
                // SAFETY: the input's channel group is the `ckk x l` column matrix.
                unsafe { gemm(ocg, l, ckk, dst, l, false, wg, ckk, 1, cols, l, 1) };
                continue;
            }
            if geo.extended() {
                // The product over the extended grid (rows of `lp`, a multiple of 16: the
                // gemm crate then reads the columns in place instead of packing them),
                // copied out without its extra positions.
                let (le, wp) = (geo.le(), geo.wp());
                let lp = le.next_multiple_of(16);
                with_scratch::<T, _>(ckk * lp + ocg * lp, |buf| {
                    let (cols, prod) = buf.split_at_mut(ckk * lp);
                    let mut store = PAD_SCRATCH.with(|c| c.take());
                    let pad = pad_slice::<T>(&mut store, geo.padded_len());
                    pad_image(&geo, xi, gi, pad);
                    im2col_ext(&geo, pad, cols, lp);
                    PAD_SCRATCH.with(|c| c.set(store));
                    // SAFETY: `W_g` is `ocg x ckk` row-major, `cols` `ckk x lp`, `prod`
                    // `ocg x lp`.
                    unsafe { gemm(ocg, lp, ckk, prod.as_mut_ptr(), lp, false, wg, ckk, 1, cols.as_ptr(), lp, 1) };
                    for (oc, row) in prod.chunks_exact(lp).enumerate() {
                        // SAFETY: task `img` owns image `img`'s `ocg x l` output rows.
                        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(oc * l), l) };
                        for (o, seg) in d.chunks_exact_mut(geo.ow).enumerate() {
                            seg.copy_from_slice(&row[o * wp..o * wp + geo.ow]);
                        }
                    }
                });
                continue;
            }
            // Rows of the columns (and of the product) padded to 16 elements: the gemm
            // crate then reads the columns in place instead of packing them each call.
            let lp = l.next_multiple_of(16);
            with_scratch::<T, _>(ckk * lp + ocg * lp, |buf| {
                let (cols, prod) = buf.split_at_mut(ckk * lp);
                im2col(&geo, xi, gi, 0, ckk, cols, lp);
                // SAFETY: `W_g` is `ocg x ckk` row-major, `cols` `ckk x lp`, `prod`
                // `ocg x lp`.
                unsafe { gemm(ocg, lp, ckk, prod.as_mut_ptr(), lp, false, wg, ckk, 1, cols.as_ptr(), lp, 1) };
                for (o, row) in prod.chunks_exact(lp).enumerate() {
                    // SAFETY: task `img` owns image `img`'s `ocg x l` output rows.
                    let d = unsafe { std::slice::from_raw_parts_mut(dst.add(o * l), l) };
                    d.copy_from_slice(&row[..l]);
                }
            });
        }
    });
    Ok(finish(y, dtype))
}

fn conv2d_input_grad<T: Elt>(op: &str, gy: &CpuTensor, w: &CpuTensor, geo: Geo, dtype: DType) -> Result<Buffer> {
    let (gs, ws) = (dense::<T>(op, gy)?, dense::<T>(op, w)?);
    let (gs, ws) = (gs.get(), ws.get());
    let (l, ckk, ocg) = (geo.l(), geo.ckk(), geo.ocg());
    let chw = geo.c * geo.h * geo.w;
    let mut gx = fresh::<T>(geo.n * chw, false);
    let out = Out(gx.as_mut_ptr());
    // The extended grid's extra columns are zeros in the gradient, so they add exactly
    // nothing back, unless the weight holds an infinity or NaN (times zero: NaN).
    let extended = geo.extended() && ws.iter().all(|v| v.is_finite());
    pool::par_tasks(geo.n, |img| {
        // SAFETY: task `img` writes only image `img` of `gx`.
        let dx = unsafe { std::slice::from_raw_parts_mut(out.at(img * chw), chw) };
        dx.fill(T::zero());
        for gi in 0..geo.g {
            // `W_g^T` (`ckk x ocg`): the weight read column-major.
            let wt = ws[gi * ocg * ckk..].as_ptr();
            if extended {
                // The gradient on the extended grid (zeros off the real outputs), its
                // columns `W^T @ gy` added back into a padded image as whole runs
                // (the extra positions are zeros, so they add nothing), whose interior
                // is the image's gradient.
                let lp = geo.le().next_multiple_of(16);
                let gyi = &gs[(img * geo.oc + gi * ocg) * l..][..ocg * l];
                with_scratch::<T, _>(ckk * lp + ocg * lp, |buf| {
                    let (cols, gext) = buf.split_at_mut(ckk * lp);
                    to_extended(&geo, gyi, l, ocg, gext, lp);
                    // SAFETY: `cols` is `ckk x lp`; `W_g^T` has row stride 1, column
                    // stride `ckk`; `gext` is `ocg x lp` row-major.
                    unsafe { gemm(ckk, lp, ocg, cols.as_mut_ptr(), lp, false, wt, 1, ckk, gext.as_ptr(), lp, 1) };
                    let mut store = PAD_SCRATCH.with(|c| c.take());
                    let pad = pad_slice::<T>(&mut store, geo.padded_len());
                    col2im_ext(&geo, cols, lp, gi, pad, dx);
                    PAD_SCRATCH.with(|c| c.set(store));
                });
                continue;
            }
            let gyi = gs[(img * geo.oc + gi * ocg) * l..].as_ptr();
            with_scratch::<T, _>(ckk * l, |cols| {
                // SAFETY: `cols` is `ckk x l`; `W_g^T` has row stride 1, column stride
                // `ckk`; the image's gradient is `ocg x l` row-major.
                unsafe { gemm(ckk, l, ocg, cols.as_mut_ptr(), l, false, wt, 1, ckk, gyi, l, 1) };
                col2im(&geo, cols, gi, dx);
            });
        }
    });
    Ok(finish(gx, dtype))
}

/// Images one weight-gradient task sums (a fixed count, so the partial sums and the
/// order they are added in do not depend on the thread count).
const WGRAD_IMAGES: usize = 8;

fn conv2d_weight_grad<T: Elt>(op: &str, gy: &CpuTensor, x: &CpuTensor, geo: Geo, dtype: DType) -> Result<Buffer> {
    let (gs, xs) = (dense::<T>(op, gy)?, dense::<T>(op, x)?);
    let (gs, xs) = (gs.get(), xs.get());
    let (l, ckk, ocg) = (geo.l(), geo.ckk(), geo.ocg());
    let chw = geo.c * geo.h * geo.w;
    let size = geo.oc * ckk;
    let chunks = geo.n.div_ceil(WGRAD_IMAGES).max(1);
    // One partial weight gradient per chunk of images, each summed image by image.
    let mut partial = fresh::<T>(chunks * size, true);
    let out = Out(partial.as_mut_ptr());
    pool::par_tasks(chunks, |t| {
        for img in t * WGRAD_IMAGES..((t + 1) * WGRAD_IMAGES).min(geo.n) {
            let xi = &xs[img * chw..][..chw];
            for gi in 0..geo.g {
                // Task `t` writes only its own partial sum.
                let dst = out.at(t * size + gi * ocg * ckk);
                let gyi = gs[(img * geo.oc + gi * ocg) * l..].as_ptr();
                let acc = img > t * WGRAD_IMAGES;
                if geo.pointwise() {
                    let cols = xi[gi * geo.cg() * l..].as_ptr();
                    // SAFETY: `dW_g` is `ocg x ckk` row-major, the gradient `ocg x l`, the
                    // columns (the image) `ckk x l`, read transposed.
                    unsafe { gemm(ocg, ckk, l, dst, ckk, acc, gyi, l, 1, cols, 1, l) };
                    continue;
                }
                with_scratch::<T, _>(ckk * l, |cols| {
                    im2col(&geo, xi, gi, 0, ckk, cols, l);
                    // SAFETY: as above, with the columns in the scratch.
                    unsafe { gemm(ocg, ckk, l, dst, ckk, acc, gyi, l, 1, cols.as_ptr(), 1, l) };
                });
            }
        }
    });
    // The chunks' sums, added in chunk order.
    let (first, rest) = partial.split_at_mut(size);
    for c in 0..chunks - 1 {
        for (d, v) in first.iter_mut().zip(&rest[c * size..(c + 1) * size]) {
            *d = *d + *v;
        }
    }
    partial.truncate(size);
    Ok(finish(partial, dtype))
}

/// The pooling geometry of `x` `(N, C, H, W)` into `y` `(.., OH, OW)`, with each
/// output row's and column's window taps inside the input.
struct PoolGeo {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    dilation: [usize; 2],
    /// Step between windows along a row.
    stride: usize,
    /// Per output row: the input row of tap 0 and the taps `a0..a1` inside the input.
    rows: Vec<(isize, usize, usize)>,
    /// Per output column, likewise.
    cols: Vec<(isize, usize, usize)>,
    /// Per output column: the input column of tap 0.
    first_col: Vec<isize>,
    /// Per tap column: the output columns `q0..q1` whose tap lies inside the input.
    taps_q: Vec<(usize, usize)>,
    /// Without padding (every tap of every window inside the input): per tap, in
    /// window order, the plane index it reads for each output position.
    table: Option<Vec<u32>>,
}

impl PoolGeo {
    /// The maxima of output row `o` of `plane` into `max`, and the index each one
    /// comes from into `at`: PyTorch's pick, the first maximum of a window or its last
    /// NaN (a window of -inf only: its first tap inside the input). Taps run in
    /// window order, each over the whole row of windows (which vectorizes).
    fn row<T: Elt>(&self, plane: &[T], o: usize, max: &mut [T], at: &mut [usize]) {
        let (i0, a0, a1) = self.rows[o];
        let (dh, dw) = (self.dilation[0], self.dilation[1]);
        max.fill(T::neg_infinity());
        if a0 >= a1 {
            return;
        }
        let top = (i0 + (a0 * dh) as isize) as usize;
        for (a, &(j0, b0, _)) in at.iter_mut().zip(&self.cols) {
            *a = top * self.w + (j0 + (b0 * dw) as isize).max(0) as usize;
        }
        for ta in a0..a1 {
            let i = (i0 + (ta * dh) as isize) as usize;
            let row = &plane[i * self.w..][..self.w];
            for (tb, &(q0, q1)) in self.taps_q.iter().enumerate() {
                if q0 >= q1 {
                    continue;
                }
                let base = self.first_col[q0] + (tb * dw) as isize;
                let (m, a) = (&mut max[q0..q1], &mut at[q0..q1]);
                let stride = self.stride;
                // The column taps `base + k * stride`, all inside the row.
                let cols = &row[base as usize..][..(q1 - q0 - 1) * stride + 1];
                match stride {
                    1 => tap_row::<T, 1>(cols, 1, i * self.w + base as usize, m, a),
                    2 => tap_row::<T, 2>(cols, 2, i * self.w + base as usize, m, a),
                    s => tap_row::<T, 0>(cols, s, i * self.w + base as usize, m, a),
                }
            }
        }
    }
}

/// One tap over a row of windows: window `k` sees `cols[k * stride]` (element `at0 +
/// k * stride` of the plane) and keeps it when it is larger than the maximum so far
/// or NaN. Branch-free (the comparisons are data dependent); `S` is the stride when
/// known at compile time (`0`: `stride`), so the loads vectorize.
#[inline(always)]
fn tap_row<T: Elt, const S: usize>(cols: &[T], stride: usize, at0: usize, max: &mut [T], at: &mut [usize]) {
    let stride = if S == 0 { stride } else { S };
    for (k, (m, a)) in max.iter_mut().zip(at.iter_mut()).enumerate() {
        let v = cols[k * stride];
        // All ones where `v` wins (larger, or NaN): selects by masks, not branches.
        let keep = 0usize.wrapping_sub(usize::from(v > *m) | usize::from(v.is_nan()));
        *m = T::select(keep, v, *m);
        *a = ((at0 + k * stride) & keep) | (*a & !keep);
    }
}

fn pool_geo(op: &str, x: [usize; 4], y: [usize; 4], p: &Pool2dParams) -> Result<PoolGeo> {
    let want = [
        aotgrad_ir::window_out(x[2], p.kernel[0], p.stride[0], p.padding[0], p.dilation[0]),
        aotgrad_ir::window_out(x[3], p.kernel[1], p.stride[1], p.padding[1], p.dilation[1]),
    ];
    if y[..2] != x[..2] || want != [Some(y[2]), Some(y[3])] {
        return Err(CpuError::kernel(op, format!("inconsistent sizes: input {x:?}, output {y:?} with {p:?}")));
    }
    let taps = |d: usize, outs: usize, size: usize| -> Vec<(isize, usize, usize)> {
        (0..outs)
            .map(|o| {
                let first = (o * p.stride[d]) as isize - p.padding[d] as isize;
                let (a0, a1) = valid(p.kernel[d], p.dilation[d], first, size);
                (first, a0, a1)
            })
            .collect()
    };
    let cols = taps(1, y[3], x[3]);
    let first_col = cols.iter().map(|c| c.0).collect();
    let taps_q = (0..p.kernel[1])
        .map(|b| valid(y[3], p.stride[1], (b * p.dilation[1]) as isize - p.padding[1] as isize, x[3]))
        .collect();
    let (oh, ow) = (y[2], y[3]);
    let table = (p.padding == [0, 0] && x[2] * x[3] <= u32::MAX as usize).then(|| {
        let mut t = Vec::with_capacity(p.kernel[0] * p.kernel[1] * oh * ow);
        for a in 0..p.kernel[0] {
            for b in 0..p.kernel[1] {
                for o in 0..oh {
                    for q in 0..ow {
                        let i = o * p.stride[0] + a * p.dilation[0];
                        let j = q * p.stride[1] + b * p.dilation[1];
                        t.push((i * x[3] + j) as u32);
                    }
                }
            }
        }
        t
    });
    Ok(PoolGeo {
        table,
        planes: x[0] * x[1],
        h: x[2],
        w: x[3],
        oh: y[2],
        ow: y[3],
        dilation: p.dilation,
        stride: p.stride[1],
        rows: taps(0, y[2], x[2]),
        cols,
        first_col,
        taps_q,
    })
}

/// Max pooling of one plane without padding through the tap table: each tap over
/// every output position at once (gathers, compare, blend: it vectorizes), keeping
/// the first maximum or the last NaN and, with `at`, where it came from.
#[inline(always)]
fn table_plane<T: Elt>(table: &[u32], reach: usize, plane: &[T], max: &mut [T], mut at: Option<&mut [u32]>) {
    let n = max.len();
    // Every tap inside the plane: `pool_geo` builds the table for planes of `reach`
    // elements at least, so the loops below read without bounds checks (and vectorize).
    if n == 0 || !table.len().is_multiple_of(n) || plane.len() < reach {
        max.fill(T::nan());
        return;
    }
    // SAFETY: every index is below `plane.len()` (checked above).
    let read = |j: u32| unsafe { *plane.get_unchecked(j as usize) };
    max.fill(T::neg_infinity());
    if let Some(a) = at.as_deref_mut() {
        a.copy_from_slice(&table[..n]);
    }
    for tap in table.chunks_exact(n) {
        match at.as_deref_mut() {
            Some(a) => {
                for ((m, a), &j) in max.iter_mut().zip(a.iter_mut()).zip(tap) {
                    let v = read(j);
                    let keep = 0u32.wrapping_sub(u32::from(v > *m) | u32::from(v.is_nan()));
                    *m = T::select32(keep, v, *m);
                    *a = (j & keep) | (*a & !keep);
                }
            }
            None => {
                for (m, &j) in max.iter_mut().zip(tap) {
                    let v = read(j);
                    let keep = 0usize.wrapping_sub(usize::from(v > *m) | usize::from(v.is_nan()));
                    *m = T::select(keep, v, *m);
                }
            }
        }
    }
}

// [`table_plane`] compiled for the best instruction set present.
multiversion!(fn table_plane_best<T: Elt> = table_plane(table: &[u32], reach: usize, plane: &[T], max: &mut [T], at: Option<&mut [u32]>));

/// Planes per pooling task.
const POOL_PLANES: usize = 16;

fn max_pool<T: Elt>(op: &str, x: &CpuTensor, geo: PoolGeo, dtype: DType) -> Result<Buffer> {
    let xs = dense::<T>(op, x)?;
    let xs = xs.get();
    let (hw, ohw) = (geo.h * geo.w, geo.oh * geo.ow);
    let mut y = fresh::<T>(geo.planes * ohw, false);
    let out = Out(y.as_mut_ptr());
    pool::par_tasks(geo.planes.div_ceil(POOL_PLANES), |t| {
        for pl in t * POOL_PLANES..((t + 1) * POOL_PLANES).min(geo.planes) {
            let plane = &xs[pl * hw..][..hw];
            // SAFETY: task `t` writes only its planes of `y`.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.at(pl * ohw), ohw) };
            if let Some(table) = &geo.table {
                table_plane_best(table, hw, plane, dst, None);
                continue;
            }
            let mut at = vec![0usize; geo.ow];
            for o in 0..geo.oh {
                geo.row(plane, o, &mut dst[o * geo.ow..][..geo.ow], &mut at);
            }
        }
    });
    Ok(finish(y, dtype))
}

fn max_pool_grad<T: Elt>(op: &str, gy: &CpuTensor, x: &CpuTensor, geo: PoolGeo, dtype: DType) -> Result<Buffer> {
    let (gs, xs) = (dense::<T>(op, gy)?, dense::<T>(op, x)?);
    let (gs, xs) = (gs.get(), xs.get());
    let (hw, ohw) = (geo.h * geo.w, geo.oh * geo.ow);
    let mut gx = fresh::<T>(geo.planes * hw, false);
    let out = Out(gx.as_mut_ptr());
    pool::par_tasks(geo.planes.div_ceil(POOL_PLANES), |t| {
        for pl in t * POOL_PLANES..((t + 1) * POOL_PLANES).min(geo.planes) {
            let plane = &xs[pl * hw..][..hw];
            let g = &gs[pl * ohw..][..ohw];
            // SAFETY: task `t` writes only its planes of `gx`.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.at(pl * hw), hw) };
            if let Some(table) = &geo.table {
                with_scratch::<T, _>(2 * ohw, |buf| {
                    let (max, at) = buf.split_at_mut(ohw);
                    // SAFETY: the scratch holds `ohw` elements of `T`, as many bytes as
                    // `ohw` u32 at least (`T` is f32 or f64).
                    let at = unsafe { std::slice::from_raw_parts_mut(at.as_mut_ptr() as *mut u32, ohw) };
                    table_plane_best(table, hw, plane, max, Some(&mut *at));
                    dst.fill(T::zero());
                    if at.iter().all(|&k| (k as usize) < dst.len()) {
                        for (&k, &v) in at.iter().zip(g) {
                            // SAFETY: every index is inside the plane (checked above).
                            let d = unsafe { dst.get_unchecked_mut(k as usize) };
                            *d = *d + v;
                        }
                    }
                });
                continue;
            }
            dst.fill(T::zero());
            let (mut max, mut at) = (vec![T::zero(); geo.ow], vec![0usize; geo.ow]);
            for o in 0..geo.oh {
                if geo.rows[o].1 >= geo.rows[o].2 {
                    continue;
                }
                geo.row(plane, o, &mut max, &mut at);
                for (q, &k) in at.iter().enumerate() {
                    if geo.cols[q].1 < geo.cols[q].2 {
                        dst[k] = dst[k] + g[o * geo.ow + q];
                    }
                }
            }
        }
    });
    Ok(finish(gx, dtype))
}

/// Run a convolution or pooling op into a contiguous buffer of `out`'s shape.
pub(crate) fn compute(op: &Op, args: &[&CpuTensor], out: &TensorMeta) -> Result<Buffer> {
    let name = op.name();
    let arg = |i: usize| args.get(i).copied().ok_or_else(|| CpuError::kernel(&name, format!("missing argument {i}")));
    if !out.dtype.is_float() || args.iter().any(|a| a.meta.dtype != out.dtype) {
        return Err(CpuError::kernel(&name, format!("needs float arguments of the result's dtype {}", out.dtype)));
    }
    let y = sizes4(&name, out)?;
    macro_rules! typed {
        ($f:ident($($a:expr),*)) => {
            if out.dtype == DType::F64 { $f::<f64>($($a),*) } else { $f::<f32>($($a),*) }
        };
    }
    match op {
        Op::Conv2d(p) => {
            let (x, w) = (arg(0)?, arg(1)?);
            let geo = geo(&name, sizes4(&name, &x.meta)?, sizes4(&name, &w.meta)?, y, p)?;
            typed!(conv2d_fwd(&name, x, w, geo, out.dtype))
        }
        Op::Conv2dInputGrad { conv, .. } => {
            let (gy, w) = (arg(0)?, arg(1)?);
            let geo = geo(&name, y, sizes4(&name, &w.meta)?, sizes4(&name, &gy.meta)?, conv)?;
            typed!(conv2d_input_grad(&name, gy, w, geo, out.dtype))
        }
        Op::Conv2dWeightGrad { conv, .. } => {
            let (gy, x) = (arg(0)?, arg(1)?);
            let geo = geo(&name, sizes4(&name, &x.meta)?, y, sizes4(&name, &gy.meta)?, conv)?;
            typed!(conv2d_weight_grad(&name, gy, x, geo, out.dtype))
        }
        Op::MaxPool2d(p) => {
            let x = arg(0)?;
            let geo = pool_geo(&name, sizes4(&name, &x.meta)?, y, p)?;
            typed!(max_pool(&name, x, geo, out.dtype))
        }
        Op::MaxPool2dGrad(p) => {
            let (gy, x) = (arg(0)?, arg(1)?);
            let geo = pool_geo(&name, y, sizes4(&name, &gy.meta)?, p)?;
            typed!(max_pool_grad(&name, gy, x, geo, out.dtype))
        }
        other => Err(CpuError::Internal(format!("{} is not a convolution or pooling op", other.name()))),
    }
}

//! Lowering a [`KernelPlan`] with every symbol bound: concrete sizes, coalesced
//! iteration spaces, constants folded into operands, registers allocated, the buffer
//! plan's slots, and bounds checked once, so a call does no per-node work but run.

use super::kernels::{
    CAccess, CBody, CExtern, CKernel, CMatmul, CPointwise, CReduce, CRows, CStage, Flags, Idx, LInstr, Loc, Lowered,
    Src,
};
use crate::{CpuError, Result};
use aotgrad_fusion::{
    extent, plan_slots, Access, Body, BufferKind, Instr, Kernel, KernelPlan, PointwiseKernel, ReduceKernel, RowsKernel,
};
use aotgrad_ir::{DType, Dim, Op, TensorMeta};

/// Longest row (elements) a row group runs block by block; longer rows do not fit
/// in cache, and the stages run one after the other instead.
const MAX_BLOCKED_ROW: usize = 1 << 16;

/// Where a buffer's elements are in a call, as far as two kernels running at once can
/// collide: a graph input (read or updated in place), an arena slot, an output, or one
/// extern result.
fn place(loc: &[Loc], b: usize) -> (u8, usize) {
    match loc.get(b) {
        Some(Loc::Input(i) | Loc::Updated(i)) => (0, *i),
        Some(Loc::Slot(s)) => (1, *s),
        Some(Loc::Output(o)) => (2, *o),
        Some(Loc::Extern) | None => (3, b),
    }
}

/// The places a run of pointwise kernels writes and touches (reads or writes).
#[derive(Default)]
struct RunPlaces {
    written: std::collections::HashSet<(u8, usize)>,
    touched: std::collections::HashSet<(u8, usize)>,
}

impl RunPlaces {
    /// Add `p` when it may run at the same time as the run: it writes no place the
    /// run touches and touches no place the run writes.
    fn add(&mut self, p: &CPointwise, loc: &[Loc]) -> bool {
        let writes: Vec<_> = p.stores.iter().map(|(_, a)| place(loc, a.buf)).collect();
        let reads: Vec<_> = p.body.loads.iter().map(|a| place(loc, a.buf)).collect();
        if writes.iter().any(|w| self.touched.contains(w)) || reads.iter().any(|r| self.written.contains(r)) {
            return false;
        }
        self.touched.extend(reads.iter().chain(&writes).copied());
        self.written.extend(writes);
        true
    }
}

/// Whether pointwise kernels `parts` may run at once: none writes a place another
/// reads or writes (arena slots are compared, not buffers: two buffers that share a
/// slot one after the other collide).
pub(crate) fn independent<'a>(parts: impl IntoIterator<Item = &'a CPointwise>, loc: &[Loc]) -> bool {
    let mut run = RunPlaces::default();
    parts.into_iter().all(|p| run.add(p, loc))
}

/// Runs of two or more consecutive pointwise kernels that are [`independent`]: each
/// run is one dispatch, a multi-tensor kernel (an optimizer's update of every
/// parameter, as PyTorch's foreach and fused AdamW): the executor splits the
/// concatenation of their elements across threads at once, where one kernel after
/// the other leaves the small ones on one thread and pays a dispatch each.
pub(crate) fn dispatch_groups(kernels: &[CKernel], loc: &[Loc]) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let close = |groups: &mut Vec<(usize, usize)>, start: usize, end: usize| {
        if end >= start + 2 {
            groups.push((start, end));
        }
    };
    let (mut start, mut run) = (0, RunPlaces::default());
    for (i, k) in kernels.iter().enumerate() {
        if let CKernel::Pointwise(p) = k {
            if !run.add(p, loc) {
                close(&mut groups, start, i);
                (start, run) = (i, RunPlaces::default());
                run.add(p, loc);
            }
        } else {
            close(&mut groups, start, i);
            (start, run) = (i + 1, RunPlaces::default());
        }
    }
    close(&mut groups, start, kernels.len());
    groups
}

fn int(d: &Dim, what: &str) -> Result<usize> {
    match d {
        Dim::Const(v) if *v >= 0 => Ok(*v as usize),
        _ => Err(not_a_size(d, what)),
    }
}

fn not_a_size(d: &Dim, what: &str) -> CpuError {
    CpuError::Internal(format!("kernel plan {what} {d} is not a concrete non-negative size"))
}

/// The product of `sizes`, or an error when it overflows (a stored plan's sizes are
/// whatever its bytes say).
fn count(sizes: impl IntoIterator<Item = usize>) -> Result<usize> {
    sizes
        .into_iter()
        .try_fold(1usize, |n, s| n.checked_mul(s))
        .ok_or_else(|| CpuError::kernel("plan", "a kernel's space has more elements than fit in memory"))
}

fn ints(ds: &[Dim], what: &str) -> Result<Idx> {
    let mut out = Idx::new();
    ints_into(ds, what, &mut out)?;
    Ok(out)
}

/// [`ints`] pushed onto `out` where it lies (a small vector built aside and moved
/// stalls on the copy: the loops below convert thousands of lists per load).
fn ints_into(ds: &[Dim], what: &str, out: &mut Idx) -> Result<()> {
    out.reserve(ds.len());
    for d in ds {
        match d {
            Dim::Const(v) if *v >= 0 => out.push(*v as usize),
            _ => return Err(not_a_size(d, what)),
        }
    }
    Ok(())
}

/// Merge adjacent dims that every access walks as one (and drop size-1 dims), in
/// place: `strides` become the merged dims' strides; returns the merged shape and the
/// flag of each merged dim (dims with different `keep_apart` flags never merge).
fn coalesce(shape: &[usize], strides: &mut [Idx], keep_apart: Option<&[bool]>) -> (Idx, Flags) {
    let mut out_shape = Idx::new();
    let mut out_flag = Flags::new();
    // Merged dim `w` is written at index `w <= d` while reading dim `d`: every index a
    // later dim reads is still the original.
    for d in 0..shape.len() {
        let flag = keep_apart.map(|k| k[d]).unwrap_or(false);
        if shape[d] == 1 {
            continue;
        }
        let w = out_shape.len();
        let merge = w > 0 && out_flag[w - 1] == flag && strides.iter().all(|st| st[w - 1] == st[d] * shape[d]);
        if merge {
            out_shape[w - 1] *= shape[d];
            for st in strides.iter_mut() {
                st[w - 1] = st[d];
            }
        } else {
            out_shape.push(shape[d]);
            out_flag.push(flag);
            for st in strides.iter_mut() {
                st[w] = st[d];
            }
        }
    }
    if out_shape.is_empty() || shape.contains(&0) {
        let n = if shape.contains(&0) { 0 } else { 1 };
        for st in strides.iter_mut() {
            *st = smallvec::smallvec![0];
        }
        return (smallvec::smallvec![n], smallvec::smallvec![false]);
    }
    for st in strides.iter_mut() {
        st.truncate(out_shape.len());
    }
    (out_shape, out_flag)
}

/// Per-instruction tables of [`lower_instrs`], reused from body to body (lowering a
/// loaded plan is most of a warm start; fresh tables per body were a fifth of it).
#[derive(Default)]
struct RegScratch {
    last: Vec<Option<usize>>,
    phys: Vec<usize>,
    free: Vec<usize>,
    first: Vec<usize>,
    next: Vec<usize>,
}

/// `v` cleared and filled with `n` copies of `x`, keeping its allocation.
fn refill<T: Copy>(v: &mut Vec<T>, x: T, n: usize) {
    v.clear();
    v.resize(n, x);
}

/// A lowered body with its coalesced space, the extra accesses and the dim flags.
type LoweredBody = (Idx, CBody, smallvec::SmallVec<[CAccess; 4]>, Flags);

struct Lowering {
    /// Per buffer: the largest extent any access needs.
    need: Vec<usize>,
    regs: RegScratch,
}

impl Lowering {
    fn note(&mut self, buf: usize, shape: &[usize], strides: &[usize], offset: usize) -> Result<()> {
        if shape.contains(&0) {
            return Ok(());
        }
        let mut far = offset;
        for (s, st) in shape.iter().zip(strides) {
            far = (s - 1)
                .checked_mul(*st)
                .and_then(|x| far.checked_add(x))
                .ok_or_else(|| CpuError::kernel("plan", "an access overflows the address space"))?;
        }
        self.need[buf] = self.need[buf].max(far + 1);
        Ok(())
    }

    fn access_strides(&self, a: &Access) -> Result<(Idx, usize)> {
        Ok((ints(&a.strides, "stride")?, int(&a.offset, "offset")?))
    }

    /// Lower a body plus extra accesses (stores / dst) over `shape`.
    fn body(
        &mut self,
        body: &Body,
        shape: &[Dim],
        extra: &[&Access],
        keep: &[usize],
        flags: Option<&[bool]>,
        order_by: Option<usize>,
    ) -> Result<LoweredBody> {
        let shape = ints(shape, "size")?;
        let n = body.loads.len() + extra.len();
        let all = || body.loads.iter().chain(extra.iter().copied());
        let mut strides: smallvec::SmallVec<[Idx; 8]> = smallvec::SmallVec::with_capacity(n);
        let mut offsets: smallvec::SmallVec<[usize; 8]> = smallvec::SmallVec::with_capacity(n);
        for a in all() {
            strides.push(Idx::new());
            let st = strides.last_mut().ok_or_else(|| CpuError::Internal("lost a stride list".into()))?;
            ints_into(&a.strides, "stride", st)?;
            let off = int(&a.offset, "offset")?;
            if st.len() != shape.len() {
                return Err(CpuError::Internal("an access does not match its kernel's rank".into()));
            }
            self.note(a.buf, &shape, st, off)?;
            offsets.push(off);
        }
        // Walk the space in the memory order of one access (its strides decreasing,
        // ties kept in order), so that its innermost dim is its contiguous one.
        let (shape, flags) = match order_by {
            Some(a) if flags.is_none() && shape.len() > 1 => {
                let mut perm: Idx = (0..shape.len()).collect();
                let key = strides[a].clone();
                perm.sort_by(|&x, &y| key[y].cmp(&key[x]));
                for st in strides.iter_mut() {
                    *st = perm.iter().map(|&d| st[d]).collect();
                }
                (perm.iter().map(|&d| shape[d]).collect::<Idx>(), flags)
            }
            _ => (shape, flags),
        };
        let (cshape, cflags) = coalesce(&shape, &mut strides, flags);
        let mut accs =
            all().zip(strides).zip(offsets).map(|((a, strides), offset)| CAccess { buf: a.buf, strides, offset });
        let loads: Vec<CAccess> = accs.by_ref().take(body.loads.len()).collect();
        let extra_accs: smallvec::SmallVec<[CAccess; 4]> = accs.collect();
        let cb = lower_instrs(body, loads, keep, &mut self.regs)?;
        Ok((cshape, cb, extra_accs, cflags))
    }

    /// A reduction; `standalone` (not a row group's stage, whose rows must keep their
    /// shape) lets it skip reduced dims that only repeat values.
    fn reduce(&mut self, r: &ReduceKernel, buffers: &[aotgrad_fusion::Buffer], standalone: bool) -> Result<CReduce> {
        let last =
            r.body.instrs.len().checked_sub(1).ok_or_else(|| CpuError::Internal("empty reduction body".into()))?;
        let (r, copies) = if standalone { skip_broadcast_dims(r)? } else { (std::borrow::Cow::Borrowed(r), 1.0) };
        let r = &r;
        let (shape, body, dst, flags) = self.body(&r.body, &r.shape, &[&r.dst], &[last], Some(&r.reduced), None)?;
        let full = ints(&r.shape, "size")?;
        let count = count(full.iter().zip(&r.reduced).filter(|(_, red)| **red).map(|(s, _)| *s))?;
        let dst = dst.into_iter().next().ok_or_else(|| CpuError::Internal("reduction without a result".into()))?;
        let dst_extent = extent(&buffers[dst.buf].layout).unwrap_or(0);
        let value = body.phys[0];
        Ok(CReduce {
            op: r.op,
            shape,
            reduced: flags,
            body,
            value,
            dst,
            dst_extent,
            count,
            copies,
            at: (r.value, r.loc.clone()),
            jit: None,
        })
    }

    /// A row group and the f64 scratch its reductions need.
    fn rows(&mut self, g: &RowsKernel, buffers: &[aotgrad_fusion::Buffer]) -> Result<(CRows, usize)> {
        let shape = ints(&g.shape, "size")?;
        let rows = count(shape[..g.outer].iter().copied())?;
        let row_len = count(shape[g.outer..].iter().copied())?;
        let mut stages = Vec::with_capacity(g.stages.len());
        let mut acc = 0usize;
        for st in &g.stages {
            stages.push(match st {
                Kernel::Pointwise(p) => {
                    let c = self.pointwise(p, false)?;
                    if p.shape == g.shape {
                        CStage::Elem(c)
                    } else if c.numel == rows {
                        CStage::Row(c)
                    } else {
                        return Err(CpuError::Internal("a row group's stage does not match its space".into()));
                    }
                }
                Kernel::Reduce(r) => {
                    let k = self.reduce(r, buffers, false)?;
                    let strides = ints(&r.dst.strides, "stride")?;
                    let row_dims = (0..g.outer).map(|d| (shape[d], strides[d])).collect();
                    let offset = int(&r.dst.offset, "offset")?;
                    let base = acc;
                    acc += k.dst_extent;
                    CStage::Reduce { k, acc: base, rows: row_dims, offset }
                }
                _ => return Err(CpuError::Internal("a row group holds a kernel that is not a stage".into())),
            });
        }
        let blocked = rows >= 2 && row_len > 0 && row_len <= MAX_BLOCKED_ROW;
        Ok((CRows { rows, row_len, blocked, stages }, acc))
    }

    /// A pointwise kernel; `free_order`: it runs on its own (not over a row group's
    /// rows or a product's elements), so it may walk its space in its first store's
    /// memory order (a result laid out like a transposed input is written
    /// contiguously).
    fn pointwise(&mut self, p: &PointwiseKernel, free_order: bool) -> Result<CPointwise> {
        let extra: smallvec::SmallVec<[&Access; 4]> = p.stores.iter().map(|s| &s.dst).collect();
        let keep: smallvec::SmallVec<[usize; 4]> = p.stores.iter().map(|s| s.reg).collect();
        let order_by = (free_order && !p.stores.is_empty()).then_some(p.body.loads.len());
        let (shape, body, dsts, _) = self.body(&p.body, &p.shape, &extra, &keep, None, order_by)?;
        let numel = count(shape.iter().copied())?;
        let stores = dsts.into_iter().enumerate().map(|(i, a)| (body.phys[i], a)).collect();
        Ok(CPointwise { shape, numel, body, stores, jit: None })
    }
}

/// Constant folding into operands and register allocation (a register is reused once
/// its value is dead; an instruction never writes one of its operands).
fn lower_instrs(body: &Body, loads: Vec<CAccess>, keep: &[usize], scratch: &mut RegScratch) -> Result<CBody> {
    let RegScratch { last, phys, free, first, next } = scratch;
    let n = body.instrs.len();
    let konst = |r: usize| match body.instrs.get(r) {
        Some(Instr::Const(c)) => Some(*c),
        _ => None,
    };
    // Which plan registers are read as registers (not folded constants), and when last.
    refill(last, None, n);
    let reads = |i: &Instr| -> smallvec::SmallVec<[(usize, bool); 3]> {
        // (register, may fold as a constant)
        match i {
            Instr::Load(_) | Instr::Const(_) => smallvec::smallvec![],
            Instr::Unary(_, a) | Instr::Round(_, a) | Instr::Clamp { x: a, .. } => smallvec::smallvec![(*a, false)],
            Instr::Binary(_, a, b) | Instr::Compare(_, a, b) => smallvec::smallvec![(*a, true), (*b, true)],
            Instr::Where(c, a, b) => smallvec::smallvec![(*c, false), (*a, false), (*b, false)],
        }
    };
    for (i, ins) in body.instrs.iter().enumerate() {
        let rs = reads(ins);
        let both_const = rs.len() == 2 && rs.iter().all(|(r, f)| *f && konst(*r).is_some());
        for (k, (r, fold)) in rs.iter().enumerate() {
            if *r >= i {
                return Err(CpuError::Internal("a fused body reads a register before it is written".into()));
            }
            // With two constants the first stays a register.
            if !(*fold && konst(*r).is_some()) || (both_const && k == 0) {
                last[*r] = Some(i);
            }
        }
    }
    for &k in keep {
        if k >= n {
            return Err(CpuError::Internal("a store reads a register that does not exist".into()));
        }
        last[k] = Some(n);
    }
    refill(phys, usize::MAX, n);
    free.clear();
    let mut nregs = 0;
    let mut instrs = Vec::with_capacity(n);
    // The registers whose last use is instruction `i`, in increasing order: a list
    // from `first[i]` through `next` (one allocation each, not one per instruction).
    const END: usize = usize::MAX;
    refill(first, END, n + 1);
    refill(next, END, n);
    for (r, l) in last.iter().enumerate().rev() {
        if let Some(l) = l {
            next[r] = first[*l];
            first[*l] = r;
        }
    }
    let expiring = |i: usize| {
        std::iter::successors(Some(first[i]).filter(|&r| r != END), |&r| Some(next[r]).filter(|&r| r != END))
    };
    for (i, ins) in body.instrs.iter().enumerate() {
        if last[i].is_none() {
            // Dead (or a constant folded everywhere it is used).
            for r in expiring(i) {
                if phys[r] != usize::MAX {
                    free.push(phys[r]);
                }
            }
            continue;
        }
        let d = free.pop().unwrap_or_else(|| {
            nregs += 1;
            nregs - 1
        });
        phys[i] = d;
        let p = |r: usize| phys[r];
        let src = |r: usize, allow: bool| match konst(r) {
            Some(c) if allow => Src::Const(c),
            _ => Src::Reg(phys[r]),
        };
        let li = match ins {
            Instr::Load(l) => LInstr::Load { load: *l, d },
            Instr::Const(c) => LInstr::Fill { v: *c, d },
            Instr::Unary(op, a) => LInstr::Unary { op: *op, a: p(*a), d },
            Instr::Binary(op, a, b) => {
                let both = konst(*a).is_some() && konst(*b).is_some();
                LInstr::Binary { op: *op, a: src(*a, !both), b: src(*b, true), d }
            }
            Instr::Compare(op, a, b) => {
                let both = konst(*a).is_some() && konst(*b).is_some();
                LInstr::Compare { op: *op, a: src(*a, !both), b: src(*b, true), d }
            }
            Instr::Where(c, a, b) => LInstr::Where { c: p(*c), a: p(*a), b: p(*b), d },
            Instr::Clamp { x, min, max } => LInstr::Clamp { a: p(*x), lo: *min, hi: *max, d },
            Instr::Round(dt, a) => LInstr::Round { dtype: *dt, a: p(*a), d },
        };
        instrs.push(li);
        // Free the registers whose last use is this instruction (after `d` was taken).
        for r in expiring(i) {
            if phys[r] != usize::MAX {
                free.push(phys[r]);
            }
        }
    }
    let phys_keep = keep.iter().map(|&k| phys[k]).collect();
    Ok(CBody { compute: body.compute, loads, instrs, nregs: nregs.max(1), phys: phys_keep })
}

fn mat_strides(a: &Access, batched: bool) -> Result<(usize, [isize; 3], usize)> {
    let st = ints(&a.strides, "stride")?;
    let off = int(&a.offset, "offset")?;
    let s = |i: usize| st[i] as isize;
    Ok(if batched { (a.buf, [s(0), s(1), s(2)], off) } else { (a.buf, [0, s(0), s(1)], off) })
}

/// Lower `plan` (whose symbols are already substituted); with `jit`, the pointwise
/// kernels the JIT covers get machine code.
pub(crate) fn lower_with(plan: &KernelPlan, jit: bool) -> Result<Lowered> {
    Ok(finish(lower(plan)?, jit))
}

/// A lowered plan made ready to run: with `jit`, the kernels the JIT covers get
/// machine code (a plan lowered here or one read back from an artifact).
pub(crate) fn finish(mut low: Lowered, jit: bool) -> Lowered {
    if jit {
        super::jit::attach(&mut low.kernels, &low.dtypes);
    }
    low.parallel = low.kernels.iter().any(splits);
    low
}

/// Lower `plan` for the interpreter alone.
pub(crate) fn lower(plan: &KernelPlan) -> Result<Lowered> {
    let nb = plan.buffers.len();
    let mut l = Lowering { need: vec![0; nb], regs: RegScratch::default() };
    let mut kernels = Vec::with_capacity(plan.kernels.len());
    let mut scratch = 0usize;
    for k in &plan.kernels {
        kernels.push(match k {
            Kernel::Pointwise(p) => CKernel::Pointwise(l.pointwise(p, true)?),
            Kernel::Reduce(r) => {
                let c = l.reduce(r, &plan.buffers, true)?;
                scratch = scratch.max(c.dst_extent);
                CKernel::Reduce(c)
            }
            Kernel::Rows(g) => {
                let (c, need) = l.rows(g, &plan.buffers)?;
                scratch = scratch.max(need);
                CKernel::Rows(c)
            }
            Kernel::Matmul(m) => {
                let batched = m.out.shape.len() == 3;
                let sh = ints(&m.out.shape, "size")?;
                let ash = ints(&m.a.shape, "size")?;
                let (batch, n, mm) = if batched { (sh[0], sh[1], sh[2]) } else { (1, sh[0], sh[1]) };
                let kk = *ash.last().unwrap_or(&0);
                for acc in [&m.a, &m.b, &m.out] {
                    let (st, off) = l.access_strides(acc)?;
                    l.note(acc.buf, &ints(&acc.shape, "size")?, &st, off)?;
                }
                let epilogue = match &m.epilogue {
                    Some(e) => Some(l.pointwise(e, false)?),
                    None => None,
                };
                CKernel::Matmul(CMatmul {
                    batch,
                    n,
                    k: kk,
                    m: mm,
                    a: mat_strides(&m.a, batched)?,
                    b: mat_strides(&m.b, batched)?,
                    out: mat_strides(&m.out, batched)?,
                    dtype: m.out.dtype,
                    epilogue,
                })
            }
            Kernel::Extern(e) => {
                let mut args = Vec::with_capacity(e.args.len());
                for a in &e.args {
                    let (st, off) = l.access_strides(a)?;
                    l.note(a.buf, &ints(&a.shape, "size")?, &st, off)?;
                    args.push((
                        a.buf,
                        TensorMeta {
                            shape: a.shape.clone(),
                            strides: a.strides.clone(),
                            offset: a.offset.clone(),
                            dtype: a.dtype,
                        },
                    ));
                }
                CKernel::Extern(CExtern {
                    op: e.op.clone(),
                    args,
                    out: e.out,
                    meta: e.meta.clone(),
                    at: (e.value, e.loc.clone()),
                })
            }
        });
    }
    let mut extents = vec![0usize; nb];
    for (b, buf) in plan.buffers.iter().enumerate() {
        let e =
            extent(&buf.layout).ok_or_else(|| CpuError::kernel("plan", format!("buffer b{b} has no concrete size")))?;
        if !matches!(buf.kind, BufferKind::Input(_) | BufferKind::Updated(_)) && l.need[b] > e {
            return Err(CpuError::Internal(format!("an access reads past the end of buffer b{b}")));
        }
        extents[b] = e;
    }
    let slots = plan_slots(plan, &extents);
    let mut loc = Vec::with_capacity(nb);
    let mut out_bufs = Vec::new();
    let mut input_need = vec![0usize; plan.inputs.len()];
    for (b, buf) in plan.buffers.iter().enumerate() {
        loc.push(match buf.kind {
            BufferKind::Input(i) | BufferKind::Updated(i) => {
                let own = extent(&buf.layout).unwrap_or(0);
                input_need[i] = l.need[b].max(own);
                if matches!(buf.kind, BufferKind::Updated(_)) {
                    Loc::Updated(i)
                } else {
                    Loc::Input(i)
                }
            }
            BufferKind::Intermediate => match slots.slot_of[b] {
                Some(s) => Loc::Slot(s),
                None => Loc::Extern,
            },
            BufferKind::Output => {
                let numel = buf.layout.concrete_shape().and_then(|s| count(s).ok());
                out_bufs.push((buf.layout.dtype, extents[b], numel == Some(extents[b])));
                Loc::Output(out_bufs.len() - 1)
            }
            BufferKind::Extern => Loc::Extern,
        });
    }
    let outputs = plan.outputs.iter().map(|o| (o.buf, o.meta.clone())).collect();
    let parallel = kernels.iter().any(splits);
    let dtypes = plan.buffers.iter().map(|b| b.layout.dtype).collect();
    let groups = dispatch_groups(&kernels, &loc);
    // A group splits as the executor splits it: its elements over its heaviest part's
    // task size.
    let parallel = parallel
        || groups.iter().any(|&(a, b)| {
            let parts = kernels[a..b].iter().filter_map(|k| if let CKernel::Pointwise(p) = k { Some(p) } else { None });
            let (n, min) = parts.fold((0, usize::MAX), |(n, min), p| {
                (n + p.numel, min.min(super::exec::task_elements(p, p.jit.is_some())))
            });
            n >= 2 * min
        });
    let low =
        Lowered { kernels, loc, out_bufs, input_need, outputs, slots, scratch, parallel, dtypes, extents, groups };
    // Every plan lowered here passes the check a lowered plan read back must pass.
    let inputs: Vec<DType> = plan.inputs.iter().map(|m| m.dtype).collect();
    low.check(&inputs)?;
    Ok(low)
}

/// Whether `k` may split across threads: the same thresholds as the executor's
/// (pointwise kernels from two tasks' worth of elements, reductions from 64K, row
/// groups from 32K, products from [`exec::SPLIT_MIN_WORK`] multiply-adds).
fn splits(k: &CKernel) -> bool {
    use super::exec;
    match k {
        CKernel::Pointwise(p) => p.numel >= 2 * exec::task_elements(p, p.jit.is_some()),
        CKernel::Reduce(r) => r.shape.iter().fold(1usize, |n, &s| n.saturating_mul(s)) >= 64 * 1024,
        CKernel::Rows(g) => g.rows.saturating_mul(g.row_len) >= 32 * 1024,
        CKernel::Matmul(m) => {
            m.batch >= 2 && m.n.saturating_mul(m.m) >= 16 * 1024
                || m.n.saturating_mul(m.m).saturating_mul(m.k) >= exec::SPLIT_MIN_WORK
                || m.epilogue.as_ref().is_some_and(|e| e.numel >= 2 * exec::POINTWISE_TASK)
        }
        // Convolutions and pooling split over images (or chunks of them) themselves;
        // their work follows their largest operand (a weight gradient is small).
        CKernel::Extern(e) => {
            let largest = e
                .args
                .iter()
                .map(|(_, m)| m)
                .chain(std::iter::once(&e.meta))
                .filter_map(|m| m.numel().as_const())
                .max();
            matches!(
                e.op,
                Op::Conv2d(_)
                    | Op::Conv2dInputGrad { .. }
                    | Op::Conv2dWeightGrad { .. }
                    | Op::MaxPool2d(_)
                    | Op::MaxPool2dGrad(_)
            ) && largest.is_some_and(|n| n >= 2 * exec::POINTWISE_TASK as i64)
        }
    }
}

/// `r` with every reduced dim that all its loads broadcast (stride 0) iterated once:
/// such a dim only repeats each value, so its size becomes 1 and the number of copies
/// it stood for comes back (a sum multiplies by it; a mean, max or min of copies is
/// the value itself). Size-0 dims stay (an empty max must still fail).
fn skip_broadcast_dims(r: &ReduceKernel) -> Result<(std::borrow::Cow<'_, ReduceKernel>, f64)> {
    let full = ints(&r.shape, "size")?;
    let zero = Dim::Const(0);
    let skip: Vec<usize> = (0..full.len())
        .filter(|&d| r.reduced[d] && full[d] >= 2 && r.body.loads.iter().all(|a| a.strides.get(d) == Some(&zero)))
        .collect();
    if skip.is_empty() {
        return Ok((std::borrow::Cow::Borrowed(r), 1.0));
    }
    let mut k = r.clone();
    let mut copies = 1.0;
    for &d in &skip {
        copies *= full[d] as f64;
        k.shape[d] = Dim::Const(1);
        for a in k.body.loads.iter_mut().chain(std::iter::once(&mut k.dst)) {
            if let Some(s) = a.shape.get_mut(d) {
                *s = Dim::Const(1);
            }
        }
    }
    Ok((std::borrow::Cow::Owned(k), copies))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aotgrad_ir::infer::infer;
    use aotgrad_ir::{BinaryOp, Graph, Scalar, StaticOracle, StorageId, ValueId};

    fn node(g: &mut Graph, op: Op, args: &[ValueId]) -> ValueId {
        let metas: Vec<TensorMeta> = args.iter().map(|a| g.meta_of(*a).expect("meta").clone()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let meta = infer(&op, &refs, &mut StaticOracle).expect("infers");
        let fresh = g.next_storage();
        g.add_node(op, args.to_vec(), meta, fresh, None)
    }

    /// `x_i * 0.5` for three inputs of different shapes, then `z + out_0`.
    fn plan() -> KernelPlan {
        let mut g = Graph::new();
        let mut outs = Vec::new();
        for (i, shape) in [vec![3usize, 4], vec![5], vec![2, 2]].into_iter().enumerate() {
            let x = g.add_input(format!("x{i}"), TensorMeta::from_sizes(&shape, DType::F32), StorageId(i as u32));
            outs.push(node(&mut g, Op::BinaryScalar(BinaryOp::Mul, Scalar::Float(0.5)), &[x]));
        }
        let z = g.add_input("z", TensorMeta::from_sizes(&[2, 3, 4], DType::F32), StorageId(3));
        outs.push(node(&mut g, Op::Binary(BinaryOp::Add), &[z, outs[0]]));
        g.outputs = outs;
        aotgrad_fusion::plan_graph(&g).expect("plannable")
    }

    #[test]
    fn dispatch_groups_are_checked() {
        let low = lower(&plan()).expect("lowers");
        assert_eq!(low.groups, vec![(0, 3)]);
        let inputs = [DType::F32; 4];
        let rejected = |groups: Vec<(usize, usize)>| {
            let mut l = low.clone();
            l.groups = groups;
            l.check(&inputs).is_err()
        };
        assert!(!rejected(vec![(0, 3)]));
        assert!(!rejected(vec![(1, 3)]));
        // The fourth kernel reads the first one's result: not at the same time.
        assert!(rejected(vec![(0, 4)]));
        assert!(rejected(vec![(0, 2), (1, 3)]), "overlapping");
        assert!(rejected(vec![(2, 3)]), "a group of one");
        assert!(rejected(vec![(2, 9)]), "out of range");
    }
}

//! What a lowered plan must satisfy before it runs: the executor and the JIT index
//! buffers and registers through raw pointers, trusting these facts. Lowering
//! establishes them; [`Lowered::check`] proves them again for a lowered plan read back
//! from an artifact (and, so that the two can never disagree, for every plan lowered
//! here too).
//!
//! Checked: every access stays inside the buffer it names (given the location that
//! buffer gets during a call: an input's needed length, an arena slot, an output, an
//! extern kernel's result), kernels write only arena slots, outputs and the inputs the
//! plan updates in place, every register a body names exists and no instruction
//! writes one of its own operands, reductions' accumulators fit the scratch, row
//! groups' stages cover exactly their rows, products read and write within their
//! operands, and each buffer's element type is the one its location holds.

use super::kernels::{CAccess, CBody, CKernel, CPointwise, CReduce, CStage, LInstr, Loc, Lowered, Src};
use crate::{CpuError, Result};
use aotgrad_ir::DType;

fn bad(what: impl std::fmt::Display) -> CpuError {
    CpuError::Internal(format!("lowered plan is inconsistent: {what}"))
}

/// `a + b`, or an error naming `what`.
fn add(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_add(b).ok_or_else(|| bad(format!("{what} overflows")))
}

/// `a * b`, or an error naming `what`.
fn mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| bad(format!("{what} overflows")))
}

/// Elements of `shape` (overflow is an error).
fn numel(shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |n, &s| mul(n, s, "an iteration space"))
}

/// One past the farthest element an access with `strides` and `offset` reaches over
/// `shape` (0 for an empty space).
fn reach(shape: &[usize], strides: &[usize], offset: usize) -> Result<usize> {
    if strides.len() != shape.len() {
        return Err(bad(format!("an access of rank {} in a space of rank {}", strides.len(), shape.len())));
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut far = offset;
    for (s, st) in shape.iter().zip(strides) {
        far = add(far, mul(s - 1, *st, "an access")?, "an access")?;
    }
    add(far, 1, "an access")
}

struct Checker<'a> {
    low: &'a Lowered,
    /// Per buffer: the length its accesses need.
    need: Vec<usize>,
}

impl Checker<'_> {
    fn buf(&self, b: usize) -> Result<()> {
        if b >= self.low.loc.len() {
            return Err(bad(format!("buffer b{b} does not exist")));
        }
        Ok(())
    }

    /// A buffer a kernel writes: only arena slots and outputs (mapped for the whole
    /// call) and inputs updated in place (locked for writing by the kernels that
    /// write them) are writable; other inputs and extern results are only read.
    fn written(&self, b: usize) -> Result<()> {
        self.buf(b)?;
        match self.low.loc[b] {
            Loc::Slot(_) | Loc::Output(_) | Loc::Updated(_) => Ok(()),
            loc => Err(bad(format!("a kernel writes buffer b{b}, which lives in {loc:?}"))),
        }
    }

    fn access(&mut self, a: &CAccess, shape: &[usize]) -> Result<usize> {
        self.buf(a.buf)?;
        let far = reach(shape, &a.strides, a.offset)?;
        self.need[a.buf] = self.need[a.buf].max(far);
        Ok(far)
    }

    fn body(&mut self, b: &CBody, shape: &[usize]) -> Result<()> {
        if shape.is_empty() {
            return Err(bad("a kernel over a space of rank 0"));
        }
        for a in &b.loads {
            self.access(a, shape)?;
        }
        let n = b.nregs;
        if n == 0 {
            return Err(bad("a body without registers"));
        }
        let reg = |r: usize| if r < n { Ok(()) } else { Err(bad(format!("register {r} of {n}"))) };
        let src = |s: &Src| match s {
            Src::Reg(r) => Some(*r),
            Src::Const(_) => None,
        };
        for ins in &b.instrs {
            let (d, ops): (usize, [Option<usize>; 3]) = match ins {
                LInstr::Load { load, d } => {
                    if *load >= b.loads.len() {
                        return Err(bad(format!("load {load} of {}", b.loads.len())));
                    }
                    (*d, [None; 3])
                }
                LInstr::Fill { d, .. } => (*d, [None; 3]),
                LInstr::Unary { a, d, .. } | LInstr::Clamp { a, d, .. } | LInstr::Round { a, d, .. } => {
                    (*d, [Some(*a), None, None])
                }
                LInstr::Binary { a, b, d, .. } | LInstr::Compare { a, b, d, .. } => (*d, [src(a), src(b), None]),
                LInstr::Where { c, a, b, d } => (*d, [Some(*c), Some(*a), Some(*b)]),
            };
            reg(d)?;
            for r in ops.into_iter().flatten() {
                reg(r)?;
                if r == d {
                    return Err(bad(format!("an instruction writes its own operand (register {r})")));
                }
            }
        }
        for &r in &b.phys {
            reg(r)?;
        }
        Ok(())
    }

    fn pointwise(&mut self, p: &CPointwise) -> Result<()> {
        if numel(&p.shape)? != p.numel {
            return Err(bad(format!("a pointwise kernel of {} elements over {:?}", p.numel, p.shape)));
        }
        self.body(&p.body, &p.shape)?;
        for (r, a) in &p.stores {
            if *r >= p.body.nregs {
                return Err(bad(format!("a store of register {r} of {}", p.body.nregs)));
            }
            self.written(a.buf)?;
            self.access(a, &p.shape)?;
        }
        Ok(())
    }

    /// A reduction whose accumulators start at `acc` in a scratch of `scratch` f64s.
    fn reduce(&mut self, r: &CReduce, acc: usize, scratch: usize) -> Result<()> {
        if r.reduced.len() != r.shape.len() {
            return Err(bad("a reduction's flags do not match its space"));
        }
        self.body(&r.body, &r.shape)?;
        if r.value >= r.body.nregs {
            return Err(bad(format!("a reduction of register {} of {}", r.value, r.body.nregs)));
        }
        // The accumulators are indexed by the destination access; the destination
        // buffer receives all `dst_extent` of them from its start.
        self.written(r.dst.buf)?;
        if reach(&r.shape, &r.dst.strides, r.dst.offset)? > r.dst_extent {
            return Err(bad("a reduction's destination passes its extent"));
        }
        self.need[r.dst.buf] = self.need[r.dst.buf].max(r.dst_extent);
        if add(acc, r.dst_extent, "a reduction's accumulators")? > scratch {
            return Err(bad("a reduction's accumulators pass the scratch"));
        }
        Ok(())
    }

    fn kernel(&mut self, k: &CKernel) -> Result<()> {
        match k {
            CKernel::Pointwise(p) => self.pointwise(p),
            CKernel::Reduce(r) => self.reduce(r, 0, self.low.scratch),
            CKernel::Rows(g) => {
                let elems = mul(g.rows, g.row_len, "a row group")?;
                if g.blocked && (g.rows < 2 || g.row_len == 0) {
                    return Err(bad("a row group of fewer than two rows or empty rows runs block by block"));
                }
                for st in &g.stages {
                    match st {
                        CStage::Elem(p) if p.numel == elems => self.pointwise(p)?,
                        CStage::Row(p) if p.numel == g.rows => self.pointwise(p)?,
                        CStage::Elem(_) | CStage::Row(_) => return Err(bad("a row group's stage misses its rows")),
                        CStage::Reduce { k, acc, rows, offset } => {
                            if numel(&k.shape)? != elems {
                                return Err(bad("a row group's reduction misses its rows"));
                            }
                            self.reduce(k, *acc, self.low.scratch)?;
                            // Row results are addressed by (size, stride) per row dim.
                            let sizes: Vec<usize> = rows.iter().map(|r| r.0).collect();
                            let strides: Vec<usize> = rows.iter().map(|r| r.1).collect();
                            if numel(&sizes)? != g.rows {
                                return Err(bad("a row group's result rows do not match its rows"));
                            }
                            if reach(&sizes, &strides, *offset)? > k.dst_extent {
                                return Err(bad("a row group's results pass their extent"));
                            }
                        }
                    }
                }
                Ok(())
            }
            CKernel::Matmul(m) => {
                if !matches!(m.dtype, DType::F32 | DType::F64) {
                    return Err(bad(format!("a product in {:?}", m.dtype)));
                }
                for ((buf, st, off), dims) in
                    [(&m.a, [m.batch, m.n, m.k]), (&m.b, [m.batch, m.k, m.m]), (&m.out, [m.batch, m.n, m.m])]
                {
                    self.buf(*buf)?;
                    let st: Vec<usize> = st
                        .iter()
                        .map(|s| usize::try_from(*s).map_err(|_| bad("a product with a negative stride")))
                        .collect::<Result<_>>()?;
                    let far = reach(&dims, &st, *off)?;
                    self.need[*buf] = self.need[*buf].max(far);
                    if self.low.dtypes[*buf] != m.dtype {
                        return Err(bad(format!("a {:?} product over a {:?} buffer", m.dtype, self.low.dtypes[*buf])));
                    }
                }
                // Each element of the result is written once (threads write blocks of
                // it at the same time, and the GEMM libraries assume it): ordered by
                // stride, each dim of more than one element steps past all the inner
                // ones.
                let mut dims: Vec<(usize, usize)> = [m.batch, m.n, m.m]
                    .into_iter()
                    .zip(m.out.1)
                    .filter(|&(size, _)| size > 1)
                    .map(|(size, st)| (st.unsigned_abs(), size))
                    .collect();
                dims.sort_unstable();
                let mut inner = 0usize;
                for (st, size) in dims {
                    if st <= inner {
                        return Err(bad("a product whose result overlaps itself"));
                    }
                    inner = add(inner, mul(size - 1, st, "a product's result")?, "a product's result")?;
                }
                self.written(m.out.0)?;
                if let Some(e) = &m.epilogue {
                    self.pointwise(e)?;
                }
                Ok(())
            }
            CKernel::Extern(e) => {
                for (b, _) in &e.args {
                    self.buf(*b)?;
                }
                self.buf(e.out)?;
                let made = aotgrad_fusion::extent(&e.meta).ok_or_else(|| bad("an extern result without a size"))?;
                if self.low.loc[e.out] != Loc::Extern
                    || self.low.dtypes[e.out] != e.meta.dtype
                    || self.low.extents[e.out] > made
                {
                    return Err(bad(format!("extern buffer b{} does not match the result that fills it", e.out)));
                }
                Ok(())
            }
        }
    }
}

impl Lowered {
    /// Check everything the executor trusts (see the module docs); `inputs` are the
    /// element types of the graph's inputs.
    pub(crate) fn check(&self, inputs: &[DType]) -> Result<()> {
        let nb = self.loc.len();
        if self.dtypes.len() != nb || self.extents.len() != nb {
            return Err(bad("per-buffer tables of different lengths"));
        }
        if self.input_need.len() != inputs.len() {
            return Err(bad(format!("{} inputs, {} input lengths", inputs.len(), self.input_need.len())));
        }
        let mut c = Checker { low: self, need: vec![0; nb] };
        for k in &self.kernels {
            c.kernel(k)?;
        }
        for (b, loc) in self.loc.iter().enumerate() {
            let dtype = self.dtypes[b];
            let (held, cap) = match *loc {
                Loc::Input(i) | Loc::Updated(i) => (inputs.get(i).copied(), self.input_need.get(i).copied()),
                Loc::Slot(s) => {
                    let slot = self.slots.slots.get(s);
                    (slot.map(|s| s.dtype), slot.map(|s| s.elems))
                }
                Loc::Output(o) => {
                    let out = self.out_bufs.get(o);
                    (out.map(|o| o.0), out.map(|o| o.1))
                }
                Loc::Extern => (Some(dtype), Some(self.extents[b])),
            };
            let (Some(held), Some(cap)) = (held, cap) else {
                return Err(bad(format!("buffer b{b} lives in {loc:?}, which does not exist")));
            };
            if held != dtype {
                return Err(bad(format!("buffer b{b} of {dtype:?} lives in {loc:?} of {held:?}")));
            }
            if c.need[b] > cap {
                return Err(bad(format!("accesses of buffer b{b} reach {} of its {cap} elements", c.need[b])));
            }
            // Memory the plan allocates is memory its kernels use: a buffer in the
            // arena or handed out is no larger than what they touch (so a stored plan
            // cannot ask for gigabytes that nothing reads or writes).
            if matches!(loc, Loc::Slot(_) | Loc::Output(_)) && self.extents[b] > c.need[b] {
                return Err(bad(format!(
                    "buffer b{b} has {} elements, of which its kernels touch {}",
                    self.extents[b], c.need[b]
                )));
            }
        }
        for (b, meta) in &self.outputs {
            if *b >= nb {
                return Err(bad(format!("output buffer b{b} does not exist")));
            }
            if meta.dtype != self.dtypes[*b] {
                return Err(bad(format!("output buffer b{b} of {:?} is viewed as {:?}", self.dtypes[*b], meta.dtype)));
            }
            // The output's view lies inside its buffer.
            let cap = match self.loc[*b] {
                Loc::Input(i) | Loc::Updated(i) => self.input_need.get(i).copied(),
                Loc::Output(o) => self.out_bufs.get(o).map(|o| o.1),
                Loc::Extern => Some(self.extents[*b]),
                Loc::Slot(_) => None,
            };
            let concrete = meta.shape.len() == meta.strides.len()
                && meta
                    .shape
                    .iter()
                    .chain(&meta.strides)
                    .chain([&meta.offset])
                    .all(|d| d.as_const().is_some_and(|v| v >= 0));
            match (concrete.then(|| aotgrad_fusion::extent(meta)).flatten(), cap) {
                (Some(e), Some(cap)) if e > cap => {
                    return Err(bad(format!("output buffer b{b}'s view reaches {e} of its {cap} elements")))
                }
                (None, _) => return Err(bad(format!("output buffer b{b}'s view {meta} is not a concrete layout"))),
                _ => {}
            }
            // An output is handed to the caller: never arena memory, and an extern
            // op's result only if some kernel makes it.
            match self.loc[*b] {
                Loc::Slot(_) => return Err(bad(format!("output buffer b{b} lives in the arena"))),
                Loc::Extern if !self.kernels.iter().any(|k| matches!(k, CKernel::Extern(e) if e.out == *b)) => {
                    return Err(bad(format!("output buffer b{b} is made by no kernel")))
                }
                _ => {}
            }
        }
        // Kernels of one dispatch run at the same time: in order, apart, pointwise
        // and writing nothing another of them touches.
        let mut after = 0;
        for &(start, end) in &self.groups {
            if start < after || end < start + 2 || end > self.kernels.len() {
                return Err(bad(format!("dispatch group {start}..{end} is out of order or out of range")));
            }
            let parts: Option<Vec<&CPointwise>> = self.kernels[start..end]
                .iter()
                .map(|k| match k {
                    CKernel::Pointwise(p) => Some(p),
                    _ => None,
                })
                .collect();
            let Some(parts) = parts else {
                return Err(bad(format!("dispatch group {start}..{end} holds a kernel that is not pointwise")));
            };
            if !super::lower::independent(parts, &self.loc) {
                return Err(bad(format!("dispatch group {start}..{end} runs kernels that share a buffer at once")));
            }
            after = end;
        }
        Ok(())
    }
}

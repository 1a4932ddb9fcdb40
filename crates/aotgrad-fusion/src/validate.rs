//! [`KernelPlan::validate`]: the structural check of a plan read back from bytes.
//!
//! Planning only makes valid plans; a plan decoded from an artifact is whatever the
//! bytes say. Backends index buffers, inputs, loads and registers with the numbers a
//! plan holds, so a stored plan passes this check before a backend lowers or prints
//! it: every index in range, every access's sizes and strides of one rank, every
//! register defined before it is used. What it does not decide (sizes against
//! extents, dtypes against the buffers they live in) the backend's own check of its
//! lowered program does (the CPU backend's `Lowered::check`).

use crate::plan::{Access, Body, BufferKind, Instr, Kernel, KernelPlan, PointwiseKernel};

/// The largest rank a stored plan's shapes may have.
const MAX_RANK: usize = 64;

struct Check<'a> {
    plan: &'a KernelPlan,
}

impl Check<'_> {
    fn access(&self, at: &str, a: &Access) -> Result<(), String> {
        if a.buf >= self.plan.buffers.len() {
            return Err(format!("{at}: buffer b{} does not exist ({} buffers)", a.buf, self.plan.buffers.len()));
        }
        if a.shape.len() != a.strides.len() || a.shape.len() > MAX_RANK {
            return Err(format!("{at}: {} sizes and {} strides", a.shape.len(), a.strides.len()));
        }
        Ok(())
    }

    fn body(&self, at: &str, b: &Body) -> Result<(), String> {
        for (n, l) in b.loads.iter().enumerate() {
            self.access(&format!("{at} load {n}"), l)?;
        }
        for (i, ins) in b.instrs.iter().enumerate() {
            let (regs, n): ([usize; 3], usize) = match ins {
                Instr::Load(n) => {
                    if *n >= b.loads.len() {
                        return Err(format!("{at} instruction {i}: load {n} of {}", b.loads.len()));
                    }
                    ([0; 3], 0)
                }
                Instr::Const(_) => ([0; 3], 0),
                Instr::Unary(_, x) | Instr::Round(_, x) | Instr::Clamp { x, .. } => ([*x, 0, 0], 1),
                Instr::Binary(_, x, y) | Instr::Compare(_, x, y) => ([*x, *y, 0], 2),
                Instr::Where(c, x, y) => ([*c, *x, *y], 3),
            };
            if let Some(r) = regs[..n].iter().find(|&&r| r >= i) {
                return Err(format!("{at} instruction {i} reads register {r}, which is not defined before it"));
            }
        }
        Ok(())
    }

    fn pointwise(&self, at: &str, p: &PointwiseKernel) -> Result<(), String> {
        self.body(at, &p.body)?;
        for (n, s) in p.stores.iter().enumerate() {
            if s.reg >= p.body.instrs.len() {
                return Err(format!("{at} store {n}: register {} of {}", s.reg, p.body.instrs.len()));
            }
            self.access(&format!("{at} store {n}"), &s.dst)?;
        }
        if p.shape.len() > MAX_RANK {
            return Err(format!("{at}: rank {}", p.shape.len()));
        }
        Ok(())
    }

    fn kernel(&self, at: &str, k: &Kernel, depth: usize) -> Result<(), String> {
        match k {
            Kernel::Pointwise(p) => self.pointwise(at, p),
            Kernel::Reduce(r) => {
                self.body(at, &r.body)?;
                self.access(&format!("{at} result"), &r.dst)?;
                if r.reduced.len() != r.shape.len() || r.shape.len() > MAX_RANK {
                    return Err(format!("{at}: {} reduced flags for rank {}", r.reduced.len(), r.shape.len()));
                }
                Ok(())
            }
            Kernel::Matmul(m) => {
                for (name, a) in [("a", &m.a), ("b", &m.b), ("out", &m.out)] {
                    self.access(&format!("{at} {name}"), a)?;
                    if !(2..=3).contains(&a.shape.len()) || a.shape.len() != m.out.shape.len() {
                        return Err(format!("{at} {name}: a product of rank {}", a.shape.len()));
                    }
                }
                match &m.epilogue {
                    Some(e) => self.pointwise(&format!("{at} epilogue"), e),
                    None => Ok(()),
                }
            }
            Kernel::Extern(e) => {
                for (n, a) in e.args.iter().enumerate() {
                    self.access(&format!("{at} argument {n}"), a)?;
                }
                if e.out >= self.plan.buffers.len() {
                    return Err(format!("{at}: result buffer b{} does not exist", e.out));
                }
                Ok(())
            }
            Kernel::Rows(r) => {
                if depth > 0 {
                    return Err(format!("{at}: a row group inside a row group"));
                }
                if r.outer > r.shape.len() || r.shape.len() > MAX_RANK {
                    return Err(format!("{at}: {} row dims of rank {}", r.outer, r.shape.len()));
                }
                for (n, s) in r.stages.iter().enumerate() {
                    if !matches!(s, Kernel::Reduce(_) | Kernel::Pointwise(_)) {
                        return Err(format!("{at} stage {n}: a {} kernel in a row group", s.kind_name()));
                    }
                    self.kernel(&format!("{at} stage {n}"), s, depth + 1)?;
                }
                Ok(())
            }
        }
    }
}

impl KernelPlan {
    /// Check the plan's structure (see the module docs): what a plan read from bytes
    /// must pass before a backend uses it.
    pub fn validate(&self) -> Result<(), String> {
        let c = Check { plan: self };
        let (ni, nk) = (self.inputs.len(), self.kernels.len());
        for (i, m) in self.inputs.iter().enumerate() {
            if m.shape.len() != m.strides.len() || m.shape.len() > MAX_RANK {
                return Err(format!("input {i}: {} sizes and {} strides", m.shape.len(), m.strides.len()));
            }
        }
        for (b, buf) in self.buffers.iter().enumerate() {
            if let BufferKind::Input(i) | BufferKind::Updated(i) = buf.kind {
                // Input `i` is buffer `i`, laid out as the input is.
                if i >= ni || b != i || buf.layout != self.inputs[i] {
                    return Err(format!("buffer b{b} claims to be input {i} of {ni}, which it is not"));
                }
            }
            let m = &buf.layout;
            if m.shape.len() != m.strides.len() || m.shape.len() > MAX_RANK {
                return Err(format!("buffer b{b}: {} sizes and {} strides", m.shape.len(), m.strides.len()));
            }
            if buf.def.is_some_and(|k| k >= nk) || buf.last_use.is_some_and(|k| k >= nk) {
                return Err(format!("buffer b{b} names a kernel past the plan's {nk}"));
            }
        }
        for (n, k) in self.kernels.iter().enumerate() {
            c.kernel(&format!("kernel {n}"), k, 0)?;
        }
        for (o, out) in self.outputs.iter().enumerate() {
            if out.buf >= self.buffers.len() {
                return Err(format!("output {o}: buffer b{} does not exist", out.buf));
            }
            let m = &out.meta;
            if m.shape.len() != m.strides.len() || m.shape.len() > MAX_RANK {
                return Err(format!("output {o}: {} sizes and {} strides", m.shape.len(), m.strides.len()));
            }
        }
        Ok(())
    }
}

/// The largest element count or address a stored plan may reach once its symbols are
/// bound (2^48 elements: beyond any memory, far inside the integer range, so lowering
/// can multiply sizes and strides without overflowing).
const MAX_REACH: u128 = 1 << 48;

fn reach_of(a: &Access) -> Option<u128> {
    let c = |d: &aotgrad_ir::Dim| d.as_const().map(|v| u128::from(v.unsigned_abs()));
    let mut far = c(&a.offset)?;
    for (s, st) in a.shape.iter().zip(&a.strides) {
        let s = c(s)?;
        if s == 0 {
            return Some(0);
        }
        far = far.checked_add((s - 1).checked_mul(c(st)?)?)?;
    }
    far.checked_add(1)
}

fn space_of(shape: &[aotgrad_ir::Dim]) -> Option<u128> {
    shape.iter().try_fold(1u128, |n, d| n.checked_mul(u128::from(d.as_const()?.unsigned_abs())))
}

impl KernelPlan {
    /// For a plan whose symbols are bound: every kernel's space and every access's
    /// reach are concrete and at most 2^48, so lowering's arithmetic cannot overflow.
    /// What a stored symbolic plan passes, for a call's sizes, before it is lowered.
    pub fn validate_sizes(&self) -> Result<(), String> {
        fn kernel(k: &Kernel) -> Result<(), String> {
            let space = |shape: &[aotgrad_ir::Dim]| match space_of(shape) {
                Some(n) if n <= MAX_REACH => Ok(()),
                _ => Err(format!("a {} kernel's space of sizes {shape:?} is beyond any memory", k.kind_name())),
            };
            let access = |a: &Access| match reach_of(a) {
                Some(n) if n <= MAX_REACH => Ok(()),
                _ => Err(format!("an access of buffer b{} reaches beyond any memory", a.buf)),
            };
            let pointwise = |p: &PointwiseKernel| -> Result<(), String> {
                space(&p.shape)?;
                p.body.loads.iter().try_for_each(access)?;
                p.stores.iter().try_for_each(|s| access(&s.dst))
            };
            match k {
                Kernel::Pointwise(p) => pointwise(p),
                Kernel::Reduce(r) => {
                    space(&r.shape)?;
                    r.body.loads.iter().try_for_each(access)?;
                    access(&r.dst)
                }
                Kernel::Matmul(m) => {
                    [&m.a, &m.b, &m.out].into_iter().try_for_each(|a| access(a).and_then(|()| space(&a.shape)))?;
                    m.epilogue.as_ref().map_or(Ok(()), pointwise)
                }
                Kernel::Extern(e) => e.args.iter().try_for_each(access),
                Kernel::Rows(r) => {
                    space(&r.shape)?;
                    r.stages.iter().try_for_each(kernel)
                }
            }
        }
        self.kernels.iter().try_for_each(kernel)?;
        for (b, buf) in self.buffers.iter().enumerate() {
            let l = &buf.layout;
            let a = Access {
                buf: b,
                shape: l.shape.clone(),
                strides: l.strides.clone(),
                offset: l.offset.clone(),
                dtype: l.dtype,
            };
            if reach_of(&a).is_none_or(|n| n > MAX_REACH) {
                return Err(format!("buffer b{b}'s layout {l} reaches beyond any memory"));
            }
        }
        Ok(())
    }
}

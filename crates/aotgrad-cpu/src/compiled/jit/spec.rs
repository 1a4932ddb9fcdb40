//! What a kernel's code depends on ([`Spec`]): the body, the loads' inner strides, the
//! stored registers and, for a reduction, its op and accumulator; whether the JIT
//! covers it on this instruction set; the key compiled code is shared by.

use super::emit::MAX_ACCESSES;
use super::isa::{isa, Isa};
use crate::compiled::kernels::{CAccess, CBody, CPointwise, CReduce, LInstr, Src};
use aotgrad_fusion::Compute;
use aotgrad_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

/// What a kernel's code depends on (not its buffers, offsets or outer strides, which
/// are arguments): its body, the loads' inner strides, the stored registers, and for a
/// reduction the op, the reduced register and its accumulator's inner stride.
#[derive(Clone, Debug)]
pub(crate) struct Spec<'a> {
    pub(super) inner_len: usize,
    pub(super) body: std::borrow::Cow<'a, CBody>,
    pub(super) load_inner: smallvec::SmallVec<[usize; 8]>,
    pub(super) stores: smallvec::SmallVec<[usize; 4]>,
    pub(super) reduce: Option<(ReduceOp, usize, usize)>,
}

impl<'a> Spec<'a> {
    pub(super) fn into_owned(self) -> Spec<'static> {
        Spec { body: std::borrow::Cow::Owned(self.body.into_owned()), ..self }
    }

    pub(super) fn pointwise(p: &'a CPointwise, dtypes: &[DType]) -> Result<Spec<'a>, &'static str> {
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

    pub(super) fn reduce(r: &'a CReduce, dtypes: &[DType]) -> Result<Spec<'a>, &'static str> {
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
    pub(super) fn accesses(&self) -> usize {
        self.body.loads.len() + self.stores.len() + usize::from(self.reduce.is_some())
    }

    /// Everything the generated code depends on, as words.
    pub(super) fn key_into(&self, k: &mut Vec<u64>) {
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
    pub(super) fn check(&self, dtypes: &[DType]) -> Result<(), &'static str> {
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

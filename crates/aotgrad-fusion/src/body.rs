//! Kernel bodies and operand accesses: the code a fused kernel runs.
//!
//! [`BodyBuilder`] turns the nodes computed in one kernel into SSA instructions over
//! its iteration space, loading each value it reads once; [`broadcast_access`] and
//! [`access`] index a value's buffer by its layout (broadcasting is stride 0), and
//! [`copy_kernel`] is the one-load, one-store kernel of scatters and concatenations.

use crate::classify::Ctx;
use crate::plan::*;
use crate::PlanError;
use aotgrad_ir::{CmpOp, DType, Dim, Op, Scalar, TensorMeta, UnaryOp, ValueId};
use std::collections::HashMap;

/// A kernel copying `src` to `dst` over `shape` (both indexed by it).
pub(crate) fn copy_kernel(compute: Compute, src: Access, dst: Access, shape: &[Dim]) -> Kernel {
    Kernel::Pointwise(PointwiseKernel {
        shape: shape.into(),
        body: Body { compute, loads: vec![src], instrs: vec![Instr::Load(0)] },
        stores: vec![Store { reg: 0, dst }],
        nodes: 1,
    })
}

/// Whether a fused body reads argument `pos` of `op` (not only its shape).
fn reads_arg(op: &Op, pos: usize) -> bool {
    !matches!((op, pos), (Op::Copy, 0) | (Op::FullLike { .. }, _))
}

/// `meta`'s strides broadcast (numpy rules, right-aligned) to the iteration `shape`.
pub(crate) fn broadcast_access(buf: BufId, meta: &TensorMeta, shape: &[Dim]) -> Result<Access, PlanError> {
    let rank = shape.len();
    if meta.rank() > rank {
        return Err(PlanError::Internal(format!("cannot index a {} by the smaller space {shape:?}", meta)));
    }
    let lead = rank - meta.rank();
    let mut strides = vec![Dim::Const(0); rank];
    for (i, (s, st)) in meta.shape.iter().zip(&meta.strides).enumerate() {
        let target = &shape[lead + i];
        if s == target {
            strides[lead + i] = if *s == Dim::Const(1) { Dim::Const(0) } else { st.clone() };
        } else if *s == Dim::Const(1) {
            strides[lead + i] = Dim::Const(0);
        } else {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            return Err(PlanError::SymbolicBroadcast(format!("{meta} to [{}]", dims.join(", "))));
        }
    }
    Ok(Access { buf, shape: shape.into(), strides: strides.into(), offset: meta.offset.clone(), dtype: meta.dtype })
}

/// `meta`'s layout in buffer `buf`.
pub(crate) fn access(buf: BufId, meta: &TensorMeta) -> Access {
    Access {
        buf,
        shape: meta.shape.clone(),
        strides: meta.strides.clone(),
        offset: meta.offset.clone(),
        dtype: meta.dtype,
    }
}

/// Builds one [`Body`]: loads are deduplicated per value.
pub(crate) struct BodyBuilder {
    compute: Compute,
    loads: Vec<Access>,
    /// The instructions so far.
    pub(crate) instrs: Vec<Instr>,
    load_of: HashMap<ValueId, usize>,
    /// The register of each node computed so far.
    pub(crate) reg_of: HashMap<usize, usize>,
}

impl BodyBuilder {
    pub(crate) fn new(compute: Compute) -> Self {
        BodyBuilder { compute, loads: vec![], instrs: vec![], load_of: HashMap::new(), reg_of: HashMap::new() }
    }
    fn push(&mut self, i: Instr) -> usize {
        self.instrs.push(i);
        self.instrs.len() - 1
    }
    pub(crate) fn load(&mut self, v: ValueId, acc: Access) -> usize {
        if let Some(&r) = self.load_of.get(&v) {
            return r;
        }
        self.loads.push(acc);
        let r = self.push(Instr::Load(self.loads.len() - 1));
        self.load_of.insert(v, r);
        r
    }
    /// Instructions of the nodes `order` (in node order) over the iteration `shape`;
    /// arguments computed by an earlier node of `order` are registers, others loads.
    pub(crate) fn emit(
        &mut self,
        order: &[usize],
        shape: &[Dim],
        ctx: &Ctx,
        load_buf: &dyn Fn(ValueId) -> Result<BufId, PlanError>,
    ) -> Result<(), PlanError> {
        for &m in order {
            let mn = &ctx.g.nodes[m];
            let mut regs = Vec::with_capacity(mn.args.len());
            for (pos, a) in mn.args.iter().enumerate() {
                if !reads_arg(&mn.op, pos) {
                    regs.push(None);
                    continue;
                }
                let r = match ctx.node_of(*a).and_then(|k| self.reg_of.get(&k).copied()) {
                    Some(r) => r,
                    None => self.load(*a, broadcast_access(load_buf(*a)?, ctx.meta(*a)?, shape)?),
                };
                regs.push(Some(r));
            }
            let r = self.op(&mn.op, &regs, &mn.meta)?;
            self.reg_of.insert(m, r);
        }
        Ok(())
    }
    fn scalar(&mut self, s: Scalar) -> usize {
        self.push(Instr::Const(s.to_f64()))
    }
    /// Instructions of one node; returns the register of its value.
    fn op(&mut self, op: &Op, r: &[Option<usize>], out: &TensorMeta) -> Result<usize, PlanError> {
        let arg = |i: usize| {
            r.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| PlanError::Internal(format!("{} is missing argument {i}", op.name())))
        };
        let v = match op {
            Op::Unary(UnaryOp::LogicalNot) => {
                let z = self.push(Instr::Const(0.0));
                self.push(Instr::Compare(CmpOp::Eq, arg(0)?, z))
            }
            Op::Unary(u) => self.push(Instr::Unary(*u, arg(0)?)),
            Op::Binary(b) => self.push(Instr::Binary(*b, arg(0)?, arg(1)?)),
            Op::BinaryScalar(b, s) => {
                let c = self.scalar(*s);
                self.push(Instr::Binary(*b, arg(0)?, c))
            }
            Op::Compare(c) => self.push(Instr::Compare(*c, arg(0)?, arg(1)?)),
            Op::CompareScalar(c, s) => {
                let k = self.scalar(*s);
                self.push(Instr::Compare(*c, arg(0)?, k))
            }
            Op::Where => self.push(Instr::Where(arg(0)?, arg(1)?, arg(2)?)),
            Op::Clamp { min, max } => {
                self.push(Instr::Clamp { x: arg(0)?, min: min.map(Scalar::to_f64), max: max.map(Scalar::to_f64) })
            }
            Op::Cast(_) => arg(0)?,
            Op::Copy => arg(1)?,
            Op::Clone => arg(0)?,
            Op::FullLike { value, .. } | Op::Full { value, .. } => self.scalar(*value),
            other => return Err(PlanError::Internal(format!("{} is not a fusible pointwise op", other.name()))),
        };
        // Values of narrower dtypes are rounded where the graph would have stored them.
        let needs_round = match out.dtype {
            DType::F16 | DType::BF16 => true,
            DType::F32 => self.compute == Compute::F64,
            DType::Bool => !matches!(op, Op::Compare(_) | Op::CompareScalar(..) | Op::Unary(UnaryOp::LogicalNot)),
            _ => false,
        };
        Ok(if needs_round { self.push(Instr::Round(out.dtype, v)) } else { v })
    }
    /// The body computing the registers `live` (its stores, a reduction's value):
    /// instructions nothing live reads are dropped (the fill of a `full_like` that a
    /// `copy` overwrites whole, as `clone` decomposes), and loads only they read, so a
    /// live register's dependencies all come before it and the last live register is
    /// the last instruction. Returns the body and each old register's new number.
    pub(crate) fn finish_live(self, live: &[usize]) -> (Body, Vec<Option<usize>>) {
        let n = self.instrs.len();
        let mut needed = vec![false; n];
        for &r in live {
            if r < n {
                needed[r] = true;
            }
        }
        for i in (0..n).rev() {
            if needed[i] {
                for a in operands(&self.instrs[i]) {
                    needed[a] = true;
                }
            }
        }
        let mut reg = vec![None; n];
        let mut load_map: Vec<Option<usize>> = vec![None; self.loads.len()];
        let mut loads = Vec::new();
        let mut instrs = Vec::with_capacity(n);
        for (i, ins) in self.instrs.into_iter().enumerate() {
            if !needed[i] {
                continue;
            }
            let r = |x: usize| reg[x].unwrap_or(x);
            let ins = match ins {
                Instr::Load(l) => Instr::Load(*load_map[l].get_or_insert_with(|| {
                    loads.push(self.loads[l].clone());
                    loads.len() - 1
                })),
                Instr::Const(c) => Instr::Const(c),
                Instr::Unary(u, a) => Instr::Unary(u, r(a)),
                Instr::Binary(b, a, c) => Instr::Binary(b, r(a), r(c)),
                Instr::Compare(c, a, b) => Instr::Compare(c, r(a), r(b)),
                Instr::Where(c, a, b) => Instr::Where(r(c), r(a), r(b)),
                Instr::Clamp { x, min, max } => Instr::Clamp { x: r(x), min, max },
                Instr::Round(d, a) => Instr::Round(d, r(a)),
            };
            reg[i] = Some(instrs.len());
            instrs.push(ins);
        }
        (Body { compute: self.compute, loads, instrs }, reg)
    }
}

/// The registers an instruction reads.
fn operands(i: &Instr) -> Vec<usize> {
    match *i {
        Instr::Load(_) | Instr::Const(_) => vec![],
        Instr::Unary(_, a) | Instr::Clamp { x: a, .. } | Instr::Round(_, a) => vec![a],
        Instr::Binary(_, a, b) | Instr::Compare(_, a, b) => vec![a, b],
        Instr::Where(c, a, b) => vec![c, a, b],
    }
}

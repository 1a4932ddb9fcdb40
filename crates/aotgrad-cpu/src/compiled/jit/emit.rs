//! The emitter: the assembler of one module with its constant pool and instruction
//! set ([`Em`]), the register file and stack frame every kernel uses, and the
//! primitives (moves, masks, compares, arithmetic) as the same IEEE operation on
//! AVX-512 and AVX2 — only registers, masks and constants' encodings differ.

use super::isa::Isa;
use crate::compiled::kernels::Src;
use iced_x86::code_asm::*;
use std::collections::HashMap;

/// Most accesses (loads plus stores) a compiled kernel takes; 9 live in registers.
pub(super) const MAX_ACCESSES: usize = 16;

pub(super) type R<T> = Result<T, IcedError>;

/// A vector register by number (zmm or ymm, as the module's [`Isa`] says).
pub(super) type V = usize;

/// A mask: AVX-512 mask register `k2` (compares), or on AVX2 the one vector register
/// kept for masks (`ymm15`).
pub(super) const AVX2_MASK: V = 15;

/// Stack frame: spilled access addresses, the `outer` pointer, then (AVX2) the tail's
/// lane mask and a spill of the tail's reduced value (8-byte words).
pub(super) const FRAME_OUTER: i32 = 8 * MAX_ACCESSES as i32;
pub(super) const FRAME_TAIL_MASK: i32 = FRAME_OUTER + 16;
pub(super) const FRAME_TAIL_VALUE: i32 = FRAME_TAIL_MASK + 32;
pub(super) const FRAME_BYTES: i32 = FRAME_TAIL_VALUE + 32;

/// Registers holding the accesses' current run addresses; the rest live on the stack.
pub(super) const AREG: [AsmRegister64; 9] = [rbx, rbp, r8, r12, r13, r14, r15, rsi, rdi];

/// `cmpps` predicates (quiet, as Rust's comparisons).
pub(super) mod pred {
    pub const EQ_OQ: i32 = 0x00;
    pub const UNORD_Q: i32 = 0x03;
    pub const NEQ_UQ: i32 = 0x04;
    pub const NLE_UQ: i32 = 0x16;
    pub const LT_OQ: i32 = 0x11;
    pub const LE_OQ: i32 = 0x12;
    pub const GE_OQ: i32 = 0x1D;
    pub const GT_OQ: i32 = 0x1E;
}

pub(super) const ZMM: [AsmRegisterZmm; 32] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14, zmm15, zmm16, zmm17,
    zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27, zmm28, zmm29, zmm30, zmm31,
];
pub(super) const YMM: [AsmRegisterYmm; 32] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15, ymm16, ymm17,
    ymm18, ymm19, ymm20, ymm21, ymm22, ymm23, ymm24, ymm25, ymm26, ymm27, ymm28, ymm29, ymm30, ymm31,
];
pub(super) const XMM: [AsmRegisterXmm; 32] = [
    xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14, xmm15, xmm16, xmm17,
    xmm18, xmm19, xmm20, xmm21, xmm22, xmm23, xmm24, xmm25, xmm26, xmm27, xmm28, xmm29, xmm30, xmm31,
];

/// The constant pool: one label per distinct 32-bit pattern (a broadcast dword on
/// AVX-512, a whole vector of it on AVX2), and the lane indices.
pub(super) struct Pool {
    pub(super) labels: HashMap<u32, CodeLabel>,
    pub(super) iota: Option<CodeLabel>,
}

impl Pool {
    pub(super) fn label(&mut self, a: &mut CodeAssembler, bits: u32) -> CodeLabel {
        *self.labels.entry(bits).or_insert_with(|| a.create_label())
    }
    pub(super) fn emit(self, a: &mut CodeAssembler, isa: Isa) -> R<()> {
        let lanes = isa.lanes() as u32;
        if let Some(mut l) = self.iota {
            a.set_label(&mut l)?;
            let idx: Vec<u32> = (0..lanes).collect();
            a.dd(&idx)?;
        }
        let mut all: Vec<(u32, CodeLabel)> = self.labels.into_iter().collect();
        all.sort_by_key(|(b, _)| *b);
        for (bits, mut l) in all {
            a.set_label(&mut l)?;
            let n = if isa == Isa::Avx2 { lanes as usize } else { 1 };
            a.dd(&vec![bits; n])?;
        }
        Ok(())
    }
}

/// An operand of a binary instruction.
#[derive(Clone, Copy)]
pub(super) enum Opnd {
    Reg(V),
    Const(f32),
    Bits(u32),
}

pub(super) fn opnd(s: &Src) -> Opnd {
    match s {
        Src::Reg(r) => Opnd::Reg(*r),
        Src::Const(c) => Opnd::Const(*c as f32),
    }
}

/// The emitter of one module: the assembler, its constant pool and instruction set.
/// Every primitive is the same IEEE operation on either set; only registers, masks
/// and constants' encodings differ.
pub(super) struct Em<'a> {
    pub(super) a: &'a mut CodeAssembler,
    pub(super) pool: Pool,
    pub(super) isa: Isa,
}

/// Emit `$m(d, x, y)` for a second source that may be a pooled constant.
macro_rules! two {
    ($em:ident, $m:ident, $d:expr, $x:expr, $y:expr) => {{
        let (d, x) = ($d, $x);
        match ($em.isa, $y) {
            (Isa::Avx512, Opnd::Reg(y)) => $em.a.$m(ZMM[d], ZMM[x], ZMM[y]),
            (Isa::Avx2, Opnd::Reg(y)) => $em.a.$m(YMM[d], YMM[x], YMM[y]),
            (isa, c) => {
                let bits = match c {
                    Opnd::Const(v) => v.to_bits(),
                    Opnd::Bits(b) => b,
                    Opnd::Reg(_) => unreachable!("matched above"),
                };
                let l = $em.pool.label($em.a, bits);
                match isa {
                    Isa::Avx512 => $em.a.$m(ZMM[d], ZMM[x], dword_bcst(l)),
                    Isa::Avx2 => $em.a.$m(YMM[d], YMM[x], ymmword_ptr(l)),
                }
            }
        }
    }};
}

impl Em<'_> {
    pub(super) fn bits_mem(&mut self, bits: u32) -> AsmMemoryOperand {
        let l = self.pool.label(self.a, bits);
        match self.isa {
            Isa::Avx512 => dword_bcst(l),
            Isa::Avx2 => ymmword_ptr(l),
        }
    }
    /// `d = broadcast(c)`.
    pub(super) fn splat(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d], dword_ptr(l)),
            Isa::Avx2 => self.a.vbroadcastss(YMM[d], dword_ptr(l)),
        }
    }
    pub(super) fn mov(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d], ZMM[x]),
            Isa::Avx2 => self.a.vmovaps(YMM[d], YMM[x]),
        }
    }
    pub(super) fn zero(&mut self, d: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vxorps(ZMM[d], ZMM[d], ZMM[d]),
            Isa::Avx2 => self.a.vxorps(YMM[d], YMM[d], YMM[d]),
        }
    }
    pub(super) fn add(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vaddps, d, x, y)
    }
    pub(super) fn sub(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vsubps, d, x, y)
    }
    pub(super) fn mul(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vmulps, d, x, y)
    }
    pub(super) fn div(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vdivps, d, x, y)
    }
    pub(super) fn max(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vmaxps, d, x, y)
    }
    pub(super) fn min(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vminps, d, x, y)
    }
    pub(super) fn and(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vandps, d, x, y)
    }
    pub(super) fn or(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vorps, d, x, y)
    }
    pub(super) fn xor(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vxorps, d, x, y)
    }
    pub(super) fn isub(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vpsubd, d, x, y)
    }
    pub(super) fn iadd(&mut self, d: V, x: V, y: Opnd) -> R<()> {
        two!(self, vpaddd, d, x, y)
    }
    pub(super) fn shl(&mut self, d: V, x: V, n: i32) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vpslld(ZMM[d], ZMM[x], n),
            Isa::Avx2 => self.a.vpslld(YMM[d], YMM[x], n),
        }
    }
    pub(super) fn sqrt(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vsqrtps(ZMM[d], ZMM[x]),
            Isa::Avx2 => self.a.vsqrtps(YMM[d], YMM[x]),
        }
    }
    /// Round to an integer by `mode` (0x08 nearest even, 0x09 floor, 0x0A ceil, 0x0B
    /// truncate, the precision exception suppressed).
    pub(super) fn round(&mut self, d: V, x: V, mode: i32) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vrndscaleps(ZMM[d], ZMM[x], mode),
            Isa::Avx2 => self.a.vroundps(YMM[d], YMM[x], mode),
        }
    }
    /// `d = x` rounded to f16 and back.
    pub(super) fn round_f16(&mut self, d: V, x: V) -> R<()> {
        let t = self.isa.t(0);
        match self.isa {
            Isa::Avx512 => {
                self.a.vcvtps2ph(YMM[t], ZMM[x], 0)?;
                self.a.vcvtph2ps(ZMM[d], YMM[t])
            }
            Isa::Avx2 => {
                self.a.vcvtps2ph(XMM[t], YMM[x], 0)?;
                self.a.vcvtph2ps(YMM[d], XMM[t])
            }
        }
    }
    /// The mask `x pr y`.
    pub(super) fn cmp(&mut self, x: V, y: Opnd, pr: i32) -> R<()> {
        match (self.isa, y) {
            (Isa::Avx512, Opnd::Reg(y)) => self.a.vcmpps(k2, ZMM[x], ZMM[y], pr),
            (Isa::Avx2, Opnd::Reg(y)) => self.a.vcmpps(YMM[AVX2_MASK], YMM[x], YMM[y], pr),
            (isa, c) => {
                let bits = match c {
                    Opnd::Const(v) => v.to_bits(),
                    Opnd::Bits(b) => b,
                    Opnd::Reg(_) => unreachable!("matched above"),
                };
                let m = self.bits_mem(bits);
                match isa {
                    Isa::Avx512 => self.a.vcmpps(k2, ZMM[x], m, pr),
                    Isa::Avx2 => self.a.vcmpps(YMM[AVX2_MASK], YMM[x], m, pr),
                }
            }
        }
    }
    /// `d = mask ? x : d`.
    pub(super) fn mov_if(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d].k2(), ZMM[x]),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[d], YMM[x], YMM[AVX2_MASK]),
        }
    }
    /// `d = mask ? x : 0`.
    pub(super) fn mov_if_z(&mut self, d: V, x: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vmovaps(ZMM[d].k2().z(), ZMM[x]),
            Isa::Avx2 => self.a.vandps(YMM[d], YMM[AVX2_MASK], YMM[x]),
        }
    }
    /// `d = mask ? c : d`.
    pub(super) fn const_if(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d].k2(), dword_ptr(l)),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[d], ymmword_ptr(l), YMM[AVX2_MASK]),
        }
    }
    /// `d = mask ? c : 0`.
    pub(super) fn const_if_z(&mut self, d: V, c: f32) -> R<()> {
        let l = self.pool.label(self.a, c.to_bits());
        match self.isa {
            Isa::Avx512 => self.a.vbroadcastss(ZMM[d].k2().z(), dword_ptr(l)),
            Isa::Avx2 => self.a.vandps(YMM[d], YMM[AVX2_MASK], ymmword_ptr(l)),
        }
    }
    /// `d = mask ? x : y`.
    pub(super) fn blend(&mut self, d: V, x: V, y: V) -> R<()> {
        match self.isa {
            Isa::Avx512 => self.a.vblendmps(ZMM[d].k2(), ZMM[y], ZMM[x]),
            Isa::Avx2 => self.a.vblendvps(YMM[d], YMM[y], YMM[x], YMM[AVX2_MASK]),
        }
    }
    /// `o` in a register (a constant is broadcast into `scratch`).
    pub(super) fn reg_of(&mut self, o: Opnd, scratch: V) -> R<V> {
        Ok(match o {
            Opnd::Reg(r) => r,
            Opnd::Const(c) => {
                self.splat(scratch, c)?;
                scratch
            }
            Opnd::Bits(b) => {
                self.splat(scratch, f32::from_bits(b))?;
                scratch
            }
        })
    }
    /// AVX2: the tail's lane mask (from the stack) into the mask register.
    pub(super) fn tail_mask(&mut self) -> R<()> {
        self.a.vmovups(YMM[AVX2_MASK], ymmword_ptr(rsp + FRAME_TAIL_MASK))
    }
}

/// Where access `a`'s current run address is.
#[derive(Clone, Copy)]
pub(super) enum Base {
    Reg(AsmRegister64),
    Stack(i32),
}

pub(super) fn base_of(a: usize) -> Base {
    if a < AREG.len() {
        Base::Reg(AREG[a])
    } else {
        Base::Stack(8 * (a - AREG.len()) as i32)
    }
}

/// The register holding access `a`'s address, loading a spilled one into `rax`.
pub(super) fn addr(a: &mut CodeAssembler, acc: usize) -> R<AsmRegister64> {
    match base_of(acc) {
        Base::Reg(r) => Ok(r),
        Base::Stack(off) => {
            a.mov(rax, qword_ptr(rsp + off))?;
            Ok(rax)
        }
    }
}

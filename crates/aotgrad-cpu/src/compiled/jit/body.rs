//! A kernel's body in vector registers: loads (contiguous, broadcast or gathered,
//! with converting loads), each lowered instruction as vector code, and the
//! polynomial `exp`, `erf` and `tanh` of [`crate::compiled::math`], operation for
//! operation.

use super::emit::*;
use super::isa::Isa;
use super::spec::Spec;
use crate::compiled::kernels::LInstr;
use aotgrad_ir::{BinaryOp, CmpOp, DType, UnaryOp};
use iced_x86::code_asm::*;

/// The body over one vector of lanes (`masked`: the run's tail lanes), its stores
/// included; a reduction's accumulation follows (`reduce::accumulate`).
pub(super) fn body(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    let nl = p.body.loads.len();
    let t0 = em.isa.t(0);
    for ins in &p.body.instrs {
        match ins {
            LInstr::Load { load, d } => load_vec(em, *load, p.load_inner[*load], *d, masked)?,
            LInstr::Fill { v, d } => em.splat(*d, *v as f32)?,
            LInstr::Unary { op, a: x, d } => unary(em, *op, *x, *d)?,
            LInstr::Binary { op, a: x, b: y, d } => binary(em, *op, opnd(x), opnd(y), *d)?,
            LInstr::Compare { op, a: x, b: y, d } => {
                let x = em.reg_of(opnd(x), t0)?;
                let pr = match op {
                    CmpOp::Eq => pred::EQ_OQ,
                    CmpOp::Ne => pred::NEQ_UQ,
                    CmpOp::Lt => pred::LT_OQ,
                    CmpOp::Le => pred::LE_OQ,
                    CmpOp::Gt => pred::GT_OQ,
                    CmpOp::Ge => pred::GE_OQ,
                };
                em.cmp(x, opnd(y), pr)?;
                em.const_if_z(*d, 1.0)?;
            }
            LInstr::Where { c, a: x, b: y, d } => {
                em.cmp(*c, Opnd::Const(0.0), pred::NEQ_UQ)?;
                em.blend(*d, *x, *y)?;
            }
            LInstr::Clamp { a: x, lo, hi, d } => {
                em.mov(*d, *x)?;
                // Lanes below `lo` (above `hi`) take the bound; NaN compares false.
                for (bound, pr) in [(lo, pred::LT_OQ), (hi, pred::GT_OQ)] {
                    if let Some(b) = bound {
                        em.cmp(*d, Opnd::Const(*b as f32), pr)?;
                        em.const_if(*d, *b as f32)?;
                    }
                }
            }
            LInstr::Round { dtype, a: x, d } => match dtype {
                DType::F16 => em.round_f16(*d, *x)?,
                DType::Bool => {
                    em.cmp(*x, Opnd::Const(0.0), pred::NEQ_UQ)?;
                    em.const_if_z(*d, 1.0)?;
                }
                _ => em.mov(*d, *x)?,
            },
        }
    }
    if masked && em.isa == Isa::Avx2 && !p.stores.is_empty() {
        em.tail_mask()?;
    }
    for (s, reg) in p.stores.iter().enumerate() {
        let base = addr(em.a, nl + s)?;
        match (em.isa, masked) {
            (Isa::Avx512, false) => em.a.vmovups(zmmword_ptr(base + r10 * 4), ZMM[*reg])?,
            (Isa::Avx512, true) => em.a.vmovups(zmmword_ptr(base + r10 * 4).k1(), ZMM[*reg])?,
            (Isa::Avx2, false) => em.a.vmovups(ymmword_ptr(base + r10 * 4), YMM[*reg])?,
            (Isa::Avx2, true) => em.a.vmaskmovps(ymmword_ptr(base + r10 * 4), YMM[AVX2_MASK], YMM[*reg])?,
        }
    }
    Ok(())
}

pub(super) fn load_vec(em: &mut Em, acc: usize, stride: usize, d: V, masked: bool) -> R<()> {
    let base = addr(em.a, acc)?;
    let isa = em.isa;
    match (isa, stride) {
        (Isa::Avx512, 0) => em.a.vbroadcastss(ZMM[d], dword_ptr(base)),
        (Isa::Avx2, 0) => em.a.vbroadcastss(YMM[d], dword_ptr(base)),
        (Isa::Avx512, 1) => {
            let at = zmmword_ptr(base + r10 * 4);
            if masked {
                em.a.vmovups(ZMM[d].k1().z(), at)
            } else {
                em.a.vmovups(ZMM[d], at)
            }
        }
        (Isa::Avx2, 1) => {
            let at = ymmword_ptr(base + r10 * 4);
            if masked {
                em.tail_mask()?;
                em.a.vmaskmovps(YMM[d], YMM[AVX2_MASK], at)
            } else {
                em.a.vmovups(YMM[d], at)
            }
        }
        (_, s) => {
            // Lane l reads element (i + l) * s (masked-off lanes: zero).
            let iota = *em.pool.iota.get_or_insert_with(|| em.a.create_label());
            let stride = em.bits_mem(s as u32);
            let (ix, gm) = (isa.t(7), isa.t(6));
            match isa {
                Isa::Avx512 => {
                    let a = &mut *em.a;
                    a.vpbroadcastd(ZMM[ix], r10d)?;
                    a.vpaddd(ZMM[ix], ZMM[ix], zmmword_ptr(iota))?;
                    a.vpmulld(ZMM[ix], ZMM[ix], stride)?;
                    if masked {
                        a.kmovw(k3, k1)?;
                    } else {
                        a.kxnorw(k3, k3, k3)?;
                    }
                    a.vxorps(ZMM[d], ZMM[d], ZMM[d])?;
                    a.vgatherdps(ZMM[d].k3(), zmmword_ptr(base + ZMM[ix] * 4))
                }
                Isa::Avx2 => {
                    if masked {
                        em.a.vmovups(YMM[gm], ymmword_ptr(rsp + FRAME_TAIL_MASK))?;
                    }
                    let a = &mut *em.a;
                    a.vmovd(XMM[ix], r10d)?;
                    a.vpbroadcastd(YMM[ix], XMM[ix])?;
                    a.vpaddd(YMM[ix], YMM[ix], ymmword_ptr(iota))?;
                    a.vpmulld(YMM[ix], YMM[ix], stride)?;
                    if !masked {
                        a.vpcmpeqd(YMM[gm], YMM[gm], YMM[gm])?;
                    }
                    a.vxorps(YMM[d], YMM[d], YMM[d])?;
                    a.vgatherdps_3(YMM[d], dword_ptr(base + YMM[ix] * 4), YMM[gm])
                }
            }
        }
    }
}

pub(super) fn binary(em: &mut Em, op: BinaryOp, x: Opnd, y: Opnd, d: V) -> R<()> {
    let t0 = em.isa.t(0);
    let x = em.reg_of(x, t0)?;
    match op {
        BinaryOp::Pow => {
            let Opnd::Const(c) = y else { unreachable!("`covers` admits constant exponents only") };
            if c == 1.0 {
                em.mov(d, x)
            } else if c == 2.0 {
                em.mul(d, x, Opnd::Reg(x))
            } else if c == 3.0 {
                em.mul(d, x, Opnd::Reg(x))?;
                em.mul(d, d, Opnd::Reg(x))
            } else {
                em.splat(d, 1.0)?;
                em.div(d, d, Opnd::Reg(x))
            }
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // NaN on either side gives NaN: the instruction returns the second source
            // when either is NaN, so a NaN first source is put back after.
            if op == BinaryOp::Maximum {
                em.max(d, x, y)?;
            } else {
                em.min(d, x, y)?;
            }
            em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
            em.mov_if(d, x)
        }
        BinaryOp::Add => em.add(d, x, y),
        BinaryOp::Sub => em.sub(d, x, y),
        BinaryOp::Mul => em.mul(d, x, y),
        BinaryOp::Div => em.div(d, x, y),
    }
}

pub(super) fn unary(em: &mut Em, op: UnaryOp, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (t0, t5, t6) = (t(0), t(5), t(6));
    match op {
        UnaryOp::Neg => em.xor(d, x, Opnd::Bits(0x8000_0000)),
        UnaryOp::Abs => em.and(d, x, Opnd::Bits(0x7fff_ffff)),
        UnaryOp::Sqrt => em.sqrt(d, x),
        UnaryOp::Rsqrt => {
            em.sqrt(t0, x)?;
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(t0))
        }
        UnaryOp::Reciprocal => {
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(x))
        }
        UnaryOp::Relu => {
            // x when x > 0 or NaN, else +0.
            em.cmp(x, Opnd::Const(0.0), pred::NLE_UQ)?;
            em.mov_if_z(d, x)
        }
        UnaryOp::Sign => {
            em.zero(d)?;
            em.cmp(x, Opnd::Const(0.0), pred::GT_OQ)?;
            em.const_if(d, 1.0)?;
            em.cmp(x, Opnd::Const(0.0), pred::LT_OQ)?;
            em.const_if(d, -1.0)
        }
        UnaryOp::LogicalNot => {
            em.cmp(x, Opnd::Const(0.0), pred::EQ_OQ)?;
            em.const_if_z(d, 1.0)
        }
        UnaryOp::Floor => em.round(d, x, 0x09),
        UnaryOp::Ceil => em.round(d, x, 0x0A),
        UnaryOp::Trunc => em.round(d, x, 0x0B),
        UnaryOp::Round => em.round(d, x, 0x08),
        UnaryOp::Exp => exp(em, x, d, [t(0), t(1), t(2), t(3), t(4)]),
        UnaryOp::Sigmoid => {
            // 1 / (1 + exp(-x))
            em.xor(t5, x, Opnd::Bits(0x8000_0000))?;
            exp(em, t5, t6, [t(0), t(1), t(2), t(3), t(4)])?;
            em.add(t6, t6, Opnd::Const(1.0))?;
            em.splat(d, 1.0)?;
            em.div(d, d, Opnd::Reg(t6))
        }
        UnaryOp::Erf => erf(em, x, d),
        UnaryOp::Tanh => tanh(em, x, d),
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1 => {
            unreachable!("`covers` rejects {op:?}")
        }
    }
}

/// `d = d * z` then `d = d + c` as separate roundings (Rust never fuses them).
pub(super) fn horner_step(em: &mut Em, d: V, z: V, add: f32) -> R<()> {
    em.mul(d, d, Opnd::Reg(z))?;
    em.add(d, d, Opnd::Const(add))
}

/// `d = exp(x)` as [`crate::compiled::math::exp_f32`]; `t` are scratch registers distinct from
/// `x` and `d`.
pub(super) fn exp(em: &mut Em, x: V, d: V, t: [V; 5]) -> R<()> {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0;
    // xc = clamp(x, -87, 88) (a NaN lane is replaced at the end).
    em.max(t[0], x, Opnd::Const(-87.0))?;
    em.min(t[0], t[0], Opnd::Const(88.0))?;
    // t = xc * log2e + magic; n = t - magic
    em.mul(t[1], t[0], Opnd::Const(LOG2E))?;
    em.add(t[1], t[1], Opnd::Const(MAGIC))?;
    em.sub(t[2], t[1], Opnd::Const(MAGIC))?;
    // 2^n from t's low mantissa bits.
    em.isub(t[3], t[1], Opnd::Bits(0x4B40_0000))?;
    em.iadd(t[3], t[3], Opnd::Bits(127))?;
    em.shl(t[3], t[3], 23)?;
    // r = (xc - n * ln2_hi) - n * ln2_lo
    em.mul(t[4], t[2], Opnd::Const(0.693_145_75))?;
    em.sub(t[0], t[0], Opnd::Reg(t[4]))?;
    em.mul(t[4], t[2], Opnd::Const(1.428_606_8e-6))?;
    em.sub(t[0], t[0], Opnd::Reg(t[4]))?;
    // p = 1 + r * (1 + r * (0.5 + r * (...)))
    em.mul(t[1], t[0], Opnd::Const(0.000_198_412_7))?;
    em.add(t[1], t[1], Opnd::Const(0.001_388_889))?;
    for c in [0.008_333_334, 0.041_666_668, 0.166_666_67, 0.5, 1.0, 1.0] {
        horner_step(em, t[1], t[0], c)?;
    }
    em.mul(d, t[1], Opnd::Reg(t[3]))?;
    em.cmp(x, Opnd::Const(88.72), pred::GT_OQ)?;
    em.const_if(d, f32::INFINITY)?;
    em.cmp(x, Opnd::Const(-87.33), pred::LT_OQ)?;
    em.const_if(d, 0.0)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

/// `d = erf(x)` as [`crate::compiled::math::erf_f32`].
pub(super) fn erf(em: &mut Em, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (c, z, p, q, t4, t5) = (t(0), t(1), t(2), t(3), t(4), t(5));
    em.max(c, x, Opnd::Const(-4.0))?;
    em.min(c, c, Opnd::Const(4.0))?;
    em.mul(z, c, Opnd::Reg(c))?;
    em.mul(p, z, Opnd::Const(-2.726_142_3e-10))?;
    em.add(p, p, Opnd::Const(2.770_681_4e-8))?;
    for k in [-2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_6e-3, -1.609_603_3e-2] {
        horner_step(em, p, z, k)?;
    }
    em.mul(p, p, Opnd::Reg(c))?;
    em.mul(q, z, Opnd::Const(-1.456_607_2e-5))?;
    em.add(q, q, Opnd::Const(-2.133_740_6e-4))?;
    for k in [-1.682_827e-3, -7.373_329_2e-3, -1.426_474e-2] {
        horner_step(em, q, z, k)?;
    }
    em.div(d, p, Opnd::Reg(q))?;
    // |c| > 3.92: ±1 with x's sign.
    em.and(t4, c, Opnd::Bits(0x7fff_ffff))?;
    em.cmp(t4, Opnd::Const(3.92), pred::GT_OQ)?;
    em.and(t5, x, Opnd::Bits(0x8000_0000))?;
    em.or(t5, t5, Opnd::Bits(1f32.to_bits()))?;
    em.mov_if(d, t5)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

/// `d = tanh(x)` as [`crate::compiled::math::tanh_f32`].
pub(super) fn tanh(em: &mut Em, x: V, d: V) -> R<()> {
    let isa = em.isa;
    let t = |i: usize| isa.t(i);
    let (abs, e, z2) = (t(5), t(6), t(7));
    // a = min(|x|, 20) (Rust's min: a NaN |x| gives 20; NaN lanes are replaced below).
    em.and(abs, x, Opnd::Bits(0x7fff_ffff))?;
    em.min(abs, abs, Opnd::Const(20.0))?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.const_if(abs, 20.0)?;
    em.add(z2, abs, Opnd::Reg(abs))?;
    exp(em, z2, e, [t(0), t(1), t(2), t(3), t(4)])?;
    // big = copysign(1 - 2 / (e + 1), x)
    em.add(e, e, Opnd::Const(1.0))?;
    em.splat(d, 2.0)?;
    em.div(d, d, Opnd::Reg(e))?;
    em.splat(e, 1.0)?;
    em.sub(d, e, Opnd::Reg(d))?;
    em.and(d, d, Opnd::Bits(0x7fff_ffff))?;
    em.and(e, x, Opnd::Bits(0x8000_0000))?;
    em.or(d, d, Opnd::Reg(e))?;
    // small = x * (1 + z2 * (...)) for a < 0.125
    em.mul(z2, x, Opnd::Reg(x))?;
    em.mul(e, z2, Opnd::Const(0.021_869_488))?;
    em.add(e, e, Opnd::Const(-0.053_968_254))?;
    for k in [0.133_333_34, -0.333_333_34, 1.0] {
        horner_step(em, e, z2, k)?;
    }
    em.mul(e, e, Opnd::Reg(x))?;
    em.cmp(abs, Opnd::Const(0.125), pred::LT_OQ)?;
    em.mov_if(d, e)?;
    em.cmp(x, Opnd::Reg(x), pred::UNORD_Q)?;
    em.mov_if(d, x)
}

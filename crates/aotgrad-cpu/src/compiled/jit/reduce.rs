//! A reduction's accumulation in vector registers: a row's partial sums (f64) or
//! running extreme, folded into its accumulator in the interpreter's fixed order, so
//! compiled and interpreted reductions agree bit for bit.

use super::emit::*;
use super::isa::Isa;
use super::spec::Spec;
use aotgrad_ir::ReduceOp;
use iced_x86::code_asm::*;

// AVX-512 reduction registers: a row's two f64 partial sums (or its running extreme
// in `RED_M`, with `k5` the lanes that saw a NaN), and scratch for combining them.
pub(super) const RED_A0: AsmRegisterZmm = zmm20;
pub(super) const RED_A1: AsmRegisterZmm = zmm21;
pub(super) const RED_M: AsmRegisterZmm = zmm20;
pub(super) const RED_T: AsmRegisterZmm = zmm22;
pub(super) const RED_U: AsmRegisterZmm = zmm23;
// AVX2 reduction registers: a row's partial sums of lanes 0-3 and 4-7 (f64), above
// the body's values.
pub(super) const RED2_A0: AsmRegisterYmm = ymm5;
pub(super) const RED2_A1: AsmRegisterYmm = ymm6;

/// A reduction over the run's row starts afresh (the accumulated row, for a reduced
/// inner dim, as [`crate::compiled::exec`]'s `sum_f64` / `extreme` start).
pub(super) fn row_start(em: &mut Em, p: &Spec) -> R<()> {
    let a = &mut *em.a;
    match (em.isa, p.reduce) {
        (Isa::Avx512, Some((ReduceOp::Sum | ReduceOp::Mean, _, 0))) => {
            a.vxorpd(RED_A0, RED_A0, RED_A0)?;
            a.vxorpd(RED_A1, RED_A1, RED_A1)
        }
        (Isa::Avx512, Some((ReduceOp::Amax | ReduceOp::Amin, _, 0))) => a.kxorw(k5, k5, k5),
        (Isa::Avx2, Some((ReduceOp::Sum | ReduceOp::Mean, _, 0))) => {
            a.vxorpd(RED2_A0, RED2_A0, RED2_A0)?;
            a.vxorpd(RED2_A1, RED2_A1, RED2_A1)
        }
        _ => Ok(()),
    }
}

/// Accumulate one vector of the reduced value (the tail's lanes when `masked`).
pub(super) fn accumulate(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    match em.isa {
        Isa::Avx512 => accumulate_avx512(em.a, p, masked),
        Isa::Avx2 => accumulate_avx2(em, p, masked),
    }
}

pub(super) fn accumulate_avx512(a: &mut CodeAssembler, p: &Spec, masked: bool) -> R<()> {
    let Some((op, value, dst_inner)) = p.reduce else { return Ok(()) };
    let v = ZMM[value];
    let acc = addr(a, p.body.loads.len())?;
    let max = op == ReduceOp::Amax;
    match (op, dst_inner) {
        (ReduceOp::Sum | ReduceOp::Mean, 0) => {
            // As `simd::sum_f32_f64`: lanes 0-7 into A0, 8-15 into A1; a tail adds
            // zeros for its missing lanes, and to A1 only when it has more than 8.
            if masked {
                a.vmovaps(v.k1().z(), v)?;
            }
            a.vcvtps2pd(RED_T, YMM[value])?;
            a.vaddpd(RED_A0, RED_A0, RED_T)?;
            let mut skip = a.create_label();
            if masked {
                a.mov(rax, rcx)?;
                a.sub(rax, r10)?;
                a.cmp(rax, 8)?;
                a.jle(skip)?;
            }
            a.vextractf32x8(ymm22, v, 1)?;
            a.vcvtps2pd(RED_T, ymm22)?;
            a.vaddpd(RED_A1, RED_A1, RED_T)?;
            if masked {
                a.set_label(&mut skip)?;
                a.nop()?;
            }
            Ok(())
        }
        (ReduceOp::Amax | ReduceOp::Amin, 0) => {
            // As `simd::extreme_f32`: the row's first value in every lane, then the
            // lane-wise extreme (a tail keeps the running value in its missing lanes).
            let mut not_first = a.create_label();
            a.test(r10, r10)?;
            a.jnz(not_first)?;
            a.vbroadcastss(RED_M, XMM[value])?;
            a.set_label(&mut not_first)?;
            let x = if masked {
                a.vblendmps(RED_U.k1(), RED_M, v)?;
                RED_U
            } else {
                v
            };
            if max {
                a.vmaxps(RED_M, RED_M, x)?;
            } else {
                a.vminps(RED_M, RED_M, x)?;
            }
            a.vcmpps(k4, x, x, pred::UNORD_Q)?;
            a.korw(k5, k5, k4)
        }
        (_, _) => {
            // A kept inner dim: one f64 accumulator per lane, `a + x` (or the extreme
            // as `combine_extreme`), in element order.
            a.kshiftrw(k4, k1, 8)?;
            for half in 0..2 {
                let src = if half == 0 {
                    YMM[value]
                } else {
                    a.vextractf32x8(ymm22, v, 1)?;
                    ymm22
                };
                a.vcvtps2pd(RED_T, src)?;
                let at = zmmword_ptr(acc + r10 * 8 + 64 * half);
                match (masked, half) {
                    (false, _) => a.vmovupd(RED_U, at)?,
                    (true, 0) => a.vmovupd(RED_U.k1().z(), at)?,
                    (true, _) => a.vmovupd(RED_U.k4().z(), at)?,
                }
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => a.vaddpd(RED_U, RED_U, RED_T)?,
                    _ => {
                        // x wins when x > a (x < a for a minimum) or x is NaN.
                        let pr = if max { pred::GT_OQ } else { pred::LT_OQ };
                        a.vcmppd(k6, RED_T, RED_U, pr)?;
                        a.vcmppd(k7, RED_T, RED_T, pred::UNORD_Q)?;
                        a.korw(k6, k6, k7)?;
                        a.vmovapd(RED_U.k6(), RED_T)?;
                    }
                }
                let at = zmmword_ptr(acc + r10 * 8 + 64 * half);
                match (masked, half) {
                    (false, _) => a.vmovupd(at, RED_U)?,
                    (true, 0) => a.vmovupd(at.k1(), RED_U)?,
                    (true, _) => a.vmovupd(at.k4(), RED_U)?,
                }
            }
            Ok(())
        }
    }
}

/// AVX2 covers sums and means (`Spec::check`): over a reduced inner dim as the
/// interpreter's `sum_f64` without AVX-512 (lanes 0-3 and 4-7 of full vectors into two
/// f64 partial sums; the tail's values added one by one after the lanes combine, in
/// `row_finish`), over a kept inner dim one f64 accumulator per lane.
pub(super) fn accumulate_avx2(em: &mut Em, p: &Spec, masked: bool) -> R<()> {
    let Some((_, value, dst_inner)) = p.reduce else { return Ok(()) };
    let (t0, t1) = (em.isa.t(0), em.isa.t(1));
    let acc = addr(em.a, p.body.loads.len())?;
    if dst_inner == 0 {
        if masked {
            // The tail's values, for `row_finish` to add one by one.
            return em.a.vmovups(ymmword_ptr(rsp + FRAME_TAIL_VALUE), YMM[value]);
        }
        let a = &mut *em.a;
        a.vcvtps2pd(YMM[t0], XMM[value])?;
        a.vaddpd(RED2_A0, RED2_A0, YMM[t0])?;
        a.vextractf128(XMM[t1], YMM[value], 1)?;
        a.vcvtps2pd(YMM[t0], XMM[t1])?;
        return a.vaddpd(RED2_A1, RED2_A1, YMM[t0]);
    }
    // Kept inner dim: lanes 0-3 then 4-7, each `acc[j] + x` in f64.
    let (t2, t3) = (em.isa.t(2), em.isa.t(3));
    if masked {
        em.tail_mask()?;
    }
    let a = &mut *em.a;
    for half in 0..2i32 {
        if half == 0 {
            a.vcvtps2pd(YMM[t0], XMM[value])?;
        } else {
            a.vextractf128(XMM[t1], YMM[value], 1)?;
            a.vcvtps2pd(YMM[t0], XMM[t1])?;
        }
        let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
        if masked {
            // The half's four 64-bit lane masks from the tail's 32-bit ones.
            if half == 0 {
                a.vpmovsxdq(YMM[t2], XMM[AVX2_MASK])?;
            } else {
                a.vextracti128(XMM[t3], YMM[AVX2_MASK], 1)?;
                a.vpmovsxdq(YMM[t2], XMM[t3])?;
            }
            a.vmaskmovpd(YMM[t3], YMM[t2], at)?;
            a.vaddpd(YMM[t3], YMM[t3], YMM[t0])?;
            let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
            a.vmaskmovpd(at, YMM[t2], YMM[t3])?;
        } else {
            a.vmovupd(YMM[t3], at)?;
            a.vaddpd(YMM[t3], YMM[t3], YMM[t0])?;
            let at = ymmword_ptr(acc + r10 * 8 + 32 * half);
            a.vmovupd(at, YMM[t3])?;
        }
    }
    Ok(())
}

/// Fold a reduced row into its accumulator, as [`crate::compiled::exec`] does after `sum_f64`
/// or `extreme` (lanes combined in one fixed order, then `acc + s` or
/// `combine_extreme(acc, m)`).
pub(super) fn row_finish(em: &mut Em, p: &Spec) -> R<()> {
    let Some((op, _, 0)) = p.reduce else { return Ok(()) };
    if em.isa == Isa::Avx2 {
        return row_finish_avx2(em, p);
    }
    let acc = addr(em.a, p.body.loads.len())?;
    let a = &mut *em.a;
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            // v = A0 + A1; then lanes 0-3 + 4-7, 0-1 + 2-3, 0 + 1.
            a.vaddpd(RED_A0, RED_A0, RED_A1)?;
            a.vextractf64x4(ymm22, RED_A0, 1)?;
            a.vaddpd(ymm20, ymm20, ymm22)?;
            a.vextractf64x2(xmm22, ymm20, 1)?;
            a.vaddpd(xmm20, xmm20, xmm22)?;
            a.vunpckhpd(xmm22, xmm20, xmm20)?;
            a.vaddsd(xmm20, xmm20, xmm22)?;
            a.vmovsd(xmm22, qword_ptr(acc))?;
            a.vaddsd(xmm22, xmm22, xmm20)?;
            a.vmovsd(qword_ptr(acc), xmm22)
        }
        _ => {
            let max = op == ReduceOp::Amax;
            // Lanes 0-7 against 8-15, 0-3 against 4-7, 0-1 against 2-3, 0 against 1.
            a.vextractf32x8(ymm22, RED_M, 1)?;
            if max {
                a.vmaxps(ymm20, ymm20, ymm22)?;
            } else {
                a.vminps(ymm20, ymm20, ymm22)?;
            }
            a.vextractf32x4(xmm22, ymm20, 1)?;
            if max {
                a.vmaxps(xmm20, xmm20, xmm22)?;
            } else {
                a.vminps(xmm20, xmm20, xmm22)?;
            }
            a.vmovhlps(xmm22, xmm20, xmm20)?;
            if max {
                a.vmaxps(xmm20, xmm20, xmm22)?;
            } else {
                a.vminps(xmm20, xmm20, xmm22)?;
            }
            a.vshufps(xmm22, xmm20, xmm20, 1)?;
            if max {
                a.vmaxss(xmm20, xmm20, xmm22)?;
            } else {
                a.vminss(xmm20, xmm20, xmm22)?;
            }
            // A NaN seen in any lane makes the row NaN.
            let mut clean = a.create_label();
            a.kortestw(k5, k5)?;
            a.jz(clean)?;
            let nan = em.pool.label(a, f32::NAN.to_bits());
            a.vmovss(xmm20, dword_ptr(nan))?;
            a.set_label(&mut clean)?;
            a.vcvtss2sd(xmm20, xmm20, xmm20)?;
            // acc = x when x > acc (x < acc for a minimum) or x is NaN.
            a.vmovsd(xmm22, qword_ptr(acc))?;
            let pr = if max { pred::GT_OQ } else { pred::LT_OQ };
            a.vcmpsd(k6, xmm20, xmm22, pr)?;
            a.vcmpsd(k7, xmm20, xmm20, pred::UNORD_Q)?;
            a.korw(k6, k6, k7)?;
            a.vmovsd_3(xmm22.k6(), xmm22, xmm20)?;
            a.vmovsd(qword_ptr(acc), xmm22)
        }
    }
}

/// `s = ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`, then the tail's values one
/// by one, then `acc + s`: the interpreter's `sum_f64` over the run.
pub(super) fn row_finish_avx2(em: &mut Em, p: &Spec) -> R<()> {
    let (t0, t1) = (em.isa.t(0), em.isa.t(1));
    let acc = addr(em.a, p.body.loads.len())?;
    let a = &mut *em.a;
    a.vaddpd(RED2_A0, RED2_A0, RED2_A1)?; // [l0+l4, l1+l5, l2+l6, l3+l7]
    a.vextractf128(XMM[t0], RED2_A0, 1)?; // [l2+l6, l3+l7]
    a.vunpckhpd(XMM[t1], XMM[5], XMM[5])?; // l1+l5
    a.vaddsd(XMM[t1], XMM[5], XMM[t1])?; // (l0+l4) + (l1+l5)
    let hi = XMM[em.isa.t(2)];
    a.vunpckhpd(hi, XMM[t0], XMM[t0])?; // l3+l7
    a.vaddsd(XMM[t0], XMM[t0], hi)?; // (l2+l6) + (l3+l7)
    a.vaddsd(XMM[t1], XMM[t1], XMM[t0])?;
    // The tail's values (rax = count when the run had a tail: r10 stopped short).
    let mut no_tail = a.create_label();
    let mut next = a.create_label();
    a.mov(rax, rcx)?;
    a.sub(rax, r10)?;
    a.jle(no_tail)?;
    a.xor(r9d, r9d)?;
    a.set_label(&mut next)?;
    a.vmovss(XMM[t0], dword_ptr(rsp + r9 * 4 + FRAME_TAIL_VALUE))?;
    a.vcvtss2sd(XMM[t0], XMM[t0], XMM[t0])?;
    a.vaddsd(XMM[t1], XMM[t1], XMM[t0])?;
    a.inc(r9)?;
    a.cmp(r9, rax)?;
    a.jl(next)?;
    a.set_label(&mut no_tail)?;
    a.vmovsd(XMM[t0], qword_ptr(acc))?;
    a.vaddsd(XMM[t0], XMM[t0], XMM[t1])?;
    a.vmovsd(qword_ptr(acc), XMM[t0])
}

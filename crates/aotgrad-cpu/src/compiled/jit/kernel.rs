//! One kernel's code — its frame, the loop over a tile's runs and the run's vectors
//! and tail — and the assembly of many kernels into one executable module (with
//! `perf` names on request).

use super::body::body;
use super::emit::*;
use super::isa::{isa, Isa};
use super::reduce::{accumulate, row_finish, row_start};
use super::spec::Spec;
use crate::compiled::code::{Entry, Module};
use crate::compiled::kernels::LInstr;
use iced_x86::code_asm::*;
use std::collections::HashMap;

pub(super) fn assemble(kernels: &[&Spec]) -> Result<(Module, Vec<Entry>), String> {
    let e = |e: IcedError| e.to_string();
    let isa = self::isa().ok_or("no JIT on this machine")?;
    let mut a = CodeAssembler::new(64).map_err(e)?;
    // AVX-512: EVEX wherever an instruction has both encodings (the code uses xmm/ymm
    // 16-31); AVX2: VEX only.
    a.set_prefer_vex(isa == Isa::Avx2);
    let mut em = Em { a: &mut a, pool: Pool { labels: HashMap::new(), iota: None }, isa };
    let mut labels = Vec::with_capacity(kernels.len());
    for k in kernels {
        let mut l = em.a.create_label();
        em.a.set_label(&mut l).map_err(e)?;
        kernel(&mut em, k).map_err(e)?;
        labels.push(l);
    }
    let pool = std::mem::replace(&mut em.pool, Pool { labels: HashMap::new(), iota: None });
    pool.emit(em.a, isa).map_err(e)?;
    // The code is position independent (branches and constants are RIP-relative):
    // assemble it at address 0 and copy it anywhere.
    let res = a.assemble_options(0, iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS).map_err(e)?;
    let code = &res.inner.code_buffer;
    let mut map = memmap2::MmapMut::map_anon(code.len().max(1)).map_err(|err| format!("mapping code: {err}"))?;
    map[..code.len()].copy_from_slice(code);
    let offsets: Vec<usize> =
        labels.iter().map(|l| res.label_ip(l).map(|o| o as usize)).collect::<Result<_, _>>().map_err(e)?;
    let map = map.make_exec().map_err(|err| format!("making code executable: {err}"))?;
    let base = map.as_ptr() as usize;
    perf_map(base, &offsets, code.len(), kernels);
    let entries = offsets
        .into_iter()
        .map(|off| {
            // SAFETY: `base + off` is a kernel entry in this executable mapping, which
            // follows the `Entry` calling convention (see `kernel`).
            unsafe { std::mem::transmute::<usize, Entry>(base + off) }
        })
        .collect();
    Ok((Module::new(map), entries))
}

/// With `AOTGRAD_JIT_PERF_MAP=1`, name the compiled kernels for `perf` in
/// `/tmp/perf-PID.map` (what each fuses, e.g. `aotgrad_jit_load_mul_erf_add_store`).
pub(super) fn perf_map(base: usize, offsets: &[usize], end: usize, kernels: &[&Spec]) {
    if !std::env::var("AOTGRAD_JIT_PERF_MAP").is_ok_and(|v| v == "1") {
        return;
    }
    use std::io::Write;
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) else { return };
    for (i, (off, k)) in offsets.iter().zip(kernels).enumerate() {
        let next = offsets.get(i + 1).copied().unwrap_or(end);
        let ops: Vec<String> = k
            .body
            .instrs
            .iter()
            .map(|ins| match ins {
                LInstr::Load { .. } => "load".to_string(),
                LInstr::Fill { .. } => "fill".to_string(),
                LInstr::Unary { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Binary { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Compare { op, .. } => format!("{op:?}").to_lowercase(),
                LInstr::Where { .. } => "where".to_string(),
                LInstr::Clamp { .. } => "clamp".to_string(),
                LInstr::Round { .. } => "round".to_string(),
            })
            .collect();
        let last = match k.reduce {
            Some((op, _, _)) => op.name(),
            None => "store",
        };
        let _ = writeln!(f, "{:x} {:x} aotgrad_jit_{}_{last}", base + off, next - off, ops.join("_"));
    }
}

/// One kernel's code (see the module docs for the calling convention).
pub(super) fn kernel(em: &mut Em, p: &Spec) -> R<()> {
    let n_acc = p.accesses();
    let lanes = em.isa.lanes() as i32;
    {
        let a = &mut *em.a;
        for r in [rbx, rbp, r12, r13, r14, r15] {
            a.push(r)?;
        }
        a.sub(rsp, FRAME_BYTES)?;
        a.mov(qword_ptr(rsp + FRAME_OUTER), rsi)?;
        // Access addresses: spilled ones and those not in rsi / rdi first (rdi is the
        // `ptrs` argument until the last of them is read).
        for i in (0..n_acc).rev() {
            match base_of(i) {
                Base::Stack(off) => {
                    a.mov(rax, qword_ptr(rdi + 8 * i as i32))?;
                    a.mov(qword_ptr(rsp + off), rax)?;
                }
                Base::Reg(r) if r != rdi => a.mov(r, qword_ptr(rdi + 8 * i as i32))?,
                Base::Reg(_) => {}
            }
        }
        if n_acc > 8 {
            a.mov(rdi, qword_ptr(rdi + 64))?;
        }
    }
    let mut row = em.a.create_label();
    let mut vec_loop = em.a.create_label();
    let mut tail = em.a.create_label();
    let mut row_end = em.a.create_label();
    let mut done = em.a.create_label();
    em.a.test(rdx, rdx)?;
    em.a.jz(done)?;
    em.a.set_label(&mut row)?;
    em.a.xor(r10d, r10d)?;
    row_start(em, p)?;
    // Full vectors unmasked, then one masked tail (a body masked on every vector ran
    // about 35% slower on the bench machine, so long bodies are emitted twice too).
    em.a.mov(r11, rcx)?;
    em.a.sub(r11, lanes)?;
    em.a.set_label(&mut vec_loop)?;
    em.a.cmp(r10, r11)?;
    em.a.jg(tail)?;
    body(em, p, false)?;
    accumulate(em, p, false)?;
    em.a.add(r10, lanes)?;
    em.a.jmp(vec_loop)?;
    em.a.set_label(&mut tail)?;
    em.a.mov(rax, rcx)?;
    em.a.sub(rax, r10)?;
    em.a.jle(row_end)?;
    match em.isa {
        Isa::Avx512 => {
            em.a.mov(r9d, -1)?;
            em.a.bzhi(r9d, r9d, eax)?;
            em.a.kmovw(k1, r9d)?;
        }
        Isa::Avx2 => {
            // Lanes below the count: iota < count, kept on the stack.
            let iota = *em.pool.iota.get_or_insert_with(|| em.a.create_label());
            let m = YMM[AVX2_MASK];
            em.a.vmovd(XMM[AVX2_MASK], eax)?;
            em.a.vpbroadcastd(m, XMM[AVX2_MASK])?;
            em.a.vpcmpgtd(m, m, ymmword_ptr(iota))?;
            em.a.vmovups(ymmword_ptr(rsp + FRAME_TAIL_MASK), m)?;
        }
    }
    body(em, p, true)?;
    accumulate(em, p, true)?;
    em.a.set_label(&mut row_end)?;
    row_finish(em, p)?;
    let a = &mut *em.a;
    a.mov(r9, qword_ptr(rsp + FRAME_OUTER))?;
    for i in 0..n_acc {
        match base_of(i) {
            Base::Reg(r) => a.add(r, qword_ptr(r9 + 8 * i as i32))?,
            Base::Stack(off) => {
                a.mov(rax, qword_ptr(r9 + 8 * i as i32))?;
                a.add(qword_ptr(rsp + off), rax)?;
            }
        }
    }
    a.dec(rdx)?;
    a.jnz(row)?;
    a.set_label(&mut done)?;
    a.vzeroupper()?;
    a.add(rsp, FRAME_BYTES)?;
    for r in [r15, r14, r13, r12, rbp, rbx] {
        a.pop(r)?;
    }
    a.ret()
}

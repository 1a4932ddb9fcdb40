//! A JIT for fused pointwise bodies: each lowered [`CPointwise`](super::kernels::CPointwise) whose body it covers
//! becomes AVX-512 machine code, or AVX2 code on a machine without AVX-512
//! (assembled with `iced-x86`, mapped executable with `memmap2`) that keeps every
//! value of the body in a vector register and touches memory only for its loads and
//! stores, 16 (AVX2: 8) f32 lanes at a time. One emitter ([`Em`](emit::Em)) writes both: every
//! operation is the same IEEE operation on either set, only registers, masks (mask
//! registers or mask vectors) and constants' encodings differ. AVX2 has 16 vector
//! registers: bodies of up to 7 live values (5 for a reduction), and sums and means
//! among reductions; the rest runs on the interpreter.
//!
//! Why: the block interpreter ([`super::exec`]) loads and stores every instruction's
//! operands through L1, a few cycles per vector and instruction; on the bench machine
//! an 8-op chain ran at 19 GB/s interpreted and 72–77 GB/s compiled here, next to a
//! copy's 80–110 GB/s. Everything else (f64 bodies, loads or stores of other dtypes,
//! strided stores, `sin`/`cos`/`log`/general `pow`, machines without AVX2) stays
//! on the interpreter, which is also the reference the tests hold this code to:
//! every instruction is emitted as the same IEEE operations in the same order as
//! [`super::math`] computes them (no fused multiply-adds), so the results are equal
//! bit for bit except for the payload of NaNs.
//!
//! A compiled kernel runs one *tile*: `rows` runs of `len` elements of the kernel's
//! innermost dim. Its signature (System V) is
//! `fn(ptrs: *const *mut u8, outer: *const isize, rows: usize, len: usize)`:
//! `ptrs[a]` is the address of access `a`'s first element (loads, then stores),
//! `outer[a]` the byte step from one run to the next. The inner strides (0, 1, or a
//! gather stride for loads) are constants of the code, as the lowering fixed them.
//!
//! Compilation is tiered: lowering a plan gives each covered kernel a slot that a
//! worker thread (`aotgrad-jit`) fills with its code, so compiling a graph does not
//! wait for code generation and its first calls run on the interpreter (whose results
//! are the same). Kernels with the same body and inner strides share one code
//! process-wide (a cache keyed by [`Spec::key`](spec::Spec::key)); the kernels compiled together share
//! one executable mapping, which lives as long as any of them.
//!
//! Layout, each file above the ones it uses: [`isa`] (the instruction set), [`emit`]
//! (the emitter and register file), [`spec`] (what a kernel's code depends on),
//! [`body`] and [`reduce`] (vector code for a body and a reduction's accumulation),
//! [`kernel`] (a kernel's loops; assembling a module), [`worker`] (slots, the
//! process-wide cache, the worker thread). The code handles live in
//! [`super::code`].

mod body;
mod emit;
mod isa;
mod kernel;
mod reduce;
mod spec;
mod worker;

pub(crate) use isa::{available, isa_name};
pub(crate) use worker::{attach, wait_idle};

/// Elements per tile handed to a compiled kernel (see [`CPU_JIT_BLOCK`]).
pub(crate) const BLOCK: usize = super::target::CPU_JIT_BLOCK;

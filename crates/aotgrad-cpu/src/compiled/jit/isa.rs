//! Which instruction set this process compiles kernels for (AVX-512, AVX2 or none),
//! and what each gives the emitter: lanes per vector, registers for values and for
//! scratch. The lowest floor of the JIT.

use std::sync::OnceLock;

/// The instruction set this process compiles kernels for: AVX-512 (F, VL, DQ, BW, with
/// BMI2) where the hot loops use it, else AVX2 (with FMA, F16C, BMI2) where they use
/// that (`AOTGRAD_CPU_ISA=avx2` makes an AVX-512 machine use AVX2 for both, so the
/// two code paths can be tested on one machine), else none; `AOTGRAD_JIT=0`: none.
pub(crate) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        use crate::compiled::target::{isa as loops, Isa as Loops};
        use std::arch::is_x86_feature_detected as has;
        if std::env::var("AOTGRAD_JIT").is_ok_and(|v| v == "0") || !has!("bmi2") {
            return None;
        }
        match loops() {
            Loops::Avx512 if has!("avx512bw") => Some(Isa::Avx512),
            Loops::Avx2 if has!("f16c") => Some(Isa::Avx2),
            _ => None,
        }
    })
}

/// [`isa`]'s name.
pub(crate) fn isa_name() -> Option<&'static str> {
    isa().map(|i| match i {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2",
    })
}

/// Whether this process runs compiled kernels (see [`isa`]).
pub(crate) fn available() -> bool {
    isa().is_some()
}

/// The instruction set a module is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 16 f32 lanes in `zmm` registers, `k` mask registers, masked tails.
    Avx512,
    /// 8 f32 lanes in `ymm` registers; masks are vectors, tails `vmaskmovps`.
    Avx2,
}

impl Isa {
    /// f32 lanes per vector.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
        }
    }
    /// Vector registers the body's values may use (the rest are scratch and masks).
    pub(super) fn values(self) -> usize {
        match self {
            Isa::Avx512 => 24,
            Isa::Avx2 => 7,
        }
    }
    /// Values a reduction's body may use (its accumulators take the top ones).
    pub(super) fn reduce_values(self) -> usize {
        match self {
            Isa::Avx512 => 20,
            Isa::Avx2 => 5,
        }
    }
    /// Scratch register `i` (0..8), above the values.
    pub(super) fn t(self, i: usize) -> usize {
        self.values() + i
    }
}

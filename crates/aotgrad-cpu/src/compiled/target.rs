//! The CPU the compiled kernels target: the instruction set the hot loops (and the
//! JIT) use, picked once at run time, the environment variable that caps it, and the
//! tile size of compiled (JIT) kernels. The lowest floor of `compiled/`: it imports
//! nothing from it.

/// Instruction sets the hot loops are compiled for; the best one present is picked
/// once at run time (the build itself targets the baseline CPU).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Isa {
    Base,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Environment variable capping the instruction set the hot loops and the JIT use:
/// `avx2` (an AVX-512 machine runs the AVX2 code, so both paths can be tested on one
/// machine), `base` (neither), anything else or unset: the best one present.
pub const CPU_ISA_ENV: &str = "AOTGRAD_CPU_ISA";

pub(crate) fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = std::env::var(CPU_ISA_ENV).unwrap_or_default().trim().to_ascii_lowercase();
        #[cfg(target_arch = "x86_64")]
        {
            if cap == "base" {
                return Isa::Base;
            }
            if cap != "avx2"
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        let _ = cap;
        Isa::Base
    })
}

/// Elements per tile handed to a compiled (JIT) kernel: its values live in vector
/// registers, so a tile only bounds the work between two calls.
pub(crate) const CPU_JIT_BLOCK: usize = 16 * 1024;

/// Defines `$name`, which runs `$imp` compiled for the best instruction set present
/// (AVX-512, AVX2 or the baseline): for loops the compiler vectorizes. `unsafe fn`
/// defines an unsafe function for an unsafe `$imp` (its safety contract is `$imp`'s).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident<T: $bound:path> = $imp:ident($($arg:ident: $ty:ty),*)) => {
        $(#[$m])*
        $vis fn $name<T: $bound>($($arg: $ty),*) {
            #[allow(unused_unsafe)]
            // SAFETY: `$imp` is safe; the instruction sets are detected.
            unsafe { $crate::compiled::target::multiversion!(@dispatch $imp, $bound, ($($arg: $ty),*)) }
        }
    };
    ($(#[$m:meta])* $vis:vis unsafe fn $name:ident<T: $bound:path> = $imp:ident($($arg:ident: $ty:ty),*)) => {
        $(#[$m])*
        /// # Safety
        /// As the implementation's.
        $vis unsafe fn $name<T: $bound>($($arg: $ty),*) {
            // SAFETY: forwarded to the caller; the instruction sets are detected.
            unsafe { $crate::compiled::target::multiversion!(@dispatch $imp, $bound, ($($arg: $ty),*)) }
        }
    };
    (@dispatch $imp:ident, $bound:path, ($($arg:ident: $ty:ty),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            use $crate::compiled::target::{isa, Isa};
            #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
            unsafe fn v4<T: $bound>($($arg: $ty),*) {
                #[allow(unused_unsafe)]
                // SAFETY: forwarded.
                unsafe { $imp::<T>($($arg),*) }
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3<T: $bound>($($arg: $ty),*) {
                #[allow(unused_unsafe)]
                // SAFETY: forwarded.
                unsafe { $imp::<T>($($arg),*) }
            }
            match isa() {
                // SAFETY: the features were detected.
                Isa::Avx512 => return v4::<T>($($arg),*),
                // SAFETY: the features were detected.
                Isa::Avx2 => return v3::<T>($($arg),*),
                Isa::Base => {}
            }
        }
        $imp::<T>($($arg),*)
    }};
}
pub(crate) use multiversion;

//! Counter-based random numbers: `rand`, `randn` and `bernoulli` are pure functions of
//! `(seed, offset)` and the element's row-major logical index, so every backend (this
//! one, or a WGSL kernel with only `u32` arithmetic) reproduces the same values.
//!
//! # Definition (normative for every backend)
//!
//! All arithmetic is on `u32` with wrapping multiplication; `lo(x)`/`hi(x)` are the low
//! and high 32 bits of a `u64`.
//!
//! ```text
//! fmix32(h):                      // murmur3's 32-bit finalizer (a bijection)
//!     h ^= h >> 16;  h *= 0x85EBCA6B
//!     h ^= h >> 13;  h *= 0xC2B2AE35
//!     h ^= h >> 16;  return h
//!
//! bits(seed: u64, ctr: u64) -> u32:
//!     k0 = fmix32(lo(seed) ^ 0x9E3779B9)
//!     k1 = fmix32(hi(seed) ^ 0x632BE5AB ^ k0)     // (k0, k1) is a bijection of seed
//!     h  = fmix32(lo(ctr) ^ k1)
//!     h  = fmix32(h ^ fmix32(hi(ctr) ^ k0))
//!     return h
//! ```
//!
//! Element `i` (row-major logical index of the output, counted from 0) uses counters
//! computed with wrapping `u64` addition:
//!
//! - **rand**: `u = (bits(seed, offset + i) >> (32 - p)) * 2^-p`, where `p` is the
//!   dtype's significand precision (24 for f32 and f64, 11 for f16, 8 for bf16), so
//!   `u` is exactly representable and lies in `[0, 1)`.
//! - **randn** (Box–Muller): `u1 = ((bits(seed, offset + 2i) >> 8) + 1) * 2^-24` in
//!   `(0, 1]`, `u2 = (bits(seed, offset + 2i + 1) >> 8) * 2^-24` in `[0, 1)`;
//!   `z = sqrt(-2 ln u1) * cos(2π u2)`. This backend evaluates `z` in f64 and rounds it
//!   once to the dtype; a backend computing in f32 agrees to f32 rounding of the
//!   transcendental functions (not bit-exactly).
//! - **bernoulli(p)**: `u = (bits(seed, offset + i) >> 8) * 2^-24` (for every dtype);
//!   the element is 1 when `u < p`, else 0, converted to the input's dtype.

use crate::convert::Vals;
use aotgrad_ir::DType;

/// murmur3's 32-bit finalizer.
#[inline]
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    h
}

/// The 32 random bits for counter `ctr` of stream `seed` (see the module docs).
#[inline]
pub fn bits(seed: u64, ctr: u64) -> u32 {
    let k0 = fmix32((seed as u32) ^ 0x9E37_79B9);
    let k1 = fmix32(((seed >> 32) as u32) ^ 0x632B_E5AB ^ k0);
    let h = fmix32((ctr as u32) ^ k1);
    fmix32(h ^ fmix32(((ctr >> 32) as u32) ^ k0))
}

/// Significand precision used for `rand` of `dtype`.
fn precision(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// Uniform `[0, 1)` values for `n` elements of `dtype` (see the module docs).
pub(crate) fn uniform(seed: u64, offset: u64, n: usize, dtype: DType) -> Vals {
    let p = precision(dtype);
    let scale = (-(p as f64)).exp2();
    let v = (0..n as u64).map(|i| (bits(seed, offset.wrapping_add(i)) >> (32 - p)) as f64 * scale);
    Vals::F64(v.collect())
}

/// Standard-normal values for `n` elements (Box–Muller, see the module docs).
pub(crate) fn normal(seed: u64, offset: u64, n: usize) -> Vals {
    let scale = (-24f64).exp2();
    let v = (0..n as u64).map(|i| {
        let c = offset.wrapping_add(i.wrapping_mul(2));
        let u1 = ((bits(seed, c) >> 8) as f64 + 1.0) * scale;
        let u2 = (bits(seed, c.wrapping_add(1)) >> 8) as f64 * scale;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    });
    Vals::F64(v.collect())
}

/// 0/1 values with probability `p` of 1 (see the module docs).
pub(crate) fn bernoulli(p: f64, seed: u64, offset: u64, n: usize) -> Vals {
    let scale = (-24f64).exp2();
    let v = (0..n as u64).map(|i| ((bits(seed, offset.wrapping_add(i)) >> 8) as f64 * scale) < p);
    Vals::Bool(v.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix32_known_values() {
        // murmur3 fmix32 reference values.
        assert_eq!(fmix32(0), 0);
        assert_eq!(fmix32(1), 0x514E_28B7);
    }

    #[test]
    fn rand_is_exact_and_in_range() {
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let Vals::F64(v) = uniform(7, 3, 2000, dtype) else { panic!("kind") };
            let p = precision(dtype) as i32;
            for x in v {
                assert!((0.0..1.0).contains(&x));
                assert_eq!((x * 2f64.powi(p)).fract(), 0.0);
            }
        }
    }
}

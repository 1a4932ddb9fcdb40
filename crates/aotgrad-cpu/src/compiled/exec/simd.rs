//! Row reductions written with AVX-512 intrinsics (the compiler does not vectorize
//! NaN-propagating maxima or f32-to-f64 sums well on its own).

use std::arch::x86_64::*;

/// # Safety
/// AVX-512F and AVX-512DQ are available; `v` is non-empty.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn extreme_f32<const MAX: bool>(v: &[f32]) -> f32 {
    let n = v.len();
    let p = v.as_ptr();
    let mut m = _mm512_set1_ps(v[0]);
    let mut nan: __mmask16 = 0;
    let mut i = 0;
    // SAFETY: every load is inside `v` (the tail load is masked).
    unsafe {
        while i + 16 <= n {
            let x = _mm512_loadu_ps(p.add(i));
            m = if MAX { _mm512_max_ps(m, x) } else { _mm512_min_ps(m, x) };
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            i += 16;
        }
        if i < n {
            let k = ((1u32 << (n - i)) - 1) as __mmask16;
            let x = _mm512_mask_loadu_ps(m, k, p.add(i));
            m = if MAX { _mm512_max_ps(m, x) } else { _mm512_min_ps(m, x) };
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        }
    }
    if nan != 0 {
        return f32::NAN;
    }
    // Lanes 0-7 against 8-15, 0-3 against 4-7, 0-1 against 2-3, 0 against 1: one
    // fixed order (the JIT combines a row the same way, so equal zeros of either
    // sign come out the same).
    let (lo, hi) = (_mm512_castps512_ps256(m), _mm512_extractf32x8_ps::<1>(m));
    let h8 = if MAX { _mm256_max_ps(lo, hi) } else { _mm256_min_ps(lo, hi) };
    let (lo, hi) = (_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h4 = if MAX { _mm_max_ps(lo, hi) } else { _mm_min_ps(lo, hi) };
    let hi = _mm_movehl_ps(h4, h4);
    let h2 = if MAX { _mm_max_ps(h4, hi) } else { _mm_min_ps(h4, hi) };
    let hi = _mm_shuffle_ps::<1>(h2, h2);
    _mm_cvtss_f32(if MAX { _mm_max_ss(h2, hi) } else { _mm_min_ss(h2, hi) })
}

/// Transpose an 8x8 f32 tile: `src` row `j` (8 contiguous values, rows `ld_src`
/// apart) becomes column `j` of `dst` (rows `ld_dst` apart).
///
/// # Safety
/// AVX is available; both tiles are in bounds.
#[target_feature(enable = "avx")]
pub(super) unsafe fn transpose8(src: *const f32, ld_src: isize, dst: *mut f32, ld_dst: usize) {
    // SAFETY: the caller's bounds.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.offset(j as isize * ld_src)));
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        let out = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        for (i, v) in out.iter().enumerate() {
            _mm256_storeu_ps(dst.add(i * ld_dst), *v);
        }
    }
}

/// # Safety
/// AVX-512F and AVX-512VL are available.
#[target_feature(enable = "avx512f,avx512vl")]
pub(super) unsafe fn sum_f32_f64(v: &[f32]) -> f64 {
    let n = v.len();
    let p = v.as_ptr();
    let mut a0 = _mm512_setzero_pd();
    let mut a1 = _mm512_setzero_pd();
    let mut i = 0;
    // SAFETY: every load is inside `v` (tail loads are masked).
    unsafe {
        while i + 16 <= n {
            a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(p.add(i))));
            a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(p.add(i + 8))));
            i += 16;
        }
        if i < n {
            let r = n - i;
            let k0 = ((1u32 << r.min(8)) - 1) as __mmask8;
            a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k0, p.add(i))));
            if r > 8 {
                let k1 = ((1u32 << (r - 8)) - 1) as __mmask8;
                a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k1, p.add(i + 8))));
            }
        }
    }
    // A0 + A1, then lanes 0-3 + 4-7, 0-1 + 2-3, 0 + 1 (the JIT's order too).
    let v = _mm512_add_pd(a0, a1);
    let h = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd::<1>(v));
    let q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd::<1>(h));
    _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)))
}

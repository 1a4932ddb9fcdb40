//! Creation ops and the counter-based random ops.

mod common;

use aotgrad_cpu::{random, CpuTensor};
use aotgrad_ir::{DType, Dim, Op, Scalar};
use common::*;

fn dims(s: &[usize]) -> aotgrad_ir::Dims {
    s.iter().map(|&d| Dim::from(d)).collect()
}

#[test]
fn full_full_like_and_arange() {
    let f = exec(
        &Op::Full { shape: dims(&[2, 3]), value: Scalar::Float(2.5), dtype: DType::I32 },
        &[],
        &out(&[2, 3], DType::I32),
    );
    assert_eq!(f.to_vec_i64(), vec![2; 6]);
    let b =
        exec(&Op::Full { shape: dims(&[2]), value: Scalar::Int(3), dtype: DType::Bool }, &[], &out(&[2], DType::Bool));
    assert_eq!(b.to_vec_bool(), vec![true, true]);
    let x = CpuTensor::zeros(&[2, 2], DType::F32);
    let l =
        exec(&Op::FullLike { value: Scalar::Float(-1.5), dtype: Some(DType::F64) }, &[&x], &out(&[2, 2], DType::F64));
    assert_eq!((l.dtype(), l.to_vec_f64()), (DType::F64, vec![-1.5; 4]));
    let ar =
        |start, end, step, dtype, n| exec(&Op::Arange { start, end, step, dtype }, &[], &out(&[n], dtype)).to_vec_f64();
    assert_eq!(
        ar(Scalar::Float(0.5), Scalar::Float(1.5), Scalar::Float(0.25), DType::F64, 4),
        vec![0.5, 0.75, 1.0, 1.25]
    );
    assert_eq!(ar(Scalar::Int(5), Scalar::Int(-1), Scalar::Int(-2), DType::I64, 3), vec![5.0, 3.0, 1.0]);
    // Integral dtypes truncate the bounds: arange(1.7, 6, 2.9) as i32 is 1, 3, 5.
    assert_eq!(ar(Scalar::Float(1.7), Scalar::Float(6.0), Scalar::Float(2.9), DType::I32, 3), vec![1.0, 3.0, 5.0]);
    // f32 values are start + i*step computed in f64 and rounded once.
    let got = ar(Scalar::Float(0.0), Scalar::Float(1.0), Scalar::Float(0.1), DType::F32, 10);
    let want: Vec<f64> = (0..10).map(|i| round_to(i as f64 * 0.1, DType::F32)).collect();
    assert_eq!(got, want);
}

/// The generator exactly as the `random` module docs define it, written independently.
fn spec_bits(seed: u64, ctr: u64) -> u32 {
    fn fmix(mut h: u32) -> u32 {
        h ^= h >> 16;
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        h = h.wrapping_mul(0xc2b2_ae35);
        h ^ (h >> 16)
    }
    let (s_lo, s_hi) = ((seed & 0xffff_ffff) as u32, (seed >> 32) as u32);
    let (c_lo, c_hi) = ((ctr & 0xffff_ffff) as u32, (ctr >> 32) as u32);
    let k0 = fmix(s_lo ^ 0x9e37_79b9);
    let k1 = fmix(s_hi ^ 0x632b_e5ab ^ k0);
    let h = fmix(c_lo ^ k1);
    fmix(h ^ fmix(c_hi ^ k0))
}

fn rand(n: usize, dtype: DType, seed: u64, offset: u64) -> Vec<f64> {
    exec(&Op::Rand { shape: dims(&[n]), dtype, seed, offset }, &[], &out(&[n], dtype)).to_vec_f64()
}

fn randn(n: usize, dtype: DType, seed: u64, offset: u64) -> Vec<f64> {
    exec(&Op::Randn { shape: dims(&[n]), dtype, seed, offset }, &[], &out(&[n], dtype)).to_vec_f64()
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64)
}

#[test]
fn rand_follows_the_documented_counter_scheme() {
    let seed = 0x1234_5678_9abc_def0;
    for i in [0u64, 1, 77, 1 << 33] {
        assert_eq!(random::bits(seed, i), spec_bits(seed, i));
    }
    let v = rand(64, DType::F32, seed, 1000);
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, (spec_bits(seed, 1000 + i as u64) >> 8) as f64 / 16_777_216.0);
    }
    // f16: 11 significand bits, values on the 2^-11 grid in [0, 1).
    let h = rand(64, DType::F16, seed, 1000);
    for (i, &x) in h.iter().enumerate() {
        assert_eq!(x, (spec_bits(seed, 1000 + i as u64) >> 21) as f64 / 2048.0);
    }
    // randn: Box-Muller over counters offset + 2i, offset + 2i + 1.
    let z = randn(8, DType::F64, 3, 10);
    for (i, &x) in z.iter().enumerate() {
        let c = 10 + 2 * i as u64;
        let u1 = ((spec_bits(3, c) >> 8) as f64 + 1.0) / 16_777_216.0;
        let u2 = (spec_bits(3, c + 1) >> 8) as f64 / 16_777_216.0;
        let want = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        assert!((x - want).abs() < 1e-12, "{x} vs {want}");
    }
}

#[test]
fn random_ops_are_reproducible_from_seed_and_offset() {
    assert_eq!(rand(100, DType::F32, 7, 0), rand(100, DType::F32, 7, 0));
    assert_ne!(rand(100, DType::F32, 7, 0), rand(100, DType::F32, 8, 0));
    // Shifting the offset shifts the stream.
    assert_eq!(rand(100, DType::F64, 7, 0)[40..], rand(60, DType::F64, 7, 40)[..]);
    assert_eq!(randn(50, DType::F32, 9, 5), randn(50, DType::F32, 9, 5));
    // Element i depends only on its row-major index, not on the shape.
    let r2 =
        exec(&Op::Rand { shape: dims(&[5, 4]), dtype: DType::F32, seed: 7, offset: 0 }, &[], &out(&[5, 4], DType::F32));
    assert_eq!(r2.to_vec_f64(), rand(20, DType::F32, 7, 0));
}

#[test]
fn random_statistics_are_sane() {
    let n = 10_000;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let u = rand(n, dtype, 42, 0);
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)), "{dtype}");
        let (m, v) = mean_var(&u);
        assert!((m - 0.5).abs() < 0.015, "{dtype} mean {m}");
        assert!((v - 1.0 / 12.0).abs() < 0.005, "{dtype} var {v}");
    }
    let z = randn(n, DType::F32, 42, 0);
    let (m, v) = mean_var(&z);
    assert!(m.abs() < 0.04 && (v - 1.0).abs() < 0.06, "randn mean {m} var {v}");
    let frac_within_1 = z.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
    assert!((frac_within_1 - 0.6827).abs() < 0.02, "{frac_within_1}");
}

#[test]
fn bernoulli_has_probability_p_and_keeps_the_input_dtype() {
    let x = CpuTensor::zeros(&[100, 100], DType::F16);
    let run = |p: f64| exec(&Op::Bernoulli { p, seed: 5, offset: 0 }, &[&x], &out(&[100, 100], DType::F16));
    let b = run(0.3);
    assert_eq!(b.dtype(), DType::F16);
    let v = b.try_to_vec_f64().unwrap();
    assert_eq!(v.len(), 10_000);
    assert!(v.iter().all(|&e| e == 0.0 || e == 1.0));
    let m = v.iter().sum::<f64>() / v.len() as f64;
    assert!((m - 0.3).abs() < 0.02, "{m}");
    for (i, &e) in v.iter().enumerate().take(50) {
        let u = (spec_bits(5, i as u64) >> 8) as f64 / 16_777_216.0;
        assert_eq!(e, (u < 0.3) as u8 as f64);
    }
    assert_eq!(run(0.0).try_to_vec_f64().unwrap(), vec![0.0; 10_000]);
    assert_eq!(run(1.0).try_to_vec_f64().unwrap(), vec![1.0; 10_000]);
}

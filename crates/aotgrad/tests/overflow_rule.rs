//! Eager and compiled agree where sums overflow (issue 32, item 9): products of
//! values near ±1e38 overflow f32, and whether `inf + -inf` (NaN) or `±inf` comes out
//! depends on how a kernel accumulates. The rule, stated in docs/ARCHITECTURE.md: a
//! product accumulates each output element over `k` in order, each step a fused
//! multiply-add, as PyTorch's CPU matmul (through its BLAS) does; reductions of
//! 16-bit floats accumulate in f32 and round once. The eager mode and the compiled
//! backend (with and without the JIT, at 1 and 2 threads) give the same bits.

use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function, AotConfig};
use std::sync::Arc;

type Out = aotgrad::Result<Vec<Tensor>>;

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_vec_f64().expect("values").iter().map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() }).collect()
}

/// Every compiled configuration's outputs of `f` next to eager's.
fn agree(f: fn(&[Tensor]) -> Out, inputs: &[Tensor]) -> Vec<Vec<u64>> {
    let eager: Vec<Vec<u64>> = f(inputs).expect("eager").iter().map(bits).collect();
    for threads in [1, 2] {
        for jit in [false, true] {
            let backend = Arc::new(aotgrad::cpu::CpuBackend::new(threads).jit(jit));
            let config = AotConfig { backend, ..AotConfig::default().no_cache() };
            let compiled = aot_function(f, config).expect("aot").call(inputs).expect("compiled");
            let compiled: Vec<Vec<u64>> = compiled.iter().map(bits).collect();
            assert_eq!(compiled, eager, "threads {threads}, jit {jit}");
        }
    }
    eager
}

fn t(vals: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64(vals, shape, dtype).expect("tensor")
}

#[test]
fn a_product_that_overflows_both_ways_gives_what_fused_multiply_add_gives() {
    // Row times column: 1e38·1e38 + 1e38·(−1e38). Rounded after each product, this is
    // inf + −inf = NaN; fused, the first step rounds to inf and the second adds an
    // exact −1e76 to inf: inf. PyTorch 2.15 on CPU gives `tensor([[inf]])`.
    let x = t(&[1e38, 1e38], &[1, 2], DType::F32);
    let w = t(&[1e38, -1e38], &[2, 1], DType::F32);
    let out = agree(|a| Ok(vec![a[0].matmul(&a[1])?]), &[x, w]);
    assert_eq!(out, vec![vec![f64::INFINITY.to_bits()]]);
}

#[test]
fn larger_overflowing_products_agree_bit_for_bit() {
    // Every element of a 5x7 by 7x6 product mixes huge values of both signs with
    // ordinary ones: what overflows and where is the accumulation order's business.
    let vals = |n: usize, seed: u64| -> Vec<f64> {
        (0..n as u64)
            .map(|i| {
                let h = (i.wrapping_mul(2654435761) ^ seed).wrapping_mul(0x9e3779b97f4a7c15) >> 40;
                match h % 5 {
                    0 => 1.5e38,
                    1 => -1.5e38,
                    2 => 3e37,
                    _ => (h % 100) as f64 / 10.0 - 5.0,
                }
            })
            .collect()
    };
    let x = t(&vals(35, 1), &[5, 7], DType::F32);
    let w = t(&vals(42, 2), &[7, 6], DType::F32);
    agree(|a| Ok(vec![a[0].matmul(&a[1])?, a[0].matmul(&a[1])?.relu()?]), &[x.clone(), w]);
    // A linear layer's `x @ w.t()`: a row-major left and a column-major right operand.
    let wt = t(&vals(42, 3), &[6, 7], DType::F32);
    agree(|a| Ok(vec![a[0].matmul(&a[1].t()?)?]), &[x, wt]);
}

#[test]
fn a_bf16_sum_accumulates_in_f32_and_rounds_once() {
    // 256 + 1 + 1 + ... in bf16 (8 bits of mantissa): rounding after each add keeps
    // 256 (256 + 1 rounds back to 256), accumulating in f32 gives 256 + 64 = 320.
    // PyTorch 2.15 on CPU: `torch.tensor([256.] + [1.] * 64, dtype=torch.bfloat16).sum()`
    // is 320.
    let mut v = vec![256.0];
    v.extend(std::iter::repeat_n(1.0, 64));
    let x = t(&v, &[65], DType::BF16);
    let out = agree(|a| Ok(vec![a[0].sum_all()?]), &[x]);
    assert_eq!(out, vec![vec![320f64.to_bits()]]);
    // Long enough to split over threads: the halves are f32 partial sums too.
    let v: Vec<f64> = (0..300_000).map(|i| if i % 1000 == 0 { 256.0 } else { 1.0 / 64.0 }).collect();
    let x = t(&v, &[300_000], DType::BF16);
    agree(|a| Ok(vec![a[0].sum_all()?, a[0].mul(&a[0])?.sum(&[0], false)?]), &[x]);
}

#[test]
fn shallow_products_follow_the_rule_too() {
    // A depth of 1 or 2: the shapes the gemm crate hands to an unfused kernel.
    // (A single row or column of a deeper product keeps gemm's vector kernel, which
    // sums the depth in interleaved parts: see "Products" in docs/ARCHITECTURE.md.)
    for (n, k, m) in [(1, 2, 1), (1, 1, 5), (6, 2, 1), (4, 1, 3), (3, 2, 7), (5, 2, 9)] {
        let vals = |len: usize, s: u64| -> Vec<f64> {
            (0..len as u64)
                .map(|i| {
                    if (i * 7 + s).is_multiple_of(3) {
                        2e38
                    } else if (i + s).is_multiple_of(4) {
                        -3e38
                    } else {
                        1.0
                    }
                })
                .collect()
        };
        let x = t(&vals(n * k, 1), &[n, k], DType::F32);
        let w = t(&vals(k * m, 2), &[k, m], DType::F32);
        agree(|a| Ok(vec![a[0].matmul(&a[1])?]), &[x.clone(), w.clone()]);
        let (x, w) = (x.to(DType::F64).expect("f64"), w.to(DType::F64).expect("f64"));
        agree(|a| Ok(vec![a[0].matmul(&a[1])?.mul(&a[0].sum_all()?)?]), &[x, w]);
    }
}

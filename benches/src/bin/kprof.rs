//! Dev: time single fused kernels or products through `aot_function` inference, to
//! profile the compiled CPU backend in isolation: `K=softmax|gelu|exp|copy|gemv|linear1|chain|
//! linear|mm|mmcols`, `T` threads, `RUNS` calls per median; add
//! `AOTGRAD_CPU_PROFILE=all` for the per-kernel times.
use aotgrad::{aot_function, AotConfig};
use aotgrad_benches::runtime::median_ms;
use aotgrad_ir::DType;
use aotgrad_trace::Tensor;

type Fun = fn(&[Tensor]) -> aotgrad::Result<Vec<Tensor>>;

fn main() -> anyhow::Result<()> {
    let k = std::env::var("K").unwrap_or_else(|_| "softmax".into());
    let t: usize = std::env::var("T").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::var("RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let r = |s: &[usize], seed| Tensor::randn(s, DType::F32, seed);
    let (ins, f): (Vec<Tensor>, Fun) = match k.as_str() {
        "softmax" => (vec![r(&[8, 8, 128, 128], 0)?], |a| Ok(vec![a[0].softmax(-1)?])),
        "gelu" => (vec![r(&[1024, 1024], 0)?], |a| Ok(vec![a[0].gelu()?])),
        "exp" => (vec![r(&[1024, 1024], 0)?], |a| Ok(vec![a[0].exp()?])),
        "copy" => (vec![r(&[8, 128, 768], 0)?], |a| {
            Ok(vec![a[0].view(&[8, 128, 24, 32])?.permute(&[0, 2, 1, 3])?.contiguous()?])
        }),
        "linear" => (vec![r(&[64, 512], 0)?, r(&[512, 512], 1)?], |a| Ok(vec![a[0].matmul(&a[1].t()?)?])),
        "mm" => (vec![r(&[64, 512], 0)?, r(&[512, 512], 1)?], |a| Ok(vec![a[0].matmul(&a[1])?])),
        // Batch-1 products (a single row): the GEMM libraries' vector shapes.
        "gemv" => (vec![r(&[1, 1024], 0)?, r(&[1024, 1024], 1)?], |a| Ok(vec![a[0].matmul(&a[1])?])),
        "linear1" => (vec![r(&[1, 1024], 0)?, r(&[1024, 1024], 1)?], |a| Ok(vec![a[0].matmul(&a[1].t()?)?])),
        "mmcols" => (vec![r(&[1024, 1024], 0)?], |a| {
            let g = Tensor::full(&[], 1.0, DType::F32)?.expand(&[1024, 256])?;
            Ok(vec![a[0].t()?.matmul(&g)?])
        }),
        "tiny" => (vec![r(&[16], 0)?], |a| Ok(vec![a[0].mul(2.0)?])),
        "maxpool" => (vec![r(&[128, 16, 28, 28], 0)?], |a| Ok(vec![a[0].max_pool2d([2, 2], None, [0, 0], [1, 1])?])),
        "conv" => (vec![r(&[128, 16, 14, 14], 0)?, r(&[32, 16, 3, 3], 1)?], |a| {
            Ok(vec![a[0].conv2d(&a[1], None, aotgrad_trace::Conv2dOpts::default().padding(1))?])
        }),
        "chain4m" => (vec![r(&[4096, 1024], 0)?], |a| {
            Ok(vec![a[0].mul(1.5)?.add(0.25)?.relu()?.sub(0.5)?.abs()?.mul(0.9)?.neg()?])
        }),
        _ => (vec![r(&[1024, 1024], 0)?], |a| {
            Ok(vec![a[0].mul(1.5)?.add(0.25)?.relu()?.sub(0.5)?.abs()?.mul(0.9)?.neg()?])
        }),
    };
    let f = aot_function(f, AotConfig::default().threads(t))?;
    let numel = |x: &Tensor| x.shape().iter().map(|d| d.as_const().unwrap_or(0)).product::<i64>() as f64;
    let bytes = 4.0 * (ins.iter().map(numel).sum::<f64>() + f.call(&ins)?.iter().map(numel).sum::<f64>());
    for _ in 0..3 {
        let ms = median_ms(runs, || {
            f.call(&ins)?;
            Ok(())
        })?;
        println!("{k}: {ms:.3} ms, {:.1} GB/s (inputs + outputs)", bytes / (ms * 1e6));
    }
    Ok(())
}

//! Dev: time single fused kernels through `aot_function` inference (`K=softmax|gelu|copy|chain`, `T` threads).
use aotgrad::{aot_function, AotConfig};
use aotgrad_benches::runtime::median_ms;
use aotgrad_ir::DType;
use aotgrad_trace::Tensor;

fn main() -> anyhow::Result<()> {
    let k = std::env::var("K").unwrap_or_else(|_| "softmax".into());
    let t: usize = std::env::var("T").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::var("RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let (x, f): (Tensor, aotgrad::AotFunction) = match k.as_str() {
        "softmax" => (
            Tensor::randn(&[8, 8, 128, 128], DType::F32, 0)?,
            aot_function(|a: &[Tensor]| Ok(vec![a[0].softmax(-1)?]), AotConfig::default().threads(t))?,
        ),
        "gelu" => (
            Tensor::randn(&[1024, 1024], DType::F32, 0)?,
            aot_function(|a: &[Tensor]| Ok(vec![a[0].gelu()?]), AotConfig::default().threads(t))?,
        ),
        "exp" => (
            Tensor::randn(&[1024, 1024], DType::F32, 0)?,
            aot_function(|a: &[Tensor]| Ok(vec![a[0].exp()?]), AotConfig::default().threads(t))?,
        ),
        "copy" => (
            Tensor::randn(&[8, 128, 768], DType::F32, 0)?,
            aot_function(
                |a: &[Tensor]| Ok(vec![a[0].view(&[8, 128, 24, 32])?.permute(&[0, 2, 1, 3])?.contiguous()?]),
                AotConfig::default().threads(t),
            )?,
        ),
        _ => (
            Tensor::randn(&[1024, 1024], DType::F32, 0)?,
            aot_function(
                |a: &[Tensor]| Ok(vec![a[0].mul(1.5)?.add(0.25)?.relu()?.sub(0.5)?.abs()?.mul(0.9)?.neg()?]),
                AotConfig::default().threads(t),
            )?,
        ),
    };
    let bytes = 2.0 * 4.0 * x.shape().iter().map(|d| d.as_const().unwrap_or(0)).product::<i64>() as f64;
    for _ in 0..3 {
        let ms = median_ms(runs, || {
            f.call(std::slice::from_ref(&x))?;
            Ok(())
        })?;
        println!("{k}: {ms:.3} ms, {:.1} GB/s (in+out)", bytes / (ms * 1e6));
    }
    Ok(())
}

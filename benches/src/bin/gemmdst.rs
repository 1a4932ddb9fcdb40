//! Dev: `gemm` on an `n x k @ k x m` product with both operands row-major, writing the
//! product row-major or column-major (`SHAPE=NxKxM`), single-threaded, GFLOP/s.
use aotgrad_benches::runtime::median_ms;

fn main() -> anyhow::Result<()> {
    let s = std::env::var("SHAPE").unwrap_or("512x512x64".into());
    let v: Vec<usize> = s.split('x').filter_map(|x| x.parse().ok()).collect();
    let (n, k, m) = (v[0], v[1], v[2]);
    let a: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
    let b: Vec<f32> = (0..k * m).map(|i| (i as f32).cos()).collect();
    let mut c = vec![0f32; n * m];
    let flops = 2.0 * (n * k * m) as f64;
    for (name, rs, cs) in [("dst row", m as isize, 1isize), ("dst col", 1, n as isize)] {
        let cp = c.as_mut_ptr() as usize;
        let t = median_ms(100, || {
            // SAFETY: row-major operands, a dst of n x m elements.
            unsafe {
                gemm::gemm(
                    n,
                    m,
                    k,
                    cp as *mut f32,
                    cs,
                    rs,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    m as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
            Ok(())
        })?;
        println!("{n}x{k}x{m} A row B row {name}: {:.0} GFLOP/s", flops / (t * 1e6));
    }
    Ok(())
}

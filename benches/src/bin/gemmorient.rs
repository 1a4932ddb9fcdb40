//! Dev: the `gemm` crate single-threaded on `n x k @ k x m` products, every layout of
//! the operands and the product, called directly or transposed (`C^T = B^T A^T`),
//! GFLOP/s (`SHAPES=NxKxM,...`).
use aotgrad_benches::runtime::median_ms;

fn main() -> anyhow::Result<()> {
    let shapes =
        std::env::var("SHAPES").unwrap_or("128x784x256,64x512x512,1024x1024x256,256x1024x1024,2048x64x256".into());
    for s in shapes.split(',') {
        let v: Vec<usize> = s.split('x').filter_map(|x| x.parse().ok()).collect();
        let (n, k, m) = (v[0], v[1], v[2]);
        let a: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..k * m).map(|i| (i as f32).cos()).collect();
        let mut c = vec![0f32; n * m];
        let flops = 2.0 * (n * k * m) as f64;
        for a_row in [true, false] {
            for b_row in [true, false] {
                for c_row in [true, false] {
                    let (ars, acs) = if a_row { (k as isize, 1) } else { (1, n as isize) };
                    let (brs, bcs) = if b_row { (m as isize, 1) } else { (1, k as isize) };
                    let (crs, ccs) = if c_row { (m as isize, 1) } else { (1, n as isize) };
                    let mut line = format!(
                        "{n}x{k}x{m} A {} B {} C {}:",
                        if a_row { "row" } else { "col" },
                        if b_row { "row" } else { "col" },
                        if c_row { "row" } else { "col" }
                    );
                    for swap in [false, true] {
                        let cp = c.as_mut_ptr() as usize;
                        let t = median_ms(30, || {
                            // SAFETY: the strides cover the three matrices.
                            unsafe {
                                if swap {
                                    gemm::gemm(
                                        m,
                                        n,
                                        k,
                                        cp as *mut f32,
                                        crs,
                                        ccs,
                                        false,
                                        b.as_ptr(),
                                        brs,
                                        bcs,
                                        a.as_ptr(),
                                        ars,
                                        acs,
                                        0.0,
                                        1.0,
                                        false,
                                        false,
                                        false,
                                        gemm::Parallelism::None,
                                    )
                                } else {
                                    gemm::gemm(
                                        n,
                                        m,
                                        k,
                                        cp as *mut f32,
                                        ccs,
                                        crs,
                                        false,
                                        a.as_ptr(),
                                        acs,
                                        ars,
                                        b.as_ptr(),
                                        bcs,
                                        brs,
                                        0.0,
                                        1.0,
                                        false,
                                        false,
                                        false,
                                        gemm::Parallelism::None,
                                    )
                                }
                            }
                            Ok(())
                        })?;
                        line += &format!(" {} {:.0}", if swap { "swap" } else { "dir" }, flops / (t * 1e6));
                    }
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

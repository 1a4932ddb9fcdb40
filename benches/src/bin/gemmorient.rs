//! Dev: the `gemm` crate on `n x k @ k x m` f32 products, every layout of the operands
//! and the product, called directly or transposed (`C^T = B^T A^T`), GFLOP/s
//! (`SHAPES=NxKxM,...`; `THREADS=1,2`, default 1: more on a rayon pool of that size).
use aotgrad_benches::runtime::median_ms;

/// `(row stride, column stride)` of a `rows x cols` matrix, row-major or not.
fn strides(row_major: bool, rows: usize, cols: usize) -> (isize, isize) {
    if row_major {
        (cols as isize, 1)
    } else {
        (1, rows as isize)
    }
}

fn main() -> anyhow::Result<()> {
    let shapes =
        std::env::var("SHAPES").unwrap_or("128x784x256,64x512x512,1024x1024x256,256x1024x1024,2048x64x256".into());
    let threads: Vec<usize> =
        std::env::var("THREADS").unwrap_or("1".into()).split(',').filter_map(|t| t.trim().parse().ok()).collect();
    for s in shapes.split(',') {
        let v: Vec<usize> = s.split('x').filter_map(|x| x.parse().ok()).collect();
        let [n, k, m] = v[..] else { anyhow::bail!("shape {s}: want NxKxM") };
        let a: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..k * m).map(|i| (i as f32).cos()).collect();
        let mut c = vec![0f32; n * m];
        let flops = 2.0 * (n * k * m) as f64;
        for (a_row, b_row, c_row) in (0..8).map(|i| (i & 4 == 0, i & 2 == 0, i & 1 == 0)) {
            let ((ars, acs), (brs, bcs), (crs, ccs)) =
                (strides(a_row, n, k), strides(b_row, k, m), strides(c_row, n, m));
            let layout = |row: bool| if row { "row" } else { "col" };
            let mut line = format!("{n}x{k}x{m} A {} B {} C {}:", layout(a_row), layout(b_row), layout(c_row));
            for &th in &threads {
                let par = if th > 1 { gemm::Parallelism::Rayon(th) } else { gemm::Parallelism::None };
                let pool = rayon::ThreadPoolBuilder::new().num_threads(th.max(1)).build()?;
                for swap in [false, true] {
                    // The product directly, or its transpose (`C^T = B^T A^T`, the
                    // operands swapped and each one's strides exchanged).
                    let (mm, nn, l, (lrs, lcs), r, (rrs, rcs), (drs, dcs)) = if swap {
                        (m, n, b.as_ptr() as usize, (bcs, brs), a.as_ptr() as usize, (acs, ars), (ccs, crs))
                    } else {
                        (n, m, a.as_ptr() as usize, (ars, acs), b.as_ptr() as usize, (brs, bcs), (crs, ccs))
                    };
                    let cp = c.as_mut_ptr() as usize;
                    let t = median_ms(30, || {
                        pool.install(|| {
                            // SAFETY: the strides cover the three matrices.
                            unsafe {
                                gemm::gemm(
                                    mm,
                                    nn,
                                    k,
                                    cp as *mut f32,
                                    dcs,
                                    drs,
                                    false,
                                    l as *const f32,
                                    lcs,
                                    lrs,
                                    r as *const f32,
                                    rcs,
                                    rrs,
                                    0.0,
                                    1.0,
                                    false,
                                    false,
                                    false,
                                    par,
                                )
                            }
                        });
                        Ok(())
                    })?;
                    let how = if swap { "swap" } else { "dir" };
                    line += &format!(" {th}T {how} {:.0}", flops / (t * 1e6));
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}

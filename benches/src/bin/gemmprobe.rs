//! Dev: which orientation of a product the `gemm` crate runs fastest, per operand layout (`SHAPE=NxKxM` for one shape).
use aotgrad_benches::runtime::median_ms;

#[allow(clippy::too_many_arguments)]
unsafe fn run(
    n: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    a: *const f32,
    a_rs: isize,
    a_cs: isize,
    b: *const f32,
    b_rs: isize,
    b_cs: isize,
    swap: bool,
    par: gemm::Parallelism,
) {
    // C (row-major n x m) = A (n x k) @ B (k x m)
    unsafe {
        if !swap {
            gemm::gemm(
                n, m, k, c, 1, m as isize, false, a, a_cs, a_rs, b, b_cs, b_rs, 0.0, 1.0, false, false, false, par,
            )
        } else {
            // C^T (m x n, col-major view of row-major C) = B^T (m x k) @ A^T (k x n)
            gemm::gemm(
                m, n, k, c, m as isize, 1, false, b, b_rs, b_cs, a, a_rs, a_cs, 0.0, 1.0, false, false, false, par,
            )
        }
    }
}

fn main() -> anyhow::Result<()> {
    let only: Option<(usize, usize, usize)> = std::env::var("SHAPE").ok().and_then(|s| {
        let v: Vec<usize> = s.split('x').filter_map(|x| x.parse().ok()).collect();
        (v.len() == 3).then(|| (v[0], v[1], v[2]))
    });
    let shapes = [
        (64usize, 512usize, 512usize),
        (1024, 256, 768),
        (1024, 1024, 256),
        (256, 1024, 1024),
        (128, 32, 128),
        (128, 128, 32),
        (128, 784, 256),
        (784, 128, 256),
        (128, 256, 784),
    ];
    for (n, k, m) in only.into_iter().chain(shapes).take(if std::env::var("SHAPE").is_ok() { 1 } else { 99 }) {
        let a: Vec<f32> = (0..n * k).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..k * m).map(|i| (i as f32).cos()).collect();
        let mut c = vec![0f32; n * m];
        for (al, a_rs, a_cs) in [("A row", k as isize, 1isize), ("A col", 1, n as isize)] {
            for (bl, b_rs, b_cs) in [("B row", m as isize, 1isize), ("B col", 1, k as isize)] {
                let mut line = format!("{n}x{k}x{m} {al} {bl}:");
                for swap in [false, true] {
                    for th in [1usize, 2] {
                        let par = if th > 1 { gemm::Parallelism::Rayon(th) } else { gemm::Parallelism::None };
                        let pool = rayon::ThreadPoolBuilder::new().num_threads(th).build()?;
                        let t = median_ms(100, || {
                            pool.install(|| unsafe {
                                run(n, k, m, c.as_mut_ptr(), a.as_ptr(), a_rs, a_cs, b.as_ptr(), b_rs, b_cs, swap, par)
                            });
                            Ok(())
                        })?;
                        let gf = 2.0 * (n * k * m) as f64 / (t * 1e6);
                        line += &format!(" {}{}t {gf:.0}", if swap { "swap" } else { "dir" }, th);
                    }
                }
                println!("{line}");
            }
        }
    }
    Ok(())
}

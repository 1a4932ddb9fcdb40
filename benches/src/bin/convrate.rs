//! Dev: the main job CNN's second convolution (forward and both gradients) in GFLOP/s
//! next to the `gemm` crate on the equivalent GEMM, and the fixed cost of a call, at 1
//! and 2 threads (the report's rows).
use aotgrad_benches::runtime::{conv_gflops, fixed_cost_us};

fn main() -> anyhow::Result<()> {
    for t in [1, 2] {
        let (c, g) = conv_gflops(t, 20)?;
        let (f, a) = fixed_cost_us(t, 2000)?;
        println!(
            "{t} thread(s): conv forward {:.0}, input grad {:.0}, weight grad {:.0} GFLOP/s; gemm {g:.0}; fixed cost {f:.1} / {a:.1} us",
            c[0], c[1], c[2]
        );
    }
    Ok(())
}

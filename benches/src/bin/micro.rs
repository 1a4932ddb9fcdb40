//! Micro-benchmarks of the compiled CPU backend (dev): GEMM and the fused chain.
use aotgrad_benches::runtime::*;

fn main() -> anyhow::Result<()> {
    if std::env::var("UNARY").is_ok() {
        for u in aotgrad_ir::UnaryOp::ALL {
            let (o, _) = chain_gbps(&[aotgrad_ir::Op::Unary(u)], 1 << 16, 1, 200)?;
            println!("{:>12}: {:.2} ns/element", u.name(), 8.0 / o);
        }
        return Ok(());
    }
    if std::env::var("CHAIN").is_ok() {
        let (o, c) = fused_chain_gbps(1 << 16, 1, 20000)?;
        println!("{o} {c}");
        return Ok(());
    }
    for t in [1, 2] {
        for n in [256, 512, 1024] {
            let (ours, direct) = gemm_gflops(n, t, 10)?;
            println!("gemm {n} {t}t: ours {ours:.1} GFLOP/s, gemm crate {direct:.1} GFLOP/s");
        }
        for n in [1 << 16, 1 << 22] {
            let (ours, copy) = fused_chain_gbps(n, t, 20)?;
            println!("chain {n} {t}t: ours {ours:.1} GB/s, copy {copy:.1} GB/s");
        }
    }
    Ok(())
}

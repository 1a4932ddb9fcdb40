//! Compare the reference interpreter and the compiled CPU backend on the bench workloads' forward and backward graphs: worst relative error and median run times (`PLAN=1` prints the kernel plans, `ONLY=mlp` picks a workload, `LOOP=1` adds a profiling loop).
use aotgrad_cpu::{CpuBackend, CpuTensor, ReferenceBackend};
use aotgrad_ir::{Backend, Graph};
use std::time::Instant;

fn inputs(g: &Graph) -> Vec<CpuTensor> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, inp)| {
            let shape = inp.meta.concrete_shape().unwrap();
            let strides = inp.meta.concrete_strides().unwrap();
            let n: usize = 1
                + shape.iter().zip(&strides).map(|(s, st)| (s.max(&1) - 1) * st).sum::<usize>()
                + inp.meta.concrete_offset().unwrap();
            let data: Vec<f64> =
                (0..n).map(|k| (((k * 7919 + i * 104729) % 1000) as f64 / 1000.0 - 0.5) * 0.2).collect();
            let t = CpuTensor::from_f64(&data, &[n], inp.meta.dtype).unwrap();
            CpuTensor { storage: t.storage, meta: inp.meta.clone() }
        })
        .collect()
}

fn check(name: &str, g: &Graph) -> anyhow::Result<()> {
    let ins = inputs(g);
    let r = ReferenceBackend.compile(g)?;
    let c1 = CpuBackend::new(1).compile_graph(g)?;
    let c2 = CpuBackend::new(2).compile(g)?;
    let want = r.run(&ins)?;
    let got = aotgrad_ir::CompiledGraph::run(&c1, &ins)?;
    let got2 = c2.run(&ins)?;
    let mut worst = 0f64;
    for (w, (g1, g2)) in want.iter().zip(got.iter().zip(&got2)) {
        assert_eq!(w.meta, g1.meta);
        let (a, b, c) = (w.to_vec_f64(), g1.to_vec_f64(), g2.to_vec_f64());
        for ((x, y), z) in a.iter().zip(&b).zip(&c) {
            let e = (x - y).abs().max((x - z).abs()) / (1.0 + x.abs());
            worst = worst.max(e);
        }
    }
    let time = |f: &dyn Fn()| {
        f();
        let mut ts: Vec<f64> = (0..15)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        ts[ts.len() / 2]
    };
    if std::env::var("LOOP").is_ok() {
        for _ in 0..200 {
            aotgrad_ir::CompiledGraph::run(&c1, &ins).unwrap();
        }
    }
    let tr = time(&|| {
        r.run(&ins).unwrap();
    });
    let t1 = time(&|| {
        aotgrad_ir::CompiledGraph::run(&c1, &ins).unwrap();
    });
    let t2 = time(&|| {
        c2.run(&ins).unwrap();
    });
    println!("{name}: {} nodes, kernels {:?}, worst rel err {worst:.2e}; ref {tr:.2} ms, cpu1 {t1:.2} ms, cpu2 {t2:.2} ms, peak {:?}",
        g.nodes.len(), c1.plan().map(|p| p.kernels.len()), c1.peak_bytes());
    if std::env::var("PLAN").is_ok() {
        println!("{}", c1.plan_text().unwrap_or_default());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let which = std::env::var("ONLY").unwrap_or_default();
    for w in [aotgrad_benches::mlp()?, aotgrad_benches::transformer()?] {
        if !which.is_empty() && !w.name.starts_with(&which) {
            continue;
        }
        let p = aotgrad_benches::pipeline(&w, true)?;
        check(&format!("{} fw", w.name), &p.forward)?;
        check(&format!("{} bw", w.name), &p.backward)?;
    }
    Ok(())
}

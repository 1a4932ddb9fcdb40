//! Compile-pipeline benches per stage for the MLP and the transformer block, and the
//! training step of both workloads through `aot_function` on the reference backend and
//! the compiled CPU backend at 1 and 2 threads.
// `criterion_group!` expands to an undocumented public function.
#![allow(missing_docs)]

use aotgrad::prelude::*;
use aotgrad_benches::*;
use criterion::{criterion_group, criterion_main, Criterion};

fn stages(c: &mut Criterion) {
    for w in [mlp().expect("mlp"), transformer().expect("transformer")] {
        let mut g = c.benchmark_group(format!("compile/{}", w.name));
        g.sample_size(20);
        let t = trace_stage(&w).expect("trace");
        let f = functionalize_stage(&t).expect("functionalize");
        let j = joint_stage(&t, &f).expect("joint");
        let s = simplify_stage(&j).expect("simplify");
        g.bench_function("trace", |b| b.iter(|| trace_stage(&w).expect("trace")));
        g.bench_function("functionalize", |b| b.iter(|| functionalize_stage(&t).expect("functionalize")));
        g.bench_function("joint", |b| b.iter(|| joint_stage(&t, &f).expect("joint")));
        g.bench_function("simplify", |b| b.iter(|| simplify_stage(&j).expect("simplify")));
        g.bench_function("partition_default", |b| b.iter(|| default_stage(&s).expect("default")));
        g.bench_function("partition_mincut", |b| b.iter(|| mincut_stage(&s, 1.0).expect("mincut")));
        g.bench_function("pipeline_no_simplify", |b| b.iter(|| pipeline(&w, false).expect("pipeline")));
        g.bench_function("pipeline", |b| b.iter(|| pipeline(&w, true).expect("pipeline")));
        g.finish();
    }
}

fn train_step(c: &mut Criterion) {
    for w in [mlp().expect("mlp"), transformer().expect("transformer")] {
        let inputs = aotgrad_benches::runtime::step_inputs(&w);
        let mut g = c.benchmark_group(format!("train_step/{}", w.name));
        g.sample_size(10);
        for (name, cfg) in [
            ("reference", AotConfig::default().reference_backend()),
            ("cpu_1_thread", AotConfig::default().threads(1)),
            ("cpu_2_threads", AotConfig::default().threads(2)),
        ] {
            let f = aotgrad_benches::runtime::compiled_step(&w, cfg).expect("aot_function");
            g.bench_function(name, |b| b.iter(|| aotgrad_benches::runtime::run_step(&f, &inputs).expect("step")));
        }
        g.finish();
    }
}

criterion_group!(benches, stages, train_step);
criterion_main!(benches);

//! Compile-pipeline benches per stage for the MLP and the transformer block, and the
//! training step of the MLP through `aot_function` on the reference backend.
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
    let w = mlp().expect("mlp");
    let module = w.module.clone();
    let names: Vec<String> = module.store().params().iter().map(|(n, _)| n.clone()).collect();
    let n = names.len();
    let f = aot_function(
        move |a: &[Tensor]| {
            let p = aotgrad::nn::Params::new(names.iter().cloned().zip(a[..n].iter().cloned()));
            Ok(vec![module.forward(&p, &a[n..])?[0].sum_all()?])
        },
        AotConfig::default(),
    )
    .expect("aot_function");
    let inputs = example_inputs(&w);
    let mut g = c.benchmark_group("train_step/mlp");
    g.sample_size(10);
    g.bench_function("reference_backend", |b| {
        b.iter(|| {
            let (outs, pending) = f.forward(&inputs).expect("forward");
            pending.backward(&[outs[0].ones_like().expect("ones")]).expect("backward")
        })
    });
    g.finish();
}

criterion_group!(benches, stages, train_step);
criterion_main!(benches);

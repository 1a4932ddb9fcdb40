//! Dev: the main job's training step at 1 and 2 threads on one batch: which gradients differ bit for bit.
use aotgrad::prelude::*;
use aotgrad_cli::models::ModelKind;
use aotgrad_cli::train::{batch, epoch_order};
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    if std::env::var("OPS").is_ok() {
        return op_check();
    }
    let model = match std::env::var("MODEL").as_deref() {
        Ok("mlp") => ModelKind::Mlp,
        Ok("vit") => ModelKind::Vit,
        _ => ModelKind::Cnn,
    };
    let data = aotgrad_cli::data::load(&aotgrad_cli::data::find_dir(None)?)?;
    let m = Arc::new(model.build(0)?);
    let order = epoch_order(data.train.len(), 0, 0);
    let (x, y) = batch(&data.train, &order[..128])?;
    let one = Tensor::ones(&[], DType::F32)?;
    let mut all = Vec::new();
    for threads in [1, 2] {
        let f = aot_module(m.clone(), AotConfig::default().threads(threads).no_cache())?;
        let (outs, back) = f.forward(&[x.clone(), y.clone()])?;
        let grads = back.backward_with(&[Some(one.clone()), None], &[])?;
        let mut v: Vec<(String, Vec<f64>)> =
            vec![("loss".into(), outs[0].to_vec_f64()?), ("logits".into(), outs[1].to_vec_f64()?)];
        for (n, g) in &grads.params {
            v.push((n.clone(), g.to_vec_f64()?));
        }
        all.push(v);
    }
    for ((n, a), (_, b)) in all[0].iter().zip(&all[1]) {
        let diff = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        println!("{n}: {diff} of {} differ", a.len());
    }
    Ok(())
}

fn op_check() -> anyhow::Result<()> {
    use aotgrad_cpu::CpuBackend;
    use aotgrad_ir::{Backend, Conv2dParams, Op, Pool2dParams};
    let p = Conv2dParams { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
    let x = aotgrad_benches::runtime::filled(&[128, 16, 14, 14], 0.3)?;
    let w = aotgrad_benches::runtime::filled(&[32, 16, 3, 3], 0.7)?;
    let gy = aotgrad_benches::runtime::filled(&[128, 32, 14, 14], 0.9)?;
    let x28 = aotgrad_benches::runtime::filled(&[128, 16, 28, 28], 0.3)?;
    let pp = Pool2dParams { kernel: [2, 2], stride: [2, 2], padding: [0, 0], dilation: [1, 1] };
    let gp = aotgrad_benches::runtime::filled(&[128, 16, 14, 14], 0.5)?;
    let cases: Vec<(Op, Vec<aotgrad_cpu::CpuTensor>)> = vec![
        (Op::Conv2d(p), vec![x.clone(), w.clone()]),
        (Op::Conv2dInputGrad { conv: p, input: [14, 14] }, vec![gy.clone(), w.clone()]),
        (Op::Conv2dWeightGrad { conv: p, kernel: [3, 3] }, vec![gy.clone(), x.clone()]),
        (Op::MaxPool2d(pp), vec![x28.clone()]),
        (Op::MaxPool2dGrad(pp), vec![gp.clone(), x28.clone()]),
    ];
    for (op, args) in cases {
        let g = aotgrad_benches::runtime::one_op_graph(op.clone(), &args)?;
        let r: Vec<Vec<f64>> = [1, 2]
            .iter()
            .map(|&t| CpuBackend::new(t).compile(&g).unwrap().run(&args).unwrap()[0].to_vec_f64())
            .collect();
        let diff = r[0].iter().zip(&r[1]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        println!("{}: {diff} of {} differ", op.name(), r[0].len());
    }
    Ok(())
}

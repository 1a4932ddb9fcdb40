//! Every node a composed op records points at the user's call, not at library code.

use aotgrad_trace::{trace, Conv2dOpts, DType, Tensor, TraceConfig};

#[test]
fn composed_ops_record_the_users_line() {
    let x = Tensor::ones(&[2, 3, 4, 4], DType::F32).unwrap();
    let w = Tensor::ones(&[2, 3, 3, 3], DType::F32).unwrap();
    let mask = Tensor::from_bool(&[true, false, true, false], &[4]).unwrap();
    let idx = Tensor::from_vec(vec![0i64, 2, 1], &[3]).unwrap();
    let probs = Tensor::ones(&[2, 4], DType::F32).unwrap();
    let stats = Tensor::ones(&[3], DType::F32).unwrap();
    let traced = trace(
        |a| {
            let (x, w, mask, idx, probs) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
            let mut outs = vec![
                x.masked_fill(mask, 1.0)?,
                x.tril(0)?,
                x.triu(1)?,
                Tensor::stack(&[x, x], 1)?,
                x.var(&[1], 1, false)?,
                x.std(&[2], 0, true)?,
                x.argmax_all()?,
                x.argmin_all()?,
                x.max_dim(1, false)?.0,
                x.min_dim(1, true)?.1,
                x.sort(3, true)?.0,
                x.topk(2, 3, true)?.0,
                x.rsub(1.0)?,
                x.rdiv(2.0)?,
                x.any(&[1], false)?,
                x.all(&[1], false)?,
                x.clamp_tensor(Some(&x.mul(0.5)?), None)?,
                idx.one_hot(3)?,
                x.diagonal(0, 2, 3)?,
                x.conv2d(w, None, Conv2dOpts::default().padding(1))?,
                x.conv_transpose2d(&w.transpose(0, 1)?, None, Conv2dOpts::default(), [0, 0])?,
                x.max_pool2d([2, 2], None, [0, 0], [1, 1])?,
                x.avg_pool2d([2, 2], None, [0, 0])?,
                x.adaptive_avg_pool2d([1, 1])?,
                x.group_norm(1, None, None, 1e-5)?,
                x.cumsum(1)?,
                probs.multinomial(2, true, 7u64)?,
                x.batch_norm(Some(&a[5]), Some(&a[6]), None, None, true, 0.1, 1e-5)?,
                x.clone_tensor()?.masked_fill_(mask, 2.0)?,
            ];
            outs.extend(x.split(2, 1)?);
            outs.extend(x.chunk(2, 2)?);
            Ok(outs)
        },
        &[x.clone(), w.clone(), mask.clone(), idx.clone(), probs, stats.clone(), stats],
        &TraceConfig::default(),
    )
    .unwrap();
    let this = file!();
    let bad: Vec<String> = traced
        .graph
        .nodes
        .iter()
        .filter_map(|n| n.loc.as_ref().filter(|l| &*l.file != this).map(|l| format!("{} at {l}", n.op.name())))
        .collect();
    assert!(bad.is_empty(), "nodes pointing into the library:\n{}", bad.join("\n"));
}

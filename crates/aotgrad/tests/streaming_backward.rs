//! Gradients handed out while the compiled backward runs
//! (`ModuleBackward::backward_streaming`, on `CompiledGraph::run_streaming`): each
//! one handed out equals the gradient returned at the end, bit for bit, every
//! parameter of a plain module comes early on the compiled CPU backend, and the
//! returned gradients equal `backward_with`'s.

use aotgrad::ir::{HostData, TensorMeta};
use aotgrad::nn::{Mlp, Module};
use aotgrad::prelude::*;
use std::sync::Arc;

/// Gradients handed out early: `(parameter index, values)`.
type Early = Vec<(usize, Vec<f64>)>;

/// The elements of a handed-out gradient, read through its layout.
fn read(meta: &TensorMeta, data: HostData<'_>) -> Vec<f64> {
    let shape = meta.concrete_shape().unwrap();
    let strides = meta.concrete_strides().unwrap();
    let offset = meta.concrete_offset().unwrap();
    let n: usize = shape.iter().product();
    (0..n)
        .map(|e| {
            let (mut rest, mut pos) = (e, offset);
            for d in (0..shape.len()).rev() {
                pos += (rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            match data {
                HostData::F32(v) => v[pos] as f64,
                HostData::F64(v) => v[pos],
            }
        })
        .collect()
}

#[test]
fn streamed_gradients_equal_the_returned_ones() -> aotgrad::Result<()> {
    for threads in [1, 2] {
        let net = Arc::new(Mlp::new(&[6, 16, 16, 3], DType::F32, 4)?);
        let names: Vec<String> = net.store().names();
        let compiled = aot_module(net.clone(), AotConfig::default().threads(threads))?;
        let x = Tensor::randn(&[5, 6], DType::F32, 9)?;
        let run = |stream: bool| -> aotgrad::Result<(aotgrad::ModuleGrads, Early)> {
            let (outs, back) = compiled.forward(std::slice::from_ref(&x))?;
            let g = outs[0].ones_like()?;
            let mut early = Vec::new();
            let grads = if stream {
                back.backward_streaming(&[Some(g)], &[], &mut |p, o| early.push((p, read(o.meta, o.data))))?
            } else {
                back.backward_with(&[Some(g)], &[])?
            };
            Ok((grads, early))
        };
        let (streamed, early) = run(true)?;
        let (plain, none) = run(false)?;
        assert!(none.is_empty());
        // Every parameter's gradient came early, once.
        let mut seen: Vec<usize> = early.iter().map(|(p, _)| *p).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..names.len()).collect::<Vec<_>>(), "{threads} thread(s)");
        for (p, values) in &early {
            let returned = streamed.param(&names[*p]).expect("a gradient").to_vec_f64()?;
            assert_eq!(values, &returned, "parameter {}", names[*p]);
        }
        for ((n, a), (m, b)) in streamed.params.iter().zip(&plain.params) {
            assert_eq!(n, m);
            assert_eq!(a.to_vec_f64()?, b.to_vec_f64()?, "{n}");
        }
    }
    Ok(())
}

#[test]
fn a_parameter_whose_gradient_is_combined_is_not_handed_out_early() -> aotgrad::Result<()> {
    // The weight is also returned (an output aliasing an input): its gradient adds
    // the output's gradient to the graph's, so it only comes at the end.
    let w = Tensor::randn(&[3, 3], DType::F32, 1)?.requires_grad(true)?;
    let x = Tensor::randn(&[2, 3], DType::F32, 2)?;
    let f = aot_function(|a: &[Tensor]| Ok(vec![a[1].matmul(&a[0])?.sum_all()?, a[0].clone()]), AotConfig::default())?;
    let (outs, pending) = f.forward(&[w.clone(), x.clone()])?;
    let mut early = Vec::new();
    let grads =
        pending.backward_streaming(&[Some(outs[0].ones_like()?), Some(outs[1].ones_like()?)], &[], &mut |arg, _| {
            early.push(arg)
        })?;
    assert!(early.is_empty(), "{early:?}");
    // d/dw (sum(x @ w)) + 1: every column of x summed, plus one.
    let xs = x.to_vec_f64()?;
    let want: Vec<f64> = (0..9).map(|i| xs[i / 3] + xs[3 + i / 3] + 1.0).collect();
    let got = grads[0].as_ref().expect("a gradient").to_vec_f64()?;
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
    Ok(())
}

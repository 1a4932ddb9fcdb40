//! Strides of size-1 dims do not matter (PyTorch ignores them in contiguity): a
//! compiled graph takes an input whose size-1 dims have other strides than the
//! traced ones. Issue 32 item 7: the backward of `x.transpose(0, 1) + 1` on a `[1, 2]`
//! leaf, given `ones_like(out)` (a `[2, 1]` tensor with strides `[1, 2]`), failed with
//! "graph input 0: stride 1 is 2, but the graph expects 1".

use aotgrad::prelude::*;

#[test]
fn a_batch_one_leaf_with_a_transposed_output_trains() -> aotgrad::Result<()> {
    for shape in [[1usize, 2], [2, 3], [1, 1]] {
        let x = Tensor::randn(&shape, DType::F32, 3)?.requires_grad(true)?;
        let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].transpose(0, 1)?.add(1.0)?]), AotConfig::default())?;
        let (outs, pending) = f.forward(std::slice::from_ref(&x))?;
        let g = outs[0].ones_like()?;
        let grads = pending.backward(std::slice::from_ref(&g))?;
        let got = grads[0].as_ref().expect("a gradient").to_vec_f64()?;
        assert_eq!(got, vec![1.0; shape[0] * shape[1]], "{shape:?}");
        // Eager autograd agrees.
        let y = x.transpose(0, 1)?.add(1.0)?;
        y.backward_with(Some(&y.ones_like()?), false)?;
        assert_eq!(x.grad().expect("eager gradient").to_vec_f64()?, got, "{shape:?}");
    }
    Ok(())
}

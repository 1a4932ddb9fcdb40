//! The README's main job (for now): build a small MLP, trace it over fake tensors,
//! print the traced graph, run it eagerly, and run the traced graph through the
//! reference interpreter and through `aot_function`, checking all three agree.

use aotgrad::prelude::*;

fn mlp(x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor, b2: &Tensor) -> aotgrad::Result<Tensor> {
    Ok(x.linear(w1, Some(b1))?.gelu()?.linear(w2, Some(b2))?.softmax(-1)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    aotgrad::init_logging();
    let x = Tensor::randn(&[8, 16], DType::F32, 0)?;
    let w1 = Tensor::randn(&[32, 16], DType::F32, 1)?.mul(0.25)?;
    let b1 = Tensor::zeros(&[32], DType::F32)?;
    let w2 = Tensor::randn(&[4, 32], DType::F32, 2)?.mul(0.18)?;
    let b2 = Tensor::zeros(&[4], DType::F32)?;
    let inputs = [x, w1, b1, w2, b2];

    let traced =
        trace(|a: &[Tensor]| Ok(vec![mlp(&a[0], &a[1], &a[2], &a[3], &a[4])?]), &inputs, &TraceConfig::default())?;
    println!("traced graph ({} nodes):\n{}", traced.graph.nodes.len(), traced.graph);

    let eager = mlp(&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4])?;
    let cpu_inputs: Vec<_> = inputs.iter().map(|t| t.to_cpu()).collect::<Result<_, _>>()?;
    let interpreted = aotgrad::cpu::interpret(&traced.graph, &cpu_inputs)?;
    let compiled =
        aot_function(|a: &[Tensor]| Ok(vec![mlp(&a[0], &a[1], &a[2], &a[3], &a[4])?]), AotConfig::default())?;
    let out = compiled.call(&inputs)?;

    let e = eager.to_vec_f64()?;
    let max_diff = |v: &[f64]| e.iter().zip(v).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!("eager output row 0: {:?}", &e[..4]);
    println!("max |eager - interpreted| = {:e}", max_diff(&interpreted[0].to_vec_f64()));
    println!("max |eager - aot_function| = {:e}", max_diff(&out[0].to_vec_f64()?));
    Ok(())
}

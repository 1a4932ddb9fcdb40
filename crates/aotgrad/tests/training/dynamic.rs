//! Dynamic shapes through training: a function compiled with symbolic dims runs
//! forward and backward at every size, including sizes 0 and 1 (which specialize, as
//! in PyTorch), with the default and the min-cut partitioner, and its outputs and
//! gradients equal those of a compile specialized to each size. Backward graphs
//! whose sizes only the forward's inputs determine (the expand in `mean`'s
//! gradient, a cotangent of size `s0 + s1 + 5`) get the call's symbol values, as
//! PyTorch saves sym-ints for backward.

use crate::checker::{check, leaf, rand_vals, tensor};
use aotgrad::runtime::Partitioner;
use aotgrad::trace::Tensor;
use aotgrad::{aot_function_args, AotConfig, AotFunction, Arg};
use std::sync::Arc;

type UserFn = Arc<dyn Fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync>;

/// Outputs (shape, strides, values) and argument gradients of one forward + backward.
type Step = (Vec<(Vec<usize>, Vec<i64>, Vec<f64>)>, Vec<Option<Vec<f64>>>);

fn step(c: &AotFunction, shapes: &[Vec<usize>], seed: u64) -> Result<Step, String> {
    let args: Vec<Arg> = shapes.iter().enumerate().map(|(i, s)| leaf(s, seed + i as u64).into()).collect();
    let (outs, pending) = c.forward_args(&args).map_err(|e| format!("forward: {e}"))?;
    let mut grads = Vec::new();
    let mut seen = Vec::new();
    for (j, o) in outs.iter().enumerate() {
        let shape = o.sizes().map_err(|e| e.to_string())?;
        let strides = o.meta().strides.iter().map(|d| d.as_const().unwrap_or(-1)).collect();
        seen.push((shape.clone(), strides, o.to_vec_f64().map_err(|e| e.to_string())?));
        let n = shape.iter().product();
        grads.push(
            Tensor::from_f64(&rand_vals(n, seed + 50 + j as u64), &shape, crate::checker::float_dtype()).expect("grad"),
        );
    }
    let g = pending.backward(&grads).map_err(|e| format!("backward: {e}"))?;
    let g = g.iter().map(|g| g.as_ref().map(|t| t.to_vec_f64().expect("values"))).collect();
    Ok((seen, g))
}

fn close(what: &str, a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= crate::checker::tol_of(1e-9) * (1.0 + y.abs());
        assert!(ok, "{what}[{i}]: {x} (dynamic) != {y} (static)");
    }
}

/// Compile `f` once with `dynamic` dims and run it at every shape set of `sizes`
/// (both partitioners); each run must equal a compile specialized to its sizes.
/// Returns the number of entries the dynamic function compiled.
fn agrees_with_static(f: UserFn, dynamic: &[(usize, usize)], sizes: &[Vec<Vec<usize>>]) -> Vec<usize> {
    let mut counts = Vec::new();
    for partitioner in [Partitioner::Default, Partitioner::MinCut { activation_memory_budget: 0.5 }] {
        let config = AotConfig { partitioner: partitioner.clone(), ..AotConfig::default() };
        let dyn_config = AotConfig { dynamic: dynamic.to_vec(), ..config.clone() };
        let ff = f.clone();
        let c = aot_function_args(move |a: &[Arg]| ff(a), dyn_config).expect("compile");
        for (k, shapes) in sizes.iter().enumerate() {
            let what = format!("{partitioner:?} at {shapes:?}");
            let got = step(&c, shapes, 10 * k as u64).unwrap_or_else(|e| panic!("{what}: dynamic: {e}"));
            let ff = f.clone();
            let s = aot_function_args(move |a: &[Arg]| ff(a), config.clone()).expect("compile");
            let want = step(&s, shapes, 10 * k as u64).unwrap_or_else(|e| panic!("{what}: static: {e}"));
            assert_eq!(got.0.len(), want.0.len(), "{what}: outputs");
            for (j, (a, b)) in got.0.iter().zip(&want.0).enumerate() {
                assert_eq!((&a.0, &a.1), (&b.0, &b.1), "{what}: output {j}'s shape and strides");
                close(&format!("{what}: output {j}"), &a.2, &b.2);
            }
            for (j, (a, b)) in got.1.iter().zip(&want.1).enumerate() {
                match (a, b) {
                    (Some(a), Some(b)) => close(&format!("{what}: gradient {j}"), a, b),
                    (None, None) => {}
                    _ => panic!("{what}: gradient {j} present in one compile only"),
                }
            }
        }
        counts.push(c.num_compiled());
    }
    counts
}

fn arc(f: fn(&[Arg]) -> aotgrad::Result<Vec<Tensor>>) -> UserFn {
    Arc::new(f)
}

fn shapes(s: &[&[usize]]) -> Vec<Vec<usize>> {
    s.iter().map(|s| s.to_vec()).collect()
}

#[test]
fn mean_over_a_dynamic_dim_then_backward() {
    // The gradient expands to [s0, 4]: no backward input has size s0.
    let f = arc(|a| Ok(vec![tensor(&a[0])?.mean(&[0], false)?]));
    let sizes = [shapes(&[&[3, 4]]), shapes(&[&[5, 4]]), shapes(&[&[2, 4]])];
    assert_eq!(agrees_with_static(f.clone(), &[(0, 0)], &sizes), [1, 1], "one entry serves every batch");
    // The whole contract (eager, finite differences, cache round trip) at one size.
    check(
        move |a: &[Arg]| f(a),
        || vec![leaf(&[3, 4], 1).into()],
        AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() },
    );
}

#[test]
fn outputs_sized_by_a_sum_of_symbols() {
    // cat gives [s0 + s1 + 5, 2]; its cotangent binds neither s0 nor s1.
    let f = arc(|a| {
        let (x, y) = (tensor(&a[0])?, tensor(&a[1])?);
        Ok(vec![Tensor::cat(&[x, y, &x.slice(0, Some(0), Some(5), 1)?], 0)?.sin()?])
    });
    let sizes = [shapes(&[&[6, 2], &[7, 2]]), shapes(&[&[8, 2], &[5, 2]])];
    assert_eq!(agrees_with_static(f.clone(), &[(0, 0), (1, 0)], &sizes), [1, 1]);
    check(
        move |a: &[Arg]| f(a),
        || vec![leaf(&[6, 2], 1).into(), leaf(&[7, 2], 2).into()],
        AotConfig { dynamic: vec![(0, 0), (1, 0)], ..AotConfig::default() },
    );
}

#[test]
fn full_sized_by_an_input_inside_the_function() {
    let f = arc(|a| {
        let x = tensor(&a[0])?;
        let w = Tensor::full_dims(&[x.size(0)?], 2.0, crate::checker::float_dtype())?;
        Ok(vec![x.mul(&w)?.exp()?, w.sum(&[0], false)?])
    });
    let sizes = [shapes(&[&[3]]), shapes(&[&[4]]), shapes(&[&[9]])];
    assert_eq!(agrees_with_static(f, &[(0, 0)], &sizes), [1, 1]);
}

#[test]
fn shapes_saved_for_backward() {
    // The backward of a reshape, an expand and a sum needs the input's shape, but
    // none of the input's values.
    let f = arc(|a| {
        let (x, b) = (tensor(&a[0])?, tensor(&a[1])?);
        let flat = x.reshape(&[-1])?;
        let e = b.expand_dims(&[x.size(0)?, b.size(0)?])?;
        Ok(vec![flat.sum(&[0], false)?, e.add(x)?.sum(&[1], true)?])
    });
    let sizes = [shapes(&[&[3, 4], &[4]]), shapes(&[&[6, 5], &[5]]), shapes(&[&[2, 2], &[2]])];
    assert_eq!(agrees_with_static(f, &[(0, 0), (0, 1), (1, 0)], &sizes), [1, 1]);
}

#[test]
fn sizes_zero_and_one_specialize_and_match_eager() {
    // Compiled with both dims symbolic at (2, 3), then called at sizes with 0 and 1:
    // those specialize (a new entry each), and every result equals eager's and the
    // static compile's, strides included.
    let f = arc(|a| {
        let x = tensor(&a[0])?;
        Ok(vec![x.mul(x)?.mean(&[0, 1], false)?, x.t()?.mul(2.0)?])
    });
    let sizes = [
        shapes(&[&[2, 3]]),
        shapes(&[&[1, 1]]),
        shapes(&[&[1, 3]]),
        shapes(&[&[3, 1]]),
        shapes(&[&[0, 3]]),
        shapes(&[&[4, 5]]),
    ];
    let counts = agrees_with_static(f.clone(), &[(0, 0), (0, 1)], &sizes);
    assert_eq!(counts, [5, 5], "(2, 3) and (4, 5) share an entry; each 0/1 pattern has its own");
    for s in [[1usize, 1], [1, 3], [3, 1], [2, 3]] {
        let ff = f.clone();
        check(
            move |a: &[Arg]| ff(a),
            move || vec![leaf(&s, 4).into()],
            AotConfig { dynamic: vec![(0, 0), (0, 1)], ..AotConfig::default() },
        );
    }
}

#[test]
fn mlp_with_every_dim_dynamic() {
    let f = arc(|a| {
        let (x, w1, b1, w2) = (tensor(&a[0])?, tensor(&a[1])?, tensor(&a[2])?, tensor(&a[3])?);
        let h = x.matmul(w1)?.add(b1)?.gelu()?;
        let y = h.matmul(w2)?.softmax(-1)?;
        Ok(vec![y.sum(&[0, 1], false)?, h])
    });
    let mlp = |b: usize, i: usize, h: usize, o: usize| shapes(&[&[b, i], &[i, h], &[h], &[h, o]]);
    let dynamic: Vec<(usize, usize)> = vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (3, 1)];
    let sizes = [mlp(4, 3, 5, 6), mlp(2, 2, 2, 2), mlp(1, 3, 5, 6), mlp(0, 3, 5, 2), mlp(5, 4, 3, 7), mlp(2, 1, 1, 3)];
    agrees_with_static(f, &dynamic, &sizes);
}

/// A random program over `[s0, s1]` tensors: pointwise ops, reductions broadcast
/// back, softmax, views, a matmul with its own transpose, triangles; every dim
/// symbolic.
fn random_program(seed: u64) -> UserFn {
    let ops: Vec<u64> = rand_vals(6, seed).iter().map(|v| ((v + 1.0) * 500.0) as u64 % 10).collect();
    Arc::new(move |a: &[Arg]| {
        let (mut x, w) = (tensor(&a[0])?.clone(), tensor(&a[1])?);
        let mut outs = Vec::new();
        for &op in &ops {
            x = match op {
                0 => x.sin()?,
                1 => x.mul(w)?,
                2 => x.add(&x.sum(&[0], true)?)?,
                3 => x.sub(&x.mean(&[1], true)?)?.tanh()?,
                4 => x.softmax(-1)?,
                5 => x.t()?.mul(2.0)?.t()?,
                6 => x.mul(&x)?.add(w)?,
                7 => x.matmul(&x.t()?)?.matmul(&x)?.mul(0.1)?,
                8 => x.tril(0)?.add(&x.triu(1)?.mul(-0.5)?)?,
                _ => {
                    outs.push(x.clone());
                    x.exp()?.mul(0.5)?
                }
            };
        }
        outs.push(x.sum(&[0, 1], false)?);
        outs.push(x);
        Ok(outs)
    })
}

#[test]
fn random_programs_with_every_dim_dynamic() {
    let sizes = [
        shapes(&[&[3, 4], &[4]]),
        shapes(&[&[2, 2], &[2]]),
        shapes(&[&[1, 4], &[4]]),
        shapes(&[&[0, 2], &[2]]),
        shapes(&[&[5, 3], &[3]]),
    ];
    for seed in 0..12 {
        // (3, 4), (2, 2) and (5, 3) share an entry; (1, 4) and (0, 2) specialize.
        let counts = agrees_with_static(random_program(seed), &[(0, 0), (0, 1), (1, 0)], &sizes);
        assert_eq!(counts, [3, 3], "program {seed}");
    }
}

/// Forward outputs, and the parameter and input gradients by name.
type ModuleStep = (Vec<Vec<f64>>, Vec<(String, Vec<f64>)>);

/// One forward + backward of an `aot_module`.
fn module_step(m: &aotgrad::AotModule, x: &Tensor) -> ModuleStep {
    let x = x.requires_grad(true).expect("leaf");
    let (outs, bw) = m.forward(std::slice::from_ref(&x)).expect("forward");
    let grads: Vec<Tensor> = outs
        .iter()
        .enumerate()
        .map(|(j, o)| {
            let shape = o.sizes().expect("sizes");
            Tensor::from_f64(&rand_vals(shape.iter().product(), 90 + j as u64), &shape, crate::checker::float_dtype())
                .expect("grad")
        })
        .collect();
    let g = bw.backward(&grads).expect("backward");
    let mut named: Vec<(String, Vec<f64>)> =
        g.params.iter().map(|(n, t)| (n.clone(), t.to_vec_f64().expect("values"))).collect();
    named.push(("input".into(), g.inputs[0].as_ref().expect("input grad").to_vec_f64().expect("values")));
    (outs.iter().map(|o| o.to_vec_f64().expect("values")).collect(), named)
}

#[test]
fn transformer_block_with_dynamic_batch_and_sequence() {
    use aotgrad::nn::{Module, TransformerBlock};
    let block: Arc<dyn Module> =
        Arc::new(TransformerBlock::new(8, 2, crate::checker::float_dtype(), 0).expect("block").causal(true));
    let dynamic =
        aotgrad::aot_module(block.clone(), AotConfig { dynamic: vec![(0, 0), (0, 1)], ..AotConfig::default() })
            .expect("aot_module");
    for (k, (b, s)) in [(2usize, 3usize), (3, 5), (2, 1), (1, 1), (4, 2), (0, 3)].into_iter().enumerate() {
        let x =
            Tensor::from_f64(&rand_vals(b * s * 8, k as u64), &[b, s, 8], crate::checker::float_dtype()).expect("x");
        let got = module_step(&dynamic, &x);
        let fixed = aotgrad::aot_module(block.clone(), AotConfig::default()).expect("aot_module");
        let want = module_step(&fixed, &x);
        let eager = block.forward_eager(std::slice::from_ref(&x)).expect("eager");
        for (j, (a, e)) in got.0.iter().zip(&eager).enumerate() {
            close(&format!("({b}, {s}): output {j} vs eager"), a, &e.to_vec_f64().expect("values"));
        }
        for ((n, a), (_, w)) in got.1.iter().zip(&want.1) {
            close(&format!("({b}, {s}): gradient of {n}"), a, w);
        }
    }
    // (2, 3), (3, 5) and (4, 2) share an entry; seq 1, then batch 1 too, and batch 0
    // specialize.
    assert_eq!(dynamic.function().num_compiled(), 4);
}

#[test]
fn view_with_an_inferred_dim_a_symbol_does_not_divide() {
    // `[s0] -> [-1, 2]`: no polynomial is `s0 / 2`, so the trace fixes s0 to its
    // value under a guard (PyTorch specializes what it cannot reason about): each
    // size gets its own entry, every one agreeing with the static compile.
    let f = arc(|a| {
        let x = tensor(&a[0])?;
        let v = x.view(&[-1, 2])?;
        Ok(vec![v.sum(&[1], false)?.sin()?, v.t()?])
    });
    let sizes = [shapes(&[&[4]]), shapes(&[&[6]]), shapes(&[&[4]]), shapes(&[&[8]])];
    assert_eq!(agrees_with_static(f.clone(), &[(0, 0)], &sizes), [3, 3]);
    // An odd size fails as eager does, with eager's message.
    let ff = f.clone();
    let c = aot_function_args(move |a: &[Arg]| ff(a), AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() })
        .expect("compile");
    step(&c, &shapes(&[&[4]]), 0).expect("size 4");
    let e = step(&c, &shapes(&[&[5]]), 0).expect_err("size 5 cannot be viewed as [-1, 2]");
    assert!(e.contains("shape '[-1, 2]' is invalid for input of size 5"), "{e}");
}

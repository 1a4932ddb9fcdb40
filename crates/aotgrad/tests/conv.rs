//! conv2d, max_pool2d, avg_pool2d and adaptive_avg_pool2d against values and
//! gradients computed by PyTorch 2.15 (printed to 12 digits), eagerly and compiled.

use aotgrad::prelude::*;

/// `((i * a) mod m) - 1` for `i in 0..n`, the inputs the PyTorch script used.
fn vals(n: usize, a: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 * a) % 2.0) - 1.0).collect()
}

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64]) {
    close_tol(what, got, want, 1e-9)
}

fn close_tol(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: got {g}, PyTorch {w}");
    }
}

fn sum_abs(v: &[f64]) -> f64 {
    v.iter().map(|x| x.abs()).sum()
}

/// `f` compiled, its output, and the gradients of `sum(out * g)` for every input.
fn compiled(
    f: impl Fn(&[Tensor]) -> aotgrad::Result<Vec<Tensor>> + Send + Sync + 'static,
    inputs: &[Tensor],
    g: &Tensor,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let ins: Vec<Tensor> = inputs.iter().map(|x| x.requires_grad(true).unwrap()).collect();
    let (out, back) = c.forward(&ins).unwrap();
    let grads = back.backward(std::slice::from_ref(g)).unwrap();
    (out[0].to_vec_f64().unwrap(), grads.iter().map(|g| g.as_ref().unwrap().to_vec_f64().unwrap()).collect())
}

#[test]
fn conv2d_with_stride_padding_dilation_and_groups_matches_pytorch() {
    // x [2, 4, 5, 6], w [6, 2, 3, 3], groups 2, stride (2, 1), padding (1, 2), dilation (1, 2).
    let x = t(&vals(240, 0.37), &[2, 4, 5, 6]);
    let w = t(&vals(108, 0.53), &[6, 2, 3, 3]);
    let b = t(&[0.1, -0.2, 0.3, 0.0, 0.5, -0.4], &[6]);
    let opts = Conv2dOpts { stride: [2, 1], padding: [1, 2], dilation: [1, 2], groups: 2 };
    let f = move |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].conv2d(&a[1], Some(&a[2]), opts)?]) };
    let y = f(&[x.clone(), w.clone(), b.clone()]).unwrap().remove(0);
    assert_eq!(y.sizes().unwrap(), vec![2, 6, 3, 6]);
    let yv = y.to_vec_f64().unwrap();
    close("y", &yv[..8], &[0.7136, -0.674, -0.672, 0.92, -1.2664, -1.3028, -1.0976, -0.3388]);
    close("sum y", &[yv.iter().sum()], &[22.7028]);
    let g = t(&vals(216, 0.71), &[2, 6, 3, 6]);
    let (out, grads) = compiled(f, &[x, w, b], &g);
    close("compiled y", &out, &yv);
    close("dx", &grads[0][..8], &[0.9972, -0.3201, 0.2196, 0.217, 0.9164, -0.0231, -0.7098, -0.7644]);
    close("sum dx", &[grads[0].iter().sum(), sum_abs(&grads[0])], &[-6.198, 170.4144]);
    close("dw", &grads[1][..8], &[-1.2096, -0.2048, 0.9528, 1.0812, 2.8646, -0.094, 1.6392, -1.4704]);
    close("sum |dw|", &[sum_abs(&grads[1])], &[130.128]);
    close("db", &grads[2], &[-2.5, -0.42, -0.34, -0.26, 1.82, -0.1]);
}

#[test]
fn pooling_matches_pytorch_values_and_gradients() {
    let x = t(&vals(32, 0.61), &[1, 2, 4, 4]);
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].max_pool2d([2, 2], Some([1, 1]), [1, 1], [1, 1])?])
    };
    let mp = f(std::slice::from_ref(&x)).unwrap().remove(0);
    assert_eq!(mp.sizes().unwrap(), vec![1, 2, 5, 5]);
    #[rustfmt::skip]
    let want = [-1.0, -0.39, 0.22, 0.83, 0.83, -0.56, 0.05, 0.66, 0.83, 0.83, -0.12, 0.49, 0.66, 0.66, -0.29, 0.32,
        0.93, 0.93, 0.15, 0.15, 0.32, 0.93, 0.93, 0.15, 0.15, 0.76, 0.76, -0.02, 0.59, 0.59, 0.76, 0.76, 0.42, 0.59,
        0.59, -0.36, 0.25, 0.86, 0.86, -0.53, 0.08, 0.69, 0.86, 0.86, -0.09, 0.08, 0.69, 0.69, -0.09, -0.09];
    close("max_pool2d", &mp.to_vec_f64().unwrap(), &want);
    let (out, grads) = compiled(f, std::slice::from_ref(&x), &t(&vals(50, 0.29), &[1, 2, 5, 5]));
    close("compiled max_pool2d", &out, &want);
    #[rustfmt::skip]
    close("max_pool2d dx", &grads[0], &[-1.0, -0.71, -0.42, -1.04, 0.45, 0.74, 0.28, 0.0, -0.1, 0.19, 0.0, -0.94,
        0.15, -1.96, 0.0, 0.36, 0.48, 0.0, 0.83, -0.04, 0.0, 0.0, 0.28, 0.0, -0.85, -0.56, -1.6, 0.31, 0.65, 1.86, 0.0,
        -0.11]);

    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].avg_pool2d([3, 3], Some([2, 2]), [1, 1])?]) };
    #[rustfmt::skip]
    let want = [-0.211111111111, 0.071111111111, 0.123333333333, -0.011111111111, -0.095555555556, -0.088888888889,
        -0.036666666667, -0.028888888889];
    let (out, grads) = compiled(f, std::slice::from_ref(&x), &t(&vals(8, 0.29), &[1, 2, 2, 2]));
    close("avg_pool2d", &out, &want);
    #[rustfmt::skip]
    close("avg_pool2d dx", &grads[0], &[-0.111111111111, -0.19, -0.078888888889, -0.078888888889, -0.157777777778,
        -0.251111111111, -0.093333333333, -0.093333333333, -0.046666666667, -0.061111111111, -0.014444444444,
        -0.014444444444, -0.046666666667, -0.061111111111, -0.014444444444, -0.014444444444, 0.017777777778,
        0.067777777778, 0.05, 0.05, 0.1, 0.042222222222, -0.057777777778, -0.057777777778, 0.082222222222,
        -0.025555555556, -0.107777777778, -0.107777777778, 0.082222222222, -0.025555555556, -0.107777777778,
        -0.107777777778]);
    close(
        "adaptive_avg_pool2d",
        &x.adaptive_avg_pool2d([2, 1]).unwrap().to_vec_f64().unwrap(),
        &[-0.115, 0.015, -0.105, 0.025],
    );
}

#[test]
fn convolution_errors_name_the_shapes() {
    let x = t(&vals(2 * 3 * 4 * 4, 0.3), &[2, 3, 4, 4]);
    let w = t(&vals(4 * 3 * 3 * 3, 0.2), &[4, 3, 3, 3]);
    let e = |r: aotgrad::trace::Result<Tensor>| r.unwrap_err().to_string();
    assert!(e(x.conv2d(&w, None, Conv2dOpts::default().groups(2))).contains("groups=2"));
    assert!(e(x.conv2d(&t(&[0.0; 12], &[4, 3]), None, Conv2dOpts::default())).contains("4-D weight"));
    assert!(e(x.conv2d(&w, Some(&t(&[0.0; 3], &[3])), Conv2dOpts::default())).contains("bias of shape [4]"));
    let big = t(&vals(4 * 3 * 5 * 5, 0.2), &[4, 3, 5, 5]);
    assert!(e(x.conv2d(&big, None, Conv2dOpts::default())).contains("smaller than the kernel"));
    assert!(e(x.conv2d(&w, None, Conv2dOpts::default().stride(0))).contains("must be positive"));
    assert!(e(t(&[0.0; 4], &[2, 2]).conv2d(&w, None, Conv2dOpts::default())).contains("3-D or 4-D"));
    assert!(e(x.max_pool2d([2, 2], None, [2, 2], [1, 1])).contains("at most half"));
    assert!(e(x.adaptive_avg_pool2d([3, 3])).contains("must divide"));
    // An unbatched [C, H, W] input gives an unbatched result.
    let y = x.select(0, 0).unwrap().conv2d(&w, None, Conv2dOpts::default().padding(1)).unwrap();
    assert_eq!(y.sizes().unwrap(), vec![4, 4, 4]);
}

/// `BatchNorm2d` in training mode: PyTorch's output and running statistics (buffer
/// mutation through the compiled graph's epilogue), then eval mode from those.
#[test]
fn batch_norm_trains_updates_its_buffers_and_evaluates_as_pytorch() {
    use aotgrad::nn::BatchNorm2d;
    use std::sync::Arc;
    let make = || {
        let bn = BatchNorm2d::new(3, DType::F64).unwrap();
        no_grad(|| {
            bn.store().get("weight").unwrap().copy_(&t(&[1.0, 2.0, -0.5], &[3])).unwrap();
            bn.store().get("bias").unwrap().copy_(&t(&[0.0, 0.1, 0.2], &[3])).unwrap();
        });
        bn
    };
    let x = t(&vals(24, 0.37), &[2, 3, 2, 2]);
    #[rustfmt::skip]
    let want = [-1.654054511292, -0.864376873643, -0.074699235994, 0.714978401655, 1.602955737127, 2.773679152255,
        -2.383832108984, -1.213108693856, 0.219775736344, -0.072905117438, -0.36558597122, 0.92379184409,
        -0.714978401655, 0.074699235994, 0.864376873643, 1.654054511292, 2.995167365928, -2.162343895311,
        -0.991620480183, 0.179102934945, -0.128277170856, -0.420958024638, 0.868419790671, 0.575738936889];
    // nn.BatchNorm2d's CPU kernel and F.batch_norm differ by ~1e-8 in f64; the formula
    // (x - mean) / sqrt(var + eps) * w + b in f64 is F.batch_norm's to the last digit.
    let close = |what: &str, got: &[f64], want: &[f64]| close_tol(what, got, want, 1e-7);
    let eager = make();
    close("eager", &eager.forward_eager(std::slice::from_ref(&x)).unwrap()[0].to_vec_f64().unwrap(), &want);
    let bn = Arc::new(make());
    let compiled = aot_module(bn.clone(), AotConfig::default().no_cache()).unwrap();
    let y = compiled.call(std::slice::from_ref(&x)).unwrap().remove(0);
    close("compiled", &y.to_vec_f64().unwrap(), &want);
    for m in [&eager, &*bn] {
        let s = m.store();
        close("running_mean", &s.get("running_mean").unwrap().to_vec_f64().unwrap(), &[-0.0225, 0.0005, -0.0015]);
        close("running_var", &s.get("running_var").unwrap().to_vec_f64().unwrap(), &[0.925088571429, 0.94566, 0.94566]);
        assert_eq!(s.get("num_batches_tracked").unwrap().to_vec_i64().unwrap(), vec![1]);
    }
    let ev = eager.clone().eval();
    let e = ev.forward_eager(std::slice::from_ref(&x)).unwrap()[0].to_vec_f64().unwrap();
    close(
        "eval",
        &e[..6],
        &[-1.01630195479, -0.631614769857, -0.246927584923, 0.13775960001, 1.086163221938, 1.847123371188],
    );
    let e = x.batch_norm(None, None, None, None, false, 0.1, 1e-5).unwrap_err().to_string();
    assert!(e.contains("must be defined in evaluation mode"), "{e}");
    let one = t(&[1.0, 2.0, 3.0], &[1, 3, 1, 1]);
    assert!(one
        .batch_norm(None, None, None, None, true, 0.1, 1e-5)
        .unwrap_err()
        .to_string()
        .contains("more than 1 value"));
}

#[test]
fn group_norm_matches_pytorch() {
    let x = t(&vals(24, 0.37), &[2, 3, 2, 2]);
    let (w, b) = (t(&[1.0, 2.0, -0.5], &[3]), t(&[0.0, 0.1, 0.2], &[3]));
    let y = x.group_norm(3, Some(&w), Some(&b), 1e-5).unwrap().to_vec_f64().unwrap();
    #[rustfmt::skip]
    close("group_norm", &y[..8], &[-1.341601587611, -0.447200529204, 0.447200529204, 1.341601587611, 1.455449576636,
        2.582452595412, -2.382452595412, -1.255449576636]);
    let x4 = t(&vals(24, 0.41), &[2, 4, 3]);
    #[rustfmt::skip]
    close("group_norm 2 groups", &x4.group_norm(2, None, None, 1e-5).unwrap().to_vec_f64().unwrap()[..8],
        &[-1.148757953472, -0.467807455751, 0.21314304197, 0.894093539691, 1.575044037411, -1.065715209848,
        -0.67021265651, 0.096635313264]);
    assert!(x.group_norm(2, None, None, 1e-5).unwrap_err().to_string().contains("divisible by num_groups=2"));
}

#[test]
fn max_pool_ties_go_to_the_first_maximum_and_nans_to_the_last_nan() {
    // torch: x = [[2, 2], [1, 2]] (one 2x2 window): max 2, gradient [1, 0, 0, 0].
    let x = t(&[2.0, 2.0, 1.0, 2.0, 0.5, f64::NAN, 3.0, f64::NAN], &[2, 1, 2, 2]);
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].max_pool2d([2, 2], None, [0, 0], [1, 1])?]) };
    let (out, grads) = compiled(f, std::slice::from_ref(&x), &t(&[1.0, 1.0], &[2, 1, 1, 1]));
    assert_eq!(out[0], 2.0);
    assert!(out[1].is_nan(), "a NaN in the window is the maximum, as in PyTorch");
    // PyTorch sends a NaN window's gradient to its last NaN (checked in PyTorch 2.15).
    assert_eq!(grads[0], vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn conv_transpose2d_matches_pytorch() {
    // x [2, 4, 3, 4], w [4, 3, 3, 2], groups 2, stride (2, 1), padding (1, 0),
    // output_padding (1, 0), dilation (1, 2): y [2, 6, 6, 6].
    let x = t(&vals(96, 0.37), &[2, 4, 3, 4]);
    let w = t(&vals(72, 0.53), &[4, 3, 3, 2]);
    let b = t(&[0.1, -0.2, 0.3, 0.0, 0.5, -0.4], &[6]);
    let opts = Conv2dOpts { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 2 };
    let f = move |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].conv_transpose2d(&a[1], Some(&a[2]), opts, [1, 0])?])
    };
    let y = f(&[x.clone(), w.clone(), b.clone()]).unwrap().remove(0);
    assert_eq!(y.sizes().unwrap(), vec![2, 6, 6, 6]);
    let yv = y.to_vec_f64().unwrap();
    close("y", &yv[..8], &[0.264, 0.1382, -0.6504, -0.5098, -0.03, 0.2364, 0.6272, -0.7044]);
    close("sum y", &[yv.iter().sum()], &[17.5248]);
    let g = t(&vals(432, 0.71), &[2, 6, 6, 6]);
    let (out, grads) = compiled(f, &[x, w, b], &g);
    close("compiled y", &out, &yv);
    close("dx", &grads[0][..8], &[0.039, 1.8172, 0.0554, 0.0936, 2.3946, 1.4085, -0.5776, 2.1363]);
    close("sum |dx|", &[sum_abs(&grads[0])], &[82.9034]);
    close("dw", &grads[1][..8], &[-1.796, 0.6256, 2.2556, 0.9188, 1.7452, -2.5516, 0.9728, -0.5256]);
    close("sum |dw|", &[sum_abs(&grads[1])], &[99.9784]);
    close("db", &grads[2], &[-4.44, -0.12, 2.2, -1.48, 0.84, -0.84]);
    let e = t(&vals(96, 0.37), &[2, 4, 3, 4])
        .conv_transpose2d(&t(&vals(72, 0.53), &[4, 3, 3, 2]), None, Conv2dOpts::default().stride(2), [2, 0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("output padding"), "{e}");
}

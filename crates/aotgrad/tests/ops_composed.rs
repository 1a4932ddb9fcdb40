//! Ops PyTorch users reach for, written as core-op decompositions: masked_fill,
//! tril/triu, stack, split/chunk. Values against hand-checked PyTorch results, the
//! compiled function against eager, and gradients against hand-derived ones.

use aotgrad::prelude::*;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).unwrap()
}

fn arange(n: usize, shape: &[usize]) -> Tensor {
    t(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), shape)
}

#[test]
fn masked_fill_values_errors_and_in_place() {
    let x = arange(6, &[2, 3]);
    let m = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    // torch.arange(6.).view(2, 3).masked_fill(torch.tensor([True, False, True]), -1.)
    assert_eq!(x.masked_fill(&m, -1.0).unwrap().to_vec_f64().unwrap(), vec![-1.0, 1.0, -1.0, -1.0, 4.0, -1.0]);
    let e = x.masked_fill(&t(&[1.0, 0.0, 1.0], &[3]), 0.0).unwrap_err().to_string();
    assert!(e.contains("only supports boolean masks"), "{e}");
    let v0 = x.version().unwrap();
    let same = x.masked_fill_(&m, 7.0).unwrap();
    assert!(same.same_object(&x));
    assert_eq!(x.to_vec_f64().unwrap(), vec![7.0, 1.0, 7.0, 7.0, 4.0, 7.0]);
    assert!(x.version().unwrap() > v0);
}

#[test]
fn tril_and_triu_match_pytorch() {
    let x = arange(12, &[3, 4]).add(1.0).unwrap();
    // torch.arange(1., 13.).view(3, 4).tril() / .tril(1) / .triu(-1)
    assert_eq!(
        x.tril(0).unwrap().to_vec_f64().unwrap(),
        vec![1.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0, 9.0, 10.0, 11.0, 0.0]
    );
    assert_eq!(
        x.tril(1).unwrap().to_vec_f64().unwrap(),
        vec![1.0, 2.0, 0.0, 0.0, 5.0, 6.0, 7.0, 0.0, 9.0, 10.0, 11.0, 12.0]
    );
    assert_eq!(
        x.triu(-1).unwrap().to_vec_f64().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 0.0, 10.0, 11.0, 12.0]
    );
    // Batched: the last two dims.
    let b = arange(8, &[2, 2, 2]).add(1.0).unwrap();
    assert_eq!(b.triu(0).unwrap().to_vec_f64().unwrap(), vec![1.0, 2.0, 0.0, 4.0, 5.0, 6.0, 0.0, 8.0]);
    assert!(arange(3, &[3]).tril(0).unwrap_err().to_string().contains("at least 2 dimensions"));
}

#[test]
fn stack_split_and_chunk() {
    let a = arange(3, &[3]);
    let b = arange(3, &[3]).add(10.0).unwrap();
    let s0 = Tensor::stack(&[&a, &b], 0).unwrap();
    assert_eq!(s0.sizes().unwrap(), vec![2, 3]);
    assert_eq!(s0.to_vec_f64().unwrap(), vec![0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
    let s1 = Tensor::stack(&[&a, &b], -1).unwrap();
    assert_eq!(s1.sizes().unwrap(), vec![3, 2]);
    assert_eq!(s1.to_vec_f64().unwrap(), vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
    let e = Tensor::stack(&[&a, &arange(4, &[4])], 0).unwrap_err().to_string();
    assert!(e.contains("expects each tensor to be equal size"), "{e}");

    let x = arange(10, &[5, 2]);
    let parts = x.split(2, 0).unwrap();
    assert_eq!(parts.iter().map(|p| p.sizes().unwrap()[0]).collect::<Vec<_>>(), vec![2, 2, 1]);
    assert!(parts.iter().all(|p| p.shares_storage_with(&x)), "split returns views");
    assert_eq!(parts[2].to_vec_f64().unwrap(), vec![8.0, 9.0]);
    // torch.arange(10.).view(5, 2).chunk(3): sizes 2, 2, 1; chunk(6) gives 5 pieces of 1.
    assert_eq!(x.chunk(3, 0).unwrap().iter().map(|p| p.sizes().unwrap()[0]).collect::<Vec<_>>(), vec![2, 2, 1]);
    assert_eq!(x.chunk(6, 0).unwrap().len(), 5);
    assert_eq!(x.chunk(2, 1).unwrap()[1].to_vec_f64().unwrap(), vec![1.0, 3.0, 5.0, 7.0, 9.0]);
    assert!(x.chunk(0, 0).unwrap_err().to_string().contains("greater than 0"));
}

#[test]
fn compiled_equals_eager_and_gradients_are_right() {
    let f = |a: &[Tensor]| {
        let (x, w) = (&a[0], &a[1]);
        let m = x.gt(4.0)?;
        let y = x.tril(0)?.add(&x.masked_fill(&m, 0.0)?)?;
        let s = Tensor::stack(&[&y, &x.mul(2.0)?], 0)?;
        let halves = s.chunk(2, 0)?;
        Ok(vec![halves[0].add(&halves[1])?.mul(w)?.sum_all()?])
    };
    let x = arange(9, &[3, 3]).requires_grad(true).unwrap();
    let w = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[3, 3]);
    let eager = f(&[x.clone(), w.clone()]).unwrap()[0].item().unwrap();
    let af = aot_function(f, AotConfig::default()).unwrap();
    let (outs, back) = af.forward(&[x.clone(), w.clone()]).unwrap();
    assert_eq!(outs[0].item().unwrap(), eager);
    let g = back.backward(&[outs[0].ones_like().unwrap()]).unwrap();
    // d/dx of sum(w * (tril(x) + masked_fill(x, x > 4, 0) + 2x)):
    // w * ([j <= i] + [x <= 4] + 2).
    let xs: Vec<f64> = (0..9).map(|i| i as f64).collect();
    let want: Vec<f64> = (0..9)
        .map(|k| {
            let (i, j) = (k / 3, k % 3);
            let tri = if j <= i { 1.0 } else { 0.0 };
            let keep = if xs[k] <= 4.0 { 1.0 } else { 0.0 };
            (k as f64 + 1.0) * (tri + keep + 2.0)
        })
        .collect();
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), want);
}

#[test]
fn var_std_and_argmax_over_everything() {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 6.0, 8.0], &[2, 3]);
    // torch.tensor([[1., 2, 3], [4, 6, 8]]).var() = 6.8 ; .var(1) = [1, 4]; .var(1, correction=0) = [2/3, 8/3]
    assert!((x.var(&[], 1, false).unwrap().item().unwrap() - 6.8).abs() < 1e-12);
    assert_eq!(x.var(&[1], 1, false).unwrap().to_vec_f64().unwrap(), vec![1.0, 4.0]);
    let v0 = x.var(&[-1], 0, true).unwrap();
    assert_eq!(v0.sizes().unwrap(), vec![2, 1]);
    let want = [2.0 / 3.0, 8.0 / 3.0];
    for (a, b) in v0.to_vec_f64().unwrap().iter().zip(want) {
        assert!((a - b).abs() < 1e-12);
    }
    assert_eq!(x.std(&[1], 1, false).unwrap().to_vec_f64().unwrap(), vec![1.0, 2.0]);
    assert!(Tensor::from_i64(&[1, 2], &[2]).unwrap().var(&[], 1, false).is_err());
    // A single element with correction 1: 0 / 0 = NaN, as in PyTorch.
    assert!(t(&[5.0], &[1]).var(&[], 1, false).unwrap().item().unwrap().is_nan());
    assert_eq!(x.argmax_all().unwrap().item().unwrap(), 5.0);
    assert_eq!(x.argmin_all().unwrap().item().unwrap(), 0.0);
}

#[test]
fn rsub_rdiv_any_all_one_hot() {
    let x = t(&[1.0, 2.0, 4.0], &[3]);
    // torch.rsub(x, 2) = 2 - x; 2 / x
    assert_eq!(x.rsub(2.0).unwrap().to_vec_f64().unwrap(), vec![1.0, 0.0, -2.0]);
    assert_eq!(x.rdiv(2.0).unwrap().to_vec_f64().unwrap(), vec![2.0, 1.0, 0.5]);
    let i = Tensor::from_i64(&[1, 2, 4], &[3]).unwrap();
    let r = i.rdiv(2).unwrap();
    assert_eq!((r.dtype(), r.to_vec_f64().unwrap()), (DType::F32, vec![2.0, 1.0, 0.5]));
    // torch.tensor([[0., 1.], [0., 0.]]).any(1) = [True, False]; .all(0) = [False, False]
    let m = t(&[0.0, 1.0, 0.0, 0.0], &[2, 2]);
    let b = |t: &Tensor| t.to(DType::I64).unwrap().to_vec_i64().unwrap();
    assert_eq!(b(&m.any(&[1], false).unwrap()), vec![1, 0]);
    assert_eq!(b(&m.all(&[0], false).unwrap()), vec![0, 0]);
    assert_eq!(m.any(&[], false).unwrap().dtype(), DType::Bool);
    assert_eq!(b(&m.any(&[], false).unwrap()), vec![1]);
    assert_eq!(b(&t(&[1.0, -2.0], &[2]).all(&[], true).unwrap()), vec![1]);
    assert_eq!(b(&t(&[], &[0]).all(&[], false).unwrap()), vec![1], "all of nothing is true");
    assert_eq!(b(&t(&[], &[0]).any(&[], false).unwrap()), vec![0]);
    // torch.nn.functional.one_hot(torch.tensor([0, 2]), 3) = [[1, 0, 0], [0, 0, 1]]
    let oh = Tensor::from_i64(&[0, 2], &[2]).unwrap().one_hot(3).unwrap();
    assert_eq!(oh.sizes().unwrap(), vec![2, 3]);
    assert_eq!(oh.to_vec_i64().unwrap(), vec![1, 0, 0, 0, 0, 1]);
    let e = Tensor::from_i64(&[0, 3], &[2]).unwrap().one_hot(3).unwrap_err().to_string();
    assert!(e.contains("class values must be in 0..3, got 3"), "{e}");
    assert!(t(&[0.0], &[1]).one_hot(2).is_err());
}

#[test]
fn clamp_with_tensor_bounds_values_and_gradients() {
    let lo = t(&[0.0, 0.0, 0.0, 0.0], &[4]);
    let hi = t(&[1.0], &[1]);
    let x = t(&[-0.5, 0.0, 0.5, 2.0], &[4]);
    // torch.clamp(x, min=lo, max=hi) = [0., 0., 0.5, 1.]
    assert_eq!(x.clamp_tensor(Some(&lo), Some(&hi)).unwrap().to_vec_f64().unwrap(), vec![0.0, 0.0, 0.5, 1.0]);
    assert_eq!(x.clamp_tensor(None, Some(&hi)).unwrap().to_vec_f64().unwrap(), vec![-0.5, 0.0, 0.5, 1.0]);
    // Compiled training path: d/dx is 1 inside [lo, hi] (inclusive), d/dlo where x < lo,
    // d/dhi (summed over the broadcast) where x > hi.
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].clamp_tensor(Some(&a[1]), Some(&a[2]))?.sum_all()?])
    };
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let args: Vec<Tensor> = [&x, &lo, &hi].iter().map(|t| t.requires_grad(true).unwrap()).collect();
    let (out, pending) = c.forward(&args).unwrap();
    assert_eq!(out[0].to_vec_f64().unwrap(), vec![1.5]);
    let g = pending.backward(&[out[0].ones_like().unwrap()]).unwrap();
    let g: Vec<Vec<f64>> = g.iter().map(|g| g.as_ref().unwrap().to_vec_f64().unwrap()).collect();
    assert_eq!(g, vec![vec![0.0, 1.0, 1.0, 0.0], vec![1.0, 0.0, 0.0, 0.0], vec![1.0]]);
}

#[test]
fn diagonal_is_a_view_with_offsets() {
    let x = arange(12, &[3, 4]);
    // torch.arange(12.).view(3, 4).diagonal() = [0, 5, 10]; offset 1: [1, 6, 11];
    // offset -1: [4, 9]; offset 4: []
    let d = x.diagonal(0, 0, 1).unwrap();
    assert_eq!(d.to_vec_f64().unwrap(), vec![0.0, 5.0, 10.0]);
    assert!(d.shares_storage_with(&x));
    assert_eq!(x.diagonal(1, 0, 1).unwrap().to_vec_f64().unwrap(), vec![1.0, 6.0, 11.0]);
    assert_eq!(x.diagonal(-1, 0, 1).unwrap().to_vec_f64().unwrap(), vec![4.0, 9.0]);
    assert_eq!(x.diagonal(4, 0, 1).unwrap().sizes().unwrap(), vec![0]);
    // A batch: dims (1, 2) of [2, 2, 2] -> [2, 2], the batch first.
    let b = arange(8, &[2, 2, 2]);
    assert_eq!(b.diagonal(0, 1, 2).unwrap().to_vec_f64().unwrap(), vec![0.0, 3.0, 4.0, 7.0]);
    assert_eq!(b.diagonal(0, -1, 0).unwrap().to_vec_f64().unwrap(), vec![0.0, 5.0, 2.0, 7.0]);
    assert!(x.diagonal(0, 1, 1).is_err());
    // Written through, compiled like eager: x.diagonal().mul_(10) changes x.
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        a[0].diagonal(0, 0, 1)?.mul_(10.0)?;
        Ok(vec![a[0].diagonal(1, 0, 1)?.sum_all()?])
    };
    let (e, c) = (arange(12, &[3, 4]), arange(12, &[3, 4]));
    let want = f(std::slice::from_ref(&e)).unwrap();
    let got = aot_function(f, AotConfig::default().no_cache()).unwrap().call(std::slice::from_ref(&c)).unwrap();
    assert_eq!(got[0].to_vec_f64().unwrap(), want[0].to_vec_f64().unwrap());
    assert_eq!(c.to_vec_f64().unwrap(), e.to_vec_f64().unwrap());
    assert_eq!(e.to_vec_f64().unwrap()[5], 50.0);
}

#[test]
fn the_gradient_of_a_diagonal_lands_on_the_diagonal() {
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].diagonal(1, 0, 1)?.mul(2.0)?.sum_all()?]) };
    let x = arange(6, &[2, 3]).requires_grad(true).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let (out, pending) = c.forward(std::slice::from_ref(&x)).unwrap();
    assert_eq!(out[0].to_vec_f64().unwrap(), vec![2.0 * (1.0 + 5.0)]);
    let g = pending.backward(&[out[0].ones_like().unwrap()]).unwrap();
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![0.0, 2.0, 0.0, 0.0, 0.0, 2.0]);
}

#[test]
fn std_ops_operators_on_tensors_and_scalars() {
    let a = t(&[1.0, 2.0], &[2]);
    let b = t(&[3.0, 5.0], &[2]);
    let v = |r: aotgrad::trace::Result<Tensor>| r.unwrap().to_vec_f64().unwrap();
    assert_eq!(v(&a + &b), vec![4.0, 7.0]);
    assert_eq!(v(&a - &b), vec![-2.0, -3.0]);
    assert_eq!(v(&a * &b), vec![3.0, 10.0]);
    assert_eq!(v(&b / &a), vec![3.0, 2.5]);
    assert_eq!(v(&a * 2.0), vec![2.0, 4.0]);
    assert_eq!(v(&a + 1), vec![2.0, 3.0]);
    assert_eq!(v(2.0 - &a), vec![1.0, 0.0]);
    assert_eq!(v(2.0 / &a), vec![2.0, 1.0]);
    assert_eq!(v(3 * &a), vec![3.0, 6.0]);
    assert_eq!(v(-&a), vec![-1.0, -2.0]);
    let chained = ((&a + &b).unwrap() * 2.0).unwrap();
    assert_eq!(chained.to_vec_f64().unwrap(), vec![8.0, 14.0]);
    // A shape error names the operator's line in this file.
    let c = t(&[1.0, 2.0, 3.0], &[3]);
    let line = line!() + 1;
    let e = (&a + &c).unwrap_err();
    let text = format!("{e:?}");
    assert!(text.contains("ops_composed.rs") && text.contains(&format!("line: {line}")), "{text}");
    // Inside a compiled function the operators trace like the methods.
    let f = |x: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![(1.0 - ((&x[0] * &x[1])? / 2.0)?)?]) };
    assert_eq!(v((&a + &b).unwrap() - &a), vec![3.0, 5.0]);
    assert_eq!(v(-(&a * 3).unwrap()), vec![-3.0, -6.0]);
    let got = aot_function(f, AotConfig::default().no_cache()).unwrap().call(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(got[0].to_vec_f64().unwrap(), vec![-0.5, -4.0]);
}

#[test]
fn max_and_min_over_a_dim_with_indices() {
    let x = t(&[1.0, 5.0, 5.0, -2.0, 0.0, 3.0], &[2, 3]);
    // torch.tensor([[1., 5., 5.], [-2., 0., 3.]]).max(1) = (values=[5., 3.], indices=[1, 2])
    let (v, i) = x.max_dim(1, false).unwrap();
    assert_eq!((v.to_vec_f64().unwrap(), i.to_vec_i64().unwrap()), (vec![5.0, 3.0], vec![1, 2]));
    let (v, i) = x.min_dim(0, true).unwrap();
    assert_eq!(v.sizes().unwrap(), vec![1, 3]);
    assert_eq!((v.to_vec_f64().unwrap(), i.to_vec_i64().unwrap()), (vec![-2.0, 0.0, 3.0], vec![1, 1, 1]));
    // The gradient goes to the first maximum only (PyTorch's max(dim) backward).
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].max_dim(1, false)?.0.sum_all()?]) };
    let xr = x.requires_grad(true).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let (out, pending) = c.forward(std::slice::from_ref(&xr)).unwrap();
    assert_eq!(out[0].to_vec_f64().unwrap(), vec![8.0]);
    let g = pending.backward(&[out[0].ones_like().unwrap()]).unwrap();
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn cumsum_values_dtypes_and_gradient() {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    assert_eq!(x.cumsum(0).unwrap().to_vec_f64().unwrap(), vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    assert_eq!(x.cumsum(-1).unwrap().to_vec_f64().unwrap(), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    // torch.arange(6.).view(2, 3).t().cumsum(0) = [[0, 3], [1, 7], [3, 12]], contiguous.
    let c = arange(6, &[2, 3]).t().unwrap().cumsum(0).unwrap();
    assert_eq!(c.to_vec_f64().unwrap(), vec![0.0, 3.0, 1.0, 7.0, 3.0, 12.0]);
    assert_eq!(c.sizes().unwrap(), vec![3, 2]);
    // Integers and bools accumulate in i64, as PyTorch; f32 stays f32; a 0-d tensor is itself.
    let b = Tensor::from_vec(vec![true, false, true], &[3]).unwrap().cumsum(0).unwrap();
    assert_eq!((b.dtype(), b.to_vec_i64().unwrap()), (DType::I64, vec![1, 1, 2]));
    let i = Tensor::from_i64(&[1, 2, 3], &[3]).unwrap().to(DType::I32).unwrap().cumsum(0).unwrap();
    assert_eq!((i.dtype(), i.to_vec_i64().unwrap()), (DType::I64, vec![1, 3, 6]));
    assert_eq!(Tensor::from_f64(&[1.5, 2.0], &[2], DType::F32).unwrap().cumsum(0).unwrap().dtype(), DType::F32);
    assert_eq!(t(&[5.0], &[]).cumsum(0).unwrap().to_vec_f64().unwrap(), vec![5.0]);
    assert!(x.cumsum(2).unwrap_err().to_string().contains("out of range"));
    // x.requires_grad_(); (w * x.cumsum(1)).sum().backward(): x.grad[i, j] = sum of w[i, j..].
    let w = t(&[1.0, -1.0, 2.0, 0.5, 3.0, 1.0], &[2, 3]);
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].cumsum(1)?.mul(&a[1])?.sum_all()?]) };
    let xr = x.requires_grad(true).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let (out, pending) = c.forward(&[xr.clone(), w.clone()]).unwrap();
    assert_eq!(out[0].item().unwrap(), f(&[x.clone(), w.clone()]).unwrap()[0].item().unwrap());
    let g = pending.backward(&[out[0].ones_like().unwrap()]).unwrap();
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![2.0, 1.0, 2.0, 4.5, 4.0, 1.0]);
}

#[test]
fn sort_argsort_and_topk_match_pytorch() {
    let nan = f64::NAN;
    let x = t(&[3.0, 1.0, nan, 2.0, 1.0], &[5]);
    // torch.sort(x, stable=True): NaN last ascending, first descending; ties keep order.
    let (v, i) = x.sort(0, false).unwrap();
    let v = v.to_vec_f64().unwrap();
    assert_eq!(&v[..4], &[1.0, 1.0, 2.0, 3.0]);
    assert!(v[4].is_nan());
    assert_eq!(i.to_vec_i64().unwrap(), vec![1, 4, 3, 0, 2]);
    let (v, i) = x.sort(-1, true).unwrap();
    assert!(v.to_vec_f64().unwrap()[0].is_nan());
    assert_eq!(i.to_vec_i64().unwrap(), vec![2, 0, 3, 1, 4]);
    assert_eq!(x.argsort(0, true).unwrap().to_vec_i64().unwrap(), vec![2, 0, 3, 1, 4]);
    // -0.0 and 0.0 are equal: stable order.
    assert_eq!(t(&[-0.0, 0.0, -0.0], &[3]).argsort(0, false).unwrap().to_vec_i64().unwrap(), vec![0, 1, 2]);
    assert_eq!(t(&[5.0], &[]).argsort(0, false).unwrap().to_vec_i64().unwrap(), vec![0]);
    // Integers sort exactly.
    let n = Tensor::from_i64(&[5, -3, 9, 0], &[2, 2]).unwrap();
    assert_eq!(n.sort(1, false).unwrap().0.to_vec_i64().unwrap(), vec![-3, 5, 0, 9]);
    let y = t(&[1.0, 5.0, 2.0, 4.0, 3.0, 0.0, 7.0, 6.0], &[2, 4]);
    let (v, i) = y.topk(2, 1, true).unwrap();
    assert_eq!((v.to_vec_f64().unwrap(), i.to_vec_i64().unwrap()), (vec![5.0, 4.0, 7.0, 6.0], vec![1, 3, 2, 3]));
    assert_eq!(i.sizes().unwrap(), vec![2, 2]);
    let (v, i) = y.topk(2, 1, false).unwrap();
    assert_eq!((v.to_vec_f64().unwrap(), i.to_vec_i64().unwrap()), (vec![1.0, 2.0, 0.0, 3.0], vec![0, 2, 1, 0]));
    let e = y.topk(5, 1, true).unwrap_err().to_string();
    assert!(e.contains("k (5) is larger than the size 4"), "{e}");
}

#[test]
fn sort_and_topk_gradients_go_back_to_their_elements_compiled_as_eager() {
    let x = t(&[0.3, -1.2, 0.7, 2.0, 1.5, 0.1, -0.4, 0.9], &[2, 4]);
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        let (v, i) = a[0].sort(1, true)?;
        let (k, ki) = a[0].topk(2, 1, true)?;
        Ok(vec![v.mul(&a[1])?.sum_all()?.add(&k.mul(&a[2])?.sum_all()?)?, i, ki])
    };
    let (wv, wk) = (t(&[1.0, 2.0, 3.0, 4.0], &[4]), t(&[1.0, 10.0], &[2]));
    let eager = f(&[x.clone(), wv.clone(), wk.clone()]).unwrap();
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let xr = x.requires_grad(true).unwrap();
    let (out, pending) = c.forward(&[xr, wv, wk]).unwrap();
    assert!((out[0].item().unwrap() - eager[0].item().unwrap()).abs() < 1e-12);
    // torch: x.sort(1, descending=True).indices = [[3, 2, 0, 1], [0, 3, 1, 2]]; topk(2).indices = [[3, 2], [0, 3]].
    assert_eq!(out[1].to_vec_i64().unwrap(), vec![3, 2, 0, 1, 0, 3, 1, 2]);
    assert_eq!(out[2].to_vec_i64().unwrap(), eager[2].to_vec_i64().unwrap());
    assert_eq!(out[2].to_vec_i64().unwrap(), vec![3, 2, 0, 3]);
    let ones = out[0].ones_like().unwrap();
    let g = pending.backward(&[ones, out[1].zeros_like().unwrap(), out[2].zeros_like().unwrap()]).unwrap();
    // PyTorch: sort part [[3, 4, 2, 1], [1, 3, 4, 2]] plus topk part [[0, 0, 10, 1], [1, 0, 0, 10]].
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64().unwrap(), vec![3.0, 4.0, 12.0, 2.0, 2.0, 3.0, 4.0, 12.0]);
}

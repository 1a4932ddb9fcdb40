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

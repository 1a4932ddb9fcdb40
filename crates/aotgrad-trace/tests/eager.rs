//! Eager semantics through the `Tensor` API: in-place ops through views, metadata
//! in-place ops, detach, grad mode, requires_grad propagation, `contiguous`/`reshape`
//! identity rules. Expected values are derived by hand.

use aotgrad_trace::{is_grad_enabled, no_grad, trace, DType, Dim, Error, NoGradGuard, Result, Tensor, TraceConfig};

fn arange(n: usize, shape: &[usize]) -> Result<Tensor> {
    let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
    Tensor::from_f64(&data, shape, DType::F32)
}

fn dims(v: &[i64]) -> Vec<Dim> {
    v.iter().map(|&d| Dim::Const(d)).collect()
}

#[test]
fn tensor_handles_are_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Tensor>();
}

#[test]
fn in_place_through_a_strided_view_is_seen_by_every_view() -> Result<()> {
    let x = arange(12, &[3, 4])?;
    let flat = x.view(&[-1])?;
    let col = x.select(1, -1)?; // x[:, 3]
    let b = x.slice(0, Some(0), None, 2)?; // rows 0 and 2
    assert_eq!(b.shape(), dims(&[2, 4]));
    assert_eq!(b.strides(), dims(&[8, 1]));
    let v0 = x.storage_version()?;
    let r = b.mul_(2.0)?;
    assert!(r.same_object(&b), "in-place ops return the same handle");
    assert!(x.storage_version()? > v0);
    let want = vec![0., 2., 4., 6., 4., 5., 6., 7., 16., 18., 20., 22.];
    assert_eq!(x.to_vec_f64()?, want);
    assert_eq!(flat.to_vec_f64()?, want);
    assert_eq!(col.to_vec_f64()?, vec![6., 7., 22.]);
    assert_eq!(b.to_vec_f64()?, vec![0., 2., 4., 6., 16., 18., 20., 22.]);
    // A tensor operand broadcast into a view; a scalar subtraction through a column view.
    b.add_(&Tensor::from_f64(&[1., 0., 0., 1.], &[4], DType::F32)?)?;
    col.sub_(1)?;
    assert_eq!(x.to_vec_f64()?, vec![1., 2., 4., 6., 4., 5., 6., 6., 17., 18., 20., 22.]);
    Ok(())
}

#[test]
fn metadata_in_place_changes_that_object_only() -> Result<()> {
    let x = arange(6, &[2, 3])?;
    let same = x.clone(); // another handle to the same tensor object
    let other = x.alias()?; // another tensor object on the same storage
    let r = x.t_()?;
    assert!(r.same_object(&x));
    assert_eq!(x.shape(), dims(&[3, 2]));
    assert_eq!(x.strides(), dims(&[1, 3]));
    assert_eq!(same.shape(), dims(&[3, 2]));
    assert_eq!(other.shape(), dims(&[2, 3]));
    assert!(x.shares_storage_with(&other));
    assert_eq!(x.to_vec_f64()?, vec![0., 3., 1., 4., 2., 5.]);
    x.unsqueeze_(0)?;
    assert_eq!(x.shape(), dims(&[1, 3, 2]));
    x.squeeze_()?;
    assert_eq!(x.shape(), dims(&[3, 2]));
    x.transpose_(0, -1)?;
    assert_eq!(x.shape(), dims(&[2, 3]));
    assert_eq!(x.to_vec_f64()?, vec![0., 1., 2., 3., 4., 5.]);
    Ok(())
}

#[test]
fn detach_shares_storage_without_grad() -> Result<()> {
    let w = arange(4, &[4])?.requires_grad(true)?;
    let d = w.detach()?;
    assert!(d.shares_storage_with(&w));
    assert!(!d.is_requires_grad());
    assert!(d.is_leaf());
    assert!(!d.is_view());
    d.mul_(3.0)?; // allowed: detached from autograd
    assert_eq!(w.to_vec_f64()?, vec![0., 3., 6., 9.]);
    assert!(w.is_requires_grad());
    Ok(())
}

#[test]
fn grad_mode_and_requires_grad_propagation() -> Result<()> {
    let w = arange(3, &[3])?.requires_grad(true)?;
    let x = arange(3, &[3])?;
    assert!(w.is_leaf() && w.is_requires_grad());
    let y = x.mul(&w)?;
    assert!(y.is_requires_grad());
    assert!(!y.is_leaf());
    assert!(!x.add(1)?.is_requires_grad());
    // Non-float results never require grad.
    assert!(!w.gt(1.0)?.is_requires_grad());
    assert!(!w.argmax(0, false)?.is_requires_grad());
    // Creation ops do not inherit requires_grad.
    assert!(!w.zeros_like()?.is_requires_grad());
    // Views of a tensor that requires grad require grad.
    let v = w.view(&[3, 1])?;
    assert!(v.is_requires_grad() && !v.is_leaf() && v.is_view());
    no_grad(|| -> Result<()> {
        assert!(!is_grad_enabled());
        let z = w.mul(2)?;
        assert!(!z.is_requires_grad());
        assert!(z.is_leaf());
        Ok(())
    })?;
    assert!(is_grad_enabled());
    // requires_grad only for floating dtypes; non-leaves cannot stop requiring grad.
    let i = Tensor::from_i64(&[1, 2], &[2])?;
    let e = i.requires_grad(true).unwrap_err();
    assert!(matches!(e, Error::Autograd { .. }), "{e}");
    assert!(e.to_string().contains("floating point"), "{e}");
    assert!(y.set_requires_grad(false).is_err());
    // An in-place op with a grad-requiring operand makes its target a non-leaf that requires grad.
    let t = arange(3, &[3])?;
    t.mul_(&w)?;
    assert!(t.is_requires_grad() && !t.is_leaf());
    assert_eq!(t.to_vec_f64()?, vec![0., 1., 4.]);
    Ok(())
}

#[test]
fn views_taken_before_their_base_is_mutated_with_grad_follow_the_base() -> Result<()> {
    let w = arange(3, &[3])?.requires_grad(true)?;
    let b = arange(6, &[2, 3])?;
    let v = b.select(0, 1)?; // created in grad mode, before b requires grad
    let u = no_grad(|| b.select(0, 0))?; // created in no-grad mode: not a differentiable view
    assert!(!v.is_requires_grad() && v.is_leaf());
    b.select(0, 0)?.mul_(&w)?;
    // PyTorch: the base and every differentiable view of it now require grad.
    assert!(b.is_requires_grad() && !b.is_leaf());
    assert!(v.is_requires_grad() && !v.is_leaf(), "{v:?}");
    assert_eq!(format!("{v:?}"), "Tensor(eager f32[3] offset=3, requires_grad, non-leaf)");
    assert!(!u.is_requires_grad() && u.is_leaf());
    // Ops on the view see it as requiring grad.
    assert!(v.mul(2.0)?.is_requires_grad());
    assert!(v.unsqueeze(0)?.is_requires_grad());
    // It is no longer a leaf whose flag may be turned off.
    assert!(v.set_requires_grad(false).is_err());
    // A base that starts requiring grad (a leaf) makes its views require grad, leaves still.
    let c = arange(3, &[3])?;
    let cv = c.view(&[3, 1])?;
    c.set_requires_grad(true)?;
    assert!(cv.is_requires_grad() && cv.is_leaf());
    // ... and in-place ops on such a view are rejected like PyTorch's.
    let e = cv.add_(1.0).unwrap_err();
    assert!(e.to_string().contains("a view of a leaf Variable that requires grad"), "{e}");
    // The same while tracing: the recorded flags include the base's.
    let traced = trace(
        |a| {
            let b = a[0].clone_tensor()?;
            let v = b.select(0, 1)?;
            b.select(0, 0)?.mul_(&a[1])?;
            Ok(vec![v.clone(), v.mul(2.0)?])
        },
        &[arange(6, &[2, 3])?, w.clone()],
        &TraceConfig::default(),
    )?;
    assert_eq!(traced.output_requires_grad, vec![true, true]);
    let mul = traced.graph.nodes.last().expect("nodes").out;
    assert!(traced.value_requires_grad[mul.0 as usize]);
    // An example input that is such a view is an input requiring grad.
    let traced = trace(|a| Ok(vec![a[0].mul(2.0)?]), &[v.clone(), u], &TraceConfig::default())?;
    assert_eq!(traced.input_requires_grad, vec![true, false]);
    assert_eq!(traced.output_requires_grad, vec![true]);
    Ok(())
}

#[test]
fn decomposed_composites_return_fresh_tensors_not_views_of_intermediates() -> Result<()> {
    // PyTorch: matmul/linear/embedding reshape their `mm`/`bmm`/`index_select` result
    // with `_unsafe_view`, so the result has no `_base`.
    let x3 = arange(12, &[2, 2, 3])?;
    let w = arange(6, &[3, 2])?;
    let m = x3.matmul(&w)?;
    assert!(!m.is_view() && m.is_contiguous(), "{m:?}");
    // x3[0][1] = [3, 4, 5]; w columns [0, 2, 4] and [1, 3, 5]: 3*0+4*2+5*4 = 28, 3+12+25 = 40.
    assert_eq!(m.to_vec_f64()?[2..4], [28., 40.]);
    assert!(!x3.linear(&w.t()?, None)?.is_view());
    assert!(!arange(3, &[3])?.matmul(&arange(3, &[3])?)?.is_view());
    assert!(!arange(3, &[3])?.matmul(&arange(12, &[2, 3, 2])?)?.is_view());
    let idx = Tensor::from_i64(&[2, 0, 1, 2], &[2, 2])?;
    let e = Tensor::embedding(&idx, &w)?;
    assert!(!e.is_view());
    assert_eq!(e.to_vec_f64()?, vec![4., 5., 0., 1., 2., 3., 4., 5.]);
    // The traced graphs end in `_unsafe_view` (a fresh storage), not in `view`.
    let t = trace(|a| Ok(vec![a[0].matmul(&a[1])?]), &[x3, w], &TraceConfig::default())?;
    let last = t.graph.nodes.last().expect("nodes");
    assert_eq!(last.op.name(), "_unsafe_view");
    assert_eq!(t.graph.storage_of(last.out), Some(last.storage));
    assert!(t.graph.nodes.iter().all(|n| n.storage != last.storage || n.out == last.out));
    Ok(())
}

#[test]
fn in_place_on_a_leaf_that_requires_grad_is_an_error() -> Result<()> {
    let w = arange(4, &[2, 2])?.requires_grad(true)?;
    let (e, line) = (w.mul_(2.0).unwrap_err(), line!());
    assert!(matches!(e, Error::Autograd { .. }));
    let msg = e.to_string();
    assert!(msg.contains("a leaf Variable that requires grad is being used in an in-place operation."), "{msg}");
    assert!(msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    assert!(msg.contains("mul_"), "{msg}");
    let e = w.select(0, 0)?.add_(1.0).unwrap_err();
    assert!(e.to_string().contains("a view of a leaf Variable that requires grad"), "{e}");
    assert!(w.t_().is_err(), "metadata mutation of a leaf that requires grad");
    assert_eq!(w.to_vec_f64()?, vec![0., 1., 2., 3.], "a rejected op changes nothing");
    // Allowed without grad mode.
    {
        let _g = NoGradGuard::new();
        w.mul_(2.0)?;
    }
    assert_eq!(w.to_vec_f64()?, vec![0., 2., 4., 6.]);
    assert!(w.is_leaf() && w.is_requires_grad());
    Ok(())
}

#[test]
fn contiguous_reshape_and_to_follow_pytorch_identity_rules() -> Result<()> {
    let x = arange(6, &[2, 3])?;
    assert!(x.contiguous()?.same_object(&x));
    assert!(x.to(DType::F32)?.same_object(&x));
    let xt = x.t()?;
    assert!(!xt.is_contiguous());
    let c = xt.contiguous()?;
    assert!(!c.same_object(&xt) && !c.shares_storage_with(&x));
    assert!(c.is_contiguous());
    assert_eq!(c.to_vec_f64()?, vec![0., 3., 1., 4., 2., 5.]);
    // reshape: a view when strides allow, else a copy.
    let r = x.reshape(&[3, -1])?;
    assert!(r.shares_storage_with(&x));
    assert_eq!(r.shape(), dims(&[3, 2]));
    assert!(r.is_view());
    let r = xt.reshape(&[-1])?;
    assert!(!r.shares_storage_with(&x));
    assert_eq!(r.to_vec_f64()?, vec![0., 3., 1., 4., 2., 5.]);
    // The copy is a fresh tensor (`_unsafe_view` of a clone), not a view of the clone.
    assert!(!r.is_view() && r.is_contiguous());
    assert!(!xt.flatten()?.is_view());
    assert!(x.flatten()?.is_view());
    // clone_tensor always copies.
    let k = x.clone_tensor()?;
    k.fill_(7)?;
    assert_eq!(x.to_vec_f64()?, vec![0., 1., 2., 3., 4., 5.]);
    assert_eq!(k.to_vec_f64()?, vec![7.; 6]);
    Ok(())
}

#[test]
fn pointwise_reductions_and_views_compute_values() -> Result<()> {
    let x = Tensor::from_f64(&[1., -2., 3., -4., 5., -6.], &[2, 3], DType::F64)?;
    assert_eq!(x.abs()?.sum(&[-1], false)?.to_vec_f64()?, vec![6., 15.]);
    assert_eq!(x.relu()?.sum_all()?.item()?, 9.0);
    assert_eq!(x.amax(&[0], true)?.to_vec_f64()?, vec![1., 5., 3.]);
    assert_eq!(x.amax(&[0], true)?.shape(), dims(&[1, 3]));
    assert_eq!(x.argmin(1, false)?.to_vec_i64()?, vec![1, 2]);
    assert_eq!(x.mean(&[0, 1], false)?.item()?, -0.5);
    assert_eq!(x.clamp(Some(-1.0), Some(2.0))?.to_vec_f64()?, vec![1., -1., 2., -1., 2., -1.]);
    let m = Tensor::where_(&x.gt(0)?, &x, &x.neg()?)?;
    assert_eq!(m.to_vec_f64()?, vec![1., 2., 3., 4., 5., 6.]);
    let i = Tensor::from_i64(&[1, 2, 3], &[3])?;
    assert_eq!(i.div(2)?.dtype(), DType::F32, "true division promotes ints");
    assert_eq!(i.mul(2)?.dtype(), DType::I64);
    assert_eq!(i.add(0.5)?.to_vec_f64()?, vec![1.5, 2.5, 3.5]);
    // mm: [[1,-2,3],[-4,5,-6]] @ ones(3, 1) = row sums.
    let ones = Tensor::ones(&[3, 1], DType::F64)?;
    assert_eq!(x.mm(&ones)?.to_vec_f64()?, vec![2., -5.]);
    assert_eq!(x.narrow(1, -2, 2)?.to_vec_f64()?, vec![-2., 3., 5., -6.]);
    assert_eq!(x.permute(&[1, 0])?.to_vec_f64()?, vec![1., -4., -2., 5., 3., -6.]);
    assert_eq!(x.select(0, 1)?.unsqueeze(0)?.expand(&[2, -1])?.to_vec_f64()?, vec![-4., 5., -6., -4., 5., -6.]);
    let row = Tensor::from_f64(&[9., 8., 7.], &[3], DType::F64)?;
    x.copy_(&row)?;
    assert_eq!(x.to_vec_f64()?, vec![9., 8., 7., 9., 8., 7.]);
    let cat = Tensor::cat(&[&row, &row.neg()?], 0)?;
    assert_eq!(cat.to_vec_f64()?, vec![9., 8., 7., -9., -8., -7.]);
    let idx = Tensor::from_i64(&[2, 0], &[2])?;
    assert_eq!(row.index_select(0, &idx)?.to_vec_f64()?, vec![7., 9.]);
    Ok(())
}

#[test]
fn creation_ops_are_eager_outside_a_trace() -> Result<()> {
    let z = Tensor::zeros(&[2, 2], DType::F32)?;
    assert!(!z.is_fake());
    assert_eq!(z.to_vec_f64()?, vec![0.; 4]);
    assert_eq!(Tensor::arange(0, 5, 2, DType::I64)?.to_vec_i64()?, vec![0, 2, 4]);
    let a = Tensor::rand(&[16], DType::F32, 3)?;
    let b = Tensor::rand(&[16], DType::F32, 3)?;
    assert_eq!(a.to_vec_f64()?, b.to_vec_f64()?, "same seed, same values");
    assert!(a.to_vec_f64()?.iter().all(|v| (0.0..1.0).contains(v)));
    assert_eq!(a.full_like(2.5)?.to_vec_f64()?, vec![2.5; 16]);
    assert!(a.item().is_err());
    Ok(())
}

#[test]
fn gathers_and_scatters_compute_values() -> Result<()> {
    // x = [[0, 1, 2], [3, 4, 5]]
    let x = arange(6, &[2, 3])?;
    let idx = Tensor::from_i64(&[2, 0, 1, 1], &[2, 2])?;
    assert_eq!(x.gather(1, &idx)?.to_vec_f64()?, vec![2., 0., 4., 4.]);
    let src = Tensor::ones(&[2, 2], DType::F32)?;
    // out[i][idx[i][j]] += 1
    assert_eq!(x.scatter_add(1, &idx, &src)?.to_vec_f64()?, vec![1., 1., 3., 3., 6., 5.]);
    let col = Tensor::from_f64(&[9., 8.], &[2, 1], DType::F32)?;
    assert_eq!(x.slice_scatter(&col, 1, Some(-1), None, 1)?.to_vec_f64()?, vec![0., 1., 9., 3., 4., 8.]);
    let row = Tensor::from_f64(&[7., 7., 7.], &[3], DType::F32)?;
    assert_eq!(x.select_scatter(&row, 0, -2)?.to_vec_f64()?, vec![7., 7., 7., 3., 4., 5.]);
    // as_strided view [[s1, s3], [s2, s4]] of the storage replaced by src values 10..13.
    let src = Tensor::from_f64(&[10., 11., 12., 13.], &[2, 2], DType::F32)?;
    let out = x.as_strided_scatter(&src, &[2, 2], &[1, 2], 1)?;
    assert_eq!(out.to_vec_f64()?, vec![0., 10., 12., 11., 13., 5.]);
    assert_eq!(x.to_vec_f64()?, vec![0., 1., 2., 3., 4., 5.], "scatters are out of place");
    let v = x.as_strided(&[2, 2], &[1, 2], 1)?;
    assert!(v.shares_storage_with(&x));
    assert_eq!(v.to_vec_f64()?, vec![1., 3., 2., 4.]);
    Ok(())
}

#[test]
fn bernoulli_and_debug() -> Result<()> {
    let x = Tensor::zeros(&[64], DType::F32)?;
    let b = x.bernoulli(0.5, 7)?;
    let v = b.to_vec_f64()?;
    assert!(v.iter().all(|&e| e == 0.0 || e == 1.0));
    assert!(v.contains(&0.0) && v.contains(&1.0), "64 draws at p = 0.5");
    assert_eq!(b.to_vec_f64()?, x.bernoulli(0.5, 7)?.to_vec_f64()?);
    assert_eq!(x.bernoulli(1.0, 1)?.to_vec_f64()?, vec![1.0; 64]);
    let w = arange(6, &[2, 3])?.requires_grad(true)?;
    assert_eq!(format!("{w:?}"), "Tensor(eager f32[2, 3], requires_grad)");
    assert_eq!(format!("{:?}", w.t()?), "Tensor(eager f32[3, 2] strides=[1, 3], requires_grad, non-leaf)");
    let dbg = std::sync::Mutex::new(String::new());
    aotgrad_trace::trace(
        |a| {
            *dbg.lock().unwrap() = format!("{:?}", a[0].mul(2)?);
            Ok(vec![])
        },
        &[w],
        &aotgrad_trace::TraceConfig::default(),
    )?;
    assert_eq!(dbg.into_inner().unwrap(), "Tensor(fake %1 #1 f32[2, 3], requires_grad, non-leaf)");
    Ok(())
}

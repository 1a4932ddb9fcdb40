//! Rejections are values, never panics, and name the op, the shapes and the caller's
//! line in this file, in eager mode and while tracing alike.

use aotgrad_trace::{trace, DType, Error, Result, Tensor, TraceConfig};

fn t(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
    Tensor::from_f64(&data, shape, dtype).expect("valid data")
}

/// Assert `e` is a shape error of `kind` whose message names every fragment and `line` of this file.
fn check(e: &Error, kind: &str, line: u32, fragments: &[&str]) {
    let msg = e.to_string();
    assert_eq!(e.shape_error().map(|s| s.kind()), Some(kind), "{msg}");
    assert!(msg.starts_with(&format!("{}:{line}:", file!())), "location missing in: {msg}");
    for f in fragments {
        assert!(msg.contains(f), "`{f}` missing in: {msg}");
    }
}

/// Run `f` eagerly on `inputs`, then traced over fake copies of them; return both errors.
fn both(inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) -> (Error, Error) {
    let eager = f(inputs).expect_err("eager accepted");
    let fake = trace(|a| Ok(vec![f(a)?]), inputs, &TraceConfig::default()).expect_err("trace accepted");
    (eager, fake)
}

#[test]
fn mismatched_broadcast() {
    let (a, b) = (t(&[2, 3], DType::F32), t(&[4], DType::F32));
    let line = line!() + 1;
    let (e, f) = both(&[a, b], |x| x[0].add(&x[1]));
    for e in [&e, &f] {
        check(e, "broadcast", line, &["add", "[2, 3]", "[4]"]);
    }
}

#[test]
fn matmul_inner_dimension_mismatch() {
    let a = t(&[4, 3], DType::F32);
    let (e, line) = (a.mm(&a).unwrap_err(), line!());
    check(&e, "matmul", line, &["mm: inner dimensions do not match: [4, 3] @ [4, 3]"]);
    assert_eq!(e.to_string(), format!("{}:{line}:24: mm: inner dimensions do not match: [4, 3] @ [4, 3]", file!()));
    let line = line!() + 1;
    let (_, f) = both(&[a.clone(), a], |x| x[0].mm(&x[1]));
    check(&f, "matmul", line, &["mm", "[4, 3] @ [4, 3]"]);
}

#[test]
fn view_of_incompatible_size() {
    let a = t(&[2, 3], DType::F32);
    let line = line!() + 1;
    let (e, f) = both(std::slice::from_ref(&a), |x| x[0].view(&[4, -1]));
    for e in [&e, &f] {
        check(e, "view", line, &["view", "[2, 3]", "[4, -1]"]);
    }
    // A size that matches but cannot be expressed with strides is a view error too.
    let (e, line) = (a.t().and_then(|x| x.view(&[6])).unwrap_err(), line!());
    check(&e, "view", line, &["view", "[3, 2]", "[6]", "reshape"]);
}

#[test]
fn in_place_result_shape_differs_from_target() {
    let (x, bigger) = (t(&[3], DType::F32), t(&[2, 3], DType::F32));
    let line = line!() + 1;
    let (e, f) = both(&[x.clone(), bigger], |a| a[0].add_(&a[1]));
    for e in [&e, &f] {
        check(e, "inplace", line, &["add_", "[2, 3]", "[3]"]);
    }
    assert_eq!(x.to_vec_f64().unwrap(), vec![0., 1., 2.], "a rejected in-place op writes nothing");
    // Writing a float result into an integer tensor is rejected like PyTorch.
    let i = t(&[3], DType::I64);
    let (e, line) = (i.mul_(0.5).unwrap_err(), line!());
    check(&e, "inplace", line, &["mul_", "f32", "i64"]);
}

#[test]
fn wrong_dtype_for_an_index() {
    let (x, idx) = (t(&[4, 2], DType::F32), t(&[2], DType::F32));
    let line = line!() + 1;
    let (e, f) = both(&[x, idx], |a| a[0].index_select(0, &a[1]));
    for e in [&e, &f] {
        check(e, "dtype", line, &["index_select", "f32"]);
    }
}

#[test]
fn dim_out_of_range_is_a_located_error() {
    let x = t(&[2, 3], DType::F32);
    let (e, line) = (x.sum(&[2], false).unwrap_err(), line!());
    check(&e, "dim", line, &["sum", "dimension 2", "rank 2"]);
    let (e, line) = (x.select(1, -4).unwrap_err(), line!());
    check(&e, "index", line, &["select", "-4", "size 3"]);
}

#[test]
fn mixing_modes_is_an_error_not_a_panic() {
    let x = t(&[2], DType::F32);
    let captured = t(&[2], DType::F32);
    let line = line!() + 1;
    let e = trace(|a| Ok(vec![a[0].mul(&captured)?]), std::slice::from_ref(&x), &TraceConfig::default()).unwrap_err();
    assert!(matches!(e, Error::Mode { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("eager tensor used while tracing: pass it as an input"), "{msg}");
    assert!(msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    // A fake tensor that escaped its trace cannot be used afterwards.
    let escaped = std::sync::Mutex::new(None);
    trace(
        |a| {
            *escaped.lock().unwrap() = Some(a[0].clone());
            Ok(vec![a[0].clone()])
        },
        &[x],
        &TraceConfig::default(),
    )
    .unwrap();
    let fake = escaped.lock().unwrap().take().unwrap();
    assert!(fake.is_fake());
    let e = fake.mul(2).unwrap_err();
    assert!(e.to_string().contains("fake tensor used outside of the trace"), "{e}");
    assert!(fake.to_vec_f64().is_err());
    assert!(fake.item().is_err());
}

#[test]
fn active_trace_is_restored_after_an_error() {
    let x = t(&[2], DType::F32);
    let r = trace(|a| Ok(vec![a[0].view(&[3])?]), std::slice::from_ref(&x), &TraceConfig::default());
    assert!(r.is_err());
    assert!(!aotgrad_trace::is_tracing());
    // Creation ops are eager again.
    assert!(!Tensor::zeros(&[1], DType::F32).unwrap().is_fake());
    assert_eq!(x.mul(2).unwrap().to_vec_f64().unwrap(), vec![0., 2.]);
}

#[test]
fn trace_configuration_errors() {
    let x = t(&[2, 3], DType::F32);
    let cfg = TraceConfig { dynamic: vec![(1, 0)], ..TraceConfig::default() };
    let (e, line) = (trace(|a| Ok(a.to_vec()), std::slice::from_ref(&x), &cfg).unwrap_err(), line!());
    assert!(matches!(&e, Error::Invalid { op, .. } if op == "trace"), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("{}:{line}:22: trace: dynamic dim given for input 1, but there are 1 inputs", file!())
    );
    let cfg = TraceConfig { dynamic: vec![(0, 2)], ..TraceConfig::default() };
    let (e, line) = (trace(|a| Ok(a.to_vec()), std::slice::from_ref(&x), &cfg).unwrap_err(), line!());
    assert!(matches!(&e, Error::Invalid { op, .. } if op == "trace"), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("{}:{line}:22: trace: dynamic dim 2 is out of range for input 0 (f32[2, 3])", file!())
    );
    let cfg = TraceConfig { dynamic: vec![(0, 0)], ..TraceConfig::default() };
    let e = trace(|a| Ok(a.to_vec()), &[x.t().unwrap()], &cfg).unwrap_err();
    assert!(e.to_string().contains("not contiguous"), "{e}");
    let e = trace(|_| Ok(vec![t(&[1], DType::F32)]), &[x], &TraceConfig::default()).unwrap_err();
    assert!(matches!(e, Error::Mode { .. }), "{e}");
}

#[test]
fn huge_steps_lengths_and_strides_are_errors_not_overflow_panics() {
    let x = t(&[3, 2], DType::F32);
    // x[::MAX] along dim 1 has one element, with stride 1 * MAX.
    let s = x.slice(1, None, None, i64::MAX).unwrap();
    assert_eq!(s.sizes().unwrap(), vec![3, 1]);
    assert_eq!(s.to_vec_f64().unwrap(), vec![0., 2., 4.]);
    // Along dim 0 (stride 2) the new stride 2 * MAX does not fit in i64.
    let line = line!() + 1;
    let (e, f) = both(std::slice::from_ref(&x), |a| a[0].slice(0, None, None, i64::MAX));
    for e in [&e, &f] {
        check(e, "invalid", line, &["slice", "slice stride overflows i64"]);
    }
    let line = line!() + 1;
    let (e, f) = both(std::slice::from_ref(&x), |a| a[0].narrow(0, 1, i64::MAX));
    for e in [&e, &f] {
        check(e, "invalid", line, &["narrow", "start (1) + length (9223372036854775807) exceeds dimension size (3)"]);
    }
    let line = line!() + 1;
    let (e, f) = both(std::slice::from_ref(&x), |a| a[0].narrow(0, -1, i64::MAX));
    for e in [&e, &f] {
        check(e, "invalid", line, &["narrow", "exceeds dimension size"]);
    }
    // A huge stride on a size-1 dim reaches one element; views that multiply it fail.
    let huge = usize::try_from(i64::MAX).unwrap();
    let line = line!() + 1;
    let (e, f) = both(std::slice::from_ref(&x), |a| a[0].as_strided(&[1, 2], &[huge, 1], 0)?.slice(0, None, None, 2));
    for e in [&e, &f] {
        check(e, "invalid", line, &["slice", "slice stride overflows i64"]);
    }
    let line = line!() + 1;
    let f = trace(|a| Ok(vec![a[0].as_strided(&[3], &[huge / 2 + 1], 0)?]), &[x], &TraceConfig::default()).unwrap_err();
    check(&f, "invalid", line, &["as_strided", "the last element reached overflows i64"]);
}

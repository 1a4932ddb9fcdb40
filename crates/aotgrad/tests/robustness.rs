//! Bad and extreme inputs give errors, never panics or aborts: sizes near the integer
//! limits, allocations the machine cannot satisfy, scalars a dtype cannot hold,
//! invalid programs in text; and concurrent first calls compile each signature once.

use aotgrad::ir::text::parse_graph;
use aotgrad::ir::Backend;
use aotgrad::prelude::*;
use std::sync::{Arc, Barrier};

fn err<T: std::fmt::Debug>(r: aotgrad::trace::Result<T>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn sizes_beyond_the_integer_limits_are_errors() {
    let e = err(Tensor::from_vec(Vec::<f32>::new(), &[1 << 32, 1 << 32]));
    assert!(e.contains("from_vec") && e.contains("more elements than fit in i64"), "{e}");
    let e = err(Tensor::from_vec(vec![1.0f32, 2.0], &[(1usize << 63) + 1, 2]));
    assert!(e.contains("size 9223372036854775809") && e.contains("largest tensor dimension"), "{e}");
    let e = err(Tensor::zeros(&[usize::MAX, 4], DType::F32));
    assert!(e.contains("zeros: size 18446744073709551615 in shape [18446744073709551615, 4]"), "{e}");
    assert!(!e.contains("negative"), "names the real problem: {e}");
    let e = err(Tensor::rand(&[usize::MAX], DType::F32, 0));
    assert!(e.contains("largest tensor dimension"), "{e}");
    // A parsed graph with an i64::MAX size: a parse error, not a panic while formatting.
    let text = "graph(%0: f32[2, 3] #0 \"x\") {\n  %1: f32[2, 9223372036854775807] #1 = sum(%0, dims=[1], keepdim=true)\n  return (%1)\n}\n";
    let e = parse_graph(text).unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn allocations_that_cannot_succeed_are_errors() {
    // More bytes than any address space: refused before trying.
    let e = err(Tensor::zeros(&[1 << 31, 1 << 31], DType::F32));
    assert!(e.contains("out of memory") && e.contains("18446744073709551616 bytes"), "{e}");
    // 4 TB: refused by the allocator (unless the kernel overcommits without limit).
    let always_overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "1");
    if !always_overcommit {
        let e = err(Tensor::zeros(&[1_000_000, 1_000_000], DType::F32));
        assert!(e.contains("full: out of memory: cannot allocate 4000000000000 bytes (4.0 TB)"), "{e}");
    }
}

#[test]
fn reductions_over_broadcast_views_do_not_materialize_them() {
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0], &[1, 3], DType::F32).unwrap();
    let big = x.expand(&[1 << 40, 3]).unwrap();
    assert_eq!(big.sum_all().unwrap().item().unwrap(), 6.0 * (1u64 << 40) as f64);
    assert_eq!(big.mean_all().unwrap().item().unwrap(), 2.0);
    assert_eq!(big.amax(&[0], false).unwrap().to_vec_f64().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(
        big.sum(&[0], false).unwrap().to_vec_f64().unwrap(),
        [1.0, 2.0, 3.0].map(|v: f64| v * (1u64 << 40) as f64).to_vec()
    );
    // Integers: the copies are counted too.
    let i = Tensor::from_i64(&[5, -2], &[2, 1]).unwrap().expand(&[2, 1000]).unwrap();
    assert_eq!(i.sum(&[1], false).unwrap().to_vec_i64().unwrap(), vec![5000, -2000]);
}

/// The compiled CPU backend iterates a reduced dim that every load broadcasts once
/// (and scales a sum), like the eager kernel: these finish at once rather than after
/// 2^40 iterations, and equal eager's values; a reduced dim only some loads broadcast
/// is iterated.
#[test]
fn compiled_reductions_over_broadcast_views_iterate_one_copy() {
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        let big = a[0].expand(&[1 << 40, 3])?;
        let scaled = big.mul(2.0)?; // a fused prologue that also broadcasts
        Ok(vec![
            big.sum_all()?,
            big.mean_all()?,
            big.amax(&[0], false)?,
            scaled.sum(&[0], true)?,
            big.amin(&[0, 1], false)?,
        ])
    };
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0], &[1, 3], DType::F64).unwrap();
    // (Eagerly `big.mul(2.0)` would materialize 2^42 elements; the values are hand-derived,
    // and the eager kernel's own are checked above.)
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let got = no_grad(|| c.call(std::slice::from_ref(&x))).unwrap();
    let n = (1u64 << 40) as f64;
    let want = [vec![6.0 * n], vec![2.0], vec![1.0, 2.0, 3.0], vec![2.0 * n, 4.0 * n, 6.0 * n], vec![1.0]];
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.to_vec_f64().unwrap(), w);
    }
    // `x + y` with `y` varying along the expanded dim: every row is summed.
    let g = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![a[0].expand(&[4, 3])?.add(&a[1])?.sum(&[0], false)?])
    };
    let y = Tensor::from_f64(&(0..12).map(f64::from).collect::<Vec<_>>(), &[4, 3], DType::F64).unwrap();
    let got =
        no_grad(|| aot_function(g, AotConfig::default().no_cache()).unwrap().call(&[x.clone(), y.clone()])).unwrap();
    assert_eq!(got[0].to_vec_f64().unwrap(), vec![4.0 + 18.0, 8.0 + 22.0, 12.0 + 26.0]);
    // Integers count the copies exactly.
    let h = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].expand(&[2, 1000])?.sum(&[1], false)?]) };
    let i = Tensor::from_i64(&[5, -2], &[2, 1]).unwrap();
    let got = aot_function(h, AotConfig::default().no_cache()).unwrap().call(&[i]).unwrap();
    assert_eq!(got[0].to_vec_i64().unwrap(), vec![5000, -2000]);
}

#[test]
fn scalars_a_dtype_cannot_hold_are_errors() {
    let e = err(Tensor::full(&[1], 3_000_000_000i64, DType::I32));
    assert!(e.contains("value 3000000000 cannot be converted to type i32 without overflow"), "{e}");
    let e = err(Tensor::full(&[1], 1e6, DType::F16));
    assert!(e.contains("cannot be converted to type f16"), "{e}");
    let e = err(Tensor::full(&[1], 1e300, DType::F32));
    assert!(e.contains("cannot be converted to type f32"), "{e}");
    let x = Tensor::zeros(&[2], DType::I32).unwrap();
    assert!(err(x.fill_(3_000_000_000i64)).contains("without overflow"));
    assert!(err(x.add_(3_000_000_000i64)).contains("without overflow"));
    assert!(err(x.add(3_000_000_000i64)).contains("without overflow"));
    assert!(err(Tensor::arange(0, 3_000_000_000i64, 1_000_000_000, DType::I32)).contains("without overflow"));
    // What fits still works, and floats keep their infinities.
    assert_eq!(Tensor::full(&[1], i32::MAX as i64, DType::I32).unwrap().to_vec_i64().unwrap(), vec![i32::MAX as i64]);
    assert!(Tensor::full(&[1], f64::INFINITY, DType::F16).unwrap().item().unwrap().is_infinite());
    assert_eq!(x.add(2.5).unwrap().dtype(), DType::F32, "a float scalar promotes");
}

#[test]
fn invalid_programs_in_text_are_parse_errors_with_their_line() {
    let e = parse_graph("graph(%0: f32[2, 3] #0 \"x\") {\n  %1: f32[2, 3] #1 = add(%0, %5)\n  return (%1)\n}\n")
        .unwrap_err();
    assert_eq!((e.line, e.col), (2, 3));
    assert!(e.msg.contains("invalid program") && e.msg.contains("uses %5, which is not defined before it"), "{e}");
    let e =
        parse_graph("graph(%0: f32[2, 3] #0 \"x\") {\n  %1: f32[2, 4] #1 = neg(%0)\n  return (%1)\n}\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.msg.contains("is recorded as f32[2, 4], but neg gives f32[2, 3]"), "{e}");
    let e = parse_graph("graph(%0: f32[2] #0 \"x\") {\n  return (%3)\n}\n").unwrap_err();
    assert!(e.msg.contains("returns %3, which is not defined"), "{e}");
    // The same check guards artifacts read back from bytes.
    let bytes = b"graph(%0: f32[2] #0 \"x\") {\n  %1: f32[3] #1 = neg(%0)\n  return (%1)\n}\n";
    let e = aotgrad::cpu::ReferenceBackend.deserialize(bytes).err().expect("rejected").to_string();
    assert!(e.contains("invalid program") && !e.contains("internal error"), "{e}");
}

#[test]
fn concurrent_first_calls_compile_each_signature_once() {
    // Tracing takes a while, so the threads' first calls overlap.
    let slow = |a: &[Tensor]| {
        if aotgrad::trace::is_tracing() {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        Ok(vec![a[0].mul(2.0)?.sum_all()?])
    };
    let f = Arc::new(aot_function(slow, AotConfig::default()).unwrap());
    let shapes: Vec<Vec<usize>> = (1..=6).map(|n| vec![n, 3]).collect();
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (f, barrier, shapes) = (f.clone(), barrier.clone(), shapes.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for k in 0..shapes.len() {
                    let s = &shapes[(k + t) % shapes.len()];
                    let x = Tensor::ones(s, DType::F32).unwrap();
                    let out = f.call(&[x]).unwrap();
                    assert_eq!(out[0].item().unwrap(), 2.0 * s.iter().product::<usize>() as f64);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(f.num_compiled(), 6);
}

mod fuzz {
    //! The public construction API over random sizes near the integer limits, random
    //! strides and offsets, and random scalars per dtype: every call returns (a tensor
    //! or an error) without panicking. Sizes are either tiny or far too large to
    //! allocate, so nothing here allocates much.
    use super::*;
    use proptest::prelude::*;

    const HUGE: [usize; 6] = [1 << 40, 1 << 62, i64::MAX as usize, 1 << 63, (1 << 63) + 1, usize::MAX];
    const DTYPES: [DType; 7] = [DType::Bool, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![4 => 0usize..4, 1 => proptest::sample::select(HUGE.to_vec())]
    }
    fn shape() -> impl Strategy<Value = Vec<usize>> {
        proptest::collection::vec(size(), 0..4)
    }
    fn scalar() -> impl Strategy<Value = Scalar> {
        prop_oneof![
            any::<i64>().prop_map(Scalar::Int),
            any::<f64>().prop_map(Scalar::Float),
            proptest::sample::select(vec![f64::NAN, f64::INFINITY, -0.0, 65504.0, 65520.0, 3.4e38, 1e39, 2.5e9])
                .prop_map(Scalar::Float),
            any::<bool>().prop_map(Scalar::Bool),
        ]
    }
    fn dtype() -> impl Strategy<Value = DType> {
        proptest::sample::select(DTYPES.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        #[test]
        fn constructors_never_panic(shape in shape(), s in scalar(), dtype in dtype(), n in 0usize..5) {
            let _ = Tensor::from_vec(vec![1.0f32; n], &shape);
            let _ = Tensor::zeros(&shape, dtype);
            let _ = Tensor::full(&shape, s, dtype);
            let _ = Tensor::rand(&shape, DType::F32, 0);
            // arange's length follows the scalar: skip lengths that are allocatable but
            // large (only small and impossible ones keep the test cheap).
            let len = match s { Scalar::Int(v) => v.unsigned_abs() as f64, Scalar::Float(v) => v.abs(), Scalar::Bool(_) => 1.0 };
            if !(1e5..1e14).contains(&len) {
                let _ = Tensor::arange(s, 4, 1, dtype);
            }
        }

        #[test]
        fn views_never_panic(size in shape(), stride in proptest::collection::vec(size(), 0..4), offset in size()) {
            let base = Tensor::arange(0, 16, 1, DType::F32).unwrap();
            let n = size.len().min(stride.len());
            if let Ok(v) = base.as_strided(&size[..n], &stride[..n], offset) {
                let _ = v.to_vec_f64();
                let _ = v.sum_all();
                let _ = v.contiguous();
            }
            let dims: Vec<i64> = size.iter().map(|&s| s as i64).collect();
            let _ = base.view(&dims);
            let _ = base.reshape(&[1, 16]).and_then(|b| b.expand(&dims));
        }

        #[test]
        fn scalar_ops_never_panic(s in scalar(), dtype in dtype()) {
            if let Ok(x) = Tensor::zeros(&[2], dtype) {
                let _ = x.add(s);
                let _ = x.mul(s);
                let _ = x.add_(s);
                let _ = x.fill_(s);
                let _ = x.clamp(Some(s), Some(s));
                let _ = x.pow(s);
            }
        }
    }
}

#[test]
fn long_view_chains_collapse_and_keep_their_values() {
    // 200 chained views (reshapes and transposes of a 4x4 and a slice at the end):
    // simplification collapses them in one linear pass; values and gradients equal
    // those of the unsimplified program.
    let f = |a: &[Tensor]| {
        let mut x = a[0].clone();
        for i in 0..200 {
            x = match i % 4 {
                0 | 1 => x.transpose(0, 1)?,
                2 => x.view(&[16])?,
                _ => x.view(&[4, 4])?,
            };
        }
        Ok(vec![x.slice(1, Some(1), Some(3), 1)?.mul(&a[1])?.sum_all()?])
    };
    let run = |simplify: bool| {
        let x = Tensor::randn(&[4, 4], DType::F32, 3).unwrap().requires_grad(true).unwrap();
        let w = Tensor::randn(&[4, 2], DType::F32, 4).unwrap();
        let af = aot_function(f, AotConfig { simplify, ..AotConfig::default().threads(1) }).unwrap();
        let (outs, back) = af.forward(&[x, w]).unwrap();
        let grads = back.backward(&[outs[0].ones_like().unwrap()]).unwrap();
        let nodes = af.joint_graphs()[0].graph.nodes.len();
        (outs[0].item().unwrap(), grads[0].as_ref().unwrap().to_vec_f64().unwrap(), nodes)
    };
    let (v1, g1, n1) = run(true);
    let (v0, g0, n0) = run(false);
    assert_eq!(v1, v0);
    assert_eq!(g1, g0);
    assert!(n1 < 40 && n0 > 400, "simplified joint: {n1} nodes, unsimplified {n0}");
}

#[test]
fn long_programs_simplify_window_by_window_and_keep_their_values() {
    // ~1,500 ops: the joint graph is several simplification windows long.
    let f = |a: &[Tensor]| {
        let mut x = a[0].clone();
        for i in 0..500 {
            x = x.mul(&a[1])?.add(0.01 * (i % 7) as f64)?.tanh()?;
        }
        Ok(vec![x.sum_all()?])
    };
    let run = |simplify: bool| {
        let x = Tensor::randn(&[4, 4], DType::F32, 5).unwrap().requires_grad(true).unwrap();
        let w = Tensor::randn(&[4, 4], DType::F32, 6).unwrap().requires_grad(true).unwrap();
        let af = aot_function(f, AotConfig { simplify, ..AotConfig::default().threads(1) }).unwrap();
        let (outs, back) = af.forward(&[x, w]).unwrap();
        let grads = back.backward(&[outs[0].ones_like().unwrap()]).unwrap();
        let joint = af.joint_graphs()[0].graph.nodes.len();
        let g: Vec<Vec<f64>> = grads.iter().map(|g| g.as_ref().unwrap().to_vec_f64().unwrap()).collect();
        (outs[0].item().unwrap(), g, joint)
    };
    let (v1, g1, n1) = run(true);
    let (v0, g0, n0) = run(false);
    assert!(n0 > 4096, "the unsimplified joint graph spans several windows: {n0} nodes");
    assert!(n1 < n0, "windows still simplify: {n1} vs {n0} nodes");
    assert!((v1 - v0).abs() <= 1e-5 * (1.0 + v0.abs()), "{v1} vs {v0}");
    for (a, b) in g1.iter().flatten().zip(g0.iter().flatten()) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "gradient {a} vs {b}");
    }
}

#[test]
fn metadata_in_place_ops_bump_the_shared_version_counter() {
    // PyTorch 2.15: every in-place op bumps `_version`, shared by all views of the storage.
    let a = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let v = a.view(&[6]).unwrap();
    assert_eq!((a.version().unwrap(), v.version().unwrap()), (0, 0));
    a.t_().unwrap();
    assert_eq!((a.version().unwrap(), v.version().unwrap()), (1, 1));
    a.transpose_(0, 1).unwrap();
    a.unsqueeze_(0).unwrap();
    a.squeeze_().unwrap();
    a.as_strided_(&[3, 2], &[1, 3], 0).unwrap();
    assert_eq!(v.version().unwrap(), 5);
    v.add_(1.0).unwrap();
    assert_eq!(a.version().unwrap(), 6);
    // Views and out-of-place ops do not.
    let _ = a.t().unwrap().mul(2.0).unwrap();
    assert_eq!(a.version().unwrap(), 6);
    // A compiled function's metadata mutation of an input bumps the caller's counter.
    let f = aot_function(|x: &[Tensor]| Ok(vec![x[0].t_()?.mul(2.0)?]), AotConfig::default()).unwrap();
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(x.shape().len(), 2);
    assert_eq!(x.strides(), vec![1.into(), 3.into()]);
    assert!(x.version().unwrap() >= 1);
}

#[test]
fn in_place_ops_refuse_partially_overlapping_operands() {
    // PyTorch 2.15: "unsupported operation: some elements of the input tensor and the
    // written-to tensor refer to a single memory location".
    let x = Tensor::arange(0, 3, 1, DType::F32).unwrap();
    let e = err(x.add_(&x.select(0, 1).unwrap()));
    assert!(e.contains("refer to a single memory location"), "{e}");
    let m = Tensor::arange(0, 4, 1, DType::F32).unwrap().view(&[2, 2]).unwrap();
    assert!(err(m.add_(&m.t().unwrap())).contains("single memory location"));
    let v = Tensor::arange(0, 6, 1, DType::F32).unwrap();
    let (lo, hi) = (v.slice(0, Some(0), Some(4), 1).unwrap(), v.slice(0, Some(2), Some(6), 1).unwrap());
    assert!(err(lo.copy_(&hi)).contains("single memory location"));
    // The same check while tracing: the compiled function refuses like eager.
    let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].add_(&a[0].select(0, 1)?)?]), AotConfig::default()).unwrap();
    let e = f.call(&[Tensor::zeros(&[3], DType::F32).unwrap()]).expect_err("refused").to_string();
    assert!(e.contains("single memory location"), "{e}");
    // Whole overlap and disjoint windows are fine.
    x.add_(&x).unwrap();
    assert_eq!(x.to_vec_f64().unwrap(), vec![0.0, 2.0, 4.0]);
    lo.slice(0, Some(0), Some(2), 1).unwrap().copy_(&hi.slice(0, Some(2), Some(4), 1).unwrap()).unwrap();
    assert_eq!(v.to_vec_f64().unwrap(), vec![4.0, 5.0, 2.0, 3.0, 4.0, 5.0]);
}

/// One error type across a user function: the function returns `aotgrad::Result`, `?`
/// works on an `aotgrad::Error` (here: building a layer with a zero size) and on a
/// tensor op's error alike, and the error comes out of the compiled call as that same
/// `aotgrad::Error`.
#[test]
fn aotgrad_errors_cross_user_functions_and_come_back_as_themselves() {
    let f = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        let bad = aotgrad::nn::Linear::new(0, 3, true, DType::F64, 1)?;
        Ok(vec![a[0].mul(bad.in_features as f64)?])
    };
    let x = Tensor::ones(&[2], DType::F64).unwrap();
    let eager = f(std::slice::from_ref(&x)).unwrap_err();
    assert!(matches!(eager, aotgrad::Error::Call { ref name, .. } if name == "Linear"), "{eager:?}");
    assert!(eager.to_string().contains("must be positive"), "{eager}");
    let c = aot_function(f, AotConfig::default().no_cache()).unwrap();
    let err = c.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(matches!(err, aotgrad::Error::Call { ref name, .. } if name == "Linear"), "{err:?}");
    // A tensor op's error inside the function is the same `Error::Trace` eagerly and
    // compiled, with the user's line.
    let g = |a: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> { Ok(vec![a[0].add(&a[1])?]) };
    let y = Tensor::ones(&[3], DType::F64).unwrap();
    let eager = g(&[x.clone(), y.clone()]).unwrap_err();
    let compiled = aot_function(g, AotConfig::default().no_cache()).unwrap().call(&[x, y]).unwrap_err();
    for e in [&eager, &compiled] {
        assert!(matches!(e, aotgrad::Error::Trace(aotgrad::trace::Error::Shape { .. })), "{e:?}");
        assert!(e.to_string().contains("robustness.rs"), "{e}");
    }
    // A tracing error stays a tracing error through the same conversions.
    let t: aotgrad::trace::Error = aotgrad::Error::from(aotgrad::trace::Error::Internal("x".into())).into();
    assert!(matches!(t, aotgrad::trace::Error::Internal(_)));
}

#[test]
fn a_long_programs_graphs_are_kept_compactly_and_read_back_whole() {
    // ~7,500 ops: the five graphs of the compile hold far more than the 20,000 nodes
    // above which a compiled function keeps them encoded; asking for them decodes
    // the very graphs that were compiled.
    let f = |a: &[Tensor]| -> aotgrad::trace::Result<Vec<Tensor>> {
        let mut x = a[0].clone();
        for i in 0..2500 {
            x = x.mul(&a[1])?.add(0.01 * (i % 5) as f64)?.relu()?;
        }
        Ok(vec![x.sum_all()?])
    };
    let x = Tensor::randn(&[4, 4], DType::F32, 5).unwrap().requires_grad(true).unwrap();
    let w = Tensor::randn(&[4, 4], DType::F32, 6).unwrap();
    let af = aot_function(move |a: &[Tensor]| Ok(f(a)?), AotConfig::default().threads(1)).unwrap();
    let (outs, back) = af.forward(&[x.clone(), w.clone()]).unwrap();
    back.backward(&[outs[0].ones_like().unwrap()]).unwrap();
    // The oracle: the same function traced directly.
    let direct = aotgrad::trace::trace(f, &[x, w], &aotgrad::trace::TraceConfig::default()).unwrap();
    let traced = af.traced_graphs();
    assert_eq!(traced.len(), 1);
    assert!(traced[0].nodes.len() > 7000, "{} traced nodes", traced[0].nodes.len());
    assert_eq!(aotgrad::ir::text::print_graph(&traced[0]), aotgrad::ir::text::print_graph(&direct.graph));
    let (fw, bw, _) = af.training_graphs().pop().unwrap();
    let joint = af.joint_graphs().pop().unwrap().graph;
    let total = traced[0].nodes.len() + af.compiled_graphs()[0].nodes.len() + joint.nodes.len();
    assert!(total + fw.nodes.len() + bw.nodes.len() > 20_000, "{total} nodes");
    // Every decoded graph is a valid program: it prints and parses back unchanged.
    for g in [&fw, &bw, &joint] {
        let text = aotgrad::ir::text::print_graph(g);
        assert_eq!(aotgrad::ir::text::print_graph(&parse_graph(&text).unwrap()), text);
    }
}

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

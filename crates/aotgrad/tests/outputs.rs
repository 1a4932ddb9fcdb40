//! Non-tensor outputs (issue 8, item 7): compiled functions return integers (sizes
//! over dynamic dims included) and `None` in the user's order, as PyTorch's
//! `aot_function` does, through inference and training, fresh and from the cache.

use aotgrad::cache::Cache;
use aotgrad::prelude::*;
use aotgrad::EntrySource;
use std::sync::Arc;

/// `(x * 2, x.size(0), None, (x * y).sum(), x.size(0) + y.size(0) + 5, 7)`.
fn f(a: &[Arg]) -> aotgrad::Result<Vec<Output>> {
    let (x, y) = (a[0].tensor().expect("x"), a[1].tensor().expect("y"));
    let (n, m) = (x.shape()[0].clone(), y.shape()[0].clone());
    Ok(vec![
        Output::Tensor(x.mul(2.0)?),
        Output::Int(n.clone()),
        Output::None,
        Output::Tensor(x.sum(&[1], false)?.mul(&y.sum(&[1], false)?.sum_all()?)?.sum_all()?),
        Output::Int(n.add(&m).add(&Dim::Const(5))),
        Output::from(7),
    ])
}

fn inputs(n: usize, m: usize, grad: bool) -> Vec<Arg> {
    let x = Tensor::from_f64(&(0..n * 2).map(|i| i as f64).collect::<Vec<_>>(), &[n, 2], DType::F64).unwrap();
    let y = Tensor::ones(&[m, 3], DType::F64).unwrap();
    let x = if grad { x.requires_grad(true).unwrap() } else { x };
    vec![x.into(), y.into()]
}

/// The plain outputs, with tensors as `None`.
fn ints(out: &[Output]) -> Vec<Option<i64>> {
    out.iter().map(Output::int).collect()
}

#[test]
fn ints_and_none_come_back_in_order_and_sizes_follow_each_call() {
    let config = AotConfig { dynamic: vec![(0, 0), (1, 0)], ..AotConfig::default().no_cache() };
    let c = aot_function_outs(f, config).expect("compile");
    for (n, m) in [(3, 2), (5, 4), (2, 7)] {
        let out = no_grad(|| c.call_outs(&inputs(n, m, false))).expect("call");
        assert_eq!(out.len(), 6);
        let (n, m) = (n as i64, m as i64);
        assert_eq!(ints(&out), vec![None, Some(n), None, None, Some(n + m + 5), Some(7)]);
        assert!(out[2].is_none() && out[0].tensor().is_some() && out[3].tensor().is_some());
        // sum over rows of x (0 .. 2n) times 3m.
        let want = (0..2 * n).sum::<i64>() as f64 * 3.0 * m as f64;
        assert_eq!(out[3].tensor().unwrap().item().unwrap(), want);
        // The tensor-only call returns the tensors alone.
        let t = no_grad(|| c.call_args(&inputs(n as usize, m as usize, false))).expect("call");
        assert_eq!(t.len(), 2);
    }
    // One symbolic entry serves every size (all >= 2).
    assert_eq!(c.num_compiled(), 1);
}

#[test]
fn training_calls_return_plain_outputs_and_take_gradients_for_tensor_outputs_only() {
    let c = aot_function_outs(f, AotConfig::default().no_cache()).expect("compile");
    let (out, pending) = c.forward_outs(&inputs(3, 2, true)).expect("forward");
    assert_eq!(ints(&out), vec![None, Some(3), None, None, Some(10), Some(7)]);
    assert!(out[0].tensor().unwrap().is_requires_grad());
    // d/dx of sum(x * 2 * g0) + g3 * 6 * sum(x): 2 + 6 with g0 = 1, g3 = 1.
    let g = pending
        .backward(&[Tensor::ones(&[3, 2], DType::F64).unwrap(), Tensor::ones(&[], DType::F64).unwrap()])
        .expect("backward");
    assert_eq!(g[0].as_ref().expect("dx").to_vec_f64().unwrap(), vec![8.0; 6]);
    assert!(g[1].is_none());
    let e = no_grad(|| c.forward_outs(&inputs(3, 2, false))).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("use `call_outs`"), "{e}");
}

#[test]
fn the_layout_is_cached_with_the_result_and_is_part_of_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(Cache::disk(dir.path()));
    let config = AotConfig { name: "outs".into(), ..AotConfig::default().cache(cache.clone()) };
    let first = aot_function_outs(f, config.clone()).expect("compile");
    let want = ints(&no_grad(|| first.call_outs(&inputs(3, 2, false))).expect("call"));
    // A fresh function over the same cache loads the entry, layout included.
    let second = aot_function_outs(f, config.clone()).expect("compile");
    let got = ints(&no_grad(|| second.call_outs(&inputs(3, 2, false))).expect("call"));
    assert_eq!(got, want);
    let reports = second.compile_reports();
    assert!(reports.len() == 1 && reports[0].source == EntrySource::Cache, "{reports:?}");
    assert_eq!(second.cache_stats().hits, 1, "{:?}", second.cache_stats());
    // The same graph with other plain outputs is another key: never the cached layout.
    let other = aot_function_outs(
        |a: &[Arg]| {
            let mut out = f(a)?;
            out[5] = Output::from(8);
            Ok(out)
        },
        config,
    )
    .expect("compile");
    let got = ints(&no_grad(|| other.call_outs(&inputs(3, 2, false))).expect("call"));
    assert_eq!(got[5], Some(8));
    assert_eq!(other.cache_stats().hits, 0);
}

//! Property test for the composed ops (masking, triangles, stack/split/chunk, var/std,
//! ordering, max/min over a dim, any/all, one_hot, diagonal, tensor clamps, scalar-on-
//! the-left arithmetic, the in-place unary ops, convolution, pooling and group norm):
//! each run eagerly and traced over fake tensors gives every output the same shape,
//! strides, offset, dtype and view-ness; what eager rejects the trace rejects with the
//! same message, and the other way round. A second trace with every input dim symbolic
//! must agree with eager under the example sizes whenever it succeeds, and reject
//! whatever eager rejects.

use aotgrad_ir::{DType, TensorMeta, UnaryOp};
use aotgrad_trace::{trace, Conv2dOpts, Result, Tensor, TraceConfig, Traced};
use proptest::prelude::*;
use proptest::sample::select;

#[derive(Debug, Clone)]
enum Case {
    /// Mask shaped like `x` with the dims in the bitmask set to 1.
    MaskedFill(u8, bool),
    Tril(i64),
    Triu(i64),
    /// `stack([x, x], dim)`.
    Stack(i64),
    Split(i64, i64),
    Chunk(i64, i64),
    Cumsum(i64),
    Var(Vec<i64>, i64, bool),
    Std(Vec<i64>, i64, bool),
    MaxDim(i64, bool),
    MinDim(i64, bool),
    Sort(i64, bool),
    TopK(usize, i64, bool),
    ArgmaxAll,
    ArgminAll,
    Any(Vec<i64>, bool),
    All(Vec<i64>, bool),
    /// `one_hot(x as i64, n)` with `n` above every value (the data is in `0..5`): a
    /// class out of range is a value error only eager can see, and `n = -1` sizes the
    /// result by the data, which a fake tensor cannot (PyTorch's fake mode refuses it
    /// too).
    OneHot(i64),
    Diagonal(i64, i64, i64),
    /// Bounds shaped like `x` with the dims in the bitmask set to 1, or absent.
    ClampTensor(Option<u8>, Option<u8>),
    Rsub(f64),
    Rdiv(f64),
    UnaryInPlace(UnaryOp),
    /// `x` as `[1, 1, -1, last]` images, convolved with `[2, 1, k, k]` (stride, padding).
    Conv2d(usize, usize, usize),
    /// `x` as `[1, 1, -1, last]`, through `conv_transpose2d` with `[1, 2, k, k]`.
    ConvTranspose2d(usize, usize, usize),
    MaxPool2d(usize, usize),
    AvgPool2d(usize, usize),
    AdaptiveAvgPool2d(usize, usize),
    GroupNorm(usize),
    /// With running statistics of `x`'s dim-1 size (`C`, or 1 for rank < 2), in
    /// training mode (they are updated in place) or eval mode.
    BatchNorm(bool),
}

fn dtype() -> impl Strategy<Value = DType> {
    select(vec![DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::Bool])
}
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..=4, 0..=3)
}
fn dim() -> impl Strategy<Value = i64> {
    -4i64..4
}
fn dims() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(-3i64..3, 0..=2)
}

fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        (any::<u8>(), any::<bool>()).prop_map(|(m, b)| Case::MaskedFill(m, b)),
        (-3i64..3).prop_map(Case::Tril),
        (-3i64..3).prop_map(Case::Triu),
        dim().prop_map(Case::Stack),
        (-1i64..4, dim()).prop_map(|(s, d)| Case::Split(s, d)),
        (-1i64..4, dim()).prop_map(|(c, d)| Case::Chunk(c, d)),
        dim().prop_map(Case::Cumsum),
        (dims(), 0i64..3, any::<bool>()).prop_map(|(d, c, k)| Case::Var(d, c, k)),
        (dims(), 0i64..3, any::<bool>()).prop_map(|(d, c, k)| Case::Std(d, c, k)),
        (dim(), any::<bool>()).prop_map(|(d, k)| Case::MaxDim(d, k)),
        (dim(), any::<bool>()).prop_map(|(d, k)| Case::MinDim(d, k)),
        (dim(), any::<bool>()).prop_map(|(d, k)| Case::Sort(d, k)),
        (0usize..5, dim(), any::<bool>()).prop_map(|(k, d, l)| Case::TopK(k, d, l)),
        Just(Case::ArgmaxAll),
        Just(Case::ArgminAll),
        (dims(), any::<bool>()).prop_map(|(d, k)| Case::Any(d, k)),
        (dims(), any::<bool>()).prop_map(|(d, k)| Case::All(d, k)),
        (5i64..8).prop_map(Case::OneHot),
        (-2i64..3, dim(), dim()).prop_map(|(o, a, b)| Case::Diagonal(o, a, b)),
        (prop::option::of(any::<u8>()), prop::option::of(any::<u8>())).prop_map(|(a, b)| Case::ClampTensor(a, b)),
        select(vec![2.0, -0.5]).prop_map(Case::Rsub),
        select(vec![2.0, -0.5]).prop_map(Case::Rdiv),
        select(UnaryOp::ALL.to_vec()).prop_map(Case::UnaryInPlace),
        (1usize..4, 1usize..3, 0usize..2).prop_map(|(k, s, p)| Case::Conv2d(k, s, p)),
        (1usize..4, 1usize..3, 0usize..2).prop_map(|(k, s, p)| Case::ConvTranspose2d(k, s, p)),
        (1usize..4, 1usize..3).prop_map(|(k, s)| Case::MaxPool2d(k, s)),
        (1usize..4, 1usize..3).prop_map(|(k, s)| Case::AvgPool2d(k, s)),
        (1usize..4, 1usize..4).prop_map(|(h, w)| Case::AdaptiveAvgPool2d(h, w)),
        (1usize..4).prop_map(Case::GroupNorm),
        any::<bool>().prop_map(Case::BatchNorm),
    ]
}

fn tensor(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| ((i * 7) % 5) as f64).collect();
    Tensor::from_f64(&data, shape, dtype).expect("valid data")
}

fn masked(shape: &[usize], mask: u8) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &s)| if mask & (1 << i) != 0 { 1 } else { s }).collect()
}

/// `x` (contiguous or transposed) and the extra inputs the case needs.
fn inputs(shape: &[usize], dt: DType, transposed: bool, case: &Case) -> Vec<Tensor> {
    let x = if transposed && shape.len() >= 2 {
        let mut s = shape.to_vec();
        let last = s.len() - 1;
        s.swap(0, last);
        tensor(&s, dt).transpose(0, -1).expect("transpose")
    } else {
        tensor(shape, dt)
    };
    let mut v = vec![x];
    match case {
        Case::MaskedFill(m, _) => {
            let s = masked(shape, *m);
            let n: usize = s.iter().product();
            v.push(Tensor::from_bool(&(0..n).map(|i| i % 3 == 0).collect::<Vec<_>>(), &s).expect("mask"));
        }
        Case::ClampTensor(lo, hi) => {
            for b in [lo, hi].into_iter().flatten() {
                v.push(tensor(&masked(shape, *b), dt));
            }
        }
        Case::Conv2d(k, ..) => v.push(tensor(&[2, 1, *k, *k], dt)),
        Case::ConvTranspose2d(k, ..) => v.push(tensor(&[1, 2, *k, *k], dt)),
        Case::BatchNorm(_) => {
            let c = shape.get(1).copied().unwrap_or(1);
            v.push(tensor(&[c], dt));
            v.push(tensor(&[c], dt));
        }
        _ => {}
    }
    v
}

/// `x` as a batch of one single-channel image `[1, 1, -1, last]`.
fn image(x: &Tensor) -> Result<Tensor> {
    let last = x.sizes()?.last().copied().unwrap_or(1) as i64;
    x.reshape(&[1, 1, -1, last])
}

fn apply(case: &Case, a: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &a[0];
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    let pair = |t: Result<(Tensor, Tensor)>| t.map(|(a, b)| vec![a, b]);
    match case {
        Case::MaskedFill(_, false) => one(x.masked_fill(&a[1], 2.0)),
        Case::MaskedFill(_, true) => one(x.masked_fill_(&a[1], 2.0)),
        Case::Tril(k) => one(x.tril(*k)),
        Case::Triu(k) => one(x.triu(*k)),
        Case::Stack(d) => one(Tensor::stack(&[x, x], *d)),
        Case::Split(s, d) => x.split(*s, *d),
        Case::Chunk(c, d) => x.chunk(*c, *d),
        Case::Cumsum(d) => one(x.cumsum(*d)),
        Case::Var(d, c, k) => one(x.var(d, *c, *k)),
        Case::Std(d, c, k) => one(x.std(d, *c, *k)),
        Case::MaxDim(d, k) => pair(x.max_dim(*d, *k)),
        Case::MinDim(d, k) => pair(x.min_dim(*d, *k)),
        Case::Sort(d, desc) => pair(x.sort(*d, *desc)),
        Case::TopK(k, d, l) => pair(x.topk(*k, *d, *l)),
        Case::ArgmaxAll => one(x.argmax_all()),
        Case::ArgminAll => one(x.argmin_all()),
        Case::Any(d, k) => one(x.any(d, *k)),
        Case::All(d, k) => one(x.all(d, *k)),
        Case::OneHot(n) => one(x.to(DType::I64)?.one_hot(*n)),
        Case::Diagonal(o, d1, d2) => one(x.diagonal(*o, *d1, *d2)),
        Case::ClampTensor(lo, hi) => {
            let lo_t = lo.map(|_| &a[1]);
            let hi_t = hi.map(|_| &a[if lo.is_some() { 2 } else { 1 }]);
            one(x.clamp_tensor(lo_t, hi_t))
        }
        Case::Rsub(v) => one(x.rsub(*v)),
        Case::Rdiv(v) => one(x.rdiv(*v)),
        Case::UnaryInPlace(u) => one(Tensor::apply(aotgrad_ir::Op::InPlace(Box::new(aotgrad_ir::Op::Unary(*u))), &[x])),
        Case::Conv2d(_, s, p) => one(image(x)?.conv2d(&a[1], None, Conv2dOpts::default().stride(*s).padding(*p))),
        Case::ConvTranspose2d(_, s, p) => {
            one(image(x)?.conv_transpose2d(&a[1], None, Conv2dOpts::default().stride(*s).padding(*p), [0, 0]))
        }
        Case::MaxPool2d(k, s) => one(image(x)?.max_pool2d([*k, *k], Some([*s, *s]), [0, 0], [1, 1])),
        Case::AvgPool2d(k, s) => one(image(x)?.avg_pool2d([*k, *k], Some([*s, *s]), [0, 0])),
        Case::AdaptiveAvgPool2d(h, w) => one(image(x)?.adaptive_avg_pool2d([*h, *w])),
        Case::GroupNorm(g) => one(x.group_norm(*g, None, None, 1e-5)),
        Case::BatchNorm(training) => one(x.batch_norm(Some(&a[1]), Some(&a[2]), None, None, *training, 0.1, 1e-5)),
    }
}

fn fake_outs(t: &Traced) -> Vec<(TensorMeta, bool)> {
    let g = &t.graph;
    g.outputs
        .iter()
        .map(|&o| (g.meta_of(o).expect("output meta").clone(), g.storage_of(o) == Some(g.inputs[0].storage)))
        .collect()
}

fn eager_outs(outs: &[Tensor], x: &Tensor) -> Vec<(TensorMeta, bool)> {
    outs.iter().map(|t| (t.meta(), t.shares_storage_with(x))).collect()
}

fn run(shape: Vec<usize>, dt: DType, transposed: bool, case: Case) -> std::result::Result<(), TestCaseError> {
    let eager_in = inputs(&shape, dt, transposed, &case);
    let eager = apply(&case, &eager_in);
    let fake_in = inputs(&shape, dt, transposed, &case);
    let fake = trace(|a| apply(&case, a), &fake_in, &TraceConfig::default());
    match (&eager, &fake) {
        (Ok(e), Ok(f)) => {
            prop_assert_eq!(eager_outs(e, &eager_in[0]), fake_outs(f), "metadata differs");
        }
        (Err(e), Err(f)) => prop_assert_eq!(e.to_string(), f.to_string()),
        (Err(e), Ok(f)) => prop_assert!(false, "eager rejects ({}), fake gives {:?}", e, fake_outs(f)),
        (Ok(e), Err(f)) => prop_assert!(false, "fake rejects ({}), eager gives {:?}", f, eager_outs(e, &eager_in[0])),
    }
    if !transposed {
        let sym_in = inputs(&shape, dt, false, &case);
        let dynamic = (0..shape.len()).map(|d| (0, d)).collect();
        let cfg = TraceConfig { dynamic, duck_shape: false, ..TraceConfig::default() };
        let sym = trace(|a| apply(&case, a), &sym_in, &cfg);
        match (&eager, &sym) {
            (Ok(e), Ok(s)) => {
                let hints = s.shape_env.hints();
                s.shape_env.check(&hints).map_err(|g| TestCaseError::fail(g.to_string()))?;
                let concrete: Vec<(TensorMeta, bool)> =
                    fake_outs(s).into_iter().map(|(m, a)| (m.subst(&|v| hints.get(&v).copied()), a)).collect();
                prop_assert_eq!(eager_outs(e, &eager_in[0]), concrete, "symbolic metadata differs");
            }
            (Err(_), Ok(s)) => prop_assert!(false, "eager rejects, the symbolic trace gives {:?}", fake_outs(s)),
            // A symbolic trace may refuse what it cannot decide for every size (it
            // specializes or errors); it never accepts what eager rejects.
            (_, Err(_)) => {}
        }
    }
    Ok(())
}

/// 1,024 cases by default; `PROPTEST_CASES=n` runs more.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn composed_ops_fake_match_eager(
        shape in shape(),
        dt in dtype(),
        transposed in any::<bool>(),
        case in case(),
    ) {
        run(shape, dt, transposed, case)?;
    }
}

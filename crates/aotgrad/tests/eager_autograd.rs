//! Eager autograd (`Backward::backward` on eager tensors) against hand-derived values,
//! PyTorch 2.15's behaviour (values, flags and errors written out), central finite
//! differences in f64, and the gradients of the same models compiled.

use aotgrad::ir::Op;
use aotgrad::nn::{Mlp, Module, Params, TransformerBlock};
use aotgrad::prelude::*;
use std::sync::Arc;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F64).unwrap()
}

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    t(v, shape).requires_grad(true).unwrap()
}

fn vals(x: &Tensor) -> Vec<f64> {
    x.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn gradients_of_pointwise_reductions_views_and_products() {
    // loss = sum(relu(x @ w.t() + b) * 2) with hand-derived gradients.
    let x = leaf(&[1.0, -2.0, 3.0, 0.5, 1.5, -1.0], &[2, 3]);
    let w = leaf(&[0.2, -0.1, 0.4, -0.3, 0.5, 0.1], &[2, 3]);
    let b = leaf(&[0.1, -0.2], &[2]);
    let y = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    let loss = y.relu().unwrap().mul(2.0).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    // y = [[0.2+0.2+1.2+0.1, -0.3-1.0+0.3-0.2], [0.1-0.15-0.4+0.1, -0.15+0.75-0.1-0.2]]
    //   = [[1.7, -1.2], [-0.35, 0.3]]: relu passes (0,0) and (1,1).
    let mask = [[1.0, 0.0], [0.0, 1.0]];
    let xs = [[1.0, -2.0, 3.0], [0.5, 1.5, -1.0]];
    let ws = [[0.2, -0.1, 0.4], [-0.3, 0.5, 0.1]];
    let mut gx = vec![0.0; 6];
    let mut gw = vec![0.0; 6];
    let mut gb = [0.0; 2];
    for i in 0..2 {
        for j in 0..2 {
            let g = 2.0 * mask[i][j];
            gb[j] += g;
            for k in 0..3 {
                gx[i * 3 + k] += g * ws[j][k];
                gw[j * 3 + k] += g * xs[i][k];
            }
        }
    }
    assert!(close(&vals(&x.grad().unwrap()), &gx, 1e-12), "{:?}", x.grad());
    assert!(close(&vals(&w.grad().unwrap()), &gw, 1e-12));
    assert!(close(&vals(&b.grad().unwrap()), &gb, 1e-12));
    // The history: grad_fn names as PyTorch's, leaves have none.
    assert_eq!(loss.grad_fn().unwrap().unwrap().name(), "SumBackward0");
    assert!(x.grad_fn().unwrap().is_none() && x.is_leaf() && !loss.is_leaf());
}

#[test]
fn leaves_accumulate_until_cleared_and_retained_graphs_run_twice() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(&x).unwrap().sum_all().unwrap(); // d/dx = 2x
    y.backward_with(None, true).unwrap();
    y.backward().unwrap(); // the retained graph runs again; its values are freed now
    assert_eq!(vals(&x.grad().unwrap()), vec![4.0, 8.0]);
    let err = y.backward().unwrap_err().to_string();
    assert!(err.contains("backward through the graph a second time"), "{err}");
    x.set_grad(None);
    x.mul(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, 3.0]);
}

#[test]
fn retain_grad_no_grad_and_detach() {
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let h = x.mul(2.0).unwrap();
    h.retain_grad().unwrap();
    assert!(h.retains_grad() && x.retains_grad());
    let c = no_grad(|| x.mul(10.0)).unwrap(); // a constant to autograd
    let d = x.detach().unwrap().mul(100.0).unwrap(); // likewise
    assert!(!c.is_requires_grad() && !d.is_requires_grad());
    let loss = h.mul(&h).unwrap().add(&c).unwrap().add(&d).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    // d/dh = 2h = [4, 8, 12]; d/dx = 2 * 2h.
    assert_eq!(vals(&h.grad().unwrap()), vec![4.0, 8.0, 12.0]);
    assert_eq!(vals(&x.grad().unwrap()), vec![8.0, 16.0, 24.0]);
    // PyTorch: a tensor that does not require grad cannot retain it, nor backward.
    let e = c.retain_grad().unwrap_err().to_string();
    assert!(e.contains("requires_grad=False"), "{e}");
    let e = c.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("does not require grad and does not have a grad_fn"), "{e}");
}

#[test]
fn roots_with_more_than_one_element_need_a_gradient() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(3.0).unwrap();
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("grad can be implicitly created only for scalar outputs"), "{e}");
    y.backward_with(Some(&t(&[1.0, -1.0], &[2])), false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, -3.0]);
    let e = x.mul(3.0).unwrap().backward_with(Some(&t(&[1.0], &[1])), false).unwrap_err().to_string();
    assert!(e.contains("Mismatch in shape"), "{e}");
}

#[test]
fn in_place_ops_move_history_on() {
    // y = x * 2; y *= 3; y += x: d/dx = 6 + 1 (PyTorch: x.grad = [7, 7]).
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(2.0).unwrap();
    y.mul_(3.0).unwrap();
    y.add_(&x).unwrap();
    assert_eq!(y.grad_fn().unwrap().unwrap().name(), "AddBackward0");
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![7.0, 7.0]);
    // An in-place op whose derivative needs the old value: y = x * 1; y.mul_(y) is
    // y², d/dx = 2x (PyTorch: [2, 4]).
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(1.0).unwrap();
    y.mul_(&y.clone_tensor().unwrap()).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 4.0]);
    // A leaf that requires grad refuses in-place ops (PyTorch's error).
    let e = x.add_(1.0).unwrap_err().to_string();
    assert!(e.contains("leaf Variable that requires grad"), "{e}");
}

#[test]
fn in_place_ops_on_views_rewrite_the_base() {
    // PyTorch: y = x * 1; y[0] *= 5; (y * y).sum(): d/dx = 2y * dy/dx
    //   y = [5*1, 2, 3] -> [50, 4, 6] (x = [1, 2, 3]).
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let y = x.mul(1.0).unwrap();
    let v = y.select(0, 0).unwrap();
    v.mul_(5.0).unwrap();
    assert_eq!(y.grad_fn().unwrap().unwrap().name(), "CopySlices");
    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![50.0, 4.0, 6.0]);
    // A view taken before the base changed follows the base's new value:
    //   w = y[1:]; y[0] += 1 (through another view); sum(w * 3) -> only x[1:] get 3.
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let y = x.mul(1.0).unwrap();
    let w = y.slice(0, Some(1), Some(3), 1).unwrap();
    y.slice(0, Some(0), Some(1), 1).unwrap().add_(1.0).unwrap();
    w.mul(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![0.0, 3.0, 3.0]);
    // Writing a value that requires grad into a view of a constant: the constant's
    // other elements get nothing, the written value its gradient.
    let a = leaf(&[4.0, 5.0], &[2]);
    let z = Tensor::zeros(&[2, 2], DType::F64).unwrap();
    z.select(0, 1).unwrap().copy_(&a).unwrap();
    assert!(z.is_requires_grad());
    z.mul(&z).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&a.grad().unwrap()), vec![8.0, 10.0]);
}

#[test]
fn a_saved_value_modified_in_place_fails_the_backward() {
    // PyTorch: "one of the variables needed for gradient computation has been modified
    // by an inplace operation".
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(2.0).unwrap();
    let z = y.mul(&y).unwrap(); // saves y
    y.add_(1.0).unwrap();
    let e = z.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation"), "{e}");
    // A value the gradient does not read may change (PyTorch agrees): y + 1 saves
    // nothing it needs.
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(2.0).unwrap();
    let z = y.add(1.0).unwrap();
    y.add_(1.0).unwrap();
    z.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 2.0]);
}

/// Central finite differences (f64) of `f` at `x`, one element at a time.
fn finite_differences(x: &[f64], shape: &[usize], f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let eps = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            p[i] += eps;
            let up = f(&t(&p, shape));
            p[i] -= 2.0 * eps;
            let down = f(&t(&p, shape));
            (up - down) / (2.0 * eps)
        })
        .collect()
}

#[test]
fn composed_ops_match_finite_differences() {
    // softmax, log_softmax, gelu, layer_norm, cross_entropy, a transposed matmul,
    // cat, expand and indexing in one function.
    let xv: Vec<f64> = (0..12).map(|i| ((i as f64) * 0.7).sin()).collect();
    let f = |x: &Tensor| -> aotgrad::Result<Tensor> {
        let a = x.softmax(-1)?.mul(&x.log_softmax(0)?)?;
        let b = x.gelu()?.matmul(&x.t()?)?;
        let c = x.layer_norm(&[4], None, None, 1e-5)?;
        let d = Tensor::cat(&[&x.t()?.expand(&[2, 4, 3])?.select(0, 1)?, &x.t()?], 0)?;
        let ce = x.cross_entropy(&Tensor::from_i64(&[1, 3, 0], &[3])?)?;
        let parts = [a.sum_all()?, b.mul(&b)?.sum_all()?, c.mul(x)?.sum_all()?, d.tanh()?.sum_all()?, ce];
        let mut total = parts[0].clone();
        for p in &parts[1..] {
            total = total.add(p)?;
        }
        Ok(total)
    };
    let x = leaf(&xv, &[3, 4]);
    f(&x).unwrap().backward().unwrap();
    let fd = finite_differences(&xv, &[3, 4], &|p| no_grad(|| f(p)).unwrap().item().unwrap());
    let got = vals(&x.grad().unwrap());
    assert!(close(&got, &fd, 1e-6), "eager {got:?}\nfinite differences {fd:?}");
}

/// Eager gradients of every parameter of `m` on `x` (loss `sum(m(x))`) next to the
/// gradients of the same module compiled.
fn eager_vs_compiled(m: Arc<dyn Module>, x: &Tensor, tol: f64) {
    let store = m.store();
    let params: Vec<(String, Tensor)> = store.params().iter().map(|(n, p)| (n.clone(), p.clone())).collect();
    for (_, p) in &params {
        p.set_grad(None);
    }
    let p = Params::new(params.iter().cloned());
    m.forward(&p, std::slice::from_ref(x)).unwrap()[0].sum_all().unwrap().backward().unwrap();
    let compiled = aot_module(m.clone(), AotConfig::default().threads(1).no_cache()).unwrap();
    let (outs, back) = compiled.forward(std::slice::from_ref(x)).unwrap();
    let grads = back.backward(&[outs[0].ones_like().unwrap()]).unwrap();
    for (name, p) in &params {
        let eager = vals(&p.grad().unwrap_or_else(|| panic!("no eager gradient for {name}")));
        let comp = vals(grads.param(name).unwrap_or_else(|| panic!("no compiled gradient for {name}")));
        assert!(close(&eager, &comp, tol), "{name}: eager {:?}.. vs compiled {:?}..", &eager[..4], &comp[..4]);
    }
}

#[test]
fn models_get_the_compiled_gradients_eagerly() {
    let mlp = Arc::new(Mlp::new(&[6, 5, 4], DType::F32, 0).unwrap());
    eager_vs_compiled(mlp, &Tensor::randn(&[3, 6], DType::F32, 1).unwrap(), 1e-5);
    let blk = Arc::new(TransformerBlock::new(8, 2, DType::F32, 2).unwrap());
    eager_vs_compiled(blk, &Tensor::randn(&[2, 3, 8], DType::F32, 3).unwrap(), 1e-4);
}

/// An input of a catalogue case: differentiable f64 values, or fixed indices.
enum In {
    /// f64 values of this shape drawn from `lo..hi` (kept `away` from zero when set).
    F(&'static [usize], f64, f64),
    /// i64 indices (never differentiated).
    I(&'static [i64], &'static [usize]),
}

/// Deterministic values in `lo..hi` (SplitMix64), at least 0.1 from zero.
fn draw(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
            let v = lo + (hi - lo) * u;
            if v.abs() < 0.1 {
                0.1f64.copysign(v) + v
            } else {
                v
            }
        })
        .collect()
}

type CaseFn = Box<dyn Fn(&[Tensor]) -> aotgrad::Result<Tensor>>;

/// `L = sum(f(inputs) * w)` (fixed `w`, so no gradient cancels by symmetry) through
/// eager `backward()`, against central finite differences of `L` in f64.
fn eager_gradcheck(name: &str, ins: &[In], f: &CaseFn, seed: u64) {
    let values: Vec<Vec<f64>> = ins
        .iter()
        .enumerate()
        .map(|(k, i)| match i {
            In::F(shape, lo, hi) => draw(shape.iter().product(), *lo, *hi, seed * 7 + k as u64),
            In::I(v, _) => v.iter().map(|&x| x as f64).collect(),
        })
        .collect();
    let build = |vals: &[Vec<f64>], grad: bool| -> Vec<Tensor> {
        ins.iter()
            .zip(vals)
            .map(|(i, v)| match i {
                In::F(shape, ..) => {
                    let x = t(v, shape);
                    if grad {
                        x.requires_grad(true).unwrap()
                    } else {
                        x
                    }
                }
                In::I(v, shape) => Tensor::from_i64(v, shape).unwrap(),
            })
            .collect()
    };
    let out_shape = no_grad(|| f(&build(&values, false))).unwrap_or_else(|e| panic!("{name}: {e}")).sizes().unwrap();
    let w = t(&draw(out_shape.iter().product(), -1.0, 1.0, seed + 99), &out_shape);
    let loss = |xs: &[Tensor]| -> aotgrad::Result<Tensor> { Ok(f(xs)?.mul(&w)?.sum_all()?) };
    let leaves = build(&values, true);
    loss(&leaves).unwrap_or_else(|e| panic!("{name}: {e}")).backward().unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, i) in ins.iter().enumerate() {
        let In::F(shape, ..) = i else { continue };
        let got = leaves[k].grad().map(|g| vals(&g)).unwrap_or_else(|| vec![0.0; values[k].len()]);
        assert_eq!(
            leaves[k].grad().map(|g| g.sizes().unwrap()),
            Some(shape.to_vec()),
            "{name}: gradient shape of input {k}"
        );
        // A case through f32 is linear in its input but rounds to f32: a wide step.
        let (eps, tol) = if name.contains("f32") { (1e-2, 1e-3) } else { (1e-6, 1e-5) };
        let fd: Vec<f64> = (0..values[k].len())
            .map(|e| {
                let mut p = values.clone();
                p[k][e] += eps;
                let up = no_grad(|| loss(&build(&p, false))).unwrap().item().unwrap();
                p[k][e] -= 2.0 * eps;
                let down = no_grad(|| loss(&build(&p, false))).unwrap().item().unwrap();
                (up - down) / (2.0 * eps)
            })
            .collect();
        assert!(close(&got, &fd, tol), "{name}: input {k}\n  eager {got:?}\n  finite differences {fd:?}");
    }
}

fn apply(op: Op, xs: &[&Tensor]) -> aotgrad::Result<Tensor> {
    Ok(Tensor::apply_op(&op, xs, &aotgrad::ir::SourceLoc::caller())?)
}

/// Every derivative rule of `aotgrad-autodiff`, one IR op at a time (the same ops
/// `aotgrad-autodiff`'s own finite-difference tests check on graphs), here recorded by
/// eager ops and differentiated by `backward()`.
#[test]
fn every_derivative_rule_through_backward() {
    use aotgrad::ir::{BinaryOp, CompositeOp, ReduceOp, UnaryOp};
    let mut cases: Vec<(String, Vec<In>, CaseFn)> = Vec::new();
    let one = |op: Op| -> CaseFn { Box::new(move |x: &[Tensor]| apply(op.clone(), &[&x[0]])) };
    let two = |op: Op| -> CaseFn { Box::new(move |x: &[Tensor]| apply(op.clone(), &[&x[0], &x[1]])) };
    for u in UnaryOp::ALL {
        if matches!(u, UnaryOp::Sign | UnaryOp::LogicalNot) || u.is_rounding() {
            continue;
        }
        let positive = matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log1p);
        let range = if positive { (0.5, 2.0) } else { (-2.0, 2.0) };
        cases.push((u.name().to_string(), vec![In::F(&[3, 4], range.0, range.1)], one(Op::Unary(u))));
    }
    for b in BinaryOp::ALL {
        let (lo, hi) = if b == BinaryOp::Pow { (0.5, 2.0) } else { (-2.0, 2.0) };
        cases.push((
            format!("{b:?} broadcast"),
            vec![In::F(&[2, 1, 3], lo, hi), In::F(&[4, 1], lo, hi)],
            two(Op::Binary(b)),
        ));
        cases.push((
            format!("{b:?} scalar"),
            vec![In::F(&[2, 3], lo, hi)],
            one(Op::BinaryScalar(b, Scalar::Float(1.5))),
        ));
    }
    let sym = |v: &[i64]| -> aotgrad_ir::Dims { v.iter().map(|&d| Dim::from(d)).collect() };
    let singles: Vec<(&str, &'static [usize], Op)> = vec![
        ("clamp", &[3, 4], Op::Clamp { min: Some(Scalar::Float(-0.5)), max: Some(Scalar::Float(0.7)) }),
        ("cast f32", &[3, 4], Op::Cast(DType::F32)),
        ("sum", &[2, 3, 4], Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 2], keepdim: false }),
        ("mean", &[2, 3, 4], Op::Reduce { op: ReduceOp::Mean, dims: vec![1], keepdim: true }),
        ("amax", &[3, 4], Op::Reduce { op: ReduceOp::Amax, dims: vec![1], keepdim: false }),
        ("amin", &[3, 4], Op::Reduce { op: ReduceOp::Amin, dims: vec![0], keepdim: true }),
        ("cumsum", &[3, 4], Op::Cumsum(1)),
        ("view", &[3, 4], Op::View(sym(&[2, 6]))),
        ("permute", &[2, 3, 4], Op::Permute(vec![2, 0, 1])),
        ("transpose", &[2, 3, 4], Op::Transpose(0, 2)),
        ("t", &[3, 4], Op::T),
        ("expand", &[3, 1], Op::Expand(sym(&[2, 3, 5]))),
        ("squeeze", &[3, 1, 4], Op::Squeeze(vec![1])),
        ("unsqueeze", &[3, 4], Op::Unsqueeze(1)),
        ("slice", &[5, 4], Op::Slice { dim: 0, start: 1.into(), end: 5.into(), step: 2 }),
        ("select", &[3, 4], Op::Select { dim: 1, index: 2.into() }),
        (
            "as_strided",
            &[3, 4],
            Op::AsStrided { size: (sym(&[2, 2])).to_vec(), stride: (sym(&[4, 2])).to_vec(), offset: 1.into() },
        ),
        (
            "as_strided overlapping",
            &[3, 4],
            Op::AsStrided { size: (sym(&[2, 2])).to_vec(), stride: (sym(&[2, 2])).to_vec(), offset: 0.into() },
        ),
        ("alias", &[3, 4], Op::Alias),
        ("clone", &[3, 4], Op::Clone),
        ("unsafe_view", &[3, 4], Op::UnsafeView(sym(&[12]))),
        ("gelu", &[3, 4], Op::Composite(CompositeOp::Gelu { tanh: false })),
        ("gelu tanh", &[3, 4], Op::Composite(CompositeOp::Gelu { tanh: true })),
        ("silu", &[3, 4], Op::Composite(CompositeOp::Silu)),
        ("softmax", &[3, 4], Op::Composite(CompositeOp::Softmax { dim: 1 })),
        ("log_softmax", &[3, 4], Op::Composite(CompositeOp::LogSoftmax { dim: 0 })),
        ("layer_norm", &[3, 4], Op::Composite(CompositeOp::LayerNorm { normalized_rank: 1, eps: 1e-5 })),
        ("var", &[3, 4], Op::Composite(CompositeOp::Var { dims: vec![1], correction: 1, keepdim: false })),
        ("tril", &[3, 4], Op::Composite(CompositeOp::Tril { diagonal: 0 })),
        ("triu", &[3, 4], Op::Composite(CompositeOp::Triu { diagonal: 1 })),
    ];
    for (name, shape, op) in singles {
        cases.push((name.into(), vec![In::F(shape, -2.0, 2.0)], one(op)));
    }
    let pairs: Vec<(&str, &'static [usize], &'static [usize], Op)> = vec![
        ("mm", &[3, 4], &[4, 2], Op::Mm),
        ("bmm", &[2, 3, 4], &[2, 4, 5], Op::Bmm),
        ("copy", &[3, 4], &[4], Op::Copy),
        ("cat", &[2, 3], &[4, 3], Op::Cat(0)),
        ("matmul", &[2, 3, 4], &[4, 2], Op::Composite(CompositeOp::Matmul)),
        ("mse_loss", &[3, 4], &[3, 4], Op::Composite(CompositeOp::MseLoss)),
        ("slice_scatter", &[4, 3], &[2, 3], Op::SliceScatter { dim: 0, start: 1.into(), end: 4.into(), step: 2 }),
        ("select_scatter", &[4, 3], &[4], Op::SelectScatter { dim: 1, index: 1.into() }),
        (
            "as_strided_scatter",
            &[3, 4],
            &[2, 2],
            Op::AsStridedScatter { size: (sym(&[2, 2])).to_vec(), stride: (sym(&[4, 1])).to_vec(), offset: 5.into() },
        ),
    ];
    for (name, a, b, op) in pairs {
        cases.push((name.into(), vec![In::F(a, -2.0, 2.0), In::F(b, -2.0, 2.0)], two(op)));
    }
    cases.push((
        "linear".into(),
        vec![In::F(&[3, 4], -2.0, 2.0), In::F(&[2, 4], -2.0, 2.0), In::F(&[2], -2.0, 2.0)],
        Box::new(|x: &[Tensor]| apply(Op::Composite(CompositeOp::Linear), &[&x[0], &x[1], &x[2]])),
    ));
    cases.push((
        "where".into(),
        vec![In::I(&[1, 0, 0, 1, 1, 0], &[2, 3]), In::F(&[2, 3], -2.0, 2.0), In::F(&[1, 3], -2.0, 2.0)],
        Box::new(|x: &[Tensor]| apply(Op::Where, &[&x[0].ne(0i64)?, &x[1], &x[2]])),
    ));
    let index_ops: Vec<(&str, &'static [usize], In, Op)> = vec![
        ("index_select", &[4, 3], In::I(&[2, 0, 2], &[3]), Op::IndexSelect(0)),
        ("gather", &[3, 4], In::I(&[0, 3, 3, 1, 2, 2], &[3, 2]), Op::Gather(1)),
        ("embedding", &[5, 3], In::I(&[4, 0, 4, 1], &[2, 2]), Op::Composite(CompositeOp::Embedding)),
    ];
    for (name, shape, idx, op) in index_ops {
        let f: CaseFn = Box::new(move |x: &[Tensor]| apply(op.clone(), &[&x[0], &x[1]]));
        cases.push((name.into(), vec![In::F(shape, -2.0, 2.0), idx], f));
    }
    cases.push((
        "scatter_add".into(),
        vec![In::F(&[3, 4], -2.0, 2.0), In::I(&[0, 3, 3, 1, 2, 2], &[3, 2]), In::F(&[3, 2], -2.0, 2.0)],
        Box::new(|x: &[Tensor]| apply(Op::ScatterAdd(1), &[&x[0], &x[1], &x[2]])),
    ));
    cases.push((
        "cross_entropy".into(),
        vec![In::F(&[3, 4], -2.0, 2.0), In::I(&[1, 3, 0], &[3])],
        Box::new(|x: &[Tensor]| apply(Op::Composite(CompositeOp::CrossEntropy), &[&x[0], &x[1]])),
    ));
    cases.push((
        "masked_fill".into(),
        vec![In::F(&[2, 3], -2.0, 2.0), In::I(&[1, 0, 0, 1, 1, 0], &[2, 3])],
        Box::new(|x: &[Tensor]| {
            let m = x[1].ne(0i64)?;
            apply(Op::Composite(CompositeOp::MaskedFill { value: Scalar::Float(0.5) }), &[&x[0], &m])
        }),
    ));
    // In-place ops: on a non-leaf (history moves on), and on a view of one (the base's
    // history is rewritten).
    cases.push((
        "in-place exp".into(),
        vec![In::F(&[3, 4], -2.0, 2.0)],
        Box::new(|x: &[Tensor]| {
            let y = x[0].mul(2.0)?;
            apply(Op::InPlace(Box::new(Op::Unary(UnaryOp::Exp))), &[&y])?;
            Ok(y)
        }),
    ));
    cases.push((
        "in-place mul through a view".into(),
        vec![In::F(&[3, 4], -2.0, 2.0), In::F(&[3], -2.0, 2.0)],
        Box::new(|x: &[Tensor]| {
            let y = x[0].mul(&x[0])?;
            let col = y.select(1, 2)?;
            apply(Op::InPlace(Box::new(Op::Binary(BinaryOp::Mul))), &[&col, &x[1]])?;
            Ok(y)
        }),
    ));
    assert!(cases.len() > 60, "{} cases", cases.len());
    for (k, (name, ins, f)) in cases.iter().enumerate() {
        eager_gradcheck(name, ins, f, k as u64 + 1);
    }
}

#[test]
fn eager_backward_through_a_compiled_output_is_refused_before_any_leaf_changes() {
    // Compiled outputs require grad but carry no eager history: their gradients come
    // from the backward `forward` returned. Eager autograd says so instead of silently
    // dropping the gradient, and leaves nothing half-accumulated.
    let f = aot_function(|a: &[Tensor]| Ok(vec![a[0].mul(&a[0])?]), AotConfig::default().no_cache()).unwrap();
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let (outs, _) = f.forward(std::slice::from_ref(&x)).unwrap();
    assert!(outs[0].is_requires_grad() && !outs[0].is_leaf());
    let loss = outs[0].sum_all().unwrap().add(&x.sum_all().unwrap()).unwrap();
    let e = loss.backward().unwrap_err().to_string();
    assert!(e.contains("compiled function's output"), "{e}");
    assert!(x.grad().is_none(), "no gradient accumulated before the error");
    let e = outs[0].backward_with(Some(&outs[0].ones_like().unwrap()), false).unwrap_err().to_string();
    assert!(e.contains("no recorded history"), "{e}");
    // Eager ops on compiled outputs still work (metrics, logging).
    assert_eq!(vals(&outs[0].mul(2.0).unwrap()), vec![2.0, 8.0, 18.0]);
}

#[test]
fn an_operand_sharing_the_written_storage_fails_the_backward() {
    // PyTorch 2.15: `b = a * 1; b.mul_(b); b.sum().backward()` raises "one of the
    // variables needed for gradient computation has been modified by an inplace
    // operation" (the saved `other` is `b` itself); so does an operand viewing the
    // written tensor's storage.
    let a = leaf(&[1.0, 2.0, 3.0], &[3]);
    let b = a.mul(1.0).unwrap();
    b.mul_(&b).unwrap();
    let e = b.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation"), "{e}");
    let c = a.mul(1.0).unwrap();
    let v = c.view(&[3, 1]).unwrap();
    v.mul_(&c.view(&[3, 1]).unwrap()).unwrap();
    let e = c.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation"), "{e}");
    // An operand with a storage of its own is fine.
    let d = a.mul(1.0).unwrap();
    d.mul_(&a).unwrap();
    d.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&a.grad().unwrap()), vec![2.0, 4.0, 6.0]);
}

#[test]
fn a_view_unsqueezed_in_place_under_no_grad_sums_its_gradient_back() {
    // PyTorch 2.15: `x = (l * 1).view(4, 6).as_strided([2, 2], [3, 1], 1)`; under
    // no_grad `x.unsqueeze_(0)`; `(x * 2).sum().backward()` gives `l.grad` 2 at
    // positions 1, 2, 4, 5 (the [1, 2, 2] gradient is summed to the node's [2, 2]).
    let l = leaf(&[0.5; 24], &[24]);
    let x = l.mul(1.0).unwrap().view(&[4, 6]).unwrap().as_strided(&[2, 2], &[3, 1], 1).unwrap();
    no_grad(|| x.unsqueeze_(0)).unwrap();
    assert_eq!(x.sizes().unwrap(), vec![1, 2, 2]);
    x.mul(2.0).unwrap().sum_all().unwrap().backward().unwrap();
    let mut want = vec![0.0; 24];
    for p in [1, 2, 4, 5] {
        want[p] = 2.0;
    }
    assert_eq!(vals(&l.grad().unwrap()), want);
}

#[test]
fn a_view_transposed_in_place_under_no_grad_remakes_its_history_from_its_base() {
    // PyTorch 2.15: `x = (l * 1).view(2, 12)`; under no_grad `x.t_()`; then
    // `(x * arange(24).view(12, 2)).sum().backward()`: x's history is remade from its
    // base (AsStridedBackward0), so `l.grad` is the weights read through x's new
    // layout: [0, 2, 4, ..., 22, 1, 3, ..., 23].
    let l = leaf(&[0.5; 24], &[24]);
    let x = l.mul(1.0).unwrap().view(&[2, 12]).unwrap();
    no_grad(|| x.t_()).unwrap();
    let w = Tensor::arange(0, 24, 1, DType::F64).unwrap().view(&[12, 2]).unwrap();
    x.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let want: Vec<f64> = (0..12).map(|i| 2.0 * i as f64).chain((0..12).map(|i| 2.0 * i as f64 + 1.0)).collect();
    assert_eq!(vals(&l.grad().unwrap()), want);
    // Not a view: the gradient cannot be laid out, as PyTorch refuses ("invalid
    // gradient ... expected shape compatible with [24]").
    let y = l.mul(1.0).unwrap();
    no_grad(|| y.unsqueeze_(0).and_then(|y| y.t_())).unwrap();
    let e = y.mul(2.0).unwrap().sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("invalid gradient") && e.contains("[24]"), "{e}");
}

#[test]
fn a_leaf_reshaped_under_no_grad_gets_its_gradient_broadcast_to_its_new_shape() {
    // PyTorch 2.15: `y = x * arange(6).view(2, 3)`; under no_grad `x.unsqueeze_(0)`;
    // `y.sum().backward()` gives `x.grad` of shape [1, 2, 3] = [[[0, 1, 2], [3, 4, 5]]];
    // with `x.t_()` instead the gradient does not broadcast and backward raises.
    let w = Tensor::arange(0, 6, 1, DType::F64).unwrap().view(&[2, 3]).unwrap();
    let x = leaf(&[1.0; 6], &[2, 3]);
    let y = x.mul(&w).unwrap();
    no_grad(|| x.unsqueeze_(0)).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.sizes().unwrap(), vec![1, 2, 3]);
    assert_eq!(vals(&g), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let x = leaf(&[1.0; 6], &[2, 3]);
    let y = x.mul(&w).unwrap();
    no_grad(|| x.t_()).unwrap();
    let e = y.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("does not broadcast"), "{e}");
}

/// PyTorch 2.15: a view taken under no_grad of a tensor that does not require grad
/// (here a `detach`ed one), or a view of that view, may not be modified in place with
/// an operand requiring grad in grad mode; without such an operand it may.
#[test]
fn a_no_grad_view_of_a_tensor_without_grad_refuses_an_in_place_op_with_a_grad_operand() {
    let y = Tensor::ones(&[3], DType::F64).unwrap().requires_grad(true).unwrap();
    let x = Tensor::ones(&[3], DType::F64).unwrap();
    let v = {
        let _g = NoGradGuard::new();
        x.slice(0, Some(0), None, 1).unwrap()
    };
    let e = v.mul_(&y).unwrap_err().to_string();
    assert!(
        e.contains("A view was created in no_grad mode and is being modified inplace with grad mode enabled"),
        "{e}"
    );
    let w = v.slice(0, Some(0), None, 1).unwrap();
    assert!(w.mul_(&y).unwrap_err().to_string().contains("A view was created in no_grad mode"));
    v.mul_(2.0).unwrap();
    assert_eq!(x.to_vec_f64().unwrap(), vec![2.0; 3]);
    let d = {
        let _g = NoGradGuard::new();
        x.detach().unwrap()
    };
    d.mul_(&y).unwrap();
    assert!(d.is_requires_grad());
}

/// PyTorch 2.15: `tanh`, `exp`, `sigmoid`, `relu`... save their result, so
/// changing it in place (even only its metadata, under no_grad) fails the backward:
/// "... [torch.DoubleTensor [2, 2]], which is output 0 of Tanh, is at version 1;
/// expected version 0 instead". `sin` saves its input, which nothing changed.
#[test]
fn changing_a_saved_result_in_place_fails_the_backward_as_in_pytorch() {
    type Unary = fn(&Tensor) -> aotgrad::trace::Result<Tensor>;
    let cases: [(&str, Unary); 4] =
        [("Tanh", |x| x.tanh()), ("Exp", |x| x.exp()), ("Sigmoid", |x| x.sigmoid()), ("Relu", |x| x.relu())];
    for (name, f) in cases {
        let x = Tensor::from_f64(&[0.1, 0.2, 0.3, 0.4], &[2, 2], DType::F64).unwrap().requires_grad(true).unwrap();
        let y = f(&x).unwrap();
        {
            let _g = NoGradGuard::new();
            y.t_().unwrap();
        }
        let e = y.select(0, 0).unwrap().sum_all().unwrap().backward().expect_err(name).to_string();
        assert!(
            e.contains(&format!("which is output 0 of {name}, is at version 1; expected version 0 instead")),
            "{e}"
        );
    }
    let x = Tensor::from_f64(&[0.1, 0.2, 0.3, 0.4], &[2, 2], DType::F64).unwrap().requires_grad(true).unwrap();
    let y = x.sin().unwrap();
    {
        let _g = NoGradGuard::new();
        y.t_().unwrap();
    }
    y.select(0, 0).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(x.grad().is_some());
}

//! Property test: random programs of views and in-place ops, interleaved with
//! pointwise ops, over 1–3 inputs that may alias each other (views of one base
//! storage, or the same tensor twice), returning a random selection of values. The
//! compiled function must satisfy the whole contract against eager mode, or fail
//! where eager fails (with a user error naming the op eager names, never an internal
//! one). A third call passes inputs of the same metadata that alias less (no shared
//! bases, a new object instead of a duplicate), which must not reuse an entry compiled
//! for the aliased pattern. `PROPTEST_CASES=n` runs more cases.

use crate::contract::{agree, seq, try_check, Outcome, UserFn};
use aotgrad::trace::{DType, Result, Tensor};
use aotgrad::{AotConfig, Arg};
use proptest::prelude::*;
use std::sync::Arc;

/// How one input is made: a recipe applied to a fresh or a shared 24-element base,
/// or the same tensor object as an earlier input.
#[derive(Clone, Debug)]
enum InputSpec {
    /// `recipe` applied to base storage `base` (0 and 1 are shared between inputs,
    /// 2 means a base of its own).
    View { base: u8, recipe: u8 },
    /// The same tensor object as input `of` (an earlier one).
    Dup { of: u8 },
}

const RECIPES: u8 = 12;

fn recipe(base: &Tensor, r: u8) -> Result<Tensor> {
    match r % RECIPES {
        0 => base.view(&[4, 6]),
        1 => base.view(&[4, 6])?.t(),
        2 => base.slice(0, Some(0), None, 2),
        3 => base.slice(0, Some(1), None, 2),
        4 => base.view(&[2, 3, 4])?.select(1, 1),
        5 => base.narrow(0, 6, 12)?.view(&[3, 4]),
        6 => base.as_strided(&[3, 3], &[4, 1], 2),
        7 => base.view(&[4, 6])?.slice(1, Some(1), Some(5), 2),
        8 => Ok(base.clone()),
        9 => base.view(&[6, 4])?.select(1, 0),
        10 => base.narrow(0, 4, 6)?.expand(&[2, 6]),
        _ => base.view(&[4, 6])?.t()?.slice(0, Some(1), Some(4), 2),
    }
}

/// The inputs `specs` describe; with `unaliased`, inputs of the same metadata that
/// alias each other less: every view gets a base of its own, and a duplicate is a new
/// tensor object (an `alias`) of the input it repeats.
fn build_inputs(specs: &[InputSpec], unaliased: bool) -> Vec<Arg> {
    let shared = [seq(&[24], 0.0), seq(&[24], 100.0)];
    let mut out: Vec<Tensor> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let t = match s {
            InputSpec::Dup { of } if i > 0 && unaliased => out[*of as usize % i].alias().expect("alias"),
            InputSpec::Dup { of } if i > 0 => out[*of as usize % i].clone(),
            InputSpec::Dup { .. } => seq(&[4, 6], 0.0),
            InputSpec::View { base, recipe: r } => {
                let b = match base % 3 {
                    _ if unaliased => seq(&[24], 200.0 + 30.0 * i as f64),
                    2 => seq(&[24], 200.0 + 30.0 * i as f64),
                    k => shared[k as usize].clone(),
                };
                recipe(&b, *r).expect("input recipes are valid")
            }
        };
        out.push(t);
    }
    out.into_iter().map(Arg::Tensor).collect()
}

/// A view op, with parameters taken modulo the actual sizes.
#[derive(Clone, Debug)]
enum ViewKind {
    Flatten,
    Reshape(u8),
    T,
    Transpose(u8, u8),
    Permute(u8),
    Slice { dim: u8, start: u8, len: u8, step: u8 },
    Select { dim: u8, index: u8 },
    Unsqueeze(u8),
    Squeeze,
    Expand,
    AsStrided { start: u8, size: u8, stride: u8 },
    Alias,
    Detach,
}

#[derive(Clone, Debug)]
enum Mutation {
    AddScalar(i8),
    MulScalar(i8),
    AddTensor(u8),
    CopyFrom(u8),
    Zero,
    Fill(i8),
    T,
    Unsqueeze(u8),
    Transpose(u8, u8),
    Squeeze,
    /// `as_strided_` with the parameters of [`ViewKind::AsStrided`].
    AsStrided {
        start: u8,
        size: u8,
        stride: u8,
    },
}

#[derive(Clone, Debug)]
enum Step {
    View(u8, ViewKind),
    Mutate(u8, Mutation),
    Add(u8, u8),
    Mul(u8, i8),
    Neg(u8),
    /// Convert to f64, i64 or f32 (fresh storage).
    To(u8, u8),
}

#[derive(Clone, Debug)]
struct Program {
    steps: Vec<Step>,
    outputs: Vec<u8>,
}

/// Value `k`: one of the three latest for `k < 128` (programs mostly work on what
/// they just made), else any.
fn pick(vals: &[Tensor], k: u8) -> &Tensor {
    let n = vals.len();
    if k < 128 {
        &vals[n - 1 - (k as usize % n.min(3))]
    } else {
        &vals[k as usize % n]
    }
}

fn dim(t: &Tensor, d: u8) -> usize {
    d as usize % t.dim().max(1)
}

/// A value with `t`'s shape, searching from `k`, if there is one.
fn same_shape<'a>(vals: &'a [Tensor], t: &Tensor, k: u8) -> Option<&'a Tensor> {
    let n = vals.len();
    (0..n).map(|i| &vals[(k as usize + i) % n]).find(|v| v.shape() == t.shape())
}

/// 1-D `as_strided` parameters that stay within the storage elements between the
/// first and the last one `t` reaches (so they are in bounds in both worlds).
fn strided_within(t: &Tensor, start: u8, size: u8, stride: u8) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    let m = t.meta();
    let layout = aotgrad::meta::Layout::new(
        t.sizes()?,
        m.concrete_strides().unwrap_or_default(),
        m.concrete_offset().unwrap_or(0),
    );
    let Some((lo, hi)) = layout.range().ok().flatten() else {
        return Ok((vec![0], vec![1], layout.offset));
    };
    let off = lo + start as usize % (hi - lo + 1);
    let stride = stride as usize % 3;
    let room = hi - off;
    let n = match stride {
        0 => 1 + size as usize % 3,
        s => 1 + size as usize % (room / s + 1),
    };
    Ok((vec![n], vec![stride], off))
}

fn view(t: &Tensor, kind: &ViewKind) -> Result<Tensor> {
    let sizes = t.sizes()?;
    let rank = sizes.len();
    match kind {
        ViewKind::Flatten => t.reshape(&[-1]),
        ViewKind::Reshape(k) if sizes.iter().product::<usize>() > 0 => {
            let n: usize = sizes.iter().product();
            let divisors: Vec<usize> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
            let d = divisors[*k as usize % divisors.len()];
            t.reshape(&[d as i64, -1])
        }
        ViewKind::T if rank <= 2 => t.t(),
        ViewKind::Transpose(a, b) if rank > 0 => t.transpose(dim(t, *a) as i64, dim(t, *b) as i64),
        ViewKind::Permute(k) if rank > 0 => {
            let mut p: Vec<i64> = (0..rank as i64).collect();
            p.rotate_left(*k as usize % rank);
            if k % 2 == 1 {
                p.reverse();
            }
            t.permute(&p)
        }
        ViewKind::Slice { dim: d, start, len, step } if rank > 0 => {
            let d = dim(t, *d);
            let size = sizes[d] as i64;
            let s = *start as i64 % (size + 1);
            t.slice(d as i64, Some(s), Some(s + *len as i64 % (size + 1)), 1 + *step as i64 % 3)
        }
        ViewKind::Select { dim: d, index } if rank > 0 && sizes.iter().all(|&s| s > 0) => {
            let d = dim(t, *d);
            t.select(d as i64, *index as i64 % sizes[d] as i64)
        }
        ViewKind::Unsqueeze(d) => t.unsqueeze((*d as usize % (rank + 1)) as i64),
        ViewKind::Squeeze => t.squeeze(),
        ViewKind::Expand => {
            let mut shape: Vec<i64> = vec![2];
            shape.extend(sizes.iter().map(|&s| if s == 1 { 3 } else { s as i64 }));
            t.expand(&shape)
        }
        ViewKind::AsStrided { start, size, stride } => {
            let (size, stride, off) = strided_within(t, *start, *size, *stride)?;
            t.as_strided(&size, &stride, off)
        }
        ViewKind::Detach => t.detach(),
        _ => t.alias(),
    }
}

fn mutate(vals: &[Tensor], t: &Tensor, m: &Mutation) -> Result<()> {
    let rank = t.dim();
    match m {
        Mutation::AddScalar(k) => t.add_(*k as f64)?,
        Mutation::MulScalar(k) => t.mul_((*k % 3) as f64)?,
        Mutation::AddTensor(k) => match same_shape(vals, t, *k) {
            Some(o) => t.add_(o)?,
            None => t.add_(1.0)?,
        },
        Mutation::CopyFrom(k) => match same_shape(vals, t, *k) {
            Some(o) => t.copy_(&o.mul(-1)?)?,
            None => t.fill_(-1.0)?,
        },
        Mutation::Zero => t.zero_()?,
        Mutation::Fill(k) => t.fill_(*k as f64)?,
        Mutation::T if rank <= 2 => t.t_()?,
        Mutation::Unsqueeze(d) => t.unsqueeze_((*d as usize % (rank + 1)) as i64)?,
        Mutation::Transpose(a, b) if rank > 0 => t.transpose_(dim(t, *a) as i64, dim(t, *b) as i64)?,
        Mutation::Squeeze => t.squeeze_()?,
        Mutation::AsStrided { start, size, stride } => {
            let (size, stride, off) = strided_within(t, *start, *size, *stride)?;
            t.as_strided_(&size, &stride, off)?
        }
        _ => t.add_(2.0)?,
    };
    Ok(())
}

fn run(p: &Program, args: &[Arg]) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = args.iter().filter_map(Arg::tensor).cloned().collect();
    for s in &p.steps {
        match s {
            Step::View(k, kind) => {
                let v = view(pick(&vals, *k), kind)?;
                vals.push(v);
            }
            Step::Mutate(k, m) => {
                let t = pick(&vals, *k).clone();
                mutate(&vals, &t, m)?;
            }
            Step::Add(a, b) => {
                let x = pick(&vals, *a);
                let v = match same_shape(&vals, x, *b) {
                    Some(y) => x.add(y)?,
                    None => x.add(0.5)?,
                };
                vals.push(v);
            }
            Step::Mul(a, k) => {
                let v = pick(&vals, *a).mul(*k as f64)?;
                vals.push(v);
            }
            Step::Neg(a) => {
                let v = pick(&vals, *a).neg()?;
                vals.push(v);
            }
            Step::To(a, d) => {
                // The wgpu backend has no f64 (WGSL): f16 takes its place there.
                let wide = if aotgrad::default_backend().0.name() == "wgpu" { DType::F16 } else { DType::F64 };
                let dtype = [wide, DType::I64, DType::F32][*d as usize % 3];
                let v = pick(&vals, *a).to(dtype)?;
                vals.push(v);
            }
        }
    }
    Ok(p.outputs.iter().map(|&k| pick(&vals, k).clone()).collect())
}

fn view_kind() -> impl Strategy<Value = ViewKind> {
    prop_oneof![
        Just(ViewKind::Flatten),
        any::<u8>().prop_map(ViewKind::Reshape),
        Just(ViewKind::T),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| ViewKind::Transpose(a, b)),
        any::<u8>().prop_map(ViewKind::Permute),
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(dim, start, len, step)| ViewKind::Slice {
            dim,
            start,
            len,
            step
        }),
        (any::<u8>(), any::<u8>()).prop_map(|(dim, index)| ViewKind::Select { dim, index }),
        any::<u8>().prop_map(ViewKind::Unsqueeze),
        Just(ViewKind::Squeeze),
        Just(ViewKind::Expand),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(start, size, stride)| ViewKind::AsStrided {
            start,
            size,
            stride
        }),
        Just(ViewKind::Alias),
        Just(ViewKind::Detach),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<i8>().prop_map(Mutation::AddScalar),
        any::<i8>().prop_map(Mutation::MulScalar),
        any::<u8>().prop_map(Mutation::AddTensor),
        any::<u8>().prop_map(Mutation::CopyFrom),
        Just(Mutation::Zero),
        any::<i8>().prop_map(Mutation::Fill),
        Just(Mutation::T),
        any::<u8>().prop_map(Mutation::Unsqueeze),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Mutation::Transpose(a, b)),
        Just(Mutation::Squeeze),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(start, size, stride)| Mutation::AsStrided {
            start,
            size,
            stride
        }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<u8>(), view_kind()).prop_map(|(k, v)| Step::View(k, v)),
        4 => (any::<u8>(), mutation()).prop_map(|(k, m)| Step::Mutate(k, m)),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Step::Add(a, b)),
        1 => (any::<u8>(), -3i8..4).prop_map(|(a, k)| Step::Mul(a, k)),
        1 => any::<u8>().prop_map(Step::Neg),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, d)| Step::To(a, d)),
    ]
}

fn input_spec() -> impl Strategy<Value = InputSpec> {
    prop_oneof![
        4 => (0u8..3, 0..RECIPES).prop_map(|(base, recipe)| InputSpec::View { base, recipe }),
        1 => any::<u8>().prop_map(|of| InputSpec::Dup { of }),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    (proptest::collection::vec(step(), 1..12), proptest::collection::vec(any::<u8>(), 0..4))
        .prop_map(|(steps, outputs)| Program { steps, outputs })
}

/// 64 cases by default (`PROPTEST_CASES=n` for more); failures are not persisted:
/// each bug found becomes a named test in `edge.rs`.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn random_programs_satisfy_the_contract(
        inputs in proptest::collection::vec(input_spec(), 1..4),
        prog in program(),
        keep in any::<bool>(),
    ) {
        let p = Arc::new(prog.clone());
        let f: UserFn = Arc::new(move |a: &[Arg]| Ok(run(&p, a)?));
        let specs = inputs.clone();
        let config = AotConfig { keep_inference_input_mutations: keep, ..AotConfig::default() };
        let built = specs.clone();
        match try_check(f.clone(), &move || build_inputs(&built, false), config) {
            Ok(Outcome::Agree(checked)) => {
                if std::env::var("PROP_STATS").is_ok() { eprintln!("AGREE"); }
                // The same metadata with less aliasing (and a new object for a
                // duplicate): the compiled function must not reuse an entry it
                // does not fit (a new one may be compiled), and still agree.
                let unaliased = move || build_inputs(&specs, true);
                if let Err(v) = agree(&checked.compiled, &f, &unaliased, true) {
                    prop_assert!(false, "unaliased call: {}\ninputs: {:?}\nprogram: {:#?}", v, inputs, prog);
                }
            }
            Ok(Outcome::BothFailed { eager, .. }) => {
                if std::env::var("PROP_STATS").is_ok() { eprintln!("FAIL {eager}"); }
            }
            Err(v) => prop_assert!(false, "{}\ninputs: {:?}\nprogram: {:#?}", v, inputs, prog),
        }
    }
}

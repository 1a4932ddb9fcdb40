//! Random training programs against both oracles: views of views, in-place ops
//! through views, metadata mutation, no_grad regions, `detach`, over arguments that
//! are leaves, non-leaf views of shared bases (aliasing) or the same tensor twice,
//! with in-place ops on the outputs after the call (the checker's (d)). Each program
//! runs through the whole training contract ([`try_check`]): values, metadata,
//! storage, flags and aliasing against eager mode, gradients against central finite
//! differences and against eager autograd; a call eager refuses must be refused by
//! the compiled function too.
//!
//! `TRAIN_PROGRAMS=n` runs `n` programs (default 48; development runs use many more)
//! from seed `TRAIN_PROGRAMS_SEED` (default 0); `TRAIN_PROGRAMS_STATS=1` prints the
//! outcome counts.

use crate::checker::{leaf, rand_vals, tensor, try_check, Grads, Outcome, UserFn, EAGER_BACKWARD_ERRORS};
use aotgrad::trace::{NoGradGuard, Tensor};
use aotgrad::{AotConfig, Arg};
use std::sync::Arc;

/// SplitMix64 over one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How one argument is made.
#[derive(Clone, Copy, Debug)]
enum ArgSpec {
    /// A `[4, 6]` leaf that requires grad.
    Leaf,
    /// `recipe` of base `base` (0 and 1 are shared between arguments, 2 is a base of
    /// its own); the base is a non-leaf (`leaf * 1`), so the view may be mutated.
    View { base: u64, recipe: u64 },
    /// Data that does not require grad.
    Data,
    /// The same tensor object as an earlier argument.
    Dup { of: u64 },
}

/// One step of a program, over the values made so far (arguments first).
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A pointwise op of value `a`.
    Unary { a: u64, op: u64 },
    /// `a (op) sum(b)`: always broadcastable.
    WithSum { a: u64, b: u64, op: u64 },
    /// A view of value `a`.
    View { a: u64, recipe: u64 },
    /// An in-place op on value `a` (with `b` as its operand, through a sum).
    InPlace { a: u64, b: u64, op: u64 },
    /// An in-place metadata op on value `a`.
    Meta { a: u64, op: u64 },
    /// `detach()` of value `a`.
    Detach { a: u64 },
    /// The next step runs under no_grad.
    NoGrad,
}

#[derive(Clone, Debug)]
struct Program {
    args: Vec<ArgSpec>,
    steps: Vec<Step>,
    outputs: Vec<u64>,
}

fn generate(seed: u64) -> Program {
    let mut r = Rng(seed);
    let n_args = 1 + r.below(3);
    let args = (0..n_args)
        .map(|_| match r.below(8) {
            0 | 1 => ArgSpec::Leaf,
            2 => ArgSpec::Data,
            3 => ArgSpec::Dup { of: r.next() },
            _ => ArgSpec::View { base: r.below(3), recipe: r.below(RECIPES) },
        })
        .collect::<Vec<_>>();
    // The training path needs an argument that requires grad.
    let mut args = args;
    if args.iter().all(|a| matches!(a, ArgSpec::Data | ArgSpec::Dup { .. })) {
        args[0] = ArgSpec::Leaf;
    }
    let n_steps = 1 + r.below(8);
    let steps = (0..n_steps)
        .map(|_| match r.below(16) {
            0..=2 => Step::Unary { a: r.next(), op: r.below(4) },
            3..=4 => Step::WithSum { a: r.next(), b: r.next(), op: r.below(3) },
            5..=8 => Step::View { a: r.next(), recipe: r.below(RECIPES) },
            9..=11 => Step::InPlace { a: r.next(), b: r.next(), op: r.below(4) },
            12 => Step::Meta { a: r.next(), op: r.below(3) },
            13 => Step::Detach { a: r.next() },
            _ => Step::NoGrad,
        })
        .collect();
    let outputs = (0..1 + r.below(3)).map(|_| r.next()).collect();
    Program { args, steps, outputs }
}

const RECIPES: u64 = 10;

/// A view of `x` (any shape: recipes that do not fit are refused as in eager). The
/// `as_strided` recipes stay within the elements `x` views: one that reaches other
/// storage elements gives them a gradient eagerly, which the compiled backward (per
/// argument, as AOTAutograd's) cannot return.
fn view(x: &Tensor, recipe: u64) -> aotgrad::Result<Tensor> {
    if recipe % RECIPES == 7 {
        let conc =
            |d: &[aotgrad::ir::Dim]| -> Vec<usize> { d.iter().map(|d| d.as_const().unwrap_or(0) as usize).collect() };
        let (size, stride) = (conc(&x.shape()), conc(&x.strides()));
        let offset = x.storage_offset().as_const().unwrap_or(0) as usize;
        // `x` again through `as_strided`, then its first row.
        let y = x.as_strided(&size, &stride, offset)?;
        return if size.is_empty() { Ok(y) } else { Ok(y.narrow(0, 0, 1)?) };
    }
    view_any(x, recipe)
}

/// A view of `x`, `as_strided` in storage coordinates included (for arguments, made
/// from whole bases).
fn view_any(x: &Tensor, recipe: u64) -> aotgrad::Result<Tensor> {
    let rank = x.shape().len() as i64;
    Ok(match recipe % RECIPES {
        0 if rank == 2 => x.t()?,
        0 => x.unsqueeze(0)?,
        1 => x.view(&[-1])?,
        2 => x.slice(0, Some(0), None, 2)?,
        3 => x.select(0, 0)?,
        4 => x.unsqueeze(-1)?,
        5 if rank >= 2 => x.transpose(0, rank - 1)?.slice(0, Some(1), None, 1)?,
        5 => x.narrow(0, 0, 1)?,
        6 => x.view(&[2, -1])?,
        7 => x.as_strided(&[2, 2], &[3, 1], 1)?,
        8 => x.alias()?,
        _ => x.narrow(0, 1, 2)?,
    })
}

fn base_values(k: u64) -> Tensor {
    Tensor::from_f64(&rand_vals(24, 500 + k), &[24], crate::checker::float_dtype()).expect("base")
}

fn build_args(specs: &[ArgSpec]) -> Vec<Arg> {
    let shared: Vec<Tensor> = (0..2).map(|k| base_values(k).requires_grad(true).unwrap().mul(1.0).unwrap()).collect();
    let mut out: Vec<Tensor> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let t = match *s {
            ArgSpec::Leaf => leaf(&[4, 6], 40 + i as u64),
            ArgSpec::Data => crate::checker::data(&[4, 6], 60 + i as u64),
            ArgSpec::Dup { of } if i > 0 => out[of as usize % i].clone(),
            ArgSpec::Dup { .. } => leaf(&[4, 6], 80),
            ArgSpec::View { base, recipe } => {
                let b = match base {
                    0 | 1 => shared[base as usize].clone(),
                    _ => base_values(10 + i as u64).requires_grad(true).unwrap().mul(1.0).unwrap(),
                };
                let b = b.view(&[4, 6]).unwrap();
                view_any(&b, recipe).unwrap_or(b)
            }
        };
        out.push(t);
    }
    out.into_iter().map(Arg::Tensor).collect()
}

fn run(p: &Program, args: &[Arg]) -> aotgrad::Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> =
        args.iter().map(tensor).collect::<aotgrad::Result<Vec<_>>>()?.into_iter().cloned().collect();
    let pick = |vals: &[Tensor], k: u64| vals[k as usize % vals.len()].clone();
    let mut no_grad = false;
    for step in &p.steps {
        let _guard = std::mem::take(&mut no_grad).then(NoGradGuard::new);
        match *step {
            Step::Unary { a, op } => {
                let x = pick(&vals, a);
                vals.push(match op {
                    0 => x.tanh()?,
                    1 => x.sin()?,
                    2 => x.mul(1.5)?,
                    _ => x.mul(&x)?,
                });
            }
            Step::WithSum { a, b, op } => {
                let (x, s) = (pick(&vals, a), pick(&vals, b).sum_all()?.mul(0.1)?);
                vals.push(match op {
                    0 => x.add(&s)?,
                    1 => x.mul(&s)?,
                    _ => x.sub(&s)?,
                });
            }
            Step::View { a, recipe } => {
                let v = view(&pick(&vals, a), recipe)?;
                vals.push(v);
            }
            Step::InPlace { a, b, op } => {
                let x = pick(&vals, a);
                match op {
                    0 => x.add_(0.5)?,
                    1 => x.mul_(&pick(&vals, b).sum_all()?.mul(0.1)?)?,
                    2 => x.tanh_()?,
                    _ => x.mul_(&x)?,
                };
            }
            Step::Meta { a, op } => {
                let x = pick(&vals, a);
                match op {
                    0 => x.t_()?,
                    1 => x.unsqueeze_(0)?,
                    _ => x.squeeze_()?,
                };
            }
            Step::Detach { a } => {
                let d = pick(&vals, a).detach()?;
                vals.push(d);
            }
            Step::NoGrad => no_grad = true,
        }
    }
    Ok(p.outputs.iter().map(|&k| pick(&vals, k)).collect())
}

/// The program as pseudo-code over numbered values (`v0..` are the arguments), for
/// failure messages.
fn describe(p: &Program) -> String {
    let mut out = String::new();
    for (i, a) in p.args.iter().enumerate() {
        let a = match *a {
            ArgSpec::Dup { of } if i > 0 => ArgSpec::Dup { of: of % i as u64 },
            a => a,
        };
        out.push_str(&format!("v{i} = argument {a:?}\n"));
    }
    let mut n = p.args.len() as u64;
    let mut no_grad = "";
    for step in &p.steps {
        let v = |k: u64| format!("v{}", k % n);
        let g = std::mem::take(&mut no_grad);
        let line = match *step {
            Step::Unary { a, op } => {
                format!("v{n} = {}", ["tanh(x)", "sin(x)", "x * 1.5", "x * x"][op as usize].replace('x', &v(a)))
            }
            Step::WithSum { a, b, op } => {
                format!("v{n} = {} {} 0.1 * sum({})", v(a), ["+", "*", "-"][op.min(2) as usize], v(b))
            }
            Step::View { a, recipe } => format!("v{n} = view#{}({})", recipe % RECIPES, v(a)),
            Step::InPlace { a, b, op } => match op {
                0 => format!("{}.add_(0.5)", v(a)),
                1 => format!("{}.mul_(0.1 * sum({}))", v(a), v(b)),
                2 => format!("{}.tanh_()", v(a)),
                _ => format!("{0}.mul_({0})", v(a)),
            },
            Step::Meta { a, op } => format!("{}.{}()", v(a), ["t_", "unsqueeze_0", "squeeze_"][op.min(2) as usize]),
            Step::Detach { a } => format!("v{n} = {}.detach()", v(a)),
            Step::NoGrad => {
                no_grad = "no_grad: ";
                continue;
            }
        };
        if matches!(step, Step::Unary { .. } | Step::WithSum { .. } | Step::View { .. } | Step::Detach { .. }) {
            n += 1;
        }
        out.push_str(&format!("{g}{line}\n"));
    }
    let outs: Vec<String> = p.outputs.iter().map(|k| format!("v{}", k % n)).collect();
    out.push_str(&format!("return ({})", outs.join(", ")));
    out
}

#[test]
fn random_training_programs_agree_with_eager_autograd_and_finite_differences() {
    let n: u64 = std::env::var("TRAIN_PROGRAMS").ok().and_then(|s| s.parse().ok()).unwrap_or(48);
    let first: u64 = std::env::var("TRAIN_PROGRAMS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut agree, mut refuse, mut eager_backward, mut both_backward) = (0, 0, 0, 0);
    let mut eager_only: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();

    // Programs that once found a bug (each fixed at its mechanism), run every time.
    const FOUND: [u64; 26] = [
        10607, 12523, 16090, 16524, 17702, 32615, 35345, 36331, 46215, 100, 955, 1398, 5512, 6804, 7641, 10717, 11367,
        28922, 43745, 57696, 149, 8213, 8813, 16274, 64651, 91361,
    ];
    for seed in (first..first + n).chain(FOUND) {
        let p = Arc::new(generate(seed));
        let pp = p.clone();
        let f: UserFn = Arc::new(move |a: &[Arg]| run(&pp, a));
        let specs = p.args.clone();
        // Values made under no_grad or detached hide part of the function from
        // autograd: there eager autograd is the only gradient oracle.
        let hidden = p.steps.iter().any(|s| matches!(s, Step::NoGrad | Step::Detach { .. }));
        let grads = if hidden { Grads::EagerAutograd } else { Grads::FiniteDifferences };
        match try_check(f, &move || build_args(&specs), AotConfig::default().threads(1).no_cache(), grads) {
            Ok(Outcome::Agree) => agree += 1,
            Ok(Outcome::BothRefuse) => refuse += 1,
            Ok(Outcome::EagerBackwardRefuses(why)) => {
                // The compiled backward decides PyTorch's backward checks (saved values,
                // gradient shapes) when it compiles: only eager's refusing is a failure.
                if EAGER_BACKWARD_ERRORS.iter().any(|m| why.contains(m)) {
                    panic!("program {seed}: only eager's backward refuses: {why}\n{}", describe(&p));
                }
                eager_backward += 1;
                let why = EAGER_BACKWARD_ERRORS.iter().find(|m| why.contains(*m)).copied().unwrap_or("other");
                *eager_only.entry(why).or_insert(0) += 1;
            }
            Ok(Outcome::BothBackwardRefuse) => both_backward += 1,
            Err(e) => panic!("program {seed}: {e}\n{}", describe(&p)),
        }
    }
    if std::env::var("TRAIN_PROGRAMS_STATS").is_ok() {
        eprintln!(
            "{n} programs: {agree} agree, {refuse} refused by both, {both_backward} backward refused by both, \
             {eager_backward} refused by eager's backward only"
        );
        for (why, count) in &eager_only {
            eprintln!("  eager's backward only: {count} × {why}");
        }
    }
    assert!(agree >= n / 4, "too few programs ran in both worlds: {agree} of {n}");
}

//! ATen ops on aotgrad tensors: one function per op overload, looked up by the
//! node's target (`aten.linear.default`).
//!
//! Each op is written with aotgrad's own `Tensor` methods, so the same code runs
//! eagerly (real kernels and eager autograd) and under a trace (the compiler sees
//! aotgrad's ops, functionalizes in-place and view ops, differentiates with its one
//! derivative rule set). In-place ATen ops (`relu_`, `add_`, `hardswish_`, ...) mutate
//! their `self` as PyTorch does: aotgrad's in-place op where it has one, else the
//! out-of-place result copied into `self` (`copy_`), which functionalization and
//! autograd treat exactly like any in-place write. View ops return aotgrad views.

use crate::archive::scalar_type;
use crate::schema::{Arg, Node, SymRef};
use aotgrad_ir::{BinaryOp, CmpOp, DType, Op, Scalar, SourceLoc};
use aotgrad_trace::{no_grad, Conv2dOpts, Rhs, RngSeed, Tensor};
use std::collections::HashMap;

/// A value the interpreter binds a name to.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// A tensor.
    Tensor(Tensor),
    /// A (symbolic-size) integer.
    Int(i64),
    /// An output aotgrad does not compute (checked unused when the module loads).
    Unavailable,
}

type R<T> = Result<T, String>;

/// An op's implementation.
pub(crate) type OpFn = fn(&Call<'_>) -> R<Vec<Value>>;

/// An op aotgrad runs: its function, and the outputs it does not compute.
pub(crate) struct OpDef {
    pub run: OpFn,
    /// Output positions left [`Value::Unavailable`] (e.g. `max_pool2d_with_indices`'s
    /// indices): a program reading one is refused when it loads.
    pub unavailable: &'static [usize],
}

/// One node's call: its arguments resolved against the environment.
pub(crate) struct Call<'a> {
    pub node: &'a Node,
    pub env: &'a HashMap<String, Value>,
}

fn err(e: aotgrad_trace::Error) -> String {
    e.to_string()
}

fn one(t: aotgrad_trace::Result<Tensor>) -> R<Vec<Value>> {
    Ok(vec![Value::Tensor(t.map_err(err)?)])
}

impl Call<'_> {
    fn arg(&self, name: &str) -> Option<&Arg> {
        self.node.inputs.iter().find(|a| a.name == name).map(|a| &a.arg)
    }

    fn lookup(&self, name: &str) -> R<&Value> {
        self.env.get(name).ok_or_else(|| format!("value `{name}` is used before it is defined"))
    }

    fn tensor_named(&self, name: &str) -> R<Tensor> {
        match self.lookup(name)? {
            Value::Tensor(t) => Ok(t.clone()),
            Value::Int(_) => Err(format!("value `{name}` is an integer, the op needs a tensor")),
            Value::Unavailable => Err(format!("value `{name}` is an output aotgrad does not compute")),
        }
    }

    fn int_named(&self, name: &str) -> R<i64> {
        match self.lookup(name)? {
            Value::Int(i) => Ok(*i),
            _ => Err(format!("value `{name}` is not an integer")),
        }
    }

    /// A required tensor argument.
    pub fn tensor(&self, name: &str) -> R<Tensor> {
        match self.arg(name) {
            Some(Arg::Tensor(n)) => self.tensor_named(n),
            Some(a) => Err(format!("argument `{name}` is {}, expected a tensor", a.kind())),
            None => Err(format!("no argument `{name}`")),
        }
    }

    /// An optional tensor argument (`None` when absent or `None`).
    pub fn opt_tensor(&self, name: &str) -> R<Option<Tensor>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(_) => self.tensor(name).map(Some),
        }
    }

    /// A list of tensors.
    pub fn tensors(&self, name: &str) -> R<Vec<Tensor>> {
        match self.arg(name) {
            Some(Arg::Tensors(ns)) => ns.iter().map(|n| self.tensor_named(n)).collect(),
            Some(Arg::OptionalTensors(ns)) => ns
                .iter()
                .map(|n| {
                    n.as_ref()
                        .ok_or_else(|| format!("argument `{name}` holds a None"))
                        .and_then(|n| self.tensor_named(n))
                })
                .collect(),
            Some(a) => Err(format!("argument `{name}` is {}, expected a list of tensors", a.kind())),
            None => Err(format!("no argument `{name}`")),
        }
    }

    fn opt_int(&self, name: &str) -> R<Option<i64>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Int(i)) => Ok(Some(*i)),
            Some(Arg::SymInt(SymRef::Name(n))) => self.int_named(n).map(Some),
            Some(Arg::SymInt(SymRef::Int(i))) => Ok(Some(*i)),
            Some(Arg::Bool(b)) => Ok(Some(i64::from(*b))),
            Some(a) => Err(format!("argument `{name}` is {}, expected an integer", a.kind())),
        }
    }

    /// A required integer.
    pub fn int(&self, name: &str) -> R<i64> {
        self.opt_int(name)?.ok_or_else(|| format!("no argument `{name}`"))
    }

    /// An integer with its schema default.
    pub fn int_or(&self, name: &str, default: i64) -> R<i64> {
        Ok(self.opt_int(name)?.unwrap_or(default))
    }

    /// A list of integers (a single integer is a list of one; `None` or absent is
    /// `None`).
    pub fn opt_ints(&self, name: &str) -> R<Option<Vec<i64>>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Ints(v)) => Ok(Some(v.clone())),
            Some(Arg::Int(i)) => Ok(Some(vec![*i])),
            Some(Arg::SymInt(SymRef::Name(n))) => Ok(Some(vec![self.int_named(n)?])),
            Some(Arg::SymInts(v)) => v
                .iter()
                .map(|s| match s {
                    SymRef::Int(i) => Ok(*i),
                    SymRef::Name(n) => self.int_named(n),
                })
                .collect::<R<Vec<_>>>()
                .map(Some),
            Some(a) => Err(format!("argument `{name}` is {}, expected a list of integers", a.kind())),
        }
    }

    /// A required list of integers.
    pub fn ints(&self, name: &str) -> R<Vec<i64>> {
        self.opt_ints(name)?.ok_or_else(|| format!("no argument `{name}`"))
    }

    /// A list of integers with its default.
    pub fn ints_or(&self, name: &str, default: &[i64]) -> R<Vec<i64>> {
        Ok(self.opt_ints(name)?.unwrap_or_else(|| default.to_vec()))
    }

    fn opt_float(&self, name: &str) -> R<Option<f64>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Float(f)) => Ok(Some(*f)),
            Some(Arg::Int(i)) => Ok(Some(*i as f64)),
            Some(Arg::SymInt(SymRef::Name(n))) => Ok(Some(self.int_named(n)? as f64)),
            Some(a) => Err(format!("argument `{name}` is {}, expected a number", a.kind())),
        }
    }

    /// A number with its default.
    pub fn float_or(&self, name: &str, default: f64) -> R<f64> {
        Ok(self.opt_float(name)?.unwrap_or(default))
    }

    /// A bool with its default.
    pub fn bool_or(&self, name: &str, default: bool) -> R<bool> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(default),
            Some(Arg::Bool(b)) => Ok(*b),
            Some(Arg::Int(i)) => Ok(*i != 0),
            Some(a) => Err(format!("argument `{name}` is {}, expected a bool", a.kind())),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, name: &str) -> R<Option<String>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Str(s)) => Ok(Some(s.clone())),
            Some(a) => Err(format!("argument `{name}` is {}, expected a string", a.kind())),
        }
    }

    /// An optional dtype.
    pub fn dtype(&self, name: &str) -> R<Option<DType>> {
        match self.arg(name) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::ScalarType(c)) => scalar_type(*c).map(Some).map_err(|e| format!("dtype {e} is not supported")),
            Some(a) => Err(format!("argument `{name}` is {}, expected a dtype", a.kind())),
        }
    }

    /// A scalar argument (`Scalar` in the op schema).
    pub fn scalar(&self, name: &str) -> R<Scalar> {
        match self.arg(name) {
            Some(Arg::Int(i)) => Ok(Scalar::Int(*i)),
            Some(Arg::Float(f)) => Ok(Scalar::Float(*f)),
            Some(Arg::Bool(b)) => Ok(Scalar::Bool(*b)),
            Some(Arg::SymInt(SymRef::Name(n))) => Ok(Scalar::Int(self.int_named(n)?)),
            Some(a) => Err(format!("argument `{name}` is {}, expected a number", a.kind())),
            None => Err(format!("no argument `{name}`")),
        }
    }

    /// A tensor or a scalar (the `other` of a binary op).
    fn operand(&self, name: &str) -> R<Operand> {
        match self.arg(name) {
            Some(Arg::Tensor(_)) => Ok(Operand::Tensor(self.tensor(name)?)),
            _ => Ok(Operand::Scalar(self.scalar(name)?)),
        }
    }

    /// A memory format that only changes strides is fine; anything else is not.
    fn check_memory_format(&self) -> R<()> {
        match self.arg("memory_format") {
            // 0 unknown, 1 contiguous, 2 channels_last, 3 channels_last_3d, 4
            // preserve: values are the same under every one; aotgrad keeps its own
            // layouts.
            None | Some(Arg::None) | Some(Arg::MemoryFormat(0..=4)) => Ok(()),
            Some(a) => Err(format!("memory format {a:?} is not supported")),
        }
    }
}

enum Operand {
    Tensor(Tensor),
    Scalar(Scalar),
}

impl Operand {
    fn rhs(&self) -> Rhs<'_> {
        match self {
            Operand::Tensor(t) => Rhs::Tensor(t),
            Operand::Scalar(s) => Rhs::Scalar(*s),
        }
    }
    fn scaled(self, alpha: Scalar) -> R<Operand> {
        if alpha == Scalar::Int(1) || alpha == Scalar::Float(1.0) {
            return Ok(self);
        }
        Ok(match self {
            Operand::Tensor(t) => Operand::Tensor(t.mul(alpha).map_err(err)?),
            Operand::Scalar(s) => Operand::Scalar(match (s, alpha) {
                (Scalar::Int(a), Scalar::Int(b)) => {
                    Scalar::Int(a.checked_mul(b).ok_or("alpha times the operand overflows")?)
                }
                (s, alpha) => Scalar::Float(s.to_f64() * alpha.to_f64()),
            }),
        })
    }
}

/// Wrap a possibly negative dim.
fn wrap(dim: i64, rank: usize) -> R<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if (0..r).contains(&d) {
        Ok(d as usize)
    } else {
        Err(format!("dim {dim} is out of range for a tensor of rank {rank}"))
    }
}

fn sizes(t: &Tensor) -> R<Vec<usize>> {
    t.sizes().map_err(err)
}

fn pair(v: &[i64], what: &str) -> R<[usize; 2]> {
    let ok = |x: i64| usize::try_from(x).map_err(|_| format!("{what} {x} is negative"));
    match v {
        [a] => Ok([ok(*a)?, ok(*a)?]),
        [a, b] => Ok([ok(*a)?, ok(*b)?]),
        _ => Err(format!("{what} {v:?}: expected one or two numbers")),
    }
}

/// Apply `f` out of place to a copy of `self`, then write the result into `self`
/// (PyTorch's in-place semantics through aotgrad's `copy_`). `f` may also ignore its
/// argument and read `self` through the call (as `masked_fill_` does: its result
/// does not depend on the old value where it writes).
fn inplace(c: &Call<'_>, f: impl Fn(&Tensor) -> R<Tensor>) -> R<Vec<Value>> {
    let s = c.tensor("self").or_else(|_| c.tensor("input"))?;
    // The op reads a copy: its derivative may need the value `self` had before the
    // write (PyTorch keeps the original for in-place ops whose formulas read it).
    let r = f(&s.clone_tensor().map_err(err)?)?;
    s.copy_(&r).map_err(err)?;
    Ok(vec![Value::Tensor(s)])
}

fn unary_(c: &Call<'_>, f: impl Fn(&Tensor) -> aotgrad_trace::Result<Tensor>) -> R<Vec<Value>> {
    let s = c.tensor("self")?;
    f(&s).map_err(err)?;
    Ok(vec![Value::Tensor(s)])
}

/// `x op rhs` through aotgrad's own op for a tensor or a scalar right operand (in
/// place on `x` with `in_place`), recorded at the caller's (attributed) line.
fn binary_op(x: &Tensor, op: BinaryOp, rhs: &Operand, in_place: bool) -> aotgrad_trace::Result<Tensor> {
    let (o, args) = match rhs {
        Operand::Tensor(t) => (Op::Binary(op), vec![x, t]),
        Operand::Scalar(s) => (Op::BinaryScalar(op, *s), vec![x]),
    };
    let o = if in_place { Op::InPlace(Box::new(o)) } else { o };
    Tensor::apply_op(&o, &args, &SourceLoc::caller())
}

/// A scalar as a 0-dim tensor, which promotes as the scalar does (a 0-dim operand
/// never raises the other's dtype within its category).
fn scalar_tensor(s: Scalar) -> R<Tensor> {
    let dtype = match s {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) => DType::I64,
        _ => DType::F32,
    };
    Tensor::full(&[], s, dtype).map_err(err)
}

fn binary(c: &Call<'_>, op: BinaryOp) -> R<Vec<Value>> {
    // The serializer writes a Python number as `self` for `2 - x` and the like.
    let x = match c.operand("self")? {
        Operand::Tensor(t) => t,
        Operand::Scalar(s) => scalar_tensor(s)?,
    };
    let alpha = if c.arg("alpha").is_some() { c.scalar("alpha")? } else { Scalar::Int(1) };
    let other = c.operand("other").or_else(|_| c.operand("exponent"))?.scaled(alpha)?;
    one(binary_op(&x, op, &other, false))
}

fn binary_(c: &Call<'_>, op: BinaryOp) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let alpha = if c.arg("alpha").is_some() { c.scalar("alpha")? } else { Scalar::Int(1) };
    let other = c.operand("other")?.scaled(alpha)?;
    binary_op(&x, op, &other, true).map_err(err)?;
    Ok(vec![Value::Tensor(x)])
}

fn compare(c: &Call<'_>, op: CmpOp) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let (o, args) = match c.operand("other")? {
        Operand::Tensor(t) => (Op::Compare(op), vec![x, t]),
        Operand::Scalar(s) => (Op::CompareScalar(op, s), vec![x]),
    };
    one(Tensor::apply_op(&o, &args.iter().collect::<Vec<_>>(), &SourceLoc::caller()))
}

fn truthy(t: &Tensor) -> R<Tensor> {
    if t.dtype() == DType::Bool {
        Ok(t.clone())
    } else {
        t.ne(0).map_err(err)
    }
}

fn logical(c: &Call<'_>, and: bool) -> R<Vec<Value>> {
    let a = truthy(&c.tensor("self")?)?;
    let b = truthy(&c.tensor("other")?)?;
    let k = Tensor::full(&[], !and, DType::Bool).map_err(err)?;
    // and: a ? b : false; or: a ? true : b.
    one(if and { Tensor::where_(&a, &b, &k) } else { Tensor::where_(&a, &k, &b) })
}

fn hardsigmoid(x: &Tensor) -> R<Tensor> {
    x.add(3.0).and_then(|y| y.clamp(Some(0.0), Some(6.0))).and_then(|y| y.div(6.0)).map_err(err)
}

fn hardswish(x: &Tensor) -> R<Tensor> {
    x.mul(&hardsigmoid(x)?).map_err(err)
}

fn hardtanh(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    x.clamp(Some(c.float_or("min_val", -1.0)?), Some(c.float_or("max_val", 1.0)?)).map_err(err)
}

fn leaky_relu(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    let slope = c.float_or("negative_slope", 0.01)?;
    let pos = x.gt(0.0).map_err(err)?;
    Tensor::where_(&pos, x, &x.mul(slope).map_err(err)?).map_err(err)
}

fn gelu(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    match c.opt_str("approximate")?.as_deref() {
        None | Some("none") => x.gelu().map_err(err),
        Some("tanh") => x.gelu_tanh().map_err(err),
        Some(o) => Err(format!("gelu approximation `{o}` is not one of none, tanh")),
    }
}

fn clamp(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    let bound = |n: &str| -> R<Option<Scalar>> {
        match c.arg(n) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Tensor(_)) => Err(format!("a tensor `{n}` bound is not supported (clamp.Tensor)")),
            Some(_) => c.scalar(n).map(Some),
        }
    };
    x.clamp(bound("min")?, bound("max")?).map_err(err)
}

fn dropout(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    let p = c.float_or("p", 0.5)?;
    let train = c.bool_or("train", true)?;
    x.dropout(p, train, RngSeed::Global).map_err(err)
}

fn reduce_dims(c: &Call<'_>, x: &Tensor) -> R<Vec<i64>> {
    match c.opt_ints("dim")? {
        // `dim=None` or `[]` reduces every dim.
        None => Ok((0..x.dim() as i64).collect()),
        Some(d) if d.is_empty() => Ok((0..x.dim() as i64).collect()),
        Some(d) => Ok(d),
    }
}

fn with_dtype(c: &Call<'_>, x: Tensor) -> R<Tensor> {
    match c.dtype("dtype")? {
        Some(d) if d != x.dtype() => x.to(d).map_err(err),
        _ => Ok(x),
    }
}

fn sum(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    // Integers and bools sum in int64 unless `dtype` says otherwise.
    let x = match c.dtype("dtype")? {
        Some(d) if d != x.dtype() => x.to(d).map_err(err)?,
        Some(_) => x,
        None if x.dtype().is_float() => x,
        None => x.to(DType::I64).map_err(err)?,
    };
    let dims = reduce_dims(c, &x)?;
    one(x.sum(&dims, c.bool_or("keepdim", false)?))
}

fn mean(c: &Call<'_>) -> R<Vec<Value>> {
    let x = with_dtype(c, c.tensor("self")?)?;
    let dims = reduce_dims(c, &x)?;
    one(x.mean(&dims, c.bool_or("keepdim", false)?))
}

fn var_std(c: &Call<'_>, std: bool) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let dims = reduce_dims(c, &x)?;
    let correction = match c.arg("correction") {
        None | Some(Arg::None) => {
            if c.bool_or("unbiased", true)? {
                1
            } else {
                0
            }
        }
        Some(_) => match c.scalar("correction")? {
            Scalar::Int(i) => i,
            s if s.to_f64().fract() == 0.0 => s.to_f64() as i64,
            s => return Err(format!("a fractional correction {s:?} is not supported")),
        },
    };
    let keep = c.bool_or("keepdim", false)?;
    one(if std { x.std(&dims, correction, keep) } else { x.var(&dims, correction, keep) })
}

fn softmax(c: &Call<'_>, log: bool) -> R<Vec<Value>> {
    let x = with_dtype(c, c.tensor("self")?)?;
    let dim = c.int("dim")?;
    let x = if c.bool_or("half_to_float", false)? { x.to(DType::F32).map_err(err)? } else { x };
    one(if log { x.log_softmax(dim) } else { x.softmax(dim) })
}

fn view_shape(c: &Call<'_>) -> R<Vec<i64>> {
    c.ints("size").or_else(|_| c.ints("shape"))
}

fn flatten(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let s = sizes(&x)?;
    if s.is_empty() {
        return one(x.reshape(&[1]));
    }
    let start = wrap(c.int_or("start_dim", 0)?, s.len())?;
    let end = wrap(c.int_or("end_dim", -1)?, s.len())?;
    if start > end {
        return Err(format!("flatten() has invalid args: start_dim {start} cannot come after end_dim {end}"));
    }
    let mut shape: Vec<i64> = s[..start].iter().map(|&v| v as i64).collect();
    shape.push(s[start..=end].iter().product::<usize>() as i64);
    shape.extend(s[end + 1..].iter().map(|&v| v as i64));
    one(x.reshape(&shape))
}

fn unflatten(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let s = sizes(&x)?;
    if s.is_empty() {
        return Err("unflatten of a 0-dim tensor".into());
    }
    let dim = wrap(c.int("dim")?, s.len())?;
    let parts = c.ints("sizes")?;
    let mut shape: Vec<i64> = s[..dim].iter().map(|&v| v as i64).collect();
    shape.extend(&parts);
    shape.extend(s[dim + 1..].iter().map(|&v| v as i64));
    one(x.view(&shape))
}

fn squeeze_dims(x: &Tensor, dims: &[i64]) -> R<Tensor> {
    let s = sizes(x)?;
    let mut ds: Vec<usize> = dims.iter().map(|&d| wrap(d, s.len())).collect::<R<_>>()?;
    ds.sort_unstable();
    ds.dedup();
    let mut y = x.clone();
    for d in ds.into_iter().rev() {
        if s.get(d) == Some(&1) {
            y = y.squeeze_dim(d as i64).map_err(err)?;
        }
    }
    Ok(y)
}

fn slice(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    // An open end is i64::MAX; aotgrad clamps bounds as PyTorch does.
    one(x.slice(c.int_or("dim", 0)?, c.opt_int("start")?, c.opt_int("end")?, c.int_or("step", 1)?))
}

fn split_sizes(x: &Tensor, sizes_: &[i64], dim: i64) -> R<Vec<Value>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &len in sizes_ {
        out.push(Value::Tensor(x.narrow(dim, start, len).map_err(err)?));
        start += len;
    }
    let total = x.size(dim).map_err(err)?.as_const().ok_or("a symbolic split dim")?;
    if start != total {
        return Err(format!("split sizes {sizes_:?} sum to {start}, the dim has {total}"));
    }
    Ok(out)
}

fn tensors_out(v: Vec<Tensor>) -> Vec<Value> {
    v.into_iter().map(Value::Tensor).collect()
}

fn linear(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let w = c.tensor("weight")?;
    let b = c.opt_tensor("bias")?;
    one(x.linear(&w, b.as_ref()))
}

fn addmm(c: &Call<'_>) -> R<Vec<Value>> {
    let s = c.tensor("self")?;
    let prod = c.tensor("mat1")?.mm(&c.tensor("mat2")?).map_err(err)?;
    let beta = c.float_or("beta", 1.0)?;
    let alpha = c.float_or("alpha", 1.0)?;
    let prod = if alpha == 1.0 { prod } else { prod.mul(alpha).map_err(err)? };
    let s = if beta == 1.0 { s } else { s.mul(beta).map_err(err)? };
    one(if beta == 0.0 { Ok(prod) } else { s.add(&prod) })
}

/// `conv1d`/`conv2d`-shaped convolutions through aotgrad's 2-D convolution (a 1-D
/// one as a height-1 2-D one).
#[allow(clippy::too_many_arguments)]
fn convolution(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    transposed: bool,
    output_padding: &[i64],
    groups: i64,
) -> R<Tensor> {
    let spatial = w.dim().saturating_sub(2);
    let lift = |v: &[i64], fill: i64| -> Vec<i64> {
        match (spatial, v.len()) {
            (1, 1) => vec![fill, v[0]],
            (1, 0) => vec![fill, fill],
            _ => v.to_vec(),
        }
    };
    let (x2, w2) = match spatial {
        2 => (x.clone(), w.clone()),
        1 => (x.unsqueeze(-2).map_err(err)?, w.unsqueeze(-2).map_err(err)?),
        n => return Err(format!("{n}-d convolution is not supported (aotgrad has 1-d and 2-d)")),
    };
    let groups = usize::try_from(groups).map_err(|_| format!("groups {groups} is negative"))?;
    let opts = Conv2dOpts {
        stride: pair(&lift(stride, 1), "stride")?,
        padding: pair(&lift(padding, 0), "padding")?,
        dilation: pair(&lift(dilation, 1), "dilation")?,
        groups,
    };
    let y = if transposed {
        x2.conv_transpose2d(&w2, b, opts, pair(&lift(output_padding, 0), "output_padding")?)
    } else {
        x2.conv2d(&w2, b, opts)
    }
    .map_err(err)?;
    if spatial == 1 {
        y.squeeze_dim(-2).map_err(err)
    } else {
        Ok(y)
    }
}

fn conv_nd(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let w = c.tensor("weight")?;
    let b = c.opt_tensor("bias")?;
    let spatial = w.dim().saturating_sub(2);
    let ones = vec![1; spatial];
    let padding = match c.arg("padding") {
        Some(Arg::Str(mode)) => match mode.as_str() {
            "valid" => vec![0; spatial],
            "same" => {
                let ws = sizes(&w)?;
                if ws.len() < 3 {
                    return Err(format!("a convolution weight of shape {ws:?}"));
                }
                let dil = c.ints_or("dilation", &ones)?;
                let mut p = Vec::new();
                for (i, k) in ws[2..].iter().enumerate() {
                    let d = *dil.get(i).or(dil.first()).unwrap_or(&1);
                    let total = d.checked_mul(*k as i64 - 1).ok_or("the dilation overflows")?;
                    if total % 2 != 0 {
                        return Err("padding='same' with an even kernel (asymmetric padding) is not supported".into());
                    }
                    p.push(total / 2);
                }
                p
            }
            o => return Err(format!("padding `{o}` is not one of valid, same")),
        },
        _ => c.ints_or("padding", &vec![0; spatial])?,
    };
    one(Ok(convolution(
        &x,
        &w,
        b.as_ref(),
        &c.ints_or("stride", &ones)?,
        &padding,
        &c.ints_or("dilation", &ones)?,
        false,
        &[],
        c.int_or("groups", 1)?,
    )?))
}

fn aten_convolution(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let w = c.tensor("weight")?;
    let b = c.opt_tensor("bias")?;
    one(Ok(convolution(
        &x,
        &w,
        b.as_ref(),
        &c.ints("stride")?,
        &c.ints("padding")?,
        &c.ints("dilation")?,
        c.bool_or("transposed", false)?,
        &c.ints_or("output_padding", &[])?,
        c.int_or("groups", 1)?,
    )?))
}

fn max_pool2d(c: &Call<'_>) -> R<Tensor> {
    let x = c.tensor("self")?;
    let kernel = pair(&c.ints("kernel_size")?, "kernel_size")?;
    let stride = c.ints_or("stride", &[])?;
    let stride = if stride.is_empty() { None } else { Some(pair(&stride, "stride")?) };
    let padding = pair(&c.ints_or("padding", &[0])?, "padding")?;
    let dilation = pair(&c.ints_or("dilation", &[1])?, "dilation")?;
    if c.bool_or("ceil_mode", false)? {
        return Err("max_pool2d with ceil_mode=True is not supported".into());
    }
    x.max_pool2d(kernel, stride, padding, dilation).map_err(err)
}

fn avg_pool2d(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let kernel = pair(&c.ints("kernel_size")?, "kernel_size")?;
    let stride = c.ints_or("stride", &[])?;
    let stride = if stride.is_empty() { None } else { Some(pair(&stride, "stride")?) };
    let padding = pair(&c.ints_or("padding", &[0])?, "padding")?;
    if c.bool_or("ceil_mode", false)? {
        return Err("avg_pool2d with ceil_mode=True is not supported".into());
    }
    if padding != [0, 0] && !c.bool_or("count_include_pad", true)? {
        return Err("avg_pool2d with padding and count_include_pad=False is not supported".into());
    }
    if c.opt_int("divisor_override")?.is_some() {
        return Err("avg_pool2d with divisor_override is not supported".into());
    }
    one(x.avg_pool2d(kernel, stride, padding))
}

fn adaptive_avg_pool2d(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let out = pair(&c.ints("output_size")?, "output_size")?;
    one(x.adaptive_avg_pool2d(out))
}

fn batch_norm(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let (rm, rv) = (c.opt_tensor("running_mean")?, c.opt_tensor("running_var")?);
    let (w, b) = (c.opt_tensor("weight")?, c.opt_tensor("bias")?);
    one(x.batch_norm(
        rm.as_ref(),
        rv.as_ref(),
        w.as_ref(),
        b.as_ref(),
        c.bool_or("training", false)?,
        c.float_or("momentum", 0.1)?,
        c.float_or("eps", 1e-5)?,
    ))
}

/// Per-channel `[C]` statistics of `x` `[N, C, *]`: the mean and the biased variance.
fn channel_stats(x: &Tensor) -> R<(Tensor, Tensor)> {
    let dims: Vec<i64> = (0..x.dim() as i64).filter(|&d| d != 1).collect();
    let mean = x.mean(&dims, false).map_err(err)?;
    let var = x.var(&dims, 0, false).map_err(err)?;
    Ok((mean, var))
}

/// The core-ATen batch norms: `(output, save_mean, save_rstd[, new running mean,
/// new running var])`, in training mode from the batch's statistics.
fn native_batch_norm(c: &Call<'_>, functional: bool, training: Option<bool>) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let (w, b) = (c.opt_tensor("weight")?, c.opt_tensor("bias")?);
    let training = match training {
        Some(t) => t,
        None => c.bool_or("training", false)?,
    };
    let eps = c.float_or("eps", 1e-5)?;
    let momentum = c.float_or("momentum", 0.1)?;
    let rank = x.dim();
    if rank < 2 {
        return Err(format!("batch norm needs an input of at least 2 dims [N, C, *], got {:?}", sizes(&x)?));
    }
    let per_channel = |v: &Tensor| -> R<Tensor> {
        let mut shape = vec![1i64; rank];
        shape[1] = -1;
        v.reshape(&shape).map_err(err)
    };
    let (rm, rv) = (c.opt_tensor("running_mean")?, c.opt_tensor("running_var")?);
    // Values per channel (the unbiased running variance needs it concretely).
    let count: Option<usize> = (0..rank)
        .filter(|&d| d != 1)
        .map(|d| x.size(d as i64).ok().and_then(|s| s.as_const()).map(|n| n as usize))
        .try_fold(1usize, |acc, n| n.map(|n| acc.saturating_mul(n)));
    let (mean, var) = if training {
        channel_stats(&x)?
    } else {
        let (Some(rm), Some(rv)) = (&rm, &rv) else {
            return Err("running_mean and running_var must be defined in evaluation mode".into());
        };
        (rm.clone(), rv.clone())
    };
    let rstd = var.add(eps).and_then(|v| v.rsqrt()).map_err(err)?;
    let (mean_c, rstd_c) = (per_channel(&mean)?, per_channel(&rstd)?);
    let mut y = x.sub(&mean_c).and_then(|y| y.mul(&rstd_c)).map_err(err)?;
    if let Some(w) = &w {
        y = y.mul(&per_channel(w)?).map_err(err)?;
    }
    if let Some(b) = &b {
        y = y.add(&per_channel(b)?).map_err(err)?;
    }
    let mut out = vec![Value::Tensor(y)];
    if training {
        out.push(Value::Tensor(mean.clone()));
        out.push(Value::Tensor(rstd));
    } else {
        // PyTorch returns empty save_mean / save_rstd in evaluation mode.
        let empty = Tensor::zeros(&[0], x.dtype()).map_err(err)?;
        out.push(Value::Tensor(empty.clone()));
        out.push(Value::Tensor(empty));
    }
    // The running statistics' update: not differentiated (PyTorch's is not either).
    let update = |running: &Option<Tensor>, batch: &Tensor, unbiased: bool| -> R<Option<Tensor>> {
        let Some(r) = running else { return Ok(None) };
        let count = count.ok_or("batch norm needs concrete sizes to update the running statistics")?;
        no_grad(|| -> aotgrad_trace::Result<Tensor> {
            let mut v = batch.detach()?;
            if unbiased {
                v = v.mul(count as f64 / (count.max(2) - 1) as f64)?;
            }
            r.mul(1.0 - momentum)?.add(&v.mul(momentum)?)
        })
        .map(Some)
        .map_err(err)
    };
    if functional {
        let (nm, nv) =
            if training { (update(&rm, &mean, false)?, update(&rv, &var, true)?) } else { (rm.clone(), rv.clone()) };
        let nm = nm.ok_or("the functional batch norm needs running statistics")?;
        let nv = nv.ok_or("the functional batch norm needs running statistics")?;
        out.push(Value::Tensor(nm));
        out.push(Value::Tensor(nv));
    } else if training {
        // `_native_batch_norm_legit`: the running statistics are updated in place.
        for (r, new) in [(&rm, update(&rm, &mean, false)?), (&rv, update(&rv, &var, true)?)] {
            if let (Some(r), Some(new)) = (r, new) {
                no_grad(|| r.copy_(&new)).map_err(err)?;
            }
        }
    }
    Ok(out)
}

fn layer_norm(c: &Call<'_>, native: bool) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let shape = c.ints("normalized_shape")?;
    let (w, b) = (c.opt_tensor("weight")?, c.opt_tensor("bias")?);
    let eps = c.float_or("eps", 1e-5)?;
    let y = x.layer_norm(&shape, w.as_ref(), b.as_ref(), eps).map_err(err)?;
    if !native {
        return Ok(vec![Value::Tensor(y)]);
    }
    // native_layer_norm also returns the mean and rstd over the normalized dims
    // (kept as size-1 dims).
    let rank = x.dim() as i64;
    let dims: Vec<i64> = (rank - shape.len() as i64..rank).collect();
    let mean = x.mean(&dims, true).map_err(err)?;
    let rstd = x.var(&dims, 0, true).and_then(|v| v.add(eps)).and_then(|v| v.rsqrt()).map_err(err)?;
    Ok(vec![Value::Tensor(y), Value::Tensor(mean), Value::Tensor(rstd)])
}

fn group_norm(c: &Call<'_>, native: bool) -> R<Vec<Value>> {
    let x = c.tensor("input")?;
    let groups = if native { c.int("group")? } else { c.int("num_groups")? };
    let groups = usize::try_from(groups).map_err(|_| "a negative group count".to_string())?;
    let (w, b) = (c.opt_tensor("weight")?, c.opt_tensor("bias")?);
    let y = x.group_norm(groups, w.as_ref(), b.as_ref(), c.float_or("eps", 1e-5)?).map_err(err)?;
    let mut out = vec![Value::Tensor(y)];
    if native {
        out.push(Value::Unavailable);
        out.push(Value::Unavailable);
    }
    Ok(out)
}

/// `scaled_dot_product_attention` written out: `softmax(q kᵀ · scale + mask) v`.
fn sdpa(c: &Call<'_>) -> R<Vec<Value>> {
    let q = c.tensor("query")?;
    let k = c.tensor("key")?;
    let v = c.tensor("value")?;
    let mask = c.opt_tensor("attn_mask")?;
    let p = c.float_or("dropout_p", 0.0)?;
    let causal = c.bool_or("is_causal", false)?;
    if c.bool_or("enable_gqa", false)? && q.size(-3).map_err(err)? != k.size(-3).map_err(err)? {
        return Err("grouped-query attention (enable_gqa with fewer key heads) is not supported".into());
    }
    if q.dim() < 2 || k.dim() < 2 || v.dim() < 2 {
        return Err("query, key and value need at least 2 dims [..., L, E]".into());
    }
    if causal && mask.is_some() {
        return Err("attn_mask and is_causal=True together are not allowed (PyTorch refuses them too)".into());
    }
    let e = sizes(&q)?.last().copied().ok_or("a query of rank 0")?;
    let scale = c.opt_float("scale")?.unwrap_or(1.0 / (e as f64).sqrt());
    let mut attn = q.matmul(&k.transpose(-2, -1).map_err(err)?).and_then(|a| a.mul(scale)).map_err(err)?;
    if causal {
        let (l, s) = (sizes(&q)?[q.dim() - 2], sizes(&k)?[k.dim() - 2]);
        let keep = Tensor::ones(&[l, s], DType::F32).and_then(|o| o.tril(0)).and_then(|o| o.eq(0.0)).map_err(err)?;
        attn = attn.masked_fill(&keep, f64::NEG_INFINITY).map_err(err)?;
    }
    if let Some(m) = mask {
        attn = if m.dtype() == DType::Bool {
            attn.masked_fill(&m.logical_not().map_err(err)?, f64::NEG_INFINITY)
        } else {
            attn.add(&m)
        }
        .map_err(err)?;
    }
    // A row masked entirely gives zeros, as PyTorch's safe softmax does, not NaN.
    let all_masked = attn.amax(&[-1], true).and_then(|m| m.eq(f64::NEG_INFINITY)).map_err(err)?;
    let soft = attn.softmax(-1).map_err(err)?;
    let mut attn = Tensor::where_(&all_masked, &soft.zeros_like().map_err(err)?, &soft).map_err(err)?;
    if p > 0.0 {
        attn = attn.dropout(p, true, RngSeed::Global).map_err(err)?;
    }
    one(attn.matmul(&v))
}

fn embedding(c: &Call<'_>) -> R<Vec<Value>> {
    let w = c.tensor("weight")?;
    let idx = c.tensor("indices")?;
    if c.bool_or("sparse", false)? {
        return Err("sparse embedding gradients are not supported".into());
    }
    if c.bool_or("scale_grad_by_freq", false)? {
        return Err("embedding with scale_grad_by_freq is not supported".into());
    }
    let pad = c.int_or("padding_idx", -1)?;
    let w = if pad >= 0 {
        // The padding row gets no gradient: read it through a detached copy.
        let rows = w.size(0).map_err(err)?.as_const().ok_or("a symbolic embedding table")?;
        let is_pad =
            Tensor::arange(0, rows, 1, DType::I64).and_then(|r| r.eq(pad)).and_then(|m| m.unsqueeze(1)).map_err(err)?;
        Tensor::where_(&is_pad, &w.detach().map_err(err)?, &w).map_err(err)?
    } else {
        w
    };
    one(Tensor::embedding(&idx, &w))
}

fn arange(c: &Call<'_>) -> R<Vec<Value>> {
    let start = if c.arg("start").is_some() { c.scalar("start")? } else { Scalar::Int(0) };
    let end = c.scalar("end")?;
    let step = if c.arg("step").is_some() { c.scalar("step")? } else { Scalar::Int(1) };
    let int = [start, end, step].iter().all(|s| matches!(s, Scalar::Int(_)));
    let dtype = c.dtype("dtype")?.unwrap_or(if int { DType::I64 } else { DType::F32 });
    one(Tensor::arange(start, end, step, dtype))
}

fn shape_of(c: &Call<'_>) -> R<Vec<usize>> {
    c.ints("size")?.iter().map(|&v| usize::try_from(v).map_err(|_| format!("size {v} is negative"))).collect()
}

fn full(c: &Call<'_>, value: Option<Scalar>) -> R<Vec<Value>> {
    let value = match value {
        Some(v) => v,
        None => c.scalar("fill_value")?,
    };
    let default = match value {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) if c.arg("fill_value").is_some() => DType::I64,
        _ => DType::F32,
    };
    let dtype = c.dtype("dtype")?.unwrap_or(default);
    one(Tensor::full(&shape_of(c)?, value, dtype))
}

fn full_like(c: &Call<'_>, value: Option<Scalar>) -> R<Vec<Value>> {
    c.check_memory_format()?;
    let x = c.tensor("self")?;
    let value = match value {
        Some(v) => v,
        None => c.scalar("fill_value")?,
    };
    let dtype = c.dtype("dtype")?.unwrap_or(x.dtype());
    one(Tensor::full(&sizes(&x)?, value, dtype))
}

fn to_copy(c: &Call<'_>) -> R<Vec<Value>> {
    c.check_memory_format()?;
    let x = c.tensor("self")?;
    match c.dtype("dtype")? {
        Some(d) if d != x.dtype() => one(x.to(d)),
        _ => one(x.clone_tensor()),
    }
}

fn masked_fill(c: &Call<'_>) -> R<Tensor> {
    let x = c.tensor("self")?;
    let mask = c.tensor("mask")?;
    match c.arg("value") {
        Some(Arg::Tensor(_)) => {
            let v = c.tensor("value")?.to(x.dtype()).map_err(err)?;
            Tensor::where_(&mask, &v, &x).map_err(err)
        }
        _ => x.masked_fill(&mask, c.scalar("value")?).map_err(err),
    }
}

fn index_tensor(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let idx = match c.arg("indices") {
        Some(Arg::OptionalTensors(v)) => v.clone(),
        Some(Arg::Tensors(v)) => v.iter().cloned().map(Some).collect(),
        _ => return Err("no `indices`".into()),
    };
    // One index tensor on one dim, every other dim whole: an index_select.
    let used: Vec<(usize, &String)> = idx.iter().enumerate().filter_map(|(d, n)| n.as_ref().map(|n| (d, n))).collect();
    let [(dim, name)] = used.as_slice() else {
        return Err("advanced indexing with several index tensors is not supported".into());
    };
    let i = c.tensor_named(name)?;
    if i.dtype() == DType::Bool {
        return Err("boolean-mask indexing (data-dependent shapes) is not supported".into());
    }
    let s = sizes(&x)?;
    if s.is_empty() {
        return Err("indexing a 0-dim tensor with a tensor".into());
    }
    // Negative indices count from the end, as in PyTorch.
    let n = s[*dim] as i64;
    let flat = i.reshape(&[-1]).map_err(err)?;
    let flat = Tensor::where_(&flat.lt(0).map_err(err)?, &flat.add(n).map_err(err)?, &flat).map_err(err)?;
    let picked = x.index_select(*dim as i64, &flat).map_err(err)?;
    let mut shape: Vec<i64> = s[..*dim].iter().map(|&v| v as i64).collect();
    shape.extend(sizes(&i)?.iter().map(|&v| v as i64));
    shape.extend(s[dim + 1..].iter().map(|&v| v as i64));
    one(picked.reshape(&shape))
}

/// `div` with a rounding mode on integers: exact (through f64, exact below 2^53) and
/// in the integer dtype, as PyTorch computes it. `None` for other operands.
fn integer_division(c: &Call<'_>) -> R<Option<Vec<Value>>> {
    let mode = c.opt_str("rounding_mode")?;
    let Some(mode) = mode.filter(|m| m == "floor" || m == "trunc") else { return Ok(None) };
    let Operand::Tensor(a) = c.operand("self")? else { return Ok(None) };
    if a.dtype().is_float() || a.dtype() == DType::Bool {
        return Ok(None);
    }
    let (q, dtype) = match c.operand("other")? {
        Operand::Tensor(b) if !b.dtype().is_float() && b.dtype() != DType::Bool => {
            let dtype = if a.dtype() == b.dtype() { a.dtype() } else { DType::I64 };
            (a.to(DType::F64).and_then(|x| x.div(&b.to(DType::F64)?)), dtype)
        }
        Operand::Scalar(Scalar::Int(b)) => (a.to(DType::F64).and_then(|x| x.div(b as f64)), a.dtype()),
        _ => return Ok(None),
    };
    let q = q.map_err(err)?;
    let q = if mode == "floor" { q.floor() } else { q.trunc() }.map_err(err)?;
    Ok(Some(one(q.to(dtype))?))
}

fn sym_arith(c: &Call<'_>, f: fn(i64, i64) -> Option<i64>) -> R<Vec<Value>> {
    let get = |k: usize| -> R<i64> {
        match c.node.inputs.get(k).map(|a| &a.arg) {
            Some(Arg::Int(i)) => Ok(*i),
            Some(Arg::SymInt(SymRef::Name(n))) => c.int_named(n),
            Some(Arg::SymInt(SymRef::Int(i))) => Ok(*i),
            _ => Err(format!("argument {k} is not an integer")),
        }
    };
    let v = f(get(0)?, get(1)?).ok_or("integer overflow or division by zero")?;
    Ok(vec![Value::Int(v)])
}

fn dim_int(d: aotgrad_ir::Dim, what: &str) -> R<i64> {
    d.as_const().ok_or_else(|| format!("a symbolic {what} under tracing"))
}

fn full_of(x: &Tensor, value: Scalar, dtype: DType) -> R<Tensor> {
    Tensor::full(&sizes(x)?, value, dtype).map_err(err)
}

/// `x` with `before` and `after` elements of `value` added along `dim` (a negative
/// count crops).
fn pad_dim(x: &Tensor, dim: usize, before: i64, after: i64, value: Scalar) -> R<Tensor> {
    let mut y = x.clone();
    let n = sizes(&y)?[dim] as i64;
    if before < 0 || after < 0 {
        let start = (-before).max(0);
        let end = n - (-after).max(0);
        if end < start {
            return Err(format!("padding ({before}, {after}) crops more than the {n} elements of dim {dim}"));
        }
        y = y.narrow(dim as i64, start, end - start).map_err(err)?;
    }
    let mut parts = Vec::new();
    for count in [before.max(0), after.max(0)] {
        let mut shape = sizes(&y)?;
        shape[dim] = count as usize;
        parts.push(Tensor::full(&shape, value, y.dtype()).map_err(err)?);
    }
    if before <= 0 && after <= 0 {
        return Ok(y);
    }
    Tensor::cat(&[&parts[0], &y, &parts[1]], dim as i64).map_err(err)
}

/// `pad` is PyTorch's: (before, after) pairs from the last dim backwards.
fn pad_pairs(x: &Tensor, pad: &[i64]) -> R<Vec<(usize, i64, i64)>> {
    if !pad.len().is_multiple_of(2) || pad.len() / 2 > x.dim() {
        return Err(format!("padding {pad:?} needs pairs for at most {} dims", x.dim()));
    }
    Ok(pad.chunks(2).enumerate().map(|(k, p)| (x.dim() - 1 - k, p[0], p[1])).collect())
}

fn constant_pad(x: &Tensor, pad: &[i64], value: Scalar) -> R<Tensor> {
    let mut y = x.clone();
    for (dim, before, after) in pad_pairs(x, pad)? {
        y = pad_dim(&y, dim, before, after, value)?;
    }
    Ok(y)
}

/// Reflection or replication padding as an index_select per dim (its gradient
/// sums the repeats, as PyTorch's does).
fn indexed_pad(x: &Tensor, pad: &[i64], reflect: bool) -> R<Tensor> {
    let mut y = x.clone();
    for (dim, before, after) in pad_pairs(x, pad)? {
        let n = sizes(&y)?[dim] as i64;
        if before < 0 || after < 0 || (reflect && (before >= n || after >= n)) || n == 0 {
            return Err(format!(
                "{} padding ({before}, {after}) is out of range for dim {dim} of size {n}",
                if reflect { "reflection" } else { "replication" }
            ));
        }
        // Built from `arange` (a traced op: no constant data enters the graph):
        // reflect(i) = (n-1) - |(n-1) - |i||, replicate(i) = clamp(i, 0, n-1).
        let i = Tensor::arange(-before, n + after, 1, DType::I64).map_err(err)?;
        let idx = if reflect {
            i.abs()
                .and_then(|a| a.neg())
                .and_then(|a| a.add(n - 1))
                .and_then(|a| a.abs())
                .and_then(|a| a.neg())
                .and_then(|a| a.add(n - 1))
        } else {
            i.clamp(Some(0i64), Some(n - 1))
        }
        .map_err(err)?;
        y = y.index_select(dim as i64, &idx).map_err(err)?;
    }
    Ok(y)
}

fn flip(x: &Tensor, dims: &[i64]) -> R<Tensor> {
    let mut y = x.clone();
    for &d in dims {
        let d = wrap(d, x.dim())?;
        let n = sizes(&y)?[d] as i64;
        let idx = Tensor::arange(n - 1, -1, -1, DType::I64).map_err(err)?;
        y = y.index_select(d as i64, &idx).map_err(err)?;
    }
    Ok(y)
}

fn repeat(x: &Tensor, reps: &[i64]) -> R<Tensor> {
    let s = sizes(x)?;
    if reps.len() < s.len() {
        return Err(format!("repeat {reps:?} has fewer dims than the tensor's {}", s.len()));
    }
    let mut shape = vec![1i64; reps.len() - s.len()];
    shape.extend(s.iter().map(|&v| v as i64));
    // [s0, s1] → [1, s0, 1, s1] → [r0, s0, r1, s1] → [r0·s0, r1·s1].
    let inter: Vec<i64> = shape.iter().flat_map(|&v| [1, v]).collect();
    let expanded: Vec<i64> = shape.iter().zip(reps).flat_map(|(&v, &r)| [r, v]).collect();
    let out: Vec<i64> = shape.iter().zip(reps).map(|(&v, &r)| v * r).collect();
    x.reshape(&inter).and_then(|y| y.expand(&expanded)).and_then(|y| y.reshape(&out)).map_err(err)
}

/// PyTorch's nearest-neighbour source index: `min(floor(dst * scale), in - 1)` in f32,
/// `scale` being `in / out` or `1 / scale_factor`.
fn nearest_index(input: usize, output: usize, factor: Option<f64>) -> R<Tensor> {
    let scale = match factor {
        Some(f) if f > 0.0 => (1.0 / f) as f32,
        _ => input as f32 / output as f32,
    };
    // In f32 as PyTorch computes it: the f32 product of two f32 values is the f64
    // product rounded, whichever precision the kernel multiplies in.
    Tensor::arange(0, output as i64, 1, DType::F32)
        .and_then(|d| d.mul(scale as f64))
        .and_then(|d| d.floor())
        .and_then(|d| d.clamp_max(input as f64 - 1.0))
        .and_then(|d| d.to(DType::I64))
        .map_err(err)
}

fn upsample_nearest(c: &Call<'_>, x: &Tensor) -> R<Vec<Value>> {
    let s = sizes(x)?;
    if s.len() != 4 {
        return Err(format!("upsample_nearest2d takes [N, C, H, W], got {s:?}"));
    }
    let factors = match c.arg("scale_factors") {
        Some(Arg::Floats(v)) => Some(v.clone()),
        _ => {
            let h = c.opt_float("scales_h")?;
            let w = c.opt_float("scales_w")?;
            h.zip(w).map(|(h, w)| vec![h, w])
        }
    };
    let out = match c.opt_ints("output_size")? {
        Some(o) if o.len() == 2 => [o[0] as usize, o[1] as usize],
        _ => match &factors {
            Some(f) if f.len() == 2 => [(s[2] as f64 * f[0]).floor() as usize, (s[3] as f64 * f[1]).floor() as usize],
            _ => return Err("upsample_nearest2d needs an output size or two scale factors".into()),
        },
    };
    let fh = factors.as_ref().and_then(|f| f.first().copied());
    let fw = factors.as_ref().and_then(|f| f.get(1).copied());
    let y = x.index_select(2, &nearest_index(s[2], out[0], fh)?).map_err(err)?;
    one(y.index_select(3, &nearest_index(s[3], out[1], fw)?))
}

/// `a - round(a / b) * b` with `floor` (Python's `%`, `remainder`) or `trunc` (C's
/// `fmod`), in the promoted dtype.
fn modulo(c: &Call<'_>, floor: bool) -> R<Vec<Value>> {
    let a = c.tensor("self")?;
    let o = c.operand("other")?;
    let q = a.div(o.rhs()).map_err(err)?;
    let q = if floor { q.floor() } else { q.trunc() }.map_err(err)?;
    let r = a.sub(&q.mul(o.rhs()).map_err(err)?).map_err(err)?;
    let ints = !a.dtype().is_float()
        && match &o {
            Operand::Tensor(t) => !t.dtype().is_float(),
            Operand::Scalar(s) => !matches!(s, Scalar::Float(_)),
        };
    one(if ints { r.to(a.dtype()) } else { Ok(r) })
}

fn elu(c: &Call<'_>, x: &Tensor) -> R<Tensor> {
    let alpha = c.float_or("alpha", 1.0)?;
    let scale = c.float_or("scale", 1.0)?;
    let input_scale = c.float_or("input_scale", 1.0)?;
    let pos = x.gt(0.0).map_err(err)?;
    let neg = x.mul(input_scale).and_then(|y| y.expm1()).and_then(|y| y.mul(alpha * scale)).map_err(err)?;
    Tensor::where_(&pos, &x.mul(scale).map_err(err)?, &neg).map_err(err)
}

fn softplus(x: &Tensor, beta: f64, threshold: f64) -> R<Tensor> {
    let bx = x.mul(beta).map_err(err)?;
    let soft = bx.exp().and_then(|y| y.log1p()).and_then(|y| y.div(beta)).map_err(err)?;
    Tensor::where_(&bx.gt(threshold).map_err(err)?, x, &soft).map_err(err)
}

fn logsumexp(c: &Call<'_>) -> R<Vec<Value>> {
    let x = c.tensor("self")?;
    let dims = reduce_dims(c, &x)?;
    let keep = c.bool_or("keepdim", false)?;
    // Shift by the (detached) max, taken as 0 where it is infinite.
    let m = x.amax(&dims, true).and_then(|m| m.detach()).map_err(err)?;
    let finite = m.abs().and_then(|a| a.lt(f64::INFINITY)).map_err(err)?;
    let m = Tensor::where_(&finite, &m, &m.zeros_like().map_err(err)?).map_err(err)?;
    let s = x
        .sub(&m)
        .and_then(|y| y.exp())
        .and_then(|y| y.sum(&dims, true))
        .and_then(|y| y.log())
        .and_then(|y| y.add(&m))
        .map_err(err)?;
    one(if keep { Ok(s) } else { Ok(squeeze_dims(&s, &dims)?) })
}

fn bool_only(c: &Call<'_>, names: &[&str]) -> R<Vec<Tensor>> {
    let ts: Vec<Tensor> = names.iter().map(|n| c.tensor(n)).collect::<R<_>>()?;
    if ts.iter().any(|t| t.dtype() != DType::Bool) {
        return Err("bitwise ops on integer tensors are not supported (bool tensors are)".into());
    }
    Ok(ts)
}

fn fresh(c: &Call<'_>, value: Scalar, default: Option<DType>) -> R<Vec<Value>> {
    let dtype = match (c.dtype("dtype")?, default) {
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => DType::F32,
    };
    one(Tensor::full(&shape_of(c)?, value, dtype))
}

/// The op for a node's target, or `None` when aotgrad does not run it.
pub(crate) fn lookup(target: &str) -> Option<OpDef> {
    let run: OpFn = match target {
        // Linear algebra.
        "aten.linear.default" => linear,
        "aten.addmm.default" => addmm,
        "aten.mm.default" => |c| one(c.tensor("self")?.mm(&c.tensor("mat2")?)),
        "aten.bmm.default" => |c| one(c.tensor("self")?.bmm(&c.tensor("mat2")?)),
        "aten.matmul.default" => |c| one(c.tensor("self")?.matmul(&c.tensor("other")?)),
        // Convolution and pooling.
        "aten.conv2d.default" | "aten.conv1d.default" | "aten.conv2d.padding" | "aten.conv1d.padding" => conv_nd,
        "aten.convolution.default" => aten_convolution,
        "aten.max_pool2d.default" => |c| Ok(vec![Value::Tensor(max_pool2d(c)?)]),
        "aten.avg_pool2d.default" => avg_pool2d,
        "aten.adaptive_avg_pool2d.default" | "aten._adaptive_avg_pool2d.default" => adaptive_avg_pool2d,
        // Normalization.
        "aten.batch_norm.default" => batch_norm,
        "aten._native_batch_norm_legit_no_training.default" => |c| native_batch_norm(c, false, Some(false)),
        "aten._native_batch_norm_legit_functional.default" => |c| native_batch_norm(c, true, None),
        "aten._native_batch_norm_legit.default" => |c| native_batch_norm(c, false, None),
        "aten.layer_norm.default" => |c| layer_norm(c, false),
        "aten.native_layer_norm.default" => |c| layer_norm(c, true),
        "aten.group_norm.default" => |c| group_norm(c, false),
        "aten.native_group_norm.default" => |c| group_norm(c, true),
        // Attention, embedding, softmax.
        "aten.scaled_dot_product_attention.default" => sdpa,
        "aten.embedding.default" => embedding,
        "aten.softmax.int" => |c| softmax(c, false),
        "aten._softmax.default" => |c| softmax(c, false),
        "aten.log_softmax.int" => |c| softmax(c, true),
        "aten._log_softmax.default" => |c| softmax(c, true),
        // Activations.
        "aten.relu.default" => |c| one(c.tensor("self")?.relu()),
        "aten.relu_.default" => |c| unary_(c, |s| s.relu_()),
        "aten.gelu.default" => |c| one(Ok(gelu(c, &c.tensor("self")?)?)),
        "aten.gelu_.default" => |c| inplace(c, |x| gelu(c, x)),
        "aten.silu.default" => |c| one(c.tensor("self")?.silu()),
        "aten.silu_.default" => |c| inplace(c, |x| x.silu().map_err(err)),
        "aten.sigmoid.default" => |c| one(c.tensor("self")?.sigmoid()),
        "aten.sigmoid_.default" => |c| unary_(c, |s| s.sigmoid_()),
        "aten.tanh.default" => |c| one(c.tensor("self")?.tanh()),
        "aten.tanh_.default" => |c| unary_(c, |s| s.tanh_()),
        "aten.hardsigmoid.default" => |c| one(Ok(hardsigmoid(&c.tensor("self")?)?)),
        "aten.hardsigmoid_.default" => |c| inplace(c, hardsigmoid),
        "aten.hardswish.default" => |c| one(Ok(hardswish(&c.tensor("self")?)?)),
        "aten.hardswish_.default" => |c| inplace(c, hardswish),
        "aten.hardtanh.default" => |c| one(Ok(hardtanh(c, &c.tensor("self")?)?)),
        "aten.hardtanh_.default" => |c| inplace(c, |x| hardtanh(c, x)),
        "aten.leaky_relu.default" => |c| one(Ok(leaky_relu(c, &c.tensor("self")?)?)),
        "aten.leaky_relu_.default" => |c| inplace(c, |x| leaky_relu(c, x)),
        "aten.dropout.default" => |c| one(Ok(dropout(c, &c.tensor("input")?)?)),
        "aten.dropout_.default" => |c| inplace(c, |x| dropout(c, x)),
        "aten.native_dropout.default" => |c| {
            let x = c.tensor("input")?;
            let train = c.bool_or("train", true)?;
            let y = x.dropout(c.float_or("p", 0.5)?, train, RngSeed::Global).map_err(err)?;
            Ok(vec![Value::Tensor(y), Value::Unavailable])
        },
        // Unary math.
        "aten.neg.default" => |c| one(c.tensor("self")?.neg()),
        "aten.neg_.default" => |c| unary_(c, |s| s.neg_()),
        "aten.abs.default" => |c| one(c.tensor("self")?.abs()),
        "aten.exp.default" => |c| one(c.tensor("self")?.exp()),
        "aten.exp_.default" => |c| unary_(c, |s| s.exp_()),
        "aten.log.default" => |c| one(c.tensor("self")?.log()),
        "aten.log1p.default" => |c| one(c.tensor("self")?.log1p()),
        "aten.expm1.default" => |c| one(c.tensor("self")?.expm1()),
        "aten.sqrt.default" => |c| one(c.tensor("self")?.sqrt()),
        "aten.rsqrt.default" => |c| one(c.tensor("self")?.rsqrt()),
        "aten.sin.default" => |c| one(c.tensor("self")?.sin()),
        "aten.cos.default" => |c| one(c.tensor("self")?.cos()),
        "aten.erf.default" => |c| one(c.tensor("self")?.erf()),
        "aten.reciprocal.default" => |c| one(c.tensor("self")?.reciprocal()),
        "aten.sign.default" => |c| one(c.tensor("self")?.sign()),
        "aten.floor.default" => |c| one(c.tensor("self")?.floor()),
        "aten.ceil.default" => |c| one(c.tensor("self")?.ceil()),
        "aten.round.default" => |c| one(c.tensor("self")?.round()),
        "aten.trunc.default" => |c| one(c.tensor("self")?.trunc()),
        "aten.logical_not.default" => |c| one(c.tensor("self")?.logical_not()),
        "aten.logical_and.default" => |c| logical(c, true),
        "aten.logical_or.default" => |c| logical(c, false),
        "aten.clamp.default" => |c| one(Ok(clamp(c, &c.tensor("self")?)?)),
        "aten.clamp_.default" => |c| inplace(c, |x| clamp(c, x)),
        "aten.clamp_min.default" => |c| one(c.tensor("self")?.clamp_min(c.scalar("min")?)),
        "aten.clamp_max.default" => |c| one(c.tensor("self")?.clamp_max(c.scalar("max")?)),
        // Binary math (tensor or scalar operand, `alpha` honoured).
        "aten.add.Tensor" | "aten.add.Scalar" => |c| binary(c, BinaryOp::Add),
        "aten.sub.Tensor" | "aten.sub.Scalar" => |c| binary(c, BinaryOp::Sub),
        "aten.mul.Tensor" | "aten.mul.Scalar" => |c| binary(c, BinaryOp::Mul),
        "aten.div.Tensor" | "aten.div.Scalar" => |c| binary(c, BinaryOp::Div),
        "aten.pow.Tensor_Scalar" | "aten.pow.Tensor_Tensor" => |c| binary(c, BinaryOp::Pow),
        "aten.maximum.default" => |c| binary(c, BinaryOp::Maximum),
        "aten.minimum.default" => |c| binary(c, BinaryOp::Minimum),
        "aten.rsub.Scalar" | "aten.rsub.Tensor" => |c| {
            let x = c.tensor("self")?;
            let alpha = if c.arg("alpha").is_some() { c.scalar("alpha")? } else { Scalar::Int(1) };
            let x = Operand::Tensor(x).scaled(alpha)?;
            let Operand::Tensor(x) = x else { unreachable!("a tensor stays a tensor") };
            match c.operand("other")? {
                Operand::Tensor(o) => one(o.sub(&x)),
                Operand::Scalar(s) => one(x.neg().and_then(|n| n.add(s))),
            }
        },
        "aten.div.Tensor_mode" | "aten.div.Scalar_mode" => |c| {
            if let Some(r) = integer_division(c)? {
                return Ok(r);
            }
            let q = binary(c, BinaryOp::Div)?;
            let Some(Value::Tensor(q)) = q.into_iter().next() else { unreachable!("binary returns a tensor") };
            match c.opt_str("rounding_mode")?.as_deref() {
                None => one(Ok(q)),
                Some("trunc") => one(q.trunc()),
                Some("floor") => one(q.floor()),
                Some(o) => Err(format!("rounding mode `{o}` is not one of trunc, floor")),
            }
        },
        "aten.add_.Tensor" | "aten.add_.Scalar" => |c| binary_(c, BinaryOp::Add),
        "aten.sub_.Tensor" | "aten.sub_.Scalar" => |c| binary_(c, BinaryOp::Sub),
        "aten.mul_.Tensor" | "aten.mul_.Scalar" => |c| binary_(c, BinaryOp::Mul),
        "aten.div_.Tensor" | "aten.div_.Scalar" => |c| binary_(c, BinaryOp::Div),
        "aten.eq.Tensor" | "aten.eq.Scalar" => |c| compare(c, CmpOp::Eq),
        "aten.ne.Tensor" | "aten.ne.Scalar" => |c| compare(c, CmpOp::Ne),
        "aten.lt.Tensor" | "aten.lt.Scalar" => |c| compare(c, CmpOp::Lt),
        "aten.le.Tensor" | "aten.le.Scalar" => |c| compare(c, CmpOp::Le),
        "aten.gt.Tensor" | "aten.gt.Scalar" => |c| compare(c, CmpOp::Gt),
        "aten.ge.Tensor" | "aten.ge.Scalar" => |c| compare(c, CmpOp::Ge),
        "aten.where.self" => |c| one(Tensor::where_(&c.tensor("condition")?, &c.tensor("self")?, &c.tensor("other")?)),
        "aten.masked_fill.Scalar" | "aten.masked_fill.Tensor" => |c| one(Ok(masked_fill(c)?)),
        "aten.masked_fill_.Scalar" | "aten.masked_fill_.Tensor" => |c| inplace(c, |_| masked_fill(c)),
        "aten.copy_.default" => |c| {
            let s = c.tensor("self")?;
            s.copy_(&c.tensor("src")?).map_err(err)?;
            Ok(vec![Value::Tensor(s)])
        },
        "aten.zero_.default" => |c| unary_(c, |s| s.zero_()),
        "aten.fill_.Scalar" => |c| {
            let s = c.tensor("self")?;
            s.fill_(c.scalar("value")?).map_err(err)?;
            Ok(vec![Value::Tensor(s)])
        },
        // Reductions.
        "aten.sum.dim_IntList" | "aten.sum.default" => sum,
        "aten.mean.dim" | "aten.mean.default" => mean,
        "aten.amax.default" => |c| {
            let x = c.tensor("self")?;
            one(x.amax(&reduce_dims(c, &x)?, c.bool_or("keepdim", false)?))
        },
        "aten.amin.default" => |c| {
            let x = c.tensor("self")?;
            one(x.amin(&reduce_dims(c, &x)?, c.bool_or("keepdim", false)?))
        },
        "aten.var.correction" | "aten.var.dim" => |c| var_std(c, false),
        "aten.std.correction" | "aten.std.dim" => |c| var_std(c, true),
        "aten.any.dim" | "aten.any.dims" | "aten.any.default" => |c| {
            let x = c.tensor("self")?;
            one(x.any(&reduce_dims(c, &x)?, c.bool_or("keepdim", false)?))
        },
        "aten.all.dim" | "aten.all.dims" | "aten.all.default" => |c| {
            let x = c.tensor("self")?;
            one(x.all(&reduce_dims(c, &x)?, c.bool_or("keepdim", false)?))
        },
        "aten.argmax.default" => |c| {
            let x = c.tensor("self")?;
            match c.opt_int("dim")? {
                Some(d) => one(x.argmax(d, c.bool_or("keepdim", false)?)),
                // keepdim without a dim keeps every dim, each of size 1.
                None if c.bool_or("keepdim", false)? => one(x.argmax_all().and_then(|a| a.reshape(&vec![1; x.dim()]))),
                None => one(x.argmax_all()),
            }
        },
        "aten.max.dim" => |c| {
            let (v, i) = c.tensor("self")?.max_dim(c.int("dim")?, c.bool_or("keepdim", false)?).map_err(err)?;
            Ok(vec![Value::Tensor(v), Value::Tensor(i)])
        },
        "aten.cumsum.default" => |c| {
            let x = with_dtype(c, c.tensor("self")?)?;
            let x =
                if x.dtype().is_float() || c.dtype("dtype")?.is_some() { x } else { x.to(DType::I64).map_err(err)? };
            one(x.cumsum(c.int("dim")?))
        },
        // Views and shape ops.
        "aten.view.default" | "aten._unsafe_view.default" | "aten.reshape.default" => {
            |c| one(c.tensor("self")?.reshape(&view_shape(c)?))
        }
        "aten.permute.default" => |c| one(c.tensor("self")?.permute(&c.ints("dims")?)),
        "aten.transpose.int" => |c| one(c.tensor("self")?.transpose(c.int("dim0")?, c.int("dim1")?)),
        "aten.t.default" => |c| one(c.tensor("self")?.t()),
        "aten.expand.default" => |c| one(c.tensor("self")?.expand(&c.ints("size")?)),
        "aten.flatten.using_ints" => flatten,
        "aten.unflatten.int" => unflatten,
        "aten.squeeze.dim" | "aten.squeeze.dims" => |c| {
            let x = c.tensor("self")?;
            one(Ok(squeeze_dims(&x, &c.ints("dim")?)?))
        },
        "aten.squeeze.default" => |c| one(c.tensor("self")?.squeeze()),
        "aten.unsqueeze.default" => |c| one(c.tensor("self")?.unsqueeze(c.int("dim")?)),
        "aten.select.int" => |c| one(c.tensor("self")?.select(c.int("dim")?, c.int("index")?)),
        "aten.slice.Tensor" => slice,
        "aten.narrow.default" => |c| one(c.tensor("self")?.narrow(c.int("dim")?, c.int("start")?, c.int("length")?)),
        "aten.contiguous.default" => |c| {
            c.check_memory_format()?;
            one(c.tensor("self")?.contiguous())
        },
        "aten.clone.default" => |c| {
            c.check_memory_format()?;
            one(c.tensor("self")?.clone_tensor())
        },
        "aten.lift_fresh_copy.default" => |c| one(c.tensor("self")?.clone_tensor()),
        "aten.alias.default" => |c| one(c.tensor("self")?.alias()),
        "aten.detach.default" => |c| one(c.tensor("self")?.detach()),
        "aten._to_copy.default" => to_copy,
        "aten.to.dtype" | "aten.to.dtype_layout" => |c| {
            let x = c.tensor("self")?;
            match c.dtype("dtype")? {
                Some(d) if d != x.dtype() => one(x.to(d)),
                _ => one(Ok(x)),
            }
        },
        "aten.cat.default" | "aten.concat.default" => |c| {
            let ts = c.tensors("tensors")?;
            one(Tensor::cat(&ts.iter().collect::<Vec<_>>(), c.int_or("dim", 0)?))
        },
        "aten.stack.default" => |c| {
            let ts = c.tensors("tensors")?;
            one(Tensor::stack(&ts.iter().collect::<Vec<_>>(), c.int_or("dim", 0)?))
        },
        "aten.split.Tensor" => {
            |c| Ok(tensors_out(c.tensor("self")?.split(c.int("split_size")?, c.int_or("dim", 0)?).map_err(err)?))
        }
        "aten.split_with_sizes.default" | "aten.split.sizes" => |c| {
            let sizes_ = c.ints("split_sizes").or_else(|_| c.ints("split_size"))?;
            split_sizes(&c.tensor("self")?, &sizes_, c.int_or("dim", 0)?)
        },
        "aten.chunk.default" => {
            |c| Ok(tensors_out(c.tensor("self")?.chunk(c.int("chunks")?, c.int_or("dim", 0)?).map_err(err)?))
        }
        "aten.unbind.int" => |c| Ok(tensors_out(c.tensor("self")?.unbind(c.int_or("dim", 0)?).map_err(err)?)),
        "aten.tril.default" => |c| one(c.tensor("self")?.tril(c.int_or("diagonal", 0)?)),
        "aten.triu.default" => |c| one(c.tensor("self")?.triu(c.int_or("diagonal", 0)?)),
        "aten.index_select.default" => |c| one(c.tensor("self")?.index_select(c.int("dim")?, &c.tensor("index")?)),
        "aten.gather.default" => |c| one(c.tensor("self")?.gather(c.int("dim")?, &c.tensor("index")?)),
        "aten.index.Tensor" => index_tensor,
        // Creation.
        "aten.arange.default" | "aten.arange.start" | "aten.arange.start_step" => arange,
        "aten.full.default" => |c| full(c, None),
        "aten.zeros.default" => |c| full(c, Some(Scalar::Float(0.0))),
        "aten.ones.default" => |c| full(c, Some(Scalar::Float(1.0))),
        "aten.full_like.default" => |c| full_like(c, None),
        "aten.zeros_like.default" | "aten.empty_like.default" => |c| full_like(c, Some(Scalar::Int(0))),
        "aten.ones_like.default" => |c| full_like(c, Some(Scalar::Int(1))),
        "aten.scalar_tensor.default" => |c| {
            let s = c.scalar("s")?;
            one(Tensor::full(&[], s, c.dtype("dtype")?.unwrap_or(DType::F32)))
        },
        // Padding, flips, repeats, upsampling.
        "aten.constant_pad_nd.default" => |c| {
            let v = if c.arg("value").is_some() { c.scalar("value")? } else { Scalar::Int(0) };
            one(Ok(constant_pad(&c.tensor("self")?, &c.ints("pad")?, v)?))
        },
        "aten.pad.default" => |c| {
            let x = c.tensor("self")?;
            let pad = c.ints("pad")?;
            match c.opt_str("mode")?.as_deref().unwrap_or("constant") {
                "constant" => one(Ok(constant_pad(&x, &pad, Scalar::Float(c.float_or("value", 0.0)?))?)),
                "reflect" => one(Ok(indexed_pad(&x, &pad, true)?)),
                "replicate" => one(Ok(indexed_pad(&x, &pad, false)?)),
                o => Err(format!("padding mode `{o}` is not one of constant, reflect, replicate")),
            }
        },
        "aten.reflection_pad1d.default" | "aten.reflection_pad2d.default" | "aten.reflection_pad3d.default" => {
            |c| one(Ok(indexed_pad(&c.tensor("self")?, &c.ints("padding")?, true)?))
        }
        "aten.replication_pad1d.default" | "aten.replication_pad2d.default" | "aten.replication_pad3d.default" => {
            |c| one(Ok(indexed_pad(&c.tensor("self")?, &c.ints("padding")?, false)?))
        }
        "aten.flip.default" => |c| one(Ok(flip(&c.tensor("self")?, &c.ints("dims")?)?)),
        "aten.repeat.default" => |c| one(Ok(repeat(&c.tensor("self")?, &c.ints("repeats")?)?)),
        "aten.upsample_nearest2d.vec" => |c| upsample_nearest(c, &c.tensor("input")?),
        "aten.upsample_nearest2d.default" => |c| upsample_nearest(c, &c.tensor("self")?),
        // More math.
        "aten.remainder.Tensor" | "aten.remainder.Scalar" => |c| modulo(c, true),
        "aten.fmod.Tensor" | "aten.fmod.Scalar" => |c| modulo(c, false),
        "aten.elu.default" => |c| one(Ok(elu(c, &c.tensor("self")?)?)),
        "aten.elu_.default" => |c| inplace(c, |x| elu(c, x)),
        "aten.softplus.default" => {
            |c| one(Ok(softplus(&c.tensor("self")?, c.float_or("beta", 1.0)?, c.float_or("threshold", 20.0)?)?))
        }
        "aten.mish.default" => |c| {
            let x = c.tensor("self")?;
            one(x.mul(&softplus(&x, 1.0, 20.0)?.tanh().map_err(err)?))
        },
        "aten.logsumexp.default" => logsumexp,
        "aten.pow.Scalar" => |c| {
            let e = c.tensor("exponent")?;
            let base = c.scalar("self")?;
            let dtype = if e.dtype().is_float() { e.dtype() } else { DType::F32 };
            one(full_of(&e, base, dtype)?.pow(&e))
        },
        "aten.log2.default" => |c| one(c.tensor("self")?.log().and_then(|y| y.div(std::f64::consts::LN_2))),
        "aten.log10.default" => |c| one(c.tensor("self")?.log().and_then(|y| y.div(std::f64::consts::LN_10))),
        "aten.tan.default" => |c| {
            let x = c.tensor("self")?;
            one(x.sin().and_then(|s| s.div(&x.cos()?)))
        },
        "aten.sinh.default" => |c| {
            let x = c.tensor("self")?;
            one(x.exp().and_then(|a| a.sub(&x.neg()?.exp()?)).and_then(|y| y.mul(0.5)))
        },
        "aten.cosh.default" => |c| {
            let x = c.tensor("self")?;
            one(x.exp().and_then(|a| a.add(&x.neg()?.exp()?)).and_then(|y| y.mul(0.5)))
        },
        "aten.isnan.default" => |c| {
            let x = c.tensor("self")?;
            one(x.ne(&x))
        },
        "aten.isinf.default" => |c| one(c.tensor("self")?.abs().and_then(|a| a.eq(f64::INFINITY))),
        "aten.clamp.Tensor" => |c| {
            let mut x = c.tensor("self")?;
            if let Some(lo) = c.opt_tensor("min")? {
                x = x.maximum(&lo).map_err(err)?;
            }
            if let Some(hi) = c.opt_tensor("max")? {
                x = x.minimum(&hi).map_err(err)?;
            }
            one(Ok(x))
        },
        "aten.logical_xor.default" => |c| {
            let (a, b) = (truthy(&c.tensor("self")?)?, truthy(&c.tensor("other")?)?);
            one(a.ne(&b))
        },
        "aten.bitwise_not.default" => |c| one(bool_only(c, &["self"])?[0].logical_not()),
        "aten.__and__.Tensor" | "aten.bitwise_and.Tensor" => |c| {
            bool_only(c, &["self", "other"])?;
            logical(c, true)
        },
        "aten.__or__.Tensor" | "aten.bitwise_or.Tensor" => |c| {
            bool_only(c, &["self", "other"])?;
            logical(c, false)
        },
        "aten.__xor__.Tensor" | "aten.bitwise_xor.Tensor" => |c| {
            let ts = bool_only(c, &["self", "other"])?;
            one(ts[0].ne(&ts[1]))
        },
        // Selection and sorting.
        "aten.argmin.default" => |c| {
            let x = c.tensor("self")?;
            match c.opt_int("dim")? {
                Some(d) => one(x.argmin(d, c.bool_or("keepdim", false)?)),
                None if c.bool_or("keepdim", false)? => {
                    one(x.reshape(&[-1]).and_then(|f| f.argmin(0, false)).and_then(|a| a.reshape(&vec![1; x.dim()])))
                }
                None => one(x.reshape(&[-1]).and_then(|f| f.argmin(0, false))),
            }
        },
        "aten.min.dim" => |c| {
            let (v, i) = c.tensor("self")?.min_dim(c.int("dim")?, c.bool_or("keepdim", false)?).map_err(err)?;
            Ok(vec![Value::Tensor(v), Value::Tensor(i)])
        },
        "aten.sort.default" | "aten.sort.stable" => |c| {
            let (v, i) = c.tensor("self")?.sort(c.int_or("dim", -1)?, c.bool_or("descending", false)?).map_err(err)?;
            Ok(vec![Value::Tensor(v), Value::Tensor(i)])
        },
        "aten.topk.default" => |c| {
            let k = usize::try_from(c.int("k")?).map_err(|_| "a negative k".to_string())?;
            let (v, i) = c.tensor("self")?.topk(k, c.int_or("dim", -1)?, c.bool_or("largest", true)?).map_err(err)?;
            Ok(vec![Value::Tensor(v), Value::Tensor(i)])
        },
        "aten.diagonal.default" => {
            |c| one(c.tensor("self")?.diagonal(c.int_or("offset", 0)?, c.int_or("dim1", 0)?, c.int_or("dim2", 1)?))
        }
        "aten.as_strided.default" => |c| {
            let x = c.tensor("self")?;
            let us = |v: Vec<i64>| -> R<Vec<usize>> {
                v.into_iter()
                    .map(|i| usize::try_from(i).map_err(|_| format!("a negative size or stride {i}")))
                    .collect()
            };
            let offset = match c.opt_int("storage_offset")? {
                Some(o) => o,
                None => dim_int(x.storage_offset(), "storage offset")?,
            };
            let offset = usize::try_from(offset).map_err(|_| format!("a negative storage offset {offset}"))?;
            one(x.as_strided(&us(c.ints("size")?)?, &us(c.ints("stride")?)?, offset))
        },
        "aten.scatter_add.default" => {
            |c| one(c.tensor("self")?.scatter_add(c.int("dim")?, &c.tensor("index")?, &c.tensor("src")?))
        }
        "aten.select_scatter.default" => {
            |c| one(c.tensor("self")?.select_scatter(&c.tensor("src")?, c.int("dim")?, c.int("index")?))
        }
        "aten.slice_scatter.default" => |c| {
            one(c.tensor("self")?.slice_scatter(
                &c.tensor("src")?,
                c.int_or("dim", 0)?,
                c.opt_int("start")?,
                c.opt_int("end")?,
                c.int_or("step", 1)?,
            ))
        },
        // Creation from another tensor's or a given shape.
        "aten.copy.default" => |c| {
            let s = c.tensor("self")?;
            let src = c.tensor("src")?;
            let shape: Vec<i64> = sizes(&s)?.iter().map(|&v| v as i64).collect();
            one(src.to(s.dtype()).and_then(|y| y.expand(&shape)).and_then(|y| y.clone_tensor()))
        },
        "aten.fill.Scalar" => |c| {
            let s = c.tensor("self")?;
            one(Ok(full_of(&s, c.scalar("value")?, s.dtype())?))
        },
        "aten.fill.Tensor" => |c| {
            let s = c.tensor("self")?;
            let shape: Vec<i64> = sizes(&s)?.iter().map(|&v| v as i64).collect();
            one(c.tensor("value")?.to(s.dtype()).and_then(|v| v.expand(&shape)).and_then(|v| v.clone_tensor()))
        },
        "aten.empty.memory_format" | "aten.empty_strided.default" => |c| fresh(c, Scalar::Int(0), None),
        "aten.new_zeros.default" | "aten.new_empty.default" => {
            |c| fresh(c, Scalar::Int(0), Some(c.tensor("self")?.dtype()))
        }
        "aten.new_ones.default" => |c| fresh(c, Scalar::Int(1), Some(c.tensor("self")?.dtype())),
        "aten.new_full.default" => |c| fresh(c, c.scalar("fill_value")?, Some(c.tensor("self")?.dtype())),
        "aten.expand_as.default" => |c| one(c.tensor("self")?.expand_as(&c.tensor("other")?)),
        "aten.view_as.default" | "aten.reshape_as.default" => |c| {
            let shape: Vec<i64> = sizes(&c.tensor("other")?)?.iter().map(|&v| v as i64).collect();
            one(c.tensor("self")?.reshape(&shape))
        },
        "aten.type_as.default" => |c| one(c.tensor("self")?.to(c.tensor("other")?.dtype())),
        "aten.sym_numel.default" => |c| Ok(vec![Value::Int(dim_int(c.tensor("self")?.numel(), "numel")?)]),
        "aten.sym_stride.int" => |c| {
            let x = c.tensor("self")?;
            let d = wrap(c.int("dim")?, x.dim())?;
            let st = x.strides().get(d).cloned().ok_or("a stride of a scalar")?;
            Ok(vec![Value::Int(dim_int(st, "stride")?)])
        },
        "aten.sym_storage_offset.default" => {
            |c| Ok(vec![Value::Int(dim_int(c.tensor("self")?.storage_offset(), "storage offset")?)])
        }
        "aten._native_batch_norm_legit.no_stats" => |c| native_batch_norm(c, false, None),
        // Sizes and assertions.
        "aten.sym_size.int" => |c| {
            let x = c.tensor("self")?;
            let d = x.size(c.int("dim")?).map_err(err)?;
            Ok(vec![Value::Int(d.as_const().ok_or("a symbolic size under tracing")?)])
        },
        "aten._assert_tensor_metadata.default" => |c| {
            let x = c.tensor("a")?;
            if let Some(d) = c.dtype("dtype")? {
                if d != x.dtype() {
                    return Err(format!("the tensor is {:?}, the export recorded {d:?}", x.dtype()));
                }
            }
            Ok(vec![])
        },
        "aten._assert_scalar.default"
        | "aten.sym_constrain_range_for_size.default"
        | "aten.sym_constrain_range.default" => |_| Ok(vec![]),
        "_operator.add" => |c| sym_arith(c, i64::checked_add),
        "_operator.sub" => |c| sym_arith(c, i64::checked_sub),
        "_operator.mul" => |c| sym_arith(c, i64::checked_mul),
        // Python's `//` rounds toward negative infinity.
        "_operator.floordiv" => |c| {
            sym_arith(c, |a, b| {
                let q = a.checked_div(b)?;
                Some(if a % b != 0 && (a < 0) != (b < 0) { q - 1 } else { q })
            })
        },
        _ => {
            return match target {
                "aten.max_pool2d_with_indices.default" => Some(OpDef {
                    run: |c| Ok(vec![Value::Tensor(max_pool2d(c)?), Value::Unavailable]),
                    unavailable: &[1],
                }),
                _ => None,
            }
        }
    };
    let unavailable: &'static [usize] = match target {
        "aten.native_dropout.default" => &[1],
        "aten.native_group_norm.default" => &[1, 2],
        _ => &[],
    };
    Some(OpDef { run, unavailable })
}

#[cfg(test)]
mod tests {
    //! Single ops against values PyTorch 2.15 gives for the same call.
    use super::*;
    use crate::schema::NamedArg;

    /// Run `target` on named arguments; tensors are bound in the environment under
    /// their argument's name.
    fn call(target: &str, args: Vec<(&str, Arg)>, tensors: Vec<(&str, Tensor)>) -> R<Vec<Value>> {
        let node = Node {
            name: "n".into(),
            target: target.into(),
            inputs: args.into_iter().map(|(n, a)| NamedArg { name: n.into(), arg: a }).collect(),
            outputs: vec![],
            source: None,
        };
        let env: HashMap<String, Value> = tensors.into_iter().map(|(n, t)| (n.to_string(), Value::Tensor(t))).collect();
        (lookup(target).expect("a known op").run)(&Call { node: &node, env: &env })
    }

    fn t(args: &[(&str, Tensor)]) -> Vec<(&'static str, Tensor)> {
        args.iter().map(|(n, t)| (Box::leak(n.to_string().into_boxed_str()) as &str, t.clone())).collect()
    }

    fn tensor(v: &[Value]) -> &Tensor {
        match &v[0] {
            Value::Tensor(t) => t,
            other => panic!("not a tensor: {other:?}"),
        }
    }

    fn arg(name: &str) -> Arg {
        Arg::Tensor(name.into())
    }

    #[test]
    fn integer_division_with_a_rounding_mode_stays_integral() {
        let a = Tensor::from_vec(vec![7i64, -7], &[2]).unwrap();
        let args =
            |mode: &str| vec![("self", arg("a")), ("other", Arg::Int(2)), ("rounding_mode", Arg::Str(mode.into()))];
        // torch.div(tensor([7, -7]), 2, rounding_mode='floor') == tensor([3, -4])
        let r = call("aten.div.Scalar_mode", args("floor"), t(&[("a", a.clone())])).unwrap();
        assert_eq!((tensor(&r).dtype(), tensor(&r).to_vec_i64().unwrap()), (DType::I64, vec![3, -4]));
        let r = call("aten.div.Scalar_mode", args("trunc"), t(&[("a", a)])).unwrap();
        assert_eq!(tensor(&r).to_vec_i64().unwrap(), vec![3, -3]);
    }

    #[test]
    fn python_floor_division_of_sizes() {
        let args = |a: i64, b: i64| vec![("a", Arg::Int(a)), ("b", Arg::Int(b))];
        for (a, b, want) in [(7, 2, 3), (-7, 2, -4), (7, -2, -4), (-7, -2, 3), (6, -2, -3)] {
            let r = call("_operator.floordiv", args(a, b), vec![]).unwrap();
            assert!(matches!(r[0], Value::Int(v) if v == want), "{a} // {b}: {:?}", r[0]);
        }
        assert!(call("_operator.floordiv", args(i64::MIN, -1), vec![]).is_err());
        assert!(call("_operator.floordiv", args(1, 0), vec![]).is_err());
    }

    #[test]
    fn an_integer_alpha_keeps_integers() {
        // torch.add(tensor([1, 2]), 2, alpha=3) == tensor([7, 8]) (int64)
        let x = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
        let r = call(
            "aten.add.Scalar",
            vec![("self", arg("x")), ("other", Arg::Int(2)), ("alpha", Arg::Int(3))],
            t(&[("x", x)]),
        )
        .unwrap();
        assert_eq!((tensor(&r).dtype(), tensor(&r).to_vec_i64().unwrap()), (DType::I64, vec![7, 8]));
    }

    #[test]
    fn negative_indices_count_from_the_end() {
        // torch.arange(5.)[tensor([-1, 0])] == tensor([4., 0.])
        let x = Tensor::from_vec(vec![0f32, 1., 2., 3., 4.], &[5]).unwrap();
        let i = Tensor::from_vec(vec![-1i64, 0], &[2]).unwrap();
        let r = call(
            "aten.index.Tensor",
            vec![("self", arg("x")), ("indices", Arg::OptionalTensors(vec![Some("i".into())]))],
            t(&[("x", x), ("i", i)]),
        )
        .unwrap();
        assert_eq!(tensor(&r).to_vec_f64().unwrap(), vec![4.0, 0.0]);
    }

    #[test]
    fn slice_bounds_clamp_as_pytorch_does() {
        // torch.arange(5)[2**62:] is empty; [:-2**62] is empty; [1:2**63-1] is [1, 2, 3, 4]
        let x = Tensor::from_vec(vec![0i64, 1, 2, 3, 4], &[5]).unwrap();
        let run = |start: Option<i64>, end: Option<i64>| {
            let mut args = vec![("self", arg("x")), ("dim", Arg::Int(0))];
            if let Some(s) = start {
                args.push(("start", Arg::Int(s)));
            }
            if let Some(e) = end {
                args.push(("end", Arg::Int(e)));
            }
            tensor(&call("aten.slice.Tensor", args, t(&[("x", x.clone())])).unwrap()).to_vec_i64().unwrap()
        };
        assert_eq!(run(Some(1 << 62), None), Vec::<i64>::new());
        assert_eq!(run(None, Some(-(1 << 62))), Vec::<i64>::new());
        assert_eq!(run(Some(1), Some(i64::MAX)), vec![1, 2, 3, 4]);
    }

    #[test]
    fn attention_over_a_fully_masked_row_is_zero() {
        // F.scaled_dot_product_attention(q, k, v, attn_mask=m) with m's first row all
        // False gives zeros in that row (PyTorch's safe softmax), not NaN.
        let q = Tensor::randn(&[1, 2, 4], DType::F32, 0).unwrap();
        let k = Tensor::randn(&[1, 3, 4], DType::F32, 1).unwrap();
        let v = Tensor::randn(&[1, 3, 4], DType::F32, 2).unwrap();
        let m = Tensor::from_vec(vec![false, false, false, true, true, false], &[2, 3]).unwrap();
        let args = vec![("query", arg("q")), ("key", arg("k")), ("value", arg("v")), ("attn_mask", arg("m"))];
        let r = call(
            "aten.scaled_dot_product_attention.default",
            args.clone(),
            t(&[("q", q.clone()), ("k", k.clone()), ("v", v.clone()), ("m", m.clone())]),
        )
        .unwrap();
        let out = tensor(&r).to_vec_f64().unwrap();
        assert!(out[..4].iter().all(|&x| x == 0.0), "{out:?}");
        assert!(out[4..].iter().all(|x| x.is_finite() && *x != 0.0), "{out:?}");
        let mut causal = args;
        causal.push(("is_causal", Arg::Bool(true)));
        let e = call("aten.scaled_dot_product_attention.default", causal, t(&[("q", q), ("k", k), ("v", v), ("m", m)]))
            .unwrap_err();
        assert!(e.contains("attn_mask and is_causal=True together"), "{e}");
    }

    #[test]
    fn integer_reductions_and_argmax_shapes() {
        let b = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
        // torch.sum(tensor([True, False, True])) == tensor(2) (int64)
        let r = call("aten.sum.default", vec![("self", arg("b"))], t(&[("b", b.clone())])).unwrap();
        assert_eq!((tensor(&r).dtype(), tensor(&r).to_vec_i64().unwrap()), (DType::I64, vec![2]));
        // torch.cumsum(tensor([True, False, True]), 0) == tensor([1, 1, 2]) (int64)
        let r = call("aten.cumsum.default", vec![("self", arg("b")), ("dim", Arg::Int(0))], t(&[("b", b)])).unwrap();
        assert_eq!((tensor(&r).dtype(), tensor(&r).to_vec_i64().unwrap()), (DType::I64, vec![1, 1, 2]));
        // torch.argmax(x, keepdim=True) for x of shape [2, 3] has shape [1, 1]
        let x = Tensor::from_vec(vec![1f32, 5., 2., 0., 3., 4.], &[2, 3]).unwrap();
        let r = call("aten.argmax.default", vec![("self", arg("x")), ("keepdim", Arg::Bool(true))], t(&[("x", x)]))
            .unwrap();
        assert_eq!((tensor(&r).sizes().unwrap(), tensor(&r).to_vec_i64().unwrap()), (vec![1, 1], vec![1]));
    }

    #[test]
    fn malformed_shapes_are_errors_not_panics() {
        let s = Tensor::from_vec(vec![1f32], &[]).unwrap();
        let v = Tensor::from_vec(vec![1f32, 2., 3.], &[3]).unwrap();
        let i = Tensor::from_vec(vec![0i64], &[1]).unwrap();
        assert!(call(
            "aten.unflatten.int",
            vec![("self", arg("s")), ("dim", Arg::Int(0)), ("sizes", Arg::Ints(vec![1]))],
            t(&[("s", s.clone())])
        )
        .is_err());
        assert!(call(
            "aten.index.Tensor",
            vec![("self", arg("s")), ("indices", Arg::OptionalTensors(vec![Some("i".into())]))],
            t(&[("s", s), ("i", i)])
        )
        .is_err());
        assert!(call(
            "aten._native_batch_norm_legit_no_training.default",
            vec![
                ("input", arg("v")),
                ("weight", Arg::None),
                ("bias", Arg::None),
                ("running_mean", arg("v")),
                ("running_var", arg("v"))
            ],
            t(&[("v", v.clone())])
        )
        .is_err());
        assert!(call(
            "aten.scaled_dot_product_attention.default",
            vec![("query", arg("v")), ("key", arg("v")), ("value", arg("v")), ("is_causal", Arg::Bool(true))],
            t(&[("v", v)])
        )
        .is_err());
    }
}

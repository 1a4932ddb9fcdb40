//! Parsing op calls: the op name (with in-place spellings), the tensor arguments and
//! each op's parameters. The printer's side is `print::write_call`; the spelling is
//! described in the module docs of [`crate::text`].

use super::lex::Tok;
use super::parse::{Cx, PResult, Params, Parser};
use crate::graph::ValueId;
use crate::op::{BinaryOp, CmpOp, CompositeOp, Op, ReduceOp, UnaryOp};
use crate::sym::Dim;

/// Deepest chain of explicit `inplace.`/`meta_inplace.` wrappers the parser accepts.
const MAX_WRAPPERS: usize = 8;

/// An op family as named in the text, before its parameters are read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Base {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CmpOp),
    Reduce(ReduceOp),
    Where,
    Clamp,
    Cast,
    ArgMax,
    ArgMin,
    Cumsum,
    Argsort,
    Mm,
    Bmm,
    View,
    Permute,
    Transpose,
    T,
    Expand,
    Squeeze,
    Unsqueeze,
    Slice,
    Select,
    AsStrided,
    Alias,
    Clone,
    UnsafeView,
    Copy,
    Full,
    FullLike,
    Arange,
    Rand,
    Randn,
    Bernoulli,
    IndexSelect,
    Gather,
    ScatterAdd,
    Cat,
    SliceScatter,
    SelectScatter,
    AsStridedScatter,
    Linear,
    Matmul,
    Gelu,
    Silu,
    Softmax,
    LogSoftmax,
    LayerNorm,
    Dropout,
    Embedding,
    MseLoss,
    CrossEntropy,
    MaskedFill,
    Tril,
    Triu,
    Var,
    OneHot,
    Conv2d,
    Conv2dInputGrad,
    Conv2dWeightGrad,
    MaxPool2d,
    MaxPool2dGrad,
}

/// Every base other than the families with their own `ALL` lists.
const OTHER_BASES: [Base; 57] = [
    Base::Where,
    Base::Clamp,
    Base::Cast,
    Base::ArgMax,
    Base::ArgMin,
    Base::Cumsum,
    Base::Argsort,
    Base::Mm,
    Base::Bmm,
    Base::View,
    Base::Permute,
    Base::Transpose,
    Base::T,
    Base::Expand,
    Base::Squeeze,
    Base::Unsqueeze,
    Base::Slice,
    Base::Select,
    Base::AsStrided,
    Base::Alias,
    Base::Clone,
    Base::UnsafeView,
    Base::Copy,
    Base::Full,
    Base::FullLike,
    Base::Arange,
    Base::Rand,
    Base::Randn,
    Base::Bernoulli,
    Base::IndexSelect,
    Base::Gather,
    Base::ScatterAdd,
    Base::Cat,
    Base::SliceScatter,
    Base::SelectScatter,
    Base::AsStridedScatter,
    Base::Linear,
    Base::Matmul,
    Base::Gelu,
    Base::Silu,
    Base::Softmax,
    Base::LogSoftmax,
    Base::LayerNorm,
    Base::Dropout,
    Base::Embedding,
    Base::MseLoss,
    Base::CrossEntropy,
    Base::MaskedFill,
    Base::Tril,
    Base::Triu,
    Base::Var,
    Base::OneHot,
    Base::Conv2d,
    Base::Conv2dInputGrad,
    Base::Conv2dWeightGrad,
    Base::MaxPool2d,
    Base::MaxPool2dGrad,
];

const REDUCE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Amin];

impl Base {
    /// Every base, in a fixed order.
    pub(super) fn all() -> impl Iterator<Item = Base> {
        UnaryOp::ALL
            .into_iter()
            .map(Base::Unary)
            .chain(BinaryOp::ALL.into_iter().map(Base::Binary))
            .chain(CmpOp::ALL.into_iter().map(Base::Compare))
            .chain(REDUCE_OPS.into_iter().map(Base::Reduce))
            .chain(OTHER_BASES)
    }

    /// The name in the text (equal to [`Op::name`] of the ops it parses to).
    pub(super) fn name(self) -> &'static str {
        match self {
            Base::Unary(u) => u.name(),
            Base::Binary(b) => b.name(),
            Base::Compare(c) => c.name(),
            Base::Reduce(r) => r.name(),
            Base::Where => "where",
            Base::Clamp => "clamp",
            Base::Cast => "to",
            Base::ArgMax => "argmax",
            Base::ArgMin => "argmin",
            Base::Cumsum => "cumsum",
            Base::Argsort => "argsort",
            Base::Mm => "mm",
            Base::Bmm => "bmm",
            Base::View => "view",
            Base::Permute => "permute",
            Base::Transpose => "transpose",
            Base::T => "t",
            Base::Expand => "expand",
            Base::Squeeze => "squeeze",
            Base::Unsqueeze => "unsqueeze",
            Base::Slice => "slice",
            Base::Select => "select",
            Base::AsStrided => "as_strided",
            Base::Alias => "alias",
            Base::Clone => "clone",
            Base::UnsafeView => "_unsafe_view",
            Base::Copy => "copy",
            Base::Full => "full",
            Base::FullLike => "full_like",
            Base::Arange => "arange",
            Base::Rand => "rand",
            Base::Randn => "randn",
            Base::Bernoulli => "bernoulli",
            Base::IndexSelect => "index_select",
            Base::Gather => "gather",
            Base::ScatterAdd => "scatter_add",
            Base::Cat => "cat",
            Base::SliceScatter => "slice_scatter",
            Base::SelectScatter => "select_scatter",
            Base::AsStridedScatter => "as_strided_scatter",
            Base::Linear => CompositeOp::Linear.name(),
            Base::Matmul => CompositeOp::Matmul.name(),
            Base::Gelu => CompositeOp::Gelu { tanh: false }.name(),
            Base::Silu => CompositeOp::Silu.name(),
            Base::Softmax => CompositeOp::Softmax { dim: 0 }.name(),
            Base::LogSoftmax => CompositeOp::LogSoftmax { dim: 0 }.name(),
            Base::LayerNorm => CompositeOp::LayerNorm { normalized_rank: 0, eps: 0.0 }.name(),
            Base::Dropout => CompositeOp::Dropout { p: 0.0, seed: 0, offset: 0 }.name(),
            Base::Embedding => CompositeOp::Embedding.name(),
            Base::MseLoss => CompositeOp::MseLoss.name(),
            Base::CrossEntropy => CompositeOp::CrossEntropy.name(),
            Base::MaskedFill => "masked_fill",
            Base::Tril => "tril",
            Base::Triu => "triu",
            Base::Var => "var",
            Base::OneHot => "one_hot",
            Base::Conv2d => "conv2d",
            Base::Conv2dInputGrad => "conv2d_input_grad",
            Base::Conv2dWeightGrad => "conv2d_weight_grad",
            Base::MaxPool2d => "max_pool2d",
            Base::MaxPool2dGrad => "max_pool2d_grad",
        }
    }

    /// The base named `name`.
    pub(super) fn lookup(name: &str) -> Option<Base> {
        Base::all().find(|b| b.name() == name)
    }
}

/// Parses `name(%a, .., params..)` (the part of a node line after `=`).
pub(super) fn parse_call<'a>(p: &mut Parser<'a>) -> PResult<(Op, Vec<ValueId>)> {
    // Explicit wrappers `inplace.` / `meta_inplace.` (true: InPlace).
    let mut wrappers: Vec<bool> = Vec::new();
    let (name, name_at) = loop {
        let sp = p.bump()?;
        let Tok::Ident(name) = sp.tok else {
            return Err(p.unexpected(&sp, "an op name after `=`"));
        };
        let wrapper = match name {
            "inplace" => Some(true),
            "meta_inplace" => Some(false),
            _ => None,
        };
        if let Some(w) = wrapper {
            if p.eat_punct('.')? {
                if wrappers.len() >= MAX_WRAPPERS {
                    return Err(p.err_at(sp.start, format!("more than {MAX_WRAPPERS} nested in-place wrappers")));
                }
                wrappers.push(w);
                continue;
            }
        }
        break (name, sp.start);
    };
    let (base, sugar) = match Base::lookup(name) {
        Some(b) => (b, false),
        None => match name.strip_suffix('_').and_then(Base::lookup) {
            Some(b) => (b, true),
            None => return Err(p.err_at(name_at, format!("unknown op `{name}`"))),
        },
    };
    p.expect_punct('(', format_args!("after the op name `{name}`"))?;
    let mut args = Vec::new();
    let mut st = Params { op: name, closed: None, first: true, after_comma: false };
    loop {
        let sp = p.peek()?;
        match sp.tok {
            Tok::Value(v) => {
                p.bump()?;
                args.push(ValueId(v));
                let sp = p.bump()?;
                match sp.tok {
                    Tok::Punct(',') => st.after_comma = true,
                    Tok::Punct(')') => {
                        st.closed = Some(sp.start);
                        break;
                    }
                    _ => {
                        return Err(p.err_at(
                            sp.start,
                            format!("{name}: expected `,` or `)` after a tensor argument, found {}", sp.tok.describe()),
                        ))
                    }
                }
            }
            Tok::Punct(')') if !st.after_comma => {
                st.closed = Some(sp.start);
                p.bump()?;
                break;
            }
            _ => break,
        }
    }
    let mut op = parse_params(p, base, &mut st)?;
    p.end_params(&st)?;
    if sugar {
        op = if op.is_pointwise() {
            Op::InPlace(Box::new(op))
        } else if op.is_view() {
            Op::MetaInPlace(Box::new(op))
        } else {
            let inner = base.name();
            return Err(p.err_at(
                name_at,
                format!(
                    "`{name}`: a trailing `_` marks an in-place op, which needs a pointwise or view op, \
                     and `{inner}` is neither (write `inplace.{inner}` or `meta_inplace.{inner}`)"
                ),
            ));
        };
    }
    for w in wrappers.into_iter().rev() {
        op = if w { Op::InPlace(Box::new(op)) } else { Op::MetaInPlace(Box::new(op)) };
    }
    Ok((op, args))
}

/// The parameters of `base`, after its tensor arguments.
fn parse_params(p: &mut Parser<'_>, base: Base, st: &mut Params<'_>) -> PResult<Op> {
    let op = st.op;
    let cx = |param| Cx { op, param };
    Ok(match base {
        Base::Unary(u) => Op::Unary(u),
        // `mul(%0, %1)` is Binary, `mul(%0, 2.0)` BinaryScalar: a parameter after the
        // tensor arguments is the scalar.
        Base::Binary(b) if st.closed.is_some() => Op::Binary(b),
        Base::Compare(c) if st.closed.is_some() => Op::Compare(c),
        Base::Binary(b) => {
            p.positional(st, "a scalar")?;
            Op::BinaryScalar(b, p.scalar(cx("other"))?)
        }
        Base::Compare(c) => {
            p.positional(st, "a scalar")?;
            Op::CompareScalar(c, p.scalar(cx("other"))?)
        }
        Base::Reduce(r) => {
            p.named(st, "dims")?;
            let dims = p.usize_list(cx("dims"))?;
            p.named(st, "keepdim")?;
            Op::Reduce { op: r, dims, keepdim: p.bool_value(cx("keepdim"))? }
        }
        Base::Where => Op::Where,
        Base::Clamp => {
            p.named(st, "min")?;
            let min = p.opt_scalar(cx("min"))?;
            p.named(st, "max")?;
            Op::Clamp { min, max: p.opt_scalar(cx("max"))? }
        }
        Base::Cast => {
            p.named(st, "dtype")?;
            Op::Cast(p.dtype_value(cx("dtype"))?)
        }
        Base::ArgMax | Base::ArgMin => {
            p.named(st, "dim")?;
            let dim = p.usize_value(cx("dim"))?;
            p.named(st, "keepdim")?;
            let keepdim = p.bool_value(cx("keepdim"))?;
            if base == Base::ArgMax {
                Op::ArgMax { dim, keepdim }
            } else {
                Op::ArgMin { dim, keepdim }
            }
        }
        Base::Cumsum => {
            p.named(st, "dim")?;
            Op::Cumsum(p.usize_value(cx("dim"))?)
        }
        Base::Argsort => {
            p.named(st, "dim")?;
            let dim = p.usize_value(cx("dim"))?;
            p.named(st, "descending")?;
            Op::Argsort { dim, descending: p.bool_value(cx("descending"))? }
        }
        Base::Mm => Op::Mm,
        Base::Bmm => Op::Bmm,
        Base::View | Base::UnsafeView | Base::Expand => {
            p.positional(st, "a shape `[..]`")?;
            let shape = p.dim_list(cx("shape"))?;
            match base {
                Base::View => Op::View(shape),
                Base::UnsafeView => Op::UnsafeView(shape),
                _ => Op::Expand(shape),
            }
        }
        Base::Permute => {
            p.positional(st, "a permutation `[..]`")?;
            Op::Permute(p.usize_list(cx("dims"))?)
        }
        Base::Transpose => {
            p.positional(st, "the first dim")?;
            let a = p.usize_value(cx("dim0"))?;
            p.positional(st, "the second dim")?;
            Op::Transpose(a, p.usize_value(cx("dim1"))?)
        }
        Base::T => Op::T,
        Base::Squeeze => {
            p.named(st, "dims")?;
            Op::Squeeze(p.usize_list(cx("dims"))?)
        }
        Base::Unsqueeze | Base::IndexSelect | Base::Gather | Base::ScatterAdd | Base::Cat => {
            p.named(st, "dim")?;
            let d = p.usize_value(cx("dim"))?;
            match base {
                Base::Unsqueeze => Op::Unsqueeze(d),
                Base::IndexSelect => Op::IndexSelect(d),
                Base::Gather => Op::Gather(d),
                Base::ScatterAdd => Op::ScatterAdd(d),
                _ => Op::Cat(d),
            }
        }
        Base::Slice | Base::SliceScatter => {
            p.named(st, "dim")?;
            let dim = p.usize_value(cx("dim"))?;
            let (start, end) = (named_dim(p, st, "start")?, named_dim(p, st, "end")?);
            p.named(st, "step")?;
            let step = p.i64_value(cx("step"))?;
            if base == Base::Slice {
                Op::Slice { dim, start, end, step }
            } else {
                Op::SliceScatter { dim, start, end, step }
            }
        }
        Base::Select | Base::SelectScatter => {
            p.named(st, "dim")?;
            let dim = p.usize_value(cx("dim"))?;
            let index = named_dim(p, st, "index")?;
            if base == Base::Select {
                Op::Select { dim, index }
            } else {
                Op::SelectScatter { dim, index }
            }
        }
        Base::AsStrided | Base::AsStridedScatter => {
            p.named(st, "size")?;
            let size = p.dim_list(cx("size"))?.to_vec();
            p.named(st, "stride")?;
            let stride = p.dim_list(cx("stride"))?.to_vec();
            let offset = named_dim(p, st, "offset")?;
            if base == Base::AsStrided {
                Op::AsStrided { size, stride, offset }
            } else {
                Op::AsStridedScatter { size, stride, offset }
            }
        }
        Base::Alias => Op::Alias,
        Base::Clone => Op::Clone,
        Base::Copy => Op::Copy,
        Base::Full => {
            p.named(st, "shape")?;
            let shape = p.dim_list(cx("shape"))?;
            p.named(st, "value")?;
            let value = p.scalar(cx("value"))?;
            p.named(st, "dtype")?;
            Op::Full { shape, value, dtype: p.dtype_value(cx("dtype"))? }
        }
        Base::FullLike => {
            p.named(st, "value")?;
            let value = p.scalar(cx("value"))?;
            p.named(st, "dtype")?;
            Op::FullLike { value, dtype: p.opt_dtype(cx("dtype"))? }
        }
        Base::Arange => {
            p.named(st, "start")?;
            let start = p.scalar(cx("start"))?;
            p.named(st, "end")?;
            let end = p.scalar(cx("end"))?;
            p.named(st, "step")?;
            let step = p.scalar(cx("step"))?;
            p.named(st, "dtype")?;
            Op::Arange { start, end, step, dtype: p.dtype_value(cx("dtype"))? }
        }
        Base::Rand | Base::Randn => {
            p.named(st, "shape")?;
            let shape = p.dim_list(cx("shape"))?;
            p.named(st, "dtype")?;
            let dtype = p.dtype_value(cx("dtype"))?;
            let (seed, offset) = seed_offset(p, st)?;
            if base == Base::Rand {
                Op::Rand { shape, dtype, seed, offset }
            } else {
                Op::Randn { shape, dtype, seed, offset }
            }
        }
        Base::Bernoulli | Base::Dropout => {
            p.named(st, "p")?;
            let prob = p.f64_value(cx("p"))?;
            let (seed, offset) = seed_offset(p, st)?;
            if base == Base::Bernoulli {
                Op::Bernoulli { p: prob, seed, offset }
            } else {
                Op::Composite(CompositeOp::Dropout { p: prob, seed, offset })
            }
        }
        Base::Linear => Op::Composite(CompositeOp::Linear),
        Base::Matmul => Op::Composite(CompositeOp::Matmul),
        Base::Gelu => {
            p.named(st, "tanh")?;
            Op::Composite(CompositeOp::Gelu { tanh: p.bool_value(cx("tanh"))? })
        }
        Base::Silu => Op::Composite(CompositeOp::Silu),
        Base::Softmax | Base::LogSoftmax => {
            p.named(st, "dim")?;
            let dim = p.usize_value(cx("dim"))?;
            Op::Composite(if base == Base::Softmax {
                CompositeOp::Softmax { dim }
            } else {
                CompositeOp::LogSoftmax { dim }
            })
        }
        Base::LayerNorm => {
            p.named(st, "normalized_rank")?;
            let normalized_rank = p.usize_value(cx("normalized_rank"))?;
            p.named(st, "eps")?;
            Op::Composite(CompositeOp::LayerNorm { normalized_rank, eps: p.f64_value(cx("eps"))? })
        }
        Base::Embedding => Op::Composite(CompositeOp::Embedding),
        Base::MseLoss => Op::Composite(CompositeOp::MseLoss),
        Base::CrossEntropy => Op::Composite(CompositeOp::CrossEntropy),
        Base::MaskedFill => {
            p.named(st, "value")?;
            Op::Composite(CompositeOp::MaskedFill { value: p.scalar(cx("value"))? })
        }
        Base::Tril | Base::Triu => {
            p.named(st, "diagonal")?;
            let diagonal = p.i64_value(cx("diagonal"))?;
            Op::Composite(if base == Base::Tril {
                CompositeOp::Tril { diagonal }
            } else {
                CompositeOp::Triu { diagonal }
            })
        }
        Base::Var => {
            p.named(st, "dims")?;
            let dims = p.usize_list(cx("dims"))?;
            p.named(st, "correction")?;
            let correction = p.i64_value(cx("correction"))?;
            p.named(st, "keepdim")?;
            Op::Composite(CompositeOp::Var { dims, correction, keepdim: p.bool_value(cx("keepdim"))? })
        }
        Base::OneHot => {
            p.named(st, "num_classes")?;
            Op::Composite(CompositeOp::OneHot { num_classes: p.usize_value(cx("num_classes"))? })
        }
        Base::Conv2d => Op::Conv2d(conv_params(p, st)?),
        Base::Conv2dInputGrad => {
            let conv = conv_params(p, st)?;
            Op::Conv2dInputGrad { conv, input: pair(p, st, "input")? }
        }
        Base::Conv2dWeightGrad => {
            let conv = conv_params(p, st)?;
            Op::Conv2dWeightGrad { conv, kernel: pair(p, st, "kernel")? }
        }
        Base::MaxPool2d | Base::MaxPool2dGrad => {
            let params = crate::op::Pool2dParams {
                kernel: pair(p, st, "kernel")?,
                stride: pair(p, st, "stride")?,
                padding: pair(p, st, "padding")?,
                dilation: pair(p, st, "dilation")?,
            };
            if base == Base::MaxPool2d {
                Op::MaxPool2d(params)
            } else {
                Op::MaxPool2dGrad(params)
            }
        }
    })
}

/// `name=[a, b]`: a list of exactly two sizes.
fn pair(p: &mut Parser<'_>, st: &mut Params<'_>, name: &str) -> PResult<[usize; 2]> {
    p.named(st, name)?;
    let at = p.peek()?.start;
    let v = p.usize_list(Cx { op: st.op, param: name })?;
    match v[..] {
        [a, b] => Ok([a, b]),
        _ => Err(p.err_at(at, format!("`{}`: `{name}` must list two sizes, got {}", st.op, v.len()))),
    }
}

/// `stride=[..], padding=[..], dilation=[..], groups=<n>`.
fn conv_params(p: &mut Parser<'_>, st: &mut Params<'_>) -> PResult<crate::op::Conv2dParams> {
    let stride = pair(p, st, "stride")?;
    let padding = pair(p, st, "padding")?;
    let dilation = pair(p, st, "dilation")?;
    p.named(st, "groups")?;
    let groups = p.usize_value(Cx { op: st.op, param: "groups" })?;
    Ok(crate::op::Conv2dParams { stride, padding, dilation, groups })
}

/// `name=<dim>`.
fn named_dim(p: &mut Parser<'_>, st: &mut Params<'_>, name: &str) -> PResult<Dim> {
    p.named(st, name)?;
    p.dim(Cx { op: st.op, param: name })
}

/// `seed=<u64>, offset=<u64>`.
fn seed_offset(p: &mut Parser<'_>, st: &mut Params<'_>) -> PResult<(u64, u64)> {
    p.named(st, "seed")?;
    let seed = p.u64_value(Cx { op: st.op, param: "seed" })?;
    p.named(st, "offset")?;
    let offset = p.u64_value(Cx { op: st.op, param: "offset" })?;
    Ok((seed, offset))
}

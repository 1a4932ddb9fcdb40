//! The printer of the graph text format: one pass, one `String`, linear in the graph.
//!
//! Op calls print as `name(%a, %b, positional.., key=value, ..)`: tensor arguments first,
//! then the op's parameters in a fixed order (the parser in `ops` reads the same order).

use super::lex::write_string;
use crate::dtype::Scalar;
use crate::graph::{Graph, SourceLoc, ValueId};
use crate::meta::DimList;
use crate::op::{CompositeOp, Op};
use std::fmt::{self, Write};

/// Prints `g` (see the module docs of [`crate::text`] for the format).
pub(super) fn print_graph(g: &Graph) -> String {
    // About 64 bytes a line is typical; one allocation up front for most graphs.
    let mut out = String::with_capacity(64 * (g.inputs.len() + g.nodes.len() + 2));
    out.push_str("graph(");
    for (i, input) in g.inputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}: {} {} ", input.id, input.meta, input.storage);
        write_string(&mut out, &input.name);
    }
    out.push_str(") {\n");
    for n in &g.nodes {
        let _ = write!(out, "  {}: {} {} = ", n.out, n.meta, n.storage);
        write_call(&mut out, &n.op, &n.args);
        if let Some(loc) = &n.loc {
            out.push_str("  # ");
            write_loc(&mut out, loc);
        }
        out.push('\n');
    }
    out.push_str("  return (");
    for (i, v) in g.outputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{v}");
    }
    out.push_str(")\n}\n");
    out
}

/// `file:line:col`; the file is quoted when it could not be read back raw (it starts
/// with `"` or holds control characters such as a newline).
fn write_loc(out: &mut String, loc: &SourceLoc) {
    if loc.file.starts_with('"') || loc.file.chars().any(char::is_control) {
        write_string(out, &loc.file);
    } else {
        out.push_str(&loc.file);
    }
    let _ = write!(out, ":{}:{}", loc.line, loc.col);
}

/// A scalar as [`Scalar`]'s Display prints it, except that a NaN other than the
/// canonical `f64::NAN` prints its bits, `NaN(0x7ff8000000000001)`, to round-trip exactly.
fn write_scalar(out: &mut String, s: Scalar) {
    match s {
        Scalar::Float(x) => write_f64(out, x),
        s => {
            let _ = write!(out, "{s}");
        }
    }
}

/// An f64 that always reads as a float (`2.0`, `1e20`, `inf`, `NaN`) and parses back
/// to the same bits.
fn write_f64(out: &mut String, x: f64) {
    if x.is_nan() && x.to_bits() != f64::NAN.to_bits() {
        let _ = write!(out, "NaN(0x{:016x})", x.to_bits());
    } else {
        let _ = write!(out, "{}", Scalar::Float(x));
    }
}

// ---- op calls -----------------------------------------------------------------

/// Writes the parameters after the tensor arguments, each preceded by `, ` (or by
/// nothing when it comes first).
struct ParamWriter<'o> {
    out: &'o mut String,
    first: bool,
}

impl ParamWriter<'_> {
    fn sep(&mut self) {
        if !self.first {
            self.out.push_str(", ");
        }
        self.first = false;
    }
    fn pos(&mut self, v: impl fmt::Display) {
        self.sep();
        let _ = write!(self.out, "{v}");
    }
    fn named(&mut self, name: &str, v: impl fmt::Display) {
        self.sep();
        let _ = write!(self.out, "{name}={v}");
    }
    fn scalar(&mut self, name: Option<&str>, s: Scalar) {
        self.sep();
        if let Some(name) = name {
            let _ = write!(self.out, "{name}=");
        }
        write_scalar(self.out, s);
    }
    fn opt_scalar(&mut self, name: &str, s: Option<Scalar>) {
        match s {
            Some(s) => self.scalar(Some(name), s),
            None => self.named(name, "None"),
        }
    }
    fn float(&mut self, name: &str, x: f64) {
        self.sep();
        let _ = write!(self.out, "{name}=");
        write_f64(self.out, x);
    }
}

/// `[0, 2, 1]`.
struct UsizeList<'a>(&'a [usize]);

impl fmt::Display for UsizeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Writes `name(%a, %b, params..)` for a node.
fn write_call(out: &mut String, op: &Op, args: &[ValueId]) {
    write_op_name(out, op);
    out.push('(');
    let mut w = ParamWriter { out, first: true };
    for a in args {
        w.pos(a);
    }
    write_params(&mut w, op);
    out.push(')');
}

fn write_op_name(out: &mut String, op: &Op) {
    match op {
        Op::InPlace(inner) if !inner.is_pointwise() => {
            out.push_str("inplace.");
            write_op_name(out, inner);
        }
        Op::MetaInPlace(inner) if !inner.is_view() => {
            out.push_str("meta_inplace.");
            write_op_name(out, inner);
        }
        _ => out.push_str(&op.name()),
    }
}

fn conv_params(w: &mut ParamWriter<'_>, c: &crate::op::Conv2dParams) {
    w.named("stride", UsizeList(&c.stride));
    w.named("padding", UsizeList(&c.padding));
    w.named("dilation", UsizeList(&c.dilation));
    w.named("groups", c.groups);
}

fn write_params(w: &mut ParamWriter<'_>, op: &Op) {
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Mm | Op::Bmm | Op::T | Op::Alias => {}
        Op::Clone | Op::Copy => {}
        Op::BinaryScalar(_, s) | Op::CompareScalar(_, s) => w.scalar(None, *s),
        Op::Clamp { min, max } => {
            w.opt_scalar("min", *min);
            w.opt_scalar("max", *max);
        }
        Op::Cast(d) => w.named("dtype", d),
        Op::Reduce { op: _, dims, keepdim } => {
            w.named("dims", UsizeList(dims));
            w.named("keepdim", keepdim);
        }
        Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => {
            w.named("dim", dim);
            w.named("keepdim", keepdim);
        }
        Op::Argsort { dim, descending } => {
            w.named("dim", dim);
            w.named("descending", descending);
        }
        Op::View(shape) | Op::UnsafeView(shape) | Op::Expand(shape) => w.pos(DimList(shape)),
        Op::Permute(p) => w.pos(UsizeList(p)),
        Op::Transpose(a, b) => {
            w.pos(a);
            w.pos(b);
        }
        Op::Squeeze(dims) => w.named("dims", UsizeList(dims)),
        Op::Unsqueeze(d) | Op::IndexSelect(d) | Op::Gather(d) | Op::ScatterAdd(d) | Op::Cat(d) | Op::Cumsum(d) => {
            w.named("dim", d)
        }
        Op::Slice { dim, start, end, step } | Op::SliceScatter { dim, start, end, step } => {
            w.named("dim", dim);
            w.named("start", start);
            w.named("end", end);
            w.named("step", step);
        }
        Op::Select { dim, index } | Op::SelectScatter { dim, index } => {
            w.named("dim", dim);
            w.named("index", index);
        }
        Op::AsStrided { size, stride, offset } | Op::AsStridedScatter { size, stride, offset } => {
            w.named("size", DimList(size));
            w.named("stride", DimList(stride));
            w.named("offset", offset);
        }
        Op::InPlace(inner) | Op::MetaInPlace(inner) => write_params(w, inner),
        Op::Conv2d(c) => conv_params(w, c),
        Op::Conv2dInputGrad { conv, input } => {
            conv_params(w, conv);
            w.named("input", UsizeList(input));
        }
        Op::Conv2dWeightGrad { conv, kernel } => {
            conv_params(w, conv);
            w.named("kernel", UsizeList(kernel));
        }
        Op::MaxPool2d(p) | Op::MaxPool2dGrad(p) => {
            w.named("kernel", UsizeList(&p.kernel));
            w.named("stride", UsizeList(&p.stride));
            w.named("padding", UsizeList(&p.padding));
            w.named("dilation", UsizeList(&p.dilation));
        }
        Op::Full { shape, value, dtype } => {
            w.named("shape", DimList(shape));
            w.scalar(Some("value"), *value);
            w.named("dtype", dtype);
        }
        Op::FullLike { value, dtype } => {
            w.scalar(Some("value"), *value);
            match dtype {
                Some(d) => w.named("dtype", d),
                None => w.named("dtype", "None"),
            }
        }
        Op::Arange { start, end, step, dtype } => {
            w.scalar(Some("start"), *start);
            w.scalar(Some("end"), *end);
            w.scalar(Some("step"), *step);
            w.named("dtype", dtype);
        }
        Op::Rand { shape, dtype, seed, offset } | Op::Randn { shape, dtype, seed, offset } => {
            w.named("shape", DimList(shape));
            w.named("dtype", dtype);
            w.named("seed", seed);
            w.named("offset", offset);
        }
        Op::Bernoulli { p, seed, offset } | Op::Composite(CompositeOp::Dropout { p, seed, offset }) => {
            w.float("p", *p);
            w.named("seed", seed);
            w.named("offset", offset);
        }
        Op::Composite(c) => match c {
            CompositeOp::Gelu { tanh } => w.named("tanh", tanh),
            CompositeOp::Softmax { dim } | CompositeOp::LogSoftmax { dim } => w.named("dim", dim),
            CompositeOp::LayerNorm { normalized_rank, eps } => {
                w.named("normalized_rank", normalized_rank);
                w.float("eps", *eps);
            }
            CompositeOp::MaskedFill { value } => w.scalar(Some("value"), *value),
            CompositeOp::Tril { diagonal } | CompositeOp::Triu { diagonal } => w.named("diagonal", diagonal),
            CompositeOp::Var { dims, correction, keepdim } => {
                w.named("dims", UsizeList(dims));
                w.named("correction", correction);
                w.named("keepdim", keepdim);
            }
            CompositeOp::OneHot { num_classes } => w.named("num_classes", num_classes),
            CompositeOp::Linear
            | CompositeOp::Matmul
            | CompositeOp::Silu
            | CompositeOp::Dropout { .. }
            | CompositeOp::Embedding
            | CompositeOp::MseLoss
            | CompositeOp::CrossEntropy => {}
        },
    }
}

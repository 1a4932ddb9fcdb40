//! `Display` for tensors, laid out like PyTorch's printing: nested brackets, one row
//! per line, every element padded to one width, floats as `1.` when all are whole,
//! else with 4 decimals (scientific when the magnitudes call for it), and large
//! tensors summarized with `...` (the first and last 3 entries of each dim beyond
//! 1,000 elements). The dtype is always named; a fake tensor prints its metadata.

use super::{Repr, Tensor};
use aotgrad_ir::DType;
use std::fmt;

/// Elements beyond which a tensor is summarized.
const SUMMARIZE_ABOVE: usize = 1000;
/// Entries kept at each end of a summarized dim.
const EDGE: usize = 3;

/// How every element of one tensor is written.
enum Style {
    Bool,
    Int,
    /// Whole-valued floats: `1.`.
    Whole,
    Fixed,
    Sci,
}

fn style(dtype: DType, vals: &[f64]) -> Style {
    match dtype {
        DType::Bool => Style::Bool,
        DType::I32 | DType::I64 => Style::Int,
        _ => {
            let finite: Vec<f64> = vals.iter().copied().filter(|v| v.is_finite()).collect();
            let max = finite.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let min_nonzero = finite.iter().filter(|v| **v != 0.0).fold(f64::INFINITY, |m, v| m.min(v.abs()));
            if finite.iter().all(|v| v.fract() == 0.0) && max < 1e8 {
                Style::Whole
            } else if max >= 1e8 || (min_nonzero.is_finite() && min_nonzero < 1e-4) || max / min_nonzero > 1e3 {
                Style::Sci
            } else {
                Style::Fixed
            }
        }
    }
}

fn elem(s: &Style, v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    match s {
        Style::Bool => if v != 0.0 { "True" } else { "False" }.into(),
        Style::Int => format!("{}", v as i64),
        Style::Whole => format!("{v:.0}."),
        Style::Fixed => format!("{v:.4}"),
        Style::Sci => {
            // PyTorch's `1.0000e-05`: a signed, two-digit exponent.
            let t = format!("{v:.4e}");
            match t.split_once('e') {
                Some((m, e)) => {
                    let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                    format!("{m}e{sign}{digits:0>2}")
                }
                None => t,
            }
        }
    }
}

/// The indices of a dim of `n` entries that are printed (`None` marks the `...`).
fn shown(n: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && n > 2 * EDGE {
        (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    }
}

/// What [`write_dim`] prints from.
struct Grid<'a> {
    vals: &'a [String],
    shape: &'a [usize],
    strides: &'a [usize],
    summarize: bool,
    indent: usize,
}

fn write_dim(out: &mut String, g: &Grid<'_>, base: usize, depth: usize) {
    out.push('[');
    let last = depth + 1 == g.shape.len();
    for (k, i) in shown(g.shape[depth], g.summarize).into_iter().enumerate() {
        if k > 0 {
            if last {
                out.push_str(", ");
            } else {
                out.push(',');
                out.push_str(&"\n".repeat(g.shape.len() - depth - 1));
                out.push_str(&" ".repeat(g.indent + depth + 1));
            }
        }
        match i {
            // PyTorch's innermost ellipsis is " ..." (so `2,  ...,`), outer ones "...".
            None => out.push_str(if last { " ..." } else { "..." }),
            Some(i) if last => out.push_str(&g.vals[base + i * g.strides[depth]]),
            Some(i) => write_dim(out, g, base + i * g.strides[depth], depth + 1),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    /// `tensor([[1., 2.],\n        [3., 4.]], dtype=f32)`; see the module docs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.snapshot();
        let t = match &st.repr {
            Repr::Fake(x) => return write!(f, "tensor(<fake {}>)", x.meta),
            Repr::Eager(t) => t.clone(),
        };
        let dtype = t.meta.dtype;
        let grad = if st.requires_grad() { ", requires_grad=true" } else { "" };
        let Ok(vals) = t.try_to_vec_f64() else {
            return write!(f, "tensor(<unreadable {}>)", t.meta);
        };
        let shape = t.meta.concrete_shape().unwrap_or_default();
        let numel: usize = shape.iter().product();
        let summarize = numel > SUMMARIZE_ABOVE;
        // Format only what is printed (so a summarized tensor's style follows its
        // shown entries, as PyTorch's does).
        let mut strides = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let mut keep = vec![!summarize; vals.len()];
        if summarize {
            mark(&mut keep, &shape, &strides, 0, 0);
        }
        let shown_vals: Vec<f64> = vals.iter().zip(&keep).filter(|(_, k)| **k).map(|(v, _)| *v).collect();
        let s = style(dtype, &shown_vals);
        let mut texts: Vec<String> =
            vals.iter().zip(&keep).map(|(v, k)| if *k { elem(&s, *v) } else { String::new() }).collect();
        let width = texts.iter().map(String::len).max().unwrap_or(0);
        for x in &mut texts {
            if !x.is_empty() {
                *x = format!("{x:>width$}");
            }
        }
        let mut body = String::new();
        if shape.is_empty() {
            body.push_str(texts.first().map_or("", |s| s.trim()));
        } else if numel == 0 {
            body.push_str("[]");
            if shape.len() > 1 {
                body = format!("[], size={shape:?}");
            }
        } else {
            let grid = Grid { vals: &texts, shape: &shape, strides: &strides, summarize, indent: "tensor(".len() };
            write_dim(&mut body, &grid, 0, 0);
        }
        write!(f, "tensor({body}, dtype={dtype}{grad})")
    }
}

/// Mark the elements a summarized print shows.
fn mark(keep: &mut [bool], shape: &[usize], strides: &[usize], depth: usize, base: usize) {
    for i in shown(shape[depth], true).into_iter().flatten() {
        let at = base + i * strides[depth];
        if depth + 1 == shape.len() {
            keep[at] = true;
        } else {
            mark(keep, shape, strides, depth + 1, at);
        }
    }
}

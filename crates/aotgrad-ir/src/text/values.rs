//! Values in the graph text: integers, bools, dtypes, scalars (with exact floats),
//! lists, symbolic dims and tensor metas. An `impl` block of the [`Parser`].

use super::lex::Tok;
use super::parse::{syn, Cx, PResult, Parser};
use crate::dtype::{DType, Scalar};
use crate::meta::Dims;
use crate::meta::{checked_contiguous_strides, DimList, TensorMeta};
use crate::sym::{Dim, SymId};
use std::collections::BTreeMap;

impl Parser<'_> {
    /// A decimal integer that fits `T` (non-negative).
    pub(super) fn unsigned<T: TryFrom<u64>>(&mut self, cx: Cx<'_>) -> PResult<T> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => n
                .parse::<u64>()
                .ok()
                .and_then(|v| T::try_from(v).ok())
                .ok_or_else(|| self.err_at(sp.start, format!("integer `{n}` is out of range for {cx}"))),
            _ => Err(self.unexpected(&sp, format_args!("a non-negative integer for {cx}"))),
        }
    }

    /// A `usize`.
    pub(super) fn usize_value(&mut self, cx: Cx<'_>) -> PResult<usize> {
        self.unsigned::<usize>(cx)
    }

    /// A `u64`.
    pub(super) fn u64_value(&mut self, cx: Cx<'_>) -> PResult<u64> {
        self.unsigned::<u64>(cx)
    }

    /// A signed decimal `i64`.
    pub(super) fn i64_value(&mut self, cx: Cx<'_>) -> PResult<i64> {
        let neg = self.eat_punct('-')?;
        let sp = self.bump()?;
        match sp.tok {
            Tok::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => signed(n, neg)
                .ok_or_else(|| self.err_at(sp.start, format!("integer `{n}` is out of range (i64) for {cx}"))),
            _ => Err(self.unexpected(&sp, format_args!("an integer for {cx}"))),
        }
    }

    /// `true` or `false`.
    pub(super) fn bool_value(&mut self, cx: Cx<'_>) -> PResult<bool> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Ident("true") => Ok(true),
            Tok::Ident("false") => Ok(false),
            _ => Err(self.unexpected(&sp, format_args!("`true` or `false` for {cx}"))),
        }
    }

    /// A dtype name (`f32`, `i64`, `bool`, ...).
    pub(super) fn dtype_value(&mut self, cx: Cx<'_>) -> PResult<DType> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Ident(name) => DType::from_name(name).ok_or_else(|| {
                self.err_at(
                    sp.start,
                    format!("unknown dtype `{name}` for {cx} (expected bool, i32, i64, f16, bf16, f32 or f64)"),
                )
            }),
            _ => Err(self.unexpected(&sp, format_args!("a dtype such as `f32` for {cx}"))),
        }
    }

    /// A dtype or `None`.
    pub(super) fn opt_dtype(&mut self, cx: Cx<'_>) -> PResult<Option<DType>> {
        if self.eat_ident("None")? {
            return Ok(None);
        }
        self.dtype_value(cx).map(Some)
    }

    /// A scalar: `true`/`false`, an integer (`2`, `-3`), or a float (`2.0`, `1e-5`,
    /// `-0.0`, `inf`, `-inf`, `NaN`, `NaN(0x7ff8000000000001)` for other NaN bit patterns).
    pub(super) fn scalar(&mut self, cx: Cx<'_>) -> PResult<Scalar> {
        let sp = self.bump()?;
        let expected = || format!("a scalar (`2`, `2.0`, `true`, `inf`, `NaN`) for {cx}");
        let (neg, sp) = match sp.tok {
            Tok::Punct('-') => (true, self.bump()?),
            Tok::Ident("true") => return Ok(Scalar::Bool(true)),
            Tok::Ident("false") => return Ok(Scalar::Bool(false)),
            Tok::Ident("NaN") => return self.nan_payload(cx),
            _ => (false, sp),
        };
        match sp.tok {
            Tok::Ident("inf") => Ok(Scalar::Float(if neg { f64::NEG_INFINITY } else { f64::INFINITY })),
            Tok::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => signed(n, neg)
                .map(Scalar::Int)
                .ok_or_else(|| self.err_at(sp.start, format!("integer `{n}` is out of range (i64) for {cx}"))),
            Tok::Number(n) if !n.starts_with("0x") => match n.parse::<f64>() {
                Ok(x) => Ok(Scalar::Float(if neg { -x } else { x })),
                Err(_) => Err(self.err_at(sp.start, format!("invalid float `{n}` for {cx}"))),
            },
            _ if neg => Err(self.unexpected(&sp, format_args!("a number or `inf` after `-` for {cx}"))),
            _ => Err(self.unexpected(&sp, expected())),
        }
    }

    /// After `NaN`: an optional `(0x<64-bit pattern>)`.
    fn nan_payload(&mut self, cx: Cx<'_>) -> PResult<Scalar> {
        if !self.eat_punct('(')? {
            return Ok(Scalar::Float(f64::NAN));
        }
        let sp = self.bump()?;
        let bits = match sp.tok {
            Tok::Number(n) => n.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok()),
            _ => None,
        };
        let x = bits.map(f64::from_bits).filter(|x| x.is_nan()).ok_or_else(|| {
            self.unexpected(&sp, format_args!("the bits of a NaN in hex (`0x7ff8000000000001`) for {cx}"))
        })?;
        self.expect_punct(')', "after the NaN bits")?;
        Ok(Scalar::Float(x))
    }

    /// A float; integers are accepted and converted.
    pub(super) fn f64_value(&mut self, cx: Cx<'_>) -> PResult<f64> {
        let at = self.peek()?.start;
        match self.scalar(cx)? {
            Scalar::Float(x) => Ok(x),
            Scalar::Int(i) => Ok(i as f64),
            Scalar::Bool(_) => Err(self.err_at(at, format!("expected a float for {cx}, found a bool"))),
        }
    }

    /// A scalar or `None`.
    pub(super) fn opt_scalar(&mut self, cx: Cx<'_>) -> PResult<Option<Scalar>> {
        if self.eat_ident("None")? {
            return Ok(None);
        }
        self.scalar(cx).map(Some)
    }

    /// `[a, b, ...]` with each item read by `item`.
    fn list<T>(&mut self, cx: Cx<'_>, mut item: impl FnMut(&mut Self) -> PResult<T>) -> PResult<Vec<T>> {
        self.expect_punct('[', format_args!("to start the list for {cx}"))?;
        let mut out = Vec::new();
        if self.eat_punct(']')? {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            let sp = self.bump()?;
            match sp.tok {
                Tok::Punct(',') => continue,
                Tok::Punct(']') => return Ok(out),
                _ => return Err(self.unexpected(&sp, format_args!("`,` or `]` in the list for {cx}"))),
            }
        }
    }

    /// `[0, 2, 1]`.
    pub(super) fn usize_list(&mut self, cx: Cx<'_>) -> PResult<Vec<usize>> {
        self.list(cx, |p| p.usize_value(cx))
    }

    /// `[4, s0, 2*s1 + 1]`.
    pub(super) fn dim_list(&mut self, cx: Cx<'_>) -> PResult<Dims> {
        self.list(cx, |p| p.dim(cx)).map(Dims::from)
    }

    /// A dim: an integer or a polynomial `3*s0 + s0*s1 - 2` (as [`Dim`]'s Display prints).
    pub(super) fn dim(&mut self, cx: Cx<'_>) -> PResult<Dim> {
        let mut terms: BTreeMap<Vec<SymId>, i64> = BTreeMap::new();
        let mut neg = self.eat_punct('-')?;
        loop {
            let at = self.peek()?.start;
            let (mono, mag) = self.dim_term(cx)?;
            let coef = if neg { -i128::from(mag) } else { i128::from(mag) };
            let entry = terms.entry(mono).or_insert(0);
            *entry = i64::try_from(i128::from(*entry) + coef)
                .map_err(|_| self.err_at(at, format!("coefficient out of range (i64) in the dim for {cx}")))?;
            if self.eat_punct('+')? {
                neg = false;
            } else if self.eat_punct('-')? {
                neg = true;
            } else {
                break;
            }
        }
        // Monomials are distinct map keys, so no coefficient below can overflow: products
        // of symbols have coefficient 1, and sums never meet the same monomial twice.
        // Balanced folds keep pathological inputs (thousands of terms) near-linear.
        let terms = terms.into_iter().filter(|(_, c)| *c != 0).map(|(mono, c)| {
            if mono.is_empty() {
                Dim::Const(c)
            } else {
                balanced(mono.into_iter().map(Dim::sym).collect(), Dim::mul).scale(c)
            }
        });
        Ok(balanced(terms.collect(), Dim::add))
    }

    /// One term of a dim: `7`, `s0`, `3*s0*s1`. Returns the sorted monomial and the magnitude.
    fn dim_term(&mut self, cx: Cx<'_>) -> PResult<(Vec<SymId>, u64)> {
        let sp = self.bump()?;
        let (mut mono, mag) = match sp.tok {
            Tok::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => {
                let mag = n
                    .parse::<u64>()
                    .map_err(|_| self.err_at(sp.start, format!("integer `{n}` is out of range in the dim for {cx}")))?;
                if !self.eat_punct('*')? {
                    return Ok((Vec::new(), mag));
                }
                (vec![self.symbol(cx)?], mag)
            }
            Tok::Ident(name) => match sym_id(name) {
                Some(s) => (vec![s], 1),
                None => {
                    return Err(self.unexpected(&sp, format_args!("a dim (an integer or a symbol like `s0`) for {cx}")))
                }
            },
            _ => return Err(self.unexpected(&sp, format_args!("a dim (an integer or a symbol like `s0`) for {cx}"))),
        };
        while self.eat_punct('*')? {
            mono.push(self.symbol(cx)?);
        }
        mono.sort();
        Ok((mono, mag))
    }

    /// A symbol `sN`.
    fn symbol(&mut self, cx: Cx<'_>) -> PResult<SymId> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Ident(name) => sym_id(name),
            _ => None,
        }
        .ok_or_else(|| self.unexpected(&sp, format_args!("a symbol like `s0` after `*` in the dim for {cx}")))
    }

    /// `dtype[shape]` with optional ` strides=[..]` and ` offset=..`.
    pub(super) fn meta(&mut self) -> PResult<TensorMeta> {
        let dtype = self.dtype_value(syn("the tensor type"))?;
        let shape_at = self.peek()?.start;
        let shape = self.dim_list(syn("the shape"))?;
        // `contiguous_strides` (used here and by the meta's Display) multiplies the sizes:
        // reject shapes whose product overflows instead of panicking later.
        let mut acc = Dim::Const(1);
        for d in shape.iter().rev() {
            let factor = match d {
                Dim::Const(c) => Dim::Const((*c).max(1)),
                d => d.clone(),
            };
            acc = acc.checked_mul(&factor).ok_or_else(|| {
                self.err_at(shape_at, format!("the shape {} has more elements than fit in i64", DimList(&shape)))
            })?;
        }
        let strides = if self.eat_ident("strides")? {
            self.expect_punct('=', "after `strides`")?;
            self.dim_list(syn("the strides"))?
        } else {
            checked_contiguous_strides(&shape).ok_or_else(|| {
                self.err_at(shape_at, format!("the shape {} has strides that do not fit in i64", DimList(&shape)))
            })?
        };
        let offset = if self.eat_ident("offset")? {
            self.expect_punct('=', "after `offset`")?;
            self.dim(syn("the storage offset"))?
        } else {
            Dim::Const(0)
        };
        Ok(TensorMeta { shape, strides, offset, dtype })
    }
}

/// Combines `items` pairwise in a balanced tree (`Const(0)` when empty).
fn balanced(mut items: Dims, f: impl Fn(&Dim, &Dim) -> Dim) -> Dim {
    while items.len() > 1 {
        items = items
            .chunks(2)
            .map(|pair| match pair {
                [a, b] => f(a, b),
                [a] => a.clone(),
                _ => Dim::Const(0),
            })
            .collect();
    }
    items.pop().unwrap_or(Dim::Const(0))
}

/// The decimal digits `n` (with a leading `-` when `neg`) as an i64.
fn signed(n: &str, neg: bool) -> Option<i64> {
    let mag = i128::from(n.parse::<u64>().ok()?);
    i64::try_from(if neg { -mag } else { mag }).ok()
}

/// `sN` as a symbol.
fn sym_id(name: &str) -> Option<SymId> {
    let digits = name.strip_prefix('s')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u32>().ok().map(SymId)
}

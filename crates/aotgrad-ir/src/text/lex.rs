//! The lexer of the graph text format: turns text into tokens with byte offsets.
//!
//! Whitespace (spaces, tabs, newlines) separates tokens and is otherwise ignored. A `#`
//! followed by a digit is a storage id; any other `#` starts a comment that runs to the
//! end of the line (the parser reads it as a source location).

use crate::error::ParseError;

/// One token. Borrowed slices point into the parsed text.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok<'a> {
    /// `[A-Za-z_][A-Za-z0-9_]*`: keywords, op names, dtypes, symbols (`s0`), `None`, `inf`.
    Ident(&'a str),
    /// A number literal without sign: `12`, `1.5`, `1e-5`, `2.5E+3`, `0x7ff8`.
    Number(&'a str),
    /// `%N`.
    Value(u32),
    /// `#N`.
    Storage(u32),
    /// `# ...` up to (not including) the end of the line; the text after the `#`.
    Comment(&'a str),
    /// A quoted string, escapes resolved.
    Str(String),
    /// One of `( ) [ ] { } , : = + - * .`.
    Punct(char),
    /// End of the input.
    Eof,
}

impl Tok<'_> {
    /// How the token reads in an error message.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Number(s) => format!("`{s}`"),
            Tok::Value(n) => format!("`%{n}`"),
            Tok::Storage(n) => format!("`#{n}`"),
            Tok::Comment(_) => "a `#` comment".to_string(),
            Tok::Str(_) => "a string".to_string(),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

/// A token and the byte offset it starts at.
#[derive(Clone, Debug)]
pub(super) struct Spanned<'a> {
    /// The token.
    pub tok: Tok<'a>,
    /// Byte offset of its first character.
    pub start: usize,
}

/// The 1-based line and column (in characters) of a byte offset.
pub(super) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let mut off = offset.min(src.len());
    while !src.is_char_boundary(off) {
        off -= 1;
    }
    let before = &src[..off];
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// A parse error at a byte offset of `src`.
pub(super) fn error_at(src: &str, offset: usize, msg: impl Into<String>) -> ParseError {
    let (line, col) = line_col(src, offset);
    ParseError { line, col, msg: msg.into() }
}

/// Reads the quoted string starting at `src[start]` (which must be `"`). Returns the
/// unescaped text and the offset just past the closing quote.
pub(super) fn lex_string(src: &str, start: usize) -> Result<(String, usize), ParseError> {
    let mut out = String::new();
    let mut chars = src[start..].char_indices().map(|(i, c)| (start + i, c));
    chars.next(); // the opening quote
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, i + 1)),
            '\\' => {
                let (j, e) =
                    chars.next().ok_or_else(|| error_at(src, i, "unterminated string: input ends after `\\`"))?;
                match e {
                    '\\' => out.push('\\'),
                    '"' => out.push('"'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'u' => {
                        let rest = &src[j + 1..];
                        let Some(body) = rest.strip_prefix('{') else {
                            return Err(error_at(src, j + 1, "expected `{` after `\\u` in a string"));
                        };
                        let close = body.find('}').filter(|&k| k > 0 && k <= 6).ok_or_else(|| {
                            error_at(src, j + 2, "expected 1 to 6 hex digits and `}` after `\\u{` in a string")
                        })?;
                        let hex = &body[..close];
                        if !hex.bytes().all(|h| h.is_ascii_hexdigit()) {
                            return Err(error_at(src, j + 2, format!("invalid hex digits `{hex}` in `\\u{{..}}`")));
                        }
                        let code = u32::from_str_radix(hex, 16)
                            .map_err(|_| error_at(src, j + 2, format!("invalid hex digits `{hex}` in `\\u{{..}}`")))?;
                        let ch = char::from_u32(code).ok_or_else(|| {
                            error_at(src, j + 2, format!("`\\u{{{code:x}}}` is not a Unicode scalar value"))
                        })?;
                        out.push(ch);
                        // Skip `{`, the digits and `}`.
                        for _ in 0..close + 2 {
                            chars.next();
                        }
                    }
                    other => {
                        return Err(error_at(
                            src,
                            i,
                            format!(
                            "unknown escape `\\{other}` in a string (expected \\\\, \\\", \\n, \\r, \\t or \\u{{..}})"
                        ),
                        ))
                    }
                }
            }
            c => out.push(c),
        }
    }
    Err(error_at(src, start, "unterminated string: no closing `\"`"))
}

/// Writes `s` as a quoted string that [`lex_string`] reads back exactly.
pub(super) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A lazy tokenizer over the whole text.
pub(super) struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `src`.
    pub(super) fn new(src: &'a str) -> Lexer<'a> {
        Lexer { src, pos: 0 }
    }

    /// The text being lexed.
    pub(super) fn src(&self) -> &'a str {
        self.src
    }

    fn digits_end(&self, from: usize) -> usize {
        let b = self.src.as_bytes();
        let mut i = from;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    }

    /// A `u32` written in decimal at `from` (after a `%` or `#` at `sigil`).
    fn id_number(&mut self, sigil: usize, what: &str) -> Result<u32, ParseError> {
        let end = self.digits_end(sigil + 1);
        let text = &self.src[sigil + 1..end];
        if text.is_empty() {
            return Err(error_at(
                self.src,
                sigil,
                format!("expected a {what} number after `{}`", &self.src[sigil..=sigil]),
            ));
        }
        let v = text
            .parse::<u32>()
            .map_err(|_| error_at(self.src, sigil, format!("{what} number `{text}` does not fit in u32")))?;
        self.pos = end;
        Ok(v)
    }

    /// The next token.
    pub(super) fn next_token(&mut self) -> Result<Spanned<'a>, ParseError> {
        let src = self.src;
        let b = src.as_bytes();
        while self.pos < b.len() && matches!(b[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let start = self.pos;
        let Some(&c) = b.get(start) else {
            return Ok(Spanned { tok: Tok::Eof, start });
        };
        let tok = match c {
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let mut i = start + 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                self.pos = i;
                Tok::Ident(&src[start..i])
            }
            b'0' if matches!(b.get(start + 1), Some(b'x')) => {
                let mut i = start + 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
                if i == start + 2 || b.get(i).is_some_and(|&n| n.is_ascii_alphanumeric() || n == b'_' || n == b'.') {
                    return Err(error_at(src, start, "invalid hexadecimal number: expected `0x` and hex digits"));
                }
                self.pos = i;
                Tok::Number(&src[start..i])
            }
            b'0'..=b'9' => {
                let mut i = self.digits_end(start);
                if b.get(i) == Some(&b'.') {
                    i = self.digits_end(i + 1);
                }
                if matches!(b.get(i), Some(b'e' | b'E')) {
                    let mut j = i + 1;
                    if matches!(b.get(j), Some(b'+' | b'-')) {
                        j += 1;
                    }
                    let k = self.digits_end(j);
                    if k > j {
                        i = k;
                    }
                }
                if b.get(i).is_some_and(|&n| n.is_ascii_alphanumeric() || n == b'_' || n == b'.') {
                    let end = src[i..].find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'));
                    let end = end.map_or(src.len(), |e| i + e);
                    return Err(error_at(src, start, format!("invalid number `{}`", &src[start..end])));
                }
                self.pos = i;
                Tok::Number(&src[start..i])
            }
            b'%' => Tok::Value(self.id_number(start, "value")?),
            b'#' => {
                if b.get(start + 1).is_some_and(u8::is_ascii_digit) {
                    Tok::Storage(self.id_number(start, "storage")?)
                } else {
                    let end = src[start..].find('\n').map_or(src.len(), |e| start + e);
                    self.pos = end;
                    Tok::Comment(&src[start + 1..end])
                }
            }
            b'"' => {
                let (s, end) = lex_string(src, start)?;
                self.pos = end;
                Tok::Str(s)
            }
            b'(' | b')' | b'[' | b']' | b'{' | b'}' | b',' | b':' | b'=' | b'+' | b'-' | b'*' | b'.' => {
                self.pos = start + 1;
                Tok::Punct(c as char)
            }
            _ => {
                let ch = src[start..].chars().next().unwrap_or('?');
                return Err(error_at(src, start, format!("unexpected character `{}`", ch.escape_debug())));
            }
        };
        Ok(Spanned { tok, start })
    }
}

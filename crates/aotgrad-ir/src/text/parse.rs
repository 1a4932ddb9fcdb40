//! The parser of the graph text format: a recursive-descent parser over [`Lexer`]
//! tokens with one token of lookahead. After the syntax it checks the program with
//! [`Graph::verify`] (values defined before use, recorded metadata equal to what
//! inference gives), reporting the offending node's line: text is user input, and an
//! invalid program is the writer's error, not a failure later in a backend. Every
//! [`Graph`] the printer writes parses back to an equal graph.

use super::lex::{error_at, lex_string, Lexer, Spanned, Tok};
use super::ops::parse_call;
use crate::error::ParseError;
use crate::graph::{Graph, Input, Node, SourceLoc, StorageId, ValueId};
use std::fmt;

/// Result of this module's functions.
pub(super) type PResult<T> = Result<T, ParseError>;

/// What a value is being parsed for, for error messages: a parameter of an op, or a
/// part of the graph syntax (`op` empty).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cx<'s> {
    /// The op name (empty outside op calls).
    pub op: &'s str,
    /// The parameter or syntax element.
    pub param: &'s str,
}

impl fmt::Display for Cx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op.is_empty() {
            f.write_str(self.param)
        } else {
            write!(f, "`{}` parameter `{}`", self.op, self.param)
        }
    }
}

/// A syntax context outside op calls.
pub(super) fn syn(param: &str) -> Cx<'_> {
    Cx { op: "", param }
}

/// Where the parameter list of an op call stands.
#[derive(Debug)]
pub(super) struct Params<'s> {
    /// The op name as written.
    pub op: &'s str,
    /// The closing `)` has been read (at this offset).
    pub closed: Option<usize>,
    /// No parameter has been read yet.
    pub first: bool,
    /// The last thing read was a `,` after a tensor argument.
    pub after_comma: bool,
}

/// The parser state: a lexer and one token of lookahead.
pub(super) struct Parser<'a> {
    lex: Lexer<'a>,
    peeked: Option<Spanned<'a>>,
    /// The last source file named: consecutive nodes of one file share its string.
    last_file: std::cell::RefCell<Option<std::sync::Arc<str>>>,
}

impl<'a> Parser<'a> {
    /// A parser at the start of `src`.
    pub(super) fn new(src: &'a str) -> Parser<'a> {
        Parser { lex: Lexer::new(src), peeked: None, last_file: std::cell::RefCell::new(None) }
    }

    /// The whole text.
    pub(super) fn src(&self) -> &'a str {
        self.lex.src()
    }

    /// The next token, not consumed.
    pub(super) fn peek(&mut self) -> PResult<&Spanned<'a>> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex.next_token()?);
        }
        match &self.peeked {
            Some(sp) => Ok(sp),
            None => Err(self.err_at(self.src().len(), "internal error: lookahead token lost")),
        }
    }

    /// The next token, consumed.
    pub(super) fn bump(&mut self) -> PResult<Spanned<'a>> {
        match self.peeked.take() {
            Some(sp) => Ok(sp),
            None => self.lex.next_token(),
        }
    }

    /// An error at byte offset `at`.
    pub(super) fn err_at(&self, at: usize, msg: impl Into<String>) -> ParseError {
        error_at(self.src(), at, msg)
    }

    /// "expected {what}, found {token}" at the token.
    pub(super) fn unexpected(&self, sp: &Spanned<'_>, what: impl fmt::Display) -> ParseError {
        self.err_at(sp.start, format!("expected {what}, found {}", sp.tok.describe()))
    }

    /// Consume the punctuation `c` if it comes next.
    pub(super) fn eat_punct(&mut self, c: char) -> PResult<bool> {
        if self.peek()?.tok == Tok::Punct(c) {
            self.bump()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Consume the punctuation `c` or fail with "expected `c` {ctx}".
    pub(super) fn expect_punct(&mut self, c: char, ctx: impl fmt::Display) -> PResult<usize> {
        let sp = self.bump()?;
        if sp.tok == Tok::Punct(c) {
            Ok(sp.start)
        } else {
            Err(self.unexpected(&sp, format_args!("`{c}` {ctx}")))
        }
    }

    /// Consume the identifier `kw` if it comes next.
    pub(super) fn eat_ident(&mut self, kw: &str) -> PResult<bool> {
        if self.peek()?.tok == Tok::Ident(kw) {
            self.bump()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    // ---- op-call parameter lists -------------------------------------------------

    /// Start the next parameter: fails if the list is closed, reads the `,` before it.
    fn begin_param(&mut self, st: &mut Params<'_>, what: impl fmt::Display) -> PResult<()> {
        if let Some(at) = st.closed {
            return Err(self.err_at(at, format!("{}: expected {what}, found `)`", st.op)));
        }
        if !st.first {
            let sp = self.bump()?;
            if sp.tok != Tok::Punct(',') {
                return Err(
                    self.err_at(sp.start, format!("{}: expected `,` and {what}, found {}", st.op, sp.tok.describe()))
                );
            }
        }
        st.first = false;
        Ok(())
    }

    /// Start a positional parameter.
    pub(super) fn positional(&mut self, st: &mut Params<'_>, what: &str) -> PResult<()> {
        self.begin_param(st, what)
    }

    /// Start the named parameter `name=`.
    pub(super) fn named(&mut self, st: &mut Params<'_>, name: &str) -> PResult<()> {
        self.begin_param(st, format_args!("`{name}=`"))?;
        let sp = self.bump()?;
        if sp.tok != Tok::Ident(name) {
            return Err(self.err_at(sp.start, format!("{}: expected `{name}=`, found {}", st.op, sp.tok.describe())));
        }
        self.expect_punct('=', format_args!("after `{name}`"))?;
        Ok(())
    }

    /// Finish the parameter list with `)`.
    pub(super) fn end_params(&mut self, st: &Params<'_>) -> PResult<()> {
        if st.closed.is_some() {
            return Ok(());
        }
        let sp = self.bump()?;
        if sp.tok == Tok::Punct(')') && !st.first {
            return Ok(());
        }
        let what = match (st.first, st.after_comma) {
            (true, true) => "a tensor argument `%N` after `,`",
            (true, false) => "a tensor argument `%N` or `)`",
            (false, _) => "`)` after the last parameter",
        };
        Err(self.err_at(sp.start, format!("{}: expected {what}, found {}", st.op, sp.tok.describe())))
    }

    /// `%N`.
    fn value_id(&mut self, what: &str) -> PResult<ValueId> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Value(n) => Ok(ValueId(n)),
            _ => Err(self.unexpected(&sp, what)),
        }
    }

    /// `#N`.
    fn storage_id(&mut self) -> PResult<StorageId> {
        let sp = self.bump()?;
        match sp.tok {
            Tok::Storage(n) => Ok(StorageId(n)),
            _ => Err(self.unexpected(&sp, "a storage id `#N` after the tensor type")),
        }
    }

    // ---- graph structure ------------------------------------------------------

    /// The whole graph, up to the end of the input.
    pub(super) fn graph(&mut self, verify: bool) -> PResult<Graph> {
        let sp = self.bump()?;
        if sp.tok != Tok::Ident("graph") {
            return Err(self.unexpected(&sp, "`graph` at the start of a graph"));
        }
        self.expect_punct('(', "after `graph`")?;
        let mut g = Graph::new();
        if !self.eat_punct(')')? {
            loop {
                g.inputs.push(self.input()?);
                let sp = self.bump()?;
                match sp.tok {
                    Tok::Punct(',') => continue,
                    Tok::Punct(')') => break,
                    _ => return Err(self.unexpected(&sp, "`,` or `)` after a graph input")),
                }
            }
        }
        self.expect_punct('{', "after the graph inputs")?;
        let mut node_starts = Vec::new();
        loop {
            let sp = self.peek()?;
            match sp.tok {
                Tok::Value(_) => {
                    node_starts.push(sp.start);
                    let node = self.node()?;
                    g.nodes.push(node);
                }
                Tok::Ident("return") => break,
                _ => {
                    let sp = sp.clone();
                    return Err(self.unexpected(&sp, "a node `%N: ...` or `return`"));
                }
            }
        }
        let return_at = self.bump()?.start; // `return`
        self.expect_punct('(', "after `return`")?;
        if !self.eat_punct(')')? {
            loop {
                g.outputs.push(self.value_id("a returned value `%N`")?);
                let sp = self.bump()?;
                match sp.tok {
                    Tok::Punct(',') => continue,
                    Tok::Punct(')') => break,
                    _ => return Err(self.unexpected(&sp, "`,` or `)` after a returned value")),
                }
            }
        }
        self.expect_punct('}', "after the return line")?;
        let sp = self.bump()?;
        if sp.tok != Tok::Eof {
            return Err(self.unexpected(&sp, "end of input after the closing `}`"));
        }
        if let Err(e) = if verify { g.verify() } else { Ok(()) } {
            let at = match e.node {
                Some(k) => node_starts[k],
                None if e.msg.starts_with("the graph returns") => return_at,
                None => 0,
            };
            return Err(self.err_at(at, format!("invalid program: {}", e.msg)));
        }
        Ok(g)
    }

    /// `%N: meta #S "name"`.
    fn input(&mut self) -> PResult<Input> {
        let id = self.value_id("a graph input `%N: ...`")?;
        self.expect_punct(':', "after the input's value id")?;
        let meta = self.meta()?;
        let storage = self.storage_id()?;
        let sp = self.bump()?;
        let Tok::Str(name) = sp.tok else {
            return Err(self.unexpected(&sp, "the input's name as a quoted string"));
        };
        Ok(Input { id, name, meta, storage })
    }

    /// `%N: meta #S = op(args, params)  # file:line:col`.
    fn node(&mut self) -> PResult<Node> {
        let out = self.value_id("a node `%N: ...`")?;
        self.expect_punct(':', "after the node's value id")?;
        let meta = self.meta()?;
        let storage = self.storage_id()?;
        self.expect_punct('=', "after the node's storage id")?;
        let (op, args) = parse_call(self)?;
        let loc = match self.peek()?.tok {
            Tok::Comment(body) => {
                let start = self.peek()?.start + 1;
                self.bump()?;
                Some(self.source_loc(body, start)?)
            }
            _ => None,
        };
        Ok(Node { out, op, args, meta, storage, loc })
    }

    /// The text of a `#` comment (starting at byte `start`) as `file:line:col`, the file
    /// raw (line and column are read from the right) or quoted.
    fn source_loc(&self, body: &str, start: usize) -> PResult<SourceLoc> {
        let (text, start) = match body.strip_prefix(' ') {
            Some(t) => (t, start + 1),
            None => (body, start),
        };
        let end_of_line = start + text.len();
        let bad = |at: usize, found: &str| {
            self.err_at(at, format!("expected a source location `file:line:col` after `#`, found `{found}`"))
        };
        // (file, line text, its offset, column text, its offset)
        let (file, line, line_at, col, col_at) = if text.starts_with('"') {
            // The string must close on this line: lex only up to its end.
            let (file, after) = lex_string(&self.src()[..end_of_line], start)?;
            let tail = self.src()[after..end_of_line].trim_end();
            let rest = tail.strip_prefix(':').ok_or_else(|| bad(after, tail))?;
            let (line, col) = rest.split_once(':').ok_or_else(|| bad(after, tail))?;
            (file, line, after + 1, col, after + 2 + line.len())
        } else {
            let t = text.trim_end();
            let (head, col) = t.rsplit_once(':').ok_or_else(|| bad(start, t))?;
            let (file, line) = head.rsplit_once(':').ok_or_else(|| bad(start, t))?;
            (file.to_string(), line, start + file.len() + 1, col, start + head.len() + 1)
        };
        let number = |s: &str, at: usize, what: &str| -> PResult<u32> {
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                s.parse::<u32>().map_err(|_| {
                    self.err_at(at, format!("{what} number `{s}` in the source location is out of range (u32)"))
                })
            } else {
                Err(self.err_at(at, format!("expected a {what} number in the source location, found `{s}`")))
            }
        };
        let line = number(line, line_at, "line")?;
        let col = number(col, col_at, "column")?;
        let mut last = self.last_file.borrow_mut();
        let file = match &*last {
            Some(f) if **f == *file => f.clone(),
            _ => {
                let f: std::sync::Arc<str> = file.into();
                *last = Some(f.clone());
                f
            }
        };
        Ok(SourceLoc { file, line, col })
    }
}

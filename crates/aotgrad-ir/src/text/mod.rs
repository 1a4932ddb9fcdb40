//! The graph text format: a printer and a parser that round-trip exactly.
//!
//! A printed graph reads like a printed PyTorch FX graph:
//!
//! ```text
//! graph(%0: f32[4, 3] #0 "x", %1: f32[s0, 3] strides=[1, s0] offset=2 #1 "w") {
//!   %2: f32[4, 3] #0 = mul_(%0, 2.0)  # tests/golden.rs:10:5
//!   %3: f32[3, 4] strides=[1, 3] #0 = t(%2)
//!   %4: f32[12] #2 = view(%3, [12])
//!   %5: f32[2, 3] #3 = slice(%1, dim=0, start=0, end=4, step=2)
//!   return (%2, %3)
//! }
//! ```
//!
//! Each value is `%N: <meta> #<storage>`; the meta is [`TensorMeta`](crate::TensorMeta)'s
//! Display (strides only when not contiguous, offset only when non-zero), dims are
//! [`Dim`](crate::Dim)'s Display (`3*s0 + s0*s1 - 2`). Inputs carry a quoted name, nodes
//! an op call and an optional `# file:line:col` source location.
//!
//! Grammar (whitespace, newlines included, separates tokens anywhere; a `#` comment runs
//! to the end of its line):
//!
//! ```text
//! graph    ::= "graph" "(" [input ("," input)*] ")" "{" node* "return" "(" [value ("," value)*] ")" "}"
//! input    ::= value ":" meta storage string
//! node     ::= value ":" meta storage "=" call [loc]
//! value    ::= "%" u32                  storage ::= "#" u32   (no space after % or #)
//! meta     ::= dtype dimlist ["strides" "=" dimlist] ["offset" "=" dim]
//! dtype    ::= "bool" | "i32" | "i64" | "f16" | "bf16" | "f32" | "f64"
//! dimlist  ::= "[" [dim ("," dim)*] "]"
//! dim      ::= ["-"] term (("+" | "-") term)*
//! term     ::= uint ["*" sym ("*" sym)*] | sym ("*" sym)*         sym ::= "s" u32
//! call     ::= opname "(" [arg ("," arg)*] ")"
//! opname   ::= ("inplace." | "meta_inplace.")* name ["_"]
//! arg      ::= value | param                  (tensor values first, then params)
//! param    ::= positional | ident "=" pvalue  (per op, fixed order, all present)
//! pvalue   ::= scalar | dim | dimlist | "[" [uint ("," uint)*] "]" | dtype | "None" | "true" | "false"
//! scalar   ::= "true" | "false" | ["-"] int | ["-"] float | ["-"] "inf" | "NaN" ["(" hex64 ")"]
//! float    ::= digits "." digits* [exp] | digits exp                   exp ::= ("e"|"E") ["+"|"-"] digits
//! string   ::= '"' (char | "\\" | "\"" | "\n" | "\r" | "\t" | "\u{" hex{1,6} "}")* '"'
//! loc      ::= "#" [" "] (rawfile | string) ":" u32 ":" u32 EOL      (rawfile: the rest, split from the right)
//! ```
//!
//! Op spellings (`name` is [`Op::name`](crate::Op::name)): `neg(%0)`, `add(%0, %1)`
//! (Binary), `add(%0, 2.0)` (BinaryScalar), `eq(%0, %1)` / `eq(%0, 2)`, `where(%0, %1, %2)`,
//! `clamp(%0, min=0.0, max=None)`, `to(%0, dtype=f16)`, `sum(%0, dims=[0], keepdim=false)`,
//! `argmax(%0, dim=1, keepdim=true)`, `mm`, `bmm`, `view(%0, [12])`, `_unsafe_view(%0, [12])`,
//! `expand(%0, [4, s0])`,
//! `permute(%0, [1, 0])`, `transpose(%0, 0, 1)`, `t(%0)`, `squeeze(%0, dims=[0])`,
//! `unsqueeze(%0, dim=1)`, `slice(%0, dim=0, start=0, end=s0, step=2)`,
//! `select(%0, dim=0, index=1)`, `as_strided(%0, size=[..], stride=[..], offset=0)`,
//! `alias`, `clone`, `copy(%0, %1)`, `full(shape=[2], value=0.0, dtype=f32)`,
//! `full_like(%0, value=1, dtype=None)`, `arange(start=0, end=5, step=1, dtype=i64)`,
//! `rand(shape=[2], dtype=f32, seed=1, offset=0)` (and `randn`),
//! `bernoulli(%0, p=0.5, seed=1, offset=0)`, `index_select(%0, %1, dim=0)` (and `gather`,
//! `scatter_add`, `cat`), `slice_scatter(%0, %1, dim=, start=, end=, step=)`,
//! `select_scatter(%0, %1, dim=, index=)`, `as_strided_scatter(%0, %1, size=, stride=, offset=)`,
//! composites `linear`, `matmul`, `gelu(%0, tanh=false)`, `silu`, `softmax(%0, dim=1)`,
//! `log_softmax(%0, dim=1)`, `layer_norm(%0, normalized_rank=1, eps=1e-5)`,
//! `dropout(%0, p=0.1, seed=0, offset=0)`, `embedding`, `mse_loss`, `cross_entropy`.
//! In-place ops add `_`: `Op::InPlace` of a pointwise op (`mul_`, `relu_`, `copy_`,
//! `full_like_(%0, value=0.0, dtype=None)` for `fill_`/`zero_`) and `Op::MetaInPlace` of a
//! view op (`t_`, `transpose_`, `unsqueeze_`, `squeeze_`, `as_strided_`). Any other
//! wrapping is written out: `inplace.mm(%0, %1)`, `meta_inplace.relu(%0)`.
//!
//! Floats print with Rust's shortest round-trip form (`{:?}`), which always has a `.` or
//! an exponent, so `2` is an integer and `2.0` a float; a NaN other than the canonical one
//! prints its bits, so every f64 round-trips bit-exactly.
//!
//! The parser checks syntax only: it accepts any graph the printer can print (values used
//! before they are defined, wrong arities), so `parse_graph(&print_graph(g)) == Ok(g)` for
//! every graph. Errors carry the line, the column and what was expected and found; the
//! parser never panics.

mod lex;
mod ops;
mod parse;
mod print;
#[cfg(test)]
mod tests;
mod values;

use crate::error::ParseError;
use crate::graph::Graph;
use std::fmt;
use std::str::FromStr;

/// Print a graph, one node per line (see the module docs for the format).
pub fn print_graph(g: &Graph) -> String {
    print::print_graph(g)
}

/// Parse the output of [`print_graph`] back into an equal graph, and check that it is
/// a valid program ([`Graph::verify`]); an invalid one is an error at the offending
/// node's line and column.
pub fn parse_graph(text: &str) -> Result<Graph, ParseError> {
    parse::Parser::new(text).graph(true)
}

/// [`parse_graph`] checking the syntax only: for tools that handle graphs which need
/// not be valid programs (the printer's own round-trip tests).
pub fn parse_graph_unchecked(text: &str) -> Result<Graph, ParseError> {
    parse::Parser::new(text).graph(false)
}

impl fmt::Display for Graph {
    /// The text format of [`print_graph`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_graph(self))
    }
}

impl FromStr for Graph {
    type Err = ParseError;
    /// Parses the text format (see [`parse_graph`]).
    fn from_str(s: &str) -> Result<Graph, ParseError> {
        parse_graph(s)
    }
}

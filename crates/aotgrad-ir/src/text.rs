//! The graph text format: a printer and a parser that round-trip exactly.
//!
//! IMPLEMENTATION IN PROGRESS (helper B) — signatures are fixed.

use crate::error::ParseError;
use crate::graph::Graph;

/// Print a graph, one node per line.
pub fn print_graph(g: &Graph) -> String {
    format!("{g:?}")
}

/// Parse the output of [`print_graph`] back into an equal graph.
pub fn parse_graph(text: &str) -> Result<Graph, ParseError> {
    let _ = text;
    Err(ParseError { line: 1, col: 1, msg: "parser not written yet".into() })
}

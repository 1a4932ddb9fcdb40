//! Composite ops: eager values against independent f64 formulas computed here from
//! the raw inputs, matmul's shape rules against a naive loop, traced graphs (core ops
//! only by default, one `Composite` node when kept, user overrides), source locations
//! and errors naming the composite.

mod graphs;
mod matmul;
mod util;
mod values;

//! Eager autograd, whole: the record and the backward pass.
//!
//! **Record**: while grad mode is on, every eager op on
//! tensors that require grad attaches a [`GradNode`] to its result (PyTorch's
//! `grad_fn`), and leaf tensors that require grad collect gradients in
//! [`Tensor::grad`](crate::Tensor::grad). A node is a small functional
//! [`Graph`](aotgrad_ir::Graph) — the op applied to its inputs, or for an in-place op
//! on a view the whole write-back into its base — plus one [`Edge`] per graph input
//! saying where that input's gradient goes, and the input values saved for the
//! backward.
//!
//! **Backward** ([`Backward::backward`], [`backward_from_edges`]): PyTorch's
//! `loss.backward()`. The pass walks the nodes from the root in reverse topological
//! order and, for each, differentiates the node's graph with `aotgrad-autodiff`
//! ([`derivative`]) — the derivative rules compiled functions use, so eager and
//! compiled gradients come from one rule set — keeps only what computes the
//! gradients, and runs it on the reference kernels with the node's saved inputs and
//! its output gradient. Gradients reaching a node from several uses are summed; leaves
//! accumulate theirs across backward passes.
//!
//! As in PyTorch:
//! - an in-place op on a tensor moves its history on (`y.mul_(2)` makes `y`'s node the
//!   multiplication, whose input is `y`'s previous history);
//! - an in-place op on a view rewrites its base's history (the view is scattered back
//!   into the base's value, PyTorch's `CopySlices`), and every view of that base then
//!   derives its history from the base's new one;
//! - a saved input modified in place afterwards makes the backward fail with PyTorch's
//!   error, checked through the storage's version counter (only for inputs the
//!   gradient reads);
//! - a root that does not require grad, an implicit gradient for a root with more than
//!   one element, and a second backward through a history whose saved values the
//!   first one freed (`retain_graph` keeps them) are errors.
//!
//! ```
//! use aotgrad_trace::autograd::Backward;
//! use aotgrad_trace::{DType, Tensor};
//!
//! let w = Tensor::from_f64(&[1.0, 2.0, 3.0], &[3], DType::F32)?.requires_grad(true)?;
//! let loss = w.mul(&w)?.sum_all()?; // sum(w²)
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().to_vec_f64()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), aotgrad_trace::Error>(())
//! ```

mod backward;
pub(crate) mod derivative;
mod record;

pub use crate::tensor::history::{Edge, GradNode, Saved};
pub use backward::{backward_from_edges, Backward};
pub use derivative::{derivative, Prepared};
pub(crate) use record::EagerRecord;
pub use record::{node_name, saves_result, single_op_graph};

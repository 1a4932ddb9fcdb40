//! A tensor's autograd history, as data: the recorded nodes ([`GradNode`], PyTorch's
//! `grad_fn`), the [`Edge`]s to where each input's gradient goes, and saved values
//! with their versions. The types sit on the tensor's floor because a tensor's state
//! holds its node; recording them (above the dispatch) and the backward pass are
//! `crate::autograd`'s.

use super::Tensor;
use crate::autograd::derivative::Prepared;
use crate::error::{Error, Result};
use aotgrad_cpu::CpuTensor;
use aotgrad_ir::{Graph, SourceLoc};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Where the gradient of a node input (or of a tensor) goes.
#[derive(Clone)]
pub enum Edge {
    /// Nowhere: the value does not require grad.
    None,
    /// Into this leaf's `grad`.
    Leaf(Tensor),
    /// Into the output of this node.
    Node(Arc<GradNode>),
    /// Into a tensor that requires grad but whose history eager autograd did not
    /// record: the output of a compiled function, whose gradients come from the
    /// backward its `forward` returned. A gradient reaching it is an error.
    Unrecorded,
}

/// A value saved for the backward, with its storage version at the time.
#[derive(Clone)]
pub struct Saved {
    /// The value (sharing the storage of the tensor it was, unless copied).
    pub value: CpuTensor,
    /// The storage's version when it was saved.
    pub version: u64,
}

/// One recorded operation (PyTorch's `grad_fn`). See the [`autograd`](crate::autograd) module.
pub struct GradNode {
    pub(crate) name: String,
    pub(crate) graph: Graph,
    pub(crate) edges: Vec<Edge>,
    pub(crate) saved: Mutex<Option<Vec<Saved>>>,
    /// The result's storage and version, for ops whose PyTorch derivative reads their
    /// result (`tanh`, `exp`, `softmax`, ...): this node computes from its inputs, but
    /// an in-place change of the result must still fail the backward as in PyTorch.
    pub(crate) result: Option<Saved>,
    pub(crate) loc: SourceLoc,
    /// Tensors whose gradient is this node's output gradient and that retain it.
    pub(crate) retained: Mutex<Vec<Weak<super::Inner>>>,
    /// What the backward pass derives once (its differentiated graph), kept with the
    /// node; the recording side never reads it.
    pub(crate) prepared: OnceLock<Prepared>,
}

impl GradNode {
    /// PyTorch's name for the node (`MulBackward0`, `CopySlices`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The functional graph the node stands for: its inputs, then one output.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// Where each graph input's gradient goes.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }
    /// The user's source line of the op.
    pub fn loc(&self) -> &SourceLoc {
        &self.loc
    }
    /// For an op whose PyTorch derivative reads its result: that result as saved
    /// (compare its storage's version now with the one saved).
    pub fn saved_result(&self) -> Option<&Saved> {
        self.result.as_ref()
    }
    /// The saved input values; an error once they were freed by a backward pass that
    /// did not retain the graph.
    pub fn saved(&self) -> Result<Vec<Saved>> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| {
            Error::autograd(
                "backward",
                &self.loc,
                format!(
                    "Trying to backward through the graph a second time (or directly access saved tensors after they \
                     have already been freed): the values saved by {} were freed by the first backward; pass \
                     retain_graph = true the first time",
                    self.name
                ),
            )
        })
    }
    /// Free the saved values (a backward pass without `retain_graph`).
    pub fn free_saved(&self) {
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    /// The live tensors that retain this node's output gradient.
    pub fn retained(&self) -> Vec<Tensor> {
        let v = self.retained.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().filter_map(Weak::upgrade).map(Tensor::from_inner).collect()
    }
    pub(crate) fn retain(&self, t: &Tensor) {
        let mut v = self.retained.lock().unwrap_or_else(|e| e.into_inner());
        if !v.iter().any(|w| w.upgrade().is_some_and(|i| Arc::ptr_eq(&i, t.inner()))) {
            v.push(Arc::downgrade(t.inner()));
        }
    }
}

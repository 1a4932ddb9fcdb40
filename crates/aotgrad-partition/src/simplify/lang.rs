//! The e-graph language over aotgrad ops, and the metadata analysis.
//!
//! An e-node is a graph input (by position) or an [`Op`] with its child e-classes.
//! `Op` is neither `Hash` nor `Ord` (it carries `f64` scalars), so each op is keyed by
//! its canonical `Debug` spelling ([`OpKey`]): two ops are the same e-node operator
//! exactly when they print the same, which distinguishes every parameter (`-0.0` from
//! `0.0`, seeds and offsets of random ops, dims) and identifies NaN scalars regardless
//! of payload bits.
//!
//! The analysis data of an e-class is the [`TensorMeta`] every member computes. Members
//! of one class must agree on it; the rule applier checks a rewrite's result metadata
//! before it adds anything, so a disagreement found while merging is a bug, recorded in
//! [`MetaAnalysis::errors`] and reported by the simplifier.

use aotgrad_ir::infer::infer;
use aotgrad_ir::{Op, StaticOracle, TensorMeta};
use egg::{Analysis, DidMerge, EGraph, Id, Language};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// An op keyed by its canonical spelling, so it can live in a hash-consed e-graph.
#[derive(Clone)]
pub(crate) struct OpKey {
    key: Arc<str>,
    op: Arc<Op>,
}

impl OpKey {
    pub(crate) fn new(op: Op) -> OpKey {
        OpKey { key: Arc::from(format!("{op:?}")), op: Arc::new(op) }
    }
    pub(crate) fn op(&self) -> &Op {
        &self.op
    }
}

impl fmt::Debug for OpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}
impl PartialEq for OpKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for OpKey {}
impl Hash for OpKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state)
    }
}
impl PartialOrd for OpKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OpKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

/// An e-node: a graph input (by position among the inputs), or an op over e-classes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ENode {
    /// The graph input at this position.
    Input(u32),
    /// An op applied to the child e-classes, in the op's argument order.
    Op(OpKey, Vec<Id>),
}

impl ENode {
    /// The op, for op nodes.
    pub(crate) fn op(&self) -> Option<&Op> {
        match self {
            ENode::Op(k, _) => Some(k.op()),
            ENode::Input(_) => None,
        }
    }
    /// The children (empty for inputs).
    pub(crate) fn args(&self) -> &[Id] {
        match self {
            ENode::Op(_, a) => a,
            ENode::Input(_) => &[],
        }
    }
}

/// What decides whether two e-nodes can be the same operator (children aside).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Disc {
    /// An input position.
    Input(u32),
    /// An op spelling and arity.
    Op(Arc<str>, usize),
}

impl Language for ENode {
    type Discriminant = Disc;
    fn discriminant(&self) -> Disc {
        match self {
            ENode::Input(i) => Disc::Input(*i),
            ENode::Op(k, a) => Disc::Op(k.key.clone(), a.len()),
        }
    }
    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (ENode::Input(a), ENode::Input(b)) => a == b,
            (ENode::Op(k1, a1), ENode::Op(k2, a2)) => k1 == k2 && a1.len() == a2.len(),
            _ => false,
        }
    }
    fn children(&self) -> &[Id] {
        match self {
            ENode::Op(_, a) => a,
            ENode::Input(_) => &[],
        }
    }
    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            ENode::Op(_, a) => a,
            ENode::Input(_) => &mut [],
        }
    }
}

/// The e-graph this crate builds.
pub(crate) type EG = EGraph<ENode, MetaAnalysis>;

/// The metadata analysis: every e-class knows the [`TensorMeta`] of its value.
#[derive(Debug, Default)]
pub(crate) struct MetaAnalysis {
    /// Metadata of the graph inputs, by position.
    pub(crate) inputs: Vec<TensorMeta>,
    /// Metadata for the next e-node to be added, when the caller already knows it
    /// (nodes of the input graph, and rewrite results whose metadata was checked).
    pub(crate) pending: Option<TensorMeta>,
    /// Invariant violations seen while building or merging (bugs).
    pub(crate) errors: Vec<String>,
}

impl Analysis<ENode> for MetaAnalysis {
    type Data = Arc<TensorMeta>;

    fn make(egraph: &mut EG, enode: &ENode, _id: Id) -> Self::Data {
        if let Some(m) = egraph.analysis.pending.take() {
            return Arc::new(m);
        }
        let inferred = match enode {
            ENode::Input(i) => egraph.analysis.inputs.get(*i as usize).cloned().ok_or_else(|| format!("no input {i}")),
            ENode::Op(k, args) => {
                let metas: Vec<Arc<TensorMeta>> = args.iter().map(|a| egraph[*a].data.clone()).collect();
                let refs: Vec<&TensorMeta> = metas.iter().map(|m| m.as_ref()).collect();
                infer(k.op(), &refs, &mut StaticOracle).map_err(|e| e.to_string())
            }
        };
        match inferred {
            Ok(m) => Arc::new(m),
            Err(e) => {
                egraph.analysis.errors.push(format!("e-node {enode:?} has no metadata: {e}"));
                Arc::new(TensorMeta::from_sizes(&[], aotgrad_ir::DType::Bool))
            }
        }
    }

    fn remake(egraph: &mut EG, _enode: &ENode, id: Id) -> Self::Data {
        // Class metadata never changes once set, so a re-derivation is the class's own.
        egraph[id].data.clone()
    }

    fn merge(&mut self, a: &mut Self::Data, b: Self::Data) -> DidMerge {
        if **a != *b {
            self.errors.push(format!("merged e-classes with different metadata: {a} and {b}"));
        }
        DidMerge(false, false)
    }
}

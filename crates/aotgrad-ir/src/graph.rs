//! `Graph`: inputs, nodes in execution order, outputs; every value carries its
//! `TensorMeta`, its storage identity and (for nodes) the user's source location.

use crate::meta::TensorMeta;
use crate::op::{Aliasing, Op};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A value in a graph (an input or a node's result), printed `%N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Identity of a storage (the memory a tensor's elements live in), printed `#N`.
/// Two values with the same storage alias each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StorageId(pub u32);

impl fmt::Display for StorageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where in the user's source an op was called (from `#[track_caller]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceLoc {
    /// Source file, as the compiler reports it.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl SourceLoc {
    /// The location of the caller of the enclosing `#[track_caller]` function chain.
    #[track_caller]
    pub fn caller() -> SourceLoc {
        let l = std::panic::Location::caller();
        SourceLoc { file: l.file().to_string(), line: l.line(), col: l.column() }
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// A graph input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Input {
    /// The value it defines.
    pub id: ValueId,
    /// A readable name (`x`, `arg0`, `l__weight`).
    pub name: String,
    /// Metadata.
    pub meta: TensorMeta,
    /// Its storage; inputs that alias each other share one.
    pub storage: StorageId,
}

/// One op application.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The value it defines.
    pub out: ValueId,
    /// The op.
    pub op: Op,
    /// Arguments, in the op's convention.
    pub args: Vec<ValueId>,
    /// Metadata of the result.
    pub meta: TensorMeta,
    /// Storage of the result (that of `args[0]` for views and mutations).
    pub storage: StorageId,
    /// The user's source line, when known.
    pub loc: Option<SourceLoc>,
}

/// A program: inputs, nodes in execution order, outputs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// Inputs, in calling-convention order.
    pub inputs: Vec<Input>,
    /// Nodes, each using only values defined before it.
    pub nodes: Vec<Node>,
    /// Returned values (may repeat, may be inputs).
    pub outputs: Vec<ValueId>,
}

/// What defines a value.
#[derive(Clone, Copy, Debug)]
pub enum Def<'a> {
    /// An input.
    Input(&'a Input),
    /// A node.
    Node(&'a Node),
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }
    /// A value id one larger than any used so far.
    pub fn next_value(&self) -> ValueId {
        let max = self.inputs.iter().map(|i| i.id.0).chain(self.nodes.iter().map(|n| n.out.0)).max();
        ValueId(max.map_or(0, |m| m + 1))
    }
    /// A storage id one larger than any used so far.
    pub fn next_storage(&self) -> StorageId {
        let max = self.inputs.iter().map(|i| i.storage.0).chain(self.nodes.iter().map(|n| n.storage.0)).max();
        StorageId(max.map_or(0, |m| m + 1))
    }
    /// Append an input with a fresh value id; returns the id.
    pub fn add_input(&mut self, name: impl Into<String>, meta: TensorMeta, storage: StorageId) -> ValueId {
        let id = self.next_value();
        self.inputs.push(Input { id, name: name.into(), meta, storage });
        id
    }
    /// Append a node with a fresh value id. The storage is `args[0]`'s when the op
    /// aliases it, else `fresh`. Returns the id.
    pub fn add_node(
        &mut self,
        op: Op,
        args: Vec<ValueId>,
        meta: TensorMeta,
        fresh: StorageId,
        loc: Option<SourceLoc>,
    ) -> ValueId {
        let out = self.next_value();
        let storage = match op.aliasing() {
            Aliasing::Fresh => fresh,
            _ => args.first().and_then(|a| self.storage_of(*a)).unwrap_or(fresh),
        };
        self.nodes.push(Node { out, op, args, meta, storage, loc });
        out
    }
    /// What defines `v`.
    pub fn def(&self, v: ValueId) -> Option<Def<'_>> {
        if let Some(i) = self.inputs.iter().find(|i| i.id == v) {
            return Some(Def::Input(i));
        }
        self.nodes.iter().find(|n| n.out == v).map(Def::Node)
    }
    /// Metadata of `v`.
    pub fn meta_of(&self, v: ValueId) -> Option<&TensorMeta> {
        self.def(v).map(|d| match d {
            Def::Input(i) => &i.meta,
            Def::Node(n) => &n.meta,
        })
    }
    /// Storage of `v`.
    pub fn storage_of(&self, v: ValueId) -> Option<StorageId> {
        self.def(v).map(|d| match d {
            Def::Input(i) => i.storage,
            Def::Node(n) => n.storage,
        })
    }
}

//! `GraphBuilder`: a graph under construction whose nodes get their metadata from
//! [`infer`](crate::infer::infer()) and their storage from the aliasing rule (views share
//! `args[0]`'s storage, everything else gets a fresh one). Passes that build graphs
//! (functionalization, autodiff) wrap it with their own vocabulary.

use crate::error::ShapeError;
use crate::graph::{Graph, Input, Node, SourceLoc, StorageId, ValueId};
use crate::infer::infer;
use crate::meta::Dims;
use crate::meta::TensorMeta;
use crate::op::{Aliasing, Op};
use crate::sym::DimOracle;
use std::collections::HashMap;
use thiserror::Error;

/// Why building a node failed.
#[derive(Debug, Error)]
pub enum BuildError {
    /// Inference rejected the node.
    #[error(transparent)]
    Shape(Box<ShapeError>),
    /// A value used before it was defined, or ids ran out: a bug in the caller.
    #[error("{0}")]
    Internal(String),
}

impl From<ShapeError> for BuildError {
    fn from(e: ShapeError) -> Self {
        BuildError::Shape(Box::new(e))
    }
}

/// Result of the builder.
pub type BuildResult<T> = std::result::Result<T, BuildError>;

/// A graph under construction (see the module docs). Appends are O(1).
pub struct GraphBuilder<'o> {
    /// The graph built so far (its outputs are the caller's to set).
    pub graph: Graph,
    metas: HashMap<ValueId, (TensorMeta, StorageId)>,
    next_value: u32,
    next_storage: u32,
    oracle: &'o mut dyn DimOracle,
}

fn bump(counter: &mut u32, what: &str) -> BuildResult<u32> {
    let v = *counter;
    *counter = v.checked_add(1).ok_or_else(|| BuildError::Internal(format!("ran out of {what} ids")))?;
    Ok(v)
}

impl<'o> GraphBuilder<'o> {
    /// An empty graph; `oracle` answers the shape questions of inference.
    pub fn new(oracle: &'o mut dyn DimOracle) -> Self {
        GraphBuilder { graph: Graph::new(), metas: HashMap::new(), next_value: 0, next_storage: 0, oracle }
    }

    /// A builder holding a copy of `g`'s inputs and nodes (same value and storage ids,
    /// no outputs); new ids come after the largest ones in `g`. Errors if `g` uses a
    /// value before defining it or defines one twice.
    pub fn from_graph(g: &Graph, oracle: &'o mut dyn DimOracle) -> BuildResult<Self> {
        let mut b = GraphBuilder::new(oracle);
        b.metas.reserve(2 * (g.inputs.len() + g.nodes.len()) + 8);
        let (mut max_v, mut max_s): (Option<u32>, Option<u32>) = (None, None);
        let mut define = |b: &mut Self, v: ValueId, meta: &TensorMeta, s: StorageId| -> BuildResult<()> {
            max_v = Some(max_v.map_or(v.0, |m| m.max(v.0)));
            max_s = Some(max_s.map_or(s.0, |m| m.max(s.0)));
            if b.metas.insert(v, (meta.clone(), s)).is_some() {
                return Err(BuildError::Internal(format!("the graph defines {v} twice")));
            }
            Ok(())
        };
        for i in &g.inputs {
            define(&mut b, i.id, &i.meta, i.storage)?;
        }
        for n in &g.nodes {
            if let Some(a) = n.args.iter().find(|a| !b.metas.contains_key(a)) {
                return Err(BuildError::Internal(format!(
                    "node {} ({}) uses {a} before it is defined",
                    n.out,
                    n.op.name()
                )));
            }
            define(&mut b, n.out, &n.meta, n.storage)?;
        }
        let next = |m: Option<u32>, what: &str| -> BuildResult<u32> {
            m.map_or(Ok(0), |m| m.checked_add(1).ok_or_else(|| BuildError::Internal(format!("ran out of {what} ids"))))
        };
        b.next_value = next(max_v, "value")?;
        b.next_storage = next(max_s, "storage")?;
        b.graph = Graph { inputs: g.inputs.clone(), nodes: g.nodes.clone(), outputs: Vec::new() };
        Ok(b)
    }

    /// The oracle inference uses.
    pub fn oracle(&mut self) -> &mut dyn DimOracle {
        &mut *self.oracle
    }

    /// Metadata of `v`.
    pub fn meta(&self, v: ValueId) -> BuildResult<&TensorMeta> {
        self.metas.get(&v).map(|m| &m.0).ok_or_else(|| BuildError::Internal(format!("{v} has no metadata")))
    }

    /// Storage of `v`.
    pub fn storage(&self, v: ValueId) -> BuildResult<StorageId> {
        self.metas.get(&v).map(|m| m.1).ok_or_else(|| BuildError::Internal(format!("{v} has no storage")))
    }

    /// Append a graph input with fresh value and storage ids.
    pub fn add_input(&mut self, name: String, meta: TensorMeta) -> BuildResult<ValueId> {
        let id = ValueId(bump(&mut self.next_value, "value")?);
        let storage = StorageId(bump(&mut self.next_storage, "storage")?);
        self.metas.insert(id, (meta.clone(), storage));
        self.graph.inputs.push(Input { id, name, meta, storage });
        Ok(id)
    }

    /// Append `op(args)`, inferring its metadata; views and mutations share `args[0]`'s
    /// storage.
    pub fn emit(&mut self, op: Op, args: Vec<ValueId>, loc: Option<SourceLoc>) -> BuildResult<ValueId> {
        let metas = &self.metas;
        let refs: Vec<&TensorMeta> = args
            .iter()
            .map(|a| metas.get(a).map(|m| &m.0).ok_or_else(|| BuildError::Internal(format!("{a} has no metadata"))))
            .collect::<BuildResult<_>>()?;
        let meta = infer(&op, &refs, &mut *self.oracle)?;
        let storage = match op.aliasing() {
            Aliasing::Fresh => StorageId(bump(&mut self.next_storage, "storage")?),
            _ => {
                let a = args.first().ok_or_else(|| BuildError::Internal(format!("{} without arguments", op.name())))?;
                self.storage(*a)?
            }
        };
        let out = ValueId(bump(&mut self.next_value, "value")?);
        self.metas.insert(out, (meta.clone(), storage));
        self.graph.nodes.push(Node { out, op, args, meta, storage, loc });
        Ok(out)
    }

    /// `x` with shape `shape`: `x` itself when it already has it, a `view` when `x`'s
    /// strides allow one, else `clone` then `view`.
    pub fn reshape(&mut self, x: ValueId, shape: Dims, loc: Option<SourceLoc>) -> BuildResult<ValueId> {
        let m = self.meta(x)?.clone();
        if m.shape == shape {
            return Ok(x);
        }
        if infer(&Op::View(shape.clone()), &[&m], &mut *self.oracle).is_ok() {
            return self.emit(Op::View(shape), vec![x], loc);
        }
        let c = self.emit(Op::Clone, vec![x], loc.clone())?;
        self.emit(Op::View(shape), vec![c], loc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::sym::{Dim, StaticOracle};

    #[test]
    fn views_share_storage_and_ids_continue_after_a_copied_graph() {
        let mut oracle = StaticOracle;
        let mut b = GraphBuilder::new(&mut oracle);
        let x = b.add_input("x".into(), TensorMeta::from_sizes(&[2, 3], DType::F32)).unwrap();
        let t = b.emit(Op::T, vec![x], None).unwrap();
        let y = b.emit(Op::Clone, vec![t], None).unwrap();
        assert_eq!(b.storage(t).unwrap(), b.storage(x).unwrap());
        assert_ne!(b.storage(y).unwrap(), b.storage(x).unwrap());
        assert_eq!(b.meta(t).unwrap().shape, crate::dims![Dim::from(3usize), Dim::from(2usize)]);
        // A transposed value cannot be viewed flat: reshape copies first.
        let flat = b.reshape(t, crate::dims![Dim::from(6usize)], None).unwrap();
        assert_eq!(b.graph.nodes.iter().rev().nth(1).map(|n| n.op.clone()), Some(Op::Clone));
        assert_eq!(b.reshape(flat, crate::dims![Dim::from(6usize)], None).unwrap(), flat);
        let g = b.graph.clone();

        let mut oracle = StaticOracle;
        let mut c = GraphBuilder::from_graph(&g, &mut oracle).unwrap();
        let z = c.emit(Op::Unary(crate::op::UnaryOp::Neg), vec![y], None).unwrap();
        let max_before = g.nodes.iter().map(|n| n.out.0).max().unwrap();
        assert_eq!(z.0, max_before + 1);
        assert!(matches!(c.emit(Op::Clone, vec![ValueId(99)], None), Err(BuildError::Internal(_))));

        let mut twice = g.clone();
        twice.nodes.push(twice.nodes[0].clone());
        let mut oracle = StaticOracle;
        assert!(matches!(GraphBuilder::from_graph(&twice, &mut oracle), Err(BuildError::Internal(_))));
    }
}

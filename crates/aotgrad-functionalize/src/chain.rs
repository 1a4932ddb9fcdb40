//! Building the functional graph: emitting nodes with inferred metadata, replaying
//! view chains from a root, and scattering a view's new value back into its root.

use crate::{FunctionalizeError, Result};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{
    contiguous_strides, Aliasing, Dim, DimOracle, Graph, Input, Node, Op, SourceLoc, StorageId, TensorMeta, ValueId,
};
use std::collections::HashMap;

/// The functional graph under construction.
pub(crate) struct Builder<'o> {
    pub graph: Graph,
    metas: HashMap<ValueId, (TensorMeta, StorageId)>,
    next_value: u32,
    next_storage: u32,
    /// View nodes already emitted, per argument: views are pure, so replaying a chain
    /// twice from one value reuses the first replay.
    views: HashMap<ValueId, Vec<(Op, ValueId)>>,
    pub oracle: &'o mut dyn DimOracle,
}

impl<'o> Builder<'o> {
    pub fn new(oracle: &'o mut dyn DimOracle) -> Self {
        Builder {
            graph: Graph::new(),
            metas: HashMap::new(),
            next_value: 0,
            next_storage: 0,
            views: HashMap::new(),
            oracle,
        }
    }

    pub fn meta(&self, v: ValueId) -> Result<&TensorMeta> {
        self.metas.get(&v).map(|m| &m.0).ok_or_else(|| FunctionalizeError::Internal(format!("{v} has no metadata")))
    }

    pub fn add_input(&mut self, name: String, meta: TensorMeta) -> ValueId {
        let id = ValueId(self.next_value);
        self.next_value += 1;
        let storage = StorageId(self.next_storage);
        self.next_storage += 1;
        self.metas.insert(id, (meta.clone(), storage));
        self.graph.inputs.push(Input { id, name, meta, storage });
        id
    }

    /// Append `op(args)`, inferring its metadata.
    pub fn emit(&mut self, op: Op, args: Vec<ValueId>, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let view_of = match (op.aliasing(), args.as_slice()) {
            (Aliasing::View, [x]) => Some(*x),
            _ => None,
        };
        if let Some(seen) = view_of.and_then(|x| self.views.get(&x)) {
            if let Some((_, v)) = seen.iter().find(|(o, _)| *o == op) {
                return Ok(*v);
            }
        }
        let arg_metas: Vec<TensorMeta> = args.iter().map(|a| self.meta(*a).cloned()).collect::<Result<_>>()?;
        let refs: Vec<&TensorMeta> = arg_metas.iter().collect();
        let meta = infer(&op, &refs, self.oracle)?;
        let storage = match op.aliasing() {
            Aliasing::Fresh => {
                self.next_storage += 1;
                StorageId(self.next_storage - 1)
            }
            _ => {
                let x = args
                    .first()
                    .ok_or_else(|| FunctionalizeError::Internal(format!("{} without argument", op.name())))?;
                self.metas
                    .get(x)
                    .map(|m| m.1)
                    .ok_or_else(|| FunctionalizeError::Internal(format!("{x} has no storage")))?
            }
        };
        let out = ValueId(self.next_value);
        self.next_value += 1;
        self.metas.insert(out, (meta.clone(), storage));
        if let Some(x) = view_of {
            self.views.entry(x).or_default().push((op.clone(), out));
        }
        self.graph.nodes.push(Node { out, op, args, meta, storage, loc: loc.clone() });
        Ok(out)
    }

    /// `x.view(shape)`, or `x.clone().view(shape)` when `x`'s strides do not allow a
    /// view (a replay on a fresh, contiguous root can need that where the original
    /// did not: only values matter in the functional graph).
    pub fn view_or_reshape(&mut self, x: ValueId, shape: Vec<Dim>, loc: &Option<SourceLoc>) -> Result<ValueId> {
        if self.meta(x)?.shape == shape {
            return Ok(x);
        }
        let probe = {
            let m = self.meta(x)?.clone();
            infer(&Op::View(shape.clone()), &[&m], self.oracle)
        };
        match probe {
            Ok(_) => self.emit(Op::View(shape), vec![x], loc),
            Err(_) => {
                let c = self.emit(Op::Clone, vec![x], loc)?;
                self.emit(Op::View(shape), vec![c], loc)
            }
        }
    }

    /// Apply one chain op to `x` (a value of the same root). `AsStrided` in a chain
    /// carries an offset relative to the root's first element.
    pub fn apply_view(&mut self, op: &Op, x: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        match op {
            Op::View(shape) => self.view_or_reshape(x, shape.clone(), loc),
            Op::AsStrided { size, stride, offset } => {
                let m = self.meta(x)?;
                let abs_offset = m.offset.add(offset);
                if *size == m.shape && *stride == m.strides && abs_offset == m.offset {
                    return Ok(x);
                }
                let abs = Op::AsStrided { size: size.clone(), stride: stride.clone(), offset: abs_offset };
                self.emit(abs, vec![x], loc)
            }
            _ => self.emit(op.clone(), vec![x], loc),
        }
    }

    /// A new `alias` of `x` that no later emission reuses: the value a view gets when
    /// autograd must not see through it (a detached view, or one taken under no-grad
    /// of a value requiring grad), so the cut applies to it alone.
    pub fn detached_alias(&mut self, x: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let meta = self.meta(x)?.clone();
        let storage = self
            .metas
            .get(&x)
            .map(|m| m.1)
            .ok_or_else(|| FunctionalizeError::Internal(format!("{x} has no storage")))?;
        let out = ValueId(self.next_value);
        self.next_value += 1;
        self.metas.insert(out, (meta.clone(), storage));
        self.graph.nodes.push(Node { out, op: Op::Alias, args: vec![x], meta, storage, loc: loc.clone() });
        Ok(out)
    }

    /// `x` itself when it is dense, row-major and at offset 0, else a contiguous copy.
    pub fn dense(&mut self, x: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let m = self.meta(x)?;
        // Exactly row-major (also for size-1 dims: their strides are observable too).
        if m.strides == contiguous_strides(&m.shape) && m.offset == Dim::Const(0) {
            return Ok(x);
        }
        self.emit(Op::Clone, vec![x], loc)
    }

    /// Given `x` and the new value `y` of `op(x)`, build the new value of `x`. Chains
    /// holding `expand` (no such inverse) or `as_strided` (storage-absolute, may repeat
    /// elements) never get here: the pass writes through them with one
    /// `as_strided_scatter` into the root.
    pub fn scatter_back(&mut self, op: &Op, x: ValueId, y: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let x_shape = self.meta(x)?.shape.clone();
        match op {
            Op::Slice { dim, start, end, step } => self.emit(
                Op::SliceScatter { dim: *dim, start: start.clone(), end: end.clone(), step: *step },
                vec![x, y],
                loc,
            ),
            Op::Select { dim, index } => {
                self.emit(Op::SelectScatter { dim: *dim, index: index.clone() }, vec![x, y], loc)
            }
            Op::Permute(p) => {
                let mut inv = vec![0usize; p.len()];
                for (i, &d) in p.iter().enumerate() {
                    inv[d] = i;
                }
                self.emit(Op::Permute(inv), vec![y], loc)
            }
            Op::Transpose(a, b) => self.emit(Op::Transpose(*a, *b), vec![y], loc),
            Op::T => self.emit(Op::T, vec![y], loc),
            Op::View(_) | Op::Squeeze(_) | Op::Unsqueeze(_) | Op::Alias => self.view_or_reshape(y, x_shape, loc),
            // `expand` and `as_strided` chains are scattered back in one step by the caller.
            other => Err(FunctionalizeError::Internal(format!(
                "`{}` has no step-by-step inverse (not a view op, or one written back with as_strided_scatter)",
                other.name()
            ))),
        }
    }
}

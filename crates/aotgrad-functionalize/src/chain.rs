//! Building the functional graph: emitting nodes with inferred metadata, replaying
//! view chains from a root, and scattering a view's new value back into its root.

use crate::{FunctionalizeError, Result};
use aotgrad_ir::infer::infer;
use aotgrad_ir::Dims;
use aotgrad_ir::{Aliasing, Dim, DimOracle, GraphBuilder, Op, SourceLoc, StaticOracle, TensorMeta, ValueId};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

/// The functional graph under construction: a [`GraphBuilder`] (reached through
/// `Deref`) plus a cache of the view nodes already emitted.
pub(crate) struct Builder<'o> {
    inner: GraphBuilder<'o>,
    /// View nodes already emitted, per argument: views are pure, so replaying a chain
    /// twice from one value reuses the first replay.
    views: HashMap<ValueId, Vec<(Op, ValueId)>>,
}

impl<'o> Deref for Builder<'o> {
    type Target = GraphBuilder<'o>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for Builder<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl<'o> Builder<'o> {
    pub fn new(oracle: &'o mut dyn DimOracle) -> Self {
        Builder { inner: GraphBuilder::new(oracle), views: HashMap::new() }
    }

    pub fn meta(&self, v: ValueId) -> Result<&TensorMeta> {
        Ok(self.inner.meta(v)?)
    }

    /// The graph built.
    pub fn into_graph(self) -> aotgrad_ir::Graph {
        self.inner.graph
    }

    pub fn add_input(&mut self, name: String, meta: TensorMeta) -> Result<ValueId> {
        Ok(self.inner.add_input(name, meta)?)
    }

    /// Append `op(args)`, inferring its metadata; a view already emitted from the same
    /// argument is reused.
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
        let out = self.inner.emit(op.clone(), args, loc.clone())?;
        if let Some(x) = view_of {
            self.views.entry(x).or_default().push((op, out));
        }
        Ok(out)
    }

    /// `x.view(shape)`, or `x.clone().view(shape)` when `x`'s strides do not allow a
    /// view (a replay on a fresh, contiguous root can need that where the original
    /// did not: only values matter in the functional graph).
    pub fn view_or_reshape(&mut self, x: ValueId, shape: Dims, loc: &Option<SourceLoc>) -> Result<ValueId> {
        if self.meta(x)?.shape == shape {
            return Ok(x);
        }
        let probe = {
            let m = self.meta(x)?.clone();
            infer(&Op::View(shape.clone()), &[&m], self.inner.oracle())
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
                if size[..] == m.shape[..] && stride[..] == m.strides[..] && abs_offset == m.offset {
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
        self.distinct_alias(x, loc)
    }

    /// A new `alias` of `x` that no other emission shares (memoized views would).
    pub fn distinct_alias(&mut self, x: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        Ok(self.inner.emit(Op::Alias, vec![x], loc.clone())?)
    }

    /// `x` itself when it is laid out as `like`'s storage keeps `like` (its strides, at
    /// offset 0: what `copy_` into `like` gives), else `x` copied into that layout. A storage's new value keeps the storage's layout,
    /// so views replayed from it, and results computed from those, get eager's strides.
    pub fn dense_like(&mut self, x: ValueId, like: ValueId, loc: &Option<SourceLoc>) -> Result<ValueId> {
        let m = self.meta(x)?.clone();
        let want = infer(&Op::Copy, &[self.meta(like)?, &m], &mut StaticOracle)?;
        // Exactly (also for size-1 dims: their strides are observable too).
        if m.strides == want.strides && m.offset == Dim::Const(0) {
            return Ok(x);
        }
        self.emit(Op::Copy, vec![like, x], loc)
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

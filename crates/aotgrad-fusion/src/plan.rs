//! The kernel plan's data types: plain, serializable, backend-neutral.
//!
//! A [`KernelPlan`] lists [`Buffer`]s (graph inputs, intermediates, outputs) and
//! [`Kernel`]s in execution order. Every tensor a kernel touches is an [`Access`]: a
//! buffer plus shape, strides and offset in elements, so views (transpose, permute,
//! slice, expand, select, as_strided, ...) are index arithmetic over their base buffer,
//! never copies. Sizes stay symbolic ([`Dim`]) when the graph is dynamic; a backend
//! substitutes the symbols of a call once and caches the result.

use aotgrad_ir::{BinaryOp, CmpOp, DType, Dim, Dims, Op, ReduceOp, SourceLoc, TensorMeta, UnaryOp, ValueId};
use serde::{Deserialize, Serialize};

/// Index of a buffer in [`KernelPlan::buffers`].
pub type BufId = usize;

/// The arithmetic type a fused body computes in. Bool values are carried as 0 / 1 in
/// the compute type; stores to a bool buffer write `value != 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Compute {
    /// 32-bit float (also f16/bf16/bool-only bodies).
    F32,
    /// 64-bit float.
    F64,
}

impl Compute {
    /// Short name used in the text form.
    pub fn name(self) -> &'static str {
        match self {
            Compute::F32 => "f32",
            Compute::F64 => "f64",
        }
    }
}

/// Where a buffer's memory comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BufferKind {
    /// Graph input `i` (caller's memory, read only).
    Input(usize),
    /// Graph input `i`, into which the plan stores the input's new value (a mutated
    /// input updated in place, see [`crate::PlanOptions::input_updates`]): the kernel
    /// that writes it is the last to read the old value, and reads it only at the
    /// index it writes.
    Updated(usize),
    /// An intermediate written by a planned kernel: lives in a reusable arena slot.
    Intermediate,
    /// Reachable from a graph output: fresh memory handed to the caller.
    Output,
    /// Produced by an [`Kernel::Extern`] op, which allocates it itself.
    Extern,
}

/// One buffer: a dense block of elements of one dtype.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// Origin of the memory.
    pub kind: BufferKind,
    /// The layout of the value that defines the buffer (its extent is the buffer size).
    pub layout: TensorMeta,
    /// Kernel that writes it (`None` for inputs).
    pub def: Option<usize>,
    /// Last kernel that reads it (`None` when no kernel reads it).
    pub last_use: Option<usize>,
}

/// A tensor as a kernel sees it: a buffer and the index arithmetic over it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Access {
    /// The buffer.
    pub buf: BufId,
    /// Sizes of the iteration space this access is indexed by.
    #[serde(with = "aotgrad_ir::codec::compact_dims")]
    pub shape: Dims,
    /// Element strides per dim (0 for broadcast dims).
    #[serde(with = "aotgrad_ir::codec::compact_dims")]
    pub strides: Dims,
    /// Element offset of index `[0, ..., 0]`.
    pub offset: Dim,
    /// Element type of the buffer.
    pub dtype: DType,
}

/// One instruction of a fused body; instruction `i` defines register `i`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Instr {
    /// Load element of `loads[n]` at the current index, converted to the compute type.
    Load(usize),
    /// A constant (in the compute type).
    Const(f64),
    /// A unary function.
    Unary(UnaryOp, usize),
    /// A binary function of two registers.
    Binary(BinaryOp, usize, usize),
    /// A comparison: 1 when it holds, else 0.
    Compare(CmpOp, usize, usize),
    /// `cond != 0 ? a : b`.
    Where(usize, usize, usize),
    /// Clamp into `[min, max]` (NaN stays NaN).
    Clamp {
        /// Operand.
        x: usize,
        /// Lower bound.
        min: Option<f64>,
        /// Upper bound.
        max: Option<f64>,
    },
    /// Round to `dtype`'s precision (f32: `as f32`; bool: `!= 0`; f64: identity).
    Round(DType, usize),
}

/// A fused elementwise body: loads, instructions, results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Body {
    /// Compute type of every instruction.
    pub compute: Compute,
    /// Accesses read by [`Instr::Load`], indexed by the iteration space.
    pub loads: Vec<Access>,
    /// Instructions in SSA order.
    pub instrs: Vec<Instr>,
}

/// A store of a body register.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Store {
    /// Register stored.
    pub reg: usize,
    /// Where it goes (indexed by the kernel's iteration space).
    pub dst: Access,
}

/// A pointwise chain computed in one pass over its output, with no intermediate buffers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PointwiseKernel {
    /// Iteration space (the output shape).
    #[serde(with = "aotgrad_ir::codec::compact_dims")]
    pub shape: Dims,
    /// The fused expression.
    pub body: Body,
    /// Results written.
    pub stores: Vec<Store>,
    /// How many graph nodes the kernel computes.
    pub nodes: usize,
}

/// A reduction with its pointwise producers fused in as a prologue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReduceKernel {
    /// Which reduction.
    pub op: ReduceOp,
    /// Iteration space: the shape of the reduced input.
    #[serde(with = "aotgrad_ir::codec::compact_dims")]
    pub shape: Dims,
    /// Per dim of `shape`: reduced or kept.
    pub reduced: Vec<bool>,
    /// The prologue; its last register is the value reduced.
    pub body: Body,
    /// The result, indexed by `shape` (stride 0 on reduced dims).
    pub dst: Access,
    /// How many graph nodes the kernel computes.
    pub nodes: usize,
    /// The graph value of the reduction (for errors).
    pub value: ValueId,
    /// The user's source line of the reduction, when recorded.
    pub loc: Option<SourceLoc>,
}

/// A (batched) matrix product with an optional pointwise epilogue that reads its result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatmulKernel {
    /// Left operand, `[n, k]` or `[b, n, k]`.
    pub a: Access,
    /// Right operand, `[k, m]` or `[b, k, m]`.
    pub b: Access,
    /// Result, `[n, m]` or `[b, n, m]`, contiguous.
    pub out: Access,
    /// Pointwise consumer run on each block of rows while it is hot.
    pub epilogue: Option<PointwiseKernel>,
}

/// An op no fused kernel covers, run by the backend's own kernel for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExternKernel {
    /// The op.
    pub op: Op,
    /// Its arguments.
    pub args: Vec<Access>,
    /// The buffer the result becomes.
    pub out: BufId,
    /// Metadata of the result.
    pub meta: TensorMeta,
    /// The graph value it computes (for errors).
    pub value: ValueId,
    /// The user's source line of the op, when recorded.
    pub loc: Option<SourceLoc>,
}

/// Kernels over one iteration space whose reductions reduce exactly its trailing dims,
/// run row block by row block: every stage runs on a block of rows before the next
/// block starts, so the values one stage writes and the next reads (a softmax's
/// maximum, its exponentials and their sum; a layer norm's mean and variance) are
/// still in cache. Each stage reads what an earlier stage of the group wrote only at
/// the same row, so running the stages row block by row block computes what running
/// them one after the other does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowsKernel {
    /// The iteration space of the element stages.
    #[serde(with = "aotgrad_ir::codec::compact_dims")]
    pub shape: Dims,
    /// How many leading dims of `shape` index rows; every reduction reduces the rest.
    pub outer: usize,
    /// The stages in order: [`Kernel::Reduce`] over `shape` reducing the trailing
    /// dims, or [`Kernel::Pointwise`] over `shape` (per element) or over the rows
    /// (`shape` with its trailing dims 1 or dropped: per row).
    pub stages: Vec<Kernel>,
}

/// One kernel of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Kernel {
    /// Fused pointwise chain.
    Pointwise(PointwiseKernel),
    /// Reduction with prologue (boxed, as the other large variants: a plan's kernels
    /// stay small to move while it is built, decoded and walked).
    Reduce(Box<ReduceKernel>),
    /// Matrix product with epilogue.
    Matmul(Box<MatmulKernel>),
    /// Any other op.
    Extern(Box<ExternKernel>),
    /// Reductions and pointwise kernels run row block by row block.
    Rows(RowsKernel),
}

impl Kernel {
    /// Accesses the kernel reads.
    pub fn reads(&self) -> Vec<&Access> {
        match self {
            Kernel::Pointwise(p) => p.body.loads.iter().collect(),
            Kernel::Reduce(r) => r.body.loads.iter().collect(),
            Kernel::Matmul(m) => {
                let mut v = vec![&m.a, &m.b];
                if let Some(e) = &m.epilogue {
                    v.extend(e.body.loads.iter().filter(|l| l.buf != m.out.buf));
                }
                v
            }
            Kernel::Extern(e) => e.args.iter().collect(),
            Kernel::Rows(r) => r.stages.iter().flat_map(|k| k.reads()).collect(),
        }
    }
    /// Buffers the kernel writes.
    pub fn writes(&self) -> Vec<BufId> {
        match self {
            Kernel::Pointwise(p) => p.stores.iter().map(|s| s.dst.buf).collect(),
            Kernel::Reduce(r) => vec![r.dst.buf],
            Kernel::Matmul(m) => {
                let mut v = vec![m.out.buf];
                if let Some(e) = &m.epilogue {
                    v.extend(e.stores.iter().map(|s| s.dst.buf));
                }
                v
            }
            Kernel::Extern(e) => vec![e.out],
            Kernel::Rows(r) => r.stages.iter().flat_map(|k| k.writes()).collect(),
        }
    }
    /// Call `f` on the buffer of every access and store of the kernel (to renumber
    /// buffers).
    pub fn for_each_buf_mut(&mut self, f: &mut dyn FnMut(&mut BufId)) {
        fn pointwise(p: &mut PointwiseKernel, f: &mut dyn FnMut(&mut BufId)) {
            p.body.loads.iter_mut().for_each(|a| f(&mut a.buf));
            p.stores.iter_mut().for_each(|s| f(&mut s.dst.buf));
        }
        match self {
            Kernel::Pointwise(p) => pointwise(p, f),
            Kernel::Reduce(r) => {
                r.body.loads.iter_mut().for_each(|a| f(&mut a.buf));
                f(&mut r.dst.buf);
            }
            Kernel::Matmul(m) => {
                for a in [&mut m.a, &mut m.b, &mut m.out] {
                    f(&mut a.buf);
                }
                if let Some(e) = &mut m.epilogue {
                    pointwise(e, f);
                }
            }
            Kernel::Extern(e) => {
                e.args.iter_mut().for_each(|a| f(&mut a.buf));
                f(&mut e.out);
            }
            Kernel::Rows(r) => r.stages.iter_mut().for_each(|k| k.for_each_buf_mut(f)),
        }
    }
    /// How many graph nodes the kernel computes (an extern op: one).
    pub fn nodes(&self) -> usize {
        match self {
            Kernel::Pointwise(p) => p.nodes,
            Kernel::Reduce(r) => r.nodes,
            Kernel::Matmul(m) => 1 + m.epilogue.as_ref().map_or(0, |e| e.nodes),
            Kernel::Extern(_) => 1,
            Kernel::Rows(r) => r.stages.iter().map(Kernel::nodes).sum(),
        }
    }
    /// Short kind name.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Kernel::Pointwise(_) => "pointwise",
            Kernel::Reduce(_) => "reduce",
            Kernel::Matmul(_) => "matmul",
            Kernel::Extern(_) => "extern",
            Kernel::Rows(_) => "rows",
        }
    }
}

/// A graph output: a view of a buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Output {
    /// The buffer.
    pub buf: BufId,
    /// The output's metadata over that buffer.
    pub meta: TensorMeta,
}

/// The whole plan for one functional graph. Serialized nested in human-readable
/// formats and as flat tables in the binary codec (see `wire.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelPlan {
    /// Graph inputs' metadata, in order.
    pub inputs: Vec<TensorMeta>,
    /// Every buffer.
    pub buffers: Vec<Buffer>,
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// Graph outputs, in order.
    pub outputs: Vec<Output>,
    /// Number of graph nodes planned.
    pub graph_nodes: usize,
}

impl KernelPlan {
    /// True when no size, stride or offset anywhere in the plan mentions a symbol
    /// (buffers may be concrete while a view of one is not: an output `[s0]` over a
    /// `[2, 2]` buffer under the guard `s0 == 4`).
    pub fn is_static(&self) -> bool {
        // A walk, not `map_dims` with a failing map: no copy of the plan.
        self.inputs.iter().all(TensorMeta::is_concrete)
            && self.buffers.iter().all(|b| b.layout.is_concrete())
            && self.outputs.iter().all(|o| o.meta.is_concrete())
            && self.kernels.iter().all(Kernel::is_static)
    }
}

fn consts(ds: &[Dim]) -> bool {
    ds.iter().all(Dim::is_const)
}

impl Access {
    fn is_static(&self) -> bool {
        consts(&self.shape) && consts(&self.strides) && self.offset.is_const()
    }
}

impl PointwiseKernel {
    fn is_static(&self) -> bool {
        consts(&self.shape)
            && self.body.loads.iter().all(Access::is_static)
            && self.stores.iter().all(|s| s.dst.is_static())
    }
}

impl Kernel {
    /// True when no size, stride or offset of the kernel mentions a symbol.
    pub fn is_static(&self) -> bool {
        match self {
            Kernel::Pointwise(p) => p.is_static(),
            Kernel::Reduce(r) => consts(&r.shape) && r.body.loads.iter().all(Access::is_static) && r.dst.is_static(),
            Kernel::Matmul(m) => {
                m.a.is_static()
                    && m.b.is_static()
                    && m.out.is_static()
                    && m.epilogue.as_ref().is_none_or(|e| e.is_static())
            }
            Kernel::Rows(r) => consts(&r.shape) && r.stages.iter().all(Kernel::is_static),
            Kernel::Extern(e) => {
                let symbolic = std::cell::Cell::new(false);
                e.op.map_dims(&|d| {
                    symbolic.set(symbolic.get() || !d.is_const());
                    d.clone()
                });
                !symbolic.get() && e.meta.is_concrete() && e.args.iter().all(Access::is_static)
            }
        }
    }
}

fn map_meta(m: &TensorMeta, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<TensorMeta> {
    Some(TensorMeta {
        shape: map_dims(&m.shape, f)?,
        strides: map_dims(&m.strides, f)?,
        offset: f(&m.offset)?,
        dtype: m.dtype,
    })
}

fn map_dims(ds: &[Dim], f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<Dims> {
    ds.iter().map(f).collect()
}

impl Access {
    fn map(&self, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<Access> {
        Some(Access {
            buf: self.buf,
            shape: map_dims(&self.shape, f)?,
            strides: map_dims(&self.strides, f)?,
            offset: f(&self.offset)?,
            dtype: self.dtype,
        })
    }
}

impl Body {
    fn map(&self, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<Body> {
        Some(Body {
            compute: self.compute,
            loads: self.loads.iter().map(|a| a.map(f)).collect::<Option<_>>()?,
            instrs: self.instrs.clone(),
        })
    }
}

impl PointwiseKernel {
    fn map(&self, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<PointwiseKernel> {
        Some(PointwiseKernel {
            shape: map_dims(&self.shape, f)?,
            body: self.body.map(f)?,
            stores: self
                .stores
                .iter()
                .map(|s| Some(Store { reg: s.reg, dst: s.dst.map(f)? }))
                .collect::<Option<_>>()?,
            nodes: self.nodes,
        })
    }
}

impl Kernel {
    /// The kernel with every size passed through `f` (`None` when `f` fails).
    pub fn map_dims(&self, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<Kernel> {
        Some(match self {
            Kernel::Pointwise(p) => Kernel::Pointwise(p.map(f)?),
            Kernel::Reduce(r) => Kernel::Reduce(Box::new(ReduceKernel {
                op: r.op,
                shape: map_dims(&r.shape, f)?,
                reduced: r.reduced.clone(),
                body: r.body.map(f)?,
                dst: r.dst.map(f)?,
                nodes: r.nodes,
                value: r.value,
                loc: r.loc.clone(),
            })),
            Kernel::Matmul(m) => Kernel::Matmul(Box::new(MatmulKernel {
                a: m.a.map(f)?,
                b: m.b.map(f)?,
                out: m.out.map(f)?,
                epilogue: match &m.epilogue {
                    Some(e) => Some(e.map(f)?),
                    None => None,
                },
            })),
            Kernel::Rows(r) => Kernel::Rows(RowsKernel {
                shape: map_dims(&r.shape, f)?,
                outer: r.outer,
                stages: r.stages.iter().map(|k| k.map_dims(f)).collect::<Option<_>>()?,
            }),
            Kernel::Extern(e) => {
                let bad = std::cell::Cell::new(false);
                let op = e.op.map_dims(&|d| {
                    f(d).unwrap_or_else(|| {
                        bad.set(true);
                        d.clone()
                    })
                });
                if bad.get() {
                    return None;
                }
                Kernel::Extern(Box::new(ExternKernel {
                    op,
                    args: e.args.iter().map(|a| a.map(f)).collect::<Option<_>>()?,
                    out: e.out,
                    meta: map_meta(&e.meta, f)?,
                    value: e.value,
                    loc: e.loc.clone(),
                }))
            }
        })
    }
}

impl KernelPlan {
    /// The plan with every size passed through `f` (`None` from `f` — e.g. a value
    /// that overflows — makes the whole result `None`). Used to bind the symbols of
    /// a call: `plan.map_dims(&|d| d.checked_subst(&env))`.
    pub fn map_dims(&self, f: &dyn Fn(&Dim) -> Option<Dim>) -> Option<KernelPlan> {
        let kernels = self.kernels.iter().map(|k| k.map_dims(f)).collect::<Option<_>>()?;
        Some(KernelPlan {
            inputs: self.inputs.iter().map(|m| map_meta(m, f)).collect::<Option<_>>()?,
            buffers: self
                .buffers
                .iter()
                .map(|b| {
                    Some(Buffer {
                        kind: b.kind.clone(),
                        layout: map_meta(&b.layout, f)?,
                        def: b.def,
                        last_use: b.last_use,
                    })
                })
                .collect::<Option<_>>()?,
            kernels,
            outputs: self
                .outputs
                .iter()
                .map(|o| Some(Output { buf: o.buf, meta: map_meta(&o.meta, f)? }))
                .collect::<Option<_>>()?,
            graph_nodes: self.graph_nodes,
        })
    }
}

//! The lowered plan's types: concrete accesses, bodies and kernels ([`CKernel`]),
//! where each buffer lives in a call ([`Loc`]) and the whole plan for one binding
//! ([`Lowered`]). The lowering (`lower`) makes them, the checks (`check`) verify them,
//! the executor (`exec`) and the JIT (`jit`) run and compile them: they depend on this
//! module, never on each other's.

use aotgrad_fusion::{Compute, SlotPlan};
use aotgrad_ir::{BinaryOp, CmpOp, DType, Op, ReduceOp, SourceLoc, TensorMeta, UnaryOp, ValueId};

/// Sizes or strides of a lowered kernel (inline up to rank 4: lowering a plan
/// loaded from the cache allocates little).
pub(crate) type Idx = smallvec::SmallVec<[usize; 4]>;

/// A concrete access over a kernel's (coalesced) iteration space.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CAccess {
    pub buf: usize,
    pub strides: Idx,
    pub offset: usize,
}

/// An operand: a register or a constant.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Src {
    Reg(usize),
    Const(f64),
}

/// A lowered instruction writing register `d` (never one of its own operands).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum LInstr {
    Load { load: usize, d: usize },
    Fill { v: f64, d: usize },
    Unary { op: UnaryOp, a: usize, d: usize },
    Binary { op: BinaryOp, a: Src, b: Src, d: usize },
    Compare { op: CmpOp, a: Src, b: Src, d: usize },
    Where { c: usize, a: usize, b: usize, d: usize },
    Clamp { a: usize, lo: Option<f64>, hi: Option<f64>, d: usize },
    Round { dtype: DType, a: usize, d: usize },
}

/// A lowered body.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CBody {
    pub compute: Compute,
    pub loads: Vec<CAccess>,
    pub instrs: Vec<LInstr>,
    pub nregs: usize,
    /// Physical register of each plan register still needed at the end (stores,
    /// the reduced value).
    pub phys: Vec<usize>,
}

/// A lowered pointwise kernel.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CPointwise {
    pub shape: Idx,
    pub numel: usize,
    pub body: CBody,
    pub stores: Vec<(usize, CAccess)>,
    /// Machine code for the body, when the JIT covers it (see [`super::jit`]).
    #[serde(skip)]
    pub jit: Option<super::code::JitSlot>,
}

/// A lowered reduction (iteration space coalesced, `reduced` per dim).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CReduce {
    pub op: ReduceOp,
    pub shape: Idx,
    pub reduced: Flags,
    pub body: CBody,
    pub value: usize,
    pub dst: CAccess,
    pub dst_extent: usize,
    pub count: usize,
    /// Copies of each reduced value the iteration skips: reduced dims that every load
    /// broadcasts (stride 0, an `expand`) iterate once, and a sum is scaled by this
    /// (as the eager kernel does), so `x.expand([2^40, 3]).sum()` reads 3 elements.
    pub copies: f64,
    pub at: (ValueId, Option<SourceLoc>),
    /// Machine code for the body and its accumulation, when the JIT covers it.
    #[serde(skip)]
    pub jit: Option<super::code::JitSlot>,
}

/// A lowered (batched) matmul: `out[b] = a[b] @ b[b]`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CMatmul {
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    /// (batch, row, col) strides and offset of each operand.
    pub a: (usize, [isize; 3], usize),
    pub b: (usize, [isize; 3], usize),
    pub out: (usize, [isize; 3], usize),
    pub dtype: DType,
    pub epilogue: Option<CPointwise>,
}

/// A lowered extern op.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CExtern {
    pub op: Op,
    pub args: Vec<(usize, TensorMeta)>,
    pub out: usize,
    pub meta: TensorMeta,
    pub at: (ValueId, Option<SourceLoc>),
}

/// A stage of a lowered row group.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum CStage {
    /// A pointwise kernel over the group's elements.
    Elem(CPointwise),
    /// A pointwise kernel over its rows.
    Row(CPointwise),
    /// A reduction of each row; its accumulators start at `acc` in the scratch.
    Reduce {
        k: CReduce,
        acc: usize,
        /// (size, stride in the result) of each row dim, and the result's offset.
        rows: Vec<(usize, usize)>,
        offset: usize,
    },
}

/// A lowered row group: `rows` rows of `row_len` elements.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct CRows {
    pub rows: usize,
    pub row_len: usize,
    /// Whether the stages run row block by row block (else each over everything).
    pub blocked: bool,
    pub stages: Vec<CStage>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum CKernel {
    Pointwise(CPointwise),
    Reduce(CReduce),
    Matmul(CMatmul),
    Extern(CExtern),
    Rows(CRows),
}

impl CKernel {
    /// Buffers the kernel loads from.
    pub(crate) fn loaded(&self) -> Vec<usize> {
        match self {
            CKernel::Pointwise(p) => p.body.loads.iter().map(|a| a.buf).collect(),
            CKernel::Reduce(r) => r.body.loads.iter().map(|a| a.buf).collect(),
            CKernel::Matmul(m) => {
                let mut v = vec![m.a.0, m.b.0];
                if let Some(e) = &m.epilogue {
                    v.extend(e.body.loads.iter().map(|a| a.buf));
                }
                v
            }
            CKernel::Extern(_) => vec![],
            CKernel::Rows(g) => g
                .stages
                .iter()
                .flat_map(|s| match s {
                    CStage::Elem(p) | CStage::Row(p) => &p.body.loads,
                    CStage::Reduce { k, .. } => &k.body.loads,
                })
                .map(|a| a.buf)
                .collect(),
        }
    }

    /// Buffers the kernel stores into.
    pub(crate) fn stored(&self) -> Vec<usize> {
        let stores = |p: &CPointwise| p.stores.iter().map(|(_, a)| a.buf).collect::<Vec<_>>();
        match self {
            CKernel::Pointwise(p) => stores(p),
            CKernel::Reduce(r) => vec![r.dst.buf],
            CKernel::Matmul(m) => {
                let mut v = vec![m.out.0];
                v.extend(m.epilogue.iter().flat_map(stores));
                v
            }
            CKernel::Extern(e) => vec![e.out],
            CKernel::Rows(g) => g
                .stages
                .iter()
                .flat_map(|s| match s {
                    CStage::Elem(p) | CStage::Row(p) => stores(p),
                    CStage::Reduce { k, .. } => vec![k.dst.buf],
                })
                .collect(),
        }
    }
}

/// Where a plan buffer lives during a call.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Loc {
    Input(usize),
    /// Graph input `i`, which a kernel also writes (the plan's
    /// [`BufferKind::Updated`]: a mutated input's new value stored in place).
    Updated(usize),
    Slot(usize),
    Output(usize),
    Extern,
}

/// A plan lowered for one binding of its symbols.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Lowered {
    pub kernels: Vec<CKernel>,
    pub loc: Vec<Loc>,
    /// Dtype and elements of each output buffer (index of `Loc::Output`), and whether
    /// its layout is dense (every element written by its kernel).
    pub out_bufs: Vec<(DType, usize, bool)>,
    /// Per graph input: the storage length every access into it needs.
    pub input_need: Vec<usize>,
    pub outputs: Vec<(usize, TensorMeta)>,
    pub slots: SlotPlan,
    /// f64 scratch elements for reduction accumulators.
    pub scratch: usize,
    /// Whether some kernel has enough work to split across threads (else a call runs
    /// on the caller's thread without touching the pool).
    pub parallel: bool,
    /// Element type of each plan buffer (what the JIT compiles its loads and stores for).
    pub dtypes: Vec<DType>,
    /// Elements each plan buffer spans (what an extern kernel's result must hold).
    pub extents: Vec<usize>,
    /// Runs `start..end` of consecutive, independent pointwise kernels run as one
    /// dispatch (see [`super::lower::dispatch_groups`]).
    pub groups: Vec<(usize, usize)>,
}

/// Per-dim flags of a lowered space (reduced or kept).
pub(crate) type Flags = smallvec::SmallVec<[bool; 4]>;

//! The binary form of a [`KernelPlan`]: flat tables instead of the nested structs.
//!
//! A plan's nested form (kernels holding bodies holding accesses holding sizes) is
//! what planners and backends walk, but decoding it field by field through serde's
//! visitors moved every access, size list and kernel through several layers of
//! `Result`s, which made loading a plan from the cache about three times as slow as
//! cloning it. In the binary codec a plan is instead a handful of tables: every size,
//! stride and offset in one byte string (in walk order, each list as its count and
//! zigzag LEB128 varints, or the byte 255 for a list holding a symbol, taken from
//! `symbolic`), every access's buffer and dtype, every instruction, and one small
//! record per kernel (pre-order: a row group's stages and a product's epilogue follow
//! it). [`KernelPlan`]'s `Deserialize` rebuilds the nested form in one pass over them,
//! checking every count and index against what the tables hold: malformed bytes are
//! an error, never a panic, and no count read from them reserves more than the tables
//! can fill. Human-readable formats (`serde_json` dumps) keep the nested form.

use crate::plan::{
    Access, Body, BufId, Buffer, BufferKind, Compute, ExternKernel, Instr, Kernel, KernelPlan, MatmulKernel, Output,
    PointwiseKernel, ReduceKernel, RowsKernel, Store,
};
use aotgrad_ir::codec::varint;
use aotgrad_ir::{DType, Dim, Dims, ReduceOp, SourceLoc, TensorMeta, ValueId};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The byte that marks a size list holding a symbol (the list is the next entry of
/// [`WirePlan::symbolic`]).
const SYMBOLIC: u8 = 255;

/// One kernel record; its sizes, accesses and instructions are in the plan's tables.
#[derive(Serialize, Deserialize)]
enum WireKernel {
    /// Sizes: the space; then the loads, then the stores' accesses.
    Pointwise { compute: Compute, loads: u32, instrs: u32, stores: Vec<usize>, nodes: usize },
    /// Sizes: the space; then the loads, then the result's access.
    Reduce {
        op: ReduceOp,
        reduced: Vec<bool>,
        compute: Compute,
        loads: u32,
        instrs: u32,
        nodes: usize,
        value: ValueId,
        loc: Option<SourceLoc>,
    },
    /// Accesses: a, b, out; an epilogue is the next record.
    Matmul { epilogue: bool },
    /// Kept whole (rare, and its op carries its own sizes).
    Extern(Box<ExternKernel>),
    /// Sizes: the space; its stages are the next `stages` records.
    Rows { outer: usize, stages: u32 },
}

/// A [`KernelPlan`] as flat tables (see the module).
#[derive(Serialize, Deserialize)]
struct WirePlan {
    #[serde(with = "aotgrad_ir::codec::bytes")]
    dims: Vec<u8>,
    symbolic: Vec<Vec<Dim>>,
    inputs: Vec<DType>,
    buffers: Vec<(BufferKind, DType, Option<usize>, Option<usize>)>,
    kernels: Vec<WireKernel>,
    accesses: Vec<(BufId, DType)>,
    instrs: Vec<Instr>,
    outputs: Vec<(BufId, DType)>,
    graph_nodes: usize,
}

// ---------------------------------------------------------------------------------
// Writing.

#[derive(Default)]
struct Writer {
    dims: Vec<u8>,
    symbolic: Vec<Vec<Dim>>,
    kernels: Vec<WireKernel>,
    accesses: Vec<(BufId, DType)>,
    instrs: Vec<Instr>,
}

impl Writer {
    fn list(&mut self, ds: &[Dim]) {
        let consts = ds.len() < SYMBOLIC as usize && ds.iter().all(Dim::is_const);
        if !consts {
            self.dims.push(SYMBOLIC);
            self.symbolic.push(ds.to_vec());
            return;
        }
        self.dims.push(ds.len() as u8);
        for d in ds {
            if let Dim::Const(v) = d {
                varint::push(&mut self.dims, *v);
            }
        }
    }
    fn layout(&mut self, shape: &[Dim], strides: &[Dim], offset: &Dim) {
        self.list(shape);
        self.list(strides);
        self.list(std::slice::from_ref(offset));
    }
    fn meta(&mut self, m: &TensorMeta) {
        self.layout(&m.shape, &m.strides, &m.offset);
    }
    fn access(&mut self, a: &Access) {
        self.accesses.push((a.buf, a.dtype));
        self.layout(&a.shape, &a.strides, &a.offset);
    }
    fn body(&mut self, b: &Body) {
        for a in &b.loads {
            self.access(a);
        }
        self.instrs.extend(b.instrs.iter().cloned());
    }
    fn pointwise(&mut self, p: &PointwiseKernel) {
        self.kernels.push(WireKernel::Pointwise {
            compute: p.body.compute,
            loads: p.body.loads.len() as u32,
            instrs: p.body.instrs.len() as u32,
            stores: p.stores.iter().map(|s| s.reg).collect(),
            nodes: p.nodes,
        });
        self.list(&p.shape);
        self.body(&p.body);
        for s in &p.stores {
            self.access(&s.dst);
        }
    }
    fn kernel(&mut self, k: &Kernel) {
        match k {
            Kernel::Pointwise(p) => self.pointwise(p),
            Kernel::Reduce(r) => {
                self.kernels.push(WireKernel::Reduce {
                    op: r.op,
                    reduced: r.reduced.clone(),
                    compute: r.body.compute,
                    loads: r.body.loads.len() as u32,
                    instrs: r.body.instrs.len() as u32,
                    nodes: r.nodes,
                    value: r.value,
                    loc: r.loc.clone(),
                });
                self.list(&r.shape);
                self.body(&r.body);
                self.access(&r.dst);
            }
            Kernel::Matmul(m) => {
                self.kernels.push(WireKernel::Matmul { epilogue: m.epilogue.is_some() });
                self.access(&m.a);
                self.access(&m.b);
                self.access(&m.out);
                if let Some(e) = &m.epilogue {
                    self.pointwise(e);
                }
            }
            Kernel::Extern(e) => self.kernels.push(WireKernel::Extern(e.clone())),
            Kernel::Rows(g) => {
                self.kernels.push(WireKernel::Rows { outer: g.outer, stages: g.stages.len() as u32 });
                self.list(&g.shape);
                for s in &g.stages {
                    self.kernel(s);
                }
            }
        }
    }
}

impl WirePlan {
    fn of(plan: &KernelPlan) -> WirePlan {
        let mut w = Writer::default();
        for m in &plan.inputs {
            w.meta(m);
        }
        for b in &plan.buffers {
            w.meta(&b.layout);
        }
        for k in &plan.kernels {
            w.kernel(k);
        }
        for o in &plan.outputs {
            w.meta(&o.meta);
        }
        WirePlan {
            dims: w.dims,
            symbolic: w.symbolic,
            inputs: plan.inputs.iter().map(|m| m.dtype).collect(),
            buffers: plan.buffers.iter().map(|b| (b.kind.clone(), b.layout.dtype, b.def, b.last_use)).collect(),
            kernels: w.kernels,
            accesses: w.accesses,
            instrs: w.instrs,
            outputs: plan.outputs.iter().map(|o| (o.buf, o.meta.dtype)).collect(),
            graph_nodes: plan.graph_nodes,
        }
    }
}

// ---------------------------------------------------------------------------------
// Reading.

/// Cursors over the tables, read in the order [`Writer`] wrote them.
struct Reader<'a> {
    dims: &'a [u8],
    symbolic: std::vec::IntoIter<Vec<Dim>>,
    kernels: std::vec::IntoIter<WireKernel>,
    accesses: std::slice::Iter<'a, (BufId, DType)>,
    instrs: &'a [Instr],
}

/// Errors are fixed texts (a `String` would make every read return through memory).
type R<T> = Result<T, &'static str>;

impl Reader<'_> {
    #[inline]
    fn varint(&mut self) -> R<i64> {
        varint::read(&mut self.dims)
    }
    /// The next size list, pushed onto `out` where it lies: a list built aside and
    /// then moved (a 72-byte value written piecewise, read back whole) stalls on every
    /// copy, and a plan holds thousands of lists.
    fn list_into(&mut self, out: &mut Dims) -> R<()> {
        let (&count, rest) = self.dims.split_first().ok_or("its size table ends early")?;
        self.dims = rest;
        if count == SYMBOLIC {
            let l = self.symbolic.next().ok_or("a symbolic size list is missing")?;
            out.extend(l);
            return Ok(());
        }
        out.reserve_exact(count as usize);
        for _ in 0..count {
            out.push(Dim::Const(self.varint()?));
        }
        Ok(())
    }
    fn list(&mut self) -> R<Dims> {
        let mut out = Dims::new();
        self.list_into(&mut out)?;
        Ok(out)
    }
    /// An offset: a list of one size.
    fn dim(&mut self) -> R<Dim> {
        let (&count, rest) = self.dims.split_first().ok_or("its size table ends early")?;
        self.dims = rest;
        match count {
            1 => Ok(Dim::Const(self.varint()?)),
            SYMBOLIC => match self.symbolic.next().as_deref() {
                Some([d]) => Ok(d.clone()),
                _ => Err("an offset is not one size"),
            },
            _ => Err("an offset is not one size"),
        }
    }
    /// The next layout into `m` (whose dims are empty).
    fn meta_into(&mut self, m: &mut TensorMeta) -> R<()> {
        self.list_into(&mut m.shape)?;
        self.list_into(&mut m.strides)?;
        m.offset = self.dim()?;
        Ok(())
    }
    fn access_into(&mut self, out: &mut Vec<Access>) -> R<()> {
        let &(buf, dtype) = self.accesses.next().ok_or("its access table ends early")?;
        out.push(Access { buf, shape: Dims::new(), strides: Dims::new(), offset: Dim::Const(0), dtype });
        let a = out.last_mut().ok_or("an access vanished")?;
        self.list_into(&mut a.shape)?;
        self.list_into(&mut a.strides)?;
        a.offset = self.dim()?;
        Ok(())
    }
    fn access(&mut self) -> R<Access> {
        let &(buf, dtype) = self.accesses.next().ok_or("its access table ends early")?;
        let mut a = Access { buf, shape: Dims::new(), strides: Dims::new(), offset: Dim::Const(0), dtype };
        self.list_into(&mut a.shape)?;
        self.list_into(&mut a.strides)?;
        a.offset = self.dim()?;
        Ok(a)
    }
    fn accesses(&mut self, n: u32) -> R<Vec<Access>> {
        // Never more room than the table can fill.
        let mut out = Vec::with_capacity((n as usize).min(self.accesses.len()));
        for _ in 0..n {
            self.access_into(&mut out)?;
        }
        Ok(out)
    }
    fn body(&mut self, compute: Compute, loads: u32, instrs: u32) -> R<Body> {
        let loads = self.accesses(loads)?;
        let n = instrs as usize;
        if n > self.instrs.len() {
            return Err("its instruction table ends early");
        }
        let (mine, rest) = self.instrs.split_at(n);
        self.instrs = rest;
        Ok(Body { compute, loads, instrs: mine.to_vec() })
    }
    fn pointwise(&mut self, rec: WireKernel) -> R<PointwiseKernel> {
        let WireKernel::Pointwise { compute, loads, instrs, stores, nodes } = rec else {
            return Err("an epilogue or row stage is not a pointwise kernel");
        };
        let shape = self.list()?;
        let body = self.body(compute, loads, instrs)?;
        let mut out: Vec<Store> = Vec::with_capacity(stores.len().min(self.accesses.len()));
        for reg in stores {
            let &(buf, dtype) = self.accesses.next().ok_or("its access table ends early")?;
            let dst = Access { buf, shape: Dims::new(), strides: Dims::new(), offset: Dim::Const(0), dtype };
            out.push(Store { reg, dst });
            let dst = &mut out.last_mut().ok_or("a store vanished")?.dst;
            self.list_into(&mut dst.shape)?;
            self.list_into(&mut dst.strides)?;
            dst.offset = self.dim()?;
        }
        Ok(PointwiseKernel { shape, body, stores: out, nodes })
    }
    fn next(&mut self) -> R<WireKernel> {
        self.kernels.next().ok_or("its kernel table ends early")
    }
    /// The next kernel; `in_group`: a row group's stage (a pointwise kernel or a
    /// reduction, never a group), which bounds the nesting.
    fn kernel(&mut self, in_group: bool) -> R<Kernel> {
        let rec = self.next()?;
        Ok(match rec {
            WireKernel::Pointwise { .. } => Kernel::Pointwise(self.pointwise(rec)?),
            WireKernel::Reduce { op, reduced, compute, loads, instrs, nodes, value, loc } => {
                let shape = self.list()?;
                let body = self.body(compute, loads, instrs)?;
                let dst = self.access()?;
                Kernel::Reduce(Box::new(ReduceKernel { op, shape, reduced, body, dst, nodes, value, loc }))
            }
            _ if in_group => return Err("a row group holds a kernel that is not a stage"),
            WireKernel::Matmul { epilogue } => {
                let (a, b, out) = (self.access()?, self.access()?, self.access()?);
                let epilogue = match epilogue {
                    true => {
                        let rec = self.next()?;
                        Some(self.pointwise(rec)?)
                    }
                    false => None,
                };
                Kernel::Matmul(Box::new(MatmulKernel { a, b, out, epilogue }))
            }
            WireKernel::Extern(e) => Kernel::Extern(e),
            WireKernel::Rows { outer, stages } => {
                let shape = self.list()?;
                let mut out = Vec::with_capacity((stages as usize).min(self.kernels.len()));
                for _ in 0..stages {
                    out.push(self.kernel(true)?);
                }
                Kernel::Rows(RowsKernel { shape, outer, stages: out })
            }
        })
    }
}

impl WirePlan {
    fn into_plan(self) -> R<KernelPlan> {
        let mut r = Reader {
            dims: &self.dims,
            symbolic: self.symbolic.into_iter(),
            kernels: self.kernels.into_iter(),
            accesses: self.accesses.iter(),
            instrs: &self.instrs,
        };
        let empty = |dtype| TensorMeta { shape: Dims::new(), strides: Dims::new(), offset: Dim::Const(0), dtype };
        // Every layout takes at least 4 bytes of the size table: no more room than
        // that can fill.
        let room = |n: usize| n.min(self.dims.len() / 4);
        let mut inputs: Vec<TensorMeta> = Vec::with_capacity(room(self.inputs.len()));
        for &dtype in &self.inputs {
            inputs.push(empty(dtype));
            r.meta_into(inputs.last_mut().ok_or("an input vanished")?)?;
        }
        let mut buffers: Vec<Buffer> = Vec::with_capacity(room(self.buffers.len()));
        for (kind, dtype, def, last_use) in self.buffers {
            buffers.push(Buffer { kind, layout: empty(dtype), def, last_use });
            r.meta_into(&mut buffers.last_mut().ok_or("a buffer vanished")?.layout)?;
        }
        let mut kernels = Vec::with_capacity(r.kernels.len());
        while r.kernels.len() > 0 {
            kernels.push(r.kernel(false)?);
        }
        let mut outputs: Vec<Output> = Vec::with_capacity(room(self.outputs.len()));
        for &(buf, dtype) in &self.outputs {
            outputs.push(Output { buf, meta: empty(dtype) });
            r.meta_into(&mut outputs.last_mut().ok_or("an output vanished")?.meta)?;
        }
        if !r.dims.is_empty() || r.symbolic.len() > 0 || r.accesses.len() > 0 || !r.instrs.is_empty() {
            return Err("its tables hold more than its kernels use");
        }
        Ok(KernelPlan { inputs, buffers, kernels, outputs, graph_nodes: self.graph_nodes })
    }
}

// ---------------------------------------------------------------------------------
// The plan's serde: nested when human-readable, the tables otherwise.

#[derive(Serialize)]
struct NestedRef<'a> {
    inputs: &'a [TensorMeta],
    buffers: &'a [Buffer],
    kernels: &'a [Kernel],
    outputs: &'a [Output],
    graph_nodes: usize,
}

#[derive(Deserialize)]
struct Nested {
    inputs: Vec<TensorMeta>,
    buffers: Vec<Buffer>,
    kernels: Vec<Kernel>,
    outputs: Vec<Output>,
    graph_nodes: usize,
}

impl Serialize for KernelPlan {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            NestedRef {
                inputs: &self.inputs,
                buffers: &self.buffers,
                kernels: &self.kernels,
                outputs: &self.outputs,
                graph_nodes: self.graph_nodes,
            }
            .serialize(s)
        } else {
            WirePlan::of(self).serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for KernelPlan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KernelPlan, D::Error> {
        if d.is_human_readable() {
            let n = Nested::deserialize(d)?;
            Ok(KernelPlan {
                inputs: n.inputs,
                buffers: n.buffers,
                kernels: n.kernels,
                outputs: n.outputs,
                graph_nodes: n.graph_nodes,
            })
        } else {
            WirePlan::deserialize(d)?
                .into_plan()
                .map_err(|e| serde::de::Error::custom(format!("a malformed kernel plan: {e}")))
        }
    }
}
